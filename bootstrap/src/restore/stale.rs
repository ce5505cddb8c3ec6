//! The lost ring's control-plane pods in a restored shoot's API.
//!
//! A self-hosted shoot's etcd holds the workloads of the control plane it
//! hosted (namespace `shoot--<ring>--<successor>`, pods bound to its node).
//! Restored from the bucket, those objects describe pods that died with the
//! lost ring; the shoot's node, once started, would run them again before
//! the ring hosts anything there. [`clear`] removes them while no node runs.

use std::path::Path;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PropagationPolicy};
use serde::de::DeserializeOwned;

use crate::BootstrapError;

/// The namespaces of `names` a ring called `ring` hosts control planes in.
pub fn ring_namespaces<'a>(ring: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let prefix = seed::kubernetes::render::namespace(ring, "");
    names
        .into_iter()
        .filter(|n| n.starts_with(&prefix) && n.len() > prefix.len())
        .map(str::to_string)
        .collect()
}

/// Deletes, in every namespace of ring `ring` in `shoot`'s API (reached with
/// the admin kubeconfig at `kubeconfig`), the Deployments, StatefulSets and
/// ReplicaSets, then every pod at once (no kubelet runs them). The namespaces
/// stay. The namespaces cleared.
pub async fn clear(
    kubeconfig: &Path,
    shoot: &str,
    ring: &str,
) -> Result<Vec<String>, BootstrapError> {
    let client = seed::kubeconfig::client(shoot, kubeconfig).await?;
    let err = |what: String| {
        let shoot = shoot.to_string();
        move |e: kube::Error| {
            BootstrapError::Seed(seed::SeedError::Kube {
                shoot,
                message: format!("{what}: {e}"),
            })
        }
    };
    let all: Api<Namespace> = Api::all(client.clone());
    let list = all
        .list(&ListParams::default())
        .await
        .map_err(err("listing namespaces".into()))?;
    let names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let stale = ring_namespaces(ring, names.iter().map(String::as_str));
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    for ns in &stale {
        let at = |kind: &str| format!("deleting the lost ring's {kind} in {ns}");
        delete_all::<Deployment>(&client, ns, &background, err(at("Deployments"))).await?;
        delete_all::<StatefulSet>(&client, ns, &background, err(at("StatefulSets"))).await?;
        delete_all::<ReplicaSet>(&client, ns, &background, err(at("ReplicaSets"))).await?;
        delete_all::<Pod>(
            &client,
            ns,
            &DeleteParams::default().grace_period(0),
            err(at("pods")),
        )
        .await?;
        tracing::info!(%shoot, namespace = %ns, "cleared the lost ring's control-plane pods");
    }
    Ok(stale)
}

async fn delete_all<K>(
    client: &kube::Client,
    ns: &str,
    params: &DeleteParams,
    err: impl FnOnce(kube::Error) -> BootstrapError,
) -> Result<(), BootstrapError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    api.delete_collection(params, &ListParams::default())
        .await
        .map(|_| ())
        .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_ring_s_own_namespaces_are_cleared() {
        let names = [
            "default",
            "kube-system",
            "shoot--dr--dr2",
            "shoot--other--x",
            "shoot--dr--",
            "shoot--drx--a",
        ];
        assert_eq!(ring_namespaces("dr", names), ["shoot--dr--dr2"]);
    }
}
