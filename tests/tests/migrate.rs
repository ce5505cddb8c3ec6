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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_migration_under_writes_loses_no_acknowledged_write() {
    let _slot = ring_tests::ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let config = ring_config(sandbox.path(), 3);
    ringctl_in(
        &dir,
        &["bootstrap", "--config", &config.display().to_string()],
    );
    let kubeconfig = dir.join("kubeconfigs/m2.kubeconfig");
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
        op["detail"].as_str().unwrap().contains("HashKV verified"),
        "{op}"
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
    let old = processes_mentioning(&dir.join("members/m1/seed/shoots/m2"));
    assert!(
        old.is_empty(),
        "the old host still runs m2's processes: {old:?}"
    );

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

/// kill -9 of the target's ringd while it restores: after a restart it resumes
/// from what is on disk and the migration completes with the data intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_crash_mid_migration_resumes_and_completes() {
    let _slot = ring_tests::ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let config = ring_config(sandbox.path(), 3);
    ringctl_in(
        &dir,
        &["bootstrap", "--config", &config.display().to_string()],
    );
    let kubeconfig = dir.join("kubeconfigs/m2.kubeconfig");
    kubectl(
        &kubeconfig,
        &["create", "configmap", "survivor", "--from-literal=k=v"],
    );

    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let ring = layout.read_config().unwrap().unwrap();
    let pki = layout.pki();
    let leader_status = ringd::client::AdminClient::connect(&ring.member_address(0), &pki)
        .unwrap()
        .status()
        .await
        .unwrap();
    let mut admin = ringd::client::AdminClient::connect_leader(&ring.member_address(0), &pki)
        .await
        .unwrap();
    assert!(leader_status
        .placements
        .iter()
        .any(|p| p.shoot == "m2" && p.host == "m1"));
    let id = admin.migrate("m2", "m3").await.unwrap();

    // wait for the handover, then kill the target's ringd (and with it whatever it runs)
    wait_for("the handover to m3", Duration::from_secs(60), || {
        let mut c = ringd::client::AdminClient::connect(&ring.member_address(0), &pki).unwrap();
        async move {
            let s = c.status().await.ok()?;
            s.operations
                .iter()
                .any(|o| o.id == id && o.step == ringd::state::OperationStep::Restoring)
                .then_some(())
        }
    })
    .await;
    let pid = layout.running_pid("m3").expect("m3 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("m3's ringd to be gone", Duration::from_secs(10), || {
        let gone = layout.running_pid("m3").is_none();
        async move { gone.then_some(()) }
    })
    .await;

    // bootstrap resumes the ring: it restarts m3, which resumes the migration
    ringctl_in(&dir, &["bootstrap"]);
    let op = admin
        .wait_operation(id, Duration::from_secs(120), |_, _| {})
        .await
        .expect("the migration finishes");
    assert_eq!(op.step, ringd::state::OperationStep::Done, "{op:?}");
    assert_eq!(
        kubectl(
            &kubeconfig,
            &["get", "configmap", "survivor", "-o", "jsonpath={.data.k}"]
        ),
        "v"
    );
    ringctl_in(&dir, &["down"]);
}

/// kill -9 of the seed hosting a shoot's control plane in a 3-member ring: the
/// ring restores it on another member from the bucket alone, the original
/// kubeconfig answers, and every write the ring knew to be durable is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_seed_fails_over_from_the_bucket() {
    let _slot = ring_tests::ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let config = ring_config(sandbox.path(), 3);
    ringctl_in(
        &dir,
        &["bootstrap", "--config", &config.display().to_string()],
    );
    let kubeconfig = dir.join("kubeconfigs/m2.kubeconfig");
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let ring = layout.read_config().unwrap().unwrap();
    let pki = layout.pki();

    // writes, then wait until the ring knows a durable backup covering them
    let mut last_rv = 0u64;
    for i in 0..20 {
        let out = kubectl(
            &kubeconfig,
            &[
                "create",
                "configmap",
                &format!("before-{i}"),
                "-o",
                "jsonpath={.metadata.resourceVersion}",
            ],
        );
        last_rv = out.trim().parse().unwrap();
    }
    wait_for(
        "a durable backup covering the writes",
        Duration::from_secs(60),
        || {
            let c = ringd::client::AdminClient::connect(&ring.member_address(1), &pki);
            async move {
                let s = c.ok()?.status().await.ok()?;
                let rev = s
                    .placements
                    .iter()
                    .find(|p| p.shoot == "m2")?
                    .last_backup_revision?;
                (rev >= last_rv).then_some(())
            }
        },
    )
    .await;
    // the control plane of m2 runs on m1: kill m1's seed (ringd and what it runs)
    let pid = layout.running_pid("m1").expect("m1 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let mut client = ringd::client::AdminClient::connect(&ring.member_address(1), &pki).unwrap();
    let op = wait_for("a failover of m2", Duration::from_secs(30), || {
        let c = ringd::client::AdminClient::connect(&ring.member_address(1), &pki);
        async move {
            let s = c.ok()?.status().await.ok()?;
            s.operations.iter().find(|o| o.shoot() == "m2").cloned()
        }
    })
    .await;
    assert_eq!(
        (op.source(), op.target()),
        ("m1", "m3"),
        "m1's predecessor takes over: {op:?}"
    );
    let done = client
        .wait_operation(op.id, Duration::from_secs(120), |_, _| {})
        .await
        .unwrap();
    assert_eq!(done.step, ringd::state::OperationStep::Done, "{done:?}");
    assert!(done.detail.contains("restored revision"), "{}", done.detail);

    // the original kubeconfig answers, with every write
    for i in 0..20 {
        kubectl(&kubeconfig, &["get", "configmap", &format!("before-{i}")]);
    }
    let fresh = kubectl(
        &kubeconfig,
        &[
            "create",
            "configmap",
            "after",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    );
    assert!(
        fresh.trim().parse::<u64>().unwrap() > last_rv,
        "resourceVersion went back"
    );
    ringctl_in(&dir, &["down"]);
}
