//! Executors: how one kind of seed carries out the member's duties. The member
//! loop knows only these traits; [`for_config`] is the one place that builds a
//! concrete seed from a member's config.
//!
//! - [`Executor`]: serve a shoot's control plane (start, fence, health, remove).
//! - [`Mover`]: take part in moves and backups (the source's final snapshot,
//!   the target's restore from a handover or the bucket, verification). A seed
//!   without one refuses moves with its reason.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use migrate::handover::{self, SnapshotInfo};
use migrate::plan::SourceView;

use seed::ShootLayout;

use crate::backups::{BackupPlan, RingBucket};
use crate::config::SeedConfig;
use crate::RingError;

mod kubernetes;
mod kubernetes_handover;
mod kubernetes_restore;
mod local;
mod local_standby;
mod record;

pub use kubernetes::{pod_backup, KubernetesExecutor};
pub use local::{restore_from_bucket, LocalExecutor};

/// `ring-agent`, next to this ringd: the lease guard of local control planes
/// and the relay of a Kubernetes seed's stable endpoints.
pub(super) fn agent_binary() -> Result<PathBuf, RingError> {
    let exe = std::env::current_exe().map_err(|source| RingError::Io {
        what: "finding ringd's own path".into(),
        source,
    })?;
    let agent = exe.with_file_name("ring-agent");
    if !agent.is_file() {
        return Err(RingError::Config {
            field: "seed".into(),
            reason: format!(
                "{} is missing: a local seed runs etcd and kube-apiserver under ring-agent's lease guard, a Kubernetes seed relays each shoot's stable endpoint with it; build it next to ringd with `cargo build -p ringd --bins` (scripts/setup does)",
                agent.display()
            ),
        });
    }
    Ok(agent)
}

/// The writers of a control plane: stopped first when it is handed over.
const WRITERS: [seed::Component; 3] = [
    seed::Component::KubeScheduler,
    seed::Component::KubeControllerManager,
    seed::Component::KubeApiserver,
];

/// Objects per resource type, as verified after a move.
pub type Objects = BTreeMap<String, u64>;

/// How a seed serves control planes.
#[async_trait]
pub trait Executor: Send + Sync {
    /// The seed's kind, for logs and status ("local", "kubernetes").
    fn kind(&self) -> &'static str;

    /// Shoots the seed keeps data or workloads of.
    fn shoots(&self) -> Vec<String>;

    /// Starts serving `shoot` (idempotent: an already running control plane is fine).
    async fn start(&self, shoot: &str) -> Result<(), RingError>;

    /// Stops serving `shoot` at once; its data stays.
    async fn fence(&self, shoot: &str) -> Result<(), RingError>;

    /// Whether `shoot`'s control plane answers ready, and the versions it runs.
    async fn health(&self, shoot: &str) -> seed::Health;

    /// Deletes everything the seed keeps of `shoot`.
    async fn remove(&self, shoot: &str) -> Result<(), RingError>;

    /// Renews the due certificates of `shoot`'s serving control plane
    /// without stopping it ([`seed::Seed::renew_certificates`]); returns
    /// those renewed.
    async fn renew_certificates(&self, shoot: &str) -> Result<Vec<seed::pki::Leaf>, RingError>;

    /// What a graceful ringd shutdown does to a control plane it serves.
    async fn stop_at_shutdown(&self, shoot: &str) -> Result<(), RingError>;

    /// The shoot moved away: make sure nothing of it still serves here (workloads
    /// in a cluster outlive a crashed ringd; local processes die with it).
    async fn fence_moved(&self, shoot: &str) -> Result<(), RingError>;

    /// The ring renewed this member's lease on `shoot` for `epoch`: nothing may
    /// serve after `fence_at_ms` (unix ms) unless it is renewed again. A seed
    /// whose workloads outlive ringd hands this to whatever fences them there.
    async fn lease_renewed(&self, _shoot: &str, _epoch: u64, _fence_at_ms: u64, _lease: Duration) {}

    /// The seed's part in moves and backups, or why it has none.
    fn mover(&self) -> Result<&dyn Mover, String>;

    /// The seed's part in hot standbys, or why it has none.
    fn standby(&self) -> Result<&dyn StandbyOps, String> {
        Err(format!("a {} seed runs no hot standby yet", self.kind()))
    }

    /// Where this member keeps `shoot`'s PKI (its certificates' expiry shows
    /// in status and metrics), if it keeps one.
    fn pki_dir(&self, _shoot: &str) -> Option<std::path::PathBuf> {
        None
    }
}

/// A seed's part in hot standbys (protection `standby`, [`backup::standby`]):
/// running a voting etcd member of a shoot served elsewhere, promoting it,
/// and, on the host, keeping the etcd cluster to the standby the ring assigned.
#[async_trait]
pub trait StandbyOps: Send + Sync {
    /// Joins `shoot`'s etcd (served on another seed at `epoch`) as the
    /// standby of member id `slot`, fetching the shoot's spec and PKI from
    /// `bucket` first if needed; returns once the standby votes (bounded).
    async fn join_standby(
        &self,
        shoot: &str,
        slot: u64,
        epoch: u64,
        bucket: &RingBucket,
    ) -> Result<(), RingError>;
    /// Runs a kube-apiserver next to the voting standby of member id `slot`
    /// so that a promotion need not wait for one to start; returns once it
    /// answers ready (bounded), `false` from a seed that keeps none warm.
    async fn warm_standby(&self, _shoot: &str, _slot: u64) -> Result<bool, RingError> {
        Ok(false)
    }
    /// Stops the standby of `shoot`; unless `keep`, its data is moved aside.
    async fn leave_standby(&self, shoot: &str, keep: bool) -> Result<(), RingError>;
    /// Promotes the standby of `shoot` for failover `op` (stopped, re-formed
    /// alone with everything its log holds) and records the report as a
    /// restore's. Where a warm kube-apiserver waits, the promoted etcd starts
    /// again at once, out of the shoot's address, under the lease guard with
    /// a fence time `hold` after the promotion until the new epoch's lease
    /// renews it.
    async fn promote_standby(
        &self,
        shoot: &str,
        op: u64,
        hold: Duration,
    ) -> Result<backup::restore::RestoreReport, RingError>;
    /// On the host: the other members of `shoot`'s etcd, each by the member
    /// id its standby ports name (`None`: not a standby's).
    async fn etcd_peers(&self, shoot: &str) -> Result<Vec<Option<u64>>, RingError>;
    /// On the host: whether `shoot`'s etcd has a quorum (a linearizable read
    /// answers within a few seconds).
    async fn etcd_quorum(&self, shoot: &str) -> bool;
    /// On the host: removes every other member of `shoot`'s etcd but the
    /// standby of member id `keep`; when etcd cannot (its quorum is gone with
    /// a dead standby) the control plane restarts on its etcd re-formed alone.
    async fn drop_peers(&self, shoot: &str, keep: Option<u64>) -> Result<(), RingError>;
}

/// What the target observed of its side of a move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetFacts {
    /// The data is here: handover fetched, or the bucket restore recorded.
    pub fetched: bool,
    /// The data is restored into the shoot's etcd.
    pub restored: bool,
    /// Every component of the control plane runs.
    pub running: bool,
}

/// A seed's part in moves (planned migrations and failovers) and backups.
#[async_trait]
pub trait Mover: Send + Sync {
    /// Whether the seed takes part in planned migrations (failovers from the
    /// bucket need only a `Mover`), or why not.
    fn migrates(&self) -> Result<(), String> {
        Ok(())
    }

    /// The shoot's local dir on this member: its spec and PKI, the handover
    /// files and the restore record.
    fn shoot_layout(&self, shoot: &str) -> ShootLayout;

    /// The admin kubeconfig ringd reaches the shoot's API with (written by
    /// the seed's health check, so valid once the API answered ready).
    fn admin_kubeconfig(&self, shoot: &str) -> PathBuf;

    /// How the continuous backup of `shoot` runs: in ringd from a source, or
    /// next to the workload (ringd stores the identity and forwards progress).
    fn backup_plan(&self, shoot: &str) -> Result<BackupPlan, RingError>;

    /// The source's view of migration `op` of `shoot` (stale files of another
    /// operation are cleared first).
    async fn source_view(&self, shoot: &str, op: u64) -> Result<SourceView, RingError>;
    /// Stops kube-apiserver, controller-manager and scheduler; etcd keeps running.
    async fn stop_writers(&self, shoot: &str) -> Result<(), RingError>;
    /// Starts etcd alone (after a crash between steps).
    async fn start_etcd(&self, shoot: &str) -> Result<(), RingError>;
    /// Takes the final snapshot of a shoot whose writers are stopped.
    async fn take_final_snapshot(&self, shoot: &str) -> Result<(), RingError>;
    /// Stops etcd.
    async fn stop_etcd(&self, shoot: &str) -> Result<(), RingError>;
    /// The final snapshot's info, once taken.
    fn handover_info(&self, shoot: &str) -> Option<SnapshotInfo> {
        handover::read_info(&self.shoot_layout(shoot))
    }
    /// The handover's directory and its files (relative), in sending order.
    fn handover_files(&self, shoot: &str) -> Result<(PathBuf, Vec<PathBuf>), RingError> {
        let layout = self.shoot_layout(shoot);
        let files = handover::files(&layout)?;
        Ok((layout.dir, files))
    }

    /// The target's facts for move `op` of `shoot` (`from_bucket`: a failover).
    async fn target_facts(
        &self,
        shoot: &str,
        op: u64,
        from_bucket: bool,
    ) -> Result<TargetFacts, RingError>;
    /// Where a fetched handover file `rel` goes (rejects paths that leave the shoot).
    fn handover_path(&self, shoot: &str, rel: &str) -> Result<PathBuf, RingError> {
        Ok(handover::safe_path(&self.shoot_layout(shoot), rel)?)
    }
    /// Restores the fetched final snapshot into the shoot's etcd, for the
    /// migration's new `epoch` (a copy that goes into the bucket begins that
    /// epoch's history there).
    async fn restore_handover(&self, shoot: &str, epoch: u64) -> Result<(), RingError>;
    /// Restores `shoot` from the bucket for failover `op` and records the report.
    async fn restore_bucket(
        &self,
        shoot: &str,
        op: u64,
        bucket: &RingBucket,
    ) -> Result<backup::restore::RestoreReport, RingError>;
    /// The recorded report of failover `op`'s restore, if it completed.
    fn bucket_report(&self, shoot: &str, op: u64) -> Option<backup::restore::RestoreReport> {
        record::read(&record::path(&self.shoot_layout(shoot)), Some(op)).map(|(report, _)| report)
    }
    /// Discards failover `op`'s restore (made while the old lease ran out,
    /// and the bucket moved on since): the next restore step restores again.
    fn discard_bucket_restore(&self, shoot: &str, op: u64) -> Result<(), RingError> {
        record::discard(&record::path(&self.shoot_layout(shoot)), op)
    }
    /// Waits (bounded) for the restored control plane to answer ready.
    async fn wait_ready(&self, shoot: &str, timeout: Duration) -> Result<(), RingError>;
    /// Checks revision and HashKV against the handover; objects per type.
    async fn verify_handover(&self, shoot: &str) -> Result<Objects, RingError>;
    /// Counts objects at `revision` (after a restore from the bucket).
    async fn count_objects(&self, shoot: &str, revision: i64) -> Result<Objects, RingError>;
    /// Removes what the finished move `op` left (handover files, restore records).
    fn finish_move(&self, shoot: &str, _op: u64) {
        let layout = self.shoot_layout(shoot);
        handover::clear(&layout);
        record::clear(&record::path(&layout));
    }
}

/// Whether migration `op`'s handover is fetched into `layout` (files of an
/// older operation are cleared first).
fn handover_fetched(layout: &ShootLayout, op: u64) -> Result<bool, RingError> {
    handover::claim(layout, op)?;
    Ok(handover::read_info(layout).is_some() && layout.spec_file().exists())
}

/// A start that found the control plane already running has done its job.
fn started(res: Result<(), seed::SeedError>) -> Result<(), RingError> {
    match res {
        Ok(()) | Err(seed::SeedError::AlreadyRunning { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Builds the executor of a member's seed from its config.
pub async fn for_config(
    sc: &SeedConfig,
    member: &str,
    bucket: Option<&RingBucket>,
) -> Result<Arc<dyn Executor>, RingError> {
    match &sc.kubernetes {
        Some(kc) => Ok(Arc::new(
            KubernetesExecutor::connect(kc, sc, member, bucket).await?,
        )),
        None => Ok(Arc::new(LocalExecutor::from_config(sc)?)),
    }
}
