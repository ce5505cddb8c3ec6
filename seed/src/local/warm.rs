//! A kube-apiserver kept warm next to a hot standby, so that a promotion
//! does not wait for kube-apiserver's cold start, which would be most of a
//! standby failover's outage.
//!
//! While the host serves, the warm kube-apiserver runs on the standby's seed
//! on a port of its own ([`crate::ShootEndpoint::standby_api_port`]),
//! reading the standby etcd's client port: it is a second kube-apiserver of
//! the same cluster, as in any highly available control plane, and nobody's
//! kubeconfig points at it. It stays out of the lease guard: with the host
//! gone it can neither read nor write (etcd has no quorum), and it is not
//! reachable at the shoot's address.
//!
//! At promotion only etcd stops; re-formed alone, it starts again at once,
//! while the old host's lease still runs out, on the standby's ports only
//! (the old host may hold the shoot's own until its guard fences it), so
//! the warm kube-apiserver finds it again where it was and is ready when the
//! lease ends. The shoot's addresses then reach them through two relays
//! under the lease guard (`ring-agent guard -- ring-agent forward`):
//! `ADDR:6443` (in every kubeconfig) to the warm kube-apiserver, which holds
//! new connections while the API is away, and etcd's client and peer ports
//! to the promoted etcd's (a relay of its own, which stops with etcd). etcd runs under the lease guard too, fenced at a
//! provisional time until the new epoch's lease renews it, so a lapsed lease
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
    /// etcd listens there.
    pub etcd_client_port: u16,
    /// The standby etcd's peer port on the shoot's address; the promoted
    /// etcd listens there (the shoot's peer port is relayed to it).
    pub etcd_peer_port: u16,
}

impl WarmApi {
    /// The warm kube-apiserver next to the standby on the seed of member `slot`.
    pub fn for_standby(endpoint: &ShootEndpoint, slot: u64) -> Self {
        let (etcd_client_port, etcd_peer_port) = endpoint.standby_ports(slot);
        WarmApi {
            api_port: endpoint.standby_api_port(slot),
            etcd_client_port,
            etcd_peer_port,
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

    fn etcd_peer_url(&self, endpoint: &ShootEndpoint) -> String {
        format!("https://{}:{}", endpoint.address, self.etcd_peer_port)
    }

    /// Where the promoted etcd takes client connections.
    pub fn etcd_addr(&self, endpoint: &ShootEndpoint) -> SocketAddr {
        SocketAddr::from((endpoint.address, self.etcd_client_port))
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

/// The relays from the shoot's addresses, under the lease guard of
/// `ring-agent` at `agent`: its API address to the warm kube-apiserver, and
/// (a second relay, which stops with etcd: a move's final snapshot reads
/// etcd after kube-apiserver stopped) its etcd client and peer ports to the
/// promoted etcd's.
pub(super) fn relays(
    agent: &std::path::Path,
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    warm: &WarmApi,
) -> [ComponentSpec; 2] {
    let e = &spec.endpoint;
    let at = |port| SocketAddr::from((e.address, port));
    let api = crate::forward::relay_spec(agent, layout, spec, &warm.api_addr(e).to_string());
    let pairs = [
        (at(e.etcd_client_port), warm.etcd_addr(e).to_string()),
        (at(e.etcd_peer_port), at(warm.etcd_peer_port).to_string()),
    ];
    let etcd = crate::forward::relays_spec(agent, layout, Component::EtcdForwarder, &pairs);
    [api, etcd]
}

/// A promoted standby's components (pure): `specs` (the usual four, not yet
/// guarded) with etcd listening on the standby's ports instead of the
/// shoot's (it starts while the old host may still hold those), followed by
/// the relay of the shoot's etcd ports, and in place of the usual
/// kube-apiserver the relay of the shoot's API address (it comes first:
/// kube-apiserver's start waits for `/readyz` at the shoot's address) and
/// the warm kube-apiserver.
pub(super) fn promoted(
    specs: Vec<ComponentSpec>,
    [api_relay, etcd_relay]: [ComponentSpec; 2],
    warm_api: ComponentSpec,
    spec: &ControlPlaneSpec,
    warm: &WarmApi,
) -> Vec<ComponentSpec> {
    let e = &spec.endpoint;
    let clients = format!("--listen-client-urls={}", warm.etcd_url(e));
    let peers = format!("--listen-peer-urls={}", warm.etcd_peer_url(e));
    let mut out = Vec::with_capacity(specs.len() + 2);
    for mut cs in specs {
        match cs.component {
            Component::Etcd => {
                for a in cs.args.iter_mut() {
                    if a.starts_with("--listen-client-urls=") {
                        a.clone_from(&clients);
                    } else if a.starts_with("--listen-peer-urls=") {
                        a.clone_from(&peers);
                    }
                }
                out.extend([cs, etcd_relay.clone()]);
            }
            Component::KubeApiserver => out.extend([api_relay.clone(), warm_api.clone()]),
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

    /// Starts a promoted standby's etcd at once (re-formed alone, still
    /// before the old host's lease ends) on the standby's ports, where its
    /// warm kube-apiserver finds it: the API is ready when the lease ends
    /// and the start only adds the relays and the controllers. Guarded by the
    /// shoot's lease file, set here to the provisional fence time
    /// `fence_at_ms` (wall clock) that only the new epoch's lease extends.
    /// False (nothing started, the lease file untouched) when no warm
    /// kube-apiserver runs here: the start after the lease starts a control
    /// plane as usual.
    pub async fn start_promoted_etcd(
        &self,
        spec: &ControlPlaneSpec,
        fence_at_ms: u64,
    ) -> Result<bool> {
        if self.promoted_warm(&spec.shoot).await.is_none() {
            return Ok(false);
        }
        crate::lease_file::record(&self.layout(&spec.shoot), fence_at_ms, None)?;
        self.start_missing_of(spec, &[Component::Etcd]).await?;
        Ok(true)
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

    /// Promoted: etcd serves on the standby's ports only (the warm
    /// kube-apiserver reads there; the old host may hold the shoot's),
    /// kube-apiserver is the warm one, two relays under the lease guard lead
    /// the shoot's API address and its etcd client and peer ports to them,
    /// and the warm kube-apiserver itself runs outside the guard.
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
                Component::EtcdForwarder,
                Component::ApiForwarder,
                Component::KubeApiserver,
                Component::KubeControllerManager,
                Component::KubeScheduler
            ]
        );
        let by = |c| specs.iter().find(|s| s.component == c).unwrap();
        let standby_client = format!("https://{}:{}", e.address, warm.etcd_client_port);
        let etcd = by(Component::Etcd);
        assert_eq!(
            arg(etcd, "--listen-client-urls="),
            Some(standby_client.as_str())
        );
        let standby_peer = format!("https://{}:{}", e.address, e.standby_ports(7).1);
        assert_eq!(
            arg(etcd, "--listen-peer-urls="),
            Some(standby_peer.as_str())
        );
        assert_eq!(
            arg(etcd, "--advertise-client-urls="),
            Some(e.etcd_url().as_str())
        );
        let api = by(Component::KubeApiserver);
        assert_eq!(api.program, std::path::Path::new("/bin/kas"), "not guarded");
        let port = warm.api_port.to_string();
        assert_eq!(arg(api, "--secure-port="), Some(port.as_str()));
        assert_eq!(arg(api, "--etcd-servers="), Some(standby_client.as_str()));
        assert_eq!(arg(api, "--endpoint-reconciler-type="), Some("none"));
        let values = |c: Component, flag: &str| -> Vec<String> {
            let relay = by(c);
            assert_eq!(relay.args[0], "guard", "{:?}", relay.args);
            let w = relay.args.windows(2).filter(|w| w[0] == flag);
            w.map(|w| w[1].clone()).collect()
        };
        let at = |port: u16| format!("{}:{port}", e.address);
        let (client, peer) = e.standby_ports(7);
        let api = Component::ApiForwarder;
        assert_eq!(values(api, "--listen"), [at(e.api_port)]);
        assert_eq!(values(api, "--to"), [at(warm.api_port)]);
        let etcd = Component::EtcdForwarder;
        let shoot_etcd = [at(e.etcd_client_port), at(e.etcd_peer_port)];
        assert_eq!(values(etcd, "--listen"), shoot_etcd);
        assert_eq!(values(etcd, "--to"), [at(client), at(peer)]);
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
