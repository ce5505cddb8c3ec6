//! Durable Raft storage: the log, hard state, conf state and the latest
//! state-machine snapshot in a redb database (every write transaction is
//! fsynced before it returns), mirrored in memory for raft-rs's reads.

use std::path::Path;
use std::sync::{Arc, RwLock};

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use redb::{Database, ReadableDatabase, TableDefinition};

use crate::RingError;

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_entries");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const HARD_STATE: &str = "hard_state";
const CONF_STATE: &str = "conf_state";
const SNAPSHOT: &str = "snapshot";

#[derive(Default)]
struct Core {
    hard_state: HardState,
    conf_state: ConfState,
    /// Metadata and state-machine data of the last compaction (or received snapshot).
    snapshot: Snapshot,
    /// Contiguous entries after the snapshot index.
    entries: Vec<Entry>,
}

impl Core {
    fn first_index(&self) -> u64 {
        self.snapshot.get_metadata().index + 1
    }

    fn last_index(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot.get_metadata().index, |e| e.index)
    }
}

/// What one Ready asks to persist, written in a single fsynced transaction.
#[derive(Default)]
pub struct PersistBatch<'a> {
    pub snapshot: Option<&'a Snapshot>,
    pub entries: &'a [Entry],
    pub hard_state: Option<&'a HardState>,
    pub conf_state: Option<&'a ConfState>,
}

impl PersistBatch<'_> {
    /// Nothing to write: most Readys carry only messages (heartbeats and
    /// their answers, several per second).
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none()
            && self.entries.is_empty()
            && self.hard_state.is_none()
            && self.conf_state.is_none()
    }
}

/// raft-rs storage backed by redb.
#[derive(Clone)]
pub struct DiskStorage {
    core: Arc<RwLock<Core>>,
    db: Arc<Database>,
    /// Transactions [`DiskStorage::persist`] fsynced so far.
    durable_commits: Arc<std::sync::atomic::AtomicU64>,
}

fn storage_err(what: &str) -> impl Fn(String) -> RingError + '_ {
    move |e| RingError::Storage(format!("{what}: {e}"))
}

fn decode<M: protobuf::Message>(what: &str, bytes: &[u8]) -> Result<M, RingError> {
    M::parse_from_bytes(bytes)
        .map_err(|e| RingError::Storage(format!("corrupted {what} in the Raft store: {e}")))
}

fn encode<M: protobuf::Message>(m: &M) -> Result<Vec<u8>, RingError> {
    m.write_to_bytes()
        .map_err(|e| RingError::Storage(format!("encoding: {e}")))
}

impl DiskStorage {
    /// Opens (or creates) the store at `path`. A new store starts with
    /// `initial_voters` as its configuration (empty for a member that joins later).
    pub fn open(path: &Path, initial_voters: &[u64]) -> Result<Self, RingError> {
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                RingError::StoreLocked(path.display().to_string())
            }
            e => RingError::Storage(format!("opening Raft store {}: {e}", path.display())),
        })?;
        let mut core = Core::default();
        {
            let read = db
                .begin_read()
                .map_err(|e| storage_err("read")(e.to_string()))?;
            if let Ok(meta) = read.open_table(META) {
                let get = |k: &str| -> Result<Option<Vec<u8>>, RingError> {
                    meta.get(k)
                        .map(|v| v.map(|v| v.value().to_vec()))
                        .map_err(|e| storage_err("read")(e.to_string()))
                };
                if let Some(b) = get(HARD_STATE)? {
                    core.hard_state = decode("hard state", &b)?;
                }
                if let Some(b) = get(CONF_STATE)? {
                    core.conf_state = decode("conf state", &b)?;
                }
                if let Some(b) = get(SNAPSHOT)? {
                    core.snapshot = decode("snapshot", &b)?;
                }
                let entries = read
                    .open_table(ENTRIES)
                    .map_err(|e| storage_err("read")(e.to_string()))?;
                let first = core.first_index();
                for item in entries
                    .range(first..)
                    .map_err(|e| storage_err("read")(e.to_string()))?
                {
                    let (_, v) = item.map_err(|e| storage_err("read")(e.to_string()))?;
                    let e: Entry = decode("entry", v.value())?;
                    if e.index != core.last_index() + 1 {
                        return Err(RingError::Storage(format!(
                            "Raft log has a gap before entry {} (expected {})",
                            e.index,
                            core.last_index() + 1
                        )));
                    }
                    core.entries.push(e);
                }
            }
        }
        let store = DiskStorage {
            core: Arc::new(RwLock::new(core)),
            db: Arc::new(db),
            durable_commits: Default::default(),
        };
        let fresh = {
            let c = store.read();
            c.conf_state.voters.is_empty()
                && c.conf_state.learners.is_empty()
                && c.last_index() == 0
        };
        if fresh && !initial_voters.is_empty() {
            let cs = ConfState {
                voters: initial_voters.to_vec(),
                ..Default::default()
            };
            store.persist(&PersistBatch {
                conf_state: Some(&cs),
                ..Default::default()
            })?;
        }
        Ok(store)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Core> {
        self.core.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Core> {
        self.core.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Persists a Ready's snapshot, entries and states (one fsynced transaction), then
    /// makes them visible to raft-rs.
    ///
    /// An empty batch writes nothing: an empty transaction still costs an
    /// fsync, and every ringd had about ten a second from heartbeats alone,
    /// next to the etcds on the same disk.
    pub fn persist(&self, batch: &PersistBatch<'_>) -> Result<(), RingError> {
        if batch.is_empty() {
            return Ok(());
        }
        let txn = self
            .db
            .begin_write()
            .map_err(|e| storage_err("begin")(e.to_string()))?;
        {
            let mut meta = txn
                .open_table(META)
                .map_err(|e| storage_err("meta")(e.to_string()))?;
            let mut entries = txn
                .open_table(ENTRIES)
                .map_err(|e| storage_err("entries")(e.to_string()))?;
            let io = |e: redb::StorageError| storage_err("write")(e.to_string());
            if let Some(snap) = batch.snapshot {
                meta.insert(SNAPSHOT, encode(snap)?.as_slice())
                    .map_err(io)?;
                meta.insert(
                    CONF_STATE,
                    encode(snap.get_metadata().get_conf_state())?.as_slice(),
                )
                .map_err(io)?;
                entries.retain(|_, _| false).map_err(io)?;
            }
            if let Some(first) = batch.entries.first() {
                entries.retain_in(first.index.., |_, _| false).map_err(io)?;
                for e in batch.entries {
                    entries.insert(e.index, encode(e)?.as_slice()).map_err(io)?;
                }
            }
            if let Some(hs) = batch.hard_state {
                meta.insert(HARD_STATE, encode(hs)?.as_slice())
                    .map_err(io)?;
            }
            if let Some(cs) = batch.conf_state {
                meta.insert(CONF_STATE, encode(cs)?.as_slice())
                    .map_err(io)?;
            }
        }
        txn.commit()
            .map_err(|e| storage_err("commit")(e.to_string()))?;
        self.durable_commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);

        let mut core = self.write();
        if let Some(snap) = batch.snapshot {
            let meta = snap.get_metadata();
            core.hard_state.commit = core.hard_state.commit.max(meta.index);
            core.hard_state.term = core.hard_state.term.max(meta.term);
            core.conf_state = meta.get_conf_state().clone();
            core.snapshot = snap.clone();
            core.entries.clear();
        }
        if let Some(first) = batch.entries.first() {
            let keep = first.index.saturating_sub(core.first_index()) as usize;
            core.entries.truncate(keep);
            core.entries.extend_from_slice(batch.entries);
        }
        if let Some(hs) = batch.hard_state {
            core.hard_state = hs.clone();
        }
        if let Some(cs) = batch.conf_state {
            core.conf_state = cs.clone();
        }
        Ok(())
    }

    /// Transactions [`DiskStorage::persist`] fsynced since the store opened.
    pub fn durable_commits(&self) -> u64 {
        self.durable_commits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records the commit index (from a LightReady). Written before anything is
    /// applied, but without its own fsync: the next durable transaction carries it,
    /// and a commit index that lags after a crash is only re-learnt from the leader
    /// (the state machine is rebuilt from the snapshot and log either way).
    pub fn set_commit(&self, commit: u64) -> Result<(), RingError> {
        let mut hs = self.read().hard_state.clone();
        if hs.commit >= commit {
            return Ok(());
        }
        hs.commit = commit;
        let mut txn = self
            .db
            .begin_write()
            .map_err(|e| storage_err("begin")(e.to_string()))?;
        txn.set_durability(redb::Durability::None)
            .map_err(|e| storage_err("durability")(e.to_string()))?;
        {
            let mut meta = txn
                .open_table(META)
                .map_err(|e| storage_err("meta")(e.to_string()))?;
            meta.insert(HARD_STATE, encode(&hs)?.as_slice())
                .map_err(|e| storage_err("write")(e.to_string()))?;
        }
        txn.commit()
            .map_err(|e| storage_err("commit")(e.to_string()))?;
        self.write().hard_state = hs;
        Ok(())
    }

    /// Replaces the log up to `index` (applied) by a snapshot holding `data`.
    pub fn compact(
        &self,
        index: u64,
        data: Vec<u8>,
        conf_state: &ConfState,
    ) -> Result<(), RingError> {
        let term = {
            let core = self.read();
            if index < core.first_index() || index > core.last_index() {
                return Ok(());
            }
            core.entries[(index - core.first_index()) as usize].term
        };
        let mut snap = Snapshot {
            data: data.into(),
            ..Default::default()
        };
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf_state.clone());
        let txn = self
            .db
            .begin_write()
            .map_err(|e| storage_err("begin")(e.to_string()))?;
        {
            let io = |e: redb::StorageError| storage_err("compact")(e.to_string());
            let mut m = txn
                .open_table(META)
                .map_err(|e| storage_err("meta")(e.to_string()))?;
            m.insert(SNAPSHOT, encode(&snap)?.as_slice()).map_err(io)?;
            let mut entries = txn
                .open_table(ENTRIES)
                .map_err(|e| storage_err("entries")(e.to_string()))?;
            entries.retain_in(..=index, |_, _| false).map_err(io)?;
        }
        txn.commit()
            .map_err(|e| storage_err("commit")(e.to_string()))?;
        let mut core = self.write();
        let drop_n = (index + 1 - core.first_index()) as usize;
        core.entries.drain(..drop_n);
        core.snapshot = snap;
        Ok(())
    }

    /// The index of the latest snapshot.
    pub fn snapshot_index(&self) -> u64 {
        self.read().snapshot.get_metadata().index
    }

    /// The latest snapshot (metadata and state-machine data).
    pub fn latest_snapshot(&self) -> Snapshot {
        self.read().snapshot.clone()
    }

    /// The persisted hard state.
    pub fn hard_state(&self) -> HardState {
        self.read().hard_state.clone()
    }

    /// The persisted configuration.
    pub fn conf_state(&self) -> ConfState {
        self.read().conf_state.clone()
    }

    /// Committed entries after the snapshot up to `commit` (for replay at start).
    pub fn committed_after_snapshot(&self) -> Vec<Entry> {
        let core = self.read();
        let commit = core.hard_state.commit;
        core.entries
            .iter()
            .filter(|e| e.index <= commit)
            .cloned()
            .collect()
    }

    /// Number of entries held (after the snapshot).
    pub fn entry_count(&self) -> usize {
        self.read().entries.len()
    }
}

impl raft::Storage for DiskStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let core = self.read();
        Ok(RaftState::new(
            core.hard_state.clone(),
            core.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let core = self.read();
        if low < core.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > core.last_index() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = core.first_index();
        let mut ents = core.entries[(low - offset) as usize..(high - offset) as usize].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let core = self.read();
        let snap = core.snapshot.get_metadata();
        if idx == snap.index {
            return Ok(snap.term);
        }
        if idx < core.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > core.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(core.entries[(idx - core.first_index()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.read().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.read().last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let core = self.read();
        if core.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(core.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: format!("e{index}").into_bytes().into(),
            ..Default::default()
        }
    }

    #[test]
    fn survives_reopen_with_entries_states_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        {
            let s = DiskStorage::open(&path, &[1, 2, 3]).unwrap();
            let ents: Vec<_> = (1..=5).map(|i| entry(i, 1)).collect();
            let hs = HardState {
                term: 1,
                vote: 2,
                commit: 3,
                ..Default::default()
            };
            s.persist(&PersistBatch {
                entries: &ents,
                hard_state: Some(&hs),
                ..Default::default()
            })
            .unwrap();
            // a new leader overwrites 4..: conflicting suffix is replaced
            s.persist(&PersistBatch {
                entries: &[entry(4, 2)],
                ..Default::default()
            })
            .unwrap();
            assert_eq!(s.last_index().unwrap(), 4);
        }
        let s = DiskStorage::open(&path, &[9]).unwrap();
        assert_eq!(
            s.conf_state().voters,
            vec![1, 2, 3],
            "initial voters only for a new store"
        );
        let st = s.initial_state().unwrap();
        assert_eq!(
            (st.hard_state.term, st.hard_state.vote, st.hard_state.commit),
            (1, 2, 3)
        );
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (1, 4));
        assert_eq!(s.term(4).unwrap(), 2);
        assert_eq!(s.committed_after_snapshot().len(), 3);
    }

    /// A Ready with only messages (heartbeats) writes nothing; one with
    /// entries or a hard state is one fsynced transaction.
    #[test]
    fn only_batches_with_something_in_them_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage::open(&dir.path().join("raft.redb"), &[1]).unwrap();
        let before = s.durable_commits();
        for _ in 0..3 {
            s.persist(&PersistBatch::default()).unwrap();
        }
        assert_eq!(s.durable_commits(), before, "empty batches");
        let hs = HardState {
            term: 2,
            ..Default::default()
        };
        s.persist(&PersistBatch {
            entries: &[entry(1, 2)],
            hard_state: Some(&hs),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.durable_commits(), before + 1);
        assert_eq!(s.initial_state().unwrap().hard_state.term, 2);
    }

    #[test]
    fn compaction_keeps_a_snapshot_and_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        {
            let s = DiskStorage::open(&path, &[1]).unwrap();
            let ents: Vec<_> = (1..=10).map(|i| entry(i, 3)).collect();
            s.persist(&PersistBatch {
                entries: &ents,
                ..Default::default()
            })
            .unwrap();
            s.compact(6, b"state@6".to_vec(), &s.conf_state()).unwrap();
            assert_eq!(s.first_index().unwrap(), 7);
            assert_eq!(s.term(6).unwrap(), 3);
            assert!(matches!(
                s.term(5),
                Err(raft::Error::Store(StorageError::Compacted))
            ));
            assert!(s
                .entries(5, 8, None, GetEntriesContext::empty(false))
                .is_err());
        }
        let s = DiskStorage::open(&path, &[1]).unwrap();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (7, 10));
        let snap = s.snapshot(0, 2).unwrap();
        assert_eq!(
            (snap.get_metadata().index, &snap.data[..]),
            (6, &b"state@6"[..])
        );
        assert_eq!(
            s.entries(7, 11, None, GetEntriesContext::empty(false))
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn a_store_open_elsewhere_is_reported_as_locked_and_retryable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.redb");
        let first = DiskStorage::open(&path, &[1]).unwrap();
        let err = DiskStorage::open(&path, &[1])
            .err()
            .expect("the second open fails");
        assert!(matches!(err, RingError::StoreLocked(_)), "{err}");
        assert!(err.is_retryable());
        assert!(err.to_string().contains("other ringd"), "{err}");
        drop(first);
        DiskStorage::open(&path, &[1]).expect("free again once the first is closed");
    }

    #[test]
    fn received_snapshot_replaces_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let s = DiskStorage::open(&dir.path().join("r.redb"), &[]).unwrap();
        let ents: Vec<_> = (1..=3).map(|i| entry(i, 1)).collect();
        s.persist(&PersistBatch {
            entries: &ents,
            ..Default::default()
        })
        .unwrap();
        let mut snap = Snapshot {
            data: b"x".to_vec().into(),
            ..Default::default()
        };
        snap.mut_metadata().index = 20;
        snap.mut_metadata().term = 4;
        snap.mut_metadata().mut_conf_state().voters = vec![1, 2];
        s.persist(&PersistBatch {
            snapshot: Some(&snap),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (s.first_index().unwrap(), s.last_index().unwrap()),
            (21, 20)
        );
        assert_eq!(s.hard_state().commit, 20);
        assert_eq!(s.conf_state().voters, vec![1, 2]);
    }
}
