//! Changing the ring CA online, as decisions without I/O: the new CA is
//! trusted next to the old one first, then every member and ringctl get
//! certificates from it, then the old CA is retired. Each step waits until
//! every member reports what the last one changed, so no two members ever
//! hold certificates the other does not trust. The caller reads the facts
//! again after each action: a rerun resumes where an earlier one stopped.

use std::collections::BTreeMap;

/// What the ring's PKI directory holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PkiFacts {
    /// Serials of the CAs `ca.crt` holds, in order.
    pub trusted: Vec<String>,
    /// Serial of the next CA (`ca-next.crt`), while a change is under way.
    pub next: Option<String>,
    /// The old CA is retired, but not every member has reported it yet.
    pub retiring: bool,
    /// Per identity (members and ringctl): whether its certificate file was
    /// issued by the next CA.
    pub issued_by_next: BTreeMap<String, bool>,
    /// Per member: the serial of its certificate file.
    pub member_serials: BTreeMap<String, String>,
    /// Identities whose key file does not belong to their certificate file
    /// (a crash between writing one and the other).
    pub mismatched: Vec<String>,
}

/// What a member reports using (from its status), if it answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InUse {
    /// Serials of the CAs it trusts.
    pub trusted: Vec<String>,
    /// Serial of the certificate it presents.
    pub member_serial: Option<String>,
}

/// The next thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Issue these identities again (key and certificate), from the next CA
    /// once every member trusts it, else from the ring CA: their files do
    /// not belong together, so nobody can use them.
    Repair(Vec<String>),
    /// Create the next CA (`ca-next.crt`, `ca-next.key`).
    CreateNext,
    /// Write `ca.crt` as the old CA followed by the next one.
    TrustBoth,
    /// Wait until these members trust the next CA.
    WaitTrust(Vec<String>),
    /// Issue these identities' certificates from the next CA.
    Reissue(Vec<String>),
    /// Wait until these members present their new certificate.
    WaitInUse(Vec<String>),
    /// Make the next CA the only one (`ca.crt`, `ca.key`) and mark the retirement.
    Retire,
    /// Wait until these members trust only the new CA.
    WaitRetired(Vec<String>),
    /// The change is complete (the caller clears the retirement mark).
    Done,
}

/// Decides the next action from the files and what each member reports.
pub fn next_action(f: &PkiFacts, members: &BTreeMap<String, Option<InUse>>) -> Action {
    if !f.mismatched.is_empty() {
        return Action::Repair(f.mismatched.clone());
    }
    let waiting = |ok: &dyn Fn(&InUse) -> bool| -> Vec<String> {
        members
            .iter()
            .filter(|(_, r)| !r.as_ref().is_some_and(ok))
            .map(|(m, _)| m.clone())
            .collect()
    };
    let Some(next) = &f.next else {
        if !f.retiring {
            return Action::CreateNext;
        }
        let late = waiting(&|r| r.trusted == f.trusted);
        return if late.is_empty() {
            Action::Done
        } else {
            Action::WaitRetired(late)
        };
    };
    if !f.trusted.contains(next) {
        return Action::TrustBoth;
    }
    let late = waiting(&|r| r.trusted.contains(next));
    if !late.is_empty() {
        return Action::WaitTrust(late);
    }
    let old: Vec<String> = f
        .issued_by_next
        .iter()
        .filter(|(_, by_next)| !**by_next)
        .map(|(name, _)| name.clone())
        .collect();
    if !old.is_empty() {
        return Action::Reissue(old);
    }
    let late: Vec<String> = members
        .iter()
        .filter(|(m, r)| {
            let file = f.member_serials.get(*m);
            r.as_ref().is_none_or(|r| r.member_serial.as_ref() != file)
        })
        .map(|(m, _)| m.clone())
        .collect();
    if !late.is_empty() {
        return Action::WaitInUse(late);
    }
    Action::Retire
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        v.to_string()
    }

    /// A member's report in a case: (trusted CA serials, its certificate's serial).
    type Report<'a> = Option<(&'a [&'a str], &'a str)>;
    type Reports = BTreeMap<String, Option<InUse>>;

    fn reports(of: &[(&str, Report<'_>)]) -> Reports {
        of.iter()
            .map(|(m, r)| {
                let r = r.map(|(trusted, serial)| InUse {
                    trusted: trusted.iter().map(|t| s(t)).collect(),
                    member_serial: Some(s(serial)),
                });
                (s(m), r)
            })
            .collect()
    }

    fn facts(trusted: &[&str], next: Option<&str>, by_next: &[(&str, bool)]) -> PkiFacts {
        PkiFacts {
            trusted: trusted.iter().map(|t| s(t)).collect(),
            next: next.map(s),
            retiring: false,
            issued_by_next: by_next.iter().map(|(n, b)| (s(n), *b)).collect(),
            member_serials: [(s("m1"), s("new1")), (s("m2"), s("new2"))].into(),
            mismatched: vec![],
        }
    }

    #[test]
    fn a_ca_change_goes_trust_reissue_retire_and_waits_for_every_member() {
        let old_certs = [("m1", false), ("m2", false), ("ringctl", false)];
        let new_certs = [("m1", true), ("m2", true), ("ringctl", true)];
        let old_only: &[&str] = &["OLD"];
        let both: &[&str] = &["OLD", "NEXT"];
        let cases: Vec<(&str, PkiFacts, Reports, Action)> = vec![
            (
                "nothing under way: start",
                facts(&["OLD"], None, &old_certs),
                reports(&[("m1", Some((old_only, "a"))), ("m2", Some((old_only, "b")))]),
                Action::CreateNext,
            ),
            (
                "next CA made: trust it next to the old",
                facts(&["OLD"], Some("NEXT"), &old_certs),
                reports(&[("m1", Some((old_only, "a"))), ("m2", Some((old_only, "b")))]),
                Action::TrustBoth,
            ),
            (
                "ringctl's key was written, its certificate not (a crash): repair first",
                PkiFacts {
                    mismatched: vec![s("ringctl")],
                    ..facts(&["OLD", "NEXT"], Some("NEXT"), &old_certs)
                },
                reports(&[("m1", None), ("m2", None)]),
                Action::Repair(vec![s("ringctl")]),
            ),
            (
                "m2 has not reloaded, m1 is down: wait for both",
                facts(&["OLD", "NEXT"], Some("NEXT"), &old_certs),
                reports(&[("m1", None), ("m2", Some((old_only, "b")))]),
                Action::WaitTrust(vec![s("m1"), s("m2")]),
            ),
            (
                "everyone trusts both: reissue what the old CA issued",
                facts(
                    &["OLD", "NEXT"],
                    Some("NEXT"),
                    &[("m1", true), ("m2", false), ("ringctl", false)],
                ),
                reports(&[("m1", Some((both, "new1"))), ("m2", Some((both, "b")))]),
                Action::Reissue(vec![s("m2"), s("ringctl")]),
            ),
            (
                "reissued: wait until m2 presents its new certificate",
                facts(&["OLD", "NEXT"], Some("NEXT"), &new_certs),
                reports(&[("m1", Some((both, "new1"))), ("m2", Some((both, "b")))]),
                Action::WaitInUse(vec![s("m2")]),
            ),
            (
                "every member presents a new certificate: retire the old CA",
                facts(&["OLD", "NEXT"], Some("NEXT"), &new_certs),
                reports(&[("m1", Some((both, "new1"))), ("m2", Some((both, "new2")))]),
                Action::Retire,
            ),
            (
                "retired: wait until no member trusts the old CA",
                PkiFacts {
                    retiring: true,
                    ..facts(&["NEXT"], None, &[])
                },
                reports(&[
                    ("m1", Some((&["NEXT"], "new1"))),
                    ("m2", Some((both, "new2"))),
                ]),
                Action::WaitRetired(vec![s("m2")]),
            ),
            (
                "every member trusts only the new CA: done",
                PkiFacts {
                    retiring: true,
                    ..facts(&["NEXT"], None, &[])
                },
                reports(&[
                    ("m1", Some((&["NEXT"], "new1"))),
                    ("m2", Some((&["NEXT"], "new2"))),
                ]),
                Action::Done,
            ),
        ];
        for (why, f, r, want) in cases {
            assert_eq!(next_action(&f, &r), want, "{why}");
        }
    }
}
