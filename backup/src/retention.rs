//! Retention: which objects garbage collection deletes. The decision is a pure
//! function of the catalog, the policy and the time; deleting is separate.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::bucket::Bucket;
use crate::catalog::{Catalog, Entry};
use crate::config::Retention;
use crate::Result;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const WEEK: i64 = 7 * DAY;
const MONTH: i64 = 30 * DAY;

/// What garbage collection keeps and deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcPlan {
    pub keep: Vec<String>,
    pub delete: Vec<String>,
}

/// The full snapshots the policy keeps. The newest is always kept.
pub fn kept_fulls(fulls: &[Entry], policy: &Retention, now_ms: i64) -> BTreeSet<String> {
    let mut newest_first: Vec<&Entry> = fulls.iter().collect();
    newest_first.sort_by_key(|e| std::cmp::Reverse((e.first, e.time_ms)));
    let mut keep = BTreeSet::new();
    match policy {
        Retention::KeepLast { count } => {
            keep.extend(
                newest_first
                    .iter()
                    .take((*count).max(1))
                    .map(|e| e.name.clone()),
            );
        }
        Retention::Exponential => {
            let mut buckets = BTreeSet::new();
            for e in &newest_first {
                let age = now_ms - e.time_ms;
                let bucket = if age <= HOUR {
                    // every one of the last hour
                    Some((0, e.time_ms))
                } else if age <= DAY {
                    Some((1, e.time_ms.div_euclid(HOUR)))
                } else if age <= WEEK {
                    Some((2, e.time_ms.div_euclid(DAY)))
                } else if age <= MONTH {
                    Some((3, e.time_ms.div_euclid(WEEK)))
                } else {
                    None
                };
                // The newest of each bucket (we go newest first).
                if let Some(b) = bucket {
                    if buckets.insert(b) {
                        keep.insert(e.name.clone());
                    }
                }
            }
        }
    }
    if let Some(newest) = newest_first.first() {
        keep.insert(newest.name.clone());
    }
    keep
}

/// Which objects to delete: full snapshots the policy drops, deltas no kept
/// full snapshot builds on (those ending at or before the oldest kept one),
/// and superseded objects (a fenced epoch's late uploads, never restored)
/// once the history they forked from is older than the oldest kept full
/// snapshot; until then they stay as evidence. Objects that are not backups
/// are never touched.
pub fn plan(catalog: &Catalog, policy: &Retention, now_ms: i64) -> GcPlan {
    let kept = kept_fulls(&catalog.fulls, policy, now_ms);
    let oldest_kept = catalog
        .fulls
        .iter()
        .filter(|f| kept.contains(&f.name))
        .map(|f| f.first)
        .min();
    let mut out = GcPlan::default();
    for f in &catalog.fulls {
        if kept.contains(&f.name) {
            out.keep.push(f.name.clone());
        } else {
            out.delete.push(f.name.clone());
        }
    }
    for d in &catalog.deltas {
        match oldest_kept {
            Some(base) if d.last <= base => out.delete.push(d.name.clone()),
            _ => out.keep.push(d.name.clone()),
        }
    }
    for s in &catalog.superseded {
        match oldest_kept {
            Some(base) if s.from_revision < base => out.delete.push(s.entry.name.clone()),
            _ => out.keep.push(s.entry.name.clone()),
        }
    }
    out
}

/// Deletes what the plan says (unless `dry_run`); returns the plan.
pub async fn collect(
    bucket: &Bucket,
    policy: &Retention,
    now_ms: i64,
    dry_run: bool,
) -> Result<GcPlan> {
    let catalog = bucket.catalog().await?;
    let plan = plan(&catalog, policy, now_ms);
    if !dry_run {
        for name in &plan.delete {
            bucket.delete(name).await?;
        }
        if !plan.delete.is_empty() {
            tracing::info!(bucket = %bucket.describe(), deleted = plan.delete.len(), kept = plan.keep.len(), "garbage collected");
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{object_name, Kind};

    /// A synthetic timeline: a full snapshot every `every` ms over `span`,
    /// with the delta after each, ending at `now`.
    fn timeline(now: i64, span: i64, every: i64) -> Catalog {
        let mut objects = Vec::new();
        let n = span / every;
        for i in 0..=n {
            let t = now - span + i * every;
            let rev = 1000 + i * 100;
            objects.push((object_name(Kind::Full, rev, rev, t, true, false), 1));
            objects.push((
                object_name(Kind::Delta, rev + 1, rev + 99, t + 1, true, false),
                1,
            ));
        }
        Catalog::from_listing(objects)
    }

    #[test]
    fn keep_last_keeps_the_newest_and_the_deltas_after_the_oldest_kept() {
        let now = 100 * DAY;
        let c = timeline(now, 10 * HOUR, HOUR);
        let p = plan(&c, &Retention::KeepLast { count: 3 }, now);
        let kept_fulls: Vec<&String> = p.keep.iter().filter(|n| n.starts_with("full")).collect();
        assert_eq!(kept_fulls.len(), 3);
        let oldest_kept = c.fulls[c.fulls.len() - 3].first;
        for d in &c.deltas {
            let deleted = p.delete.contains(&d.name);
            assert_eq!(deleted, d.last <= oldest_kept, "{}", d.name);
        }
        assert_eq!(
            p.keep.len() + p.delete.len(),
            c.fulls.len() + c.deltas.len()
        );
    }

    #[test]
    fn exponential_thins_out_with_age() {
        let now = 100 * DAY;
        // a full snapshot every 10 minutes for 40 days
        let c = timeline(now, 40 * DAY, 10 * 60_000);
        let kept = kept_fulls(&c.fulls, &Retention::Exponential, now);
        let ages: Vec<i64> = c
            .fulls
            .iter()
            .filter(|f| kept.contains(&f.name))
            .map(|f| now - f.time_ms)
            .collect();
        let within = |lo: i64, hi: i64| ages.iter().filter(|a| **a > lo && **a <= hi).count();
        assert_eq!(
            within(-1, HOUR),
            7,
            "all of the last hour (every 10 min, both ends)"
        );
        assert!(
            (22..=24).contains(&within(HOUR, DAY)),
            "hourly for a day: {}",
            within(HOUR, DAY)
        );
        assert!(
            (6..=7).contains(&within(DAY, WEEK)),
            "daily for a week: {}",
            within(DAY, WEEK)
        );
        assert!(
            (3..=4).contains(&within(WEEK, MONTH)),
            "weekly for a month: {}",
            within(WEEK, MONTH)
        );
        assert_eq!(within(MONTH, i64::MAX), 0, "nothing older than a month");
        let p = plan(&c, &Retention::Exponential, now);
        let oldest = c
            .fulls
            .iter()
            .filter(|f| kept.contains(&f.name))
            .map(|f| f.first)
            .min()
            .unwrap();
        assert!(p.delete.iter().any(|n| n.starts_with("delta")));
        assert!(c
            .deltas
            .iter()
            .filter(|d| d.last > oldest)
            .all(|d| p.keep.contains(&d.name)));
    }

    /// A fenced epoch's late objects stay while the fork point is still in
    /// the kept history, and go once retention moved past it.
    #[test]
    fn superseded_objects_go_once_their_fork_point_is_no_longer_kept() {
        use crate::catalog::object_name_in_epoch as named;
        let now = 100 * DAY;
        let object = |epoch, kind, a, b, t| (named(epoch, kind, a, b, t, true, false), 1);
        let c = Catalog::from_listing(vec![
            object(1, Kind::Full, 100, 100, now - 3 * HOUR),
            object(1, Kind::Delta, 101, 200, now - 3 * HOUR + 1),
            object(1, Kind::Delta, 201, 260, now - 2 * HOUR),
            object(2, Kind::Full, 200, 200, now - 2 * HOUR),
            object(2, Kind::Full, 400, 400, now - HOUR),
        ]);
        assert_eq!(c.superseded.len(), 1, "{c:?}");
        let late = c.superseded[0].entry.name.clone();
        let p = plan(&c, &Retention::KeepLast { count: 2 }, now);
        assert!(p.keep.contains(&late), "epoch 2 began at 200, still kept");
        let p = plan(&c, &Retention::KeepLast { count: 1 }, now);
        assert!(p.delete.contains(&late), "only the full at 400 is kept");
    }

    #[test]
    fn the_newest_full_snapshot_is_never_deleted() {
        let now = 400 * DAY;
        let c = timeline(now - 200 * DAY, 2 * DAY, DAY);
        let p = plan(&c, &Retention::Exponential, now);
        assert_eq!(p.keep.iter().filter(|n| n.starts_with("full")).count(), 1);
        assert!(p.keep.contains(&c.fulls.last().unwrap().name));
        // deltas after the newest full stay
        assert!(p.keep.contains(&c.deltas.last().unwrap().name));
        let empty = plan(&Catalog::default(), &Retention::Exponential, now);
        assert!(empty.delete.is_empty());
    }
}
