//! A hosted control plane backed up and restored into a new seed, and the
//! temporary etcd a restore runs (dies with its process, TLS only).

use super::*;

/// The whole story on a hosted control plane: `ringctl backup start` against a
/// running shoot, writes through the API, a restore into a new seed's data dir,
/// a control plane started on it, and kubectl reading the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosted_control_plane_is_backed_up_and_restored_into_a_new_seed() {
    use seed::{wait_ready, ControlPlaneSpec, Seed};
    let sandbox = Sandbox::new();
    let state = sandbox.path().join("seed-a");
    let seed_a = seed::LocalSeed::new(&state, binaries());
    let spec = ControlPlaneSpec::new("bk-shoot");
    seed_a.start(&spec).await.expect("start");
    wait_ready(&seed_a, "bk-shoot", Duration::from_secs(120))
        .await
        .expect("ready");
    let kubeconfig = seed_a.layout("bk-shoot").admin_kubeconfig();
    kubectl(&kubeconfig, &["create", "namespace", "team-a"]);
    // Creates a ConfigMap; returns its resourceVersion (etcd's revision of the write).
    let create = |name: &str, value: &str| -> i64 {
        let literal = format!("--from-literal=v={value}");
        let args = [
            "-n",
            "team-a",
            "create",
            "configmap",
            name,
            literal.as_str(),
        ];
        let rv = kubectl(
            &kubeconfig,
            &[&args[..], &["-o", "jsonpath={.metadata.resourceVersion}"]].concat(),
        );
        rv.trim().parse().expect("resourceVersion")
    };
    create("before", "full");

    let bucket = format!("file://{}", sandbox.path().join("bucket").display());
    let log = std::fs::File::create(sandbox.path().join("backup.log")).unwrap();
    let mut backup = std::process::Command::new(ringctl())
        .args([
            "backup", "start", "--shoot", "bk-shoot", "--bucket", &bucket,
        ])
        .args(["--delta-period-ms", "200"])
        .arg("--state-dir")
        .arg(&state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("ringctl backup start");
    for i in 0..5 {
        create(&format!("after-{i}"), &format!("delta-{i}"));
    }
    kubectl(
        &kubeconfig,
        &["-n", "team-a", "delete", "configmap", "after-0"],
    );
    let rv = create("last", "last");
    let list = || {
        ringctl_backup(
            &[
                "list", "--shoot", "bk-shoot", "--bucket", &bucket, "-o", "json",
            ],
            None,
        )
    };
    wait_for("the last write in the bucket", WAIT, || {
        let out = list();
        async move {
            let c: backup::Catalog = serde_json::from_slice(&out.stdout).ok()?;
            (c.latest_revision()? >= rv && !c.fulls.is_empty()).then_some(())
        }
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(backup.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_for("ringctl backup start to exit", WAIT, || {
        let s = backup.try_wait().ok().flatten();
        async move { s }
    })
    .await;
    assert!(
        status.success(),
        "ringctl backup start exited with {status}"
    );
    seed_a.stop("bk-shoot").await.expect("stop");

    // A new seed gets the shoot's spec and PKI, and etcd data from the bucket alone.
    let state_b = sandbox.path().join("seed-b");
    let shoot_b = state_b.join("shoots/bk-shoot");
    copy_dir(
        &seed_a.layout("bk-shoot").dir.join("pki"),
        &shoot_b.join("pki"),
    );
    std::fs::copy(
        seed_a.layout("bk-shoot").spec_file(),
        shoot_b.join("shoot.json"),
    )
    .unwrap();
    let data_b = shoot_b.join("etcd").display().to_string();
    let state_b_arg = state_b.display().to_string();
    let restore_b = || {
        ringctl_backup(
            &[
                "restore",
                "--shoot",
                "bk-shoot",
                "--bucket",
                &bucket,
                "--data-dir",
                &data_b,
                "--state-dir",
                &state_b_arg,
            ],
            None,
        )
    };
    let text = expect_success(&restore_b());
    assert!(text.contains("verified"), "{text}");
    // a second restore into the same (now filled) data dir is refused
    let out = restore_b();
    assert!(expect_clean_failure(&out).contains("not empty"));

    let seed_b = seed::LocalSeed::new(&state_b, binaries());
    seed_b
        .start(&spec)
        .await
        .expect("start on the restored data");
    wait_ready(&seed_b, "bk-shoot", Duration::from_secs(120))
        .await
        .expect("ready");
    let kc_b = seed_b.layout("bk-shoot").admin_kubeconfig();
    let names = kubectl(
        &kc_b,
        &[
            "-n",
            "team-a",
            "get",
            "configmaps",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.data.v} {end}",
        ],
    );
    for want in [
        "before=full",
        "after-1=delta-1",
        "after-4=delta-4",
        "last=last",
    ] {
        assert!(names.contains(want), "{want} missing from {names}");
    }
    assert!(
        !names.contains("after-0="),
        "a deleted object came back: {names}"
    );
    let rv_b: i64 = kubectl(
        &kc_b,
        &[
            "-n",
            "team-a",
            "get",
            "configmap",
            "last",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    )
    .trim()
    .parse()
    .unwrap();
    assert_eq!(rv_b, rv, "resourceVersions are etcd's own revisions");
    seed_b.stop("bk-shoot").await.expect("stop");
}

/// Set for the helper process of
/// [`a_temporary_etcd_dies_with_the_process_that_started_it`]: its dir.
const TEMP_ETCD_HELPER: &str = "RING_TEST_TEMP_ETCD_DIR";

/// The helper process's body, run by the test below as this test binary
/// (ignored on its own): starts a temporary etcd in the given dir, says so,
/// and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of a_temporary_etcd_dies_with_the_process_that_started_it"]
async fn temp_etcd_helper_process() {
    let dir = PathBuf::from(std::env::var(TEMP_ETCD_HELPER).expect("run by the test below"));
    let _etcd = TempEtcd::start(&etcd_bin(), &dir.join("data"), "t", &dir.join("etcd.log"))
        .await
        .expect("temporary etcd");
    println!("etcd ready");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

/// A restore killed with -9 (ringctl, ringd, an init container) takes its
/// temporary etcd with it: nothing else would ever stop that etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_etcd_dies_with_the_process_that_started_it() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("temp-etcd");
    std::fs::create_dir_all(&dir).unwrap();
    let mut helper = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hosted::temp_etcd_helper_process",
            "--ignored",
            "--nocapture",
        ])
        .env(TEMP_ETCD_HELPER, &dir)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("helper process");
    let data = dir.join("data");
    wait_for("the helper's temporary etcd", WAIT, || async {
        (!processes_mentioning(&data).is_empty()).then_some(())
    })
    .await;
    helper.start_kill().unwrap();
    helper.wait().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut left = processes_mentioning(&data);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = processes_mentioning(&data);
    }
    for pid in &left {
        // SAFETY: plain kill(2) of a pid this test's helper started
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "etcd {left:?} outlived the process that started it by 10 s"
    );
}

/// A restore's temporary etcd talks only TLS with its own client
/// certificate: a plain client, or a TLS client without the certificate,
/// gets nothing; its throwaway PKI is private and gone once it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_etcd_answers_only_clients_with_its_certificate() {
    use std::os::unix::fs::PermissionsExt;
    let sandbox = Sandbox::new();
    let dir = sandbox.path().join("temp-etcd");
    std::fs::create_dir_all(&dir).unwrap();
    let mut etcd = TempEtcd::start(&etcd_bin(), &dir.join("data"), "t", &dir.join("etcd.log"))
        .await
        .expect("temporary etcd");
    let mut c = etcd.client().await.expect("client with the certificate");
    c.put("k", "v", None)
        .await
        .expect("a write with the certificate");

    let port = etcd.url.rsplit(':').next().unwrap().to_string();
    let plain = backup::config::EtcdConfig::plain(format!("http://127.0.0.1:{port}"));
    let mut anonymous = etcd.config();
    anonymous.cert_file = None;
    anonymous.key_file = None;
    for (what, config) in [("plain", plain), ("no client certificate", anonymous)] {
        let answered = match backup::etcd::connect(&config).await {
            Ok(mut c) => tokio::time::timeout(Duration::from_secs(5), c.get("k", None))
                .await
                .is_ok_and(|r| r.is_ok()),
            Err(_) => false,
        };
        assert!(!answered, "the temporary etcd answered a {what} client");
    }

    let ca = etcd.config().ca_file.unwrap();
    let tls_dir = ca.parent().unwrap().to_path_buf();
    let mode = std::fs::metadata(&tls_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", tls_dir.display());
    etcd.stop().await;
    drop(etcd);
    assert!(!tls_dir.exists(), "{} left behind", tls_dir.display());
}
