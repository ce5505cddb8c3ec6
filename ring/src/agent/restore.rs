//! etcd's init container: when the ConfigMap `etcd-restore` asks for a restore
//! (operation `N`) that this volume has not done yet, restores from the bucket
//! (full + deltas, verified) the newest durable revision, or exactly the
//! `revision` asked for (a migration's final one), counts the objects per
//! resource and takes `HashKV` at the revision reached (in the restore's
//! temporary etcd, which verified it), records all that
//! there, and marks the volume. A pod restart after that finds the mark and
//! starts etcd on the data as is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use backup::codec::EncryptionKey;
use backup::restore::{RestoreOptions, RestoreReport, RestoreTarget};
use seed::kubernetes::agent::RESTORE_CONFIGMAP;
use tokio_util::sync::CancellationToken;

use super::Cluster;
use crate::{now_ms, RingError};

/// Where and as what etcd's data is restored.
#[derive(Debug, Clone)]
pub struct RestoreArgs {
    /// The backup config (bucket, key, shoot) the sidecar uses too.
    pub config: ::backup::BackupConfig,
    /// etcd's data dir (on the claim).
    pub data_dir: PathBuf,
    /// etcd's member name, peer URL and cluster token.
    pub member: backup::etcd::Member,
}

/// The operation the volume was last restored for.
fn marker(data_dir: &Path) -> PathBuf {
    data_dir.with_file_name("restored-operation")
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RingError {
    move |source| RingError::Io { what, source }
}

/// Restores if asked to; returns the operation restored, if any.
pub async fn run(
    cluster: Cluster,
    args: RestoreArgs,
    stop: CancellationToken,
) -> Result<Option<String>, RingError> {
    let request = cluster.configmap(RESTORE_CONFIGMAP).await?;
    let Some(op) = request.get("operation").map(|s| s.trim().to_string()) else {
        tracing::info!("no restore asked for");
        return Ok(None);
    };
    let done = std::fs::read_to_string(marker(&args.data_dir)).unwrap_or_default();
    if done.trim() == op {
        tracing::info!(%op, "already restored for this operation");
        return Ok(None);
    }
    let target = match request.get("revision") {
        None => RestoreTarget::Latest,
        Some(r) => RestoreTarget::Revision(r.trim().parse().map_err(|_| RingError::Config {
            field: format!("ConfigMap {RESTORE_CONFIGMAP} revision"),
            reason: format!("{r:?} is not a revision number"),
        })?),
    };
    move_aside(&args.data_dir)?;
    let report = restore(&args, target, &stop).await?;
    // counted by the restore's own etcd; a restore resumed from an earlier
    // run may not have them, and another etcd counts on the restored data
    let (objects, hash) = match (&report.objects, report.hash_kv_at_reached) {
        (Some(objects), Some(hash)) => (objects.clone(), hash),
        _ => inspect(&args, report.reached_revision).await?,
    };
    let data = BTreeMap::from([
        ("restored", op.clone()),
        ("report", to_json(&report)?),
        ("objects", to_json(&objects)?),
        ("hashKv", hash.to_string()),
    ]);
    std::fs::write(marker(&args.data_dir), &op)
        .map_err(io(format!("writing {}", marker(&args.data_dir).display())))?;
    cluster.patch_configmap(RESTORE_CONFIGMAP, data).await?;
    tracing::info!(%op, revision = report.reached_revision, "restored");
    Ok(Some(op))
}

/// Moves data of an earlier stay aside (kept on the volume for operators).
fn move_aside(data: &Path) -> Result<(), RingError> {
    if seed::local::holds_data(data) {
        let aside = data.with_file_name(format!("data.replaced-{}", now_ms()));
        std::fs::rename(data, &aside).map_err(io(format!("moving {} aside", data.display())))?;
    }
    Ok(())
}

async fn restore(
    args: &RestoreArgs,
    target: RestoreTarget,
    stop: &CancellationToken,
) -> Result<RestoreReport, RingError> {
    let config = &args.config;
    let key = config
        .encryption
        .as_ref()
        .map(EncryptionKey::load)
        .transpose()?;
    let opts = RestoreOptions {
        bucket: backup::Bucket::open(&config.bucket, &config.shoot, false)?,
        key,
        data_dir: args.data_dir.clone(),
        target,
        allow_gap: false,
        member: args.member.clone(),
        etcd: backup::etcd::find_binary("etcd", None)?,
        etcdutl: backup::etcd::find_binary("etcdutl", None)?,
        work_dir: Some(args.data_dir.with_file_name("restore-work")),
        count_objects: true,
    };
    Ok(backup::restore::restore(&opts, &|msg| tracing::info!("{msg}"), stop).await?)
}

/// Objects per resource type and `HashKV` at `revision`, from a temporary
/// etcd on the restored data (the data etcd then serves).
async fn inspect(
    args: &RestoreArgs,
    revision: i64,
) -> Result<(BTreeMap<String, u64>, u32), RingError> {
    let etcd = backup::etcd::find_binary("etcd", None)?;
    let log = args.data_dir.with_file_name("count-etcd.log");
    let mut temp =
        backup::etcd::TempEtcd::start(&etcd, &args.data_dir, &args.member.name, &log).await?;
    let inspected = match temp.client().await {
        Ok(mut client) => {
            let counted = backup::objects::count_objects(&mut client, revision).await;
            let objects = counted.map_err(|e| {
                RingError::Verification(format!("counting objects at revision {revision}: {e}"))
            });
            let hash = backup::etcd::hash_kv(&mut client, "restored etcd", revision).await;
            objects.and_then(|o| Ok((o, hash?.hash)))
        }
        Err(e) => Err(e.into()),
    };
    temp.stop().await;
    inspected
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, RingError> {
    serde_json::to_string(value).map_err(|e| RingError::Encode(e.to_string()))
}
