//! A hot standby of a hosted control plane's etcd on a second local seed:
//! joined while the host serves, the host killed, the standby promoted and
//! the control plane started there from its data; the shoot's kubeconfig
//! then shows every object, the last one written just before the kill.

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
    let (host, standby_seed) = (host_box.seed(), standby_box.seed());
    let shoot = "cp-standby";
    let spec = ControlPlaneSpec::new(shoot);
    host.start(&spec).await.expect("start on the host");
    wait_ready(&host, shoot, READY).await.expect("ready");
    let kubeconfig = host.layout(shoot).admin_kubeconfig();
    create_config_map(&kubeconfig, "before", "marker", "1").await;

    // the standby joins as a learner on its own ports of the shoot's address
    copy_identity(&host.layout(shoot).dir, &standby_seed.layout(shoot).dir);
    let (client_port, peer_port) = spec.endpoint.standby_ports(2);
    let peer_url = format!("https://{}:{peer_port}", spec.endpoint.address);
    let etcd = backup::EtcdConfig::for_local_shoot(&host.layout(shoot), &spec);
    let joined = standby::add_learner(&etcd, "standby-2", &peer_url)
        .await
        .expect("adding the standby");
    standby_seed
        .start_standby(
            &spec,
            "standby-2",
            (client_port, peer_port),
            &joined.initial_cluster,
        )
        .await
        .expect("starting the standby");
    let taken = standby_seed.start_standby(&spec, "standby-2", (client_port, peer_port), "x");
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
    create_config_map(&kubeconfig, "after-join", "marker", "2").await;

    // the host dies; the standby is promoted and serves the shoot
    host.fence(shoot)
        .await
        .expect("killing the host's control plane");
    standby_seed
        .stop(shoot)
        .await
        .expect("stopping the standby");
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
    standby_seed
        .start(&spec)
        .await
        .expect("start on the standby's seed");
    wait_ready(&standby_seed, shoot, READY)
        .await
        .expect("ready after promotion");
    assert_eq!(read_config_map(&kubeconfig, "before", "marker"), "1");
    assert_eq!(read_config_map(&kubeconfig, "after-join", "marker"), "2");
    standby_seed.stop(shoot).await.expect("stop");
    let left = standby_box.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left: {left:?}");
}
