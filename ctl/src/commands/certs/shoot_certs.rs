//! `ringctl pki renew` for what is issued from a shoot's CA on this
//! machine: each shoot's published kubeconfig
//! (`<ring-dir>/kubeconfigs/<shoot>.kubeconfig`) and each node's kube-proxy
//! certificate. The CA is read where the seed hosting the shoot keeps its
//! PKI. A new kubeconfig replaces the old one only once the shoot's API
//! accepted it (the server and the CA it names stay as they were); a node
//! takes its new kube-proxy certificate by itself (`ring-node` restarts
//! kube-proxy with it) and reports it in use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;

use super::Renewed;

/// How long the shoot's API may take to answer the renewed kubeconfig.
const CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a node may take to report its new kube-proxy certificate in use
/// (it looks every 5 s once it is up, then restarts kube-proxy).
const NODE_TIMEOUT: Duration = Duration::from_secs(60);

/// Renews every shoot's published kubeconfig and every node's kube-proxy
/// certificate that `due` says (given its `notAfter`, if readable). Each
/// renewal comes with why it was not taken, if it was not (a kubeconfig the
/// shoot's API refused is kept; a node that did not report its new
/// certificate); `problems` names what could not be renewed at all (the
/// ring not answering where a shoot is hosted, an unreadable CA), and the
/// others go on.
pub(super) async fn renew(
    layout: &bootstrap::RingLayout,
    config: &bootstrap::config::RingConfig,
    due: impl Fn(Option<i64>) -> bool,
    problems: &mut Vec<String>,
) -> anyhow::Result<Vec<(Renewed, Option<String>)>> {
    let shoots: Vec<(String, PathBuf)> = config
        .members
        .iter()
        .map(|m| (m.name.clone(), layout.kubeconfig(&m.name)))
        .filter(|(_, path)| path.exists())
        .filter(|(_, path)| due(seed::expiry::kubeconfig_client_not_after(path).ok()))
        .collect();
    let nodes: Vec<(String, String, seed::pki::CertPair)> = bootstrap::nodes::node_names(config)
        .into_iter()
        .filter_map(|node| {
            let shoot = bootstrap::nodes::shoot_of(config, &node)?;
            let pair = bootstrap::nodes::node_config(layout, &node)?
                .layout()
                .proxy_cert();
            Some((node, shoot, pair))
        })
        .filter(|(_, _, pair)| pair.cert.exists())
        .filter(|(_, _, pair)| due(seed::expiry::not_after_file(&pair.cert).ok()))
        .collect();
    if shoots.is_empty() && nodes.is_empty() {
        return Ok(Vec::new());
    }
    let status = match bootstrap::ring_status(layout, config).await {
        Ok(status) => status,
        Err(e) => {
            problems.push(format!(
                "no kubeconfig or kube-proxy certificate renewed: the ring did not say where each shoot is hosted (its CA is kept there): {e}"
            ));
            return Ok(Vec::new());
        }
    };
    let ca = |shoot: &str| -> anyhow::Result<(String, String)> {
        let host = status
            .placements
            .iter()
            .find(|p| p.shoot == shoot)
            .map(|p| p.host.clone())
            .ok_or_else(|| anyhow::anyhow!("the ring places no control plane of shoot {shoot}"))?;
        shoot_ca(
            shoot,
            &bootstrap::nodes::shoot_pki_dir(layout, shoot, &host),
        )
    };
    let mut out = Vec::new();
    for (shoot, path) in shoots {
        match ca(&shoot) {
            Ok(ca) => out.push(renew_one(&shoot, &path, &ca).await?),
            Err(e) => problems.push(format!("kubeconfig {shoot} not renewed: {e}")),
        }
    }
    for (node, shoot, pair) in nodes {
        match ca(&shoot) {
            Ok(ca) => out.push(renew_proxy(layout, &node, &pair, &ca).await?),
            Err(e) => problems.push(format!(
                "node {node}'s kube-proxy certificate not renewed: {e}"
            )),
        }
    }
    Ok(out)
}

/// The shoot's CA (certificate and key PEM) from `ca_dir`.
fn shoot_ca(shoot: &str, ca_dir: &Path) -> anyhow::Result<(String, String)> {
    let read = |f: &str| {
        let p = ca_dir.join(f);
        std::fs::read_to_string(&p).map_err(|e| {
            anyhow::anyhow!(
                "reading shoot {shoot}'s CA {} (kept by the seed hosting it): {e}",
                p.display()
            )
        })
    };
    Ok((read("ca.crt")?, read("ca.key")?))
}

/// Issues node `node`'s kube-proxy certificate anew (key first, then the
/// certificate: the node takes a pair only once both belong together) and
/// waits until the node reports it in use.
async fn renew_proxy(
    layout: &bootstrap::RingLayout,
    node: &str,
    pair: &seed::pki::CertPair,
    (ca_cert, ca_key): &(String, String),
) -> anyhow::Result<(Renewed, Option<String>)> {
    let old = seed::expiry::not_after_file(&pair.cert).ok();
    let (cert, key) = seed::pki::issue(ca_cert, ca_key, &seed::node::config::proxy_identity())?;
    replace_pair(pair, &cert, &key)?;
    let mut r = issued(&format!("node {node} kube-proxy"), old, &cert)?;
    let why_not = node_took(layout, node, &r.serial).await.err();
    r.in_use = why_not.is_none();
    Ok((r, why_not))
}

/// Writes both new files next to the old ones, then renames the key and
/// right after it the certificate over them: a node never reads a pair
/// whose key is new and whose certificate is old for longer than between
/// two renames (and takes none that does not belong together).
fn replace_pair(pair: &seed::pki::CertPair, cert: &str, key: &str) -> anyhow::Result<()> {
    let next = |p: &Path| {
        let name = p
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        p.with_file_name(format!(".{name}.renewed"))
    };
    let (next_cert, next_key) = (next(&pair.cert), next(&pair.key));
    seed::pki::write_private(&next_key, key.as_bytes())?;
    seed::pki::write_private(&next_cert, cert.as_bytes())?;
    let rename = |from: &Path, to: &Path| {
        std::fs::rename(from, to).map_err(|e| anyhow::anyhow!("replacing {}: {e}", to.display()))
    };
    rename(&next_key, &pair.key)?;
    rename(&next_cert, &pair.cert)
}

/// What a renewal of `name` reports about the new certificate `cert` (PEM),
/// not yet in use.
fn issued(name: &str, old: Option<i64>, cert: &str) -> anyhow::Result<Renewed> {
    let info = seed::expiry::infos_pem(cert.as_bytes())
        .map_err(|e| anyhow::anyhow!("the new certificate of {name} {e}"))?
        .remove(0); // infos_pem returns at least one
    Ok(Renewed {
        name: name.to_string(),
        old_not_after_unix: old,
        new_not_after_unix: info.not_after,
        serial: info.serial,
        in_use: false,
    })
}

/// Waits (bounded) until node `node` reports the kube-proxy certificate
/// `serial` in use.
async fn node_took(layout: &bootstrap::RingLayout, node: &str, serial: &str) -> Result<(), String> {
    if bootstrap::nodes::running_pid(layout, node).is_none() {
        return Err(format!(
            "node {node} is not running; it takes its new kube-proxy certificate when it starts"
        ));
    }
    let deadline = tokio::time::Instant::now() + NODE_TIMEOUT;
    loop {
        let status = bootstrap::nodes::status(layout, node);
        if status.and_then(|s| s.proxy_certificate_serial).as_deref() == Some(serial) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "node {node} did not report its new kube-proxy certificate in use within {NODE_TIMEOUT:?} (see its ring-node.log)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Issues, writes next to the old one, checks against the shoot's API, and
/// replaces (or removes the new file and says why not).
async fn renew_one(
    shoot: &str,
    path: &Path,
    (ca_cert, ca_key): &(String, String),
) -> anyhow::Result<(Renewed, Option<String>)> {
    let old = seed::expiry::kubeconfig_client_not_after(path).ok();
    let endpoint = seed::ShootEndpoint::for_shoot(shoot);
    let (cert, key) = seed::pki::issue(ca_cert, ca_key, &seed::pki::Leaf::Admin.spec(&endpoint))?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let renewed =
        with_client(&text, &cert, &key).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let name = path.file_name().map_or_else(
        || format!("{shoot}.kubeconfig"),
        |n| n.to_string_lossy().into_owned(),
    );
    let candidate = path.with_file_name(format!(".{name}.renewed"));
    seed::pki::write_private(&candidate, renewed.as_bytes())?;
    let why_not = accepted(shoot, &candidate).await.err();
    let why_not = match why_not {
        None => std::fs::rename(&candidate, path)
            .err()
            .map(|e| format!("replacing {}: {e}", path.display())),
        refused => refused,
    };
    if why_not.is_some() {
        let _ = std::fs::remove_file(&candidate);
    }
    let mut r = issued(&format!("kubeconfig {shoot}"), old, &cert)?;
    r.in_use = why_not.is_none();
    Ok((r, why_not))
}

/// `kubeconfig` (YAML) with every user's client certificate and key
/// replaced by `cert` and `key` (PEM); everything else as it was.
fn with_client(kubeconfig: &str, cert: &str, key: &str) -> Result<String, String> {
    let mut doc: serde_yaml::Value =
        serde_yaml::from_str(kubeconfig).map_err(|e| format!("not a kubeconfig: {e}"))?;
    let users = doc
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .filter(|u| !u.is_empty())
        .ok_or("it names no user")?;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    for u in users {
        let user = u
            .get_mut("user")
            .and_then(|u| u.as_mapping_mut())
            .ok_or("a user without credentials")?;
        user.insert("client-certificate-data".into(), b64(cert).into());
        user.insert("client-key-data".into(), b64(key).into());
    }
    serde_yaml::to_string(&doc).map_err(|e| e.to_string())
}

/// Whether the shoot's API answers a request authenticated and authorized
/// by `kubeconfig` (listing namespaces).
async fn accepted(shoot: &str, kubeconfig: &Path) -> Result<(), String> {
    let ask = async {
        let client = seed::kubeconfig::client(shoot, kubeconfig)
            .await
            .map_err(|e| e.to_string())?;
        // an authorized request (`/version` answers anyone)
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
        let one = kube::api::ListParams::default().limit(1);
        namespaces
            .list(&one)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(CHECK_TIMEOUT, ask).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("shoot {shoot}'s API refused the renewed kubeconfig: {e}")),
        Err(_) => Err(format!(
            "shoot {shoot}'s API did not answer within {CHECK_TIMEOUT:?}; the old kubeconfig is kept"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the credentials change: the server, the CA and the names stay.
    #[test]
    fn a_renewed_kubeconfig_keeps_its_server_and_ca() {
        let old = "apiVersion: v1\nkind: Config\nclusters:\n- name: m1\n  cluster:\n    server: https://127.1.2.3:6443\n    certificate-authority-data: Q0E=\nusers:\n- name: m1-admin\n  user:\n    client-certificate-data: T0xE\n    client-key-data: T0xES0VZ\ncontexts:\n- name: m1\n  context: {cluster: m1, user: m1-admin}\ncurrent-context: m1\n";
        let new = with_client(old, "NEWCERT", "NEWKEY").unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&new).unwrap();
        let user = &doc["users"][0]["user"];
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            user["client-certificate-data"].as_str(),
            Some(b64("NEWCERT").as_str())
        );
        assert_eq!(
            user["client-key-data"].as_str(),
            Some(b64("NEWKEY").as_str())
        );
        let cluster = &doc["clusters"][0]["cluster"];
        assert_eq!(cluster["server"].as_str(), Some("https://127.1.2.3:6443"));
        assert_eq!(cluster["certificate-authority-data"].as_str(), Some("Q0E="));
        assert_eq!(doc["current-context"].as_str(), Some("m1"));
        assert!(with_client("users: []\n", "c", "k")
            .unwrap_err()
            .contains("no user"));
        assert!(with_client(": :\n", "c", "k")
            .unwrap_err()
            .contains("not a kubeconfig"));
    }
}
