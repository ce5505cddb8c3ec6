//! Certificates in tests: what a TLS server presents (compared with the
//! files a seed renewed, so nothing is verified), what a file holds and
//! for how long, and leaves aged as if a control plane had served for two
//! years.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Accepts any server certificate (the caller only reads it).
#[derive(Debug)]
struct ReadOnly(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for ReadOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The DER certificate the TLS server at `addr` presents first, or why
/// none was read (within 5 s). A server that asks for a client
/// certificate still presents its own before it does.
pub async fn presented_certificate(addr: SocketAddr) -> Result<Vec<u8>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ReadOnly(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::IpAddress(addr.ip().into());
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {addr}: {e}"))?;
        let (_, session) = tls.get_ref();
        session
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .ok_or_else(|| format!("{addr} presented no certificate"))
    };
    tokio::time::timeout(Duration::from_secs(5), handshake)
        .await
        .map_err(|_| format!("no TLS handshake with {addr} within 5s"))?
}

/// The first certificate of a PEM file, as DER.
pub fn file_certificate(path: &std::path::Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    seed::expiry::certificates_der(&pem)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{} holds no certificate", path.display()))
}

/// Replaces `leaf` in `pki` with one from the same CA for `endpoint` that
/// ends in `days` (what two years of serving leave).
pub fn age_leaf(
    pki: &seed::pki::Pki,
    leaf: seed::pki::Leaf,
    endpoint: &seed::ShootEndpoint,
    days: i64,
) {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let ca = pki.ca();
    let spec = leaf.spec(endpoint);
    let (cert, key) = seed::pki::issue_for_days(&read(&ca.cert), &read(&ca.key), &spec, days)
        .expect("issuing an aged certificate");
    let pair = pki.leaf(leaf);
    seed::pki::write_private(&pair.key, key.as_bytes()).expect("aged key");
    seed::pki::write_private(&pair.cert, cert.as_bytes()).expect("aged certificate");
}

/// Whole days the certificate in `path` is still valid (negative: ended;
/// an unreadable file counts as ended long ago).
pub fn days_left(path: &std::path::Path) -> i64 {
    let end = seed::expiry::not_after_file(path).unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    (end - now).div_euclid(86_400)
}
