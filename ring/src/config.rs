//! The configuration of one `ringd` member (YAML, Kubernetes style).
//!
//! ```yaml
//! apiVersion: ring.gardener.cloud/v1alpha1
//! kind: RingMember
//! name: m1
//! id: 1
//! listen: 127.0.0.1:7001
//! dataDir: /var/lib/ring/m1
//! tls: { ca: pki/ca.crt, cert: pki/m1.crt, key: pki/m1.key }
//! members:                       # the initial ring, in ring order
//!   - { name: m1, id: 1, address: 127.0.0.1:7001 }
//!   - { name: m2, id: 2, address: 127.0.0.1:7002 }
//!   - { name: m3, id: 3, address: 127.0.0.1:7003 }
//! timing: { electionTimeoutMs: 1000, failureWindowMs: 3000, leaseMs: 6000 }
//! seed: { stateDir: /var/lib/ring/m1/seed }   # optional: host control planes locally
//! # or in a Kubernetes cluster: seed: { stateDir: ..., kubernetes: { ring: demo, kubeconfig: seed.kubeconfig } }
//! initialHosts: { m1: m2 }       # optional: shoot m1 starts on m2, not on m3
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::RingError;

/// The `apiVersion` Ring's config files carry.
pub const API_VERSION: &str = "ring.gardener.cloud/v1alpha1";

/// One member of the initial ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberConfig {
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit.
    pub name: String,
    /// Raft id: non-zero, unique, never reused.
    /// Must be positive.
    pub id: u64,
    /// `host:port` of the member's ringd.
    /// Must be an IP address and port.
    pub address: String,
}

/// Certificate files (PEM) of the member, issued by the ring's CA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Timing (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Timing {
    /// Raft's logical clock.
    pub tick_ms: u64,
    /// Followers start an election after this much silence from the leader (randomized up to 2x).
    /// Must be at least 5 × `tickMs` (`tickMs` > 0).
    pub election_timeout_ms: u64,
    /// How often members report health to the leader.
    pub heartbeat_ms: u64,
    /// Silence after which the leader declares a member down.
    /// Must be at least 2 × `heartbeatMs` (`heartbeatMs` > 0).
    pub failure_window_ms: u64,
    /// How long a lease on a shoot's control plane lasts; renewed every third of it.
    /// Must be at least 3 × `heartbeatMs`, 3 × `tickMs` and 4 × `electionTimeoutMs` + 1000:
    /// a holder must outlive an election after its leader dies.
    pub lease_ms: u64,
    /// Safety margin for clock skew around lease ends.
    /// Must be less than a third of `leaseMs`.
    pub lease_margin_ms: u64,
    /// How long a member back from the dead must be up (its node too, on a
    /// self-hosted ring) before the ring moves the shoot a failover took from
    /// it back by a planned migration; 0 leaves that to an operator.
    pub relink_after_ms: u64,
    /// An operation that takes no step for this long ends as failed, with
    /// the reason (a target that hangs or keeps crashing mid-step); the
    /// leader then chooses again. Nothing waits for ever.
    /// Must be at least 10 × (`leaseMs` + `failureWindowMs`).
    pub operation_deadline_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            tick_ms: 100,
            election_timeout_ms: 1000,
            heartbeat_ms: 500,
            failure_window_ms: 3000,
            lease_ms: 6000,
            lease_margin_ms: 500,
            relink_after_ms: 60_000,
            operation_deadline_ms: 1_200_000,
        }
    }
}

impl Timing {
    /// The timing sized for a hot standby (`protection: standby`): a
    /// standby failover's outage is the old lease's rest plus a few tenths
    /// of a second, so the lease is as short as an election after a
    /// leader's death allows (4 x 750 ms + 1 s), with a 2 s failure window:
    /// kill to first answer 4.2–4.8 s (median) on a 2-core machine.
    pub fn standby() -> Self {
        Timing {
            election_timeout_ms: 750,
            failure_window_ms: 2000,
            lease_ms: 4000,
            ..Timing::default()
        }
    }

    /// Checks that the timeouts fit together.
    pub fn validate(&self) -> Result<(), RingError> {
        let t = self;
        if t.tick_ms == 0 || t.election_timeout_ms < 5 * t.tick_ms {
            return Err(bad(
                "timing.electionTimeoutMs",
                "must be at least 5 ticks (tickMs > 0)",
            ));
        }
        if t.heartbeat_ms == 0 || t.failure_window_ms < 2 * t.heartbeat_ms {
            return Err(bad(
                "timing.failureWindowMs",
                "must be at least twice heartbeatMs",
            ));
        }
        if t.lease_ms < 3 * t.heartbeat_ms || t.lease_ms < 3 * t.tick_ms {
            return Err(bad("timing.leaseMs", "must be at least three heartbeats"));
        }
        // A holder renews every third of its lease and fences a sixth early:
        // after losing the leader it has half a lease to see a new one elected
        // (an election takes up to twice electionTimeoutMs) and to renew.
        if t.lease_ms / 2 < 2 * t.election_timeout_ms + LEASE_RENEWAL_SLACK_MS {
            return Err(bad(
                "timing.leaseMs",
                format!(
                    "must be at least 4 x electionTimeoutMs + {} ms: a holder must outlive an election after its leader dies (lower electionTimeoutMs or raise leaseMs)",
                    2 * LEASE_RENEWAL_SLACK_MS
                ),
            ));
        }
        if t.lease_margin_ms >= t.lease_ms / 3 {
            return Err(bad(
                "timing.leaseMarginMs",
                "must be less than a third of leaseMs",
            ));
        }
        if t.operation_deadline_ms < 10 * (t.lease_ms + t.failure_window_ms) {
            return Err(bad(
                "timing.operationDeadlineMs",
                "must be at least ten times leaseMs + failureWindowMs (a move needs a few leases and restores take time)",
            ));
        }
        Ok(())
    }
}

/// How the ring protects each shoot's etcd against the loss of its host.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Protection {
    /// Continuous backups to the bucket; a failover restores from them
    /// (what was acknowledged after the newest durable delta is lost).
    #[default]
    Backup,
    /// On top of the backups, a hot standby: a second voting etcd member on
    /// the seed that would take the shoot over, so every acknowledged write
    /// is on two seeds; a failover promotes it. Local seeds only, for now.
    Standby,
}

/// Hosting control planes on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeedConfig {
    /// Where hosted control planes keep their data.
    pub state_dir: PathBuf,
    /// Directory searched first for etcd and the Kubernetes binaries.
    #[serde(default)]
    pub bin_dir: Option<PathBuf>,
    /// Host control planes as workloads in a Kubernetes cluster instead of local
    /// processes (`stateDir` then only holds caches: PKI, admin kubeconfigs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<seed::KubernetesSeedConfig>,
    /// How long a control plane's data stays on this seed after the control plane
    /// moved elsewhere (a safety net for operators) before it is deleted.
    #[serde(default = "default_release_grace_secs")]
    pub release_grace_secs: u64,
    /// How often this member looks at the certificates of the control
    /// planes it serves and renews, online, those with less than 30 days
    /// left.
    /// Must be from 1 to 86400.
    #[serde(default = "default_certificate_check_secs")]
    pub certificate_check_secs: u64,
    /// Shoot → the address its kube-apiserver advertises when this member hosts
    /// it (where the shoot's pods reach their API; the ring's bootstrap sets
    /// each shoot's first node address). Default: the shoot's loopback address.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub api_advertise: std::collections::BTreeMap<String, std::net::Ipv4Addr>,
    /// Whether the kube-apiservers this member hosts serve their release's
    /// beta API versions [default: off]. The same on every member of a ring
    /// (a shoot's API must not change when its control plane moves).
    #[serde(default)]
    pub deprecated_apis: seed::DeprecatedApis,
}

/// One hour.
pub fn default_release_grace_secs() -> u64 {
    3600
}

/// One hour.
pub fn default_certificate_check_secs() -> u64 {
    3600
}

/// A day: looks further apart could let a certificate end between two.
pub const MAX_CERTIFICATE_CHECK_SECS: u64 = 86_400;

/// Configuration of one ringd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RingdConfig {
    /// Must be `ring.gardener.cloud/v1alpha1`.
    pub api_version: String,
    /// Must be `RingMember`.
    pub kind: String,
    /// This member's name (its certificate's common name).
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit.
    pub name: String,
    /// This member's Raft id.
    /// Must be positive and match this member's entry in `members`.
    pub id: u64,
    /// `host:port` to serve gRPC on.
    /// Must be an IP address and port.
    pub listen: String,
    /// `host:port` to serve Prometheus metrics on (`/metrics`).
    /// Must be an IP address and port.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Raft log and state.
    pub data_dir: PathBuf,
    /// The member's certificate and key, and the ring CA.
    pub tls: TlsFiles,
    /// The initial ring in ring order (each hosts its successor's control plane).
    /// With `join`, the members of the existing ring (who may talk to this one).
    /// Must not be empty and must list this member (unless `join`); names and ids unique.
    #[serde(default)]
    pub members: Vec<MemberConfig>,
    /// Start as a new member that an existing ring adds (`ringctl join`).
    #[serde(default)]
    pub join: bool,
    /// Must pass the `Timing` rules.
    #[serde(default)]
    pub timing: Timing,
    /// Hosting control planes on this member; none: it hosts none.
    #[serde(default)]
    pub seed: Option<SeedConfig>,
    /// Continuous backups of the control planes this member serves, and the
    /// bucket failovers restore from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSection>,
    /// How shoots are protected (`backup`, the default, or `standby`). The
    /// leader decides by its own: every member of a ring gets the same.
    /// `standby` needs a `backup` section and a local seed.
    #[serde(default)]
    pub protection: Protection,
    /// Where shoots start when this member creates the ring (shoot ->
    /// member), for those not started on their predecessor. `ringctl
    /// bootstrap` of a self-hosted ring starts the successors of the members
    /// that switch to pods elsewhere, so each moves once instead of twice.
    /// Every shoot and host named must be in `members`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub initial_hosts: BTreeMap<String, String>,
}

/// Where a member backs up the control planes it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackupSection {
    /// Must pass the `BucketConfig` rules.
    pub bucket: backup::BucketConfig,
    /// The AES-256 key that seals everything this member stores in the bucket
    /// (snapshots, deltas, the shoot's spec and PKI) and opens what it restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<backup::config::EncryptionConfig>,
}

/// Serving stops this fraction of a lease before it ends (ringd's duties and
/// the lease guard next to a Kubernetes seed's pods alike).
pub const FENCE_EARLY_DIVISOR: u32 = 6;

/// What a holder needs, past an election, to get its renewal committed by the
/// new leader (retries every 200 ms, a proposal round trip).
const LEASE_RENEWAL_SLACK_MS: u64 = 500;

fn bad(field: &str, reason: impl Into<String>) -> RingError {
    RingError::Config {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn check_name(field: &str, name: &str) -> Result<(), RingError> {
    seed::validate_shoot_name(name).map_err(|e| bad(field, e.to_string()))
}

fn check_addr(field: &str, addr: &str) -> Result<SocketAddr, RingError> {
    addr.parse().map_err(|e| {
        bad(
            field,
            format!("{addr:?} is not host:port with an IP address ({e})"),
        )
    })
}

impl RingdConfig {
    /// Every shoot and host named in `initialHosts` is a member of the ring.
    fn validate_initial_hosts(&self) -> Result<(), RingError> {
        let known = |name: &str| self.members.iter().any(|m| m.name == name);
        for (shoot, host) in &self.initial_hosts {
            let f = format!("initialHosts.{shoot}");
            if !known(shoot) {
                return Err(bad(&f, "names a shoot that is not in members; remove it"));
            }
            if !known(host) {
                return Err(bad(
                    &f,
                    format!("is {host:?}, not a member; name one of members"),
                ));
            }
        }
        Ok(())
    }

    /// A hot standby needs a local seed (it runs etcd next to ringd) and a
    /// bucket (it fetches the shoot's certificates from there).
    fn validate_protection(&self) -> Result<(), RingError> {
        if self.protection != Protection::Standby {
            return Ok(());
        }
        match &self.seed {
            Some(s) if s.kubernetes.is_some() => Err(bad(
                "protection",
                "standby runs only on local seeds for now; use protection: backup with a Kubernetes seed",
            )),
            _ if self.backup.is_none() => Err(bad(
                "protection",
                "standby needs a backup section: a standby fetches the shoot's certificates from the bucket",
            )),
            _ => Ok(()),
        }
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Self, RingError> {
        let text = std::fs::read_to_string(path).map_err(|source| RingError::Io {
            what: format!("reading config {}", path.display()),
            source,
        })?;
        let config: RingdConfig = serde_yaml::from_str(&text).map_err(|e| RingError::Config {
            field: path.display().to_string(),
            reason: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; the error names the field and the fix.
    pub fn validate(&self) -> Result<(), RingError> {
        if self.api_version != API_VERSION {
            return Err(bad(
                "apiVersion",
                format!("must be {API_VERSION}, not {:?}", self.api_version),
            ));
        }
        if self.kind != "RingMember" {
            return Err(bad(
                "kind",
                format!("must be RingMember, not {:?}", self.kind),
            ));
        }
        check_name("name", &self.name)?;
        if self.id == 0 {
            return Err(bad("id", "must be a positive number"));
        }
        check_addr("listen", &self.listen)?;
        if let Some(m) = &self.metrics_listen {
            check_addr("metricsListen", m)?;
        }
        if self.members.is_empty() {
            return Err(bad(
                "members",
                "lists the initial ring (or, with join: true, the ring to join); it is empty",
            ));
        }
        {
            for (i, m) in self.members.iter().enumerate() {
                let f = format!("members[{i}]");
                check_name(&format!("{f}.name"), &m.name)?;
                if m.id == 0 {
                    return Err(bad(&format!("{f}.id"), "must be a positive number"));
                }
                check_addr(&format!("{f}.address"), &m.address)?;
                if let Some(j) = self.members[..i]
                    .iter()
                    .position(|o| o.name == m.name || o.id == m.id)
                {
                    return Err(bad(&f, format!("repeats the name or id of members[{j}]")));
                }
            }
            match self.members.iter().find(|m| m.name == self.name) {
                None if self.join => {}
                None => {
                    return Err(bad(
                        "members",
                        format!("does not list this member ({})", self.name),
                    ))
                }
                Some(me) if me.id != self.id => {
                    return Err(bad(
                        "id",
                        format!(
                            "is {} but members lists {} with id {}",
                            self.id, self.name, me.id
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        self.timing.validate()?;
        self.validate_protection()?;
        self.validate_initial_hosts()?;
        if let Some(b) = &self.backup {
            b.bucket
                .validate("backup.bucket")
                .map_err(|e| bad("backup.bucket", e.to_string()))?;
            if let Some(e) = &b.encryption {
                e.validate("backup.encryption")
                    .map_err(|e| bad("backup.encryption", e.to_string()))?;
            }
        }
        if self
            .seed
            .as_ref()
            .is_some_and(|s| !(1..=MAX_CERTIFICATE_CHECK_SECS).contains(&s.certificate_check_secs))
        {
            return Err(bad(
                "seed.certificateCheckSecs",
                format!("must be from 1 to {MAX_CERTIFICATE_CHECK_SECS} (seconds between looks at the certificates of the control planes this member serves, renewed 30 days before they end; default 3600)"),
            ));
        }
        if let Some(k) = self.seed.as_ref().and_then(|s| s.kubernetes.as_ref()) {
            k.validate().map_err(|e| match e {
                seed::SeedError::InvalidSpec { field, reason } => {
                    bad(&format!("seed.kubernetes.{field}"), reason)
                }
                other => bad("seed.kubernetes", other.to_string()),
            })?;
        }
        Ok(())
    }

    /// Raft ids of the initial voters (empty when joining).
    pub fn initial_voters(&self) -> Vec<u64> {
        if self.join {
            return Vec::new();
        }
        self.members.iter().map(|m| m.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: ring.gardener.cloud/v1alpha1
kind: RingMember
name: m1
id: 1
listen: 127.0.0.1:7001
dataDir: /tmp/x
tls: { ca: ca.crt, cert: m1.crt, key: m1.key }
members:
  - { name: m1, id: 1, address: "127.0.0.1:7001" }
  - { name: m2, id: 2, address: "127.0.0.1:7002" }
  - { name: m3, id: 3, address: "127.0.0.1:7003" }
"#;

    fn parse(text: &str) -> Result<RingdConfig, String> {
        let c: RingdConfig = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn good_config_gets_default_timing() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.timing, Timing::default());
        assert_eq!(c.initial_voters(), vec![1, 2, 3]);
    }

    #[test]
    fn empty_members_is_refused_but_a_joiner_need_not_list_itself() {
        let mut c = parse(GOOD).unwrap();
        c.members.clear();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("config members"));
        let mut j = parse(GOOD).unwrap();
        j.join = true;
        j.name = "m4".into();
        j.id = 4;
        j.validate().unwrap();
        assert!(j.initial_voters().is_empty());
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            (GOOD.replace("kind: RingMember", "kind: Ring"), "kind"),
            (
                GOOD.replace("listen: 127.0.0.1:7001", "listen: localhost"),
                "listen",
            ),
            (GOOD.replace("id: 3,", "id: 2,"), "members[2]"),
            (GOOD.replace("name: m1\n", "name: M1\n"), "name"),
            (GOOD.replace("name: m1\nid: 1", "name: m1\nid: 4"), "id"),
            (
                GOOD.replace("dataDir: /tmp/x", "dataDir: /tmp/x\ncolour: blue"),
                "unknown field `colour`",
            ),
            (
                format!("{GOOD}timing: {{ leaseMs: 100 }}\n"),
                "timing.leaseMs",
            ),
            (
                // half a lease (2 s) is less than two election timeouts + slack
                format!("{GOOD}timing: {{ leaseMs: 4000 }}\n"),
                "timing.leaseMs: must be at least 4 x electionTimeoutMs",
            ),
            (
                format!("{GOOD}timing: {{ operationDeadlineMs: 20000 }}\n"),
                "timing.operationDeadlineMs",
            ),
            (
                format!("{GOOD}seed: {{ stateDir: /s, kubernetes: {{ ring: demo, etcdStorage: lots }} }}\n"),
                "seed.kubernetes.etcdStorage",
            ),
            (
                format!("{GOOD}initialHosts: {{ m1: m9 }}\n"),
                "initialHosts.m1",
            ),
            (
                format!("{GOOD}seed: {{ stateDir: /s, certificateCheckSecs: 0 }}\n"),
                "seed.certificateCheckSecs: must be from 1 to 86400",
            ),
            (
                // looks further apart than a day could miss the 30 days
                format!("{GOOD}seed: {{ stateDir: /s, certificateCheckSecs: 86401 }}\n"),
                "seed.certificateCheckSecs: must be from 1 to 86400",
            ),
            (
                format!("{GOOD}initialHosts: {{ m9: m1 }}\n"),
                "initialHosts.m9",
            ),
        ];
        for (text, field) in cases {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(field), "expected {field:?} in {err:?}");
        }
    }
}
