//! A bare etcd (no Kubernetes) on free loopback ports in a temp dir, plain or
//! with TLS and client-certificate authentication; killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seed::pki::{Leaf, Pki};

/// TLS files of a TLS etcd (made with the seed's PKI code).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A running etcd.
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// The client URL.
    pub url: String,
    /// Client TLS files when the etcd serves TLS.
    pub tls: Option<EtcdTls>,
}

/// A port the kernel just handed out on 127.0.0.1.
pub fn free_port() -> u16 {
    backup::etcd::free_port().expect("a free port")
}

/// The etcd binary, or a panic telling how to install it.
pub fn etcd_bin() -> PathBuf {
    seed::BinarySearch::standard(None)
        .find("etcd")
        .unwrap_or_else(|e| panic!("{e}\nThe tests need a real etcd: run scripts/setup first."))
}

/// The etcdctl binary, or a panic telling how to install it.
pub fn etcdctl_bin() -> PathBuf {
    seed::BinarySearch::standard(None)
        .find("etcdctl")
        .unwrap_or_else(|e| panic!("{e}\nThe tests need a real etcdctl: run scripts/setup first."))
}

/// The etcdutl binary (snapshot restores), or a panic telling how to install it.
pub fn etcdutl_bin() -> PathBuf {
    seed::BinarySearch::standard(None)
        .find("etcdutl")
        .unwrap_or_else(|e| panic!("{e}\nThe tests need a real etcdutl: run scripts/setup first."))
}

impl EtcdServer {
    /// A plain-HTTP etcd.
    pub fn plain() -> Self {
        Self::start(false)
    }

    /// An etcd serving TLS and requiring client certificates.
    pub fn tls() -> Self {
        Self::start(true)
    }

    fn start(tls: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ring-etcd-")
            .tempdir()
            .expect("temp dir");
        let scheme = if tls { "https" } else { "http" };
        let mut files = None;
        let mut tls_args = Vec::new();
        if tls {
            let pki = Pki::new(dir.path().join("pki"));
            pki.ensure(
                "etcd-test",
                &seed::ShootEndpoint::on(std::net::Ipv4Addr::LOCALHOST),
            )
            .expect("test PKI");
            let (ca, server, client) = (
                pki.ca(),
                pki.leaf(Leaf::EtcdServer),
                pki.leaf(Leaf::EtcdClient),
            );
            tls_args = vec![
                format!("--cert-file={}", server.cert.display()),
                format!("--key-file={}", server.key.display()),
                "--client-cert-auth=true".into(),
                format!("--trusted-ca-file={}", ca.cert.display()),
            ];
            files = Some(EtcdTls {
                ca: ca.cert,
                cert: client.cert,
                key: client.key,
            });
        }
        let mut last = String::new();
        for _ in 0..3 {
            let ports = backup::etcd::free_ports(2).expect("two free ports");
            let (client_port, peer_port) = (ports[0], ports[1]);
            let url = format!("{scheme}://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
            let mut child = Command::new(etcd_bin())
                .args(backup::etcd::single_member_args(
                    "test",
                    &dir.path().join("data"),
                    &url,
                    &peer,
                ))
                .args(&tls_args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
            match wait_healthy(
                &mut child,
                &url,
                files.as_ref(),
                dir.path(),
                Duration::from_secs(30),
            ) {
                Ok(()) => {
                    return EtcdServer {
                        child: Some(child),
                        dir,
                        url,
                        tls: files,
                    }
                }
                Err(e) => {
                    last = e;
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = std::fs::remove_dir_all(dir.path().join("data"));
                }
            }
        }
        panic!("etcd did not become healthy: {last}");
    }

    /// `etcdctl` against this etcd (TLS flags included).
    pub fn etcdctl(&self) -> Command {
        etcdctl_for(&self.url, self.tls.as_ref())
    }

    /// The temp dir (data, PKI, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The backup crate's view of this etcd.
    pub fn config(&self) -> backup::EtcdConfig {
        let mut c = backup::EtcdConfig::plain(self.url.clone());
        if let Some(t) = &self.tls {
            c.ca_file = Some(t.ca.clone());
            c.cert_file = Some(t.cert.clone());
            c.key_file = Some(t.key.clone());
        }
        c
    }

    /// A connected client.
    pub async fn client(&self) -> etcd_client::Client {
        backup::etcd::connect(&self.config())
            .await
            .unwrap_or_else(|e| panic!("connecting to the test etcd: {e}"))
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills etcd now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `etcdctl --endpoints URL` with the TLS flags.
pub fn etcdctl_for(url: &str, tls: Option<&EtcdTls>) -> Command {
    let mut cmd = Command::new(etcdctl_bin());
    cmd.arg(format!("--endpoints={url}"));
    if let Some(t) = tls {
        cmd.arg(format!("--cacert={}", t.ca.display()))
            .arg(format!("--cert={}", t.cert.display()))
            .arg(format!("--key={}", t.key.display()));
    }
    cmd
}

fn wait_healthy(
    child: &mut Child,
    url: &str,
    tls: Option<&EtcdTls>,
    dir: &Path,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let tail = || seed::ShootLayout::tail(&dir.join("etcd.log"), 10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("etcd exited ({status}): {}", tail()));
        }
        let out = etcdctl_for(url, tls)
            .args(["endpoint", "health", "--command-timeout=2s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if out.is_ok_and(|o| o.success()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("not healthy after {timeout:?}: {}", tail()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
