//! A hot standby of a hosted control plane's etcd on a second local seed:
//! joined while the host serves, with a warm kube-apiserver next to it; the
//! standby promoted while the host still holds the shoot's address (its
//! etcd serves the warm kube-apiserver again at once, on the standby's
//! ports), the host killed and the control plane completed there around the
//! warm kube-apiserver (the same etcd and kube-apiserver processes serve the
//! shoot's address through the relay); the shoot's kubeconfig then shows
//! every object, the last one written just before the kill.

use std::path::Path;

use backup::standby;

use super::*;

/// Copies the shoot's identity (spec and PKI) between seeds, as the ring
/// fetches it from the bucket.
fn copy_identity(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("pki")).unwrap();
    std::fs::copy(from.join("shoot.json"), to.join("shoot.json")).unwrap();
    for f in std::fs::read_dir(from.join("pki")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), to.join("pki").join(f.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_on_another_seed_takes_over_with_every_object() {
    let (host_box, standby_box) = (Sandbox::new(), Sandbox::new());
    let host = host_box.seed();
    // the relay to a promoted standby's warm kube-apiserver runs under the lease guard
    let standby_seed = standby_box.seed().with_guard(ring_agent_bin());
    let shoot = "cp-standby";
    let spec = ControlPlaneSpec::new(shoot);
    host.start(&spec).await.expect("start on the host");
    wait_ready(&host, shoot, READY).await.expect("ready");
    let kubeconfig = host.layout(shoot).admin_kubeconfig();
    create_config_map(&kubeconfig, "before", "marker", "1").await;

    let warm = join_with_a_warm_apiserver(&host, &standby_seed, &spec).await;
    create_config_map(&kubeconfig, "after-join", "marker", "2").await;
    let warm_pid = component_pid(&standby_seed, shoot, Component::KubeApiserver).await;
    let client_port = spec.endpoint.standby_ports(2).0;
    renew_the_standby_s_etcd_certificate(&standby_seed, &spec, client_port).await;
    let etcd_pid = promote_while_the_host_serves(&standby_seed, &spec, warm).await;

    // the host dies; the promoted standby serves the shoot
    host.fence(shoot)
        .await
        .expect("killing the host's control plane");
    standby_seed
        .start(&spec)
        .await
        .expect("start on the standby's seed");
    wait_ready(&standby_seed, shoot, READY)
        .await
        .expect("ready after promotion");
    assert_eq!(read_config_map(&kubeconfig, "before", "marker"), "1");
    assert_eq!(read_config_map(&kubeconfig, "after-join", "marker"), "2");
    create_config_map(&kubeconfig, "after-promotion", "marker", "3").await;
    assert_eq!(
        component_pid(&standby_seed, shoot, Component::KubeApiserver).await,
        warm_pid,
        "the warm kube-apiserver serves the shoot: it was not started again"
    );
    assert_eq!(
        component_pid(&standby_seed, shoot, Component::Etcd).await,
        etcd_pid,
        "the etcd started before the lease ended serves: it was not started again"
    );
    let running = standby_seed.running_components(shoot).await;
    assert!(running.contains(&Component::ApiForwarder), "{running:?}");
    etcd_stays_relayed(&standby_seed, &spec).await;
    standby_seed.stop(shoot).await.expect("stop");
    let left = standby_box.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left: {left:?}");
}

/// The standby joins `host`'s etcd as a learner on its own ports of the
/// shoot's address (member 2's), votes, and a warm kube-apiserver answers
/// ready next to it.
async fn join_with_a_warm_apiserver(
    host: &seed::LocalSeed,
    standby_seed: &seed::LocalSeed,
    spec: &ControlPlaneSpec,
) -> seed::local::WarmApi {
    let shoot = spec.shoot.as_str();
    copy_identity(&host.layout(shoot).dir, &standby_seed.layout(shoot).dir);
    let (client_port, peer_port) = spec.endpoint.standby_ports(2);
    let peer_url = format!("https://{}:{peer_port}", spec.endpoint.address);
    let etcd = backup::EtcdConfig::for_local_shoot(&host.layout(shoot), spec);
    let joined = standby::add_learner(&etcd, "standby-2", &peer_url)
        .await
        .expect("adding the standby");
    let ports = (client_port, peer_port);
    standby_seed
        .start_standby(spec, "standby-2", ports, &joined.initial_cluster)
        .await
        .expect("starting the standby");
    let taken = standby_seed.start_standby(spec, "standby-2", ports, "x");
    assert!(
        taken.await.is_err(),
        "a second standby of the shoot is refused"
    );
    wait_ok("the standby votes", Duration::from_secs(60), || {
        let etcd = etcd.clone();
        async move {
            match standby::promote_learner(&etcd, joined.id).await {
                Ok(true) => Ok(()),
                Ok(false) => Err("still a learner".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    let warm = seed::local::WarmApi::for_standby(&spec.endpoint, 2);
    standby_seed
        .start_warm_api(spec, warm)
        .await
        .expect("starting the warm kube-apiserver");
    let why = "the warm kube-apiserver is ready";
    wait_warm_ready(why, standby_seed, spec, warm).await;
    warm
}

/// The standby is promoted while the host's lease runs out (its processes
/// still hold the shoot's address, without a quorum): the promoted etcd
/// starts at once on the standby's ports and the warm kube-apiserver reads
/// it, while a start (the relays at the shoot's address) is refused. The
/// promoted etcd's pid.
async fn promote_while_the_host_serves(
    standby_seed: &seed::LocalSeed,
    spec: &ControlPlaneSpec,
    warm: seed::local::WarmApi,
) -> u32 {
    let shoot = spec.shoot.as_str();
    standby_seed
        .stop_only(shoot, &[Component::Etcd])
        .await
        .expect("stopping the standby's etcd");
    standby_seed.end_standby(shoot).await;
    let layout = standby_seed.layout(shoot);
    let promoted = standby::promote(
        &ring_tests::etcd::etcd_bin(),
        &layout.etcd_data(),
        "standby-2",
        &spec.endpoint.etcd_peer_url(),
        &layout.dir.join("promote.log"),
    )
    .await
    .expect("promotion");
    assert!(promoted.revision > 0, "{promoted:?}");
    // the guards let etcd, the relays and the controllers serve until then
    let fence_at = ring_tests::now_ms() + 600_000;
    let early = standby_seed.start_promoted_etcd(spec, fence_at).await;
    assert_eq!(early.ok(), Some(true), "the promoted etcd starts at once");
    let why = "the warm kube-apiserver reads the promoted etcd";
    wait_warm_ready(why, standby_seed, spec, warm).await;
    let taken = standby_seed.start(spec).await;
    assert!(
        matches!(taken, Err(seed::SeedError::PortInUse { .. })),
        "the shoot's address is not taken while the host holds it: {taken:?}"
    );
    component_pid(standby_seed, shoot, Component::Etcd).await
}

/// etcd of a promoted control plane started again (as when the host
/// re-forms it alone after losing a new standby) comes back with the relay
/// of the shoot's etcd ports, and the shoot's etcd address leads to it also
/// once the writers stopped (as for a move's final snapshot).
async fn etcd_stays_relayed(standby_seed: &seed::LocalSeed, spec: &ControlPlaneSpec) {
    let shoot = spec.shoot.as_str();
    standby_seed
        .stop_only(shoot, &[Component::Etcd])
        .await
        .expect("stopping etcd");
    let running = standby_seed.running_components(shoot).await;
    assert!(!running.contains(&Component::EtcdForwarder), "{running:?}");
    standby_seed
        .start_missing(spec, &Component::ALL)
        .await
        .expect("starting etcd again");
    let running = standby_seed.running_components(shoot).await;
    assert!(running.contains(&Component::EtcdForwarder), "{running:?}");
    standby_seed
        .stop_only(shoot, &[Component::KubeApiserver])
        .await
        .expect("stopping the writers");
    let layout = standby_seed.layout(shoot);
    let at_shoot_address = backup::EtcdConfig::for_local_shoot(&layout, spec);
    assert!(
        standby::has_quorum(&at_shoot_address, Duration::from_secs(10)).await,
        "etcd answers at {:?} after kube-apiserver stopped",
        at_shoot_address.endpoints
    );
}

/// Waits (for `why`, at most [`READY`]) until the warm kube-apiserver `warm`
/// answers ready: it reads an etcd that serves.
async fn wait_warm_ready(
    why: &str,
    seed: &seed::LocalSeed,
    spec: &ControlPlaneSpec,
    warm: seed::local::WarmApi,
) {
    wait_ok(why, READY, || async move {
        match seed.warm_api_health(spec, warm).await {
            Ok(h) if h.ready => Ok(()),
            Ok(h) => Err(h.detail),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// A standby's etcd server certificate about to expire (29 days left) is
/// reissued by its seed's renewal, and the same etcd process presents the
/// new one on its standby port; a second look renews nothing.
async fn renew_the_standby_s_etcd_certificate(
    standby_seed: &seed::LocalSeed,
    spec: &ControlPlaneSpec,
    client_port: u16,
) {
    let shoot = spec.shoot.as_str();
    let pki = standby_seed.layout(shoot).pki();
    let etcd_pid = component_pid(standby_seed, shoot, Component::Etcd).await;
    certs::age_leaf(&pki, seed::pki::Leaf::EtcdServer, &spec.endpoint, 29);
    let renewed = standby_seed
        .renew_certificates(shoot)
        .await
        .expect("renewing the standby's certificates");
    assert_eq!(renewed, vec![seed::pki::Leaf::EtcdServer]);
    let cert = pki.leaf(seed::pki::Leaf::EtcdServer).cert;
    assert!(certs::days_left(&cert) > 700, "{}", cert.display());
    let want = certs::file_certificate(&cert);
    let addr = std::net::SocketAddr::from((spec.endpoint.address, client_port));
    let presented = certs::presented_certificate(addr).await;
    assert_eq!(
        presented.as_ref(),
        Ok(&want),
        "the standby's etcd presents the renewed certificate"
    );
    assert_eq!(
        component_pid(standby_seed, shoot, Component::Etcd).await,
        etcd_pid
    );
    let again = standby_seed.renew_certificates(shoot).await.expect("renew");
    assert_eq!(again, vec![], "nothing is due after the renewal");
}

/// The pid of `component` of `shoot` as the seed's status file records it.
async fn component_pid(seed: &seed::LocalSeed, shoot: &str, component: Component) -> u32 {
    let status = seed.inspect(shoot).await.expect("inspect");
    status
        .components
        .iter()
        .find(|c| c.component == component)
        .and_then(|c| c.state.pid)
        .unwrap_or_else(|| panic!("no pid of {component} in {status:?}"))
}
