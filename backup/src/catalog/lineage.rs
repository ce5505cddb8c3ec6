//! Which objects belong to the shoot's history, by epoch (pure).
//!
//! Every host writes its objects under the ring epoch it serves at, and a
//! new epoch's history begins at the data it was given (restored from the
//! bucket, or handed over): where its host recorded that before serving
//! (`begin.rs`), else at its first full snapshot. A host that was fenced (or
//! stalled, or cut off) may still upload for a while: its objects then
//! continue the *old* epoch past where the new one began, a fork of the
//! history that no client of the new host ever saw. So an object of epoch
//! `j` that reaches past the start of any newer epoch `k > j` is
//! superseded: restores, resumed backups and retention never use it. Objects
//! of epoch `j` up to that start are the history the new epoch continued.

use serde::{Deserialize, Serialize};

use super::{Entry, EpochBegin};

/// An object set aside because a newer epoch began before its last revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Superseded {
    /// The object.
    pub entry: Entry,
    /// The newer epoch whose history it contradicts.
    pub by_epoch: u64,
    /// The revision that epoch's history began at.
    pub from_revision: i64,
}

impl Superseded {
    /// Why the object is not used, for people.
    pub fn reason(&self) -> String {
        format!(
            "{} was written at epoch {} and reaches revision {}, but epoch {} began at revision {}: a fenced host's late upload, not the shoot's history",
            self.entry.name, self.entry.epoch, self.entry.last, self.by_epoch, self.from_revision
        )
    }
}

/// Splits `entries` into the shoot's history and the superseded objects.
/// An epoch's history began where its host recorded it (`begins`), or at
/// its oldest object's start, whichever is older. The record of an epoch
/// that wrote no object yet cuts nothing: its host may never have served
/// (its start failed, the leader chose again), and then the older epoch's
/// later uploads are the newest history there is; if it served, what its
/// clients wrote is in no object either way.
pub(super) fn split(entries: Vec<Entry>, begins: &[EpochBegin]) -> (Vec<Entry>, Vec<Superseded>) {
    // where each epoch's history began
    let mut starts: std::collections::BTreeMap<u64, i64> = Default::default();
    for e in &entries {
        let s = starts.entry(e.epoch).or_insert(i64::MAX);
        *s = (*s).min(e.start());
    }
    for b in begins {
        if let Some(s) = starts.get_mut(&b.epoch) {
            *s = (*s).min(b.revision);
        }
    }
    // for each epoch, the earliest start of any newer epoch (and which)
    let mut limits: std::collections::BTreeMap<u64, (u64, i64)> = Default::default();
    let mut newer: Option<(u64, i64)> = None;
    for (&epoch, &start) in starts.iter().rev() {
        if let Some(limit) = newer {
            limits.insert(epoch, limit);
        }
        if newer.is_none_or(|(_, s)| start <= s) {
            newer = Some((epoch, start));
        }
    }
    let mut kept = Vec::new();
    let mut superseded = Vec::new();
    for entry in entries {
        match limits.get(&entry.epoch) {
            Some(&(by_epoch, from_revision)) if entry.last > from_revision => {
                superseded.push(Superseded {
                    entry,
                    by_epoch,
                    from_revision,
                })
            }
            _ => kept.push(entry),
        }
    }
    superseded.sort_by(|a, b| a.entry.name.cmp(&b.entry.name));
    (kept, superseded)
}

#[cfg(test)]
mod tests {
    use super::super::{object_name_in_epoch, parse_name, Kind};
    use super::*;

    fn obj(epoch: u64, kind: Kind, a: i64, b: i64) -> Entry {
        let name = object_name_in_epoch(epoch, kind, a, b, 1_700_000_000_000 + b, true, true);
        parse_name(&name, 1).unwrap()
    }

    /// (epoch, first, last) of kept objects; (epoch, first, by epoch) of set aside ones.
    type Kept = Vec<(u64, i64, i64)>;
    type SetAside = Vec<(u64, i64, u64)>;

    fn kept_and_set_aside(entries: Vec<Entry>, begins: &[EpochBegin]) -> (Kept, SetAside) {
        let (kept, superseded) = split(entries, begins);
        let mut k: Vec<_> = kept.iter().map(|e| (e.epoch, e.first, e.last)).collect();
        k.sort();
        let s = superseded
            .iter()
            .map(|s| (s.entry.epoch, s.entry.first, s.by_epoch))
            .collect();
        (k, s)
    }

    #[test]
    fn a_fenced_epochs_late_uploads_are_set_aside_and_its_history_before_is_kept() {
        use Kind::{Delta, Full};
        type Case = (&'static str, Vec<Entry>, Kept, SetAside);
        let cases: Vec<Case> =
            vec![
            (
                "one epoch: everything is history",
                vec![obj(1, Full, 10, 10), obj(1, Delta, 11, 20)],
                vec![(1, 10, 10), (1, 11, 20)],
                vec![],
            ),
            (
                "epoch 2 began at 20: epoch 1's deltas up to 20 stay, the later ones are a fork",
                vec![
                    obj(1, Full, 10, 10),
                    obj(1, Delta, 11, 20),
                    obj(1, Delta, 21, 30),
                    obj(2, Full, 20, 20),
                    obj(2, Delta, 21, 25),
                ],
                vec![(1, 10, 10), (1, 11, 20), (2, 20, 20), (2, 21, 25)],
                vec![(1, 21, 2)],
            ),
            (
                "a late delta that straddles the new epoch's start is set aside whole",
                vec![
                    obj(1, Full, 10, 10),
                    obj(1, Delta, 11, 24),
                    obj(2, Full, 22, 22),
                ],
                vec![(1, 10, 10), (2, 22, 22)],
                vec![(1, 11, 2)],
            ),
            (
                "a late full snapshot of the old epoch is set aside too",
                vec![obj(1, Full, 10, 10), obj(2, Full, 20, 20), obj(1, Full, 40, 40)],
                vec![(1, 10, 10), (2, 20, 20)],
                vec![(1, 40, 2)],
            ),
            (
                "two moves: epoch 1 is cut by epoch 3 when epoch 2 wrote nothing",
                vec![
                    obj(1, Full, 10, 10),
                    obj(1, Delta, 11, 30),
                    obj(3, Full, 20, 20),
                ],
                vec![(1, 10, 10), (3, 20, 20)],
                vec![(1, 11, 3)],
            ),
            (
                "the earliest newer start wins: epoch 3 restored from before epoch 2's start",
                vec![
                    obj(1, Full, 10, 10),
                    obj(1, Delta, 11, 18),
                    obj(2, Full, 20, 20),
                    obj(2, Delta, 21, 26),
                    obj(3, Full, 15, 15),
                ],
                vec![(1, 10, 10), (3, 15, 15)],
                vec![(1, 11, 3), (2, 21, 3), (2, 20, 3)],
            ),
            (
                "objects without an epoch (older Rings) are the oldest history",
                vec![
                    obj(0, Full, 10, 10),
                    obj(0, Delta, 11, 40),
                    obj(4, Full, 30, 30),
                ],
                vec![(0, 10, 10), (4, 30, 30)],
                vec![(0, 11, 4)],
            ),
        ];
        for (what, entries, kept, superseded) in cases {
            let got = kept_and_set_aside(entries, &[]);
            assert_eq!(got, (kept, superseded), "{what}");
        }
    }

    /// The new epoch's first full snapshot came after its control plane
    /// had served a few writes (at 25, restored at 20): the fenced host's late
    /// deltas from 21 on are a fork whether or not they reach 25, once the new
    /// host recorded where it began.
    #[test]
    fn a_recorded_beginning_cuts_the_old_epoch_where_the_new_one_was_restored() {
        use Kind::{Delta, Full};
        let begin = |epoch, revision| {
            super::super::parse_begin(&super::super::begin_name(epoch, revision, false)).unwrap()
        };
        let objects = || {
            vec![
                obj(1, Full, 10, 10),
                obj(1, Delta, 11, 20),
                obj(1, Delta, 21, 24),
                obj(2, Full, 25, 25),
                obj(2, Delta, 26, 30),
            ]
        };
        type Case = (&'static str, Vec<EpochBegin>, Kept, SetAside);
        let cases: Vec<Case> = vec![
            (
                "no record: the fork up to the first full snapshot passes for history",
                vec![],
                vec![
                    (1, 10, 10),
                    (1, 11, 20),
                    (1, 21, 24),
                    (2, 25, 25),
                    (2, 26, 30),
                ],
                vec![],
            ),
            (
                "epoch 2 began at 20: epoch 1's deltas after it are set aside",
                vec![begin(2, 20)],
                vec![(1, 10, 10), (1, 11, 20), (2, 25, 25), (2, 26, 30)],
                vec![(1, 21, 2)],
            ),
            (
                "a record of an epoch that wrote nothing (it may never have served) cuts nothing",
                vec![begin(2, 20), begin(3, 22)],
                vec![(1, 10, 10), (1, 11, 20), (2, 25, 25), (2, 26, 30)],
                vec![(1, 21, 2)],
            ),
        ];
        for (what, begins, kept, superseded) in cases {
            let (k, mut s) = kept_and_set_aside(objects(), &begins);
            s.sort();
            assert_eq!((k, s), (kept, superseded), "{what}");
        }
    }

    #[test]
    fn the_reason_names_both_epochs_and_the_revision() {
        let (_, s) = split(
            vec![obj(2, Kind::Full, 20, 20), obj(1, Kind::Delta, 15, 30)],
            &[],
        );
        let reason = s[0].reason();
        for want in ["epoch 1", "revision 30", "epoch 2 began at revision 20"] {
            assert!(reason.contains(want), "{want:?} in {reason}");
        }
    }
}
