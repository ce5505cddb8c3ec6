//! Supervising parts of a control plane: a fence while it starts (the start
//! may wait up to a minute for kube-apiserver) does not wait for the start,
//! which ends as stopped and leaves nothing running; etcd stopped and
//! started again alone (a re-formed etcd) leaves kube-apiserver running,
//! which reconnects and serves the same data.

use std::net::SocketAddr;
use std::sync::Arc;

use seed::SeedError;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_during_a_start_stops_it_without_waiting_for_the_start() {
    let sandbox = Sandbox::new();
    let seed = Arc::new(sandbox.seed());
    let shoot = "cp-fenced-start";
    let spec = ControlPlaneSpec::new(shoot);
    let start = tokio::spawn({
        let (seed, spec) = (seed.clone(), spec.clone());
        async move { seed.start(&spec).await }
    });
    // etcd answers: the start now waits for kube-apiserver's /readyz
    let etcd = SocketAddr::from((spec.endpoint.address, spec.endpoint.etcd_client_port));
    wait_ok(
        "etcd accepts connections",
        Duration::from_secs(60),
        || async move {
            tokio::net::TcpStream::connect(etcd)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
    seed.fence(shoot).await.expect("fence");
    let started = start.await.expect("start task");
    assert!(
        matches!(started, Err(SeedError::StoppedWhileStarting { .. })),
        "the fence waited for the start to end: {started:?}"
    );
    assert_eq!(seed.running_components(shoot).await, vec![]);
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left after the fence: {left:?}");

    seed.start(&spec).await.expect("start after the fence");
    wait_ready(&*seed, shoot, READY).await.expect("ready");
    seed.stop(shoot).await.expect("stop");
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left after stop: {left:?}");
}

fn apiserver_pid(status: &seed::ControlPlaneStatus) -> Option<u32> {
    status
        .components
        .iter()
        .find(|c| c.component == Component::KubeApiserver)
        .and_then(|c| c.state.pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_started_again_alone_keeps_kube_apiserver_and_the_data() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    let shoot = "cp-etcd-alone";
    let spec = ControlPlaneSpec::new(shoot);
    seed.start(&spec).await.expect("start");
    wait_ready(&seed, shoot, READY).await.expect("ready");
    let kubeconfig = seed.layout(shoot).admin_kubeconfig();
    create_config_map(&kubeconfig, "team-e", "kept", "yes").await;
    let before = apiserver_pid(&seed.inspect(shoot).await.unwrap());
    assert!(before.is_some(), "kube-apiserver runs");

    seed.stop_only(shoot, &[Component::Etcd])
        .await
        .expect("stop etcd");
    let rest = vec![
        Component::KubeApiserver,
        Component::KubeControllerManager,
        Component::KubeScheduler,
    ];
    assert_eq!(seed.running_components(shoot).await, rest);
    seed.start_missing(&spec, &Component::ALL)
        .await
        .expect("etcd again");
    wait_ready(&seed, shoot, READY).await.expect("ready again");
    assert_eq!(read_config_map(&kubeconfig, "team-e", "kept"), "yes");
    let after = apiserver_pid(&seed.inspect(shoot).await.unwrap());
    assert_eq!(after, before, "kube-apiserver was not restarted");
    assert_eq!(seed.running_components(shoot).await.len(), 4);

    seed.stop(shoot).await.expect("stop");
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left after stop: {left:?}");
}
