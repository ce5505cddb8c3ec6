//! Ring's container images end to end: every image built from this machine's
//! binaries (deterministically: a second build writes nothing), imported into a
//! throwaway containerd under its full name and digest, and run with `ctr run`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ring_tests::{processes_mentioning, run_bounded};
use seed::images::{self, BuiltImage, ImageInputs};

/// A binary from the standard search, or a panic telling to run scripts/setup.
fn binary(name: &str) -> PathBuf {
    seed::BinarySearch::standard(None)
        .find(name)
        .unwrap_or_else(|e| panic!("{e}\nThis test needs real binaries: run scripts/setup first."))
}

/// A containerd of its own (root, state, socket, config in a temp dir, own
/// process group). On drop: its tasks, its process group and its shims are
/// killed, mounts under the dir unmounted, and the dir removed.
struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
    ctr: PathBuf,
}

impl Containerd {
    fn start() -> Self {
        Self::start_preloaded(None)
    }

    /// A containerd whose root starts as the preload of the images built in
    /// `images` (as a node's first start does), if given.
    fn start_preloaded(images: Option<&Path>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ring-images-")
            .tempdir()
            .expect("temp dir");
        if let Some(images) = images {
            let root = dir.path().join("root");
            let seeded =
                images::preload::seed_root(images, &root).unwrap_or_else(|e| panic!("{e}"));
            assert!(seeded, "no preload of the images in {}", images.display());
        }
        let d = dir.path().display().to_string();
        let (images, runtime) = (
            "plugins.'io.containerd.cri.v1.images'",
            "plugins.'io.containerd.cri.v1.runtime'",
        );
        let config = format!(
            r#"version = 4
root = "{d}/root"
state = "{d}/state"
imports = []
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[plugins.'io.containerd.server.v1.grpc']
  address = "{d}/containerd.sock"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "{d}/containerd.sock.ttrpc"

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = "{pause}"

[{runtime}]
  restrict_oom_score_adj = true

[{runtime}.cni]
  bin_dirs = ["{d}/cni/bin"]
  conf_dir = "{d}/cni/conf"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#,
            pause = images::PAUSE.full()
        );
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).expect("write containerd config");
        let log = std::fs::File::create(dir.path().join("containerd.log")).expect("log file");
        let err = log.try_clone().expect("log file");
        // `ctr run`'s shim runs the `runc` on containerd's PATH
        let path = format!(
            "{}:{}",
            seed::binaries::cache_bin_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new(binary("containerd"))
            .arg("--config")
            .arg(&config_path)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .expect("start containerd");
        let c = Containerd {
            dir,
            child,
            ctr: binary("ctr"),
        };
        c.wait_ready(Duration::from_secs(20));
        c
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let out = run_bounded(self.ctr().arg("version"), Duration::from_secs(10));
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer on {} within {timeout:?}: {}\n{}",
                self.socket().display(),
                String::from_utf8_lossy(&out.stderr),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr --address SOCKET -n k8s.io`, ready for more arguments.
    fn ctr(&self) -> Command {
        let mut cmd = Command::new(&self.ctr);
        cmd.arg("--address")
            .arg(self.socket())
            .args(["-n", images::NAMESPACE]);
        cmd
    }

    /// `ctr run --rm IMAGE ID ARGS...`: what the container printed (stdout + stderr).
    fn run(&self, image: &str, id: &str, args: &[&str]) -> String {
        let id = format!("ring-images-{id}-{}", std::process::id());
        let out = run_bounded(
            self.ctr().args(["run", "--rm", image, &id]).args(args),
            Duration::from_secs(60),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "ctr run {image} {args:?} failed: {text}\n{}",
            self.log_tail()
        );
        text
    }

    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "containerd's log (last lines):\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        )
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
        // tasks still running (a `ctr run` that hung): killed through containerd
        let tasks = run_bounded(
            self.ctr().args(["tasks", "ls", "-q"]),
            Duration::from_secs(10),
        );
        for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
            let _ = run_bounded(
                self.ctr().args(["tasks", "kill", "-s", "SIGKILL", id]),
                Duration::from_secs(10),
            );
        }
        // SAFETY: plain syscall on the process group this test created.
        unsafe {
            libc::killpg(self.child.id() as i32, libc::SIGKILL);
        }
        let _ = self.child.wait();
        // shims run in process groups of their own; their command lines name the socket
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = processes_mentioning(self.dir.path());
            if left.is_empty() || Instant::now() >= deadline {
                break;
            }
            for pid in left {
                // SAFETY: plain syscall.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        unmount_under(self.dir.path());
    }
}

/// Unmounts (lazily, deepest first) everything mounted under `dir`.
fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| {
            p.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                .replace("\\134", "\\")
        })
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let Ok(c) = std::ffi::CString::new(point) else {
            continue;
        };
        // SAFETY: a valid C string; failure (already gone) is fine.
        unsafe {
            libc::umount2(c.as_ptr(), libc::MNT_DETACH);
        }
    }
}

fn build(out: &Path) -> Vec<BuiltImage> {
    let ringd = ring_tests::ring::ringd_bin();
    images::build_all(out, &ImageInputs::standard(None, ringd)).unwrap_or_else(|e| {
        panic!("{e}\nThe images are built from real binaries: run scripts/setup first.")
    })
}

#[test]
fn images_build_deterministically_import_and_run() {
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("ring-images-out-")
        .tempdir()
        .expect("temp dir");
    let out = work.path().join("images");
    let built = build(&out);
    let names: Vec<&str> = built.iter().map(|b| b.name.as_str()).collect();
    let expected: Vec<&str> = images::ALL.iter().map(|i| i.name).collect();
    assert_eq!(names, expected);
    for (b, image) in built.iter().zip(images::ALL) {
        assert_eq!(b.reference, image.full());
        assert!(b.rebuilt && b.size > 0 && b.archive.is_file(), "{b:?}");
    }
    let build_time = started.elapsed();

    // the same inputs again: nothing written, the same digests
    let again = build(&out);
    for (a, b) in built.iter().zip(&again) {
        assert!(!b.rebuilt, "{} was rebuilt from identical inputs", b.name);
        assert_eq!(a.digest, b.digest, "{}", a.name);
    }
    assert_eq!(images::list(&out).unwrap(), again);

    let containerd = Containerd::start();
    let socket = containerd.socket();
    for b in &built {
        images::import(&containerd.ctr, &socket, &b.archive).unwrap_or_else(|e| panic!("{e}"));
    }
    let quiet = run_bounded(
        containerd.ctr().args(["images", "ls", "-q"]),
        Duration::from_secs(30),
    );
    let quiet = String::from_utf8_lossy(&quiet.stdout).into_owned();
    let listed = images::listed(&containerd.ctr, &socket).unwrap();
    for b in &built {
        assert!(
            quiet.lines().any(|l| l == b.reference),
            "{} not in `ctr images ls -q`:\n{quiet}",
            b.reference
        );
        assert_eq!(listed.get(&b.reference), Some(&b.digest), "{}", b.reference);
        assert!(
            images::present(&containerd.ctr, &socket, b).unwrap(),
            "{}",
            b.reference
        );
    }

    // the images run: binaries on PATH, shared libraries in place
    let full = |name: &str| images::reference(name).unwrap();
    let out = containerd.run(&full("ringd"), "ringd", &["ringd", "--version"]);
    assert!(
        out.contains(&format!("ringd {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    let out = containerd.run(&full("etcd"), "etcd", &["etcd", "--version"]);
    assert!(out.contains("etcd Version: 3.7.3"), "{out}");
    let out = containerd.run(&full("etcd"), "etcdctl", &["etcdctl", "version"]);
    assert!(out.contains("etcdctl version: 3.7.3"), "{out}");
    let out = containerd.run(&full("etcd"), "etcdutl", &["etcdutl", "version"]);
    assert!(out.contains("etcdutl version: 3.7.3"), "{out}");
    let out = containerd.run(&full("kube-proxy"), "iptables", &["iptables", "--version"]);
    assert!(out.contains("nf_tables"), "{out}");
    let out = containerd.run(
        &full("kube-apiserver"),
        "apiserver",
        &["kube-apiserver", "--version"],
    );
    assert!(out.contains("Kubernetes v1.37.2"), "{out}");
    let out = containerd.run(&full("pause"), "pause", &["pause", "-v"]);
    assert!(out.contains("pause (ring) 3.2"), "{out}");

    // the preload: a containerd root with the control plane's images, imported
    // once; a containerd started on a linked copy has them at their digests,
    // unpacked (they run), without importing anything
    let dir = work.path().join("images");
    let preload = images::preload::build(&dir, &binary("containerd"), &containerd.ctr)
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("every control-plane image is built");
    let again = images::preload::build(&dir, &binary("containerd"), &containerd.ctr).unwrap();
    assert_eq!(
        again.as_ref(),
        Some(&preload),
        "a second build makes no other preload"
    );
    let seeded = Containerd::start_preloaded(Some(&dir));
    let listed = images::listed(&seeded.ctr, &seeded.socket()).unwrap();
    for image in images::CONTROL_PLANE {
        let b = built.iter().find(|b| b.name == image.name).expect("built");
        assert_eq!(listed.get(&b.reference), Some(&b.digest), "{}", b.reference);
    }
    assert!(!listed.contains_key(&full("ringd")), "{listed:?}");
    let out = seeded.run(&full("etcd"), "preloaded", &["etcd", "--version"]);
    assert!(out.contains("etcd Version: 3.7.3"), "{out}");
    eprintln!(
        "built 7 images in {:.1}s; whole test {:.1}s",
        build_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
