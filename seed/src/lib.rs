//! Seeds host the control planes of shoots.
//!
//! A [`Seed`] starts, stops, inspects and health-checks hosted control planes
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler). The
//! [`LocalSeed`] runs them as supervised local processes under a state
//! directory; a Kubernetes seed (workloads in a real cluster) implements the
//! same trait.

pub mod apis;
pub mod binaries;
pub mod endpoint;
mod error;
pub mod expiry;
pub mod forward;
pub mod images;
pub mod kubeconfig;
pub mod kubernetes;
pub mod leader_leases;
pub mod lease_file;
pub mod local;
pub mod netns;
pub mod node;
pub mod pki;
pub mod process;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use apis::DeprecatedApis;
pub use binaries::{Binaries, BinarySearch};
pub use endpoint::{validate_shoot_name, ShootEndpoint};
pub use error::{Result, SeedError};
pub use kubernetes::{KubernetesSeed, KubernetesSeedConfig};
pub use local::{LocalSeed, ShootLayout};
pub use process::{Component, ComponentState};

/// What a seed needs to host a shoot's control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlaneSpec {
    /// The shoot whose control plane this is.
    pub shoot: String,
    /// Where it listens; stable for the shoot's lifetime.
    pub endpoint: ShootEndpoint,
}

impl ControlPlaneSpec {
    /// A spec on the shoot's default (name-derived) endpoint.
    pub fn new(shoot: impl Into<String>) -> Self {
        let shoot = shoot.into();
        let endpoint = ShootEndpoint::for_shoot(&shoot);
        ControlPlaneSpec { shoot, endpoint }
    }

    /// Checks the name and the endpoint.
    pub fn validate(&self) -> Result<()> {
        validate_shoot_name(&self.shoot)?;
        self.endpoint.validate()
    }
}

/// The lifecycle phase of a hosted control plane as a seed sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum Phase {
    /// Nothing runs.
    Stopped,
    /// Supervised, but `/readyz` does not answer ok yet.
    Starting,
    /// `/readyz` answers ok and every component runs.
    Ready,
    /// `/readyz` answers ok but a component is down (being restarted).
    Degraded,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// One component as reported by [`Seed::inspect`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    pub component: Component,
    pub running: bool,
    #[serde(flatten)]
    pub state: ComponentState,
}

/// Everything a seed reports about a hosted control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneStatus {
    pub shoot: String,
    pub phase: Phase,
    /// `https://ADDR:PORT` of the shoot's kube-apiserver.
    pub api_url: String,
    /// The admin kubeconfig (usable with `kubectl --kubeconfig`).
    pub kubeconfig: PathBuf,
    /// The process supervising the components, if one runs.
    pub supervisor_pid: Option<u32>,
    /// Last `/readyz` answer, or why it could not be asked.
    pub readyz: String,
    pub components: Vec<ComponentStatus>,
}

/// The answer of a health check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `/readyz` answered `ok`.
    pub ready: bool,
    /// The answer, or the error.
    pub detail: String,
    /// What the control plane runs, as far as this check found out.
    #[serde(default)]
    pub versions: Versions,
}

impl Health {
    /// This answer, with etcd's version `etcd` if the control plane is ready.
    pub fn with_etcd(mut self, etcd: impl Into<String>) -> Self {
        if self.ready {
            self.versions.etcd = Some(etcd.into());
        }
        self
    }
}

/// The versions a control plane runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    /// kube-apiserver's `/version` (`v1.37.2`), asked once it is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
    /// etcd's: what its program printed (a local seed) or its image's tag,
    /// which the image build checked against the program (a Kubernetes seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<String>,
}

/// A seed: something that can host shoots' control planes.
#[async_trait::async_trait]
pub trait Seed: Send + Sync {
    /// Prepares (PKI, kubeconfigs, directories) and starts the shoot's control
    /// plane; returns once its processes are launched. Keeps any existing data.
    async fn start(&self, spec: &ControlPlaneSpec) -> Result<()>;

    /// Stops the shoot's control plane (gracefully, then forcibly), keeping its data.
    async fn stop(&self, shoot: &str) -> Result<()>;

    /// Stops serving at once (SIGKILL, no grace), keeping the data: used when the
    /// seed's lease on the shoot is about to end and it must not serve any longer.
    async fn fence(&self, shoot: &str) -> Result<()>;

    /// Reports the control plane's phase, components and endpoints.
    async fn inspect(&self, shoot: &str) -> Result<ControlPlaneStatus>;

    /// Asks the control plane's kube-apiserver for `/readyz`.
    async fn health(&self, shoot: &str) -> Result<Health>;

    /// Reissues the certificates of the shoot's control plane that expire
    /// within 30 days (or no longer name its addresses) from its CA, without
    /// stopping it: every component that reads them from files takes them by
    /// itself ([`pki::Leaf::restarts`]), the others are restarted one by one.
    /// Returns the leaves renewed, none when nothing was due.
    async fn renew_certificates(&self, shoot: &str) -> Result<Vec<pki::Leaf>>;
}

/// Polls [`Seed::health`] until ready, failing after `timeout` with the last answer.
pub async fn wait_ready(seed: &dyn Seed, shoot: &str, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match seed.health(shoot).await {
            Ok(h) if h.ready => return Ok(()),
            Ok(h) => h.detail,
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(SeedError::NotReady {
                shoot: shoot.to_string(),
                waited_secs: timeout.as_secs(),
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
