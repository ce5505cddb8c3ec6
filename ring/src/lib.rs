//! Ring: clusters that host each other's control planes.
//!
//! This crate holds the library behind the `ringd` daemon and the `ringctl`
//! CLI. Binaries only parse flags, set up logging and call into here, so tests
//! run the same code in-process.

pub mod admin;
pub mod agent;
pub mod backups;
pub mod ca_rotation;
pub mod certs;
pub mod client;
pub mod config;
pub mod daemon;
pub mod decide;
pub mod describe;
pub mod executor;
pub mod identity;
pub mod localring;
pub mod member;
pub mod metrics;
pub mod node;
pub mod node_task;
pub mod peer_proposal;
pub mod quorum;
pub mod shared;
pub mod state;
pub mod status;
pub mod storage;
pub mod supervisor;
pub mod transport;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Logs to stderr, filtered by `RUST_LOG` (default: info, quiet Raft and
/// Kubernetes clients); the binaries' one way to start tracing.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("info,raft=warn,kube_client=off,h2=warn,tower=warn")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Cancels `shutdown` at the first SIGTERM or SIGINT (a task on the current
/// runtime): the daemons' binaries turn signals into an orderly stop this way.
pub fn cancel_on_signals(shutdown: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        shutdown.cancel();
    });
}

/// Errors of the ring crate.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// Something the seed (hosting control planes) reported.
    #[error(transparent)]
    Seed(#[from] seed::SeedError),

    /// A local file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A configuration value is wrong.
    #[error("config {field}: {reason}")]
    Config { field: String, reason: String },

    /// A peer or the network failed.
    #[error("{0}")]
    Transport(String),

    /// A proposal did not commit.
    #[error(transparent)]
    Propose(#[from] crate::node_task::ProposeError),

    /// raft-rs refused an operation.
    #[error("raft: {0}")]
    Raft(String),

    /// A peer asked for what it may not (a proposal outside its duties):
    /// dropped, with the member and what it asked named.
    #[error("refused: {0}")]
    Refused(String),

    /// The durable Raft store failed or holds corrupted data.
    #[error("raft store: {0}")]
    Storage(String),

    /// Another process holds the Raft store open (another ringd of this member,
    /// or one killed a moment ago whose threads are still exiting).
    #[error("raft store {0} is open in another process: stop the other ringd of this member (see its ringd.pid) and start again")]
    StoreLocked(String),

    /// Output could not be encoded.
    #[error("cannot encode output: {0}")]
    Encode(String),

    /// The bucket, a backup or a restore from it failed (its kind kept).
    #[error(transparent)]
    Backup(#[from] ::backup::BackupError),

    /// A step of a planned move failed (its kind kept).
    #[error(transparent)]
    Migrate(#[from] migrate::MigrateError),

    /// This member's seed cannot do what was asked (e.g. restore onto a
    /// Kubernetes seed); the reason says which seed and what is missing.
    #[error("{0}")]
    Unsupported(String),

    /// Restored data does not match what was backed up or handed over: the
    /// copy here is not trustworthy, so retrying the same step cannot help.
    #[error("verification failed: {0}")]
    Verification(String),

    /// A supervised ringd exited saying that starting it again cannot help.
    #[error("{0}")]
    Exited(String),

    /// A step of an operation took longer than its deadline and was given
    /// up (tried again, within the operation's retry budget).
    #[error("{step} took longer than {secs} s: given up")]
    StepTimeout { step: &'static str, secs: u64 },
}

impl RingError {
    /// Whether trying again later may help.
    pub fn is_retryable(&self) -> bool {
        match self {
            RingError::Seed(e) => e.is_retryable(),
            RingError::Io { .. }
            | RingError::Transport(_)
            | RingError::StoreLocked(_)
            | RingError::StepTimeout { .. } => true,
            RingError::Propose(e) => e.is_retryable(),
            RingError::Config { .. } => false,
            RingError::Backup(e) => e.is_retryable(),
            RingError::Migrate(e) => e.is_retryable(),
            RingError::Encode(_)
            | RingError::Storage(_)
            | RingError::Raft(_)
            | RingError::Refused(_)
            | RingError::Unsupported(_)
            | RingError::Verification(_)
            | RingError::Exited(_) => false,
        }
    }
}

/// Result alias of the ring crate.
pub type Result<T, E = RingError> = std::result::Result<T, E>;
