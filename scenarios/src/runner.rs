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
use crate::netns::Network;
use crate::procs;
use crate::result::{
    account, intervals, rto, verdict, DoubleServing, Event, EventKind, LossPoint, RunResult,
    ShootFigures,
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

/// The ring's status as its leader sees it (a just-restarted member's own view
/// may lag behind), bounded to 3 s.
async fn leader_view(layout: &RingLayout, config: &RingConfig) -> Option<RingStatus> {
    let s = tokio::time::timeout(
        Duration::from_secs(3),
        bootstrap::ring_status(layout, config),
    )
    .await
    .ok()?
    .ok()?;
    (s.leader.as_deref() == Some(s.member.as_str())).then_some(s)
}

/// What the observer tasks share with the runner.
#[derive(Default)]
struct Observed {
    status: Option<RingStatus>,
    events: Vec<Event>,
    double: Vec<DoubleServing>,
}

struct Observer {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    state: Arc<Mutex<Observed>>,
}

impl Observer {
    /// Observes the ring in `ring_dir` (and the pods of the nodes in
    /// `pod_nodes`: (member, pod cgroup root)) from `t0` on.
    fn start(
        ring_dir: PathBuf,
        pod_nodes: Vec<(String, String)>,
        layout: RingLayout,
        config: RingConfig,
        t0: Instant,
    ) -> Observer {
        let stop = CancellationToken::new();
        let state: Arc<Mutex<Observed>> = Arc::default();
        // the double-serving checker: every seed's processes (local ones and
        // those in the pods of Kubernetes seeds' nodes), every 200 ms
        let checker = {
            let (stop, state) = (stop.clone(), state.clone());
            tokio::spawn(async move {
                let mut last: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                loop {
                    let (dir, nodes) = (ring_dir.clone(), pod_nodes.clone());
                    let now = tokio::task::spawn_blocking(move || {
                        let mut all = procs::control_planes(&dir);
                        for (shoot, members) in procs::pod_control_planes(&nodes) {
                            all.entry(shoot).or_default().extend(members);
                        }
                        all
                    })
                    .await
                    .unwrap_or_default();
                    let t = t0.elapsed().as_secs_f64();
                    {
                        let mut st = lock(&state);
                        let shoots: BTreeSet<&String> = now.keys().chain(last.keys()).collect();
                        for shoot in shoots {
                            let members = now.get(shoot).cloned().unwrap_or_default();
                            if last.get(shoot).cloned().unwrap_or_default() != members {
                                st.events.push(Event {
                                    t,
                                    kind: EventKind::Serving {
                                        shoot: shoot.clone(),
                                        members: members.iter().cloned().collect(),
                                    },
                                });
                            }
                            if members.len() > 1 {
                                st.double.push(DoubleServing {
                                    t,
                                    shoot: shoot.clone(),
                                    members: members.into_iter().collect(),
                                });
                            }
                        }
                    }
                    last = now;
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            })
        };
        // the ring's view: leader changes and operation steps
        let watcher = {
            let (stop, state) = (stop.clone(), state.clone());
            tokio::spawn(async move {
                let mut leader: Option<Option<String>> = None;
                let mut seen: BTreeSet<(u64, String)> = BTreeSet::new();
                loop {
                    let status = tokio::time::timeout(
                        Duration::from_secs(3),
                        bootstrap::ring_status(&layout, &config),
                    )
                    .await;
                    let t = t0.elapsed().as_secs_f64();
                    {
                        let mut st = lock(&state);
                        // no answer within the bound (members restarting) is no
                        // evidence of a leaderless ring; only an answer saying so is
                        if let Ok(Ok(s)) = status {
                            if leader.as_ref() != Some(&s.leader) {
                                leader = Some(s.leader.clone());
                                st.events.push(Event {
                                    t,
                                    kind: EventKind::Leader {
                                        leader: s.leader.clone(),
                                    },
                                });
                            }
                            for o in &s.operations {
                                let step = format!("{:?}", o.step);
                                if seen.insert((o.id, step.clone())) {
                                    st.events.push(Event {
                                        t,
                                        kind: EventKind::Operation {
                                            id: o.id,
                                            kind: if o.is_migration() {
                                                "migration".into()
                                            } else {
                                                "failover".into()
                                            },
                                            shoot: o.shoot().into(),
                                            from: o.source().into(),
                                            to: o.target().into(),
                                            step,
                                            detail: o.detail.clone(),
                                            may_lose_revisions: o
                                                .outcome
                                                .as_ref()
                                                .and_then(|x| x.may_lose_revisions),
                                        },
                                    });
                                }
                            }
                            // only the leader's view is complete (placements, health)
                            if s.leader.as_deref() == Some(s.member.as_str()) {
                                st.status = Some(s);
                            }
                        }
                    }
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(300)) => {}
                    }
                }
            })
        };
        Observer {
            stop,
            tasks: vec![checker, watcher],
            state,
        }
    }

    fn status(&self) -> Option<RingStatus> {
        lock(&self.state).status.clone()
    }

    fn push(&self, t: f64, kind: EventKind) {
        lock(&self.state).events.push(Event { t, kind });
    }

    async fn stop(self) -> Observed {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *lock(&self.state))
    }
}

/// The member hosting `shoot`'s control plane, as the ring last reported.
fn host_of(obs: &Observer, shoot: &str) -> Option<String> {
    obs.status()?
        .placements
        .iter()
        .find(|p| p.shoot == shoot)
        .map(|p| p.host.clone())
}

/// The shoots `member` hosts, as the ring last reported.
fn hosted_by(obs: &Observer, member: &str) -> Vec<String> {
    obs.status()
        .map(|s| {
            s.placements
                .iter()
                .filter(|p| p.host == member)
                .map(|p| p.shoot.clone())
                .collect()
        })
        .unwrap_or_default()
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
mod setup;
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
    // short: a Kubernetes member's node lives three levels down, and its
    // kubelet's sockets must fit in 107 bytes (NodeConfig::validate says so)
    let dir = opts.work_dir.join(format!(
        "ring-drill-{}-{}-{}",
        short_name(&drill.name),
        std::process::id(),
        now_ms() % 1_000_000
    ));
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let dir = dir
        .canonicalize()
        .map_err(io(format!("resolving {}", dir.display())))?;
    let layout = RingLayout {
        dir: dir.join("ring"),
    };
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
    // the relays of members' own shoots into their namespaces, told where it runs
    let mut own_placed = BTreeMap::new();
    let network = match drill.ring.network {
        NetworkKind::Loopback => None,
        NetworkKind::Namespaces => {
            let net = Arc::new(Network::create(&members, (seed ^ run as u64) as u8)?);
            for m in &members {
                let ep = seed::ShootEndpoint::for_shoot(m);
                let ep = std::net::SocketAddr::from((ep.address, ep.api_port));
                net.forward(ep, m, forwarding.clone()).await?;
                if drill.ring.hosting == Hosting::SelfHosted {
                    let (placed, elsewhere) = tokio::sync::watch::channel(false);
                    net.forward_own(ep, m, elsewhere, forwarding.clone())?;
                    own_placed.insert(m.clone(), placed);
                }
            }
            Some(net)
        }
    };
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
    let config = RingConfig {
        name: drill.name.clone(),
        members: members
            .iter()
            .map(|m| {
                let mut spec = MemberSpec::local(m);
                if let Some(seed) = kube_specs.get(m) {
                    spec.seed = seed.clone();
                }
                if let Some(h) = network
                    .as_ref()
                    .and_then(|n| n.hosts().iter().find(|h| h.member == *m))
                {
                    spec.address = Some(h.address.to_string());
                    spec.netns = Some(h.netns.clone());
                }
                spec
            })
            .collect(),
        bucket: Some(bucket_url.clone()),
        // the self-hosted ring: a node per member, each hosting its successor
        // as pods there; process-hosted rings have nodes only with Kubernetes seeds
        nodes: bootstrap::config::Nodes {
            per_member: u8::from(drill.ring.hosting == Hosting::SelfHosted),
        },
        self_hosting: bootstrap::config::SelfHosting {
            members: match drill.ring.hosting {
                Hosting::SelfHosted => members.clone(),
                Hosting::Processes => Vec::new(),
            },
        },
        ports: Ports {
            address: "127.0.0.1".into(),
            base: free_port_base(seed ^ run as u64)?,
        },
        protection: drill.ring.protection,
        ..RingConfig::default()
    };
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
    let setup = Instant::now();
    let boot = BootstrapOptions {
        config: Some(config.clone()),
        dir: layout.dir.clone(),
        ringd: opts.ringd.clone(),
        timeout: bootstrap_bound(drill),
        generate_bucket_key: true,
    };
    bootstrap::bootstrap(&boot, &Quiet).await?;
    // every shoot backed up before the chaos begins
    let backed_up = Instant::now() + Duration::from_secs(120);
    loop {
        let s = bootstrap::ring_status(&layout, &config).await?;
        if members.iter().all(|m| {
            s.placements
                .iter()
                .any(|p| p.shoot == *m && p.last_backup_revision.is_some())
        }) {
            break;
        }
        if Instant::now() >= backed_up {
            return Err(ScenarioError::Setup(
                "not every shoot reported a durable backup within 120s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let setup_secs = setup.elapsed().as_secs_f64();
    // the kubeconfigs as the ring first published them: they must keep working
    let kc_dir = dir.join("kubeconfigs");
    std::fs::create_dir_all(&kc_dir).map_err(io("creating the kubeconfig folder"))?;
    let mut shoots = Vec::new();
    for m in &members {
        let to = kc_dir.join(format!("{m}.kubeconfig"));
        std::fs::copy(layout.kubeconfig(m), &to)
            .map_err(io(format!("copying {m}'s kubeconfig")))?;
        shoots.push((m.clone(), to));
    }

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
        config: config.clone(),
        config_file,
        layout: layout.clone(),
        bucket,
        bucket_dir,
        t0,
        deadline: t0 + Duration::from_secs(drill.expect.deadline_secs),
        rng: rng.fork(2),
        last_killed: None,
        last_kill_ms: started_at_ms,
        last_partitioned: None,
        network: network.clone(),
        losses: BTreeMap::new(),
        s3,
        kube_seeds,
        say,
    };
    let mut failures = Vec::new();
    let mut first_fault: Option<f64> = None;
    let mut last_fault_t = 0.0;
    for (i, f) in drill.faults.iter().enumerate() {
        let waited: Result<(), ScenarioError> = async {
            if let Some(at) = f.at {
                tokio::time::sleep_until((t0 + at).into()).await;
            }
            if let Some(when) = f.when {
                r.wait_when(when, &obs).await?;
            }
            if let Some(after) = f.after {
                tokio::time::sleep(after).await;
            }
            Ok(())
        }
        .await;
        // a fault is placed on the timeline when it began
        let t = r.t();
        let outcome = match waited {
            Ok(()) => r.act(&f.action, &obs).await,
            Err(e) => Err(e),
        };
        first_fault.get_or_insert(t);
        last_fault_t = r.t();
        let member = match f.action {
            Action::KillSeed { .. } | Action::KillMachine { .. } | Action::StallRingd { .. } => {
                r.last_killed.clone()
            }
            Action::Partition { .. } => r.last_partitioned.clone(),
            _ => None,
        };
        match outcome {
            Ok(detail) => {
                say(&format!("  {t:>6.1}s  fault {}: {detail}", f.action.name()));
                obs.push(
                    t,
                    EventKind::Fault {
                        action: f.action.name().into(),
                        detail,
                        member,
                    },
                );
            }
            Err(e) => {
                say(&format!(
                    "  {t:>6.1}s  fault {} FAILED: {e}",
                    f.action.name()
                ));
                obs.push(
                    t,
                    EventKind::Fault {
                        action: f.action.name().into(),
                        detail: format!("failed: {e}"),
                        member,
                    },
                );
                failures.push(format!("faults[{i}] ({}): {e}", f.action.name()));
                break;
            }
        }
    }
    // convergence: the ring's shape and every API answering
    let mut converged_secs = None;
    if failures.is_empty() {
        while !r.remaining().is_zero() {
            let shape = obs.status().is_some_and(|s| converged(&s, &members));
            // on the self-hosted ring, every node back and Ready too
            let nodes = bootstrap::nodes::all_ready(&layout, &config);
            if shape && members.iter().all(|m| probes.up(m)) && nodes {
                converged_secs = Some(r.t() - last_fault_t);
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        say(&format!(
            "  {:>6.1}s  {}",
            r.t(),
            converged_secs.map_or(
                "the ring did not converge before the deadline".to_string(),
                |c| format!("converged {c:.1}s after the last fault")
            )
        ));
        tokio::time::sleep(drill.workload.cooldown).await;
    }
    // notable lines of every member's ringd log
    let mut patterns: Vec<&str> = procs::NOTABLE.to_vec();
    patterns.extend(drill.expect.logged.iter().map(String::as_str));
    for m in &members {
        if let Ok(text) = std::fs::read_to_string(layout.log(m)) {
            for (ms, line) in procs::notable_lines(&text, &patterns, 10) {
                obs.push(
                    (ms - started_at_ms as i64) as f64 / 1000.0,
                    EventKind::Log {
                        member: m.clone(),
                        line,
                    },
                );
            }
        }
    }
    let logs = writers.stop().await;
    let samples = probes.stop().await;
    let observed = obs.stop().await;
    let duration_secs = t0.elapsed().as_secs_f64();

    // read back every shoot through its original kubeconfig
    let mut figures = Vec::new();
    for (shoot, kubeconfig) in &shoots {
        let log = logs.get(shoot).cloned().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(60);
        let present = loop {
            match read_back(shoot, kubeconfig).await {
                Ok(p) => break Some(p),
                Err(e) if Instant::now() >= deadline => {
                    failures.push(format!("shoot {shoot}: cannot read back its objects: {e}"));
                    break None;
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        let losses = r.losses.get(shoot).cloned().unwrap_or_default();
        let (lost, excused, examples) = match &present {
            Some(p) => account(&log.acks, p, &losses),
            None => (0, 0, vec![]),
        };
        let shoot_samples = samples.get(shoot).cloned().unwrap_or_default();
        let (available, outages) = intervals(&shoot_samples);
        let loss_events: Vec<(Option<i64>, Option<f64>)> = observed
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Loss {
                    shoot: s,
                    durable_revision,
                    durable_age_secs,
                } if s == shoot => Some((*durable_revision, *durable_age_secs)),
                _ => None,
            })
            .collect();
        let rpo_revisions = losses
            .iter()
            .map(|l| {
                let newest = log
                    .acks
                    .iter()
                    .filter(|a| a.at_ms <= l.at_ms)
                    .map(|a| a.resource_version)
                    .max()
                    .unwrap_or(0);
                (newest - l.durable_revision).max(0)
            })
            .max();
        figures.push(ShootFigures {
            shoot: shoot.clone(),
            available,
            outages,
            rto_secs: rto(&shoot_samples, first_fault.unwrap_or(0.0)),
            acked_writes: log.acks.len() as u64,
            failed_writes: log.failures,
            lost_writes: lost,
            lost_beyond_durable: excused,
            lost_examples: examples,
            rpo_revisions,
            rpo_secs: loss_events
                .iter()
                .filter_map(|(_, a)| *a)
                .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a)))),
            ring_may_lose_revisions: crate::result::ring_may_lose(&observed.events, shoot),
        });
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
