//! Encryption: keys, the per-chunk nonce and associated data of objects, and
//! whole-object seals of small files.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;

use super::{EncryptionHeader, MAX_META};
use crate::checksum::Sha256;
use crate::config::EncryptionConfig;
use crate::{BackupError, Result};

impl EncryptionHeader {
    /// A header for a new object sealed with `key`, with a fresh random base nonce.
    pub(super) fn new(key: &EncryptionKey) -> (Self, [u8; 12]) {
        let nonce: [u8; 12] = rand::random();
        let header = EncryptionHeader {
            algorithm: "aes-256-gcm".into(),
            key_id: key.id.clone(),
            key_check: key.check.clone(),
            nonce: hex(&nonce),
            owner: None,
        };
        (header, nonce)
    }

    /// The cipher and base nonce that open `object`: no key, or another key than
    /// the one it was sealed with, is said as such (not as corruption).
    pub(super) fn open(
        &self,
        key: Option<&EncryptionKey>,
        object: &str,
    ) -> Result<(Aes256Gcm, [u8; 12])> {
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
        let mut h = Sha256::default();
        h.update(b"ring-backup key check\0");
        h.update(&key);
        let check = hex(&h.finalize()[..8]);
        EncryptionKey {
            key,
            id: id.unwrap_or_else(|| check.clone()),
            check,
        }
    }

    /// A new random key (a cryptographically secure generator seeded by the OS).
    pub fn generate() -> Self {
        EncryptionKey::new(rand::random(), None)
    }

    /// The key as 64 hex digits (to hand it to a process that loads it with [`parse`](Self::parse)).
    pub fn to_hex(&self) -> String {
        hex(&self.key)
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

    pub(super) fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(&self.key.into())
    }
}

pub(super) fn nonce_for(base: &[u8; 12], index: u64) -> [u8; 12] {
    let mut n = *base;
    for (i, b) in index.to_be_bytes().iter().enumerate() {
        n[4 + i] ^= b;
    }
    n
}

pub(super) fn aad(header_digest: &[u8; 32], index: u64, last: bool) -> [u8; 41] {
    let mut a = [0u8; 41];
    a[..32].copy_from_slice(header_digest);
    a[32..40].copy_from_slice(&index.to_be_bytes());
    a[40] = u8::from(last);
    a
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

/// Encrypts a small object of `shoot` whole (its spec or a PKI file) with
/// AES-256-GCM. The object's `name` and the header, which names the shoot,
/// are authenticated with it, so a sealed object cannot be passed off under
/// another name or as another shoot's. Layout: `RINGSEAL`, header length
/// (u32 BE), JSON [`EncryptionHeader`], ciphertext with its tag.
pub fn seal(key: &EncryptionKey, shoot: &str, name: &str, plain: &[u8]) -> Result<Vec<u8>> {
    let (mut header, nonce) = EncryptionHeader::new(key);
    header.owner = Some(shoot.to_string());
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

/// Opens what [`seal`] wrote for the same `shoot` under the same `name`: a
/// missing or wrong key, another shoot's object, and anything damaged or
/// renamed, is an error saying which.
pub fn unseal(
    key: Option<&EncryptionKey>,
    shoot: &str,
    name: &str,
    bytes: &[u8],
) -> Result<Vec<u8>> {
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
    match header.owner.as_deref() {
        Some(s) if s == shoot => {}
        Some(other) => {
            return Err(BackupError::untrusted(
                name,
                format!("it was sealed for shoot {other}, not {shoot} (copied from another shoot's prefix?)"),
            ))
        }
        None => {
            return Err(BackupError::untrusted(
                name,
                format!("it was sealed by an older Ring without naming its shoot; serve shoot {shoot} once with this Ring to seal it again"),
            ))
        }
    }
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
