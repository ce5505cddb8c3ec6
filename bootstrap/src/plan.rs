//! The bootstrap plan: what to do next, decided from what is observed. Pure, so
//! a crash or a rerun resumes where the ring is, and the order is unit-tested.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::RingConfig;

/// One step of creating (or resuming) a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write the effective Ring config into the state dir.
    WriteConfig,
    /// Create the ring's CA and every identity.
    IssuePki,
    /// Write each member's ringd config.
    WriteMemberConfigs,
    /// Start this member's ringd (in the background).
    StartMember(String),
    /// Wait until the members elected a leader and committed the ring.
    AwaitQuorum,
    /// Wait until these shoots' control planes serve on their hosts.
    AwaitControlPlanes(Vec<String>),
    /// Copy these shoots' admin kubeconfigs to their stable place.
    PublishKubeconfigs(Vec<String>),
    /// Build the container images the nodes run (none are pulled).
    BuildImages,
    /// Create the node network (a namespace per node, a bridge, routes).
    CreateNodeNetwork,
    /// Issue this member's node certificates from its shoot's CA; write its config.
    ConfigureNode(String),
    /// Start this member's node supervisor (in the background).
    StartNode(String),
    /// Let this node's kubelet renew its client certificate in its shoot
    /// (needs the shoot's API).
    AllowRenewals(String),
    /// Wait until these nodes are registered and Ready in their shoots.
    AwaitNodes(Vec<String>),
    /// Wait until the moves of these shoots' control planes end.
    AwaitMoves(Vec<String>),
    /// Move `shoot` off `from` (planned migration to `to`) so that member
    /// `from` hosts nothing while its seed changes kind.
    Evacuate {
        shoot: String,
        from: String,
        to: String,
    },
    /// Make this member host as pods on its own shoot's node: its ringd's seed
    /// becomes a Kubernetes seed on its shoot, and ringd restarts.
    SwitchSeed(String),
    /// Move `shoot` into pods on member `to`'s node (planned migration).
    Pivot { shoot: String, to: String },
    /// These moves (evacuations and pivots) at the same time: none moves a
    /// shoot whose API another one needs (see [`independent`]).
    Moves(Vec<Step>),
    /// Cold start of a closed ring (every control plane in pods, none
    /// serving, so no node can get its pods): `member` hosts its successor
    /// `shoot` as processes again, from the etcd data its pods left on the
    /// node; the other control planes follow node by node, then `shoot`
    /// pivots back into pods.
    ColdStart { member: String, shoot: String },
    /// Everything is up.
    Done,
}

impl Step {
    /// Whether this step changes the ring (writes, starts or moves
    /// something); waiting for what is already under way does not, so a
    /// rerun that only waits for a node to turn Ready found the ring up.
    pub fn acts(&self) -> bool {
        match self {
            Step::AwaitQuorum
            | Step::AwaitControlPlanes(_)
            | Step::AwaitNodes(_)
            | Step::AwaitMoves(_)
            | Step::Done => false,
            Step::Moves(moves) => moves.iter().any(Step::acts),
            _ => true,
        }
    }

    /// A short label for progress output and timings.
    pub fn label(&self) -> String {
        match self {
            Step::WriteConfig => "write ring config".into(),
            Step::IssuePki => "issue certificates".into(),
            Step::WriteMemberConfigs => "write member configs".into(),
            Step::StartMember(m) => format!("start ringd {m}"),
            Step::AwaitQuorum => "form the quorum".into(),
            Step::AwaitControlPlanes(_) => "start control planes".into(),
            Step::PublishKubeconfigs(_) => "publish kubeconfigs".into(),
            Step::BuildImages => "build images".into(),
            Step::CreateNodeNetwork => "create the node network".into(),
            Step::ConfigureNode(m) => format!("configure node {m}"),
            Step::StartNode(m) => format!("start node {m}"),
            Step::AllowRenewals(m) => format!("let node {m} renew its certificate"),
            Step::AwaitNodes(_) => "nodes ready".into(),
            Step::AwaitMoves(s) => format!("wait for the moves of {}", s.join(", ")),
            Step::Evacuate { shoot, from, to } => format!("move {shoot} off {from} to {to}"),
            Step::SwitchSeed(m) => format!("make {m} host as pods"),
            Step::Pivot { shoot, to } => format!("move {shoot} into pods on {to}"),
            Step::Moves(moves) => moves.iter().map(Step::label).collect::<Vec<_>>().join("; "),
            Step::ColdStart { member, shoot } => {
                format!("cold start: {member} hosts {shoot} as processes")
            }
            Step::Done => "done".into(),
        }
    }
}

/// What the executor saw in the state dir and the running ring.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub config_written: bool,
    pub pki_complete: bool,
    pub member_configs_written: bool,
    /// Members whose ringd runs.
    pub running: BTreeSet<String>,
    /// A leader exists and the ring state lists every member.
    pub quorum: bool,
    /// Members whose ringd does not answer or knows no leader (yet).
    pub lagging: BTreeSet<String>,
    /// Shoots whose control plane serves and answers `/readyz`.
    pub ready: BTreeSet<String>,
    /// Shoots whose kubeconfig is published.
    pub kubeconfigs: BTreeSet<String>,
    /// Every image archive the nodes import exists.
    pub images_built: bool,
    /// The node network and every node's namespace exist.
    pub node_network: bool,
    /// Shoots whose CA is on the member that hosts them (written as their
    /// control plane is created): their nodes can be configured.
    pub cas: BTreeSet<String>,
    /// Members whose node has its config and certificates.
    pub nodes_configured: BTreeSet<String>,
    /// Nodes whose shoot lets their kubelet renew its client certificate.
    pub renewals: BTreeSet<String>,
    /// Members whose node supervisor runs.
    pub nodes_running: BTreeSet<String>,
    /// Members whose node is registered and Ready in its shoot.
    pub nodes_ready: BTreeSet<String>,
    /// Where each shoot's control plane is placed (shoot -> member).
    pub placements: BTreeMap<String, String>,
    /// Shoots with a failover or migration that has not ended.
    pub moving: BTreeSet<String>,
    /// Members whose ringd hosts as pods (its config has a Kubernetes seed).
    pub pod_seeds: BTreeSet<String>,
    /// The shoot of the newest failover or migration.
    pub last_moved: Option<String>,
}

impl Observed {
    /// Whether `shoot`'s control plane is placed on a member that hosts as pods.
    fn pod_hosted(&self, shoot: &str) -> bool {
        self.placements
            .get(shoot)
            .is_some_and(|h| self.pod_seeds.contains(h))
    }
}

/// The next step towards a complete ring.
pub fn next_step(config: &RingConfig, o: &Observed) -> Step {
    if !o.config_written {
        return Step::WriteConfig;
    }
    if !o.pki_complete {
        return Step::IssuePki;
    }
    if !o.member_configs_written {
        return Step::WriteMemberConfigs;
    }
    if let Some(m) = config.members.iter().find(|m| !o.running.contains(&m.name)) {
        return Step::StartMember(m.name.clone());
    }
    // every ringd in the ring again before the next step: a seed switch
    // restarts its member's ringd, and a second switch before the first
    // member knows the leader again left two of three ringds out, so no
    // lease was renewed and every control plane fenced itself
    if !o.quorum || !o.lagging.is_empty() {
        return Step::AwaitQuorum;
    }
    // a node needs its shoot's CA, not its API: the nodes start while the
    // control planes come up (a kubelet takes seconds before it registers,
    // most of them cAdvisor looking for a Docker daemon)
    if let Some(step) = node_setup_step(config, o) {
        return step;
    }
    // control planes in pods need their host's node: awaited after the nodes
    if let Some(step) = await_and_publish(config, o, |s| !o.pod_hosted(s)) {
        return step;
    }
    let step = next_node_step(config, o);
    if matches!(step, Step::AwaitNodes(_)) && cold(config, o) {
        if let Some(step) = cold_start_step(config, o) {
            return step;
        }
    }
    if step != Step::Done {
        return step;
    }
    if let Some(step) = await_and_publish(config, o, |_| true) {
        return step;
    }
    next_pivot_step(config, o)
}

/// Waits for the control planes of the shoots `include` selects, then
/// publishes the kubeconfigs of those that serve; `None` when both are done.
fn await_and_publish(
    config: &RingConfig,
    o: &Observed,
    include: impl Fn(&str) -> bool,
) -> Option<Step> {
    let shoots = config
        .members
        .iter()
        .map(|m| m.name.clone())
        .filter(|s| include(s));
    let not_ready: Vec<String> = shoots.clone().filter(|s| !o.ready.contains(s)).collect();
    if !not_ready.is_empty() {
        return Some(Step::AwaitControlPlanes(not_ready));
    }
    let unpublished: Vec<String> = shoots.filter(|s| !o.kubeconfigs.contains(s)).collect();
    (!unpublished.is_empty()).then_some(Step::PublishKubeconfigs(unpublished))
}

/// Whether the ring is closed and stopped: every control plane in pods, none
/// serving, every node started and none registered (each waits for the API
/// that runs on another node's pods).
fn cold(config: &RingConfig, o: &Observed) -> bool {
    let names = || config.members.iter().map(|m| &m.name);
    names().all(|m| o.pod_hosted(m))
        && o.ready.is_empty()
        && o.nodes_ready.is_empty()
        && crate::nodes::node_names(config)
            .iter()
            .all(|n| o.nodes_running.contains(n))
}

/// Which control plane starts as processes in a cold start: the first member
/// in ring order that hosts its own successor (the closed ring's shape),
/// else (a failover moved one and the ring stopped before it moved back) the
/// first placed shoot, where it is.
fn cold_start_step(config: &RingConfig, o: &Observed) -> Option<Step> {
    let names = || config.members.iter().map(|m| m.name.clone());
    let hosted_by = |shoot: &str| o.placements.get(shoot).cloned();
    let (member, shoot) = names()
        .filter_map(|m| config.successor(&m).map(|s| (m, s)))
        .find(|(m, s)| hosted_by(s).as_ref() == Some(m))
        .or_else(|| names().find_map(|s| hosted_by(&s).map(|h| (h, s))))?;
    Some(Step::ColdStart { member, shoot })
}

/// The order members switch to hosting as pods: `selfHosting.members`; for a
/// closed ring (every member listed), ring order starting at the last member,
/// so that each shoot waiting for its host's switch has a place to wait (as
/// processes, or as pods on a member already switched).
pub fn pivot_order(config: &RingConfig) -> Vec<String> {
    let listed = &config.self_hosting.members;
    let names: Vec<String> = config.members.iter().map(|m| m.name.clone()).collect();
    if names.is_empty() || listed.len() < names.len() {
        return listed.clone();
    }
    let last = names.len() - 1;
    std::iter::once(names[last].clone())
        .chain(names[..last].iter().cloned())
        .collect()
}

/// Where shoots start when a ring with self-hosting members is created
/// (shoot -> member; shoots not named start on their predecessor). A member
/// that switches to pods starts hosting nothing, so it switches before any
/// move and its successor moves once, into pods on it, instead of away and
/// back. That successor starts where [`evacuation_target`] would send it:
/// the next member in ring order that stays hosting as processes and is not
/// the shoot itself, else the first such member. In a closed ring the member
/// that switches last is that one: it takes every shoot at the start.
pub fn initial_hosts(config: &RingConfig) -> BTreeMap<String, String> {
    let order = pivot_order(config);
    let closed = !config.members.is_empty() && order.len() >= config.members.len();
    let empty = &order[..order.len() - usize::from(closed)];
    let mut hosts = BTreeMap::new();
    for member in empty {
        let Some(shoot) = config.successor(member) else {
            continue;
        };
        if let Some(host) = nearest_after(config, member, &shoot, |n| !empty.iter().any(|e| e == n))
        {
            hosts.insert(shoot, host);
        }
    }
    hosts
}

/// The steps that move each self-hosting member's successor into pods on
/// that member's node: a member that hosts nothing switches its seed to its
/// own shoot at once; a member that hosts its successor first moves it away
/// (evacuation); a switched member takes its successor in (pivot). Of the
/// moves possible, evacuations go first (the member that switches last
/// frees itself while the other nodes are undisturbed), then in
/// [`pivot_order`], but not one onto or off the node of the shoot that moved
/// last if another move can go first: that node's kubelet lost its API
/// during the move and backs off for up to half a minute before it lists its
/// pods again, so it would start (or stop) the moving pods that much later.
fn next_pivot_step(config: &RingConfig, o: &Observed) -> Step {
    let moving: Vec<String> = o.moving.iter().cloned().collect();
    if !moving.is_empty() {
        return Step::AwaitMoves(moving);
    }
    let order = pivot_order(config);
    let hosts_nothing = |m: &str| !o.placements.values().any(|h| h == m);
    if let Some(m) = order
        .iter()
        .find(|m| !o.pod_seeds.contains(*m) && hosts_nothing(m))
    {
        return Step::SwitchSeed(m.clone());
    }
    let mut moves = possible_moves(config, o, &order);
    moves.sort_by_key(|s| !matches!(s, Step::Evacuate { .. }));
    let on_last_moved = |s: &Step| {
        let (shoot, to) = match s {
            Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } => (shoot, to),
            _ => return false,
        };
        let from = o.placements.get(shoot).filter(|h| o.pod_seeds.contains(*h));
        o.last_moved.is_some()
            && (o.last_moved.as_ref() == Some(to) || o.last_moved.as_ref() == from)
    };
    let Some(first) = moves.iter().find(|s| !on_last_moved(s)).or(moves.first()) else {
        return Step::Done;
    };
    together(o, first, &moves)
}

/// `first` with every pivot of `moves` that is [`independent`] of it and of
/// those taken before: one move costs 15-20 s, mostly waiting for the new
/// pods to serve, so two that cannot disturb each other go at once. Only
/// pivots join (each puts a shoot where it stays); evacuations go one at a
/// time, as each frees the member that switches next.
fn together(o: &Observed, first: &Step, moves: &[Step]) -> Step {
    let mut batch = vec![first.clone()];
    for m in moves.iter().filter(|m| matches!(m, Step::Pivot { .. })) {
        if batch.iter().all(|b| independent(o, b, m)) {
            batch.push(m.clone());
        }
    }
    match batch.len() {
        1 => first.clone(),
        _ => Step::Moves(batch),
    }
}

/// The shoot a move moves, and the members whose shoots' APIs it needs: the
/// target and the source, each when it hosts as pods (the pods start and
/// stop through that shoot's API); `None` for other steps.
fn move_needs<'a>(o: &'a Observed, step: &'a Step) -> Option<(&'a str, Vec<&'a str>)> {
    let (shoot, to) = match step {
        Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } => (shoot, to),
        _ => return None,
    };
    let from = o.placements.get(shoot);
    let needs = std::iter::once(to)
        .chain(from)
        .filter(|m| o.pod_seeds.contains(*m))
        .map(String::as_str)
        .collect();
    Some((shoot, needs))
}

/// Whether moves `a` and `b` can run at the same time: they move different
/// shoots, and neither takes away the API of a shoot the other one needs
/// (its control plane is away for the whole move, and the kubelets of that
/// shoot's node back off meanwhile).
fn independent(o: &Observed, a: &Step, b: &Step) -> bool {
    let (Some((sa, na)), Some((sb, nb))) = (move_needs(o, a), move_needs(o, b)) else {
        return false;
    };
    sa != sb && !na.contains(&sb) && !nb.contains(&sa)
}

/// Every move [`next_pivot_step`] may make now, in `order`.
fn possible_moves(config: &RingConfig, o: &Observed, order: &[String]) -> Vec<Step> {
    let mut moves = Vec::new();
    for m in order {
        let Some(shoot) = config.successor(m) else {
            continue;
        };
        let host = o.placements.get(&shoot);
        if o.pod_seeds.contains(m) {
            if host != Some(m) {
                moves.push(Step::Pivot {
                    shoot,
                    to: m.clone(),
                });
            }
        } else if host == Some(m) {
            if let Some(to) = evacuation_target(config, o, m, &shoot) {
                moves.push(Step::Evacuate {
                    shoot,
                    from: m.clone(),
                    to,
                });
            }
        }
    }
    moves
}

/// Where `shoot` waits while `member`'s seed changes kind: the next member in
/// ring order after `member` that hosts as processes and is not `shoot`
/// itself, else any other member hosting as processes, else (the last switch
/// of a closed ring) the next member hosting as pods that is not `shoot`.
fn evacuation_target(
    config: &RingConfig,
    o: &Observed,
    member: &str,
    shoot: &str,
) -> Option<String> {
    nearest_after(config, member, shoot, |n| !o.pod_seeds.contains(n))
        .or_else(|| nearest_after(config, member, shoot, |n| n != shoot))
}

/// The first member after `member` in ring order that `keep` accepts and is
/// not `shoot`, else the first that `keep` accepts (then `shoot` itself).
fn nearest_after(
    config: &RingConfig,
    member: &str,
    shoot: &str,
    keep: impl Fn(&str) -> bool,
) -> Option<String> {
    let names: Vec<&str> = config.members.iter().map(|m| m.name.as_str()).collect();
    let at = names.iter().position(|n| *n == member)?;
    let kept: Vec<&str> = (1..names.len())
        .map(|k| names[(at + k) % names.len()])
        .filter(|n| keep(n))
        .collect();
    kept.iter()
        .find(|n| **n != shoot)
        .or(kept.first())
        .map(|n| n.to_string())
}

/// What sets the nodes up without any shoot's API: images, the node network,
/// the config of each node whose shoot's CA exists, and starting configured
/// nodes; `None` when none of that is left now.
fn node_setup_step(config: &RingConfig, o: &Observed) -> Option<Step> {
    if config.nodes.per_member == 0 {
        return None;
    }
    if !o.images_built {
        return Some(Step::BuildImages);
    }
    if !o.node_network {
        return Some(Step::CreateNodeNetwork);
    }
    let all = crate::nodes::node_names(config);
    let has_ca = |n: &String| crate::nodes::shoot_of(config, n).is_some_and(|s| o.cas.contains(&s));
    if let Some(m) = all
        .iter()
        .find(|m| !o.nodes_configured.contains(*m) && has_ca(m))
    {
        return Some(Step::ConfigureNode(m.clone()));
    }
    all.iter()
        .find(|m| o.nodes_configured.contains(*m) && !o.nodes_running.contains(*m))
        .map(|m| Step::StartNode(m.clone()))
}

/// The steps that give every shoot its node (none when `nodes.perMember` is 0):
/// [`node_setup_step`], a node whose CA never showed up (configuring it names
/// what is missing), renewals once each shoot's API answers, then every node
/// Ready.
fn next_node_step(config: &RingConfig, o: &Observed) -> Step {
    if config.nodes.per_member == 0 {
        return Step::Done;
    }
    if let Some(step) = node_setup_step(config, o) {
        return step;
    }
    let all = crate::nodes::node_names(config);
    let names = || all.iter();
    if let Some(m) = names().find(|m| !o.nodes_configured.contains(*m)) {
        return Step::ConfigureNode(m.clone());
    }
    // a shoot whose API is away (a stopped closed ring) gets it later
    let api_up = |n: &String| {
        crate::nodes::shoot_of(config, n)
            .is_some_and(|s| o.ready.contains(&s) && o.kubeconfigs.contains(&s))
    };
    if let Some(m) = names().find(|m| !o.renewals.contains(*m) && api_up(m)) {
        return Step::AllowRenewals(m.clone());
    }
    let not_ready: Vec<String> = names()
        .filter(|m| !o.nodes_ready.contains(*m))
        .cloned()
        .collect();
    if !not_ready.is_empty() {
        return Step::AwaitNodes(not_ready);
    }
    Step::Done
}

#[cfg(test)]
impl Observed {
    /// What the executor would observe after `step` succeeded; false at `Done`.
    pub(crate) fn pretend(&mut self, step: Step) -> bool {
        match step {
            Step::WriteConfig => self.config_written = true,
            Step::IssuePki => self.pki_complete = true,
            Step::WriteMemberConfigs => self.member_configs_written = true,
            Step::StartMember(m) => {
                self.running.insert(m);
            }
            Step::AwaitQuorum => {
                self.quorum = true;
                self.lagging.clear();
            }
            Step::AwaitControlPlanes(s) => {
                // their CAs were written as they were created
                self.cas.extend(s.iter().cloned());
                self.ready.extend(s)
            }
            Step::PublishKubeconfigs(s) => self.kubeconfigs.extend(s),
            Step::BuildImages => self.images_built = true,
            Step::CreateNodeNetwork => self.node_network = true,
            Step::ConfigureNode(m) => {
                self.nodes_configured.insert(m);
            }
            Step::StartNode(m) => {
                self.nodes_running.insert(m);
            }
            Step::AllowRenewals(m) => {
                self.renewals.insert(m);
            }
            Step::AwaitNodes(s) => self.nodes_ready.extend(s),
            Step::AwaitMoves(s) => s.iter().for_each(|s| {
                self.moving.remove(s);
            }),
            Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } => {
                self.last_moved = Some(shoot.clone());
                self.placements.insert(shoot, to);
            }
            Step::Moves(moves) => {
                for m in moves {
                    self.pretend(m);
                }
            }
            Step::ColdStart { member, .. } => {
                self.pod_seeds.remove(&member);
                // processes, then every node and control plane in turn
                self.ready = self.placements.keys().cloned().collect();
                self.nodes_ready = self.nodes_running.clone();
            }
            Step::SwitchSeed(m) => {
                // its ringd restarts
                self.lagging.insert(m.clone());
                self.pod_seeds.insert(m);
            }
            Step::Done => return false,
        }
        true
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
