//! hostPath PersistentVolumes for a seed cluster without a storage
//! provisioner (a ring's own shoots, the drills' and tests' seed clusters):
//! each etcd a Kubernetes seed runs there binds one. A volume that was bound
//! once is Released when its claim goes and is not bound again, so a cluster
//! needs one per arrival of a control plane.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};

use crate::error::{Result, SeedError};

/// Creates a 1 GiB ReadWriteOnce hostPath PersistentVolume per `(name, dir)`
/// that does not exist yet (`dir` is created on the node when bound).
/// `cluster` names the cluster in errors.
pub async fn ensure_host_path_volumes(
    client: kube::Client,
    cluster: &str,
    volumes: &[(String, PathBuf)],
) -> Result<()> {
    let api: Api<PersistentVolume> = Api::all(client);
    for (name, dir) in volumes {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"ring.gardener.cloud/host-path": "etcd"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": dir.display().to_string(), "type": "DirectoryOrCreate"},
            }
        }))
        .map_err(|e| SeedError::Kube {
            shoot: cluster.to_string(),
            message: format!("PersistentVolume {name}: {e}"),
        })?;
        match api.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(r)) if r.code == 409 => {}
            Err(e) => {
                return Err(SeedError::Kube {
                    shoot: cluster.to_string(),
                    message: format!("creating PersistentVolume {name}: {e}"),
                })
            }
        }
    }
    Ok(())
}
