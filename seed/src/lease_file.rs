//! The lease file of a local seed's control plane: ringd writes the fence time
//! (unix ms) at every renewal of the ring lease, and `ring-agent guard
//! --lease-file` runs the control plane's processes (etcd, kube-apiserver,
//! the controllers, a promoted standby's relays) only while that time lies
//! ahead, by its own clock. A ringd that is stopped (SIGSTOP), hangs or is cut off
//! renews nothing, so its control plane stops at the fence time without it,
//! as in a Kubernetes seed's pods.
//!
//! The file holds two or three numbers: the fence time, how long that was
//! from when ringd wrote it (ms, by ringd's clock) and, when ringd knows it,
//! the ring epoch the holder serves at. A guard whose clock is not ringd's (a
//! pod on a node reading the node's copy) counts that validity from its own
//! observation of the new file, never from ringd's wall clock; a backup
//! sidecar on the node takes the epoch from it, so it can start backing up
//! while the seed cluster's API does not answer.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::process::{Component, ComponentSpec};
use crate::ShootLayout;

/// Components that run under the guard: the ones that serve, and the
/// controllers, which only talk to kube-apiserver but hold ports of the
/// shoot's address: a host whose ringd stalls must free every one of them
/// at its fence time, or a replacement on the same machine could not start
/// before that ringd ran again.
pub const GUARDED: [Component; 4] = [
    Component::Etcd,
    Component::KubeApiserver,
    Component::KubeControllerManager,
    Component::KubeScheduler,
];

/// Where the fence time of `layout`'s shoot is kept.
pub fn path(layout: &ShootLayout) -> PathBuf {
    layout.dir.join(FILE_NAME)
}

/// The lease file's name in a shoot's directory.
pub const FILE_NAME: &str = "fence-at-ms";

/// What a lease file records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseFile {
    /// Unix ms after which nothing may serve (0: fenced now), by the writer's clock.
    pub fence_at_ms: u64,
    /// How long until then when it was written (ms); `None` in a file of an
    /// older Ring.
    pub valid_for_ms: Option<u64>,
    /// The ring epoch the holder serves at; `None` when the writer did not
    /// know it (a local seed's relay, an older Ring).
    pub epoch: Option<u64>,
}

/// Records `fence_at_ms` (0: stop now), the validity left until then and
/// `epoch`, replacing the file at once (a guard never reads half a record).
pub fn write(path: &Path, fence_at_ms: u64, epoch: Option<u64>) -> Result<()> {
    let valid_for = fence_at_ms.saturating_sub(crate::process::unix_now_ms());
    let text = match epoch {
        Some(epoch) => format!("{fence_at_ms} {valid_for} {epoch}"),
        None => format!("{fence_at_ms} {valid_for}"),
    };
    crate::pki::write_private(path, text.as_bytes())
}

/// Records `fence_at_ms` (and `epoch`) for `layout`'s shoot (creating its
/// dir): what every guard under the shoot's lease file then follows.
pub fn record(layout: &ShootLayout, fence_at_ms: u64, epoch: Option<u64>) -> Result<()> {
    crate::pki::create_private_dir(&layout.dir)?;
    write(&path(layout), fence_at_ms, epoch)
}

/// The record: fenced (0, no validity) when there is none yet; a file that
/// does not hold one is an error naming it.
pub fn read(path: &Path) -> std::result::Result<LeaseFile, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text).ok_or_else(|| {
            format!(
                "{} holds {:?}, not a fence time in unix milliseconds (and its validity and epoch)",
                path.display(),
                text.trim()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LeaseFile {
            fence_at_ms: 0,
            valid_for_ms: None,
            epoch: None,
        }),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

fn parse(text: &str) -> Option<LeaseFile> {
    let mut parts = text.split_whitespace();
    let fence_at_ms = parts.next()?.parse().ok()?;
    let mut optional = || match parts.next() {
        Some(v) => v.parse().ok().map(Some),
        None => Some(None),
    };
    let valid_for_ms = optional()?;
    let epoch = optional()?;
    let record = LeaseFile {
        fence_at_ms,
        valid_for_ms,
        epoch,
    };
    parts.next().is_none().then_some(record)
}

/// `spec` run by `ring-agent guard` at `agent` under the lease file `lease`
/// (one run: the guard exits with its program, so the supervisor restarts
/// and counts as before). With `etcd_data`, the guard first sets aside
/// etcd's data dir if its member never committed anything (a start cut
/// short before etcd wrote its first entry, after which etcd would wait
/// for a leader for ever).
pub fn guarded(
    agent: &Path,
    lease: &Path,
    spec: ComponentSpec,
    etcd_data: Option<&Path>,
) -> ComponentSpec {
    let mut args = vec![
        "guard".to_string(),
        "--lease-file".into(),
        lease.display().to_string(),
    ];
    if let Some(dir) = etcd_data {
        args.extend(["--etcd-data".into(), dir.display().to_string()]);
    }
    args.extend(["--".into(), spec.program.display().to_string()]);
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
        let fence_at = |p: &Path| read(p).map(|r| r.fence_at_ms);
        assert_eq!(fence_at(&p), Ok(0), "no file: no lease");
        let in_a_minute = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + 60_000;
        write(&p, in_a_minute, None).unwrap();
        assert_eq!(fence_at(&p), Ok(in_a_minute));
        let r = read(&p).unwrap();
        let valid = r.valid_for_ms.expect("the validity is recorded");
        assert!((59_000..=60_000).contains(&valid), "{r:?}");
        assert_eq!(r.epoch, None, "no epoch given");
        write(&p, in_a_minute, Some(7)).unwrap();
        assert_eq!(read(&p).unwrap().epoch, Some(7));
        assert_eq!(fence_at(&p), Ok(in_a_minute));
        write(&p, 0, Some(7)).unwrap();
        assert_eq!(read(&p).unwrap().valid_for_ms, Some(0), "fenced");
        // a file of an older Ring: the fence time alone
        std::fs::write(&p, "1795000000123").unwrap();
        let old = read(&p).unwrap();
        assert_eq!(
            (old.fence_at_ms, old.valid_for_ms),
            (1_795_000_000_123, None)
        );
        for garbage in ["soon", "1 2 3 4", "1 x", "1 2 x"] {
            std::fs::write(&p, garbage).unwrap();
            let err = read(&p).unwrap_err();
            assert!(
                err.contains("fence-at-ms") && err.contains(garbage),
                "{err}"
            );
        }
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
            Some(Path::new("/s/etcd")),
        );
        assert_eq!(g.program, PathBuf::from("/bin/ring-agent"));
        assert_eq!(
            g.args,
            [
                "guard",
                "--lease-file",
                "/s/fence-at-ms",
                "--etcd-data",
                "/s/etcd",
                "--",
                "/bin/etcd",
                "--name=m2"
            ]
        );
        assert_eq!(g.log, PathBuf::from("/s/etcd.log"));
    }
}
