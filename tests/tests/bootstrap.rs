//! `ringctl bootstrap` / `down` end to end: a self-hosting ring of 3 real members
//! from an empty dir, each hosting its successor's real control plane.

use std::path::Path;

use ring_tests::*;

fn ringctl_ok(args: &[&str], dir: &Path) -> String {
    ringctl_in(dir, args)
}

#[test]
fn bootstrap_kubectl_rerun_grow_shrink_down_and_up_keep_data() {
    let _slot = ring_tests::ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let config = ring_config(sandbox.path(), 3);

    let config_arg = config.display().to_string();
    let out = ringctl_ok(&["bootstrap", "-o", "json", "--config", &config_arg], &dir);
    let report: serde_json::Value = serde_json::from_str(&out).expect("json report");
    assert_eq!(report["changed"], true);
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
    let up = ringctl_ok(&["bootstrap"], &dir);
    assert!(up.contains("is up"), "{up}");
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
    ringctl_ok(&["down"], &dir);
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
