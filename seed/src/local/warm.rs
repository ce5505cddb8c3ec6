//! A kube-apiserver kept warm next to a hot standby, so that a promotion
//! does not wait for kube-apiserver's cold start (3-9 s on this machine, most
//! of a standby failover's outage).
//!
//! While the host serves, the warm kube-apiserver runs on the standby's seed
//! on a port of its own ([`crate::ShootEndpoint::standby_api_port`]),
//! reading the standby etcd's client port: it is a second kube-apiserver of
//! the same cluster, as in any highly available control plane, and nobody's
//! kubeconfig points at it. It stays out of the lease guard: with the host
//! gone it can neither read nor write (etcd has no quorum), and it is not
//! reachable at the shoot's address.
//!
//! At promotion only etcd stops; re-formed alone, it listens on the shoot's
//! client port and on the standby's, so the warm kube-apiserver finds it
//! again where it was. The shoot's address (`ADDR:6443`, in every kubeconfig)
//! reaches the warm kube-apiserver through a relay under the lease guard
//! (`ring-agent guard -- ring-agent forward`), which holds new connections
//! while the API is away; etcd is guarded as always, so a lapsed lease
//! stops the control plane whatever ringd does.

use std::net::SocketAddr;

use super::specs::apiserver_args;
use super::{check_port, LocalSeed, ShootLayout};
use crate::error::{Result, SeedError};
use crate::process::{Component, ComponentSpec};
use crate::{ControlPlaneSpec, ShootEndpoint};

/// Where a warm kube-apiserver listens and which etcd port it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmApi {
    /// kube-apiserver's secure port on the shoot's address.
    pub api_port: u16,
    /// The standby etcd's client port on the shoot's address; the promoted
    /// etcd listens there too.
    pub etcd_client_port: u16,
}

impl WarmApi {
    /// The warm kube-apiserver next to the standby on the seed of member `slot`.
    pub fn for_standby(endpoint: &ShootEndpoint, slot: u64) -> Self {
        WarmApi {
            api_port: endpoint.standby_api_port(slot),
            etcd_client_port: endpoint.standby_ports(slot).0,
        }
    }

    fn api_addr(&self, endpoint: &ShootEndpoint) -> SocketAddr {
        SocketAddr::from((endpoint.address, self.api_port))
    }

    /// The warm kube-apiserver's base URL (for its `/readyz`).
    pub fn api_url(&self, endpoint: &ShootEndpoint) -> String {
        format!("https://{}", self.api_addr(endpoint))
    }

    fn etcd_url(&self, endpoint: &ShootEndpoint) -> String {
        format!("https://{}:{}", endpoint.address, self.etcd_client_port)
    }
}

/// The warm kube-apiserver's command line (not guarded).
pub(super) fn warm_apiserver(
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    advertise: std::net::Ipv4Addr,
    bins: &crate::Binaries,
    warm: &WarmApi,
) -> ComponentSpec {
    let e = &spec.endpoint;
    let mut args = apiserver_args(layout, spec, advertise, warm.api_port, &warm.etcd_url(e));
    // the `kubernetes` Service keeps the serving kube-apiserver's endpoint
    // (ADDR:6443, which reaches this one through the relay once promoted)
    // instead of this one's port
    args.push("--endpoint-reconciler-type=none".into());
    ComponentSpec {
        component: Component::KubeApiserver,
        program: bins.kube_apiserver.clone(),
        args,
        log: layout.log(Component::KubeApiserver),
        netns: None,
    }
}

/// The relay from the shoot's address to the warm kube-apiserver, under
/// the lease guard of `ring-agent` at `agent`.
pub(super) fn relay(
    agent: &std::path::Path,
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    warm: &WarmApi,
) -> ComponentSpec {
    let to = warm.api_addr(&spec.endpoint).to_string();
    crate::forward::relay_spec(agent, layout, spec, &to)
}

/// A promoted standby's components (pure): `specs` (the usual four, not yet
/// guarded) with etcd listening on the standby's client port too, and in
/// place of the usual kube-apiserver the `relay` (it comes first:
/// kube-apiserver's start waits for `/readyz` at the shoot's address) and
/// the warm kube-apiserver.
pub(super) fn promoted(
    specs: Vec<ComponentSpec>,
    relay: ComponentSpec,
    warm_api: ComponentSpec,
    spec: &ControlPlaneSpec,
    warm: &WarmApi,
) -> Vec<ComponentSpec> {
    let e = &spec.endpoint;
    let listen = format!("--listen-client-urls={},{}", e.etcd_url(), warm.etcd_url(e));
    let mut out = Vec::with_capacity(specs.len() + 1);
    for mut cs in specs {
        match cs.component {
            Component::Etcd => {
                for a in cs.args.iter_mut() {
                    if a.starts_with("--listen-client-urls=") {
                        a.clone_from(&listen);
                    }
                }
                out.push(cs);
            }
            Component::KubeApiserver => out.extend([relay.clone(), warm_api.clone()]),
            _ => out.push(cs),
        }
    }
    out
}

impl LocalSeed {
    /// Starts the warm kube-apiserver next to the shoot's hot standby, which
    /// must run here (and vote: a learner serves no client). Idempotent.
    /// Needs the lease guard's `ring-agent` (its relay serves the shoot's
    /// address once the standby is promoted).
    pub async fn start_warm_api(&self, spec: &ControlPlaneSpec, warm: WarmApi) -> Result<()> {
        if self.guard.is_none() {
            return Err(SeedError::InvalidSpec {
                field: "warm kube-apiserver".into(),
                reason: "this seed runs no lease guard (ring-agent), which the relay to a promoted standby's kube-apiserver needs".into(),
            });
        }
        let shoot = &spec.shoot;
        let generation = {
            let mut running = self.running.lock().await;
            let r = running
                .get_mut(shoot)
                .filter(|r| r.runs_standby())
                .ok_or_else(|| SeedError::InvalidSpec {
                    field: "warm kube-apiserver".into(),
                    reason: format!("no hot standby of {shoot} runs here"),
                })?;
            if r.has(Component::KubeApiserver) {
                return Ok(());
            }
            r.generation
        };
        check_port(
            shoot,
            "kube-apiserver (warm)",
            warm.api_addr(&spec.endpoint),
        )?;
        let layout = self.layout(shoot);
        let cs = self.with_apis(warm_apiserver(
            &layout,
            spec,
            self.advertise_of(spec),
            &self.bins,
            &warm,
        ));
        self.spawn_component(shoot, generation, cs).await?;
        // only a running one shapes the promoted control plane
        if let Some(r) = self.running.lock().await.get_mut(shoot) {
            if r.generation == generation {
                r.warm = Some(warm);
            }
        }
        Ok(())
    }

    /// Stops the warm kube-apiserver next to `shoot`'s hot standby (one that
    /// never answered ready): a promotion then starts a kube-apiserver as
    /// usual. The standby's etcd keeps running.
    pub async fn stop_warm_api(&self, shoot: &str) -> Result<()> {
        if !self.runs_standby(shoot).await {
            return Ok(());
        }
        self.stop_only(shoot, &[Component::KubeApiserver]).await?;
        if let Some(r) = self.running.lock().await.get_mut(shoot) {
            r.warm = None;
        }
        Ok(())
    }

    /// The standby of `shoot` is being promoted: from now on its supervision
    /// is the control plane's, and a start completes it around the warm
    /// kube-apiserver (if one runs) instead of refusing.
    pub async fn end_standby(&self, shoot: &str) {
        if let Some(r) = self.running.lock().await.get_mut(shoot) {
            r.standby = false;
        }
    }

    /// Whether a hot standby of `shoot` (its etcd, maybe a warm
    /// kube-apiserver) runs here.
    pub async fn runs_standby(&self, shoot: &str) -> bool {
        let running = self.running.lock().await;
        running.get(shoot).is_some_and(|r| r.runs_standby())
    }

    /// The `/readyz` of the warm kube-apiserver `warm` of `spec`'s shoot.
    pub async fn warm_api_health(
        &self,
        spec: &ControlPlaneSpec,
        warm: WarmApi,
    ) -> Result<crate::Health> {
        let layout = self.layout(&spec.shoot);
        let url = warm.api_url(&spec.endpoint);
        crate::kubeconfig::readyz_at(&spec.shoot, &layout.admin_kubeconfig(), Some(&url)).await
    }

    /// The warm kube-apiserver of a promoted standby that still runs here,
    /// if any: the control plane is completed around it.
    pub(super) async fn promoted_warm(&self, shoot: &str) -> Option<WarmApi> {
        let running = self.running.lock().await;
        running
            .get(shoot)
            .filter(|r| !r.standby)
            .and_then(|r| r.warm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bins() -> crate::Binaries {
        crate::Binaries {
            etcd: "/bin/etcd".into(),
            kube_apiserver: "/bin/kas".into(),
            kube_controller_manager: "/bin/kcm".into(),
            kube_scheduler: "/bin/ks".into(),
        }
    }

    fn arg<'a>(cs: &'a ComponentSpec, flag: &str) -> Option<&'a str> {
        cs.args.iter().find_map(|a| a.strip_prefix(flag))
    }

    /// Promoted: etcd serves the shoot's client port and the standby's (the
    /// warm kube-apiserver reads there), kube-apiserver is the warm one, the
    /// relay from the shoot's address leads to it under the lease guard, and
    /// the warm kube-apiserver itself runs outside the guard.
    #[test]
    fn a_promoted_standby_serves_through_its_warm_apiserver() {
        let dir = tempfile::tempdir().unwrap();
        let seed = LocalSeed::new(dir.path(), bins()).with_guard("/bin/ring-agent".into());
        let spec = ControlPlaneSpec::new("alpha");
        let e = spec.endpoint;
        let warm = WarmApi::for_standby(&e, 7);
        assert_eq!(warm.etcd_client_port, e.standby_ports(7).0);
        assert_ne!(warm.api_port, e.api_port);
        let specs = seed.specs_for(&spec, Some(warm));
        let order: Vec<_> = specs.iter().map(|s| s.component).collect();
        assert_eq!(
            order,
            [
                Component::Etcd,
                Component::ApiForwarder,
                Component::KubeApiserver,
                Component::KubeControllerManager,
                Component::KubeScheduler
            ]
        );
        let by = |c| specs.iter().find(|s| s.component == c).unwrap();
        let standby_client = format!("https://{}:{}", e.address, warm.etcd_client_port);
        let listen = arg(by(Component::Etcd), "--listen-client-urls=").unwrap();
        assert_eq!(listen, format!("{},{standby_client}", e.etcd_url()));
        let api = by(Component::KubeApiserver);
        assert_eq!(api.program, std::path::Path::new("/bin/kas"), "not guarded");
        let port = warm.api_port.to_string();
        assert_eq!(arg(api, "--secure-port="), Some(port.as_str()));
        assert_eq!(arg(api, "--etcd-servers="), Some(standby_client.as_str()));
        assert_eq!(arg(api, "--endpoint-reconciler-type="), Some("none"));
        let relay = by(Component::ApiForwarder);
        assert_eq!(relay.args[0], "guard", "{:?}", relay.args);
        let to = relay.args.windows(2).find(|w| w[0] == "--to").unwrap();
        assert_eq!(to[1], format!("{}:{}", e.address, warm.api_port));
        let listen = relay.args.windows(2).find(|w| w[0] == "--listen").unwrap();
        assert_eq!(listen[1], format!("{}:{}", e.address, e.api_port));
        assert_eq!(by(Component::Etcd).args[0], "guard", "etcd is guarded");
        // without a warm kube-apiserver, the usual four
        let plain = seed.specs_for(&spec, None);
        assert_eq!(plain.len(), 4);
        assert_eq!(
            arg(&plain[0], "--listen-client-urls="),
            Some(e.etcd_url().as_str())
        );
    }
}
