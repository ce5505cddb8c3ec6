//! Tests of the Ring config: parsing, defaults and every field's errors.

use super::*;

fn yaml(body: &str) -> String {
    format!("apiVersion: ring.gardener.cloud/v1alpha1\nkind: Ring\nname: demo\n{body}")
}

#[test]
fn default_is_a_valid_three_member_local_ring() {
    let c = RingConfig::default();
    c.validate().unwrap();
    assert_eq!(c.members.len(), 3);
    assert_eq!(c.member_address(0), "127.0.0.1:17101");
    let text = serde_yaml::to_string(&c).unwrap();
    assert_eq!(RingConfig::parse(&text, "x").unwrap(), c);
}

#[test]
fn without_a_config_the_ring_is_closed_and_self_hosted() {
    let c = RingConfig::self_hosted_default();
    c.validate().unwrap();
    assert_eq!(c.nodes.per_member, 1);
    assert_eq!(c.self_hosting.members, ["m1", "m2", "m3"]);
    let text = serde_yaml::to_string(&c).unwrap();
    assert_eq!(RingConfig::parse(&text, "x").unwrap(), c);
}

#[test]
fn nodes_are_one_per_member_by_default_and_checked() {
    let members = "members: [{name: a}, {name: b}, {name: c}]\n";
    let c = RingConfig::parse(&yaml(members), "ring.yaml").unwrap();
    assert_eq!(c.nodes.per_member, 1);
    for (body, field, says) in [
        (
            "nodes: {perMember: 6}\n",
            "nodes.perMember",
            "3 members x 6 nodes = 18",
        ),
        (
            "nodes: {perMember: 1, extra: 1}\n",
            "ring.yaml",
            "unknown field",
        ),
    ] {
        let err = RingConfig::parse(&yaml(&format!("{members}{body}")), "ring.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(field) && err.contains(says), "{body}: {err}");
    }
    // a member in a network namespace of its own reaches the nodes as a guest
    let in_netns = "members: [{name: a, netns: ns-a}, {name: b}, {name: c}]\n";
    let config = RingConfig::parse(&yaml(in_netns), "ring.yaml").unwrap();
    assert_eq!(crate::nodes::guests(&config), [(0, "ns-a".to_string())]);
    let many: Vec<String> = (0..16).map(|i| format!("{{name: m{i}}}")).collect();
    let err = RingConfig::parse(&yaml(&format!("members: [{}]\n", many.join(", "))), "r")
        .unwrap_err()
        .to_string();
    assert!(err.contains("room for 15 nodes"), "{err}");
    let two =
        RingConfig::parse(&yaml(&format!("{members}nodes: {{perMember: 2}}\n")), "r").unwrap();
    assert_eq!(
        crate::nodes::node_names(&two),
        ["a", "a-2", "b", "b-2", "c", "c-2"]
    );
    assert_eq!(crate::nodes::shoot_of(&two, "b-2").as_deref(), Some("b"));
    let long = format!(
        "members: [{{name: {}}}, {{name: b}}, {{name: c}}]\nnodes: {{perMember: 2}}\n",
        "x".repeat(40)
    );
    let err = RingConfig::parse(&yaml(&long), "r")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("members[0].name") && err.contains("-2"),
        "{err}"
    );
}

#[test]
fn a_member_may_have_its_own_address_and_network_namespace() {
    let c = RingConfig::parse(
        &yaml(
            "members: [{name: a, address: 198.18.0.1, netns: ring-a}, {name: b}, {name: c}]\nnodes: {perMember: 0}\n",
        ),
        "ring.yaml",
    )
    .unwrap();
    assert_eq!(c.member_address(0), "198.18.0.1:17101");
    assert_eq!(c.metrics_address(0), "198.18.0.1:17201");
    assert_eq!(c.member_address(1), "127.0.0.1:17102");
    assert_eq!(c.members[0].netns.as_deref(), Some("ring-a"));
    assert_eq!(
        c.member_ip_addr(0).unwrap(),
        "198.18.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    // a member without them is written as before
    let text = serde_yaml::to_string(&RingConfig::default()).unwrap();
    assert!(
        !text.contains("netns") && !text.contains("address: null"),
        "{text}"
    );
}

#[test]
fn a_kubernetes_member_gets_its_ringds_seed_section() {
    let text = yaml(
        "members: [{name: a, seed: {kind: kubernetes, kubeconfig: /k, serviceType: NodePort, nodeAddress: 10.1.2.3}}, {name: b}, {name: c}]\n",
    );
    let c = RingConfig::parse(&text, "ring.yaml").unwrap();
    let k = c.members[0].seed.kubernetes_config("demo").unwrap();
    assert_eq!(k.ring, "demo");
    assert_eq!(k.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
    assert_eq!(k.service_type, seed::kubernetes::ServiceType::NodePort);
    assert_eq!(k.node_address, Some("10.1.2.3".parse().unwrap()));
    k.validate().unwrap();
    assert!(c.members[1].seed.kubernetes_config("demo").is_none());
    let typo = yaml("members: [{name: a, seed: {kind: kubernetes, kubeconfig: /k, nodeAdress: 10.1.2.3}}, {name: b}, {name: c}]\n");
    let err = RingConfig::parse(&typo, "ring.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("nodeAdress"), "{err}");
}

#[test]
fn the_bucket_key_is_checked_where_it_is_used() {
    let text = yaml(
        "members: [{name: a}, {name: b}, {name: c}]\nbucketEncryption: {keyFile: /nonexistent/ring.key}\n",
    );
    // `ringctl status` / `down` read the config without needing the key
    let config = RingConfig::parse(&text, "ring.yaml").unwrap();
    let err = config.check_bucket().unwrap_err().to_string();
    assert!(
        err.contains("bucketEncryption") && err.contains("/nonexistent/ring.key"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("ring.key");
    std::fs::write(&key, "22".repeat(32)).unwrap();
    let text = text.replace("/nonexistent/ring.key", &key.display().to_string());
    RingConfig::parse(&text, "ring.yaml")
        .unwrap()
        .check_bucket()
        .unwrap();
}

#[test]
fn a_self_hosted_ring_refuses_a_bucket_its_pods_cannot_reach() {
    let text = yaml(
        "members: [{name: a}, {name: b}, {name: c}]\nbucket: s3://drill/backups\nnodes: {perMember: 1}\nselfHosting: {members: [a, b, c]}\n",
    );
    let config = RingConfig::parse(&text, "ring.yaml").unwrap();
    let env = |endpoint: &str| {
        vec![
            ("AWS_ENDPOINT_URL".to_string(), endpoint.to_string()),
            ("AWS_ACCESS_KEY_ID".to_string(), "id".to_string()),
        ]
    };
    let err = config
        .check_bucket_in(env("http://127.0.0.1:9000"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bucket") && err.contains("http://127.0.0.1:9000") && err.contains("loopback"),
        "{err}"
    );
    config
        .check_bucket_in(env("http://198.19.0.254:9000"))
        .unwrap();
    // a process-hosted ring's backups run next to ringd, on this machine
    let local = text.replace("selfHosting: {members: [a, b, c]}\n", "");
    RingConfig::parse(&local, "ring.yaml")
        .unwrap()
        .check_bucket_in(env("http://127.0.0.1:9000"))
        .unwrap();
}

#[test]
fn deprecated_apis_are_off_unless_served_is_asked_for() {
    let three = "members: [{name: a}, {name: b}, {name: c}]\n";
    let c = RingConfig::parse(&yaml(three), "ring.yaml").unwrap();
    assert_eq!(c.deprecated_apis, seed::DeprecatedApis::Off);
    let text = yaml(&format!("{three}deprecatedApis: served\n"));
    let c = RingConfig::parse(&text, "ring.yaml").unwrap();
    assert_eq!(c.deprecated_apis, seed::DeprecatedApis::Served);
}

#[test]
fn bad_configs_give_precise_errors() {
    let three = "members: [{name: a}, {name: b}, {name: c}]\n";
    let cases = [
        (
            yaml("members: [{name: a}, {name: b}]\n"),
            "config members: a ring needs at least 3 members",
        ),
        (
            yaml("members: [{name: a}, {name: b}, {name: a}]\n"),
            "config members[2].name: \"a\" is already members[0]",
        ),
        (
            yaml(&format!("{three}bucket: ftp://x\n")),
            "config bucket: \"ftp://x\": unsupported scheme \"ftp\"",
        ),
        (
            yaml(&format!("{three}bucket: file://relative\n")),
            "absolute path",
        ),
        (
            yaml(&format!("{three}bucketEncryption: {{keyFile: key}}\n")),
            "config bucketEncryption.keyFile: give an absolute path",
        ),
        (
            yaml(&format!("{three}bucketEncryption: {{}}\n")),
            "give keyFile (a file with the key) or keyEnv",
        ),
        (
            yaml(&format!("{three}colour: blue\n")),
            "unknown field `colour`",
        ),
        (
            yaml("members: [{name: a, zone: x}, {name: b}, {name: c}]\n"),
            "unknown field `zone`",
        ),
        (
            yaml("members: [{name: A}, {name: b}, {name: c}]\n"),
            "members[0].name",
        ),
        (yaml(&format!("{three}ports: {{base: 80}}\n")), "ports.base"),
        (
            yaml(&format!("{three}timing: {{leaseMs: 10}}\n")),
            "timing.leaseMs",
        ),
        (
            yaml("members: [{name: a}, {name: b, address: 10.0.0.300}, {name: c}]\n"),
            "config members[1].address: \"10.0.0.300\" is not an IP address",
        ),
        (
            yaml(&format!("{three}deprecatedApis: maybe\n")),
            "unknown variant `maybe`, expected `off` or `served`",
        ),
        (
            yaml("members: [{name: a, netns: ../x}, {name: b}, {name: c}]\n"),
            "config members[0].netns: \"../x\" is not a network namespace name",
        ),
    ];
    for (text, want) in cases {
        let got = RingConfig::parse(&text, "ring.yaml")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(got.contains(want), "want {want:?} in {got:?}");
    }
}

#[test]
fn self_hosting_names_local_members_with_nodes() {
    let c = RingConfig::parse(
        &yaml("members: [{name: a}, {name: b}, {name: c}]\nselfHosting: {members: [c]}\n"),
        "r",
    )
    .unwrap();
    assert_eq!(c.self_hosting.members, vec!["c".to_string()]);
    // every member: the closed ring
    let closed =
        yaml("members: [{name: a}, {name: b}, {name: c}]\nselfHosting: {members: [a, b, c]}\n");
    assert_eq!(
        RingConfig::parse(&closed, "r")
            .unwrap()
            .self_hosting
            .members
            .len(),
        3
    );
    assert_eq!(c.successor("c").as_deref(), Some("a"));
    assert_eq!(c.successor("a").as_deref(), Some("b"));
    // a config without it is written as before
    assert!(!serde_yaml::to_string(&RingConfig::default())
        .unwrap()
        .contains("selfHosting"));
    for (body, want) in [
        (
            "selfHosting: {members: [x]}\n",
            "config selfHosting.members[0]: \"x\" is not a member",
        ),
        (
            "selfHosting: {members: [c, c]}\n",
            "config selfHosting.members[1]: \"c\" is listed twice",
        ),
        (
            "selfHosting: {members: [c]}\nnodes: {perMember: 0}\n",
            "config selfHosting: pods need nodes",
        ),
        (
            "selfHosting: {members: [c], other: 1}\n",
            "unknown field `other`",
        ),
    ] {
        let text = yaml(&format!(
            "members: [{{name: a}}, {{name: b}}, {{name: c}}]\n{body}"
        ));
        let err = RingConfig::parse(&text, "r").unwrap_err().to_string();
        assert!(err.contains(want), "{body}: {err}");
    }
    let k8s = yaml("members: [{name: a}, {name: b}, {name: c, seed: {kind: kubernetes, kubeconfig: /k}}]\nselfHosting: {members: [c]}\n");
    let err = RingConfig::parse(&k8s, "r").unwrap_err().to_string();
    assert!(err.contains("must be a member on a local seed"), "{err}");
}

/// A hot standby runs only on local seeds: a ring that hosts in pods (or has a
/// Kubernetes member) and asks for one is refused before anything starts, not
/// by the first ringd whose seed became Kubernetes midway through bootstrap.
#[test]
fn standby_is_refused_where_a_member_hosts_on_kubernetes() {
    let three = "members: [{name: a}, {name: b}, {name: c}]\nprotection: standby\n";
    RingConfig::parse(&yaml(three), "r").unwrap();
    for (body, want) in [
        (
            format!("{three}selfHosting: {{members: [a, b, c]}}\n"),
            "config protection: standby runs only on local seeds for now, and selfHosting \
             members [\"a\", \"b\", \"c\"] host in pods",
        ),
        (
            format!("{three}selfHosting: {{members: [c]}}\n"),
            "selfHosting members [\"c\"] host in pods",
        ),
        (
            "members: [{name: a, seed: {kind: kubernetes, kubeconfig: /k}}, {name: b}, {name: c}]\n\
             protection: standby\n"
                .to_string(),
            "config protection: standby runs only on local seeds for now, and members[0] (a) has a Kubernetes seed",
        ),
    ] {
        let got = RingConfig::parse(&yaml(&body), "r").unwrap_err().to_string();
        assert!(got.contains(want), "want {want:?} in {got:?}");
        assert!(got.contains("protection: backup"), "names the way out: {got}");
    }
    let mut closed = RingConfig::self_hosted_default();
    closed.protection = ringd::config::Protection::Standby;
    assert!(closed.validate().is_err(), "the default ring with standby");
}

/// Without a `timing` section a standby ring takes the timing sized for a
/// standby and a backup ring the ring's defaults; a section given (even in
/// part) is taken as written, the rest from the defaults, and survives the
/// ring dir's copy of the config.
#[test]
fn the_timing_follows_the_protection_unless_given() {
    use ringd::config::Timing;
    let three = "members: [{name: a}, {name: b}, {name: c}]\n";
    let parse = |body: &str| RingConfig::parse(&yaml(body), "r").unwrap();
    assert_eq!(parse(three).timing(), Timing::default());
    let standby = parse(&format!("{three}protection: standby\n"));
    assert_eq!(standby.timing(), Timing::standby());
    assert_eq!(standby.timing().lease_ms, 4000);
    let given = parse(&format!(
        "{three}protection: standby\ntiming: {{leaseMs: 20000}}\n"
    ));
    let want = Timing {
        lease_ms: 20000,
        ..Timing::default()
    };
    assert_eq!(given.timing(), want);
    let copy = serde_yaml::to_string(&standby).unwrap();
    assert!(!copy.contains("timing"), "{copy}");
    let again: RingConfig = serde_yaml::from_str(&copy).unwrap();
    assert_eq!(again.timing(), Timing::standby());
    Timing::standby().validate().unwrap();
}
