//! Hosted control planes on a local seed: real etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler processes on loopback.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use ring_tests::*;
use seed::{wait_ready, Component, ControlPlaneSpec, Phase, Seed};

const READY: Duration = Duration::from_secs(120);

async fn create_config_map(kubeconfig: &std::path::Path, ns: &str, name: &str, value: &str) {
    let client = kube_client(kubeconfig).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let cms: Api<ConfigMap> = Api::namespaced(client, ns);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("value".to_string(), value.to_string())])),
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("create configmap");
}

fn read_config_map(kubeconfig: &std::path::Path, ns: &str, name: &str) -> String {
    kubectl(
        kubeconfig,
        &[
            "get",
            "configmap",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.data.value}",
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_stop_and_start() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    let spec = ControlPlaneSpec::new("cp-keep");
    seed.start(&spec).await.expect("start");
    wait_ready(&seed, "cp-keep", READY).await.expect("ready");

    let kubeconfig = seed.layout("cp-keep").admin_kubeconfig();
    create_config_map(&kubeconfig, "team-a", "settings", "blue").await;
    assert_eq!(read_config_map(&kubeconfig, "team-a", "settings"), "blue");
    let status = seed.inspect("cp-keep").await.unwrap();
    assert_eq!(status.phase, Phase::Ready, "{status:?}");

    seed.stop("cp-keep").await.expect("stop");
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left after stop: {left:?}");
    assert_eq!(seed.inspect("cp-keep").await.unwrap().phase, Phase::Stopped);

    seed.start(&spec).await.expect("start again");
    wait_ready(&seed, "cp-keep", READY)
        .await
        .expect("ready again");
    assert_eq!(read_config_map(&kubeconfig, "team-a", "settings"), "blue");
    seed.stop("cp-keep").await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_side_by_side_keep_their_own_data() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    // b's seed serves the deprecated beta API versions, a's (the default) does not
    let seed_b = sandbox
        .seed()
        .with_deprecated_apis(seed::DeprecatedApis::Served);
    let (a, b) = (
        ControlPlaneSpec::new("cp-side-a"),
        ControlPlaneSpec::new("cp-side-b"),
    );
    assert_ne!(a.endpoint.address, b.endpoint.address);
    seed.start(&a).await.expect("start a");
    seed_b.start(&b).await.expect("start b");
    wait_ready(&seed, "cp-side-a", READY)
        .await
        .expect("a ready");
    wait_ready(&seed_b, "cp-side-b", READY)
        .await
        .expect("b ready");

    let (kc_a, kc_b) = (
        seed.layout("cp-side-a").admin_kubeconfig(),
        seed.layout("cp-side-b").admin_kubeconfig(),
    );
    create_config_map(&kc_a, "only-in-a", "marker", "a").await;
    create_config_map(&kc_b, "only-in-b", "marker", "b").await;
    assert_eq!(read_config_map(&kc_a, "only-in-a", "marker"), "a");
    assert_eq!(read_config_map(&kc_b, "only-in-b", "marker"), "b");
    let ns_a = kubectl(&kc_a, &["get", "namespaces", "-o", "name"]);
    let ns_b = kubectl(&kc_b, &["get", "namespaces", "-o", "name"]);
    assert!(
        ns_a.contains("namespace/only-in-a") && !ns_a.contains("only-in-b"),
        "{ns_a}"
    );
    assert!(
        ns_b.contains("namespace/only-in-b") && !ns_b.contains("only-in-a"),
        "{ns_b}"
    );
    // A second start of a running shoot is refused, not duplicated.
    let again = seed.start(&a).await.unwrap_err();
    assert!(again.to_string().contains("already supervised"), "{again}");

    // what kube-apiserver serves: the GA versions everywhere, the betas
    // only where asked for
    let (versions_a, versions_b) = (
        kubectl(&kc_a, &["api-versions"]),
        kubectl(&kc_b, &["api-versions"]),
    );
    let serves = |versions: &str, gv: &str| versions.lines().any(|l| l.trim() == gv);
    for gv in [
        "rbac.authorization.k8s.io/v1",
        "networking.k8s.io/v1",
        "policy/v1",
        "resource.k8s.io/v1",
    ] {
        assert!(serves(&versions_a, gv), "a lacks {gv}: {versions_a}");
        assert!(serves(&versions_b, gv), "b lacks {gv}: {versions_b}");
    }
    for gv in seed::apis::DEPRECATED_BETA_VERSIONS {
        assert!(!serves(&versions_a, gv), "a serves {gv}: {versions_a}");
        assert!(serves(&versions_b, gv), "b lacks {gv}: {versions_b}");
    }

    seed.stop("cp-side-a").await.unwrap();
    seed_b.stop("cp-side-b").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_apiserver_is_restarted_by_the_supervisor() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    seed.start(&ControlPlaneSpec::new("cp-crash"))
        .await
        .expect("start");
    wait_ready(&seed, "cp-crash", READY).await.expect("ready");
    let api = |s: &seed::ControlPlaneStatus| {
        s.components
            .iter()
            .find(|c| c.component == Component::KubeApiserver)
            .cloned()
            .unwrap()
    };
    let before = api(&seed.inspect("cp-crash").await.unwrap());
    let old_pid = before.state.pid.expect("apiserver pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let after = wait_for(
        "kube-apiserver to be restarted and ready",
        READY,
        || async {
            let status = seed.inspect("cp-crash").await.ok()?;
            let c = api(&status);
            (c.running && c.state.pid != Some(old_pid) && status.phase == Phase::Ready).then_some(c)
        },
    )
    .await;
    assert_eq!(after.state.restarts, before.state.restarts + 1);
    assert_eq!(after.state.last_exit.as_deref(), Some("signal 9 (SIGKILL)"));
    kubectl(
        &seed.layout("cp-crash").admin_kubeconfig(),
        &["get", "namespaces"],
    );
    seed.stop("cp-crash").await.unwrap();
}

/// A seed dropped in the process that started its control plane stops
/// supervising it: its components stop and are not started again (a test's
/// seed, dropped before its sandbox, left its dir behind that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_seed_stops_what_it_supervised() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    let spec = ControlPlaneSpec::new("cp-drop");
    seed.start_only(&spec, &[Component::Etcd])
        .await
        .expect("start etcd");
    wait_for("etcd to run", READY, || async {
        let status = seed.inspect("cp-drop").await.ok()?;
        status.components.iter().any(|c| c.running).then_some(())
    })
    .await;
    assert!(!sandbox.processes().is_empty(), "etcd runs in the sandbox");
    drop(seed);
    let left = sandbox.wait_no_processes(Duration::from_secs(30));
    assert!(
        left.is_empty(),
        "still running after the seed was dropped: {left:?}"
    );
}

/// The CLI end to end: `up` leaves a detached supervisor, `kubectl` works with the
/// printed kubeconfig, and kill -9 of that supervisor takes every component with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_up_status_down_and_supervisor_kill_leaves_no_orphans() {
    let sandbox = Sandbox::new();
    let up = ringctl_cmd(
        cli(
            &["controlplane", "up", "--shoot", "cp-cli", "-o", "json"],
            sandbox.path(),
        ),
        &[],
    );
    let up: serde_json::Value = serde_json::from_str(&expect_success(&up)).expect("json");
    assert_eq!(up["started"], true);
    assert_eq!(up["status"]["phase"], "Ready", "{up}");
    let kubeconfig = std::path::PathBuf::from(up["status"]["kubeconfig"].as_str().unwrap());
    // Ready is /readyz; kube-apiserver's bootstrap controller creates the
    // system namespaces right after (`default` once came 1 listing late)
    wait_for(
        "kube-apiserver's system namespaces",
        Duration::from_secs(30),
        || {
            let namespaces = kubectl(&kubeconfig, &["get", "namespaces", "-o", "name"]);
            let all = ["default", "kube-system", "kube-public", "kube-node-lease"]
                .iter()
                .all(|ns| namespaces.contains(&format!("namespace/{ns}")));
            async move { all.then_some(()) }
        },
    )
    .await;

    // up again is idempotent
    let again = ringctl_cmd(
        cli(&["controlplane", "up", "--shoot", "cp-cli"], sandbox.path()),
        &[],
    );
    assert!(expect_success(&again).contains("already running"));

    // table status names the kubeconfig and a kubectl line
    let table = expect_success(&ringctl_cmd(
        cli(&["controlplane", "status"], sandbox.path()),
        &[],
    ));
    assert!(
        table.contains("cp-cli")
            && table.contains("Ready")
            && table.contains("kubectl --kubeconfig"),
        "{table}"
    );

    // down, then up again: data dir reused
    let down = ringctl_cmd(
        cli(
            &["controlplane", "down", "--shoot", "cp-cli"],
            sandbox.path(),
        ),
        &[],
    );
    expect_success(&down);
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(left.is_empty(), "processes left after down: {left:?}");
    let up = ringctl_cmd(
        cli(
            &["controlplane", "up", "--shoot", "cp-cli", "-o", "json"],
            sandbox.path(),
        ),
        &[],
    );
    let up: serde_json::Value = serde_json::from_str(&expect_success(&up)).unwrap();
    let supervisor = up["status"]["supervisorPid"]
        .as_u64()
        .expect("supervisor pid") as i32;
    let components = sandbox.processes();
    assert!(
        components.len() >= 5,
        "supervisor + 4 components expected, saw {components:?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let left = sandbox.wait_no_processes(Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "orphans after kill -9 of the supervisor: {left:?}"
    );
}

fn cli(args: &[&str], dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    v.push("--state-dir".into());
    v.push(dir.into());
    v
}

#[test]
fn missing_binary_is_named_with_the_fix() {
    let sandbox = Sandbox::new();
    let empty = tempfile::tempdir().unwrap();
    let out = ringctl_cmd(
        cli(
            &["controlplane", "up", "--shoot", "cp-nobin"],
            sandbox.path(),
        ),
        &[
            ("RING_CACHE", empty.path().as_os_str()),
            ("PATH", "/usr/bin:/bin".as_ref()),
            ("RING_BIN_DIR", "".as_ref()),
        ],
    );
    let err = expect_clean_failure(&out);
    // the first program missing is named (etcd, unless /usr/bin has one)
    let named = ["etcd", "kube-apiserver"]
        .iter()
        .any(|b| err.contains(&format!("{b} not found")));
    assert!(named && err.contains("run scripts/setup"), "{err}");
    assert!(sandbox.processes().is_empty());
}

#[test]
fn unwritable_state_dir_is_a_clear_error() {
    let sandbox = Sandbox::new();
    let file = sandbox.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let out = ringctl_cmd(
        cli(
            &["controlplane", "up", "--shoot", "cp-rofs"],
            &file.join("state"),
        ),
        &[],
    );
    let err = expect_clean_failure(&out);
    assert!(
        err.contains("is not writable") && err.contains("choose a writable --state-dir"),
        "{err}"
    );
}

#[test]
fn port_already_taken_is_a_clear_error() {
    let sandbox = Sandbox::new();
    let _squatter = std::net::TcpListener::bind("127.61.0.7:6443").expect("bind squatter");
    let out = ringctl_cmd(
        cli(
            &[
                "controlplane",
                "up",
                "--shoot",
                "cp-port",
                "--api-address",
                "127.61.0.7",
            ],
            sandbox.path(),
        ),
        &[],
    );
    let err = expect_clean_failure(&out);
    assert!(
        err.contains("127.61.0.7:6443 (for kube-apiserver of shoot cp-port) is already in use"),
        "{err}"
    );
    assert!(
        sandbox.processes().is_empty(),
        "nothing may be left running"
    );
}

#[test]
fn corrupted_certificate_is_a_clear_error() {
    let sandbox = Sandbox::new();
    // `up` prepares the PKI before anything runs; corrupt it, then try again.
    let seed = sandbox.seed();
    seed.prepare(&ControlPlaneSpec::new("cp-badcert")).unwrap();
    let cert = seed
        .layout("cp-badcert")
        .pki()
        .leaf(seed::pki::Leaf::ApiServer)
        .cert;
    let mut pem = std::fs::read(&cert).unwrap();
    let mid = pem.len() / 2;
    pem[mid] = if pem[mid] == b'A' { b'B' } else { b'A' };
    std::fs::write(&cert, pem).unwrap();
    let out = ringctl_cmd(
        cli(
            &["controlplane", "up", "--shoot", "cp-badcert"],
            sandbox.path(),
        ),
        &[],
    );
    let err = expect_clean_failure(&out);
    assert!(err.contains("kube-apiserver.crt"), "{err}");
    assert!(sandbox.processes().is_empty());
}

#[test]
fn bad_shoot_name_is_rejected() {
    let sandbox = Sandbox::new();
    let out = ringctl_cmd(
        cli(
            &["controlplane", "up", "--shoot", "Bad_Name"],
            sandbox.path(),
        ),
        &[],
    );
    let err = expect_clean_failure(&out);
    assert!(
        err.contains("invalid shoot name") && err.contains("lowercase"),
        "{err}"
    );
}

/// What a restored self-hosted shoot's etcd still holds of the lost ring: its
/// control-plane workloads in `shoot--<ring>--*`, pods bound to a node that
/// will register again. `bootstrap::restore::stale::clear` removes them (the
/// pods at once: no kubelet runs them) and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_clears_the_lost_ring_s_pods_and_nothing_else() {
    let sandbox = Sandbox::new();
    let seed = sandbox.seed();
    seed.start(&ControlPlaneSpec::new("cp-dr"))
        .await
        .expect("start");
    wait_ready(&seed, "cp-dr", READY).await.expect("ready");
    let kubeconfig = seed.layout("cp-dr").admin_kubeconfig();
    let manifests = sandbox.path().join("lost-ring.yaml");
    std::fs::write(&manifests, LOST_RING).unwrap();
    kubectl(&kubeconfig, &["apply", "-f", manifests.to_str().unwrap()]);
    let pods = |ns: &str| {
        kubectl(&kubeconfig, &["get", "pods", "-n", ns, "-o", "name"])
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // the controllers made the Deployment's and the StatefulSet's pods
    wait_for("the lost ring's 3 pods", READY, || async {
        (pods("shoot--lost--m2").len() == 3).then_some(())
    })
    .await;
    let cleared = bootstrap::restore::stale::clear(&kubeconfig, "cp-dr", "lost")
        .await
        .expect("clear");
    assert_eq!(cleared, ["shoot--lost--m2"]);
    assert_eq!(pods("shoot--lost--m2"), Vec::<String>::new());
    for kind in ["deployments", "statefulsets", "replicasets"] {
        let left = kubectl(
            &kubeconfig,
            &["get", kind, "-n", "shoot--lost--m2", "-o", "name"],
        );
        assert!(left.trim().is_empty(), "{kind} left: {left}");
    }
    // another ring's namespace and the shoot's own workloads stay
    assert_eq!(pods("shoot--other--m2"), ["pod/etcd-0"]);
    assert_eq!(pods("team-a"), ["pod/app"]);
    seed.stop("cp-dr").await.expect("stop");
}

/// Objects as a lost self-hosted ring leaves them in a shoot: bound to node
/// `m1`, which does not exist here (no kubelet ever runs them). The service
/// accounts are there at once (the controller-manager makes them a bit later).
const LOST_RING: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shoot--lost--m2}
---
apiVersion: v1
kind: Namespace
metadata: {name: shoot--other--m2}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: shoot--lost--m2}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: shoot--other--m2}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: team-a}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kube-scheduler, namespace: shoot--lost--m2}
spec:
  replicas: 1
  selector: {matchLabels: {app: kube-scheduler}}
  template:
    metadata: {labels: {app: kube-scheduler}}
    spec: {nodeName: m1, containers: [{name: c, image: ring/kube-scheduler:0.1.0}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: etcd, namespace: shoot--lost--m2}
spec:
  replicas: 1
  serviceName: etcd
  selector: {matchLabels: {app: etcd}}
  template:
    metadata: {labels: {app: etcd}}
    spec: {nodeName: m1, containers: [{name: c, image: ring/etcd:0.1.0}]}
---
apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: shoot--lost--m2}
spec: {nodeName: m1, containers: [{name: c, image: ring/etcd:0.1.0}]}
---
apiVersion: v1
kind: Pod
metadata: {name: etcd-0, namespace: shoot--other--m2}
spec: {nodeName: m1, containers: [{name: c, image: ring/etcd:0.1.0}]}
---
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: team-a}
spec: {nodeName: m1, containers: [{name: c, image: ring/etcd:0.1.0}]}
"#;

/// kube-controller-manager started with Ring's arguments before its API
/// serves (as when a control plane's pods start together, or its API moved)
/// waits for the API in leader election instead of exiting: as a pod, each
/// exit backs its restart off by 10 s, then 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_manager_started_before_its_api_waits_for_it() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    // nothing listens there: the API is away
    let api = format!("https://127.0.0.1:{}", ring_tests::etcd::free_port());
    let kubeconfig = dir.join("kcm.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{api}\", insecure-skip-tls-verify: true}}\n\
         users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
    );
    std::fs::write(&kubeconfig, text).unwrap();
    let args = seed::process::manager_args(
        &kubeconfig.display().to_string(),
        "127.0.0.1",
        ring_tests::etcd::free_port(),
        &dir.join("certs").display().to_string(),
    );
    let log = dir.join("kcm.log");
    let mut kcm = std::process::Command::new(&binaries().kube_controller_manager)
        .args(&args)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting kube-controller-manager");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_ok(
        "kube-controller-manager waiting for its API in leader election",
        Duration::from_secs(60),
        || {
            let exited = kcm.try_wait().ok().flatten();
            let text = read_log();
            async move {
                if let Some(status) = exited {
                    panic!(
                        "kube-controller-manager exited ({status}) while its API was away:\n{text}"
                    );
                }
                // klog's wording: "Attempting to acquire leader lease..."
                match text
                    .to_lowercase()
                    .contains("attempting to acquire leader lease")
                {
                    true => Ok(()),
                    false => Err(format!("not yet; log so far:\n{text}")),
                }
            }
        },
    )
    .await;
    let _ = kcm.kill();
    let _ = kcm.wait();
}

#[path = "controlplane/certificates.rs"]
mod certificates;
#[path = "controlplane/standby.rs"]
mod standby;
#[path = "controlplane/supervision.rs"]
mod supervision;
