//! Certificates renewed while a control plane serves in pods: the PKI
//! Secret is the truth, so a due certificate is reissued there; the pods
//! whose kubeconfig embeds one are replaced, the others keep running and
//! read the files the kubelet refreshes.

use seed::pki::Leaf;

use super::*;

/// Names of the pods of `component` in `ns`.
fn pod_names(kubeconfig: &Path, ns: &str, component: &str) -> Vec<String> {
    let selector = format!("{}={component}", seed::kubernetes::render::COMPONENT_LABEL);
    let pods = kubectl_json(kubeconfig, &["get", "pods", "-n", ns, "-l", &selector]);
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let name = |p: &serde_json::Value| p["metadata"]["name"].as_str().map(String::from);
    items.iter().filter_map(name).collect()
}

/// Ages shoot `shoot`'s kube-scheduler certificate in its PKI Secret to 29
/// days, renews, and checks what changed: the Secret, the scheduler's pod
/// (a new one, Ready), and nothing else (kube-apiserver's pod stays).
pub(super) async fn renewed_in_pods(seed: &KubernetesSeed, kc: &Path, shoot: &str) {
    let ns = seed.namespace(shoot);
    let client = kube_client(kc).await;
    let secrets: Api<Secret> = Api::namespaced(client, &ns);
    let file = |s: &Secret, name: &str| -> Vec<u8> {
        let data = s.data.as_ref().expect("PKI Secret data");
        data.get(name)
            .unwrap_or_else(|| panic!("no {name} in the PKI Secret"))
            .0
            .clone()
    };
    let text = |b: Vec<u8>| String::from_utf8(b).expect("PEM");
    let secret = secrets.get("ring-pki").await.expect("PKI Secret");
    let spec = Leaf::Scheduler.spec(&seed::ShootEndpoint::for_shoot(shoot));
    let (cert, key) = seed::pki::issue_for_days(
        &text(file(&secret, "ca.crt")),
        &text(file(&secret, "ca.key")),
        &spec,
        29,
    )
    .expect("issue");
    let cert_file = Leaf::Scheduler.cert_file();
    let key_file = cert_file.replace(".crt", ".key");
    let patch = serde_json::json!({"stringData": {cert_file.clone(): cert, key_file: key}});
    secrets
        .patch("ring-pki", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("aging the scheduler's certificate");
    let apiserver = pod_names(kc, &ns, "kube-apiserver");
    let scheduler = pod_names(kc, &ns, "kube-scheduler");
    assert_eq!(
        (apiserver.len(), scheduler.len()),
        (1, 1),
        "{apiserver:?} {scheduler:?}"
    );

    let renewed = seed.renew_certificates(shoot).await.expect("renew");
    assert_eq!(renewed, vec![Leaf::Scheduler]);
    let secret = secrets.get("ring-pki").await.expect("PKI Secret");
    let not_after = seed::expiry::not_after_pem(&file(&secret, &cert_file)).expect("certificate");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        not_after - now > 700 * 86_400,
        "renewed in the Secret for 730 days"
    );
    wait_for(
        "a new kube-scheduler pod, Ready, with the renewed kubeconfig",
        Duration::from_secs(120),
        || async {
            let pods = kubectl_json(kc, &["get", "pods", "-n", &ns, "-o", "json"]);
            let items = pods["items"].as_array()?.clone();
            items
                .iter()
                .any(|p| {
                    let name = p["metadata"]["name"].as_str().unwrap_or_default();
                    let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                    name.starts_with("kube-scheduler")
                        && !scheduler.iter().any(|o| o == name)
                        && ready
                })
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        pod_names(kc, &ns, "kube-apiserver"),
        apiserver,
        "kube-apiserver's pod kept"
    );
    // the scheduler's pods are made for the renewed kubeconfig
    let secret = secrets.get("ring-pki").await.expect("PKI Secret");
    let files: std::collections::BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let deployment = kubectl_json(kc, &["get", "deployment", "kube-scheduler", "-n", &ns]);
    let hash = seed::kubernetes::render::kubeconfig_hash(&files, seed::Component::KubeScheduler);
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]
            [seed::kubernetes::render::KUBECONFIG_HASH],
        hash.as_str(),
        "{deployment}"
    );
    assert_eq!(
        seed.renew_certificates(shoot).await.expect("renew"),
        vec![],
        "nothing due"
    );
}
