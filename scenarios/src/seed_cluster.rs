//! A seed cluster for rings whose members host control planes as pods: a
//! control plane run by this process (the cluster's API, advertising its
//! node's address so pods reach it) and one real node (`ring-node`:
//! containerd, kubelet, kube-proxy) on a node network of its own, with
//! hostPath PersistentVolumes for etcd (the cluster has no provisioner).
//! `ringctl bench failover --seeds kubernetes` runs its ring's Kubernetes
//! member on one, drills one per member in `ring.kubernetesMembers`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use seed::node::net::NodeNetwork;
use seed::node::{NodeConfig, NodeStatus};
use seed::{Binaries, ControlPlaneSpec, LocalSeed, Seed};
use tokio_util::sync::CancellationToken;

use crate::ScenarioError;

/// How long the cluster's API and its node may take to be ready.
const READY: Duration = Duration::from_secs(180);

/// A running seed cluster; dropped, its node and node network go (the
/// cluster's control plane dies with this process; [`SeedCluster::stop`] is the
/// orderly end).
pub struct SeedCluster {
    /// The cluster's name (its control plane's shoot name).
    pub name: String,
    dir: PathBuf,
    ring_node: PathBuf,
    seed: LocalSeed,
    node: NodeConfig,
    net: Option<NodeNetwork>,
    child: Option<Child>,
    /// Ends the relays into guest namespaces ([`SeedCluster::reach_from`]).
    relays: CancellationToken,
}

fn setup(what: &str) -> impl Fn(String) -> ScenarioError + '_ {
    move |e| ScenarioError::Setup(format!("seed cluster: {what}: {e}"))
}

impl SeedCluster {
    /// Starts cluster `name` under `dir` with one node (`ring-node` at
    /// `ring_node`, images from the local image cache) and waits until the
    /// node is Ready.
    pub async fn start(
        dir: &Path,
        name: &str,
        bins: Binaries,
        ring_node: &Path,
    ) -> Result<SeedCluster, ScenarioError> {
        if !ring_node.exists() {
            return Err(ScenarioError::Setup(format!(
                "{} is missing; build it with `cargo build --workspace --bins`",
                ring_node.display()
            )));
        }
        let node_name = format!("{name}-node");
        let net = NodeNetwork::create(std::slice::from_ref(&node_name))
            .map_err(|e| setup("node network")(e.to_string()))?;
        let host = net.hosts[0].clone();
        let seed = LocalSeed::new(dir.join("cluster"), bins)
            .with_advertise([(name.to_string(), host.address)].into());
        let node = NodeConfig::on_network(&net, &host, dir.join("node"), api_address(name));
        let mut cluster = SeedCluster {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            ring_node: ring_node.to_path_buf(),
            seed,
            node,
            net: Some(net),
            child: None,
            relays: CancellationToken::new(),
        };
        cluster.boot().await?;
        Ok(cluster)
    }

    /// A seed cluster under `dir` named `name` with `volumes` hostPath
    /// PersistentVolumes, and the seed spec of a member hosting control planes
    /// there (NodePort Services on the node's address); `ring-node` is looked
    /// for next to `ringd`.
    pub async fn for_member(
        dir: &Path,
        name: &str,
        ringd: &Path,
        volumes: &[String],
    ) -> Result<(SeedCluster, bootstrap::config::SeedSpec), ScenarioError> {
        let bins = seed::BinarySearch::standard(None)
            .control_plane()
            .map_err(|e| setup("its binaries")(e.to_string()))?;
        std::fs::create_dir_all(dir)
            .map_err(|e| setup("its dir")(format!("{}: {e}", dir.display())))?;
        let cluster =
            SeedCluster::start(dir, name, bins, &ringd.with_file_name("ring-node")).await?;
        cluster.add_volumes(dir, volumes).await?;
        let spec = bootstrap::config::SeedSpec::Kubernetes {
            kubeconfig: cluster.kubeconfig().display().to_string(),
            context: None,
            service_type: Some(seed::kubernetes::ServiceType::NodePort),
            node_address: Some(cluster.node_address().into()),
            storage_class: None,
        };
        Ok((cluster, spec))
    }

    async fn boot(&mut self) -> Result<(), ScenarioError> {
        let name = self.name.clone();
        self.seed
            .start(&ControlPlaneSpec::new(&name))
            .await
            .map_err(|e| setup("its control plane")(e.to_string()))?;
        seed::wait_ready(&self.seed, &name, READY)
            .await
            .map_err(|e| setup("its control plane")(e.to_string()))?;
        // its kubelet renews its client certificate through the cluster
        let admin = self.seed.layout(&name).admin_kubeconfig();
        seed::node::renewal::allow(&name, &admin)
            .await
            .map_err(|e| setup("the node's certificate renewal")(e.to_string()))?;
        let ca = self.seed.layout(&name).pki().ca();
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map_err(|e| setup("the cluster's CA")(format!("{}: {e}", p.display())))
        };
        self.node
            .issue_credentials(&read(&ca.cert)?, &read(&ca.key)?)
            .map_err(|e| setup("the node's credentials")(e.to_string()))?;
        self.node
            .save(&self.dir.join("node.yaml"))
            .map_err(|e| setup("the node's config")(e.to_string()))?;
        self.start_node().await
    }

    /// Runs `ring-node` with the saved config and waits until the node is Ready.
    async fn start_node(&mut self) -> Result<(), ScenarioError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("node.log"))
            .map_err(|e| setup("the node's log")(e.to_string()))?;
        let err = log
            .try_clone()
            .map_err(|e| setup("the node's log")(e.to_string()))?;
        let child = std::process::Command::new(&self.ring_node)
            .arg("--config")
            .arg(self.dir.join("node.yaml"))
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| setup("starting ring-node")(e.to_string()))?;
        self.child = Some(child);
        self.wait_node_ready().await
    }

    /// Makes the cluster reachable from network namespace `netns` (a drill
    /// member's, whose ringd hosts control planes here) as from the host: the
    /// namespace is plugged into the node network as guest `i` (node ports on
    /// the node's address) and gets a relay of the cluster's API address to
    /// the host's loopback. A link of its own, so cutting the member off from
    /// the other members leaves it its seed cluster, as a member running in
    /// its cluster keeps it.
    pub async fn reach_from(&self, netns: &str, i: u8) -> Result<(), ScenarioError> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| ScenarioError::Setup(format!("seed cluster {}: stopped", self.name)))?;
        net.plug_guest(netns, i)
            .map_err(|e| setup("plugging a member into its node network")(e.to_string()))?;
        let api = api_address(&self.name);
        seed::node::net::forward_into(netns, api, api, self.relays.clone())
            .await
            .map_err(|e| setup("relaying its API into a member's namespace")(e.to_string()))?;
        Ok(())
    }

    /// kill -9 of the node as of a machine that died: `ring-node` (containerd,
    /// kubelet and kube-proxy die with it), then every pod; the node network
    /// and the cluster's control plane stay. Whether a node was running.
    pub fn kill_node(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let _ = child.kill();
        let _ = child.wait();
        seed::node::teardown::kill_node_now(&self.node);
        true
    }

    /// Starts a killed node again (containerd over its old state; kubelet
    /// recreates the pods the cluster still schedules there).
    pub async fn revive_node(&mut self) -> Result<bool, ScenarioError> {
        if self.child.is_some() {
            return Ok(false);
        }
        self.start_node().await?;
        Ok(true)
    }

    /// The cgroup every pod of the node lives under.
    pub fn pod_cgroup_root(&self) -> &str {
        &self.node.cgroup_root
    }

    async fn wait_node_ready(&self) -> Result<(), ScenarioError> {
        let dir = &self.dir;
        let deadline = Instant::now() + READY;
        loop {
            let status = self.node_status();
            if status
                .as_ref()
                .is_some_and(|s| s.registration.ready && s.phase == "Running")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ScenarioError::Setup(format!(
                    "seed cluster {}: its node is not Ready after {READY:?} ({status:?}); see {}",
                    self.name,
                    dir.join("node.log").display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn node_status(&self) -> Option<NodeStatus> {
        let text = std::fs::read(self.node.layout().status_file()).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// The cluster's admin kubeconfig (what a member's ringd is given).
    pub fn kubeconfig(&self) -> PathBuf {
        self.seed.layout(&self.name).admin_kubeconfig()
    }

    /// The node's address (for `serviceType: NodePort`).
    pub fn node_address(&self) -> Ipv4Addr {
        self.node.address
    }

    /// Creates a 1 GiB hostPath PersistentVolume per name, under `dir`
    /// (one is bound by each etcd the cluster runs).
    pub async fn add_volumes(&self, dir: &Path, names: &[String]) -> Result<(), ScenarioError> {
        let client = seed::kubeconfig::client(&self.name, &self.kubeconfig())
            .await
            .map_err(|e| setup("its API")(e.to_string()))?;
        let volumes: Vec<(String, PathBuf)> =
            names.iter().map(|n| (n.clone(), dir.join(n))).collect();
        seed::kubernetes::volumes::ensure_host_path_volumes(client, &self.name, &volumes)
            .await
            .map_err(|e| setup("its PersistentVolumes")(e.to_string()))
    }

    /// Stops the cluster's kube-controller-manager (its other components and
    /// node keep running): what a cluster whose controllers are away looks like.
    pub async fn stop_controller_manager(&self) -> Result<(), ScenarioError> {
        let only = [seed::Component::KubeControllerManager];
        self.seed
            .stop_only(&self.name, &only)
            .await
            .map_err(|e| setup("stopping its controller-manager")(e.to_string()))
    }

    /// Stops the node (its pods, shims and cgroups go too), the node network
    /// and the cluster's control plane.
    pub async fn stop(mut self) {
        self.stop_node();
        let _ = self.seed.stop(&self.name).await;
    }

    fn stop_node(&mut self) {
        self.relays.cancel();
        self.kill_node();
        if let Some(net) = self.net.take() {
            let _ = net.remove();
        }
    }
}

impl Drop for SeedCluster {
    fn drop(&mut self) {
        self.stop_node();
    }
}

/// Where cluster `name`'s API listens (its shoot endpoint).
fn api_address(name: &str) -> std::net::SocketAddr {
    let e = seed::ShootEndpoint::for_shoot(name);
    std::net::SocketAddr::new(e.address.into(), e.api_port)
}
