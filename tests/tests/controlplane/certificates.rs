//! Certificates renewed while the control plane serves: etcd and
//! kube-apiserver take their new files by themselves (the same processes
//! go on), kube-controller-manager restarts with its new kubeconfig, and
//! the API answers throughout.

use std::net::SocketAddr;

use seed::pki::Leaf;
use tokio::time::Instant;

use super::*;

fn pid_of(status: &seed::ControlPlaneStatus, c: Component) -> Option<u32> {
    let s = status.components.iter().find(|s| s.component == c)?;
    s.running.then_some(s.state.pid).flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_certificates_are_renewed_while_the_control_plane_serves() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    let shoot = "cp-renew";
    let spec = ControlPlaneSpec::new(shoot);
    seed.start(&spec).await.expect("start");
    wait_ready(&seed, shoot, READY).await.expect("ready");
    let layout = seed.layout(shoot);
    let pki = layout.pki();
    assert_eq!(
        seed.renew_certificates(shoot).await.expect("renew"),
        vec![],
        "nothing is due in a new PKI"
    );

    // 29 days left (renewed 30 days ahead), as after two years of serving
    // every component runs (kube-controller-manager and kube-scheduler
    // start once the API answers, after `wait_ready`)
    let before = wait_for("every component running", READY, || async {
        let status = seed.inspect(shoot).await.ok()?;
        (status.phase == Phase::Ready).then_some(status)
    })
    .await;
    for leaf in [Leaf::EtcdServer, Leaf::ApiServer, Leaf::ControllerManager] {
        certs::age_leaf(&pki, leaf, &spec.endpoint, 29);
    }
    let etcd = SocketAddr::from((spec.endpoint.address, spec.endpoint.etcd_client_port));
    let api = SocketAddr::from((spec.endpoint.address, spec.endpoint.api_port));
    let presented = |addr| async move { presented_certificate_or_panic(addr).await };
    let renewed = seed.renew_certificates(shoot).await.expect("renew");
    assert_eq!(
        renewed,
        vec![Leaf::EtcdServer, Leaf::ApiServer, Leaf::ControllerManager]
    );
    let after = seed.inspect(shoot).await.unwrap();
    for c in [Component::Etcd, Component::KubeApiserver] {
        assert_eq!(pid_of(&after, c), pid_of(&before, c), "{c:?} kept running");
    }
    let kcm = Component::KubeControllerManager;
    let old_kcm = pid_of(&before, kcm).expect("kube-controller-manager ran");
    wait_for(
        "kube-controller-manager to run again, restarted",
        Duration::from_secs(30),
        || async {
            let now = seed.inspect(shoot).await.ok()?;
            pid_of(&now, kcm).filter(|p| *p != old_kcm)
        },
    )
    .await;

    // etcd reads its files at every handshake
    let etcd_cert = certs::file_certificate(&pki.leaf(Leaf::EtcdServer).cert);
    assert_eq!(
        presented(etcd).await,
        etcd_cert,
        "etcd presents the renewed certificate"
    );
    // kube-apiserver looks at its files every minute; it answers all along
    let api_cert = certs::file_certificate(&pki.leaf(Leaf::ApiServer).cert);
    let started = Instant::now();
    wait_for(
        "kube-apiserver to present its renewed certificate",
        Duration::from_secs(150),
        || {
            let want = api_cert.clone();
            let kubeconfig = layout.admin_kubeconfig();
            async move {
                kubectl(&kubeconfig, &["get", "namespaces"]);
                (presented_certificate_or_panic(api).await == want).then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "kube-apiserver took its new certificate {:?} after the renewal",
        started.elapsed()
    );
    let last = seed.inspect(shoot).await.unwrap();
    assert_eq!(
        pid_of(&last, Component::KubeApiserver),
        pid_of(&before, Component::KubeApiserver),
        "the same kube-apiserver"
    );
    assert_eq!(seed.renew_certificates(shoot).await.expect("renew"), vec![]);
    seed.stop(shoot).await.unwrap();
}

async fn presented_certificate_or_panic(addr: SocketAddr) -> Vec<u8> {
    certs::presented_certificate(addr)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
