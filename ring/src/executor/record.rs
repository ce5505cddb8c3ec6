//! The record of a restore (a failover's, or a migration's onto a Kubernetes
//! seed) in the shoot's dir on the target seed
//! (`failover-restored`): the operation, the restore's report and, where the
//! seed counted them at restore time, the objects per resource. The later
//! steps of the operation (and a restarted ringd) read it back.

use std::path::{Path, PathBuf};

use backup::restore::RestoreReport;
use seed::ShootLayout;

use super::Objects;
use crate::RingError;

/// Where the record of `layout`'s shoot is kept.
pub fn path(layout: &ShootLayout) -> PathBuf {
    layout.dir.join("failover-restored")
}

/// Records operation `op`'s restore (file 0600).
pub fn write(
    path: &Path,
    op: u64,
    report: &RestoreReport,
    objects: Option<&Objects>,
) -> Result<(), RingError> {
    let encode = |e: serde_json::Error| RingError::Encode(e.to_string());
    let mut text = format!("{op}\n{}", serde_json::to_string(report).map_err(encode)?);
    if let Some(o) = objects {
        text.push('\n');
        text.push_str(&serde_json::to_string(o).map_err(encode)?);
    }
    Ok(seed::pki::write_private(path, text.as_bytes())?)
}

/// The recorded restore of operation `op` (of whichever operation, with
/// `None`): its report and the objects, if counted.
pub fn read(path: &Path, op: Option<u64>) -> Option<(RestoreReport, Option<Objects>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let recorded = lines.next()?.trim();
    if op.is_some_and(|op| recorded != op.to_string()) {
        return None;
    }
    let report = serde_json::from_str(lines.next()?).ok()?;
    let objects = match lines.next() {
        Some(line) => Some(serde_json::from_str(line).ok()?),
        None => None,
    };
    Some((report, objects))
}
