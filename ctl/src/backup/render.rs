//! `ringctl backup ...` output as text (the table format).

use backup::catalog::{rfc3339, Catalog};
use backup::BackupConfig;

use crate::output::table;

/// A byte count for people.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 10 << 20 => format!("{} MiB", b >> 20),
        b if b >= 10 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// What `backup start` is about to do (one line, no newline).
pub fn starting(config: &BackupConfig) -> String {
    format!(
        "backing up shoot {} from {} to {} (deltas every {} ms); stop with Ctrl-C",
        config.shoot,
        config.etcd.endpoints.join(","),
        config.bucket.url,
        config.schedule.delta_period_ms
    )
}

/// One full snapshot taken by `backup snapshot`.
pub fn snapshot(shoot: &str, snap: &backup::full::FullSnapshot) -> String {
    format!(
        "full snapshot {} of shoot {}: revision {}, {} keys, {} from etcd, {} stored, sha256 {} ({:.1}s)\n",
        snap.name,
        shoot,
        snap.base_revision,
        snap.keys,
        size(snap.db_bytes),
        size(snap.stored_bytes),
        snap.sha256,
        snap.seconds
    )
}

/// The catalog as a table.
pub fn catalog(bucket: &str, c: &Catalog) -> String {
    let mut t = table(&[
        "KIND",
        "REVISIONS",
        "EPOCH",
        "TIME",
        "SIZE",
        "ENCRYPTED",
        "NAME",
    ]);
    let mut all: Vec<_> = c.entries().collect();
    all.sort_by_key(|e| (e.first, e.kind));
    for e in all {
        let revs = if e.first == e.last {
            e.first.to_string()
        } else {
            format!("{}..{}", e.first, e.last)
        };
        t.add_row(vec![
            e.kind.to_string(),
            revs,
            if e.epoch > 0 {
                e.epoch.to_string()
            } else {
                "-".into()
            },
            rfc3339(e.time_ms),
            size(e.size),
            if e.encrypted { "yes" } else { "no" }.into(),
            e.name.clone(),
        ]);
    }
    let mut out = format!("{bucket}\n{t}\n");
    out.push_str(&format!(
        "{} full snapshots, {} deltas, newest revision {}\n",
        c.fulls.len(),
        c.deltas.len(),
        c.latest_revision().map_or("-".into(), |r| r.to_string())
    ));
    if !c.begins.is_empty() {
        let begun: Vec<String> = c
            .begins
            .iter()
            .map(|b| format!("{} at revision {}", b.epoch, b.revision))
            .collect();
        out.push_str(&format!("epochs recorded as begun: {}\n", begun.join(", ")));
    }
    for s in &c.superseded {
        out.push_str(&format!("superseded (never restored): {}\n", s.reason()));
    }
    for g in c.gaps() {
        out.push_str(&format!(
            "gap: revisions {}..={} are in no object (after {})\n",
            g.from, g.to, g.after
        ));
    }
    out
}

/// Every object `backup verify` checked, its notes and problems.
pub fn verify(report: &backup::verify::VerifyReport) -> String {
    let mut t = table(&["RESULT", "KIND", "REVISIONS", "NAME"]);
    for o in &report.objects {
        t.add_row(vec![
            o.problem
                .as_ref()
                .map_or("ok".to_string(), |p| format!("BAD: {p}")),
            o.kind.to_string(),
            format!("{}..{}", o.first, o.last),
            o.name.clone(),
        ]);
    }
    let mut out = format!("{}\n{t}\n", report.bucket);
    for n in &report.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    for p in &report.problems {
        out.push_str(&format!("problem: {p}\n"));
    }
    if report.ok() {
        out.push_str(&format!("all {} objects are sound\n", report.objects.len()));
    }
    out
}

/// What `backup restore` restored, and whether it is exact.
pub fn restored(shoot: &str, report: &backup::restore::RestoreReport) -> String {
    let mut out = format!(
        "restored shoot {shoot} into {} at revision {} ({} keys) in {:.1}s\n",
        report.data_dir.display(),
        report.reached_revision,
        report.keys,
        report.total_seconds
    );
    out.push_str(&format!(
        "  full snapshot {} (revision {}), {} deltas, {} revisions / {} events replayed in {:.1}s ({} from etcd's log)\n",
        report.full,
        report.full_revision,
        report.deltas,
        report.revisions_replayed,
        report.events_replayed,
        report.replay_seconds,
        report.revisions_from_log
    ));
    if report.verified {
        out.push_str(&format!(
            "  verified: revision {}, {} keys, HashKV {}\n",
            report.reached_revision, report.keys, report.hash_kv
        ));
    } else {
        out.push_str(&format!(
            "  NOT exact: revisions {:?} were skipped (--allow-gap)\n",
            report.gaps
        ));
    }
    out
}

/// What `backup gc` deleted (or would delete) and kept.
pub fn gc(plan: &backup::retention::GcPlan, dry_run: bool) -> String {
    let verb = if dry_run { "would delete" } else { "deleted" };
    let mut out = String::new();
    for d in &plan.delete {
        out.push_str(&format!("{verb} {d}\n"));
    }
    out.push_str(&format!(
        "{verb} {} objects, kept {}\n",
        plan.delete.len(),
        plan.keep.len()
    ));
    out
}
