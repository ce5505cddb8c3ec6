//! Backups of a shoot whose host changed: the old host, fenced but still
//! running, keeps uploading objects of its epoch; the new host's epoch
//! begins its own history and nothing the old one wrote after that joins it.

use super::*;

/// Puts `n` keys `<prefix>/<i>` and returns the revision after the last.
async fn put_n(c: &mut Client, prefix: &str, n: usize) -> i64 {
    let mut rev = 0;
    for i in 0..n {
        rev = put(c, &format!("{prefix}/{i:02}"), "v").await;
    }
    rev
}

/// Keys under `prefix` in a dump.
fn count(d: &Dump, prefix: &str) -> usize {
    d.keys()
        .filter(|k| k.starts_with(prefix.as_bytes()))
        .count()
}

/// Epoch 1's host (etcd A) is replaced by epoch 2's (etcd B, restored from
/// the bucket), but A is not dead: it keeps taking writes and its backup
/// keeps uploading, before B's backup starts and after. B's backup begins
/// epoch 2 with its own full snapshot (it does not resume from A's late
/// deltas, which reach revisions B also writes, differently); the catalog
/// sets A's late objects aside; a restore of the newest revision is B's
/// history only; A's backup, started again, finds epoch 2 and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_hosts_late_uploads_never_join_the_new_epochs_history() {
    let work = tempfile::tempdir().unwrap();
    let bucket = file_bucket(&work.path().join("bucket"));
    let etcd_a = EtcdServer::plain();
    let cfg_a = config("fork", &etcd_a, bucket.clone(), work.path());
    let mut a_client = etcd_a.client().await;
    let mut a = start_in_epoch(cfg_a.clone(), 1);
    let r1 = put_n(&mut a_client, "/old", 10).await;
    a.wait_durable(r1).await;

    // the failover: epoch 2's host restores the newest revision
    let b_dir = work.path().join("b");
    let opts = restore_opts(&bucket, "fork", b_dir.clone(), RestoreTarget::Latest);
    let report = restore(&opts).await.expect("restore for epoch 2");
    assert_eq!(report.reached_revision, r1, "{report:?}");

    // the fenced host goes on: writes and uploads past the restore point
    let fork = put_n(&mut a_client, "/fork", 10).await;
    a.wait_durable(fork).await;

    // only now the new host serves and backs up
    let log = work.path().join("b.log");
    let mut etcd_b = TempEtcd::start(&etcd_bin(), &b_dir, "fork", &log)
        .await
        .expect("etcd B on the restored data");
    let mut b_client = etcd_b.client().await.expect("client of B");
    let mut cfg_b = BackupConfig::new("fork", etcd_b.config(), bucket.clone());
    cfg_b.schedule.delta_period_ms = 150;
    cfg_b.spool.dir = Some(work.path().join("spool-b"));
    let mut b = start_in_epoch(cfg_b, 2);
    // its first object, a full snapshot of the restored data (writes before
    // it would land in that snapshot, moving epoch 2's start past r1)
    b.wait_durable(r1).await;
    let new = put_n(&mut b_client, "/new", 15).await;
    b.wait_durable(new).await;
    // and the fenced host still uploads after epoch 2's first objects
    let fork2 = put_n(&mut a_client, "/fork2", 10).await;
    a.wait_durable(fork2).await;

    let catalog = catalog_of(&bucket, "fork").await;
    let start_2 = catalog.epoch_start(2).expect("epoch 2 wrote objects");
    assert_eq!(
        start_2, r1,
        "epoch 2 begins with a full snapshot of what it restored"
    );
    assert!(
        catalog.superseded.len() >= 2,
        "A's late deltas are set aside: {catalog:?}"
    );
    for s in &catalog.superseded {
        assert_eq!(
            (s.entry.epoch, s.by_epoch, s.from_revision),
            (1, 2, r1),
            "{s:?}"
        );
        assert!(s.entry.last > r1, "{s:?}");
    }
    assert!(catalog.entries().all(|e| e.epoch == 2 || e.last <= r1));
    assert_eq!(catalog.latest_revision(), Some(new));

    // the newest history is B's: restored exactly, none of A's late writes
    let opts = restore_opts(
        &bucket,
        "fork",
        work.path().join("c"),
        RestoreTarget::Latest,
    );
    let (_, restored) = restore_exactly(&opts, &mut b_client, new).await;
    assert_eq!(
        (
            count(&restored, "/old"),
            count(&restored, "/new"),
            count(&restored, "/fork")
        ),
        (10, 15, 0)
    );

    // what `ringctl backup list` shows: the epochs, and why A's late objects are not used
    let out = ringctl_backup(&["list", "--shoot", "fork", "--bucket", &bucket.url], None);
    let text = expect_success(&out);
    assert!(text.contains("EPOCH"), "{text}");
    let reason = format!("epoch 2 began at revision {r1}: a fenced host's late upload");
    assert!(
        text.contains("superseded (never restored): delta-"),
        "{text}"
    );
    assert!(text.contains(&reason), "{text}");

    // A's backup, started again, sees epoch 2 and stops for good
    a.stop().await;
    let a2 = start_in_epoch(cfg_a, 1);
    let ended = tokio::time::timeout(WAIT, a2.task)
        .await
        .expect("a stale backup stops by itself")
        .expect("backup task");
    match ended {
        Err(e @ BackupError::Superseded { .. }) => {
            assert!(!e.is_retryable());
            let text = e.to_string();
            assert!(
                text.contains("epoch 2 of shoot fork began at revision"),
                "{text}"
            );
        }
        other => panic!("want a superseded backup, got {other:?}"),
    }
    b.stop().await;
    etcd_b.stop().await;
}

/// The new host serves (and takes writes) before its backup's first full
/// snapshot, so that snapshot's base is past the revision it restored; the
/// fenced host's late deltas in between would pass for history. The
/// failover records where epoch 2 began before the new host serves: the
/// fork is set aside, a restore to a revision inside it is refused as a gap
/// naming the revisions (not answered with the fenced host's writes), and
/// restores up to the beginning and of the newest revision hold the right
/// history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_never_reads_a_fork_between_an_epoch_s_beginning_and_its_first_full_snapshot() {
    let work = tempfile::tempdir().unwrap();
    let bucket = file_bucket(&work.path().join("bucket"));
    let etcd_a = EtcdServer::plain();
    let cfg_a = config("gap", &etcd_a, bucket.clone(), work.path());
    let mut a_client = etcd_a.client().await;
    let mut a = start_in_epoch(cfg_a, 1);
    let r1 = put_n(&mut a_client, "/old", 10).await;
    a.wait_durable(r1).await;

    // the failover restores, then records where epoch 2 begins
    let b_dir = work.path().join("b");
    let opts = restore_opts(&bucket, "gap", b_dir.clone(), RestoreTarget::Latest);
    let report = restore(&opts).await.expect("restore for epoch 2");
    assert_eq!(report.reached_revision, r1, "{report:?}");
    let name = opts
        .bucket
        .record_epoch_begin(None, 2, r1)
        .await
        .expect("recording epoch 2's beginning");

    // the fenced host writes and uploads past it (fewer revisions than the
    // new host serves before its first full snapshot)
    let fork = put_n(&mut a_client, "/fork", 3).await;
    a.wait_durable(fork).await;
    a.stop().await;

    // the new host serves writes before its backup starts
    let log = work.path().join("b.log");
    let mut etcd_b = TempEtcd::start(&etcd_bin(), &b_dir, "gap", &log)
        .await
        .expect("etcd B on the restored data");
    let mut b_client = etcd_b.client().await.expect("client of B");
    let served = put_n(&mut b_client, "/served", 5).await;
    assert!(
        served > fork,
        "the fork ends before epoch 2's first full snapshot"
    );
    let mut cfg_b = BackupConfig::new("gap", etcd_b.config(), bucket.clone());
    cfg_b.schedule.delta_period_ms = 150;
    cfg_b.spool.dir = Some(work.path().join("spool-b"));
    let mut b = start_in_epoch(cfg_b, 2);
    b.wait_durable(served).await;

    let catalog = catalog_of(&bucket, "gap").await;
    let first_full_2 = catalog
        .fulls
        .iter()
        .find(|f| f.epoch == 2)
        .expect("epoch 2's full");
    assert!(first_full_2.first >= served, "{first_full_2:?}");
    assert_eq!(catalog.epoch_start(2), Some(r1), "{catalog:?}");
    assert!(catalog.begins.iter().any(|b| b.name == name), "{catalog:?}");
    assert!(!catalog.superseded.is_empty(), "{catalog:?}");
    assert!(
        catalog.entries().all(|e| e.epoch == 2 || e.last <= r1),
        "{catalog:?}"
    );

    let out = ringctl_backup(&["list", "--shoot", "gap", "--bucket", &bucket.url], None);
    let text = expect_success(&out);
    let begun = format!("epochs recorded as begun: 2 at revision {r1}");
    assert!(text.contains(&begun), "{text}");
    let out = ringctl_backup(&["verify", "--shoot", "gap", "--bucket", &bucket.url], None);
    let text = expect_success(&out);
    let opened = format!("epoch 2 began at revision {r1} (begin-");
    assert!(text.contains(&opened), "{text}");
    restores_never_read_the_fork(&bucket, work.path(), &mut b_client, r1, served).await;
    b.stop().await;
    etcd_b.stop().await;
}

/// Restores of `shoot` "gap" from `bucket` whose epoch 2 began at `r1` and
/// reached `served` (B's history, read through `b_client`): one inside the
/// fenced host's fork is a gap naming its revisions; one to `r1` and one of
/// the newest hold B's history only.
async fn restores_never_read_the_fork(
    bucket: &BucketConfig,
    work: &Path,
    b_client: &mut Client,
    r1: i64,
    served: i64,
) {
    // inside the fork: a gap, naming the revisions
    let inside = r1 + 2;
    let c_dir = work.join("c");
    let opts = restore_opts(bucket, "gap", c_dir, RestoreTarget::Revision(inside));
    match restore(&opts).await {
        Err(BackupError::Gap { from, to, .. }) => assert_eq!((from, to), (r1 + 1, inside)),
        other => panic!("a restore to {inside} must be a gap, got {other:?}"),
    }
    // up to the beginning, and the newest: the new host's history only
    let opts = restore_opts(bucket, "gap", work.join("d"), RestoreTarget::Revision(r1));
    let (_, at_begin) = restore_exactly(&opts, b_client, r1).await;
    assert_eq!(
        (count(&at_begin, "/old"), count(&at_begin, "/fork")),
        (10, 0)
    );
    let opts = restore_opts(bucket, "gap", work.join("e"), RestoreTarget::Latest);
    let (_, newest) = restore_exactly(&opts, b_client, served).await;
    assert_eq!(
        (
            count(&newest, "/old"),
            count(&newest, "/served"),
            count(&newest, "/fork")
        ),
        (10, 5, 0)
    );
}
