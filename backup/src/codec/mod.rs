//! The format of every backup object: self-describing, streamed, checked.
//!
//! ```text
//! "RINGBAK1"                       magic
//! u32 BE n, n bytes                header (JSON): kind, shoot, revisions, compression, encryption
//! frames                           u8 kind, u32 BE length, payload
//!   kind 1  data                   a chunk of the (zstd) stream; AES-256-GCM sealed when encrypted
//!   kind 2  last data              the final chunk (possibly empty), so truncation is detected
//!   kind 3  end                    trailer (JSON): what was only known at the end
//! 32 bytes                         SHA-256 of everything before
//! ```
//!
//! Encrypted chunks use a per-object random nonce XOR the chunk index, and the
//! header's digest, the index and the last-chunk flag as associated data: a
//! chunk cannot be moved, dropped or replaced without detection. Memory stays
//! bounded: the writer holds one chunk, the reader one frame and a fixed
//! decompression window.
//!
//! The writer is [`ObjectWriter`] (`writer.rs`), the reader [`ObjectReader`]
//! (`reader.rs`); keys, the chunk cipher and whole-object seals are in
//! `key.rs`.

use serde::{Deserialize, Serialize};

mod key;
mod reader;
mod writer;

pub use key::{hex, seal, unseal, EncryptionKey};
pub use reader::{decode, Decoded, ObjectReader};
pub use writer::{encode, ObjectWriter};

/// Bytes at the start of every object.
pub const MAGIC: &[u8; 8] = b"RINGBAK1";
/// The format version written into headers.
pub const FORMAT: u32 = 1;
/// Compressed bytes per frame.
pub const CHUNK: usize = 1 << 20;
/// The largest frame a reader accepts.
const MAX_FRAME: usize = CHUNK + 64 * 1024;
/// The largest header or trailer a reader accepts.
const MAX_META: usize = 4 << 20;

const FRAME_DATA: u8 = 1;
const FRAME_LAST: u8 = 2;
const FRAME_END: u8 = 3;

/// Full snapshot or delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// A complete etcd database (Maintenance snapshot).
    Full,
    /// Watch events of a revision range.
    Delta,
}

impl Kind {
    /// The prefix of object names of this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::Delta => "delta",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `HashKV` of etcd at a revision, as etcd reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HashKv {
    pub revision: i64,
    pub hash: u32,
    /// etcd's compaction revision when it computed the hash (the hash covers the
    /// history kept after it).
    pub compact_revision: i64,
}

/// The encryption of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionHeader {
    /// Always `aes-256-gcm`.
    pub algorithm: String,
    /// The key's name.
    pub key_id: String,
    /// A check value of the key (not the key): tells a wrong key from corruption.
    pub key_check: String,
    /// The object's base nonce (hex, 12 bytes).
    pub nonce: String,
    /// The shoot a sealed object belongs to (see [`seal`]); backup objects
    /// name it in their [`Header`] instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// What a delta holds, known before it is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DeltaMeta {
    /// The first and last revision of the events.
    pub first_revision: i64,
    pub last_revision: i64,
    pub revisions: u64,
    pub events: u64,
    /// Keys in etcd after the last revision.
    pub keys_after: i64,
    /// Granted TTLs (seconds) of the leases the events use: (lease id, ttl).
    pub leases: Vec<(i64, i64)>,
    /// `HashKV` at `last_revision`, when recorded.
    #[serde(default)]
    pub hash_kv: Option<HashKv>,
}

/// What a full snapshot holds, known before it is written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FullMeta {
    /// etcd's revision just before the snapshot began: the snapshot holds at
    /// least this revision; deltas continue after it.
    pub base_revision: i64,
    pub etcd_version: String,
    pub cluster_id: u64,
    /// The writer checked etcd's own SHA-256 at the end of the database and
    /// finishes the object only when it matched, so a restore need not hash
    /// the database again (the object's SHA-256 covers it). Absent in
    /// objects written before it was checked there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub db_hash_checked: bool,
}

/// The header of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    pub format: u32,
    pub kind: Kind,
    pub shoot: String,
    pub created_ms: i64,
    /// `zstd` or `none`.
    pub compression: String,
    #[serde(default)]
    pub encryption: Option<EncryptionHeader>,
    #[serde(default)]
    pub full: Option<FullMeta>,
    #[serde(default)]
    pub delta: Option<DeltaMeta>,
    /// The ring epoch of the host that wrote it (0: not recorded); the
    /// object's name must say the same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// What a full snapshot learned while it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct FullTrailer {
    /// etcd's revision once the snapshot had started: the snapshot holds at most this.
    pub revision_after: i64,
    /// Keys at the base revision.
    pub keys: i64,
    /// `HashKV` at the base revision.
    #[serde(default)]
    pub hash_kv: Option<HashKv>,
}

/// The trailer of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Trailer {
    /// Bytes before compression and encryption.
    pub plain_bytes: u64,
    /// Data frames.
    pub chunks: u64,
    #[serde(default)]
    pub full: Option<FullTrailer>,
}

#[cfg(test)]
mod tests;
