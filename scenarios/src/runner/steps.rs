//! The named steps of one drill run ([`super::run`]): the sandbox, the
//! network, the ring's config, its bootstrap, the faults on their timeline,
//! the wait for convergence, and the figures read back per shoot.

use std::path::Path;

use super::*;

/// The run's sandbox dir (absolute) and the ring's layout in it.
pub(super) fn sandbox(
    drill: &Drill,
    opts: &RunOptions,
) -> Result<(PathBuf, RingLayout), ScenarioError> {
    // short: a Kubernetes member's node lives three levels down, and its
    // kubelet's sockets must fit in 107 bytes (NodeConfig::validate says so)
    let dir = opts.work_dir.join(format!(
        "ring-drill-{}-{}-{}",
        short_name(&drill.name),
        std::process::id(),
        now_ms() % 1_000_000
    ));
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let dir = dir
        .canonicalize()
        .map_err(io(format!("resolving {}", dir.display())))?;
    let layout = RingLayout {
        dir: dir.join("ring"),
    };
    Ok((dir, layout))
}

/// The relays of members' own shoots into their namespaces, each told
/// whether its shoot runs elsewhere.
pub(super) type OwnPlaced = BTreeMap<String, tokio::sync::watch::Sender<bool>>;

/// With `ring.network: namespaces`, a namespace per member with every
/// shoot's API forwarded into it (until `forwarding` is cancelled).
pub(super) async fn drill_network(
    drill: &Drill,
    members: &[String],
    net_seed: u8,
    forwarding: &CancellationToken,
) -> Result<(Option<Arc<Network>>, OwnPlaced), ScenarioError> {
    let mut own_placed = BTreeMap::new();
    if drill.ring.network == NetworkKind::Loopback {
        return Ok((None, own_placed));
    }
    let net = Arc::new(Network::create(members, net_seed)?);
    for m in members {
        let ep = seed::ShootEndpoint::for_shoot(m);
        let ep = std::net::SocketAddr::from((ep.address, ep.api_port));
        net.forward(ep, m, forwarding.clone()).await?;
        if drill.ring.hosting == Hosting::SelfHosted {
            let (placed, elsewhere) = tokio::sync::watch::channel(false);
            net.forward_own(ep, m, elsewhere, forwarding.clone())?;
            own_placed.insert(m.clone(), placed);
        }
    }
    Ok((Some(net), own_placed))
}

/// The Ring config the drill's ring is bootstrapped from.
pub(super) fn ring_config(
    drill: &Drill,
    kube_specs: &BTreeMap<String, bootstrap::config::SeedSpec>,
    network: Option<&Network>,
    bucket_url: &str,
    ports: Ports,
) -> RingConfig {
    let members = drill.members();
    let spec_of = |m: &String| {
        let mut spec = MemberSpec::local(m);
        if let Some(seed) = kube_specs.get(m) {
            spec.seed = seed.clone();
        }
        if let Some(h) = network.and_then(|n| n.hosts().iter().find(|h| h.member == *m)) {
            spec.address = Some(h.address.to_string());
            spec.netns = Some(h.netns.clone());
        }
        spec
    };
    RingConfig {
        name: drill.name.clone(),
        members: members.iter().map(spec_of).collect(),
        bucket: Some(bucket_url.to_string()),
        // the self-hosted ring: a node per member, each hosting its successor
        // as pods there; process-hosted rings have nodes only with Kubernetes seeds
        nodes: bootstrap::config::Nodes {
            per_member: u8::from(drill.ring.hosting == Hosting::SelfHosted),
        },
        self_hosting: bootstrap::config::SelfHosting {
            members: match drill.ring.hosting {
                Hosting::SelfHosted => members.clone(),
                Hosting::Processes => Vec::new(),
            },
        },
        ports,
        protection: drill.ring.protection,
        timing: drill.ring.timing,
        ..RingConfig::default()
    }
}

/// Bootstraps the ring and waits (at most 120 s) until every shoot has a
/// durable backup; the seconds it took.
pub(super) async fn bootstrap_ring(
    drill: &Drill,
    opts: &RunOptions,
    layout: &RingLayout,
    config: &RingConfig,
) -> Result<f64, ScenarioError> {
    let setup = Instant::now();
    let boot = BootstrapOptions {
        config: Some(config.clone()),
        dir: layout.dir.clone(),
        ringd: opts.ringd.clone(),
        timeout: bootstrap_bound(drill),
        generate_bucket_key: true,
    };
    bootstrap::bootstrap(&boot, &Quiet).await?;
    // every shoot backed up before the chaos begins
    let backed_up = Instant::now() + Duration::from_secs(120);
    loop {
        let s = bootstrap::ring_status(layout, config).await?;
        let backed = |m: &String| {
            s.placements
                .iter()
                .any(|p| p.shoot == *m && p.last_backup_revision.is_some())
        };
        if config.members.iter().map(|m| &m.name).all(backed) {
            return Ok(setup.elapsed().as_secs_f64());
        }
        if Instant::now() >= backed_up {
            return Err(ScenarioError::Setup(
                "not every shoot reported a durable backup within 120s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Copies of the kubeconfigs as the ring first published them (they must
/// keep working through every fault): (shoot, copy).
pub(super) fn keep_kubeconfigs(
    dir: &Path,
    layout: &RingLayout,
    members: &[String],
) -> Result<Vec<(String, PathBuf)>, ScenarioError> {
    let kc_dir = dir.join("kubeconfigs");
    std::fs::create_dir_all(&kc_dir).map_err(io("creating the kubeconfig folder"))?;
    let mut shoots = Vec::new();
    for m in members {
        let to = kc_dir.join(format!("{m}.kubeconfig"));
        std::fs::copy(layout.kubeconfig(m), &to)
            .map_err(io(format!("copying {m}'s kubeconfig")))?;
        shoots.push((m.clone(), to));
    }
    Ok(shoots)
}

/// How the faults went: the first that failed ends the list.
pub(super) struct FaultsOutcome {
    pub(super) failures: Vec<String>,
    /// When the first fault began (s since the run's start).
    pub(super) first_t: Option<f64>,
    /// When the last one ended.
    pub(super) last_t: f64,
}

impl Run<'_> {
    /// Waits for each fault's moment and condition, then does it; every
    /// fault goes on the timeline, a failed one ends the list.
    pub(super) async fn inject_faults(&mut self, obs: &Observer) -> FaultsOutcome {
        let mut out = FaultsOutcome {
            failures: Vec::new(),
            first_t: None,
            last_t: 0.0,
        };
        let drill = self.drill;
        for (i, f) in drill.faults.iter().enumerate() {
            let waited = self.wait_for_fault(f, obs).await;
            // a fault is placed on the timeline when it began
            let t = self.t();
            let outcome = match waited {
                Ok(()) => self.act(&f.action, obs).await,
                Err(e) => Err(e),
            };
            out.first_t.get_or_insert(t);
            out.last_t = self.t();
            let member = match f.action {
                Action::KillSeed { .. }
                | Action::KillMachine { .. }
                | Action::StallRingd { .. } => self.last_killed.clone(),
                Action::Partition { .. } => self.last_partitioned.clone(),
                _ => None,
            };
            let name = f.action.name();
            let detail = match outcome {
                Ok(detail) => {
                    (self.say)(&format!("  {t:>6.1}s  fault {name}: {detail}"));
                    detail
                }
                Err(e) => {
                    (self.say)(&format!("  {t:>6.1}s  fault {name} FAILED: {e}"));
                    out.failures.push(format!("faults[{i}] ({name}): {e}"));
                    format!("failed: {e}")
                }
            };
            let action = name.into();
            obs.push(
                t,
                EventKind::Fault {
                    action,
                    detail,
                    member,
                },
            );
            if !out.failures.is_empty() {
                break;
            }
        }
        out
    }

    async fn wait_for_fault(
        &self,
        f: &crate::drill::Fault,
        obs: &Observer,
    ) -> Result<(), ScenarioError> {
        if let Some(at) = f.at {
            tokio::time::sleep_until((self.t0 + at).into()).await;
        }
        if let Some(when) = f.when {
            self.wait_when(when, obs).await?;
        }
        if let Some(after) = f.after {
            tokio::time::sleep(after).await;
        }
        Ok(())
    }

    /// Waits (until the deadline) for the ring's shape, every API answering
    /// and, on the self-hosted ring, every node Ready; the seconds after the
    /// last fault it took.
    pub(super) async fn await_convergence(
        &self,
        obs: &Observer,
        probes: &Probes,
        last_fault_t: f64,
    ) -> Option<f64> {
        let mut converged_secs = None;
        while !self.remaining().is_zero() {
            let shape = obs.status().is_some_and(|s| converged(&s, &self.members));
            let nodes = bootstrap::nodes::all_ready(&self.layout, &self.config);
            if shape && self.members.iter().all(|m| probes.up(m)) && nodes {
                converged_secs = Some(self.t() - last_fault_t);
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        (self.say)(&format!(
            "  {:>6.1}s  {}",
            self.t(),
            converged_secs.map_or(
                "the ring did not converge before the deadline".to_string(),
                |c| format!("converged {c:.1}s after the last fault")
            )
        ));
        converged_secs
    }

    /// The notable lines of every member's ringd log, on the timeline.
    pub(super) fn push_notable_logs(&self, obs: &Observer, started_at_ms: u64) {
        let mut patterns: Vec<&str> = procs::NOTABLE.to_vec();
        patterns.extend(self.drill.expect.logged.iter().map(String::as_str));
        for m in &self.members {
            let Ok(text) = std::fs::read_to_string(self.layout.log(m)) else {
                continue;
            };
            for (ms, line) in procs::notable_lines(&text, &patterns, 10) {
                let t = (ms - started_at_ms as i64) as f64 / 1000.0;
                let member = m.clone();
                obs.push(t, EventKind::Log { member, line });
            }
        }
    }
}

/// What one shoot went through in a run, to be read back and figured.
pub(super) struct ShootRun<'a> {
    pub(super) shoot: &'a str,
    pub(super) kubeconfig: &'a Path,
    pub(super) log: crate::workload::ShootLog,
    pub(super) losses: Vec<LossPoint>,
    pub(super) samples: Vec<(f64, bool)>,
    pub(super) first_fault: f64,
    /// The workload's start (ms since the Unix epoch): ack times count from it.
    pub(super) started_at_ms: u64,
}

impl ShootRun<'_> {
    /// Reads the shoot's objects back through its original kubeconfig (for
    /// up to 60 s; a failure goes to `failures`) and figures availability,
    /// RTO, acknowledged writes lost and RPO.
    pub(super) async fn figures(
        self,
        events: &[Event],
        failures: &mut Vec<String>,
    ) -> ShootFigures {
        let shoot = self.shoot;
        let deadline = Instant::now() + Duration::from_secs(60);
        let present = loop {
            match read_back(shoot, self.kubeconfig).await {
                Ok(p) => break Some(p),
                Err(e) if Instant::now() >= deadline => {
                    failures.push(format!("shoot {shoot}: cannot read back its objects: {e}"));
                    break None;
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        let reports = crate::result::failover_reports(events, shoot);
        let lost = match &present {
            Some(p) => account(
                &self.log.acks,
                p,
                &self.losses,
                &reports,
                self.started_at_ms,
            ),
            None => Lost::default(),
        };
        let (available, outages) = intervals(&self.samples);
        let rpo_secs = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Loss {
                    shoot: s,
                    durable_age_secs,
                    ..
                } if s == shoot => *durable_age_secs,
                _ => None,
            })
            .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
        ShootFigures {
            shoot: shoot.to_string(),
            available,
            outages,
            rto_secs: rto(&self.samples, self.first_fault),
            acked_writes: self.log.acks.len() as u64,
            failed_writes: self.log.failures,
            lost_writes: lost.lost,
            lost_beyond_durable: lost.excused,
            lost_unreported: lost.unreported,
            lost_examples: lost.examples,
            rpo_revisions: self.rpo_revisions(),
            rpo_secs,
            ring_may_lose_revisions: crate::result::ring_may_lose(events, shoot),
        }
    }

    /// Per loss point, the newest acknowledged revision then against the
    /// bucket's durable one; the largest gap.
    fn rpo_revisions(&self) -> Option<i64> {
        self.losses
            .iter()
            .map(|l| {
                let newest = self
                    .log
                    .acks
                    .iter()
                    .filter(|a| a.at_ms <= l.at_ms)
                    .map(|a| a.resource_version)
                    .max()
                    .unwrap_or(0);
                (newest - l.durable_revision).max(0)
            })
            .max()
    }
}
