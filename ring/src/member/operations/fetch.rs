//! The target of a planned migration fetches the handover (the source's PKI,
//! spec and final snapshot) over the ring's mutual-TLS gRPC.

use std::path::PathBuf;

use ring_proto::v1::ring_admin_client::RingAdminClient;
use ring_proto::v1::HandoverRequest;
use tokio::io::AsyncWriteExt;

use crate::executor::Mover;
use crate::shared::Shared;
use crate::state::Operation;
use crate::transport::channel;
use crate::RingError;

fn io(what: String) -> impl FnOnce(std::io::Error) -> RingError {
    move |source| RingError::Io { what, source }
}

/// Streams the handover files from `from` into the shoot's dir; each file is
/// written under a temporary name and renamed once complete and synced.
pub(super) async fn fetch(
    shared: &Shared,
    mover: &dyn Mover,
    op: &Operation,
    from: &str,
) -> Result<(), RingError> {
    let (_, address) = shared
        .directory()
        .get(from)
        .ok_or_else(|| RingError::Transport(format!("no address for source {from}")))?;
    let mut client = RingAdminClient::new(channel(&shared.identity(), &address, from)?);
    let request = HandoverRequest {
        shoot: op.shoot().to_string(),
        operation: op.id,
    };
    let mut stream = client
        .fetch_handover(request)
        .await
        .map_err(|e| {
            RingError::Transport(format!(
                "fetching the handover from {from}: {}",
                e.message()
            ))
        })?
        .into_inner();
    let mut current: Option<(String, PathBuf, tokio::fs::File)> = None;
    while let Some(chunk) = stream.message().await.map_err(|e| {
        RingError::Transport(format!("handover stream from {from}: {}", e.message()))
    })? {
        if current.as_ref().is_none_or(|(p, _, _)| *p != chunk.path) {
            let path = mover.handover_path(op.shoot(), &chunk.path)?;
            current = Some((chunk.path.clone(), path.clone(), open_temp(&path).await?));
        }
        let Some((_, path, file)) = current.as_mut() else {
            continue;
        };
        file.write_all(&chunk.data)
            .await
            .map_err(io(format!("writing {}", path.display())))?;
        if chunk.eof {
            file.sync_all()
                .await
                .map_err(io(format!("syncing {}", path.display())))?;
            let tmp = path.with_extension("fetching");
            std::fs::rename(&tmp, &*path).map_err(io(format!("renaming {}", tmp.display())))?;
            current = None;
        }
    }
    if mover.handover_info(op.shoot()).is_none() {
        return Err(RingError::Transport(format!(
            "the handover from {from} was incomplete"
        )));
    }
    Ok(())
}

/// Creates the temporary file a fetched file is written to (and its dir).
async fn open_temp(path: &std::path::Path) -> Result<tokio::fs::File, RingError> {
    if let Some(parent) = path.parent() {
        seed::pki::create_private_dir(parent)?;
    }
    let tmp = path.with_extension("fetching");
    tokio::fs::File::create(&tmp)
        .await
        .map_err(io(format!("creating {}", tmp.display())))
}
