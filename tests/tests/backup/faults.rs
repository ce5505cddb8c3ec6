//! Faults during a continuous backup: etcd compacting under a stalled
//! watch, a bucket outage, and damaged, missing or unreachable backups.

use super::*;

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
    // the operator moves it and every later delta aside: the same restore
    // run again plans from what the bucket holds now, rather than resuming a
    // plan that names objects no longer there, and reaches the last revision
    // before the damage
    for d in &catalog.deltas[1..] {
        let aside = work.path().join(format!("aside-{}", d.name));
        std::fs::rename(shoot_dir("flipped").join(&d.name), aside).unwrap();
    }
    let report = restore(&opts).await.unwrap();
    assert_eq!(
        report.reached_revision, catalog.deltas[0].last,
        "{report:?}"
    );
    assert!(report.verified, "{report:?}");

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
