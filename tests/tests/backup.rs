//! Continuous etcd backups to object storage and verified restores, against
//! real etcd processes, a real S3-compatible server (s3s-fs) and a real hosted
//! control plane.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use backup::catalog::rfc3339;
use backup::codec::EncryptionKey;
use backup::config::EncryptionConfig;
use backup::etcd::{Member, TempEtcd};
use backup::restore::{RestoreOptions, RestoreReport, RestoreTarget};
use backup::{BackupConfig, BackupError, Bucket, BucketConfig, Progress};
use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use ring_tests::etcd::{etcd_bin, etcdutl_bin, EtcdServer};
use ring_tests::s3::S3Server;
use ring_tests::*;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[path = "backup/bench.rs"]
mod bench;
#[path = "backup/epochs.rs"]
mod epochs;
#[path = "backup/faults.rs"]
mod faults;
#[path = "backup/hosted.rs"]
mod hosted;
#[path = "backup/old_bucket.rs"]
mod old_bucket;
#[path = "backup/standby.rs"]
mod standby;

const WAIT: Duration = Duration::from_secs(60);

/// key -> (value, create revision, mod revision, version, lease)
type Dump = BTreeMap<Vec<u8>, (Vec<u8>, i64, i64, i64, i64)>;

async fn dump(client: &mut Client, revision: i64) -> Dump {
    let mut opts = GetOptions::new().with_all_keys();
    if revision > 0 {
        opts = opts.with_revision(revision);
    }
    let resp = client.get(vec![0u8], Some(opts)).await.expect("range");
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                (
                    kv.value().to_vec(),
                    kv.create_revision(),
                    kv.mod_revision(),
                    kv.version(),
                    kv.lease(),
                ),
            )
        })
        .collect()
}

async fn revision(client: &mut Client) -> i64 {
    client
        .status()
        .await
        .expect("status")
        .header()
        .map_or(0, |h| h.revision())
}

async fn put(client: &mut Client, key: &str, value: &str) -> i64 {
    client
        .put(key, value, None)
        .await
        .expect("put")
        .header()
        .map_or(0, |h| h.revision())
}

/// A running continuous backup.
struct Running {
    task: JoinHandle<backup::Result<()>>,
    stop: CancellationToken,
    progress: watch::Receiver<Progress>,
    metrics: backup::metrics::Metrics,
}

fn start(config: BackupConfig) -> Running {
    start_in_epoch(config, 0)
}

/// A backup writing as the host of ring epoch `epoch` (0: outside a ring).
fn start_in_epoch(config: BackupConfig, epoch: u64) -> Running {
    // RUST_LOG=backup=debug shows what the backup does.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let b = backup::Backup::new(config)
        .expect("backup config")
        .with_epoch(epoch);
    let (progress, metrics) = (b.progress(), b.metrics());
    let stop = CancellationToken::new();
    let task = tokio::spawn(b.run(stop.clone()));
    Running {
        task,
        stop,
        progress,
        metrics,
    }
}

impl Running {
    async fn wait_durable(&mut self, rev: i64) {
        let progress = self.progress.clone();
        wait_for(&format!("revision {rev} in the bucket"), WAIT, || {
            let p = progress.borrow().clone();
            async move { (p.durable_revision >= rev).then_some(()) }
        })
        .await;
    }

    async fn stop(self) {
        self.stop.cancel();
        let r = tokio::time::timeout(WAIT, self.task)
            .await
            .expect("backup stops within a minute")
            .expect("backup task");
        r.expect("backup ends without error");
    }
}

fn file_bucket(dir: &Path) -> BucketConfig {
    BucketConfig::url(format!("file://{}", dir.display()))
}

fn config(shoot: &str, etcd: &EtcdServer, bucket: BucketConfig, work: &Path) -> BackupConfig {
    let mut c = BackupConfig::new(shoot, etcd.config(), bucket);
    c.schedule.delta_period_ms = 150;
    c.spool.dir = Some(work.join(format!("spool-{shoot}")));
    c
}

fn restore_opts(
    bucket: &BucketConfig,
    shoot: &str,
    data_dir: PathBuf,
    target: RestoreTarget,
) -> RestoreOptions {
    RestoreOptions {
        bucket: Bucket::open(bucket, shoot, false).expect("bucket"),
        key: None,
        data_dir,
        target,
        allow_gap: false,
        member: Member {
            name: shoot.into(),
            peer_url: "http://127.0.0.1:2380".into(),
            cluster_token: format!("ring-{shoot}"),
        },
        etcd: etcd_bin(),
        etcdutl: etcdutl_bin(),
        work_dir: None,
        count_objects: false,
    }
}

async fn restore(opts: &RestoreOptions) -> backup::Result<RestoreReport> {
    backup::restore::restore(
        opts,
        &|line| eprintln!("restore: {line}"),
        &CancellationToken::new(),
    )
    .await
}

/// Starts etcd on a restored data dir and dumps it.
async fn dump_restored(data_dir: &Path, name: &str) -> (Dump, i64) {
    let log = data_dir.with_extension("log");
    let mut e = TempEtcd::start(&etcd_bin(), data_dir, name, &log)
        .await
        .expect("etcd on the restored data");
    let mut c = e.client().await.expect("client");
    let d = dump(&mut c, 0).await;
    let rev = revision(&mut c).await;
    e.stop().await;
    (d, rev)
}

/// Checks the etcd restored into `data_dir` equals the source at `revision`
/// (keys, values, create and mod revisions, versions, leases); returns it.
async fn assert_restored(data_dir: &Path, name: &str, source: &mut Client, revision: i64) -> Dump {
    let (restored, rev) = dump_restored(data_dir, name).await;
    assert_eq!(rev, revision, "the restored etcd's revision");
    assert_eq!(
        restored,
        dump(source, revision).await,
        "the restored etcd differs from the source at revision {revision}"
    );
    restored
}

/// Restores with `opts` (verified, to `revision`) and compares with the source.
async fn restore_exactly(
    opts: &RestoreOptions,
    source: &mut Client,
    revision: i64,
) -> (RestoreReport, Dump) {
    let report = restore(opts)
        .await
        .unwrap_or_else(|e| panic!("restore to {:?}: {e}", opts.target));
    assert!(report.verified, "{report:?}");
    assert_eq!(report.reached_revision, revision, "{report:?}");
    let restored = assert_restored(&opts.data_dir, &opts.member.name, source, revision).await;
    (report, restored)
}

/// The restore counted the objects and took `HashKV` at `revision` as the
/// source has them there.
async fn assert_counted_like_the_source(
    report: &RestoreReport,
    source: &mut Client,
    revision: i64,
) {
    let objects = backup::objects::count_objects(source, revision)
        .await
        .expect("counting the source's objects");
    assert_eq!(report.objects.as_ref(), Some(&objects), "{report:?}");
    let hash = source
        .hash_kv(revision)
        .await
        .expect("source HashKV")
        .hash();
    assert_eq!(report.hash_kv_at_reached, Some(hash), "{report:?}");
}

/// Revisions went to etcd's log, and the restored data holds a raft
/// snapshot past them: etcd reads every entry after its newest snapshot
/// whenever it starts, so the etcd that serves the data reads none of the
/// replayed ones again.
fn assert_snapshot_past_the_replayed_log(report: &RestoreReport, data_dir: &Path) {
    assert!(report.revisions_from_log > 0, "{report:?}");
    let snap = data_dir.join("member").join("snap");
    // raft snapshot files are named <term>-<index>.snap, in hex
    let newest = std::fs::read_dir(&snap)
        .expect("member/snap")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| {
            let (_, index) = n.strip_suffix(".snap")?.split_once('-')?;
            u64::from_str_radix(index, 16).ok()
        })
        .max();
    // etcdutl's membership entry, then at least one entry per revision
    let past = 1 + report.revisions_from_log;
    assert!(
        newest.is_some_and(|i| i >= past),
        "the newest raft snapshot in {} is at {newest:?}, before the log's end (>= {past})",
        snap.display()
    );
}

/// The shoot's catalog, from the bucket listing.
async fn catalog_of(bucket: &BucketConfig, shoot: &str) -> backup::Catalog {
    Bucket::open(bucket, shoot, false)
        .expect("bucket")
        .catalog()
        .await
        .expect("catalog")
}

fn cli_env(s3: Option<&S3Server>) -> Vec<(&'static str, String)> {
    s3.map(S3Server::env).unwrap_or_default()
}

fn ringctl_backup(args: &[&str], s3: Option<&S3Server>) -> std::process::Output {
    let env = cli_env(s3);
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, OsStr::new(v))).collect();
    let mut all = vec!["backup"];
    all.extend_from_slice(args);
    ringctl_cmd(all, &env)
}

/// Puts, overwrites, deletes (single and by prefix), a multi-key transaction and
/// keys with a lease: every kind of event.
async fn write_every_kind(c: &mut Client, tag: &str) -> i64 {
    for i in 0..40 {
        put(c, &format!("/{tag}/k/{i:02}"), &format!("v{i}")).await;
    }
    for i in (0..40).step_by(3) {
        put(c, &format!("/{tag}/k/{i:02}"), &format!("w{i}")).await;
    }
    c.delete(format!("/{tag}/k/05"), None)
        .await
        .expect("delete");
    c.delete(
        format!("/{tag}/k/1"),
        Some(DeleteOptions::new().with_prefix()),
    )
    .await
    .expect("delete prefix");
    let txn = Txn::new()
        .when([Compare::version(
            format!("/{tag}/k/20"),
            CompareOp::Greater,
            0,
        )])
        .and_then([
            TxnOp::put(format!("/{tag}/txn/a"), "1", None),
            TxnOp::put(format!("/{tag}/txn/b"), "2", None),
            TxnOp::delete(format!("/{tag}/k/21"), None),
        ]);
    c.txn(txn).await.expect("txn");
    let lease = c.lease_grant(600, None).await.expect("lease").id();
    c.put(
        format!("/{tag}/leased"),
        "l",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .expect("leased put");
    revision(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_and_deltas_round_trip_through_s3_with_tls_and_encryption() {
    let work = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::tls();
    let s3 = S3Server::start();
    s3.create_bucket("ring");
    let key_file = work.path().join("backup.key");
    std::fs::write(&key_file, "11".repeat(32)).unwrap();
    let mut cfg = config("rt", &etcd, s3.bucket_config("ring"), work.path());
    cfg.encryption = Some(EncryptionConfig {
        key_file: Some(key_file.clone()),
        key_env: None,
        key_id: Some("test-key".into()),
    });
    let mut c = etcd.client().await;
    for i in 0..30 {
        put(&mut c, &format!("/base/{i}"), "secret-base-value").await;
    }
    let mut b = start(cfg.clone());
    let base = revision(&mut c).await;
    b.wait_durable(base).await;
    let last = write_every_kind(&mut c, "d").await;
    b.wait_durable(last).await;
    assert!(b
        .metrics
        .encode(backup::now_ms())
        .contains("ring_backup_durable_revision{shoot=\"rt\"}"));
    b.stop().await;

    let catalog = catalog_of(&cfg.bucket, "rt").await;
    assert_eq!(catalog.fulls.len(), 1, "{catalog:?}");
    assert!(!catalog.deltas.is_empty(), "{catalog:?}");
    assert!(catalog
        .entries()
        .all(|e| e.encrypted && e.name.ends_with(".zst.aesgcm")));
    assert_eq!(catalog.latest_revision(), Some(last));
    // the writer checked etcd's own hash of the database, so a restore
    // need not hash it again
    let key = EncryptionKey::load(cfg.encryption.as_ref().unwrap()).unwrap();
    let full = &catalog.fulls[0].name;
    let bytes = Bucket::open(&cfg.bucket, "rt", false)
        .unwrap()
        .get_all(full)
        .await
        .unwrap();
    let (decoded, _) = backup::codec::decode(full, "rt", &bytes, Some(&key)).unwrap();
    assert!(decoded.header.full.unwrap().db_hash_checked, "{full}");
    // nothing readable at rest
    for (name, _) in Bucket::open(&cfg.bucket, "rt", false)
        .unwrap()
        .list()
        .await
        .unwrap()
    {
        let raw = std::fs::read(s3.bucket_dir("ring").join("backups/rt").join(&name)).unwrap();
        assert!(
            !raw.windows(17).any(|w| w == b"secret-base-value"),
            "{name} holds plaintext"
        );
    }

    let mut opts = restore_opts(
        &cfg.bucket,
        "rt",
        work.path().join("restored"),
        RestoreTarget::Latest,
    );
    opts.key = Some(key);
    let (report, _) = restore_exactly(&opts, &mut c, last).await;
    assert!(
        report.hash_kv.starts_with("equal at revision"),
        "{report:?}"
    );
    // etcd applied every revision (puts, overwrites, deletes, leased keys)
    // from its own log, and the result is exactly the source's
    assert!(report.revisions_replayed > 0, "{report:?}");
    assert_eq!(
        report.revisions_from_log, report.revisions_replayed,
        "{report:?}"
    );
    assert_snapshot_past_the_replayed_log(&report, &opts.data_dir);

    // A wrong key and a missing key are named, never garbage.
    let mut wrong = restore_opts(
        &cfg.bucket,
        "rt",
        work.path().join("wrong"),
        RestoreTarget::Latest,
    );
    wrong.key = Some(EncryptionKey::new([9; 32], Some("other-key".into())));
    let err = restore(&wrong).await.unwrap_err();
    assert!(matches!(err, BackupError::WrongKey { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("test-key") && msg.contains("other-key"),
        "{msg}"
    );
    let none = restore_opts(
        &cfg.bucket,
        "rt",
        work.path().join("nokey"),
        RestoreTarget::Latest,
    );
    let err = restore(&none).await.unwrap_err();
    assert!(matches!(err, BackupError::KeyRequired { .. }), "{err}");

    // the CLI verifies the same bucket (credentials from the environment)
    let key_arg = key_file.display().to_string();
    let out = ringctl_backup(
        &[
            "verify",
            "--shoot",
            "rt",
            "--bucket",
            "s3://ring/backups",
            "--s3-endpoint",
            &s3.endpoint(),
            "--key-file",
            &key_arg,
        ],
        Some(&s3),
    );
    let text = expect_success(&out);
    assert!(text.contains("are sound"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn point_in_time_restore_by_revision_and_by_time() {
    let work = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::plain();
    let bucket = file_bucket(&work.path().join("bucket"));
    let cfg = config("pit", &etcd, bucket.clone(), work.path());
    let mut c = etcd.client().await;
    put(&mut c, "/a/seed", "0").await;
    let mut b = start(cfg.clone());
    let rev_a = write_every_kind(&mut c, "a").await;
    b.wait_durable(rev_a).await;
    let t_a = backup::now_ms();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..20 {
        put(&mut c, &format!("/a/k/{i:02}"), "changed-later").await;
    }
    c.delete("/a/txn/a", None).await.unwrap();
    let rev_b = write_every_kind(&mut c, "b").await;
    b.wait_durable(rev_b).await;
    b.stop().await;

    // by revision, through the CLI
    let dir = work.path().join("by-rev");
    let out = ringctl_backup(
        &[
            "restore",
            "--shoot",
            "pit",
            "--bucket",
            &bucket.url,
            "--data-dir",
            &dir.display().to_string(),
            "--revision",
            &rev_a.to_string(),
            "-o",
            "json",
        ],
        None,
    );
    let report: serde_json::Value =
        serde_json::from_str(&expect_success(&out)).expect("json report");
    assert_eq!(report["reachedRevision"], rev_a);
    assert_eq!(report["verified"], true);
    assert_restored(&dir, "pit", &mut c, rev_a).await;

    // in the middle of a delta, counting the objects and taking HashKV in
    // the restore's own etcd
    let mid = rev_a + 7;
    let mut opts = restore_opts(
        &bucket,
        "pit",
        work.path().join("mid"),
        RestoreTarget::Revision(mid),
    );
    opts.count_objects = true;
    let (report, _) = restore_exactly(&opts, &mut c, mid).await;
    assert_counted_like_the_source(&report, &mut c, mid).await;

    // by time: everything received up to t_a
    let opts = restore_opts(
        &bucket,
        "pit",
        work.path().join("by-time"),
        RestoreTarget::Time(t_a),
    );
    eprintln!("restoring to the time {}", rfc3339(t_a));
    restore_exactly(&opts, &mut c, rev_a).await;

    // beyond the backup, and before it
    let opts = restore_opts(
        &bucket,
        "pit",
        work.path().join("future"),
        RestoreTarget::Revision(rev_b + 100),
    );
    let err = restore(&opts).await.unwrap_err().to_string();
    assert!(err.contains("newer than anything backed up"), "{err}");
    let opts = restore_opts(
        &bucket,
        "pit",
        work.path().join("past"),
        RestoreTarget::Time(t_a - 3_600_000),
    );
    let err = restore(&opts).await.unwrap_err().to_string();
    assert!(err.contains("older than the oldest backup"), "{err}");
    // a data dir that is not fresh is refused
    let opts = restore_opts(&bucket, "pit", dir.clone(), RestoreTarget::Latest);
    let err = restore(&opts).await.unwrap_err().to_string();
    assert!(err.contains("not empty"), "{err}");
}

/// Copies the tree `from` into `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
