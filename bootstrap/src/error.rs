//! The crate's error type, [`BootstrapError`], and the helper that wraps an
//! I/O error with what was being done.

use std::path::PathBuf;

use ringd::RingError;

/// Errors of bootstrapping and operating a local ring.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The Ring config is wrong.
    #[error("config {field}: {reason}")]
    Config { field: String, reason: String },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A ringd could not be reached or refused.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The state dir already holds another ring.
    #[error("{dir} already holds ring {existing:?} with a different config; run without --config to resume it, or pick another --ring-dir")]
    Conflict { dir: PathBuf, existing: String },
    /// A step did not finish in time.
    #[error("{step} did not finish within {waited_secs}s: {detail}")]
    Timeout {
        step: String,
        waited_secs: u64,
        detail: String,
    },
    /// Something asked for is not available yet.
    #[error("{0}")]
    Unsupported(String),
    /// A seed or node operation failed.
    #[error(transparent)]
    Seed(#[from] seed::SeedError),
}

impl BootstrapError {
    /// Whether running the same command again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BootstrapError::Timeout { .. } | BootstrapError::Io { .. }
        ) || matches!(self, BootstrapError::Ring(e) if e.is_retryable())
            || matches!(self, BootstrapError::Seed(e) if e.is_retryable())
    }
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let what = what.into();
    move |source| BootstrapError::Io { what, source }
}
