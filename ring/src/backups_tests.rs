//! Tests of [`super`] (backups.rs).
use super::*;
use backup::config::EncryptionConfig;
use std::path::Path;

fn key_config(dir: &Path, name: &str, byte: u8) -> EncryptionConfig {
    let path = dir.join(name);
    std::fs::write(&path, backup::codec::hex(&[byte; 32])).unwrap();
    EncryptionConfig {
        key_file: Some(path),
        ..Default::default()
    }
}

fn shoot_files(dir: &Path) -> ShootLayout {
    let layout = ShootLayout {
        dir: dir.join("shoots/s1"),
    };
    std::fs::create_dir_all(layout.dir.join("pki")).unwrap();
    std::fs::write(layout.spec_file(), b"{\"shoot\":\"s1\"}").unwrap();
    std::fs::write(
        layout.dir.join("pki/ca.key"),
        b"-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    layout
}

/// The shoot's identity objects in a `file://` bucket, by path, with their bytes.
fn stored(bucket: &Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(bucket.join("s1/identity"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            (p.display().to_string(), bytes)
        })
        .collect()
}

#[tokio::test]
async fn a_sealed_identity_opens_only_with_the_rings_key() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket_dir = tmp.path().join("bucket");
    let url = BucketConfig::url(format!("file://{}", bucket_dir.display()));
    let sealed =
        RingBucket::new(url.clone(), Some(key_config(tmp.path(), "key", 1)), "test").unwrap();
    let layout = shoot_files(tmp.path());
    upload_identity(&sealed, &layout, "s1").await.unwrap();

    let objects = stored(&bucket_dir);
    assert_eq!(
        objects.len(),
        2,
        "{:?}",
        objects.iter().map(|o| &o.0).collect::<Vec<_>>()
    );
    for (path, bytes) in &objects {
        assert!(path.ends_with(".aesgcm"), "{path}");
        assert!(
            !bytes
                .windows(7)
                .any(|w| w == b"PRIVATE" || w == b"\"shoot\""),
            "{path} holds plain text"
        );
    }

    // the same key restores the files byte for byte
    let back = ShootLayout {
        dir: tmp.path().join("restored"),
    };
    download_identity(&sealed, &back, "s1").await.unwrap();
    for rel in ["shoot.json", "pki/ca.key"] {
        assert_eq!(
            std::fs::read(back.dir.join(rel)).unwrap(),
            std::fs::read(layout.dir.join(rel)).unwrap(),
            "{rel}"
        );
    }

    // no key, or another key: a config error naming the field, nothing written
    let elsewhere = ShootLayout {
        dir: tmp.path().join("elsewhere"),
    };
    let plain = RingBucket::new(url.clone(), None, "backup.encryption").unwrap();
    let err = download_identity(&plain, &elsewhere, "s1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RingError::Config { field, reason } if field == "backup.encryption" && reason.contains("is sealed with key id") && reason.contains("set backup.encryption")),
        "{err}"
    );
    let other = RingBucket::new(
        url.clone(),
        Some(key_config(tmp.path(), "other", 2)),
        "test",
    )
    .unwrap();
    let err = download_identity(&other, &elsewhere, "s1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RingError::Config { reason, .. } if reason.contains("use the key the backup was written with")),
        "{err}"
    );
    assert!(!elsewhere.dir.join("pki/ca.key").exists());

    // turning encryption off (or on) replaces the other form: one copy per file
    upload_identity(&plain, &layout, "s1").await.unwrap();
    let objects = stored(&bucket_dir);
    assert_eq!(objects.len(), 2);
    assert!(objects.iter().all(|(p, _)| !p.ends_with(".aesgcm")));
    // with a key, the plain objects are refused (anyone able to write
    // to the bucket could have put them there)
    let err = download_identity(&sealed, &elsewhere, "s1")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RingError::Backup(backup::BackupError::Untrusted { problem, .. }) if problem.contains("not sealed")),
        "{err}"
    );
    upload_identity(&sealed, &layout, "s1").await.unwrap();
    assert!(stored(&bucket_dir)
        .iter()
        .all(|(p, _)| p.ends_with(".aesgcm")));

    // s1's sealed identity copied into s2's prefix does not open as s2's
    let (from, to) = (bucket_dir.join("s1"), bucket_dir.join("s2"));
    std::fs::create_dir_all(to.join("identity")).unwrap();
    for e in std::fs::read_dir(from.join("identity")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join("identity").join(e.file_name())).unwrap();
    }
    let err = download_identity(&sealed, &elsewhere, "s2")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RingError::Backup(backup::BackupError::Untrusted { problem, .. }) if problem.contains("sealed for shoot s1, not s2")),
        "{err}"
    );
    assert!(!elsewhere.dir.join("pki/ca.key").exists());
}

#[test]
fn an_unreadable_key_is_a_config_error_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("short"), "abcd").unwrap();
    let err = RingBucket::new(
        BucketConfig::url("file:///nowhere"),
        Some(EncryptionConfig {
            key_file: Some(tmp.path().join("short")),
            ..Default::default()
        }),
        "backup.encryption",
    )
    .unwrap_err();
    assert!(
        matches!(&err, RingError::Config { field, reason } if field == "backup.encryption" && reason.contains("32 bytes")),
        "{err}"
    );
}

#[test]
fn a_run_of_failures_is_warned_about_at_its_start_then_every_30s() {
    let t0 = std::time::Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut streak = Streak::default();
    assert_eq!(streak.ended(), None, "no run yet");
    let warned: Vec<Option<u32>> = (0..65).map(|s| streak.failed(at(s))).collect();
    let due: Vec<(usize, u32)> = warned
        .iter()
        .enumerate()
        .filter_map(|(s, w)| w.map(|c| (s, c)))
        .collect();
    assert_eq!(due, vec![(0, 1), (30, 31), (60, 61)]);
    let (count, _) = streak.ended().expect("a run ended");
    assert_eq!(count, 65);
    assert_eq!(streak.failed(at(66)), Some(1), "a new run warns at once");
}
