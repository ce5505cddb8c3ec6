//! What this member must do, decided from the replicated state and what it
//! observes of its seed: a pure function, no I/O (the member-side twin of
//! `decide.rs`). The member loop observes, calls [`duties`], and hands each
//! [`Duty`] to the executor of its seed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use migrate::plan::{source_next, target_next, SourceAction, SourceView, TargetAction, TargetView};

use crate::config::FENCE_EARLY_DIVISOR;
use crate::state::{Operation, OperationKind, OperationStep, RingState, Role};

/// What this member's seed can do and how it is timed.
#[derive(Debug, Clone)]
pub struct SeedFacts {
    /// The seed restores and hands over control planes (moves onto or off it).
    /// When false, it says why, and every move it would take part in is refused.
    pub moves: Result<(), String>,
    /// The seed takes part in planned migrations (a failover needs only `moves`).
    pub migrates: Result<(), String>,
    /// A bucket is configured: backups run, failovers can restore.
    pub bucket: bool,
    /// How long a lease lasts.
    pub lease: Duration,
    /// How long the data of a control plane that moved away is kept.
    pub release_grace_ms: u64,
    /// The seed runs hot standbys, or why it cannot.
    pub standby: Result<(), String>,
}

impl Default for SeedFacts {
    fn default() -> Self {
        SeedFacts {
            moves: Ok(()),
            migrates: Ok(()),
            bucket: false,
            lease: Duration::from_secs(6),
            release_grace_ms: 3_600_000,
            standby: Ok(()),
        }
    }
}

/// The lease this member holds on a shoot, as far as it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLease {
    pub epoch: u64,
    /// When it ends (measured from when the renewal was sent).
    pub valid_until: Instant,
    /// When to renew next (a third of the lease after the last renewal, sooner
    /// after a failed one).
    pub renew_at: Instant,
}

/// What this member sees of one shoot on its seed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShootSeen {
    /// Its control plane serves here (started by this member, not fenced since).
    pub serving: bool,
    /// A start is in flight.
    pub starting: bool,
    /// After a failed start: not before this.
    pub retry_start_at: Option<Instant>,
    /// After a failed lease renewal with no lease held: not before this.
    pub lease_retry_at: Option<Instant>,
    /// When health was last checked.
    pub last_health: Option<Instant>,
    /// When to look at its certificates next (`None`: at once).
    pub certificates_at: Option<Instant>,
    /// The epoch the continuous backup writes its objects at, while it runs
    /// (`None`: it does not). A backup of an older epoch than the
    /// placement's is restarted.
    pub backup_epoch: Option<u64>,
    /// The seed keeps data (or workloads) of this shoot (observed on
    /// release rounds, the only ones that look at it).
    pub has_data: bool,
    /// The shoot moved away and this member saw it at (epoch, wall ms).
    pub released: Option<(u64, u64)>,
    /// Facts about the open operation this member takes part in.
    pub operation: Option<OperationSeen>,
    /// This seed runs a hot standby of the shoot.
    pub standby_running: bool,
    /// After a failed standby step (join, leave, dropping peers): not before this.
    pub standby_retry_at: Option<Instant>,
    /// On the host: the other members of the shoot's etcd, by the member id
    /// their standby ports name (`None`: not a standby's); `None` until seen.
    pub etcd_peers: Option<Vec<Option<u64>>>,
    /// On the host: whether the shoot's etcd has a quorum (`None`: not
    /// looked, e.g. no peers).
    pub etcd_quorum: Option<bool>,
}

/// What this member observed of an operation it takes part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationSeen {
    /// The operation's id (facts of another operation are stale).
    pub id: u64,
    /// The source's view, or the target's facts.
    pub facts: OperationFacts,
    /// After a failed step: not before this.
    pub retry_at: Option<Instant>,
    /// The target verified the restored control plane (revision, HashKV, objects).
    pub verified: bool,
}

/// The seed's facts for one side of a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationFacts {
    Source(SourceView),
    Target {
        /// The data is here (handover fetched, or the bucket restore recorded).
        fetched: bool,
        /// The data is restored into the shoot's etcd.
        restored: bool,
        /// Every component of the control plane runs.
        running: bool,
    },
}

/// Everything [`duties`] looks at besides the ring state.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub seed: SeedFacts,
    /// Shoot → what this member sees of it (every shoot its seed holds or it hosts).
    pub shoots: BTreeMap<String, ShootSeen>,
    /// Shoot → the lease this member holds.
    pub leases: BTreeMap<String, HeldLease>,
    /// Wall clock (ms since the Unix epoch) for release graces, which survive restarts.
    pub wall_ms: u64,
    /// Whether to look at moved-away data this round (every few seconds).
    pub release_due: bool,
}

/// One thing for the executor of this member's seed to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Duty {
    /// Start serving the shoot's control plane at `epoch` (its lease is held).
    Start { shoot: String, epoch: u64 },
    /// Stop serving it at once (lease lost or about to end, moved, operation),
    /// its backup first.
    Fence { shoot: String, reason: String },
    /// Probe its health (for the leader's report).
    CheckHealth { shoot: String },
    /// Renew the certificates of its control plane that are due, online.
    RenewCertificates { shoot: String },
    /// Run the continuous backup of a control plane that serves here.
    StartBackup { shoot: String, epoch: u64 },
    /// Stop the continuous backup (the control plane no longer serves here).
    StopBackup { shoot: String },
    /// Renew (or acquire) the lease on `shoot` for `epoch` through the quorum.
    RenewLease { shoot: String, epoch: u64 },
    /// Say why the shoot is in its state (shown in `ringctl status`).
    Report { shoot: String, detail: String },
    /// The shoot moved away at `epoch`: fence what may still run and start the
    /// release clock.
    MarkMoved { shoot: String, epoch: u64 },
    /// The shoot is needed here again: stop the release clock.
    KeepData { shoot: String },
    /// The grace after a move ended: delete the shoot's data from this seed.
    ReleaseData { shoot: String },
    /// One step of a planned migration's source.
    Source {
        op: u64,
        shoot: String,
        action: SourceAction,
    },
    /// One step of a move's target (migration or failover).
    Target {
        op: u64,
        shoot: String,
        epoch: u64,
        action: TargetAction,
    },
    /// A failover whose old lease ended: record that this member restores now.
    BeginRestore { op: u64, shoot: String },
    /// End an operation this member cannot carry out, with the reason.
    Refuse {
        op: u64,
        shoot: String,
        reason: String,
    },
    /// Run (or finish joining) the hot standby of a shoot served elsewhere at
    /// `epoch`, as member id `slot`; report it ready once it votes.
    JoinStandby {
        shoot: String,
        epoch: u64,
        slot: u64,
    },
    /// Stop the standby of a shoot (no longer assigned here); its data is
    /// moved aside unless `keep`.
    LeaveStandby { shoot: String, keep: bool },
    /// On the host: remove every member of the shoot's etcd but the standby
    /// of member id `keep` (re-forming etcd alone if its quorum is gone).
    DropPeers { shoot: String, keep: Option<u64> },
}

impl Duty {
    /// The shoot the duty is about.
    pub fn shoot(&self) -> &str {
        match self {
            Duty::Start { shoot, .. }
            | Duty::Fence { shoot, .. }
            | Duty::CheckHealth { shoot }
            | Duty::RenewCertificates { shoot }
            | Duty::StartBackup { shoot, .. }
            | Duty::StopBackup { shoot }
            | Duty::RenewLease { shoot, .. }
            | Duty::Report { shoot, .. }
            | Duty::MarkMoved { shoot, .. }
            | Duty::KeepData { shoot }
            | Duty::ReleaseData { shoot }
            | Duty::Source { shoot, .. }
            | Duty::Target { shoot, .. }
            | Duty::BeginRestore { shoot, .. }
            | Duty::Refuse { shoot, .. }
            | Duty::JoinStandby { shoot, .. }
            | Duty::LeaveStandby { shoot, .. }
            | Duty::DropPeers { shoot, .. } => shoot,
        }
    }
}

/// How often a serving control plane's health is probed.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// Whether a duty of kind `is_kind` about `shoot` was decided already this round.
fn emitted(out: &[Duty], shoot: &str, is_kind: fn(&Duty) -> bool) -> bool {
    out.iter().any(|d| d.shoot() == shoot && is_kind(d))
}

/// Whether `lease` is held for `epoch` and does not end within the fencing margin.
pub fn lease_valid(lease: Option<&HeldLease>, epoch: u64, length: Duration, now: Instant) -> bool {
    let early = length / FENCE_EARLY_DIVISOR;
    lease.is_some_and(|l| l.epoch == epoch && now + early < l.valid_until)
}

/// Everything member `me` must do now, in order: operation steps, leases,
/// serving (start, fence, health, backups), then moved-away data.
pub fn duties(state: &RingState, me: &str, observed: &Observed, now: Instant) -> Vec<Duty> {
    let mut out = Vec::new();
    let mut shoots: Vec<&str> = state
        .placements
        .values()
        .filter(|p| p.host == me || p.standby.as_ref().is_some_and(|s| s.member == me))
        .map(|p| p.shoot.as_str())
        .collect();
    shoots.extend(observed.shoots.keys().map(String::as_str));
    shoots.sort_unstable();
    shoots.dedup();
    for shoot in shoots {
        let seen = observed.shoots.get(shoot).cloned().unwrap_or_default();
        let op = state.open_operation(shoot);
        let role = op.map_or(Role::None, |o| o.role_of(me));
        // both sides of a move drive the control plane themselves, except the
        // target of a failover that has not begun restoring
        let mut drives = false;
        if let (Some(op), Role::Source | Role::Target) = (op, role) {
            // a standby here leaves first (its etcd holds the data dir a
            // move restores into), unless this move promotes it
            if !seen.standby_running || op.promotes() {
                operation_duties(op, role, shoot, &seen, observed, now, &mut out);
            }
            drives = op.is_migration()
                || !matches!(
                    op.step,
                    OperationStep::Pending | OperationStep::WaitingForLeaseExpiry
                );
        }
        standby::standby_duties(state, me, shoot, &seen, observed, now, &mut out);
        lease_duty(state, me, shoot, &seen, observed, now, &mut out);
        if !drives {
            serving_duties(state, me, shoot, &seen, observed, now, &mut out);
        }
        backup_duty(state, me, shoot, &seen, observed, &mut out);
        if observed.release_due {
            release_duty(state, me, shoot, &seen, observed, &mut out);
        }
    }
    out
}

/// The steps of an operation this member takes part in.
fn operation_duties(
    op: &Operation,
    role: Role,
    shoot: &str,
    seen: &ShootSeen,
    observed: &Observed,
    now: Instant,
    out: &mut Vec<Duty>,
) {
    let refused = match &observed.seed.migrates {
        Err(why) if op.is_migration() => Some(why),
        _ => observed.seed.moves.as_ref().err(),
    };
    if let Some(why) = refused {
        out.push(Duty::Refuse {
            op: op.id,
            shoot: shoot.to_string(),
            reason: why.clone(),
        });
        return;
    }
    let facts = seen.operation.filter(|o| o.id == op.id);
    if facts.is_some_and(|f| f.retry_at.is_some_and(|t| now < t)) {
        return;
    }
    let is_failover = matches!(op.kind, OperationKind::Failover { .. });
    if is_failover && !observed.seed.bucket {
        out.push(Duty::Report {
            shoot: shoot.to_string(),
            detail: format!(
                "failover {} waits: this member has no backup bucket to restore {shoot} from",
                op.id
            ),
        });
        return;
    }
    if is_failover && op.step == OperationStep::Pending {
        out.push(Duty::BeginRestore {
            op: op.id,
            shoot: shoot.to_string(),
        });
        return;
    }
    let Some(facts) = facts else {
        return; // not observed yet: next round
    };
    match (role, facts.facts) {
        (Role::Source, OperationFacts::Source(view)) => {
            let action = source_next(&view);
            if action != SourceAction::Wait {
                out.push(Duty::Source {
                    op: op.id,
                    shoot: shoot.to_string(),
                    action,
                });
            }
        }
        (
            Role::Target,
            OperationFacts::Target {
                fetched,
                restored,
                running,
            },
        ) => {
            let epoch = op.epoch();
            let leased = lease_valid(observed.leases.get(shoot), epoch, observed.seed.lease, now);
            if running && !leased {
                // a target that lost its lease mid-move (cut off while it
                // verifies, say) stops serving like any holder; it acquires the
                // lease and starts again on a later round
                out.push(Duty::Fence {
                    shoot: shoot.to_string(),
                    reason: format!(
                        "lease for epoch {epoch} about to end while operation {} runs: fenced",
                        op.id
                    ),
                });
                return;
            }
            let view = TargetView {
                fetched,
                restored,
                leased,
                serving: running,
                verified: facts.verified,
            };
            let action = target_next(&view);
            // while the old lease runs out, a target only restores or promotes
            let early = op.step == OperationStep::WaitingForLeaseExpiry;
            if early && !matches!(action, TargetAction::Fetch | TargetAction::Restore) {
                return;
            }
            out.push(Duty::Target {
                op: op.id,
                shoot: shoot.to_string(),
                epoch,
                action,
            });
        }
        _ => {}
    }
}

/// Renew the lease of a shoot this member hosts when it is due. A move's
/// target renews only once it acquired the new epoch's lease (its own step).
fn lease_duty(
    state: &RingState,
    me: &str,
    shoot: &str,
    seen: &ShootSeen,
    observed: &Observed,
    now: Instant,
    out: &mut Vec<Duty>,
) {
    let Some(p) = state.placements.get(shoot).filter(|p| p.host == me) else {
        return;
    };
    let held = observed.leases.get(shoot).filter(|l| l.epoch == p.epoch);
    let leased = match state.open_operation(shoot) {
        None => true,
        Some(op) => op.role_of(me) == Role::Target && held.is_some(),
    };
    let due = match held {
        Some(l) => now >= l.renew_at,
        None => seen.lease_retry_at.is_none_or(|t| now >= t),
    };
    if leased && due {
        out.push(Duty::RenewLease {
            shoot: shoot.to_string(),
            epoch: p.epoch,
        });
    }
}

/// Whether the control plane should serve here, and why not.
fn desired(
    state: &RingState,
    me: &str,
    shoot: &str,
    observed: &Observed,
    now: Instant,
) -> Result<u64, String> {
    let Some(p) = state.placements.get(shoot) else {
        return Err("no such shoot in the ring".into());
    };
    if p.host != me {
        return Err(format!("moved to {} at epoch {}", p.host, p.epoch));
    }
    if state.open_operation(shoot).is_some() {
        return Err(format!("operation in progress at epoch {}", p.epoch));
    }
    let lease = observed.leases.get(shoot);
    if lease_valid(lease, p.epoch, observed.seed.lease, now) {
        Ok(p.epoch)
    } else if lease.is_some_and(|l| l.epoch == p.epoch) {
        Err("lease about to end: fenced".into())
    } else {
        Err(format!("no lease for epoch {} yet", p.epoch))
    }
}

/// Start, fence and probe the shoot's control plane as the state and
/// the lease say.
fn serving_duties(
    state: &RingState,
    me: &str,
    shoot: &str,
    seen: &ShootSeen,
    observed: &Observed,
    now: Instant,
    out: &mut Vec<Duty>,
) {
    let shoot_s = shoot.to_string();
    match desired(state, me, shoot, observed, now) {
        Ok(epoch) => {
            let retry_due = seen.retry_start_at.is_none_or(|t| now >= t);
            if !seen.serving && !seen.starting && retry_due {
                out.push(Duty::Start {
                    shoot: shoot_s.clone(),
                    epoch,
                });
            }
            if seen.serving && seen.last_health.is_none_or(|t| now >= t + HEALTH_EVERY) {
                out.push(Duty::CheckHealth {
                    shoot: shoot_s.clone(),
                });
            }
            // (a move's source and target drive their control plane
            // themselves: no look while one works on its files)
            let due = seen.certificates_at.is_none_or(|t| now >= t);
            if seen.serving && !seen.starting && due {
                out.push(Duty::RenewCertificates {
                    shoot: shoot_s.clone(),
                });
            }
        }
        Err(reason) => {
            if seen.serving {
                out.push(Duty::Fence {
                    shoot: shoot_s.clone(),
                    reason: reason.clone(),
                });
            }
            // a detail an operation step gave wins over the generic reason
            let reported = emitted(out, shoot, |d| matches!(d, Duty::Report { .. }));
            if !seen.starting && !reported {
                out.push(Duty::Report {
                    shoot: shoot_s.clone(),
                    detail: reason,
                });
            }
        }
    }
}

/// A backup runs exactly while the control plane serves here (and a bucket
/// is set), writing at the epoch of the placement here; one of an older
/// epoch (the shoot came back here under a new one) is stopped and started
/// again at the new epoch.
fn backup_duty(
    state: &RingState,
    me: &str,
    shoot: &str,
    seen: &ShootSeen,
    observed: &Observed,
    out: &mut Vec<Duty>,
) {
    if emitted(out, shoot, |d| matches!(d, Duty::Fence { .. })) {
        return; // fencing stops the backup first
    }
    let epoch = state
        .placements
        .get(shoot)
        .filter(|p| p.host == me)
        .map(|p| p.epoch);
    let want = seen.serving && observed.seed.bucket;
    let stale = seen.backup_epoch.zip(epoch).is_some_and(|(b, p)| b < p);
    let running = seen.backup_epoch.is_some();
    if want && !running {
        if let Some(epoch) = epoch {
            out.push(Duty::StartBackup {
                shoot: shoot.to_string(),
                epoch,
            });
        }
    } else if running && (!want || stale) {
        out.push(Duty::StopBackup {
            shoot: shoot.to_string(),
        });
    }
}

/// Data of a control plane that moved away is kept for the grace (counted from
/// when this member first saw it gone, per epoch), then deleted; data still
/// needed here (hosted, in a move that needs this copy, running) is kept.
fn release_duty(
    state: &RingState,
    me: &str,
    shoot: &str,
    seen: &ShootSeen,
    observed: &Observed,
    out: &mut Vec<Duty>,
) {
    let Some(p) = state.placements.get(shoot) else {
        return; // not (or not yet) a shoot of this ring: leave it alone
    };
    if !seen.has_data {
        return;
    }
    let needed = state
        .open_operation(shoot)
        .is_some_and(|op| op.is_migration() || op.target() == me)
        || p.standby.as_ref().is_some_and(|s| s.member == me)
        || seen.standby_running;
    let shoot = shoot.to_string();
    if p.host == me || needed || seen.serving || seen.starting {
        if seen.released.is_some() {
            out.push(Duty::KeepData { shoot });
        }
        return;
    }
    match seen.released {
        Some((epoch, since)) if epoch == p.epoch => {
            if observed.wall_ms.saturating_sub(since) >= observed.seed.release_grace_ms {
                out.push(Duty::ReleaseData { shoot });
            }
        }
        _ => out.push(Duty::MarkMoved {
            shoot,
            epoch: p.epoch,
        }),
    }
}

#[path = "duties_standby.rs"]
mod standby;

#[cfg(test)]
#[path = "duties_tests.rs"]
mod tests;
