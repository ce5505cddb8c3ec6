//! The leader-election Leases of a shoot's kube-controller-manager and
//! kube-scheduler after its control plane moved.
//!
//! Both components (1.20: `--leader-elect-resource-lock=leases`) keep their
//! lock as a Lease in `kube-system`. A restored control plane finds the Lease
//! its predecessor last renewed, and client-go's leader election waits a whole
//! lease duration (15 s) from the moment it first sees a record before it
//! takes it over, whatever the record's renew time says. The predecessor is
//! fenced by then (the ring moved the shoot), so the wait only holds up the
//! moved shoot's controllers: no Deployment, ReplicaSet or StatefulSet of
//! the shoot gets its pods meanwhile, among them the control planes it hosts.
//!
//! A Lease written at or before the revision the control plane was restored
//! at is the predecessor's (etcd's revision is the object's
//! `resourceVersion`); one written after is the new holder's. Only the former
//! is deleted, with its resourceVersion as a precondition, so a holder that
//! took the Lease in between keeps it.

use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Preconditions};
use kube::Api;

use crate::error::{Result, SeedError};

/// The Leases kube-controller-manager and kube-scheduler elect their leader by.
pub const LEADER_LEASES: [&str; 2] = ["kube-controller-manager", "kube-scheduler"];

/// The namespace of [`LEADER_LEASES`].
pub const LEADER_LEASE_NAMESPACE: &str = "kube-system";

/// Whether a Lease at `resource_version` was last written at or before
/// `restored_revision`, i.e. by the control plane the shoot was restored
/// from. An unparsable version is never taken for a stale one.
pub fn written_before_restore(resource_version: Option<&str>, restored_revision: i64) -> bool {
    resource_version
        .and_then(|v| v.parse::<i64>().ok())
        .is_some_and(|v| v <= restored_revision)
}

/// Deletes the leader Leases of shoot `shoot` (API reached through the
/// kubeconfig at `kubeconfig`) last written at or before
/// `restored_revision`; returns the names deleted. Call it only once the
/// control plane the shoot was restored from is fenced.
pub async fn release_stale(
    shoot: &str,
    kubeconfig: &Path,
    restored_revision: i64,
) -> Result<Vec<&'static str>> {
    let client = crate::kubeconfig::client(shoot, kubeconfig).await?;
    let api: Api<Lease> = Api::namespaced(client, LEADER_LEASE_NAMESPACE);
    let kube_err = |what: &str, name: &str, e: kube::Error| SeedError::Kube {
        shoot: shoot.to_string(),
        message: format!("{what} Lease {LEADER_LEASE_NAMESPACE}/{name}: {e}"),
    };
    let mut released = Vec::new();
    for name in LEADER_LEASES {
        let lease = api
            .get_opt(name)
            .await
            .map_err(|e| kube_err("reading", name, e))?;
        let Some(lease) = lease else { continue };
        let version = lease.metadata.resource_version.clone();
        if !written_before_restore(version.as_deref(), restored_revision) {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: version,
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => released.push(name),
            // gone, or taken over since it was read: nothing stale is left
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => return Err(kube_err("deleting", name, e)),
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a version at or below the restored revision is the
    /// predecessor's; a missing or unparsable one is left alone.
    #[test]
    fn a_lease_is_stale_only_when_written_before_the_restore() {
        for (version, restored, stale) in [
            (Some("100"), 100, true),
            (Some("99"), 100, true),
            (Some("101"), 100, false),
            (None, 100, false),
            (Some("x"), 100, false),
            (Some(""), 100, false),
        ] {
            assert_eq!(
                written_before_restore(version, restored),
                stale,
                "{version:?} against {restored}"
            );
        }
    }
}
