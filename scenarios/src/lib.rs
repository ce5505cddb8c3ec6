//! Declarative chaos drills for Ring.
//!
//! A drill file ([`drill::Drill`], `scenarios/drills/*.yaml`) names a ring size,
//! a workload of writers creating and updating ConfigMaps and Secrets through
//! every shoot's kube-apiserver, a timeline of faults (kill -9 of a seed, of a
//! whole member machine or of the leader, a returning zombie seed, a corrupted snapshot, a stopped bucket,
//! losing the whole ring and restoring it from the bucket) and expectations
//! (RTO bound, no acknowledged write lost beyond the last durable delta, never
//! two control planes of one shoot, the ring converges). [`runner::run`]
//! bootstraps a throwaway ring (by default self-hosted: a node per member,
//! each hosting its successor's control plane as pods; or control planes as
//! local processes, with Kubernetes seed clusters for some members:
//! [`kube_seeds`]), runs the drill with a seeded RNG and
//! returns a [`result::RunResult`]; [`report`] renders it as a terminal summary
//! and a self-contained HTML report with an SVG timeline.

pub mod drill;
pub mod kube_seeds;
pub mod lost;
pub mod netns;
pub mod procs;
pub mod report;
pub mod result;
pub mod rng;
pub mod runner;
pub mod s3;
pub mod seed_cluster;
pub mod summary;
pub mod workload;

pub use drill::Drill;
pub use result::RunResult;

/// Errors of drills.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The drill file is wrong (permanent).
    #[error("drill {field}: {reason}")]
    Drill { field: String, reason: String },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Setting up or operating the drill's ring failed.
    #[error("{0}")]
    Ring(#[from] bootstrap::BootstrapError),
    /// Something the drill needs is missing or did not happen in time.
    #[error("{0}")]
    Setup(String),
}

impl ScenarioError {
    /// Whether running the drill again may succeed (the drill file is fine).
    pub fn is_retryable(&self) -> bool {
        !matches!(self, ScenarioError::Drill { .. })
    }
}

/// Options of [`run_files`] (`ringctl drill run`).
#[derive(Debug, Clone)]
pub struct DrillRunOptions {
    pub files: Vec<std::path::PathBuf>,
    /// Runs of each drill.
    pub repeat: usize,
    /// Overrides the drill files' seeds; run i uses seed + i - 1.
    pub seed: Option<u64>,
    /// Where each run's JSON result and HTML report go.
    pub report_dir: std::path::PathBuf,
    pub runner: runner::RunOptions,
}

/// What [`run_files`] produced: every run's result and report files.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillRuns {
    pub runs: Vec<RunResult>,
    pub reports: Vec<(std::path::PathBuf, std::path::PathBuf)>,
    /// Drill → (passed, runs).
    pub tally: std::collections::BTreeMap<String, (usize, usize)>,
}

impl DrillRuns {
    /// Whether every run passed.
    pub fn all_passed(&self) -> bool {
        self.runs.iter().all(|r| r.passed)
    }
}

/// Loads every drill file (all are validated before the first run), runs each
/// `repeat` times, prints a summary per run through `say` and writes
/// `<report-dir>/<drill>-<run>.json` and `.html`.
pub async fn run_files(
    opts: &DrillRunOptions,
    say: &(dyn Fn(&str) + Sync),
) -> Result<DrillRuns, ScenarioError> {
    let drills = opts
        .files
        .iter()
        .map(|f| Drill::load(f))
        .collect::<Result<Vec<_>, _>>()?;
    if opts.repeat == 0 {
        return Err(ScenarioError::Drill {
            field: "--repeat".into(),
            reason: "must be at least 1".into(),
        });
    }
    std::fs::create_dir_all(&opts.report_dir).map_err(|source| ScenarioError::Io {
        what: format!("creating {}", opts.report_dir.display()),
        source,
    })?;
    let runner = &opts.runner;
    let build = summary::build_digest(&[
        runner.ringctl.clone(),
        runner.ringd.clone(),
        runner.ringd.with_file_name("ring-node"),
    ])?;
    let mut out = DrillRuns {
        runs: Vec::new(),
        reports: Vec::new(),
        tally: Default::default(),
    };
    for drill in &drills {
        for i in 1..=opts.repeat {
            let seed = opts.seed.unwrap_or(drill.seed).wrapping_add(i as u64 - 1);
            let mut result = runner::run(drill, i, seed, runner, say).await?;
            result.build = Some(build.clone());
            let base = report_base(&opts.report_dir, &drill.name, i, seed);
            let (json, html) = (base.with_extension("json"), base.with_extension("html"));
            let write = |path: &std::path::Path, text: &[u8]| {
                std::fs::write(path, text).map_err(|source| ScenarioError::Io {
                    what: format!("writing {}", path.display()),
                    source,
                })
            };
            let text = serde_json::to_vec_pretty(&result)
                .map_err(|e| ScenarioError::Setup(format!("encoding the result: {e}")))?;
            write(&json, &text)?;
            write(&html, report::html(&result).as_bytes())?;
            say(&format!(
                "{}  report: {}\n",
                report::summary(&result),
                html.display()
            ));
            let t = out.tally.entry(drill.name.clone()).or_default();
            t.1 += 1;
            if result.passed {
                t.0 += 1;
            }
            out.runs.push(result);
            out.reports.push((json, html));
        }
    }
    if out.runs.len() > 1 {
        let mut line = String::from("drills:");
        for (name, (passed, n)) in &out.tally {
            line.push_str(&format!(" {name} {passed}/{n} passed;"));
        }
        say(line.trim_end_matches(';'));
    }
    Ok(out)
}

/// Where run `i` (with `seed`) of `drill` writes its report in `dir`,
/// without the extension: `<drill>-<i>`, or, when an earlier run left a
/// report of that name (one report dir for many `drill run`s, which `drill
/// summary` reads together), `<drill>-<i>-seed<seed>`, then with `-2`, `-3`
/// ...: a report is never overwritten.
pub fn report_base(dir: &std::path::Path, drill: &str, i: usize, seed: u64) -> std::path::PathBuf {
    let taken = |base: &std::path::Path| {
        base.with_extension("json").exists() || base.with_extension("html").exists()
    };
    let first = dir.join(format!("{drill}-{i}"));
    if !taken(&first) {
        return first;
    }
    let with_seed = format!("{drill}-{i}-seed{seed}");
    let mut base = dir.join(&with_seed);
    let mut n = 2u64;
    while taken(&base) {
        base = dir.join(format!("{with_seed}-{n}"));
        n += 1;
    }
    base
}

#[cfg(test)]
mod tests {
    /// Runs into one report dir keep every report: the first run of a
    /// drill keeps the plain name, later ones take their seed, and a seed
    /// run again a number.
    #[test]
    fn reports_of_runs_into_one_dir_never_overwrite_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let mut names = Vec::new();
        for seed in [7, 8, 8, 8] {
            let base = super::report_base(dir.path(), "kill-seed", 1, seed);
            std::fs::write(base.with_extension("json"), "{}").unwrap();
            names.push(base.file_name().unwrap().to_string_lossy().into_owned());
        }
        assert_eq!(
            names,
            [
                "kill-seed-1",
                "kill-seed-1-seed8",
                "kill-seed-1-seed8-2",
                "kill-seed-1-seed8-3"
            ]
        );
        let other = super::report_base(dir.path(), "kill-seed", 2, 9);
        assert_eq!(other, dir.path().join("kill-seed-2"));
    }
}
