//! Getting the locally built images into a node's containerd (nothing is ever pulled).

use std::path::Path;

use super::NodeConfig;
use crate::error::{Result, SeedError};
use crate::images::BuiltImage;

/// Imports every image archive in `dir` (or only the images whose full names
/// are in `only`, when it is not empty) that containerd at `socket` lacks (by
/// name and manifest digest).
pub async fn import_missing(
    config: &NodeConfig,
    dir: &Path,
    socket: &Path,
    only: &[String],
) -> Result<()> {
    let ctr = crate::BinarySearch::standard(config.bin_dir.as_deref()).find("ctr")?;
    let (dir, socket, name) = (dir.to_path_buf(), socket.to_path_buf(), config.name.clone());
    let only = only.to_vec();
    tokio::task::spawn_blocking(move || import_blocking(&name, &ctr, &dir, &socket, only))
        .await
        .map_err(|e| SeedError::Node {
            node: config.name.clone(),
            reason: format!("runtime: importing images: {e}"),
        })?
}

/// Of `images`, those whose full names are in `only` (all when it is empty).
fn wanted(mut images: Vec<BuiltImage>, only: &[String]) -> Vec<BuiltImage> {
    if !only.is_empty() {
        images.retain(|i| only.contains(&i.reference));
    }
    images
}

fn import_blocking(
    node: &str,
    ctr: &Path,
    dir: &Path,
    socket: &Path,
    only: Vec<String>,
) -> Result<()> {
    let images = wanted(crate::images::list(dir)?, &only);
    if images.is_empty() {
        return Err(SeedError::Node {
            node: node.to_string(),
            reason: format!(
                "runtime: no image archives in {}; build them with `ringctl images build` (`ringctl bootstrap` does)",
                dir.display()
            ),
        });
    }
    // one listing for all: each `ctr images ls` is a process and a round trip
    let have = crate::images::listed(ctr, socket)?;
    for image in images {
        if have.get(&image.reference) == Some(&image.digest) {
            continue;
        }
        tracing::info!(image = %image.reference, "importing into containerd");
        crate::images::import(ctr, socket, &image.archive)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_images_are_imported_or_all_when_none_is_listed() {
        let built = |name: &str| BuiltImage {
            name: name.into(),
            reference: crate::images::reference(name).unwrap(),
            archive: format!("/images/{name}.tar").into(),
            digest: "sha256:0".into(),
            size: 1,
            rebuilt: false,
            versions: Default::default(),
        };
        let all = || vec![built("pause"), built("etcd"), built("ringd")];
        let names = |v: Vec<BuiltImage>| v.into_iter().map(|i| i.name).collect::<Vec<_>>();
        assert_eq!(names(wanted(all(), &[])), ["pause", "etcd", "ringd"]);
        let only = [crate::images::ETCD.full()];
        assert_eq!(names(wanted(all(), &only)), ["etcd"]);
    }
}
