//! A full snapshot that already is a file: etcd's database as a migration's
//! source handed it over, stored in the bucket as a regular full snapshot at
//! its revision (so a restore plans, downloads and checks it like any other;
//! [`crate::restore::download_full`] fetches one back into a file).

use std::io::Read;
use std::path::Path;

use crate::bucket::{Bucket, PART_SIZE};
use crate::catalog::object_name_in_epoch;
use crate::checksum::DbHash;
use crate::codec::{FullMeta, FullTrailer, Kind, ObjectWriter, Trailer};
use crate::error::io_at;
use crate::full::{Encoding, FullSnapshot};
use crate::{now_ms, Result};

/// What is known of a snapshot file: etcd's state at one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSnapshot {
    /// The revision the database holds (no write came after it).
    pub revision: i64,
    /// Keys at that revision.
    pub keys: i64,
}

/// Stores the database file `path` as a full snapshot of `shoot` at
/// `snap.revision`, encoded like every full snapshot (part by part, never
/// whole in memory). A file that does not end with etcd's own checksum of its
/// data is refused (nothing is stored).
pub async fn store_file(
    bucket: &Bucket,
    shoot: &str,
    encoding: &Encoding,
    path: &Path,
    snap: FileSnapshot,
) -> Result<FullSnapshot> {
    let started = std::time::Instant::now();
    let time_ms = now_ms();
    let name = object_name_in_epoch(
        encoding.epoch,
        Kind::Full,
        snap.revision,
        snap.revision,
        time_ms,
        encoding.level > 0,
        encoding.key.is_some(),
    );
    let meta = FullMeta {
        base_revision: snap.revision,
        etcd_version: String::new(),
        cluster_id: 0,
        // the object is finished only when etcd's hash of the file matched
        db_hash_checked: true,
    };
    let header = crate::full::header(shoot, time_ms, meta, encoding.epoch);
    let mut writer = ObjectWriter::new(header, encoding.level, encoding.key.as_ref())?;
    let mut file = std::fs::File::open(path).map_err(io_at("opening", path))?;
    let mut upload = bucket.upload(&name).await?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut db_bytes, mut stored_bytes) = (0u64, 0u64);
    let mut db = DbHash::default();
    let checked = loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break db.check(&path.display().to_string()),
            Ok(n) => n,
            Err(e) => break Err(io_at("reading", path)(e)),
        };
        db_bytes += n as u64;
        db.update(&buf[..n]);
        writer.write(&buf[..n])?;
        if writer.ready() >= PART_SIZE {
            let bytes = writer.take();
            stored_bytes += bytes.len() as u64;
            if let Err(e) = upload.wait_for_capacity(2).await {
                break Err(bucket.upload_error(&name, e));
            }
            upload.write(&bytes);
        }
    };
    if let Err(e) = checked {
        let _ = upload.abort().await;
        return Err(e);
    }
    let trailer = Trailer {
        full: Some(FullTrailer {
            revision_after: snap.revision,
            keys: snap.keys,
            hash_kv: None,
        }),
        ..Default::default()
    };
    let (rest, sha256) = writer.finish(trailer)?;
    stored_bytes += rest.len() as u64;
    upload.write(&rest);
    upload
        .finish()
        .await
        .map_err(|e| bucket.upload_error(&name, e))?;
    tracing::info!(shoot, %name, revision = snap.revision, db_bytes, "snapshot file stored as a full snapshot");
    Ok(FullSnapshot {
        name,
        base_revision: snap.revision,
        revision_after: snap.revision,
        keys: snap.keys,
        db_bytes,
        stored_bytes,
        sha256,
        time_ms,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::EncryptionKey;
    use crate::config::BucketConfig;
    use sha2::Digest;

    /// A stored file is a full snapshot at its revision in the catalog and
    /// comes back byte for byte, sealed with the key and only with it.
    #[tokio::test]
    async fn a_file_becomes_a_full_snapshot_and_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("bucket").display());
        let bucket = Bucket::open(&BucketConfig::url(url), "s1", true).unwrap();
        let mut db: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let file = dir.path().join("snapshot.db");
        std::fs::write(&file, &db).unwrap();
        let encoding = Encoding::default();
        let snap = FileSnapshot {
            revision: 42,
            keys: 9,
        };
        let refused = store_file(&bucket, "s1", &encoding, &file, snap).await;
        assert!(
            matches!(&refused, Err(crate::BackupError::Corrupt { problem, .. }) if problem.contains("checksum")),
            "{refused:?}"
        );
        assert!(bucket.catalog().await.unwrap().is_empty(), "nothing stored");
        let sum: [u8; 32] = sha2::Sha256::digest(&db).into();
        db.extend_from_slice(&sum);
        std::fs::write(&file, &db).unwrap();
        let key = EncryptionKey::new([7; 32], Some("k1".into()));
        let encoding = Encoding {
            level: 3,
            key: Some(key.clone()),
            epoch: 0,
        };
        let stored = store_file(&bucket, "s1", &encoding, &file, snap)
            .await
            .unwrap();
        assert_eq!(
            (stored.base_revision, stored.db_bytes),
            (42, db.len() as u64)
        );
        let catalog = bucket.catalog().await.unwrap();
        let full = catalog.newest_full().unwrap();
        assert_eq!((full.name.as_str(), full.first), (stored.name.as_str(), 42));
        assert!(full.encrypted);
        let back = dir.path().join("back.db");
        let info = crate::restore::download_full(&bucket, Some(&key), &stored.name, &back)
            .await
            .map_err(|e| e.to_string())
            .unwrap();
        assert_eq!((info.base_revision, info.keys), (42, 9));
        assert_eq!(std::fs::read(&back).unwrap(), db);
        let without_key = crate::restore::download_full(&bucket, None, &stored.name, &back).await;
        assert!(without_key.is_err(), "a sealed snapshot needs the key");
    }
}
