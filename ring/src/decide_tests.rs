//! Table tests of the leader's decisions: no processes, no clocks.

use super::*;
use crate::state::{OperationKind, RingState};

#[path = "decide_standby_tests.rs"]
mod standby;

const T: DecisionTiming = DecisionTiming {
    failure_window_ms: 3_000,
    lease_ms: 6_000,
    lease_margin_ms: 500,
    relink_after_ms: 30_000,
    operation_deadline_ms: 1_200_000,
    protection: Protection::Backup,
};

fn ring(names: &[&str]) -> RingState {
    let mut s = RingState::default();
    s.apply(&RingCommand::Bootstrap {
        members: names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                (
                    n.to_string(),
                    i as u64 + 1,
                    format!("127.0.0.1:{}", 7000 + i),
                )
            })
            .collect(),
        epochs: Default::default(),
        hosts: Default::default(),
    })
    .unwrap();
    s
}

/// No lease renewal seen (the default of most tables).
static NONE: BTreeMap<String, u64> = BTreeMap::new();
/// No etcd revision reported.
static NO_REVISIONS: BTreeMap<String, crate::state::SeenRevision> = BTreeMap::new();

fn reports(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(n, t)| (n.to_string(), *t)).collect()
}

/// Applies decisions until nothing changes (like the leader's loop would).
fn settle(s: &mut RingState, view: &LeaderView<'_>) -> Vec<RingCommand> {
    let mut all = Vec::new();
    for _ in 0..5 {
        let cmds = decide(s, view, &T);
        let mut changed = false;
        for c in cmds {
            if s.apply(&c).is_ok() {
                changed = true;
                all.push(c);
            }
        }
        if !changed {
            break;
        }
    }
    all
}

#[test]
fn nothing_happens_while_everyone_reports() {
    let s = ring(&["a", "b", "c"]);
    let r = reports(&[("b", 9_000), ("c", 9_500)]);
    let view = LeaderView {
        now_ms: 10_000,
        leader_since_ms: 0,
        followed: None,
        leader: "a",
        last_report_ms: &r,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    };
    assert!(decide(&s, &view, &T).is_empty());
}

#[test]
fn silence_is_counted_from_leadership_not_from_zero() {
    let s = ring(&["a", "b", "c"]);
    let r = reports(&[]);
    let view = LeaderView {
        now_ms: 10_000,
        leader_since_ms: 9_000,
        followed: None,
        leader: "a",
        last_report_ms: &r,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    };
    assert!(decide(&s, &view, &T).is_empty());
}

/// A new leader knows when it last heard from the leader it followed: that
/// member's silence counts from there, not from the election (one failure
/// window after the old leader died, not an election plus a window).
#[test]
fn the_leader_followed_before_is_silent_since_its_last_message() {
    let s = ring(&["a", "b", "c"]);
    let r = reports(&[("c", 10_900)]);
    // a leads since 9 s; it last heard from b, the old leader, at 7.5 s
    let view = LeaderView {
        now_ms: 11_000,
        leader_since_ms: 9_000,
        followed: Some(("b", 7_500)),
        leader: "a",
        last_report_ms: &r,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    };
    let cmds = decide(&s, &view, &T);
    assert!(
        matches!(cmds.first(), Some(RingCommand::MarkDown { member, .. }) if member == "b"),
        "{cmds:?}"
    );
    // c reported; without knowing b's last message, b's silence counts
    // from the election: nothing yet
    let view = LeaderView {
        followed: None,
        ..view
    };
    assert!(decide(&s, &view, &T).is_empty());
}

#[test]
fn dead_host_is_marked_down_and_its_shoot_fails_over_to_its_predecessor() {
    let mut s = ring(&["a", "b", "c"]);
    s.apply(&RingCommand::RenewLease {
        shoot: "c".into(),
        holder: "b".into(),
        epoch: 1,
        expires_at_ms: 12_000,
    })
    .unwrap();
    // the leader applied that renewal at 6 s (its clock)
    let seen = BTreeMap::from([("c".to_string(), 6_000)]);
    // b hosts c's control plane; b goes silent.
    let r = reports(&[("b", 5_000), ("c", 9_900)]);
    let view = LeaderView {
        now_ms: 10_000,
        leader_since_ms: 0,
        followed: None,
        leader: "a",
        last_report_ms: &r,
        lease_seen_ms: &seen,
        revisions: &NO_REVISIONS,
    };
    let cmds = settle(&mut s, &view);
    assert!(matches!(&cmds[0], RingCommand::MarkDown { member, .. } if member == "b"));
    // b's predecessor is a
    assert_eq!(s.placements["c"].host, "a");
    assert_eq!(s.placements["c"].epoch, 2);
    let op = s.open_operation("c").unwrap();
    // seen + lease + drift (6000 / 50) + margin
    assert!(
        matches!(&op.kind, OperationKind::Failover { from, to, not_before_ms: 12_620, .. } if from == "b" && to == "a"),
        "{op:?}"
    );
    assert_eq!(op.step, OperationStep::WaitingForLeaseExpiry);

    // after the lease (plus drift and margin) the operation becomes pending
    let r = reports(&[("b", 5_000), ("c", 12_400)]);
    for (now_ms, pending) in [(12_619, false), (12_620, true)] {
        let later = LeaderView {
            now_ms,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &seen,
            revisions: &NO_REVISIONS,
        };
        settle(&mut s, &later);
        let step = s.open_operation("c").unwrap().step;
        assert_eq!(step == OperationStep::Pending, pending, "at {now_ms}");
    }
}

/// An operation whose target takes no step (hangs, or crashes mid-step again
/// and again) ends as failed when the deadline passes, with the reason; a
/// failover is then started again on another member, passing the one that
/// got stuck over. Nothing waits for ever.
#[test]
fn an_operation_without_a_step_until_the_deadline_fails_and_the_leader_chooses_again() {
    let mut s = ring(&["a", "b", "c", "d"]);
    let r = reports(&[("a", 9_900), ("b", 1_000), ("c", 9_900), ("d", 9_900)]);
    let view = |now_ms, r| LeaderView {
        now_ms,
        leader_since_ms: 0,
        followed: None,
        leader: "a",
        last_report_ms: r,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    };
    // b dies: c's control plane goes to a (b's predecessor), which restores
    settle(&mut s, &view(10_000, &r));
    let op = s.open_operation("c").unwrap().clone();
    assert_eq!(op.target(), "a");
    s.apply(&RingCommand::AdvanceOperation {
        id: op.id,
        step: OperationStep::Restoring,
        detail: "a restores c".into(),
        at_ms: 11_000,
        outcome: None,
    })
    .unwrap();
    // a keeps reporting, but the restore never ends
    let deadline = 11_000 + T.operation_deadline_ms;
    let r = reports(&[
        ("a", deadline),
        ("b", 1_000),
        ("c", deadline),
        ("d", deadline),
    ]);
    assert!(settle(&mut s, &view(deadline - 1, &r)).is_empty());
    settle(&mut s, &view(deadline, &r));
    let failed = s.operations.iter().find(|o| o.id == op.id).unwrap();
    assert_eq!(failed.step, OperationStep::Failed);
    assert!(
        failed.detail.starts_with(
            "no step for 1200 s in Restoring (timing.operationDeadlineMs); last: a restores c"
        ),
        "{}",
        failed.detail
    );
    let again = s.open_operation("c").expect("a new failover of c");
    assert_ne!(again.target(), "a", "the stuck target is passed over");
}

/// A failover carries the newest revision the dead host's etcd was heard
/// at: from this leader's heartbeats, or, when this leader is new (the old
/// one died with the host and took the heartbeats along), from the ring's
/// backup record; the fresher of the two wins.
#[test]
fn a_failover_carries_the_freshest_etcd_revision_heard_from_the_old_host() {
    use crate::state::SeenRevision;
    let seen = |revision, at_ms| Some(SeenRevision { revision, at_ms });
    // (heartbeat heard by this leader, revision in the ring's record) -> carried
    let cases = [
        (
            "new leader: the ring's record",
            None,
            seen(120, 8_000),
            seen(120, 8_000),
        ),
        (
            "heartbeat fresher",
            seen(130, 9_500),
            seen(120, 8_000),
            seen(130, 9_500),
        ),
        (
            "record fresher",
            seen(110, 7_000),
            seen(120, 8_000),
            seen(120, 8_000),
        ),
        ("nothing heard", None, None, None),
    ];
    for (name, heartbeat, recorded, want) in cases {
        let mut s = ring(&["a", "b", "c"]);
        s.apply(&RingCommand::ReportBackup {
            shoot: "c".into(),
            revision: 100,
            at_ms: 7_900,
            seen: recorded,
        })
        .unwrap();
        let revisions: BTreeMap<String, SeenRevision> = heartbeat
            .into_iter()
            .map(|h| ("c".to_string(), h))
            .collect();
        let r = reports(&[("b", 5_000), ("c", 9_900)]);
        let view = LeaderView {
            now_ms: 10_000,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &NONE,
            revisions: &revisions,
        };
        settle(&mut s, &view);
        let op = s.open_operation("c").expect("a failover of c");
        let OperationKind::Failover { seen, .. } = &op.kind else {
            panic!("{name}: {op:?}");
        };
        assert_eq!(*seen, want, "{name}");
    }
}

/// The holder's wall clock (its `expires_at_ms`) never shortens the wait:
/// only when this leader applied the holder's last renewal counts, on the
/// leader's own clock. b's clock runs 5 s behind (its lease says it ends at
/// 7 s), or 5 s ahead (17 s); either way the replacement waits until the
/// lease b measured from its renewal surely ended. A leader that took the
/// state in at 9 s (a restart, a snapshot) counts every lease from then.
#[test]
fn an_old_lease_ends_by_the_leader_s_record_not_the_holder_s_clock() {
    // (holder's expires_at_ms, seen by this leader at, now, pending?)
    let cases = [
        ("holder 5 s behind, too early", 7_000, 6_000, 12_000, false),
        ("holder 5 s behind, over", 7_000, 6_000, 12_620, true),
        ("holder 5 s ahead, over", 17_000, 6_000, 12_620, true),
        ("state taken in at 9 s", 12_000, 9_000, 12_620, false),
        ("state taken in at 9 s, over", 12_000, 9_000, 15_620, true),
    ];
    for (name, expires_at_ms, seen_at, now_ms, pending) in cases {
        let mut s = ring(&["a", "b", "c"]);
        s.apply(&RingCommand::RenewLease {
            shoot: "c".into(),
            holder: "b".into(),
            epoch: 1,
            expires_at_ms,
        })
        .unwrap();
        let seen = BTreeMap::from([("c".to_string(), seen_at)]);
        let r = reports(&[("b", 5_000), ("c", now_ms)]);
        let view = |now_ms| LeaderView {
            now_ms,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &seen,
            revisions: &NO_REVISIONS,
        };
        settle(&mut s, &view(10_000));
        assert_eq!(
            s.open_operation("c").map(|o| o.step),
            Some(OperationStep::WaitingForLeaseExpiry),
            "{name}"
        );
        settle(&mut s, &view(now_ms));
        let step = s.open_operation("c").unwrap().step;
        assert_eq!(step == OperationStep::Pending, pending, "{name}");
    }
}

#[test]
fn returning_member_is_marked_up_but_keeps_no_placement() {
    let mut s = ring(&["a", "b", "c"]);
    let r = reports(&[("b", 1_000), ("c", 9_900)]);
    settle(
        &mut s,
        &LeaderView {
            now_ms: 10_000,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &NONE,
            revisions: &NO_REVISIONS,
        },
    );
    assert_eq!(s.member("b").unwrap().state, MemberState::Down);
    let r = reports(&[("b", 11_000), ("c", 11_000)]);
    settle(
        &mut s,
        &LeaderView {
            now_ms: 11_100,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &NONE,
            revisions: &NO_REVISIONS,
        },
    );
    assert_eq!(s.member("b").unwrap().state, MemberState::Up);
    assert_eq!(
        s.placements["c"].host, "a",
        "the zombie does not get its shoot back"
    );
}

#[test]
fn failover_whose_target_dies_is_failed_and_redone_elsewhere() {
    let mut s = ring(&["a", "b", "c", "d", "e"]);
    // c dies: d's control plane goes to b (c's predecessor)
    let r = reports(&[("b", 9_900), ("c", 1_000), ("d", 9_900), ("e", 9_900)]);
    settle(
        &mut s,
        &LeaderView {
            now_ms: 10_000,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &NONE,
            revisions: &NO_REVISIONS,
        },
    );
    assert_eq!(s.placements["d"].host, "b");
    // now b dies too (it hosted c, and is the target for d)
    let r = reports(&[("b", 10_000), ("c", 1_000), ("d", 19_900), ("e", 19_900)]);
    settle(
        &mut s,
        &LeaderView {
            now_ms: 20_000,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &NONE,
            revisions: &NO_REVISIONS,
        },
    );
    let failed: Vec<_> = s
        .operations
        .iter()
        .filter(|o| o.step == OperationStep::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", s.operations);
    for shoot in ["c", "d"] {
        let host = &s.placements[shoot].host;
        assert!(host == "a" || host == "e", "{shoot} on {host}");
        assert!(s.open_operation(shoot).is_some());
    }
}

#[test]
fn a_target_that_refused_a_failover_is_passed_over_for_a_while() {
    let mut s = ring(&["a", "b", "c", "d"]);
    // c dies: d's control plane goes to b (c's predecessor)
    let r = reports(&[("a", 9_900), ("b", 9_900), ("c", 1_000), ("d", 9_900)]);
    let view = |now_ms, r| LeaderView {
        now_ms,
        leader_since_ms: 0,
        followed: None,
        leader: "a",
        last_report_ms: r,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    };
    settle(&mut s, &view(10_000, &r));
    let op = s.open_operation("d").cloned().expect("failover of d");
    assert_eq!(op.target(), "b");
    // b is alive but cannot restore: it fails the operation itself
    s.apply(&RingCommand::AdvanceOperation {
        id: op.id,
        step: OperationStep::Failed,
        detail: "cannot restore here".into(),
        at_ms: 10_500,
        outcome: None,
    })
    .unwrap();
    let r = reports(&[("a", 10_900), ("b", 10_900), ("c", 1_000), ("d", 10_900)]);
    settle(&mut s, &view(11_000, &r));
    let again = s.open_operation("d").cloned().expect("a new failover of d");
    assert_ne!(again.target(), "b", "{again:?}");
    assert_ne!(again.id, op.id);
}

#[test]
fn no_target_without_healthy_members_other_than_the_dead() {
    let mut s = ring(&["a", "b", "c"]);
    let r = reports(&[("b", 1_000), ("c", 1_000)]);
    let cmds = settle(
        &mut s,
        &LeaderView {
            now_ms: 10_000,
            leader_since_ms: 0,
            followed: None,
            leader: "a",
            last_report_ms: &r,
            lease_seen_ms: &NONE,
            revisions: &NO_REVISIONS,
        },
    );
    // b and c down; a is the only healthy member: c's shoot (hosted by b) moves to a,
    // a's shoot (hosted by c) has only a itself as candidate and goes there too.
    assert!(
        cmds.iter()
            .filter(|c| matches!(c, RingCommand::StartFailover { .. }))
            .count()
            == 2
    );
    assert!(s
        .placements
        .values()
        .filter(|p| p.shoot != "b")
        .all(|p| p.host == "a"));
}

#[test]
fn choose_target_prefers_predecessor_then_least_loaded() {
    let s = ring(&["a", "b", "c", "d"]);
    let mut load = s.load();
    assert_eq!(choose_target(&s, "c", "d", &load, |_| true), Some("b"));
    load.insert("b", 5);
    assert_eq!(choose_target(&s, "c", "d", &load, |_| true), Some("a"));
    assert_eq!(choose_target(&s, "c", "d", &load, |m| m == "d"), Some("d"));
    assert_eq!(choose_target(&s, "c", "d", &load, |_| false), None);
}

/// b hosted c and died; c failed over to a and is done there; b came back
/// at 20 s. The view at `now_ms`, every member reporting.
fn relink_case(now_ms: u64) -> (RingState, BTreeMap<String, u64>) {
    let mut s = ring(&["a", "b", "c"]);
    let r = reports(&[("b", 5_000), ("c", 9_900)]);
    settle(&mut s, &view_at(10_000, &r));
    let id = s.open_operation("c").unwrap().id;
    let done = [
        OperationStep::Pending,
        OperationStep::Restoring,
        OperationStep::Done,
    ];
    crate::state::tests::advance(&mut s, id, &done, 12_000);
    s.apply(&RingCommand::MarkUp {
        member: "b".into(),
        at_ms: 20_000,
    })
    .unwrap();
    (s, reports(&[("b", now_ms), ("c", now_ms)]))
}

fn view_at<'a>(now_ms: u64, r: &'a BTreeMap<String, u64>) -> LeaderView<'a> {
    LeaderView {
        now_ms,
        leader_since_ms: 0,
        followed: None,
        leader: "a",
        last_report_ms: r,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    }
}

#[test]
fn a_returned_member_gets_its_successor_back_once_up_for_a_while() {
    // (now, relink after, the move the leader proposes)
    type Move<'a> = Option<(&'a str, &'a str)>;
    let cases: [(u64, u64, Move); 4] = [
        (20_100, 30_000, None),             // just back: not yet
        (49_900, 30_000, None),             // almost
        (50_000, 30_000, Some(("c", "b"))), // up for 30 s: c moves home
        (90_000, 0, None),                  // 0: left to an operator
    ];
    for (now, after, want) in cases {
        let (s, r) = relink_case(now);
        let t = DecisionTiming {
            relink_after_ms: after,
            ..T
        };
        let got: Vec<(String, String)> = decide(&s, &view_at(now, &r), &t)
            .into_iter()
            .filter_map(|c| match c {
                RingCommand::StartMigration { shoot, to, .. } => Some((shoot, to)),
                _ => None,
            })
            .collect();
        let want: Vec<(String, String)> = want
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want, "at {now} ms, relink after {after} ms");
    }
}

#[test]
fn relinking_leaves_alone_what_an_operator_moved_and_a_failed_move_back() {
    // an operator moves c on (to c's own member here: any migration after
    // the failover counts as a decision the ring must not undo)
    let (mut s, r) = relink_case(60_000);
    s.apply(&RingCommand::StartMigration {
        shoot: "c".into(),
        to: "c".into(),
        at_ms: 30_000,
    })
    .unwrap();
    // while it runs: nothing (one move at a time)
    assert!(decide(&s, &view_at(60_000, &r), &T).is_empty());
    let id = s.open_operation("c").unwrap().id;
    s.apply(&RingCommand::AdvanceOperation {
        id,
        step: OperationStep::Failed,
        detail: "target could not restore".into(),
        at_ms: 31_000,
        outcome: None,
    })
    .unwrap();
    // the newest operation of c is no longer the failover: never again by itself
    assert!(decide(&s, &view_at(60_000, &r), &T).is_empty());
    assert_eq!(s.placements["c"].host, "a");
    // a home that is silent again is not moved to
    let (s, _) = relink_case(60_000);
    let r = reports(&[("b", 10_000), ("c", 60_000)]);
    let cmds = decide(&s, &view_at(60_000, &r), &T);
    assert!(
        !cmds
            .iter()
            .any(|c| matches!(c, RingCommand::StartMigration { .. })),
        "{cmds:?}"
    );
}
