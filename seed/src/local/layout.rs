//! Where a shoot's files are on a local seed (see the module above for the tree).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Result, SeedError};
use crate::pki::Pki;
use crate::process::Component;
use crate::ControlPlaneSpec;

/// Whether `dir` exists and has an entry (etcd's data dir that holds data).
pub fn holds_data(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// Paths of one shoot's files on a local seed.
#[derive(Debug, Clone)]
pub struct ShootLayout {
    /// `<state-dir>/shoots/<shoot>`
    pub dir: PathBuf,
}

impl ShootLayout {
    /// The recorded spec.
    pub fn spec_file(&self) -> PathBuf {
        self.dir.join("shoot.json")
    }
    /// The shoot's PKI.
    pub fn pki(&self) -> Pki {
        Pki::new(self.dir.join("pki"))
    }
    /// etcd's data directory.
    pub fn etcd_data(&self) -> PathBuf {
        self.dir.join("etcd")
    }
    /// The admin kubeconfig, for `kubectl --kubeconfig`.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig").join("admin.kubeconfig")
    }
    /// A component's own kubeconfig.
    pub fn component_kubeconfig(&self, c: Component) -> PathBuf {
        self.dir.join("kubeconfig").join(format!("{c}.kubeconfig"))
    }
    /// A component's log file.
    pub fn log(&self, c: Component) -> PathBuf {
        self.dir.join("logs").join(format!("{c}.log"))
    }
    /// The supervisor's own log (when it runs detached).
    pub fn supervisor_log(&self) -> PathBuf {
        self.dir.join("logs").join("supervisor.log")
    }
    /// Scratch space of a component.
    pub fn run_dir(&self, c: Component) -> PathBuf {
        self.dir.join("run").join(c.name())
    }
    /// The supervisor's lock file.
    pub fn lock_file(&self) -> PathBuf {
        self.dir.join("supervisor.lock")
    }
    /// The component status file.
    pub fn status_file(&self) -> PathBuf {
        self.dir.join("status.json")
    }

    /// The pid of the live process supervising this shoot, if any.
    pub fn supervisor_pid(&self) -> Option<u32> {
        let file = File::open(self.lock_file()).ok()?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(_unlocked_on_drop) => None,
            Err((mut file, _)) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                Some(text.trim().parse().unwrap_or(0))
            }
        }
    }

    /// The spec the shoot was created with, if it exists.
    pub fn read_spec(&self) -> Result<Option<ControlPlaneSpec>> {
        let path = self.spec_file();
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| SeedError::InvalidSpec {
                        field: path.display().to_string(),
                        reason: format!("{e}; fix or delete the file"),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SeedError::Io { path, source: e }),
        }
    }

    /// The last lines of a log file (for error messages).
    pub fn tail(path: &Path, lines: usize) -> String {
        let text = std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned());
        match text {
            Ok(text) => {
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(e) => format!("({}: {e})", path.display()),
        }
    }
}
