//! `ringctl bench migrate`: planned migration time of a control plane holding
//! many objects, split by step, median of N moves, in a real local ring.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use bootstrap::config::{Ports, RingConfig};
use bootstrap::{bootstrap, down, BootstrapError, BootstrapOptions, RingLayout};
use ringd::client::AdminClient;
use ringd::state::OperationStep;

/// One move's figures.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveFigures {
    pub from: String,
    pub to: String,
    /// Source: stop writers, final snapshot, handover committed.
    pub handover_secs: f64,
    /// Target: fetch, restore, lease, start, verify, done.
    pub restore_secs: f64,
    pub total_secs: f64,
    pub revision: i64,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrateBench {
    pub objects: usize,
    pub moves: Vec<MoveFigures>,
    pub median_total_secs: f64,
    pub median_handover_secs: f64,
    pub median_restore_secs: f64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Bootstraps a 3-member ring under `dir`, writes `objects` ConfigMaps into m2's
/// control plane with kubectl-compatible API calls, then moves m2 `runs` times
/// around the ring, timing each move.
pub async fn migrate_bench(
    dir: &Path,
    ringd: &Path,
    base_port: u16,
    objects: usize,
    runs: usize,
) -> Result<MigrateBench, BootstrapError> {
    let config = RingConfig {
        name: "benchmig".into(),
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
    let result = async {
        bootstrap(&opts, &Quiet).await?;
        let layout = RingLayout {
            dir: ring_dir.clone(),
        };
        fill(&layout.kubeconfig("m2"), objects).await?;
        let mut moves = Vec::new();
        for i in 0..runs {
            let status = bootstrap::ring_status(&layout, &config).await?;
            let from = status
                .placements
                .iter()
                .find(|p| p.shoot == "m2")
                .map(|p| p.host.clone())
                .unwrap_or_default();
            // alternate between m1 and m3 (never m2 itself)
            let to = if from == "m1" { "m3" } else { "m1" }.to_string();
            let leader = status.leader.clone().unwrap_or_default();
            let address = status
                .members
                .iter()
                .find(|m| m.name == leader)
                .map(|m| m.address.clone())
                .unwrap_or_else(|| config.member_address(0));
            let mut admin = AdminClient::connect(&address, &layout.pki())?;
            let started = Instant::now();
            let id = admin.migrate("m2", &to).await?;
            let mut handover = 0.0;
            let op = admin
                .wait_operation(id, Duration::from_secs(300), |op, t| {
                    if op.step == OperationStep::Restoring {
                        handover = t.as_secs_f64();
                    }
                })
                .await?;
            let total = started.elapsed().as_secs_f64();
            if op.step != OperationStep::Done {
                return Err(BootstrapError::Timeout {
                    step: format!("migration {i}"),
                    waited_secs: 300,
                    detail: op.detail,
                });
            }
            let revision = match op.kind {
                ringd::state::OperationKind::Migration { revision, .. } => revision.unwrap_or(0),
                _ => 0,
            };
            moves.push(MoveFigures {
                from,
                to,
                handover_secs: handover,
                restore_secs: total - handover,
                total_secs: total,
                revision,
            });
            tracing::info!(run = i, total, "migration bench move");
        }
        Ok(moves)
    }
    .await;
    let _ = down(&ring_dir, Duration::from_secs(60)).await;
    let moves = result?;
    Ok(MigrateBench {
        objects,
        median_total_secs: median(moves.iter().map(|m| m.total_secs).collect()),
        median_handover_secs: median(moves.iter().map(|m| m.handover_secs).collect()),
        median_restore_secs: median(moves.iter().map(|m| m.restore_secs).collect()),
        moves,
    })
}

/// Creates `n` ConfigMaps (1 KiB each) with 16 concurrent writers.
pub async fn fill(kubeconfig: &Path, n: usize) -> Result<(), BootstrapError> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{ObjectMeta, PostParams};
    let client = seed::kubeconfig::client("m2", kubeconfig)
        .await
        .map_err(RingErrorExt::ring)?;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let mut set = tokio::task::JoinSet::new();
    for w in 0..16 {
        let api = api.clone();
        set.spawn(async move {
            let mut i = w;
            while i < n {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(format!("bench-{i}")),
                        ..Default::default()
                    },
                    data: Some([("v".to_string(), "x".repeat(1024))].into()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm)
                    .await
                    .map_err(|e| BootstrapError::Unsupported(format!("creating bench-{i}: {e}")))?;
                i += 16;
            }
            Ok::<(), BootstrapError>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.map_err(|e| BootstrapError::Unsupported(e.to_string()))??;
    }
    Ok(())
}

trait RingErrorExt {
    fn ring(self) -> BootstrapError;
}

impl RingErrorExt for seed::SeedError {
    fn ring(self) -> BootstrapError {
        BootstrapError::Ring(ringd::RingError::from(self))
    }
}

/// The figures as text.
pub fn render(b: &MigrateBench) -> String {
    let mut out = format!(
        "planned migration of a control plane with {} extra ConfigMaps (goal: <= 10 s), median of {}:\n",
        b.objects,
        b.moves.len()
    );
    out.push_str(&format!(
        "  total {:.2} s = handover (stop writers, final snapshot) {:.2} s + restore (fetch, restore, start, verify) {:.2} s\n",
        b.median_total_secs, b.median_handover_secs, b.median_restore_secs
    ));
    for m in &b.moves {
        out.push_str(&format!(
            "  {} -> {}: {:.2} s (handover {:.2} s, restore {:.2} s) at revision {}\n",
            m.from, m.to, m.total_secs, m.handover_secs, m.restore_secs, m.revision
        ));
    }
    out
}
