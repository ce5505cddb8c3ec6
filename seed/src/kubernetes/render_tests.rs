//! Golden and shape tests of the rendered control plane.

use super::*;

/// Compares `actual` with the golden file, or rewrites it with `RING_UPDATE_GOLDEN=1`.
pub(crate) fn golden(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("RING_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; create it with RING_UPDATE_GOLDEN=1",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs from the rendering; review and rerun with RING_UPDATE_GOLDEN=1\n--- actual ---\n{actual}",
        path.display()
    );
}

fn render(config: &KubernetesSeedConfig) -> String {
    render_wired(config, &Wiring::default())
}

fn render_wired(config: &KubernetesSeedConfig, wiring: &Wiring) -> String {
    let spec = ControlPlaneSpec::new("alpha");
    let r = Renderer {
        ring: "demo",
        spec: &spec,
        config,
        wiring,
        node_dir: config
            .lease_from_node
            .then(|| "/ring/members/m3/seed/shoots/alpha/pods".into()),
        apis: Default::default(),
    };
    let owner = Owner {
        name: ANCHOR.into(),
        uid: "00000000-0000-0000-0000-000000000001".into(),
    };
    let pki = BTreeMap::from([
        ("ca.crt".to_string(), b"CA CERT".to_vec()),
        ("ca.key".to_string(), b"CA KEY".to_vec()),
    ]);
    let mut all = vec![r.namespace(), r.anchor()];
    all.extend(r.objects(&owner, &pki));
    to_yaml(&all)
}

/// The objects owned by the anchor (uid `u1`) of shoot alpha in ring demo.
fn owned_objects(wiring: &Wiring) -> Vec<Value> {
    owned_objects_serving(wiring, Default::default())
}

/// [`owned_objects`], kube-apiserver serving the deprecated betas per `apis`.
fn owned_objects_serving(wiring: &Wiring, apis: crate::DeprecatedApis) -> Vec<Value> {
    let config = KubernetesSeedConfig::new("demo");
    let spec = ControlPlaneSpec::new("alpha");
    let r = Renderer {
        ring: "demo",
        spec: &spec,
        config: &config,
        wiring,
        node_dir: None,
        apis,
    };
    let owner = Owner {
        name: ANCHOR.into(),
        uid: "u1".into(),
    };
    r.objects(&owner, &BTreeMap::new())
}

#[test]
fn control_plane_objects_match_golden_file() {
    golden(
        "control-plane.yaml",
        &render(&KubernetesSeedConfig::new("demo")),
    );
}

/// kube-apiserver's arguments when rendered with `apis`.
fn apiserver_args(apis: crate::DeprecatedApis) -> Vec<String> {
    let objects = owned_objects_serving(&Wiring::default(), apis);
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "kube-apiserver")
        .expect("kube-apiserver's Deployment");
    let args = &deployment["spec"]["template"]["spec"]["containers"][0]["args"];
    serde_json::from_value(args.clone()).unwrap()
}

#[test]
fn kube_apiserver_serves_deprecated_betas_only_when_asked_to() {
    let runtime_config = |args: &[String]| {
        args.iter()
            .filter(|a| a.starts_with("--runtime-config="))
            .cloned()
            .collect::<Vec<_>>()
    };
    let off = apiserver_args(crate::DeprecatedApis::Off);
    assert!(runtime_config(&off).is_empty(), "{off:?}");
    let served = apiserver_args(crate::DeprecatedApis::Served);
    assert_eq!(
        runtime_config(&served),
        crate::DeprecatedApis::Served.apiserver_args(),
        "{served:?}"
    );
    assert_eq!(served.len(), off.len() + 1);
}

#[test]
fn service_type_and_storage_class_are_configurable() {
    let mut config = KubernetesSeedConfig::new("demo");
    config.service_type = ServiceType::NodePort;
    config.storage_class = Some("fast".into());
    config.images = serde_yaml::from_str("pullPolicy: IfNotPresent").unwrap();
    let text = render(&config);
    assert!(text.contains("type: NodePort"), "{text}");
    assert_eq!(
        text.matches("imagePullPolicy: IfNotPresent").count(),
        4,
        "{text}"
    );
    assert!(!text.contains("imagePullPolicy: Never"), "{text}");
    assert!(text.contains("storageClassName: fast"), "{text}");
    assert!(!text.contains("LoadBalancer"), "{text}");
}

/// `leaseFromNode`: etcd's and kube-apiserver's guards read the lease file
/// ringd writes on the node (hostPath), and restart their child after a fence.
#[test]
fn guards_of_a_ring_s_own_shoot_read_the_lease_file_on_the_node() {
    let wiring = Wiring {
        guard: true,
        backup: None,
    };
    let mut config = KubernetesSeedConfig::new("demo");
    let from_cluster = render_wired(&config, &wiring);
    assert!(!from_cluster.contains("--lease-file"), "{from_cluster}");
    config.lease_from_node = true;
    let text = render_wired(&config, &wiring);
    let spec = ControlPlaneSpec::new("alpha");
    let r = Renderer {
        ring: "demo",
        spec: &spec,
        config: &config,
        wiring: &wiring,
        node_dir: Some("/ring/members/m3/seed/shoots/alpha/pods".into()),
        apis: Default::default(),
    };
    let owner = Owner {
        name: ANCHOR.into(),
        uid: "u1".into(),
    };
    let objects = r.objects(&owner, &BTreeMap::new());
    let mut guarded = 0;
    for o in &objects {
        let spec = &o["spec"]["template"]["spec"];
        for c in spec["containers"].as_array().into_iter().flatten() {
            let command: Vec<&str> = c["command"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if command.get(1) != Some(&"guard") {
                continue;
            }
            guarded += 1;
            assert_eq!(
                command[2..5],
                [
                    "--lease-file",
                    "/var/run/ring-lease/fence-at-ms",
                    "--restart",
                ],
                "{c}"
            );
            // kube-apiserver starts only once its etcd's Service answers;
            // etcd's guard sets aside a member that never committed
            let rest = if c["name"] == "kube-apiserver" {
                vec![
                    "--wait-for",
                    "etcd-client.shoot--demo--alpha.svc:2379",
                    "--",
                    "kube-apiserver",
                ]
            } else {
                vec!["--etcd-data", "/var/lib/etcd/data", "--", "etcd"]
            };
            assert_eq!(command[5..5 + rest.len()], rest, "{c}");
            assert!(
                c["volumeMounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["name"] == "ring-lease"
                        && m["mountPath"] == agent::LEASE_MOUNT
                        && m["readOnly"] == true),
                "{c}"
            );
            assert!(
                spec["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["name"] == "ring-lease"
                        && v["hostPath"]["path"] == "/ring/members/m3/seed/shoots/alpha/pods"),
                "{spec}"
            );
        }
    }
    assert_eq!(guarded, 2, "etcd and kube-apiserver:\n{text}");
}

#[test]
fn every_owned_object_points_at_the_anchor_and_uses_ga_apis() {
    for o in owned_objects(&Wiring::default()) {
        assert_eq!(o["metadata"]["namespace"], "shoot--demo--alpha");
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "u1", "{o}");
        let v = o["apiVersion"].as_str().unwrap();
        assert!(["v1", "apps/v1", "policy/v1"].contains(&v), "{v}");
    }
}

/// `leaseFromNode` with a bucket: etcd's backup sidecar reads the same lease
/// file, so it goes on uploading while the seed cluster's API is away, and
/// etcd's data is in the node's directory (a cold start finds it there).
#[test]
fn backup_sidecar_and_etcd_data_of_a_ring_s_own_shoot_are_on_the_node() {
    let wiring = Wiring {
        guard: true,
        backup: Some(agent::PodBackup {
            files: BTreeMap::from([(agent::BACKUP_CONFIG.to_string(), b"kind: Backup".to_vec())]),
            host_dir: None,
        }),
    };
    let mut config = KubernetesSeedConfig::new("demo");
    for from_node in [false, true] {
        config.lease_from_node = from_node;
        let objects: Vec<Value> =
            serde_yaml::Deserializer::from_str(&render_wired(&config, &wiring))
                .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
                .collect();
        let etcd = objects
            .iter()
            .find(|o| o["kind"] == "StatefulSet")
            .expect("etcd's StatefulSet");
        let spec = &etcd["spec"]["template"]["spec"];
        let sidecar = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "backup")
            .expect("the backup sidecar");
        let command: Vec<&str> = sidecar["command"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let reads_file = command
            .windows(2)
            .any(|w| w == ["--lease-file", "/var/run/ring-lease/fence-at-ms"]);
        assert_eq!(reads_file, from_node, "{sidecar}");
        let mounted = sidecar["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "ring-lease");
        assert_eq!(mounted, from_node, "{sidecar}");
        let volumes = spec["volumes"].as_array().unwrap();
        let lease_volumes = volumes.iter().filter(|v| v["name"] == "ring-lease").count();
        assert_eq!(lease_volumes, usize::from(from_node), "{spec}");
        // etcd's data: a claim, or with leaseFromNode the node's directory
        let claims = etcd["spec"]["volumeClaimTemplates"].as_array();
        let on_node = volumes.iter().any(|v| {
            v["name"] == "data"
                && v["hostPath"]["path"] == "/ring/members/m3/seed/shoots/alpha/pods/etcd"
                && v["hostPath"]["type"] == "Directory"
        });
        assert_eq!(on_node, from_node, "{spec}");
        assert_eq!(claims.is_none(), from_node, "{etcd}");
    }
}

/// A ring's control plane: guarded etcd and kube-apiserver, etcd's restore
/// init container and backup sidecar with a file bucket mounted.
#[test]
fn wired_control_plane_matches_golden_file() {
    let wiring = Wiring {
        guard: true,
        backup: Some(agent::PodBackup {
            files: BTreeMap::from([(agent::BACKUP_CONFIG.to_string(), b"kind: Backup".to_vec())]),
            host_dir: Some("/srv/ring-bucket".into()),
        }),
    };
    let text = render_wired(&KubernetesSeedConfig::new("demo"), &wiring);
    golden("control-plane-wired.yaml", &text);
    assert_eq!(text.matches("- guard").count(), 2, "{text}");
    assert!(
        text.contains("serviceAccountName: ring-control-plane"),
        "{text}"
    );
    for o in owned_objects(&wiring) {
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "u1", "{o}");
        let v = o["apiVersion"].as_str().unwrap();
        let served = ["v1", "apps/v1", "policy/v1", "rbac.authorization.k8s.io/v1"];
        assert!(served.contains(&v), "{v}");
    }
}

/// With `nodeName` (a ring's own shoot: etcd's data and the lease file are
/// on that node's disk) every pod template names the node, so the kubelet
/// runs the pods without the seed cluster's scheduler: a host shoot whose
/// scheduler has just moved (and waits out its leader lease) or is down
/// still gets its hosted control planes. Without it, nothing is pinned.
#[test]
fn pods_of_a_ring_s_own_shoot_are_bound_to_its_node() {
    let wiring = Wiring {
        guard: true,
        backup: None,
    };
    let templates = |config: &KubernetesSeedConfig| -> Vec<Value> {
        let spec = ControlPlaneSpec::new("alpha");
        let r = Renderer {
            ring: "demo",
            spec: &spec,
            config,
            wiring: &wiring,
            node_dir: Some("/ring/members/m3/seed/shoots/alpha/pods".into()),
            apis: Default::default(),
        };
        let owner = Owner {
            name: ANCHOR.into(),
            uid: "u1".into(),
        };
        r.objects(&owner, &BTreeMap::new())
            .into_iter()
            .filter(|o| o["spec"]["template"].is_object())
            .map(|o| o["spec"]["template"]["spec"].clone())
            .collect()
    };
    let mut config = KubernetesSeedConfig::new("demo");
    config.lease_from_node = true;
    let unpinned = templates(&config);
    assert_eq!(unpinned.len(), 4, "etcd and three Deployments");
    assert!(unpinned.iter().all(|s| s.get("nodeName").is_none()));
    config.node_name = Some("m3".into());
    let pinned = templates(&config);
    assert_eq!(pinned.len(), 4);
    for s in &pinned {
        assert_eq!(s["nodeName"], "m3", "{s}");
    }
    // a node name Kubernetes would refuse is named as bad config
    config.node_name = Some("M3_bad".into());
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("nodeName") && err.contains("M3_bad"), "{err}");
}

/// kube-apiserver's pod gets a grace of `API_STOP_GRACE` (its drain waits
/// for watches that never end by themselves); every other pod keeps the
/// default, etcd's in particular.
#[test]
fn only_kube_apiserver_pods_are_killed_soon_after_sigterm() {
    let wiring = Wiring {
        guard: true,
        backup: None,
    };
    let templates: Vec<Value> = owned_objects(&wiring)
        .into_iter()
        .filter(|o| o["spec"]["template"].is_object())
        .collect();
    assert_eq!(templates.len(), 4);
    for o in &templates {
        let grace = &o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"];
        if o["metadata"]["name"] == APISERVER {
            assert_eq!(grace, &json!(crate::process::API_STOP_GRACE.as_secs()));
        } else {
            assert!(grace.is_null(), "{}: {grace}", o["metadata"]["name"]);
        }
    }
}

/// `start` applies the workloads in a second round: every service account
/// and Secret their pods name is in the first.
#[test]
fn workloads_come_after_the_accounts_and_secrets_their_pods_use() {
    let wiring = Wiring {
        guard: true,
        backup: Some(agent::PodBackup {
            files: BTreeMap::from([(agent::BACKUP_CONFIG.to_string(), b"kind: Backup".to_vec())]),
            host_dir: None,
        }),
    };
    let (workloads, rest): (Vec<Value>, Vec<Value>) = owned_objects(&wiring)
        .into_iter()
        .partition(super::is_workload);
    let kinds: Vec<&str> = workloads
        .iter()
        .filter_map(|w| w["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["StatefulSet", "Deployment", "Deployment", "Deployment"]
    );
    let exists = |kind: &str, name: &str| {
        rest.iter()
            .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    };
    for w in &workloads {
        let pod = &w["spec"]["template"]["spec"];
        if let Some(account) = pod["serviceAccountName"].as_str() {
            assert!(exists("ServiceAccount", account), "{account} of {w}");
        }
        for v in pod["volumes"].as_array().into_iter().flatten() {
            if let Some(secret) = v["secret"]["secretName"].as_str() {
                assert!(exists("Secret", secret), "{secret} of {w}");
            }
        }
    }
}

/// A renewed certificate in kube-controller-manager's or kube-scheduler's
/// kubeconfig changes its pod template (so the Deployment replaces the
/// pods, whether ringd applies it or only patches that annotation); the
/// other templates stay as they are.
#[test]
fn a_changed_kubeconfig_changes_only_its_component_s_pod_template() {
    let config = KubernetesSeedConfig::new("demo");
    let spec = ControlPlaneSpec::new("alpha");
    let (wiring, owner) = (
        Wiring::default(),
        Owner {
            name: ANCHOR.into(),
            uid: "u1".into(),
        },
    );
    let r = Renderer {
        ring: "demo",
        spec: &spec,
        config: &config,
        wiring: &wiring,
        node_dir: None,
        apis: Default::default(),
    };
    let templates = |pki: &BTreeMap<String, Vec<u8>>| -> Vec<(String, Value)> {
        r.objects(&owner, pki)
            .into_iter()
            .filter(is_workload)
            .map(|o| {
                (
                    o["metadata"]["name"].as_str().unwrap().to_string(),
                    o["spec"]["template"].clone(),
                )
            })
            .collect()
    };
    let mut pki = BTreeMap::from([("kube-scheduler.kubeconfig".to_string(), b"old".to_vec())]);
    let before = templates(&pki);
    pki.insert("kube-scheduler.kubeconfig".into(), b"renewed".to_vec());
    let after = templates(&pki);
    let changed: Vec<&str> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b != a)
        .map(|(b, _)| b.0.as_str())
        .collect();
    assert_eq!(changed, ["kube-scheduler"]);
    let annotation = |t: &[(String, Value)]| {
        t.iter().find(|(n, _)| n == "kube-scheduler").unwrap().1["metadata"]["annotations"]
            [KUBECONFIG_HASH]
            .clone()
    };
    assert_eq!(
        annotation(&after),
        json!(kubeconfig_hash(&pki, Component::KubeScheduler))
    );
}
