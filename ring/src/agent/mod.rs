//! `ring-agent`: what runs inside a control plane's pods on a Kubernetes seed,
//! independent of ringd (see `seed::kubernetes::agent` for how it is wired).
//!
//! - [`guard`]: runs etcd or kube-apiserver as its child only while the Lease
//!   ringd renews says so, and stops it at the fence time without asking anyone.
//! - [`backup`]: the continuous full + delta backup of the pod's etcd, while
//!   the lease is valid; progress in a ConfigMap.
//! - [`handover`]: the final snapshot of a planned migration off the seed
//!   (in the backup sidecar).
//! - [`restore`]: etcd's init container; restores from the bucket when asked.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::Api;
use seed::kubernetes::agent;

use crate::{now_ms, RingError};

pub mod backup;
pub mod forward;
pub mod guard;
pub mod handover;
mod lease_clock;
pub mod restore;

pub use lease_clock::{LeaseClock, LeaseReading};

/// How long one call to the seed cluster's API may take.
const API_TIMEOUT: Duration = Duration::from_secs(3);

/// The agent's view of its namespace in the seed cluster.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    namespace: String,
}

fn kube_err(what: &str, e: impl std::fmt::Display) -> RingError {
    RingError::Seed(seed::SeedError::Kube {
        shoot: "(agent)".into(),
        message: format!("{what}: {e}"),
    })
}

/// One call to the seed cluster's API, bounded by [`API_TIMEOUT`].
async fn call<T>(
    what: &str,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, RingError> {
    tokio::time::timeout(API_TIMEOUT, request)
        .await
        .map_err(|_| kube_err(what, "timed out"))?
        .map_err(|e| kube_err(what, e))
}

impl Cluster {
    /// The in-cluster client (the pod's service account) in `$POD_NAMESPACE`.
    pub async fn from_pod() -> Result<Self, RingError> {
        let namespace = std::env::var("POD_NAMESPACE").map_err(|_| RingError::Config {
            field: "POD_NAMESPACE".into(),
            reason: "not set; the pod must pass metadata.namespace through the downward API (Ring's manifests do)".into(),
        })?;
        let client = kube::Client::try_default()
            .await
            .map_err(|e| kube_err("connecting to the seed cluster", e))?;
        Ok(Cluster { client, namespace })
    }

    /// The fence time and validity on the Lease (fenced when there is none yet).
    pub async fn lease_reading(&self) -> Result<LeaseReading, RingError> {
        let annotations = self.lease_annotations().await?;
        Ok(LeaseReading {
            fence_at_ms: agent::fence_at_ms(annotations.as_ref()),
            valid_for_ms: agent::valid_for_ms(annotations.as_ref()),
        })
    }

    /// The epoch on the Lease: the one the holder serves at (0 when there
    /// is no Lease yet).
    pub async fn lease_epoch(&self) -> Result<u64, RingError> {
        Ok(agent::epoch(self.lease_annotations().await?.as_ref()))
    }

    /// The annotations of the Lease ringd writes (`None` when there is no
    /// Lease yet, or it has none).
    async fn lease_annotations(&self) -> Result<Option<BTreeMap<String, String>>, RingError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let lease = call("reading the lease", api.get_opt(agent::LEASE)).await?;
        Ok(lease.and_then(|l| l.metadata.annotations))
    }

    /// The data of ConfigMap `name` (empty when it does not exist).
    pub async fn configmap(&self, name: &str) -> Result<BTreeMap<String, String>, RingError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let cm = call(&format!("reading ConfigMap {name}"), api.get_opt(name)).await?;
        Ok(cm.and_then(|c| c.data).unwrap_or_default())
    }

    /// Merges `data` into ConfigMap `name`.
    pub async fn patch_configmap(
        &self,
        name: &str,
        data: BTreeMap<&str, String>,
    ) -> Result<(), RingError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let patch = Patch::Merge(serde_json::json!({ "data": data }));
        let params = PatchParams::default();
        let request = api.patch(name, &params, &patch);
        call(&format!("writing ConfigMap {name}"), request).await?;
        Ok(())
    }
}

/// The backup config at `path`, for `shoot` (the shared config names no shoot).
pub fn load_config(
    path: &std::path::Path,
    shoot: &str,
) -> Result<::backup::BackupConfig, RingError> {
    seed::validate_shoot_name(shoot)?;
    let mut config = ::backup::BackupConfig::load(path)?;
    config.shoot = shoot.to_string();
    Ok(config)
}

/// Where a guard reads its fence time.
#[derive(Clone)]
pub enum LeaseSource {
    /// The Lease `ring-lease` in the pod's namespace (a Kubernetes seed).
    Cluster(Cluster),
    /// A local seed's lease file (`seed::lease_file`).
    File(std::path::PathBuf),
}

impl LeaseSource {
    /// The recorded fence time and validity (fenced when there is none yet).
    pub async fn reading(&self) -> Result<LeaseReading, RingError> {
        match self {
            LeaseSource::Cluster(c) => c.lease_reading().await,
            LeaseSource::File(path) => seed::lease_file::read(path)
                .map(|f| LeaseReading {
                    fence_at_ms: f.fence_at_ms,
                    valid_for_ms: f.valid_for_ms,
                })
                .map_err(lease_file_error),
        }
    }

    /// The epoch the holder serves at: from the node's lease file when it
    /// records one (no seed API needed: a sidecar starting while the seed
    /// cluster's control plane is being failed over still backs up), else
    /// from the Lease in `cluster`.
    pub async fn epoch(&self, cluster: &Cluster) -> Result<u64, RingError> {
        if let LeaseSource::File(path) = self {
            let file = seed::lease_file::read(path).map_err(lease_file_error)?;
            if let Some(epoch) = file.epoch {
                return Ok(epoch);
            }
        }
        cluster.lease_epoch().await
    }
}

fn lease_file_error(reason: String) -> RingError {
    RingError::Config {
        field: "--lease-file".into(),
        reason,
    }
}

/// The fence time by this host's clock ([`LeaseClock`]), re-read every
/// `period` until the returned guard is dropped or `stop`. A failed read
/// keeps the last value, so the fence time still ends serving.
pub fn follow_lease(
    source: LeaseSource,
    period: Duration,
    stop: &tokio_util::sync::CancellationToken,
) -> (
    tokio::sync::watch::Receiver<u64>,
    tokio_util::sync::DropGuard,
) {
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let reader = stop.child_token();
    tokio::spawn(watch_lease(source, period, tx, reader.clone()));
    (rx, reader.drop_guard())
}

async fn watch_lease(
    source: LeaseSource,
    period: Duration,
    tx: tokio::sync::watch::Sender<u64>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut clock = LeaseClock::default();
    loop {
        let started = now_ms();
        match source.reading().await {
            Ok(reading) => {
                let at = clock.observe(reading, started);
                tx.send_if_modified(|v| std::mem::replace(v, at) != at);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the lease; the last fence time holds")
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_epoch_comes_from_the_node_s_lease_file_without_the_seed_api() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(seed::lease_file::FILE_NAME);
        // a seed cluster whose API does not answer (its control plane is
        // being failed over)
        let url = "https://127.0.0.1:9".parse().unwrap();
        let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
        let cluster = Cluster {
            client,
            namespace: "ring-m2".into(),
        };
        let source = LeaseSource::File(path.clone());
        seed::lease_file::write(&path, now_ms() + 60_000, Some(7)).unwrap();
        assert_eq!(source.epoch(&cluster).await.unwrap(), 7);
        // a file without an epoch (an older ringd): the Lease is asked
        seed::lease_file::write(&path, now_ms() + 60_000, None).unwrap();
        let err = source.epoch(&cluster).await.unwrap_err();
        assert!(err.to_string().contains("reading the lease"), "{err}");
    }
}
