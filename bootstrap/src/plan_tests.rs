//! The plan's order, table by table.
use super::*;

fn all(c: &RingConfig) -> BTreeSet<String> {
    c.members.iter().map(|m| m.name.clone()).collect()
}

/// Every step from `o` to `Done`, pretending each one succeeds.
fn walk(c: &RingConfig, o: &mut Observed) -> Vec<Step> {
    let mut seen = Vec::new();
    loop {
        let step = next_step(c, o);
        seen.push(step.clone());
        if !o.pretend(step) {
            return seen;
        }
    }
}

#[test]
fn fresh_dir_walks_every_step_in_order() {
    let c = RingConfig::default();
    let mut o = Observed::default();
    let seen = walk(&c, &mut o);
    // config, pki, member configs, 3 ringd, quorum, images, node network,
    // control planes (their CAs), 3 node configs, 3 nodes, kubeconfigs,
    // 3 renewals, nodes ready, done: the nodes start while the control
    // planes come up, renewals need their APIs
    assert_eq!(seen.len(), 3 + 3 + 1 + 2 + 1 + 3 + 3 + 1 + 3 + 2);
    assert_eq!(seen[3], Step::StartMember("m1".into()));
    assert_eq!(seen[6], Step::AwaitQuorum);
    assert_eq!(seen[7], Step::BuildImages);
    assert_eq!(seen[8], Step::CreateNodeNetwork);
    assert!(
        matches!(seen[9], Step::AwaitControlPlanes(_)),
        "{:?}",
        seen[9]
    );
    assert_eq!(seen[10], Step::ConfigureNode("m1".into()));
    assert_eq!(seen[13], Step::StartNode("m1".into()));
    assert!(
        matches!(seen[16], Step::PublishKubeconfigs(_)),
        "{:?}",
        seen[16]
    );
    assert_eq!(seen[17], Step::AllowRenewals("m1".into()));
    assert_eq!(
        seen[20],
        Step::AwaitNodes(vec!["m1".into(), "m2".into(), "m3".into()])
    );
    assert_eq!(seen[21], Step::Done);
    let mut without = c.clone();
    without.nodes.per_member = 0;
    let mut o = Observed::default();
    let mut n = 0;
    while o.pretend(next_step(&without, &o)) {
        n += 1;
    }
    assert_eq!(
        n,
        3 + 3 + 3,
        "a ring without nodes ends after its kubeconfigs"
    );
}

#[test]
fn rerun_on_a_complete_ring_is_done_and_a_stopped_member_is_restarted() {
    let c = RingConfig::default();
    let mut o = Observed {
        config_written: true,
        pki_complete: true,
        member_configs_written: true,
        running: all(&c),
        quorum: true,
        ready: all(&c),
        kubeconfigs: all(&c),
        images_built: true,
        node_network: true,
        nodes_configured: all(&c),
        renewals: all(&c),
        nodes_running: all(&c),
        nodes_ready: all(&c),
        ..Default::default()
    };
    assert_eq!(next_step(&c, &o), Step::Done);
    // a node that turns Ready again (its shoot's API was away) is waited
    // for: the rerun still found the ring up
    o.nodes_ready.remove("m3");
    let wait = next_step(&c, &o);
    assert_eq!(wait, Step::AwaitNodes(vec!["m3".into()]));
    assert!(!wait.acts(), "waiting changes nothing");
    o.nodes_ready.insert("m3".into());
    o.nodes_running.remove("m3");
    assert!(next_step(&c, &o).acts());
    assert_eq!(next_step(&c, &o), Step::StartNode("m3".into()));
    o.node_network = false;
    assert_eq!(
        next_step(&c, &o),
        Step::CreateNodeNetwork,
        "after `down` the network comes first"
    );
    o.running.remove("m2");
    assert_eq!(next_step(&c, &o), Step::StartMember("m2".into()));
}

#[test]
fn waits_for_the_control_planes_that_are_not_ready() {
    let c = RingConfig::default();
    let o = Observed {
        config_written: true,
        pki_complete: true,
        member_configs_written: true,
        running: all(&c),
        quorum: true,
        ready: ["m1".to_string()].into(),
        images_built: true,
        node_network: true,
        ..Default::default()
    };
    assert_eq!(
        next_step(&c, &o),
        Step::AwaitControlPlanes(vec!["m2".into(), "m3".into()])
    );
    // a node whose shoot's CA is there is configured meanwhile
    let with_ca = Observed {
        cas: ["m2".to_string()].into(),
        ..o.clone()
    };
    assert_eq!(next_step(&c, &with_ca), Step::ConfigureNode("m2".into()));
}

fn self_hosting(members: &[&str]) -> RingConfig {
    let mut c = RingConfig::default();
    c.self_hosting.members = members.iter().map(|m| m.to_string()).collect();
    c
}

/// A ring up as processes: every node Ready, each member hosting its successor.
fn up_as_processes(c: &RingConfig) -> Observed {
    Observed {
        config_written: true,
        pki_complete: true,
        member_configs_written: true,
        running: all(c),
        quorum: true,
        ready: all(c),
        kubeconfigs: all(c),
        images_built: true,
        node_network: true,
        nodes_configured: all(c),
        renewals: all(c),
        nodes_running: all(c),
        nodes_ready: all(c),
        placements: [("m1", "m3"), ("m2", "m1"), ("m3", "m2")]
            .iter()
            .map(|(s, h)| (s.to_string(), h.to_string()))
            .collect(),
        ..Default::default()
    }
}

#[test]
fn a_self_hosting_member_moves_its_successor_away_switches_its_seed_and_takes_it_back() {
    let c = self_hosting(&["m3"]);
    let mut o = up_as_processes(&c);
    let seen = walk(&c, &mut o);
    assert_eq!(
        seen,
        vec![
            // m1 waits on m2 (the next member after m3 that is not m1 itself)
            Step::Evacuate {
                shoot: "m1".into(),
                from: "m3".into(),
                to: "m2".into()
            },
            Step::SwitchSeed("m3".into()),
            Step::AwaitQuorum,
            Step::Pivot {
                shoot: "m1".into(),
                to: "m3".into()
            },
            Step::Done,
        ]
    );
    assert_eq!(o.placements["m1"], "m3");
    // a ring without selfHosting is done at the same point
    assert_eq!(
        next_step(&RingConfig::default(), &up_as_processes(&c)),
        Step::Done
    );
}

#[test]
fn self_hosting_resumes_where_it_stopped_and_waits_for_moves_in_flight() {
    let c = self_hosting(&["m3"]);
    let mut o = up_as_processes(&c);
    // evacuated earlier, the seed was not switched yet
    o.placements.insert("m1".into(), "m2".into());
    assert_eq!(next_step(&c, &o), Step::SwitchSeed("m3".into()));
    // a move in flight (e.g. the evacuation a crashed bootstrap started)
    o.moving.insert("m1".into());
    assert_eq!(next_step(&c, &o), Step::AwaitMoves(vec!["m1".into()]));
    o.moving.clear();
    // switched and pivoted: done; a lost ringd is started again first
    o.pod_seeds.insert("m3".into());
    o.placements.insert("m1".into(), "m3".into());
    assert_eq!(next_step(&c, &o), Step::Done);
    o.running.remove("m3");
    assert_eq!(next_step(&c, &o), Step::StartMember("m3".into()));
}

#[test]
fn after_down_pods_wait_for_their_node_while_processes_are_awaited_first() {
    let c = self_hosting(&["m3"]);
    let mut o = up_as_processes(&c);
    o.pod_seeds.insert("m3".into());
    o.placements.insert("m1".into(), "m3".into());
    // everything restarted: ringd up, nodes not yet, m1's pods cannot run
    o.ready = ["m2".to_string(), "m3".to_string()].into();
    o.node_network = false;
    o.nodes_running.clear();
    o.nodes_ready.clear();
    assert_eq!(
        next_step(&c, &o),
        Step::CreateNodeNetwork,
        "the nodes come before waiting for the control plane in pods"
    );
    o.node_network = true;
    o.nodes_running = all(&c);
    o.nodes_ready = all(&c);
    assert_eq!(
        next_step(&c, &o),
        Step::AwaitControlPlanes(vec!["m1".into()])
    );
    // the nodes are set up while a control plane in processes comes up,
    // which is awaited before anything else
    o.ready.remove("m2");
    o.node_network = false;
    assert_eq!(next_step(&c, &o), Step::CreateNodeNetwork);
    o.node_network = true;
    assert_eq!(
        next_step(&c, &o),
        Step::AwaitControlPlanes(vec!["m2".into()])
    );
}

/// Walks `c` from `o` to `Done`, checking at every switch that the member
/// hosts nothing and that no shoot ever runs in pods on its own node.
fn walk_checked(c: &RingConfig, o: &mut Observed) -> Vec<Step> {
    let mut seen = Vec::new();
    loop {
        let step = next_step(c, o);
        if let Step::SwitchSeed(m) = &step {
            assert!(
                !o.placements.values().any(|h| h == m),
                "{m} switches while hosting: {:?}",
                o.placements
            );
        }
        for m in flat(std::slice::from_ref(&step)) {
            if let Step::Evacuate { shoot, to, .. } | Step::Pivot { shoot, to } = &m {
                assert!(
                    shoot != to || !o.pod_seeds.contains(to),
                    "{shoot} in pods on its own node"
                );
            }
        }
        seen.push(step.clone());
        if !o.pretend(step) {
            return seen;
        }
    }
}

/// Each shoot in pods on its predecessor: the closed ring.
fn closed(o: &Observed) -> bool {
    let want = [("m1", "m3"), ("m2", "m1"), ("m3", "m2")];
    want.iter()
        .all(|(s, h)| o.placements[*s] == *h && o.pod_seeds.contains(*h))
}

#[test]
fn a_closed_ring_switches_the_last_member_first_and_the_last_move_is_pods_to_pods() {
    let c = self_hosting(&["m1", "m2", "m3"]);
    assert_eq!(pivot_order(&c), ["m3", "m1", "m2"]);
    assert_eq!(pivot_order(&self_hosting(&["m2", "m1"])), ["m2", "m1"]);
    let mut o = up_as_processes(&c);
    let seen = walk_checked(&c, &mut o);
    let switches: Vec<&Step> = seen
        .iter()
        .filter(|s| matches!(s, Step::SwitchSeed(_)))
        .collect();
    assert_eq!(
        switches,
        [
            &Step::SwitchSeed("m3".into()),
            &Step::SwitchSeed("m1".into()),
            &Step::SwitchSeed("m2".into())
        ]
    );
    // no member hosts as processes when m3's control plane leaves m2:
    // it waits in pods on m1 (not on m3, its own shoot)
    assert!(flat(&seen).contains(&Step::Evacuate {
        shoot: "m3".into(),
        from: "m2".into(),
        to: "m1".into()
    }));
    assert_eq!(seen.last(), Some(&Step::Done));
    assert!(closed(&o), "{:?}", o.placements);
}

/// The steps of a walk with the moves made together ([`Step::Moves`]) one
/// after the other.
fn flat(seen: &[Step]) -> Vec<Step> {
    seen.iter()
        .flat_map(|s| match s {
            Step::Moves(m) => m.clone(),
            s => vec![s.clone()],
        })
        .collect()
}

/// The moves (evacuations and pivots) of a walk.
fn moves(seen: &[Step]) -> usize {
    flat(seen)
        .iter()
        .filter(|s| matches!(s, Step::Evacuate { .. } | Step::Pivot { .. }))
        .count()
}

/// A new self-hosted ring starts its shoots where they need not move away
/// before their host switches: a closed ring of 3 closes in 4 moves (6 when
/// every shoot starts on its predecessor), a ring where m2 and m1 switch in
/// 2 (4 before); every member switches while hosting nothing.
#[test]
fn a_new_self_hosted_ring_starts_shoots_where_each_moves_once() {
    let start = |c: &RingConfig| {
        let mut o = up_as_processes(c);
        for (shoot, host) in initial_hosts(c) {
            o.placements.insert(shoot, host);
        }
        o
    };
    let closed_ring = self_hosting(&["m1", "m2", "m3"]);
    let want: BTreeMap<String, String> = [("m1", "m2"), ("m2", "m2")]
        .iter()
        .map(|(s, h)| (s.to_string(), h.to_string()))
        .collect();
    assert_eq!(initial_hosts(&closed_ring), want, "m2 switches last");
    let mut o = start(&closed_ring);
    let seen = walk_checked(&closed_ring, &mut o);
    assert_eq!(moves(&seen), 4, "{seen:?}");
    assert!(closed(&o), "{:?}", o.placements);
    // m3 and m1 switch at once; m3 leaves m2 (into pods on m1) together
    // with m2 going into pods on m1: neither needs the other's API. m1 into
    // m3 waits for m3's move (its pods start through m3's API)
    let evacuate = |s: &str, f: &str, t: &str| Step::Evacuate {
        shoot: s.into(),
        from: f.into(),
        to: t.into(),
    };
    let pivot = |s: &str, t: &str| Step::Pivot {
        shoot: s.into(),
        to: t.into(),
    };
    // and each switch waits until the restarted ringd knows the leader again
    assert_eq!(
        seen[seen.len() - 10..],
        [
            Step::SwitchSeed("m3".into()),
            Step::AwaitQuorum,
            Step::SwitchSeed("m1".into()),
            Step::AwaitQuorum,
            Step::Moves(vec![evacuate("m3", "m2", "m1"), pivot("m2", "m1")]),
            pivot("m1", "m3"),
            Step::SwitchSeed("m2".into()),
            Step::AwaitQuorum,
            pivot("m3", "m2"),
            Step::Done,
        ]
    );
    let mut before = up_as_processes(&closed_ring);
    assert_eq!(moves(&walk_checked(&closed_ring, &mut before)), 6);

    let partial = self_hosting(&["m2", "m1"]);
    assert_eq!(
        initial_hosts(&partial).into_iter().collect::<Vec<_>>(),
        [
            ("m2".to_string(), "m3".to_string()),
            ("m3".into(), "m3".into())
        ]
    );
    let mut o = start(&partial);
    let seen = walk_checked(&partial, &mut o);
    assert_eq!(moves(&seen), 2, "{seen:?}");
    assert_eq!(o.placements["m3"], "m2");
    assert_eq!(o.placements["m2"], "m1");
    // no self-hosting: every shoot on its predecessor
    assert!(initial_hosts(&RingConfig::default()).is_empty());
}

#[test]
fn a_stopped_closed_ring_cold_starts_one_control_plane_as_processes_and_pivots_it_back() {
    let c = self_hosting(&["m1", "m2", "m3"]);
    let mut o = up_as_processes(&c);
    walk_checked(&c, &mut o);
    // after `down` and a restart of ringd and nodes: nothing serves
    o.ready.clear();
    o.nodes_ready.clear();
    assert_eq!(
        next_step(&c, &o),
        Step::ColdStart {
            member: "m1".into(),
            shoot: "m2".into()
        }
    );
    // not while the nodes are still starting: they come first
    let mut starting = o.clone();
    starting.nodes_running.remove("m2");
    assert_eq!(next_step(&c, &starting), Step::StartNode("m2".into()));
    // not while any control plane serves (a ring that is only slow)
    let mut slow = o.clone();
    slow.ready.insert("m3".into());
    assert_eq!(
        next_step(&c, &slow),
        Step::AwaitNodes(vec!["m1".into(), "m2".into(), "m3".into()])
    );
    // stopped after a failover put m2 on m3 too: m2 hosts m3, where it is
    let mut after_failover = o.clone();
    after_failover.placements.insert("m2".into(), "m3".into());
    assert_eq!(
        next_step(&c, &after_failover),
        Step::ColdStart {
            member: "m2".into(),
            shoot: "m3".into()
        }
    );
    let back = walk_checked(&c, &mut after_failover);
    assert_eq!(back.last(), Some(&Step::Done));
    assert!(closed(&after_failover), "{:?}", after_failover.placements);
    let seen = walk_checked(&c, &mut o);
    assert_eq!(
        seen[1..],
        [
            Step::Evacuate {
                shoot: "m2".into(),
                from: "m1".into(),
                to: "m3".into()
            },
            Step::SwitchSeed("m1".into()),
            Step::AwaitQuorum,
            Step::Pivot {
                shoot: "m2".into(),
                to: "m1".into()
            },
            Step::Done
        ]
    );
    assert!(closed(&o), "{:?}", o.placements);
}

/// Which moves may run at once: different shoots, and neither takes away
/// the API of a shoot whose node the other one starts or stops pods on.
#[test]
fn moves_go_together_only_when_neither_needs_the_api_the_other_takes_away() {
    // m3 and m1 host as pods; m2 as processes, and hosts every shoot
    let o = Observed {
        pod_seeds: ["m1".to_string(), "m3".to_string()].into(),
        placements: ["m1", "m2", "m3"]
            .iter()
            .map(|s| (s.to_string(), "m2".to_string()))
            .collect(),
        ..Default::default()
    };
    let pivot = |s: &str, t: &str| Step::Pivot {
        shoot: s.into(),
        to: t.into(),
    };
    let evacuate = |s: &str, t: &str| Step::Evacuate {
        shoot: s.into(),
        from: "m2".into(),
        to: t.into(),
    };
    let mut in_pods_on_m1 = o.clone();
    in_pods_on_m1.placements.insert("m3".into(), "m1".into());
    let cases = [
        (
            "both into m1's pods",
            &o,
            evacuate("m3", "m1"),
            pivot("m2", "m1"),
            true,
        ),
        (
            "into pods through the API that moves",
            &o,
            evacuate("m3", "m1"),
            pivot("m1", "m3"),
            false,
        ),
        (
            "the same shoot",
            &o,
            pivot("m2", "m1"),
            pivot("m2", "m3"),
            false,
        ),
        (
            "onto a process host: no API needed",
            &o,
            evacuate("m1", "m2"),
            pivot("m2", "m3"),
            true,
        ),
        (
            "out of pods through the API that moves",
            &in_pods_on_m1,
            pivot("m3", "m2"),
            pivot("m1", "m3"),
            false,
        ),
        (
            "not a move",
            &o,
            pivot("m2", "m1"),
            Step::SwitchSeed("m2".into()),
            false,
        ),
    ];
    for (name, o, a, b, want) in cases {
        assert_eq!(independent(o, &a, &b), want, "{name}");
        assert_eq!(independent(o, &b, &a), want, "{name} (the other way)");
    }
    let both = Step::Moves(vec![evacuate("m3", "m1"), pivot("m2", "m1")]);
    assert_eq!(
        both.label(),
        "move m3 off m2 to m1; move m2 into pods on m1"
    );
}
