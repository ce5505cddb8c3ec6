//! Tests of drill files: parsing, defaults and every validation error.

use super::*;

const GOOD: &str = "apiVersion: ring.gardener.cloud/v1alpha1
kind: Drill
name: kill-seed
seed: 7
ring: {members: 3, memberPrefix: ks}
workload: {writersPerShoot: 1, ratePerSecond: 4}
faults:
  - at: 10s
    action: {killSeed: {target: {hostOf: 2}}}
  - when: {failoverStep: Done}
    after: 3s
    action: {heal: {}}
expect: {maxRtoSecs: 90, lostWrites: beyondDurable}
";

#[test]
fn a_good_drill_parses_with_defaults() {
    let d = Drill::parse(GOOD, "kill-seed.yaml").unwrap();
    assert_eq!(d.members(), ["ks1", "ks2", "ks3"]);
    assert_eq!(d.faults[0].at, Some(Duration::from_secs(10)));
    assert_eq!(
        d.faults[0].action,
        Action::KillSeed {
            target: Target::HostOf(2)
        }
    );
    assert_eq!(d.faults[1].when, Some(When::FailoverStep(Step::Done)));
    // the self-hosted ring unless a drill says otherwise
    assert_eq!(d.ring.hosting, Hosting::SelfHosted);
    let machine = GOOD.replace("killSeed", "killMachine");
    let d = Drill::parse(&machine, "kill-machine.yaml").unwrap();
    assert_eq!(
        d.faults[0].action,
        Action::KillMachine {
            target: Target::HostOf(2)
        }
    );
    let quick = GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, hosting: processes}");
    let d = Drill::parse(&quick, "quick.yaml").unwrap();
    assert_eq!(d.ring.hosting, Hosting::Processes);
    assert_eq!(
        d.workload.kinds,
        [ObjectKind::ConfigMap, ObjectKind::Secret]
    );
    assert!(d.expect.no_double_serving && d.expect.converge);
    assert!(d.ring.kubernetes_members.is_empty() && !d.is_kubernetes_member(1));
    // round trip
    let text = serde_yaml::to_string(&d).unwrap();
    assert_eq!(Drill::parse(&text, "x").unwrap(), d);
}

#[test]
fn every_shipped_drill_file_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("drills");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let d = Drill::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            path.file_stem().unwrap().to_str().unwrap(),
            d.name,
            "file named after the drill"
        );
        n += 1;
    }
    assert!(n >= 2, "drill files in {}", dir.display());
}

#[test]
fn bad_drills_give_errors_naming_the_field() {
    let cases = [
            (
                GOOD.replace("seed: 7\n", "seed: 7\ncolour: red\n"),
                "unknown field `colour`",
            ),
            (
                GOOD.replace("{killSeed: {target: {hostOf: 2}}}", "{nuke: {}}"),
                "unknown variant `nuke`",
            ),
            (GOOD.replace("at: 10s", "at: -3s"), "faults[0]"),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, timing: {leaseMs: 600}}"),
                "ring.timing: config timing.leaseMs",
            ),
            (GOOD.replace("at: 10s", "at: soon"), "is not a duration"),
            (GOOD.replace("at: 10s", "at: 10"), "has no unit"),
            (GOOD.replace("at: 10s", "at: 10h"), "unknown unit \"h\""),
            (
                GOOD.replace("at: 10s", "at: 700s"),
                "faults[0].at: 700s is not before the drill's deadline",
            ),
            (
                GOOD.replace("hostOf: 2", "hostOf: 4"),
                "faults[0].action.killSeed.target.hostOf: ring positions are 1..3, not 4",
            ),
            (
                GOOD.replace("{hostOf: 2}", "{hostof: 2}"),
                "unknown variant `hostof`",
            ),
            (
                GOOD.replace("members: 3", "members: 2"),
                "ring.members: must be between 3 and 7",
            ),
            (
                GOOD.replace("memberPrefix: ks", "memberPrefix: KS"),
                "ring.memberPrefix",
            ),
            (
                GOOD.replace("kind: Drill", "kind: Ring"),
                "kind: must be Drill",
            ),
            (
                GOOD.replace("ratePerSecond: 4", "ratePerSecond: 0"),
                "workload.ratePerSecond",
            ),
            (
                GOOD.replace("failoverStep: Done", "failoverStep: Finished"),
                "unknown variant `Finished`",
            ),
            (
                GOOD.replace("  - when: {failoverStep: Done}\n", "  - at: 5s\n"),
                "faults[1].at: 5s is before an earlier fault's time 10s",
            ),
            (
                GOOD.replace(
                    "  - when: {failoverStep: Done}\n",
                    "  - at: 20s\n    when: converged\n",
                ),
                "either `at`",
            ),
            (
                GOOD.replace("{heal: {}}", "{restoreFromBucket: {}}"),
                "faults[1].action.restoreFromBucket: restores a lost ring",
            ),
            (
                GOOD.replace("{heal: {}}", "{stopBucket: {for: 5s}}"),
                "only an S3 bucket can be stopped",
            ),
            (
                GOOD.replace("{heal: {}}", "{stallRingd: {target: {hostOf: 2}, for: 0s}}"),
                "faults[1].action.stallRingd.for: must be positive",
            ),
            (
                GOOD.replace("{heal: {}}", "{stallRingd: {target: {hostOf: 9}, for: 5s}}"),
                "faults[1].action.stallRingd.target.hostOf: ring positions are 1..3",
            ),
            (
                GOOD.replace("{heal: {}}", "{skewClock: {target: {hostOf: 2}, offset: 5s}}"),
                "faults[1].action.skewClock.offset: a signed number of seconds within a day, such as +5s or -5s",
            ),
            (
                GOOD.replace("{heal: {}}", "{skewClock: {target: {hostOf: 2}, offset: +0s}}"),
                "faults[1].action.skewClock.offset: a signed number",
            ),
            (
                GOOD.replace("lostWrites: beyondDurable", "lostWrites: some"),
                "unknown variant `some`",
            ),
            (
                GOOD.replace("{killSeed: {target", "{partition: {target"),
                "faults[0].action.partition: cuts a member's network link: set ring.network: namespaces",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, network: namespaces, bucket: s3}"),
                "ring.bucket: the S3 server listens on the host's loopback",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, network: bridged}"),
                "unknown variant `bridged`",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, network: namespaces}")
                    .replace("{heal: {}}", "{fullSnapshot: {shoot: 1}}"),
                "faults[1].action.fullSnapshot: reads etcd on the shoot's loopback address",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, kubernetesMembers: [4]}"),
                "ring.kubernetesMembers: ring positions are 1..3, not 4",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, kubernetesMembers: [1]}")
                    .replace("name: kill-seed", "name: leader-dies-mid-kubernetes-failover"),
                "name: is the ring's name, and a Kubernetes seed's ring name has at most 24",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, kubernetesMembers: [1, 1]}"),
                "ring.kubernetesMembers: names position 1 twice",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, kubernetesMembers: [1]}")
                    .replace("{heal: {}}", "{fullSnapshot: {shoot: 1}}"),
                "faults[1].action.fullSnapshot: is not supported with ring.kubernetesMembers",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, hosting: pods}"),
                "unknown variant `pods`, expected `self` or `processes`",
            ),
            (
                GOOD.replace("memberPrefix: ks}", "memberPrefix: ks, kubernetesMembers: [1]}"),
                "ring.kubernetesMembers: gives members a seed cluster of their own; on the self-hosted ring",
            ),
            (
                GOOD.replace("name: kill-seed", "name: kill-seed-on-a-self-hosted-ring"),
                "name: is the ring's name, and a self-hosted ring's name has at most 24",
            ),
        ];
    for (text, want) in cases {
        let got = Drill::parse(&text, "d.yaml")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(got.contains(want), "want {want:?} in {got:?}");
        assert!(got.contains("d.yaml"), "names the file: {got}");
    }
}

#[test]
fn durations_parse_and_print() {
    assert_eq!(parse_dur("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_dur("1.5s").unwrap(), Duration::from_millis(1500));
    assert_eq!(parse_dur("2m").unwrap(), Duration::from_secs(120));
    assert!(parse_dur("").is_err());
    assert!(parse_dur("s").is_err());
    assert_eq!(fmt_dur(Duration::from_millis(1500)), "1500ms");
    assert_eq!(fmt_dur(Duration::from_secs(3)), "3s");
}
