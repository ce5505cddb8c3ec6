//! The last steps of a move on its target: verifying a restore from the
//! bucket, and reporting the move done with its figures (and, for a
//! failover, what may have been lost).

use std::sync::Arc;

use super::Progress;
use crate::executor::{Mover, Objects};
use crate::shared::Shared;
use crate::state::{
    BackupPointer, Operation, OperationKind, OperationStep, Outcome, RingCommand, SeenRevision,
};
use crate::{now_ms, RingError};

/// Counts the objects of a shoot restored from the bucket: they must add up
/// to the keys the verified restore reached, or the copy here is not the one
/// the restore checked (a permanent error: the operation ends).
pub(super) async fn verify_bucket_restore(
    mover: &dyn Mover,
    op: &Operation,
) -> Result<Objects, RingError> {
    let shoot = op.shoot();
    let report = mover.bucket_report(shoot, op.id);
    let reached = report.as_ref().map_or(0, |r| r.reached_revision);
    let objects = mover.count_objects(shoot, reached).await?;
    if let Some(r) = report.as_ref() {
        let total: u64 = objects.values().sum();
        if total != r.keys as u64 {
            return Err(RingError::Verification(format!(
                "{shoot} holds {total} keys at revision {reached} but the restore verified {}",
                r.keys
            )));
        }
    }
    Ok(objects)
}

/// The revision of the data a move's target was given: what its restore
/// from the bucket reached, or the source handed over (`None`: not known
/// here, e.g. a promoted standby's).
fn given_revision(mover: &dyn Mover, op: &Operation) -> Option<i64> {
    let shoot = op.shoot();
    match op.kind {
        OperationKind::Failover { .. } => mover
            .bucket_report(shoot, op.id)
            .map(|r| r.reached_revision),
        OperationKind::Migration { .. } => mover.handover_info(shoot).map(|i| i.revision),
    }
}

/// Records in the bucket, before a failover's target serves a restore from
/// the bucket, that the failover's epoch begins at the revision it restored,
/// so the old host's late uploads past it never pass for history (the new
/// epoch's first full snapshot, once it serves, may be at a later revision).
/// A failed write fails the step, which is tried again. Nothing to record
/// for a planned move (its source stopped serving before the handover) or a
/// promoted standby (it held every write the old host acknowledged: nothing
/// of the old epoch can fork from it).
pub(super) async fn record_epoch_begin(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
) -> Result<(), RingError> {
    let (shoot, epoch) = (op.shoot(), op.epoch());
    let restored_from_bucket = !op.is_migration() && !op.promotes();
    let Some(bucket) = shared.bucket().filter(|_| restored_from_bucket) else {
        return Ok(());
    };
    let Some(revision) = given_revision(mover, op) else {
        tracing::warn!(%shoot, epoch, "no report of the restore: where the new epoch begins is not recorded");
        return Ok(());
    };
    let name = bucket.record_epoch_begin(shoot, epoch, revision).await?;
    tracing::info!(%shoot, epoch, revision, object = %name, "recorded where the new epoch begins");
    Ok(())
}

/// How long releasing the predecessor's leader Leases may take.
const RELEASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Lets the moved shoot's kube-controller-manager and kube-scheduler lead
/// at once: deletes the leader Leases their fenced predecessors last wrote
/// (at or before the revision restored here), which they would otherwise
/// wait out for a whole lease duration (see [`seed::leader_leases`]). Only
/// logged when it fails: the controllers then take over after that wait.
pub(super) async fn release_leader_leases(mover: &dyn Mover, op: &Operation) {
    let shoot = op.shoot();
    let Some(revision) = given_revision(mover, op) else {
        return;
    };
    let kubeconfig = mover.admin_kubeconfig(shoot);
    let release = seed::leader_leases::release_stale(shoot, &kubeconfig, revision);
    // bounded: an API that stalls here must not use up the Verify step's deadline
    match tokio::time::timeout(RELEASE_TIMEOUT, release).await {
        Ok(Ok(released)) if released.is_empty() => {}
        Ok(Ok(released)) => {
            tracing::info!(%shoot, revision, ?released, "released the fenced control plane's leader leases")
        }
        Ok(Err(e)) => {
            tracing::warn!(%shoot, error = %e, "cannot release the fenced control plane's leader leases")
        }
        Err(_) => {
            tracing::warn!(%shoot, waited = ?RELEASE_TIMEOUT, "the API did not release the fenced control plane's leader leases in time")
        }
    }
}

/// Reports the move done (serving here at its epoch) with what was measured.
pub(super) async fn complete(
    shared: &Arc<Shared>,
    mover: &dyn Mover,
    op: &Operation,
    progress: Progress,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let (detail, outcome) = if op.is_migration() {
        migration_outcome(shared, mover, op, &progress)
    } else {
        failover_outcome(shared, mover, op, &progress)
    };
    shared
        .propose_cmd(RingCommand::AdvanceOperation {
            id: op.id,
            step: OperationStep::Done,
            detail,
            at_ms: now_ms(),
            outcome: Some(outcome.clone()),
        })
        .await?;
    let kind = super::kind_of(op);
    shared.metrics().finished(kind, "done");
    if let (false, Some(lost), Some(age)) =
        (op.is_migration(), outcome.rpo_revisions, outcome.rpo_ms)
    {
        shared.metrics().rpo(shoot, lost, age as f64 / 1000.0);
    }
    if !op.is_migration() {
        let secs = |ms: Option<u64>| ms.map(|ms| ms as f64 / 1000.0);
        shared.metrics().may_lose(
            shoot,
            outcome.may_lose_revisions,
            secs(outcome.may_lose_ms),
            secs(outcome.unheard_ms),
        );
    }
    shared.serve_moved(shoot, op.epoch(), "serving".into());
    mover.finish_move(shoot, op.id);
    Ok(())
}

fn migration_outcome(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
    progress: &Progress,
) -> (String, crate::state::Outcome) {
    let revision = mover.handover_info(op.shoot()).map_or(0, |i| i.revision);
    let objects = progress.verified.clone().unwrap_or_default();
    let total: u64 = objects.values().sum();
    let detail = format!(
        "serving on {} at epoch {}; revision {revision}, HashKV and {total} objects in {} resource types verified",
        shared.name(),
        op.epoch(),
        objects.len()
    );
    let restore_ms = progress.restore.as_millis() as u64;
    (
        detail,
        outcome(revision, restore_ms, progress, (Some(0), None)),
    )
}

fn failover_outcome(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
    progress: &Progress,
) -> (String, crate::state::Outcome) {
    let shoot = op.shoot();
    let report = mover.bucket_report(shoot, op.id);
    let reached = report.as_ref().map_or(0, |r| r.reached_revision);
    // the restore itself is measured by its report, which survives restarts
    let restore_ms = report
        .as_ref()
        .map_or(progress.restore.as_millis() as u64, |r| {
            (r.total_seconds * 1000.0) as u64
        });
    let state = shared.node().view().state;
    let durable = state.backups.get(shoot);
    let seen = match &op.kind {
        OperationKind::Failover { seen, .. } => *seen,
        OperationKind::Migration { .. } => None,
    };
    let loss = FailoverLoss::new(op, durable, seen, reached);
    let objects: u64 = progress.verified.as_ref().map_or(0, |o| o.values().sum());
    let from = match op.promotes() {
        true => "its hot standby (which voted on every write)",
        false => "the bucket",
    };
    let detail = format!(
        "serving on {} at epoch {}; restored revision {reached} from {from} ({objects} objects); {}",
        shared.name(),
        op.epoch(),
        loss.describe(&served_by(&state, op)),
    );
    let mut figures = outcome(
        reached,
        restore_ms,
        progress,
        (loss.lost, loss.durable_age_ms),
    );
    figures.may_lose_revisions = loss.may_lose_revisions;
    figures.may_lose_ms = loss.may_lose_ms;
    figures.unheard_ms = loss.unheard_ms;
    (detail, figures)
}

/// Whose etcd a failover's loss is measured against, in words: the member
/// that died (`m1's etcd`), and after it the targets of the failovers of the
/// shoot that failed since (each may have served before it failed).
fn served_by(state: &crate::state::RingState, op: &Operation) -> String {
    let failed = state.failed_failovers(op.shoot());
    let later: Vec<String> = failed
        .iter()
        .filter(|f| f.id != op.id && f.target() != op.source())
        .map(|f| {
            format!(
                "of {} (target of failover {}, which failed)",
                f.target(),
                f.id
            )
        })
        .collect();
    if later.is_empty() {
        return format!("{}'s etcd", op.source());
    }
    format!(
        "the etcd of {}, then {}",
        op.source(),
        later.join(", then ")
    )
}

/// What a failover lost, as far as the ring can tell: the revisions it knew
/// durable that the restore did not reach (`lost`), and what clients lost
/// beyond that: every revision past the restore up to the newest one the old
/// host's etcd was heard at (they existed there and are gone), plus any write
/// it acknowledged after that report until its lease was surely over (which
/// the ring cannot count, only bound in time: `unheard_ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailoverLoss {
    durable: Option<BackupPointer>,
    seen: Option<SeenRevision>,
    pub lost: Option<i64>,
    pub durable_age_ms: Option<u64>,
    pub may_lose_revisions: Option<i64>,
    pub may_lose_ms: Option<u64>,
    pub unheard_ms: Option<u64>,
}

impl FailoverLoss {
    /// The loss of failover `op`, which restored revision `reached`.
    pub fn new(
        op: &Operation,
        durable: Option<&BackupPointer>,
        seen: Option<SeenRevision>,
        reached: i64,
    ) -> Self {
        let lost = durable.map(|b| (b.revision as i64 - reached).max(0));
        // unknown without a report of the old host's etcd: never a 0 that
        // would read as "nothing may be lost"
        let newest = seen.map(|s| s.revision.max(durable.map_or(0, |b| b.revision)));
        FailoverLoss {
            durable: durable.cloned(),
            seen,
            lost,
            durable_age_ms: durable.map(|b| op.created_at_ms.saturating_sub(b.at_ms)),
            may_lose_revisions: newest.map(|n| (n as i64 - reached).max(0)),
            may_lose_ms: match (seen, durable) {
                (Some(s), Some(b)) => Some(s.at_ms.saturating_sub(b.at_ms)),
                _ => None,
            },
            unheard_ms: unheard_ms(op, seen, durable),
        }
    }

    /// The report's words; `served` names the etcd that served last (the
    /// dead member's, `m1's etcd`; see [`served_by`]).
    pub fn describe(&self, served: &str) -> String {
        let known = match (&self.durable, self.lost, self.durable_age_ms) {
            (Some(b), Some(lost), Some(age)) => format!(
                "the ring last knew revision {} durable ({age} ms before the failover began); {lost} revisions lost",
                b.revision
            ),
            _ => "no backup progress had been reported".into(),
        };
        let unheard = |after: &str| {
            self.unheard_ms.map_or(String::new(), |ms| {
                format!(
                    "; writes it acknowledged in the {:.1} s after {after}, until its lease was surely over, may be lost too",
                    ms as f64 / 1000.0
                )
            })
        };
        let clients = match (self.seen, self.may_lose_revisions) {
            (Some(s), Some(n)) => {
                let span = self.may_lose_ms.map_or(String::new(), |ms| {
                    format!(", {:.1} s after the newest durable backup", ms as f64 / 1000.0)
                });
                format!(
                    "{n} revisions past the restore are lost ({served} was at revision {} when last heard{span}){}",
                    s.revision,
                    unheard("that report")
                )
            }
            _ => format!(
                "how far {served} got beyond the bucket is unknown (no report of its revision reached the ring){}",
                match self.unheard_ms {
                    Some(_) => unheard("the newest durable backup"),
                    None => ": any write acknowledged after the newest durable backup may be lost".into(),
                }
            ),
        };
        format!("{known}; {clients}")
    }
}

/// How long the old host of failover `op` may have acknowledged writes the
/// ring never heard of: from its last report (or, never heard, the newest
/// durable backup) until its lease was surely over. A stalled or cut-off host
/// serves until its guards fence it, and what it backs up meanwhile may not
/// reach the bucket (a local seed's backup runs in the stalled ringd).
/// Nothing for a promoted standby: it voted on every write.
fn unheard_ms(
    op: &Operation,
    seen: Option<SeenRevision>,
    durable: Option<&BackupPointer>,
) -> Option<u64> {
    if op.promotes() {
        return None;
    }
    let heard_at = seen.map(|s| s.at_ms).or(durable.map(|b| b.at_ms))?;
    Some(op.old_lease_over_ms()?.saturating_sub(heard_at))
}

/// The outcome figures a finished move reports.
pub(super) fn outcome(
    restored_revision: i64,
    restore_ms: u64,
    progress: &Progress,
    rpo: (Option<i64>, Option<u64>),
) -> Outcome {
    Outcome {
        restored_revision,
        restore_ms,
        start_ms: progress.start.as_millis() as u64,
        rpo_revisions: rpo.0,
        rpo_ms: rpo.1,
        objects: progress.verified.clone().unwrap_or_default(),
        ..Outcome::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{OperationKind, OperationStep};

    /// A failover begun at `created_at_ms`, the old lease over 4.5 s later.
    fn failover(created_at_ms: u64, promote: bool) -> Operation {
        Operation::new(
            7,
            OperationKind::Failover {
                shoot: "m2".into(),
                from: "m1".into(),
                to: "m3".into(),
                epoch: 2,
                not_before_ms: created_at_ms + 4_500,
                seen: None,
                promote,
            },
            OperationStep::Pending,
            String::new(),
            created_at_ms,
        )
    }

    #[test]
    fn a_failover_reports_what_clients_may_have_lost_beyond_the_bucket() {
        let op = failover(10_000, false);
        let durable = BackupPointer {
            revision: 100,
            at_ms: 8_000,
            seen: None,
        };
        let seen = |revision, at_ms| Some(SeenRevision { revision, at_ms });
        // (durable, seen, reached) -> (lost, may lose revisions, may lose ms,
        // unheard ms: until the old lease was over at 14.5 s)
        let cases = [
            (
                "heard beyond the bucket",
                Some(&durable),
                seen(112, 9_400),
                100,
                (Some(0), Some(12), Some(1_400), Some(5_100)),
            ),
            (
                "restore short of the durable",
                Some(&durable),
                seen(112, 9_400),
                95,
                (Some(5), Some(17), Some(1_400), Some(5_100)),
            ),
            (
                "heard before the newest backup",
                Some(&durable),
                seen(90, 7_000),
                100,
                (Some(0), Some(0), Some(0), Some(7_500)),
            ),
            (
                "never heard",
                Some(&durable),
                None,
                100,
                (Some(0), None, None, Some(6_500)),
            ),
            ("nothing known", None, None, 100, (None, None, None, None)),
        ];
        for (name, durable, seen, reached, want) in cases {
            let l = FailoverLoss::new(&op, durable, seen, reached);
            assert_eq!(
                (l.lost, l.may_lose_revisions, l.may_lose_ms, l.unheard_ms),
                want,
                "{name}"
            );
        }
        // a promoted standby voted on every write the old host acknowledged
        let promoted = FailoverLoss::new(
            &failover(10_000, true),
            Some(&durable),
            seen(112, 9_400),
            112,
        );
        assert_eq!(
            (promoted.may_lose_revisions, promoted.unheard_ms),
            (Some(0), None)
        );
        assert!(!promoted.describe("m1's etcd").contains("may be lost too"));
        let l = FailoverLoss::new(&op, Some(&durable), seen(112, 9_400), 100);
        let words = l.describe("m1's etcd");
        assert!(words.contains("0 revisions lost"), "{words}");
        assert!(
            words.contains("12 revisions past the restore are lost (m1's etcd was at revision 112 when last heard, 1.4 s after the newest durable backup); writes it acknowledged in the 5.1 s after that report, until its lease was surely over, may be lost too"),
            "{words}"
        );
        let unknown = FailoverLoss::new(&op, Some(&durable), None, 100).describe("m1's etcd");
        assert!(
            unknown.contains("is unknown (no report of its revision reached the ring); writes it acknowledged in the 6.5 s after the newest durable backup, until its lease was surely over, may be lost too"),
            "{unknown}"
        );
    }

    /// A failover after one that failed names both etcds its loss is
    /// measured against: the dead host's and the failed target's.
    #[test]
    fn the_report_names_a_failed_target_that_may_have_served() {
        use crate::state::tests::{advance, ring3};
        use crate::state::RingCommand;
        let mut s = ring3();
        let fail_over = |s: &mut crate::state::RingState, at_ms| {
            s.apply(&RingCommand::StartFailover {
                shoot: "b".into(),
                to: "c".into(),
                at_ms,
                not_before_ms: at_ms,
                seen: None,
                promote: false,
            })
            .unwrap();
            s.open_operation("b").unwrap().clone()
        };
        let first = fail_over(&mut s, 5_000);
        assert_eq!(served_by(&s, &first), "a's etcd");
        advance(&mut s, first.id, &[OperationStep::Failed], 8_000);
        // (c is passed over after a failure; the names are what matters here)
        let second = fail_over(&mut s, 9_000);
        assert_eq!(
            served_by(&s, &second),
            format!(
                "the etcd of a, then of c (target of failover {}, which failed)",
                first.id
            )
        );
    }
}
