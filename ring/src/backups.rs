//! Backups of the control planes this member serves (`backup::Backup`, one per
//! shoot, running while the member serves it), the shoot's spec and PKI next to
//! them in the bucket, and failover: restoring a shoot whose host died from the
//! bucket alone on this member.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backup::BucketConfig;
use bytes::Bytes;
use seed::{LocalSeed, ShootLayout};
use tokio_util::sync::CancellationToken;

use crate::daemon::{now_ms, Shared};
use crate::state::RingCommand;
use crate::RingError;

fn backup_err(e: backup::BackupError) -> RingError {
    RingError::Transport(e.to_string())
}

/// The bucket prefix of a shoot's identity (spec + PKI): a child of the shoot's
/// prefix, which the backup catalog ignores.
fn identity_bucket(
    cfg: &BucketConfig,
    shoot: &str,
    create: bool,
) -> Result<backup::Bucket, RingError> {
    backup::Bucket::open(cfg, &format!("{shoot}/identity"), create).map_err(backup_err)
}

/// Object name of a file of the shoot dir (`pki/ca.crt` → `pki_ca.crt`).
fn object_name(rel: &str) -> String {
    rel.replace('/', "_")
}

/// Stores the shoot's spec and PKI in the bucket (idempotent).
pub async fn upload_identity(
    cfg: &BucketConfig,
    layout: &ShootLayout,
    shoot: &str,
) -> Result<(), RingError> {
    let bucket = identity_bucket(cfg, shoot, true)?;
    let mut files = vec!["shoot.json".to_string()];
    let pki = layout.dir.join("pki");
    for e in std::fs::read_dir(&pki).map_err(|source| RingError::Io {
        what: format!("listing {}", pki.display()),
        source,
    })? {
        let e = e.map_err(|source| RingError::Io {
            what: format!("listing {}", pki.display()),
            source,
        })?;
        if e.path().is_file() {
            files.push(format!("pki/{}", e.file_name().to_string_lossy()));
        }
    }
    for rel in files {
        let path = layout.dir.join(&rel);
        let data = std::fs::read(&path).map_err(|source| RingError::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        bucket
            .put(&object_name(&rel), Bytes::from(data))
            .await
            .map_err(backup_err)?;
    }
    Ok(())
}

/// Fetches the shoot's spec and PKI from the bucket into `layout` (files 0600).
pub async fn download_identity(
    cfg: &BucketConfig,
    layout: &ShootLayout,
    shoot: &str,
) -> Result<(), RingError> {
    let bucket = identity_bucket(cfg, shoot, false)?;
    let objects = bucket.list().await.map_err(backup_err)?;
    if !objects.iter().any(|(n, _)| n == "shoot.json") {
        return Err(RingError::Transport(format!(
            "{} holds no spec of shoot {shoot}: it was never backed up here",
            bucket.describe()
        )));
    }
    seed::pki::create_private_dir(&layout.dir.join("pki"))?;
    for (name, _) in objects {
        let rel = match name.strip_prefix("pki_") {
            Some(file) => format!("pki/{file}"),
            None => name.clone(),
        };
        let data = bucket.get_all(&name).await.map_err(backup_err)?;
        seed::pki::write_private(&layout.dir.join(rel), &data)?;
    }
    Ok(())
}

/// The continuous backups this member runs.
#[derive(Default)]
pub struct Backups {
    running: Mutex<BTreeMap<String, CancellationToken>>,
}

impl Backups {
    /// Starts backing up `shoot` unless that runs already: identity first, then the
    /// continuous full + delta loop; its progress goes to the ring as `ReportBackup`.
    pub fn ensure(
        &self,
        shared: Arc<Shared>,
        seed: &LocalSeed,
        cfg: &BucketConfig,
        shoot: &str,
        stop: &CancellationToken,
    ) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.get(shoot).is_some_and(|t| !t.is_cancelled()) {
            return;
        }
        let token = stop.child_token();
        running.insert(shoot.to_string(), token.clone());
        let layout = seed.layout(shoot);
        let spec = match seed.spec_for(shoot, None) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(%shoot, error = %e, "cannot back up");
                return;
            }
        };
        let (cfg, shoot) = (cfg.clone(), shoot.to_string());
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            loop {
                if let Err(e) = upload_identity(&cfg, &layout, &shoot).await {
                    tracing::warn!(%shoot, error = %e, "storing the shoot's identity failed; retrying");
                } else {
                    break;
                }
                tokio::select! {
                    biased;
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            let mut config = backup::BackupConfig::new(
                shoot.clone(),
                backup::EtcdConfig::for_local_shoot(&layout, &spec),
                cfg.clone(),
            );
            config.spool.dir = Some(layout.dir.join("backup-spool"));
            // A failover replays every delta since the newest full snapshot, one
            // revision at a time: a new full snapshot every 2000 revisions keeps
            // that part of the RTO to a couple of seconds.
            config.schedule.full_after_revisions = 2000;
            let runner = match backup::Backup::new(config) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(%shoot, error = %e, "cannot back up");
                    return;
                }
            };
            let mut progress = runner.progress();
            let reporter = {
                let (shared, shoot, token) = (shared.clone(), shoot.clone(), token.clone());
                tokio::spawn(async move {
                    let mut last = 0;
                    loop {
                        tokio::select! {
                            biased;
                            _ = token.cancelled() => return,
                            r = progress.changed() => if r.is_err() { return },
                        }
                        let p = progress.borrow_and_update().clone();
                        if p.durable_revision > last {
                            last = p.durable_revision;
                            let cmd = RingCommand::ReportBackup {
                                shoot: shoot.clone(),
                                revision: p.durable_revision as u64,
                                at_ms: p.durable_at_ms as u64,
                            };
                            let _ = shared.propose_cmd(cmd).await;
                            // at most one report a second
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                })
            };
            if let Err(e) = runner.run(token.clone()).await {
                tracing::error!(%shoot, error = %e, "backup stopped");
            }
            reporter.abort();
        });
    }

    /// Stops backing up `shoot`.
    pub fn stop(&self, shoot: &str) {
        if let Some(t) = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(shoot)
        {
            t.cancel();
        }
    }
}

/// Restores `shoot` from the bucket into this member's seed (spec, PKI, etcd data
/// at the newest durable revision). Returns the restore report.
pub async fn restore_from_bucket(
    cfg: &BucketConfig,
    seed: &LocalSeed,
    shoot: &str,
    etcd: &Path,
    etcdctl: &Path,
    cancel: &CancellationToken,
) -> Result<backup::restore::RestoreReport, RingError> {
    let layout = seed.layout(shoot);
    seed::pki::create_private_dir(&layout.dir)?;
    download_identity(cfg, &layout, shoot).await?;
    let spec = seed.spec_for(shoot, None)?;
    let data = layout.etcd_data();
    if data.exists()
        && std::fs::read_dir(&data)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        // a stale copy from when this member hosted the shoot before
        let aside = layout.dir.join(format!("etcd.replaced-{}", now_ms()));
        std::fs::rename(&data, &aside).map_err(|source| RingError::Io {
            what: format!("moving {} aside", data.display()),
            source,
        })?;
    }
    let opts = backup::restore::RestoreOptions {
        bucket: backup::Bucket::open(cfg, shoot, false).map_err(backup_err)?,
        key: None,
        data_dir: data,
        target: backup::restore::RestoreTarget::Latest,
        allow_gap: false,
        member: backup::etcd::Member::for_shoot(&spec),
        etcd: etcd.to_path_buf(),
        etcdctl: etcdctl.to_path_buf(),
        work_dir: Some(layout.dir.join("restore-work")),
    };
    let shoot_name = shoot.to_string();
    backup::restore::restore(
        &opts,
        &|msg| tracing::info!(shoot = %shoot_name, "{msg}"),
        cancel,
    )
    .await
    .map_err(backup_err)
}
