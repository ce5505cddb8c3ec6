//! The Kubernetes seed: hosts control planes as workloads in a real cluster.
//!
//! A shoot's control plane becomes objects in the namespace
//! `shoot--<ring>--<shoot>` of the seed cluster (see [`render`]): etcd as a
//! StatefulSet with a PersistentVolumeClaim, kube-apiserver,
//! kube-controller-manager and kube-scheduler as Deployments, Services (the
//! API's of type LoadBalancer by default), the PKI in a Secret, a
//! PodDisruptionBudget and resource requests. Everything is applied with
//! server-side apply (field manager `ringd`) and owned by the anchor ConfigMap
//! `ring-control-plane`, so [`KubernetesSeed::delete`] cleans up through the
//! garbage collector.
//!
//! The shoot's PKI is made with [`crate::pki`] in a local cache directory
//! (`<state-dir>/shoots/<shoot>/pki`), but the Secret in the seed cluster is the
//! source of truth: every `start` first restores the cache from the Secret, so
//! the CA and the certificates stay the same across re-applies and across
//! ringd instances.
//!
//! * `start` applies everything with one replica per component;
//! * `stop` scales every workload to zero (the PVC and so etcd's data stay),
//!   waits for the pods to go, then deletes stragglers without grace;
//! * `fence` scales kube-apiserver to zero and deletes its pods without grace;
//! * `inspect` / `health` read the workloads' status and ask `/readyz` through
//!   the API Service when this ringd can reach it (a LoadBalancer address, or
//!   the Service's DNS name when ringd runs in the seed cluster), and say so
//!   plainly when it cannot.

pub mod agent;
mod backoff;
mod forwarder;
mod handover;
pub mod manifests;
mod records;
pub mod render;
pub mod volumes;

pub use agent::{LeaseRecord, PodBackup, Wiring};
pub use records::{etcd_pod_url, BackupProgress, RestoreRecord};

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::Api;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::error::{Result, SeedError};
use crate::local::ShootLayout;
use crate::pki::{create_private_dir, write_private, LeafSpec, Pki, KUBERNETES_SERVICE_IP};
use crate::process::{Component, ComponentState};
use crate::{
    kubeconfig, ComponentStatus, ControlPlaneSpec, ControlPlaneStatus, Health, Phase, Seed,
};
use render::{Owner, Renderer, ANCHOR, APISERVER, FIELD_MANAGER, PKI_SECRET, SHOOT_LABEL};

/// How the kube-apiserver's Service is exposed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// runs (etcd 3.4.23, Kubernetes v1.20.2), never pulled.
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesSeedConfig {
    /// The ring's name; shoots live in namespaces `shoot--<ring>--<shoot>`.
    pub ring: String,
    /// Kubeconfig of the seed cluster; without it, ringd uses its in-cluster service account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Type of the kube-apiserver Service.
    #[serde(default)]
    pub service_type: ServiceType,
    /// Size of etcd's volume (a Kubernetes quantity such as `1Gi`).
    #[serde(default = "default_etcd_storage")]
    pub etcd_storage: String,
    /// StorageClass of etcd's volume (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
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

/// A seed that runs control planes as workloads in a Kubernetes cluster.
pub struct KubernetesSeed {
    client: kube::Client,
    config: KubernetesSeedConfig,
    state_dir: PathBuf,
    in_cluster: bool,
    stop_grace: Duration,
    /// Serializes starts: they share the local PKI cache.
    starting: tokio::sync::Mutex<()>,
    /// The lease guard and backup containers of a ring's control planes.
    wiring: Wiring,
    /// Relays of the shoots' stable endpoints (a ring's seed; see [`forwarder`]).
    forwarders: Option<forwarder::Forwarders>,
}

impl KubernetesSeed {
    /// Connects to the seed cluster named by `config` (its kubeconfig and context, or the
    /// in-cluster service account); `state_dir` holds local caches (PKI, admin kubeconfigs).
    pub async fn connect(
        config: &KubernetesSeedConfig,
        state_dir: impl Into<PathBuf>,
    ) -> Result<Self> {
        config.validate()?;
        let err = |message: String| SeedError::Kube {
            shoot: "(seed cluster)".into(),
            message,
        };
        let (kube_config, in_cluster) = match &config.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| err(format!("reading kubeconfig {}: {e}", path.display())))?;
                let options = kube::config::KubeConfigOptions {
                    context: config.context.clone(),
                    ..Default::default()
                };
                let c = kube::Config::from_custom_kubeconfig(kc, &options)
                    .await
                    .map_err(|e| err(format!("kubeconfig {} (context {:?}): {e}", path.display(), config.context)))?;
                (c, false)
            }
            None => (
                kube::Config::incluster().map_err(|e| {
                    err(format!("no kubeconfig given and not running in a cluster ({e}); set seed.kubernetes.kubeconfig"))
                })?,
                true,
            ),
        };
        let client = kube::Client::try_from(kube_config).map_err(|e| err(e.to_string()))?;
        Ok(Self::with_client(
            client,
            config.clone(),
            state_dir,
            in_cluster,
        ))
    }

    /// A seed on an existing client; `in_cluster` says whether cluster-internal
    /// Service addresses are reachable from here.
    pub fn with_client(
        client: kube::Client,
        config: KubernetesSeedConfig,
        state_dir: impl Into<PathBuf>,
        in_cluster: bool,
    ) -> Self {
        KubernetesSeed {
            client,
            config,
            state_dir: state_dir.into(),
            in_cluster,
            stop_grace: Duration::from_secs(30),
            starting: tokio::sync::Mutex::new(()),
            wiring: Wiring::default(),
            forwarders: None,
        }
    }

    /// Runs etcd and kube-apiserver under the lease guard and, with `backup`,
    /// backs etcd up from a sidecar and restores it in an init container.
    pub fn with_wiring(mut self, wiring: Wiring) -> Self {
        self.wiring = wiring;
        self
    }

    /// Keeps each served shoot's stable endpoint (the address its kubeconfig
    /// names, as on a local seed) relayed to its kube-apiserver Service by
    /// `ring-agent` at `agent`, under the guard of the shoot's lease file.
    pub fn with_forwarder(mut self, agent: PathBuf) -> Self {
        self.forwarders = Some(forwarder::Forwarders::new(agent));
        self
    }

    /// How long `stop` waits for pods to end before deleting them without grace.
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The namespace of `shoot`'s control plane.
    pub fn namespace(&self, shoot: &str) -> String {
        render::namespace(&self.config.ring, shoot)
    }

    /// Shoots this seed has local state for (one folder each under `state_dir/shoots`).
    pub fn shoots(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.state_dir.join("shoots"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::validate_shoot_name(n).is_ok())
            .collect();
        names.sort();
        names
    }

    /// The local cache of `shoot`'s PKI (restored from the Secret on every start).
    pub fn pki_cache(&self, shoot: &str) -> PathBuf {
        self.shoot_layout(shoot).dir.join("pki")
    }

    /// The admin kubeconfig this seed writes for `shoot` (server: the API Service's address).
    pub fn admin_kubeconfig(&self, shoot: &str) -> PathBuf {
        self.shoot_layout(shoot).dir.join("admin.kubeconfig")
    }

    /// The local state of `shoot` (PKI cache, spec, lease file, logs, the
    /// admin kubeconfigs).
    pub fn shoot_layout(&self, shoot: &str) -> ShootLayout {
        ShootLayout {
            dir: self.state_dir.join("shoots").join(shoot),
        }
    }

    fn kube_err(&self, shoot: &str, what: &str) -> impl Fn(kube::Error) -> SeedError {
        let (shoot, what) = (shoot.to_string(), what.to_string());
        move |e| {
            let hint = match &e {
                kube::Error::Api(r) if r.code == 403 => {
                    "; ringd's service account lacks a permission (see the RBAC in `ringctl manifests`)"
                }
                _ => "",
            };
            SeedError::Kube {
                shoot: shoot.clone(),
                message: format!("{what}: {e}{hint}"),
            }
        }
    }

    fn renderer<'a>(&'a self, spec: &'a ControlPlaneSpec) -> Renderer<'a> {
        Renderer {
            ring: &self.config.ring,
            spec,
            config: &self.config,
            wiring: &self.wiring,
            node_dir: self.node_dir(&spec.shoot),
        }
    }

    /// With `leaseFromNode`, the directory of `shoot`'s pods on the node: the
    /// lease file their guards and backup sidecar read, etcd's data below
    /// (see [`Renderer::node_dir`]). Kept apart from the shoot's own dir, so a
    /// local seed later in the same place never feeds this seed's old pods.
    pub fn node_dir(&self, shoot: &str) -> Option<PathBuf> {
        self.config
            .lease_from_node
            .then(|| pods_dir(&self.shoot_layout(shoot)))
    }

    /// Server-side apply of one rendered object; returns the object as stored.
    async fn apply(&self, shoot: &str, object: &Value) -> Result<DynamicObject> {
        let (api_version, kind) = (
            object["apiVersion"].as_str().unwrap_or_default(),
            object["kind"].as_str().unwrap_or_default(),
        );
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map_err(self.kube_err(shoot, &format!("applying {kind} {name}")))
    }

    /// Applies `objects` concurrently; the first error, if any.
    async fn apply_all(&self, shoot: &str, objects: &[Value]) -> Result<()> {
        futures::future::try_join_all(objects.iter().map(|o| self.apply(shoot, o))).await?;
        Ok(())
    }

    /// Makes sure the namespace exists (it may be created beforehand, with ringd's RBAC in it).
    async fn ensure_namespace(&self, spec: &ControlPlaneSpec) -> Result<()> {
        let ns = self.namespace(&spec.shoot);
        let api: Api<Namespace> = Api::all(self.client.clone());
        let found = api
            .get_opt(&ns)
            .await
            .map_err(self.kube_err(&spec.shoot, &format!("reading namespace {ns}")))?;
        match found {
            Some(n) if n.metadata.deletion_timestamp.is_some() => Err(SeedError::Kube {
                shoot: spec.shoot.clone(),
                message: format!("namespace {ns} is being deleted; try again once it is gone"),
            }),
            Some(_) => Ok(()),
            None => {
                let object: Namespace = serde_json::from_value(self.renderer(spec).namespace())
                    .map_err(|e| SeedError::InvalidSpec {
                        field: "namespace".into(),
                        reason: e.to_string(),
                    })?;
                api.create(&PostParams::default(), &object)
                    .await
                    .map_err(self.kube_err(&spec.shoot, &format!("creating namespace {ns}")))?;
                Ok(())
            }
        }
    }

    /// The PKI Secret's data, if the Secret exists.
    async fn read_pki_secret(&self, shoot: &str) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        let secret = api
            .get_opt(PKI_SECRET)
            .await
            .map_err(self.kube_err(shoot, &format!("reading Secret {PKI_SECRET}")))?;
        Ok(secret.map(|s| {
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        }))
    }

    /// Restores the local PKI cache from the Secret (if any), completes it, and
    /// returns every file for the Secret.
    async fn prepare_pki(
        &self,
        spec: &ControlPlaneSpec,
        lb: &[LbAddress],
    ) -> Result<BTreeMap<String, Vec<u8>>> {
        let dir = self.pki_cache(&spec.shoot);
        create_private_dir(&dir)?;
        let data = self.read_pki_secret(&spec.shoot).await?.unwrap_or_default();
        if let Some(name) = data.keys().find(|n| n.contains('/') || n.starts_with('.')) {
            return Err(SeedError::Pki {
                path: dir.join(name),
                reason: format!("Secret {PKI_SECRET} has an unexpected key {name:?}"),
            });
        }
        // the Secret is the truth: files it lacks go, its files replace the
        // cached ones one by one (never a missing file for a concurrent reader)
        for entry in std::fs::read_dir(&dir).map_err(SeedError::io(&dir))? {
            let path = entry.map_err(SeedError::io(&dir))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| !n.starts_with('.') && !data.contains_key(&n)) && path.is_file()
            {
                std::fs::remove_file(&path).map_err(SeedError::io(&path))?;
            }
        }
        for (name, bytes) in &data {
            write_private(&dir.join(name), bytes)?;
        }
        let pki = Pki::new(&dir);
        pki.ensure(&spec.shoot, &spec.endpoint)?;
        let ns = self.namespace(&spec.shoot);
        let mut api_dns: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .map(String::from)
        .to_vec();
        api_dns.extend(render::service_dns_names(&ns, APISERVER));
        let mut api_ips = vec![
            IpAddr::V4(spec.endpoint.address),
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V4(KUBERNETES_SERVICE_IP),
        ];
        api_ips.extend(self.config.node_address);
        for a in lb {
            match a {
                LbAddress::Ip(ip) => api_ips.push(*ip),
                LbAddress::Host(h) => api_dns.push(h.clone()),
            }
        }
        let etcd_ips = api_ips[..2].to_vec();
        let etcd_dns = render::etcd_dns_names(&ns);
        for (stem, cn, server, client, ips, dns) in [
            (
                "etcd-server",
                "etcd-server",
                true,
                true,
                &etcd_ips,
                &etcd_dns,
            ),
            ("etcd-peer", "etcd-peer", true, true, &etcd_ips, &etcd_dns),
            (
                "kube-apiserver",
                "kube-apiserver",
                true,
                false,
                &api_ips,
                &api_dns,
            ),
        ] {
            let spec = LeafSpec {
                common_name: cn,
                organizations: &[],
                ips: ips.clone(),
                dns_names: dns.clone(),
                server,
                client,
            };
            ensure_serving(&pki, stem, &spec)?;
        }
        let in_cluster_api = format!("https://{APISERVER}.{ns}.svc:{}", spec.endpoint.api_port);
        for (c, leaf) in [
            (
                Component::KubeControllerManager,
                crate::pki::Leaf::ControllerManager,
            ),
            (Component::KubeScheduler, crate::pki::Leaf::Scheduler),
        ] {
            kubeconfig::write(
                &dir.join(format!("{}.kubeconfig", c.name())),
                &spec.shoot,
                c.name(),
                &in_cluster_api,
                &pki,
                &pki.leaf(leaf),
            )?;
        }
        read_dir_files(&dir)
    }

    /// The anchor ConfigMap of `shoot`, or [`SeedError::UnknownShoot`].
    async fn anchor(&self, shoot: &str) -> Result<ConfigMap> {
        let ns = self.namespace(shoot);
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
        api.get_opt(ANCHOR)
            .await
            .map_err(self.kube_err(shoot, &format!("reading ConfigMap {ANCHOR}")))?
            .ok_or_else(|| SeedError::UnknownShoot {
                shoot: shoot.to_string(),
                path: PathBuf::from(format!("namespace {ns} of the seed cluster")),
            })
    }

    /// The spec recorded in the anchor.
    async fn recorded_spec(&self, shoot: &str) -> Result<ControlPlaneSpec> {
        let anchor = self.anchor(shoot).await?;
        self.spec_in(shoot, &anchor)
    }

    /// The spec recorded in `shoot`'s anchor.
    fn spec_in(&self, shoot: &str, anchor: &ConfigMap) -> Result<ControlPlaneSpec> {
        let text = anchor
            .data
            .as_ref()
            .and_then(|d| d.get("spec.json"))
            .cloned()
            .unwrap_or_default();
        serde_json::from_str(&text).map_err(|e| SeedError::InvalidSpec {
            field: format!("ConfigMap {ANCHOR} in namespace {}", self.namespace(shoot)),
            reason: format!(
                "spec.json: {e}; delete the ConfigMap's spec.json key and start the shoot again"
            ),
        })
    }

    async fn api_service(&self, shoot: &str) -> Result<Option<Service>> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        api.get_opt(APISERVER)
            .await
            .map_err(self.kube_err(shoot, &format!("reading Service {APISERVER}")))
    }

    /// Starts the relay of the shoot's stable endpoint with the control plane
    /// (its guard lets it listen only while the lease file allows), so that
    /// clients reach kube-apiserver the moment it is ready rather than at the
    /// next health check. Without a reachable Service yet, the health check
    /// starts it later and says why.
    async fn relay_now(&self, spec: &ControlPlaneSpec) -> Result<()> {
        let Some(forwarders) = &self.forwarders else {
            return Ok(());
        };
        let svc = self.api_service(&spec.shoot).await?;
        let Ok(url) = self.reachable_url(&spec.shoot, svc.as_ref()) else {
            return Ok(());
        };
        let layout = self.shoot_layout(&spec.shoot);
        forwarders
            .ensure(&layout, spec, forwarder::authority(&url))
            .await
    }

    /// Where this ringd can reach the shoot's API, or why it cannot.
    fn reachable_url(
        &self,
        shoot: &str,
        svc: Option<&Service>,
    ) -> std::result::Result<String, String> {
        let Some(svc) = svc else {
            return Err(format!("Service {APISERVER} does not exist"));
        };
        let port = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .map(|p| p.port)
            .unwrap_or(6443);
        if let Some(a) = lb_addresses(svc).first() {
            return Ok(match a {
                LbAddress::Ip(ip) => format!("https://{ip}:{port}"),
                LbAddress::Host(h) => format!("https://{h}:{port}"),
            });
        }
        if self.in_cluster {
            return Ok(format!(
                "https://{APISERVER}.{}.svc:{port}",
                self.namespace(shoot)
            ));
        }
        let ty = svc
            .spec
            .as_ref()
            .and_then(|s| s.type_.clone())
            .unwrap_or_else(|| "ClusterIP".into());
        let node_port = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .and_then(|p| p.first())
            .and_then(|p| p.node_port);
        if let (Some(ip), Some(node_port), "NodePort") =
            (self.config.node_address, node_port, ty.as_str())
        {
            let port = u16::try_from(node_port).unwrap_or_default();
            return Ok(format!("https://{}", std::net::SocketAddr::new(ip, port)));
        }
        Err(match ty.as_str() {
            "NodePort" if self.config.node_address.is_none() => "Service kube-apiserver is a NodePort, and this ringd runs outside the seed cluster: set seed.kubernetes.nodeAddress to a node address it reaches".to_string(),
            "LoadBalancer" => format!("Service {APISERVER} (LoadBalancer) has no load balancer address yet, and this ringd runs outside the seed cluster"),
            other => format!("Service {APISERVER} is of type {other}, which this ringd (outside the seed cluster) cannot reach"),
        })
    }

    /// Removes the shoot's control plane: deletes the anchor (the garbage collector
    /// removes every object it owns) and etcd's volume claims, i.e. all of the
    /// shoot's data on this seed. The namespace stays (it may carry ringd's RBAC).
    pub async fn delete(&self, shoot: &str) -> Result<()> {
        self.stop_relay(shoot).await;
        let ns = self.namespace(shoot);
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
        match cms.delete(ANCHOR, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(r)) if r.code == 404 => {}
            Err(e) => {
                return Err(self
                    .kube_err(shoot, &format!("deleting ConfigMap {ANCHOR}"))(
                    e
                ))
            }
        }
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        pvcs.delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels(&format!("{SHOOT_LABEL}={shoot}")),
        )
        .await
        .map_err(self.kube_err(shoot, "deleting etcd's volume claims"))?;
        let _ = std::fs::remove_dir_all(self.state_dir.join("shoots").join(shoot));
        Ok(())
    }

    async fn scale(&self, shoot: &str, component: Component, replicas: i32) -> Result<()> {
        let ns = self.namespace(shoot);
        let (kind, name) = render::workload(component);
        let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
        let pp = PatchParams::default();
        let what = format!("scaling {kind} {name} to {replicas}");
        let res = if kind == "StatefulSet" {
            Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
                .patch_scale(name, &pp, &patch)
                .await
        } else {
            Api::<Deployment>::namespaced(self.client.clone(), &ns)
                .patch_scale(name, &pp, &patch)
                .await
        };
        match res {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(r)) if r.code == 404 => Ok(()),
            Err(e) => Err(self.kube_err(shoot, &what)(e)),
        }
    }

    async fn pods(&self, shoot: &str, selector: &str) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        Ok(api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(self.kube_err(shoot, "listing pods"))?
            .items)
    }

    async fn delete_pods_now(&self, shoot: &str, selector: &str) -> Result<()> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        api.delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default().labels(selector),
        )
        .await
        .map_err(self.kube_err(shoot, "deleting pods"))?;
        Ok(())
    }

    /// (desired, ready) replicas of a component's workload; `None` if it does not exist.
    async fn replicas(&self, shoot: &str, component: Component) -> Result<Option<(i32, i32)>> {
        let ns = self.namespace(shoot);
        let (kind, name) = render::workload(component);
        let what = format!("reading {kind} {name}");
        Ok(if kind == "StatefulSet" {
            Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
                .get_opt(name)
                .await
                .map_err(self.kube_err(shoot, &what))?
                .map(|s| {
                    let desired = s.spec.and_then(|s| s.replicas).unwrap_or(1);
                    (
                        desired,
                        s.status.and_then(|s| s.ready_replicas).unwrap_or(0),
                    )
                })
        } else {
            Api::<Deployment>::namespaced(self.client.clone(), &ns)
                .get_opt(name)
                .await
                .map_err(self.kube_err(shoot, &what))?
                .map(|d| {
                    let desired = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                    (
                        desired,
                        d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
                    )
                })
        })
    }
}

/// An address of a LoadBalancer Service.
#[derive(Debug, Clone)]
enum LbAddress {
    Ip(IpAddr),
    Host(String),
}

fn lb_addresses(svc: &Service) -> Vec<LbAddress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| match (&i.ip, &i.hostname) {
            (Some(ip), _) => ip.parse().ok().map(LbAddress::Ip),
            (None, Some(h)) => Some(LbAddress::Host(h.clone())),
            _ => None,
        })
        .collect()
}

/// The label selector of `shoot`'s pods of one component (`etcd`, `kube-apiserver`).
fn component_selector(shoot: &str, component: &str) -> String {
    format!(
        "{SHOOT_LABEL}={shoot},{}={component}",
        render::COMPONENT_LABEL
    )
}

/// The component a pod runs (its component label).
fn component_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(render::COMPONENT_LABEL)
        .map(String::as_str)
}

/// Every regular file of `dir` by name.
fn read_dir_files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(SeedError::io(dir))? {
        let entry = entry.map_err(SeedError::io(dir))?;
        let path = entry.path();
        if path.is_file() && path.extension().is_none_or(|e| e != "tmp") {
            let bytes = std::fs::read(&path).map_err(SeedError::io(&path))?;
            files.insert(entry.file_name().to_string_lossy().into_owned(), bytes);
        }
    }
    Ok(files)
}

/// Keeps the serving certificate `stem` if it already names every address of
/// `spec`, else issues it anew from the shoot's CA (which [`Pki::ensure`] checked).
fn ensure_serving(pki: &Pki, stem: &str, spec: &LeafSpec<'_>) -> Result<()> {
    let (cert, key) = (
        pki.dir().join(format!("{stem}.crt")),
        pki.dir().join(format!("{stem}.key")),
    );
    let current = std::fs::read(&cert).map_err(SeedError::io(&cert))?;
    if let Some((dns, ips)) = sans(&current) {
        if spec.dns_names.iter().all(|d| dns.contains(d))
            && spec.ips.iter().all(|i| ips.contains(i))
        {
            return Ok(());
        }
    }
    let ca = pki.ca();
    let (ca_cert, ca_key) = (pki.read_pem(&ca.cert)?, pki.read_pem(&ca.key)?);
    let (cert_pem, key_pem) = crate::pki::issue(&ca_cert, &ca_key, spec)?;
    write_private(&key, key_pem.as_bytes())?;
    write_private(&cert, cert_pem.as_bytes())
}

/// The DNS names and IP addresses a PEM certificate is valid for.
fn sans(pem: &[u8]) -> Option<(Vec<String>, Vec<IpAddr>)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, cert) = X509Certificate::from_der(&pem.contents).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for name in &san.value.general_names {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(raw) => match raw.len() {
                4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*raw).ok()?)),
                16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*raw).ok()?)),
                _ => {}
            },
            _ => {}
        }
    }
    Some((dns, ips))
}

/// The directory of a shoot's pods under its dir in a Kubernetes seed's
/// state dir, with `leaseFromNode` ([`KubernetesSeed::node_dir`]).
pub fn pods_dir(shoot: &ShootLayout) -> PathBuf {
    shoot.dir.join("pods")
}

#[async_trait::async_trait]
impl Seed for KubernetesSeed {
    async fn start(&self, spec: &ControlPlaneSpec) -> Result<()> {
        spec.validate()?;
        let ns = self.namespace(&spec.shoot);
        if ns.len() > 63 {
            return Err(SeedError::InvalidSpec {
                field: "shoot".into(),
                reason: format!("namespace {ns} would be longer than 63 characters; use a shorter shoot or ring name"),
            });
        }
        let _one_at_a_time = self.starting.lock().await;
        self.ensure_namespace(spec).await?;
        let anchor = self
            .apply(&spec.shoot, &self.renderer(spec).anchor())
            .await?;
        let owner = Owner {
            name: ANCHOR.into(),
            uid: anchor.metadata.uid.clone().ok_or_else(|| SeedError::Kube {
                shoot: spec.shoot.clone(),
                message: format!("ConfigMap {ANCHOR} has no uid"),
            })?,
        };
        let svc = self.api_service(&spec.shoot).await?;
        let lb = svc.as_ref().map(lb_addresses).unwrap_or_default();
        let pki = self.prepare_pki(spec, &lb).await?;
        if let Some(dir) = self.node_dir(&spec.shoot) {
            crate::pki::create_private_dir(&dir.join(render::NODE_ETCD))?;
        }
        let started = std::time::Instant::now();
        let (workloads, rest): (Vec<Value>, Vec<Value>) = self
            .renderer(spec)
            .objects(&owner, &pki)
            .into_iter()
            .partition(render::is_workload);
        // two rounds of concurrent applies instead of one call after another
        // (some 17 round trips to a seed API that, in a failover, is loaded):
        // what the pods need (service account, Secrets, Services) first,
        // then the workloads, so no pod is refused for a missing account
        self.apply_all(&spec.shoot, &rest).await?;
        self.apply_all(&spec.shoot, &workloads).await?;
        let ms = started.elapsed().as_millis() as u64;
        tracing::info!(shoot = %spec.shoot, namespace = %ns, objects_ms = ms, "control plane applied");
        // a start repeated until the control plane is whole (a move's target)
        // also ends back-offs its dependents entered while the API was down
        self.replace_backed_off(&spec.shoot).await?;
        self.relay_now(spec).await
    }

    async fn stop(&self, shoot: &str) -> Result<()> {
        self.anchor(shoot).await?;
        self.stop_relay(shoot).await;
        for c in Component::ALL.iter().rev() {
            self.scale(shoot, *c, 0).await?;
        }
        self.wait_pods_gone(shoot, &format!("{SHOOT_LABEL}={shoot}"))
            .await
    }

    async fn fence(&self, shoot: &str) -> Result<()> {
        self.stop_relay(shoot).await;
        self.anchor(shoot).await?;
        self.scale(shoot, Component::KubeApiserver, 0).await?;
        self.delete_pods_now(shoot, &component_selector(shoot, APISERVER))
            .await?;
        tracing::warn!(
            shoot,
            "control plane fenced (kube-apiserver scaled to zero, pods deleted)"
        );
        Ok(())
    }

    async fn inspect(&self, shoot: &str) -> Result<ControlPlaneStatus> {
        let spec = self.recorded_spec(shoot).await?;
        let pods = self.pods(shoot, &format!("{SHOOT_LABEL}={shoot}")).await?;
        let mut components = Vec::new();
        let mut desired_total = 0;
        for c in Component::ALL {
            let (desired, ready) = self.replicas(shoot, c).await?.unwrap_or((0, 0));
            desired_total += desired;
            let mut state = ComponentState::default();
            for pod in pods.iter().filter(|p| component_of(p) == Some(c.name())) {
                let statuses = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.clone())
                    .unwrap_or_default();
                for cs in statuses {
                    state.restarts += u32::try_from(cs.restart_count).unwrap_or(0);
                    if let Some(t) = cs.last_state.and_then(|s| s.terminated) {
                        state.last_exit = Some(format!(
                            "exit code {}{}",
                            t.exit_code,
                            t.reason.map(|r| format!(" ({r})")).unwrap_or_default()
                        ));
                    }
                }
            }
            components.push(ComponentStatus {
                component: c,
                running: ready > 0,
                state,
            });
        }
        let health = self.health(shoot).await?;
        let all_running = components.iter().all(|c| c.running);
        let phase = match (desired_total, health.ready, all_running) {
            (0, _, _) => Phase::Stopped,
            (_, false, _) => Phase::Starting,
            (_, true, true) => Phase::Ready,
            (_, true, false) => Phase::Degraded,
        };
        let svc = self.api_service(shoot).await?;
        let reachable = self.reachable_url(shoot, svc.as_ref());
        let (api_url, kubeconfig) = match (&self.forwarders, reachable) {
            (Some(_), _) => (
                spec.endpoint.api_url(),
                self.shoot_layout(shoot).admin_kubeconfig(),
            ),
            (None, Ok(url)) => (url, self.admin_kubeconfig(shoot)),
            (None, Err(_)) => (
                format!(
                    "https://{APISERVER}.{}.svc:{}",
                    self.namespace(shoot),
                    spec.endpoint.api_port
                ),
                self.admin_kubeconfig(shoot),
            ),
        };
        Ok(ControlPlaneStatus {
            shoot: shoot.to_string(),
            phase,
            api_url,
            kubeconfig,
            supervisor_pid: None,
            readyz: health.detail,
            components,
        })
    }

    async fn health(&self, shoot: &str) -> Result<Health> {
        let anchor = self.anchor(shoot).await?;
        let (desired, ready) = self
            .replicas(shoot, Component::KubeApiserver)
            .await?
            .unwrap_or((0, 0));
        let replicas = format!("kube-apiserver {ready}/{desired} replicas ready");
        let svc = self.api_service(shoot).await?;
        let url = match self.reachable_url(shoot, svc.as_ref()) {
            Ok(url) => url,
            Err(why) => {
                return Ok(Health {
                    ready: false,
                    detail: format!("{replicas}; /readyz not reachable: {why}"),
                })
            }
        };
        let Some(data) = self.read_pki_secret(shoot).await? else {
            return Ok(Health {
                ready: false,
                detail: format!("{replicas}; Secret {PKI_SECRET} is missing, so there is no admin certificate to ask /readyz with"),
            });
        };
        // An admin kubeconfig for the reachable address, from the Secret's PKI
        // (in a temp dir of this check's own: checks run concurrently).
        let shoot_dir = self.shoot_layout(shoot).dir;
        create_private_dir(&shoot_dir)?;
        let temp = tempfile::Builder::new()
            .prefix(".admin-pki")
            .tempdir_in(&shoot_dir)
            .map_err(SeedError::io(&shoot_dir))?;
        let dir = temp.path().to_path_buf();
        for (name, bytes) in data
            .iter()
            .filter(|(n, _)| ["ca.crt", "admin.crt", "admin.key"].contains(&n.as_str()))
        {
            crate::pki::write_scratch(&dir.join(name), bytes)?;
        }
        let pki = Pki::new(&dir);
        let path = self.admin_kubeconfig(shoot);
        kubeconfig::write(
            &path,
            shoot,
            "admin",
            &url,
            &pki,
            &pki.leaf(crate::pki::Leaf::Admin),
        )?;
        let health = kubeconfig::readyz(shoot, &path).await;
        let stable = match &health {
            Ok(h) if h.ready => self.stable_health(shoot, &anchor, &url, &pki).await,
            _ => Ok(None),
        };
        drop(temp);
        let health = health?;
        Ok(match stable? {
            _ if !health.ready => Health {
                ready: false,
                detail: format!("{replicas}; /readyz at {url}: {}", health.detail),
            },
            Some(stable) => Health {
                ready: stable.ready,
                detail: format!("{}; {}", health.detail, stable.detail),
            },
            None => health,
        })
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

    #[test]
    fn serving_certificates_get_in_cluster_names_and_stay_stable() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path());
        let spec = ControlPlaneSpec::new("alpha");
        pki.ensure("alpha", &spec.endpoint).unwrap();
        let dns = render::etcd_dns_names("shoot--demo--alpha");
        let leaf = LeafSpec {
            common_name: "etcd-server",
            organizations: &[],
            ips: vec![
                IpAddr::V4(spec.endpoint.address),
                IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            ],
            dns_names: dns.clone(),
            server: true,
            client: true,
        };
        ensure_serving(&pki, "etcd-server", &leaf).unwrap();
        let first = std::fs::read(dir.path().join("etcd-server.crt")).unwrap();
        let (names, _) = sans(&first).unwrap();
        assert!(dns.iter().all(|d| names.contains(d)), "{names:?}");
        // Pki::ensure accepts it (same CA, covers the endpoint), and a second pass keeps it.
        pki.ensure("alpha", &spec.endpoint).unwrap();
        ensure_serving(&pki, "etcd-server", &leaf).unwrap();
        assert_eq!(
            first,
            std::fs::read(dir.path().join("etcd-server.crt")).unwrap()
        );
    }
}
