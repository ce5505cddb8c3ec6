//! The last steps of a move on its target: verifying a restore from the
//! bucket, and reporting the move done with its figures (and, for a
//! failover, what may have been lost).

use std::sync::Arc;

use super::{outcome, Progress};
use crate::executor::{Mover, Objects};
use crate::shared::Shared;
use crate::state::{Operation, OperationStep, RingCommand};
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
    shared.set_hosted(shoot, true, "serving".into());
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
    let (rpo, figures) = match state.backups.get(shoot) {
        Some(b) => {
            let lost = (b.revision as i64 - reached).max(0);
            let age = op.created_at_ms.saturating_sub(b.at_ms);
            (
                format!(
                    "the ring last knew revision {} durable ({age} ms before the failover began); {lost} revisions lost",
                    b.revision
                ),
                (Some(lost), Some(age)),
            )
        }
        None => ("no backup progress had been reported".into(), (None, None)),
    };
    let objects: u64 = progress.verified.as_ref().map_or(0, |o| o.values().sum());
    let detail = format!(
        "serving on {} at epoch {}; restored revision {reached} from the bucket ({objects} objects); {rpo}",
        shared.name(),
        op.epoch(),
    );
    (detail, outcome(reached, restore_ms, progress, figures))
}
