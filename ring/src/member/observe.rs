//! What the member sees of its seed each round: what serves, starts, backs
//! up; the facts of the moves it takes part in; the leases it holds; the
//! release clocks of data that moved away.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::duties::{HeldLease, Observed, OperationFacts, OperationSeen, SeedFacts};
use super::MemberLoop;
use crate::now_ms;
use crate::shared::lock;
use crate::state::{Operation, OperationKind, RingState, Role};

impl MemberLoop {
    /// Observes the seed and this member's records for one round.
    pub(super) async fn observe(&self, state: &RingState, release_due: bool) -> Observed {
        let me = self.shared.name();
        let mut observed = Observed {
            seed: self.seed_facts(),
            wall_ms: now_ms(),
            release_due,
            ..Default::default()
        };
        // what the seed holds matters only to releases; the shoots it held at
        // start are in `hosted` already, so the listing is not needed every round
        if release_due {
            for shoot in self.executor.shoots() {
                observed.shoots.entry(shoot).or_default().has_data = true;
            }
        }
        for (shoot, h) in lock(&self.shared.hosted).iter() {
            let seen = observed.shoots.entry(shoot.clone()).or_default();
            seen.serving = h.serving;
            seen.starting = h.starting;
            seen.retry_start_at = h.next_attempt;
            seen.last_health = h.last_health;
            seen.certificates_at = h.certificates_at;
            seen.lease_retry_at = h.lease_retry;
            seen.etcd_peers = h.etcd_peers.clone();
            seen.etcd_quorum = h.etcd_quorum;
        }
        self.observe_standbys(state, &mut observed);
        for (shoot, seen) in observed.shoots.iter_mut() {
            seen.backup_epoch = self.shared.backups.running(shoot);
            if release_due && seen.has_data {
                seen.released = self.released(shoot);
            }
        }
        let open: Vec<&Operation> = state
            .operations
            .iter()
            .filter(|o| !o.step.is_finished())
            .collect();
        lock(&self.ledger).retain(|id, _| open.iter().any(|o| o.id == *id));
        for op in open {
            if op.role_of(me) == Role::None {
                continue;
            }
            if let Some(seen) = self.operation_seen(op) {
                let shoot = op.shoot().to_string();
                observed.shoots.entry(shoot).or_default().operation = Some(seen);
            }
        }
        observed.leases = lock(&self.shared.leases)
            .iter()
            .map(|(shoot, l)| {
                let held = HeldLease {
                    epoch: l.epoch,
                    valid_until: l.valid_until,
                    renew_at: l.renew_at,
                };
                (shoot.clone(), held)
            })
            .collect();
        observed
    }

    fn seed_facts(&self) -> SeedFacts {
        let me = self.shared.name();
        let (moves, migrates) = match self.executor.mover() {
            Ok(m) => (Ok(()), m.migrates().map_err(|why| format!("{me}: {why}"))),
            Err(why) => (Err(format!("{me}: {why}")), Err(format!("{me}: {why}"))),
        };
        let grace_secs = self
            .shared
            .config
            .seed
            .as_ref()
            .map_or(0, |s| s.release_grace_secs);
        SeedFacts {
            bucket: self.shared.bucket().is_some() && moves.is_ok(),
            standby: self.executor.standby().map(|_| ()),
            moves,
            migrates,
            lease: Duration::from_millis(self.shared.timing().lease_ms),
            release_grace_ms: grace_secs.saturating_mul(1000),
        }
    }

    /// The facts of a move this member takes part in: the latest the
    /// observing task found, if it began after the last step ended (none
    /// while a step runs or before a fresh observation: next round). Each
    /// facts are used once, so every step is decided from a fresh look.
    fn operation_seen(&self, op: &Operation) -> Option<OperationSeen> {
        if self.busy(&operation_key(op.id)) {
            return None;
        }
        self.observe_operation(op);
        let mut ledger = lock(&self.ledger);
        let p = ledger.get_mut(&op.id)?;
        let facts = p.take_fresh_facts()?;
        Some(OperationSeen {
            id: op.id,
            facts,
            retry_at: p.retry_at,
            verified: p.verified.is_some(),
        })
    }

    /// Asks the seed for the facts of `op` in a task (one at a time per
    /// operation) that leaves them in the ledger.
    fn observe_operation(&self, op: &Operation) {
        let (executor, ledger, me) = (
            self.executor.clone(),
            self.ledger.clone(),
            self.shared.name().to_string(),
        );
        let op = op.clone();
        let wake = self.waker();
        self.spawn_once(observe_key(op.id), async move {
            let began = Instant::now();
            let Ok(mover) = executor.mover() else {
                return;
            };
            let shoot = op.shoot();
            let facts = match op.role_of(&me) {
                Role::Source => mover
                    .source_view(shoot, op.id)
                    .await
                    .map(OperationFacts::Source),
                Role::Target => {
                    let from_bucket = matches!(op.kind, OperationKind::Failover { .. });
                    mover
                        .target_facts(shoot, op.id, from_bucket)
                        .await
                        .map(|f| OperationFacts::Target {
                            fetched: f.fetched,
                            restored: f.restored,
                            running: f.running,
                        })
                }
                Role::None => return,
            };
            match facts {
                Ok(facts) => {
                    if lock(&ledger).entry(op.id).or_default().observed(began, facts) {
                        wake.notify_one();
                    }
                }
                Err(e) => {
                    tracing::warn!(op = op.id, %shoot, error = %e, "cannot observe the operation's state on this seed");
                }
            }
        });
    }

    /// Which shoots this seed runs a standby of (those assigned here, and
    /// any it holds), and when a failed standby step may be tried again.
    fn observe_standbys(&self, state: &RingState, observed: &mut Observed) {
        let me = self.shared.name();
        let running = lock(&self.shared.standbys).clone();
        for p in state.placements.values() {
            if p.standby.as_ref().is_some_and(|s| s.member == me) {
                observed.shoots.entry(p.shoot.clone()).or_default();
            }
        }
        for shoot in &running {
            observed.shoots.entry(shoot.clone()).or_default();
        }
        let retry = lock(&self.standby_retry).clone();
        for (shoot, seen) in observed.shoots.iter_mut() {
            seen.standby_running = running.contains(shoot);
            seen.standby_retry_at = retry.get(shoot).copied();
        }
    }

    /// The release clock of `shoot`: (epoch, wall ms) when this member first
    /// saw it gone, kept in the shoot's dir so it survives restarts.
    fn released(&self, shoot: &str) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(self.release_marker(shoot)?).ok()?;
        let (epoch, at) = text.trim().split_once(' ')?;
        Some((epoch.parse().ok()?, at.parse().ok()?))
    }

    /// `<state dir>/shoots/<shoot>/released`.
    pub(super) fn release_marker(&self, shoot: &str) -> Option<PathBuf> {
        let sc = self.shared.config.seed.as_ref()?;
        Some(sc.state_dir.join("shoots").join(shoot).join("released"))
    }
}

/// The in-flight key of an operation's steps.
pub(super) fn operation_key(op: u64) -> String {
    format!("op:{op}")
}

/// The in-flight key of observing an operation.
fn observe_key(op: u64) -> String {
    format!("observe-op:{op}")
}
