//! Restore to a fresh data dir: the newest full snapshot at or before the
//! target, `etcdutl snapshot restore`, a temporary etcd on loopback that the
//! deltas are replayed into (one transaction per recorded revision, so the
//! revisions are etcd's own; etcd does not fsync, the data dir is synced once
//! at the end), verification, and the data dir moved in place.
//!
//! The work is an explicit state machine: [`RestoreState::action`] says what
//! to do next and the pure [`step`] applies what happened. The state is saved
//! in the work dir after every step, so a rerun resumes (a replay resumes at
//! the temporary etcd's revision).
//!
//! By concern: `state.rs` (the state machine), `plan.rs` (choosing the
//! objects), `download.rs` (fetching and checking them), `replay.rs` (the
//! temporary etcd and the replay) and `verify.rs` (the checks after it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::bucket::Bucket;
use crate::catalog::Plan;
use crate::codec::{EncryptionKey, HashKv};
use crate::error::io_at;
use crate::etcd::{self, Member};
use crate::{BackupError, Result};

mod download;
mod plan;
mod prefetch;
mod replay;
mod state;
mod verify;
mod wal;

pub use crate::checksum::DbHash;
pub(crate) use download::read_full;
pub use download::{check_name, download_full, fetch_delta};
pub use state::{step, Action, Outcome, RestoreState};

use prefetch::Prefetch;
use state::{load_state, save_state};

/// What to restore to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RestoreTarget {
    /// The newest revision in the bucket.
    Latest,
    /// Exactly this etcd revision.
    Revision(i64),
    /// Everything Ring had received at this time (ms since the epoch).
    Time(i64),
}

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    pub bucket: Bucket,
    pub key: Option<EncryptionKey>,
    /// Must not exist or be empty.
    pub data_dir: PathBuf,
    pub target: RestoreTarget,
    /// Skip missing revisions instead of failing (the result is not exact).
    pub allow_gap: bool,
    /// How the restored member is named (must match how its etcd is started).
    pub member: Member,
    pub etcd: PathBuf,
    /// `etcdutl`, which restores the full snapshot into a data dir.
    pub etcdutl: PathBuf,
    /// Scratch space [default: `<data_dir>.restore` next to the data dir].
    pub work_dir: Option<PathBuf>,
    /// Also count the objects per resource type and take `HashKV` at the
    /// revision reached, in the temporary etcd that verified the restore (the
    /// report's `objects` and `hashKvAtReached`): no second etcd needs to
    /// start on the data for them.
    pub count_objects: bool,
}

impl RestoreOptions {
    fn work_dir(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            let mut name = self
                .data_dir
                .file_name()
                .map(|n| n.to_os_string())
                .unwrap_or_else(|| "etcd".into());
            name.push(".restore");
            self.data_dir.with_file_name(name)
        })
    }

    /// What identifies this restore, so a rerun with other options starts over.
    fn fingerprint(&self) -> String {
        format!(
            "{}|{}|{:?}|{}",
            self.bucket.describe(),
            self.data_dir.display(),
            self.target,
            self.allow_gap
        )
    }
}

/// What the full snapshot's object recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FullInfo {
    pub base_revision: i64,
    pub revision_after: i64,
    pub keys: i64,
    pub hash_kv: Option<HashKv>,
    pub db_bytes: u64,
}

/// What a restore did and checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreReport {
    pub data_dir: PathBuf,
    pub target_revision: i64,
    /// The revision the restored etcd reached.
    pub reached_revision: i64,
    /// The full snapshot restored, and the revision etcd had after restoring it.
    pub full: String,
    pub full_revision: i64,
    pub deltas: usize,
    pub revisions_replayed: u64,
    pub events_replayed: u64,
    /// Of the revisions replayed, those etcd applied from its own log.
    #[serde(default)]
    pub revisions_from_log: u64,
    pub replay_seconds: f64,
    /// The source's key count at its last recorded revision, which the
    /// restored etcd matched there.
    pub expected_keys: i64,
    /// Keys at `reached_revision` (more or fewer than `expected_keys` when
    /// the full snapshot held revisions past the last recorded one).
    pub keys: i64,
    /// What the `HashKV` check found.
    pub hash_kv: String,
    /// Revisions skipped with `--allow-gap`.
    pub gaps: Vec<(i64, i64)>,
    /// Revision, key count and (where recorded) `HashKV` all match the source.
    pub verified: bool,
    pub total_seconds: f64,
    /// Full snapshots this restore found corrupt and went past, each with what
    /// was wrong (the restore used an older one and replayed more deltas).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corrupt: Vec<CorruptObject>,
    /// Objects per resource type at `reached_revision`, when asked for
    /// ([`RestoreOptions::count_objects`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<BTreeMap<String, u64>>,
    /// `HashKV` at `reached_revision`, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_kv_at_reached: Option<u32>,
}

/// An object of the bucket a restore found damaged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorruptObject {
    pub object: String,
    pub problem: String,
}

/// Restores; `progress` hears about every step. Cancelling stops between
/// transactions (a rerun resumes). Runs inside a `restore` span naming the
/// shoot (the bucket prefix's) and the target.
pub async fn restore(
    opts: &RestoreOptions,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<RestoreReport> {
    let span = tracing::info_span!("restore", shoot = %opts.bucket.shoot(), target = ?opts.target);
    run(opts, progress, cancel).instrument(span).await
}

/// The state machine's loop: load the saved state, do what it says, save the
/// next one, until done.
async fn run(
    opts: &RestoreOptions,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<RestoreReport> {
    let started = Instant::now();
    let work = opts.work_dir();
    let fingerprint = opts.fingerprint();
    std::fs::create_dir_all(&work).map_err(io_at("creating", &work))?;
    let _only_restore = lock_work_dir(&work, &opts.data_dir)?;
    let state_file = work.join("state.json");
    // with the damage found in full snapshots so far, for the report (and
    // the error if none is usable)
    let (state, mut damaged) = load_state(&state_file, &fingerprint);
    let mut state = plan::still_in_bucket(opts, state, progress).await?;
    if opts.data_dir.exists()
        && !is_empty_dir(&opts.data_dir)
        && !matches!(state, RestoreState::Done { .. })
    {
        return Err(BackupError::Restore(format!(
            "{} exists and is not empty: restore into a fresh data dir (move the old one aside)",
            opts.data_dir.display()
        )));
    }
    // the deltas, fetched while the full snapshot downloads and restores
    let mut prefetch: Option<Prefetch> = None;
    loop {
        if cancel.is_cancelled() {
            return Err(BackupError::Cancelled);
        }
        if let Some(plan) = state.plan() {
            if !prefetch.as_ref().is_some_and(|p| p.is_for(plan)) {
                prefetch = Prefetch::start(opts, plan);
            }
        }
        let outcome = match &state {
            RestoreState::Start { excluded } => {
                plan_step(opts, excluded, &mut damaged, progress).await?
            }
            RestoreState::Planned { plan, .. } => {
                download_step(opts, plan, &work, &mut damaged, progress).await?
            }
            RestoreState::Downloaded { .. } => restore_snapshot_step(opts, &work, progress).await?,
            RestoreState::SnapshotRestored { plan, full, .. } => {
                let ahead = prefetch.take().filter(|p| p.is_for(plan));
                replay::replay(opts, &work, plan, full, ahead, progress, cancel).await?
            }
            RestoreState::Replayed { .. } => finalize_step(opts, &work)?,
            RestoreState::Done { report } => {
                let mut report = report.clone();
                report.total_seconds = started.elapsed().as_secs_f64();
                report.corrupt = damaged
                    .into_iter()
                    .map(|(object, problem)| CorruptObject { object, problem })
                    .collect();
                let _ = std::fs::remove_dir_all(&work);
                return Ok(report);
            }
        };
        state = step(state, outcome)?;
        save_state(&state_file, &fingerprint, &state, &damaged)?;
    }
}

/// Holds the work dir for one restore at a time (two restores into one data
/// dir, say a failover's early restore and a retry of it, would write the
/// same state file and temporary data); the lock ends with the returned file.
fn lock_work_dir(work: &Path, data_dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = work.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_at("opening", &path))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(
        |(_, errno)| match errno {
            nix::errno::Errno::EWOULDBLOCK => BackupError::RestoreBusy {
                data_dir: data_dir.display().to_string(),
                lock: path.display().to_string(),
            },
            other => io_at("locking", &path)(std::io::Error::from(other)),
        },
    )
}

/// Chooses the objects; when every usable full snapshot turned out damaged,
/// says what is wrong with them.
async fn plan_step(
    opts: &RestoreOptions,
    excluded: &[String],
    damaged: &mut Vec<(String, String)>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Outcome> {
    let plan = match plan::plan(opts, excluded).await {
        Ok(plan) => plan,
        Err(e) if !damaged.is_empty() => {
            let (object, problem) = damaged.remove(0);
            return Err(BackupError::Corrupt {
                object,
                problem: format!("{problem}; no other full snapshot to fall back on ({e})"),
            });
        }
        Err(e) => return Err(e),
    };
    progress(&format!(
        "plan: full snapshot {} (revision {}), {} deltas, target revision {}{}",
        plan.full.name,
        plan.full.first,
        plan.deltas.len(),
        plan.target_revision,
        if plan.gaps.is_empty() {
            String::new()
        } else {
            format!(", skipping missing revisions {:?} (--allow-gap)", plan.gaps)
        }
    ));
    Ok(Outcome::Planned(plan))
}

/// Downloads and checks the planned full snapshot; a damaged one is planned
/// around (an older full snapshot and its deltas reach the same revision).
async fn download_step(
    opts: &RestoreOptions,
    plan: &Plan,
    work: &Path,
    damaged: &mut Vec<(String, String)>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Outcome> {
    let t = Instant::now();
    match download::download_full(
        &opts.bucket,
        opts.key.as_ref(),
        &plan.full.name,
        &work.join("snapshot.db"),
    )
    .await
    {
        Ok(full) => {
            progress(&format!(
                "downloaded and checked {} ({} MiB) in {:.1}s",
                plan.full.name,
                full.db_bytes >> 20,
                t.elapsed().as_secs_f64()
            ));
            Ok(Outcome::Downloaded(full))
        }
        Err(
            BackupError::Corrupt { object, problem } | BackupError::Untrusted { object, problem },
        ) => {
            let msg = format!("{object} is corrupt ({problem}): planning again without it");
            tracing::warn!("{msg}");
            progress(&msg);
            damaged.push((object.clone(), problem.clone()));
            Ok(Outcome::FullCorrupt { object, problem })
        }
        Err(e) => Err(e),
    }
}

/// `etcdutl snapshot restore` of the downloaded snapshot into `work/data`.
async fn restore_snapshot_step(
    opts: &RestoreOptions,
    work: &Path,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Outcome> {
    let data = work.join("data");
    if data.exists() {
        std::fs::remove_dir_all(&data).map_err(io_at("removing", &data))?;
    }
    let t = Instant::now();
    etcd::restore_snapshot(
        &opts.etcdutl,
        &work.join("snapshot.db"),
        &data,
        &opts.member,
    )
    .await?;
    progress(&format!(
        "etcdutl snapshot restore done in {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    Ok(Outcome::SnapshotRestored)
}

/// Moves the replayed and verified data dir in place (owner-only).
fn finalize_step(opts: &RestoreOptions, work: &Path) -> Result<Outcome> {
    let data = work.join("data");
    if opts.data_dir.exists() {
        std::fs::remove_dir(&opts.data_dir)
            .map_err(io_at("replacing the empty", &opts.data_dir))?;
    }
    if let Some(parent) = opts.data_dir.parent() {
        std::fs::create_dir_all(parent).map_err(io_at("creating", parent))?;
    }
    move_dir(&data, &opts.data_dir)
        .map_err(io_at("moving the restored data to", &opts.data_dir))?;
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&opts.data_dir, std::fs::Permissions::from_mode(0o700));
    Ok(Outcome::Finalized)
}

/// Renames `from` to `to`, copying (and syncing) across file systems.
fn move_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
            copy_dir(from, to)?;
            std::fs::remove_dir_all(from)
        }
        other => other,
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        }
    }
    std::fs::File::open(to)?.sync_all()
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_restore_at_a_time_holds_the_work_dir() {
        let dir = tempfile::tempdir().unwrap();
        let (work, data) = (dir.path().join("restore-work"), dir.path().join("etcd"));
        std::fs::create_dir_all(&work).unwrap();
        let first = lock_work_dir(&work, &data).expect("the first restore locks");
        let err = lock_work_dir(&work, &data).expect_err("a second one is refused");
        assert!(err.is_retryable(), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&data.display().to_string()), "{msg}");
        assert!(msg.contains("another restore"), "{msg}");
        drop(first);
        lock_work_dir(&work, &data).expect("free again once the first ended");
    }
}
