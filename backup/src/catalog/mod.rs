//! Object names and the catalog rebuilt from a bucket listing alone.
//!
//! Every object of a shoot lives under `<bucket prefix>/<shoot>/` with a name
//! that says what it is:
//!
//! ```text
//! full-<base revision>-<time>[-e<epoch>].<compression>[.aesgcm]
//! delta-<first revision>-<last revision>-<time>[-e<epoch>].<compression>[.aesgcm]
//! begin-<revision>-e<epoch>.json[.aesgcm]
//!
//! full-00000000000000004711-20250614T101500123Z-e3.zst.aesgcm
//! delta-00000000000000004712-00000000000000004790-20250614T101501123Z-e3.zst
//! ```
//!
//! Revisions are zero-padded to 20 digits so a listing sorts by revision; the
//! time is UTC with milliseconds (a full snapshot's start, a delta's sealing).
//! The epoch is the ring's placement epoch of the host that wrote the object
//! (none for backups outside a ring, and for objects of older Rings); a
//! sealed object's header repeats it, authenticated. Each epoch's history
//! begins where the `begin` record its host wrote before serving says (see
//! `begin.rs`), else where its first object begins, and an older epoch's
//! objects past that point are a fenced host's late uploads: the catalog
//! sets them aside (see `lineage.rs`). Disaster recovery needs nothing but
//! this listing.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

mod begin;
mod lineage;
pub use begin::{begin_name, parse_begin, EpochBegin, EpochBeginBody};
pub use lineage::Superseded;

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
    /// The ring epoch of the host that wrote it (0: not recorded).
    #[serde(default)]
    pub epoch: u64,
}

impl Entry {
    /// The revision this object's history continues from: a full snapshot's
    /// base, the revision before a delta's first.
    pub fn start(&self) -> i64 {
        match self.kind {
            Kind::Full => self.first,
            Kind::Delta => self.first - 1,
        }
    }
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

/// The name of a new object written outside a ring (no epoch).
pub fn object_name(
    kind: Kind,
    first: i64,
    last: i64,
    time_ms: i64,
    compressed: bool,
    encrypted: bool,
) -> String {
    object_name_in_epoch(0, kind, first, last, time_ms, compressed, encrypted)
}

/// The name of a new object written by the host of ring epoch `epoch` (0:
/// none, the name then carries no epoch).
pub fn object_name_in_epoch(
    epoch: u64,
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
    let e = if epoch > 0 {
        format!("-e{epoch}")
    } else {
        String::new()
    };
    match kind {
        Kind::Full => format!("full-{first:020}-{t}{e}.{comp}{enc}"),
        Kind::Delta => format!("delta-{first:020}-{last:020}-{t}{e}.{comp}{enc}"),
    }
}

/// The epoch part of a name (`e` and digits, not 0).
pub(crate) fn parse_epoch(s: &str) -> Option<u64> {
    let digits = s.strip_prefix('e')?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
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
    let mut parts: Vec<&str> = stem.split('-').collect();
    // an epoch, if any, is the last part (no other part starts with `e`)
    let epoch = match parts.last() {
        Some(e) if e.starts_with('e') => {
            let epoch = parse_epoch(e)?;
            parts.pop();
            epoch
        }
        _ => 0,
    };
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
        epoch,
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
    /// Objects an older epoch wrote past where a newer epoch began (a fenced
    /// host's late uploads): never restored, never resumed from.
    #[serde(default)]
    pub superseded: Vec<Superseded>,
    /// Where epochs began, as their hosts recorded it before serving.
    #[serde(default)]
    pub begins: Vec<EpochBegin>,
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
    /// The catalog of a listing of `(name, size)` under a shoot's prefix,
    /// with superseded epochs' late objects set aside.
    pub fn from_listing(objects: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut c = Catalog::default();
        let mut entries = Vec::new();
        for (name, size) in objects {
            if let Some(e) = parse_name(&name, size) {
                entries.push(e);
            } else if let Some(b) = parse_begin(&name) {
                c.begins.push(b);
            } else {
                c.unknown.push(name);
            }
        }
        c.take_in(entries);
        c
    }

    /// The newest epoch any object was written in, or any host recorded it
    /// began (0: none recorded): a backup of an older epoch is stale.
    pub fn newest_epoch(&self) -> u64 {
        let begun = self.begins.iter().map(|b| b.epoch);
        self.entries()
            .map(|e| e.epoch)
            .chain(begun)
            .max()
            .unwrap_or(0)
    }

    /// The newest revision the objects of `epoch` reach, if it wrote any.
    pub fn latest_revision_of(&self, epoch: u64) -> Option<i64> {
        self.entries()
            .filter(|e| e.epoch == epoch)
            .map(|e| e.last)
            .max()
    }

    /// Where `epoch` began: the older of the revision its host recorded
    /// before serving and its oldest object's start, if it left either.
    pub fn epoch_start(&self, epoch: u64) -> Option<i64> {
        let begun = self.begins.iter().filter(|b| b.epoch == epoch);
        self.entries()
            .filter(|e| e.epoch == epoch)
            .map(Entry::start)
            .chain(begun.map(|b| b.revision))
            .min()
    }

    /// Drops the objects and epoch records that are not encrypted (a bucket
    /// with a key trusts only what its key authenticates, also in deciding
    /// which epochs' objects are superseded); returns their names.
    pub fn retain_encrypted(&mut self) -> Vec<String> {
        self.retain(|e| e.encrypted, |b| b.encrypted)
    }

    /// Forgets the epoch records named in `names` (ones that did not open)
    /// and files the objects again without them.
    pub fn drop_begins(&mut self, names: &[String]) {
        self.retain(|_| true, |b| !names.contains(&b.name));
    }

    /// Keeps the objects and epoch records the predicates accept, filing
    /// the objects again as history or superseded without the others;
    /// returns the names left out, sorted.
    fn retain(
        &mut self,
        entry: impl Fn(&Entry) -> bool,
        begin: impl Fn(&EpochBegin) -> bool,
    ) -> Vec<String> {
        let superseded = std::mem::take(&mut self.superseded);
        let all = std::mem::take(&mut self.fulls)
            .into_iter()
            .chain(std::mem::take(&mut self.deltas))
            .chain(superseded.into_iter().map(|s| s.entry));
        let (kept, left): (Vec<Entry>, Vec<Entry>) = all.partition(|e| entry(e));
        let (begins, left_begins): (Vec<EpochBegin>, Vec<EpochBegin>) =
            std::mem::take(&mut self.begins)
                .into_iter()
                .partition(|b| begin(b));
        self.begins = begins;
        self.take_in(kept);
        let mut names: Vec<String> = left
            .into_iter()
            .map(|e| e.name)
            .chain(left_begins.into_iter().map(|b| b.name))
            .collect();
        names.sort();
        names
    }

    /// Files `entries` (none held yet) as history or superseded, sorted.
    fn take_in(&mut self, entries: Vec<Entry>) {
        let (kept, superseded) = lineage::split(entries, &self.begins);
        for e in kept {
            match e.kind {
                Kind::Full => self.fulls.push(e),
                Kind::Delta => self.deltas.push(e),
            }
        }
        self.superseded = superseded;
        self.sort();
    }

    fn sort(&mut self) {
        self.fulls.sort_by_key(|e| (e.first, e.epoch, e.time_ms));
        self.deltas
            .sort_by_key(|e| (e.first, e.last, e.epoch, e.time_ms));
        self.unknown.sort();
        self.begins.sort_by_key(|b| (b.epoch, b.revision));
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
mod tests;
