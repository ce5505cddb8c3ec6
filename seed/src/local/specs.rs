//! The command lines of a local seed's control plane components: pure
//! builders, and the seed's choice between the usual four and a promoted
//! standby's (around its warm kube-apiserver).

use std::path::PathBuf;

use super::{warm, LocalSeed, ShootLayout, WarmApi};
use crate::binaries::Binaries;
use crate::pki::{Leaf, SERVICE_CIDR};
use crate::process::{Component, ComponentSpec};
use crate::ControlPlaneSpec;

fn p(path: PathBuf) -> String {
    path.display().to_string()
}

/// etcd's TLS flags (clients and peers need certificates of the shoot's CA)
/// and logging.
pub(super) fn etcd_tls_args(layout: &ShootLayout) -> Vec<String> {
    let pki = layout.pki();
    let (ca, server, peer) = (
        pki.ca(),
        pki.leaf(Leaf::EtcdServer),
        pki.leaf(Leaf::EtcdPeer),
    );
    vec![
        format!("--cert-file={}", p(server.cert)),
        format!("--key-file={}", p(server.key)),
        "--client-cert-auth=true".into(),
        format!("--trusted-ca-file={}", p(ca.cert.clone())),
        format!("--peer-cert-file={}", p(peer.cert)),
        format!("--peer-key-file={}", p(peer.key)),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-trusted-ca-file={}", p(ca.cert)),
        "--logger=zap".into(),
        "--log-outputs=stderr".into(),
    ]
}

/// The command lines of a shoot's components (pure; unit-tested).
pub(super) fn component_specs(
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    bins: &Binaries,
    advertise: std::net::Ipv4Addr,
) -> Vec<ComponentSpec> {
    let e = &spec.endpoint;
    let addr = e.address.to_string();
    let pki = layout.pki();
    let ca = pki.ca();
    let etcd: Vec<String> = [
        format!("--name={}", spec.shoot),
        format!("--data-dir={}", p(layout.etcd_data())),
        format!("--listen-client-urls={}", e.etcd_url()),
        format!("--advertise-client-urls={}", e.etcd_url()),
        format!("--listen-peer-urls={}", e.etcd_peer_url()),
        format!("--initial-advertise-peer-urls={}", e.etcd_peer_url()),
        format!("--initial-cluster={}={}", spec.shoot, e.etcd_peer_url()),
        format!("--initial-cluster-token=ring-{}", spec.shoot),
        "--initial-cluster-state=new".into(),
    ]
    .into_iter()
    .chain(etcd_tls_args(layout))
    .collect::<Vec<_>>();
    let apiserver = apiserver_args(layout, spec, advertise, e.api_port, &e.etcd_url());
    let common = |c: Component, port: u16| {
        let kc = p(layout.component_kubeconfig(c));
        crate::process::manager_args(&kc, &addr, port, &p(layout.run_dir(c)))
    };
    let mut cm = common(Component::KubeControllerManager, e.controller_manager_port);
    cm.extend([
        format!(
            "--service-account-private-key-file={}",
            p(pki.service_account_key())
        ),
        format!("--root-ca-file={}", p(ca.cert.clone())),
        format!("--cluster-signing-cert-file={}", p(ca.cert.clone())),
        format!("--cluster-signing-key-file={}", p(ca.key.clone())),
        "--use-service-account-credentials=true".into(),
    ]);
    let scheduler = common(Component::KubeScheduler, e.scheduler_port);
    [
        (Component::Etcd, &bins.etcd, etcd),
        (Component::KubeApiserver, &bins.kube_apiserver, apiserver),
        (
            Component::KubeControllerManager,
            &bins.kube_controller_manager,
            cm,
        ),
        (Component::KubeScheduler, &bins.kube_scheduler, scheduler),
    ]
    .into_iter()
    .map(|(component, program, args)| ComponentSpec {
        component,
        program: program.clone(),
        args,
        log: layout.log(component),
        netns: None,
    })
    .collect()
}

/// kube-apiserver's flags: serving on the shoot's address at `port`,
/// reading etcd at `etcd_servers`.
pub(super) fn apiserver_args(
    layout: &ShootLayout,
    spec: &ControlPlaneSpec,
    advertise: std::net::Ipv4Addr,
    port: u16,
    etcd_servers: &str,
) -> Vec<String> {
    let addr = spec.endpoint.address;
    let pki = layout.pki();
    let ca = pki.ca();
    let (etcd_cli, api) = (pki.leaf(Leaf::EtcdClient), pki.leaf(Leaf::ApiServer));
    let kubelet_cli = pki.leaf(Leaf::KubeletClient);
    let mut args = vec![
        format!("--advertise-address={advertise}"),
        format!("--bind-address={addr}"),
        format!("--secure-port={port}"),
        format!("--etcd-servers={etcd_servers}"),
        format!("--etcd-cafile={}", p(ca.cert.clone())),
        format!("--etcd-certfile={}", p(etcd_cli.cert)),
        format!("--etcd-keyfile={}", p(etcd_cli.key)),
        format!("--client-ca-file={}", p(ca.cert.clone())),
        format!("--tls-cert-file={}", p(api.cert)),
        format!("--tls-private-key-file={}", p(api.key)),
        // Nodes register with certificates of group system:nodes; the Node
        // authorizer and NodeRestriction keep each one to its own objects.
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        format!("--kubelet-client-certificate={}", p(kubelet_cli.cert)),
        format!("--kubelet-client-key={}", p(kubelet_cli.key)),
        // node names are member names, not resolvable host names
        "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP".into(),
        format!(
            "--service-account-key-file={}",
            p(pki.service_account_pub())
        ),
        format!(
            "--service-account-signing-key-file={}",
            p(pki.service_account_key())
        ),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--allow-privileged=true".into(),
        "--profiling=false".into(),
        format!("--cert-dir={}", p(layout.run_dir(Component::KubeApiserver))),
        "--v=1".into(),
    ];
    // kube-apiserver refuses to publish a loopback address as the endpoint
    // of the `kubernetes` Service; a shoot without nodes advertises its
    // loopback API address, and nothing in it needs that Service
    if advertise.is_loopback() {
        args.push("--endpoint-reconciler-type=none".into());
    }
    args
}

impl LocalSeed {
    /// The command lines of the four components.
    pub fn component_specs(&self, spec: &ControlPlaneSpec) -> Vec<ComponentSpec> {
        self.specs_for(spec, None)
    }

    /// The address the shoot's kube-apiserver advertises.
    pub(super) fn advertise_of(&self, spec: &ControlPlaneSpec) -> std::net::Ipv4Addr {
        self.advertise
            .get(&spec.shoot)
            .copied()
            .unwrap_or(spec.endpoint.address)
    }

    /// The specs, kube-apiserver's with the flags of the API versions it serves.
    fn served_apis(&self, specs: Vec<ComponentSpec>) -> Vec<ComponentSpec> {
        specs.into_iter().map(|cs| self.with_apis(cs)).collect()
    }

    /// `cs`, with the flags of the API versions it serves if it is kube-apiserver.
    pub(super) fn with_apis(&self, mut cs: ComponentSpec) -> ComponentSpec {
        if cs.component == Component::KubeApiserver {
            cs.args.extend(self.apis.apiserver_args());
        }
        cs
    }

    /// The command lines of the shoot's components, in start order: the
    /// usual four, or with `warm` a promoted standby's (see [`WarmApi`]).
    /// Under the lease guard, every component runs guarded (a warm
    /// kube-apiserver does not: its relay does).
    pub(super) fn specs_for(
        &self,
        spec: &ControlPlaneSpec,
        warm: Option<WarmApi>,
    ) -> Vec<ComponentSpec> {
        let advertise = self.advertise_of(spec);
        let layout = self.layout(&spec.shoot);
        let mut specs = component_specs(&layout, spec, &self.bins, advertise);
        let Some(agent) = &self.guard else {
            return self.served_apis(specs);
        };
        if let Some(w) = &warm {
            let relay = warm::relays(agent, &layout, spec, w);
            let api = warm::warm_apiserver(&layout, spec, advertise, &self.bins, w);
            specs = warm::promoted(specs, relay, api, spec, w);
        }
        let specs = self.served_apis(specs);
        let lease = crate::lease_file::path(&layout);
        let data = layout.etcd_data();
        specs
            .into_iter()
            .map(|cs| {
                let c = cs.component;
                let etcd_data = (c == Component::Etcd).then_some(data.as_path());
                // a warm kube-apiserver is not guarded: its relay (guarded
                // already) is
                let guard = crate::lease_file::GUARDED.contains(&c)
                    && !(warm.is_some() && c == Component::KubeApiserver);
                match guard {
                    true => crate::lease_file::guarded(agent, &lease, cs, etcd_data),
                    false => cs,
                }
            })
            .collect()
    }
}
