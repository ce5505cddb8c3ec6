//! The replicated ring state (the Raft state machine) and its commands.
//!
//! Everything here is pure: `RingState::apply` is deterministic (time comes in
//! the commands, chosen by the proposer), so every member that applies the same
//! log reaches the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Whether a member is believed alive by the quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum MemberState {
    Up,
    Down,
}

/// A member of the ring: a cluster whose ringd takes part in the quorum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Unique name; also the name of the member's shoot (its own cluster).
    pub name: String,
    /// Raft id (non-zero, never reused).
    pub id: u64,
    /// `host:port` of its ringd gRPC listener.
    pub address: String,
    pub state: MemberState,
    /// When the leader declared it down (ms since the Unix epoch).
    pub down_since_ms: Option<u64>,
}

/// A lease on serving a shoot's control plane for one epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub holder: String,
    pub epoch: u64,
    pub expires_at_ms: u64,
}

/// Where a shoot's control plane lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    pub shoot: String,
    /// The member (seed) that hosts it.
    pub host: String,
    /// Increases with every move; only the current epoch's host may serve.
    pub epoch: u64,
    pub lease: Option<Lease>,
}

/// Progress of a long-running operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum OperationStep {
    /// The old host's lease has not expired yet; nothing may start.
    WaitingForLeaseExpiry,
    /// The target may restore and start the control plane.
    Pending,
    /// The target is restoring.
    Restoring,
    /// The control plane serves on the target.
    Done,
    /// Abandoned (e.g. the target died); a new operation replaces it.
    Failed,
}

impl OperationStep {
    /// Done or failed: nothing more will happen.
    pub fn is_finished(self) -> bool {
        matches!(self, OperationStep::Done | OperationStep::Failed)
    }
}

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum OperationKind {
    /// Planned move of a shoot's control plane from `from` to `to`: the source
    /// stops the writers and takes the final snapshot, the target restores it.
    Migration {
        shoot: String,
        from: String,
        to: String,
        /// The epoch the target serves under (set at handover).
        epoch: u64,
        /// etcd's final revision at the source (set at handover).
        revision: Option<i64>,
    },
    /// Restore a shoot's control plane from backup on `to` because `from` died.
    Failover {
        shoot: String,
        from: String,
        to: String,
        /// The epoch the target serves under.
        epoch: u64,
        /// No replacement may start before this (old lease end plus margin).
        not_before_ms: u64,
    },
}

/// A long-running operation recorded step by step, so a new leader resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub id: u64,
    #[serde(flatten)]
    pub kind: OperationKind,
    pub step: OperationStep,
    pub detail: String,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// When the operation entered each step, oldest first.
    #[serde(default)]
    pub history: Vec<StepTime>,
    /// What the executing member measured, set when the operation completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// When an operation entered a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepTime {
    pub step: OperationStep,
    pub at_ms: u64,
}

/// The figures of a finished move, as the target measured them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Outcome {
    /// etcd revision the target serves from.
    pub restored_revision: i64,
    /// Restoring etcd's data (fetch + restore + replay of deltas).
    pub restore_ms: u64,
    /// Starting the control plane until `/readyz` answers and verification passed.
    pub start_ms: u64,
    /// Revisions the ring knew durable but the restore did not reach (failovers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpo_revisions: Option<i64>,
    /// Age of the newest durable backup the ring knew of when the failover began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpo_ms: Option<u64>,
    /// Objects per resource type that were verified after the move.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub objects: std::collections::BTreeMap<String, u64>,
}

impl Operation {
    /// A new operation in its first step.
    pub fn new(
        id: u64,
        kind: OperationKind,
        step: OperationStep,
        detail: String,
        at_ms: u64,
    ) -> Self {
        Operation {
            id,
            kind,
            step,
            detail,
            created_at_ms: at_ms,
            updated_at_ms: at_ms,
            history: vec![StepTime { step, at_ms }],
            outcome: None,
        }
    }

    /// Milliseconds the operation spent in each step it has left, in order.
    pub fn step_durations(&self) -> Vec<(OperationStep, u64)> {
        self.history
            .windows(2)
            .map(|w| (w[0].step, w[1].at_ms.saturating_sub(w[0].at_ms)))
            .collect()
    }
}

impl Operation {
    /// The shoot the operation moves.
    pub fn shoot(&self) -> &str {
        match &self.kind {
            OperationKind::Failover { shoot, .. } | OperationKind::Migration { shoot, .. } => shoot,
        }
    }

    /// The member that gives the control plane away.
    pub fn source(&self) -> &str {
        match &self.kind {
            OperationKind::Failover { from, .. } | OperationKind::Migration { from, .. } => from,
        }
    }

    /// The member that executes it.
    pub fn target(&self) -> &str {
        match &self.kind {
            OperationKind::Failover { to, .. } | OperationKind::Migration { to, .. } => to,
        }
    }

    /// Whether this is a planned migration.
    pub fn is_migration(&self) -> bool {
        matches!(self.kind, OperationKind::Migration { .. })
    }
}

/// The newest backup a member reported for a shoot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupPointer {
    pub revision: u64,
    pub at_ms: u64,
}

/// The replicated state of the ring.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RingState {
    /// Members in ring order: each hosts its successor's control plane.
    pub members: Vec<Member>,
    /// Shoot name → placement.
    pub placements: BTreeMap<String, Placement>,
    /// Operations, oldest first (finished ones are kept for the record, bounded).
    pub operations: Vec<Operation>,
    pub next_operation_id: u64,
    /// Shoot name → newest durable backup.
    pub backups: BTreeMap<String, BackupPointer>,
    /// The Raft id the next added member gets (ids are never reused).
    #[serde(default)]
    pub next_member_id: u64,
}

/// How many finished operations are kept for `status`.
const FINISHED_OPERATIONS_KEPT: usize = 50;

/// A change to the ring state, proposed through Raft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum RingCommand {
    /// Creates the ring: members in ring order; each hosts its successor's control plane.
    /// Ignored when the ring already has members.
    Bootstrap { members: Vec<(String, u64, String)> },
    /// The leader heard nothing from `member` for the failure window.
    MarkDown { member: String, at_ms: u64 },
    /// `member` reports again.
    MarkUp { member: String, at_ms: u64 },
    /// The host of `shoot` extends its lease for `epoch`.
    RenewLease {
        shoot: String,
        holder: String,
        epoch: u64,
        expires_at_ms: u64,
    },
    /// Move `shoot` to `to` under a new epoch because its host died.
    StartFailover {
        shoot: String,
        to: String,
        at_ms: u64,
        not_before_ms: u64,
    },
    /// Planned move of `shoot` to member `to` (`ringctl migrate`).
    StartMigration {
        shoot: String,
        to: String,
        at_ms: u64,
    },
    /// The source of migration `id` stopped the writers and took the final snapshot
    /// at `revision`: the placement moves to the target under a new epoch.
    HandoverReady { id: u64, revision: i64, at_ms: u64 },
    /// An operation moved to another step.
    AdvanceOperation {
        id: u64,
        step: OperationStep,
        detail: String,
        at_ms: u64,
        /// The executing member's figures (with `Done`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        outcome: Option<Outcome>,
    },
    /// Record a member's newest durable backup of a shoot.
    ReportBackup {
        shoot: String,
        revision: u64,
        at_ms: u64,
    },
    /// Adds a member at the end of the ring order (its Raft conf change travels separately).
    AddMember {
        name: String,
        id: u64,
        address: String,
    },
    /// Removes a member (its Raft conf change travels separately).
    RemoveMember { name: String },
    /// A marker with no effect (probes, benchmarks, leader no-ops).
    Probe { payload: Vec<u8> },
}

/// Why a command was not applied.
pub type Rejection = String;

impl RingState {
    /// The member called `name`.
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The member with Raft id `id`.
    pub fn member_by_id(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    /// The unfinished operation on `shoot`, if any.
    pub fn open_operation(&self, shoot: &str) -> Option<&Operation> {
        self.operations
            .iter()
            .find(|o| o.shoot() == shoot && !o.step.is_finished())
    }

    /// The member before `name` in ring order.
    pub fn predecessor(&self, name: &str) -> Option<&Member> {
        let i = self.members.iter().position(|m| m.name == name)?;
        let n = self.members.len();
        (n > 1).then(|| &self.members[(i + n - 1) % n])
    }

    /// How many placements each member hosts.
    pub fn load(&self) -> BTreeMap<&str, usize> {
        let mut load: BTreeMap<&str, usize> =
            self.members.iter().map(|m| (m.name.as_str(), 0)).collect();
        for p in self.placements.values() {
            if let Some(n) = load.get_mut(p.host.as_str()) {
                *n += 1;
            }
        }
        load
    }

    /// Applies `cmd`; a rejected command changes nothing.
    pub fn apply(&mut self, cmd: &RingCommand) -> Result<(), Rejection> {
        match cmd {
            RingCommand::Bootstrap { members } => {
                if !self.members.is_empty() {
                    return Err("the ring is already bootstrapped".into());
                }
                let n = members.len();
                for (i, (name, id, address)) in members.iter().enumerate() {
                    self.members.push(Member {
                        name: name.clone(),
                        id: *id,
                        address: address.clone(),
                        state: MemberState::Up,
                        down_since_ms: None,
                    });
                    self.next_member_id = self.next_member_id.max(id + 1);
                    let host = &members[(i + n - 1) % n].0;
                    self.placements.insert(
                        name.clone(),
                        Placement {
                            shoot: name.clone(),
                            host: host.clone(),
                            epoch: 1,
                            lease: None,
                        },
                    );
                }
                Ok(())
            }
            RingCommand::MarkDown { member, at_ms } => {
                let m = self.member_mut(member)?;
                if m.state == MemberState::Down {
                    return Err(format!("member {member} is already down"));
                }
                m.state = MemberState::Down;
                m.down_since_ms = Some(*at_ms);
                Ok(())
            }
            RingCommand::MarkUp { member, .. } => {
                let m = self.member_mut(member)?;
                if m.state == MemberState::Up {
                    return Err(format!("member {member} is already up"));
                }
                m.state = MemberState::Up;
                m.down_since_ms = None;
                Ok(())
            }
            RingCommand::RenewLease {
                shoot,
                holder,
                epoch,
                expires_at_ms,
            } => {
                if let Some(op) = self.open_operation(shoot) {
                    if op.target() != holder || op.step != OperationStep::Restoring {
                        return Err(format!(
                            "operation {} on shoot {shoot} is {:?}; no lease until it is done",
                            op.id, op.step
                        ));
                    }
                }
                let p = self
                    .placements
                    .get_mut(shoot)
                    .ok_or_else(|| format!("no shoot {shoot}"))?;
                if p.host != *holder {
                    return Err(format!(
                        "shoot {shoot} is hosted by {}, not {holder}",
                        p.host
                    ));
                }
                if p.epoch != *epoch {
                    return Err(format!(
                        "stale epoch {epoch}: shoot {shoot} is at epoch {}",
                        p.epoch
                    ));
                }
                let expires = p
                    .lease
                    .as_ref()
                    .map_or(0, |l| l.expires_at_ms)
                    .max(*expires_at_ms);
                p.lease = Some(Lease {
                    holder: holder.clone(),
                    epoch: *epoch,
                    expires_at_ms: expires,
                });
                Ok(())
            }
            RingCommand::StartFailover {
                shoot,
                to,
                at_ms,
                not_before_ms,
            } => {
                if let Some(op) = self.open_operation(shoot) {
                    return Err(format!("operation {} already moves shoot {shoot}", op.id));
                }
                if self.member(to).is_none_or(|m| m.state != MemberState::Up) {
                    return Err(format!("target {to} is not an up member"));
                }
                let p = self
                    .placements
                    .get_mut(shoot)
                    .ok_or_else(|| format!("no shoot {shoot}"))?;
                let from = std::mem::replace(&mut p.host, to.clone());
                p.epoch += 1;
                let old_lease_end = p.lease.take().map_or(0, |l| l.expires_at_ms);
                let epoch = p.epoch;
                let id = self.next_operation_id;
                self.next_operation_id += 1;
                self.operations.push(Operation::new(
                    id,
                    OperationKind::Failover {
                        shoot: shoot.clone(),
                        from,
                        to: to.clone(),
                        epoch,
                        not_before_ms: (*not_before_ms).max(old_lease_end),
                    },
                    OperationStep::WaitingForLeaseExpiry,
                    "waiting for the old host's lease to expire".into(),
                    *at_ms,
                ));
                Ok(())
            }
            RingCommand::StartMigration { shoot, to, at_ms } => {
                if let Some(op) = self.open_operation(shoot) {
                    return Err(format!("operation {} already moves shoot {shoot}", op.id));
                }
                let p = self
                    .placements
                    .get(shoot)
                    .ok_or_else(|| format!("no shoot {shoot}"))?;
                if p.host == *to {
                    return Err(format!("shoot {shoot} is already hosted by {to}"));
                }
                if self.member(to).is_none_or(|m| m.state != MemberState::Up) {
                    return Err(format!("target {to} is not an up member"));
                }
                if self
                    .member(&p.host)
                    .is_none_or(|m| m.state != MemberState::Up)
                {
                    return Err(format!(
                        "the host {} is down: that takes a failover, not a migration",
                        p.host
                    ));
                }
                let id = self.next_operation_id;
                self.next_operation_id += 1;
                let (from, epoch) = (p.host.clone(), p.epoch + 1);
                self.operations.push(Operation::new(
                    id,
                    OperationKind::Migration {
                        shoot: shoot.clone(),
                        from: from.clone(),
                        to: to.clone(),
                        epoch,
                        revision: None,
                    },
                    OperationStep::Pending,
                    format!("{from} stops the writers and takes the final snapshot"),
                    *at_ms,
                ));
                Ok(())
            }
            RingCommand::HandoverReady {
                id,
                revision,
                at_ms,
            } => {
                let op = self
                    .operations
                    .iter_mut()
                    .find(|o| o.id == *id)
                    .ok_or_else(|| format!("no operation {id}"))?;
                if op.step != OperationStep::Pending {
                    return Err(format!("operation {id} is {:?}, not Pending", op.step));
                }
                let OperationKind::Migration {
                    shoot,
                    to,
                    epoch,
                    revision: rev,
                    ..
                } = &mut op.kind
                else {
                    return Err(format!("operation {id} is not a migration"));
                };
                *rev = Some(*revision);
                let (shoot, to, epoch) = (shoot.clone(), to.clone(), *epoch);
                op.step = OperationStep::Restoring;
                op.detail = format!("{to} restores revision {revision}");
                op.updated_at_ms = *at_ms;
                op.history.push(StepTime {
                    step: op.step,
                    at_ms: *at_ms,
                });
                let p = self
                    .placements
                    .get_mut(&shoot)
                    .ok_or_else(|| format!("no shoot {shoot}"))?;
                p.host = to;
                p.epoch = epoch;
                p.lease = None;
                Ok(())
            }
            RingCommand::AdvanceOperation {
                id,
                step,
                detail,
                at_ms,
                outcome,
            } => {
                let op = self
                    .operations
                    .iter_mut()
                    .find(|o| o.id == *id)
                    .ok_or_else(|| format!("no operation {id}"))?;
                if op.step.is_finished() {
                    return Err(format!("operation {id} is already {:?}", op.step));
                }
                if op.step != *step {
                    op.history.push(StepTime {
                        step: *step,
                        at_ms: *at_ms,
                    });
                }
                op.step = *step;
                op.detail = detail.clone();
                op.updated_at_ms = *at_ms;
                if outcome.is_some() {
                    op.outcome = outcome.clone();
                }
                // A failed move whose placement already went to the target rolls
                // back: the shoot returns to its source under a new epoch (the
                // target's lease, if any, becomes stale). After a planned handover
                // the source still has all the data and serves again; after a
                // failed failover the source is the dead member, so the leader
                // starts a new failover elsewhere.
                let rollback = match &op.kind {
                    OperationKind::Migration {
                        shoot,
                        from,
                        revision: Some(_),
                        ..
                    }
                    | OperationKind::Failover { shoot, from, .. }
                        if *step == OperationStep::Failed =>
                    {
                        Some((shoot.clone(), from.clone(), op.target().to_string()))
                    }
                    _ => None,
                };
                if let Some((shoot, from, to)) = rollback {
                    if let Some(p) = self.placements.get_mut(&shoot) {
                        if p.host == to {
                            p.host = from;
                            p.epoch += 1;
                            p.lease = None;
                        }
                    }
                }
                self.trim_operations();
                Ok(())
            }
            RingCommand::ReportBackup {
                shoot,
                revision,
                at_ms,
            } => {
                let entry = self.backups.entry(shoot.clone()).or_insert(BackupPointer {
                    revision: 0,
                    at_ms: 0,
                });
                if *revision >= entry.revision {
                    *entry = BackupPointer {
                        revision: *revision,
                        at_ms: *at_ms,
                    };
                }
                Ok(())
            }
            RingCommand::AddMember { name, id, address } => {
                if self.member(name).is_some() || self.member_by_id(*id).is_some() {
                    return Err(format!("member {name} (id {id}) already exists"));
                }
                // The new member joins at the end of the ring order: its predecessor
                // (the previous last member) hosts its control plane.
                let host = self.members.last().map(|m| m.name.clone());
                self.next_member_id = self.next_member_id.max(id + 1);
                self.members.push(Member {
                    name: name.clone(),
                    id: *id,
                    address: address.clone(),
                    state: MemberState::Up,
                    down_since_ms: None,
                });
                if let Some(host) = host {
                    self.placements.entry(name.clone()).or_insert(Placement {
                        shoot: name.clone(),
                        host,
                        epoch: 1,
                        lease: None,
                    });
                }
                Ok(())
            }
            RingCommand::RemoveMember { name } => {
                if self.member(name).is_none() {
                    return Err(format!("no member {name}"));
                }
                let hosted: Vec<&str> = self
                    .placements
                    .values()
                    .filter(|p| p.host == *name && p.shoot != *name)
                    .map(|p| p.shoot.as_str())
                    .collect();
                if !hosted.is_empty() {
                    return Err(format!(
                        "{name} hosts the control plane of {}; move it first (planned migration)",
                        hosted.join(", ")
                    ));
                }
                self.members.retain(|m| m.name != *name);
                // The member's own cluster leaves the ring with it.
                self.placements.remove(name);
                Ok(())
            }
            RingCommand::Probe { .. } => Ok(()),
        }
    }

    fn member_mut(&mut self, name: &str) -> Result<&mut Member, Rejection> {
        self.members
            .iter_mut()
            .find(|m| m.name == name)
            .ok_or_else(|| format!("no member {name}"))
    }

    fn trim_operations(&mut self) {
        let finished = self
            .operations
            .iter()
            .filter(|o| o.step.is_finished())
            .count();
        let mut excess = finished.saturating_sub(FINISHED_OPERATIONS_KEPT);
        self.operations.retain(|o| {
            if excess > 0 && o.step.is_finished() {
                excess -= 1;
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn ring3() -> RingState {
        let mut s = RingState::default();
        s.apply(&RingCommand::Bootstrap {
            members: vec![
                ("a".into(), 1, "127.0.0.1:1".into()),
                ("b".into(), 2, "127.0.0.1:2".into()),
                ("c".into(), 3, "127.0.0.1:3".into()),
            ],
        })
        .unwrap();
        s
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
            .apply(&RingCommand::Bootstrap { members: vec![] })
            .is_err());
        assert_eq!(again, s);
        assert_eq!(s.predecessor("a").unwrap().name, "c");
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
        })
        .unwrap();
        let p = &s.placements["b"];
        assert_eq!(
            (p.host.as_str(), p.epoch, p.lease.is_none()),
            ("c", 2, true)
        );
        let op = s.open_operation("b").unwrap().clone();
        assert_eq!(op.step, OperationStep::WaitingForLeaseExpiry);
        // never before the old lease's end, whatever the proposer said
        assert!(matches!(
            op.kind,
            OperationKind::Failover {
                not_before_ms: 9_000,
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
                not_before_ms: 0
            })
            .is_err());
        for step in [OperationStep::Pending, OperationStep::Restoring] {
            s.apply(&RingCommand::AdvanceOperation {
                id: op.id,
                step,
                detail: String::new(),
                at_ms: 10_000,
                outcome: None,
            })
            .unwrap();
        }
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
        })
        .unwrap();
        assert!(s
            .apply(&RingCommand::AddMember {
                name: "d".into(),
                id: 5,
                address: "x".into()
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
        })
        .unwrap();
        s.apply(&RingCommand::ReportBackup {
            shoot: "a".into(),
            revision: 5,
            at_ms: 2,
        })
        .unwrap();
        assert_eq!(s.backups["a"].revision, 10);
    }
}
