//! `ringctl bench failover`: RTO of a real failover — kill -9 of the seed hosting
//! a control plane with many objects, until a client's first successful read on
//! the control plane restored from the bucket — split by phase, median of N.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{Ports, RingConfig};
use crate::{bootstrap, down, BootstrapError, BootstrapOptions, RingLayout};
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
    /// Revisions the ring knew durable but the restore did not reach.
    pub detail: String,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverBench {
    pub objects: usize,
    pub runs: Vec<FailoverFigures>,
    pub median_rto_secs: f64,
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
) -> Result<FailoverBench, BootstrapError> {
    let config = RingConfig {
        name: "benchfail".into(),
        ports: Ports {
            address: "127.0.0.1".into(),
            base: base_port,
        },
        ..RingConfig::default()
    };
    let ring_dir = dir.join("ring");
    let opts = BootstrapOptions {
        config: Some(config.clone()),
        dir: ring_dir.clone(),
        ringd: ringd.to_path_buf(),
        timeout: Duration::from_secs(300),
    };
    struct Quiet;
    impl crate::Progress for Quiet {
        fn step(&self, _: &str) {}
        fn finished(&self, _: &str, _: Duration) {}
    }
    let layout = RingLayout {
        dir: ring_dir.clone(),
    };
    let result = async {
        bootstrap(&opts, &Quiet).await?;
        crate::migrate_bench::fill(&layout.kubeconfig("m2"), objects).await?;
        let client = seed::kubeconfig::client("m2", &layout.kubeconfig("m2"))
            .await
            .map_err(|e| BootstrapError::Ring(e.into()))?;
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client, "default");
        let mut out = Vec::new();
        for _ in 0..runs {
            bootstrap(&opts, &Quiet).await?; // every member up, every control plane serving
            let status = crate::ring_status(&layout, &config).await?;
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
                            "decided {decided:?}, restoring {restoring:?}, read {first_read:?}"
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
                        .find(|o| o.shoot() == "m2" && o.source() == host)
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
            out.push(FailoverFigures {
                killed: host,
                target,
                decided_secs: decided.unwrap_or(0.0),
                restoring_secs: restoring.unwrap_or(0.0),
                first_read_secs: first_read.unwrap_or(0.0),
                done_secs: done.unwrap_or(0.0),
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
        median_rto_secs: median(runs.iter().map(|r| r.first_read_secs).collect()),
        runs,
    })
}

/// The figures as text.
pub fn render(b: &FailoverBench) -> String {
    let mut out = format!(
        "failover of a control plane with {} extra ConfigMaps: kill -9 of its seed -> first successful read (goal <= 15 s)\nmedian RTO {:.2} s over {} runs\n",
        b.objects,
        b.median_rto_secs,
        b.runs.len()
    );
    for r in &b.runs {
        out.push_str(&format!(
            "  kill {} -> {}: decided {:.1} s, lease ended / restoring {:.1} s, first read {:.1} s, done {:.1} s; {}\n",
            r.killed, r.target, r.decided_secs, r.restoring_secs, r.first_read_secs, r.done_secs, r.detail
        ));
    }
    out
}
