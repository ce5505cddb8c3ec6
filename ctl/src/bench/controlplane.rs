//! `ringctl bench controlplane`: how fast a hosted control plane becomes ready
//! and how much memory its components take.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use seed::{wait_ready, Component, ControlPlaneSpec, Seed};
use serde::Serialize;

use super::median;
use crate::controlplane::SeedOptions;
use crate::output::table;
use ringd::Result;

/// Options of the control-plane benchmark.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// How many control planes to create (the median is reported).
    pub runs: usize,
    /// Where the benchmark's throwaway shoots live.
    pub seed: SeedOptions,
    /// How long a ready control plane idles before its memory is read.
    pub settle: Duration,
}

/// Figures of one run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunFigures {
    /// New shoot: PKI, empty etcd, first start, until `/readyz` is ok.
    pub cold_ready_secs: f64,
    /// Same shoot stopped and started again with its data.
    pub warm_ready_secs: f64,
    /// Peak resident memory (VmHWM) of each component, MiB.
    pub peak_rss_mib: BTreeMap<Component, f64>,
}

/// The benchmark's result: each run and the medians.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneBench {
    pub runs: Vec<RunFigures>,
    pub median_cold_ready_secs: f64,
    pub median_warm_ready_secs: f64,
    pub median_peak_rss_mib: BTreeMap<Component, f64>,
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Creates, measures and deletes `opts.runs` control planes one after the other.
pub async fn controlplane(opts: &BenchOptions) -> Result<ControlPlaneBench> {
    let mut runs = Vec::new();
    for i in 0..opts.runs.max(1) {
        let figures = measure_once(opts, i).await?;
        tracing::info!(run = i, ?figures, "control plane bench run");
        runs.push(figures);
    }
    let median_peak_rss_mib = Component::ALL
        .iter()
        .map(|c| {
            let xs = runs
                .iter()
                .filter_map(|r| r.peak_rss_mib.get(c).copied())
                .collect();
            (*c, median(xs))
        })
        .collect();
    Ok(ControlPlaneBench {
        median_cold_ready_secs: median(runs.iter().map(|r| r.cold_ready_secs).collect()),
        median_warm_ready_secs: median(runs.iter().map(|r| r.warm_ready_secs).collect()),
        median_peak_rss_mib,
        runs,
    })
}

/// Run `i`: a new shoot from nothing to `/readyz`, its memory once settled, then
/// a restart with its data to `/readyz`; its files are removed afterwards.
async fn measure_once(opts: &BenchOptions, i: usize) -> Result<RunFigures> {
    let dir = opts.seed.state_dir.join(format!("run-{i}"));
    let seed_opts = SeedOptions {
        state_dir: dir.clone(),
        bin_dir: opts.seed.bin_dir.clone(),
    };
    let seed = seed_opts.local_seed()?;
    let spec = ControlPlaneSpec::new(format!("bench-{i}"));
    let shoot = spec.shoot.clone();

    let t = Instant::now();
    seed.start(&spec).await?;
    let ready = wait_ready(&seed, &shoot, READY_TIMEOUT).await;
    let cold = t.elapsed().as_secs_f64();
    if let Err(e) = ready {
        let _ = seed.stop(&shoot).await;
        return Err(e.into());
    }
    tokio::time::sleep(opts.settle).await;
    let status = seed.inspect(&shoot).await?;
    let peak_rss_mib = status
        .components
        .iter()
        .filter_map(|c| Some((c.component, peak_rss_mib(c.state.pid?)?)))
        .collect();
    seed.stop(&shoot).await?;

    let t = Instant::now();
    seed.start(&spec).await?;
    let ready = wait_ready(&seed, &shoot, READY_TIMEOUT).await;
    let warm = t.elapsed().as_secs_f64();
    seed.stop(&shoot).await?;
    ready?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(RunFigures {
        cold_ready_secs: cold,
        warm_ready_secs: warm,
        peak_rss_mib,
    })
}

/// The benchmark as a table.
pub fn render(b: &ControlPlaneBench) -> String {
    let mut t = table(&["FIGURE", "MEDIAN", "RUNS"]);
    let each = |f: &dyn Fn(&RunFigures) -> Option<f64>| {
        b.runs
            .iter()
            .map(|r| f(r).map_or("-".into(), |x| format!("{x:.1}")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    t.add_row(vec![
        "start to /readyz, new shoot (s)".to_string(),
        format!("{:.2}", b.median_cold_ready_secs),
        each(&|r| Some(r.cold_ready_secs)),
    ]);
    t.add_row(vec![
        "start to /readyz, restart with data (s)".to_string(),
        format!("{:.2}", b.median_warm_ready_secs),
        each(&|r| Some(r.warm_ready_secs)),
    ]);
    for (c, m) in &b.median_peak_rss_mib {
        t.add_row(vec![
            format!("peak RSS {c} (MiB)"),
            format!("{m:.0}"),
            each(&|r| r.peak_rss_mib.get(c).copied()),
        ]);
    }
    let total: f64 = b.median_peak_rss_mib.values().sum();
    t.add_row(vec![
        "peak RSS, all four (MiB)".into(),
        format!("{total:.0}"),
        String::new(),
    ]);
    format!(
        "control plane benchmark, {} runs (median):\n{t}\n",
        b.runs.len()
    )
}
