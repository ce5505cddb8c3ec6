//! `ring-agent forward`: a Kubernetes seed's relay from a shoot's stable API
//! address to its kube-apiserver Service, run under the lease guard (see
//! `seed::kubernetes::forwarder`).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;

use crate::RingError;

/// Listens on `listen` and relays every connection to `target` (`host:port`) until `stop`.
pub async fn run(
    listen: SocketAddr,
    target: String,
    stop: CancellationToken,
) -> Result<(), RingError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| RingError::Io {
            what: format!(
                "listening on the shoot's stable endpoint {listen} (another process holds it: a control plane of this shoot elsewhere on this machine, or a relay that was not stopped)"
            ),
            source,
        })?;
    tracing::info!(%listen, %target, "relaying the shoot's stable endpoint");
    seed::forward::relay(listener, target, stop).await;
    Ok(())
}
