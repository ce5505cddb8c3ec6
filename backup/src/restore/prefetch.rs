//! The plan's deltas fetched and decoded while the full snapshot downloads,
//! so the replay finds them in memory: fetching and decoding them one after
//! the other would put every round trip on a large restore's critical path.
//!
//! Bounded: only the first deltas up to [`PREFETCH_BYTES`] of stored objects
//! are taken ahead; the replay fetches the rest as before.

use std::time::Instant;

use futures::{StreamExt, TryStreamExt};

use super::replay::Delta;
use super::{fetch_delta, RestoreOptions};
use crate::catalog::{Entry, Plan};
use crate::Result;

/// Stored bytes of deltas fetched ahead at most (decoded, they take a few
/// times that in memory).
pub(super) const PREFETCH_BYTES: u64 = 256 << 20;

/// Deltas fetched at once.
const CONCURRENCY: usize = 2;

/// Deltas being fetched for one plan.
pub(super) struct Prefetch {
    /// Every delta of the plan, in order.
    plan: Vec<String>,
    /// How many of them are fetched ahead.
    ahead: usize,
    task: Option<tokio::task::JoinHandle<Result<Vec<Delta>>>>,
    started: Instant,
}

/// What a prefetch brought.
pub(super) struct Prefetched {
    /// The plan's first deltas, in order.
    pub deltas: Vec<Delta>,
    /// The plan's deltas after them, for the replay to fetch.
    pub rest: Vec<Entry>,
    /// From the start of the prefetch until its last delta was decoded.
    pub seconds: f64,
}

/// How many of `deltas` (in order) fit in `budget` stored bytes; at least one.
pub(super) fn ahead_within(deltas: &[Entry], budget: u64) -> usize {
    let mut total = 0u64;
    let fit = deltas
        .iter()
        .take_while(|d| {
            total = total.saturating_add(d.size);
            total <= budget
        })
        .count();
    fit.max(deltas.len().min(1))
}

impl Prefetch {
    /// Starts fetching `plan`'s first deltas (none: nothing to do).
    pub(super) fn start(opts: &RestoreOptions, plan: &Plan) -> Option<Self> {
        let ahead = ahead_within(&plan.deltas, PREFETCH_BYTES);
        if ahead == 0 {
            return None;
        }
        let names: Vec<String> = plan.deltas[..ahead]
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let (bucket, key) = (opts.bucket.clone(), opts.key.clone());
        let task = tokio::spawn(async move {
            futures::stream::iter(names)
                .map(|name| {
                    let (bucket, key) = (bucket.clone(), key.clone());
                    async move {
                        let fetched = fetch_delta(&bucket, &name, key.as_ref()).await?;
                        Ok((name, fetched))
                    }
                })
                .buffered(CONCURRENCY)
                .try_collect()
                .await
        });
        Some(Prefetch {
            plan: plan.deltas.iter().map(|d| d.name.clone()).collect(),
            ahead,
            task: Some(task),
            started: Instant::now(),
        })
    }

    /// Whether it fetches for `plan` (a plan made again after a damaged full
    /// snapshot has other deltas).
    pub(super) fn is_for(&self, plan: &Plan) -> bool {
        self.plan.len() == plan.deltas.len()
            && self
                .plan
                .iter()
                .zip(&plan.deltas)
                .all(|(a, b)| *a == b.name)
    }

    /// Waits for the deltas fetched ahead; the first failure is the error.
    pub(super) async fn take(mut self, plan: &Plan) -> Result<Prefetched> {
        let task = self.task.take();
        let deltas = match task {
            Some(task) => task.await.map_err(|e| crate::BackupError::Io {
                what: "fetching deltas ahead of the replay".into(),
                source: std::io::Error::other(e.to_string()),
            })??,
            None => Vec::new(),
        };
        Ok(Prefetched {
            rest: plan.deltas[deltas.len().min(self.ahead)..].to_vec(),
            deltas,
            seconds: self.started.elapsed().as_secs_f64(),
        })
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Kind;

    fn delta(size: u64) -> Entry {
        Entry {
            name: format!("d{size}"),
            kind: Kind::Delta,
            first: 1,
            last: 1,
            time_ms: 0,
            compression: "zst".into(),
            encrypted: false,
            size,
            epoch: 0,
        }
    }

    #[test]
    fn deltas_are_taken_ahead_within_the_budget() {
        let cases: &[(&[u64], u64, usize)] = &[
            (&[], 100, 0),
            (&[10, 20, 30], 100, 3),
            (&[10, 20, 30], 60, 3),
            (&[10, 20, 30], 59, 2),
            (&[10, 20, 30], 10, 1),
            // one delta larger than the budget is still fetched ahead
            (&[500, 20], 100, 1),
        ];
        for (sizes, budget, want) in cases {
            let deltas: Vec<Entry> = sizes.iter().map(|s| delta(*s)).collect();
            assert_eq!(
                ahead_within(&deltas, *budget),
                *want,
                "{sizes:?} within {budget}"
            );
        }
    }
}
