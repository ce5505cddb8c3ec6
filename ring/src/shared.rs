//! State shared by a ringd's tasks and gRPC services: the Raft node, the
//! member directory, this member's leases, what it hosts, and its status.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use raft::StateRole;
use ring_proto::v1::ShootHealth;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backups::{Backups, RingBucket};
use crate::config::{RingdConfig, Timing};
use crate::executor::Executor;
use crate::identity::IdentityPem;
use crate::metrics::Metrics;
use crate::node::NodeView;
use crate::node_task::{NodeHandle, ProposeError};
use crate::state::RingCommand;
use crate::status::{HostedStatus, MemberStatus, PlacementStatus, RingStatus};
use crate::transport::Directory;
use crate::{now_ms, RingError};

/// This member's lease on a shoot, as far as it knows.
#[derive(Debug, Clone, Copy)]
pub struct LocalLease {
    pub epoch: u64,
    pub valid_until: Instant,
    /// When to renew next.
    pub renew_at: Instant,
}

/// A control plane this member hosts (or hosted).
#[derive(Debug, Clone, Default)]
pub struct Hosted {
    pub epoch: u64,
    pub serving: bool,
    pub starting: bool,
    pub ready: bool,
    pub detail: String,
    /// After a failed start: not before this.
    pub next_attempt: Option<Instant>,
    pub last_health: Option<Instant>,
    /// When to look at its certificates next (`None`: at once).
    pub certificates_at: Option<Instant>,
    /// Failed looks at its certificates in a row.
    pub certificates_failures: u32,
    /// After a failed lease renewal (with no lease held): not before this.
    pub lease_retry: Option<Instant>,
    /// The other members of the shoot's etcd by standby member id, as the
    /// last health check saw them (protection `standby`).
    pub etcd_peers: Option<Vec<Option<u64>>>,
    /// Whether the shoot's etcd had a quorum when it had peers (last health check).
    pub etcd_quorum: Option<bool>,
    /// What its control plane runs, as the last health check found.
    pub versions: seed::Versions,
}

/// State shared by the daemon's tasks and gRPC services.
pub struct Shared {
    pub(crate) config: RingdConfig,
    pub(crate) node: NodeHandle,
    pub(crate) directory: Directory,
    /// The member identity in use (replaced when its files change).
    pub(crate) identity: Arc<tokio::sync::watch::Sender<IdentityPem>>,
    /// The executor of this member's seed, if it hosts control planes.
    pub(crate) executor: Option<Arc<dyn Executor>>,
    pub(crate) metrics: Metrics,
    /// Leader only: member → (when it last reported, its shoots' health).
    pub(crate) reports: Mutex<BTreeMap<String, (u64, Vec<ShootHealth>)>>,
    pub(crate) leases: Mutex<BTreeMap<String, LocalLease>>,
    pub(crate) hosted: Mutex<BTreeMap<String, Hosted>>,
    /// Shoots this member's seed runs a hot standby of (set by the standby
    /// tasks; observing never waits on the seed).
    pub(crate) standbys: Mutex<std::collections::BTreeSet<String>>,
    pub(crate) backups: Backups,
    /// `config.backup` with its key loaded.
    pub(crate) bucket: Option<RingBucket>,
    /// Commands for the quorum from background work (backup progress).
    pub(crate) commands: mpsc::Sender<RingCommand>,
    pub(crate) stop: CancellationToken,
}

/// Locks `m`, taking over a poisoned lock (its data stays consistent: every
/// writer sets whole fields).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// This member's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The Raft node.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// This member's Prometheus metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Known members' ids and addresses.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// This member's TLS identity now.
    pub fn identity(&self) -> IdentityPem {
        self.identity.borrow().clone()
    }

    /// Notices of a new identity (see [`crate::identity::watch_files`]).
    pub fn identity_changes(&self) -> tokio::sync::watch::Receiver<IdentityPem> {
        self.identity.subscribe()
    }

    /// The bucket this member backs up to and restores from, if configured.
    pub fn bucket(&self) -> Option<&RingBucket> {
        self.bucket.as_ref()
    }

    /// The executor of this member's seed, if any.
    pub fn executor(&self) -> Option<&Arc<dyn Executor>> {
        self.executor.as_ref()
    }

    /// Records whether this member serves `shoot`, and why.
    pub fn set_hosted(&self, shoot: &str, serving: bool, detail: String) {
        let mut all = lock(&self.hosted);
        let h = all.entry(shoot.to_string()).or_default();
        h.serving = serving;
        if !serving {
            h.ready = false;
        }
        h.detail = detail;
    }

    /// Records that this member serves `shoot` under `epoch`, taken over by
    /// a move (a failover or migration) rather than started by its duties.
    pub fn serve_moved(&self, shoot: &str, epoch: u64, detail: String) {
        self.set_hosted(shoot, true, detail);
        if let Some(h) = lock(&self.hosted).get_mut(shoot) {
            h.epoch = epoch;
        }
    }

    /// Records why `shoot` is in its state.
    pub fn set_hosted_detail(&self, shoot: &str, detail: String) {
        lock(&self.hosted)
            .entry(shoot.to_string())
            .or_default()
            .detail = detail;
    }

    /// How often the certificates of a served control plane are looked at.
    pub(crate) fn certificate_check(&self) -> Duration {
        let secs = self
            .config
            .seed
            .as_ref()
            .map_or_else(crate::config::default_certificate_check_secs, |s| {
                s.certificate_check_secs
            });
        Duration::from_secs(secs)
    }

    pub(crate) fn timing(&self) -> &Timing {
        &self.config.timing
    }

    pub(crate) fn lease_length(&self) -> Duration {
        Duration::from_millis(self.timing().lease_ms)
    }

    pub(crate) fn proposal_timeout(&self) -> Duration {
        Duration::from_millis(self.timing().election_timeout_ms * 3)
    }

    /// Renews (or acquires) this member's lease on `shoot` for `epoch` through
    /// the quorum. A failed renewal is tried again soon (200 ms), so electing a
    /// new leader does not fence healthy control planes; a renewal sent to a
    /// leader that is then lost fails at once (raft drops it silently).
    pub async fn renew_lease(&self, shoot: &str, epoch: u64) -> Result<(), RingError> {
        let lease = self.lease_length();
        let sent = Instant::now();
        let expires_at_ms = now_ms() + self.timing().lease_ms;
        let cmd = RingCommand::RenewLease {
            shoot: shoot.to_string(),
            holder: self.name().to_string(),
            epoch,
            expires_at_ms,
        };
        if let Err(e) = self.node.propose_until_leader_changes(cmd, lease / 3).await {
            let retry = Instant::now() + Duration::from_millis(200);
            if let Some(l) = lock(&self.leases).get_mut(shoot) {
                l.renew_at = retry;
            }
            lock(&self.hosted)
                .entry(shoot.to_string())
                .or_default()
                .lease_retry = Some(retry);
            return Err(e.into());
        }
        lock(&self.leases).insert(
            shoot.to_string(),
            LocalLease {
                epoch,
                valid_until: sent + lease,
                renew_at: sent + lease / 3,
            },
        );
        if let Some(executor) = &self.executor {
            // what serves next to the workload must stop as early as ringd
            // would (the fencing margin of the member's duties)
            let fence_at = expires_at_ms.saturating_sub(
                lease.as_millis() as u64 / crate::config::FENCE_EARLY_DIVISOR as u64,
            );
            executor.lease_renewed(shoot, epoch, fence_at, lease).await;
        }
        Ok(())
    }

    /// Commits `cmd` through the quorum.
    pub async fn propose_cmd(&self, cmd: RingCommand) -> Result<(), RingError> {
        self.propose(cmd).await.map(|_| ()).map_err(RingError::from)
    }

    pub(crate) async fn propose(&self, cmd: RingCommand) -> Result<u64, ProposeError> {
        let res = self.node.propose(cmd, self.proposal_timeout()).await;
        self.metrics.proposal(res.is_ok());
        res
    }

    pub(crate) fn record_report(&self, member: &str, shoots: Vec<ShootHealth>) {
        lock(&self.reports).insert(member.to_string(), (now_ms(), shoots));
    }

    /// The answering member's view of the ring.
    pub fn status(&self) -> RingStatus {
        let v = self.node.view();
        let leader = self.directory.by_id(v.leader_id).map(|(n, _)| n);
        let election = Duration::from_millis(self.timing().election_timeout_ms * 2);
        let quorum_contact = v.role == StateRole::Leader
            || v.last_leader_contact
                .is_some_and(|t| t.elapsed() < election);
        RingStatus {
            member: self.name().to_string(),
            id: v.id,
            role: format!("{:?}", v.role),
            leader,
            term: v.term,
            commit_index: v.commit,
            applied_index: v.applied,
            quorum_contact,
            members: self.members_status(&v),
            placements: self.placements_status(&v),
            hosted: self.hosted_status(),
            operations: v.state.operations.clone(),
            protection: self.config.protection,
            certificates: self.certificates(),
        }
    }

    /// The ring CA and member certificate in use, and the PKI of every
    /// control plane this member serves (read from disk on each call).
    pub fn certificates(&self) -> Vec<crate::certs::CertificateStatus> {
        let mut out = crate::certs::member(self.name(), &self.identity(), &self.config.tls);
        if let Some(executor) = &self.executor {
            // only what serves here: a fenced or moved-away control plane's
            // PKI may stay on disk, but nothing here presents it
            let shoots: Vec<String> = lock(&self.hosted)
                .iter()
                .filter(|(_, h)| h.serving)
                .map(|(s, _)| s.clone())
                .collect();
            for shoot in shoots {
                if let Some(dir) = executor.pki_dir(&shoot) {
                    out.extend(crate::certs::shoot(&shoot, &dir));
                }
            }
            // a hot standby's etcd presents the certificates of its own copy
            let standbys: Vec<String> = lock(&self.standbys).iter().cloned().collect();
            for shoot in standbys {
                if let Some(dir) = executor.pki_dir(&shoot) {
                    out.extend(crate::certs::standby(&shoot, &dir));
                }
            }
        }
        out
    }

    fn members_status(&self, v: &NodeView) -> Vec<MemberStatus> {
        let now = now_ms();
        let reports = lock(&self.reports).clone();
        let is_leader = v.role == StateRole::Leader;
        v.state
            .members
            .iter()
            .map(|m| MemberStatus {
                name: m.name.clone(),
                id: m.id,
                address: m.address.clone(),
                state: m.state,
                voter: v.voters.contains(&m.id),
                leader: m.id == v.leader_id,
                last_report_ms_ago: if !is_leader {
                    None
                } else if m.name == self.name() {
                    Some(0)
                } else {
                    reports.get(&m.name).map(|(at, _)| now.saturating_sub(*at))
                },
            })
            .collect()
    }

    fn placements_status(&self, v: &NodeView) -> Vec<PlacementStatus> {
        let now = now_ms();
        let reports = lock(&self.reports).clone();
        v.state
            .placements
            .values()
            .map(|p| {
                let backup = v.state.backups.get(&p.shoot);
                let reported = reports
                    .get(&p.host)
                    .and_then(|(_, shoots)| shoots.iter().find(|s| s.shoot == p.shoot));
                PlacementStatus {
                    shoot: p.shoot.clone(),
                    host: p.host.clone(),
                    epoch: p.epoch,
                    lease_expires_in_ms: p
                        .lease
                        .as_ref()
                        .map(|l| l.expires_at_ms as i64 - now as i64),
                    last_backup_age_ms: backup.map(|b| now.saturating_sub(b.at_ms)),
                    last_backup_revision: backup.map(|b| b.revision),
                    ready: reported.map(|s| s.ready),
                    versions: reported.map(reported_versions).unwrap_or_default(),
                    standby: p.standby.clone(),
                }
            })
            .collect()
    }

    fn hosted_status(&self) -> Vec<HostedStatus> {
        let leases = lock(&self.leases).clone();
        let now = Instant::now();
        lock(&self.hosted)
            .iter()
            .map(|(shoot, h)| HostedStatus {
                shoot: shoot.clone(),
                epoch: h.epoch,
                serving: h.serving,
                ready: h.ready,
                lease_valid_for_ms: leases.get(shoot).map(|l| {
                    if l.valid_until >= now {
                        (l.valid_until - now).as_millis() as i64
                    } else {
                        -((now - l.valid_until).as_millis() as i64)
                    }
                }),
                detail: h.detail.clone(),
                versions: h.versions.clone(),
            })
            .collect()
    }
}

/// The versions a host reported with a shoot's health (empty: unknown).
fn reported_versions(s: &ShootHealth) -> seed::Versions {
    let known = |v: &str| (!v.is_empty()).then(|| v.to_string());
    seed::Versions {
        kubernetes: known(&s.kubernetes_version),
        etcd: known(&s.etcd_version),
    }
}
