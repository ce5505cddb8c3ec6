//! What runs next to a control plane's pods when a ring hosts it (pure; golden-tested):
//! `ring-agent` from the etcd and kube-apiserver images.
//!
//! - **Lease guard**: etcd and kube-apiserver run as children of `ring-agent
//!   guard`, which reads the Lease [`LEASE`] that ringd renews and stops its
//!   child at the lease's fence time, whether ringd is alive, killed or stopped;
//!   it starts the child again once the lease is renewed.
//! - **Restore**: an init container of etcd restores the data from the ring's
//!   bucket when the ConfigMap [`RESTORE_CONFIGMAP`] asks for it (a failover
//!   onto this seed), and records its report there.
//! - **Backup**: a sidecar of etcd takes full and delta snapshots into the
//!   ring's bucket while the lease is valid, and records its progress in the
//!   ConfigMap [`BACKUP_STATUS`]; it keeps running when ringd restarts.
//! - **Handover**: when the ConfigMap [`HANDOVER_CONFIGMAP`] asks for it (a
//!   planned migration off this seed, writers stopped), the same sidecar takes
//!   the final full snapshot into the bucket and records a [`HandoverRecord`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine;
use serde_json::{json, Value};

/// The Lease ringd renews for the control plane (holder, epoch, fence time).
pub const LEASE: &str = "ring-lease";
/// Annotation on the Lease: the ring epoch the holder serves at.
pub const EPOCH_ANNOTATION: &str = "ring.gardener.cloud/epoch";
/// Annotation on the Lease: unix ms after which nothing may serve (the guard
/// stops its child then; ringd writes the ring lease's end minus its fencing margin).
pub const FENCE_AT_ANNOTATION: &str = "ring.gardener.cloud/fence-at-ms";
/// Annotation on the Lease: how long the fence time was from when ringd
/// wrote it (ms, by ringd's clock). Guards count it from their own
/// observation of the renewal, so a skewed clock on ringd's host cannot make
/// them serve longer.
pub const VALID_FOR_ANNOTATION: &str = "ring.gardener.cloud/valid-for-ms";
/// The service account of the guarded pods.
pub const SERVICE_ACCOUNT: &str = "ring-control-plane";
/// ConfigMap asking etcd's init container to restore (`operation`) and holding its report.
pub const RESTORE_CONFIGMAP: &str = "etcd-restore";
/// ConfigMap asking etcd's sidecar for a migration's final snapshot
/// (`operation`) and holding its [`HandoverRecord`] (`taken`).
pub const HANDOVER_CONFIGMAP: &str = "etcd-handover";
/// ConfigMap where the backup sidecar records its progress.
pub const BACKUP_STATUS: &str = "backup-status";
/// Secret with the backup sidecar's config (and the bucket's key).
pub const BACKUP_SECRET: &str = "ring-backup";
/// Where `ring-agent` is in the etcd and kube-apiserver images.
pub const AGENT: &str = "/usr/local/bin/ring-agent";
/// Where the backup Secret is mounted.
pub const BACKUP_MOUNT: &str = "/etc/ring/backup";
/// The backup config's file name in the Secret (a `kind: Backup` document).
pub const BACKUP_CONFIG: &str = "backup.yaml";
/// The shoot named in that shared config: the agent takes the real one from `--shoot`.
pub const SHOOT_FROM_FLAG: &str = "set-by-agent";

/// The backup of a control plane that runs as pods: what the sidecar and the
/// restore init container are given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodBackup {
    /// Files of the backup Secret: [`BACKUP_CONFIG`] and, when the bucket is
    /// sealed, the key file the config names.
    pub files: BTreeMap<String, Vec<u8>>,
    /// A `file://` bucket's directory, mounted from the node at the same path
    /// (only for nodes that see the same filesystem, as Ring's own nodes do).
    pub host_dir: Option<PathBuf>,
}

/// How a ring wires its control planes' pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wiring {
    /// etcd and kube-apiserver run under the lease guard.
    pub guard: bool,
    /// The backup sidecar and the restore init container, with their config.
    pub backup: Option<PodBackup>,
}

impl Wiring {
    /// Whether the pods talk to the seed cluster's API (guard or backup).
    pub fn uses_api(&self) -> bool {
        self.guard || self.backup.is_some()
    }
}

/// `POD_NAMESPACE` and `POD_NAME` from the downward API.
fn pod_env() -> Value {
    json!([
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ])
}

/// Where a guard finds the node's lease directory (`leaseFromNode`).
pub const LEASE_MOUNT: &str = "/var/run/ring-lease";

/// Runs `container`'s command under the lease guard. The guard reads the
/// Lease in the pod's namespace, or with `from_node` the lease file ringd
/// writes on the node, mounted at [`LEASE_MOUNT`] (the pod needs
/// [`lease_volume`]), restarting its child when the lease is renewed again.
/// With `wait_for` (`HOST:PORT`) the guard starts its child only once that
/// address accepts a connection.
pub fn guarded(
    mut container: Value,
    from_node: bool,
    wait_for: Option<&str>,
    etcd_data: Option<&str>,
) -> Value {
    let mut command = vec![json!(AGENT), json!("guard")];
    if from_node {
        command.extend([
            json!("--lease-file"),
            json!(lease_file_in_pod()),
            json!("--restart"),
        ]);
        let mut mounts = container["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        mounts.push(lease_mount());
        container["volumeMounts"] = json!(mounts);
    }
    if let Some(addr) = wait_for {
        command.extend([json!("--wait-for"), json!(addr)]);
    }
    if let Some(dir) = etcd_data {
        command.extend([json!("--etcd-data"), json!(dir)]);
    }
    command.push(json!("--"));
    if let Some(c) = container["command"].as_array() {
        command.extend(c.iter().cloned());
    }
    container["command"] = json!(command);
    let mut env = container["env"].as_array().cloned().unwrap_or_default();
    for e in pod_env().as_array().into_iter().flatten() {
        if !env.iter().any(|x| x["name"] == e["name"]) {
            env.push(e.clone());
        }
    }
    container["env"] = json!(env);
    container
}

/// The lease file's path inside a pod with [`lease_volume`].
fn lease_file_in_pod() -> String {
    format!("{LEASE_MOUNT}/{}", crate::lease_file::FILE_NAME)
}

fn lease_mount() -> Value {
    json!({"name": "ring-lease", "mountPath": LEASE_MOUNT, "readOnly": true})
}

/// The node's lease directory `dir` of a shoot, for a guard reading it (see [`guarded`]).
pub fn lease_volume(dir: &std::path::Path) -> Value {
    json!({"name": "ring-lease", "hostPath": {"path": dir, "type": "Directory"}})
}

/// Mounts of the backup Secret (and a file bucket's directory).
fn backup_mounts(backup: &PodBackup, data: &str) -> Value {
    let mut mounts = vec![
        json!({"name": "backup", "mountPath": BACKUP_MOUNT, "readOnly": true}),
        json!({"name": "data", "mountPath": data}),
        json!({"name": "pki", "mountPath": "/etc/ring/pki", "readOnly": true}),
    ];
    if let Some(dir) = &backup.host_dir {
        mounts.push(json!({"name": "bucket", "mountPath": dir}));
    }
    json!(mounts)
}

/// Volumes the backup containers add to etcd's pod.
pub fn backup_volumes(backup: &PodBackup) -> Vec<Value> {
    let mut volumes = vec![json!({
        "name": "backup",
        "secret": {"secretName": BACKUP_SECRET, "defaultMode": 0o400},
    })];
    if let Some(dir) = &backup.host_dir {
        volumes.push(json!({
            "name": "bucket",
            "hostPath": {"path": dir, "type": "DirectoryOrCreate"},
        }));
    }
    volumes
}

/// The agent's containers in etcd's pod: one shoot, image and data mount.
pub struct EtcdAgent<'a> {
    pub backup: &'a PodBackup,
    pub shoot: &'a str,
    pub image: &'a str,
    pub pull: &'a str,
    /// Where etcd's volume is mounted.
    pub data: &'a str,
    /// The sidecar reads the lease file on the node (`leaseFromNode`; the pod
    /// has [`lease_volume`]) instead of the Lease through the seed's API.
    pub lease_from_node: bool,
}

impl EtcdAgent<'_> {
    /// A container running `ring-agent <subcommand>` on the shoot's backup config.
    fn container(&self, subcommand: &str, args: Vec<String>) -> Value {
        let mut command = vec![
            AGENT.to_string(),
            subcommand.to_string(),
            "--backup-config".into(),
            format!("{BACKUP_MOUNT}/{BACKUP_CONFIG}"),
            "--shoot".into(),
            self.shoot.to_string(),
        ];
        command.extend(args);
        json!({
            "name": subcommand,
            "image": self.image,
            "imagePullPolicy": self.pull,
            "command": command,
            "env": pod_env(),
            "volumeMounts": backup_mounts(self.backup, self.data),
        })
    }

    /// etcd's init container: restores from the bucket when asked to.
    pub fn restore(&self, peer_url: &str, token: &str) -> Value {
        let data_dir = format!("{}/data", self.data);
        let args = [
            "--data-dir",
            &data_dir,
            "--member",
            "$(POD_NAME)",
            "--peer-url",
            peer_url,
            "--cluster-token",
            token,
        ];
        let mut c = self.container("restore", args.map(String::from).to_vec());
        c["terminationMessagePolicy"] = json!("FallbackToLogsOnError");
        c
    }

    /// etcd's backup sidecar.
    pub fn backup(&self) -> Value {
        let spool = format!("{}/backup-spool", self.data);
        let mut args = vec!["--spool-dir".into(), spool];
        if self.lease_from_node {
            args.extend(["--lease-file".into(), lease_file_in_pod()]);
        }
        let mut c = self.container("backup", args);
        if self.lease_from_node {
            if let Some(m) = c["volumeMounts"].as_array_mut() {
                m.push(lease_mount());
            }
        }
        c["resources"] = json!({"requests": {"cpu": "50m", "memory": "64Mi"}});
        c
    }
}

/// The objects the wiring adds to a shoot's namespace (`meta(name)` gives each
/// its metadata): service account, its Role and binding, the ConfigMaps the
/// agent reads and writes, and the backup Secret.
pub fn objects(wiring: &Wiring, meta: &dyn Fn(&str) -> Value) -> Vec<Value> {
    if !wiring.uses_api() {
        return Vec::new();
    }
    let mut out = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(SERVICE_ACCOUNT)}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(SERVICE_ACCOUNT),
            "rules": agent_rules(),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(SERVICE_ACCOUNT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SERVICE_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT}],
        }),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(RESTORE_CONFIGMAP)}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(BACKUP_STATUS)}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(HANDOVER_CONFIGMAP)}),
    ];
    if let Some(b) = &wiring.backup {
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: BTreeMap<&str, String> = b
            .files
            .iter()
            .map(|(k, v)| (k.as_str(), b64.encode(v)))
            .collect();
        out.push(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta(BACKUP_SECRET),
            "type": "Opaque",
            "data": data,
        }));
    }
    out
}

/// What the agent may do: read its lease, read and write its three ConfigMaps.
pub fn agent_rules() -> Value {
    json!([
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEASE], "verbs": ["get", "watch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [RESTORE_CONFIGMAP, BACKUP_STATUS, HANDOVER_CONFIGMAP], "verbs": ["get", "patch"]},
    ])
}

/// The final snapshot etcd's sidecar took for a planned migration off the
/// seed: a regular full snapshot in the ring's bucket at etcd's final
/// revision (the writers were stopped), with what the target verifies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HandoverRecord {
    /// The migration's operation id.
    pub operation: u64,
    /// The full snapshot's object name under the shoot's prefix.
    pub full: String,
    /// etcd's final revision.
    pub revision: i64,
    /// etcd's `HashKV` at that revision.
    pub hash_kv: u32,
    /// Objects per resource type at that revision.
    pub objects: BTreeMap<String, u64>,
    /// Database bytes.
    pub db_bytes: u64,
}

/// What ringd records on the Lease at each renewal of the ring's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The member serving the control plane.
    pub holder: String,
    /// The placement's epoch.
    pub epoch: u64,
    /// Unix ms after which nothing may serve (0: fenced now).
    pub fence_at_ms: u64,
    /// The ring lease's length.
    pub duration_secs: u64,
}

/// The Lease ringd writes for `record` at `now_ms` (its clock).
pub fn lease(meta: Value, record: &LeaseRecord, now_ms: u64) -> Value {
    let mut meta = meta;
    meta["annotations"] = json!({
        EPOCH_ANNOTATION: record.epoch.to_string(),
        FENCE_AT_ANNOTATION: record.fence_at_ms.to_string(),
        VALID_FOR_ANNOTATION: record.fence_at_ms.saturating_sub(now_ms).to_string(),
    });
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": record.holder,
            "leaseDurationSeconds": record.duration_secs.max(1),
        },
    })
}

/// The epoch recorded on a Lease (0 when absent or unreadable: none).
pub fn epoch(annotations: Option<&BTreeMap<String, String>>) -> u64 {
    annotations
        .and_then(|a| a.get(EPOCH_ANNOTATION))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The validity recorded on a Lease (`None` when absent: an older Ring's).
pub fn valid_for_ms(annotations: Option<&BTreeMap<String, String>>) -> Option<u64> {
    annotations
        .and_then(|a| a.get(VALID_FOR_ANNOTATION))
        .and_then(|v| v.trim().parse().ok())
}

/// The fence time recorded on a Lease, if any (0 when absent or unreadable: fenced).
pub fn fence_at_ms(annotations: Option<&BTreeMap<String, String>>) -> u64 {
    annotations
        .and_then(|a| a.get(FENCE_AT_ANNOTATION))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarded_runs_the_command_under_the_agent_and_keeps_env() {
        let c = guarded(
            json!({"command": ["etcd"], "env": [{"name": "POD_NAME", "value": "x"}]}),
            false,
            None,
            None,
        );
        assert_eq!(c["command"], json!([AGENT, "guard", "--", "etcd"]));
        let names: Vec<_> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].clone())
            .collect();
        assert_eq!(names, vec![json!("POD_NAME"), json!("POD_NAMESPACE")]);
    }

    #[test]
    fn fence_time_is_zero_unless_recorded() {
        assert_eq!(fence_at_ms(None), 0);
        let mut a = BTreeMap::new();
        a.insert(FENCE_AT_ANNOTATION.to_string(), "garbage".to_string());
        assert_eq!(fence_at_ms(Some(&a)), 0);
        a.insert(FENCE_AT_ANNOTATION.to_string(), "1234".to_string());
        assert_eq!(fence_at_ms(Some(&a)), 1234);
    }

    #[test]
    fn no_objects_without_guard_or_backup() {
        assert!(objects(&Wiring::default(), &|n| json!({ "name": n })).is_empty());
        let w = Wiring {
            guard: true,
            backup: None,
        };
        let kinds: Vec<_> = objects(&w, &|n| json!({ "name": n }))
            .iter()
            .map(|o| o["kind"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ConfigMap",
                "ConfigMap",
                "ConfigMap"
            ]
        );
    }
}
