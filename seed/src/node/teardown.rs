//! Leaving nothing behind: a stopped node's pods, shims and cgroups.
//!
//! Pods are found through the node's cgroups (every container process lives
//! under the node's `cgroupRoot`), shims through their command line (they name
//! the node's containerd socket), so this works whether or not containerd and
//! kubelet still run. Mounts need no work: the node's processes run in a mount
//! namespace of their own, which goes away with its last process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// The node's cgroup directories in every mounted hierarchy (v1 and v2).
pub fn cgroup_dirs(cgroup_root: &str) -> Vec<PathBuf> {
    let rel = cgroup_root.trim_start_matches('/');
    let mut dirs = Vec::new();
    let unified = Path::new(CGROUP_FS).join(rel);
    if Path::new(CGROUP_FS).join("cgroup.controllers").exists() && unified.is_dir() {
        dirs.push(unified);
    }
    if let Ok(entries) = std::fs::read_dir(CGROUP_FS) {
        for e in entries.flatten() {
            let dir = e.path().join(rel);
            if dir.is_dir() && !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs.sort();
    dirs
}

/// Every pid in `dir`'s cgroup and below.
fn pids_below(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                pids_below(&e.path(), out);
            }
        }
    }
}

/// The processes of the node's pods (everything under its cgroup root).
pub fn pod_pids(cgroup_root: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for dir in cgroup_dirs(cgroup_root) {
        pids_below(&dir, &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The live processes of pod `uid` of the node (its `pod<uid>` cgroups, in
/// every hierarchy); none once the pod's cgroups are empty or gone. `None`
/// when the node's cgroup root is not on this machine (nothing can be told).
pub fn pod_processes(cgroup_root: &str, uid: &str) -> Option<Vec<i32>> {
    let dirs = cgroup_dirs(cgroup_root);
    (!dirs.is_empty()).then(|| processes_of_pod(&dirs, uid))
}

/// [`pod_processes`] under the node's cgroup directories `dirs`.
fn processes_of_pod(dirs: &[PathBuf], uid: &str) -> Vec<i32> {
    fn find(dir: &Path, name: &str, out: &mut Vec<i32>, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            if e.file_name() == name {
                pids_below(&e.path(), out);
            } else if depth > 0 {
                find(&e.path(), name, out, depth - 1);
            }
        }
    }
    let name = format!("pod{uid}");
    let mut pids = Vec::new();
    for dir in dirs {
        // kubepods/<qos>/pod<uid>, or kubepods/pod<uid> for guaranteed pods
        find(dir, &name, &mut pids, 2);
    }
    pids.retain(|p| crate::process::pid_alive(*p as u32));
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Every process but this one whose arguments (`/proc/<pid>/cmdline`, the
/// program first) `matches` accepts.
fn pids_by_arguments(matches: impl Fn(&[&[u8]]) -> bool) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                matches(&args)
            })
        })
        .collect()
}

/// The containerd shims serving the containerd at `socket`.
pub fn shim_pids(socket: &Path) -> Vec<i32> {
    let want = socket.as_os_str().as_encoded_bytes();
    pids_by_arguments(|args| {
        args.first()
            .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
            && args.contains(&want)
    })
}

/// The node's runtime processes outside its pods: every process (but this
/// one) with an argument naming a path under the node's `run_dir`. That is
/// each shim (`-address <run_dir>/containerd.sock`) and each `runc` a shim
/// started (`--log <run_dir>/containerd/...`): a `runc create` outliving its
/// killed shim goes on making the container's cgroups under the node's root.
pub fn runtime_pids(run_dir: &Path) -> Vec<i32> {
    let dir = run_dir.as_os_str().as_encoded_bytes();
    let under = |arg: &&[u8]| {
        arg.strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
    };
    pids_by_arguments(|args| args.iter().any(under))
}

fn kill_all(pids: &[i32]) {
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Kills what `find` returns until it returns nothing or `within` passed;
/// returns what is still there.
pub async fn kill_until_gone(find: impl Fn() -> Vec<i32>, within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        let pids: Vec<i32> = find()
            .into_iter()
            .filter(|p| crate::process::pid_alive(*p as u32))
            .collect();
        if pids.is_empty() || Instant::now() >= deadline {
            return pids;
        }
        kill_all(&pids);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes the node's (empty) cgroups, deepest first; returns those that remain.
pub fn remove_cgroups(cgroup_root: &str) -> Vec<PathBuf> {
    fn remove(dir: &Path, left: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    remove(&e.path(), left);
                }
            }
        }
        if std::fs::remove_dir(dir).is_err() && dir.exists() {
            left.push(dir.to_path_buf());
        }
    }
    let mut left = Vec::new();
    for dir in cgroup_dirs(cgroup_root) {
        remove(&dir, &mut left);
    }
    left
}

/// [`remove_cgroups`] until none is left, bounded by `within`: between
/// passes it kills whatever still runs in them (a pod process still exiting
/// after its SIGKILL, or one a late `runc` put there). Once none is left it
/// looks once more after a pause, for a tree a dying kubelet or runc created
/// again. Returns what remains at the deadline.
pub fn remove_cgroups_within(cgroup_root: &str, within: Duration) -> Vec<PathBuf> {
    let deadline = Instant::now() + within;
    let mut gone_once = false;
    loop {
        let left = remove_cgroups(cgroup_root);
        if left.is_empty() && gone_once {
            return left;
        }
        gone_once = left.is_empty();
        if Instant::now() >= deadline {
            return left;
        }
        kill_all(&pod_pids(cgroup_root));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Creates the node's cgroup root in every v1 hierarchy (kubelet expects it),
/// with cpuset's cpus and mems copied from the parent.
pub fn create_cgroups(cgroup_root: &str) -> std::io::Result<()> {
    let rel = cgroup_root.trim_start_matches('/');
    for e in std::fs::read_dir(CGROUP_FS)?.flatten() {
        let hierarchy = e.path();
        if !hierarchy.join("cgroup.procs").exists() || e.path().is_symlink() {
            continue;
        }
        let dir = hierarchy.join(rel);
        std::fs::create_dir_all(&dir)?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let (parent, child) = (hierarchy.join(f), dir.join(f));
            if parent.exists() && std::fs::read_to_string(&child)?.trim().is_empty() {
                std::fs::write(&child, std::fs::read_to_string(&parent)?.trim())?;
            }
        }
    }
    Ok(())
}

/// Removes everything of a node whose supervisor is gone (killed, or never
/// stopped): SIGKILLs its pods and shims until none is left (bounded), then
/// removes its cgroups and run dir. Synchronous, for `Drop` guards.
///
/// Its shims and their `runc` processes go first with the pods: a `runc`
/// left running makes cgroups again after they were removed.
pub fn kill_node_now(config: &super::NodeConfig) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut left = pod_pids(&config.cgroup_root);
        left.extend(runtime_pids(&config.run_dir));
        left.retain(|p| crate::process::pid_alive(*p as u32));
        if left.is_empty() || Instant::now() >= deadline {
            break;
        }
        kill_all(&left);
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = remove_cgroups_within(&config.cgroup_root, Duration::from_secs(5));
    if !left.is_empty() {
        tracing::warn!(cgroups = ?left, "cgroups of a killed node could not be removed");
    }
    let _ = std::fs::remove_dir_all(&config.run_dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `runc` stand-in (an argument under the node's run dir) that makes a
    /// pod cgroup under the node's root 300 ms later: the teardown kills it
    /// with the pods, so no cgroup of the node is left. With shims alone
    /// killed (before), it made its cgroup after the teardown had removed
    /// the node's: the partial trees seen left after CI runs.
    #[test]
    fn a_late_runc_of_the_node_is_killed_before_it_makes_cgroups_again() {
        let mut config = crate::node::render::tests::config();
        let tag = format!("ring-teardown-{}", std::process::id());
        config.run_dir = std::env::temp_dir().join(&tag);
        config.cgroup_root = format!("/{tag}");
        create_cgroups(&config.cgroup_root).unwrap();
        let hierarchy = cgroup_dirs(&config.cgroup_root)
            .into_iter()
            .find(|d| d.starts_with("/sys/fs/cgroup/pids"))
            .expect("the pids hierarchy (cgroup v1) under /sys/fs/cgroup");
        let late = hierarchy.join("kubepods/podlate");
        let script = format!("sleep 0.3; mkdir -p {}", late.display());
        let runc_log = config.run_dir.join("containerd/x/log.json");
        let mut runc = std::process::Command::new("sh")
            .args(["-c", &script])
            .arg(&runc_log)
            .spawn()
            .unwrap();
        // once it runs sh (before its exec it still has this test's arguments)
        let deadline = Instant::now() + Duration::from_secs(10);
        while !runtime_pids(&config.run_dir).contains(&(runc.id() as i32)) {
            assert!(Instant::now() < deadline, "the stand-in did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        kill_node_now(&config);
        let status = runc.wait().unwrap();
        let left = cgroup_dirs(&config.cgroup_root);
        remove_cgroups(&config.cgroup_root);
        assert!(
            left.is_empty(),
            "left {left:?}; the stand-in ended {status}"
        );
        assert!(!status.success(), "the stand-in was not killed: {status}");
    }

    /// A pod's processes are read from its `pod<uid>` cgroup (and below),
    /// wherever the QoS class put it; dead pids and other pods do not count.
    #[test]
    fn a_pod_s_processes_come_from_its_own_cgroup() {
        let root = std::env::temp_dir().join(format!("ring-cg-{}", std::process::id()));
        let me = std::process::id().to_string();
        let burstable = root.join("kubepods/burstable/podabc/ctr1");
        let other = root.join("kubepods/besteffort/podxyz");
        std::fs::create_dir_all(&burstable).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(burstable.join("cgroup.procs"), format!("{me}\n")).unwrap();
        std::fs::write(other.join("cgroup.procs"), format!("{me}\n")).unwrap();
        let dirs = vec![root.clone()];
        assert_eq!(processes_of_pod(&dirs, "abc"), [me.parse::<i32>().unwrap()]);
        // emptied, or dead pids only: gone
        std::fs::write(burstable.join("cgroup.procs"), "").unwrap();
        assert!(processes_of_pod(&dirs, "abc").is_empty());
        std::fs::write(burstable.join("cgroup.procs"), "999999999\n").unwrap();
        assert!(processes_of_pod(&dirs, "abc").is_empty());
        assert!(processes_of_pod(&dirs, "nope").is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
