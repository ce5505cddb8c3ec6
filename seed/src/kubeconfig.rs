//! Kubeconfig files for a shoot's clients, with the certificates embedded so a
//! kubeconfig keeps working wherever it is copied and wherever the control plane moves.

use std::path::Path;

use base64::Engine;
use serde::Serialize;

use crate::error::Result;
use crate::pki::{write_private, CertPair, Pki};

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig<'a> {
    api_version: &'a str,
    kind: &'a str,
    clusters: Vec<Named<ClusterEntry>>,
    users: Vec<Named<UserEntry>>,
    contexts: Vec<Named<ContextEntry<'a>>>,
    current_context: &'a str,
}

#[derive(Serialize)]
struct Named<T> {
    name: String,
    #[serde(flatten)]
    value: T,
}

#[derive(Serialize)]
struct ClusterEntry {
    cluster: Cluster,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority_data: String,
}

#[derive(Serialize)]
struct UserEntry {
    user: User,
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct User {
    client_certificate_data: String,
    client_key_data: String,
}

#[derive(Serialize)]
struct ContextEntry<'a> {
    context: Context<'a>,
}

#[derive(Serialize)]
struct Context<'a> {
    cluster: &'a str,
    user: &'a str,
}

/// Writes (mode 0600) a kubeconfig for `server` that authenticates with `client`.
pub fn write(
    path: &Path,
    shoot: &str,
    user: &str,
    server: &str,
    pki: &Pki,
    client: &CertPair,
) -> Result<()> {
    let ca = pki.read_pem(&pki.ca().cert)?;
    let pair = (pki.read_pem(&client.cert)?, pki.read_pem(&client.key)?);
    write_pem(
        path,
        (shoot, user, server),
        ca.as_bytes(),
        (pair.0.as_bytes(), pair.1.as_bytes()),
    )
}

/// Like [`write`], from the CA certificate and the client pair as PEM bytes
/// (`who`: shoot, user, server).
pub fn write_pem(
    path: &Path,
    (shoot, user, server): (&str, &str, &str),
    ca: &[u8],
    (cert, key): (&[u8], &[u8]),
) -> Result<()> {
    let b64 = |pem: &[u8]| base64::engine::general_purpose::STANDARD.encode(pem);
    let user_name = format!("{shoot}-{user}");
    let doc = Kubeconfig {
        api_version: "v1",
        kind: "Config",
        clusters: vec![Named {
            name: shoot.to_string(),
            value: ClusterEntry {
                cluster: Cluster {
                    server: server.to_string(),
                    certificate_authority_data: b64(ca),
                },
            },
        }],
        users: vec![Named {
            name: user_name.clone(),
            value: UserEntry {
                user: User {
                    client_certificate_data: b64(cert),
                    client_key_data: b64(key),
                },
            },
        }],
        contexts: vec![Named {
            name: shoot.to_string(),
            value: ContextEntry {
                context: Context {
                    cluster: shoot,
                    user: &user_name,
                },
            },
        }],
        current_context: shoot,
    };
    let text = serde_yaml::to_string(&doc).map_err(|e| crate::SeedError::InvalidSpec {
        field: "kubeconfig".into(),
        reason: e.to_string(),
    })?;
    // written again at every health check: the same kubeconfig is left as
    // it is (an fsync per shoot and second otherwise, next to etcd's)
    if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(());
    }
    write_private(path, text.as_bytes())
}

/// A `kube` client authenticated by the kubeconfig at `path`.
pub async fn client(shoot: &str, path: &Path) -> Result<kube::Client> {
    client_at(shoot, path, None).await
}

/// A `kube` client authenticated by the kubeconfig at `path`, reaching
/// `server` instead of the kubeconfig's if given (a warm kube-apiserver
/// on a port of its own, say).
pub async fn client_at(shoot: &str, path: &Path, server: Option<&str>) -> Result<kube::Client> {
    let kube_err = |message: String| crate::SeedError::Kube {
        shoot: shoot.to_string(),
        message,
    };
    let mut kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| kube_err(format!("reading kubeconfig {}: {e}", path.display())))?;
    if let Some(server) = server {
        for c in kc.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
            c.server = Some(server.to_string());
        }
    }
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| kube_err(format!("kubeconfig {}: {e}", path.display())))?;
    kube::Client::try_from(config).map_err(|e| kube_err(e.to_string()))
}

/// Asks the kube-apiserver behind the kubeconfig at `path` for `/readyz` (5 s bound).
/// `Ok(Health)` whatever the answer; the detail says what came back or why nothing did.
pub async fn readyz(shoot: &str, path: &Path) -> Result<crate::Health> {
    readyz_at(shoot, path, None).await
}

/// [`readyz`] of the kube-apiserver at `server` (if given) with the
/// credentials of the kubeconfig at `path`.
pub async fn readyz_at(shoot: &str, path: &Path, server: Option<&str>) -> Result<crate::Health> {
    readyz_within(shoot, path, server, READYZ_TIMEOUT).await
}

/// How long [`readyz`] waits for an answer.
pub const READYZ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// [`readyz_at`] that gives up after `timeout`: a kube-apiserver that listens
/// but does not serve yet (it opens its port seconds before it serves)
/// leaves the request hanging.
pub async fn readyz_within(
    shoot: &str,
    path: &Path,
    server: Option<&str>,
    timeout: std::time::Duration,
) -> Result<crate::Health> {
    let client = client_at(shoot, path, server).await?;
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| crate::SeedError::Kube {
            shoot: shoot.to_string(),
            message: e.to_string(),
        })?;
    let answer = tokio::time::timeout(timeout, client.request_text(req)).await;
    let mut health = match answer {
        Ok(Ok(text)) => crate::Health {
            ready: text.trim() == "ok",
            detail: text.trim().to_string(),
            ..Default::default()
        },
        Ok(Err(e)) => crate::Health {
            ready: false,
            detail: e.to_string(),
            ..Default::default()
        },
        Err(_) => crate::Health {
            ready: false,
            detail: format!("/readyz did not answer within {:?}", timeout),
            ..Default::default()
        },
    };
    if health.ready {
        // a ready API answers at once; one that does not is reported without
        let version = tokio::time::timeout(timeout, client.apiserver_version()).await;
        health.versions.kubernetes = version.ok().and_then(Result::ok).map(|v| v.git_version);
    }
    Ok(health)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Leaf;

    /// Writing the same kubeconfig again leaves the file alone (same inode:
    /// no new file renamed over it); a different server writes it anew.
    #[test]
    fn an_unchanged_kubeconfig_is_not_written_again() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new(dir.path().join("pki"));
        let endpoint = crate::ShootEndpoint::on(std::net::Ipv4Addr::new(127, 20, 0, 1));
        pki.ensure("alpha", &endpoint).unwrap();
        let path = dir.path().join("admin.kubeconfig");
        let admin = pki.leaf(Leaf::Admin);
        let write = |server: &str| write(&path, "alpha", "admin", server, &pki, &admin).unwrap();
        let inode = || std::fs::metadata(&path).unwrap().ino();
        write("https://127.20.0.1:6443");
        let first = inode();
        write("https://127.20.0.1:6443");
        assert_eq!(inode(), first, "the same kubeconfig was written again");
        write("https://127.20.0.2:6443");
        assert_ne!(inode(), first);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("https://127.20.0.2:6443"), "{text}");
    }
}
