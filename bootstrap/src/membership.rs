//! Changing the members of a running local ring: [`join`] adds one,
//! [`leave`] removes one, re-linking the self-hosting ring around it.

use std::path::Path;
use std::time::{Duration, Instant};

use ringd::client::AdminClient;
use ringd::config::MemberConfig;
use ringd::identity::RingPki;
use ringd::status::RingStatus;
use ringd::RingError;

use crate::admin::{migrate_and_wait, ring_status};
use crate::config;
use crate::error::BootstrapError;
use crate::executor::{execute, stuck_detail};
use crate::layout::RingLayout;
use crate::member::{start_member, write_member_config};
use crate::observe::observe;
use crate::plan::Step;

/// Adds member `name` to the local ring in `dir`: its certificate and config
/// (`join: true`), its ringd, the Raft configuration change, and the placement of
/// its control plane on its predecessor (the ring's last member). Waits until the
/// new shoot's control plane serves and publishes its kubeconfig.
pub async fn join(
    dir: &Path,
    name: &str,
    ringd: &Path,
    timeout: Duration,
) -> Result<RingStatus, BootstrapError> {
    let layout = RingLayout {
        dir: dir.to_path_buf(),
    };
    let mut config = layout.read_config()?.ok_or_else(|| {
        BootstrapError::Unsupported(format!(
            "{} holds no ring; run `ringctl bootstrap` first",
            dir.display()
        ))
    })?;
    if config.members.iter().any(|m| m.name == name) {
        return Err(BootstrapError::Config {
            field: "name".into(),
            reason: format!("{name} is already a member of ring {}", config.name),
        });
    }
    seed::validate_shoot_name(name).map_err(|e| BootstrapError::Config {
        field: "name".into(),
        reason: e.to_string(),
    })?;
    let index = config.members.len();
    let mut grown = config.clone();
    grown.members.push(config::MemberSpec::local(name));
    grown.validate()?;
    RingPki::new(layout.pki()).ensure_member(name, grown.member_ip_addr(index)?)?;
    // The live ring's members and Raft ids (ids are never reused, so not the ring order).
    let status = ring_status(&layout, &config).await?;
    // a ring without a leader cannot add a member
    status
        .leader
        .as_ref()
        .ok_or_else(|| BootstrapError::Timeout {
            step: "find the leader".into(),
            waited_secs: 0,
            detail: "the ring has no leader (no quorum?)".into(),
        })?;
    let leader_address = status
        .leader_address()
        .map_or_else(|| config.member_address(0), str::to_string);
    let known: Vec<MemberConfig> = status
        .members
        .iter()
        .map(|m| MemberConfig {
            name: m.name.clone(),
            id: m.id,
            address: m.address.clone(),
        })
        .collect();
    // Add it first (the leader retries until it answers), then start it with the id it got.
    let mut admin = AdminClient::connect(&leader_address, &layout.pki())?;
    let (_, id) = admin.add_member(name, &grown.member_address(index)).await?;
    write_member_config(&layout, &grown, index, id, known, true)?;
    if layout.running_pid(name).is_none() {
        start_member(&layout, ringd, name)?;
    }
    config = grown;
    let yaml = serde_yaml::to_string(&config).map_err(|e| BootstrapError::Config {
        field: "config".into(),
        reason: e.to_string(),
    })?;
    seed::pki::write_private(&layout.config_file(), yaml.as_bytes()).map_err(RingError::from)?;
    let deadline = Instant::now() + timeout;
    loop {
        if layout.running_pid(name).is_none() {
            return Err(BootstrapError::Unsupported(format!(
                "ringd {name} exited; {}",
                stuck_detail(&layout, &config, &Step::StartMember(name.to_string()))
            )));
        }
        let o = observe(&layout, &config).await;
        if o.ready.contains(name) {
            execute(
                &layout,
                &config,
                ringd,
                &Step::PublishKubeconfigs(vec![name.to_string()]),
            )
            .await?;
            // Re-link: the new member is now the first member's predecessor and hosts it.
            let first = config.members[0].name.clone();
            migrate_and_wait(&layout, &config, &first, name, timeout).await?;
            return ring_status(&layout, &config).await;
        }
        if Instant::now() >= deadline {
            return Err(BootstrapError::Timeout {
                step: format!("start the control plane of {name}"),
                waited_secs: timeout.as_secs(),
                detail: stuck_detail(&layout, &config, &Step::StartMember(name.to_string())),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Removes member `name` from the local ring in `dir` (refused when it would leave
/// fewer than 3 members or while it hosts another shoot's control plane), then
/// stops its ringd. Its own shoot leaves the ring with it.
pub async fn leave(dir: &Path, name: &str) -> Result<RingStatus, BootstrapError> {
    let layout = RingLayout {
        dir: dir.to_path_buf(),
    };
    let mut config = layout.read_config()?.ok_or_else(|| {
        BootstrapError::Unsupported(format!("{} holds no ring; nothing to leave", dir.display()))
    })?;
    let Some(index) = config.members.iter().position(|m| m.name == name) else {
        return Err(BootstrapError::Config {
            field: "name".into(),
            reason: format!("{name} is not a member of ring {}", config.name),
        });
    };
    if config.members.len() <= 3 {
        return Err(BootstrapError::Config {
            field: "name".into(),
            reason: format!("{name} cannot leave: a ring needs at least 3 members"),
        });
    }
    // Re-link: the leaving member's successor moves to the leaving member's predecessor.
    let n = config.members.len();
    let successor = config.members[(index + 1) % n].name.clone();
    let predecessor = config.members[(index + n - 1) % n].name.clone();
    let status = ring_status(&layout, &config).await?;
    if status
        .placements
        .iter()
        .any(|p| p.shoot == successor && p.host == name)
    {
        migrate_and_wait(
            &layout,
            &config,
            &successor,
            &predecessor,
            Duration::from_secs(180),
        )
        .await?;
    }
    let status = ring_status(&layout, &config).await?;
    let leader = status.leader.clone().unwrap_or_default();
    let j = config
        .members
        .iter()
        .position(|m| m.name == leader)
        .unwrap_or(0);
    let mut admin = AdminClient::connect(&config.member_address(j), &layout.pki())?;
    admin.remove_member(name).await?;
    if let Some(pid) = layout.running_pid(name) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while layout.running_pid(name).is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let _ = std::fs::remove_file(layout.pid_file(name));
    let _ = std::fs::remove_file(layout.kubeconfig(name));
    config.members.remove(index);
    let yaml = serde_yaml::to_string(&config).map_err(|e| BootstrapError::Config {
        field: "config".into(),
        reason: e.to_string(),
    })?;
    seed::pki::write_private(&layout.config_file(), yaml.as_bytes()).map_err(RingError::from)?;
    ring_status(&layout, &config).await
}
