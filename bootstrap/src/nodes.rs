//! The nodes of a local ring's shoots: their network, credentials, supervisors.
//!
//! Each member's shoot gets nodes `<member>`, `<member>-2`, ... (`nodes.perMember`):
//! per node a `ring-node` process (containerd, kubelet, kube-proxy) in the node's
//! own namespace on the ring's node network, registered to the shoot's
//! kube-apiserver with a certificate issued from the shoot's CA
//! (`system:node:<node>`, group `system:nodes`). Their files are in `DIR/nodes/<node>`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use seed::node::net::NodeNetwork;
use seed::node::{NodeConfig, NodeStatus};

use crate::config::RingConfig;
use crate::error::io;
use crate::{BootstrapError, RingLayout};

/// A node's directory: `DIR/nodes/<node>`.
pub fn node_dir(layout: &RingLayout, node: &str) -> PathBuf {
    layout.dir.join("nodes").join(node)
}

/// The marker of a node whose shoot lets its kubelet renew its certificate.
fn renewals_file(layout: &RingLayout, node: &str) -> PathBuf {
    node_dir(layout, node).join("renewals-allowed")
}

/// Whether node `node`'s shoot lets its kubelet renew its certificate.
pub fn renewals_allowed(layout: &RingLayout, node: &str) -> bool {
    renewals_file(layout, node).exists()
}

/// Records that node `node`'s shoot lets its kubelet renew its certificate.
pub fn record_renewals_allowed(layout: &RingLayout, node: &str) -> Result<(), BootstrapError> {
    let file = renewals_file(layout, node);
    seed::pki::write_private(&file, b"").map_err(ringd::RingError::from)?;
    Ok(())
}

/// Where shoot `shoot`'s CA is on member `host`, the seed that hosts it.
pub fn shoot_pki_dir(layout: &RingLayout, shoot: &str, host: &str) -> PathBuf {
    layout.seed_dir(host).join("shoots").join(shoot).join("pki")
}

fn config_file(layout: &RingLayout, member: &str) -> PathBuf {
    node_dir(layout, member).join("node.yaml")
}

fn pid_file(layout: &RingLayout, member: &str) -> PathBuf {
    node_dir(layout, member).join("ring-node.pid")
}

/// The node supervisor's log.
pub fn log_file(layout: &RingLayout, member: &str) -> PathBuf {
    node_dir(layout, member).join("ring-node.log")
}

fn network_file(layout: &RingLayout) -> PathBuf {
    layout.dir.join("nodes").join("network-tag")
}

/// The nodes of `member`'s shoot: `<member>`, then `<member>-2`, `<member>-3`, ...
pub fn nodes_of(config: &RingConfig, member: &str) -> Vec<String> {
    (1..=config.nodes.per_member)
        .map(|k| match k {
            1 => member.to_string(),
            k => format!("{member}-{k}"),
        })
        .collect()
}

/// Every node of the ring, shoot by shoot in ring order.
pub fn node_names(config: &RingConfig) -> Vec<String> {
    config
        .members
        .iter()
        .flat_map(|m| nodes_of(config, &m.name))
        .collect()
}

/// The shoot node `node` belongs to.
pub fn shoot_of(config: &RingConfig, node: &str) -> Option<String> {
    config
        .members
        .iter()
        .find(|m| nodes_of(config, &m.name).iter().any(|n| n == node))
        .map(|m| m.name.clone())
}

fn members(config: &RingConfig) -> Vec<String> {
    node_names(config)
}

/// The ring's node network as stored (its tag), if it has one.
pub fn network(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<Option<NodeNetwork>, BootstrapError> {
    let Ok(text) = std::fs::read_to_string(network_file(layout)) else {
        return Ok(None);
    };
    let tag: u8 = text.trim().parse().map_err(|_| BootstrapError::Config {
        field: network_file(layout).display().to_string(),
        reason: format!(
            "{:?} is not a node network tag (0..=15); delete the file to choose a new one",
            text.trim()
        ),
    })?;
    Ok(Some(NodeNetwork::plan(tag, &members(config))?))
}

/// Whether the node network exists with every node's namespace.
pub fn network_up(layout: &RingLayout, config: &RingConfig) -> bool {
    match network(layout, config) {
        Ok(Some(net)) => {
            seed::netns::exists(&net.hub())
                && net.hosts.iter().all(|h| seed::netns::exists(&h.netns))
                && guests(config)
                    .iter()
                    .all(|(_, ns)| seed::node::net::has_guest_link(ns))
        }
        _ => false,
    }
}

/// The node network: the stored one, or a new plan on a free tag (stored,
/// nothing created yet). `None` for a ring without nodes.
pub fn plan_network(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<Option<NodeNetwork>, BootstrapError> {
    if config.nodes.per_member == 0 {
        return Ok(None);
    }
    if let Some(net) = network(layout, config)? {
        return Ok(Some(net));
    }
    let tag = NodeNetwork::free_tag(None)?;
    let net = NodeNetwork::plan(tag, &members(config))?;
    let file = network_file(layout);
    seed::pki::create_private_dir(file.parent().unwrap_or(&layout.dir))?;
    seed::pki::write_private(&file, tag.to_string().as_bytes())?;
    Ok(Some(net))
}

/// Shoot → the address its kube-apiserver advertises: its node's address, where
/// `ring-node` forwards port 6443 to the shoot's API (Endpoints may not hold the
/// loopback address), so pods reach their API through the `kubernetes` Service.
pub fn api_advertise(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<std::collections::BTreeMap<String, std::net::Ipv4Addr>, BootstrapError> {
    Ok(plan_network(layout, config)?
        .map(|net| {
            net.hosts
                .iter()
                .map(|h| (h.name.clone(), h.address))
                .collect()
        })
        .unwrap_or_default())
}

/// Creates the node network (idempotent).
pub fn ensure_network(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<NodeNetwork, BootstrapError> {
    let net = plan_network(layout, config)?.ok_or_else(|| {
        BootstrapError::Unsupported("the ring has no nodes (nodes.perMember: 0)".into())
    })?;
    net.ensure()?;
    // members in network namespaces of their own reach the nodes as guests
    for (i, netns) in guests(config) {
        net.ensure_guest(&netns, i)?;
    }
    Ok(net)
}

/// The members with a network namespace of their own, with their guest
/// number on the node network (their position in the ring).
pub(crate) fn guests(config: &RingConfig) -> Vec<(u8, String)> {
    config
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| Some((i as u8, m.netns.clone()?)))
        .collect()
}

/// Whether every image archive the nodes import is in the image cache.
pub fn images_built() -> bool {
    let Ok(built) = seed::images::list(&seed::images::default_dir()) else {
        return false;
    };
    let dir = seed::images::default_dir();
    seed::images::ALL
        .iter()
        .all(|i| built.iter().any(|b| b.reference == i.full()))
        && seed::images::preload::dir(&dir, &built).is_some_and(|d| d.is_dir())
}

/// Builds the images into the image cache (`ringd`'s image from `ringd`) and
/// the containerd root preloaded with them.
pub fn build_images(ringd: &Path) -> Result<(), BootstrapError> {
    let inputs = seed::images::ImageInputs::standard(None, ringd.to_path_buf());
    let dir = seed::images::default_dir();
    seed::images::build_all(&dir, &inputs)?;
    // the nodes' containerd roots start from it (see `preload`)
    seed::images::preload::build_standard(&dir)?;
    Ok(())
}

/// Whether the node's config and certificates are in place.
pub fn configured(layout: &RingLayout, member: &str) -> bool {
    let dir = node_dir(layout, member).join("pki");
    config_file(layout, member).exists()
        && [
            "ca.crt",
            "node.crt",
            "node.key",
            "kube-proxy.crt",
            "kube-proxy.key",
        ]
        .iter()
        .all(|f| dir.join(f).exists())
}

/// Issues node `node`'s and its kube-proxy's certificates from its shoot's CA
/// (read from the seed that hosts the shoot, `host`) and writes its config.
pub fn configure(
    layout: &RingLayout,
    config: &RingConfig,
    node: &str,
    host: &str,
) -> Result<(), BootstrapError> {
    let net = network(layout, config)?
        .ok_or_else(|| BootstrapError::Unsupported("the node network is not created yet".into()))?;
    let h = net.hosts.iter().find(|h| h.name == node).ok_or_else(|| {
        BootstrapError::Unsupported(format!("{node} has no place on the node network"))
    })?;
    let shoot = shoot_of(config, node)
        .ok_or_else(|| BootstrapError::Unsupported(format!("node {node} belongs to no shoot")))?;
    let shoot_pki = shoot_pki_dir(layout, &shoot, host);
    let read = |f: &str| {
        let p = shoot_pki.join(f);
        std::fs::read_to_string(&p)
            .map_err(io(format!("reading shoot {shoot}'s CA {}", p.display())))
    };
    let (ca_cert, ca_key) = (read("ca.crt")?, read("ca.key")?);
    let dir = absolute(&node_dir(layout, node))?;
    let api = seed::ShootEndpoint::for_shoot(&shoot);
    let mut node_config = NodeConfig::on_network(
        &net,
        h,
        dir,
        std::net::SocketAddr::new(api.address.into(), api.api_port),
    );
    // the node hosts control planes as pods; kube-proxy and ringd run on it
    // as processes: their images would only make every start longer
    node_config.images = seed::images::CONTROL_PLANE
        .iter()
        .map(|i| i.name.to_string())
        .collect();
    node_config.issue_credentials(&ca_cert, &ca_key)?;
    node_config.save(&config_file(layout, node))?;
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf, BootstrapError> {
    std::path::absolute(p).map_err(io(format!("resolving {}", p.display())))
}

/// The pid of the member's node supervisor if it runs.
pub fn running_pid(layout: &RingLayout, member: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file(layout, member))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cfg = config_file(layout, member);
    let needle = cfg.as_os_str().as_encoded_bytes();
    (seed::process::pid_alive(pid) && cmdline.windows(needle.len()).any(|w| w == needle))
        .then_some(pid)
}

/// The node's own report, if it wrote one.
pub fn status(layout: &RingLayout, member: &str) -> Option<NodeStatus> {
    let text = std::fs::read(node_dir(layout, member).join("status.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The node's config, if it was configured.
pub fn node_config(layout: &RingLayout, node: &str) -> Option<NodeConfig> {
    NodeConfig::load(&config_file(layout, node)).ok()
}

/// The node's own report, if its supervisor runs now (not one a dead
/// supervisor left).
fn current_status(layout: &RingLayout, node: &str) -> Option<NodeStatus> {
    let pid = running_pid(layout, node)?;
    status(layout, node).filter(|s| s.pid == pid)
}

/// Whether every node of the ring runs and is Ready (true without nodes).
pub fn all_ready(layout: &RingLayout, config: &RingConfig) -> bool {
    members(config)
        .iter()
        .all(|n| current_status(layout, n).is_some_and(|s| s.registration.ready))
}

/// Starts the member's node supervisor in the background.
pub fn start(layout: &RingLayout, ring_node: &Path, member: &str) -> Result<(), BootstrapError> {
    let args = vec![
        "--config".into(),
        config_file(layout, member).into_os_string(),
    ];
    let pid =
        crate::process::spawn_detached(ring_node, &args, &log_file(layout, member), None, &[])?;
    seed::pki::write_private(&pid_file(layout, member), pid.to_string().as_bytes())?;
    Ok(())
}

/// Stops every node of the ring (SIGTERM: pods, shims and cgroups go too; SIGKILL
/// after `grace`, then what is left is removed here) and deletes the node network.
pub async fn stop_all(
    layout: &RingLayout,
    config: &RingConfig,
    grace: Duration,
) -> Result<Vec<crate::Stopped>, BootstrapError> {
    let running: Vec<(String, u32)> = members(config)
        .into_iter()
        .filter_map(|m| running_pid(layout, &m).map(|p| (m, p)))
        .collect();
    let still = |m: &str| running_pid(layout, m).is_some();
    let stopped = crate::process::stop_processes(running, still, grace, "ring-node").await;
    for m in members(config) {
        clean_leftovers(layout, &m).await;
        let _ = std::fs::remove_file(pid_file(layout, &m));
    }
    if let Some(net) = network(layout, config)? {
        net.remove()?;
    }
    Ok(stopped)
}

/// Removes what a killed node supervisor left: its pods, shims, cgroups, run dir.
async fn clean_leftovers(layout: &RingLayout, member: &str) {
    let Some(node) = node_config(layout, member) else {
        return;
    };
    let _ = tokio::task::spawn_blocking(move || seed::node::teardown::kill_node_now(&node)).await;
}

/// One node as `ringctl status` shows it.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// The node's name (its Node object in its shoot).
    pub node: String,
    /// The shoot it is registered to.
    pub shoot: String,
    /// The network namespace its kubelet, containerd and pods run in.
    pub netns: String,
    /// Its IP address on the node network.
    pub address: String,
    /// Whether its supervisor runs, and its own phase.
    pub phase: String,
    /// Its Node object exists in its shoot.
    pub registered: bool,
    /// Its Node object's Ready condition is true.
    pub ready: bool,
    /// Why it is not Ready (certificate, endpoint, runtime), when it is not.
    pub problem: Option<String>,
    /// The kubelet's resident memory, MiB.
    pub kubelet_rss_mib: f64,
    /// containerd's resident memory, MiB.
    pub containerd_rss_mib: f64,
    /// Every containerd shim of the node (one per pod), summed.
    pub shims_rss_mib: f64,
    /// How many containerd shims run (one per pod).
    pub shims: usize,
    /// The kubelet's version, as the shoot's Node object reports it.
    pub kubelet_version: Option<String>,
    /// The container runtime's (`containerd://v2.4.2`), likewise.
    pub runtime_version: Option<String>,
    /// The machine's cgroups, as the node's status says.
    pub cgroups: Option<String>,
}

/// The nodes of a local ring, with their state and memory.
pub fn report(layout: &RingLayout, config: &RingConfig) -> Vec<NodeReport> {
    use seed::process::{rss_kib, Component};
    let mib = |kib: u64| (kib as f64 / 1024.0 * 10.0).round() / 10.0;
    members(config)
        .into_iter()
        .filter_map(|m| {
            let node = node_config(layout, &m)?;
            let status = current_status(layout, &m);
            let pid_rss = |c: Component| {
                status
                    .as_ref()
                    .and_then(|s| s.components.get(&c)?.pid)
                    .and_then(rss_kib)
                    .unwrap_or(0)
            };
            let shims = seed::node::teardown::shim_pids(&node.layout().containerd_socket());
            let shims_kib: u64 = shims.iter().filter_map(|p| rss_kib(*p as u32)).sum();
            Some(NodeReport {
                node: m.clone(),
                shoot: shoot_of(config, &m).unwrap_or_default(),
                netns: node.netns.clone(),
                address: node.address.to_string(),
                phase: match &status {
                    Some(s) => s.phase.clone(),
                    None => "NotRunning".into(),
                },
                registered: status.as_ref().is_some_and(|s| s.registration.registered),
                ready: status.as_ref().is_some_and(|s| s.registration.ready),
                problem: match &status {
                    Some(s) => s.problem.clone(),
                    None => Some(format!(
                        "ring-node is not running; `ringctl bootstrap --ring-dir {}` starts it",
                        layout.dir.display()
                    )),
                },
                kubelet_rss_mib: mib(pid_rss(Component::Kubelet)),
                containerd_rss_mib: mib(pid_rss(Component::Containerd)),
                shims_rss_mib: mib(shims_kib),
                shims: shims.len(),
                kubelet_version: status
                    .as_ref()
                    .and_then(|s| s.registration.kubelet_version.clone()),
                runtime_version: status
                    .as_ref()
                    .and_then(|s| s.registration.container_runtime_version.clone()),
                cgroups: status.as_ref().and_then(|s| s.cgroups.clone()),
            })
        })
        .collect()
}

/// The nodes as a table (empty when the ring has none).
pub fn render(reports: &[NodeReport]) -> String {
    if reports.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nnodes:\n");
    out.push_str(&format!(
        "  {:<8} {:<8} {:<15} {:<16} {:<6} {:>11} {:>14} {:>13}\n",
        "NODE",
        "SHOOT",
        "ADDRESS",
        "PHASE",
        "READY",
        "KUBELET MiB",
        "CONTAINERD MiB",
        "SHIMS MiB (n)"
    ));
    for r in reports {
        out.push_str(&format!(
            "  {:<8} {:<8} {:<15} {:<16} {:<6} {:>11.1} {:>14.1} {:>9.1} ({})\n",
            r.node,
            r.shoot,
            r.address,
            r.phase,
            r.ready,
            r.kubelet_rss_mib,
            r.containerd_rss_mib,
            r.shims_rss_mib,
            r.shims
        ));
        if let Some(p) = &r.problem {
            out.push_str(&format!("    {}: {p}\n", r.node));
        }
    }
    out
}

/// The nodes' kubelet and runtime versions, one line per combination, and
/// the machine's cgroups once (the same for every node of a local ring).
pub fn render_versions(reports: &[NodeReport]) -> String {
    let mut by_versions: std::collections::BTreeMap<(String, String), Vec<&str>> =
        Default::default();
    for r in reports {
        let kubelet = r.kubelet_version.clone().unwrap_or_else(|| "-".into());
        let runtime = r.runtime_version.clone().unwrap_or_else(|| "-".into());
        by_versions
            .entry((kubelet, runtime))
            .or_default()
            .push(&r.node);
    }
    let mut out = String::from(
        "
node versions (kubelet, runtime: nodes):
",
    );
    for ((kubelet, runtime), nodes) in by_versions {
        out += &format!(
            "  {kubelet}, {runtime}: {}
",
            nodes.join(", ")
        );
    }
    if let Some(c) = reports.iter().find_map(|r| r.cgroups.as_deref()) {
        out += &format!("  cgroups {c}\n");
    }
    out
}

/// kill -9 of `member`'s nodes as of a machine that died: each node's
/// supervisor (containerd, kubelet and kube-proxy die with it), then every
/// pod and shim; the node network stays. The nodes that were running.
pub fn kill_member(layout: &RingLayout, config: &RingConfig, member: &str) -> Vec<String> {
    let mut killed = Vec::new();
    for node in nodes_of(config, member) {
        if let Some(pid) = running_pid(layout, &node) {
            kill_supervisor(pid);
            killed.push(node.clone());
        }
        if let Some(n) = node_config(layout, &node) {
            seed::node::teardown::kill_node_now(&n);
        }
    }
    killed
}

/// SIGKILL to a node supervisor, then a wait (at most 2 s) until it is gone:
/// its containerd, kubelet and kube-proxy die with it, and must be gone
/// before the node's pods and cgroups are removed (kubelet makes them again).
fn kill_supervisor(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while seed::process::pid_alive(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (shoot, the node's pod cgroup root) of every configured node of the ring:
/// where its pods' processes are found.
pub fn pod_cgroup_roots(layout: &RingLayout, config: &RingConfig) -> Vec<(String, String)> {
    members(config)
        .into_iter()
        .filter_map(|node| {
            let cfg = node_config(layout, &node)?;
            Some((shoot_of(config, &node)?, cfg.cgroup_root))
        })
        .collect()
}

/// Kills every node of the ring in `layout` at once (SIGKILL), then removes
/// their pods, shims, cgroups and the node network: for throwaway rings
/// (benchmarks, tests) that are dropped rather than stopped.
pub fn kill_now(layout: &RingLayout) {
    use seed::node::teardown;
    let Some(config) = layout.read_config().ok().flatten() else {
        return;
    };
    let nodes: Vec<NodeConfig> = members(&config)
        .iter()
        .filter_map(|m| {
            if let Some(pid) = running_pid(layout, m) {
                kill_supervisor(pid);
            }
            node_config(layout, m)
        })
        .collect();
    for n in &nodes {
        teardown::kill_node_now(n);
    }
    if let Ok(Some(net)) = network(layout, &config) {
        let _ = net.remove();
    }
}
