//! Stopping a local ring: [`down`] stops its nodes and members in order and
//! keeps its data; [`KillRingOnDrop`] kills them at once when dropped.

use std::path::Path;
use std::time::Duration;

use crate::error::BootstrapError;
use crate::layout::RingLayout;
use crate::nodes;
use crate::process::{stop_processes, StopOutcome, Stopped};

/// Kills every member of a throwaway local ring when dropped (kill -9 of each
/// ringd; the control planes it runs follow through their parent-death signal):
/// a benchmark interrupted mid-way (its future dropped) leaves nothing running.
/// The orderly path is still [`down`].
pub struct KillRingOnDrop(pub RingLayout);

impl Drop for KillRingOnDrop {
    fn drop(&mut self) {
        nodes::kill_now(&self.0);
        let Ok(entries) = std::fs::read_dir(self.0.dir.join("members")) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = self.0.running_pid(&name) {
                // SAFETY: plain syscall on a pid we checked is this ring's ringd.
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
            }
        }
    }
}

/// What `down` stopped: the nodes first, then the members' ringds.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DownReport {
    pub nodes: Vec<Stopped>,
    pub members: Vec<Stopped>,
}

impl DownReport {
    /// The processes still running after SIGKILL.
    pub fn left_running(&self) -> Vec<&Stopped> {
        self.nodes
            .iter()
            .chain(&self.members)
            .filter(|s| s.outcome == StopOutcome::StillRunning)
            .collect()
    }
}

/// Stops every node, then every member (SIGTERM, then SIGKILL after `grace`),
/// and waits until they are gone; data stays in place.
pub async fn down(dir: &Path, grace: Duration) -> Result<DownReport, BootstrapError> {
    let layout = RingLayout {
        dir: dir.to_path_buf(),
    };
    let Some(config) = layout.read_config()? else {
        return Err(BootstrapError::Unsupported(format!(
            "{} holds no ring (no ring.yaml); nothing to stop",
            dir.display()
        )));
    };
    // nodes first: their teardown (pods, shims, cgroups, network) needs no ringd
    let nodes = nodes::stop_all(&layout, &config, grace.max(Duration::from_secs(60))).await?;
    let running: Vec<(String, u32)> = config
        .members
        .iter()
        .filter_map(|m| layout.running_pid(&m.name).map(|p| (m.name.clone(), p)))
        .collect();
    let members =
        stop_processes(running, |m| layout.running_pid(m).is_some(), grace, "ringd").await;
    for m in members
        .iter()
        .filter(|m| m.outcome != StopOutcome::StillRunning)
    {
        let _ = std::fs::remove_file(layout.pid_file(&m.name));
    }
    Ok(DownReport { nodes, members })
}
