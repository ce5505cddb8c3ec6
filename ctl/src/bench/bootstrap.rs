//! `ringctl bench bootstrap`: wall time of `ringctl bootstrap` per step, and the
//! ring's peak memory (every ringd and every hosted control plane process).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use bootstrap::config::{MemberSpec, Ports, RingConfig};
use bootstrap::{bootstrap, down, BootstrapError, BootstrapOptions, KillRingOnDrop, RingLayout};

use super::Quiet;

/// One bootstrap's figures.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapFigures {
    pub members: usize,
    pub total_secs: f64,
    /// (step, seconds) in order.
    pub steps: Vec<(String, f64)>,
    /// Peak of the summed resident memory of all the ring's processes (MiB).
    pub peak_rss_mib: f64,
}

/// Summed VmRSS (KiB) of live processes whose command line mentions `dir`.
fn ring_rss_kib(dir: &Path) -> u64 {
    let needle = dir.as_os_str().as_encoded_bytes().to_vec();
    let mut total = 0;
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
        if !cmd.windows(needle.len()).any(|w| w == needle.as_slice())
            || !seed::process::pid_alive(pid)
        {
            continue;
        }
        total += seed::process::rss_kib(pid).unwrap_or(0);
    }
    total
}

/// Bootstraps a fresh local ring of each size under `dir`, measures it, and takes it down.
pub async fn bootstrap_bench(
    dir: &Path,
    sizes: &[usize],
    ringd: &Path,
    base_port: u16,
) -> Result<Vec<BootstrapFigures>, BootstrapError> {
    let mut out = Vec::new();
    for &n in sizes {
        let ring_dir: PathBuf = dir.join(format!("ring-{n}"));
        let _kill = KillRingOnDrop(RingLayout {
            dir: ring_dir.clone(),
        });
        let config = RingConfig {
            name: format!("bench{n}"),
            members: (1..=n)
                .map(|i| MemberSpec::local(format!("m{i}")))
                .collect(),
            ports: Ports {
                address: "127.0.0.1".into(),
                base: base_port,
            },
            ..RingConfig::default()
        };
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, stop, ring_dir) = (peak.clone(), stop.clone(), ring_dir.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(ring_rss_kib(&ring_dir), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let opts = BootstrapOptions {
            config: Some(config),
            dir: ring_dir.clone(),
            ringd: ringd.to_path_buf(),
            timeout: Duration::from_secs(300),
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
        out.push(BootstrapFigures {
            members: n,
            total_secs: report.total_secs,
            steps: report.steps,
            peak_rss_mib: peak.load(Ordering::Relaxed) as f64 / 1024.0,
        });
        let _ = std::fs::remove_dir_all(&ring_dir);
    }
    Ok(out)
}

/// The figures as text.
pub fn render(figures: &[BootstrapFigures]) -> String {
    let mut out = String::from(
        "ringctl bootstrap from an empty dir (goal: < 60 s for 3 members on 2 cores):\n",
    );
    for f in figures {
        out.push_str(&format!(
            "\n{} members: {:.1} s in all, peak RSS of the whole ring {:.0} MiB\n",
            f.members, f.total_secs, f.peak_rss_mib
        ));
        for (step, secs) in &f.steps {
            out.push_str(&format!("  {step:<24} {secs:>6.2} s\n"));
        }
    }
    out
}
