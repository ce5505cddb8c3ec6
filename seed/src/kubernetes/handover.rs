//! ringd's side of a planned migration in a seed cluster: stopping and
//! starting single components (a source stops the writers first and etcd
//! last), and asking etcd's sidecar for the final snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;

use super::agent::{HandoverRecord, HANDOVER_CONFIGMAP};
use super::render::SHOOT_LABEL;
use super::{component_of, component_selector, render, set_replicas, KubernetesSeed};
use crate::error::{Result, SeedError};
use crate::process::Component;

impl KubernetesSeed {
    /// Components that run or are about to: desired replicas or pods left.
    pub async fn running_components(&self, shoot: &str) -> Result<Vec<Component>> {
        let pods = self.pods(shoot, &format!("{SHOOT_LABEL}={shoot}")).await?;
        let mut running = Vec::new();
        for c in Component::ALL {
            let desired = self.replicas(shoot, c).await?.map_or(0, |(d, _)| d);
            let has_pods = pods.iter().any(|p| component_of(p) == Some(c.name()));
            if desired > 0 || has_pods {
                running.push(c);
            }
        }
        Ok(running)
    }

    /// Scales `components` to zero, all at once, deletes their pods and waits
    /// until they are gone (stragglers are deleted without grace after the
    /// stop grace). One wait for all: pods of one component take 5-10 s to go
    /// (kubelet kills the containers, then reports), so stopping one after
    /// another tripled a handover's downtime.
    pub async fn stop_components(&self, shoot: &str, components: &[Component]) -> Result<()> {
        self.anchor(shoot).await?;
        for c in components {
            self.scale(shoot, *c, 0).await?;
        }
        for c in components {
            self.delete_pods_of(shoot, *c).await?;
        }
        for c in components {
            self.wait_pods_gone(shoot, &component_selector(shoot, c.name()))
                .await?;
        }
        Ok(())
    }

    /// Scales `components` to one replica.
    pub async fn start_components(&self, shoot: &str, components: &[Component]) -> Result<()> {
        self.anchor(shoot).await?;
        for c in components {
            self.scale(shoot, *c, 1).await?;
        }
        Ok(())
    }

    /// Deletes `component`'s pods, with their grace period, once nothing
    /// replaces them (a Deployment's ReplicaSets are scaled to zero as well).
    /// The seed cluster's controllers would delete them too, but one that has
    /// just started (a controller-manager whose own shoot moved a moment ago)
    /// takes seconds to: a planned migration's downtime waited for it.
    async fn delete_pods_of(&self, shoot: &str, component: Component) -> Result<()> {
        let selector = component_selector(shoot, component.name());
        let ns = self.namespace(shoot);
        let list = ListParams::default().labels(&selector);
        if render::workload(component).0 == "Deployment" {
            let sets: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
            let listed = sets
                .list(&list)
                .await
                .map_err(self.kube_err(shoot, "listing ReplicaSets"))?;
            for rs in listed
                .items
                .iter()
                .filter_map(|rs| rs.metadata.name.as_deref())
            {
                set_replicas(&sets, rs, 0)
                    .await
                    .map_err(self.kube_err(shoot, "scaling a ReplicaSet to 0"))?;
            }
        }
        // each pod's own grace (kube-apiserver's is 1 s, see
        // `process::API_STOP_GRACE`)
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        pods.delete_collection(&DeleteParams::default(), &list)
            .await
            .map_err(self.kube_err(shoot, "deleting pods"))?;
        Ok(())
    }

    /// Waits until no process of a pod matching `selector` is left: the pods
    /// are gone, or deleted with every container terminated (their objects
    /// are then removed at once). After the stop grace deletes what is left
    /// without grace.
    pub(super) async fn wait_pods_gone(&self, shoot: &str, selector: &str) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.stop_grace;
        loop {
            let pods = self.pods(shoot, selector).await?;
            if pods.is_empty() {
                return Ok(());
            }
            if pods.iter().all(|p| processes_gone(p) || self.gone_here(p)) {
                return self.delete_pods_now(shoot, selector).await;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    shoot,
                    selector,
                    "pods still there after the grace period; deleting them without grace"
                );
                return self.delete_pods_now(shoot, selector).await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether deleted `pod` has no process left on this machine's node (its
    /// cgroups are empty), when the node's pods are visible here.
    fn gone_here(&self, pod: &Pod) -> bool {
        let Some(root) = self.config.node_cgroup_root.as_deref() else {
            return false;
        };
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        pod.metadata.deletion_timestamp.is_some()
            && !uid.is_empty()
            && crate::node::teardown::pod_processes(root, uid).is_some_and(|p| p.is_empty())
    }

    /// Asks etcd's sidecar for the final snapshot of migration `op`.
    pub async fn request_handover(&self, shoot: &str, op: u64) -> Result<()> {
        let data = BTreeMap::from([("operation", op.to_string())]);
        self.request(
            shoot,
            HANDOVER_CONFIGMAP,
            data,
            "asking for the final snapshot",
        )
        .await
    }

    /// The sidecar's answer for migration `op`: its record, or why it could
    /// not take the snapshot; `None` while it has not answered.
    pub async fn handover_record(
        &self,
        shoot: &str,
        op: u64,
    ) -> Result<Option<std::result::Result<HandoverRecord, String>>> {
        let data = self.configmap_data(shoot, HANDOVER_CONFIGMAP).await?;
        answer(&data, op).map_err(|message| SeedError::Kube {
            shoot: shoot.to_string(),
            message,
        })
    }
}

/// Whether no process of `pod` is left: it was deleted and its kubelet
/// reports every container (and init container) terminated.
fn processes_gone(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    let all: Vec<_> = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .collect();
    pod.metadata.deletion_timestamp.is_some()
        && !all.is_empty()
        && all
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
}

/// The answer in the handover ConfigMap's `data` for `op`: `taken` (the
/// record) or `error` (`<op>: <why>`); an unreadable record is an error.
fn answer(
    data: &BTreeMap<String, String>,
    op: u64,
) -> std::result::Result<Option<std::result::Result<HandoverRecord, String>>, String> {
    if let Some(taken) = data.get("taken").filter(|t| !t.trim().is_empty()) {
        let record: HandoverRecord = serde_json::from_str(taken).map_err(|e| {
            format!("unreadable final snapshot record in ConfigMap {HANDOVER_CONFIGMAP}: {e}")
        })?;
        if record.operation == op {
            return Ok(Some(Ok(record)));
        }
    }
    let failed = data
        .get("error")
        .and_then(|e| e.split_once(": "))
        .filter(|(id, _)| id.trim() == op.to_string());
    Ok(failed.map(|(_, why)| Err(why.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Only the answer for this operation counts; another's, or none, is no
    /// answer yet; a failure names why; garbage is an error, not a wait.
    #[test]
    fn the_sidecars_answer_is_read_for_one_operation() {
        let record = HandoverRecord {
            operation: 7,
            full: "full-1".into(),
            revision: 120,
            hash_kv: 0xdead,
            objects: BTreeMap::from([("pods".to_string(), 3)]),
            db_bytes: 4096,
        };
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(answer(&data(&[]), 7), Ok(None));
        assert_eq!(answer(&data(&[("taken", &json)]), 7), Ok(Some(Ok(record))));
        assert_eq!(answer(&data(&[("taken", &json)]), 8), Ok(None));
        let failed = data(&[("taken", &json), ("error", "8: etcd: connection refused")]);
        assert_eq!(
            answer(&failed, 8),
            Ok(Some(Err("etcd: connection refused".into())))
        );
        assert_eq!(answer(&failed, 9), Ok(None));
        let bad = answer(&data(&[("taken", "{not json")]), 7).unwrap_err();
        assert!(bad.contains(HANDOVER_CONFIGMAP), "{bad}");
    }

    fn pod(deleted: bool, states: &[&str]) -> Pod {
        let statuses: Vec<serde_json::Value> = states
            .iter()
            .map(|s| {
                let state = match *s {
                    "running" => serde_json::json!({"running": {}}),
                    "waiting" => serde_json::json!({"waiting": {"reason": "ContainerCreating"}}),
                    _ => serde_json::json!({"terminated": {"exitCode": 0}}),
                };
                serde_json::json!({"name": "c", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0, "state": state})
            })
            .collect();
        let mut meta = serde_json::json!({"name": "p"});
        if deleted {
            meta["deletionTimestamp"] = serde_json::json!("2026-11-26T01:38:21Z");
        }
        serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "status": {"containerStatuses": statuses},
        }))
        .unwrap()
    }

    /// A deleted pod whose kubelet reports every container terminated has no
    /// process left, though its object can stay for tens of seconds while the
    /// kubelet reclaims the rest, and waiting for the object would add that
    /// to a handover's downtime. Anything that may still run,
    /// or was not asked to stop, counts as running.
    #[test]
    fn a_deleted_pod_with_every_container_terminated_has_stopped() {
        assert!(processes_gone(&pod(true, &["terminated"])));
        assert!(processes_gone(&pod(true, &["terminated", "terminated"])));
        assert!(!processes_gone(&pod(true, &["terminated", "running"])));
        assert!(!processes_gone(&pod(true, &["waiting"])), "may be starting");
        assert!(!processes_gone(&pod(true, &[])), "nothing reported yet");
        assert!(
            !processes_gone(&pod(false, &["terminated"])),
            "not deleted: restarts"
        );
    }
}
