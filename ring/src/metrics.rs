//! Prometheus metrics of a ringd, served at `/metrics`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::node::NodeView;
use crate::state::MemberState;
use crate::RingError;

/// The metrics of one member.
pub struct Metrics {
    registry: Registry,
    is_leader: Gauge,
    term: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    members_up: Gauge,
    members_down: Gauge,
    log_entries: Gauge,
    serving: Gauge,
    open_operations: Gauge,
    proposals: Counter<u64, AtomicU64>,
    proposal_failures: Counter<u64, AtomicU64>,
    fenced: Counter<u64, AtomicU64>,
    starts: Counter<u64, AtomicU64>,
    step_seconds: Family<[(&'static str, &'static str); 3], Histogram>,
    finished: Family<[(&'static str, &'static str); 2], Counter<u64, AtomicU64>>,
    rpo_revisions: Family<[(&'static str, String); 1], Gauge>,
    rpo_seconds: Family<[(&'static str, String); 1], Gauge<f64, AtomicU64>>,
    may_lose_revisions: Family<[(&'static str, String); 1], Gauge>,
    may_lose_seconds: Family<[(&'static str, String); 1], Gauge<f64, AtomicU64>>,
    unheard_seconds: Family<[(&'static str, String); 1], Gauge<f64, AtomicU64>>,
    cert_expiry: Family<[(&'static str, String); 2], Gauge>,
}

fn step_histogram() -> Histogram {
    // 50 ms .. ~27 min
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.05, 2.0, 15,
    ))
}

impl Metrics {
    /// A registry labelled with the member's name.
    pub fn new(member: &str) -> Self {
        let mut root = Registry::with_prefix_and_labels(
            "ringd",
            [("member".into(), member.to_string().into())].into_iter(),
        );
        let m = Metrics {
            registry: Registry::default(),
            is_leader: Gauge::default(),
            term: Gauge::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            members_up: Gauge::default(),
            members_down: Gauge::default(),
            log_entries: Gauge::default(),
            serving: Gauge::default(),
            open_operations: Gauge::default(),
            proposals: Counter::default(),
            proposal_failures: Counter::default(),
            fenced: Counter::default(),
            starts: Counter::default(),
            step_seconds: Family::new_with_constructor(step_histogram),
            finished: Family::default(),
            rpo_revisions: Family::default(),
            rpo_seconds: Family::default(),
            may_lose_revisions: Family::default(),
            may_lose_seconds: Family::default(),
            unheard_seconds: Family::default(),
            cert_expiry: Family::default(),
        };
        root.register("is_leader", "1 on the Raft leader", m.is_leader.clone());
        root.register("term", "Raft term", m.term.clone());
        root.register("commit_index", "Raft commit index", m.commit_index.clone());
        root.register(
            "applied_index",
            "Raft applied index",
            m.applied_index.clone(),
        );
        root.register(
            "members_up",
            "Members the quorum believes alive",
            m.members_up.clone(),
        );
        root.register(
            "members_down",
            "Members declared down",
            m.members_down.clone(),
        );
        root.register(
            "log_entries",
            "Raft entries after the last snapshot",
            m.log_entries.clone(),
        );
        root.register(
            "serving_control_planes",
            "Control planes this member serves",
            m.serving.clone(),
        );
        root.register(
            "open_operations",
            "Unfinished failover/migration operations",
            m.open_operations.clone(),
        );
        root.register("proposals", "Proposals committed", m.proposals.clone());
        root.register(
            "proposal_failures",
            "Proposals rejected or timed out",
            m.proposal_failures.clone(),
        );
        root.register(
            "fenced",
            "Control planes stopped because their lease was ending or moved",
            m.fenced.clone(),
        );
        root.register(
            "control_plane_starts",
            "Starts (applies, on a Kubernetes seed) of a control plane this member hosts; one per start, however long it takes",
            m.starts.clone(),
        );
        root.register(
            "operation_step_seconds",
            "Duration of each step this member executed in a migration or failover (role source/target)",
            m.step_seconds.clone(),
        );
        root.register(
            "operations_finished",
            "Migrations and failovers this member completed or failed as their executor",
            m.finished.clone(),
        );
        root.register(
            "failover_rpo_revisions",
            "Revisions lost by the last failover of a shoot this member restored",
            m.rpo_revisions.clone(),
        );
        root.register(
            "failover_rpo_seconds",
            "Age of the newest durable backup when the last failover of a shoot began",
            m.rpo_seconds.clone(),
        );
        root.register(
            "failover_may_lose_revisions",
            "Revisions clients lost at least in the last failover of a shoot this member restored: the old host's etcd as last heard, beyond what the restore reached (writes after that report come on top)",
            m.may_lose_revisions.clone(),
        );
        root.register(
            "failover_may_lose_seconds",
            "The span of those revisions: from the newest durable backup to the old host's last report",
            m.may_lose_seconds.clone(),
        );
        root.register(
            "failover_unheard_seconds",
            "How long the old host of the last failover of a shoot this member restored from the bucket may have served unheard, from its last report until its lease was surely over: writes it acknowledged then may be lost too",
            m.unheard_seconds.clone(),
        );
        root.register(
            "certificate_expiration_timestamp_seconds",
            "When a certificate this member uses (ring CA, member) or keeps for a control plane it hosts (shoot PKI) stops being valid, unix seconds",
            m.cert_expiry.clone(),
        );
        Metrics {
            registry: root,
            ..m
        }
    }

    /// Counts a proposal's outcome.
    pub fn proposal(&self, ok: bool) {
        if ok {
            self.proposals.inc();
        } else {
            self.proposal_failures.inc();
        }
    }

    /// Records how long an executed step of a `kind` ("migration"/"failover") took.
    pub fn step(&self, kind: &'static str, role: &'static str, step: &'static str, secs: f64) {
        self.step_seconds
            .get_or_create(&[("kind", kind), ("role", role), ("step", step)])
            .observe(secs);
    }

    /// Counts an operation this member finished as its executor.
    pub fn finished(&self, kind: &'static str, outcome: &'static str) {
        self.finished
            .get_or_create(&[("kind", kind), ("outcome", outcome)])
            .inc();
    }

    /// Records the RPO of a failover of `shoot`.
    pub fn rpo(&self, shoot: &str, revisions: i64, seconds: f64) {
        let label = [("shoot", shoot.to_string())];
        self.rpo_revisions.get_or_create(&label).set(revisions);
        self.rpo_seconds.get_or_create(&label).set(seconds);
    }

    /// Records what clients may have lost in a failover of `shoot`: the
    /// revisions counted, their span, and how long the old host may have
    /// served unheard.
    pub fn may_lose(
        &self,
        shoot: &str,
        revisions: Option<i64>,
        seconds: Option<f64>,
        unheard_seconds: Option<f64>,
    ) {
        let label = [("shoot", shoot.to_string())];
        if let Some(n) = revisions {
            self.may_lose_revisions.get_or_create(&label).set(n);
        }
        if let Some(s) = seconds {
            self.may_lose_seconds.get_or_create(&label).set(s);
        }
        if let Some(s) = unheard_seconds {
            self.unheard_seconds.get_or_create(&label).set(s);
        }
    }

    /// Counts a fencing.
    pub fn fenced(&self) {
        self.fenced.inc();
    }

    /// Counts a start of a hosted control plane.
    pub fn started(&self) {
        self.starts.inc();
    }

    /// Refreshes the gauges from the node.
    pub fn observe(&self, v: &NodeView, serving: usize) {
        self.is_leader
            .set(i64::from(v.role == raft::StateRole::Leader));
        self.term.set(v.term as i64);
        self.commit_index.set(v.commit as i64);
        self.applied_index.set(v.applied as i64);
        let up = v
            .state
            .members
            .iter()
            .filter(|m| m.state == MemberState::Up)
            .count();
        self.members_up.set(up as i64);
        self.members_down.set((v.state.members.len() - up) as i64);
        self.log_entries.set(v.log_entries as i64);
        self.serving.set(serving as i64);
        self.open_operations.set(
            v.state
                .operations
                .iter()
                .filter(|o| !o.step.is_finished())
                .count() as i64,
        );
    }

    /// Sets the expiry gauges to exactly `certs` (a shoot that moved away
    /// drops out); unreadable certificates have no sample.
    pub fn certificates(&self, certs: &[crate::certs::CertificateStatus]) {
        self.cert_expiry.clear();
        for c in certs {
            if let Some(t) = c.not_after_unix {
                let label = [("owner", c.owner.clone()), ("name", c.name.clone())];
                self.cert_expiry.get_or_create(&label).set(t);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves `GET /metrics` until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    render: impl Fn() -> String + Send + Sync + 'static,
    stop: CancellationToken,
) -> Result<(), RingError> {
    let render = std::sync::Arc::new(render);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    render(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
        .map_err(|source| RingError::Io {
            what: "serving /metrics".into(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::CertificateStatus;

    fn cert(owner: &str, name: &str, not_after: Option<i64>) -> CertificateStatus {
        CertificateStatus {
            owner: owner.into(),
            name: name.into(),
            source: String::new(),
            not_after_unix: not_after,
            serial: None,
            error: not_after.is_none().then(|| "cannot read".into()),
        }
    }

    #[test]
    fn certificate_expiry_gauges_follow_the_latest_list() {
        let m = Metrics::new("m1");
        m.certificates(&[
            cert("ring", "ca", Some(2_000_000_000)),
            cert("shoot s2", "kube-apiserver", Some(1_900_000_000)),
            cert("shoot s2", "admin", None),
        ]);
        let out = m.encode();
        let line = |owner: &str, name: &str, v: i64| {
            format!("ringd_certificate_expiration_timestamp_seconds{{member=\"m1\",owner=\"{owner}\",name=\"{name}\"}} {v}")
        };
        assert!(out.contains(&line("ring", "ca", 2_000_000_000)), "{out}");
        assert!(
            out.contains(&line("shoot s2", "kube-apiserver", 1_900_000_000)),
            "{out}"
        );
        assert!(!out.contains("name=\"admin\""), "{out}");
        // the shoot moved away: its certificates leave the metrics
        m.certificates(&[cert("ring", "ca", Some(2_000_000_000))]);
        let out = m.encode();
        assert!(!out.contains("shoot s2"), "{out}");
    }
}
