//! The Kubernetes seed against a real kube-apiserver (v1.20.2, started by the harness
//! as a local control plane with etcd, kube-controller-manager and kube-scheduler).
//!
//! Most tests run the seed cluster without nodes: pods are created by the
//! controllers but stay Pending. They check what Ring does to the seed cluster:
//! the objects, their updates, ownership, idempotent re-apply, scaling, deletion
//! (through the real garbage collector) and RBAC. `/readyz` through the API
//! Service is checked against a local control plane that stands in for the
//! kube-apiserver pod, with the PKI Ring put in the Secret. The last two tests
//! give the seed cluster a real node (`ring-node`): a hosted control plane runs
//! there as pods and serves kubectl through its Service, and ringd runs there as
//! a pod from `ringctl manifests`.

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::Api;
use ring_tests::*;
use scenarios::seed_cluster::SeedCluster;
use seed::kubernetes::ServiceType;
use seed::{
    wait_ready, ControlPlaneSpec, KubernetesSeed, KubernetesSeedConfig, LocalSeed, Phase, Seed,
    SeedError,
};

#[path = "kubernetes_seed/backoff.rs"]
mod backoff;
#[path = "kubernetes_seed/certificates.rs"]
mod certificates;
#[path = "kubernetes_seed/failover.rs"]
mod failover;
#[path = "kubernetes_seed/manifests.rs"]
mod manifests;
#[path = "kubernetes_seed/migration.rs"]
mod migration;

const READY: Duration = Duration::from_secs(120);
const GC: Duration = Duration::from_secs(60);
/// What a planned migration stops first.
const WRITERS: [seed::Component; 3] = [
    seed::Component::KubeApiserver,
    seed::Component::KubeControllerManager,
    seed::Component::KubeScheduler,
];

/// A running seed cluster: a local control plane; returns (seed, admin kubeconfig).
async fn seed_cluster(sandbox: &Sandbox, name: &str) -> (LocalSeed, PathBuf) {
    let seed = sandbox.seed();
    seed.start(&ControlPlaneSpec::new(name))
        .await
        .expect("start seed cluster");
    wait_ready(&seed, name, READY)
        .await
        .expect("seed cluster ready");
    let kubeconfig = seed.layout(name).admin_kubeconfig();
    (seed, kubeconfig)
}

/// A seed cluster plus a Kubernetes seed on it for ring `ring`, keeping its caches in
/// `<sandbox>/ringd-state`: (cluster, admin kubeconfig, client, state dir, seed).
async fn kubernetes_seed(
    sandbox: &Sandbox,
    cluster: &str,
    ring: &str,
) -> (LocalSeed, PathBuf, kube::Client, PathBuf, KubernetesSeed) {
    let (local, kc) = seed_cluster(sandbox, cluster).await;
    let client = kube_client(&kc).await;
    let state = sandbox.path().join("ringd-state");
    let seed = KubernetesSeed::connect(&config(ring, &kc), &state)
        .await
        .expect("connect");
    (local, kc, client, state, seed)
}

fn config(ring: &str, kubeconfig: &Path) -> KubernetesSeedConfig {
    let mut c = KubernetesSeedConfig::new(ring);
    c.kubeconfig = Some(kubeconfig.to_path_buf());
    c
}

/// `spec.replicas` of etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
async fn replicas(client: &kube::Client, ns: &str) -> [Option<i32>; 4] {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut out = [None; 4];
    out[0] = sts.get("etcd").await.unwrap().spec.replicas;
    for (i, name) in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    .iter()
    .enumerate()
    {
        out[i + 1] = deployments.get(name).await.unwrap().spec.replicas;
    }
    out
}

/// `ringctl manifests` for member m1 of the Ring config `ring`: (text, file).
fn manifests_of_m1(sandbox: &Sandbox, ring: &Path) -> (String, PathBuf) {
    let out = expect_success(&ringctl_cmd(
        [
            "manifests".as_ref(),
            "--ring-config".as_ref(),
            ring.as_os_str(),
            "--member".as_ref(),
            "m1".as_ref(),
        ],
        &[],
    ));
    let manifests = sandbox.path().join("m1.yaml");
    std::fs::write(&manifests, &out).unwrap();
    (out, manifests)
}

/// A seed cluster `name` with a real node: the benchmarks' `SeedCluster`
/// (its kube-apiserver advertises the node's address so pods reach it), under
/// the sandbox.
async fn seed_cluster_with_node(sandbox: &Sandbox, name: &str) -> SeedCluster {
    let dir = sandbox.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    SeedCluster::start(&dir, name, binaries(), &ring_node_bin())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A 1 GiB hostPath PersistentVolume `name` under the sandbox (the cluster has
/// no provisioner).
async fn host_path_volume(cluster: &SeedCluster, sandbox: &Sandbox, name: &str) {
    cluster
        .add_volumes(sandbox.path(), &[name.to_string()])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

fn kubectl_json(kubeconfig: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(kubeconfig, &all)).expect("kubectl json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_objects_are_applied_owned_updated_scaled_and_deleted() {
    let sandbox = Sandbox::new();
    let (cluster, kc, client, state, seed) = kubernetes_seed(&sandbox, "k8s-seed-a", "t1").await;
    let seed = seed.with_stop_grace(Duration::from_secs(20));
    let spec = ControlPlaneSpec::new("alpha");
    let ns = "shoot--t1--alpha";
    assert_eq!(seed.namespace("alpha"), ns);

    seed.start(&spec).await.expect("start");

    // The objects, all owned by the anchor, all applied by field manager ringd.
    let anchor = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get("ring-control-plane")
        .await
        .expect("anchor");
    let uid = anchor.metadata.uid.clone().unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let owned_by_anchor = |meta: &kube::api::ObjectMeta| {
        let refs = meta.owner_references.clone().unwrap_or_default();
        assert!(
            refs.iter()
                .any(|r| r.uid == uid && r.kind == "ConfigMap" && r.controller == Some(true)),
            "{:?} is not owned by the anchor: {refs:?}",
            meta.name
        );
        let managers = meta.managed_fields.clone().unwrap_or_default();
        assert!(
            managers
                .iter()
                .any(|m| m.manager.as_deref() == Some("ringd")
                    && m.operation.as_deref() == Some("Apply")),
            "{:?} was not server-side applied by ringd",
            meta.name
        );
    };
    for name in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        let d = deployments.get(name).await.expect(name);
        owned_by_anchor(&d.metadata);
        let spec = d.spec;
        assert_eq!(spec.replicas, Some(1));
        let c = &spec.template.spec.unwrap().containers[0];
        let requests = c.resources.clone().unwrap().requests.unwrap();
        assert!(
            requests.contains_key("cpu") && requests.contains_key("memory"),
            "{name}: {requests:?}"
        );
    }
    let etcd = statefulsets.get("etcd").await.expect("etcd");
    owned_by_anchor(&etcd.metadata);
    let claims = etcd.spec.volume_claim_templates.unwrap();
    assert_eq!(claims[0].metadata.name.as_deref(), Some("data"));
    for name in ["etcd", "etcd-client", "kube-apiserver"] {
        owned_by_anchor(&services.get(name).await.expect(name).metadata);
    }
    let api_svc = services.get("kube-apiserver").await.unwrap();
    assert_eq!(api_svc.spec.unwrap().type_.as_deref(), Some("LoadBalancer"));
    let pki = secrets.get("ring-pki").await.expect("pki secret");
    owned_by_anchor(&pki.metadata);
    let data = pki.data.clone().unwrap();
    for key in [
        "ca.crt",
        "ca.key",
        "etcd-server.crt",
        "etcd-client.key",
        "kube-apiserver.crt",
        "service-account.key",
        "kube-scheduler.kubeconfig",
    ] {
        assert!(data.contains_key(key), "ring-pki lacks {key}");
    }
    let pdb = kubectl_json(
        &kc,
        &["get", "poddisruptionbudgets.v1.policy", "etcd", "-n", ns],
    );
    assert_eq!(pdb["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);

    // Controllers act on the objects: the StatefulSet controller claims etcd's volume.
    // (Its pod stays Pending: there are no nodes.)
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    wait_for("etcd's volume claim", GC, || async {
        pvcs.get_opt("data-etcd-0").await.ok().flatten()
    })
    .await;

    // Nothing runs, and the seed says so plainly.
    let status = seed.inspect("alpha").await.expect("inspect");
    assert_eq!(status.phase, Phase::Starting, "{status:?}");
    assert!(status.components.iter().all(|c| !c.running), "{status:?}");
    assert!(
        status.readyz.contains("kube-apiserver 0/1 replicas ready")
            && status.readyz.contains("not reachable")
            && status.readyz.contains("no load balancer address"),
        "{}",
        status.readyz
    );

    // Idempotent re-apply: same PKI, no spec change.
    let generation = |d: &Deployment| d.metadata.generation;
    let before = generation(&deployments.get("kube-apiserver").await.unwrap());
    seed.start(&spec).await.expect("re-apply");
    let again = secrets.get("ring-pki").await.unwrap().data.unwrap();
    assert_eq!(
        data, again,
        "the PKI changed on re-apply; it must be read back from the Secret"
    );
    assert_eq!(
        before,
        generation(&deployments.get("kube-apiserver").await.unwrap())
    );

    // A new ringd (empty local cache) keeps the PKI too.
    std::fs::remove_dir_all(&state).unwrap();
    seed.start(&spec).await.expect("re-apply from empty cache");
    assert_eq!(data, secrets.get("ring-pki").await.unwrap().data.unwrap());

    // Updates: another image and Service type are applied in place.
    let mut changed = config("t1", &kc);
    changed.service_type = ServiceType::ClusterIP;
    changed.images.kube_scheduler = "example.org/kube-scheduler:v1.20.2-patched".into();
    let updated = KubernetesSeed::connect(&changed, &state).await.unwrap();
    updated.start(&spec).await.expect("update");
    let sched = deployments.get("kube-scheduler").await.unwrap();
    assert_eq!(
        sched.spec.template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("example.org/kube-scheduler:v1.20.2-patched")
    );
    let svc = services.get("kube-apiserver").await.unwrap();
    assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
    assert_eq!(svc.metadata.uid, api_svc.metadata.uid, "updated in place");
    assert_eq!(
        updated.health("alpha").await.unwrap().detail,
        "kube-apiserver 0/1 replicas ready; /readyz not reachable: Service kube-apiserver is of type ClusterIP, which this ringd (outside the seed cluster) cannot reach"
    );

    // stop: everything at zero replicas, etcd's volume kept.
    seed.stop("alpha").await.expect("stop");
    assert_eq!(replicas(&client, ns).await, [Some(0); 4]);
    assert!(pvcs.get_opt("data-etcd-0").await.unwrap().is_some());
    assert_eq!(seed.inspect("alpha").await.unwrap().phase, Phase::Stopped);

    // start again scales back up; fence takes only the API down, at once.
    seed.start(&spec).await.expect("start after stop");
    assert_eq!(replicas(&client, ns).await, [Some(1); 4]);
    seed.fence("alpha").await.expect("fence");
    assert_eq!(
        replicas(&client, ns).await,
        [Some(1), Some(0), Some(1), Some(1)]
    );

    // delete: the garbage collector removes everything the anchor owns; the volume goes too.
    seed.delete("alpha").await.expect("delete");
    wait_for(
        "the garbage collector to remove the control plane",
        GC,
        || async {
            let left = deployments
                .list(&Default::default())
                .await
                .ok()?
                .items
                .len()
                + statefulsets
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .len()
                + services.list(&Default::default()).await.ok()?.items.len()
                + secrets
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .filter(|s| s.metadata.name.as_deref() == Some("ring-pki"))
                    .count()
                + pvcs.list(&Default::default()).await.ok()?.items.len();
            (left == 0).then_some(())
        },
    )
    .await;
    let pdbs = kubectl(
        &kc,
        &[
            "get",
            "poddisruptionbudgets.v1.policy",
            "-n",
            ns,
            "-o",
            "name",
        ],
    );
    assert_eq!(pdbs.trim(), "", "PDB left after delete");
    match seed.inspect("alpha").await {
        Err(SeedError::UnknownShoot { .. }) => {}
        other => panic!("expected UnknownShoot after delete, got {other:?}"),
    }
    seed.delete("alpha").await.expect("delete is idempotent");
    cluster.stop("k8s-seed-a").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_asked_through_the_api_service_address() {
    let sandbox = Sandbox::new();
    let (cluster, _, client, _, seed) = kubernetes_seed(&sandbox, "k8s-seed-c", "t3").await;
    let spec = ControlPlaneSpec::new("cp-via-svc");
    seed.start(&spec).await.expect("start");

    // Play the load-balancer controller: give the Service the shoot's (loopback) address.
    let services: Api<Service> = Api::namespaced(client, "shoot--t3--cp-via-svc");
    let lb = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": spec.endpoint.address.to_string()}]}}});
    services
        .patch_status(
            "kube-apiserver",
            &PatchParams::default(),
            &Patch::Merge(&lb),
        )
        .await
        .expect("set load balancer address");
    let url = spec.endpoint.api_url();
    let down = seed.health("cp-via-svc").await.unwrap();
    assert!(!down.ready);
    assert!(
        down.detail.contains(&format!("/readyz at {url}")),
        "{}",
        down.detail
    );

    // Stand-in for the kube-apiserver pod: a local control plane with the PKI from the Secret.
    let pod = Sandbox::new();
    let local = pod.seed();
    let pki_dir = local.layout("cp-via-svc").pki();
    std::fs::create_dir_all(pki_dir.dir()).unwrap();
    for entry in std::fs::read_dir(seed.pki_cache("cp-via-svc")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), pki_dir.dir().join(entry.file_name())).unwrap();
    }
    local.start(&spec).await.expect("start stand-in");
    let health = wait_for("/readyz through the Service address", READY, || async {
        seed.health("cp-via-svc").await.ok().filter(|h| h.ready)
    })
    .await;
    assert_eq!(health.detail, "ok");
    let status = seed.inspect("cp-via-svc").await.unwrap();
    assert_eq!(status.api_url, url);
    // /readyz answers but no pod of the Deployments is ready (no kubelet): degraded.
    assert_eq!(status.phase, Phase::Degraded, "{status:?}");
    kubectl(&seed.admin_kubeconfig("cp-via-svc"), &["get", "namespaces"]);
    local.stop("cp-via-svc").await.unwrap();
    cluster.stop("k8s-seed-c").await.unwrap();
}

/// A ring member configured with a Kubernetes seed: its ringd applies the control
/// plane it hosts to the seed cluster, re-applies it unchanged after a restart,
/// and once the control plane moved away (the member was declared dead and came
/// back) fences it and deletes its objects after the release grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ringd_hosts_its_successor_on_a_kubernetes_seed_and_removes_it_after_a_move() {
    let _slot = ring_slot();
    let mut ring = ring_tests::ring::RingFixture::new(3, &[]);
    let (cluster, kc) = seed_cluster(&ring.sandbox, "k8s-ringd-seed").await;
    let client = kube_client(&kc).await;
    // m1 hosts control planes in the seed cluster (ring "kr"), data released 1 s after a move
    let m1 = ring.members[0].config.clone();
    let mut yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&m1).unwrap()).unwrap();
    let mut seed = serde_yaml::Mapping::new();
    seed.insert(
        "stateDir".into(),
        ring.sandbox
            .path()
            .join("m1-k8s-state")
            .display()
            .to_string()
            .into(),
    );
    seed.insert(
        "kubernetes".into(),
        serde_yaml::to_value(config("kr", &kc)).unwrap(),
    );
    seed.insert("releaseGraceSecs".into(), 1.into());
    yaml["seed"] = serde_yaml::Value::Mapping(seed);
    let metrics = format!("127.0.0.1:{}", ringd::localring::free_port().unwrap());
    yaml["metricsListen"] = metrics.clone().into();
    std::fs::write(&m1, serde_yaml::to_string(&yaml).unwrap()).unwrap();

    ring.start_all();
    let ns = "shoot--kr--m2";
    ring.wait_status(0, "m1 applied m2's control plane", READY, |s| {
        s.hosted.iter().any(|h| h.shoot == "m2" && h.serving)
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let apiserver = deployments
        .get("kube-apiserver")
        .await
        .expect("kube-apiserver Deployment");
    assert_eq!(apiserver.spec.replicas, Some(1));
    let managers: Vec<String> = apiserver
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == "ringd"), "{managers:?}");
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    sts.get("etcd").await.expect("etcd StatefulSet");
    let generation = apiserver.metadata.generation;
    // one start, however many reconcile passes (every 200 ms) it took: a second
    // start still applying at shutdown would undo the fencing below
    let text = ring_tests::http_get(&metrics, "/metrics").await;
    assert!(
        text.contains("ringd_control_plane_starts_total{member=\"m1\"} 1\n"),
        "{text}"
    );

    // a graceful restart fences (no ringd renews the lease meanwhile), the next
    // start applies the same objects again: scaled back up, nothing else changed
    ring.stop(0);
    let fenced = deployments.get("kube-apiserver").await.unwrap();
    assert_eq!(fenced.spec.replicas, Some(0), "fenced at shutdown");
    ring.start(0);
    wait_for("kube-apiserver scaled up again", READY, || {
        let d = deployments.clone();
        async move {
            let d = d.get("kube-apiserver").await.ok()?;
            (d.spec.replicas == Some(1)).then_some(d.metadata.generation)
        }
    })
    .await;
    let again = deployments.get("kube-apiserver").await.unwrap();
    assert!(
        again.metadata.generation <= generation.map(|g| g + 2),
        "re-applying changed more than the scale: {:?} -> {:?}",
        generation,
        again.metadata.generation
    );

    // m1 dies (kill -9: the workloads in the cluster outlive it) and the ring moves m2 away
    ring.kill(0);
    ring.wait_status(1, "m2 placed away from m1", READY, |s| {
        s.placements
            .iter()
            .any(|p| p.shoot == "m2" && p.host != "m1" && p.epoch >= 2)
    })
    .await;
    // m1 returns: it fences and, after the grace, deletes m2's objects (the
    // seed cluster's garbage collector removes what the anchor owned)
    ring.start(0);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    wait_for("m2's objects deleted from the seed cluster", GC, || {
        let (d, c) = (deployments.clone(), configmaps.clone());
        async move {
            let gone = d.get_opt("kube-apiserver").await.ok()?.is_none();
            let left = c
                .list(&kube::api::ListParams::default().labels("ring.gardener.cloud/shoot=m2"))
                .await
                .ok()?
                .items
                .len();
            (gone && left == 0).then_some(())
        }
    })
    .await;
    // and the member's local state for m2 is gone too
    assert!(!ring.sandbox.path().join("m1-k8s-state/shoots/m2").exists());
    // stopped before the sandbox goes: its supervisor still wrote the status
    // file while the sandbox was removed, and left the sandbox behind
    cluster.stop("k8s-ringd-seed").await.unwrap();
}

/// A seed cluster with a real node: a shoot's control plane applied by the
/// Kubernetes seed runs there as pods from the local images (etcd on a volume,
/// names resolved by the node's cluster DNS), every pod becomes Ready, and
/// kubectl works against the hosted kube-apiserver through its Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosted_control_plane_runs_as_pods_on_a_node_and_serves_kubectl() {
    let sandbox = Sandbox::new();
    let cluster_name = "k8s-seed-p";
    let cluster = seed_cluster_with_node(&sandbox, cluster_name).await;
    let kc = cluster.kubeconfig();
    let node_ip = cluster.node_address();
    // etcd's claim needs a volume (no provisioner in this cluster)
    host_path_volume(&cluster, &sandbox, "etcd-data").await;

    let mut cfg = config("t5", &kc);
    cfg.service_type = ServiceType::NodePort;
    cfg.node_address = Some(node_ip.into());
    let seed = KubernetesSeed::connect(&cfg, sandbox.path().join("ringd-state"))
        .await
        .expect("connect");
    seed.start(&ControlPlaneSpec::new("hosted"))
        .await
        .expect("start");
    let ns = seed.namespace("hosted");
    // no kube-apiserver container runs yet (its pod was just created):
    // /readyz is not asked through the node port
    let starting = seed.health("hosted").await.expect("health");
    assert!(
        !starting.ready
            && starting
                .detail
                .starts_with("kube-apiserver 0/1 replicas ready")
            && starting.detail.contains("not asked"),
        "{}",
        starting.detail
    );
    wait_for(
        "every pod of the hosted control plane Ready",
        Duration::from_secs(240),
        || async {
            let pods = kubectl_json(&kc, &["get", "pods", "-n", &ns]);
            let items = pods["items"].as_array()?.clone();
            let ready = |p: &serde_json::Value| {
                p["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            };
            (items.len() >= 4 && items.iter().all(ready)).then_some(())
        },
    )
    .await;

    // kubectl through the API Service (a NodePort on the node's address)
    let svc = kubectl_json(&kc, &["get", "service", "kube-apiserver", "-n", &ns]);
    let node_port = svc["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .expect("nodePort");
    let pki = seed::pki::Pki::new(seed.pki_cache("hosted"));
    let hosted_kc = sandbox.path().join("hosted.kubeconfig");
    seed::kubeconfig::write(
        &hosted_kc,
        "hosted",
        "admin",
        &format!("https://{node_ip}:{node_port}"),
        &pki,
        &pki.leaf(seed::pki::Leaf::Admin),
    )
    .unwrap();
    let server_name = format!("kube-apiserver.{ns}.svc");
    let out = kubectl(
        &hosted_kc,
        &[
            "--tls-server-name",
            &server_name,
            "get",
            "namespaces",
            "-o",
            "name",
        ],
    );
    assert!(out.contains("namespace/kube-system"), "{out}");
    kubectl(
        &hosted_kc,
        &[
            "--tls-server-name",
            &server_name,
            "create",
            "configmap",
            "on-pods",
        ],
    );
    // a due certificate is renewed while the pods serve
    certificates::renewed_in_pods(&seed, &kc, "hosted").await;

    // A planned migration stops the writers first, also when the seed
    // cluster's own controllers are away (its controller-manager had just
    // moved): the seed deletes their pods itself instead of waiting out its
    // stop grace (ten minutes here) for a ReplicaSet controller.
    cluster
        .stop_controller_manager()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let seed = seed.with_stop_grace(Duration::from_secs(600));
    tokio::time::timeout(
        Duration::from_secs(120),
        seed.stop_components("hosted", &WRITERS),
    )
    .await
    .expect("the writers' pods were left to the seed cluster's controllers, which are away")
    .expect("stop the writers");
    let pods = kubectl_json(&kc, &["get", "pods", "-n", &ns]);
    let names: Vec<&str> = pods["items"]
        .as_array()
        .expect("pods")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["etcd-0"],
        "only etcd runs after the writers stopped"
    );
    cluster.stop().await;
}
