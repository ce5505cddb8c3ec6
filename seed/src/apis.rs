//! Which API versions a shoot's kube-apiserver serves.
//!
//! Kubernetes 1.37 serves its GA versions and, by default, no beta: the betas
//! it still has are off until `--runtime-config` turns them on. Building
//! their OpenAPI spec is part of every kube-apiserver start, and so of every
//! failover and move of a control plane (`ringctl bench controlplane` prints
//! both variants side by side). Ring serves only the GA versions unless a
//! ring asks for the betas too (`deprecatedApis: served` in the Ring config),
//! for manifests that still use them.

use serde::{Deserialize, Serialize};

/// The beta group-versions with resources that Kubernetes 1.37 can serve
/// (each has a GA twin or is a feature still in beta); kube-apiserver serves
/// none of them unless `--runtime-config` asks. The betas 1.20 served by
/// default (`rbac.../v1beta1`, `extensions/v1beta1`, `policy/v1beta1`, ...)
/// are gone: asking for them would make kube-apiserver refuse to start.
pub const DEPRECATED_BETA_VERSIONS: [&str; 6] = [
    "admissionregistration.k8s.io/v1beta1",
    "certificates.k8s.io/v1beta1",
    "coordination.k8s.io/v1beta1",
    "resource.k8s.io/v1beta1",
    "resource.k8s.io/v1beta2",
    "storagemigration.k8s.io/v1beta1",
];

/// Whether the beta versions ([`DEPRECATED_BETA_VERSIONS`]) are served.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum DeprecatedApis {
    /// Not served (the default, as kube-apiserver's own): it starts faster
    /// and smaller.
    #[default]
    Off,
    /// Served besides the GA versions.
    Served,
}

impl DeprecatedApis {
    /// kube-apiserver's flags for this choice.
    pub fn apiserver_args(self) -> Vec<String> {
        match self {
            DeprecatedApis::Off => Vec::new(),
            DeprecatedApis::Served => {
                let on: Vec<String> = DEPRECATED_BETA_VERSIONS
                    .iter()
                    .map(|gv| format!("{gv}=true"))
                    .collect();
                vec![format!("--runtime-config={}", on.join(","))]
            }
        }
    }
}

impl std::fmt::Display for DeprecatedApis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeprecatedApis::Off => "off",
            DeprecatedApis::Served => "served",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_turns_every_beta_on_and_off_adds_nothing() {
        let args = DeprecatedApis::Served.apiserver_args();
        assert_eq!(args.len(), 1);
        let value = args[0].strip_prefix("--runtime-config=").unwrap();
        let on: Vec<&str> = value.split(',').collect();
        assert_eq!(on.len(), DEPRECATED_BETA_VERSIONS.len());
        assert!(on.iter().all(|gv| gv.ends_with("=true")), "{on:?}");
        assert!(on.contains(&"resource.k8s.io/v1beta2=true"));
        assert!(
            !value.contains("policy/"),
            "removed in 1.25: asking for it fails the start"
        );
        assert!(DeprecatedApis::Off.apiserver_args().is_empty());
        assert_eq!(DeprecatedApis::default(), DeprecatedApis::Off);
    }
}
