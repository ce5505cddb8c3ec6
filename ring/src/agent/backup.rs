//! The backup sidecar: the same full + delta backup ringd runs for local seeds
//! (`backup::Backup`, same objects, catalog and encryption), here next to the
//! pod's etcd. It uploads only while the Lease is valid and stops at the fence
//! time; it does not depend on ringd, so a ringd restart leaves no gap. Its
//! progress goes to the ConfigMap `backup-status`, where ringd reads it. It
//! also answers a migration's request for the final snapshot ([`super::handover`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use seed::kubernetes::agent::BACKUP_STATUS;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{guard, Cluster};
use crate::{now_ms, RingError};

/// Wait after a failed run before the next one.
const RETRY: Duration = Duration::from_secs(5);
/// How often a running backup checks the Lease's epoch.
const EPOCH_POLL: Duration = Duration::from_secs(2);

/// Runs backups with `config` and deltas spooled in `spool_dir`, while the
/// lease read from `lease` holds, until `stop`. Progress goes to `cluster`
/// when its API answers; uploads do not wait for it.
pub async fn run(
    cluster: Cluster,
    lease: super::LeaseSource,
    mut config: ::backup::BackupConfig,
    spool_dir: PathBuf,
    stop: CancellationToken,
) -> Result<(), RingError> {
    config.spool.dir = Some(spool_dir);
    let handover = stop.child_token();
    tokio::spawn(super::handover::serve(
        cluster.clone(),
        config.clone(),
        handover.clone(),
    ));
    let _stop_handover = handover.drop_guard();
    let source = lease.clone();
    let (mut lease, _stop_reader) = super::follow_lease(lease, Duration::from_millis(500), &stop);
    loop {
        if !wait_for_lease(&mut lease, &stop).await {
            return Ok(());
        }
        let epoch = match source.epoch(&cluster).await {
            Ok(epoch) => epoch,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the lease's epoch; trying again");
                if !sleep_or_stop(RETRY, &stop).await {
                    return Ok(());
                }
                continue;
            }
        };
        tracing::info!(shoot = %config.shoot, epoch, "lease valid: backing up");
        let runner = ::backup::Backup::new(config.clone())?.with_epoch(epoch);
        let run = stop.child_token();
        let reporter = tokio::spawn(report(cluster.clone(), runner.progress(), run.clone()));
        let fence = tokio::spawn(cancel_at_fence(lease.clone(), run.clone()));
        let new_epoch = tokio::spawn(cancel_on_new_epoch(
            source.clone(),
            cluster.clone(),
            epoch,
            run.clone(),
        ));
        let res = runner.run(run.clone()).await;
        run.cancel();
        let _ = (reporter.await, fence.await, new_epoch.await);
        if let Err(e) = res {
            tracing::error!(error = %e, "backup stopped; retrying");
            let data = BTreeMap::from([("error", e.to_string())]);
            let _ = cluster.patch_configmap(BACKUP_STATUS, data).await;
            if !sleep_or_stop(RETRY, &stop).await {
                return Ok(());
            }
        } else if !stop.is_cancelled() {
            tracing::warn!("lease lapsed: backups stopped until it is renewed");
        }
        if stop.is_cancelled() {
            return Ok(());
        }
    }
}

/// Sleeps `d`; false when `stop` came first.
async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Cancels `run` once the Lease records an epoch other than `epoch` (the
/// shoot came back to this seed under a new one): the next run writes at it.
async fn cancel_on_new_epoch(
    source: super::LeaseSource,
    cluster: Cluster,
    epoch: u64,
    run: CancellationToken,
) {
    loop {
        if !sleep_or_stop(EPOCH_POLL, &run).await {
            return;
        }
        match source.epoch(&cluster).await {
            Ok(now) if now != epoch => {
                tracing::info!(
                    epoch,
                    now,
                    "the lease's epoch changed: backups restart at it"
                );
                run.cancel();
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the lease's epoch"),
        }
    }
}

/// Waits until the lease is valid (true) or `stop` (false).
async fn wait_for_lease(lease: &mut watch::Receiver<u64>, stop: &CancellationToken) -> bool {
    loop {
        if now_ms() < *lease.borrow_and_update() {
            return true;
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return false,
            _ = lease.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Cancels `run` at the lease's fence time (by this pod's clock).
async fn cancel_at_fence(mut lease: watch::Receiver<u64>, run: CancellationToken) {
    loop {
        let (fence_at, now) = (*lease.borrow_and_update(), now_ms());
        if now >= fence_at {
            run.cancel();
            return;
        }
        tokio::select! {
            biased;
            _ = run.cancelled() => return,
            _ = lease.changed() => {}
            _ = tokio::time::sleep(guard::sleep_for(fence_at, now, true)) => {}
        }
    }
}

/// Records each new durable revision, and the revision etcd was seen at, in
/// `backup-status`, at most once a second (ringd reads both: the durable one
/// for the ring's backup pointer, the other for what a failover may lose).
async fn report(
    cluster: Cluster,
    mut progress: watch::Receiver<::backup::Progress>,
    run: CancellationToken,
) {
    let mut last = (0, 0);
    loop {
        tokio::select! {
            biased;
            _ = run.cancelled() => return,
            r = progress.changed() => if r.is_err() { return },
        }
        let p = progress.borrow_and_update().clone();
        if (p.durable_revision, p.etcd_revision) == last || p.durable_revision == 0 {
            continue;
        }
        let data = BTreeMap::from([
            ("revision", p.durable_revision.to_string()),
            ("atMs", p.durable_at_ms.to_string()),
            ("etcdRevision", p.etcd_revision.to_string()),
            ("error", String::new()),
        ]);
        match cluster.patch_configmap(BACKUP_STATUS, data).await {
            Ok(()) => last = (p.durable_revision, p.etcd_revision),
            Err(e) => tracing::warn!(error = %e, "cannot record backup progress"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
