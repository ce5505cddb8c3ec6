//! A real S3-compatible server (`s3s-fs`, installed by `scripts/setup`) on a
//! free loopback port, storing into a temp dir; killed on drop. It can be
//! stopped and started again on the same port and data (an outage).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Test credentials (the server accepts only these).
pub const ACCESS_KEY: &str = "ring-test-access";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "ring-test-secret-key";

/// The `s3s-fs` binary, or a panic telling how to install it.
pub fn s3_server_bin() -> PathBuf {
    let cached = seed::binaries::cache_dir().join("s3s/bin/s3s-fs");
    if cached.is_file() {
        return cached;
    }
    seed::BinarySearch::standard(None)
        .find("s3s-fs")
        .unwrap_or_else(|_| {
            panic!(
                "s3s-fs (the S3-compatible test server) is not installed in {} or on PATH: run scripts/setup first",
                cached.display()
            )
        })
}

/// A running S3-compatible server.
pub struct S3Server {
    child: Option<Child>,
    root: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl S3Server {
    /// Starts a server with an empty root.
    pub fn start() -> Self {
        let root = tempfile::Builder::new()
            .prefix("ring-s3-")
            .tempdir()
            .expect("temp dir");
        let mut s = S3Server {
            child: None,
            root,
            port: 0,
        };
        for _ in 0..3 {
            s.port = crate::etcd::free_port();
            if s.try_start() {
                return s;
            }
        }
        panic!("s3s-fs did not start; see {}", s.log().display());
    }

    fn log(&self) -> PathBuf {
        self.root.path().join("server.log")
    }

    fn try_start(&mut self) -> bool {
        std::fs::create_dir_all(self.root.path().join("data")).expect("s3 data dir");
        let log = std::fs::File::create(self.log()).expect("s3 log");
        let child = Command::new(s3_server_bin())
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.root.path().join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start s3s-fs: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false;
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        false
    }

    /// Creates a bucket (a folder of the server's root).
    pub fn create_bucket(&self, name: &str) {
        std::fs::create_dir_all(self.root.path().join("data").join(name)).expect("bucket dir");
    }

    /// Where the server keeps a bucket's objects (for tests that damage them).
    pub fn bucket_dir(&self, name: &str) -> PathBuf {
        self.root.path().join("data").join(name)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The backup crate's view of `s3://bucket/prefix` on this server.
    pub fn bucket_config(&self, bucket: &str) -> backup::BucketConfig {
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

    /// Environment for a `ringctl` talking to this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Stops the server (an outage); the data stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.try_start() {
            assert!(
                Instant::now() < deadline,
                "s3s-fs did not restart on port {}; see {}",
                self.port,
                self.log().display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
