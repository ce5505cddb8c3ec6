//! The member's part in the quorum: keeping the directory of peers current,
//! bootstrapping the ring state, reporting health to the leader and, while
//! this member leads, the decision loop (`decide.rs`) that proposes failovers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raft::StateRole;
use ring_proto::v1::ring_admin_client::RingAdminClient;
use ring_proto::v1::{HealthReport, ShootHealth};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::decide::{decide, DecisionTiming, LeaderView};
use crate::now_ms;
use crate::shared::{lock, Shared};
use crate::state::RingCommand;
use crate::transport::channel;

/// Sleeps `d` unless shutdown comes first; false on shutdown.
pub(crate) async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Keeps the directory of peers in step with the ring's members.
pub(crate) async fn sync_directory(shared: Arc<Shared>, stop: CancellationToken) {
    let mut rx = shared.node.watch();
    let mut known: Vec<(String, u64, String)> = Vec::new();
    loop {
        let members: Vec<(String, u64, String)> = rx
            .borrow_and_update()
            .state
            .members
            .iter()
            .map(|m| (m.name.clone(), m.id, m.address.clone()))
            .collect();
        if !members.is_empty() && members != known {
            let me = (
                shared.name().to_string(),
                shared.config.id,
                shared.config.listen.clone(),
            );
            shared.directory.replace(directory_entries(&members, me));
            known = members;
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

/// Who the directory authorizes once the ring state has members: exactly
/// those members, and this member itself (a joiner before its own entry
/// commits). The members of the config are the ring's first shape only: a
/// member removed since is never put back (it would keep its rights).
fn directory_entries(
    members: &[(String, u64, String)],
    me: (String, u64, String),
) -> Vec<(String, u64, String)> {
    let mut all = members.to_vec();
    if !all.iter().any(|(n, _, _)| *n == me.0) {
        all.push(me);
    }
    all
}

/// Proposes the initial ring state once this member leads a new ring.
pub(crate) async fn bootstrap(shared: Arc<Shared>, stop: CancellationToken) {
    if shared.config.join {
        return;
    }
    let members: Vec<(String, u64, String)> = shared
        .config
        .members
        .iter()
        .map(|m| (m.name.clone(), m.id, m.address.clone()))
        .collect();
    loop {
        let v = shared.node.view();
        if !v.state.members.is_empty() {
            return;
        }
        if v.role == StateRole::Leader {
            match first_epochs(&shared, &members).await {
                Ok(epochs) => match shared
                    .propose(RingCommand::Bootstrap {
                        members: members.clone(),
                        epochs,
                        hosts: shared.config.initial_hosts.clone(),
                    })
                    .await
                {
                    Ok(_) => tracing::info!("ring bootstrapped"),
                    Err(e) => tracing::debug!(error = %e, "bootstrap proposal"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the bucket's epochs; bootstrap waits")
                }
            }
        }
        if !pause(&stop, Duration::from_millis(200)).await {
            return;
        }
    }
}

/// The first epoch of each shoot whose bucket already holds objects (a ring
/// bootstrapped again on its bucket, or restored from it).
async fn first_epochs(
    shared: &Shared,
    members: &[(String, u64, String)],
) -> Result<std::collections::BTreeMap<String, u64>, crate::RingError> {
    let mut epochs = std::collections::BTreeMap::new();
    let Some(bucket) = shared.bucket() else {
        return Ok(epochs);
    };
    for (name, _, _) in members {
        let epoch = bucket.first_epoch(name).await?;
        if epoch > 1 {
            epochs.insert(name.clone(), epoch);
        }
    }
    Ok(epochs)
}

/// Reports the health of what this member serves to the leader, every heartbeat.
pub(crate) async fn report_health(shared: Arc<Shared>, stop: CancellationToken) {
    let every = Duration::from_millis(shared.timing().heartbeat_ms);
    let mut client: Option<(String, RingAdminClient<Channel>)> = None;
    let mut identity = shared.identity_changes();
    while pause(&stop, every).await {
        let v = shared.node.view();
        if v.leader_id == 0 {
            continue;
        }
        let shoots: Vec<ShootHealth> = lock(&shared.hosted)
            .iter()
            .filter(|(_, h)| h.serving)
            .map(|(s, h)| ShootHealth {
                shoot: s.clone(),
                ready: h.ready,
                detail: h.detail.clone(),
                revision: shared.backups.seen_revision(s).unwrap_or(0),
                kubernetes_version: h.versions.kubernetes.clone().unwrap_or_default(),
                etcd_version: h.versions.etcd.clone().unwrap_or_default(),
            })
            .collect();
        if v.leader_id == v.id {
            shared.record_report(shared.name(), shoots);
            continue;
        }
        let Some((leader, address)) = shared.directory.by_id(v.leader_id) else {
            continue;
        };
        if identity.has_changed().unwrap_or(false) {
            identity.borrow_and_update();
            client = None;
        }
        if client.as_ref().is_none_or(|(n, _)| *n != leader) {
            match channel(&shared.identity(), &address, &leader) {
                Ok(ch) => client = Some((leader.clone(), RingAdminClient::new(ch))),
                Err(e) => {
                    tracing::warn!(error = %e, "no channel to the leader");
                    continue;
                }
            }
        }
        if let Some((_, c)) = client.as_mut() {
            let report = HealthReport {
                member: shared.name().to_string(),
                shoots,
            };
            match tokio::time::timeout(every * 2, c.report_health(report)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!(%leader, error = %e, "health report refused"),
                Err(_) => tracing::debug!(%leader, "health report timed out"),
            }
        }
    }
}

/// This member's leadership: its term, since when (ms), and the leader it
/// followed before with when it last heard from it.
type Leadership = (u64, u64, Option<(String, u64)>);

/// While this member leads: decides (`decide.rs`) and proposes, every heartbeat.
pub(crate) async fn lead(shared: Arc<Shared>, stop: CancellationToken) {
    let every = Duration::from_millis(shared.timing().heartbeat_ms);
    let t = shared.timing();
    let timing = DecisionTiming {
        failure_window_ms: t.failure_window_ms,
        lease_ms: t.lease_ms,
        lease_margin_ms: t.lease_margin_ms,
        relink_after_ms: t.relink_after_ms,
        operation_deadline_ms: t.operation_deadline_ms,
        protection: shared.config.protection,
    };
    let mut leader_since: Option<Leadership> = None;
    let mut last_round = Instant::now();
    let mut stall_ended: Option<Instant> = None;
    while pause(&stop, every).await {
        // If this process itself stalled (SIGSTOP, swap, a long pause), the silence
        // it measured is its own: count silence from now, not from before.
        if last_round.elapsed() > every * 4 {
            tracing::warn!(stalled = ?last_round.elapsed(), "this member stalled; restarting failure detection");
            leader_since = None;
            stall_ended = Some(Instant::now());
        }
        last_round = Instant::now();
        let v = shared.node.view();
        if v.role != StateRole::Leader || v.state.members.is_empty() {
            leader_since = None;
            continue;
        }
        let now = now_ms();
        let (since, followed) = match &leader_since {
            Some((term, since, followed)) if *term == v.term => (*since, followed.clone()),
            _ => {
                lock(&shared.reports).clear();
                let election = Duration::from_millis(t.election_timeout_ms);
                let followed = followed_silence(&shared, &v, now, election, stall_ended);
                leader_since = Some((v.term, now, followed.clone()));
                (now, followed)
            }
        };
        let reports: BTreeMap<String, u64> = lock(&shared.reports)
            .iter()
            .map(|(k, (at, _))| (k.clone(), *at))
            .collect();
        let lease_seen = seen_in_wall_clock(&v.lease_seen, now);
        let revisions = reported_revisions(&shared, &v.state);
        let view = LeaderView {
            now_ms: now,
            leader_since_ms: since,
            followed: followed.as_ref().map(|(n, at)| (n.as_str(), *at)),
            leader: shared.name(),
            last_report_ms: &reports,
            lease_seen_ms: &lease_seen,
            revisions: &revisions,
        };
        for cmd in decide(&v.state, &view, &timing) {
            tracing::info!(?cmd, "leader decision");
            if let Err(e) = shared.propose(cmd).await {
                tracing::info!(error = %e, "decision not applied");
            }
        }
    }
}

/// The leader this member followed before it led, and when it last heard
/// from it (on the `now` frame), if that silence is what an election after
/// it looks like (`explained_silence`): the new leader then counts that
/// member's silence from its last message rather than from its own
/// election, one failure window after the old leader died instead of an
/// election plus a window.
fn followed_silence(
    shared: &Shared,
    v: &crate::node::NodeView,
    now: u64,
    election_timeout: Duration,
    stall_ended: Option<Instant>,
) -> Option<(String, u64)> {
    let (id, at) = v.followed?;
    if id == v.id {
        return None;
    }
    let ago = explained_silence(at, Instant::now(), stall_ended, election_timeout)?;
    let ago = u64::try_from(ago.as_millis()).ok()?;
    let (name, _) = shared.directory.by_id(id)?;
    Some((name, now.saturating_sub(ago)))
}

/// How long the followed leader has been silent (its last message at
/// `last_heard`), if an election explains that silence: at most three
/// election timeouts, and begun after this member's own last stall ended (a
/// silence that spans this member's stall may be the stall, not the old
/// leader's death; silence then counts from the election as for any member).
fn explained_silence(
    last_heard: Instant,
    now: Instant,
    stall_ended: Option<Instant>,
    election_timeout: Duration,
) -> Option<Duration> {
    if stall_ended.is_some_and(|end| last_heard <= end) {
        return None;
    }
    let ago = now.checked_duration_since(last_heard)?;
    (ago <= election_timeout * 3).then_some(ago)
}

/// Shoot → the newest etcd revision reported by a member that may have
/// served it since its last finished move (`RingState::newest_heard`).
fn reported_revisions(
    shared: &Shared,
    state: &crate::state::RingState,
) -> BTreeMap<String, crate::state::SeenRevision> {
    let reports = lock(&shared.reports);
    state
        .placements
        .keys()
        .filter_map(|shoot| {
            let heard = |member: &str| {
                let (at_ms, shoots) = reports.get(member)?;
                let h = shoots.iter().find(|h| &h.shoot == shoot)?;
                Some((*at_ms, h.revision))
            };
            Some((shoot.clone(), state.newest_heard(shoot, heard)?))
        })
        .collect()
}

/// The node's monotonic record of lease renewals, in the frame of `now_ms`
/// (this member's wall clock read once for this decision): only intervals
/// measured here enter it, never another host's clock.
fn seen_in_wall_clock(seen: &crate::node::LeaseSeen, now_ms: u64) -> BTreeMap<String, u64> {
    seen.iter()
        .map(|(shoot, at)| {
            let ago = at.elapsed().as_millis() as u64;
            (shoot.clone(), now_ms.saturating_sub(ago))
        })
        .collect()
}

/// Proposes the commands background work queues (backup progress), one at a
/// time; a command that does not commit is logged and dropped (the next
/// report carries newer progress).
pub(crate) async fn forward_commands(
    shared: Arc<Shared>,
    mut commands: tokio::sync::mpsc::Receiver<RingCommand>,
    stop: CancellationToken,
) {
    loop {
        let cmd = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            c = commands.recv() => match c { Some(c) => c, None => return },
        };
        if let Err(e) = shared.propose(cmd).await {
            tracing::debug!(error = %e, "queued command not applied");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, id: u64) -> (String, u64, String) {
        (name.into(), id, format!("127.0.0.1:{id}"))
    }

    /// The followed leader's silence counts only when an election explains it
    /// and it began after this member's own last stall: a stall long before,
    /// while following, must not discard the followed leader's silence at
    /// the next election.
    #[test]
    fn the_followed_leader_s_silence_counts_only_after_this_member_s_last_stall() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let election = Duration::from_millis(1_000);
        // (last heard, now, stall ended, silence counted)
        let table: [(u64, u64, Option<u64>, Option<u64>); 6] = [
            (10_000, 11_500, None, Some(1_500)),
            (10_000, 13_000, None, Some(3_000)),
            (10_000, 13_001, None, None),
            // a stall long before the silence began does not matter
            (10_000, 11_500, Some(2_000), Some(1_500)),
            // the silence spans this member's stall: not counted
            (10_000, 11_500, Some(11_000), None),
            (10_000, 11_500, Some(10_000), None),
        ];
        for (heard, now, stall, want) in table {
            let got = explained_silence(at(heard), at(now), stall.map(at), election);
            assert_eq!(
                got,
                want.map(Duration::from_millis),
                "heard {heard}, now {now}, stall ended {stall:?}"
            );
        }
    }

    /// m3 was in the first config but has left the ring: it is not
    /// authorized again; this member is there even before its entry commits.
    #[test]
    fn the_directory_holds_the_ring_s_members_and_this_member_only() {
        let members = [entry("m1", 1), entry("m2", 2), entry("m4", 4)];
        let names = |d: Vec<(String, u64, String)>| -> Vec<String> {
            d.into_iter().map(|(n, _, _)| n).collect()
        };
        assert_eq!(
            names(directory_entries(&members, entry("m1", 1))),
            ["m1", "m2", "m4"]
        );
        assert_eq!(
            names(directory_entries(&members, entry("m5", 5))),
            ["m1", "m2", "m4", "m5"]
        );
    }
}
