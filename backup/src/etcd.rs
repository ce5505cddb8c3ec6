//! etcd: client connections (TLS), `etcdutl snapshot restore`, and the
//! temporary etcd a restore replays deltas into ([`TempEtcd`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};

use crate::config::EtcdConfig;
use crate::error::{io_at, missing_binary};
use crate::{BackupError, Result};

/// Unary etcd calls that take longer than this fail (and are retried by the loop).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects to etcd with TLS when the endpoints are https.
pub async fn connect(cfg: &EtcdConfig) -> Result<Client> {
    cfg.validate("etcd")?;
    let endpoint = cfg.endpoints.join(",");
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| BackupError::config("etcd", format!("reading {}: {e}", p.display())))
    };
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
    if cfg.endpoints.iter().any(|e| e.starts_with("https://")) {
        let mut tls = etcd_client::TlsOptions::new();
        if let Some(ca) = &cfg.ca_file {
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&cfg.cert_file, &cfg.key_file) {
            tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        let host = cfg.server_name.clone().unwrap_or_else(|| {
            cfg.endpoints[0]
                .trim_start_matches("https://")
                .rsplit_once(':')
                .map_or(String::new(), |(h, _)| {
                    h.trim_matches(['[', ']']).to_string()
                })
        });
        tls = tls.domain_name(host);
        options = options.with_tls(tls);
    }
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        Client::connect(cfg.endpoints.clone(), Some(options)),
    )
    .await
    .map_err(|_| BackupError::Etcd {
        endpoint: endpoint.clone(),
        message: "connecting timed out after 10s".into(),
    })?
    .map_err(|e| BackupError::Etcd {
        endpoint,
        message: e.to_string(),
    })?;
    Ok(client)
}

/// An etcd error of `endpoint` while doing `what`.
pub fn err(endpoint: &str, what: &str, e: impl std::fmt::Display) -> BackupError {
    BackupError::Etcd {
        endpoint: endpoint.to_string(),
        message: format!("{what}: {e}"),
    }
}

/// Runs a unary etcd call with [`CALL_TIMEOUT`].
pub async fn call<T>(
    endpoint: &str,
    what: &str,
    f: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(err(endpoint, what, e)),
        Err(_) => Err(err(
            endpoint,
            what,
            format!("no answer within {CALL_TIMEOUT:?}"),
        )),
    }
}

/// What etcd's status says.
#[derive(Debug, Clone)]
pub struct Status {
    pub revision: i64,
    pub version: String,
    pub cluster_id: u64,
    pub db_size: i64,
}

/// etcd's current revision, version and cluster id.
pub async fn status(client: &mut Client, endpoint: &str) -> Result<Status> {
    let s = call(endpoint, "status", client.status()).await?;
    let h = s.header();
    Ok(Status {
        revision: h.map_or(0, |h| h.revision()),
        version: s.version().to_string(),
        cluster_id: h.map_or(0, |h| h.cluster_id()),
        db_size: s.db_size(),
    })
}

/// Keys in etcd at `revision` (0: now).
pub async fn key_count(client: &mut Client, endpoint: &str, revision: i64) -> Result<i64> {
    let mut opts = GetOptions::new().with_all_keys().with_count_only();
    if revision > 0 {
        opts = opts.with_revision(revision);
    }
    let what = "counting keys";
    match tokio::time::timeout(CALL_TIMEOUT, client.get(vec![0u8], Some(opts))).await {
        Ok(Ok(r)) => Ok(r.count()),
        Ok(Err(e)) if is_compacted(&e) => Err(BackupError::Compacted {
            requested: revision,
            compacted: 0,
        }),
        Ok(Err(e)) => Err(err(endpoint, what, e)),
        Err(_) => Err(err(
            endpoint,
            what,
            format!("no answer within {CALL_TIMEOUT:?}"),
        )),
    }
}

/// Whether etcd refused a read because the revision is compacted: etcd
/// answers such a Range with gRPC code `OutOfRange` (`ErrGRPCCompacted`).
/// etcd uses the same code for a future revision (`ErrGRPCFutureRev`); Ring
/// only reads at revisions etcd already reported, so for its reads the code
/// alone decides (the message text is never read).
pub fn is_compacted(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::OutOfRange)
}

/// `HashKV` at `revision`.
pub async fn hash_kv(
    client: &mut Client,
    endpoint: &str,
    revision: i64,
) -> Result<crate::codec::HashKv> {
    let r = call(
        endpoint,
        &format!("HashKV at {revision}"),
        client.hash_kv(revision),
    )
    .await?;
    Ok(crate::codec::HashKv {
        revision,
        hash: r.hash(),
        compact_revision: r.compact_version(),
    })
}

/// Finds a program the way seeds do (`--bin-dir`, `RING_BIN_DIR`, the setup
/// cache, `PATH`); a missing one names `scripts/setup`.
pub fn find_binary(name: &str, bin_dir: Option<&Path>) -> Result<PathBuf> {
    seed::BinarySearch::standard(bin_dir)
        .find(name)
        .map_err(|e| missing_binary(e, name))
}

/// How the restored member is named (it must match how its etcd is started).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    pub name: String,
    pub peer_url: String,
    pub cluster_token: String,
}

impl Member {
    /// The member a local seed starts for `spec`.
    pub fn for_shoot(spec: &seed::ControlPlaneSpec) -> Self {
        Member {
            name: spec.shoot.clone(),
            peer_url: spec.endpoint.etcd_peer_url(),
            cluster_token: format!("ring-{}", spec.shoot),
        }
    }
}

/// `etcdutl snapshot restore` of `snapshot` into the fresh `data_dir`, a
/// one-member cluster of `member`.
///
/// etcdutl does not hash the snapshot again (`--skip-hash-check`: seconds
/// for a large snapshot on a machine without SHA instructions): the caller
/// has checked it, its object's SHA-256 and etcd's own hash at its end,
/// while it downloaded it (`restore::download::download_full`).
///
/// The revision is not bumped (`--bump-revision`, `--mark-compacted`): the
/// deltas replayed next must get their recorded revisions, which the replay
/// and its verification (revision, key count, `HashKV` at recorded
/// revisions) check one by one; a bump here would shift them all.
pub async fn restore_snapshot(
    etcdutl: &Path,
    snapshot: &Path,
    data_dir: &Path,
    member: &Member,
) -> Result<()> {
    let out = tokio::process::Command::new(etcdutl)
        .arg("snapshot")
        .arg("restore")
        .arg(snapshot)
        .arg(format!("--name={}", member.name))
        .arg(format!("--data-dir={}", data_dir.display()))
        .arg(format!(
            "--initial-cluster={}={}",
            member.name, member.peer_url
        ))
        .arg(format!("--initial-cluster-token={}", member.cluster_token))
        .arg(format!("--initial-advertise-peer-urls={}", member.peer_url))
        .arg("--skip-hash-check")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(io_at("running", etcdutl))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(BackupError::Tool {
            program: "etcdutl snapshot restore".into(),
            message: reason(&stderr).unwrap_or_else(|| stderr.trim().to_string()),
        });
    }
    Ok(())
}

/// Why an etcd program gave up, from what it wrote (etcd's JSON log, or
/// etcdutl's console log and its `Error:` line): the last error it returned,
/// else its last fatal or panic entry with that entry's error. `None` when
/// it wrote neither. A panic's stack trace, the bulk of such output, says
/// where and not why.
pub fn reason(output: &str) -> Option<String> {
    let lines: Vec<&str> = output.lines().collect();
    if let Some(err) = lines.iter().rev().find_map(|l| l.strip_prefix("Error: ")) {
        return Some(err.trim().to_string());
    }
    lines.iter().rev().find_map(|l| fatal_entry(l))
}

/// A fatal or panic entry of etcd's log (`{"level":"fatal","msg":...}`) or of
/// etcdutl's (tab-separated: time, level, the logger's name if it has one,
/// caller, message, fields as JSON): its message and the fields that say why.
fn fatal_entry(line: &str) -> Option<String> {
    let is_fatal = |level: &str| level == "fatal" || level == "panic";
    let (msg, fields) = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) if v["level"].as_str().is_some_and(is_fatal) => (v["msg"].as_str()?.to_string(), v),
        Ok(_) => return None,
        Err(_) => {
            let parts: Vec<&str> = line.split('\t').collect();
            if !parts.get(1).is_some_and(|l| is_fatal(l)) {
                return None;
            }
            // the caller is the first column after the level naming a Go file
            let caller = 2 + parts[2..].iter().position(|p| p.contains(".go:"))?;
            let fields = parts
                .get(caller + 2)
                .and_then(|f| serde_json::from_str(f).ok())
                .unwrap_or(serde_json::Value::Null);
            (parts.get(caller + 1)?.to_string(), fields)
        }
    };
    let why: Vec<&str> = ["error", "panic"]
        .iter()
        .filter_map(|k| fields[*k].as_str())
        .collect();
    Some(match why[..] {
        [] => msg,
        _ => format!("{msg}: {}", why.join(": ")),
    })
}

/// A free TCP port on 127.0.0.1 (the kernel's choice).
pub fn free_port() -> Result<u16> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct free TCP ports on 127.0.0.1: all bound at once, then released
/// (one at a time, the kernel may hand out the same port twice).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .map_err(crate::error::io("finding free ports"))
        })
        .collect::<Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(crate::error::io("finding free ports"))
        })
        .collect()
}

/// The flags of a single-member etcd (a new one, or one on existing data),
/// logging to stderr; an 8 GiB quota so large databases fit.
pub fn single_member_args(
    name: &str,
    data_dir: &Path,
    client_url: &str,
    peer_url: &str,
) -> Vec<String> {
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={name}={peer_url}"),
        "--quota-backend-bytes=8589934592".into(),
        "--logger=zap".into(),
        "--log-outputs=stderr".into(),
    ]
}

/// Flushes every file and directory under `dir` to disk (after an etcd
/// that did not fsync has stopped).
pub fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        } else {
            std::fs::File::open(entry.path())?.sync_all()?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Whether etcd refused a lease grant because the lease id exists already
/// (gRPC `FailedPrecondition`, `ErrGRPCLeaseExist`): a replay that granted it
/// before, which is fine.
pub fn is_lease_taken(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::FailedPrecondition)
}

#[path = "etcd_temp.rs"]
mod temp;
pub use temp::TempEtcd;

#[cfg(test)]
#[path = "etcd_tests.rs"]
mod tests;
