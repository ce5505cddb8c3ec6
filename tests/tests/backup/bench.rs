//! The backup benchmarks run end to end at a toy size, so a change that
//! breaks them (an etcd they cannot reach, a report they cannot read) fails
//! here and not in a release measurement. Their figures are compared with
//! goals only by `scripts/bench`, never here.

use super::*;

fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = expect_success(&ringctl_cmd(args, &[]));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("bench report {out:?}: {e}"))
}

fn positive(v: &serde_json::Value, field: &str) -> f64 {
    let x = v[field].as_f64().unwrap_or(0.0);
    assert!(x > 0.0, "{field} is {x} in {v}");
    x
}

#[test]
fn the_restore_benchmark_measures_ring_against_etcdutl() {
    let v = bench_json(&[
        "bench", "restore", "--db-mib", "1", "--events", "300", "--runs", "1", "-o", "json",
    ]);
    assert!(v["events"].as_u64().unwrap_or(0) >= 300, "events in {v}");
    assert!(
        v["fullKeys"].as_u64().unwrap_or(0) >= 1000,
        "full keys in {v}"
    );
    for field in [
        "ringSecs",
        "ringReplaySecs",
        "ringEventsPerSec",
        "ringRssMib",
        "etcdutlFullSecs",
        "ratio",
    ] {
        positive(&v, field);
    }
}

#[test]
fn the_backup_benchmark_reaches_its_tls_etcd_with_every_tool() {
    let v = bench_json(&[
        "bench",
        "backup",
        "--db-mib",
        "2",
        "--events",
        "300",
        "--runs",
        "1",
        "--rate",
        "100",
        "--lag-secs",
        "1",
        "-o",
        "json",
    ]);
    for field in [
        "snapshotRingSecs",
        "snapshotEtcdctlSecs",
        "restoreRingSecs",
        "restoreEtcdutlSecs",
        "replayEventsPerSec",
        "lagP50Secs",
    ] {
        positive(&v, field);
    }
}
