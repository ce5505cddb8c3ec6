//! What a failed object-store operation means: the bucket is missing, does
//! not answer, or refused (retryable or not). Typed checks first; the one
//! text check is [`text_says`].

use super::Bucket;
use crate::BackupError;

/// The text of an error and all its causes.
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

impl Bucket {
    /// Maps an object-store error of an `op` (described by `what`) to a clear
    /// error: typed checks first ([`object_store::Error`]'s variant, then
    /// [`std::io::ErrorKind`]s in its causes), and only for what object_store
    /// keeps as text alone, [`text_says`].
    pub(super) fn failed(&self, op: Op, what: &str, e: object_store::Error) -> BackupError {
        let text = chain(&e);
        let says = match &e {
            // object_store 0.12 wraps failed listings and transport failures as
            // Generic, their HTTP status and the store's error code as text only.
            object_store::Error::Generic { .. } => text_says(&text),
            _ => None,
        };
        if says == Some(StoreText::NoSuchBucket) || bucket_missing(op, &e) {
            return BackupError::BucketMissing {
                bucket: self.url.clone(),
                hint: "create it first (or fix the URL)".into(),
            };
        }
        if says == Some(StoreText::NoAnswer) || no_connection(&e) {
            return BackupError::BucketUnreachable {
                bucket: self.url.clone(),
                message: format!("{what}: {text}"),
            };
        }
        BackupError::Bucket {
            bucket: self.url.clone(),
            message: format!("{what}: {text}"),
            retryable: store_error_retryable(&e),
        }
    }
}

/// What a failed operation was, for what a "not found" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// Listing the shoot's prefix: only the bucket itself can be missing.
    List,
    /// Creating an object (a put, starting a multipart upload): only the
    /// bucket can be missing.
    Create,
    /// Anything on an existing object (download, upload parts, delete): the
    /// object (or the upload) may be what is missing.
    Object,
}

/// A "not found" of an operation that names no existing object means the
/// bucket is missing (S3 `NoSuchBucket`, Azure `ContainerNotFound` and GCS
/// answer HTTP 404, which object_store types as [`object_store::Error::NotFound`]).
fn bucket_missing(op: Op, e: &object_store::Error) -> bool {
    match op {
        Op::List | Op::Create => matches!(e, object_store::Error::NotFound { .. }),
        Op::Object => false,
    }
}

/// Whether a cause of `e` is a socket-level failure (refused, reset, timed
/// out, no route): the store did not answer.
fn no_connection(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::BrokenPipe
                    | K::TimedOut
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::AddrNotAvailable
            ) {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// Whether retrying an operation that failed with `e` may help.
fn store_error_retryable(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    match e {
        // A server error, a throttled or dropped request, a lost race.
        E::Generic { .. }
        | E::JoinError { .. }
        | E::AlreadyExists { .. }
        | E::Precondition { .. }
        | E::NotModified { .. } => true,
        E::NotFound { .. }
        | E::InvalidPath { .. }
        | E::NotSupported { .. }
        | E::NotImplemented
        | E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::UnknownConfigurationKey { .. } => false,
        // object_store's Error is non-exhaustive: a variant added later is
        // retried (with backoff) rather than ending the backup.
        _ => true,
    }
}

/// What only the text of an [`object_store::Error::Generic`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreText {
    /// The store's error code says the bucket (container) does not exist.
    NoSuchBucket,
    /// The request got no answer (timeout, DNS, connection dropped).
    NoAnswer,
}

/// The one text check of Ring's bucket errors, for what no type carries:
/// object_store 0.12 keeps a failed listing's HTTP status and the store's
/// error code (`<Code>NoSuchBucket</Code>` of S3 and GCS, `ContainerNotFound`
/// of Azure) inside a private `RetryError` behind `Error::Generic`, and
/// reqwest/hyper keep a timeout, a DNS failure or a dropped connection in
/// types this crate does not depend on (socket errors are typed: see
/// [`no_connection`]). The store's codes are matched exactly; the transport
/// phrases are those reqwest and hyper print.
fn text_says(text: &str) -> Option<StoreText> {
    const NO_BUCKET: [&str; 2] = ["NoSuchBucket", "ContainerNotFound"];
    const NO_ANSWER: [&str; 3] = [
        "timed out",
        "dns error",
        "connection closed before message completed",
    ];
    if NO_BUCKET.iter().any(|code| text.contains(code)) {
        Some(StoreText::NoSuchBucket)
    } else if NO_ANSWER.iter().any(|p| text.contains(p)) {
        Some(StoreText::NoAnswer)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BucketConfig;
    use object_store::ObjectStore;
    use std::sync::Arc;

    fn io_cause(kind: std::io::ErrorKind, text: &str) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(std::io::Error::new(kind, text.to_string()))
    }

    fn memory_bucket() -> Bucket {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        Bucket::from_store(store, "base", "shoot-a", "s3://b/base")
    }

    #[test]
    fn a_typed_not_found_of_a_put_or_listing_is_a_missing_bucket() {
        let b = memory_bucket();
        assert_eq!(b.shoot(), "shoot-a");
        let not_found = || object_store::Error::NotFound {
            path: "base/shoot-a/x".into(),
            source: io_cause(std::io::ErrorKind::NotFound, "404"),
        };
        for op in [Op::List, Op::Create] {
            let err = b.failed(op, "uploading x", not_found());
            assert!(
                matches!(err, BackupError::BucketMissing { .. }),
                "{op:?}: {err}"
            );
            assert!(!err.is_retryable());
        }
        // on an existing object, "not found" is about the object
        let err = b.failed(Op::Object, "downloading x", not_found());
        assert!(
            matches!(
                err,
                BackupError::Bucket {
                    retryable: false,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_refused_connection_is_told_by_its_io_kind_not_its_text() {
        let b = memory_bucket();
        let refused = object_store::Error::Generic {
            store: "S3",
            source: io_cause(std::io::ErrorKind::ConnectionRefused, "os error 111"),
        };
        let err = b.failed(Op::List, "listing", refused);
        assert!(
            matches!(err, BackupError::BucketUnreachable { .. }),
            "{err}"
        );
        assert!(err.is_retryable());
        // the same words without the kind are just words
        let words = object_store::Error::Generic {
            store: "S3",
            source: io_cause(std::io::ErrorKind::Other, "connection refused"),
        };
        let err = b.failed(Op::List, "listing", words);
        assert!(
            matches!(
                err,
                BackupError::Bucket {
                    retryable: true,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn typed_permanent_store_errors_are_not_retried() {
        let b = memory_bucket();
        let denied = object_store::Error::PermissionDenied {
            path: "p".into(),
            source: io_cause(std::io::ErrorKind::PermissionDenied, "403 timed out"),
        };
        // a typed refusal is never read as text ("timed out" in its message)
        let err = b.failed(Op::Create, "uploading", denied);
        assert!(
            matches!(
                err,
                BackupError::Bucket {
                    retryable: false,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!store_error_retryable(&object_store::Error::NotImplemented));
        assert!(store_error_retryable(&object_store::Error::Generic {
            store: "S3",
            source: io_cause(std::io::ErrorKind::Other, "503 Slow Down"),
        }));
    }

    #[test]
    fn only_the_stores_own_codes_and_transport_phrases_are_read_from_text() {
        let xml = "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code></Error>";
        assert_eq!(text_says(xml), Some(StoreText::NoSuchBucket));
        assert_eq!(
            text_says("404: <Code>ContainerNotFound</Code>"),
            Some(StoreText::NoSuchBucket)
        );
        assert_eq!(
            text_says("HTTP error: error sending request: operation timed out"),
            Some(StoreText::NoAnswer)
        );
        assert_eq!(
            text_says("client error (Connect): dns error: failed to lookup address"),
            Some(StoreText::NoAnswer)
        );
        assert_eq!(text_says("404 Not Found: <Code>NoSuchKey</Code>"), None);
        assert_eq!(
            text_says("the nosuchbucket folder"),
            None,
            "codes match exactly"
        );
        let b = memory_bucket();
        let listing = object_store::Error::Generic {
            store: "S3",
            source: io_cause(std::io::ErrorKind::Other, xml),
        };
        let err = b.failed(Op::List, "listing", listing);
        assert!(matches!(err, BackupError::BucketMissing { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let mut cfg = BucketConfig::url("s3://ring/backups");
        cfg.endpoint = Some(format!("http://127.0.0.1:{port}"));
        cfg.allow_http = Some(true);
        cfg.region = Some("us-east-1".into());
        for (k, v) in [("aws_access_key_id", "a"), ("aws_secret_access_key", "b")] {
            cfg.options.insert(k.into(), v.into());
        }
        let err = Bucket::open(&cfg, "s", false)
            .unwrap()
            .check()
            .await
            .unwrap_err();
        assert!(
            matches!(err, BackupError::BucketUnreachable { .. }),
            "{err}"
        );
    }
}
