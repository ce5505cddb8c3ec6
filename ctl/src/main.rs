//! `ringctl`: the command line of Ring.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::cli::*;
use crate::controlplane::{SeedOptions, UpOptions};
use crate::output::{encode, status_table, Format};

mod backup;
mod bench;
mod cli;
mod controlplane;
mod images;
mod manifests;
mod output;

fn init_tracing(default: &str) {
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

fn print<T: serde::Serialize>(
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

fn shutdown_on_signals() -> anyhow::Result<CancellationToken> {
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

/// The Ring config at `path`, parsed and validated, if a path was given.
fn read_ring_config(
    path: Option<&std::path::Path>,
) -> anyhow::Result<Option<bootstrap::RingConfig>> {
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

/// Runs one command: each subcommand is its own function below.
async fn run(cli: Cli) -> anyhow::Result<()> {
    let format = cli.output;
    match cli.command {
        Command::Controlplane(ControlPlaneCommand::Up(args)) => controlplane_up(args, format).await,
        Command::Controlplane(ControlPlaneCommand::Down(args)) => {
            controlplane_down(args, format).await
        }
        Command::Controlplane(ControlPlaneCommand::Status(args)) => {
            controlplane_status(args, format).await
        }
        Command::Controlplane(ControlPlaneCommand::Run(args)) => controlplane_run(args).await,
        Command::Bootstrap(args) => bootstrap(args, format).await,
        Command::Down(args) => down(args).await,
        Command::Status(args) => status(args, format).await,
        Command::Pki(PkiCommand::Init(args)) => pki_init(args).await,
        Command::Join(args) => join(args, format).await,
        Command::Images(cmd) => images(cmd, format).await,
        Command::Manifests(args) => manifests(args).await,
        Command::Migrate(args) => migrate(args, format).await,
        Command::Leave(args) => leave(args, format).await,
        Command::Backup(cmd) => backup(cmd, format).await,
        Command::Drill(DrillCommand::Run(args)) => drill_run(args, format).await,
        Command::Restore(args) => restore(args, format).await,
        Command::Bench(BenchCommand::Backup(args)) => bench_backup(args, format).await,
        Command::Bench(BenchCommand::Failover(args)) => bench_failover(args, format).await,
        Command::Bench(BenchCommand::Migrate(args)) => bench_migrate(args, format).await,
        Command::Bench(BenchCommand::Bootstrap(args)) => bench_bootstrap(args, format).await,
        Command::Bench(BenchCommand::Raft(args)) => bench_raft(args, format).await,
        Command::Bench(BenchCommand::Controlplane(args)) => bench_controlplane(args, format).await,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Drills and benchmarks run throwaway rings (and drill networks) whose guards
    // tear them down when dropped: on SIGINT/SIGTERM, drop the command's future
    // (running those guards) instead of dying with the ring left running.
    let throwaway = matches!(cli.command, Command::Bench(_) | Command::Drill(_));
    let result = if throwaway {
        match shutdown_on_signals() {
            Ok(interrupted) => {
                tokio::select! {
                    biased;
                    _ = interrupted.cancelled() => Err(anyhow::anyhow!(
                        "interrupted; the throwaway rings of this command were stopped and removed"
                    )),
                    r = run(cli) => r,
                }
            }
            Err(e) => Err(e),
        }
    } else {
        run(cli).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Our error messages already embed their causes; add only what is new.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let cause = cause.to_string();
                if !msg.contains(&cause) {
                    msg = format!("{msg}: {cause}");
                }
            }
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}

async fn controlplane_up(args: UpArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let opts = UpOptions {
        seed: args.target.seed.options(),
        shoot: args.target.shoot,
        api_address: args.api_address,
        timeout: Duration::from_secs(args.timeout),
    };
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let outcome = controlplane::up(&opts, &exe).await?;
    print(&outcome, format, || {
        let note = if outcome.started {
            format!("control plane of shoot {} is ready\n\n", opts.shoot)
        } else {
            format!(
                "control plane of shoot {} was already running\n\n",
                opts.shoot
            )
        };
        note + &status_table(std::slice::from_ref(&outcome.status))
    })
}

async fn controlplane_down(args: ShootArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let status = controlplane::down(&args.seed.options(), &args.shoot).await?;
    print(&status, format, || {
        format!(
            "control plane of shoot {} stopped; its data is kept in place\n",
            status.shoot
        )
    })
}

async fn controlplane_status(args: StatusArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let statuses = controlplane::status(&args.seed.options(), args.shoot.as_deref()).await?;
    print(&statuses, format, || {
        if statuses.is_empty() {
            "no control planes on this seed\n".into()
        } else {
            status_table(&statuses)
        }
    })
}

async fn controlplane_run(args: RunArgs) -> anyhow::Result<()> {
    init_tracing("info");
    let shutdown = shutdown_on_signals()?;
    controlplane::run(
        &args.target.seed.options(),
        &args.target.shoot,
        args.api_address,
        shutdown,
    )
    .await?;
    Ok(())
}

async fn bootstrap(args: BootstrapArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let config = read_ring_config(args.config.as_deref())?;
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let opts = bootstrap::BootstrapOptions {
        config,
        dir: args.dir.dir(),
        ringd: exe.with_file_name("ringd"),
        timeout: Duration::from_secs(args.timeout),
    };
    let report = {
        let progress = bootstrap::TerminalProgress::default();
        bootstrap::bootstrap(&opts, &progress).await?
    };
    print(&report, format, || {
        let mut out = if report.changed {
            format!("ring {} is up ({:.1}s)\n\n", report.ring, report.total_secs)
        } else {
            format!("ring {} was already up; nothing to do\n\n", report.ring)
        };
        out.push_str(&ringd::status::render(&report.status));
        out.push_str(&bootstrap::nodes::render(&report.nodes));
        out.push_str("\nkubeconfigs:\n");
        for (shoot, path) in &report.kubeconfigs {
            out.push_str(&format!(
                "  {shoot}: kubectl --kubeconfig {} get namespaces\n",
                path.display()
            ));
        }
        out.push_str(&format!(
            "\nstatus: ringctl status --ring-dir {dir}\nstop:   ringctl down --ring-dir {dir}\n",
            dir = report.state_dir.display()
        ));
        out
    })
}

async fn down(args: RingDirArgs) -> anyhow::Result<()> {
    init_tracing("warn");
    let stopped = bootstrap::down(&args.dir(), Duration::from_secs(60)).await?;
    if stopped.is_empty() {
        println!("no member was running");
    } else {
        println!(
            "stopped {}; data kept in {}",
            stopped.join(", "),
            args.dir().display()
        );
    }
    Ok(())
}

async fn status(args: RingArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let status = args.status().await?;
    let nodes = args.local_nodes()?;
    let view = StatusView { status, nodes };
    print(&view, format, || {
        ringd::status::render(&view.status) + &bootstrap::nodes::render(&view.nodes)
    })
}

async fn pki_init(args: PkiInitArgs) -> anyhow::Result<()> {
    init_tracing("warn");
    let pki = ringd::identity::RingPki::new(&args.dir);
    pki.ensure_ca()?;
    let mut issued = vec![pki.ensure_admin()?];
    for (name, ip) in &args.members {
        issued.push(pki.ensure_member(name, *ip)?);
    }
    for f in issued {
        println!("{}", f.cert.display());
    }
    Ok(())
}

async fn join(args: JoinArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    match (&args.member_address, &args.ring.address) {
        (Some(member_address), _) => {
            let (address, pki) = args.ring.target()?;
            let mut client = ringd::client::AdminClient::connect_leader(&address, &pki).await?;
            println!("{}", client.add_member(&args.name, member_address).await?.0);
            Ok(())
        }
        (None, None) => {
            let exe = std::env::current_exe().context("locating the ringctl executable")?;
            let dir = args.ring.dir.dir();
            let status = bootstrap::join(
                &dir,
                &args.name,
                &exe.with_file_name("ringd"),
                Duration::from_secs(args.timeout),
            )
            .await?;
            print(&status, format, || {
                let kc = bootstrap::RingLayout { dir: dir.clone() }.kubeconfig(&args.name);
                format!(
                    "{} joined\n\n{}\nkubeconfig: kubectl --kubeconfig {} get namespaces\n",
                    args.name,
                    ringd::status::render(&status),
                    kc.display()
                )
            })
        }
        (None, Some(_)) => anyhow::bail!(
            "--address names a remote ring: give the new member's --member-address too"
        ),
    }
}

async fn images(cmd: images::ImagesCommand, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    images::run(cmd, format).await
}

async fn manifests(args: manifests::ManifestsArgs) -> anyhow::Result<()> {
    init_tracing("warn");
    print!("{}", manifests::render(&args)?);
    Ok(())
}

async fn migrate(args: MigrateArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let (address, pki) = args.ring.target()?;
    let mut client = ringd::client::AdminClient::connect_leader(&address, &pki).await?;
    let id = client.migrate(&args.shoot, &args.to).await?;
    eprintln!("migration {id}: {} to {}", args.shoot, args.to);
    let op = client
        .wait_operation(id, Duration::from_secs(args.timeout), |op, t| {
            eprintln!("  {:>6.1}s  {:?}: {}", t.as_secs_f64(), op.step, op.detail)
        })
        .await?;
    if op.step == ringd::state::OperationStep::Failed {
        anyhow::bail!("migration {id} failed: {}", op.detail);
    }
    print(&op, format, || {
        format!("{} now runs on {}: {}\n", args.shoot, args.to, op.detail)
    })
}

async fn leave(args: LeaveArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    if args.ring.address.is_none() {
        let status = bootstrap::leave(&args.ring.dir.dir(), &args.name).await?;
        return print(&status, format, || {
            format!("{} left\n\n{}", args.name, ringd::status::render(&status))
        });
    }
    let (address, pki) = args.ring.target()?;
    let mut client = ringd::client::AdminClient::connect_leader(&address, &pki).await?;
    println!("{}", client.remove_member(&args.name).await?);
    Ok(())
}

async fn backup(cmd: crate::backup::BackupCommand, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let shutdown = if cmd.runs_until_stopped() {
        shutdown_on_signals()?
    } else {
        CancellationToken::new()
    };
    Ok(crate::backup::run(cmd, format, shutdown).await?)
}

async fn drill_run(args: DrillRunArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
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

async fn restore(args: RestoreArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let config = read_ring_config(args.config.as_deref())?;
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let opts = bootstrap::restore::RestoreOptions {
        config,
        bucket_url: args.from_bucket,
        dir: args.dir.dir(),
        ringd: exe.with_file_name("ringd"),
        timeout: Duration::from_secs(args.timeout),
    };
    let report = {
        let progress = bootstrap::TerminalProgress::default();
        bootstrap::restore::restore(&opts, &progress).await?
    };
    print(&report, format, || bootstrap::restore::render(&report))
}

async fn bench_backup(args: crate::backup::BenchArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    Ok(crate::backup::bench(args, exe, format).await?)
}

async fn bench_failover(args: FailoverBenchArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let dir = crate::bench::temp_state_dir();
    let result = crate::bench::failover::failover_bench(
        &dir,
        &exe.with_file_name("ringd"),
        args.common.base_port,
        args.common.objects,
        args.common.runs,
        args.rate,
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    print(&result, format, || crate::bench::failover::render(&result))
}

async fn bench_migrate(args: MigrateBenchArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let dir = crate::bench::temp_state_dir();
    let result = crate::bench::migrate::migrate_bench(
        &dir,
        &exe.with_file_name("ringd"),
        args.base_port,
        args.objects,
        args.runs,
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    print(&result, format, || crate::bench::migrate::render(&result))
}

async fn bench_bootstrap(args: BootstrapBenchArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let dir = crate::bench::temp_state_dir();
    let result = bootstrap::bench::bootstrap_bench(
        &dir,
        &args.sizes,
        &exe.with_file_name("ringd"),
        args.base_port,
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    print(&result, format, || bootstrap::bench::render(&result))
}

async fn bench_raft(args: RaftBenchArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let exe = std::env::current_exe().context("locating the ringctl executable")?;
    let opts = crate::bench::RaftBenchOptions {
        sizes: args.sizes,
        proposals: args.proposals,
        kills: args.kills,
        idle_secs: args.idle_secs,
        ringd: exe.with_file_name("ringd"),
        dir: crate::bench::temp_state_dir(),
    };
    let result = crate::bench::raft(&opts).await;
    let _ = std::fs::remove_dir_all(&opts.dir);
    let result = result?;
    print(&result, format, || crate::bench::render_raft(&result))
}

async fn bench_controlplane(args: BenchArgs, format: Format) -> anyhow::Result<()> {
    init_tracing("warn");
    let opts = crate::bench::BenchOptions {
        runs: args.runs,
        seed: SeedOptions {
            state_dir: crate::bench::temp_state_dir(),
            bin_dir: args.bin_dir,
        },
        settle: Duration::from_secs(args.settle),
    };
    let result = crate::bench::controlplane(&opts).await;
    let _ = std::fs::remove_dir_all(&opts.seed.state_dir);
    let result = result?;
    print(&result, format, || crate::bench::render(&result))
}
