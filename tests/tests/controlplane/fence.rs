//! A fence while a control plane starts (the start may wait up to a minute
//! for kube-apiserver): the fence does not wait for the start, the start
//! ends as stopped and leaves nothing running, and the shoot starts again.

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
