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
        let (crt, key) = (self.dir.join("ca.crt"), self.dir.join("ca.key"));
        if crt.exists() && key.exists() {
            return Ok(());
        }
        let (cert_pem, key_pem) = new_ca("ring-ca")?;
        write_private(&key, key_pem.as_bytes())?;
        write_private(&crt, cert_pem.as_bytes())?;
        Ok(())
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
        let ca_cert = std::fs::read_to_string(&files.ca)
            .map_err(io(format!("reading {}", files.ca.display())))?;
        let ca_key_path = self.dir.join("ca.key");
        let ca_key = std::fs::read_to_string(&ca_key_path)
            .map_err(io(format!("reading {}", ca_key_path.display())))?;
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
