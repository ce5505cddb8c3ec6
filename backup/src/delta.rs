//! Delta snapshots: the watch events of a revision range.
//!
//! A delta's body is a sequence of length-delimited protobuf [`RevisionRecord`]s,
//! one per etcd revision, in revision order; each holds the events of that
//! revision (one transaction) and when Ring received them. Replaying each
//! record as one transaction reproduces etcd's revisions exactly.

use std::collections::BTreeMap;

use etcd_client::EventType;
use prost::Message;

use crate::codec::{DeltaMeta, Header, Kind};
use crate::{BackupError, Result};

/// The events of one revision.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RevisionRecord {
    #[prost(int64, tag = "1")]
    pub revision: i64,
    /// When Ring received the revision (milliseconds since the epoch).
    #[prost(int64, tag = "2")]
    pub time_ms: i64,
    #[prost(message, repeated, tag = "3")]
    pub events: Vec<EventRecord>,
}

/// One put or delete.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventRecord {
    #[prost(bool, tag = "1")]
    pub delete: bool,
    #[prost(bytes = "vec", tag = "2")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "4")]
    pub lease: i64,
    /// The key's version after a put (1: the key was created).
    #[prost(int64, tag = "5")]
    pub version: i64,
}

impl RevisionRecord {
    /// How the number of keys changes with this revision.
    pub fn key_delta(&self) -> i64 {
        self.events
            .iter()
            .map(|e| match (e.delete, e.version) {
                (true, _) => -1,
                (false, 1) => 1,
                (false, _) => 0,
            })
            .sum()
    }
}

/// Events received but not yet sealed into a delta.
#[derive(Debug, Default)]
pub struct Batch {
    records: Vec<RevisionRecord>,
    bytes: u64,
    events: u64,
    leases: BTreeMap<i64, i64>,
    /// When the oldest pending record arrived.
    pub oldest_ms: Option<i64>,
}

impl Batch {
    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Approximate bytes pending.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The last revision pending.
    pub fn last_revision(&self) -> Option<i64> {
        self.records.last().map(|r| r.revision)
    }

    /// Adds the events of one watch response (whole revisions, in order).
    /// Returns the lease ids not seen before (their TTL is asked once).
    pub fn add(&mut self, events: &[etcd_client::Event], now_ms: i64) -> Result<Vec<i64>> {
        let mut new_leases = Vec::new();
        for ev in events {
            let Some(kv) = ev.kv() else {
                return Err(BackupError::Etcd {
                    endpoint: "watch".into(),
                    message: "an event without its key-value".into(),
                });
            };
            let revision = kv.mod_revision();
            let record = EventRecord {
                delete: ev.event_type() == EventType::Delete,
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                lease: kv.lease(),
                version: kv.version(),
            };
            if record.lease != 0 && !self.leases.contains_key(&record.lease) {
                self.leases.insert(record.lease, 0);
                new_leases.push(record.lease);
            }
            self.bytes += (record.key.len() + record.value.len() + 32) as u64;
            self.events += 1;
            match self.records.last_mut() {
                Some(last) if last.revision == revision => last.events.push(record),
                Some(last) if last.revision > revision => {
                    return Err(BackupError::Etcd {
                        endpoint: "watch".into(),
                        message: format!(
                            "event at revision {revision} arrived after revision {}",
                            last.revision
                        ),
                    })
                }
                _ => self.records.push(RevisionRecord {
                    revision,
                    time_ms: now_ms,
                    events: vec![record],
                }),
            }
            self.oldest_ms.get_or_insert(now_ms);
        }
        Ok(new_leases)
    }

    /// Records a lease's granted TTL.
    pub fn set_lease_ttl(&mut self, lease: i64, ttl: i64) {
        self.leases.insert(lease, ttl);
    }

    /// Takes everything pending as a sealed delta; `keys_before` is the key count
    /// before the first revision. Returns `None` when nothing is pending.
    pub fn seal(&mut self, keys_before: i64) -> Option<Sealed> {
        let records = std::mem::take(&mut self.records);
        let first = records.first()?.revision;
        let last = records.last()?.revision;
        let keys_after = keys_before + records.iter().map(RevisionRecord::key_delta).sum::<i64>();
        let mut body = Vec::with_capacity(self.bytes as usize + records.len() * 8);
        for r in &records {
            // Encoding into a Vec cannot fail (it grows).
            let _ = r.encode_length_delimited(&mut body);
        }
        let meta = DeltaMeta {
            first_revision: first,
            last_revision: last,
            revisions: records.len() as u64,
            events: self.events,
            keys_after,
            leases: std::mem::take(&mut self.leases).into_iter().collect(),
            hash_kv: None,
        };
        let oldest_ms = self.oldest_ms.take().unwrap_or(0);
        self.bytes = 0;
        self.events = 0;
        Some(Sealed {
            meta,
            body,
            oldest_ms,
        })
    }
}

/// A sealed delta, not yet encoded.
#[derive(Debug)]
pub struct Sealed {
    pub meta: DeltaMeta,
    /// The length-delimited records.
    pub body: Vec<u8>,
    /// When the oldest event arrived.
    pub oldest_ms: i64,
}

impl Sealed {
    /// The object header of this delta.
    pub fn header(&self, shoot: &str, created_ms: i64, epoch: u64) -> Header {
        Header {
            format: crate::codec::FORMAT,
            kind: Kind::Delta,
            shoot: shoot.to_string(),
            created_ms,
            compression: String::new(),
            encryption: None,
            full: None,
            delta: Some(self.meta.clone()),
            epoch,
        }
    }
}

/// Decodes a delta body into its records, checking their order and range.
pub fn decode_records(object: &str, body: &[u8], meta: &DeltaMeta) -> Result<Vec<RevisionRecord>> {
    let mut buf = body;
    let mut out: Vec<RevisionRecord> = Vec::new();
    while !buf.is_empty() {
        let r = RevisionRecord::decode_length_delimited(&mut buf).map_err(|e| {
            BackupError::corrupt(object, format!("record {} is unreadable: {e}", out.len()))
        })?;
        if let Some(prev) = out.last() {
            if r.revision <= prev.revision {
                return Err(BackupError::corrupt(
                    object,
                    format!("revision {} follows revision {}", r.revision, prev.revision),
                ));
            }
        }
        if r.events.is_empty() {
            return Err(BackupError::corrupt(
                object,
                format!("revision {} has no events", r.revision),
            ));
        }
        out.push(r);
    }
    let (first, last) = (
        out.first().map(|r| r.revision),
        out.last().map(|r| r.revision),
    );
    if first != Some(meta.first_revision) || last != Some(meta.last_revision) {
        return Err(BackupError::corrupt(
            object,
            format!(
                "holds revisions {first:?}..{last:?}, its header says {}..{}",
                meta.first_revision, meta.last_revision
            ),
        ));
    }
    if out.len() as u64 != meta.revisions {
        return Err(BackupError::corrupt(
            object,
            format!(
                "holds {} revisions, its header says {}",
                out.len(),
                meta.revisions
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(rev: i64, events: Vec<EventRecord>) -> RevisionRecord {
        RevisionRecord {
            revision: rev,
            time_ms: rev * 10,
            events,
        }
    }

    fn put(key: &str, version: i64) -> EventRecord {
        EventRecord {
            delete: false,
            key: key.into(),
            value: b"v".to_vec(),
            lease: 0,
            version,
        }
    }

    fn del(key: &str) -> EventRecord {
        EventRecord {
            delete: true,
            key: key.into(),
            value: vec![],
            lease: 0,
            version: 0,
        }
    }

    #[test]
    fn key_count_follows_creates_and_deletes() {
        assert_eq!(rec(1, vec![put("a", 1), put("b", 1)]).key_delta(), 2);
        assert_eq!(rec(2, vec![put("a", 2)]).key_delta(), 0);
        assert_eq!(rec(3, vec![del("a"), del("b")]).key_delta(), -2);
    }

    #[test]
    fn records_round_trip_and_bad_bodies_are_named() {
        let records = vec![
            rec(5, vec![put("a", 1)]),
            rec(6, vec![del("a"), put("b", 1)]),
        ];
        let mut body = Vec::new();
        for r in &records {
            r.encode_length_delimited(&mut body).unwrap();
        }
        let meta = DeltaMeta {
            first_revision: 5,
            last_revision: 6,
            revisions: 2,
            events: 3,
            ..Default::default()
        };
        assert_eq!(decode_records("d", &body, &meta).unwrap(), records);
        let wrong = DeltaMeta {
            last_revision: 7,
            ..meta.clone()
        };
        assert!(decode_records("d", &body, &wrong)
            .unwrap_err()
            .to_string()
            .contains("header says"));
        assert!(decode_records("d", &body[..body.len() - 2], &meta).is_err());
        let mut swapped = Vec::new();
        records[1].encode_length_delimited(&mut swapped).unwrap();
        records[0].encode_length_delimited(&mut swapped).unwrap();
        assert!(decode_records("d", &swapped, &meta)
            .unwrap_err()
            .to_string()
            .contains("follows"));
    }
}
