//! Restores onto a Kubernetes seed, both through etcd's init container:
//!
//! - a **failover**: the shoot's identity from the bucket into the PKI
//!   Secret, then the newest durable revision;
//! - a **planned migration**'s target: the fetched handover's PKI into the
//!   Secret, its final snapshot stored in the bucket as a full snapshot
//!   (unless the source's sidecar stored one at that revision already), then
//!   exactly the final revision, whose `HashKV` and objects on the restored
//!   data must be the source's before anything serves from it.
//!
//! The report the init container records is kept locally for the later steps.

use std::time::Duration;

use backup::restore::RestoreReport;
use migrate::handover::{self, SnapshotInfo};
use seed::Seed;

use super::kubernetes::KubernetesExecutor;
use super::{record, Objects};
use crate::backups::{download_identity, RingBucket};
use crate::RingError;

/// How long one restore step waits for the init container's report.
const WAIT: Duration = Duration::from_secs(120);
/// How often the report is looked for (it gates the failover: a lease, then
/// etcd and kube-apiserver start only after it).
const POLL: Duration = Duration::from_millis(250);

/// An error of the restore on the seed cluster (retried by the operation).
fn restore_err(shoot: &str, why: &str) -> RingError {
    RingError::Seed(seed::SeedError::Kube {
        shoot: shoot.to_string(),
        message: why.to_string(),
    })
}

/// Restores `shoot` for failover `op` through etcd's init container.
pub(super) async fn restore(
    ex: &KubernetesExecutor,
    shoot: &str,
    op: u64,
    bucket: &RingBucket,
) -> Result<RestoreReport, RingError> {
    let layout = ex.layout(shoot);
    seed::pki::create_private_dir(&layout.dir)?;
    download_identity(bucket, &layout, shoot).await?;
    let id = record::request_id(&record::path(&layout), op);
    let (report, objects, _) = restore_in_pod(ex, shoot, &id, None).await?;
    record::write(&record::path(&layout), op, &report, Some(&objects))?;
    Ok(report)
}

/// Restores the fetched handover of migration `op` through etcd's init
/// container and checks it against the source's final snapshot.
pub(super) async fn restore_handover(
    ex: &KubernetesExecutor,
    shoot: &str,
    (op, epoch): (u64, u64),
    bucket: &RingBucket,
) -> Result<(), RingError> {
    let layout = ex.layout(shoot);
    let info = handover::read_info(&layout).ok_or_else(|| {
        RingError::Migrate(migrate::MigrateError::Handover {
            shoot: shoot.to_string(),
            message: "the fetched final snapshot or its info is missing or incomplete".into(),
        })
    })?;
    store_final_snapshot(bucket, &layout, (shoot, epoch), &info).await?;
    let id = op.to_string();
    let (report, objects, hash) = restore_in_pod(ex, shoot, &id, Some(info.revision)).await?;
    check_against_source(shoot, &info, &report, &objects, hash)?;
    record::write(&record::path(&layout), op, &report, Some(&objects))?;
    Ok(())
}

/// Stores the fetched final snapshot as a full snapshot in the bucket, the
/// first object of the migration's `epoch`, unless one at its revision is
/// there already.
async fn store_final_snapshot(
    rb: &RingBucket,
    layout: &seed::ShootLayout,
    (shoot, epoch): (&str, u64),
    info: &SnapshotInfo,
) -> Result<(), RingError> {
    let bucket = backup::Bucket::open(&rb.config, shoot, false)?;
    let catalog = bucket.catalog().await?;
    let stored = catalog
        .entries()
        .any(|e| e.kind == backup::Kind::Full && e.first == info.revision);
    if stored {
        return Ok(());
    }
    let encoding = backup::full::Encoding {
        level: backup::config::Compression::default().level,
        key: rb.key().cloned(),
        epoch,
    };
    let snap = backup::full_file::FileSnapshot {
        revision: info.revision,
        keys: info.objects.values().sum::<u64>() as i64,
    };
    let path = handover::snapshot_path(layout);
    backup::full_file::store_file(&bucket, shoot, &encoding, &path, snap).await?;
    Ok(())
}

/// The restore must reach the source's final revision with its `HashKV` and
/// the same objects; anything else is a permanent error (nothing serves it).
fn check_against_source(
    shoot: &str,
    info: &SnapshotInfo,
    report: &RestoreReport,
    objects: &Objects,
    hash: Option<u32>,
) -> Result<(), RingError> {
    let mut problems = Vec::new();
    if report.reached_revision != info.revision {
        problems.push(format!(
            "the restore reached revision {}, the source's final revision is {}",
            report.reached_revision, info.revision
        ));
    }
    match hash {
        Some(h) if h == info.hash_kv => {}
        Some(h) => problems.push(format!(
            "HashKV at revision {} is {h:#x}, the source had {:#x}",
            info.revision, info.hash_kv
        )),
        None => problems.push("etcd's init container recorded no HashKV".into()),
    }
    if !info.objects.is_empty() && *objects != info.objects {
        problems.push(format!(
            "objects differ: the source had {:?}, the restore holds {objects:?}",
            info.objects
        ));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(RingError::Migrate(migrate::MigrateError::Verify {
        shoot: shoot.to_string(),
        message: problems.join("; "),
    }))
}

/// Puts the shoot's PKI (in its local dir) into the seed cluster, asks etcd's
/// init container to restore (`revision`, or the newest) for request `id`,
/// applies the control plane and restarts etcd's pod, and waits for the
/// report.
async fn restore_in_pod(
    ex: &KubernetesExecutor,
    shoot: &str,
    id: &str,
    revision: Option<i64>,
) -> Result<(RestoreReport, Objects, Option<u32>), RingError> {
    let layout = ex.layout(shoot);
    let seed = ex.seed();
    seed.seed_pki(shoot, &layout.dir.join("pki")).await?;
    // a pod from an earlier stay ran its init container already and must be
    // replaced; one that start creates now reads the request itself (deleting
    // it too would run two restores into one data dir for a moment)
    let earlier_pod = seed.etcd_pod_exists(shoot).await?;
    seed.request_restore(shoot, id, revision).await?;
    if seed.restore_report(shoot, id).await?.is_none() {
        super::started(seed.start(&seed::ControlPlaneSpec::new(shoot)).await)?;
        if earlier_pod {
            seed.restart_etcd(shoot).await?;
        }
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(r) = seed.restore_report(shoot, id).await? {
            let unreadable = |e: serde_json::Error| {
                restore_err(
                    shoot,
                    &format!("unreadable restore record in ConfigMap etcd-restore: {e}"),
                )
            };
            let report: RestoreReport = serde_json::from_str(&r.report).map_err(unreadable)?;
            let objects: Objects = serde_json::from_str(&r.objects).map_err(unreadable)?;
            tracing::info!(%shoot, request = id, revision = report.reached_revision, "restored by etcd's init container");
            for c in &report.corrupt {
                tracing::warn!(%shoot, request = id, "etcd's init container found {} is corrupt ({}) and restored from an older snapshot", c.object, c.problem);
            }
            return Ok((report, objects, r.hash_kv));
        }
        if let Some(problem) = seed.restore_problem(shoot).await? {
            return Err(restore_err(shoot, &problem));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(restore_err(
                shoot,
                "etcd's init container has not finished the restore yet",
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::record::sample_report as report;

    /// A restore onto the pods passes only at the source's final revision,
    /// with its HashKV and the same objects; each difference is named.
    #[test]
    fn a_handover_restore_must_match_the_source() {
        let objects = Objects::from([("configmaps".to_string(), 3)]);
        let info = SnapshotInfo {
            revision: 50,
            hash_kv: 0xabc,
            size: 1,
            taken_at_ms: 0,
            objects: objects.clone(),
        };
        let ok = check_against_source("m2", &info, &report(50), &objects, Some(0xabc));
        assert!(ok.is_ok(), "{ok:?}");
        let fewer = Objects::from([("configmaps".to_string(), 2)]);
        for (reached, objects, hash, says) in [
            (49, &objects, Some(0xabc), "reached revision 49"),
            (50, &objects, Some(0xabd), "HashKV at revision 50 is 0xabd"),
            (50, &objects, None, "no HashKV"),
            (50, &fewer, Some(0xabc), "objects differ"),
        ] {
            let err =
                check_against_source("m2", &info, &report(reached), objects, hash).unwrap_err();
            assert!(!err.is_retryable(), "{err}");
            assert!(err.to_string().contains(says), "{err} should say {says}");
        }
    }
}
