//! Creating a self-hosting ring from nothing, with no external tool.
//!
//! `ringctl bootstrap` reads a [`RingConfig`] (or uses the 3-member default),
//! then repeatedly observes the state dir and the running members and executes
//! the [`plan::next_step`]: config, ring CA and identities, member configs,
//! each member's ringd in the background (pid file, log), the quorum, each
//! member's control plane on its predecessor, and one kubeconfig per shoot. A
//! rerun resumes wherever the ring is; `ringctl down` stops the members and
//! keeps every byte of data.

pub mod bucket_key;
mod coldstart;
pub mod config;
pub mod nodes;
mod observe;
pub mod plan;
pub mod restore;
pub mod selfhost;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringd::client::AdminClient;
use ringd::config::{MemberConfig, RingdConfig, SeedConfig, TlsFiles, API_VERSION};
use ringd::identity::RingPki;
use ringd::status::RingStatus;
use ringd::RingError;

pub use config::RingConfig;
use observe::observe;
use plan::{next_step, Step};

/// Errors of bootstrapping and operating a local ring.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The Ring config is wrong.
    #[error("config {field}: {reason}")]
    Config { field: String, reason: String },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A ringd could not be reached or refused.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The state dir already holds another ring.
    #[error("{dir} already holds ring {existing:?} with a different config; run without --config to resume it, or pick another --state-dir")]
    Conflict { dir: PathBuf, existing: String },
    /// A step did not finish in time.
    #[error("{step} did not finish within {waited_secs}s: {detail}")]
    Timeout {
        step: String,
        waited_secs: u64,
        detail: String,
    },
    /// Something asked for is not available yet.
    #[error("{0}")]
    Unsupported(String),
    /// A seed or node operation failed.
    #[error(transparent)]
    Seed(#[from] seed::SeedError),
}

impl BootstrapError {
    /// Whether running the same command again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BootstrapError::Timeout { .. } | BootstrapError::Io { .. }
        ) || matches!(self, BootstrapError::Ring(e) if e.is_retryable())
            || matches!(self, BootstrapError::Seed(e) if e.is_retryable())
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let what = what.into();
    move |source| BootstrapError::Io { what, source }
}

/// The files of a local ring.
#[derive(Debug, Clone)]
pub struct RingLayout {
    pub dir: PathBuf,
}

impl RingLayout {
    /// The effective Ring config.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("ring.yaml")
    }
    /// The ring's PKI (CA, members, `ringctl`).
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }
    /// A member's directory.
    pub fn member_dir(&self, name: &str) -> PathBuf {
        self.dir.join("members").join(name)
    }
    /// A member's ringd config.
    pub fn ringd_config(&self, name: &str) -> PathBuf {
        self.member_dir(name).join("ringd.yaml")
    }
    /// A member's ringd pid file.
    pub fn pid_file(&self, name: &str) -> PathBuf {
        self.member_dir(name).join("ringd.pid")
    }
    /// A member's ringd log.
    pub fn log(&self, name: &str) -> PathBuf {
        self.member_dir(name).join("ringd.log")
    }
    /// Where a member's seed keeps hosted control planes.
    pub fn seed_dir(&self, name: &str) -> PathBuf {
        self.member_dir(name).join("seed")
    }
    /// The ring's backup bucket: the config's, else `file://<dir>/bucket`.
    pub fn bucket_url(&self, config: &RingConfig) -> String {
        config
            .bucket
            .clone()
            .unwrap_or_else(|| format!("file://{}", self.dir.join("bucket").display()))
    }

    /// The published admin kubeconfig of a shoot.
    pub fn kubeconfig(&self, shoot: &str) -> PathBuf {
        self.dir
            .join("kubeconfigs")
            .join(format!("{shoot}.kubeconfig"))
    }

    /// The ring config stored in the state dir, if any.
    pub fn read_config(&self) -> Result<Option<RingConfig>, BootstrapError> {
        let path = self.config_file();
        match std::fs::read_to_string(&path) {
            Ok(text) => RingConfig::parse(&text, &path.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(BootstrapError::Io {
                what: format!("reading {}", path.display()),
                source: e,
            }),
        }
    }

    /// The pid of member `name`'s ringd if it runs.
    pub fn running_pid(&self, name: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pid_file(name))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let config = self.ringd_config(name);
        let needle = config.as_os_str().as_encoded_bytes();
        (seed::process::pid_alive(pid) && cmdline.windows(needle.len()).any(|w| w == needle))
            .then_some(pid)
    }
}

/// Kills every member of a throwaway local ring when dropped (kill -9 of each
/// ringd; the control planes it runs follow through their parent-death signal):
/// a benchmark interrupted mid-way (its future dropped) leaves nothing running.
/// The orderly path is still [`down`].
pub struct KillRingOnDrop(pub RingLayout);

impl Drop for KillRingOnDrop {
    fn drop(&mut self) {
        nodes::kill_now(&self.0);
        let Ok(entries) = std::fs::read_dir(self.0.dir.join("members")) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = self.0.running_pid(&name) {
                // SAFETY: plain syscall on a pid we checked is this ring's ringd.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
            }
        }
    }
}

/// How bootstrap reports progress.
pub trait Progress: Send + Sync {
    /// A step starts (or continues).
    fn step(&self, label: &str);
    /// A step finished after `took`.
    fn finished(&self, label: &str, took: Duration);
}

/// What bootstrap did and where the ring stands.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapReport {
    pub ring: String,
    pub state_dir: PathBuf,
    /// False when the ring was already complete (nothing had to be done).
    pub changed: bool,
    /// Wall time of each kind of step, in order, in seconds.
    pub steps: Vec<(String, f64)>,
    pub total_secs: f64,
    pub status: RingStatus,
    /// Shoot → its admin kubeconfig.
    pub kubeconfigs: Vec<(String, PathBuf)>,
    /// The shoots' nodes (empty when `nodes.perMember` is 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<nodes::NodeReport>,
    /// The key bootstrap generated for the bucket (a restore needs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_key: Option<PathBuf>,
}

/// Options of [`bootstrap`].
#[derive(Debug, Clone)]
pub struct BootstrapOptions {
    /// The config to create; `None`: the one in the state dir, else the default.
    pub config: Option<RingConfig>,
    pub dir: PathBuf,
    /// The ringd binary to start for each member.
    pub ringd: PathBuf,
    /// Bound on the whole run.
    pub timeout: Duration,
    /// Whether a new ring whose config names no bucket key gets one
    /// generated (`<dir>/bucket.key`); false: `--no-bucket-key`.
    pub generate_bucket_key: bool,
}

/// Creates the ring described by the options, or resumes / reports an existing one.
pub async fn bootstrap(
    opts: &BootstrapOptions,
    progress: &dyn Progress,
) -> Result<BootstrapReport, BootstrapError> {
    let layout = RingLayout {
        dir: opts.dir.clone(),
    };
    let config = bucket_key::choose_config(opts, &layout)?;
    config.validate()?;
    config.check_bucket()?;
    let started = Instant::now();
    let deadline = started + opts.timeout;
    let mut steps: Vec<(String, f64)> = Vec::new();
    let mut current: Option<(String, Instant)> = None;
    let mut changed = false;
    let mut starts: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    loop {
        let observed = observe(&layout, &config).await;
        let step = next_step(&config, &observed);
        if let Step::StartMember(m) | Step::StartNode(m) = &step {
            let n = starts.entry(step.label()).or_default();
            *n += 1;
            if *n > 2 {
                return Err(BootstrapError::Unsupported(format!(
                    "{} exits right after starting ({m}); {}",
                    if matches!(step, Step::StartNode(_)) {
                        "ring-node"
                    } else {
                        "ringd"
                    },
                    stuck_detail(&layout, &config, &step)
                )));
            }
        }
        let label = step.label();
        if current.as_ref().is_none_or(|(l, _)| *l != label) {
            if let Some((l, t)) = current.take() {
                progress.finished(&l, t.elapsed());
                steps.push((l, t.elapsed().as_secs_f64()));
            }
            if step == Step::Done {
                break;
            }
            progress.step(&label);
            current = Some((label.clone(), Instant::now()));
        }
        if Instant::now() >= deadline {
            return Err(BootstrapError::Timeout {
                step: label,
                waited_secs: opts.timeout.as_secs(),
                detail: stuck_detail(&layout, &config, &step),
            });
        }
        changed |= !matches!(step, Step::Done);
        execute(&layout, &config, &opts.ringd, &step).await?;
    }
    let status = settled_status(&layout, &config).await?;
    let kubeconfigs = config
        .members
        .iter()
        .map(|m| (m.name.clone(), layout.kubeconfig(&m.name)))
        .collect();
    Ok(BootstrapReport {
        ring: config.name.clone(),
        state_dir: opts.dir.clone(),
        changed,
        steps,
        total_secs: started.elapsed().as_secs_f64(),
        status,
        kubeconfigs,
        nodes: nodes::report(&layout, &config),
        bucket_key: bucket_key::uses_generated_key(&config, &layout).then(|| layout.bucket_key()),
    })
}

fn stuck_detail(layout: &RingLayout, config: &RingConfig, step: &Step) -> String {
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

async fn execute(
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
        Step::AwaitNodes(_) | Step::AwaitMoves(_) => {
            tokio::time::sleep(Duration::from_millis(250)).await
        }
        Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } => {
            // e.g. no leader yet after a member's ringd restarted: the next
            // round observes again and asks again (bounded by the timeout)
            match migrate_and_wait(layout, config, shoot, to, MOVE_TIMEOUT).await {
                Err(e) if e.is_retryable() => {
                    tracing::info!(%shoot, %to, error = %e, "moving again after a retryable error");
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                r => r?,
            }
        }
        Step::ColdStart { member, shoot } => {
            coldstart::cold_start(layout, config, ringd, member, shoot).await?
        }
        Step::SwitchSeed(m) => selfhost::switch_seed(layout, config, ringd, m).await?,
        Step::Done => {}
    }
    Ok(())
}

/// How long bootstrap waits for one planned migration of self-hosting.
const MOVE_TIMEOUT: Duration = Duration::from_secs(300);

/// `ring-node` is built next to `ringd`.
fn ring_node_binary(ringd: &Path) -> PathBuf {
    ringd.with_file_name("ring-node")
}

fn write_member_configs(layout: &RingLayout, config: &RingConfig) -> Result<(), BootstrapError> {
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
fn write_member_config(
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
        timing: config.timing,
        seed: Some(SeedConfig {
            state_dir: layout.seed_dir(&m.name),
            bin_dir: None,
            kubernetes: m.seed.kubernetes_config(&config.name),
            release_grace_secs: config.release_grace_seconds,
            api_advertise: nodes::api_advertise(layout, config)?,
        }),
        backup: Some(ringd::config::BackupSection {
            bucket: backup::BucketConfig::url(layout.bucket_url(config)),
            encryption: config.bucket_encryption.clone(),
        }),
        protection: config.protection,
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

/// Starts `program ARGS` in a session of its own (so it outlives this command),
/// appending its output to `log`, optionally inside network namespace `netns`;
/// returns its pid. Not waited for: once this command exits, init reaps it.
pub(crate) fn spawn_detached(
    program: &Path,
    args: &[std::ffi::OsString],
    log: &Path,
    netns: Option<&std::fs::File>,
    env: &[(String, String)],
) -> Result<u32, BootstrapError> {
    use std::os::unix::process::CommandExt;
    if !program.exists() {
        return Err(BootstrapError::Unsupported(format!(
            "{} is missing; build it with `cargo build --workspace --bins`",
            program.display()
        )));
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("opening {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io(format!("opening {}", log.display())))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env(
            "RUST_LOG",
            std::env::var("RING_LOG")
                .unwrap_or_else(|_| "info,raft=warn,h2=warn,tower=warn,kube_client=off".into()),
        )
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    let netns_fd = netns.map(std::os::fd::AsRawFd::as_raw_fd);
    // SAFETY: setsid and setns are async-signal-safe syscalls; the namespace
    // file stays open (borrowed) until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = netns_fd {
                if libc::setns(fd, libc::CLONE_NEWNET) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(io(format!("starting {}", program.display())))?;
    Ok(child.id())
}

/// The ring's status once the leader has heard every control plane ready
/// (each member saw its own ready; the leader hears it with the member's
/// next health report), or after [`SETTLE`] as it is.
async fn settled_status(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<RingStatus, BootstrapError> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let status = ring_status(layout, config).await?;
        let heard = status.placements.iter().all(|p| p.ready == Some(true));
        if heard || Instant::now() >= deadline {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long the final report waits for the leader to hear every control plane ready.
const SETTLE: Duration = Duration::from_secs(10);

/// The status as seen by the first member that answers (preferring the leader's view).
pub async fn ring_status(
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<RingStatus, BootstrapError> {
    if config.members.is_empty() {
        return Err(BootstrapError::Unsupported(
            "the ring has no members".into(),
        ));
    }
    Ok(AdminClient::ring_status(&config.member_addresses(), &layout.pki()).await?)
}

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

/// Moves `shoot`'s control plane to member `to` (planned migration) and waits for it.
pub async fn migrate_and_wait(
    layout: &RingLayout,
    config: &RingConfig,
    shoot: &str,
    to: &str,
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let status = ring_status(layout, config).await?;
    if status
        .placements
        .iter()
        .any(|p| p.shoot == shoot && p.host == to)
    {
        return Ok(());
    }
    let address = status
        .leader_address()
        .map_or_else(|| config.member_address(0), str::to_string);
    let mut admin = AdminClient::connect(&address, &layout.pki())?;
    // the ring may already move it there by itself (a returned member's
    // successor comes home): follow that move instead of asking for another
    let moving = |s: &RingStatus| {
        s.operations
            .iter()
            .find(|o| o.shoot() == shoot && o.target() == to && !o.step.is_finished())
            .map(|o| o.id)
    };
    let id = match moving(&status) {
        Some(id) => id,
        None => match admin.migrate(shoot, to).await {
            Ok(id) => id,
            // refused because the ring opened that move meanwhile: follow it
            Err(e) => {
                let now = ring_status(layout, config).await.ok();
                now.as_ref().and_then(moving).ok_or(e)?
            }
        },
    };
    let op = admin.wait_operation(id, timeout, |_, _| {}).await?;
    if op.step != ringd::state::OperationStep::Done {
        return Err(BootstrapError::Timeout {
            step: format!("migrate {shoot} to {to}"),
            waited_secs: timeout.as_secs(),
            detail: op.detail,
        });
    }
    Ok(())
}

/// How a process that was asked to stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StopOutcome {
    /// It exited after SIGTERM within the grace.
    Exited,
    /// It ignored SIGTERM for the whole grace and exited after SIGKILL.
    Killed,
    /// It was still there [`KILL_WAIT`] after SIGKILL (e.g. stuck in the
    /// kernel on a hung mount): the operator must look at it.
    StillRunning,
}

/// One process `down` stopped: its name, pid and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    pub name: String,
    pub pid: u32,
    pub outcome: StopOutcome,
}

/// How long a process may take to disappear after SIGKILL.
pub const KILL_WAIT: Duration = Duration::from_secs(10);

/// Sends SIGTERM to every `(name, pid)`, waits until `still_running(name)` is
/// false for all or `grace` passed, then SIGKILLs the rest and waits (at most
/// [`KILL_WAIT`]) until they are gone; returns how each ended.
pub(crate) async fn stop_processes(
    running: Vec<(String, u32)>,
    still_running: impl Fn(&str) -> bool,
    grace: Duration,
    what: &str,
) -> Vec<Stopped> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    for (_, pid) in &running {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
    }
    let wait_gone = |name: &str, until: Instant| {
        let name = name.to_string();
        let still_running = &still_running;
        async move {
            while still_running(&name) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            !still_running(&name)
        }
    };
    let deadline = Instant::now() + grace;
    let mut stopped = Vec::new();
    for (name, pid) in running {
        let outcome = if wait_gone(&name, deadline).await {
            StopOutcome::Exited
        } else {
            tracing::warn!(%name, pid, "{what} ignored SIGTERM; killing it");
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            if wait_gone(&name, Instant::now() + KILL_WAIT).await {
                StopOutcome::Killed
            } else {
                tracing::error!(%name, pid, "{what} is still there after SIGKILL");
                StopOutcome::StillRunning
            }
        };
        stopped.push(Stopped { name, pid, outcome });
    }
    stopped
}

/// What `down` stopped: the nodes first, then the members' ringds.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownReport {
    pub nodes: Vec<Stopped>,
    pub members: Vec<Stopped>,
}

impl DownReport {
    /// The processes still running after SIGKILL.
    pub fn left_running(&self) -> Vec<&Stopped> {
        self.nodes
            .iter()
            .chain(&self.members)
            .filter(|s| s.outcome == StopOutcome::StillRunning)
            .collect()
    }
}

/// Stops every node, then every member (SIGTERM, then SIGKILL after `grace`),
/// and waits until they are gone; data stays in place.
pub async fn down(dir: &Path, grace: Duration) -> Result<DownReport, BootstrapError> {
    let layout = RingLayout {
        dir: dir.to_path_buf(),
    };
    let Some(config) = layout.read_config()? else {
        return Err(BootstrapError::Unsupported(format!(
            "{} holds no ring (no ring.yaml); nothing to stop",
            dir.display()
        )));
    };
    // nodes first: their teardown (pods, shims, cgroups, network) needs no ringd
    let nodes = nodes::stop_all(&layout, &config, grace.max(Duration::from_secs(60))).await?;
    let running: Vec<(String, u32)> = config
        .members
        .iter()
        .filter_map(|m| layout.running_pid(&m.name).map(|p| (m.name.clone(), p)))
        .collect();
    let members =
        stop_processes(running, |m| layout.running_pid(m).is_some(), grace, "ringd").await;
    for m in members
        .iter()
        .filter(|m| m.outcome != StopOutcome::StillRunning)
    {
        let _ = std::fs::remove_file(layout.pid_file(&m.name));
    }
    Ok(DownReport { nodes, members })
}
