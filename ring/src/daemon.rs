//! `ringd`: one member of the ring. Opens the Raft store, binds the gRPC
//! (Raft transport + RingAdmin) and metrics listeners, builds the seed's
//! executor from config and spawns the tasks: the Raft node, the quorum's
//! loops (`quorum`) and the member loop (`member`) that serves, fences, backs
//! up and moves control planes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ring_proto::v1::raft_transport_server::RaftTransportServer;
use ring_proto::v1::ring_admin_server::RingAdminServer;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admin::AdminService;
use crate::config::RingdConfig;
use crate::identity::{IdentityFiles, IdentityPem};
use crate::member::MemberLoop;
use crate::metrics::Metrics;
use crate::node::{raft_logger, RaftCore, RaftTuning};
use crate::node_task::{NodeHandle, NodeTask};
use crate::shared::{lock, Shared};
use crate::storage::DiskStorage;
use crate::transport::{run_outbound, server_tls, Directory, RaftService};
use crate::RingError;

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

/// How long shutdown waits for a start in flight before stopping it too.
const START_WAIT_AT_SHUTDOWN: Duration = Duration::from_secs(15);

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
        stop_served(&self.shared).await;
        result
    }
}

/// Stops the control planes this member serves at shutdown. A start still in
/// flight would bring one up after the stop: it may finish first (bounded).
async fn stop_served(shared: &Shared) {
    let Some(executor) = shared.executor() else {
        return;
    };
    let deadline = Instant::now() + START_WAIT_AT_SHUTDOWN;
    while Instant::now() < deadline && MemberLoop::starting(shared) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shoots: Vec<String> = lock(&shared.hosted)
        .iter()
        .filter(|(_, h)| h.serving || h.starting)
        .map(|(s, _)| s.clone())
        .collect();
    for shoot in shoots {
        if let Err(e) = executor.stop_at_shutdown(&shoot).await {
            tracing::warn!(%shoot, error = %e, "stopping the control plane at shutdown");
        }
    }
}

/// Runs a ringd until `shutdown` (or a fatal error).
pub async fn run(config: RingdConfig, shutdown: CancellationToken) -> Result<(), RingError> {
    start(config, shutdown).await?.wait().await
}

/// The listeners a ringd serves on.
struct Listeners {
    grpc: TcpListener,
    grpc_addr: SocketAddr,
    metrics: Option<TcpListener>,
}

async fn bind(config: &RingdConfig) -> Result<Listeners, RingError> {
    let grpc = TcpListener::bind(&config.listen)
        .await
        .map_err(|source| RingError::Io {
            what: format!("listening on {} (listen)", config.listen),
            source,
        })?;
    let grpc_addr = grpc.local_addr().map_err(|source| RingError::Io {
        what: "reading the gRPC listener's address".into(),
        source,
    })?;
    let metrics = match &config.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| RingError::Io {
                    what: format!("listening on {addr} (metricsListen)"),
                    source,
                })?,
        ),
        None => None,
    };
    Ok(Listeners {
        grpc,
        grpc_addr,
        metrics,
    })
}

/// The Raft node of this member over its store.
fn raft_node(
    config: &RingdConfig,
    store: DiskStorage,
) -> Result<(NodeTask, NodeHandle, crate::transport::Outbox), RingError> {
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
    let (task, node) = NodeTask::new(core, tuning.tick, outbox_tx);
    Ok((task, node, outbox_rx))
}

fn directory_of(config: &RingdConfig) -> Directory {
    let directory = Directory::default();
    for m in &config.members {
        directory.insert(&m.name, m.id, &m.address);
    }
    directory.insert(&config.name, config.id, &config.listen);
    directory
}

/// Starts a ringd: opens its Raft store, binds its listeners, spawns its tasks.
pub async fn start(
    config: RingdConfig,
    shutdown: CancellationToken,
) -> Result<RunningDaemon, RingError> {
    config.validate()?;
    let identity = IdentityPem::read(&IdentityFiles::from(&config.tls))?;
    seed::pki::create_private_dir(&config.data_dir)?;
    let store = open_store(&config, &shutdown).await?;
    let (node_task, node, outbox) = raft_node(&config, store)?;
    let bucket = config
        .backup
        .as_ref()
        .map(crate::backups::RingBucket::open)
        .transpose()?;
    let executor = match &config.seed {
        Some(sc) => Some(crate::executor::for_config(sc, &config.name, bucket.as_ref()).await?),
        None => None,
    };
    let listeners = bind(&config).await?;
    let stop = shutdown.child_token();
    let (commands, commands_rx) = tokio::sync::mpsc::channel(64);
    let shared = Arc::new(Shared {
        config: config.clone(),
        node,
        directory: directory_of(&config),
        identity: Arc::new(tokio::sync::watch::channel(identity).0),
        executor,
        metrics: Metrics::new(&config.name),
        reports: Mutex::new(BTreeMap::new()),
        leases: Mutex::new(BTreeMap::new()),
        hosted: Mutex::new(BTreeMap::new()),
        standbys: Mutex::default(),
        backups: crate::backups::Backups::default(),
        bucket,
        commands,
        stop: stop.clone(),
    });
    let metrics_addr = listeners.metrics.as_ref().and_then(|l| l.local_addr().ok());
    let grpc_addr = listeners.grpc_addr;
    let mut tasks = JoinSet::new();
    // the transport outlives the other loops until the node task ended: a
    // stopping leader hands its leadership over through it
    let transport = CancellationToken::new();
    tasks.spawn(run_raft_thread(
        node_task,
        config.name.clone(),
        stop.clone(),
        transport.clone(),
    ));
    spawn_transport(&mut tasks, &shared, outbox, listeners, &transport);
    spawn_loops(&mut tasks, &shared, commands_rx, &stop);
    tracing::info!(member = %config.name, %grpc_addr, ?metrics_addr, "ringd started");
    Ok(RunningDaemon {
        grpc_addr,
        metrics_addr,
        shared,
        tasks,
        stop,
    })
}

/// Runs the node task on a thread of its own (a current-thread runtime):
/// its ticks, heartbeats and fsyncs then never wait behind ringd's other
/// work (backups compressing snapshots, kube clients, gRPC), which on a
/// loaded 2-core machine delayed ticks by up to a second, an election
/// timeout. `transport` is cancelled when the node task ends in any way.
async fn run_raft_thread(
    node_task: NodeTask,
    member: String,
    stop: CancellationToken,
    transport: CancellationToken,
) -> Result<(), RingError> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("raft-node".into())
        .spawn(move || {
            // cancels when the node task ends, also by a panic
            let _transport = transport.drop_guard();
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(source) => {
                    let what = "cannot build the raft node's runtime".to_string();
                    let _ = done_tx.send(Err(RingError::Io { what, source }));
                    return;
                }
            };
            let span = tracing::info_span!("raft", %member);
            let result =
                runtime.block_on(tracing::Instrument::instrument(node_task.run(stop), span));
            let _ = done_tx.send(result);
        });
    if let Err(source) = spawned {
        let what = "cannot start the raft node thread".to_string();
        return Err(RingError::Io { what, source });
    }
    done_rx.await.unwrap_or_else(|_| {
        Err(RingError::Raft(
            "the raft node thread ended without a result (it panicked)".into(),
        ))
    })
}

/// Raft messages out, the gRPC server (Raft transport + RingAdmin), `/metrics`.
fn spawn_transport(
    tasks: &mut JoinSet<Result<(), RingError>>,
    shared: &Arc<Shared>,
    outbox: crate::transport::Outbox,
    listeners: Listeners,
    stop: &CancellationToken,
) {
    let (node, directory, identity) = (
        shared.node.clone(),
        shared.directory.clone(),
        shared.identity_changes(),
    );
    let s = stop.clone();
    tasks.spawn(async move {
        run_outbound(outbox, node, directory, identity, s).await;
        Ok(())
    });
    let raft = RaftTransportServer::new(RaftService {
        node: shared.node.clone(),
        directory: shared.directory.clone(),
    })
    .max_decoding_message_size(16 * 1024 * 1024);
    let admin = RingAdminServer::new(AdminService::new(shared.clone()));
    let (s, grpc, identity) = (stop.clone(), listeners.grpc, shared.identity_changes());
    tasks.spawn(serve_grpc(raft, admin, grpc, identity, s));
    let files = IdentityFiles::from(&shared.config.tls);
    let (live, s) = (shared.identity.clone(), stop.clone());
    tasks.spawn(async move {
        crate::identity::watch_files(files, live, IDENTITY_CHECK_EVERY, s).await;
        Ok(())
    });
    if let Some(l) = listeners.metrics {
        let (shared, s) = (shared.clone(), stop.clone());
        tasks.spawn(async move { crate::metrics::serve(l, shared_metrics(shared), s).await });
    }
}

/// How often ringd looks for new member certificate files.
const IDENTITY_CHECK_EVERY: Duration = Duration::from_secs(2);

/// How long a gRPC server that stopped accepting (new identity, or ringd
/// stopping) may take to finish its open calls before they are cut.
const DRAIN: Duration = Duration::from_secs(5);

/// One running gRPC server: the token that ends it and its task.
type Serving = (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), RingError>>,
);

/// The gRPC server (Raft transport + RingAdmin) until `stop`. When the member
/// identity changes, a server with the new one takes over the same listener at
/// once and the old one finishes its open calls (at most [`DRAIN`]); an
/// identity rustls refuses is logged and the old server goes on.
async fn serve_grpc(
    raft: RaftTransportServer<RaftService>,
    admin: RingAdminServer<AdminService>,
    listener: tokio::net::TcpListener,
    mut identity: tokio::sync::watch::Receiver<IdentityPem>,
    stop: CancellationToken,
) -> Result<(), RingError> {
    let listener = Arc::new(listener);
    let mut current: Option<Serving> = None;
    loop {
        let tls = server_tls(&identity.borrow_and_update());
        match tonic::transport::Server::builder().tls_config(tls) {
            Ok(mut builder) => {
                let router = builder.add_service(raft.clone()).add_service(admin.clone());
                let token = stop.child_token();
                let incoming = futures::stream::unfold(listener.clone(), |l| async move {
                    let conn = l.accept().await.map(|(c, _)| c);
                    Some((conn, l))
                });
                let ends = token.clone().cancelled_owned();
                let task = tokio::spawn(async move {
                    router
                        .serve_with_incoming_shutdown(Box::pin(incoming), ends)
                        .await
                        .map_err(|e| RingError::Transport(format!("gRPC server: {e}")))
                });
                if let Some(old) = current.replace((token, task)) {
                    tracing::info!("serving gRPC with the new member identity");
                    tokio::spawn(drain(old));
                }
            }
            Err(e) if current.is_none() => {
                return Err(RingError::Transport(format!("TLS setup: {e}")))
            }
            Err(e) => {
                tracing::warn!(error = %e, "the new member identity cannot be served; serving with the one before")
            }
        }
        let Some((_, task)) = current.as_mut() else {
            return Ok(());
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            ended = task => {
                return match ended {
                    Ok(r) => r.and(Err(RingError::Transport("the gRPC server stopped".into()))),
                    Err(e) => Err(RingError::Transport(format!("the gRPC server failed: {e}"))),
                };
            }
            changed = identity.changed() => if changed.is_err() {
                stop.cancelled().await;
                break;
            },
        }
    }
    if let Some(old) = current {
        drain(old).await;
    }
    Ok(())
}

/// Ends a server: it stops accepting, its open calls get [`DRAIN`], then the
/// rest is cut.
async fn drain((token, mut task): Serving) {
    token.cancel();
    if tokio::time::timeout(DRAIN, &mut task).await.is_err() {
        tracing::warn!("gRPC calls still open after {DRAIN:?}; cutting them");
        task.abort();
    }
}

/// The quorum's loops and, with a seed, the member loop.
fn spawn_loops(
    tasks: &mut JoinSet<Result<(), RingError>>,
    shared: &Arc<Shared>,
    commands: tokio::sync::mpsc::Receiver<crate::state::RingCommand>,
    stop: &CancellationToken,
) {
    use crate::quorum;
    let (sh, s) = (shared.clone(), stop.clone());
    let loops: Vec<(&str, tokio::task::JoinHandle<()>)> = vec![
        (
            "directory",
            tokio::spawn(quorum::sync_directory(sh.clone(), s.clone())),
        ),
        (
            "bootstrap",
            tokio::spawn(quorum::bootstrap(sh.clone(), s.clone())),
        ),
        (
            "health",
            tokio::spawn(quorum::report_health(sh.clone(), s.clone())),
        ),
        ("decide", tokio::spawn(quorum::lead(sh.clone(), s.clone()))),
        (
            "commands",
            tokio::spawn(quorum::forward_commands(sh.clone(), commands, s.clone())),
        ),
    ];
    for (name, f) in loops {
        tasks.spawn(async move {
            f.await
                .map_err(|e| RingError::Raft(format!("{name} loop failed: {e}")))
        });
    }
    if let Some(executor) = shared.executor().cloned() {
        let member = MemberLoop::new(shared.clone(), executor);
        let s = stop.clone();
        tasks.spawn(async move {
            member.run(s).await;
            Ok(())
        });
    }
}

fn shared_metrics(shared: Arc<Shared>) -> impl Fn() -> String + Send + Sync + 'static {
    move || {
        shared.metrics.observe(
            &shared.node.view(),
            lock(&shared.hosted).values().filter(|h| h.serving).count(),
        );
        shared.metrics.certificates(&shared.certificates());
        shared.metrics.encode()
    }
}
