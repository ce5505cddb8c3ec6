//! Prometheus metrics of a ringd, served at `/metrics`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
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

    /// Counts a fencing.
    pub fn fenced(&self) {
        self.fenced.inc();
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
