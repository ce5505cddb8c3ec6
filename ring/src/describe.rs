//! `ringctl describe operation N`: one failover or migration in full, where
//! `ringctl status` shows a line of it.

use crate::state::{Operation, OperationKind};
use crate::status::wrap_after;

/// Where the values start, after their labels.
const LABEL: usize = 14;

/// `op` as labelled lines: what it moves, its step and whole detail, the
/// time spent in each step, and what the target measured when it ended.
/// `now_ms` (the Unix clock) dates its creation and last update.
pub fn render_operation(op: &Operation, now_ms: u64) -> String {
    let ago = |at: u64| format!("{:.1}s ago", now_ms.saturating_sub(at) as f64 / 1000.0);
    let mut out = String::new();
    let mut line = |label: &str, value: String| {
        out.push_str(&wrap_after(&format!("{label:<LABEL$}"), &value, LABEL));
    };
    let (kind, extra) = match &op.kind {
        OperationKind::Migration { revision, .. } => (
            "migration",
            revision.map(|r| format!("final revision at the source {r}")),
        ),
        OperationKind::Failover { promote, seen, .. } => (
            "failover",
            Some(format!(
                "{}; the old host's etcd was last heard at {}",
                if *promote {
                    "promotes the hot standby"
                } else {
                    "restores from the bucket"
                },
                seen.map_or("no revision (unknown)".into(), |s| format!(
                    "revision {} ({})",
                    s.revision,
                    ago(s.at_ms)
                ))
            )),
        ),
    };
    line("operation", format!("{} ({kind})", op.id));
    line(
        "shoot",
        format!(
            "{} from {} to {} at epoch {}",
            op.shoot(),
            op.source(),
            op.target(),
            op.epoch()
        ),
    );
    if let Some(extra) = extra {
        line("how", extra);
    }
    line("step", format!("{:?}", op.step));
    line(
        "detail",
        if op.detail.is_empty() {
            "-".into()
        } else {
            op.detail.clone()
        },
    );
    line("created", ago(op.created_at_ms));
    line("updated", ago(op.updated_at_ms));
    let steps: Vec<String> = op
        .step_durations()
        .iter()
        .map(|(step, ms)| format!("{step:?} {:.1}s", *ms as f64 / 1000.0))
        .collect();
    if !steps.is_empty() {
        line("steps", steps.join(", "));
    }
    if let Some(o) = &op.outcome {
        line(
            "restore",
            format!(
                "revision {} in {:.1}s, started and verified in {:.1}s",
                o.restored_revision,
                o.restore_ms as f64 / 1000.0,
                o.start_ms as f64 / 1000.0
            ),
        );
        if let (Some(revs), Some(age)) = (o.rpo_revisions, o.rpo_ms) {
            line(
                "durable",
                format!(
                    "{revs} revisions known durable but not reached; newest backup {:.1}s old",
                    age as f64 / 1000.0
                ),
            );
        }
        line("may be lost", may_lose(o));
        if !o.objects.is_empty() {
            let total: u64 = o.objects.values().sum();
            let each: Vec<String> = o.objects.iter().map(|(k, n)| format!("{k} {n}")).collect();
            line(
                "verified",
                format!(
                    "{total} objects in {} resource types: {}",
                    o.objects.len(),
                    each.join(", ")
                ),
            );
        }
    }
    out
}

/// What clients may have lost, in words (see `Outcome::may_lose_revisions`
/// and `Outcome::unheard_ms`).
fn may_lose(o: &crate::state::Outcome) -> String {
    let counted = match (o.may_lose_revisions, o.may_lose_ms) {
        (Some(n), Some(ms)) => format!(
            "at least {n} revisions, from the {:.1}s between the newest durable backup and the old host's last report",
            ms as f64 / 1000.0
        ),
        (Some(n), None) => format!("at least {n} revisions"),
        (None, _) => "unknown: no report of the old host's etcd reached the ring".into(),
    };
    match o.unheard_ms {
        Some(ms) => format!(
            "{counted}; and any write it acknowledged in the {:.1}s it may have served unheard, until its lease was surely over",
            ms as f64 / 1000.0
        ),
        None => counted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{OperationStep, Outcome, SeenRevision, StepTime};

    #[test]
    fn a_finished_failover_shows_its_whole_detail_steps_and_figures() {
        let detail = "serving on m3 at epoch 3; revision 316, HashKV and 274 objects in 23 resource types verified; restored from full 0000000000000300 and 2 deltas";
        let mut op = Operation::new(
            4,
            OperationKind::Failover {
                shoot: "m1".into(),
                from: "m2".into(),
                to: "m3".into(),
                epoch: 3,
                not_before_ms: 0,
                seen: Some(SeenRevision {
                    revision: 320,
                    at_ms: 10_000,
                }),
                promote: false,
            },
            OperationStep::WaitingForLeaseExpiry,
            detail.into(),
            10_000,
        );
        op.history.extend([
            StepTime {
                step: OperationStep::Restoring,
                at_ms: 14_000,
            },
            StepTime {
                step: OperationStep::Done,
                at_ms: 19_500,
            },
        ]);
        op.step = OperationStep::Done;
        op.updated_at_ms = 19_500;
        op.outcome = Some(Outcome {
            restored_revision: 316,
            restore_ms: 2_100,
            start_ms: 3_400,
            may_lose_revisions: Some(4),
            may_lose_ms: Some(900),
            unheard_ms: Some(5_200),
            objects: [("configmaps".to_string(), 20), ("secrets".to_string(), 3)].into(),
            ..Default::default()
        });
        let out = render_operation(&op, 20_000);
        assert!(out.starts_with("operation     4 (failover)\n"), "{out}");
        assert!(out.contains("m1 from m2 to m3 at epoch 3"), "{out}");
        assert!(
            out.contains("last heard at revision 320 (10.0s ago)"),
            "{out}"
        );
        // the status table cuts this detail; here it is whole (wrapped)
        let joined = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(joined.contains(detail), "{out}");
        assert!(
            out.contains("WaitingForLeaseExpiry 4.0s, Restoring 5.5s"),
            "{out}"
        );
        assert!(out.contains("revision 316 in 2.1s"), "{out}");
        assert!(out.contains("at least 4 revisions"), "{out}");
        assert!(
            joined.contains("any write it acknowledged in the 5.2s it may have served unheard"),
            "{out}"
        );
        assert!(
            out.contains("23 objects in 2 resource types: configmaps 20, secrets 3"),
            "{out}"
        );
        assert!(out
            .lines()
            .all(|l| l.chars().count() <= crate::status::WIDTH));
    }
}
