//! Hot standbys on a local seed ([`StandbyOps`] for [`LocalExecutor`]): the
//! standby etcd runs next to ringd on the shoot's address at ports of its
//! own ([`seed::ShootEndpoint::standby_ports`]), its data where the shoot's
//! etcd data goes, so a promotion serves from it in place. A marker in the
//! shoot's dir (`standby`: epoch and member id) tells a restarted ringd that
//! the data there is its standby's, to start again rather than replace.

use std::time::Duration;

use async_trait::async_trait;
use backup::standby;
use seed::local::WarmApi;
use seed::{Component, Seed, ShootLayout};

use super::local::{move_data_aside, LocalExecutor};
use super::{record, StandbyOps};
use crate::backups::{download_identity, RingBucket};
use crate::RingError;

/// How long a joined standby may take to catch up and vote.
const VOTE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a warm kube-apiserver may take to answer ready.
const WARM_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a standby that is no longer assigned tries to leave the shoot's
/// etcd before it stops regardless.
const LEAVE_PATIENCE: Duration = Duration::from_secs(60);

/// The standby's etcd member name.
fn member_name(slot: u64) -> String {
    format!("standby-{slot}")
}

fn marker(layout: &ShootLayout) -> std::path::PathBuf {
    layout.dir.join("standby")
}

/// (epoch, member id) of the standby whose data is here, if any.
fn read_marker(layout: &ShootLayout) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(marker(layout)).ok()?;
    let (epoch, slot) = text.trim().split_once(' ')?;
    Some((epoch.parse().ok()?, slot.parse().ok()?))
}

impl LocalExecutor {
    fn shoot_etcd(&self, shoot: &str) -> Result<backup::EtcdConfig, RingError> {
        let spec = self.spec(shoot)?;
        Ok(backup::EtcdConfig::for_local_shoot(
            &self.layout(shoot),
            &spec,
        ))
    }

    /// Starts the standby etcd: on its data from before (same epoch and
    /// member, still in the cluster), else fresh as a learner just added.
    async fn start_standby(&self, shoot: &str, slot: u64, epoch: u64) -> Result<u64, RingError> {
        let layout = self.layout(shoot);
        let spec = self.spec(shoot)?;
        let (client_port, peer_port) = spec.endpoint.standby_ports(slot);
        let peer_url = format!("https://{}:{peer_port}", spec.endpoint.address);
        let name = member_name(slot);
        let etcd = self.shoot_etcd(shoot)?;
        let joined = standby::add_learner(&etcd, &name, &peer_url).await?;
        let reuse = !joined.added
            && read_marker(&layout) == Some((epoch, slot))
            && seed::local::holds_data(&layout.etcd_data());
        if !reuse {
            move_data_aside(&layout)?;
        }
        seed::pki::write_private(&marker(&layout), format!("{epoch} {slot}").as_bytes())?;
        let ports = (client_port, peer_port);
        self.seed
            .start_standby(&spec, &name, ports, &joined.initial_cluster)
            .await?;
        Ok(joined.id)
    }
}

impl LocalExecutor {
    /// Takes this seed's standby out of the shoot's etcd before it stops, so
    /// the host keeps its quorum (with two voters, a standby that just
    /// stopped would take it along). Best effort: with the host gone there
    /// is no quorum to ask, and nothing to keep.
    /// Fails while the host answers but etcd refuses the removal (it
    /// refuses to remove a member connected for less than 5 s): the caller
    /// tries again, and stops the standby anyway after [`LEAVE_PATIENCE`].
    async fn remove_self(&self, shoot: &str) -> Result<(), RingError> {
        let (Some((_, slot)), Ok(spec), Ok(etcd)) = (
            read_marker(&self.layout(shoot)),
            self.spec(shoot),
            self.shoot_etcd(shoot),
        ) else {
            return Ok(());
        };
        let Ok(peers) = standby::peers(&etcd).await else {
            return Ok(()); // the host is gone: nothing to keep
        };
        for (id, urls) in peers {
            if urls
                .iter()
                .any(|u| standby_slot(&spec, u) == Some(slot % 1000))
            {
                standby::remove(&etcd, id).await?;
                tracing::info!(%shoot, "the standby left the shoot's etcd");
            }
        }
        Ok(())
    }

    /// When this seed first tried to leave the standby of `shoot` (kept in
    /// the shoot's dir), recorded now if it had not tried before.
    fn leaving_since(&self, shoot: &str) -> u64 {
        let path = self.layout(shoot).dir.join("standby-leaving");
        if let Some(at) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return at;
        }
        let now = crate::now_ms();
        let _ = seed::pki::write_private(&path, now.to_string().as_bytes());
        now
    }
}

#[async_trait]
impl StandbyOps for LocalExecutor {
    async fn join_standby(
        &self,
        shoot: &str,
        slot: u64,
        epoch: u64,
        bucket: &RingBucket,
    ) -> Result<(), RingError> {
        let layout = self.layout(shoot);
        if !layout.spec_file().exists() || !layout.pki().ca().cert.exists() {
            seed::pki::create_private_dir(&layout.dir)?;
            download_identity(bucket, &layout, shoot).await?;
        }
        let id = if self.seed.runs_standby(shoot).await {
            let spec = self.spec(shoot)?;
            let peer_port = spec.endpoint.standby_ports(slot).1;
            let peer_url = format!("https://{}:{peer_port}", spec.endpoint.address);
            standby::add_learner(&self.shoot_etcd(shoot)?, &member_name(slot), &peer_url)
                .await?
                .id
        } else {
            self.start_standby(shoot, slot, epoch).await?
        };
        let etcd = self.shoot_etcd(shoot)?;
        let deadline = tokio::time::Instant::now() + VOTE_TIMEOUT;
        while !standby::promote_learner(&etcd, id).await? {
            if tokio::time::Instant::now() >= deadline {
                return Err(RingError::StepTimeout {
                    step: "standby catching up",
                    secs: VOTE_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    async fn warm_standby(&self, shoot: &str, slot: u64) -> Result<bool, RingError> {
        let spec = self.spec(shoot)?;
        let warm = WarmApi::for_standby(&spec.endpoint, slot);
        self.seed.start_warm_api(&spec, warm).await?;
        let deadline = tokio::time::Instant::now() + WARM_TIMEOUT;
        loop {
            let health = self.seed.warm_api_health(&spec, warm).await?;
            if health.ready {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                // a promotion starts a kube-apiserver of its own rather
                // than wait for this one
                self.seed.stop_warm_api(shoot).await?;
                return Err(RingError::StepTimeout {
                    step: "the standby's warm kube-apiserver answering ready",
                    secs: WARM_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn leave_standby(&self, shoot: &str, keep: bool) -> Result<(), RingError> {
        // only a standby stops here: a control plane serving from its data
        // (promoted) is never touched
        if self.seed.runs_standby(shoot).await {
            if let Err(e) = self.remove_self(shoot).await {
                let waited = crate::now_ms().saturating_sub(self.leaving_since(shoot));
                if waited < LEAVE_PATIENCE.as_millis() as u64 {
                    return Err(e);
                }
                tracing::warn!(%shoot, error = %e, "the standby could not leave the shoot's etcd; stopping it anyway (the host re-forms its etcd)");
            }
            self.seed.stop(shoot).await?;
        } else if never_served(&self.seed.running_components(shoot).await) {
            // what a promotion that never served started here (its step timed
            // out, or its operation failed before the start): the warm
            // kube-apiserver, maybe the promoted etcd, nothing at the shoot's
            // address
            self.seed.stop(shoot).await?;
        }
        let _ = std::fs::remove_file(self.layout(shoot).dir.join("standby-leaving"));
        let layout = self.layout(shoot);
        if !keep && self.seed.running_components(shoot).await.is_empty() {
            move_data_aside(&layout)?;
        }
        let _ = std::fs::remove_file(marker(&layout));
        Ok(())
    }

    async fn promote_standby(
        &self,
        shoot: &str,
        op: u64,
        hold: Duration,
    ) -> Result<backup::restore::RestoreReport, RingError> {
        let layout = self.layout(shoot);
        let spec = self.spec(shoot)?;
        let etcd_bin = self.bins().find("etcd")?;
        // only etcd stops: the warm kube-apiserver finds the promoted etcd
        // where the standby was, and the start completes the control plane
        // around it
        self.seed.stop_only(shoot, &[Component::Etcd]).await?;
        self.seed.end_standby(shoot).await;
        let name = read_marker(&layout).map_or(shoot.to_string(), |(_, slot)| member_name(slot));
        let data = layout.etcd_data();
        let log = layout.dir.join("logs").join("promote.log");
        let peer_url = spec.endpoint.etcd_peer_url();
        let p = match standby::promote(&etcd_bin, &data, &name, &peer_url, &log).await {
            Ok(p) => p,
            Err(e) => {
                // nothing of a failed promotion keeps running here
                let _ = self.seed.stop(shoot).await;
                return Err(e.into());
            }
        };
        let _ = std::fs::remove_file(marker(&layout));
        let report = backup::restore::RestoreReport {
            data_dir: data,
            target_revision: p.revision,
            reached_revision: p.revision,
            full: format!("hot standby {name}"),
            full_revision: p.revision,
            deltas: 0,
            revisions_replayed: 0,
            events_replayed: 0,
            revisions_from_log: p.entries_committed,
            replay_seconds: 0.0,
            expected_keys: p.keys,
            keys: p.keys,
            hash_kv: "not compared: the standby voted on every write".into(),
            gaps: Vec::new(),
            verified: true,
            total_seconds: p.seconds,
            corrupt: Vec::new(),
            objects: None,
            hash_kv_at_reached: None,
        };
        record::write(&record::path(&layout), op, &report, None)?;
        self.start_promoted_etcd(shoot, &spec, hold).await;
        Ok(report)
    }

    async fn etcd_peers(&self, shoot: &str) -> Result<Vec<Option<u64>>, RingError> {
        let spec = self.spec(shoot)?;
        let peers = standby::peers(&self.shoot_etcd(shoot)?).await?;
        Ok(peers
            .iter()
            .map(|(_, urls)| urls.iter().find_map(|u| standby_slot(&spec, u)))
            .collect())
    }

    async fn etcd_quorum(&self, shoot: &str) -> bool {
        match self.shoot_etcd(shoot) {
            Ok(etcd) => standby::has_quorum(&etcd, Duration::from_secs(3)).await,
            Err(_) => false,
        }
    }

    async fn drop_peers(&self, shoot: &str, keep: Option<u64>) -> Result<(), RingError> {
        let spec = self.spec(shoot)?;
        let etcd = self.shoot_etcd(shoot)?;
        // without a quorum no removal can commit: asking would only wait
        // out its timeout before the re-form (3 s more of outage)
        if !standby::has_quorum(&etcd, Duration::from_secs(3)).await {
            return self
                .reform_alone(shoot, &spec, "the shoot's etcd has no quorum")
                .await;
        }
        let mut lost_quorum = None;
        for (id, urls) in standby::peers(&etcd).await? {
            let slot = urls.iter().find_map(|u| standby_slot(&spec, u));
            if slot.is_some() && slot == keep {
                continue;
            }
            if let Err(e) = standby::remove(&etcd, id).await {
                // etcd also refuses while the member is connected for less
                // than 5 s: only a cluster without quorum is re-formed
                if standby::has_quorum(&etcd, Duration::from_secs(3)).await {
                    return Err(e.into());
                }
                lost_quorum = Some(e);
                break;
            }
            tracing::info!(%shoot, member = format!("{id:x}"), "removed a member from the shoot's etcd");
        }
        match lost_quorum {
            Some(why) => self.reform_alone(shoot, &spec, &why.to_string()).await,
            None => Ok(()),
        }
    }
}

impl LocalExecutor {
    /// The promoted etcd of `shoot` started again at once next to its warm
    /// kube-apiserver, fenced `hold` from now unless the new epoch's lease
    /// renews it. A failure is only logged: the start after the lease starts
    /// what does not run.
    async fn start_promoted_etcd(
        &self,
        shoot: &str,
        spec: &seed::ControlPlaneSpec,
        hold: Duration,
    ) {
        let fence_at = crate::now_ms() + hold.as_millis() as u64;
        match self.seed.start_promoted_etcd(spec, fence_at).await {
            Ok(true) => {
                tracing::info!(%shoot, "the promoted etcd serves its warm kube-apiserver while the old lease runs out")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%shoot, error = %e, "cannot start the promoted etcd before the lease; the start will")
            }
        }
    }

    /// The standby is gone with the quorum: etcd is re-formed alone; the
    /// rest of the control plane keeps running and reconnects.
    async fn reform_alone(
        &self,
        shoot: &str,
        spec: &seed::ControlPlaneSpec,
        why: &str,
    ) -> Result<(), RingError> {
        tracing::warn!(%shoot, error = %why, "re-forming the shoot's etcd alone");
        self.seed.stop_only(shoot, &[Component::Etcd]).await?;
        let layout = self.layout(shoot);
        let log = layout.dir.join("logs").join("reform.log");
        let etcd_bin = self.bins().find("etcd")?;
        let peer_url = spec.endpoint.etcd_peer_url();
        standby::promote(&etcd_bin, &layout.etcd_data(), shoot, &peer_url, &log).await?;
        let started = self.seed.start_missing(spec, &Component::ALL).await;
        super::started(started)
    }
}

/// Whether `running` is what a promotion leaves before its start: the warm
/// kube-apiserver, maybe the promoted etcd, and nothing else.
fn never_served(running: &[Component]) -> bool {
    !running.is_empty()
        && running.contains(&Component::KubeApiserver)
        && running
            .iter()
            .all(|c| matches!(c, Component::Etcd | Component::KubeApiserver))
}

/// The member id a standby's peer URL names (its ports, see
/// [`seed::ShootEndpoint::standby_ports`]).
fn standby_slot(spec: &seed::ControlPlaneSpec, url: &str) -> Option<u64> {
    let port: u16 = url.rsplit_once(':')?.1.trim_end_matches('/').parse().ok()?;
    let ports = seed::endpoint::STANDBY_ETCD_PORTS;
    let off = port.checked_sub(ports.start)?;
    (ports.contains(&port) && off % 2 == 1 && url.contains(&spec.endpoint.address.to_string()))
        .then_some(u64::from(off / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_promotion_leaves_before_its_start_is_told_from_a_control_plane() {
        use seed::Component::*;
        assert!(never_served(&[KubeApiserver]));
        assert!(never_served(&[Etcd, KubeApiserver]));
        assert!(!never_served(&[]));
        assert!(!never_served(&[Etcd]), "a standby's etcd leaves by itself");
        let serving = [Etcd, EtcdForwarder, ApiForwarder, KubeApiserver];
        assert!(!never_served(&serving));
        assert!(!never_served(&[Etcd, KubeApiserver, KubeControllerManager]));
    }

    #[test]
    fn a_standby_is_known_by_its_peer_port() {
        let spec = seed::ControlPlaneSpec::new("b");
        let addr = spec.endpoint.address;
        let (_, peer) = spec.endpoint.standby_ports(3);
        assert_eq!(
            super::standby_slot(&spec, &format!("https://{addr}:{peer}")),
            Some(3)
        );
        let host = spec.endpoint.etcd_peer_url();
        assert_eq!(super::standby_slot(&spec, &host), None);
        let client = spec.endpoint.standby_ports(3).0;
        assert_eq!(
            super::standby_slot(&spec, &format!("https://{addr}:{client}")),
            None
        );
    }
}
