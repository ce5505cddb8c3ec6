//! The temporary etcd of a restore or a promotion: loopback ports, TLS
//! with client certificates from a CA made for it alone, and the reason it
//! gives when it refuses its data.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use etcd_client::Client;

use super::{connect, free_ports, single_member_args};
use crate::config::EtcdConfig;
use crate::error::io_at;
use crate::{BackupError, Result};

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
    /// a crash loses what it wrote, so [`super::sync_tree`] the data dir once
    /// it has stopped before anything relies on it), a transaction may carry
    /// as many operations as one recorded revision holds, and it applies a
    /// long log in small backend batches.
    ///
    /// With `snapshot_after` (how many entries the log holds past its newest
    /// raft snapshot), etcd takes a raft snapshot once it has applied them
    /// all. etcd starts from the newest snapshot its log records and reads
    /// every entry after it before it serves, applied or not: so the etcd
    /// that serves this data next reads none of the replayed entries again.
    pub async fn start_unsynced(
        etcd: &Path,
        data_dir: &Path,
        name: &str,
        log: &Path,
        snapshot_after: Option<u64>,
    ) -> Result<Self> {
        let mut extra = vec![
            "--unsafe-no-fsync".to_string(),
            "--max-txn-ops=100000".to_string(),
            // etcd commits its backend every 1,000 applied entries instead of
            // 10,000: a large uncommitted bbolt transaction makes every
            // insert slower, and a long log is applied in one go
            "--backend-batch-limit=1000".to_string(),
            // alone, it elects itself at once instead of after ~0.6 s
            "--heartbeat-interval=10".to_string(),
            "--election-timeout=100".to_string(),
        ];
        if let Some(count) = snapshot_after.and_then(snapshot_count) {
            extra.push(format!("--snapshot-count={count}"));
        }
        // Go's collector runs a quarter as often: applying a long log of
        // revisions spends much less time collecting, for a larger peak heap
        // (`ringctl bench restore` shows both); a short log, as a
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
                // a raft snapshot of the one-member configuration: the etcd
                // that serves the member next starts from it instead of
                // reading the member's whole log again
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
                    return Err(self.refusal(status));
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

    /// What etcd said when it exited with `status` before it served: its
    /// reason (see [`super::reason`]), else the last lines of its log.
    fn refusal(&self, status: std::process::ExitStatus) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        match super::reason(&text) {
            Some(why) => format!(
                "etcd exited ({status}): {why} (its log: {})",
                self.log.display()
            ),
            None => format!(
                "etcd exited ({status}); last lines of {}:\n{}",
                self.log.display(),
                seed::ShootLayout::tail(&self.log, 10)
            ),
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

/// The `--snapshot-count` that makes etcd take a raft snapshot once it has
/// applied `entries` more entries than its newest snapshot holds: etcd takes
/// one when it applied more than the count since that snapshot. `None` when
/// no count does (etcd reads a count of 0 as its default).
fn snapshot_count(entries: u64) -> Option<u64> {
    entries.checked_sub(1).filter(|c| *c > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_count_makes_etcd_snapshot_after_the_last_entry() {
        // etcd snapshots once applied - snapshot index > count
        for entries in [2u64, 3, 100_000] {
            let count = snapshot_count(entries).unwrap();
            assert!(
                entries > count && entries - 1 <= count,
                "{entries}: {count}"
            );
        }
        assert_eq!(snapshot_count(1), None);
        assert_eq!(snapshot_count(0), None);
    }
}
