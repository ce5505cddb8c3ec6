//! The essential chaos drills through the real `ringctl drill run` binary:
//! `kill-seed` (on the self-hosted ring: kill -9 of the ringd hosting shoot
//! 2, its pods fence themselves, failover from the bucket into pods on
//! another node, re-link), `kill-machine` (a whole machine: ringd, node and
//! pods; ignored by default, slow), `kill-kubernetes-seed` (a process-hosted
//! ring whose killed seed is a Kubernetes cluster:
//! its node and pods die, the control plane comes back onto the pods),
//! `kubernetes-to-kubernetes` (failover and move between two seed clusters) and
//! `full-ring-dr` (the whole self-hosted ring lost, machines and nodes;
//! `ringctl restore --from-bucket`, then the pivot back into pods),
//! `kill-seed-standby` (a hot standby promoted: no acknowledged write lost),
//! `stall-ringd-standby` (the hot standby's host frozen: fenced by its
//! guards, the standby promoted before the stalled ringd resumes),
//! `stall-ringd-processes` (a local seed's host frozen, its backup with it:
//! every write lost is one the failover reported as possibly lost),
//! `double-failover` (one shoot fails over twice, the second time onto the
//! member holding its stale data), `verify-partition` (the failover
//! target cut off mid-restore; ignored by default, slow) and `clock-skew`
//! (the hosting ringd's clock 5 s ahead, then frozen; ignored, slow).
//! Each run's JSON result is checked: passed, RTO measured, never two control
//! planes of one shoot, no acknowledged write lost beyond the durable delta
//! or beyond what a finished failover reported as possibly lost.

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ring_tests::*;

fn drill_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/drills")
        .join(format!("{name}.yaml"))
}

/// Runs one drill once; returns its JSON result and the HTML report's text.
fn run_drill(name: &str, reports: &Path) -> (serde_json::Value, String) {
    // the drills need the control-plane binaries: fail with the setup hint if missing
    let _ = binaries();
    let mut cmd = Command::new(ringctl());
    cmd.args(["drill", "run"])
        .arg(drill_file(name))
        .arg("--report-dir")
        .arg(reports);
    let out = run_bounded(&mut cmd, Duration::from_secs(900));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json = reports.join(format!("{name}-1.json"));
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no result {}: {e}; ringctl said:\n{stderr}", json.display()));
    let result: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        out.status.success(),
        "ringctl drill run {name} failed ({}):\n{stderr}",
        out.status
    );
    assert!(stderr.contains(&format!("drill {name} run 1")), "{stderr}");
    let html = std::fs::read_to_string(reports.join(format!("{name}-1.html"))).unwrap();
    check_summary(name, &result, reports);
    (result, html)
}

/// `ringctl drill summary` over the report folder counts the run under the
/// build that ran it.
fn check_summary(name: &str, result: &serde_json::Value, reports: &Path) {
    let build = result["build"]
        .as_str()
        .unwrap_or_else(|| panic!("the result names no build: {result}"));
    let out = run_bounded(
        Command::new(ringctl())
            .args(["-o", "json", "drill", "summary"])
            .arg(reports),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{out:?}");
    let summaries: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mine: Vec<_> = summaries
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["drill"] == name)
        .collect();
    assert_eq!(mine.len(), 1, "{summaries}");
    assert_eq!(mine[0]["build"], build, "{summaries}");
    assert_eq!(
        (&mine[0]["runs"], &mine[0]["passed"]),
        (&1.into(), &1.into())
    );
    assert!(
        mine[0]["failover"]["max"].as_f64().unwrap() > 0.0,
        "{summaries}"
    );
}

/// The checks every drill result must pass.
fn check_common(r: &serde_json::Value, html: &str) {
    assert_eq!(r["passed"], true, "failures: {}", r["failures"]);
    assert_eq!(r["failures"].as_array().unwrap().len(), 0);
    assert_eq!(
        r["doubleServing"].as_array().unwrap().len(),
        0,
        "two control planes of one shoot at once: {}",
        r["doubleServing"]
    );
    assert!(
        r["convergedSecs"].is_number(),
        "converged: {}",
        r["convergedSecs"]
    );
    for s in r["shoots"].as_array().unwrap() {
        assert_eq!(s["lostWrites"], 0, "lost writes that had to survive: {s}");
        assert!(s["ackedWrites"].as_u64().unwrap() > 0, "{s}");
        assert!(s["rtoSecs"].is_number(), "RTO measured: {s}");
    }
    // the checker saw where every control plane ran
    let serving = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "serving")
        .count();
    assert!(serving >= 3, "serving events: {serving}");
    assert!(html.contains("<svg") && html.contains("API available"));
}

fn shoot<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["shoots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["shoot"] == name)
        .unwrap_or_else(|| panic!("no shoot {name} in {r}"))
}

/// The event of `shoot`'s failover reaching `Done`.
fn failover_done<'a>(r: &'a serde_json::Value, shoot: &str) -> &'a serde_json::Value {
    let ops = events(r, "operation");
    ops.iter()
        .find(|o| o["kind"] == "failover" && o["shoot"] == shoot && o["step"] == "Done")
        .copied()
        .unwrap_or_else(|| panic!("{shoot} never failed over: {ops:?}"))
}

fn events<'a>(r: &'a serde_json::Value, kind: &str) -> Vec<&'a serde_json::Value> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == kind)
        .collect()
}

/// The self-hosted ring: ks1's ringd killed, ks2's pods on node ks1 fence
/// themselves, ks2 restored as pods on node ks3, moved back by the rerun.
#[test]
fn kill_seed_drill_fails_over_from_the_bucket_and_relinks() {
    let _slot = ring_slot();
    let r = check_host_of_shoot_2_killed("kill-seed", "ks", "kill -9 ks1 (hosting ks2): ringd");
    // its ringd and its host processes (the relay of ks2's endpoint), not
    // its node: ks2's pods on node ks1 had to stop by themselves
    let faults = events(&r, "fault");
    let kill = faults[0]["detail"].as_str().unwrap();
    assert!(!kill.contains("node"), "{kill}");
    assert!(!events(&r, "loss").is_empty());
}

/// Hot standby (protection: standby, control planes as processes): sb1,
/// hosting sb2, killed with kill -9; the ring promotes sb2's standby on sb3
/// (around the warm kube-apiserver waiting there) instead of restoring from
/// the bucket, and not one acknowledged write of any shoot is lost although
/// the bucket lacked the newest ones; the ring heals and moves sb2 home.
/// About a minute: the ring-level promotion runs in CI.
#[test]
fn kill_seed_standby_drill_promotes_the_standby_and_loses_no_write() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("kill-seed-standby", sandbox.path());
    check_common(&r, &html);
    let s2 = shoot(&r, "sb2");
    assert_eq!(s2["lostWrites"], 0, "{s2}");
    assert!(s2["rtoSecs"].as_f64().unwrap() > 0.0, "{s2}");
    let ops = events(&r, "operation");
    assert!(
        ops.iter().any(|o| o["kind"] == "failover"
            && o["shoot"] == "sb2"
            && o["from"] == "sb1"
            && o["to"] == "sb3"
            && o["step"] == "Restoring"
            && o["detail"]
                .as_str()
                .unwrap()
                .contains("from its hot standby")),
        "the failover promoted the standby: {ops:?}"
    );
    assert!(
        ops.iter()
            .any(|o| o["kind"] == "failover" && o["shoot"] == "sb2" && o["step"] == "Done"),
        "{ops:?}"
    );
    assert!(
        ops.iter().any(|o| o["kind"] == "migration"
            && o["shoot"] == "sb2"
            && o["to"] == "sb1"
            && o["step"] == "Done"),
        "moved home: {ops:?}"
    );
}

/// Hot standby with the timing sized for it (750 ms election timeout, 2 s
/// failure window, 4 s lease), control planes as processes: ss1's ringd,
/// hosting ss2, frozen (SIGSTOP) for 15 s. Its guards fence every process
/// of ss2 there by themselves within the lease, the ring promotes ss2's
/// standby and ss2 serves again while the stalled ringd is still frozen
/// (until kube-controller-manager and kube-scheduler ran under the guard,
/// their ports on the shoot's address held the replacement off until the
/// resume), never on two members, and not one acknowledged write is lost.
/// About a minute.
#[test]
fn stall_ringd_standby_drill_promotes_while_the_stalled_host_is_frozen() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("stall-ringd-standby", sandbox.path());
    check_common(&r, &html);
    assert_eq!(shoot(&r, "ss2")["lostWrites"], 0, "{}", shoot(&r, "ss2"));
    let faults = events(&r, "fault");
    let stall = faults[0];
    let detail = stall["detail"].as_str().unwrap();
    let fenced_after: f64 = detail
        .split("it stopped serving ")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("the stalled host never stopped serving: {detail}"));
    assert!(fenced_after < 4.0, "fenced within the 4 s lease: {detail}");
    let stalled_at = stall["t"].as_f64().unwrap();
    let done = failover_done(&r, "ss2");
    assert!(
        done["detail"]
            .as_str()
            .unwrap()
            .contains("from its hot standby"),
        "{done}"
    );
    let took = done["t"].as_f64().unwrap() - stalled_at;
    assert!(
        took < 15.0,
        "ss2 served again {took:.1} s after the stall, not before the stalled ringd resumed (15 s)"
    );
}

/// Control planes as processes, backup protection: sp1's ringd, hosting
/// sp2, frozen for 20 s. sp2's etcd and kube-apiserver acknowledge writes
/// until their guards fence them, while sp2's backup (inside the frozen
/// ringd) uploads nothing: those writes are lost in the failover, and the
/// drill fails unless the failover reported each of them as possibly lost
/// (counted past the restore, or acknowledged within the time it says the
/// old host may have served unheard). About a minute.
#[test]
fn stall_ringd_processes_drill_reports_every_write_the_frozen_host_acknowledged() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("stall-ringd-processes", sandbox.path());
    check_common(&r, &html);
    let sp2 = shoot(&r, "sp2");
    assert_eq!(sp2["lostUnreported"], 0, "{sp2}");
    let done = failover_done(&r, "sp2");
    let detail = done["detail"].as_str().unwrap();
    assert!(
        detail.contains("until its lease was surely over, may be lost too"),
        "{detail}"
    );
    assert!(
        done["reported"]["unheardUntilMs"].is_u64(),
        "the failover reports the old host's unheard time: {done}"
    );
}

/// The self-hosted ring: st1's ringd frozen (SIGSTOP) for 20 s, so nothing
/// in ringd renews, fences or reports; st2's pods on node st1 fence
/// themselves at the lease deadline, st2 is restored as pods on node st3, the
/// resumed st1 never serves st2 again on its own (a zombie fails the drill),
/// and the ring moves it back. A loss point at the stall and one when its
/// pods stopped serving (not at the resume: the bucket then holds the
/// restored control plane's revisions).
/// Ignored by default to keep CI under its hour: the same fencing without
/// ringd is tested with real processes by `kubernetes_seed::failover` (pods)
/// and `ringd` (local seeds); `scripts/drills --all` runs this drill.
#[test]
#[ignore = "slow (5 min), covered by kubernetes_seed::failover and ringd tests: scripts/drills --all runs stall-ringd; run with --ignored"]
fn stall_ringd_drill_fences_without_ringd_and_fails_over() {
    let _slot = ring_slot();
    let r = check_host_of_shoot_2_killed("stall-ringd", "st", "SIGSTOP ringd st1 (hosting st2");
    let faults = events(&r, "fault");
    let stall = faults[0]["detail"].as_str().unwrap();
    assert!(
        stall.contains("for 20s, then SIGCONT; it stopped serving"),
        "{stall}"
    );
    let losses: Vec<_> = events(&r, "loss")
        .into_iter()
        .filter(|e| e["shoot"] == "st2")
        .collect();
    assert_eq!(losses.len(), 2, "{losses:?}");
    let (stalled, fenced) = (losses[0]["t"].as_f64(), losses[1]["t"].as_f64());
    let stall_at = faults[0]["t"].as_f64().unwrap();
    assert!(
        stalled.unwrap() - stall_at < 1.0 && fenced.unwrap() - stall_at < 15.0,
        "the second loss point is at the fence (within the lease), not at the resume 20 s later: {losses:?}"
    );
}

/// The self-hosted ring with cs1's clock 5 s ahead (its ringd restarted
/// under faketime; nodes and pods keep the true time), then cs1's ringd
/// frozen: cs2's pods on cs1's node stop by the lease counted on the node,
/// cs2 fails over and comes back; never two control planes of one shoot.
/// Slow (about 5 minutes): `scripts/drills --all` runs it.
#[test]
#[ignore = "slow (5 min): scripts/drills --all runs clock-skew; run with --ignored"]
fn clock_skew_drill_fences_by_the_nodes_clock_and_fails_over() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("clock-skew", sandbox.path());
    check_common(&r, &html);
    let faults: Vec<&str> = events(&r, "fault")
        .iter()
        .filter_map(|f| f["detail"].as_str())
        .collect();
    assert!(
        faults[0].starts_with("restarted ringd cs1") && faults[0].contains("+5s off (faketime)"),
        "{faults:?}"
    );
    assert!(
        faults[1].starts_with("SIGSTOP ringd cs1 (hosting cs2"),
        "{faults:?}"
    );
    let ops = events(&r, "operation");
    assert!(
        ops.iter().any(|o| o["kind"] == "failover"
            && o["shoot"] == "cs2"
            && o["from"] == "cs1"
            && o["step"] == "Done"),
        "{ops:?}"
    );
}

/// Control planes as processes: shoot df2 fails over from df1 to df3, df1
/// returns holding df2's released data of epoch 1, then df3 dies and df2
/// fails over onto df1 again: restored from the bucket (never from the stale
/// copy), verified, nothing durable lost, never two control planes; healed.
#[test]
#[ignore = "1.5 min, left out to keep CI under its hour: scripts/drills --all runs double-failover; run with --ignored"]
fn double_failover_drill_restores_onto_a_seed_holding_stale_data() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("double-failover", sandbox.path());
    check_common(&r, &html);
    let ops = events(&r, "operation");
    let failover = |from: &str, to: &str| {
        ops.iter().any(|o| {
            o["kind"] == "failover"
                && o["shoot"] == "df2"
                && o["from"] == from
                && o["to"] == to
                && o["step"] == "Done"
        })
    };
    assert!(failover("df1", "df3"), "first failover df1 -> df3: {ops:?}");
    assert!(
        failover("df3", "df1"),
        "second failover df3 -> df1, onto the stale copy: {ops:?}"
    );
    let kills: Vec<&str> = events(&r, "fault")
        .iter()
        .filter_map(|f| f["detail"].as_str())
        .filter(|d| d.starts_with("kill -9"))
        .collect();
    assert_eq!(kills.len(), 2, "{kills:?}");
    assert!(kills[1].starts_with("kill -9 df3"), "{kills:?}");
}

/// Five members on the self-hosted ring, each ringd in its own network
/// namespace: the failover target of shoot vp2 is cut off while it starts
/// and verifies the restored control plane; the majority fails that move and
/// restores vp2 elsewhere, never two control planes at once; then healed.
/// Slow (about 9 minutes, most of it bootstrapping five nodes): `scripts/drills
/// --all` runs this drill, `cargo test -- --ignored` this test.
#[test]
#[ignore = "slow (9 min): scripts/drills --all runs verify-partition; run with --ignored"]
fn verify_partition_drill_fences_a_target_cut_off_mid_restore() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("verify-partition", sandbox.path());
    check_common(&r, &html);
    let faults = events(&r, "fault");
    let cut = faults
        .iter()
        .find(|f| f["action"] == "partition")
        .expect("a partition");
    let target = cut["member"].as_str().unwrap();
    let ops = events(&r, "operation");
    let on = |to: &str, step: &str| {
        ops.iter().any(|o| {
            o["kind"] == "failover" && o["shoot"] == "vp2" && o["to"] == to && o["step"] == step
        })
    };
    assert!(on(target, "Restoring"), "cut off while restoring: {ops:?}");
    assert!(
        on(target, "Failed"),
        "the cut-off target's move failed: {ops:?}"
    );
    assert!(
        ops.iter().any(|o| o["kind"] == "failover"
            && o["shoot"] == "vp2"
            && o["to"] != target
            && o["step"] == "Done"),
        "vp2 restored on another member: {ops:?}"
    );
}

/// The self-hosted ring with a 20 s lease, each ringd in its own network
/// namespace: the host of pl2 is cut off and keeps serving and backing up
/// until its lease ends; the restore its successor made meanwhile is then
/// behind the bucket, is discarded and made again (the drill expects
/// ringd's log line), and every write durable when the host stopped serving
/// survives (the second loss point). Slow (about 4 minutes): `scripts/drills
/// --all` runs this drill, `cargo test -- --ignored` this test.
#[test]
#[ignore = "slow (4 min): scripts/drills --all runs partition-long-lease; run with --ignored"]
fn partition_long_lease_drill_restores_again_when_the_bucket_moved_on() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("partition-long-lease", sandbox.path());
    check_common(&r, &html);
    let losses = events(&r, "loss");
    assert_eq!(
        losses.iter().filter(|e| e["shoot"] == "pl2").count(),
        2,
        "at the cut and when the host stopped serving: {losses:?}"
    );
}

/// A whole machine of the self-hosted ring dies (ringd, node, every pod);
/// node km2, whose control plane died with it, keeps running km3's control
/// plane in pods all along. Slow (about 7 minutes): CI covers the same
/// machine death in `nodes::self_hosted` (`ringctl drill kill-machine`);
/// `scripts/drills` runs this drill, `cargo test -- --ignored` this test.
#[test]
#[ignore = "slow (7 min): scripts/drills runs kill-machine; run with --ignored"]
fn kill_machine_drill_restores_the_control_plane_as_pods_elsewhere_and_moves_it_back() {
    let _slot = ring_slot();
    let r = check_host_of_shoot_2_killed(
        "kill-machine",
        "km",
        "kill -9 of machine km1 (hosting km2): ringd",
    );
    let faults = events(&r, "fault");
    let kill = faults[0]["detail"].as_str().unwrap();
    assert!(kill.ends_with("nodes km1 with every pod on them"), "{kill}");
    let kill_t = faults[0]["t"].as_f64().unwrap();
    let km3: Vec<&serde_json::Value> = events(&r, "serving")
        .into_iter()
        .filter(|e| e["shoot"] == "km3")
        .collect();
    assert!(
        km3.iter().any(
            |e| e["t"].as_f64().unwrap() < kill_t && e["members"] == serde_json::json!(["km2"])
        ),
        "km3 in node km2's pods before the kill: {km3:?}"
    );
    assert!(
        km3.iter().all(|e| e["t"].as_f64().unwrap() < kill_t),
        "km3's pods on node km2 kept running while km2's API was away: {km3:?}"
    );
}

/// A drill killing member 1 (`<p>1`), which hosts shoot 2 as pods: the
/// kill's report starts with `kill`; the checker saw shoot 2 in `<p>1`'s pods
/// before the kill, on `<p>3` after the failover and in `<p>1`'s pods again
/// at the end; the failover and the planned move back are done; nothing ran
/// twice.
fn check_host_of_shoot_2_killed(name: &str, p: &str, kill: &str) -> serde_json::Value {
    let sandbox = Sandbox::new();
    let (r, html) = run_drill(name, sandbox.path());
    check_common(&r, &html);
    let (m1, m2, m3) = (format!("{p}1"), format!("{p}2"), format!("{p}3"));
    // shoot 2's control plane was down, then back
    let s2 = shoot(&r, &m2);
    assert!(s2["rtoSecs"].as_f64().unwrap() > 0.0, "{s2}");
    assert!(!s2["outages"].as_array().unwrap().is_empty());
    let faults = events(&r, "fault");
    let detail = faults[0]["detail"].as_str().unwrap();
    assert!(detail.starts_with(kill), "want {kill:?}: {faults:?}");
    let kill_t = faults[0]["t"].as_f64().unwrap();
    let serving: Vec<(f64, Vec<&str>)> = events(&r, "serving")
        .iter()
        .filter(|e| e["shoot"] == m2.as_str())
        .map(|e| {
            let members = e["members"].as_array().unwrap();
            let members = members.iter().map(|m| m.as_str().unwrap()).collect();
            (e["t"].as_f64().unwrap(), members)
        })
        .collect();
    assert!(
        serving
            .iter()
            .any(|(t, m)| *t < kill_t && m == &[m1.as_str()]),
        "{m2} seen in {m1}'s pods before the kill: {serving:?}"
    );
    assert!(
        serving
            .iter()
            .any(|(t, m)| *t > kill_t && m == &[m3.as_str()]),
        "{m2} seen on {m3} after the failover: {serving:?}"
    );
    assert_eq!(
        serving.last().map(|(_, m)| m.clone()),
        Some(vec![m1.as_str()]),
        "{m2} back in {m1}'s pods: {serving:?}"
    );
    let ops = events(&r, "operation");
    assert!(
        ops.iter().any(|o| o["kind"] == "failover"
            && o["shoot"] == m2.as_str()
            && o["from"] == m1.as_str()
            && o["to"] == m3.as_str()
            && o["step"] == "Done"),
        "{ops:?}"
    );
    assert!(
        ops.iter().any(|o| o["kind"] == "migration"
            && o["shoot"] == m2.as_str()
            && o["to"] == m1.as_str()
            && o["step"] == "Done"),
        "back onto the pods by a planned migration: {ops:?}"
    );
    r
}

/// Off the pods onto a local seed, and back onto the pods. Ignored by
/// default to keep CI under its hour: `kubernetes_seed::failover` covers the
/// same failovers with real processes; `scripts/drills` runs this drill.
#[test]
#[ignore = "slow (3 min), covered by kubernetes_seed::failover: scripts/drills runs kill-kubernetes-seed; run with --ignored"]
fn kill_kubernetes_seed_drill_fails_over_off_the_pods_and_back() {
    let _slot = ring_slot();
    let r = check_host_of_shoot_2_killed("kill-kubernetes-seed", "kk", "kill -9 kk1");
    let faults = events(&r, "fault");
    let kill = faults[0]["detail"].as_str().unwrap();
    assert!(kill.contains("its node and every pod on it"), "{kill}");
}

/// From one Kubernetes seed's pods to another's (failover from the bucket),
/// and back by a planned migration between the two seed clusters. Ignored
/// by default to keep CI under its hour: `kubernetes_seed::migration` and
/// `kubernetes_seed::failover` cover both moves; `scripts/drills --all` runs it.
#[test]
#[ignore = "slow (3 min), covered by kubernetes_seed tests: scripts/drills --all runs kubernetes-to-kubernetes; run with --ignored"]
fn kubernetes_to_kubernetes_drill_fails_over_and_moves_between_seed_clusters() {
    let _slot = ring_slot();
    let r = check_host_of_shoot_2_killed("kubernetes-to-kubernetes", "kt", "kill -9 kt1");
    let faults = events(&r, "fault");
    let kill = faults[0]["detail"].as_str().unwrap();
    assert!(kill.contains("its node and every pod on it"), "{kill}");
}

#[test]
fn full_ring_dr_drill_restores_every_shoot_from_the_bucket() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let (r, html) = run_drill("full-ring-dr", sandbox.path());
    check_common(&r, &html);
    for name in ["dr1", "dr2", "dr3"] {
        let s = shoot(&r, name);
        assert!(
            s["rtoSecs"].as_f64().unwrap() > 0.0,
            "every shoot was down: {s}"
        );
    }
    let faults = events(&r, "fault");
    assert_eq!(faults.len(), 2, "{faults:?}");
    let restore = faults[1]["detail"].as_str().unwrap();
    assert!(restore.contains("restore --from-bucket"), "{faults:?}");
    // bootstrap sealed the bucket with a key of its own; the restore needed the copy
    assert!(restore.contains("(sealed: --bucket-key"), "{faults:?}");
    // the self-hosted ring comes back self-hosted: each control plane in pods
    // on its predecessor's node, the last place anything served it
    for (name, host) in [("dr1", "dr3"), ("dr2", "dr1"), ("dr3", "dr2")] {
        let moved = format!("{name} into pods on {host}");
        assert!(restore.contains(&moved), "want {moved:?} in {restore:?}");
        let last = events(&r, "serving")
            .into_iter()
            .rfind(|e| e["shoot"] == name)
            .map(|e| e["members"].clone());
        assert_eq!(last, Some(serde_json::json!([host])), "{name}");
    }
    assert_eq!(events(&r, "loss").len(), 3);
}

/// SIGTERM to `ringctl drill run` mid-drill stops and removes its throwaway ring
/// (every ringd and control plane) instead of leaving it running.
#[test]
fn an_interrupted_drill_leaves_no_ring_behind() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let _ = binaries();
    let mut child = Command::new(ringctl())
        .args(["drill", "run"])
        .arg(drill_file("kill-seed"))
        .arg("--report-dir")
        .arg(sandbox.path())
        // the run's ring goes under the sandbox, so its processes mention it
        .env("TMPDIR", sandbox.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let ringd_running = || {
        scenarios::procs::processes_mentioning(&sandbox.path().to_string_lossy())
            .iter()
            .any(|(_, _, cmd)| cmd.contains("ringd.yaml"))
    };
    while !ringd_running() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "ringctl drill run ended before its ring started"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the drill's ring did not start within 180s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ringctl did not exit within 60s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left = sandbox.wait_no_processes(Duration::from_secs(20));
    assert!(
        left.is_empty(),
        "left running after the interrupt: {left:?}"
    );
    let dirs: Vec<_> = std::fs::read_dir(sandbox.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ring-drill-"))
        .map(|e| e.path())
        .collect();
    assert!(dirs.is_empty(), "the run's dir was not removed: {dirs:?}");
}

/// Bad input to `ringctl drill run` and `ringctl restore` gets a clear error
/// naming what is wrong (exit code 1, no panic), before any process starts.
#[test]
fn bad_drill_files_and_restore_arguments_get_clear_errors() {
    let sandbox = Sandbox::new();
    let bad = sandbox.path().join("bad.yaml");
    let good = std::fs::read_to_string(drill_file("kill-seed")).unwrap();
    let cases = [
        (
            good.replace("seed: 1001", "seed: 1001\nchaos: max"),
            "unknown field `chaos`",
        ),
        (
            good.replace("at: 8s", "at: 8 seconds"),
            "faults[0]: \"8 seconds\": unknown unit",
        ),
        (
            good.replace("{killSeed: {target: {hostOf: 2}}}", "{meteorStrike: {}}"),
            "unknown variant `meteorStrike`",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&bad, text).unwrap();
        let out = ringctl_cmd(
            [
                "drill".as_ref(),
                "run".as_ref(),
                bad.as_os_str(),
                "--report-dir".as_ref(),
                sandbox.path().as_os_str(),
            ],
            &[],
        );
        let err = expect_clean_failure(&out);
        assert!(
            err.contains(want) && err.contains("bad.yaml"),
            "want {want:?} in {err}"
        );
    }
    let dir = sandbox.path().join("ring");
    let out = ringctl_cmd(
        [
            "restore".as_ref(),
            "--from-bucket".as_ref(),
            "ftp://somewhere".as_ref(),
            "--ring-dir".as_ref(),
            dir.as_os_str(),
        ],
        &[],
    );
    assert!(expect_clean_failure(&out)
        .contains("--from-bucket: \"ftp://somewhere\": unsupported scheme"));
    let out = ringctl_cmd(
        [
            "restore".as_ref(),
            "--from-bucket".as_ref(),
            "file:///nonexistent-bucket".as_ref(),
            "--ring-dir".as_ref(),
            dir.as_os_str(),
        ],
        &[],
    );
    let err = expect_clean_failure(&out);
    assert!(
        err.contains("give the lost ring's config (--config ring.yaml"),
        "{err}"
    );
    assert!(!dir.join("ring.yaml").exists(), "nothing written");
}
