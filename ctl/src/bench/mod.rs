//! Benchmark drivers of `ringctl bench`: `controlplane` here (and `raft`),
//! `failover` and `migrate` in their modules.
//!
//! `ringctl bench controlplane`: how fast a hosted control plane becomes ready
//! and how much memory its components take.

pub mod failover;
pub mod migrate;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use seed::{wait_ready, Component, ControlPlaneSpec, Seed};
use serde::Serialize;

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

/// Median of a non-empty list (mean of the middle two for even lengths); 0 when empty.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
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
        let figures = RunFigures {
            cold_ready_secs: cold,
            warm_ready_secs: warm,
            peak_rss_mib,
        };
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

/// A fresh directory for benchmark state under the system temp dir.
pub fn temp_state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("ring-bench-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}

/// Options of the Raft benchmark.
#[derive(Debug, Clone)]
pub struct RaftBenchOptions {
    /// Ring sizes to measure (e.g. 3 and 5).
    pub sizes: Vec<usize>,
    /// Sequential proposals per size.
    pub proposals: usize,
    /// Leader kills per size (each followed by a restart of the killed member).
    pub kills: usize,
    /// Seconds of idling over which CPU use is measured.
    pub idle_secs: u64,
    /// The ringd binary.
    pub ringd: PathBuf,
    /// Where the throwaway rings live.
    pub dir: PathBuf,
}

/// Figures for one ring size.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RaftFigures {
    pub members: usize,
    pub commit_p50_ms: f64,
    pub commit_p99_ms: f64,
    /// The same sequential-write loop against an etcd cluster of the same size (reference).
    pub etcd_put_p50_ms: f64,
    pub etcd_put_p99_ms: f64,
    /// Each leader kill: time until a survivor saw a new leader commit (ms).
    pub leader_kill_to_commit_ms: Vec<f64>,
    pub median_leader_kill_to_commit_ms: f64,
    /// Resident memory of each ringd after the run (MiB), and the largest.
    pub max_rss_mib: f64,
    /// CPU of one idle ringd, percent of one core (mean over members).
    pub idle_cpu_percent: f64,
}

fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

fn proc_stat(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based) of stat, i.e. 11 and 12 after the comm.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((rss_kib / 1024.0, ticks / hz))
}

struct Procs(Vec<Option<std::process::Child>>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn measure_ring(opts: &RaftBenchOptions, n: usize) -> Result<(Vec<f64>, Vec<f64>, f64, f64)> {
    use ringd::client::AdminClient;
    let dir = opts.dir.join(format!("ring-{n}"));
    let ring = ringd::localring::LocalRing::write(&dir, n, &[], ringd::config::Timing::default())?;
    let mut procs = Procs(
        (0..n)
            .map(|i| ring.spawn(&opts.ringd, i).map(Some))
            .collect::<Result<_>>()?,
    );
    let status_of = |i: usize| AdminClient::connect(&ring.members[i].address, &ring.pki);
    let wait = |i: usize| {
        ringd::client::wait_status(
            &ring.members[i].address,
            &ring.pki,
            Duration::from_secs(30),
            |s| s.leader.is_some() && !s.members.is_empty(),
        )
    };
    wait(0).await?;
    let mut client = status_of(0)?;
    // warm up, then sequential proposals
    for _ in 0..20 {
        let _ = client.probe(vec![0; 64]).await;
    }
    let mut lat = Vec::new();
    for _ in 0..opts.proposals {
        let t = Instant::now();
        client.probe(vec![0; 64]).await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    // idle CPU and memory
    let pids: Vec<u32> = procs.0.iter().flatten().map(|c| c.id()).collect();
    let before: Vec<(f64, f64)> = pids.iter().filter_map(|p| proc_stat(*p)).collect();
    tokio::time::sleep(Duration::from_secs(opts.idle_secs)).await;
    let after: Vec<(f64, f64)> = pids.iter().filter_map(|p| proc_stat(*p)).collect();
    let cpu: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| 100.0 * (a.1 - b.1) / opts.idle_secs as f64)
        .collect();
    let idle_cpu = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
    let max_rss = after.iter().map(|a| a.0).fold(0.0, f64::max);
    // leader kills
    let mut kills = Vec::new();
    for _ in 0..opts.kills {
        let s = status_of(0)?.status().await?;
        let leader_name = s.leader.clone().unwrap_or_default();
        let Some(leader) = ring.members.iter().position(|m| m.name == leader_name) else {
            break;
        };
        let survivor = (leader + 1) % n;
        let before = status_of(survivor)?.status().await?;
        let t = Instant::now();
        if let Some(mut c) = procs.0[leader].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut sc = status_of(survivor)?;
        loop {
            if let Ok(s) = sc.status().await {
                if s.leader.as_ref().is_some_and(|l| *l != leader_name)
                    && s.term > before.term
                    && s.commit_index > before.commit_index
                {
                    kills.push(t.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err(ringd::RingError::Transport(
                    "no new leader within 30s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        procs.0[leader] = Some(ring.spawn(&opts.ringd, leader)?);
        ringd::client::wait_status(
            &ring.members[leader].address,
            &ring.pki,
            Duration::from_secs(30),
            |s| s.leader.is_some() && s.quorum_contact,
        )
        .await?;
        // let the ring settle (the returned member catches up and reports) before the next kill
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    drop(procs);
    Ok((lat, kills, max_rss, idle_cpu))
}

/// Sequential puts against an etcd cluster of `n` members on loopback (plain HTTP),
/// measured with the same loop as ringd's proposals.
async fn measure_etcd(opts: &RaftBenchOptions, n: usize) -> Result<Vec<f64>> {
    let etcd = seed::BinarySearch::standard(None).find("etcd")?;
    let dir = opts.dir.join(format!("etcd-{n}"));
    let ports: Vec<(u16, u16)> = (0..n)
        .map(|_| {
            Ok((
                ringd::localring::free_port()?,
                ringd::localring::free_port()?,
            ))
        })
        .collect::<Result<_>>()?;
    let cluster = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut procs = Procs(Vec::new());
    for (i, (client, peer)) in ports.iter().enumerate() {
        let data = dir.join(format!("e{i}"));
        let child = std::process::Command::new(&etcd)
            .args([
                format!("--name=e{i}"),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster={cluster}"),
                "--initial-cluster-state=new".into(),
                "--log-level=error".into(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|source| ringd::RingError::Io {
                what: format!("starting {}", etcd.display()),
                source,
            })?;
        procs.0.push(Some(child));
    }
    let endpoint = format!("http://127.0.0.1:{}", ports[0].0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = loop {
        if let Ok(mut c) = etcd_client::Client::connect([endpoint.as_str()], None).await {
            if c.put("warmup", "x", None).await.is_ok() {
                break c;
            }
        }
        if Instant::now() >= deadline {
            return Err(ringd::RingError::Transport(
                "the reference etcd cluster did not start within 30s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for _ in 0..20 {
        let _ = client.put("k", vec![0u8; 64], None).await;
    }
    let mut lat = Vec::new();
    for _ in 0..opts.proposals {
        let t = Instant::now();
        client
            .put("k", vec![0u8; 64], None)
            .await
            .map_err(|e| ringd::RingError::Transport(format!("etcd put: {e}")))?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    drop(procs);
    Ok(lat)
}

/// Commit latency, leader-kill recovery, memory and idle CPU of real ringd rings,
/// with etcd clusters of the same sizes as the reference.
pub async fn raft(opts: &RaftBenchOptions) -> Result<Vec<RaftFigures>> {
    let mut out = Vec::new();
    for &n in &opts.sizes {
        let (lat, kills, max_rss, idle_cpu) = measure_ring(opts, n).await?;
        let etcd = measure_etcd(opts, n).await?;
        out.push(RaftFigures {
            members: n,
            commit_p50_ms: percentile(&lat, 50.0),
            commit_p99_ms: percentile(&lat, 99.0),
            etcd_put_p50_ms: percentile(&etcd, 50.0),
            etcd_put_p99_ms: percentile(&etcd, 99.0),
            median_leader_kill_to_commit_ms: median(kills.clone()),
            leader_kill_to_commit_ms: kills,
            max_rss_mib: max_rss,
            idle_cpu_percent: idle_cpu,
        });
    }
    Ok(out)
}

/// The Raft benchmark as a table.
pub fn render_raft(figures: &[RaftFigures]) -> String {
    let mut t = table(&["FIGURE", "RINGD", "ETCD (REFERENCE)", "RATIO", "GOAL"]);
    for f in figures {
        let n = f.members;
        t.add_row(vec![
            format!("{n} members: commit p50 (ms)"),
            format!("{:.2}", f.commit_p50_ms),
            format!("{:.2}", f.etcd_put_p50_ms),
            format!("{:.2}x", f.commit_p50_ms / f.etcd_put_p50_ms.max(1e-9)),
            String::new(),
        ]);
        t.add_row(vec![
            format!("{n} members: commit p99 (ms)"),
            format!("{:.2}", f.commit_p99_ms),
            format!("{:.2}", f.etcd_put_p99_ms),
            format!("{:.2}x", f.commit_p99_ms / f.etcd_put_p99_ms.max(1e-9)),
            String::new(),
        ]);
        t.add_row(vec![
            format!("{n} members: leader kill -> new leader committed (ms, median)"),
            format!(
                "{:.0} ({})",
                f.median_leader_kill_to_commit_ms,
                f.leader_kill_to_commit_ms
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            "-".into(),
            "-".into(),
            "<= 3000 (3x election timeout)".into(),
        ]);
        t.add_row(vec![
            format!("{n} members: ringd RSS, largest (MiB)"),
            format!("{:.1}", f.max_rss_mib),
            "-".into(),
            "-".into(),
            "< 40".into(),
        ]);
        t.add_row(vec![
            format!("{n} members: idle CPU per ringd (% of a core)"),
            format!("{:.2}", f.idle_cpu_percent),
            "-".into(),
            "-".into(),
            "< 1".into(),
        ]);
    }
    format!("Raft benchmark (sequential proposals of 64 bytes over mTLS gRPC; etcd: sequential 64-byte puts over plain HTTP):\n{t}\n")
}
