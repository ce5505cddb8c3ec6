//! Where each epoch's history begins, recorded by the host that took the
//! shoot over (pure names).
//!
//! A new epoch's own objects start with its first full snapshot, taken once
//! its control plane serves: writes it took before that land in the
//! snapshot, so its base is past the revision the epoch was given. A fenced
//! host's late uploads between the two would otherwise pass for history. So
//! before it serves, the new host stores a small `begin` object naming the
//! revision it restored; the epoch's history starts there. One record per
//! epoch is written (its start comes after the restore is final); should
//! there be more, the oldest revision counts, setting aside more rather
//! than less. A planned move writes none: its source stopped serving before
//! it handed the data over, so nothing of the old epoch can fork from it.

use serde::{Deserialize, Serialize};

/// A record that ring epoch `epoch` began serving the shoot at `revision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EpochBegin {
    /// The object's name under the shoot's prefix.
    pub name: String,
    /// The ring epoch that began.
    pub epoch: u64,
    /// The revision of the data it was given: its history continues after it.
    pub revision: i64,
    /// Sealed with the bucket's key.
    pub encrypted: bool,
}

/// What a `begin` object holds (sealed under a key; its name says the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EpochBeginBody {
    /// The shoot (a sealed record is bound to it as well).
    pub shoot: String,
    /// The ring epoch that began.
    pub epoch: u64,
    /// The revision of the data its host was given.
    pub revision: i64,
    /// When the host wrote it (ms since the Unix epoch, its clock).
    pub at_ms: i64,
}

/// The name of the record that `epoch` began at `revision`.
pub fn begin_name(epoch: u64, revision: i64, encrypted: bool) -> String {
    let enc = if encrypted { ".aesgcm" } else { "" };
    format!("begin-{revision:020}-e{epoch}.json{enc}")
}

/// Parses a `begin` object's name; `None` for anything else.
pub fn parse_begin(name: &str) -> Option<EpochBegin> {
    let (stem, ext) = name.split_once('.')?;
    let encrypted = match ext {
        "json" => false,
        "json.aesgcm" => true,
        _ => return None,
    };
    let ["begin", revision, epoch] = stem.split('-').collect::<Vec<_>>()[..] else {
        return None;
    };
    let revision = (revision.len() == 20)
        .then(|| revision.parse::<i64>().ok())
        .flatten()?;
    let epoch = super::parse_epoch(epoch)?;
    Some(EpochBegin {
        name: name.to_string(),
        epoch,
        revision,
        encrypted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_begin_name_round_trips_and_nothing_else_parses_as_one() {
        for enc in [false, true] {
            let name = begin_name(7, 1234, enc);
            let b = parse_begin(&name).expect(&name);
            assert_eq!((b.epoch, b.revision, b.encrypted), (7, 1234, enc));
        }
        for bad in [
            "begin-00000000000000001234-e0.json",
            "begin-1234-e2.json",
            "begin-00000000000000001234.json",
            "begin-00000000000000001234-e2.zst",
            "full-00000000000000001234-20260101T000000000Z-e2.zst",
            "begin-00000000000000001234-e2-x.json",
        ] {
            assert_eq!(parse_begin(bad), None, "{bad}");
        }
    }
}
