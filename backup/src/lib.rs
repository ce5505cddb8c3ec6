//! Continuous backups of a shoot's etcd to object storage, and verified restores.
//!
//! - **Full snapshots** come from etcd's Maintenance snapshot stream and are
//!   streamed (bounded memory whatever the database size) through zstd,
//!   optional AES-256-GCM and SHA-256 into a multipart upload ([`full`]).
//! - **Delta snapshots** record every watch event (puts and deletes with their
//!   revisions) from the full snapshot's revision on, sealed every
//!   `deltaPeriodMs` or when `deltaMaxBytes` is reached ([`delta`]).
//! - Objects live under one prefix per shoot with self-describing names, so the
//!   [`catalog`] is rebuilt from a bucket listing alone ([`bucket`]).
//! - [`restore`] picks the newest full snapshot at or before the target,
//!   restores it with `etcdutl snapshot restore`, replays the deltas into a
//!   temporary etcd revision by revision and verifies revision, key count and
//!   `HashKV`; it is an explicit state machine with a pure `step`, so a rerun
//!   resumes.
//! - [`verify`] checks every object; [`retention`] decides what garbage
//!   collection deletes.
//!
//! The continuous loop is [`run`] (or [`Backup`], to watch its progress), meant
//! to run inside `ringd` or `ringctl backup start`.

pub mod bench;
pub mod bucket;
pub mod catalog;
pub mod checksum;
pub mod codec;
pub mod config;
pub mod delta;
mod error;
pub mod etcd;
mod etcd_wal;
pub use etcd_wal::never_committed;
pub mod full;
pub mod full_file;
pub mod metrics;
pub mod objects;
pub mod restore;
pub mod retention;
pub mod runner;
pub mod spool;
pub mod standby;
pub mod verify;

pub use bucket::Bucket;
pub use catalog::{Catalog, Entry, Kind};
pub use config::{BackupConfig, BucketConfig, EncryptionConfig, EtcdConfig, Retention, Schedule};
pub use error::{BackupError, Result};
pub use runner::{run, snapshot_once, Backup, Progress};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
