//! Finding a test's processes by program and command line, e.g. a shoot's
//! control plane running in pods.

/// Pids of processes whose program is `program` and whose command line has every one of `needles`.
pub fn processes(program: &str, needles: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_program = args
            .first()
            .is_some_and(|a| a.rsplit('/').next() == Some(program));
        let has = |n: &&str| args.iter().any(|a| a.contains(n));
        if is_program && needles.iter().all(has) {
            out.push(pid);
        }
    }
    out
}

/// The parent pid of `pid` (`/proc/<pid>/stat`: "pid (comm) state ppid ..."),
/// if it still runs.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(1)?.parse().ok()
}

/// The etcd and kube-apiserver processes of `shoot`'s control plane in pods
/// of ring `ring`.
pub fn pod_control_plane(ring: &str, shoot: &str) -> Vec<u32> {
    let token = format!("--initial-cluster-token=ring-{shoot}");
    let mut pids = processes("etcd", &[&token, "/var/lib/etcd/data"]);
    let etcd_service = format!("etcd-client.shoot--{ring}--{shoot}.svc");
    pids.extend(processes("kube-apiserver", &[&etcd_service]));
    pids
}
