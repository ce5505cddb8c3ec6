//! A real node (ring-node: containerd, kubelet, kube-proxy in its own network
//! namespace) for a cluster the test runs, for end-to-end tests of workloads.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use seed::node::net::NodeNetwork;
use seed::node::{NodeConfig, NodeStatus};

use crate::Sandbox;

/// The `ring-node` binary next to this test binary (built by `scripts/test`).
pub fn ring_node_bin() -> PathBuf {
    let path = crate::ringctl().with_file_name("ring-node");
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build --workspace --bins` (scripts/test does)",
        path.display()
    );
    path
}

/// A node registered to a local seed's control plane; on drop the supervisor is
/// killed and its pods, shims, cgroups and network namespaces are removed.
pub struct TestNode {
    pub config: NodeConfig,
    net: NodeNetwork,
    child: Child,
}

/// A node's place on a new node network (the namespaces exist), before it runs.
/// Dropped without being started, it removes the namespaces again.
pub struct NodePlan {
    name: String,
    net: Option<NodeNetwork>,
}

impl Drop for NodePlan {
    fn drop(&mut self) {
        if let Some(net) = self.net.take() {
            let _ = net.remove();
        }
    }
}

impl NodePlan {
    /// A node network with node `name` on a free tag.
    pub fn new(name: &str) -> NodePlan {
        // claimed atomically: tests in one binary create node networks in parallel
        let net = NodeNetwork::create(&[name.to_string()])
            .unwrap_or_else(|e| panic!("node network: {e}"));
        NodePlan {
            name: name.to_string(),
            net: Some(net),
        }
    }

    /// The node's address (what the cluster's kube-apiserver should advertise).
    pub fn address(&self) -> std::net::Ipv4Addr {
        self.net.as_ref().expect("planned").hosts[0].address
    }

    /// Starts the node for the control plane of `shoot` hosted by `seed`, and
    /// waits (bounded, 120 s) until it is Ready.
    pub fn start(mut self, sandbox: &Sandbox, seed: &seed::LocalSeed, shoot: &str) -> TestNode {
        let name = self.name.clone();
        let net = self.net.take().expect("planned");
        let spec = seed
            .layout(shoot)
            .read_spec()
            .unwrap()
            .expect("the shoot's spec");
        let api = std::net::SocketAddr::new(spec.endpoint.address.into(), spec.endpoint.api_port);
        let state = sandbox.path().join(format!("node-{name}"));
        let config = NodeConfig::on_network(&net, &net.hosts[0], state, api);
        let pki = seed.layout(shoot).pki();
        let ca = pki.ca();
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        config
            .issue_credentials(&read(&ca.cert), &read(&ca.key))
            .unwrap();
        let file = sandbox.path().join(format!("node-{name}.yaml"));
        config.save(&file).unwrap();
        let log = std::fs::File::create(sandbox.path().join(format!("node-{name}.log"))).unwrap();
        let child = std::process::Command::new(ring_node_bin())
            .arg("--config")
            .arg(&file)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start ring-node");
        let node = TestNode { config, net, child };
        node.wait_ready(Duration::from_secs(120));
        node
    }
}

impl TestNode {
    /// The node's own report.
    pub fn status(&self) -> Option<NodeStatus> {
        let text = std::fs::read(self.config.layout().status_file()).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status();
            if s.as_ref()
                .is_some_and(|s| s.registration.ready && s.phase == "Running")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} not Ready after {timeout:?}: {s:?}",
                self.config.name
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        seed::node::teardown::kill_node_now(&self.config);
        let _ = self.net.remove();
    }
}
