//! `ringctl bench controlplane`: how fast a hosted control plane becomes ready
//! and how much memory its components take.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use seed::{wait_ready, Component, ControlPlaneSpec, DeprecatedApis, Seed};
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

/// One variant's runs and medians.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantBench {
    /// Whether kube-apiserver served the deprecated beta API versions.
    pub deprecated_apis: DeprecatedApis,
    pub runs: Vec<RunFigures>,
    pub median_cold_ready_secs: f64,
    pub median_warm_ready_secs: f64,
    pub median_peak_rss_mib: BTreeMap<Component, f64>,
}

/// The benchmark's result: Ring's default (the betas off, as kube-apiserver's
/// own default) and the betas served, measured alternately in one run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneBench {
    pub variants: Vec<VariantBench>,
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The variants, in the order each run measures them.
const VARIANTS: [DeprecatedApis; 2] = [DeprecatedApis::Off, DeprecatedApis::Served];

/// Creates, measures and deletes `opts.runs` control planes per variant, the
/// variants alternating (so both see the same machine).
pub async fn controlplane(opts: &BenchOptions) -> Result<ControlPlaneBench> {
    let mut runs: Vec<Vec<RunFigures>> = vec![Vec::new(); VARIANTS.len()];
    for i in 0..opts.runs.max(1) {
        for (v, apis) in VARIANTS.iter().enumerate() {
            let figures = measure_once(opts, i, *apis).await?;
            tracing::info!(run = i, deprecated_apis = %apis, ?figures, "control plane bench run");
            runs[v].push(figures);
        }
    }
    let variants = VARIANTS
        .iter()
        .zip(runs)
        .map(|(apis, runs)| summarize(*apis, runs))
        .collect();
    Ok(ControlPlaneBench { variants })
}

fn summarize(deprecated_apis: DeprecatedApis, runs: Vec<RunFigures>) -> VariantBench {
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
    VariantBench {
        deprecated_apis,
        median_cold_ready_secs: median(runs.iter().map(|r| r.cold_ready_secs).collect()),
        median_warm_ready_secs: median(runs.iter().map(|r| r.warm_ready_secs).collect()),
        median_peak_rss_mib,
        runs,
    }
}

/// Run `i`: a new shoot from nothing to `/readyz`, its memory once settled, then
/// a restart with its data to `/readyz`; its files are removed afterwards.
async fn measure_once(opts: &BenchOptions, i: usize, apis: DeprecatedApis) -> Result<RunFigures> {
    let dir = opts.seed.state_dir.join(format!("run-{i}-{apis}"));
    let seed_opts = SeedOptions {
        state_dir: dir.clone(),
        bin_dir: opts.seed.bin_dir.clone(),
    };
    let seed = seed_opts.local_seed()?.with_deprecated_apis(apis);
    let spec = ControlPlaneSpec::new(format!("bench-{i}-{apis}"));
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

/// The benchmark as a table: per figure Ring's default, kube-apiserver's
/// default and their ratio.
pub fn render(b: &ControlPlaneBench) -> String {
    let (Some(off), Some(served)) = (b.variants.first(), b.variants.get(1)) else {
        return "control plane benchmark: no runs\n".into();
    };
    let mut t = table(&[
        "FIGURE",
        "BETAS OFF",
        "BETAS SERVED",
        "RATIO",
        "RUNS (OFF / SERVED)",
    ]);
    let mut row = |name: String,
                   f: &dyn Fn(&VariantBench) -> f64,
                   each: &dyn Fn(&RunFigures) -> Option<f64>| {
        let runs = |v: &VariantBench| {
            let xs: Vec<String> = v
                .runs
                .iter()
                .map(|r| each(r).map_or("-".into(), |x| format!("{x:.1}")))
                .collect();
            xs.join(" ")
        };
        let (a, b) = (f(off), f(served));
        let ratio = if b > 0.0 {
            format!("{:.2}", a / b)
        } else {
            "-".into()
        };
        t.add_row(vec![
            name,
            format!("{a:.2}"),
            format!("{b:.2}"),
            ratio,
            format!("{} / {}", runs(off), runs(served)),
        ]);
    };
    row(
        "start to /readyz, new shoot (s)".into(),
        &|v| v.median_cold_ready_secs,
        &|r| Some(r.cold_ready_secs),
    );
    row(
        "start to /readyz, restart with data (s)".into(),
        &|v| v.median_warm_ready_secs,
        &|r| Some(r.warm_ready_secs),
    );
    for c in Component::ALL {
        row(
            format!("peak RSS {c} (MiB)"),
            &|v| v.median_peak_rss_mib.get(&c).copied().unwrap_or(0.0),
            &|r| r.peak_rss_mib.get(&c).copied(),
        );
    }
    row(
        "peak RSS, all four (MiB)".into(),
        &|v| v.median_peak_rss_mib.values().sum(),
        &|r| Some(r.peak_rss_mib.values().sum()),
    );
    format!(
        "control plane benchmark, {} runs per variant (median; BETAS OFF is Ring's default, \
         `deprecatedApis: off`, as kube-apiserver's own; SERVED also serves the release's betas; RATIO = off / served):\n{t}\n",
        off.runs.len()
    )
}
