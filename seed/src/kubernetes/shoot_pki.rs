//! A shoot's PKI on a Kubernetes seed: the Secret in the seed cluster is the
//! source of truth, the local cache is restored from it and completed, and
//! serving certificates gain the in-cluster names.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::Api;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::render::{self, APISERVER, PKI_SECRET};
use super::status::LbAddress;
use super::KubernetesSeed;
use crate::error::{Result, SeedError};
use crate::pki::{create_private_dir, write_private, Leaf, LeafSpec, Pki, KUBERNETES_SERVICE_IP};
use crate::process::Component;
use crate::{kubeconfig, ControlPlaneSpec};

impl KubernetesSeed {
    /// The PKI Secret's data, if the Secret exists.
    pub(super) async fn read_pki_secret(
        &self,
        shoot: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        let secret = api
            .get_opt(PKI_SECRET)
            .await
            .map_err(self.kube_err(shoot, &format!("reading Secret {PKI_SECRET}")))?;
        Ok(secret.map(|s| {
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        }))
    }

    /// Restores the local PKI cache from the Secret (if any), completes it, and
    /// returns every file for the Secret.
    pub(super) async fn prepare_pki(
        &self,
        spec: &ControlPlaneSpec,
        lb: &[LbAddress],
    ) -> Result<BTreeMap<String, Vec<u8>>> {
        let dir = self.pki_cache(&spec.shoot);
        create_private_dir(&dir)?;
        let data = self.read_pki_secret(&spec.shoot).await?.unwrap_or_default();
        if let Some(name) = data.keys().find(|n| n.contains('/') || n.starts_with('.')) {
            return Err(SeedError::Pki {
                path: dir.join(name),
                reason: format!("Secret {PKI_SECRET} has an unexpected key {name:?}"),
            });
        }
        // the Secret is the truth: files it lacks go, its files replace the
        // cached ones one by one (never a missing file for a concurrent reader)
        for entry in std::fs::read_dir(&dir).map_err(SeedError::io(&dir))? {
            let path = entry.map_err(SeedError::io(&dir))?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| !n.starts_with('.') && !data.contains_key(&n)) && path.is_file()
            {
                std::fs::remove_file(&path).map_err(SeedError::io(&path))?;
            }
        }
        for (name, bytes) in &data {
            write_private(&dir.join(name), bytes)?;
        }
        let pki = Pki::new(&dir);
        pki.ensure(&spec.shoot, &spec.endpoint)?;
        let ns = self.namespace(&spec.shoot);
        let mut api_dns: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .map(String::from)
        .to_vec();
        api_dns.extend(render::service_dns_names(&ns, APISERVER));
        let mut api_ips = vec![
            IpAddr::V4(spec.endpoint.address),
            IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            IpAddr::V4(KUBERNETES_SERVICE_IP),
        ];
        api_ips.extend(self.config.node_address);
        for a in lb {
            match a {
                LbAddress::Ip(ip) => api_ips.push(*ip),
                LbAddress::Host(h) => api_dns.push(h.clone()),
            }
        }
        let etcd_ips = api_ips[..2].to_vec();
        let etcd_dns = render::etcd_dns_names(&ns);
        for (stem, cn, server, client, ips, dns) in [
            (
                "etcd-server",
                "etcd-server",
                true,
                true,
                &etcd_ips,
                &etcd_dns,
            ),
            ("etcd-peer", "etcd-peer", true, true, &etcd_ips, &etcd_dns),
            (
                "kube-apiserver",
                "kube-apiserver",
                true,
                false,
                &api_ips,
                &api_dns,
            ),
        ] {
            let spec = LeafSpec {
                common_name: cn,
                organizations: &[],
                ips: ips.clone(),
                dns_names: dns.clone(),
                server,
                client,
            };
            ensure_serving(&pki, stem, &spec)?;
        }
        let in_cluster_api = format!("https://{APISERVER}.{ns}.svc:{}", spec.endpoint.api_port);
        for (c, leaf) in [
            (
                Component::KubeControllerManager,
                crate::pki::Leaf::ControllerManager,
            ),
            (Component::KubeScheduler, crate::pki::Leaf::Scheduler),
        ] {
            kubeconfig::write(
                &dir.join(format!("{}.kubeconfig", c.name())),
                &spec.shoot,
                c.name(),
                &in_cluster_api,
                &pki,
                &pki.leaf(leaf),
            )?;
        }
        read_dir_files(&dir)
    }
}

impl KubernetesSeed {
    /// [`crate::Seed::renew_certificates`] here: the PKI made whole again
    /// (due leaves reissued, the in-cluster names kept) and put into the
    /// Secret when anything changed (the kubelet refreshes the pods' files,
    /// which the components read anew); then the Deployment of each
    /// component whose kubeconfig is not the one its pods were made for
    /// gets the new kubeconfig's hash, so it replaces them (looked at every
    /// time: also after a crash between the two). One at a time with a
    /// start, which prepares the same files. A control plane never applied
    /// here has nothing to renew.
    pub(super) async fn renew(&self, shoot: &str) -> Result<Vec<Leaf>> {
        let Some(owner) = self.owner(shoot).await? else {
            return Ok(Vec::new());
        };
        let _one_at_a_time = self.starting.lock().await;
        let spec = self.recorded_spec(shoot).await?;
        let before = self.read_pki_secret(shoot).await?.unwrap_or_default();
        let svc = self.api_service(shoot).await?;
        let lb = svc
            .as_ref()
            .map(super::status::lb_addresses)
            .unwrap_or_default();
        let files = self.prepare_pki(&spec, &lb).await?;
        let renewed = changed_leaves(&before, &files);
        if files != before {
            let secret = self.renderer(&spec).pki_secret(&owner, &files);
            self.apply(shoot, &secret).await?;
            tracing::info!(shoot, ?renewed, secret = PKI_SECRET, "certificates renewed");
        }
        for c in Leaf::ALL.iter().filter_map(|l| l.restarts()) {
            self.roll_to(shoot, c, &render::kubeconfig_hash(&files, c))
                .await?;
        }
        Ok(renewed)
    }

    /// Marks `component`'s pod template with kubeconfig hash `hash` unless
    /// it has it (a merge patch of that annotation alone: the replicas stay
    /// as they are, zero during a move).
    async fn roll_to(&self, shoot: &str, component: Component, hash: &str) -> Result<()> {
        let (_, name) = render::workload(component);
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace(shoot));
        let what = format!("reading Deployment {name}");
        let Some(d) = api
            .get_opt(name)
            .await
            .map_err(self.kube_err(shoot, &what))?
        else {
            return Ok(());
        };
        let annotations = d.spec.template.metadata.and_then(|m| m.annotations);
        if annotations
            .and_then(|a| a.get(render::KUBECONFIG_HASH).cloned())
            .as_deref()
            == Some(hash)
        {
            return Ok(());
        }
        let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {render::KUBECONFIG_HASH: hash}}}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(self.kube_err(shoot, &format!("rolling Deployment {name}")))?;
        tracing::info!(
            shoot,
            deployment = name,
            "pods replaced for a renewed kubeconfig"
        );
        Ok(())
    }
}

/// The leaves whose certificate differs between two sets of PKI files.
fn changed_leaves(
    before: &BTreeMap<String, Vec<u8>>,
    after: &BTreeMap<String, Vec<u8>>,
) -> Vec<Leaf> {
    Leaf::ALL
        .into_iter()
        .filter(|l| before.get(&l.cert_file()) != after.get(&l.cert_file()))
        .collect()
}

/// Every regular file of `dir` by name.
pub(super) fn read_dir_files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(SeedError::io(dir))? {
        let entry = entry.map_err(SeedError::io(dir))?;
        let path = entry.path();
        if path.is_file() && path.extension().is_none_or(|e| e != "tmp") {
            let bytes = std::fs::read(&path).map_err(SeedError::io(&path))?;
            files.insert(entry.file_name().to_string_lossy().into_owned(), bytes);
        }
    }
    Ok(files)
}

/// Keeps the serving certificate `stem` if it already names every address of
/// `spec`, else issues it anew from the shoot's CA (which [`Pki::ensure`] checked).
fn ensure_serving(pki: &Pki, stem: &str, spec: &LeafSpec<'_>) -> Result<()> {
    let (cert, key) = (
        pki.dir().join(format!("{stem}.crt")),
        pki.dir().join(format!("{stem}.key")),
    );
    let current = std::fs::read(&cert).map_err(SeedError::io(&cert))?;
    if let Some((dns, ips)) = sans(&current) {
        if spec.dns_names.iter().all(|d| dns.contains(d))
            && spec.ips.iter().all(|i| ips.contains(i))
        {
            return Ok(());
        }
    }
    let ca = pki.ca();
    let (ca_cert, ca_key) = (pki.read_pem(&ca.cert)?, pki.read_pem(&ca.key)?);
    let (cert_pem, key_pem) = crate::pki::issue(&ca_cert, &ca_key, spec)?;
    write_private(&key, key_pem.as_bytes())?;
    write_private(&cert, cert_pem.as_bytes())
}

/// The DNS names and IP addresses a PEM certificate is valid for.
fn sans(pem: &[u8]) -> Option<(Vec<String>, Vec<IpAddr>)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, cert) = X509Certificate::from_der(&pem.contents).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    for name in &san.value.general_names {
        match name {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(raw) => match raw.len() {
                4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*raw).ok()?)),
                16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*raw).ok()?)),
                _ => {}
            },
            _ => {}
        }
    }
    Some((dns, ips))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_certificates_get_in_cluster_names_and_stay_stable() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path());
        let spec = ControlPlaneSpec::new("alpha");
        pki.ensure("alpha", &spec.endpoint).unwrap();
        let dns = render::etcd_dns_names("shoot--demo--alpha");
        let leaf = LeafSpec {
            common_name: "etcd-server",
            organizations: &[],
            ips: vec![
                IpAddr::V4(spec.endpoint.address),
                IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            ],
            dns_names: dns.clone(),
            server: true,
            client: true,
        };
        ensure_serving(&pki, "etcd-server", &leaf).unwrap();
        let first = std::fs::read(dir.path().join("etcd-server.crt")).unwrap();
        let (names, _) = sans(&first).unwrap();
        assert!(dns.iter().all(|d| names.contains(d)), "{names:?}");
        // Pki::ensure accepts it (same CA, covers the endpoint), and a second pass keeps it.
        pki.ensure("alpha", &spec.endpoint).unwrap();
        ensure_serving(&pki, "etcd-server", &leaf).unwrap();
        assert_eq!(
            first,
            std::fs::read(dir.path().join("etcd-server.crt")).unwrap()
        );
    }

    #[test]
    fn the_renewed_leaves_are_those_whose_certificate_changed() {
        let file = |name: &str, bytes: &[u8]| (name.to_string(), bytes.to_vec());
        let before: BTreeMap<String, Vec<u8>> = [
            file("kube-scheduler.crt", b"old"),
            file("kube-scheduler.key", b"old key"),
            file("kube-apiserver.crt", b"same"),
            file("kube-scheduler.kubeconfig", b"old"),
        ]
        .into();
        let mut after = before.clone();
        after.insert("kube-scheduler.crt".into(), b"new".to_vec());
        after.insert("kube-scheduler.key".into(), b"new key".to_vec());
        after.insert("etcd-peer.crt".into(), b"added".to_vec());
        assert_eq!(
            changed_leaves(&before, &after),
            vec![Leaf::EtcdPeer, Leaf::Scheduler]
        );
        assert_eq!(changed_leaves(&after, &after), vec![]);
    }
}
