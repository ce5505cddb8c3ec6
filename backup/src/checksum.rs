//! SHA-256 of a stream whose last 32 bytes may be the checksum of the rest:
//! a backup object's own checksum ([`crate::codec::ObjectReader`]) and
//! etcd's at the end of a snapshot database ([`DbHash`]). Either is computed
//! where the bytes are read or, for a large download, on a thread of its own
//! beside the decompression and the writing ([`TailHasher::on_a_thread`]).
//!
//! etcd's hash is checked where a full snapshot is written (an object is
//! finished only when it matched, and its header says so) and, for objects
//! that do not say so, where one is downloaded.

use crate::{BackupError, Result};

/// SHA-256 of a stream, by `ring`'s assembly: faster than the `sha2` crate
/// on a core without SHA instructions, and an object's checksum is on the
/// critical path of every download and upload of a full snapshot
/// (`ringctl bench restore` shows the download rate).
#[derive(Clone)]
pub struct Sha256(ring::digest::Context);

impl Default for Sha256 {
    fn default() -> Self {
        Sha256(ring::digest::Context::new(&ring::digest::SHA256))
    }
}

impl Sha256 {
    /// Adds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest of `data` alone.
    pub fn digest(data: &[u8]) -> [u8; 32] {
        let mut h = Self::default();
        h.update(data);
        h.finalize()
    }

    /// The digest of everything added.
    pub fn finalize(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        out
    }
}

/// What a [`TailHash`] found: the SHA-256 of every byte but the last 32,
/// and those 32 (fewer when the stream was shorter).
pub struct Summed {
    pub digest: [u8; 32],
    pub tail: Vec<u8>,
    /// Every byte fed, the tail included.
    pub bytes: u64,
}

impl Summed {
    /// Whether the last 32 bytes are the SHA-256 of the rest.
    pub fn tail_is_digest(&self) -> bool {
        self.tail.len() == 32 && self.tail[..] == self.digest[..]
    }
}

/// SHA-256 of every byte fed but the last 32 seen so far, held back (they
/// may be the checksum that ends the stream).
#[derive(Default, Clone)]
pub struct TailHash {
    hasher: Sha256,
    tail: Vec<u8>,
    bytes: u64,
}

impl TailHash {
    /// Adds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        if data.len() >= 32 {
            self.hasher.update(&self.tail[..]);
            let cut = data.len() - 32;
            self.hasher.update(&data[..cut]);
            self.tail.clear();
            self.tail.extend_from_slice(&data[cut..]);
        } else {
            self.tail.extend_from_slice(data);
            if self.tail.len() > 32 {
                let cut = self.tail.len() - 32;
                self.hasher.update(&self.tail[..cut]);
                self.tail.drain(..cut);
            }
        }
    }

    /// The hash of what was fed but the last 32 bytes, and those.
    pub fn finish(self) -> Summed {
        Summed {
            digest: self.hasher.finalize(),
            tail: self.tail,
            bytes: self.bytes,
        }
    }
}

/// A [`TailHash`] where the bytes are read, or on a thread of its own.
pub enum TailHasher {
    Here(Box<TailHash>),
    Thread {
        chunks: std::sync::mpsc::SyncSender<Vec<u8>>,
        thread: std::thread::JoinHandle<TailHash>,
    },
}

impl TailHasher {
    /// Hashes where the bytes are read.
    pub fn here() -> Self {
        TailHasher::Here(Box::default())
    }

    /// Hashes on a thread of its own: on a core without SHA instructions
    /// SHA-256 takes about as long as the rest of a download's work.
    pub fn on_a_thread() -> Self {
        let (chunks, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(16);
        let thread = std::thread::spawn(move || {
            let mut h = TailHash::default();
            for chunk in rx {
                h.update(&chunk);
            }
            h
        });
        TailHasher::Thread { chunks, thread }
    }

    /// Adds the next bytes (on a thread: waits while 16 chunks are queued).
    pub fn update(&mut self, data: &[u8]) {
        match self {
            TailHasher::Here(h) => h.update(data),
            // the thread ends only when `chunks` is dropped (in `finish`)
            TailHasher::Thread { chunks, .. } => {
                let _ = chunks.send(data.to_vec());
            }
        }
    }

    /// What was hashed ([`TailHash::finish`]); `what` names the stream for
    /// the error of a thread that died.
    pub fn finish(self, what: &str) -> Result<Summed> {
        match self {
            TailHasher::Here(h) => Ok((*h).finish()),
            TailHasher::Thread { chunks, thread } => {
                drop(chunks);
                let h = thread.join().map_err(|_| BackupError::Io {
                    what: format!("hashing {what}"),
                    source: std::io::Error::other("the hashing thread panicked"),
                })?;
                Ok(h.finish())
            }
        }
    }
}

/// Checks etcd's own SHA-256 at the end of a snapshot database.
#[derive(Default)]
pub struct DbHash(TailHash);

impl DbHash {
    /// Adds plain bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// Whether the last 32 bytes are the SHA-256 of the rest (etcd appends
    /// it); the database's size.
    pub fn check(self, object: &str) -> Result<u64> {
        check_db(self.0.finish(), object)
    }
}

/// Whether a database `summed` ends with etcd's SHA-256 of it; its size.
pub fn check_db(summed: Summed, object: &str) -> Result<u64> {
    if !summed.tail_is_digest() {
        return Err(BackupError::corrupt(
            object,
            "etcd's own checksum at the end of the snapshot does not match its data",
        ));
    }
    Ok(summed.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

    /// The same digest as the `sha2` crate's, for lengths around its blocks.
    #[test]
    fn the_digest_is_sha256() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 13 % 256) as u8).collect();
        for n in [0, 1, 55, 56, 63, 64, 65, 128, 300] {
            let mut h = Sha256::default();
            let (a, b) = data[..n].split_at(n / 3);
            h.update(a);
            h.update(b);
            let want: [u8; 32] = sha2::Sha256::digest(&data[..n]).into();
            assert_eq!(h.finalize(), want, "{n} bytes");
        }
    }

    #[test]
    fn etcd_db_hash_is_checked() {
        let data = b"some database bytes".to_vec();
        let mut with_hash = data.clone();
        with_hash.extend_from_slice(&sha2::Sha256::digest(&data));
        let mut h = DbHash::default();
        for piece in with_hash.chunks(5) {
            h.update(piece);
        }
        assert_eq!(h.check("o").unwrap(), with_hash.len() as u64);
        let mut bad = DbHash::default();
        bad.update(&data);
        assert!(bad.check("o").is_err());
    }

    /// Pieces shorter and longer than the 32 bytes held back, in any mix,
    /// hash the same as the data at once.
    #[test]
    fn pieces_of_any_size_hash_like_the_whole() {
        let data: Vec<u8> = (0..2_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut with_hash = data.clone();
        with_hash.extend_from_slice(&sha2::Sha256::digest(&data));
        for sizes in [
            &[1usize][..],
            &[5, 40, 3, 100, 31, 32, 33],
            &[2_032],
            &[31, 1, 64],
        ] {
            let mut h = DbHash::default();
            let (mut at, mut i) = (0, 0);
            while at < with_hash.len() {
                let n = sizes[i % sizes.len()].min(with_hash.len() - at);
                h.update(&with_hash[at..at + n]);
                (at, i) = (at + n, i + 1);
            }
            assert_eq!(h.check("o").unwrap(), with_hash.len() as u64, "{sizes:?}");
        }
    }
}
