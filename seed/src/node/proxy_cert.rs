//! kube-proxy's client certificate (`system:kube-proxy`, also what the
//! node's cluster DNS lists Services with), renewed by `ringctl pki renew`,
//! is taken without restarting the node: `ring-node` polls the pair, and
//! once a new one is complete (its key belongs to its certificate: a pair
//! replaced file by file is not, for a moment) it rewrites kube-proxy's
//! kubeconfig, restarts kube-proxy (its iptables rules stay in place
//! meanwhile) and has the DNS ask with it. The serial in use is reported in
//! `status.json` (`proxyCertificateSerial`), which `ringctl pki renew` waits for.

use std::time::Duration;

use crate::pki::CertPair;

/// How often the pair is looked at.
pub(super) const POLL: Duration = Duration::from_secs(5);

/// The pair as last taken.
pub(super) struct Watch {
    pair: CertPair,
    seen: Option<(Vec<u8>, Vec<u8>)>,
}

impl Watch {
    /// Starts from the pair the node started with (kube-proxy's, see
    /// [`super::NodeLayout::proxy_cert`]).
    pub(super) fn new(pair: CertPair) -> Watch {
        let seen = read(&pair);
        Watch { pair, seen }
    }

    /// A complete pair other than the one last taken, if there is one now:
    /// its serial. A pair in the middle of being replaced waits for the
    /// next look.
    pub(super) fn renewed(&mut self) -> Option<String> {
        let now = read(&self.pair)?;
        if self.seen.as_ref() == Some(&now) || !crate::pki::pair_matches(&self.pair) {
            return None;
        }
        let serial = serial(&now.0);
        self.seen = Some(now);
        serial
    }
}

fn read(pair: &CertPair) -> Option<(Vec<u8>, Vec<u8>)> {
    Some((
        std::fs::read(&pair.cert).ok()?,
        std::fs::read(&pair.key).ok()?,
    ))
}

/// The serial of the certificate in `pem`, as `ringctl pki check` prints it.
pub fn serial(pem: &[u8]) -> Option<String> {
    crate::expiry::infos_pem(pem)
        .ok()?
        .into_iter()
        .next()
        .map(|i| i.serial)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ca: &(String, String), cn: &str) -> (String, String) {
        let spec = crate::pki::LeafSpec {
            common_name: cn,
            organizations: &[],
            ips: vec![],
            dns_names: vec![],
            server: false,
            client: true,
        };
        crate::pki::issue(&ca.0, &ca.1, &spec).unwrap()
    }

    /// The node's pair is taken once it changed as a whole: not at start,
    /// not while only the key was replaced, once when both were, and not
    /// again until it changes again.
    #[test]
    fn a_renewed_pair_is_taken_once_and_only_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertPair {
            cert: dir.path().join("kube-proxy.crt"),
            key: dir.path().join("kube-proxy.key"),
        };
        let ca = crate::pki::new_ca("shoot CA").unwrap();
        let write = |(cert, key): &(String, String)| {
            std::fs::write(&files.key, key).unwrap();
            std::fs::write(&files.cert, cert).unwrap();
        };
        write(&pair(&ca, "system:kube-proxy"));
        let mut watch = Watch::new(files.clone());
        assert_eq!(watch.renewed(), None, "the pair it started with");
        let next = pair(&ca, "system:kube-proxy");
        std::fs::write(&files.key, &next.1).unwrap();
        assert_eq!(
            watch.renewed(),
            None,
            "a new key next to the old certificate"
        );
        std::fs::write(&files.cert, &next.0).unwrap();
        let taken = watch.renewed().expect("the complete new pair");
        assert_eq!(Some(taken), serial(next.0.as_bytes()));
        assert_eq!(watch.renewed(), None, "taken once");
    }
}
