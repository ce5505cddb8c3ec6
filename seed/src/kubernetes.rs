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
mod config;
mod forwarder;
mod handover;
pub mod manifests;
mod records;
pub mod render;
mod shoot_pki;
mod status;
pub mod version;
pub mod volumes;

pub use agent::{LeaseRecord, PodBackup, Wiring};
pub use config::{Images, KubernetesSeedConfig, PullPolicy, ServiceType, MAX_RING_NAME};
pub use records::{etcd_pod_url, BackupProgress, RestoreRecord};

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Service};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::Api;
use serde_json::{json, Value};

use crate::error::{Result, SeedError};
use crate::local::ShootLayout;
use crate::process::Component;
use crate::{ControlPlaneSpec, ControlPlaneStatus, Health, Seed};
use render::{Owner, Renderer, ANCHOR, APISERVER, FIELD_MANAGER, SHOOT_LABEL};
use status::lb_addresses;

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
    /// Whether kube-apiservers serve the deprecated beta API versions.
    apis: crate::DeprecatedApis,
    /// Set once the seed cluster's release was found supported.
    version_checked: tokio::sync::OnceCell<()>,
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
            apis: Default::default(),
            version_checked: tokio::sync::OnceCell::new(),
        }
    }

    /// Refuses a seed cluster older than [`version::MIN_SEED_VERSION`]
    /// (once it answered; an unreachable one is asked again next time).
    pub async fn check_version(&self) -> Result<()> {
        self.version_checked
            .get_or_try_init(|| async {
                let info = self
                    .client
                    .apiserver_version()
                    .await
                    .map_err(|e| SeedError::Kube {
                        shoot: "(seed cluster)".into(),
                        message: format!("asking its version: {e}"),
                    })?;
                version::check(&info.major, &info.minor, &info.git_version)
            })
            .await
            .map(|_| ())
    }

    /// Whether kube-apiservers serve the deprecated beta API versions
    /// [default: not served].
    pub fn with_deprecated_apis(mut self, apis: crate::DeprecatedApis) -> Self {
        self.apis = apis;
        self
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
            apis: self.apis,
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

    /// Removes the shoot's control plane: deletes the anchor (the garbage collector
    /// removes every object it owns) and etcd's volume claims, i.e. all of the
    /// shoot's data on this seed. The namespace stays (it may carry ringd's RBAC).
    pub async fn delete(&self, shoot: &str) -> Result<()> {
        self.stop_relay(shoot).await;
        if let Some(f) = &self.forwarders {
            f.forget(shoot);
        }
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
        let what = format!("scaling {kind} {name} to {replicas}");
        let res = if kind == "StatefulSet" {
            let api = Api::<StatefulSet>::namespaced(self.client.clone(), &ns);
            set_replicas(&api, name, replicas).await
        } else {
            let api = Api::<Deployment>::namespaced(self.client.clone(), &ns);
            set_replicas(&api, name, replicas).await
        };
        res.map_err(self.kube_err(shoot, &what))
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
                    let desired = s.spec.replicas.unwrap_or(1);
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
                    let desired = d.spec.replicas.unwrap_or(1);
                    (
                        desired,
                        d.status.and_then(|s| s.ready_replicas).unwrap_or(0),
                    )
                })
        })
    }
}

/// Sets workload `name`'s replicas through its scale subresource; one that
/// does not exist is left alone.
async fn set_replicas<K>(api: &Api<K>, name: &str, replicas: i32) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    match api.patch_scale(name, &PatchParams::default(), &patch).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(r)) if r.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
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
        self.check_version().await?;
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
        self.status(shoot).await
    }

    async fn health(&self, shoot: &str) -> Result<Health> {
        self.api_health(shoot).await
    }

    async fn renew_certificates(&self, shoot: &str) -> Result<Vec<crate::pki::Leaf>> {
        self.renew(shoot).await
    }
}
