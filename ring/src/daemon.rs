//! `ringd`: one member of the ring. Wires the Raft node task, the gRPC server
//! (Raft transport + RingAdmin), the leader's decision loop, health reports,
//! lease renewal and the fencing reconciler that starts and stops the control
//! planes this member hosts.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use raft::StateRole;
use ring_proto::v1::raft_transport_server::RaftTransportServer;
use ring_proto::v1::ring_admin_client::RingAdminClient;
use ring_proto::v1::ring_admin_server::{RingAdmin, RingAdminServer};
use ring_proto::v1::{
    AddMemberRequest, HandoverChunk, HandoverRequest, HealthAck, HealthReport, LeaseReply,
    LeaseRequest, MembershipReply, MigrateReply, MigrateRequest, ProbeReply, ProbeRequest,
    RemoveMemberRequest, ShootHealth, StatusReply, StatusRequest,
};
use seed::{BinarySearch, LocalSeed, Seed};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::config::{RingdConfig, SeedConfig};
use crate::decide::{decide, DecisionTiming, LeaderView};
use crate::identity::{IdentityFiles, IdentityPem};
use crate::metrics::Metrics;
use crate::node::{raft_logger, NodeHandle, NodeTask, ProposeError, RaftCore, RaftTuning};
use crate::state::{RingCommand, RingState};
use crate::status::{HostedStatus, MemberStatus, PlacementStatus, RingStatus};
use crate::storage::DiskStorage;
use crate::transport::{
    authorize, channel, run_outbound, server_tls, Caller, Directory, RaftService,
};
use crate::RingError;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This member's lease on a shoot, as far as it knows.
#[derive(Debug, Clone, Copy)]
struct LocalLease {
    epoch: u64,
    valid_until: Instant,
}

/// A control plane this member hosts (or hosted).
#[derive(Debug, Clone, Default)]
struct Hosted {
    epoch: u64,
    serving: bool,
    starting: bool,
    ready: bool,
    detail: String,
    next_attempt: Option<Instant>,
    last_health: Option<Instant>,
}

/// How this member hosts control planes.
#[derive(Clone)]
pub enum Hosting {
    /// Local processes (the default): also backs up, migrates and restores.
    Local(Arc<LocalSeed>),
    /// Workloads in a Kubernetes cluster: start, update, fence, health and removal.
    Kubernetes(Arc<seed::KubernetesSeed>),
}

impl Hosting {
    /// The seed behind the common [`Seed`] interface.
    pub fn seed(&self) -> Arc<dyn Seed> {
        match self {
            Hosting::Local(s) => s.clone(),
            Hosting::Kubernetes(s) => s.clone(),
        }
    }

    /// The local seed, if this member runs control planes as local processes.
    pub fn local(&self) -> Option<&Arc<LocalSeed>> {
        match self {
            Hosting::Local(s) => Some(s),
            Hosting::Kubernetes(_) => None,
        }
    }

    /// The spec to start `shoot` with.
    pub fn spec_for(&self, shoot: &str) -> Result<seed::ControlPlaneSpec, seed::SeedError> {
        match self {
            Hosting::Local(s) => s.spec_for(shoot, None),
            Hosting::Kubernetes(_) => {
                seed::validate_shoot_name(shoot)?;
                Ok(seed::ControlPlaneSpec::new(shoot))
            }
        }
    }

    /// Shoots this seed keeps data (or cached state) for.
    pub fn shoots(&self) -> Vec<String> {
        match self {
            Hosting::Local(s) => s.shoots(),
            Hosting::Kubernetes(s) => s.shoots(),
        }
    }

    /// Deletes everything this seed keeps for `shoot`.
    pub async fn remove(&self, shoot: &str) -> Result<(), seed::SeedError> {
        match self {
            Hosting::Local(s) => s.remove_data(shoot).await,
            Hosting::Kubernetes(s) => s.delete(shoot).await,
        }
    }

    /// What a graceful ringd shutdown does to a control plane it serves: local
    /// processes stop with their supervisor; Kubernetes workloads are fenced (no
    /// ringd renews their lease any more).
    async fn on_shutdown(&self, shoot: &str) -> Result<(), seed::SeedError> {
        match self {
            Hosting::Local(s) => s.stop(shoot).await,
            Hosting::Kubernetes(s) => s.fence(shoot).await,
        }
    }
}

/// State shared by the daemon's tasks and gRPC services.
pub struct Shared {
    config: RingdConfig,
    node: NodeHandle,
    directory: Directory,
    identity: IdentityPem,
    /// How control planes are hosted here, local or Kubernetes.
    hosting: Option<Hosting>,
    metrics: Metrics,
    /// Leader only: member → (when it last reported, its shoots' health).
    reports: Mutex<BTreeMap<String, (u64, Vec<ShootHealth>)>>,
    leases: Mutex<BTreeMap<String, LocalLease>>,
    hosted: Mutex<BTreeMap<String, Hosted>>,
    backups: crate::backups::Backups,
    /// `config.backup` with its key loaded.
    bucket: Option<crate::backups::RingBucket>,
    stop: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// This member's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The Raft node.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// The local seed, if control planes run here as local processes (only those
    /// are backed up, migrated and restored).
    pub fn local_seed(&self) -> Option<&Arc<LocalSeed>> {
        self.hosting.as_ref().and_then(Hosting::local)
    }

    /// This member's Prometheus metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Known members' ids and addresses.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// This member's TLS identity.
    pub fn identity(&self) -> &IdentityPem {
        &self.identity
    }

    /// The configured binary directory of the seed, if any.
    pub fn bin_dir(&self) -> Option<&std::path::Path> {
        self.config.seed.as_ref().and_then(|s| s.bin_dir.as_deref())
    }

    /// Records whether this member serves `shoot`, and why.
    pub fn set_hosted(&self, shoot: &str, serving: bool, detail: String) {
        let mut all = lock(&self.hosted);
        let h = all.entry(shoot.to_string()).or_default();
        h.serving = serving;
        if !serving {
            h.ready = false;
        }
        h.detail = detail;
    }

    /// Records why `shoot` is in its state.
    pub fn set_hosted_detail(&self, shoot: &str, detail: String) {
        lock(&self.hosted)
            .entry(shoot.to_string())
            .or_default()
            .detail = detail;
    }

    /// Whether this member holds a lease for `shoot` at `epoch` that is not about to end.
    pub fn holds_lease(&self, shoot: &str, epoch: u64) -> bool {
        let early = Duration::from_millis(self.timing().lease_ms / 6);
        lock(&self.leases)
            .get(shoot)
            .is_some_and(|l| l.epoch == epoch && Instant::now() + early < l.valid_until)
    }

    /// Renews (or acquires) this member's lease on `shoot` for `epoch` through the quorum.
    pub async fn renew_lease(&self, shoot: &str, epoch: u64) -> Result<(), RingError> {
        let lease = Duration::from_millis(self.timing().lease_ms);
        let sent = Instant::now();
        let cmd = RingCommand::RenewLease {
            shoot: shoot.to_string(),
            holder: self.name().to_string(),
            epoch,
            expires_at_ms: now_ms() + self.timing().lease_ms,
        };
        self.node.propose(cmd, lease / 3).await?;
        lock(&self.leases).insert(
            shoot.to_string(),
            LocalLease {
                epoch,
                valid_until: sent + lease,
            },
        );
        Ok(())
    }

    /// The bucket this member backs up to and restores from, if configured.
    pub fn bucket(&self) -> Option<&crate::backups::RingBucket> {
        self.bucket.as_ref()
    }

    /// Starts the continuous backup of a control plane this member serves.
    pub fn start_backup(self: &Arc<Self>, seed: &LocalSeed, shoot: &str) {
        if let Some(bucket) = self.bucket() {
            self.backups
                .ensure(self.clone(), seed, bucket, shoot, &self.stop);
        }
    }

    /// Stops the continuous backup of `shoot` (it moves away or is fenced).
    pub fn stop_backup(&self, shoot: &str) {
        self.backups.stop(shoot);
    }

    /// Commits `cmd` through the quorum.
    pub async fn propose_cmd(&self, cmd: RingCommand) -> Result<(), RingError> {
        self.propose(cmd).await.map(|_| ()).map_err(RingError::from)
    }

    fn timing(&self) -> &crate::config::Timing {
        &self.config.timing
    }

    fn proposal_timeout(&self) -> Duration {
        Duration::from_millis(self.timing().election_timeout_ms * 3)
    }

    /// The answering member's view of the ring.
    pub fn status(&self) -> RingStatus {
        let v = self.node.view();
        let now = now_ms();
        let leader = self.directory.by_id(v.leader_id).map(|(n, _)| n);
        let election = Duration::from_millis(self.timing().election_timeout_ms * 2);
        let quorum_contact = v.role == StateRole::Leader
            || v.last_leader_contact
                .is_some_and(|t| t.elapsed() < election);
        let reports = lock(&self.reports).clone();
        let is_leader = v.role == StateRole::Leader;
        let members = v
            .state
            .members
            .iter()
            .map(|m| MemberStatus {
                name: m.name.clone(),
                id: m.id,
                address: m.address.clone(),
                state: m.state,
                voter: v.voters.contains(&m.id),
                leader: m.id == v.leader_id,
                last_report_ms_ago: if !is_leader {
                    None
                } else if m.name == self.name() {
                    Some(0)
                } else {
                    reports.get(&m.name).map(|(at, _)| now.saturating_sub(*at))
                },
            })
            .collect();
        let placements = v
            .state
            .placements
            .values()
            .map(|p| PlacementStatus {
                shoot: p.shoot.clone(),
                host: p.host.clone(),
                epoch: p.epoch,
                lease_expires_in_ms: p
                    .lease
                    .as_ref()
                    .map(|l| l.expires_at_ms as i64 - now as i64),
                last_backup_age_ms: v
                    .state
                    .backups
                    .get(&p.shoot)
                    .map(|b| now.saturating_sub(b.at_ms)),
                last_backup_revision: v.state.backups.get(&p.shoot).map(|b| b.revision),
                ready: reports
                    .get(&p.host)
                    .and_then(|(_, shoots)| shoots.iter().find(|s| s.shoot == p.shoot))
                    .map(|s| s.ready),
            })
            .collect();
        let leases = lock(&self.leases).clone();
        let hosted = lock(&self.hosted)
            .iter()
            .map(|(shoot, h)| HostedStatus {
                shoot: shoot.clone(),
                epoch: h.epoch,
                serving: h.serving,
                ready: h.ready,
                lease_valid_for_ms: leases.get(shoot).map(|l| {
                    let now = Instant::now();
                    if l.valid_until >= now {
                        (l.valid_until - now).as_millis() as i64
                    } else {
                        -((now - l.valid_until).as_millis() as i64)
                    }
                }),
                detail: h.detail.clone(),
            })
            .collect();
        RingStatus {
            member: self.name().to_string(),
            id: v.id,
            role: format!("{:?}", v.role),
            leader,
            term: v.term,
            commit_index: v.commit,
            applied_index: v.applied,
            quorum_contact,
            members,
            placements,
            hosted,
            operations: v.state.operations.clone(),
        }
    }

    fn record_report(&self, member: &str, shoots: Vec<ShootHealth>) {
        lock(&self.reports).insert(member.to_string(), (now_ms(), shoots));
    }

    async fn propose(&self, cmd: RingCommand) -> Result<u64, ProposeError> {
        let res = self.node.propose(cmd, self.proposal_timeout()).await;
        self.metrics.proposal(res.is_ok());
        res
    }
}

/// How long a starting ringd waits for a previous process of the same member to
/// let go of the Raft store: a ringd killed with -9 holds its file lock until
/// its last thread has exited, which can outlast its pid (e.g. during an fsync).
const STORE_LOCK_WAIT: Duration = Duration::from_secs(15);

/// Opens the member's Raft store, waiting (bounded) while another process holds it.
async fn open_store(
    config: &RingdConfig,
    shutdown: &CancellationToken,
) -> Result<DiskStorage, RingError> {
    let path = config.data_dir.join("raft.redb");
    let deadline = Instant::now() + STORE_LOCK_WAIT;
    let mut logged = false;
    loop {
        match DiskStorage::open(&path, &config.initial_voters()) {
            Err(RingError::StoreLocked(p)) if Instant::now() < deadline => {
                if !logged {
                    tracing::warn!(store = %p, "the Raft store is still open in another process; waiting for it to exit");
                    logged = true;
                }
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Err(RingError::StoreLocked(p)),
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
            other => return other,
        }
    }
}

/// A started daemon.
pub struct RunningDaemon {
    /// Where gRPC is served.
    pub grpc_addr: SocketAddr,
    /// Where `/metrics` is served.
    pub metrics_addr: Option<SocketAddr>,
    /// Shared state (status, node handle) for in-process callers.
    pub shared: Arc<Shared>,
    tasks: JoinSet<Result<(), RingError>>,
    stop: CancellationToken,
}

impl RunningDaemon {
    /// The node's handle.
    pub fn node(&self) -> &NodeHandle {
        &self.shared.node
    }

    /// Waits until shutdown or the first fatal error, then stops everything
    /// (including the control planes this member serves; their data stays).
    pub async fn wait(mut self) -> Result<(), RingError> {
        let mut result = Ok(());
        while let Some(done) = self.tasks.join_next().await {
            let res = match done {
                Ok(r) => r,
                Err(e) => Err(RingError::Raft(format!("a ringd task failed: {e}"))),
            };
            // Loops that have nothing to do (e.g. no seed) end early; only errors stop the member.
            if let Err(e) = res {
                tracing::error!(error = %e, "fatal; stopping ringd");
                if result.is_ok() {
                    result = Err(e);
                }
                self.stop.cancel();
            }
        }
        if let Some(hosting) = &self.shared.hosting {
            // a start still in flight would bring a control plane up after the
            // stop below: let it finish first (bounded), then stop it too
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline
                && lock(&self.shared.hosted).values().any(|h| h.starting)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let shoots: Vec<String> = lock(&self.shared.hosted)
                .iter()
                .filter(|(_, h)| h.serving || h.starting)
                .map(|(s, _)| s.clone())
                .collect();
            for shoot in shoots {
                if let Err(e) = hosting.on_shutdown(&shoot).await {
                    tracing::warn!(%shoot, error = %e, "stopping the control plane at shutdown");
                }
            }
        }
        result
    }
}

/// Runs a ringd until `shutdown` (or a fatal error).
pub async fn run(config: RingdConfig, shutdown: CancellationToken) -> Result<(), RingError> {
    start(config, shutdown).await?.wait().await
}

/// Starts a ringd: opens its Raft store, binds its listeners, spawns its tasks.
pub async fn start(
    config: RingdConfig,
    shutdown: CancellationToken,
) -> Result<RunningDaemon, RingError> {
    config.validate()?;
    let identity = IdentityPem::read(&IdentityFiles {
        ca: config.tls.ca.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    })?;
    seed::pki::create_private_dir(&config.data_dir)?;
    let store = open_store(&config, &shutdown).await?;
    let t = config.timing;
    let election_ticks = (t.election_timeout_ms / t.tick_ms).max(5) as usize;
    let tuning = RaftTuning {
        tick: Duration::from_millis(t.tick_ms),
        election_ticks,
        heartbeat_ticks: (election_ticks / 5).max(1),
        ..Default::default()
    };
    let core = RaftCore::new(config.id, store, &tuning, &raft_logger())?;
    let (outbox_tx, outbox_rx) = tokio::sync::mpsc::channel(1024);
    let (node_task, node) = NodeTask::new(core, tuning.tick, outbox_tx);

    let directory = Directory::default();
    for m in &config.members {
        directory.insert(&m.name, m.id, &m.address);
    }
    directory.insert(&config.name, config.id, &config.listen);

    let hosting = match &config.seed {
        Some(
            sc @ SeedConfig {
                kubernetes: Some(kc),
                ..
            },
        ) => {
            let k = seed::KubernetesSeed::connect(kc, &sc.state_dir).await?;
            Some(Hosting::Kubernetes(Arc::new(k)))
        }
        Some(sc) => {
            let bins = BinarySearch::standard(sc.bin_dir.as_deref()).control_plane()?;
            let tuning = seed::process::SupervisorTuning {
                stop_grace: Duration::from_secs(5),
                ..Default::default()
            };
            Some(Hosting::Local(Arc::new(
                LocalSeed::new(&sc.state_dir, bins)
                    .with_tuning(tuning)
                    .with_advertise(sc.api_advertise.clone()),
            )))
        }
        None => None,
    };

    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|source| RingError::Io {
            what: format!("listening on {} (listen)", config.listen),
            source,
        })?;
    let grpc_addr = listener.local_addr().map_err(|source| RingError::Io {
        what: "reading the gRPC listener's address".into(),
        source,
    })?;
    let metrics_listener = match &config.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| RingError::Io {
                    what: format!("listening on {addr} (metricsListen)"),
                    source,
                })?,
        ),
        None => None,
    };
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());

    let bucket = config
        .backup
        .as_ref()
        .map(crate::backups::RingBucket::open)
        .transpose()?;
    let stop = shutdown.child_token();
    let shared = Arc::new(Shared {
        config: config.clone(),
        node: node.clone(),
        directory: directory.clone(),
        identity: identity.clone(),
        hosting,
        metrics: Metrics::new(&config.name),
        reports: Mutex::new(BTreeMap::new()),
        leases: Mutex::new(BTreeMap::new()),
        hosted: Mutex::new(BTreeMap::new()),
        backups: crate::backups::Backups::default(),
        bucket,
        stop: stop.clone(),
    });

    let mut tasks = JoinSet::new();
    {
        let stop = stop.clone();
        tasks.spawn(async move { node_task.run(stop).await });
    }
    {
        let (node, directory, identity, stop) = (
            node.clone(),
            directory.clone(),
            identity.clone(),
            stop.clone(),
        );
        tasks.spawn(async move {
            run_outbound(outbox_rx, node, directory, identity, stop).await;
            Ok(())
        });
    }
    {
        let raft = RaftTransportServer::new(RaftService {
            node: node.clone(),
            directory: directory.clone(),
        })
        .max_decoding_message_size(16 * 1024 * 1024);
        let admin = RingAdminServer::new(AdminService {
            shared: shared.clone(),
        });
        let tls = server_tls(&identity);
        let stop = stop.clone();
        tasks.spawn(async move {
            tonic::transport::Server::builder()
                .tls_config(tls)
                .map_err(|e| RingError::Transport(format!("TLS setup: {e}")))?
                .add_service(raft)
                .add_service(admin)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    stop.cancelled_owned(),
                )
                .await
                .map_err(|e| RingError::Transport(format!("gRPC server: {e}")))
        });
    }
    if let Some(l) = metrics_listener {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move { crate::metrics::serve(l, shared_metrics(shared), stop).await });
    }
    if let Some(seed) = shared.local_seed().cloned() {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move {
            crate::migration::run(shared, seed, stop).await;
            Ok(())
        });
    } else if matches!(shared.hosting, Some(Hosting::Kubernetes(_))) {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move {
            refuse_moves(shared, stop).await;
            Ok(())
        });
    }
    for (name, f) in [
        (
            "directory",
            tokio::spawn(sync_directory(shared.clone(), stop.clone())) as _,
        ),
        (
            "bootstrap",
            tokio::spawn(bootstrap(shared.clone(), stop.clone())),
        ),
        (
            "health",
            tokio::spawn(report_health(shared.clone(), stop.clone())),
        ),
        ("decide", tokio::spawn(lead(shared.clone(), stop.clone()))),
        (
            "leases",
            tokio::spawn(renew_leases(shared.clone(), stop.clone())),
        ),
        (
            "serve",
            tokio::spawn(reconcile_serving(shared.clone(), stop.clone())),
        ),
    ] {
        let f: tokio::task::JoinHandle<()> = f;
        tasks.spawn(async move {
            f.await
                .map_err(|e| RingError::Raft(format!("{name} loop failed: {e}")))
        });
    }
    tracing::info!(member = %config.name, %grpc_addr, ?metrics_addr, "ringd started");
    Ok(RunningDaemon {
        grpc_addr,
        metrics_addr,
        shared,
        tasks,
        stop,
    })
}

fn shared_metrics(shared: Arc<Shared>) -> impl Fn() -> String + Send + Sync + 'static {
    move || {
        shared.metrics.observe(
            &shared.node.view(),
            lock(&shared.hosted).values().filter(|h| h.serving).count(),
        );
        shared.metrics.encode()
    }
}

/// Sleeps `d` unless shutdown comes first; false on shutdown.
async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

async fn sync_directory(shared: Arc<Shared>, stop: CancellationToken) {
    let mut rx = shared.node.watch();
    let mut known: Vec<(String, u64, String)> = Vec::new();
    loop {
        let members: Vec<(String, u64, String)> = rx
            .borrow_and_update()
            .state
            .members
            .iter()
            .map(|m| (m.name.clone(), m.id, m.address.clone()))
            .collect();
        if !members.is_empty() && members != known {
            let mut all = members.clone();
            // peers from the config stay reachable (a joiner talks to them before it learns the state)
            for m in &shared.config.members {
                if !all.iter().any(|(n, _, _)| *n == m.name) {
                    all.push((m.name.clone(), m.id, m.address.clone()));
                }
            }
            if !all.iter().any(|(n, _, _)| n == shared.name()) {
                all.push((
                    shared.name().to_string(),
                    shared.config.id,
                    shared.config.listen.clone(),
                ));
            }
            shared.directory.replace(all);
            known = members;
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

async fn bootstrap(shared: Arc<Shared>, stop: CancellationToken) {
    if shared.config.join {
        return;
    }
    let members: Vec<(String, u64, String)> = shared
        .config
        .members
        .iter()
        .map(|m| (m.name.clone(), m.id, m.address.clone()))
        .collect();
    loop {
        let v = shared.node.view();
        if !v.state.members.is_empty() {
            return;
        }
        if v.role == StateRole::Leader {
            match shared
                .propose(RingCommand::Bootstrap {
                    members: members.clone(),
                })
                .await
            {
                Ok(_) => tracing::info!("ring bootstrapped"),
                Err(e) => tracing::debug!(error = %e, "bootstrap proposal"),
            }
        }
        if !pause(&stop, Duration::from_millis(200)).await {
            return;
        }
    }
}

async fn report_health(shared: Arc<Shared>, stop: CancellationToken) {
    let every = Duration::from_millis(shared.timing().heartbeat_ms);
    let mut client: Option<(String, RingAdminClient<Channel>)> = None;
    while pause(&stop, every).await {
        let v = shared.node.view();
        if v.leader_id == 0 {
            continue;
        }
        let shoots: Vec<ShootHealth> = lock(&shared.hosted)
            .iter()
            .filter(|(_, h)| h.serving)
            .map(|(s, h)| ShootHealth {
                shoot: s.clone(),
                ready: h.ready,
                detail: h.detail.clone(),
            })
            .collect();
        if v.leader_id == v.id {
            shared.record_report(shared.name(), shoots);
            continue;
        }
        let Some((leader, address)) = shared.directory.by_id(v.leader_id) else {
            continue;
        };
        if client.as_ref().is_none_or(|(n, _)| *n != leader) {
            match channel(&shared.identity, &address, &leader) {
                Ok(ch) => client = Some((leader.clone(), RingAdminClient::new(ch))),
                Err(e) => {
                    tracing::warn!(error = %e, "no channel to the leader");
                    continue;
                }
            }
        }
        if let Some((_, c)) = client.as_mut() {
            let report = HealthReport {
                member: shared.name().to_string(),
                shoots,
            };
            match tokio::time::timeout(every * 2, c.report_health(report)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!(%leader, error = %e, "health report refused"),
                Err(_) => tracing::debug!(%leader, "health report timed out"),
            }
        }
    }
}

async fn lead(shared: Arc<Shared>, stop: CancellationToken) {
    let every = Duration::from_millis(shared.timing().heartbeat_ms);
    let t = shared.timing();
    let timing = DecisionTiming {
        failure_window_ms: t.failure_window_ms,
        lease_margin_ms: t.lease_margin_ms,
    };
    let mut leader_since: Option<(u64, u64)> = None; // (term, since)
    let mut last_round = Instant::now();
    while pause(&stop, every).await {
        // If this process itself stalled (SIGSTOP, swap, a long pause), the silence
        // it measured is its own: count silence from now, not from before.
        if last_round.elapsed() > every * 4 {
            tracing::warn!(stalled = ?last_round.elapsed(), "this member stalled; restarting failure detection");
            leader_since = None;
        }
        last_round = Instant::now();
        let v = shared.node.view();
        if v.role != StateRole::Leader || v.state.members.is_empty() {
            leader_since = None;
            continue;
        }
        let now = now_ms();
        let since = match leader_since {
            Some((term, since)) if term == v.term => since,
            _ => {
                lock(&shared.reports).clear();
                leader_since = Some((v.term, now));
                now
            }
        };
        let reports: BTreeMap<String, u64> = lock(&shared.reports)
            .iter()
            .map(|(k, (at, _))| (k.clone(), *at))
            .collect();
        let view = LeaderView {
            now_ms: now,
            leader_since_ms: since,
            leader: shared.name(),
            last_report_ms: &reports,
        };
        for cmd in decide(&v.state, &view, &timing) {
            tracing::info!(?cmd, "leader decision");
            if let Err(e) = shared.propose(cmd).await {
                tracing::info!(error = %e, "decision not applied");
            }
        }
    }
}

/// Shoots this member should hold a lease for: it hosts them and no operation
/// moves them, or it is restoring them as a migration's target.
fn leased_shoots(state: &RingState, me: &str) -> Vec<(String, u64)> {
    state
        .placements
        .values()
        .filter(|p| {
            p.host == me
                && state.open_operation(&p.shoot).is_none_or(|op| {
                    op.target() == me && op.step == crate::state::OperationStep::Restoring
                })
        })
        .map(|p| (p.shoot.clone(), p.epoch))
        .collect()
}

async fn renew_leases(shared: Arc<Shared>, stop: CancellationToken) {
    if shared.hosting.is_none() {
        return; // a member without a seed serves nothing and needs no lease
    }
    let lease = Duration::from_millis(shared.timing().lease_ms);
    let mut wait = lease / 3;
    while pause(&stop, wait).await {
        wait = lease / 3;
        let v = shared.node.view();
        for (shoot, epoch) in leased_shoots(&v.state, shared.name()) {
            // a migration target renews only once it acquired the new epoch's lease
            let acquired = lock(&shared.leases)
                .get(&shoot)
                .is_some_and(|l| l.epoch == epoch);
            if v.state.open_operation(&shoot).is_some() && !acquired {
                continue;
            }
            if let Err(e) = shared.renew_lease(&shoot, epoch).await {
                tracing::warn!(%shoot, epoch, error = %e, "lease not renewed");
                // A renewal lost with a dying leader: retry soon rather than a
                // period later, so electing a new leader does not fence healthy
                // control planes (found by the zombie-seed / kill-leader drills).
                wait = Duration::from_millis(200);
            }
        }
    }
}

async fn reconcile_serving(shared: Arc<Shared>, stop: CancellationToken) {
    let Some(hosting) = shared.hosting.clone() else {
        return;
    };
    let seed = hosting.seed();
    let lease_ms = shared.timing().lease_ms;
    // Stop serving this long before the lease ends (SIGKILL is immediate).
    let fence_early = Duration::from_millis(lease_ms / 6);
    let mut next_release = Instant::now();
    // What this seed holds from before a restart is reconciled (and shown in the
    // status) too, not only what the ring places here now: a returning seed
    // whose control plane moved away says so ("moved to …") instead of nothing.
    for shoot in hosting.shoots() {
        lock(&shared.hosted).entry(shoot).or_default();
    }
    while pause(&stop, Duration::from_millis(200)).await {
        if Instant::now() >= next_release {
            next_release = Instant::now() + Duration::from_secs(5);
            release_moved(&shared, &hosting).await;
        }
        let v = shared.node.view();
        let me = shared.name().to_string();
        let mut shoots: Vec<String> = v
            .state
            .placements
            .values()
            .filter(|p| p.host == me)
            .map(|p| p.shoot.clone())
            .collect();
        shoots.extend(lock(&shared.hosted).keys().cloned());
        shoots.sort();
        shoots.dedup();
        for shoot in shoots {
            // A planned migration drives the control plane on both its source and target.
            if v.state.open_operation(&shoot).is_some_and(|op| {
                (op.is_migration()
                    && op.source() == me
                    && op.step == crate::state::OperationStep::Pending)
                    || (op.target() == me && op.step == crate::state::OperationStep::Restoring)
            }) {
                continue;
            }
            let placement = v.state.placements.get(&shoot);
            let lease = lock(&shared.leases).get(&shoot).copied();
            let (desired, why) = match placement {
                None => (false, "no such shoot in the ring".to_string()),
                Some(p) if p.host != me => {
                    (false, format!("moved to {} at epoch {}", p.host, p.epoch))
                }
                Some(p) if v.state.open_operation(&shoot).is_some() => {
                    (false, format!("operation in progress at epoch {}", p.epoch))
                }
                Some(p) => match lease {
                    Some(l)
                        if l.epoch == p.epoch && Instant::now() + fence_early < l.valid_until =>
                    {
                        (true, String::new())
                    }
                    Some(l) if l.epoch == p.epoch => {
                        (false, "lease about to end: fenced".to_string())
                    }
                    _ => (false, format!("no lease for epoch {} yet", p.epoch)),
                },
            };
            let epoch = placement.map_or(0, |p| p.epoch);
            let mut h = lock(&shared.hosted)
                .get(&shoot)
                .cloned()
                .unwrap_or_default();
            if desired {
                h.epoch = epoch;
                if !h.serving && !h.starting && h.next_attempt.is_none_or(|t| Instant::now() >= t) {
                    // Recorded before the task exists: the next pass (200 ms on)
                    // must not start a second one, and shutdown waits for it.
                    h.starting = true;
                    {
                        let mut all = lock(&shared.hosted);
                        let cur = all.entry(shoot.clone()).or_default();
                        cur.starting = true;
                        cur.detail = "starting".into();
                    }
                    shared.metrics.started();
                    let (hosting, shared, shoot) = (hosting.clone(), shared.clone(), shoot.clone());
                    tokio::spawn(async move {
                        let res = match hosting.spec_for(&shoot) {
                            Ok(spec) => hosting.seed().start(&spec).await,
                            Err(e) => Err(e),
                        };
                        let mut all = lock(&shared.hosted);
                        let h = all.entry(shoot.clone()).or_default();
                        h.starting = false;
                        match res {
                            Ok(()) | Err(seed::SeedError::AlreadyRunning { .. }) => {
                                h.serving = true;
                                h.detail = "serving".into();
                                h.next_attempt = None;
                                drop(all);
                                if let Some(local) = hosting.local() {
                                    shared.start_backup(local, &shoot);
                                }
                            }
                            Err(e) => {
                                tracing::error!(%shoot, error = %e, "cannot start the control plane");
                                h.detail = format!("start failed: {e}");
                                h.next_attempt = Some(Instant::now() + Duration::from_secs(5));
                            }
                        }
                    });
                }
                if h.serving
                    && h.last_health
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
                {
                    h.last_health = Some(Instant::now());
                    let health = seed.health(&shoot).await;
                    h.ready = matches!(health, Ok(ref x) if x.ready);
                }
            } else if h.serving {
                tracing::warn!(%shoot, reason = %why, "fencing the control plane");
                shared.backups.stop(&shoot);
                if let Err(e) = seed.fence(&shoot).await {
                    tracing::error!(%shoot, error = %e, "fencing failed");
                }
                h.serving = false;
                h.ready = false;
                shared.metrics.fenced();
            }
            if !desired && !h.starting {
                h.detail = why;
            }
            let mut all = lock(&shared.hosted);
            let cur = all.entry(shoot).or_default();
            if h.starting {
                // A start task is in flight (or finished meanwhile): `starting`,
                // `serving`, `detail` and `next_attempt` are its to write.
                cur.epoch = h.epoch;
            } else {
                *cur = h;
            }
        }
    }
}

/// On a Kubernetes seed: moves onto this member (restore from the bucket, planned
/// handover) are not supported yet, so every such operation is failed at once
/// with the reason; the leader then picks another target.
async fn refuse_moves(shared: Arc<Shared>, stop: CancellationToken) {
    let me = shared.name();
    let detail = format!(
        "{me} hosts control planes in a Kubernetes cluster; moving a control plane onto a Kubernetes seed (restore or handover) is not supported yet"
    );
    while pause(&stop, Duration::from_secs(1)).await {
        let v = shared.node.view();
        for op in v.state.operations.iter().filter(|o| !o.step.is_finished()) {
            let involved = op.target() == me
                || (op.is_migration()
                    && op.source() == me
                    && op.step == crate::state::OperationStep::Pending);
            if !involved {
                continue;
            }
            let cmd = RingCommand::AdvanceOperation {
                id: op.id,
                step: crate::state::OperationStep::Failed,
                detail: detail.clone(),
                at_ms: now_ms(),
                outcome: None,
            };
            if let Err(e) = shared.propose_cmd(cmd).await {
                tracing::warn!(op = op.id, error = %e, "cannot refuse an operation");
            }
        }
    }
}

/// Deletes the data of control planes that moved to another seed once the
/// configured grace has passed since this member first saw them gone (recorded
/// in `<shoot dir>/released`, so the clock survives restarts). The data of a
/// shoot that is still placed here, in an open operation, or running is kept.
async fn release_moved(shared: &Shared, seed: &Hosting) {
    let Some(sc) = shared.config.seed.as_ref() else {
        return;
    };
    let (grace_ms, state_dir) = (sc.release_grace_secs.saturating_mul(1000), &sc.state_dir);
    let v = shared.node.view();
    let me = shared.name();
    for shoot in seed.shoots() {
        let Some(p) = v.state.placements.get(&shoot) else {
            continue; // not (or not yet) a shoot of this ring: leave it alone
        };
        let marker = state_dir.join("shoots").join(&shoot).join("released");
        // an open operation that needs this seed's copy: a planned migration (its
        // source hands the data over) or any move onto this member
        let needed = v
            .state
            .open_operation(&shoot)
            .is_some_and(|op| op.is_migration() || op.target() == me);
        if p.host == me
            || needed
            || lock(&shared.hosted)
                .get(&shoot)
                .is_some_and(|h| h.serving || h.starting)
        {
            let _ = std::fs::remove_file(&marker);
            continue;
        }
        let now = now_ms();
        let recorded = std::fs::read_to_string(&marker).ok().and_then(|t| {
            let (epoch, at) = t.trim().split_once(' ')?;
            Some((epoch.parse::<u64>().ok()?, at.parse::<u64>().ok()?))
        });
        let since = match recorded {
            Some((epoch, at)) if epoch == p.epoch => at,
            _ => {
                // Workloads in a cluster outlive a crashed ringd: fence them (idempotent)
                // before anything else. Local processes died with their supervisor.
                if let Hosting::Kubernetes(k) = seed {
                    if let Err(e) = k.fence(&shoot).await {
                        tracing::warn!(%shoot, error = %e, "cannot fence a moved control plane; it is deleted after the grace");
                    }
                }
                if let Err(e) = std::fs::write(&marker, format!("{} {now}", p.epoch)) {
                    tracing::warn!(%shoot, error = %e, "cannot record the release of a moved control plane");
                }
                continue;
            }
        };
        if now.saturating_sub(since) < grace_ms {
            continue;
        }
        match seed.remove(&shoot).await {
            Ok(()) => tracing::info!(
                %shoot,
                host = %p.host,
                epoch = p.epoch,
                "deleted the data of a control plane that moved away"
            ),
            Err(e) => {
                tracing::warn!(%shoot, error = %e, "cannot delete a moved control plane's data")
            }
        }
        lock(&shared.hosted).remove(&shoot);
    }
}

/// The RingAdmin gRPC service.
pub struct AdminService {
    shared: Arc<Shared>,
}

fn propose_status(e: ProposeError) -> Status {
    match e {
        ProposeError::Rejected(r) => Status::failed_precondition(r),
        ProposeError::Timeout(_) => Status::unavailable(format!("{e}")),
        ProposeError::Stopped => Status::unavailable("ringd is shutting down"),
        ProposeError::Invalid(r) => Status::invalid_argument(r),
    }
}

#[tonic::async_trait]
impl RingAdmin for AdminService {
    async fn status(&self, req: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::MemberOrAdmin)?;
        let json = serde_json::to_string(&self.shared.status())
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(StatusReply { status_json: json }))
    }

    async fn report_health(
        &self,
        req: Request<HealthReport>,
    ) -> Result<Response<HealthAck>, Status> {
        let caller = authorize(&req, &self.shared.directory, Caller::Member)?;
        let report = req.into_inner();
        if report.member != caller {
            return Err(Status::permission_denied(format!(
                "{caller} may not report for {}",
                report.member
            )));
        }
        let v = self.shared.node.view();
        if v.role != StateRole::Leader {
            let leader = self
                .shared
                .directory
                .by_id(v.leader_id)
                .map(|(n, _)| n)
                .unwrap_or_default();
            return Ok(Response::new(HealthAck { leader }));
        }
        self.shared.record_report(&caller, report.shoots);
        Ok(Response::new(HealthAck {
            leader: String::new(),
        }))
    }

    async fn renew_lease(
        &self,
        req: Request<LeaseRequest>,
    ) -> Result<Response<LeaseReply>, Status> {
        let caller = authorize(&req, &self.shared.directory, Caller::Member)?;
        let r = req.into_inner();
        if r.holder != caller {
            return Err(Status::permission_denied(format!(
                "{caller} may not renew a lease held by {}",
                r.holder
            )));
        }
        let cmd = RingCommand::RenewLease {
            shoot: r.shoot,
            holder: r.holder,
            epoch: r.epoch,
            expires_at_ms: r.expires_at_ms,
        };
        match self.shared.propose(cmd).await {
            Ok(_) => Ok(Response::new(LeaseReply {
                granted: true,
                reason: String::new(),
                epoch: r.epoch,
            })),
            Err(ProposeError::Rejected(reason)) => Ok(Response::new(LeaseReply {
                granted: false,
                reason,
                epoch: r.epoch,
            })),
            Err(e) => Err(propose_status(e)),
        }
    }

    async fn add_member(
        &self,
        req: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::Admin)?;
        let r = req.into_inner();
        seed::validate_shoot_name(&r.name).map_err(|e| Status::invalid_argument(e.to_string()))?;
        r.address.parse::<SocketAddr>().map_err(|e| {
            Status::invalid_argument(format!("address {:?} is not host:port ({e})", r.address))
        })?;
        let state = self.shared.node.view().state;
        if state.member(&r.name).is_some() {
            return Err(Status::already_exists(format!("member {} exists", r.name)));
        }
        let id = state
            .next_member_id
            .max(state.members.iter().map(|m| m.id).max().unwrap_or(0) + 1);
        self.shared.directory.insert(&r.name, id, &r.address);
        let cmd = RingCommand::AddMember {
            name: r.name.clone(),
            id,
            address: r.address,
        };
        self.shared
            .node
            .change_membership(cmd, self.shared.proposal_timeout())
            .await
            .map_err(propose_status)?;
        Ok(Response::new(MembershipReply {
            detail: format!("added {} with Raft id {id}", r.name),
            id,
        }))
    }

    async fn remove_member(
        &self,
        req: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::Admin)?;
        let r = req.into_inner();
        let state = self.shared.node.view().state;
        if state.member(&r.name).is_none() {
            return Err(Status::not_found(format!("no member {}", r.name)));
        }
        if state.members.len() <= 3 {
            return Err(Status::failed_precondition(format!(
                "removing {} would leave {} members; a ring needs at least 3",
                r.name,
                state.members.len() - 1
            )));
        }
        let hosted: Vec<&str> = state
            .placements
            .values()
            .filter(|p| p.host == r.name && p.shoot != r.name)
            .map(|p| p.shoot.as_str())
            .collect();
        if !hosted.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{} hosts the control plane of {}; it can leave once that moved (planned migration)",
                r.name,
                hosted.join(", ")
            )));
        }
        let cmd = RingCommand::RemoveMember {
            name: r.name.clone(),
        };
        self.shared
            .node
            .change_membership(cmd, self.shared.proposal_timeout())
            .await
            .map_err(propose_status)?;
        Ok(Response::new(MembershipReply {
            detail: format!("removed {}", r.name),
            id: 0,
        }))
    }

    async fn migrate(
        &self,
        req: Request<MigrateRequest>,
    ) -> Result<Response<MigrateReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::Admin)?;
        let r = req.into_inner();
        let cmd = RingCommand::StartMigration {
            shoot: r.shoot.clone(),
            to: r.to.clone(),
            at_ms: now_ms(),
        };
        self.shared.propose(cmd).await.map_err(propose_status)?;
        let op = self
            .shared
            .node
            .view()
            .state
            .open_operation(&r.shoot)
            .map(|o| o.id)
            .ok_or_else(|| Status::internal("the migration was committed but is not open"))?;
        Ok(Response::new(MigrateReply { operation: op }))
    }

    type FetchHandoverStream =
        tokio_stream::wrappers::ReceiverStream<Result<HandoverChunk, Status>>;

    async fn fetch_handover(
        &self,
        req: Request<HandoverRequest>,
    ) -> Result<Response<Self::FetchHandoverStream>, Status> {
        let caller = authorize(&req, &self.shared.directory, Caller::Member)?;
        let r = req.into_inner();
        let state = self.shared.node.view().state;
        let op = state
            .operations
            .iter()
            .find(|o| o.id == r.operation)
            .ok_or_else(|| Status::not_found(format!("no operation {}", r.operation)))?;
        if !op.is_migration()
            || op.shoot() != r.shoot
            || op.target() != caller
            || op.source() != self.shared.name()
        {
            return Err(Status::permission_denied(format!(
                "operation {} does not hand {} over from {} to {caller}",
                r.operation,
                r.shoot,
                self.shared.name()
            )));
        }
        if op.step != crate::state::OperationStep::Restoring {
            return Err(Status::failed_precondition(format!(
                "operation {} is {:?}, not Restoring",
                op.id, op.step
            )));
        }
        let seed = self
            .shared
            .local_seed()
            .cloned()
            .ok_or_else(|| Status::failed_precondition("this member has no seed"))?;
        let layout = seed.layout(&r.shoot);
        let files =
            migrate::handover::files(&layout).map_err(|e| Status::internal(e.to_string()))?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            for rel in files {
                let path = layout.dir.join(&rel);
                let name = rel.display().to_string();
                let mut file = match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) => {
                        let _ = tx
                            .send(Err(Status::internal(format!("{}: {e}", path.display()))))
                            .await;
                        return;
                    }
                };
                let mut buf = vec![0u8; 256 * 1024];
                loop {
                    let n = match file.read(&mut buf).await {
                        Ok(n) => n,
                        Err(e) => {
                            let _ = tx
                                .send(Err(Status::internal(format!("{}: {e}", path.display()))))
                                .await;
                            return;
                        }
                    };
                    let chunk = HandoverChunk {
                        path: name.clone(),
                        data: buf[..n].to_vec(),
                        eof: n == 0,
                    };
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                    if n == 0 {
                        break;
                    }
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn probe(&self, req: Request<ProbeRequest>) -> Result<Response<ProbeReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::MemberOrAdmin)?;
        let payload = req.into_inner().payload;
        if payload.len() > 64 * 1024 {
            return Err(Status::invalid_argument("probe payload larger than 64 KiB"));
        }
        let index = self
            .shared
            .propose(RingCommand::Probe { payload })
            .await
            .map_err(propose_status)?;
        Ok(Response::new(ProbeReply {
            index,
            term: self.shared.node.view().term,
        }))
    }
}
