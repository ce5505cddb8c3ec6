//! Real nodes end to end: a 3-member ring whose every shoot gets a kubelet node
//! (containerd, kubelet, kube-proxy in the member's network namespace), pods
//! from every locally built image, Services, the node network, adoption of
//! running pods by a restarted node, `ringctl down` leaving nothing behind, and
//! a node that cannot register saying why; and self-hosting, a member's
//! successor moved into pods on the member's own node (`nodes/self_hosted.rs`).

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ring_tests::*;

#[path = "nodes/self_hosted.rs"]
mod self_hosted;

/// Kills the ring's nodes and removes their pods, shims, cgroups and network
/// when the test ends (also on failure); declared after the sandbox so it runs first.
struct NodesGuard(bootstrap::RingLayout);

impl Drop for NodesGuard {
    fn drop(&mut self) {
        bootstrap::nodes::kill_now(&self.0);
    }
}

fn image(name: &str) -> String {
    seed::images::reference(name).unwrap_or_else(|| panic!("no image {name} in seed::images"))
}

fn apply(kubeconfig: &Path, dir: &Path, name: &str, yaml: &str) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    kubectl(kubeconfig, &["apply", "-f", &file.display().to_string()]);
}

/// A pod that runs `command` once from `image` on the shoot's node.
fn one_shot(name: &str, image: &str, command: &[&str]) -> String {
    let cmd = serde_json::to_string(command).unwrap();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {image}\n    imagePullPolicy: Never\n    command: {cmd}\n"
    )
}

/// Waits (bounded) for pod `name` to reach `phase`; panics with its state otherwise.
async fn wait_phase(kubeconfig: &Path, name: &str, phase: &str) {
    let what = format!("pod {name} {phase}");
    wait_for(&what, Duration::from_secs(90), || async {
        let got = kubectl(
            kubeconfig,
            &["get", "pod", name, "-o", "jsonpath={.status.phase}"],
        );
        if got == "Failed" && phase != "Failed" {
            let detail = kubectl(kubeconfig, &["get", "pod", name, "-o", "yaml"]);
            panic!("pod {name} failed:\n{detail}");
        }
        (got == phase).then_some(())
    })
    .await
}

fn pod_ip(kubeconfig: &Path, name: &str) -> String {
    kubectl(
        kubeconfig,
        &["get", "pod", name, "-o", "jsonpath={.status.podIP}"],
    )
}

fn etcd_pod(name: &str, extra: &str, port: u16) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: {name}}}}}
spec:
  {extra}
  containers:
  - name: etcd
    image: {image}
    imagePullPolicy: Never
    command: [etcd]
    args: [--name=e, --data-dir=/tmp/e, "--listen-client-urls=http://0.0.0.0:{port}", "--advertise-client-urls=http://127.0.0.1:{port}", "--listen-peer-urls=http://127.0.0.1:{peer}", "--initial-advertise-peer-urls=http://127.0.0.1:{peer}", "--initial-cluster=e=http://127.0.0.1:{peer}"]
"#,
        image = image("etcd"),
        peer = port + 1
    )
}

/// The nodes as `ringctl status -o json` reports them.
/// Node `node`'s kubelet renewed its client certificate through its shoot:
/// a CSR of `system:node:<node>` approved and signed, and the kubelet holds
/// a certificate for its name that is not the one it was configured with.
async fn client_certificate_renewed(layout: &bootstrap::RingLayout, kubeconfig: &Path, node: &str) {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(kube_client(kubeconfig).await);
    let user = format!("system:node:{node}");
    wait_for(
        &format!("an approved and signed client certificate request of {user}"),
        Duration::from_secs(90),
        || async {
            let list = csrs.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|c| {
                let status = c.status.as_ref();
                let approved = status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Approved"));
                let signed = status.is_some_and(|s| s.certificate.is_some());
                c.spec.username.as_deref() == Some(user.as_str()) && approved && signed
            })
        },
    )
    .await;
    let node_layout = bootstrap::nodes::node_config(layout, node)
        .expect("the node's config")
        .layout();
    let configured = std::fs::read(node_layout.node_cert().cert).unwrap();
    let current_file = node_layout
        .kubelet_root()
        .join("pki/kubelet-client-current.pem");
    let current = wait_for(
        "the kubelet's renewed certificate on disk",
        Duration::from_secs(30),
        || {
            let f = current_file.clone();
            async move { std::fs::read(f).ok() }
        },
    )
    .await;
    let infos = seed::expiry::infos_pem(&current).unwrap();
    assert_eq!(
        seed::expiry::common_name_pem(&current).as_deref(),
        Some(user.as_str())
    );
    assert!(
        !infos.is_empty()
            && !String::from_utf8_lossy(&current)
                .contains(String::from_utf8_lossy(&configured).trim()),
        "the kubelet still holds the configured certificate"
    );
    // `ringctl pki check` reports the certificate the kubelet uses now
    let check = ringctl_in(&layout.dir, &["pki", "check", "-o", "json"]);
    let check: serde_json::Value = serde_json::from_str(&check).unwrap();
    let kubelet = check["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == format!("node {node} kubelet"))
        .unwrap_or_else(|| panic!("no kubelet certificate of node {node}: {check}"))
        .clone();
    assert_eq!(
        kubelet["source"],
        current_file.display().to_string(),
        "{kubelet}"
    );
}

fn nodes_status(dir: &Path) -> Vec<serde_json::Value> {
    let out = ringctl_in(dir, &["status", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("status json");
    v["nodes"].as_array().cloned().unwrap_or_default()
}

fn mounts_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_register_run_pods_from_every_image_adopt_pods_and_leave_nothing() {
    let _slot = ring_slot();
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("ring");
    let layout = bootstrap::RingLayout { dir: dir.clone() };
    let _nodes = NodesGuard(layout.clone());
    let config = ring_config_with(sandbox.path(), 3, "nodes: {perMember: 2}");
    let boot = ringctl_in(
        &dir,
        &["bootstrap", "--config", &config.display().to_string()],
    );
    assert!(boot.contains("nodes:"), "{boot}");
    let kc = |s: &str| dir.join("kubeconfigs").join(format!("{s}.kubeconfig"));

    // every shoot lists its own two Ready nodes (`nodes.perMember: 2`), registered
    // as system:node:<node>
    for m in ["m1", "m2", "m3"] {
        let second = format!("{m}-2");
        for node in [m, second.as_str()] {
            let ready = kubectl(
                &kc(m),
                &[
                    "get",
                    "node",
                    node,
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
                ],
            );
            assert_eq!(ready, "True", "node {node} in shoot {m}");
        }
        let nodes = kubectl(&kc(m), &["get", "nodes", "-o", "name"]);
        let mut nodes: Vec<&str> = nodes.lines().collect();
        nodes.sort();
        assert_eq!(
            nodes,
            [format!("node/{m}"), format!("node/{m}-2")],
            "shoot {m} has exactly its own nodes"
        );
    }
    // a node reaches no cloud metadata service: a connection fails at once
    // (through the host it would hang, and kubelet would wait at every start)
    let ring = layout.read_config().unwrap().unwrap();
    let network = bootstrap::nodes::network(&layout, &ring).unwrap().unwrap();
    for host in &network.hosts {
        let out = std::process::Command::new("timeout")
            .args(["5", "ip", "netns", "exec", &host.netns, "bash", "-c"])
            .arg("echo > /dev/tcp/169.254.169.254/80")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("No route to host"),
            "node {}: {out:?}",
            host.name
        );
    }
    let status = nodes_status(&dir);
    assert_eq!(status.len(), 6, "{status:?}");
    for n in &status {
        assert_eq!(n["ready"], true, "{n}");
        assert!(n["kubeletRssMib"].as_f64().unwrap() > 10.0, "{n}");
        assert!(n["containerdRssMib"].as_f64().unwrap() > 5.0, "{n}");
    }

    client_certificate_renewed(&layout, &kc("m1"), "m1").await;

    // `ringctl pki renew --all` also renews every node's kube-proxy
    // certificate from its shoot's CA; each node takes its new one without a
    // restart (ring-node restarts kube-proxy with it and reports it in use),
    // and the Service and cluster DNS checks below run on it
    let out = ringctl_in(&dir, &["pki", "renew", "--all", "-o", "json"]);
    let renewed: serde_json::Value = serde_json::from_str(&out).expect("json renewal");
    let proxies: Vec<&serde_json::Value> = renewed
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.ends_with(" kube-proxy"))
        })
        .collect();
    assert_eq!(proxies.len(), 6, "{out}");
    for r in proxies {
        assert_eq!(r["inUse"], true, "{out}");
    }
    let log = std::fs::read_to_string(bootstrap::nodes::log_file(&layout, "m1-2")).unwrap();
    assert!(
        log.contains("use kube-proxy's renewed certificate"),
        "node m1-2 did not restart kube-proxy: {log}"
    );

    // pods from every image, once kube-controller-manager made the namespace's
    // default service account (admission refuses a pod without it)
    let m1 = kc("m1");
    let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(kube_client(&m1).await, "default");
    wait_for(
        "the default service account of shoot m1",
        Duration::from_secs(120),
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await;
    // a node imports the control plane's images only; the others (ringd and
    // kube-proxy run on the node as processes) go in by hand, as a user's own
    // would: `ringctl images import --address` into each node of shoot m1
    for node in ["m1", "m1-2"] {
        let socket = bootstrap::nodes::node_config(&layout, node)
            .expect("the node's config")
            .layout()
            .containerd_socket();
        let ctr = seed::BinarySearch::standard(None).find("ctr").unwrap();
        let listed = seed::images::listed(&ctr, &socket).unwrap();
        let ringd = seed::images::reference("ringd").unwrap();
        assert!(
            !listed.contains_key(&ringd),
            "node {node} imported {ringd} at start: {listed:?}"
        );
        let address = socket.display().to_string();
        expect_success(&ringctl_cmd(
            ["images", "import", "--address", address.as_str()],
            &[],
        ));
        let listed = seed::images::listed(&ctr, &socket).unwrap();
        assert!(listed.contains_key(&ringd), "{listed:?}");
    }
    let work = sandbox.path().join("manifests");
    std::fs::create_dir_all(&work).unwrap();
    for (pod, img, cmd) in [
        ("ringd-version", "ringd", vec!["ringd", "--version"]),
        (
            "proxy-version",
            "kube-proxy",
            vec!["kube-proxy", "--version"],
        ),
        (
            "kcm-version",
            "kube-controller-manager",
            vec!["kube-controller-manager", "--version"],
        ),
        (
            "sched-version",
            "kube-scheduler",
            vec!["kube-scheduler", "--version"],
        ),
    ] {
        apply(&m1, &work, pod, &one_shot(pod, &image(img), &cmd));
        wait_phase(&m1, pod, "Succeeded").await;
        let log = kubectl(&m1, &["logs", pod]);
        assert!(!log.trim().is_empty(), "{pod} printed nothing");
        if img == "ringd" {
            assert!(log.contains(env!("CARGO_PKG_VERSION")), "{log}");
        } else {
            assert!(log.contains(seed::binaries::K8S_VERSION), "{pod}: {log}");
        }
    }

    // etcd in a pod answers `endpoint health` from the host (root namespace → pod IP)
    apply(&m1, &work, "etcd", &etcd_pod("etcd", "nodeName: m1", 2379));
    wait_phase(&m1, "etcd", "Running").await;
    let ip = pod_ip(&m1, "etcd");
    let endpoint = format!("http://{ip}:2379");
    wait_for(
        "etcd pod healthy from the host",
        Duration::from_secs(30),
        || {
            let endpoint = endpoint.clone();
            async move {
                let out = run_bounded(
                    std::process::Command::new(ring_tests::etcd::etcdctl_bin()).args([
                        "--endpoints",
                        &endpoint,
                        "endpoint",
                        "health",
                    ]),
                    Duration::from_secs(10),
                );
                out.status.success().then_some(())
            }
        },
    )
    .await;

    // a pod reaches a ClusterIP Service on the same node (kube-proxy's rules)
    apply(
        &m1,
        &work,
        "etcd-svc",
        "apiVersion: v1\nkind: Service\nmetadata: {name: etcd}\nspec:\n  selector: {app: etcd}\n  ports: [{port: 2379}]\n",
    );
    let cluster_ip = kubectl(
        &m1,
        &["get", "svc", "etcd", "-o", "jsonpath={.spec.clusterIP}"],
    );
    let svc = format!("http://{cluster_ip}:2379");
    apply(
        &m1,
        &work,
        "svc-probe",
        &one_shot(
            "svc-probe",
            &image("etcd"),
            &["etcdctl", "--endpoints", &svc, "endpoint", "health"],
        ),
    );
    wait_phase(&m1, "svc-probe", "Succeeded").await;

    // ... and by its name, through the node's cluster DNS (search path applied)
    let by_name = "http://etcd.default.svc:2379";
    apply(
        &m1,
        &work,
        "dns-probe",
        &one_shot(
            "dns-probe",
            &image("etcd"),
            &["etcdctl", "--endpoints", by_name, "endpoint", "health"],
        ),
    );
    wait_phase(&m1, "dns-probe", "Succeeded").await;

    // a pod reaches its own shoot's API through the `kubernetes` Service (TLS
    // verified, authenticated by its service account token)
    apply(
        &m1,
        &work,
        "in-cluster",
        &one_shot(
            "in-cluster",
            &image("kube-scheduler"),
            &["kube-scheduler", "--leader-elect=false"],
        ),
    );
    wait_for(
        "a pod's in-cluster client answered by its shoot's API",
        Duration::from_secs(60),
        || async {
            let out = run_bounded(
                std::process::Command::new(kubectl_path())
                    .arg("--kubeconfig")
                    .arg(&m1)
                    .args(["logs", "in-cluster"]),
                Duration::from_secs(10),
            );
            // klog quotes the user, escaped in a structured line
            let log = String::from_utf8_lossy(&out.stdout).replace(r#"\""#, "\"");
            log.contains(r#"User "system:serviceaccount:default:default" cannot"#)
                .then_some(())
        },
    )
    .await;
    kubectl(
        &m1,
        &["delete", "pod", "in-cluster", "--grace-period=0", "--force"],
    );

    // a pod on m1's node reaches another member's node address on the hub bridge
    let m2 = kc("m2");
    apply(
        &m2,
        &work,
        "hostnet-etcd",
        &etcd_pod("hostnet-etcd", "hostNetwork: true\n  nodeName: m2", 22379),
    );
    wait_phase(&m2, "hostnet-etcd", "Running").await;
    let m2_address = kubectl(
        &m2,
        &[
            "get",
            "node",
            "m2",
            "-o",
            r#"jsonpath={.status.addresses[?(@.type=="InternalIP")].address}"#,
        ],
    );
    assert!(m2_address.starts_with("198.19."), "{m2_address}");
    let hub = format!("http://{m2_address}:22379");
    apply(
        &m1,
        &work,
        "hub-probe",
        &one_shot(
            "hub-probe",
            &image("etcd"),
            &["etcdctl", "--endpoints", &hub, "endpoint", "health"],
        ),
    );
    wait_phase(&m1, "hub-probe", "Succeeded").await;

    // kube-apiserver in a pod with its PKI mounted from a Secret answers /readyz
    apiserver_pod(&m1, &work, sandbox.path(), &ip).await;

    // a killed node supervisor leaves its pods running; the next start adopts them
    let etcd_pid = pod_process();
    let m1_node = bootstrap::nodes::running_pid(&layout, "m1").expect("ring-node m1 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m1_node as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_for("ring-node m1 gone", Duration::from_secs(10), || async {
        bootstrap::nodes::running_pid(&layout, "m1")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        seed::process::pid_alive(etcd_pid),
        "the etcd pod died with its node's supervisor"
    );
    ringctl_in(&dir, &["bootstrap"]);
    assert!(
        seed::process::pid_alive(etcd_pid),
        "the restarted node replaced the running pod"
    );
    let restarts = kubectl(
        &m1,
        &[
            "get",
            "pod",
            "etcd",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
    );
    assert_eq!(restarts, "0", "the adopted container was restarted");

    // `ringctl down` leaves no pod, shim, mount, cgroup or namespace behind
    let nodes: Vec<seed::node::NodeConfig> = ["m1", "m1-2", "m2", "m2-2", "m3", "m3-2"]
        .iter()
        .map(|m| {
            seed::node::NodeConfig::load(&bootstrap::nodes::node_dir(&layout, m).join("node.yaml"))
                .unwrap()
        })
        .collect();
    ringctl_in(&dir, &["down"]);
    assert!(
        !seed::process::pid_alive(etcd_pid),
        "the etcd pod outlived `ringctl down`"
    );
    for n in &nodes {
        assert!(
            seed::node::teardown::pod_pids(&n.cgroup_root).is_empty(),
            "pods of {} left",
            n.name
        );
        assert!(
            seed::node::teardown::cgroup_dirs(&n.cgroup_root).is_empty(),
            "cgroups of {} left",
            n.name
        );
        assert!(
            seed::node::teardown::shim_pids(&n.layout().containerd_socket()).is_empty(),
            "shims of {} left",
            n.name
        );
        assert!(!seed::netns::exists(&n.netns), "namespace {} left", n.netns);
        assert!(
            mounts_mentioning(&n.run_dir.display().to_string()).is_empty(),
            "mounts of {} left",
            n.name
        );
    }
    assert!(
        mounts_mentioning(&dir.display().to_string()).is_empty(),
        "mounts under the ring dir left"
    );
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left after down: {left:?}");

    // the next bootstrap brings the nodes back and their pods run again
    ringctl_in(&dir, &["bootstrap"]);
    wait_phase(&m1, "etcd", "Running").await;
    assert!(nodes_status(&dir).iter().all(|n| n["ready"] == true));

    // a node whose certificate its shoot does not accept says so in `ringctl status`
    bad_certificate_is_reported(&layout, &dir).await;

    // m1's ringd killed: `ringctl status` still answers (from another member), and
    // node m2 stays Ready in shoot m2 once m2's control plane moved off m1
    ringd_killed_node_stays(&layout, &dir, &kc("m2")).await;
}

async fn ringd_killed_node_stays(layout: &bootstrap::RingLayout, dir: &Path, m2: &Path) {
    let pid = layout.running_pid("m1").expect("ringd m1 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let moved = wait_for(
        "m2's control plane serving again off m1",
        Duration::from_secs(120),
        || async {
            let out = ringctl_cmd(
                [
                    "status",
                    "-o",
                    "json",
                    "--ring-dir",
                    &dir.display().to_string(),
                ],
                &[],
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let p = v["placements"]
                .as_array()?
                .iter()
                .find(|p| p["shoot"] == "m2")?
                .clone();
            (p["host"] != "m1" && p["ready"] == true).then_some(p)
        },
    )
    .await;
    assert_ne!(moved["host"], "m1", "{moved}");
    // kubelet renews its Lease every 10 s: a renewal after the move went to the new host
    let renew = || {
        let out = run_bounded(
            std::process::Command::new(kubectl_path())
                .arg("--kubeconfig")
                .arg(m2)
                .args(["get", "lease", "m2", "-n", "kube-node-lease"])
                .args(["-o", "jsonpath={.spec.renewTime}"]),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = renew();
    wait_for(
        "node m2 renewing its lease after the failover",
        Duration::from_secs(60),
        || {
            let now = renew();
            let before = before.clone();
            async move { (!now.is_empty() && now != before).then_some(()) }
        },
    )
    .await;
    wait_for(
        "node m2 Ready in `ringctl status`",
        Duration::from_secs(30),
        || async {
            nodes_status(dir)
                .iter()
                .any(|n| n["node"] == "m2" && n["ready"] == true)
                .then_some(())
        },
    )
    .await;
}

/// The host pid of the etcd pod's server (listening on 0.0.0.0:2379).
fn pod_process() -> u32 {
    let found = scenarios::procs::processes_mentioning("--data-dir=/tmp/e");
    found
        .into_iter()
        .map(|(pid, _, _)| pid)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    c.windows(b"0.0.0.0:2379".len())
                        .any(|w| w == b"0.0.0.0:2379")
                })
                .unwrap_or(false)
        })
        .expect("the etcd pod's process")
}

/// kube-apiserver as a pod of shoot m1, its certificates from a Secret, backed by
/// the etcd pod at `etcd_ip`; asked for /readyz from the host.
async fn apiserver_pod(kubeconfig: &Path, work: &Path, sandbox: &Path, etcd_ip: &str) {
    let shoot = "podapi";
    let pki = seed::pki::Pki::new(sandbox.join("podapi-pki"));
    pki.ensure(shoot, &seed::ShootEndpoint::for_shoot(shoot))
        .unwrap();
    let api = pki.leaf(seed::pki::Leaf::ApiServer);
    let files: Vec<(&str, PathBuf)> = vec![
        ("ca.crt", pki.ca().cert),
        ("tls.crt", api.cert),
        ("tls.key", api.key),
        ("sa.pub", pki.service_account_pub()),
        ("sa.key", pki.service_account_key()),
    ];
    let mut args = vec![
        "create".to_string(),
        "secret".into(),
        "generic".into(),
        "podapi-pki".into(),
    ];
    for (k, f) in &files {
        args.push(format!("--from-file={k}={}", f.display()));
    }
    kubectl(
        kubeconfig,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: podapi}}
spec:
  volumes: [{{name: pki, secret: {{secretName: podapi-pki}}}}]
  containers:
  - name: kube-apiserver
    image: {image}
    imagePullPolicy: Never
    command: [kube-apiserver]
    args: ["--etcd-servers=http://{etcd_ip}:2379", --etcd-prefix=/podapi, --secure-port=6443, --tls-cert-file=/pki/tls.crt, --tls-private-key-file=/pki/tls.key, --client-ca-file=/pki/ca.crt, --service-account-key-file=/pki/sa.pub, --service-account-signing-key-file=/pki/sa.key, --service-account-issuer=https://kubernetes.default.svc, --service-cluster-ip-range=10.0.0.0/24, --authorization-mode=RBAC]
    volumeMounts: [{{name: pki, mountPath: /pki, readOnly: true}}]
"#,
        image = image("kube-apiserver")
    );
    apply(kubeconfig, work, "podapi", &yaml);
    wait_phase(kubeconfig, "podapi", "Running").await;
    let ip = pod_ip(kubeconfig, "podapi");
    let admin = sandbox.join("podapi.kubeconfig");
    seed::kubeconfig::write(
        &admin,
        shoot,
        "admin",
        &format!("https://{ip}:6443"),
        &pki,
        &pki.leaf(seed::pki::Leaf::Admin),
    )
    .unwrap();
    wait_for(
        "kube-apiserver pod /readyz",
        Duration::from_secs(60),
        || {
            let admin = admin.clone();
            async move {
                let mut cmd = std::process::Command::new(kubectl_path());
                // the serving certificate names the shoot's loopback address, not the pod IP
                cmd.args([
                    "--kubeconfig",
                    &admin.display().to_string(),
                    "--tls-server-name",
                    "127.0.0.1",
                    "get",
                    "--raw",
                    "/readyz",
                ]);
                let out = run_bounded(&mut cmd, Duration::from_secs(10));
                (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
                    .then_some(())
            }
        },
    )
    .await;
}

/// m3's node gets a certificate from another CA: bootstrap times out naming the
/// certificate, and `ringctl status` shows the same reason.
async fn bad_certificate_is_reported(layout: &bootstrap::RingLayout, dir: &Path) {
    let pki = bootstrap::nodes::node_dir(layout, "m3").join("pki");
    let (ca, ca_key) = seed::pki::new_ca("someone-else").unwrap();
    let spec = seed::pki::LeafSpec {
        common_name: "system:node:m3",
        organizations: &["system:nodes"],
        ips: vec![],
        dns_names: vec![],
        server: false,
        client: true,
    };
    let (cert, key) = seed::pki::issue(&ca, &ca_key, &spec).unwrap();
    std::fs::write(pki.join("node.crt"), cert).unwrap();
    std::fs::write(pki.join("node.key"), key).unwrap();
    let pid = bootstrap::nodes::running_pid(layout, "m3").expect("ring-node m3 runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("ring-node m3 stopped", Duration::from_secs(60), || async {
        bootstrap::nodes::running_pid(layout, "m3")
            .is_none()
            .then_some(())
    })
    .await;
    let out = ringctl_cmd(
        [
            "bootstrap",
            "--timeout",
            "45",
            "--ring-dir",
            &dir.display().to_string(),
        ],
        &[],
    );
    let err = expect_clean_failure(&out);
    assert!(
        err.contains("node m3") && err.contains("certificate"),
        "{err}"
    );
    let m3 = nodes_status(dir)
        .into_iter()
        .find(|n| n["node"] == "m3")
        .unwrap();
    assert_eq!(m3["ready"], false, "{m3}");
    assert!(
        m3["problem"].as_str().unwrap_or("").contains("certificate"),
        "{m3}"
    );
}
