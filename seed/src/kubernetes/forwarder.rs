//! A shoot's stable endpoint on a Kubernetes seed: the same address its
//! control plane has on a local seed (`ShootEndpoint`, e.g. `127.x.y.z:6443`),
//! relayed to the kube-apiserver Service (node port or load balancer) by
//! `ring-agent forward`, which runs under `ring-agent guard` and the shoot's
//! lease file. The relay listens exactly while this member holds the shoot's
//! lease: the guard stops it at the fence time by its own clock, so a
//! stopped or killed ringd never keeps the address from the next holder. The
//! original kubeconfig (server: the stable address) works wherever the
//! control plane moves.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::KubernetesSeed;
use crate::error::{Result, SeedError};
use crate::forward::relay_spec;
use crate::local::ShootLayout;
use crate::process::{supervise, Component, ComponentState, SupervisorTuning};
use crate::ControlPlaneSpec;

/// How long stopping a relay may take (SIGTERM to the guard, then SIGKILL).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The relays of the shoots this seed serves, one supervised
/// `ring-agent guard -- ring-agent forward` per shoot.
pub(super) struct Forwarders {
    agent: PathBuf,
    running: Mutex<BTreeMap<String, Relay>>,
    /// What each shoot's relay last ran with, kept when a fence stops it: a
    /// renewed lease resumes it without the seed cluster's API.
    last: Mutex<BTreeMap<String, (ShootLayout, ControlPlaneSpec, String)>>,
}

struct Relay {
    target: String,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    states: watch::Receiver<crate::process::States>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Forwarders {
    pub(super) fn new(agent: PathBuf) -> Self {
        Forwarders {
            agent,
            running: Mutex::new(BTreeMap::new()),
            last: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs the relay of `spec`'s shoot to `target`, unless it already runs
    /// to that target (level-triggered: called at every health check).
    pub(super) async fn ensure(
        &self,
        layout: &ShootLayout,
        spec: &ControlPlaneSpec,
        target: &str,
    ) -> Result<()> {
        let shoot = &spec.shoot;
        let last = (layout.clone(), spec.clone(), target.to_string());
        lock(&self.last).insert(shoot.clone(), last);
        if lock(&self.running)
            .get(shoot)
            .is_some_and(|r| r.target == target && !r.task.is_finished())
        {
            return Ok(());
        }
        self.stop(shoot).await;
        let log_dir = layout.dir.join("logs");
        std::fs::create_dir_all(&log_dir).map_err(SeedError::io(&log_dir))?;
        let (tx, rx) = watch::channel(Default::default());
        let cancel = CancellationToken::new();
        let tuning = SupervisorTuning {
            stop_grace: STOP_GRACE,
            ..Default::default()
        };
        let run = supervise(
            relay_spec(&self.agent, layout, spec, target),
            cancel.clone(),
            tx,
            tuning,
        );
        let span = tracing::info_span!("api-forwarder", shoot = %shoot);
        let task = tokio::spawn(tracing::Instrument::instrument(run, span));
        tracing::info!(%shoot, listen = %spec.endpoint.api_url(), %target, "stable endpoint relayed under the lease guard");
        lock(&self.running).insert(
            shoot.clone(),
            Relay {
                target: target.to_string(),
                cancel,
                task,
                states: rx,
            },
        );
        Ok(())
    }

    /// Runs `shoot`'s relay again as it last ran, unless it runs or never
    /// ran here; whether it started it. A fence stops the relay, and only a
    /// health check, which reads the shoot's objects in the seed cluster,
    /// started it again: with that cluster's API away (its own control plane
    /// lost with another member) the shoot's pods served again under a
    /// renewed lease while its endpoint stayed closed.
    pub(super) async fn resume(&self, shoot: &str) -> Result<bool> {
        let Some((layout, spec, target)) = lock(&self.last).get(shoot).cloned() else {
            return Ok(false);
        };
        if lock(&self.running)
            .get(shoot)
            .is_some_and(|r| !r.task.is_finished())
        {
            return Ok(false);
        }
        self.ensure(&layout, &spec, &target).await.map(|()| true)
    }

    /// Forgets `shoot`'s relay (its control plane left this seed).
    pub(super) fn forget(&self, shoot: &str) {
        lock(&self.last).remove(shoot);
    }

    /// Stops `shoot`'s relay and waits until its processes are gone.
    pub(super) async fn stop(&self, shoot: &str) {
        let Some(relay) = lock(&self.running).remove(shoot) else {
            return;
        };
        relay.cancel.cancel();
        let _ = tokio::time::timeout(STOP_GRACE * 2, relay.task).await;
    }

    /// The relay's process state, if it is supervised.
    pub(super) fn state(&self, shoot: &str) -> Option<ComponentState> {
        let running = lock(&self.running);
        let relay = running.get(shoot)?;
        let state = relay.states.borrow().get(&Component::ApiForwarder).cloned();
        Some(state.unwrap_or_default())
    }
}

/// `host:port` of an `https://host:port` URL.
pub(super) fn authority(url: &str) -> &str {
    url.trim_start_matches("https://").trim_end_matches('/')
}

impl KubernetesSeed {
    /// The relay of `shoot`'s stable endpoint (its spec in `anchor`) to
    /// `direct_url` (where this seed reaches the Service), and `/readyz` through it with the admin
    /// kubeconfig users keep; `None` without a relay.
    pub(super) async fn stable_health(
        &self,
        shoot: &str,
        anchor: &k8s_openapi::api::core::v1::ConfigMap,
        direct_url: &str,
        pki: &crate::pki::Pki,
    ) -> Result<Option<crate::Health>> {
        let Some(forwarders) = &self.forwarders else {
            return Ok(None);
        };
        let spec = self.spec_in(shoot, anchor)?;
        let layout = self.shoot_layout(shoot);
        forwarders
            .ensure(&layout, &spec, authority(direct_url))
            .await?;
        let path = layout.admin_kubeconfig();
        if let Some(dir) = path.parent() {
            crate::pki::create_private_dir(dir)?;
        }
        let url = spec.endpoint.api_url();
        crate::kubeconfig::write(
            &path,
            shoot,
            "admin",
            &url,
            pki,
            &pki.leaf(crate::pki::Leaf::Admin),
        )?;
        let health = crate::kubeconfig::readyz(shoot, &path).await?;
        let relay = forwarders.state(shoot).unwrap_or_default();
        let detail = match (&health.ready, relay.pid, &relay.last_exit) {
            (true, _, _) => format!("stable endpoint {url} relayed"),
            (false, None, Some(exit)) => format!(
                "stable endpoint {url} not relayed (the relay's guard: {exit}; see {})",
                layout.log(Component::ApiForwarder).display()
            ),
            (false, _, _) => format!("stable endpoint {url}: {}", health.detail),
        };
        Ok(Some(crate::Health {
            ready: health.ready,
            detail,
            ..Default::default()
        }))
    }

    /// Stops `shoot`'s relay, if any.
    pub(super) async fn stop_relay(&self, shoot: &str) {
        if let Some(f) = &self.forwarders {
            f.stop(shoot).await;
        }
    }

    /// Runs `shoot`'s relay again as it last ran if a fence stopped it: for a
    /// lease that ringd renewed again (the relay runs under its lease guard).
    pub async fn resume_relay(&self, shoot: &str) -> Result<()> {
        if let Some(f) = &self.forwarders {
            if f.resume(shoot).await? {
                tracing::info!(%shoot, "the stable endpoint's relay resumed under the renewed lease");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A fence stops the relay; a renewed lease resumes it as it last ran,
    /// without anything read from the seed cluster; a relay that runs, or
    /// whose control plane left, is not started.
    #[tokio::test]
    async fn a_relay_stopped_by_a_fence_resumes_as_it_last_ran() {
        let dir = tempfile::tempdir().unwrap();
        let f = Forwarders::new(PathBuf::from("/bin/true"));
        let layout = ShootLayout {
            dir: dir.path().join("alpha"),
        };
        let spec = ControlPlaneSpec::new("alpha");
        assert!(!f.resume("alpha").await.unwrap(), "never ran here");
        f.ensure(&layout, &spec, "10.0.0.7:31443").await.unwrap();
        assert!(!f.resume("alpha").await.unwrap(), "it runs");
        f.stop("alpha").await;
        assert!(lock(&f.running).get("alpha").is_none());
        assert!(f.resume("alpha").await.unwrap());
        assert_eq!(
            lock(&f.running).get("alpha").map(|r| r.target.clone()),
            Some("10.0.0.7:31443".to_string())
        );
        f.stop("alpha").await;
        f.forget("alpha");
        assert!(!f.resume("alpha").await.unwrap(), "its control plane left");
    }

    #[test]
    fn the_relay_runs_under_the_guard_from_the_stable_address_to_the_service() {
        let layout = ShootLayout {
            dir: PathBuf::from("/state/shoots/alpha"),
        };
        let spec = ControlPlaneSpec::new("alpha");
        let cs = relay_spec(
            Path::new("/bin/ring-agent"),
            &layout,
            &spec,
            "10.0.0.7:31443",
        );
        assert_eq!(cs.program, Path::new("/bin/ring-agent"));
        let listen = format!("{}:6443", spec.endpoint.address);
        let want = [
            "guard",
            "--lease-file",
            "/state/shoots/alpha/fence-at-ms",
            "--",
            "/bin/ring-agent",
            "forward",
            "--listen",
            &listen,
            "--to",
            "10.0.0.7:31443",
        ];
        assert_eq!(cs.args, want);
        assert_eq!(cs.component, Component::ApiForwarder);
        assert_eq!(authority("https://10.0.0.7:31443"), "10.0.0.7:31443");
        assert_eq!(
            authority("https://lb.example.com:6443/"),
            "lb.example.com:6443"
        );
    }
}
