//! A shoot's PKI, generated with rcgen (no openssl).
//!
//! One CA per shoot signs: etcd's server, peer and client certificates, the
//! kube-apiserver serving certificate, and client certificates for the admin,
//! kube-controller-manager and kube-scheduler. A separate key pair signs service
//! account tokens. All keys are ECDSA P-256, all files are written atomically
//! with mode 0600. Existing files are checked on every start (parseable, key
//! matches certificate, issued by the shoot's CA); a leaf that is about to
//! expire or lacks the shoot's current address is reissued.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::endpoint::ShootEndpoint;
use crate::error::{Result, SeedError};

/// The cluster-internal IP of the `kubernetes` Service (first of the service range).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// The service ClusterIP range given to kube-apiserver.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

const CA_DAYS: i64 = 3650;
const LEAF_DAYS: i64 = 730;
/// Leaves with less than this left are reissued (at a start, or online by
/// [`crate::Seed::renew_certificates`]).
const RENEW_BEFORE_DAYS: i64 = 30;

/// A certificate file and its private key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The file layout of a shoot's PKI directory.
#[derive(Debug, Clone)]
pub struct Pki {
    dir: PathBuf,
}

/// The leaf certificates of a shoot's PKI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    EtcdServer,
    EtcdPeer,
    /// Used by kube-apiserver and by Ring (backups) to talk to etcd.
    EtcdClient,
    ApiServer,
    Admin,
    ControllerManager,
    Scheduler,
    /// kube-apiserver's client certificate towards kubelets (logs, exec, port-forward).
    KubeletClient,
}

impl Leaf {
    /// Every leaf, in the order they are issued.
    pub const ALL: [Leaf; 8] = [
        Leaf::EtcdServer,
        Leaf::EtcdPeer,
        Leaf::EtcdClient,
        Leaf::ApiServer,
        Leaf::Admin,
        Leaf::ControllerManager,
        Leaf::Scheduler,
        Leaf::KubeletClient,
    ];

    /// The component that must restart to use this leaf once renewed: the
    /// clients whose kubeconfig embeds it. The others read the files anew by
    /// themselves: etcd at every TLS handshake (its server and peer
    /// certificates), kube-apiserver's etcd client at every new connection,
    /// its serving certificate within a minute and its kubelet client
    /// certificate within five (client-go's reload), ringd's health checks
    /// at every check (the admin kubeconfig is rewritten).
    pub fn restarts(self) -> Option<crate::Component> {
        match self {
            Leaf::ControllerManager => Some(crate::Component::KubeControllerManager),
            Leaf::Scheduler => Some(crate::Component::KubeScheduler),
            _ => None,
        }
    }

    /// The file name of its certificate in the PKI directory.
    pub fn cert_file(self) -> String {
        format!("{}.crt", self.file_stem())
    }

    fn file_stem(self) -> &'static str {
        match self {
            Leaf::EtcdServer => "etcd-server",
            Leaf::EtcdPeer => "etcd-peer",
            Leaf::EtcdClient => "etcd-client",
            Leaf::ApiServer => "kube-apiserver",
            Leaf::Admin => "admin",
            Leaf::ControllerManager => "kube-controller-manager",
            Leaf::Scheduler => "kube-scheduler",
            Leaf::KubeletClient => "kube-apiserver-kubelet-client",
        }
    }

    /// (common name, organizations, serves TLS, authenticates as client)
    fn identity(self) -> (&'static str, &'static [&'static str], bool, bool) {
        match self {
            Leaf::EtcdServer => ("etcd-server", &[], true, true),
            Leaf::EtcdPeer => ("etcd-peer", &[], true, true),
            Leaf::EtcdClient => ("kube-apiserver-etcd-client", &[], false, true),
            Leaf::ApiServer => ("kube-apiserver", &[], true, false),
            Leaf::Admin => ("ring:admin", &["system:masters"], false, true),
            Leaf::ControllerManager => ("system:kube-controller-manager", &[], false, true),
            Leaf::Scheduler => ("system:kube-scheduler", &[], false, true),
            Leaf::KubeletClient => (
                "kube-apiserver-kubelet-client",
                &["system:masters"],
                false,
                true,
            ),
        }
    }

    /// What this leaf is issued as for the shoot at `endpoint` (what
    /// `ringctl pki renew` issues anew for a published kubeconfig too).
    pub fn spec(self, endpoint: &ShootEndpoint) -> LeafSpec<'static> {
        let (common_name, organizations, server, client) = self.identity();
        let (ips, dns) = self.sans(endpoint);
        LeafSpec {
            common_name,
            organizations,
            ips,
            dns_names: dns.into_iter().map(String::from).collect(),
            server,
            client,
        }
    }

    /// Subject alternative names: the shoot's address for every server certificate,
    /// plus the in-cluster names for kube-apiserver.
    fn sans(self, endpoint: &ShootEndpoint) -> (Vec<IpAddr>, Vec<&'static str>) {
        let local = vec![
            IpAddr::V4(endpoint.address),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        ];
        match self {
            Leaf::EtcdServer | Leaf::EtcdPeer => (local, vec!["localhost"]),
            Leaf::ApiServer => {
                let mut ips = local;
                ips.push(IpAddr::V4(KUBERNETES_SERVICE_IP));
                (
                    ips,
                    vec![
                        "localhost",
                        "kubernetes",
                        "kubernetes.default",
                        "kubernetes.default.svc",
                        "kubernetes.default.svc.cluster.local",
                    ],
                )
            }
            _ => (vec![], vec![]),
        }
    }
}

impl Pki {
    /// The PKI kept in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Pki { dir: dir.into() }
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shoot's CA.
    pub fn ca(&self) -> CertPair {
        self.pair("ca")
    }

    /// A leaf certificate and its key.
    pub fn leaf(&self, leaf: Leaf) -> CertPair {
        self.pair(leaf.file_stem())
    }

    /// The private key that signs service account tokens.
    pub fn service_account_key(&self) -> PathBuf {
        self.dir.join("service-account.key")
    }

    /// The public key that verifies service account tokens.
    pub fn service_account_pub(&self) -> PathBuf {
        self.dir.join("service-account.pub")
    }

    fn pair(&self, stem: &str) -> CertPair {
        CertPair {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        }
    }

    /// Makes the PKI complete and valid for `shoot` at `endpoint`: creates what is
    /// missing, reissues leaves that expire soon or lack the endpoint's address,
    /// and fails with a precise error on anything corrupted. Returns the leaves
    /// it reissued (not those it created where there were none).
    pub fn ensure(&self, shoot: &str, endpoint: &ShootEndpoint) -> Result<Vec<Leaf>> {
        create_private_dir(&self.dir)?;
        let ca = self.ensure_ca(shoot)?;
        let mut reissued = Vec::new();
        for leaf in Leaf::ALL {
            if self.ensure_leaf(leaf, shoot, endpoint, &ca)? {
                reissued.push(leaf);
            }
        }
        self.ensure_service_account()?;
        Ok(reissued)
    }

    fn ensure_ca(&self, shoot: &str) -> Result<LoadedCa> {
        let ca = self.ca();
        match (ca.cert.exists(), ca.key.exists()) {
            (true, true) => {
                let cert_der = read_cert_der(&ca.cert).map_err(|reason| SeedError::Ca {
                    path: ca.cert.clone(),
                    reason,
                })?;
                let key = read_key(&ca.key).map_err(|reason| SeedError::Ca {
                    path: ca.key.clone(),
                    reason,
                })?;
                let (spki, _) = cert_facts(&cert_der).map_err(|reason| SeedError::Ca {
                    path: ca.cert.clone(),
                    reason,
                })?;
                if spki != key.subject_public_key_info() {
                    return Err(SeedError::Ca {
                        path: ca.key.clone(),
                        reason: format!("does not belong to the certificate {}", ca.cert.display()),
                    });
                }
                Ok(LoadedCa { cert_der, key })
            }
            (false, false) => {
                let (cert_pem, key_pem) = new_ca(&format!("ring-ca-{shoot}"))?;
                write_private(&ca.key, key_pem.as_bytes())?;
                write_private(&ca.cert, cert_pem.as_bytes())?;
                let cert_der = read_cert_der(&ca.cert).map_err(|reason| SeedError::Ca {
                    path: ca.cert.clone(),
                    reason,
                })?;
                let key = read_key(&ca.key).map_err(|reason| SeedError::Ca {
                    path: ca.key.clone(),
                    reason,
                })?;
                Ok(LoadedCa { cert_der, key })
            }
            (cert_exists, _) => {
                let (present, missing) = if cert_exists {
                    (&ca.cert, &ca.key)
                } else {
                    (&ca.key, &ca.cert)
                };
                Err(SeedError::Ca {
                    path: missing.clone(),
                    reason: format!("is missing while {} exists", present.display()),
                })
            }
        }
    }

    fn ensure_leaf(
        &self,
        leaf: Leaf,
        shoot: &str,
        endpoint: &ShootEndpoint,
        ca: &LoadedCa,
    ) -> Result<bool> {
        let pair = self.leaf(leaf);
        let (want_ips, _) = leaf.sans(endpoint);
        let existed = pair.cert.exists() && pair.key.exists();
        if existed {
            let err = |path: &Path| {
                let path = path.to_path_buf();
                move |reason| SeedError::Pki { path, reason }
            };
            let cert_der = read_cert_der(&pair.cert).map_err(err(&pair.cert))?;
            let key = read_key(&pair.key).map_err(err(&pair.key))?;
            let (spki, facts) = cert_facts(&cert_der).map_err(err(&pair.cert))?;
            if spki != key.subject_public_key_info() {
                return Err(SeedError::Pki {
                    path: pair.key.clone(),
                    reason: format!("does not belong to the certificate {}", pair.cert.display()),
                });
            }
            verify_issued_by(&cert_der, &ca.cert_der).map_err(err(&pair.cert))?;
            let fresh = facts.not_after - now() > RENEW_BEFORE_DAYS * 86_400;
            let covers = want_ips.iter().all(|ip| facts.ips.contains(ip));
            if fresh && covers {
                return Ok(false);
            }
            tracing::info!(shoot, cert = %pair.cert.display(), fresh, covers, "reissuing certificate");
        }
        let spec = leaf.spec(endpoint);
        let (cert, key) = issue_leaf(&ca.cert_der, &ca.key, &spec, LEAF_DAYS)
            .map_err(|e| pki_err(&pair.cert, e))?;
        write_private(&pair.key, key.as_bytes())?;
        write_private(&pair.cert, cert.as_bytes())?;
        Ok(existed)
    }

    fn ensure_service_account(&self) -> Result<()> {
        let (key_path, pub_path) = (self.service_account_key(), self.service_account_pub());
        let key = if key_path.exists() {
            read_key(&key_path).map_err(|reason| SeedError::Pki {
                path: key_path.clone(),
                reason,
            })?
        } else {
            let key = new_key()?;
            write_private(&key_path, key.serialize_pem().as_bytes())?;
            key
        };
        let public = key.public_key_pem();
        let current = std::fs::read_to_string(&pub_path).ok();
        if current.as_deref() != Some(public.as_str()) {
            write_private(&pub_path, public.as_bytes())?;
        }
        Ok(())
    }

    /// Reads a PEM file of this PKI (for kubeconfigs).
    pub fn read_pem(&self, path: &Path) -> Result<String> {
        std::fs::read_to_string(path).map_err(SeedError::io(path))
    }
}

/// What a leaf certificate says about its holder.
#[derive(Debug, Clone)]
pub struct LeafSpec<'a> {
    pub common_name: &'a str,
    pub organizations: &'a [&'a str],
    pub ips: Vec<IpAddr>,
    pub dns_names: Vec<String>,
    /// May serve TLS.
    pub server: bool,
    /// May authenticate as a TLS client.
    pub client: bool,
}

impl<'a> LeafSpec<'a> {
    /// A certificate that only authenticates a client, with no alternative names.
    pub fn client(common_name: &'a str, organizations: &'a [&'a str]) -> Self {
        LeafSpec {
            common_name,
            organizations,
            ips: vec![],
            dns_names: vec![],
            server: false,
            client: true,
        }
    }
}

/// A new self-signed CA (ECDSA P-256, ten years): `(certificate PEM, key PEM)`.
pub fn new_ca(common_name: &str) -> Result<(String, String)> {
    let key = new_key()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(common_name, &["ring"]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_DAYS);
    let cert = params
        .self_signed(&key)
        .map_err(|e| pki_err(Path::new("(new CA)"), e))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Issues a leaf certificate signed by the CA given as PEM: `(certificate PEM, key PEM)`.
pub fn issue(ca_cert_pem: &str, ca_key_pem: &str, spec: &LeafSpec<'_>) -> Result<(String, String)> {
    issue_for_days(ca_cert_pem, ca_key_pem, spec, LEAF_DAYS)
}

/// [`issue`], valid for `days` from now instead of the usual 730.
pub fn issue_for_days(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    spec: &LeafSpec<'_>,
    days: i64,
) -> Result<(String, String)> {
    let ca_path = Path::new("(CA)");
    let (_, pem) = x509_parser::pem::parse_x509_pem(ca_cert_pem.as_bytes())
        .map_err(|e| pki_err(ca_path, format!("CA certificate is not PEM: {e}")))?;
    let key =
        KeyPair::from_pem(ca_key_pem).map_err(|e| pki_err(ca_path, format!("CA key: {e}")))?;
    issue_leaf(&pem.contents, &key, spec, days).map_err(|e| pki_err(ca_path, e))
}

fn issue_leaf(
    ca_der: &[u8],
    ca_key: &KeyPair,
    spec: &LeafSpec<'_>,
    days: i64,
) -> std::result::Result<(String, String), String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(spec.common_name, spec.organizations);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    if spec.server {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    if spec.client {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
    }
    params.subject_alt_names = spec.ips.iter().copied().map(SanType::IpAddress).collect();
    for name in &spec.dns_names {
        let name = name
            .as_str()
            .try_into()
            .map_err(|e| format!("DNS name {name:?}: {e}"))?;
        params.subject_alt_names.push(SanType::DnsName(name));
    }
    set_validity(&mut params, days);
    let issuer =
        Issuer::from_ca_cert_der(&ca_der.to_vec().into(), ca_key).map_err(|e| e.to_string())?;
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The common name of a DER certificate's subject, if it has one.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    subject_common_name(&cert)
}

fn subject_common_name(cert: &X509Certificate) -> Option<String> {
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_string())
}

struct LoadedCa {
    cert_der: Vec<u8>,
    key: KeyPair,
}

pub(crate) struct CertFacts {
    pub(crate) not_before: i64,
    pub(crate) not_after: i64,
    pub(crate) common_name: Option<String>,
    ips: Vec<IpAddr>,
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

fn new_key() -> Result<KeyPair> {
    KeyPair::generate().map_err(|e| SeedError::Pki {
        path: PathBuf::from("(new key)"),
        reason: e.to_string(),
    })
}

fn pki_err(path: &Path, e: impl std::fmt::Display) -> SeedError {
    SeedError::Pki {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn dn(cn: &str, orgs: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    for o in orgs {
        dn.push(DnType::OrganizationName, *o);
    }
    dn
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

fn read_cert_der(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&bytes)
        .map_err(|e| format!("is not a PEM certificate ({e})"))?;
    if pem.label != "CERTIFICATE" {
        return Err(format!(
            "holds a PEM {:?} block, expected CERTIFICATE",
            pem.label
        ));
    }
    Ok(pem.contents)
}

/// Whether the private key `key_pem` belongs to the certificate `cert_pem`
/// (both PEM): a pair being replaced file by file does not, for a moment.
pub fn pem_pair_matches(cert_pem: &[u8], key_pem: &[u8]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem) else {
        return false;
    };
    let key = std::str::from_utf8(key_pem)
        .ok()
        .and_then(|k| KeyPair::from_pem(k).ok());
    let Some(key) = key else {
        return false;
    };
    pem.label == "CERTIFICATE"
        && cert_facts(&pem.contents).is_ok_and(|(spki, _)| spki == key.subject_public_key_info())
}

fn read_key(path: &Path) -> std::result::Result<KeyPair, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    KeyPair::from_pem(&text).map_err(|e| format!("is not a PEM private key ({e})"))
}

/// The certificate's SubjectPublicKeyInfo (DER) and the facts Ring checks.
pub(crate) fn cert_facts(der: &[u8]) -> std::result::Result<(Vec<u8>, CertFacts), String> {
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| format!("is not a valid X.509 certificate ({e})"))?;
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::IPAddress(raw) = name {
                match raw.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*raw).unwrap_or_default())),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*raw).unwrap_or_default())),
                    _ => {}
                }
            }
        }
    }
    Ok((
        cert.public_key().raw.to_vec(),
        CertFacts {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            common_name: subject_common_name(&cert),
            ips,
        },
    ))
}

pub(crate) fn verify_issued_by(der: &[u8], ca_der: &[u8]) -> std::result::Result<(), String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| e.to_string())?;
    let (_, ca) = X509Certificate::from_der(ca_der).map_err(|e| e.to_string())?;
    cert.verify_signature(Some(ca.public_key()))
        .map_err(|_| "was not issued by this shoot's CA (signature does not verify)".to_string())
}

/// Creates `dir` (and parents) with mode 0700.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| SeedError::StateDir {
            path: dir.to_path_buf(),
            source,
        })
}

/// Writes a private (0600) file that needs no durability: a scratch file
/// deleted after use (no fsync, unlike [`write_private`]).
pub fn write_scratch(path: &Path, contents: &[u8]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?
            .write_all(contents)
    };
    write().map_err(SeedError::io(path))
}

/// Writes `contents` to `path` atomically (temp file, fsync, rename) with mode
/// 0600. Each call writes its own temp file (`.<name>.<pid>.<n>.tmp`), so
/// concurrent writers of one path (a lease renewal and a move's lease step)
/// never rename each other's file away; the last rename wins whole.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    static TEMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = TEMPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map_or_else(
        || std::borrow::Cow::Borrowed("file"),
        |n| n.to_string_lossy(),
    );
    let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        SeedError::io(path)(e)
    })
}

#[cfg(test)]
#[path = "pki_tests.rs"]
mod tests;
