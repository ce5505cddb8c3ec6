//! The ring's own PKI: one CA, a certificate per member (server and client,
//! common name = member name, SANs = its name, `ringd` and its IP), and admin
//! client certificates for `ringctl`. Peers are identified by the common name
//! of the client certificate they present.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use seed::pki::{create_private_dir, issue, new_ca, write_private, LeafSpec};

use crate::RingError;

/// The common name of administrator (ringctl) certificates.
pub const ADMIN_NAME: &str = "ringctl";
/// A DNS name every member certificate carries, for clients that reach "any member".
pub const ANY_MEMBER: &str = "ringd";

/// Files of one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Creates a ring CA in `crt` and `key` unless both exist.
fn ensure_ca_files(crt: &Path, key: &Path) -> Result<(), RingError> {
    if crt.exists() && key.exists() {
        return Ok(());
    }
    let (cert_pem, key_pem) = new_ca("ring-ca")?;
    write_private(key, key_pem.as_bytes())?;
    write_private(crt, cert_pem.as_bytes())?;
    Ok(())
}

impl From<&crate::config::TlsFiles> for IdentityFiles {
    fn from(tls: &crate::config::TlsFiles) -> Self {
        IdentityFiles {
            ca: tls.ca.clone(),
            cert: tls.cert.clone(),
            key: tls.key.clone(),
        }
    }
}

/// The ring PKI directory: `ca.crt`, `ca.key`, `<name>.crt`, `<name>.key`.
#[derive(Debug, Clone)]
pub struct RingPki {
    dir: PathBuf,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RingError {
    move |source| RingError::Io { what, source }
}

impl RingPki {
    /// The PKI in `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RingPki { dir: dir.into() }
    }

    /// Creates the CA unless it exists.
    pub fn ensure_ca(&self) -> Result<(), RingError> {
        create_private_dir(&self.dir)?;
        ensure_ca_files(&self.dir.join("ca.crt"), &self.dir.join("ca.key"))
    }

    /// Files of `name` (whether or not they exist).
    pub fn files(&self, name: &str) -> IdentityFiles {
        IdentityFiles {
            ca: self.dir.join("ca.crt"),
            cert: self.dir.join(format!("{name}.crt")),
            key: self.dir.join(format!("{name}.key")),
        }
    }

    /// Issues (or keeps) the certificate of member `name` reachable at `ip`.
    pub fn ensure_member(&self, name: &str, ip: IpAddr) -> Result<IdentityFiles, RingError> {
        self.ensure(
            name,
            vec![ip],
            vec![name.to_string(), ANY_MEMBER.to_string()],
            true,
        )
    }

    /// Issues (or keeps) the administrator certificate for ringctl.
    pub fn ensure_admin(&self) -> Result<IdentityFiles, RingError> {
        self.ensure(ADMIN_NAME, vec![], vec![], false)
    }

    /// Issues a new certificate and key for member `name` from the ring CA,
    /// replacing the old ones (a running ringd takes them within seconds).
    pub fn renew_member(&self, name: &str, ip: IpAddr) -> Result<IdentityFiles, RingError> {
        self.remove(name)?;
        self.ensure_member(name, ip)
    }

    /// Issues a new administrator certificate and key for ringctl.
    pub fn renew_admin(&self) -> Result<IdentityFiles, RingError> {
        self.remove(ADMIN_NAME)?;
        self.ensure_admin()
    }

    /// The next CA's files while the ring CA changes (`ca-next.crt`, `ca-next.key`).
    pub fn next_ca(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("ca-next.crt"), self.dir.join("ca-next.key"))
    }

    fn retiring_mark(&self) -> PathBuf {
        self.dir.join("ca-retiring")
    }

    /// Creates the next CA unless it exists.
    pub fn create_next_ca(&self) -> Result<(), RingError> {
        let (crt, key) = self.next_ca();
        ensure_ca_files(&crt, &key)
    }

    /// Writes `ca.crt` as the current CA followed by the next one.
    pub fn trust_both(&self) -> Result<(), RingError> {
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(io(format!("reading {}", p.display())));
        let ca = self.dir.join("ca.crt");
        let current = read(&ca)?;
        let first = current
            .split_inclusive("-----END CERTIFICATE-----")
            .next()
            .unwrap_or_default()
            .trim();
        let next = read(&self.next_ca().0)?;
        write_private(&ca, format!("{first}\n{}\n", next.trim()).as_bytes())?;
        Ok(())
    }

    /// Issues `name`'s certificate from the next CA (`ip`: a member's address;
    /// none for ringctl).
    pub fn reissue_from_next(&self, name: &str, ip: Option<IpAddr>) -> Result<(), RingError> {
        let (crt, key) = self.next_ca();
        let (ips, dns, server) = match ip {
            Some(ip) => (
                vec![ip],
                vec![name.to_string(), ANY_MEMBER.to_string()],
                true,
            ),
            None => (vec![], vec![], false),
        };
        self.issue_into(name, ips, dns, server, (&crt, &key))?;
        Ok(())
    }

    /// Makes the next CA the ring CA (key first, so `ca.key` is never older
    /// than what issues from it next) and marks the old one as retiring.
    pub fn retire(&self) -> Result<(), RingError> {
        let (crt, key) = self.next_ca();
        let read = |p: &Path| std::fs::read(p).map_err(io(format!("reading {}", p.display())));
        let (crt_pem, key_pem) = (read(&crt)?, read(&key)?);
        write_private(&self.retiring_mark(), b"the old ring CA is retiring\n")?;
        write_private(&self.dir.join("ca.key"), &key_pem)?;
        write_private(&self.dir.join("ca.crt"), &crt_pem)?;
        for p in [&crt, &key] {
            std::fs::remove_file(p).map_err(io(format!("removing {}", p.display())))?;
        }
        Ok(())
    }

    /// Ends a CA change (every member trusts only the new CA).
    pub fn finish_rotation(&self) -> Result<(), RingError> {
        // a crash inside `retire` may have left the old next key behind
        for path in [self.next_ca().1, self.retiring_mark()] {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(format!("removing {}", path.display()))(e))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// What the directory holds for a CA change of a ring of `members`.
    pub fn rotation_facts(
        &self,
        members: &[String],
    ) -> Result<crate::ca_rotation::PkiFacts, RingError> {
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(io(format!("reading {}", p.display())));
        let bad = |p: &Path| {
            let field = p.display().to_string();
            move |reason: String| RingError::Config { field, reason }
        };
        let ca = self.dir.join("ca.crt");
        let trusted = seed::expiry::infos_pem(read(&ca)?.as_bytes())
            .map_err(bad(&ca))?
            .into_iter()
            .map(|i| i.serial)
            .collect();
        let (next_crt, _) = self.next_ca();
        let next_pem = next_crt.exists().then(|| read(&next_crt)).transpose()?;
        let next = match &next_pem {
            Some(pem) => seed::expiry::infos_pem(pem.as_bytes())
                .map_err(bad(&next_crt))?
                .into_iter()
                .next()
                .map(|i| i.serial),
            None => None,
        };
        let mut facts = crate::ca_rotation::PkiFacts {
            trusted,
            next,
            retiring: self.retiring_mark().exists(),
            ..Default::default()
        };
        let names = members.iter().map(String::as_str).chain([ADMIN_NAME]);
        for name in names {
            let files = self.files(name);
            let (cert, key) = (read(&files.cert)?, read(&files.key)?);
            let by_next = next_pem.as_ref().is_some_and(|ca| {
                seed::expiry::check_identity(ca.as_bytes(), cert.as_bytes(), &key).is_ok()
            });
            facts.issued_by_next.insert(name.to_string(), by_next);
            if !seed::expiry::key_matches(cert.as_bytes(), &key).map_err(bad(&files.key))? {
                facts.mismatched.push(name.to_string());
            }
            if name != ADMIN_NAME {
                let serial = seed::expiry::infos_pem(cert.as_bytes())
                    .map_err(bad(&files.cert))?
                    .into_iter()
                    .next()
                    .map(|i| i.serial)
                    .unwrap_or_default();
                facts.member_serials.insert(name.to_string(), serial);
            }
        }
        Ok(facts)
    }

    fn remove(&self, name: &str) -> Result<(), RingError> {
        let files = self.files(name);
        for path in [&files.cert, &files.key] {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(format!("removing {}", path.display()))(e))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn ensure(
        &self,
        name: &str,
        ips: Vec<IpAddr>,
        dns_names: Vec<String>,
        server: bool,
    ) -> Result<IdentityFiles, RingError> {
        self.ensure_ca()?;
        let files = self.files(name);
        if files.cert.exists() && files.key.exists() {
            return Ok(files);
        }
        let (ca, ca_key) = (files.ca.clone(), self.dir.join("ca.key"));
        self.issue_into(name, ips, dns_names, server, (&ca, &ca_key))
    }

    /// Issues `name`'s certificate and key from the CA in `ca` (certificate,
    /// key files; the first certificate of a bundle).
    fn issue_into(
        &self,
        name: &str,
        ips: Vec<IpAddr>,
        dns_names: Vec<String>,
        server: bool,
        ca: (&Path, &Path),
    ) -> Result<IdentityFiles, RingError> {
        let files = self.files(name);
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(io(format!("reading {}", p.display())));
        let (ca_cert, ca_key) = (read(ca.0)?, read(ca.1)?);
        let spec = LeafSpec {
            common_name: name,
            organizations: &["ring"],
            ips,
            dns_names,
            server,
            client: true,
        };
        let (cert, key) = issue(&ca_cert, &ca_key, &spec)?;
        write_private(&files.key, key.as_bytes())?;
        write_private(&files.cert, cert.as_bytes())?;
        Ok(files)
    }
}

/// PEM contents of an identity, read and checked for presence.
#[derive(Clone)]
pub struct IdentityPem {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl IdentityPem {
    /// Reads the three files; a missing or unreadable file is named in the error.
    pub fn read(files: &IdentityFiles) -> Result<Self, RingError> {
        let read = |p: &Path, what: &str| -> Result<String, RingError> {
            let text = std::fs::read_to_string(p).map_err(|source| RingError::Io {
                what: format!(
                    "reading the {what} {} (create it with `ringctl pki init`)",
                    p.display()
                ),
                source,
            })?;
            if !text.contains("-----BEGIN") {
                return Err(RingError::Config {
                    field: p.display().to_string(),
                    reason: format!("is not a PEM {what}"),
                });
            }
            Ok(text)
        };
        Ok(IdentityPem {
            ca: read(&files.ca, "CA certificate")?,
            cert: read(&files.cert, "certificate")?,
            key: read(&files.key, "private key")?,
        })
    }
}

/// What to do with the identity files as read now, against the identity in use.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files hold the identity in use (or could not be read whole).
    Keep,
    /// The files hold a new, usable identity, valid until `not_after` (unix seconds).
    Replace { not_after: i64 },
    /// The files changed but cannot be used; the identity in use stays.
    Refuse(String),
}

/// Decides about `read` (the files now) against `current`; `check` tells
/// whether an identity is usable (key of the certificate, issued by the CA)
/// and until when.
pub fn reload_decision(
    current: &IdentityPem,
    read: &Result<IdentityPem, RingError>,
    check: impl Fn(&IdentityPem) -> Result<i64, String>,
) -> Reload {
    match read {
        Ok(new) if new.ca == current.ca && new.cert == current.cert && new.key == current.key => {
            Reload::Keep
        }
        Ok(new) => match check(new) {
            Ok(not_after) => Reload::Replace { not_after },
            Err(why) => Reload::Refuse(why),
        },
        Err(e) => Reload::Refuse(e.to_string()),
    }
}

/// A unix time (seconds) as RFC 3339, for messages.
fn date(t: i64) -> String {
    backup::catalog::rfc3339(t.saturating_mul(1000))
}

/// Clock skew allowed for a new certificate's `notBefore` (Ring issues
/// them an hour back; another tool may not).
pub const NOT_BEFORE_SKEW_SECS: i64 = 300;

/// Whether `id`'s certificate belongs to its key, was issued by its CA file
/// (which may hold the old and the new CA during a CA change) and is
/// [`usable`] in place of the identity named `name_in_use` at `now`; its
/// `notAfter`.
pub fn check_identity(
    id: &IdentityPem,
    name_in_use: Option<&str>,
    now: i64,
) -> Result<i64, String> {
    let facts = seed::expiry::check_identity(id.ca.as_bytes(), id.cert.as_bytes(), &id.key)?;
    usable(&facts, name_in_use, now)?;
    Ok(facts.not_after)
}

/// Whether a certificate that says `facts` of itself may replace the one in
/// use (named `name_in_use`) at `now` (unix seconds): it is valid now, within
/// [`NOT_BEFORE_SKEW_SECS`] of clock skew, and names the same member (peers
/// know a caller by that name: another member's certificate would make this
/// member speak as that one).
pub fn usable(
    facts: &seed::expiry::IdentityFacts,
    name_in_use: Option<&str>,
    now: i64,
) -> Result<(), String> {
    if facts.not_after <= now {
        return Err(format!(
            "the certificate expired at {}",
            date(facts.not_after)
        ));
    }
    if facts.not_before > now + NOT_BEFORE_SKEW_SECS {
        return Err(format!(
            "the certificate is not valid before {} (is this machine's clock right?)",
            date(facts.not_before)
        ));
    }
    match (name_in_use, facts.common_name.as_deref()) {
        (Some(in_use), Some(new)) if in_use != new => Err(format!(
            "the certificate names {new:?}, but this member is {in_use:?} (copied from another member?)"
        )),
        (Some(in_use), None) => Err(format!(
            "the certificate names no member, but this member is {in_use:?}"
        )),
        _ => Ok(()),
    }
}

/// Re-reads the identity files every `every` until `stop`; a new usable
/// identity replaces the one in `live` (the gRPC server and every channel
/// built afterwards use it), an unusable one is refused with a warning.
pub async fn watch_files(
    files: IdentityFiles,
    live: std::sync::Arc<tokio::sync::watch::Sender<IdentityPem>>,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    // a refusal is reported once it is seen twice in a row: a renewal writes
    // the key and the certificate one after the other
    let (mut seen, mut warned): (Option<String>, Option<String>) = (None, None);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let read = IdentityPem::read(&files);
        let name_in_use = seed::expiry::common_name_pem(live.borrow().cert.as_bytes());
        let now = crate::certs::now_unix();
        let check = |id: &IdentityPem| check_identity(id, name_in_use.as_deref(), now);
        let decision = reload_decision(&live.borrow(), &read, check);
        match (decision, read) {
            (Reload::Replace { not_after }, Ok(new)) => {
                live.send_replace(new);
                (seen, warned) = (None, None);
                tracing::info!(cert = %files.cert.display(), not_after, "member certificate files changed: serving and calling with the new identity");
            }
            (Reload::Refuse(why), _) => {
                if seen.as_ref() == Some(&why) && warned.as_ref() != Some(&why) {
                    tracing::warn!(cert = %files.cert.display(), reason = %why, "member certificate files changed but cannot be used; keeping the identity in use");
                    warned = Some(why.clone());
                }
                seen = Some(why);
            }
            _ => seen = None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cert: &str) -> IdentityPem {
        IdentityPem {
            ca: "ca".into(),
            cert: cert.into(),
            key: "key".into(),
        }
    }

    /// A renewed certificate replaces the one in use only if it is valid now
    /// (within the allowed skew) and names the same member.
    #[test]
    fn a_new_certificate_must_be_valid_now_and_name_this_member() {
        let now = 1_000_000;
        let facts =
            |not_before: i64, not_after: i64, cn: Option<&str>| seed::expiry::IdentityFacts {
                not_before,
                not_after,
                common_name: cn.map(str::to_string),
            };
        let cases: &[(
            &str,
            seed::expiry::IdentityFacts,
            Option<&str>,
            Option<&str>,
        )] = &[
            (
                "fresh",
                facts(now - 3600, now + 86400, Some("m1")),
                Some("m1"),
                None,
            ),
            (
                "clock a little behind",
                facts(now + 200, now + 86400, Some("m1")),
                Some("m1"),
                None,
            ),
            (
                "expired",
                facts(now - 7200, now - 1, Some("m1")),
                Some("m1"),
                Some("expired at"),
            ),
            (
                "expires this second",
                facts(now - 7200, now, Some("m1")),
                Some("m1"),
                Some("expired at"),
            ),
            (
                "not yet valid",
                facts(now + 3600, now + 86400, Some("m1")),
                Some("m1"),
                Some("not valid before"),
            ),
            (
                "another member's",
                facts(now - 3600, now + 86400, Some("m2")),
                Some("m1"),
                Some("names \"m2\", but this member is \"m1\""),
            ),
            (
                "no name",
                facts(now - 3600, now + 86400, None),
                Some("m1"),
                Some("names no member"),
            ),
            (
                "name in use unknown",
                facts(now - 3600, now + 86400, Some("m2")),
                None,
                None,
            ),
        ];
        for (case, facts, in_use, want) in cases {
            match (usable(facts, *in_use, now), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{case}: {e}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn reload_replaces_only_a_changed_usable_identity() {
        let ok = |_: &IdentityPem| Ok(1);
        let bad = |_: &IdentityPem| Err("the key does not belong to the certificate".to_string());
        assert_eq!(reload_decision(&id("a"), &Ok(id("a")), bad), Reload::Keep);
        assert_eq!(
            reload_decision(&id("a"), &Ok(id("b")), ok),
            Reload::Replace { not_after: 1 }
        );
        assert_eq!(
            reload_decision(&id("a"), &Ok(id("b")), bad),
            Reload::Refuse("the key does not belong to the certificate".into())
        );
        let gone = Err(RingError::Config {
            field: "m1.crt".into(),
            reason: "is not a PEM certificate".into(),
        });
        assert!(matches!(
            reload_decision(&id("a"), &gone, ok),
            Reload::Refuse(_)
        ));
    }
}
