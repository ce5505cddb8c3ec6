//! Table tests of the leader's hot standby decisions (protection `standby`).

use super::*;
use crate::state::Standby;

const T: DecisionTiming = DecisionTiming {
    failure_window_ms: 3_000,
    lease_ms: 6_000,
    lease_margin_ms: 500,
    relink_after_ms: 30_000,
    operation_deadline_ms: 1_200_000,
    protection: Protection::Standby,
};

fn view<'a>(now_ms: u64, reports: &'a BTreeMap<String, u64>) -> LeaderView<'a> {
    LeaderView {
        now_ms,
        leader_since_ms: 0,
        followed: None,
        leader: "b",
        last_report_ms: reports,
        lease_seen_ms: &NONE,
        revisions: &NO_REVISIONS,
    }
}

/// shoot → standby member, from the SetStandby commands.
fn standbys(cmds: &[RingCommand]) -> Vec<(String, Option<String>)> {
    cmds.iter()
        .filter_map(|c| match c {
            RingCommand::SetStandby { shoot, member, .. } => Some((shoot.clone(), member.clone())),
            _ => None,
        })
        .collect()
}

fn set(s: &mut RingState, shoot: &str, member: &str, ready: bool) {
    let p = s.placements.get_mut(shoot).unwrap();
    p.standby = Some(Standby {
        member: member.into(),
        ready,
        warm: false,
    });
}

#[test]
fn each_shoot_gets_a_standby_on_the_member_that_would_take_it_over() {
    // a hosts b, b hosts c, c hosts a; a failover of a host goes to its predecessor
    let s = ring(&["a", "b", "c"]);
    let r = BTreeMap::from([("a".to_string(), 9_900), ("c".to_string(), 9_900)]);
    let got = standbys(&decide(&s, &view(10_000, &r), &T));
    // b's host a: predecessor c; c's host b: predecessor a; a's host c: predecessor b
    let mut got = got;
    got.sort();
    assert_eq!(got.len(), 3, "{got:?}");
    for (shoot, member) in &got {
        let host = &s.placements[shoot].host;
        assert_ne!(member.as_deref(), Some(host.as_str()), "never on the host");
    }
    assert_eq!(
        got,
        vec![
            ("a".into(), Some("b".into())),
            ("b".into(), Some("c".into())),
            ("c".into(), Some("a".into())),
        ]
    );
    // backup protection assigns none, and drops one that exists
    let mut s = s;
    set(&mut s, "b", "c", true);
    let backup = DecisionTiming {
        protection: Protection::Backup,
        ..T
    };
    let got = standbys(&decide(&s, &view(10_000, &r), &backup));
    assert_eq!(got, vec![("b".into(), None)]);
}

#[test]
fn a_dead_host_with_a_ready_standby_is_promoted_there_else_restored_from_the_bucket() {
    // ring a, b, c, d: a hosts b and dies; a's predecessor d would take b
    // over (and holds its standby); with d dead too, c would.
    // (standby, ready, d alive) → (target, promote)
    let cases = [
        (Some("d"), true, true, ("d", true)),
        (Some("d"), false, true, ("d", false)),
        (Some("d"), true, false, ("c", false)),
        (None, false, true, ("d", false)),
    ];
    for (standby, ready, alive, want) in cases {
        let mut s = ring(&["a", "b", "c", "d"]);
        if let Some(m) = standby {
            set(&mut s, "b", m, ready);
        }
        let mut r = BTreeMap::from([("c".to_string(), 9_900)]);
        if alive {
            r.insert("d".into(), 9_900);
        }
        let cmds = decide(&s, &view(10_000, &r), &T);
        let failover = cmds.iter().find_map(|c| match c {
            RingCommand::StartFailover {
                shoot, to, promote, ..
            } if shoot == "b" => Some((to.clone(), *promote)),
            _ => None,
        });
        assert_eq!(
            failover,
            Some((want.0.to_string(), want.1)),
            "standby {standby:?} ready {ready} d alive {alive}: {cmds:?}"
        );
    }
}

#[test]
fn a_standby_on_a_member_marked_down_is_dropped_and_one_is_chosen_again_later() {
    let mut s = ring(&["a", "b", "c"]);
    set(&mut s, "c", "a", true); // b hosts c, standby on a
    set(&mut s, "a", "b", true);
    set(&mut s, "b", "c", true);
    // a went silent: marked down; a hosted b, so b fails over (promoting c's standby)
    let r = BTreeMap::from([("b".to_string(), 9_900), ("c".to_string(), 9_900)]);
    let cmds = decide(&s, &view(10_000, &r), &T);
    assert!(cmds
        .iter()
        .any(|c| matches!(c, RingCommand::MarkDown { member, .. } if member == "a")));
    assert_eq!(standbys(&cmds), vec![("c".to_string(), None)], "{cmds:?}");
    assert!(cmds.iter().any(|c| matches!(
        c,
        RingCommand::StartFailover { shoot, to, promote: true, .. } if shoot == "b" && to == "c"
    )));
    for c in &cmds {
        s.apply(c).unwrap();
    }
    assert_eq!(s.placements["c"].standby, None);
    assert_eq!(
        s.placements["b"].standby, None,
        "a failover clears the standby"
    );
    let op = s.open_operation("b").unwrap();
    assert!(matches!(
        op.kind,
        OperationKind::Failover { promote: true, .. }
    ));
    // with a down and b's failover open, c (hosted by b) gets its standby on
    // the only other live member: c's own
    let again = standbys(&decide(&s, &view(10_200, &r), &T));
    assert_eq!(again, vec![("c".to_string(), Some("c".to_string()))]);
}
