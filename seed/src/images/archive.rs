//! Deterministic bytes: the layer tar of an image's file tree, the OCI JSON
//! documents, and the archive (OCI image layout + docker-save `manifest.json`).
//!
//! Every tar entry has mtime 0, uid/gid 0, no user or group names, and entries
//! come in sorted order; the JSON has a fixed field order and a fixed `created`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::spec::{Content, ImageSpec};
use crate::error::{Result, SeedError};

/// Media type of an OCI image index.
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// Media type of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of an OCI image config.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of an uncompressed layer.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The annotation containerd names an imported image by.
pub const ANNOTATION_IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation holding the tag.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The `created` time of every image: the epoch, so builds never differ by time.
pub const CREATED: &str = "1970-01-01T00:00:00Z";

/// A content-addressed blob: `sha256:<hex>` and its size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    /// Bytes.
    pub size: u64,
}

/// An OCI descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI platform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
}

/// An OCI image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    pub media_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// An OCI image index (`index.json` of the layout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    pub media_type: String,
    pub manifests: Vec<Descriptor>,
}

/// An OCI image config (no history: it would only carry timestamps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub created: String,
    pub architecture: String,
    pub os: String,
    pub config: RunConfig,
    pub rootfs: RootFs,
}

/// What a container of the image runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
}

/// The uncompressed layers' digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<String>,
}

/// One image of a docker-save `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerManifest {
    pub config: String,
    pub repo_tags: Vec<String>,
    pub layers: Vec<String>,
}

/// A writer that hashes (sha256) and counts what passes through.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    fn blob(&self) -> Blob {
        Blob {
            digest: format!("sha256:{:x}", self.hasher.clone().finalize()),
            size: self.len,
        }
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The digest of `bytes` as a blob.
pub fn blob_of(bytes: &[u8]) -> Blob {
    Blob {
        digest: format!("sha256:{:x}", Sha256::digest(bytes)),
        size: bytes.len() as u64,
    }
}

/// A tar header with every varying field fixed.
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    let _ = h.set_username("");
    let _ = h.set_groupname("");
    let _ = h.set_device_major(0);
    let _ = h.set_device_minor(0);
    h
}

/// Reads exactly `size` bytes of a host file, or fails naming it.
struct Exact<'a> {
    file: std::fs::File,
    path: &'a Path,
    left: u64,
}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self
            .file
            .read(&mut buf[..want])
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", self.path.display())))?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} shrank while it was read", self.path.display()),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Appends one entry of the file tree (`path` absolute) to `tar`.
fn append_entry<W: Write>(
    tar: &mut tar::Builder<W>,
    path: &str,
    content: &Content,
) -> std::io::Result<()> {
    let name = path.trim_start_matches('/');
    match content {
        Content::Dir(mode) => {
            let mut h = header(tar::EntryType::Directory, *mode, 0);
            h.set_path(format!("{name}/"))?;
            h.set_cksum();
            tar.append(&h, std::io::empty())
        }
        Content::Symlink(target) => {
            let mut h = header(tar::EntryType::Symlink, 0o777, 0);
            h.set_path(name)?;
            h.set_link_name(target)?;
            h.set_cksum();
            tar.append(&h, std::io::empty())
        }
        Content::Bytes { data, mode } => {
            let mut h = header(tar::EntryType::Regular, *mode, data.len() as u64);
            h.set_path(name)?;
            h.set_cksum();
            tar.append(&h, data.as_slice())
        }
        Content::Host { path: source, mode } => {
            let open_err = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("{}: {e}", source.display()))
            };
            let file = std::fs::File::open(source).map_err(open_err)?;
            let size = file.metadata().map_err(open_err)?.len();
            let mut h = header(tar::EntryType::Regular, *mode, size);
            h.set_path(name)?;
            h.set_cksum();
            let reader = Exact {
                file,
                path: source,
                left: size,
            };
            tar.append(&h, reader)
        }
    }
}

/// Writes the layer tar of `tree` into `out`; returns its digest and size.
fn write_layer<W: Write>(image: &str, tree: &BTreeMap<String, Content>, out: W) -> Result<Blob> {
    let fail = |e: std::io::Error| SeedError::ImageBuild {
        image: image.to_string(),
        reason: format!("writing the layer: {e}"),
    };
    let mut tar = tar::Builder::new(Hashing::new(out));
    for (path, content) in tree {
        append_entry(&mut tar, path, content).map_err(fail)?;
    }
    let hashing = tar.into_inner().map_err(fail)?;
    Ok(hashing.blob())
}

/// The layer's digest and size, computed without writing it anywhere.
pub fn layer_blob(spec: &ImageSpec) -> Result<Blob> {
    write_layer(spec.image.name, &spec.tree(), std::io::sink())
}

/// The JSON documents of an image whose one layer is `layer`.
#[derive(Debug, Clone)]
pub struct Documents {
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub index: Vec<u8>,
    pub docker_manifest: Vec<u8>,
    pub layer: Blob,
}

/// The OCI platform of this machine (`amd64`, `arm64`, ...).
pub fn platform() -> Platform {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    Platform {
        architecture: architecture.to_string(),
        os: "linux".to_string(),
    }
}

/// The label that names the versions of the programs inside an image.
pub const VERSIONS_LABEL: &str = "ring.gardener.cloud/versions";

/// `etcd=3.7.3 etcdctl=3.7.3 ...`: program versions as one label value.
pub fn versions_text(versions: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = versions.iter().map(|(p, v)| format!("{p}={v}")).collect();
    pairs.join(" ")
}

impl Documents {
    /// Config, manifest, index (annotated with the full name and the tag) and
    /// docker-save manifest for `spec` with layer `layer`.
    pub fn new(spec: &ImageSpec, layer: Blob) -> Result<Self> {
        let platform = platform();
        let mut labels = BTreeMap::from([
            (
                "org.opencontainers.image.title".to_string(),
                spec.image.short(),
            ),
            (
                "org.opencontainers.image.version".to_string(),
                spec.image.tag.to_string(),
            ),
        ]);
        if !spec.versions.is_empty() {
            labels.insert(VERSIONS_LABEL.to_string(), versions_text(&spec.versions));
        }
        let config = json(&ImageConfig {
            created: CREATED.into(),
            architecture: platform.architecture.clone(),
            os: platform.os.clone(),
            config: RunConfig {
                env: spec.env.clone(),
                entrypoint: spec.entrypoint.clone(),
                working_dir: "/".into(),
                labels,
            },
            rootfs: RootFs {
                kind: "layers".into(),
                diff_ids: vec![layer.digest.clone()],
            },
        })?;
        let config_blob = blob_of(&config);
        let manifest = json(&Manifest {
            schema_version: 2,
            media_type: MANIFEST_MEDIA_TYPE.into(),
            config: descriptor(CONFIG_MEDIA_TYPE, &config_blob),
            layers: vec![descriptor(LAYER_MEDIA_TYPE, &layer)],
        })?;
        let mut entry = descriptor(MANIFEST_MEDIA_TYPE, &blob_of(&manifest));
        entry.platform = Some(platform);
        entry.annotations = BTreeMap::from([
            (ANNOTATION_IMAGE_NAME.to_string(), spec.image.full()),
            (ANNOTATION_REF_NAME.to_string(), spec.image.tag.to_string()),
        ]);
        let index = json(&Index {
            schema_version: 2,
            media_type: INDEX_MEDIA_TYPE.into(),
            manifests: vec![entry],
        })?;
        let docker_manifest = json(&[DockerManifest {
            config: blob_path(&config_blob.digest),
            repo_tags: vec![spec.image.short()],
            layers: vec![blob_path(&layer.digest)],
        }])?;
        Ok(Documents {
            config,
            manifest,
            index,
            docker_manifest,
            layer,
        })
    }

    /// The manifest's digest: the image's identity.
    pub fn manifest_digest(&self) -> String {
        blob_of(&self.manifest).digest
    }
}

fn descriptor(media_type: &str, blob: &Blob) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: blob.digest.clone(),
        size: blob.size,
        platform: None,
        annotations: BTreeMap::new(),
    }
}

fn json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| SeedError::ImageBuild {
        image: "?".into(),
        reason: format!("encoding JSON: {e}"),
    })
}

/// `blobs/sha256/<hex>` for `sha256:<hex>`.
pub fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

/// What one entry of the archive holds.
enum Part<'a> {
    Dir,
    Bytes(&'a [u8]),
    Layer,
}

/// Writes the archive of `spec` into `out`: `blobs/sha256/*` (config, layer,
/// manifest), `index.json`, `manifest.json`, `oci-layout`, in sorted order.
/// Fails if the layer came out different from `docs.layer` (an input changed).
pub fn write_archive<W: Write>(spec: &ImageSpec, docs: &Documents, out: W) -> Result<W> {
    let image = spec.image.name;
    let fail = |e: std::io::Error| SeedError::ImageBuild {
        image: image.to_string(),
        reason: format!("writing the archive: {e}"),
    };
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    let mut parts: BTreeMap<String, Part> = BTreeMap::from([
        ("blobs/".to_string(), Part::Dir),
        ("blobs/sha256/".to_string(), Part::Dir),
        ("index.json".to_string(), Part::Bytes(&docs.index)),
        (
            "manifest.json".to_string(),
            Part::Bytes(&docs.docker_manifest),
        ),
        ("oci-layout".to_string(), Part::Bytes(layout)),
    ]);
    parts.insert(
        blob_path(&blob_of(&docs.config).digest),
        Part::Bytes(&docs.config),
    );
    parts.insert(
        blob_path(&blob_of(&docs.manifest).digest),
        Part::Bytes(&docs.manifest),
    );
    parts.insert(blob_path(&docs.layer.digest), Part::Layer);
    let mut tar = tar::Builder::new(out);
    for (name, part) in &parts {
        match part {
            Part::Dir => append_entry(&mut tar, name.trim_end_matches('/'), &Content::Dir(0o755)),
            Part::Bytes(data) => {
                let content = Content::Bytes {
                    data: data.to_vec(),
                    mode: 0o644,
                };
                append_entry(&mut tar, name, &content)
            }
            Part::Layer => append_layer(&mut tar, name, spec, &docs.layer),
        }
        .map_err(fail)?;
    }
    tar.into_inner().map_err(fail)
}

/// Streams the layer of `spec` into `tar` as the entry `name` (`expected` bytes).
fn append_layer<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    spec: &ImageSpec,
    expected: &Blob,
) -> std::io::Result<()> {
    let mut h = header(tar::EntryType::Regular, 0o644, expected.size);
    h.set_path(name)?;
    h.set_cksum();
    let raw = tar.get_mut();
    raw.write_all(h.as_bytes())?;
    let written = write_layer(spec.image.name, &spec.tree(), &mut *raw)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    if &written != expected {
        return Err(std::io::Error::other(format!(
            "the layer changed while it was written ({} bytes {} instead of {} bytes {}): an input file changed; build again",
            written.size, written.digest, expected.size, expected.digest
        )));
    }
    let pad = (512 - written.size % 512) % 512;
    raw.write_all(&vec![0u8; pad as usize])
}
