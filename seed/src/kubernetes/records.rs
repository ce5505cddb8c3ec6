//! What ringd and `ring-agent` tell each other through the seed cluster's API:
//! the Lease ringd renews, the restore request and its report, the backup
//! sidecar's progress, and why a restore is not getting anywhere.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;

use super::agent::{self, LeaseRecord};
use super::render::{Owner, ANCHOR, ETCD, PKI_SECRET, SHOOT_LABEL};
use super::KubernetesSeed;
use crate::error::{Result, SeedError};
use crate::ControlPlaneSpec;

/// Field manager of ringd's restore requests (apart from the control plane's objects).
const RESTORE_MANAGER: &str = "ringd-restore";

/// The backup sidecar's progress as it recorded it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackupProgress {
    /// The newest revision stored durably in the bucket.
    pub revision: u64,
    /// When that was recorded (unix ms).
    pub at_ms: u64,
    /// The newest revision the sidecar saw etcd at, if it recorded one.
    pub etcd_revision: Option<u64>,
    /// The sidecar's last error, if its last attempt failed.
    pub error: Option<String>,
}

/// What etcd's init container recorded of a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRecord {
    /// The restore's report (JSON).
    pub report: String,
    /// Objects per resource type at the revision reached (JSON).
    pub objects: String,
    /// etcd's `HashKV` at the revision reached, computed on the restored data.
    pub hash_kv: Option<u32>,
}

impl KubernetesSeed {
    /// The anchor as owner; `None` while the control plane was never applied.
    pub(super) async fn owner(&self, shoot: &str) -> Result<Option<Owner>> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        let anchor = api
            .get_opt(ANCHOR)
            .await
            .map_err(self.kube_err(shoot, &format!("reading ConfigMap {ANCHOR}")))?;
        Ok(anchor.and_then(|a| a.metadata.uid).map(|uid| Owner {
            name: ANCHOR.into(),
            uid,
        }))
    }

    /// Records the ring lease on the Lease the guards read. Before the control
    /// plane was ever applied there is nothing to guard: `Ok(false)`.
    pub async fn write_lease(&self, shoot: &str, record: &LeaseRecord) -> Result<bool> {
        let Some(owner) = self.owner(shoot).await? else {
            return Ok(false);
        };
        let spec = ControlPlaneSpec::new(shoot);
        let now_ms = crate::process::unix_now_ms();
        let lease = self.renderer(&spec).lease(&owner, record, now_ms);
        self.apply(shoot, &lease).await?;
        Ok(true)
    }

    /// Puts the PKI files in `dir` (a restored identity) into the PKI Secret
    /// before the first start on this seed, so the control plane keeps the
    /// shoot's CA and keys.
    pub async fn seed_pki(&self, shoot: &str, dir: &Path) -> Result<()> {
        let files = super::shoot_pki::read_dir_files(dir)?;
        let spec = ControlPlaneSpec::new(shoot);
        self.ensure_namespace(&spec).await?;
        self.apply(shoot, &self.renderer(&spec).anchor()).await?;
        let owner = self.owner(shoot).await?.ok_or_else(|| SeedError::Kube {
            shoot: shoot.to_string(),
            message: format!("ConfigMap {ANCHOR} vanished right after it was applied"),
        })?;
        let secret = self.renderer(&spec).pki_secret(&owner, &files);
        self.apply(shoot, &secret).await?;
        tracing::info!(
            shoot,
            secret = PKI_SECRET,
            "restored PKI put into the seed cluster"
        );
        Ok(())
    }

    /// Asks etcd's init container to restore from the bucket for request
    /// `id` (an operation's, see ringd's record): the newest revision, or
    /// exactly `revision` (a migration's final one). A volume restored for
    /// another id is restored again.
    pub async fn request_restore(
        &self,
        shoot: &str,
        id: &str,
        revision: Option<i64>,
    ) -> Result<()> {
        let mut data = BTreeMap::from([("operation", id.to_string())]);
        if let Some(r) = revision {
            data.insert("revision", r.to_string());
        }
        self.request(
            shoot,
            agent::RESTORE_CONFIGMAP,
            data,
            "asking for a restore",
        )
        .await
    }

    /// Sets `data` on ConfigMap `name` as ringd's request (fields ringd set
    /// before and leaves out now are removed; the agent's answer stays).
    pub(super) async fn request(
        &self,
        shoot: &str,
        name: &str,
        data: BTreeMap<&str, String>,
        what: &str,
    ) -> Result<()> {
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace(shoot)},
            "data": data,
        });
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        api.patch(
            name,
            &PatchParams::apply(RESTORE_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .map_err(self.kube_err(shoot, what))?;
        Ok(())
    }

    /// What the init container recorded of request `id`'s restore, once done.
    pub async fn restore_report(&self, shoot: &str, id: &str) -> Result<Option<RestoreRecord>> {
        let data = self.configmap_data(shoot, agent::RESTORE_CONFIGMAP).await?;
        if data.get("restored").map(|s| s.trim()) != Some(id) {
            return Ok(None);
        }
        let (Some(report), Some(objects)) = (data.get("report"), data.get("objects")) else {
            return Ok(None);
        };
        Ok(Some(RestoreRecord {
            report: report.clone(),
            objects: objects.clone(),
            hash_kv: data.get("hashKv").and_then(|h| h.trim().parse().ok()),
        }))
    }

    /// Whether etcd has a pod (of an earlier stay, or one being created).
    pub async fn etcd_pod_exists(&self, shoot: &str) -> Result<bool> {
        let pods = self
            .pods(shoot, &super::component_selector(shoot, ETCD))
            .await?;
        Ok(!pods.is_empty())
    }

    /// Deletes etcd's pods (its StatefulSet makes new ones, whose init
    /// container looks at the restore request again).
    pub async fn restart_etcd(&self, shoot: &str) -> Result<()> {
        self.delete_pods_now(shoot, &super::component_selector(shoot, ETCD))
            .await
    }

    /// The backup sidecar's progress, if it recorded any.
    pub async fn backup_progress(&self, shoot: &str) -> Result<Option<BackupProgress>> {
        let data = self.configmap_data(shoot, agent::BACKUP_STATUS).await?;
        let num = |k: &str| data.get(k).and_then(|v| v.trim().parse::<u64>().ok());
        Ok(num("revision").map(|revision| BackupProgress {
            revision,
            at_ms: num("atMs").unwrap_or(0),
            etcd_revision: num("etcdRevision"),
            error: data.get("error").filter(|e| !e.is_empty()).cloned(),
        }))
    }

    pub(super) async fn configmap_data(
        &self,
        shoot: &str,
        name: &str,
    ) -> Result<BTreeMap<String, String>> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        let cm = api
            .get_opt(name)
            .await
            .map_err(self.kube_err(shoot, &format!("reading ConfigMap {name}")))?;
        Ok(cm.and_then(|c| c.data).unwrap_or_default())
    }

    /// Why etcd's pod does not get through its restore, if something visibly
    /// stops it: a claim that does not bind, an image missing on the node, a
    /// failed restore (its message), a pod that cannot be scheduled.
    pub async fn restore_problem(&self, shoot: &str) -> Result<Option<String>> {
        let pods = self
            .pods(shoot, &super::component_selector(shoot, ETCD))
            .await?;
        if let Some(problem) = pods.iter().find_map(pod_problem) {
            return Ok(Some(problem));
        }
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &self.namespace(shoot));
        let list = claims
            .list(&ListParams::default().labels(&format!("{SHOOT_LABEL}={shoot}")))
            .await
            .map_err(self.kube_err(shoot, "listing volume claims"))?;
        Ok(list.items.iter().find_map(|c| {
            let phase = c.status.as_ref()?.phase.clone()?;
            (phase == "Pending").then(|| {
                let name = c.metadata.name.clone().unwrap_or_default();
                format!("volume claim {name} is Pending: the seed cluster has no volume for it (a storage class with a provisioner, or a matching PersistentVolume)")
            })
        }))
    }
}

/// The client URL of `shoot`'s etcd on the seed cluster `client` reaches: the
/// pod IP of its Running etcd pod in `shoot--<ring>--<shoot>`, which the
/// machine reaches through its nodes' routes. `None` while no such pod has an
/// address. etcd's serving certificate names `localhost`: connect with that
/// server name.
pub async fn etcd_pod_url(
    client: &kube::Client,
    ring: &str,
    shoot: &str,
) -> Result<Option<String>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &super::render::namespace(ring, shoot));
    let pods = api
        .list(&ListParams::default().labels(&super::component_selector(shoot, ETCD)))
        .await
        .map_err(|e| SeedError::Kube {
            shoot: shoot.to_string(),
            message: format!("listing etcd's pods: {e}"),
        })?;
    Ok(pods.items.iter().find_map(|p| {
        let status = p.status.as_ref()?;
        let ip = status
            .pod_ip
            .as_deref()
            .filter(|_| status.phase.as_deref() == Some("Running"))?;
        Some(format!("https://{ip}:2379"))
    }))
}

/// A visible reason why `pod` does not run: an init container that failed,
/// an image the node lacks, or a scheduling failure.
fn pod_problem(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in containers {
        let state = c.state.as_ref();
        if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.clone().unwrap_or_default();
            let restore_failed = c.name == "restore"
                && c.last_state
                    .as_ref()
                    .is_some_and(|s| s.terminated.is_some());
            if reason.contains("Image") || (reason == "CrashLoopBackOff" && !restore_failed) {
                let msg = w.message.clone().unwrap_or_default();
                return Some(format!(
                    "container {} of pod {}: {reason} {msg}",
                    c.name,
                    name_of(pod)
                ));
            }
        }
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()).or(last) {
            if t.exit_code != 0 && c.name == "restore" {
                let msg = t.message.clone().unwrap_or_default();
                return Some(format!(
                    "the restore in pod {} failed (exit {}): {}",
                    name_of(pod),
                    t.exit_code,
                    msg.trim()
                ));
            }
        }
    }
    status.conditions.iter().flatten().find_map(|c| {
        (c.type_ == "PodScheduled" && c.status == "False").then(|| {
            format!(
                "pod {} cannot be scheduled: {}",
                name_of(pod),
                c.message.clone().unwrap_or_default()
            )
        })
    })
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_failed_restore_and_a_missing_image_are_named() {
        let failed = pod(json!({
            "metadata": {"name": "etcd-0"},
            "status": {"initContainerStatuses": [{
                "name": "restore", "image": "x", "imageID": "", "ready": false, "restartCount": 1,
                "state": {"terminated": {"exitCode": 1, "message": "the bucket holds no full snapshot"}},
            }]},
        }));
        let text = pod_problem(&failed).unwrap();
        assert!(
            text.contains(
                "restore in pod etcd-0 failed (exit 1): the bucket holds no full snapshot"
            ),
            "{text}"
        );
        let missing = pod(json!({
            "metadata": {"name": "etcd-0"},
            "status": {"containerStatuses": [{
                "name": "etcd", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}},
            }]},
        }));
        assert!(pod_problem(&missing).unwrap().contains("ErrImageNeverPull"));
        let fine = pod(json!({"metadata": {"name": "etcd-0"}, "status": {"phase": "Running"}}));
        assert_eq!(pod_problem(&fine), None);
    }
}
