//! The executor of a Kubernetes seed: control planes as workloads in a
//! cluster, with `ring-agent` next to them (see `seed::kubernetes::agent`):
//! etcd and kube-apiserver run under the lease guard, which reads the Lease
//! this executor writes at every renewal; etcd's sidecar backs up into the
//! ring's bucket and its init container restores from it for a failover onto
//! this seed. A planned migration goes through the bucket: off this seed, the
//! sidecar stores the final snapshot there (`kubernetes_handover`); onto it,
//! the init container restores the fetched final snapshot from there
//! (`kubernetes_restore`). Without a bucket the seed refuses migrations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use migrate::handover;
use migrate::plan::SourceView;
use seed::kubernetes::agent::{self, LeaseRecord, PodBackup, Wiring};
use seed::{Component, KubernetesSeed, KubernetesSeedConfig, Seed, ShootLayout};

use super::{record, Executor, Mover, Objects, TargetFacts, WRITERS};
use crate::backups::{BackupPlan, RingBucket, SidecarProgress, SidecarReport};
use crate::RingError;

/// Why planned migrations are refused without a bucket.
const NO_BUCKET: &str = "a planned migration onto or off a Kubernetes seed goes through the ring's bucket, and this member has none: set backup.bucket";

/// Control planes as workloads in a Kubernetes cluster.
pub struct KubernetesExecutor {
    seed: Arc<KubernetesSeed>,
    member: String,
    /// The ring's bucket (backups, failovers and migrations go through it).
    bucket: Option<RingBucket>,
    /// The newest lease record per shoot (written again when a start applies the objects).
    leases: Mutex<BTreeMap<String, LeaseRecord>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What etcd's sidecar and init container get: the bucket, its key, and how
/// to reach etcd inside the pod (the shoot is given on their command line).
pub fn pod_backup(rb: &RingBucket) -> Result<PodBackup, RingError> {
    let pki = |f: &str| Some(PathBuf::from(format!("/etc/ring/pki/{f}")));
    let etcd = backup::EtcdConfig {
        endpoints: vec!["https://127.0.0.1:2379".into()],
        ca_file: pki("ca.crt"),
        cert_file: pki("etcd-client.crt"),
        key_file: pki("etcd-client.key"),
        server_name: Some("localhost".into()),
    };
    // the pods do not share ringd's environment: what it gives the bucket
    // (an S3 endpoint, keys) goes into their config; never a loopback endpoint
    let bucket = rb.config.for_pods("backup.bucket")?;
    let mut config = backup::BackupConfig::new(agent::SHOOT_FROM_FLAG, etcd, bucket);
    config.schedule.full_after_revisions = 2000;
    let mut files = BTreeMap::new();
    if let Some(key) = rb.key() {
        let name = "encryption.key";
        files.insert(name.to_string(), key.to_hex().into_bytes());
        config.encryption = Some(backup::config::EncryptionConfig {
            key_file: Some(Path::new(agent::BACKUP_MOUNT).join(name)),
            key_env: None,
            key_id: Some(key.id.clone()),
        });
    }
    let yaml = serde_yaml::to_string(&config).map_err(|e| RingError::Encode(e.to_string()))?;
    files.insert(agent::BACKUP_CONFIG.to_string(), yaml.into_bytes());
    let host_dir = rb.config.url.strip_prefix("file://").map(PathBuf::from);
    Ok(PodBackup { files, host_dir })
}

impl KubernetesExecutor {
    /// Connects to the seed cluster of a member's `seed.kubernetes` section;
    /// with a bucket, control planes get the backup sidecar and restore init container.
    pub async fn connect(
        config: &KubernetesSeedConfig,
        sc: &crate::config::SeedConfig,
        member: &str,
        bucket: Option<&RingBucket>,
    ) -> Result<Self, RingError> {
        let wiring = Wiring {
            guard: true,
            backup: bucket.map(pod_backup).transpose()?,
        };
        let seed = KubernetesSeed::connect(config, &sc.state_dir)
            .await?
            .with_deprecated_apis(sc.deprecated_apis)
            .with_wiring(wiring)
            .with_forwarder(super::agent_binary()?);
        Ok(Self::new(seed, member, bucket.cloned()))
    }

    /// An executor over an already connected seed.
    pub fn new(seed: KubernetesSeed, member: &str, bucket: Option<RingBucket>) -> Self {
        KubernetesExecutor {
            seed: Arc::new(seed),
            member: member.to_string(),
            bucket,
            leases: Mutex::new(BTreeMap::new()),
        }
    }

    /// The bucket a migration goes through.
    fn migration_bucket(&self) -> Result<&RingBucket, RingError> {
        self.bucket
            .as_ref()
            .ok_or_else(|| RingError::Unsupported(NO_BUCKET.into()))
    }

    /// The shoot's dir of local caches (PKI, spec, restore record).
    pub(super) fn layout(&self, shoot: &str) -> ShootLayout {
        self.seed.shoot_layout(shoot)
    }

    /// Lets the relay of the shoot's stable endpoint listen until
    /// `fence_at_ms` (0: stop now).
    fn relay_until(&self, shoot: &str, fence_at_ms: u64) -> Result<(), RingError> {
        Ok(seed::lease_file::record(
            &self.layout(shoot),
            fence_at_ms,
            None,
        )?)
    }

    /// Records `record` and writes it to the Lease (if the control plane
    /// exists). With `leaseFromNode` the pods' guards and backup sidecar
    /// follow the lease file in the node's dir instead: written first, so a
    /// seed API that hangs holds up neither renewals nor fences.
    async fn record_lease(&self, shoot: &str, record: LeaseRecord) -> Result<(), RingError> {
        self.record_lease_on_node(shoot, &record)?;
        self.seed.write_lease(shoot, &record).await?;
        Ok(())
    }

    /// Remembers `record` and, with `leaseFromNode`, writes the node's lease
    /// file; whether the guards follow that file.
    fn record_lease_on_node(&self, shoot: &str, record: &LeaseRecord) -> Result<bool, RingError> {
        lock(&self.leases).insert(shoot.to_string(), record.clone());
        let Some(dir) = self.seed.node_dir(shoot) else {
            return Ok(false);
        };
        seed::lease_file::record(&ShootLayout { dir }, record.fence_at_ms, Some(record.epoch))?;
        Ok(true)
    }

    /// Once the API answers: controller-manager and scheduler pods that
    /// crashed while it did not start again now rather than after their
    /// back-off (a failure is only logged: they come back after it anyway).
    async fn replace_backed_off(&self, shoot: &str) {
        if let Err(e) = self.seed.replace_backed_off(shoot).await {
            tracing::warn!(%shoot, error = %e, "cannot replace pods left in back-off");
        }
    }

    /// Tells the guards to stop at once.
    async fn fence_now(&self, shoot: &str) -> Result<(), RingError> {
        let relay = self.relay_until(shoot, 0);
        self.guard_until(shoot, 0, Duration::from_secs(1)).await?;
        relay
    }

    /// Lets the guards run their child until `fence_at_ms` (0: stop now),
    /// at the epoch last recorded.
    pub(super) async fn guard_until(
        &self,
        shoot: &str,
        fence_at_ms: u64,
        window: Duration,
    ) -> Result<(), RingError> {
        let epoch = lock(&self.leases).get(shoot).map_or(0, |r| r.epoch);
        let record = LeaseRecord {
            holder: self.member.clone(),
            epoch,
            fence_at_ms,
            duration_secs: window.as_secs().max(1),
        };
        self.record_lease(shoot, record).await
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
        let spec = seed::ControlPlaneSpec::new(shoot);
        super::started(self.seed.start(&spec).await)?;
        let layout = self.layout(shoot);
        let json = serde_json::to_vec(&spec).map_err(|e| RingError::Encode(e.to_string()))?;
        seed::pki::write_private(&layout.spec_file(), &json)?;
        let record = lock(&self.leases).get(shoot).cloned();
        if let Some(r) = record {
            self.seed.write_lease(shoot, &r).await?;
        }
        Ok(())
    }

    async fn fence(&self, shoot: &str) -> Result<(), RingError> {
        if let Err(e) = self.fence_now(shoot).await {
            tracing::warn!(%shoot, error = %e, "cannot write the fenced lease; scaling down still");
        }
        Ok(self.seed.fence(shoot).await?)
    }

    async fn renew_certificates(&self, shoot: &str) -> Result<Vec<seed::pki::Leaf>, RingError> {
        Ok(self.seed.renew_certificates(shoot).await?)
    }

    async fn health(&self, shoot: &str) -> seed::Health {
        let health = self
            .seed
            .health(shoot)
            .await
            .unwrap_or_else(|e| seed::Health {
                detail: e.to_string(),
                ..Default::default()
            });
        if health.ready {
            self.replace_backed_off(shoot).await;
        }
        health
    }

    async fn remove(&self, shoot: &str) -> Result<(), RingError> {
        lock(&self.leases).remove(shoot);
        Ok(self.seed.delete(shoot).await?)
    }

    /// Workloads outlive ringd: at shutdown they are fenced (no ringd renews
    /// their lease any more).
    async fn stop_at_shutdown(&self, shoot: &str) -> Result<(), RingError> {
        self.fence(shoot).await
    }

    async fn fence_moved(&self, shoot: &str) -> Result<(), RingError> {
        self.fence(shoot).await
    }

    async fn lease_renewed(&self, shoot: &str, epoch: u64, fence_at_ms: u64, lease: Duration) {
        let record = LeaseRecord {
            holder: self.member.clone(),
            epoch,
            fence_at_ms,
            duration_secs: lease.as_secs().max(1),
        };
        if let Err(e) = self.relay_until(shoot, fence_at_ms) {
            tracing::warn!(%shoot, epoch, error = %e, "cannot write the lease file of the stable endpoint's relay; it stops at the last fence time");
        } else if let Err(e) = self.seed.resume_relay(shoot).await {
            tracing::warn!(%shoot, epoch, error = %e, "cannot resume the stable endpoint's relay");
        }
        // bounded: a seed cluster's API that hangs must not hold up the next
        // renewal (nor the lease file written above)
        let bound = lease / crate::config::FENCE_EARLY_DIVISOR;
        let from_node = match self.record_lease_on_node(shoot, &record) {
            Ok(from_node) => from_node,
            Err(e) => {
                tracing::warn!(%shoot, epoch, error = %e, "cannot write the node's lease file; the guards fence at the last fence time");
                return;
            }
        };
        let write = self.seed.write_lease(shoot, &record);
        match tokio::time::timeout(bound, write).await {
            Ok(Ok(_)) => {}
            // the guards follow the node's lease file, written first: a seed
            // API that is away (its own control plane moving) fences nothing
            Ok(Err(e)) if from_node => {
                tracing::info!(%shoot, epoch, error = %e, "the seed cluster's API did not take the lease; the guards follow the node's lease file, renewed")
            }
            Err(_) if from_node => {
                tracing::info!(%shoot, epoch, waited = ?bound, "the seed cluster's API did not take the lease in time; the guards follow the node's lease file, renewed")
            }
            Ok(Err(e)) => {
                tracing::warn!(%shoot, epoch, error = %e, "cannot write the lease for the guards; they fence at the last fence time")
            }
            Err(_) => {
                tracing::warn!(%shoot, epoch, waited = ?bound, "the seed cluster did not take the lease in time; the guards fence at the last fence time")
            }
        }
    }

    fn mover(&self) -> Result<&dyn Mover, String> {
        Ok(self)
    }

    fn pki_dir(&self, shoot: &str) -> Option<std::path::PathBuf> {
        Some(self.seed.pki_cache(shoot))
    }
}

#[async_trait]
impl Mover for KubernetesExecutor {
    fn migrates(&self) -> Result<(), String> {
        self.migration_bucket()
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn shoot_layout(&self, shoot: &str) -> ShootLayout {
        self.layout(shoot)
    }

    fn admin_kubeconfig(&self, shoot: &str) -> PathBuf {
        self.seed.admin_kubeconfig(shoot)
    }

    fn backup_plan(&self, shoot: &str) -> Result<BackupPlan, RingError> {
        Ok(BackupPlan::NextToWorkload {
            identity: self.layout(shoot),
            progress: Arc::new(SeedProgress {
                seed: self.seed.clone(),
                shoot: shoot.to_string(),
            }),
        })
    }

    async fn source_view(&self, shoot: &str, op: u64) -> Result<SourceView, RingError> {
        super::kubernetes_handover::source_view(self, shoot, op).await
    }
    async fn stop_writers(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.stop_components(shoot, &WRITERS).await?)
    }
    async fn start_etcd(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self
            .seed
            .start_components(shoot, &[Component::Etcd])
            .await?)
    }
    async fn take_final_snapshot(&self, shoot: &str) -> Result<(), RingError> {
        let bucket = self.migration_bucket()?;
        super::kubernetes_handover::take_final_snapshot(self, shoot, bucket).await
    }
    async fn stop_etcd(&self, shoot: &str) -> Result<(), RingError> {
        self.seed.stop_components(shoot, &[Component::Etcd]).await?;
        self.fence_now(shoot).await
    }

    async fn target_facts(
        &self,
        shoot: &str,
        op: u64,
        from_bucket: bool,
    ) -> Result<TargetFacts, RingError> {
        let layout = self.layout(shoot);
        seed::pki::create_private_dir(&layout.dir)?;
        let restored = self.bucket_report(shoot, op).is_some();
        let running = self
            .seed
            .inspect(shoot)
            .await
            .is_ok_and(|s| target_running(s.phase));
        let fetched = if from_bucket {
            restored
        } else {
            super::handover_fetched(&layout, op)?
        };
        Ok(TargetFacts {
            fetched,
            restored,
            running,
        })
    }

    async fn restore_handover(&self, shoot: &str, epoch: u64) -> Result<(), RingError> {
        let bucket = self.migration_bucket()?;
        let op = handover::claimed(&self.layout(shoot)).ok_or_else(|| {
            RingError::Migrate(migrate::MigrateError::Handover {
                shoot: shoot.to_string(),
                message: "no migration claimed the fetched handover".into(),
            })
        })?;
        super::kubernetes_restore::restore_handover(self, shoot, (op, epoch), bucket).await
    }

    async fn restore_bucket(
        &self,
        shoot: &str,
        op: u64,
        bucket: &RingBucket,
    ) -> Result<backup::restore::RestoreReport, RingError> {
        super::kubernetes_restore::restore(self, shoot, op, bucket).await
    }

    /// Waits until kube-apiserver answers, then replaces the controller-manager
    /// and scheduler pods left in back-off while it did not (see
    /// [`target_running`]).
    async fn wait_ready(&self, shoot: &str, timeout: Duration) -> Result<(), RingError> {
        seed::wait_ready(self.seed.as_ref(), shoot, timeout).await?;
        self.replace_backed_off(shoot).await;
        Ok(())
    }

    /// The restore already compared revision, `HashKV` and objects with the
    /// source's on the restored data before etcd served it: the recorded
    /// objects, if the record is of this handover's revision.
    async fn verify_handover(&self, shoot: &str) -> Result<Objects, RingError> {
        let layout = self.layout(shoot);
        let revision = handover::read_info(&layout).map(|i| i.revision);
        let op = handover::claimed(&layout);
        match (record::read(&record::path(&layout), op), revision) {
            (Some((report, Some(objects))), Some(r)) if report.reached_revision == r => Ok(objects),
            _ => Err(RingError::Verification(format!(
                "no verified restore of {shoot}'s handover was recorded"
            ))),
        }
    }

    /// The objects the init container counted on the restored data, before
    /// etcd started on it (the same volume the pod then serves from).
    async fn count_objects(&self, shoot: &str, revision: i64) -> Result<Objects, RingError> {
        match record::read(&record::path(&self.layout(shoot)), None) {
            Some((report, Some(objects))) if report.reached_revision == revision => Ok(objects),
            _ => Err(RingError::Verification(format!(
                "no object count of {shoot}'s restore at revision {revision} was recorded"
            ))),
        }
    }
}

/// The backup sidecar's progress, as recorded in the seed cluster.
struct SeedProgress {
    seed: Arc<KubernetesSeed>,
    shoot: String,
}

#[async_trait]
impl SidecarProgress for SeedProgress {
    async fn report(&self) -> Result<SidecarReport, RingError> {
        let p = self.seed.backup_progress(&self.shoot).await?;
        if let Some(e) = p.as_ref().and_then(|p| p.error.as_ref()) {
            tracing::warn!(shoot = %self.shoot, error = %e, "the backup sidecar reports an error");
        }
        Ok(SidecarReport {
            durable: p.as_ref().map(|p| (p.revision, p.at_ms)),
            etcd_revision: p.and_then(|p| p.etcd_revision),
        })
    }
}

impl KubernetesExecutor {
    pub(super) fn seed(&self) -> &KubernetesSeed {
        &self.seed
    }
}

/// Whether a move's target has its control plane running, so that the next
/// step is Verify: kube-apiserver answers through the stable endpoint. A
/// controller-manager or scheduler still in back-off (they start before the
/// API serves, fail and wait out their back-off) does not hold the move up:
/// Verify's wait for readiness replaces such pods at once. Waiting
/// for them here instead re-applied the control plane every round until the
/// back-off ended, 10 s and more per move onto pods.
fn target_running(phase: seed::Phase) -> bool {
    matches!(phase, seed::Phase::Ready | seed::Phase::Degraded)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target whose API answers goes on to Verify even while the
    /// controller-manager or scheduler waits out a back-off (Degraded); one
    /// whose API does not answer yet, or that runs nothing, starts again.
    #[test]
    fn a_target_runs_once_its_api_answers() {
        use seed::Phase;
        for (phase, running) in [
            (Phase::Stopped, false),
            (Phase::Starting, false),
            (Phase::Degraded, true),
            (Phase::Ready, true),
        ] {
            assert_eq!(target_running(phase), running, "{phase}");
        }
    }

    /// What the pods get is a valid backup config once the agent names the
    /// shoot: the ring's bucket, the key as a file in the Secret (same key id),
    /// etcd over localhost with the shoot's client certificate.
    #[test]
    fn pods_get_the_rings_bucket_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let key_file = dir.path().join("ring.key");
        std::fs::write(&key_file, "33".repeat(32)).unwrap();
        let bucket = format!("file://{}", dir.path().join("bucket").display());
        let rb = RingBucket::new(
            backup::BucketConfig::url(bucket.clone()),
            Some(backup::config::EncryptionConfig {
                key_file: Some(key_file),
                ..Default::default()
            }),
            "backup.encryption",
        )
        .unwrap();
        let pod = pod_backup(&rb).unwrap();
        assert_eq!(pod.host_dir, Some(dir.path().join("bucket")));
        let key = String::from_utf8(pod.files["encryption.key"].clone()).unwrap();
        assert_eq!(key, "33".repeat(32));
        // (the certificate paths exist only in the pod: parsed, not validated here)
        let mut config: backup::BackupConfig =
            serde_yaml::from_slice(&pod.files[agent::BACKUP_CONFIG]).unwrap();
        assert_eq!(config.shoot, agent::SHOOT_FROM_FLAG);
        config.shoot = "m2".into();
        config.etcd.ca_file = None;
        config.etcd.cert_file = None;
        config.etcd.key_file = None;
        config.validate().unwrap();
        assert_eq!(config.bucket.url, bucket);
        assert_eq!(config.etcd.endpoints, ["https://127.0.0.1:2379"]);
        let enc = config.encryption.unwrap();
        assert_eq!(enc.key_id.as_deref(), Some(rb.key().unwrap().id.as_str()));
        let written = dir.path().join("backup.yaml");
        std::fs::write(&written, &pod.files[agent::BACKUP_CONFIG]).unwrap();
        let bad = crate::agent::load_config(&written, "Not_A_Shoot").unwrap_err();
        assert!(bad.to_string().contains("Not_A_Shoot"), "{bad}");
        let plain = RingBucket::new(backup::BucketConfig::url("s3://b/ring"), None, "x").unwrap();
        let pod = pod_backup(&plain).unwrap();
        assert_eq!(pod.host_dir, None);
        assert_eq!(pod.files.len(), 1, "no key file without a key");
    }

    /// An S3 endpoint pods cannot reach (this machine's loopback) is refused
    /// with the field named; a reachable one goes into their config.
    #[test]
    fn pods_never_get_a_loopback_bucket_endpoint() {
        let s3 = |endpoint: &str| {
            let mut b = backup::BucketConfig::url("s3://b/ring");
            b.endpoint = Some(endpoint.into());
            b.options.insert("aws_access_key_id".into(), "id".into());
            RingBucket::new(b, None, "x").unwrap()
        };
        let err = pod_backup(&s3("http://127.0.0.1:9000"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("backup.bucket.endpoint") && err.contains("127.0.0.1:9000"),
            "{err}"
        );
        let pod = pod_backup(&s3("http://198.19.0.254:9000")).unwrap();
        let config: backup::BackupConfig =
            serde_yaml::from_slice(&pod.files[agent::BACKUP_CONFIG]).unwrap();
        assert_eq!(
            config.bucket.endpoint.as_deref(),
            Some("http://198.19.0.254:9000")
        );
        assert_eq!(config.bucket.options["aws_access_key_id"], "id");
    }
}
