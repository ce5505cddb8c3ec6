//! The lease file of a local seed's control plane: ringd writes the fence time
//! (unix ms) at every renewal of the ring lease, and `ring-agent guard
//! --lease-file` runs etcd and kube-apiserver only while that time lies ahead,
//! by its own clock. A ringd that is stopped (SIGSTOP), hangs or is cut off
//! renews nothing, so its control plane stops at the fence time without it,
//! as in a Kubernetes seed's pods.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::process::{Component, ComponentSpec};
use crate::ShootLayout;

/// Components that run under the guard: the ones that serve (the others only
/// talk to kube-apiserver).
pub const GUARDED: [Component; 2] = [Component::Etcd, Component::KubeApiserver];

/// Where the fence time of `layout`'s shoot is kept.
pub fn path(layout: &ShootLayout) -> PathBuf {
    layout.dir.join(FILE_NAME)
}

/// The lease file's name in a shoot's directory.
pub const FILE_NAME: &str = "fence-at-ms";

/// Records `fence_at_ms` (0: stop now), replacing the file at once (a guard
/// never reads half a number).
pub fn write(path: &Path, fence_at_ms: u64) -> Result<()> {
    crate::pki::write_private(path, fence_at_ms.to_string().as_bytes())
}

/// Records `fence_at_ms` for `layout`'s shoot (creating its dir): what every
/// guard under the shoot's lease file then follows.
pub fn record(layout: &ShootLayout, fence_at_ms: u64) -> Result<()> {
    crate::pki::create_private_dir(&layout.dir)?;
    write(&path(layout), fence_at_ms)
}

/// The recorded fence time: 0 when there is none yet; a file that does not
/// hold a number is an error naming it.
pub fn read(path: &Path) -> std::result::Result<u64, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().map_err(|_| {
            format!(
                "{} holds {:?}, not a fence time in unix milliseconds",
                path.display(),
                text.trim()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// `spec` run by `ring-agent guard` at `agent` under the lease file `lease`
/// (one run: the guard exits with its program, so the supervisor restarts
/// and counts as before).
pub fn guarded(agent: &Path, lease: &Path, spec: ComponentSpec) -> ComponentSpec {
    let mut args = vec![
        "guard".to_string(),
        "--lease-file".into(),
        lease.display().to_string(),
        "--".into(),
        spec.program.display().to_string(),
    ];
    args.extend(spec.args);
    ComponentSpec {
        program: agent.to_path_buf(),
        args,
        ..spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_time_round_trips_and_garbage_is_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fence-at-ms");
        assert_eq!(read(&p), Ok(0), "no file: no lease");
        write(&p, 1_795_000_000_123).unwrap();
        assert_eq!(read(&p), Ok(1_795_000_000_123));
        std::fs::write(&p, "soon").unwrap();
        let err = read(&p).unwrap_err();
        assert!(err.contains("fence-at-ms") && err.contains("soon"), "{err}");
    }

    #[test]
    fn a_guarded_component_runs_its_program_after_the_separator() {
        let spec = ComponentSpec {
            component: Component::Etcd,
            program: "/bin/etcd".into(),
            args: vec!["--name=m2".into()],
            log: "/s/etcd.log".into(),
            netns: None,
        };
        let g = guarded(
            Path::new("/bin/ring-agent"),
            Path::new("/s/fence-at-ms"),
            spec,
        );
        assert_eq!(g.program, PathBuf::from("/bin/ring-agent"));
        assert_eq!(
            g.args,
            [
                "guard",
                "--lease-file",
                "/s/fence-at-ms",
                "--",
                "/bin/etcd",
                "--name=m2"
            ]
        );
        assert_eq!(g.log, PathBuf::from("/s/etcd.log"));
    }
}
