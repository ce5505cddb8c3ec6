//! The local seed: hosts control planes as supervised processes on this machine.
//!
//! Layout of a shoot under the seed's state directory:
//!
//! ```text
//! <state-dir>/shoots/<shoot>/
//!   shoot.json          the spec (endpoint) the shoot was created with
//!   pki/                CA, certificates and keys (0600)
//!   etcd/               etcd's data directory
//!   kubeconfig/         admin, kube-controller-manager and kube-scheduler kubeconfigs
//!   logs/<component>.log
//!   run/                scratch (serving certificates the components make themselves)
//!   supervisor.lock     flock held by the supervising process; holds its pid
//!   status.json         pids, restarts and last exits, rewritten on every change
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::binaries::Binaries;
use crate::error::{Result, SeedError};
use crate::kubeconfig;
use crate::pki::{create_private_dir, write_private, Leaf};
use crate::process::{pid_alive, Component, States, SupervisorTuning};
use crate::{ComponentStatus, ControlPlaneSpec, ControlPlaneStatus, Health, Phase, Seed};

mod layout;
mod specs;
mod supervision;
mod warm;
pub use layout::{holds_data, ShootLayout};
use specs::etcd_tls_args;
use supervision::Running;
pub use warm::WarmApi;

/// How long `stop` waits for another process's supervisor to exit after SIGTERM.
const FOREIGN_STOP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusFile {
    supervisor_pid: u32,
    components: States,
}

/// A seed that runs control planes as local processes under `state_dir`.
pub struct LocalSeed {
    root: PathBuf,
    bins: Binaries,
    tuning: SupervisorTuning,
    /// Shoot → the address its kube-apiserver advertises (the `kubernetes`
    /// Service's endpoint, which pods use); default: the shoot's loopback address.
    advertise: std::collections::BTreeMap<String, std::net::Ipv4Addr>,
    /// `ring-agent`, when the control plane runs under its lease guard.
    guard: Option<PathBuf>,
    /// Whether kube-apiservers serve the deprecated beta API versions.
    apis: crate::DeprecatedApis,
    running: Mutex<HashMap<String, Running>>,
    /// Held while a shoot's PKI and kubeconfigs are written (a start and a
    /// renewal reissuing one leaf at once could pair one's key with the
    /// other's certificate).
    files: std::sync::Mutex<()>,
    /// What the etcd program says its version is (asked once).
    etcd_version: tokio::sync::OnceCell<Option<String>>,
}

/// Dropping the seed stops supervising every control plane it started in
/// this process, without waiting: no component is restarted any more (each
/// supervisor stops its own). An owner that goes away while its processes
/// are killed and its dir removed (a test's sandbox) would otherwise see
/// them started again into the removed dir.
impl Drop for LocalSeed {
    fn drop(&mut self) {
        for running in self.running.get_mut().values() {
            running.cancel();
        }
    }
}

impl LocalSeed {
    /// A local seed keeping its shoots under `state_dir/shoots`.
    pub fn new(state_dir: impl Into<PathBuf>, bins: Binaries) -> Self {
        LocalSeed {
            root: state_dir.into(),
            bins,
            tuning: SupervisorTuning::default(),
            advertise: Default::default(),
            guard: None,
            apis: Default::default(),
            running: Mutex::new(HashMap::new()),
            files: std::sync::Mutex::new(()),
            etcd_version: tokio::sync::OnceCell::new(),
        }
    }

    /// Runs etcd and kube-apiserver under `ring-agent guard` at `agent`, which
    /// stops them at the fence time in the shoot's lease file
    /// ([`crate::lease_file`]); without a lease file they do not start.
    pub fn with_guard(mut self, agent: PathBuf) -> Self {
        self.guard = Some(agent);
        self
    }

    /// Whether kube-apiservers serve the deprecated beta API versions
    /// [default: not served].
    pub fn with_deprecated_apis(mut self, apis: crate::DeprecatedApis) -> Self {
        self.apis = apis;
        self
    }

    /// Overrides restart backoff and stop grace periods.
    pub fn with_tuning(mut self, tuning: SupervisorTuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Addresses kube-apiservers advertise, per shoot: where pods of the shoot's
    /// nodes reach their API (Endpoints may not hold loopback addresses).
    pub fn with_advertise(
        mut self,
        advertise: std::collections::BTreeMap<String, std::net::Ipv4Addr>,
    ) -> Self {
        self.advertise = advertise;
        self
    }

    /// The file layout of `shoot` on this seed.
    pub fn layout(&self, shoot: &str) -> ShootLayout {
        ShootLayout {
            dir: self.root.join("shoots").join(shoot),
        }
    }

    /// The spec to use for `shoot`: the recorded one, or the default for a new shoot.
    /// `address` overrides the default for a new shoot and must match for an existing one.
    pub fn spec_for(
        &self,
        shoot: &str,
        address: Option<std::net::Ipv4Addr>,
    ) -> Result<ControlPlaneSpec> {
        crate::validate_shoot_name(shoot)?;
        check_writable(&self.root)?;
        let recorded = self.layout(shoot).read_spec()?;
        let spec = match (recorded, address) {
            (Some(spec), Some(addr)) if spec.endpoint.address != addr => {
                return Err(SeedError::InvalidSpec {
                    field: "--api-address".into(),
                    reason: format!(
                        "shoot {shoot} was created with address {}; its kubeconfigs and certificates name that address",
                        spec.endpoint.address
                    ),
                })
            }
            (Some(spec), _) => spec,
            (None, Some(addr)) => ControlPlaneSpec {
                shoot: shoot.to_string(),
                endpoint: crate::ShootEndpoint::on(addr),
            },
            (None, None) => ControlPlaneSpec::new(shoot),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Names of the shoots that have state on this seed.
    pub fn shoots(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.join("shoots"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("shoot.json").exists())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// Creates the shoot's directories, records its spec, makes its PKI and kubeconfigs.
    pub fn prepare(&self, spec: &ControlPlaneSpec) -> Result<ShootLayout> {
        self.prepare_files(spec).map(|(layout, _)| layout)
    }

    /// [`LocalSeed::prepare`], also returning the leaves it reissued.
    fn prepare_files(&self, spec: &ControlPlaneSpec) -> Result<(ShootLayout, Vec<Leaf>)> {
        spec.validate()?;
        let _files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        let layout = self.layout(&spec.shoot);
        check_writable(&layout.dir)?;
        for sub in ["etcd", "kubeconfig", "logs", "run"] {
            create_private_dir(&layout.dir.join(sub))?;
        }
        match layout.read_spec()? {
            Some(old) if old.endpoint != spec.endpoint => {
                return Err(SeedError::InvalidSpec {
                    field: "endpoint".into(),
                    reason: format!(
                        "shoot {} was created with endpoint {:?}, not {:?}",
                        spec.shoot, old.endpoint, spec.endpoint
                    ),
                })
            }
            Some(_) => {}
            None => {
                let json = serde_json::to_vec_pretty(spec).map_err(|e| SeedError::InvalidSpec {
                    field: "spec".into(),
                    reason: e.to_string(),
                })?;
                write_private(&layout.spec_file(), &json)?;
            }
        }
        let pki = layout.pki();
        let reissued = pki.ensure(&spec.shoot, &spec.endpoint)?;
        let server = spec.endpoint.api_url();
        kubeconfig::write(
            &layout.admin_kubeconfig(),
            &spec.shoot,
            "admin",
            &server,
            &pki,
            &pki.leaf(Leaf::Admin),
        )?;
        for (c, leaf) in [
            (Component::KubeControllerManager, Leaf::ControllerManager),
            (Component::KubeScheduler, Leaf::Scheduler),
        ] {
            kubeconfig::write(
                &layout.component_kubeconfig(c),
                &spec.shoot,
                c.name(),
                &server,
                &pki,
                &pki.leaf(leaf),
            )?;
        }
        Ok((layout, reissued))
    }

    /// [`Seed::renew_certificates`] here: the due leaves reissued in the
    /// shoot's PKI directory, kubeconfigs rewritten, and each component
    /// whose kubeconfig changed, if this process supervises it, stopped with
    /// SIGTERM: its supervisor starts it again (after 0.5 s) with the same
    /// command line, which reads the new kubeconfig. A fence or a move that
    /// stops the control plane meanwhile stops that supervisor too.
    async fn renew(&self, shoot: &str) -> Result<Vec<Leaf>> {
        let layout = self.layout(shoot);
        let Some(spec) = layout.read_spec()? else {
            return Err(SeedError::UnknownShoot {
                shoot: shoot.to_string(),
                path: layout.dir,
            });
        };
        let (_, renewed) = self.prepare_files(&spec)?;
        if renewed.is_empty() {
            return Ok(renewed);
        }
        let restart: Vec<Component> = renewed.iter().filter_map(|l| l.restarts()).collect();
        tracing::info!(shoot, ?renewed, ?restart, "certificates renewed");
        if let Some(r) = self.running.lock().await.get(shoot) {
            r.signal(&restart, nix::sys::signal::Signal::SIGTERM);
        }
        Ok(renewed)
    }
}

/// Creates `dir` (0700) if needed and proves it writable. Each call writes its
/// own probe file: callers run concurrently (a member starts one control plane
/// while it restores another), and a shared probe name let one caller remove
/// the file another had just written (ENOENT, a spurious "not writable").
fn check_writable(dir: &Path) -> Result<()> {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    create_private_dir(dir)?;
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".write-probe-{}-{n}", std::process::id()));
    std::fs::write(&probe, b"")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|source| SeedError::StateDir {
            path: dir.to_path_buf(),
            source,
        })
}

fn acquire_lock(layout: &ShootLayout, shoot: &str) -> Result<Flock<File>> {
    let path = layout.lock_file();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(SeedError::io(&path))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err(_) => {
            return Err(SeedError::AlreadyRunning {
                shoot: shoot.to_string(),
                pid: layout.supervisor_pid().unwrap_or(0),
            })
        }
    };
    let write = |f: &mut File| -> std::io::Result<()> {
        f.set_len(0)?;
        f.rewind()?;
        write!(f, "{}", std::process::id())?;
        f.sync_all()
    };
    write(&mut lock).map_err(SeedError::io(&path))?;
    Ok(lock)
}

/// Fails with [`SeedError::PortInUse`] if any socket of the spec's endpoint is taken.
pub fn check_ports(spec: &ControlPlaneSpec) -> Result<()> {
    for (component, addr) in spec.endpoint.sockets() {
        check_port(&spec.shoot, component, addr)?;
    }
    Ok(())
}

/// Fails with [`SeedError::PortInUse`] if `addr` is taken.
fn check_port(shoot: &str, component: &str, addr: SocketAddr) -> Result<()> {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(SeedError::PortInUse {
            shoot: shoot.to_string(),
            component: component.to_string(),
            addr,
        }),
        Err(e) => Err(SeedError::InvalidSpec {
            field: "endpoint".into(),
            reason: format!("cannot listen on {addr} for {component}: {e}"),
        }),
    }
}

fn p(path: PathBuf) -> String {
    path.display().to_string()
}

#[async_trait::async_trait]
impl Seed for LocalSeed {
    async fn start(&self, spec: &ControlPlaneSpec) -> Result<()> {
        if self.promoted_warm(&spec.shoot).await.is_some() {
            // the promotion's start (its etcd may run already, on the
            // standby's ports): nothing else may hold the shoot's sockets,
            // which the relays take (a relay that cannot listen only exits)
            let running = self.running_components(&spec.shoot).await;
            if !supervision::RELAYS.iter().any(|(r, _)| running.contains(r)) {
                check_ports(spec)?;
            }
            return self.start_missing(spec, &supervision::SHOOT_ORDER).await;
        }
        self.start_only(spec, &Component::ALL).await
    }

    async fn stop(&self, shoot: &str) -> Result<()> {
        let mine = self.running.lock().await.remove(shoot);
        if let Some(r) = mine {
            r.shutdown().await;
            return Ok(());
        }
        let layout = self.layout(shoot);
        if !layout.spec_file().exists() {
            return Err(SeedError::UnknownShoot {
                shoot: shoot.to_string(),
                path: layout.dir,
            });
        }
        // Supervised by another process (e.g. a detached `ringctl controlplane run`).
        let Some(pid) = layout.supervisor_pid().filter(|p| *p != 0) else {
            return Ok(());
        };
        use nix::sys::signal::{kill, Signal};
        let target = nix::unistd::Pid::from_raw(pid as i32);
        let _ = kill(target, Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + FOREIGN_STOP_TIMEOUT;
        while layout.supervisor_pid().is_some() {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(shoot, pid, "supervisor ignored SIGTERM; sending SIGKILL");
                let _ = kill(target, Signal::SIGKILL);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn fence(&self, shoot: &str) -> Result<()> {
        let mine = self.running.lock().await.remove(shoot);
        let Some(r) = mine else {
            return self.stop(shoot).await;
        };
        // SIGKILL first (the API stops answering at once), then reap and stop supervising.
        r.signal(
            &[
                Component::ApiForwarder,
                Component::KubeApiserver,
                Component::KubeControllerManager,
                Component::KubeScheduler,
                Component::EtcdForwarder,
                Component::Etcd,
            ],
            nix::sys::signal::Signal::SIGKILL,
        );
        tracing::warn!(shoot, "control plane fenced (killed)");
        r.shutdown().await;
        Ok(())
    }

    async fn inspect(&self, shoot: &str) -> Result<ControlPlaneStatus> {
        let layout = self.layout(shoot);
        let Some(spec) = layout.read_spec()? else {
            return Err(SeedError::UnknownShoot {
                shoot: shoot.to_string(),
                path: layout.dir,
            });
        };
        let supervisor = layout.supervisor_pid();
        let recorded: Option<StatusFile> = std::fs::read(layout.status_file())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let states = recorded.map(|s| s.components).unwrap_or_default();
        let components: Vec<ComponentStatus> = Component::ALL
            .iter()
            .map(|c| {
                let state = states.get(c).cloned().unwrap_or_default();
                let running = supervisor.is_some() && state.pid.is_some_and(pid_alive);
                ComponentStatus {
                    component: *c,
                    running,
                    state,
                }
            })
            .collect();
        let (ready, readyz) = if supervisor.is_some() {
            match self.health(shoot).await {
                Ok(h) => (h.ready, h.detail),
                Err(e) => (false, e.to_string()),
            }
        } else {
            (false, "not running".to_string())
        };
        let all_running = components.iter().all(|c| c.running);
        let phase = match (supervisor, ready, all_running) {
            (None, _, _) => Phase::Stopped,
            (Some(_), false, _) => Phase::Starting,
            (Some(_), true, true) => Phase::Ready,
            (Some(_), true, false) => Phase::Degraded,
        };
        Ok(ControlPlaneStatus {
            shoot: shoot.to_string(),
            phase,
            api_url: spec.endpoint.api_url(),
            kubeconfig: layout.admin_kubeconfig(),
            supervisor_pid: supervisor,
            readyz,
            components,
        })
    }

    async fn health(&self, shoot: &str) -> Result<Health> {
        let layout = self.layout(shoot);
        let path = layout.admin_kubeconfig();
        if !path.exists() {
            return Err(SeedError::UnknownShoot {
                shoot: shoot.to_string(),
                path: layout.dir,
            });
        }
        let health = kubeconfig::readyz(shoot, &path).await?;
        match self.etcd_version().await {
            Some(v) => Ok(health.with_etcd(v)),
            None => Ok(health),
        }
    }

    async fn renew_certificates(&self, shoot: &str) -> Result<Vec<Leaf>> {
        self.renew(shoot).await
    }
}

impl LocalSeed {
    /// The version the etcd program this seed runs prints (`3.7.3`).
    async fn etcd_version(&self) -> Option<String> {
        let program = &self.bins.etcd;
        let timeout = std::time::Duration::from_secs(5);
        self.etcd_version
            .get_or_init(|| async move {
                crate::binaries::ask_version(program, &["--version"], timeout)
                    .await
                    .ok()
            })
            .await
            .clone()
    }
}

#[cfg(test)]
mod tests;
