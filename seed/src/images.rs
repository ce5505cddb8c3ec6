//! Container images built on this machine from local binaries; no registry is
//! ever needed.
//!
//! Each image is one archive, `<name>.tar` in the images dir (default
//! `~/.cache/ring/images`): an OCI image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/...`, one uncompressed layer) plus a docker-save style
//! `manifest.json`, so `ctr -n k8s.io images import`, `docker load`,
//! `podman load` and `skopeo copy oci-archive:...` all take it. The index's
//! manifest carries the annotations `io.containerd.image.name` (the full name,
//! e.g. `docker.io/ring/etcd:v3.7.3`) and `org.opencontainers.image.ref.name`
//! (the tag), so containerd imports it under its full name.
//!
//! Builds are deterministic: tar entries sorted, with mtime 0 and uid/gid 0,
//! a fixed `created` and no history, so the same inputs give the same bytes and
//! the same manifest digest. A sidecar `<name>.json` records the build; an
//! archive already built from identical inputs is not written again.
//!
//! [`ALL`] is the one table of Ring's images and their tags.

mod archive;
mod catalog;
mod ctr;
mod host;
pub mod preload;
mod spec;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use archive::{
    blob_path, Descriptor, DockerManifest, ImageConfig, Index, Manifest, ANNOTATION_IMAGE_NAME,
    ANNOTATION_REF_NAME, CREATED,
};
pub use archive::{versions_text, VERSIONS_LABEL};
pub use catalog::{catalog, ImageInputs, PAUSE_SOURCE};
pub use ctr::{import, listed, present, NAMESPACE};
pub use spec::{Content, ImageSpec, PATH_ENV};

use crate::binaries::{ETCD_VERSION, K8S_VERSION};
use crate::error::{Result, SeedError};

/// The registry every image's full name starts with (nothing is pulled from it).
pub const REGISTRY: &str = "docker.io";
/// The repository of Ring's images: `ring/<name>:<tag>`.
pub const REPOSITORY: &str = "ring";

/// An image's name and tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ImageName {
    /// The image's name (`etcd`) and the binary it runs.
    pub name: &'static str,
    /// Its tag (`v3.7.3`).
    pub tag: &'static str,
}

impl ImageName {
    /// `ring/<name>:<tag>`.
    pub fn short(&self) -> String {
        format!("{REPOSITORY}/{}:{}", self.name, self.tag)
    }

    /// `docker.io/ring/<name>:<tag>`: the name containerd and the kubelet use.
    pub fn full(&self) -> String {
        format!("{REGISTRY}/{}", self.short())
    }
}

/// The pods' sandbox (Ring's own static pause binary).
pub const PAUSE: ImageName = ImageName {
    name: "pause",
    tag: "3.2",
};
/// etcd, etcdctl and etcdutl (restores); the tag is what `etcd --version` must print.
pub const ETCD: ImageName = ImageName {
    name: "etcd",
    tag: ETCD_VERSION,
};
/// kube-apiserver from the setup cache.
pub const KUBE_APISERVER: ImageName = ImageName {
    name: "kube-apiserver",
    tag: K8S_VERSION,
};
/// kube-controller-manager from the setup cache.
pub const KUBE_CONTROLLER_MANAGER: ImageName = ImageName {
    name: "kube-controller-manager",
    tag: K8S_VERSION,
};
/// kube-scheduler from the setup cache.
pub const KUBE_SCHEDULER: ImageName = ImageName {
    name: "kube-scheduler",
    tag: K8S_VERSION,
};
/// kube-proxy from the setup cache, with iptables (nft) and conntrack.
pub const KUBE_PROXY: ImageName = ImageName {
    name: "kube-proxy",
    tag: K8S_VERSION,
};
/// This workspace's ringd.
pub const RINGD: ImageName = ImageName {
    name: "ringd",
    tag: env!("CARGO_PKG_VERSION"),
};

/// Every image Ring builds, in build order.
pub const ALL: [ImageName; 7] = [
    PAUSE,
    ETCD,
    KUBE_APISERVER,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
    KUBE_PROXY,
    RINGD,
];

/// What a node that hosts control planes as pods runs: the sandbox, etcd
/// (with its backup sidecar and restore init container), kube-apiserver
/// (with its lease guard), kube-controller-manager and kube-scheduler.
/// kube-proxy runs on the node as a process and ringd next to it, so their
/// images are not needed there.
pub const CONTROL_PLANE: [ImageName; 5] = [
    PAUSE,
    ETCD,
    KUBE_APISERVER,
    KUBE_CONTROLLER_MANAGER,
    KUBE_SCHEDULER,
];

/// The full name (`docker.io/ring/<name>:<tag>`) of the image called `name`.
pub fn reference(name: &str) -> Option<String> {
    ALL.iter().find(|i| i.name == name).map(ImageName::full)
}

/// Where images are built by default: `images` in the setup cache.
pub fn default_dir() -> PathBuf {
    crate::binaries::cache_dir().join("images")
}

/// An image archive on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuiltImage {
    /// The image's name (`etcd`).
    pub name: String,
    /// Its full name (`docker.io/ring/etcd:v3.7.3`).
    pub reference: String,
    /// The archive (`<dir>/<name>.tar`).
    pub archive: PathBuf,
    /// The manifest's digest (`sha256:...`): what `ctr images ls` shows.
    pub digest: String,
    /// The archive's size in bytes.
    pub size: u64,
    /// Whether this build wrote the archive (false: it was up to date).
    #[serde(default)]
    pub rebuilt: bool,
    /// Program → the version it printed when the image was built.
    #[serde(default)]
    pub versions: std::collections::BTreeMap<String, String>,
}

/// Builds every image of [`catalog`] into `out_dir` (skipping archives already
/// built from identical inputs).
pub fn build_all(out_dir: &Path, inputs: &ImageInputs) -> Result<Vec<BuiltImage>> {
    let specs = catalog(inputs)?;
    specs.iter().map(|spec| build(out_dir, spec)).collect()
}

/// Builds `spec` into `out_dir/<name>.tar`, unless the archive there was built
/// from identical inputs (same manifest digest); the archive is replaced atomically.
pub fn build(out_dir: &Path, spec: &ImageSpec) -> Result<BuiltImage> {
    std::fs::create_dir_all(out_dir).map_err(SeedError::io(out_dir))?;
    let layer = archive::layer_blob(spec)?;
    let docs = archive::Documents::new(spec, layer)?;
    let name = spec.image.name;
    let mut built = BuiltImage {
        name: name.to_string(),
        reference: spec.image.full(),
        archive: out_dir.join(format!("{name}.tar")),
        digest: docs.manifest_digest(),
        size: 0,
        rebuilt: false,
        versions: spec.versions.clone(),
    };
    if let Some(previous) = read_built(out_dir, name) {
        if previous.digest == built.digest && previous.reference == built.reference {
            return Ok(previous);
        }
    }
    // per process: two builds into one dir (parallel tests) never share a temp file
    let tmp = out_dir.join(format!(".{name}.tar.{}.tmp", std::process::id()));
    let written = write_file(&tmp, |file| {
        archive::write_archive(spec, &docs, file).map(drop)
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &built.archive).map_err(SeedError::io(&built.archive))?;
    built.size = std::fs::metadata(&built.archive)
        .map_err(SeedError::io(&built.archive))?
        .len();
    built.rebuilt = true;
    let record = serde_json::to_vec_pretty(&built).unwrap_or_default();
    let sidecar = sidecar(out_dir, name);
    let tmp = out_dir.join(format!(".{name}.json.{}.tmp", std::process::id()));
    std::fs::write(&tmp, record).map_err(SeedError::io(&tmp))?;
    std::fs::rename(&tmp, &sidecar).map_err(SeedError::io(&sidecar))?;
    Ok(built)
}

/// Creates `path`, lets `write` fill it (buffered), then flushes and syncs it.
fn write_file(
    path: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<()>,
) -> Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(SeedError::io(path))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    write(&mut out)?;
    out.flush().map_err(SeedError::io(path))?;
    let file = out
        .into_inner()
        .map_err(|e| SeedError::io(path)(e.into_error()))?;
    file.sync_all().map_err(SeedError::io(path))
}

fn sidecar(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.json"))
}

/// The record of `name`'s archive in `dir`, if both exist and agree on its size.
fn read_built(dir: &Path, name: &str) -> Option<BuiltImage> {
    let text = std::fs::read(sidecar(dir, name)).ok()?;
    let mut built: BuiltImage = serde_json::from_slice(&text).ok()?;
    built.archive = dir.join(format!("{name}.tar"));
    built.rebuilt = false;
    let size = std::fs::metadata(&built.archive).ok()?.len();
    (size == built.size && built.name == name).then_some(built)
}

/// The archives built in `dir` (with their build records), Ring's images in
/// [`ALL`]'s order first, then any others by name.
pub fn list(dir: &Path) -> Result<Vec<BuiltImage>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(SeedError::io(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let path = entry.map_err(SeedError::io(dir))?.path();
        if path.extension().is_some_and(|e| e == "tar") {
            if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                names.push(stem.to_string());
            }
        }
    }
    let rank = |n: &str| ALL.iter().position(|i| i.name == n).unwrap_or(ALL.len());
    names.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    Ok(names.iter().filter_map(|n| read_built(dir, n)).collect())
}

#[cfg(test)]
mod tests;
