//! Carrying out the hot standby duties through the seed's [`StandbyOps`]:
//! each runs as a task keyed by shoot (one standby step per shoot at a
//! time); a failed one is tried again after [`STANDBY_RETRY`].

use std::time::{Duration, Instant};

use tracing::Instrument;

use super::MemberLoop;
use crate::shared::lock;
use crate::state::RingCommand;

/// A failed standby step is tried again after this.
const STANDBY_RETRY: Duration = Duration::from_secs(5);

impl MemberLoop {
    /// Joins the shoot's etcd as its standby; once it votes, tells the ring.
    pub(super) fn join_standby(&self, shoot: String, epoch: u64, slot: u64) {
        let (executor, shared, retry) = (
            self.executor.clone(),
            self.shared.clone(),
            self.standby_retry.clone(),
        );
        let span = tracing::info_span!("standby", %shoot, epoch);
        self.spawn_once(
            format!("standby:{shoot}"),
            async move {
                let (Ok(ops), Some(bucket)) = (executor.standby(), shared.bucket()) else {
                    return;
                };
                // from the first attempt on, the seed may run it: leaving stops it
                lock(&shared.standbys).insert(shoot.clone());
                let joined = ops.join_standby(&shoot, slot, epoch, bucket).await;
                let reported = match joined {
                    Ok(()) => {
                        let member = shared.name().to_string();
                        let cmd = RingCommand::StandbyReady {
                            shoot: shoot.clone(),
                            epoch,
                            member,
                        };
                        shared.propose_cmd(cmd).await
                    }
                    Err(e) => Err(e),
                };
                match reported {
                    Ok(()) => {
                        tracing::info!("standby votes");
                        lock(&retry).remove(&shoot);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "standby not ready; trying again");
                        shared.set_hosted_detail(&shoot, format!("standby of {shoot}: {e}"));
                        lock(&retry).insert(shoot, Instant::now() + STANDBY_RETRY);
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Stops a standby no longer assigned here.
    pub(super) fn leave_standby(&self, shoot: String, keep: bool) {
        let (executor, shared, retry) = (
            self.executor.clone(),
            self.shared.clone(),
            self.standby_retry.clone(),
        );
        let span = tracing::info_span!("standby", %shoot);
        self.spawn_once(
            format!("standby:{shoot}"),
            async move {
                let Ok(ops) = executor.standby() else {
                    return;
                };
                match ops.leave_standby(&shoot, keep).await {
                    Ok(()) => {
                        lock(&shared.standbys).remove(&shoot);
                        tracing::info!(keep, "standby stopped: no longer assigned here")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot stop the standby; trying again");
                        lock(&retry).insert(shoot, Instant::now() + STANDBY_RETRY);
                    }
                }
            }
            .instrument(span),
        );
    }

    /// On the host: keeps the shoot's etcd to the assigned standby.
    pub(super) fn drop_peers(&self, shoot: String, keep: Option<u64>) {
        let (executor, shared, retry) = (
            self.executor.clone(),
            self.shared.clone(),
            self.standby_retry.clone(),
        );
        let span = tracing::info_span!("standby", %shoot);
        self.spawn_once(
            format!("standby:{shoot}"),
            async move {
                let Ok(ops) = executor.standby() else {
                    return;
                };
                let res = ops.drop_peers(&shoot, keep).await;
                // the next health check looks again
                if let Some(h) = lock(&shared.hosted).get_mut(&shoot) {
                    h.etcd_peers = None;
                    h.etcd_quorum = None;
                }
                match res {
                    Ok(()) => {
                        tracing::info!(?keep, "the shoot's etcd keeps only its assigned standby")
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot remove a former standby; trying again");
                        lock(&retry).insert(shoot, Instant::now() + STANDBY_RETRY);
                    }
                }
            }
            .instrument(span),
        );
    }
}
