use super::*;

pub(crate) fn ring3() -> RingState {
    let mut s = RingState::default();
    s.apply(&RingCommand::Bootstrap {
        members: vec![
            ("a".into(), 1, "127.0.0.1:1".into()),
            ("b".into(), 2, "127.0.0.1:2".into()),
            ("c".into(), 3, "127.0.0.1:3".into()),
        ],
        epochs: Default::default(),
        hosts: Default::default(),
    })
    .unwrap();
    s
}

/// Moves operation `id` through `steps`, each at `at_ms`.
pub(crate) fn advance(s: &mut RingState, id: u64, steps: &[OperationStep], at_ms: u64) {
    for step in steps {
        s.apply(&RingCommand::AdvanceOperation {
            id,
            step: *step,
            detail: String::new(),
            at_ms,
            outcome: None,
        })
        .unwrap();
    }
}

/// Member a dies at 5 s; shoot b, which it hosted, fails over to c.
fn fail_b_over_to_c(s: &mut RingState) {
    s.apply(&RingCommand::MarkDown {
        member: "a".into(),
        at_ms: 5_000,
    })
    .unwrap();
    s.apply(&RingCommand::StartFailover {
        shoot: "b".into(),
        to: "c".into(),
        at_ms: 5_000,
        not_before_ms: 6_000,
        seen: None,
        promote: false,
    })
    .unwrap();
}

#[test]
fn bootstrap_makes_each_member_host_its_successor_once() {
    let s = ring3();
    assert_eq!(s.placements["b"].host, "a");
    assert_eq!(s.placements["c"].host, "b");
    assert_eq!(s.placements["a"].host, "c");
    assert!(s
        .placements
        .values()
        .all(|p| p.epoch == 1 && p.lease.is_none()));
    let mut again = s.clone();
    assert!(again
        .apply(&RingCommand::Bootstrap {
            members: vec![],
            epochs: Default::default(),
            hosts: Default::default(),
        })
        .is_err());
    assert_eq!(again, s);
    assert_eq!(s.predecessor("a").unwrap().name, "c");
}

/// A ring created with first hosts: the shoots named start there, the others
/// on their predecessor; a host (or shoot) that is not a member is refused
/// and leaves the ring uncreated.
#[test]
fn bootstrap_places_shoots_on_their_first_hosts() {
    let members: Vec<(String, u64, String)> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, m)| (m.to_string(), i as u64 + 1, format!("127.0.0.1:{i}")))
        .collect();
    let boot = |hosts: &[(&str, &str)]| RingCommand::Bootstrap {
        members: members.clone(),
        epochs: Default::default(),
        hosts: hosts
            .iter()
            .map(|(s, h)| (s.to_string(), h.to_string()))
            .collect(),
    };
    let mut s = RingState::default();
    s.apply(&boot(&[("a", "b"), ("c", "b")])).unwrap();
    let host = |s: &RingState, shoot: &str| s.placements[shoot].host.clone();
    assert_eq!(
        ["a", "b", "c"].map(|shoot| host(&s, shoot)),
        ["b", "a", "b"]
    );
    for bad in [[("a", "x")], [("x", "a")]] {
        let mut fresh = RingState::default();
        let err = fresh.apply(&boot(&bad)).unwrap_err();
        assert!(err.contains("must be members of the new ring"), "{err}");
        assert_eq!(fresh, RingState::default());
    }
}

#[test]
fn lease_only_for_current_host_and_epoch_and_never_shrinks() {
    let mut s = ring3();
    let renew = |holder: &str, epoch, at| RingCommand::RenewLease {
        shoot: "b".into(),
        holder: holder.into(),
        epoch,
        expires_at_ms: at,
    };
    s.apply(&renew("a", 1, 1000)).unwrap();
    assert!(s
        .apply(&renew("c", 1, 2000))
        .unwrap_err()
        .contains("hosted by a"));
    assert!(s
        .apply(&renew("a", 2, 2000))
        .unwrap_err()
        .contains("stale epoch"));
    s.apply(&renew("a", 1, 500)).unwrap();
    assert_eq!(
        s.placements["b"].lease.as_ref().unwrap().expires_at_ms,
        1000
    );
}

#[test]
fn failover_bumps_epoch_fences_old_host_and_waits_for_lease_end() {
    let mut s = ring3();
    s.apply(&RingCommand::RenewLease {
        shoot: "b".into(),
        holder: "a".into(),
        epoch: 1,
        expires_at_ms: 9_000,
    })
    .unwrap();
    fail_b_over_to_c(&mut s);
    let p = &s.placements["b"];
    assert_eq!(
        (p.host.as_str(), p.epoch, p.lease.is_none()),
        ("c", 2, true)
    );
    let op = s.open_operation("b").unwrap().clone();
    assert_eq!(op.step, OperationStep::WaitingForLeaseExpiry);
    // the proposer's estimate, as proposed: the holder's wall clock
    // (expires_at_ms) is never taken for the wait (decide.rs judges it)
    assert!(matches!(
        op.kind,
        OperationKind::Failover {
            not_before_ms: 6_000,
            epoch: 2,
            ..
        }
    ));
    // the old host's renewals are refused now
    let old = RingCommand::RenewLease {
        shoot: "b".into(),
        holder: "a".into(),
        epoch: 1,
        expires_at_ms: 20_000,
    };
    assert!(s.apply(&old).is_err());
    // the target gets no lease before it is restoring, and only as target
    let new = RingCommand::RenewLease {
        shoot: "b".into(),
        holder: "c".into(),
        epoch: 2,
        expires_at_ms: 20_000,
    };
    assert!(s
        .apply(&new)
        .unwrap_err()
        .contains("no lease until it is done"));
    // a second failover of the same shoot is refused while one is open
    assert!(s
        .apply(&RingCommand::StartFailover {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 6_000,
            not_before_ms: 0,
            seen: None,
            promote: false,
        })
        .is_err());
    advance(
        &mut s,
        op.id,
        &[OperationStep::Pending, OperationStep::Restoring],
        10_000,
    );
    s.apply(&new).unwrap();
    s.apply(&RingCommand::AdvanceOperation {
        id: op.id,
        step: OperationStep::Done,
        detail: "serving".into(),
        at_ms: 11_000,
        outcome: None,
    })
    .unwrap();
    assert!(s.open_operation("b").is_none());
    assert!(s
        .apply(&RingCommand::AdvanceOperation {
            id: op.id,
            step: OperationStep::Pending,
            detail: String::new(),
            at_ms: 12_000,
            outcome: None
        })
        .is_err());
}

#[test]
fn failover_to_a_down_member_is_refused() {
    let mut s = ring3();
    s.apply(&RingCommand::MarkDown {
        member: "c".into(),
        at_ms: 1,
    })
    .unwrap();
    let err = s
        .apply(&RingCommand::StartFailover {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
            not_before_ms: 1,
            seen: None,
            promote: false,
        })
        .unwrap_err();
    assert!(err.contains("not an up member"));
}

#[test]
fn finished_operations_are_bounded() {
    let mut s = ring3();
    for i in 0..(FINISHED_OPERATIONS_KEPT as u64 + 10) {
        s.apply(&RingCommand::StartFailover {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: i,
            not_before_ms: i,
            seen: None,
            promote: false,
        })
        .unwrap();
        s.apply(&RingCommand::AdvanceOperation {
            id: i,
            step: OperationStep::Failed,
            detail: String::new(),
            at_ms: i,
            outcome: None,
        })
        .unwrap();
    }
    assert_eq!(s.operations.len(), FINISHED_OPERATIONS_KEPT);
    assert_eq!(s.operations[0].id, 10);
}

#[test]
fn membership_and_backup_pointers() {
    let mut s = ring3();
    s.apply(&RingCommand::AddMember {
        name: "d".into(),
        id: 4,
        address: "x".into(),
        epoch: 0,
    })
    .unwrap();
    assert!(s
        .apply(&RingCommand::AddMember {
            name: "d".into(),
            id: 5,
            address: "x".into(),
            epoch: 0,
        })
        .is_err());
    s.apply(&RingCommand::RemoveMember { name: "d".into() })
        .unwrap();
    assert!(s
        .apply(&RingCommand::RemoveMember { name: "d".into() })
        .is_err());
    s.apply(&RingCommand::ReportBackup {
        shoot: "a".into(),
        revision: 10,
        at_ms: 1,
        seen: None,
    })
    .unwrap();
    s.apply(&RingCommand::ReportBackup {
        shoot: "a".into(),
        revision: 5,
        at_ms: 2,
        seen: None,
    })
    .unwrap();
    assert_eq!(s.backups["a"].revision, 10);
}

/// A failover's RPO compares the bucket's restore with what the ring knew
/// durable when the failover began: the new host's backups, reported while
/// the failover is still open, must not raise that figure (seen in the
/// kill-machine drill: "the ring last knew revision 751 durable ... 12
/// revisions lost" after restoring 739, where 751 came from the new host).
#[test]
fn a_failover_keeps_the_durable_revision_known_when_it_began() {
    let mut s = ring3();
    let report = |revision, at_ms| RingCommand::ReportBackup {
        shoot: "b".into(),
        revision,
        at_ms,
        seen: None,
    };
    s.apply(&report(739, 4_000)).unwrap();
    fail_b_over_to_c(&mut s);
    let id = s.open_operation("b").unwrap().id;
    // the new host restored 739 and backs up again before the failover is done
    s.apply(&report(751, 9_000)).unwrap();
    assert_eq!(
        (s.backups["b"].revision, s.backups["b"].at_ms),
        (739, 4_000)
    );
    let done = [
        OperationStep::Pending,
        OperationStep::Restoring,
        OperationStep::Done,
    ];
    advance(&mut s, id, &done, 10_000);
    // once done, the new host's progress counts
    s.apply(&report(760, 11_000)).unwrap();
    assert_eq!(s.backups["b"].revision, 760);
}

/// A ring bootstrapped again on a bucket that holds objects of earlier
/// epochs, or a member added under a name the bucket saw, starts its
/// placements above them: its backups are never taken for a fenced host's.
#[test]
fn first_epochs_come_from_the_bootstrap_and_the_added_member() {
    let mut s = RingState::default();
    s.apply(&RingCommand::Bootstrap {
        members: vec![
            ("a".into(), 1, "127.0.0.1:1".into()),
            ("b".into(), 2, "127.0.0.1:2".into()),
        ],
        epochs: [("b".to_string(), 7)].into_iter().collect(),
        hosts: Default::default(),
    })
    .unwrap();
    let epochs = |s: &RingState| -> Vec<(String, u64)> {
        s.placements
            .values()
            .map(|p| (p.shoot.clone(), p.epoch))
            .collect()
    };
    assert_eq!(epochs(&s), vec![("a".into(), 1), ("b".into(), 7)]);
    s.apply(&RingCommand::AddMember {
        name: "c".into(),
        id: 3,
        address: "127.0.0.1:3".into(),
        epoch: 4,
    })
    .unwrap();
    s.apply(&RingCommand::AddMember {
        name: "d".into(),
        id: 4,
        address: "127.0.0.1:4".into(),
        epoch: 0,
    })
    .unwrap();
    let got = epochs(&s);
    assert!(got.contains(&("c".into(), 4)), "{got:?}");
    assert!(
        got.contains(&("d".into(), 1)),
        "0 means the first epoch: {got:?}"
    );
}

/// A standby is assigned at the placement's epoch, never on the host or a
/// member that is down; only the assigned member's readiness counts; a
/// promoting failover needs a ready standby on its target and clears it, as
/// a migration's start does.
#[test]
fn standby_assignments_follow_the_placement() {
    let mut s = ring3(); // a hosts b, b hosts c, c hosts a
    let set = |member: Option<&str>, epoch| RingCommand::SetStandby {
        shoot: "b".into(),
        epoch,
        member: member.map(str::to_string),
    };
    let ready = |member: &str, epoch| RingCommand::StandbyReady {
        shoot: "b".into(),
        epoch,
        member: member.into(),
        warm: false,
    };
    assert!(s
        .apply(&set(Some("a"), 1))
        .unwrap_err()
        .contains("hosts shoot b"));
    assert!(s
        .apply(&set(Some("c"), 2))
        .unwrap_err()
        .contains("stale epoch"));
    s.apply(&set(Some("c"), 1)).unwrap();
    assert!(s.apply(&ready("b", 1)).is_err(), "not b's standby");
    let promote = RingCommand::StartFailover {
        shoot: "b".into(),
        to: "c".into(),
        at_ms: 1,
        not_before_ms: 1,
        seen: None,
        promote: true,
    };
    let mut not_ready = s.clone();
    assert!(not_ready
        .apply(&promote)
        .unwrap_err()
        .contains("no ready standby"));
    s.apply(&ready("c", 1)).unwrap();
    assert_eq!(
        s.placements["b"].standby,
        Some(Standby {
            member: "c".into(),
            ready: true,
            warm: false,
        })
    );
    // a kube-apiserver warm next to it; a report without (the standby
    // joined again, say after its ringd restarted) clears it
    let mut warmed = s.clone();
    let warm = RingCommand::StandbyReady {
        shoot: "b".into(),
        epoch: 1,
        member: "c".into(),
        warm: true,
    };
    warmed.apply(&warm).unwrap();
    assert!(warmed.placements["b"].standby.as_ref().unwrap().warm);
    let mut rejoined = warmed.clone();
    rejoined.apply(&ready("c", 1)).unwrap();
    assert!(!rejoined.placements["b"].standby.as_ref().unwrap().warm);
    warmed.apply(&set(Some("a"), 1)).unwrap_err();
    warmed.apply(&set(None, 1)).unwrap();
    warmed.apply(&set(Some("c"), 1)).unwrap();
    let again = warmed.placements["b"].standby.as_ref().unwrap();
    assert!(
        !again.ready && !again.warm,
        "a new assignment starts cold: {again:?}"
    );
    let mut migrating = s.clone();
    migrating
        .apply(&RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        })
        .unwrap();
    assert_eq!(migrating.placements["b"].standby, None);
    s.apply(&promote).unwrap();
    assert_eq!(s.placements["b"].standby, None);
    assert_eq!(s.placements["b"].host, "c");
    assert!(s.open_operation("b").unwrap().promotes());
    s.apply(&RingCommand::MarkDown {
        member: "a".into(),
        at_ms: 2,
    })
    .unwrap();
    let mut done = s.clone();
    let id = s.open_operation("b").unwrap().id;
    advance(&mut done, id, &[OperationStep::Done], 3);
    assert!(done
        .apply(&RingCommand::SetStandby {
            shoot: "b".into(),
            epoch: 2,
            member: Some("a".into()),
        })
        .unwrap_err()
        .contains("not an up member"));
}

/// Members' last reports of a shoot: (member, at ms, revision).
type Reports = &'static [(&'static str, u64, u64)];

/// What a failover may lose is measured against every etcd that may have
/// served the shoot since its last finished move: its dead host, and the
/// target of a failover that failed after it served (heard since that
/// failover began), never a report from before it or before a later move.
#[test]
fn the_newest_revision_heard_counts_failed_failover_targets() {
    let mut s = ring3();
    fail_b_over_to_c(&mut s);
    let first = s.open_operation("b").unwrap().id;
    advance(&mut s, first, &[OperationStep::Failed], 8_000);
    assert_eq!(s.placements["b"].host, "a", "a failed failover rolls back");
    let heard = |reports: Reports| {
        move |m: &str| {
            reports
                .iter()
                .find(|(name, _, _)| *name == m)
                .map(|(_, at, rev)| (*at, *rev))
        }
    };
    let seen = |revision, at_ms| Some(SeenRevision { revision, at_ms });
    let cases: [(&str, Reports, _); 5] = [
        ("the host alone", &[("a", 4_000, 100)], seen(100, 4_000)),
        (
            "the failed target served past it",
            &[("a", 4_000, 100), ("c", 7_000, 130)],
            seen(130, 7_000),
        ),
        (
            "a report from before the failover began",
            &[("a", 4_000, 100), ("c", 4_500, 130)],
            seen(100, 4_000),
        ),
        (
            "a target that never ran etcd",
            &[("a", 4_000, 100), ("c", 7_000, 0)],
            seen(100, 4_000),
        ),
        ("nothing heard", &[], None),
    ];
    for (name, reports, want) in cases {
        assert_eq!(s.newest_heard("b", heard(reports)), want, "{name}");
    }
    assert_eq!(s.failed_failovers("b").len(), 1);
    // a later failover that completes ends the chain: the failed one before
    // it no longer counts
    s.apply(&RingCommand::StartFailover {
        shoot: "b".into(),
        to: "c".into(),
        at_ms: 9_000,
        not_before_ms: 9_000,
        seen: None,
        promote: false,
    })
    .unwrap();
    let second = s.open_operation("b").unwrap().id;
    let done = [
        OperationStep::Pending,
        OperationStep::Restoring,
        OperationStep::Done,
    ];
    advance(&mut s, second, &done, 10_000);
    assert!(s.failed_failovers("b").is_empty());
    let stale = heard(&[("c", 9_500, 90), ("a", 7_000, 130)]);
    assert_eq!(s.newest_heard("b", stale), seen(90, 9_500), "c hosts b now");
}

/// A step report that commits twice (its proposer timed out while the
/// first copy was still on its way through an election, and sent it again)
/// is taken once: the second copy of a handover at the same revision, or of
/// `Done`, changes nothing and is not refused, so the proposer does not end
/// a move that went through as failed, and goes on with what follows
/// (serving, metrics). A different handover, or another step after `Done`,
/// is still refused.
#[test]
fn a_step_report_committed_twice_is_taken_once() {
    let mut s = ring3();
    s.apply(&RingCommand::StartMigration {
        shoot: "b".into(),
        to: "c".into(),
        at_ms: 1,
    })
    .unwrap();
    let ready = |revision| RingCommand::HandoverReady {
        id: 0,
        revision,
        at_ms: 2,
    };
    s.apply(&ready(42)).unwrap();
    let after_first = s.clone();
    s.apply(&ready(42)).unwrap();
    assert_eq!(s, after_first, "the second copy changed the state");
    assert!(s.apply(&ready(43)).unwrap_err().contains("not Pending"));
    let done = |detail: &str, at_ms| RingCommand::AdvanceOperation {
        id: 0,
        step: OperationStep::Done,
        detail: detail.into(),
        at_ms,
        outcome: None,
    };
    s.apply(&done("serving on c", 5)).unwrap();
    let after_done = s.clone();
    s.apply(&done("serving on c, again", 6)).unwrap();
    assert_eq!(s, after_done, "the second Done changed the state");
    let failed = RingCommand::AdvanceOperation {
        id: 0,
        step: OperationStep::Failed,
        detail: "late".into(),
        at_ms: 7,
        outcome: None,
    };
    assert!(s.apply(&failed).unwrap_err().contains("already Done"));
}
