//! Finding the programs a hosted control plane runs.

use std::path::{Path, PathBuf};

use crate::error::{Result, SeedError};

/// The Kubernetes version whose binaries `scripts/setup` builds and caches
/// (pinned in `deps/kubernetes/go.mod`; a test checks the two agree).
pub const K8S_VERSION: &str = "v1.37.2";

/// The etcd version `scripts/setup` builds (pinned in `deps/etcd/go.mod`).
pub const ETCD_VERSION: &str = "v3.7.3";

/// The containerd version `scripts/setup` builds (pinned in `deps/containerd/go.mod`).
pub const CONTAINERD_VERSION: &str = "v2.4.2";

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
    /// (`$RING_CACHE` or `~/.cache/ring`, then `bin`), then `PATH`.
    pub fn standard(configured: Option<&Path>) -> Self {
        let mut dirs = Vec::new();
        if let Some(dir) = configured {
            dirs.push(dir.to_path_buf());
        }
        if let Some(dir) = std::env::var_os("RING_BIN_DIR").filter(|d| !d.is_empty()) {
            dirs.push(PathBuf::from(dir));
        }
        dirs.push(cache_bin_dir());
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

/// The first word of `text` that reads as a version (`v1.37.2`, `3.7.3`):
/// what a program's `--version` says of itself.
pub fn version_word(text: &str) -> Option<&str> {
    text.split_whitespace().find(|w| {
        let mut parts = w.trim_start_matches('v').split('.');
        let numeric =
            |p: Option<&str>| p.is_some_and(|p| p.starts_with(|c: char| c.is_ascii_digit()));
        numeric(parts.next()) && numeric(parts.next())
    })
}

/// What `program ARGS` says its version is ([`version_word`] of its stdout
/// and stderr), within `timeout`; else why it said none.
pub async fn ask_version(
    program: &Path,
    args: &[&str],
    timeout: std::time::Duration,
) -> std::result::Result<String, String> {
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) => {
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            version_word(&text)
                .map(String::from)
                .ok_or_else(|| format!("printed no version: {}", text.trim()))
        }
        Ok(Err(e)) => Err(format!("cannot run it: {e}")),
        Err(_) => Err(format!("no answer within {timeout:?}")),
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

/// Where `scripts/setup` links the programs it builds from `deps/`.
pub fn cache_bin_dir() -> PathBuf {
    cache_dir().join("bin")
}

/// Where `scripts/setup` links the CNI plugins it builds.
pub fn cache_cni_dir() -> PathBuf {
    cache_dir().join("cni").join("bin")
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

    /// The version a committed pin (`deps/NAME/go.mod`) requires of `module`.
    fn pinned(go_mod: &str, module: &str) -> Option<String> {
        go_mod.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next()?;
            let (m, v) = match first {
                "require" => (words.next()?, words.next()?),
                _ => (first, words.next()?),
            };
            (m == module).then(|| v.to_string())
        })
    }

    #[test]
    fn the_versions_ring_names_are_the_pinned_ones() {
        let pins = [
            (
                K8S_VERSION,
                include_str!("../../deps/kubernetes/go.mod"),
                "k8s.io/kubernetes",
            ),
            (
                ETCD_VERSION,
                include_str!("../../deps/etcd/go.mod"),
                "go.etcd.io/etcd/server/v3",
            ),
            (
                CONTAINERD_VERSION,
                include_str!("../../deps/containerd/go.mod"),
                "github.com/containerd/containerd/v2",
            ),
        ];
        for (named, go_mod, module) in pins {
            assert_eq!(pinned(go_mod, module).as_deref(), Some(named), "{module}");
        }
    }

    #[test]
    fn the_version_is_the_first_version_like_word() {
        for (text, want) in [
            ("Kubernetes v1.37.2", Some("v1.37.2")),
            ("etcd Version: 3.7.3\nGit SHA: x", Some("3.7.3")),
            (
                "containerd github.com/containerd/containerd/v2 v2.4.2 ",
                Some("v2.4.2"),
            ),
            ("runc version 1.5.3\nspec: 1.3.0", Some("1.5.3")),
            ("iptables v1.8.9 (nf_tables)", Some("v1.8.9")),
            ("no version here v2", None),
        ] {
            assert_eq!(version_word(text), want, "{text}");
        }
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
