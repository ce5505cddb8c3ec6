//! A containerd root with the control-plane images already imported and
//! unpacked (a "preload", as minikube ships one per Kubernetes version):
//! built once next to the image archives by `ringctl images build`, and
//! hard-linked into a new node's empty containerd root before its containerd
//! starts. Importing the archives on every node would hash and unpack
//! every image once per node, all nodes at the same time, on the path of
//! every bootstrap.
//!
//! Content blobs and unpacked snapshots never change once written, so nodes
//! share them through hard links; containerd's databases (`*.db`) are copied,
//! each node gets its own. A preload is named after the digests of the images
//! it holds: a node takes it only when it holds exactly the archives built
//! now, and anything else is imported as before.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{ctr, BuiltImage, CONTROL_PLANE};
use crate::error::{Result, SeedError};

/// How long the throwaway containerd may take to answer.
const START: Duration = Duration::from_secs(30);

fn preload_err(reason: String) -> SeedError {
    SeedError::Containerd {
        socket: PathBuf::from("(image preload)"),
        reason,
    }
}

/// The preloaded images among `built`: [`CONTROL_PLANE`]'s, in its order;
/// `None` unless every one of them is built.
fn preloaded(built: &[BuiltImage]) -> Option<Vec<&BuiltImage>> {
    CONTROL_PLANE
        .iter()
        .map(|name| built.iter().find(|b| b.name == name.name))
        .collect()
}

/// The preload's directory for the images `built` in `images_dir`: named
/// after their digests, so a rebuilt image means another preload.
pub fn dir(images_dir: &Path, built: &[BuiltImage]) -> Option<PathBuf> {
    use sha2::{Digest, Sha256};
    let images = preloaded(built)?;
    let mut hash = Sha256::new();
    for image in images {
        hash.update(image.reference.as_bytes());
        hash.update(b"@");
        hash.update(image.digest.as_bytes());
        hash.update(b"\n");
    }
    let hex: String = hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(images_dir.join(format!("containerd-preload-{hex}")))
}

/// Builds the preload of the images built in `images_dir` with the given
/// `containerd` and `ctr` (nothing when it exists; older preloads removed).
/// Returns its directory, `None` when not every control-plane image is built.
pub fn build(images_dir: &Path, containerd: &Path, ctr_bin: &Path) -> Result<Option<PathBuf>> {
    let built = super::list(images_dir)?;
    let (Some(images), Some(target)) = (preloaded(&built), dir(images_dir, &built)) else {
        return Ok(None);
    };
    if target.is_dir() {
        return Ok(Some(target));
    }
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    let tmp = images_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let run = std::env::temp_dir().join(format!("ring-preload-{}", std::process::id()));
    let result = import_into(&tmp, &run, containerd, ctr_bin, &images);
    let _ = std::fs::remove_dir_all(&run);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // another build may have won the race: its preload is as good
    if std::fs::rename(&tmp, &target).is_err() && target.is_dir() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    remove_others(images_dir, &target);
    Ok(Some(target))
}

/// [`build`] with the `containerd` and `ctr` found where nodes find them.
pub fn build_standard(images_dir: &Path) -> Result<Option<PathBuf>> {
    let search = crate::BinarySearch::standard(None);
    build(
        images_dir,
        &search.find("containerd")?,
        &search.find("ctr")?,
    )
}

/// Runs a containerd with its root at `root` (state under `run`) and imports
/// `images` into it; stops it before returning.
fn import_into(
    root: &Path,
    run: &Path,
    containerd: &Path,
    ctr_bin: &Path,
    images: &[&BuiltImage],
) -> Result<()> {
    for d in [root, run] {
        std::fs::create_dir_all(d).map_err(SeedError::io(d))?;
    }
    let socket = run.join("containerd.sock");
    let config = run.join("containerd.toml");
    let text = format!(
        "version = 4\nroot = \"{}\"\nstate = \"{}\"\nimports = []\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\n[plugins.'io.containerd.server.v1.grpc']\n  address = \"{}\"\n\n[plugins.'io.containerd.server.v1.ttrpc']\n  address = \"{}.ttrpc\"\n",
        root.display(),
        run.join("state").display(),
        socket.display(),
        socket.display(),
    );
    std::fs::write(&config, text).map_err(SeedError::io(&config))?;
    let log = run.join("containerd.log");
    let out = std::fs::File::create(&log).map_err(SeedError::io(&log))?;
    let err = out.try_clone().map_err(SeedError::io(&log))?;
    let child = {
        use std::os::unix::process::CommandExt;
        Command::new(containerd)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| preload_err(format!("starting {}: {e}", containerd.display())))?
    };
    let _stop = Stop(child);
    wait_answers(ctr_bin, &socket, &log)?;
    for image in images {
        ctr::import(ctr_bin, &socket, &image.archive)?;
    }
    Ok(())
}

/// Waits until the containerd at `socket` lists images.
fn wait_answers(ctr_bin: &Path, socket: &Path, log: &Path) -> Result<()> {
    let deadline = Instant::now() + START;
    loop {
        if socket.exists() && ctr::listed(ctr_bin, socket).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(preload_err(format!(
                "the throwaway containerd did not answer within {}s; its log: {}",
                START.as_secs(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops the throwaway containerd (its whole process group) when dropped.
struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        use nix::sys::signal::{killpg, Signal};
        let group = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// Removes the preloads in `images_dir` other than `keep` (best effort).
fn remove_others(images_dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(images_dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("containerd-preload-") && path != keep {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Puts the preload of the images built in `images_dir` into the containerd
/// root `root` when `root` is empty (a node's first start) and the preload
/// exists; whether it did. The copy goes to a temporary sibling first, so a
/// failed one leaves `root` empty (the images are then imported as before).
pub fn seed_root(images_dir: &Path, root: &Path) -> Result<bool> {
    let empty = match std::fs::read_dir(root) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(SeedError::io(root)(e)),
    };
    let built = super::list(images_dir)?;
    let Some(source) = dir(images_dir, &built).filter(|d| d.is_dir()) else {
        return Ok(false);
    };
    if !empty {
        return Ok(false);
    }
    let mut tmp = root.as_os_str().to_owned();
    tmp.push(".preload.tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    if let Err(e) = link_tree(&source, &tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let _ = std::fs::remove_dir(root);
    std::fs::rename(&tmp, root).map_err(SeedError::io(root))?;
    Ok(true)
}

/// Recreates the tree `from` at `to`: directories and symlinks anew,
/// databases (`*.db`) copied, every other file hard-linked (copied when
/// linking fails, e.g. across file systems).
fn link_tree(from: &Path, to: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(from).map_err(SeedError::io(from))?;
    let kind = meta.file_type();
    if kind.is_dir() {
        std::fs::create_dir(to).map_err(SeedError::io(to))?;
        let mode = std::fs::Permissions::from_mode(meta.permissions().mode());
        std::fs::set_permissions(to, mode).map_err(SeedError::io(to))?;
        for entry in std::fs::read_dir(from).map_err(SeedError::io(from))? {
            let entry = entry.map_err(SeedError::io(from))?;
            link_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if kind.is_symlink() {
        let target = std::fs::read_link(from).map_err(SeedError::io(from))?;
        return std::os::unix::fs::symlink(target, to).map_err(SeedError::io(to));
    }
    let database = from.extension().is_some_and(|e| e == "db");
    if database || std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).map_err(SeedError::io(to))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn built(name: &str, digest: &str) -> BuiltImage {
        BuiltImage {
            name: name.into(),
            reference: super::super::reference(name).unwrap_or_default(),
            archive: format!("/images/{name}.tar").into(),
            digest: digest.into(),
            size: 1,
            rebuilt: false,
            versions: Default::default(),
        }
    }

    fn all(digest: &str) -> Vec<BuiltImage> {
        CONTROL_PLANE
            .iter()
            .map(|i| built(i.name, digest))
            .collect()
    }

    #[test]
    fn a_preload_is_named_after_its_images_digests_and_needs_all_of_them() {
        let d = Path::new("/images");
        let one = dir(d, &all("sha256:1")).unwrap();
        assert!(one.starts_with(d));
        assert_eq!(dir(d, &all("sha256:1")).unwrap(), one);
        assert_ne!(dir(d, &all("sha256:2")).unwrap(), one);
        let mut missing = all("sha256:1");
        missing.retain(|b| b.name != "kube-scheduler");
        assert_eq!(dir(d, &missing), None);
        // images other than the control plane's do not change it
        let mut more = all("sha256:1");
        more.push(built("ringd", "sha256:9"));
        assert_eq!(dir(d, &more).unwrap(), one);
    }

    /// Blobs are shared by hard links, databases copied (each node writes its
    /// own), symlinks and modes kept.
    #[test]
    fn the_tree_is_linked_but_its_databases_are_copied() {
        let t = tempfile::tempdir().unwrap();
        let from = t.path().join("from");
        std::fs::create_dir_all(from.join("content/blobs")).unwrap();
        std::fs::write(from.join("content/blobs/abc"), b"blob").unwrap();
        std::fs::write(from.join("meta.db"), b"bolt").unwrap();
        std::os::unix::fs::symlink("content/blobs/abc", from.join("link")).unwrap();
        let to = t.path().join("to");
        link_tree(&from, &to).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(
            ino(&to.join("content/blobs/abc")),
            ino(&from.join("content/blobs/abc"))
        );
        assert_ne!(ino(&to.join("meta.db")), ino(&from.join("meta.db")));
        assert_eq!(std::fs::read(to.join("meta.db")).unwrap(), b"bolt");
        assert_eq!(
            std::fs::read_link(to.join("link")).unwrap(),
            Path::new("content/blobs/abc")
        );
    }

    /// A node's root with anything in it (a node that ran before) is left
    /// alone; an empty one gets the preload; no preload, nothing happens.
    #[test]
    fn only_an_empty_root_is_seeded_and_only_from_the_current_preload() {
        let t = tempfile::tempdir().unwrap();
        let images = t.path().join("images");
        std::fs::create_dir_all(&images).unwrap();
        let root = t.path().join("node/containerd");
        // no archives built: no preload to take
        assert!(!seed_root(&images, &root).unwrap());
        // archives recorded, their preload present
        for b in all("sha256:1") {
            let archive = images.join(format!("{}.tar", b.name));
            std::fs::write(&archive, b"x").unwrap();
            let record = BuiltImage { archive, ..b };
            let json = serde_json::to_vec(&record).unwrap();
            std::fs::write(images.join(format!("{}.json", record.name)), json).unwrap();
        }
        let listed = super::super::list(&images).unwrap();
        let preload = dir(&images, &listed).unwrap();
        std::fs::create_dir_all(preload.join("io.containerd.content.v1.content")).unwrap();
        std::fs::write(preload.join("io.containerd.content.v1.content/x"), b"1").unwrap();
        std::fs::create_dir_all(&root).unwrap();
        assert!(seed_root(&images, &root).unwrap());
        assert!(root.join("io.containerd.content.v1.content/x").is_file());
        // a second start finds it non-empty
        assert!(!seed_root(&images, &root).unwrap());
    }
}
