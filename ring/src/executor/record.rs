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

/// Where a discarded record is kept (it names its operation, so a restore
/// of that operation again gets a request of its own: see [`request_id`]).
fn discarded_path(path: &Path) -> PathBuf {
    path.with_extension("discarded")
}

/// Discards operation `op`'s record: its restore is not used (the bucket
/// moved on after it); the operation restores again.
pub fn discard(path: &Path, op: u64) -> Result<(), RingError> {
    if read(path, Some(op)).is_none() {
        return Ok(());
    }
    let aside = discarded_path(path);
    std::fs::rename(path, &aside).map_err(|source| RingError::Io {
        what: format!("moving {} to {}", path.display(), aside.display()),
        source,
    })
}

/// The name of operation `op`'s restore request to a seed that keeps
/// requests and answers (a Kubernetes seed's init container): `op`, or
/// `op.1` once a restore of `op` was discarded.
pub fn request_id(path: &Path, op: u64) -> String {
    match read(&discarded_path(path), Some(op)) {
        Some(_) => format!("{op}.1"),
        None => op.to_string(),
    }
}

/// Removes the record and any discarded one (the operation finished).
pub fn clear(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(discarded_path(path));
}

/// A verified restore report that reached `reached` (for tests).
#[cfg(test)]
pub(super) fn sample_report(reached: i64) -> RestoreReport {
    serde_json::from_value(serde_json::json!({
        "dataDir": "/var/lib/etcd/data", "targetRevision": reached,
        "reachedRevision": reached, "full": "full-1", "fullRevision": reached,
        "deltas": 0, "revisionsReplayed": 0, "eventsReplayed": 0, "replaySeconds": 0.0,
        "expectedKeys": 3, "keys": 3, "hashKv": "not recorded", "gaps": [],
        "verified": true, "totalSeconds": 0.0,
    }))
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::sample_report as report;
    use super::*;

    #[test]
    fn a_discarded_restore_is_not_read_and_its_operation_asks_anew() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("failover-restored");
        assert_eq!(request_id(&path, 7), "7");
        write(&path, 7, &report(40), None).unwrap();
        assert_eq!(read(&path, Some(7)).unwrap().0.reached_revision, 40);
        // another operation's discard leaves this one alone
        discard(&path, 8).unwrap();
        assert!(read(&path, Some(7)).is_some());
        assert_eq!(request_id(&path, 7), "7");
        discard(&path, 7).unwrap();
        assert!(read(&path, Some(7)).is_none(), "discarded");
        assert_eq!(request_id(&path, 7), "7.1");
        assert_eq!(
            request_id(&path, 9),
            "9",
            "only for the discarded operation"
        );
        write(&path, 7, &report(52), None).unwrap();
        assert_eq!(read(&path, Some(7)).unwrap().0.reached_revision, 52);
        assert_eq!(request_id(&path, 7), "7.1", "still its own request");
        clear(&path);
        assert!(read(&path, None).is_none());
        assert_eq!(request_id(&path, 7), "7");
    }
}
