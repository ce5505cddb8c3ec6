//! Processes this crate starts and stops: [`spawn_detached`] starts one in a
//! session of its own, [`stop_processes`] stops several (SIGTERM, then SIGKILL)
//! and reports how each ended.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{io, BootstrapError};

/// Starts `program ARGS` in a session of its own (so it outlives this command),
/// appending its output to `log`, optionally inside network namespace `netns`;
/// returns its pid. Not waited for: once this command exits, init reaps it.
pub(crate) fn spawn_detached(
    program: &Path,
    args: &[std::ffi::OsString],
    log: &Path,
    netns: Option<&std::fs::File>,
    env: &[(String, String)],
) -> Result<u32, BootstrapError> {
    use std::os::unix::process::CommandExt;
    if !program.exists() {
        return Err(BootstrapError::Unsupported(format!(
            "{} is missing; build it with `cargo build --workspace --bins`",
            program.display()
        )));
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("opening {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io(format!("opening {}", log.display())))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env(
            "RUST_LOG",
            std::env::var("RING_LOG")
                .unwrap_or_else(|_| "info,raft=warn,h2=warn,tower=warn,kube_client=off".into()),
        )
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    let netns_fd = netns.map(std::os::fd::AsRawFd::as_raw_fd);
    // SAFETY: setsid and setns are async-signal-safe syscalls; the namespace
    // file stays open (borrowed) until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = netns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(io(format!("starting {}", program.display())))?;
    let pid = child.id();
    // reaped when it exits: a long-running caller (a drill runner restarting
    // members) collected a zombie per process it ever started; a short one
    // (`ringctl bootstrap`) exits first and its children go to init
    let reaper = std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || child.wait());
    if let Err(e) = reaper {
        tracing::debug!(pid, error = %e, "cannot start a thread to reap the process; it stays a zombie once it exits");
    }
    Ok(pid)
}

/// How a process that was asked to stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StopOutcome {
    /// It exited after SIGTERM within the grace.
    Exited,
    /// It ignored SIGTERM for the whole grace and exited after SIGKILL.
    Killed,
    /// It was still there [`KILL_WAIT`] after SIGKILL (e.g. stuck in the
    /// kernel on a hung mount): the operator must look at it.
    StillRunning,
}

/// One process `down` stopped: its name, pid and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    pub name: String,
    pub pid: u32,
    pub outcome: StopOutcome,
}

/// How long a process may take to disappear after SIGKILL.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

/// Sends SIGTERM to every `(name, pid)`, waits until `still_running(name)` is
/// false for all or `grace` passed, then SIGKILLs the rest and waits (at most
/// [`KILL_WAIT`]) until they are gone; returns how each ended.
pub(crate) async fn stop_processes(
    running: Vec<(String, u32)>,
    still_running: impl Fn(&str) -> bool,
    grace: Duration,
    what: &str,
) -> Vec<Stopped> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    for (_, pid) in &running {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
    }
    let wait_gone = |name: &str, until: Instant| {
        let name = name.to_string();
        let still_running = &still_running;
        async move {
            while still_running(&name) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            !still_running(&name)
        }
    };
    let deadline = Instant::now() + grace;
    let mut stopped = Vec::new();
    for (name, pid) in running {
        let outcome = if wait_gone(&name, deadline).await {
            StopOutcome::Exited
        } else {
            tracing::warn!(%name, pid, "{what} ignored SIGTERM; killing it");
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            if wait_gone(&name, Instant::now() + KILL_WAIT).await {
                StopOutcome::Killed
            } else {
                tracing::error!(%name, pid, "{what} is still there after SIGKILL");
                StopOutcome::StillRunning
            }
        };
        stopped.push(Stopped { name, pid, outcome });
    }
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A started process that exits is reaped, not left a zombie.
    #[test]
    fn an_exited_process_is_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let args = ["-c".into(), "exit 0".into()];
        let pid = spawn_detached(
            Path::new("/bin/sh"),
            &args,
            &dir.path().join("log"),
            None,
            &[],
        )
        .unwrap();
        let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while proc_dir.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
        assert!(!proc_dir.exists(), "pid {pid} is still there: {stat}");
    }
}
