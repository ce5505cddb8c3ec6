//! The task that owns one [`RaftCore`]: it ticks it, steps peers' messages,
//! takes proposals through a [`NodeHandle`], persists and sends each Ready,
//! and publishes a [`NodeView`] for observers.

use std::time::Duration;

use raft::prelude::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::node::{ApplyResult, NodeView, RaftCore};
use crate::state::RingCommand;
use crate::RingError;

/// Requests to the node task.
pub enum NodeRequest {
    /// A message from a peer.
    Step(Message),
    /// A ring command to commit.
    Propose(RingCommand, oneshot::Sender<ApplyResult>),
    /// A membership change to commit.
    Membership(RingCommand, oneshot::Sender<ApplyResult>),
    /// A peer could not be reached.
    Unreachable(u64),
    /// A snapshot transfer to a peer ended.
    SnapshotSent { to: u64, ok: bool },
}

/// Cloneable access to the node task.
#[derive(Clone)]
pub struct NodeHandle {
    tx: mpsc::Sender<NodeRequest>,
    view: watch::Receiver<NodeView>,
}

/// Errors of a proposal made through a [`NodeHandle`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProposeError {
    #[error("the node is shutting down")]
    Stopped,
    #[error("not committed within {0:?} (no quorum, or the leader changed); retry")]
    Timeout(Duration),
    #[error("the leader changed before it was applied (raft may have dropped it); retry")]
    LeaderChanged,
    #[error("refused at once (no leader known mid-election, a leadership transfer under way, or the node stopping); retry")]
    Dropped,
    #[error("rejected by the ring state: {0}")]
    Rejected(String),
    #[error("{0}")]
    Invalid(String),
}

impl ProposeError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProposeError::Timeout(_) | ProposeError::LeaderChanged | ProposeError::Dropped
        )
    }
}

impl NodeHandle {
    /// The node's latest view.
    pub fn view(&self) -> NodeView {
        self.view.borrow().clone()
    }

    /// Subscribes to view changes.
    pub fn watch(&self) -> watch::Receiver<NodeView> {
        self.view.clone()
    }

    /// Delivers a peer's message (dropped if the node's inbox is full).
    pub fn step(&self, msg: Message) {
        let _ = self.tx.try_send(NodeRequest::Step(msg));
    }

    /// Reports an unreachable peer.
    pub fn unreachable(&self, id: u64) {
        let _ = self.tx.try_send(NodeRequest::Unreachable(id));
    }

    /// Reports the end of a snapshot transfer.
    pub fn snapshot_sent(&self, to: u64, ok: bool) {
        let _ = self.tx.try_send(NodeRequest::SnapshotSent { to, ok });
    }

    /// Commits `command` through the quorum and waits until it is applied here.
    pub async fn propose(
        &self,
        command: RingCommand,
        timeout: Duration,
    ) -> Result<u64, ProposeError> {
        self.request(timeout, |tx| NodeRequest::Propose(command, tx))
            .await
    }

    /// Like [`NodeHandle::propose`], but gives up as soon as the leader this
    /// node knew when proposing is lost or replaced. Only for commands whose
    /// second commit changes nothing (a lease renewal): the first may still
    /// commit under the next leader while the proposer tries again, and
    /// that window is far wider than after a timeout. Raft drops a proposal
    /// forwarded to a leader that died without a word: waiting out `timeout`
    /// (a lease renewal's is a third of the lease) let the guards of healthy
    /// control planes reach their fence time while the ring elected a new
    /// leader (`kill-machine` drill: two bystander shoots out for 7 s).
    pub async fn propose_until_leader_changes(
        &self,
        command: RingCommand,
        timeout: Duration,
    ) -> Result<u64, ProposeError> {
        let mut view = self.view.clone();
        let leader_of = |v: &NodeView| (v.leader_id, v.term);
        let known = leader_of(&view.borrow_and_update());
        let changed = async move {
            while view.changed().await.is_ok() {
                if leader_of(&view.borrow_and_update()) != known {
                    return;
                }
            }
            // the node stopped: the proposal's own answer says so
            std::future::pending::<()>().await
        };
        tokio::select! {
            biased;
            answer = self.propose(command, timeout) => answer,
            () = changed => Err(ProposeError::LeaderChanged),
        }
    }

    /// Commits a membership change (AddMember / RemoveMember).
    pub async fn change_membership(
        &self,
        command: RingCommand,
        timeout: Duration,
    ) -> Result<u64, ProposeError> {
        self.request(timeout, |tx| NodeRequest::Membership(command, tx))
            .await
    }

    async fn request(
        &self,
        timeout: Duration,
        make: impl FnOnce(oneshot::Sender<ApplyResult>) -> NodeRequest,
    ) -> Result<u64, ProposeError> {
        let (tx, rx) = oneshot::channel();
        let send = tokio::time::timeout(timeout, self.tx.send(make(tx))).await;
        match send {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ProposeError::Stopped),
            Err(_) => return Err(ProposeError::Timeout(timeout)),
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(ApplyResult::Applied { index })) => Ok(index),
            Ok(Ok(ApplyResult::Rejected { reason, .. })) => Err(ProposeError::Rejected(reason)),
            // the node let go of the answer: raft refused the proposal
            // (no leader to forward it to), which it says at once; reported
            // as a timeout, a retry 200 ms into an election read "not
            // committed within 2s"
            Ok(Err(_)) => Err(ProposeError::Dropped),
            Err(_) => Err(ProposeError::Timeout(timeout)),
        }
    }
}

/// A Ready that takes this long to persist is logged: ringd's leases and
/// elections count in hundreds of milliseconds.
const SLOW_READY: Duration = Duration::from_millis(300);

/// How long a stopping leader waits for a voter to take its leadership over.
pub const HAND_OVER: Duration = Duration::from_secs(2);

/// The single task that owns a [`RaftCore`].
pub struct NodeTask {
    core: RaftCore,
    rx: mpsc::Receiver<NodeRequest>,
    view: watch::Sender<NodeView>,
    outbox: mpsc::Sender<Vec<Message>>,
    tick: Duration,
}

impl NodeTask {
    /// Wraps `core`; messages to send go to `outbox`.
    pub fn new(
        core: RaftCore,
        tick: Duration,
        outbox: mpsc::Sender<Vec<Message>>,
    ) -> (Self, NodeHandle) {
        let (tx, rx) = mpsc::channel(4096);
        let (view_tx, view_rx) = watch::channel(core.view());
        (
            NodeTask {
                core,
                rx,
                view: view_tx,
                outbox,
                tick,
            },
            NodeHandle { tx, view: view_rx },
        )
    }

    /// Runs until `shutdown`; a storage failure stops the node (it must not go on
    /// acknowledging what it could not persist).
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), RingError> {
        let mut ticker = tokio::time::interval(self.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_tick = std::time::Instant::now();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return self.hand_over().await,
                req = self.rx.recv() => match req {
                    Some(req) => self.handle(req),
                    None => return Ok(()),
                },
                _ = ticker.tick() => {
                    let gap = last_tick.elapsed();
                    if gap >= self.tick * 3 {
                        tracing::warn!(
                            gap_ms = gap.as_millis() as u64,
                            "raft ticks came late (ringd was not scheduled or blocked); leases and elections may suffer"
                        );
                    }
                    last_tick = std::time::Instant::now();
                    self.core.tick();
                }
            }
            // Drain what else is queued before the (fsyncing) Ready, to batch.
            for _ in 0..256 {
                match self.rx.try_recv() {
                    Ok(req) => self.handle(req),
                    Err(_) => break,
                }
            }
            self.flush()?;
        }
    }

    /// Persists and sends what raft has ready; publishes the new view.
    fn flush(&mut self) -> Result<(), RingError> {
        let outbox = &self.outbox;
        let started = std::time::Instant::now();
        self.core.handle_ready(|msgs| {
            let _ = outbox.try_send(msgs);
        })?;
        let took = started.elapsed();
        if took >= SLOW_READY {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                "persisting the raft log was slow (a loaded disk or machine); leases and elections may suffer"
            );
        }
        let view = self.core.view();
        let (leader, term, role) = (view.leader_id, view.term, view.role);
        let before = self.view.send_replace(view);
        if (before.leader_id, before.term) != (leader, term) {
            let was = before.leader_id;
            tracing::info!(leader, was, term, ?role, "raft leader changed");
        }
        self.core.answer_waiters();
        Ok(())
    }

    /// At shutdown, a leader hands its leadership over (at most
    /// [`HAND_OVER`]) before the node stops: otherwise the ring commits
    /// nothing for an election timeout and more on a loaded machine, and
    /// with another member restarting just before (a seed switch, an
    /// upgrade) the control planes' leases ran out and they fenced
    /// themselves. The transport runs until this returns.
    async fn hand_over(&mut self) -> Result<(), RingError> {
        let Some(to) = self.core.hand_over() else {
            return Ok(());
        };
        tracing::info!(to, "stopping: handing the leadership over first");
        let deadline = tokio::time::Instant::now() + HAND_OVER;
        let mut ticker = tokio::time::interval(self.tick);
        while self.core.is_leader() {
            self.flush()?;
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(to, "the leadership was not taken over within {HAND_OVER:?}; stopping anyway");
                    return Ok(());
                }
                req = self.rx.recv() => match req {
                    Some(req) => self.handle(req),
                    None => return Ok(()),
                },
                _ = ticker.tick() => self.core.tick(),
            }
        }
        self.flush()?;
        tracing::info!(
            to,
            term = self.core.view().term,
            "the leadership was taken over"
        );
        Ok(())
    }

    fn handle(&mut self, req: NodeRequest) {
        let res = match req {
            NodeRequest::Step(m) => self.core.step(m),
            NodeRequest::Propose(c, tx) => self.core.propose(c, Some(tx)),
            NodeRequest::Membership(c, tx) => self.core.propose_membership(c, Some(tx)),
            NodeRequest::Unreachable(id) => {
                self.core.report_unreachable(id);
                Ok(())
            }
            NodeRequest::SnapshotSent { to, ok } => {
                self.core.report_snapshot(to, ok);
                Ok(())
            }
        };
        match res {
            Ok(()) => {}
            Err(e @ RingError::Refused(_)) => {
                tracing::warn!(error = %e, "dropped a peer's proposal")
            }
            Err(e) => tracing::debug!(error = %e, "raft request failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::node::RaftTuning;
    use crate::storage::DiskStorage;

    fn report(rev: u64) -> RingCommand {
        RingCommand::ReportBackup {
            shoot: "s".into(),
            revision: rev,
            at_ms: rev,
            seen: None,
        }
    }

    fn view(leader_id: u64, term: u64) -> NodeView {
        NodeView {
            id: 1,
            leader_id,
            term,
            role: raft::StateRole::Follower,
            commit: 10,
            applied: 10,
            voters: vec![1, 2, 3],
            state: Default::default(),
            last_leader_contact: None,
            followed: None,
            log_entries: 0,
            snapshot_index: 0,
            lease_seen: Default::default(),
        }
    }

    /// A renewal forwarded to a leader that then died is dropped by raft
    /// without an answer: the proposer gives up as soon as that leader is
    /// lost, not after its whole timeout, but not at every other change of
    /// the view (commits, applied entries).
    #[tokio::test]
    async fn a_proposal_lost_with_its_leader_ends_when_the_leader_changes() {
        let (tx, mut requests) = mpsc::channel(4);
        let (views, view_rx) = watch::channel(view(2, 5));
        let node = NodeHandle { tx, view: view_rx };
        let mut asked = tokio::spawn(async move {
            node.propose_until_leader_changes(report(1), Duration::from_secs(3600))
                .await
        });
        // held, never answered: what a dead leader does with it
        let _dropped = requests
            .recv()
            .await
            .expect("the proposal reached the node");
        views.send_modify(|v| v.commit += 1);
        let waited = tokio::time::timeout(Duration::from_millis(300), &mut asked).await;
        assert!(
            waited.is_err(),
            "gave up on a view change of the same leader: {waited:?}"
        );
        views.send_modify(|v| {
            v.leader_id = 0;
            v.term = 6;
        });
        // an hour's timeout: anything but the leader's change would take that long
        let answer = tokio::time::timeout(Duration::from_secs(30), asked)
            .await
            .expect("still waiting after the leader was lost")
            .unwrap();
        assert_eq!(answer, Err(ProposeError::LeaderChanged));
        assert!(answer.unwrap_err().is_retryable());
    }

    /// Raft refuses a proposal at once while no leader is known (a follower
    /// has nobody to forward it to): the proposer hears so at once, as a
    /// retryable error that says why, not as "not committed within" a
    /// timeout that has not passed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_proposal_without_a_leader_is_dropped_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStorage::open(&dir.path().join("raft.redb"), &[1, 2, 3]).unwrap();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let core = RaftCore::new(1, store, &RaftTuning::default(), &logger).unwrap();
        let (outbox, _sent) = mpsc::channel(16);
        // ticks a second apart: no election starts while the test runs
        let (task, handle) = NodeTask::new(core, Duration::from_secs(1), outbox);
        let stop = CancellationToken::new();
        let node = tokio::spawn(task.run(stop.clone()));
        assert_eq!(handle.view().leader_id, 0, "a leader out of nowhere");
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            handle.propose(report(1), Duration::from_secs(60)),
        )
        .await
        .expect("a dropped proposal waited for its timeout");
        stop.cancel();
        node.await.unwrap().unwrap();
        let e = answer.unwrap_err();
        assert_eq!(e, ProposeError::Dropped);
        assert!(e.is_retryable());
        assert!(e.to_string().contains("no leader known"), "{e}");
    }

    /// A proposer that is answered finds what it proposed applied in the
    /// view, as the admin API does when it opens a migration. The node task
    /// runs on a thread of its own, as in ringd: answered before the view
    /// was published, the admin API once refused a committed migration
    /// ("committed but is not open").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answered_proposal_is_already_in_the_view() {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStorage::open(&dir.path().join("raft.redb"), &[1]).unwrap();
        let tuning = RaftTuning::default();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let core = RaftCore::new(1, store, &tuning, &logger).unwrap();
        let (outbox, _sent) = mpsc::channel(16);
        let (task, handle) = NodeTask::new(core, Duration::from_millis(5), outbox);
        let stop = CancellationToken::new();
        let s = stop.clone();
        let node = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(task.run(s))
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while handle.view().role != raft::StateRole::Leader {
            assert!(Instant::now() < deadline, "the single voter did not lead");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut late = Vec::new();
        for rev in 1..=1000 {
            let index = handle
                .propose(report(rev), Duration::from_secs(5))
                .await
                .unwrap();
            let applied = handle.view().applied;
            if applied < index {
                late.push((index, applied));
            }
        }
        stop.cancel();
        node.join().unwrap().unwrap();
        assert!(
            late.is_empty(),
            "answered before the view showed it (index, view's applied): {late:?}"
        );
    }
}
