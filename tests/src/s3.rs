//! The tests' S3-compatible server: the drills' [`scenarios::s3::S3Server`]
//! (`s3s-fs` on a free loopback port) storing into a temp dir, with panics that
//! name the problem instead of errors; killed on drop. It can be stopped and
//! started again on the same port and data (an outage).

use std::path::PathBuf;

/// A running S3-compatible server.
pub struct S3Server {
    inner: scenarios::s3::S3Server,
    /// Dropped after `inner` (fields drop in order): the data outlives the server.
    _root: tempfile::TempDir,
}

impl S3Server {
    /// Starts a server with an empty root.
    pub fn start() -> Self {
        let root = tempfile::Builder::new()
            .prefix("ring-s3-")
            .tempdir()
            .expect("temp dir");
        let inner = scenarios::s3::S3Server::start(root.path(), std::net::Ipv4Addr::LOCALHOST)
            .unwrap_or_else(|e| panic!("the S3 test server: {e}"));
        S3Server { inner, _root: root }
    }

    /// Creates a bucket (a folder of the server's root).
    pub fn create_bucket(&self, name: &str) {
        self.inner
            .create_bucket(name)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Where the server keeps a bucket's objects (for tests that damage them).
    pub fn bucket_dir(&self, name: &str) -> PathBuf {
        self.inner.bucket_dir(name)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.inner.endpoint()
    }

    /// The backup crate's view of `s3://bucket/backups` on this server.
    pub fn bucket_config(&self, bucket: &str) -> backup::BucketConfig {
        self.inner.bucket_config_for(bucket)
    }

    /// Environment for a `ringctl` given this server's endpoint explicitly.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.inner.credentials_env()
    }

    /// Stops the server (an outage); the data stays.
    pub fn stop(&mut self) {
        self.inner.stop();
    }

    /// Starts the server again on the same port and data.
    pub fn restart(&mut self) {
        self.inner.restart().unwrap_or_else(|e| panic!("{e}"));
    }
}
