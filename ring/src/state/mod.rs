//! The replicated ring state (the Raft state machine) and its commands.
//!
//! Everything here is pure: `RingState::apply` is deterministic (time comes in
//! the commands, chosen by the proposer), so every member that applies the same
//! log reaches the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Whether a member is believed alive by the quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// When the leader declared it up again after it was down (ms since the
    /// Unix epoch); `None` for a member never down. A returned member hosts
    /// its successor again once up for a while ([`crate::decide`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_since_ms: Option<u64>,
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
    /// The hot standby of the shoot's etcd (protection `standby`), if one is
    /// assigned: a second voting member on another seed. Cleared whenever
    /// the placement moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
}

/// A hot standby of a shoot's etcd on another member's seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Standby {
    /// The member whose seed runs it.
    pub member: String,
    /// It votes: every write the host's etcd acknowledges is on it, and a
    /// failover promotes it instead of restoring from the bucket.
    pub ready: bool,
    /// A kube-apiserver waits next to it, so a promotion does not wait for
    /// one to start (seeds that keep one warm: local seeds).
    #[serde(default)]
    pub warm: bool,
}

/// Progress of a long-running operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
        /// When the proposing leader expected the old host's lease to be
        /// over (plus margin), on its own clock; shown in status. Whichever
        /// leader moves the operation on judges by its own monotonic record
        /// of the renewals it applied ([`crate::decide::LeaderView::old_lease_over_at`]).
        not_before_ms: u64,
        /// The newest revision the old host's etcd was heard at (its last
        /// health report to the leader that began the failover), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seen: Option<SeenRevision>,
        /// The target holds the shoot's hot standby and promotes it instead
        /// of restoring from the bucket.
        #[serde(default, skip_serializing_if = "is_false")]
        promote: bool,
    },
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// The revision a host reported its etcd at, and when it was heard
/// (ms since the Unix epoch, the leader's clock). Ordered by revision.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct SeenRevision {
    pub revision: u64,
    pub at_ms: u64,
}

/// A long-running operation recorded step by step, so a new leader resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepTime {
    pub step: OperationStep,
    pub at_ms: u64,
}

/// The figures of a finished move, as the target measured them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// What clients lost at least (failovers): the revisions between what
    /// the restore reached and the newest revision the old host's etcd was
    /// heard at (or the ring knew durable, if higher); writes the old host
    /// acknowledged after its last report come on top. `None`: no report of
    /// the old host's etcd reached the ring (unknown, never 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_lose_revisions: Option<i64>,
    /// The span those revisions cover (failovers): from the newest durable
    /// backup the ring knew to when the old host was last heard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub may_lose_ms: Option<u64>,
    /// How long the old host may have served unheard (failovers from the
    /// bucket): from its last report (or the newest durable backup, if it
    /// was never heard) to when its lease was surely over. Writes it
    /// acknowledged then are not counted in `may_lose_revisions` and may be
    /// lost too; none after it. `None` for a promoted standby (it voted on
    /// every write) or when the ring knew neither point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unheard_ms: Option<u64>,
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

    /// When a failover's proposing leader expected the old host's lease to
    /// be over, plus margin (its clock); `None` for a migration.
    pub fn old_lease_over_ms(&self) -> Option<u64> {
        match self.kind {
            OperationKind::Failover { not_before_ms, .. } => Some(not_before_ms),
            OperationKind::Migration { .. } => None,
        }
    }

    /// Whether this failover promotes a hot standby.
    pub fn promotes(&self) -> bool {
        matches!(self.kind, OperationKind::Failover { promote: true, .. })
    }

    /// Whether this is a planned migration.
    pub fn is_migration(&self) -> bool {
        matches!(self.kind, OperationKind::Migration { .. })
    }

    /// The epoch the target serves under.
    pub fn epoch(&self) -> u64 {
        match &self.kind {
            OperationKind::Failover { epoch, .. } | OperationKind::Migration { epoch, .. } => {
                *epoch
            }
        }
    }

    /// What `me` does in this operation now: the member code never re-derives it.
    /// A migration's source acts while it is `Pending` (writers stopped, final
    /// snapshot, handover); the target of a migration acts once it is
    /// `Restoring`; the target of a failover from the moment it is chosen:
    /// while the old lease runs out it only restores from the bucket (into
    /// its own volume, which nothing serves from: etcd and kube-apiserver
    /// start only under the new epoch's lease) or promotes its hot standby
    /// (stopping the standby's etcd takes the old host's quorum: it can
    /// acknowledge no write any more); once the lease ended (`Pending`, then
    /// `Restoring`) it keeps that restore only if the bucket holds nothing
    /// newer. Everyone else, and everyone once the operation finished, has
    /// no part in it.
    pub fn role_of(&self, me: &str) -> Role {
        let acting_target = match self.kind {
            OperationKind::Migration { .. } => self.step == OperationStep::Restoring,
            OperationKind::Failover { .. } => matches!(
                self.step,
                OperationStep::WaitingForLeaseExpiry
                    | OperationStep::Pending
                    | OperationStep::Restoring
            ),
        };
        if self.target() == me && acting_target {
            Role::Target
        } else if self.is_migration() && self.source() == me && self.step == OperationStep::Pending
        {
            Role::Source
        } else {
            Role::None
        }
    }
}

/// A member's part in an operation (see [`Operation::role_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Gives the control plane away: stops the writers, takes the final snapshot.
    Source,
    /// Restores the control plane (from the source's handover or the bucket) and serves it.
    Target,
    /// Nothing to do in this operation now.
    None,
}

/// The newest backup a member reported for a shoot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupPointer {
    pub revision: u64,
    pub at_ms: u64,
    /// The newest revision the reporting host's backup had seen its etcd at
    /// (and when, by the host's clock), with the report: what a failover
    /// knows of the host even when the leader that heard its heartbeats died
    /// with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<SeenRevision>,
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
    Bootstrap {
        members: Vec<(String, u64, String)>,
        /// The first epoch of each shoot's placement when it is above 1 (its
        /// bucket already holds objects of earlier epochs).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        epochs: BTreeMap<String, u64>,
        /// Shoots whose control plane starts on another member than their
        /// predecessor (shoot -> member): a self-hosted ring's bootstrap
        /// starts them where they need not move away before their host
        /// switches to pods.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        hosts: BTreeMap<String, String>,
    },
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
        /// The old host's etcd revision as it last reported it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seen: Option<SeenRevision>,
        /// `to` holds the shoot's ready hot standby and promotes it.
        #[serde(default, skip_serializing_if = "is_false")]
        promote: bool,
    },
    /// Assign (`Some`) or drop (`None`) the hot standby of `shoot` at `epoch`.
    SetStandby {
        shoot: String,
        epoch: u64,
        member: Option<String>,
    },
    /// `member`'s standby of `shoot` at `epoch` votes in the shoot's etcd
    /// (and, if `warm`, a kube-apiserver waits next to it; a report without
    /// `warm`, as a standby joining again sends first, clears it).
    StandbyReady {
        shoot: String,
        epoch: u64,
        member: String,
        #[serde(default)]
        warm: bool,
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
        /// The revision its backup had seen etcd at when it reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seen: Option<SeenRevision>,
    },
    /// Adds a member at the end of the ring order (its Raft conf change travels separately).
    AddMember {
        name: String,
        id: u64,
        address: String,
        /// The first epoch of its shoot's placement (0 and 1: the first).
        #[serde(default, skip_serializing_if = "is_zero")]
        epoch: u64,
    },
    /// Removes a member (its Raft conf change travels separately).
    RemoveMember { name: String },
    /// A marker with no effect (probes, benchmarks, leader no-ops).
    Probe { payload: Vec<u8> },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
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

    /// The failovers of `shoot` that failed since its last finished move,
    /// oldest first. Each one's target may have served the shoot, and
    /// acknowledged writes, before its failover failed (a target serves
    /// during its verification): what a later failover may lose is measured
    /// against them too, not only against the member the shoot is placed on.
    pub fn failed_failovers(&self, shoot: &str) -> Vec<&Operation> {
        let since_done = self
            .operations
            .iter()
            .filter(|o| o.shoot() == shoot && o.step == OperationStep::Done)
            .map(|o| o.id)
            .max();
        self.operations
            .iter()
            .filter(|o| o.shoot() == shoot && since_done.is_none_or(|d| o.id > d))
            .filter(|o| o.step == OperationStep::Failed && !o.is_migration())
            .collect()
    }

    /// The newest revision of `shoot`'s etcd heard from a member that may
    /// have served it since its last finished move: its host (any report)
    /// and the targets of failed failovers (reports since their failover
    /// began; an older one is of other data). `heard(member)` is that
    /// member's last report of the shoot: when, and the revision.
    pub fn newest_heard(
        &self,
        shoot: &str,
        heard: impl Fn(&str) -> Option<(u64, u64)>,
    ) -> Option<SeenRevision> {
        let host = self.placements.get(shoot)?;
        let failed = self.failed_failovers(shoot);
        let candidates = std::iter::once((host.host.as_str(), 0))
            .chain(failed.iter().map(|o| (o.target(), o.created_at_ms)));
        candidates
            .filter_map(|(member, since)| {
                let (at_ms, revision) = heard(member)?;
                (at_ms >= since && revision > 0).then_some(SeenRevision { revision, at_ms })
            })
            .max()
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

mod apply;

#[cfg(test)]
pub(crate) mod tests;
