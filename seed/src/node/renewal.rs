//! Kubelet client certificates renew themselves: the kubelet runs with
//! `rotateCertificates` and asks its shoot for a new certificate through a
//! CertificateSigningRequest; kube-controller-manager approves a node's
//! request for its own name and signs it with the shoot's CA
//! (`--cluster-signing-*`). Approval needs the binding [`allow`] makes: the
//! bootstrap policy has the ClusterRole but binds it to nobody.

use std::path::Path;

use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

use crate::{Result, SeedError};

/// The binding that lets every node of a shoot renew its own client certificate.
pub const BINDING: &str = "ring:nodes-renew-their-client-certificates";

/// The bootstrap policy's ClusterRole for a node's own client certificate.
pub const SELF_NODE_CLIENT: &str =
    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient";

/// The binding, as created.
pub fn binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(BINDING.into()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "ring".to_string(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: SELF_NODE_CLIENT.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Group".into(),
            name: "system:nodes".into(),
            namespace: None,
        }]),
    }
}

/// Makes sure shoot `shoot` (reached with the admin kubeconfig at
/// `kubeconfig`) approves its nodes' renewals; one that exists is kept.
pub async fn allow(shoot: &str, kubeconfig: &Path) -> Result<()> {
    let client = crate::kubeconfig::client(shoot, kubeconfig).await?;
    let api: Api<ClusterRoleBinding> = Api::all(client);
    match api.create(&PostParams::default(), &binding()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(SeedError::Kube {
            shoot: shoot.to_string(),
            message: format!(
                "creating ClusterRoleBinding {BINDING} (nodes renewing their client certificates): {e}"
            ),
        }),
    }
}
