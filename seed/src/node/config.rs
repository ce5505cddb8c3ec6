//! A node's configuration (`kind: RingNode`) and the layout of its state dir.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, SeedError};
use crate::process::Component;

/// The `apiVersion` of a node config.
pub const API_VERSION: &str = "ring.gardener.cloud/v1alpha1";

/// The longest unix socket path the kernel takes (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The longest socket kubelet binds under its root dir (`<stateDir>/kubelet`):
/// the pod-resources socket, first bound under a temporary name of up to ten
/// digits.
const KUBELET_LONGEST_SOCKET: &str = "/kubelet/pod-resources/1234567890";

/// The longest `stateDir` whose kubelet sockets still fit.
pub const MAX_STATE_DIR_LEN: usize = MAX_SOCKET_PATH - KUBELET_LONGEST_SOCKET.len();

/// How one node runs: which shoot it joins, where it lives on the network, and
/// where its state is. Written by `ringctl bootstrap`, read by `ring-node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Must be `ring.gardener.cloud/v1alpha1`.
    pub api_version: String,
    /// Must be `RingNode`.
    pub kind: String,
    /// The node's name as registered (`system:node:<name>`).
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit.
    pub name: String,
    /// Certificates, containerd's images and snapshots, kubelet's pods, logs.
    /// Must be absolute and at most 74 bytes: kubelet's sockets under it must fit a unix
    /// socket path.
    pub state_dir: PathBuf,
    /// Sockets and runtime state (short paths: a unix socket path has at most 107 bytes).
    /// Must be absolute and at most 60 bytes (containerd's sockets).
    pub run_dir: PathBuf,
    /// The `ip netns` namespace the node's processes and pods live in (must exist).
    /// Must not be empty nor contain '/'.
    pub netns: String,
    /// The node's address in its namespace (its InternalIP).
    pub address: Ipv4Addr,
    /// The range pod IPs of this node come from, e.g. `198.19.1.0/24`.
    /// Must be `A.B.C.D/N` (N from 0 to 32).
    pub pod_cidr: String,
    /// Every pod range of the node network (kube-proxy's cluster CIDR).
    /// Must be `A.B.C.D/N` (N from 0 to 32).
    pub cluster_cidr: String,
    /// The shoot's kube-apiserver, on the host's loopback: the node reaches it
    /// at the same address inside its namespace, through a forwarder.
    /// Must be a loopback address.
    pub api_server: SocketAddr,
    /// The cgroup (in every v1 hierarchy) all of the node's pods live under.
    /// Must be an absolute cgroup path like `/ring-node-m1`.
    pub cgroup_root: String,
    /// Image archives imported into containerd at start [default: the setup cache's `images`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_dir: Option<PathBuf>,
    /// The images (names as in `seed::images::ALL`: `etcd`, `kube-apiserver`,
    /// ...) imported at start besides `pause`; empty: every archive in
    /// `imagesDir`. A node that hosts control planes as pods needs
    /// [`crate::images::CONTROL_PLANE`]; each image more costs seconds of
    /// import at every start.
    /// Each must be an image Ring builds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// Where kubelet and kube-proxy are looked for first [default: setup's cache, then PATH].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bin_dir: Option<PathBuf>,
}

fn bad(field: &str, reason: impl Into<String>) -> SeedError {
    SeedError::InvalidSpec {
        field: field.into(),
        reason: reason.into(),
    }
}

impl NodeConfig {
    /// The config of node `host` on `net`, joining the shoot whose API is at
    /// `api_server`, with its state in `state_dir` (absolute).
    pub fn on_network(
        net: &super::net::NodeNetwork,
        host: &super::net::NodeHost,
        state_dir: PathBuf,
        api_server: SocketAddr,
    ) -> NodeConfig {
        NodeConfig {
            api_version: API_VERSION.into(),
            kind: "RingNode".into(),
            name: host.name.clone(),
            state_dir,
            run_dir: PathBuf::from("/run/ring-node").join(&host.netns),
            netns: host.netns.clone(),
            address: host.address,
            pod_cidr: host.pod_cidr.clone(),
            cluster_cidr: net.cluster_cidr(),
            api_server,
            cgroup_root: format!("/{}", host.netns),
            images_dir: None,
            images: Vec::new(),
            bin_dir: None,
        }
    }

    /// The full names of the images imported at start besides `pause`
    /// (empty: every archive found).
    pub fn image_references(&self) -> Vec<String> {
        self.images
            .iter()
            .filter_map(|name| crate::images::reference(name))
            .collect()
    }

    /// Issues the node's (`system:node:<name>`, group `system:nodes`) and
    /// kube-proxy's (`system:kube-proxy`) client certificates from the shoot's
    /// CA (PEM), and writes them with the CA certificate into the node's PKI dir.
    pub fn issue_credentials(&self, ca_cert_pem: &str, ca_key_pem: &str) -> Result<()> {
        let layout = self.layout();
        let pki = layout.pki();
        crate::pki::create_private_dir(pki.dir())?;
        let node_cn = format!("system:node:{}", self.name);
        for (pair, spec) in [
            (
                layout.node_cert(),
                crate::pki::LeafSpec::client(&node_cn, &["system:nodes"]),
            ),
            (layout.proxy_cert(), proxy_identity()),
        ] {
            let (cert, key) = crate::pki::issue(ca_cert_pem, ca_key_pem, &spec)?;
            crate::pki::write_private(&pair.cert, cert.as_bytes())?;
            crate::pki::write_private(&pair.key, key.as_bytes())?;
        }
        crate::pki::write_private(&pki.ca().cert, ca_cert_pem.as_bytes())
    }

    /// Writes this config (validated) to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate()?;
        let yaml = serde_yaml::to_string(self).map_err(|e| bad("node config", e.to_string()))?;
        crate::pki::write_private(path, yaml.as_bytes())
    }

    /// Reads and validates a node config file.
    pub fn load(path: &Path) -> Result<NodeConfig> {
        let text = std::fs::read_to_string(path).map_err(SeedError::io(path))?;
        let config: NodeConfig = serde_yaml::from_str(&text)
            .map_err(|e| bad(&path.display().to_string(), e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the error names the field and what would be right.
    pub fn validate(&self) -> Result<()> {
        if self.api_version != API_VERSION {
            return Err(bad("apiVersion", format!("must be {API_VERSION}")));
        }
        if self.kind != "RingNode" {
            return Err(bad("kind", "must be RingNode"));
        }
        crate::endpoint::validate_shoot_name(&self.name).map_err(|_| {
            bad(
                "name",
                format!("{:?} is not a DNS label (a-z, 0-9, '-')", self.name),
            )
        })?;
        for (field, dir) in [("stateDir", &self.state_dir), ("runDir", &self.run_dir)] {
            if !dir.is_absolute() {
                return Err(bad(
                    field,
                    format!("{} is not an absolute path", dir.display()),
                ));
            }
        }
        let state_len = self.state_dir.as_os_str().len();
        if state_len > MAX_STATE_DIR_LEN {
            return Err(bad(
                "stateDir",
                format!(
                    "{} is {state_len} bytes: kubelet's sockets under it would exceed {MAX_SOCKET_PATH} bytes \
                     and kubelet could not start; use a shorter dir (at most {MAX_STATE_DIR_LEN} bytes)",
                    self.state_dir.display()
                ),
            ));
        }
        if self.run_dir.as_os_str().len() > 60 {
            return Err(bad(
                "runDir",
                "longer than 60 bytes: containerd's sockets under it would exceed 107 bytes",
            ));
        }
        if self.netns.is_empty() || self.netns.contains('/') {
            return Err(bad("netns", "must be an `ip netns` name"));
        }
        for (field, cidr) in [
            ("podCidr", &self.pod_cidr),
            ("clusterCidr", &self.cluster_cidr),
        ] {
            parse_cidr(cidr).map_err(|r| bad(field, r))?;
        }
        if !self.api_server.ip().is_loopback() {
            return Err(bad(
                "apiServer",
                format!(
                    "{} is not a loopback address (the shoot's endpoint)",
                    self.api_server
                ),
            ));
        }
        if !self.cgroup_root.starts_with('/') || self.cgroup_root.len() < 2 {
            return Err(bad(
                "cgroupRoot",
                "must be an absolute cgroup path like /ring-node-m1",
            ));
        }
        if let Some((i, name)) = self
            .images
            .iter()
            .enumerate()
            .find(|(_, n)| crate::images::reference(n).is_none())
        {
            let known: Vec<&str> = crate::images::ALL.iter().map(|i| i.name).collect();
            return Err(bad(
                &format!("images[{i}]"),
                format!(
                    "{name:?} is not an image Ring builds; use names from {}",
                    known.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// The node's files.
    pub fn layout(&self) -> NodeLayout {
        NodeLayout {
            state: self.state_dir.clone(),
            run: self.run_dir.clone(),
        }
    }
}

/// Parses `A.B.C.D/N`.
pub fn parse_cidr(cidr: &str) -> std::result::Result<(Ipv4Addr, u8), String> {
    let (addr, len) = cidr
        .split_once('/')
        .ok_or_else(|| format!("{cidr:?} is not ADDRESS/LENGTH"))?;
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| format!("{addr:?} in {cidr:?} is not an IPv4 address"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| format!("{len:?} in {cidr:?} is not a prefix length 0..=32"))?;
    Ok((addr, len))
}

/// kube-proxy's user on a node (its client certificate's common name).
pub const PROXY_USER: &str = "system:kube-proxy";

/// What kube-proxy's client certificate is issued as (by `ringctl bootstrap`
/// and `ringctl pki renew`).
pub fn proxy_identity() -> crate::pki::LeafSpec<'static> {
    crate::pki::LeafSpec::client(PROXY_USER, &[])
}

/// Where a node keeps what.
#[derive(Debug, Clone)]
pub struct NodeLayout {
    state: PathBuf,
    run: PathBuf,
}

impl NodeLayout {
    /// The node's state dir.
    pub fn state(&self) -> &Path {
        &self.state
    }
    /// CA, node and kube-proxy certificates (written by the ring's bootstrap).
    pub fn pki(&self) -> crate::pki::Pki {
        crate::pki::Pki::new(self.state.join("pki"))
    }
    /// The node's own client certificate (`system:node:<name>`).
    pub fn node_cert(&self) -> crate::pki::CertPair {
        self.cert("node")
    }
    /// kube-proxy's client certificate (`system:kube-proxy`).
    pub fn proxy_cert(&self) -> crate::pki::CertPair {
        self.cert("kube-proxy")
    }
    fn cert(&self, stem: &str) -> crate::pki::CertPair {
        let dir = self.state.join("pki");
        crate::pki::CertPair {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        }
    }
    /// A generated config file.
    pub fn config_file(&self, name: &str) -> PathBuf {
        self.state.join("config").join(name)
    }
    /// A component's log.
    pub fn log(&self, c: Component) -> PathBuf {
        self.state.join("logs").join(format!("{}.log", c.name()))
    }
    /// The supervisor's own status (what `ringctl status` reads).
    pub fn status_file(&self) -> PathBuf {
        self.state.join("status.json")
    }
    /// containerd's persistent root (images, snapshots).
    pub fn containerd_root(&self) -> PathBuf {
        self.state.join("containerd")
    }
    /// containerd's runtime state (tasks, shims' sockets, pods' namespaces).
    pub fn containerd_state(&self) -> PathBuf {
        self.run.join("containerd")
    }
    /// containerd's API socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd.sock")
    }
    /// kubelet's root dir (pods, volumes).
    pub fn kubelet_root(&self) -> PathBuf {
        self.state.join("kubelet")
    }
    /// The client certificate the kubelet renewed itself (certificate and
    /// key in one file, a link to the newest), once it did.
    pub fn kubelet_client_current(&self) -> PathBuf {
        self.kubelet_root()
            .join("pki")
            .join("kubelet-client-current.pem")
    }
    /// Static pod manifests.
    pub fn manifests(&self) -> PathBuf {
        self.state.join("manifests")
    }
    /// Container logs (bind-mounted over /var/log/pods in the node's mount namespace).
    pub fn pod_logs(&self) -> PathBuf {
        self.state.join("pod-logs")
    }
    /// CNI network config.
    pub fn cni_conf(&self) -> PathBuf {
        self.state.join("cni").join("net.d")
    }
    /// host-local IPAM's allocations.
    pub fn cni_ipam(&self) -> PathBuf {
        self.state.join("cni").join("ipam")
    }
}
