//! What a drill run watches while it runs: the ring's view from its leader
//! (leader changes, operation steps), and every shoot's serving control
//! planes (double serving), on a timeline from the run's start.

use super::*;

/// The ring's status as its leader sees it (a just-restarted member's own view
/// may lag behind), bounded to 3 s.
pub(super) async fn leader_view(layout: &RingLayout, config: &RingConfig) -> Option<RingStatus> {
    let s = tokio::time::timeout(
        Duration::from_secs(3),
        bootstrap::ring_status(layout, config),
    )
    .await
    .ok()?
    .ok()?;
    (s.leader.as_deref() == Some(s.member.as_str())).then_some(s)
}

/// What the observer tasks share with the runner.
#[derive(Default)]
pub(super) struct Observed {
    status: Option<RingStatus>,
    pub(super) events: Vec<Event>,
    pub(super) double: Vec<DoubleServing>,
}

pub(super) struct Observer {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub(super) state: Arc<Mutex<Observed>>,
}

impl Observer {
    /// Observes the ring in `ring_dir` (and the pods of the nodes in
    /// `pod_nodes`: (member, pod cgroup root)) from `t0` on.
    pub(super) fn start(
        ring_dir: PathBuf,
        pod_nodes: Vec<(String, String)>,
        layout: RingLayout,
        config: RingConfig,
        t0: Instant,
    ) -> Observer {
        let stop = CancellationToken::new();
        let state: Arc<Mutex<Observed>> = Arc::default();
        // the double-serving checker: every seed's processes (local ones and
        // those in the pods of Kubernetes seeds' nodes), every 200 ms
        let checker = {
            let (stop, state) = (stop.clone(), state.clone());
            tokio::spawn(async move {
                let mut last: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                loop {
                    let (dir, nodes) = (ring_dir.clone(), pod_nodes.clone());
                    let now = tokio::task::spawn_blocking(move || {
                        let mut all = procs::control_planes(&dir);
                        for (shoot, members) in procs::pod_control_planes(&nodes) {
                            all.entry(shoot).or_default().extend(members);
                        }
                        all
                    })
                    .await
                    .unwrap_or_default();
                    let t = t0.elapsed().as_secs_f64();
                    {
                        let mut st = lock(&state);
                        let shoots: BTreeSet<&String> = now.keys().chain(last.keys()).collect();
                        for shoot in shoots {
                            let members = now.get(shoot).cloned().unwrap_or_default();
                            if last.get(shoot).cloned().unwrap_or_default() != members {
                                st.events.push(Event {
                                    t,
                                    kind: EventKind::Serving {
                                        shoot: shoot.clone(),
                                        members: members.iter().cloned().collect(),
                                    },
                                });
                            }
                            if members.len() > 1 {
                                st.double.push(DoubleServing {
                                    t,
                                    shoot: shoot.clone(),
                                    members: members.into_iter().collect(),
                                });
                            }
                        }
                    }
                    last = now;
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            })
        };
        // the ring's view: leader changes and operation steps
        let watcher = {
            let (stop, state) = (stop.clone(), state.clone());
            tokio::spawn(async move {
                let mut leader: Option<Option<String>> = None;
                let mut seen: BTreeSet<(u64, String)> = BTreeSet::new();
                loop {
                    let status = tokio::time::timeout(
                        Duration::from_secs(3),
                        bootstrap::ring_status(&layout, &config),
                    )
                    .await;
                    let t = t0.elapsed().as_secs_f64();
                    {
                        let mut st = lock(&state);
                        // no answer within the bound (members restarting) is no
                        // evidence of a leaderless ring; only an answer saying so is
                        if let Ok(Ok(s)) = status {
                            if leader.as_ref() != Some(&s.leader) {
                                leader = Some(s.leader.clone());
                                st.events.push(Event {
                                    t,
                                    kind: EventKind::Leader {
                                        leader: s.leader.clone(),
                                    },
                                });
                            }
                            for o in &s.operations {
                                let step = format!("{:?}", o.step);
                                if seen.insert((o.id, step.clone())) {
                                    st.events.push(Event {
                                        t,
                                        kind: EventKind::Operation {
                                            id: o.id,
                                            kind: if o.is_migration() {
                                                "migration".into()
                                            } else {
                                                "failover".into()
                                            },
                                            shoot: o.shoot().into(),
                                            from: o.source().into(),
                                            to: o.target().into(),
                                            step,
                                            detail: o.detail.clone(),
                                            may_lose_revisions: o
                                                .outcome
                                                .as_ref()
                                                .and_then(|x| x.may_lose_revisions),
                                            reported: reported(o),
                                        },
                                    });
                                }
                            }
                            // only the leader's view is complete (placements, health)
                            if s.leader.as_deref() == Some(s.member.as_str()) {
                                st.status = Some(s);
                            }
                        }
                    }
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(300)) => {}
                    }
                }
            })
        };
        Observer {
            stop,
            tasks: vec![checker, watcher],
            state,
        }
    }

    /// Whether `member` served `shoot`'s control plane at the checker's
    /// last look (its processes or pods).
    pub(super) fn serves(&self, shoot: &str, member: &str) -> bool {
        let st = lock(&self.state);
        st.events
            .iter()
            .rev()
            .find_map(|e| match &e.kind {
                EventKind::Serving { shoot: s, members } if s == shoot => Some(members),
                _ => None,
            })
            .is_some_and(|members| members.iter().any(|m| m == member))
    }

    pub(super) fn status(&self) -> Option<RingStatus> {
        lock(&self.state).status.clone()
    }

    pub(super) fn push(&self, t: f64, kind: EventKind) {
        lock(&self.state).events.push(Event { t, kind });
    }

    pub(super) async fn stop(self) -> Observed {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *lock(&self.state))
    }
}

/// The member hosting `shoot`'s control plane, as the ring last reported.
pub(super) fn host_of(obs: &Observer, shoot: &str) -> Option<String> {
    obs.status()?
        .placements
        .iter()
        .find(|p| p.shoot == shoot)
        .map(|p| p.host.clone())
}

/// The shoots `member` hosts, as the ring last reported.
pub(super) fn hosted_by(obs: &Observer, member: &str) -> Vec<String> {
    obs.status()
        .map(|s| {
            s.placements
                .iter()
                .filter(|p| p.host == member)
                .map(|p| p.shoot.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// What a finished operation reported of its loss beyond the count: the
/// old host's unheard time ends where the ring judged its lease over.
fn reported(o: &ringd::state::Operation) -> Option<crate::lost::Reported> {
    let out = o.outcome.as_ref()?;
    Some(crate::lost::Reported {
        restored_revision: out.restored_revision,
        unheard_until_ms: out.unheard_ms.and(o.old_lease_over_ms()),
    })
}
