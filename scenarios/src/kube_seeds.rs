//! Drill members whose seed is a Kubernetes cluster (`ring.kubernetesMembers`):
//! one seed cluster per such member (a control plane run by the runner and
//! one real node), the seed spec the member is bootstrapped with, killing the
//! node with its member (`killSeed`: the pods die with their machine) and
//! starting it again (`heal`), and where the double-serving checker looks for
//! control planes in pods.

use std::collections::BTreeMap;
use std::path::Path;

use bootstrap::config::SeedSpec;

use crate::drill::Drill;
use crate::netns::Network;
use crate::seed_cluster::SeedCluster;
use crate::ScenarioError;

/// etcd volumes per seed cluster: a control plane that comes back after its
/// data there was released binds a fresh one.
const VOLUMES: usize = 4;

/// The seed clusters of a drill's Kubernetes members, by member.
#[derive(Default)]
pub struct KubeSeeds {
    clusters: BTreeMap<String, SeedCluster>,
}

impl KubeSeeds {
    /// Starts a seed cluster under `dir` for every Kubernetes member of
    /// `drill` (`ring-node` next to `ringd`); the seed spec of each member.
    /// On a drill `network`, each cluster is reachable from its member's
    /// namespace by a link the drill's partitions do not cut.
    pub async fn start(
        dir: &Path,
        drill: &Drill,
        ringd: &Path,
        network: Option<&Network>,
    ) -> Result<(KubeSeeds, BTreeMap<String, SeedSpec>), ScenarioError> {
        let members = drill.members();
        let mut seeds = KubeSeeds::default();
        let mut specs = BTreeMap::new();
        for p in &drill.ring.kubernetes_members {
            let m = &members[p - 1];
            let volumes: Vec<String> = (1..=VOLUMES).map(|i| format!("{m}-etcd-{i}")).collect();
            let (cluster, spec) = SeedCluster::for_member(
                &dir.join(format!("seed-{m}")),
                &format!("{m}-seed"),
                ringd,
                &volumes,
            )
            .await?;
            if let Some(host) = network.and_then(|n| n.hosts().iter().find(|h| h.member == *m)) {
                cluster.reach_from(&host.netns, 0).await?;
            }
            seeds.clusters.insert(m.clone(), cluster);
            specs.insert(m.clone(), spec);
        }
        Ok((seeds, specs))
    }

    /// (member, its node's pod cgroup root) of every seed cluster.
    pub fn pod_nodes(&self) -> Vec<(String, String)> {
        self.clusters
            .iter()
            .map(|(m, c)| (m.clone(), c.pod_cgroup_root().to_string()))
            .collect()
    }

    /// Kills `member`'s node if it has one; whether it did.
    pub fn kill_node(&mut self, member: &str) -> bool {
        self.clusters
            .get_mut(member)
            .is_some_and(SeedCluster::kill_node)
    }

    /// Starts every killed node again; the members whose node came back.
    pub async fn revive(&mut self) -> Result<Vec<String>, ScenarioError> {
        let mut back = Vec::new();
        for (m, c) in self.clusters.iter_mut() {
            if c.revive_node().await? {
                back.push(m.clone());
            }
        }
        Ok(back)
    }

    /// Starts `member`'s node again if it has one and it was killed; whether
    /// it did (kubelet recreates the pods the seed cluster still schedules
    /// there: their lease guards must keep etcd and kube-apiserver down).
    pub async fn revive_member(&mut self, member: &str) -> Result<bool, ScenarioError> {
        match self.clusters.get_mut(member) {
            Some(c) => c.revive_node().await,
            None => Ok(false),
        }
    }

    /// Stops every seed cluster (nodes, node networks, control planes).
    pub async fn stop(self) {
        for (_, c) in self.clusters {
            c.stop().await;
        }
    }
}
