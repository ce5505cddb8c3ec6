//! `ringctl bench backup`: the three figures of the backup issue, each next to
//! its reference measured in the same run on the same data.
//!
//! 1. A full snapshot of a large database to `file://` (`ringctl backup
//!    snapshot`, a child process: wall time and peak RSS) against `etcdctl
//!    snapshot save` of the same etcd.
//! 2. A restore of a full snapshot plus many delta events (`ringctl backup
//!    restore`, a child) against `etcdutl snapshot restore` of a snapshot that
//!    holds the same final data; and the events replayed per second.
//!    (`ringctl bench restore` measures the same at scale, `restore.rs`.)
//! 3. The backup lag under a steady write load: seconds between a put's
//!    acknowledgement and its delta being stored in the bucket.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::io_at;
use crate::Result;

mod figures;
pub mod restore;
mod tools;

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
    pub restore_etcdutl_secs: f64,
    /// Ring's time / etcdutl's time.
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

/// The median (0 for none).
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

/// The `p` quantile of `sorted` (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs the three measurements.
pub async fn run(opts: &BenchOptions) -> Result<BenchResult> {
    let mut r = BenchResult {
        snapshot_runs: opts.runs,
        ..Default::default()
    };
    std::fs::create_dir_all(&opts.dir).map_err(io_at("creating", &opts.dir))?;
    figures::snapshot(opts, &mut r).await?;
    figures::restore(opts, &mut r).await?;
    figures::lag(opts, &mut r).await?;
    Ok(r)
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
  etcdutl snapshot restore, same final data       {et:>7.2} s
  ratio (Ring time / etcdutl time)                {rratio:>7.1}x
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
        et = r.restore_etcdutl_secs,
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
    use super::tools::value;
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
