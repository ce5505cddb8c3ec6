//! Planned migration of a real control plane between members of a real ring,
//! while a writer creates ConfigMaps as fast as it can.

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::Api;
use ring_tests::*;

#[path = "migrate/failover.rs"]
mod failover;

/// A 3-member ring bootstrapped by `ringctl bootstrap` in a sandbox.
struct Bootstrapped {
    _sandbox: Sandbox,
    dir: std::path::PathBuf,
    layout: bootstrap::RingLayout,
    ring: bootstrap::config::RingConfig,
    pki: std::path::PathBuf,
    /// The kubeconfig of shoot m2 (hosted by m1 at first).
    kubeconfig: std::path::PathBuf,
}

impl Bootstrapped {
    /// Bootstraps m1..m3 with `extra` lines in the Ring config.
    fn new(extra: &str) -> Self {
        let sandbox = Sandbox::new();
        let dir = sandbox.path().join("ring");
        let config = ring_config_with(sandbox.path(), 3, extra);
        ringctl_in(
            &dir,
            &["bootstrap", "--config", &config.display().to_string()],
        );
        let layout = bootstrap::RingLayout { dir: dir.clone() };
        let ring = layout.read_config().unwrap().unwrap();
        Bootstrapped {
            pki: layout.pki(),
            kubeconfig: dir.join("kubeconfigs/m2.kubeconfig"),
            _sandbox: sandbox,
            dir,
            layout,
            ring,
        }
    }

    /// The ring's status as member m2 sees it, if it answers now.
    async fn status(&self) -> Option<ringd::status::RingStatus> {
        let mut c =
            ringd::client::AdminClient::connect(&self.ring.member_address(1), &self.pki).ok()?;
        c.status().await.ok()
    }

    /// kill -9 of member `name`'s ringd (and with it what it runs); waits until it is gone.
    async fn kill(&self, name: &str) {
        let pid = self.layout.running_pid(name).expect("the member runs");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        wait_for(
            &format!("{name}'s ringd to be gone"),
            Duration::from_secs(10),
            || {
                let gone = self.layout.running_pid(name).is_none();
                async move { gone.then_some(()) }
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_migration_under_writes_loses_no_acknowledged_write() {
    let _slot = ring_tests::ring_slot();
    // the old host deletes m2's data 2 s after the move
    let b = Bootstrapped::new("releaseGraceSeconds: 2");
    let (dir, kubeconfig) = (b.dir.clone(), b.kubeconfig.clone());
    let before_kubeconfig = std::fs::read(&kubeconfig).unwrap();

    // A writer that records every create the API acknowledged, with its resourceVersion.
    let client = kube_client(&kubeconfig).await;
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, client) = (acked.clone(), stop.clone(), client.clone());
        tokio::spawn(async move {
            let cms: Api<ConfigMap> = Api::namespaced(client, "default");
            let mut i = 0u64;
            let mut failures = 0u64;
            while !stop.load(Ordering::Relaxed) && i < 100_000 {
                i += 1;
                let name = format!("w-{i}");
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match cms.create(&PostParams::default(), &cm).await {
                    Ok(created) => {
                        let rv = created
                            .metadata
                            .resource_version
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        acked.lock().unwrap().push((name, rv));
                    }
                    Err(_) => {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            failures
        })
    };
    wait_for("the writer to get going", Duration::from_secs(30), || {
        let n = acked.lock().unwrap().len();
        async move { (n >= 20).then_some(()) }
    })
    .await;

    // m2's controller-manager and scheduler lead on m1 (their leader Leases exist)
    wait_for("m2's leader Leases", Duration::from_secs(60), || {
        let client = client.clone();
        async move { (leader_lease_versions(&client).await.len() == 2).then_some(()) }
    })
    .await;

    // m2's control plane runs on m1; move it to m3.
    let dir2 = dir.clone();
    let out = tokio::task::spawn_blocking(move || {
        ringctl_in(&dir2, &["migrate", "m2", "--to", "m3", "-o", "json"])
    })
    .await
    .unwrap();
    let op: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(op["step"], "Done", "{op}");
    assert!(
        op["detail"].as_str().unwrap().contains("HashKV and"),
        "{op}"
    );
    // the target verified the object count of every resource type and reports it
    let outcome = &op["outcome"];
    let final_rev = outcome["restoredRevision"].as_u64().unwrap_or(0);
    let acked_before_handover = acked
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, rv)| *rv <= final_rev)
        .count() as u64;
    let configmaps = outcome["objects"]["configmaps"].as_u64().unwrap_or(0);
    assert!(
        configmaps >= acked_before_handover && acked_before_handover >= 20,
        "verified configmaps {configmaps}, acknowledged at or before revision {final_rev}: {acked_before_handover}: {op}"
    );
    assert!(
        outcome["objects"]["namespaces"].as_u64().unwrap_or(0) >= 3,
        "{op}"
    );
    assert!(
        outcome["restoredRevision"].as_i64().unwrap_or(0) > 0,
        "{op}"
    );
    assert_eq!(outcome["rpoRevisions"], 0, "{op}");
    let steps: Vec<&str> = op["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["step"].as_str())
        .collect();
    assert_eq!(steps, ["Pending", "Restoring", "Done"], "{op}");
    // m1's leader Leases were released on m3 (else m2's controllers wait 15 s)
    let stale: Vec<_> = leader_lease_versions(&client)
        .await
        .into_iter()
        .filter(|(_, rv)| *rv <= final_rev as i64)
        .collect();
    assert!(
        stale.is_empty(),
        "leader Leases of m1's control plane left: {stale:?}"
    );

    // keep writing a little on the new host, then stop
    let n_before = acked.lock().unwrap().len();
    wait_for("writes on the new host", Duration::from_secs(60), || {
        let n = acked.lock().unwrap().len();
        async move { (n >= n_before + 20).then_some(()) }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let _failures = writer.await.unwrap();

    // every acknowledged write is there, read through the unchanged kubeconfig
    assert_eq!(
        std::fs::read(&kubeconfig).unwrap(),
        before_kubeconfig,
        "the kubeconfig changed"
    );
    let cms: Api<ConfigMap> = Api::namespaced(kube_client(&kubeconfig).await, "default");
    let present: BTreeSet<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let acked = acked.lock().unwrap().clone();
    let lost: Vec<&String> = acked
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !present.contains(*n))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    // resourceVersions keep increasing across the move (no client sees time go backwards)
    let max_rv = acked.iter().map(|(_, rv)| *rv).max().unwrap();
    let fresh = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("after-the-move".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let rv: u64 = fresh.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > max_rv, "resourceVersion went back: {rv} <= {max_rv}");

    // m3's controllers lead, and their Leases are not taken for m1's
    wait_for(
        "m2's controllers to lead on m3",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let held = leader_lease_versions(&client).await;
                (held.len() == 2 && held.iter().all(|(_, rv)| *rv > final_rev as i64)).then_some(())
            }
        },
    )
    .await;
    let released = seed::leader_leases::release_stale("m2", &kubeconfig, final_rev as i64)
        .await
        .unwrap();
    assert!(
        released.is_empty(),
        "released the new holders' Leases: {released:?}"
    );
    assert_eq!(leader_lease_versions(&client).await.len(), 2);

    // the ring says so; the old host serves nothing for m2
    let status = ringctl_in(&dir, &["status", "-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let p = status["placements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["shoot"] == "m2")
        .cloned()
        .unwrap();
    assert_eq!(
        (p["host"].as_str(), p["epoch"].as_u64()),
        (Some("m3"), Some(2)),
        "{p}"
    );
    // the new host serves it under the placement's epoch, as its status says
    let m3 = b.ring.member_address(2);
    let at_m3 = ringctl_in(&dir, &["status", "-o", "json", "--address", &m3]);
    let at_m3: serde_json::Value = serde_json::from_str(&at_m3).unwrap();
    let hosted = at_m3["hosted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["shoot"] == "m2")
        .cloned()
        .unwrap();
    assert_eq!(
        (hosted["serving"].as_bool(), hosted["epoch"].as_u64()),
        (Some(true), Some(2)),
        "{hosted}"
    );
    let old_dir = dir.join("members/m1/seed/shoots/m2");
    let old = processes_mentioning(&old_dir);
    assert!(
        old.is_empty(),
        "the old host still runs m2's processes: {old:?}"
    );
    // after the grace, the old host deletes m2's data; the new host keeps its own
    wait_for(
        "m1 to delete m2's data after the grace",
        Duration::from_secs(30),
        || {
            let gone = !old_dir.exists();
            async move { gone.then_some(()) }
        },
    )
    .await;
    assert!(dir.join("members/m3/seed/shoots/m2/etcd").exists());
    // the executors' metrics count the move and time its steps
    let ring = bootstrap::RingLayout { dir: dir.clone() }
        .read_config()
        .unwrap()
        .unwrap();
    let metrics = http_get(&ring.metrics_address(2), "/metrics").await;
    assert!(
        metrics.contains(
            "ringd_operations_finished_total{member=\"m3\",kind=\"migration\",outcome=\"done\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("ringd_operation_step_seconds_count{member=\"m3\",kind=\"migration\",role=\"target\",step=\"restore\"}"),
        "{metrics}"
    );
    // and say when the certificates it uses and keeps for m2 expire
    for (owner, name) in [
        ("ring", "ca"),
        ("member m3", "member"),
        ("shoot m2", "kube-apiserver"),
    ] {
        let series = format!(
            "ringd_certificate_expiration_timestamp_seconds{{member=\"m3\",owner=\"{owner}\",name=\"{name}\"}} "
        );
        assert!(metrics.contains(&series), "no {series} in {metrics}");
    }

    // a migration to where it already is, or of an unknown shoot, is refused with a reason
    let again = ringctl_cmd(
        [
            "migrate".as_ref(),
            "m2".as_ref(),
            "--to".as_ref(),
            "m3".as_ref(),
            "--ring-dir".as_ref(),
            dir.as_os_str(),
        ],
        &[],
    );
    assert!(expect_clean_failure(&again).contains("already hosted by m3"));
    ringctl_in(&dir, &["down"]);
}

/// The leader Leases of a shoot's controller-manager and scheduler that
/// exist and name a holder, with their resourceVersions.
async fn leader_lease_versions(client: &kube::Client) -> Vec<(String, i64)> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mut held = Vec::new();
    for name in seed::leader_leases::LEADER_LEASES {
        let lease = match leases.get_opt(name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => continue,
            Err(e) => panic!("reading Lease kube-system/{name}: {e}"),
        };
        let holder = lease.spec.and_then(|s| s.holder_identity);
        let rv = lease.metadata.resource_version.and_then(|v| v.parse().ok());
        if let (Some(_), Some(rv)) = (holder, rv) {
            held.push((name.to_string(), rv));
        }
    }
    held
}

/// kill -9 of the target's ringd while it restores: after a restart it resumes
/// from what is on disk and the migration completes with the data intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_crash_mid_migration_resumes_and_completes() {
    let _slot = ring_tests::ring_slot();
    let b = Bootstrapped::new("");
    let (dir, kubeconfig, ring, pki) = (&b.dir, &b.kubeconfig, &b.ring, &b.pki);
    kubectl(
        kubeconfig,
        &["create", "configmap", "survivor", "--from-literal=k=v"],
    );
    let leader_status = ringd::client::AdminClient::connect(&ring.member_address(0), pki)
        .unwrap()
        .status()
        .await
        .unwrap();
    let mut admin = ringd::client::AdminClient::connect_leader(&ring.member_address(0), pki)
        .await
        .unwrap();
    assert!(leader_status
        .placements
        .iter()
        .any(|p| p.shoot == "m2" && p.host == "m1"));
    let id = admin.migrate("m2", "m3").await.unwrap();
    // asked again while it runs (a client retrying after a timeout whose
    // proposal committed after all): the same move, not a refusal
    assert_eq!(admin.migrate("m2", "m3").await.unwrap(), id);

    // wait for the handover, then kill the target's ringd (and with it whatever it runs)
    wait_for("the handover to m3", Duration::from_secs(60), || {
        let mut c = ringd::client::AdminClient::connect(&ring.member_address(0), pki).unwrap();
        async move {
            let s = c.status().await.ok()?;
            s.operations
                .iter()
                .any(|o| o.id == id && o.step == ringd::state::OperationStep::Restoring)
                .then_some(())
        }
    })
    .await;
    b.kill("m3").await;

    // bootstrap resumes the ring: it restarts m3, which resumes the migration
    ringctl_in(dir, &["bootstrap"]);
    let op = admin
        .wait_operation(id, Duration::from_secs(120), |_, _| {})
        .await
        .expect("the migration finishes");
    assert_eq!(op.step, ringd::state::OperationStep::Done, "{op:?}");
    assert_eq!(
        kubectl(
            kubeconfig,
            &["get", "configmap", "survivor", "-o", "jsonpath={.data.k}"]
        ),
        "v"
    );
    ringctl_in(dir, &["down"]);
}
