//! `ringd --supervise`: a member's ringd as a host process that comes back by
//! itself. The supervisor runs `ringd --config ...` as its child and starts it
//! again, with backoff, whenever it exits, until SIGTERM (then it stops the
//! child, gracefully first). `ringctl bootstrap` starts every member this way.
//!
//! Why a supervised host process and not a static pod of the member's node:
//! ringd is what brings a shoot up in the first place. It must run before
//! any control plane or node exists (it hosts the temporary control planes that
//! the nodes register with during bootstrap and DR), and a member whose own
//! control plane is lost must still vote and restore it elsewhere. A static pod
//! would need the node, and the node needs a control plane. The supervisor and
//! the node are the member's machine: killing the machine kills both (the child
//! dies with the supervisor through its parent-death signal).
//!
//! A ringd that exits with [`EXIT_PERMANENT`] (a bad config, a damaged Raft
//! store) is not started again: the supervisor exits with the same code and the
//! log says why; nothing restarts for ever what cannot work.

use std::path::{Path, PathBuf};
use std::time::Duration;

use seed::process::{supervise, Component, ComponentSpec, States, SupervisorTuning};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::RingdConfig;
use crate::RingError;

/// The exit code of a ringd whose error no restart can fix (`EX_CONFIG` of
/// sysexits.h); any other failure is restarted.
pub const EXIT_PERMANENT: u8 = 78;

/// The exit code of ringd for `error`.
pub fn exit_code(error: &RingError) -> u8 {
    match error.is_retryable() {
        true => 1,
        false => EXIT_PERMANENT,
    }
}

/// How the member's ringd is restarted: soon after a crash, at most every 30 s
/// when it keeps failing, and given 30 s to stop its control planes on SIGTERM.
fn tuning() -> SupervisorTuning {
    SupervisorTuning {
        restart_initial: Duration::from_millis(500),
        restart_max: Duration::from_secs(30),
        healthy_after: Duration::from_secs(60),
        stop_grace: Duration::from_secs(30),
        permanent_exit: Some(i32::from(EXIT_PERMANENT)),
    }
}

/// What the supervisor runs: this program with `--config`, its output where
/// the supervisor's own goes (its stderr, the member's log).
fn spec(program: PathBuf, config: &Path) -> ComponentSpec {
    ComponentSpec {
        component: Component::Ringd,
        program,
        args: vec!["--config".into(), config.display().to_string()],
        log: PathBuf::from("/proc/self/fd/2"),
        netns: None,
    }
}

/// Supervises `ringd --config CONFIG` until `shutdown`. Refuses at once a
/// config that ringd would refuse; ends with an error when ringd exited
/// saying that a restart cannot help.
pub async fn run(config: &Path, shutdown: CancellationToken) -> Result<(), RingError> {
    let member = RingdConfig::load(config)?.name;
    let span = tracing::info_span!("ringd-supervisor", %member);
    let _enter = span.enter();
    let program = std::env::current_exe().map_err(|source| RingError::Io {
        what: "finding this program's path".into(),
        source,
    })?;
    let (states, observed) = watch::channel(States::new());
    tracing::info!(config = %config.display(), "supervising ringd");
    supervise(spec(program, config), shutdown.clone(), states, tuning()).await;
    if shutdown.is_cancelled() {
        return Ok(());
    }
    let last = observed
        .borrow()
        .get(&Component::Ringd)
        .and_then(|s| s.last_exit.clone())
        .unwrap_or_default();
    Err(RingError::Exited(format!(
        "ringd of member {member} exited ({last}) with an error no restart can fix; its log above says which"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_a_retry_may_fix_are_restarted() {
        let io = RingError::Io {
            what: "binding".into(),
            source: std::io::Error::other("address in use"),
        };
        assert_eq!(exit_code(&io), 1);
        let config = RingError::Config {
            field: "peers".into(),
            reason: "empty".into(),
        };
        assert_eq!(exit_code(&config), EXIT_PERMANENT);
        assert_eq!(
            exit_code(&RingError::Storage("torn".into())),
            EXIT_PERMANENT
        );
    }

    #[tokio::test]
    async fn a_bad_config_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ringd.yaml");
        std::fs::write(&path, "kind: RingMember\nbogus: 1\n").unwrap();
        let err = run(&path, CancellationToken::new()).await.unwrap_err();
        assert!(matches!(err, RingError::Config { .. }), "{err}");
    }
}
