//! The manifests `ringctl manifests` prints for a Kubernetes seed: they pass
//! a server-side dry run, their RBAC is enough for what the seed does, and
//! ringd runs from them as pods on a cluster with a node.

use super::*;

/// A kubeconfig like `admin` that acts as ringd's service account (impersonation).
fn impersonating(admin: &Path, user: &str, out: &Path) -> PathBuf {
    let mut doc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(admin).unwrap()).unwrap();
    doc["users"][0]["user"]["as"] = serde_yaml::Value::from(user);
    std::fs::write(out, serde_yaml::to_string(&doc).unwrap()).unwrap();
    out.to_path_buf()
}

fn can_i(kubeconfig: &Path, sa: &str, args: &[&str]) -> bool {
    let mut cmd = std::process::Command::new(kubectl_path());
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["auth", "can-i", "--as", sa])
        .args(args);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl auth can-i {args:?}: {answer} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ringctl_manifests_pass_server_dry_run_and_their_rbac_is_enough_for_the_seed() {
    let sandbox = Sandbox::new();
    let (cluster, kc) = seed_cluster(&sandbox, "k8s-seed-b").await;
    let ring = ring_config(sandbox.path(), 3); // ring "test", members m1..m3
    let (out, manifests) = manifests_of_m1(&sandbox, &ring);
    // m1 hosts m2's and m3's control planes (its successor, and any shoot after a failover).
    for ns in ["ring-system", "shoot--test--m2", "shoot--test--m3"] {
        assert!(
            out.contains(&format!("name: {ns}\n")),
            "no namespace {ns} in:\n{out}"
        );
    }

    // The ConfigMap holds a valid ringd config with an in-cluster Kubernetes seed.
    let config_map = out
        .split("\n---\n")
        .filter_map(|doc| serde_yaml::from_str::<serde_yaml::Value>(doc).ok())
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "ringd-m1")
        .expect("ConfigMap ringd-m1");
    let ringd: ringd::config::RingdConfig =
        serde_yaml::from_str(config_map["data"]["ringd.yaml"].as_str().unwrap()).unwrap();
    ringd.validate().expect("valid ringd config");
    let k8s = ringd
        .seed
        .and_then(|s| s.kubernetes)
        .expect("kubernetes seed");
    assert_eq!((k8s.ring.as_str(), k8s.kubeconfig), ("test", None));
    assert_eq!(ringd.members.len(), 3);

    // The namespaces must exist for a server-side dry run of the namespaced objects.
    let file = manifests.to_str().unwrap();
    for ns in ["ring-system", "shoot--test--m2", "shoot--test--m3"] {
        kubectl(&kc, &["create", "namespace", ns]);
    }
    let dry = kubectl(&kc, &["apply", "--dry-run=server", "-f", file]);
    for object in [
        "serviceaccount/ringd-m1",
        "role.rbac.authorization.k8s.io/ringd-seed",
        "rolebinding.rbac.authorization.k8s.io/ringd-m1",
        "configmap/ringd-m1",
        "service/ringd-m1",
        "statefulset.apps/ringd-m1",
    ] {
        assert!(
            dry.contains(&format!("{object} created (server dry run)")),
            "{object} not in:\n{dry}"
        );
    }
    let sas = kubectl(
        &kc,
        &["get", "serviceaccounts", "-n", "ring-system", "-o", "name"],
    );
    assert!(
        !sas.contains("ringd-m1"),
        "the dry run created objects: {sas}"
    );

    // Applied for real, ringd's service account may do exactly what the seed needs.
    kubectl(&kc, &["apply", "-f", file]);
    let sa = "system:serviceaccount:ring-system:ringd-m1";
    assert!(can_i(
        &kc,
        sa,
        &["patch", "deployments.apps", "-n", "shoot--test--m2"]
    ));
    assert!(can_i(
        &kc,
        sa,
        &["patch", "statefulsets.apps/scale", "-n", "shoot--test--m3"]
    ));
    assert!(!can_i(&kc, sa, &["create", "namespaces"]));
    assert!(!can_i(&kc, sa, &["get", "secrets", "-n", "kube-system"]));
    assert!(!can_i(
        &kc,
        sa,
        &["get", "secrets", "-n", "shoot--test--m1"]
    ));
    assert!(!can_i(
        &kc,
        sa,
        &["delete", "deployments.apps", "-n", "shoot--test--m2"]
    ));

    // The seed, acting as that service account, runs a whole lifecycle.
    let as_ringd = impersonating(&kc, sa, &sandbox.path().join("ringd-m1.kubeconfig"));
    let seed = KubernetesSeed::connect(&config("test", &as_ringd), sandbox.path().join("m1-state"))
        .await
        .expect("connect as ringd");
    let spec = ControlPlaneSpec::new("m2");
    seed.start(&spec).await.expect("start as ringd");
    seed.start(&spec).await.expect("re-apply as ringd");
    // a planned migration's first step: the writers' pods deleted by ringd
    seed.stop_components("m2", &WRITERS)
        .await
        .expect("stop the writers as ringd");
    seed.start(&spec).await.expect("re-apply after the stop");
    assert_eq!(
        seed.inspect("m2").await.expect("inspect as ringd").phase,
        Phase::Starting
    );
    seed.fence("m2").await.expect("fence as ringd");
    seed.stop("m2").await.expect("stop as ringd");
    seed.delete("m2").await.expect("delete as ringd");
    // No RBAC for a shoot m1 does not host (itself): a clear error, nothing created.
    let err = seed
        .start(&ControlPlaneSpec::new("m1"))
        .await
        .expect_err("m1's own namespace is not ringd-m1's");
    assert!(
        err.to_string().contains("lacks a permission")
            && err.to_string().contains("ringctl manifests"),
        "{err}"
    );
    cluster.stop("k8s-seed-b").await.unwrap();
}

/// `ringctl manifests` applied to a cluster that has a node: ringd runs there as
/// a pod from the locally built image (config from the ConfigMap, its
/// certificate from the Secret, its data on a volume) and answers `ringctl status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ringctl_manifests_run_ringd_pods_on_a_cluster_with_a_node() {
    let sandbox = Sandbox::new();
    let cluster_name = "k8s-seed-n";
    let cluster = seed_cluster_with_node(&sandbox, cluster_name).await;
    let kc = cluster.kubeconfig();

    let ring = ring_config(sandbox.path(), 3);
    let (_, manifests) = manifests_of_m1(&sandbox, &ring);
    kubectl(&kc, &["apply", "-f", manifests.to_str().unwrap()]);

    // the member's certificate, from the ring's PKI
    let pki_dir = sandbox.path().join("ring-pki");
    expect_success(&ringctl_cmd(
        [
            "pki",
            "init",
            "--dir",
            pki_dir.to_str().unwrap(),
            "--member",
            "m1=127.0.0.1",
        ],
        &[],
    ));
    let files = ringd::identity::RingPki::new(&pki_dir).files("m1");
    kubectl(
        &kc,
        &[
            "create",
            "secret",
            "generic",
            "ringd-m1-tls",
            "-n",
            "ring-system",
            &format!("--from-file=ca.crt={}", files.ca.display()),
            &format!("--from-file=tls.crt={}", files.cert.display()),
            &format!("--from-file=tls.key={}", files.key.display()),
        ],
    );
    // a volume for ringd's data (no provisioner in this cluster)
    host_path_volume(&cluster, &sandbox, "ringd-data").await;

    let pod_ip = wait_for("ringd-m1-0 running", Duration::from_secs(120), || async {
        let pod = kubectl_json(&kc, &["get", "pods", "-n", "ring-system"]);
        let item = pod["items"]
            .as_array()?
            .iter()
            .find(|p| p["metadata"]["name"] == "ringd-m1-0")?
            .clone();
        (item["status"]["phase"] == "Running")
            .then(|| item["status"]["podIP"].as_str().map(String::from))
            .flatten()
    })
    .await;
    let port = kubectl_json(&kc, &["get", "service", "ringd-m1", "-n", "ring-system"])["spec"]
        ["ports"][0]["port"]
        .as_u64()
        .unwrap();
    let address = format!("{pod_ip}:{port}");
    let status = wait_for("ringd in the pod answers", Duration::from_secs(60), || {
        let (address, pki_dir) = (address.clone(), pki_dir.clone());
        async move {
            let mut client = ringd::client::AdminClient::connect(&address, &pki_dir).ok()?;
            client.status().await.ok()
        }
    })
    .await;
    assert_eq!(status.member, "m1");
    let restarts = kubectl(
        &kc,
        &[
            "get",
            "pod",
            "ringd-m1-0",
            "-n",
            "ring-system",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
    );
    assert_eq!(restarts, "0", "ringd restarted in its pod");
    cluster.stop().await;
}
