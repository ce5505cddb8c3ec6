//! Carrying out the hot standby duties through the seed's [`StandbyOps`]:
//! each runs as a task keyed by shoot (one standby step per shoot at a
//! time); a failed one is tried again after [`STANDBY_RETRY`].

use std::time::{Duration, Instant};

use tracing::Instrument;

use super::MemberLoop;
use crate::executor::StandbyOps;
use crate::shared::{lock, Shared};
use crate::state::RingCommand;
use crate::RingError;

/// A failed standby step is tried again after this.
const STANDBY_RETRY: Duration = Duration::from_secs(5);

/// One hot standby step of a shoot (from the duties).
#[derive(Debug, Clone, Copy)]
pub(super) enum StandbyStep {
    /// Join the shoot's etcd as its standby; once it votes, tell the ring.
    Join { epoch: u64, slot: u64 },
    /// Stop a standby no longer assigned here (`keep`: its data now serves).
    Leave { keep: bool },
    /// On the host: keep the shoot's etcd to the assigned standby.
    DropPeers { keep: Option<u64> },
}

impl MemberLoop {
    /// Runs `step` of `shoot` in its task; a failed step is reported in
    /// the shoot's detail and tried again after [`STANDBY_RETRY`].
    pub(super) fn standby_step(&self, shoot: String, step: StandbyStep) {
        let (executor, shared, retry) = (
            self.executor.clone(),
            self.shared.clone(),
            self.standby_retry.clone(),
        );
        let span = tracing::info_span!("standby", %shoot, ?step);
        self.spawn_once(
            format!("standby:{shoot}"),
            async move {
                let Ok(ops) = executor.standby() else {
                    return;
                };
                match run(ops, &shared, &shoot, step).await {
                    Ok(done) => {
                        tracing::info!("{done}");
                        lock(&retry).remove(&shoot);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "standby step failed; trying again");
                        shared.set_hosted_detail(&shoot, format!("standby of {shoot}: {e}"));
                        lock(&retry).insert(shoot, Instant::now() + STANDBY_RETRY);
                    }
                }
            }
            .instrument(span),
        );
    }
}

/// One step; what it achieved, for the log.
async fn run(
    ops: &dyn StandbyOps,
    shared: &Shared,
    shoot: &str,
    step: StandbyStep,
) -> Result<&'static str, RingError> {
    match step {
        StandbyStep::Join { epoch, slot } => {
            let bucket = shared.bucket().ok_or_else(|| {
                RingError::Unsupported(format!("{} has no backup bucket", shared.name()))
            })?;
            // from the first attempt on, the seed may run it: leaving stops it
            lock(&shared.standbys).insert(shoot.to_string());
            ops.join_standby(shoot, slot, epoch, bucket).await?;
            let ready = |warm| RingCommand::StandbyReady {
                shoot: shoot.to_string(),
                epoch,
                member: shared.name().to_string(),
                warm,
            };
            shared.propose_cmd(ready(false)).await?;
            // the standby protects every write from here on; a warm
            // kube-apiserver only shortens a promotion: without one the
            // promotion starts a kube-apiserver as usual
            match ops.warm_standby(shoot, slot).await {
                Ok(true) => {
                    // informational: refused once the standby was promoted
                    // or moved meanwhile, which is no failure of this step
                    if let Err(e) = shared.propose_cmd(ready(true)).await {
                        tracing::info!(error = %e, "the warm kube-apiserver was not recorded");
                    }
                    Ok("standby votes; a kube-apiserver waits next to it")
                }
                Ok(false) => Ok("standby votes"),
                Err(e) => {
                    tracing::warn!(error = %e, "the standby votes, but no warm kube-apiserver waits next to it");
                    Ok("standby votes (no warm kube-apiserver)")
                }
            }
        }
        StandbyStep::Leave { keep } => {
            ops.leave_standby(shoot, keep).await?;
            lock(&shared.standbys).remove(shoot);
            Ok("standby stopped: no longer assigned here")
        }
        StandbyStep::DropPeers { keep } => {
            let res = ops.drop_peers(shoot, keep).await;
            // the next health check looks again
            if let Some(h) = lock(&shared.hosted).get_mut(shoot) {
                h.etcd_peers = None;
                h.etcd_quorum = None;
            }
            res?;
            Ok("the shoot's etcd keeps only its assigned standby")
        }
    }
}
