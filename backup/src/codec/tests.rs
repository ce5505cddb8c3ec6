use base64::Engine;

use super::*;
use crate::BackupError;

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
        epoch: 0,
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
            let (d, plain) = decode("o", "s", &obj, k.as_ref()).unwrap();
            assert_eq!(plain, data, "level {level}, key {k:?}");
            assert_eq!(d.sha256, sha);
            assert_eq!(d.header.delta.as_ref().unwrap().last_revision, 9);
            assert_eq!(d.header.encryption.is_some(), k.is_some());
            assert_eq!(d.trailer.plain_bytes, data.len() as u64);
        }
    }
    let (obj, _) = encode(header(), b"", 3, None, Trailer::default()).unwrap();
    assert!(decode("o", "s", &obj, None).unwrap().1.is_empty());
}

#[test]
fn fed_in_small_pieces_gives_the_same() {
    let data = body(CHUNK + 7);
    let k = key(2);
    let (obj, _) = encode(header(), &data, 3, Some(&k), Trailer::default()).unwrap();
    let mut r = ObjectReader::new("o", "s", Some(&k));
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
            let err = decode("o", "s", &bad, k.as_ref()).err();
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
    let err = decode("o", "s", &obj, None).unwrap_err().to_string();
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
            let Err(err) = decode("o", "s", &bad, None) else {
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
        let err = decode("o", "s", &obj[..cut], None).unwrap_err().to_string();
        assert!(err.contains("truncated"), "cut at {cut}: {err}");
    }
}

#[test]
fn wrong_or_missing_key_is_named() {
    let (obj, _) = encode(header(), b"secret", 3, Some(&key(4)), Trailer::default()).unwrap();
    let err = decode("o", "s", &obj, Some(&key(5))).unwrap_err();
    assert!(matches!(err, BackupError::WrongKey { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("k4") && msg.contains("k5"), "{msg}");
    let err = decode("o", "s", &obj, None).unwrap_err();
    assert!(matches!(err, BackupError::KeyRequired { .. }), "{err}");
    // the same key under another name still decrypts
    let same = EncryptionKey::new([4; 32], Some("renamed".into()));
    assert_eq!(decode("o", "s", &obj, Some(&same)).unwrap().1, b"secret");
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
    let sealed = seal(&key, "s", "pki_ca.key", plain).unwrap();
    assert!(!sealed.windows(7).any(|w| w == b"PRIVATE"));
    assert_eq!(
        unseal(Some(&key), "s", "pki_ca.key", &sealed).unwrap(),
        plain
    );
    let err = unseal(None, "s", "pki_ca.key", &sealed).unwrap_err();
    assert!(
        matches!(err, BackupError::KeyRequired { ref key_id, .. } if key_id == "k1"),
        "{err}"
    );
    let err = unseal(Some(&other), "s", "pki_ca.key", &sealed).unwrap_err();
    assert!(matches!(err, BackupError::WrongKey { .. }), "{err}");
    let err = unseal(Some(&key), "s", "pki_sa.key", &sealed).unwrap_err();
    assert!(err.to_string().contains("another name"), "{err}");
    for i in 0..sealed.len() {
        let mut bad = sealed.clone();
        bad[i] ^= 0x20;
        assert!(
            unseal(Some(&key), "s", "pki_ca.key", &bad).is_err(),
            "flipped byte {i}"
        );
    }
    for cut in 0..sealed.len() {
        assert!(
            unseal(Some(&key), "s", "pki_ca.key", &sealed[..cut]).is_err(),
            "cut at {cut}"
        );
    }
}

/// With a key configured, an object without encryption is refused (anyone
/// who can write to the bucket could have made it); an object whose header
/// names another shoot is refused with or without a key. Editing the shoot in
/// an encrypted object's header breaks its authentication.
#[test]
fn plain_objects_under_a_key_and_other_shoots_objects_are_refused() {
    let (plain, _) = encode(header(), b"data", 3, None, Trailer::default()).unwrap();
    let err = decode("o", "s", &plain, Some(&key(1))).unwrap_err();
    assert!(matches!(err, BackupError::Untrusted { .. }), "{err}");
    assert!(err.to_string().contains("not encrypted"), "{err}");
    assert_eq!(decode("o", "s", &plain, None).unwrap().1, b"data");

    let (sealed, _) = encode(header(), b"data", 3, Some(&key(1)), Trailer::default()).unwrap();
    for k in [None, Some(key(1))] {
        let obj = if k.is_some() { &sealed } else { &plain };
        let err = decode("o", "t", obj, k.as_ref()).unwrap_err();
        assert!(matches!(err, BackupError::Untrusted { .. }), "{err}");
        assert!(
            err.to_string().contains("written for shoot s, not t"),
            "{err}"
        );
    }
    // the header says shoot "t" now (same length, the outer checksum made
    // right again): the chunks no longer authenticate
    let mut edited = sealed.clone();
    let at = edited
        .windows(11)
        .position(|w| w == b"\"shoot\":\"s\"")
        .unwrap();
    edited[at + 9] = b't';
    let n = edited.len() - 32;
    let sum = <sha2::Sha256 as sha2::Digest>::digest(&edited[..n]);
    edited[n..].copy_from_slice(&sum);
    let err = decode("o", "t", &edited, Some(&key(1))).unwrap_err();
    assert!(matches!(err, BackupError::Corrupt { .. }), "{err}");
}

/// A seal names its shoot: another shoot's seal, and one from before seals
/// named their shoot, are refused with what to do.
#[test]
fn sealed_objects_open_only_as_their_shoot_s() {
    let key = key(7);
    let sealed = seal(&key, "s", "pki_ca.key", b"ca").unwrap();
    let err = unseal(Some(&key), "t", "pki_ca.key", &sealed).unwrap_err();
    assert!(matches!(err, BackupError::Untrusted { .. }), "{err}");
    assert!(
        err.to_string().contains("sealed for shoot s, not t"),
        "{err}"
    );

    // a seal as Ring wrote it before: no shoot in its header
    let field = b",\"owner\":\"s\"";
    let at = sealed
        .windows(field.len())
        .position(|w| w == field)
        .unwrap();
    let mut old = sealed[..at].to_vec();
    old.extend_from_slice(&sealed[at + field.len()..]);
    let len = u32::from_be_bytes(old[8..12].try_into().unwrap()) - field.len() as u32;
    old[8..12].copy_from_slice(&len.to_be_bytes());
    let err = unseal(Some(&key), "s", "pki_ca.key", &old).unwrap_err();
    assert!(err.to_string().contains("older Ring"), "{err}");
}

/// An object keeps the epoch it was written at: read under a name that
/// claims another epoch (or none), it is refused as renamed.
#[test]
fn an_object_renamed_into_another_epoch_is_refused() {
    use crate::catalog::{object_name_in_epoch, Kind as K};
    let mut h = header();
    h.epoch = 3;
    let key = key(2);
    let (obj, _) = encode(h, &body(100), 1, Some(&key), Trailer::default()).unwrap();
    let named = |epoch| object_name_in_epoch(epoch, K::Delta, 2, 9, 1_700_000_000_000, true, true);
    assert!(decode(&named(3), "s", &obj, Some(&key)).is_ok());
    for epoch in [4, 0] {
        let err = decode(&named(epoch), "s", &obj, Some(&key)).unwrap_err();
        assert!(matches!(err, BackupError::Untrusted { .. }), "{err}");
        assert!(
            err.to_string().contains(&format!(
                "its name says epoch {epoch}, but it was written at epoch 3"
            )),
            "{err}"
        );
    }
}
