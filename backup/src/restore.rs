//! Restore to a fresh data dir: the newest full snapshot at or before the
//! target, `etcdctl snapshot restore`, a temporary etcd on loopback that the
//! deltas are replayed into (one transaction per recorded revision, so the
//! revisions are etcd's own), verification, and the data dir moved in place.
//!
//! The work is an explicit state machine: [`RestoreState::action`] says what
//! to do next and the pure [`step`] applies what happened. The state is saved
//! in the work dir after every step, so a rerun resumes (a replay resumes at
//! the temporary etcd's revision).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, CompactionOptions, LeaseGrantOptions, PutOptions, Txn, TxnOp};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::bucket::Bucket;
use crate::catalog::{Catalog, Plan, Target};
use crate::codec::{self, EncryptionKey, HashKv, ObjectReader};
use crate::delta::{self, RevisionRecord};
use crate::error::io_at;
use crate::etcd::{self, Member, TempEtcd};
use crate::{BackupError, Result};

/// TTL of a lease a delta uses but whose TTL was not recorded.
const DEFAULT_LEASE_TTL: i64 = 60;

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
    pub etcdctl: PathBuf,
    /// Scratch space [default: `<data_dir>.restore` next to the data dir].
    pub work_dir: Option<PathBuf>,
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
    pub replay_seconds: f64,
    pub expected_keys: i64,
    pub keys: i64,
    /// What the `HashKV` check found.
    pub hash_kv: String,
    /// Revisions skipped with `--allow-gap`.
    pub gaps: Vec<(i64, i64)>,
    /// Revision, key count and (where recorded) `HashKV` all match the source.
    pub verified: bool,
    pub total_seconds: f64,
}

/// Where a restore is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum RestoreState {
    /// Nothing chosen yet; `excluded` full snapshots turned out too new.
    Start { excluded: Vec<String> },
    /// Objects chosen.
    Planned { plan: Plan, excluded: Vec<String> },
    /// The full snapshot is downloaded, checked and decrypted.
    Downloaded {
        plan: Plan,
        excluded: Vec<String>,
        full: FullInfo,
    },
    /// `etcdctl snapshot restore` made the data dir in the work dir.
    SnapshotRestored {
        plan: Plan,
        excluded: Vec<String>,
        full: FullInfo,
    },
    /// Deltas replayed and verified; the data dir waits to be moved in place.
    Replayed { report: RestoreReport },
    /// Finished.
    Done { report: RestoreReport },
}

/// The next thing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Plan,
    Download,
    RestoreSnapshot,
    Replay,
    Finalize,
    Done,
}

/// What an action achieved.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Planned(Plan),
    Downloaded(FullInfo),
    SnapshotRestored,
    Replayed(RestoreReport),
    /// The restored snapshot already holds revisions past the target (it was
    /// taken while etcd was written): plan again without it.
    FullTooNew {
        restored_revision: i64,
    },
    /// The planned full snapshot failed its checks: plan again without it.
    FullCorrupt {
        object: String,
        problem: String,
    },
    Finalized,
}

impl RestoreState {
    /// What to do next.
    pub fn action(&self) -> Action {
        match self {
            RestoreState::Start { .. } => Action::Plan,
            RestoreState::Planned { .. } => Action::Download,
            RestoreState::Downloaded { .. } => Action::RestoreSnapshot,
            RestoreState::SnapshotRestored { .. } => Action::Replay,
            RestoreState::Replayed { .. } => Action::Finalize,
            RestoreState::Done { .. } => Action::Done,
        }
    }
}

/// The state after `outcome` (pure). An outcome that does not fit the state is
/// an error, never a silent skip.
pub fn step(state: RestoreState, outcome: Outcome) -> Result<RestoreState> {
    use Outcome as O;
    use RestoreState as S;
    Ok(match (state, outcome) {
        (S::Start { excluded }, O::Planned(plan)) => S::Planned { plan, excluded },
        (S::Planned { plan, excluded }, O::Downloaded(full)) => S::Downloaded {
            plan,
            excluded,
            full,
        },
        (
            S::Downloaded {
                plan,
                excluded,
                full,
            },
            O::SnapshotRestored,
        ) => S::SnapshotRestored {
            plan,
            excluded,
            full,
        },
        (S::SnapshotRestored { .. }, O::Replayed(report)) => S::Replayed { report },
        (
            S::SnapshotRestored {
                plan, mut excluded, ..
            },
            O::FullTooNew { .. },
        ) => {
            excluded.push(plan.full.name);
            S::Start { excluded }
        }
        (S::Planned { plan, mut excluded }, O::FullCorrupt { .. }) => {
            excluded.push(plan.full.name);
            S::Start { excluded }
        }
        (S::Replayed { report }, O::Finalized) => S::Done { report },
        (state, outcome) => {
            return Err(BackupError::Restore(format!(
                "internal: outcome {outcome:?} does not fit state {:?}",
                state.action()
            )))
        }
    })
}

#[derive(Serialize, Deserialize)]
struct Saved {
    fingerprint: String,
    state: RestoreState,
}

fn load_state(path: &Path, fingerprint: &str) -> RestoreState {
    let fresh = RestoreState::Start { excluded: vec![] };
    let Ok(bytes) = std::fs::read(path) else {
        return fresh;
    };
    match serde_json::from_slice::<Saved>(&bytes) {
        Ok(s) if s.fingerprint == fingerprint => {
            tracing::info!(state = ?s.state.action(), "resuming a restore");
            s.state
        }
        _ => fresh,
    }
}

fn save_state(path: &Path, fingerprint: &str, state: &RestoreState) -> Result<()> {
    let json = serde_json::to_vec_pretty(&Saved {
        fingerprint: fingerprint.to_string(),
        state: state.clone(),
    })
    .map_err(|e| BackupError::Restore(format!("cannot encode the state: {e}")))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json).map_err(io_at("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_at("renaming", &tmp))
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

/// Restores; `progress` hears about every step. Cancelling stops between
/// transactions (a rerun resumes).
pub async fn restore(
    opts: &RestoreOptions,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<RestoreReport> {
    let started = Instant::now();
    let work = opts.work_dir();
    let fingerprint = opts.fingerprint();
    std::fs::create_dir_all(&work).map_err(io_at("creating", &work))?;
    let state_file = work.join("state.json");
    let mut state = load_state(&state_file, &fingerprint);
    // the damage found in full snapshots this run, for the error if none is usable
    let mut damaged: Vec<(String, String)> = Vec::new();
    if opts.data_dir.exists()
        && !is_empty_dir(&opts.data_dir)
        && !matches!(state, RestoreState::Done { .. })
    {
        return Err(BackupError::Restore(format!(
            "{} exists and is not empty: restore into a fresh data dir (move the old one aside)",
            opts.data_dir.display()
        )));
    }
    loop {
        if cancel.is_cancelled() {
            return Err(BackupError::Cancelled);
        }
        let outcome = match (&state, state.action()) {
            (RestoreState::Start { excluded }, _) => {
                let plan = match plan(opts, excluded).await {
                    Ok(plan) => plan,
                    // every usable full snapshot is damaged: say what is wrong with them
                    Err(e) if !damaged.is_empty() => {
                        let (object, problem) = damaged.remove(0);
                        return Err(BackupError::Corrupt {
                            object,
                            problem: format!(
                                "{problem}; no other full snapshot to fall back on ({e})"
                            ),
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
                Outcome::Planned(plan)
            }
            (RestoreState::Planned { plan, .. }, _) => {
                let t = Instant::now();
                match download_full(opts, &plan.full.name, &work.join("snapshot.db")).await {
                    Ok(full) => {
                        progress(&format!(
                            "downloaded and checked {} ({} MiB) in {:.1}s",
                            plan.full.name,
                            full.db_bytes >> 20,
                            t.elapsed().as_secs_f64()
                        ));
                        Outcome::Downloaded(full)
                    }
                    // A damaged full snapshot: plan again without it (an older
                    // full snapshot and its deltas reach the same revision).
                    Err(BackupError::Corrupt { object, problem }) => {
                        let msg =
                            format!("{object} is corrupt ({problem}): planning again without it");
                        tracing::warn!("{msg}");
                        progress(&msg);
                        damaged.push((object.clone(), problem.clone()));
                        Outcome::FullCorrupt { object, problem }
                    }
                    Err(e) => return Err(e),
                }
            }
            (RestoreState::Downloaded { .. }, _) => {
                let data = work.join("data");
                if data.exists() {
                    std::fs::remove_dir_all(&data).map_err(io_at("removing", &data))?;
                }
                etcd::restore_snapshot(
                    &opts.etcdctl,
                    &work.join("snapshot.db"),
                    &data,
                    &opts.member,
                )
                .await?;
                progress("etcdctl snapshot restore done");
                Outcome::SnapshotRestored
            }
            (RestoreState::SnapshotRestored { plan, full, .. }, _) => {
                replay(opts, &work, plan, full, progress, cancel).await?
            }
            (RestoreState::Replayed { .. }, _) => {
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
                let _ = std::fs::set_permissions(
                    &opts.data_dir,
                    std::fs::Permissions::from_mode(0o700),
                );
                Outcome::Finalized
            }
            (RestoreState::Done { report }, _) => {
                let mut report = report.clone();
                report.total_seconds = started.elapsed().as_secs_f64();
                let _ = std::fs::remove_dir_all(&work);
                return Ok(report);
            }
        };
        state = step(state, outcome)?;
        save_state(&state_file, &fingerprint, &state)?;
    }
}

/// Chooses the objects (resolving a time target to a revision first).
async fn plan(opts: &RestoreOptions, excluded: &[String]) -> Result<Plan> {
    let catalog = opts.bucket.catalog().await?;
    if catalog.is_empty() {
        return Err(BackupError::Catalog(format!(
            "{} holds no backup (is the bucket URL and shoot right?)",
            opts.bucket.describe()
        )));
    }
    let target = match opts.target {
        RestoreTarget::Latest => Target::Latest,
        RestoreTarget::Revision(r) => Target::Revision(r),
        RestoreTarget::Time(t) => Target::Revision(revision_at(opts, &catalog, t).await?),
    };
    let plan = catalog.plan(target, opts.allow_gap, excluded)?;
    if opts.key.is_none() {
        if let Some(e) = std::iter::once(&plan.full)
            .chain(&plan.deltas)
            .find(|e| e.encrypted)
        {
            return Err(BackupError::KeyRequired {
                object: e.name.clone(),
                key_id: "recorded in the object".into(),
            });
        }
    }
    Ok(plan)
}

/// The newest revision Ring had received at `time_ms`.
async fn revision_at(opts: &RestoreOptions, catalog: &Catalog, time_ms: i64) -> Result<i64> {
    if catalog.oldest_time().is_some_and(|o| time_ms < o) {
        return Err(BackupError::Catalog(format!(
            "{} is older than the oldest backup ({})",
            crate::catalog::rfc3339(time_ms),
            crate::catalog::rfc3339(catalog.oldest_time().unwrap_or(0))
        )));
    }
    let Some(d) = catalog.first_delta_after(time_ms) else {
        return catalog
            .latest_revision()
            .ok_or_else(|| BackupError::Catalog("the bucket holds no backup".into()));
    };
    let records = fetch_delta(&opts.bucket, &d.name, opts.key.as_ref())
        .await?
        .1;
    Ok(records
        .iter()
        .take_while(|r| r.time_ms <= time_ms)
        .last()
        .map_or(d.first - 1, |r| r.revision))
}

/// Downloads, checks and decodes a delta.
pub async fn fetch_delta(
    bucket: &Bucket,
    name: &str,
    key: Option<&EncryptionKey>,
) -> Result<(codec::DeltaMeta, Vec<RevisionRecord>)> {
    let bytes = bucket.get_all(name).await?;
    let (decoded, body) = codec::decode(name, &bytes, key)?;
    let meta = decoded
        .header
        .delta
        .ok_or_else(|| BackupError::corrupt(name, "the header describes no delta"))?;
    check_name(name, meta.first_revision, meta.last_revision)?;
    let records = delta::decode_records(name, &body, &meta)?;
    Ok((meta, records))
}

/// The name and the header must agree on the revisions.
pub fn check_name(name: &str, first: i64, last: i64) -> Result<()> {
    match crate::catalog::parse_name(name, 0) {
        Some(e) if e.first == first && e.last == last => Ok(()),
        _ => Err(BackupError::corrupt(
            name,
            format!("its name does not match its header (revisions {first}..{last})"),
        )),
    }
}

/// Checks etcd's own SHA-256 at the end of a snapshot database.
#[derive(Default)]
pub struct DbHash {
    hasher: Sha256,
    tail: Vec<u8>,
    bytes: u64,
}

impl DbHash {
    /// Adds plain bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        self.tail.extend_from_slice(data);
        if self.tail.len() > 32 {
            let cut = self.tail.len() - 32;
            self.hasher.update(&self.tail[..cut]);
            self.tail.drain(..cut);
        }
    }

    /// Whether the last 32 bytes are the SHA-256 of the rest (etcd appends it).
    pub fn check(self, object: &str) -> Result<u64> {
        let digest = self.hasher.finalize();
        if self.tail.len() != 32 || digest[..] != self.tail[..] {
            return Err(BackupError::corrupt(
                object,
                "etcd's own checksum at the end of the snapshot does not match its data",
            ));
        }
        Ok(self.bytes)
    }
}

/// Downloads the full snapshot into `path`, checking it on the way.
async fn download_full(opts: &RestoreOptions, name: &str, path: &Path) -> Result<FullInfo> {
    let part = path.with_extension("part");
    let file = std::fs::File::create(&part).map_err(io_at("creating", &part))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut reader = ObjectReader::new(name, opts.key.as_ref());
    let mut db = DbHash::default();
    let mut stream = opts.bucket.get(name).await?;
    while let Some(bytes) = stream.next().await {
        let bytes = bytes?;
        reader.feed(&bytes, &mut |plain| {
            db.update(plain);
            out.write_all(plain).map_err(io_at("writing", &part))
        })?;
    }
    let decoded = reader.finish()?;
    let db_bytes = db.check(name)?;
    let file = out.into_inner().map_err(|e| BackupError::Io {
        what: format!("writing {}", part.display()),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_at("syncing", &part))?;
    std::fs::rename(&part, path).map_err(io_at("renaming", &part))?;
    let meta = decoded
        .header
        .full
        .ok_or_else(|| BackupError::corrupt(name, "the header describes no full snapshot"))?;
    check_name(name, meta.base_revision, meta.base_revision)?;
    let trailer = decoded
        .trailer
        .full
        .ok_or_else(|| BackupError::corrupt(name, "the trailer records no revisions"))?;
    Ok(FullInfo {
        base_revision: meta.base_revision,
        revision_after: trailer.revision_after,
        keys: trailer.keys,
        hash_kv: trailer.hash_kv,
        db_bytes,
    })
}

/// Keeps every lease of the temporary etcd alive while the replay runs (an
/// expiring lease would delete keys and shift the revisions).
fn keep_leases_alive(client: Client, leases: Arc<Mutex<BTreeSet<i64>>>, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let ids: Vec<i64> = leases
                .lock()
                .map(|l| l.iter().copied().collect())
                .unwrap_or_default();
            for id in ids {
                let mut c = client.clone();
                let keep = async move {
                    let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), keep).await;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
}

async fn replay(
    opts: &RestoreOptions,
    work: &Path,
    plan: &Plan,
    full: &FullInfo,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<Outcome> {
    let mut temp = TempEtcd::start(
        &opts.etcd,
        &work.join("data"),
        &opts.member.name,
        &work.join("etcd.log"),
    )
    .await?;
    let result = replay_into(&temp, opts, plan, full, progress, cancel).await;
    temp.stop().await;
    result
}

async fn replay_into(
    temp: &TempEtcd,
    opts: &RestoreOptions,
    plan: &Plan,
    full: &FullInfo,
    progress: &(dyn Fn(&str) + Sync),
    cancel: &CancellationToken,
) -> Result<Outcome> {
    let ep = temp.url.clone();
    let mut client = temp.client().await?;
    let restored_revision = etcd::status(&mut client, &ep).await?.revision;
    // A full snapshot taken while etcd was written may hold a few revisions past
    // its base; when nothing newer exists, "latest" is what it holds.
    let target = if opts.target == RestoreTarget::Latest
        && plan.deltas.iter().all(|d| d.last <= restored_revision)
    {
        plan.target_revision.max(restored_revision)
    } else {
        plan.target_revision
    };
    if restored_revision > target {
        progress(&format!(
            "{} holds revision {restored_revision}, past the target {target}: trying an older full snapshot",
            plan.full.name
        ));
        return Ok(Outcome::FullTooNew { restored_revision });
    }
    let full_revision = if restored_revision >= full.base_revision {
        restored_revision
    } else {
        return Err(BackupError::Restore(format!(
            "{} restored to revision {restored_revision}, before its base revision {}: the snapshot does not hold what its name says",
            plan.full.name, full.base_revision
        )));
    };
    let existing: BTreeSet<i64> = etcd::call(&ep, "listing leases", client.leases())
        .await?
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    let leases = Arc::new(Mutex::new(existing));
    let stop_keeper = CancellationToken::new();
    keep_leases_alive(client.clone(), leases.clone(), stop_keeper.clone());
    let _stop_keeper = stop_keeper.clone().drop_guard();

    // Download and decode the next deltas while the current one is applied.
    let (tx, mut rx) = tokio::sync::mpsc::channel(2);
    let fetcher = {
        let bucket = opts.bucket.clone();
        let key = opts.key.clone();
        let names: Vec<String> = plan.deltas.iter().map(|d| d.name.clone()).collect();
        tokio::spawn(async move {
            for name in names {
                let r = fetch_delta(&bucket, &name, key.as_ref())
                    .await
                    .map(|x| (name, x));
                let failed = r.is_err();
                if tx.send(r).await.is_err() || failed {
                    return;
                }
            }
        })
    };
    let _abort = AbortOnDrop(fetcher);

    let t = Instant::now();
    let mut current = restored_revision;
    let mut expected_keys = full.keys;
    let mut aligned = plan.gaps.is_empty();
    let mut gaps = Vec::new();
    let (mut revisions, mut events) = (0u64, 0u64);
    let mut recorded_hashes: Vec<HashKv> = full.hash_kv.into_iter().collect();
    let mut last_seen = full.base_revision;
    let mut last_report = Instant::now();
    while let Some(item) = rx.recv().await {
        let (name, (meta, records)) = item?;
        let ttls: BTreeMap<i64, i64> = meta.leases.iter().copied().collect();
        if let Some(h) = meta.hash_kv {
            if h.revision <= target {
                recorded_hashes.push(h);
            }
        }
        for r in records {
            if r.revision <= last_seen {
                continue; // an overlapping delta
            }
            if r.revision > target {
                break;
            }
            if r.revision != last_seen + 1 {
                gaps.push((last_seen + 1, r.revision - 1));
                if !opts.allow_gap {
                    return Err(BackupError::Gap {
                        from: last_seen + 1,
                        to: r.revision - 1,
                        detail: format!("{name} does not continue the previous object"),
                    });
                }
                aligned = false;
            }
            last_seen = r.revision;
            expected_keys += r.key_delta();
            if r.revision <= restored_revision || (aligned && r.revision <= current) {
                continue; // already in the snapshot (or applied before a crash)
            }
            if cancel.is_cancelled() {
                return Err(BackupError::Cancelled);
            }
            let got = apply(&mut client, &ep, &r, &ttls, &leases).await?;
            if aligned && got != r.revision {
                return Err(BackupError::Restore(format!(
                    "replay diverged at revision {}: etcd answered revision {got}; the full snapshot and the deltas do not fit together",
                    r.revision
                )));
            }
            current = got;
            revisions += 1;
            events += r.events.len() as u64;
            if last_report.elapsed() >= Duration::from_secs(5) {
                progress(&format!(
                    "replayed up to revision {} ({events} events)",
                    r.revision
                ));
                last_report = Instant::now();
            }
        }
    }
    let replay_seconds = t.elapsed().as_secs_f64();
    if !gaps.is_empty() && opts.allow_gap {
        progress(&format!(
            "skipped missing revisions {gaps:?} (--allow-gap): the result is not exact"
        ));
    }
    let mut all_gaps = plan.gaps.clone();
    all_gaps.extend(gaps.iter().copied().filter(|g| !plan.gaps.contains(g)));
    progress(&format!(
        "replayed {revisions} revisions ({events} events) in {replay_seconds:.1}s"
    ));

    // Verify.
    let reached = etcd::status(&mut client, &ep).await?.revision;
    // The key count is known at the last recorded revision (the snapshot may
    // hold a few more revisions, whose history the restored etcd keeps).
    let keys = etcd::key_count(&mut client, &ep, last_seen.min(reached)).await?;
    let mut problems = Vec::new();
    if aligned {
        if reached != target {
            problems.push(format!(
                "etcd reached revision {reached}, the target is {target}"
            ));
        }
        if keys != expected_keys {
            problems.push(format!(
                "etcd holds {keys} keys, the source had {expected_keys}"
            ));
        }
    }
    let hash_kv = if !aligned {
        "not compared: revisions were skipped".to_string()
    } else {
        match recorded_hashes
            .iter()
            .filter(|h| h.revision <= reached)
            .max_by_key(|h| h.revision)
        {
            None => "not recorded for these objects".to_string(),
            Some(h) => compare_hash(&mut client, &ep, h, &mut problems).await?,
        }
    };
    if !problems.is_empty() {
        return Err(BackupError::Verify(problems.join("; ")));
    }
    progress(&format!(
        "verified: revision {reached}, {keys} keys, HashKV {hash_kv}"
    ));
    Ok(Outcome::Replayed(RestoreReport {
        data_dir: opts.data_dir.clone(),
        target_revision: target,
        reached_revision: reached,
        full: plan.full.name.clone(),
        full_revision,
        deltas: plan.deltas.len(),
        revisions_replayed: revisions,
        events_replayed: events,
        replay_seconds,
        expected_keys,
        keys,
        hash_kv,
        gaps: all_gaps,
        verified: aligned,
        total_seconds: 0.0,
    }))
}

/// Compares `HashKV` at a recorded revision; compacts the restored etcd to the
/// source's compaction revision first when the source had compacted further.
async fn compare_hash(
    client: &mut Client,
    ep: &str,
    h: &HashKv,
    problems: &mut Vec<String>,
) -> Result<String> {
    let mut mine = etcd::hash_kv(client, ep, h.revision).await?;
    if mine.compact_revision < h.compact_revision && h.compact_revision <= h.revision {
        etcd::call(
            ep,
            "compacting",
            client.compact(
                h.compact_revision,
                Some(CompactionOptions::new().with_physical()),
            ),
        )
        .await?;
        mine = etcd::hash_kv(client, ep, h.revision).await?;
    }
    if mine.compact_revision != h.compact_revision {
        return Ok(format!(
            "not compared at revision {}: the restored etcd is compacted to {}, the source was at {}",
            h.revision, mine.compact_revision, h.compact_revision
        ));
    }
    if mine.hash != h.hash {
        problems.push(format!(
            "HashKV at revision {} is {:#010x}, the source had {:#010x}",
            h.revision, mine.hash, h.hash
        ));
    }
    Ok(format!(
        "equal at revision {} ({:#010x})",
        h.revision, h.hash
    ))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Applies one recorded revision as one transaction (granting the leases it
/// uses first); returns etcd's revision after it. Transactions go one at a
/// time: etcd may apply concurrent requests in any order, and the revisions
/// must be the recorded ones.
async fn apply(
    client: &mut Client,
    ep: &str,
    r: &RevisionRecord,
    ttls: &BTreeMap<i64, i64>,
    leases: &Mutex<BTreeSet<i64>>,
) -> Result<i64> {
    let mut ops = Vec::with_capacity(r.events.len());
    for e in &r.events {
        if e.delete {
            ops.push(TxnOp::delete(e.key.clone(), None));
            continue;
        }
        let mut opts = None;
        if e.lease != 0 {
            let known = leases.lock().map(|l| l.contains(&e.lease)).unwrap_or(false);
            if !known {
                let ttl = ttls
                    .get(&e.lease)
                    .copied()
                    .filter(|t| *t > 0)
                    .unwrap_or(DEFAULT_LEASE_TTL);
                match client
                    .lease_grant(ttl, Some(LeaseGrantOptions::new().with_id(e.lease)))
                    .await
                {
                    Ok(_) => {}
                    Err(err) if etcd::is_lease_taken(&err) => {}
                    Err(err) => {
                        return Err(etcd::err(ep, &format!("granting lease {:x}", e.lease), err))
                    }
                }
                if let Ok(mut l) = leases.lock() {
                    l.insert(e.lease);
                }
            }
            opts = Some(PutOptions::new().with_lease(e.lease));
        }
        ops.push(TxnOp::put(e.key.clone(), e.value.clone(), opts));
    }
    let resp = etcd::call(
        ep,
        &format!("replaying revision {}", r.revision),
        client.txn(Txn::new().and_then(ops)),
    )
    .await?;
    Ok(resp.header().map_or(0, |h| h.revision()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{object_name, Entry, Kind};

    fn plan(full: i64) -> Plan {
        let name = object_name(Kind::Full, full, full, 0, true, false);
        Plan {
            target_revision: 50,
            full: crate::catalog::parse_name(&name, 1).unwrap(),
            deltas: Vec::<Entry>::new(),
            gaps: vec![],
        }
    }

    fn info() -> FullInfo {
        FullInfo {
            base_revision: 40,
            revision_after: 45,
            keys: 3,
            hash_kv: None,
            db_bytes: 10,
        }
    }

    fn report() -> RestoreReport {
        RestoreReport {
            data_dir: "/d".into(),
            target_revision: 50,
            reached_revision: 50,
            full: "f".into(),
            full_revision: 41,
            deltas: 1,
            revisions_replayed: 9,
            events_replayed: 9,
            replay_seconds: 0.1,
            expected_keys: 3,
            keys: 3,
            hash_kv: "equal".into(),
            gaps: vec![],
            verified: true,
            total_seconds: 0.0,
        }
    }

    #[test]
    fn walks_every_step_in_order() {
        let mut s = RestoreState::Start { excluded: vec![] };
        let mut seen = vec![];
        loop {
            let a = s.action();
            seen.push(a);
            let o = match a {
                Action::Plan => Outcome::Planned(plan(40)),
                Action::Download => Outcome::Downloaded(info()),
                Action::RestoreSnapshot => Outcome::SnapshotRestored,
                Action::Replay => Outcome::Replayed(report()),
                Action::Finalize => Outcome::Finalized,
                Action::Done => break,
            };
            s = step(s, o).unwrap();
        }
        use Action::*;
        assert_eq!(
            seen,
            [Plan, Download, RestoreSnapshot, Replay, Finalize, Done]
        );
    }

    #[test]
    fn a_too_new_full_snapshot_is_excluded_and_planning_starts_over() {
        let s = RestoreState::SnapshotRestored {
            plan: plan(45),
            excluded: vec!["older-too-new".into()],
            full: info(),
        };
        let s = step(
            s,
            Outcome::FullTooNew {
                restored_revision: 51,
            },
        )
        .unwrap();
        match &s {
            RestoreState::Start { excluded } => {
                assert_eq!(excluded.len(), 2);
                assert!(excluded[1].starts_with("full-00000000000000000045"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_corrupt_full_snapshot_is_excluded_and_planning_starts_over() {
        let s = RestoreState::Planned {
            plan: plan(45),
            excluded: vec![],
        };
        let s = step(
            s,
            Outcome::FullCorrupt {
                object: "full-x".into(),
                problem: "checksum".into(),
            },
        )
        .unwrap();
        match &s {
            RestoreState::Start { excluded } => {
                assert_eq!(excluded.len(), 1);
                assert!(excluded[0].starts_with("full-00000000000000000045"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn outcomes_that_do_not_fit_are_errors_and_state_survives_a_round_trip() {
        let s = RestoreState::Start { excluded: vec![] };
        assert!(step(s.clone(), Outcome::Finalized).is_err());
        assert!(step(s, Outcome::SnapshotRestored).is_err());
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("state.json");
        let state = RestoreState::SnapshotRestored {
            plan: plan(40),
            excluded: vec![],
            full: info(),
        };
        save_state(&path, "fp", &state).unwrap();
        assert_eq!(load_state(&path, "fp"), state, "resumes");
        assert_eq!(
            load_state(&path, "other"),
            RestoreState::Start { excluded: vec![] },
            "other options start over"
        );
    }

    #[test]
    fn etcd_db_hash_is_checked() {
        let data = b"some database bytes".to_vec();
        let mut with_hash = data.clone();
        with_hash.extend_from_slice(&Sha256::digest(&data));
        let mut h = DbHash::default();
        for piece in with_hash.chunks(5) {
            h.update(piece);
        }
        assert_eq!(h.check("o").unwrap(), with_hash.len() as u64);
        let mut bad = DbHash::default();
        bad.update(&data);
        assert!(bad.check("o").is_err());
    }
}
