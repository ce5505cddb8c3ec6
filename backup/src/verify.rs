//! `verify`: downloads every object of a shoot and checks it (checksum,
//! framing, decryption, decompression, etcd's own snapshot checksum, the
//! revisions a delta holds) and the chain of revisions (gaps).

use serde::{Deserialize, Serialize};

use crate::bucket::Bucket;
use crate::catalog::{Gap, Kind};
use crate::codec::EncryptionKey;
use crate::restore::{fetch_delta, read_full};
use crate::{BackupError, Result};

/// The check of one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectCheck {
    pub name: String,
    pub kind: Kind,
    pub first: i64,
    pub last: i64,
    pub size: u64,
    /// `None` when the object is sound.
    pub problem: Option<String>,
}

/// Everything `verify` found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub bucket: String,
    pub objects: Vec<ObjectCheck>,
    /// Missing revisions between objects.
    pub gaps: Vec<Gap>,
    /// Objects under the prefix that are not backups.
    pub unknown: Vec<String>,
    /// Every problem in one line each; empty when the backup is sound.
    pub problems: Vec<String>,
    /// Notes that are not problems (gaps bridged by a newer full snapshot).
    pub notes: Vec<String>,
}

impl VerifyReport {
    /// Whether nothing is wrong.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks a full snapshot object completely (streamed, nothing kept).
async fn check_full(bucket: &Bucket, name: &str, key: Option<&EncryptionKey>) -> Result<()> {
    read_full(bucket, key, name, &mut |_| Ok(()))
        .await
        .map(|_| ())
}

/// Opens every record of where an epoch began: a sound one is a note, a
/// damaged or forged one a problem.
async fn check_epoch_records(
    bucket: &Bucket,
    key: Option<&EncryptionKey>,
    catalog: &crate::catalog::Catalog,
    report: &mut VerifyReport,
) -> Result<()> {
    for b in &catalog.begins {
        match bucket.open_epoch_begin(key, b).await {
            Ok(_) => report.notes.push(format!(
                "epoch {} began at revision {} ({})",
                b.epoch, b.revision, b.name
            )),
            Err(
                e @ (BackupError::BucketUnreachable { .. } | BackupError::BucketMissing { .. }),
            ) => return Err(e),
            Err(e) => report.problems.push(format!("{}: {e}", b.name)),
        }
    }
    Ok(())
}

/// Downloads and checks every object of the shoot, then the chain.
pub async fn verify(bucket: &Bucket, key: Option<&EncryptionKey>) -> Result<VerifyReport> {
    let catalog = bucket.catalog().await?;
    let mut report = VerifyReport {
        bucket: bucket.describe(),
        unknown: catalog.unknown.clone(),
        ..Default::default()
    };
    for s in &catalog.superseded {
        report
            .notes
            .push(format!("not checked, never restored: {}", s.reason()));
    }
    if catalog.is_empty() {
        report
            .problems
            .push(format!("{} holds no backup objects", bucket.describe()));
        return Ok(report);
    }
    if catalog.fulls.is_empty() {
        report
            .problems
            .push("there is no full snapshot: the deltas cannot be restored".into());
    }
    for e in catalog.entries() {
        let result = match e.kind {
            Kind::Full => check_full(bucket, &e.name, key).await,
            Kind::Delta => fetch_delta(bucket, &e.name, key).await.map(|_| ()),
        };
        let problem = match result {
            Ok(()) => None,
            // The bucket going away is not a finding about this object.
            Err(e)
                if matches!(
                    e,
                    BackupError::BucketUnreachable { .. } | BackupError::BucketMissing { .. }
                ) =>
            {
                return Err(e)
            }
            Err(BackupError::Corrupt { problem, .. }) => Some(problem),
            Err(other) => Some(other.to_string()),
        };
        if let Some(p) = &problem {
            report.problems.push(format!("{}: {p}", e.name));
        }
        report.objects.push(ObjectCheck {
            name: e.name.clone(),
            kind: e.kind,
            first: e.first,
            last: e.last,
            size: e.size,
            problem,
        });
    }
    check_epoch_records(bucket, key, &catalog, &mut report).await?;
    report.gaps = catalog.gaps();
    for g in &report.gaps {
        match &g.bridged_by {
            Some(full) if full.starts_with("full-") && g.before == *full => report.notes.push(format!(
                "revisions {}..={} are in no delta (after {}); restores to them are impossible, later revisions restore from {full}",
                g.from, g.to, g.after
            )),
            Some(full) => report.problems.push(format!(
                "revisions {}..={} are missing between {} and {}: restores to revision {} and later need {full} or newer",
                g.from, g.to, g.after, g.before, g.from
            )),
            None => report.problems.push(format!(
                "revisions {}..={} are missing between {} and {}: nothing after revision {} can be restored (no newer full snapshot bridges the gap)",
                g.from, g.to, g.after, g.before, g.from - 1
            )),
        }
    }
    for u in &report.unknown {
        report
            .notes
            .push(format!("{u} is not a backup object (ignored)"));
    }
    Ok(report)
}
