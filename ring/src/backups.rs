//! Backups of the control planes this member serves (`backup::Backup`, one per
//! shoot, running while the member serves it), the shoot's spec and PKI next to
//! them in the bucket, and failover: restoring a shoot whose host died from the
//! bucket alone on this member.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backup::codec::EncryptionKey;
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

/// The ring's bucket as this member uses it: where it is, and the key that seals
/// what goes in (loaded once, so a bad key stops ringd at start, not a failover).
#[derive(Debug, Clone)]
pub struct RingBucket {
    pub config: BucketConfig,
    key: Option<EncryptionKey>,
    /// The setting that names the key (`backup.encryption`, `bucketEncryption`).
    field: String,
}

impl RingBucket {
    /// The bucket of a member's `backup` section, with its key loaded.
    pub fn open(section: &crate::config::BackupSection) -> Result<Self, RingError> {
        Self::new(
            section.bucket.clone(),
            section.encryption.clone(),
            "backup.encryption",
        )
    }

    /// A bucket sealed with the key `encryption` names (`field`: where that came from).
    pub fn new(
        config: BucketConfig,
        encryption: Option<backup::config::EncryptionConfig>,
        field: &str,
    ) -> Result<Self, RingError> {
        let key = encryption
            .as_ref()
            .map(EncryptionKey::load)
            .transpose()
            .map_err(|e| RingError::Config {
                field: field.to_string(),
                reason: e.to_string(),
            })?;
        Ok(RingBucket {
            config,
            key,
            field: field.to_string(),
        })
    }

    /// The key objects are sealed with, if any.
    pub fn key(&self) -> Option<&EncryptionKey> {
        self.key.as_ref()
    }

    /// A missing or wrong key is the configuration to fix (permanent), named by
    /// the setting that gives the key; other bucket errors keep their kind.
    fn key_err(&self, e: backup::BackupError) -> RingError {
        let reason = match &e {
            backup::BackupError::KeyRequired { object, key_id } => format!(
                "{object} in {} is sealed with key id {key_id}, and no key is configured: set {} to the key the ring's bucket was written with",
                self.config.url, self.field
            ),
            backup::BackupError::WrongKey { .. } => e.to_string(),
            _ => return backup_err(e),
        };
        RingError::Config {
            field: self.field.clone(),
            reason,
        }
    }
}

/// Suffix of a sealed identity object.
const SEALED: &str = ".aesgcm";

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

/// Stores the shoot's spec and PKI in the bucket (idempotent), sealed when the
/// bucket has a key; the other form of each object, if any, is removed.
pub async fn upload_identity(
    rb: &RingBucket,
    layout: &ShootLayout,
    shoot: &str,
) -> Result<(), RingError> {
    let bucket = identity_bucket(&rb.config, shoot, true)?;
    let existing: Vec<String> = bucket
        .list()
        .await
        .map_err(backup_err)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
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
        let name = object_name(&rel);
        let sealed_name = format!("{name}{SEALED}");
        // what goes in, under which name, and the other form's name
        let (stored, bytes, stale) = match rb.key() {
            Some(key) => {
                let bytes = backup::codec::seal(key, &sealed_name, &data).map_err(backup_err)?;
                (sealed_name, bytes, name)
            }
            None => (name, data, sealed_name),
        };
        bucket
            .put(&stored, Bytes::from(bytes))
            .await
            .map_err(backup_err)?;
        if existing.contains(&stale) {
            bucket.delete(&stale).await.map_err(backup_err)?;
        }
    }
    Ok(())
}

/// Fetches the shoot's spec and PKI from the bucket into `layout` (files 0600),
/// opening sealed objects with the bucket's key (a sealed object wins over a
/// plain one of the same name).
pub async fn download_identity(
    rb: &RingBucket,
    layout: &ShootLayout,
    shoot: &str,
) -> Result<(), RingError> {
    let bucket = identity_bucket(&rb.config, shoot, false)?;
    let mut objects: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for (stored, _) in bucket.list().await.map_err(backup_err)? {
        match stored.strip_suffix(SEALED) {
            Some(name) => {
                objects.insert(name.to_string(), (stored.clone(), true));
            }
            None => {
                objects.entry(stored.clone()).or_insert((stored, false));
            }
        }
    }
    if !objects.contains_key("shoot.json") {
        return Err(RingError::Transport(format!(
            "{} holds no spec of shoot {shoot}: it was never backed up here",
            bucket.describe()
        )));
    }
    seed::pki::create_private_dir(&layout.dir.join("pki"))?;
    for (name, (stored, sealed)) in objects {
        let rel = match name.strip_prefix("pki_") {
            Some(file) => format!("pki/{file}"),
            None => name.clone(),
        };
        let mut data = bucket.get_all(&stored).await.map_err(backup_err)?;
        if sealed {
            data = backup::codec::unseal(rb.key(), &stored, &data).map_err(|e| rb.key_err(e))?;
        }
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
        rb: &RingBucket,
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
        let (rb, shoot) = (rb.clone(), shoot.to_string());
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(500);
            loop {
                if let Err(e) = upload_identity(&rb, &layout, &shoot).await {
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
                rb.config.clone(),
            );
            config.spool.dir = Some(layout.dir.join("backup-spool"));
            // A failover replays every delta since the newest full snapshot, one
            // revision at a time: a new full snapshot every 2000 revisions keeps
            // that part of the RTO to a couple of seconds.
            config.schedule.full_after_revisions = 2000;
            let runner = match backup::Backup::new(config) {
                Ok(r) => r.with_key(rb.key.clone()),
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
    rb: &RingBucket,
    seed: &LocalSeed,
    shoot: &str,
    etcd: &Path,
    etcdctl: &Path,
    cancel: &CancellationToken,
) -> Result<backup::restore::RestoreReport, RingError> {
    let layout = seed.layout(shoot);
    seed::pki::create_private_dir(&layout.dir)?;
    download_identity(rb, &layout, shoot).await?;
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
        bucket: backup::Bucket::open(&rb.config, shoot, false).map_err(backup_err)?,
        key: rb.key.clone(),
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
    .map_err(|e| rb.key_err(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use backup::config::EncryptionConfig;

    fn key_config(dir: &Path, name: &str, byte: u8) -> EncryptionConfig {
        let path = dir.join(name);
        std::fs::write(&path, backup::codec::hex(&[byte; 32])).unwrap();
        EncryptionConfig {
            key_file: Some(path),
            ..Default::default()
        }
    }

    fn shoot_files(dir: &Path) -> ShootLayout {
        let layout = ShootLayout {
            dir: dir.join("shoots/s1"),
        };
        std::fs::create_dir_all(layout.dir.join("pki")).unwrap();
        std::fs::write(layout.spec_file(), b"{\"shoot\":\"s1\"}").unwrap();
        std::fs::write(
            layout.dir.join("pki/ca.key"),
            b"-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        layout
    }

    /// The shoot's identity objects in a `file://` bucket, by path, with their bytes.
    fn stored(bucket: &Path) -> Vec<(String, Vec<u8>)> {
        std::fs::read_dir(bucket.join("s1/identity"))
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                let bytes = std::fs::read(&p).unwrap();
                (p.display().to_string(), bytes)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_sealed_identity_opens_only_with_the_rings_key() {
        let tmp = tempfile::tempdir().unwrap();
        let bucket_dir = tmp.path().join("bucket");
        let url = BucketConfig::url(format!("file://{}", bucket_dir.display()));
        let sealed =
            RingBucket::new(url.clone(), Some(key_config(tmp.path(), "key", 1)), "test").unwrap();
        let layout = shoot_files(tmp.path());
        upload_identity(&sealed, &layout, "s1").await.unwrap();

        let objects = stored(&bucket_dir);
        assert_eq!(
            objects.len(),
            2,
            "{:?}",
            objects.iter().map(|o| &o.0).collect::<Vec<_>>()
        );
        for (path, bytes) in &objects {
            assert!(path.ends_with(".aesgcm"), "{path}");
            assert!(
                !bytes
                    .windows(7)
                    .any(|w| w == b"PRIVATE" || w == b"\"shoot\""),
                "{path} holds plain text"
            );
        }

        // the same key restores the files byte for byte
        let back = ShootLayout {
            dir: tmp.path().join("restored"),
        };
        download_identity(&sealed, &back, "s1").await.unwrap();
        for rel in ["shoot.json", "pki/ca.key"] {
            assert_eq!(
                std::fs::read(back.dir.join(rel)).unwrap(),
                std::fs::read(layout.dir.join(rel)).unwrap(),
                "{rel}"
            );
        }

        // no key, or another key: a config error naming the field, nothing written
        let elsewhere = ShootLayout {
            dir: tmp.path().join("elsewhere"),
        };
        let plain = RingBucket::new(url.clone(), None, "backup.encryption").unwrap();
        let err = download_identity(&plain, &elsewhere, "s1")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, RingError::Config { field, reason } if field == "backup.encryption" && reason.contains("is sealed with key id") && reason.contains("set backup.encryption")),
            "{err}"
        );
        let other = RingBucket::new(
            url.clone(),
            Some(key_config(tmp.path(), "other", 2)),
            "test",
        )
        .unwrap();
        let err = download_identity(&other, &elsewhere, "s1")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, RingError::Config { reason, .. } if reason.contains("use the key the backup was written with")),
            "{err}"
        );
        assert!(!elsewhere.dir.join("pki/ca.key").exists());

        // turning encryption off (or on) replaces the other form: one copy per file
        upload_identity(&plain, &layout, "s1").await.unwrap();
        let objects = stored(&bucket_dir);
        assert_eq!(objects.len(), 2);
        assert!(objects.iter().all(|(p, _)| !p.ends_with(".aesgcm")));
        upload_identity(&sealed, &layout, "s1").await.unwrap();
        assert!(stored(&bucket_dir)
            .iter()
            .all(|(p, _)| p.ends_with(".aesgcm")));
    }

    #[test]
    fn an_unreadable_key_is_a_config_error_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("short"), "abcd").unwrap();
        let err = RingBucket::new(
            BucketConfig::url("file:///nowhere"),
            Some(EncryptionConfig {
                key_file: Some(tmp.path().join("short")),
                ..Default::default()
            }),
            "backup.encryption",
        )
        .unwrap_err();
        assert!(
            matches!(&err, RingError::Config { field, reason } if field == "backup.encryption" && reason.contains("32 bytes")),
            "{err}"
        );
    }
}
