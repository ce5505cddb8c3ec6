//! Handing the revisions of a replay to etcd's own log: the recorded
//! revisions are appended to the write-ahead log that `etcdutl snapshot
//! restore` made, as committed raft entries (one transaction per revision,
//! lease grants before the revision that first uses a lease), so that etcd
//! applies them itself when it starts, in order, without a request per
//! revision. The revisions are etcd's own as with transactions sent one by
//! one, and the same verification follows.
//!
//! etcdutl's log holds its membership entry (index 1, term 1), a state that
//! commits it and a snapshot record at it; its database's applied index is
//! 1 and holds the member. etcd starts from that snapshot record (its
//! membership from the database), reads the entries after it, and applies
//! those past the database's applied index: the entries appended here, at
//! indexes 2, 3, ... of term 1, with a state that commits them all. An
//! entry etcd cannot read fails its start ([`crate::etcd::TempEtcd`] says
//! why), and nothing is started on such data.
//!
//! The log format is in [`crate::etcd_wal`]. Only the single fresh log a
//! restore makes is extended (anything else is left to the transactions);
//! the file is written beside the log and renamed over it, so a crash leaves
//! either log.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use prost::Message;

use super::replay::{lease_ttl, Delta};
use crate::delta::{EventRecord, RevisionRecord};
use crate::error::io_at;
use crate::etcd_wal::{chained, corrupt, files, scan, Entry, HardState, ENTRY, STATE};
use crate::Result;

/// `etcdserverpb.InternalRaftRequest`, with the two requests a replay needs.
#[derive(Clone, PartialEq, prost::Message)]
struct InternalRaftRequest {
    #[prost(message, optional, tag = "100")]
    header: Option<RequestHeader>,
    #[prost(message, optional, tag = "4")]
    put: Option<PutRequest>,
    #[prost(message, optional, tag = "5")]
    delete_range: Option<DeleteRangeRequest>,
    #[prost(message, optional, tag = "6")]
    txn: Option<TxnRequest>,
    #[prost(message, optional, tag = "8")]
    lease_grant: Option<LeaseGrantRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RequestHeader {
    #[prost(uint64, tag = "1")]
    id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct TxnRequest {
    #[prost(message, repeated, tag = "2")]
    success: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RequestOp {
    #[prost(message, optional, tag = "2")]
    request_put: Option<PutRequest>,
    #[prost(message, optional, tag = "3")]
    request_delete_range: Option<DeleteRangeRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
    #[prost(int64, tag = "3")]
    lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    ttl: i64,
    #[prost(int64, tag = "2")]
    id: i64,
}

/// The fresh log of a restored data dir, up to where its data ends.
#[derive(Debug)]
pub(super) struct LogTail {
    file: PathBuf,
    /// Its records (a few hundred bytes; the rest is preallocated zeros).
    head: Vec<u8>,
    crc: u32,
    /// The index of the newest raft snapshot the log records (etcd starts
    /// there and reads the entries after it).
    snapshot_index: u64,
    last_index: u64,
    state: HardState,
}

/// The requests to append, in order.
#[derive(Debug, Default)]
pub(super) struct Requests {
    encoded: Vec<Vec<u8>>,
    /// Recorded revisions among them.
    pub(super) revisions: u64,
    pub(super) events: u64,
}

impl Requests {
    /// Grants for the leases `r` uses that are not in `granted` yet (with
    /// their TTL in `ttls`; granting a lease etcd holds already changes
    /// nothing), then `r`: one put or delete, or a transaction of its events.
    pub(super) fn push(
        &mut self,
        r: &RevisionRecord,
        granted: &mut BTreeSet<i64>,
        ttls: &BTreeMap<i64, i64>,
    ) {
        for e in r.events.iter().filter(|e| !e.delete && e.lease != 0) {
            if granted.insert(e.lease) {
                self.request(InternalRaftRequest {
                    lease_grant: Some(LeaseGrantRequest {
                        ttl: lease_ttl(ttls, e.lease),
                        id: e.lease,
                    }),
                    ..Default::default()
                });
            }
        }
        // a revision of one event goes as that request alone: etcd applies a
        // put or a delete without the read view a transaction opens first,
        // which copies every write buffered since etcd's last backend commit
        let req = match &r.events[..] {
            [e] if e.delete => InternalRaftRequest {
                delete_range: Some(delete_request(e)),
                ..Default::default()
            },
            [e] => InternalRaftRequest {
                put: Some(put_request(e)),
                ..Default::default()
            },
            events => InternalRaftRequest {
                txn: Some(TxnRequest {
                    success: events.iter().map(request_op).collect(),
                }),
                ..Default::default()
            },
        };
        self.request(req);
        self.revisions += 1;
        self.events += r.events.len() as u64;
    }

    fn request(&mut self, mut req: InternalRaftRequest) {
        // etcd reads the id from the header (nothing waits for these)
        req.header = Some(RequestHeader {
            id: self.encoded.len() as u64 + 1,
        });
        self.encoded.push(req.encode_to_vec());
    }

    pub(super) fn is_empty(&self) -> bool {
        self.encoded.is_empty()
    }
}

/// One recorded event as an operation of a transaction.
fn request_op(e: &EventRecord) -> RequestOp {
    match e.delete {
        true => RequestOp {
            request_delete_range: Some(delete_request(e)),
            ..Default::default()
        },
        false => RequestOp {
            request_put: Some(put_request(e)),
            ..Default::default()
        },
    }
}

fn put_request(e: &EventRecord) -> PutRequest {
    PutRequest {
        key: e.key.clone(),
        value: e.value.clone(),
        lease: e.lease,
    }
}

fn delete_request(e: &EventRecord) -> DeleteRangeRequest {
    DeleteRangeRequest { key: e.key.clone() }
}

/// The requests for the revisions after `from` up to `target`, in order,
/// stopping at the first missing revision (the transactions report it).
pub(super) fn requests(deltas: &[Delta], from: i64, target: i64) -> Requests {
    let mut requests = Requests::default();
    let mut granted = BTreeSet::new();
    let mut next = from + 1;
    for (_, (meta, records)) in deltas {
        let ttls: BTreeMap<i64, i64> = meta.leases.iter().copied().collect();
        for r in records {
            if r.revision < next {
                continue; // in the snapshot, or an overlapping delta
            }
            if r.revision != next || r.revision > target {
                return requests;
            }
            requests.push(r, &mut granted, &ttls);
            next += 1;
        }
    }
    requests
}

/// Reads the fresh log under `data` (`member/wal`): `None` when there is not
/// exactly one log file or it already holds normal entries (an earlier run
/// appended to it: etcd applies them when it starts, the transactions do
/// the rest).
pub(super) fn read_tail(data: &Path) -> Result<Option<LogTail>> {
    let mut files = files(data)?;
    if files.len() != 1 {
        return Ok(None);
    }
    let file = files.remove(0);
    let bytes = std::fs::read(&file).map_err(io_at("reading", &file))?;
    parse(&file, &bytes)
}

/// The records of one log file, checked (see [`read_tail`]).
fn parse(file: &Path, bytes: &[u8]) -> Result<Option<LogTail>> {
    let s = scan(file, bytes)?;
    let Some(state) = s.state else {
        return Err(corrupt(file, "it holds no raft state"));
    };
    let last_index = s.last_index.unwrap_or(0);
    let snapshot_index = s.snapshot_index.unwrap_or(0);
    if s.requests || state.commit != last_index || snapshot_index > last_index {
        return Ok(None); // appended before, or not as etcdutl left it
    }
    Ok(Some(LogTail {
        file: file.to_path_buf(),
        head: bytes[..s.end].to_vec(),
        crc: s.crc,
        snapshot_index,
        last_index,
        state,
    }))
}

impl LogTail {
    /// How many entries a log that ends at `last` holds past its newest raft
    /// snapshot: those etcd reads again whenever it starts, until it takes a
    /// snapshot past them.
    pub(super) fn entries_past_snapshot(&self, last: u64) -> u64 {
        last.saturating_sub(self.snapshot_index)
    }
}

/// Appends `requests` as committed entries after `tail` (a new file renamed
/// over the log); returns the index of the last one.
pub(super) fn append(tail: &LogTail, requests: &Requests) -> Result<u64> {
    let mut out = tail.head.clone();
    let (mut crc, mut index) = (tail.crc, tail.last_index);
    let mut record = |out: &mut Vec<u8>, r#type: i64, data: Vec<u8>| {
        chained(out, &mut crc, r#type, data);
    };
    for data in &requests.encoded {
        index += 1;
        let entry = Entry {
            r#type: 0,
            term: tail.state.term,
            index,
            data: data.clone(),
        };
        record(&mut out, ENTRY, entry.encode_to_vec());
    }
    let state = HardState {
        commit: index,
        ..tail.state
    };
    record(&mut out, STATE, state.encode_to_vec());
    let tmp = tail.file.with_extension("wal.appending");
    std::fs::write(&tmp, &out).map_err(io_at("writing", &tmp))?;
    std::fs::rename(&tmp, &tail.file).map_err(io_at("replacing", &tail.file))?;
    Ok(index)
}

#[cfg(test)]
#[path = "wal_etcd_tests.rs"]
mod etcd_tests;

#[cfg(test)]
mod tests {
    use super::super::replay::DEFAULT_LEASE_TTL;
    use super::*;

    use crate::etcd_wal::tests::{entry, log_from, snapshot, state};
    use crate::etcd_wal::SNAPSHOT;

    fn log_with(records: &[(i64, Vec<u8>)]) -> Vec<u8> {
        log_from(0, records)
    }

    fn conf_entry() -> Vec<u8> {
        entry(1, vec![1, 2, 3])
    }

    /// The records of the log `etcdutl snapshot restore` writes: its
    /// membership entry, the state committing it, a snapshot record at it.
    fn etcdutl_log() -> Vec<u8> {
        log_with(&[
            (ENTRY, conf_entry()),
            (STATE, state(1)),
            (SNAPSHOT, snapshot(1)),
        ])
    }

    #[test]
    fn a_fresh_log_is_extended_after_its_snapshot_and_reads_back_committed() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, snap) = (
            dir.path().join("member/wal"),
            dir.path().join("member/snap"),
        );
        let file = wal.join("0.wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::create_dir_all(&snap).unwrap();
        let etcdutl_snapshot = snap.join("0000000000000001-0000000000000001.snap");
        std::fs::write(&etcdutl_snapshot, b"membership").unwrap();
        std::fs::write(&file, etcdutl_log()).unwrap();
        let tail = read_tail(dir.path()).unwrap().expect("fresh");
        assert_eq!(
            (tail.last_index, tail.state.commit, tail.snapshot_index),
            (1, 1, 1)
        );
        let mut requests = Requests::default();
        let event = |key: &str, lease| EventRecord {
            delete: false,
            key: key.into(),
            value: b"v".to_vec(),
            lease,
            version: 1,
        };
        let r = RevisionRecord {
            revision: 5,
            time_ms: 0,
            events: vec![event("a", 9), event("b", 9)],
        };
        let mut granted = BTreeSet::new();
        requests.push(&r, &mut granted, &BTreeMap::from([(9, 30)]));
        assert_eq!(
            (requests.revisions, requests.events, requests.encoded.len()),
            (1, 2, 2)
        );
        assert_eq!(append(&tail, &requests).unwrap(), 3);
        assert_eq!(tail.entries_past_snapshot(3), 2);
        // read again: the CRC chain holds, the entries follow the snapshot
        // record and are committed, and the log is no longer fresh
        let bytes = std::fs::read(&file).unwrap();
        let s = scan(&file, &bytes).unwrap();
        assert_eq!(
            (s.snapshot_index, s.last_index, s.state.map(|st| st.commit)),
            (Some(1), Some(3), Some(3))
        );
        assert!(read_tail(dir.path()).unwrap().is_none());
        // etcdutl's files beside the log stay as it wrote them
        assert!(etcdutl_snapshot.exists());
    }

    #[test]
    fn a_revision_of_one_event_is_that_request_alone_and_more_are_a_transaction() {
        let ev = |key: &str, delete| EventRecord {
            delete,
            key: key.into(),
            value: if delete { vec![] } else { b"v".to_vec() },
            lease: 0,
            version: 1,
        };
        let shape = |events: Vec<EventRecord>| {
            let mut requests = Requests::default();
            let r = RevisionRecord {
                revision: 2,
                time_ms: 0,
                events,
            };
            requests.push(&r, &mut BTreeSet::new(), &BTreeMap::new());
            let req = InternalRaftRequest::decode(&requests.encoded[0][..]).unwrap();
            let keys = |t: &TxnRequest| {
                t.success
                    .iter()
                    .map(|op| match (&op.request_put, &op.request_delete_range) {
                        (Some(p), None) => format!("put {}", String::from_utf8_lossy(&p.key)),
                        (None, Some(d)) => format!("delete {}", String::from_utf8_lossy(&d.key)),
                        _ => "?".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            match (&req.put, &req.delete_range, &req.txn) {
                (Some(p), None, None) => format!("put {}", String::from_utf8_lossy(&p.key)),
                (None, Some(d), None) => format!("delete {}", String::from_utf8_lossy(&d.key)),
                (None, None, Some(t)) => format!("txn [{}]", keys(t)),
                _ => "several".into(),
            }
        };
        let cases = [
            (vec![ev("a", false)], "put a"),
            (vec![ev("a", true)], "delete a"),
            (
                vec![ev("a", false), ev("b", true), ev("c", false)],
                "txn [put a, delete b, put c]",
            ),
            (vec![ev("a", true), ev("b", false)], "txn [delete a, put b]"),
        ];
        for (events, want) in cases {
            assert_eq!(shape(events), want);
        }
    }

    #[test]
    fn a_damaged_log_is_refused_with_its_offset() {
        let file = Path::new("/x/0.wal");
        let mut bytes = log_with(&[(ENTRY, conf_entry()), (STATE, state(1))]);
        // the last byte of the state record's data
        let state_at = log_with(&[(ENTRY, conf_entry())]).len() - 64;
        let len = u64::from_le_bytes(bytes[state_at..state_at + 8].try_into().unwrap());
        bytes[state_at + 8 + (len & 0xff_ffff_ffff_ffff) as usize - 1] ^= 0xff;
        let err = parse(file, &bytes).unwrap_err().to_string();
        assert!(err.contains("0.wal") && err.contains("CRC"), "{err}");
        // a log whose state lags its entries is left to the transactions
        let lagging = log_with(&[(ENTRY, conf_entry()), (STATE, state(0))]);
        assert!(parse(file, &lagging).unwrap().is_none());
        // and so is one whose snapshot is past its entries (entries after
        // its last would be ones etcd holds already)
        let past = log_with(&[
            (ENTRY, conf_entry()),
            (STATE, state(1)),
            (SNAPSHOT, snapshot(4)),
        ]);
        assert!(parse(file, &past).unwrap().is_none());
        // a log without a snapshot record: etcd reads it from its start
        let bare = log_with(&[(ENTRY, conf_entry()), (STATE, state(1))]);
        let tail = parse(file, &bare).unwrap().expect("fresh");
        assert_eq!(tail.entries_past_snapshot(3), 3);
    }

    fn delta(leases: Vec<(i64, i64)>, records: Vec<RevisionRecord>) -> Delta {
        let meta = crate::codec::DeltaMeta {
            first_revision: records.first().map_or(0, |r| r.revision),
            last_revision: records.last().map_or(0, |r| r.revision),
            revisions: records.len() as u64,
            events: records.len() as u64,
            keys_after: 0,
            leases,
            hash_kv: None,
        };
        ("d".into(), (meta, records))
    }

    fn put(revision: i64, lease: i64, value_len: usize) -> RevisionRecord {
        RevisionRecord {
            revision,
            time_ms: 0,
            events: vec![EventRecord {
                delete: false,
                key: format!("k{revision}").into_bytes(),
                value: vec![0; value_len],
                lease,
                version: 1,
            }],
        }
    }

    /// Which revisions go to the log, and which lease grants come with them.
    #[test]
    fn the_log_takes_the_contiguous_revisions_after_the_snapshot_up_to_the_target() {
        let ttl_of = |reqs: &Requests| -> Vec<(i64, i64)> {
            reqs.encoded
                .iter()
                .filter_map(|b| InternalRaftRequest::decode(b.as_slice()).ok()?.lease_grant)
                .map(|g| (g.id, g.ttl))
                .collect()
        };
        // (deltas, snapshot revision, target, revisions taken, lease grants)
        type Case = (Vec<Delta>, i64, i64, u64, Vec<(i64, i64)>);
        let cases: Vec<Case> = vec![
            // in the snapshot: skipped; overlapping deltas: once; leases once,
            // with the recorded TTL or the default
            (
                vec![
                    delta(
                        vec![(7, 30)],
                        vec![put(4, 0, 1), put(5, 7, 1), put(6, 7, 1)],
                    ),
                    delta(vec![], vec![put(6, 0, 1), put(7, 9, 1)]),
                ],
                4,
                100,
                3,
                vec![(7, 30), (9, DEFAULT_LEASE_TTL)],
            ),
            // the target ends it
            (
                vec![delta(vec![], vec![put(5, 0, 1), put(6, 0, 1)])],
                4,
                5,
                1,
                vec![],
            ),
            // a missing revision ends it (the transactions report the gap)
            (
                vec![delta(vec![], vec![put(5, 0, 1), put(7, 0, 1)])],
                4,
                9,
                1,
                vec![],
            ),
            // a large revision is one record too (etcd reads a record of
            // any size that fits in its file)
            (
                vec![delta(vec![], vec![put(5, 0, 1), put(6, 0, 12 << 20)])],
                4,
                9,
                2,
                vec![],
            ),
        ];
        for (i, (deltas, from, target, revisions, grants)) in cases.into_iter().enumerate() {
            let reqs = requests(&deltas, from, target);
            assert_eq!(reqs.revisions, revisions, "case {i}");
            assert_eq!(ttl_of(&reqs), grants, "case {i}");
        }
    }
}
