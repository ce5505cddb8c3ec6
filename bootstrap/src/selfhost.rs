//! Self-hosting (`selfHosting.members` in the Ring config): a member hosts
//! its successor's control plane as pods on its own shoot's node instead of
//! as processes next to its ringd. The plan ([`crate::plan`]) decides the
//! order; this file does the steps that are not migrations:
//!
//! * **etcd volumes** in the member's shoot (hostPath PersistentVolumes under
//!   the member's node directory: a ring's shoots have no provisioner);
//! * **switching the member's seed**: once it hosts nothing, its ringd config
//!   gets a Kubernetes seed on its own shoot (the published admin kubeconfig,
//!   NodePort Services on its node's address) and ringd restarts. The local
//!   seed's leftovers (the data of control planes that moved away) are kept
//!   aside under `seed-local-retired`, so the new seed starts empty.

use std::path::PathBuf;
use std::time::Duration;

use ringd::config::RingdConfig;

use crate::config::{RingConfig, SeedSpec};
use crate::{io, ring_status, start_member, stop_processes, BootstrapError, RingLayout};

/// etcd volumes per self-hosting member's shoot: every arrival of a control
/// plane binds a fresh one (a released hostPath volume is not bound again).
pub const VOLUMES: usize = 4;

/// The PersistentVolumes of `member`'s shoot, with their directories.
fn volumes(layout: &RingLayout, member: &str) -> Vec<(String, PathBuf)> {
    (1..=VOLUMES)
        .map(|i| {
            let name = format!("ring-etcd-{i}");
            let dir = crate::nodes::node_dir(layout, member)
                .join("volumes")
                .join(&name);
            (name, dir)
        })
        .collect()
}

async fn shoot_client(layout: &RingLayout, member: &str) -> Result<kube::Client, BootstrapError> {
    Ok(seed::kubeconfig::client(member, &layout.kubeconfig(member)).await?)
}

/// Whether `member`'s shoot holds every etcd volume (false when its API does
/// not answer).
pub async fn volumes_exist(layout: &RingLayout, member: &str) -> bool {
    let Ok(client) = shoot_client(layout, member).await else {
        return false;
    };
    let names: Vec<String> = volumes(layout, member).into_iter().map(|v| v.0).collect();
    seed::kubernetes::volumes::host_path_volumes_exist(client, member, &names)
        .await
        .unwrap_or(false)
}

/// Creates the etcd volumes that `member`'s shoot lacks.
pub async fn create_volumes(layout: &RingLayout, member: &str) -> Result<(), BootstrapError> {
    let client = shoot_client(layout, member).await?;
    Ok(seed::kubernetes::volumes::ensure_host_path_volumes(
        client,
        member,
        &volumes(layout, member),
    )
    .await?)
}

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
        retire_local_seed(layout, member)?;
    }
    rc.validate()?;
    let yaml = serde_yaml::to_string(&rc).map_err(|e| BootstrapError::Config {
        field: format!("{member}'s ringd config"),
        reason: e.to_string(),
    })?;
    seed::pki::write_private(&path, yaml.as_bytes()).map_err(ringd::RingError::from)?;
    start_member(layout, ringd, member)
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

/// Moves the local seed's directory aside (kept for an operator, never read
/// again) so the Kubernetes seed starts without another kind's leftovers.
fn retire_local_seed(layout: &RingLayout, member: &str) -> Result<(), BootstrapError> {
    let dir = layout.seed_dir(member);
    if !dir.exists() {
        return Ok(());
    }
    let retired = layout
        .member_dir(member)
        .join(format!("seed-local-retired-{}", ringd::now_ms()));
    std::fs::rename(&dir, &retired).map_err(io(format!(
        "moving {} aside to {}",
        dir.display(),
        retired.display()
    )))
}
