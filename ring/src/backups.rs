//! Backups of the control planes this member serves (`backup::Backup`, one per
//! shoot, running while the member serves it) and the shoot's spec and PKI next
//! to them in the bucket. What a backup reads comes from the seed's executor
//! ([`BackupSource`]); its progress goes out as `ReportBackup` commands on a
//! bounded queue, so this module knows neither the seed nor the daemon.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use backup::codec::EncryptionKey;
use backup::BucketConfig;
use bytes::Bytes;
use seed::ShootLayout;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::state::RingCommand;
use crate::RingError;

fn backup_err(e: backup::BackupError) -> RingError {
    RingError::Backup(e)
}

/// Where the continuous backup of one shoot reads from (given by the seed).
#[derive(Debug, Clone)]
pub struct BackupSource {
    /// The shoot's etcd: endpoints and client certificate.
    pub etcd: backup::EtcdConfig,
    /// The shoot's dir with `shoot.json` and `pki/` (its identity, stored too).
    pub identity: ShootLayout,
    /// Where deltas wait for upload.
    pub spool_dir: PathBuf,
}

/// How a shoot's continuous backup runs on this member's seed.
pub enum BackupPlan {
    /// ringd runs it, reading from this source.
    Here(BackupSource),
    /// It runs next to the workload (etcd's sidecar on a Kubernetes seed);
    /// ringd stores the shoot's identity from `identity` and forwards the
    /// durable revision `progress` reports.
    NextToWorkload {
        identity: ShootLayout,
        progress: std::sync::Arc<dyn SidecarProgress>,
    },
}

/// What a backup next to the workload last recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SidecarReport {
    /// The newest durable revision and when it was stored (unix ms), if any.
    pub durable: Option<(u64, u64)>,
    /// The newest revision it saw the shoot's etcd at, if recorded.
    pub etcd_revision: Option<u64>,
}

/// The progress of a backup that runs next to the workload.
#[async_trait::async_trait]
pub trait SidecarProgress: Send + Sync {
    /// What the backup recorded last.
    async fn report(&self) -> Result<SidecarReport, RingError>;
}

/// How often the progress of a backup next to the workload is read.
const SIDECAR_POLL: Duration = Duration::from_secs(1);

/// Shoot → the newest revision its backup saw etcd at (shared with the tasks
/// that follow each backup).
type SeenRevisions = std::sync::Arc<Mutex<BTreeMap<String, u64>>>;

/// Raises the revision `shoot`'s backup saw etcd at (called at every watch
/// response under load: the shoot's name is copied only the first time).
fn set_seen(seen: &SeenRevisions, shoot: &str, revision: u64) {
    let mut all = seen.lock().unwrap_or_else(|p| p.into_inner());
    match all.get_mut(shoot) {
        Some(r) => *r = (*r).max(revision),
        None => {
            all.insert(shoot.to_string(), revision);
        }
    }
}

/// The revision `shoot`'s backup saw etcd at, if it saw one.
fn get_seen(seen: &SeenRevisions, shoot: &str) -> Option<u64> {
    seen.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(shoot)
        .copied()
}

/// The ring's bucket as this member uses it: where it is, and the key that seals
/// what goes in (loaded once, so a bad key stops ringd at start, not a failover).
#[derive(Debug, Clone)]
pub struct RingBucket {
    pub config: BucketConfig,
    key: Option<EncryptionKey>,
    /// The setting that names the key (`backup.encryption`, `bucketEncryption`).
    field: String,
}

impl RingBucket {
    /// The bucket of a member's `backup` section, with its key loaded.
    pub fn open(section: &crate::config::BackupSection) -> Result<Self, RingError> {
        Self::new(
            section.bucket.clone(),
            section.encryption.clone(),
            "backup.encryption",
        )
    }

    /// A bucket sealed with the key `encryption` names (`field`: where that came from).
    pub fn new(
        config: BucketConfig,
        encryption: Option<backup::config::EncryptionConfig>,
        field: &str,
    ) -> Result<Self, RingError> {
        let key = encryption
            .as_ref()
            .map(EncryptionKey::load)
            .transpose()
            .map_err(|e| RingError::Config {
                field: field.to_string(),
                reason: e.to_string(),
            })?;
        Ok(RingBucket {
            config,
            key,
            field: field.to_string(),
        })
    }

    /// The epoch a new placement of `shoot` starts at: above every epoch
    /// its objects in the bucket were written at, so a ring bootstrapped
    /// again on this bucket, or restored from it, never writes as a host the
    /// bucket already saw (its backups would be taken for a fenced host's).
    pub async fn first_epoch(&self, shoot: &str) -> Result<u64, RingError> {
        Ok(self.catalog(shoot, true).await?.newest_epoch() + 1)
    }

    /// The catalog of `shoot`'s objects this ring trusts: with a key, only
    /// the sealed ones; epoch records only once opened and checked.
    /// `create`: a missing `file://` folder is made.
    async fn catalog(&self, shoot: &str, create: bool) -> Result<backup::Catalog, RingError> {
        let bucket = backup::Bucket::open(&self.config, shoot, create).map_err(backup_err)?;
        let (catalog, _) = bucket
            .trusted_catalog(self.key.as_ref())
            .await
            .map_err(backup_err)?;
        Ok(catalog)
    }

    /// The newest revision the bucket holds of `shoot` (what a restore of
    /// the latest reaches), if it holds any.
    pub async fn latest_revision(&self, shoot: &str) -> Result<Option<i64>, RingError> {
        Ok(self.catalog(shoot, false).await?.latest_revision())
    }

    /// Records that ring epoch `epoch` of `shoot` begins at `revision`, the
    /// data its new host restored or was handed, before that host serves:
    /// what an earlier epoch uploads past it is a fenced host's fork, never
    /// restored (see `backup::catalog::EpochBegin`). Returns the object's name.
    pub async fn record_epoch_begin(
        &self,
        shoot: &str,
        epoch: u64,
        revision: i64,
    ) -> Result<String, RingError> {
        let bucket = backup::Bucket::open(&self.config, shoot, false).map_err(backup_err)?;
        bucket
            .record_epoch_begin(self.key.as_ref(), epoch, revision)
            .await
            .map_err(backup_err)
    }

    /// The key objects are sealed with, if any.
    pub fn key(&self) -> Option<&EncryptionKey> {
        self.key.as_ref()
    }

    /// A missing or wrong key is the configuration to fix (permanent), named by
    /// the setting that gives the key; other bucket errors keep their kind.
    pub(crate) fn key_err(&self, e: backup::BackupError) -> RingError {
        let reason = match &e {
            backup::BackupError::KeyRequired { object, key_id } => format!(
                "{object} in {} is sealed with key id {key_id}, and no key is configured: set {} to the key the ring's bucket was written with",
                self.config.url, self.field
            ),
            backup::BackupError::WrongKey { .. } => e.to_string(),
            _ => return backup_err(e),
        };
        RingError::Config {
            field: self.field.clone(),
            reason,
        }
    }
}

/// Suffix of a sealed identity object.
const SEALED: &str = ".aesgcm";

/// The bucket prefix of a shoot's identity (spec + PKI): a child of the shoot's
/// prefix, which the backup catalog ignores.
fn identity_bucket(
    cfg: &BucketConfig,
    shoot: &str,
    create: bool,
) -> Result<backup::Bucket, RingError> {
    backup::Bucket::open(cfg, &format!("{shoot}/identity"), create).map_err(backup_err)
}

/// Object name of a file of the shoot dir (`pki/ca.crt` → `pki_ca.crt`).
fn object_name(rel: &str) -> String {
    rel.replace('/', "_")
}

/// Stores the shoot's spec and PKI in the bucket (idempotent), sealed when the
/// bucket has a key; the other form of each object, if any, is removed.
pub async fn upload_identity(
    rb: &RingBucket,
    layout: &ShootLayout,
    shoot: &str,
) -> Result<(), RingError> {
    let bucket = identity_bucket(&rb.config, shoot, true)?;
    let existing: Vec<String> = bucket
        .list()
        .await
        .map_err(backup_err)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut files = vec!["shoot.json".to_string()];
    let pki = layout.dir.join("pki");
    for e in std::fs::read_dir(&pki).map_err(|source| RingError::Io {
        what: format!("listing {}", pki.display()),
        source,
    })? {
        let e = e.map_err(|source| RingError::Io {
            what: format!("listing {}", pki.display()),
            source,
        })?;
        if e.path().is_file() {
            files.push(format!("pki/{}", e.file_name().to_string_lossy()));
        }
    }
    for rel in files {
        let path = layout.dir.join(&rel);
        let data = std::fs::read(&path).map_err(|source| RingError::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        let name = object_name(&rel);
        let sealed_name = format!("{name}{SEALED}");
        // what goes in, under which name, and the other form's name
        let (stored, bytes, stale) = match rb.key() {
            Some(key) => {
                let bytes =
                    backup::codec::seal(key, shoot, &sealed_name, &data).map_err(backup_err)?;
                (sealed_name, bytes, name)
            }
            None => (name, data, sealed_name),
        };
        bucket
            .put(&stored, Bytes::from(bytes))
            .await
            .map_err(backup_err)?;
        if existing.contains(&stale) {
            bucket.delete(&stale).await.map_err(backup_err)?;
        }
    }
    Ok(())
}

/// Fetches the shoot's spec and PKI from the bucket into `layout` (files 0600),
/// opening sealed objects with the bucket's key (a sealed object wins over a
/// plain one of the same name). With a key, a plain object is refused, and so
/// is one sealed for another shoot.
pub async fn download_identity(
    rb: &RingBucket,
    layout: &ShootLayout,
    shoot: &str,
) -> Result<(), RingError> {
    let bucket = identity_bucket(&rb.config, shoot, false)?;
    let mut objects: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for (stored, _) in bucket.list().await.map_err(backup_err)? {
        match stored.strip_suffix(SEALED) {
            Some(name) => {
                objects.insert(name.to_string(), (stored.clone(), true));
            }
            None => {
                objects.entry(stored.clone()).or_insert((stored, false));
            }
        }
    }
    if !objects.contains_key("shoot.json") {
        return Err(RingError::Transport(format!(
            "{} holds no spec of shoot {shoot}: it was never backed up here",
            bucket.describe()
        )));
    }
    seed::pki::create_private_dir(&layout.dir.join("pki"))?;
    for (name, (stored, sealed)) in objects {
        let rel = match name.strip_prefix("pki_") {
            Some(file) => format!("pki/{file}"),
            None => name.clone(),
        };
        if !sealed && rb.key().is_some() {
            return Err(backup_err(backup::BackupError::untrusted(
                format!("{} {stored}", bucket.describe()),
                "it is not sealed, but the ring's bucket has a key: anyone who can write to the bucket could have put it there (remove it; the shoot's host seals its identity again)",
            )));
        }
        let mut data = bucket.get_all(&stored).await.map_err(backup_err)?;
        if sealed {
            data = backup::codec::unseal(rb.key(), shoot, &stored, &data)
                .map_err(|e| rb.key_err(e))?;
        }
        seed::pki::write_private(&layout.dir.join(rel), &data)?;
    }
    Ok(())
}

/// The continuous backups this member runs.
#[derive(Default)]
pub struct Backups {
    /// Per shoot: what stops its backup, and the epoch it writes at.
    running: Mutex<BTreeMap<String, (CancellationToken, u64)>>,
    seen: SeenRevisions,
}

impl Backups {
    /// The newest revision the backup of `shoot` saw its etcd at, while it
    /// runs: the member's heartbeat carries it to the leader, so a failover
    /// can say how far beyond the bucket clients may have written.
    pub fn seen_revision(&self, shoot: &str) -> Option<u64> {
        get_seen(&self.seen, shoot)
    }

    /// The epoch the backup of `shoot` writes at, if it runs (or was
    /// started and not stopped).
    pub fn running(&self, shoot: &str) -> Option<u64> {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(shoot)
            .filter(|(t, _)| !t.is_cancelled())
            .map(|(_, epoch)| *epoch)
    }

    /// Starts backing up `shoot` at `epoch` unless that runs already:
    /// identity first, then the continuous full + delta loop (or, next to
    /// the workload, following its progress); the progress goes to `report`.
    pub fn ensure(
        &self,
        plan: BackupPlan,
        rb: &RingBucket,
        (shoot, epoch): (&str, u64),
        stop: &CancellationToken,
        report: mpsc::Sender<RingCommand>,
    ) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.get(shoot).is_some_and(|(t, _)| !t.is_cancelled()) {
            return;
        }
        let token = stop.child_token();
        running.insert(shoot.to_string(), (token.clone(), epoch));
        let span = tracing::info_span!("backup", %shoot, epoch);
        let (rb, shoot, seen) = (rb.clone(), shoot.to_string(), self.seen.clone());
        tokio::spawn(
            async move {
                let identity = match &plan {
                    BackupPlan::Here(source) => &source.identity,
                    BackupPlan::NextToWorkload { identity, .. } => identity,
                };
                if !store_identity(&rb, identity, &shoot, &token).await {
                    return;
                }
                let follow = Follow {
                    shoot,
                    token,
                    report,
                    seen,
                };
                match plan {
                    BackupPlan::Here(source) => run_backup(source, rb, epoch, follow).await,
                    BackupPlan::NextToWorkload { progress, .. } => {
                        follow_sidecar(progress, follow).await
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Stops backing up `shoot`.
    pub fn stop(&self, shoot: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(shoot);
        if let Some(t) = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(shoot)
        {
            t.0.cancel();
        }
    }
}

/// Stores the shoot's identity, retrying with backoff until it is stored or
/// the backup stops (false).
async fn store_identity(
    rb: &RingBucket,
    layout: &ShootLayout,
    shoot: &str,
    token: &CancellationToken,
) -> bool {
    let mut delay = Duration::from_millis(500);
    loop {
        match upload_identity(rb, layout, shoot).await {
            Ok(()) => return true,
            Err(e) => {
                tracing::warn!(error = %e, "storing the shoot's identity failed; retrying")
            }
        }
        tokio::select! {
            biased;
            _ = token.cancelled() => return false,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Where a running backup's progress goes: the ring (durable revisions, as
/// `ReportBackup` commands) and this member (the revision etcd was seen at).
struct Follow {
    shoot: String,
    token: CancellationToken,
    report: mpsc::Sender<RingCommand>,
    seen: SeenRevisions,
}

impl Follow {
    /// Queues a report of `revision` durable since `at_ms`; false when the
    /// queue is full (the next report carries a newer revision).
    fn durable(&self, revision: u64, at_ms: u64) -> bool {
        let seen = get_seen(&self.seen, &self.shoot).map(|revision| crate::state::SeenRevision {
            revision,
            at_ms: crate::now_ms(),
        });
        let cmd = RingCommand::ReportBackup {
            shoot: self.shoot.clone(),
            revision,
            at_ms,
            seen,
        };
        self.report.try_send(cmd).is_ok()
    }
}

/// The continuous full + delta backup of one shoot until `token` stops it.
async fn run_backup(source: BackupSource, rb: RingBucket, epoch: u64, follow: Follow) {
    let mut config =
        backup::BackupConfig::new(follow.shoot.clone(), source.etcd, rb.config.clone());
    config.spool.dir = Some(source.spool_dir);
    // A failover replays every delta since the newest full snapshot, one
    // revision at a time: a new full snapshot every 2000 revisions keeps
    // that part of the RTO to a couple of seconds.
    config.schedule.full_after_revisions = 2000;
    let runner = match backup::Backup::new(config) {
        Ok(r) => r.with_key(rb.key.clone()).with_epoch(epoch),
        Err(e) => {
            tracing::error!(error = %e, "cannot back up");
            return;
        }
    };
    let token = follow.token.clone();
    let reporter = tokio::spawn(report_progress(runner.progress(), follow).in_current_span());
    if let Err(e) = runner.run(token).await {
        tracing::error!(error = %e, "backup stopped");
    }
    reporter.abort();
}

/// Sends each new durable revision a backup next to the workload reports,
/// and keeps the revision it saw etcd at.
async fn follow_sidecar(progress: std::sync::Arc<dyn SidecarProgress>, follow: Follow) {
    let mut last = 0;
    let mut failing = Streak::default();
    loop {
        match progress.report().await {
            Ok(r) => {
                if let Some((count, lasted)) = failing.ended() {
                    tracing::info!(
                        count,
                        lasted_s = lasted.as_secs(),
                        "the backup's progress reads again"
                    );
                }
                if let Some(seen) = r.etcd_revision {
                    set_seen(&follow.seen, &follow.shoot, seen);
                }
                if let Some((revision, at_ms)) = r.durable.filter(|(rev, _)| *rev > last) {
                    if follow.durable(revision, at_ms) {
                        last = revision;
                    }
                }
            }
            Err(e) => {
                if let Some(count) = failing.failed(std::time::Instant::now()) {
                    tracing::warn!(error = %e, count, "cannot read the backup's progress");
                }
            }
        }
        tokio::select! {
            biased;
            _ = follow.token.cancelled() => return,
            _ = tokio::time::sleep(SIDECAR_POLL) => {}
        }
    }
}

/// A run of failures, warned about at its first and then every
/// [`Streak::WARN_EVERY`] (a seed cluster whose API is away for a minute
/// made one warning a second).
#[derive(Debug, Default)]
struct Streak {
    /// The first failure of the run, and how many so far.
    since: Option<(std::time::Instant, u32)>,
    warned_at: Option<std::time::Instant>,
}

impl Streak {
    const WARN_EVERY: Duration = Duration::from_secs(30);

    /// Counts a failure at `now`; the count so far when a warning is due.
    fn failed(&mut self, now: std::time::Instant) -> Option<u32> {
        let (_, count) = self.since.get_or_insert((now, 0));
        *count += 1;
        let count = *count;
        let due = self.warned_at.is_none_or(|w| now >= w + Self::WARN_EVERY);
        if due {
            self.warned_at = Some(now);
        }
        due.then_some(count)
    }

    /// Ends the run: its failures and how long it lasted, if there was one.
    fn ended(&mut self) -> Option<(u32, Duration)> {
        self.warned_at = None;
        self.since
            .take()
            .map(|(since, count)| (count, since.elapsed()))
    }
}

/// Keeps the revision etcd was seen at as it changes, and sends each new
/// durable revision to the ring, at most one report a second.
async fn report_progress(
    mut progress: tokio::sync::watch::Receiver<backup::Progress>,
    follow: Follow,
) {
    let mut last = 0;
    let mut next_report = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = follow.token.cancelled() => return,
            r = progress.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
        }
        let p = progress.borrow_and_update().clone();
        set_seen(&follow.seen, &follow.shoot, p.etcd_revision.max(0) as u64);
        let now = tokio::time::Instant::now();
        if p.durable_revision <= last || now < next_report {
            continue;
        }
        // a full queue drops this report: the next one carries a newer revision
        if follow.durable(p.durable_revision as u64, p.durable_at_ms as u64) {
            last = p.durable_revision;
            next_report = now + Duration::from_secs(1);
        } else {
            tracing::debug!(
                revision = p.durable_revision,
                "backup report dropped (queue full)"
            );
        }
    }
}

#[cfg(test)]
#[path = "backups_tests.rs"]
mod tests;
