//! Opening a bucket: one object store per URL scheme, with Ring's timeouts
//! and retries.

use std::sync::Arc;
use std::time::Duration;

use object_store::{ClientOptions, ObjectStore, RetryConfig};

use super::failure::chain;
use super::Bucket;
use crate::config::BucketConfig;
use crate::{BackupError, Result};

impl Bucket {
    /// Opens the bucket of `cfg` for `shoot`. For `file://`, `create` makes the
    /// folder if it is missing (writers); readers get [`BackupError::BucketMissing`].
    pub fn open(cfg: &BucketConfig, shoot: &str, create: bool) -> Result<Self> {
        cfg.validate("bucket")?;
        let (scheme, rest) = cfg.url.split_once("://").unwrap_or(("", ""));
        let (store, base): (Arc<dyn ObjectStore>, String) = match scheme {
            "file" => (
                open_file(cfg, std::path::Path::new(rest), create)?,
                String::new(),
            ),
            "memory" => (
                Arc::new(object_store::memory::InMemory::new()),
                String::new(),
            ),
            "s3" | "s3a" => (open_s3(cfg)?, url_path(rest)),
            "gs" => (open_gcs(cfg)?, url_path(rest)),
            _ => (open_azure(cfg)?, url_path(rest)),
        };
        let mut b = Self::from_store(store, &base, shoot, &cfg.url);
        if !base.is_empty() {
            let bucket = rest.split('/').next().unwrap_or_default();
            b.root = format!("{scheme}://{bucket}");
        }
        Ok(b)
    }
}

/// How `object_store` is told to retry and time out.
fn http_settings() -> (RetryConfig, ClientOptions) {
    let retry = RetryConfig {
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let client = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(60));
    (retry, client)
}

/// A store that cannot be built is a configuration error.
fn bad_url(e: object_store::Error) -> BackupError {
    BackupError::config("bucket.url", chain(&e))
}

/// `file://DIR`: the folder, made when missing if `create` (writers).
fn open_file(
    cfg: &BucketConfig,
    dir: &std::path::Path,
    create: bool,
) -> Result<Arc<dyn ObjectStore>> {
    if !dir.is_dir() {
        if !create {
            return Err(BackupError::BucketMissing {
                bucket: cfg.url.clone(),
                hint: format!("the folder {} does not exist; check the URL", dir.display()),
            });
        }
        std::fs::create_dir_all(dir).map_err(|e| BackupError::BucketMissing {
            bucket: cfg.url.clone(),
            hint: format!("cannot create the folder: {e}"),
        })?;
    }
    let fs = object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(bad_url)?;
    Ok(Arc::new(fs))
}

/// `s3://bucket[/prefix]` (AWS or any S3-compatible endpoint).
fn open_s3(cfg: &BucketConfig) -> Result<Arc<dyn ObjectStore>> {
    let (retry, client) = http_settings();
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
    let env_allow =
        std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
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
    Ok(Arc::new(b.build().map_err(bad_url)?))
}

/// `gs://bucket[/prefix]`.
fn open_gcs(cfg: &BucketConfig) -> Result<Arc<dyn ObjectStore>> {
    let (retry, client) = http_settings();
    let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
        .with_url(cfg.url.clone())
        .with_retry(retry)
        .with_client_options(client);
    let b = with_options(b, &cfg.options, |b, k, v| b.with_config(k, v))?;
    Ok(Arc::new(b.build().map_err(bad_url)?))
}

/// `az://container[/prefix]` (and Azure's other URL forms).
fn open_azure(cfg: &BucketConfig) -> Result<Arc<dyn ObjectStore>> {
    let (retry, client) = http_settings();
    let b = object_store::azure::MicrosoftAzureBuilder::from_env()
        .with_url(cfg.url.clone())
        .with_retry(retry)
        .with_client_options(client);
    let b = with_options(b, &cfg.options, |b, k, v| b.with_config(k, v))?;
    Ok(Arc::new(b.build().map_err(bad_url)?))
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
pub(super) fn url_path(rest: &str) -> String {
    rest.split_once('/')
        .map_or("", |(_, p)| p)
        .trim_matches('/')
        .to_string()
}
