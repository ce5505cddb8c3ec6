//! Downloading backup objects for a restore, checked on the way: the full
//! snapshot streamed to a file (with etcd's own checksum), deltas in memory.

use std::io::Write;
use std::path::Path;

use futures::StreamExt;

use super::FullInfo;
use crate::bucket::Bucket;
use crate::checksum::{check_db, TailHasher};
use crate::codec::{self, EncryptionKey, ObjectReader};
use crate::delta::{self, RevisionRecord};
use crate::error::io_at;
use crate::{BackupError, Result};

/// Downloads, checks and decodes a delta.
pub async fn fetch_delta(
    bucket: &Bucket,
    name: &str,
    key: Option<&EncryptionKey>,
) -> Result<(codec::DeltaMeta, Vec<RevisionRecord>)> {
    let bytes = bucket.get_all(name).await?;
    let (decoded, body) = codec::decode(name, bucket.shoot(), &bytes, key)?;
    let meta = decoded
        .header
        .delta
        .ok_or_else(|| BackupError::corrupt(name, "the header describes no delta"))?;
    check_name(name, meta.first_revision, meta.last_revision)?;
    let records = delta::decode_records(name, &body, &meta)?;
    Ok((meta, records))
}

/// The name and the header must agree on the revisions.
pub fn check_name(name: &str, first: i64, last: i64) -> Result<()> {
    match crate::catalog::parse_name(name, 0) {
        Some(e) if e.first == first && e.last == last => Ok(()),
        _ => Err(BackupError::corrupt(
            name,
            format!("its name does not match its header (revisions {first}..{last})"),
        )),
    }
}

/// Streams full snapshot `name` (decrypted with `key`, decompressed) through
/// `sink`, checking it on the way: the object's frames and SHA-256, the header
/// against the name, the trailer's revisions, and etcd's own hash at the end
/// of the database (on a thread of its own) unless the header says the writer
/// checked it (it finishes an object only when the hash matched, and the
/// object's SHA-256 covers every byte since).
pub(crate) async fn read_full(
    bucket: &Bucket,
    key: Option<&EncryptionKey>,
    name: &str,
    sink: &mut (dyn FnMut(&[u8]) -> Result<()> + Send),
) -> Result<FullInfo> {
    let mut reader = ObjectReader::new(name, bucket.shoot(), key).hashing_on_a_thread();
    let mut db = Some(TailHasher::on_a_thread());
    let mut stream = bucket.get(name).await?;
    while let Some(bytes) = stream.next().await {
        let bytes = bytes?;
        reader.feed(&bytes, &mut |plain| {
            if let Some(db) = &mut db {
                db.update(plain);
            }
            sink(plain)
        })?;
        let writer_checked = reader.header().and_then(|h| h.full.as_ref());
        if db.is_some() && writer_checked.is_some_and(|f| f.db_hash_checked) {
            db = None;
        }
    }
    let decoded = reader.finish()?;
    if let Some(db) = db {
        check_db(db.finish(name)?, name)?;
    }
    let meta = decoded
        .header
        .full
        .ok_or_else(|| BackupError::corrupt(name, "the header describes no full snapshot"))?;
    check_name(name, meta.base_revision, meta.base_revision)?;
    let trailer = decoded
        .trailer
        .full
        .ok_or_else(|| BackupError::corrupt(name, "the trailer records no revisions"))?;
    Ok(FullInfo {
        base_revision: meta.base_revision,
        revision_after: trailer.revision_after,
        keys: trailer.keys,
        hash_kv: trailer.hash_kv,
        // the reader checked that the plain bytes were as many
        db_bytes: decoded.trailer.plain_bytes,
    })
}

/// Downloads full snapshot `name` into `path` (decrypted with `key`,
/// decompressed), checking it on the way ([`read_full`]); `path` appears
/// only once every check passed.
pub async fn download_full(
    bucket: &Bucket,
    key: Option<&EncryptionKey>,
    name: &str,
    path: &Path,
) -> Result<FullInfo> {
    let part = path.with_extension("part");
    let file = std::fs::File::create(&part).map_err(io_at("creating", &part))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let full = read_full(bucket, key, name, &mut |plain| {
        out.write_all(plain).map_err(io_at("writing", &part))
    })
    .await?;
    let file = out.into_inner().map_err(|e| BackupError::Io {
        what: format!("writing {}", part.display()),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_at("syncing", &part))?;
    std::fs::rename(&part, path).map_err(io_at("renaming", &part))?;
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// A full snapshot object whose frames are intact (its SHA-256 matches)
    /// but whose database does not end with etcd's hash of it is refused as
    /// corrupt while it downloads, unless its writer checked that hash:
    /// `etcdutl snapshot restore` no longer checks it again
    /// (`--skip-hash-check`), so this is the check.
    #[tokio::test]
    async fn a_full_snapshot_with_a_wrong_etcd_hash_is_corrupt() {
        use crate::codec::{encode, FullMeta, FullTrailer, Kind, Trailer};
        let store = std::sync::Arc::new(object_store::memory::InMemory::new());
        let bucket = Bucket::from_store(store, "base", "s", "memory://");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let db: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let cases = [
            ("good", Sha256::digest(&db), false),
            ("bad", Sha256::digest(b"x"), false),
            // the writer says it checked the hash: the download trusts it
            // (the object's own SHA-256 covers every byte since) and does
            // not hash the database again
            ("writer-checked", Sha256::digest(b"x"), true),
        ];
        for (case, hash, db_hash_checked) in cases {
            let meta = FullMeta {
                base_revision: 7,
                db_hash_checked,
                ..Default::default()
            };
            let header = crate::full::header("s", 1, meta, 0);
            let trailer = Trailer {
                full: Some(FullTrailer {
                    revision_after: 7,
                    ..Default::default()
                }),
                ..Default::default()
            };
            let body = [&db[..], &hash[..]].concat();
            let (obj, _) = encode(header, &body, 3, None, trailer).unwrap();
            let name = crate::catalog::object_name(
                Kind::Full,
                7,
                7,
                1_000 + case.len() as i64,
                true,
                false,
            );
            bucket.put(&name, obj.into()).await.unwrap();
            let got = download_full(&bucket, None, &name, &dir.join(format!("{case}.db"))).await;
            match (case, got) {
                ("good" | "writer-checked", Ok(full)) => {
                    assert_eq!(full.db_bytes, body.len() as u64)
                }
                ("bad", Err(BackupError::Corrupt { problem, .. })) => {
                    assert!(problem.contains("etcd's own checksum"), "{problem}")
                }
                (case, other) => panic!("{case}: {other:?}"),
            }
        }
    }
}
