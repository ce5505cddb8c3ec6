//! Choosing what to restore: the newest usable full snapshot at or before
//! the target and the deltas after it (a time target becomes a revision first).

use super::{fetch_delta, RestoreOptions, RestoreState, RestoreTarget};
use crate::catalog::{Catalog, Plan, Target};
use crate::{BackupError, Result};

/// `state` as loaded to resume a restore, or a fresh start when an object
/// its plan names has left the bucket since (an operator moved a damaged
/// delta aside, or garbage collection ran): planning again from what the
/// bucket holds now beats failing on the missing object at every rerun.
pub(super) async fn still_in_bucket(
    opts: &RestoreOptions,
    state: RestoreState,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<RestoreState> {
    let Some(plan) = state.plan() else {
        return Ok(state);
    };
    let listed: std::collections::BTreeSet<String> = opts
        .bucket
        .list()
        .await?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let Some(gone) = std::iter::once(&plan.full)
        .chain(&plan.deltas)
        .find(|e| !listed.contains(&e.name))
    else {
        return Ok(state);
    };
    progress(&format!(
        "{} left the bucket since this restore was planned: planning again",
        gone.name
    ));
    tracing::warn!(object = %gone.name, "a planned object left the bucket; planning the restore again");
    Ok(RestoreState::Start {
        excluded: state.excluded().to_vec(),
    })
}

/// Chooses the objects (resolving a time target to a revision first).
pub(super) async fn plan(opts: &RestoreOptions, excluded: &[String]) -> Result<Plan> {
    let (catalog, plain) = opts.bucket.trusted_catalog(opts.key.as_ref()).await?;
    if !plain.is_empty() {
        tracing::warn!(
            objects = ?plain,
            "not encrypted although the bucket has a key: not trusted, left out of the restore"
        );
    }
    if catalog.is_empty() && !plain.is_empty() {
        return Err(BackupError::Catalog(format!(
            "{} holds no encrypted backup, only {} unencrypted objects, which a bucket with a key does not trust (restore without the key if the backup was written unencrypted)",
            opts.bucket.describe(),
            plain.len()
        )));
    }
    if catalog.is_empty() {
        return Err(BackupError::Catalog(format!(
            "{} holds no backup (is the bucket URL and shoot right?)",
            opts.bucket.describe()
        )));
    }
    let target = match opts.target {
        RestoreTarget::Latest => Target::Latest,
        RestoreTarget::Revision(r) => Target::Revision(r),
        RestoreTarget::Time(t) => Target::Revision(revision_at(opts, &catalog, t).await?),
    };
    let plan = catalog.plan(target, opts.allow_gap, excluded)?;
    if opts.key.is_none() {
        if let Some(e) = std::iter::once(&plan.full)
            .chain(&plan.deltas)
            .find(|e| e.encrypted)
        {
            return Err(BackupError::KeyRequired {
                object: e.name.clone(),
                key_id: "recorded in the object".into(),
            });
        }
    }
    Ok(plan)
}

/// The newest revision Ring had received at `time_ms`.
async fn revision_at(opts: &RestoreOptions, catalog: &Catalog, time_ms: i64) -> Result<i64> {
    if catalog.oldest_time().is_some_and(|o| time_ms < o) {
        return Err(BackupError::Catalog(format!(
            "{} is older than the oldest backup ({})",
            crate::catalog::rfc3339(time_ms),
            crate::catalog::rfc3339(catalog.oldest_time().unwrap_or(0))
        )));
    }
    let Some(d) = catalog.first_delta_after(time_ms) else {
        return catalog
            .latest_revision()
            .ok_or_else(|| BackupError::Catalog("the bucket holds no backup".into()));
    };
    let records = fetch_delta(&opts.bucket, &d.name, opts.key.as_ref())
        .await?
        .1;
    Ok(records
        .iter()
        .take_while(|r| r.time_ms <= time_ms)
        .last()
        .map_or(d.first - 1, |r| r.revision))
}
