//! Writing an object incrementally, in bounded memory.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use super::key::{aad, nonce_for};
use super::{
    hex, EncryptionHeader, EncryptionKey, Header, Trailer, CHUNK, FORMAT, FRAME_DATA, FRAME_END,
    FRAME_LAST, MAGIC,
};
use crate::checksum::Sha256;
use crate::{BackupError, Result};

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
        let header_digest = Sha256::digest(&json);
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
            hasher: Default::default(),
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
