//! `ringctl bench bootstrap`: wall time of `ringctl bootstrap` per step, and the
//! ring's peak memory (every ringd, node and control plane process, pods
//! included), for self-hosted and process-hosted rings in one run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use bootstrap::config::{MemberSpec, Ports, RingConfig};
use bootstrap::{bootstrap, down, BootstrapError, BootstrapOptions, KillRingOnDrop, RingLayout};

use super::Quiet;

/// Where a benchmarked ring's control planes end up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
pub enum Hosting {
    /// Every member hosts its successor as pods on its own node (`selfHosting`).
    #[value(name = "self")]
    SelfHosted,
    /// Control planes as processes next to ringd (the nodes still start).
    Processes,
}

/// One bootstrap's figures.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapFigures {
    pub members: usize,
    pub hosting: Hosting,
    pub total_secs: f64,
    /// (step, seconds) in order.
    pub steps: Vec<(String, f64)>,
    /// Peak of the summed resident memory of all the ring's processes (MiB).
    pub peak_rss_mib: f64,
}

/// Summed VmRSS (KiB) of the ring's live processes: those whose command line
/// mentions `dir` (ringd, control-plane processes, node daemons) and every
/// pod and containerd shim of its nodes.
fn ring_rss_kib(layout: &RingLayout) -> u64 {
    let dir = &layout.dir;
    let needle = dir.as_os_str().as_encoded_bytes().to_vec();
    let mut pids: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    if let Some(config) = layout.read_config().ok().flatten() {
        for node in bootstrap::nodes::node_names(&config) {
            let Some(n) = bootstrap::nodes::node_config(layout, &node) else {
                continue;
            };
            pids.extend(
                seed::node::teardown::pod_pids(&n.cgroup_root)
                    .into_iter()
                    .map(|p| p as u32),
            );
            pids.extend(
                seed::node::teardown::shim_pids(&n.layout().containerd_socket())
                    .into_iter()
                    .map(|p| p as u32),
            );
        }
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmd.windows(needle.len()).any(|w| w == needle.as_slice()) {
            pids.insert(pid);
        }
    }
    pids.into_iter()
        .filter(|p| seed::process::pid_alive(*p))
        .map(|p| seed::process::rss_kib(p).unwrap_or(0))
        .sum()
}

/// Bootstraps a fresh local ring of each size under `dir`, measures it, and takes it down.
pub async fn bootstrap_bench(
    dir: &Path,
    sizes: &[usize],
    hostings: &[Hosting],
    ringd: &Path,
    base_port: u16,
) -> Result<Vec<BootstrapFigures>, BootstrapError> {
    let mut out = Vec::new();
    for &n in sizes {
        for &hosting in hostings {
            out.push(bootstrap_once(dir, n, hosting, ringd, base_port).await?);
        }
    }
    Ok(out)
}

/// Bootstraps one fresh ring of `n` members, measures it, and takes it down.
async fn bootstrap_once(
    dir: &Path,
    n: usize,
    hosting: Hosting,
    ringd: &Path,
    base_port: u16,
) -> Result<BootstrapFigures, BootstrapError> {
    let ring_dir: PathBuf = dir.join(format!("ring-{n}-{hosting:?}"));
    let _kill = KillRingOnDrop(RingLayout {
        dir: ring_dir.clone(),
    });
    let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
    let config = RingConfig {
        name: format!("bench{n}"),
        members: names.iter().map(MemberSpec::local).collect(),
        ports: Ports {
            address: "127.0.0.1".into(),
            base: base_port,
        },
        self_hosting: bootstrap::config::SelfHosting {
            members: match hosting {
                Hosting::SelfHosted => names,
                Hosting::Processes => Vec::new(),
            },
        },
        ..RingConfig::default()
    };
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        let layout = RingLayout {
            dir: ring_dir.clone(),
        };
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(ring_rss_kib(&layout), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let opts = BootstrapOptions {
        config: Some(config),
        dir: ring_dir.clone(),
        ringd: ringd.to_path_buf(),
        timeout: Duration::from_secs(900),
        generate_bucket_key: true,
    };
    let report = bootstrap(&opts, &Quiet).await;
    // a few seconds of steady state: controllers settle, leases renew
    if report.is_ok() {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let _ = down(&ring_dir, Duration::from_secs(60)).await;
    let report = report?;
    let _ = std::fs::remove_dir_all(&ring_dir);
    Ok(BootstrapFigures {
        members: n,
        hosting,
        total_secs: report.total_secs,
        steps: report.steps,
        peak_rss_mib: peak.load(Ordering::Relaxed) as f64 / 1024.0,
    })
}

/// The figures as text.
pub fn render(figures: &[BootstrapFigures]) -> String {
    let mut out = String::from(
        "ringctl bootstrap from an empty dir (goal: < 60 s for 3 members on 2 cores):\n",
    );
    for f in figures {
        let hosting = match f.hosting {
            Hosting::SelfHosted => "self-hosted (every control plane in pods)",
            Hosting::Processes => "process-hosted",
        };
        out.push_str(&format!(
            "\n{} members, {hosting}: {:.1} s in all, peak RSS of the whole ring {:.0} MiB ({:.0} MiB per member)\n",
            f.members,
            f.total_secs,
            f.peak_rss_mib,
            f.peak_rss_mib / f.members as f64
        ));
        for (step, secs) in &f.steps {
            out.push_str(&format!("  {step:<24} {secs:>6.2} s\n"));
        }
    }
    out
}
