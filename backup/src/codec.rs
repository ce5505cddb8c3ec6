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

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::EncryptionConfig;
use crate::{BackupError, Result};

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
}

impl EncryptionHeader {
    /// A header for a new object sealed with `key`, with a fresh random base nonce.
    fn new(key: &EncryptionKey) -> (Self, [u8; 12]) {
        let nonce: [u8; 12] = rand::random();
        let header = EncryptionHeader {
            algorithm: "aes-256-gcm".into(),
            key_id: key.id.clone(),
            key_check: key.check.clone(),
            nonce: hex(&nonce),
        };
        (header, nonce)
    }

    /// The cipher and base nonce that open `object`: no key, or another key than
    /// the one it was sealed with, is said as such (not as corruption).
    fn open(&self, key: Option<&EncryptionKey>, object: &str) -> Result<(Aes256Gcm, [u8; 12])> {
        let Some(key) = key else {
            return Err(BackupError::KeyRequired {
                object: object.to_string(),
                key_id: self.key_id.clone(),
            });
        };
        if self.key_check != key.check {
            return Err(BackupError::WrongKey {
                object: object.to_string(),
                object_key: self.key_id.clone(),
                object_check: self.key_check.clone(),
                configured_key: key.id.clone(),
                configured_check: key.check.clone(),
            });
        }
        let nonce: [u8; 12] = unhex(&self.nonce)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| {
                BackupError::corrupt(object, "the encryption nonce in the header is malformed")
            })?;
        Ok((key.cipher(), nonce))
    }
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

/// An AES-256 key with its id and check value.
#[derive(Clone)]
pub struct EncryptionKey {
    key: [u8; 32],
    /// The name recorded in objects.
    pub id: String,
    /// The check value recorded in objects.
    pub check: String,
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EncryptionKey({}, check {})", self.id, self.check)
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl EncryptionKey {
    /// A key from its 32 bytes; `id` defaults to the check value.
    pub fn new(key: [u8; 32], id: Option<String>) -> Self {
        let mut h = Sha256::new();
        h.update(b"ring-backup key check\0");
        h.update(key);
        let check = hex(&h.finalize()[..8]);
        EncryptionKey {
            key,
            id: id.unwrap_or_else(|| check.clone()),
            check,
        }
    }

    /// Parses a key: 32 raw bytes, 64 hex digits or base64 of 32 bytes.
    pub fn parse(text: &[u8], source: &str, id: Option<String>) -> Result<Self> {
        let bad = || {
            BackupError::config(
                source,
                "the key must be 32 bytes: 64 hex digits, base64 of 32 bytes, or 32 raw bytes (e.g. `head -c 32 /dev/urandom | base64`)",
            )
        };
        let trimmed = std::str::from_utf8(text).map(str::trim).ok();
        let bytes = match trimmed {
            Some(t) if t.len() == 64 => unhex(t).ok_or_else(bad)?,
            Some(t) if !t.is_empty() && text.len() != 32 => {
                base64::engine::general_purpose::STANDARD
                    .decode(t)
                    .map_err(|_| bad())?
            }
            _ => text.to_vec(),
        };
        let key: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
        Ok(EncryptionKey::new(key, id))
    }

    /// Loads the key the config names.
    pub fn load(cfg: &EncryptionConfig) -> Result<Self> {
        cfg.validate("encryption")?;
        if let Some(path) = &cfg.key_file {
            let field = format!("encryption.keyFile ({})", path.display());
            let text =
                std::fs::read(path).map_err(|e| BackupError::config(&field, e.to_string()))?;
            return Self::parse(&text, &field, cfg.key_id.clone());
        }
        let var = cfg.key_env.as_deref().unwrap_or_default();
        let field = format!("encryption.keyEnv ({var})");
        let text = std::env::var(var)
            .map_err(|_| BackupError::config(&field, "the environment variable is not set"))?;
        Self::parse(text.as_bytes(), &field, cfg.key_id.clone())
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(&self.key.into())
    }
}

fn nonce_for(base: &[u8; 12], index: u64) -> [u8; 12] {
    let mut n = *base;
    for (i, b) in index.to_be_bytes().iter().enumerate() {
        n[4 + i] ^= b;
    }
    n
}

fn aad(header_digest: &[u8; 32], index: u64, last: bool) -> [u8; 41] {
    let mut a = [0u8; 41];
    a[..32].copy_from_slice(header_digest);
    a[32..40].copy_from_slice(&index.to_be_bytes());
    a[40] = u8::from(last);
    a
}

/// Writes an object incrementally: feed plain bytes with [`write`](Self::write),
/// take the encoded bytes with [`take`](Self::take), end with [`finish`](Self::finish).
pub struct ObjectWriter {
    out: Vec<u8>,
    hasher: Sha256,
    compressor: Option<zstd::stream::write::Encoder<'static, Vec<u8>>>,
    pending: Vec<u8>,
    cipher: Option<(Aes256Gcm, [u8; 12])>,
    header_digest: [u8; 32],
    index: u64,
    plain_bytes: u64,
}

impl ObjectWriter {
    /// Starts an object: writes the magic and the header. `header.compression`
    /// and `header.encryption` are filled in here.
    pub fn new(mut header: Header, level: i32, key: Option<&EncryptionKey>) -> Result<Self> {
        header.format = FORMAT;
        header.compression = if level > 0 { "zstd" } else { "none" }.into();
        let cipher = key.map(|k| {
            let (enc, nonce) = EncryptionHeader::new(k);
            header.encryption = Some(enc);
            (k.cipher(), nonce)
        });
        if key.is_none() {
            header.encryption = None;
        }
        let json = serde_json::to_vec(&header)
            .map_err(|e| BackupError::Catalog(format!("cannot encode a header: {e}")))?;
        let header_digest: [u8; 32] = Sha256::digest(&json).into();
        let compressor = if level > 0 {
            Some(
                zstd::stream::write::Encoder::new(Vec::with_capacity(CHUNK), level)
                    .map_err(|e| BackupError::Catalog(format!("zstd: {e}")))?,
            )
        } else {
            None
        };
        let mut w = ObjectWriter {
            out: Vec::with_capacity(CHUNK + 1024),
            hasher: Sha256::new(),
            compressor,
            pending: Vec::new(),
            cipher,
            header_digest,
            index: 0,
            plain_bytes: 0,
        };
        w.emit(MAGIC);
        w.emit(&(json.len() as u32).to_be_bytes());
        w.emit(&json);
        Ok(w)
    }

    fn emit(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.out.extend_from_slice(bytes);
    }

    fn frame(&mut self, kind: u8, payload: &[u8]) {
        self.emit(&[kind]);
        self.emit(&(payload.len() as u32).to_be_bytes());
        self.emit(payload);
    }

    fn seal(&mut self, chunk: &[u8], last: bool) -> Result<()> {
        let kind = if last { FRAME_LAST } else { FRAME_DATA };
        match &self.cipher {
            Some((cipher, base)) => {
                let nonce = nonce_for(base, self.index);
                let aad = aad(&self.header_digest, self.index, last);
                let sealed = cipher
                    .encrypt(
                        Nonce::from_slice(&nonce),
                        Payload {
                            msg: chunk,
                            aad: &aad,
                        },
                    )
                    .map_err(|_| BackupError::Catalog("AES-GCM encryption failed".into()))?;
                self.frame(kind, &sealed);
            }
            None => self.frame(kind, chunk),
        }
        self.index += 1;
        Ok(())
    }

    /// Seals every complete chunk of compressed bytes.
    fn drain(&mut self) -> Result<()> {
        if let Some(c) = &mut self.compressor {
            if c.get_ref().len() >= CHUNK {
                let produced = std::mem::take(c.get_mut());
                self.pending.extend_from_slice(&produced);
            }
        }
        while self.pending.len() >= CHUNK {
            let rest = self.pending.split_off(CHUNK);
            let chunk = std::mem::replace(&mut self.pending, rest);
            self.seal(&chunk, false)?;
        }
        Ok(())
    }

    /// Adds plain bytes.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        use std::io::Write;
        self.plain_bytes += data.len() as u64;
        match &mut self.compressor {
            Some(c) => c
                .write_all(data)
                .map_err(|e| BackupError::Catalog(format!("zstd: {e}")))?,
            None => self.pending.extend_from_slice(data),
        }
        self.drain()
    }

    /// Encoded bytes ready to be stored, taken out of the writer.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Encoded bytes waiting to be taken.
    pub fn ready(&self) -> usize {
        self.out.len()
    }

    /// Ends the object: the last chunk, the trailer and the checksum. Returns the
    /// remaining encoded bytes and the object's SHA-256 (hex).
    pub fn finish(mut self, mut trailer: Trailer) -> Result<(Vec<u8>, String)> {
        if let Some(c) = self.compressor.take() {
            let rest = c
                .finish()
                .map_err(|e| BackupError::Catalog(format!("zstd: {e}")))?;
            self.pending.extend_from_slice(&rest);
        }
        while self.pending.len() > CHUNK {
            let rest = self.pending.split_off(CHUNK);
            let chunk = std::mem::replace(&mut self.pending, rest);
            self.seal(&chunk, false)?;
        }
        let last = std::mem::take(&mut self.pending);
        self.seal(&last, true)?;
        trailer.plain_bytes = self.plain_bytes;
        trailer.chunks = self.index;
        let json = serde_json::to_vec(&trailer)
            .map_err(|e| BackupError::Catalog(format!("cannot encode a trailer: {e}")))?;
        self.frame(FRAME_END, &json);
        let digest = std::mem::take(&mut self.hasher).finalize();
        self.out.extend_from_slice(&digest);
        Ok((self.out, hex(&digest)))
    }
}

/// Encodes a whole object in memory (deltas, tests).
pub fn encode(
    header: Header,
    body: &[u8],
    level: i32,
    key: Option<&EncryptionKey>,
    trailer: Trailer,
) -> Result<(Vec<u8>, String)> {
    let mut w = ObjectWriter::new(header, level, key)?;
    w.write(body)?;
    let mut out = w.take();
    let (rest, sha) = w.finish(trailer)?;
    out.extend_from_slice(&rest);
    Ok((out, sha))
}

/// What a complete, checked object held.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub header: Header,
    pub trailer: Trailer,
    /// SHA-256 (hex) of the object.
    pub sha256: String,
    /// Size of the object.
    pub stored_bytes: u64,
}

enum Stage {
    Magic,
    HeaderLen,
    Header(usize),
    FrameHead,
    Frame(u8, usize),
    Checksum,
    Done,
}

/// Reads an object incrementally: [`feed`](Self::feed) bytes as they arrive
/// (plain bytes go to a callback), then [`finish`](Self::finish) checks that it
/// was complete and intact.
pub struct ObjectReader {
    name: String,
    key: Option<EncryptionKey>,
    stage: Stage,
    buf: Vec<u8>,
    hasher: Sha256,
    /// The last 32 bytes seen are held back from `whole`: they may be the checksum.
    whole: Sha256,
    tail: Vec<u8>,
    offset: u64,
    header: Option<Header>,
    header_digest: [u8; 32],
    cipher: Option<(Aes256Gcm, [u8; 12])>,
    decompressor: Option<zstd::stream::raw::Decoder<'static>>,
    window: Vec<u8>,
    index: u64,
    seen_last: bool,
    plain_bytes: u64,
    trailer: Option<Trailer>,
    failed: Option<String>,
    recorded: Option<[u8; 32]>,
}

impl ObjectReader {
    /// A reader of the object `name` (for messages), with the key if one is configured.
    pub fn new(name: &str, key: Option<&EncryptionKey>) -> Self {
        ObjectReader {
            name: name.to_string(),
            key: key.cloned(),
            stage: Stage::Magic,
            buf: Vec::new(),
            hasher: Sha256::new(),
            whole: Sha256::new(),
            tail: Vec::with_capacity(64),
            offset: 0,
            header: None,
            header_digest: [0; 32],
            cipher: None,
            decompressor: None,
            window: vec![0; 128 * 1024],
            index: 0,
            seen_last: false,
            plain_bytes: 0,
            trailer: None,
            failed: None,
            recorded: None,
        }
    }

    /// The header, once read.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    fn corrupt(&self, problem: impl Into<String>) -> BackupError {
        BackupError::corrupt(&self.name, problem)
    }

    /// Feeds the next bytes of the object; plain data goes to `out`.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        self.keep_whole(data);
        if self.failed.is_some() {
            return Ok(());
        }
        while !data.is_empty() {
            let need = match self.stage {
                Stage::Magic => 8,
                Stage::HeaderLen => 4,
                Stage::Header(n) => n,
                Stage::FrameHead => 5,
                Stage::Frame(_, n) => n,
                Stage::Checksum => 32,
                Stage::Done => {
                    let e = self.corrupt(format!(
                        "{} unexpected bytes after the checksum at offset {}",
                        data.len(),
                        self.offset
                    ));
                    return self.fail(e);
                }
            };
            let take = (need - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            self.offset += take as u64;
            if self.buf.len() < need {
                break;
            }
            let unit = std::mem::take(&mut self.buf);
            if let Err(e) = self.unit(&unit, out) {
                return self.fail(e);
            }
        }
        Ok(())
    }

    fn keep_whole(&mut self, data: &[u8]) {
        self.tail.extend_from_slice(data);
        if self.tail.len() > 32 {
            let cut = self.tail.len() - 32;
            self.whole.update(&self.tail[..cut]);
            self.tail.drain(..cut);
        }
    }

    /// Remembers the first decoding problem; the rest is only hashed, so
    /// `finish` can tell corruption (checksum mismatch) from other problems.
    fn fail(&mut self, e: BackupError) -> Result<()> {
        match e {
            BackupError::Corrupt { problem, .. } => {
                self.failed = Some(problem);
                Ok(())
            }
            other => Err(other),
        }
    }

    fn unit(&mut self, unit: &[u8], out: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        match self.stage {
            Stage::Magic => {
                if unit != MAGIC {
                    return Err(self.corrupt(format!(
                        "not a Ring backup object (starts with {:?}, expected {:?})",
                        String::from_utf8_lossy(unit),
                        String::from_utf8_lossy(MAGIC)
                    )));
                }
                self.hasher.update(unit);
                self.stage = Stage::HeaderLen;
            }
            Stage::HeaderLen => {
                self.hasher.update(unit);
                let n = u32::from_be_bytes([unit[0], unit[1], unit[2], unit[3]]) as usize;
                if n == 0 || n > MAX_META {
                    return Err(self.corrupt(format!("header length {n} is impossible")));
                }
                self.stage = Stage::Header(n);
            }
            Stage::Header(_) => {
                self.hasher.update(unit);
                let header: Header = serde_json::from_slice(unit)
                    .map_err(|e| self.corrupt(format!("unreadable header: {e}")))?;
                self.header_digest = Sha256::digest(unit).into();
                self.start(&header)?;
                self.header = Some(header);
                self.stage = Stage::FrameHead;
            }
            Stage::FrameHead => {
                self.hasher.update(unit);
                let kind = unit[0];
                let n = u32::from_be_bytes([unit[1], unit[2], unit[3], unit[4]]) as usize;
                let ok_kind = matches!(kind, FRAME_DATA | FRAME_LAST | FRAME_END);
                if !ok_kind || n > MAX_FRAME || (kind == FRAME_END && n > MAX_META) {
                    return Err(self.corrupt(format!(
                        "frame {} at offset {} is malformed (kind {kind}, length {n})",
                        self.index,
                        self.offset - 5
                    )));
                }
                if kind != FRAME_END && self.seen_last {
                    return Err(self.corrupt("data after the last chunk"));
                }
                match (kind, n) {
                    (FRAME_END, 0) => return Err(self.corrupt("the end marker is empty")),
                    (FRAME_LAST, 0) => self.chunk(&[], true, out)?,
                    (_, 0) => {}
                    _ => self.stage = Stage::Frame(kind, n),
                }
            }
            Stage::Frame(kind, _) => {
                self.hasher.update(unit);
                if kind == FRAME_END {
                    if !self.seen_last {
                        return Err(self.corrupt("the end marker comes before the last chunk"));
                    }
                    let t: Trailer = serde_json::from_slice(unit)
                        .map_err(|e| self.corrupt(format!("unreadable trailer: {e}")))?;
                    self.trailer = Some(t);
                    self.stage = Stage::Checksum;
                } else {
                    self.chunk(unit, kind == FRAME_LAST, out)?;
                    self.stage = Stage::FrameHead;
                }
            }
            Stage::Checksum => {
                let mut r = [0u8; 32];
                r.copy_from_slice(unit);
                self.recorded = Some(r);
                self.stage = Stage::Done;
            }
            Stage::Done => {}
        }
        Ok(())
    }

    fn start(&mut self, h: &Header) -> Result<()> {
        if h.format != FORMAT {
            return Err(BackupError::Catalog(format!(
                "object {}: format {} is not supported by this Ring (it reads format {FORMAT})",
                self.name, h.format
            )));
        }
        match h.compression.as_str() {
            "zstd" => {
                self.decompressor = Some(
                    zstd::stream::raw::Decoder::new()
                        .map_err(|e| self.corrupt(format!("zstd: {e}")))?,
                );
            }
            "none" => {}
            other => return Err(self.corrupt(format!("unknown compression {other:?}"))),
        }
        if let Some(enc) = &h.encryption {
            self.cipher = Some(enc.open(self.key.as_ref(), &self.name)?);
        }
        Ok(())
    }

    fn chunk(
        &mut self,
        payload: &[u8],
        last: bool,
        out: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let index = self.index;
        self.index += 1;
        if last {
            self.seen_last = true;
        }
        let plain;
        let data: &[u8] = match &self.cipher {
            Some((cipher, base)) => {
                let nonce = nonce_for(base, index);
                let aad = aad(&self.header_digest, index, last);
                plain = cipher
                    .decrypt(
                        Nonce::from_slice(&nonce),
                        Payload {
                            msg: payload,
                            aad: &aad,
                        },
                    )
                    .map_err(|_| {
                        self.corrupt(format!(
                            "chunk {index} fails authentication (AES-GCM): the object was altered"
                        ))
                    })?;
                &plain
            }
            None => payload,
        };
        match &mut self.decompressor {
            None => {
                self.plain_bytes += data.len() as u64;
                out(data)
            }
            Some(d) => {
                use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
                let mut input = InBuffer::around(data);
                loop {
                    let mut output = OutBuffer::around(&mut self.window[..]);
                    d.run(&mut input, &mut output).map_err(|e| {
                        BackupError::corrupt(
                            &self.name,
                            format!("chunk {index} does not decompress: {e}"),
                        )
                    })?;
                    let n = output.pos();
                    if n > 0 {
                        self.plain_bytes += n as u64;
                        out(&self.window[..n])?;
                    }
                    if input.pos() == data.len() && n < self.window.len() {
                        break;
                    }
                }
                Ok(())
            }
        }
    }

    /// Checks the object was complete and intact; returns what it held.
    pub fn finish(self) -> Result<Decoded> {
        let computed = self.whole.clone().finalize();
        let tail_matches = self.tail.len() == 32 && computed[..] == self.tail[..];
        if let Some(problem) = self.failed {
            return Err(if tail_matches {
                BackupError::corrupt(&self.name, problem)
            } else {
                BackupError::corrupt(
                    &self.name,
                    format!(
                        "checksum mismatch after {} bytes: the object is corrupted or truncated (first problem: {problem})",
                        self.offset
                    ),
                )
            });
        }
        let Some(recorded) = self.recorded else {
            let at = match self.stage {
                Stage::Magic | Stage::HeaderLen | Stage::Header(_) => {
                    "inside its header".to_string()
                }
                Stage::FrameHead | Stage::Frame(..) if self.seen_last => {
                    "before its end marker".into()
                }
                Stage::FrameHead | Stage::Frame(..) => {
                    format!("after {} of its chunks, before the last one", self.index)
                }
                Stage::Checksum => "inside its checksum".into(),
                Stage::Done => "unexpectedly".into(),
            };
            // A flipped bit in a frame's length also makes the object "end" early;
            // only an intact checksum at its end says it is not damaged otherwise.
            return Err(BackupError::corrupt(
                &self.name,
                if tail_matches {
                    format!(
                        "truncated: the object ends after {} bytes, {at}",
                        self.offset
                    )
                } else {
                    format!(
                        "checksum mismatch: the object ends after {} bytes, {at}: it is truncated, or corrupted (e.g. in a length field)",
                        self.offset
                    )
                },
            ));
        };
        let own = self.hasher.finalize();
        if own[..] != recorded[..] {
            return Err(BackupError::corrupt(
                &self.name,
                format!(
                    "checksum mismatch: sha256 recorded {}, computed {}: the object is corrupted",
                    hex(&recorded),
                    hex(&own)
                ),
            ));
        }
        let header = self
            .header
            .ok_or_else(|| BackupError::corrupt(&self.name, "no header"))?;
        let trailer = self
            .trailer
            .ok_or_else(|| BackupError::corrupt(&self.name, "no trailer"))?;
        if trailer.plain_bytes != self.plain_bytes || trailer.chunks != self.index {
            return Err(BackupError::corrupt(
                &self.name,
                format!(
                    "the trailer records {} bytes in {} chunks, the object held {} bytes in {}",
                    trailer.plain_bytes, trailer.chunks, self.plain_bytes, self.index
                ),
            ));
        }
        Ok(Decoded {
            header,
            trailer,
            sha256: hex(&recorded),
            stored_bytes: self.offset,
        })
    }
}

/// Decodes a whole object in memory; returns what it held and its plain bytes.
pub fn decode(name: &str, bytes: &[u8], key: Option<&EncryptionKey>) -> Result<(Decoded, Vec<u8>)> {
    let mut r = ObjectReader::new(name, key);
    let mut plain = Vec::new();
    r.feed(bytes, &mut |b| {
        plain.extend_from_slice(b);
        Ok(())
    })?;
    Ok((r.finish()?, plain))
}

/// Magic of a sealed small object (see [`seal`]).
const SEAL_MAGIC: &[u8; 8] = b"RINGSEAL";

/// What a seal authenticates besides the plain bytes: the name and the header.
fn seal_aad(name: &str, header: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(name.len() + 1 + header.len());
    aad.extend_from_slice(name.as_bytes());
    aad.push(0);
    aad.extend_from_slice(header);
    aad
}

/// Encrypts a small object whole (a shoot's spec or a PKI file) with AES-256-GCM.
/// The object's `name` and the header are authenticated with it, so a sealed
/// object cannot be passed off under another name. Layout: `RINGSEAL`, header length (u32 BE),
/// JSON [`EncryptionHeader`], ciphertext with its tag.
pub fn seal(key: &EncryptionKey, name: &str, plain: &[u8]) -> Result<Vec<u8>> {
    let (header, nonce) = EncryptionHeader::new(key);
    let header = serde_json::to_vec(&header)
        .map_err(|e| BackupError::corrupt(name, format!("encoding the seal header: {e}")))?;
    let sealed = key
        .cipher()
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: plain,
                aad: &seal_aad(name, &header),
            },
        )
        .map_err(|_| BackupError::corrupt(name, "encryption failed"))?;
    let mut out = Vec::with_capacity(12 + header.len() + sealed.len());
    out.extend_from_slice(SEAL_MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&sealed);
    Ok(out)
}

/// Opens what [`seal`] wrote under the same `name`: a missing or wrong key, and
/// anything damaged or renamed, is an error saying which.
pub fn unseal(key: Option<&EncryptionKey>, name: &str, bytes: &[u8]) -> Result<Vec<u8>> {
    let corrupt = |problem: &str| BackupError::corrupt(name, problem);
    let rest = bytes
        .strip_prefix(SEAL_MAGIC.as_slice())
        .ok_or_else(|| corrupt("not a sealed object (no RINGSEAL magic)"))?;
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| corrupt("truncated in the seal header"))?;
    let len = u32::from_be_bytes(*len) as usize;
    if len > MAX_META || len > rest.len() {
        return Err(corrupt(
            "truncated, or corrupted in the seal header's length",
        ));
    }
    let (raw_header, sealed) = rest.split_at(len);
    let header: EncryptionHeader = serde_json::from_slice(raw_header)
        .map_err(|e| corrupt(&format!("the seal header is not valid: {e}")))?;
    let (cipher, nonce) = header.open(key, name)?;
    cipher
        .decrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: sealed,
                aad: &seal_aad(name, raw_header),
            },
        )
        .map_err(|_| corrupt("authentication failed: the object is corrupted, truncated or was stored under another name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            format: FORMAT,
            kind: Kind::Delta,
            shoot: "s".into(),
            created_ms: 1,
            compression: String::new(),
            encryption: None,
            full: None,
            delta: Some(DeltaMeta {
                first_revision: 2,
                last_revision: 9,
                ..Default::default()
            }),
        }
    }

    fn body(n: usize) -> Vec<u8> {
        // compressible but not trivial
        (0..n)
            .map(|i| ((i * 7919) % 251) as u8 ^ (i / 4096) as u8)
            .collect()
    }

    fn key(b: u8) -> EncryptionKey {
        EncryptionKey::new([b; 32], Some(format!("k{b}")))
    }

    #[test]
    fn round_trips_every_combination_across_chunks() {
        let data = body(3 * CHUNK + 12345);
        for level in [0, 1, 3] {
            for k in [None, Some(key(1))] {
                let (obj, sha) =
                    encode(header(), &data, level, k.as_ref(), Trailer::default()).unwrap();
                let (d, plain) = decode("o", &obj, k.as_ref()).unwrap();
                assert_eq!(plain, data, "level {level}, key {k:?}");
                assert_eq!(d.sha256, sha);
                assert_eq!(d.header.delta.as_ref().unwrap().last_revision, 9);
                assert_eq!(d.header.encryption.is_some(), k.is_some());
                assert_eq!(d.trailer.plain_bytes, data.len() as u64);
            }
        }
        let (obj, _) = encode(header(), b"", 3, None, Trailer::default()).unwrap();
        assert!(decode("o", &obj, None).unwrap().1.is_empty());
    }

    #[test]
    fn fed_in_small_pieces_gives_the_same() {
        let data = body(CHUNK + 7);
        let k = key(2);
        let (obj, _) = encode(header(), &data, 3, Some(&k), Trailer::default()).unwrap();
        let mut r = ObjectReader::new("o", Some(&k));
        let mut plain = Vec::new();
        for piece in obj.chunks(1000) {
            r.feed(piece, &mut |b| {
                plain.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
        }
        r.finish().unwrap();
        assert_eq!(plain, data);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let data = body(5000);
        for k in [None, Some(key(3))] {
            let (obj, _) = encode(header(), &data, 3, k.as_ref(), Trailer::default()).unwrap();
            for pos in (0..obj.len()).step_by(7) {
                let mut bad = obj.clone();
                bad[pos] ^= 0x10;
                let err = decode("o", &bad, k.as_ref()).err();
                assert!(
                    err.is_some(),
                    "flip at {pos} of {} went unnoticed",
                    obj.len()
                );
            }
        }
    }

    #[test]
    fn flipped_data_bit_reports_a_checksum_mismatch() {
        let data = body(50_000);
        let (mut obj, _) = encode(header(), &data, 0, None, Trailer::default()).unwrap();
        let pos = obj.len() / 2;
        obj[pos] ^= 1;
        let err = decode("o", &obj, None).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn a_flipped_bit_after_the_header_reports_a_checksum_mismatch() {
        // small objects too, where a flip "in the middle" often lands in a frame's
        // length and the object seems to end early (a header flip is named by what
        // it breaks: format, key, JSON)
        for size in [10, 500, 5_000] {
            let data = body(size);
            let (obj, _) = encode(header(), &data, 0, None, Trailer::default()).unwrap();
            let header_end = 12 + u32::from_be_bytes([obj[8], obj[9], obj[10], obj[11]]) as usize;
            for pos in header_end..obj.len() {
                let mut bad = obj.clone();
                bad[pos] ^= 0x04;
                let Err(err) = decode("o", &bad, None) else {
                    panic!("flip at {pos} of {} went unnoticed", obj.len());
                };
                let err = err.to_string();
                assert!(
                    err.contains("checksum mismatch"),
                    "flip at {pos} of {}: {err}",
                    obj.len()
                );
            }
        }
    }

    #[test]
    fn truncation_is_reported_as_such() {
        let data = body(3 * CHUNK);
        let (obj, _) = encode(header(), &data, 0, None, Trailer::default()).unwrap();
        for cut in [3, 20, obj.len() / 2, obj.len() - 40, obj.len() - 1] {
            let err = decode("o", &obj[..cut], None).unwrap_err().to_string();
            assert!(err.contains("truncated"), "cut at {cut}: {err}");
        }
    }

    #[test]
    fn wrong_or_missing_key_is_named() {
        let (obj, _) = encode(header(), b"secret", 3, Some(&key(4)), Trailer::default()).unwrap();
        let err = decode("o", &obj, Some(&key(5))).unwrap_err();
        assert!(matches!(err, BackupError::WrongKey { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("k4") && msg.contains("k5"), "{msg}");
        let err = decode("o", &obj, None).unwrap_err();
        assert!(matches!(err, BackupError::KeyRequired { .. }), "{err}");
        // the same key under another name still decrypts
        let same = EncryptionKey::new([4; 32], Some("renamed".into()));
        assert_eq!(decode("o", &obj, Some(&same)).unwrap().1, b"secret");
        // the plaintext is not in the object
        assert!(!obj.windows(6).any(|w| w == b"secret"));
    }

    #[test]
    fn keys_parse_from_hex_base64_and_raw() {
        let raw = [7u8; 32];
        let hex_text = hex(&raw);
        let b64 = base64::engine::general_purpose::STANDARD.encode(raw);
        let a = EncryptionKey::parse(hex_text.as_bytes(), "f", None).unwrap();
        let b = EncryptionKey::parse(format!("{b64}\n").as_bytes(), "f", None).unwrap();
        let c = EncryptionKey::parse(&raw, "f", None).unwrap();
        assert_eq!(a.check, b.check);
        assert_eq!(b.check, c.check);
        assert_eq!(a.id, a.check);
        assert!(EncryptionKey::parse(b"short", "f", None).is_err());
    }

    #[test]
    fn sealed_objects_open_only_with_their_key_and_name() {
        let key = EncryptionKey::new([7; 32], Some("k1".into()));
        let other = EncryptionKey::new([8; 32], Some("k2".into()));
        let plain = b"-----BEGIN PRIVATE KEY-----\nsecret\n";
        let sealed = seal(&key, "pki_ca.key", plain).unwrap();
        assert!(!sealed.windows(7).any(|w| w == b"PRIVATE"));
        assert_eq!(unseal(Some(&key), "pki_ca.key", &sealed).unwrap(), plain);
        let err = unseal(None, "pki_ca.key", &sealed).unwrap_err();
        assert!(
            matches!(err, BackupError::KeyRequired { ref key_id, .. } if key_id == "k1"),
            "{err}"
        );
        let err = unseal(Some(&other), "pki_ca.key", &sealed).unwrap_err();
        assert!(matches!(err, BackupError::WrongKey { .. }), "{err}");
        let err = unseal(Some(&key), "pki_sa.key", &sealed).unwrap_err();
        assert!(err.to_string().contains("another name"), "{err}");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x20;
            assert!(
                unseal(Some(&key), "pki_ca.key", &bad).is_err(),
                "flipped byte {i}"
            );
        }
        for cut in 0..sealed.len() {
            assert!(
                unseal(Some(&key), "pki_ca.key", &sealed[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }
}
