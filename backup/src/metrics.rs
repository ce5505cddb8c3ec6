//! Prometheus metrics of a shoot's continuous backup (text exposition).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The metrics of one shoot's backup; cheap to clone (shared).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    last_full_ms: AtomicI64,
    last_delta_ms: AtomicI64,
    last_full_age: Gauge<f64, AtomicU64>,
    last_delta_age: Gauge<f64, AtomicU64>,
    last_full_revision: Gauge,
    durable_revision: Gauge,
    uploaded_bytes: Family<Labels, Counter>,
    upload_errors: Family<Labels, Counter>,
    objects: Family<Labels, Counter>,
    events: Counter,
    lag_revisions: Gauge,
    lag_seconds: Gauge<f64, AtomicU64>,
    pending_bytes: Gauge,
    pending_objects: Gauge,
    spooled_objects: Gauge,
}

fn kind(k: &str) -> Labels {
    vec![("kind".into(), k.into())]
}

impl Inner {
    /// Every metric at zero (none stored yet); the registry is filled by
    /// [`Metrics::new`].
    fn new() -> Self {
        Inner {
            registry: Registry::default(),
            last_full_ms: AtomicI64::new(0),
            last_delta_ms: AtomicI64::new(0),
            last_full_age: Gauge::default(),
            last_delta_age: Gauge::default(),
            last_full_revision: Gauge::default(),
            durable_revision: Gauge::default(),
            uploaded_bytes: Family::default(),
            upload_errors: Family::default(),
            objects: Family::default(),
            events: Counter::default(),
            lag_revisions: Gauge::default(),
            lag_seconds: Gauge::default(),
            pending_bytes: Gauge::default(),
            pending_objects: Gauge::default(),
            spooled_objects: Gauge::default(),
        }
    }
}

/// The registration list: every metric with its name and help.
fn register(r: &mut Registry, i: &Inner) {
    r.register(
        "last_full_age_seconds",
        "Seconds since the last full snapshot was stored (-1: none yet)",
        i.last_full_age.clone(),
    );
    r.register(
        "last_delta_age_seconds",
        "Seconds since the last delta was stored (-1: none yet)",
        i.last_delta_age.clone(),
    );
    r.register(
        "last_full_revision",
        "Base revision of the last full snapshot stored",
        i.last_full_revision.clone(),
    );
    r.register(
        "durable_revision",
        "Newest etcd revision stored in the bucket",
        i.durable_revision.clone(),
    );
    r.register(
        "uploaded_bytes",
        "Bytes stored in the bucket, by kind (full, delta)",
        i.uploaded_bytes.clone(),
    );
    r.register(
        "upload_errors",
        "Failed uploads (retried), by kind",
        i.upload_errors.clone(),
    );
    r.register("objects", "Objects stored, by kind", i.objects.clone());
    r.register("events", "Watch events recorded", i.events.clone());
    r.register(
        "lag_revisions",
        "Revisions etcd is ahead of the bucket",
        i.lag_revisions.clone(),
    );
    r.register(
        "lag_seconds",
        "Age of the oldest event not yet in the bucket (0: none pending)",
        i.lag_seconds.clone(),
    );
    r.register(
        "pending_bytes",
        "Encoded deltas waiting for the bucket",
        i.pending_bytes.clone(),
    );
    r.register(
        "pending_objects",
        "Deltas waiting for the bucket",
        i.pending_objects.clone(),
    );
    r.register(
        "spooled_objects",
        "Deltas waiting for the bucket on disk",
        i.spooled_objects.clone(),
    );
}

impl Metrics {
    /// Metrics named `ring_backup_*`, labelled with the shoot.
    pub fn new(shoot: &str) -> Self {
        let mut registry = Registry::with_prefix_and_labels(
            "ring_backup",
            [("shoot".into(), shoot.to_string().into())].into_iter(),
        );
        let mut i = Inner::new();
        register(&mut registry, &i);
        i.registry = registry;
        Metrics { inner: Arc::new(i) }
    }

    /// A full snapshot was stored.
    pub fn full_stored(&self, base_revision: i64, bytes: u64, at_ms: i64) {
        let i = &self.inner;
        i.last_full_ms.store(at_ms, Ordering::Relaxed);
        i.last_full_revision.set(base_revision);
        i.uploaded_bytes.get_or_create(&kind("full")).inc_by(bytes);
        i.objects.get_or_create(&kind("full")).inc();
        let d = i.durable_revision.get();
        i.durable_revision.set(d.max(base_revision));
    }

    /// What the bucket held when the backup started: its newest revision and
    /// newest full snapshot (base revision, time).
    pub fn stored_before(&self, revision: i64, full: Option<(i64, i64)>) {
        let i = &self.inner;
        let d = i.durable_revision.get();
        i.durable_revision.set(d.max(revision));
        if let Some((rev, at_ms)) = full {
            if i.last_full_ms.load(Ordering::Relaxed) == 0 {
                i.last_full_ms.store(at_ms, Ordering::Relaxed);
                i.last_full_revision.set(rev);
            }
        }
    }

    /// A delta was stored.
    pub fn delta_stored(&self, last_revision: i64, bytes: u64, at_ms: i64) {
        let i = &self.inner;
        i.last_delta_ms.store(at_ms, Ordering::Relaxed);
        i.uploaded_bytes.get_or_create(&kind("delta")).inc_by(bytes);
        i.objects.get_or_create(&kind("delta")).inc();
        let d = i.durable_revision.get();
        i.durable_revision.set(d.max(last_revision));
    }

    /// An upload failed (and will be retried).
    pub fn upload_failed(&self, what: &str) {
        self.inner.upload_errors.get_or_create(&kind(what)).inc();
    }

    /// Watch events recorded.
    pub fn events(&self, n: u64) {
        self.inner.events.inc_by(n);
    }

    /// etcd's newest revision and the oldest pending event's arrival.
    pub fn lag(&self, etcd_revision: i64, oldest_pending_ms: Option<i64>, now_ms: i64) {
        let i = &self.inner;
        i.lag_revisions
            .set((etcd_revision - i.durable_revision.get()).max(0));
        i.lag_seconds
            .set(oldest_pending_ms.map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0));
    }

    /// The spool's size.
    pub fn pending(&self, objects: usize, bytes: u64, on_disk: usize) {
        let i = &self.inner;
        i.pending_objects.set(objects as i64);
        i.pending_bytes.set(bytes as i64);
        i.spooled_objects.set(on_disk as i64);
    }

    /// The newest revision in the bucket.
    pub fn durable_revision(&self) -> i64 {
        self.inner.durable_revision.get()
    }

    /// Failed uploads of `what` (full, delta).
    pub fn upload_errors(&self, what: &str) -> u64 {
        self.inner.upload_errors.get_or_create(&kind(what)).get()
    }

    /// The Prometheus text exposition (ages computed now).
    pub fn encode(&self, now_ms: i64) -> String {
        let i = &self.inner;
        let age = |t: i64| {
            if t == 0 {
                -1.0
            } else {
                (now_ms - t).max(0) as f64 / 1000.0
            }
        };
        i.last_full_age
            .set(age(i.last_full_ms.load(Ordering::Relaxed)));
        i.last_delta_age
            .set(age(i.last_delta_ms.load(Ordering::Relaxed)));
        let mut out = String::new();
        let _ = encode(&mut out, &i.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_ages_lag_and_errors() {
        let m = Metrics::new("s1");
        let before = m.encode(10_000);
        assert!(
            before.contains("ring_backup_last_full_age_seconds{shoot=\"s1\"} -1"),
            "{before}"
        );
        m.full_stored(100, 4096, 1_000);
        m.delta_stored(150, 10, 9_000);
        m.upload_failed("delta");
        m.lag(160, Some(8_000), 10_000);
        let text = m.encode(10_000);
        for want in [
            "ring_backup_last_full_age_seconds{shoot=\"s1\"} 9.0",
            "ring_backup_last_delta_age_seconds{shoot=\"s1\"} 1.0",
            "ring_backup_uploaded_bytes_total{shoot=\"s1\",kind=\"full\"} 4096",
            "ring_backup_upload_errors_total{shoot=\"s1\",kind=\"delta\"} 1",
            "ring_backup_lag_revisions{shoot=\"s1\"} 10",
            "ring_backup_lag_seconds{shoot=\"s1\"} 2.0",
            "ring_backup_durable_revision{shoot=\"s1\"} 150",
        ] {
            assert!(text.contains(want), "missing {want}:\n{text}");
        }
    }
}
