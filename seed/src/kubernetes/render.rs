//! A shoot's control plane as Kubernetes objects (pure; golden-tested).
//!
//! Everything lives in the namespace `shoot--<ring>--<shoot>` and, except the
//! anchor ConfigMap `ring-control-plane` itself, is owned by that anchor, so
//! deleting the anchor lets the garbage collector remove the control plane.
//! Only GA API versions are used (v1, apps/v1, policy/v1,
//! rbac.authorization.k8s.io/v1), served by every seed cluster Ring supports
//! (`seed::kubernetes::MIN_SEED_VERSION`).

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{json, Value};

use super::agent::{self, Wiring};
use super::{KubernetesSeedConfig, ServiceType};
use crate::pki::SERVICE_CIDR;
use crate::process::Component;
use crate::ControlPlaneSpec;

/// A shoot's PKI files by name (the PKI Secret's data).
type Files = BTreeMap<String, Vec<u8>>;

/// Name of the anchor ConfigMap that owns every other object of a control plane.
pub const ANCHOR: &str = "ring-control-plane";
/// Name of the Secret with the shoot's PKI and component kubeconfigs.
pub const PKI_SECRET: &str = "ring-pki";
/// Name of etcd's StatefulSet (and its headless Service).
pub const ETCD: &str = "etcd";
/// Name of the Service clients reach etcd through (backups, kube-apiserver).
pub const ETCD_CLIENT_SERVICE: &str = "etcd-client";
/// Name of the kube-apiserver Service and Deployment.
pub const APISERVER: &str = "kube-apiserver";
/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "ringd";
/// Label naming the component of a workload and its pods.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/name";
/// Label naming the shoot.
pub const SHOOT_LABEL: &str = "ring.gardener.cloud/shoot";
/// Label every object Ring manages carries (`ringd`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

const PKI_MOUNT: &str = "/etc/ring/pki";
const ETCD_DATA: &str = "/var/lib/etcd";
/// etcd's data directory under [`Renderer::node_dir`].
pub const NODE_ETCD: &str = "etcd";

/// The pod-template annotation holding the SHA-256 of the kubeconfig a
/// component's pods read (kube-controller-manager, kube-scheduler): a
/// renewed certificate embedded in it changes the template, so the
/// Deployment replaces the pods, whoever applies or patches it.
pub const KUBECONFIG_HASH: &str = "ring.gardener.cloud/kubeconfig-sha256";

/// The [`KUBECONFIG_HASH`] of `component` for the PKI files `pki`.
pub fn kubeconfig_hash(pki: &Files, component: Component) -> String {
    use sha2::Digest;
    let file = pki.get(&format!("{}.kubeconfig", component.name()));
    format!(
        "{:x}",
        sha2::Sha256::digest(file.map_or(&[][..], Vec::as_slice))
    )
}

/// The namespace holding a shoot's control plane on a seed cluster.
pub fn namespace(ring: &str, shoot: &str) -> String {
    format!("shoot--{ring}--{shoot}")
}

/// The object that owns all others (identified by its uid once it exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub uid: String,
}

/// The DNS names of the in-cluster Services, as put into serving certificates.
pub fn service_dns_names(ns: &str, service: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{ns}"),
        format!("{service}.{ns}.svc"),
        format!("{service}.{ns}.svc.cluster.local"),
    ]
}

/// DNS names etcd's server and peer certificates must carry.
pub fn etcd_dns_names(ns: &str) -> Vec<String> {
    let mut names = service_dns_names(ns, ETCD_CLIENT_SERVICE);
    names.push(format!("{ETCD}-0.{ETCD}.{ns}.svc"));
    names.push(format!("{ETCD}-0.{ETCD}.{ns}.svc.cluster.local"));
    names.push("localhost".into());
    names
}

/// Labels of every object of the shoot's control plane.
fn labels(ring: &str, shoot: &str, component: Option<&str>) -> Value {
    let mut l = json!({
        MANAGED_BY_LABEL: FIELD_MANAGER,
        "app.kubernetes.io/part-of": "ring",
        "ring.gardener.cloud/ring": ring,
        SHOOT_LABEL: shoot,
    });
    if let Some(c) = component {
        l[COMPONENT_LABEL] = json!(c);
    }
    l
}

fn selector(shoot: &str, component: &str) -> Value {
    json!({ COMPONENT_LABEL: component, SHOOT_LABEL: shoot })
}

/// Renders the objects of one control plane.
pub struct Renderer<'a> {
    pub ring: &'a str,
    pub spec: &'a ControlPlaneSpec,
    pub config: &'a KubernetesSeedConfig,
    /// The lease guard and backup containers a ring adds.
    pub wiring: &'a Wiring,
    /// With `leaseFromNode`, the node's directory of the shoot's pods: the
    /// guards and the backup sidecar read the lease file there instead of the
    /// Lease, and etcd keeps its data in its [`NODE_ETCD`] subdirectory
    /// instead of a volume claim (both hostPath of type Directory, which ringd
    /// creates: pods of an earlier stay never start on another seed's files).
    pub node_dir: Option<std::path::PathBuf>,
    /// Whether kube-apiserver serves the deprecated beta API versions.
    pub apis: crate::DeprecatedApis,
}

impl Renderer<'_> {
    fn ns(&self) -> String {
        namespace(self.ring, &self.spec.shoot)
    }

    fn meta(&self, name: &str, component: Option<&str>, owner: &Owner) -> Value {
        json!({
            "name": name,
            "namespace": self.ns(),
            "labels": labels(self.ring, &self.spec.shoot, component),
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": owner.name,
                "uid": owner.uid,
                "controller": true,
            }],
        })
    }

    /// The shoot's namespace.
    pub fn namespace(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": self.ns(),
                "labels": labels(self.ring, &self.spec.shoot, None),
            },
        })
    }

    /// The anchor ConfigMap: records the spec and owns everything else.
    pub fn anchor(&self) -> Value {
        let spec = serde_json::to_string(self.spec).unwrap_or_default();
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": ANCHOR,
                "namespace": self.ns(),
                "labels": labels(self.ring, &self.spec.shoot, None),
            },
            "data": { "ring": self.ring, "shoot": self.spec.shoot, "spec.json": spec },
        })
    }

    /// Every object but the namespace and the anchor: what the workloads
    /// need, then the workloads ([`is_workload`]; applied after the rest).
    pub fn objects(&self, owner: &Owner, pki: &BTreeMap<String, Vec<u8>>) -> Vec<Value> {
        let mut out = agent::objects(self.wiring, &|name| self.meta(name, None, owner));
        out.extend([
            self.pki_secret(owner, pki),
            self.etcd_headless_service(owner),
            self.etcd_client_service(owner),
            self.apiserver_service(owner),
            self.etcd_pdb(owner),
            self.etcd(owner),
            self.apiserver(owner),
            self.controller_manager(owner, pki),
            self.scheduler(owner, pki),
        ]);
        out
    }

    /// The Lease ringd renews (owned by the anchor like everything else), as
    /// written at `now_ms`.
    pub fn lease(&self, owner: &Owner, record: &agent::LeaseRecord, now_ms: u64) -> Value {
        agent::lease(self.meta(agent::LEASE, None, owner), record, now_ms)
    }

    pub(crate) fn pki_secret(&self, owner: &Owner, pki: &BTreeMap<String, Vec<u8>>) -> Value {
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: BTreeMap<&str, String> = pki
            .iter()
            .map(|(k, v)| (k.as_str(), b64.encode(v)))
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": self.meta(PKI_SECRET, None, owner),
            "type": "Opaque",
            "data": data,
        })
    }

    fn service(&self, owner: &Owner, name: &str, component: &str, spec: Value) -> Value {
        let mut spec = spec;
        spec["selector"] = selector(&self.spec.shoot, component);
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(name, Some(component), owner),
            "spec": spec,
        })
    }

    fn etcd_headless_service(&self, owner: &Owner) -> Value {
        self.service(
            owner,
            ETCD,
            ETCD,
            json!({
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "ports": [{"name": "peer", "port": 2380, "targetPort": 2380, "protocol": "TCP"}],
            }),
        )
    }

    fn etcd_client_service(&self, owner: &Owner) -> Value {
        self.service(
            owner,
            ETCD_CLIENT_SERVICE,
            ETCD,
            // routed as soon as etcd's pod has an address, not only once its
            // readiness probe passed and the endpoint reached kube-proxy
            // (1-2 s later): kube-apiserver's guard waits for this Service to
            // accept a connection, which it then does the moment etcd binds
            // its port (etcd finishes the TLS handshake once it serves). One
            // replica: there is no other endpoint to prefer.
            json!({
                "type": "ClusterIP",
                "publishNotReadyAddresses": true,
                "ports": [{"name": "client", "port": 2379, "targetPort": 2379, "protocol": "TCP"}],
            }),
        )
    }

    fn apiserver_service(&self, owner: &Owner) -> Value {
        let port = self.spec.endpoint.api_port;
        self.service(
            owner,
            APISERVER,
            APISERVER,
            // routed as soon as kube-apiserver's pod has an address, not only
            // once its readiness probe passed and that reached kube-proxy
            // (1-3 s later, on every failover and move): one replica, so
            // there is no ready endpoint to prefer, and a kube-apiserver that
            // does not listen yet refuses the connection as before. Between
            // listening and ready it serves (its post-start hooks run; for a
            // fraction of a second, until its informers synced, it may answer
            // 403 to all but system:masters).
            json!({
                "type": self.config.service_type.as_str(),
                "publishNotReadyAddresses": true,
                "ports": [{"name": "https", "port": port, "targetPort": 6443, "protocol": "TCP"}],
            }),
        )
    }

    /// etcd's PodDisruptionBudget.
    fn etcd_pdb(&self, owner: &Owner) -> Value {
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.meta(ETCD, Some(ETCD), owner),
            // Voluntary disruptions (node drains) may take at most one etcd member at a time.
            "spec": { "maxUnavailable": 1, "selector": {"matchLabels": selector(&self.spec.shoot, ETCD)} },
        })
    }

    /// A pod template: one container, the PKI secret mounted with only `items`.
    fn pod(&self, component: Component, container: Value, items: &[&str]) -> Value {
        let items: Vec<Value> = items.iter().map(|k| json!({"key": k, "path": k})).collect();
        let mut mounts = vec![json!({"name": "pki", "mountPath": PKI_MOUNT, "readOnly": true})];
        let mut volumes = vec![json!({
            "name": "pki",
            "secret": {"secretName": PKI_SECRET, "items": items, "defaultMode": 0o400},
        })];
        if component == Component::Etcd {
            mounts.push(json!({"name": "data", "mountPath": ETCD_DATA}));
            if let Some(dir) = &self.node_dir {
                let path = dir.join(NODE_ETCD);
                volumes
                    .push(json!({"name": "data", "hostPath": {"path": path, "type": "Directory"}}));
            }
        } else {
            mounts.push(json!({"name": "run", "mountPath": "/var/run/ring"}));
            volumes.push(json!({"name": "run", "emptyDir": {}}));
        }
        let mut container = container;
        container["name"] = json!(component.name());
        container["imagePullPolicy"] = json!(self.config.images.pull_policy.as_str());
        container["volumeMounts"] = json!(mounts);
        let guarded =
            self.wiring.guard && matches!(component, Component::Etcd | Component::KubeApiserver);
        if guarded {
            // kube-apiserver started before its etcd answers can take tens
            // of seconds more to serve once it does (seen in self-hosted
            // failovers): its guard waits for etcd's client Service
            let etcd = format!("{ETCD_CLIENT_SERVICE}.{}.svc:2379", self.ns());
            let wait_for = (component == Component::KubeApiserver).then_some(etcd.as_str());
            // etcd fenced within its first second or two (a slow lease
            // under load) may not have committed its membership yet: its
            // guard moves such a data dir aside instead of restarting etcd
            // on it for ever without a leader
            let data = format!("{ETCD_DATA}/data");
            let etcd_data = (component == Component::Etcd).then_some(data.as_str());
            container = agent::guarded(container, self.node_dir.is_some(), wait_for, etcd_data);
        }
        // ring-agent (guard, or etcd's backup sidecar) reads its lease
        let agent = guarded || (component == Component::Etcd && self.wiring.backup.is_some());
        if let Some(dir) = self.node_dir.as_ref().filter(|_| agent) {
            volumes.push(agent::lease_volume(dir));
        }
        let mut pod = json!({
            "metadata": {"labels": labels(self.ring, &self.spec.shoot, Some(component.name()))},
            "spec": {
                // The control plane itself never talks to the seed cluster's API.
                "automountServiceAccountToken": false,
                "containers": [container],
                "volumes": volumes,
            },
        });
        if let Some(node) = &self.config.node_name {
            // bound to the node holding its files: no scheduler involved
            pod["spec"]["nodeName"] = json!(node);
        }
        if agent {
            // ring-agent reads its lease and writes its ConfigMaps
            pod["spec"]["automountServiceAccountToken"] = json!(true);
            pod["spec"]["serviceAccountName"] = json!(agent::SERVICE_ACCOUNT);
        }
        pod
    }

    /// Adds the restore init container and the backup sidecar to etcd's pod.
    fn with_backup(&self, mut pod: Value) -> Value {
        let Some(backup) = &self.wiring.backup else {
            return pod;
        };
        let (image, pull) = (
            &self.config.images.etcd,
            self.config.images.pull_policy.as_str(),
        );
        let peer = format!("https://$(POD_NAME).{ETCD}.{}.svc:2380", self.ns());
        let token = format!("ring-{}", self.spec.shoot);
        let agent = agent::EtcdAgent {
            backup,
            shoot: &self.spec.shoot,
            image,
            pull,
            data: ETCD_DATA,
            lease_from_node: self.node_dir.is_some(),
        };
        pod["spec"]["initContainers"] = json!([agent.restore(&peer, &token)]);
        if let Some(c) = pod["spec"]["containers"].as_array_mut() {
            c.push(agent.backup());
        }
        if let Some(v) = pod["spec"]["volumes"].as_array_mut() {
            v.extend(agent::backup_volumes(backup));
        }
        pod
    }

    fn deployment(&self, owner: &Owner, component: Component, template: Value) -> Value {
        let name = component.name();
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.meta(name, Some(name), owner),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector(&self.spec.shoot, name)},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": template,
            },
        })
    }

    fn etcd(&self, owner: &Owner) -> Value {
        let ns = self.ns();
        let pki = |f: &str| format!("{PKI_MOUNT}/{f}");
        let peer = |pod: &str| format!("https://{pod}.{ETCD}.{ns}.svc:2380");
        let args = vec![
            "--name=$(POD_NAME)".to_string(),
            format!("--data-dir={ETCD_DATA}/data"),
            "--listen-client-urls=https://0.0.0.0:2379".into(),
            format!("--advertise-client-urls=https://{ETCD_CLIENT_SERVICE}.{ns}.svc:2379"),
            "--listen-peer-urls=https://0.0.0.0:2380".into(),
            format!("--initial-advertise-peer-urls={}", peer("$(POD_NAME)")),
            format!("--initial-cluster={ETCD}-0={}", peer(&format!("{ETCD}-0"))),
            format!("--initial-cluster-token=ring-{}", self.spec.shoot),
            "--initial-cluster-state=new".into(),
            "--listen-metrics-urls=http://0.0.0.0:2381".into(),
            format!("--cert-file={}", pki("etcd-server.crt")),
            format!("--key-file={}", pki("etcd-server.key")),
            "--client-cert-auth=true".into(),
            format!("--trusted-ca-file={}", pki("ca.crt")),
            format!("--peer-cert-file={}", pki("etcd-peer.crt")),
            format!("--peer-key-file={}", pki("etcd-peer.key")),
            "--peer-client-cert-auth=true".into(),
            format!("--peer-trusted-ca-file={}", pki("ca.crt")),
            "--logger=zap".into(),
        ];
        let container = json!({
            "image": self.config.images.etcd,
            "command": ["etcd"],
            "args": args,
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "ports": [
                {"name": "client", "containerPort": 2379},
                {"name": "peer", "containerPort": 2380},
                {"name": "metrics", "containerPort": 2381},
            ],
            // every second: the pod's Ready condition (status, the
            // PodDisruptionBudget) follows etcd's health closely
            "readinessProbe": {"httpGet": {"path": "/health", "port": 2381}, "periodSeconds": 1},
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        });
        let mut items = vec![
            "ca.crt",
            "etcd-server.crt",
            "etcd-server.key",
            "etcd-peer.crt",
            "etcd-peer.key",
        ];
        if self.wiring.backup.is_some() {
            // the backup sidecar is etcd's client
            items.extend(["etcd-client.crt", "etcd-client.key"]);
        }
        let mut set = json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": self.meta(ETCD, Some(ETCD), owner),
            "spec": {
                "replicas": 1,
                "serviceName": ETCD,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": selector(&self.spec.shoot, ETCD)},
                "template": self.with_backup(self.pod(Component::Etcd, container, &items)),
            },
        });
        // with `leaseFromNode` etcd's data is on the node (see `pod`)
        if self.node_dir.is_none() {
            set["spec"]["volumeClaimTemplates"] = json!([self.etcd_claim()]);
        }
        set
    }

    /// The claim of etcd's data volume.
    fn etcd_claim(&self) -> Value {
        let mut claim = json!({
            "metadata": {"name": "data", "labels": labels(self.ring, &self.spec.shoot, Some(ETCD))},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": self.config.etcd_storage}},
            },
        });
        if let Some(class) = &self.config.storage_class {
            claim["spec"]["storageClassName"] = json!(class);
        }
        claim
    }

    fn apiserver(&self, owner: &Owner) -> Value {
        let ns = self.ns();
        let pki = |f: &str| format!("{PKI_MOUNT}/{f}");
        let mut args = vec![
            "--advertise-address=$(POD_IP)".to_string(),
            "--bind-address=0.0.0.0".into(),
            "--secure-port=6443".into(),
            format!("--etcd-servers=https://{ETCD_CLIENT_SERVICE}.{ns}.svc:2379"),
            format!("--etcd-cafile={}", pki("ca.crt")),
            format!("--etcd-certfile={}", pki("etcd-client.crt")),
            format!("--etcd-keyfile={}", pki("etcd-client.key")),
            format!("--client-ca-file={}", pki("ca.crt")),
            format!("--tls-cert-file={}", pki("kube-apiserver.crt")),
            format!("--tls-private-key-file={}", pki("kube-apiserver.key")),
            // a shoot's own nodes register with certificates of group
            // system:nodes; the Node authorizer and NodeRestriction keep each
            // one to its own objects (as on a local seed)
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!(
                "--kubelet-client-certificate={}",
                pki("kube-apiserver-kubelet-client.crt")
            ),
            format!(
                "--kubelet-client-key={}",
                pki("kube-apiserver-kubelet-client.key")
            ),
            "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP".into(),
            format!("--service-account-key-file={}", pki("service-account.pub")),
            format!(
                "--service-account-signing-key-file={}",
                pki("service-account.key")
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--cert-dir=/var/run/ring".into(),
            "--v=1".into(),
        ];
        args.extend(self.apis.apiserver_args());
        // every second: the NodePort forwards to the API only once it is Ready,
        // so the probe's period is part of every start's (and failover's) time
        let probe = |path: &str| json!({"httpGet": {"path": path, "port": 6443, "scheme": "HTTPS"}, "periodSeconds": 1});
        let container = json!({
            "image": self.config.images.kube_apiserver,
            "command": ["kube-apiserver"],
            "args": args,
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "https", "containerPort": 6443}],
            "readinessProbe": probe("/readyz"),
            "livenessProbe": {
                "httpGet": {"path": "/livez", "port": 6443, "scheme": "HTTPS"},
                "initialDelaySeconds": 30,
                "periodSeconds": 10,
                "failureThreshold": 6,
            },
            "resources": {"requests": {"cpu": "250m", "memory": "384Mi"}},
        });
        let items = [
            "ca.crt",
            "etcd-client.crt",
            "etcd-client.key",
            "kube-apiserver.crt",
            "kube-apiserver.key",
            "kube-apiserver-kubelet-client.crt",
            "kube-apiserver-kubelet-client.key",
            "service-account.pub",
            "service-account.key",
        ];
        let mut pod = self.pod(Component::KubeApiserver, container, &items);
        // the kubelet kills what is left after this (see Component::stop_grace)
        pod["spec"]["terminationGracePeriodSeconds"] =
            json!(crate::process::API_STOP_GRACE.as_secs());
        self.deployment(owner, Component::KubeApiserver, pod)
    }

    /// Arguments kube-controller-manager and kube-scheduler share.
    fn common_args(component: Component, port: u16) -> Vec<String> {
        let kc = format!("{PKI_MOUNT}/{}.kubeconfig", component.name());
        crate::process::manager_args(&kc, "0.0.0.0", port, "/var/run/ring")
    }

    /// A Deployment of a component that reads `kubeconfig` from the PKI
    /// Secret, its template marked with that file's hash.
    fn manager(
        &self,
        owner: &Owner,
        c: Component,
        container: Value,
        items: &[&str],
        pki: &Files,
    ) -> Value {
        let mut pod = self.pod(c, container, items);
        pod["metadata"]["annotations"] = json!({KUBECONFIG_HASH: kubeconfig_hash(pki, c)});
        self.deployment(owner, c, pod)
    }

    fn controller_manager(&self, owner: &Owner, files: &Files) -> Value {
        let c = Component::KubeControllerManager;
        let pki = |f: &str| format!("{PKI_MOUNT}/{f}");
        let mut args = Self::common_args(c, 10257);
        args.extend([
            format!(
                "--service-account-private-key-file={}",
                pki("service-account.key")
            ),
            format!("--root-ca-file={}", pki("ca.crt")),
            format!("--cluster-signing-cert-file={}", pki("ca.crt")),
            format!("--cluster-signing-key-file={}", pki("ca.key")),
            "--use-service-account-credentials=true".into(),
        ]);
        let container = json!({
            "image": self.config.images.kube_controller_manager,
            "command": [c.name()],
            "args": args,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        });
        let kubeconfig = format!("{}.kubeconfig", c.name());
        let items = [
            "ca.crt",
            "ca.key",
            "service-account.key",
            kubeconfig.as_str(),
        ];
        self.manager(owner, c, container, &items, files)
    }

    fn scheduler(&self, owner: &Owner, pki: &Files) -> Value {
        let c = Component::KubeScheduler;
        let container = json!({
            "image": self.config.images.kube_scheduler,
            "command": [c.name()],
            "args": Self::common_args(c, 10259),
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        });
        let kubeconfig = format!("{}.kubeconfig", c.name());
        self.manager(owner, c, container, &[kubeconfig.as_str()], pki)
    }
}

/// The workload (kind, name) running a component.
pub fn workload(component: Component) -> (&'static str, &'static str) {
    match component {
        Component::Etcd => ("StatefulSet", ETCD),
        c => ("Deployment", c.name()),
    }
}

/// Whether `object` is one of the workloads running a component
/// ([`workload`]): applied only once the service account, Secrets and
/// Services its pods use exist.
pub fn is_workload(object: &Value) -> bool {
    Component::ALL.iter().any(|c| {
        let (kind, name) = workload(*c);
        object["kind"] == kind && object["metadata"]["name"] == name
    })
}

impl ServiceType {
    /// The Service `type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::LoadBalancer => "LoadBalancer",
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
        }
    }
}

/// Several objects as one multi-document YAML stream.
pub fn to_yaml(objects: &[Value]) -> String {
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(o).unwrap_or_default());
    }
    out
}

#[cfg(test)]
#[path = "render_tests.rs"]
pub(crate) mod tests;
