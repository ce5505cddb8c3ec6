//! kube-proxy's client certificate (`system:kube-proxy`, also what the
//! node's cluster DNS lists Services with), renewed by `ringctl pki renew`,
//! is taken without restarting the node: `ring-node` polls the pair, and
//! once a new one is complete (its key belongs to its certificate: a pair
//! replaced file by file is not, for a moment) it writes kube-proxy's
//! kubeconfig from exactly those bytes, restarts kube-proxy (its iptables
//! rules stay in place meanwhile) and has the DNS ask with it. The serial in
//! use is reported in `status.json` (`proxyCertificateSerial`), which
//! `ringctl pki renew` waits for.

use std::time::Duration;

use crate::pki::CertPair;

/// How often the pair is looked at.
pub(super) const POLL: Duration = Duration::from_secs(5);

/// A certificate and its key, as read (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl Pair {
    /// Both files, if readable.
    pub(super) fn read(files: &CertPair) -> Option<Pair> {
        Some(Pair {
            cert: std::fs::read(&files.cert).ok()?,
            key: std::fs::read(&files.key).ok()?,
        })
    }

    /// Whether the key belongs to the certificate.
    pub(super) fn matches(&self) -> bool {
        crate::pki::pem_pair_matches(&self.cert, &self.key)
    }

    /// The certificate's serial, as `ringctl pki check` prints it.
    pub(super) fn serial(&self) -> Option<String> {
        let infos = crate::expiry::infos_pem(&self.cert).ok()?;
        infos.into_iter().next().map(|i| i.serial)
    }
}

/// The pair as last taken.
pub(super) struct Watch {
    files: CertPair,
    seen: Option<Pair>,
}

impl Watch {
    /// Follows `files` (kube-proxy's, see [`super::NodeLayout::proxy_cert`])
    /// from `taken`, the pair the node's kubeconfig was written with.
    pub(super) fn new(files: CertPair, taken: Option<Pair>) -> Watch {
        Watch { files, seen: taken }
    }

    /// A complete pair other than the one last taken, if there is one now.
    /// A pair in the middle of being replaced waits for the next look.
    pub(super) fn renewed(&mut self) -> Option<Pair> {
        let now = Pair::read(&self.files)?;
        if self.seen.as_ref() == Some(&now) || !now.matches() {
            return None;
        }
        self.seen = Some(now.clone());
        Some(now)
    }

    /// The pair last returned could not be taken: return it again at the
    /// next look.
    pub(super) fn retry(&mut self) {
        self.seen = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ca: &(String, String)) -> (String, String) {
        crate::pki::issue(&ca.0, &ca.1, &crate::node::config::proxy_identity()).unwrap()
    }

    /// The node's pair is taken once it changed as a whole: not the one it
    /// started with, not while only the key was replaced, once when both
    /// were, and not again until it changes again.
    #[test]
    fn a_renewed_pair_is_taken_once_and_only_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertPair {
            cert: dir.path().join("kube-proxy.crt"),
            key: dir.path().join("kube-proxy.key"),
        };
        let ca = crate::pki::new_ca("shoot CA").unwrap();
        let first = pair(&ca);
        std::fs::write(&files.key, &first.1).unwrap();
        std::fs::write(&files.cert, &first.0).unwrap();
        let started = Pair::read(&files).unwrap();
        assert!(started.matches());
        let mut watch = Watch::new(files.clone(), Some(started));
        assert_eq!(watch.renewed(), None, "the pair it started with");
        let next = pair(&ca);
        std::fs::write(&files.key, &next.1).unwrap();
        assert_eq!(
            watch.renewed(),
            None,
            "a new key next to the old certificate"
        );
        std::fs::write(&files.cert, &next.0).unwrap();
        let taken = watch.renewed().expect("the complete new pair");
        assert_eq!(taken.cert, next.0.as_bytes());
        assert_eq!(taken.key, next.1.as_bytes());
        assert!(taken.serial().is_some());
        assert_eq!(watch.renewed(), None, "taken once");
        watch.retry();
        assert_eq!(watch.renewed(), Some(taken), "again after a failed take");
    }
}
