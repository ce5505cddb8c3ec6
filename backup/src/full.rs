//! Full snapshots: etcd's Maintenance snapshot stream, compressed, encrypted,
//! checksummed and uploaded part by part, never held whole in memory.

use std::time::Instant;

use etcd_client::Client;
use object_store::WriteMultipart;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::bucket::{Bucket, PART_SIZE};
use crate::catalog::object_name_in_epoch;
use crate::checksum::{check_db, TailHasher};
use crate::codec::{
    EncryptionKey, FullMeta, FullTrailer, HashKv, Header, Kind, ObjectWriter, Trailer,
};
use crate::etcd;
use crate::{now_ms, BackupError, Result};

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
    /// The ring epoch the writer serves at, recorded in every object's name
    /// and header (0: outside a ring).
    pub epoch: u64,
}

/// Takes a full snapshot of the etcd behind `client` and stores it in `bucket`
/// (inside a `full_snapshot` span with `shoot` and, once known, `revision`).
pub async fn take(
    client: &Client,
    endpoint: &str,
    bucket: &Bucket,
    shoot: &str,
    encoding: &Encoding,
) -> Result<FullSnapshot> {
    let span = tracing::info_span!("full_snapshot", shoot, revision = tracing::field::Empty);
    take_in_span(client, endpoint, bucket, shoot, encoding)
        .instrument(span)
        .await
}

async fn take_in_span(
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
    tracing::Span::current().record("revision", base);
    let keys = etcd::key_count(&mut c, endpoint, base).await?;
    // HashKV scans etcd's database: run it while the snapshot streams.
    let hash_task = {
        let mut c = client.clone();
        let endpoint = endpoint.to_string();
        tokio::spawn(async move { etcd::hash_kv(&mut c, &endpoint, base).await })
    };
    let name = object_name_in_epoch(
        encoding.epoch,
        Kind::Full,
        base,
        base,
        time_ms,
        encoding.level > 0,
        encoding.key.is_some(),
    );
    let writer = ObjectWriter::new(
        header(
            shoot,
            time_ms,
            FullMeta {
                base_revision: status.revision,
                etcd_version: status.version.clone(),
                cluster_id: status.cluster_id,
                // write_object finishes the object only when it matched
                db_hash_checked: true,
            },
            encoding.epoch,
        ),
        encoding.level,
        encoding.key.as_ref(),
    )?;
    let mut upload = bucket.upload(&name).await?;
    let target = Target {
        bucket,
        name: &name,
        upload: &mut upload,
    };
    let written = write_object(client, endpoint, writer, target, base, keys, hash_task).await;
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = upload.abort().await;
            return Err(e);
        }
    };
    upload
        .finish()
        .await
        .map_err(|e| bucket.upload_error(&name, e))?;
    let snap = FullSnapshot {
        name,
        base_revision: base,
        revision_after: written.revision_after,
        keys,
        db_bytes: written.db_bytes,
        stored_bytes: written.stored_bytes,
        sha256: written.sha256,
        time_ms,
        seconds: started.elapsed().as_secs_f64(),
    };
    tracing::info!(shoot, name = %snap.name, revision = base, db_bytes = snap.db_bytes, stored_bytes = snap.stored_bytes, seconds = snap.seconds, "full snapshot stored");
    Ok(snap)
}

/// The header of a full snapshot described by `meta`.
pub(crate) fn header(shoot: &str, time_ms: i64, meta: FullMeta, epoch: u64) -> Header {
    Header {
        format: crate::codec::FORMAT,
        kind: Kind::Full,
        shoot: shoot.to_string(),
        created_ms: time_ms,
        compression: String::new(),
        encryption: None,
        full: Some(meta),
        delta: None,
        epoch,
    }
}

/// Where the encoded object goes.
struct Target<'a> {
    bucket: &'a Bucket,
    name: &'a str,
    upload: &'a mut WriteMultipart,
}

impl Target<'_> {
    /// Queues a part, waiting while too many are in flight.
    async fn part(&mut self, bytes: Vec<u8>) -> Result<()> {
        self.upload
            .wait_for_capacity(UPLOAD_CONCURRENCY)
            .await
            .map_err(|e| self.bucket.upload_error(self.name, e))?;
        self.upload.write(&bytes);
        Ok(())
    }
}

/// What writing the object achieved.
struct Written {
    db_bytes: u64,
    stored_bytes: u64,
    revision_after: i64,
    sha256: String,
}

/// Streams etcd's snapshot through `writer` into the upload and ends the
/// object with the trailer (the HashKV of `hash_task`, when it succeeded).
async fn write_object(
    client: &Client,
    endpoint: &str,
    mut writer: ObjectWriter,
    mut target: Target<'_>,
    base: i64,
    keys: i64,
    hash_task: tokio::task::JoinHandle<Result<HashKv>>,
) -> Result<Written> {
    let mut stream = client
        .clone()
        .snapshot()
        .await
        .map_err(|e| etcd::err(endpoint, "snapshot", e))?;
    let (mut db_bytes, mut stored_bytes) = (0u64, 0u64);
    let mut revision_after = None;
    // etcd's own SHA-256 at the end of the database, checked beside the
    // compression so that a restore need not hash the database again
    let mut db = TailHasher::on_a_thread();
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
        db.update(msg.blob());
        writer.write(msg.blob())?;
        if writer.ready() >= PART_SIZE {
            let bytes = writer.take();
            stored_bytes += bytes.len() as u64;
            target.part(bytes).await?;
        }
    }
    if db_bytes == 0 {
        return Err(etcd::err(
            endpoint,
            "snapshot",
            "etcd sent an empty snapshot",
        ));
    }
    let damaged = |e: BackupError| {
        let why =
            "the snapshot arrived damaged and is not stored (the next full snapshot tries again)";
        etcd::err(endpoint, "snapshot stream", format!("{e}: {why}"))
    };
    db.finish(target.name)
        .and_then(|summed| check_db(summed, target.name))
        .map_err(damaged)?;
    let revision_after = revision_after.unwrap_or(base);
    let trailer = Trailer {
        full: Some(FullTrailer {
            revision_after,
            keys,
            hash_kv: hash_kv_of(hash_task).await,
        }),
        ..Default::default()
    };
    let (rest, sha256) = writer.finish(trailer)?;
    stored_bytes += rest.len() as u64;
    target.upload.write(&rest);
    Ok(Written {
        db_bytes,
        stored_bytes,
        revision_after,
        sha256,
    })
}

/// The HashKV computed while the snapshot streamed; a failure only means
/// restores will not compare it.
async fn hash_kv_of(task: tokio::task::JoinHandle<Result<HashKv>>) -> Option<HashKv> {
    match task.await {
        Ok(Ok(h)) => Some(h),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "HashKV for the full snapshot failed; restores will not compare it");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "HashKV task failed");
            None
        }
    }
}
