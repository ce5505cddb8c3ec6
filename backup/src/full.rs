//! Full snapshots: etcd's Maintenance snapshot stream, compressed, encrypted,
//! checksummed and uploaded part by part, never held whole in memory.

use std::time::Instant;

use etcd_client::Client;
use serde::{Deserialize, Serialize};

use crate::bucket::{Bucket, PART_SIZE};
use crate::catalog::object_name;
use crate::codec::{EncryptionKey, FullMeta, FullTrailer, Header, Kind, ObjectWriter, Trailer};
use crate::etcd;
use crate::{now_ms, Result};

/// Parallel part uploads of one full snapshot (memory: this many parts + one).
const UPLOAD_CONCURRENCY: usize = 2;

/// A full snapshot in the bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FullSnapshot {
    pub name: String,
    /// etcd's revision before the snapshot began (deltas continue after it).
    pub base_revision: i64,
    /// etcd's revision once it had begun.
    pub revision_after: i64,
    /// Keys at the base revision.
    pub keys: i64,
    /// Database bytes streamed from etcd.
    pub db_bytes: u64,
    /// Bytes stored in the bucket.
    pub stored_bytes: u64,
    pub sha256: String,
    pub time_ms: i64,
    pub seconds: f64,
}

/// How objects are encoded.
#[derive(Debug, Clone, Default)]
pub struct Encoding {
    /// zstd level; 0 stores uncompressed.
    pub level: i32,
    pub key: Option<EncryptionKey>,
}

/// Takes a full snapshot of the etcd behind `client` and stores it in `bucket`.
pub async fn take(
    client: &Client,
    endpoint: &str,
    bucket: &Bucket,
    shoot: &str,
    encoding: &Encoding,
) -> Result<FullSnapshot> {
    let started = Instant::now();
    let time_ms = now_ms();
    let mut c = client.clone();
    let status = etcd::status(&mut c, endpoint).await?;
    let base = status.revision;
    let keys = etcd::key_count(&mut c, endpoint, base).await?;
    // HashKV scans etcd's database: run it while the snapshot streams.
    let hash_task = {
        let mut c = client.clone();
        let endpoint = endpoint.to_string();
        tokio::spawn(async move { etcd::hash_kv(&mut c, &endpoint, base).await })
    };
    let name = object_name(
        Kind::Full,
        base,
        base,
        time_ms,
        encoding.level > 0,
        encoding.key.is_some(),
    );
    let header = Header {
        format: crate::codec::FORMAT,
        kind: Kind::Full,
        shoot: shoot.to_string(),
        created_ms: time_ms,
        compression: String::new(),
        encryption: None,
        full: Some(FullMeta {
            base_revision: base,
            etcd_version: status.version.clone(),
            cluster_id: status.cluster_id,
        }),
        delta: None,
    };
    let mut writer = ObjectWriter::new(header, encoding.level, encoding.key.as_ref())?;
    let mut upload = bucket.upload(&name).await?;
    let result: Result<(u64, u64, i64, String)> = async {
        let mut stream = c
            .snapshot()
            .await
            .map_err(|e| etcd::err(endpoint, "snapshot", e))?;
        let mut db_bytes = 0u64;
        let mut stored = 0u64;
        let mut revision_after = None;
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|e| etcd::err(endpoint, "snapshot stream", e))?
        {
            if revision_after.is_none() {
                // The snapshot's read transaction is open now: it holds at most this.
                revision_after = Some(etcd::status(&mut client.clone(), endpoint).await?.revision);
            }
            db_bytes += msg.blob().len() as u64;
            writer.write(msg.blob())?;
            if writer.ready() >= PART_SIZE {
                let bytes = writer.take();
                stored += bytes.len() as u64;
                upload
                    .wait_for_capacity(UPLOAD_CONCURRENCY)
                    .await
                    .map_err(|e| bucket.upload_error(&name, e))?;
                upload.write(&bytes);
            }
        }
        if db_bytes == 0 {
            return Err(etcd::err(endpoint, "snapshot", "etcd sent an empty snapshot"));
        }
        let hash_kv = match hash_task.await {
            Ok(Ok(h)) => Some(h),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "HashKV for the full snapshot failed; restores will not compare it");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "HashKV task failed");
                None
            }
        };
        let trailer = Trailer {
            full: Some(FullTrailer {
                revision_after: revision_after.unwrap_or(base),
                keys,
                hash_kv,
            }),
            ..Default::default()
        };
        let (rest, sha) = writer.finish(trailer)?;
        stored += rest.len() as u64;
        upload.write(&rest);
        Ok((db_bytes, stored, revision_after.unwrap_or(base), sha))
    }
    .await;
    match result {
        Ok((db_bytes, stored_bytes, revision_after, sha256)) => {
            upload
                .finish()
                .await
                .map_err(|e| bucket.upload_error(&name, e))?;
            let snap = FullSnapshot {
                name,
                base_revision: base,
                revision_after,
                keys,
                db_bytes,
                stored_bytes,
                sha256,
                time_ms,
                seconds: started.elapsed().as_secs_f64(),
            };
            tracing::info!(shoot, name = %snap.name, revision = base, db_bytes, stored_bytes, seconds = snap.seconds, "full snapshot stored");
            Ok(snap)
        }
        Err(e) => {
            let _ = upload.abort().await;
            Err(e)
        }
    }
}
