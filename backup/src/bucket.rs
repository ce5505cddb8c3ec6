//! The bucket of one shoot: an `object_store` under the shoot's prefix, with
//! errors that say whether the bucket is missing, unreachable or refusing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, RetryConfig, WriteMultipart};

use crate::catalog::Catalog;
use crate::config::BucketConfig;
use crate::{BackupError, Result};

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

/// The text of an error and all its causes.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

impl Bucket {
    /// Opens the bucket of `cfg` for `shoot`. For `file://`, `create` makes the
    /// folder if it is missing (writers); readers get [`BackupError::BucketMissing`].
    pub fn open(cfg: &BucketConfig, shoot: &str, create: bool) -> Result<Self> {
        cfg.validate("bucket")?;
        let (scheme, rest) = cfg.url.split_once("://").unwrap_or(("", ""));
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        let client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(60));
        let bad = |e: object_store::Error| BackupError::config("bucket.url", chain(&e));
        let (store, base): (Arc<dyn ObjectStore>, String) = match scheme {
            "file" => {
                let dir = std::path::Path::new(rest);
                if !dir.is_dir() {
                    if create {
                        std::fs::create_dir_all(dir).map_err(|e| BackupError::BucketMissing {
                            bucket: cfg.url.clone(),
                            hint: format!("cannot create the folder: {e}"),
                        })?;
                    } else {
                        return Err(BackupError::BucketMissing {
                            bucket: cfg.url.clone(),
                            hint: format!(
                                "the folder {} does not exist; check the URL",
                                dir.display()
                            ),
                        });
                    }
                }
                let fs = object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(bad)?;
                (Arc::new(fs), String::new())
            }
            "memory" => (
                Arc::new(object_store::memory::InMemory::new()),
                String::new(),
            ),
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(cfg.url.clone())
                    .with_retry(retry)
                    .with_client_options(client);
                if let Some(e) = &cfg.endpoint {
                    b = b.with_endpoint(e.clone());
                }
                if let Some(r) = &cfg.region {
                    b = b.with_region(r.clone());
                }
                // `with_client_options` above replaced what `from_env` read, so the
                // documented default (`AWS_ALLOW_HTTP`) is applied here.
                let env_allow = std::env::var("AWS_ALLOW_HTTP")
                    .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
                if let Some(h) = cfg.allow_http.or(env_allow.then_some(true)) {
                    b = b.with_allow_http(h);
                }
                b = with_options(b, &cfg.options, |b, k, v| b.with_config(k, v))?;
                let has_key = cfg.options.contains_key("aws_access_key_id")
                    || std::env::var_os("AWS_ACCESS_KEY_ID").is_some();
                if cfg.endpoint.is_some() && !has_key {
                    // Without a key, object_store would ask a cloud metadata service.
                    return Err(BackupError::config(
                        "bucket.endpoint",
                        "an S3-compatible endpoint needs credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or bucket.options)",
                    ));
                }
                (Arc::new(b.build().map_err(bad)?), url_path(rest))
            }
            "gs" => {
                let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(cfg.url.clone())
                    .with_retry(retry)
                    .with_client_options(client);
                let b = with_options(b, &cfg.options, |b, k, v| b.with_config(k, v))?;
                (Arc::new(b.build().map_err(bad)?), url_path(rest))
            }
            _ => {
                let b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(cfg.url.clone())
                    .with_retry(retry)
                    .with_client_options(client);
                let b = with_options(b, &cfg.options, |b, k, v| b.with_config(k, v))?;
                (Arc::new(b.build().map_err(bad)?), url_path(rest))
            }
        };
        let mut b = Self::from_store(store, &base, shoot, &cfg.url);
        if !base.is_empty() {
            let bucket = rest.split('/').next().unwrap_or_default();
            b.root = format!("{scheme}://{bucket}");
        }
        Ok(b)
    }

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

    /// Maps an object-store error of `what` (an operation) to a clear error.
    /// `object_store` carries a store's own error code (S3 `NoSuchBucket`, a
    /// refused connection inside the HTTP client) only in its message, so
    /// this one function reads the text; nothing else in Ring matches on
    /// error strings.
    pub fn error(&self, what: &str, e: object_store::Error) -> BackupError {
        let text = chain(&e);
        let lower = text.to_lowercase();
        if lower.contains("nosuchbucket") || lower.contains("specified bucket does not exist") {
            return BackupError::BucketMissing {
                bucket: self.url.clone(),
                hint: "create it first (or fix the URL)".into(),
            };
        }
        let unreachable = [
            "error sending request",
            "connection refused",
            "tcp connect",
            "timed out",
            "timeout",
            "connection reset",
            "dns error",
            "broken pipe",
            "incompletemessage",
            "connection closed",
        ];
        if unreachable.iter().any(|p| lower.contains(p)) {
            return BackupError::BucketUnreachable {
                bucket: self.url.clone(),
                message: format!("{what}: {text}"),
            };
        }
        let retryable = !matches!(
            e,
            object_store::Error::NotFound { .. }
                | object_store::Error::InvalidPath { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
                | object_store::Error::UnknownConfigurationKey { .. }
        );
        BackupError::Bucket {
            bucket: self.url.clone(),
            message: format!("{what}: {text}"),
            retryable,
        }
    }

    /// Every object under the shoot's prefix: `(name, size)`.
    pub async fn list(&self) -> Result<Vec<(String, u64)>> {
        let mut stream = self.store.list(Some(&self.prefix));
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            let meta = item.map_err(|e| self.error(&format!("listing {}", self.describe()), e))?;
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
            return Err(self.error(&format!("listing {}", self.describe()), e));
        }
        Ok(())
    }

    /// Stores a whole object (small ones: deltas).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        self.store
            .put(&self.path(name), bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| self.error(&format!("uploading {name}"), e))
    }

    /// Starts a multipart upload (large objects: full snapshots).
    pub async fn upload(&self, name: &str) -> Result<WriteMultipart> {
        let upload = self
            .store
            .put_multipart(&self.path(name))
            .await
            .map_err(|e| self.error(&format!("starting the upload of {name}"), e))?;
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

/// Applies `bucket.options` to a builder (`set` is its `with_config`).
fn with_options<B, K: std::str::FromStr>(
    mut b: B,
    options: &std::collections::BTreeMap<String, String>,
    set: fn(B, K, String) -> B,
) -> Result<B> {
    for (k, v) in options {
        let key = k.parse().map_err(|_| {
            BackupError::config(
                format!("bucket.options.{k}"),
                "not an option of this kind of bucket",
            )
        })?;
        b = set(b, key, v.clone());
    }
    Ok(b)
}

/// The path part of `bucket/some/prefix`.
fn url_path(rest: &str) -> String {
    rest.split_once('/')
        .map_or("", |(_, p)| p)
        .trim_matches('/')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

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
