//! Running a drill: a throwaway local ring under a temp dir, the workload, an
//! observer (ring status, leader changes, operation steps, and a double-serving
//! checker polling every seed's processes), the faults in order, convergence,
//! and the final check of every acknowledged write.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bootstrap::config::{MemberSpec, Ports, RingConfig};
use bootstrap::{BootstrapOptions, RingLayout};
use ringd::state::{OperationKind, OperationStep};
use ringd::status::RingStatus;
use tokio_util::sync::CancellationToken;

use crate::drill::{Action, BucketKind, Drill, Hosting, NetworkKind, Step, Target, When};
use crate::kube_seeds::KubeSeeds;
use crate::lost::{account, Lost};
use crate::netns::Network;
use crate::procs;
use crate::result::{
    intervals, rto, verdict, DoubleServing, Event, EventKind, LossPoint, RunResult, ShootFigures,
};
use crate::rng::Rng;
use crate::s3::S3Server;
use crate::workload::{read_back, Probes, Writers};
use crate::ScenarioError;

/// How members are isolated in drills on `network: loopback`.
pub const ISOLATION: &str =
    "loopback: members share the host's network namespace; every shoot has its own 127.x address";

/// Where the runner finds its binaries and puts its temp dirs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The ringd binary started for each member.
    pub ringd: PathBuf,
    /// The ringctl binary (`ringctl restore --from-bucket` runs through it).
    pub ringctl: PathBuf,
    /// Parent of the run's temp dir.
    pub work_dir: PathBuf,
    /// Keep the run's temp dir (ring, bucket, logs) for inspection.
    pub keep: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ScenarioError {
    let what = what.into();
    move |source| ScenarioError::Io { what, source }
}

/// A port base with free member and metrics ports (base+1..=base+7, base+101..=base+107),
/// below the ephemeral range so outgoing connections cannot take them meanwhile.
pub fn free_port_base(salt: u64) -> Result<u16, ScenarioError> {
    let seed = u64::from(std::process::id()) << 20 ^ (now_ms() % 1_000_000) ^ salt;
    for attempt in 0..500u64 {
        let base = 20_000 + (seed.wrapping_add(attempt.wrapping_mul(7919)) % 12_000) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if (1..=7).all(|i| free(base + i) && free(base + 100 + i)) {
            return Ok(base);
        }
    }
    Err(ScenarioError::Setup(
        "no free port range for the drill's ring".into(),
    ))
}

/// Whether the ring is back to its shape: every member up and hosting its
/// successor's ready control plane, no operation open.
pub fn converged(s: &RingStatus, members: &[String]) -> bool {
    let n = members.len();
    s.leader.is_some()
        && members.iter().all(|m| {
            s.members
                .iter()
                .any(|x| x.name == *m && x.state == ringd::state::MemberState::Up)
        })
        && s.operations.iter().all(|o| o.step.is_finished())
        && (0..n).all(|i| {
            let shoot = &members[(i + 1) % n];
            s.placements
                .iter()
                .any(|p| p.shoot == *shoot && p.host == members[i] && p.ready == Some(true))
        })
}

fn step_rank(s: OperationStep) -> Option<Step> {
    match s {
        OperationStep::WaitingForLeaseExpiry => Some(Step::WaitingForLeaseExpiry),
        OperationStep::Pending => Some(Step::Pending),
        OperationStep::Restoring => Some(Step::Restoring),
        OperationStep::Done => Some(Step::Done),
        OperationStep::Failed => None,
    }
}

/// Whether a failover created at or after `since_ms` reached `step` (or later).
pub fn failover_reached(s: &RingStatus, since_ms: u64, step: Step) -> bool {
    s.operations.iter().any(|o| {
        matches!(o.kind, OperationKind::Failover { .. })
            && o.created_at_ms + 1000 >= since_ms
            && step_rank(o.step).is_some_and(|r| r >= step)
    })
}

struct Quiet;
impl bootstrap::Progress for Quiet {
    fn step(&self, _: &str) {}
    fn finished(&self, _: &str, _: Duration) {}
}

/// The newest durable revision of `shoot` in the bucket and the age of the
/// newest object (seconds), from the bucket listing alone. While the bucket is
/// unreachable (an outage) this retries until `deadline`: a killed seed cannot
/// add anything meanwhile, so the listing afterwards is what was durable.
async fn durable(
    bucket: &backup::BucketConfig,
    shoot: &str,
    deadline: Instant,
) -> (Option<i64>, Option<f64>) {
    loop {
        if let Ok(b) = backup::Bucket::open(bucket, shoot, false) {
            if let Ok(c) = b.catalog().await {
                let newest = c.entries().map(|e| e.time_ms).max();
                return (
                    c.latest_revision(),
                    newest.map(|ms| (now_ms() as i64 - ms).max(0) as f64 / 1000.0),
                );
            }
        }
        if Instant::now() >= deadline {
            return (None, None);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct Run<'a> {
    drill: &'a Drill,
    opts: &'a RunOptions,
    members: Vec<String>,
    config: RingConfig,
    config_file: PathBuf,
    layout: RingLayout,
    bucket: backup::BucketConfig,
    bucket_dir: PathBuf,
    t0: Instant,
    deadline: Instant,
    rng: Rng,
    last_killed: Option<String>,
    /// When the newest kill (killSeed, loseRing, partition) happened (ms since the Unix epoch).
    last_kill_ms: u64,
    /// The member the newest partition cut off.
    last_partitioned: Option<String>,
    /// The drill network (`ring.network: namespaces`).
    network: Option<Arc<Network>>,
    losses: BTreeMap<String, Vec<LossPoint>>,
    s3: Option<SharedS3>,
    /// Seed clusters of the Kubernetes members.
    kube_seeds: KubeSeeds,
    say: &'a (dyn Fn(&str) + Sync),
}

mod faults;
mod observer;
mod setup;
mod steps;
use observer::{host_of, hosted_by, leader_view, Observer};
use setup::{start_bucket, SharedS3, Teardown};

impl Run<'_> {
    fn t(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn bootstrap_options(&self, config: Option<RingConfig>) -> BootstrapOptions {
        BootstrapOptions {
            config,
            dir: self.layout.dir.clone(),
            ringd: self.opts.ringd.clone(),
            timeout: self.remaining().min(bootstrap_bound(self.drill)),
            generate_bucket_key: true,
        }
    }
}

/// How long `ringctl bootstrap` may take: the self-hosted ring starts nodes
/// and moves every control plane into pods.
fn bootstrap_bound(drill: &Drill) -> Duration {
    match drill.ring.hosting {
        // two planned moves per member, then its node: 600 s for 3 or 4
        Hosting::SelfHosted => Duration::from_secs(150 * drill.ring.members.max(4) as u64),
        Hosting::Processes => Duration::from_secs(300),
    }
}

/// At most the first 16 bytes of a drill's name (names are ASCII DNS labels),
/// without a trailing '-'.
fn short_name(name: &str) -> &str {
    name.get(..16).unwrap_or(name).trim_end_matches('-')
}

/// Runs one drill on a fresh ring; `run` numbers it, `seed` seeds its RNG, `say`
/// gets progress lines. The ring and its temp dir are gone when this returns.
pub async fn run(
    drill: &Drill,
    run: usize,
    seed: u64,
    opts: &RunOptions,
    say: &(dyn Fn(&str) + Sync),
) -> Result<RunResult, ScenarioError> {
    drill.validate()?;
    let (dir, layout) = steps::sandbox(drill, opts)?;
    let mut teardown = Teardown {
        dir: dir.clone(),
        layout: layout.clone(),
        keep: opts.keep,
        node_network: None,
    };
    let members = drill.members();
    let bucket_dir = dir.join("bucket");
    std::fs::create_dir_all(&bucket_dir).map_err(io("creating the bucket folder"))?;
    let bucket_url = match drill.ring.bucket {
        BucketKind::S3 => crate::s3::url(),
        BucketKind::File => format!("file://{}", bucket_dir.display()),
    };
    // members in their own network namespaces, shoot APIs forwarded into them
    let forwarding = CancellationToken::new();
    let _forwarding = forwarding.clone().drop_guard();
    let net_seed = (seed ^ run as u64) as u8;
    let (network, own_placed) =
        steps::drill_network(drill, &members, net_seed, &forwarding).await?;
    let isolation = network
        .as_ref()
        .map_or_else(|| ISOLATION.to_string(), |n| n.describe());
    if !drill.ring.kubernetes_members.is_empty() {
        say(&format!(
            "drill {} run {run}: starting a seed cluster (control plane and one node) per Kubernetes member",
            drill.name
        ));
    }
    let (kube_seeds, kube_specs) =
        KubeSeeds::start(&dir, drill, &opts.ringd, network.as_deref()).await?;
    let ports = Ports {
        address: "127.0.0.1".into(),
        base: free_port_base(seed ^ run as u64)?,
    };
    let config = steps::ring_config(drill, &kube_specs, network.as_deref(), &bucket_url, ports);
    let (bucket, s3) = start_bucket(drill, &dir, &layout, &config, &mut teardown)?;
    if !own_placed.is_empty() {
        let follow = setup::follow_placements(
            layout.clone(),
            config.clone(),
            own_placed,
            forwarding.clone(),
        );
        tokio::spawn(follow);
    }
    let config_file = dir.join("ring.yaml");
    let yaml = serde_yaml::to_string(&config).map_err(|e| ScenarioError::Setup(e.to_string()))?;
    std::fs::write(&config_file, yaml).map_err(io("writing ring.yaml"))?;
    say(&format!(
        "drill {} run {run} (seed {seed}): bootstrapping ring {} in {}",
        drill.name,
        members.join(" "),
        dir.display()
    ));
    let setup_secs = steps::bootstrap_ring(drill, opts, &layout, &config).await?;
    // the kubeconfigs as the ring first published them: they must keep working
    let shoots = steps::keep_kubeconfigs(&dir, &layout, &members)?;

    let rng = Rng::new(seed);
    let t0 = Instant::now();
    let started_at_ms = now_ms();
    // where pods run: the Kubernetes members' seed nodes and the ring's own nodes
    let mut pod_nodes = kube_seeds.pod_nodes();
    pod_nodes.extend(bootstrap::nodes::pod_cgroup_roots(&layout, &config));
    let obs = Observer::start(
        layout.dir.clone(),
        pod_nodes,
        layout.clone(),
        config.clone(),
        t0,
    );
    let probes = Probes::start(&shoots, Duration::from_millis(250), t0);
    let writers = Writers::start(&shoots, &drill.workload, &rng.fork(1), t0);
    let mut r = Run {
        drill,
        opts,
        members: members.clone(),
        config,
        config_file,
        layout,
        bucket,
        bucket_dir,
        t0,
        deadline: t0 + Duration::from_secs(drill.expect.deadline_secs),
        rng: rng.fork(2),
        last_killed: None,
        last_kill_ms: started_at_ms,
        last_partitioned: None,
        network,
        losses: BTreeMap::new(),
        s3,
        kube_seeds,
        say,
    };
    let faults = r.inject_faults(&obs).await;
    let mut failures = faults.failures;
    let converged_secs = if failures.is_empty() {
        let c = r.await_convergence(&obs, &probes, faults.last_t).await;
        tokio::time::sleep(drill.workload.cooldown).await;
        c
    } else {
        None
    };
    r.push_notable_logs(&obs, started_at_ms);
    let logs = writers.stop().await;
    let samples = probes.stop().await;
    let observed = obs.stop().await;
    let duration_secs = t0.elapsed().as_secs_f64();

    // read back every shoot through its original kubeconfig
    let mut figures = Vec::new();
    for (shoot, kubeconfig) in &shoots {
        let read = steps::ShootRun {
            shoot,
            kubeconfig,
            log: logs.get(shoot).cloned().unwrap_or_default(),
            losses: r.losses.get(shoot).cloned().unwrap_or_default(),
            samples: samples.get(shoot).cloned().unwrap_or_default(),
            first_fault: faults.first_t.unwrap_or(0.0),
            started_at_ms,
        };
        figures.push(read.figures(&observed.events, &mut failures).await);
    }
    let mut events = observed.events;
    events.sort_by(|a, b| a.t.total_cmp(&b.t));
    let mut result = RunResult {
        drill: drill.name.clone(),
        run,
        seed,
        passed: false,
        failures,
        started_at_ms,
        duration_secs,
        setup_secs,
        members,
        bucket: bucket_url,
        isolation,
        events,
        shoots: figures,
        double_serving: observed.double,
        converged_secs,
        build: None,
    };
    let more = verdict(&drill.expect, &result);
    result.failures.extend(more);
    result.passed = result.failures.is_empty();
    // an orderly end of the seed clusters (the teardown kills what is left)
    std::mem::take(&mut r.kube_seeds).stop().await;
    Ok(result)
}

#[cfg(test)]
mod tests;
