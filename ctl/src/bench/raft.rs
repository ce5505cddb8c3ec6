//! `ringctl bench raft`: commit latency of real ringd rings (against an etcd
//! cluster of the same size), leader-kill recovery, ringd memory and idle CPU.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringd::client::AdminClient;
use ringd::localring::LocalRing;
use serde::Serialize;

use super::{median, percentile};
use crate::output::table;
use ringd::Result;

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

/// What one ring size measured.
struct RingFigures {
    /// Commit latency of each proposal (ms).
    latencies: Vec<f64>,
    /// Each leader kill until a survivor saw a new leader commit (ms).
    kills: Vec<f64>,
    max_rss_mib: f64,
    idle_cpu_percent: f64,
}

/// A ring of `n` real ringd processes: commit latency, idle CPU and memory, then leader kills.
async fn measure_ring(opts: &RaftBenchOptions, n: usize) -> Result<RingFigures> {
    let dir = opts.dir.join(format!("ring-{n}"));
    let ring = LocalRing::write(&dir, n, &[], ringd::config::Timing::default())?;
    let mut procs = Procs(
        (0..n)
            .map(|i| ring.spawn(&opts.ringd, i).map(Some))
            .collect::<Result<_>>()?,
    );
    ringd::client::wait_status(
        &ring.members[0].address,
        &ring.pki,
        Duration::from_secs(30),
        |s| s.leader.is_some() && !s.members.is_empty(),
    )
    .await?;
    let latencies = commit_latencies(&mut admin(&ring, 0)?, opts.proposals).await?;
    let pids: Vec<u32> = procs.0.iter().flatten().map(|c| c.id()).collect();
    let (max_rss_mib, idle_cpu_percent) = idle_usage(&pids, opts.idle_secs).await;
    let mut kills = Vec::new();
    for _ in 0..opts.kills {
        match kill_leader(opts, &ring, &mut procs).await? {
            Some(ms) => kills.push(ms),
            None => break,
        }
    }
    drop(procs);
    Ok(RingFigures {
        latencies,
        kills,
        max_rss_mib,
        idle_cpu_percent,
    })
}

fn admin(ring: &LocalRing, i: usize) -> Result<AdminClient> {
    AdminClient::connect(&ring.members[i].address, &ring.pki)
}

/// After a warm-up, `proposals` sequential 64-byte proposals: each one's latency (ms).
async fn commit_latencies(client: &mut AdminClient, proposals: usize) -> Result<Vec<f64>> {
    for _ in 0..20 {
        let _ = client.probe(vec![0; 64]).await;
    }
    let mut lat = Vec::new();
    for _ in 0..proposals {
        let t = Instant::now();
        client.probe(vec![0; 64]).await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(lat)
}

/// The largest resident memory (MiB) of `pids` and their mean CPU (percent of a
/// core) over `idle_secs` of idling.
async fn idle_usage(pids: &[u32], idle_secs: u64) -> (f64, f64) {
    let before: Vec<(f64, f64)> = pids.iter().filter_map(|p| proc_stat(*p)).collect();
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let after: Vec<(f64, f64)> = pids.iter().filter_map(|p| proc_stat(*p)).collect();
    let cpu: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| 100.0 * (a.1 - b.1) / idle_secs as f64)
        .collect();
    let idle_cpu = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
    let max_rss = after.iter().map(|a| a.0).fold(0.0, f64::max);
    (max_rss, idle_cpu)
}

/// Kills the leader, times until a survivor sees a new leader commit (ms), then
/// restarts the killed member and lets the ring settle. `None`: no leader known.
async fn kill_leader(
    opts: &RaftBenchOptions,
    ring: &LocalRing,
    procs: &mut Procs,
) -> Result<Option<f64>> {
    let n = ring.members.len();
    let s = admin(ring, 0)?.status().await?;
    let leader_name = s.leader.clone().unwrap_or_default();
    let Some(leader) = ring.members.iter().position(|m| m.name == leader_name) else {
        return Ok(None);
    };
    let survivor = (leader + 1) % n;
    let before = admin(ring, survivor)?.status().await?;
    let t = Instant::now();
    if let Some(mut c) = procs.0[leader].take() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let mut sc = admin(ring, survivor)?;
    let took = loop {
        if let Ok(s) = sc.status().await {
            if s.leader.as_ref().is_some_and(|l| *l != leader_name)
                && s.term > before.term
                && s.commit_index > before.commit_index
            {
                break t.elapsed().as_secs_f64() * 1000.0;
            }
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(ringd::RingError::Transport(
                "no new leader within 30s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
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
    Ok(Some(took))
}

/// Sequential puts against an etcd cluster of `n` members on loopback (plain HTTP),
/// measured with the same loop as ringd's proposals.
async fn measure_etcd(opts: &RaftBenchOptions, n: usize) -> Result<Vec<f64>> {
    let etcd = seed::BinarySearch::standard(None).find("etcd")?;
    let dir = opts.dir.join(format!("etcd-{n}"));
    let ports: Vec<(u16, u16)> = ringd::localring::free_ports(2 * n)?
        .chunks(2)
        .map(|p| (p[0], p[1]))
        .collect();
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
        let ring = measure_ring(opts, n).await?;
        let etcd = measure_etcd(opts, n).await?;
        out.push(RaftFigures {
            members: n,
            commit_p50_ms: percentile(&ring.latencies, 50.0),
            commit_p99_ms: percentile(&ring.latencies, 99.0),
            etcd_put_p50_ms: percentile(&etcd, 50.0),
            etcd_put_p99_ms: percentile(&etcd, 99.0),
            median_leader_kill_to_commit_ms: median(ring.kills.clone()),
            leader_kill_to_commit_ms: ring.kills,
            max_rss_mib: ring.max_rss_mib,
            idle_cpu_percent: ring.idle_cpu_percent,
        });
    }
    Ok(out)
}

/// The Raft benchmark as a table.
pub fn render(figures: &[RaftFigures]) -> String {
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
