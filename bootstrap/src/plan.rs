//! The bootstrap plan: what to do next, decided from what is observed. Pure, so
//! a crash or a rerun resumes where the ring is, and the order is unit-tested.

use std::collections::BTreeSet;

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
    /// Wait until these nodes are registered and Ready in their shoots.
    AwaitNodes(Vec<String>),
    /// Everything is up.
    Done,
}

impl Step {
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
            Step::AwaitNodes(_) => "nodes ready".into(),
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
    /// Shoots whose control plane serves and answers `/readyz`.
    pub ready: BTreeSet<String>,
    /// Shoots whose kubeconfig is published.
    pub kubeconfigs: BTreeSet<String>,
    /// Every image archive the nodes import exists.
    pub images_built: bool,
    /// The node network and every node's namespace exist.
    pub node_network: bool,
    /// Members whose node has its config and certificates.
    pub nodes_configured: BTreeSet<String>,
    /// Members whose node supervisor runs.
    pub nodes_running: BTreeSet<String>,
    /// Members whose node is registered and Ready in its shoot.
    pub nodes_ready: BTreeSet<String>,
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
    if !o.quorum {
        return Step::AwaitQuorum;
    }
    let shoots: Vec<String> = config.members.iter().map(|m| m.name.clone()).collect();
    let not_ready: Vec<String> = shoots
        .iter()
        .filter(|s| !o.ready.contains(*s))
        .cloned()
        .collect();
    if !not_ready.is_empty() {
        return Step::AwaitControlPlanes(not_ready);
    }
    let unpublished: Vec<String> = shoots
        .into_iter()
        .filter(|s| !o.kubeconfigs.contains(s))
        .collect();
    if !unpublished.is_empty() {
        return Step::PublishKubeconfigs(unpublished);
    }
    next_node_step(config, o)
}

/// The steps that give every shoot its node (none when `nodes.perMember` is 0).
fn next_node_step(config: &RingConfig, o: &Observed) -> Step {
    if config.nodes.per_member == 0 {
        return Step::Done;
    }
    if !o.images_built {
        return Step::BuildImages;
    }
    if !o.node_network {
        return Step::CreateNodeNetwork;
    }
    let all = crate::nodes::node_names(config);
    let names = || all.iter();
    if let Some(m) = names().find(|m| !o.nodes_configured.contains(*m)) {
        return Step::ConfigureNode(m.clone());
    }
    if let Some(m) = names().find(|m| !o.nodes_running.contains(*m)) {
        return Step::StartNode(m.clone());
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
            Step::AwaitQuorum => self.quorum = true,
            Step::AwaitControlPlanes(s) => self.ready.extend(s),
            Step::PublishKubeconfigs(s) => self.kubeconfigs.extend(s),
            Step::BuildImages => self.images_built = true,
            Step::CreateNodeNetwork => self.node_network = true,
            Step::ConfigureNode(m) => {
                self.nodes_configured.insert(m);
            }
            Step::StartNode(m) => {
                self.nodes_running.insert(m);
            }
            Step::AwaitNodes(s) => self.nodes_ready.extend(s),
            Step::Done => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(c: &RingConfig) -> BTreeSet<String> {
        c.members.iter().map(|m| m.name.clone()).collect()
    }

    #[test]
    fn fresh_dir_walks_every_step_in_order() {
        let c = RingConfig::default();
        let mut o = Observed::default();
        let mut seen = Vec::new();
        loop {
            let step = next_step(&c, &o);
            seen.push(step.clone());
            if !o.pretend(step) {
                break;
            }
        }
        // config, pki, member configs, 3 ringd, quorum, control planes,
        // kubeconfigs, images, node network, 3 node configs, 3 nodes, nodes ready, done
        assert_eq!(seen.len(), 3 + 3 + 3 + 2 + 3 + 3 + 2);
        assert_eq!(seen[3], Step::StartMember("m1".into()));
        assert_eq!(seen[6], Step::AwaitQuorum);
        assert_eq!(seen[9], Step::BuildImages);
        assert_eq!(seen[10], Step::CreateNodeNetwork);
        assert_eq!(seen[11], Step::ConfigureNode("m1".into()));
        assert_eq!(seen[14], Step::StartNode("m1".into()));
        assert_eq!(
            seen[17],
            Step::AwaitNodes(vec!["m1".into(), "m2".into(), "m3".into()])
        );
        assert_eq!(seen[18], Step::Done);
        let mut without = c.clone();
        without.nodes.per_member = 0;
        let mut o = Observed::default();
        let mut n = 0;
        while o.pretend(next_step(&without, &o)) {
            n += 1;
        }
        assert_eq!(
            n,
            3 + 3 + 3,
            "a ring without nodes ends after its kubeconfigs"
        );
    }

    #[test]
    fn rerun_on_a_complete_ring_is_done_and_a_stopped_member_is_restarted() {
        let c = RingConfig::default();
        let mut o = Observed {
            config_written: true,
            pki_complete: true,
            member_configs_written: true,
            running: all(&c),
            quorum: true,
            ready: all(&c),
            kubeconfigs: all(&c),
            images_built: true,
            node_network: true,
            nodes_configured: all(&c),
            nodes_running: all(&c),
            nodes_ready: all(&c),
        };
        assert_eq!(next_step(&c, &o), Step::Done);
        o.nodes_running.remove("m3");
        assert_eq!(next_step(&c, &o), Step::StartNode("m3".into()));
        o.node_network = false;
        assert_eq!(
            next_step(&c, &o),
            Step::CreateNodeNetwork,
            "after `down` the network comes first"
        );
        o.running.remove("m2");
        assert_eq!(next_step(&c, &o), Step::StartMember("m2".into()));
    }

    #[test]
    fn waits_for_the_control_planes_that_are_not_ready() {
        let c = RingConfig::default();
        let o = Observed {
            config_written: true,
            pki_complete: true,
            member_configs_written: true,
            running: all(&c),
            quorum: true,
            ready: ["m1".to_string()].into(),
            ..Default::default()
        };
        assert_eq!(
            next_step(&c, &o),
            Step::AwaitControlPlanes(vec!["m2".into(), "m3".into()])
        );
    }
}
