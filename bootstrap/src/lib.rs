//! Creating a self-hosting ring from nothing, with no external tool.
//!
//! `ringctl bootstrap` reads a [`RingConfig`] (or uses the 3-member default),
//! then repeatedly observes the state dir and the running members and executes
//! the [`plan::next_step`]: config, ring CA and identities, member configs,
//! each member's ringd in the background (pid file, log), the quorum, each
//! member's control plane on its predecessor, and one kubeconfig per shoot. A
//! rerun resumes wherever the ring is; `ringctl down` stops the members and
//! keeps every byte of data.

mod admin;
pub mod bucket_key;
mod coldstart;
pub mod config;
mod down;
mod error;
mod executor;
mod layout;
mod member;
mod membership;
pub mod nodes;
mod observe;
pub mod plan;
mod process;
pub mod restore;
pub mod selfhost;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringd::status::RingStatus;

pub use admin::{migrate_and_wait, ring_status};
pub use config::RingConfig;
pub use down::{down, DownReport, KillRingOnDrop};
pub use error::BootstrapError;
pub use layout::RingLayout;
pub use member::{start_member, start_member_nodes, start_member_with_env};
pub use membership::{join, leave};
pub use process::{StopOutcome, Stopped, KILL_WAIT};

use admin::settled_status;
use executor::{execute, stuck_detail};
use observe::observe;
use plan::{next_step, Step};

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
        changed |= step.acts();
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
