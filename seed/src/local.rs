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
        let program = self.bins.etcd.clone();
        self.etcd_version
            .get_or_init(|| async move {
                let run = tokio::process::Command::new(&program)
                    .arg("--version")
                    .stdin(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .output();
                let out = tokio::time::timeout(std::time::Duration::from_secs(5), run).await;
                let out = out.ok()?.ok()?;
                crate::binaries::version_word(&String::from_utf8_lossy(&out.stdout))
                    .map(String::from)
            })
            .await
            .clone()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn concurrent_writability_checks_never_trip_over_each_other() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    (0..300)
                        .map(|_| super::check_writable(&dir))
                        .filter(|r| r.is_err())
                        .count()
                })
            })
            .collect();
        let failed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(failed, 0, "checks that failed while others ran");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no probe left");
    }

    use super::*;

    fn bins() -> Binaries {
        Binaries {
            etcd: "/bin/etcd".into(),
            kube_apiserver: "/bin/kube-apiserver".into(),
            kube_controller_manager: "/bin/kcm".into(),
            kube_scheduler: "/bin/ks".into(),
        }
    }

    #[test]
    fn every_component_binds_only_the_shoot_address() {
        let dir = tempfile::tempdir().unwrap();
        let seed = LocalSeed::new(dir.path(), bins());
        let spec = ControlPlaneSpec::new("alpha");
        let addr = spec.endpoint.address.to_string();
        let specs = seed.component_specs(&spec);
        assert_eq!(
            specs.iter().map(|s| s.component).collect::<Vec<_>>(),
            Component::ALL
        );
        for s in &specs {
            let binds: Vec<_> = s
                .args
                .iter()
                .filter(|a| a.starts_with("--bind-address") || a.starts_with("--listen-"))
                .collect();
            assert!(
                !binds.is_empty(),
                "{:?} binds nothing explicitly",
                s.component
            );
            for b in binds {
                assert!(b.contains(&addr), "{b} does not use {addr}");
            }
            assert!(s.log.starts_with(dir.path()));
        }
        // no flag the current release removed (it would refuse to start)
        for s in &specs {
            let removed = s.args.iter().find(|a| crate::process::is_removed_flag(a));
            assert_eq!(removed, None, "{:?}", s.component);
        }
    }

    /// kube-apiserver refuses a loopback address as the `kubernetes`
    /// Service's endpoint: a shoot without nodes (loopback) publishes none,
    /// one whose pods reach its API at a node address publishes that.
    #[test]
    fn only_a_routable_advertised_address_becomes_the_kubernetes_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ControlPlaneSpec::new("alpha");
        let none = "--endpoint-reconciler-type=none".to_string();
        let api = |seed: &LocalSeed| seed.component_specs(&spec)[1].args.clone();
        let bare = LocalSeed::new(dir.path(), bins());
        assert!(api(&bare).contains(&none));
        let node_address = [("alpha".to_string(), "198.19.0.1".parse().unwrap())];
        let with_nodes = LocalSeed::new(dir.path(), bins()).with_advertise(node_address.into());
        let args = api(&with_nodes);
        assert!(!args.contains(&none), "{args:?}");
        assert!(args.contains(&"--advertise-address=198.19.0.1".to_string()));
    }

    #[test]
    fn kube_apiserver_serves_deprecated_betas_only_when_asked_to() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ControlPlaneSpec::new("alpha");
        let api_args = |seed: LocalSeed| {
            let specs = seed.component_specs(&spec);
            let api = specs
                .iter()
                .find(|s| s.component == Component::KubeApiserver);
            api.expect("kube-apiserver's spec").args.clone()
        };
        let runtime_config = |args: &[String]| {
            let rc = args.iter().filter(|a| a.starts_with("--runtime-config="));
            rc.cloned().collect::<Vec<_>>()
        };
        let off = api_args(LocalSeed::new(dir.path(), bins()));
        assert!(runtime_config(&off).is_empty(), "{off:?}");
        let on = crate::DeprecatedApis::Served.apiserver_args();
        let served =
            LocalSeed::new(dir.path(), bins()).with_deprecated_apis(crate::DeprecatedApis::Served);
        assert_eq!(runtime_config(&api_args(served)), on);
        // under the guard too (its child's arguments follow `--`)
        let guarded = LocalSeed::new(dir.path(), bins())
            .with_guard("/bin/ring-agent".into())
            .with_deprecated_apis(crate::DeprecatedApis::Served);
        assert_eq!(runtime_config(&api_args(guarded)), on);
    }

    /// Under the lease guard, etcd's guard also watches etcd's data dir (a
    /// member that never committed is set aside before a start); the other
    /// components run guarded too (the controllers hold ports of the
    /// shoot's address a replacement on the same machine needs), without it.
    #[test]
    fn guarded_etcd_names_its_data_dir_to_the_guard() {
        let dir = tempfile::tempdir().unwrap();
        let seed = LocalSeed::new(dir.path(), bins()).with_guard("/bin/ring-agent".into());
        let spec = ControlPlaneSpec::new("alpha");
        let specs = seed.component_specs(&spec);
        let data = seed.layout("alpha").etcd_data().display().to_string();
        for s in &specs {
            let guarded = s.program == Path::new("/bin/ring-agent");
            let names_data = s
                .args
                .windows(2)
                .any(|w| w == ["--etcd-data", data.as_str()]);
            assert_eq!(
                (guarded, names_data),
                match s.component {
                    Component::Etcd => (true, true),
                    _ => (true, false),
                },
                "{:?}: {:?}",
                s.component,
                s.args
            );
        }
    }

    #[test]
    fn spec_for_keeps_recorded_address_and_rejects_a_conflicting_one() {
        let dir = tempfile::tempdir().unwrap();
        let seed = LocalSeed::new(dir.path(), bins());
        let addr = std::net::Ipv4Addr::new(127, 50, 0, 9);
        let spec = seed.spec_for("alpha", Some(addr)).unwrap();
        seed.prepare(&spec).unwrap();
        assert_eq!(seed.spec_for("alpha", None).unwrap().endpoint.address, addr);
        let err = seed
            .spec_for("alpha", Some(std::net::Ipv4Addr::new(127, 50, 0, 10)))
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("was created with address 127.50.0.9"),
            "{err}"
        );
        assert_eq!(seed.shoots(), vec!["alpha".to_string()]);
    }

    #[test]
    fn prepare_in_unwritable_place_is_a_state_dir_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        let seed = LocalSeed::new(file.join("state"), bins());
        let err = seed.prepare(&ControlPlaneSpec::new("alpha")).unwrap_err();
        assert!(matches!(err, SeedError::StateDir { .. }), "{err}");
        assert!(
            err.to_string().contains("choose a writable --state-dir"),
            "{err}"
        );
    }

    #[test]
    fn taken_port_is_reported_with_component_and_address() {
        let spec = ControlPlaneSpec {
            shoot: "alpha".into(),
            endpoint: crate::ShootEndpoint::on(std::net::Ipv4Addr::new(127, 51, 0, 1)),
        };
        let _squatter =
            std::net::TcpListener::bind((spec.endpoint.address, spec.endpoint.api_port)).unwrap();
        let err = check_ports(&spec).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("127.51.0.1:6443 (for kube-apiserver of shoot alpha) is already in use"),
            "{msg}"
        );
    }
}
