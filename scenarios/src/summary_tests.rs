use super::*;
use crate::result::{DoubleServing, Event, ShootFigures};

fn shoot(name: &str, outages: &[(f64, f64)], acked: u64, lost: u64, beyond: u64) -> ShootFigures {
    ShootFigures {
        shoot: name.into(),
        available: vec![],
        outages: outages.to_vec(),
        rto_secs: Some(outages.iter().map(|(a, b)| b - a).fold(0.0, f64::max)),
        acked_writes: acked,
        failed_writes: 0,
        lost_writes: lost,
        lost_beyond_durable: beyond,
        lost_unreported: 0,
        lost_examples: vec![],
        rpo_revisions: None,
        rpo_secs: None,
        ring_may_lose_revisions: None,
    }
}

fn fault(t: f64) -> Event {
    Event {
        t,
        kind: EventKind::Fault {
            action: "killMachine".into(),
            detail: String::new(),
            member: Some("k1".into()),
        },
    }
}

fn loss(t: f64, shoot: &str) -> Event {
    Event {
        t,
        kind: EventKind::Loss {
            shoot: shoot.into(),
            durable_revision: Some(10),
            durable_age_secs: Some(0.2),
        },
    }
}

fn run(
    drill: &str,
    build: Option<&str>,
    seed: u64,
    events: Vec<Event>,
    shoots: Vec<ShootFigures>,
) -> RunResult {
    RunResult {
        drill: drill.into(),
        run: 1,
        seed,
        passed: true,
        failures: vec![],
        started_at_ms: 0,
        duration_secs: 60.0,
        setup_secs: 50.0,
        members: vec!["k1".into(), "k2".into(), "k3".into()],
        bucket: "file:///b".into(),
        isolation: "loopback".into(),
        events,
        shoots,
        double_serving: vec![],
        converged_secs: Some(1.0),
        build: build.map(Into::into),
    }
}

/// One run's outages, split into failover, move back and bystanders.
#[test]
fn a_runs_outages_split_into_failover_move_back_and_bystanders() {
    struct Case {
        name: &'static str,
        events: Vec<Event>,
        shoots: Vec<ShootFigures>,
        want: (Option<f64>, Option<f64>, f64),
    }
    let cases = [
        Case {
            name: "the hit shoot's first outage after its loss fails over, the longest later one moves back",
            events: vec![fault(8.0), loss(8.1, "k2")],
            shoots: vec![
                shoot("k1", &[(2.0, 5.0), (20.0, 20.5)], 0, 0, 0),
                shoot("k2", &[(1.0, 1.5), (7.9, 17.9), (30.0, 41.0), (50.0, 52.0)], 0, 0, 0),
                shoot("k3", &[], 0, 0, 0),
            ],
            // k2's blip at 1.0 came before its loss; k1's 3 s before the first fault
            want: (Some(10.0), Some(11.0), 0.5),
        },
        Case {
            name: "two hit shoots: the longest of each kind",
            events: vec![fault(8.0), loss(8.0, "k2"), loss(15.0, "k1")],
            shoots: vec![
                shoot("k1", &[(14.8, 30.8)], 0, 0, 0),
                shoot("k2", &[(7.9, 19.9), (40.0, 44.0)], 0, 0, 0),
                shoot("k3", &[(9.0, 9.25)], 0, 0, 0),
            ],
            want: (Some(16.0), Some(4.0), 0.25),
        },
        Case {
            name: "nothing lost: every shoot a bystander",
            events: vec![fault(8.0)],
            shoots: vec![shoot("k1", &[(9.0, 11.0)], 0, 0, 0), shoot("k2", &[], 0, 0, 0)],
            want: (None, None, 2.0),
        },
        Case {
            name: "a hit shoot that never went down has no failover outage",
            events: vec![fault(8.0), loss(8.0, "k2")],
            shoots: vec![shoot("k2", &[], 0, 0, 0)],
            want: (None, None, 0.0),
        },
    ];
    for c in cases {
        let got = RunOutages::of(&run("d", None, 1, c.events, c.shoots));
        let rounded = |v: f64| (v * 1000.0).round() / 1000.0;
        assert_eq!(
            (
                got.failover.map(rounded),
                got.move_back.map(rounded),
                rounded(got.bystanders)
            ),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn runs_are_grouped_per_drill_and_build_with_counts_and_spans() {
    let hit = |f: f64, back: f64, seed: u64, build: Option<&str>| {
        run(
            "kill-seed",
            build,
            seed,
            vec![fault(8.0), loss(8.0, "k2")],
            vec![
                shoot("k1", &[], 100, 0, 0),
                shoot("k2", &[(8.0, 8.0 + f), (40.0, 40.0 + back)], 50, 0, 2),
            ],
        )
    };
    let mut failed = hit(12.0, 9.0, 3, Some("b1"));
    failed.passed = false;
    failed.failures = vec!["k2 lost 1 acknowledged write".into(), "second".into()];
    failed.shoots[1].lost_writes = 1;
    failed.double_serving = vec![DoubleServing {
        t: 9.0,
        shoot: "k2".into(),
        members: vec!["k1".into(), "k3".into()],
    }];
    let results = vec![
        hit(10.0, 11.0, 1, Some("b1")),
        hit(8.0, 12.0, 2, Some("b1")),
        failed,
        hit(20.0, 20.0, 4, Some("b2")),
        hit(30.0, 30.0, 5, None),
        run(
            "clock-skew",
            Some("b1"),
            9,
            vec![],
            vec![shoot("c1", &[], 5, 0, 0)],
        ),
    ];
    let got = summarize(&results);
    let keys: Vec<_> = got
        .iter()
        .map(|s| (s.drill.as_str(), s.build.as_deref(), s.runs))
        .collect();
    assert_eq!(
        keys,
        [
            ("clock-skew", Some("b1"), 1),
            ("kill-seed", None, 1),
            ("kill-seed", Some("b1"), 3),
            ("kill-seed", Some("b2"), 1),
        ]
    );
    let b1 = &got[2];
    assert_eq!((b1.passed, b1.seeds.clone()), (2, vec![1, 2, 3]));
    assert_eq!(
        b1.failover,
        Some(Span {
            min: 8.0,
            max: 12.0
        })
    );
    assert_eq!(
        b1.move_back,
        Some(Span {
            min: 9.0,
            max: 12.0
        })
    );
    assert_eq!(
        (b1.acked_writes, b1.lost_writes, b1.lost_beyond_durable),
        (450, 1, 6)
    );
    assert_eq!(b1.double_serving_runs, 1);
    assert_eq!(b1.failures, ["seed 3: k2 lost 1 acknowledged write"]);
    assert_eq!(got[0].failover, None);
}

#[test]
fn results_are_read_from_folders_and_other_json_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("p2");
    std::fs::create_dir(&nested).unwrap();
    let r = run("kill-seed", Some("b1"), 7, vec![], vec![]);
    std::fs::write(
        dir.path().join("kill-seed-1.json"),
        serde_json::to_vec(&r).unwrap(),
    )
    .unwrap();
    std::fs::write(
        nested.join("kill-seed-1.json"),
        serde_json::to_vec(&r).unwrap(),
    )
    .unwrap();
    std::fs::write(nested.join("kill-seed-1.html"), "<html>").unwrap();
    std::fs::write(nested.join("other.json"), "{\"a\": 1}").unwrap();
    let Loaded { results, skipped } = load_results(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].0.ends_with("p2/other.json"), "{skipped:?}");
    assert!(
        skipped[0].1.starts_with("not a drill result"),
        "{skipped:?}"
    );
    // a result written before runs recorded their build still reads
    let mut old = serde_json::to_value(&r).unwrap();
    old.as_object_mut().unwrap().remove("build");
    std::fs::write(nested.join("old.json"), old.to_string()).unwrap();
    let results = load_results(std::slice::from_ref(&nested)).unwrap().results;
    assert_eq!(results.iter().filter(|r| r.build.is_none()).count(), 1);
    // a path that does not exist is an error naming it
    let err = load_results(&[dir.path().join("nope")]).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn the_build_digest_changes_with_any_binary() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("ringd"), dir.path().join("ring-node"));
    std::fs::write(&a, b"one").unwrap();
    std::fs::write(&b, b"two").unwrap();
    let first = build_digest(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(first.len(), 12);
    assert_eq!(first, build_digest(&[a.clone(), b.clone()]).unwrap());
    std::fs::write(&b, b"twp").unwrap();
    let second = build_digest(&[a.clone(), b.clone()]).unwrap();
    assert_ne!(first, second);
    std::fs::remove_file(&b).unwrap();
    assert_ne!(second, build_digest(&[a, b]).unwrap());
}
