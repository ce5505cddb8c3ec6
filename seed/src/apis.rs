//! Which API versions a shoot's kube-apiserver serves.
//!
//! Kubernetes 1.20 serves, next to each GA API, the beta versions that it
//! deprecated and that 1.22 removes. Building their OpenAPI spec is a large
//! part of every kube-apiserver start, and so of every failover and move of a
//! control plane (`ringctl bench controlplane` prints both variants side by
//! side). Ring serves only the current versions unless a ring asks for the
//! deprecated ones (`deprecatedApis: served` in the Ring config), for
//! manifests that still use them.

use serde::{Deserialize, Serialize};

/// The beta group-versions of Kubernetes 1.20 that have a GA (or, for
/// `autoscaling/v2beta1`, a newer) twin serving the same resources. The betas
/// without one (CronJob, PodDisruptionBudget, PodSecurityPolicy,
/// EndpointSlice, API priority and fairness) are always served.
pub const DEPRECATED_BETA_VERSIONS: [&str; 15] = [
    "admissionregistration.k8s.io/v1beta1",
    "apiextensions.k8s.io/v1beta1",
    "apiregistration.k8s.io/v1beta1",
    "authentication.k8s.io/v1beta1",
    "authorization.k8s.io/v1beta1",
    "autoscaling/v2beta1",
    "certificates.k8s.io/v1beta1",
    "coordination.k8s.io/v1beta1",
    "events.k8s.io/v1beta1",
    "extensions/v1beta1",
    "networking.k8s.io/v1beta1",
    "node.k8s.io/v1beta1",
    "rbac.authorization.k8s.io/v1beta1",
    "scheduling.k8s.io/v1beta1",
    "storage.k8s.io/v1beta1",
];

/// Whether the deprecated beta versions ([`DEPRECATED_BETA_VERSIONS`]) are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DeprecatedApis {
    /// Not served (the default): kube-apiserver starts faster and smaller.
    #[default]
    Off,
    /// Served, as kube-apiserver 1.20 does by default.
    Served,
}

impl DeprecatedApis {
    /// kube-apiserver's flags for this choice.
    pub fn apiserver_args(self) -> Vec<String> {
        match self {
            DeprecatedApis::Served => Vec::new(),
            DeprecatedApis::Off => {
                let off: Vec<String> = DEPRECATED_BETA_VERSIONS
                    .iter()
                    .map(|gv| format!("{gv}=false"))
                    .collect();
                vec![format!("--runtime-config={}", off.join(","))]
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
    fn off_turns_every_deprecated_beta_off_and_served_adds_nothing() {
        let args = DeprecatedApis::Off.apiserver_args();
        assert_eq!(args.len(), 1);
        let value = args[0].strip_prefix("--runtime-config=").unwrap();
        let off: Vec<&str> = value.split(',').collect();
        assert_eq!(off.len(), DEPRECATED_BETA_VERSIONS.len());
        assert!(off.iter().all(|gv| gv.ends_with("=false")), "{off:?}");
        assert!(off.contains(&"rbac.authorization.k8s.io/v1beta1=false"));
        assert!(!value.contains("batch/"), "CronJob's beta stays: {value}");
        assert!(
            !value.contains("policy/"),
            "PodDisruptionBudget's beta stays"
        );
        assert!(DeprecatedApis::Served.apiserver_args().is_empty());
        assert_eq!(DeprecatedApis::default(), DeprecatedApis::Off);
    }
}
