//! The leader's decisions, as data: given the ring state and what the leader has
//! heard, which commands to propose. Pure and deterministic; the daemon proposes
//! whatever comes out, and the state machine re-checks every command on apply.

use std::collections::BTreeMap;

use crate::state::{MemberState, OperationStep, RingCommand, RingState};

/// Timing the decisions depend on (milliseconds).
#[derive(Debug, Clone, Copy)]
pub struct DecisionTiming {
    /// Silence after which a member is declared down.
    pub failure_window_ms: u64,
    /// Added to the old lease's end before a replacement may start (clock skew).
    pub lease_margin_ms: u64,
}

/// What the leader knows beyond the replicated state.
#[derive(Debug, Clone)]
pub struct LeaderView<'a> {
    pub now_ms: u64,
    /// When this member became leader: silence is only counted from then.
    pub leader_since_ms: u64,
    /// The leader's own name (always alive from its point of view).
    pub leader: &'a str,
    /// Member name → when its last health report arrived.
    pub last_report_ms: &'a BTreeMap<String, u64>,
}

impl LeaderView<'_> {
    fn last_heard(&self, member: &str) -> u64 {
        if member == self.leader {
            return self.now_ms;
        }
        let report = self.last_report_ms.get(member).copied().unwrap_or(0);
        report.max(self.leader_since_ms)
    }

    fn alive(&self, member: &str, t: &DecisionTiming) -> bool {
        self.now_ms.saturating_sub(self.last_heard(member)) <= t.failure_window_ms
    }
}

/// The commands the leader should propose now.
/// How long a live member that failed a failover of a shoot is passed over as
/// the target of the next failover of that shoot.
pub const RETRY_FAILED_MS: u64 = 60_000;

pub fn decide(state: &RingState, view: &LeaderView<'_>, t: &DecisionTiming) -> Vec<RingCommand> {
    let mut out = Vec::new();
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
    let is_down = |name: &str| down.contains(&name);

    for op in &state.operations {
        if op.step.is_finished() {
            continue;
        }
        if is_down(op.target()) {
            out.push(RingCommand::AdvanceOperation {
                id: op.id,
                step: OperationStep::Failed,
                detail: format!("target member {} is down", op.target()),
                at_ms: view.now_ms,
                outcome: None,
            });
            continue;
        }
        if op.is_migration() && op.step == OperationStep::Pending && is_down(op.source()) {
            out.push(RingCommand::AdvanceOperation {
                id: op.id,
                step: OperationStep::Failed,
                detail: format!("source member {} died before the handover", op.source()),
                at_ms: view.now_ms,
                outcome: None,
            });
            continue;
        }
        if op.step == OperationStep::WaitingForLeaseExpiry {
            let crate::state::OperationKind::Failover { not_before_ms, .. } = &op.kind else {
                continue;
            };
            if view.now_ms >= *not_before_ms {
                out.push(RingCommand::AdvanceOperation {
                    id: op.id,
                    step: OperationStep::Pending,
                    detail: format!("old lease expired; {} may restore", op.target()),
                    at_ms: view.now_ms,
                    outcome: None,
                });
            }
        }
    }

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
        let Some(to) = choose_target(state, &p.host, &p.shoot, &load, |m| {
            !is_down(m) && view.alive(m, t) && !refused(m)
        }) else {
            continue;
        };
        *load.entry(to).or_default() += 1;
        let lease_end = p.lease.as_ref().map_or(0, |l| l.expires_at_ms);
        out.push(RingCommand::StartFailover {
            shoot: p.shoot.clone(),
            to: to.to_string(),
            at_ms: view.now_ms,
            not_before_ms: lease_end.max(view.now_ms) + t.lease_margin_ms,
        });
    }
    out
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
mod tests {
    use super::*;
    use crate::state::{OperationKind, RingState};

    const T: DecisionTiming = DecisionTiming {
        failure_window_ms: 3_000,
        lease_margin_ms: 500,
    };

    fn ring(names: &[&str]) -> RingState {
        let mut s = RingState::default();
        s.apply(&RingCommand::Bootstrap {
            members: names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    (
                        n.to_string(),
                        i as u64 + 1,
                        format!("127.0.0.1:{}", 7000 + i),
                    )
                })
                .collect(),
        })
        .unwrap();
        s
    }

    fn reports(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(n, t)| (n.to_string(), *t)).collect()
    }

    /// Applies decisions until nothing changes (like the leader's loop would).
    fn settle(s: &mut RingState, view: &LeaderView<'_>) -> Vec<RingCommand> {
        let mut all = Vec::new();
        for _ in 0..5 {
            let cmds = decide(s, view, &T);
            let mut changed = false;
            for c in cmds {
                if s.apply(&c).is_ok() {
                    changed = true;
                    all.push(c);
                }
            }
            if !changed {
                break;
            }
        }
        all
    }

    #[test]
    fn nothing_happens_while_everyone_reports() {
        let s = ring(&["a", "b", "c"]);
        let r = reports(&[("b", 9_000), ("c", 9_500)]);
        let view = LeaderView {
            now_ms: 10_000,
            leader_since_ms: 0,
            leader: "a",
            last_report_ms: &r,
        };
        assert!(decide(&s, &view, &T).is_empty());
    }

    #[test]
    fn silence_is_counted_from_leadership_not_from_zero() {
        let s = ring(&["a", "b", "c"]);
        let r = reports(&[]);
        let view = LeaderView {
            now_ms: 10_000,
            leader_since_ms: 9_000,
            leader: "a",
            last_report_ms: &r,
        };
        assert!(decide(&s, &view, &T).is_empty());
    }

    #[test]
    fn dead_host_is_marked_down_and_its_shoot_fails_over_to_its_predecessor() {
        let mut s = ring(&["a", "b", "c"]);
        s.apply(&RingCommand::RenewLease {
            shoot: "c".into(),
            holder: "b".into(),
            epoch: 1,
            expires_at_ms: 12_000,
        })
        .unwrap();
        // b hosts c's control plane; b goes silent.
        let r = reports(&[("b", 5_000), ("c", 9_900)]);
        let view = LeaderView {
            now_ms: 10_000,
            leader_since_ms: 0,
            leader: "a",
            last_report_ms: &r,
        };
        let cmds = settle(&mut s, &view);
        assert!(matches!(&cmds[0], RingCommand::MarkDown { member, .. } if member == "b"));
        // b's predecessor is a
        assert_eq!(s.placements["c"].host, "a");
        assert_eq!(s.placements["c"].epoch, 2);
        let op = s.open_operation("c").unwrap();
        assert!(
            matches!(&op.kind, OperationKind::Failover { from, to, not_before_ms: 12_500, .. } if from == "b" && to == "a")
        );
        assert_eq!(op.step, OperationStep::WaitingForLeaseExpiry);

        // after the lease (plus margin) the operation becomes pending
        let r = reports(&[("b", 5_000), ("c", 12_400)]);
        let later = LeaderView {
            now_ms: 12_500,
            leader_since_ms: 0,
            leader: "a",
            last_report_ms: &r,
        };
        settle(&mut s, &later);
        assert_eq!(s.open_operation("c").unwrap().step, OperationStep::Pending);
    }

    #[test]
    fn returning_member_is_marked_up_but_keeps_no_placement() {
        let mut s = ring(&["a", "b", "c"]);
        let r = reports(&[("b", 1_000), ("c", 9_900)]);
        settle(
            &mut s,
            &LeaderView {
                now_ms: 10_000,
                leader_since_ms: 0,
                leader: "a",
                last_report_ms: &r,
            },
        );
        assert_eq!(s.member("b").unwrap().state, MemberState::Down);
        let r = reports(&[("b", 11_000), ("c", 11_000)]);
        settle(
            &mut s,
            &LeaderView {
                now_ms: 11_100,
                leader_since_ms: 0,
                leader: "a",
                last_report_ms: &r,
            },
        );
        assert_eq!(s.member("b").unwrap().state, MemberState::Up);
        assert_eq!(
            s.placements["c"].host, "a",
            "the zombie does not get its shoot back"
        );
    }

    #[test]
    fn failover_whose_target_dies_is_failed_and_redone_elsewhere() {
        let mut s = ring(&["a", "b", "c", "d", "e"]);
        // c dies: d's control plane goes to b (c's predecessor)
        let r = reports(&[("b", 9_900), ("c", 1_000), ("d", 9_900), ("e", 9_900)]);
        settle(
            &mut s,
            &LeaderView {
                now_ms: 10_000,
                leader_since_ms: 0,
                leader: "a",
                last_report_ms: &r,
            },
        );
        assert_eq!(s.placements["d"].host, "b");
        // now b dies too (it hosted c, and is the target for d)
        let r = reports(&[("b", 10_000), ("c", 1_000), ("d", 19_900), ("e", 19_900)]);
        settle(
            &mut s,
            &LeaderView {
                now_ms: 20_000,
                leader_since_ms: 0,
                leader: "a",
                last_report_ms: &r,
            },
        );
        let failed: Vec<_> = s
            .operations
            .iter()
            .filter(|o| o.step == OperationStep::Failed)
            .collect();
        assert_eq!(failed.len(), 1, "{:?}", s.operations);
        for shoot in ["c", "d"] {
            let host = &s.placements[shoot].host;
            assert!(host == "a" || host == "e", "{shoot} on {host}");
            assert!(s.open_operation(shoot).is_some());
        }
    }

    #[test]
    fn a_target_that_refused_a_failover_is_passed_over_for_a_while() {
        let mut s = ring(&["a", "b", "c", "d"]);
        // c dies: d's control plane goes to b (c's predecessor)
        let r = reports(&[("a", 9_900), ("b", 9_900), ("c", 1_000), ("d", 9_900)]);
        let view = |now_ms, r| LeaderView {
            now_ms,
            leader_since_ms: 0,
            leader: "a",
            last_report_ms: r,
        };
        settle(&mut s, &view(10_000, &r));
        let op = s.open_operation("d").cloned().expect("failover of d");
        assert_eq!(op.target(), "b");
        // b is alive but cannot restore: it fails the operation itself
        s.apply(&RingCommand::AdvanceOperation {
            id: op.id,
            step: OperationStep::Failed,
            detail: "cannot restore here".into(),
            at_ms: 10_500,
            outcome: None,
        })
        .unwrap();
        let r = reports(&[("a", 10_900), ("b", 10_900), ("c", 1_000), ("d", 10_900)]);
        settle(&mut s, &view(11_000, &r));
        let again = s.open_operation("d").cloned().expect("a new failover of d");
        assert_ne!(again.target(), "b", "{again:?}");
        assert_ne!(again.id, op.id);
    }

    #[test]
    fn no_target_without_healthy_members_other_than_the_dead() {
        let mut s = ring(&["a", "b", "c"]);
        let r = reports(&[("b", 1_000), ("c", 1_000)]);
        let cmds = settle(
            &mut s,
            &LeaderView {
                now_ms: 10_000,
                leader_since_ms: 0,
                leader: "a",
                last_report_ms: &r,
            },
        );
        // b and c down; a is the only healthy member: c's shoot (hosted by b) moves to a,
        // a's shoot (hosted by c) has only a itself as candidate and goes there too.
        assert!(
            cmds.iter()
                .filter(|c| matches!(c, RingCommand::StartFailover { .. }))
                .count()
                == 2
        );
        assert!(s
            .placements
            .values()
            .filter(|p| p.shoot != "b")
            .all(|p| p.host == "a"));
    }

    #[test]
    fn choose_target_prefers_predecessor_then_least_loaded() {
        let s = ring(&["a", "b", "c", "d"]);
        let mut load = s.load();
        assert_eq!(choose_target(&s, "c", "d", &load, |_| true), Some("b"));
        load.insert("b", 5);
        assert_eq!(choose_target(&s, "c", "d", &load, |_| true), Some("a"));
        assert_eq!(choose_target(&s, "c", "d", &load, |m| m == "d"), Some("d"));
        assert_eq!(choose_target(&s, "c", "d", &load, |_| false), None);
    }
}
