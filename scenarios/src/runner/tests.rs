//! Tests of the runner's pure parts: convergence, failover steps, names.

use super::*;
use ringd::state::{MemberState, Operation};
use ringd::status::{MemberStatus, PlacementStatus};

#[test]
fn a_drill_dir_keeps_a_kubernetes_member_s_node_within_kubelet_s_socket_limit() {
    assert_eq!(short_name("kill-seed"), "kill-seed");
    assert_eq!(
        short_name("leader-dies-mid-kubernetes-failover"),
        "leader-dies-mid"
    );
    assert_eq!(short_name("abcdefghijklmno-x"), "abcdefghijklmno");
    // the longest drill name and pid there can be, a member prefix of 7, under /tmp
    let dir = format!(
        "/tmp/ring-drill-{}-{}-{}/seed-{}/node",
        short_name(&"a".repeat(63)),
        4_194_304,
        999_999,
        "memberp9"
    );
    assert!(dir.len() <= seed::node::config::MAX_STATE_DIR_LEN, "{dir}");
}

fn status(hosts: &[(&str, &str)], ready: bool) -> RingStatus {
    RingStatus {
        member: "a1".into(),
        id: 1,
        role: "Leader".into(),
        leader: Some("a1".into()),
        term: 1,
        commit_index: 1,
        applied_index: 1,
        quorum_contact: true,
        members: ["a1", "a2", "a3"]
            .iter()
            .map(|m| MemberStatus {
                name: m.to_string(),
                id: 1,
                address: String::new(),
                state: MemberState::Up,
                voter: true,
                leader: *m == "a1",
                last_report_ms_ago: None,
            })
            .collect(),
        placements: hosts
            .iter()
            .map(|(shoot, host)| PlacementStatus {
                shoot: shoot.to_string(),
                host: host.to_string(),
                epoch: 1,
                lease_expires_in_ms: None,
                last_backup_age_ms: None,
                last_backup_revision: None,
                ready: Some(ready),
                versions: Default::default(),
                standby: None,
            })
            .collect(),
        hosted: vec![],
        operations: vec![],
        protection: Default::default(),
        certificates: vec![],
    }
}

#[test]
fn converged_means_every_member_hosts_its_successor() {
    let members: Vec<String> = ["a1", "a2", "a3"].iter().map(|s| s.to_string()).collect();
    let good = [("a2", "a1"), ("a3", "a2"), ("a1", "a3")];
    assert!(converged(&status(&good, true), &members));
    assert!(!converged(&status(&good, false), &members), "not ready");
    let moved = [("a2", "a3"), ("a3", "a2"), ("a1", "a3")];
    assert!(!converged(&status(&moved, true), &members));
    let mut s = status(&good, true);
    s.members[1].state = MemberState::Down;
    assert!(!converged(&s, &members), "a member is down");
}

#[test]
fn failover_steps_count_once_reached_and_only_after_the_fault() {
    let mut s = status(&[], true);
    // built from JSON, as `ringctl status -o json` shows it
    let op = |step: &str, created_at_ms: u64| -> Operation {
        serde_json::from_value(serde_json::json!({
            "id": 1, "kind": "failover", "shoot": "a2", "from": "a1", "to": "a3",
            "epoch": 2, "not_before_ms": 0, "step": step, "detail": "",
            "createdAtMs": created_at_ms, "updatedAtMs": created_at_ms,
        }))
        .unwrap()
    };
    s.operations.push(op("Restoring", 10_000));
    assert!(failover_reached(&s, 9_000, Step::Pending));
    assert!(failover_reached(&s, 9_000, Step::Restoring));
    assert!(!failover_reached(&s, 9_000, Step::Done));
    assert!(
        !failover_reached(&s, 20_000, Step::Pending),
        "an older failover"
    );
    s.operations[0] = op("Failed", 10_000);
    assert!(!failover_reached(&s, 9_000, Step::WaitingForLeaseExpiry));
}

#[test]
fn a_target_serves_once_its_report_names_the_shoot_of_an_open_failover() {
    let op = |step: &str| -> Operation {
        serde_json::from_value(serde_json::json!({
            "id": 1, "kind": "failover", "shoot": "a2", "from": "a1", "to": "a3",
            "epoch": 2, "not_before_ms": 0, "step": step, "detail": "",
            "createdAtMs": 10_000, "updatedAtMs": 10_000,
        }))
        .unwrap()
    };
    // (placement host, reported ready, step, since) -> serves?
    let cases = [
        (
            "started, verifying",
            "a3",
            Some(false),
            "Restoring",
            9_000,
            true,
        ),
        ("not started yet", "a3", None, "Restoring", 9_000, false),
        (
            "on another host",
            "a1",
            Some(true),
            "Restoring",
            9_000,
            false,
        ),
        ("done already", "a3", Some(true), "Done", 9_000, false),
        (
            "an older failover",
            "a3",
            Some(true),
            "Restoring",
            20_000,
            false,
        ),
    ];
    for (name, host, ready, step, since, want) in cases {
        let mut s = status(&[("a2", host)], true);
        s.placements[0].ready = ready;
        s.operations.push(op(step));
        assert_eq!(faults::target_serves(&s, since), want, "{name}");
    }
}

#[test]
fn a_restore_report_names_each_move_into_pods_once() {
    let report = serde_json::json!({"steps": [
        ["restore dr1 from the bucket onto dr3", 1.1],
        ["move dr1 off dr3 to dr2", 8.4],
        ["move dr1 into pods on dr3", 20.0],
        ["start control planes", 0.4],
        ["move dr1 into pods on dr3", 2.0],
        ["move dr2 into pods on dr1", 18.0],
        ["move dr1 off dr2 to dr3; move dr3 into pods on dr2", 16.0],
    ]});
    let text = faults::pivots(report.to_string().as_bytes());
    assert_eq!(
        text,
        "; then moved dr1 into pods on dr3, dr2 into pods on dr1, dr3 into pods on dr2"
    );
    // a process-hosted restore moves nothing; a report that is not JSON says nothing
    let plain = serde_json::json!({"steps": [["start control planes", 7.4]]});
    assert_eq!(faults::pivots(plain.to_string().as_bytes()), "");
    assert_eq!(faults::pivots(b"error: no"), "");
}
