//! The bucket of one shoot: an `object_store` under the shoot's prefix, with
//! errors that say whether the bucket is missing, unreachable or refusing.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, WriteMultipart};

use crate::catalog::Catalog;
use crate::{BackupError, Result};

mod environment;
mod failure;
mod open;

use failure::Op;

/// Parts of a multipart upload.
pub const PART_SIZE: usize = 8 << 20;

/// A shoot's objects in a bucket.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// `<url prefix>/<shoot>`.
    prefix: ObjectPath,
    /// The URL, for messages.
    url: String,
    /// The URL of the bucket's root (`s3://bucket`), for [`describe`](Self::describe).
    root: String,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({}/{})", self.url, self.prefix)
    }
}

impl Bucket {
    /// A bucket on an existing store (tests share an in-memory store this way).
    pub fn from_store(store: Arc<dyn ObjectStore>, base: &str, shoot: &str, url: &str) -> Self {
        let prefix = if base.is_empty() {
            ObjectPath::from(shoot)
        } else {
            ObjectPath::from(format!("{base}/{shoot}"))
        };
        Bucket {
            store,
            prefix,
            url: url.to_string(),
            root: url.trim_end_matches('/').to_string(),
        }
    }

    /// The bucket URL and the shoot's prefix, for messages.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.root, self.prefix)
    }

    /// The same store under another shoot's prefix.
    pub fn for_shoot(&self, shoot: &str) -> Bucket {
        let base = self
            .prefix
            .as_ref()
            .rsplit_once('/')
            .map_or(String::new(), |(b, _)| b.to_string());
        let mut b = Self::from_store(self.store.clone(), &base, shoot, &self.url);
        b.root = self.root.clone();
        b
    }

    fn path(&self, name: &str) -> ObjectPath {
        self.prefix.child(name)
    }

    /// The shoot whose prefix this is (its last path segment).
    pub fn shoot(&self) -> &str {
        self.prefix.filename().unwrap_or_default()
    }

    /// Maps an object-store error of `what` (an operation on an object that
    /// may be missing, e.g. a download) to a clear error.
    pub fn error(&self, what: &str, e: object_store::Error) -> BackupError {
        self.failed(Op::Object, what, e)
    }

    /// Every object under the shoot's prefix: `(name, size)`.
    pub async fn list(&self) -> Result<Vec<(String, u64)>> {
        let mut stream = self.store.list(Some(&self.prefix));
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item
                .map_err(|e| self.failed(Op::List, &format!("listing {}", self.describe()), e))?;
            let Some(name) = meta.location.filename() else {
                continue;
            };
            // Only direct children: objects of other shoots share no prefix with
            // this one, and anything deeper is not ours.
            if meta
                .location
                .prefix_match(&self.prefix)
                .is_some_and(|mut p| p.nth(1).is_none())
            {
                out.push((name.to_string(), meta.size));
            }
        }
        Ok(out)
    }

    /// The catalog, from the listing alone.
    pub async fn catalog(&self) -> Result<Catalog> {
        Ok(Catalog::from_listing(self.list().await?))
    }

    /// Proves the bucket exists and answers (a listing).
    pub async fn check(&self) -> Result<()> {
        let mut stream = self.store.list(Some(&self.prefix));
        if let Some(Err(e)) = stream.next().await {
            return Err(self.failed(Op::List, &format!("listing {}", self.describe()), e));
        }
        Ok(())
    }

    /// Stores a whole object (small ones: deltas).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&self.path(name), bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| self.failed(Op::Create, &format!("uploading {name}"), e))
    }

    /// Records, before the host of ring epoch `epoch` serves, that its
    /// history begins at `revision` (the data it restored or was handed):
    /// a fenced host's later uploads past it are then never taken for
    /// history (see `catalog::begin`). Sealed under `key`. Returns its name.
    pub async fn record_epoch_begin(
        &self,
        key: Option<&crate::codec::EncryptionKey>,
        epoch: u64,
        revision: i64,
    ) -> Result<String> {
        let name = crate::catalog::begin_name(epoch, revision, key.is_some());
        let shoot = self.shoot().to_string();
        let body = crate::catalog::EpochBeginBody {
            shoot: shoot.clone(),
            epoch,
            revision,
            at_ms: crate::now_ms(),
        };
        let json = serde_json::to_vec(&body)
            .map_err(|e| BackupError::Catalog(format!("cannot encode {name}: {e}")))?;
        let bytes = match key {
            Some(key) => crate::codec::seal(key, &shoot, &name, &json)?,
            None => json,
        };
        self.put(&name, bytes.into()).await?;
        Ok(name)
    }

    /// The catalog as `key` vouches for it: under a key only sealed
    /// objects count, and every epoch record is opened and checked (see
    /// [`open_epoch_begin`](Self::open_epoch_begin)); one that does not open
    /// is left out with a warning, as it would move where history begins.
    /// Returns the catalog and the plain objects a key left out.
    pub async fn trusted_catalog(
        &self,
        key: Option<&crate::codec::EncryptionKey>,
    ) -> Result<(Catalog, Vec<String>)> {
        let mut catalog = self.catalog().await?;
        let plain = match key {
            Some(_) => catalog.retain_encrypted(),
            None => Vec::new(),
        };
        let mut refused = Vec::new();
        for b in &catalog.begins {
            match self.open_epoch_begin(key, b).await {
                Ok(_) => {}
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => {
                    tracing::warn!(bucket = %self.describe(), error = %e, "an epoch record that does not open is left out");
                    refused.push(b.name.clone());
                }
            }
        }
        if !refused.is_empty() {
            catalog.drop_begins(&refused);
        }
        Ok((catalog, plain))
    }

    /// Reads the record `begin` names and checks it: opened with `key` as
    /// this shoot's when sealed (a sealed record without a key, another
    /// shoot's, or one altered is an error), and saying the same epoch and
    /// revision as its name.
    pub async fn open_epoch_begin(
        &self,
        key: Option<&crate::codec::EncryptionKey>,
        begin: &crate::catalog::EpochBegin,
    ) -> Result<crate::catalog::EpochBeginBody> {
        let name = &begin.name;
        let bytes = self.get_all(name).await?;
        let plain = match (begin.encrypted, key) {
            (true, key) => crate::codec::unseal(key, self.shoot(), name, &bytes)?,
            (false, _) => bytes,
        };
        let body: crate::catalog::EpochBeginBody = serde_json::from_slice(&plain)
            .map_err(|e| BackupError::corrupt(name, format!("not an epoch record: {e}")))?;
        if (body.shoot.as_str(), body.epoch, body.revision)
            != (self.shoot(), begin.epoch, begin.revision)
        {
            return Err(BackupError::corrupt(
                name,
                format!(
                    "it records epoch {} of shoot {} at revision {}, not what its name says",
                    body.epoch, body.shoot, body.revision
                ),
            ));
        }
        Ok(body)
    }

    /// Starts a multipart upload (large objects: full snapshots).
    pub async fn upload(&self, name: &str) -> Result<WriteMultipart> {
        let upload = self
            .store
            .put_multipart(&self.path(name))
            .await
            .map_err(|e| self.failed(Op::Create, &format!("starting the upload of {name}"), e))?;
        Ok(WriteMultipart::new_with_chunk_size(upload, PART_SIZE))
    }

    /// The object's bytes as a stream.
    pub async fn get(
        &self,
        name: &str,
    ) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        let result = self
            .store
            .get(&self.path(name))
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => BackupError::Catalog(format!(
                    "object {name} is not in {} (deleted meanwhile?)",
                    self.describe()
                )),
                e => self.error(&format!("downloading {name}"), e),
            })?;
        let me = self.clone();
        let name = name.to_string();
        Ok(result
            .into_stream()
            .map(move |r| r.map_err(|e| me.error(&format!("downloading {name}"), e)))
            .boxed())
    }

    /// The whole object in memory (small ones).
    pub async fn get_all(&self, name: &str) -> Result<Vec<u8>> {
        let mut s = self.get(name).await?;
        let mut out = Vec::new();
        while let Some(b) = s.next().await {
            out.extend_from_slice(&b?);
        }
        Ok(out)
    }

    /// Deletes an object (a missing one is fine).
    pub async fn delete(&self, name: &str) -> Result<()> {
        match self.store.delete(&self.path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(&format!("deleting {name}"), e)),
        }
    }

    /// The object-store error of a failed multipart upload.
    pub fn upload_error(&self, name: &str, e: object_store::Error) -> BackupError {
        self.error(&format!("uploading {name}"), e)
    }
}
#[cfg(test)]
mod tests {
    use super::open::url_path;
    use super::*;
    use crate::config::BucketConfig;

    #[tokio::test]
    async fn lists_only_the_shoots_own_objects() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let a = Bucket::from_store(store.clone(), "base", "a", "memory://");
        let ab = Bucket::from_store(store.clone(), "base", "ab", "memory://");
        a.put("x", Bytes::from_static(b"1")).await.unwrap();
        ab.put("y", Bytes::from_static(b"22")).await.unwrap();
        store
            .put(
                &ObjectPath::from("base/a/deeper/z"),
                Bytes::from_static(b"3").into(),
            )
            .await
            .unwrap();
        assert_eq!(a.list().await.unwrap(), vec![("x".to_string(), 1)]);
        assert_eq!(ab.list().await.unwrap(), vec![("y".to_string(), 2)]);
        assert_eq!(a.for_shoot("ab").list().await.unwrap().len(), 1);
        assert_eq!(a.get_all("x").await.unwrap(), b"1");
        a.delete("x").await.unwrap();
        a.delete("x").await.unwrap();
        assert!(a.get_all("x").await.is_err());
    }

    /// A record opens as written; a sealed one only with its key and as its
    /// shoot's; one whose body says another revision than its name is
    /// refused, naming both.
    #[tokio::test]
    async fn an_epoch_record_opens_only_as_written() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let a = Bucket::from_store(store.clone(), "", "a", "memory://");
        let key = crate::codec::EncryptionKey::generate();
        let parse = |name: &str| crate::catalog::parse_begin(name).unwrap();
        let plain = a.record_epoch_begin(None, 2, 20).await.unwrap();
        let body = a.open_epoch_begin(None, &parse(&plain)).await.unwrap();
        assert_eq!(
            (body.shoot.as_str(), body.epoch, body.revision),
            ("a", 2, 20)
        );
        let sealed = a.record_epoch_begin(Some(&key), 3, 30).await.unwrap();
        assert!(a
            .open_epoch_begin(Some(&key), &parse(&sealed))
            .await
            .is_ok());
        let other = crate::codec::EncryptionKey::generate();
        assert!(a
            .open_epoch_begin(Some(&other), &parse(&sealed))
            .await
            .is_err());
        assert!(a.open_epoch_begin(None, &parse(&sealed)).await.is_err());
        // copied into another shoot's prefix: refused as not that shoot's
        let b = a.for_shoot("b");
        b.put(&sealed, a.get_all(&sealed).await.unwrap().into())
            .await
            .unwrap();
        assert!(b
            .open_epoch_begin(Some(&key), &parse(&sealed))
            .await
            .is_err());
        // renamed to another revision
        let renamed = crate::catalog::begin_name(2, 25, false);
        a.put(&renamed, a.get_all(&plain).await.unwrap().into())
            .await
            .unwrap();
        let err = a
            .open_epoch_begin(None, &parse(&renamed))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("at revision 20, not what its name says"),
            "{err}"
        );
    }

    /// A record that does not open (forged without the key) counts for
    /// nothing: not as the newest epoch, not as where one began.
    #[tokio::test]
    async fn the_trusted_catalog_leaves_out_records_that_do_not_open() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let a = Bucket::from_store(store, "", "a", "memory://");
        let key = crate::codec::EncryptionKey::generate();
        a.record_epoch_begin(Some(&key), 2, 20).await.unwrap();
        let forged = crate::catalog::begin_name(9, 1, true);
        a.put(&forged, Bytes::from_static(b"RINGSEAL..."))
            .await
            .unwrap();
        let listed = a.catalog().await.unwrap();
        assert_eq!(listed.newest_epoch(), 9, "the listing alone believes names");
        let (trusted, plain) = a.trusted_catalog(Some(&key)).await.unwrap();
        assert!(plain.is_empty(), "{plain:?}");
        let epochs: Vec<u64> = trusted.begins.iter().map(|b| b.epoch).collect();
        assert_eq!((epochs, trusted.newest_epoch()), (vec![2], 2));
    }

    #[test]
    fn a_missing_folder_is_named_for_readers() {
        let err = Bucket::open(
            &BucketConfig::url("file:///nonexistent/ring-bucket"),
            "s",
            false,
        )
        .unwrap_err();
        assert!(matches!(err, BackupError::BucketMissing { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert_eq!(url_path("bucket/a/b/"), "a/b");
        assert_eq!(url_path("bucket"), "");
    }
}
