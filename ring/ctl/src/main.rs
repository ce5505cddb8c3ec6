//! `ringctl`: the command line of Ring.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use ringd::controlplane::{self, SeedOptions, UpOptions};
use ringd::output::{encode, status_table, Format};
use tokio_util::sync::CancellationToken;

mod images;
mod manifests;

#[derive(Parser)]
#[command(
    name = "ringctl",
    version,
    about = "Operate Ring: clusters that host each other's control planes"
)]
struct Cli {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Host a shoot's control plane on this machine (a local seed).
    #[command(subcommand)]
    Controlplane(ControlPlaneCommand),
    /// Measure Ring.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Create a self-hosting ring from nothing (or resume / report an existing one).
    Bootstrap(BootstrapArgs),
    /// Stop every member of a local ring; all data stays for the next bootstrap.
    Down(RingDirArgs),
    /// The ring's members, leader, placements, leases and operations, as one ringd sees them.
    Status(RingArgs),
    /// Create the ring's CA and certificates (members and the ringctl administrator).
    #[command(subcommand)]
    Pki(PkiCommand),
    /// Add a member (Raft configuration change).
    Join(JoinArgs),
    /// Remove a member (Raft configuration change; refused below 3 members).
    Leave(LeaveArgs),
    /// Move a shoot's control plane to another member (planned migration, no acknowledged write lost).
    Migrate(MigrateArgs),
    /// Kubernetes manifests that run each member's ringd in its own cluster (ServiceAccount,
    /// least-privilege RBAC in the shoot namespaces, ConfigMap, Service, StatefulSet).
    Manifests(manifests::ManifestsArgs),
    /// Back up a shoot's etcd to object storage (full + delta snapshots), list, verify, restore, gc.
    #[command(subcommand)]
    Backup(ringd::backup::BackupCommand),
    /// Chaos drills: run drill files (scenarios/drills/*.yaml) against throwaway local rings.
    #[command(subcommand)]
    Drill(DrillCommand),
    /// Disaster recovery: rebuild a lost local ring (every member and control plane) from its bucket.
    Restore(RestoreArgs),
    /// Container images built on this machine from local binaries (no registry): build, list,
    /// import into a containerd.
    #[command(subcommand)]
    Images(images::ImagesCommand),
}

#[derive(Subcommand)]
enum DrillCommand {
    /// Run drills; each run prints a summary and writes a JSON result and an HTML report.
    Run(DrillRunArgs),
}

#[derive(Args)]
struct DrillRunArgs {
    /// Drill files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Runs of each drill.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// RNG seed (overrides the drill files'; run i uses SEED+i-1).
    #[arg(long)]
    seed: Option<u64>,
    /// Where the JSON results and HTML reports go.
    #[arg(long, default_value = "drill-reports")]
    report_dir: PathBuf,
    /// Keep each run's ring, bucket and logs (in the temp dir) for inspection.
    #[arg(long)]
    keep: bool,
}

#[derive(Args)]
struct RestoreArgs {
    /// The lost ring's bucket URL (file:///..., s3://..., gs://..., az://...).
    #[arg(long = "from-bucket")]
    from_bucket: String,
    /// The lost ring's config (members, ports) [default: the one in the ring dir].
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    dir: RingDirArgs,
    /// Seconds the whole restore may take.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

#[derive(Args, Clone)]
struct RingDirArgs {
    /// The local ring's state dir [default: $RING_DIR, else ~/.local/share/ring/ring].
    #[arg(long = "ring-dir", env = "RING_DIR")]
    ring_dir: Option<PathBuf>,
}

impl RingDirArgs {
    fn dir(&self) -> PathBuf {
        self.ring_dir.clone().unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".local/share/ring/ring")
        })
    }
}

#[derive(Args)]
struct BootstrapArgs {
    /// The Ring config (kind: Ring) [default: the one in the ring dir, else 3 local members].
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    dir: RingDirArgs,
    /// Seconds the whole bootstrap may take.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

#[derive(Args, Clone)]
struct RingArgs {
    /// host:port of any ringd [default: the first member of the local ring in --ring-dir].
    #[arg(long, env = "RING_ADDRESS")]
    address: Option<String>,
    /// The ring's PKI directory (ca.crt, ringctl.crt, ringctl.key) [default: <ring-dir>/pki].
    #[arg(long, env = "RING_PKI")]
    pki: Option<PathBuf>,
    #[command(flatten)]
    dir: RingDirArgs,
}

impl RingArgs {
    /// The address and PKI to use: explicit flags, else the local ring's.
    fn target(&self) -> anyhow::Result<(String, PathBuf)> {
        let layout = bootstrap::RingLayout {
            dir: self.dir.dir(),
        };
        let pki = self.pki.clone().unwrap_or_else(|| layout.pki());
        if let Some(a) = &self.address {
            return Ok((a.clone(), pki));
        }
        let config = layout
            .read_config()?
            .with_context(|| format!("no --address given and {} holds no ring; run `ringctl bootstrap` or pass --address", layout.dir.display()))?;
        Ok((config.member_address(0), pki))
    }

    /// The ring's status from `--address`, else from whichever member of the local
    /// ring answers (preferring one that knows the leader; member 1 may be dead).
    async fn status(&self) -> anyhow::Result<ringd::status::RingStatus> {
        let (address, pki) = self.target()?;
        if self.address.is_some() || self.pki.is_some() {
            let mut client = ringd::client::AdminClient::connect(&address, &pki)?;
            return Ok(client.status().await?);
        }
        let layout = bootstrap::RingLayout {
            dir: self.dir.dir(),
        };
        let config = layout.read_config()?.context("no ring in --ring-dir")?;
        Ok(bootstrap::ring_status(&layout, &config).await?)
    }

    /// The nodes of the local ring in `--ring-dir` (none with `--address`).
    fn local_nodes(&self) -> anyhow::Result<Vec<bootstrap::nodes::NodeReport>> {
        if self.address.is_some() {
            return Ok(Vec::new());
        }
        let layout = bootstrap::RingLayout {
            dir: self.dir.dir(),
        };
        Ok(match layout.read_config()? {
            Some(config) => bootstrap::nodes::report(&layout, &config),
            None => Vec::new(),
        })
    }
}

/// `ringctl status`: the ring as its leader sees it, and the local ring's nodes.
#[derive(serde::Serialize)]
struct StatusView {
    #[serde(flatten)]
    status: ringd::status::RingStatus,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    nodes: Vec<bootstrap::nodes::NodeReport>,
}

#[derive(Subcommand)]
enum PkiCommand {
    /// Create the CA (unless present), member certificates and the admin certificate.
    Init(PkiInitArgs),
}

#[derive(Args)]
struct PkiInitArgs {
    /// Where the PKI lives.
    #[arg(long)]
    dir: PathBuf,
    /// A member as NAME=IP (repeatable).
    #[arg(long = "member", value_parser = parse_member)]
    members: Vec<(String, std::net::IpAddr)>,
}

fn parse_member(s: &str) -> Result<(String, std::net::IpAddr), String> {
    let (name, ip) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=IP"))?;
    seed::validate_shoot_name(name).map_err(|e| e.to_string())?;
    Ok((
        name.to_string(),
        ip.parse().map_err(|e| format!("{ip:?}: {e}"))?,
    ))
}

#[derive(Args)]
struct JoinArgs {
    /// The new member's name.
    name: String,
    /// host:port of the new member's ringd (a ring run elsewhere). Without it, the
    /// member is created, started and added to the local ring in --ring-dir.
    #[arg(long = "member-address")]
    member_address: Option<String>,
    /// Seconds to wait for the new member's control plane (local ring).
    #[arg(long, default_value_t = 180)]
    timeout: u64,
    #[command(flatten)]
    ring: RingArgs,
}

#[derive(Args)]
struct MigrateArgs {
    /// The shoot whose control plane moves.
    shoot: String,
    /// The member (seed) that hosts it afterwards.
    #[arg(long)]
    to: String,
    /// Seconds to wait for the migration.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
    #[command(flatten)]
    ring: RingArgs,
}

#[derive(Args)]
struct LeaveArgs {
    /// The member to remove.
    name: String,
    #[command(flatten)]
    ring: RingArgs,
}

#[derive(Subcommand)]
enum ControlPlaneCommand {
    /// Start the control plane in the background and wait until it is ready.
    Up(UpArgs),
    /// Stop the control plane (its data stays).
    Down(ShootArgs),
    /// Show the control plane(s) and their components.
    Status(StatusArgs),
    /// Run the control plane in the foreground until SIGTERM or Ctrl-C.
    Run(RunArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time from start to /readyz and peak RSS per component (median of N runs).
    Controlplane(BenchArgs),
    /// Raft commit latency (vs etcd), leader-kill recovery, ringd memory and idle CPU.
    Raft(RaftBenchArgs),
    /// Wall time of bootstrap per step and the ring's peak memory.
    Bootstrap(BootstrapBenchArgs),
    /// Planned migration time of a control plane with many objects (median of N moves).
    Migrate(MigrateBenchArgs),
    /// Failover RTO: kill -9 of a seed until the restored control plane answers (median of N).
    Failover(FailoverBenchArgs),
    /// Full snapshot speed and memory vs etcdctl, restore of full + deltas vs etcdctl, backup lag.
    Backup(ringd::backup::BenchArgs),
}

#[derive(Args)]
struct MigrateBenchArgs {
    /// ConfigMaps (1 KiB each) written into the moved control plane first.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Moves to time.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// First port of the throwaway ring.
    #[arg(long, default_value_t = 27300)]
    base_port: u16,
}

#[derive(Args)]
struct FailoverBenchArgs {
    #[command(flatten)]
    common: MigrateBenchArgs,
    /// ConfigMap creates per second during each failover (the RPO load); 0 for none.
    #[arg(long, default_value_t = 100)]
    rate: u64,
}

#[derive(Args)]
struct BootstrapBenchArgs {
    /// Ring sizes.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    sizes: Vec<usize>,
    /// First port of the throwaway rings (members use base+1.., metrics base+101..).
    #[arg(long, default_value_t = 27100)]
    base_port: u16,
}

#[derive(Args)]
struct RaftBenchArgs {
    /// Ring sizes.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    sizes: Vec<usize>,
    /// Sequential proposals per size.
    #[arg(long, default_value_t = 500)]
    proposals: usize,
    /// Leader kills per size.
    #[arg(long, default_value_t = 5)]
    kills: usize,
    /// Seconds over which idle CPU is measured.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
}

#[derive(Args, Clone)]
struct SeedArgs {
    /// The seed's state directory [default: $RING_STATE_DIR, else ~/.local/share/ring].
    #[arg(long, env = "RING_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Directory searched first for etcd and the Kubernetes binaries.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

impl SeedArgs {
    fn options(&self) -> SeedOptions {
        let state_dir = self.state_dir.clone().unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".local/share/ring")
        });
        SeedOptions {
            state_dir,
            bin_dir: self.bin_dir.clone(),
        }
    }
}

#[derive(Args)]
struct ShootArgs {
    /// The shoot whose control plane this is.
    #[arg(long)]
    shoot: String,
    #[command(flatten)]
    seed: SeedArgs,
}

#[derive(Args)]
struct UpArgs {
    #[command(flatten)]
    target: ShootArgs,
    /// Loopback address for a new shoot's API (default: derived from the name).
    #[arg(long)]
    api_address: Option<Ipv4Addr>,
    /// Seconds to wait for /readyz.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
}

#[derive(Args)]
struct StatusArgs {
    /// Only this shoot (default: every shoot on the seed).
    #[arg(long)]
    shoot: Option<String>,
    #[command(flatten)]
    seed: SeedArgs,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    target: ShootArgs,
    /// Loopback address for a new shoot's API (default: derived from the name).
    #[arg(long)]
    api_address: Option<Ipv4Addr>,
}

#[derive(Args)]
struct BenchArgs {
    /// Number of runs.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds a ready control plane idles before its memory is read.
    #[arg(long, default_value_t = 5)]
    settle: u64,
    /// Directory searched first for etcd and the Kubernetes binaries.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

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

async fn run(cli: Cli) -> anyhow::Result<()> {
    let format = cli.output;
    match cli.command {
        Command::Controlplane(ControlPlaneCommand::Up(args)) => {
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
        Command::Controlplane(ControlPlaneCommand::Down(args)) => {
            init_tracing("warn");
            let status = controlplane::down(&args.seed.options(), &args.shoot).await?;
            print(&status, format, || {
                format!(
                    "control plane of shoot {} stopped; its data is kept in place\n",
                    status.shoot
                )
            })
        }
        Command::Controlplane(ControlPlaneCommand::Status(args)) => {
            init_tracing("warn");
            let statuses =
                controlplane::status(&args.seed.options(), args.shoot.as_deref()).await?;
            print(&statuses, format, || {
                if statuses.is_empty() {
                    "no control planes on this seed\n".into()
                } else {
                    status_table(&statuses)
                }
            })
        }
        Command::Controlplane(ControlPlaneCommand::Run(args)) => {
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
        Command::Bootstrap(args) => {
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
        Command::Down(args) => {
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
        Command::Status(args) => {
            init_tracing("warn");
            let status = args.status().await?;
            let nodes = args.local_nodes()?;
            let view = StatusView { status, nodes };
            print(&view, format, || {
                ringd::status::render(&view.status) + &bootstrap::nodes::render(&view.nodes)
            })
        }
        Command::Pki(PkiCommand::Init(args)) => {
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
        Command::Join(args) => {
            init_tracing("warn");
            match (&args.member_address, &args.ring.address) {
                (Some(member_address), _) => {
                    let (address, pki) = args.ring.target()?;
                    let mut client =
                        ringd::client::AdminClient::connect_leader(&address, &pki).await?;
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
        Command::Images(cmd) => {
            init_tracing("warn");
            images::run(cmd, format).await
        }
        Command::Manifests(args) => {
            init_tracing("warn");
            print!("{}", manifests::render(&args)?);
            Ok(())
        }
        Command::Migrate(args) => {
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
        Command::Leave(args) => {
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
        Command::Backup(cmd) => {
            init_tracing("warn");
            let shutdown = if cmd.runs_until_stopped() {
                shutdown_on_signals()?
            } else {
                CancellationToken::new()
            };
            Ok(ringd::backup::run(cmd, format, shutdown).await?)
        }
        Command::Drill(DrillCommand::Run(args)) => {
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
        Command::Restore(args) => {
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
        Command::Bench(BenchCommand::Backup(args)) => {
            init_tracing("warn");
            let exe = std::env::current_exe().context("locating the ringctl executable")?;
            Ok(ringd::backup::bench(args, exe, format).await?)
        }
        Command::Bench(BenchCommand::Failover(args)) => {
            init_tracing("warn");
            let exe = std::env::current_exe().context("locating the ringctl executable")?;
            let dir = ringd::bench::temp_state_dir();
            let result = bootstrap::failover_bench::failover_bench(
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
            print(&result, format, || {
                bootstrap::failover_bench::render(&result)
            })
        }
        Command::Bench(BenchCommand::Migrate(args)) => {
            init_tracing("warn");
            let exe = std::env::current_exe().context("locating the ringctl executable")?;
            let dir = ringd::bench::temp_state_dir();
            let result = bootstrap::migrate_bench::migrate_bench(
                &dir,
                &exe.with_file_name("ringd"),
                args.base_port,
                args.objects,
                args.runs,
            )
            .await;
            let _ = std::fs::remove_dir_all(&dir);
            let result = result?;
            print(&result, format, || {
                bootstrap::migrate_bench::render(&result)
            })
        }
        Command::Bench(BenchCommand::Bootstrap(args)) => {
            init_tracing("warn");
            let exe = std::env::current_exe().context("locating the ringctl executable")?;
            let dir = ringd::bench::temp_state_dir();
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
        Command::Bench(BenchCommand::Raft(args)) => {
            init_tracing("warn");
            let exe = std::env::current_exe().context("locating the ringctl executable")?;
            let opts = ringd::bench::RaftBenchOptions {
                sizes: args.sizes,
                proposals: args.proposals,
                kills: args.kills,
                idle_secs: args.idle_secs,
                ringd: exe.with_file_name("ringd"),
                dir: ringd::bench::temp_state_dir(),
            };
            let result = ringd::bench::raft(&opts).await;
            let _ = std::fs::remove_dir_all(&opts.dir);
            let result = result?;
            print(&result, format, || ringd::bench::render_raft(&result))
        }
        Command::Bench(BenchCommand::Controlplane(args)) => {
            init_tracing("warn");
            let opts = ringd::bench::BenchOptions {
                runs: args.runs,
                seed: SeedOptions {
                    state_dir: ringd::bench::temp_state_dir(),
                    bin_dir: args.bin_dir,
                },
                settle: Duration::from_secs(args.settle),
            };
            let result = ringd::bench::controlplane(&opts).await;
            let _ = std::fs::remove_dir_all(&opts.seed.state_dir);
            let result = result?;
            print(&result, format, || ringd::bench::render(&result))
        }
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
