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
