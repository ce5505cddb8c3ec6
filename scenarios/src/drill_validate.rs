//! [`Drill::validate`]: every field checked, each error naming its path.

use std::time::Duration;

use super::*;

impl Drill {
    /// Checks every field; errors name the field and what is wrong.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.validate_ring()?;
        self.validate_kubernetes_members()?;
        self.validate_workload()?;
        self.validate_faults()?;
        self.validate_expect()?;
        self.validate_hosting()
    }

    fn validate_ring(&self) -> Result<(), ScenarioError> {
        if self.api_version != API_VERSION {
            return Err(bad(
                "apiVersion",
                format!("must be {API_VERSION}, not {:?}", self.api_version),
            ));
        }
        if self.kind != "Drill" {
            return Err(bad("kind", format!("must be Drill, not {:?}", self.kind)));
        }
        seed::validate_shoot_name(&self.name).map_err(|e| bad("name", e.to_string()))?;
        let n = self.ring.members;
        if !(3..=7).contains(&n) {
            return Err(bad(
                "ring.members",
                format!("must be between 3 and 7 (a quorum must survive one loss), not {n}"),
            ));
        }
        seed::validate_shoot_name(&format!("{}{n}", self.ring.member_prefix)).map_err(|e| {
            bad(
                "ring.memberPrefix",
                format!("members would be named {}1..: {e}", self.ring.member_prefix),
            )
        })?;
        if let Some(timing) = &self.ring.timing {
            timing
                .validate()
                .map_err(|e| bad("ring.timing", e.to_string()))?;
        }
        if self.ring.network == NetworkKind::Namespaces && self.ring.bucket == BucketKind::S3 {
            return Err(bad(
                "ring.bucket",
                "the S3 server listens on the host's loopback, which member namespaces do not reach: use ring.bucket: file with ring.network: namespaces",
            ));
        }
        Ok(())
    }

    fn validate_workload(&self) -> Result<(), ScenarioError> {
        let w = &self.workload;
        if !(1..=8).contains(&w.writers_per_shoot) {
            return Err(bad("workload.writersPerShoot", "must be between 1 and 8"));
        }
        if !(0.1..=100.0).contains(&w.rate_per_second) {
            return Err(bad(
                "workload.ratePerSecond",
                format!(
                    "must be between 0.1 and 100 writes per second, not {}",
                    w.rate_per_second
                ),
            ));
        }
        if w.kinds.is_empty() {
            return Err(bad(
                "workload.kinds",
                "name at least one of ConfigMap, Secret",
            ));
        }
        if w.update_every < 2 {
            return Err(bad(
                "workload.updateEvery",
                "must be at least 2 (every n-th write is an update)",
            ));
        }
        Ok(())
    }

    /// The faults' timeline (in order, within the deadline) and each action.
    fn validate_faults(&self) -> Result<(), ScenarioError> {
        if self.faults.is_empty() {
            return Err(bad("faults", "a drill needs at least one fault"));
        }
        let deadline = Duration::from_secs(self.expect.deadline_secs);
        let mut last_at = Duration::ZERO;
        for (i, f) in self.faults.iter().enumerate() {
            let field = |f: &str| format!("faults[{i}].{f}");
            if f.at.is_some() && f.when.is_some() {
                return Err(bad(
                    field("at"),
                    "give either `at` (a time) or `when` (a condition), not both",
                ));
            }
            if let Some(at) = f.at {
                if at < last_at {
                    return Err(bad(
                        field("at"),
                        format!(
                            "{} is before an earlier fault's time {}; faults run in order",
                            fmt_dur(at),
                            fmt_dur(last_at)
                        ),
                    ));
                }
                if at >= deadline {
                    return Err(bad(
                        field("at"),
                        format!(
                            "{} is not before the drill's deadline of {}s (expect.deadlineSecs)",
                            fmt_dur(at),
                            self.expect.deadline_secs
                        ),
                    ));
                }
                last_at = at;
            }
            if f.after.is_some_and(|a| a >= deadline) {
                return Err(bad(
                    field("after"),
                    "is not shorter than the drill's deadline (expect.deadlineSecs)",
                ));
            }
            self.validate_action(i, f)?;
        }
        Ok(())
    }

    /// Fault `i`'s action: ring positions in range, durations positive, and
    /// what the ring's network and bucket must be for it.
    fn validate_action(&self, i: usize, f: &Fault) -> Result<(), ScenarioError> {
        let n = self.ring.members;
        let field = |f: &str| format!("faults[{i}].{f}");
        let position = |p: usize, what: &str| {
            if p == 0 || p > n {
                Err(bad(
                    field(&format!("action.{}.{what}", f.action.name())),
                    format!("ring positions are 1..{n}, not {p}"),
                ))
            } else {
                Ok(())
            }
        };
        let target_position = |target: &Target| match target {
            Target::Member(p) => position(*p, "target.member"),
            Target::HostOf(p) => position(*p, "target.hostOf"),
            _ => Ok(()),
        };
        match &f.action {
            Action::KillSeed { target }
            | Action::KillMachine { target }
            | Action::RestartSeed { target }
            | Action::Partition { target } => target_position(target)?,
            Action::StallRingd { target, r#for } => {
                target_position(target)?;
                if r#for.is_zero() {
                    return Err(bad(field("action.stallRingd.for"), "must be positive"));
                }
            }
            Action::SkewClock { target, offset } => {
                target_position(target)?;
                if clock_offset_secs(offset).is_none() {
                    return Err(bad(
                        field("action.skewClock.offset"),
                        "a signed number of seconds within a day, such as +5s or -5s",
                    ));
                }
            }
            Action::FullSnapshot { shoot } | Action::CorruptNewestSnapshot { shoot } => {
                position(*shoot, "shoot")?
            }
            Action::StopBucket { r#for } if r#for.is_zero() => {
                return Err(bad(field("action.stopBucket.for"), "must be positive"));
            }
            Action::StopBucket { .. }
            | Action::RestoreFromBucket {}
            | Action::LoseRing {}
            | Action::Heal {} => {}
        }
        self.validate_action_fits_ring(i, f)
    }

    /// What fault `i`'s action needs of the ring: its network, its bucket,
    /// or a fault before it.
    fn validate_action_fits_ring(&self, i: usize, f: &Fault) -> Result<(), ScenarioError> {
        let name = f.action.name();
        let needs = match &f.action {
            Action::Partition { .. } if self.ring.network != NetworkKind::Namespaces => {
                "cuts a member's network link: set ring.network: namespaces (needs root)"
            }
            Action::FullSnapshot { .. } if self.ring.network == NetworkKind::Namespaces => {
                "reads etcd on the shoot's loopback address, which only its seed's namespace reaches: use ring.network: loopback"
            }
            Action::CorruptNewestSnapshot { .. } if self.ring.bucket != BucketKind::File => {
                "damages an object in a file:// bucket: set ring.bucket: file"
            }
            Action::StopBucket { .. } if self.ring.bucket != BucketKind::S3 => {
                "only an S3 bucket can be stopped: set ring.bucket: s3"
            }
            Action::RestoreFromBucket {}
                if !self.faults[..i]
                    .iter()
                    .any(|f| matches!(f.action, Action::LoseRing {})) =>
            {
                "restores a lost ring: put a loseRing fault before it"
            }
            _ => return Ok(()),
        };
        Err(bad(format!("faults[{i}].action.{name}"), needs))
    }

    fn validate_expect(&self) -> Result<(), ScenarioError> {
        if self.expect.max_rto_secs.is_nan() || self.expect.max_rto_secs <= 0.0 {
            return Err(bad("expect.maxRtoSecs", "must be positive"));
        }
        if let Some(i) = self.expect.logged.iter().position(|t| t.trim().is_empty()) {
            return Err(bad(format!("expect.logged[{i}]"), "must not be empty"));
        }
        if self.expect.deadline_secs < 30 {
            return Err(bad("expect.deadlineSecs", "must be at least 30"));
        }
        Ok(())
    }

    /// Kubernetes members: positions in the ring, once each, a short ring
    /// name, and no fault that drives local seeds' files.
    fn validate_kubernetes_members(&self) -> Result<(), ScenarioError> {
        let (n, k) = (self.ring.members, &self.ring.kubernetes_members);
        if let Some(p) = k.iter().find(|p| **p == 0 || **p > n) {
            return Err(bad(
                "ring.kubernetesMembers",
                format!("ring positions are 1..{n}, not {p}"),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(p) = k.iter().find(|p| !seen.insert(**p)) {
            return Err(bad(
                "ring.kubernetesMembers",
                format!("names position {p} twice"),
            ));
        }
        let max = seed::kubernetes::MAX_RING_NAME;
        if !k.is_empty() && self.name.len() > max {
            return Err(bad(
                "name",
                format!(
                    "is the ring's name, and a Kubernetes seed's ring name has at most {max} characters \
                     (its namespaces are shoot--<ring>--<shoot>): shorten it or drop ring.kubernetesMembers"
                ),
            ));
        }
        let unsupported = self.faults.iter().position(|f| {
            matches!(
                f.action,
                Action::LoseRing {} | Action::RestoreFromBucket {} | Action::FullSnapshot { .. }
            )
        });
        match unsupported {
            Some(i) if !k.is_empty() => Err(bad(
                format!("faults[{i}].action.{}", self.faults[i].action.name()),
                "is not supported with ring.kubernetesMembers yet (it drives local seeds' files); drop one of them",
            )),
            _ => Ok(()),
        }
    }

    /// What the self-hosted ring does not take (yet): each names the field.
    fn validate_hosting(&self) -> Result<(), ScenarioError> {
        let standby = self.ring.protection == ringd::config::Protection::Standby;
        if standby
            && (self.ring.hosting == Hosting::SelfHosted
                || !self.ring.kubernetes_members.is_empty())
        {
            return Err(bad(
                "ring.protection",
                "standby runs on local seeds only for now: set ring.hosting: processes without kubernetesMembers",
            ));
        }
        if self.ring.hosting != Hosting::SelfHosted {
            return Ok(());
        }
        let processes = "or set ring.hosting: processes";
        if !self.ring.kubernetes_members.is_empty() {
            return Err(bad(
                "ring.kubernetesMembers",
                format!("gives members a seed cluster of their own; on the self-hosted ring (ring.hosting: self, the default) every member hosts as pods on its own shoot's node: drop it {processes}"),
            ));
        }
        let max = seed::kubernetes::MAX_RING_NAME;
        if self.name.len() > max {
            return Err(bad(
                "name",
                format!("is the ring's name, and a self-hosted ring's name has at most {max} characters (namespaces are shoot--<ring>--<shoot>): shorten it {processes}"),
            ));
        }
        Ok(())
    }
}
