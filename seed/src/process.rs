//! Supervised child processes: one reconciler task per control-plane component.
//!
//! The desired state is "running" until the component's token is cancelled. The
//! task observes its child, restarts it with exponential backoff when it exits,
//! and on cancellation stops it gracefully (SIGTERM to its process group, then
//! SIGKILL after a grace period). Children run in their own process group with a
//! parent-death signal, so they never outlive the supervisor process.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The processes of a hosted control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    /// A node's container runtime.
    Containerd,
    /// A node's agent, registered to its shoot's kube-apiserver.
    Kubelet,
    /// A node's Service proxy (iptables).
    KubeProxy,
    /// A Kubernetes seed's relay from a shoot's stable API address to its
    /// Service (see `kubernetes::forwarder`); a local seed's from the
    /// shoot's API address to a promoted standby's warm kube-apiserver (see
    /// `local::warm`).
    ApiForwarder,
    /// A local seed's relay from the shoot's etcd client and peer ports to
    /// a promoted standby's etcd, which listens on the standby's (see
    /// `local::warm`).
    EtcdForwarder,
    /// A member's ringd, supervised by `ringd --supervise` (see
    /// `ringd::supervisor`).
    Ringd,
}

impl Component {
    /// All components in start order (stop order is the reverse).
    pub const ALL: [Component; 4] = [
        Component::Etcd,
        Component::KubeApiserver,
        Component::KubeControllerManager,
        Component::KubeScheduler,
    ];

    /// How long the component may take to exit after SIGTERM, given the
    /// supervisor's `grace`. kube-apiserver gets at most
    /// [`API_STOP_GRACE`]: on SIGTERM it may drain until every watch ends
    /// (kubelets and controllers keep theirs open for minutes), so a graceful
    /// stop nearly always ran into the grace, and while it drains the API is
    /// already closed: a planned migration stood still for it. Killing it
    /// loses no acknowledged write (a write is acknowledged only once etcd
    /// has committed it). etcd gets at most [`ETCD_STOP_GRACE`]: a member
    /// whose peers are gone (a standby stopped to be promoted) keeps serving
    /// its open streams after SIGTERM until the grace runs out, and a kill
    /// loses nothing it acknowledged (its log is on disk before it answers).
    pub fn stop_grace(self, grace: Duration) -> Duration {
        match self {
            Component::KubeApiserver => grace.min(API_STOP_GRACE),
            Component::Etcd => grace.min(ETCD_STOP_GRACE),
            _ => grace,
        }
    }

    /// How much nicer than its supervisor the component runs. A control plane and a node's
    /// containerd (its pods inherit it) yield the CPU to ringd, the kubelet
    /// and the relays on a saturated machine: three control planes starting
    /// together on a small machine can keep ringd off the CPU for an election
    /// timeout, the ring then commits no lease renewal and every control
    /// plane fences itself. Only matters under contention.
    pub fn nice(self) -> i32 {
        match self {
            Component::Etcd
            | Component::KubeApiserver
            | Component::KubeControllerManager
            | Component::KubeScheduler
            | Component::Containerd => WORKLOAD_NICE,
            Component::Kubelet
            | Component::KubeProxy
            | Component::ApiForwarder
            | Component::EtcdForwarder
            | Component::Ringd => 0,
        }
    }

    /// The program's name, as on disk and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
            Component::KubeScheduler => "kube-scheduler",
            Component::Containerd => "containerd",
            Component::Kubelet => "kubelet",
            Component::KubeProxy => "kube-proxy",
            Component::ApiForwarder => "api-forwarder",
            Component::EtcdForwarder => "etcd-forwarder",
            Component::Ringd => "ringd",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The arguments kube-controller-manager and kube-scheduler share, as
/// processes and as pods: `kubeconfig` for the API, delegated authentication
/// and authorization; serving on `bind`:`port` with self-signed certificates
/// in `cert_dir`; leader election.
///
/// Both may start before their API serves (a control plane's pods start
/// together; a moved API comes back later than its managers). With an
/// authentication kubeconfig, kube-controller-manager then exits at
/// once ("unable to load configmap based request-header-client-ca-file"),
/// and a pod's restarts back off 10 s, then 20 s, so a move waited up to
/// half a minute for it. Tolerating the failed lookup, it waits in leader
/// election and loads the client CA once the API answers.
pub fn manager_args(kubeconfig: &str, bind: &str, port: u16, cert_dir: &str) -> Vec<String> {
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--authentication-tolerate-lookup-failure=true".into(),
        format!("--bind-address={bind}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={cert_dir}"),
        "--leader-elect=true".into(),
        "--profiling=false".into(),
    ]
}

/// Flags that current Kubernetes components no longer accept (each makes the
/// component refuse to start): the insecure ports, klog's file flags, the
/// dockershim-era kubelet flags and the kubelet's sandbox image flag (the
/// sandbox image is pinned in containerd's config).
pub const REMOVED_FLAGS: [&str; 12] = [
    "--insecure-port",
    "--insecure-bind-address",
    "--port",
    "--address",
    "--logtostderr",
    "--alsologtostderr",
    "--log-dir",
    "--log-file",
    "--container-runtime",
    "--pod-infra-container-image",
    "--network-plugin",
    "--cni-bin-dir",
];

/// Whether `arg` (`--name` or `--name=value`) is one of [`REMOVED_FLAGS`].
pub fn is_removed_flag(arg: &str) -> bool {
    let name = arg.split('=').next().unwrap_or(arg);
    REMOVED_FLAGS.contains(&name)
}

/// How to run one component.
#[derive(Debug, Clone)]
pub struct ComponentSpec {
    pub component: Component,
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Where stdout and stderr are appended.
    pub log: PathBuf,
    /// An `ip netns` namespace to run in (a node's); `None`: the supervisor's own.
    pub netns: Option<String>,
}

/// What the supervisor knows about a component right now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentState {
    /// The running process, if any.
    pub pid: Option<u32>,
    /// How many times the process exited and was started again.
    pub restarts: u32,
    /// How the last run ended ("exit status 1", "signal 9 (SIGKILL)", "spawn failed: ...").
    pub last_exit: Option<String>,
    /// When the current process was started (seconds since the Unix epoch).
    pub started_at: Option<u64>,
}

/// The niceness of the workloads (control planes, pods) next to ringd; see
/// [`Component::nice`].
pub const WORKLOAD_NICE: i32 = 5;

/// The states of all components of one control plane, shared with observers.
pub type States = BTreeMap<Component, ComponentState>;

/// Exponential backoff between restarts.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial` and doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay to wait now; the following one is twice as long (capped).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the initial delay (after a long healthy run).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// The longest kube-apiserver may take to exit after SIGTERM, as a process
/// and as a pod (see [`Component::stop_grace`]).
pub const API_STOP_GRACE: Duration = Duration::from_secs(1);

/// The longest etcd may take to exit after SIGTERM (see [`Component::stop_grace`]).
pub const ETCD_STOP_GRACE: Duration = Duration::from_secs(1);

/// Tuning of the component supervisor.
#[derive(Debug, Clone, Copy)]
pub struct SupervisorTuning {
    /// First delay before a restart.
    pub restart_initial: Duration,
    /// Longest delay before a restart.
    pub restart_max: Duration,
    /// A run at least this long resets the backoff.
    pub healthy_after: Duration,
    /// How long a component may take to exit after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
    /// An exit code by which the component says that starting it again cannot
    /// help (e.g. its config or its store is bad): the supervisor then stops
    /// instead of restarting it. `None`: every exit is restarted.
    pub permanent_exit: Option<i32>,
}

impl Default for SupervisorTuning {
    fn default() -> Self {
        SupervisorTuning {
            restart_initial: Duration::from_millis(500),
            restart_max: Duration::from_secs(30),
            healthy_after: Duration::from_secs(60),
            stop_grace: Duration::from_secs(15),
            permanent_exit: None,
        }
    }
}

/// Runs `spec` until `cancel` fires, restarting it whenever it exits (except
/// with [`SupervisorTuning::permanent_exit`], which ends supervision early).
pub async fn supervise(
    spec: ComponentSpec,
    cancel: CancellationToken,
    states: watch::Sender<States>,
    tuning: SupervisorTuning,
) {
    let component = spec.component;
    let mut backoff = Backoff::new(tuning.restart_initial, tuning.restart_max);
    let update = |f: &dyn Fn(&mut ComponentState)| record(&states, component, f);
    loop {
        if cancel.is_cancelled() {
            break;
        }
        let started = Instant::now();
        let mut child = match spawn(&spec) {
            Ok(child) => child,
            Err(e) => {
                tracing::error!(%component, error = %e, "cannot start");
                update(&|s| s.last_exit = Some(format!("spawn failed: {e}")));
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(backoff.next_delay()) => continue,
                }
            }
        };
        let pid = child.id();
        tracing::info!(%component, pid, "started");
        update(&|s| {
            s.pid = pid;
            s.started_at = Some(unix_now());
        });
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                terminate(component, &mut child, component.stop_grace(tuning.stop_grace)).await;
                update(&|s| s.pid = None);
                break;
            }
            status = child.wait() => {
                let Some(delay) = after_exit(component, pid, status, started.elapsed(), &tuning, &mut backoff, &states) else {
                    break;
                };
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Applies `f` to `component`'s state in `states`.
fn record(states: &watch::Sender<States>, component: Component, f: &dyn Fn(&mut ComponentState)) {
    states.send_modify(|m| f(m.entry(component).or_default()));
}

/// Records how a run that lasted `ran` ended; returns the wait before the
/// next start, or `None` when the component said a restart cannot help.
fn after_exit(
    component: Component,
    pid: Option<u32>,
    status: std::io::Result<std::process::ExitStatus>,
    ran: Duration,
    tuning: &SupervisorTuning,
    backoff: &mut Backoff,
    states: &watch::Sender<States>,
) -> Option<Duration> {
    let update = |f: &dyn Fn(&mut ComponentState)| record(states, component, f);
    let permanent = matches!(
        (&status, tuning.permanent_exit),
        (Ok(st), Some(code)) if st.code() == Some(code)
    );
    let how = match status {
        Ok(st) => describe_exit(st),
        Err(e) => format!("wait failed: {e}"),
    };
    if permanent {
        tracing::error!(%component, pid, exit = %how, "exited saying a restart cannot help; not restarted");
        update(&|s| {
            s.pid = None;
            s.last_exit = Some(format!("{how} (permanent: not restarted)"));
        });
        return None;
    }
    if ran >= tuning.healthy_after {
        backoff.reset();
    }
    let delay = backoff.next_delay();
    tracing::warn!(%component, pid, exit = %how, restart_in = ?delay, "exited; restarting");
    update(&|s| {
        s.pid = None;
        s.restarts += 1;
        s.last_exit = Some(how.clone());
    });
    Some(delay)
}

fn spawn(spec: &ComponentSpec) -> std::io::Result<tokio::process::Child> {
    use std::io::Write;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)?;
    writeln!(
        log,
        "=== ring: starting {} at unix time {} ===",
        spec.component,
        unix_now()
    )?;
    let err_log = log.try_clone()?;
    let supervisor = std::process::id();
    let netns = match &spec.netns {
        Some(ns) => Some(std::fs::File::open(crate::netns::path(ns))?),
        None => None,
    };
    let netns_fd = netns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    let nice = spec.component.nice();
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .kill_on_drop(true)
        .process_group(0);
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            die_with_parent(supervisor)?;
            // relative to the supervisor's (under a ringd that runs at 10,
            // 5 would rank the workloads above it); best effort: a lower
            // priority is always allowed, and a component at the
            // supervisor's still works
            if nice != 0 {
                let base = libc::getpriority(libc::PRIO_PROCESS, 0);
                libc::setpriority(libc::PRIO_PROCESS, 0, (base + nice).min(19));
            }
            if let Some(fd) = netns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    drop(netns);
    child
}

/// Between fork and exec (only async-signal-safe calls): the new process gets
/// SIGKILL when `parent` (the spawning process's pid) dies, and fails if it
/// died already.
pub fn die_with_parent(parent: u32) -> std::io::Result<()> {
    // SAFETY: prctl and getppid are async-signal-safe and take no pointers.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The parent may have died between fork and prctl.
        if libc::getppid() as u32 != parent {
            return Err(std::io::Error::other("the parent exited during spawn"));
        }
    }
    Ok(())
}

async fn terminate(component: Component, child: &mut tokio::process::Child, grace: Duration) {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    let Some(pid) = child.id() else { return };
    let group = Pid::from_raw(pid as i32);
    let _ = killpg(group, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(_) => tracing::info!(%component, pid, "stopped"),
        Err(_) => {
            tracing::warn!(%component, pid, ?grace, "did not stop after SIGTERM; sending SIGKILL");
            let _ = killpg(group, Signal::SIGKILL);
            let _ = child.wait().await;
        }
    }
    // Anything the component forked into its group goes too.
    let _ = killpg(group, Signal::SIGKILL);
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = nix::sys::signal::Signal::try_from(sig)
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|_| "unknown".into());
            format!("signal {sig} ({name})")
        }
        _ => "unknown exit".into(),
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// This machine's wall clock, unix ms.
pub(crate) fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The resident set size of `pid` in KiB (`VmRSS`), if it runs.
pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Runs `cmd` to completion (stdin closed), killing it after `timeout`. Its
/// stdout and stderr are read on threads of their own while it runs, so a
/// child that prints more than a pipe holds (64 KiB) never blocks on a full
/// pipe. Errors name the program; a timeout is `TimedOut` with what the child
/// had printed to stderr.
pub fn run_bounded(
    cmd: &mut std::process::Command,
    timeout: Duration,
) -> std::io::Result<std::process::Output> {
    let program = PathBuf::from(cmd.get_program());
    let named =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", program.display()));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(named)?;
    let out = Drained::start(child.stdout.take());
    let err = Drained::start(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait().map_err(named)? {
            Some(status) => break status,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                // what it printed so far: a grandchild may hold the pipe open
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "{} did not finish within {timeout:?}; stderr: {}",
                        program.display(),
                        String::from_utf8_lossy(&err.so_far()).trim()
                    ),
                ));
            }
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.finish(),
        stderr: err.finish(),
    })
}

/// A pipe read to its end on a thread of its own.
struct Drained {
    bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drained {
    fn start(pipe: Option<impl std::io::Read + Send + 'static>) -> Self {
        let bytes = std::sync::Arc::<std::sync::Mutex<Vec<u8>>>::default();
        let reader = pipe.map(|mut pipe| {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    bytes
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend_from_slice(&buf[..n]);
                }
            })
        });
        Drained { bytes, reader }
    }

    fn so_far(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Everything, once the pipe closed.
    fn finish(mut self) -> Vec<u8> {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.so_far()
    }
}

/// Whether `pid` is a live (non-zombie) process.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the ")" closing the command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
#[path = "process_tests.rs"]
mod tests;
