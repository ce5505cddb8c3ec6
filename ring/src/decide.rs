//! The leader's decisions, as data: given the ring state and what the leader has
//! heard, which commands to propose. Pure and deterministic; the daemon proposes
//! whatever comes out, and the state machine re-checks every command on apply.

use std::collections::BTreeMap;

use crate::config::Protection;
use crate::state::{
    MemberState, Operation, OperationStep, Placement, RingCommand, RingState, SeenRevision,
};

/// Timing the decisions depend on (milliseconds).
#[derive(Debug, Clone, Copy)]
pub struct DecisionTiming {
    /// Silence after which a member is declared down.
    pub failure_window_ms: u64,
    /// How long a lease lasts from the moment its holder sent the renewal.
    pub lease_ms: u64,
    /// Added to the old lease's end before a replacement may start.
    pub lease_margin_ms: u64,
    /// How long a member back from the dead must be up before the shoot a
    /// failover took from it moves back (0: never by itself).
    pub relink_after_ms: u64,
    /// An open operation that took no step for this long fails.
    pub operation_deadline_ms: u64,
    /// Whether shoots get a hot standby.
    pub protection: Protection,
}

/// What the leader knows beyond the replicated state.
#[derive(Debug, Clone)]
pub struct LeaderView<'a> {
    pub now_ms: u64,
    /// When this member became leader: silence is only counted from then,
    /// except the silence of `followed`.
    pub leader_since_ms: u64,
    /// The member this leader followed before it led, and when it last
    /// heard from it: that member's silence is known exactly (it is
    /// typically the dead leader whose silence made this one).
    pub followed: Option<(&'a str, u64)>,
    /// The leader's own name (always alive from its point of view).
    pub leader: &'a str,
    /// Member name → when its last health report arrived.
    pub last_report_ms: &'a BTreeMap<String, u64>,
    /// Shoot → when this leader last applied a committed renewal of its
    /// lease, on this leader's clock (its monotonic record of the moment,
    /// expressed in the frame of `now_ms` when the view was made). No other
    /// host's clock enters the decision when an old lease is over.
    pub lease_seen_ms: &'a BTreeMap<String, u64>,
    /// Shoot → the revision its host last reported its etcd at, with when
    /// (the failover carries it: what clients may have lost).
    pub revisions: &'a BTreeMap<String, SeenRevision>,
}

/// A holder's clock may run this much slower than the leader's over one lease
/// (1/50: 2 %, far above real clock drift): the leader waits that much longer.
pub const LEASE_DRIFT_DIVISOR: u64 = 50;

impl LeaderView<'_> {
    /// When, on this leader's clock, every lease on `shoot` it saw committed
    /// has surely ended, margin included. A holder measures its lease from
    /// the moment it sent the renewal, before the leader applied it, on its
    /// own monotonic clock; so this bound holds whatever the two hosts' wall
    /// clocks say (the holder's `expires_at_ms` is never compared here).
    pub fn old_lease_over_at(&self, shoot: &str, t: &DecisionTiming) -> u64 {
        let seen_end = self.lease_seen_ms.get(shoot).map_or(0, |seen| {
            seen + t.lease_ms + t.lease_ms / LEASE_DRIFT_DIVISOR
        });
        seen_end + t.lease_margin_ms
    }
}

impl LeaderView<'_> {
    fn last_heard(&self, member: &str) -> u64 {
        if member == self.leader {
            return self.now_ms;
        }
        let report = self.last_report_ms.get(member).copied().unwrap_or(0);
        let floor = match self.followed {
            Some((followed, at)) if followed == member => at,
            _ => self.leader_since_ms,
        };
        report.max(floor)
    }

    fn alive(&self, member: &str, t: &DecisionTiming) -> bool {
        self.now_ms.saturating_sub(self.last_heard(member)) <= t.failure_window_ms
    }
}

/// How long a live member that failed a failover of a shoot is passed over as
/// the target of the next failover of that shoot.
pub const RETRY_FAILED_MS: u64 = 60_000;

/// The commands the leader should propose now: members marked down or up,
/// operations failed or advanced, failovers of the shoots whose host is
/// down, hot standbys assigned or dropped and, when nothing else is to do,
/// a shoot moved back to its returned home.
pub fn decide(state: &RingState, view: &LeaderView<'_>, t: &DecisionTiming) -> Vec<RingCommand> {
    let mut out = Vec::new();
    let down = membership(state, view, t, &mut out);
    let is_down = |name: &str| down.contains(&name);
    advance_operations(state, view, t, &is_down, &mut out);
    start_failovers(state, view, t, &is_down, &mut out);
    for p in state.placements.values() {
        if state.open_operation(&p.shoot).is_none() && !is_down(&p.host) {
            out.extend(standby(state, p, view, t, &is_down));
        }
    }
    if out.is_empty() {
        out.extend(relink(state, view, t));
    }
    out
}

/// Marks members down (silent for the failure window) or up again (heard
/// since they went down); the members that are down after this round.
fn membership<'a>(
    state: &'a RingState,
    view: &LeaderView<'_>,
    t: &DecisionTiming,
    out: &mut Vec<RingCommand>,
) -> Vec<&'a str> {
    let mut down: Vec<&str> = Vec::new();
    for m in &state.members {
        let alive = view.alive(&m.name, t);
        match (m.state, alive) {
            (MemberState::Up, false) => {
                out.push(RingCommand::MarkDown {
                    member: m.name.clone(),
                    at_ms: view.now_ms,
                });
                down.push(&m.name);
            }
            (MemberState::Down, true) => {
                let reported = view.last_report_ms.get(&m.name).copied().unwrap_or(0);
                if reported > m.down_since_ms.unwrap_or(0) {
                    out.push(RingCommand::MarkUp {
                        member: m.name.clone(),
                        at_ms: view.now_ms,
                    });
                } else {
                    down.push(&m.name);
                }
            }
            (MemberState::Down, false) => down.push(&m.name),
            (MemberState::Up, true) => {}
        }
    }
    down
}

/// Fails the open operations whose target is down or that made no step
/// within the deadline, and lets a failover restore once the old lease is over.
fn advance_operations(
    state: &RingState,
    view: &LeaderView<'_>,
    t: &DecisionTiming,
    is_down: &dyn Fn(&str) -> bool,
    out: &mut Vec<RingCommand>,
) {
    for op in state.operations.iter().filter(|op| !op.step.is_finished()) {
        if let Some((step, detail)) = next_step(op, view, t, is_down) {
            out.push(RingCommand::AdvanceOperation {
                id: op.id,
                step,
                detail,
                at_ms: view.now_ms,
                outcome: None,
            });
        }
    }
}

/// The step the leader moves open operation `op` to now, and why, if any.
fn next_step(
    op: &Operation,
    view: &LeaderView<'_>,
    t: &DecisionTiming,
    is_down: &dyn Fn(&str) -> bool,
) -> Option<(OperationStep, String)> {
    if is_down(op.target()) {
        let why = format!("target member {} is down", op.target());
        return Some((OperationStep::Failed, why));
    }
    let idle_ms = view.now_ms.saturating_sub(op.updated_at_ms);
    if idle_ms >= t.operation_deadline_ms {
        let why = format!(
            "no step for {} s in {:?} (timing.operationDeadlineMs); last: {}",
            idle_ms / 1000,
            op.step,
            op.detail
        );
        return Some((OperationStep::Failed, why));
    }
    if op.is_migration() && op.step == OperationStep::Pending && is_down(op.source()) {
        let why = format!("source member {} died before the handover", op.source());
        return Some((OperationStep::Failed, why));
    }
    // this leader's own bound, not the proposer's `not_before_ms`: a leader
    // elected since may have a clock far from the old one's
    let lease_over = view.now_ms >= view.old_lease_over_at(op.shoot(), t);
    (op.step == OperationStep::WaitingForLeaseExpiry && lease_over).then(|| {
        let why = format!("old lease expired; {} may restore", op.target());
        (OperationStep::Pending, why)
    })
}

/// A failover for each shoot whose host is down and that no live target is
/// moving: onto its ready standby, else the member [`choose_target`] picks.
fn start_failovers(
    state: &RingState,
    view: &LeaderView<'_>,
    t: &DecisionTiming,
    is_down: &dyn Fn(&str) -> bool,
    out: &mut Vec<RingCommand>,
) {
    let mut load = state.load();
    for p in state.placements.values() {
        if !is_down(&p.host) {
            continue;
        }
        let open = state.open_operation(&p.shoot);
        if open.is_some_and(|op| !is_down(op.target())) {
            continue;
        }
        // a live member that just failed a failover of this shoot (e.g. it could
        // not restore it) is not chosen again for a while
        let refused = |m: &str| {
            state.operations.iter().any(|op| {
                op.shoot() == p.shoot
                    && op.target() == m
                    && op.step == OperationStep::Failed
                    && !is_down(m)
                    && view.now_ms < op.updated_at_ms + RETRY_FAILED_MS
            })
        };
        let usable = |m: &str| !is_down(m) && view.alive(m, t) && !refused(m);
        // a ready standby holds every acknowledged write: promote it
        let promote = p
            .standby
            .as_ref()
            .filter(|s| s.ready && usable(&s.member))
            .map(|s| s.member.as_str());
        let Some(to) = promote.or_else(|| choose_target(state, &p.host, &p.shoot, &load, usable))
        else {
            continue;
        };
        *load.entry(to).or_default() += 1;
        out.push(RingCommand::StartFailover {
            shoot: p.shoot.clone(),
            to: to.to_string(),
            at_ms: view.now_ms,
            not_before_ms: view
                .old_lease_over_at(&p.shoot, t)
                .max(view.now_ms + t.lease_margin_ms),
            // the freshest of the heartbeat this leader heard and the one
            // the ring holds (a leader that died with the host took its
            // heartbeats along)
            seen: view
                .revisions
                .get(&p.shoot)
                .copied()
                .max(state.backups.get(&p.shoot).and_then(|b| b.seen)),
            promote: promote.is_some(),
        });
    }
}

/// The hot standby of a placement whose host lives: dropped when
/// protection is `backup` or its member is down (the host then re-forms its
/// etcd alone), assigned when protection is `standby` and there is none: on
/// the member a failover of the host would choose (its nearest healthy
/// predecessor), never the host.
fn standby(
    state: &RingState,
    p: &Placement,
    view: &LeaderView<'_>,
    t: &DecisionTiming,
    is_down: &dyn Fn(&str) -> bool,
) -> Option<RingCommand> {
    let set = |member: Option<&str>| RingCommand::SetStandby {
        shoot: p.shoot.clone(),
        epoch: p.epoch,
        member: member.map(str::to_string),
    };
    match (&p.standby, t.protection) {
        (Some(_), Protection::Backup) => Some(set(None)),
        (Some(s), Protection::Standby) => {
            let gone = is_down(&s.member) || state.member(&s.member).is_none();
            gone.then(|| set(None))
        }
        (None, Protection::Standby) => {
            let mut load: BTreeMap<&str, usize> = BTreeMap::new();
            for s in state.placements.values().filter_map(|p| p.standby.as_ref()) {
                *load.entry(s.member.as_str()).or_default() += 1;
            }
            let healthy = |m: &str| m != p.host && !is_down(m) && view.alive(m, t);
            choose_target(state, &p.host, &p.shoot, &load, healthy).map(|m| set(Some(m)))
        }
        (None, Protection::Backup) => None,
    }
}

/// A member back from the dead hosts its successor again: once it has been
/// up for `relink_after_ms`, the shoot a failover took from it moves back by
/// a planned migration (nothing acknowledged is lost). Only a shoot whose
/// newest operation is that finished failover: a move an operator made, or a
/// move back that failed, is left alone (no retrying for ever). One move at
/// a time, none while any operation runs, and only between live members.
fn relink(state: &RingState, view: &LeaderView<'_>, t: &DecisionTiming) -> Option<RingCommand> {
    if t.relink_after_ms == 0 || state.operations.iter().any(|o| !o.step.is_finished()) {
        return None;
    }
    let live = |name: &str| {
        state
            .member(name)
            .is_some_and(|m| m.state == MemberState::Up && view.alive(name, t))
    };
    state.placements.values().find_map(|p| {
        let home = state.predecessor(&p.shoot)?;
        if p.host == home.name || !live(&home.name) || !live(&p.host) {
            return None;
        }
        let up_for = view.now_ms.saturating_sub(home.up_since_ms.unwrap_or(0));
        if up_for < t.relink_after_ms {
            return None;
        }
        let newest = state
            .operations
            .iter()
            .filter(|o| o.shoot() == p.shoot)
            .max_by_key(|o| o.id)?;
        let displaced = !newest.is_migration()
            && newest.step == OperationStep::Done
            && newest.source() == home.name
            && newest.target() == p.host;
        displaced.then(|| RingCommand::StartMigration {
            shoot: p.shoot.clone(),
            to: home.name.clone(),
            at_ms: view.now_ms,
        })
    })
}

/// The member to take over `shoot` from the dead `host`: the host's nearest
/// healthy predecessor in ring order, else the least-loaded healthy member;
/// never the shoot's own member while another candidate exists.
pub fn choose_target<'s>(
    state: &'s RingState,
    host: &str,
    shoot: &str,
    load: &BTreeMap<&str, usize>,
    healthy: impl Fn(&str) -> bool,
) -> Option<&'s str> {
    let candidates: Vec<&str> = state
        .members
        .iter()
        .map(|m| m.name.as_str())
        .filter(|m| *m != host && healthy(m))
        .collect();
    let preferred: Vec<&str> = candidates.iter().copied().filter(|m| *m != shoot).collect();
    let pool = if preferred.is_empty() {
        &candidates
    } else {
        &preferred
    };
    let n = state.members.len();
    let start = state.members.iter().position(|m| m.name == host)?;
    for k in 1..n {
        let m = state.members[(start + n - k) % n].name.as_str();
        if pool.contains(&m) {
            // nearest predecessor, unless it is clearly busier than the least-loaded one
            let least = pool
                .iter()
                .map(|c| load.get(c).copied().unwrap_or(0))
                .min()
                .unwrap_or(0);
            if load.get(m).copied().unwrap_or(0) <= least + 1 {
                return Some(m);
            }
            break;
        }
    }
    pool.iter()
        .copied()
        .min_by_key(|c| (load.get(c).copied().unwrap_or(0), *c))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
