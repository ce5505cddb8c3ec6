//! When certificates stop being valid: read from PEM files or text, for
//! status, metrics and `ringctl certs check`.

use std::path::{Path, PathBuf};

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::pki::{Leaf, Pki};

/// The end of validity (`notAfter`, unix seconds) of the first certificate in
/// `pem`, or what is wrong with it.
pub fn not_after_pem(pem: &[u8]) -> Result<i64, String> {
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| format!("is not PEM ({e})"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let (_, cert) = X509Certificate::from_der(&block.contents)
            .map_err(|e| format!("is not a valid X.509 certificate ({e})"))?;
        return Ok(cert.validity().not_after.timestamp());
    }
    Err("holds no PEM CERTIFICATE block".into())
}

/// What identifies a certificate and when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// `notAfter`, unix seconds.
    pub not_after: i64,
    /// The serial number, hex with colons.
    pub serial: String,
}

/// [`CertInfo`] of every certificate in `pem` (a CA bundle holds several).
pub fn infos_pem(pem: &[u8]) -> Result<Vec<CertInfo>, String> {
    let mut out = Vec::new();
    for der in certificates_der(pem) {
        let (_, cert) = X509Certificate::from_der(&der)
            .map_err(|e| format!("is not a valid X.509 certificate ({e})"))?;
        out.push(CertInfo {
            not_after: cert.validity().not_after.timestamp(),
            serial: cert.raw_serial_as_string(),
        });
    }
    if out.is_empty() {
        return Err("holds no PEM CERTIFICATE block".into());
    }
    Ok(out)
}

/// [`not_after_pem`] of the file at `path`; the error says whether the file
/// could not be read or holds no certificate.
pub fn not_after_file(path: &Path) -> Result<i64, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    not_after_pem(&bytes)
}

/// [`not_after_pem`] of the client certificate embedded in the kubeconfig
/// at `path` (its first user's `client-certificate-data`, as Ring writes them).
pub fn kubeconfig_client_not_after(path: &Path) -> Result<i64, String> {
    use base64::Engine;
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| format!("is not YAML ({e})"))?;
    let data = doc["users"][0]["user"]["client-certificate-data"]
        .as_str()
        .ok_or("has no users[0].user.client-certificate-data")?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("client-certificate-data is not base64 ({e})"))?;
    not_after_pem(&pem).map_err(|e| format!("client-certificate-data {e}"))
}

/// The DER of every CERTIFICATE block in `pem`, in order.
pub fn certificates_der(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(|b| b.ok())
        .filter(|b| b.label == "CERTIFICATE")
        .map(|b| b.contents)
        .collect()
}

/// What a member's identity certificate says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityFacts {
    /// `notBefore` and `notAfter`, unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// The subject's common name (the member's name in the ring).
    pub common_name: Option<String>,
}

/// Checks that `cert_pem`'s first certificate belongs to the private key in
/// `key_pem` and was issued by one of the CA certificates in `ca_pem` (a
/// bundle during a CA change); returns what it says of itself (its dates and
/// name are for the caller to judge).
pub fn check_identity(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &str,
) -> Result<IdentityFacts, String> {
    let (cert, facts, matches) = first_with_key(cert_pem, key_pem)?;
    if !matches {
        return Err("the key does not belong to the certificate".into());
    }
    let cas = certificates_der(ca_pem);
    if cas.is_empty() {
        return Err("the CA file holds no PEM CERTIFICATE block".into());
    }
    if !cas
        .iter()
        .any(|ca| crate::pki::verify_issued_by(&cert, ca).is_ok())
    {
        return Err("the certificate was not issued by the CA in the CA file".into());
    }
    Ok(IdentityFacts {
        not_before: facts.not_before,
        not_after: facts.not_after,
        common_name: facts.common_name,
    })
}

/// The subject's common name of the first certificate in `cert_pem`.
pub fn common_name_pem(cert_pem: &[u8]) -> Option<String> {
    let der = certificates_der(cert_pem).into_iter().next()?;
    crate::pki::common_name(&der)
}

/// Whether the private key in `key_pem` belongs to the first certificate in
/// `cert_pem`; an error says which of the two cannot be read.
pub fn key_matches(cert_pem: &[u8], key_pem: &str) -> Result<bool, String> {
    first_with_key(cert_pem, key_pem).map(|(_, _, matches)| matches)
}

/// The first certificate in `cert_pem` (DER and facts) and whether the key
/// in `key_pem` belongs to it.
fn first_with_key(
    cert_pem: &[u8],
    key_pem: &str,
) -> Result<(Vec<u8>, crate::pki::CertFacts, bool), String> {
    let cert = certificates_der(cert_pem)
        .into_iter()
        .next()
        .ok_or("the certificate file holds no PEM CERTIFICATE block")?;
    let (spki, facts) =
        crate::pki::cert_facts(&cert).map_err(|e| format!("the certificate {e}"))?;
    let key = rcgen::KeyPair::from_pem(key_pem)
        .map_err(|e| format!("the key file is not a PEM private key ({e})"))?;
    let matches = rcgen::PublicKeyData::subject_public_key_info(&key) == spki;
    Ok((cert, facts, matches))
}

impl Pki {
    /// Every certificate of the shoot's PKI: (name, file), the CA first.
    pub fn certificates(&self) -> Vec<(String, PathBuf)> {
        let mut out = vec![("ca".to_string(), self.ca().cert)];
        for leaf in Leaf::ALL {
            let pair = self.leaf(leaf);
            let name = pair
                .cert
                .file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
            out.push((name, pair.cert));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::ShootEndpoint;

    fn cert_valid_for(days: i64) -> (String, i64) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x".to_string()]).unwrap();
        let not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        let not_after = not_after.replace_nanosecond(0).unwrap();
        params.not_after = not_after;
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), not_after.unix_timestamp())
    }

    #[test]
    fn reads_the_end_of_validity_of_the_first_certificate() {
        let (pem, want) = cert_valid_for(12);
        assert_eq!(not_after_pem(pem.as_bytes()), Ok(want));
        // a key before the certificate (a combined file) is skipped
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert_eq!(not_after_pem(format!("{key}{pem}").as_bytes()), Ok(want));
        // every certificate of a bundle, each with its own serial
        let (other, other_after) = cert_valid_for(20);
        let infos = infos_pem(format!("{pem}{other}").as_bytes()).unwrap();
        let afters: Vec<i64> = infos.iter().map(|i| i.not_after).collect();
        assert_eq!(afters, vec![want, other_after]);
        assert_ne!(infos[0].serial, infos[1].serial);
        assert!(infos_pem(key.as_bytes()).is_err());
    }

    #[test]
    fn an_identity_is_checked_for_its_key_and_its_issuer() {
        let (ca_cert, ca_key) = crate::pki::new_ca("ca-a").unwrap();
        let (other_ca, _) = crate::pki::new_ca("ca-b").unwrap();
        let spec = crate::pki::LeafSpec {
            common_name: "m1",
            organizations: &[],
            ips: vec![],
            dns_names: vec!["m1".into()],
            server: true,
            client: true,
        };
        let (cert, key) = crate::pki::issue(&ca_cert, &ca_key, &spec).unwrap();
        let (_, other_key) = crate::pki::issue(&ca_cert, &ca_key, &spec).unwrap();
        let not_after = not_after_pem(cert.as_bytes()).unwrap();
        let ca = ca_cert.as_bytes();
        let facts = check_identity(ca, cert.as_bytes(), &key).unwrap();
        assert_eq!(facts.not_after, not_after);
        assert_eq!(facts.common_name.as_deref(), Some("m1"));
        // issued an hour back, against clock skew
        assert!(
            facts.not_before < time::OffsetDateTime::now_utc().unix_timestamp() - 3000,
            "{facts:?}"
        );
        assert_eq!(common_name_pem(cert.as_bytes()).as_deref(), Some("m1"));
        // a bundle of the old and the new CA (a CA change) is accepted
        let bundle = format!("{other_ca}{ca_cert}");
        assert_eq!(
            check_identity(bundle.as_bytes(), cert.as_bytes(), &key),
            Ok(facts)
        );
        assert_eq!(
            check_identity(ca, cert.as_bytes(), &other_key),
            Err("the key does not belong to the certificate".into())
        );
        assert_eq!(key_matches(cert.as_bytes(), &key), Ok(true));
        assert_eq!(key_matches(cert.as_bytes(), &other_key), Ok(false));
        assert_eq!(
            check_identity(other_ca.as_bytes(), cert.as_bytes(), &key),
            Err("the certificate was not issued by the CA in the CA file".into())
        );
        assert_eq!(
            check_identity(ca, key.as_bytes(), &key),
            Err("the certificate file holds no PEM CERTIFICATE block".into())
        );
    }

    #[test]
    fn garbage_and_keys_alone_are_errors_that_say_so() {
        assert_eq!(
            not_after_pem(b"hello"),
            Err("holds no PEM CERTIFICATE block".into())
        );
        let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
        assert_eq!(
            not_after_pem(key.as_bytes()),
            Err("holds no PEM CERTIFICATE block".into())
        );
        let broken = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let err = not_after_pem(broken.as_bytes()).unwrap_err();
        assert!(err.starts_with("is not a valid X.509 certificate"), "{err}");
        let err = not_after_file(Path::new("/nonexistent/ca.crt")).unwrap_err();
        assert!(err.starts_with("cannot read:"), "{err}");
    }

    #[test]
    fn a_shoot_pki_lists_its_ca_and_every_leaf_with_their_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path());
        let endpoint = ShootEndpoint::on(std::net::Ipv4Addr::new(127, 20, 0, 1));
        pki.ensure("s1", &endpoint).unwrap();
        let certs = pki.certificates();
        assert_eq!(certs.len(), 1 + Leaf::ALL.len());
        assert_eq!(certs[0].0, "ca");
        assert!(
            certs.iter().any(|(n, _)| n == "kube-apiserver"),
            "{certs:?}"
        );
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let kubeconfig = dir.path().join("admin.kubeconfig");
        let server = "https://127.20.0.1:6443";
        let admin = pki.leaf(Leaf::Admin);
        crate::kubeconfig::write(&kubeconfig, "s1", "admin", server, &pki, &admin).unwrap();
        assert_eq!(
            kubeconfig_client_not_after(&kubeconfig),
            not_after_file(&pki.leaf(Leaf::Admin).cert)
        );
        std::fs::write(&kubeconfig, "users: []\n").unwrap();
        assert_eq!(
            kubeconfig_client_not_after(&kubeconfig),
            Err("has no users[0].user.client-certificate-data".into())
        );
        for (name, path) in &certs {
            let days = (not_after_file(path).unwrap() - now) / 86_400;
            let want = if name == "ca" { 3650 } else { 730 };
            assert!(days == want || days == want - 1, "{name}: {days} days");
        }
    }
}
