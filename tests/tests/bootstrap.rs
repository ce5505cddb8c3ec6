//! `ringctl bootstrap` / `down` end to end: a self-hosting ring of 3 real members
//! from an empty dir, each hosting its successor's real control plane.

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::path::Path;
use std::time::Duration;

use ring_tests::*;

fn ringctl_ok(args: &[&str], dir: &Path) -> String {
    ringctl_in(dir, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_kubectl_rerun_grow_shrink_down_and_up_keep_data() {
    let _slot = ring_tests::ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    // hosts look at their control planes' certificates every 2 s (1 h by default)
    let config = ring_config_with(sandbox.path(), 3, "certificateCheckSeconds: 2");

    let config_arg = config.display().to_string();
    let out = ringctl_ok(&["bootstrap", "-o", "json", "--config", &config_arg], &dir);
    let report: serde_json::Value = serde_json::from_str(&out).expect("json report");
    assert_eq!(report["changed"], true);
    // a new ring seals its bucket with a key of its own, in its state dir
    let key = dir.join("bucket.key");
    assert_eq!(report["bucketKey"], key.display().to_string(), "{report}");
    let stored = std::fs::read_to_string(dir.join("ring.yaml")).unwrap();
    assert!(
        stored.contains(&format!("keyFile: {}", key.display())),
        "{stored}"
    );
    backup::codec::EncryptionKey::parse(&std::fs::read(&key).unwrap(), "bucket.key", None)
        .expect("bucket.key holds a key");
    let placements = report["status"]["placements"].as_array().unwrap();
    // every member hosts exactly its successor's control plane
    for (shoot, host) in [("m1", "m3"), ("m2", "m1"), ("m3", "m2")] {
        let p = placements.iter().find(|p| p["shoot"] == shoot).unwrap();
        assert_eq!(p["host"], host, "{p}");
        assert_eq!(p["ready"], true, "{p}");
    }
    for shoot in ["m1", "m2", "m3"] {
        let kc = dir.join("kubeconfigs").join(format!("{shoot}.kubeconfig"));
        kubectl(
            &kc,
            &[
                "create",
                "configmap",
                "marker",
                &format!("--from-literal=shoot={shoot}"),
            ],
        );
        assert_eq!(
            kubectl(
                &kc,
                &["get", "configmap", "marker", "-o", "jsonpath={.data.shoot}"]
            ),
            shoot
        );
    }

    // a rerun reports the ring and changes nothing
    let again = ringctl_ok(&["bootstrap"], &dir);
    assert!(again.contains("was already up"), "{again}");

    // status works from the ring dir alone
    let status = ringctl_ok(&["status"], &dir);
    assert!(
        status.contains("leader m") && status.contains("m3"),
        "{status}"
    );
    assert!(status.contains("the first to expire is"), "{status}");
    assert!(!status.contains("WARNING"), "{status}");

    // every certificate's expiry: each member's own and its hosted shoot's PKI,
    // ringctl's and the kubeconfigs'; all fresh, so nothing needs attention
    let out = ringctl_ok(&["pki", "check", "-o", "json"], &dir);
    let check: serde_json::Value = serde_json::from_str(&out).expect("json check");
    assert_eq!(check["unreachable"], serde_json::json!([]), "{check}");
    let certs = check["certificates"].as_array().unwrap();
    let days_left = |owner: &str, name: &str| {
        let c = certs
            .iter()
            .find(|c| c["owner"] == owner && c["name"] == name)
            .unwrap_or_else(|| panic!("no {owner} {name}: {check}"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        (c["notAfterUnix"].as_i64().unwrap() - now) / 86_400
    };
    assert!(days_left("ring", "ca") >= 3649, "{check}");
    assert!(days_left("ringctl", "admin") >= 729, "{check}");
    for m in ["m1", "m2", "m3"] {
        assert!(
            days_left(&format!("member {m}"), "member") >= 729,
            "{check}"
        );
        let shoot = format!("shoot {m}");
        assert!(days_left(&shoot, "ca") >= 3649, "{check}");
        assert!(days_left(&shoot, "kube-apiserver") >= 729, "{check}");
        assert!(days_left(&shoot, "kubeconfig") >= 729, "{check}");
    }
    let table = ringctl_ok(&["pki", "check"], &dir);
    assert!(
        table.contains("every certificate is valid for at least 30 more days"),
        "{table}"
    );

    // renewing: nothing is due, so nothing changes; with --all every member
    // and ringctl get new certificates, and each running ringd serves and calls
    // with its new one (the command waits until each reports it in use); each
    // shoot's published kubeconfig gets a new client certificate from the
    // shoot's CA, which its API accepted before it replaced the old one
    let none = ringctl_ok(&["pki", "renew"], &dir);
    assert!(none.contains("nothing renewed"), "{none}");
    let kubeconfig = |m: &str| dir.join("kubeconfigs").join(format!("{m}.kubeconfig"));
    let before: Vec<Vec<u8>> = ["m1", "m2", "m3"]
        .iter()
        .map(|m| std::fs::read(kubeconfig(m)).unwrap())
        .collect();
    let out = ringctl_ok(&["pki", "renew", "--all", "-o", "json"], &dir);
    let renewed: serde_json::Value = serde_json::from_str(&out).expect("json renewal");
    let renewed = renewed.as_array().unwrap();
    let names: Vec<&str> = renewed
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ringctl",
            "m1",
            "m2",
            "m3",
            "kubeconfig m1",
            "kubeconfig m2",
            "kubeconfig m3"
        ],
        "{out}"
    );
    for r in renewed {
        assert_eq!(r["inUse"], true, "{out}");
        assert!(
            r["newNotAfterUnix"].as_i64() > r["oldNotAfterUnix"].as_i64(),
            "{out}"
        );
    }
    for (m, before) in ["m1", "m2", "m3"].iter().zip(before) {
        assert_ne!(
            std::fs::read(kubeconfig(m)).unwrap(),
            before,
            "{m}: unchanged"
        );
        let spaces = kubectl(&kubeconfig(m), &["get", "namespaces", "-o", "name"]);
        assert!(spaces.contains("namespace/kube-system"), "{m}: {spaces}");
    }

    // a control plane's own certificates are renewed by its host, online:
    // m2's kube-scheduler certificate on m1, with 29 days left, is reissued
    // and kube-scheduler restarted with it; the rest keeps running
    scheduler_certificate_renewed_by_its_host(&dir).await;

    // the ring CA changes online: every member ends up trusting only the new
    // CA and presenting a certificate from it; the rest of this test (joins
    // with migrations, down and up) runs on the new CA
    let ca_serials = |dir: &Path| -> Vec<String> {
        let out = ringctl_ok(&["pki", "check", "-o", "json"], dir);
        let check: serde_json::Value = serde_json::from_str(&out).expect("json check");
        let mut serials: Vec<String> = check["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["owner"] == "ring" && c["name"] == "ca")
            .map(|c| c["serial"].as_str().unwrap_or_default().to_string())
            .collect();
        serials.dedup();
        serials
    };
    let before = ca_serials(&dir);
    assert_eq!(before.len(), 1, "{before:?}");
    let steps = ringctl_ok(&["pki", "rotate-ca"], &dir);
    assert!(
        steps.contains("every member trusts only the new ring CA"),
        "{steps}"
    );
    let after = ca_serials(&dir);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(before, after, "the ring CA did not change: {steps}");
    assert!(!dir.join("pki/ca-next.crt").exists(), "{steps}");

    // grow to 5 members, then shrink to 4: after each change every member hosts
    // exactly its successor (joins and leaves re-link with planned migrations)
    let hosts_successor = |status: &serde_json::Value, order: &[&str]| {
        let placements = status["placements"].as_array().unwrap();
        for (i, shoot) in order.iter().enumerate() {
            let pred = order[(i + order.len() - 1) % order.len()];
            let p = placements
                .iter()
                .find(|p| p["shoot"] == *shoot)
                .unwrap_or_else(|| panic!("no {shoot}: {status}"));
            assert_eq!(p["host"], pred, "{shoot} should run on {pred}: {status}");
        }
        assert_eq!(placements.len(), order.len(), "{status}");
    };
    for (shoot, order) in [
        ("m4", &["m1", "m2", "m3", "m4"][..]),
        ("m5", &["m1", "m2", "m3", "m4", "m5"][..]),
    ] {
        let out = ringctl_ok(&["join", shoot, "-o", "json"], &dir);
        let status: serde_json::Value = serde_json::from_str(&out).expect("json status");
        hosts_successor(&status, order);
        let kc = dir.join("kubeconfigs").join(format!("{shoot}.kubeconfig"));
        kubectl(
            &kc,
            &[
                "create",
                "configmap",
                "marker",
                &format!("--from-literal=shoot={shoot}"),
            ],
        );
    }
    let out = ringctl_ok(&["leave", "m5", "-o", "json"], &dir);
    let status: serde_json::Value = serde_json::from_str(&out).expect("json status");
    hosts_successor(&status, &["m1", "m2", "m3", "m4"]);
    for shoot in ["m1", "m2", "m3", "m4"] {
        let kc = dir.join("kubeconfigs").join(format!("{shoot}.kubeconfig"));
        assert_eq!(
            kubectl(
                &kc,
                &["get", "configmap", "marker", "-o", "jsonpath={.data.shoot}"]
            ),
            shoot
        );
    }

    // down stops everything; bootstrap resumes with all data
    let down = ringctl_ok(&["down"], &dir);
    assert!(down.contains("stopped m1, m2, m3, m4"), "{down}");
    let left = sandbox.wait_no_processes(std::time::Duration::from_secs(15));
    assert!(left.is_empty(), "processes left after down: {left:?}");
    let up = ringctl_ok(&["bootstrap", "-o", "json"], &dir);
    let up: serde_json::Value = serde_json::from_str(&up).expect("json report");
    assert_eq!(up["changed"], true);
    // the report after a restart knows every control plane's health
    for p in up["status"]["placements"].as_array().unwrap() {
        assert_eq!(p["ready"], true, "{p}");
    }
    for shoot in ["m1", "m2", "m3"] {
        let kc = dir.join("kubeconfigs").join(format!("{shoot}.kubeconfig"));
        assert_eq!(
            kubectl(
                &kc,
                &["get", "configmap", "marker", "-o", "jsonpath={.data.shoot}"]
            ),
            shoot
        );
    }

    // a ringd that does not stop (frozen by SIGSTOP) is killed after the
    // grace, and down returns once it is gone, saying so
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let frozen = layout.running_pid("m2").expect("m2's ringd runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(frozen as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let down = ringctl_ok(&["down", "--grace", "2"], &dir);
    assert!(down.contains("stopped m1, m2, m3, m4"), "{down}");
    assert!(
        down.contains(&format!(
            "m2 (pid {frozen}) did not exit within 2 s of SIGTERM: killed"
        )),
        "{down}"
    );
    assert_eq!(
        layout.running_pid("m2"),
        None,
        "down returned before m2 was gone"
    );
    let left = sandbox.wait_no_processes(std::time::Duration::from_secs(15));
    assert!(left.is_empty(), "processes left after down: {left:?}");
}

/// Ages m2's kube-scheduler certificate on its host m1 to 29 days and waits
/// (bounded) until m1's ringd renewed it and restarted kube-scheduler.
async fn scheduler_certificate_renewed_by_its_host(dir: &Path) {
    use seed::pki::Leaf;
    use seed::{Component, Seed};
    let layout = bootstrap::RingLayout {
        dir: dir.to_path_buf(),
    };
    // m1's seed as its files show it (m1's ringd supervises the processes)
    let m1 = seed::LocalSeed::new(layout.seed_dir("m1"), binaries());
    let pki = m1.layout("m2").pki();
    let pid = |c: Component| {
        let m1 = &m1;
        async move {
            let status = m1.inspect("m2").await.expect("m1's view of m2");
            let s = status.components.into_iter().find(|s| s.component == c)?;
            s.running.then_some(s.state.pid).flatten()
        }
    };
    let before = (
        pid(Component::KubeScheduler).await,
        pid(Component::KubeApiserver).await,
    );
    assert!(before.0.is_some() && before.1.is_some(), "{before:?}");
    certs::age_leaf(
        &pki,
        Leaf::Scheduler,
        &seed::ShootEndpoint::for_shoot("m2"),
        29,
    );
    let cert = pki.leaf(Leaf::Scheduler).cert;
    let days_left = || certs::days_left(&cert);
    wait_for(
        "m1 to renew m2's kube-scheduler certificate and restart kube-scheduler",
        std::time::Duration::from_secs(60),
        || async {
            let restarted = pid(Component::KubeScheduler)
                .await
                .filter(|p| Some(*p) != before.0);
            (days_left() > 700 && restarted.is_some()).then_some(())
        },
    )
    .await;
    assert_eq!(
        pid(Component::KubeApiserver).await,
        before.1,
        "kube-apiserver kept running"
    );
}

#[test]
fn bad_ring_configs_are_refused_with_the_field() {
    let sandbox = Sandbox::new();
    let cases = [
        (
            "members: [{name: a}, {name: b}]",
            "config members: a ring needs at least 3 members",
        ),
        (
            "members: [{name: a}, {name: b}, {name: a}]",
            "members[2].name",
        ),
        (
            "members: [{name: a}, {name: b}, {name: c}]\nbucket: http://x",
            "config bucket",
        ),
        (
            "members: [{name: a}, {name: b}, {name: c}]\nextra: 1",
            "unknown field `extra`",
        ),
    ];
    for (i, (body, want)) in cases.iter().enumerate() {
        let file = sandbox.path().join(format!("ring-{i}.yaml"));
        std::fs::write(
            &file,
            format!("apiVersion: ring.gardener.cloud/v1alpha1\nkind: Ring\nname: bad\n{body}\n"),
        )
        .unwrap();
        let out = ringctl_cmd(
            [
                "bootstrap".as_ref(),
                "--config".as_ref(),
                file.as_os_str(),
                "--ring-dir".as_ref(),
                sandbox.path().join("dir").as_os_str(),
            ],
            &[],
        );
        let err = expect_clean_failure(&out);
        assert!(err.contains(want), "want {want:?} in {err}");
    }
    assert!(
        sandbox.processes().is_empty(),
        "a refused config started something"
    );
}

/// The ringd children of process `parent` (the member's supervisor).
fn ringd_children(parent: u32) -> Vec<u32> {
    let mut children = procs::processes("ringd", &[]);
    children.retain(|p| procs::parent(*p) == Some(parent));
    children
}

/// A ringd that crashes is started again by its supervisor (`ringd
/// --supervise`, which bootstrap runs), soon enough that the ring does not fail
/// over: the control plane it hosted comes back on it, at the same epoch, with
/// its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_ringd_is_restarted_by_its_supervisor_without_a_failover() {
    let _slot = ring_tests::ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let config = ring_config(sandbox.path(), 3);
    ringctl_ok(
        &["bootstrap", "--config", &config.display().to_string()],
        &dir,
    );
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let ring = layout.read_config().unwrap().unwrap();
    let pki = layout.pki();
    let m2 = dir.join("kubeconfigs/m2.kubeconfig");
    kubectl(&m2, &["create", "configmap", "before-crash"]);
    let status = || {
        let c = ringd::client::AdminClient::connect(&ring.member_address(1), &pki);
        async move { c.ok()?.status().await.ok() }
    };
    let before = status().await.expect("member m2 answers status");
    let placement = |s: &ringd::status::RingStatus| {
        let p = s.placements.iter().find(|p| p.shoot == "m2").cloned();
        p.map(|p| (p.host, p.epoch))
    };
    assert_eq!(placement(&before).unwrap().0, "m1", "m1 hosts m2");
    let last_op = before.operations.iter().map(|o| o.id).max();

    let supervisor = layout.running_pid("m1").expect("m1's supervisor runs");
    let children = ringd_children(supervisor);
    assert_eq!(
        children.len(),
        1,
        "one ringd under m1's supervisor: {children:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(children[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let crashed = children[0];
    let restarted = wait_for("a new ringd m1", Duration::from_secs(30), || {
        let now = ringd_children(supervisor);
        async move { now.into_iter().find(|p| *p != crashed) }
    })
    .await;
    assert_eq!(
        layout.running_pid("m1"),
        Some(supervisor),
        "the supervisor lives on"
    );

    // m2's API answers again from m1, with the data, and takes writes
    wait_for("shoot m2 answering again", Duration::from_secs(90), || {
        let mut get = std::process::Command::new(kubectl_path());
        get.arg("--kubeconfig")
            .arg(&m2)
            .args(["get", "configmap", "before-crash", "-o", "name"]);
        let ok = run_bounded(&mut get, Duration::from_secs(20))
            .status
            .success();
        async move { ok.then_some(()) }
    })
    .await;
    kubectl(&m2, &["create", "configmap", "after-crash"]);
    let after = status().await.expect("member m2 answers status");
    assert_eq!(
        placement(&after),
        placement(&before),
        "m2 stayed on m1 at its epoch"
    );
    let failovers: Vec<_> = after
        .operations
        .iter()
        .filter(|o| Some(o.id) > last_op && o.shoot() == "m2")
        .collect();
    assert!(failovers.is_empty(), "no operation on m2: {failovers:?}");
    let log = std::fs::read_to_string(layout.log("m1")).unwrap();
    assert!(
        log.contains("exited; restarting"),
        "the supervisor logged the restart"
    );
    assert!(seed::process::pid_alive(restarted), "the new ringd runs");
    ringctl_ok(&["down"], &dir);
    assert!(
        ringd_children(supervisor).is_empty(),
        "down stops the child too"
    );
}
