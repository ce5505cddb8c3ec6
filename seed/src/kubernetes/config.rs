//! The `seed.kubernetes` section of a ringd config: which seed cluster,
//! how the API Service is exposed, etcd's volume, the images, and the node a
//! self-hosting member's pods run on.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SeedError};

/// How the kube-apiserver's Service is exposed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ServiceType {
    /// An external load balancer (the default; ringd outside the cluster reaches `/readyz` through it).
    #[default]
    LoadBalancer,
    /// Reachable inside the seed cluster only.
    ClusterIP,
    /// A port on every node.
    NodePort,
}

/// Container images of the control plane components.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Images {
    pub etcd: String,
    pub kube_apiserver: String,
    pub kube_controller_manager: String,
    pub kube_scheduler: String,
    /// When the kubelet pulls them (`Never` by default: the images are built
    /// and imported locally, see `ringctl images`).
    pub pull_policy: PullPolicy,
}

impl Default for Images {
    /// The images `ringctl images build` makes from the binaries the local seed
    /// runs (etcd and Kubernetes as `scripts/setup` builds them), never pulled.
    fn default() -> Self {
        use crate::images::{ETCD, KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER};
        Images {
            etcd: ETCD.full(),
            kube_apiserver: KUBE_APISERVER.full(),
            kube_controller_manager: KUBE_CONTROLLER_MANAGER.full(),
            kube_scheduler: KUBE_SCHEDULER.full(),
            pull_policy: PullPolicy::Never,
        }
    }
}

/// A container's `imagePullPolicy`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum PullPolicy {
    /// Pull at every container start.
    Always,
    /// Pull only if the node lacks the image (for images in a registry).
    IfNotPresent,
    /// Never pull: the image must have been imported on the node (Ring's local images).
    #[default]
    Never,
}

impl PullPolicy {
    /// The `imagePullPolicy` value.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// A member's Kubernetes seed (the `seed.kubernetes` section of a ringd config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesSeedConfig {
    /// The ring's name; shoots live in namespaces `shoot--<ring>--<shoot>`.
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit. At most 24 characters.
    pub ring: String,
    /// Kubeconfig of the seed cluster; without it, ringd uses its in-cluster service account.
    /// Must not be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    /// Must not be empty; needs `kubeconfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Type of the kube-apiserver Service.
    #[serde(default)]
    pub service_type: ServiceType,
    /// Size of etcd's volume (a Kubernetes quantity such as `1Gi`).
    /// Digits with an optional K, M, G, T, Ki, Mi, Gi or Ti.
    #[serde(default = "default_etcd_storage")]
    pub etcd_storage: String,
    /// StorageClass of etcd's volume (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// Each must be an image reference without whitespace.
    #[serde(default)]
    pub images: Images,
    /// An address of a seed cluster node this ringd reaches, for a `NodePort`
    /// kube-apiserver Service when ringd runs outside the cluster: health
    /// checks go to `https://<nodeAddress>:<nodePort>`, and the API's serving
    /// certificate carries the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_address: Option<IpAddr>,
    /// The lease guards in the pods read the fence time from the lease file
    /// ringd writes under `stateDir` (mounted from the node) instead of the
    /// Lease in the seed cluster, so they keep their control plane while the
    /// seed cluster's API is away. Only for a seed cluster whose nodes are the
    /// machine this ringd runs on (a ring's own shoots: `selfHosting`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_from_node: bool,
    /// The node every control-plane pod runs on (`spec.nodeName`: the kubelet
    /// takes them without the seed cluster's scheduler). With
    /// `leaseFromNode`, the node on this machine whose disk holds etcd's data
    /// and the lease file.
    /// Lowercase letters, digits, '-' and '.', at most 253 characters, starting and ending
    /// with a letter or digit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The cgroup root of that node's pods when the node runs on this
    /// machine (`selfHosting`): a deleted pod whose cgroups hold no process
    /// is stopped, however late the kubelet reports it (a handover waits for
    /// its source's writers to stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_cgroup_root: Option<String>,
}

/// A DNS subdomain, as Kubernetes names nodes.
fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn default_etcd_storage() -> String {
    "1Gi".into()
}

/// Longest ring name that leaves room for a shoot name in a 63-character namespace.
pub const MAX_RING_NAME: usize = 24;

impl KubernetesSeedConfig {
    /// Defaults for `ring`, using the in-cluster service account.
    pub fn new(ring: impl Into<String>) -> Self {
        KubernetesSeedConfig {
            ring: ring.into(),
            kubeconfig: None,
            context: None,
            service_type: ServiceType::default(),
            etcd_storage: default_etcd_storage(),
            storage_class: None,
            images: Images::default(),
            node_address: None,
            lease_from_node: false,
            node_name: None,
            node_cgroup_root: None,
        }
    }

    /// Checks every field; the error's `field` is relative to this section.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: String| SeedError::InvalidSpec {
            field: field.into(),
            reason,
        };
        crate::validate_shoot_name(&self.ring).map_err(|e| bad("ring", e.to_string()))?;
        if self.ring.len() > MAX_RING_NAME {
            return Err(bad(
                "ring",
                format!("is longer than {MAX_RING_NAME} characters (namespaces are shoot--<ring>--<shoot>, at most 63)"),
            ));
        }
        if self
            .kubeconfig
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(bad("kubeconfig", "is empty; name a kubeconfig file or leave it out to use the in-cluster service account".into()));
        }
        if self.context.as_ref().is_some_and(|c| c.is_empty()) {
            return Err(bad(
                "context",
                "is empty; leave it out to use the kubeconfig's current context".into(),
            ));
        }
        if let Some(node) = self.node_name.as_deref().filter(|n| !valid_node_name(n)) {
            return Err(bad(
                "nodeName",
                format!("{node:?} is not a node name (lowercase letters, digits, '-' and '.', at most 253 characters): name the node as `kubectl get nodes` shows it"),
            ));
        }
        if self.context.is_some() && self.kubeconfig.is_none() {
            return Err(bad(
                "context",
                "needs kubeconfig (the in-cluster config has no contexts)".into(),
            ));
        }
        let digits = self
            .etcd_storage
            .trim_end_matches(['K', 'M', 'G', 'T', 'i']);
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || !["", "Ki", "Mi", "Gi", "Ti", "K", "M", "G", "T"]
                .contains(&&self.etcd_storage[digits.len()..])
        {
            return Err(bad(
                "etcdStorage",
                format!(
                    "{:?} is not a storage size such as 1Gi or 512Mi",
                    self.etcd_storage
                ),
            ));
        }
        for (field, image) in [
            ("images.etcd", &self.images.etcd),
            ("images.kubeApiserver", &self.images.kube_apiserver),
            (
                "images.kubeControllerManager",
                &self.images.kube_controller_manager,
            ),
            ("images.kubeScheduler", &self.images.kube_scheduler),
        ] {
            if image.is_empty() || image.contains(char::is_whitespace) {
                return Err(bad(field, format!("{image:?} is not an image reference")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_with_defaults_and_rejects_unknown_keys() {
        let c: KubernetesSeedConfig = serde_yaml::from_str(
            "ring: demo\nkubeconfig: /k\ncontext: seed-a\nserviceType: ClusterIP\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.service_type, ServiceType::ClusterIP);
        assert_eq!(c.etcd_storage, "1Gi");
        assert_eq!(c.images, Images::default());
        let err =
            serde_yaml::from_str::<KubernetesSeedConfig>("ring: demo\ncolour: blue\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `colour`"), "{err}");
        let err =
            serde_yaml::from_str::<KubernetesSeedConfig>("ring: demo\nserviceType: External\n")
                .unwrap_err();
        assert!(err.to_string().contains("LoadBalancer"), "{err}");
    }

    #[test]
    fn bad_values_name_the_field() {
        type Change = fn(&mut KubernetesSeedConfig);
        let cases: [(Change, &str); 5] = [
            (|c| c.ring = "Demo".into(), "ring"),
            (|c| c.ring = "r".repeat(30), "ring"),
            (|c| c.etcd_storage = "lots".into(), "etcdStorage"),
            (|c| c.context = Some("x".into()), "context"),
            (|c| c.images.etcd = String::new(), "images.etcd"),
        ];
        for (change, field) in cases {
            let mut c = KubernetesSeedConfig::new("demo");
            change(&mut c);
            match c.validate() {
                Err(SeedError::InvalidSpec { field: f, .. }) => assert_eq!(f, field),
                other => panic!("expected an error for {field}, got {other:?}"),
            }
        }
        let mut ok = KubernetesSeedConfig::new("demo");
        ok.etcd_storage = "512Mi".into();
        ok.validate().unwrap();
    }
}
