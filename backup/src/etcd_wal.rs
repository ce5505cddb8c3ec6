//! etcd's write-ahead log format (`server/storage/wal/encoder.go`,
//! `decoder.go`, `wal.go`): the records, their frames and the CRC chain, and
//! a checked scan of one log file. Two users: a restore appends recorded revisions to a fresh log
//! ([`crate::restore`]), a standby's promotion raises the log's commit to its
//! last entry ([`crate::standby`]).
//!
//! Each record is an 8-byte little-endian length (its top byte
//! `0x80 | padding` when padded), the `walpb.Record` and zero padding to 8
//! bytes; a record's CRC is CRC-32C over its data, chained from the previous
//! record's; a CRC record starts a file (carrying the chain from the file
//! before) and a zero length ends the data (the rest is preallocated).
//! A snapshot record marks the raft snapshot etcd starts from: etcd reads
//! the entries after the newest one whose index is committed.

use std::path::{Path, PathBuf};

use prost::Message;

use crate::error::io_at;
use crate::{BackupError, Result};

/// `walpb.Record` types.
pub(crate) const ENTRY: i64 = 2;
pub(crate) const STATE: i64 = 3;
pub(crate) const CRC: i64 = 4;
pub(crate) const SNAPSHOT: i64 = 5;

/// `walpb.Record`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Record {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(uint32, tag = "2")]
    pub crc: u32,
    #[prost(bytes = "vec", tag = "3")]
    pub data: Vec<u8>,
}

/// `raftpb.Entry` (type 0: a normal entry).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Entry {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(uint64, tag = "2")]
    pub term: u64,
    #[prost(uint64, tag = "3")]
    pub index: u64,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
}

/// `raftpb.HardState`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(crate) struct HardState {
    #[prost(uint64, tag = "1")]
    pub term: u64,
    #[prost(uint64, tag = "2")]
    pub vote: u64,
    #[prost(uint64, tag = "3")]
    pub commit: u64,
}

/// `walpb.Snapshot` (its `ConfState` left out: only its position is read).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Snapshot {
    #[prost(uint64, tag = "1")]
    pub index: u64,
    #[prost(uint64, tag = "2")]
    pub term: u64,
}

/// One framed record (8-byte length, record, padding).
pub(crate) fn frame(out: &mut Vec<u8>, rec: &Record) {
    let data = rec.encode_to_vec();
    let pad = (8 - data.len() % 8) % 8;
    let mut len = data.len() as u64;
    if pad != 0 {
        len |= ((0x80 | pad) as u64) << 56;
    }
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&data);
    out.extend(std::iter::repeat_n(0u8, pad));
}

/// `data` as the next record after one whose CRC was `crc` (updated).
pub(crate) fn chained(out: &mut Vec<u8>, crc: &mut u32, r#type: i64, data: Vec<u8>) {
    *crc = crc32c::crc32c_append(*crc, &data);
    frame(
        out,
        &Record {
            r#type,
            crc: *crc,
            data,
        },
    );
}

/// A damaged log file.
pub(crate) fn corrupt(file: &Path, why: impl std::fmt::Display) -> BackupError {
    BackupError::Restore(format!(
        "the write-ahead log {} is damaged or not in etcd's format: {why}",
        file.display()
    ))
}

/// What a checked scan of one log file found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scan {
    /// Offset just after the last record (where the next one goes).
    pub end: usize,
    /// The CRC of the last record (the next one chains from it).
    pub crc: u32,
    /// The index of the last entry record, if the file holds any.
    pub last_index: Option<u64>,
    /// The file holds a normal entry with data (a request).
    pub requests: bool,
    /// The last raft state record, if any.
    pub state: Option<HardState>,
    /// The index of the last snapshot record, if any.
    pub snapshot_index: Option<u64>,
}

/// Reads the records of one log file, checking the CRC chain from the file's
/// first (CRC) record.
pub(crate) fn scan(file: &Path, bytes: &[u8]) -> Result<Scan> {
    let mut s = Scan {
        end: 0,
        crc: 0,
        last_index: None,
        requests: false,
        state: None,
        snapshot_index: None,
    };
    while let Some(head) = bytes.get(s.end..s.end + 8) {
        let len_field = u64::from_le_bytes(head.try_into().unwrap_or_default());
        if len_field == 0 {
            break;
        }
        let len = (len_field & !(0xff << 56)) as usize;
        let pad = if len_field >> 63 == 1 {
            ((len_field >> 56) & 0x7) as usize
        } else {
            0
        };
        let off = s.end;
        let body = bytes
            .get(off + 8..off + 8 + len)
            .ok_or_else(|| corrupt(file, format!("a record at offset {off} runs past the end")))?;
        let rec = Record::decode(body).map_err(|e| corrupt(file, e))?;
        if rec.r#type == CRC {
            s.crc = rec.crc;
        } else {
            s.crc = crc32c::crc32c_append(s.crc, &rec.data);
            if s.crc != rec.crc {
                return Err(corrupt(file, format!("CRC mismatch at offset {off}")));
            }
        }
        match rec.r#type {
            ENTRY => {
                let e = Entry::decode(rec.data.as_slice()).map_err(|e| corrupt(file, e))?;
                s.requests |= e.r#type == 0 && !e.data.is_empty();
                s.last_index = Some(e.index);
            }
            STATE => {
                s.state =
                    Some(HardState::decode(rec.data.as_slice()).map_err(|e| corrupt(file, e))?)
            }
            SNAPSHOT => {
                let snap = Snapshot::decode(rec.data.as_slice()).map_err(|e| corrupt(file, e))?;
                s.snapshot_index = Some(snap.index);
            }
            _ => {}
        }
        s.end = off + 8 + len + pad;
    }
    Ok(s)
}

/// The log files under etcd's data dir (`member/wal/*.wal`), oldest first
/// (their names are `<sequence>-<index>` in hex, so they sort by name).
pub(crate) fn files(data: &Path) -> Result<Vec<PathBuf>> {
    let dir = data.join("member").join("wal");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(io_at("reading", &dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    files.sort();
    Ok(files)
}

/// The raft snapshot files in etcd's `member/snap` dir (`*.snap`; the
/// database `db` beside them is not one).
pub(crate) fn raft_snapshots(snap: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(snap).map_err(io_at("listing", snap))? {
        let path = entry.map_err(io_at("listing", snap))?.path();
        if path.extension().is_some_and(|e| e == "snap") {
            found.push(path);
        }
    }
    Ok(found)
}

/// Whether etcd's data dir `data` holds a member that never committed
/// anything: its first start ended (killed, or fenced by its guard) before
/// etcd wrote its bootstrap entries, so there is a log but no raft snapshot
/// and no entry in it. etcd restarted on such a dir has no voters and never
/// elects a leader; nothing on it was ever acknowledged to a client. A dir
/// without a log (never started) is not such a member.
pub fn never_committed(data: &Path) -> Result<bool> {
    let member = data.join("member");
    if !member.join("wal").is_dir() {
        return Ok(false);
    }
    let snap = member.join("snap");
    if snap.is_dir() && !raft_snapshots(&snap)?.is_empty() {
        return Ok(false);
    }
    for file in files(data)? {
        let bytes = std::fs::read(&file).map_err(io_at("reading", &file))?;
        if scan(&file, &bytes)?.last_index.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A log file: a CRC record carrying `crc`, the records chained from it,
    /// and preallocated zeros.
    pub(crate) fn log_from(mut crc: u32, records: &[(i64, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(
            &mut out,
            &Record {
                r#type: CRC,
                crc,
                data: vec![],
            },
        );
        for (t, data) in records {
            chained(&mut out, &mut crc, *t, data.clone());
        }
        out.extend(std::iter::repeat_n(0u8, 64)); // preallocated space
        out
    }

    pub(crate) fn entry(index: u64, data: Vec<u8>) -> Vec<u8> {
        let r#type = if index == 1 { 1 } else { 0 };
        Entry {
            r#type,
            term: 1,
            index,
            data,
        }
        .encode_to_vec()
    }

    /// A snapshot record's data at `index` (term 1).
    pub(crate) fn snapshot(index: u64) -> Vec<u8> {
        Snapshot { index, term: 1 }.encode_to_vec()
    }

    pub(crate) fn state(commit: u64) -> Vec<u8> {
        HardState {
            term: 1,
            vote: 7,
            commit,
        }
        .encode_to_vec()
    }

    /// Only a log without entries and without a raft snapshot is a member
    /// that never committed; a dir etcd never started is not one.
    #[test]
    fn a_member_whose_first_start_was_cut_short_never_committed() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert!(!never_committed(&data).unwrap(), "no data dir");
        let wal = data.join("member").join("wal");
        std::fs::create_dir_all(&wal).unwrap();
        std::fs::create_dir_all(data.join("member").join("snap")).unwrap();
        let file = wal.join("0000000000000000-0000000000000000.wal");
        std::fs::write(&file, log_from(0, &[(STATE, state(0))])).unwrap();
        assert!(never_committed(&data).unwrap(), "a log of no entries");
        let snap = data.join("member/snap/0000000000000001-0000000000000001.snap");
        std::fs::write(&snap, b"x").unwrap();
        assert!(!never_committed(&data).unwrap(), "a raft snapshot");
        std::fs::remove_file(&snap).unwrap();
        let log = log_from(0, &[(ENTRY, entry(1, vec![1])), (STATE, state(1))]);
        std::fs::write(&file, log).unwrap();
        assert!(!never_committed(&data).unwrap(), "a log with an entry");
    }

    #[test]
    fn frames_are_padded_to_eight_bytes_with_the_padding_in_the_length() {
        let mut out = Vec::new();
        frame(
            &mut out,
            &Record {
                r#type: ENTRY,
                crc: 1,
                data: vec![9; 3],
            },
        );
        assert_eq!(out.len() % 8, 0);
        let len = u64::from_le_bytes(out[..8].try_into().unwrap());
        let pad = ((len >> 56) & 0x7) as usize;
        assert_eq!(len >> 63, 1);
        assert_eq!(8 + (len & 0xff_ffff_ffff_ffff) as usize + pad, out.len());
    }

    #[test]
    fn a_scan_finds_the_last_entry_and_state_and_refuses_a_broken_chain() {
        let file = Path::new("/x/0.wal");
        let bytes = log_from(
            5,
            &[
                (ENTRY, entry(1, vec![1])),
                (ENTRY, entry(2, b"put".to_vec())),
                (STATE, state(1)),
                (SNAPSHOT, snapshot(1)),
            ],
        );
        let s = scan(file, &bytes).unwrap();
        assert_eq!(s.last_index, Some(2));
        assert_eq!(s.snapshot_index, Some(1));
        assert!(s.requests);
        assert_eq!(s.state.map(|st| st.commit), Some(1));
        assert_eq!(s.end, bytes.len() - 64);
        // the last byte of the state record's data
        let at = scan(
            file,
            &log_from(
                5,
                &[
                    (ENTRY, entry(1, vec![1])),
                    (ENTRY, entry(2, b"put".to_vec())),
                ],
            ),
        )
        .unwrap()
        .end;
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let mut bad = bytes.clone();
        bad[at + 8 + (len & 0xff_ffff_ffff_ffff) as usize - 1] ^= 0xff;
        let err = scan(file, &bad).unwrap_err().to_string();
        assert!(err.contains("0.wal") && err.contains("damaged"), "{err}");
    }
}
