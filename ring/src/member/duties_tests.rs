//! Table-driven tests of the member's duties: every step of a failover and a
//! migration, leases about to lapse, moved placements, a returning member.
#![allow(clippy::type_complexity)] // the tables of cases spell their columns out

use super::*;
use crate::state::RingCommand;

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
        backup_running: true,
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
        ..serving()
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
            "serving, health due",
            Some(serving()),
            Some(fresh),
            vec![Duty::CheckHealth { shoot: "b".into() }],
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
                backup_running: false,
                ..checked.clone()
            }),
            Some(fresh),
            vec![Duty::StartBackup { shoot: "b".into() }],
        ),
        (
            "a backup left running after serving stopped: stop it",
            Some(ShootSeen {
                serving: false,
                backup_running: true,
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

/// Applies what the source's and target's steps do to their observed facts.
fn source_walk(view: &mut SourceView, action: SourceAction) {
    match action {
        SourceAction::StopWriters => view.writers_running = false,
        SourceAction::StartEtcd => view.etcd_running = true,
        SourceAction::TakeSnapshot => view.snapshot_taken = true,
        SourceAction::StopEtcd => view.etcd_running = false,
        SourceAction::ReportHandover => view.handover_recorded = true,
        SourceAction::Wait => {}
    }
}

#[test]
fn a_migration_source_drains_snapshots_and_hands_over_without_fencing_itself() {
    let now = Instant::now();
    let mut state = ring();
    apply(
        &mut state,
        RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        },
    );
    let mut view = SourceView {
        writers_running: true,
        etcd_running: true,
        ..Default::default()
    };
    let mut seen_actions = Vec::new();
    for _ in 0..10 {
        let mut o = observed(now);
        o.shoots.insert(
            "b".into(),
            ShootSeen {
                operation: Some(OperationSeen {
                    id: 0,
                    facts: OperationFacts::Source(view),
                    retry_at: None,
                    verified: false,
                }),
                serving: true,
                backup_running: true,
                last_health: Some(now),
                ..Default::default()
            },
        );
        o.leases
            .insert("b".into(), lease(now, 1, LEASE, Duration::ZERO));
        let got = duties_b(&state, "a", &o, now);
        // the source neither renews nor fences: it drives its control plane itself
        assert!(
            got.iter()
                .all(|d| matches!(d, Duty::Source { .. } | Duty::StopBackup { .. })),
            "{got:?}"
        );
        let Some(Duty::Source { action, op, .. }) = got.first().cloned() else {
            break;
        };
        assert_eq!(op, 0);
        seen_actions.push(action);
        source_walk(&mut view, action);
    }
    assert_eq!(
        seen_actions,
        vec![
            SourceAction::StopWriters,
            SourceAction::TakeSnapshot,
            SourceAction::StopEtcd,
            SourceAction::ReportHandover
        ]
    );
}

/// The target's walk through a move: each step's duty, then its effect.
fn target_walk(state: &RingState, op: u64, epoch: u64) -> Vec<TargetAction> {
    let now = Instant::now();
    let (mut fetched, mut restored, mut running, mut verified) = (false, false, false, false);
    let mut held: Option<HeldLease> = None;
    let mut actions = Vec::new();
    for _ in 0..10 {
        let mut o = observed(now);
        o.shoots.insert(
            "b".into(),
            ShootSeen {
                operation: Some(OperationSeen {
                    id: op,
                    facts: OperationFacts::Target {
                        fetched,
                        restored,
                        running,
                    },
                    retry_at: None,
                    verified,
                }),
                serving: running,
                backup_running: running,
                ..Default::default()
            },
        );
        if let Some(l) = held {
            o.leases.insert("b".into(), l);
        }
        let got = duties_b(state, "c", &o, now);
        let target: Vec<&Duty> = got
            .iter()
            .filter(|d| matches!(d, Duty::Target { .. }))
            .collect();
        assert_eq!(target.len(), 1, "{got:?}");
        // the target renews only once it acquired the new epoch's lease
        let renews = got.iter().any(|d| matches!(d, Duty::RenewLease { .. }));
        assert_eq!(renews, held.is_some(), "{got:?}");
        let Duty::Target {
            action, epoch: e, ..
        } = target[0].clone()
        else {
            unreachable!()
        };
        assert_eq!(e, epoch);
        actions.push(action);
        match action {
            TargetAction::Fetch => fetched = true,
            TargetAction::Restore => restored = true,
            TargetAction::AcquireLease => held = Some(lease(now, epoch, LEASE, Duration::ZERO)),
            TargetAction::Start => running = true,
            TargetAction::Verify => verified = true,
            TargetAction::Complete => break,
        }
    }
    actions
}

#[test]
fn a_migration_target_fetches_restores_leases_starts_verifies_completes() {
    let mut state = ring();
    apply(
        &mut state,
        RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        },
    );
    // before the handover the target has no part yet
    let o = observed(Instant::now());
    assert!(duties_b(&state, "c", &o, Instant::now())
        .iter()
        .all(|d| !matches!(d, Duty::Target { .. })));
    apply(
        &mut state,
        RingCommand::HandoverReady {
            id: 0,
            revision: 42,
            at_ms: 2,
        },
    );
    assert_eq!(
        target_walk(&state, 0, 2),
        vec![
            TargetAction::Fetch,
            TargetAction::Restore,
            TargetAction::AcquireLease,
            TargetAction::Start,
            TargetAction::Verify,
            TargetAction::Complete
        ]
    );
}

fn failover_state(step: Option<OperationStep>) -> RingState {
    let mut state = ring();
    apply(
        &mut state,
        RingCommand::MarkDown {
            member: "a".into(),
            at_ms: 1,
        },
    );
    apply(
        &mut state,
        RingCommand::StartFailover {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
            not_before_ms: 1,
        },
    );
    if let Some(step) = step {
        apply(
            &mut state,
            RingCommand::AdvanceOperation {
                id: 0,
                step,
                detail: String::new(),
                at_ms: 2,
                outcome: None,
            },
        );
    }
    state
}

#[test]
fn a_failover_target_waits_for_the_old_lease_then_restores_from_the_bucket() {
    let now = Instant::now();
    let o = observed(now);
    let waiting = failover_state(None);
    assert_eq!(
        duties_b(&waiting, "c", &o, now),
        vec![report("b", "operation in progress at epoch 2")],
        "nothing starts while the old lease may still run"
    );
    let pending = failover_state(Some(OperationStep::Pending));
    assert_eq!(
        duties_b(&pending, "c", &o, now),
        vec![
            Duty::BeginRestore {
                op: 0,
                shoot: "b".into()
            },
            report("b", "operation in progress at epoch 2"),
        ]
    );
    let no_bucket = Observed {
        seed: facts(false),
        ..o.clone()
    };
    assert_eq!(
        duties_b(&pending, "c", &no_bucket, now)[0],
        report(
            "b",
            "failover 0 waits: this member has no backup bucket to restore b from"
        )
    );
    let restoring = failover_state(Some(OperationStep::Restoring));
    assert_eq!(
        target_walk(&restoring, 0, 2),
        vec![
            TargetAction::Fetch,
            TargetAction::Restore,
            TargetAction::AcquireLease,
            TargetAction::Start,
            TargetAction::Verify,
            TargetAction::Complete
        ]
    );
    // the dead old host, were it to answer, has no part and fences
    let mut old = observed(now);
    old.shoots.insert("b".into(), serving());
    assert!(duties_b(&restoring, "a", &old, now).contains(&Duty::Fence {
        shoot: "b".into(),
        reason: "moved to c at epoch 2".into()
    }));
}

/// A target whose control plane runs under the move's new epoch serves only
/// under that epoch's lease: cut off from the quorum while it verifies, or
/// restarted without the lease, it is fenced like any holder, then leases,
/// starts and verifies again.
#[test]
fn a_move_target_that_loses_its_lease_while_it_runs_is_fenced() {
    let now = Instant::now();
    let restoring = failover_state(Some(OperationStep::Restoring));
    let running = ShootSeen {
        operation: Some(OperationSeen {
            id: 0,
            facts: OperationFacts::Target {
                fetched: true,
                restored: true,
                running: true,
            },
            retry_at: None,
            verified: false,
        }),
        serving: true,
        backup_running: true,
        ..Default::default()
    };
    let fence = Duty::Fence {
        shoot: "b".into(),
        reason: "lease for epoch 2 about to end while operation 0 runs: fenced".into(),
    };
    let renew = Duty::RenewLease {
        shoot: "b".into(),
        epoch: 2,
    };
    let verify = Duty::Target {
        op: 0,
        shoot: "b".into(),
        epoch: 2,
        action: TargetAction::Verify,
    };
    // (case, lease, expected)
    let cases: Vec<(&str, Option<HeldLease>, Vec<Duty>)> = vec![
        (
            "lease fresh: verify",
            Some(lease(now, 2, LEASE, LEASE / 3)),
            vec![verify],
        ),
        (
            "lease about to end (renewals fail): fence, keep renewing",
            Some(lease(now, 2, LEASE / 7, Duration::ZERO)),
            vec![fence.clone(), renew],
        ),
        (
            "no lease (ringd restarted mid-move): fence",
            None,
            vec![fence.clone()],
        ),
        (
            "only the old epoch's lease: fence",
            Some(lease(now, 1, LEASE, LEASE / 3)),
            vec![fence],
        ),
    ];
    for (case, held, want) in cases {
        let mut o = observed(now);
        o.shoots.insert("b".into(), running.clone());
        if let Some(l) = held {
            o.leases.insert("b".into(), l);
        }
        assert_eq!(duties_b(&restoring, "c", &o, now), want, "{case}");
    }
}

#[test]
fn operation_steps_wait_for_their_retry_ignore_stale_facts_and_are_refused_by_seeds_that_cannot_move(
) {
    let now = Instant::now();
    let restoring = failover_state(Some(OperationStep::Restoring));
    let seen = |id: u64, retry_at: Option<Instant>| ShootSeen {
        operation: Some(OperationSeen {
            id,
            facts: OperationFacts::Target {
                fetched: false,
                restored: false,
                running: false,
            },
            retry_at,
            verified: false,
        }),
        ..Default::default()
    };
    let cases: Vec<(&str, ShootSeen, Result<(), String>, Vec<Duty>)> = vec![
        (
            "retry later",
            seen(0, Some(now + Duration::from_secs(2))),
            Ok(()),
            vec![],
        ),
        ("facts of another operation", seen(7, None), Ok(()), vec![]),
        (
            "retry due",
            seen(0, Some(now)),
            Ok(()),
            vec![Duty::Target {
                op: 0,
                shoot: "b".into(),
                epoch: 2,
                action: TargetAction::Fetch,
            }],
        ),
        (
            "a seed that cannot restore refuses with its reason",
            seen(0, None),
            Err("kubernetes seeds cannot restore yet".into()),
            vec![Duty::Refuse {
                op: 0,
                shoot: "b".into(),
                reason: "kubernetes seeds cannot restore yet".into(),
            }],
        ),
    ];
    for (case, seen, moves, want) in cases {
        let mut o = observed(now);
        o.seed.moves = moves;
        o.shoots.insert("b".into(), seen);
        assert_eq!(duties_b(&restoring, "c", &o, now), want, "{case}");
    }
}

/// A Kubernetes seed restores from the bucket but takes no part in planned
/// migrations yet: it refuses a migration, and walks a failover as any seed.
#[test]
fn a_seed_that_cannot_migrate_refuses_migrations_but_takes_failovers() {
    let now = Instant::now();
    let mut migration = ring();
    apply(
        &mut migration,
        RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        },
    );
    apply(
        &mut migration,
        RingCommand::HandoverReady {
            id: 0,
            revision: 42,
            at_ms: 2,
        },
    );
    let mut o = observed(now);
    let why = "c: a Kubernetes seed migrates through the ring's bucket, and there is none";
    o.seed.migrates = Err(why.into());
    o.shoots.insert("b".into(), ShootSeen::default());
    assert_eq!(
        duties_b(&migration, "c", &o, now),
        vec![Duty::Refuse {
            op: 0,
            shoot: "b".into(),
            reason: why.into(),
        }]
    );
    o.seed.bucket = true;
    let failover = failover_state(Some(OperationStep::Pending));
    let got = duties_b(&failover, "c", &o, now);
    assert_eq!(
        got[0],
        Duty::BeginRestore {
            op: 0,
            shoot: "b".into()
        },
        "{got:?}"
    );
    assert!(
        !got.iter().any(|d| matches!(d, Duty::Refuse { .. })),
        "{got:?}"
    );
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
