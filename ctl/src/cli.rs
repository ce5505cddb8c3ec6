//! The command line: every subcommand, flag and argument of `ringctl` (clap).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use anyhow::Context;

use crate::controlplane::SeedOptions;
use crate::output::Format;
use crate::{images, manifests};

#[derive(Parser)]
#[command(
    name = "ringctl",
    version,
    about = "Operate Ring: clusters that host each other's control planes"
)]
pub(crate) struct Cli {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, global = true)]
    pub(crate) output: Format,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Host a shoot's control plane on this machine (a local seed).
    #[command(subcommand)]
    Controlplane(ControlPlaneCommand),
    /// Measure Ring.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Create a self-hosting ring from nothing (or resume / report an existing one).
    Bootstrap(BootstrapArgs),
    /// Stop every member of a local ring; all data stays for the next bootstrap.
    Down(DownArgs),
    /// The ring's members, leader, placements, leases and operations, as one ringd sees them.
    Status(RingArgs),
    /// One thing of the ring in full, where `ringctl status` shows a line of it.
    #[command(subcommand)]
    Describe(DescribeCommand),
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
    Backup(crate::backup::BackupCommand),
    /// Chaos drills: run drill files (scenarios/drills/*.yaml) against throwaway local rings.
    #[command(subcommand)]
    Drill(DrillCommand),
    /// Disaster recovery: rebuild a lost local ring (every member and control plane) from its bucket.
    Restore(RestoreArgs),
    /// Container images built on this machine from local binaries (no registry): build, list,
    /// import into a containerd.
    #[command(subcommand)]
    Images(images::ImagesCommand),
    /// Versions: ringctl's, the pinned Kubernetes, etcd and containerd, what the programs on
    /// this machine say, and each shoot's and node's of the local ring in --ring-dir.
    Version(RingDirArgs),
    /// The reference pages generated from the code (CLI, config kinds, metrics,
    /// status JSON), and the check CI runs on the book's pages and links.
    #[command(subcommand)]
    Docs(crate::docs::DocsCommand),
}

#[derive(Subcommand)]
pub(crate) enum DescribeCommand {
    /// A failover or migration: what it moves, its whole detail, the time it
    /// spent in each step and what its target measured (restore, verification,
    /// what clients may have lost).
    Operation(DescribeOperationArgs),
}

#[derive(Args)]
pub(crate) struct DescribeOperationArgs {
    /// The operation's number: the OP column of `ringctl status`.
    pub(crate) id: u64,
    #[command(flatten)]
    pub(crate) ring: RingArgs,
}

#[derive(Subcommand)]
pub(crate) enum DrillCommand {
    /// Run drills; each run prints a summary and writes a JSON result and an HTML report.
    Run(DrillRunArgs),
    /// Figures over the JSON results of many runs (report folders, searched
    /// recursively): per drill and build, runs passed, the outages' ranges,
    /// writes lost, double serving; exits non-zero when a run failed.
    Summary(DrillSummaryArgs),
    /// A member machine of a local ring dies as a whole, by hand: kill -9 of its
    /// ringd, every control-plane process it runs and its shoot's nodes
    /// (ring-node, containerd, kubelet, kube-proxy, every shim and pod).
    /// `ringctl bootstrap` brings the machine back.
    KillMachine(KillMachineArgs),
}

#[derive(Args)]
pub(crate) struct KillMachineArgs {
    /// The member whose machine dies.
    pub(crate) member: String,
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
}

#[derive(Args)]
pub(crate) struct DrillSummaryArgs {
    /// Report folders (or result files) of `ringctl drill run`.
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
}

#[derive(Args)]
pub(crate) struct DrillRunArgs {
    /// Drill files.
    #[arg(required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// Runs of each drill.
    #[arg(long, default_value_t = 1)]
    pub(crate) repeat: usize,
    /// RNG seed (overrides the drill files'; run i uses SEED+i-1).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Where the JSON results and HTML reports go.
    #[arg(long, default_value = "drill-reports")]
    pub(crate) report_dir: PathBuf,
    /// Keep each run's ring, bucket and logs (in the temp dir) for inspection.
    #[arg(long)]
    pub(crate) keep: bool,
}

#[derive(Args)]
pub(crate) struct RestoreArgs {
    /// The lost ring's bucket URL (file:///..., s3://..., gs://..., az://...).
    #[arg(long = "from-bucket")]
    pub(crate) from_bucket: String,
    /// The lost ring's config (members, ports) [default: the one in the ring dir].
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
    /// Seconds the whole restore may take.
    #[arg(long, default_value_t = 600)]
    pub(crate) timeout: u64,
    /// Your copy of the key the lost ring sealed its bucket with (the
    /// bucket.key bootstrap generated in the lost ring dir).
    #[arg(long = "bucket-key")]
    pub(crate) bucket_key: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct DownArgs {
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
    /// Seconds each ringd gets to stop its control planes after SIGTERM
    /// before SIGKILL (nodes get at least 60).
    #[arg(long, default_value_t = 60)]
    pub(crate) grace: u64,
}

#[derive(Args, Clone)]
pub(crate) struct RingDirArgs {
    /// The local ring's state dir [default: $RING_DIR, else ~/.local/share/ring/ring].
    #[arg(long = "ring-dir", env = "RING_DIR")]
    pub(crate) ring_dir: Option<PathBuf>,
}

impl RingDirArgs {
    pub(crate) fn dir(&self) -> PathBuf {
        self.ring_dir.clone().unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            PathBuf::from(home).join(".local/share/ring/ring")
        })
    }
}

#[derive(Args)]
pub(crate) struct BootstrapArgs {
    /// The Ring config (kind: Ring) [default: the one in the ring dir, else 3 local members].
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
    /// Seconds the whole bootstrap may take.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout: u64,
    /// Leave a new ring's bucket unsealed when its config names no key
    /// (by default bootstrap generates one: <ring-dir>/bucket.key).
    #[arg(long)]
    pub(crate) no_bucket_key: bool,
}

#[derive(Args, Clone)]
pub(crate) struct RingArgs {
    /// host:port of one ringd [default: every member of the local ring in --ring-dir, in turn].
    #[arg(long, env = "RING_ADDRESS")]
    pub(crate) address: Option<String>,
    /// The ring's PKI directory (ca.crt, ringctl.crt, ringctl.key) [default: <ring-dir>/pki].
    #[arg(long, env = "RING_PKI")]
    pub(crate) pki: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
}

impl RingArgs {
    /// The addresses to ask and the PKI to use: `--address`, else every
    /// member of the local ring in `--ring-dir` (any of them may be down).
    pub(crate) fn targets(&self) -> anyhow::Result<(Vec<String>, PathBuf)> {
        let layout = bootstrap::RingLayout {
            dir: self.dir.dir(),
        };
        let pki = self.pki.clone().unwrap_or_else(|| layout.pki());
        if let Some(a) = &self.address {
            return Ok((vec![a.clone()], pki));
        }
        let config = layout
            .read_config()?
            .with_context(|| format!("no --address given and {} holds no ring; run `ringctl bootstrap` or pass --address", layout.dir.display()))?;
        Ok((config.member_addresses(), pki))
    }

    /// A connection to the ring's leader, found through whichever target answers.
    pub(crate) async fn leader(&self) -> anyhow::Result<ringd::client::AdminClient> {
        let (addresses, pki) = self.targets()?;
        Ok(ringd::client::AdminClient::connect_leader_of(&addresses, &pki).await?)
    }

    /// The status of the member at `--address`, else the ring's as whichever
    /// member of the local ring answers sees it (preferring the leader's view).
    pub(crate) async fn status(&self) -> anyhow::Result<ringd::status::RingStatus> {
        let (addresses, pki) = self.targets()?;
        if let [address] = &addresses[..] {
            if self.address.is_some() {
                let mut client = ringd::client::AdminClient::connect(address, &pki)?;
                return Ok(client.status().await?);
            }
        }
        Ok(ringd::client::AdminClient::ring_status(&addresses, &pki).await?)
    }

    /// The local ring in `--ring-dir` (none with `--address`, or without a ring there).
    pub(crate) fn local_ring(
        &self,
    ) -> anyhow::Result<Option<(bootstrap::RingLayout, bootstrap::config::RingConfig)>> {
        if self.address.is_some() {
            return Ok(None);
        }
        let layout = bootstrap::RingLayout {
            dir: self.dir.dir(),
        };
        Ok(layout.read_config()?.map(|config| (layout, config)))
    }

    /// Where the control planes of the local ring run (none with `--address`).
    pub(crate) fn local_hosting(
        &self,
        status: &ringd::status::RingStatus,
    ) -> anyhow::Result<Vec<bootstrap::selfhost::Hosting>> {
        Ok(self
            .local_ring()?
            .map_or_else(Vec::new, |(layout, config)| {
                bootstrap::selfhost::hosting(&layout, &config, status)
            }))
    }

    /// The nodes of the local ring in `--ring-dir` (none with `--address`).
    pub(crate) fn local_nodes(&self) -> anyhow::Result<Vec<bootstrap::nodes::NodeReport>> {
        Ok(self
            .local_ring()?
            .map_or_else(Vec::new, |(layout, config)| {
                bootstrap::nodes::report(&layout, &config)
            }))
    }
}

/// `ringctl status`: the ring as one ringd (the leader, when it answers)
/// sees it, and the local ring's nodes and control planes.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub(crate) struct StatusView {
    #[serde(flatten)]
    pub(crate) status: ringd::status::RingStatus,
    /// The local ring's nodes (a ring in --ring-dir with nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<bootstrap::nodes::NodeReport>,
    /// Where each control plane runs (pods or processes), for a local ring.
    #[serde(
        rename = "controlPlanes",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub(crate) control_planes: Vec<bootstrap::selfhost::Hosting>,
}

#[derive(Subcommand)]
pub(crate) enum PkiCommand {
    /// Create the CA (unless present), member certificates and the admin certificate.
    Init(PkiInitArgs),
    /// When every certificate expires: each member's (ring CA, member, the PKI of
    /// the control planes it hosts), ringctl's and the shoots' kubeconfigs; exits
    /// non-zero when one is expired, expires within 30 days or cannot be checked.
    Check(RingArgs),
    /// Issue new member certificates (and ringctl's) from the ring CA for a
    /// local ring; each running ringd serves and calls with its new one
    /// within seconds, without a restart or a lost quorum. Each shoot's
    /// published kubeconfig gets a new client certificate from its shoot's
    /// CA, replacing the old one once the shoot's API accepted it, and each
    /// node a new kube-proxy certificate, which it takes without a restart.
    Renew(PkiRenewArgs),
    /// Replace the ring CA online (local ring): trust a new CA next to the old
    /// one, issue every member's and ringctl's certificate from it, then retire
    /// the old one; each step waits for every member, and a rerun resumes.
    RotateCa(PkiRotateArgs),
}

#[derive(Args)]
pub(crate) struct PkiRotateArgs {
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
    /// Seconds to wait for the members at each step before giving up (a
    /// rerun resumes).
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout: u64,
}

#[derive(Args)]
pub(crate) struct PkiRenewArgs {
    #[command(flatten)]
    pub(crate) dir: RingDirArgs,
    /// Renew the certificates that expire within this many days.
    #[arg(long, default_value_t = 30)]
    pub(crate) within_days: i64,
    /// Renew every member certificate, ringctl's, every published
    /// kubeconfig and every node's kube-proxy certificate, whatever their
    /// expiry.
    #[arg(long)]
    pub(crate) all: bool,
}

#[derive(Args)]
pub(crate) struct PkiInitArgs {
    /// Where the PKI lives.
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// A member as NAME=IP (repeatable).
    #[arg(long = "member", value_parser = parse_member)]
    pub(crate) members: Vec<(String, std::net::IpAddr)>,
}

pub(crate) fn parse_member(s: &str) -> Result<(String, std::net::IpAddr), String> {
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
pub(crate) struct JoinArgs {
    /// The new member's name.
    pub(crate) name: String,
    /// host:port of the new member's ringd (a ring run elsewhere). Without it, the
    /// member is created, started and added to the local ring in --ring-dir.
    #[arg(long = "member-address")]
    pub(crate) member_address: Option<String>,
    /// Seconds to wait for the new member's control plane (local ring).
    #[arg(long, default_value_t = 180)]
    pub(crate) timeout: u64,
    #[command(flatten)]
    pub(crate) ring: RingArgs,
}

#[derive(Args)]
pub(crate) struct MigrateArgs {
    /// The shoot whose control plane moves.
    pub(crate) shoot: String,
    /// The member (seed) that hosts it afterwards.
    #[arg(long)]
    pub(crate) to: String,
    /// Seconds to wait for the migration.
    #[arg(long, default_value_t = 180)]
    pub(crate) timeout: u64,
    #[command(flatten)]
    pub(crate) ring: RingArgs,
}

#[derive(Args)]
pub(crate) struct LeaveArgs {
    /// The member to remove.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) ring: RingArgs,
}

#[derive(Subcommand)]
pub(crate) enum ControlPlaneCommand {
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
pub(crate) enum BenchCommand {
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
    /// Full snapshot speed and memory vs etcdctl, restore of full + deltas vs etcdutl, backup lag.
    Backup(crate::backup::BenchArgs),
    /// Restore of a large full snapshot + many delta events, verified, vs etcdutl restoring the full.
    Restore(crate::backup::RestoreBenchArgs),
}

#[derive(Args)]
pub(crate) struct MigrateBenchArgs {
    /// ConfigMaps (1 KiB each) written into the moved control plane first.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) objects: usize,
    /// Moves to time.
    #[arg(long, default_value_t = 5)]
    pub(crate) runs: usize,
    /// First port of the throwaway ring.
    #[arg(long, default_value_t = 27300)]
    pub(crate) base_port: u16,
}

#[derive(Args)]
pub(crate) struct FailoverBenchArgs {
    #[command(flatten)]
    pub(crate) common: MigrateBenchArgs,
    /// ConfigMap creates per second during each failover (the RPO load); 0 for none.
    #[arg(long, default_value_t = 100)]
    pub(crate) rate: u64,
    /// Seed kinds to measure, one ring each, side by side (`kubernetes`: m1's
    /// seed a cluster with one node, run by the bench; `self`: the self-hosted
    /// ring, every control plane in pods, each run killing a whole machine;
    /// both need `ringctl images build`).
    #[arg(long, value_delimiter = ',', default_value = "local")]
    pub(crate) seeds: Vec<crate::bench::failover::SeedKind>,
    /// How the shoots' etcd is protected, one ring each, side by side
    /// (`backup`: restore from the bucket; `standby`: promote a hot standby,
    /// local seeds only).
    #[arg(long, value_delimiter = ',', default_value = "backup")]
    pub(crate) protection: Vec<crate::bench::failover::ProtectionArg>,
    /// The rings' failure window in ms (the leader declares a silent member
    /// down after it; default: the ring's default). Heartbeats then come
    /// every third of it at most.
    #[arg(long)]
    pub(crate) failure_window_ms: Option<u64>,
    /// The rings' lease on each control plane in ms (renewed every third;
    /// default: the ring's default). At least 4 x the election timeout + 1 s.
    #[arg(long)]
    pub(crate) lease_ms: Option<u64>,
    /// The rings' Raft election timeout in ms (default: the ring's default);
    /// a shorter one allows a shorter lease.
    #[arg(long)]
    pub(crate) election_timeout_ms: Option<u64>,
    /// Keep each ring's dir when the benchmark ends (ringd logs, the nodes'
    /// pod logs, the bucket), to find out where a slow run's time went;
    /// the path is printed. Remove it by hand afterwards.
    #[arg(long)]
    pub(crate) keep: bool,
}

#[derive(Args)]
pub(crate) struct BootstrapBenchArgs {
    /// Ring sizes.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    pub(crate) sizes: Vec<usize>,
    /// Where the control planes end up: `self` (every member hosts its
    /// successor as pods on its own node) and `processes` (as processes next
    /// to ringd; nodes too), each measured in the same run.
    #[arg(long, value_delimiter = ',', default_value = "self,processes")]
    pub(crate) hosting: Vec<crate::bench::bootstrap::Hosting>,
    /// First port of the throwaway rings (members use base+1.., metrics base+101..).
    #[arg(long, default_value_t = 27100)]
    pub(crate) base_port: u16,
}

#[derive(Args)]
pub(crate) struct RaftBenchArgs {
    /// Ring sizes.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    pub(crate) sizes: Vec<usize>,
    /// Sequential proposals per size.
    #[arg(long, default_value_t = 500)]
    pub(crate) proposals: usize,
    /// Leader kills per size.
    #[arg(long, default_value_t = 5)]
    pub(crate) kills: usize,
    /// Seconds over which idle CPU is measured.
    #[arg(long, default_value_t = 10)]
    pub(crate) idle_secs: u64,
}

#[derive(Args, Clone)]
pub(crate) struct SeedArgs {
    /// The seed's state directory [default: $RING_STATE_DIR, else ~/.local/share/ring].
    #[arg(long, env = "RING_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Directory searched first for etcd and the Kubernetes binaries.
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
}

impl SeedArgs {
    pub(crate) fn options(&self) -> SeedOptions {
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
pub(crate) struct ShootArgs {
    /// The shoot whose control plane this is.
    #[arg(long)]
    pub(crate) shoot: String,
    #[command(flatten)]
    pub(crate) seed: SeedArgs,
}

#[derive(Args)]
pub(crate) struct UpArgs {
    #[command(flatten)]
    pub(crate) target: ShootArgs,
    /// Loopback address for a new shoot's API (default: derived from the name).
    #[arg(long)]
    pub(crate) api_address: Option<Ipv4Addr>,
    /// Seconds to wait for /readyz.
    #[arg(long, default_value_t = 180)]
    pub(crate) timeout: u64,
}

#[derive(Args)]
pub(crate) struct StatusArgs {
    /// Only this shoot (default: every shoot on the seed).
    #[arg(long)]
    pub(crate) shoot: Option<String>,
    #[command(flatten)]
    pub(crate) seed: SeedArgs,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) target: ShootArgs,
    /// Loopback address for a new shoot's API (default: derived from the name).
    #[arg(long)]
    pub(crate) api_address: Option<Ipv4Addr>,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Number of runs.
    #[arg(long, default_value_t = 5)]
    pub(crate) runs: usize,
    /// Seconds a ready control plane idles before its memory is read.
    #[arg(long, default_value_t = 5)]
    pub(crate) settle: u64,
    /// Directory searched first for etcd and the Kubernetes binaries.
    #[arg(long)]
    pub(crate) bin_dir: Option<PathBuf>,
}
