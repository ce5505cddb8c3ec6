//! Table-driven tests of the member's duties in moves: a migration's source
//! and target step by step, a failover's target, a target that loses its
//! lease, retries, stale facts and seeds that cannot move.

use super::*;

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
    let state = migration_state(false);
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
                backup_epoch: Some(1),
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
                backup_epoch: running.then_some(epoch),
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
    // before the handover the target has no part yet
    let o = observed(Instant::now());
    assert!(duties_b(&migration_state(false), "c", &o, Instant::now())
        .iter()
        .all(|d| !matches!(d, Duty::Target { .. })));
    assert_eq!(
        target_walk(&migration_state(true), 0, 2),
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

/// b's control plane moving from a to c (operation 0), before or after the
/// source reported its handover at revision 42.
fn migration_state(handover_ready: bool) -> RingState {
    let mut state = ring();
    apply(
        &mut state,
        RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        },
    );
    if handover_ready {
        apply(
            &mut state,
            RingCommand::HandoverReady {
                id: 0,
                revision: 42,
                at_ms: 2,
            },
        );
    }
    state
}

pub(super) fn failover_state(step: Option<OperationStep>) -> RingState {
    failover_from(ring(), step, false)
}

/// `state` after a (promoting) failover of b from a (marked down) to c, at
/// `step` (none: waiting for the old lease).
pub(super) fn failover_from(
    mut state: RingState,
    step: Option<OperationStep>,
    promote: bool,
) -> RingState {
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
            seen: None,
            promote,
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

/// `o` with the target's facts of failover 0.
fn with_target_facts(o: &Observed, fetched: bool, restored: bool) -> Observed {
    let mut o = o.clone();
    o.shoots.insert(
        "b".into(),
        ShootSeen {
            operation: Some(OperationSeen {
                id: 0,
                facts: OperationFacts::Target {
                    fetched,
                    restored,
                    running: false,
                },
                retry_at: None,
                verified: false,
            }),
            ..Default::default()
        },
    );
    o
}

#[test]
fn a_failover_target_restores_while_the_old_lease_runs_out_and_serves_only_after_it() {
    let now = Instant::now();
    let o = observed(now);
    let waiting = failover_state(None);
    assert_eq!(
        duties_b(&waiting, "c", &o, now),
        vec![report("b", "operation in progress at epoch 2")],
        "nothing before the target's facts are observed"
    );
    // while the old lease may still run: the restore from the bucket, and
    // nothing after it (no lease, no start)
    let early = duties_b(&waiting, "c", &with_target_facts(&o, false, false), now);
    assert_eq!(
        early[0],
        Duty::Target {
            op: 0,
            shoot: "b".into(),
            epoch: 2,
            action: TargetAction::Fetch
        },
        "{early:?}"
    );
    let restored = duties_b(&waiting, "c", &with_target_facts(&o, true, true), now);
    assert!(
        !restored.iter().any(|d| matches!(
            d,
            Duty::Target { .. } | Duty::BeginRestore { .. } | Duty::RenewLease { .. }
        )),
        "restored early, the target waits for the old lease: {restored:?}"
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
        backup_epoch: Some(2),
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
    let migration = migration_state(true);
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
