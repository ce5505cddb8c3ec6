//! The files of a local ring in its state dir, [`RingLayout`]: config, PKI,
//! each member's directory, pid file and log, published kubeconfigs.

use std::path::PathBuf;

use crate::config::RingConfig;
use crate::error::BootstrapError;

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
