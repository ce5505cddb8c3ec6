//! What a drill run found, and the pure functions that turn observations into
//! figures (outages, RTO, lost writes) and a verdict.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::drill::{Expectations, LostWrites};

/// The result of one run of a drill (written as JSON next to the HTML report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    pub drill: String,
    /// 1-based run number (with `--repeat`).
    pub run: usize,
    /// The RNG seed this run used (replay it with `--seed`).
    pub seed: u64,
    pub passed: bool,
    /// Why it failed (empty when it passed).
    pub failures: Vec<String>,
    /// Wall clock at the workload's start (ms since the Unix epoch); times below are seconds from it.
    pub started_at_ms: u64,
    /// Seconds from the workload's start to the end of the check.
    pub duration_secs: f64,
    /// Seconds bootstrapping the ring took.
    pub setup_secs: f64,
    pub members: Vec<String>,
    pub bucket: String,
    /// How members are isolated from each other (network namespaces or loopback).
    pub isolation: String,
    pub events: Vec<Event>,
    pub shoots: Vec<ShootFigures>,
    /// Every time two seeds had control-plane processes of one shoot at once.
    pub double_serving: Vec<DoubleServing>,
    /// Seconds until the ring converged after the last fault (every member hosting its successor).
    pub converged_secs: Option<f64>,
    /// The build that ran the drill ([`crate::summary::build_digest`] of ringctl,
    /// ringd and ring-node); `None` in results written before runs recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
}

/// Something that happened, `t` seconds after the workload started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub t: f64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Kinds of events on the timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum EventKind {
    /// A fault fired (`member`: the member it hit, for kills).
    Fault {
        action: String,
        detail: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member: Option<String>,
    },
    /// The Raft leader changed (`None`: no leader visible).
    Leader { leader: Option<String> },
    /// An operation (failover or migration) reached a step.
    Operation {
        id: u64,
        kind: String,
        shoot: String,
        from: String,
        to: String,
        step: String,
        detail: String,
        /// What a finished failover said clients may have lost (revisions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        may_lose_revisions: Option<i64>,
        /// The rest of what a finished failover reported of its loss.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reported: Option<crate::lost::Reported>,
    },
    /// The members with control-plane processes of a shoot changed.
    Serving { shoot: String, members: Vec<String> },
    /// A notable line of a member's ringd log (a corrupt snapshot skipped, a fenced control plane).
    Log { member: String, line: String },
    /// A shoot's control plane was killed; writes newer than `durableRevision` may be lost.
    Loss {
        shoot: String,
        durable_revision: Option<i64>,
        /// Age of the newest object in the bucket when it was lost.
        durable_age_secs: Option<f64>,
    },
}

/// Two or more seeds ran control-plane processes of one shoot at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DoubleServing {
    pub t: f64,
    pub shoot: String,
    pub members: Vec<String>,
}

/// Per-shoot figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShootFigures {
    pub shoot: String,
    /// Intervals (seconds) in which the API answered.
    pub available: Vec<(f64, f64)>,
    /// Intervals in which it did not, from the last good answer to the next one.
    pub outages: Vec<(f64, f64)>,
    /// The longest outage (0: never down); `None`: it never came back.
    pub rto_secs: Option<f64>,
    pub acked_writes: u64,
    pub failed_writes: u64,
    /// Acknowledged writes missing at the end, though durable (or moved by a planned migration).
    pub lost_writes: u64,
    /// Acknowledged writes missing at the end that were newer than the last durable delta.
    pub lost_beyond_durable: u64,
    /// Of those, the ones the ring's finished failovers did not report as
    /// possibly lost (neither counted nor acknowledged while the old host
    /// may have served unheard).
    #[serde(default)]
    pub lost_unreported: u64,
    /// Examples of lost writes (name@resourceVersion).
    pub lost_examples: Vec<String>,
    /// Revisions between the durable revision and the newest acknowledged write at the loss.
    pub rpo_revisions: Option<i64>,
    /// Age of the newest durable delta when the control plane was lost.
    pub rpo_secs: Option<f64>,
    /// What the ring itself said clients may have lost, in revisions, over
    /// the shoot's finished failovers (`None`: no failover said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_may_lose_revisions: Option<i64>,
}

pub use crate::lost::{Ack, FailoverReport, LossPoint, Present};

/// A time interval in seconds since the workload started.
pub type Interval = (f64, f64);

/// Availability samples `(t, ok)` (in time order) → (up intervals, outages).
/// An outage runs from the last good answer before it to the first one after it
/// (to the last sample when the API never came back).
pub fn intervals(samples: &[(f64, bool)]) -> (Vec<Interval>, Vec<Interval>) {
    let (mut up, mut down) = (Vec::new(), Vec::new());
    let mut up_since: Option<f64> = None;
    let mut last_ok: Option<f64> = None;
    let mut down_since: Option<f64> = None;
    for &(t, ok) in samples {
        if ok {
            if let Some(d) = down_since.take() {
                down.push((last_ok.unwrap_or(d), t));
            }
            up_since.get_or_insert(t);
            last_ok = Some(t);
        } else {
            if let Some(u) = up_since.take() {
                up.push((u, last_ok.unwrap_or(u)));
            }
            down_since.get_or_insert(t);
        }
    }
    if let (Some(u), Some(l)) = (up_since, last_ok) {
        up.push((u, l));
    }
    if let (Some(d), Some(&(end, _))) = (down_since, samples.last()) {
        down.push((last_ok.unwrap_or(d), end));
    }
    (up, down)
}

/// The longest outage that overlaps the time after `from` (a first fault); `None`
/// when the API was down at the last sample (it never came back).
pub fn rto(samples: &[(f64, bool)], from: f64) -> Option<f64> {
    if samples.last().is_some_and(|(_, ok)| !ok) {
        return None;
    }
    let (_, outages) = intervals(samples);
    Some(
        outages
            .iter()
            .filter(|(_, end)| *end >= from)
            .map(|(s, e)| e - s)
            .fold(0.0, f64::max),
    )
}

/// The failures of a run against its expectations.
pub fn verdict(expect: &Expectations, r: &RunResult) -> Vec<String> {
    let mut failures = Vec::new();
    for s in &r.shoots {
        match s.rto_secs {
            None => failures.push(format!(
                "shoot {}: its API did not answer again before the drill ended",
                s.shoot
            )),
            Some(rto) if rto > expect.max_rto_secs => failures.push(format!(
                "shoot {}: RTO {rto:.1}s exceeds the bound of {:.0}s",
                s.shoot, expect.max_rto_secs
            )),
            _ => {}
        }
        if s.lost_writes > 0 {
            failures.push(format!(
                "shoot {}: {} acknowledged writes lost that had to survive (e.g. {})",
                s.shoot,
                s.lost_writes,
                s.lost_examples.join(", ")
            ));
        }
        if s.lost_unreported > 0 {
            failures.push(format!(
                "shoot {}: {} acknowledged writes lost beyond what the ring reported as possibly lost (e.g. {})",
                s.shoot,
                s.lost_unreported,
                s.lost_examples.join(", ")
            ));
        }
        if expect.lost_writes == LostWrites::None && s.lost_beyond_durable > 0 {
            failures.push(format!(
                "shoot {}: {} acknowledged writes lost (the drill allows none)",
                s.shoot, s.lost_beyond_durable
            ));
        }
        if s.acked_writes == 0 {
            failures.push(format!(
                "shoot {}: no write was acknowledged, so nothing was checked",
                s.shoot
            ));
        }
    }
    if expect.no_double_serving {
        let shoots: BTreeSet<&str> = r.double_serving.iter().map(|d| d.shoot.as_str()).collect();
        for shoot in shoots {
            let first = r.double_serving.iter().find(|d| d.shoot == shoot);
            if let Some(d) = first {
                failures.push(format!(
                    "shoot {shoot}: control planes on {} at once (first at {:.1}s)",
                    d.members.join(" and "),
                    d.t
                ));
            }
        }
    }
    if expect.no_double_serving {
        failures.extend(zombies(r));
    }
    for text in &expect.logged {
        let seen = r.events.iter().any(|e| match &e.kind {
            EventKind::Log { line, .. } => line.contains(text.as_str()),
            _ => false,
        });
        if !seen {
            failures.push(format!("no member logged {text:?}"));
        }
    }
    if expect.converge && r.converged_secs.is_none() {
        failures
            .push("the ring did not converge to every member hosting its successor".to_string());
    }
    failures
}

/// Killed members that started a control plane again before the ring healed
/// them (a `heal` or `restoreFromBucket` fault) or moved that control plane
/// there: by a planned migration (a returned member's successor coming home)
/// or by a failover that chose the returned member (the shoot's new host
/// died too). A zombie must never serve.
pub fn zombies(r: &RunResult) -> Vec<String> {
    let mut dead: BTreeSet<String> = BTreeSet::new();
    // (member, shoot) the ring itself moved back after the kill
    let mut moved_back: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut last: BTreeMap<&str, &[String]> = BTreeMap::new();
    let mut out = Vec::new();
    for e in &r.events {
        match &e.kind {
            EventKind::Fault { action, member, .. } => match action.as_str() {
                "killSeed" | "killMachine" | "stallRingd" => dead.extend(member.clone()),
                "loseRing" => dead.extend(r.members.iter().cloned()),
                "heal" | "restoreFromBucket" => dead.clear(),
                _ => {}
            },
            EventKind::Operation {
                kind, shoot, to, ..
            } if kind == "migration" || kind == "failover" => {
                moved_back.insert((to.as_str(), shoot.as_str()));
            }
            EventKind::Serving { shoot, members } => {
                let before = last.get(shoot.as_str()).copied().unwrap_or(&[]);
                for m in members.iter().filter(|m| !before.contains(m)) {
                    if dead.contains(m) && !moved_back.contains(&(m.as_str(), shoot.as_str())) {
                        out.push(format!(
                            "killed member {m} started shoot {shoot}'s control plane again at {:.1}s, before the ring healed it",
                            e.t
                        ));
                    }
                }
                last.insert(shoot, members);
            }
            _ => {}
        }
    }
    out
}

/// What the ring's finished failovers of `shoot` said clients may have lost,
/// added up (`None`: none said).
pub fn ring_may_lose(events: &[Event], shoot: &str) -> Option<i64> {
    finished_failovers(events, shoot)
        .filter_map(|(n, _)| n)
        .fold(None, |sum, n| Some(sum.unwrap_or(0) + n))
}

/// The reports of the ring's finished failovers of `shoot`.
pub fn failover_reports(events: &[Event], shoot: &str) -> Vec<FailoverReport> {
    finished_failovers(events, shoot)
        .filter_map(|(may_lose_revisions, reported)| {
            Some(FailoverReport {
                may_lose_revisions,
                reported: reported?,
            })
        })
        .collect()
}

/// What each finished failover of `shoot` said: revisions counted past the
/// restore, and the rest of its report.
fn finished_failovers<'a>(
    events: &'a [Event],
    shoot: &'a str,
) -> impl Iterator<Item = (Option<i64>, Option<crate::lost::Reported>)> + 'a {
    events.iter().filter_map(move |e| match &e.kind {
        EventKind::Operation {
            kind,
            shoot: s,
            step,
            may_lose_revisions,
            reported,
            ..
        } if kind == "failover" && s == shoot && step == "Done" => {
            Some((*may_lose_revisions, *reported))
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_run_from_the_last_good_answer_to_the_next() {
        let s = [
            (0.0, true),
            (1.0, true),
            (2.0, false),
            (3.0, false),
            (4.5, true),
            (5.0, true),
        ];
        let (up, down) = intervals(&s);
        assert_eq!(up, [(0.0, 1.0), (4.5, 5.0)]);
        assert_eq!(down, [(1.0, 4.5)]);
        assert_eq!(rto(&s, 1.5), Some(3.5));
        assert_eq!(rto(&s, 4.0), Some(3.5), "the outage ended after the fault");
        assert_eq!(rto(&s, 4.9), Some(0.0), "the outage ended before the fault");
        assert_eq!(rto(&s, 6.0), Some(0.0));
        let never_back = [(0.0, true), (1.0, false)];
        assert_eq!(rto(&never_back, 0.5), None);
        assert_eq!(intervals(&never_back).1, [(0.0, 1.0)]);
    }

    fn result() -> RunResult {
        RunResult {
            drill: "d".into(),
            run: 1,
            seed: 1,
            passed: false,
            failures: vec![],
            started_at_ms: 0,
            duration_secs: 10.0,
            setup_secs: 1.0,
            members: vec!["a1".into()],
            bucket: "file:///b".into(),
            isolation: "loopback".into(),
            events: vec![],
            shoots: vec![ShootFigures {
                shoot: "a1".into(),
                available: vec![],
                outages: vec![],
                rto_secs: Some(12.0),
                acked_writes: 10,
                failed_writes: 0,
                lost_writes: 0,
                lost_beyond_durable: 2,
                lost_unreported: 0,
                lost_examples: vec![],
                rpo_revisions: None,
                rpo_secs: None,
                ring_may_lose_revisions: None,
            }],
            double_serving: vec![],
            converged_secs: Some(3.0),
            build: None,
        }
    }

    #[test]
    fn a_killed_member_starting_a_control_plane_before_the_heal_is_a_zombie() {
        let mut r = result();
        let ev = |t: f64, kind: EventKind| Event { t, kind };
        let serving = |m: &[&str]| EventKind::Serving {
            shoot: "a2".into(),
            members: m.iter().map(|s| s.to_string()).collect(),
        };
        let fault = |action: &str, member: Option<&str>| EventKind::Fault {
            action: action.into(),
            detail: String::new(),
            member: member.map(Into::into),
        };
        r.events = vec![
            ev(0.0, serving(&["a1"])),
            ev(5.0, fault("killSeed", Some("a1"))),
            ev(5.1, serving(&["a1"])), // still dying: not new
            ev(5.3, serving(&[])),
            ev(9.0, serving(&["a3"])),
            ev(20.0, fault("heal", None)),
            ev(25.0, serving(&["a1"])), // moved back by the heal: fine
        ];
        assert!(zombies(&r).is_empty(), "{:?}", zombies(&r));
        // without a heal: back on a1 only once the ring moves it there
        let op = |t: f64, kind: &str, shoot: &str, (from, to): (&str, &str)| Event {
            t,
            kind: EventKind::Operation {
                id: 7,
                kind: kind.into(),
                shoot: shoot.into(),
                from: from.into(),
                to: to.into(),
                step: "Pending".into(),
                detail: String::new(),
                may_lose_revisions: None,
                reported: None,
            },
        };
        let mut returned = r.clone();
        returned.events[5] = op(20.0, "migration", "a2", ("a3", "a1"));
        assert!(zombies(&returned).is_empty(), "{:?}", zombies(&returned));
        // another shoot's move is no licence
        returned.events[5] = op(20.0, "migration", "a3", ("a3", "a1"));
        assert_eq!(zombies(&returned).len(), 1);
        // a failover the ring made onto the returned member licenses it (the
        // shoot's new host died in turn); a failover away from it does not
        returned.events[5] = op(20.0, "failover", "a2", ("a3", "a1"));
        assert!(zombies(&returned).is_empty(), "{:?}", zombies(&returned));
        returned.events[5] = op(20.0, "failover", "a2", ("a1", "a3"));
        assert_eq!(zombies(&returned).len(), 1);
        r.events.insert(4, ev(7.0, serving(&["a1"])));
        let z = zombies(&r);
        assert_eq!(z.len(), 1, "{z:?}");
        assert!(z[0].starts_with("killed member a1 started shoot a2's control plane again at 7.0s"));
    }

    #[test]
    fn the_ring_s_may_lose_figures_add_up_over_finished_failovers_of_a_shoot() {
        let op = |kind: &str, shoot: &str, step: &str, n: Option<i64>| Event {
            t: 1.0,
            kind: EventKind::Operation {
                id: 1,
                kind: kind.into(),
                shoot: shoot.into(),
                from: "a1".into(),
                to: "a3".into(),
                step: step.into(),
                detail: String::new(),
                may_lose_revisions: n,
                reported: None,
            },
        };
        let events = [
            op("failover", "a2", "Done", Some(4)),
            op("failover", "a2", "Done", Some(7)),
            op("failover", "a2", "Restoring", Some(100)),
            op("migration", "a2", "Done", Some(100)),
            op("failover", "a3", "Done", Some(100)),
        ];
        assert_eq!(ring_may_lose(&events, "a2"), Some(11));
        assert_eq!(ring_may_lose(&events[2..4], "a2"), None);
    }

    #[test]
    fn verdict_names_each_broken_expectation() {
        let mut expect = Expectations {
            max_rto_secs: 30.0,
            lost_writes: LostWrites::BeyondDurable,
            no_double_serving: true,
            converge: true,
            deadline_secs: 600,
            logged: vec![],
        };
        let mut r = result();
        assert!(verdict(&expect, &r).is_empty());
        expect.logged = vec!["is corrupt".into()];
        assert_eq!(verdict(&expect, &r), ["no member logged \"is corrupt\""]);
        r.events.push(Event {
            t: 1.0,
            kind: EventKind::Log {
                member: "a2".into(),
                line: "WARN full-1 is corrupt (checksum)".into(),
            },
        });
        assert!(verdict(&expect, &r).is_empty());
        expect.lost_writes = LostWrites::None;
        assert!(verdict(&expect, &r)[0].contains("2 acknowledged writes lost"));
        expect.lost_writes = LostWrites::BeyondDurable;
        // beyond the durable, but not what the ring reported: never allowed
        r.shoots[0].lost_unreported = 1;
        assert_eq!(verdict(&expect, &r).len(), 1);
        assert!(verdict(&expect, &r)[0]
            .contains("1 acknowledged writes lost beyond what the ring reported as possibly lost"));
        r.shoots[0].lost_unreported = 0;
        r.shoots[0].rto_secs = Some(31.0);
        r.converged_secs = None;
        r.double_serving.push(DoubleServing {
            t: 4.0,
            shoot: "a1".into(),
            members: vec!["a2".into(), "a3".into()],
        });
        let f = verdict(&expect, &r);
        assert_eq!(f.len(), 3, "{f:?}");
        assert!(f[0].contains("RTO 31.0s exceeds"));
        assert!(f[1].contains("a2 and a3 at once"));
        assert!(f[2].contains("did not converge"));
    }
}
