//! The drill ring's processes, found through `/proc` by the paths in their
//! command lines (every process of a member names `<ring>/members/<member>/`),
//! and killed by pid and process group — only processes of the drill's own ring.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// Live (not zombie) processes whose command line contains `needle`, with their
/// command name (`/proc/<pid>/comm`) and command line (NULs as spaces).
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String, String)> {
    let me = std::process::id();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some(cmdline) = command_line(pid) else {
            continue;
        };
        if !cmdline.contains(needle) || !seed::process::pid_alive(pid) {
            continue;
        }
        out.push((pid, command_name(pid), cmdline));
    }
    out
}

/// `/proc/<pid>/cmdline` with NULs as spaces (none once the process is gone).
fn command_line(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&cmdline).replace('\0', " "))
}

/// `/proc/<pid>/comm`, trimmed (empty once the process is gone).
fn command_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Whether a process named `comm` serves a control plane (and so must never
/// run twice for one shoot).
fn is_control_plane(comm: &str) -> bool {
    matches!(comm, "etcd" | "kube-apiserver")
}

/// The port of `host:port` or `https://host:port`.
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Whether a process is part of a hot standby: its etcd
/// (`--name=standby-<id>`), a voting member of the serving control plane's
/// etcd, which serves nothing by itself; the warm kube-apiserver next to it
/// (its secure port among the standbys' API ports), a second
/// kube-apiserver of that same etcd; or a promoted etcd still on the
/// standby's client port. Those are reachable at the shoot's address only
/// through a promoted standby's relay, which counts instead (see
/// [`promoted_relay`]). The blind spot: a warm kube-apiserver left running
/// after its etcd was fenced is not counted (it can serve no write without
/// that etcd).
fn is_standby(cmdline: &str) -> bool {
    cmdline.split(' ').any(|a| {
        a.starts_with("--name=standby-")
            || a.strip_prefix("--secure-port=")
                .and_then(|p| p.parse().ok())
                .is_some_and(seed::endpoint::is_standby_port)
            || a.strip_prefix("--listen-client-urls=").is_some_and(|urls| {
                let ports: Vec<u16> = urls.split(',').filter_map(port_of).collect();
                !ports.is_empty() && ports.into_iter().all(seed::endpoint::is_standby_port)
            })
    })
}

/// Whether a lease guard's command line (`ring-agent guard ... --
/// ring-agent forward --listen A --to B ...`) is a promoted standby's relay:
/// it leads the shoot's address to a standby's ports.
fn promoted_relay(cmdline: &str) -> bool {
    let args: Vec<&str> = cmdline.split(' ').collect();
    args.contains(&"forward")
        && args
            .windows(2)
            .any(|w| w[0] == "--to" && port_of(w[1]).is_some_and(seed::endpoint::is_standby_port))
}

/// Whether process `pid` has a live child (a guard whose lease ended waits
/// without one): any process whose parent, in `/proc/<child>/stat`, it is.
fn has_live_child(pid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Some(child) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            return false;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        parent_of(&stat) == Some(pid) && seed::process::pid_alive(child)
    })
}

/// The parent pid in a `/proc/<pid>/stat` line (its fourth field; the
/// command name before it is in parentheses and may hold spaces).
fn parent_of(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The prefix every process of member `m` of the ring in `ring_dir` names.
pub fn member_needle(ring_dir: &Path, member: &str) -> String {
    format!("{}/members/{member}/", ring_dir.display())
}

/// Shoot → members on which control-plane processes of the shoot (etcd or
/// kube-apiserver) are alive right now.
pub fn control_planes(ring_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let needle = format!("{}/members/", ring_dir.display());
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (pid, comm, cmdline) in processes_mentioning(&needle) {
        let serves = match is_control_plane(&comm) {
            true => !is_standby(&cmdline),
            // through its relay a promoted standby serves the shoot's address
            false => comm == "ring-agent" && promoted_relay(&cmdline) && has_live_child(pid),
        };
        if !serves {
            continue;
        }
        if let Some((member, shoot)) = parse_member_shoot(&cmdline, &needle) {
            out.entry(shoot).or_default().insert(member);
        }
    }
    out
}

/// Shoot → members whose node runs control-plane processes of the shoot in
/// pods right now (etcd or kube-apiserver anywhere under the node's pod
/// cgroup); `nodes` are (member, its node's pod cgroup root). A dead node's
/// pods count as gone only once their processes are.
pub fn pod_control_planes(nodes: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (member, root) in nodes {
        for pid in seed::node::teardown::pod_pids(root) {
            let pid = pid as u32;
            if !is_control_plane(&command_name(pid)) || !seed::process::pid_alive(pid) {
                continue;
            }
            if let Some(shoot) = command_line(pid).as_deref().and_then(pod_shoot) {
                out.entry(shoot).or_default().insert(member.clone());
            }
        }
    }
    out
}

/// The shoot of a control-plane process in a pod, from the etcd client
/// Service its command line names (`etcd-client.shoot--<ring>--<shoot>.svc`).
pub fn pod_shoot(cmdline: &str) -> Option<String> {
    let marker = format!("{}.shoot--", seed::kubernetes::render::ETCD_CLIENT_SERVICE);
    let rest = &cmdline[cmdline.find(&marker)? + marker.len()..];
    let namespace = rest.split(".svc").next()?;
    let shoot = namespace.rsplit_once("--")?.1;
    (!shoot.is_empty()).then(|| shoot.to_string())
}

/// `(member, shoot)` from the first `<needle><member>/seed/shoots/<shoot>/` in a command line.
pub fn parse_member_shoot(cmdline: &str, needle: &str) -> Option<(String, String)> {
    let rest = &cmdline[cmdline.find(needle)? + needle.len()..];
    let (member, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix("seed/shoots/")?;
    let shoot = rest.split(['/', ' ']).next()?;
    (!member.is_empty() && !shoot.is_empty()).then(|| (member.to_string(), shoot.to_string()))
}

/// The ringd processes of member `member` (its supervisor and the ringd it runs).
pub fn ringd_pids(ring_dir: &Path, member: &str) -> Vec<u32> {
    processes_mentioning(&member_needle(ring_dir, member))
        .into_iter()
        .filter(|(_, comm, _)| comm == "ringd")
        .map(|(pid, _, _)| pid)
        .collect()
}

/// The environment that runs a program under Debian's libfaketime with its
/// wall clock `offset` off (`+5s`); missing libfaketime is named with the fix.
pub fn faketime_env(offset: &str) -> Result<Vec<(String, String)>, crate::ScenarioError> {
    let lib = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(|d| Path::new(d).join("faketime/libfaketimeMT.so.1"))
    .find(|p| p.exists())
    .ok_or_else(|| {
        crate::ScenarioError::Setup(
            "libfaketime is missing: run scripts/setup (it installs Debian's faketime)".into(),
        )
    })?;
    Ok(vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), offset.to_string()),
    ])
}

/// Sends `signal` to every pid (those already gone are skipped).
pub fn signal_all(pids: &[u32], signal: Signal) {
    for pid in pids {
        let _ = kill(Pid::from_raw(*pid as i32), signal);
    }
}

/// What a kill did.
#[derive(Debug, Clone, Default)]
pub struct Killed {
    pub ringd: Option<u32>,
    pub process_groups: usize,
    pub processes: usize,
}

/// kill -9 of member `m`: its ringd, then the process group of every process it
/// runs (the control planes it hosts); waits (bounded) until none is left.
pub async fn kill_member(ring_dir: &Path, member: &str) -> Killed {
    let needle = member_needle(ring_dir, member);
    let mut killed = Killed::default();
    for round in 0..50 {
        let procs = processes_mentioning(&needle);
        if procs.is_empty() {
            break;
        }
        let pids: BTreeSet<u32> = procs.iter().map(|(p, _, _)| *p).collect();
        if round == 0 {
            killed.processes = pids.len();
            killed.ringd = procs
                .iter()
                .find(|(_, comm, _)| comm == "ringd")
                .map(|(p, _, _)| *p);
        }
        // ringd and its supervisor first, so neither can restart what it supervises
        for (p, _, _) in procs.iter().filter(|(_, comm, _)| comm == "ringd") {
            let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
        }
        for pid in &pids {
            match nix::unistd::getpgid(Some(Pid::from_raw(*pid as i32))) {
                // a group led by one of the member's own processes
                Ok(pg) if pids.contains(&(pg.as_raw() as u32)) => {
                    if killpg(pg, Signal::SIGKILL).is_ok() && round == 0 {
                        killed.process_groups += 1;
                    }
                }
                _ => {
                    let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    killed
}

/// What killing a whole member machine did.
#[derive(Debug, Clone, Default)]
pub struct MachineKilled {
    /// Its ringd and the processes it ran.
    pub processes: Killed,
    /// The nodes of its shoot that were running.
    pub nodes: Vec<String>,
}

/// kill -9 of everything of member `member` of the ring in `layout` at once,
/// as when its machine dies: its ringd and every process it runs
/// ([`kill_member`]) and its shoot's nodes with every pod and shim on them.
pub async fn kill_machine(
    layout: &bootstrap::RingLayout,
    config: &bootstrap::config::RingConfig,
    member: &str,
) -> Result<MachineKilled, crate::ScenarioError> {
    let (l, c, m) = (layout.clone(), config.clone(), member.to_string());
    let nodes = tokio::task::spawn_blocking(move || bootstrap::nodes::kill_member(&l, &c, &m));
    let processes = kill_member(&layout.dir, member).await;
    let nodes = nodes
        .await
        .map_err(|e| crate::ScenarioError::Setup(format!("killing {member}'s nodes: {e}")))?;
    Ok(MachineKilled { processes, nodes })
}

/// SIGKILL to every process mentioning `dir` (teardown); waits up to `timeout`.
pub fn kill_all_mentioning(dir: &Path, timeout: Duration) -> usize {
    let needle = dir.display().to_string();
    let deadline = Instant::now() + timeout;
    let mut n = 0;
    loop {
        let procs = processes_mentioning(&needle);
        if procs.is_empty() || Instant::now() >= deadline {
            return n;
        }
        for (pid, _, _) in procs {
            if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                n += 1;
                remove_faketime_shm(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes what libfaketime shares between a process started under
/// [`faketime_env`] and its children (`/dev/shm/faketime_shm_<pid>` and its
/// semaphore): the library removes them when that process exits normally,
/// never after kill -9 (Debian's libfaketime creates them even with
/// `FAKETIME_DISABLE_SHM=1`). Nothing happens for other pids.
pub fn remove_faketime_shm(pid: u32) {
    for name in [
        format!("faketime_shm_{pid}"),
        format!("sem.faketime_sem_{pid}"),
    ] {
        let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
    }
}

/// Log lines worth a place on a drill's timeline.
pub const NOTABLE: [&str; 3] = [
    "is corrupt",
    "fencing the control plane",
    "cannot start the control plane",
];

/// `(ms since the Unix epoch, line)` of every line of a ringd log (ANSI colours
/// removed) that contains one of `patterns`, at most `max` per pattern (a line
/// counts for the first it contains), so a chatty pattern never hides another.
pub fn notable_lines(log: &str, patterns: &[&str], max: usize) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    let mut taken = vec![0usize; patterns.len()];
    for raw in log.lines() {
        let Some(i) = patterns.iter().position(|p| raw.contains(p)) else {
            continue;
        };
        if taken[i] >= max {
            continue;
        }
        taken[i] += 1;
        let mut line = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // skip the escape sequence up to its final letter
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                line.push(c);
            }
        }
        let Some((time, rest)) = line.split_once(' ') else {
            continue;
        };
        if let Ok(ms) = backup::catalog::parse_rfc3339(time) {
            out.push((ms, rest.trim().to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process started under libfaketime and killed by
    /// [`kill_all_mentioning`] leaves nothing in `/dev/shm`.
    #[test]
    fn killing_a_faketime_process_removes_its_shared_memory() {
        let dir = std::env::temp_dir().join(format!("ring-faketime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("log");
        std::fs::write(&file, b"").unwrap();
        // a command line that names the dir, as a drill's processes do
        let mut child = std::process::Command::new("tail")
            .arg("-f")
            .arg(&file)
            .envs(faketime_env("+5s").expect("libfaketime (scripts/setup)"))
            .spawn()
            .unwrap();
        let (pid, shm) = (child.id(), Path::new("/dev/shm"));
        let shm_file = shm.join(format!("faketime_shm_{pid}"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !shm_file.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            shm_file.exists(),
            "libfaketime made no {}",
            shm_file.display()
        );
        assert_eq!(kill_all_mentioning(&dir, Duration::from_secs(10)), 1);
        let _ = child.wait();
        assert!(!shm_file.exists());
        assert!(!shm.join(format!("sem.faketime_sem_{pid}")).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn member_and_shoot_come_from_the_seed_path() {
        let needle = "/tmp/x/ring/members/";
        let cmd = "etcd --name ks2 --data-dir /tmp/x/ring/members/ks1/seed/shoots/ks2/etcd --x";
        assert_eq!(
            parse_member_shoot(cmd, needle),
            Some(("ks1".into(), "ks2".into()))
        );
        let cmd =
            "kube-apiserver --tls-cert-file=/tmp/x/ring/members/ks3/seed/shoots/ks1/pki/a.crt";
        assert_eq!(
            parse_member_shoot(cmd, needle),
            Some(("ks3".into(), "ks1".into()))
        );
        assert_eq!(
            parse_member_shoot("ringd --config /tmp/x/ring/members/ks1/ringd.yaml", needle),
            None
        );
        assert_eq!(parse_member_shoot("etcd --data-dir /else", needle), None);
        assert!(is_standby("etcd --name=standby-3 --data-dir=/x"));
        assert!(!is_standby("etcd --name=ks2 --data-dir=/x/standby-3"));
        // the warm kube-apiserver next to a standby, not the serving one
        assert!(is_standby(
            "kube-apiserver --bind-address=127.1.2.3 --secure-port=14403"
        ));
        assert!(!is_standby(
            "kube-apiserver --bind-address=127.1.2.3 --secure-port=6443"
        ));
        assert!(!is_standby("kube-apiserver --secure-port=15400"));
        // a promoted etcd on the standby's client port, not yet relayed
        assert!(is_standby(
            "etcd --name=ks2 --listen-client-urls=https://127.1.2.3:12406 --x"
        ));
        assert!(!is_standby(
            "etcd --name=ks2 --listen-client-urls=https://127.1.2.3:2379,https://127.1.2.3:12406"
        ));
        // a promoted standby's relays count; a Kubernetes seed's does not
        let guard = "ring-agent guard --lease-file /r/members/ks3/seed/shoots/ks2/fence-at-ms -- /bin/ring-agent forward";
        assert!(promoted_relay(&format!(
            "{guard} --listen 127.1.2.3:6443 --to 127.1.2.3:14403"
        )));
        assert!(promoted_relay(&format!(
            "{guard} --listen 127.1.2.3:2379 --to 127.1.2.3:12406 --listen 127.1.2.3:2380 --to 127.1.2.3:12407"
        )));
        assert!(!promoted_relay(&format!(
            "{guard} --listen 127.1.2.3:6443 --to 10.0.0.7:31443"
        )));
        assert!(!promoted_relay(
            "ring-agent guard -- etcd --listen-client-urls=https://127.1.2.3:12406"
        ));
        // no port to tell by: counted
        assert!(!is_standby(
            "etcd --name=ks2 --listen-client-urls=unix:///x/"
        ));
        assert_eq!(parent_of("412 (ring agent) S 377 412 9 0"), Some(377));
        assert_eq!(parent_of("garbage"), None);
    }

    #[test]
    fn a_pod_s_shoot_comes_from_the_etcd_service_it_names() {
        let etcd = "etcd --name=etcd-0 --advertise-client-urls=https://etcd-client.shoot--kill-seed--ks2.svc:2379 --x";
        assert_eq!(pod_shoot(etcd), Some("ks2".into()));
        let api = "kube-apiserver --etcd-servers=https://etcd-client.shoot--r--ks3.svc:2379";
        assert_eq!(pod_shoot(api), Some("ks3".into()));
        assert_eq!(pod_shoot("etcd --data-dir=/var/lib/etcd"), None);
        assert_eq!(pod_shoot("x https://etcd-client.shoot--.svc"), None);
    }

    #[test]
    fn notable_log_lines_lose_their_colours_and_keep_their_time() {
        let log = "\u{1b}[2m2026-11-23T16:06:05.454Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m backup: full-1 is corrupt (checksum): planning again\n\
                   2026-11-23T16:06:06Z  INFO nothing to see\n";
        let got = notable_lines(log, &NOTABLE, 10);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].1,
            "WARN backup: full-1 is corrupt (checksum): planning again"
        );
        assert_eq!(got[0].0 % 1000, 454);
    }

    /// A drill failed with "no member logged \"is corrupt\"": the scan's ten
    /// lines were one budget for every pattern, so a dozen fencing lines
    /// before the warning would hide it.
    #[test]
    fn a_chatty_pattern_never_hides_another() {
        let mut log = String::new();
        for s in 10..22 {
            log.push_str(&format!(
                "2026-11-26T08:00:{s}Z WARN fencing the control plane m2\n"
            ));
        }
        log.push_str("2026-11-26T08:01:00Z WARN m2's full-7 is corrupt (checksum)\n");
        let got = notable_lines(&log, &NOTABLE, 10);
        assert_eq!(got.len(), 11);
        assert!(got[10].1.contains("is corrupt"), "{got:?}");
        let fencing = got.iter().filter(|(_, l)| l.contains("fencing")).count();
        assert_eq!(fencing, 10);
    }
}
