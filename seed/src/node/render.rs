//! What a node's processes are told: containerd's, kubelet's, kube-proxy's and
//! the CNI config, and their command lines. Pure: a config in, text out.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::config::{NodeConfig, NodeLayout};
use crate::process::{Component, ComponentSpec};

/// The cluster domain pods' names live in (served by the node's DNS).
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The programs a node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBinaries {
    pub containerd: PathBuf,
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    /// containerd's runc shim (named in its config, as runc is).
    pub shim: PathBuf,
    /// The OCI runtime containerd's runc shim runs (named in containerd's
    /// config: whatever `runc` the node's PATH holds is never used).
    pub runc: PathBuf,
    /// Where the CNI plugins (bridge, host-local, portmap, loopback) are.
    pub cni_bin_dir: PathBuf,
}

fn p(path: impl AsRef<Path>) -> String {
    path.as_ref().display().to_string()
}

/// containerd's config (version 4, containerd 2.4's own): its own root, state and
/// socket; the CRI plugin with the local pause image pinned (nothing is ever
/// pulled), `restrict_oom_score_adj` (no CAP_SYS_RESOURCE here), cgroupfs,
/// pods' network namespaces under its state dir, CNI from the node's dir.
pub fn containerd_config(layout: &NodeLayout, bins: &NodeBinaries, sandbox_image: &str) -> String {
    let images = "plugins.'io.containerd.cri.v1.images'";
    let runtime = "plugins.'io.containerd.cri.v1.runtime'";
    format!(
        r#"# Written by ring-node; changes are overwritten at the next start.
version = 4
root = "{root}"
state = "{state}"
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

# the debug and metrics servers stay off (no address)
[plugins.'io.containerd.server.v1.grpc']
  address = "{socket}"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "{socket}.ttrpc"

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = "{sandbox_image}"

[{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  max_container_log_line_size = 16384

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{shim}"

[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{runc}"

[{runtime}.cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.internal.v1.opt']
  path = "{root}/opt"
"#,
        root = p(layout.containerd_root()),
        state = p(layout.containerd_state()),
        socket = p(layout.containerd_socket()),
        shim = p(&bins.shim),
        runc = p(&bins.runc),
        cni_bin = p(&bins.cni_bin_dir),
        cni_conf = p(layout.cni_conf()),
    )
}

/// The pod network: a bridge inside the node's namespace with the node's pod
/// range, pods' traffic leaving the range masqueraded to the node's address.
pub fn cni_conflist(config: &NodeConfig, layout: &NodeLayout) -> String {
    let doc = json!({
        "cniVersion": "0.4.0",
        "name": format!("ring-{}", config.name),
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": config.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": p(layout.cni_ipam()),
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// kubelet's config file: cgroupfs under the node's own cgroup root, no swap
/// check, no host iptables rules, local images never collected, clients
/// authenticated by the shoot's CA and authorized by its kube-apiserver.
pub fn kubelet_config(config: &NodeConfig, layout: &NodeLayout) -> String {
    let doc = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": config.address.to_string(),
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "failSwapOn": false,
        // these machines have cgroup v1 only, which kubelet refuses by
        // default (the node's status says so: `NodeStatus::cgroup_v1`)
        "failCgroupV1": false,
        "containerRuntimeEndpoint": format!("unix://{}", p(layout.containerd_socket())),
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": config.cgroup_root,
        "cgroupsPerQOS": true,
        "makeIPTablesUtilChains": false,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "staticPodPath": p(layout.manifests()),
        "serializeImagePulls": false,
        // the node's own DNS (dns.rs) answers the cluster's names
        "clusterDNS": [config.address.to_string()],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": p(layout.pki().ca().cert)},
        },
        "authorization": {"mode": "Webhook"},
        "podPidsLimit": 4096,
        // the client certificate renews itself through a CSR the shoot
        // approves and signs (see `renewal`): a year after a node's start
        // it would otherwise stop being let in
        "rotateCertificates": true,
        // how often the node's status is computed (posted only when it
        // changed, the Lease renews apart): a new or restarted node turns
        // Ready about 2 s after its runtime is, not up to 10 s
        "nodeStatusUpdateFrequency": "2s",
        // a pod's Secrets and ConfigMaps read when its volumes are set up,
        // not through a watch per object: a pod created with its node set
        // (a control plane's) reaches the kubelet before the node authorizer
        // links the two, the watch's list is refused and its volumes waited
        // 1 s for the cache plus 0.5 s before the next try (~1.7 s of every
        // move); a refused read is retried after 0.5 s
        "configMapAndSecretChangeDetectionStrategy": "Get",
        // its requests to the shoot's API: a node that takes a control
        // plane's pods at once read their Secrets, posted their statuses and
        // waited up to a second each behind the default 5/s
        "kubeAPIQPS": 50,
        "kubeAPIBurst": 100,
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}

/// kube-proxy's config: iptables in the node's namespace, every Service
/// connection masqueraded (pods on one bridge reach each other through a
/// ClusterIP without br_netfilter), and the host's conntrack sysctls left alone.
pub fn kube_proxy_config(config: &NodeConfig, layout: &NodeLayout) -> String {
    let doc = json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": p(layout.config_file("kube-proxy.kubeconfig"))},
        "hostnameOverride": config.name,
        "bindAddress": config.address.to_string(),
        "clusterCIDR": config.cluster_cidr,
        "mode": "iptables",
        "iptables": {"masqueradeAll": true, "syncPeriod": "10s", "minSyncPeriod": "1s"},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}

/// The three supervised processes of a node, in start order.
pub fn component_specs(
    config: &NodeConfig,
    layout: &NodeLayout,
    bins: &NodeBinaries,
) -> Vec<ComponentSpec> {
    let spec = |component: Component, program: &PathBuf, args: Vec<String>| ComponentSpec {
        component,
        program: program.clone(),
        args,
        log: layout.log(component),
        netns: Some(config.netns.clone()),
    };
    vec![
        spec(
            Component::Containerd,
            &bins.containerd,
            vec![format!(
                "--config={}",
                p(layout.config_file("containerd.toml"))
            )],
        ),
        spec(
            Component::Kubelet,
            &bins.kubelet,
            vec![
                format!("--config={}", p(layout.config_file("kubelet.yaml"))),
                format!(
                    "--kubeconfig={}",
                    p(layout.config_file("kubelet.kubeconfig"))
                ),
                format!("--root-dir={}", p(layout.kubelet_root())),
                format!("--cert-dir={}", p(layout.kubelet_root().join("pki"))),
                format!("--hostname-override={}", config.name),
                format!("--node-ip={}", config.address),
                "--v=1".into(),
            ],
        ),
        spec(
            Component::KubeProxy,
            &bins.kube_proxy,
            vec![
                format!("--config={}", p(layout.config_file("kube-proxy.yaml"))),
                "--v=1".into(),
            ],
        ),
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::node::config::MAX_STATE_DIR_LEN;

    pub(crate) fn config() -> NodeConfig {
        NodeConfig {
            api_version: super::super::config::API_VERSION.into(),
            kind: "RingNode".into(),
            name: "m1".into(),
            state_dir: "/ring/members/m1/node".into(),
            run_dir: "/run/ring-node/rnode-0-m1".into(),
            netns: "rnode-0-m1".into(),
            address: "198.19.0.1".parse().unwrap(),
            pod_cidr: "198.19.1.0/24".into(),
            cluster_cidr: "198.19.0.0/20".into(),
            api_server: "127.20.1.2:6443".parse().unwrap(),
            cgroup_root: "/ring-node-rnode-0-m1".into(),
            images_dir: None,
            images: Vec::new(),
            bin_dir: None,
        }
    }

    fn bins() -> NodeBinaries {
        NodeBinaries {
            containerd: "/usr/bin/containerd".into(),
            kubelet: "/cache/kubelet".into(),
            kube_proxy: "/cache/kube-proxy".into(),
            shim: "/cache/containerd-shim-runc-v2".into(),
            runc: "/cache/runc".into(),
            cni_bin_dir: "/cache/cni/bin".into(),
        }
    }

    #[test]
    fn containerd_runs_from_the_nodes_dirs_with_the_known_machine_settings() {
        let c = config();
        let text = containerd_config(&c.layout(), &bins(), "docker.io/ring/pause:3.2");
        for want in [
            "root = \"/ring/members/m1/node/containerd\"",
            "state = \"/run/ring-node/rnode-0-m1/containerd\"",
            "address = \"/run/ring-node/rnode-0-m1/containerd.sock\"",
            "version = 4",
            "sandbox = \"docker.io/ring/pause:3.2\"",
            "restrict_oom_score_adj = true",
            "BinaryName = \"/cache/runc\"",
            "runtime_path = \"/cache/containerd-shim-runc-v2\"",
            "bin_dirs = [\"/cache/cni/bin\"]",
            "netns_mounts_under_state_dir = true",
            "SystemdCgroup = false",
            "conf_dir = \"/ring/members/m1/node/cni/net.d\"",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
    }

    #[test]
    fn kubelet_and_kube_proxy_leave_the_host_alone() {
        let c = config();
        let k: serde_json::Value = serde_yaml::from_str(&kubelet_config(&c, &c.layout())).unwrap();
        assert_eq!(k["failSwapOn"], false);
        assert_eq!(k["failCgroupV1"], false);
        assert_eq!(
            k["containerRuntimeEndpoint"],
            "unix:///run/ring-node/rnode-0-m1/containerd.sock"
        );
        assert_eq!(k["makeIPTablesUtilChains"], false);
        assert_eq!(k["cgroupDriver"], "cgroupfs");
        assert_eq!(k["cgroupRoot"], "/ring-node-rnode-0-m1");
        assert_eq!(k["imageGCHighThresholdPercent"], 100);
        assert_eq!(k["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(k["nodeStatusUpdateFrequency"], "2s");
        assert_eq!(k["configMapAndSecretChangeDetectionStrategy"], "Get");
        assert_eq!(k["kubeAPIQPS"], 50);
        let kp: serde_json::Value =
            serde_yaml::from_str(&kube_proxy_config(&c, &c.layout())).unwrap();
        assert_eq!(kp["conntrack"]["maxPerCore"], 0);
        assert_eq!(kp["iptables"]["masqueradeAll"], true);
        assert_eq!(kp["hostnameOverride"], "m1");
        let cni: serde_json::Value = serde_json::from_str(&cni_conflist(&c, &c.layout())).unwrap();
        assert_eq!(
            cni["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "198.19.1.0/24"
        );
        assert_eq!(
            cni["plugins"][0]["ipam"]["dataDir"],
            "/ring/members/m1/node/cni/ipam"
        );
    }

    #[test]
    fn every_process_runs_in_the_nodes_namespace() {
        let c = config();
        let specs = component_specs(&c, &c.layout(), &bins());
        let names: Vec<_> = specs.iter().map(|s| s.component).collect();
        assert_eq!(
            names,
            [
                Component::Containerd,
                Component::Kubelet,
                Component::KubeProxy
            ]
        );
        assert!(specs
            .iter()
            .all(|s| s.netns.as_deref() == Some("rnode-0-m1")));
        let kubelet = &specs[1].args;
        assert!(kubelet.contains(&"--hostname-override=m1".to_string()));
        for s in &specs {
            let removed = s.args.iter().find(|a| crate::process::is_removed_flag(a));
            assert_eq!(removed, None, "{:?}", s.component);
        }
    }

    #[test]
    fn bad_configs_name_the_field() {
        type Edit = fn(&mut NodeConfig);
        let cases: Vec<(Edit, &str)> = vec![
            (|c| c.kind = "Node".into(), "kind"),
            (|c| c.name = "M_1".into(), "name"),
            (|c| c.state_dir = "rel".into(), "stateDir"),
            // kubelet's pod-resources socket under it would not fit in a unix
            // socket path's 107 bytes: kubelet would exit 255 in a loop
            (
                |c| c.state_dir = format!("/tmp/{}/seed-lk1/node", "d".repeat(62)).into(),
                "stateDir",
            ),
            (
                |c| c.run_dir = format!("/{}", "x".repeat(70)).into(),
                "runDir",
            ),
            (|c| c.pod_cidr = "198.19.1.0".into(), "podCidr"),
            (|c| c.cluster_cidr = "198.19.0.0/40".into(), "clusterCidr"),
            (
                |c| c.api_server = "10.1.1.1:6443".parse().unwrap(),
                "apiServer",
            ),
            (|c| c.cgroup_root = "ring".into(), "cgroupRoot"),
            (|c| c.netns = "a/b".into(), "netns"),
            (
                |c| c.images = vec!["etcd".into(), "nginx".into()],
                "images[1]",
            ),
        ];
        for (edit, field) in cases {
            let mut c = config();
            edit(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("invalid {field}")),
                "{field}: {err}"
            );
        }
        config().validate().unwrap();
        let mut c = config();
        c.images = vec!["etcd".into(), "kube-apiserver".into()];
        c.validate().unwrap();
        assert_eq!(
            c.image_references(),
            [
                "docker.io/ring/etcd:v3.7.3".to_string(),
                format!(
                    "docker.io/ring/kube-apiserver:{}",
                    crate::binaries::K8S_VERSION
                )
            ]
        );
        // the longest state dir that still fits is accepted
        let mut c = config();
        c.state_dir = format!("/{}", "s".repeat(MAX_STATE_DIR_LEN - 1)).into();
        c.validate().unwrap();
        c.state_dir = format!("/{}", "s".repeat(MAX_STATE_DIR_LEN)).into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("kubelet") && err.contains("shorter"), "{err}");
    }
}
