//! A failover onto a Kubernetes seed: the shoot's identity from the bucket
//! into the PKI Secret, a restore request for etcd's init container, the
//! control plane applied (etcd's pod restarted so the init container runs),
//! and the report the init container records, kept locally for the later steps.

use std::path::Path;
use std::time::Duration;

use backup::restore::RestoreReport;
use seed::Seed;

use super::kubernetes::KubernetesExecutor;
use super::Objects;
use crate::backups::{download_identity, RingBucket};
use crate::RingError;

/// How long one restore step waits for the init container's report.
const WAIT: Duration = Duration::from_secs(120);
/// How often the report is looked for.
const POLL: Duration = Duration::from_secs(1);

fn still_restoring(shoot: &str, why: &str) -> RingError {
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
    let layout = ex.shoot_layout(shoot);
    seed::pki::create_private_dir(&layout.dir)?;
    download_identity(bucket, &layout, shoot).await?;
    let pki = read_files(&layout.dir.join("pki"))?;
    let seed = ex.seed();
    seed.seed_pki(shoot, &pki).await?;
    seed.request_restore(shoot, op).await?;
    if seed.restore_report(shoot, op).await?.is_none() {
        super::started(seed.start(&seed::ControlPlaneSpec::new(shoot)).await)?;
        // a pod from an earlier stay ran its init container already
        seed.restart_etcd(shoot).await?;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some((report, objects)) = seed.restore_report(shoot, op).await? {
            let report: RestoreReport = serde_json::from_str(&report)
                .map_err(|e| still_restoring(shoot, &format!("unreadable restore report: {e}")))?;
            let record = format!(
                "{op}\n{}\n{objects}",
                serde_json::to_string(&report).unwrap_or_default()
            );
            seed::pki::write_private(&ex.restore_record_path(shoot), record.as_bytes())?;
            tracing::info!(%shoot, op, revision = report.reached_revision, "restored by etcd's init container");
            return Ok(report);
        }
        if let Some(problem) = seed.restore_problem(shoot).await? {
            return Err(still_restoring(shoot, &problem));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(still_restoring(
                shoot,
                "etcd's init container has not finished the restore yet",
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn read_files(dir: &Path) -> Result<std::collections::BTreeMap<String, Vec<u8>>, RingError> {
    let mut out = std::collections::BTreeMap::new();
    let io = |source| RingError::Io {
        what: format!("reading {}", dir.display()),
        source,
    };
    for e in std::fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        if e.path().is_file() {
            let data = std::fs::read(e.path()).map_err(io)?;
            out.insert(e.file_name().to_string_lossy().into_owned(), data);
        }
    }
    Ok(out)
}

/// The record of operation `op`'s restore: (report, objects).
pub(super) fn read_record(path: &Path, op: u64) -> Option<(RestoreReport, Objects)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if lines.next()?.trim() != op.to_string() {
        return None;
    }
    parse(lines)
}

/// The record of whichever restore was recorded last.
pub(super) fn read_any_record(path: &Path) -> Option<(RestoreReport, Objects)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    lines.next()?;
    parse(lines)
}

fn parse<'a>(mut lines: impl Iterator<Item = &'a str>) -> Option<(RestoreReport, Objects)> {
    let report = serde_json::from_str(lines.next()?).ok()?;
    let objects = serde_json::from_str(lines.next()?).ok()?;
    Some((report, objects))
}
