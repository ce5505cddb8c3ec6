//! Self-hosting: `selfHosting: {members: [m3]}` added to a running 3-member
//! ring with nodes makes `ringctl bootstrap` move m1's control plane (which m3
//! hosted as processes) into pods on m3's own node, in shoot m3, by planned
//! migrations: off m3, m3's seed switched to its shoot, back onto m3; the pods
//! keep serving and backing up while shoot m3's own API is stopped; after `ringctl down`,
//! bootstrap brings them back.

use std::path::Path;
use std::time::Duration;

use ring_tests::procs::{pod_control_plane, processes};
use ring_tests::*;

use super::NodesGuard;

/// A process stopped with SIGSTOP until dropped (SIGCONT also on a failure).
struct Stopped(nix::unistd::Pid);

impl Stopped {
    fn new(pid: u32) -> Self {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// The `ringctl status -o json` of the ring in `dir`.
fn status(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&ringctl_in(dir, &["status", "-o", "json"])).expect("status json")
}

/// `ringctl status`'s control planes: (shoot, as, node), sorted by shoot.
fn hosting(dir: &Path) -> Vec<(String, String, String)> {
    let s = status(dir);
    let rows = s["controlPlanes"].as_array().cloned().unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let mut out: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (text(&r["shoot"]), text(&r["as"]), text(&r["node"])))
        .collect();
    out.sort();
    out
}

/// Pods of namespace `ns` in the shoot `kubeconfig` reaches: (name, node, ready).
fn pods(kubeconfig: &Path, ns: &str) -> Vec<(String, String, bool)> {
    let out = kubectl(kubeconfig, &["get", "pods", "-n", ns, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("pods json");
    v["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                ready,
            )
        })
        .collect()
}

/// The last revision the newest delta in `dir` (a shoot's prefix in a file
/// bucket: `delta-<first>-<last>-<time>.zst`) holds; 0 without deltas.
fn newest_delta(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix("delta-")?.split('-').nth(1)?.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

/// Creates ConfigMap `name` in `shoot` and waits (`what`, up to `timeout`)
/// until a delta in the ring's file bucket holds it.
async fn write_until_backed_up(dir: &Path, shoot: &str, name: &str, what: &str, timeout: Duration) {
    let kubeconfig = dir.join("kubeconfigs").join(format!("{shoot}.kubeconfig"));
    let resource_version = "jsonpath={.metadata.resourceVersion}";
    let written = kubectl(
        &kubeconfig,
        &["create", "configmap", name, "-o", resource_version],
    );
    let revision: u64 = written.trim().parse().expect("resourceVersion");
    let bucket = dir.join("bucket").join(shoot);
    wait_for(what, timeout, || async {
        (newest_delta(&bucket) >= revision).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_pivots_its_successor_into_pods_on_its_own_node_without_losing_a_write() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let _nodes = NodesGuard(layout.clone());
    let config = ring_config_with(sandbox.path(), 3, "nodes: {perMember: 1}");
    ringctl_in(
        &dir,
        &["bootstrap", "--config", &config.display().to_string()],
    );
    let kc = |s: &str| dir.join("kubeconfigs").join(format!("{s}.kubeconfig"));
    let m1_kubeconfig = std::fs::read(kc("m1")).unwrap();
    for i in 0..20 {
        kubectl(&kc("m1"), &["create", "configmap", &format!("before-{i}")]);
    }
    // m1's control plane runs as processes on m3's local seed
    // (its pods' etcd has the same token, with its data in the seed's dir on the node)
    let members = dir.join("members").display().to_string();
    let local_m1 = || processes("etcd", &["--initial-cluster-token=ring-m1", &members]);
    assert!(!local_m1().is_empty(), "m1's etcd runs as a process first");

    // self-hosting added to the stored config; bootstrap resumes the live ring
    let stored = dir.join("ring.yaml");
    let mut text = std::fs::read_to_string(&stored).unwrap();
    text.push_str("selfHosting:\n  members: [m3]\n");
    std::fs::write(&stored, text).unwrap();
    let ring_dir = dir.display().to_string();
    let out = ringctl_cmd(["bootstrap", "--ring-dir", ring_dir.as_str()], &[]);
    expect_success(&out);
    let progress = String::from_utf8_lossy(&out.stderr);
    for step in [
        "move m1 off m3 to m2",
        "make m3 host as pods",
        "move m1 into pods on m3",
    ] {
        assert!(
            progress.contains(step),
            "bootstrap did not {step}:\n{progress}"
        );
    }

    let s = status(&dir);
    let placement = s["placements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["shoot"] == "m1")
        .cloned()
        .unwrap();
    assert_eq!(placement["host"], "m3", "{placement}");
    let moves: Vec<&serde_json::Value> = s["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["kind"] == "migration" && op["shoot"] == "m1")
        .collect();
    assert_eq!(moves.len(), 2, "{moves:?}");
    for op in &moves {
        assert_eq!(op["step"], "Done", "{op}");
        assert!(op["detail"].as_str().unwrap().contains("HashKV"), "{op}");
    }

    // in shoot m3, on node m3: m1's etcd, kube-apiserver, controller-manager, scheduler
    whole_control_plane_ready_in_pods(&kc("m3"), "m1", "m3").await;
    assert!(!pod_control_plane("test", "m1").is_empty());
    let row = |s: &str, a: &str, n: &str| (s.to_string(), a.to_string(), n.to_string());
    assert_eq!(
        hosting(&dir),
        [
            row("m1", "pods", "m3"),
            row("m2", "processes", ""),
            row("m3", "processes", "")
        ]
    );
    assert!(
        local_m1().is_empty(),
        "m1's local etcd is left: {:?}",
        local_m1()
    );

    // the kubeconfig m1's users got still works and nothing acknowledged is lost
    assert_eq!(std::fs::read(kc("m1")).unwrap(), m1_kubeconfig);
    let names = kubectl(&kc("m1"), &["get", "configmaps", "-o", "name"]);
    for i in 0..20 {
        assert!(
            names.lines().any(|l| l == format!("configmap/before-{i}")),
            "before-{i} lost:\n{names}"
        );
    }
    // m1's own node still reaches its API, now in pods
    wait_for(
        "node m1 Ready in shoot m1",
        Duration::from_secs(60),
        || async {
            let ready = kubectl(
                &kc("m1"),
                &[
                    "get",
                    "node",
                    "m1",
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
                ],
            );
            (ready == "True").then_some(())
        },
    )
    .await;

    // shoot m3's own API away (its kube-apiserver, a process on m2, stopped
    // for two lease lengths): the guards of m1's pods read ringd's lease file
    // on the node, not the Lease in shoot m3, so m1 keeps serving
    let m3_dir = dir.join("members/m2/seed/shoots/m3").display().to_string();
    let m3_api = processes("kube-apiserver", &[&m3_dir]);
    assert_eq!(m3_api.len(), 1, "shoot m3's kube-apiserver: {m3_api:?}");
    let stopped = Stopped::new(m3_api[0]);
    let until = std::time::Instant::now() + Duration::from_secs(12);
    while std::time::Instant::now() < until {
        kubectl(&kc("m1"), &["get", "--raw", "/readyz"]);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // past any lease read from shoot m3 before the stop, m1's backup sidecar
    // (its lease from the node too) still uploads what m1 acknowledges
    let what = "a delta of m1 with the write made while shoot m3's API is stopped";
    write_until_backed_up(
        &dir,
        "m1",
        "while-m3-stopped",
        what,
        Duration::from_secs(30),
    )
    .await;
    drop(stopped);
    wait_for(
        "every shoot ready again after shoot m3's API came back",
        Duration::from_secs(60),
        || async {
            let s = status(&dir);
            let placements = s["placements"].as_array().cloned().unwrap_or_default();
            placements.iter().all(|p| p["ready"] == true).then_some(())
        },
    )
    .await;

    // a rerun finds the ring complete
    let again = ringctl_in(&dir, &["bootstrap"]);
    assert!(again.contains("was already up"), "{again}");

    // stopped and started again: the processes first, then the nodes, then
    // m1's control plane in pods again on node m3, with its data
    ringctl_in(&dir, &["down"]);
    assert!(
        pod_control_plane("test", "m1").is_empty(),
        "pods left after down"
    );
    ringctl_in(&dir, &["bootstrap"]);
    assert!(!pod_control_plane("test", "m1").is_empty());
    assert!(local_m1().is_empty(), "m1 came back as processes");
    let names = kubectl(&kc("m1"), &["get", "configmaps", "-o", "name"]);
    assert!(names.contains("configmap/before-19"), "{names}");
}

/// The closed ring loses ringd m1 (SIGKILL): m2's pods on node m1 fence by
/// their lease file, the ring restores m2 from the bucket into pods on
/// another member's node, with every write the bucket held; a bootstrap
/// rerun starts ringd m1 again and moves m2 back into pods on node m1.
async fn failover_and_return(dir: &Path) {
    let kc = dir.join("kubeconfigs/m2.kubeconfig");
    // m3's control plane in pods on node m2: they must outlive m2's API.
    // Taken once they settled after the cold start (a pod replaced out of
    // back-off goes on for a while), and before the write the bucket must
    // hold, so that m2's restored API knows these very pods
    let m3_pods = wait_for(
        "m3's four pods on node m2 settled and Ready",
        Duration::from_secs(120),
        || async {
            let now = pods(&kc, "shoot--test--m3");
            (now.len() == 4
                && now.iter().all(|(_, _, ready)| *ready)
                && whole_control_plane_in_pods(&kc, "m3", "m2").is_ok())
            .then_some(now)
        },
    )
    .await;
    let what = "m2's writes in the bucket";
    write_until_backed_up(dir, "m2", "before-kill", what, Duration::from_secs(60)).await;
    // machine m1 dies as a whole: its ringd, node m1 and every pod on it
    // (m2's control plane among them)
    let said = ringctl_in(dir, &["drill", "kill-machine", "m1"]);
    assert!(
        said.contains("killed machine m1: ringd ")
            && said.contains("nodes: m1 with every pod on them"),
        "{said}"
    );
    let layout = bootstrap::RingLayout {
        dir: dir.to_path_buf(),
    };
    assert_eq!(bootstrap::nodes::running_pid(&layout, "m1"), None);
    wait_for(
        "m2 failed over into pods on another node and ready",
        Duration::from_secs(240),
        || async {
            let s = status(dir);
            let m2 = s["placements"]
                .as_array()?
                .iter()
                .find(|p| p["shoot"] == "m2")?
                .clone();
            (m2["host"] != "m1" && m2["ready"] == true).then_some(())
        },
    )
    .await;
    let row = hosting(dir).into_iter().find(|r| r.0 == "m2").unwrap();
    assert_eq!(row.1, "pods", "{row:?}");
    assert_ne!(row.2, "m1", "{row:?}");
    // node m2 kept its pods while its API was away, and re-attached
    let config = layout.read_config().unwrap().unwrap();
    wait_for("node m2 Ready again", Duration::from_secs(120), || async {
        let nodes = bootstrap::nodes::report(&layout, &config);
        nodes
            .iter()
            .any(|n| n.node == "m2" && n.ready)
            .then_some(())
    })
    .await;
    // the same pods (kubelet kept them; none recreated), Ready once the
    // node controller has seen node m2 again
    wait_for(
        "m3's pods on node m2 the same pods, Ready",
        Duration::from_secs(120),
        || async { (pods(&kc, "shoot--test--m3") == m3_pods).then_some(()) },
    )
    .await;
    let names = kubectl(&kc, &["get", "configmaps", "-o", "name"]);
    for name in ["kept-0", "kept-4", "before-kill"] {
        assert!(
            names.lines().any(|l| l == format!("configmap/{name}")),
            "{name} lost in the failover:\n{names}"
        );
    }
    // the machine comes back: bootstrap starts node m1 and ringd m1, and m2
    // moves back into pods on node m1 (by bootstrap's plan, or by the ring
    // itself once m1 is up for timing.relinkAfterMs: bootstrap then follows)
    bootstrap_bounded(&["--ring-dir", &dir.display().to_string()]);
    let row = hosting(dir).into_iter().find(|r| r.0 == "m2").unwrap();
    assert_eq!(row, ("m2".into(), "pods".into(), "m1".into()));
}

/// `ringctl bootstrap ARGS`, which must succeed within 10 minutes (six
/// migrations for a closed ring on 2 cores).
fn bootstrap_bounded(args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(ringctl());
    cmd.arg("bootstrap").args(args);
    let out = run_bounded(&mut cmd, Duration::from_secs(600));
    expect_success(&out);
    out
}

/// Waits (at most 90 s) until a Ready pod of each control plane component of
/// `shoot` runs on node `node`. A move is done once kube-apiserver answers on
/// its target; controller-manager and scheduler pods replaced there after a
/// back-off start right after.
async fn whole_control_plane_ready_in_pods(kubeconfig: &Path, shoot: &str, node: &str) {
    wait_ok(
        &format!("{shoot}'s whole control plane Ready in pods on node {node}"),
        Duration::from_secs(90),
        || async { whole_control_plane_in_pods(kubeconfig, shoot, node) },
    )
    .await
}

/// Whether a Ready pod of each control plane component of `shoot` runs on
/// node `node` in the shoot `kubeconfig` reaches.
fn whole_control_plane_in_pods(kubeconfig: &Path, shoot: &str, node: &str) -> Result<(), String> {
    let in_pods = pods(kubeconfig, &format!("shoot--test--{shoot}"));
    for component in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        let found = in_pods
            .iter()
            .any(|(name, n, ready)| name.starts_with(component) && n == node && *ready);
        if !found {
            return Err(format!(
                "no Ready {component} pod of {shoot} on node {node}: {in_pods:?}"
            ));
        }
    }
    Ok(())
}

/// The closed ring: every member hosts its successor as pods on its own node
/// (m1's control plane in shoot m3, m2's in m1, m3's in m2), bootstrapped
/// from nothing; after `ringctl down` nothing can serve until bootstrap
/// cold-starts one control plane as processes from its pods' data on the
/// node, and pivots it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_ring_hosts_every_control_plane_in_pods_and_cold_starts_after_down() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let _nodes = NodesGuard(layout.clone());
    let config = ring_config_with(
        sandbox.path(),
        3,
        "nodes: {perMember: 1}\nselfHosting: {members: [m1, m2, m3]}",
    );
    let out = bootstrap_bounded(&[
        "--config",
        &config.display().to_string(),
        "--ring-dir",
        &dir.display().to_string(),
    ]);
    let progress = String::from_utf8_lossy(&out.stderr);
    // the last switch: m3's control plane waits in pods on m1, not as processes
    assert!(
        progress.contains("move m3 off m2 to m1"),
        "bootstrap did not move m3 into pods on m1 while m2 switched:\n{progress}"
    );
    let kc = |s: &str| dir.join("kubeconfigs").join(format!("{s}.kubeconfig"));
    let hosts = [("m1", "m3"), ("m2", "m1"), ("m3", "m2")];
    let s = status(&dir);
    for (shoot, host) in hosts {
        let p = s["placements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["shoot"] == shoot)
            .cloned()
            .unwrap();
        assert_eq!(p["host"], host, "{p}");
        whole_control_plane_ready_in_pods(&kc(host), shoot, host).await;
    }
    let row = |s: &str, n: &str| (s.to_string(), "pods".to_string(), n.to_string());
    assert_eq!(
        hosting(&dir),
        [row("m1", "m3"), row("m2", "m1"), row("m3", "m2")],
        "ringctl status names the node of each control plane"
    );
    // certificates: each member reports the PKI of the control plane it runs
    // in pods, ringctl adds every node's client certificates; all fresh
    let out = ringctl_in(&dir, &["pki", "check", "-o", "json"]);
    let check: serde_json::Value = serde_json::from_str(&out).expect("json check");
    let certs = check["certificates"].as_array().unwrap();
    for (shoot, host) in hosts {
        let owner = format!("shoot {shoot}");
        let api = certs
            .iter()
            .find(|c| c["owner"] == owner.as_str() && c["name"] == "kube-apiserver");
        assert_eq!(
            api.map(|c| c["checkedBy"].clone()),
            Some(serde_json::json!(host)),
            "{check}"
        );
        let kubelet = certs.iter().any(|c| {
            let name = c["name"].as_str().unwrap_or_default();
            c["owner"] == owner.as_str() && name.starts_with("node ") && name.ends_with(" kubelet")
        });
        assert!(kubelet, "no node certificate of {shoot}: {check}");
    }
    let members = dir.join("members").display().to_string();
    let local_etcd = || processes("etcd", &["--initial-cluster-token=ring-", &members]);
    assert!(
        local_etcd().is_empty(),
        "control planes left as processes: {:?}",
        local_etcd()
    );
    let kubeconfigs: Vec<Vec<u8>> = ["m1", "m2", "m3"]
        .map(|s| std::fs::read(kc(s)).unwrap())
        .into();
    for shoot in ["m1", "m2", "m3"] {
        for i in 0..5 {
            kubectl(&kc(shoot), &["create", "configmap", &format!("kept-{i}")]);
        }
    }
    failover_and_return(&dir).await;

    // stopped: no API anywhere; bootstrap starts m2 as processes on m1 from
    // its pods' data, the rest follows, m2 goes back into pods
    let ops_before = status(&dir)["operations"].as_array().unwrap().len() as u64;
    ringctl_in(&dir, &["down"]);
    for (shoot, _) in hosts {
        assert!(
            pod_control_plane("test", shoot).is_empty(),
            "{shoot}'s pods left after down"
        );
    }
    let out = bootstrap_bounded(&["--ring-dir", &dir.display().to_string()]);
    let progress = String::from_utf8_lossy(&out.stderr);
    for step in [
        "cold start: m1 hosts m2 as processes",
        "move m2 off m1 to m3",
        "make m1 host as pods",
        "move m2 into pods on m1",
    ] {
        assert!(
            progress.contains(step),
            "bootstrap did not {step}:\n{progress}"
        );
    }
    for (shoot, host) in hosts {
        whole_control_plane_ready_in_pods(&kc(host), shoot, host).await;
        let names = kubectl(&kc(shoot), &["get", "configmaps", "-o", "name"]);
        for i in 0..5 {
            assert!(
                names.lines().any(|l| l == format!("configmap/kept-{i}")),
                "{shoot}'s kept-{i} lost:\n{names}"
            );
        }
    }
    assert!(
        local_etcd().is_empty(),
        "control planes left as processes: {:?}",
        local_etcd()
    );
    // the cold start kept the data where it was: nothing failed over from the
    // bucket (older than the pods' data) while its ringd switched seeds
    let s = status(&dir);
    let failovers: Vec<&serde_json::Value> = s["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|op| op["id"].as_u64() >= Some(ops_before) && op["kind"] != "migration")
        .collect();
    assert!(failovers.is_empty(), "{failovers:?}");
    for (i, shoot) in ["m1", "m2", "m3"].iter().enumerate() {
        assert_eq!(
            std::fs::read(kc(shoot)).unwrap(),
            kubeconfigs[i],
            "{shoot}'s kubeconfig changed"
        );
    }
}
