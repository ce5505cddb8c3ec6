//! `ringctl bench failover`: RTO of a real failover — kill -9 of the seed hosting
//! a control plane with many objects, until a client's first successful read on
//! the control plane restored from the bucket — split by phase, median of N; and
//! the RPO achieved while a writer creates ConfigMaps at a steady rate.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, PostParams};

use serde::Serialize;

use bootstrap::config::{Ports, RingConfig};
use bootstrap::{bootstrap, down, BootstrapError, BootstrapOptions, RingLayout};
use ringd::client::AdminClient;
use ringd::state::OperationStep;

/// One failover's figures (seconds from the kill).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverFigures {
    pub killed: String,
    pub target: String,
    /// The leader committed the failover (member declared down).
    pub decided_secs: f64,
    /// The old lease had ended; the target began restoring.
    pub restoring_secs: f64,
    /// The first successful read through the shoot's kubeconfig.
    pub first_read_secs: f64,
    /// The ring recorded the failover as done.
    pub done_secs: f64,
    /// The target's restore from the bucket (full snapshot + deltas), as it measured it.
    pub restore_secs: f64,
    /// The target's control plane start until `/readyz` and verification.
    pub start_secs: f64,
    /// Writes acknowledged by the killed control plane that the restore lacks.
    pub writes_lost: usize,
    /// Writes acknowledged in the run before the kill.
    pub writes_acked: usize,
    /// How far before the kill the oldest lost acknowledged write was (0 if none lost).
    pub rpo_secs: f64,
    /// Revisions the ring knew durable but the restore did not reach.
    pub detail: String,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverBench {
    pub objects: usize,
    /// Creates per second during each failover.
    pub rate: u64,
    pub runs: Vec<FailoverFigures>,
    pub median_rto_secs: f64,
    pub median_rpo_secs: f64,
    pub max_rpo_secs: f64,
}

/// Creates ConfigMaps labelled `load=<run>` at `rate` per second (at most 32 in
/// flight) until stopped; records when each acknowledged create was acknowledged.
struct Load {
    acked: Arc<Mutex<Vec<(String, Instant)>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(api: kube::Api<ConfigMap>, run: usize, rate: u64) -> Load {
        let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let (a, st) = (acked.clone(), stop.clone());
        let task = tokio::spawn(async move {
            if rate == 0 {
                return;
            }
            let slots = Arc::new(tokio::sync::Semaphore::new(32));
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            for i in 0u64.. {
                tokio::select! {
                    biased;
                    _ = st.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    continue; // the API is down or slow: this tick's write is not attempted
                };
                let (api, a) = (api.clone(), a.clone());
                tokio::spawn(async move {
                    let name = format!("load-{run}-{i}");
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            labels: Some([("load".to_string(), run.to_string())].into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let res = tokio::time::timeout(
                        Duration::from_secs(2),
                        api.create(&PostParams::default(), &cm),
                    )
                    .await;
                    if matches!(res, Ok(Ok(_))) {
                        if let Ok(mut v) = a.lock() {
                            v.push((name, Instant::now()));
                        }
                    }
                    drop(permit);
                });
            }
        });
        Load { acked, stop, task }
    }

    /// Stops writing; the acknowledged writes.
    async fn stop(self) -> Vec<(String, Instant)> {
        self.stop.cancel();
        let _ = self.task.await;
        // let writes in flight finish (each is bounded to 2 s)
        tokio::time::sleep(Duration::from_millis(2100)).await;
        self.acked.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Bootstraps a 3-member ring under `dir`, fills m2 with `objects` ConfigMaps,
/// then `runs` times kills the member hosting m2 and times the failover.
pub async fn failover_bench(
    dir: &Path,
    ringd: &Path,
    base_port: u16,
    objects: usize,
    runs: usize,
    rate: u64,
) -> Result<FailoverBench, BootstrapError> {
    let config = RingConfig {
        name: "benchfail".into(),
        ports: Ports {
            address: "127.0.0.1".into(),
            base: base_port,
        },
        nodes: bootstrap::config::Nodes { per_member: 0 },
        ..RingConfig::default()
    };
    let ring_dir = dir.join("ring");
    let _kill = bootstrap::KillRingOnDrop(bootstrap::RingLayout {
        dir: ring_dir.clone(),
    });
    let opts = BootstrapOptions {
        config: Some(config.clone()),
        dir: ring_dir.clone(),
        ringd: ringd.to_path_buf(),
        timeout: Duration::from_secs(300),
    };
    struct Quiet;
    impl bootstrap::Progress for Quiet {
        fn step(&self, _: &str) {}
        fn finished(&self, _: &str, _: Duration) {}
    }
    let layout = RingLayout {
        dir: ring_dir.clone(),
    };
    let result = async {
        bootstrap(&opts, &Quiet).await?;
        super::migrate::fill(&layout.kubeconfig("m2"), objects).await?;
        let client = seed::kubeconfig::client("m2", &layout.kubeconfig("m2"))
            .await
            .map_err(|e| BootstrapError::Ring(e.into()))?;
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client, "default");
        let mut out = Vec::new();
        for run in 0..runs {
            bootstrap(&opts, &Quiet).await?; // every member up, every control plane serving
            // the placement as the leader knows it once it sees every member up (a
            // member that just restarted may still hold an older view)
            let status = {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let mut seen = None;
                    for i in 0..config.members.len() {
                        let (address, pki) = (config.member_address(i), layout.pki());
                        if let Ok(mut c) = AdminClient::connect_leader(&address, &pki).await {
                            if let Ok(s) = c.status().await {
                                seen = Some(s);
                                break;
                            }
                        }
                    }
                    let all_up = seen.as_ref().is_some_and(|s| {
                        s.members
                            .iter()
                            .all(|m| m.state == ringd::state::MemberState::Up)
                    });
                    match seen {
                        Some(s) if all_up || Instant::now() > deadline => break s,
                        None if Instant::now() > deadline => {
                            return Err(BootstrapError::Unsupported(
                                "no member knows a leader after 60 s".into(),
                            ))
                        }
                        _ => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            };
            let host = status
                .placements
                .iter()
                .find(|p| p.shoot == "m2")
                .map(|p| p.host.clone())
                .unwrap_or_default();
            // wait until the ring knows a backup covering the fill
            let wanted = status
                .placements
                .iter()
                .find(|p| p.shoot == "m2")
                .and_then(|p| p.last_backup_revision);
            let observer = config
                .members
                .iter()
                .position(|m| m.name != host && m.name != "m2")
                .unwrap_or(0);
            let mut admin = AdminClient::connect(&config.member_address(observer), &layout.pki())?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let s = admin.status().await?;
                let rev = s
                    .placements
                    .iter()
                    .find(|p| p.shoot == "m2")
                    .and_then(|p| p.last_backup_revision);
                if rev.is_some() && rev >= wanted {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let pid = layout
                .running_pid(&host)
                .ok_or_else(|| BootstrapError::Unsupported(format!("{host} does not run")))?;
            // only operations started after the kill count (earlier runs left theirs)
            let seen = admin.status().await?.operations.iter().map(|o| o.id).max();
            // the RPO load runs for 3 s before the kill and on through the failover
            let load = Load::start(api.clone(), run, rate);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let killed = Instant::now();
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let (mut decided, mut restoring, mut first_read, mut done) = (None, None, None, None);
            let mut detail = String::new();
            let mut target = String::new();
            while done.is_none() || first_read.is_none() {
                if killed.elapsed() > Duration::from_secs(180) {
                    return Err(BootstrapError::Timeout {
                        step: format!("failover after killing {host}"),
                        waited_secs: 180,
                        detail: format!(
                            "decided {decided:?}, restoring {restoring:?}, read {first_read:?}; the ring says: {}; last lines of the members' logs:\n{}",
                            admin
                                .status()
                                .await
                                .ok()
                                .and_then(|s| serde_json::to_string(&(s.members, s.placements, s.operations)).ok())
                                .unwrap_or_default(),
                            config
                                .members
                                .iter()
                                .map(|m| format!("--- {}\n{}", m.name, seed::ShootLayout::tail(&layout.log(&m.name), 15)))
                                .collect::<Vec<_>>()
                                .join("\n")
                        ),
                    });
                }
                if first_read.is_none() {
                    let list = tokio::time::timeout(
                        Duration::from_millis(500),
                        api.list(&kube::api::ListParams::default().limit(1)),
                    )
                    .await;
                    if matches!(list, Ok(Ok(_))) && decided.is_some() {
                        first_read = Some(killed.elapsed().as_secs_f64());
                    }
                }
                if let Ok(s) = admin.status().await {
                    if let Some(op) = s
                        .operations
                        .iter()
                        .rev()
                        .find(|o| o.shoot() == "m2" && o.source() == host && Some(o.id) > seen)
                    {
                        target = op.target().to_string();
                        decided.get_or_insert(killed.elapsed().as_secs_f64());
                        if matches!(op.step, OperationStep::Restoring | OperationStep::Done) {
                            restoring.get_or_insert(killed.elapsed().as_secs_f64());
                        }
                        if op.step == OperationStep::Done {
                            done.get_or_insert(killed.elapsed().as_secs_f64());
                            detail = op.detail.clone();
                        }
                        if op.step == OperationStep::Failed {
                            return Err(BootstrapError::Unsupported(format!(
                                "failover failed: {}",
                                op.detail
                            )));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let acked = load.stop().await;
            let before: Vec<&(String, Instant)> =
                acked.iter().filter(|(_, at)| *at <= killed).collect();
            let present: std::collections::BTreeSet<String> = api
                .list(&ListParams::default().labels(&format!("load={run}")))
                .await
                .map_err(|e| BootstrapError::Ring(ringd::RingError::Transport(e.to_string())))?
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect();
            let lost: Vec<&&(String, Instant)> = before
                .iter()
                .filter(|(n, _)| !present.contains(n))
                .collect();
            let rpo_secs = lost
                .iter()
                .map(|(_, at)| killed.saturating_duration_since(*at).as_secs_f64())
                .fold(0.0, f64::max);
            let outcome = admin
                .status()
                .await?
                .operations
                .iter()
                .rev()
                .find(|o| o.shoot() == "m2" && o.source() == host && Some(o.id) > seen)
                .and_then(|o| o.outcome.clone())
                .unwrap_or_default();
            out.push(FailoverFigures {
                killed: host,
                target,
                decided_secs: decided.unwrap_or(0.0),
                restoring_secs: restoring.unwrap_or(0.0),
                first_read_secs: first_read.unwrap_or(0.0),
                done_secs: done.unwrap_or(0.0),
                restore_secs: outcome.restore_ms as f64 / 1000.0,
                start_secs: outcome.start_ms as f64 / 1000.0,
                writes_lost: lost.len(),
                writes_acked: before.len(),
                rpo_secs,
                detail,
            });
        }
        Ok(out)
    }
    .await;
    let _ = down(&ring_dir, Duration::from_secs(60)).await;
    let runs = result?;
    Ok(FailoverBench {
        objects,
        rate,
        median_rto_secs: median(runs.iter().map(|r| r.first_read_secs).collect()),
        median_rpo_secs: median(runs.iter().map(|r| r.rpo_secs).collect()),
        max_rpo_secs: runs.iter().map(|r| r.rpo_secs).fold(0.0, f64::max),
        runs,
    })
}

/// The figures as text.
pub fn render(b: &FailoverBench) -> String {
    let mut out = format!(
        "failover of a control plane with {} extra ConfigMaps, {} creates/s: kill -9 of its seed -> first successful read\n\
         median RTO {:.2} s over {} runs (goal <= 15 s); RPO median {:.2} s, worst {:.2} s (goal <= 1 s)\n",
        b.objects,
        b.rate,
        b.median_rto_secs,
        b.runs.len(),
        b.median_rpo_secs,
        b.max_rpo_secs
    );
    out.push_str("  run  kill->target  detected  lease-wait  restore  start+verify  first-read  done   lost/acked  RPO\n");
    for (i, r) in b.runs.iter().enumerate() {
        out.push_str(&format!(
            "  {:<4} {:<13} {:>7.1}s {:>10.1}s {:>7.1}s {:>12.1}s {:>10.1}s {:>5.1}s {:>5}/{:<6} {:.2}s\n",
            i + 1,
            format!("{}->{}", r.killed, r.target),
            r.decided_secs,
            (r.restoring_secs - r.decided_secs).max(0.0),
            r.restore_secs,
            r.start_secs,
            r.first_read_secs,
            r.done_secs,
            r.writes_lost,
            r.writes_acked,
            r.rpo_secs
        ));
    }
    out.push_str("  (detected: the leader committed the failover; lease-wait: until the old lease ended; restore/start: as the target measured them)\n");
    out
}
