//! The member side of ringd, level-triggered: every round it observes its
//! seed ([`observe`]), decides ([`duties::duties`], pure) and hands each duty
//! to its seed's executor ([`execute`]). Slow duties (starts, lease
//! renewals, operation steps) run as tasks, one per shoot and kind at a time;
//! fencing never waits behind them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::executor::Executor;
use crate::shared::{lock, Shared};

pub mod duties;
mod execute;
mod execute_standby;
mod observe;
mod operations;

pub use duties::{duties, Duty, Observed};

/// How often the member observes and acts.
const ROUND: Duration = Duration::from_millis(200);
/// A task that moved an operation on (facts observed, a new step done)
/// wakes the member before the round is over, but not sooner than this
/// after the round before: each step of a move waited up to two rounds for
/// the next (observe, then act), about 0.4 s a step and 3-4 s a move.
const WOKEN_GAP: Duration = Duration::from_millis(50);
/// How often data of control planes that moved away is looked at.
const RELEASE_EVERY: Duration = Duration::from_secs(5);

/// The member loop of one ringd over its seed's executor.
#[derive(Clone)]
pub struct MemberLoop {
    shared: Arc<Shared>,
    executor: Arc<dyn Executor>,
    /// Keys of duties whose task still runs.
    inflight: Arc<Mutex<BTreeSet<String>>>,
    ledger: operations::Ledger,
    /// Shoot → after a failed standby step, not before this.
    standby_retry: Arc<Mutex<std::collections::BTreeMap<String, Instant>>>,
    /// Notified by tasks whose end makes another round due at once.
    wake: Arc<Notify>,
}

impl MemberLoop {
    /// A member loop for `shared`'s member over `executor`.
    pub fn new(shared: Arc<Shared>, executor: Arc<dyn Executor>) -> Self {
        MemberLoop {
            shared,
            executor,
            inflight: Arc::default(),
            ledger: Arc::default(),
            standby_retry: Arc::default(),
            wake: Arc::default(),
        }
    }

    /// Runs until `stop`. What the seed holds from before a restart is
    /// reconciled (and shown in the status) too, not only what the ring places
    /// here now: a returning seed whose control plane moved away says so.
    pub async fn run(self, stop: CancellationToken) {
        for shoot in self.executor.shoots() {
            lock(&self.shared.hosted).entry(shoot).or_default();
        }
        let mut next_release = Instant::now();
        while pace(&stop, &self.wake, ROUND, WOKEN_GAP).await {
            let release_due = Instant::now() >= next_release;
            if release_due {
                next_release = Instant::now() + RELEASE_EVERY;
            }
            self.round(release_due).await;
        }
    }

    /// One observe → decide → act round.
    async fn round(&self, release_due: bool) {
        let state = self.shared.node().view().state;
        let observed = self.observe(&state, release_due).await;
        let now = Instant::now();
        for duty in duties(&state, self.shared.name(), &observed, now) {
            self.execute(duty, &state).await;
        }
    }

    /// Whether any start is still in flight (shutdown waits for those).
    pub fn starting(shared: &Shared) -> bool {
        lock(&shared.hosted).values().any(|h| h.starting)
    }

    /// Runs `work` as a task under `key` unless one with that key still runs.
    fn spawn_once<F>(&self, key: String, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if !lock(&self.inflight).insert(key.clone()) {
            return;
        }
        let done = InFlight(self.inflight.clone(), key);
        tokio::spawn(async move {
            let _done = done;
            work.await;
        });
    }

    fn busy(&self, key: &str) -> bool {
        lock(&self.inflight).contains(key)
    }

    /// What a task notifies to have the next round begin early.
    fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }
}

/// Waits until the next round is due: `round` after the last one, or as soon
/// as `wake` is notified (also by a task that ended during the round) but not
/// sooner than `gap` after the last one. False when `stop` is cancelled.
async fn pace(stop: &CancellationToken, wake: &Notify, round: Duration, gap: Duration) -> bool {
    let began = tokio::time::Instant::now();
    tokio::select! {
        biased;
        _ = stop.cancelled() => return false,
        _ = tokio::time::sleep(round) => return true,
        _ = wake.notified() => {}
    }
    tokio::select! {
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep_until(began + gap) => true,
    }
}

/// Removes its key from the in-flight set when the task ends, even by a panic.
struct InFlight(Arc<Mutex<BTreeSet<String>>>, String);

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUND: Duration = Duration::from_millis(200);
    const GAP: Duration = Duration::from_millis(50);

    /// Virtual time (paused): a round is due `ROUND` after the last, or
    /// `GAP` after it when a task woke the member, during the wait or before
    /// it began; a cancelled stop ends the loop.
    #[tokio::test(start_paused = true)]
    async fn a_woken_member_goes_again_after_the_gap_not_the_round() {
        let (stop, wake) = (CancellationToken::new(), Arc::new(Notify::new()));
        let t0 = tokio::time::Instant::now();
        assert!(pace(&stop, &wake, ROUND, GAP).await);
        assert_eq!(t0.elapsed(), ROUND, "not woken: a whole round");

        let t1 = tokio::time::Instant::now();
        let w = Arc::clone(&wake);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(120)).await;
            w.notify_one();
        });
        assert!(pace(&stop, &wake, ROUND, GAP).await);
        assert_eq!(
            t1.elapsed(),
            Duration::from_millis(120),
            "woken after the gap"
        );

        // a task that ended during the round left its notification
        wake.notify_one();
        let t2 = tokio::time::Instant::now();
        assert!(pace(&stop, &wake, ROUND, GAP).await);
        assert_eq!(t2.elapsed(), GAP, "woken before: the gap only");

        stop.cancel();
        assert!(!pace(&stop, &wake, ROUND, GAP).await);
    }
}
