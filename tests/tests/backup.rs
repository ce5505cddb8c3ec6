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
use ring_tests::etcd::{etcd_bin, etcdctl_bin, EtcdServer};
use ring_tests::s3::S3Server;
use ring_tests::*;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[path = "backup/bench.rs"]
mod bench;
#[path = "backup/epochs.rs"]
mod epochs;
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
        etcdctl: etcdctl_bin(),
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
/// snapshot (the membership) again: etcd restarted on a log alone waits out
/// a whole election timeout before it serves.
fn assert_starts_with_its_membership(report: &RestoreReport, data_dir: &Path) {
    assert!(report.revisions_from_log > 0, "{report:?}");
    let snap = data_dir.join("member").join("snap");
    let snapshots = std::fs::read_dir(&snap)
        .expect("member/snap")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "snap"))
        .count();
    assert!(snapshots > 0, "no raft snapshot in {}", snap.display());
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
    assert_starts_with_its_membership(&report, &opts.data_dir);

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

/// Etcd compacts the history while the backup's watch is stalled (bucket down,
/// spool full), and again while the backup is not running: each time a new full
/// snapshot starts a new chain and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_during_the_delta_stream_takes_a_new_full_snapshot() {
    let work = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::plain();
    let mut s3 = S3Server::start();
    s3.create_bucket("ring");
    let bucket = s3.bucket_config("ring");
    let mut cfg = config("cmp", &etcd, bucket.clone(), work.path());
    cfg.spool.memory_bytes = 0;
    cfg.spool.max_bytes = 1;
    let mut c = etcd.client().await;
    let mut b = start(cfg.clone());
    let rev1 = write_every_kind(&mut c, "one").await;
    b.wait_durable(rev1).await;

    // The bucket goes away: one delta waits, the watch stops being read.
    s3.stop();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let value = "x".repeat(1024);
                for i in 0..1500 {
                    c.put(format!("/stalled/{w}/{}", i % 400), value.as_str(), None)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let compact_at = revision(&mut c).await;
    c.compact(
        compact_at,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    let rev2 = write_every_kind(&mut c, "two").await;
    s3.restart();
    b.wait_durable(rev2).await;
    b.stop().await;
    let after_stall = catalog_of(&bucket, "cmp").await;
    assert_eq!(
        after_stall.fulls.len(),
        2,
        "the compacted watch led to a new full snapshot: {after_stall:?}"
    );

    // Compaction while no backup runs: the restart notices and starts a new chain.
    let rev3 = write_every_kind(&mut c, "three").await;
    c.compact(rev3, None).await.unwrap();
    let rev4 = write_every_kind(&mut c, "four").await;
    let mut b = start(cfg.clone());
    b.wait_durable(rev4).await;
    b.stop().await;

    let catalog = catalog_of(&bucket, "cmp").await;
    assert_eq!(catalog.fulls.len(), 3, "{catalog:?}");
    let gaps = catalog.gaps();
    assert!(
        gaps.len() >= 2 && gaps.iter().all(|g| g.bridged_by.is_some()),
        "{gaps:?}"
    );

    let opts = restore_opts(
        &bucket,
        "cmp",
        work.path().join("latest"),
        RestoreTarget::Latest,
    );
    restore_exactly(&opts, &mut c, rev4).await;

    // a revision that only the compacted history held: refused, or knowingly skipped
    let in_gap = gaps[gaps.len() - 1].from;
    let opts = restore_opts(
        &bucket,
        "cmp",
        work.path().join("gap"),
        RestoreTarget::Revision(in_gap),
    );
    let err = restore(&opts).await.unwrap_err();
    assert!(matches!(err, BackupError::Gap { .. }), "{err}");
    assert!(err.to_string().contains("--allow-gap"), "{err}");
    let mut opts = opts;
    opts.allow_gap = true;
    let report = restore(&opts).await.expect("restore with --allow-gap");
    assert!(!report.verified && !report.gaps.is_empty(), "{report:?}");

    // verify: every object sound; the bridged gaps are notes, not problems
    let key: Option<&EncryptionKey> = None;
    let v = backup::verify::verify(&Bucket::open(&bucket, "cmp", false).unwrap(), key)
        .await
        .unwrap();
    assert!(v.ok(), "{v:?}");
    assert!(
        v.notes
            .iter()
            .any(|n| n.contains("restores to them are impossible")),
        "{v:?}"
    );

    // gc keeps the newest full snapshot and the deltas after it
    let out = ringctl_backup(
        &[
            "gc",
            "--shoot",
            "cmp",
            "--bucket",
            "s3://ring/backups",
            "--s3-endpoint",
            &s3.endpoint(),
            "--keep-last",
            "1",
        ],
        Some(&s3),
    );
    expect_success(&out);
    let after = catalog_of(&bucket, "cmp").await;
    assert_eq!(after.fulls.len(), 1);
    assert_eq!(after.fulls[0], catalog.fulls[2]);
    assert!(after
        .deltas
        .iter()
        .all(|d| d.first > catalog.fulls[2].first));
    let opts = restore_opts(
        &bucket,
        "cmp",
        work.path().join("after-gc"),
        RestoreTarget::Latest,
    );
    assert_eq!(
        restore(&opts)
            .await
            .expect("restore after gc")
            .reached_revision,
        rev4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_outage_keeps_pending_deltas_on_disk_and_loses_nothing() {
    let work = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::plain();
    let mut s3 = S3Server::start();
    s3.create_bucket("ring");
    let mut cfg = config("out", &etcd, s3.bucket_config("ring"), work.path());
    cfg.spool.memory_bytes = 256; // spill to disk at once
    cfg.schedule.max_backoff_ms = 500;
    let spool = cfg.spool.dir.clone().unwrap();
    let mut c = etcd.client().await;
    let mut b = start(cfg.clone());
    let rev1 = write_every_kind(&mut c, "before").await;
    b.wait_durable(rev1).await;

    s3.stop();
    let mut acked = Vec::new();
    for i in 0..30 {
        acked.push(put(&mut c, &format!("/during/{i}"), "while the bucket is down").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rev2 = write_every_kind(&mut c, "during").await;
    let metrics = b.metrics.clone();
    wait_for("failed uploads and deltas spilled to disk", WAIT, || {
        let text = metrics.encode(backup::now_ms());
        let on_disk = std::fs::read_dir(&spool).map(|d| d.count()).unwrap_or(0);
        let errors = metrics.upload_errors("delta");
        async move {
            (errors > 0 && on_disk > 0 && text.contains("ring_backup_spooled_objects"))
                .then_some(())
        }
    })
    .await;
    assert!(b.progress.borrow().durable_revision < rev2);

    s3.restart();
    b.wait_durable(rev2).await;
    b.stop().await;
    assert_eq!(
        std::fs::read_dir(&spool).unwrap().count(),
        0,
        "the spool drained"
    );

    let opts = restore_opts(
        &s3.bucket_config("ring"),
        "out",
        work.path().join("restored"),
        RestoreTarget::Latest,
    );
    let (_, restored) = restore_exactly(&opts, &mut c, rev2).await;
    for (i, rev) in acked.iter().enumerate() {
        let (_, _, mod_rev, _, _) = restored[format!("/during/{i}").as_bytes()];
        assert_eq!(mod_rev, *rev);
    }

    // pending deltas survive a shutdown while the bucket is down, and go up on the next run
    let mut b = start(cfg.clone());
    b.wait_durable(rev2).await;
    s3.stop();
    let rev3 = write_every_kind(&mut c, "shutdown").await;
    wait_for("a delta spilled to disk", WAIT, || {
        let n = std::fs::read_dir(&spool).map(|d| d.count()).unwrap_or(0);
        async move { (n > 0).then_some(()) }
    })
    .await;
    b.stop().await; // waits up to 10 s for the bucket, then keeps the spool
    assert!(std::fs::read_dir(&spool).unwrap().count() > 0);
    s3.restart();
    let mut b = start(cfg.clone());
    b.wait_durable(rev3).await;
    b.stop().await;
    let catalog = catalog_of(&s3.bucket_config("ring"), "out").await;
    assert_eq!(catalog.latest_revision(), Some(rev3));
    assert!(catalog.gaps().is_empty(), "{:?}", catalog.gaps());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_missing_and_unreachable_backups_are_reported_precisely() {
    let work = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::plain();
    let root = work.path().join("bucket");
    let cfg = config("bad", &etcd, file_bucket(&root), work.path());
    let mut c = etcd.client().await;
    put(&mut c, "/x", "0").await;
    let mut b = start(cfg.clone());
    let mut revs = Vec::new();
    for round in 0..3 {
        let r = write_every_kind(&mut c, &format!("r{round}")).await;
        b.wait_durable(r).await;
        revs.push(r);
    }
    b.stop().await;
    let catalog = catalog_of(&cfg.bucket, "bad").await;
    assert!(catalog.deltas.len() >= 3, "{catalog:?}");
    let shoot_dir = |variant: &str| work.path().join(variant).join("bad");
    let variant = |name: &str| -> (PathBuf, String) {
        let dir = work.path().join(name);
        copy_dir(&root, &dir);
        let url = format!("file://{}", dir.display());
        (dir, url)
    };
    let verify_cli =
        |url: &str| ringctl_backup(&["verify", "--shoot", "bad", "--bucket", url], None);
    let restore_cli = |url: &str, data: &Path, extra: &[&str]| {
        let data = data.display().to_string();
        let mut args = vec![
            "restore",
            "--shoot",
            "bad",
            "--bucket",
            url,
            "--data-dir",
            &data,
        ];
        args.extend_from_slice(extra);
        ringctl_backup(&args, None)
    };

    let latest = |url: &str, data: &str| {
        restore_opts(
            &BucketConfig::url(url),
            "bad",
            work.path().join(data),
            RestoreTarget::Latest,
        )
    };

    // one flipped bit in a delta
    let (_, url) = variant("flipped");
    let victim = &catalog.deltas[1].name;
    flip_middle_byte(&shoot_dir("flipped").join(victim), 0x04);
    let out = verify_cli(&url);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = expect_clean_failure(&out);
    assert!(
        stdout.contains(victim) && stdout.contains("checksum mismatch"),
        "{stdout}"
    );
    assert!(stderr.contains("1 problem(s)"), "{stderr}");
    let opts = latest(&url, "r-flipped");
    let err = restore(&opts).await.unwrap_err();
    assert!(
        matches!(err, BackupError::Corrupt { .. }) && err.to_string().contains(victim.as_str()),
        "{err}"
    );

    // a truncated full snapshot
    let (_, url) = variant("truncated");
    let full = &catalog.fulls[0].name;
    let path = shoot_dir("truncated").join(full);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let out = verify_cli(&url);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    expect_clean_failure(&out);
    assert!(
        stdout.contains(full) && stdout.contains("truncated"),
        "{stdout}"
    );
    let opts = latest(&url, "r-trunc");
    let err = restore(&opts).await.unwrap_err().to_string();
    assert!(
        err.contains(full.as_str()) && err.contains("truncated"),
        "{err}"
    );

    // a missing delta in the chain
    let (_, url) = variant("missing");
    let gone = &catalog.deltas[1];
    std::fs::remove_file(shoot_dir("missing").join(&gone.name)).unwrap();
    let out = verify_cli(&url);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    expect_clean_failure(&out);
    let range = format!("revisions {}..={} are missing", gone.first, gone.last);
    assert!(stdout.contains(&range), "{stdout}");
    let data = work.path().join("r-missing");
    let out = restore_cli(&url, &data, &[]);
    let stderr = expect_clean_failure(&out);
    assert!(
        stderr.contains(&format!(
            "revisions {}..={} are missing",
            gone.first, gone.last
        )) && stderr.contains("--allow-gap"),
        "{stderr}"
    );
    // before the gap still restores exactly; with --allow-gap the rest is applied knowingly
    let before = gone.first - 1;
    let out = restore_cli(&url, &data, &["--revision", &before.to_string()]);
    assert!(expect_success(&out).contains("verified"));
    let data2 = work.path().join("r-missing-2");
    let out = restore_cli(&url, &data2, &["--allow-gap"]);
    assert!(expect_success(&out).contains("NOT exact"));

    // a corrupt newest full snapshot: the restore goes past it to the older
    // one, replays every delta since, and its report names what it skipped
    let (_, url) = variant("fallback");
    let mut newer = cfg.clone();
    newer.bucket = BucketConfig::url(url.clone());
    let snap = backup::snapshot_once(&newer, 0).await.unwrap();
    flip_middle_byte(&shoot_dir("fallback").join(&snap.name), 0x10);
    let opts = latest(&url, "r-fallback");
    let report = restore(&opts).await.unwrap();
    assert_eq!(report.full, catalog.fulls[0].name);
    assert_eq!(report.reached_revision, *revs.last().unwrap());
    assert!(report.verified, "{report:?}");
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    assert_eq!(report.corrupt[0].object, snap.name);
    assert!(
        report.corrupt[0].problem.contains("checksum"),
        "{:?}",
        report.corrupt[0]
    );

    // a bucket that does not exist, and one that does not answer
    let out = ringctl_backup(
        &[
            "list",
            "--shoot",
            "bad",
            "--bucket",
            "file:///nonexistent/ring-bucket",
        ],
        None,
    );
    assert!(expect_clean_failure(&out).contains("does not exist"));
    let s3 = S3Server::start();
    let missing = s3.bucket_config("never-created");
    let err = Bucket::open(&missing, "bad", false)
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert!(matches!(err, BackupError::BucketMissing { .. }), "{err}");
    let mut run_cfg = config("bad", &etcd, missing, work.path());
    run_cfg.spool.dir = Some(work.path().join("spool-missing"));
    let err = tokio::time::timeout(WAIT, backup::run(run_cfg, CancellationToken::new()))
        .await
        .expect("a missing bucket ends the backup")
        .unwrap_err();
    assert!(matches!(err, BackupError::BucketMissing { .. }), "{err}");
    let closed = ring_tests::etcd::free_port();
    let out = ringctl_backup(
        &[
            "list",
            "--shoot",
            "bad",
            "--bucket",
            "s3://ring/backups",
            "--s3-endpoint",
            &format!("http://127.0.0.1:{closed}"),
        ],
        Some(&s3),
    );
    assert!(expect_clean_failure(&out).contains("unreachable"));
}

/// Flips bits `mask` of the middle byte of the file at `path`.
fn flip_middle_byte(path: &Path, mask: u8) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= mask;
    std::fs::write(path, bytes).unwrap();
}

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

/// The whole story on a hosted control plane: `ringctl backup start` against a
/// running shoot, writes through the API, a restore into a new seed's data dir,
/// a control plane started on it, and kubectl reading the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosted_control_plane_is_backed_up_and_restored_into_a_new_seed() {
    use seed::{wait_ready, ControlPlaneSpec, Seed};
    let sandbox = Sandbox::new();
    let state = sandbox.path().join("seed-a");
    let seed_a = seed::LocalSeed::new(&state, binaries());
    let spec = ControlPlaneSpec::new("bk-shoot");
    seed_a.start(&spec).await.expect("start");
    wait_ready(&seed_a, "bk-shoot", Duration::from_secs(120))
        .await
        .expect("ready");
    let kubeconfig = seed_a.layout("bk-shoot").admin_kubeconfig();
    kubectl(&kubeconfig, &["create", "namespace", "team-a"]);
    // Creates a ConfigMap; returns its resourceVersion (etcd's revision of the write).
    let create = |name: &str, value: &str| -> i64 {
        let literal = format!("--from-literal=v={value}");
        let args = [
            "-n",
            "team-a",
            "create",
            "configmap",
            name,
            literal.as_str(),
        ];
        let rv = kubectl(
            &kubeconfig,
            &[&args[..], &["-o", "jsonpath={.metadata.resourceVersion}"]].concat(),
        );
        rv.trim().parse().expect("resourceVersion")
    };
    create("before", "full");

    let bucket = format!("file://{}", sandbox.path().join("bucket").display());
    let log = std::fs::File::create(sandbox.path().join("backup.log")).unwrap();
    let mut backup = std::process::Command::new(ringctl())
        .args([
            "backup", "start", "--shoot", "bk-shoot", "--bucket", &bucket,
        ])
        .args(["--delta-period-ms", "200"])
        .arg("--state-dir")
        .arg(&state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("ringctl backup start");
    for i in 0..5 {
        create(&format!("after-{i}"), &format!("delta-{i}"));
    }
    kubectl(
        &kubeconfig,
        &["-n", "team-a", "delete", "configmap", "after-0"],
    );
    let rv = create("last", "last");
    let list = || {
        ringctl_backup(
            &[
                "list", "--shoot", "bk-shoot", "--bucket", &bucket, "-o", "json",
            ],
            None,
        )
    };
    wait_for("the last write in the bucket", WAIT, || {
        let out = list();
        async move {
            let c: backup::Catalog = serde_json::from_slice(&out.stdout).ok()?;
            (c.latest_revision()? >= rv && !c.fulls.is_empty()).then_some(())
        }
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(backup.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for("ringctl backup start to exit", WAIT, || {
        let s = backup.try_wait().ok().flatten();
        async move { s }
    })
    .await;
    assert!(
        status.success(),
        "ringctl backup start exited with {status}"
    );
    seed_a.stop("bk-shoot").await.expect("stop");

    // A new seed gets the shoot's spec and PKI, and etcd data from the bucket alone.
    let state_b = sandbox.path().join("seed-b");
    let shoot_b = state_b.join("shoots/bk-shoot");
    copy_dir(
        &seed_a.layout("bk-shoot").dir.join("pki"),
        &shoot_b.join("pki"),
    );
    std::fs::copy(
        seed_a.layout("bk-shoot").spec_file(),
        shoot_b.join("shoot.json"),
    )
    .unwrap();
    let data_b = shoot_b.join("etcd").display().to_string();
    let state_b_arg = state_b.display().to_string();
    let restore_b = || {
        ringctl_backup(
            &[
                "restore",
                "--shoot",
                "bk-shoot",
                "--bucket",
                &bucket,
                "--data-dir",
                &data_b,
                "--state-dir",
                &state_b_arg,
            ],
            None,
        )
    };
    let text = expect_success(&restore_b());
    assert!(text.contains("verified"), "{text}");
    // a second restore into the same (now filled) data dir is refused
    let out = restore_b();
    assert!(expect_clean_failure(&out).contains("not empty"));

    let seed_b = seed::LocalSeed::new(&state_b, binaries());
    seed_b
        .start(&spec)
        .await
        .expect("start on the restored data");
    wait_ready(&seed_b, "bk-shoot", Duration::from_secs(120))
        .await
        .expect("ready");
    let kc_b = seed_b.layout("bk-shoot").admin_kubeconfig();
    let names = kubectl(
        &kc_b,
        &[
            "-n",
            "team-a",
            "get",
            "configmaps",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.data.v} {end}",
        ],
    );
    for want in [
        "before=full",
        "after-1=delta-1",
        "after-4=delta-4",
        "last=last",
    ] {
        assert!(names.contains(want), "{want} missing from {names}");
    }
    assert!(
        !names.contains("after-0="),
        "a deleted object came back: {names}"
    );
    let rv_b: i64 = kubectl(
        &kc_b,
        &[
            "-n",
            "team-a",
            "get",
            "configmap",
            "last",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    )
    .trim()
    .parse()
    .unwrap();
    assert_eq!(rv_b, rv, "resourceVersions are etcd's own revisions");
    seed_b.stop("bk-shoot").await.expect("stop");
}

/// Set for the helper process of
/// [`a_temporary_etcd_dies_with_the_process_that_started_it`]: its dir.
const TEMP_ETCD_HELPER: &str = "RING_TEST_TEMP_ETCD_DIR";

/// The helper process's body, run by the test below as this test binary
/// (ignored on its own): starts a temporary etcd in the given dir, says so,
/// and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of a_temporary_etcd_dies_with_the_process_that_started_it"]
async fn temp_etcd_helper_process() {
    let dir = PathBuf::from(std::env::var(TEMP_ETCD_HELPER).expect("run by the test below"));
    let _etcd = TempEtcd::start(&etcd_bin(), &dir.join("data"), "t", &dir.join("etcd.log"))
        .await
        .expect("temporary etcd");
    println!("etcd ready");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// A restore killed with -9 (ringctl, ringd, an init container) takes its
/// temporary etcd with it: nothing else would ever stop that etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_etcd_dies_with_the_process_that_started_it() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("temp-etcd");
    std::fs::create_dir_all(&dir).unwrap();
    let mut helper = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "temp_etcd_helper_process",
            "--ignored",
            "--nocapture",
        ])
        .env(TEMP_ETCD_HELPER, &dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("helper process");
    let data = dir.join("data");
    wait_for("the helper's temporary etcd", WAIT, || async {
        (!processes_mentioning(&data).is_empty()).then_some(())
    })
    .await;
    helper.start_kill().unwrap();
    helper.wait().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut left = processes_mentioning(&data);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = processes_mentioning(&data);
    }
    for pid in &left {
        // SAFETY: plain kill(2) of a pid this test's helper started
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "etcd {left:?} outlived the process that started it by 10 s"
    );
}

/// A restore's temporary etcd talks only TLS with its own client
/// certificate: a plain client, or a TLS client without the certificate,
/// gets nothing; its throwaway PKI is private and gone once it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_etcd_answers_only_clients_with_its_certificate() {
    use std::os::unix::fs::PermissionsExt;
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("temp-etcd");
    std::fs::create_dir_all(&dir).unwrap();
    let mut etcd = TempEtcd::start(&etcd_bin(), &dir.join("data"), "t", &dir.join("etcd.log"))
        .await
        .expect("temporary etcd");
    let mut c = etcd.client().await.expect("client with the certificate");
    c.put("k", "v", None)
        .await
        .expect("a write with the certificate");

    let port = etcd.url.rsplit(':').next().unwrap().to_string();
    let plain = backup::config::EtcdConfig::plain(format!("http://127.0.0.1:{port}"));
    let mut anonymous = etcd.config();
    anonymous.cert_file = None;
    anonymous.key_file = None;
    for (what, config) in [("plain", plain), ("no client certificate", anonymous)] {
        let answered = match backup::etcd::connect(&config).await {
            Ok(mut c) => tokio::time::timeout(Duration::from_secs(5), c.get("k", None))
                .await
                .is_ok_and(|r| r.is_ok()),
            Err(_) => false,
        };
        assert!(!answered, "the temporary etcd answered a {what} client");
    }

    let ca = etcd.config().ca_file.unwrap();
    let tls_dir = ca.parent().unwrap().to_path_buf();
    let mode = std::fs::metadata(&tls_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", tls_dir.display());
    etcd.stop().await;
    drop(etcd);
    assert!(!tls_dir.exists(), "{} left behind", tls_dir.display());
}
