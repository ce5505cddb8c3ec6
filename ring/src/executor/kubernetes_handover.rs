//! The source side of a planned migration off a Kubernetes seed: the writers'
//! workloads scaled to zero, etcd's sidecar asked for the final snapshot (a
//! full snapshot in the ring's bucket at etcd's final revision, with `HashKV`
//! and objects), and that snapshot fetched from the bucket into the shoot's
//! local dir, where the target fetches the handover from as from any seed.
//! etcd's guard lets etcd run for the snapshot only (the ring lease went to
//! the target with the migration; the writers are gone by then).

use std::time::Duration;

use migrate::handover::{self, SnapshotInfo};
use migrate::plan::SourceView;

use super::kubernetes::KubernetesExecutor;
use super::WRITERS;
use crate::backups::RingBucket;
use crate::{now_ms, RingError};

/// How long one step waits for the sidecar's final snapshot.
const WAIT: Duration = Duration::from_secs(120);
/// How long etcd's guard lets etcd run for one attempt at the final snapshot.
const WINDOW: Duration = Duration::from_secs(150);
/// How often its answer is looked for (the migration's downtime waits).
const POLL: Duration = Duration::from_millis(250);

fn handover_err(shoot: &str, message: String) -> RingError {
    RingError::Migrate(migrate::MigrateError::Handover {
        shoot: shoot.to_string(),
        message,
    })
}

/// The source's view of migration `op` (the handover files are claimed for it).
pub(super) async fn source_view(
    ex: &KubernetesExecutor,
    shoot: &str,
    op: u64,
) -> Result<SourceView, RingError> {
    let layout = ex.layout(shoot);
    handover::claim(&layout, op)?;
    let running = ex.seed().running_components(shoot).await?;
    Ok(SourceView {
        writers_running: WRITERS.iter().any(|c| running.contains(c)),
        snapshot_taken: handover::read_info(&layout).is_some(),
        etcd_running: running.contains(&seed::Component::Etcd),
        handover_recorded: false,
    })
}

/// Asks etcd's sidecar for the final snapshot of the claimed migration and
/// fetches it from the bucket into the handover files.
pub(super) async fn take_final_snapshot(
    ex: &KubernetesExecutor,
    shoot: &str,
    bucket: &RingBucket,
) -> Result<(), RingError> {
    let layout = ex.layout(shoot);
    let op = handover::claimed(&layout)
        .ok_or_else(|| handover_err(shoot, "no migration claimed the handover files".into()))?;
    // The ring lease moved to the target with the migration, so etcd's guard
    // stopped etcd at its fence time. The operation (agreed by the quorum)
    // lets etcd run again, for this step only: its writers are scaled to zero
    // and their pods gone, so it serves nothing but the snapshot; stop_etcd
    // fences it again.
    ex.guard_until(shoot, now_ms() + WINDOW.as_millis() as u64, WINDOW)
        .await?;
    let seed = ex.seed();
    seed.request_handover(shoot, op).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    let record = loop {
        match seed.handover_record(shoot, op).await? {
            Some(Ok(record)) => break record,
            Some(Err(why)) => {
                return Err(RingError::Seed(seed::SeedError::Kube {
                    shoot: shoot.to_string(),
                    message: format!("etcd's sidecar could not take the final snapshot: {why}"),
                }))
            }
            None if tokio::time::Instant::now() >= deadline => {
                return Err(RingError::Seed(seed::SeedError::Kube {
                    shoot: shoot.to_string(),
                    message: "etcd's sidecar has not taken the final snapshot yet".into(),
                }))
            }
            None => tokio::time::sleep(POLL).await,
        }
    };
    let store = backup::Bucket::open(&bucket.config, shoot, false)?;
    let path = handover::snapshot_path(&layout);
    let full = backup::restore::download_full(&store, bucket.key(), &record.full, &path)
        .await
        .map_err(|e| bucket.key_err(e))?;
    if full.base_revision != record.revision || full.db_bytes != record.db_bytes {
        return Err(handover_err(
            shoot,
            format!(
                "{} in the bucket holds revision {} ({} bytes), the sidecar recorded {} ({} bytes)",
                record.full, full.base_revision, full.db_bytes, record.revision, record.db_bytes
            ),
        ));
    }
    let info = SnapshotInfo {
        revision: record.revision,
        hash_kv: record.hash_kv,
        size: full.db_bytes,
        taken_at_ms: now_ms(),
        objects: record.objects,
    };
    handover::write_info(&layout, &info)?;
    tracing::info!(%shoot, op, revision = info.revision, "final snapshot taken by etcd's sidecar");
    Ok(())
}
