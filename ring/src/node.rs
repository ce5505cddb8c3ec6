//! The Raft node: raft-rs's `RawNode` plus the ring state machine, driven in
//! raft-rs's documented Ready order. `RaftCore` does no network I/O: it takes
//! ticks, messages and proposals, and hands back the messages to send, so unit
//! tests drive several cores over a simulated network.
//! [`crate::node_task::NodeTask`] owns one core and connects it to the runtime.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::prelude::{ConfChange, ConfChangeType, Entry, EntryType, Message, MessageType, Snapshot};
use raft::{RawNode, StateRole};
use tokio::sync::oneshot;

use crate::peer_proposal::{Proposal, PROPOSAL_ID_BITS};
use crate::state::{RingCommand, RingState};
use crate::storage::{DiskStorage, PersistBatch};
use crate::RingError;

/// How a proposal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyResult {
    /// Committed and applied at this log index.
    Applied { index: u64 },
    /// Committed, but the state machine refused it.
    Rejected { index: u64, reason: String },
}

/// A member's election priority: its Raft id (ids are distinct and never reused).
fn election_priority(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

/// Distinct priorities end split votes: of two members with equal logs, the
/// lower one's (pre-)vote is refused by the higher, so two survivors timing
/// out in one tick elect the higher instead of splitting round after round
/// while their leases run out. Set from the first term on: raft-rs 0.7 sends
/// a vote rejection with the voter's term and panics when that is 0, which a
/// priority would make possible in a fresh ring's first election.
fn settle_priority(raw: &mut RawNode<DiskStorage>) {
    if raw.raft.priority == 0 && raw.raft.term > 0 {
        let id = raw.raft.id;
        raw.raft.set_priority(election_priority(id));
    }
}

/// Tuning of a Raft node.
#[derive(Debug, Clone, Copy)]
pub struct RaftTuning {
    pub tick: Duration,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// Compact the log into a snapshot every this many applied entries.
    pub compact_every: u64,
    /// Election timeout range in ticks (default: election_ticks..2*election_ticks,
    /// randomized by raft-rs). Simulations pin it per node to be repeatable.
    pub election_range: Option<(usize, usize)>,
}

impl Default for RaftTuning {
    fn default() -> Self {
        RaftTuning {
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            compact_every: 500,
            election_range: None,
        }
    }
}

/// A snapshot of the node for observers (status, decisions, transport routing).
#[derive(Debug, Clone)]
pub struct NodeView {
    pub id: u64,
    pub leader_id: u64,
    pub term: u64,
    pub role: StateRole,
    pub commit: u64,
    pub applied: u64,
    pub voters: Vec<u64>,
    pub state: Arc<RingState>,
    /// When this node last heard from a leader (or is the leader).
    pub last_leader_contact: Option<Instant>,
    /// The last other member this node followed as leader, and when it last
    /// heard from it (a new leader knows the old one's silence exactly).
    pub followed: Option<(u64, Instant)>,
    /// Entries in the log after the last snapshot.
    pub log_entries: usize,
    pub snapshot_index: u64,
    /// Shoot → when this node last applied a committed lease renewal of it,
    /// on this node's monotonic clock (see [`LeaseSeen`]).
    pub lease_seen: Arc<LeaseSeen>,
}

/// When this node last applied a committed lease renewal of each shoot, on
/// its own monotonic clock. A holder measures its lease from the moment it
/// sent the renewal, which is before any member applied it: so the lease
/// ends, in real time, before `seen + lease` (plus drift), whatever the
/// wall clocks of the two hosts say. Renewals this node never saw one by one
/// (the state it started with, a snapshot it received) count as seen when
/// it took that state in.
pub type LeaseSeen = BTreeMap<String, Instant>;

/// Every shoot of `state` as seen now (a state taken in whole).
fn all_seen_now(state: &RingState) -> Arc<LeaseSeen> {
    let now = Instant::now();
    Arc::new(state.placements.keys().map(|s| (s.clone(), now)).collect())
}

/// raft-rs's RawNode, the durable store and the ring state machine.
pub struct RaftCore {
    raw: RawNode<DiskStorage>,
    store: DiskStorage,
    /// Shared with observers; copied only when a command changes it.
    state: Arc<RingState>,
    applied: u64,
    waiters: HashMap<u64, oneshot::Sender<ApplyResult>>,
    /// Outcomes applied but not yet told (see [`RaftCore::answer_waiters`]).
    replies: Vec<(oneshot::Sender<ApplyResult>, ApplyResult)>,
    next_proposal: u64,
    compact_every: u64,
    last_compacted: u64,
    last_leader_contact: Option<Instant>,
    followed: Option<(u64, Instant)>,
    compact_pending: bool,
    lease_seen: Arc<LeaseSeen>,
}

fn raft_err(e: impl std::fmt::Display) -> RingError {
    RingError::Raft(e.to_string())
}

impl RaftCore {
    /// Opens the node `id` over `store`, restoring the state machine from the
    /// store's snapshot; committed entries after it are re-applied through Ready.
    pub fn new(
        id: u64,
        store: DiskStorage,
        tuning: &RaftTuning,
        logger: &slog::Logger,
    ) -> Result<Self, RingError> {
        let snap = store.latest_snapshot();
        let applied = snap.get_metadata().index;
        let state = if snap.data.is_empty() {
            RingState::default()
        } else {
            serde_json::from_slice(&snap.data)
                .map_err(|e| RingError::Storage(format!("corrupted state-machine snapshot: {e}")))?
        };
        let config = raft::Config {
            id,
            election_tick: tuning.election_ticks,
            heartbeat_tick: tuning.heartbeat_ticks,
            applied,
            check_quorum: true,
            pre_vote: true,
            max_inflight_msgs: 256,
            max_size_per_msg: 1024 * 1024,
            min_election_tick: tuning.election_range.map_or(0, |r| r.0),
            max_election_tick: tuning.election_range.map_or(0, |r| r.1),
            ..Default::default()
        };
        config.validate().map_err(raft_err)?;
        let mut raw = RawNode::new(&config, store.clone(), logger).map_err(raft_err)?;
        settle_priority(&mut raw);
        let lease_seen = all_seen_now(&state);
        Ok(RaftCore {
            raw,
            store,
            state: Arc::new(state),
            applied,
            waiters: HashMap::new(),
            replies: Vec::new(),
            next_proposal: 1,
            compact_every: tuning.compact_every.max(1),
            last_compacted: applied,
            last_leader_contact: None,
            followed: None,
            compact_pending: false,
            lease_seen,
        })
    }

    /// This node's Raft id.
    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    /// The applied ring state.
    pub fn state(&self) -> &RingState {
        &self.state
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Advances the logical clock by one tick.
    pub fn tick(&mut self) {
        settle_priority(&mut self.raw);
        self.raw.tick();
        if self.is_leader() {
            self.last_leader_contact = Some(Instant::now());
        }
    }

    /// A leader that is about to stop starts handing its leadership to the
    /// voter whose log matches its own furthest (raft's leader transfer:
    /// once caught up, that voter campaigns at once instead of after an
    /// election timeout). The voter's id; `None` when not the leader or
    /// alone.
    pub fn hand_over(&mut self) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        let me = self.raw.raft.id;
        let voters = self.store.conf_state().voters;
        let to = self
            .raw
            .raft
            .prs()
            .iter()
            .filter(|(id, _)| **id != me && voters.contains(id))
            // of the caught-up, the highest priority: a voter with equal log
            // and a higher priority would refuse the others its vote
            .max_by_key(|(id, p)| (p.matched, election_priority(**id)))
            .map(|(id, _)| *id)?;
        self.raw.transfer_leader(to);
        Some(to)
    }

    /// Starts an election now (tests and single-member bootstrap).
    pub fn campaign(&mut self) -> Result<(), RingError> {
        self.raw.campaign().map_err(raft_err)
    }

    /// Feeds a message from a peer. A peer's proposal is refused unless its
    /// proposer may make it ([`crate::peer_proposal::check`]).
    pub fn step(&mut self, msg: Message) -> Result<(), RingError> {
        if msg.get_msg_type() == MessageType::MsgPropose {
            crate::peer_proposal::check(&self.state, &msg).map_err(RingError::Refused)?;
        }
        if msg.from == self.raw.raft.leader_id
            && matches!(
                msg.get_msg_type(),
                MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
            )
        {
            self.last_leader_contact = Some(Instant::now());
            self.followed = Some((msg.from, Instant::now()));
        }
        settle_priority(&mut self.raw);
        self.raw.step(msg).map_err(raft_err)
    }

    /// Proposes `command`; `reply` gets the outcome once applied on this node.
    /// Dropped proposals (leader change) never answer: callers time out and retry.
    pub fn propose(
        &mut self,
        command: RingCommand,
        reply: Option<oneshot::Sender<ApplyResult>>,
    ) -> Result<(), RingError> {
        let id = self.proposal_id(reply);
        let data = serde_json::to_vec(&Proposal { id, command }).map_err(raft_err)?;
        self.raw.propose(vec![], data).map_err(|e| {
            self.waiters.remove(&id);
            raft_err(e)
        })
    }

    /// Proposes adding (`AddMember`) or removing (`RemoveMember`) a member: a
    /// Raft configuration change carrying the ring command as context.
    pub fn propose_membership(
        &mut self,
        command: RingCommand,
        reply: Option<oneshot::Sender<ApplyResult>>,
    ) -> Result<(), RingError> {
        let mut cc = ConfChange::default();
        match &command {
            RingCommand::AddMember { id, .. } => {
                cc.set_change_type(ConfChangeType::AddNode);
                cc.node_id = *id;
            }
            RingCommand::RemoveMember { name } => {
                let member = self
                    .state
                    .member(name)
                    .ok_or_else(|| RingError::Raft(format!("no member {name}")))?;
                cc.set_change_type(ConfChangeType::RemoveNode);
                cc.node_id = member.id;
            }
            other => {
                return Err(RingError::Raft(format!(
                    "{other:?} is not a membership change"
                )))
            }
        }
        let id = self.proposal_id(reply);
        let context = serde_json::to_vec(&Proposal { id, command }).map_err(raft_err)?;
        self.raw.propose_conf_change(context, cc).map_err(|e| {
            self.waiters.remove(&id);
            raft_err(e)
        })
    }

    fn proposal_id(&mut self, reply: Option<oneshot::Sender<ApplyResult>>) -> u64 {
        let Some(reply) = reply else { return 0 };
        let id =
            (self.id() << PROPOSAL_ID_BITS) | (self.next_proposal & ((1 << PROPOSAL_ID_BITS) - 1));
        self.next_proposal += 1;
        self.waiters.insert(id, reply);
        id
    }

    /// Tells raft-rs a peer could not be reached.
    pub fn report_unreachable(&mut self, id: u64) {
        self.raw.report_unreachable(id);
    }

    /// Tells raft-rs how sending a snapshot to `id` ended.
    pub fn report_snapshot(&mut self, id: u64, ok: bool) {
        let status = if ok {
            raft::SnapshotStatus::Finish
        } else {
            raft::SnapshotStatus::Failure
        };
        self.raw.report_snapshot(id, status);
    }

    /// Handles one Ready if there is one, in raft-rs's documented order, with
    /// entries and hard state persisted (fsync) before anything is applied.
    /// `send` gets the messages as soon as they may go out: the leader's appends
    /// before its own fsync (raft-rs allows it), everything else after.
    pub fn handle_ready(&mut self, mut send: impl FnMut(Vec<Message>)) -> Result<(), RingError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        let early = rd.take_messages();
        if !early.is_empty() {
            send(early);
        }
        let mut out = Vec::new();
        if !rd.snapshot().is_empty() {
            let snap = rd.snapshot().clone();
            self.store.persist(&PersistBatch {
                snapshot: Some(&snap),
                ..Default::default()
            })?;
            self.restore(&snap)?;
        }
        self.store.persist(&PersistBatch {
            entries: rd.entries(),
            hard_state: rd.hs(),
            ..Default::default()
        })?;
        out.extend(rd.take_persisted_messages());
        let committed = rd.take_committed_entries();
        self.apply(committed)?;
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.store.set_commit(commit)?;
        }
        out.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(committed)?;
        self.raw.advance_apply();
        self.maybe_compact()?;
        if !out.is_empty() {
            send(out);
        }
        Ok(())
    }

    fn restore(&mut self, snap: &Snapshot) -> Result<(), RingError> {
        self.state = Arc::new(
            serde_json::from_slice(&snap.data)
                .map_err(|e| RingError::Storage(format!("received a corrupted snapshot: {e}")))?,
        );
        self.lease_seen = all_seen_now(&self.state);
        self.applied = snap.get_metadata().index;
        self.last_compacted = self.applied;
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), RingError> {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            self.applied = e.index;
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    if e.data.is_empty() {
                        continue; // a new leader's empty entry
                    }
                    self.apply_proposal(e.index, &e.data);
                }
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&e.data).map_err(|err| {
                        RingError::Storage(format!("undecodable conf change at {}: {err}", e.index))
                    })?;
                    let cs = self.raw.apply_conf_change(&cc).map_err(raft_err)?;
                    self.store.persist(&PersistBatch {
                        conf_state: Some(&cs),
                        ..Default::default()
                    })?;
                    if cc.get_change_type() == ConfChangeType::AddNode {
                        // The initial voters are not in the log: a new member must start
                        // from a snapshot that holds the whole configuration, so no entry
                        // before this one may be sent to it.
                        self.compact_pending = true;
                    }
                    self.apply_proposal(e.index, &e.context);
                }
                EntryType::EntryConfChangeV2 => {
                    tracing::warn!(
                        index = e.index,
                        "ignoring a V2 conf change (Ring proposes V1 only)"
                    );
                }
            }
        }
        Ok(())
    }

    fn apply_proposal(&mut self, index: u64, data: &[u8]) {
        let proposal: Proposal = match serde_json::from_slice(data) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(index, error = %e, "skipping an undecodable entry");
                return;
            }
        };
        // Apply to a scratch copy only when someone else holds the current state.
        let result = match Arc::make_mut(&mut self.state).apply(&proposal.command) {
            Ok(()) => {
                if let RingCommand::RenewLease { shoot, .. } = &proposal.command {
                    Arc::make_mut(&mut self.lease_seen).insert(shoot.clone(), Instant::now());
                }
                ApplyResult::Applied { index }
            }
            Err(reason) => {
                tracing::debug!(index, %reason, command = ?proposal.command, "command rejected");
                ApplyResult::Rejected { index, reason }
            }
        };
        if let Some(w) = self.waiters.remove(&proposal.id) {
            self.replies.push((w, result));
        }
    }

    /// Tells the proposers what their applied proposals came to. The node
    /// task calls it after publishing the view with those results in it: a
    /// proposer that reads the view on being answered (the admin API opening a
    /// migration) must find what it proposed there. Answered at once, an
    /// admin call on another thread read the view before it was published and
    /// refused a committed migration ("committed but is not open").
    pub fn answer_waiters(&mut self) {
        for (w, result) in self.replies.drain(..) {
            let _ = w.send(result);
        }
    }

    fn maybe_compact(&mut self) -> Result<(), RingError> {
        if std::mem::take(&mut self.compact_pending) {
            return self.compact_now();
        }
        if self.applied < self.last_compacted + self.compact_every {
            return Ok(());
        }
        self.compact_now()
    }

    /// Compacts the log up to the applied index now (after adding a member, so
    /// it starts from a snapshot that carries the whole configuration).
    pub fn compact_now(&mut self) -> Result<(), RingError> {
        if self.applied <= self.last_compacted {
            return Ok(());
        }
        let data = serde_json::to_vec(&*self.state).map_err(raft_err)?;
        let cs = self.store.conf_state();
        self.store.compact(self.applied, data, &cs)?;
        self.last_compacted = self.applied;
        Ok(())
    }

    /// The node as observers see it.
    pub fn view(&self) -> NodeView {
        let r = &self.raw.raft;
        let mut voters = self.store.conf_state().voters;
        voters.sort_unstable();
        NodeView {
            id: r.id,
            leader_id: r.leader_id,
            term: r.term,
            role: r.state,
            commit: r.raft_log.committed,
            applied: self.applied,
            voters,
            state: self.state.clone(),
            last_leader_contact: self.last_leader_contact,
            followed: self.followed,
            log_entries: self.store.entry_count(),
            snapshot_index: self.store.snapshot_index(),
            lease_seen: self.lease_seen.clone(),
        }
    }
}

#[cfg(test)]
#[path = "node_sim.rs"]
mod sim;

/// A slog logger that forwards raft-rs's logs to `tracing`.
pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}

struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(
        &self,
        record: &slog::Record<'_>,
        values: &slog::OwnedKVList,
    ) -> Result<(), slog::Never> {
        struct Kv(String);
        impl slog::Serializer for Kv {
            fn emit_arguments(
                &mut self,
                key: slog::Key,
                val: &std::fmt::Arguments<'_>,
            ) -> slog::Result {
                use std::fmt::Write;
                let _ = write!(self.0, " {key}={val}");
                Ok(())
            }
        }
        let mut kv = Kv(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut kv);
        let _ = slog::KV::serialize(values, record, &mut kv);
        let msg = format!("{}{}", record.msg(), kv.0);
        match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{msg}"),
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg}"),
            slog::Level::Info => tracing::info!(target: "raft", "{msg}"),
            slog::Level::Debug => tracing::debug!(target: "raft", "{msg}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{msg}"),
        }
        Ok(())
    }
}
