//! A ring with a Kubernetes seed: member m1 hosts its successor's control plane
//! as pods on a real node (etcd and kube-apiserver under ring-agent's lease
//! guard, etcd backed up by its sidecar), m2 and m3 host theirs as local
//! processes; every member shares one sealed file bucket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ring_tests::procs::pod_control_plane;
use ring_tests::ring::RingFixture;
use ring_tests::*;
use scenarios::seed_cluster::SeedCluster;
use seed::kubernetes::ServiceType;

use super::{config, host_path_volume, seed_cluster_with_node, READY};

const FAILOVER: Duration = Duration::from_secs(240);

/// Adds the shared bucket (sealed with `key`) to member config `path`; for
/// `kubernetes`, the member hosts control planes in that seed cluster.
fn configure(
    path: &Path,
    bucket: &Path,
    key: &Path,
    kubernetes: Option<(&Path, &seed::KubernetesSeedConfig)>,
) {
    let mut yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    yaml["backup"] = serde_yaml::from_str(&format!(
        "{{bucket: {{url: 'file://{}'}}, encryption: {{keyFile: '{}'}}}}",
        bucket.display(),
        key.display()
    ))
    .unwrap();
    if let Some((state, kc)) = kubernetes {
        let mut seed = serde_yaml::Mapping::new();
        seed.insert("stateDir".into(), state.display().to_string().into());
        seed.insert("kubernetes".into(), serde_yaml::to_value(kc).unwrap());
        seed.insert("releaseGraceSecs".into(), 1.into());
        yaml["seed"] = serde_yaml::Value::Mapping(seed);
    }
    std::fs::write(path, serde_yaml::to_string(&yaml).unwrap()).unwrap();
}

/// Creates `n` ConfigMaps through `kubeconfig`; returns the last resourceVersion.
fn write_configmaps(kubeconfig: &Path, prefix: &str, n: usize) -> u64 {
    let mut last = 0;
    for i in 0..n {
        let out = kubectl(
            kubeconfig,
            &[
                "create",
                "configmap",
                &format!("{prefix}-{i}"),
                "-o",
                "jsonpath={.metadata.resourceVersion}",
            ],
        );
        last = out.trim().parse().unwrap();
    }
    last
}

async fn wait_durable(ring: &RingFixture, i: usize, shoot: &str, revision: u64) {
    ring.wait_status(
        i,
        &format!("a durable backup of {shoot} at revision {revision}"),
        Duration::from_secs(90),
        |s| {
            s.placements
                .iter()
                .any(|p| p.shoot == shoot && p.last_backup_revision.is_some_and(|r| r >= revision))
        },
    )
    .await;
}

async fn wait_done(
    ring: &RingFixture,
    i: usize,
    shoot: &str,
    epoch: u64,
) -> ringd::state::Operation {
    let s = ring
        .wait_status(
            i,
            &format!("{shoot}'s failover done at epoch {epoch}"),
            FAILOVER,
            |s| {
                s.operations.iter().any(|o| {
                    o.shoot() == shoot
                        && o.epoch() >= epoch
                        && o.step == ringd::state::OperationStep::Done
                }) || s
                    .operations
                    .iter()
                    .any(|o| o.shoot() == shoot && o.step == ringd::state::OperationStep::Failed)
            },
        )
        .await;
    let op = s
        .operations
        .iter()
        .rev()
        .find(|o| o.shoot() == shoot)
        .cloned()
        .unwrap();
    assert_eq!(op.step, ringd::state::OperationStep::Done, "{op:?}");
    op
}

/// A 3-member ring in which m1's seed is a real cluster with a node, serving
/// m2's control plane as pods; m2 and m3 local seeds; one sealed file bucket.
pub(super) struct KubernetesRing {
    pub ring: RingFixture,
    /// The seed cluster with its node (stopped by the test; its node on drop).
    pub cluster: SeedCluster,
    /// m1's ringd state dir for the seed cluster.
    pub state: PathBuf,
}

/// Starts a [`KubernetesRing`] with seed cluster `cluster_name`,
/// ring `ring_name` and a hostPath volume per name in `volumes`; returns once
/// m1 serves m2 ready from pods.
pub(super) async fn start_ring(
    cluster_name: &str,
    ring_name: &str,
    volumes: &[&str],
) -> KubernetesRing {
    start_ring_with_env(cluster_name, ring_name, volumes, &[]).await
}

/// Like [`start_ring`], m1's ringd with the extra environment `m1_env`.
pub(super) async fn start_ring_with_env(
    cluster_name: &str,
    ring_name: &str,
    volumes: &[&str],
    m1_env: &[(&str, &str)],
) -> KubernetesRing {
    let mut ring = RingFixture::new(3, &["m2", "m3"]);
    let cluster = seed_cluster_with_node(&ring.sandbox, cluster_name).await;
    let kc = cluster.kubeconfig();
    for v in volumes {
        host_path_volume(&cluster, &ring.sandbox, v).await;
    }
    let bucket = ring.sandbox.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let key = ring.sandbox.path().join("ring.key");
    std::fs::write(&key, "22".repeat(32)).unwrap();
    let mut k8s = config(ring_name, &kc);
    k8s.service_type = ServiceType::NodePort;
    k8s.node_address = Some(cluster.node_address().into());
    let state: PathBuf = ring.sandbox.path().join("m1-k8s-state");
    for (i, m) in ring.members.iter().enumerate() {
        let kubernetes = (i == 0).then_some((state.as_path(), &k8s));
        configure(&m.config, &bucket, &key, kubernetes);
    }
    ring.start_with_env(0, m1_env);
    ring.start(1);
    ring.start(2);
    ring.wait_status(
        0,
        "m2 served ready from pods",
        Duration::from_secs(300),
        |s| {
            s.hosted
                .iter()
                .any(|h| h.shoot == "m2" && h.serving && h.ready)
        },
    )
    .await;
    KubernetesRing {
        ring,
        cluster,
        state,
    }
}

/// Backups from the pods, fencing by the lease guard while m1's ringd is
/// stopped (SIGSTOP), failover off the Kubernetes seed onto a local one, and a
/// failover onto the Kubernetes seed restored by etcd's init container.
///
/// m1's ringd runs with its clock 5 s ahead (faketime); the node and its
/// pods keep the true time. The pods' guards must stop etcd and
/// kube-apiserver by the lease m1 measured, before the leader (by its own
/// record of m1's last renewal) lets a replacement begin (`Pending`). When
/// the guards took m1's wall-clock fence time, 5 s late on the node, the
/// pods served on for seconds after the ring had given the shoot up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_seed_backs_up_fences_without_ringd_and_fails_over_both_ways() {
    let _slot = ring_slot();
    let skew = ring_tests::ring::faketime("+5s");
    let env: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // one volume for m2's etcd, one for m3's after its failover onto m1
    let KubernetesRing {
        mut ring,
        cluster,
        state,
    } = start_ring_with_env("k8s-ring", "kr", &["etcd-m2", "etcd-m3"], &env).await;

    // m1 serves m2's control plane from pods, reached at m2's stable endpoint
    // (the address a local seed gives it, relayed to the Service); writes
    // reach the bucket through the sidecar
    let m2_stable = state.join("shoots/m2/kubeconfig/admin.kubeconfig");
    let rv = write_configmaps(&m2_stable, "from-pods", 10);
    wait_durable(&ring, 1, "m2", rv).await;
    assert!(
        !pod_control_plane("kr", "m2").is_empty(),
        "m2's etcd and kube-apiserver run in pods"
    );

    // m1's ringd stops (SIGSTOP): nothing renews the lease, the guards stop etcd
    // and kube-apiserver in the pods and the relay of the stable endpoint by
    // themselves, and the ring fails m2 over to m3, whose kube-apiserver then
    // listens on that address itself
    ring.signal(0, libc::SIGSTOP);
    let serves = || !pod_control_plane("kr", "m2").is_empty();
    let (pending, last_served) = ring
        .pending_and_last_served(1, "m2", serves, Duration::from_secs(60))
        .await;
    assert!(
        pending > last_served,
        "the failover of m2 became Pending {} ms before m2's pods stopped serving",
        last_served - pending
    );
    let op = wait_done(&ring, 1, "m2", 2).await;
    assert_eq!(op.target(), "m3", "{op:?}");
    for i in 0..10 {
        kubectl(&m2_stable, &["get", "configmap", &format!("from-pods-{i}")]);
    }
    assert!(
        pod_control_plane("kr", "m2").is_empty(),
        "the fenced pods stay down"
    );
    ring.signal(0, libc::SIGCONT);

    // m3's control plane (on m2) fails over onto the Kubernetes seed: restored
    // from the bucket by etcd's init container, with its objects counted, and
    // still reached with the kubeconfig the local seed wrote
    let m3_local = ring
        .seed_dir(1)
        .join("shoots/m3/kubeconfig/admin.kubeconfig");
    let rv = write_configmaps(&m3_local, "from-local", 10);
    wait_durable(&ring, 0, "m3", rv).await;
    ring.kill(1);
    let op = wait_done(&ring, 0, "m3", 2).await;
    assert_eq!(op.target(), "m1", "{op:?}");
    let detail = format!("{op:?}");
    assert!(detail.contains("restored revision"), "{detail}");
    assert!(
        !pod_control_plane("kr", "m3").is_empty(),
        "m3's etcd and kube-apiserver run in pods"
    );
    wait_for("m3 answers from pods", READY, || async {
        let out = run_bounded(
            std::process::Command::new(kubectl_path())
                .arg("--kubeconfig")
                .arg(&m3_local)
                .args(["get", "configmap", "from-local-9", "-o", "name"]),
            Duration::from_secs(20),
        );
        out.status.success().then_some(())
    })
    .await;
    for i in 0..10 {
        kubectl(&m3_local, &["get", "configmap", &format!("from-local-{i}")]);
    }
    ring.stop(0);
    ring.stop(2);
    cluster.stop().await;
}
