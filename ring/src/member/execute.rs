//! Carrying out one duty through the seed's executor. Fencing, reports and
//! backup switches act at once; starts, health probes, lease renewals,
//! releases and operation steps run as tasks keyed by shoot (or operation),
//! so a slow one never delays fencing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::duties::Duty;
use super::execute_standby::StandbyStep;
use super::observe::operation_key;
use super::operations::{self, Step};
use super::MemberLoop;
use crate::now_ms;
use crate::shared::lock;
use crate::state::RingState;

/// A failed start is tried again after this.
const START_RETRY: Duration = Duration::from_secs(5);
/// A failed look at a control plane's certificates is tried again after
/// this, doubled after each further failure up to the usual period.
const CERTIFICATES_RETRY: Duration = Duration::from_secs(60);

/// When to look again after the `failures`-th failure in a row.
fn certificates_retry(failures: u32, every: Duration) -> Duration {
    let doubled = CERTIFICATES_RETRY.saturating_mul(1 << failures.saturating_sub(1).min(16));
    doubled.min(every)
}

/// How long a health check waits for the members of a shoot's etcd.
const PEERS_TIMEOUT: Duration = Duration::from_secs(5);

impl MemberLoop {
    /// Carries out `duty` (state: the ring state it was decided from).
    pub(super) async fn execute(&self, duty: Duty, state: &RingState) {
        match duty {
            Duty::Start { shoot, epoch } => self.start(shoot, epoch),
            Duty::Fence { shoot, reason } => self.fence(&shoot, &reason).await,
            Duty::CheckHealth { shoot } => self.check_health(shoot),
            Duty::RenewCertificates { shoot } => self.renew_certificates(shoot),
            Duty::StartBackup { shoot, epoch } => self.start_backup(&shoot, epoch),
            Duty::StopBackup { shoot } => self.shared.backups.stop(&shoot),
            Duty::RenewLease { shoot, epoch } => self.renew_lease(shoot, epoch),
            Duty::Report { shoot, detail } => self.shared.set_hosted_detail(&shoot, detail),
            Duty::MarkMoved { shoot, epoch } => self.mark_moved(shoot, epoch),
            Duty::KeepData { shoot } => {
                if let Some(marker) = self.release_marker(&shoot) {
                    let _ = std::fs::remove_file(marker);
                }
            }
            Duty::ReleaseData { shoot } => self.release(shoot, state),
            Duty::Source { op, action, .. } => self.step(state, op, Step::Source(action)),
            Duty::Target { op, action, .. } => self.step(state, op, Step::Target(action)),
            Duty::BeginRestore { op, .. } => self.step(state, op, Step::BeginRestore),
            Duty::Refuse { op, reason, .. } => self.refuse(state, op, reason),
            Duty::JoinStandby { shoot, epoch, slot } => {
                self.standby_step(shoot, StandbyStep::Join { epoch, slot })
            }
            Duty::LeaveStandby { shoot, keep } => {
                self.standby_step(shoot, StandbyStep::Leave { keep })
            }
            Duty::DropPeers { shoot, keep } => {
                self.standby_step(shoot, StandbyStep::DropPeers { keep })
            }
        }
    }

    /// Starts the control plane in a task; `starting` is recorded before the
    /// task exists, so the next round does not start a second one and
    /// shutdown waits for it.
    fn start(&self, shoot: String, epoch: u64) {
        {
            let mut all = lock(&self.shared.hosted);
            let h = all.entry(shoot.clone()).or_default();
            h.starting = true;
            h.epoch = epoch;
            h.detail = "starting".into();
        }
        self.shared.metrics().started();
        let (executor, shared) = (self.executor.clone(), self.shared.clone());
        let span = tracing::info_span!("serve", %shoot, epoch);
        self.spawn_once(
            format!("start:{shoot}"),
            async move {
                let res = executor.start(&shoot).await;
                let mut all = lock(&shared.hosted);
                let h = all.entry(shoot.clone()).or_default();
                h.starting = false;
                match res {
                    Ok(()) => {
                        h.serving = true;
                        h.detail = "serving".into();
                        h.next_attempt = None;
                        // the start reissued what was due: the next look in a period
                        h.certificates_at = Some(Instant::now() + shared.certificate_check());
                        tracing::info!("control plane serving");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the control plane");
                        h.detail = format!("start failed: {e}");
                        h.next_attempt = Some(Instant::now() + START_RETRY);
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Stops serving at once: the backup first, then the control plane.
    async fn fence(&self, shoot: &str, reason: &str) {
        let epoch = lock(&self.shared.hosted).get(shoot).map_or(0, |h| h.epoch);
        let span = tracing::info_span!("serve", %shoot, epoch);
        async {
            tracing::warn!(%reason, "fencing the control plane");
            self.shared.backups.stop(shoot);
            if let Err(e) = self.executor.fence(shoot).await {
                tracing::error!(error = %e, "fencing failed");
            }
        }
        .instrument(span)
        .await;
        let mut all = lock(&self.shared.hosted);
        let h = all.entry(shoot.to_string()).or_default();
        h.serving = false;
        h.ready = false;
        self.shared.metrics().fenced();
    }

    /// Renews the shoot's due certificates in a task; the next look is
    /// scheduled before it runs (sooner after a failure).
    fn renew_certificates(&self, shoot: String) {
        let every = self.shared.certificate_check();
        let epoch = {
            let mut all = lock(&self.shared.hosted);
            let h = all.entry(shoot.clone()).or_default();
            h.certificates_at = Some(Instant::now() + every);
            h.epoch
        };
        let (executor, shared) = (self.executor.clone(), self.shared.clone());
        let span = tracing::info_span!("certificates", %shoot, epoch);
        self.spawn_once(
            format!("certificates:{shoot}"),
            async move {
                let res = executor.renew_certificates(&shoot).await;
                let mut all = lock(&shared.hosted);
                let Some(h) = all.get_mut(&shoot) else { return };
                match res {
                    Ok(renewed) => {
                        h.certificates_failures = 0;
                        if !renewed.is_empty() {
                            tracing::info!(?renewed, "control plane certificates renewed online");
                        }
                    }
                    Err(e) => {
                        h.certificates_failures += 1;
                        let retry = certificates_retry(h.certificates_failures, every);
                        tracing::warn!(error = %e, failures = h.certificates_failures, retry_s = retry.as_secs(), "cannot renew the control plane's certificates");
                        h.certificates_at = Some(Instant::now() + retry);
                    }
                }
            }
            .instrument(span),
        );
    }

    fn check_health(&self, shoot: String) {
        if let Some(h) = lock(&self.shared.hosted).get_mut(&shoot) {
            h.last_health = Some(Instant::now());
        }
        let (executor, shared) = (self.executor.clone(), self.shared.clone());
        self.spawn_once(format!("health:{shoot}"), async move {
            let health = executor.health(&shoot).await;
            let (peers, quorum) = match (shared.config.protection, executor.standby()) {
                (crate::config::Protection::Standby, Ok(ops)) => {
                    // an etcd that lost its quorum before it became ready
                    // answers nothing at all: peers unknown, quorum false
                    let peers = tokio::time::timeout(PEERS_TIMEOUT, ops.etcd_peers(&shoot))
                        .await
                        .ok()
                        .and_then(Result::ok);
                    let quorum = match &peers {
                        Some(p) if p.is_empty() => None,
                        _ => Some(ops.etcd_quorum(&shoot).await),
                    };
                    (peers, quorum)
                }
                _ => (None, None),
            };
            if let Some(h) = lock(&shared.hosted).get_mut(&shoot) {
                h.ready = health.ready && h.serving;
                h.versions = health.versions;
                h.etcd_peers = peers.filter(|_| h.serving);
                h.etcd_quorum = quorum.filter(|_| h.serving);
            }
        });
    }

    fn start_backup(&self, shoot: &str, epoch: u64) {
        let (Some(bucket), Ok(mover)) = (self.shared.bucket(), self.executor.mover()) else {
            return;
        };
        match mover.backup_plan(shoot) {
            Ok(plan) => self.shared.backups.ensure(
                plan,
                bucket,
                (shoot, epoch),
                &self.shared.stop,
                self.shared.commands.clone(),
            ),
            Err(e) => tracing::error!(%shoot, error = %e, "cannot back up"),
        }
    }

    fn renew_lease(&self, shoot: String, epoch: u64) {
        let shared = self.shared.clone();
        self.spawn_once(format!("lease:{shoot}"), async move {
            match shared.renew_lease(&shoot, epoch).await {
                Ok(()) => {
                    if let Some(h) = lock(&shared.hosted).get_mut(&shoot) {
                        h.lease_retry = None;
                    }
                }
                Err(e) => tracing::warn!(%shoot, epoch, error = %e, "lease not renewed"),
            }
        });
    }

    /// Fences what may still run of a shoot that moved away (workloads in a
    /// cluster outlive a crashed ringd), then starts its release clock.
    fn mark_moved(&self, shoot: String, epoch: u64) {
        let Some(marker) = self.release_marker(&shoot) else {
            return;
        };
        let executor = self.executor.clone();
        self.spawn_once(format!("release:{shoot}"), async move {
            if let Err(e) = executor.fence_moved(&shoot).await {
                tracing::warn!(%shoot, error = %e, "cannot fence a moved control plane; it is deleted after the grace");
            }
            if let Err(e) = std::fs::write(&marker, format!("{epoch} {}", now_ms())) {
                tracing::warn!(%shoot, error = %e, "cannot record the release of a moved control plane");
            }
        });
    }

    fn release(&self, shoot: String, state: &RingState) {
        let (host, epoch) = state
            .placements
            .get(&shoot)
            .map_or((String::new(), 0), |p| (p.host.clone(), p.epoch));
        let (executor, shared) = (self.executor.clone(), self.shared.clone());
        self.spawn_once(format!("release:{shoot}"), async move {
            match executor.remove(&shoot).await {
                Ok(()) => {
                    tracing::info!(%shoot, %host, epoch, "deleted the data of a control plane that moved away");
                    lock(&shared.hosted).remove(&shoot);
                }
                Err(e) => tracing::warn!(%shoot, error = %e, "cannot delete a moved control plane's data"),
            }
        });
    }

    /// Runs one step of operation `id` in a task (one step per operation at a time).
    fn step(&self, state: &RingState, id: u64, step: Step) {
        let Some(op) = state.operations.iter().find(|o| o.id == id).cloned() else {
            return;
        };
        let (executor, shared, ledger) = (
            self.executor.clone(),
            self.shared.clone(),
            self.ledger.clone(),
        );
        let span = tracing::info_span!(
            "operation",
            op = op.id,
            kind = operations::kind_of(&op),
            shoot = %op.shoot(),
            epoch = op.epoch(),
        );
        let wake = self.waker();
        self.spawn_once(
            operation_key(id),
            async move {
                let Ok(mover) = executor.mover() else {
                    return;
                };
                if operations::run_step(&shared, mover, &op, step, &ledger).await {
                    wake.notify_one();
                }
            }
            .instrument(span),
        );
    }

    /// Ends an operation this member's seed cannot carry out.
    fn refuse(&self, state: &RingState, id: u64, reason: String) {
        let Some(op) = state.operations.iter().find(|o| o.id == id).cloned() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        self.spawn_once(operation_key(id), async move {
            tracing::warn!(op = op.id, shoot = %op.shoot(), %reason, "refusing an operation this seed cannot carry out");
            if let Err(e) = operations::fail(&shared, &op, &reason).await {
                tracing::warn!(op = op.id, error = %e, "cannot refuse an operation");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_certificate_look_backs_off_up_to_the_usual_period() {
        let hour = Duration::from_secs(3600);
        let waits: Vec<u64> = (1..=8)
            .map(|n| certificates_retry(n, hour).as_secs())
            .collect();
        assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(certificates_retry(u32::MAX, hour), hour, "no overflow");
        let short = Duration::from_secs(2);
        assert_eq!(
            certificates_retry(1, short),
            short,
            "never later than the next look"
        );
    }
}
