//! Getting the locally built images into a node's containerd (nothing is ever pulled).

use std::path::Path;

use super::NodeConfig;
use crate::error::{Result, SeedError};

/// Imports every image archive in `dir` (or only the image named `only`) that
/// containerd at `socket` lacks (by name and manifest digest).
pub async fn import_missing(
    config: &NodeConfig,
    dir: &Path,
    socket: &Path,
    only: Option<&str>,
) -> Result<()> {
    let ctr = crate::BinarySearch::standard(config.bin_dir.as_deref()).find("ctr")?;
    let (dir, socket, name) = (dir.to_path_buf(), socket.to_path_buf(), config.name.clone());
    let only = only.map(String::from);
    tokio::task::spawn_blocking(move || import_blocking(&name, &ctr, &dir, &socket, only))
        .await
        .map_err(|e| SeedError::Node {
            node: config.name.clone(),
            reason: format!("runtime: importing images: {e}"),
        })?
}

fn import_blocking(
    node: &str,
    ctr: &Path,
    dir: &Path,
    socket: &Path,
    only: Option<String>,
) -> Result<()> {
    let mut images = crate::images::list(dir)?;
    if let Some(only) = &only {
        images.retain(|i| &i.reference == only);
    }
    if images.is_empty() {
        return Err(SeedError::Node {
            node: node.to_string(),
            reason: format!(
                "runtime: no image archives in {}; build them with `ringctl images build` (`ringctl bootstrap` does)",
                dir.display()
            ),
        });
    }
    for image in images {
        if crate::images::present(ctr, socket, &image)? {
            continue;
        }
        tracing::info!(image = %image.reference, "importing into containerd");
        crate::images::import(ctr, socket, &image.archive)?;
    }
    Ok(())
}
