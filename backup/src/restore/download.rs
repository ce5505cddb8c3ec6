//! Downloading backup objects for a restore, checked on the way: the full
//! snapshot streamed to a file (with etcd's own checksum), deltas in memory.

use std::io::Write;
use std::path::Path;

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::FullInfo;
use crate::bucket::Bucket;
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

/// Checks etcd's own SHA-256 at the end of a snapshot database.
#[derive(Default)]
pub struct DbHash {
    hasher: Sha256,
    tail: Vec<u8>,
    bytes: u64,
}

impl DbHash {
    /// Adds plain bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        self.tail.extend_from_slice(data);
        if self.tail.len() > 32 {
            let cut = self.tail.len() - 32;
            self.hasher.update(&self.tail[..cut]);
            self.tail.drain(..cut);
        }
    }

    /// Whether the last 32 bytes are the SHA-256 of the rest (etcd appends it).
    pub fn check(self, object: &str) -> Result<u64> {
        let digest = self.hasher.finalize();
        if self.tail.len() != 32 || digest[..] != self.tail[..] {
            return Err(BackupError::corrupt(
                object,
                "etcd's own checksum at the end of the snapshot does not match its data",
            ));
        }
        Ok(self.bytes)
    }
}

/// A [`DbHash`] computed on a thread of its own, beside the download's
/// decompression and writing (SHA-256 of 600 MiB takes ~3 s on a core
/// without SHA instructions, as long as the rest of the download).
struct DbHashThread {
    chunks: std::sync::mpsc::SyncSender<Vec<u8>>,
    thread: std::thread::JoinHandle<DbHash>,
}

impl DbHashThread {
    fn spawn() -> Self {
        let (chunks, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(16);
        let thread = std::thread::spawn(move || {
            let mut db = DbHash::default();
            for chunk in rx {
                db.update(&chunk);
            }
            db
        });
        DbHashThread { chunks, thread }
    }

    /// Hands plain bytes to the thread (waits while 16 chunks are queued).
    fn update(&self, data: &[u8]) {
        // the thread ends only when `chunks` is dropped (in `finish`)
        let _ = self.chunks.send(data.to_vec());
    }

    /// Waits for the hash and checks it ([`DbHash::check`]).
    fn finish(self, object: &str) -> Result<u64> {
        drop(self.chunks);
        let db = self.thread.join().map_err(|_| BackupError::Io {
            what: format!("checking etcd's hash of {object}"),
            source: std::io::Error::other("the hashing thread panicked"),
        })?;
        db.check(object)
    }
}

/// Streams full snapshot `name` (decrypted with `key`, decompressed) through
/// `sink`, checking it on the way: the object's frames and SHA-256, etcd's
/// own hash at the end of the database (on a thread of its own), the header
/// against the name, and the trailer's revisions.
pub(crate) async fn read_full(
    bucket: &Bucket,
    key: Option<&EncryptionKey>,
    name: &str,
    sink: &mut (dyn FnMut(&[u8]) -> Result<()> + Send),
) -> Result<FullInfo> {
    let mut reader = ObjectReader::new(name, bucket.shoot(), key);
    let db = DbHashThread::spawn();
    let mut stream = bucket.get(name).await?;
    while let Some(bytes) = stream.next().await {
        let bytes = bytes?;
        reader.feed(&bytes, &mut |plain| {
            db.update(plain);
            sink(plain)
        })?;
    }
    let decoded = reader.finish()?;
    let db_bytes = db.finish(name)?;
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
        db_bytes,
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

    #[test]
    fn etcd_db_hash_is_checked() {
        let data = b"some database bytes".to_vec();
        let mut with_hash = data.clone();
        with_hash.extend_from_slice(&Sha256::digest(&data));
        let mut h = DbHash::default();
        for piece in with_hash.chunks(5) {
            h.update(piece);
        }
        assert_eq!(h.check("o").unwrap(), with_hash.len() as u64);
        let mut bad = DbHash::default();
        bad.update(&data);
        assert!(bad.check("o").is_err());
    }

    /// A full snapshot object whose frames are intact (its SHA-256 matches)
    /// but whose database does not end with etcd's hash of it is refused as
    /// corrupt while it downloads: `etcdctl snapshot restore` no longer
    /// checks that hash again (`--skip-hash-check`), so this is the check.
    #[tokio::test]
    async fn a_full_snapshot_with_a_wrong_etcd_hash_is_corrupt() {
        use crate::codec::{encode, FullMeta, FullTrailer, Kind, Trailer};
        let store = std::sync::Arc::new(object_store::memory::InMemory::new());
        let bucket = Bucket::from_store(store, "base", "s", "memory://");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let db: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        for (case, hash) in [("good", Sha256::digest(&db)), ("bad", Sha256::digest(b"x"))] {
            let meta = FullMeta {
                base_revision: 7,
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
                ("good", Ok(full)) => assert_eq!(full.db_bytes, body.len() as u64),
                ("bad", Err(BackupError::Corrupt { problem, .. })) => {
                    assert!(problem.contains("etcd's own checksum"), "{problem}")
                }
                (case, other) => panic!("{case}: {other:?}"),
            }
        }
    }
}
