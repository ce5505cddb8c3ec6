//! Executing planned migrations on this member: as the source (stop the writers,
//! final snapshot, report the handover) and as the target (fetch, restore,
//! lease, start, verify, complete). Each side follows `migrate::plan`, observing
//! what is on disk and running, so a restarted ringd resumes where it was.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use migrate::handover;
use migrate::plan::{source_next, target_next, SourceAction, SourceView, TargetAction, TargetView};
use ring_proto::v1::ring_admin_client::RingAdminClient;
use ring_proto::v1::HandoverRequest;
use seed::{Component, LocalSeed, Seed};
use tokio_util::sync::CancellationToken;

use crate::daemon::{now_ms, Shared};
use crate::state::{Operation, OperationKind, OperationStep, Outcome, RingCommand};
use crate::transport::channel;
use crate::RingError;

const WRITERS: [Component; 3] = [
    Component::KubeScheduler,
    Component::KubeControllerManager,
    Component::KubeApiserver,
];

fn migrate_err(e: migrate::MigrateError) -> RingError {
    RingError::Transport(e.to_string())
}

/// Marks which operation the handover files in a shoot dir belong to; stale files
/// from an older operation are removed first.
fn claim_handover(layout: &seed::ShootLayout, op: u64) -> Result<(), RingError> {
    let marker = handover::dir(layout).join("operation");
    let current = std::fs::read_to_string(&marker).ok();
    if current.as_deref().map(str::trim) != Some(op.to_string().as_str()) {
        handover::clear(layout);
        seed::pki::create_private_dir(&handover::dir(layout))?;
        seed::pki::write_private(&marker, op.to_string().as_bytes())?;
    }
    Ok(())
}

/// What the executing member measured of an operation so far (in memory: after
/// a restart the figures cover only what ran since).
#[derive(Debug, Default)]
struct Progress {
    /// Objects per resource type once verification passed.
    verified: Option<BTreeMap<String, u64>>,
    restore: Duration,
    start: Duration,
}

type Ledger = BTreeMap<u64, Progress>;

fn source_action_name(a: &SourceAction) -> &'static str {
    match a {
        SourceAction::StopWriters => "stop_writers",
        SourceAction::StartEtcd => "start_etcd",
        SourceAction::TakeSnapshot => "final_snapshot",
        SourceAction::StopEtcd => "stop_etcd",
        SourceAction::ReportHandover => "report_handover",
        SourceAction::Wait => "wait",
    }
}

fn target_action_name(a: &TargetAction) -> &'static str {
    match a {
        TargetAction::Fetch => "fetch",
        TargetAction::Restore => "restore",
        TargetAction::AcquireLease => "acquire_lease",
        TargetAction::Start => "start",
        TargetAction::Verify => "verify",
        TargetAction::Complete => "complete",
    }
}

/// Adds the time of a target action to the phase it belongs to and to the metrics.
fn account(
    shared: &Shared,
    p: &mut Progress,
    kind: &'static str,
    a: &TargetAction,
    took: Duration,
) {
    match a {
        TargetAction::Fetch | TargetAction::Restore => p.restore += took,
        TargetAction::Start | TargetAction::Verify => p.start += took,
        TargetAction::AcquireLease | TargetAction::Complete => {}
    }
    shared
        .metrics()
        .step(kind, "target", target_action_name(a), took.as_secs_f64());
}

/// Runs until `stop`: drives every open migration this member takes part in.
pub async fn run(shared: Arc<Shared>, seed: Arc<LocalSeed>, stop: CancellationToken) {
    let mut verified: Ledger = Ledger::new();
    let mut retry_at: BTreeMap<u64, Instant> = BTreeMap::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
        let v = shared.node().view();
        let me = shared.name().to_string();
        let ops: Vec<Operation> = v
            .state
            .operations
            .iter()
            .filter(|o| !o.step.is_finished())
            .cloned()
            .collect();
        for op in ops {
            if retry_at.get(&op.id).is_some_and(|t| Instant::now() < *t) {
                continue;
            }
            let res = if !op.is_migration() {
                if op.target() == me {
                    failover_step(&shared, &seed, &op, &mut verified).await
                } else {
                    Ok(())
                }
            } else if op.source() == me && op.step == OperationStep::Pending {
                source_step(&shared, &seed, &op).await
            } else if op.target() == me && op.step == OperationStep::Restoring {
                target_step(&shared, &seed, &op, &mut verified).await
            } else {
                Ok(())
            };
            match res {
                Ok(()) => {
                    retry_at.remove(&op.id);
                }
                Err(e) => {
                    tracing::warn!(op = op.id, shoot = %op.shoot(), error = %e, "migration step failed; retrying");
                    shared.set_hosted_detail(op.shoot(), format!("migration {}: {e}", op.id));
                    retry_at.insert(op.id, Instant::now() + Duration::from_secs(2));
                }
            }
        }
    }
}

async fn source_step(
    shared: &Arc<Shared>,
    seed: &LocalSeed,
    op: &Operation,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let layout = seed.layout(shoot);
    let spec = seed.spec_for(shoot, None)?;
    claim_handover(&layout, op.id)?;
    let running = seed.running_components(shoot).await;
    let view = SourceView {
        writers_running: WRITERS.iter().any(|c| running.contains(c)),
        snapshot_taken: handover::read_info(&layout).is_some(),
        etcd_running: running.contains(&Component::Etcd),
        handover_recorded: false,
    };
    let action = source_next(&view);
    tracing::info!(op = op.id, %shoot, ?action, "migration source");
    let began = Instant::now();
    let name = source_action_name(&action);
    match action {
        SourceAction::StopWriters => {
            shared.stop_backup(shoot);
            shared.set_hosted(shoot, false, "handing over: writers stopped".into());
            seed.stop_only(shoot, &WRITERS).await?;
        }
        SourceAction::StartEtcd => seed.start_only(&spec, &[Component::Etcd]).await?,
        SourceAction::TakeSnapshot => {
            handover::take_final_snapshot(&layout, &spec)
                .await
                .map_err(migrate_err)?;
        }
        SourceAction::StopEtcd => seed.stop_only(shoot, &[Component::Etcd]).await?,
        SourceAction::ReportHandover => {
            let info = handover::read_info(&layout)
                .ok_or_else(|| RingError::Transport("the final snapshot vanished".into()))?;
            shared
                .propose_cmd(RingCommand::HandoverReady {
                    id: op.id,
                    revision: info.revision,
                    at_ms: now_ms(),
                })
                .await?;
            shared.set_hosted(
                shoot,
                false,
                format!(
                    "handed over at revision {} to {}",
                    info.revision,
                    op.target()
                ),
            );
        }
        SourceAction::Wait => return Ok(()),
    }
    shared
        .metrics()
        .step("migration", "source", name, began.elapsed().as_secs_f64());
    Ok(())
}

async fn target_step(
    shared: &Arc<Shared>,
    seed: &LocalSeed,
    op: &Operation,
    ledger: &mut Ledger,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let OperationKind::Migration { epoch, from, .. } = &op.kind else {
        return Ok(());
    };
    let layout = seed.layout(shoot);
    seed::pki::create_private_dir(&layout.dir)?;
    claim_handover(&layout, op.id)?;
    let running = seed.running_components(shoot).await;
    let view = TargetView {
        fetched: handover::read_info(&layout).is_some() && layout.spec_file().exists(),
        restored: handover::restored(&layout),
        leased: shared.holds_lease(shoot, *epoch),
        serving: running.len() == Component::ALL.len(),
        verified: ledger.get(&op.id).is_some_and(|p| p.verified.is_some()),
    };
    let action = target_next(&view);
    tracing::info!(op = op.id, %shoot, ?action, "migration target");
    let began = Instant::now();
    let result = migration_target_action(shared, seed, op, &action, *epoch, from, ledger).await;
    if action != TargetAction::Complete {
        let progress = ledger.entry(op.id).or_default();
        account(shared, progress, "migration", &action, began.elapsed());
    }
    result
}

async fn migration_target_action(
    shared: &Arc<Shared>,
    seed: &LocalSeed,
    op: &Operation,
    action: &TargetAction,
    epoch: u64,
    from: &str,
    ledger: &mut Ledger,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let layout = seed.layout(shoot);
    match action {
        TargetAction::Fetch => fetch(shared, &layout, op, from).await?,
        TargetAction::Restore => {
            let spec = seed.spec_for(shoot, None)?;
            let etcdctl = seed::BinarySearch::standard(shared.bin_dir()).find("etcdctl")?;
            if let Err(e) = handover::restore(&layout, &spec, &etcdctl).await {
                if !e.is_retryable() {
                    fail(shared, op, &e.to_string()).await?;
                }
                return Err(migrate_err(e));
            }
        }
        TargetAction::AcquireLease => shared.renew_lease(shoot, epoch).await?,
        TargetAction::Start => {
            let spec = seed.spec_for(shoot, None)?;
            seed.start(&spec).await?;
            shared.set_hosted(shoot, true, format!("restored; verifying (epoch {epoch})"));
            shared.start_backup(seed, shoot);
        }
        TargetAction::Verify => {
            seed::wait_ready(seed, shoot, Duration::from_secs(120)).await?;
            let spec = seed.spec_for(shoot, None)?;
            let info = handover::read_info(&layout)
                .ok_or_else(|| RingError::Transport("handover info vanished".into()))?;
            match handover::verify(&layout, &spec, &info).await {
                Ok(objects) => ledger.entry(op.id).or_default().verified = Some(objects),
                Err(e) => {
                    if !e.is_retryable() {
                        fail(shared, op, &e.to_string()).await?;
                    }
                    return Err(migrate_err(e));
                }
            }
        }
        TargetAction::Complete => {
            let info = handover::read_info(&layout);
            let revision = info.map_or(0, |i| i.revision);
            let progress = ledger.remove(&op.id).unwrap_or_default();
            let objects = progress.verified.unwrap_or_default();
            let total: u64 = objects.values().sum();
            shared
                .propose_cmd(RingCommand::AdvanceOperation {
                    id: op.id,
                    step: OperationStep::Done,
                    detail: format!(
                        "serving on {} at epoch {epoch}; revision {revision}, HashKV and {total} objects in {} resource types verified",
                        shared.name(),
                        objects.len()
                    ),
                    at_ms: now_ms(),
                    outcome: Some(Outcome {
                        restored_revision: revision,
                        restore_ms: progress.restore.as_millis() as u64,
                        start_ms: progress.start.as_millis() as u64,
                        rpo_revisions: Some(0),
                        rpo_ms: None,
                        objects,
                    }),
                })
                .await?;
            shared.metrics().finished("migration", "done");
            shared.set_hosted(shoot, true, "serving".into());
            handover::clear(&layout);
        }
    }
    Ok(())
}

/// The target of a failover restores the shoot from the bucket alone (the old
/// host is gone), then serves it under the new epoch and reports the RPO.
async fn failover_step(
    shared: &Arc<Shared>,
    seed: &LocalSeed,
    op: &Operation,
    ledger: &mut Ledger,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let OperationKind::Failover { epoch, .. } = &op.kind else {
        return Ok(());
    };
    let Some(bucket) = shared.bucket().cloned() else {
        shared.set_hosted_detail(
            shoot,
            format!(
                "failover {} waits: this member has no backup bucket to restore {shoot} from",
                op.id
            ),
        );
        return Ok(());
    };
    match op.step {
        OperationStep::Pending => {
            shared
                .propose_cmd(RingCommand::AdvanceOperation {
                    id: op.id,
                    step: OperationStep::Restoring,
                    detail: format!(
                        "{} restores {shoot} from {}",
                        shared.name(),
                        bucket.config.url
                    ),
                    at_ms: now_ms(),
                    outcome: None,
                })
                .await
        }
        OperationStep::Restoring => {
            let layout = seed.layout(shoot);
            let marker = layout.dir.join("failover-restored");
            let restored: Option<backup::restore::RestoreReport> =
                std::fs::read_to_string(&marker).ok().and_then(|t| {
                    let (id, json) = t.split_once('\n')?;
                    (id.trim() == op.id.to_string()).then(|| serde_json::from_str(json).ok())?
                });
            let running = seed.running_components(shoot).await;
            let view = TargetView {
                fetched: restored.is_some(),
                restored: restored.is_some(),
                leased: shared.holds_lease(shoot, *epoch),
                serving: running.len() == Component::ALL.len(),
                verified: ledger.get(&op.id).is_some_and(|p| p.verified.is_some()),
            };
            let action = target_next(&view);
            tracing::info!(op = op.id, %shoot, ?action, "failover target");
            let began = Instant::now();
            let result =
                failover_action(shared, seed, op, &action, *epoch, &bucket, restored, ledger).await;
            if action != TargetAction::Complete {
                let progress = ledger.entry(op.id).or_default();
                account(shared, progress, "failover", &action, began.elapsed());
            }
            result
        }
        _ => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
async fn failover_action(
    shared: &Arc<Shared>,
    seed: &LocalSeed,
    op: &Operation,
    action: &TargetAction,
    epoch: u64,
    bucket: &crate::backups::RingBucket,
    restored: Option<backup::restore::RestoreReport>,
    ledger: &mut Ledger,
) -> Result<(), RingError> {
    let shoot = op.shoot();
    let layout = seed.layout(shoot);
    let marker = layout.dir.join("failover-restored");
    match action {
        TargetAction::Fetch | TargetAction::Restore => {
            let bins = seed::BinarySearch::standard(shared.bin_dir());
            let (etcd, etcdctl) = (bins.find("etcd")?, bins.find("etcdctl")?);
            let cancel = CancellationToken::new();
            let report =
                crate::backups::restore_from_bucket(bucket, seed, shoot, &etcd, &etcdctl, &cancel)
                    .await?;
            let json =
                serde_json::to_string(&report).map_err(|e| RingError::Encode(e.to_string()))?;
            seed::pki::write_private(&marker, format!("{}\n{json}", op.id).as_bytes())?;
            shared.set_hosted(
                shoot,
                false,
                format!("restored revision {}", report.reached_revision),
            );
        }
        TargetAction::AcquireLease => shared.renew_lease(shoot, epoch).await?,
        TargetAction::Start => {
            let spec = seed.spec_for(shoot, None)?;
            seed.start(&spec).await?;
            shared.set_hosted(
                shoot,
                true,
                format!("restored from the bucket; verifying (epoch {epoch})"),
            );
            shared.start_backup(seed, shoot);
        }
        TargetAction::Verify => {
            seed::wait_ready(seed, shoot, Duration::from_secs(120)).await?;
            let spec = seed.spec_for(shoot, None)?;
            let reached = restored.as_ref().map_or(0, |r| r.reached_revision);
            let mut client = handover::etcd(&layout, &spec).await.map_err(migrate_err)?;
            let objects = handover::count_objects(&mut client, reached)
                .await
                .map_err(|e| {
                    RingError::Transport(format!("counting {shoot}'s objects at {reached}: {e}"))
                })?;
            // the per-type counts must add up to the keys the verified restore reached
            if let Some(r) = restored.as_ref() {
                let total: u64 = objects.values().sum();
                if total != r.keys as u64 {
                    return Err(RingError::Transport(format!(
                        "{shoot} holds {total} keys at revision {reached} but the restore verified {}",
                        r.keys
                    )));
                }
            }
            ledger.entry(op.id).or_default().verified = Some(objects);
        }
        TargetAction::Complete => {
            let reached = restored.as_ref().map_or(0, |r| r.reached_revision);
            let state = shared.node().view().state;
            let known = state.backups.get(shoot);
            let progress = ledger.remove(&op.id).unwrap_or_default();
            // the restore itself is measured by its report, which survives restarts
            let restore_ms = restored
                .as_ref()
                .map_or(progress.restore.as_millis() as u64, |r| {
                    (r.total_seconds * 1000.0) as u64
                });
            let (rpo, rpo_revisions, rpo_ms) = match known {
                Some(b) => {
                    let lost = (b.revision as i64 - reached).max(0);
                    let age = op.created_at_ms.saturating_sub(b.at_ms);
                    (
                        format!(
                            "the ring last knew revision {} durable ({age} ms before the failover began); {lost} revisions lost",
                            b.revision
                        ),
                        Some(lost),
                        Some(age),
                    )
                }
                None => ("no backup progress had been reported".into(), None, None),
            };
            let objects = progress.verified.unwrap_or_default();
            shared
                .propose_cmd(RingCommand::AdvanceOperation {
                    id: op.id,
                    step: OperationStep::Done,
                    detail: format!(
                        "serving on {} at epoch {epoch}; restored revision {reached} from the bucket ({} objects); {rpo}",
                        shared.name(),
                        objects.values().sum::<u64>()
                    ),
                    at_ms: now_ms(),
                    outcome: Some(Outcome {
                        restored_revision: reached,
                        restore_ms,
                        start_ms: progress.start.as_millis() as u64,
                        rpo_revisions,
                        rpo_ms,
                        objects,
                    }),
                })
                .await?;
            shared.metrics().finished("failover", "done");
            if let (Some(lost), Some(age)) = (rpo_revisions, rpo_ms) {
                shared.metrics().rpo(shoot, lost, age as f64 / 1000.0);
            }
            shared.set_hosted(shoot, true, "serving".into());
            let _ = std::fs::remove_file(&marker);
        }
    }
    Ok(())
}

async fn fail(shared: &Shared, op: &Operation, why: &str) -> Result<(), RingError> {
    let kind = if op.is_migration() {
        "migration"
    } else {
        "failover"
    };
    shared.metrics().finished(kind, "failed");
    shared
        .propose_cmd(RingCommand::AdvanceOperation {
            id: op.id,
            step: OperationStep::Failed,
            detail: why.to_string(),
            at_ms: now_ms(),
            outcome: None,
        })
        .await
}

/// Streams the handover files from the source into the shoot dir; each file is
/// written to a temporary name and renamed when complete, the snapshot info last.
async fn fetch(
    shared: &Shared,
    layout: &seed::ShootLayout,
    op: &Operation,
    from: &str,
) -> Result<(), RingError> {
    use tokio::io::AsyncWriteExt;
    let (_, address) = shared
        .directory()
        .get(from)
        .ok_or_else(|| RingError::Transport(format!("no address for source {from}")))?;
    let mut client = RingAdminClient::new(channel(shared.identity(), &address, from)?);
    let mut stream = client
        .fetch_handover(HandoverRequest {
            shoot: op.shoot().to_string(),
            operation: op.id,
        })
        .await
        .map_err(|e| {
            RingError::Transport(format!(
                "fetching the handover from {from}: {}",
                e.message()
            ))
        })?
        .into_inner();
    let mut current: Option<(String, std::path::PathBuf, tokio::fs::File)> = None;
    while let Some(chunk) = stream.message().await.map_err(|e| {
        RingError::Transport(format!("handover stream from {from}: {}", e.message()))
    })? {
        if current.as_ref().is_none_or(|(p, _, _)| *p != chunk.path) {
            let path = handover::safe_path(layout, &chunk.path).map_err(migrate_err)?;
            if let Some(parent) = path.parent() {
                seed::pki::create_private_dir(parent)?;
            }
            let tmp = path.with_extension("fetching");
            let file = tokio::fs::File::create(&tmp)
                .await
                .map_err(|source| RingError::Io {
                    what: format!("creating {}", tmp.display()),
                    source,
                })?;
            current = Some((chunk.path.clone(), path, file));
        }
        let Some((_, path, file)) = current.as_mut() else {
            continue;
        };
        file.write_all(&chunk.data)
            .await
            .map_err(|source| RingError::Io {
                what: format!("writing {}", path.display()),
                source,
            })?;
        if chunk.eof {
            file.sync_all().await.map_err(|source| RingError::Io {
                what: format!("syncing {}", path.display()),
                source,
            })?;
            let tmp = path.with_extension("fetching");
            std::fs::rename(&tmp, &*path).map_err(|source| RingError::Io {
                what: format!("renaming {}", tmp.display()),
                source,
            })?;
            current = None;
        }
    }
    if handover::read_info(layout).is_none() {
        return Err(RingError::Transport(format!(
            "the handover from {from} was incomplete"
        )));
    }
    Ok(())
}
