//! The images Ring builds, from the binaries on this machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::spec::{Content, ImageSpec};
use super::{
    host, ImageName, ETCD, KUBE_APISERVER, KUBE_CONTROLLER_MANAGER, KUBE_PROXY, KUBE_SCHEDULER,
    PAUSE, RINGD,
};
use crate::binaries::BinarySearch;
use crate::error::{Result, SeedError};

/// The C source of the pause binary (compiled with `gcc -static -Os` when built).
pub const PAUSE_SOURCE: &str = include_str!("../../images/pause.c");

/// The iptables commands kube-proxy runs (all served by `xtables-nft-multi`).
const IPTABLES_COMMANDS: [&str; 12] = [
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];

/// Where the images' programs come from.
#[derive(Debug, Clone)]
pub struct ImageInputs {
    /// Where etcd, the Kubernetes binaries, gcc, ldd, iptables and conntrack are looked for.
    pub search: BinarySearch,
    /// The `ringd` binary to put into `ring/ringd`.
    pub ringd: PathBuf,
    /// The `ring-agent` binary (lease guard, backup, restore) put into the
    /// etcd and kube-apiserver images.
    pub agent: PathBuf,
}

impl ImageInputs {
    /// The standard search ([`BinarySearch::standard`] with `bin_dir` first, then
    /// `/usr/sbin` and `/sbin` for iptables and conntrack) and this `ringd`.
    pub fn standard(bin_dir: Option<&Path>, ringd: PathBuf) -> Self {
        let sbin = [PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")];
        ImageInputs {
            search: BinarySearch::standard(bin_dir).followed_by(sbin),
            agent: ringd.with_file_name("ring-agent"),
            ringd,
        }
    }
}

/// Every image of [`super::ALL`] as a spec, or an error naming the first
/// missing binary (and `scripts/setup`) or a binary of the wrong version.
pub fn catalog(inputs: &ImageInputs) -> Result<Vec<ImageSpec>> {
    let ldd = inputs.search.find("ldd")?;
    let pause = pause(inputs)?;
    let objcopy = inputs.search.find("objcopy")?;
    // stripped once for the three images that carry it
    let agent = Agent::read(inputs, &objcopy)?;
    let mut etcd = etcd(inputs, &ldd)?;
    agent.add_to(&mut etcd, &ldd)?;
    let mut specs = vec![pause, etcd];
    let mut apiserver = kube(inputs, &ldd, KUBE_APISERVER)?;
    agent.add_to(&mut apiserver, &ldd)?;
    specs.push(apiserver);
    for image in [KUBE_CONTROLLER_MANAGER, KUBE_SCHEDULER] {
        specs.push(kube(inputs, &ldd, image)?);
    }
    specs.push(kube_proxy(inputs, &ldd)?);
    let mut ringd = ringd(inputs, &ldd, &objcopy)?;
    // next to ringd: the lease guard and relay its seeds run
    agent.add_to(&mut ringd, &ldd)?;
    specs.push(ringd);
    Ok(specs)
}

/// `ring/pause`: Ring's pause binary, compiled now from [`PAUSE_SOURCE`].
pub(super) fn pause(inputs: &ImageInputs) -> Result<ImageSpec> {
    let gcc = inputs.search.find("gcc")?;
    let binary = compile_pause(&gcc)?;
    let mut spec = ImageSpec::new(PAUSE, &["/usr/local/bin/pause"]);
    spec.insert(
        "/usr/local/bin/pause",
        Content::Bytes {
            data: binary,
            mode: 0o755,
        },
    )?;
    spec.insert("/pause", Content::Symlink("usr/local/bin/pause".into()))?;
    spec.versions.insert("pause".into(), PAUSE.tag.into());
    Ok(spec)
}

/// `gcc -static -Os -s` of the pause source in a scratch dir; the binary's bytes.
fn compile_pause(gcc: &Path) -> Result<Vec<u8>> {
    let scratch = host::scratch_dir("ring-pause-")?;
    let dir = scratch.path();
    let source = dir.join("pause.c");
    std::fs::write(&source, PAUSE_SOURCE).map_err(SeedError::io(&source))?;
    let mut cmd = Command::new(gcc);
    cmd.current_dir(dir)
        .args(["-static", "-Os", "-s", "-o", "pause", "pause.c"]);
    let ran = host::run_for(PAUSE.name, &mut cmd, Duration::from_secs(120))?;
    if !ran.success {
        return Err(SeedError::ImageBuild {
            image: PAUSE.name.into(),
            reason: format!(
                "`{} -static -Os pause.c` failed (a static build needs gcc and libc6-dev; run scripts/setup): {}",
                gcc.display(),
                ran.stderr.trim()
            ),
        });
    }
    let binary = dir.join("pause");
    std::fs::read(&binary).map_err(SeedError::io(&binary))
}

/// `ring/etcd`: etcd, etcdctl and etcdutl (a restore init container's
/// `etcdutl snapshot restore`) with their shared libraries, if any.
fn etcd(inputs: &ImageInputs, ldd: &Path) -> Result<ImageSpec> {
    let etcd = inputs.search.find("etcd")?;
    let mut spec = ImageSpec::new(ETCD, &["/usr/local/bin/etcd"]);
    spec.versions
        .insert("etcd".into(), check_version(ETCD, &etcd)?);
    spec.add_program("/usr/local/bin/etcd", &etcd, ldd)?;
    for tool in ["etcdctl", "etcdutl"] {
        let path = inputs.search.find(tool)?;
        spec.versions
            .insert(tool.into(), asked_version(ETCD, &path, &["version"])?);
        spec.add_program(&format!("/usr/local/bin/{tool}"), &path, ldd)?;
    }
    Ok(spec)
}

/// `ring-agent` (lease guard, backup, restore), stripped, for the images
/// that run it at [`crate::kubernetes::agent::AGENT`].
struct Agent {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Agent {
    fn read(inputs: &ImageInputs, objcopy: &Path) -> Result<Self> {
        if !inputs.agent.is_file() {
            return Err(SeedError::ImageBuild {
                image: ETCD.name.into(),
                reason: format!(
                    "{} does not exist; build it with `cargo build -p ringd --bins` (it is taken from next to ringd)",
                    inputs.agent.display()
                ),
            });
        }
        let bytes = host::stripped(ETCD.name, objcopy, &inputs.agent)?;
        Ok(Agent {
            path: inputs.agent.clone(),
            bytes,
        })
    }

    /// Adds the agent, and the shared libraries it loads, to `spec`.
    fn add_to(&self, spec: &mut ImageSpec, ldd: &Path) -> Result<()> {
        let data = self.bytes.clone();
        spec.insert(
            crate::kubernetes::agent::AGENT,
            Content::Bytes { data, mode: 0o755 },
        )?;
        spec.add_libraries(std::slice::from_ref(&self.path), ldd)
    }
}

/// A Kubernetes control-plane image: the one binary at `/usr/local/bin`.
fn kube(inputs: &ImageInputs, ldd: &Path, image: ImageName) -> Result<ImageSpec> {
    let binary = inputs.search.find(image.name)?;
    let version = check_version(image, &binary)?;
    let at = format!("/usr/local/bin/{}", image.name);
    let mut spec = ImageSpec::new(image, &[&at]);
    spec.versions.insert(image.name.into(), version);
    spec.add_program(&at, &binary, ldd)?;
    Ok(spec)
}

/// `ring/kube-proxy`: kube-proxy plus iptables (nft backend, with its
/// extensions) and conntrack, which kube-proxy runs.
fn kube_proxy(inputs: &ImageInputs, ldd: &Path) -> Result<ImageSpec> {
    let mut spec = kube(inputs, ldd, KUBE_PROXY)?;
    let xtables = inputs.search.find("xtables-nft-multi")?;
    let iptables = asked_version(KUBE_PROXY, &xtables, &["iptables", "--version"])?;
    spec.versions.insert("iptables".into(), iptables);
    spec.add_program("/usr/sbin/xtables-nft-multi", &xtables, ldd)?;
    for command in IPTABLES_COMMANDS {
        spec.insert(
            &format!("/usr/sbin/{command}"),
            Content::Symlink("xtables-nft-multi".into()),
        )?;
    }
    let conntrack = inputs.search.find("conntrack")?;
    let version = asked_version(KUBE_PROXY, &conntrack, &["--version"])?;
    spec.versions.insert("conntrack".into(), version);
    spec.add_program("/usr/sbin/conntrack", &conntrack, ldd)?;
    let extensions = xtables_extensions(&spec)?;
    let dir = extensions.display().to_string();
    let mut modules = Vec::new();
    for entry in std::fs::read_dir(&extensions).map_err(SeedError::io(&extensions))? {
        let path = entry.map_err(SeedError::io(&extensions))?.path();
        if path.extension().is_some_and(|e| e == "so") {
            modules.push(path);
        }
    }
    modules.sort();
    for module in &modules {
        let name = module
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        spec.add_host_file(&format!("{dir}/{name}"), module)?;
    }
    spec.add_libraries(&modules, ldd)?;
    spec.add_optional_host_file("/etc/protocols")?;
    spec.insert("/run", Content::Dir(0o755))?;
    Ok(spec)
}

/// The directory libxtables loads iptables' extensions from (compiled into
/// the library as `XTABLES_LIBDIR`), read from the libxtables in `spec`.
fn xtables_extensions(spec: &ImageSpec) -> Result<PathBuf> {
    let lib = spec.files.iter().find_map(|(path, content)| match content {
        Content::Host { path: source, .. } if path.contains("/libxtables.so") => {
            Some(source.clone())
        }
        _ => None,
    });
    let missing = |why: String| SeedError::ImageBuild {
        image: KUBE_PROXY.name.into(),
        reason: format!("{why}; install iptables (scripts/setup does)"),
    };
    let lib = lib.ok_or_else(|| missing("xtables-nft-multi does not load libxtables".into()))?;
    let bytes = std::fs::read(&lib).map_err(SeedError::io(&lib))?;
    let dir = bytes
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .find(|s| s.starts_with('/') && s.ends_with("/xtables"))
        .map(PathBuf::from)
        .ok_or_else(|| missing(format!("{} names no extension directory", lib.display())))?;
    if !dir.is_dir() {
        return Err(missing(format!(
            "{} (iptables' extensions) is missing",
            dir.display()
        )));
    }
    Ok(dir)
}

/// `ring/ringd`: this workspace's ringd (stripped) with its shared libraries
/// and the host's CA bundle (for object storage over TLS); [`catalog`] adds
/// `ring-agent` next to it.
pub(super) fn ringd(inputs: &ImageInputs, ldd: &Path, objcopy: &Path) -> Result<ImageSpec> {
    let ringd = &inputs.ringd;
    if !ringd.is_file() {
        return Err(SeedError::ImageBuild {
            image: RINGD.name.into(),
            reason: format!(
                "{} does not exist; build it with `cargo build -p ringd --bins` (`ringctl images build` takes the ringd next to ringctl, or --ringd PATH)",
                ringd.display()
            ),
        });
    }
    let version = check_version(RINGD, ringd)?;
    let mut spec = ImageSpec::new(RINGD, &["/usr/local/bin/ringd"]);
    spec.versions.insert("ringd".into(), version);
    let data = host::stripped(RINGD.name, objcopy, ringd)?;
    spec.insert("/usr/local/bin/ringd", Content::Bytes { data, mode: 0o755 })?;
    spec.add_libraries(std::slice::from_ref(ringd), ldd)?;
    spec.add_optional_host_file("/etc/ssl/certs/ca-certificates.crt")?;
    Ok(spec)
}

/// The version `binary --version` prints, unless it is not the image's (the
/// tag, also without its `v`): then why the image cannot be built.
fn check_version(image: ImageName, binary: &Path) -> Result<String> {
    let ran = host::run_for(
        image.name,
        Command::new(binary).arg("--version"),
        Duration::from_secs(60),
    )?;
    let text = format!("{}{}", ran.stdout, ran.stderr);
    let bare = image.tag.trim_start_matches('v');
    let matches = text.split_whitespace().any(|t| t == image.tag || t == bare);
    if ran.success && matches {
        return Ok(image.tag.to_string());
    }
    Err(SeedError::ImageBuild {
        image: image.name.into(),
        reason: format!(
            "`{} --version` printed {:?}, but Ring's image is {} (seed::images); install that version (scripts/setup does) or point RING_BIN_DIR at it",
            binary.display(),
            text.trim(),
            image.short()
        ),
    })
}

/// The first version-like word (`v1.8.9`, `3.7.3`) `binary ARGS` prints, for
/// the record of image `image`.
fn asked_version(image: ImageName, binary: &Path, args: &[&str]) -> Result<String> {
    let ran = host::run_for(
        image.name,
        Command::new(binary).args(args),
        Duration::from_secs(60),
    )?;
    let text = format!("{}{}", ran.stdout, ran.stderr);
    match (ran.success, crate::binaries::version_word(&text)) {
        (true, Some(v)) => Ok(v.to_string()),
        _ => Err(SeedError::ImageBuild {
            image: image.name.into(),
            reason: format!(
                "`{} {}` printed no version: {:?}",
                binary.display(),
                args.join(" "),
                text.trim()
            ),
        }),
    }
}

impl ImageSpec {
    /// Adds the host file `path` at the same path if the host has it.
    fn add_optional_host_file(&mut self, path: &str) -> Result<()> {
        if Path::new(path).is_file() {
            self.add_host_file(path, Path::new(path))?;
        }
        Ok(())
    }
}
