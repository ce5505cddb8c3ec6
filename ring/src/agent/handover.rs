//! The final snapshot of a planned migration off a Kubernetes seed, taken by
//! etcd's sidecar: ringd stops the writers, then asks in the ConfigMap
//! `etcd-handover`; the sidecar stores a full snapshot in the ring's bucket at
//! etcd's final revision (the catalog's own format, so any target restores it
//! like a backup), with `HashKV` and the objects per resource at that
//! revision, and records them for ringd. A failure is recorded with its
//! reason and tried again while the request stands.

use std::collections::BTreeMap;
use std::time::Duration;

use seed::kubernetes::agent::{HandoverRecord, HANDOVER_CONFIGMAP};
use tokio_util::sync::CancellationToken;

use super::Cluster;
use crate::RingError;

/// How often the request is looked at: a migration's downtime waits for it
/// (a GET of one ConfigMap).
const POLL: Duration = Duration::from_millis(250);
/// Wait after a failed snapshot before the next try.
const RETRY: Duration = Duration::from_secs(5);

/// Answers final snapshot requests until `stop`.
pub async fn serve(cluster: Cluster, config: ::backup::BackupConfig, stop: CancellationToken) {
    loop {
        let wait = match pending(&cluster).await {
            Ok(Some(op)) => answer(&cluster, &config, op).await,
            Ok(None) => POLL,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the final snapshot request");
                POLL
            }
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The operation asked for and not answered yet.
async fn pending(cluster: &Cluster) -> Result<Option<u64>, RingError> {
    let data = cluster.configmap(HANDOVER_CONFIGMAP).await?;
    let Some(op) = data
        .get("operation")
        .and_then(|o| o.trim().parse::<u64>().ok())
    else {
        return Ok(None);
    };
    let taken = data
        .get("taken")
        .and_then(|t| serde_json::from_str::<HandoverRecord>(t).ok());
    Ok((taken.map(|t| t.operation) != Some(op)).then_some(op))
}

/// Takes and records operation `op`'s final snapshot; how long to wait next.
async fn answer(cluster: &Cluster, config: &::backup::BackupConfig, op: u64) -> Duration {
    let (data, wait) = match take(cluster, config, op).await {
        Ok(record) => match serde_json::to_string(&record) {
            Ok(json) => (
                BTreeMap::from([("taken", json), ("error", String::new())]),
                POLL,
            ),
            Err(e) => (BTreeMap::from([("error", format!("{op}: {e}"))]), RETRY),
        },
        Err(e) => {
            tracing::error!(op, error = %e, "final snapshot failed; trying again");
            (BTreeMap::from([("error", format!("{op}: {e}"))]), RETRY)
        }
    };
    if let Err(e) = cluster.patch_configmap(HANDOVER_CONFIGMAP, data).await {
        tracing::warn!(op, error = %e, "cannot record the final snapshot's outcome");
        return RETRY;
    }
    wait
}

/// How long the sidecar waits for etcd to answer before it reports a failure.
const ETCD_WAIT: Duration = Duration::from_secs(20);

/// Waits (up to [`ETCD_WAIT`]) until etcd answers. A source whose lease ran
/// out while its writers stopped had etcd fenced: ringd lets it run again for
/// the final snapshot, and its guard starts it within a second or two. An
/// error recorded meanwhile cost a round trip through ringd's retry back-off
/// (2 s each, three seen in one bootstrap).
async fn etcd_answers(config: &::backup::BackupConfig) -> Result<(), RingError> {
    let endpoint = config.etcd.endpoints.join(",");
    let deadline = tokio::time::Instant::now() + ETCD_WAIT;
    loop {
        let status = match ::backup::etcd::connect(&config.etcd).await {
            Ok(mut client) => ::backup::etcd::status(&mut client, &endpoint)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match status {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The final snapshot: a full snapshot at etcd's revision, which must not
/// move while it streams (the writers are stopped), its `HashKV` and objects;
/// written at the epoch the Lease records (the source's).
async fn take(
    cluster: &Cluster,
    config: &::backup::BackupConfig,
    op: u64,
) -> Result<HandoverRecord, RingError> {
    let epoch = cluster.lease_epoch().await?;
    etcd_answers(config).await?;
    let snap = ::backup::snapshot_once(config, epoch).await?;
    if snap.revision_after != snap.base_revision {
        return Err(RingError::Verification(format!(
            "etcd's revision moved from {} to {} while the final snapshot streamed: something still writes",
            snap.base_revision, snap.revision_after
        )));
    }
    let endpoint = config.etcd.endpoints.join(",");
    let mut client = ::backup::etcd::connect(&config.etcd).await?;
    let revision = snap.base_revision;
    let hash = ::backup::etcd::hash_kv(&mut client, &endpoint, revision).await?;
    let objects = migrate::handover::count_objects(&mut client, revision)
        .await
        .map_err(|e| {
            RingError::Verification(format!("counting objects at revision {revision}: {e}"))
        })?;
    tracing::info!(op, revision, full = %snap.name, "final snapshot stored");
    Ok(HandoverRecord {
        operation: op,
        full: snap.name,
        revision,
        hash_kv: hash.hash,
        objects,
        db_bytes: snap.db_bytes,
    })
}
