//! The seed crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while hosting a control plane on a seed.
///
/// Each variant says what is wrong and how to fix it; [`SeedError::is_retryable`]
/// tells reconcilers whether trying again later can help.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// A required program is not installed where Ring looks for it.
    #[error("{binary} not found (looked in {searched}); run scripts/setup to install it, or point RING_BIN_DIR at a directory that has it")]
    MissingBinary { binary: String, searched: String },

    /// The state directory cannot be created or written.
    #[error("state dir {path} is not writable: {source}; choose a writable --state-dir")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A certificate or key file is unreadable, corrupted or does not fit the rest of the PKI.
    #[error("{path}: {reason}; restore the file from a backup, or delete it so Ring issues a new one from the shoot's CA")]
    Pki { path: PathBuf, reason: String },

    /// The control plane's CA itself is unusable (new CA = new kubeconfigs for every client).
    #[error("{path}: {reason}; restore the shoot's CA from a backup (deleting ca.crt and ca.key creates a new CA, and every kubeconfig must then be replaced)")]
    Ca { path: PathBuf, reason: String },

    /// A port a component must listen on is taken by another process.
    #[error("{addr} (for {component} of shoot {shoot}) is already in use by another process; stop that process or give the shoot another address with --api-address")]
    PortInUse {
        shoot: String,
        component: String,
        addr: std::net::SocketAddr,
    },

    /// The caller asked for something malformed (a bad shoot name, a conflicting endpoint, ...).
    #[error("invalid {field}: {reason}")]
    InvalidSpec { field: String, reason: String },

    /// Reading or writing a file of the seed's state failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Another supervisor already runs this shoot's control plane from the same state dir.
    #[error("the control plane of shoot {shoot} is already supervised by pid {pid}; stop it first (ringctl controlplane down)")]
    AlreadyRunning { shoot: String, pid: u32 },

    /// The shoot has no control plane on this seed.
    #[error(
        "shoot {shoot} has no control plane in {path}; create it with `ringctl controlplane up`"
    )]
    UnknownShoot { shoot: String, path: PathBuf },

    /// A component could not be launched at all.
    #[error("cannot start {component} ({program}): {source}")]
    Spawn {
        component: String,
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The control plane did not answer `/readyz` in time.
    #[error("control plane of shoot {shoot} not ready after {waited_secs}s: {last}")]
    NotReady {
        shoot: String,
        waited_secs: u64,
        last: String,
    },

    /// Talking to the hosted kube-apiserver failed.
    #[error("the control plane of shoot {shoot} was stopped (fenced or handed over) while it started; a later start begins again")]
    StoppedWhileStarting { shoot: String },

    #[error("kube-apiserver of shoot {shoot}: {message}")]
    Kube { shoot: String, message: String },

    /// A network command (namespaces, links, addresses) failed.
    #[error("`{command}` failed: {reason}")]
    Network { command: String, reason: String },

    /// The seed cluster runs a Kubernetes release older than Ring supports.
    #[error("the seed cluster runs Kubernetes {found}, older than {oldest}, the oldest release Ring hosts control planes on; upgrade the seed cluster or choose another")]
    UnsupportedSeedCluster { found: String, oldest: String },

    /// A node (containerd + kubelet + kube-proxy) cannot be set up or run.
    #[error("node {node}: {reason}")]
    Node { node: String, reason: String },

    /// A container image cannot be built from this machine's binaries.
    #[error("cannot build image {image}: {reason}")]
    ImageBuild { image: String, reason: String },

    /// An image archive that should have been built is not there.
    #[error("no image archive {archive}; build it with `ringctl images build`")]
    ImageMissing { archive: PathBuf },

    /// A containerd did not do what was asked (import or list images).
    #[error("containerd at {socket}: {reason}")]
    Containerd { socket: PathBuf, reason: String },

    /// The supervisor process went away before the control plane became ready.
    #[error("the supervisor of shoot {shoot} exited before the control plane was ready; last lines of {log}:\n{tail}")]
    SupervisorExited {
        shoot: String,
        log: PathBuf,
        tail: String,
    },
}

impl SeedError {
    /// Whether retrying the same operation later may succeed without anyone changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SeedError::PortInUse { .. }
                | SeedError::NotReady { .. }
                | SeedError::Kube { .. }
                | SeedError::AlreadyRunning { .. }
                | SeedError::StoppedWhileStarting { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> SeedError {
        let path = path.into();
        move |source| SeedError::Io { path, source }
    }
}

/// Result alias of the seed crate.
pub type Result<T, E = SeedError> = std::result::Result<T, E>;
