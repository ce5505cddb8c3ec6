//! What each fault of a drill does to the running ring ([`Run::act`]), and
//! the conditions faults wait for.

use super::*;

/// How long a cut member may keep serving: its lease (6 s by default) and
/// the guards' poll, with room for a loaded machine.
const FENCE_BOUND: Duration = Duration::from_secs(20);

impl Run<'_> {
    fn resolve(&mut self, target: Target, obs: &Observer) -> Result<String, ScenarioError> {
        let status = obs.status();
        let need = |what: &str| ScenarioError::Setup(format!("no {what} known to the ring"));
        Ok(match target {
            Target::Member(p) => self.members[p - 1].clone(),
            Target::Leader => status
                .and_then(|s| s.leader)
                .ok_or_else(|| need("leader"))?,
            Target::HostOf(p) => {
                let shoot = &self.members[p - 1];
                host_of(obs, shoot).ok_or_else(|| need(&format!("host of {shoot}")))?
            }
            Target::FailoverTarget => status
                .and_then(|s| {
                    s.operations
                        .iter()
                        .rev()
                        .find(|o| !o.is_migration())
                        .map(|o| o.target().to_string())
                })
                .ok_or_else(|| need("failover"))?,
            Target::LastKilled => self
                .last_killed
                .clone()
                .ok_or_else(|| need("killed member"))?,
            Target::Random => {
                let live: Vec<String> = self
                    .members
                    .iter()
                    .filter(|m| self.layout.running_pid(m).is_some())
                    .cloned()
                    .collect();
                if live.is_empty() {
                    return Err(need("live member"));
                }
                live[self.rng.below(live.len())].clone()
            }
        })
    }

    /// Records the loss of `shoots`' control planes, with what the bucket had durable.
    async fn record_losses(&mut self, shoots: &[String], obs: &Observer) {
        let at_ms = self.t0.elapsed().as_millis() as u64;
        let t = self.t();
        for shoot in shoots {
            let (rev, age) = durable(&self.bucket, shoot, self.deadline).await;
            self.losses
                .entry(shoot.clone())
                .or_default()
                .push(LossPoint {
                    at_ms,
                    durable_revision: rev.unwrap_or(0),
                });
            obs.push(
                t,
                EventKind::Loss {
                    shoot: shoot.clone(),
                    durable_revision: rev,
                    durable_age_secs: age,
                },
            );
        }
    }

    pub(super) async fn wait_when(&self, when: When, obs: &Observer) -> Result<(), ScenarioError> {
        loop {
            let s = obs.status();
            let ok = s.as_ref().is_some_and(|s| match when {
                When::FailoverStep(step) => failover_reached(s, self.last_kill_ms, step),
                When::TargetServes => target_serves(s, self.last_kill_ms),
                When::Converged => converged(s, &self.members),
            });
            if ok {
                return Ok(());
            }
            if self.remaining().is_zero() {
                return Err(ScenarioError::Setup(format!(
                    "timed out waiting for {when:?} (expect.deadlineSecs {})",
                    self.drill.expect.deadline_secs
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `killMachine`: the member's ringd, every process it runs and its
    /// shoot's nodes with every pod on them, at once.
    async fn kill_machine(
        &mut self,
        target: Target,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let m = self.resolve(target, obs)?;
        let hosted = hosted_by(obs, &m);
        self.last_kill_ms = now_ms();
        let procs::MachineKilled {
            processes: k,
            mut nodes,
        } = procs::kill_machine(&self.layout, &self.config, &m).await?;
        if self.kube_seeds.kill_node(&m) {
            nodes.push(format!("{m}'s seed cluster node"));
        }
        self.last_killed = Some(m.clone());
        self.record_losses(&hosted, obs).await;
        let nodes = match nodes.is_empty() {
            true => "no node".to_string(),
            false => format!("nodes {} with every pod on them", nodes.join(", ")),
        };
        Ok(format!(
            "kill -9 of machine {m} (hosting {}): ringd {}, {} processes, {nodes}",
            hosted.join(", "),
            k.ringd.map_or("-".into(), |p| p.to_string()),
            k.processes
        ))
    }

    /// kill -9 of a seed: its ringd, the process groups it runs, a Kubernetes seed's node.
    async fn kill_seed(
        &mut self,
        target: &Target,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let m = self.resolve(*target, obs)?;
        let hosted = hosted_by(obs, &m);
        self.last_kill_ms = now_ms();
        let k = procs::kill_member(&self.layout.dir, &m).await;
        // a Kubernetes seed's machine: its node and pods die too
        let node = match self.kube_seeds.kill_node(&m) {
            true => ", its node and every pod on it",
            false => "",
        };
        self.last_killed = Some(m.clone());
        self.record_losses(&hosted, obs).await;
        Ok(format!(
            "kill -9 {m} (hosting {}): ringd {}, {} process groups, {} processes{node}",
            hosted.join(", "),
            k.ringd.map_or("-".into(), |p| p.to_string()),
            k.process_groups,
            k.processes
        ))
    }

    /// Freezes the target's ringd (SIGSTOP) for `for`, then lets it go on
    /// (SIGCONT). What it hosts may acknowledge writes until its guards fence
    /// it at the lease deadline, after the first loss point: a second one is
    /// taken once it stopped serving, as after a partition. (Taken at the
    /// resume instead, the bucket then held the restored control plane's
    /// revisions, numbered past the stalled one's: a write the stalled
    /// control plane acknowledged 3 s into the stall and never backed up
    /// counted as one that had to survive.)
    async fn stall_ringd(
        &mut self,
        target: &Target,
        r#for: Duration,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let m = self.resolve(*target, obs)?;
        let hosted = hosted_by(obs, &m);
        let pids = procs::ringd_pids(&self.layout.dir, &m);
        if pids.is_empty() {
            return Err(ScenarioError::Setup(format!("{m} runs no ringd to stop")));
        }
        let resume_at = Instant::now() + r#for.min(self.remaining());
        self.last_kill_ms = now_ms();
        procs::signal_all(&pids, nix::sys::signal::Signal::SIGSTOP);
        self.last_killed = Some(m.clone());
        self.record_losses(&hosted, obs).await;
        // a stall shorter than the lease ends before anything fenced: the
        // same control plane goes on, and its writes must all survive
        let left = resume_at.saturating_duration_since(Instant::now());
        let fenced = match self.wait_until_not_serving(&m, &hosted, left, obs).await {
            Some(took) => {
                self.record_losses(&hosted, obs).await;
                stopped_serving(took)
            }
            None => "it served throughout".to_string(),
        };
        tokio::time::sleep_until(resume_at.into()).await;
        // the pids again: a process that exited meanwhile is not signalled
        let now = procs::ringd_pids(&self.layout.dir, &m);
        procs::signal_all(&now, nix::sys::signal::Signal::SIGCONT);
        Ok(format!(
            "SIGSTOP ringd {m} (hosting {}; pids {pids:?}) for {}, then SIGCONT; {fenced}",
            hosted.join(", "),
            crate::drill::fmt_dur(r#for)
        ))
    }

    /// Restarts the target's ringd under faketime, its clock off by `offset`.
    async fn skew_clock(
        &mut self,
        target: &Target,
        offset: &str,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let m = self.resolve(*target, obs)?;
        let env = procs::faketime_env(offset)?;
        let pids = procs::ringd_pids(&self.layout.dir, &m);
        procs::signal_all(&pids, nix::sys::signal::Signal::SIGKILL);
        let gone = Instant::now() + Duration::from_secs(10);
        while !procs::ringd_pids(&self.layout.dir, &m).is_empty() {
            if Instant::now() > gone {
                return Err(ScenarioError::Setup(format!(
                    "{m}'s ringd did not exit within 10 s of SIGKILL"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bootstrap::start_member_with_env(&self.layout, &self.opts.ringd, &m, &env)?;
        Ok(format!(
            "restarted ringd {m} (pids {pids:?}) with its clock {offset} off (faketime)"
        ))
    }

    /// A killed member comes back: its nodes, then its ringd.
    async fn restart_seed(
        &mut self,
        target: &Target,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let m = self.resolve(*target, obs)?;
        // a machine of the self-hosted ring comes back with its nodes
        let started = bootstrap::start_member_nodes(&self.layout, &self.opts.ringd, &m)?;
        // a Kubernetes seed's machine comes back with its node first
        let node = match self.kube_seeds.revive_member(&m).await? {
            true => " and its node (its pods recreated by kubelet)",
            false => "",
        };
        bootstrap::start_member(&self.layout, &self.opts.ringd, &m)?;
        let nodes = match started.is_empty() {
            true => String::new(),
            false => format!(" and its nodes {}", started.join(", ")),
        };
        Ok(format!("started ringd {m}{node}{nodes} again"))
    }

    /// Cuts a member's link on the drill network.
    async fn partition(
        &mut self,
        target: &Target,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let network = self.network.clone().ok_or_else(|| {
            ScenarioError::Setup("partition needs ring.network: namespaces".into())
        })?;
        let m = self.resolve(*target, obs)?;
        let hosted = hosted_by(obs, &m);
        self.last_kill_ms = now_ms();
        network.cut(&m)?;
        self.last_partitioned = Some(m.clone());
        // what it hosts may move away: writes it acknowledges from now on
        // count as lost only beyond what reached the bucket
        self.record_losses(&hosted, obs).await;
        // clients on its side of the cut (the runner's relays reach every
        // namespace) keep writing to it until its guards fence it at the
        // lease's end: a second loss point once it stopped serving, as after
        // a stall: a write the cut member acknowledges after the cut and
        // never backs up must not count as one that had to survive
        let fenced = match self
            .wait_until_not_serving(&m, &hosted, FENCE_BOUND, obs)
            .await
        {
            Some(took) => stopped_serving(took),
            None => format!("it still served after {FENCE_BOUND:?}"),
        };
        self.record_losses(&hosted, obs).await;
        Ok(format!(
            "cut {m} (hosting {}) off from the other members; {fenced}",
            hosted.join(", ")
        ))
    }

    /// Waits (at most `bound`) until `member` serves none of `shoots`: how
    /// long that took, or `None` if it still served at the bound.
    async fn wait_until_not_serving(
        &self,
        member: &str,
        shoots: &[String],
        bound: Duration,
        obs: &Observer,
    ) -> Option<Duration> {
        let began = Instant::now();
        let bound = bound.min(self.remaining());
        while shoots.iter().any(|s| obs.serves(s, member)) {
            if began.elapsed() >= bound {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Some(began.elapsed())
    }

    /// A full snapshot of a shoot now, next to the continuous backup.
    async fn full_snapshot(
        &mut self,
        shoot: &usize,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        let shoot = self.members[shoot - 1].clone();
        let host = host_of(obs, &shoot)
            .ok_or_else(|| ScenarioError::Setup(format!("no host of {shoot} known")))?;
        let shoot_layout = seed::ShootLayout {
            dir: self.layout.seed_dir(&host).join("shoots").join(&shoot),
        };
        let spec = shoot_layout
            .read_spec()
            .ok()
            .flatten()
            .ok_or_else(|| ScenarioError::Setup(format!("{host} holds no spec of {shoot}")))?;
        let mut etcd = backup::EtcdConfig::for_local_shoot(&shoot_layout, &spec);
        let hosting = if bootstrap::selfhost::hosts_as_pods(&self.layout, &host) {
            // in pods on the host's node: its etcd pod, reached by pod IP
            etcd.endpoints = vec![self.etcd_pod_url(&host, &shoot).await?];
            etcd.server_name = Some("localhost".into());
            "pods on"
        } else {
            "processes on"
        };
        let mut config = backup::BackupConfig::new(shoot.clone(), etcd, self.bucket.clone());
        // sealed with the ring's bucket key, as its own backup would be: a
        // keyed bucket's restore leaves a plaintext object out (not trusted)
        let key = self.layout.bucket_key();
        if key.exists() {
            config.encryption = Some(backup::config::EncryptionConfig {
                key_file: Some(key),
                ..Default::default()
            });
        }
        // written at the host's epoch, as its own backup would be
        let epoch = obs
            .status()
            .and_then(|s| s.placements.into_iter().find(|p| p.shoot == shoot))
            .map_or(0, |p| p.epoch);
        let snap = backup::snapshot_once(&config, epoch)
            .await
            .map_err(|e| ScenarioError::Setup(format!("full snapshot of {shoot}: {e}")))?;
        Ok(format!(
            "full snapshot of {shoot} (in {hosting} {host}) at revision {}",
            snap.base_revision
        ))
    }

    /// The client URL of the etcd pod of `shoot` in `host`'s shoot.
    async fn etcd_pod_url(&self, host: &str, shoot: &str) -> Result<String, ScenarioError> {
        let failed = |e: seed::SeedError| {
            ScenarioError::Setup(format!("finding {shoot}'s etcd pod in shoot {host}: {e}"))
        };
        let client = seed::kubeconfig::client(host, &self.layout.kubeconfig(host))
            .await
            .map_err(failed)?;
        seed::kubernetes::etcd_pod_url(&client, &self.config.name, shoot)
            .await
            .map_err(failed)?
            .ok_or_else(|| {
                ScenarioError::Setup(format!(
                    "shoot {host} has no Running etcd pod of {shoot} with an address"
                ))
            })
    }

    /// Flips a byte of a shoot's newest full snapshot in the bucket.
    fn corrupt_newest_snapshot(&mut self, shoot: &usize) -> Result<String, ScenarioError> {
        let shoot = &self.members[shoot - 1];
        let dir = self.bucket_dir.join(shoot);
        let newest = std::fs::read_dir(&dir)
            .map_err(io(format!("listing {}", dir.display())))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("full-"))
            .max()
            .ok_or_else(|| {
                ScenarioError::Setup(format!("{} holds no full snapshot", dir.display()))
            })?;
        let path = dir.join(&newest);
        let mut data = std::fs::read(&path).map_err(io(format!("reading {}", path.display())))?;
        if data.is_empty() {
            return Err(ScenarioError::Setup(format!("{} is empty", path.display())));
        }
        let at = self.rng.below(data.len());
        data[at] ^= 0xff;
        std::fs::write(&path, &data).map_err(io(format!("writing {}", path.display())))?;
        Ok(format!("flipped byte {at} of {shoot}/{newest}"))
    }

    /// Stops the S3 server; a task starts it again after the outage.
    fn stop_bucket(&mut self, r#for: &Duration, obs: &Observer) -> Result<String, ScenarioError> {
        let server = self
            .s3
            .clone()
            .ok_or_else(|| ScenarioError::Setup("stopBucket needs ring.bucket: s3".into()))?;
        let port = {
            let mut s = lock(&server);
            s.stop();
            s.port
        };
        let (outage, state, t0) = (*r#for, obs.state.clone(), self.t0);
        tokio::spawn(async move {
            tokio::time::sleep(outage).await;
            let back = tokio::task::spawn_blocking(move || lock(&server).restart()).await;
            let detail = match back {
                Ok(Ok(())) => format!(
                    "the S3 server is back after {}",
                    crate::drill::fmt_dur(outage)
                ),
                Ok(Err(e)) => format!("failed: {e}"),
                Err(e) => format!("failed: {e}"),
            };
            lock(&state).events.push(Event {
                t: t0.elapsed().as_secs_f64(),
                kind: EventKind::Fault {
                    action: "bucketBack".into(),
                    detail,
                    member: None,
                },
            });
        });
        Ok(format!(
            "stopped the S3 server on port {port} for {}",
            crate::drill::fmt_dur(outage)
        ))
    }

    /// Every member's machine killed (ringd, nodes, every pod) and the ring's
    /// dir deleted; the bucket survives.
    async fn lose_ring(&mut self, obs: &Observer) -> Result<String, ScenarioError> {
        self.last_kill_ms = now_ms();
        let (mut killed, mut nodes) = (0, Vec::new());
        for m in self.members.clone() {
            let k = procs::kill_machine(&self.layout, &self.config, &m).await?;
            killed += k.processes.processes;
            nodes.extend(k.nodes);
        }
        // the node network outlives the machines (it is this one's): remove it
        if let Ok(Some(net)) = bootstrap::nodes::network(&self.layout, &self.config) {
            let _ = tokio::task::spawn_blocking(move || net.remove()).await;
        }
        // the user's copy of the bucket key, kept off the lost machine
        let key = self.layout.bucket_key();
        if key.exists() {
            std::fs::copy(&key, self.bucket_key_copy())
                .map_err(io(format!("copying {}", key.display())))?;
        }
        std::fs::remove_dir_all(&self.layout.dir)
            .map_err(io(format!("removing {}", self.layout.dir.display())))?;
        let shoots = self.members.clone();
        self.record_losses(&shoots, obs).await;
        let nodes = match nodes.is_empty() {
            true => String::new(),
            false => format!("; nodes {} with every pod on them", nodes.join(", ")),
        };
        Ok(format!(
            "killed every member ({killed} processes{nodes}) and deleted {}; the bucket {} survives",
            self.layout.dir.display(),
            self.bucket.url
        ))
    }

    /// Where [`lose_ring`](Self::lose_ring) keeps the user's copy of the bucket key.
    fn bucket_key_copy(&self) -> std::path::PathBuf {
        self.config_file.with_file_name("bucket-key-copy")
    }

    /// `ringctl restore --from-bucket` of the lost ring (with the user's copy
    /// of the bucket key, when bootstrap generated one).
    async fn restore_from_bucket(&mut self) -> Result<String, ScenarioError> {
        let started = Instant::now();
        let log = self.config_file.with_file_name("restore.log");
        let mut cmd = tokio::process::Command::new(&self.opts.ringctl);
        cmd.args([
            "restore",
            "--output",
            "json",
            "--from-bucket",
            &self.bucket.url,
        ])
        .arg("--config")
        .arg(&self.config_file)
        .arg("--ring-dir")
        .arg(&self.layout.dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
        if self.bucket_key_copy().exists() {
            cmd.arg("--bucket-key").arg(self.bucket_key_copy());
        }
        let out = tokio::time::timeout(self.remaining(), cmd.output())
            .await
            .map_err(|_| {
                ScenarioError::Setup(
                    "ringctl restore did not finish before the drill's deadline".into(),
                )
            })?
            .map_err(io(format!("running {}", self.opts.ringctl.display())))?;
        let mut text = out.stdout.clone();
        text.extend_from_slice(&out.stderr);
        let _ = std::fs::write(&log, &text);
        if !out.status.success() {
            return Err(ScenarioError::Setup(format!(
                "ringctl restore --from-bucket failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let keyed = match self.bucket_key_copy().exists() {
            true => " (sealed: --bucket-key with the user's copy of the key)",
            false => "",
        };
        Ok(format!(
            "ringctl restore --from-bucket {}{keyed} rebuilt the ring in {:.1}s{}",
            self.bucket.url,
            started.elapsed().as_secs_f64(),
            pivots(&out.stdout)
        ))
    }

    /// Reconnects, restarts every dead member and node, and re-links the ring.
    async fn heal(&mut self) -> Result<String, ScenarioError> {
        let started = Instant::now();
        let since_ms = now_ms();
        let reconnected = match &self.network {
            Some(n) => n.heal()?,
            None => Vec::new(),
        };
        // every dead node and member back (bootstrap resumes the ring)
        let nodes = self.kube_seeds.revive().await?;
        bootstrap::bootstrap(&self.bootstrap_options(None), &Quiet).await?;
        // re-link: each member hosts its successor (planned migrations)
        let n = self.members.len();
        loop {
            let status = leader_view(&self.layout, &self.config)
                .await
                .ok_or("no leader view");
            let misplaced = status.as_ref().ok().and_then(|s| {
                (0..n).find_map(|i| {
                    let shoot = &self.members[(i + 1) % n];
                    let want = &self.members[i];
                    s.placements
                        .iter()
                        .any(|p| p.shoot == *shoot && p.host != *want)
                        .then(|| (shoot.clone(), want.clone()))
                })
            });
            let Some((shoot, to)) = misplaced else {
                if status.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            };
            if self.remaining().is_zero() {
                return Err(ScenarioError::Setup(format!(
                    "heal: {shoot} still not on {to} at the deadline"
                )));
            }
            let limit = self.remaining().min(Duration::from_secs(180));
            match bootstrap::migrate_and_wait(&self.layout, &self.config, &shoot, &to, limit).await
            {
                Ok(()) => {}
                Err(e) => {
                    (self.say)(&format!("  heal: moving {shoot} to {to}: {e}; retrying"));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
        // what the ring moved: by bootstrap's plan (self-hosted) or here
        let moved = match leader_view(&self.layout, &self.config).await {
            Some(s) => s
                .operations
                .iter()
                .filter(|o| {
                    o.is_migration() && o.step == OperationStep::Done && o.created_at_ms >= since_ms
                })
                .map(|o| format!("{} {}->{}", o.shoot(), o.source(), o.target()))
                .collect(),
            None => Vec::new(),
        };
        let said = |what: &str, who: &[String]| match who.is_empty() {
            true => String::new(),
            false => format!("{what} {}; ", who.join(", ")),
        };
        Ok(format!(
            "{}{}restarted dead members and re-linked the ring in {:.1}s (moved: {})",
            said("reconnected", &reconnected),
            said("started the nodes of", &nodes),
            started.elapsed().as_secs_f64(),
            if moved.is_empty() {
                "nothing".into()
            } else {
                moved.join(", ")
            }
        ))
    }

    pub(super) async fn act(
        &mut self,
        action: &Action,
        obs: &Observer,
    ) -> Result<String, ScenarioError> {
        match action {
            Action::KillSeed { target } => self.kill_seed(target, obs).await,
            Action::KillMachine { target } => self.kill_machine(*target, obs).await,
            Action::RestartSeed { target } => self.restart_seed(target, obs).await,
            Action::StallRingd { target, r#for } => self.stall_ringd(target, *r#for, obs).await,
            Action::SkewClock { target, offset } => self.skew_clock(target, offset, obs).await,
            Action::Partition { target } => self.partition(target, obs).await,
            Action::FullSnapshot { shoot } => self.full_snapshot(shoot, obs).await,
            Action::CorruptNewestSnapshot { shoot } => self.corrupt_newest_snapshot(shoot),
            Action::StopBucket { r#for } => self.stop_bucket(r#for, obs),
            Action::LoseRing {} => self.lose_ring(obs).await,
            Action::RestoreFromBucket {} => self.restore_from_bucket().await,
            Action::Heal {} => self.heal().await,
        }
    }
}

/// The moves into pods a `ringctl restore --output json` report lists among
/// its steps, as "; then moved dr1 into pods on dr3, ..." (empty when none).
pub(super) fn pivots(report: &[u8]) -> String {
    let Ok(r) = serde_json::from_slice::<serde_json::Value>(report) else {
        return String::new();
    };
    let mut moves: Vec<String> = Vec::new();
    let labels = r["steps"].as_array().into_iter().flatten();
    // moves made together are one step: "move a ...; move b ..."
    let each = labels
        .filter_map(|s| s[0].as_str())
        .flat_map(|l| l.split("; "));
    for l in each {
        // a move waited for in two spells is listed twice
        let Some(m) = l
            .strip_prefix("move ")
            .filter(|l| l.contains(" into pods on "))
        else {
            continue;
        };
        if !moves.iter().any(|x| x == m) {
            moves.push(m.to_string());
        }
    }
    match moves.is_empty() {
        true => String::new(),
        false => format!("; then moved {}", moves.join(", ")),
    }
}

/// Whether the target of a failover started after `since_ms` (as
/// [`failover_reached`] counts them) runs the shoot's control plane while
/// the move is still `Restoring`: the shoot's placement is on the target and
/// the target's health report names the shoot (it serves only once started).
pub fn target_serves(s: &ringd::status::RingStatus, since_ms: u64) -> bool {
    s.operations.iter().any(|o| {
        !o.is_migration()
            && o.created_at_ms + 1000 >= since_ms
            && o.step == ringd::state::OperationStep::Restoring
            && s.placements
                .iter()
                .any(|p| p.shoot == o.shoot() && p.host == o.target() && p.ready.is_some())
    })
}

/// The fault's words for a member that stopped serving `took` after it.
fn stopped_serving(took: Duration) -> String {
    format!("it stopped serving {:.1}s later", took.as_secs_f64())
}
