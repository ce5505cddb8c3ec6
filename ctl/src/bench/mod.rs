//! Benchmark drivers of `ringctl bench` that need real processes or a whole
//! ring: `controlplane`, `raft`, `bootstrap`, `migrate` and `failover` (`ringctl
//! bench backup` drives `backup::bench`). Each driver returns its figures; the
//! commands print them (`render`) or encode them (`-o json|yaml`).

pub mod bootstrap;
pub mod controlplane;
pub mod failover;
mod load;
pub mod migrate;
pub mod raft;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ::bootstrap::config::{Nodes, Ports, RingConfig};
use ::bootstrap::{BootstrapError, BootstrapOptions, BootstrapReport, KillRingOnDrop, RingLayout};

/// Median of a non-empty list (mean of the middle two for even lengths); 0 when empty.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The middle element (the upper one of the two middle ones for even lengths); 0 when empty.
pub fn upper_median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// The `p`th percentile (0..=100) of `xs`, the nearest sample by rank (0 for none).
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

/// A fresh directory for benchmark state under the system temp dir.
pub fn temp_state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("ring-bench-{}", std::process::id()))
}

/// Bootstrap progress nobody watches.
pub struct Quiet;

impl ::bootstrap::Progress for Quiet {
    fn step(&self, _: &str) {}
    fn finished(&self, _: &str, _: Duration) {}
}

/// A throwaway 3-member local ring without nodes, under `<dir>/ring`: killed
/// (kill -9) when dropped, so an interrupted benchmark leaves nothing running;
/// [`BenchRing::down`] is the orderly end.
pub struct BenchRing {
    pub config: RingConfig,
    pub layout: RingLayout,
    opts: BootstrapOptions,
    _kill: KillRingOnDrop,
}

impl BenchRing {
    pub fn new(dir: &Path, name: &str, ringd: &Path, base_port: u16) -> BenchRing {
        let config = RingConfig {
            name: name.into(),
            ports: Ports {
                address: "127.0.0.1".into(),
                base: base_port,
            },
            nodes: Nodes { per_member: 0 },
            ..RingConfig::default()
        };
        let layout = RingLayout {
            dir: dir.join("ring"),
        };
        let opts = BootstrapOptions {
            config: Some(config.clone()),
            dir: layout.dir.clone(),
            ringd: ringd.to_path_buf(),
            timeout: Duration::from_secs(300),
            generate_bucket_key: true,
        };
        BenchRing {
            _kill: KillRingOnDrop(layout.clone()),
            config,
            layout,
            opts,
        }
    }

    /// The shoots' etcd protected by `protection`.
    pub fn with_protection(mut self, protection: ringd::config::Protection) -> BenchRing {
        self.config.protection = protection;
        self.opts.config = Some(self.config.clone());
        self
    }

    /// The ring's timing (detection and leases).
    pub fn with_timing(mut self, timing: ringd::config::Timing) -> BenchRing {
        self.config.timing = Some(timing);
        self.opts.config = Some(self.config.clone());
        self
    }

    /// Member `i` hosts control planes on `seed` instead of a local seed.
    pub fn with_member_seed(mut self, i: usize, seed: ::bootstrap::config::SeedSpec) -> BenchRing {
        self.config.members[i].seed = seed;
        self.opts.config = Some(self.config.clone());
        self
    }

    /// A self-hosted ring: one node per member, every member hosting its
    /// successor as pods on its own node.
    pub fn self_hosted(mut self) -> BenchRing {
        self.config.nodes.per_member = 1;
        self.config.self_hosting.members =
            self.config.members.iter().map(|m| m.name.clone()).collect();
        self.opts.config = Some(self.config.clone());
        self
    }

    /// The kind of member `name`'s seed (`local`, `kubernetes`, or `pods` on
    /// its own node when the ring is self-hosted).
    pub fn seed_kind(&self, name: &str) -> &'static str {
        if self.config.self_hosting.members.iter().any(|m| m == name) {
            return "pods";
        }
        match self
            .config
            .members
            .iter()
            .find(|m| m.name == name)
            .map(|m| &m.seed)
        {
            Some(::bootstrap::config::SeedSpec::Kubernetes { .. }) => "kubernetes",
            _ => "local",
        }
    }

    /// Bootstraps the ring, or brings every member and control plane back up.
    pub async fn bootstrap(&self) -> Result<BootstrapReport, BootstrapError> {
        ::bootstrap::bootstrap(&self.opts, &Quiet).await
    }

    /// Stops every member (errors ignored: the drop guard kills what is left).
    pub async fn down(&self) {
        let _ = ::bootstrap::down(&self.layout.dir, Duration::from_secs(60)).await;
    }
}

/// A seed cluster (control plane and one node) under `<dir>/seed-cluster`
/// with room for a few etcd volumes, and the seed of a member hosting
/// control planes there (NodePort Services on the node's address).
pub async fn seed_cluster(
    dir: &Path,
    ringd: &Path,
) -> Result<
    (
        scenarios::seed_cluster::SeedCluster,
        ::bootstrap::config::SeedSpec,
    ),
    BootstrapError,
> {
    let volumes: Vec<String> = (1..=failover::VOLUMES)
        .map(|i| format!("bench-etcd-{i}"))
        .collect();
    scenarios::seed_cluster::SeedCluster::for_member(
        &dir.join("seed-cluster"),
        "benchseed",
        ringd,
        &volumes,
    )
    .await
    .map_err(|e| BootstrapError::Unsupported(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::{median, percentile, upper_median};

    #[test]
    fn percentile_takes_the_nearest_rank() {
        let xs = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&xs, 50.0), 3.0);
        assert_eq!(percentile(&xs, 95.0), 5.0);
        assert_eq!(percentile(&xs, 0.0), 1.0);
        assert_eq!(percentile(&[], 95.0), 0.0);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn upper_median_takes_the_upper_middle() {
        assert_eq!(upper_median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(upper_median(vec![4.0, 1.0, 2.0, 3.0]), 3.0);
        assert_eq!(upper_median(vec![]), 0.0);
    }
}
