//! Supervising a shoot's components on a local seed: starting them in
//! order (etcd, kube-apiserver once etcd answers, the others once the API
//! is ready), stopping some or all. The seed's map of running control planes
//! is locked only to look at or change it, never while a component starts:
//! a fence or a stop of one shoot, or the start of another, does not wait
//! behind a start (a start stopped meanwhile ends with
//! [`SeedError::StoppedWhileStarting`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::fcntl::Flock;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    acquire_lock, check_port, check_ports, etcd_tls_args, p, LocalSeed, ShootLayout, StatusFile,
};
use crate::error::{Result, SeedError};
use crate::pki::{create_private_dir, write_private};
use crate::process::{supervise, Component, ComponentSpec, States};
use crate::{ControlPlaneSpec, Seed};

/// How long `start` waits for etcd to accept connections before giving up.
const ETCD_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `start` waits for kube-apiserver's `/readyz` before starting the others.
const API_START_WAIT: Duration = Duration::from_secs(60);

/// Every component of a local control plane in start order (stop order is
/// the reverse): the usual four, and the relay from the shoot's address to
/// a promoted standby's warm kube-apiserver ([`super::WarmApi`]), which
/// comes before it (kube-apiserver's start waits for `/readyz` at the
/// shoot's address, which only the relay serves).
pub(super) const SHOOT_ORDER: [Component; 6] = [
    Component::Etcd,
    Component::EtcdForwarder,
    Component::ApiForwarder,
    Component::KubeApiserver,
    Component::KubeControllerManager,
    Component::KubeScheduler,
];

/// Each relay of a promoted standby with the component it leads the shoot's
/// address to: it starts and stops with that component.
pub(super) const RELAYS: [(Component, Component); 2] = [
    (Component::EtcdForwarder, Component::Etcd),
    (Component::ApiForwarder, Component::KubeApiserver),
];

/// `only` with the relays of the components it names (see [`RELAYS`]).
fn with_relays(only: &[Component]) -> Vec<Component> {
    let mut out = only.to_vec();
    for (relay, to) in RELAYS {
        if only.contains(&to) && !out.contains(&relay) {
            out.push(relay);
        }
    }
    out
}

/// Tells the starts of this process apart (see [`Running::generation`]).
static GENERATIONS: AtomicU64 = AtomicU64::new(0);

/// A control plane this process supervises.
pub(super) struct Running {
    /// Which start made it: a start whose supervision was stopped meanwhile
    /// (and maybe begun again by another start) adds nothing to it.
    pub(super) generation: u64,
    /// A hot standby's (etcd, maybe a warm kube-apiserver), not a serving
    /// control plane; cleared when the standby is promoted.
    pub(super) standby: bool,
    /// The warm kube-apiserver started next to the standby, if any.
    pub(super) warm: Option<super::WarmApi>,
    tokens: BTreeMap<Component, CancellationToken>,
    tasks: BTreeMap<Component, JoinHandle<()>>,
    /// The components' states; the status writer ends once every sender is gone.
    status: watch::Sender<States>,
    writer: JoinHandle<()>,
    pub(super) states: watch::Receiver<States>,
    _lock: Flock<File>,
}

impl Running {
    /// Whether component `c` is supervised.
    pub(super) fn has(&self, c: Component) -> bool {
        self.tasks.contains_key(&c)
    }

    /// Whether this is a hot standby whose etcd runs.
    pub(super) fn runs_standby(&self) -> bool {
        self.standby && self.has(Component::Etcd)
    }

    /// Sends `signal` to the process group of each of `components` that
    /// runs (its supervisor sees it exit, and restarts it unless told to stop).
    pub(super) fn signal(&self, components: &[Component], signal: nix::sys::signal::Signal) {
        let pids: Vec<u32> = {
            let states = self.states.borrow();
            components
                .iter()
                .filter_map(|c| states.get(c).and_then(|s| s.pid))
                .collect()
        };
        for pid in pids {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
    }

    /// Tells every component's supervisor to stop (none restarts its
    /// component any more), without waiting.
    pub(super) fn cancel(&self) {
        for t in self.tokens.values() {
            t.cancel();
        }
    }

    /// Stops components in reverse start order, waiting for each.
    pub(super) async fn shutdown(mut self) {
        for c in SHOOT_ORDER.iter().rev() {
            if let Some(t) = self.tokens.get(c) {
                t.cancel();
            }
            if let Some(task) = self.tasks.remove(c) {
                let _ = task.await;
            }
        }
        drop(self.status);
        let _ = self.writer.await;
    }
}

impl LocalSeed {
    /// Starts only the given components of the shoot's control plane (e.g. etcd
    /// alone, to take a final snapshot without writers). Nothing may run yet.
    pub async fn start_only(&self, spec: &ControlPlaneSpec, only: &[Component]) -> Result<()> {
        let specs = self.specs_of(spec, None, |c| only.contains(&c));
        let free = || check_ports(spec);
        self.supervise(spec, specs, etcd_addr(spec), free, false)
            .await
    }

    /// The command lines of the shoot's components that `wanted`, in start order.
    fn specs_of(
        &self,
        spec: &ControlPlaneSpec,
        warm: Option<super::WarmApi>,
        wanted: impl Fn(Component) -> bool,
    ) -> Vec<ComponentSpec> {
        self.specs_for(spec, warm)
            .into_iter()
            .filter(|cs| wanted(cs.component))
            .collect()
    }

    /// Runs a hot standby of the shoot's etcd here: a member joining the
    /// cluster the shoot's host serves (`initial_cluster`, from adding it as
    /// a learner), named `name`, listening on `ports` (client, peer) of the
    /// shoot's address. Not under the lease guard: a standby holds no lease
    /// and cannot serve writes alone. Its data goes where the shoot's etcd
    /// data goes, so a promotion serves from it in place.
    pub async fn start_standby(
        &self,
        spec: &ControlPlaneSpec,
        name: &str,
        ports: (u16, u16),
        initial_cluster: &str,
    ) -> Result<()> {
        let layout = self.layout(&spec.shoot);
        let e = &spec.endpoint;
        let (client, peer) = (
            format!("https://{}:{}", e.address, ports.0),
            format!("https://{}:{}", e.address, ports.1),
        );
        let mut args = vec![
            format!("--name={name}"),
            format!("--data-dir={}", p(layout.etcd_data())),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={initial_cluster}"),
            "--initial-cluster-state=existing".into(),
        ];
        args.extend(etcd_tls_args(&layout));
        let etcd = ComponentSpec {
            component: Component::Etcd,
            program: self.bins.etcd.clone(),
            args,
            log: layout.log(Component::Etcd),
            netns: None,
        };
        let addr = SocketAddr::from((e.address, ports.0));
        let free = || {
            for port in [ports.0, ports.1] {
                check_port(
                    &spec.shoot,
                    "etcd (standby)",
                    SocketAddr::from((e.address, port)),
                )?;
            }
            Ok(())
        };
        self.supervise(spec, vec![etcd], addr, free, true).await
    }

    /// Supervises `specs` of the shoot (in order) once `free` says their
    /// sockets are free, waiting for etcd at `etcd_addr` and for the API
    /// before the components after them; a hot `standby`'s, or a control
    /// plane's.
    async fn supervise(
        &self,
        spec: &ControlPlaneSpec,
        specs: Vec<ComponentSpec>,
        etcd_addr: SocketAddr,
        free: impl FnOnce() -> Result<()>,
        standby: bool,
    ) -> Result<()> {
        let generation = self.begin(spec, free, standby).await?;
        self.run_components(&spec.shoot, generation, specs, etcd_addr)
            .await
    }

    /// Starts the given components of a shoot whose supervision runs and
    /// lacks them (etcd again after it was stopped to re-form it, say), in
    /// order, leaving the others as they are: a kube-apiserver that runs
    /// reconnects to the new etcd by itself (a promoted standby's
    /// components are completed around its warm kube-apiserver). With
    /// nothing running, a start of just those.
    pub async fn start_missing(&self, spec: &ControlPlaneSpec, only: &[Component]) -> Result<()> {
        // a relay comes with what it leads to, as it stops with it
        self.start_missing_of(spec, &with_relays(only)).await
    }

    /// [`LocalSeed::start_missing`] of exactly `only` (no relay unless
    /// named): a promoted etcd starts before its relay may take the shoot's
    /// address.
    pub(super) async fn start_missing_of(
        &self,
        spec: &ControlPlaneSpec,
        only: &[Component],
    ) -> Result<()> {
        let supervised = {
            let running = self.running.lock().await;
            running.get(&spec.shoot).map(|r| {
                let present = r.tasks.keys().copied().collect::<Vec<_>>();
                (r.generation, r.warm, present)
            })
        };
        let Some((generation, warm, present)) = supervised else {
            return self.start_only(spec, only).await;
        };
        let specs = self.specs_of(spec, warm, |c| only.contains(&c) && !present.contains(&c));
        // a promoted etcd answers on the standby's client port
        let etcd = warm.map_or_else(|| etcd_addr(spec), |w| w.etcd_addr(&spec.endpoint));
        self.run_components(&spec.shoot, generation, specs, etcd)
            .await
    }

    /// Runs `specs` in order under the supervision `generation` began.
    async fn run_components(
        &self,
        shoot: &str,
        generation: u64,
        specs: Vec<ComponentSpec>,
        etcd_addr: SocketAddr,
    ) -> Result<()> {
        for cs in specs {
            let c = cs.component;
            self.spawn_component(shoot, generation, cs).await?;
            match c {
                Component::Etcd => self.wait_etcd(shoot, generation, etcd_addr).await?,
                // kube-controller-manager and kube-scheduler exit while RBAC is not yet
                // bootstrapped; start them once the API is ready so their restart
                // counts mean real crashes.
                Component::KubeApiserver => self.wait_api(shoot, generation).await?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Claims the shoot (nothing of it may run here or in another process),
    /// prepares its files and records its supervision (a hot `standby`'s or
    /// not), still empty.
    async fn begin(
        &self,
        spec: &ControlPlaneSpec,
        free: impl FnOnce() -> Result<()>,
        standby: bool,
    ) -> Result<u64> {
        let mut running = self.running.lock().await;
        if running.contains_key(&spec.shoot) {
            return Err(SeedError::AlreadyRunning {
                shoot: spec.shoot.clone(),
                pid: std::process::id(),
            });
        }
        spec.validate()?;
        let layout = self.layout(&spec.shoot);
        create_private_dir(&layout.dir)?;
        let lock = acquire_lock(&layout, &spec.shoot)?;
        self.prepare(spec)?;
        free()?;
        let (status, states) = watch::channel(States::new());
        let writer = tokio::spawn(write_status(layout.status_file(), states.clone()));
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        let r = Running {
            generation,
            standby,
            warm: None,
            tokens: BTreeMap::new(),
            tasks: BTreeMap::new(),
            status,
            writer,
            states,
            _lock: lock,
        };
        running.insert(spec.shoot.clone(), r);
        Ok(generation)
    }

    /// Starts supervising one component, unless the start was stopped meanwhile.
    pub(super) async fn spawn_component(
        &self,
        shoot: &str,
        generation: u64,
        cs: ComponentSpec,
    ) -> Result<()> {
        let mut running = self.running.lock().await;
        let r = running
            .get_mut(shoot)
            .filter(|r| r.generation == generation)
            .ok_or_else(|| stopped(shoot))?;
        let c = cs.component;
        let token = CancellationToken::new();
        let task = supervise(cs, token.clone(), r.status.clone(), self.tuning);
        let span = tracing::info_span!("component", shoot = %shoot, component = %c);
        r.tasks
            .insert(c, tokio::spawn(tracing::Instrument::instrument(task, span)));
        r.tokens.insert(c, token);
        Ok(())
    }

    /// Whether the supervision this start began still runs.
    async fn current(&self, shoot: &str, generation: u64) -> bool {
        let running = self.running.lock().await;
        running
            .get(shoot)
            .is_some_and(|r| r.generation == generation)
    }

    /// Waits until etcd accepts connections; past [`ETCD_START_TIMEOUT`]
    /// the start is undone and fails with etcd's last log lines.
    async fn wait_etcd(&self, shoot: &str, generation: u64, addr: SocketAddr) -> Result<()> {
        let deadline = tokio::time::Instant::now() + ETCD_START_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            if !self.current(shoot, generation).await {
                return Err(stopped(shoot));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.abandon(shoot, generation).await;
        let log = self.layout(shoot).log(Component::Etcd);
        Err(SeedError::NotReady {
            shoot: shoot.to_string(),
            waited_secs: ETCD_START_TIMEOUT.as_secs(),
            last: format!(
                "etcd does not accept connections on {addr}; last lines of {}:\n{}",
                log.display(),
                ShootLayout::tail(&log, 15)
            ),
        })
    }

    /// Waits (at most [`API_START_WAIT`]) until kube-apiserver is ready.
    async fn wait_api(&self, shoot: &str, generation: u64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + API_START_WAIT;
        while !matches!(self.health(shoot).await, Ok(h) if h.ready) {
            if !self.current(shoot, generation).await {
                return Err(stopped(shoot));
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(shoot = %shoot, "kube-apiserver not ready yet; starting the rest anyway");
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Stops what this start began, unless it was stopped already.
    async fn abandon(&self, shoot: &str, generation: u64) {
        let r = {
            let mut running = self.running.lock().await;
            match running.get(shoot) {
                Some(r) if r.generation == generation => running.remove(shoot),
                _ => None,
            }
        };
        if let Some(r) = r {
            r.shutdown().await;
        }
    }

    /// Stops only the given components (in reverse start order), keeping the
    /// others running (kube-apiserver's relay goes with it, etcd's with
    /// etcd); stopping the last one ends the supervision.
    pub async fn stop_only(&self, shoot: &str, only: &[Component]) -> Result<()> {
        let mut running = self.running.lock().await;
        let Some(r) = running.get_mut(shoot) else {
            return Ok(());
        };
        let stops = with_relays(only);
        for c in SHOOT_ORDER.iter().rev().filter(|c| stops.contains(c)) {
            if let Some(t) = r.tokens.remove(c) {
                t.cancel();
            }
            if let Some(task) = r.tasks.remove(c) {
                let _ = task.await;
            }
        }
        if r.tasks.is_empty() {
            if let Some(r) = running.remove(shoot) {
                drop(running);
                r.shutdown().await;
            }
        }
        Ok(())
    }

    /// Deletes everything this seed keeps for `shoot` (data, PKI, logs). Refused
    /// while any process supervises it, here or in another process.
    pub async fn remove_data(&self, shoot: &str) -> Result<()> {
        crate::validate_shoot_name(shoot)?;
        if !self.running_components(shoot).await.is_empty() {
            return Err(SeedError::AlreadyRunning {
                shoot: shoot.to_string(),
                pid: std::process::id(),
            });
        }
        let layout = self.layout(shoot);
        if !layout.dir.exists() {
            return Ok(());
        }
        // holding the supervisor lock proves no other process runs the shoot
        let _lock = acquire_lock(&layout, shoot)?;
        std::fs::remove_dir_all(&layout.dir).map_err(SeedError::io(&layout.dir))
    }

    /// The components this process supervises for `shoot`.
    pub async fn running_components(&self, shoot: &str) -> Vec<Component> {
        self.running
            .lock()
            .await
            .get(shoot)
            .map(|r| r.tasks.keys().copied().collect())
            .unwrap_or_default()
    }
}

/// Where the shoot's etcd serves its clients.
fn etcd_addr(spec: &ControlPlaneSpec) -> SocketAddr {
    SocketAddr::from((spec.endpoint.address, spec.endpoint.etcd_client_port))
}

/// A start whose supervision was stopped (a fence, a stop) before it ended.
fn stopped(shoot: &str) -> SeedError {
    SeedError::StoppedWhileStarting {
        shoot: shoot.to_string(),
    }
}

async fn write_status(path: PathBuf, mut rx: watch::Receiver<States>) {
    loop {
        let file = StatusFile {
            supervisor_pid: std::process::id(),
            components: rx.borrow_and_update().clone(),
        };
        match serde_json::to_vec_pretty(&file) {
            Ok(json) => {
                if let Err(e) = write_private(&path, &json) {
                    tracing::warn!(error = %e, "cannot write status file");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot encode status"),
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
}
