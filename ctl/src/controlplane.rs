//! `ringctl controlplane up|down|status|run`: one hosted control plane on a local seed.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use seed::{BinarySearch, ControlPlaneStatus, LocalSeed, Seed, SeedError, ShootLayout};
use tokio_util::sync::CancellationToken;

use ringd::{Result, RingError};

/// Where a command finds the seed and its binaries.
#[derive(Debug, Clone)]
pub struct SeedOptions {
    /// The seed's state directory (shoots live in `<dir>/shoots/<shoot>`).
    pub state_dir: PathBuf,
    /// A directory searched first for etcd and the Kubernetes binaries.
    pub bin_dir: Option<PathBuf>,
}

impl SeedOptions {
    /// A local seed on the state dir, with binaries located (clear error if one is missing).
    pub fn local_seed(&self) -> Result<LocalSeed> {
        let bins = BinarySearch::standard(self.bin_dir.as_deref()).control_plane()?;
        Ok(LocalSeed::new(&self.state_dir, bins))
    }
}

/// Options of `ringctl controlplane up`.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub seed: SeedOptions,
    pub shoot: String,
    /// The shoot's loopback address for a new shoot (default: derived from its name).
    pub api_address: Option<Ipv4Addr>,
    /// How long to wait for `/readyz`.
    pub timeout: Duration,
}

/// What `up` did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpOutcome {
    /// False when the control plane was already running (nothing was started).
    pub started: bool,
    pub status: ControlPlaneStatus,
}

/// Starts the shoot's control plane under a detached supervisor (`supervisor_exe
/// controlplane run ...`) that outlives this call, and waits until `/readyz` is ok.
/// Idempotent: a running control plane is reported, not started twice.
pub async fn up(opts: &UpOptions, supervisor_exe: &Path) -> Result<UpOutcome> {
    let seed = opts.seed.local_seed()?;
    let spec = seed.spec_for(&opts.shoot, opts.api_address)?;
    let layout = seed.layout(&opts.shoot);
    if layout.supervisor_pid().is_some() {
        let status = seed.inspect(&opts.shoot).await?;
        return Ok(UpOutcome {
            started: false,
            status,
        });
    }
    // Fail here, with the real reason, rather than in the detached process.
    seed.prepare(&spec)?;
    seed::local::check_ports(&spec)?;
    let child = spawn_supervisor(opts, &layout, supervisor_exe)?;
    let status = wait_ready(opts, &seed, &layout, child).await?;
    Ok(UpOutcome {
        started: true,
        status,
    })
}

/// Starts `supervisor_exe controlplane run ...` in its own session, its output
/// appended to the shoot's supervisor log.
fn spawn_supervisor(
    opts: &UpOptions,
    layout: &ShootLayout,
    supervisor_exe: &Path,
) -> Result<Child> {
    let log_path = layout.supervisor_log();
    let opening = |source: std::io::Error| RingError::Io {
        what: format!("opening {}", log_path.display()),
        source,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(opening)?;
    let err_log = log.try_clone().map_err(opening)?;
    let mut cmd = std::process::Command::new(supervisor_exe);
    cmd.args(["controlplane", "run", "--shoot", &opts.shoot, "--state-dir"])
        .arg(&opts.seed.state_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log);
    if let Some(dir) = &opts.seed.bin_dir {
        cmd.arg("--bin-dir").arg(dir);
    }
    // SAFETY: setsid is async-signal-safe; it detaches the supervisor from our
    // session so it survives this command and the terminal.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| RingError::Io {
        what: format!("starting {} controlplane run", supervisor_exe.display()),
        source,
    })?;
    tracing::info!(shoot = %opts.shoot, pid = child.id(), "supervisor started");
    Ok(child)
}

/// Waits until the control plane is ready (`/readyz` ok and every component
/// running). A supervisor that exits fails at once with its log's tail; at the
/// timeout the control plane is stopped again and the apiserver log's tail told.
async fn wait_ready(
    opts: &UpOptions,
    seed: &LocalSeed,
    layout: &ShootLayout,
    mut child: Child,
) -> Result<ControlPlaneStatus> {
    let deadline = tokio::time::Instant::now() + opts.timeout;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let log = layout.supervisor_log();
            return Err(SeedError::SupervisorExited {
                shoot: opts.shoot.clone(),
                tail: ShootLayout::tail(&log, 20),
                log,
            }
            .into());
        }
        let status = seed.inspect(&opts.shoot).await;
        if let Ok(status) = &status {
            if status.phase == seed::Phase::Ready {
                return Ok(status.clone());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let last = match status {
                Ok(s) => format!("phase {}, /readyz: {}", s.phase, s.readyz),
                Err(e) => e.to_string(),
            };
            let api_log = layout.log(seed::Component::KubeApiserver);
            let _ = seed.stop(&opts.shoot).await;
            return Err(SeedError::NotReady {
                shoot: opts.shoot.clone(),
                waited_secs: opts.timeout.as_secs(),
                last: format!(
                    "{last}\n(stopped it again) last lines of {}:\n{}",
                    api_log.display(),
                    ShootLayout::tail(&api_log, 15)
                ),
            }
            .into());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Stops the shoot's control plane, wherever it is supervised, keeping its data.
pub async fn down(seed_opts: &SeedOptions, shoot: &str) -> Result<ControlPlaneStatus> {
    let seed = seed_opts.local_seed()?;
    seed.stop(shoot).await?;
    Ok(seed.inspect(shoot).await?)
}

/// The status of one shoot, or of every shoot on the seed.
pub async fn status(
    seed_opts: &SeedOptions,
    shoot: Option<&str>,
) -> Result<Vec<ControlPlaneStatus>> {
    let seed = seed_opts.local_seed()?;
    let names = match shoot {
        Some(s) => vec![s.to_string()],
        None => seed.shoots(),
    };
    let mut out = Vec::new();
    for name in names {
        out.push(seed.inspect(&name).await?);
    }
    Ok(out)
}

/// Runs the shoot's control plane in this process until `shutdown` fires, then
/// stops it gracefully. This is the supervisor `up` starts in the background.
pub async fn run(
    seed_opts: &SeedOptions,
    shoot: &str,
    api_address: Option<Ipv4Addr>,
    shutdown: CancellationToken,
) -> Result<()> {
    let seed = seed_opts.local_seed()?;
    let spec = seed.spec_for(shoot, api_address)?;
    seed.start(&spec).await?;
    tracing::info!(shoot, api = %spec.endpoint.api_url(), "control plane started");
    shutdown.cancelled().await;
    tracing::info!(shoot, "stopping control plane");
    seed.stop(shoot).await?;
    Ok(())
}
