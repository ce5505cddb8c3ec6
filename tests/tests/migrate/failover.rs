//! Failovers: a killed seed's control plane restored from the bucket on
//! another member, and a leader killed while it fails one over.

use super::*;

/// What a failover says clients lost holds against what they wrote: it knew
/// the old host's etcd revision from its last report (at least the writes
/// the ring had seen durable before), reports everything from the restored
/// revision up to that one as lost, and every late write in that range is
/// indeed gone (every one up to the restored revision is there).
fn honest_loss_report(
    kubeconfig: &std::path::Path,
    done: &ringd::state::Operation,
    durable_rv: u64,
    late: &[(String, i64)],
) {
    let ringd::state::OperationKind::Failover {
        seen: Some(seen), ..
    } = &done.kind
    else {
        panic!("the failover knew no revision of m1's etcd: {done:?}");
    };
    assert!(seen.revision >= durable_rv, "{seen:?} < {durable_rv}");
    let outcome = done
        .outcome
        .as_ref()
        .expect("a finished failover's figures");
    let reached = outcome.restored_revision;
    assert_eq!(
        outcome.may_lose_revisions,
        Some((seen.revision as i64).max(durable_rv as i64) - reached).map(|n| n.max(0)),
        "{outcome:?}"
    );
    assert!(outcome.may_lose_ms.is_some(), "{outcome:?}");
    assert!(
        done.detail.contains("revisions past the restore are lost"),
        "{}",
        done.detail
    );
    let names = kubectl(
        kubeconfig,
        &[
            "get",
            "configmaps",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    );
    let present: Vec<&str> = names.split_whitespace().collect();
    for (name, rv) in late {
        let there = present.contains(&name.as_str());
        if *rv <= reached {
            assert!(
                there,
                "{name}@{rv} is gone though the restore reached {reached}"
            );
        } else if *rv <= seen.revision as i64 {
            assert!(
                !there,
                "{name}@{rv} is there though the restore reached only {reached}"
            );
        }
    }
}

/// The key the ring seals its bucket with (the config's, or the one
/// bootstrap generated).
fn bucket_key(b: &Bootstrapped) -> backup::codec::EncryptionKey {
    let config = b
        .ring
        .bucket_encryption
        .clone()
        .unwrap_or(backup::EncryptionConfig {
            key_file: Some(b.layout.bucket_key()),
            ..Default::default()
        });
    backup::codec::EncryptionKey::load(&config).expect("the ring's bucket key")
}

/// Whether the bucket holds the sealed record that failover `op`'s epoch
/// began at the revision it restored; when it does, the record opens with
/// the ring's key as the shoot's and says the same as its name.
fn epoch_begin_recorded(b: &Bootstrapped, op: &ringd::state::Operation) -> bool {
    let revision = op.outcome.as_ref().map_or(0, |o| o.restored_revision);
    let name = backup::catalog::begin_name(op.epoch(), revision, true);
    let Ok(sealed) = std::fs::read(b.dir.join("bucket").join(op.shoot()).join(&name)) else {
        return false;
    };
    let plain = backup::codec::unseal(Some(&bucket_key(b)), op.shoot(), &name, &sealed)
        .unwrap_or_else(|e| panic!("{name} does not open: {e}"));
    let body: backup::catalog::EpochBeginBody =
        serde_json::from_slice(&plain).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        (body.shoot.as_str(), body.epoch, body.revision),
        (op.shoot(), op.epoch(), revision),
        "{name}"
    );
    true
}

/// kill -9 of the seed hosting a shoot's control plane in a 3-member ring: the
/// ring restores it on another member from the bucket alone, the original
/// kubeconfig answers, and every write the ring knew to be durable is there.
/// The bucket is sealed with the ring's key: no plain byte of a shoot's PKI,
/// spec or data is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_seed_fails_over_from_the_bucket() {
    let _slot = ring_tests::ring_slot();
    let keys = Sandbox::new();
    let key_file = keys.path().join("ring.key");
    std::fs::write(&key_file, "11".repeat(32)).unwrap();
    // a returned member gets its successor back after 5 s up
    let b = Bootstrapped::new(&format!(
        "bucketEncryption: {{keyFile: {}}}\ntiming: {{relinkAfterMs: 5000}}",
        key_file.display()
    ));
    let (dir, kubeconfig, ring, pki) = (&b.dir, &b.kubeconfig, &b.ring, &b.pki);

    // writes, then wait until the ring knows a durable backup covering them
    let mut last_rv = 0u64;
    for i in 0..20 {
        let out = kubectl(
            kubeconfig,
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
    wait_durable_m2(&b, last_rv).await;
    // writes right before the kill: the bucket may not have them yet
    let late: Vec<(String, i64)> = (0..5)
        .map(|i| {
            let name = format!("late-{i}");
            let out = kubectl(
                kubeconfig,
                &[
                    "create",
                    "configmap",
                    &name,
                    "-o",
                    "jsonpath={.metadata.resourceVersion}",
                ],
            );
            (name, out.trim().parse().unwrap())
        })
        .collect();
    // the control plane of m2 runs on m1: kill m1's seed (ringd and what it runs)
    b.kill("m1").await;

    let mut client = ringd::client::AdminClient::connect(&ring.member_address(1), pki).unwrap();
    let op = wait_failover_of_m2(&b).await;
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
    // the dead host's leader Leases were released (restored, never renewed)
    let reached = done.outcome.as_ref().map_or(0, |o| o.restored_revision);
    let client = kube_client(kubeconfig).await;
    let stale: Vec<_> = leader_lease_versions(&client)
        .await
        .into_iter()
        .filter(|(_, rv)| *rv <= reached)
        .collect();
    assert!(
        stale.is_empty(),
        "leader Leases of m1's control plane left: {stale:?}"
    );
    // before m3 served, the failover recorded (sealed) where its epoch begins
    assert!(
        epoch_begin_recorded(&b, &done),
        "no begin record for {done:?}"
    );

    // the original kubeconfig answers, with every write
    for i in 0..20 {
        kubectl(kubeconfig, &["get", "configmap", &format!("before-{i}")]);
    }
    eprintln!("failover: {}", done.detail);
    honest_loss_report(kubeconfig, &done, last_rv, &late);
    let fresh = kubectl(
        kubeconfig,
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

    // with the first member down, ringctl asks the others: status with an
    // explicit PKI, and a migration the leader itself refuses (with why)
    let pki_arg = pki.display().to_string();
    let status = ringctl_in(dir, &["status", "--pki", &pki_arg, "-o", "json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_ne!(status["member"], "m1", "{status}");
    let dir_arg = dir.display().to_string();
    let refused = expect_clean_failure(&ringctl_cmd(
        ["migrate", "m2", "--to", "m3", "--ring-dir", &dir_arg],
        &[],
    ));
    assert!(
        refused.contains("shoot m2 is already hosted by m3"),
        "{refused}"
    );

    // m1 comes back (its service manager restarts ringd; no bootstrap, no
    // command): the ring moves m2 home by a planned migration, nothing lost
    bootstrap::start_member(&b.layout, &ring_tests::ring::ringd_bin(), "m1").unwrap();
    let home = wait_for(
        "the ring moving m2 back to m1 by itself",
        Duration::from_secs(120),
        || async {
            let s = b.status().await?;
            s.operations
                .iter()
                .find(|o| {
                    o.is_migration()
                        && o.shoot() == "m2"
                        && o.target() == "m1"
                        && o.step == ringd::state::OperationStep::Done
                })
                .cloned()
        },
    )
    .await;
    assert_eq!(home.source(), "m3", "{home:?}");
    for name in ["after", "before-0", "before-19"] {
        kubectl(kubeconfig, &["get", "configmap", name]);
    }
    ringctl_in(dir, &["down"]);

    // everything in the bucket is sealed: snapshots, deltas, specs and PKI
    let mut objects = Vec::new();
    let mut todo = vec![dir.join("bucket")];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                objects.push(p);
            }
        }
    }
    let identity = objects
        .iter()
        .filter(|p| p.to_string_lossy().contains("/m2/identity/"))
        .count();
    assert!(
        identity >= 5,
        "m2's spec and PKI are in the bucket: {objects:?}"
    );
    for p in &objects {
        assert!(
            p.to_string_lossy().ends_with(".aesgcm"),
            "not sealed: {}",
            p.display()
        );
        let bytes = std::fs::read(p).unwrap();
        for plain in [&b"PRIVATE KEY"[..], b"CERTIFICATE", b"before-1"] {
            assert!(
                !bytes.windows(plain.len()).any(|w| w == plain),
                "{} holds {:?} in plain text",
                p.display(),
                String::from_utf8_lossy(plain)
            );
        }
    }
}

/// kill -9 of the ringd leader while a failover is under way: once the quorum is
/// back (the killed ringd restarts, as its service manager would restart it) a
/// new leader term resumes the operation from the replicated state and the
/// failover completes, with the data and the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_failover_completes_under_a_new_leader() {
    let _slot = ring_tests::ring_slot();
    let b = Bootstrapped::new("");
    let (dir, kubeconfig, layout, ring, pki) = (&b.dir, &b.kubeconfig, &b.layout, &b.ring, &b.pki);
    let rv: u64 = kubectl(
        kubeconfig,
        &[
            "create",
            "configmap",
            "kept",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    )
    .trim()
    .parse()
    .unwrap();
    let status_of = |i: usize| {
        let c = ringd::client::AdminClient::connect(&ring.member_address(i), pki);
        async move { c.ok()?.status().await.ok() }
    };
    wait_for(
        "a durable backup of the write",
        Duration::from_secs(60),
        || {
            let s = status_of(2);
            async move {
                let s = s.await?;
                let p = s.placements.iter().find(|p| p.shoot == "m2")?;
                (p.last_backup_revision? >= rv).then_some(())
            }
        },
    )
    .await;

    // m1 hosts m2's control plane: kill m1's seed
    b.kill("m1").await;
    // as soon as the failover is committed, kill whichever ringd leads
    let (op, leader, term) = wait_for("a failover of m2", Duration::from_secs(30), || {
        let (a, b) = (status_of(1), status_of(2));
        async move {
            for s in [a.await, b.await].into_iter().flatten() {
                let op = s.operations.iter().find(|o| o.shoot() == "m2").cloned();
                if let (Some(op), Some(leader)) = (op, s.leader.clone()) {
                    if leader != "m1" {
                        return Some((op, leader, s.term));
                    }
                }
            }
            None
        }
    })
    .await;
    assert!(!op.step.is_finished(), "caught too late: {op:?}");
    b.kill(&leader).await;
    bootstrap::start_member(layout, &ring_tests::ring::ringd_bin(), &leader).unwrap();

    let survivor = ring
        .members
        .iter()
        .position(|m| m.name != "m1" && m.name != leader)
        .unwrap();
    let mut client =
        ringd::client::AdminClient::connect(&ring.member_address(survivor), pki).unwrap();
    let done = client
        .wait_operation(op.id, Duration::from_secs(180), |_, _| {})
        .await
        .unwrap();
    assert_eq!(done.step, ringd::state::OperationStep::Done, "{done:?}");
    let outcome = done
        .outcome
        .clone()
        .expect("the target reports its figures");
    assert!(outcome.restored_revision >= rv as i64, "{done:?}");
    assert_eq!(outcome.rpo_revisions, Some(0), "{done:?}");
    assert!(
        outcome.objects.get("configmaps").copied().unwrap_or(0) >= 1,
        "{done:?}"
    );
    let after = client.status().await.unwrap();
    assert!(
        after.term > term,
        "no new leader term: {term} -> {}",
        after.term
    );
    assert_eq!(
        kubectl(kubeconfig, &["get", "configmap", "kept", "-o", "name"]).trim(),
        "configmap/kept"
    );
    ringctl_in(dir, &["down"]);
}

/// Waits for the ring to open a failover of shoot m2; returns it.
async fn wait_failover_of_m2(b: &Bootstrapped) -> ringd::state::Operation {
    wait_for("a failover of m2", Duration::from_secs(30), || async {
        let s = b.status().await?;
        s.operations.iter().find(|o| o.shoot() == "m2").cloned()
    })
    .await
}

/// Waits until the ring knows a durable backup of m2 at `rv` or later.
async fn wait_durable_m2(b: &Bootstrapped, rv: u64) {
    wait_for(
        "a durable backup of m2's writes",
        Duration::from_secs(60),
        || async {
            let s = b.status().await?;
            let p = s.placements.iter().find(|p| p.shoot == "m2")?;
            (p.last_backup_revision? >= rv).then_some(())
        },
    )
    .await;
}

/// Flips one byte in the middle of every full snapshot under `prefix`;
/// returns each one's path and good bytes.
fn damage_every_full_snapshot(prefix: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let fulls: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(prefix)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("full-")
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    assert!(
        !fulls.is_empty(),
        "no full snapshot in {}",
        prefix.display()
    );
    for (path, good) in &fulls {
        let mut bad = good.clone();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        std::fs::write(path, bad).unwrap();
    }
    fulls
}

/// Every full snapshot of m2 in the bucket is damaged when its host dies:
/// the failover's restore has none to fall back on, and its target ends the
/// operation as failed with the reason (which object, what is wrong) instead
/// of retrying it until the operation's 20-minute deadline. The leader
/// chooses again by itself (another member at once, the failed target after
/// `RETRY_FAILED_MS`): once the good objects are back, the shoot serves with
/// its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_with_every_snapshot_damaged_fails_the_failover_with_the_reason() {
    let _slot = ring_tests::ring_slot();
    let b = Bootstrapped::new("");
    let rv = kubectl(
        &b.kubeconfig,
        &[
            "create",
            "configmap",
            "kept",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    );
    wait_durable_m2(&b, rv.trim().parse().unwrap()).await;

    let prefix = b.dir.join("bucket").join("m2");
    let fulls = damage_every_full_snapshot(&prefix);
    b.kill("m1").await;

    let first = wait_failover_of_m2(&b).await;
    let mut client =
        ringd::client::AdminClient::connect(&b.ring.member_address(1), &b.pki).unwrap();
    let failed = client
        .wait_operation(first.id, Duration::from_secs(120), |_, _| {})
        .await
        .expect("the failover ends");
    assert_eq!(
        failed.step,
        ringd::state::OperationStep::Failed,
        "{failed:?}"
    );
    let damaged = fulls.iter().any(|(p, _)| {
        failed
            .detail
            .contains(&*p.file_name().unwrap().to_string_lossy())
    });
    assert!(
        damaged
            && failed
                .detail
                .contains("no other full snapshot to fall back on"),
        "the reason names a damaged object: {}",
        failed.detail
    );

    let begins = std::fs::read_dir(&prefix)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy()
                .ends_with(&format!("-e{}.json.aesgcm", failed.epoch()))
        })
        .count();
    assert_eq!(
        begins, 0,
        "the failed failover never served: no record of its epoch"
    );

    // the operator puts the good objects back: the ring recovers by itself
    for (path, good) in &fulls {
        std::fs::write(path, good).unwrap();
    }
    let done = wait_for(
        "a later failover of m2 that completes",
        Duration::from_secs(180),
        || async {
            let s = b.status().await?;
            s.operations
                .iter()
                .find(|o| {
                    o.shoot() == "m2"
                        && o.id != first.id
                        && o.step == ringd::state::OperationStep::Done
                })
                .cloned()
        },
    )
    .await;
    assert!(done.detail.contains("restored revision"), "{}", done.detail);
    assert!(
        epoch_begin_recorded(&b, &done),
        "no begin record for {done:?}"
    );
    kubectl(&b.kubeconfig, &["get", "configmap", "kept"]);
    ringctl_in(&b.dir, &["down"]);
}
