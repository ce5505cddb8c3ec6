//! The lease guard: runs one program (etcd, kube-apiserver) as its child only
//! while the Lease ringd renews is valid. The fence time is a deadline kept by
//! the guard's own clock: when ringd is killed, stopped (SIGSTOP) or cut off,
//! no renewal comes and the child is killed at the fence time; reading the
//! Lease is needed to start or keep serving, never to stop. The same guard
//! runs each process of a local seed's control plane under its lease file.

use std::time::Duration;

use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::{now_ms, RingError};

/// How often the Lease is read.
const POLL: Duration = Duration::from_millis(500);
/// First wait before restarting a child that exited by itself.
const RESTART_MIN_MS: u64 = 1_000;
/// Longest wait before such a restart.
const RESTART_MAX_MS: u64 = 10_000;
/// How long a stopping program may take after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the guard does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardAction {
    /// Start the child: the lease is valid and nothing runs.
    Start,
    /// Kill the child now: the fence time has come.
    Stop,
    /// Nothing to do.
    Wait,
}

/// The guard's decision (pure): serve exactly while `now_ms < fence_at_ms`,
/// and do not restart a child that exited before `not_before_ms`.
pub fn action(fence_at_ms: u64, now_ms: u64, running: bool, not_before_ms: u64) -> GuardAction {
    let valid = now_ms < fence_at_ms;
    match (running, valid) {
        (true, false) => GuardAction::Stop,
        (false, true) if now_ms >= not_before_ms => GuardAction::Start,
        _ => GuardAction::Wait,
    }
}

/// How long the guard may sleep: not past the fence time while the child runs.
pub fn sleep_for(fence_at_ms: u64, now_ms: u64, running: bool) -> Duration {
    let poll = POLL.as_millis() as u64;
    let ms = if running {
        fence_at_ms.saturating_sub(now_ms).min(poll)
    } else {
        poll
    };
    Duration::from_millis(ms)
}

/// Starts the guarded program; it dies with the guard (a killed guard must not
/// leave it serving).
fn spawn(command: &[String]) -> Result<Child, RingError> {
    let (program, args) = command.split_first().ok_or_else(|| RingError::Config {
        field: "command".into(),
        reason: "no program to guard; give it after `--`".into(),
    })?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let guard = std::process::id();
    // SAFETY: die_with_parent makes only async-signal-safe calls.
    unsafe {
        cmd.pre_exec(move || seed::process::die_with_parent(guard));
    }
    cmd.spawn().map_err(|source| RingError::Io {
        what: format!("starting {program}"),
        source,
    })
}

/// The child's exit (never, without one).
async fn wait(child: Option<&mut Child>) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// Kills the child at once (the fence time has come).
async fn kill(child: &mut Child, why: &str) {
    let pid = child.id();
    let _ = child.start_kill();
    let status = child.wait().await;
    tracing::warn!(?pid, ?status, why, "guarded program stopped");
}

/// Stops the child gracefully (SIGTERM, then SIGKILL after [`STOP_GRACE`]).
async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
            tracing::info!(pid, "guarded program stopped");
            return;
        }
    }
    kill(child, "it did not stop after SIGTERM").await;
}

/// How the guard treats its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In a pod: restart the program (with backoff) whenever it exited and
    /// the lease holds.
    Restart,
    /// Under a local seed's supervisor: run the program once and exit with
    /// it, or with an error when fenced; the supervisor restarts the guard.
    Once,
}

/// What a guard runs, and how.
#[derive(Debug, Clone)]
pub struct Guarded {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Restart it, or run it once.
    pub mode: Mode,
    /// `HOST:PORT` that must accept a TCP connection before each start
    /// (kube-apiserver waits for its etcd's Service: started before etcd
    /// answers, it can take tens of seconds more to serve).
    pub wait_for: Option<String>,
    /// etcd's data dir, when the program is etcd: before each start, a
    /// member whose first start was cut short (fenced or killed before it
    /// committed anything, so it could never elect itself) is moved aside
    /// and etcd bootstraps anew.
    pub etcd_data: Option<std::path::PathBuf>,
}

/// Moves `data` aside when etcd's member there never committed anything
/// ([`backup::never_committed`]): nothing on it was acknowledged, and etcd
/// restarted on it would wait for a leader for ever. A log it cannot read is
/// left as it is (etcd says what is wrong with it).
fn set_aside_if_never_committed(data: &std::path::Path) -> Result<(), RingError> {
    match backup::never_committed(data) {
        Ok(true) => {
            let aside = data.with_file_name(format!("data.never-committed-{}", now_ms()));
            tracing::warn!(data = %data.display(), aside = %aside.display(), "etcd's first start ended before it committed anything; moved aside, etcd starts anew");
            std::fs::rename(data, &aside).map_err(|source| RingError::Io {
                what: format!("moving {} aside", data.display()),
                source,
            })
        }
        Ok(false) => Ok(()),
        Err(e) => {
            tracing::warn!(data = %data.display(), error = %e, "cannot read etcd's log; starting etcd on the data as it is");
            Ok(())
        }
    }
}

/// How long one connection attempt to [`Guarded::wait_for`] may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Why `addr` does not accept a TCP connection now; `None` when it does.
async fn unanswered(addr: &str) -> Option<String> {
    let lookup = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(addr)).await;
    let first = match lookup {
        Err(_) => return Some("its name did not resolve in time".into()),
        Ok(Err(e)) => return Some(format!("its name does not resolve: {e}")),
        Ok(Ok(mut addresses)) => match addresses.next() {
            Some(first) => first,
            None => return Some("its name resolves to no address".into()),
        },
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(first)).await {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(format!("{first}: {e}")),
        Err(_) => Some(format!("{first} did not answer in time")),
    }
}

/// Whether the program may start now: what it waits for answers (logged
/// whenever the reason it does not changes).
async fn dependency_answers(wait_for: Option<&str>, waiting: &mut Option<String>) -> bool {
    let Some(addr) = wait_for else {
        return true;
    };
    let why = unanswered(addr).await;
    if let Some(why) = why.as_ref().filter(|w| waiting.as_ref() != Some(*w)) {
        tracing::info!(%addr, reason = %why, "lease valid, waiting for this address to answer before starting");
    }
    let up = why.is_none();
    *waiting = why;
    up
}

/// Runs `guarded` under the lease in `source` until `stop`.
pub async fn run(
    source: super::LeaseSource,
    guarded: Guarded,
    stop: CancellationToken,
) -> Result<(), RingError> {
    let Guarded {
        command,
        mode,
        wait_for,
        etcd_data,
    } = guarded;
    let (mut lease, _stop_reader) = super::follow_lease(source, POLL, &stop);
    let mut child: Option<Child> = None;
    let mut restarts = Restarts::default();
    let mut waiting = None;
    loop {
        let fence_at = *lease.borrow_and_update();
        let now = now_ms();
        match action(fence_at, now, child.is_some(), restarts.not_before) {
            GuardAction::Start if !dependency_answers(wait_for.as_deref(), &mut waiting).await => {}
            GuardAction::Start => {
                if let Some(data) = &etcd_data {
                    set_aside_if_never_committed(data)?;
                }
                tracing::info!(fence_at_ms = fence_at, program = %command[0], "lease valid: starting");
                child = Some(spawn(&command)?);
                restarts.started_at = now;
            }
            GuardAction::Stop => {
                if let Some(mut c) = child.take() {
                    kill(&mut c, "the lease's fence time has come").await;
                }
                if mode == Mode::Once {
                    return Err(RingError::Verification(format!(
                        "fenced: the lease ended at unix ms {fence_at} and was not renewed"
                    )));
                }
            }
            GuardAction::Wait => {}
        }
        let nap = sleep_for(fence_at, now_ms(), child.is_some());
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                if let Some(mut c) = child.take() {
                    terminate(&mut c).await;
                }
                return Ok(());
            }
            status = wait(child.as_mut()), if child.is_some() => {
                child = None;
                if mode == Mode::Once {
                    return exited(&command[0], status);
                }
                tracing::warn!(?status, "guarded program exited; restarting while the lease holds");
                restarts.exited(now_ms());
            }
            _ = lease.changed() => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// The guard's result when its program exited by itself (once mode).
fn exited(
    program: &str,
    status: std::io::Result<std::process::ExitStatus>,
) -> Result<(), RingError> {
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(RingError::Verification(format!("{program} exited: {s}"))),
        Err(source) => Err(RingError::Io {
            what: format!("waiting for {program}"),
            source,
        }),
    }
}

/// Restart backoff of a program that exited by itself.
#[derive(Debug)]
struct Restarts {
    not_before: u64,
    backoff: u64,
    started_at: u64,
}

impl Default for Restarts {
    fn default() -> Self {
        Restarts {
            not_before: 0,
            backoff: RESTART_MIN_MS,
            started_at: 0,
        }
    }
}

impl Restarts {
    /// The program exited at `now`: back off, less if it had run a while.
    fn exited(&mut self, now: u64) {
        self.backoff = if now.saturating_sub(self.started_at) > 30_000 {
            RESTART_MIN_MS
        } else {
            (self.backoff * 2).min(RESTART_MAX_MS)
        };
        self.not_before = now + self.backoff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_exactly_while_the_fence_time_is_ahead() {
        // (fence_at, now, running, not_before) -> action
        let table = [
            ((0, 1_000, false, 0), GuardAction::Wait), // no lease yet
            ((5_000, 1_000, false, 0), GuardAction::Start), // valid lease
            ((5_000, 1_000, true, 0), GuardAction::Wait), // serving
            ((5_000, 5_000, true, 0), GuardAction::Stop), // fence time reached
            ((5_000, 9_000, true, 0), GuardAction::Stop), // ringd stopped renewing
            ((5_000, 9_000, false, 0), GuardAction::Wait), // fenced, stays down
            ((9_000, 1_000, false, 2_000), GuardAction::Wait), // crashed: backoff
            ((9_000, 2_000, false, 2_000), GuardAction::Start),
        ];
        for ((fence, now, running, nb), want) in table {
            assert_eq!(
                action(fence, now, running, nb),
                want,
                "{fence} {now} {running} {nb}"
            );
        }
    }

    /// Waits (bounded) until `path` exists.
    async fn appears(path: &std::path::Path, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if path.exists() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        path.exists()
    }

    #[tokio::test]
    async fn a_guard_that_waits_for_an_address_starts_its_program_once_it_answers() {
        let dir = tempfile::tempdir().unwrap();
        let lease = dir.path().join(seed::lease_file::FILE_NAME);
        seed::lease_file::write(&lease, now_ms() + 60_000, Some(1)).unwrap();
        // a free port: nothing listens on it yet
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let started = dir.path().join("started");
        let guarded = Guarded {
            command: vec![
                "sh".into(),
                "-c".into(),
                format!("touch {}; sleep 30", started.display()),
            ],
            mode: Mode::Restart,
            wait_for: Some(addr.to_string()),
            etcd_data: None,
        };
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        let guard = tokio::spawn(run(
            super::super::LeaseSource::File(lease),
            guarded,
            stop.clone(),
        ));
        assert!(
            !appears(&started, Duration::from_millis(1_500)).await,
            "the program started although {addr} did not answer"
        );
        let _listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        assert!(
            appears(&started, Duration::from_secs(5)).await,
            "the program did not start within 5 s of {addr} answering"
        );
        stop.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(15), guard).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    }

    #[test]
    fn never_sleeps_past_the_fence_time_while_serving() {
        assert_eq!(sleep_for(1_300, 1_000, true), Duration::from_millis(300));
        assert_eq!(sleep_for(1_000, 2_000, true), Duration::ZERO);
        assert_eq!(sleep_for(99_000, 1_000, true), POLL);
        assert_eq!(sleep_for(1_001, 1_000, false), POLL);
    }
}
