//! What `ringctl status` shows: one member's view of the ring.

use serde::{Deserialize, Serialize};

use crate::config::Protection;
use crate::state::{MemberState, Operation, Standby};

/// The terminal width `ringctl status` fits: tables wrap long cells and
/// text wraps at words, so no line is cut off or runs over in a terminal of
/// this width; `-o json` carries every text whole.
pub const WIDTH: usize = 120;

/// A borderless table with `header` (what `render` prints), at most
/// [`WIDTH`] columns wide.
pub fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_width(WIDTH as u16)
        .set_header(header.iter().copied());
    t
}

/// `text` broken at spaces into lines of at most [`WIDTH`] characters, the
/// ones after the first indented by `indent` spaces; each line ends with a
/// newline. A word longer than a line stays whole on its own line.
pub fn wrap(text: &str, indent: usize) -> String {
    wrap_after("", text, indent)
}

/// [`wrap`] with the first line starting with `start` as it is (a label).
pub fn wrap_after(start: &str, text: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut line = start.to_string();
    let mut words = 0;
    for word in text.split_whitespace() {
        let len = line.chars().count();
        if words > 0 && len + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = " ".repeat(indent);
            words = 0;
        }
        if words > 0 {
            line.push(' ');
        }
        line.push_str(word);
        words += 1;
    }
    if words > 0 {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The start of an operation's detail that fits its column: up to the
/// first "; " and at most `max` characters; `ringctl describe operation`
/// shows the whole.
fn summary(detail: &str, max: usize) -> String {
    let head = detail.split("; ").next().unwrap_or(detail);
    if head.chars().count() <= max && head.len() == detail.len() {
        return head.to_string();
    }
    let cut: String = head.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", cut.trim_end())
}

/// A member as seen by the answering ringd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The member's name (its shoot's name).
    pub name: String,
    /// Its Raft id.
    pub id: u64,
    /// The host:port its ringd serves gRPC on.
    pub address: String,
    /// Up, or Down once the leader has not heard from it for the failure window.
    pub state: MemberState,
    /// It votes in Raft (a learner does not yet).
    pub voter: bool,
    /// It is the Raft leader.
    pub leader: bool,
    /// Milliseconds since the leader last heard from it (leader's view only).
    pub last_report_ms_ago: Option<u64>,
}

/// A shoot's control plane placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    /// The shoot whose control plane is placed.
    pub shoot: String,
    /// The member that hosts it.
    pub host: String,
    /// The placement's epoch: each move to another host raises it, and only
    /// the host of the current epoch may serve or back up.
    pub epoch: u64,
    /// Milliseconds until the lease ends (negative: ended), if any lease was granted.
    pub lease_expires_in_ms: Option<i64>,
    /// Milliseconds since the newest durable backup, if one was reported.
    pub last_backup_age_ms: Option<u64>,
    /// The etcd revision the newest durable backup reaches.
    pub last_backup_revision: Option<u64>,
    /// Health reported by the host (leader's view only).
    pub ready: Option<bool>,
    /// What its control plane runs, as the host reported (leader's view only).
    #[serde(default)]
    pub versions: seed::Versions,
    /// The hot standby (protection `standby`): its member and whether it votes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<crate::state::Standby>,
}

/// A control plane the answering member hosts (or fenced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedStatus {
    /// The shoot whose control plane this is.
    pub shoot: String,
    /// The epoch it runs (or last ran) under here.
    pub epoch: u64,
    /// Its processes run on this member.
    pub serving: bool,
    /// `/readyz` answered ok at the last check.
    pub ready: bool,
    /// Milliseconds the member's own lease stays valid (negative: lapsed).
    pub lease_valid_for_ms: Option<i64>,
    /// Why it is not serving, when it is not.
    pub detail: String,
    /// What its control plane runs, as the last health check found.
    #[serde(default)]
    pub versions: seed::Versions,
}

/// The answering member's view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RingStatus {
    /// The member whose ringd answered.
    pub member: String,
    /// Its Raft id.
    pub id: u64,
    /// Its Raft role: Leader, Follower, Candidate or PreCandidate.
    pub role: String,
    /// The leader it knows, if any.
    pub leader: Option<String>,
    /// Its Raft term.
    pub term: u64,
    /// The newest Raft log index it knows committed.
    pub commit_index: u64,
    /// The newest Raft log index it applied to its ring state.
    pub applied_index: u64,
    /// Whether this member heard from a leader within the election timeout.
    pub quorum_contact: bool,
    /// Every member of the ring.
    pub members: Vec<MemberStatus>,
    /// Where each shoot's control plane is placed.
    pub placements: Vec<PlacementStatus>,
    /// The control planes the answering member hosts (or fenced).
    pub hosted: Vec<HostedStatus>,
    /// Failovers and migrations: every open one and the newest finished ones.
    pub operations: Vec<Operation>,
    /// How the ring protects each shoot's etcd (the answering member's config).
    #[serde(default)]
    pub protection: Protection,
    /// The answering member's certificates: the ring CA, its member
    /// certificate, and the PKI of each control plane it hosts.
    #[serde(default)]
    pub certificates: Vec<crate::certs::CertificateStatus>,
}

impl RingStatus {
    /// The address of the leader this member knows, if it knows one.
    pub fn leader_address(&self) -> Option<&str> {
        let leader = self.leader.as_deref()?;
        self.members
            .iter()
            .find(|m| m.name == leader)
            .map(|m| m.address.as_str())
    }

    /// The shoots that should have a voting standby (protection `standby`)
    /// but have none yet: a failover of them restores from the bucket.
    pub fn degraded(&self) -> Vec<&str> {
        if self.protection != Protection::Standby {
            return Vec::new();
        }
        self.placements
            .iter()
            .filter(|p| !p.standby.as_ref().is_some_and(|s| s.ready))
            .map(|p| p.shoot.as_str())
            .collect()
    }
}

/// The STANDBY column: the member and whether it votes, or what protects
/// the shoot instead.
fn standby_cell(protection: Protection, standby: Option<&Standby>) -> String {
    match (protection, standby) {
        (Protection::Backup, None) => "-".into(),
        (_, Some(sb)) if sb.ready && sb.warm => format!("{} (votes, warm)", sb.member),
        (_, Some(sb)) if sb.ready => format!("{} (votes)", sb.member),
        (_, Some(sb)) => format!("{} (joining: backup only)", sb.member),
        (Protection::Standby, None) => "none: backup only".into(),
    }
}

/// Characters of an operation's detail in the status table.
const OP_DETAIL: usize = 44;

fn ms(v: Option<i64>) -> String {
    v.map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0))
}

/// The status as tables.
pub fn render(s: &RingStatus) -> String {
    let mut out = format!(
        "member {} (id {}, {}), leader {}, term {}, commit {}, applied {}, quorum contact {}\n\n",
        s.member,
        s.id,
        s.role,
        s.leader.as_deref().unwrap_or("none"),
        s.term,
        s.commit_index,
        s.applied_index,
        if s.quorum_contact { "yes" } else { "NO" }
    );
    let mut t = table(&[
        "MEMBER",
        "ID",
        "ADDRESS",
        "STATE",
        "VOTER",
        "LEADER",
        "LAST REPORT",
    ]);
    for m in &s.members {
        t.add_row(vec![
            m.name.clone(),
            m.id.to_string(),
            m.address.clone(),
            format!("{:?}", m.state),
            if m.voter { "yes" } else { "no" }.into(),
            if m.leader { "*" } else { "" }.into(),
            m.last_report_ms_ago
                .map_or("-".into(), |v| format!("{:.1}s ago", v as f64 / 1000.0)),
        ]);
    }
    out.push_str(&format!("{t}\n\n"));
    let mut t = table(&[
        "SHOOT",
        "HOST",
        "EPOCH",
        "LEASE ENDS IN",
        "READY",
        "KUBERNETES",
        "ETCD",
        "LAST BACKUP",
        "STANDBY",
    ]);
    for p in &s.placements {
        t.add_row(vec![
            p.shoot.clone(),
            p.host.clone(),
            p.epoch.to_string(),
            ms(p.lease_expires_in_ms),
            p.ready
                .map_or("-".into(), |r| if r { "yes".into() } else { "no".into() }),
            p.versions.kubernetes.clone().unwrap_or_else(|| "-".into()),
            p.versions.etcd.clone().unwrap_or_else(|| "-".into()),
            p.last_backup_age_ms
                .map_or("-".into(), |v| format!("{:.1}s ago", v as f64 / 1000.0)),
            standby_cell(s.protection, p.standby.as_ref()),
        ]);
    }
    out.push_str(&format!("{t}\n"));
    let degraded = s.degraded();
    if !degraded.is_empty() {
        out.push('\n');
        out.push_str(&wrap(
            &format!(
                "degraded to backup (protection standby, but no voting standby yet): {}; \
                 a failover of these restores from the bucket and may lose what was \
                 acknowledged after its newest delta",
                degraded.join(", ")
            ),
            2,
        ));
    }
    if !s.hosted.is_empty() {
        let mut t = table(&[
            "HOSTED HERE",
            "EPOCH",
            "SERVING",
            "READY",
            "OWN LEASE",
            "DETAIL",
        ]);
        for h in &s.hosted {
            t.add_row(vec![
                h.shoot.clone(),
                h.epoch.to_string(),
                if h.serving { "yes" } else { "no" }.into(),
                if h.ready { "yes" } else { "no" }.into(),
                ms(h.lease_valid_for_ms),
                h.detail.clone(),
            ]);
        }
        out.push_str(&format!("\n{t}\n"));
    }
    out.push_str(&certificates_summary(
        &s.certificates,
        crate::certs::now_unix(),
    ));
    if s.operations.is_empty() {
        out.push_str("\nno operations\n");
    } else {
        let mut t = table(&[
            "OP", "KIND", "SHOOT", "TARGET", "STEP", "MAY LOSE", "DETAIL",
        ]);
        let mut cut = false;
        for o in &s.operations {
            let detail = summary(&o.detail, OP_DETAIL);
            cut |= detail != o.detail;
            t.add_row(vec![
                o.id.to_string(),
                if o.is_migration() {
                    "migration"
                } else {
                    "failover"
                }
                .into(),
                o.shoot().to_string(),
                o.target().to_string(),
                format!("{:?}", o.step),
                may_lose(o),
                detail,
            ]);
        }
        out.push_str(&format!("\n{t}\n"));
        if cut {
            out.push_str(
                "the whole detail, step times and figures: ringctl describe operation OP\n",
            );
        }
    }
    out
}

/// One line naming the soonest-expiring certificate of the answering member,
/// then a warning line per certificate to act on.
fn certificates_summary(certs: &[crate::certs::CertificateStatus], now_unix: i64) -> String {
    let mut out = String::new();
    if let Some(c) = crate::certs::soonest(certs) {
        out.push('\n');
        out.push_str(&wrap(
            &format!(
                "certificates ({} checked here): the first to expire is {} {} in {} days",
                certs.len(),
                c.owner,
                c.name,
                c.days_left(now_unix).unwrap_or_default()
            ),
            2,
        ));
    }
    for w in crate::certs::warnings(certs, now_unix) {
        out.push_str(&wrap(&format!("WARNING: {w}"), 2));
    }
    out
}

/// What a finished failover says clients may have lost ("-" otherwise): at
/// least the revisions past the restore the old host was heard at (`≥N
/// rev`), and any write it acknowledged in the time it served unheard
/// (`+Xs`); `?` where the ring cannot tell. Migrations lose nothing.
fn may_lose(o: &Operation) -> String {
    let Some(out) = o.outcome.as_ref().filter(|_| !o.is_migration()) else {
        return "-".into();
    };
    let revisions = out
        .may_lose_revisions
        .map_or("?".to_string(), |n| format!("≥{n} rev"));
    match out.unheard_ms {
        Some(ms) => format!("{revisions} +{:.1}s", ms as f64 / 1000.0),
        None => revisions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(shoot: &str, standby: Option<(&str, bool)>) -> PlacementStatus {
        PlacementStatus {
            shoot: shoot.into(),
            host: "m1".into(),
            epoch: 1,
            lease_expires_in_ms: None,
            last_backup_age_ms: None,
            last_backup_revision: None,
            ready: Some(true),
            versions: seed::Versions {
                kubernetes: Some("v1.37.2".into()),
                etcd: Some("3.7.3".into()),
            },
            standby: standby.map(|(member, ready)| Standby {
                member: member.into(),
                ready,
                warm: false,
            }),
        }
    }

    fn status(protection: Protection, placements: Vec<PlacementStatus>) -> RingStatus {
        RingStatus {
            member: "m1".into(),
            id: 1,
            role: "Leader".into(),
            leader: Some("m1".into()),
            term: 1,
            commit_index: 1,
            applied_index: 1,
            quorum_contact: true,
            members: vec![],
            placements,
            hosted: vec![],
            operations: vec![],
            protection,
            certificates: vec![],
        }
    }

    #[test]
    fn the_certificate_summary_names_the_first_to_expire_and_warns() {
        let now = 1_800_000_000;
        let cert = |owner: &str, name: &str, days: i64| crate::certs::CertificateStatus {
            owner: owner.into(),
            name: name.into(),
            source: format!("/pki/{name}.crt"),
            not_after_unix: Some(now + days * 86_400 + 60),
            serial: None,
            error: None,
        };
        let certs = vec![cert("ring", "ca", 3000), cert("shoot s2", "admin", 700)];
        assert_eq!(
            certificates_summary(&certs, now),
            "\ncertificates (2 checked here): the first to expire is shoot s2 admin in 700 days\n"
        );
        let certs = vec![cert("ring", "ca", 3000), cert("member m1", "member", 3)];
        let out = certificates_summary(&certs, now);
        assert!(out.contains("is member m1 member in 3 days\nWARNING: member m1 certificate member (/pki/member.crt) expires in 3 days"), "{out}");
        assert_eq!(certificates_summary(&[], now), "");
    }

    #[test]
    fn a_shoot_without_a_voting_standby_shows_as_degraded_to_backup() {
        let placements = vec![
            placement("a", Some(("m2", true))),
            placement("b", Some(("m3", false))),
            placement("c", None),
        ];
        let s = status(Protection::Standby, placements.clone());
        assert_eq!(s.degraded(), vec!["b", "c"]);
        let out = render(&s);
        assert!(out.contains("m2 (votes)"), "{out}");
        // what each control plane runs, as its host reported
        let row = out.lines().find(|l| l.contains("m2 (votes)")).unwrap();
        assert!(row.contains("v1.37.2") && row.contains("3.7.3"), "{row}");
        assert!(out.contains("m3 (joining: backup only)"), "{out}");
        assert!(out.contains("none: backup only"), "{out}");
        let mut warm = placements.clone();
        if let Some(sb) = warm[0].standby.as_mut() {
            sb.warm = true;
        }
        let out = render(&status(Protection::Standby, warm));
        assert!(out.contains("m2 (votes, warm)"), "{out}");
        assert!(
            out.contains(
                "degraded to backup (protection standby, but no voting standby yet): b, c;"
            ),
            "{out}"
        );
        // protection backup: nothing is degraded, no standby expected
        let s = status(Protection::Backup, placements);
        assert_eq!(s.degraded(), Vec::<&str>::new());
        let out = render(&s);
        assert!(!out.contains("degraded"), "{out}");
        assert!(!out.contains("none: backup only"), "{out}");
    }

    /// Every line of a busy ring's status fits a 120-column terminal: long
    /// details are cut in the operations table (whole in `ringctl describe
    /// operation`) and wrapped elsewhere.
    #[test]
    fn a_busy_status_fits_120_columns_and_points_to_describe() {
        let long = "serving on m3 at epoch 3; revision 316, HashKV and 274 objects in 23 resource types verified; restored from the full snapshot and 2 deltas after the old host's lease ended";
        let mut s = status(
            Protection::Standby,
            vec![
                placement("shoot-with-a-long-name", Some(("member-three", false))),
                placement("b", None),
            ],
        );
        s.members = vec![MemberStatus {
            name: "member-three".into(),
            id: 3,
            address: "[fd00:1234:5678::3]:29886".into(),
            state: MemberState::Up,
            voter: true,
            leader: true,
            last_report_ms_ago: Some(100),
        }];
        s.hosted = vec![HostedStatus {
            shoot: "b".into(),
            epoch: 2,
            serving: false,
            ready: false,
            lease_valid_for_ms: Some(-19_700),
            detail: long.into(),
            versions: seed::Versions::default(),
        }];
        s.operations = vec![Operation::new(
            7,
            crate::state::OperationKind::Migration {
                shoot: "shoot-with-a-long-name".into(),
                from: "member-one".into(),
                to: "member-three".into(),
                epoch: 3,
                revision: None,
            },
            crate::state::OperationStep::Done,
            long.into(),
            0,
        )];
        let out = render(&s);
        for line in out.lines() {
            assert!(
                line.chars().count() <= WIDTH,
                "{} columns: {line}",
                line.chars().count()
            );
        }
        assert!(out.contains("serving on m3 at epoch 3…"), "{out}");
        assert!(out.contains("ringctl describe operation OP"), "{out}");
        assert!(out.contains("degraded to backup"), "{out}");
        // short details stay whole and need no pointer
        s.operations[0].detail = "serving on m3 at epoch 3".into();
        s.hosted.clear();
        let out = render(&s);
        assert!(!out.contains("describe operation"), "{out}");
    }

    /// The column says what was counted and how long the old host served
    /// unheard; `?` where the ring never heard how far it got.
    #[test]
    fn the_may_lose_column_shows_counted_revisions_and_the_unheard_time() {
        use crate::state::{OperationKind, OperationStep, Outcome};
        let mut op = Operation::new(
            1,
            OperationKind::Failover {
                shoot: "m2".into(),
                from: "m1".into(),
                to: "m3".into(),
                epoch: 2,
                not_before_ms: 0,
                seen: None,
                promote: false,
            },
            OperationStep::Done,
            String::new(),
            0,
        );
        assert_eq!(may_lose(&op), "-");
        let cases = [
            ((Some(3), Some(5_150)), "≥3 rev +5.2s"),
            ((None, Some(6_000)), "? +6.0s"),
            ((Some(0), None), "≥0 rev"),
        ];
        for ((revisions, unheard), want) in cases {
            op.outcome = Some(Outcome {
                may_lose_revisions: revisions,
                unheard_ms: unheard,
                ..Default::default()
            });
            assert_eq!(may_lose(&op), want);
        }
        // a planned migration loses nothing: no figure to show
        op.kind = OperationKind::Migration {
            shoot: "m2".into(),
            from: "m1".into(),
            to: "m3".into(),
            epoch: 2,
            revision: Some(10),
        };
        assert_eq!(may_lose(&op), "-");
    }

    #[test]
    fn wrap_breaks_at_words_and_indents_what_follows() {
        let text = ["word"; 40].join(" ");
        let out = wrap(&text, 2);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].len() <= WIDTH && lines[0].len() > WIDTH - 5);
        assert!(lines[1].starts_with("  word"));
        assert_eq!(out.split_whitespace().count(), 40);
        assert_eq!(wrap("", 2), "");
        assert_eq!(summary("a; b", 44), "a…");
        assert_eq!(summary("short", 44), "short");
        assert_eq!(summary(&"x".repeat(50), 10).chars().count(), 10);
    }
}
