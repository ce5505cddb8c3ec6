//! `ringctl bench backup`: the three figures of the backup issue, each next to
//! its reference measured in the same run on the same data.
//!
//! 1. A full snapshot of a large database to `file://` (`ringctl backup
//!    snapshot`, a child process: wall time and peak RSS) against `etcdctl
//!    snapshot save` of the same etcd.
//! 2. A restore of a full snapshot plus many delta events (`ringctl backup
//!    restore`, a child) against `etcdctl snapshot restore` of a snapshot that
//!    holds the same final data; and the events replayed per second.
//! 3. The backup lag under a steady write load: seconds between a put's
//!    acknowledgement and its delta being stored in the bucket.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::{BackupConfig, BucketConfig, EtcdConfig};
use crate::error::io_at;
use crate::etcd::{self, TempEtcd};
use crate::runner::Backup;
use crate::{now_ms, BackupError, Result};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Database size of figure 1.
    pub db_mib: u64,
    /// Delta events of figure 2.
    pub events: u64,
    /// Puts per second of figure 3.
    pub rate: u64,
    /// How long figure 3 writes.
    pub lag: Duration,
    /// Runs of each snapshot measurement (median).
    pub runs: usize,
    /// The `ringctl` executable (measured as a child process).
    pub ringctl: PathBuf,
    /// Scratch space (removed by the caller).
    pub dir: PathBuf,
}

/// The figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchResult {
    pub db_mib: f64,
    pub db_keys: u64,
    pub snapshot_runs: usize,
    pub snapshot_ring_secs: f64,
    pub snapshot_etcdctl_secs: f64,
    /// etcdctl's time / Ring's time (goal ≥ 0.9).
    pub snapshot_speed_ratio: f64,
    pub snapshot_ring_rss_mib: f64,
    pub snapshot_etcdctl_rss_mib: f64,
    pub snapshot_stored_mib: f64,
    pub restore_base_keys: u64,
    pub restore_events: u64,
    pub restore_ring_secs: f64,
    pub restore_etcdctl_secs: f64,
    /// Ring's time / etcdctl's time.
    pub restore_ratio: f64,
    pub replay_events_per_sec: f64,
    /// The same with the scratch space on tmpfs (`--work-dir /dev/shm/...`).
    pub restore_ring_tmpfs_secs: f64,
    pub replay_events_per_sec_tmpfs: f64,
    /// Of ringctl and the temporary etcd it runs.
    pub restore_ring_rss_mib: f64,
    pub lag_rate: u64,
    pub lag_puts: u64,
    pub lag_p50_secs: f64,
    pub lag_p99_secs: f64,
    pub lag_max_secs: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs a child to completion: (wall seconds, peak RSS MiB, stdout).
async fn measure(mut cmd: Command) -> Result<(f64, f64, String)> {
    let what = format!("{cmd:?}");
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| BackupError::Tool {
                program: what.clone(),
                message: e.to_string(),
            })?;
        let pid = child.id() as libc::pid_t;
        let (mut stdout, mut stderr) = (child.stdout, child.stderr);
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(o) = stdout.as_mut() {
                let _ = std::io::Read::read_to_string(o, &mut s);
            }
            s
        });
        let mut err_text = String::new();
        if let Some(e) = stderr.as_mut() {
            let _ = std::io::Read::read_to_string(e, &mut err_text);
        }
        let mut status = 0;
        // SAFETY: plain syscall on our own child; rusage is a plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        let secs = started.elapsed().as_secs_f64();
        let out = out_reader.join().unwrap_or_default();
        if r < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            return Err(BackupError::Tool {
                program: what,
                message: err_text.trim().to_string(),
            });
        }
        Ok((secs, usage.ru_maxrss as f64 / 1024.0, out))
    })
    .await
    .map_err(|e| BackupError::Tool {
        program: "benchmark child".into(),
        message: e.to_string(),
    })?
}

/// A value of `len` bytes, half random (like encoded objects), half repetitive.
fn value(len: usize, i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < len / 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    let text = format!("{{\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"bench-{i}\",\"namespace\":\"default\"}}}}");
    while v.len() < len {
        v.extend_from_slice(text.as_bytes());
    }
    v.truncate(len);
    v
}

/// Writes `count` keys from `start` with `concurrency` puts in flight.
async fn fill(client: &Client, start: u64, count: u64, len: usize, concurrency: u64) -> Result<()> {
    let next = Arc::new(AtomicU64::new(start));
    let end = start + count;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (mut c, next) = (client.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return Ok(());
                }
                c.put(format!("/registry/bench/{i:09}"), value(len, i), None)
                    .await
                    .map_err(|e| etcd::err("bench etcd", "put", e))?;
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| BackupError::Catalog(e.to_string()))??;
    }
    Ok(())
}

async fn start_etcd(dir: &Path, name: &str) -> Result<TempEtcd> {
    let etcd_bin = etcd::find_binary("etcd", None)?;
    std::fs::create_dir_all(dir).map_err(io_at("creating", dir))?;
    TempEtcd::start(&etcd_bin, &dir.join("data"), name, &dir.join("etcd.log")).await
}

type Running = (
    tokio::sync::watch::Receiver<crate::Progress>,
    CancellationToken,
    tokio::task::JoinHandle<Result<()>>,
);

/// A continuous backup of the etcd at `url` into `dir/bucket` (default
/// schedule, no periodic HashKV), running until the token is cancelled.
fn start_backup(url: &str, dir: &Path) -> Result<Running> {
    let mut c = BackupConfig::new(
        "bench",
        EtcdConfig::plain(url),
        BucketConfig::url(format!("file://{}", dir.join("bucket").display())),
    );
    c.spool.dir = Some(dir.join("spool"));
    c.schedule.hash_kv_interval_secs = 0;
    let b = Backup::new(c)?;
    let progress = b.progress();
    let stop = CancellationToken::new();
    let task = tokio::spawn(b.run(stop.clone()));
    Ok((progress, stop, task))
}

/// Runs the three measurements.
pub async fn run(opts: &BenchOptions) -> Result<BenchResult> {
    let mut r = BenchResult {
        snapshot_runs: opts.runs,
        ..Default::default()
    };
    std::fs::create_dir_all(&opts.dir).map_err(io_at("creating", &opts.dir))?;
    snapshot_figure(opts, &mut r).await?;
    restore_figure(opts, &mut r).await?;
    lag_figure(opts, &mut r).await?;
    Ok(r)
}

async fn snapshot_figure(opts: &BenchOptions, r: &mut BenchResult) -> Result<()> {
    let dir = opts.dir.join("snapshot");
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let mut client = e.client().await?;
    eprintln!("bench backup: filling etcd to {} MiB ...", opts.db_mib);
    let len = 4096usize;
    let mut keys = 0u64;
    while (etcd::status(&mut client, &e.url).await?.db_size as u64) < opts.db_mib << 20 {
        let step = ((opts.db_mib << 20) / len as u64 / 8).clamp(1000, 20_000);
        fill(&client, keys, step, len, 32).await?;
        keys += step;
    }
    let status = etcd::status(&mut client, &e.url).await?;
    r.db_mib = status.db_size as f64 / (1 << 20) as f64;
    r.db_keys = keys;
    let etcdctl = etcd::find_binary("etcdctl", None)?;
    let (mut ring_t, mut ctl_t, mut ring_rss, mut ctl_rss) = (vec![], vec![], 0f64, 0f64);
    for run in 0..opts.runs {
        eprintln!(
            "bench backup: full snapshot run {}/{} ...",
            run + 1,
            opts.runs
        );
        let out = dir.join("etcdctl.db");
        let _ = std::fs::remove_file(&out);
        let mut cmd = Command::new(&etcdctl);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", e.url))
            .args(["snapshot", "save"])
            .arg(&out);
        let (t, rss, _) = measure(cmd).await?;
        ctl_t.push(t);
        ctl_rss = ctl_rss.max(rss);
        let _ = std::fs::remove_file(&out);

        let bucket = dir.join("bucket");
        let _ = std::fs::remove_dir_all(&bucket);
        let mut cmd = Command::new(&opts.ringctl);
        cmd.args(["backup", "snapshot", "--shoot", "bench", "-o", "json"])
            .arg(format!("--etcd-endpoint={}", e.url))
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

async fn wait_durable(
    progress: &mut tokio::sync::watch::Receiver<crate::Progress>,
    revision: i64,
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    while progress.borrow_and_update().durable_revision < revision {
        if tokio::time::timeout_at(deadline, progress.changed())
            .await
            .is_err()
        {
            return Err(BackupError::Catalog(format!(
                "the backup did not reach revision {revision} within {timeout:?}"
            )));
        }
    }
    Ok(())
}

async fn restore_figure(opts: &BenchOptions, r: &mut BenchResult) -> Result<()> {
    let dir = opts.dir.join("restore");
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let mut client = e.client().await?;
    let base_keys = 20_000u64;
    fill(&client, 0, base_keys, 1024, 32).await?;
    r.restore_base_keys = base_keys;
    let bucket = dir.join("bucket");
    let (mut progress, stop, task) = start_backup(&e.url, &dir)?;
    let after_full = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, after_full, Duration::from_secs(120)).await?;
    eprintln!("bench backup: writing {} delta events ...", opts.events);
    // puts of new keys (60 %), overwrites (30 %) and deletes (10 %), 16 in flight
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (mut c, next, total) = (client.clone(), next.clone(), opts.events);
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
    let last = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, last, Duration::from_secs(300)).await?;
    stop.cancel();
    let _ = task.await;
    r.restore_events = (last - after_full).max(0) as u64;

    eprintln!("bench backup: restoring with Ring ...");
    let (t, rss, eps) = ring_restore(opts, &bucket, &dir.join("ring-restored"), None).await?;
    r.restore_ring_secs = t;
    r.restore_ring_rss_mib = rss;
    r.replay_events_per_sec = eps;
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        eprintln!("bench backup: restoring with Ring, scratch space on tmpfs ...");
        let work = shm.join(format!("ring-bench-restore-{}", std::process::id()));
        let result =
            ring_restore(opts, &bucket, &dir.join("ring-restored-tmpfs"), Some(&work)).await;
        let _ = std::fs::remove_dir_all(&work);
        let (t, _, eps) = result?;
        r.restore_ring_tmpfs_secs = t;
        r.replay_events_per_sec_tmpfs = eps;
    }

    eprintln!("bench backup: etcdctl snapshot restore of the same data ...");
    let etcdctl = etcd::find_binary("etcdctl", None)?;
    let snap = dir.join("final.db");
    let mut cmd = Command::new(&etcdctl);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", e.url))
        .args(["snapshot", "save"])
        .arg(&snap);
    measure(cmd).await?;
    e.stop().await;
    let mut times = Vec::new();
    for i in 0..opts.runs {
        let target = dir.join(format!("etcdctl-restored-{i}"));
        let mut cmd = Command::new(&etcdctl);
        cmd.env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(&snap)
            .arg(format!("--data-dir={}", target.display()));
        times.push(measure(cmd).await?.0);
        let _ = std::fs::remove_dir_all(&target);
    }
    r.restore_etcdctl_secs = median(times);
    r.restore_ratio = r.restore_ring_secs / r.restore_etcdctl_secs.max(1e-9);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `ringctl backup restore` as a child: (seconds, peak RSS MiB, events replayed per second).
async fn ring_restore(
    opts: &BenchOptions,
    bucket: &Path,
    data_dir: &Path,
    work: Option<&Path>,
) -> Result<(f64, f64, f64)> {
    let mut cmd = Command::new(&opts.ringctl);
    cmd.args(["backup", "restore", "--shoot", "bench", "-o", "json"])
        .arg(format!("--bucket=file://{}", bucket.display()))
        .arg(format!("--data-dir={}", data_dir.display()));
    if let Some(w) = work {
        cmd.arg(format!("--work-dir={}", w.display()));
    }
    let (t, rss, stdout) = measure(cmd).await?;
    let v: serde_json::Value = serde_json::from_str(&stdout).map_err(|e| BackupError::Tool {
        program: "ringctl backup restore".into(),
        message: format!("unreadable report: {e}"),
    })?;
    if v["verified"].as_bool() != Some(true) {
        return Err(BackupError::Verify(format!(
            "the benchmark restore was not verified: {stdout}"
        )));
    }
    let events = v["eventsReplayed"].as_f64().unwrap_or(0.0);
    let replay = v["replaySeconds"].as_f64().unwrap_or(0.0);
    let _ = std::fs::remove_dir_all(data_dir);
    Ok((t, rss, events / replay.max(1e-9)))
}

async fn lag_figure(opts: &BenchOptions, r: &mut BenchResult) -> Result<()> {
    let dir = opts.dir.join("lag");
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let mut client = e.client().await?;
    fill(&client, 0, 1000, 1024, 8).await?;
    let (mut progress, stop, task) = start_backup(&e.url, &dir)?;
    let start_rev = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, start_rev, Duration::from_secs(60)).await?;

    // Record when each revision became durable.
    let durable: Arc<std::sync::Mutex<Vec<(i64, i64)>>> = Arc::default();
    let recorder = {
        let (durable, mut progress) = (durable.clone(), progress.clone());
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
    eprintln!("bench backup: {} puts/s for {:?} ...", opts.rate, opts.lag);
    let acks: Arc<std::sync::Mutex<Vec<(i64, i64)>>> = Arc::default();
    let permits = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / opts.rate.max(1) as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let total = opts.rate * opts.lag.as_secs();
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
            if let Ok(resp) = c
                .put(
                    format!("/registry/lag/{:06}", i % 5000),
                    value(512, i),
                    None,
                )
                .await
            {
                let rev = resp.header().map_or(0, |h| h.revision());
                if let Ok(mut a) = acks.lock() {
                    a.push((rev, now_ms()));
                }
            }
        });
    }
    while writers.join_next().await.is_some() {}
    let last = etcd::status(&mut client, &e.url).await?.revision;
    wait_durable(&mut progress, last, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.cancel();
    let _ = task.await;
    recorder.abort();
    let durable = durable.lock().map(|d| d.clone()).unwrap_or_default();
    let acks = acks.lock().map(|a| a.clone()).unwrap_or_default();
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
    r.lag_rate = opts.rate;
    r.lag_puts = acks.len() as u64;
    r.lag_p50_secs = percentile(&lags, 0.50);
    r.lag_p99_secs = percentile(&lags, 0.99);
    r.lag_max_secs = lags.last().copied().unwrap_or(0.0);
    e.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The figures as a table for people.
pub fn render(r: &BenchResult) -> String {
    format!(
        "\
full snapshot of a {db:.0} MiB etcd ({keys} keys of 4 KiB) to file://, median of {runs}:
  Ring (zstd + sha256, ringctl backup snapshot)   {rs:>7.2} s   peak RSS {rr:>6.1} MiB   stored {st:.0} MiB
  etcdctl snapshot save                          {es:>7.2} s   peak RSS {er:>6.1} MiB
  speed ratio (etcdctl time / Ring time)          {ratio:>7.2}x   goal >= 0.9x

restore of a full snapshot ({bk} keys) + {ev} delta events:
  Ring (ringctl backup restore, verified)         {rt:>7.2} s   peak RSS {rrr:>6.1} MiB (with its temporary etcd)
  etcdctl snapshot restore, same final data       {et:>7.2} s
  ratio (Ring time / etcdctl time)                {rratio:>7.1}x
  events replayed per second                      {eps:>7.0}
  Ring with --work-dir on tmpfs                   {tt:>7.2} s   {teps:.0} events/s

backup lag under {rate} puts/s ({puts} puts, deltas every 1 s):
  p50 {p50:.2} s   p99 {p99:.2} s   max {max:.2} s   goal p99 <= 1.5 s
",
        db = r.db_mib,
        keys = r.db_keys,
        runs = r.snapshot_runs,
        rs = r.snapshot_ring_secs,
        rr = r.snapshot_ring_rss_mib,
        st = r.snapshot_stored_mib,
        es = r.snapshot_etcdctl_secs,
        er = r.snapshot_etcdctl_rss_mib,
        ratio = r.snapshot_speed_ratio,
        bk = r.restore_base_keys,
        ev = r.restore_events,
        rt = r.restore_ring_secs,
        rrr = r.restore_ring_rss_mib,
        et = r.restore_etcdctl_secs,
        rratio = r.restore_ratio,
        eps = r.replay_events_per_sec,
        tt = r.restore_ring_tmpfs_secs,
        teps = r.replay_events_per_sec_tmpfs,
        rate = r.lag_rate,
        puts = r.lag_puts,
        p50 = r.lag_p50_secs,
        p99 = r.lag_p99_secs,
        max = r.lag_max_secs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentiles() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), 51.0);
        assert_eq!(percentile(&xs, 0.99), 99.0);
    }

    #[test]
    fn values_are_sized_and_differ() {
        assert_eq!(value(4096, 1).len(), 4096);
        assert_ne!(value(64, 1), value(64, 2));
    }
}
