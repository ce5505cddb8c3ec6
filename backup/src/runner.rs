//! The continuous backup of one shoot: a full snapshot, then deltas from a
//! watch, a new full snapshot on schedule, after enough deltas or when etcd
//! compacted the watch's revision; uploads retried with backoff while pending
//! deltas wait in the spool (bounded, spilled to disk).
//!
//! ```no_run
//! # async fn f(config: backup::BackupConfig) -> backup::Result<()> {
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! backup::run(config, shutdown).await
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Client, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::bucket::Bucket;
use crate::catalog::{object_name_in_epoch, Catalog};
use crate::codec::{self, EncryptionKey, Kind, Trailer};
use crate::config::BackupConfig;
use crate::delta::{Batch, Sealed};
use crate::etcd;
use crate::full::{self, Encoding, FullSnapshot};
use crate::metrics::Metrics;
use crate::retention;
use crate::spool::{Pending, Spool};
use crate::{now_ms, BackupError, Result};

/// How long a shutdown waits for pending deltas to reach the bucket before
/// leaving them in the spool folder for the next run.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// What the continuous backup has achieved so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The newest revision stored in the bucket.
    pub durable_revision: i64,
    /// When it was stored (ms since the epoch).
    pub durable_at_ms: i64,
    /// The newest revision etcd reported.
    pub etcd_revision: i64,
    /// The last full snapshot this run stored.
    pub last_full: Option<FullSnapshot>,
    /// Full snapshots and deltas this run stored.
    pub fulls: u64,
    pub deltas: u64,
    /// Deltas waiting for the bucket.
    pub pending: usize,
}

/// Exponential backoff between retries.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            next: initial,
            initial,
            max,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the initial delay.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Sleeps `d` unless cancelled first; false when cancelled.
async fn sleep_or_cancel(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        _ = token.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// The continuous backup of one shoot.
pub struct Backup {
    config: BackupConfig,
    bucket: Bucket,
    encoding: Encoding,
    metrics: Metrics,
    spool: Arc<Spool>,
    progress: Arc<watch::Sender<Progress>>,
}

/// Where the delta chain continues.
#[derive(Debug, Clone, Copy)]
struct Chain {
    /// The watch starts here.
    next_revision: i64,
    /// Keys in etcd at `next_revision - 1`.
    keys: i64,
    /// When the newest full snapshot was taken.
    last_full_ms: i64,
    /// Delta bytes stored since it.
    delta_bytes: u64,
    /// The revision the newest full snapshot holds.
    last_full_revision: i64,
    /// When HashKV was last recorded with a delta.
    last_hash_ms: i64,
}

/// Runs the continuous backup of `config.shoot` until `shutdown`.
pub async fn run(config: BackupConfig, shutdown: CancellationToken) -> Result<()> {
    Backup::new(config)?.run(shutdown).await
}

/// Takes one full snapshot now (`ringctl backup snapshot`; a migration's
/// final snapshot, written at the source's ring `epoch`; 0 outside a ring).
pub async fn snapshot_once(config: &BackupConfig, epoch: u64) -> Result<FullSnapshot> {
    config.validate()?;
    let mut encoding = encoding(config)?;
    encoding.epoch = epoch;
    let bucket = Bucket::open(&config.bucket, &config.shoot, true)?;
    let client = etcd::connect(&config.etcd).await?;
    full::take(
        &client,
        &config.etcd.endpoints.join(","),
        &bucket,
        &config.shoot,
        &encoding,
    )
    .await
}

/// The encoding the config asks for.
pub fn encoding(config: &BackupConfig) -> Result<Encoding> {
    Ok(Encoding {
        level: config.compression.level,
        key: config
            .encryption
            .as_ref()
            .map(EncryptionKey::load)
            .transpose()?,
        epoch: 0,
    })
}

impl Backup {
    /// Validates the config, loads the key, opens the bucket and the spool.
    pub fn new(config: BackupConfig) -> Result<Self> {
        config.validate()?;
        let bucket = Bucket::open(&config.bucket, &config.shoot, true)?;
        Self::with_bucket(config, bucket)
    }

    /// Like [`new`](Self::new) on a given bucket (tests share in-memory stores).
    pub fn with_bucket(config: BackupConfig, bucket: Bucket) -> Result<Self> {
        config.validate()?;
        let encoding = encoding(&config)?;
        let spool = Spool::open(
            config.spool.dir()?,
            config.spool.memory_bytes,
            config.spool.max_bytes,
        )?;
        let metrics = Metrics::new(&config.shoot);
        Ok(Backup {
            config,
            bucket,
            encoding,
            metrics,
            spool: Arc::new(spool),
            progress: Arc::new(watch::channel(Progress::default()).0),
        })
    }

    /// Seals with `key`, already loaded by the caller, instead of the key
    /// `config.encryption` names (a daemon loads its key once, at start).
    pub fn with_key(mut self, key: Option<EncryptionKey>) -> Self {
        self.encoding.key = key;
        self
    }

    /// Writes every object as the host of ring epoch `epoch` (see
    /// `catalog`): a new epoch starts its own chain with a full snapshot, and
    /// the backup stops once a newer epoch writes to the bucket.
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.encoding.epoch = epoch;
        self
    }

    /// The metrics (shared; encode them any time).
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Progress updates.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    fn endpoint(&self) -> String {
        self.config.etcd.endpoints.join(",")
    }

    /// Runs until `shutdown`; returns an error only when retrying cannot help
    /// (bad config, missing bucket, etcd behind the bucket, ...).
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let stop_uploads = CancellationToken::new();
        let uploader = tokio::spawn(upload_loop(
            (self.config.shoot.clone(), self.encoding.epoch),
            self.bucket.clone(),
            self.spool.clone(),
            self.metrics.clone(),
            self.progress.clone(),
            Duration::from_millis(self.config.schedule.max_backoff_ms),
            stop_uploads.clone(),
        ));
        let mut chain: Option<Chain> = None;
        let mut force_full = false;
        let mut backoff = Backoff::new(
            Duration::from_millis(200),
            Duration::from_millis(self.config.schedule.max_backoff_ms),
        );
        let result = loop {
            if shutdown.is_cancelled() {
                break Ok(());
            }
            // One backup cycle: connect, resume (or a full snapshot), deltas.
            let cycle = tracing::info_span!("backup_cycle", shoot = %self.config.shoot);
            let session = self.session(&mut chain, &mut force_full, &shutdown);
            match session.instrument(cycle).await {
                Ok(()) => break Ok(()),
                Err(BackupError::Compacted {
                    requested,
                    compacted,
                }) => {
                    tracing::warn!(shoot = %self.config.shoot, requested, compacted, "etcd compacted the watch's revision: taking a new full snapshot");
                    force_full = true;
                }
                Err(e) if e.is_retryable() => {
                    let d = backoff.next_delay();
                    tracing::warn!(shoot = %self.config.shoot, error = %e, retry_in = ?d, "backup interrupted; retrying");
                    if !sleep_or_cancel(d, &shutdown).await {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e),
            }
        };
        // Let pending deltas reach the bucket; what does not stays on disk.
        let deadline = tokio::time::Instant::now() + DRAIN_GRACE;
        while self.spool.stats().objects > 0 && tokio::time::Instant::now() < deadline {
            tokio::select! {
                _ = self.spool.popped() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        stop_uploads.cancel();
        let _ = uploader.await;
        match self.spool.spill_all() {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(shoot = %self.config.shoot, objects = n, "pending deltas kept in the spool folder for the next run")
            }
            Err(e) => {
                tracing::error!(shoot = %self.config.shoot, error = %e, "cannot keep pending deltas on disk")
            }
        }
        result
    }

    /// Connects, makes sure a chain exists (resuming or with a full snapshot)
    /// and records deltas until shutdown or an error.
    async fn session(
        &self,
        chain: &mut Option<Chain>,
        force_full: &mut bool,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let endpoint = self.endpoint();
        let mut client = etcd::connect(&self.config.etcd).await?;
        let status = etcd::status(&mut client, &endpoint).await?;
        if *force_full {
            *chain = None;
        }
        if chain.is_none() {
            *chain = self
                .resume(&mut client, &endpoint, status.revision, *force_full)
                .await?;
        }
        let current = match *chain {
            Some(c) => c,
            None => {
                let snap = self.take_full(&client).await?;
                *force_full = false;
                Chain {
                    next_revision: snap.base_revision + 1,
                    keys: snap.keys,
                    last_full_ms: snap.time_ms,
                    delta_bytes: 0,
                    last_full_revision: snap.base_revision,
                    last_hash_ms: now_ms(),
                }
            }
        };
        *chain = Some(current);
        self.record(&client, chain, shutdown).await
    }

    /// Where to continue from the bucket (and the spool), or `None` when a
    /// full snapshot is needed.
    async fn resume(
        &self,
        client: &mut Client,
        endpoint: &str,
        etcd_revision: i64,
        force_full: bool,
    ) -> Result<Option<Chain>> {
        // under a key, only what the key authenticates counts
        let (catalog, _) = self
            .bucket
            .trusted_catalog(self.encoding.key.as_ref())
            .await?;
        // What the bucket holds is durable already (in a ring: what this
        // epoch stored; a new epoch's first full snapshot comes next).
        let stored = match self.encoding.epoch {
            0 => catalog.latest_revision(),
            epoch => catalog.latest_revision_of(epoch),
        };
        if let Some(stored) = stored {
            self.metrics
                .stored_before(stored, catalog.newest_full().map(|f| (f.first, f.time_ms)));
            self.progress.send_modify(|p| {
                if stored > p.durable_revision {
                    p.durable_revision = stored;
                    p.durable_at_ms = now_ms();
                }
            });
        }
        let Some(newest_full) = catalog.newest_full() else {
            return Ok(None);
        };
        if force_full || !self.continues_in_epoch(&catalog)? {
            return Ok(None);
        }
        let latest = catalog
            .latest_revision()
            .unwrap_or(0)
            .max(self.spool.last_revision(self.encoding.epoch).unwrap_or(0));
        if etcd_revision < latest {
            return Err(BackupError::Catalog(format!(
                "etcd at {endpoint} is at revision {etcd_revision}, but {} already holds revisions up to {latest}: this is not the etcd backed up there (restored to an earlier point?); back it up under another bucket prefix",
                self.bucket.describe()
            )));
        }
        let keys = match etcd::key_count(client, endpoint, latest).await {
            Ok(k) => k,
            Err(BackupError::Compacted { .. }) => {
                tracing::info!(latest, "revision {latest} is compacted in etcd: a new full snapshot starts a new chain");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        tracing::info!(shoot = %self.config.shoot, from = latest + 1, "resuming the delta chain");
        Ok(Some(Chain {
            next_revision: latest + 1,
            keys,
            last_full_ms: newest_full.time_ms,
            delta_bytes: 0,
            last_full_revision: newest_full.first,
            last_hash_ms: now_ms(),
        }))
    }

    /// Whether this backup's chain continues what the bucket holds: always
    /// outside a ring; in a ring only within its own epoch (a new epoch's
    /// history begins with its own full snapshot, whatever an older one
    /// uploaded after the new host took over). A newer epoch in the bucket
    /// means this writer is stale: a permanent error, it stops.
    fn continues_in_epoch(&self, catalog: &Catalog) -> Result<bool> {
        let epoch = self.encoding.epoch;
        let newest = catalog.newest_epoch();
        if epoch == 0 {
            return Ok(true);
        }
        if newest > epoch {
            return Err(BackupError::Superseded {
                shoot: self.config.shoot.clone(),
                epoch,
                newer: newest,
                from_revision: catalog.epoch_start(newest).unwrap_or(0),
            });
        }
        Ok(catalog.latest_revision_of(epoch).is_some())
    }

    async fn take_full(&self, client: &Client) -> Result<FullSnapshot> {
        let result = full::take(
            client,
            &self.endpoint(),
            &self.bucket,
            &self.config.shoot,
            &self.encoding,
        )
        .await;
        match &result {
            Ok(snap) => self.full_stored(snap).await,
            Err(_) => self.metrics.upload_failed("full"),
        }
        result
    }

    async fn full_stored(&self, snap: &FullSnapshot) {
        self.metrics
            .full_stored(snap.base_revision, snap.stored_bytes, snap.time_ms);
        self.progress.send_modify(|p| {
            p.last_full = Some(snap.clone());
            p.fulls += 1;
            p.durable_revision = p.durable_revision.max(snap.base_revision);
            p.durable_at_ms = now_ms();
        });
        if let Some(policy) = &self.config.retention {
            if let Err(e) = retention::collect(&self.bucket, policy, now_ms(), false).await {
                tracing::warn!(shoot = %self.config.shoot, error = %e, "garbage collection failed; retried after the next full snapshot");
            }
        }
    }

    /// Seals the pending events into an encoded delta in the spool.
    async fn seal(
        &self,
        batch: &mut Batch,
        chain: &mut Option<Chain>,
        hash_client: &mut Client,
    ) -> Result<()> {
        let Some(c) = chain.as_mut() else {
            return Ok(());
        };
        let Some(mut sealed) = batch.seal(c.keys) else {
            return Ok(());
        };
        let interval = self.config.schedule.hash_kv_interval_secs as i64 * 1000;
        let now = now_ms();
        if interval > 0 && now - c.last_hash_ms >= interval {
            match etcd::hash_kv(hash_client, &self.endpoint(), sealed.meta.last_revision).await {
                Ok(h) => {
                    sealed.meta.hash_kv = Some(h);
                    c.last_hash_ms = now;
                }
                Err(e) => tracing::warn!(error = %e, "HashKV for a delta failed; skipped"),
            }
        }
        let pending = self.encode_delta(&sealed, now)?;
        c.keys = sealed.meta.keys_after;
        c.next_revision = sealed.meta.last_revision + 1;
        c.delta_bytes += pending.bytes.len() as u64;
        self.spool.push(pending)?;
        Ok(())
    }

    fn encode_delta(&self, sealed: &Sealed, now: i64) -> Result<Pending> {
        let (bytes, _sha) = codec::encode(
            sealed.header(&self.config.shoot, now, self.encoding.epoch),
            &sealed.body,
            self.encoding.level,
            self.encoding.key.as_ref(),
            Trailer::default(),
        )?;
        Ok(Pending {
            name: object_name_in_epoch(
                self.encoding.epoch,
                Kind::Delta,
                sealed.meta.first_revision,
                sealed.meta.last_revision,
                now,
                self.encoding.level > 0,
                self.encoding.key.is_some(),
            ),
            bytes: Bytes::from(bytes),
            last_revision: sealed.meta.last_revision,
            oldest_ms: sealed.oldest_ms,
        })
    }
}

/// Uploads spooled deltas of `shoot` in order, retrying with backoff, until
/// `stop`. Only objects of this backup's `epoch` count as durable progress
/// (a spool may still hold an earlier epoch's, uploaded for the record).
async fn upload_loop(
    (shoot, epoch): (String, u64),
    bucket: Bucket,
    spool: Arc<Spool>,
    metrics: Metrics,
    progress: Arc<watch::Sender<Progress>>,
    max_backoff: Duration,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), max_backoff);
    let mut failing_since: Option<tokio::time::Instant> = None;
    loop {
        let front = match spool.front() {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(shoot, error = %e, "cannot read the spool");
                if !sleep_or_cancel(backoff.next_delay(), &stop).await {
                    return;
                }
                continue;
            }
        };
        let Some(p) = front else {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = spool.pushed() => continue,
            }
        };
        let span = tracing::info_span!("delta_upload", shoot, revision = p.last_revision);
        let result = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = bucket.put(&p.name, p.bytes.clone()).instrument(span.clone()) => r,
        };
        match result {
            Ok(()) => {
                spool.pop_front();
                delta_stored(&p, epoch, &spool, &metrics, &progress);
                tracing::debug!(parent: &span, object = %p.name, bytes = p.bytes.len(), "delta stored");
                if let Some(since) = failing_since.take() {
                    tracing::info!(parent: &span, bucket = %bucket.describe(), down_for = ?since.elapsed(), "uploads succeed again");
                }
                backoff.reset();
            }
            Err(e) => {
                metrics.upload_failed("delta");
                let d = backoff.next_delay();
                if failing_since.is_none() {
                    failing_since = Some(tokio::time::Instant::now());
                }
                tracing::warn!(parent: &span, bucket = %bucket.describe(), object = %p.name, error = %e, retry_in = ?d, pending = spool.stats().objects, "upload failed; the delta stays pending");
                if !sleep_or_cancel(d, &stop).await {
                    return;
                }
            }
        }
    }
}

/// A delta reached the bucket: metrics and progress (what another epoch
/// wrote is not this backup's durable progress).
fn delta_stored(
    p: &Pending,
    epoch: u64,
    spool: &Spool,
    metrics: &Metrics,
    progress: &watch::Sender<Progress>,
) {
    let now = now_ms();
    let stats = spool.stats();
    metrics.pending(stats.objects, stats.bytes, stats.on_disk);
    let ours = crate::catalog::parse_name(&p.name, 0).is_none_or(|e| e.epoch == epoch);
    if !ours {
        tracing::info!(object = %p.name, epoch, "an earlier epoch's spooled delta stored for the record");
        progress.send_modify(|pr| pr.pending = stats.objects);
        return;
    }
    metrics.delta_stored(p.last_revision, p.bytes.len() as u64, now);
    progress.send_modify(|pr| {
        pr.durable_revision = pr.durable_revision.max(p.last_revision);
        pr.durable_at_ms = now;
        pr.deltas += 1;
        pr.pending = stats.objects;
    });
}

mod record;

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
