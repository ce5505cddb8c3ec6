//! Reading an object incrementally, checking it as it arrives.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use super::key::{aad, nonce_for};
use super::{
    hex, EncryptionKey, Header, Trailer, FORMAT, FRAME_DATA, FRAME_END, FRAME_LAST, MAGIC,
    MAX_FRAME, MAX_META,
};
use crate::checksum::TailHasher;
use crate::{BackupError, Result};

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
    /// The shoot whose prefix the object is read from: its header must name it.
    shoot: String,
    key: Option<EncryptionKey>,
    stage: Stage,
    buf: Vec<u8>,
    /// SHA-256 of every byte fed but the last 32 (held back: they may be the
    /// checksum); the object's checksum when the read ends well.
    whole: TailHasher,
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
    /// A reader of the object `name` (for messages) of `shoot`, with the key
    /// if one is configured. With a key, an object that is not encrypted is
    /// refused; an object whose header names another shoot always is.
    pub fn new(name: &str, shoot: &str, key: Option<&EncryptionKey>) -> Self {
        ObjectReader {
            name: name.to_string(),
            shoot: shoot.to_string(),
            key: key.cloned(),
            stage: Stage::Magic,
            buf: Vec::new(),
            whole: TailHasher::here(),
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

    /// The same, computing the object's checksum on a thread of its own
    /// beside the decryption, decompression and whatever takes the plain
    /// bytes (for a large full snapshot).
    pub fn hashing_on_a_thread(mut self) -> Self {
        self.whole = TailHasher::on_a_thread();
        self
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
        self.whole.update(data);
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
                self.stage = Stage::HeaderLen;
            }
            Stage::HeaderLen => {
                let n = u32::from_be_bytes([unit[0], unit[1], unit[2], unit[3]]) as usize;
                if n == 0 || n > MAX_META {
                    return Err(self.corrupt(format!("header length {n} is impossible")));
                }
                self.stage = Stage::Header(n);
            }
            Stage::Header(_) => {
                let header: Header = serde_json::from_slice(unit)
                    .map_err(|e| self.corrupt(format!("unreadable header: {e}")))?;
                self.header_digest = crate::checksum::Sha256::digest(unit);
                self.start(&header)?;
                self.header = Some(header);
                self.stage = Stage::FrameHead;
            }
            Stage::FrameHead => {
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

    /// The epoch in the object's name must be the one its header records
    /// (authenticated when sealed): a renamed object cannot join or leave an
    /// epoch's history.
    fn check_epoch(&self, h: &Header) -> Result<()> {
        let named = crate::catalog::parse_name(&self.name, 0).map(|e| e.epoch);
        match named {
            Some(epoch) if epoch != h.epoch => Err(BackupError::untrusted(
                &self.name,
                format!(
                    "its name says epoch {epoch}, but it was written at epoch {} (renamed?)",
                    h.epoch
                ),
            )),
            _ => Ok(()),
        }
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
        self.check_epoch(h)?;
        if h.shoot != self.shoot {
            return Err(BackupError::untrusted(
                &self.name,
                format!(
                    "it was written for shoot {}, not {} (copied from another shoot's prefix?)",
                    h.shoot, self.shoot
                ),
            ));
        }
        match (&h.encryption, &self.key) {
            (Some(enc), key) => self.cipher = Some(enc.open(key.as_ref(), &self.name)?),
            (None, Some(key)) => {
                return Err(BackupError::untrusted(
                    &self.name,
                    format!(
                        "it is not encrypted, but the bucket's key {} is configured: anyone who can write to the bucket could have put it there (remove it, or restore without the key if the backup was written unencrypted)",
                        key.id
                    ),
                ))
            }
            (None, None) => {}
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
        let summed = self.whole.finish(&self.name)?;
        let (computed, tail_matches) = (summed.digest, summed.tail_is_digest());
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
        // every byte before the checksum went into `whole`, and the
        // checksum is the last 32 bytes (anything after it failed the read)
        if computed[..] != recorded[..] {
            return Err(BackupError::corrupt(
                &self.name,
                format!(
                    "checksum mismatch: sha256 recorded {}, computed {}: the object is corrupted",
                    hex(&recorded),
                    hex(&computed)
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
pub fn decode(
    name: &str,
    shoot: &str,
    bytes: &[u8],
    key: Option<&EncryptionKey>,
) -> Result<(Decoded, Vec<u8>)> {
    let mut r = ObjectReader::new(name, shoot, key);
    let mut plain = Vec::new();
    r.feed(bytes, &mut |b| {
        plain.extend_from_slice(b);
        Ok(())
    })?;
    Ok((r.finish()?, plain))
}
