//! The Ring config: the whole ring in one YAML file (Kubernetes style).
//!
//! ```yaml
//! apiVersion: ring.gardener.cloud/v1alpha1
//! kind: Ring
//! name: demo
//! members:                 # ring order: each member hosts its successor's control plane
//!   - name: m1
//!   - name: m2
//!   - name: m3
//! bucket: file:///var/lib/ring/bucket   # optional
//! ports: { address: 127.0.0.1, base: 17100 }
//! timing: { electionTimeoutMs: 1000, failureWindowMs: 3000, leaseMs: 6000, relinkAfterMs: 60000 }
//!          # the defaults; `protection: standby` without it: 750, 2000, 4000
//! deprecatedApis: off      # or `served`: kube-apiservers also serve their release's betas
//! ```

use serde::{Deserialize, Serialize};

use ringd::config::{Timing, API_VERSION};

use crate::BootstrapError;

/// How a member hosts control planes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, tag = "kind")]
pub enum SeedSpec {
    /// Local processes on this machine (the default).
    #[default]
    Local,
    /// Workloads in a Kubernetes cluster (the member's ringd runs on this
    /// machine and reaches the cluster with `kubeconfig`).
    #[serde(rename_all = "camelCase")]
    Kubernetes {
        kubeconfig: String,
        #[serde(default)]
        context: Option<String>,
        /// The kube-apiserver Service's type [default: LoadBalancer].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        service_type: Option<seed::kubernetes::ServiceType>,
        /// A node address ringd reaches, for `serviceType: NodePort`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_address: Option<std::net::IpAddr>,
        /// The storage class of etcd's volumes [default: the cluster's default].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        storage_class: Option<String>,
    },
}

impl SeedSpec {
    /// The `seed.kubernetes` section of a member's ringd config in ring `ring`;
    /// `None` for a local seed.
    pub fn kubernetes_config(&self, ring: &str) -> Option<seed::KubernetesSeedConfig> {
        let SeedSpec::Kubernetes {
            kubeconfig,
            context,
            service_type,
            node_address,
            storage_class,
        } = self
        else {
            return None;
        };
        let mut c = seed::KubernetesSeedConfig::new(ring);
        c.kubeconfig = Some(kubeconfig.into());
        c.context = context.clone();
        if let Some(t) = service_type {
            c.service_type = *t;
        }
        c.node_address = *node_address;
        c.storage_class = storage_class.clone();
        Some(c)
    }
}

/// One member of the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemberSpec {
    /// The member's name, also the name of its shoot.
    /// Must be a DNS label: 1 to 40 lowercase letters, digits and '-', starting and ending
    /// with a letter or digit. With nodes, its last node's name (`<name>-N`) must be one
    /// too.
    pub name: String,
    #[serde(default)]
    pub seed: SeedSpec,
    /// The IP this member's ringd listens on and is reached at [default: `ports.address`].
    /// Must be an IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// A network namespace (`ip netns`, under /run/netns) this member's ringd and
    /// every control plane it hosts run in: members on one machine separated like
    /// hosts on a network (used by the partition drill). The namespace must exist;
    /// for a Kubernetes seed it must reach the seed cluster's API and the
    /// addresses its Services are reached at (the drills give it a link of its own).
    /// Letters, digits, '-', '_' and '.', at most 64, not `.` or `..`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
}

impl MemberSpec {
    /// A member on a local seed, reached at the ring's `ports.address`.
    pub fn local(name: impl Into<String>) -> Self {
        MemberSpec {
            name: name.into(),
            seed: SeedSpec::Local,
            address: None,
            netns: None,
        }
    }
}

/// Where the members' ringd listen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Ports {
    /// The IP every ringd listens on.
    /// Must be an IP address.
    pub address: String,
    /// Member i (0-based) listens on base + 1 + i; its metrics on base + 101 + i.
    /// Must be 1024 or more, with base + 101 + the number of members at most 65535.
    pub base: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            address: "127.0.0.1".into(),
            base: 17100,
        }
    }
}

/// The Kubernetes nodes of a local ring's shoots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Nodes {
    /// Nodes per member's shoot (0: shoots without nodes, control planes only;
    /// N: shoot `m` gets nodes `m`, `m-2` .. `m-N`, each in its own network
    /// namespace; at most 15 nodes per ring).
    /// Members × perMember must be at most 15.
    pub per_member: u8,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes { per_member: 1 }
    }
}

/// The whole ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RingConfig {
    /// Must be `ring.gardener.cloud/v1alpha1`.
    pub api_version: String,
    /// Must be `Ring`.
    pub kind: String,
    /// The ring's name: a DNS label: 1 to 40 lowercase letters, digits and '-', starting
    /// and ending with a letter or digit.
    pub name: String,
    /// The members in ring order; at least 3 (a quorum must survive the loss of one), names
    /// unique.
    pub members: Vec<MemberSpec>,
    /// Backup bucket URL (file://, s3://, gs://, az://).
    /// Must be `file:///absolute/path`, `s3://bucket`, `gs://bucket` or `az://container`; a
    /// self-hosted ring's pods must reach it (no endpoint on this machine's loopback).
    #[serde(default)]
    pub bucket: Option<String>,
    /// The AES-256 key every member seals the bucket's contents with (snapshots,
    /// deltas, each shoot's spec and PKI): `keyFile` (absolute path) or `keyEnv`.
    /// Exactly one of `keyFile` (an absolute path) and `keyEnv`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket_encryption: Option<backup::config::EncryptionConfig>,
    #[serde(default)]
    pub ports: Ports,
    /// Detection and leases [default: [`Timing::default`], or
    /// [`Timing::standby`] with `protection: standby`]; see
    /// [`RingConfig::timing`].
    /// Must pass the `Timing` rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    /// Kubernetes nodes for the shoots [default: one per member].
    #[serde(default)]
    pub nodes: Nodes,
    /// Seconds a seed keeps a control plane's data after it moved away (default 3600).
    #[serde(default = "ringd::config::default_release_grace_secs")]
    pub release_grace_seconds: u64,
    /// Seconds between a host's looks at the certificates of the control
    /// planes it serves; those with less than 30 days left are renewed
    /// online (default 3600).
    /// Must be from 1 to 86400.
    #[serde(default = "ringd::config::default_certificate_check_secs")]
    pub certificate_check_seconds: u64,
    /// Members that host their successor's control plane as pods on their own
    /// shoot's node instead of as processes (bootstrap moves it there).
    /// Each must be a member on a local seed, listed once; needs `nodes.perMember` of 1 or
    /// more.
    #[serde(default, skip_serializing_if = "SelfHosting::is_empty")]
    pub self_hosting: SelfHosting,
    /// How each shoot's etcd is protected: `backup` (default) or `standby`
    /// (a hot standby on the seed that would take it over; local seeds).
    /// `standby` needs every member on a local seed and no `selfHosting`.
    #[serde(default)]
    pub protection: ringd::config::Protection,
    /// Whether the shoots' kube-apiservers serve the beta API versions
    /// their release still has besides the GA ones
    /// (`seed::apis::DEPRECATED_BETA_VERSIONS`: `resource.k8s.io/v1beta2`,
    /// `coordination.k8s.io/v1beta1`, ...): `off` (default, as
    /// kube-apiserver's own; every control plane starts faster and smaller)
    /// or `served`, for manifests that still use them.
    #[serde(default)]
    pub deprecated_apis: seed::DeprecatedApis,
}

/// Which members host as pods on their own shoot's node (`selfHosting`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelfHosting {
    /// Member names; each hosts its successor as pods on its shoot's first node.
    #[serde(default)]
    pub members: Vec<String>,
}

impl SelfHosting {
    /// Whether no member hosts as pods.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

impl Default for RingConfig {
    /// The local demo: three members m1, m2, m3 on local seeds.
    fn default() -> Self {
        RingConfig {
            api_version: API_VERSION.into(),
            kind: "Ring".into(),
            name: "demo".into(),
            members: ["m1", "m2", "m3"]
                .iter()
                .map(|n| MemberSpec::local(*n))
                .collect(),
            bucket: None,
            bucket_encryption: None,
            ports: Ports::default(),
            timing: None,
            nodes: Nodes::default(),
            release_grace_seconds: ringd::config::default_release_grace_secs(),
            certificate_check_seconds: ringd::config::default_certificate_check_secs(),
            self_hosting: SelfHosting::default(),
            protection: Default::default(),
            deprecated_apis: Default::default(),
        }
    }
}

impl RingConfig {
    /// The ring `ringctl bootstrap` makes when given no config: the demo's
    /// three members, a node each, every member hosting its successor's
    /// control plane as pods on its own node (a closed, self-hosted ring).
    pub fn self_hosted_default() -> Self {
        let mut c = RingConfig::default();
        c.self_hosting.members = c.members.iter().map(|m| m.name.clone()).collect();
        c
    }

    /// The ring's timing: the config's `timing`, else the one sized for its
    /// protection ([`Timing::standby`] for `standby`: a standby failover is
    /// the old lease's rest plus a few tenths of a second; the ring's
    /// defaults for `backup`). A `timing` given in part fills in from the
    /// ring's defaults.
    pub fn timing(&self) -> Timing {
        self.timing.unwrap_or(match self.protection {
            ringd::config::Protection::Standby => Timing::standby(),
            ringd::config::Protection::Backup => Timing::default(),
        })
    }
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> BootstrapError {
    BootstrapError::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

impl RingConfig {
    /// Loads the bucket key the config names, if any: done where the key is
    /// used (bootstrap, restore), not in [`validate`](Self::validate), so that
    /// `ringctl status` or `down` work without the key at hand.
    /// A self-hosted ring's pods must reach the bucket too: an endpoint on
    /// this machine's loopback (given here or in `AWS_ENDPOINT_URL`) is
    /// refused, as is an environment the pods' config cannot be made from.
    pub fn check_bucket(&self) -> Result<(), BootstrapError> {
        self.check_bucket_in(std::env::vars())
    }

    /// [`check_bucket`](Self::check_bucket) in the environment `vars`.
    pub fn check_bucket_in(
        &self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), BootstrapError> {
        if let Some(e) = &self.bucket_encryption {
            backup::codec::EncryptionKey::load(e)
                .map_err(|err| bad("bucketEncryption", err.to_string()))?;
        }
        let Some(url) = self
            .bucket
            .as_ref()
            .filter(|_| !self.self_hosting.members.is_empty())
        else {
            return Ok(());
        };
        match backup::BucketConfig::url(url.clone()).for_pods_with("bucket", vars) {
            Ok(_) => Ok(()),
            Err(backup::BackupError::Config { field, reason }) => {
                Err(bad(field, format!("{url}: {reason}")))
            }
            Err(e) => Err(bad("bucket", e.to_string())),
        }
    }

    /// Parses and validates a Ring config.
    pub fn parse(text: &str, source: &str) -> Result<Self, BootstrapError> {
        let config: RingConfig =
            serde_yaml::from_str(text).map_err(|e| bad(source, e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every field; errors name the field and what is wrong.
    pub fn validate(&self) -> Result<(), BootstrapError> {
        if self.api_version != API_VERSION {
            return Err(bad(
                "apiVersion",
                format!("must be {API_VERSION}, not {:?}", self.api_version),
            ));
        }
        if self.kind != "Ring" {
            return Err(bad("kind", format!("must be Ring, not {:?}", self.kind)));
        }
        seed::validate_shoot_name(&self.name).map_err(|e| bad("name", e.to_string()))?;
        if self.members.len() < 3 {
            return Err(bad(
                "members",
                format!(
                    "a ring needs at least 3 members (n/2+1 must survive one loss); it has {}",
                    self.members.len()
                ),
            ));
        }
        for (i, m) in self.members.iter().enumerate() {
            seed::validate_shoot_name(&m.name)
                .map_err(|e| bad(format!("members[{i}].name"), e.to_string()))?;
            if let Some(j) = self.members[..i].iter().position(|o| o.name == m.name) {
                return Err(bad(
                    format!("members[{i}].name"),
                    format!("{:?} is already members[{j}]", m.name),
                ));
            }
            if let Some(a) = &m.address {
                a.parse::<std::net::IpAddr>().map_err(|e| {
                    bad(
                        format!("members[{i}].address"),
                        format!("{a:?} is not an IP address ({e})"),
                    )
                })?;
            }
            if let Some(ns) = &m.netns {
                let ok = !ns.is_empty()
                    && ns.len() <= 64
                    && ns != "."
                    && ns != ".."
                    && ns
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if !ok {
                    return Err(bad(
                        format!("members[{i}].netns"),
                        format!("{ns:?} is not a network namespace name (letters, digits, '-', '_', '.'; at most 64)"),
                    ));
                }
            }
            if let SeedSpec::Kubernetes { kubeconfig, .. } = &m.seed {
                if kubeconfig.is_empty() {
                    return Err(bad(
                        format!("members[{i}].seed.kubeconfig"),
                        "must name a kubeconfig file",
                    ));
                }
            }
        }
        self.validate_nodes()?;
        self.validate_self_hosting()?;
        self.validate_protection()?;
        self.timing()
            .validate()
            .map_err(|e| bad("timing", e.to_string()))?;
        if let Some(url) = &self.bucket {
            check_bucket_url(url).map_err(|reason| bad("bucket", reason))?;
        }
        if let Some(e) = &self.bucket_encryption {
            if e.key_file.as_ref().is_some_and(|f| f.is_relative()) {
                return Err(bad(
                    "bucketEncryption.keyFile",
                    "give an absolute path: every member's ringd reads the key from it",
                ));
            }
            e.validate("bucketEncryption")
                .map_err(|err| bad("bucketEncryption", err.to_string()))?;
        }
        self.ports
            .address
            .parse::<std::net::IpAddr>()
            .map_err(|e| {
                bad(
                    "ports.address",
                    format!("{:?} is not an IP address ({e})", self.ports.address),
                )
            })?;
        let max = ringd::config::MAX_CERTIFICATE_CHECK_SECS;
        if !(1..=max).contains(&self.certificate_check_seconds) {
            return Err(bad(
                "certificateCheckSeconds",
                format!("must be from 1 to {max} (default 3600)"),
            ));
        }
        if u32::from(self.ports.base) + 101 + self.members.len() as u32 > 65535
            || self.ports.base < 1024
        {
            return Err(bad(
                "ports.base",
                "must leave room for 2 ports per member between 1024 and 65535",
            ));
        }
        Ok(())
    }

    fn validate_nodes(&self) -> Result<(), BootstrapError> {
        if self.nodes.per_member == 0 {
            return Ok(());
        }
        let nodes = self.members.len() * usize::from(self.nodes.per_member);
        if nodes > seed::node::net::MAX_NODES {
            return Err(bad(
                "nodes.perMember",
                format!(
                    "{} members x {} nodes = {nodes}; a ring's node network has room for {} nodes: lower nodes.perMember (0 for none)",
                    self.members.len(),
                    self.nodes.per_member,
                    seed::node::net::MAX_NODES
                ),
            ));
        }
        for (i, m) in self.members.iter().enumerate() {
            let last = crate::nodes::nodes_of(self, &m.name)
                .pop()
                .unwrap_or_default();
            seed::validate_shoot_name(&last).map_err(|e| {
                bad(
                    format!("members[{i}].name"),
                    format!("its node {last:?}: {e}"),
                )
            })?;
        }
        // members in network namespaces reach the nodes as guests of the node
        // network (`nodes::ensure_network`)
        Ok(())
    }

    fn validate_self_hosting(&self) -> Result<(), BootstrapError> {
        let names = &self.self_hosting.members;
        for (i, n) in names.iter().enumerate() {
            let field = format!("selfHosting.members[{i}]");
            let Some(m) = self.members.iter().find(|m| m.name == *n) else {
                return Err(bad(field, format!("{n:?} is not a member of the ring")));
            };
            if names[..i].contains(n) {
                return Err(bad(field, format!("{n:?} is listed twice")));
            }
            if m.seed != SeedSpec::Local {
                return Err(bad(
                    field,
                    format!(
                        "{n:?} must be a member on a local seed: it hosts on its own shoot's node"
                    ),
                ));
            }
        }
        if !names.is_empty() && self.nodes.per_member == 0 {
            return Err(bad(
                "selfHosting",
                "pods need nodes: set nodes.perMember to 1 or more",
            ));
        }
        Ok(())
    }

    /// A hot standby runs etcd next to ringd, on a local seed: a member that
    /// hosts in pods (`selfHosting`) or on a Kubernetes seed cannot run one
    /// yet. Refused here, before anything starts, rather than by the first
    /// ringd whose seed turned Kubernetes midway through the bootstrap.
    fn validate_protection(&self) -> Result<(), BootstrapError> {
        if self.protection != ringd::config::Protection::Standby {
            return Ok(());
        }
        let why = if !self.self_hosting.members.is_empty() {
            format!(
                "selfHosting members {:?} host in pods on their own shoot's node",
                self.self_hosting.members
            )
        } else if let Some((i, m)) = self
            .members
            .iter()
            .enumerate()
            .find(|(_, m)| m.seed != SeedSpec::Local)
        {
            format!("members[{i}] ({}) has a Kubernetes seed", m.name)
        } else {
            return Ok(());
        };
        Err(bad(
            "protection",
            format!(
                "standby runs only on local seeds for now, and {why}; use protection: backup, \
                 or a ring of local seeds without selfHosting"
            ),
        ))
    }

    /// The member after `member` in ring order (whose control plane it hosts).
    pub fn successor(&self, member: &str) -> Option<String> {
        let i = self.members.iter().position(|m| m.name == member)?;
        Some(self.members[(i + 1) % self.members.len()].name.clone())
    }

    /// The IP member `i` listens on: its own `address`, else `ports.address`.
    pub fn member_ip(&self, i: usize) -> &str {
        self.members
            .get(i)
            .and_then(|m| m.address.as_deref())
            .unwrap_or(&self.ports.address)
    }

    /// The IP member `i` listens on, parsed (for its certificate).
    pub fn member_ip_addr(&self, i: usize) -> Result<std::net::IpAddr, BootstrapError> {
        let ip = self.member_ip(i);
        ip.parse().map_err(|e| {
            let field = match self.members.get(i).and_then(|m| m.address.as_ref()) {
                Some(_) => format!("members[{i}].address"),
                None => "ports.address".into(),
            };
            bad(field, format!("{ip:?} is not an IP address ({e})"))
        })
    }

    /// `host:port` of member `i`'s ringd.
    pub fn member_address(&self, i: usize) -> String {
        format!("{}:{}", self.member_ip(i), self.ports.base as usize + 1 + i)
    }

    /// `host:port` of every member's ringd, in ring order.
    pub fn member_addresses(&self) -> Vec<String> {
        (0..self.members.len())
            .map(|i| self.member_address(i))
            .collect()
    }

    /// `host:port` of member `i`'s metrics.
    pub fn metrics_address(&self, i: usize) -> String {
        format!(
            "{}:{}",
            self.member_ip(i),
            self.ports.base as usize + 101 + i
        )
    }
}

/// Checks a bucket URL: a known scheme and a bucket (or absolute path).
pub fn check_bucket_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("{url:?} is not a URL (expected file:///path, s3://bucket, gs://bucket or az://container)"));
    };
    match scheme {
        "file" if rest.starts_with('/') => Ok(()),
        "file" => Err(format!(
            "{url:?}: a file URL needs an absolute path (file:///...)"
        )),
        "s3" | "gs" | "az" | "azure" if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        "s3" | "gs" | "az" | "azure" => Err(format!("{url:?}: the URL names no bucket")),
        other => Err(format!(
            "{url:?}: unsupported scheme {other:?} (use file, s3, gs or az)"
        )),
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
