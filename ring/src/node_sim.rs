//! Several `RaftCore`s over a simulated network: seeded loss, delay, reordering,
//! partitions and crashes. Repeatable: the network's randomness comes from the
//! seed and every node's election timeout is pinned.

use std::collections::{BTreeMap, BTreeSet};

use raft::prelude::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;

use super::*;
use crate::storage::DiskStorage;

struct Sim {
    nodes: BTreeMap<u64, RaftCore>,
    dirs: BTreeMap<u64, tempfile::TempDir>,
    ids: Vec<u64>,
    rng: StdRng,
    in_flight: Vec<(u64, Message)>,
    now: u64,
    drop_rate: f64,
    max_delay: u64,
    /// Nodes on the "A" side; messages between A and not-A are lost.
    partition: Option<BTreeSet<u64>>,
    compact_every: u64,
    /// term -> leaders seen in that term
    leaders: BTreeMap<u64, BTreeSet<u64>>,
    /// Election timeouts (ticks) pinned by a test instead of `10 + 3 * id`.
    timeouts: BTreeMap<u64, usize>,
}

fn tuning(id: u64, compact_every: u64, timeout: Option<usize>) -> RaftTuning {
    let min = timeout.unwrap_or(10 + 3 * id as usize);
    RaftTuning {
        compact_every,
        election_range: Some((min, min + 1)),
        ..Default::default()
    }
}

impl Sim {
    fn new(n: u64, seed: u64) -> Sim {
        Sim::with_timeouts(n, seed, &[])
    }

    /// A ring whose listed nodes time out after the given ticks.
    fn with_timeouts(n: u64, seed: u64, timeouts: &[(u64, usize)]) -> Sim {
        let ids: Vec<u64> = (1..=n).collect();
        let mut sim = Sim {
            nodes: BTreeMap::new(),
            dirs: BTreeMap::new(),
            ids: ids.clone(),
            rng: StdRng::seed_from_u64(seed),
            in_flight: Vec::new(),
            now: 0,
            drop_rate: 0.0,
            max_delay: 0,
            partition: None,
            compact_every: 1000,
            leaders: BTreeMap::new(),
            timeouts: timeouts.iter().copied().collect(),
        };
        for id in ids {
            sim.dirs.insert(id, tempfile::tempdir().unwrap());
            sim.start(id);
        }
        sim
    }

    fn start(&mut self, id: u64) {
        let path = self.dirs[&id].path().join("raft.redb");
        let store = DiskStorage::open(&path, &self.ids).unwrap();
        let core = RaftCore::new(
            id,
            store,
            &tuning(id, self.compact_every, self.timeouts.get(&id).copied()),
            &slog::Logger::root(slog::Discard, slog::o!()),
        )
        .unwrap();
        self.nodes.insert(id, core);
    }

    fn crash(&mut self, id: u64) {
        self.nodes.remove(&id);
    }

    fn connected(&self, a: u64, b: u64) -> bool {
        match &self.partition {
            Some(side) => side.contains(&a) == side.contains(&b),
            None => true,
        }
    }

    fn tick(&mut self) {
        self.now += 1;
        for core in self.nodes.values_mut() {
            core.tick();
        }
        // deliver due messages in random order
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|(t, _)| *t <= self.now);
        self.in_flight = later;
        for i in (1..due.len()).rev() {
            let j = self.rng.random_range(0..=i);
            due.swap(i, j);
        }
        for (_, m) in due {
            if let Some(core) = self.nodes.get_mut(&m.to) {
                let _ = core.step(m);
            }
        }
        for _ in 0..3 {
            let ids: Vec<u64> = self.nodes.keys().copied().collect();
            for id in ids {
                let mut out = Vec::new();
                self.nodes
                    .get_mut(&id)
                    .unwrap()
                    .handle_ready(|m| out.extend(m))
                    .unwrap();
                self.nodes.get_mut(&id).unwrap().answer_waiters();
                for m in out {
                    if !self.connected(m.from, m.to) || self.rng.random_bool(self.drop_rate) {
                        continue;
                    }
                    let at = self.now + self.rng.random_range(0..=self.max_delay);
                    self.in_flight.push((at, m));
                }
            }
        }
        for core in self.nodes.values() {
            if core.is_leader() {
                self.leaders
                    .entry(core.raw.raft.term)
                    .or_default()
                    .insert(core.id());
            }
        }
    }

    fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.tick();
        }
    }

    fn run_until(&mut self, max: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        for _ in 0..max {
            if done(self) {
                return true;
            }
            self.tick();
        }
        done(self)
    }

    fn leader(&self) -> Option<u64> {
        self.nodes
            .values()
            .filter(|c| c.is_leader())
            .max_by_key(|c| c.raw.raft.term)
            .map(|c| c.id())
    }

    fn propose(&mut self, id: u64, cmd: RingCommand) -> oneshot::Receiver<ApplyResult> {
        let (tx, rx) = oneshot::channel();
        let _ = self.nodes.get_mut(&id).unwrap().propose(cmd, Some(tx));
        rx
    }

    fn assert_one_leader_per_term(&self) {
        for (term, ids) in &self.leaders {
            assert!(ids.len() <= 1, "term {term} had leaders {ids:?}");
        }
    }
}

fn backup(rev: u64) -> RingCommand {
    RingCommand::ReportBackup {
        shoot: "s".into(),
        revision: rev,
        at_ms: rev,
        seen: None,
    }
}

fn applied(rx: &mut oneshot::Receiver<ApplyResult>) -> bool {
    matches!(rx.try_recv(), Ok(ApplyResult::Applied { .. }))
}

#[test]
fn one_leader_per_term_and_agreement_under_loss_delay_and_reordering() {
    for seed in 0..12u64 {
        let n = if seed % 2 == 0 { 3 } else { 5 };
        let mut sim = Sim::new(n, seed);
        sim.drop_rate = 0.1;
        sim.max_delay = 3;
        assert!(
            sim.run_until(600, |s| s.leader().is_some()),
            "seed {seed}: no leader"
        );
        let mut acked = 0;
        for rev in 1..=20 {
            let Some(l) = sim.leader() else {
                sim.run(20);
                continue;
            };
            let mut rx = sim.propose(l, backup(rev));
            sim.run(15);
            if applied(&mut rx) {
                acked = rev;
            }
        }
        assert!(acked > 0, "seed {seed}: nothing committed");
        sim.drop_rate = 0.0;
        sim.run(200);
        sim.assert_one_leader_per_term();
        let states: Vec<&RingState> = sim.nodes.values().map(|c| c.state()).collect();
        for s in &states {
            assert_eq!(*s, states[0], "seed {seed}: states diverged");
        }
        // an acknowledged write is never lost
        assert!(states[0].backups["s"].revision >= acked, "seed {seed}");
    }
}

#[test]
fn minority_partition_cannot_commit_and_heals() {
    for seed in 0..6u64 {
        let mut sim = Sim::new(5, 100 + seed);
        sim.max_delay = 1;
        assert!(sim.run_until(600, |s| s.leader().is_some()));
        let old = sim.leader().unwrap();
        let buddy = *sim.ids.iter().find(|i| **i != old).unwrap();
        sim.partition = Some(BTreeSet::from([old, buddy]));
        let mut minority = sim.propose(old, backup(1));
        assert!(
            sim.run_until(800, |s| s.leader().is_some_and(|l| l != old && l != buddy)),
            "seed {seed}: majority elected no leader"
        );
        let new = sim.leader().unwrap();
        let mut majority = sim.propose(new, backup(2));
        sim.run(100);
        assert!(
            applied(&mut majority),
            "seed {seed}: majority could not commit"
        );
        assert!(!applied(&mut minority), "seed {seed}: minority committed");
        sim.partition = None;
        sim.run(300);
        assert!(
            !applied(&mut minority),
            "seed {seed}: minority write surfaced after heal"
        );
        let first = sim.nodes[&new].state().clone();
        for c in sim.nodes.values() {
            assert_eq!(
                c.state(),
                &first,
                "seed {seed}: node {} differs after heal",
                c.id()
            );
        }
        assert_eq!(first.backups["s"].revision, 2);
        sim.assert_one_leader_per_term();
    }
}

#[test]
fn crashed_node_restarts_from_disk_and_catches_up_through_a_snapshot() {
    let mut sim = Sim::new(3, 7);
    sim.compact_every = 10;
    for id in 1..=3 {
        sim.crash(id);
        sim.start(id);
    }
    assert!(sim.run_until(600, |s| s.leader().is_some()));
    let leader = sim.leader().unwrap();
    let lagging = *sim.ids.iter().find(|i| **i != leader).unwrap();
    sim.crash(lagging);
    for rev in 1..=40 {
        let l = sim.leader().unwrap();
        let mut rx = sim.propose(l, backup(rev));
        sim.run(5);
        assert!(
            applied(&mut rx),
            "rev {rev} not committed by the two live nodes"
        );
    }
    let leader_core = &sim.nodes[&sim.leader().unwrap()];
    assert!(
        leader_core.view().snapshot_index > 0,
        "leader never compacted"
    );
    sim.start(lagging);
    assert!(sim.run_until(400, |s| s.nodes[&lagging]
        .state()
        .backups
        .get("s")
        .is_some_and(|b| b.revision == 40)));
    assert!(
        sim.nodes[&lagging].view().snapshot_index > 0,
        "caught up without a snapshot"
    );

    // everyone restarts: state comes back from disk
    let before = sim.nodes[&lagging].state().clone();
    for id in 1..=3 {
        sim.crash(id);
        sim.start(id);
    }
    sim.in_flight.clear();
    assert!(sim.run_until(600, |s| s.leader().is_some()
        && s.nodes.values().all(|c| c.state() == &before)));
}

#[test]
fn membership_change_adds_a_voter() {
    let mut sim = Sim::new(3, 11);
    bootstrapped(&mut sim);
    // node 4 starts empty (no voters) and is added by a conf change
    sim.ids.push(4);
    sim.dirs.insert(4, tempfile::tempdir().unwrap());
    let path = sim.dirs[&4].path().join("raft.redb");
    let store = DiskStorage::open(&path, &[]).unwrap();
    let core = RaftCore::new(
        4,
        store,
        &tuning(4, 1000, None),
        &slog::Logger::root(slog::Discard, slog::o!()),
    )
    .unwrap();
    sim.nodes.insert(4, core);
    let (tx, mut rx) = oneshot::channel();
    let l = sim.leader().unwrap();
    sim.nodes
        .get_mut(&l)
        .unwrap()
        .propose_membership(
            RingCommand::AddMember {
                name: "m4".into(),
                id: 4,
                address: "127.0.0.1:4".into(),
                epoch: 0,
            },
            Some(tx),
        )
        .unwrap();
    sim.run(50);
    assert!(applied(&mut rx));
    assert!(sim.run_until(300, |s| s.nodes[&4].state().member("m4").is_some()));
    assert_eq!(sim.nodes[&l].view().voters, vec![1, 2, 3, 4]);
}

/// Bootstraps members m1..m3 (Raft ids 1..3: m1 hosts m2, m2 hosts m3, m3
/// hosts m1) and returns the leader.
fn bootstrapped(sim: &mut Sim) -> u64 {
    assert!(sim.run_until(600, |s| s.leader().is_some()));
    let l = sim.leader().unwrap();
    let mut boot = sim.propose(
        l,
        RingCommand::Bootstrap {
            members: (1..=3)
                .map(|i| (format!("m{i}"), i, format!("127.0.0.1:{i}")))
                .collect(),
            epochs: Default::default(),
            hosts: Default::default(),
        },
    );
    sim.run(20);
    assert!(applied(&mut boot));
    assert!(sim.run_until(100, |s| s
        .nodes
        .values()
        .all(|c| !c.state().members.is_empty())));
    l
}

/// A follower's proposals reach the leader through raft-rs's forwarding: its
/// own lease renewal commits; one in another member's name, or a command
/// only the leader makes, never does; an empty proposal stepped into the
/// leader is refused instead of panicking inside raft-rs.
#[test]
fn peers_propose_only_their_own_duties_and_never_an_empty_proposal() {
    let mut sim = Sim::new(3, 23);
    let l = bootstrapped(&mut sim);
    let f = *sim.ids.iter().find(|i| **i != l).unwrap();
    let me = format!("m{f}");
    let mine = sim.nodes[&l]
        .state()
        .placements
        .values()
        .find(|p| p.host == me)
        .unwrap()
        .shoot
        .clone();
    let other = sim.nodes[&l]
        .state()
        .placements
        .values()
        .find(|p| p.host != me)
        .unwrap()
        .clone();
    let renew = |shoot: &str, holder: &str| RingCommand::RenewLease {
        shoot: shoot.into(),
        holder: holder.into(),
        epoch: 1,
        expires_at_ms: 60_000,
    };
    let mut own = sim.propose(f, renew(&mine, &me));
    let mut forged = sim.propose(f, renew(&other.shoot, &other.host));
    let mut leaders = sim.propose(
        f,
        RingCommand::MarkDown {
            member: format!("m{l}"),
            at_ms: 1,
        },
    );
    sim.run(50);
    assert!(
        applied(&mut own),
        "the follower's own renewal did not commit"
    );
    assert!(
        !applied(&mut forged),
        "a renewal in another member's name committed"
    );
    assert!(!applied(&mut leaders), "a follower's MarkDown committed");
    for c in sim.nodes.values() {
        let s = c.state();
        assert!(s.placements[&mine].lease.is_some());
        assert!(
            s.placements[&other.shoot].lease.is_none(),
            "node {}",
            c.id()
        );
        assert!(
            s.members.iter().all(|m| m.down_since_ms.is_none()),
            "node {}",
            c.id()
        );
    }

    let mut empty = Message::default();
    empty.set_msg_type(MessageType::MsgPropose);
    empty.from = f;
    empty.to = l;
    let err = sim.nodes.get_mut(&l).unwrap().step(empty).unwrap_err();
    assert!(matches!(err, RingError::Refused(_)), "{err}");
    // the leader goes on committing
    let mut after = sim.propose(l, backup(1));
    sim.run(20);
    assert!(applied(&mut after));
}

/// A leader about to stop hands its leadership to a caught-up voter, which
/// leads within a few message rounds (every election timeout here is at
/// least 13 ticks) and commits with the third voter once the old leader is
/// gone; a follower has nothing to hand over.
#[test]
fn a_stopping_leader_hands_its_leadership_to_a_caught_up_voter() {
    let mut sim = Sim::new(3, 11);
    assert!(sim.run_until(600, |s| s.leader().is_some()));
    let old = sim.leader().unwrap();
    let mut rx = sim.propose(old, backup(1));
    sim.run(5);
    assert!(applied(&mut rx));
    let follower = *sim.ids.iter().find(|i| **i != old).unwrap();
    assert_eq!(sim.nodes.get_mut(&follower).unwrap().hand_over(), None);
    let to = sim
        .nodes
        .get_mut(&old)
        .unwrap()
        .hand_over()
        .expect("a leader with voters hands over");
    assert_ne!(to, old);
    // both are caught up: the higher priority, whom the other would not refuse
    let highest = *sim.ids.iter().filter(|i| **i != old).max().unwrap();
    assert_eq!(to, highest);
    assert!(
        sim.run_until(5, |s| s.nodes[&to].is_leader()),
        "{to} did not take the leadership over within 5 ticks"
    );
    sim.crash(old);
    let mut rx = sim.propose(to, backup(2));
    sim.run(5);
    assert!(
        applied(&mut rx),
        "the new leader commits with the third voter"
    );
    sim.assert_one_leader_per_term();
}

/// The leader dies and both survivors time out in the same tick (on a busy
/// host two randomized timeouts often land in one 100 ms tick): each would
/// vote for itself and the election would split, round after round, while
/// the survivors' leases run out. Election priorities break the tie in the
/// first round: the higher-priority survivor wins its pre-vote and the
/// other's vote; the lower one's pre-vote is refused.
#[test]
fn survivors_timing_out_together_elect_a_leader_in_one_round() {
    let mut sim = Sim::with_timeouts(3, 21, &[(1, 10), (2, 20), (3, 20)]);
    assert!(sim.run_until(100, |s| s.leader() == Some(1)));
    let mut rx = sim.propose(1, backup(1));
    sim.run(5);
    assert!(applied(&mut rx));
    sim.crash(1);
    assert!(
        sim.run_until(2 * 21 + 5, |s| s.leader().is_some()),
        "no leader {} ticks after the leader died (split votes)",
        2 * 21 + 5
    );
    assert_eq!(sim.leader(), Some(3), "the higher-priority survivor leads");
    let mut rx = sim.propose(3, backup(2));
    sim.run(5);
    assert!(applied(&mut rx));
    sim.assert_one_leader_per_term();
}
