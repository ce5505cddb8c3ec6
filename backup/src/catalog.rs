//! Object names and the catalog rebuilt from a bucket listing alone.
//!
//! Every object of a shoot lives under `<bucket prefix>/<shoot>/` with a name
//! that says what it is:
//!
//! ```text
//! full-<base revision>-<time>.<compression>[.aesgcm]
//! delta-<first revision>-<last revision>-<time>.<compression>[.aesgcm]
//!
//! full-00000000000000004711-20250614T101500123Z.zst.aesgcm
//! delta-00000000000000004712-00000000000000004790-20250614T101501123Z.zst
//! ```
//!
//! Revisions are zero-padded to 20 digits so a listing sorts by revision; the
//! time is UTC with milliseconds (a full snapshot's start, a delta's sealing).
//! Disaster recovery needs nothing but this listing.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub use crate::codec::Kind;
use crate::{BackupError, Result};

/// One object of the catalog, as its name describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The name under the shoot's prefix.
    pub name: String,
    pub kind: Kind,
    /// Full: the base revision. Delta: its first revision.
    pub first: i64,
    /// Full: the base revision. Delta: its last revision.
    pub last: i64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: i64,
    /// `zst` or `raw`.
    pub compression: String,
    pub encrypted: bool,
    /// Bytes in the bucket.
    pub size: u64,
}

/// Formats milliseconds since the epoch as `YYYYMMDDTHHMMSSmmmZ`.
pub fn format_time(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 19 || b[8] != b'T' || b[18] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<u32>().ok();
    let date = time::Date::from_calendar_date(
        num(0..4)? as i32,
        time::Month::try_from(num(4..6)? as u8).ok()?,
        num(6..8)? as u8,
    )
    .ok()?;
    let t = time::Time::from_hms_milli(
        num(9..11)? as u8,
        num(11..13)? as u8,
        num(13..15)? as u8,
        num(15..18)? as u16,
    )
    .ok()?;
    let dt = time::PrimitiveDateTime::new(date, t).assume_utc();
    Some((dt.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Parses an RFC 3339 time (`2025-06-14T10:15:00Z`) into milliseconds.
pub fn parse_rfc3339(s: &str) -> Result<i64> {
    let t =
        OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).map_err(|e| {
            BackupError::config(
                "--time",
                format!("{s:?} is not an RFC 3339 time ({e}), e.g. 2025-06-14T10:15:00Z"),
            )
        })?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// Formats milliseconds as RFC 3339 for people.
pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// The name of a new object.
pub fn object_name(
    kind: Kind,
    first: i64,
    last: i64,
    time_ms: i64,
    compressed: bool,
    encrypted: bool,
) -> String {
    let comp = if compressed { "zst" } else { "raw" };
    let enc = if encrypted { ".aesgcm" } else { "" };
    let t = format_time(time_ms);
    match kind {
        Kind::Full => format!("full-{first:020}-{t}.{comp}{enc}"),
        Kind::Delta => format!("delta-{first:020}-{last:020}-{t}.{comp}{enc}"),
    }
}

/// Parses an object name; `None` for anything that is not a backup object.
pub fn parse_name(name: &str, size: u64) -> Option<Entry> {
    let (stem, ext) = name.split_once('.')?;
    let (compression, encrypted) = match ext {
        "zst" => ("zst", false),
        "raw" => ("raw", false),
        "zst.aesgcm" => ("zst", true),
        "raw.aesgcm" => ("raw", true),
        _ => return None,
    };
    let parts: Vec<&str> = stem.split('-').collect();
    let rev = |s: &str| (s.len() == 20).then(|| s.parse::<i64>().ok()).flatten();
    let (kind, first, last, time) = match parts.as_slice() {
        ["full", r, t] => (Kind::Full, rev(r)?, rev(r)?, parse_time(t)?),
        ["delta", a, b, t] => (Kind::Delta, rev(a)?, rev(b)?, parse_time(t)?),
        _ => return None,
    };
    if first < 0 || last < first {
        return None;
    }
    Some(Entry {
        name: name.to_string(),
        kind,
        first,
        last,
        time_ms: time,
        compression: compression.into(),
        encrypted,
        size,
    })
}

/// Revisions missing between two consecutive deltas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gap {
    /// First and last missing revision.
    pub from: i64,
    pub to: i64,
    /// The object before and after the gap.
    pub after: String,
    pub before: String,
    /// The oldest full snapshot that makes revisions after the gap restorable, if any.
    pub bridged_by: Option<String>,
}

/// Everything of one shoot in the bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Catalog {
    /// Full snapshots by base revision (then time).
    pub fulls: Vec<Entry>,
    /// Deltas by first revision (then last).
    pub deltas: Vec<Entry>,
    /// Objects under the prefix that are not backup objects.
    pub unknown: Vec<String>,
}

/// What a restore aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    /// The newest revision in the bucket.
    Latest,
    /// Exactly this revision.
    Revision(i64),
}

/// What a restore downloads and applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The revision the restored etcd ends at.
    pub target_revision: i64,
    pub full: Entry,
    /// Deltas to replay, in revision order.
    pub deltas: Vec<Entry>,
    /// Revisions skipped knowingly (`--allow-gap`).
    pub gaps: Vec<(i64, i64)>,
}

impl Catalog {
    /// The catalog of a listing of `(name, size)` under a shoot's prefix.
    pub fn from_listing(objects: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut c = Catalog::default();
        for (name, size) in objects {
            match parse_name(&name, size) {
                Some(e) if e.kind == Kind::Full => c.fulls.push(e),
                Some(e) => c.deltas.push(e),
                None => c.unknown.push(name),
            }
        }
        c.fulls.sort_by_key(|e| (e.first, e.time_ms));
        c.deltas.sort_by_key(|e| (e.first, e.last, e.time_ms));
        c.unknown.sort();
        c
    }

    /// Drops the objects that are not encrypted (a bucket with a key trusts
    /// only what its key authenticates); returns their names.
    pub fn retain_encrypted(&mut self) -> Vec<String> {
        let mut dropped = Vec::new();
        for list in [&mut self.fulls, &mut self.deltas] {
            list.retain(|e| {
                if !e.encrypted {
                    dropped.push(e.name.clone());
                }
                e.encrypted
            });
        }
        dropped
    }

    /// Every object, fulls then deltas.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.fulls.iter().chain(self.deltas.iter())
    }

    /// Whether the bucket holds nothing for the shoot.
    pub fn is_empty(&self) -> bool {
        self.fulls.is_empty() && self.deltas.is_empty()
    }

    /// The newest revision any object reaches.
    pub fn latest_revision(&self) -> Option<i64> {
        self.entries().map(|e| e.last).max()
    }

    /// The newest full snapshot (by base revision).
    pub fn newest_full(&self) -> Option<&Entry> {
        self.fulls.last()
    }

    /// Gaps between consecutive deltas (after the oldest full snapshot), with
    /// the full snapshot that bridges each, if any.
    pub fn gaps(&self) -> Vec<Gap> {
        let Some(oldest) = self.fulls.first() else {
            return Vec::new();
        };
        let mut items: Vec<&Entry> = self.entries().collect();
        items.sort_by_key(|e| (e.first, e.kind, e.last));
        let mut gaps = Vec::new();
        let mut cursor = oldest.first;
        let mut after = oldest.name.clone();
        for e in items {
            if e.last <= cursor {
                continue;
            }
            // A full snapshot holds its base revision, a delta its first: either
            // continues the chain only if it starts right after the cursor.
            if e.first > cursor + 1 {
                let to = e.first - 1;
                let bridged_by = self
                    .fulls
                    .iter()
                    .find(|f| f.first >= to)
                    .map(|f| f.name.clone());
                gaps.push(Gap {
                    from: cursor + 1,
                    to,
                    after: after.clone(),
                    before: e.name.clone(),
                    bridged_by,
                });
            }
            cursor = e.last;
            after = e.name.clone();
        }
        gaps
    }

    /// What to restore for `target`: the newest full snapshot at or before it
    /// (except `excluded` ones) and the deltas after it. A gap is an error unless
    /// `allow_gap`.
    pub fn plan(&self, target: Target, allow_gap: bool, excluded: &[String]) -> Result<Plan> {
        let Some(latest) = self.latest_revision() else {
            return Err(BackupError::Catalog(
                "the bucket holds no backup of this shoot".into(),
            ));
        };
        let target_revision = match target {
            Target::Latest => latest,
            Target::Revision(r) if r > latest => {
                return Err(BackupError::Catalog(format!(
                    "revision {r} is newer than anything backed up (the newest is {latest})"
                )))
            }
            Target::Revision(r) => r,
        };
        let Some(full) = self
            .fulls
            .iter()
            .rev()
            .find(|f| f.first <= target_revision && !excluded.contains(&f.name))
        else {
            let oldest = self
                .fulls
                .iter()
                .find(|f| !excluded.contains(&f.name))
                .map_or("none".to_string(), |f| {
                    format!("{} at revision {}", f.name, f.first)
                });
            return Err(BackupError::Catalog(format!(
                "no full snapshot at or before revision {target_revision} (oldest usable: {oldest})"
            )));
        };
        let mut deltas = Vec::new();
        let mut gaps = Vec::new();
        let mut cursor = full.first;
        let mut after = full.name.clone();
        for d in &self.deltas {
            if cursor >= target_revision {
                break;
            }
            if d.last <= cursor {
                continue;
            }
            if d.first > cursor + 1 {
                let to = (d.first - 1).min(target_revision);
                if !allow_gap {
                    return Err(BackupError::Gap {
                        from: cursor + 1,
                        to,
                        detail: format!("no delta between {after} and {}", d.name),
                    });
                }
                gaps.push((cursor + 1, to));
                if d.first > target_revision {
                    break;
                }
            }
            cursor = d.last;
            after = d.name.clone();
            deltas.push(d.clone());
        }
        if cursor < target_revision {
            if !allow_gap {
                return Err(BackupError::Gap {
                    from: cursor + 1,
                    to: target_revision,
                    detail: format!("no delta after {after}"),
                });
            }
            gaps.push((cursor + 1, target_revision));
        }
        Ok(Plan {
            target_revision,
            full: full.clone(),
            deltas,
            gaps,
        })
    }

    /// The first delta sealed after `time_ms` (its events reach past it), if any.
    pub fn first_delta_after(&self, time_ms: i64) -> Option<&Entry> {
        self.deltas
            .iter()
            .filter(|d| d.time_ms > time_ms)
            .min_by_key(|d| (d.first, d.time_ms))
    }

    /// The oldest time any object records.
    pub fn oldest_time(&self) -> Option<i64> {
        self.entries().map(|e| e.time_ms).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(rev: i64) -> (String, u64) {
        (
            object_name(Kind::Full, rev, rev, 1_700_000_000_000 + rev, true, false),
            10,
        )
    }

    fn delta(a: i64, b: i64) -> (String, u64) {
        (
            object_name(Kind::Delta, a, b, 1_700_000_000_000 + b, true, true),
            10,
        )
    }

    #[test]
    fn names_round_trip_and_sort_by_revision() {
        let n = object_name(Kind::Delta, 12, 345, 1_718_360_100_123, true, true);
        assert_eq!(
            n,
            "delta-00000000000000000012-00000000000000000345-20240614T101500123Z.zst.aesgcm"
        );
        let e = parse_name(&n, 5).unwrap();
        assert_eq!(
            (e.kind, e.first, e.last, e.time_ms, e.encrypted),
            (Kind::Delta, 12, 345, 1_718_360_100_123, true)
        );
        let f = parse_name(&object_name(Kind::Full, 7, 7, 0, false, false), 1).unwrap();
        assert_eq!(
            (f.kind, f.first, f.compression.as_str(), f.encrypted),
            (Kind::Full, 7, "raw", false)
        );
        for bad in [
            "full-1-x.zst",
            "delta-00000000000000000012.zst",
            "notes.txt",
            "full-00000000000000000001-20240614T101500123Z.gz",
        ] {
            assert!(parse_name(bad, 0).is_none(), "{bad}");
        }
        assert!(
            object_name(Kind::Full, 9, 9, 0, true, false)
                < object_name(Kind::Full, 10, 10, 0, true, false)
        );
    }

    #[test]
    fn catalog_from_listing_ignores_strangers() {
        let c = Catalog::from_listing(vec![
            delta(11, 20),
            full(10),
            ("README".into(), 1),
            delta(21, 30),
        ]);
        assert_eq!(c.fulls.len(), 1);
        assert_eq!(c.deltas.len(), 2);
        assert_eq!(c.unknown, vec!["README".to_string()]);
        assert_eq!(c.latest_revision(), Some(30));
        assert!(c.gaps().is_empty());
    }

    #[test]
    fn plan_picks_newest_full_at_or_before_target_and_the_deltas_after_it() {
        let c = Catalog::from_listing(vec![
            full(10),
            delta(11, 20),
            delta(21, 30),
            full(25),
            delta(31, 40),
        ]);
        let p = c.plan(Target::Latest, false, &[]).unwrap();
        assert_eq!(p.target_revision, 40);
        assert_eq!(p.full.first, 25);
        let names: Vec<i64> = p.deltas.iter().map(|d| d.first).collect();
        assert_eq!(names, vec![21, 31], "delta 21..30 still holds 26..30");
        let p = c.plan(Target::Revision(22), false, &[]).unwrap();
        assert_eq!((p.full.first, p.deltas.len()), (10, 2));
        let p = c.plan(Target::Revision(10), false, &[]).unwrap();
        assert!(p.deltas.is_empty());
        assert!(c.plan(Target::Revision(41), false, &[]).is_err());
        assert!(c.plan(Target::Revision(9), false, &[]).is_err());
        // a full snapshot that turned out too new is excluded on the next plan
        let p = c
            .plan(Target::Revision(27), false, &[p_name(&c, 25)])
            .unwrap();
        assert_eq!(p.full.first, 10);
    }

    /// A bucket with a key plans only with encrypted objects: a planted
    /// plain full snapshot, newer than every other, is left out.
    #[test]
    fn only_encrypted_objects_are_planned_under_a_key() {
        let object = |kind, a, b, encrypted| {
            let name = object_name(kind, a, b, 1_700_000_000_000 + b, true, encrypted);
            (name, 10)
        };
        let mut c = Catalog::from_listing(vec![
            object(Kind::Full, 10, 10, true),
            object(Kind::Delta, 11, 20, true),
            object(Kind::Full, 20, 20, false),
            object(Kind::Delta, 21, 30, false),
        ]);
        assert_eq!(c.plan(Target::Latest, false, &[]).unwrap().full.first, 20);
        let dropped = c.retain_encrypted();
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        assert!(
            dropped.iter().all(|n| !n.ends_with(".aesgcm")),
            "{dropped:?}"
        );
        let p = c.plan(Target::Latest, false, &[]).unwrap();
        assert_eq!((p.full.first, p.target_revision), (10, 20));
        assert!(p.full.encrypted && p.deltas.iter().all(|d| d.encrypted));
    }

    fn p_name(c: &Catalog, rev: i64) -> String {
        c.fulls
            .iter()
            .find(|f| f.first == rev)
            .unwrap()
            .name
            .clone()
    }

    #[test]
    fn a_missing_delta_is_a_gap_unless_allowed() {
        let c = Catalog::from_listing(vec![full(10), delta(11, 20), delta(31, 40)]);
        let err = c.plan(Target::Latest, false, &[]).unwrap_err();
        match &err {
            BackupError::Gap { from, to, .. } => assert_eq!((*from, *to), (21, 30)),
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("--allow-gap"), "{err}");
        assert!(err.to_string().contains("revision 20 or earlier"), "{err}");
        assert_eq!(
            c.plan(Target::Revision(20), false, &[])
                .unwrap()
                .deltas
                .len(),
            1
        );
        let p = c.plan(Target::Latest, true, &[]).unwrap();
        assert_eq!(p.gaps, vec![(21, 30)]);
        assert_eq!(p.deltas.len(), 2);
        let gaps = c.gaps();
        assert_eq!(gaps.len(), 1);
        assert_eq!(
            (gaps[0].from, gaps[0].to, gaps[0].bridged_by.clone()),
            (21, 30, None)
        );
    }

    #[test]
    fn a_gap_bridged_by_a_newer_full_snapshot_does_not_block_later_restores() {
        // compaction during the delta stream: deltas stop at 20, a new full at 35
        let c = Catalog::from_listing(vec![full(10), delta(11, 20), full(35), delta(36, 50)]);
        let p = c.plan(Target::Latest, false, &[]).unwrap();
        assert_eq!((p.full.first, p.deltas.len()), (35, 1));
        assert!(c.plan(Target::Revision(30), false, &[]).is_err());
        let gaps = c.gaps();
        assert_eq!(gaps.len(), 1);
        assert_eq!((gaps[0].from, gaps[0].to), (21, 34));
        assert!(gaps[0]
            .bridged_by
            .as_deref()
            .unwrap()
            .starts_with("full-00000000000000000035"));
    }

    #[test]
    fn times_format_and_parse() {
        let ms = 1_718_360_100_123;
        assert_eq!(parse_time(&format_time(ms)), Some(ms));
        assert_eq!(parse_rfc3339("2024-06-14T10:15:00.123Z").unwrap(), ms);
        assert!(parse_rfc3339("yesterday").is_err());
    }
}
