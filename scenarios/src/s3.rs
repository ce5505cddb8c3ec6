//! A real S3-compatible server (`s3s-fs`, installed by `scripts/setup`) on a
//! port of a local address (loopback, or the node network's gateway), storing
//! under a dir: the bucket of drills with `ring.bucket: s3`, and the S3 server
//! of the end-to-end tests. It can be stopped (an outage) and started again on
//! the same port and data.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ScenarioError;

/// The server's credentials (it accepts only these).
pub const ACCESS_KEY: &str = "ring-drill-access";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "ring-drill-secret-key";
/// The bucket drills back up to.
pub const BUCKET: &str = "drill";

/// The `s3s-fs` binary, or an error telling how to install it.
pub fn server_binary() -> Result<PathBuf, ScenarioError> {
    let cached = seed::binaries::cache_dir().join("s3s/bin/s3s-fs");
    if cached.is_file() {
        return Ok(cached);
    }
    seed::BinarySearch::standard(None)
        .find("s3s-fs")
        .map_err(|_| {
            ScenarioError::Setup(format!(
                "s3s-fs (the S3-compatible server of drills with ring.bucket: s3) is not in {} or on PATH: run scripts/setup first",
                cached.display()
            ))
        })
}

/// The drills' bucket URL (the ring backs up under `backups/`).
pub fn url() -> String {
    format!("s3://{BUCKET}/backups")
}

/// A running (or stopped) S3 server.
pub struct S3Server {
    child: Option<Child>,
    dir: PathBuf,
    bin: PathBuf,
    /// The address it listens on.
    pub host: Ipv4Addr,
    /// Its port there.
    pub port: u16,
}

impl S3Server {
    /// Starts a server on `host` storing under `dir` (which gets `data/` and
    /// `server.log`); it has no bucket yet ([`S3Server::create_bucket`]).
    pub fn start(dir: &Path, host: Ipv4Addr) -> Result<S3Server, ScenarioError> {
        let data = dir.join("data");
        std::fs::create_dir_all(&data).map_err(|source| ScenarioError::Io {
            what: format!("creating {}", data.display()),
            source,
        })?;
        let mut s = S3Server {
            child: None,
            dir: dir.to_path_buf(),
            bin: server_binary()?,
            host,
            port: 0,
        };
        for _ in 0..3 {
            s.port = std::net::TcpListener::bind((host, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|source| ScenarioError::Io {
                    what: "finding a free port for the S3 server".into(),
                    source,
                })?;
            if s.try_start()? {
                return Ok(s);
            }
        }
        Err(ScenarioError::Setup(format!(
            "s3s-fs did not start; see {}",
            dir.join("server.log").display()
        )))
    }

    fn try_start(&mut self) -> Result<bool, ScenarioError> {
        let log_path = self.dir.join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|source| ScenarioError::Io {
                what: format!("opening {}", log_path.display()),
                source,
            })?;
        let child = Command::new(&self.bin)
            .args([
                "--host",
                &self.host.to_string(),
                "--port",
                &self.port.to_string(),
            ])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.dir.join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|source| ScenarioError::Io {
                what: format!("starting {}", self.bin.display()),
                source,
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Ok(false);
            }
            if std::net::TcpStream::connect((self.host, self.port)).is_ok() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        Ok(false)
    }

    /// Creates a bucket (a folder of the server's root).
    pub fn create_bucket(&self, name: &str) -> Result<(), ScenarioError> {
        let dir = self.bucket_dir(name);
        std::fs::create_dir_all(&dir).map_err(|source| ScenarioError::Io {
            what: format!("creating bucket {}", dir.display()),
            source,
        })
    }

    /// Where the server keeps a bucket's objects (for faults that damage them).
    pub fn bucket_dir(&self, name: &str) -> PathBuf {
        self.dir.join("data").join(name)
    }

    /// `http://HOST:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// The drill's bucket as the backup library reaches it.
    pub fn bucket_config(&self) -> backup::BucketConfig {
        self.bucket_config_for(BUCKET)
    }

    /// `s3://<bucket>/backups` on this server as the backup library reaches it
    /// (explicit endpoint and keys).
    pub fn bucket_config_for(&self, bucket: &str) -> backup::BucketConfig {
        backup::BucketConfig {
            url: format!("s3://{bucket}/backups"),
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            allow_http: Some(true),
            options: [
                ("aws_access_key_id".to_string(), ACCESS_KEY.to_string()),
                ("aws_secret_access_key".to_string(), SECRET_KEY.to_string()),
            ]
            .into(),
        }
    }

    /// The credentials and region (for a client given the endpoint explicitly).
    pub fn credentials_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// The environment through which ringd and ringctl (children of the runner)
    /// reach this server with a plain `s3://` URL.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.credentials_env();
        env.push(("AWS_ENDPOINT_URL", self.endpoint()));
        env.push(("AWS_ALLOW_HTTP", "true".into()));
        env
    }

    /// Stops the server (an outage); the data stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) -> Result<(), ScenarioError> {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.try_start()? {
            if Instant::now() >= deadline {
                return Err(ScenarioError::Setup(format!(
                    "s3s-fs did not restart on port {}; see {}",
                    self.port,
                    self.dir.join("server.log").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
