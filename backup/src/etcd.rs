//! etcd: client connections (TLS), `etcdctl snapshot restore`, and the
//! temporary etcd a restore replays deltas into.

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

/// `etcdctl snapshot restore` of `snapshot` into the fresh `data_dir`.
/// etcdctl does not hash the snapshot again (`--skip-hash-check`, ~2 s for
/// 600 MiB on a machine without SHA instructions): the caller has checked
/// it, its object's SHA-256 and etcd's own hash at its end, while it
/// downloaded it (`restore::download::download_full`).
pub async fn restore_snapshot(
    etcdctl: &Path,
    snapshot: &Path,
    data_dir: &Path,
    member: &Member,
) -> Result<()> {
    let out = tokio::process::Command::new(etcdctl)
        .env("ETCDCTL_API", "3")
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
        .map_err(io_at("running", etcdctl))?;
    if !out.status.success() {
        return Err(BackupError::Tool {
            program: "etcdctl snapshot restore".into(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
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

/// An etcd process on loopback ports, killed on drop and when the process
/// that started it dies (parent-death signal). It speaks only TLS with client
/// certificates, to clients and peers, from a CA made for it alone (files in
/// a private dir next to its log, removed when it stops): another local user
/// cannot read or write the restored data while it runs.
pub struct TempEtcd {
    child: Option<tokio::process::Child>,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// Its data dir.
    pub data_dir: PathBuf,
    log: PathBuf,
    tls: TempTls,
}

/// The throwaway PKI of a [`TempEtcd`].
struct TempTls {
    dir: PathBuf,
}

impl TempTls {
    /// A CA, a serving (and peer) certificate for 127.0.0.1 and a client
    /// certificate, in the private dir `dir` (made anew).
    fn create(dir: &Path) -> Result<Self> {
        let pki = |e: seed::SeedError| BackupError::config("temporary etcd TLS", e.to_string());
        let _ = std::fs::remove_dir_all(dir);
        seed::pki::create_private_dir(dir).map_err(pki)?;
        let (ca, ca_key) = seed::pki::new_ca("ring temporary etcd").map_err(pki)?;
        let leaf = |name: &str, server: bool| {
            let spec = seed::pki::LeafSpec {
                common_name: name,
                organizations: &[],
                ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
                dns_names: Vec::new(),
                server,
                client: true,
            };
            seed::pki::issue(&ca, &ca_key, &spec).map_err(pki)
        };
        let (server, server_key) = leaf("temporary etcd", true)?;
        let (client, client_key) = leaf("restore", false)?;
        let files = [
            ("ca.crt", &ca),
            ("server.crt", &server),
            ("server.key", &server_key),
            ("client.crt", &client),
            ("client.key", &client_key),
        ];
        for (name, pem) in files {
            seed::pki::write_scratch(&dir.join(name), pem.as_bytes()).map_err(pki)?;
        }
        Ok(TempTls {
            dir: dir.to_path_buf(),
        })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// etcd's flags: TLS and client certificates for clients and peers.
    fn args(&self) -> Vec<String> {
        let f = |n: &str| self.file(n).display().to_string();
        vec![
            format!("--cert-file={}", f("server.crt")),
            format!("--key-file={}", f("server.key")),
            "--client-cert-auth=true".into(),
            format!("--trusted-ca-file={}", f("ca.crt")),
            format!("--peer-cert-file={}", f("server.crt")),
            format!("--peer-key-file={}", f("server.key")),
            "--peer-client-cert-auth=true".into(),
            format!("--peer-trusted-ca-file={}", f("ca.crt")),
        ]
    }

    /// How a client reaches `url` with the client certificate.
    fn client_config(&self, url: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: vec![url.to_string()],
            ca_file: Some(self.file("ca.crt")),
            cert_file: Some(self.file("client.crt")),
            key_file: Some(self.file("client.key")),
            server_name: None,
        }
    }
}

impl Drop for TempTls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TempEtcd {
    /// Starts etcd on `data_dir` (existing data is kept; a new one gets `name`),
    /// logging to `log`, and waits until it answers.
    pub async fn start(etcd: &Path, data_dir: &Path, name: &str, log: &Path) -> Result<Self> {
        Self::start_with(etcd, data_dir, name, log, &[], &[]).await
    }

    /// [`TempEtcd::start`] for a replay: etcd does not fsync (`--unsafe-no-fsync`;
    /// a crash loses what it wrote, so [`sync_tree`] the data dir once it has
    /// stopped before anything relies on it), a transaction may carry as
    /// many operations as one recorded revision holds, and it applies a long
    /// log in small backend batches. With `snapshot_at` (the last entry of
    /// the log handed to it), etcd takes one raft snapshot once it has
    /// applied that far, if it starts from the log's first entry (the restore
    /// removed etcdctl's snapshot file): the next etcd on this data learns
    /// its membership from it and elects itself at once (restarted on a log
    /// alone, etcd 3.4 waits out a whole election timeout, 1–2 s, before it
    /// serves).
    pub async fn start_unsynced(
        etcd: &Path,
        data_dir: &Path,
        name: &str,
        log: &Path,
        snapshot_at: Option<u64>,
    ) -> Result<Self> {
        let mut extra = vec![
            "--unsafe-no-fsync".to_string(),
            "--max-txn-ops=100000".to_string(),
            // etcd commits its backend every 1,000 applied entries instead of
            // 10,000: it starts and applies a log of 100,000 revisions in ~5 s
            // instead of ~9 s (a large uncommitted bbolt transaction makes every
            // insert slower; 100,000 made it 80 s)
            "--backend-batch-limit=1000".to_string(),
            // alone, it elects itself at once instead of after ~0.6 s
            "--heartbeat-interval=10".to_string(),
            "--election-timeout=100".to_string(),
        ];
        if let Some(last) = snapshot_at {
            // etcd snapshots when it applied more than this many entries
            // since its last snapshot (none: index 0)
            extra.push(format!(
                "--snapshot-count={}",
                last.saturating_sub(1).max(1)
            ));
        }
        // Go's collector runs a quarter as often: applying a log of 100,000
        // revisions took ~1.3 s less (8.3 s to 6.9 s from start to serving,
        // peak RSS 1.1 to 1.6 GiB with a 646 MiB database); a short log, as a
        // failover's, keeps a small heap either way
        let env = [("GOGC", "400")];
        Self::start_with(etcd, data_dir, name, log, &extra, &env).await
    }

    /// [`TempEtcd::start`] on a member's existing data with
    /// `--force-new-cluster`: every other member is removed and this one
    /// serves alone (a standby's promotion, [`crate::standby::promote`]).
    pub async fn start_alone(etcd: &Path, data_dir: &Path, name: &str, log: &Path) -> Result<Self> {
        Self::start_with(
            etcd,
            data_dir,
            name,
            log,
            &[
                "--force-new-cluster".to_string(),
                // alone, it need not wait a second or two for its election
                "--heartbeat-interval=20".to_string(),
                "--election-timeout=100".to_string(),
                // a snapshot of the one-member configuration: the member it
                // leaves starts as the only voter and campaigns at once
                "--snapshot-count=1".to_string(),
            ],
            &[],
        )
        .await
    }

    async fn start_with(
        etcd: &Path,
        data_dir: &Path,
        name: &str,
        log: &Path,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut last = String::new();
        let tls_dir = log.with_file_name(format!(
            ".{}.tls",
            log.file_name()
                .map_or("etcd".into(), |n| n.to_string_lossy())
        ));
        for _attempt in 0..3 {
            let tls = TempTls::create(&tls_dir)?;
            let ports = free_ports(2)?;
            let (client_port, peer_port) = (ports[0], ports[1]);
            let url = format!("https://127.0.0.1:{client_port}");
            let peer = format!("https://127.0.0.1:{peer_port}");
            let logfile = std::fs::File::create(log).map_err(io_at("creating", log))?;
            let mut cmd = tokio::process::Command::new(etcd);
            cmd.args(single_member_args(name, data_dir, &url, &peer))
                .args(tls.args())
                .args(extra)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(logfile))
                .kill_on_drop(true);
            // a killed restore (ringd, ringctl, an init container) takes its
            // etcd with it: nothing else would ever stop it
            let parent = std::process::id();
            // SAFETY: die_with_parent makes only async-signal-safe calls.
            unsafe {
                cmd.pre_exec(move || seed::process::die_with_parent(parent));
            }
            let child = cmd.spawn().map_err(io_at("starting", etcd))?;
            let mut me = TempEtcd {
                child: Some(child),
                url,
                data_dir: data_dir.to_path_buf(),
                log: log.to_path_buf(),
                tls,
            };
            match me.wait_ready(Duration::from_secs(30)).await {
                Ok(()) => return Ok(me),
                Err(e) => {
                    last = e;
                    me.stop().await;
                }
            }
        }
        Err(BackupError::Tool {
            program: "etcd".into(),
            message: last,
        })
    }

    async fn wait_ready(&mut self, timeout: Duration) -> std::result::Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "etcd exited ({status}); last lines of {}:\n{}",
                        self.log.display(),
                        seed::ShootLayout::tail(&self.log, 10)
                    ));
                }
            }
            if let Ok(mut c) = connect(&self.config()).await {
                if tokio::time::timeout(Duration::from_secs(2), c.status())
                    .await
                    .is_ok_and(|r| r.is_ok())
                {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "etcd did not answer on {} within {timeout:?}; last lines of {}:\n{}",
                    self.url,
                    self.log.display(),
                    seed::ShootLayout::tail(&self.log, 10)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client of this etcd.
    pub async fn client(&self) -> Result<Client> {
        connect(&self.config()).await
    }

    /// How to reach this etcd (its URL, CA and client certificate).
    pub fn config(&self) -> EtcdConfig {
        self.tls.client_config(&self.url)
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Stops etcd: SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

impl Drop for TempEtcd {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
    }
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

#[cfg(test)]
#[path = "etcd_tests.rs"]
mod tests;
