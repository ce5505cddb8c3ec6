//! The three figures, each next to its reference measured on the same data.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, PutOptions};

use super::tools::{
    fill, measure, ring_restore, ringctl_etcd_flags, snapshot_save_cmd, start_backup, start_etcd,
    value, wait_durable,
};
use super::{median, percentile, BenchOptions, BenchResult};
use crate::etcd::{self, TempEtcd};
use crate::{now_ms, BackupError, Result};

/// Figure 1: a full snapshot of a large database, Ring against `etcdctl snapshot save`.
pub(super) async fn snapshot(opts: &BenchOptions, r: &mut BenchResult) -> Result<()> {
    let dir = opts.dir.join("snapshot");
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let mut client = e.client().await?;
    eprintln!("bench backup: filling etcd to {} MiB ...", opts.db_mib);
    (r.db_mib, r.db_keys) = fill_to(&mut client, &e.url, opts.db_mib).await?;
    let (mut ring_t, mut ctl_t, mut ring_rss, mut ctl_rss) = (vec![], vec![], 0f64, 0f64);
    for run in 0..opts.runs {
        eprintln!(
            "bench backup: full snapshot run {}/{} ...",
            run + 1,
            opts.runs
        );
        let out = dir.join("etcdctl.db");
        let _ = std::fs::remove_file(&out);
        let (t, rss, _) = measure(snapshot_save_cmd(&e, &out)?).await?;
        ctl_t.push(t);
        ctl_rss = ctl_rss.max(rss);
        let _ = std::fs::remove_file(&out);

        let bucket = dir.join("bucket");
        let _ = std::fs::remove_dir_all(&bucket);
        let mut cmd = Command::new(&opts.ringctl);
        cmd.args(["backup", "snapshot", "--shoot", "bench", "-o", "json"])
            .args(ringctl_etcd_flags(&e))
            .arg(format!("--bucket=file://{}", bucket.display()));
        let (t, rss, stdout) = measure(cmd).await?;
        ring_t.push(t);
        ring_rss = ring_rss.max(rss);
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&stdout) {
            r.snapshot_stored_mib = v["storedBytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64;
        }
    }
    r.snapshot_ring_secs = median(ring_t);
    r.snapshot_etcdctl_secs = median(ctl_t);
    r.snapshot_speed_ratio = r.snapshot_etcdctl_secs / r.snapshot_ring_secs.max(1e-9);
    r.snapshot_ring_rss_mib = ring_rss;
    r.snapshot_etcdctl_rss_mib = ctl_rss;
    e.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Fills etcd with 4 KiB values until its database holds `mib` MiB; returns
/// its size in MiB and the keys written.
pub(super) async fn fill_to(client: &mut Client, url: &str, mib: u64) -> Result<(f64, u64)> {
    let len = 4096usize;
    let mut keys = 0u64;
    while (etcd::status(client, url).await?.db_size as u64) < mib << 20 {
        let step = ((mib << 20) / len as u64 / 8).clamp(1000, 20_000);
        fill(client, keys, step, len, 32).await?;
        keys += step;
    }
    let status = etcd::status(client, url).await?;
    Ok((status.db_size as f64 / (1 << 20) as f64, keys))
}

/// Figure 2: a restore of a full snapshot plus many delta events, Ring
/// against `etcdutl snapshot restore` of the same final data.
pub(super) async fn restore(opts: &BenchOptions, r: &mut BenchResult) -> Result<()> {
    let dir = opts.dir.join("restore");
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let client = e.client().await?;
    let base_keys = 20_000u64;
    fill(&client, 0, base_keys, 1024, 32).await?;
    r.restore_base_keys = base_keys;
    let bucket = dir.join("bucket");
    let waits = (Duration::from_secs(120), Duration::from_secs(300));
    r.restore_events = back_up_with_deltas(&e, &dir, opts.events, base_keys, waits).await?;

    ring_restores(opts, &bucket, &dir, r).await?;
    eprintln!("bench backup: etcdutl snapshot restore of the same data ...");
    r.restore_etcdutl_secs = etcdutl_restores(opts, &mut e, &dir).await?;
    r.restore_ratio = r.restore_ring_secs / r.restore_etcdutl_secs.max(1e-9);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Backs `e` up into `dir/bucket`: the full snapshot durable (within
/// `waits.0`), then `events` writes on top of its `base_keys` keys as deltas
/// (durable within `waits.1`); returns the revisions the deltas hold.
pub(super) async fn back_up_with_deltas(
    e: &TempEtcd,
    dir: &Path,
    events: u64,
    base_keys: u64,
    waits: (Duration, Duration),
) -> Result<u64> {
    let mut client = e.client().await?;
    let (mut progress, stop, task) = start_backup(e, dir)?;
    let after_full = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, after_full, waits.0).await?;
    eprintln!("bench: writing {events} delta events ...");
    write_delta_events(&client, events, base_keys).await?;
    let last = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, last, waits.1).await?;
    stop.cancel();
    let _ = task.await;
    Ok((last - after_full).max(0) as u64)
}

/// `total` writes, 16 in flight: puts of new keys (60 %), overwrites (30 %)
/// and deletes (10 %) of the `base_keys` keys.
async fn write_delta_events(client: &Client, total: u64, base_keys: u64) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (mut c, next) = (client.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<(), BackupError>(());
                }
                let res = match i % 10 {
                    // each base key is deleted once at most: every write is a revision
                    0 => c
                        .delete(format!("/registry/bench/{:09}", (i / 10) % base_keys), None)
                        .await
                        .map(|_| ()),
                    1..=3 => c
                        .put(
                            format!("/registry/bench/{:09}", (i * 7) % base_keys),
                            value(1024, i),
                            None,
                        )
                        .await
                        .map(|_| ()),
                    _ => c
                        .put(
                            format!("/registry/new/{i:09}"),
                            value(1024, i),
                            Some(PutOptions::new()),
                        )
                        .await
                        .map(|_| ()),
                };
                res.map_err(|e| etcd::err("bench etcd", "write", e))?;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| BackupError::Catalog(e.to_string()))??;
    }
    Ok(())
}

/// Ring's restores of `bucket`: on disk, and with the scratch space on tmpfs
/// when there is one.
async fn ring_restores(
    opts: &BenchOptions,
    bucket: &Path,
    dir: &Path,
    r: &mut BenchResult,
) -> Result<()> {
    eprintln!("bench backup: restoring with Ring ...");
    let m = ring_restore(&opts.ringctl, bucket, &dir.join("ring-restored"), None).await?;
    r.restore_ring_secs = m.secs;
    r.restore_ring_rss_mib = m.rss_mib;
    r.replay_events_per_sec = m.events_per_sec;
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        eprintln!("bench backup: restoring with Ring, scratch space on tmpfs ...");
        let work = shm.join(format!("ring-bench-restore-{}", std::process::id()));
        let target = dir.join("ring-restored-tmpfs");
        let result = ring_restore(&opts.ringctl, bucket, &target, Some(&work)).await;
        let _ = std::fs::remove_dir_all(&work);
        let m = result?;
        r.restore_ring_tmpfs_secs = m.secs;
        r.replay_events_per_sec_tmpfs = m.events_per_sec;
    }
    Ok(())
}

/// The reference: `etcdctl snapshot save` of the same final data, then the
/// median seconds of `etcdutl snapshot restore` of it (etcd is stopped first).
async fn etcdutl_restores(opts: &BenchOptions, e: &mut TempEtcd, dir: &Path) -> Result<f64> {
    let snap = dir.join("final.db");
    measure(snapshot_save_cmd(e, &snap)?).await?;
    e.stop().await;
    etcdutl_restore_secs(&snap, dir, opts.runs).await
}

/// The median seconds of `etcdutl snapshot restore` of `snap` into `dir`
/// (it checks the snapshot's hash, as a restore by hand would).
pub(super) async fn etcdutl_restore_secs(snap: &Path, dir: &Path, runs: usize) -> Result<f64> {
    let etcdutl = etcd::find_binary("etcdutl", None)?;
    let mut times = Vec::new();
    for i in 0..runs.max(1) {
        let target = dir.join(format!("etcdutl-restored-{i}"));
        let mut cmd = Command::new(&etcdutl);
        cmd.args(["snapshot", "restore"])
            .arg(snap)
            .arg(format!("--data-dir={}", target.display()));
        times.push(measure(cmd).await?.0);
        let _ = std::fs::remove_dir_all(&target);
    }
    Ok(median(times))
}

/// Figure 3: the backup lag under a steady write load.
pub(super) async fn lag(opts: &BenchOptions, r: &mut BenchResult) -> Result<()> {
    let dir = opts.dir.join("lag");
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let mut client = e.client().await?;
    fill(&client, 0, 1000, 1024, 8).await?;
    let (mut progress, stop, task) = start_backup(&e, &dir)?;
    let start_rev = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, start_rev, Duration::from_secs(60)).await?;
    let (durable, recorder) = record_durable(progress.clone());
    eprintln!("bench backup: {} puts/s for {:?} ...", opts.rate, opts.lag);
    let acks = write_at_rate(&client, opts.rate, opts.rate * opts.lag.as_secs()).await?;
    let last = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, last, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    let _ = task.await;
    recorder.abort();
    let durable = durable.lock().map(|d| d.clone()).unwrap_or_default();
    let lags = lags(&durable, &acks);
    r.lag_rate = opts.rate;
    r.lag_puts = acks.len() as u64;
    r.lag_p50_secs = percentile(&lags, 0.50);
    r.lag_p99_secs = percentile(&lags, 0.99);
    r.lag_max_secs = lags.last().copied().unwrap_or(0.0);
    e.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// (revision, ms) pairs: when a revision became durable, or was acknowledged.
type Times = Arc<std::sync::Mutex<Vec<(i64, i64)>>>;

/// Records when each revision became durable, until aborted.
fn record_durable(
    mut progress: tokio::sync::watch::Receiver<crate::Progress>,
) -> (Times, tokio::task::JoinHandle<()>) {
    let durable: Times = Arc::default();
    let recorder = {
        let durable = durable.clone();
        tokio::spawn(async move {
            while progress.changed().await.is_ok() {
                let p = progress.borrow_and_update().clone();
                if let Ok(mut d) = durable.lock() {
                    if d.last().is_none_or(|l| l.0 < p.durable_revision) {
                        d.push((p.durable_revision, p.durable_at_ms));
                    }
                }
            }
        })
    };
    (durable, recorder)
}

/// `total` puts at `rate` per second (at most 64 in flight); returns each
/// acknowledged put's (revision, ms).
async fn write_at_rate(client: &Client, rate: u64, total: u64) -> Result<Vec<(i64, i64)>> {
    let acks: Times = Arc::default();
    let permits = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut writers = tokio::task::JoinSet::new();
    for i in 0..total {
        tick.tick().await;
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| BackupError::Catalog(e.to_string()))?;
        let (mut c, acks) = (client.clone(), acks.clone());
        writers.spawn(async move {
            let _permit = permit;
            let key = format!("/registry/lag/{:06}", i % 5000);
            if let Ok(resp) = c.put(key, value(512, i), None).await {
                let rev = resp.header().map_or(0, |h| h.revision());
                if let Ok(mut a) = acks.lock() {
                    a.push((rev, now_ms()));
                }
            }
        });
    }
    while writers.join_next().await.is_some() {}
    let acks = acks.lock().map(|a| a.clone()).unwrap_or_default();
    Ok(acks)
}

/// Seconds from each acknowledgement to its revision being durable, sorted.
fn lags(durable: &[(i64, i64)], acks: &[(i64, i64)]) -> Vec<f64> {
    let mut lags: Vec<f64> = acks
        .iter()
        .filter_map(|(rev, acked)| {
            let i = durable.partition_point(|(d, _)| d < rev);
            durable
                .get(i)
                .map(|(_, at)| (at - acked).max(0) as f64 / 1000.0)
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    lags
}
