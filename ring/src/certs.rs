//! Certificate expiry: which certificates a member uses or keeps for the
//! control planes it hosts, when each stops being valid, and the warnings
//! `ringctl status` prints (metrics carry the same timestamps).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::identity::IdentityPem;

/// Warn about a certificate this many days before it expires (a shoot's
/// leaves are renewed online by their host from then on).
pub const WARN_WITHIN_DAYS: i64 = 30;

/// Seconds since the Unix epoch (what `not_after_unix` is compared with).
pub fn now_unix() -> i64 {
    (crate::now_ms() / 1000) as i64
}

/// One certificate's end of validity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    /// Whose it is: `ring` (the ring CA), `member m1`, `shoot s2`.
    pub owner: String,
    /// Which one: `ca`, `member`, `kube-apiserver`, ...
    pub name: String,
    /// Where it was read from (a file, or the identity ringd uses now).
    pub source: String,
    /// `notAfter` in unix seconds, if it could be read.
    pub not_after_unix: Option<i64>,
    /// The serial number (hex), where it tells certificates apart (the ring
    /// CAs and member certificates, while the ring CA changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CertificateStatus {
    /// A certificate of `owner` read from `source`: its `notAfter`, or why not.
    pub fn from(owner: &str, name: &str, source: String, read: Result<i64, String>) -> Self {
        let (not_after_unix, error) = match read {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e)),
        };
        CertificateStatus {
            owner: owner.into(),
            name: name.into(),
            source,
            not_after_unix,
            serial: None,
            error,
        }
    }

    /// One status per certificate in `pem` (every CA of a bundle), with serials.
    fn each_in(owner: &str, name: &str, source: String, pem: &str) -> Vec<Self> {
        match seed::expiry::infos_pem(pem.as_bytes()) {
            Ok(infos) => infos
                .into_iter()
                .map(|i| CertificateStatus {
                    serial: Some(i.serial),
                    ..Self::from(owner, name, source.clone(), Ok(i.not_after))
                })
                .collect(),
            Err(e) => vec![Self::from(owner, name, source, Err(e))],
        }
    }

    /// Whole days left at `now_unix` (negative once expired).
    pub fn days_left(&self, now_unix: i64) -> Option<i64> {
        self.not_after_unix
            .map(|t| (t - now_unix).div_euclid(86_400))
    }
}

/// The ring CA and the member certificate ringd uses now (what its gRPC
/// server and clients present; see [`crate::identity::watch_files`]).
pub fn member(
    member: &str,
    identity: &IdentityPem,
    files: &crate::config::TlsFiles,
) -> Vec<CertificateStatus> {
    let loaded = |path: &Path| format!("{} (in use)", path.display());
    let mut out = CertificateStatus::each_in("ring", "ca", loaded(&files.ca), &identity.ca);
    let mut mine = CertificateStatus::each_in(
        &format!("member {member}"),
        "member",
        loaded(&files.cert),
        &identity.cert,
    );
    mine.truncate(1); // the member's own; a chain after it is not checked here
    out.extend(mine);
    out
}

/// Every certificate of `shoot`'s PKI kept in `dir` (its CA and leaves).
pub fn shoot(shoot: &str, dir: &Path) -> Vec<CertificateStatus> {
    pki_dir(&format!("shoot {shoot}"), dir)
}

/// Every certificate of the copy of `shoot`'s PKI a hot standby of it
/// keeps in `dir` (its etcd's and its warm kube-apiserver's among them).
pub fn standby(shoot: &str, dir: &Path) -> Vec<CertificateStatus> {
    pki_dir(&format!("standby of shoot {shoot}"), dir)
}

fn pki_dir(owner: &str, dir: &Path) -> Vec<CertificateStatus> {
    seed::pki::Pki::new(dir)
        .certificates()
        .into_iter()
        .map(|(name, path)| {
            let read = seed::expiry::not_after_file(&path);
            CertificateStatus::from(owner, &name, path.display().to_string(), read)
        })
        .collect()
}

/// One line per certificate that is unreadable, expired or expires within
/// [`WARN_WITHIN_DAYS`], saying what to do.
pub fn warnings(certs: &[CertificateStatus], now_unix: i64) -> Vec<String> {
    let mut out = Vec::new();
    for c in certs {
        let what = format!("{} certificate {} ({})", c.owner, c.name, c.source);
        match (c.days_left(now_unix), &c.error) {
            (_, Some(e)) => out.push(format!("{what} cannot be checked: {e}")),
            (Some(d), _) if c.not_after_unix.is_some_and(|t| t <= now_unix) => {
                out.push(format!("{what} EXPIRED {} days ago: {}", -d, renew_hint(c)))
            }
            (Some(d), _) if d < WARN_WITHIN_DAYS => {
                out.push(format!("{what} expires in {d} days: {}", renew_hint(c)))
            }
            _ => {}
        }
    }
    out
}

fn renew_hint(c: &CertificateStatus) -> &'static str {
    let node = c.name.starts_with("node ");
    if node && c.name.ends_with(" kubelet") {
        "the kubelet renews it itself once 70-90 % of its life has passed; one this close to its end was not renewed: see the node's kubelet log"
    } else if node {
        "`ringctl pki renew` issues a new one from the shoot's CA; the node takes it without a restart"
    } else if c.owner.starts_with("shoot ") && c.name == "kubeconfig" {
        "`ringctl pki renew` issues a new one from the shoot's CA (the file is replaced once the shoot's API accepted it)"
    } else if c.owner.starts_with("standby of shoot ") {
        "the member running the hot standby renews it online within `seed.certificateCheckSecs` once 30 days are left, like the host its own; if the warning stays, that member's ringd log says why (\"cannot renew the control plane's certificates\")"
    } else if c.owner.starts_with("shoot ") && c.name != "ca" {
        "its host renews it online, without stopping the control plane, within `seed.certificateCheckSecs` (an hour by default) once 30 days are left; if the warning stays, the host's ringd log says why (\"cannot renew the control plane's certificates\")"
    } else {
        "`ringctl pki renew` issues new member certificates (`ringctl pki rotate-ca` a new ring CA); every ringd takes them without a restart"
    }
}

/// The soonest-expiring readable certificate, for a one-line summary.
pub fn soonest(certs: &[CertificateStatus]) -> Option<&CertificateStatus> {
    certs
        .iter()
        .filter(|c| c.not_after_unix.is_some())
        .min_by_key(|c| c.not_after_unix)
}

/// A certificate and where it was checked (`ringctl pki check`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Checked {
    /// The member that reported it, or `ringctl` for files on this machine.
    pub checked_by: String,
    #[serde(flatten)]
    pub certificate: CertificateStatus,
}

/// The certificates of a whole ring: what every member reported, and what
/// this machine keeps (ringctl's certificate, the shoots' kubeconfigs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RingCheck {
    pub certificates: Vec<Checked>,
    /// Members that did not answer, with why: their certificates are unchecked.
    pub unreachable: Vec<String>,
}

impl RingCheck {
    /// Adds what `checked_by` reported; a certificate already listed (the
    /// ring CA, reported by every member) is kept once.
    pub fn add(&mut self, checked_by: &str, certs: Vec<CertificateStatus>) {
        for c in certs {
            let known = self.certificates.iter().any(|k| {
                k.certificate.owner == c.owner
                    && k.certificate.name == c.name
                    && k.certificate.not_after_unix == c.not_after_unix
            });
            if !known {
                self.certificates.push(Checked {
                    checked_by: checked_by.into(),
                    certificate: c,
                });
            }
        }
    }

    /// What needs attention: certificates (see [`warnings`]) and members
    /// that could not be asked.
    pub fn warnings(&self, now_unix: i64) -> Vec<String> {
        let certs: Vec<CertificateStatus> = self
            .certificates
            .iter()
            .map(|c| c.certificate.clone())
            .collect();
        let mut out = warnings(&certs, now_unix);
        for u in &self.unreachable {
            out.push(format!("{u}: its certificates were not checked"));
        }
        out
    }

    /// A table, soonest expiry first, then the warnings (or that none apply).
    pub fn render(&self, now_unix: i64) -> String {
        let mut rows: Vec<&Checked> = self.certificates.iter().collect();
        rows.sort_by_key(|c| {
            (
                c.certificate.not_after_unix.unwrap_or(i64::MIN),
                c.certificate.owner.clone(),
            )
        });
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING).set_header([
            "OWNER",
            "CERTIFICATE",
            "DAYS LEFT",
            "CHECKED BY",
        ]);
        for c in rows {
            let left = c
                .certificate
                .days_left(now_unix)
                .map_or("unreadable".into(), |d| d.to_string());
            t.add_row(vec![
                c.certificate.owner.clone(),
                c.certificate.name.clone(),
                left,
                c.checked_by.clone(),
            ]);
        }
        let mut out = format!("{t}\n");
        let warnings = self.warnings(now_unix);
        if warnings.is_empty() {
            out.push_str(&format!(
                "\nevery certificate is valid for at least {WARN_WITHIN_DAYS} more days\n"
            ));
        }
        for w in warnings {
            out.push_str(&format!("WARNING: {w}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_800_000_000;

    fn cert(owner: &str, name: &str, read: Result<i64, String>) -> CertificateStatus {
        CertificateStatus::from(owner, name, format!("/pki/{name}.crt"), read)
    }

    #[test]
    fn warns_about_expired_soon_and_unreadable_certificates_only() {
        let certs = vec![
            cert("ring", "ca", Ok(NOW + 3000 * DAY)),
            cert("member m1", "member", Ok(NOW + 29 * DAY + 5)),
            cert("shoot s2", "kube-apiserver", Ok(NOW - 2 * DAY)),
            cert("shoot s2", "admin", Ok(NOW + 30 * DAY)),
            cert("shoot s2", "ca", Err("cannot read: gone".into())),
        ];
        let w = warnings(&certs, NOW);
        assert_eq!(w.len(), 3, "{w:#?}");
        assert!(
            w[0].starts_with("member m1 certificate member (/pki/member.crt) expires in 29 days: `ringctl pki renew`"),
            "{}",
            w[0]
        );
        assert!(
            w[1].starts_with("shoot s2 certificate kube-apiserver (/pki/kube-apiserver.crt) EXPIRED 2 days ago: its host renews it online"),
            "{}",
            w[1]
        );
        assert_eq!(
            w[2],
            "shoot s2 certificate ca (/pki/ca.crt) cannot be checked: cannot read: gone"
        );
        assert_eq!(
            soonest(&certs).map(|c| c.name.as_str()),
            Some("kube-apiserver")
        );
    }

    /// Each hint names what renews the certificate: a published kubeconfig
    /// or kube-proxy's certificate is not reissued at the control plane's
    /// start (the hint said it was), `ringctl pki renew` renews them.
    #[test]
    fn the_renewal_hint_names_what_renews_each_certificate() {
        let soon = Ok(NOW + 3 * DAY);
        for (owner, name, hint) in [
            (
                "shoot s2",
                "kube-apiserver",
                "its host renews it online, without stopping the control plane",
            ),
            (
                "shoot s2",
                "kubeconfig",
                "`ringctl pki renew` issues a new one from the shoot's CA",
            ),
            (
                "standby of shoot s2",
                "etcd-peer",
                "the member running the hot standby renews it online",
            ),
            (
                "shoot s2",
                "node s2 kubelet",
                "the kubelet renews it itself",
            ),
            (
                "shoot s2",
                "node s2-2 kube-proxy",
                "the node takes it without a restart",
            ),
            ("member m1", "member", "`ringctl pki renew`"),
            ("ring", "ca", "`ringctl pki rotate-ca`"),
        ] {
            let w = warnings(&[cert(owner, name, soon.clone())], NOW);
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(w[0].contains(hint), "{owner} {name}: {}", w[0]);
        }
    }

    #[test]
    fn a_ring_check_keeps_the_ring_ca_once_and_names_unreachable_members() {
        let mut check = RingCheck::default();
        check.add(
            "m1",
            vec![
                cert("ring", "ca", Ok(NOW + 3000 * DAY)),
                cert("member m1", "member", Ok(NOW + 700 * DAY)),
            ],
        );
        check.add(
            "m2",
            vec![
                cert("ring", "ca", Ok(NOW + 3000 * DAY)),
                cert("member m2", "member", Ok(NOW + 10 * DAY)),
            ],
        );
        check
            .unreachable
            .push("m3 (127.0.0.1:7003) did not answer".into());
        assert_eq!(check.certificates.len(), 3, "{check:#?}");
        let out = check.render(NOW);
        let first = out.lines().nth(1).unwrap_or_default();
        assert!(
            first.contains("member m2") && first.contains(" 10 "),
            "{out}"
        );
        assert!(
            out.contains("WARNING: member m2 certificate member"),
            "{out}"
        );
        assert!(
            out.contains(
                "WARNING: m3 (127.0.0.1:7003) did not answer: its certificates were not checked"
            ),
            "{out}"
        );
        let mut fine = RingCheck::default();
        fine.add("m1", vec![cert("ring", "ca", Ok(NOW + 3000 * DAY))]);
        assert!(fine.warnings(NOW).is_empty());
        assert!(fine
            .render(NOW)
            .contains("every certificate is valid for at least 30 more days"));
    }

    #[test]
    fn days_left_rounds_down_and_goes_negative_after_expiry() {
        assert_eq!(
            cert("ring", "ca", Ok(NOW + DAY - 1)).days_left(NOW),
            Some(0)
        );
        assert_eq!(cert("ring", "ca", Ok(NOW - 1)).days_left(NOW), Some(-1));
        assert_eq!(cert("ring", "ca", Err("x".into())).days_left(NOW), None);
    }
}
