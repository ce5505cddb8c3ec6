//! The drill file: a ring, a workload, a timeline of faults and the expectations,
//! in one YAML document (unknown keys rejected, every field validated with its path).
//!
//! ```yaml
//! apiVersion: ring.gardener.cloud/v1alpha1
//! kind: Drill
//! name: kill-seed
//! seed: 7                       # the RNG seed: same seed, same chaos (override: --seed)
//! ring: {members: 3, memberPrefix: ks}
//! workload: {writersPerShoot: 1, ratePerSecond: 4}
//! faults:
//!   - at: 10s                   # since the workload started
//!     action: {killSeed: {target: {hostOf: 2}}}
//!   - when: {failoverStep: Done}
//!     after: 3s
//!     action: {heal: {}}
//! expect: {maxRtoSecs: 90, lostWrites: beyondDurable}
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ScenarioError;

/// The `apiVersion` of drill files.
pub const API_VERSION: &str = "ring.gardener.cloud/v1alpha1";

/// One drill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Drill {
    /// Must be `ring.gardener.cloud/v1alpha1`.
    pub api_version: String,
    /// Must be `Drill`.
    pub kind: String,
    /// The drill's name (a DNS label); reports are named after it.
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit. A self-hosted or Kubernetes-seeded drill's name is also its
    /// ring's, which must leave room in 63-character namespaces.
    pub name: String,
    /// Free text for reports.
    #[serde(default)]
    pub description: String,
    /// Seed of the drill's random choices (object kinds, `random` targets, jitter).
    pub seed: u64,
    /// The ring the drill runs on.
    pub ring: RingSpec,
    /// What writes to every shoot during the drill.
    pub workload: Workload,
    /// Executed in order; each waits for the previous one.
    /// At least one. `at` and `when` exclude each other; `at` times must not decrease and
    /// must be before `expect.deadlineSecs`, as must `after`. Ring positions must be
    /// 1..`ring.members`.
    pub faults: Vec<Fault>,
    /// What must hold for the drill to pass.
    pub expect: Expectations,
}

/// The ring the drill runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RingSpec {
    /// Members (3..=7); each hosts its successor's control plane.
    /// Must be from 3 to 7.
    pub members: usize,
    /// Where the control planes run [default: self, the self-hosted ring].
    #[serde(default)]
    pub hosting: Hosting,
    /// Members are named `<prefix>1..<prefix>n`. Shoot endpoints follow from the
    /// names, so drills that may run side by side use different prefixes.
    /// `<prefix><members>` must be a valid member name (a DNS label).
    pub member_prefix: String,
    /// Where the backups go.
    /// `s3` does not work with `network: namespaces`.
    #[serde(default)]
    pub bucket: BucketKind,
    /// How members are separated on this machine.
    #[serde(default)]
    pub network: NetworkKind,
    /// Ring positions (1-based) of members whose seed is a Kubernetes
    /// cluster the runner starts (a control plane and one real node): they
    /// host their successor's control plane as pods. `killSeed` of such a
    /// member kills its node too (its pods die with the machine); `heal`
    /// starts the node again. With `network: namespaces` the member's
    /// namespace reaches its seed cluster by a link of its own (partitions
    /// cut the member off from the ring, not from its cluster).
    /// Positions 1..`members`, each once; only with `hosting: processes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_members: Vec<usize>,
    /// How shoots' etcd is protected [default: backup]; `standby` gives each
    /// a hot standby on the member that would take it over (process-hosted
    /// rings of local seeds).
    /// `standby` only with `hosting: processes` and no `kubernetesMembers`.
    #[serde(default)]
    pub protection: ringd::config::Protection,
    /// The ring's timing (failure window, lease, ...) [default: the ring's
    /// default]; e.g. a longer lease keeps a cut-off host serving, and
    /// backing up, for longer.
    /// Must pass the `Timing` rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<ringd::config::Timing>,
}

/// Where a drill ring's control planes run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum Hosting {
    /// The self-hosted ring: every member's shoot has a real node, and each
    /// member hosts its successor's control plane as pods on that node
    /// (`ringctl bootstrap` pivots the temporary processes into the pods).
    #[default]
    #[serde(rename = "self")]
    SelfHosted,
    /// Control planes as processes next to each ringd, no nodes: quick. The
    /// members in `kubernetesMembers` host as pods on their seed cluster's node.
    #[serde(rename = "processes")]
    Processes,
}

/// How the drill's members are separated.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum NetworkKind {
    /// All members share the host's network namespace (loopback); links cannot be cut.
    #[default]
    Loopback,
    /// Every member in its own network namespace on a bridge the runner creates
    /// (needs root); `partition` cuts a member's link.
    Namespaces,
}

/// The kind of backup bucket the runner provides.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum BucketKind {
    /// A folder next to the ring (`file://`), outside the ring's state dir.
    #[default]
    File,
    /// An S3-compatible server (`s3s-fs`) the runner starts and can stop.
    S3,
}

/// Kubernetes objects the writers create.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

/// Writers creating and updating objects through every shoot's kube-apiserver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// Writers per shoot (1..=8).
    /// Must be from 1 to 8.
    pub writers_per_shoot: u32,
    /// Writes per second of each writer (0.1..=100).
    /// Must be from 0.1 to 100.
    pub rate_per_second: f64,
    /// What the writers create [default: ConfigMap and Secret].
    /// At least one.
    #[serde(default = "default_kinds")]
    pub kinds: Vec<ObjectKind>,
    /// Every n-th write updates the writer's counter object instead of creating one.
    /// Must be at least 2.
    #[serde(default = "default_update_every")]
    pub update_every: u32,
    /// Writing after the last fault once the ring converged, before the check.
    /// A duration.
    #[serde(default = "default_cooldown", with = "dur")]
    #[schemars(with = "String")]
    pub cooldown: Duration,
}

fn default_kinds() -> Vec<ObjectKind> {
    vec![ObjectKind::ConfigMap, ObjectKind::Secret]
}
fn default_update_every() -> u32 {
    4
}
fn default_cooldown() -> Duration {
    Duration::from_secs(5)
}

/// When a fault fires and what it does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    /// Time since the workload started.
    /// A duration.
    #[serde(default, with = "opt_dur", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub at: Option<Duration>,
    /// A condition on the ring, polled after the previous fault.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_yaml::with::singleton_map"
    )]
    #[schemars(with = "Option<When>")]
    pub when: Option<When>,
    /// A delay after `at` / `when` (or after the previous fault when neither is given).
    /// A duration.
    #[serde(default, with = "opt_dur", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub after: Option<Duration>,
    /// What the fault does (one key).
    #[serde(with = "serde_yaml::with::singleton_map_recursive")]
    #[schemars(with = "Action")]
    pub action: Action,
}

/// A condition a fault waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum When {
    /// A failover started after the newest kill (killSeed, killMachine, loseRing) reached this
    /// step (or a later one).
    FailoverStep(Step),
    /// The target of a failover started after the newest kill runs the
    /// restored control plane while the move is still open (started, being
    /// verified): its health report names the shoot.
    TargetServes,
    /// Every member hosts its successor again and every control plane is ready.
    Converged,
}

/// Steps of a failover, in order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum Step {
    WaitingForLeaseExpiry,
    Pending,
    Restoring,
    Done,
}

/// Which member a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Target {
    /// The current Raft leader.
    Leader,
    /// The member at this 1-based ring position.
    Member(usize),
    /// The member hosting the control plane of the shoot at this 1-based ring position.
    HostOf(usize),
    /// The target of the newest failover.
    FailoverTarget,
    /// The member the previous kill hit.
    LastKilled,
    /// A live member, chosen with the drill's RNG.
    Random,
}

/// What a fault does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Action {
    /// kill -9 of a seed: its ringd and the process group of every process it
    /// hosts. On the self-hosted ring: its ringd and the relay of the hosted
    /// shoot's endpoint; the pods on its node keep running until their
    /// guards fence them by the lease.
    KillSeed { target: Target },
    /// A member machine dies as a whole: kill -9 of its ringd, every process
    /// it runs, and its shoot's nodes (ring-node, containerd, kubelet,
    /// kube-proxy, every shim and pod process); for a Kubernetes member, its
    /// seed cluster's node too.
    KillMachine { target: Target },
    /// Starts a killed member's ringd again (its old control planes must stay fenced).
    RestartSeed { target: Target },
    /// SIGSTOP of a seed's ringd (and its supervisor) for `for`, then
    /// SIGCONT: nothing in ringd runs (no lease renewal, no fencing, no
    /// backup of local control planes) while what it hosts keeps running. On
    /// the self-hosted ring the pods' guards fence them at the lease deadline
    /// and the ring fails the shoot over; the resumed ringd must not serve it
    /// again.
    StallRingd {
        target: Target,
        #[serde(with = "dur")]
        #[schemars(with = "String")]
        r#for: Duration,
    },
    /// Runs a member's ringd (and all it starts) with its wall clock off by
    /// `offset` (`+5s`, `-5s`: Debian's faketime): its ringd and supervisor
    /// are killed and started again under faketime. Leases, fences and the
    /// pods' guards must not depend on that clock.
    SkewClock { target: Target, offset: String },
    /// Cuts a member off from every other member and from the runner (its link
    /// on the drill network goes down; it keeps running). Needs `ring.network:
    /// namespaces`. `heal` reconnects it.
    Partition { target: Target },
    /// Takes a full snapshot of a shoot (1-based ring position) now, as
    /// `ringctl backup snapshot` does, next to the continuous backup.
    FullSnapshot { shoot: usize },
    /// Flips a byte in the newest full snapshot of a shoot (1-based ring position)
    /// in the bucket.
    CorruptNewestSnapshot { shoot: usize },
    /// Stops the S3 server for a while (the ring keeps running).
    StopBucket {
        #[serde(with = "dur")]
        #[schemars(with = "String")]
        r#for: Duration,
    },
    /// Loses the whole ring: every member killed, every member dir deleted; the
    /// bucket survives.
    LoseRing {},
    /// `ringctl restore --from-bucket URL --config ring.yaml`.
    RestoreFromBucket {},
    /// Reconnects partitioned members, restarts every dead member and moves every
    /// control plane back to its member's predecessor (planned migrations: no
    /// acknowledged write may be lost).
    Heal {},
}

impl Action {
    /// A short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Action::KillSeed { .. } => "killSeed",
            Action::KillMachine { .. } => "killMachine",
            Action::RestartSeed { .. } => "restartSeed",
            Action::StallRingd { .. } => "stallRingd",
            Action::SkewClock { .. } => "skewClock",
            Action::Partition { .. } => "partition",
            Action::FullSnapshot { .. } => "fullSnapshot",
            Action::CorruptNewestSnapshot { .. } => "corruptNewestSnapshot",
            Action::StopBucket { .. } => "stopBucket",
            Action::LoseRing {} => "loseRing",
            Action::RestoreFromBucket {} => "restoreFromBucket",
            Action::Heal {} => "heal",
        }
    }
}

/// The seconds of a `skewClock` offset (`+5s`, `-2.5s`), if well formed.
pub fn clock_offset_secs(offset: &str) -> Option<f64> {
    let number = offset.strip_suffix('s')?;
    if !number.starts_with(['+', '-']) {
        return None;
    }
    let secs: f64 = number.parse().ok()?;
    (secs.is_finite() && secs != 0.0 && secs.abs() <= 86_400.0).then_some(secs)
}

/// How many acknowledged writes may be lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LostWrites {
    /// None at all.
    None,
    /// Only writes newer than the last durable delta in the bucket when their
    /// control plane was killed.
    BeyondDurable,
}

/// What must hold for the drill to pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expectations {
    /// The longest time any shoot's API may be unavailable.
    /// Must be positive.
    pub max_rto_secs: f64,
    /// How many acknowledged writes may be lost.
    pub lost_writes: LostWrites,
    /// No shoot ever has control-plane processes on two seeds at once.
    #[serde(default = "yes")]
    pub no_double_serving: bool,
    /// The ring ends with every member hosting its successor, all ready.
    #[serde(default = "yes")]
    pub converge: bool,
    /// Bound on the whole drill after the workload started.
    /// Must be at least 30.
    #[serde(default = "default_deadline")]
    pub deadline_secs: u64,
    /// Texts some member's ringd must have logged during the drill (evidence,
    /// e.g. that a corrupt snapshot was detected).
    /// Each must not be empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logged: Vec<String>,
}

fn yes() -> bool {
    true
}
fn default_deadline() -> u64 {
    600
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Drill {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Drill {
    /// Parses and validates a drill file's text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Drill, ScenarioError> {
        let drill: Drill = serde_yaml::from_str(text).map_err(|e| ScenarioError::Drill {
            field: source.to_string(),
            reason: e.to_string(),
        })?;
        drill.validate().map_err(|e| match e {
            ScenarioError::Drill { field, reason } => ScenarioError::Drill {
                field: format!("{source}: {field}"),
                reason,
            },
            other => other,
        })?;
        Ok(drill)
    }

    /// Reads, parses and validates a drill file.
    pub fn load(path: &std::path::Path) -> Result<Drill, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            what: format!("reading drill file {}", path.display()),
            source,
        })?;
        Drill::parse(&text, &path.display().to_string())
    }

    /// Whether the member at ring position `p` (1-based) has a Kubernetes seed.
    pub fn is_kubernetes_member(&self, p: usize) -> bool {
        self.ring.kubernetes_members.contains(&p)
    }

    pub fn members(&self) -> Vec<String> {
        (1..=self.ring.members)
            .map(|i| format!("{}{i}", self.ring.member_prefix))
            .collect()
    }
}

/// Formats a duration the way drill files write them.
pub fn fmt_dur(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Parses `500ms`, `10s`, `1.5s` or `2m`.
pub fn parse_dur(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => return Err(format!("{s:?} has no unit: write e.g. 500ms, 10s or 2m")),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration: write e.g. 500ms, 10s or 2m"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        other => return Err(format!("{s:?}: unknown unit {other:?} (use ms, s or m)")),
    };
    if !secs.is_finite() || secs > 86_400.0 {
        return Err(format!("{s:?} is out of range (at most a day)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

mod dur {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::fmt_dur(*d))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_dur(&text).map_err(serde::de::Error::custom)
    }
}

mod opt_dur {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::fmt_dur(*d)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| super::parse_dur(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[path = "drill_validate.rs"]
mod validate;

#[cfg(test)]
#[path = "drill_tests.rs"]
mod tests;
