//! One function per subcommand: flags in, a library call, output out. Groups
//! with several subcommands have their own module (`controlplane`, `ring`,
//! `bench`); the rest are here.

pub mod bench;
pub mod certs;
pub mod controlplane;
pub mod ring;
pub mod version;

use std::path::{Path, PathBuf};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::{DrillRunArgs, DrillSummaryArgs, KillMachineArgs};
use crate::output::{encode, table, Format};

pub fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // kube-client logs every failed /readyz poll; Ring reports those itself.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(format!("{default},kube_client=off"))
        });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Prints `value` as JSON or YAML, or `table()` for the table format.
pub fn print<T: serde::Serialize>(
    value: &T,
    format: Format,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match encode(value, format)? {
        Some(text) => print!("{text}"),
        None => print!("{}", table()),
    }
    Ok(())
}

/// A token cancelled at the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let t = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        t.cancel();
    });
    Ok(token)
}

/// This ringctl executable (`ringd` is expected next to it).
pub fn ringctl_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("locating the ringctl executable")
}

/// The ringd executable next to this ringctl.
pub fn ringd_exe() -> anyhow::Result<PathBuf> {
    Ok(ringctl_exe()?.with_file_name("ringd"))
}

/// The Ring config at `path`, parsed and validated, if a path was given.
pub fn read_ring_config(path: Option<&Path>) -> anyhow::Result<Option<bootstrap::RingConfig>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(bootstrap::RingConfig::parse(
        &text,
        &path.display().to_string(),
    )?))
}

/// `ringctl images ...`
pub async fn images(cmd: crate::images::ImagesCommand, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    crate::images::run(cmd, format).await
}

/// `ringctl manifests`
pub async fn manifests(args: crate::manifests::ManifestsArgs) -> anyhow::Result<()> {
    init_tracing("warn");
    print!("{}", crate::manifests::render(&args)?);
    Ok(())
}

/// `ringctl backup ...`: `start` and `restore` stop (gracefully) at SIGTERM or Ctrl-C.
pub async fn backup(cmd: crate::backup::BackupCommand, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let shutdown = if cmd.runs_until_stopped() {
        shutdown_on_signals()?
    } else {
        CancellationToken::new()
    };
    Ok(crate::backup::run(cmd, format, shutdown).await?)
}

/// `ringctl drill kill-machine MEMBER`: everything of one member of a local
/// ring dies at once (its ringd, the control-plane processes it runs, its
/// shoot's nodes with every pod), as when its machine dies.
pub async fn kill_machine(args: KillMachineArgs) -> anyhow::Result<()> {
    init_tracing("warn");
    let dir = args.dir.dir();
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let config = layout.read_config()?.with_context(|| {
        format!(
            "{} holds no ring (no ring.yaml): give the --ring-dir of a ring `ringctl bootstrap` made",
            dir.display()
        )
    })?;
    let names: Vec<&str> = config.members.iter().map(|m| m.name.as_str()).collect();
    if !names.contains(&args.member.as_str()) {
        anyhow::bail!(
            "{} is not a member of ring {} (its members: {})",
            args.member,
            config.name,
            names.join(", ")
        );
    }
    let scenarios::procs::MachineKilled {
        processes: killed,
        nodes,
    } = scenarios::procs::kill_machine(&layout, &config, &args.member).await?;
    println!(
        "killed machine {}: ringd {}, {} processes, nodes: {}",
        args.member,
        killed.ringd.map_or("not running".into(), |p| p.to_string()),
        killed.processes,
        if nodes.is_empty() {
            "none running".into()
        } else {
            format!("{} with every pod on them", nodes.join(", "))
        }
    );
    println!(
        "the ring restores what it hosted elsewhere; `ringctl bootstrap --ring-dir {}` brings the machine back",
        dir.display()
    );
    Ok(())
}

/// `ringctl drill run`: fails unless every run of every drill passed.
pub async fn drill_run(args: DrillRunArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = ringctl_exe()?;
    let opts = scenarios::DrillRunOptions {
        files: args.files,
        repeat: args.repeat,
        seed: args.seed,
        report_dir: args.report_dir,
        runner: scenarios::runner::RunOptions {
            ringd: exe.with_file_name("ringd"),
            ringctl: exe,
            work_dir: std::env::temp_dir(),
            keep: args.keep,
        },
    };
    let runs = scenarios::run_files(&opts, &|line| eprintln!("{line}")).await?;
    if format != Format::Table {
        print(&runs, format, String::new)?;
    }
    if !runs.all_passed() {
        anyhow::bail!("drills failed: {:?} (passed, runs)", runs.tally);
    }
    Ok(())
}

/// `ringctl drill summary`: fails when a run failed or no result was found.
pub fn drill_summary(args: DrillSummaryArgs, format: Format) -> anyhow::Result<()> {
    let scenarios::summary::Loaded { results, skipped } =
        scenarios::summary::load_results(&args.paths)?;
    for (path, why) in &skipped {
        eprintln!("skipped {}: {why}", path.display());
    }
    if results.is_empty() {
        anyhow::bail!(
            "no drill results under {}: give the --report-dir of `ringctl drill run`",
            args.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let summaries = scenarios::summary::summarize(&results);
    print(&summaries, format, || summary_table(&summaries))?;
    let failed: usize = summaries.iter().map(|s| s.runs - s.passed).sum();
    if failed > 0 {
        anyhow::bail!("{failed} of {} runs failed", results.len());
    }
    Ok(())
}

fn summary_table(summaries: &[scenarios::summary::DrillSummary]) -> String {
    let span = |s: Option<scenarios::summary::Span>| {
        s.map_or("-".into(), |s| format!("{:.1}-{:.1}s", s.min, s.max))
    };
    let mut t = table(&[
        "DRILL",
        "BUILD",
        "PASSED",
        "FAILOVER",
        "MOVE BACK",
        "OTHERS",
        "ACKED",
        "LOST",
        "LOST>DURABLE",
        "DOUBLE",
    ]);
    for s in summaries {
        t.add_row(vec![
            s.drill.clone(),
            s.build.clone().unwrap_or_else(|| "-".into()),
            format!("{}/{}", s.passed, s.runs),
            span(s.failover),
            span(s.move_back),
            format!("{:.1}s", s.bystanders_max),
            s.acked_writes.to_string(),
            s.lost_writes.to_string(),
            s.lost_beyond_durable.to_string(),
            s.double_serving_runs.to_string(),
        ]);
    }
    let mut out = format!("{t}\n");
    for s in summaries {
        for f in &s.failures {
            out.push_str(&format!("{} failed, {f}\n", s.drill));
        }
    }
    out.push_str(
        "FAILOVER: per run the longest first outage of a shoot whose control plane was lost; \
         MOVE BACK: its longest later one; OTHERS: the longest outage of any other shoot; \
         LOST: acknowledged writes that had to survive; DOUBLE: runs with two control planes of one shoot\n",
    );
    out
}
