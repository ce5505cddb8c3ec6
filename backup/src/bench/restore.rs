//! `ringctl bench restore`: a restore of a large full snapshot plus many delta
//! events, against `etcdutl snapshot restore` of the same full snapshot
//! measured in the same run.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::figures::{back_up_with_deltas, etcdutl_restore_secs, fill_to};
use super::median;
use super::tools::{measure, ring_restore, snapshot_save_cmd, start_etcd};
use crate::error::io_at;
use crate::Result;

/// What to measure.
#[derive(Debug, Clone)]
pub struct RestoreBenchOptions {
    /// Size of the database the full snapshot holds.
    pub db_mib: u64,
    /// Delta events written after it.
    pub events: u64,
    /// Runs of each restore (median).
    pub runs: usize,
    /// The `ringctl` executable (measured as a child process).
    pub ringctl: PathBuf,
    /// Scratch space (removed by the caller).
    pub dir: PathBuf,
}

/// The figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreBenchResult {
    pub db_mib: f64,
    pub full_keys: u64,
    pub events: u64,
    pub runs: usize,
    /// `ringctl backup restore`: download, check, restore, replay, verify.
    pub ring_secs: f64,
    pub ring_replay_secs: f64,
    pub ring_events_per_sec: f64,
    /// Of ringctl and the temporary etcd it runs.
    pub ring_rss_mib: f64,
    /// `etcdutl snapshot restore` of the same full snapshot (no deltas).
    pub etcdutl_full_secs: f64,
    /// Ring's time / etcdutl's time.
    pub ratio: f64,
}

/// Fills an etcd, backs it up (full, then `events` deltas), restores.
pub async fn run(opts: &RestoreBenchOptions) -> Result<RestoreBenchResult> {
    let mut r = RestoreBenchResult {
        runs: opts.runs.max(1),
        ..Default::default()
    };
    let dir = &opts.dir;
    std::fs::create_dir_all(dir).map_err(io_at("creating", dir))?;
    let mut e = start_etcd(&dir.join("etcd"), "bench").await?;
    let mut client = e.client().await?;
    eprintln!("bench restore: filling etcd to {} MiB ...", opts.db_mib);
    (r.db_mib, r.full_keys) = fill_to(&mut client, &e.url, opts.db_mib).await?;
    let full = dir.join("full.db");
    measure(snapshot_save_cmd(&e, &full)?).await?;
    let wait = std::time::Duration::from_secs(600);
    r.events = back_up_with_deltas(&e, dir, opts.events, r.full_keys, (wait, wait)).await?;
    e.stop().await;
    ring_figures(opts, &dir.join("bucket"), &mut r).await?;
    eprintln!("bench restore: etcdutl snapshot restore of the full snapshot ...");
    r.etcdutl_full_secs = etcdutl_restore_secs(&full, dir, r.runs).await?;
    r.ratio = r.ring_secs / r.etcdutl_full_secs.max(1e-9);
    Ok(r)
}

/// Ring's restores, the median of the runs.
async fn ring_figures(
    opts: &RestoreBenchOptions,
    bucket: &Path,
    r: &mut RestoreBenchResult,
) -> Result<()> {
    let (mut times, mut replays, mut rates) = (vec![], vec![], vec![]);
    for run in 0..r.runs {
        eprintln!("bench restore: Ring restore {}/{} ...", run + 1, r.runs);
        let target = opts.dir.join("ring-restored");
        let m = ring_restore(&opts.ringctl, bucket, &target, None).await?;
        times.push(m.secs);
        replays.push(m.replay_secs);
        rates.push(m.events_per_sec);
        r.ring_rss_mib = r.ring_rss_mib.max(m.rss_mib);
    }
    r.ring_secs = median(times);
    r.ring_replay_secs = median(replays);
    r.ring_events_per_sec = median(rates);
    Ok(())
}

/// The figures as a table for people.
pub fn render(r: &RestoreBenchResult) -> String {
    format!(
        "\
restore of a full snapshot ({db:.0} MiB, {keys} keys) + {ev} delta events, median of {runs}:
  Ring (ringctl backup restore, verified)       {rt:>7.2} s   goal <= 10 s   peak RSS {rss:.1} MiB (with its temporary etcd)
  of which the replay                           {rp:>7.2} s   {eps:>7.0} events/s   goal >= 20000
  etcdutl snapshot restore of the full alone    {et:>7.2} s
  ratio (Ring time / etcdutl time)              {ratio:>7.1}x
",
        db = r.db_mib,
        keys = r.full_keys,
        ev = r.events,
        runs = r.runs,
        rt = r.ring_secs,
        rss = r.ring_rss_mib,
        rp = r.ring_replay_secs,
        eps = r.ring_events_per_sec,
        et = r.etcdutl_full_secs,
        ratio = r.ratio,
    )
}
