//! The shared harness of Ring's end-to-end tests.
//!
//! Everything here starts real processes (etcd, kube-apiserver, ...) on loopback
//! in temp dirs, waits with a timeout and a reason, and kills whatever it started
//! when dropped. A missing binary fails the test with a message to run
//! `scripts/setup`; nothing is skipped silently.

use std::ffi::OsStr;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use seed::{Binaries, BinarySearch, LocalSeed};

pub mod certs;
pub mod etcd;
pub mod procs;
pub mod ring;
pub mod s3;

/// The control-plane binaries, or a panic telling how to install them.
pub fn binaries() -> Binaries {
    match BinarySearch::standard(None).control_plane() {
        Ok(b) => b,
        Err(e) => panic!("{e}\nThe end-to-end tests need real binaries: run scripts/setup first."),
    }
}

/// The `ring-node` binary next to this test binary (built by `scripts/test`).
pub fn ring_node_bin() -> PathBuf {
    let path = ringctl().with_file_name("ring-node");
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build --workspace --bins` (scripts/test does)",
        path.display()
    );
    path
}

/// The `ring-agent` binary next to this test binary (built by `scripts/test`).
pub fn ring_agent_bin() -> PathBuf {
    let path = ringctl().with_file_name("ring-agent");
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build --workspace --bins` (scripts/test does)",
        path.display()
    );
    path
}

/// The `ringctl` binary next to this test binary (`scripts/test` builds it before the tests).
pub fn ringctl() -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    // target/<profile>/deps/<test>  ->  target/<profile>/ringctl
    let path = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("ringctl"))
        .expect("target directory");
    assert!(
        path.exists(),
        "{} is missing: build it first: `cargo build --workspace --bins` (scripts/test does)",
        path.display()
    );
    path
}

/// A temp state dir for a seed; on drop, every process whose command line
/// mentions the dir (supervisors and components) is killed, then the dir removed
/// (kept, and its path printed, when the test failed).
pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    /// A fresh sandbox.
    pub fn new() -> Self {
        Sandbox {
            dir: tempfile::Builder::new()
                .prefix("ring-test-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    /// The state dir.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A local seed on this sandbox.
    pub fn seed(&self) -> LocalSeed {
        LocalSeed::new(self.path(), binaries())
    }

    /// Pids of live processes whose command line mentions this sandbox.
    pub fn processes(&self) -> Vec<u32> {
        processes_mentioning(self.path())
    }

    /// Waits (bounded) until no process mentions `path`; returns the leftovers.
    pub fn wait_no_processes_matching(&self, path: &Path, timeout: Duration) -> Vec<u32> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = processes_mentioning(path);
            if left.is_empty() || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (bounded) until no process mentions this sandbox; returns the leftovers.
    pub fn wait_no_processes(&self, timeout: Duration) -> Vec<u32> {
        self.wait_no_processes_matching(self.path(), timeout)
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for pid in self.processes() {
            // SAFETY: plain syscall.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
        let _ = self.wait_no_processes(Duration::from_secs(10));
        // a failed test keeps its sandbox (logs, state, pid files) for a
        // post-mortem; RING_TEST_KEEP=1 keeps every test's
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("test failed: sandbox kept at {}", self.path().display());
        } else if std::env::var_os("RING_TEST_KEEP").is_some_and(|v| v == "1") {
            self.dir.disable_cleanup(true);
            eprintln!(
                "RING_TEST_KEEP=1: sandbox kept at {}",
                self.path().display()
            );
        }
    }
}

/// Live processes (not zombies) whose command line contains `needle`.
pub fn processes_mentioning(needle: &Path) -> Vec<u32> {
    scenarios::procs::processes_mentioning(&needle.to_string_lossy())
        .into_iter()
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Polls `check` until it returns `Some`, panicking with `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_ok(what, timeout, || {
        let answer = check();
        async move { answer.await.ok_or_else(|| "not there yet".to_string()) }
    })
    .await
}

/// Polls `check` until it returns `Ok`, panicking with `what` and the last
/// `Err` (why it was not there yet) after `timeout`.
pub async fn wait_ok<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let why = match check().await {
            Ok(v) => return v,
            Err(why) => why,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; last: {why}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs a command to completion, killing it after `timeout` (a panic with
/// what it printed to stderr); stdout and stderr are read while it runs, so
/// any amount of output comes back ([`seed::process::run_bounded`]).
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Output {
    seed::process::run_bounded(cmd, timeout).unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// `ringctl ARGS` with extra environment, bounded to 4 minutes.
pub fn ringctl_cmd<I, S>(args: I, env: &[(&str, &OsStr)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(ringctl());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(&mut cmd, Duration::from_secs(240))
}

/// `kubectl --kubeconfig KUBECONFIG ARGS`, bounded to 60 s; returns stdout, panics on failure.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(kubectl_path());
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// kubectl from PATH, else the one `scripts/setup` built into the cache.
pub fn kubectl_path() -> PathBuf {
    BinarySearch::standard(None)
        .find("kubectl")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A `kube` client for a kubeconfig written by Ring.
pub async fn kube_client(kubeconfig: &Path) -> kube::Client {
    seed::kubeconfig::client("test", kubeconfig)
        .await
        .unwrap_or_else(|e| panic!("kube client for {}: {e}", kubeconfig.display()))
}

/// The stdout of a successful `ringctl` run, or a panic showing its stderr.
pub fn expect_success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ringctl failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The stderr of a failed `ringctl` run (exit code 1, no panic), or a panic.
pub fn expect_clean_failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit code 1; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "ringctl panicked: {stderr}");
    stderr
}

/// A port base whose member and metrics ports (base+1..5, base+101..105) are free now
/// (for `ports: {base: ...}` in a Ring config).
pub fn free_port_base() -> u16 {
    // Below Linux's ephemeral range (32768+), so outgoing connections cannot take
    // the ports between this check and the ring's start; and never overlapping a
    // range this process handed out before (tests run in parallel threads).
    static TAKEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let seed = nanos ^ (u64::from(std::process::id()) << 20);
    for attempt in 0..500u64 {
        let base = 20_000 + (seed.wrapping_add(attempt.wrapping_mul(7919)) % 12_000) as u16;
        if taken.iter().any(|t| t.abs_diff(base) < 200) {
            continue;
        }
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if (1..=5).all(|i| free(base + i) && free(base + 100 + i)) {
            taken.push(base);
            return base;
        }
    }
    panic!("no free port range found");
}

/// Writes a Ring config of members m1..mn on a free port range into `dir/ring.yaml`.
pub fn ring_config(dir: &Path, n: usize) -> PathBuf {
    ring_config_with(dir, n, "")
}

/// [`ring_config`] with `extra` YAML lines appended (e.g. `releaseGraceSeconds: 1`).
/// Rings have no nodes unless `extra` sets `nodes:`.
pub fn ring_config_with(dir: &Path, n: usize, extra: &str) -> PathBuf {
    let extra = if extra.contains("nodes:") {
        extra.to_string()
    } else {
        format!("nodes: {{perMember: 0}}\n{extra}")
    };
    let members = (1..=n)
        .map(|i| format!("{{name: m{i}}}"))
        .collect::<Vec<_>>()
        .join(", ");
    let path = dir.join("ring.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: ring.gardener.cloud/v1alpha1\nkind: Ring\nname: test\nmembers: [{members}]\nports: {{base: {}}}\n{extra}\n",
            free_port_base()
        ),
    )
    .expect("write ring config");
    path
}

/// `ringctl ARGS --ring-dir DIR`, which must succeed; returns stdout.
pub fn ringctl_in(dir: &Path, args: &[&str]) -> String {
    let mut v: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    v.push("--ring-dir".into());
    v.push(dir.into());
    expect_success(&ringctl_cmd(v, &[]))
}

/// Rings in tests name their shoots m1, m2, ...; a shoot's endpoint (its loopback
/// address) follows from its name, so two such rings cannot run at once in one
/// test binary. Tests that start control planes of a ring hold this lock.
pub fn ring_slot() -> std::sync::MutexGuard<'static, ()> {
    static SLOT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SLOT.lock().unwrap_or_else(|p| p.into_inner())
}

/// The body of `GET path` from `address` (`host:port`), plain HTTP/1.0; panics
/// with the reason after 10 s or on a non-200 answer.
pub async fn http_get(address: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(address).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .unwrap_or_else(|_| panic!("GET http://{address}{path} took over 10 s"))
        .unwrap_or_else(|e| panic!("GET http://{address}{path}: {e}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "GET http://{address}{path}: {head}"
    );
    body.to_string()
}

/// This machine's wall clock, unix ms.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
