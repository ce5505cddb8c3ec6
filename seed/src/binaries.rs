//! Finding the programs a hosted control plane runs.

use std::path::{Path, PathBuf};

use crate::error::{Result, SeedError};

/// The Kubernetes version whose binaries `scripts/setup` builds and caches.
pub const K8S_VERSION: &str = "v1.20.2";

/// Paths of the four programs of a hosted control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
}

/// Where binaries are looked for, in order.
#[derive(Debug, Clone, Default)]
pub struct BinarySearch {
    dirs: Vec<PathBuf>,
}

impl BinarySearch {
    /// The standard order: the configured directory, `RING_BIN_DIR`, the setup cache
    /// (`$RING_CACHE` or `~/.cache/ring`, then `k8s-v1.20.2/bin`), then `PATH`.
    pub fn standard(configured: Option<&Path>) -> Self {
        let mut dirs = Vec::new();
        if let Some(dir) = configured {
            dirs.push(dir.to_path_buf());
        }
        if let Some(dir) = std::env::var_os("RING_BIN_DIR").filter(|d| !d.is_empty()) {
            dirs.push(PathBuf::from(dir));
        }
        dirs.push(cache_dir().join(format!("k8s-{K8S_VERSION}")).join("bin"));
        if let Some(path) = std::env::var_os("PATH") {
            dirs.extend(std::env::split_paths(&path));
        }
        BinarySearch { dirs }
    }

    /// Exactly these directories, nothing else (for tests and explicit configs).
    pub fn only(dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        BinarySearch {
            dirs: dirs.into_iter().collect(),
        }
    }

    /// This search, then `dirs` (for programs outside `PATH`, such as `/usr/sbin`'s).
    pub fn followed_by(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.dirs.extend(dirs);
        self
    }

    /// The first executable file called `name` in the search directories.
    pub fn find(&self, name: &str) -> Result<PathBuf> {
        for dir in &self.dirs {
            let candidate = dir.join(name);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
        let searched = self
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        Err(SeedError::MissingBinary {
            binary: name.to_string(),
            searched: if searched.is_empty() {
                "nowhere: no directory configured".into()
            } else {
                searched
            },
        })
    }

    /// All four control-plane programs, or an error naming the first one missing.
    pub fn control_plane(&self) -> Result<Binaries> {
        Ok(Binaries {
            etcd: self.find("etcd")?,
            kube_apiserver: self.find("kube-apiserver")?,
            kube_controller_manager: self.find("kube-controller-manager")?,
            kube_scheduler: self.find("kube-scheduler")?,
        })
    }
}

/// `$RING_CACHE`, else `~/.cache/ring`: where `scripts/setup` keeps what it builds.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RING_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache").join("ring")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_it_and_points_to_setup() {
        let empty = tempfile::tempdir().unwrap();
        let err = BinarySearch::only([empty.path().to_path_buf()])
            .control_plane()
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("etcd not found"), "{msg}");
        assert!(msg.contains("scripts/setup"), "{msg}");
        assert!(msg.contains(&empty.path().display().to_string()), "{msg}");
    }

    #[test]
    fn finds_first_executable_and_skips_plain_files() {
        use std::os::unix::fs::PermissionsExt;
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("etcd"), "not executable").unwrap();
        let exe = b.path().join("etcd");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = BinarySearch::only([a.path().into(), b.path().into()])
            .find("etcd")
            .unwrap();
        assert_eq!(found, exe);
    }
}
