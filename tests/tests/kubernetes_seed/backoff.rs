//! A control plane applied while its lease guard holds etcd and kube-apiserver
//! (what a failover or migration onto a Kubernetes seed does: restore, then
//! lease): kube-controller-manager exits without its API, again and again,
//! and kubelet backs off longer each time. Once the API serves, the seed's
//! start (repeated by a move's target until the control plane is whole)
//! replaces the pod left in back-off instead of waiting it out.

use std::path::Path;
use std::time::Duration;

use ring_tests::*;
use seed::kubernetes::{LeaseRecord, ServiceType, Wiring};
use seed::{ControlPlaneSpec, Seed};

use super::{config, host_path_volume, kubectl_json, seed_cluster_with_node};

const SHOOT: &str = "held";
const CM: &str = "app.kubernetes.io/name=kube-controller-manager";

fn lease(fence_at_ms: u64) -> LeaseRecord {
    LeaseRecord {
        holder: "m1".into(),
        epoch: 1,
        fence_at_ms,
        duration_secs: 6,
    }
}

/// (name, waiting reason, restarts) of each pod matching `selector`.
fn pods(kc: &Path, ns: &str, selector: &str) -> Vec<(String, String, u64)> {
    let list = kubectl_json(kc, &["get", "pods", "-n", ns, "-l", selector]);
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let c = &p["status"]["containerStatuses"][0];
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["state"]["waiting"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["restartCount"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn ready(kc: &Path, ns: &str, selector: &str) -> bool {
    let list = kubectl_json(kc, &["get", "pods", "-n", ns, "-l", selector]);
    list["items"].as_array().is_some_and(|items| {
        !items.is_empty()
            && items.iter().all(|p| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependents_left_in_back_off_while_the_api_was_fenced_start_once_it_serves() {
    let sandbox = Sandbox::new();
    let cluster = seed_cluster_with_node(&sandbox, "k8s-seed-k").await;
    let kc = cluster.kubeconfig();
    host_path_volume(&cluster, &sandbox, "etcd-data").await;
    let mut cfg = config("t7", &kc);
    cfg.service_type = ServiceType::NodePort;
    let seed = seed::KubernetesSeed::connect(&cfg, sandbox.path().join("ringd-state"))
        .await
        .expect("connect")
        .with_wiring(Wiring {
            guard: true,
            backup: None,
        });
    let spec = ControlPlaneSpec::new(SHOOT);
    let ns = seed.namespace(SHOOT);

    // applied fenced: the guards hold etcd and kube-apiserver
    seed.start(&spec).await.expect("start");
    assert!(seed.write_lease(SHOOT, &lease(0)).await.expect("lease"));
    // back-offs double (10 s, 20 s, 40 s, 80 s): after the fourth restart the
    // next wait (80 s) is long enough for the API to come up inside it, also
    // on a busy machine (after the third, 40 s once was not)
    let stuck = wait_for(
        "kube-controller-manager in crash-loop back-off after 4 restarts",
        Duration::from_secs(400),
        || async {
            pods(&kc, &ns, CM)
                .into_iter()
                .find(|(_, reason, restarts)| reason == "CrashLoopBackOff" && *restarts >= 4)
                .map(|(name, _, _)| name)
        },
    )
    .await;

    // the lease comes: the guards start etcd and kube-apiserver
    assert!(seed
        .write_lease(SHOOT, &lease(ringd::now_ms() + 600_000))
        .await
        .expect("lease"));
    wait_for(
        "kube-apiserver Ready under a valid lease",
        Duration::from_secs(180),
        || async { ready(&kc, &ns, "app.kubernetes.io/name=kube-apiserver").then_some(()) },
    )
    .await;
    let still = pods(&kc, &ns, CM);
    assert!(
        still
            .iter()
            .any(|(name, reason, _)| *name == stuck && reason == "CrashLoopBackOff"),
        "the API came up after the back-off ended, so nothing is left to prove: {still:?}"
    );

    // a move's target starts again each round until the control plane is whole
    seed.start(&spec).await.expect("start again");
    wait_for(
        "the controller-manager pod left in back-off replaced and the new one Ready",
        Duration::from_secs(120),
        || async {
            let now = pods(&kc, &ns, CM);
            (!now.iter().any(|(name, _, _)| *name == stuck) && ready(&kc, &ns, CM)).then_some(())
        },
    )
    .await;
    wait_for(
        "every pod of the control plane Ready",
        Duration::from_secs(120),
        || async { ready(&kc, &ns, &format!("ring.gardener.cloud/shoot={SHOOT}")).then_some(()) },
    )
    .await;
    cluster.stop().await;
}
