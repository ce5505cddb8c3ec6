//! `ringctl bench failover`: RTO of a real failover — kill -9 of the seed hosting
//! a control plane with many objects, until a client's first successful read on
//! the control plane restored from the bucket — split by phase, median of N; and
//! the RPO achieved while a writer creates ConfigMaps at a steady rate. With
//! `--seeds kubernetes` member m1's seed is a real cluster (a control plane
//! and one node run by the bench, `scenarios::seed_cluster`), so the runs
//! alternate between failing over off its pods and onto them; the pods
//! outlive the killed ringd until their lease guard fences them. With
//! `--seeds self` the ring is self-hosted (every control plane in pods on its
//! predecessor's node) and each run kills the whole machine hosting m2: its
//! ringd, node and every pod.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;

use serde::Serialize;

use bootstrap::BootstrapError;
use ringd::client::AdminClient;
use ringd::state::{MemberState, Operation, OperationStep};
use ringd::status::RingStatus;

use super::load::{lost_writes, Load};
use super::{percentile, upper_median, BenchRing};

/// One failover's figures (seconds from the kill).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverFigures {
    pub killed: String,
    pub target: String,
    /// The kind of the killed member's seed, and of the target's.
    pub killed_seed: String,
    pub target_seed: String,
    /// The leader committed the failover (member declared down).
    pub decided_secs: f64,
    /// The old lease had ended; the target began restoring.
    pub restoring_secs: f64,
    /// The first successful read through the shoot's kubeconfig.
    pub first_read_secs: f64,
    /// The ring recorded the failover as done.
    pub done_secs: f64,
    /// The target's restore from the bucket (full snapshot + deltas), as it measured it.
    pub restore_secs: f64,
    /// The target's control plane start until `/readyz` and verification.
    pub start_secs: f64,
    /// Writes acknowledged by the killed control plane that the restore lacks.
    pub writes_lost: usize,
    /// Writes acknowledged in the run before the kill.
    pub writes_acked: usize,
    /// Writes acknowledged after the kill (by a control plane that outlived
    /// its ringd until the fence, or by the restored one) that the end lacks.
    pub writes_lost_after_kill: usize,
    /// How far before the kill the oldest lost acknowledged write was (0 if none lost).
    pub rpo_secs: f64,
    /// Revisions the ring knew durable but the restore did not reach.
    pub detail: String,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverBench {
    /// `local`, or `kubernetes` (m1's seed a cluster).
    pub seeds: SeedKind,
    /// Restore from the bucket, or promote a hot standby.
    pub protection: ProtectionArg,
    /// The ring's timing (heartbeat, failure window, lease).
    pub timing: ringd::config::Timing,
    pub objects: usize,
    /// Creates per second during each failover.
    pub rate: u64,
    pub runs: Vec<FailoverFigures>,
    pub median_rto_secs: f64,
    /// RTO's 95th percentile over the runs (the nearest run by rank).
    pub p95_rto_secs: f64,
    pub median_rpo_secs: f64,
    pub max_rpo_secs: f64,
}

/// The seeds of the benchmark's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum SeedKind {
    /// Every member on a local seed.
    Local,
    /// Member m1 on a Kubernetes seed (a cluster with one node), m2 and m3 local.
    Kubernetes,
    /// The self-hosted ring: every member hosts its successor as pods on its
    /// own node; a run kills the whole machine (ringd, node, pods).
    #[value(name = "self")]
    SelfHosted,
}

/// `--protection` of the benchmark (ringd's [`ringd::config::Protection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum ProtectionArg {
    /// Restore from the bucket.
    Backup,
    /// Promote the shoot's hot standby (local seeds).
    Standby,
}

impl From<ProtectionArg> for ringd::config::Protection {
    fn from(p: ProtectionArg) -> Self {
        match p {
            ProtectionArg::Backup => ringd::config::Protection::Backup,
            ProtectionArg::Standby => ringd::config::Protection::Standby,
        }
    }
}

/// Volumes of the seed cluster (etcd of m2 and of m3 on it, and spares).
pub(super) const VOLUMES: usize = 4;

/// What the benchmark measures, in one run of `ringctl bench failover`.
#[derive(Debug, Clone, Copy)]
pub struct FailoverOptions {
    pub protection: ProtectionArg,
    /// The ring's timing (detection and leases).
    pub timing: ringd::config::Timing,
    pub base_port: u16,
    pub objects: usize,
    pub runs: usize,
    pub rate: u64,
}

/// Bootstraps a 3-member ring under `dir` on `seeds`, fills m2 with
/// `objects` ConfigMaps, then `runs` times kills the member hosting m2 and
/// times the failover.
pub async fn failover_bench(
    dir: &Path,
    ringd: &Path,
    seeds: SeedKind,
    o: FailoverOptions,
) -> Result<FailoverBench, BootstrapError> {
    let mut ring = BenchRing::new(dir, "benchfail", ringd, o.base_port)
        .with_protection(o.protection.into())
        .with_timing(o.timing);
    let cluster = match seeds {
        SeedKind::Local => None,
        SeedKind::SelfHosted => {
            ring = ring.self_hosted();
            None
        }
        SeedKind::Kubernetes => {
            let (cluster, spec) = super::seed_cluster(dir, ringd).await?;
            ring = ring.with_member_seed(0, spec);
            Some(cluster)
        }
    };
    let (objects, runs, rate) = (o.objects, o.runs, o.rate);
    let result = async {
        ring.bootstrap().await?;
        super::migrate::fill(&ring.layout.kubeconfig("m2"), objects).await?;
        let client = seed::kubeconfig::client("m2", &ring.layout.kubeconfig("m2"))
            .await
            .map_err(|e| BootstrapError::Ring(e.into()))?;
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
        let mut out = Vec::new();
        for run in 0..runs {
            ring.bootstrap().await?; // every member up, every control plane serving
            out.push(one_failover(&ring, &api, run, rate).await?);
        }
        Ok::<_, BootstrapError>(out)
    }
    .await;
    ring.down().await;
    if let Some(c) = cluster {
        c.stop().await;
    }
    let runs = result?;
    Ok(FailoverBench {
        seeds,
        protection: o.protection,
        timing: o.timing,
        objects,
        rate,
        median_rto_secs: upper_median(runs.iter().map(|r| r.first_read_secs).collect()),
        p95_rto_secs: percentile(
            &runs.iter().map(|r| r.first_read_secs).collect::<Vec<_>>(),
            95.0,
        ),
        median_rpo_secs: upper_median(runs.iter().map(|r| r.rpo_secs).collect()),
        max_rpo_secs: runs.iter().map(|r| r.rpo_secs).fold(0.0, f64::max),
        runs,
    })
}

/// Run `run`: once a backup covers m2's data, the load starts; 3 s later the
/// member hosting m2 is killed (kill -9), and the failover is watched until m2
/// answers again and the ring records it done; then the lost writes are counted.
async fn one_failover(
    ring: &BenchRing,
    api: &kube::Api<ConfigMap>,
    run: usize,
    rate: u64,
) -> Result<FailoverFigures, BootstrapError> {
    let mut attempt = 0;
    let (mut admin, host, seen, load, killed) = loop {
        let (mut admin, host, pid) = prepare(ring).await?;
        // only operations started after the kill count (earlier runs left theirs)
        let seen = admin.status().await?.operations.iter().map(|o| o.id).max();
        // the RPO load runs for 3 s before the kill and on through the failover
        let load = Load::start(api.clone(), run, rate);
        tokio::time::sleep(Duration::from_secs(3)).await;
        // the ring may have begun moving m2 home meanwhile (a relink): the
        // kill must hit m2's host with no move under way, so start over
        if settled(&admin.status().await?, &host) {
            let killed = Instant::now();
            kill_host(ring, &host, pid).await?;
            break (admin, host, seen, load, killed);
        }
        load.stop().await;
        attempt += 1;
        if attempt >= 5 {
            return Err(BootstrapError::Unsupported(format!(
                "run {run}: m2 kept moving (an operation was under way each of {attempt} times)"
            )));
        }
    };
    let kill = Kill { host, seen, killed };
    let phases = watch_failover(ring, &mut admin, api, &kill).await?;
    let acked = load.stop().await;
    let writes = lost_writes(api, run, &acked, killed).await?;
    let target = phases.target.clone();
    let outcome = failover_of(&admin.status().await?, &kill)
        .and_then(|o| o.outcome.clone())
        .unwrap_or_default();
    Ok(FailoverFigures {
        killed_seed: ring.seed_kind(&kill.host).into(),
        target_seed: ring.seed_kind(&target).into(),
        killed: kill.host,
        target,
        decided_secs: phases.decided.unwrap_or(0.0),
        restoring_secs: phases.restoring.unwrap_or(0.0),
        first_read_secs: phases.first_read.unwrap_or(0.0),
        done_secs: phases.done.unwrap_or(0.0),
        restore_secs: outcome.restore_ms as f64 / 1000.0,
        start_secs: outcome.start_ms as f64 / 1000.0,
        writes_lost: writes.lost,
        writes_acked: writes.acked,
        writes_lost_after_kill: writes.lost_after_kill,
        rpo_secs: writes.rpo_secs,
        detail: phases.detail,
    })
}

/// Waits (bounded) until no operation is under way, then picks m2's host,
/// its ringd's pid and an observer that is neither it nor m2's own member,
/// once a backup (and, with protection standby, a voting standby) covers m2.
async fn prepare(ring: &BenchRing) -> Result<(AdminClient, String, u32), BootstrapError> {
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        let status = leader_status(ring).await?;
        if idle(&status) {
            break status;
        }
        if Instant::now() >= deadline {
            return Err(BootstrapError::Unsupported(
                "an operation stayed under way for 180 s before a run".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let m2 = status.placements.iter().find(|p| p.shoot == "m2");
    let host = m2.map(|p| p.host.clone()).unwrap_or_default();
    let observer = ring
        .config
        .members
        .iter()
        .position(|m| m.name != host && m.name != "m2")
        .unwrap_or(0);
    let mut admin =
        AdminClient::connect(&ring.config.member_address(observer), &ring.layout.pki())?;
    wait_for_backup(&mut admin, m2.and_then(|p| p.last_backup_revision)).await?;
    if ring.config.protection == ringd::config::Protection::Standby {
        wait_for_standby(&mut admin).await?;
    }
    let pid = ring
        .layout
        .running_pid(&host)
        .ok_or_else(|| BootstrapError::Unsupported(format!("{host} does not run")))?;
    Ok((admin, host, pid))
}

/// Whether no operation is under way.
fn idle(status: &RingStatus) -> bool {
    status.operations.iter().all(|o| o.step.is_finished())
}

/// Whether m2 is still on `host` with no operation under way.
fn settled(status: &RingStatus, host: &str) -> bool {
    idle(status)
        && status
            .placements
            .iter()
            .any(|p| p.shoot == "m2" && p.host == host)
}

/// kill -9 of `host`'s ringd (`pid`); on a self-hosted ring, of its whole
/// machine: ringd, every process it runs, its node and every pod on it.
async fn kill_host(ring: &BenchRing, host: &str, pid: u32) -> Result<(), BootstrapError> {
    if ring.config.self_hosting.members.is_empty() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        return Ok(());
    }
    scenarios::procs::kill_machine(&ring.layout, &ring.config, host)
        .await
        .map(|_| ())
        .map_err(|e| BootstrapError::Unsupported(e.to_string()))
}

/// The ring's status as a leader knows it once it sees every member up (a
/// member that just restarted may still hold an older view); after 60 s, what a
/// leader knows then.
async fn leader_status(ring: &BenchRing) -> Result<RingStatus, BootstrapError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = any_leader_status(ring).await;
        let all_up = seen
            .as_ref()
            .is_some_and(|s| s.members.iter().all(|m| m.state == MemberState::Up));
        match seen {
            Some(s) if all_up || Instant::now() > deadline => return Ok(s),
            None if Instant::now() > deadline => {
                return Err(BootstrapError::Unsupported(
                    "no member knows a leader after 60 s".into(),
                ))
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The status from the leader, asked through the first member that names one.
async fn any_leader_status(ring: &BenchRing) -> Option<RingStatus> {
    let addresses = ring.config.member_addresses();
    let mut leader = AdminClient::connect_leader_of(&addresses, &ring.layout.pki())
        .await
        .ok()?;
    leader.status().await.ok()
}

/// Waits (at most 90 s) until m2's hot standby votes (a failover before
/// that restores from the bucket) and its kube-apiserver is warm (a
/// promotion before that starts one).
async fn wait_for_standby(admin: &mut AdminClient) -> Result<(), BootstrapError> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let s = admin.status().await?;
        let m2 = s.placements.iter().find(|p| p.shoot == "m2");
        if m2
            .and_then(|p| p.standby.as_ref())
            .is_some_and(|sb| sb.ready && sb.warm)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BootstrapError::Unsupported(format!(
                "m2's hot standby did not vote with a warm kube-apiserver within 90 s: {:?}",
                m2.map(|p| &p.standby)
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most 60 s) until the ring knows a backup of m2 reaching `wanted`.
async fn wait_for_backup(
    admin: &mut AdminClient,
    wanted: Option<u64>,
) -> Result<(), BootstrapError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let s = admin.status().await?;
        let rev = s
            .placements
            .iter()
            .find(|p| p.shoot == "m2")
            .and_then(|p| p.last_backup_revision);
        if rev.is_some() && rev >= wanted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The kill of one run: whom, when, and the newest operation id before it.
struct Kill {
    host: String,
    seen: Option<u64>,
    killed: Instant,
}

/// The failover of m2 away from the killed host, if the ring has started one.
fn failover_of<'a>(status: &'a RingStatus, kill: &Kill) -> Option<&'a Operation> {
    status
        .operations
        .iter()
        .rev()
        .find(|o| o.shoot() == "m2" && o.source() == kill.host && Some(o.id) > kill.seen)
}

/// When (seconds after the kill) the failover reached each phase.
#[derive(Default)]
struct Phases {
    decided: Option<f64>,
    restoring: Option<f64>,
    first_read: Option<f64>,
    done: Option<f64>,
    detail: String,
    target: String,
}

impl Phases {
    /// Records what the failover's operation shows now; a failed one ends the run.
    fn observe(&mut self, op: &Operation, killed: Instant) -> Result<(), BootstrapError> {
        self.target = op.target().to_string();
        self.decided.get_or_insert(killed.elapsed().as_secs_f64());
        if matches!(op.step, OperationStep::Restoring | OperationStep::Done) {
            self.restoring.get_or_insert(killed.elapsed().as_secs_f64());
        }
        if op.step == OperationStep::Done {
            self.done.get_or_insert(killed.elapsed().as_secs_f64());
            self.detail = op.detail.clone();
        }
        if op.step == OperationStep::Failed {
            return Err(BootstrapError::Unsupported(format!(
                "failover failed: {}",
                op.detail
            )));
        }
        Ok(())
    }
}

/// Polls the ring (every 50 ms, at most 180 s) until the failover is done and
/// a read through the kubeconfig succeeded after the ring decided it.
async fn watch_failover(
    ring: &BenchRing,
    admin: &mut AdminClient,
    api: &kube::Api<ConfigMap>,
    kill: &Kill,
) -> Result<Phases, BootstrapError> {
    let mut p = Phases::default();
    let mut reads = ReadProbe::start(api.clone(), kill.killed);
    while p.done.is_none() || p.first_read.is_none() {
        if kill.killed.elapsed() > Duration::from_secs(180) {
            return Err(failover_timeout(ring, admin, &kill.host, &p).await);
        }
        if let Ok(s) = admin.status().await {
            if let Some(op) = failover_of(&s, kill) {
                p.observe(op, kill.killed)?;
            }
        }
        if let (None, Some(decided)) = (p.first_read, p.decided) {
            p.first_read = reads.first_after(decided);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(p)
}

/// Reads through the shoot's kubeconfig started every 100 ms, each with its
/// own 2 s timeout, so that the first read to succeed is timed to within
/// 100 ms (one read at a time would wait out each timeout against the dead
/// host); stops when dropped.
struct ReadProbe {
    answered: tokio::sync::mpsc::Receiver<f64>,
    seen: Vec<f64>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadProbe {
    fn start(api: kube::Api<ConfigMap>, killed: Instant) -> Self {
        let (tx, answered) = tokio::sync::mpsc::channel(256);
        let task = tokio::spawn(async move {
            loop {
                let (api, tx) = (api.clone(), tx.clone());
                tokio::spawn(async move {
                    let params = ListParams::default().limit(1);
                    let list = api.list(&params);
                    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), list).await {
                        let _ = tx.try_send(killed.elapsed().as_secs_f64());
                    }
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ReadProbe {
            answered,
            seen: Vec::new(),
            task,
        }
    }

    /// The first read (seconds after the kill) that succeeded at or after
    /// `at`, if one did yet.
    fn first_after(&mut self, at: f64) -> Option<f64> {
        while let Ok(t) = self.answered.try_recv() {
            self.seen.push(t);
        }
        self.seen
            .iter()
            .copied()
            .filter(|t| *t >= at)
            .min_by(f64::total_cmp)
    }
}

impl Drop for ReadProbe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The error of a failover that did not finish: how far it got, what the ring
/// says and the last lines of every member's log.
async fn failover_timeout(
    ring: &BenchRing,
    admin: &mut AdminClient,
    host: &str,
    p: &Phases,
) -> BootstrapError {
    let ring_says = admin
        .status()
        .await
        .ok()
        .and_then(|s| serde_json::to_string(&(s.members, s.placements, s.operations)).ok())
        .unwrap_or_default();
    let logs = ring
        .config
        .members
        .iter()
        .map(|m| {
            let log = ring.layout.log(&m.name);
            format!("--- {}\n{}", m.name, seed::ShootLayout::tail(&log, 15))
        })
        .collect::<Vec<_>>()
        .join("\n");
    BootstrapError::Timeout {
        step: format!("failover after killing {host}"),
        waited_secs: 180,
        detail: format!(
            "decided {:?}, restoring {:?}, read {:?}; the ring says: {ring_says}; last lines of the members' logs:\n{logs}",
            p.decided, p.restoring, p.first_read
        ),
    }
}

#[path = "failover_render.rs"]
mod render;
pub use render::render_all;

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
