//! Ring: clusters that host each other's control planes.
//!
//! This crate holds the library behind `ringctl` (and, later, the `ringd`
//! daemon). Binaries only parse flags, set up logging and call into here, so
//! tests run the same code in-process.

pub mod bench;
pub mod controlplane;
pub mod decide;
pub mod node;
pub mod output;
pub mod state;
pub mod storage;

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

    /// raft-rs refused an operation.
    #[error("raft: {0}")]
    Raft(String),

    /// The durable Raft store failed or holds corrupted data.
    #[error("raft store: {0}")]
    Storage(String),

    /// Output could not be encoded.
    #[error("cannot encode output: {0}")]
    Encode(String),
}

impl RingError {
    /// Whether trying again later may help.
    pub fn is_retryable(&self) -> bool {
        match self {
            RingError::Seed(e) => e.is_retryable(),
            RingError::Io { .. } => true,
            RingError::Encode(_) | RingError::Storage(_) | RingError::Raft(_) => false,
        }
    }
}

/// Result alias of the ring crate.
pub type Result<T, E = RingError> = std::result::Result<T, E>;
