//! A bucket written before the move to etcd 3.7 restores into etcd 3.7.
//!
//! The fixture `fixtures/etcd-3.4/` was made with etcd 3.4.23 and etcdctl
//! 3.4.23 (Debian's `etcd-server` and `etcd-client` 3.4.23-4+b4, unpacked,
//! not installed) and `ringctl` built from Ring's commit cf72815 (the backup
//! format of the etcd 3.4 stack): a one-member etcd 3.4 (member `old34`,
//! plain HTTP on loopback) got puts, an overwrite, a delete and a leased key;
//! `ringctl backup start --shoot old34 --bucket file://... --key-file
//! backup.key --key-id fixture-key --delta-period-ms 200` took its full
//! snapshot (revision 25, etcd 3.4's database); then etcdctl 3.4 wrote every
//! kind of event (puts, overwrites, a put of a leased key, a delete by
//! prefix, a transaction of two puts and a delete, a second lease with its
//! key, a delete and re-create, a 3000-byte value) as four deltas up to
//! revision 47, and `ringctl backup` was stopped (SIGTERM). `expected.json`
//! is what etcd 3.4 answered afterwards: `etcdctl get "" --prefix -w json` at
//! revisions 42 and 47 (keys, values, create and mod revisions, versions,
//! leases) and `etcdctl endpoint hashkv --rev=47`. `backup.key` is the test
//! key the objects are sealed with (AES-256-GCM).

use super::*;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/backup/fixtures/etcd-3.4")
}

/// What etcd 3.4 held at `revision`, as [`Dump`].
fn expected(revision: i64) -> Dump {
    let text = std::fs::read_to_string(fixture().join("expected.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let kvs = doc["revisions"][revision.to_string()]
        .as_array()
        .unwrap_or_else(|| panic!("expected.json has no revision {revision}"));
    let int = |kv: &serde_json::Value, f: &str| kv[f].as_i64().unwrap();
    let text = |kv: &serde_json::Value, f: &str| kv[f].as_str().unwrap().as_bytes().to_vec();
    kvs.iter()
        .map(|kv| {
            let fields = (
                text(kv, "value"),
                int(kv, "createRevision"),
                int(kv, "modRevision"),
                int(kv, "version"),
                int(kv, "lease"),
            );
            (text(kv, "key"), fields)
        })
        .collect()
}

fn expected_hash_kv() -> (i64, u32) {
    let text = std::fs::read_to_string(fixture().join("expected.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let h = &doc["hashKv"];
    let hash = h["hash"].as_u64().and_then(|x| u32::try_from(x).ok());
    (h["revision"].as_i64().unwrap(), hash.unwrap())
}

/// Restores the fixture's bucket (a copy) to `target` under `dir`.
fn restore_old(dir: &Path, name: &str, target: RestoreTarget) -> RestoreOptions {
    let bucket_dir = dir.join("bucket");
    if !bucket_dir.exists() {
        copy_dir(&fixture().join("bucket"), &bucket_dir);
    }
    let mut opts = restore_opts(&file_bucket(&bucket_dir), "old34", dir.join(name), target);
    opts.key = Some(
        EncryptionKey::load(&EncryptionConfig {
            key_file: Some(fixture().join("backup.key")),
            key_env: None,
            key_id: Some("fixture-key".into()),
        })
        .expect("the fixture's key"),
    );
    opts
}

/// The newest revision and one inside a delta come back exactly as etcd 3.4
/// had them (every key's value, revisions, version and lease), etcd 3.7
/// applied the replayed revisions from its own log, and its `HashKV` is
/// etcd 3.4's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_of_etcd_3_4_restores_exactly_into_this_etcd() {
    let work = tempfile::tempdir().unwrap();
    let opts = restore_old(work.path(), "latest", RestoreTarget::Latest);
    let report = restore(&opts)
        .await
        .expect("restore of the etcd 3.4 bucket");
    assert!(report.verified, "{report:?}");
    assert_eq!(
        (report.full_revision, report.reached_revision),
        (25, 47),
        "{report:?}"
    );
    assert!(
        report.hash_kv.starts_with("equal at revision"),
        "{report:?}"
    );
    assert_eq!(
        report.revisions_from_log, report.revisions_replayed,
        "{report:?}"
    );
    assert_snapshot_past_the_replayed_log(&report, &opts.data_dir);

    let log = work.path().join("latest.log");
    let mut etcd = TempEtcd::start(&etcd_bin(), &opts.data_dir, "old34", &log)
        .await
        .expect("etcd on the restored data");
    let mut client = etcd.client().await.expect("client");
    assert_eq!(revision(&mut client).await, 47);
    assert_eq!(dump(&mut client, 0).await, expected(47));
    let (at, hash) = expected_hash_kv();
    let restored = client.hash_kv(at).await.expect("HashKV").hash();
    assert_eq!(restored, hash, "HashKV at {at}: etcd 3.4 had {hash:#x}");
    etcd.stop().await;

    let mid = restore_old(work.path(), "mid", RestoreTarget::Revision(42));
    let report = restore(&mid).await.expect("restore to revision 42");
    assert!(
        report.verified && report.reached_revision == 42,
        "{report:?}"
    );
    let (restored, rev) = dump_restored(&mid.data_dir, "old34").await;
    assert_eq!(rev, 42);
    assert_eq!(restored, expected(42));
}
