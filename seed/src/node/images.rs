//! Getting the locally built images into a node's containerd (nothing is ever pulled).

use std::path::{Path, PathBuf};

use super::NodeConfig;
use crate::error::{Result, SeedError};

/// The image archives (`*.tar`) in `dir`, sorted.
fn archives(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "tar"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(SeedError::io(dir)(e)),
    };
    found.sort();
    Ok(found)
}

/// Imports every image archive in `dir` into the containerd at `socket`
/// (an image already there costs a read of its archive, nothing else).
pub async fn import_missing(config: &NodeConfig, dir: &Path, socket: &Path) -> Result<()> {
    let archives = archives(dir)?;
    if archives.is_empty() {
        return Err(SeedError::Node {
            node: config.name.clone(),
            reason: format!(
                "runtime: no image archives in {}; build them with `ringctl images build` (scripts/setup does)",
                dir.display()
            ),
        });
    }
    let ctr = crate::BinarySearch::standard(config.bin_dir.as_deref()).find("ctr")?;
    for archive in archives {
        let out = tokio::process::Command::new(&ctr)
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io", "images", "import", "--no-unpack=false"])
            .arg(&archive)
            .output()
            .await
            .map_err(SeedError::io(&ctr))?;
        if !out.status.success() {
            return Err(SeedError::Node {
                node: config.name.clone(),
                reason: format!(
                    "runtime: importing {} into containerd failed: {}",
                    archive.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
    }
    Ok(())
}
