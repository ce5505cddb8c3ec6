//! What each side of a migration does next: pure functions of what is observed.

/// What the source observes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceView {
    /// kube-apiserver, controller-manager or scheduler still run.
    pub writers_running: bool,
    /// The final snapshot and its info are on disk.
    pub snapshot_taken: bool,
    /// etcd still runs.
    pub etcd_running: bool,
    /// The ring recorded the handover.
    pub handover_recorded: bool,
}

/// The source's next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceAction {
    /// Stop the writers; keep etcd.
    StopWriters,
    /// Start etcd alone (after a crash) to take the snapshot.
    StartEtcd,
    /// Take the final snapshot.
    TakeSnapshot,
    /// Stop etcd.
    StopEtcd,
    /// Report the handover (revision) to the ring.
    ReportHandover,
    /// Nothing to do: wait for the target.
    Wait,
}

/// The source's next step.
pub fn source_next(v: &SourceView) -> SourceAction {
    if v.writers_running {
        return SourceAction::StopWriters;
    }
    if !v.snapshot_taken {
        return if v.etcd_running {
            SourceAction::TakeSnapshot
        } else {
            SourceAction::StartEtcd
        };
    }
    if v.etcd_running {
        return SourceAction::StopEtcd;
    }
    if !v.handover_recorded {
        return SourceAction::ReportHandover;
    }
    SourceAction::Wait
}

/// What the target observes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetView {
    /// PKI, spec and snapshot are fetched and complete.
    pub fetched: bool,
    /// The snapshot is restored into the shoot's etcd data dir.
    pub restored: bool,
    /// This member holds the lease for the new epoch.
    pub leased: bool,
    /// The control plane runs here.
    pub serving: bool,
    /// `/readyz` is ok and HashKV matched.
    pub verified: bool,
}

/// The target's next action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetAction {
    Fetch,
    Restore,
    AcquireLease,
    Start,
    Verify,
    /// Report the migration done.
    Complete,
}

/// The target's next step. A half-restored target never serves: start comes
/// only after a complete restore and a granted lease.
pub fn target_next(v: &TargetView) -> TargetAction {
    if !v.fetched {
        return TargetAction::Fetch;
    }
    if !v.restored {
        return TargetAction::Restore;
    }
    if !v.leased {
        return TargetAction::AcquireLease;
    }
    if !v.serving {
        return TargetAction::Start;
    }
    if !v.verified {
        return TargetAction::Verify;
    }
    TargetAction::Complete
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_drains_snapshots_stops_and_reports_in_order() {
        let mut v = SourceView {
            writers_running: true,
            etcd_running: true,
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let a = source_next(&v);
            seen.push(a);
            match a {
                SourceAction::StopWriters => v.writers_running = false,
                SourceAction::StartEtcd => v.etcd_running = true,
                SourceAction::TakeSnapshot => v.snapshot_taken = true,
                SourceAction::StopEtcd => v.etcd_running = false,
                SourceAction::ReportHandover => v.handover_recorded = true,
                SourceAction::Wait => break,
            }
        }
        use SourceAction::*;
        assert_eq!(
            seen,
            [StopWriters, TakeSnapshot, StopEtcd, ReportHandover, Wait]
        );
    }

    #[test]
    fn source_resumes_after_a_crash_before_the_snapshot() {
        // crashed after stopping everything but before snapshotting
        let v = SourceView::default();
        assert_eq!(source_next(&v), SourceAction::StartEtcd);
    }

    #[test]
    fn target_never_serves_before_restore_and_lease() {
        let mut v = TargetView::default();
        let mut seen = Vec::new();
        loop {
            let a = target_next(&v);
            seen.push(a);
            match a {
                TargetAction::Fetch => v.fetched = true,
                TargetAction::Restore => v.restored = true,
                TargetAction::AcquireLease => v.leased = true,
                TargetAction::Start => {
                    assert!(v.restored && v.leased);
                    v.serving = true
                }
                TargetAction::Verify => v.verified = true,
                TargetAction::Complete => break,
            }
        }
        assert_eq!(seen.len(), 6);
    }
}
