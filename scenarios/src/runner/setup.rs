//! What a drill run sets up around its ring and takes down after it: the
//! bucket (a folder or an S3 server) and the teardown guard.

use super::*;

/// Kills whatever the run started and removes its temp dir when dropped.
pub(super) struct Teardown {
    pub(super) dir: PathBuf,
    pub(super) layout: RingLayout,
    pub(super) keep: bool,
    /// The node network, once made before the ring (see [`start_bucket`]).
    pub(super) node_network: Option<seed::node::net::NodeNetwork>,
}

/// The drill's S3 server, stopped and started by faults.
pub(super) type SharedS3 = Arc<Mutex<S3Server>>;

/// The drill's bucket: a folder, or (`ring.bucket: s3`) a fresh S3 server
/// that ringd and ringctl, children of this process, reach through the
/// environment. On the self-hosted ring the pods back up to it from their
/// nodes, so it listens on the node network's gateway, made now for that.
pub(super) fn start_bucket(
    drill: &Drill,
    dir: &std::path::Path,
    layout: &RingLayout,
    config: &RingConfig,
    teardown: &mut Teardown,
) -> Result<(backup::BucketConfig, Option<SharedS3>), ScenarioError> {
    if drill.ring.bucket != BucketKind::S3 {
        let url = config.bucket.clone().unwrap_or_default();
        return Ok((backup::BucketConfig::url(url), None));
    }
    let mut host = std::net::Ipv4Addr::LOCALHOST;
    if drill.ring.hosting == Hosting::SelfHosted {
        if let Some(net) = bootstrap::nodes::plan_network(layout, config)? {
            teardown.node_network = Some(net.clone());
            net.ensure()
                .map_err(|e| ScenarioError::Setup(format!("making the node network: {e}")))?;
            host = net.gateway();
        }
    }
    let server = S3Server::start(&dir.join("s3"), host)?;
    server.create_bucket(crate::s3::BUCKET)?;
    for (k, v) in server.env() {
        std::env::set_var(k, v);
    }
    Ok((server.bucket_config(), Some(Arc::new(Mutex::new(server)))))
}

impl Drop for Teardown {
    fn drop(&mut self) {
        // the ring's nodes first: their pods name no path of the run
        bootstrap::nodes::kill_now(&self.layout);
        procs::kill_all_mentioning(&self.dir, Duration::from_secs(15));
        if let Some(net) = &self.node_network {
            let _ = net.remove();
        }
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Tells each member's relay of its own shoot ([`Network::forward_own`])
/// whether that shoot runs on another member, from the ring's status every
/// 500 ms until `stop` (nothing changes while no status answers).
pub(super) async fn follow_placements(
    layout: RingLayout,
    config: RingConfig,
    placed: BTreeMap<String, tokio::sync::watch::Sender<bool>>,
    stop: CancellationToken,
) {
    loop {
        if let Ok(s) = bootstrap::ring_status(&layout, &config).await {
            for (member, tx) in &placed {
                let elsewhere = s
                    .placements
                    .iter()
                    .any(|p| p.shoot == *member && p.host != *member);
                tx.send_if_modified(|v| std::mem::replace(v, elsewhere) != elsewhere);
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
