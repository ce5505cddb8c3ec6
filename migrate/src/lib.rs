//! Moving a shoot's control plane from one seed to another.
//!
//! A planned migration has two sides, each an explicit plan with a pure `next`
//! step decided from what is on disk, so a crash on either side resumes:
//!
//! - the **source** stops the writers (kube-apiserver, controller-manager,
//!   scheduler) while etcd keeps running, takes the final snapshot at etcd's
//!   final revision (with its `HashKV`), stops etcd, and reports the handover;
//! - the **target** fetches the shoot's PKI, spec and snapshot, restores the
//!   snapshot into a fresh data dir with `etcdutl snapshot restore`, starts the
//!   control plane on the shoot's unchanged endpoint, and verifies that etcd's
//!   `HashKV` at the snapshot's revision is the source's.

pub mod handover;
pub mod plan;

/// Errors of a migration.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The seed (hosting the control plane) failed.
    #[error(transparent)]
    Seed(#[from] seed::SeedError),
    /// Talking to the shoot's etcd failed.
    #[error("etcd of shoot {shoot}: {message}")]
    Etcd { shoot: String, message: String },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// `etcdutl snapshot restore` failed.
    #[error("restoring shoot {shoot}: {message}")]
    Restore { shoot: String, message: String },
    /// The restored data is not what the source had.
    #[error("verification of shoot {shoot} failed: {message}")]
    Verify { shoot: String, message: String },
    /// A handover file is missing or malformed.
    #[error("handover of shoot {shoot}: {message}")]
    Handover { shoot: String, message: String },
}

impl MigrateError {
    /// Whether retrying the step later may succeed (the data itself is not at fault).
    pub fn is_retryable(&self) -> bool {
        match self {
            MigrateError::Seed(e) => e.is_retryable(),
            MigrateError::Etcd { .. } | MigrateError::Io { .. } => true,
            MigrateError::Restore { .. }
            | MigrateError::Verify { .. }
            | MigrateError::Handover { .. } => false,
        }
    }
}

/// Result alias of the migrate crate.
pub type Result<T, E = MigrateError> = std::result::Result<T, E>;
