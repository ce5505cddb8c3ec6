//! The delta loop of a backup: watch etcd from the chain's next revision,
//! seal deltas on size or period, start scheduled full snapshots.

use super::*;

/// The delta loop's working state.
struct Recording {
    endpoint: String,
    /// Where the loop started.
    start: Chain,
    lease_client: Client,
    hash_client: Client,
    batch: Batch,
    full_task: Option<tokio::task::JoinHandle<Result<FullSnapshot>>>,
    next_full_attempt_ms: i64,
    full_backoff: Backoff,
    /// The newest revision etcd reported.
    etcd_revision: i64,
}

impl Recording {
    fn new(backup: &Backup, client: &Client, start: Chain) -> Self {
        let schedule = &backup.config.schedule;
        Recording {
            endpoint: backup.endpoint(),
            start,
            lease_client: client.clone(),
            hash_client: client.clone(),
            batch: Batch::default(),
            full_task: None,
            next_full_attempt_ms: 0,
            full_backoff: Backoff::new(
                Duration::from_secs(1),
                Duration::from_millis(schedule.max_backoff_ms).max(Duration::from_secs(1)),
            ),
            etcd_revision: start.next_revision - 1,
        }
    }
}

impl Backup {
    /// The delta loop: watch etcd from the chain's next revision, seal deltas
    /// on size or period, start scheduled full snapshots, until shutdown or
    /// an error; what was received is sealed before returning.
    pub(super) async fn record(
        &self,
        client: &Client,
        chain: &mut Option<Chain>,
        shutdown: &CancellationToken,
    ) -> Result<()> {
        let Some(start) = *chain else {
            return Ok(());
        };
        let mut rec = Recording::new(self, client, start);
        let mut stream = self
            .open_watch(client, &rec.endpoint, start.next_revision)
            .await?;
        let mut tick =
            tokio::time::interval(Duration::from_millis(self.config.schedule.delta_period_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome: Result<()> = loop {
            let room = self.spool.has_room(rec.batch.bytes());
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break Ok(()),
                joined = async {
                    match rec.full_task.as_mut() {
                        Some(t) => t.await,
                        None => std::future::pending().await,
                    }
                }, if rec.full_task.is_some() => {
                    rec.full_task = None;
                    self.full_finished(&mut rec, chain, joined).await;
                    Ok(())
                }
                msg = stream.message(), if room => self.watched(&mut rec, chain, msg).await,
                _ = self.spool.popped(), if !room => Ok(()),
                _ = tick.tick() => self.on_tick(&mut rec, chain, client).await,
            };
            if let Err(e) = step {
                break Err(e);
            }
        };
        self.finish_recording(rec, chain, shutdown).await;
        outcome
    }

    /// Opens the watch of every key from `from` (with progress notifications).
    async fn open_watch(
        &self,
        client: &Client,
        endpoint: &str,
        from: i64,
    ) -> Result<etcd_client::WatchStream> {
        let mut watch_client = client.watch_client().max_decoding_message_size(512 << 20);
        let options = WatchOptions::new()
            .with_all_keys()
            .with_start_revision(from)
            .with_progress_notify();
        etcd::call(
            endpoint,
            "watch",
            watch_client.watch(vec![0u8], Some(options)),
        )
        .await
    }

    /// A scheduled full snapshot ended: on success the chain restarts from it,
    /// on failure the next attempt waits (deltas continue meanwhile).
    async fn full_finished(
        &self,
        rec: &mut Recording,
        chain: &mut Option<Chain>,
        joined: std::result::Result<Result<FullSnapshot>, tokio::task::JoinError>,
    ) {
        match joined {
            Ok(Ok(snap)) => {
                self.full_stored(&snap).await;
                rec.full_backoff.reset();
                if let Some(c) = chain.as_mut() {
                    c.last_full_ms = snap.time_ms;
                    c.delta_bytes = 0;
                    c.last_full_revision = snap.base_revision;
                }
            }
            Ok(Err(e)) => {
                self.metrics.upload_failed("full");
                let d = rec.full_backoff.next_delay();
                rec.next_full_attempt_ms = now_ms() + d.as_millis() as i64;
                tracing::warn!(shoot = %self.config.shoot, error = %e, retry_in = ?d, "scheduled full snapshot failed; deltas continue");
            }
            Err(e) => tracing::error!(error = %e, "full snapshot task failed"),
        }
    }

    /// One watch message: its events join the batch (with their leases'
    /// TTLs); a full batch is sealed. A cancelled watch is an error (a
    /// compaction says so, and a new full snapshot follows).
    async fn watched(
        &self,
        rec: &mut Recording,
        chain: &mut Option<Chain>,
        msg: std::result::Result<Option<etcd_client::WatchResponse>, etcd_client::Error>,
    ) -> Result<()> {
        let endpoint = rec.endpoint.clone();
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => return Err(etcd::err(&endpoint, "watch", "the stream ended")),
            Err(e) => return Err(etcd::err(&endpoint, "watch", e)),
        };
        if resp.canceled() {
            let next = chain.map_or(rec.start.next_revision, |c| c.next_revision);
            let requested = next.max(rec.batch.last_revision().unwrap_or(0) + 1);
            return Err(watch_cancelled(
                &endpoint,
                requested,
                resp.compact_revision(),
                resp.cancel_reason(),
            ));
        }
        if let Some(h) = resp.header() {
            rec.etcd_revision = rec.etcd_revision.max(h.revision());
            // published at once, not at the next delta: whoever follows the
            // backup learns how far etcd got beyond what is durable
            let seen = rec.etcd_revision;
            self.progress.send_if_modified(|p| {
                let newer = p.etcd_revision < seen;
                p.etcd_revision = p.etcd_revision.max(seen);
                newer
            });
        }
        let events = resp.events();
        if events.is_empty() {
            return Ok(());
        }
        let new_leases = rec.batch.add(events, now_ms())?;
        self.metrics.events(events.len() as u64);
        for lease in new_leases {
            let ttl = etcd::call(
                &endpoint,
                "lease TTL",
                rec.lease_client.lease_time_to_live(lease, None),
            )
            .await
            .map_or(0, |r| r.granted_ttl());
            rec.batch.set_lease_ttl(lease, ttl);
        }
        if rec.batch.bytes() >= self.config.schedule.delta_max_bytes {
            self.seal(&mut rec.batch, chain, &mut rec.hash_client)
                .await?;
        }
        Ok(())
    }

    /// The delta period: seal what was received, start a full snapshot when
    /// one is due, update the metrics and progress.
    async fn on_tick(
        &self,
        rec: &mut Recording,
        chain: &mut Option<Chain>,
        client: &Client,
    ) -> Result<()> {
        self.seal(&mut rec.batch, chain, &mut rec.hash_client)
            .await?;
        let now = now_ms();
        let due = chain.as_ref().is_some_and(|c| self.full_due(c, now));
        if due && rec.full_task.is_none() && now >= rec.next_full_attempt_ms {
            let (client, endpoint, bucket, shoot, encoding) = (
                client.clone(),
                rec.endpoint.clone(),
                self.bucket.clone(),
                self.config.shoot.clone(),
                self.encoding.clone(),
            );
            // inside the cycle's span, like the first full snapshot
            rec.full_task = Some(tokio::spawn(
                async move { full::take(&client, &endpoint, &bucket, &shoot, &encoding).await }
                    .in_current_span(),
            ));
        }
        let stats = self.spool.stats();
        self.metrics
            .pending(stats.objects, stats.bytes, stats.on_disk);
        let oldest = self
            .spool
            .oldest_pending_ms()
            .into_iter()
            .chain(rec.batch.oldest_ms)
            .min();
        self.metrics.lag(rec.etcd_revision, oldest, now);
        let etcd_revision = rec.etcd_revision;
        self.progress.send_modify(|p| {
            p.etcd_revision = etcd_revision;
            p.pending = stats.objects;
        });
        Ok(())
    }

    /// Whether the schedule asks for a new full snapshot of the chain.
    fn full_due(&self, c: &Chain, now: i64) -> bool {
        let schedule = &self.config.schedule;
        now - c.last_full_ms >= (schedule.full_interval_secs as i64) * 1000
            || c.delta_bytes >= schedule.full_after_delta_bytes
            || (schedule.full_after_revisions > 0
                && c.next_revision - 1 - c.last_full_revision
                    >= schedule.full_after_revisions as i64)
    }

    /// Seals what was received (complete revisions: keep it) and lets a full
    /// snapshot in flight finish, unless shutting down.
    async fn finish_recording(
        &self,
        mut rec: Recording,
        chain: &mut Option<Chain>,
        shutdown: &CancellationToken,
    ) {
        if let Err(e) = self.seal(&mut rec.batch, chain, &mut rec.hash_client).await {
            tracing::error!(shoot = %self.config.shoot, error = %e, "cannot seal the last delta");
        }
        if let Some(task) = rec.full_task {
            if shutdown.is_cancelled() {
                task.abort();
            } else if let Ok(Ok(snap)) = task.await {
                self.full_stored(&snap).await;
            }
        }
    }
}

/// Why etcd cancelled a watch that wanted `requested` on: its typed
/// `compact_revision` field says a compaction (a new full snapshot follows,
/// not a retry); any other cancel is an etcd error, retried.
fn watch_cancelled(
    endpoint: &str,
    requested: i64,
    compact_revision: i64,
    reason: &str,
) -> BackupError {
    if compact_revision > 0 {
        BackupError::Compacted {
            requested,
            compacted: compact_revision,
        }
    } else {
        etcd::err(endpoint, "watch", format!("cancelled by etcd: {reason}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_watch_is_a_compaction_only_by_its_compact_revision() {
        let err = watch_cancelled("e", 12, 30, "");
        assert!(
            matches!(
                err,
                BackupError::Compacted {
                    requested: 12,
                    compacted: 30
                }
            ),
            "{err}"
        );
        assert!(
            !err.is_retryable(),
            "a compaction is not retried: a full snapshot follows"
        );
        // the reason's words do not make a compaction
        let err = watch_cancelled("e", 12, 0, "mvcc: required revision has been compacted");
        assert!(matches!(err, BackupError::Etcd { .. }), "{err}");
        assert!(err.is_retryable());
    }
}
