//! Which acknowledged writes a drill run lost, and whether each loss was
//! allowed: by what the bucket held at a loss of the control plane, and by
//! what the ring's finished failovers reported as possibly lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::drill::ObjectKind;

/// What a shoot holds at the end: object → its counter value (0 for plain objects).
pub type Present = BTreeMap<(ObjectKind, String), u64>;

/// A loss of a shoot's control plane: when, and up to which revision the bucket had it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossPoint {
    pub at_ms: u64,
    pub durable_revision: i64,
}

/// One acknowledged write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    pub kind: ObjectKind,
    pub name: String,
    /// For updates of the writer's counter object: the value written.
    pub generation: Option<u64>,
    pub resource_version: i64,
    /// Milliseconds after the workload started.
    pub at_ms: u64,
}

/// How late a writer may record an acknowledgement after the API server
/// sent it (the response's way back, the writer's scheduling).
const ACK_SLACK_MS: u64 = 500;

/// What a finished failover reported of its loss besides the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reported {
    /// The revision the restore reached.
    pub restored_revision: i64,
    /// Until when the old host may have acknowledged writes the ring never
    /// heard of (ms since the Unix epoch, the ring's clock): its last report
    /// plus the time it may have served unheard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unheard_until_ms: Option<u64>,
}

/// One finished failover's report of what clients may have lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverReport {
    /// Revisions past the restore that are lost (`None`: unknown).
    pub may_lose_revisions: Option<i64>,
    pub reported: Reported,
}

impl FailoverReport {
    /// Whether the report covers the loss of `a`, acknowledged at
    /// `acked_at_ms` (ms since the Unix epoch): counted among the revisions
    /// past the restore, or acknowledged while the old host may have served
    /// unheard. A report that bounds neither allows any loss.
    fn covers(&self, a: &Ack, acked_at_ms: u64) -> bool {
        let r = self.reported;
        let counted = self
            .may_lose_revisions
            .is_some_and(|n| a.resource_version <= r.restored_revision + n);
        let unheard = r
            .unheard_until_ms
            .is_some_and(|until| acked_at_ms <= until + ACK_SLACK_MS);
        let unbounded = self.may_lose_revisions.is_none() && r.unheard_until_ms.is_none();
        counted || unheard || unbounded
    }
}

/// The acknowledged writes one shoot lacks at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    /// Lost though they had to survive (durable, or never exposed by a loss).
    pub lost: u64,
    /// Lost, but newer than what the bucket held at a loss.
    pub excused: u64,
    /// Of the excused, those no finished failover reported as possibly lost
    /// (only counted when a failover of the shoot finished).
    pub unreported: u64,
    /// Examples of both kinds of violation (name@resourceVersion).
    pub examples: Vec<String>,
}

/// Accounts for every acknowledged write missing from `present`; ack times
/// are ms after `started_at_ms` (the Unix epoch ms the workload started at).
pub fn account(
    acks: &[Ack],
    present: &Present,
    losses: &[LossPoint],
    reports: &[FailoverReport],
    started_at_ms: u64,
) -> Lost {
    let mut out = Lost::default();
    for a in acks.iter().filter(|a| !is_there(a, present)) {
        // acknowledged before a loss, but newer than what the bucket held then
        let excused = losses
            .iter()
            .any(|l| a.at_ms <= l.at_ms && a.resource_version > l.durable_revision);
        let at = started_at_ms + a.at_ms;
        let violation = if !excused {
            out.lost += 1;
            format!("{}@{}", a.name, a.resource_version)
        } else {
            out.excused += 1;
            if reports.is_empty() || reports.iter().any(|r| r.covers(a, at)) {
                continue;
            }
            out.unreported += 1;
            format!(
                "{}@{} unreported, acknowledged {:.1}s into the run",
                a.name,
                a.resource_version,
                a.at_ms as f64 / 1000.0
            )
        };
        if out.examples.len() < 5 {
            out.examples.push(violation);
        }
    }
    out
}

fn is_there(a: &Ack, present: &Present) -> bool {
    match (present.get(&(a.kind, a.name.clone())), a.generation) {
        (None, _) => false,
        (Some(g), Some(want)) => *g >= want,
        (Some(_), None) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(name: &str, rv: i64, at_ms: u64, generation: Option<u64>) -> Ack {
        Ack {
            kind: ObjectKind::ConfigMap,
            name: name.into(),
            generation,
            resource_version: rv,
            at_ms,
        }
    }

    #[test]
    fn lost_writes_are_excused_only_beyond_the_durable_revision_at_a_loss() {
        let acks = [
            ack("a", 10, 100, None),    // durable, present
            ack("b", 20, 200, None),    // durable, missing -> lost
            ack("c", 31, 300, None),    // newer than durable at the loss -> excused
            ack("d", 32, 900, None),    // after the loss (restored revisions reused) -> lost
            ack("n", 33, 950, Some(7)), // counter at 7, shoot has 5 -> lost
            ack("n", 25, 250, Some(3)), // counter 3 <= 5 -> fine
        ];
        let mut present = Present::new();
        present.insert((ObjectKind::ConfigMap, "a".into()), 0);
        present.insert((ObjectKind::ConfigMap, "n".into()), 5);
        let losses = [LossPoint {
            at_ms: 500,
            durable_revision: 30,
        }];
        let l = account(&acks, &present, &losses, &[], 0);
        assert_eq!((l.lost, l.excused, l.unreported), (3, 1, 0));
        assert_eq!(l.examples, ["b@20", "d@32", "n@33"]);
        // with no loss, nothing is excused
        assert_eq!(account(&acks, &present, &[], &[], 0).excused, 0);
    }

    /// A lost write beyond the bucket passes only when the ring's report
    /// covers it: counted past the restore, or acknowledged while the old
    /// host may have served unheard.
    #[test]
    fn an_excused_loss_must_be_one_the_ring_reported() {
        // the workload started at 100 s; the bucket held revision 30 at the loss
        let start = 100_000;
        let losses = [LossPoint {
            at_ms: 10_000,
            durable_revision: 30,
        }];
        let acks = [
            ack("heard", 33, 2_000, None), // the old host was heard at 34
            ack("stall", 40, 6_000, None), // acked unheard, before the lease was over
            ack("late", 41, 7_900, None),  // acked after it (a fence too late)
        ];
        let report = |n: Option<i64>, until: Option<u64>| FailoverReport {
            may_lose_revisions: n,
            reported: Reported {
                restored_revision: 30,
                unheard_until_ms: until,
            },
        };
        let lease_over = start + 7_000;
        let cases = [
            ("counted and unheard", report(Some(4), Some(lease_over)), 1),
            ("nothing told of the unheard time", report(Some(4), None), 2),
            ("nothing counted", report(Some(0), Some(lease_over)), 1),
            (
                "a lease over too soon",
                report(Some(4), Some(start + 5_000)),
                2,
            ),
            ("told nothing", report(None, None), 0),
            ("only the unheard time", report(None, Some(lease_over)), 1),
        ];
        for (name, r, unreported) in cases {
            let l = account(&acks, &Present::new(), &losses, &[r], start);
            assert_eq!((l.excused, l.unreported), (3, unreported), "{name}");
        }
        let l = account(
            &acks,
            &Present::new(),
            &losses,
            &[report(Some(4), Some(lease_over))],
            start,
        );
        assert_eq!(
            l.examples,
            ["late@41 unreported, acknowledged 7.9s into the run"]
        );
        // another failover's report may cover what one does not
        let both = [
            report(Some(4), None),
            report(Some(0), Some(lease_over + 1_000)),
        ];
        assert_eq!(
            account(&acks, &Present::new(), &losses, &both, start).unreported,
            0
        );
    }
}
