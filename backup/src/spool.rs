//! Encoded deltas waiting for the bucket: in memory up to a limit, then on
//! disk, bounded in all. Files survive a restart and are uploaded first.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::catalog::parse_name;
use crate::error::io_at;
use crate::Result;

/// One object to upload.
#[derive(Debug, Clone)]
pub struct Pending {
    pub name: String,
    pub bytes: Bytes,
    /// The newest revision it holds.
    pub last_revision: i64,
    /// When its oldest event arrived (ms), for the lag.
    pub oldest_ms: i64,
}

enum Slot {
    Memory(Pending),
    Disk {
        path: PathBuf,
        name: String,
        len: u64,
        last_revision: i64,
        oldest_ms: i64,
    },
}

impl Slot {
    fn len(&self) -> u64 {
        match self {
            Slot::Memory(p) => p.bytes.len() as u64,
            Slot::Disk { len, .. } => *len,
        }
    }

    fn name(&self) -> &str {
        match self {
            Slot::Memory(p) => &p.name,
            Slot::Disk { name, .. } => name,
        }
    }

    /// (last revision, oldest event's arrival)
    fn revision_and_age(&self) -> (i64, i64) {
        match self {
            Slot::Memory(p) => (p.last_revision, p.oldest_ms),
            Slot::Disk {
                last_revision,
                oldest_ms,
                ..
            } => (*last_revision, *oldest_ms),
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Slot>,
    memory: u64,
    total: u64,
    next_seq: u64,
}

/// The queue of pending uploads.
pub struct Spool {
    dir: PathBuf,
    memory_limit: u64,
    max_bytes: u64,
    state: Mutex<State>,
    pushed: Notify,
    popped: Notify,
}

/// What the spool holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpoolStats {
    pub objects: usize,
    pub bytes: u64,
    pub on_disk: usize,
}

impl Spool {
    /// A spool in `dir`, picking up files a previous run left.
    pub fn open(dir: &Path, memory_limit: u64, max_bytes: u64) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_at("creating the spool folder", dir))?;
        let mut files: Vec<(u64, PathBuf, String, u64)> = Vec::new();
        for entry in std::fs::read_dir(dir)
            .map_err(io_at("listing", dir))?
            .flatten()
        {
            let path = entry.path();
            let Some(file) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            if file.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some((seq, name)) = file.split_once("--") else {
                continue;
            };
            let (Ok(seq), Ok(meta)) = (seq.parse::<u64>(), entry.metadata()) else {
                continue;
            };
            files.push((seq, path, name.to_string(), meta.len()));
        }
        files.sort();
        let mut state = State::default();
        for (seq, path, name, len) in files {
            let (last_revision, oldest_ms) =
                parse_name(&name, len).map_or((0, 0), |e| (e.last, e.time_ms));
            state.total += len;
            state.next_seq = state.next_seq.max(seq + 1);
            state.queue.push_back(Slot::Disk {
                path,
                name,
                len,
                last_revision,
                oldest_ms,
            });
        }
        if !state.queue.is_empty() {
            tracing::info!(dir = %dir.display(), objects = state.queue.len(), "spooled deltas from a previous run will be uploaded first");
        }
        Ok(Spool {
            dir: dir.to_path_buf(),
            memory_limit,
            max_bytes,
            state: Mutex::new(state),
            pushed: Notify::new(),
            popped: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is pending.
    pub fn stats(&self) -> SpoolStats {
        let s = self.lock();
        SpoolStats {
            objects: s.queue.len(),
            bytes: s.total,
            on_disk: s
                .queue
                .iter()
                .filter(|q| matches!(q, Slot::Disk { .. }))
                .count(),
        }
    }

    /// When the oldest pending event arrived, if anything is pending.
    pub fn oldest_pending_ms(&self) -> Option<i64> {
        self.lock()
            .queue
            .iter()
            .map(|s| s.revision_and_age().1)
            .min()
    }

    /// Whether `len` more bytes fit now.
    pub fn has_room(&self, len: u64) -> bool {
        let s = self.lock();
        s.queue.is_empty() || s.total + len <= self.max_bytes
    }

    /// Waits until an object was taken out (uploaded); a wakeup sent while
    /// nobody waited is kept for the next call.
    pub async fn popped(&self) {
        self.popped.notified().await
    }

    /// Waits until an object was added (same wakeup rule).
    pub async fn pushed(&self) {
        self.pushed.notified().await
    }

    /// The newest revision pending of objects written at `epoch`, if any.
    pub fn last_revision(&self, epoch: u64) -> Option<i64> {
        self.lock()
            .queue
            .iter()
            .filter(|s| parse_name(s.name(), 0).is_some_and(|e| e.epoch == epoch))
            .map(|s| s.revision_and_age().0)
            .max()
    }

    /// Adds an object at the end; beyond the memory limit it goes to disk.
    /// The caller checks [`has_room`](Self::has_room) first (the bound).
    pub fn push(&self, p: Pending) -> Result<()> {
        let len = p.bytes.len() as u64;
        let mut s = self.lock();
        let seq = s.next_seq;
        s.next_seq += 1;
        let slot = if s.memory + len <= self.memory_limit {
            s.memory += len;
            Slot::Memory(p)
        } else {
            self.write(seq, &p)?
        };
        s.total += len;
        s.queue.push_back(slot);
        drop(s);
        self.pushed.notify_one();
        Ok(())
    }

    fn write(&self, seq: u64, p: &Pending) -> Result<Slot> {
        let path = self.dir.join(format!("{seq:020}--{}", p.name));
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&p.bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(io_at("spilling a delta to", &path))?;
        Ok(Slot::Disk {
            path,
            name: p.name.clone(),
            len: p.bytes.len() as u64,
            last_revision: p.last_revision,
            oldest_ms: p.oldest_ms,
        })
    }

    /// The first pending object (loaded from disk if it was spilled).
    pub fn front(&self) -> Result<Option<Pending>> {
        let s = self.lock();
        Ok(match s.queue.front() {
            None => None,
            Some(Slot::Memory(p)) => Some(p.clone()),
            Some(Slot::Disk {
                path,
                name,
                last_revision,
                oldest_ms,
                ..
            }) => Some(Pending {
                name: name.clone(),
                bytes: Bytes::from(std::fs::read(path).map_err(io_at("reading spooled", path))?),
                last_revision: *last_revision,
                oldest_ms: *oldest_ms,
            }),
        })
    }

    /// Drops the first object (it is in the bucket now).
    pub fn pop_front(&self) {
        let mut s = self.lock();
        if let Some(slot) = s.queue.pop_front() {
            s.total -= slot.len();
            match slot {
                Slot::Memory(p) => s.memory -= p.bytes.len() as u64,
                Slot::Disk { path, .. } => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        drop(s);
        self.popped.notify_one();
    }

    /// Writes everything held in memory to disk (at shutdown), keeping the order.
    pub fn spill_all(&self) -> Result<usize> {
        let mut s = self.lock();
        let mut spilled = 0;
        let queue = std::mem::take(&mut s.queue);
        let mut out = VecDeque::with_capacity(queue.len());
        let mut seq = s.next_seq;
        // Keep the order: renumber memory slots after existing files.
        for slot in queue {
            match slot {
                Slot::Memory(p) => {
                    out.push_back(self.write(seq, &p)?);
                    seq += 1;
                    spilled += 1;
                }
                disk => out.push_back(disk),
            }
        }
        // Renaming keeps disk order == queue order for the next run.
        let mut renumbered = VecDeque::with_capacity(out.len());
        for (i, slot) in out.into_iter().enumerate() {
            match slot {
                Slot::Disk {
                    path,
                    name,
                    len,
                    last_revision,
                    oldest_ms,
                } => {
                    let want = self.dir.join(format!("{:020}--{name}", seq + i as u64));
                    let path = match std::fs::rename(&path, &want) {
                        Ok(()) => want,
                        Err(_) => path,
                    };
                    renumbered.push_back(Slot::Disk {
                        path,
                        name,
                        len,
                        last_revision,
                        oldest_ms,
                    });
                }
                m => renumbered.push_back(m),
            }
        }
        s.next_seq = seq + renumbered.len() as u64;
        s.queue = renumbered;
        s.memory = 0;
        Ok(spilled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, n: usize) -> Pending {
        Pending {
            name: name.into(),
            bytes: Bytes::from(vec![7u8; n]),
            last_revision: 1,
            oldest_ms: 5,
        }
    }

    #[test]
    fn spills_beyond_memory_and_survives_a_restart_in_order() {
        let d = tempfile::tempdir().unwrap();
        let s = Spool::open(d.path(), 10, 100).unwrap();
        s.push(p("a", 8)).unwrap();
        s.push(p("b", 8)).unwrap(); // over the memory limit: disk
        s.push(p("c", 1)).unwrap();
        assert_eq!(
            s.stats(),
            SpoolStats {
                objects: 3,
                bytes: 17,
                on_disk: 1
            }
        );
        assert!(!s.has_room(90));
        assert!(s.has_room(80));
        assert_eq!(s.front().unwrap().unwrap().name, "a");
        s.spill_all().unwrap();
        drop(s);
        let s = Spool::open(d.path(), 10, 100).unwrap();
        let mut names = Vec::new();
        while let Some(x) = s.front().unwrap() {
            names.push(x.name);
            s.pop_front();
        }
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(s.stats(), SpoolStats::default());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
