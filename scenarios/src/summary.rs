//! Figures over many drill runs (`ringctl drill summary`): per drill and
//! build, how many runs passed and the range of what the runs measured, read
//! back from the JSON results `ringctl drill run` wrote.
//!
//! A shoot is *hit* in a run when the run lost its control plane (a `Loss`
//! event); its first outage that ends after the loss is the failover (or the
//! restore), its longest later one the move back. Every other shoot is a
//! bystander, counted from the run's first fault.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::result::{EventKind, RunResult};
use crate::ScenarioError;

/// Smallest and largest of a figure over runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Span {
    pub min: f64,
    pub max: f64,
}

impl Span {
    fn add(span: &mut Option<Span>, v: f64) {
        *span = Some(match *span {
            None => Span { min: v, max: v },
            Some(s) => Span {
                min: s.min.min(v),
                max: s.max.max(v),
            },
        });
    }
}

/// What the runs of one drill with one build measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrillSummary {
    pub drill: String,
    /// The build the runs used ([`build_digest`]); `None` for results written
    /// before runs recorded it.
    pub build: Option<String>,
    pub runs: usize,
    pub passed: usize,
    /// The runs' seeds, in the order read.
    pub seeds: Vec<u64>,
    /// Per run the longest first outage of a hit shoot (failover or restore).
    pub failover: Option<Span>,
    /// Per run the longest later outage of a hit shoot (the move back).
    pub move_back: Option<Span>,
    /// The longest outage of a shoot the faults did not hit, over every run.
    pub bystanders_max: f64,
    pub acked_writes: u64,
    /// Acknowledged writes lost that had to survive.
    pub lost_writes: u64,
    /// Acknowledged writes lost that were newer than the durable delta (allowed).
    pub lost_beyond_durable: u64,
    /// Runs in which two seeds served one shoot at once.
    pub double_serving_runs: usize,
    /// The first failure of each failed run: `seed S: reason`.
    pub failures: Vec<String>,
}

/// One summary per (drill, build), sorted by drill, then build.
pub fn summarize(results: &[RunResult]) -> Vec<DrillSummary> {
    let mut groups: BTreeMap<(String, Option<String>), DrillSummary> = BTreeMap::new();
    for r in results {
        let key = (r.drill.clone(), r.build.clone());
        let s = groups.entry(key).or_insert_with(|| DrillSummary {
            drill: r.drill.clone(),
            build: r.build.clone(),
            ..Default::default()
        });
        add_run(s, r);
    }
    groups.into_values().collect()
}

fn add_run(s: &mut DrillSummary, r: &RunResult) {
    s.runs += 1;
    s.seeds.push(r.seed);
    if r.passed {
        s.passed += 1;
    } else {
        let why = r.failures.first().map_or("no reason recorded", |f| f);
        s.failures.push(format!("seed {}: {why}", r.seed));
    }
    if !r.double_serving.is_empty() {
        s.double_serving_runs += 1;
    }
    let outages = RunOutages::of(r);
    if let Some(v) = outages.failover {
        Span::add(&mut s.failover, v);
    }
    if let Some(v) = outages.move_back {
        Span::add(&mut s.move_back, v);
    }
    s.bystanders_max = s.bystanders_max.max(outages.bystanders);
    for shoot in &r.shoots {
        s.acked_writes += shoot.acked_writes;
        s.lost_writes += shoot.lost_writes;
        s.lost_beyond_durable += shoot.lost_beyond_durable;
    }
}

/// The outages of one run, split as the module docs say.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RunOutages {
    failover: Option<f64>,
    move_back: Option<f64>,
    bystanders: f64,
}

impl RunOutages {
    fn of(r: &RunResult) -> Self {
        let first_loss = |shoot: &str| {
            r.events.iter().find_map(|e| match &e.kind {
                EventKind::Loss { shoot: s, .. } if s == shoot => Some(e.t),
                _ => None,
            })
        };
        let first_fault = r
            .events
            .iter()
            .find(|e| matches!(e.kind, EventKind::Fault { .. }))
            .map_or(0.0, |e| e.t);
        let mut out = RunOutages {
            failover: None,
            move_back: None,
            bystanders: 0.0,
        };
        for shoot in &r.shoots {
            let len = |&(a, b): &(f64, f64)| b - a;
            match first_loss(&shoot.shoot) {
                Some(lost) => {
                    let mut after = shoot.outages.iter().filter(|(_, end)| *end >= lost);
                    if let Some(first) = after.next() {
                        out.failover = Some(out.failover.unwrap_or(0.0).max(len(first)));
                    }
                    if let Some(back) = after.map(len).reduce(f64::max) {
                        out.move_back = Some(out.move_back.unwrap_or(0.0).max(back));
                    }
                }
                None => {
                    let longest = shoot
                        .outages
                        .iter()
                        .filter(|(_, end)| *end >= first_fault)
                        .map(len)
                        .fold(0.0, f64::max);
                    out.bystanders = out.bystanders.max(longest);
                }
            }
        }
        out
    }
}

/// What [`load_results`] read.
#[derive(Debug, Default)]
pub struct Loaded {
    pub results: Vec<RunResult>,
    /// Per JSON file that is not a drill result, its path and why (a report
    /// folder may hold other JSON).
    pub skipped: Vec<(PathBuf, String)>,
}

/// Every drill result (`*.json` holding a [`RunResult`]) under `paths`
/// (files, or folders searched recursively).
pub fn load_results(paths: &[PathBuf]) -> Result<Loaded, ScenarioError> {
    let mut files = Vec::new();
    for p in paths {
        collect_json(p, &mut files)?;
    }
    files.sort();
    let mut loaded = Loaded::default();
    for f in files {
        let text = std::fs::read(&f).map_err(|source| ScenarioError::Io {
            what: format!("reading {}", f.display()),
            source,
        })?;
        match serde_json::from_slice::<RunResult>(&text) {
            Ok(r) => loaded.results.push(r),
            Err(e) => loaded.skipped.push((f, format!("not a drill result: {e}"))),
        }
    }
    Ok(loaded)
}

fn collect_json(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), ScenarioError> {
    let io = |source| ScenarioError::Io {
        what: format!("reading {}", path.display()),
        source,
    };
    if !path.is_dir() {
        // a file given by name is read even without the extension; a missing
        // one fails with its path
        std::fs::metadata(path).map_err(io)?;
        out.push(path.to_path_buf());
        return Ok(());
    }
    for entry in std::fs::read_dir(path).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.is_dir() {
            collect_json(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "json") {
            out.push(p);
        }
    }
    Ok(())
}

/// What identifies the build a drill ran: the first 12 hex digits of SHA-256
/// over the name, length and bytes of each file (ringctl, ringd, ring-node),
/// in order; a missing file counts by its name alone.
pub fn build_digest(files: &[PathBuf]) -> Result<String, ScenarioError> {
    let mut h = Sha256::new();
    for f in files {
        h.update(f.file_name().map_or(b"" as &[u8], |n| n.as_encoded_bytes()));
        let io = |source| ScenarioError::Io {
            what: format!("reading {} for the build digest", f.display()),
            source,
        };
        // streamed: the debug binaries are tens of MiB each
        match std::fs::File::open(f) {
            Ok(mut file) => {
                h.update(file.metadata().map_err(io)?.len().to_le_bytes());
                std::io::copy(&mut file, &mut h).map_err(io)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => h.update(b"missing"),
            Err(source) => return Err(io(source)),
        }
    }
    let digest = h.finalize();
    Ok(digest.iter().take(6).map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
