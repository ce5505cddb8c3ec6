//! `ringctl backup ...` and `ringctl bench backup`: flags to a backup config,
//! then the `backup` crate; output as a table, JSON or YAML.

use std::path::{Path, PathBuf};
use std::time::Duration;

use backup::catalog::{rfc3339, Catalog};
use backup::codec::EncryptionKey;
use backup::config::EncryptionConfig;
use backup::restore::{RestoreOptions, RestoreTarget};
use backup::{BackupConfig, BackupError, Bucket, BucketConfig, EtcdConfig, Retention};
use clap::{Args, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::output::{encode, table, Format};

type Result<T> = std::result::Result<T, BackupError>;

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
    /// Directory searched first for etcd and etcdctl.
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

fn flag(name: &str, reason: impl Into<String>) -> BackupError {
    BackupError::config(name, reason)
}

impl BucketArgs {
    fn base(&self) -> Result<Option<BackupConfig>> {
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
    fn open(&self) -> Result<(Bucket, Option<EncryptionKey>, String)> {
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

fn print<T: serde::Serialize>(
    value: &T,
    format: Format,
    table: impl FnOnce() -> String,
) -> Result<()> {
    match encode(value, format).map_err(|e| BackupError::Catalog(e.to_string()))? {
        Some(text) => print!("{text}"),
        None => print!("{}", table()),
    }
    Ok(())
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 10 << 20 => format!("{} MiB", b >> 20),
        b if b >= 10 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The catalog as a table.
pub fn render_catalog(bucket: &str, c: &Catalog) -> String {
    let mut t = table(&["KIND", "REVISIONS", "TIME", "SIZE", "ENCRYPTED", "NAME"]);
    let mut all: Vec<_> = c.entries().collect();
    all.sort_by_key(|e| (e.first, e.kind));
    for e in all {
        let revs = if e.first == e.last {
            e.first.to_string()
        } else {
            format!("{}..{}", e.first, e.last)
        };
        t.add_row(vec![
            e.kind.to_string(),
            revs,
            rfc3339(e.time_ms),
            size(e.size),
            if e.encrypted { "yes" } else { "no" }.into(),
            e.name.clone(),
        ]);
    }
    let mut out = format!("{bucket}\n{t}\n");
    out.push_str(&format!(
        "{} full snapshots, {} deltas, newest revision {}\n",
        c.fulls.len(),
        c.deltas.len(),
        c.latest_revision().map_or("-".into(), |r| r.to_string())
    ));
    for g in c.gaps() {
        out.push_str(&format!(
            "gap: revisions {}..={} are in no object (after {})\n",
            g.from, g.to, g.after
        ));
    }
    out
}

impl BackupCommand {
    /// Whether the command runs until stopped (and so wants SIGTERM/Ctrl-C as
    /// a shutdown token rather than as an immediate exit).
    pub fn runs_until_stopped(&self) -> bool {
        matches!(self, BackupCommand::Start(_) | BackupCommand::Restore(_))
    }
}

/// Runs `ringctl backup <command>`; `shutdown` stops `start` (and interrupts a
/// `restore`, which a rerun resumes).
pub async fn run(
    command: BackupCommand,
    format: Format,
    shutdown: CancellationToken,
) -> Result<()> {
    match command {
        BackupCommand::Start(args) => {
            let mut config = args.etcd.config()?;
            if let Some(ms) = args.delta_period_ms {
                config.schedule.delta_period_ms = ms;
            }
            if let Some(s) = args.full_interval_secs {
                config.schedule.full_interval_secs = s;
            }
            config.validate()?;
            let b = backup::Backup::new(config.clone())?;
            if let Some(addr) = &args.metrics_listen {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| flag("--metrics-listen", format!("{addr}: {e}")))?;
                let metrics = b.metrics();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    let _ = ringd::metrics::serve(
                        listener,
                        move || metrics.encode(backup::now_ms()),
                        stop,
                    )
                    .await;
                });
            }
            let mut progress = b.progress();
            let shoot = config.shoot.clone();
            let reporter = tokio::spawn(async move {
                let mut last = (0u64, 0u64);
                while progress.changed().await.is_ok() {
                    let p = progress.borrow_and_update().clone();
                    if (p.fulls, p.deltas / 10) != last {
                        last = (p.fulls, p.deltas / 10);
                        eprintln!(
                            "backup of {shoot}: {} full snapshots, {} deltas, durable revision {}",
                            p.fulls, p.deltas, p.durable_revision
                        );
                    }
                }
            });
            eprintln!(
                "backing up shoot {} from {} to {} (deltas every {} ms); stop with Ctrl-C",
                config.shoot,
                config.etcd.endpoints.join(","),
                config.bucket.url,
                config.schedule.delta_period_ms
            );
            let result = b.run(shutdown).await;
            reporter.abort();
            result
        }
        BackupCommand::Snapshot(args) => {
            let config = args.config()?;
            let snap = backup::snapshot_once(&config).await?;
            print(&snap, format, || {
                format!(
                    "full snapshot {} of shoot {}: revision {}, {} keys, {} from etcd, {} stored, sha256 {} ({:.1}s)\n",
                    snap.name,
                    config.shoot,
                    snap.base_revision,
                    snap.keys,
                    size(snap.db_bytes),
                    size(snap.stored_bytes),
                    snap.sha256,
                    snap.seconds
                )
            })
        }
        BackupCommand::List(args) => {
            let (bucket, _, _) = args.open()?;
            bucket.check().await?;
            let catalog = bucket.catalog().await?;
            print(&catalog, format, || {
                render_catalog(&bucket.describe(), &catalog)
            })
        }
        BackupCommand::Verify(args) => {
            let (bucket, key, _) = args.open()?;
            bucket.check().await?;
            let report = backup::verify::verify(&bucket, key.as_ref()).await?;
            print(&report, format, || {
                let mut t = table(&["RESULT", "KIND", "REVISIONS", "NAME"]);
                for o in &report.objects {
                    t.add_row(vec![
                        o.problem
                            .as_ref()
                            .map_or("ok".to_string(), |p| format!("BAD: {p}")),
                        o.kind.to_string(),
                        format!("{}..{}", o.first, o.last),
                        o.name.clone(),
                    ]);
                }
                let mut out = format!("{}\n{t}\n", report.bucket);
                for n in &report.notes {
                    out.push_str(&format!("note: {n}\n"));
                }
                for p in &report.problems {
                    out.push_str(&format!("problem: {p}\n"));
                }
                if report.ok() {
                    out.push_str(&format!("all {} objects are sound\n", report.objects.len()));
                }
                out
            })?;
            if report.ok() {
                Ok(())
            } else {
                Err(BackupError::Verify(format!(
                    "{} problem(s) in {}",
                    report.problems.len(),
                    report.bucket
                )))
            }
        }
        BackupCommand::Restore(args) => {
            let (bucket, key, shoot) = args.bucket.open()?;
            let target = match (args.revision, &args.time) {
                (Some(r), _) => RestoreTarget::Revision(r),
                (None, Some(t)) => RestoreTarget::Time(backup::catalog::parse_rfc3339(t)?),
                (None, None) => RestoreTarget::Latest,
            };
            let member = match &args.bucket.state_dir {
                Some(dir) => {
                    let layout = seed::ShootLayout {
                        dir: dir.join("shoots").join(&shoot),
                    };
                    let spec = layout
                        .read_spec()
                        .map_err(|e| flag("--state-dir", e.to_string()))?
                        .unwrap_or_else(|| seed::ControlPlaneSpec::new(&shoot));
                    backup::etcd::Member::for_shoot(&spec)
                }
                None => backup::etcd::Member::for_shoot(&seed::ControlPlaneSpec::new(&shoot)),
            };
            let opts = RestoreOptions {
                bucket,
                key,
                data_dir: absolute(&args.data_dir)?,
                target,
                allow_gap: args.allow_gap,
                member,
                etcd: backup::etcd::find_binary("etcd", args.bin_dir.as_deref())?,
                etcdctl: backup::etcd::find_binary("etcdctl", args.bin_dir.as_deref())?,
                work_dir: args.work_dir.as_deref().map(absolute).transpose()?,
            };
            let report =
                backup::restore::restore(&opts, &|line| eprintln!("restore: {line}"), &shutdown)
                    .await?;
            print(&report, format, || {
                let mut out = format!(
                    "restored shoot {shoot} into {} at revision {} ({} keys) in {:.1}s\n",
                    report.data_dir.display(),
                    report.reached_revision,
                    report.keys,
                    report.total_seconds
                );
                out.push_str(&format!(
                    "  full snapshot {} (revision {}), {} deltas, {} revisions / {} events replayed in {:.1}s\n",
                    report.full,
                    report.full_revision,
                    report.deltas,
                    report.revisions_replayed,
                    report.events_replayed,
                    report.replay_seconds
                ));
                if report.verified {
                    out.push_str(&format!(
                        "  verified: revision {}, {} keys, HashKV {}\n",
                        report.reached_revision, report.keys, report.hash_kv
                    ));
                } else {
                    out.push_str(&format!(
                        "  NOT exact: revisions {:?} were skipped (--allow-gap)\n",
                        report.gaps
                    ));
                }
                out
            })
        }
        BackupCommand::Gc(args) => {
            let policy = match (args.keep_last, args.exponential) {
                (Some(n), _) if n > 0 => Retention::KeepLast { count: n },
                (Some(_), _) => return Err(flag("--keep-last", "keep at least 1")),
                (None, true) => Retention::Exponential,
                (None, false) => {
                    let base = args.bucket.base()?;
                    base.and_then(|c| c.retention).ok_or_else(|| {
                        flag(
                            "--keep-last",
                            "give --keep-last N or --exponential (or a config with retention)",
                        )
                    })?
                }
            };
            let (bucket, _, _) = args.bucket.open()?;
            bucket.check().await?;
            let plan = backup::retention::collect(&bucket, &policy, backup::now_ms(), args.dry_run)
                .await?;
            print(&plan, format, || {
                let verb = if args.dry_run {
                    "would delete"
                } else {
                    "deleted"
                };
                let mut out = String::new();
                for d in &plan.delete {
                    out.push_str(&format!("{verb} {d}\n"));
                }
                out.push_str(&format!(
                    "{verb} {} objects, kept {}\n",
                    plan.delete.len(),
                    plan.keep.len()
                ));
                out
            })
        }
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .map_err(|e| flag("--data-dir", e.to_string()))
}

/// Runs `ringctl bench backup`; `ringctl` is this executable (measured as a child).
pub async fn bench(args: BenchArgs, ringctl: PathBuf, format: Format) -> Result<()> {
    let opts = backup::bench::BenchOptions {
        db_mib: args.db_mib,
        events: args.events,
        rate: args.rate,
        lag: Duration::from_secs(args.lag_secs),
        runs: args.runs.max(1),
        ringctl,
        dir: crate::bench::temp_state_dir(),
    };
    let result = backup::bench::run(&opts).await;
    let _ = std::fs::remove_dir_all(&opts.dir);
    let result = result?;
    print(&result, format, || backup::bench::render(&result))
}
