//! A control plane applied while its lease guard holds etcd and kube-apiserver
//! (what a failover or migration onto a Kubernetes seed does: restore, then
//! lease). kube-controller-manager starts without its API; it used to exit
//! at once, again and again, while kubelet backed off longer each time (a
//! move then waited out 10-80 s). It now waits for its API in leader election
//! and is Ready, without a restart, once the API serves. (The seed still
//! replaces a pod left in back-off by a crash from before the API served;
//! `seed::kubernetes::backoff` unit-tests which ones.)

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

/// The log of the pod matching `selector` so far; empty while it has none.
fn log(kc: &Path, ns: &str, selector: &str) -> String {
    let mut cmd = std::process::Command::new(kubectl_path());
    cmd.arg("--kubeconfig")
        .arg(kc)
        .args(["logs", "-n", ns, "-l", selector, "--tail=-1"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_manager_applied_while_its_api_is_held_waits_for_it_without_a_restart() {
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

    // applied fenced: the guards hold etcd and kube-apiserver, and
    // kube-controller-manager starts without its API
    seed.start(&spec).await.expect("start");
    assert!(seed.write_lease(SHOOT, &lease(0)).await.expect("lease"));
    let waiting = wait_ok(
        "kube-controller-manager waiting for its held API in leader election",
        Duration::from_secs(180),
        || async {
            let now = pods(&kc, &ns, CM);
            let text = log(&kc, &ns, CM);
            match now.as_slice() {
                [(name, _, 0)]
                    if text
                        .to_lowercase()
                        .contains("attempting to acquire leader lease") =>
                {
                    Ok(name.clone())
                }
                _ => Err(format!("pods {now:?}; log so far:\n{text}")),
            }
        },
    )
    .await;

    // the lease comes: the guards start etcd and kube-apiserver
    assert!(seed
        .write_lease(SHOOT, &lease(ringd::now_ms() + 600_000))
        .await
        .expect("lease"));
    wait_for(
        "every pod of the control plane Ready",
        Duration::from_secs(180),
        || async { ready(&kc, &ns, &format!("ring.gardener.cloud/shoot={SHOOT}")).then_some(()) },
    )
    .await;
    let after = pods(&kc, &ns, CM);
    assert_eq!(
        after
            .iter()
            .map(|(n, _, r)| (n.as_str(), *r))
            .collect::<Vec<_>>(),
        [(waiting.as_str(), 0)],
        "the same controller-manager pod, never restarted: {after:?}"
    );
    cluster.stop().await;
}
