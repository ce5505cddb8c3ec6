//! `ringctl bench migrate`: planned migration time of a control plane holding
//! many objects, split by step, median of N moves, in a real local ring.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use bootstrap::BootstrapError;
use ringd::client::AdminClient;
use ringd::state::OperationStep;

use super::{upper_median, BenchRing};

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
    let ring = BenchRing::new(dir, "benchmig", ringd, base_port);
    let result = async {
        ring.bootstrap().await?;
        fill(&ring.layout.kubeconfig("m2"), objects).await?;
        let mut moves = Vec::new();
        for i in 0..runs {
            let m = one_move(&ring, i).await?;
            tracing::info!(run = i, total = m.total_secs, "migration bench move");
            moves.push(m);
        }
        Ok::<_, BootstrapError>(moves)
    }
    .await;
    ring.down().await;
    let moves = result?;
    Ok(MigrateBench {
        objects,
        median_total_secs: upper_median(moves.iter().map(|m| m.total_secs).collect()),
        median_handover_secs: upper_median(moves.iter().map(|m| m.handover_secs).collect()),
        median_restore_secs: upper_median(moves.iter().map(|m| m.restore_secs).collect()),
        moves,
    })
}

/// Move `i`: m2 from its host to m1 or m3 (alternating, never m2 itself) through
/// the leader, timed until the migration is done.
async fn one_move(ring: &BenchRing, i: usize) -> Result<MoveFigures, BootstrapError> {
    let status = bootstrap::ring_status(&ring.layout, &ring.config).await?;
    let from = status
        .placements
        .iter()
        .find(|p| p.shoot == "m2")
        .map(|p| p.host.clone())
        .unwrap_or_default();
    let to = if from == "m1" { "m3" } else { "m1" }.to_string();
    let address = status
        .leader_address()
        .map_or_else(|| ring.config.member_address(0), str::to_string);
    let mut admin = AdminClient::connect(&address, &ring.layout.pki())?;
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
    Ok(MoveFigures {
        from,
        to,
        handover_secs: handover,
        restore_secs: total - handover,
        total_secs: total,
        revision,
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
