//! The typed backup configuration (`kind: Backup`), validated field by field.
//!
//! ```yaml
//! apiVersion: ring.gardener.cloud/v1alpha1
//! kind: Backup
//! shoot: m1
//! etcd:
//!   endpoints: [https://127.42.7.9:2379]
//!   caFile: /state/shoots/m1/pki/ca.crt
//!   certFile: /state/shoots/m1/pki/etcd-client.crt
//!   keyFile: /state/shoots/m1/pki/etcd-client.key
//! bucket:
//!   url: s3://backups/ring          # file:///dir (default kind), s3://, gs://, az://, memory://
//!   endpoint: http://127.0.0.1:9000  # any S3-compatible server (optional)
//!   allowHttp: true
//! schedule: {deltaPeriodMs: 1000, deltaMaxBytes: 4194304, fullIntervalSecs: 3600, fullAfterDeltaBytes: 268435456}
//! compression: {level: 3}            # zstd level; 0 stores uncompressed
//! encryption: {keyFile: /etc/ring/backup.key, keyId: prod-1}   # or keyEnv: RING_BACKUP_KEY
//! retention: {policy: keepLast, count: 7}                       # or {policy: exponential}
//! spool: {dir: /var/lib/ring/spool/m1, memoryBytes: 16777216, maxBytes: 1073741824}
//! ```
//!
//! Credentials for the clouds come from their usual environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`,
//! `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{BackupError, Result};

/// The API version of Ring's configuration files.
pub const API_VERSION: &str = "ring.gardener.cloud/v1alpha1";

/// The kind of a backup configuration file.
pub const KIND: &str = "Backup";

fn default_api_version() -> String {
    API_VERSION.into()
}

fn default_kind() -> String {
    KIND.into()
}

/// Everything the continuous backup of one shoot needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupConfig {
    /// Must be `ring.gardener.cloud/v1alpha1`.
    #[serde(default = "default_api_version")]
    pub api_version: String,
    /// Must be `Backup`.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// The shoot whose etcd is backed up; its objects live under `<bucket>/<shoot>/`.
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit.
    pub shoot: String,
    /// How to reach the shoot's etcd.
    pub etcd: EtcdConfig,
    /// Where the objects go.
    pub bucket: BucketConfig,
    /// When deltas and full snapshots are made.
    #[serde(default)]
    pub schedule: Schedule,
    /// zstd compression of every object.
    #[serde(default)]
    pub compression: Compression,
    /// Encryption at rest (AES-256-GCM); none when absent.
    #[serde(default)]
    pub encryption: Option<EncryptionConfig>,
    /// Garbage collection after every full snapshot; none when absent.
    #[serde(default)]
    pub retention: Option<Retention>,
    /// Where pending deltas wait while the bucket is unreachable.
    #[serde(default)]
    pub spool: SpoolConfig,
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs (`https://host:port` or `http://host:port`).
    /// At least one, each `https://host:port` or `http://host:port`; TLS files need an
    /// `https://` one.
    pub endpoints: Vec<String>,
    /// The CA that signed etcd's serving certificate (https endpoints).
    /// Must be an existing file.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (etcd with `--client-cert-auth`).
    /// Must be an existing file; goes with `keyFile`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// Client key.
    /// Must be an existing file; goes with `certFile`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The name to expect in etcd's certificate [default: the endpoint's host].
    #[serde(default)]
    pub server_name: Option<String>,
}

/// The bucket: a URL and options for S3-compatible servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BucketConfig {
    /// `file:///dir`, `s3://bucket[/prefix]`, `gs://bucket[/prefix]`,
    /// `az://container[/prefix]` or `memory://` (tests).
    /// Schemes: file (absolute path), s3, s3a, gs, az, abfs (naming a bucket) and memory.
    pub url: String,
    /// S3 endpoint (any S3-compatible server) [default: `AWS_ENDPOINT_URL` or AWS].
    /// Must start with `http://` or `https://`; only for s3:// buckets.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// S3 region [default: `AWS_REGION` or us-east-1].
    #[serde(default)]
    pub region: Option<String>,
    /// Allow plain-HTTP endpoints [default: `AWS_ALLOW_HTTP` or false].
    #[serde(default)]
    pub allow_http: Option<bool>,
    /// Further `object_store` options by their names (e.g. `aws_access_key_id`,
    /// `google_service_account`, `azure_storage_account_name`); they override
    /// the environment.
    /// Only for s3://, gs:// and az:// buckets.
    #[serde(default)]
    pub options: std::collections::BTreeMap<String, String>,
}

/// When deltas and full snapshots are made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Schedule {
    /// Pending events are sealed into a delta this often.
    /// Must be at least 10.
    pub delta_period_ms: u64,
    /// ... or as soon as they reach this many bytes.
    /// Must be positive.
    pub delta_max_bytes: u64,
    /// A new full snapshot this often.
    /// Must be positive.
    pub full_interval_secs: u64,
    /// ... or after this many bytes of deltas since the last one.
    /// Must be positive.
    pub full_after_delta_bytes: u64,
    /// ... or after this many revisions since the last one (0: no limit). A
    /// restore replays deltas one revision at a time, so this bounds its time.
    pub full_after_revisions: u64,
    /// etcd's `HashKV` is recorded with a delta at most this often (0: never; full
    /// snapshots always record it). It costs one scan of etcd's database.
    pub hash_kv_interval_secs: u64,
    /// The longest wait between retries of a failed upload or connection.
    /// Must be positive.
    pub max_backoff_ms: u64,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            delta_period_ms: 1000,
            delta_max_bytes: 4 << 20,
            full_interval_secs: 3600,
            full_after_delta_bytes: 256 << 20,
            full_after_revisions: 0,
            hash_kv_interval_secs: 300,
            max_backoff_ms: 10_000,
        }
    }
}

/// zstd compression of every object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Compression {
    /// zstd level 1..=19; 0 stores the data uncompressed.
    /// Must be from 0 to 19.
    pub level: i32,
}

impl Default for Compression {
    fn default() -> Self {
        Compression { level: 3 }
    }
}

/// Where the AES-256 key comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EncryptionConfig {
    /// A file holding the key: 32 raw bytes, 64 hex digits or base64.
    /// Exactly one of `keyFile` and `keyEnv`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// An environment variable holding the key (hex or base64).
    #[serde(default)]
    pub key_env: Option<String>,
    /// The name recorded in every object [default: a check value derived from the key].
    #[serde(default)]
    pub key_id: Option<String>,
}

/// Which full snapshots garbage collection keeps. Deltas are kept while a full
/// snapshot they build on is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", tag = "policy", deny_unknown_fields)]
pub enum Retention {
    /// The newest `count` full snapshots.
    #[serde(rename_all = "camelCase")]
    KeepLast { count: usize },
    /// All within the last hour, one per hour for a day, one per day for a
    /// week, one per week for a month.
    Exponential,
}

/// Pending deltas while the bucket is unreachable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SpoolConfig {
    /// Where pending deltas beyond `memoryBytes` are written [default: a folder
    /// named after the shoot in the system's temp dir].
    pub dir: Option<PathBuf>,
    /// Pending bytes kept in memory; more spill to `dir`.
    pub memory_bytes: u64,
    /// Pending bytes in all; beyond that, Ring stops reading etcd's watch (etcd
    /// keeps the events) until uploads succeed again.
    /// Must be positive and at least `memoryBytes`.
    pub max_bytes: u64,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig {
            dir: None,
            memory_bytes: 16 << 20,
            max_bytes: 1 << 30,
        }
    }
}

impl SpoolConfig {
    /// The spool folder, which a running backup needs: deltas wait there for
    /// the bucket, so it must be a folder that outlives a reboot (the seed's
    /// state dir), never a temporary one picked for the user.
    pub fn dir(&self) -> Result<&Path> {
        self.dir.as_deref().ok_or_else(|| {
            BackupError::config(
                "spool.dir",
                "say where deltas wait for the bucket (ringctl backup start: --state-dir, or spool.dir in --config); a temporary folder is never chosen, a reboot may empty it",
            )
        })
    }
}

impl BackupConfig {
    /// A config with defaults for `shoot`, its etcd and bucket.
    pub fn new(shoot: impl Into<String>, etcd: EtcdConfig, bucket: BucketConfig) -> Self {
        BackupConfig {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            shoot: shoot.into(),
            etcd,
            bucket,
            schedule: Schedule::default(),
            compression: Compression::default(),
            encryption: None,
            retention: None,
            spool: SpoolConfig::default(),
        }
    }

    /// Parses YAML (unknown keys rejected) and validates.
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let config: BackupConfig =
            serde_yaml::from_str(text).map_err(|e| BackupError::config(source, e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a YAML file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BackupError::config(path.display().to_string(), e.to_string()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Checks every field; errors name the field and what is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.api_version != API_VERSION {
            return Err(BackupError::config(
                "apiVersion",
                format!("must be {API_VERSION}, not {:?}", self.api_version),
            ));
        }
        if self.kind != KIND {
            return Err(BackupError::config(
                "kind",
                format!("must be {KIND}, not {:?}", self.kind),
            ));
        }
        seed::validate_shoot_name(&self.shoot)
            .map_err(|e| BackupError::config("shoot", e.to_string()))?;
        self.etcd.validate("etcd")?;
        self.bucket.validate("bucket")?;
        let s = &self.schedule;
        if s.delta_period_ms < 10 {
            return Err(BackupError::config(
                "schedule.deltaPeriodMs",
                format!("must be at least 10, not {}", s.delta_period_ms),
            ));
        }
        for (field, v) in [
            ("schedule.deltaMaxBytes", s.delta_max_bytes),
            ("schedule.fullIntervalSecs", s.full_interval_secs),
            ("schedule.fullAfterDeltaBytes", s.full_after_delta_bytes),
            ("schedule.maxBackoffMs", s.max_backoff_ms),
        ] {
            if v == 0 {
                return Err(BackupError::config(field, "must be greater than 0"));
            }
        }
        if !(0..=19).contains(&self.compression.level) {
            return Err(BackupError::config(
                "compression.level",
                format!(
                    "must be 0 (none) or a zstd level 1..=19, not {}",
                    self.compression.level
                ),
            ));
        }
        if let Some(e) = &self.encryption {
            e.validate("encryption")?;
        }
        if let Some(Retention::KeepLast { count: 0 }) = &self.retention {
            return Err(BackupError::config(
                "retention.count",
                "must keep at least 1 full snapshot",
            ));
        }
        if self.spool.max_bytes == 0 || self.spool.memory_bytes > self.spool.max_bytes {
            return Err(BackupError::config(
                "spool",
                format!(
                    "maxBytes ({}) must be positive and at least memoryBytes ({})",
                    self.spool.max_bytes, self.spool.memory_bytes
                ),
            ));
        }
        Ok(())
    }
}

impl EtcdConfig {
    /// The shoot's etcd on a local seed: its endpoint and Ring's etcd client
    /// certificate from the shoot's PKI.
    pub fn for_local_shoot(layout: &seed::ShootLayout, spec: &seed::ControlPlaneSpec) -> Self {
        let pki = layout.pki();
        let client = pki.leaf(seed::pki::Leaf::EtcdClient);
        EtcdConfig {
            endpoints: vec![spec.endpoint.etcd_url()],
            ca_file: Some(pki.ca().cert),
            cert_file: Some(client.cert),
            key_file: Some(client.key),
            server_name: Some(spec.endpoint.address.to_string()),
        }
    }

    /// A plain-HTTP etcd (tests, temporary restore etcds).
    pub fn plain(endpoint: impl Into<String>) -> Self {
        EtcdConfig {
            endpoints: vec![endpoint.into()],
            ..Default::default()
        }
    }

    /// Checks the endpoints and TLS files.
    pub fn validate(&self, field: &str) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(BackupError::config(
                format!("{field}.endpoints"),
                "give at least one client URL, e.g. https://127.0.0.1:2379",
            ));
        }
        let mut tls = false;
        for (i, e) in self.endpoints.iter().enumerate() {
            let rest = if let Some(r) = e.strip_prefix("https://") {
                tls = true;
                r
            } else if let Some(r) = e.strip_prefix("http://") {
                r
            } else {
                return Err(BackupError::config(
                    format!("{field}.endpoints[{i}]"),
                    format!("{e:?} must start with https:// or http://"),
                ));
            };
            let host_port = rest.trim_end_matches('/');
            let ok = host_port
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(BackupError::config(
                    format!("{field}.endpoints[{i}]"),
                    format!("{e:?} must be scheme://host:port"),
                ));
            }
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(BackupError::config(
                format!("{field}.certFile"),
                "certFile and keyFile go together",
            ));
        }
        if !tls && (self.ca_file.is_some() || self.cert_file.is_some()) {
            return Err(BackupError::config(
                format!("{field}.endpoints"),
                "TLS files are given but no endpoint is https://",
            ));
        }
        for (name, f) in [
            ("caFile", &self.ca_file),
            ("certFile", &self.cert_file),
            ("keyFile", &self.key_file),
        ] {
            if let Some(p) = f {
                if !p.is_file() {
                    return Err(BackupError::config(
                        format!("{field}.{name}"),
                        format!("{} does not exist or is not a file", p.display()),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The URL schemes the bucket understands.
const SCHEMES: [&str; 7] = ["file", "s3", "s3a", "gs", "az", "abfs", "memory"];

impl BucketConfig {
    /// A bucket at `url` with default options.
    pub fn url(url: impl Into<String>) -> Self {
        BucketConfig {
            url: url.into(),
            ..Default::default()
        }
    }

    /// Checks the URL and options.
    pub fn validate(&self, field: &str) -> Result<()> {
        let Some((scheme, rest)) = self.url.split_once("://") else {
            return Err(BackupError::config(
                format!("{field}.url"),
                format!(
                    "{:?} is not a URL; use file:///dir, s3://bucket/prefix, gs://bucket, az://container or memory://",
                    self.url
                ),
            ));
        };
        if !SCHEMES.contains(&scheme) {
            return Err(BackupError::config(
                format!("{field}.url"),
                format!(
                    "unknown scheme {scheme:?}; use one of {}",
                    SCHEMES.join(", ")
                ),
            ));
        }
        if scheme == "file" && !rest.starts_with('/') {
            return Err(BackupError::config(
                format!("{field}.url"),
                format!(
                    "{:?}: file URLs need an absolute path (file:///dir)",
                    self.url
                ),
            ));
        }
        if matches!(scheme, "s3" | "s3a" | "gs" | "az" | "abfs")
            && rest.split('/').next().unwrap_or("").is_empty()
        {
            return Err(BackupError::config(
                format!("{field}.url"),
                format!("{:?} names no bucket", self.url),
            ));
        }
        if matches!(scheme, "file" | "memory") && !self.options.is_empty() {
            return Err(BackupError::config(
                format!("{field}.options"),
                "options only apply to s3://, gs:// and az:// buckets",
            ));
        }
        if let Some(e) = &self.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(BackupError::config(
                    format!("{field}.endpoint"),
                    format!("{e:?} must start with http:// or https://"),
                ));
            }
            if scheme != "s3" && scheme != "s3a" {
                return Err(BackupError::config(
                    format!("{field}.endpoint"),
                    "an endpoint only applies to s3:// buckets",
                ));
            }
        }
        Ok(())
    }
}

impl EncryptionConfig {
    /// Checks that exactly one key source is given.
    pub fn validate(&self, field: &str) -> Result<()> {
        match (&self.key_file, &self.key_env) {
            (Some(_), Some(_)) => Err(BackupError::config(
                field,
                "give keyFile or keyEnv, not both",
            )),
            (None, None) => Err(BackupError::config(
                field,
                "give keyFile (a file with the key) or keyEnv (an environment variable)",
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
