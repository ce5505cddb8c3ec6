//! The executor of a local seed: control planes as supervised processes next
//! to ringd, their data in the seed's state dir. It backs up, hands over,
//! restores and verifies.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use migrate::handover;
use migrate::plan::SourceView;
use seed::{BinarySearch, Component, LocalSeed, Seed, ShootLayout};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{record, Executor, Mover, Objects, TargetFacts, WRITERS};
use crate::backups::{download_identity, BackupPlan, BackupSource, RingBucket};
use crate::config::SeedConfig;
use crate::{now_ms, RingError};

/// How long etcd's guard lets etcd run for one attempt at a final snapshot.
const HANDOVER_WINDOW: Duration = Duration::from_secs(150);

/// Control planes as local processes.
pub struct LocalExecutor {
    pub(super) seed: Arc<LocalSeed>,
    bin_dir: Option<PathBuf>,
}

impl LocalExecutor {
    /// The local seed of a member's `seed` section.
    pub fn from_config(sc: &SeedConfig) -> Result<Self, RingError> {
        let bins = BinarySearch::standard(sc.bin_dir.as_deref()).control_plane()?;
        let tuning = seed::process::SupervisorTuning {
            stop_grace: Duration::from_secs(5),
            ..Default::default()
        };
        let seed = LocalSeed::new(&sc.state_dir, bins)
            .with_tuning(tuning)
            .with_advertise(sc.api_advertise.clone())
            .with_deprecated_apis(sc.deprecated_apis)
            .with_guard(super::agent_binary()?);
        Ok(LocalExecutor {
            seed: Arc::new(seed),
            bin_dir: sc.bin_dir.clone(),
        })
    }

    pub(super) fn layout(&self, shoot: &str) -> ShootLayout {
        self.seed.layout(shoot)
    }

    pub(super) fn spec(&self, shoot: &str) -> Result<seed::ControlPlaneSpec, RingError> {
        Ok(self.seed.spec_for(shoot, None)?)
    }

    pub(super) fn bins(&self) -> BinarySearch {
        BinarySearch::standard(self.bin_dir.as_deref())
    }

    /// Lets the guards run their program until `fence_at_ms` (0: stop now).
    fn guard_until(&self, shoot: &str, fence_at_ms: u64) -> Result<(), RingError> {
        Ok(seed::lease_file::record(
            &self.layout(shoot),
            fence_at_ms,
            None,
        )?)
    }

    /// The ring lease went to the target with the migration, so etcd's guard
    /// stops etcd at its fence time: the operation (agreed by the quorum) lets
    /// etcd run for the source's snapshot steps; the writers are stopped
    /// before, and `stop_etcd` fences it again.
    fn open_for_handover(&self, shoot: &str) -> Result<(), RingError> {
        self.guard_until(shoot, now_ms() + HANDOVER_WINDOW.as_millis() as u64)
    }
}

#[async_trait]
impl Executor for LocalExecutor {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn shoots(&self) -> Vec<String> {
        self.seed.shoots()
    }

    async fn start(&self, shoot: &str) -> Result<(), RingError> {
        let spec = self.spec(shoot)?;
        super::started(self.seed.start(&spec).await)
    }

    async fn fence(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.fence(shoot).await?)
    }

    async fn health(&self, shoot: &str) -> seed::Health {
        self.seed
            .health(shoot)
            .await
            .unwrap_or_else(|e| seed::Health {
                detail: e.to_string(),
                ..Default::default()
            })
    }

    async fn remove(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.remove_data(shoot).await?)
    }

    async fn renew_certificates(&self, shoot: &str) -> Result<Vec<seed::pki::Leaf>, RingError> {
        Ok(self.seed.renew_certificates(shoot).await?)
    }

    async fn stop_at_shutdown(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.stop(shoot).await?)
    }

    async fn fence_moved(&self, _shoot: &str) -> Result<(), RingError> {
        Ok(()) // local processes died with the ringd that supervised them
    }

    /// The control plane runs under `ring-agent guard`, which stops it at
    /// this fence time by itself unless it is renewed again.
    async fn lease_renewed(&self, shoot: &str, epoch: u64, fence_at_ms: u64, _lease: Duration) {
        if let Err(e) = self.guard_until(shoot, fence_at_ms) {
            tracing::warn!(%shoot, epoch, error = %e, "cannot write the lease file; the guards fence at the last fence time");
        }
    }

    fn mover(&self) -> Result<&dyn Mover, String> {
        Ok(self)
    }

    fn pki_dir(&self, shoot: &str) -> Option<std::path::PathBuf> {
        Some(self.seed.layout(shoot).pki().dir().to_path_buf())
    }

    fn standby(&self) -> Result<&dyn super::StandbyOps, String> {
        Ok(self)
    }
}

#[async_trait]
impl Mover for LocalExecutor {
    fn shoot_layout(&self, shoot: &str) -> ShootLayout {
        self.layout(shoot)
    }

    fn admin_kubeconfig(&self, shoot: &str) -> PathBuf {
        self.layout(shoot).admin_kubeconfig()
    }

    fn backup_plan(&self, shoot: &str) -> Result<BackupPlan, RingError> {
        let layout = self.layout(shoot);
        let spec = self.spec(shoot)?;
        Ok(BackupPlan::Here(BackupSource {
            etcd: backup::EtcdConfig::for_local_shoot(&layout, &spec),
            spool_dir: layout.dir.join("backup-spool"),
            identity: layout,
        }))
    }

    async fn source_view(&self, shoot: &str, op: u64) -> Result<SourceView, RingError> {
        handover::claim(&self.layout(shoot), op)?;
        let running = self.seed.running_components(shoot).await;
        Ok(SourceView {
            writers_running: WRITERS.iter().any(|c| running.contains(c)),
            snapshot_taken: handover::read_info(&self.layout(shoot)).is_some(),
            etcd_running: running.contains(&Component::Etcd),
            handover_recorded: false,
        })
    }

    async fn stop_writers(&self, shoot: &str) -> Result<(), RingError> {
        Ok(self.seed.stop_only(shoot, &WRITERS).await?)
    }

    async fn start_etcd(&self, shoot: &str) -> Result<(), RingError> {
        self.open_for_handover(shoot)?;
        let spec = self.spec(shoot)?;
        Ok(self.seed.start_only(&spec, &[Component::Etcd]).await?)
    }

    async fn take_final_snapshot(&self, shoot: &str) -> Result<(), RingError> {
        self.open_for_handover(shoot)?;
        let spec = self.spec(shoot)?;
        handover::take_final_snapshot(&self.layout(shoot), &spec).await?;
        Ok(())
    }

    async fn stop_etcd(&self, shoot: &str) -> Result<(), RingError> {
        self.seed.stop_only(shoot, &[Component::Etcd]).await?;
        self.guard_until(shoot, 0)
    }

    async fn target_facts(
        &self,
        shoot: &str,
        op: u64,
        from_bucket: bool,
    ) -> Result<TargetFacts, RingError> {
        let layout = self.layout(shoot);
        seed::pki::create_private_dir(&layout.dir)?;
        let components = self.seed.running_components(shoot).await;
        let running = Component::ALL.iter().all(|c| components.contains(c));
        if from_bucket {
            let restored = self.bucket_report(shoot, op).is_some();
            return Ok(TargetFacts {
                fetched: restored,
                restored,
                running,
            });
        }
        Ok(TargetFacts {
            fetched: super::handover_fetched(&layout, op)?,
            restored: handover::restored(&layout),
            running,
        })
    }

    async fn restore_handover(&self, shoot: &str, _epoch: u64) -> Result<(), RingError> {
        let spec = self.spec(shoot)?;
        let etcdutl = self.bins().find("etcdutl")?;
        handover::restore(&self.layout(shoot), &spec, &etcdutl).await?;
        Ok(())
    }

    async fn restore_bucket(
        &self,
        shoot: &str,
        op: u64,
        bucket: &RingBucket,
    ) -> Result<backup::restore::RestoreReport, RingError> {
        let bins = self.bins();
        let (etcd, etcdutl) = (bins.find("etcd")?, bins.find("etcdutl")?);
        let cancel = CancellationToken::new();
        let report =
            restore_from_bucket(bucket, &self.seed, shoot, &etcd, &etcdutl, &cancel).await?;
        record::write(&record::path(&self.layout(shoot)), op, &report, None)?;
        Ok(report)
    }

    async fn wait_ready(&self, shoot: &str, timeout: Duration) -> Result<(), RingError> {
        Ok(seed::wait_ready(self.seed.as_ref(), shoot, timeout).await?)
    }

    async fn verify_handover(&self, shoot: &str) -> Result<Objects, RingError> {
        let layout = self.layout(shoot);
        let spec = self.spec(shoot)?;
        let info = handover::read_info(&layout).ok_or_else(|| {
            RingError::Migrate(migrate::MigrateError::Handover {
                shoot: shoot.to_string(),
                message: "the handover info vanished before verification".into(),
            })
        })?;
        Ok(handover::verify(&layout, &spec, &info).await?)
    }

    async fn count_objects(&self, shoot: &str, revision: i64) -> Result<Objects, RingError> {
        let layout = self.layout(shoot);
        let spec = self.spec(shoot)?;
        let mut client = handover::etcd(&layout, &spec).await?;
        handover::count_objects(&mut client, revision)
            .await
            .map_err(|e| {
                RingError::Migrate(migrate::MigrateError::Etcd {
                    shoot: shoot.to_string(),
                    message: format!("counting objects at revision {revision}: {e}"),
                })
            })
    }
}

/// Restores `shoot` from the bucket into a local seed (spec, PKI, etcd data at
/// the newest durable revision); a stale copy from an earlier stay is moved
/// aside first. Returns the restore report.
pub async fn restore_from_bucket(
    rb: &RingBucket,
    seed: &LocalSeed,
    shoot: &str,
    etcd: &Path,
    etcdutl: &Path,
    cancel: &CancellationToken,
) -> Result<backup::restore::RestoreReport, RingError> {
    let layout = seed.layout(shoot);
    seed::pki::create_private_dir(&layout.dir)?;
    download_identity(rb, &layout, shoot).await?;
    let spec = seed.spec_for(shoot, None)?;
    let data = layout.etcd_data();
    move_data_aside(&layout)?;
    let opts = backup::restore::RestoreOptions {
        bucket: backup::Bucket::open(&rb.config, shoot, false)?,
        key: rb.key().cloned(),
        data_dir: data,
        target: backup::restore::RestoreTarget::Latest,
        allow_gap: false,
        member: backup::etcd::Member::for_shoot(&spec),
        etcd: etcd.to_path_buf(),
        etcdutl: etcdutl.to_path_buf(),
        work_dir: Some(layout.dir.join("restore-work")),
        count_objects: false,
    };
    let span = tracing::info_span!("restore", %shoot, bucket = %rb.config.url);
    backup::restore::restore(&opts, &|msg| tracing::info!("{msg}"), cancel)
        .instrument(span)
        .await
        .map_err(|e| rb.key_err(e))
}

/// Moves the shoot's etcd data on this seed aside (`etcd.replaced-<ms>`,
/// deleted with the rest once the shoot's data is released), if it holds any.
pub(super) fn move_data_aside(layout: &ShootLayout) -> Result<(), RingError> {
    let data = layout.etcd_data();
    if seed::local::holds_data(&data) {
        let aside = layout.dir.join(format!("etcd.replaced-{}", now_ms()));
        std::fs::rename(&data, &aside).map_err(|source| RingError::Io {
            what: format!("moving {} aside", data.display()),
            source,
        })?;
    }
    Ok(())
}
