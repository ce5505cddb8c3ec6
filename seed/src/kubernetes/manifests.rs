//! Kubernetes manifests that run `ringd` itself in a cluster (`ringctl manifests`).
//!
//! Per member, applied to that member's own cluster (its seed):
//!
//! * a Namespace for ringd (default `ring-system`), a ServiceAccount, a
//!   ConfigMap with the member's ringd config, a Service for gRPC and metrics,
//!   and a one-replica StatefulSet with a volume for the Raft log;
//! * for every shoot the member may host, the Namespace `shoot--<ring>--<shoot>`
//!   with a Role and RoleBinding granting ringd exactly what the Kubernetes seed
//!   needs there. ringd gets no cluster-wide permission at all: it cannot create
//!   namespaces, so they are created here.
//!
//! The member's certificate is expected in the Secret `ringd-<member>-tls`
//! (keys `ca.crt`, `tls.crt`, `tls.key`), and for a ring whose bucket is sealed
//! with a key, that key in the Secret [`BUCKET_KEY_SECRET`] (key `key`); the
//! manifests never contain keys.

use serde::Serialize;
use serde_json::{json, Value};

use super::render::namespace as shoot_namespace;

/// Where ringd finds its files in the pod.
pub const CONFIG_PATH: &str = "/etc/ring/ringd.yaml";
/// The directory of the member's certificate files in the pod.
pub const TLS_DIR: &str = "/etc/ring/tls";
/// ringd's data volume in the pod.
pub const DATA_DIR: &str = "/var/lib/ring";
/// The Secret (in ringd's namespace) holding the ring's bucket key as `key`.
pub const BUCKET_KEY_SECRET: &str = "ringd-bucket-key";
/// Where ringd reads the bucket key in the pod.
pub const BUCKET_KEY_FILE: &str = "/etc/ring/bucket-key/key";

/// Settings shared by every member's manifests.
#[derive(Debug, Clone)]
pub struct Manifests {
    /// The ring's name.
    pub ring: String,
    /// Namespace ringd runs in.
    pub namespace: String,
    /// ringd's container image.
    pub image: String,
    /// Size of ringd's data volume.
    pub storage: String,
}

/// One member as rendered.
#[derive(Debug, Clone)]
pub struct Member<C> {
    pub name: String,
    /// The member's ringd config (kind: RingMember), stored in its ConfigMap.
    pub config: C,
    /// gRPC port.
    pub port: u16,
    /// Metrics port, if metrics are served.
    pub metrics_port: Option<u16>,
    /// Shoots whose control planes this member may host (gets a namespace and RBAC for each).
    pub hosts: Vec<String>,
    /// Whether ringd reads the bucket key from [`BUCKET_KEY_SECRET`] (mounted at
    /// [`BUCKET_KEY_FILE`]).
    pub bucket_key: bool,
}

/// The name of a member's objects.
pub fn object_name(member: &str) -> String {
    format!("ringd-{member}")
}

/// What the Kubernetes seed does in a shoot namespace, and nothing more.
pub fn seed_role_rules() -> Value {
    let apply = ["get", "create", "patch"];
    json!([
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["secrets", "services"], "verbs": apply},
        {"apiGroups": [""], "resources": ["pods", "persistentvolumeclaims"], "verbs": ["list", "deletecollection"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets", "deployments"], "verbs": apply},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets/scale", "deployments/scale", "replicasets/scale"], "verbs": ["patch"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": apply},
        // the lease guard and backup agent next to the pods: their account,
        // what it may do (ringd must hold those permissions itself to grant them)
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": apply},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": apply},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "patch", "watch"]},
    ])
}

impl Manifests {
    fn labels(&self, member: &str) -> Value {
        json!({
            "app.kubernetes.io/name": "ringd",
            "app.kubernetes.io/part-of": "ring",
            "ring.gardener.cloud/ring": self.ring,
            "ring.gardener.cloud/member": member,
        })
    }

    fn meta(&self, name: &str, namespace: &str, member: &str) -> Value {
        json!({"name": name, "namespace": namespace, "labels": self.labels(member)})
    }

    /// The objects of one member, in apply order (namespaces first).
    pub fn member<C: Serialize>(&self, m: &Member<C>) -> Result<Vec<Value>, String> {
        let name = object_name(&m.name);
        let ns = self.namespace.as_str();
        let config = serde_yaml::to_string(&m.config).map_err(|e| e.to_string())?;
        let mut objects = vec![json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": self.labels(&m.name)},
        })];
        for shoot in &m.hosts {
            objects.push(json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": shoot_namespace(&self.ring, shoot), "labels": self.labels(&m.name)},
            }));
        }
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": self.meta(&name, ns, &m.name),
        }));
        for shoot in &m.hosts {
            let shoot_ns = shoot_namespace(&self.ring, shoot);
            objects.push(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": self.meta("ringd-seed", &shoot_ns, &m.name),
                "rules": seed_role_rules(),
            }));
            objects.push(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": self.meta(&name, &shoot_ns, &m.name),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ringd-seed"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            }));
        }
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.meta(&name, ns, &m.name),
            "data": {"ringd.yaml": config},
        }));
        let mut ports =
            vec![json!({"name": "grpc", "port": m.port, "targetPort": m.port, "protocol": "TCP"})];
        let mut container_ports = vec![json!({"name": "grpc", "containerPort": m.port})];
        if let Some(p) = m.metrics_port {
            ports.push(json!({"name": "metrics", "port": p, "targetPort": p, "protocol": "TCP"}));
            container_ports.push(json!({"name": "metrics", "containerPort": p}));
        }
        let selector =
            json!({"app.kubernetes.io/name": "ringd", "ring.gardener.cloud/member": m.name});
        let mut mounts = vec![
            json!({"name": "config", "mountPath": CONFIG_PATH, "subPath": "ringd.yaml", "readOnly": true}),
            json!({"name": "tls", "mountPath": TLS_DIR, "readOnly": true}),
            json!({"name": "data", "mountPath": DATA_DIR}),
        ];
        let mut volumes = vec![
            json!({"name": "config", "configMap": {"name": name}}),
            json!({"name": "tls", "secret": {"secretName": format!("{name}-tls"), "defaultMode": 0o400}}),
        ];
        if m.bucket_key {
            let dir = BUCKET_KEY_FILE.rsplit_once('/').map_or("/", |(d, _)| d);
            mounts.push(json!({"name": "bucket-key", "mountPath": dir, "readOnly": true}));
            volumes.push(json!({"name": "bucket-key", "secret": {"secretName": BUCKET_KEY_SECRET, "defaultMode": 0o400}}));
        }
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(&name, ns, &m.name),
            // Members of other clusters reach this ringd through its load balancer.
            "spec": {"type": "LoadBalancer", "selector": selector, "ports": ports},
        }));
        objects.push(json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": self.meta(&name, ns, &m.name),
            "spec": {
                "replicas": 1,
                "serviceName": name,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": self.labels(&m.name)},
                    "spec": {
                        "serviceAccountName": name,
                        "containers": [{
                            "name": "ringd",
                            "image": self.image,
                            // Built and imported locally (`ringctl images`), or pulled from a registry.
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["ringd", "--config", CONFIG_PATH],
                            "ports": container_ports,
                            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                            "volumeMounts": mounts,
                        }],
                        "volumes": volumes,
                    },
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": self.storage}},
                    },
                }],
            },
        }));
        Ok(objects)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct FakeConfig {
        name: &'static str,
    }

    fn manifests() -> Manifests {
        Manifests {
            ring: "demo".into(),
            namespace: "ring-system".into(),
            image: "ringd:test".into(),
            storage: "1Gi".into(),
        }
    }

    #[test]
    fn member_manifests_match_golden_file() {
        let m = Member {
            name: "m1".into(),
            config: FakeConfig { name: "m1" },
            port: 7001,
            metrics_port: Some(9001),
            hosts: vec!["m2".into(), "m3".into()],
            bucket_key: false,
        };
        let objects = manifests().member(&m).unwrap();
        super::super::render::tests::golden(
            "ringd-member.yaml",
            &super::super::render::to_yaml(&objects),
        );
    }

    #[test]
    fn ringd_gets_no_cluster_wide_permissions() {
        let m = Member {
            name: "m1".into(),
            config: FakeConfig { name: "m1" },
            port: 7001,
            metrics_port: None,
            hosts: vec!["m2".into()],
            bucket_key: false,
        };
        let objects = manifests().member(&m).unwrap();
        for o in &objects {
            let kind = o["kind"].as_str().unwrap();
            assert!(
                !kind.starts_with("Cluster"),
                "{kind} grants cluster-wide access"
            );
            if kind == "RoleBinding" {
                assert_eq!(o["metadata"]["namespace"], "shoot--demo--m2");
            }
        }
        let rules = seed_role_rules().to_string();
        assert!(!rules.contains('*'), "{rules}");
    }

    #[test]
    fn a_bucket_key_is_mounted_from_its_secret_read_only() {
        let m = Member {
            name: "m1".into(),
            config: FakeConfig { name: "m1" },
            port: 7001,
            metrics_port: None,
            hosts: vec![],
            bucket_key: true,
        };
        let objects = manifests().member(&m).unwrap();
        let sts = objects.iter().find(|o| o["kind"] == "StatefulSet").unwrap();
        let pod = &sts["spec"]["template"]["spec"];
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "bucket-key")
            .expect("a bucket-key volume");
        assert_eq!(volume["secret"]["secretName"], BUCKET_KEY_SECRET);
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "bucket-key")
            .expect("a bucket-key mount");
        assert_eq!(mount["mountPath"], "/etc/ring/bucket-key");
        assert_eq!(mount["readOnly"], true);
        assert!(!super::super::render::to_yaml(&objects).contains("key:"));
    }
}
