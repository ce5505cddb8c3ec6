//! The member side of ringd, level-triggered: every round it observes its
//! seed ([`observe`]), decides ([`duties::duties`], pure) and hands each duty
//! to its seed's executor ([`execute`]). Slow duties (starts, lease
//! renewals, operation steps) run as tasks, one per shoot and kind at a time;
//! fencing never waits behind them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::executor::Executor;
use crate::quorum::pause;
use crate::shared::{lock, Shared};

pub mod duties;
mod execute;
mod execute_standby;
mod observe;
mod operations;

pub use duties::{duties, Duty, Observed};

/// How often the member observes and acts.
const ROUND: Duration = Duration::from_millis(200);
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
        while pause(&stop, ROUND).await {
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
}

/// Removes its key from the in-flight set when the task ends, even by a panic.
struct InFlight(Arc<Mutex<BTreeSet<String>>>, String);

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}
