//! The cold start of a closed ring. With every control plane in pods on
//! another member's node, a ring that was stopped (`ringctl down`, or the
//! machine powered off) cannot come back by itself: each node waits for its
//! shoot's API, which runs in pods that a node of another shoot starts only
//! once that shoot's API serves. [`cold_start`] breaks the circle at one
//! member (bootkube's temporary control plane, in reverse): its ringd hosts
//! its successor as processes again, from the etcd data its pods left on the
//! node (nothing acknowledged is lost, no bucket is needed). Then the other
//! control planes come up node by node, and the plan moves that successor
//! back into pods.
//!
//! Resumable: the data goes to a staging seed dir first, then the staging dir
//! replaces the Kubernetes seed's (kept aside), then the ringd config changes.
//! Each part is skipped on a rerun once done.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ringd::config::RingdConfig;
use ringd::RingError;

use crate::config::RingConfig;
use crate::error::io;
use crate::process::stop_processes;
use crate::selfhost::{retire_seed, write_ringd_config};
use crate::{nodes, ring_status, start_member, BootstrapError, RingLayout};

/// How long the pods' files may stay in use.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Makes `member` host `shoot` (placed on it; its successor unless a
/// failover moved it) as processes again from the data its pods left in
/// `member`'s Kubernetes seed dir on the node; see the module doc.
pub async fn cold_start(
    layout: &RingLayout,
    config: &RingConfig,
    ringd: &Path,
    member: &str,
    shoot: &str,
) -> Result<(), BootstrapError> {
    let bins = seed::BinarySearch::standard(None)
        .control_plane()
        .map_err(RingError::from)?;
    let local = seed::LocalSeed::new(layout.seed_dir(member), bins.clone())
        .with_deprecated_apis(config.deprecated_apis);
    if !seed::local::holds_data(&local.layout(shoot).etcd_data()) {
        let stage_dir = layout.member_dir(member).join("seed-cold-start");
        let stage = seed::LocalSeed::new(stage_dir.clone(), bins)
            .with_deprecated_apis(config.deprecated_apis);
        if !seed::local::holds_data(&stage.layout(shoot).etcd_data()) {
            check_placement(layout, config, member, shoot).await?;
            stage_pods_data(layout, config, member, shoot, &stage).await?;
        }
        // ringd keeps running until here: stopped for longer than the
        // failure window, the ring would fail `shoot` over (from the bucket,
        // older than the data moved here)
        kill_ringd(layout, member).await;
        retire_seed(layout, member, "pods")?;
        let dir = layout.seed_dir(member);
        std::fs::rename(&stage_dir, &dir).map_err(io(format!(
            "moving {} to {}",
            stage_dir.display(),
            dir.display()
        )))?;
    }
    let path = layout.ringd_config(member);
    let mut rc = RingdConfig::load(&path)?;
    if let Some(seed) = rc.seed.as_mut().filter(|s| s.kubernetes.is_some()) {
        seed.kubernetes = None;
        seed.api_advertise = nodes::api_advertise(layout, config)?;
        kill_ringd(layout, member).await;
        write_ringd_config(&path, member, &rc)?;
    }
    if layout.running_pid(member).is_none() {
        start_member(layout, ringd, member)?;
    }
    Ok(())
}

/// Kills `member`'s ringd at once and waits until it is gone: it serves
/// nothing in a stopped ring, and a graceful stop would first try to fence
/// through its seed's API, which does not answer (the restart must follow
/// within the failure window).
async fn kill_ringd(layout: &RingLayout, member: &str) {
    let Some(pid) = layout.running_pid(member) else {
        return;
    };
    let gone = |m: &str| layout.running_pid(m).is_some();
    stop_processes(
        vec![(member.to_string(), pid)],
        gone,
        Duration::ZERO,
        "ringd",
    )
    .await;
}

/// The ring must still place `shoot` on `member`, with no move under way.
async fn check_placement(
    layout: &RingLayout,
    config: &RingConfig,
    member: &str,
    shoot: &str,
) -> Result<(), BootstrapError> {
    let status = ring_status(layout, config).await?;
    let host = status.placements.iter().find(|p| p.shoot == shoot);
    if host.is_none_or(|p| p.host != member) {
        return Err(BootstrapError::Unsupported(format!(
            "cold start: {shoot} is not placed on {member} ({:?}); its data on {member}'s node is not the newest",
            host.map(|p| &p.host)
        )));
    }
    if let Some(op) = status
        .operations
        .iter()
        .find(|op| !op.step.is_finished() && op.shoot() == shoot)
    {
        return Err(BootstrapError::Unsupported(format!(
            "cold start: operation {} of {shoot} has not ended",
            op.id
        )));
    }
    Ok(())
}

/// Moves `shoot`'s etcd data from `member`'s pods' dir into `stage` (a local
/// seed dir), with the shoot's identity from the bucket, once no process
/// holds the data any more.
async fn stage_pods_data(
    layout: &RingLayout,
    config: &RingConfig,
    member: &str,
    shoot: &str,
    stage: &seed::LocalSeed,
) -> Result<(), BootstrapError> {
    let shoot_dir = seed::ShootLayout {
        dir: layout.seed_dir(member).join("shoots").join(shoot),
    };
    let pods = seed::kubernetes::pods_dir(&shoot_dir);
    let data = pods.join(seed::kubernetes::render::NODE_ETCD).join("data");
    if !seed::local::holds_data(&data) {
        return Err(BootstrapError::Unsupported(format!(
            "cold start: {shoot}'s etcd data is not at {} on {member}'s node; \
             restore the ring from the bucket (`ringctl restore --from-bucket`)",
            data.display()
        )));
    }
    wait_released(&pods).await?;
    let target = stage.layout(shoot);
    seed::pki::create_private_dir(&target.dir).map_err(RingError::from)?;
    let bucket = ringd::backups::RingBucket::new(
        backup::BucketConfig::url(layout.bucket_url(config)),
        config.bucket_encryption.clone(),
        "bucketEncryption",
    )?;
    ringd::backups::download_identity(&bucket, &target, shoot).await?;
    let to = target.etcd_data();
    std::fs::rename(&data, &to).map_err(io(format!(
        "moving {} to {}",
        data.display(),
        to.display()
    )))
}

/// Waits until no process holds a file under `pods` (the pods' etcd runs in
/// another mount namespace: files are compared by device and inode, not by
/// path). Its lease is no sign: the member's ringd still renews it.
async fn wait_released(pods: &Path) -> Result<(), BootstrapError> {
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    loop {
        let holders = holders(pods);
        if holders.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BootstrapError::Unsupported(format!(
                "cold start: processes {holders:?} still hold files under {}; \
                 stop them (`ringctl down`) and run bootstrap again",
                pods.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Processes with a file under `dir` open (by device and inode).
pub fn holders(dir: &Path) -> Vec<u32> {
    let files = inodes(dir);
    if files.is_empty() {
        return Vec::new();
    }
    let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    pids.filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd"));
            fds.into_iter().flatten().flatten().any(|fd| {
                std::fs::metadata(fd.path()).is_ok_and(|m| files.contains(&(m.dev(), m.ino())))
            })
        })
        .collect()
}

/// (device, inode) of every file under `dir`.
fn inodes(dir: &Path) -> HashSet<(u64, u64)> {
    let mut out = HashSet::new();
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => {
                    out.insert((m.dev(), m.ino()));
                }
                Err(_) => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_open_in_a_process_holds_its_dir_until_closed() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("member/wal");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("0.wal"), b"x").unwrap();
        assert!(holders(dir.path()).is_empty(), "nothing open yet");
        let open = std::fs::File::open(sub.join("0.wal")).unwrap();
        assert_eq!(holders(dir.path()), [std::process::id()]);
        drop(open);
        assert!(holders(dir.path()).is_empty());
    }
}
