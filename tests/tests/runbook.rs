//! The disaster-recovery runbook (docs/src/operations/disaster-recovery.md)
//! run as written: every ```bash block of each case, in order, with `bash
//! -euo pipefail`, the page's variables pointing into this test's sandbox.
//! The test plays each disaster (a machine killed, the ring's state dir
//! removed, an object of the bucket corrupted) and checks what the runbook
//! promises afterwards through the ring's status and kubectl.

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ring_tests::*;
use ringd::state::OperationStep;
use ringd::status::RingStatus;

const PAGE: &str = "docs/src/operations/disaster-recovery.md";
const BEFORE: &str = "## Before a disaster";
const MACHINE: &str = "## A machine is lost";
const RING: &str = "## The whole ring is lost";
const BUCKET: &str = "## The bucket is damaged";

/// The page: the variables it defines before its first `##` heading, and
/// the ```bash blocks under each `##` heading, in order.
struct Runbook {
    variables: BTreeSet<String>,
    cases: BTreeMap<String, Vec<String>>,
}

impl Runbook {
    fn read() -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PAGE);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut heading: Option<String> = None;
        let mut preamble = Vec::new();
        let mut cases: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut block: Option<String> = None;
        let mut fenced = false;
        for line in text.lines() {
            if let Some(b) = block.as_mut() {
                if line.trim_start().starts_with("```") {
                    let b = block.take().unwrap();
                    match &heading {
                        Some(h) => cases.entry(h.clone()).or_default().push(b),
                        None => preamble.push(b),
                    }
                } else {
                    b.push_str(line);
                    b.push('\n');
                }
                continue;
            }
            if line.trim_start().starts_with("```") {
                // only ```bash blocks are commands; anything else (output) is skipped
                if !fenced && line.trim() == "```bash" {
                    block = Some(String::new());
                } else {
                    fenced = !fenced;
                }
                continue;
            }
            if !fenced && line.starts_with("## ") {
                heading = Some(line.trim_end().to_string());
            }
        }
        assert!(block.is_none() && !fenced, "{PAGE}: an unclosed code block");
        let variables = preamble
            .iter()
            .flat_map(|b| b.lines())
            .filter_map(|l| l.trim().strip_prefix("export "))
            .filter_map(|l| l.split_once('=').map(|(name, _)| name.to_string()))
            .collect();
        Runbook { variables, cases }
    }

    /// The blocks of the case whose heading starts with `heading`.
    fn case(&self, heading: &str) -> &[String] {
        let found: Vec<_> = self
            .cases
            .iter()
            .filter(|(h, _)| h.starts_with(heading))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{PAGE}: want one section {heading:?} with commands, sections: {:?}",
            self.cases.keys().collect::<Vec<_>>()
        );
        found[0].1
    }
}

/// The upper-case variables a block reads (`$NAME`, `${NAME...}`); lower-case
/// names are the block's own.
fn variables_used(block: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = block.as_bytes();
    for (i, _) in block.match_indices('$') {
        let start = i + 1 + usize::from(bytes.get(i + 1) == Some(&b'{'));
        let name: String = block[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && name.chars().all(|c| !c.is_ascii_lowercase()) {
            out.insert(name);
        }
    }
    out
}

/// Values of the page's variables for one case.
type Vars = BTreeMap<&'static str, String>;

/// Runs `block` as the page says (bash -euo pipefail) with `vars`, ringctl and
/// the Kubernetes binaries on PATH; prints what it said.
fn run_block(what: &str, block: &str, vars: &Vars) -> Output {
    let bins = [
        ringctl().parent().unwrap().to_path_buf(),
        kubectl_path().parent().unwrap().to_path_buf(),
    ];
    let path = std::env::join_paths(bins.iter().cloned().chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .unwrap();
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", block])
        .env("PATH", path);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    eprintln!("--- {what}:\n{block}");
    let out = run_bounded(&mut cmd, Duration::from_secs(600));
    eprintln!(
        "--- {what} exited {}; stdout:\n{}--- stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// stdout of a block that must succeed.
fn run_ok(what: &str, block: &str, vars: &Vars) -> String {
    let out = run_block(what, block, vars);
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status(dir: &Path) -> RingStatus {
    try_status(dir).unwrap_or_else(|e| panic!("ringctl status: {e}"))
}

/// The status, or why not (a member between lives does not answer).
fn try_status(dir: &Path) -> Result<RingStatus, String> {
    let out = ringctl_cmd(
        [
            "status".as_ref(),
            "-o".as_ref(),
            "json".as_ref(),
            "--ring-dir".as_ref(),
            dir.as_os_str(),
        ],
        &[],
    );
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

fn host_of(s: &RingStatus, shoot: &str) -> Option<String> {
    s.placements
        .iter()
        .find(|p| p.shoot == shoot)
        .map(|p| p.host.clone())
}

/// Creates ConfigMap `name` in `shoot` and waits (bounded) until the ring
/// reports its revision durable in the bucket; returns the revision.
async fn write_durable(dir: &Path, shoot: &str, name: &str) -> u64 {
    let kc = dir.join("kubeconfigs").join(format!("{shoot}.kubeconfig"));
    kubectl(&kc, &["create", "configmap", name, "--from-literal=at=1"]);
    let rv: u64 = kubectl(
        &kc,
        &[
            "get",
            "configmap",
            name,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    )
    .trim()
    .parse()
    .expect("a resourceVersion is an etcd revision");
    wait_ok(
        &format!("{shoot}'s revision {rv} ({name}) durable in the bucket"),
        Duration::from_secs(60),
        || {
            let s = try_status(dir);
            async move {
                let s = s?;
                let p = s.placements.iter().find(|p| p.shoot == shoot);
                match p.and_then(|p| p.last_backup_revision) {
                    Some(r) if r >= rv => Ok(rv),
                    other => Err(format!("durable: {other:?}")),
                }
            }
        },
    )
    .await
}

/// Whether ConfigMap `name` exists in the shoot `kubeconfig` reaches
/// (panics when the API does not answer).
fn has_configmap(kubeconfig: &Path, name: &str) -> bool {
    let mut cmd = Command::new(kubectl_path());
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "configmap", name, "-o", "name"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || stderr.contains("NotFound"),
        "kubectl get configmap {name}: {stderr}"
    );
    out.status.success()
}

/// `ringctl down`, then the state dir gone: only the bucket and the copies
/// survive. It is renamed rather than removed, so a failed run keeps the
/// lost ring's logs.
fn lose_ring(sandbox: &Sandbox, dir: &Path) {
    let down = ringctl_in(dir, &["down"]);
    assert!(down.contains("stopped"), "{down}");
    let left = sandbox.wait_no_processes_matching(dir, Duration::from_secs(20));
    assert!(left.is_empty(), "processes left after down: {left:?}");
    let mut lost = dir.as_os_str().to_owned();
    lost.push(".lost");
    std::fs::rename(dir, lost).unwrap();
}

/// Waits until an operation on m2 (a migration or a failover) is `Done` and
/// m2's host passes `host_ok`.
async fn await_m2_moved(
    dir: &Path,
    reason: &str,
    migration: bool,
    host_ok: impl Fn(Option<&str>) -> bool,
) {
    wait_ok(reason, Duration::from_secs(120), || {
        let moved = try_status(dir).and_then(|s| {
            let done = s.operations.iter().any(|o| {
                o.is_migration() == migration && o.shoot() == "m2" && o.step == OperationStep::Done
            });
            let host = host_of(&s, "m2");
            let ready = s
                .placements
                .iter()
                .any(|p| p.shoot == "m2" && p.ready == Some(true));
            (done && ready && host_ok(host.as_deref()))
                .then_some(())
                .ok_or(format!("m2 on {host:?}, operations {:?}", s.operations))
        });
        async move { moved }
    })
    .await;
}

/// Asserts the status printed a `kind` row for m2 that is `Done` on `target`.
fn assert_row_done(out: &str, kind: &str, target: &str) {
    let row = out
        .lines()
        .find(|l| l.contains(kind) && l.contains(" m2 "))
        .unwrap_or_else(|| panic!("no {kind} of m2 in the status:\n{out}"));
    assert!(row.contains(target) && row.contains("Done"), "{row}");
}

/// One backup object's name: (kind, first, last, epoch).
fn parse_object(name: &str) -> Option<(&str, u64, u64, u64)> {
    let mut parts = name.split(['-', '.']);
    let kind = parts.next()?;
    let first = parts.next()?.parse().ok()?;
    let last = if kind == "delta" {
        parts.next()?.parse().ok()?
    } else {
        first
    };
    let _time = parts.next()?;
    let epoch = parts
        .next()
        .and_then(|e| e.strip_prefix('e'))
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    matches!(kind, "full" | "delta").then_some((kind, first, last, epoch))
}

/// Flips every bit of the byte in the middle of `path`.
fn corrupt(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disaster_recovery_runbook_works_as_written() {
    let _slot = ring_slot();
    let page = Runbook::read();
    let sandbox = Sandbox::new();
    let root = sandbox.path().to_path_buf();
    let bucket_dir = root.join("bucket");
    // the bucket outside the state dir, as the runbook asks; a short failure
    // window and lease, and the returning member re-linked 5 s after it is
    // back (60 s by default), keep the drill quick
    let config = ring_config_with(
        &root,
        3,
        &format!(
            "bucket: file://{}\ntiming: {{electionTimeoutMs: 750, failureWindowMs: 2000, leaseMs: 4000, relinkAfterMs: 5000}}",
            bucket_dir.display()
        ),
    );
    let first_dir = root.join("ring");
    ringctl_in(
        &first_dir,
        &["bootstrap", "--config", &config.display().to_string()],
    );

    let mut vars: Vars = BTreeMap::from([
        ("RING_DIR", first_dir.display().to_string()),
        ("BUCKET", format!("file://{}", bucket_dir.display())),
        (
            "KEY_COPY",
            root.join("safe/bucket.key").display().to_string(),
        ),
        (
            "CONFIG_COPY",
            root.join("safe/ring.yaml").display().to_string(),
        ),
        ("SHOOTS", "m1 m2 m3".into()),
        ("SHOOT", "m2".into()),
        ("QUARANTINE", root.join("quarantine").display().to_string()),
        ("DAMAGED", String::new()),
    ]);
    // the page defines exactly what the test sets, and its commands read
    // nothing else
    let given: BTreeSet<String> = vars.keys().map(|k| k.to_string()).collect();
    assert_eq!(page.variables, given, "{PAGE}: the variables at its top");
    for case in [BEFORE, MACHINE, RING, BUCKET] {
        for block in page.case(case) {
            let unknown: Vec<_> = variables_used(block).difference(&given).cloned().collect();
            assert!(unknown.is_empty(), "{case}: {unknown:?} in\n{block}");
        }
    }
    let (key_copy, config_copy) = (root.join("safe/bucket.key"), root.join("safe/ring.yaml"));

    // before a disaster: the copies made, every shoot's backup verified with the copy
    let before = page.case(BEFORE);
    let mut said = String::new();
    for (i, block) in before.iter().enumerate() {
        said += &run_ok(&format!("{BEFORE} {i}"), block, &vars);
    }
    assert_eq!(
        std::fs::read(&key_copy).unwrap(),
        std::fs::read(first_dir.join("bucket.key")).unwrap()
    );
    assert_eq!(
        std::fs::read(&config_copy).unwrap(),
        std::fs::read(first_dir.join("ring.yaml")).unwrap()
    );
    assert_eq!(said.matches("objects are sound").count(), 3, "{said}");

    // a machine is lost: m1, which hosts m2's control plane
    let m2 = |dir: &Path| dir.join("kubeconfigs/m2.kubeconfig");
    // a failover keeps what the bucket held; later writes may be lost
    write_durable(&first_dir, "m2", "before-machine-loss").await;
    assert_eq!(host_of(&status(&first_dir), "m2").as_deref(), Some("m1"));
    let killed = ringctl_in(&first_dir, &["drill", "kill-machine", "m1"]);
    assert!(killed.contains("killed machine m1"), "{killed}");
    let machine = page.case(MACHINE);
    assert_eq!(machine.len(), 3, "{MACHINE}: status, bring back, status");
    await_m2_moved(
        &first_dir,
        "the ring to fail m2 over off the lost m1",
        false,
        |host| host != Some("m1"),
    )
    .await;
    let out = run_ok(&format!("{MACHINE} 0"), &machine[0], &vars);
    assert_row_done(&out, "failover", "m3");
    assert!(
        has_configmap(&m2(&first_dir), "before-machine-loss"),
        "m2's data survived the failover"
    );
    let out = run_ok(&format!("{MACHINE} 1"), &machine[1], &vars);
    assert!(!out.is_empty(), "bootstrap says what it did");
    await_m2_moved(
        &first_dir,
        "the ring to move m2 back onto the returned m1",
        true,
        |host| host == Some("m1"),
    )
    .await;
    let out = run_ok(&format!("{MACHINE} 2"), &machine[2], &vars);
    assert_row_done(&out, "migration", "m1");
    assert!(has_configmap(&m2(&first_dir), "before-machine-loss"));

    // the whole ring is lost; it comes back into another state dir, so the
    // config copy names a key file that no longer exists
    write_durable(&first_dir, "m2", "before-ring-loss").await;
    let old_kubeconfig = root.join("safe/m2.kubeconfig");
    std::fs::copy(m2(&first_dir), &old_kubeconfig).unwrap();
    lose_ring(&sandbox, &first_dir);
    let second_dir = root.join("ring-restored");
    vars.insert("RING_DIR", second_dir.display().to_string());
    let ring = page.case(RING);
    assert_eq!(ring.len(), 2, "{RING}: restore, kubectl");
    let out = run_ok(&format!("{RING} 0"), &ring[0], &vars);
    assert!(out.contains("restored from"), "{out}");
    let out = run_ok(&format!("{RING} 1"), &ring[1], &vars);
    for name in ["before-machine-loss", "before-ring-loss"] {
        assert!(out.contains(name), "{name} is back: {out}");
        assert!(has_configmap(&m2(&second_dir), name));
    }
    // the lost ring's kubeconfig reaches the restored shoot
    assert!(has_configmap(&old_kubeconfig, "before-ring-loss"));

    // the bucket is damaged: the delta holding a write past the last good
    // point is corrupted after the ring is lost again
    let good = write_durable(&second_dir, "m2", "last-good").await;
    let bad = write_durable(&second_dir, "m2", "after-damage").await;
    lose_ring(&sandbox, &second_dir);
    let objects: Vec<String> = std::fs::read_dir(bucket_dir.join("m2"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let (damaged, first) = objects
        .iter()
        .filter_map(|n| parse_object(n).map(|o| (n, o)))
        .filter(|(_, (kind, first, last, _))| *kind == "delta" && (*first..=*last).contains(&bad))
        .max_by_key(|(_, (_, _, _, epoch))| *epoch)
        .map(|(n, (_, first, _, _))| (n.clone(), first))
        .unwrap_or_else(|| panic!("no delta holds revision {bad}: {objects:?}"));
    assert!(
        first > good,
        "{damaged} also holds the last good write {good}"
    );
    let newer_full = objects
        .iter()
        .filter_map(|n| parse_object(n).map(|o| (n, o)))
        .find(|(_, (kind, f, _, _))| *kind == "full" && *f >= first);
    assert!(
        newer_full.is_none(),
        "a full snapshot after {damaged} would bridge the damage: {newer_full:?}"
    );
    corrupt(&bucket_dir.join("m2").join(&damaged));
    let third_dir = root.join("ring-last-good");
    vars.insert("RING_DIR", third_dir.display().to_string());
    vars.insert("DAMAGED", damaged.clone());
    // the restore of case 2 stops at the damaged object, naming it
    let out = run_block(&format!("{RING} 0 on the damaged bucket"), &ring[0], &vars);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&damaged), "{stderr}");
    let damage = page.case(BUCKET);
    assert_eq!(damage.len(), 3, "{BUCKET}: verify, quarantine, restore");
    let out = run_block(&format!("{BUCKET} 0"), &damage[0], &vars);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "verify fails on damage");
    let row = stdout
        .lines()
        .find(|l| l.contains(&damaged))
        .unwrap_or_else(|| panic!("verify does not name {damaged}:\n{stdout}"));
    assert!(row.trim_start().starts_with("BAD:"), "{row}");
    let out = run_ok(&format!("{BUCKET} 1"), &damage[1], &vars);
    assert!(out.contains("objects are sound"), "{out}");
    assert!(root.join("quarantine/m2").join(&damaged).exists());
    assert!(!bucket_dir.join("m2").join(&damaged).exists());
    let out = run_ok(&format!("{BUCKET} 2"), &damage[2], &vars);
    assert!(out.contains("last-good"), "{out}");
    assert!(has_configmap(&m2(&third_dir), "last-good"));
    assert!(
        !has_configmap(&m2(&third_dir), "after-damage"),
        "restored past the damaged delta"
    );
    // the other shoots, whose objects are sound, are back too
    for shoot in ["m1", "m3"] {
        let kc = third_dir
            .join("kubeconfigs")
            .join(format!("{shoot}.kubeconfig"));
        kubectl(&kc, &["get", "namespaces"]);
    }

    ringctl_in(&third_dir, &["down"]);
    let left = sandbox.wait_no_processes(Duration::from_secs(20));
    assert!(left.is_empty(), "processes left after down: {left:?}");
}
