//! Self-hosting (`selfHosting.members` in the Ring config): a member hosts
//! its successor's control plane as pods on its own shoot's node instead of
//! as processes next to its ringd. The plan ([`crate::plan`]) decides the
//! order; this file does the steps that are not migrations:
//!
//! * **switching the member's seed**: once it hosts nothing, its ringd config
//!   gets a Kubernetes seed on its own shoot (the published admin kubeconfig,
//!   NodePort Services on its node's address, etcd's data and the lease file
//!   in the seed's dir on the node: `leaseFromNode`) and ringd restarts. The
//!   local seed's leftovers (the data of control planes that moved away) are
//!   kept aside under `seed-local-retired-*`, so the new seed starts empty;
//! * **where each control plane runs**, for `ringctl status`.
//!
//! The cold start of a closed ring, which switches a member back to a local
//! seed, is in `coldstart.rs`.

use std::time::Duration;

use ringd::config::RingdConfig;

use crate::config::{RingConfig, SeedSpec};
use crate::error::io;
use crate::process::stop_processes;
use crate::{ring_status, start_member, BootstrapError, RingLayout};

/// The seed a self-hosting `member` runs: its own shoot, Services on its
/// first node's address.
fn pod_seed(
    layout: &RingLayout,
    config: &RingConfig,
    member: &str,
) -> Result<seed::KubernetesSeedConfig, BootstrapError> {
    let node = crate::nodes::nodes_of(config, member)
        .into_iter()
        .next()
        .ok_or_else(|| unsupported(format!("{member} has no node to host pods on")))?;
    let address = crate::nodes::network(layout, config)?
        .and_then(|n| n.hosts.into_iter().find(|h| h.name == node))
        .map(|h| h.address)
        .ok_or_else(|| unsupported(format!("node {node} is not on the ring's node network")))?;
    let spec = SeedSpec::Kubernetes {
        kubeconfig: std::path::absolute(layout.kubeconfig(member))
            .map_err(io("resolving the kubeconfig's path"))?
            .display()
            .to_string(),
        context: None,
        service_type: Some(seed::kubernetes::ServiceType::NodePort),
        node_address: Some(address.into()),
        storage_class: None,
    };
    let mut seed = spec
        .kubernetes_config(&config.name)
        .ok_or_else(|| unsupported("a Kubernetes seed spec without its config".into()))?;
    // the pods run on this machine: their guards read ringd's lease file, so
    // they keep serving while the seed cluster's own API is away
    seed.lease_from_node = true;
    // and on the node whose disk holds their files, without the scheduler;
    // ringd sees their processes in that node's cgroups
    seed.node_cgroup_root = crate::nodes::node_config(layout, &node).map(|n| n.cgroup_root);
    seed.node_name = Some(node);
    Ok(seed)
}

fn unsupported(reason: String) -> BootstrapError {
    BootstrapError::Unsupported(reason)
}

/// Whether `member`'s ringd config has a Kubernetes seed.
pub fn hosts_as_pods(layout: &RingLayout, member: &str) -> bool {
    RingdConfig::load(&layout.ringd_config(member))
        .is_ok_and(|rc| rc.seed.is_some_and(|s| s.kubernetes.is_some()))
}

/// Makes `member` host as pods on its own shoot: checks that it hosts nothing
/// and no move involves it, stops its ringd, puts its local seed's leftovers
/// aside, rewrites its ringd config with the Kubernetes seed and starts ringd.
pub async fn switch_seed(
    layout: &RingLayout,
    config: &RingConfig,
    ringd: &std::path::Path,
    member: &str,
) -> Result<(), BootstrapError> {
    let path = layout.ringd_config(member);
    let mut rc = RingdConfig::load(&path)?;
    let seed = rc
        .seed
        .as_mut()
        .ok_or_else(|| unsupported(format!("{member}'s ringd config has no seed section")))?;
    let switching = seed.kubernetes.is_none();
    if switching {
        let status = ring_status(layout, config).await?;
        if let Some(p) = status.placements.iter().find(|p| p.host == member) {
            return Err(unsupported(format!(
                "{member} still hosts {}: its seed changes kind only when it hosts nothing",
                p.shoot
            )));
        }
        if let Some(op) = status
            .operations
            .iter()
            .find(|op| !op.step.is_finished() && (op.source() == member || op.target() == member))
        {
            return Err(unsupported(format!(
                "operation {} of {} involves {member}: its seed changes kind after it ends",
                op.id,
                op.shoot()
            )));
        }
        seed.kubernetes = Some(pod_seed(layout, config, member)?);
        seed.api_advertise.clear();
    }
    stop_ringd(layout, member).await;
    if switching {
        retire_seed(layout, member, "local")?;
    }
    write_ringd_config(&path, member, &rc)?;
    start_member(layout, ringd, member)
}

pub(crate) fn write_ringd_config(
    path: &std::path::Path,
    member: &str,
    rc: &RingdConfig,
) -> Result<(), BootstrapError> {
    rc.validate()?;
    let yaml = serde_yaml::to_string(rc).map_err(|e| BootstrapError::Config {
        field: format!("{member}'s ringd config"),
        reason: e.to_string(),
    })?;
    seed::pki::write_private(path, yaml.as_bytes()).map_err(ringd::RingError::from)?;
    Ok(())
}

async fn stop_ringd(layout: &RingLayout, member: &str) {
    if let Some(pid) = layout.running_pid(member) {
        stop_processes(
            vec![(member.to_string(), pid)],
            |m| layout.running_pid(m).is_some(),
            Duration::from_secs(60),
            "ringd",
        )
        .await;
    }
}

/// Moves the seed's directory aside as `seed-<kind>-retired-<ms>` (kept for
/// an operator, never read again) so the seed of the other kind starts
/// without leftovers.
pub(crate) fn retire_seed(
    layout: &RingLayout,
    member: &str,
    kind: &str,
) -> Result<(), BootstrapError> {
    let dir = layout.seed_dir(member);
    if !dir.exists() {
        return Ok(());
    }
    let retired = layout
        .member_dir(member)
        .join(format!("seed-{kind}-retired-{}", ringd::now_ms()));
    std::fs::rename(&dir, &retired).map_err(io(format!(
        "moving {} aside to {}",
        dir.display(),
        retired.display()
    )))
}

/// Where a shoot's control plane runs (`ringctl status`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hosting {
    /// The shoot whose control plane this is.
    pub shoot: String,
    /// The member whose ringd hosts it.
    pub host: String,
    /// `pods` (in the host's shoot, on its node) or `processes` (next to ringd).
    pub r#as: String,
    /// With pods: the host's node they run on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// With pods: their namespace in the host's shoot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Where each placed control plane of the local ring runs, from the
/// placements in `status` and the hosts' ringd configs.
pub fn hosting(
    layout: &RingLayout,
    config: &RingConfig,
    status: &ringd::status::RingStatus,
) -> Vec<Hosting> {
    status
        .placements
        .iter()
        .map(|p| {
            let (shoot, host) = (&p.shoot, &p.host);
            let pods = hosts_as_pods(layout, host);
            Hosting {
                shoot: shoot.clone(),
                host: host.clone(),
                r#as: if pods { "pods" } else { "processes" }.into(),
                node: pods
                    .then(|| crate::nodes::nodes_of(config, host).into_iter().next())
                    .flatten(),
                namespace: pods.then(|| seed::kubernetes::render::namespace(&config.name, shoot)),
            }
        })
        .collect()
}

/// The control planes' table of `ringctl status` (empty without any).
pub fn render_hosting(rows: &[Hosting]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\ncontrol planes:\n");
    out.push_str(&format!(
        "  {:<8} {:<8} {:<10} WHERE\n",
        "SHOOT", "HOST", "AS"
    ));
    for h in rows {
        let place = match (&h.node, &h.namespace) {
            (Some(node), Some(ns)) => format!("shoot {}, node {node}, namespace {ns}", h.host),
            _ => format!("next to ringd {}", h.host),
        };
        out.push_str(&format!(
            "  {:<8} {:<8} {:<10} {place}\n",
            h.shoot, h.host, h.r#as
        ));
    }
    out
}
