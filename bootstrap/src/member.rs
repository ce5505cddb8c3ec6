//! A member's local files and processes: its ringd config, its supervised
//! ringd started detached, and the nodes of its shoot.

use std::path::{Path, PathBuf};

use ringd::config::{MemberConfig, RingdConfig, SeedConfig, TlsFiles, API_VERSION};
use ringd::identity::RingPki;
use ringd::RingError;

use crate::config::RingConfig;
use crate::error::BootstrapError;
use crate::layout::RingLayout;
use crate::nodes;
use crate::process::spawn_detached;

/// `ring-node` is built next to `ringd`.
pub(crate) fn ring_node_binary(ringd: &Path) -> PathBuf {
    ringd.with_file_name("ring-node")
}

pub(crate) fn write_member_configs(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<(), BootstrapError> {
    // A new ring: Raft ids follow the ring order.
    let members: Vec<MemberConfig> = config
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| MemberConfig {
            name: m.name.clone(),
            id: i as u64 + 1,
            address: config.member_address(i),
        })
        .collect();
    for i in 0..config.members.len() {
        write_member_config(layout, config, i, i as u64 + 1, members.clone(), false)?;
    }
    Ok(())
}

/// Writes member `i`'s ringd config with Raft id `id`, knowing `members`;
/// `join`: it joins an already running ring.
pub(crate) fn write_member_config(
    layout: &RingLayout,
    config: &RingConfig,
    i: usize,
    id: u64,
    members: Vec<MemberConfig>,
    join: bool,
) -> Result<(), BootstrapError> {
    let pki = RingPki::new(layout.pki());
    let m = &config.members[i];
    let files = pki.files(&m.name);
    let dir = layout.member_dir(&m.name);
    seed::pki::create_private_dir(&dir).map_err(RingError::from)?;
    let rc = RingdConfig {
        api_version: API_VERSION.into(),
        kind: "RingMember".into(),
        name: m.name.clone(),
        id,
        listen: config.member_address(i),
        metrics_listen: Some(config.metrics_address(i)),
        data_dir: dir.join("data"),
        tls: TlsFiles {
            ca: files.ca,
            cert: files.cert,
            key: files.key,
        },
        members,
        join,
        timing: config.timing(),
        seed: Some(SeedConfig {
            state_dir: layout.seed_dir(&m.name),
            bin_dir: None,
            kubernetes: m.seed.kubernetes_config(&config.name),
            release_grace_secs: config.release_grace_seconds,
            certificate_check_secs: config.certificate_check_seconds,
            api_advertise: nodes::api_advertise(layout, config)?,
            deprecated_apis: config.deprecated_apis,
        }),
        backup: Some(ringd::config::BackupSection {
            bucket: backup::BucketConfig::url(layout.bucket_url(config)),
            encryption: config.bucket_encryption.clone(),
        }),
        protection: config.protection,
        initial_hosts: if join {
            Default::default()
        } else {
            crate::plan::initial_hosts(config)
        },
    };
    rc.validate()?;
    let yaml = serde_yaml::to_string(&rc).map_err(|e| BootstrapError::Config {
        field: format!("members[{i}]"),
        reason: e.to_string(),
    })?;
    seed::pki::write_private(&layout.ringd_config(&m.name), yaml.as_bytes())
        .map_err(RingError::from)?;
    Ok(())
}

/// Starts the nodes of `member`'s shoot that are not running (`ring-node`
/// next to `ringd`), as a machine coming back does; the nodes started.
pub fn start_member_nodes(
    layout: &RingLayout,
    ringd: &Path,
    member: &str,
) -> Result<Vec<String>, BootstrapError> {
    let Some(config) = layout.read_config()? else {
        return Ok(Vec::new());
    };
    let mut started = Vec::new();
    for node in nodes::nodes_of(&config, member) {
        if nodes::configured(layout, &node) && nodes::running_pid(layout, &node).is_none() {
            nodes::start(layout, &ring_node_binary(ringd), &node)?;
            started.push(node);
        }
    }
    Ok(started)
}

/// Starts member `name`'s ringd detached from this process (own session),
/// supervised (`ringd --supervise`: restarted whenever it exits), with the
/// supervisor's pid in the member's pid file and the output of both in the
/// member's log. Killing the supervisor kills ringd (parent-death signal).
pub fn start_member(layout: &RingLayout, ringd: &Path, name: &str) -> Result<(), BootstrapError> {
    start_member_with_env(layout, ringd, name, &[])
}

/// Like [`start_member`], with extra environment variables for ringd and
/// everything it starts (a drill's `skewClock` runs it under faketime).
pub fn start_member_with_env(
    layout: &RingLayout,
    ringd: &Path,
    name: &str,
    env: &[(String, String)],
) -> Result<(), BootstrapError> {
    if !ringd.exists() {
        return Err(BootstrapError::Unsupported(format!(
            "{} is missing; build it with `cargo build --workspace --bins`",
            ringd.display()
        )));
    }
    // a member in a network namespace: ringd (and all it hosts) runs inside it
    let netns = match layout.read_config()? {
        Some(config) => config
            .members
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.netns.clone()),
        None => None,
    };
    let netns = netns
        .map(|ns| {
            let path = Path::new("/run/netns").join(&ns);
            std::fs::File::open(&path).map_err(|e| BootstrapError::Config {
                field: format!("members[{name}].netns"),
                reason: format!(
                    "cannot open network namespace {} ({e}); create it with `ip netns add {ns}` (needs root)",
                    path.display()
                ),
            })
        })
        .transpose()?;
    let args = vec![
        "--supervise".into(),
        "--config".into(),
        layout.ringd_config(name).into_os_string(),
    ];
    let pid = spawn_detached(ringd, &args, &layout.log(name), netns.as_ref(), env)?;
    seed::pki::write_private(&layout.pid_file(name), pid.to_string().as_bytes())
        .map_err(RingError::from)?;
    Ok(())
}
