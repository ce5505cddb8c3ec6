//! What goes into an image: its file tree and its run configuration.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use super::{host, ImageName};
use crate::error::{Result, SeedError};

/// `PATH` of every image's processes.
pub const PATH_ENV: &str = "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// One entry of an image's file tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// A regular file copied from the host (symlinks followed) with this mode.
    Host { path: PathBuf, mode: u32 },
    /// A regular file with these bytes and this mode.
    Bytes { data: Vec<u8>, mode: u32 },
    /// A symbolic link to this target.
    Symlink(String),
    /// A directory with this mode.
    Dir(u32),
}

/// An image to build: its name, what it runs, and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The image's name and tag.
    pub image: ImageName,
    /// The image config's `Entrypoint` (absolute paths).
    pub entrypoint: Vec<String>,
    /// The image config's `Env`.
    pub env: Vec<String>,
    /// Absolute path in the image → content; parent directories are implied (0755).
    pub files: BTreeMap<String, Content>,
    /// Program → the version it printed when the image was built (a label
    /// of the image, and `ringctl images list`'s VERSIONS).
    pub versions: BTreeMap<String, String>,
}

impl ImageSpec {
    /// An image with the base every image has: `/etc/passwd` and `/etc/group`
    /// (root), `/etc/nsswitch.conf`, `/root`, `/tmp` (1777), and `PATH`.
    pub fn new(image: ImageName, entrypoint: &[&str]) -> Self {
        let mut spec = ImageSpec {
            image,
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            env: vec![PATH_ENV.to_string()],
            files: BTreeMap::new(),
            versions: BTreeMap::new(),
        };
        let text = |s: &str| Content::Bytes {
            data: s.as_bytes().to_vec(),
            mode: 0o644,
        };
        spec.files.insert(
            "/etc/passwd".into(),
            text("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"),
        );
        spec.files
            .insert("/etc/group".into(), text("root:x:0:\nnogroup:x:65534:\n"));
        spec.files
            .insert("/etc/nsswitch.conf".into(), text("hosts: files dns\n"));
        spec.files.insert("/root".into(), Content::Dir(0o700));
        spec.files.insert("/tmp".into(), Content::Dir(0o1777));
        spec
    }

    /// Adds `content` at `path` (absolute, normalized), replacing what was there.
    pub fn insert(&mut self, path: &str, content: Content) -> Result<()> {
        let path = normalize(self.image.name, path)?;
        self.files.insert(path, content);
        Ok(())
    }

    /// Adds the host file `source` at `path`, keeping its permission bits.
    pub fn add_host_file(&mut self, path: &str, source: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(source).map_err(|e| SeedError::ImageBuild {
            image: self.image.name.to_string(),
            reason: format!("cannot read {}: {e}", source.display()),
        })?;
        if !meta.is_file() {
            return Err(SeedError::ImageBuild {
                image: self.image.name.to_string(),
                reason: format!("{} is not a regular file", source.display()),
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        let content = Content::Host {
            path: source.to_path_buf(),
            mode,
        };
        self.insert(path, content)
    }

    /// Adds the program `source` at `path` and every shared library `ldd` lists
    /// for it at the library's own path (so the dynamic loader finds them).
    pub fn add_program(&mut self, path: &str, source: &Path, ldd: &Path) -> Result<()> {
        self.add_host_file(path, source)?;
        self.add_libraries(&[source.to_path_buf()], ldd)
    }

    /// Adds the shared libraries `ldd` lists for `binaries` at their own paths.
    pub fn add_libraries(&mut self, binaries: &[PathBuf], ldd: &Path) -> Result<()> {
        for lib in host::shared_libraries(self.image.name, ldd, binaries)? {
            let at = lib.to_string_lossy().into_owned();
            self.add_host_file(&at, &lib)?;
        }
        Ok(())
    }

    /// Every entry to write, parents before children: the files plus their
    /// implied parent directories.
    pub(super) fn tree(&self) -> BTreeMap<String, Content> {
        let mut tree = self.files.clone();
        for path in self.files.keys() {
            let mut parent = Path::new(path).parent();
            while let Some(dir) = parent.filter(|d| *d != Path::new("/")) {
                tree.entry(dir.to_string_lossy().into_owned())
                    .or_insert(Content::Dir(0o755));
                parent = dir.parent();
            }
        }
        tree
    }
}

/// `path` as an absolute path without `.`, `..`, double or trailing slashes.
fn normalize(image: &str, path: &str) -> Result<String> {
    let bad = |why: &str| SeedError::ImageBuild {
        image: image.to_string(),
        reason: format!("{path:?} cannot be a path in an image: {why}"),
    };
    if !path.starts_with('/') {
        return Err(bad("not absolute"));
    }
    let mut out = String::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => {
                out.push('/');
                out.push_str(part.to_str().ok_or_else(|| bad("not UTF-8"))?);
            }
            Component::ParentDir | Component::Prefix(_) => return Err(bad("contains `..`")),
        }
    }
    if out.is_empty() {
        return Err(bad("the root itself"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: ImageName = ImageName {
        name: "t",
        tag: "1",
    };

    #[test]
    fn paths_are_normalized_and_escapes_refused() {
        assert_eq!(normalize("t", "/usr//bin/./x/").unwrap(), "/usr/bin/x");
        assert!(normalize("t", "usr/bin").is_err());
        assert!(normalize("t", "/usr/../etc").is_err());
        assert!(normalize("t", "/").is_err());
    }

    #[test]
    fn tree_has_parents_and_base_files() {
        let mut spec = ImageSpec::new(T, &["/usr/local/bin/x"]);
        spec.insert(
            "/usr/local/bin/x",
            Content::Bytes {
                data: b"x".to_vec(),
                mode: 0o755,
            },
        )
        .unwrap();
        let tree = spec.tree();
        for dir in ["/usr", "/usr/local", "/usr/local/bin", "/etc"] {
            assert_eq!(tree.get(dir), Some(&Content::Dir(0o755)), "{dir}");
        }
        assert_eq!(tree.get("/tmp"), Some(&Content::Dir(0o1777)));
        assert!(tree.contains_key("/etc/passwd"));
        assert_eq!(spec.env, vec![PATH_ENV.to_string()]);
    }

    #[test]
    fn a_missing_host_file_is_named() {
        let mut spec = ImageSpec::new(T, &[]);
        let err = spec
            .add_host_file("/x", Path::new("/nonexistent/ring-x"))
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ring-x"), "{err}");
    }
}
