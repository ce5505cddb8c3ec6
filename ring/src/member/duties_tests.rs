//! Table-driven tests of the member's duties: leases, serving, moved placements,
//! a returning member (the steps of moves are in `duties_move_tests.rs`).
#![allow(clippy::type_complexity)] // the tables of cases spell their columns out

use super::*;
use crate::state::RingCommand;

#[path = "duties_move_tests.rs"]
mod moves;
#[path = "duties_standby_tests.rs"]
mod standby;
use moves::{failover_from, failover_state};

const LEASE: Duration = Duration::from_secs(6);

/// a, b, c: a hosts b, b hosts c, c hosts a (all at epoch 1).
fn ring() -> RingState {
    crate::state::tests::ring3()
}

fn apply(s: &mut RingState, cmd: RingCommand) {
    s.apply(&cmd).expect("command applies");
}

fn facts(bucket: bool) -> SeedFacts {
    SeedFacts {
        moves: Ok(()),
        migrates: Ok(()),
        bucket,
        lease: LEASE,
        release_grace_ms: 10_000,
        standby: Ok(()),
    }
}

fn observed(now: Instant) -> Observed {
    let _ = now;
    Observed {
        seed: facts(true),
        wall_ms: 1_000_000,
        ..Default::default()
    }
}

/// A lease for `epoch` that ends `left` from `now`, renewed `ago` before.
fn lease(now: Instant, epoch: u64, left: Duration, renew_in: Duration) -> HeldLease {
    HeldLease {
        epoch,
        valid_until: now + left,
        renew_at: now + renew_in,
    }
}

fn serving() -> ShootSeen {
    ShootSeen {
        serving: true,
        has_data: true,
        backup_epoch: Some(1),
        last_health: None,
        ..Default::default()
    }
}

/// The duties of member `me` about shoot b (the shoot every case moves).
fn duties_b(state: &RingState, me: &str, o: &Observed, now: Instant) -> Vec<Duty> {
    duties(state, me, o, now)
        .into_iter()
        .filter(|d| d.shoot() == "b")
        .collect()
}

fn report(shoot: &str, detail: &str) -> Duty {
    Duty::Report {
        shoot: shoot.into(),
        detail: detail.into(),
    }
}

#[test]
fn serving_follows_the_lease() {
    let now = Instant::now();
    let state = ring();
    let fresh = lease(now, 1, LEASE, LEASE / 3);
    let lapsing = lease(now, 1, LEASE / 7, Duration::ZERO);
    let checked = ShootSeen {
        last_health: Some(now),
        certificates_at: Some(now + Duration::from_secs(3600)),
        ..serving()
    };
    let certificates_due = ShootSeen {
        certificates_at: Some(now),
        ..checked.clone()
    };
    let starting = ShootSeen {
        starting: true,
        ..certificates_due.clone()
    };
    // (case, seen, lease, expected)
    let cases: Vec<(&str, Option<ShootSeen>, Option<HeldLease>, Vec<Duty>)> = vec![
        (
            "no lease yet: acquire it, do not start",
            None,
            None,
            vec![
                Duty::RenewLease {
                    shoot: "b".into(),
                    epoch: 1,
                },
                report("b", "no lease for epoch 1 yet"),
            ],
        ),
        (
            "lease held, not serving: start",
            None,
            Some(fresh),
            vec![Duty::Start {
                shoot: "b".into(),
                epoch: 1,
            }],
        ),
        (
            "serving, health due, certificates never looked at",
            Some(serving()),
            Some(fresh),
            vec![
                Duty::CheckHealth { shoot: "b".into() },
                Duty::RenewCertificates { shoot: "b".into() },
            ],
        ),
        (
            "serving, the next look at the certificates due",
            Some(certificates_due),
            Some(fresh),
            vec![Duty::RenewCertificates { shoot: "b".into() }],
        ),
        (
            "a start in flight: its certificates wait",
            Some(starting),
            Some(fresh),
            vec![],
        ),
        (
            "serving, health fresh: nothing",
            Some(checked.clone()),
            Some(fresh),
            vec![],
        ),
        (
            "lease about to lapse: fence before it ends, renew",
            Some(checked.clone()),
            Some(lapsing),
            vec![
                Duty::RenewLease {
                    shoot: "b".into(),
                    epoch: 1,
                },
                Duty::Fence {
                    shoot: "b".into(),
                    reason: "lease about to end: fenced".into(),
                },
                report("b", "lease about to end: fenced"),
            ],
        ),
        (
            "a start in flight is not started twice and keeps its detail",
            Some(ShootSeen {
                starting: true,
                ..Default::default()
            }),
            Some(fresh),
            vec![],
        ),
        (
            "a failed start waits for its retry",
            Some(ShootSeen {
                retry_start_at: Some(now + Duration::from_secs(3)),
                ..Default::default()
            }),
            Some(fresh),
            vec![],
        ),
        (
            "serving without a backup: start it",
            Some(ShootSeen {
                backup_epoch: None,
                ..checked.clone()
            }),
            Some(fresh),
            vec![Duty::StartBackup {
                shoot: "b".into(),
                epoch: 1,
            }],
        ),
        (
            "a backup writing at the placement's epoch goes on",
            Some(ShootSeen {
                backup_epoch: Some(1),
                ..checked.clone()
            }),
            Some(fresh),
            vec![],
        ),
        (
            "a backup writing at an older epoch than the placement's: stop it (the next round starts it at the new one)",
            Some(ShootSeen {
                backup_epoch: Some(0),
                ..checked.clone()
            }),
            Some(fresh),
            vec![Duty::StopBackup { shoot: "b".into() }],
        ),
        (
            "a backup left running after serving stopped: stop it",
            Some(ShootSeen {
                serving: false,
                backup_epoch: Some(1),
                ..Default::default()
            }),
            Some(fresh),
            vec![
                Duty::Start {
                    shoot: "b".into(),
                    epoch: 1,
                },
                Duty::StopBackup { shoot: "b".into() },
            ],
        ),
        (
            "a lease of an older epoch does not count",
            None,
            Some(lease(now, 0, LEASE, LEASE)),
            vec![
                Duty::RenewLease {
                    shoot: "b".into(),
                    epoch: 1,
                },
                report("b", "no lease for epoch 1 yet"),
            ],
        ),
    ];
    for (case, seen, held, want) in cases {
        let mut o = observed(now);
        if let Some(seen) = seen {
            o.shoots.insert("b".into(), seen);
        }
        if let Some(l) = held {
            o.leases.insert("b".into(), l);
        }
        assert_eq!(duties_b(&state, "a", &o, now), want, "{case}");
    }
}

#[test]
fn a_moved_placement_is_fenced_then_released_after_the_grace() {
    let now = Instant::now();
    // a died; its shoot b failed over to c, done
    let state = failover_state(Some(OperationStep::Done));
    let moved = "moved to c at epoch 2";
    let mut o = observed(now);
    o.release_due = true;
    o.shoots.insert("b".into(), serving());
    o.leases.insert("b".into(), lease(now, 1, LEASE, LEASE));
    let first = duties_b(&state, "a", &o, now);
    assert_eq!(
        first,
        vec![
            Duty::Fence {
                shoot: "b".into(),
                reason: moved.into()
            },
            report("b", moved),
        ],
        "the old host fences at once (backup first) and keeps the data while it serves"
    );

    // a returning member: the seed holds b's data from before, nothing runs
    let returning = ShootSeen {
        has_data: true,
        ..Default::default()
    };
    let wall = o.wall_ms;
    let cases: Vec<(&str, Option<(u64, u64)>, Vec<Duty>)> = vec![
        (
            "first seen gone: start the release clock",
            None,
            vec![Duty::MarkMoved {
                shoot: "b".into(),
                epoch: 2,
            }],
        ),
        ("within the grace: keep", Some((2, wall - 9_999)), vec![]),
        (
            "grace over: release",
            Some((2, wall - 10_000)),
            vec![Duty::ReleaseData { shoot: "b".into() }],
        ),
        (
            "a clock of an older epoch restarts",
            Some((1, wall - 50_000)),
            vec![Duty::MarkMoved {
                shoot: "b".into(),
                epoch: 2,
            }],
        ),
    ];
    for (case, released, release) in cases {
        let mut o = o.clone();
        o.shoots.insert(
            "b".into(),
            ShootSeen {
                released,
                ..returning.clone()
            },
        );
        let mut want = vec![report("b", moved)];
        want.extend(release);
        assert_eq!(duties_b(&state, "a", &o, now), want, "{case}");
    }
}

#[test]
fn data_needed_again_stops_the_release_clock() {
    let now = Instant::now();
    let state = ring();
    let mut o = observed(now);
    o.release_due = true;
    o.shoots.insert(
        "b".into(),
        ShootSeen {
            has_data: true,
            released: Some((1, 5)),
            ..Default::default()
        },
    );
    o.leases.insert("b".into(), lease(now, 1, LEASE, LEASE));
    let got = duties_b(&state, "a", &o, now);
    assert!(
        got.contains(&Duty::KeepData { shoot: "b".into() }),
        "{got:?}"
    );
    assert!(!got.iter().any(|d| matches!(d, Duty::ReleaseData { .. })));
}

#[test]
fn a_member_without_placements_or_data_has_nothing_to_do() {
    let now = Instant::now();
    let state = ring();
    let mut o = observed(now);
    o.release_due = true;
    // b hosts c; ask for a member that hosts nothing
    assert!(duties(&state, "x", &o, now).is_empty());
    // data of a shoot the ring does not know is left alone
    o.shoots.insert(
        "zz".into(),
        ShootSeen {
            has_data: true,
            ..Default::default()
        },
    );
    assert_eq!(
        duties(&state, "x", &o, now),
        vec![report("zz", "no such shoot in the ring")]
    );
}
