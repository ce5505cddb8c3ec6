//! Carrying out one step of a move on this member through its seed's
//! [`Mover`]: the source's steps of a planned migration (stop the writers,
//! final snapshot, report the handover) and the target's steps of a migration
//! or failover (fetch or restore from the bucket, lease, start, verify,
//! complete). Which step is due comes from `duties`; this module only acts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use migrate::plan::{SourceAction, TargetAction};

use super::duties::OperationFacts;
use crate::executor::{Mover, Objects};
use crate::shared::{lock, Shared};
use crate::state::{Operation, OperationKind, OperationStep, RingCommand};
use crate::{now_ms, RingError};

mod fetch;
mod finish;

/// A failed step is tried again after this.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// A step that failed this many times in a row (retryable errors) ends its
/// operation: nothing retries for ever; the leader then chooses another way.
pub(crate) const MAX_ATTEMPTS: u32 = 30;
/// How long a started control plane may take to answer ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest one step may take before it is given up (and counted as a
/// failed attempt): restoring a large etcd from the bucket gets the most.
/// Below the leader's operation deadline (20 min by default).
fn step_deadline(step: &Step) -> Duration {
    match step {
        Step::Target(TargetAction::Fetch | TargetAction::Restore) => Duration::from_secs(15 * 60),
        _ => Duration::from_secs(5 * 60),
    }
}

/// `work` within `deadline`, or a retryable [`RingError::StepTimeout`].
async fn bounded<F>(step: &'static str, deadline: Duration, work: F) -> Result<(), RingError>
where
    F: std::future::Future<Output = Result<(), RingError>>,
{
    tokio::time::timeout(deadline, work)
        .await
        .unwrap_or(Err(RingError::StepTimeout {
            step,
            secs: deadline.as_secs(),
        }))
}

/// What the executing member measured of an operation so far (in memory: after
/// a restart the figures cover only what ran since).
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Objects per resource type once verification passed.
    pub verified: Option<Objects>,
    pub restore: Duration,
    pub start: Duration,
    /// After a failed step: not before this.
    pub retry_at: Option<Instant>,
    /// Failed attempts in a row.
    pub failures: u32,
    /// The seed's latest facts of this operation, with the instant observing
    /// them began (observed in a task of its own: a slow seed never holds up
    /// a round, so lease renewals and fencing keep their pace).
    pub facts: Option<(Instant, OperationFacts)>,
    /// When the last step ended: facts observed before are stale.
    pub step_ended: Option<Instant>,
    /// The last step taken (a step taken again is waiting for something).
    pub last_step: Option<&'static str>,
    /// The last step moved the operation on: the first facts observed after
    /// it wake the member (once), so the next step need not wait a round.
    pub wake_on_facts: bool,
}

impl Progress {
    /// Keeps facts whose observation began at `began`; true when they are
    /// the first since a step that moved the operation on (the member should
    /// decide from them at once).
    pub fn observed(&mut self, began: Instant, facts: OperationFacts) -> bool {
        self.facts = Some((began, facts));
        self.observed_after_last_step(began) && std::mem::take(&mut self.wake_on_facts)
    }

    /// Whether an observation that began at `began` saw what the last step
    /// changed (it began after that step ended, or no step ran yet).
    fn observed_after_last_step(&self, began: Instant) -> bool {
        self.step_ended.is_none_or(|ended| began >= ended)
    }

    /// The facts to decide the next step from, used once: none before a
    /// fresh observation, and none whose observation began before the last
    /// step ended (it may predate what that step changed).
    pub fn take_fresh_facts(&mut self) -> Option<OperationFacts> {
        let (began, facts) = self.facts.take()?;
        self.observed_after_last_step(began).then_some(facts)
    }
}

/// Operation id → progress, shared by the member loop and its step tasks.
pub(crate) type Ledger = Arc<Mutex<BTreeMap<u64, Progress>>>;

/// One step of an operation, as `duties` chose it.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    Source(SourceAction),
    Target(TargetAction),
    BeginRestore,
}

impl Step {
    fn name(&self) -> &'static str {
        match self {
            Step::Source(a) => match a {
                SourceAction::StopWriters => "stop_writers",
                SourceAction::StartEtcd => "start_etcd",
                SourceAction::TakeSnapshot => "final_snapshot",
                SourceAction::StopEtcd => "stop_etcd",
                SourceAction::ReportHandover => "report_handover",
                SourceAction::Wait => "wait",
            },
            Step::Target(a) => match a {
                TargetAction::Fetch => "fetch",
                TargetAction::Restore => "restore",
                TargetAction::AcquireLease => "acquire_lease",
                TargetAction::Start => "start",
                TargetAction::Verify => "verify",
                TargetAction::Complete => "complete",
            },
            Step::BeginRestore => "begin_restore",
        }
    }
}

/// What kind of operation this is, for metrics and logs.
pub(crate) fn kind_of(op: &Operation) -> &'static str {
    if op.is_migration() {
        "migration"
    } else {
        "failover"
    }
}

/// Whether a step moved its operation on: it succeeded and is not the one
/// taken last (a start taken again while kube-apiserver comes up waits; its
/// retries keep the round's pace instead of hurrying the seed's API).
pub(crate) fn moved_on(last: Option<&str>, this: &str, ok: bool) -> bool {
    ok && last != Some(this)
}

/// Runs one step of `op`; on error records when to retry, and ends the
/// operation with the reason when the error is permanent or the step failed
/// [`MAX_ATTEMPTS`] times. True when the step moved the operation on
/// ([`moved_on`]): the member then looks at the operation again at once.
pub(crate) async fn run_step(
    shared: &Arc<Shared>,
    mover: &dyn Mover,
    op: &Operation,
    step: Step,
    ledger: &Ledger,
) -> bool {
    let began = Instant::now();
    tracing::info!(step = step.name(), "operation step");
    let work = async {
        match &step {
            Step::Source(a) => source_step(shared, mover, op, *a).await,
            Step::Target(a) => target_step(shared, mover, op, *a, ledger).await,
            Step::BeginRestore => begin_restore(shared, mover, op).await,
        }
    };
    let result = bounded(step.name(), step_deadline(&step), work).await;
    let took = began.elapsed();
    let moved = {
        let mut all = lock(ledger);
        let p = all.entry(op.id).or_default();
        p.step_ended = Some(Instant::now());
        let last = p.last_step.replace(step.name());
        p.wake_on_facts = moved_on(last, step.name(), result.is_ok());
        p.wake_on_facts
    };
    if let Step::Target(a) = &step {
        if *a != TargetAction::Complete {
            let mut all = lock(ledger);
            let p = all.entry(op.id).or_default();
            match a {
                TargetAction::Fetch | TargetAction::Restore => p.restore += took,
                TargetAction::Start | TargetAction::Verify => p.start += took,
                _ => {}
            }
        }
    }
    let role = if matches!(step, Step::Source(_)) {
        "source"
    } else {
        "target"
    };
    shared
        .metrics()
        .step(kind_of(op), role, step.name(), took.as_secs_f64());
    match result {
        Ok(()) => {
            if let Some(p) = lock(ledger).get_mut(&op.id) {
                p.retry_at = None;
                p.failures = 0;
            }
        }
        Err(e) => step_failed(shared, op, &step, e, ledger).await,
    }
    moved
}

/// Records a failed step; ends the operation when the error is permanent or
/// the step keeps failing.
async fn step_failed(shared: &Shared, op: &Operation, step: &Step, e: RingError, ledger: &Ledger) {
    let failures = {
        let mut all = lock(ledger);
        let p = all.entry(op.id).or_default();
        p.failures += 1;
        p.retry_at = Some(Instant::now() + RETRY_AFTER);
        p.failures
    };
    let kind = kind_of(op);
    let reason = if !e.is_retryable() {
        Some(format!("{} on {}: {e}", step.name(), shared.name()))
    } else if failures >= MAX_ATTEMPTS {
        Some(format!(
            "{} on {} failed {failures} times in a row; giving up: {e}",
            step.name(),
            shared.name()
        ))
    } else {
        None
    };
    tracing::warn!(step = step.name(), failures, permanent = reason.is_some(), error = %e, "operation step failed");
    shared.set_hosted_detail(op.shoot(), format!("{kind} {}: {e}", op.id));
    if let Some(reason) = reason {
        if let Err(e) = fail(shared, op, &reason).await {
            tracing::warn!(error = %e, "cannot record the operation as failed; trying again");
        } else {
            lock(ledger).remove(&op.id);
        }
    }
}

/// Ends `op` as failed with `why` (the ring rolls its placement back).
pub(crate) async fn fail(shared: &Shared, op: &Operation, why: &str) -> Result<(), RingError> {
    shared.metrics().finished(kind_of(op), "failed");
    shared
        .propose_cmd(RingCommand::AdvanceOperation {
            id: op.id,
            step: OperationStep::Failed,
            detail: why.to_string(),
            at_ms: now_ms(),
            outcome: None,
        })
        .await
}

/// A failover whose old lease ended: this member restores now (or goes on
/// with what it restored while the lease ran out, if that is still current).
async fn begin_restore(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
) -> Result<(), RingError> {
    // what serves next is ready here once the standby is promoted or the
    // early restore is current: the lease is taken in this same step
    let ready = op.promotes() || keep_early_restore_if_current(shared, mover, op).await?;
    let from = match op.promotes() {
        true => "its hot standby".to_string(),
        false => shared
            .bucket()
            .map_or_else(String::new, |b| b.config.url.to_string()),
    };
    shared
        .propose_cmd(RingCommand::AdvanceOperation {
            id: op.id,
            step: OperationStep::Restoring,
            detail: format!("{} restores {} from {from}", shared.name(), op.shoot()),
            at_ms: now_ms(),
            outcome: None,
        })
        .await?;
    if ready {
        // promoted, or restored, while the old lease ran out: take the new
        // epoch's lease in the same step, a round (observing the seed
        // included) sooner than the lease step would; if this fails, the
        // lease step takes it
        if let Err(e) = shared.renew_lease(op.shoot(), op.epoch()).await {
            tracing::warn!(error = %e, "cannot take the new epoch's lease yet");
        }
    }
    Ok(())
}

/// A restore from the bucket made while the old host's lease ran out is
/// used only if the bucket holds nothing newer now that the lease ended: a
/// host that was cut off or stalled, not dead, may have backed up more until
/// its guard fenced it. Otherwise it is discarded and the shoot restored
/// again (what the ring did before restoring early, at the same cost).
/// Returns whether it kept a current restore.
async fn keep_early_restore_if_current(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
) -> Result<bool, RingError> {
    let shoot = op.shoot();
    let Some(report) = mover.bucket_report(shoot, op.id) else {
        return Ok(false);
    };
    let bucket = shared
        .bucket()
        .ok_or_else(|| RingError::Unsupported(format!("{} has no backup bucket", shared.name())))?;
    let latest = bucket.latest_revision(shoot).await?;
    match early_restore_is_current(report.reached_revision, latest) {
        true => {
            tracing::info!(
                revision = report.reached_revision,
                "the restore made while the old lease ran out is current"
            );
            Ok(true)
        }
        false => {
            tracing::info!(
                revision = report.reached_revision,
                bucket = ?latest,
                "the bucket moved on while the old lease ran out: restoring again"
            );
            mover.discard_bucket_restore(shoot, op.id).map(|()| false)
        }
    }
}

/// Whether a restore that reached `reached` holds everything the bucket
/// holds now (`latest`).
fn early_restore_is_current(reached: i64, latest: Option<i64>) -> bool {
    latest.is_none_or(|l| l <= reached)
}

/// One step of a migration's source.
async fn source_step(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
    action: SourceAction,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    match action {
        SourceAction::StopWriters => {
            shared.backups.stop(shoot);
            shared.set_hosted(shoot, false, "handing over: writers stopped".into());
            mover.stop_writers(shoot).await
        }
        SourceAction::StartEtcd => mover.start_etcd(shoot).await,
        SourceAction::TakeSnapshot => mover.take_final_snapshot(shoot).await,
        SourceAction::StopEtcd => mover.stop_etcd(shoot).await,
        SourceAction::ReportHandover => {
            let info = mover.handover_info(shoot).ok_or_else(|| {
                RingError::Migrate(migrate::MigrateError::Handover {
                    shoot: shoot.to_string(),
                    message: "the final snapshot vanished before the handover".into(),
                })
            })?;
            shared
                .propose_cmd(RingCommand::HandoverReady {
                    id: op.id,
                    revision: info.revision,
                    at_ms: now_ms(),
                })
                .await?;
            let detail = format!(
                "handed over at revision {} to {}",
                info.revision,
                op.target()
            );
            shared.set_hosted(shoot, false, detail);
            Ok(())
        }
        SourceAction::Wait => Ok(()),
    }
}

/// One step of a move's target.
async fn target_step(
    shared: &Arc<Shared>,
    mover: &dyn Mover,
    op: &Operation,
    action: TargetAction,
    ledger: &Ledger,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let epoch = op.epoch();
    let from_bucket = matches!(op.kind, OperationKind::Failover { .. });
    match action {
        TargetAction::Fetch | TargetAction::Restore if op.promotes() => {
            let ops = shared
                .executor()
                .ok_or_else(|| RingError::Unsupported(format!("{} has no seed", shared.name())))?
                .standby()
                .map_err(RingError::Unsupported)?;
            // the promoted etcd may serve its warm kube-apiserver (out of
            // the shoot's address) until the old lease has ended and the new
            // one renews it: two leases after the promotion bound that
            let hold = Duration::from_millis(2 * shared.timing().lease_ms);
            let report = ops.promote_standby(shoot, op.id, hold).await?;
            // still listed as a standby here until the start: an operation
            // that fails before it leaves what the promotion started to the
            // standby's leave duty
            let detail = format!(
                "promoted the hot standby at revision {}",
                report.reached_revision
            );
            shared.set_hosted(shoot, false, detail);
            Ok(())
        }
        TargetAction::Fetch | TargetAction::Restore if from_bucket => {
            let bucket = shared.bucket().ok_or_else(|| {
                RingError::Unsupported(format!("{} has no backup bucket", shared.name()))
            })?;
            let report = mover.restore_bucket(shoot, op.id, bucket).await?;
            let detail = format!("restored revision {}", report.reached_revision);
            shared.set_hosted(shoot, false, detail);
            Ok(())
        }
        TargetAction::Fetch => {
            let OperationKind::Migration { from, .. } = &op.kind else {
                return Ok(());
            };
            fetch::fetch(shared, mover, op, from).await
        }
        TargetAction::Restore => mover.restore_handover(shoot, epoch).await,
        TargetAction::AcquireLease => shared.renew_lease(shoot, epoch).await,
        TargetAction::Start => {
            finish::record_epoch_begin(shared, mover, op).await?;
            shared
                .executor()
                .map(Arc::clone)
                .ok_or_else(|| RingError::Unsupported(format!("{} has no seed", shared.name())))?
                .start(shoot)
                .await?;
            if op.promotes() {
                lock(&shared.standbys).remove(shoot);
            }
            let from = if from_bucket { " from the bucket" } else { "" };
            let detail = format!("restored{from}; verifying (epoch {epoch})");
            shared.serve_moved(shoot, epoch, detail);
            Ok(())
        }
        TargetAction::Verify => {
            mover.wait_ready(shoot, READY_TIMEOUT).await?;
            finish::release_leader_leases(mover, op).await;
            let objects = if from_bucket {
                finish::verify_bucket_restore(mover, op).await?
            } else {
                mover.verify_handover(shoot).await?
            };
            lock(ledger).entry(op.id).or_default().verified = Some(objects);
            Ok(())
        }
        TargetAction::Complete => {
            let progress = lock(ledger).remove(&op.id).unwrap_or_default();
            finish::complete(shared, mover, op, progress).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(running: bool) -> OperationFacts {
        OperationFacts::Target {
            fetched: true,
            restored: true,
            running,
        }
    }

    /// A step that never ends is given up at its deadline with a retryable
    /// error (the operation's retry budget then decides); one that ends in
    /// time keeps its own result.
    #[tokio::test]
    async fn a_step_past_its_deadline_is_given_up_as_a_retryable_failure() {
        let deadline = Duration::from_secs(1);
        let hung = bounded("verify", deadline, std::future::pending()).await;
        match hung {
            Err(
                e @ RingError::StepTimeout {
                    step: "verify",
                    secs: 1,
                },
            ) => {
                assert!(e.is_retryable());
                assert_eq!(e.to_string(), "verify took longer than 1 s: given up");
            }
            other => panic!("{other:?}"),
        }
        let done = bounded("verify", deadline, async { Ok(()) }).await;
        assert!(done.is_ok());
        let failed = bounded("verify", deadline, async {
            Err(RingError::Verification("count".into()))
        })
        .await;
        assert!(matches!(failed, Err(RingError::Verification(_))));
        assert_eq!(
            step_deadline(&Step::Target(TargetAction::Restore)),
            Duration::from_secs(900)
        );
        assert_eq!(
            step_deadline(&Step::Target(TargetAction::Verify)),
            Duration::from_secs(300)
        );
    }

    #[test]
    fn an_early_restore_is_used_only_if_the_bucket_has_nothing_newer() {
        // (reached, the bucket's newest now) → used?
        for (reached, latest, used) in [
            (670, Some(670), true),
            (670, Some(600), true),
            (670, None, true),
            (670, Some(671), false),
        ] {
            assert_eq!(
                early_restore_is_current(reached, latest),
                used,
                "reached {reached}, bucket {latest:?}"
            );
        }
    }

    #[test]
    fn facts_count_once_and_only_when_observed_after_the_last_step() {
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        // (observation began, last step ended) → used?
        let cases = [
            ("no step yet", Some(later(10)), None, true),
            (
                "observed after the step",
                Some(later(20)),
                Some(later(10)),
                true,
            ),
            (
                "observed while the step ran",
                Some(later(5)),
                Some(later(10)),
                false,
            ),
            ("nothing observed", None, Some(later(10)), false),
        ];
        for (name, began, ended, used) in cases {
            let mut p = Progress {
                facts: began.map(|b| (b, running(true))),
                step_ended: ended,
                ..Default::default()
            };
            assert_eq!(p.take_fresh_facts().is_some(), used, "{name}");
            assert_eq!(p.take_fresh_facts(), None, "{name}: used at most once");
        }
    }

    /// A step that succeeded and is not the last one again moves its
    /// operation on; a repeated one (a start while kube-apiserver comes up)
    /// or a failed one does not.
    #[test]
    fn only_a_new_successful_step_moves_an_operation_on() {
        for (last, this, ok, moved) in [
            (None, "fetch", true, true),
            (Some("fetch"), "restore", true, true),
            (Some("start"), "start", true, false),
            (Some("restore"), "acquire_lease", false, false),
            (None, "fetch", false, false),
        ] {
            assert_eq!(
                moved_on(last, this, ok),
                moved,
                "{last:?} -> {this} ok={ok}"
            );
        }
    }

    /// The first facts observed after a step that moved the operation on
    /// wake the member, once; facts whose observation began while the step
    /// ran, and facts while nothing moves (waiting for the other side), do not.
    #[test]
    fn facts_wake_the_member_once_after_a_step_that_moved_on() {
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        let mut p = Progress {
            step_ended: Some(later(10)),
            wake_on_facts: true,
            ..Default::default()
        };
        assert!(
            !p.observed(later(5), running(false)),
            "began before the step ended"
        );
        assert!(p.observed(later(20), running(false)), "first fresh facts");
        assert!(!p.observed(later(30), running(false)), "once only");
        let mut waiting = Progress::default();
        for ms in [10, 20, 30] {
            assert!(
                !waiting.observed(later(ms), running(false)),
                "no step moved: {ms}"
            );
        }
    }
}
