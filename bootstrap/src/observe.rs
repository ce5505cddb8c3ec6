//! What bootstrap observes before each step (files, processes, the members'
//! status, nodes): the input of the pure plan in [`crate::plan`].

use std::collections::BTreeSet;

use ringd::client::AdminClient;
use ringd::identity::RingPki;
use ringd::status::RingStatus;

use crate::plan::Observed;
use crate::{nodes, selfhost, RingConfig, RingLayout};

/// What bootstrap sees of the ring in `layout`: files, processes, each
/// member's status, nodes, and what self-hosting needs.
pub(crate) async fn observe(layout: &RingLayout, config: &RingConfig) -> Observed {
    let pki = RingPki::new(layout.pki());
    let names: Vec<&str> = config.members.iter().map(|m| m.name.as_str()).collect();
    let files_exist = |n: &str| {
        let f = pki.files(n);
        f.ca.exists() && f.cert.exists() && f.key.exists()
    };
    let mut o = Observed {
        config_written: layout.config_file().exists(),
        pki_complete: files_exist(ringd::identity::ADMIN_NAME)
            && names.iter().all(|n| files_exist(n)),
        member_configs_written: names.iter().all(|n| layout.ringd_config(n).exists()),
        running: names
            .iter()
            .filter(|n| layout.running_pid(n).is_some())
            .map(|n| n.to_string())
            .collect(),
        ..Default::default()
    };
    if o.running.len() < names.len() {
        return o;
    }
    let mut kubeconfigs = BTreeSet::new();
    let mut views = Vec::new();
    let mut lagging: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    for i in 0..names.len() {
        let Ok(mut client) = AdminClient::connect(&config.member_address(i), &layout.pki()) else {
            continue;
        };
        let Ok(status) = client.status().await else {
            continue;
        };
        if status.leader.is_some() {
            lagging.remove(names[i]);
            o.quorum |= names
                .iter()
                .all(|n| status.members.iter().any(|m| m.name == *n));
        }
        for h in &status.hosted {
            if h.serving && h.ready {
                o.ready.insert(h.shoot.clone());
            }
        }
        views.push(status);
    }
    o.lagging = lagging;
    // placements and moves from the view that applied the most: a member
    // ringd restarted a moment ago knows the leader before it has caught up,
    // and its placements are those of before it stopped
    let keys: Vec<ViewKey> = views
        .iter()
        .map(|s| ViewKey {
            knows_leader: s.leader.is_some(),
            term: s.term,
            applied: s.applied_index,
        })
        .collect();
    if let Some(i) = freshest(&keys) {
        observe_moves(&views[i], &mut o);
    }
    for n in &names {
        if layout.kubeconfig(n).exists() {
            kubeconfigs.insert(n.to_string());
        }
    }
    o.kubeconfigs = kubeconfigs;
    observe_nodes(layout, config, &mut o);
    // ringd restarts right after its config changes (stopped, written, started)
    o.pod_seeds = names
        .iter()
        .filter(|n| selfhost::hosts_as_pods(layout, n))
        .map(|n| n.to_string())
        .collect();
    o
}

/// What tells two members' views of the ring apart in age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ViewKey {
    knows_leader: bool,
    term: u64,
    applied: u64,
}

/// The index of the newest view among those that know a leader: the highest
/// term, then the most entries applied (the first of equals).
fn freshest(views: &[ViewKey]) -> Option<usize> {
    let newest = views
        .iter()
        .filter(|v| v.knows_leader)
        .map(|v| (v.term, v.applied))
        .max()?;
    views
        .iter()
        .position(|v| v.knows_leader && (v.term, v.applied) == newest)
}

/// Placements and unfinished moves, from the newest view ([`freshest`]).
fn observe_moves(status: &RingStatus, o: &mut Observed) {
    for p in &status.placements {
        o.placements.insert(p.shoot.clone(), p.host.clone());
    }
    for op in status.operations.iter().filter(|op| !op.step.is_finished()) {
        o.moving.insert(op.shoot().to_string());
    }
    o.last_moved = status
        .operations
        .iter()
        .max_by_key(|op| op.id)
        .map(|op| op.shoot().to_string());
}

fn observe_nodes(layout: &RingLayout, config: &RingConfig, o: &mut Observed) {
    if config.nodes.per_member == 0 {
        return;
    }
    o.images_built = nodes::images_built();
    o.node_network = nodes::network_up(layout, config);
    for (shoot, host) in &o.placements {
        if nodes::shoot_pki_dir(layout, shoot, host)
            .join("ca.crt")
            .exists()
        {
            o.cas.insert(shoot.clone());
        }
    }
    for m in &nodes::node_names(config) {
        if nodes::configured(layout, m) {
            o.nodes_configured.insert(m.clone());
        }
        if nodes::renewals_allowed(layout, m) {
            o.renewals.insert(m.clone());
        }
        if let Some(pid) = nodes::running_pid(layout, m) {
            o.nodes_running.insert(m.clone());
            // a status written by an earlier supervisor does not count
            if nodes::status(layout, m)
                .is_some_and(|s| s.pid == pid && s.registration.ready && s.phase == "Running")
            {
                o.nodes_ready.insert(m.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(knows_leader: bool, term: u64, applied: u64) -> ViewKey {
        ViewKey {
            knows_leader,
            term,
            applied,
        }
    }

    /// A member restarted a moment ago (it knows the leader, has applied
    /// less) is not the view placements are read from, whatever its place in
    /// the member list; a member without a leader never is.
    #[test]
    fn placements_come_from_the_view_that_applied_the_most() {
        let restarted = view(true, 2, 410);
        let leader = view(true, 2, 733);
        let follower = view(true, 2, 731);
        let lost = view(false, 3, 900);
        for (views, want) in [
            (vec![restarted, leader, follower], Some(1)),
            (vec![follower, restarted, leader], Some(2)),
            (vec![leader, leader], Some(0)),
            (vec![lost, restarted], Some(1)),
            (vec![view(true, 3, 5), leader], Some(0)),
            (vec![lost], None),
            (vec![], None),
        ] {
            assert_eq!(freshest(&views), want, "{views:?}");
        }
    }
}
