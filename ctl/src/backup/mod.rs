//! `ringctl backup ...` and `ringctl bench backup`: flags to a backup config
//! (`args.rs`), then the `backup` crate; output as a table (`render.rs`), JSON
//! or YAML.

mod args;
mod render;

use std::path::PathBuf;
use std::time::Duration;

use backup::restore::{RestoreOptions, RestoreTarget};
use backup::{BackupConfig, BackupError, Retention};
use tokio_util::sync::CancellationToken;

use args::{absolute, flag, BucketArgs, EtcdArgs, GcArgs, RestoreArgs, StartArgs};
pub use args::{BackupCommand, BenchArgs, RestoreBenchArgs};

use crate::output::{encode, Format};

type Result<T> = std::result::Result<T, BackupError>;

/// Runs `ringctl backup <command>`; `shutdown` stops `start` (and interrupts a
/// `restore`, which a rerun resumes).
pub async fn run(
    command: BackupCommand,
    format: Format,
    shutdown: CancellationToken,
) -> Result<()> {
    match command {
        BackupCommand::Start(args) => start(args, shutdown).await,
        BackupCommand::Snapshot(args) => snapshot(args, format).await,
        BackupCommand::List(args) => list(args, format).await,
        BackupCommand::Verify(args) => verify(args, format).await,
        BackupCommand::Restore(args) => restore(args, format, shutdown).await,
        BackupCommand::Gc(args) => gc(args, format).await,
    }
}

/// `ringctl backup start`: backs up until `shutdown`, reporting progress on stderr.
async fn start(args: StartArgs, shutdown: CancellationToken) -> Result<()> {
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
        serve_metrics(&b, addr, shutdown.clone()).await?;
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
    eprintln!("{}", render::starting(&config));
    let result = b.run(shutdown).await;
    reporter.abort();
    result
}

/// Serves the backup's Prometheus metrics at `addr` until `stop`.
async fn serve_metrics(b: &backup::Backup, addr: &str, stop: CancellationToken) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| flag("--metrics-listen", format!("{addr}: {e}")))?;
    let metrics = b.metrics();
    tokio::spawn(async move {
        let _ =
            ringd::metrics::serve(listener, move || metrics.encode(backup::now_ms()), stop).await;
    });
    Ok(())
}

/// `ringctl backup snapshot`
async fn snapshot(args: EtcdArgs, format: Format) -> Result<()> {
    let config: BackupConfig = args.config()?;
    let snap = backup::snapshot_once(&config, 0).await?;
    print(&snap, format, || render::snapshot(&config.shoot, &snap))
}

/// `ringctl backup list`
async fn list(args: BucketArgs, format: Format) -> Result<()> {
    let (bucket, _, _) = args.open()?;
    bucket.check().await?;
    let catalog = bucket.catalog().await?;
    print(&catalog, format, || {
        render::catalog(&bucket.describe(), &catalog)
    })
}

/// `ringctl backup verify`: fails when any object or the chain has a problem.
async fn verify(args: BucketArgs, format: Format) -> Result<()> {
    let (bucket, key, _) = args.open()?;
    bucket.check().await?;
    let report = backup::verify::verify(&bucket, key.as_ref()).await?;
    print(&report, format, || render::verify(&report))?;
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

/// `ringctl backup restore`
async fn restore(args: RestoreArgs, format: Format, shutdown: CancellationToken) -> Result<()> {
    let (bucket, key, shoot) = args.bucket.open()?;
    let target = match (args.revision, &args.time) {
        (Some(r), _) => RestoreTarget::Revision(r),
        (None, Some(t)) => RestoreTarget::Time(backup::catalog::parse_rfc3339(t)?),
        (None, None) => RestoreTarget::Latest,
    };
    let member = restore_member(&args.bucket, &shoot)?;
    let opts = RestoreOptions {
        bucket,
        key,
        data_dir: absolute(&args.data_dir)?,
        target,
        allow_gap: args.allow_gap,
        member,
        etcd: backup::etcd::find_binary("etcd", args.bin_dir.as_deref())?,
        etcdutl: backup::etcd::find_binary("etcdutl", args.bin_dir.as_deref())?,
        work_dir: args.work_dir.as_deref().map(absolute).transpose()?,
        count_objects: false,
    };
    let report =
        backup::restore::restore(&opts, &|line| eprintln!("restore: {line}"), &shutdown).await?;
    print(&report, format, || render::restored(&shoot, &report))
}

/// The etcd member a restore names: the way the local seed in `--state-dir`
/// starts the shoot's etcd, else the way it would start a new one.
fn restore_member(args: &BucketArgs, shoot: &str) -> Result<backup::etcd::Member> {
    let spec = match &args.state_dir {
        Some(dir) => {
            let layout = seed::ShootLayout {
                dir: dir.join("shoots").join(shoot),
            };
            layout
                .read_spec()
                .map_err(|e| flag("--state-dir", e.to_string()))?
                .unwrap_or_else(|| seed::ControlPlaneSpec::new(shoot))
        }
        None => seed::ControlPlaneSpec::new(shoot),
    };
    Ok(backup::etcd::Member::for_shoot(&spec))
}

/// `ringctl backup gc`
async fn gc(args: GcArgs, format: Format) -> Result<()> {
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
    let plan = backup::retention::collect(&bucket, &policy, backup::now_ms(), args.dry_run).await?;
    print(&plan, format, || render::gc(&plan, args.dry_run))
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

/// Runs `ringctl bench restore`; `ringctl` is this executable (measured as a child).
pub async fn bench_restore(args: RestoreBenchArgs, ringctl: PathBuf, format: Format) -> Result<()> {
    let opts = backup::bench::restore::RestoreBenchOptions {
        db_mib: args.db_mib,
        events: args.events,
        runs: args.runs.max(1),
        ringctl,
        dir: crate::bench::temp_state_dir(),
    };
    let result = backup::bench::restore::run(&opts).await;
    if args.keep {
        eprintln!(
            "bench restore: kept {} (bucket: file://{}/bucket, shoot bench)",
            opts.dir.display(),
            opts.dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&opts.dir);
    }
    let result = result?;
    print(&result, format, || backup::bench::restore::render(&result))
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
