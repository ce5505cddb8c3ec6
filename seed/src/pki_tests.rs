//! Tests of [`super`] (pki.rs).
use super::*;
use std::os::unix::fs::PermissionsExt;

/// Writers of one path at once (a lease renewal and a move's lease step)
/// all succeed and leave one whole value (one shared temp name renamed
/// another writer's file away: ENOENT).
#[test]
fn concurrent_writes_of_one_path_all_succeed_whole() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("fence-at-ms");
    let writers: Vec<_> = (0..8u64)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                for j in 0..200u64 {
                    write_private(&path, format!("{}", i * 1000 + j).as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("no writer failed");
    }
    let value: u64 = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    assert_eq!(value % 1000, 199, "one writer's last value: {value}");
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "no temp file left behind");
}

fn endpoint() -> ShootEndpoint {
    ShootEndpoint::on(Ipv4Addr::new(127, 20, 0, 1))
}

#[test]
fn generates_complete_pki_with_private_files_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path().join("pki"));
    pki.ensure("alpha", &endpoint()).unwrap();
    let before = std::fs::read(pki.leaf(Leaf::ApiServer).cert).unwrap();
    for entry in std::fs::read_dir(pki.dir()).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(
        std::fs::read_dir(pki.dir()).unwrap().count(),
        2 + 2 * Leaf::ALL.len() + 2
    );
    pki.ensure("alpha", &endpoint()).unwrap();
    assert_eq!(
        before,
        std::fs::read(pki.leaf(Leaf::ApiServer).cert).unwrap()
    );
}

#[test]
fn apiserver_certificate_has_endpoint_and_service_sans() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.ensure("alpha", &endpoint()).unwrap();
    let der = read_cert_der(&pki.leaf(Leaf::ApiServer).cert).unwrap();
    let (_, facts) = cert_facts(&der).unwrap();
    assert!(facts.ips.contains(&IpAddr::V4(endpoint().address)));
    assert!(facts.ips.contains(&IpAddr::V4(KUBERNETES_SERVICE_IP)));
    let ca = read_cert_der(&pki.ca().cert).unwrap();
    verify_issued_by(&der, &ca).unwrap();
}

#[test]
fn corrupted_certificate_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.ensure("alpha", &endpoint()).unwrap();
    let path = pki.leaf(Leaf::Admin).cert;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x55; // damage the base64 body
    std::fs::write(&path, &bytes).unwrap();
    let err = pki.ensure("alpha", &endpoint()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("admin.crt"), "{msg}");
    assert!(msg.contains("restore the file"), "{msg}");
}

#[test]
fn certificate_from_another_ca_is_rejected() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (pa, pb) = (Pki::new(a.path()), Pki::new(b.path()));
    pa.ensure("alpha", &endpoint()).unwrap();
    pb.ensure("alpha", &endpoint()).unwrap();
    for f in [pb.leaf(Leaf::Admin).cert, pb.leaf(Leaf::Admin).key] {
        std::fs::copy(&f, a.path().join(f.file_name().unwrap())).unwrap();
    }
    let msg = pa.ensure("alpha", &endpoint()).unwrap_err().to_string();
    assert!(msg.contains("not issued by this shoot's CA"), "{msg}");
}

#[test]
fn only_a_leaf_about_to_expire_is_reissued_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    assert_eq!(
        pki.ensure("alpha", &endpoint()).unwrap(),
        vec![],
        "new, not reissued"
    );
    let ca = (
        std::fs::read_to_string(pki.ca().cert).unwrap(),
        std::fs::read_to_string(pki.ca().key).unwrap(),
    );
    let not_after = |leaf: Leaf| {
        let der = read_cert_der(&pki.leaf(leaf).cert).unwrap();
        cert_facts(&der).unwrap().1.not_after - now()
    };
    for (leaf, days) in [(Leaf::Scheduler, 29), (Leaf::ApiServer, 31)] {
        let spec = leaf.spec(&endpoint());
        let (cert, key) = issue_for_days(&ca.0, &ca.1, &spec, days).unwrap();
        write_private(&pki.leaf(leaf).key, key.as_bytes()).unwrap();
        write_private(&pki.leaf(leaf).cert, cert.as_bytes()).unwrap();
        assert!(
            not_after(leaf) <= days * 86_400,
            "{leaf:?} issued for {days} days"
        );
    }
    assert_eq!(
        pki.ensure("alpha", &endpoint()).unwrap(),
        vec![Leaf::Scheduler]
    );
    assert!(
        not_after(Leaf::Scheduler) > 700 * 86_400,
        "reissued for 730 days"
    );
    assert!(
        not_after(Leaf::ApiServer) <= 31 * 86_400,
        "31 days left: kept"
    );
    assert_eq!(
        pki.ensure("alpha", &endpoint()).unwrap(),
        vec![],
        "nothing due any more"
    );
    assert_eq!(
        Leaf::Scheduler.restarts(),
        Some(crate::Component::KubeScheduler)
    );
    assert_eq!(
        Leaf::ApiServer.restarts(),
        None,
        "kube-apiserver reloads its files"
    );
}

#[test]
fn new_address_reissues_serving_certificates_under_the_same_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.ensure("alpha", &endpoint()).unwrap();
    let ca_before = std::fs::read(pki.ca().cert).unwrap();
    let moved = ShootEndpoint::on(Ipv4Addr::new(127, 30, 0, 1));
    pki.ensure("alpha", &moved).unwrap();
    let der = read_cert_der(&pki.leaf(Leaf::ApiServer).cert).unwrap();
    assert!(cert_facts(&der)
        .unwrap()
        .1
        .ips
        .contains(&IpAddr::V4(moved.address)));
    assert_eq!(ca_before, std::fs::read(pki.ca().cert).unwrap());
}

#[test]
fn missing_ca_key_with_existing_cert_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    pki.ensure("alpha", &endpoint()).unwrap();
    std::fs::remove_file(pki.ca().key).unwrap();
    let msg = pki.ensure("alpha", &endpoint()).unwrap_err().to_string();
    assert!(msg.contains("ca.key: is missing"), "{msg}");
}
