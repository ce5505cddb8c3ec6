//! A failover onto a Kubernetes seed: the shoot's identity from the bucket
//! into the PKI Secret, a restore request for etcd's init container, the
//! control plane applied (etcd's pod restarted so the init container runs),
//! and the report the init container records, kept locally for the later steps.

use std::time::Duration;

use backup::restore::RestoreReport;
use seed::Seed;

use super::kubernetes::KubernetesExecutor;
use super::{record, Objects};
use crate::backups::{download_identity, RingBucket};
use crate::RingError;

/// How long one restore step waits for the init container's report.
const WAIT: Duration = Duration::from_secs(120);
/// How often the report is looked for.
const POLL: Duration = Duration::from_secs(1);

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
    let seed = ex.seed();
    seed.seed_pki(shoot, &layout.dir.join("pki")).await?;
    seed.request_restore(shoot, op).await?;
    if seed.restore_report(shoot, op).await?.is_none() {
        super::started(seed.start(&seed::ControlPlaneSpec::new(shoot)).await)?;
        // a pod from an earlier stay ran its init container already
        seed.restart_etcd(shoot).await?;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some((report, objects)) = seed.restore_report(shoot, op).await? {
            let unreadable = |e: serde_json::Error| {
                restore_err(
                    shoot,
                    &format!("unreadable restore record in ConfigMap etcd-restore: {e}"),
                )
            };
            let report: RestoreReport = serde_json::from_str(&report).map_err(unreadable)?;
            let objects: Objects = serde_json::from_str(&objects).map_err(unreadable)?;
            record::write(&record::path(&layout), op, &report, Some(&objects))?;
            tracing::info!(%shoot, op, revision = report.reached_revision, "restored by etcd's init container");
            return Ok(report);
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
