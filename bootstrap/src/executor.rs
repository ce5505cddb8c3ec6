//! The executor of the bootstrap plan: [`execute`] carries out one
//! [`Step`] of [`crate::plan::next_step`], [`stuck_detail`] says why a step
//! does not finish.

use std::path::Path;
use std::time::Duration;

use ringd::identity::RingPki;
use ringd::RingError;

use crate::admin::{migrate_and_wait, ring_status};
use crate::config::RingConfig;
use crate::error::{io, BootstrapError};
use crate::layout::RingLayout;
use crate::member::{ring_node_binary, start_member, write_member_configs};
use crate::plan::Step;
use crate::{coldstart, nodes, selfhost};

pub(crate) fn stuck_detail(layout: &RingLayout, config: &RingConfig, step: &Step) -> String {
    let member = match step {
        Step::StartMember(m) => m.clone(),
        Step::StartNode(m) => {
            let log = nodes::log_file(layout, m);
            return format!(
                "last lines of {}:\n{}",
                log.display(),
                seed::ShootLayout::tail(&log, 15)
            );
        }
        Step::AwaitNodes(ms) => {
            return ms
                .iter()
                .map(|m| match nodes::status(layout, m) {
                    Some(s) => format!(
                        "node {m}: {} ({})",
                        s.phase,
                        s.problem
                            .unwrap_or_else(|| "no problem reported yet".into())
                    ),
                    None => format!(
                        "node {m}: no status yet; see {}",
                        nodes::log_file(layout, m).display()
                    ),
                })
                .collect::<Vec<_>>()
                .join("; ")
        }
        _ => config.members[0].name.clone(),
    };
    format!(
        "last lines of {}:\n{}",
        layout.log(&member).display(),
        seed::ShootLayout::tail(&layout.log(&member), 15)
    )
}

pub(crate) async fn execute(
    layout: &RingLayout,
    config: &RingConfig,
    ringd: &Path,
    step: &Step,
) -> Result<(), BootstrapError> {
    match step {
        Step::WriteConfig => {
            seed::pki::create_private_dir(&layout.dir).map_err(RingError::from)?;
            let yaml = serde_yaml::to_string(config).map_err(|e| BootstrapError::Config {
                field: "config".into(),
                reason: e.to_string(),
            })?;
            seed::pki::write_private(&layout.config_file(), yaml.as_bytes())
                .map_err(RingError::from)?;
        }
        Step::IssuePki => {
            let pki = RingPki::new(layout.pki());
            pki.ensure_admin()?;
            for (i, m) in config.members.iter().enumerate() {
                pki.ensure_member(&m.name, config.member_ip_addr(i)?)?;
            }
        }
        Step::WriteMemberConfigs => write_member_configs(layout, config)?,
        Step::StartMember(name) => start_member(layout, ringd, name)?,
        Step::AwaitQuorum | Step::AwaitControlPlanes(_) => {
            tokio::time::sleep(Duration::from_millis(250)).await
        }
        Step::PublishKubeconfigs(shoots) => {
            let status = ring_status(layout, config).await?;
            for shoot in shoots {
                let Some(p) = status.placements.iter().find(|p| p.shoot == *shoot) else {
                    continue;
                };
                let from = layout
                    .seed_dir(&p.host)
                    .join("shoots")
                    .join(shoot)
                    .join("kubeconfig")
                    .join("admin.kubeconfig");
                let text =
                    std::fs::read(&from).map_err(io(format!("reading {}", from.display())))?;
                let to = layout.kubeconfig(shoot);
                if let Some(parent) = to.parent() {
                    seed::pki::create_private_dir(parent).map_err(RingError::from)?;
                }
                seed::pki::write_private(&to, &text).map_err(RingError::from)?;
            }
        }
        Step::BuildImages => nodes::build_images(ringd)?,
        Step::CreateNodeNetwork => {
            nodes::ensure_network(layout, config)?;
        }
        Step::ConfigureNode(node) => {
            let shoot = nodes::shoot_of(config, node).unwrap_or_default();
            let status = ring_status(layout, config).await?;
            let host = status
                .placements
                .iter()
                .find(|p| p.shoot == shoot)
                .map(|p| p.host.clone())
                .ok_or_else(|| {
                    BootstrapError::Unsupported(format!("shoot {shoot} has no placement yet"))
                })?;
            nodes::configure(layout, config, node, &host)?;
        }
        Step::StartNode(member) => nodes::start(layout, &ring_node_binary(ringd), member)?,
        Step::AllowRenewals(node) => {
            // a step of its own, recorded per node: without the binding the
            // kubelet's renewals would wait unapproved for ever
            let shoot = nodes::shoot_of(config, node).unwrap_or_default();
            seed::node::renewal::allow(&shoot, &layout.kubeconfig(&shoot))
                .await
                .map_err(RingError::from)?;
            nodes::record_renewals_allowed(layout, node)?;
        }
        Step::AwaitNodes(_) | Step::AwaitMoves(_) => {
            tokio::time::sleep(Duration::from_millis(250)).await
        }
        Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } => {
            move_once(layout, config, shoot, to).await?
        }
        Step::Moves(moves) => {
            let mut all = tokio::task::JoinSet::new();
            for m in moves {
                let (layout, config) = (layout.clone(), config.clone());
                if let Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } = m.clone() {
                    all.spawn(async move { move_once(&layout, &config, &shoot, &to).await });
                }
            }
            // every move ends before an error is reported (none is left
            // unwatched); the first error is the one reported
            let mut first_err = None;
            while let Some(r) = all.join_next().await {
                let r = r.map_err(|e| BootstrapError::Unsupported(format!("a move's task: {e}")));
                if let Err(e) = r.and_then(|r| r) {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)?
        }
        Step::ColdStart { member, shoot } => {
            coldstart::cold_start(layout, config, ringd, member, shoot).await?
        }
        Step::SwitchSeed(m) => selfhost::switch_seed(layout, config, ringd, m).await?,
        Step::Done => {}
    }
    Ok(())
}

/// Moves `shoot` to `to` and waits until the move ends. A retryable error
/// (e.g. no leader yet after a member's ringd restarted) is not one: the
/// next round observes again and asks again (bounded by the timeout).
async fn move_once(
    layout: &RingLayout,
    config: &RingConfig,
    shoot: &str,
    to: &str,
) -> Result<(), BootstrapError> {
    match migrate_and_wait(layout, config, shoot, to, MOVE_TIMEOUT).await {
        Err(e) if e.is_retryable() => {
            tracing::info!(%shoot, %to, error = %e, "moving again after a retryable error");
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(())
        }
        r => r,
    }
}

/// How long bootstrap waits for one planned migration of self-hosting.
const MOVE_TIMEOUT: Duration = Duration::from_secs(300);
