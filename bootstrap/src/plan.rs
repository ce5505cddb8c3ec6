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
        assert_eq!(seen.len(), 3 + 3 + 4);
        assert_eq!(seen[3], Step::StartMember("m1".into()));
        assert_eq!(seen[6], Step::AwaitQuorum);
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
        };
        assert_eq!(next_step(&c, &o), Step::Done);
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
