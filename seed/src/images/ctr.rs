//! Getting image archives into a containerd with its own `ctr`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{host, BuiltImage};
use crate::error::{Result, SeedError};

/// The containerd namespace of Kubernetes' CRI: images there are the pods' images.
pub const NAMESPACE: &str = "k8s.io";

/// Imports `archive` into the containerd at `socket` (namespace `k8s.io`) and
/// unpacks it for containerd's default snapshotter, so pods start from it at once.
/// The image gets the name in the archive's `io.containerd.image.name`
/// annotation; importing the same archive again changes nothing.
pub fn import(ctr: &Path, socket: &Path, archive: &Path) -> Result<()> {
    if !archive.is_file() {
        return Err(SeedError::ImageMissing {
            archive: archive.to_path_buf(),
        });
    }
    let mut cmd = Command::new(ctr);
    cmd.arg("--address")
        .arg(socket)
        .args(["-n", NAMESPACE, "images", "import"])
        .arg(archive);
    let ran = ctr_run(socket, &mut cmd, Duration::from_secs(300))?;
    if ran.success {
        return Ok(());
    }
    Err(SeedError::Containerd {
        socket: socket.to_path_buf(),
        reason: format!(
            "`ctr images import {}` failed (is containerd running there?): {}",
            archive.display(),
            ran.stderr.trim()
        ),
    })
}

/// The images in the containerd at `socket` (namespace `k8s.io`): full name → manifest digest.
pub fn listed(ctr: &Path, socket: &Path) -> Result<BTreeMap<String, String>> {
    let mut cmd = Command::new(ctr);
    cmd.arg("--address")
        .arg(socket)
        .args(["-n", NAMESPACE, "images", "ls"]);
    let ran = ctr_run(socket, &mut cmd, Duration::from_secs(60))?;
    if !ran.success {
        return Err(SeedError::Containerd {
            socket: socket.to_path_buf(),
            reason: format!(
                "`ctr images ls` failed (is containerd running there?): {}",
                ran.stderr.trim()
            ),
        });
    }
    Ok(parse_ls(&ran.stdout))
}

fn ctr_run(socket: &Path, cmd: &mut Command, timeout: Duration) -> Result<host::Ran> {
    host::run(cmd, timeout).map_err(|e| SeedError::Containerd {
        socket: socket.to_path_buf(),
        reason: format!("cannot run {e}"),
    })
}

/// Whether `image` is in the containerd at `socket` with the same manifest digest.
pub fn present(ctr: &Path, socket: &Path, image: &BuiltImage) -> Result<bool> {
    Ok(listed(ctr, socket)?.get(&image.reference) == Some(&image.digest))
}

/// `ctr images ls` rows (`REF TYPE DIGEST SIZE PLATFORMS LABELS`) as name → digest.
fn parse_ls(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let name = cols.next()?;
            let digest = cols.nth(1)?;
            digest
                .starts_with("sha256:")
                .then(|| (name.to_string(), digest.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls_rows_give_name_and_digest() {
        let text = "REF TYPE DIGEST SIZE PLATFORMS LABELS\ndocker.io/ring/pause:3.2 application/vnd.oci.image.manifest.v1+json sha256:abc 680.0 KiB linux/amd64 -\n";
        let got = parse_ls(text);
        assert_eq!(
            got.get("docker.io/ring/pause:3.2").map(String::as_str),
            Some("sha256:abc")
        );
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn importing_a_missing_archive_says_how_to_build_it() {
        let err = import(
            Path::new("ctr"),
            Path::new("/nonexistent.sock"),
            Path::new("/nonexistent/x.tar"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("ringctl images build"), "{err}");
    }
}
