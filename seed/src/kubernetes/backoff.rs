//! kube-controller-manager and kube-scheduler exit when their kube-apiserver
//! does not answer, which it does not while the lease guard holds it (a
//! failover or migration onto the seed restores first and leases after) or
//! while it starts. kubelet then starts them again only after a back-off that
//! doubles up to five minutes, so the control plane would be whole long after
//! its API serves. Once the API serves, the seed replaces the pods that wait in
//! back-off *for a crash that happened before the API became ready*; a pod that
//! crashes with the API up keeps its back-off (no churn for a broken config).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams};
use kube::Api;

use super::render::SHOOT_LABEL;
use super::{component_of, KubernetesSeed};
use crate::error::Result;
use crate::process::Component;

/// The components that wait for the API by exiting (the others are guarded).
const DEPENDENTS: [Component; 2] = [Component::KubeControllerManager, Component::KubeScheduler];

/// Since when the API serves: the earliest Ready transition among the ready
/// kube-apiserver pods (`None`: no kube-apiserver pod is ready).
pub(crate) fn api_ready_since(pods: &[Pod]) -> Option<Time> {
    pods.iter()
        .filter(|p| component_of(p) == Some(Component::KubeApiserver.name()))
        .filter_map(|p| {
            let conditions = p.status.as_ref()?.conditions.as_ref()?;
            let ready = conditions
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?;
            ready.last_transition_time.clone()
        })
        .min()
}

/// The pods of the dependents that wait in crash-loop back-off for a crash
/// that ended no later than `api_since` (the API was not serving then).
pub(crate) fn backed_off(pods: &[Pod], api_since: &Time) -> Vec<String> {
    let dependent = |p: &Pod| {
        let c = component_of(p);
        DEPENDENTS.iter().any(|d| c == Some(d.name()))
    };
    pods.iter()
        .filter(|p| dependent(p))
        // already replaced: its kubelet may take a while (or, when its sandbox
        // is gone, fail) to confirm the deletion; asking again changes nothing
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let statuses = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref());
            statuses.into_iter().flatten().any(|cs| {
                let waiting = cs.state.as_ref().and_then(|s| s.waiting.as_ref());
                let backing_off =
                    waiting.and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff");
                let crashed_at = cs
                    .last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.finished_at.as_ref());
                backing_off && crashed_at.is_some_and(|t| t <= api_since)
            })
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

impl KubernetesSeed {
    /// Replaces `shoot`'s controller-manager and scheduler pods that wait in
    /// crash-loop back-off for a crash from before its kube-apiserver became
    /// ready (their workloads start new ones at once); returns their names.
    /// Nothing happens while no kube-apiserver pod is ready.
    pub async fn replace_backed_off(&self, shoot: &str) -> Result<Vec<String>> {
        let pods = self.pods(shoot, &format!("{SHOOT_LABEL}={shoot}")).await?;
        let Some(since) = api_ready_since(&pods) else {
            return Ok(Vec::new());
        };
        let names = backed_off(&pods, &since);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        for name in &names {
            // by name through deletecollection, the verb ringd's Role grants on pods
            let one = ListParams::default().fields(&format!("metadata.name={name}"));
            api.delete_collection(&DeleteParams::default(), &one)
                .await
                .map_err(self.kube_err(shoot, &format!("deleting pod {name}")))?;
            tracing::info!(%shoot, pod = %name, "replaced a pod left in back-off while the API was down");
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::render::COMPONENT_LABEL;
    use serde_json::json;

    fn pod(name: &str, component: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {COMPONENT_LABEL: component}},
            "status": status,
        }))
        .unwrap()
    }

    fn apiserver(ready_at: Option<&str>) -> Pod {
        let conditions = match ready_at {
            Some(t) => json!([{"type": "Ready", "status": "True", "lastTransitionTime": t}]),
            None => {
                json!([{"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}])
            }
        };
        pod("api", "kube-apiserver", json!({"conditions": conditions}))
    }

    /// A dependent's pod whose container waits (`reason`) after a crash at `crashed`.
    fn dependent(name: &str, component: &str, reason: &str, crashed: Option<&str>) -> Pod {
        let last = match crashed {
            Some(t) => json!({"terminated": {"exitCode": 1, "finishedAt": t}}),
            None => json!({}),
        };
        pod(
            name,
            component,
            json!({"containerStatuses": [{
                "name": component, "image": "x", "imageID": "", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": reason}}, "lastState": last,
            }]}),
        )
    }

    fn time(t: &str) -> Time {
        serde_json::from_value(json!(t)).unwrap()
    }

    #[test]
    fn the_api_serves_since_its_earliest_ready_pod() {
        assert_eq!(api_ready_since(&[apiserver(None)]), None);
        assert_eq!(api_ready_since(&[]), None);
        let pods = [
            apiserver(Some("2026-01-01T00:00:20Z")),
            apiserver(Some("2026-01-01T00:00:10Z")),
            dependent("cm", "kube-controller-manager", "CrashLoopBackOff", None),
        ];
        assert_eq!(api_ready_since(&pods), Some(time("2026-01-01T00:00:10Z")));
    }

    #[test]
    fn only_back_offs_for_crashes_before_the_api_served_are_cut_short() {
        let since = time("2026-01-01T00:00:10Z");
        // (case, pod, replaced)
        let cases = [
            (
                "controller-manager crashed while the API was down",
                dependent(
                    "cm",
                    "kube-controller-manager",
                    "CrashLoopBackOff",
                    Some("2026-01-01T00:00:05Z"),
                ),
                true,
            ),
            (
                "scheduler crashed the moment the API became ready",
                dependent(
                    "s",
                    "kube-scheduler",
                    "CrashLoopBackOff",
                    Some("2026-01-01T00:00:10Z"),
                ),
                true,
            ),
            (
                "crashed with the API up: its back-off stands (no churn)",
                dependent(
                    "cm",
                    "kube-controller-manager",
                    "CrashLoopBackOff",
                    Some("2026-01-01T00:00:11Z"),
                ),
                false,
            ),
            (
                "waiting for another reason",
                dependent(
                    "cm",
                    "kube-controller-manager",
                    "ErrImageNeverPull",
                    Some("2026-01-01T00:00:05Z"),
                ),
                false,
            ),
            (
                "no crash recorded",
                dependent("cm", "kube-controller-manager", "CrashLoopBackOff", None),
                false,
            ),
            (
                "etcd and kube-apiserver are guarded, never replaced",
                dependent(
                    "etcd-0",
                    "etcd",
                    "CrashLoopBackOff",
                    Some("2026-01-01T00:00:05Z"),
                ),
                false,
            ),
            (
                "already being deleted (asked before)",
                {
                    let mut p = dependent(
                        "cm",
                        "kube-controller-manager",
                        "CrashLoopBackOff",
                        Some("2026-01-01T00:00:05Z"),
                    );
                    p.metadata.deletion_timestamp = Some(time("2026-01-01T00:00:12Z"));
                    p
                },
                false,
            ),
        ];
        for (case, p, replaced) in cases {
            let got = backed_off(std::slice::from_ref(&p), &since);
            let want: Vec<String> = if replaced {
                vec![p.metadata.name.clone().unwrap()]
            } else {
                vec![]
            };
            assert_eq!(got, want, "{case}");
        }
    }
}
