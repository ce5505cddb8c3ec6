//! `ringctl bench ...`: each benchmark in a throwaway dir under the temp dir,
//! removed afterwards; the figures as a table, JSON or YAML.

use std::time::Duration;

use crate::bench::{self, temp_state_dir};
use crate::cli::{
    BenchArgs, BenchCommand, BootstrapBenchArgs, FailoverBenchArgs, MigrateBenchArgs, RaftBenchArgs,
};
use crate::controlplane::SeedOptions;
use crate::output::Format;

use super::{init_tracing, print, ringctl_exe, ringd_exe};

pub async fn run(cmd: BenchCommand, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    match cmd {
        BenchCommand::Controlplane(args) => controlplane(args, format).await,
        BenchCommand::Raft(args) => raft(args, format).await,
        BenchCommand::Bootstrap(args) => bootstrap(args, format).await,
        BenchCommand::Migrate(args) => migrate(args, format).await,
        BenchCommand::Failover(args) => failover(args, format).await,
        BenchCommand::Backup(args) => Ok(crate::backup::bench(args, ringctl_exe()?, format).await?),
        BenchCommand::Restore(args) => {
            Ok(crate::backup::bench_restore(args, ringctl_exe()?, format).await?)
        }
    }
}

async fn controlplane(args: BenchArgs, format: Format) -> anyhow::Result<()> {
    let opts = bench::controlplane::BenchOptions {
        runs: args.runs,
        seed: SeedOptions {
            state_dir: temp_state_dir(),
            bin_dir: args.bin_dir,
        },
        settle: Duration::from_secs(args.settle),
    };
    let result = bench::controlplane::controlplane(&opts).await;
    let _ = std::fs::remove_dir_all(&opts.seed.state_dir);
    let result = result?;
    print(&result, format, || bench::controlplane::render(&result))
}

async fn raft(args: RaftBenchArgs, format: Format) -> anyhow::Result<()> {
    let opts = bench::raft::RaftBenchOptions {
        sizes: args.sizes,
        proposals: args.proposals,
        kills: args.kills,
        idle_secs: args.idle_secs,
        ringd: ringd_exe()?,
        dir: temp_state_dir(),
    };
    let result = bench::raft::raft(&opts).await;
    let _ = std::fs::remove_dir_all(&opts.dir);
    let result = result?;
    print(&result, format, || bench::raft::render(&result))
}

async fn bootstrap(args: BootstrapBenchArgs, format: Format) -> anyhow::Result<()> {
    let ringd = ringd_exe()?;
    let dir = temp_state_dir();
    let result =
        bench::bootstrap::bootstrap_bench(&dir, &args.sizes, &args.hosting, &ringd, args.base_port)
            .await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    print(&result, format, || bench::bootstrap::render(&result))
}

async fn migrate(args: MigrateBenchArgs, format: Format) -> anyhow::Result<()> {
    let ringd = ringd_exe()?;
    let dir = temp_state_dir();
    let result =
        bench::migrate::migrate_bench(&dir, &ringd, args.base_port, args.objects, args.runs).await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    print(&result, format, || bench::migrate::render(&result))
}

/// The ring's timing with the overrides of `ringctl bench failover`.
fn bench_timing(args: &FailoverBenchArgs) -> anyhow::Result<ringd::config::Timing> {
    let mut t = ringd::config::Timing::default();
    if let Some(window) = args.failure_window_ms {
        t.failure_window_ms = window;
        t.heartbeat_ms = t.heartbeat_ms.min(window / 3);
    }
    if let Some(election) = args.election_timeout_ms {
        t.election_timeout_ms = election;
    }
    if let Some(lease) = args.lease_ms {
        t.lease_ms = lease;
        t.lease_margin_ms = t.lease_margin_ms.min(lease / 4);
    }
    t.validate().map_err(|e| {
        anyhow::anyhow!("--failure-window-ms / --lease-ms / --election-timeout-ms: {e}")
    })?;
    Ok(t)
}

async fn failover(args: FailoverBenchArgs, format: Format) -> anyhow::Result<()> {
    let ringd = ringd_exe()?;
    let c = &args.common;
    let root = temp_state_dir();
    let standby = bench::failover::ProtectionArg::Standby;
    if args.protection.contains(&standby)
        && args
            .seeds
            .iter()
            .any(|s| *s != bench::failover::SeedKind::Local)
    {
        anyhow::bail!("--protection standby runs on local seeds only for now: use --seeds local");
    }
    let timing = bench_timing(&args)?;
    let kinds = args
        .seeds
        .iter()
        .flat_map(|s| args.protection.iter().map(move |p| (*s, *p)));
    let mut all = Vec::new();
    for (k, (seeds, protection)) in kinds.enumerate() {
        let dir = root.join(format!("failover-{k}"));
        let options = bench::failover::FailoverOptions {
            protection,
            timing,
            // each kind's ring on its own ports (a killed ringd's port may linger)
            base_port: c.base_port + 50 * k as u16,
            objects: c.objects,
            runs: c.runs,
            rate: args.rate,
        };
        let result = bench::failover::failover_bench(&dir, &ringd, seeds, options).await;
        if args.keep {
            eprintln!("bench failover: kept {} (remove it by hand)", dir.display());
        } else {
            // the whole state dir, so that neither an error nor the end leaves it
            let _ = std::fs::remove_dir_all(&root);
        }
        all.push(result?);
    }
    print(&all, format, || bench::failover::render_all(&all))
}
