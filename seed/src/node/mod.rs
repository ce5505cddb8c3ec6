//! A real Kubernetes node for a shoot: containerd, kubelet and kube-proxy in the
//! node's own network namespace, supervised like control-plane processes.
//!
//! `ring-node --config node.yaml` runs one node until SIGTERM: it writes the
//! components' configs, forwards the shoot's API endpoint into the namespace,
//! starts containerd, imports the local images, starts kubelet (registered as
//! `system:node:<name>` with a certificate from the shoot's CA) and kube-proxy,
//! and reports in `status.json` whether the node registered and, if not, why.
//! SIGTERM stops everything: pods, shims, cgroups, nothing left. A supervisor
//! killed with SIGKILL takes containerd and kubelet with it (parent-death
//! signal) but leaves pods running; the next start adopts them.
//!
//! The node's processes share a mount namespace of their own in which
//! /var/log/pods is the node's private directory (kubelet removes log
//! directories of pods it does not know, so nodes on one machine must not share
//! it), and their mounts never show on the host.

pub mod config;
pub mod dns;
mod images;
pub mod net;
mod proxy_cert;
pub mod render;
pub mod renewal;
mod status;
pub mod teardown;

use std::collections::BTreeMap;

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use config::{NodeConfig, NodeLayout};
pub use render::NodeBinaries;
pub use status::{NodeStatus, Registration};

use crate::error::{Result, SeedError};
use crate::process::{supervise, Component, States, SupervisorTuning};

/// The CNI plugins a node's pod network runs (see `render::cni_conflist`).
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];

/// The pause image pods' sandboxes run (imported from the local archives).
pub const SANDBOX_IMAGE: &str = "docker.io/ring/pause:3.2";

fn node_err(config: &NodeConfig, reason: impl Into<String>) -> SeedError {
    SeedError::Node {
        node: config.name.clone(),
        reason: reason.into(),
    }
}

/// Finds containerd, kubelet, kube-proxy and the CNI plugins, or names the
/// missing one and `scripts/setup`.
pub fn find_binaries(config: &NodeConfig) -> Result<NodeBinaries> {
    let search = crate::BinarySearch::standard(config.bin_dir.as_deref());
    let cni_dirs = [crate::binaries::cache_cni_dir(), "/opt/cni/bin".into()];
    let cni_bin_dir = cni_dirs
        .iter()
        .find(|d| CNI_PLUGINS.iter().all(|p| d.join(p).exists()))
        .cloned()
        .ok_or_else(|| SeedError::MissingBinary {
            binary: format!("the CNI plugins {}", CNI_PLUGINS.join(", ")),
            searched: cni_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    Ok(NodeBinaries {
        containerd: search.find("containerd")?,
        shim: search.find("containerd-shim-runc-v2")?,
        kubelet: search.find("kubelet")?,
        kube_proxy: search.find("kube-proxy")?,
        runc: search.find("runc")?,
        cni_bin_dir,
    })
}

/// Whether this machine mounts the unified cgroup v2 hierarchy.
pub fn cgroup_v2() -> bool {
    std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// Gives this process a mount namespace of its own in which /var/log/pods is
/// the node's private directory. Call before any thread is started (the
/// binary does, before building its runtime): unshare and setns fail in a
/// threaded process.
///
/// A supervisor restarted while its pods run joins the mount namespace their
/// shims still hold instead of making a new one: containerd pins each pod's
/// network namespace with a mount made there, and a containerd started
/// elsewhere would find those pins gone, report the pods without an IP, and
/// kubelet would replace every running pod.
pub fn isolate_mounts(config: &NodeConfig) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let fail = |what: &str, e: nix::Error| {
        node_err(
            config,
            format!("{what}: {e} (a node needs root: CAP_SYS_ADMIN for its mount namespace)"),
        )
    };
    if let Some(file) = pods_mount_ns(config) {
        return nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| fail("joining the mount namespace of the node's running pods", e));
    }
    let logs = config.layout().pod_logs();
    let var_log_pods = std::path::Path::new("/var/log/pods");
    for dir in [&logs, &var_log_pods.to_path_buf()] {
        std::fs::create_dir_all(dir).map_err(SeedError::io(dir))?;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| fail("unshare(CLONE_NEWNS)", e))?;
    // Host mounts still appear here; nothing mounted here appears on the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| fail("making / a slave mount", e))?;
    mount(
        Some(&logs),
        var_log_pods,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| fail("bind-mounting the node's pod logs over /var/log/pods", e))
}

/// The mount namespace a killed supervisor left to its pods: that of a shim of
/// this node's containerd, when it is not this process's own. A shim that
/// exits before its namespace is opened leaves nothing to join.
fn pods_mount_ns(config: &NodeConfig) -> Option<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let ns_file = |pid: &str| format!("/proc/{pid}/ns/mnt");
    let ns_of = |pid: &str| {
        std::fs::metadata(ns_file(pid))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let own = ns_of("self")?;
    teardown::shim_pids(&config.layout().containerd_socket())
        .into_iter()
        .map(|pid| pid.to_string())
        .find(|pid| ns_of(pid).is_some_and(|ns| ns != own))
        .and_then(|pid| std::fs::File::open(ns_file(&pid)).ok())
}

/// Writes every config file the node's processes read; returns the
/// kube-proxy pair its kubeconfig was written with.
fn write_configs(config: &NodeConfig, bins: &NodeBinaries) -> Result<proxy_cert::Pair> {
    let layout = config.layout();
    for dir in [
        layout.config_file(""),
        layout.state().join("logs"),
        layout.containerd_root(),
        layout.containerd_state(),
        layout.kubelet_root(),
        layout.manifests(),
        layout.cni_conf(),
        layout.cni_ipam(),
    ] {
        std::fs::create_dir_all(&dir).map_err(SeedError::io(&dir))?;
    }
    let pki = layout.pki();
    for f in [
        pki.ca().cert,
        layout.node_cert().cert,
        layout.node_cert().key,
        layout.proxy_cert().cert,
        layout.proxy_cert().key,
    ] {
        if !f.exists() {
            return Err(node_err(
                config,
                format!("{} is missing; `ringctl bootstrap` issues the node's certificates from its shoot's CA", f.display()),
            ));
        }
    }
    let server = format!("https://{}", config.api_server);
    let user = format!("system:node:{}", config.name);
    crate::kubeconfig::write(
        &layout.config_file("kubelet.kubeconfig"),
        &config.name,
        &user,
        &server,
        &pki,
        &layout.node_cert(),
    )?;
    let pair = proxy_cert::Pair::read(&layout.proxy_cert())
        .filter(proxy_cert::Pair::matches)
        .ok_or_else(|| {
            node_err(
                config,
                format!(
                    "kube-proxy's key {} does not belong to its certificate {} (a `ringctl pki renew` stopped between the two files?); run `ringctl pki renew --all` again",
                    layout.proxy_cert().key.display(),
                    layout.proxy_cert().cert.display()
                ),
            )
        })?;
    write_proxy_kubeconfig(config, &pair)?;
    let files = [
        (
            "containerd.toml",
            render::containerd_config(&layout, bins, SANDBOX_IMAGE),
        ),
        ("kubelet.yaml", render::kubelet_config(config, &layout)),
        (
            "kube-proxy.yaml",
            render::kube_proxy_config(config, &layout),
        ),
    ];
    for (name, text) in files {
        let path = layout.config_file(name);
        std::fs::write(&path, text).map_err(SeedError::io(&path))?;
    }
    let cni = layout.cni_conf().join("10-ring.conflist");
    std::fs::write(&cni, render::cni_conflist(config, &layout)).map_err(SeedError::io(&cni))?;
    Ok(pair)
}

/// kube-proxy's kubeconfig (also the node DNS's), from exactly `pair`.
fn write_proxy_kubeconfig(config: &NodeConfig, pair: &proxy_cert::Pair) -> Result<()> {
    let layout = config.layout();
    let pki = layout.pki();
    let server = format!("https://{}", config.api_server);
    crate::kubeconfig::write_pem(
        &layout.config_file("kube-proxy.kubeconfig"),
        (&config.name, config::PROXY_USER, &server),
        pki.read_pem(&pki.ca().cert)?.as_bytes(),
        (&pair.cert, &pair.key),
    )
}

/// The node's supervised processes.
struct Processes {
    tasks: BTreeMap<Component, (CancellationToken, tokio::task::JoinHandle<()>)>,
    states: watch::Sender<States>,
    tuning: SupervisorTuning,
}

impl Processes {
    fn new(states: watch::Sender<States>) -> Processes {
        let tuning = SupervisorTuning {
            stop_grace: Duration::from_secs(10),
            ..Default::default()
        };
        Processes {
            tasks: BTreeMap::new(),
            states,
            tuning,
        }
    }

    fn start(&mut self, spec: &crate::process::ComponentSpec) {
        let token = CancellationToken::new();
        let task = supervise(
            spec.clone(),
            token.clone(),
            self.states.clone(),
            self.tuning,
        );
        self.tasks
            .insert(spec.component, (token, tokio::spawn(task)));
    }

    /// Whether `c` was started (and not stopped) here.
    fn runs(&self, c: Component) -> bool {
        self.tasks.contains_key(&c)
    }

    /// Stops `c` (SIGTERM, SIGKILL after the grace) and waits for it.
    async fn stop(&mut self, c: Component) {
        if let Some((token, handle)) = self.tasks.remove(&c) {
            token.cancel();
            let _ = handle.await;
        }
    }
}

/// Checks what the node needs and writes its configs; returns its programs.
fn prepare(config: &NodeConfig) -> Result<(NodeBinaries, proxy_cert::Pair)> {
    let bins = find_binaries(config)?;
    if !crate::netns::exists(&config.netns) {
        return Err(node_err(
            config,
            format!(
                "network namespace {} does not exist; `ringctl bootstrap` creates it",
                config.netns
            ),
        ));
    }
    let proxy_pair = write_configs(config, &bins)?;
    preload_images(config);
    teardown::create_cgroups(&config.cgroup_root).map_err(|e| {
        node_err(
            config,
            format!("creating cgroup {}: {e}", config.cgroup_root),
        )
    })?;
    Ok((bins, proxy_pair))
}

/// A first start's containerd root gets the preloaded control-plane images
/// (see `images::preload`); without a preload, or when linking it fails, the
/// images are imported as before.
fn preload_images(config: &NodeConfig) {
    let images = config
        .images_dir
        .clone()
        .unwrap_or_else(crate::images::default_dir);
    let root = config.layout().containerd_root();
    match crate::images::preload::seed_root(&images, &root) {
        Ok(true) => {
            tracing::info!(root = %root.display(), "containerd's root starts with the preloaded images")
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(error = %e, "cannot preload containerd's root; importing the images instead")
        }
    }
}

/// The shoot's API inside the node's namespace: at its own address (kubelet,
/// kube-proxy) and at the node's address, which the shoot's kube-apiserver
/// advertises (pods, through the `kubernetes` Service).
async fn start_forwarders(config: &NodeConfig, stop: &CancellationToken) -> Result<()> {
    let api = config.api_server;
    net::forward_into(&config.netns, api, api, stop.clone()).await?;
    let advertised = std::net::SocketAddr::new(config.address.into(), api.port());
    net::forward_into(&config.netns, advertised, api, stop.clone()).await?;
    Ok(())
}

/// The cluster DNS for the node's pods: UDP port 53 on the node's address,
/// records from the shoot's Services and Endpoints (kube-proxy's credentials,
/// read again whenever `renewed` says they changed).
async fn start_dns(
    config: &NodeConfig,
    renewed: watch::Receiver<()>,
    stop: &CancellationToken,
) -> Result<()> {
    let listen = std::net::SocketAddr::new(config.address.into(), 53);
    let socket = crate::netns::udp_in(&config.netns, listen).map_err(|e| {
        node_err(
            config,
            format!("cluster DNS: binding {listen} in {}: {e}", config.netns),
        )
    })?;
    let empty = dns::Records::new(render::CLUSTER_DOMAIN, &[], &[]);
    let records = std::sync::Arc::new(std::sync::RwLock::new(empty));
    dns::serve_udp(socket, records.clone(), stop.clone())
        .await
        .map_err(|e| node_err(config, format!("cluster DNS: {e}")))?;
    let kubeconfig = config.layout().config_file("kube-proxy.kubeconfig");
    let client = crate::kubeconfig::client(&config.name, &kubeconfig).await?;
    let credentials = dns::Credentials {
        node: config.name.clone(),
        kubeconfig,
        renewed,
    };
    tokio::spawn(dns::refresh(client, credentials, records, stop.clone()));
    Ok(())
}

/// Runs the node until `shutdown`, then stops it and everything it ran.
pub async fn run(config: NodeConfig, shutdown: CancellationToken) -> Result<()> {
    let span = tracing::info_span!("node", node = %config.name);
    let _guard = span.enter();
    let (bins, proxy_pair) = prepare(&config)?;
    let stop_all = CancellationToken::new();
    start_forwarders(&config, &stop_all).await?;
    let (renewed, renewed_rx) = watch::channel(());
    start_dns(&config, renewed_rx, &stop_all).await?;
    let (states_tx, states_rx) = watch::channel(States::new());
    let report = status::Reporter::new(config.clone(), states_rx);
    report.proxy_serial(proxy_pair.serial());
    let mut procs = Processes::new(states_tx);
    let specs = render::component_specs(&config, &config.layout(), &bins);
    procs.start(&specs[0]);
    let watcher = tokio::spawn(report.clone().watch(stop_all.clone()));
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {}
        _ = bring_up(&config, &report, &mut procs, &specs[1..]) => {}
    }
    let proxy = specs.iter().find(|s| s.component == Component::KubeProxy);
    let pairs = proxy_cert::Watch::new(config.layout().proxy_cert(), Some(proxy_pair));
    let mut follow = Follow {
        config: &config,
        report: &report,
        proxy,
        renewed: &renewed,
    };
    follow.run(&mut procs, pairs, &shutdown).await;
    tracing::info!("stopping the node and its pods");
    report.phase("Stopping");
    let left = stop_node(&config, &mut procs).await;
    stop_all.cancel();
    let _ = watcher.await;
    report.phase("Stopped");
    left
}

/// What takes a renewed kube-proxy certificate (see [`proxy_cert`]).
struct Follow<'a> {
    config: &'a NodeConfig,
    report: &'a status::Reporter,
    proxy: Option<&'a crate::process::ComponentSpec>,
    renewed: &'a watch::Sender<()>,
}

impl Follow<'_> {
    /// Until `shutdown`: each complete new pair goes into kube-proxy's
    /// kubeconfig, kube-proxy restarts with it (if it runs: a node whose
    /// bring-up failed is left as it is), the DNS is told, the serial
    /// reported. A renewal during the bring-up is taken right after it.
    async fn run(
        &mut self,
        procs: &mut Processes,
        mut pairs: proxy_cert::Watch,
        shutdown: &CancellationToken,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(proxy_cert::POLL) => {}
            }
            let Some(pair) = pairs.renewed() else {
                continue;
            };
            if let Err(e) = write_proxy_kubeconfig(self.config, &pair) {
                tracing::warn!(error = %e, "cannot write kube-proxy's kubeconfig with its renewed certificate; trying again");
                pairs.retry();
                continue;
            }
            if let Some(spec) = self.proxy.filter(|_| procs.runs(Component::KubeProxy)) {
                procs.stop(Component::KubeProxy).await;
                procs.start(spec);
            }
            self.renewed.send_replace(());
            let serial = pair.serial();
            tracing::info!(
                serial = serial.as_deref().unwrap_or("?"),
                "kube-proxy and the cluster DNS use kube-proxy's renewed certificate"
            );
            self.report.proxy_serial(serial);
        }
    }
}

/// Once containerd answers and has the pause image, starts kubelet and
/// kube-proxy (the node registers meanwhile), then imports the other images.
async fn bring_up(
    config: &NodeConfig,
    report: &status::Reporter,
    procs: &mut Processes,
    rest: &[crate::process::ComponentSpec],
) {
    let socket = config.layout().containerd_socket();
    let dir = config
        .images_dir
        .clone()
        .unwrap_or_else(crate::images::default_dir);
    report.phase("ImportingImages");
    let runtime = async {
        wait_for_containerd(config).await?;
        images::import_missing(config, &dir, &socket, &[crate::images::PAUSE.full()]).await
    };
    if let Err(e) = runtime.await {
        tracing::error!(error = %e, "the node's runtime is not usable");
        return report.fatal(e.to_string());
    }
    for spec in rest {
        procs.start(spec);
    }
    let wanted = config.image_references();
    match images::import_missing(config, &dir, &socket, &wanted).await {
        Ok(()) => report.phase("Running"),
        Err(e) => {
            tracing::error!(error = %e, "importing the local images failed");
            report.fatal(e.to_string())
        }
    }
}

/// Stops kubelet and kube-proxy, every pod and shim, containerd; removes the
/// node's cgroups and run dir. Fails naming whatever could not be removed.
async fn stop_node(config: &NodeConfig, procs: &mut Processes) -> Result<()> {
    procs.stop(Component::KubeProxy).await;
    procs.stop(Component::Kubelet).await;
    let root = config.cgroup_root.clone();
    let pods_left =
        teardown::kill_until_gone(|| teardown::pod_pids(&root), Duration::from_secs(15)).await;
    // the shims and any runc they started (it would make cgroups again)
    let run_dir = &config.run_dir;
    let shims_left =
        teardown::kill_until_gone(|| teardown::runtime_pids(run_dir), Duration::from_secs(10))
            .await;
    procs.stop(Component::Containerd).await;
    let cgroups_left = tokio::task::spawn_blocking(move || {
        teardown::remove_cgroups_within(&root, Duration::from_secs(5))
    })
    .await
    .unwrap_or_else(|_| teardown::cgroup_dirs(&config.cgroup_root));
    let _ = std::fs::remove_dir_all(&config.run_dir);
    if pods_left.is_empty() && shims_left.is_empty() && cgroups_left.is_empty() {
        return Ok(());
    }
    Err(node_err(config, format!(
        "stopped, but left pod processes {pods_left:?}, shims {shims_left:?}, cgroups {cgroups_left:?}"
    )))
}

/// Waits (bounded) until containerd accepts connections: a socket file left by
/// an earlier containerd exists before the new one listens.
async fn wait_for_containerd(config: &NodeConfig) -> Result<()> {
    let layout = config.layout();
    let socket = layout.containerd_socket();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        if tokio::time::Instant::now() >= deadline {
            return Err(node_err(
                config,
                format!(
                    "runtime: containerd does not answer on {} after 30 s; see {}",
                    socket.display(),
                    layout.log(Component::Containerd).display()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
