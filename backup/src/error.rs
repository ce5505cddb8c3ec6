//! The one error type of the backup crate.

/// Everything that can go wrong while backing up, verifying or restoring.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A configuration value (file or flag) is wrong.
    #[error("config {field}: {reason}")]
    Config { field: String, reason: String },

    /// The bucket (or local folder) does not exist.
    #[error("bucket {bucket} does not exist: {hint}")]
    BucketMissing { bucket: String, hint: String },

    /// The object store cannot be reached (connection refused, timeout).
    #[error("bucket {bucket} is unreachable: {message}")]
    BucketUnreachable { bucket: String, message: String },

    /// Any other object-store failure.
    #[error("bucket {bucket}: {message}")]
    Bucket {
        bucket: String,
        message: String,
        retryable: bool,
    },

    /// An object is damaged: checksum mismatch, truncated, malformed.
    #[error("object {object}: {problem}")]
    Corrupt { object: String, problem: String },

    /// The object was encrypted with another key than the configured one.
    #[error("object {object} was encrypted with key id {object_key} (check {object_check}), but the configured key is {configured_key} (check {configured_check}): use the key the backup was written with")]
    WrongKey {
        object: String,
        object_key: String,
        object_check: String,
        configured_key: String,
        configured_check: String,
    },

    /// The object is not what the configured key and shoot vouch for: not
    /// encrypted although a key is configured, or written for another shoot.
    #[error("object {object} is not trusted: {problem}")]
    Untrusted { object: String, problem: String },

    /// The object is encrypted and no key was given.
    #[error("object {object} is encrypted with key id {key_id}: give the key (--key-file/--key-env, or encryption in the config)")]
    KeyRequired { object: String, key_id: String },

    /// Talking to etcd failed.
    #[error("etcd {endpoint}: {message}")]
    Etcd { endpoint: String, message: String },

    /// etcd compacted the revision a watch wanted to start from.
    #[error("etcd compacted its history up to revision {compacted}; revision {requested} is gone (a new full snapshot is needed)")]
    Compacted { requested: i64, compacted: i64 },

    /// Revisions are missing from the backup.
    #[error("revisions {from}..={to} are missing from the backup ({detail}); restore to revision {} or earlier, or pass --allow-gap to skip them knowingly", from - 1)]
    Gap { from: i64, to: i64, detail: String },

    /// The backup cannot serve the request (nothing there, target out of range, ...).
    #[error("{0}")]
    Catalog(String),

    /// A newer epoch writes the shoot's backups: this writer was fenced.
    #[error("epoch {newer} of shoot {shoot} began at revision {from_revision} in the bucket, so this backup at epoch {epoch} is stale (its host was fenced or replaced); it stops writing")]
    Superseded {
        shoot: String,
        epoch: u64,
        newer: u64,
        from_revision: i64,
    },

    /// Restoring failed.
    #[error("restore: {0}")]
    Restore(String),

    /// Another restore into the same data dir runs (it holds `lock`).
    #[error("another restore into {data_dir} is running (it holds {lock}): wait for it to end, or stop it, before restoring again")]
    RestoreBusy { data_dir: String, lock: String },

    /// The restored data is not what the source had.
    #[error("verification failed: {0}")]
    Verify(String),

    /// A local file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A program (etcd, etcdutl) is not installed.
    #[error("{binary} not found (searched {searched}): run scripts/setup")]
    MissingBinary { binary: String, searched: String },

    /// A program (etcd, etcdutl) failed.
    #[error("{program} failed: {message}")]
    Tool { program: String, message: String },

    /// The work was cancelled (shutdown).
    #[error("cancelled")]
    Cancelled,
}

impl BackupError {
    /// Whether trying again later may help (the data itself is not at fault).
    pub fn is_retryable(&self) -> bool {
        match self {
            BackupError::BucketUnreachable { .. }
            | BackupError::Etcd { .. }
            | BackupError::Io { .. }
            | BackupError::RestoreBusy { .. } => true,
            BackupError::Bucket { retryable, .. } => *retryable,
            BackupError::Config { .. }
            | BackupError::BucketMissing { .. }
            | BackupError::Corrupt { .. }
            | BackupError::WrongKey { .. }
            | BackupError::Untrusted { .. }
            | BackupError::KeyRequired { .. }
            | BackupError::Compacted { .. }
            | BackupError::Gap { .. }
            | BackupError::Catalog(_)
            | BackupError::Superseded { .. }
            | BackupError::Restore(_)
            | BackupError::Verify(_)
            | BackupError::MissingBinary { .. }
            | BackupError::Tool { .. }
            | BackupError::Cancelled => false,
        }
    }

    /// A config error for `field`.
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        BackupError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An object the key and shoot do not vouch for (see [`BackupError::Untrusted`]).
    pub fn untrusted(object: impl Into<String>, problem: impl Into<String>) -> Self {
        BackupError::Untrusted {
            object: object.into(),
            problem: problem.into(),
        }
    }

    /// A corruption of `object`.
    pub fn corrupt(object: impl Into<String>, problem: impl Into<String>) -> Self {
        BackupError::Corrupt {
            object: object.into(),
            problem: problem.into(),
        }
    }
}

/// Maps an I/O error to [`BackupError::Io`] naming what was done.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackupError {
    let what = what.into();
    move |source| BackupError::Io { what, source }
}

/// `io` for an operation on a path.
pub(crate) fn io_at(
    verb: &str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> BackupError {
    io(format!("{verb} {}", path.display()))
}

/// A missing program, with the fix.
pub(crate) fn missing_binary(e: seed::SeedError, name: &str) -> BackupError {
    match e {
        seed::SeedError::MissingBinary { binary, searched } => {
            BackupError::MissingBinary { binary, searched }
        }
        other => BackupError::MissingBinary {
            binary: name.to_string(),
            searched: other.to_string(),
        },
    }
}

/// Result alias of the backup crate.
pub type Result<T, E = BackupError> = std::result::Result<T, E>;
