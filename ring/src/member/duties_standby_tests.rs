//! Table tests of the hot standby duties: the assigned member joins and
//! reports, a member no longer assigned leaves (keeping data it now serves),
//! the host keeps its etcd to the assigned standby.

use super::*;
use crate::state::Standby;

/// Ring a, b, c (a hosts b) with b's standby on `member`, `ready`.
fn with_standby(member: Option<&str>, ready: bool) -> RingState {
    let mut s = ring();
    s.placements.get_mut("b").unwrap().standby = member.map(|m| Standby {
        member: m.into(),
        ready,
        warm: false,
    });
    s
}

fn standby_duties_of(state: &RingState, me: &str, seen: ShootSeen, o: &Observed) -> Vec<Duty> {
    let mut o = o.clone();
    o.shoots.insert("b".into(), seen);
    duties_b(state, me, &o, Instant::now())
        .into_iter()
        .filter(|d| {
            matches!(
                d,
                Duty::JoinStandby { .. } | Duty::LeaveStandby { .. } | Duty::DropPeers { .. }
            )
        })
        .collect()
}

#[test]
fn the_assigned_member_joins_until_it_votes_and_a_former_one_leaves() {
    let now = Instant::now();
    let o = observed(now);
    let join = Duty::JoinStandby {
        shoot: "b".into(),
        epoch: 1,
        slot: 3,
    };
    let running = |on: bool| ShootSeen {
        standby_running: on,
        ..Default::default()
    };
    let leave = |keep| Duty::LeaveStandby {
        shoot: "b".into(),
        keep,
    };
    // (name, standby, ready, me, running) → duties
    let cases: Vec<(&str, Option<&str>, bool, &str, bool, Vec<Duty>)> = vec![
        (
            "assigned, not running",
            Some("c"),
            false,
            "c",
            false,
            vec![join.clone()],
        ),
        (
            "assigned, running, not voting",
            Some("c"),
            false,
            "c",
            true,
            vec![join.clone()],
        ),
        ("assigned and voting", Some("c"), true, "c", true, vec![]),
        (
            "assigned, voting, its etcd gone",
            Some("c"),
            true,
            "c",
            false,
            vec![join],
        ),
        (
            "assigned elsewhere, running here",
            Some("a"),
            false,
            "c",
            true,
            vec![leave(false)],
        ),
        (
            "dropped, running here",
            None,
            false,
            "c",
            true,
            vec![leave(false)],
        ),
        ("not assigned, not running", None, false, "c", false, vec![]),
    ];
    for (name, member, ready, me, on, want) in cases {
        let state = with_standby(member, ready);
        assert_eq!(
            standby_duties_of(&state, me, running(on), &o),
            want,
            "{name}"
        );
    }
    // a seed that cannot run a standby says why instead of joining
    let mut no = o.clone();
    no.seed.standby = Err("a kubernetes seed runs no hot standby yet".into());
    no.shoots.insert("b".into(), running(false));
    let state = with_standby(Some("c"), false);
    let got = duties_b(&state, "c", &no, now);
    assert!(
        got.iter().any(
            |d| matches!(d, Duty::Report { detail, .. } if detail.contains("kubernetes seed"))
        ),
        "{got:?}"
    );
    assert!(!got.iter().any(|d| matches!(d, Duty::JoinStandby { .. })));
    // after a failed step, nothing until the retry time
    let mut later = running(false);
    later.standby_retry_at = Some(now + Duration::from_secs(5));
    assert_eq!(standby_duties_of(&state, "c", later, &o), vec![]);
}

#[test]
fn a_promoting_target_keeps_its_standby_and_the_host_drops_stray_members() {
    let now = Instant::now();
    let mut o = observed(now);
    // c promotes its standby of b (the failover cleared the assignment)
    let mut state = with_standby(Some("c"), true);
    apply(
        &mut state,
        RingCommand::StartFailover {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
            not_before_ms: 1,
            seen: None,
            promote: true,
        },
    );
    let running = ShootSeen {
        standby_running: true,
        ..Default::default()
    };
    assert_eq!(standby_duties_of(&state, "c", running, &o), vec![]);

    // the host a serves b: (standby, peers seen) → drop?
    let cases: Vec<(Option<&str>, Option<Vec<Option<u64>>>, Option<Duty>)> = vec![
        (Some("c"), Some(vec![Some(3)]), None),
        (Some("c"), Some(vec![]), None),
        (Some("c"), None, None),
        (
            Some("c"),
            Some(vec![Some(3), Some(2)]),
            Some(Duty::DropPeers {
                shoot: "b".into(),
                keep: Some(3),
            }),
        ),
        (
            None,
            Some(vec![Some(3)]),
            Some(Duty::DropPeers {
                shoot: "b".into(),
                keep: None,
            }),
        ),
        (
            Some("c"),
            Some(vec![None]),
            Some(Duty::DropPeers {
                shoot: "b".into(),
                keep: Some(3),
            }),
        ),
    ];
    o.leases.insert("b".into(), lease(now, 1, LEASE, LEASE / 3));
    for (member, peers, want) in cases {
        let state = with_standby(member, true);
        let seen = ShootSeen {
            etcd_peers: peers.clone(),
            ..serving()
        };
        let got = standby_duties_of(&state, "a", seen, &o);
        assert_eq!(
            got,
            want.into_iter().collect::<Vec<_>>(),
            "{member:?} {peers:?}"
        );
    }
    // c died and came back, assigned again (not voting yet): its old voter
    // under the same id holds the quorum away; only then does it go
    let drop_all = Duty::DropPeers {
        shoot: "b".into(),
        keep: None,
    };
    for (ready, quorum, want) in [
        (false, Some(false), vec![drop_all]),
        (false, Some(true), vec![]),
        (false, None, vec![]),
        (true, Some(false), vec![]),
    ] {
        let state = with_standby(Some("c"), ready);
        let seen = ShootSeen {
            etcd_peers: Some(vec![Some(3)]),
            etcd_quorum: quorum,
            ..serving()
        };
        let got = standby_duties_of(&state, "a", seen, &o);
        assert_eq!(got, want, "ready {ready} quorum {quorum:?}");
    }
    // an etcd that lost its quorum before it became ready lists no members:
    // unknown peers count; a known single member never does
    for (peers, want) in [(None, 1), (Some(vec![]), 0)] {
        let state = with_standby(Some("c"), false);
        let seen = ShootSeen {
            etcd_peers: peers.clone(),
            etcd_quorum: Some(false),
            ..serving()
        };
        let got = standby_duties_of(&state, "a", seen, &o);
        assert_eq!(got.len(), want, "{peers:?}: {got:?}");
    }
}

#[test]
fn a_move_onto_a_seed_running_a_standby_waits_until_it_left() {
    let now = Instant::now();
    let mut o = observed(now);
    let mut state = with_standby(Some("c"), true);
    apply(
        &mut state,
        RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        },
    );
    apply(
        &mut state,
        RingCommand::HandoverReady {
            id: 0,
            revision: 10,
            at_ms: 2,
        },
    );
    for (running, want_leave, want_steps) in [(true, true, false), (false, false, true)] {
        o.shoots.insert(
            "b".into(),
            ShootSeen {
                standby_running: running,
                operation: Some(OperationSeen {
                    id: 0,
                    facts: OperationFacts::Target {
                        fetched: false,
                        restored: false,
                        running: false,
                    },
                    retry_at: None,
                    verified: false,
                }),
                ..Default::default()
            },
        );
        let got = duties_b(&state, "c", &o, now);
        let leaves = got
            .iter()
            .any(|d| matches!(d, Duty::LeaveStandby { keep: true, .. }));
        let steps = got.iter().any(|d| matches!(d, Duty::Target { .. }));
        assert_eq!(
            (leaves, steps),
            (want_leave, want_steps),
            "running {running}: {got:?}"
        );
    }
}

/// A failover promoting c's standby of b: c promotes while the old lease
/// runs out (the standby's etcd stopping takes the old host's quorum), and
/// leases, starts and serves only once it ended.
#[test]
fn a_promoting_target_promotes_while_the_old_lease_runs_out_and_starts_after() {
    let now = Instant::now();
    let at = |step, promote| failover_from(with_standby(Some("c"), true), step, promote);
    let seen = |promoted: bool| ShootSeen {
        standby_running: !promoted,
        operation: Some(OperationSeen {
            id: 0,
            facts: OperationFacts::Target {
                fetched: promoted,
                restored: promoted,
                running: false,
            },
            retry_at: None,
            verified: false,
        }),
        ..Default::default()
    };
    let steps = |state: &RingState, promoted: bool| {
        let mut o = observed(now);
        o.shoots.insert("b".into(), seen(promoted));
        duties_b(state, "c", &o, now)
            .into_iter()
            .filter(|d| {
                matches!(
                    d,
                    Duty::Target { .. } | Duty::BeginRestore { .. } | Duty::RenewLease { .. }
                )
            })
            .collect::<Vec<_>>()
    };
    let target = |action| Duty::Target {
        op: 0,
        shoot: "b".into(),
        epoch: 2,
        action,
    };
    // the old lease may still run: promote, nothing more
    assert_eq!(
        steps(&at(None, true), false),
        vec![target(TargetAction::Fetch)]
    );
    assert_eq!(
        steps(&at(None, true), true),
        vec![],
        "no lease, no start before"
    );
    // a failover restoring from the bucket waits for the lease's end
    assert_eq!(steps(&at(None, false), false), vec![]);
    // the old lease ended: begin, then lease and start the promoted data
    let begin = Duty::BeginRestore {
        op: 0,
        shoot: "b".into(),
    };
    assert_eq!(
        steps(&at(Some(OperationStep::Pending), true), true),
        vec![begin]
    );
    assert_eq!(
        steps(&at(Some(OperationStep::Restoring), true), true),
        vec![target(TargetAction::AcquireLease)]
    );
}

/// A running standby's certificates are looked at like a serving control
/// plane's, once it votes: when due, not while it joins or is not running.
#[test]
fn a_running_standby_s_certificates_are_looked_at_when_due() {
    let now = Instant::now();
    let o = observed(now);
    let renew = vec![Duty::RenewCertificates { shoot: "b".into() }];
    let seen = |running: bool, at: Option<Instant>| ShootSeen {
        standby_running: running,
        certificates_at: at,
        ..Default::default()
    };
    let later = now + Duration::from_secs(3600);
    let voting = || with_standby(Some("c"), true);
    // (name, state, seen) → duties
    let cases: Vec<(&str, RingState, ShootSeen, Vec<Duty>)> = vec![
        ("first look", voting(), seen(true, None), renew.clone()),
        ("due again", voting(), seen(true, Some(now)), renew.clone()),
        ("not due", voting(), seen(true, Some(later)), vec![]),
        ("its etcd gone", voting(), seen(false, None), vec![]),
        (
            "joining",
            with_standby(Some("c"), false),
            seen(true, None),
            vec![],
        ),
        (
            "assigned elsewhere",
            with_standby(Some("a"), true),
            seen(true, None),
            vec![],
        ),
    ];
    for (what, state, seen, want) in cases {
        let mut o = o.clone();
        o.shoots.insert("b".into(), seen);
        let got: Vec<Duty> = duties_b(&state, "c", &o, now)
            .into_iter()
            .filter(|d| matches!(d, Duty::RenewCertificates { .. }))
            .collect();
        assert_eq!(got, want, "{what}");
    }
}
