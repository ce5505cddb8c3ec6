//! The executor of a Kubernetes seed: control planes as workloads in a
//! cluster. It starts, fences, probes and deletes them; it has no part in
//! moves or backups yet, and says so.

use std::path::Path;

use async_trait::async_trait;
use seed::{KubernetesSeed, KubernetesSeedConfig, Seed};

use super::{Executor, Mover};
use crate::RingError;

/// Control planes as workloads in a Kubernetes cluster.
pub struct KubernetesExecutor {
    seed: KubernetesSeed,
}

impl KubernetesExecutor {
    /// Connects to the seed cluster of a member's `seed.kubernetes` section.
    pub async fn connect(
        config: &KubernetesSeedConfig,
        state_dir: &Path,
    ) -> Result<Self, RingError> {
        Ok(KubernetesExecutor {
            seed: KubernetesSeed::connect(config, state_dir).await?,
        })
    }

    /// An executor over an already connected seed.
    pub fn new(seed: KubernetesSeed) -> Self {
        KubernetesExecutor { seed }
    }
}

#[async_trait]
impl Executor for KubernetesExecutor {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    fn shoots(&self) -> Vec<String> {
        self.seed.shoots()
    }

    async fn start(&self, shoot: &str) -> Result<(), RingError> {
        seed::validate_shoot_name(shoot)?;
        super::started(self.seed.start(&seed::ControlPlaneSpec::new(shoot)).await)
    }

    async fn fence(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.fence(shoot).await?)
    }

    async fn ready(&self, shoot: &str) -> bool {
        matches!(self.seed.health(shoot).await, Ok(h) if h.ready)
    }

    async fn remove(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.delete(shoot).await?)
    }

    /// Workloads outlive ringd: at shutdown they are fenced (no ringd renews
    /// their lease any more).
    async fn stop_at_shutdown(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.fence(shoot).await?)
    }

    async fn fence_moved(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.fence(shoot).await?)
    }

    fn mover(&self) -> Result<&dyn Mover, String> {
        Err("this member hosts control planes in a Kubernetes cluster; moving a control plane onto or off a Kubernetes seed (restore, handover) and backing it up are not supported yet".into())
    }
}
