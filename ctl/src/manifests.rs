//! `ringctl manifests`: Kubernetes manifests that run each member's ringd in its
//! own cluster (rendering: `seed::kubernetes::manifests`).

use std::net::SocketAddr;
#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;

use anyhow::Context;
use bootstrap::config::SeedSpec;
use bootstrap::RingConfig;
use clap::Args;
use ringd::config::{MemberConfig, RingdConfig, SeedConfig, TlsFiles, API_VERSION};
use seed::kubernetes::manifests::{
    Manifests, Member, BUCKET_KEY_FILE, BUCKET_KEY_SECRET, DATA_DIR, TLS_DIR,
};
use seed::kubernetes::render::to_yaml;
use seed::KubernetesSeedConfig;

#[derive(Args)]
pub struct ManifestsArgs {
    /// The Ring config (kind: Ring).
    #[arg(long = "ring-config")]
    ring_config: PathBuf,
    /// ringd's container image (built from this repository).
    #[arg(long, default_value = concat!("ring/ringd:", env!("CARGO_PKG_VERSION")))]
    image: String,
    /// The namespace ringd runs in.
    #[arg(long, default_value = "ring-system")]
    namespace: String,
    /// Size of each ringd's data volume.
    #[arg(long, default_value = "1Gi")]
    storage: String,
    /// Where members reach a member's ringd, as NAME=IP:PORT (its load balancer address;
    /// repeatable) [default: from the Ring config's ports].
    #[arg(long = "member-address", value_parser = parse_member_address)]
    member_addresses: Vec<(String, SocketAddr)>,
    /// Only this member's manifests.
    #[arg(long)]
    member: Option<String>,
}

fn parse_member_address(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=IP:PORT"))?;
    let addr = addr
        .parse()
        .map_err(|e| format!("{addr:?} is not IP:PORT ({e})"))?;
    Ok((name.to_string(), addr))
}

/// The manifests of every member (or only `--member`), as one YAML stream.
pub fn render(args: &ManifestsArgs) -> anyhow::Result<String> {
    let ring = read_ring(args)?;
    let addresses = (0..ring.members.len())
        .map(|i| member_address(args, &ring, i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let members: Vec<MemberConfig> = ring
        .members
        .iter()
        .zip(&addresses)
        .enumerate()
        .map(|(i, (m, address))| MemberConfig {
            name: m.name.clone(),
            id: i as u64 + 1,
            address: address.to_string(),
        })
        .collect();
    let manifests = Manifests {
        ring: ring.name.clone(),
        namespace: args.namespace.clone(),
        image: args.image.clone(),
        storage: args.storage.clone(),
    };
    let mut out = String::new();
    for (i, m) in ring.members.iter().enumerate() {
        if args.member.as_ref().is_some_and(|only| only != &m.name) {
            continue;
        }
        let member = member(&ring, &members, i, addresses[i].port())?;
        let objects = manifests
            .member(&member)
            .map_err(|e| anyhow::anyhow!("rendering member {}: {e}", m.name))?;
        out.push_str(&format!(
            "# member {name}: {target}\n# needs Secret {ns}/ringd-{name}-tls with ca.crt, tls.crt, tls.key (ringctl pki init --member {name}=IP)\n",
            name = m.name,
            target = apply_hint(&m.seed),
            ns = args.namespace
        ));
        if member.bucket_key {
            out.push_str(&format!(
                "# needs Secret {ns}/{BUCKET_KEY_SECRET} with key, the ring's bucket key \
                 (kubectl create secret generic {BUCKET_KEY_SECRET} --namespace {ns} --from-file=key=YOUR-KEY-FILE)\n",
                ns = args.namespace
            ));
        }
        out.push_str(&to_yaml(&objects));
    }
    Ok(out)
}

/// The Ring config of `--ring-config`, checked against `--member-address` and `--member`.
fn read_ring(args: &ManifestsArgs) -> anyhow::Result<RingConfig> {
    let path = &args.ring_config;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let ring = RingConfig::parse(&text, &path.display().to_string())?;
    for (name, _) in &args.member_addresses {
        anyhow::ensure!(
            ring.members.iter().any(|m| &m.name == name),
            "--member-address names {name:?}, which is not a member of ring {}",
            ring.name
        );
    }
    if let Some(only) = &args.member {
        anyhow::ensure!(
            ring.members.iter().any(|m| &m.name == only),
            "--member {only:?} is not a member of ring {}",
            ring.name
        );
    }
    Ok(ring)
}

/// Where members reach member `i`: its `--member-address`, else from the Ring config's ports.
fn member_address(args: &ManifestsArgs, ring: &RingConfig, i: usize) -> anyhow::Result<SocketAddr> {
    let name = &ring.members[i].name;
    match args.member_addresses.iter().find(|(n, _)| n == name) {
        Some((_, a)) => Ok(*a),
        None => ring
            .member_address(i)
            .parse()
            .with_context(|| format!("address of member {name}")),
    }
}

/// Member `i` as the manifests see it: its validated ringd config, ports, and
/// the shoots it may host (every other member's).
fn member(
    ring: &RingConfig,
    members: &[MemberConfig],
    i: usize,
    port: u16,
) -> anyhow::Result<Member<RingdConfig>> {
    let name = &ring.members[i].name;
    let metrics_port: u16 = ring
        .metrics_address(i)
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("metrics port")?;
    let config = ringd_config(ring, members, i, port, metrics_port);
    // the Secret is mounted exactly when ringd's config reads the key from it
    let bucket_key = config
        .backup
        .as_ref()
        .is_some_and(|b| b.encryption.is_some());
    config
        .validate()
        .with_context(|| format!("ringd config of member {name}"))?;
    Ok(Member {
        name: name.clone(),
        config,
        port,
        metrics_port: Some(metrics_port),
        hosts: ring
            .members
            .iter()
            .filter(|o| &o.name != name)
            .map(|o| o.name.clone())
            .collect(),
        bucket_key,
    })
}

/// Member `i`'s ringd config in its own cluster: files in the pod's volumes,
/// control planes hosted there with its service account.
fn ringd_config(
    ring: &RingConfig,
    members: &[MemberConfig],
    i: usize,
    port: u16,
    metrics_port: u16,
) -> RingdConfig {
    RingdConfig {
        api_version: API_VERSION.into(),
        kind: "RingMember".into(),
        name: ring.members[i].name.clone(),
        id: members[i].id,
        listen: format!("0.0.0.0:{port}"),
        metrics_listen: Some(format!("0.0.0.0:{metrics_port}")),
        data_dir: format!("{DATA_DIR}/data").into(),
        tls: TlsFiles {
            ca: format!("{TLS_DIR}/ca.crt").into(),
            cert: format!("{TLS_DIR}/tls.crt").into(),
            key: format!("{TLS_DIR}/tls.key").into(),
        },
        members: members.to_vec(),
        join: false,
        timing: ring.timing(),
        // In its own cluster, ringd hosts control planes there with its service account.
        seed: Some(SeedConfig {
            state_dir: format!("{DATA_DIR}/seed").into(),
            bin_dir: None,
            kubernetes: Some(KubernetesSeedConfig::new(&ring.name)),
            release_grace_secs: ringd::config::default_release_grace_secs(),
            certificate_check_secs: ringd::config::default_certificate_check_secs(),
            api_advertise: Default::default(),
            deprecated_apis: ring.deprecated_apis,
        }),
        backup: ring
            .bucket
            .as_ref()
            .map(|url| ringd::config::BackupSection {
                bucket: backup::BucketConfig::url(url.clone()),
                // the key itself stays out of the manifests: ringd reads it
                // from the Secret they mount
                encryption: ring.bucket_encryption.as_ref().map(|e| {
                    backup::config::EncryptionConfig {
                        key_file: Some(BUCKET_KEY_FILE.into()),
                        key_env: None,
                        key_id: e.key_id.clone(),
                    }
                }),
            }),
        // a hot standby runs on local seeds only
        protection: Default::default(),
        initial_hosts: Default::default(),
    }
}

/// How to apply a member's manifests to its cluster.
fn apply_hint(seed: &SeedSpec) -> String {
    match seed {
        SeedSpec::Kubernetes {
            kubeconfig,
            context,
            ..
        } => format!(
            "kubectl --kubeconfig {kubeconfig}{} apply -f -",
            context
                .as_ref()
                .map(|c| format!(" --context {c}"))
                .unwrap_or_default()
        ),
        SeedSpec::Local => "kubectl apply -f - (the member's own cluster)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(extra: &str) -> RingConfig {
        let text = format!(
            "apiVersion: ring.gardener.cloud/v1alpha1\nkind: Ring\nname: demo\n\
             members: [{{name: a}}, {{name: b}}, {{name: c}}]\nbucket: s3://ring/demo\n{extra}"
        );
        RingConfig::parse(&text, "ring.yaml").unwrap()
    }

    fn members(ring: &RingConfig) -> Vec<MemberConfig> {
        (0..ring.members.len())
            .map(|i| MemberConfig {
                name: ring.members[i].name.clone(),
                id: i as u64 + 1,
                address: format!("10.0.0.{}:7001", i + 1),
            })
            .collect()
    }

    /// A ring whose bucket is sealed with a key must not get members that
    /// upload in plaintext: ringd in the pod reads the key from the Secret the
    /// manifests mount (they never contain the key itself).
    #[test]
    fn a_keyed_bucket_reaches_ringd_in_the_pod_by_a_mounted_secret() {
        let keyed = ring("bucketEncryption: {keyEnv: RING_BUCKET_KEY, keyId: k1}\n");
        let m = member(&keyed, &members(&keyed), 0, 7001).unwrap();
        let enc = m
            .config
            .backup
            .as_ref()
            .and_then(|b| b.encryption.clone())
            .expect("the bucket's key reaches ringd");
        assert_eq!(enc.key_file.as_deref(), Some(Path::new(BUCKET_KEY_FILE)));
        assert_eq!((enc.key_env, enc.key_id.as_deref()), (None, Some("k1")));
        assert!(m.bucket_key);

        let plain = ring("");
        let m = member(&plain, &members(&plain), 0, 7001).unwrap();
        assert!(m.config.backup.as_ref().unwrap().encryption.is_none());
        assert!(!m.bucket_key);
    }
}
