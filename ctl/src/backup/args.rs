//! The flags of `ringctl backup ...` and `ringctl bench backup`, and how they
//! (with an optional config file) become a backup config.

use std::path::{Path, PathBuf};

use backup::codec::EncryptionKey;
use backup::config::EncryptionConfig;
use backup::{BackupConfig, BackupError, Bucket, BucketConfig, EtcdConfig};
use clap::{Args, Subcommand};

use super::Result;

/// `ringctl backup ...`
#[derive(Subcommand)]
pub enum BackupCommand {
    /// Back up a shoot's etcd continuously (full snapshot, then deltas) until SIGTERM or Ctrl-C.
    Start(StartArgs),
    /// Take one full snapshot now.
    Snapshot(EtcdArgs),
    /// The shoot's objects in the bucket (the catalog, from the listing alone).
    List(BucketArgs),
    /// Download and check every object of the shoot, and the chain of revisions.
    Verify(BucketArgs),
    /// Restore the shoot's etcd into a fresh data dir (latest, or a revision or time).
    Restore(RestoreArgs),
    /// Delete what the retention policy does not keep.
    Gc(GcArgs),
}

/// Where the backup is.
#[derive(Args, Clone, Debug)]
pub struct BucketArgs {
    /// A backup config file (kind: Backup); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The shoot whose backup this is.
    #[arg(long)]
    pub shoot: Option<String>,
    /// The bucket: file:///dir, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix.
    #[arg(long, env = "RING_BACKUP_BUCKET")]
    pub bucket: Option<String>,
    /// An S3-compatible endpoint (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "RING_BACKUP_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// A file with the AES-256 key (64 hex digits, base64, or 32 raw bytes).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// An environment variable with the AES-256 key.
    #[arg(long)]
    pub key_env: Option<String>,
    /// The key's name recorded in new objects [default: a check value of the key].
    #[arg(long)]
    pub key_id: Option<String>,
    /// A local seed's state dir: the default bucket is file://<state-dir>/backups;
    /// `start` and `snapshot` find the shoot's etcd and Ring's client certificate
    /// there, `restore` names the member the way that seed starts etcd.
    #[arg(long, env = "RING_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
}

/// How to reach the shoot's etcd.
#[derive(Args, Clone, Debug)]
pub struct EtcdArgs {
    #[command(flatten)]
    pub bucket: BucketArgs,
    /// etcd's client URL (instead of --state-dir).
    #[arg(long)]
    pub etcd_endpoint: Option<String>,
    /// CA of etcd's serving certificate.
    #[arg(long)]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long)]
    pub etcd_cert: Option<PathBuf>,
    /// Client key for etcd.
    #[arg(long)]
    pub etcd_key: Option<PathBuf>,
}

/// `ringctl backup start`
#[derive(Args, Clone, Debug)]
pub struct StartArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// Seal pending events into a delta this often.
    #[arg(long)]
    pub delta_period_ms: Option<u64>,
    /// Take a new full snapshot this often.
    #[arg(long)]
    pub full_interval_secs: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_listen: Option<String>,
}

/// `ringctl backup restore`
#[derive(Args, Clone, Debug)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub bucket: BucketArgs,
    /// The fresh data dir to restore into (must not exist or be empty).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Restore exactly this etcd revision.
    #[arg(long, conflicts_with = "time")]
    pub revision: Option<i64>,
    /// Restore what was backed up at this time (RFC 3339, e.g. 2025-06-14T10:15:00Z).
    #[arg(long)]
    pub time: Option<String>,
    /// Skip missing revisions instead of failing (the result is then not exact).
    #[arg(long)]
    pub allow_gap: bool,
    /// Directory searched first for etcd and etcdutl.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Scratch space for the download and the replay (a rerun with the same
    /// options resumes there) [default: <data-dir>.restore next to the data dir].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// `ringctl backup gc`
#[derive(Args, Clone, Debug)]
pub struct GcArgs {
    #[command(flatten)]
    pub bucket: BucketArgs,
    /// Keep the newest N full snapshots.
    #[arg(long, conflicts_with = "exponential")]
    pub keep_last: Option<usize>,
    /// All of the last hour, hourly for a day, daily for a week, weekly for a month.
    #[arg(long)]
    pub exponential: bool,
    /// Only show what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
}

/// `ringctl bench backup`
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Size of the database the full-snapshot figure uses.
    #[arg(long, default_value_t = 512)]
    pub db_mib: u64,
    /// Delta events the restore figure replays.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Puts per second of the lag figure.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds the lag figure writes.
    #[arg(long, default_value_t = 30)]
    pub lag_secs: u64,
    /// Runs of each snapshot/restore measurement (median).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// `ringctl bench restore`
#[derive(Args, Clone, Debug)]
pub struct RestoreBenchArgs {
    /// Size of the database the full snapshot holds.
    #[arg(long, default_value_t = 573)]
    pub db_mib: u64,
    /// Delta events replayed on top of it.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Runs of the restore (median).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Keep the bench's dir (the bucket, etcd's data, the restored data) and
    /// print where it is, to restore again by hand with `ringctl backup restore`.
    #[arg(long)]
    pub keep: bool,
}

/// An error naming the flag to fix.
pub fn flag(name: &str, reason: impl Into<String>) -> BackupError {
    BackupError::config(name, reason)
}

impl BucketArgs {
    /// The config file of `--config`, if given.
    pub fn base(&self) -> Result<Option<BackupConfig>> {
        self.config.as_deref().map(BackupConfig::load).transpose()
    }

    fn shoot(&self, base: Option<&BackupConfig>) -> Result<String> {
        let shoot = self
            .shoot
            .clone()
            .or_else(|| base.map(|c| c.shoot.clone()))
            .ok_or_else(|| flag("--shoot", "name the shoot (or give --config)"))?;
        seed::validate_shoot_name(&shoot).map_err(|e| flag("--shoot", e.to_string()))?;
        Ok(shoot)
    }

    fn bucket_config(&self, base: Option<&BackupConfig>) -> Result<BucketConfig> {
        let mut b = match (&self.bucket, base, &self.state_dir) {
            (Some(url), _, _) => BucketConfig::url(url.clone()),
            (None, Some(c), _) => c.bucket.clone(),
            (None, None, Some(dir)) => BucketConfig::url(format!("file://{}", absolute(&dir.join("backups"))?.display())),
            (None, None, None) => {
                return Err(flag(
                    "--bucket",
                    "name the bucket: file:///dir, s3://bucket/prefix, gs://..., az://... (or give --config or --state-dir)",
                ))
            }
        };
        if let Some(e) = &self.s3_endpoint {
            b.endpoint = Some(e.clone());
            if e.starts_with("http://") {
                b.allow_http = Some(true);
            }
        }
        b.validate("--bucket")?;
        Ok(b)
    }

    fn encryption(&self, base: Option<&BackupConfig>) -> Result<Option<EncryptionConfig>> {
        if self.key_file.is_some() || self.key_env.is_some() {
            let e = EncryptionConfig {
                key_file: self.key_file.clone(),
                key_env: self.key_env.clone(),
                key_id: self.key_id.clone(),
            };
            e.validate("--key-file/--key-env")?;
            return Ok(Some(e));
        }
        Ok(base.and_then(|c| c.encryption.clone()))
    }

    fn key(&self, base: Option<&BackupConfig>) -> Result<Option<EncryptionKey>> {
        self.encryption(base)?
            .as_ref()
            .map(EncryptionKey::load)
            .transpose()
    }

    /// The shoot's bucket, for readers.
    pub fn open(&self) -> Result<(Bucket, Option<EncryptionKey>, String)> {
        let base = self.base()?;
        let shoot = self.shoot(base.as_ref())?;
        let bucket = Bucket::open(&self.bucket_config(base.as_ref())?, &shoot, false)?;
        Ok((bucket, self.key(base.as_ref())?, shoot))
    }
}

impl EtcdArgs {
    /// The full config: the file (if any) with the flags applied.
    pub fn config(&self) -> Result<BackupConfig> {
        let base = self.bucket.base()?;
        let shoot = self.bucket.shoot(base.as_ref())?;
        let bucket = self.bucket.bucket_config(base.as_ref())?;
        let etcd = match (&self.etcd_endpoint, &self.bucket.state_dir, &base) {
            (Some(ep), _, _) => EtcdConfig {
                endpoints: vec![ep.clone()],
                ca_file: self.etcd_ca.clone(),
                cert_file: self.etcd_cert.clone(),
                key_file: self.etcd_key.clone(),
                server_name: None,
            },
            (None, Some(dir), _) => local_etcd(dir, &shoot)?,
            (None, None, Some(c)) => c.etcd.clone(),
            (None, None, None) => {
                return Err(flag(
                    "--state-dir",
                    "say where etcd is: --state-dir of the local seed hosting the shoot, or --etcd-endpoint (or --config)",
                ))
            }
        };
        let mut config =
            base.unwrap_or_else(|| BackupConfig::new(&shoot, etcd.clone(), bucket.clone()));
        config.shoot = shoot.clone();
        config.etcd = etcd;
        config.bucket = bucket;
        config.encryption = self.bucket.encryption(Some(&config))?;
        if config.spool.dir.is_none() {
            if let Some(dir) = &self.bucket.state_dir {
                config.spool.dir = Some(dir.join("backup-spool").join(&shoot));
            }
        }
        config.validate()?;
        Ok(config)
    }
}

/// The etcd of `shoot` on the local seed in `state_dir`.
fn local_etcd(state_dir: &Path, shoot: &str) -> Result<EtcdConfig> {
    let layout = seed::ShootLayout {
        dir: state_dir.join("shoots").join(shoot),
    };
    let spec = layout
        .read_spec()
        .map_err(|e| flag("--state-dir", e.to_string()))?
        .ok_or_else(|| {
            flag(
                "--state-dir",
                format!("{} holds no shoot {shoot}", state_dir.display()),
            )
        })?;
    Ok(EtcdConfig::for_local_shoot(&layout, &spec))
}

impl BackupCommand {
    /// Whether the command runs until stopped (and so wants SIGTERM/Ctrl-C as
    /// a shutdown token rather than as an immediate exit).
    pub fn runs_until_stopped(&self) -> bool {
        matches!(self, BackupCommand::Start(_) | BackupCommand::Restore(_))
    }
}

/// `p` made absolute against the current directory.
pub fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .map_err(|e| flag("--data-dir", e.to_string()))
}
