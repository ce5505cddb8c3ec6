//! Unit tests of the local seed: command lines, flags, guards.
#[test]
fn concurrent_writability_checks_never_trip_over_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                (0..300)
                    .map(|_| super::check_writable(&dir))
                    .filter(|r| r.is_err())
                    .count()
            })
        })
        .collect();
    let failed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(failed, 0, "checks that failed while others ran");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no probe left");
}

use super::*;

fn bins() -> Binaries {
    Binaries {
        etcd: "/bin/etcd".into(),
        kube_apiserver: "/bin/kube-apiserver".into(),
        kube_controller_manager: "/bin/kcm".into(),
        kube_scheduler: "/bin/ks".into(),
    }
}

#[test]
fn every_component_binds_only_the_shoot_address() {
    let dir = tempfile::tempdir().unwrap();
    let seed = LocalSeed::new(dir.path(), bins());
    let spec = ControlPlaneSpec::new("alpha");
    let addr = spec.endpoint.address.to_string();
    let specs = seed.component_specs(&spec);
    assert_eq!(
        specs.iter().map(|s| s.component).collect::<Vec<_>>(),
        Component::ALL
    );
    for s in &specs {
        let binds: Vec<_> = s
            .args
            .iter()
            .filter(|a| a.starts_with("--bind-address") || a.starts_with("--listen-"))
            .collect();
        assert!(
            !binds.is_empty(),
            "{:?} binds nothing explicitly",
            s.component
        );
        for b in binds {
            assert!(b.contains(&addr), "{b} does not use {addr}");
        }
        assert!(s.log.starts_with(dir.path()));
    }
    // no flag the current release removed (it would refuse to start)
    for s in &specs {
        let removed = s.args.iter().find(|a| crate::process::is_removed_flag(a));
        assert_eq!(removed, None, "{:?}", s.component);
    }
}

/// kube-apiserver refuses a loopback address as the `kubernetes`
/// Service's endpoint: a shoot without nodes (loopback) publishes none,
/// one whose pods reach its API at a node address publishes that.
#[test]
fn only_a_routable_advertised_address_becomes_the_kubernetes_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ControlPlaneSpec::new("alpha");
    let none = "--endpoint-reconciler-type=none".to_string();
    let api = |seed: &LocalSeed| seed.component_specs(&spec)[1].args.clone();
    let bare = LocalSeed::new(dir.path(), bins());
    assert!(api(&bare).contains(&none));
    let node_address = [("alpha".to_string(), "198.19.0.1".parse().unwrap())];
    let with_nodes = LocalSeed::new(dir.path(), bins()).with_advertise(node_address.into());
    let args = api(&with_nodes);
    assert!(!args.contains(&none), "{args:?}");
    assert!(args.contains(&"--advertise-address=198.19.0.1".to_string()));
}

#[test]
fn kube_apiserver_serves_deprecated_betas_only_when_asked_to() {
    let dir = tempfile::tempdir().unwrap();
    let spec = ControlPlaneSpec::new("alpha");
    let api_args = |seed: LocalSeed| {
        let specs = seed.component_specs(&spec);
        let api = specs
            .iter()
            .find(|s| s.component == Component::KubeApiserver);
        api.expect("kube-apiserver's spec").args.clone()
    };
    let runtime_config = |args: &[String]| {
        let rc = args.iter().filter(|a| a.starts_with("--runtime-config="));
        rc.cloned().collect::<Vec<_>>()
    };
    let off = api_args(LocalSeed::new(dir.path(), bins()));
    assert!(runtime_config(&off).is_empty(), "{off:?}");
    let on = crate::DeprecatedApis::Served.apiserver_args();
    let served =
        LocalSeed::new(dir.path(), bins()).with_deprecated_apis(crate::DeprecatedApis::Served);
    assert_eq!(runtime_config(&api_args(served)), on);
    // under the guard too (its child's arguments follow `--`)
    let guarded = LocalSeed::new(dir.path(), bins())
        .with_guard("/bin/ring-agent".into())
        .with_deprecated_apis(crate::DeprecatedApis::Served);
    assert_eq!(runtime_config(&api_args(guarded)), on);
}

/// Under the lease guard, etcd's guard also watches etcd's data dir (a
/// member that never committed is set aside before a start); the other
/// components run guarded too (the controllers hold ports of the
/// shoot's address a replacement on the same machine needs), without it.
#[test]
fn guarded_etcd_names_its_data_dir_to_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let seed = LocalSeed::new(dir.path(), bins()).with_guard("/bin/ring-agent".into());
    let spec = ControlPlaneSpec::new("alpha");
    let specs = seed.component_specs(&spec);
    let data = seed.layout("alpha").etcd_data().display().to_string();
    for s in &specs {
        let guarded = s.program == Path::new("/bin/ring-agent");
        let names_data = s
            .args
            .windows(2)
            .any(|w| w == ["--etcd-data", data.as_str()]);
        assert_eq!(
            (guarded, names_data),
            match s.component {
                Component::Etcd => (true, true),
                _ => (true, false),
            },
            "{:?}: {:?}",
            s.component,
            s.args
        );
    }
}

#[test]
fn spec_for_keeps_recorded_address_and_rejects_a_conflicting_one() {
    let dir = tempfile::tempdir().unwrap();
    let seed = LocalSeed::new(dir.path(), bins());
    let addr = std::net::Ipv4Addr::new(127, 50, 0, 9);
    let spec = seed.spec_for("alpha", Some(addr)).unwrap();
    seed.prepare(&spec).unwrap();
    assert_eq!(seed.spec_for("alpha", None).unwrap().endpoint.address, addr);
    let err = seed
        .spec_for("alpha", Some(std::net::Ipv4Addr::new(127, 50, 0, 10)))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("was created with address 127.50.0.9"),
        "{err}"
    );
    assert_eq!(seed.shoots(), vec!["alpha".to_string()]);
}

#[test]
fn prepare_in_unwritable_place_is_a_state_dir_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let seed = LocalSeed::new(file.join("state"), bins());
    let err = seed.prepare(&ControlPlaneSpec::new("alpha")).unwrap_err();
    assert!(matches!(err, SeedError::StateDir { .. }), "{err}");
    assert!(
        err.to_string().contains("choose a writable --state-dir"),
        "{err}"
    );
}

#[test]
fn taken_port_is_reported_with_component_and_address() {
    let spec = ControlPlaneSpec {
        shoot: "alpha".into(),
        endpoint: crate::ShootEndpoint::on(std::net::Ipv4Addr::new(127, 51, 0, 1)),
    };
    let _squatter =
        std::net::TcpListener::bind((spec.endpoint.address, spec.endpoint.api_port)).unwrap();
    let err = check_ports(&spec).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("127.51.0.1:6443 (for kube-apiserver of shoot alpha) is already in use"),
        "{msg}"
    );
}
