//! gRPC over mutual TLS: the Raft transport (server side and outbound peers),
//! client channels, and identity checks on every request.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use ring_proto::v1::raft_transport_client::RaftTransportClient;
use ring_proto::v1::raft_transport_server::RaftTransport;
use ring_proto::v1::{RaftAck, RaftBatch, SnapshotChunk};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig,
};
use tonic::{Request, Response, Status};

use crate::identity::{IdentityPem, ADMIN_NAME};
use crate::node_task::NodeHandle;
use crate::RingError;

/// Largest snapshot a member accepts (the ring state is small; this bounds memory).
pub const MAX_SNAPSHOT_BYTES: usize = 64 * 1024 * 1024;
const SNAPSHOT_CHUNK: usize = 256 * 1024;

/// Known members: name → (Raft id, address). Kept current from the ring state.
#[derive(Clone, Default)]
pub struct Directory {
    inner: Arc<RwLock<BTreeMap<String, (u64, String)>>>,
}

impl Directory {
    /// Adds or updates a member.
    pub fn insert(&self, name: &str, id: u64, address: &str) {
        let mut map = self.inner.write().unwrap_or_else(|p| p.into_inner());
        map.insert(name.to_string(), (id, address.to_string()));
    }

    /// Replaces the whole table (after a membership change).
    pub fn replace(&self, members: impl IntoIterator<Item = (String, u64, String)>) {
        let mut map = self.inner.write().unwrap_or_else(|p| p.into_inner());
        map.clear();
        for (name, id, addr) in members {
            map.insert(name, (id, addr));
        }
    }

    /// Id and address of `name`.
    pub fn get(&self, name: &str) -> Option<(u64, String)> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Name and address of Raft id `id`.
    pub fn by_id(&self, id: u64) -> Option<(String, String)> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(_, (i, _))| *i == id)
            .map(|(n, (_, a))| (n.clone(), a.clone()))
    }
}

/// Who may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Only ring members.
    Member,
    /// Members and administrators.
    MemberOrAdmin,
    /// Only administrators.
    Admin,
}

/// The common name of the caller's client certificate, checked against `allowed`.
/// Refusals are logged with the presented identity.
pub fn authorize<T>(
    req: &Request<T>,
    directory: &Directory,
    allowed: Caller,
) -> Result<String, Status> {
    let certs = req.peer_certs();
    let cn = certs
        .as_ref()
        .and_then(|c| c.first())
        .and_then(|der| seed::pki::common_name(der.as_ref()));
    let Some(cn) = cn else {
        tracing::warn!(peer = ?req.remote_addr(), "refused a caller without a client certificate");
        return Err(Status::unauthenticated(
            "a client certificate from the ring's CA is required",
        ));
    };
    let is_member = directory.get(&cn).is_some();
    let is_admin = cn == ADMIN_NAME;
    let ok = match allowed {
        Caller::Member => is_member,
        Caller::MemberOrAdmin => is_member || is_admin,
        Caller::Admin => is_admin,
    };
    if !ok {
        tracing::warn!(identity = %cn, peer = ?req.remote_addr(), ?allowed, "refused an unexpected identity");
        return Err(Status::permission_denied(format!(
            "identity {cn:?} may not call this ({allowed:?} only)"
        )));
    }
    Ok(cn)
}

/// TLS for the gRPC server: our certificate, and client certificates required from the ring's CA.
pub fn server_tls(id: &IdentityPem) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(&id.cert, &id.key))
        .client_ca_root(Certificate::from_pem(&id.ca))
}

/// A lazily connecting channel to `address` that expects the server to be `server_name`.
pub fn channel(id: &IdentityPem, address: &str, server_name: &str) -> Result<Channel, RingError> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&id.ca))
        .identity(Identity::from_pem(&id.cert, &id.key))
        .domain_name(server_name);
    let endpoint = Endpoint::from_shared(format!("https://{address}"))
        .map_err(|e| RingError::Transport(format!("bad address {address:?}: {e}")))?
        .tls_config(tls)
        .map_err(|e| RingError::Transport(format!("TLS config for {address}: {e}")))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        // a peer behind a cut link is noticed within ~3 s and the next send
        // reconnects, instead of waiting on TCP retransmissions after the link heals
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

/// The server side of the Raft transport.
pub struct RaftService {
    pub node: NodeHandle,
    pub directory: Directory,
}

fn decode(bytes: &[u8]) -> Result<Message, Status> {
    Message::parse_from_bytes(bytes)
        .map_err(|e| Status::invalid_argument(format!("undecodable Raft message: {e}")))
}

impl RaftService {
    fn check_sender(&self, caller: &str, msg: &Message) -> Result<(), Status> {
        match self.directory.get(caller) {
            Some((id, _)) if id == msg.from => Ok(()),
            _ => {
                tracing::warn!(
                    identity = caller,
                    from = msg.from,
                    "refused a Raft message sent in another member's name"
                );
                Err(Status::permission_denied(format!(
                    "{caller} may not send Raft messages from id {}",
                    msg.from
                )))
            }
        }
    }
}

#[tonic::async_trait]
impl RaftTransport for RaftService {
    async fn send(&self, req: Request<RaftBatch>) -> Result<Response<RaftAck>, Status> {
        let caller = authorize(&req, &self.directory, Caller::Member)?;
        for bytes in &req.get_ref().messages {
            let msg = decode(bytes)?;
            if msg.get_msg_type() == MessageType::MsgPropose
                && self
                    .directory
                    .get(&caller)
                    .is_some_and(|(id, _)| id != msg.from)
            {
                // a proposal relayed by a member that was leader a moment
                // ago: its proposer cannot be checked here, so it is dropped
                // (the proposer retries); the rest of the batch goes on
                tracing::debug!(relay = %caller, from = msg.from, "dropped a relayed proposal");
                continue;
            }
            self.check_sender(&caller, &msg)?;
            self.node.step(msg);
        }
        Ok(Response::new(RaftAck {}))
    }

    async fn send_snapshot(
        &self,
        req: Request<tonic::Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftAck>, Status> {
        let caller = authorize(&req, &self.directory, Caller::Member)?;
        let mut stream = req.into_inner();
        let mut msg: Option<Message> = None;
        let mut data = Vec::new();
        while let Some(chunk) = stream.message().await? {
            if msg.is_none() {
                let m = decode(&chunk.message)?;
                self.check_sender(&caller, &m)?;
                msg = Some(m);
            }
            if data.len() + chunk.data.len() > MAX_SNAPSHOT_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "snapshot larger than {MAX_SNAPSHOT_BYTES} bytes"
                )));
            }
            data.extend_from_slice(&chunk.data);
            if chunk.last {
                break;
            }
        }
        let mut msg = msg.ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        msg.mut_snapshot().data = data.into();
        self.node.step(msg);
        Ok(Response::new(RaftAck {}))
    }
}

/// The node's outgoing Raft messages, in batches.
pub type Outbox = mpsc::Receiver<Vec<Message>>;

/// Routes the node's outgoing messages to one bounded queue per peer; a full
/// queue drops messages (Raft retransmits), an unreachable peer is reported.
pub async fn run_outbound(
    mut outbox: Outbox,
    node: NodeHandle,
    directory: Directory,
    identity: tokio::sync::watch::Receiver<IdentityPem>,
    shutdown: CancellationToken,
) {
    let mut peers: BTreeMap<u64, mpsc::Sender<Message>> = BTreeMap::new();
    loop {
        let batch = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            b = outbox.recv() => match b { Some(b) => b, None => return },
        };
        for msg in batch {
            let to = msg.to;
            let queue = peers.entry(to).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(1024);
                tokio::spawn(peer_sender(
                    to,
                    rx,
                    node.clone(),
                    directory.clone(),
                    identity.clone(),
                    shutdown.clone(),
                ));
                tx
            });
            if queue.try_send(msg).is_err() {
                tracing::debug!(to, "peer queue full; dropping a Raft message");
            }
        }
    }
}

async fn peer_sender(
    to: u64,
    mut rx: mpsc::Receiver<Message>,
    node: NodeHandle,
    directory: Directory,
    mut identity: tokio::sync::watch::Receiver<IdentityPem>,
    shutdown: CancellationToken,
) {
    let mut client: Option<(String, RaftTransportClient<Channel>)> = None;
    let mut backoff =
        seed::process::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        let first = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        let mut batch = vec![first];
        while batch.len() < 256 {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        let Some((name, address)) = directory.by_id(to) else {
            tracing::debug!(to, "no address for Raft peer yet");
            node.unreachable(to);
            continue;
        };
        if identity.has_changed().unwrap_or(false) {
            identity.borrow_and_update();
            client = None; // connect again, presenting the new certificate
        }
        if client.as_ref().is_none_or(|(a, _)| *a != address) {
            let id = identity.borrow().clone();
            match channel(&id, &address, &name) {
                Ok(ch) => client = Some((address.clone(), RaftTransportClient::new(ch))),
                Err(e) => {
                    tracing::warn!(to, error = %e, "cannot build a channel");
                    node.unreachable(to);
                    continue;
                }
            }
        }
        let Some((_, c)) = client.as_mut() else {
            continue;
        };
        let (snapshots, rest): (Vec<Message>, Vec<Message>) = batch
            .into_iter()
            .partition(|m| m.get_msg_type() == MessageType::MsgSnapshot);
        let mut ok = true;
        if !rest.is_empty() {
            let messages = rest
                .iter()
                .filter_map(|m| m.write_to_bytes().ok())
                .collect();
            if let Err(e) = c
                .send(RaftBatch {
                    from: node_id(&rest),
                    messages,
                })
                .await
            {
                tracing::debug!(to, peer = %name, error = %e, "sending Raft messages failed");
                ok = false;
            }
        }
        for snap in snapshots {
            let sent = send_snapshot(c, snap).await;
            if let Err(e) = &sent {
                tracing::warn!(to, peer = %name, error = %e, "sending a snapshot failed");
            }
            node.snapshot_sent(to, sent.is_ok());
        }
        if ok {
            backoff.reset();
        } else {
            node.unreachable(to);
            let delay = backoff.next_delay();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

fn node_id(msgs: &[Message]) -> u64 {
    msgs.first().map_or(0, |m| m.from)
}

async fn send_snapshot(
    c: &mut RaftTransportClient<Channel>,
    mut msg: Message,
) -> Result<(), Status> {
    let data = std::mem::take(&mut msg.mut_snapshot().data).to_vec();
    let header = msg
        .write_to_bytes()
        .map_err(|e| Status::internal(format!("encoding snapshot message: {e}")))?;
    let from = msg.from;
    let mut chunks = Vec::new();
    let pieces: Vec<&[u8]> = if data.is_empty() {
        vec![&[][..]]
    } else {
        data.chunks(SNAPSHOT_CHUNK).collect()
    };
    let n = pieces.len();
    for (i, piece) in pieces.into_iter().enumerate() {
        chunks.push(SnapshotChunk {
            from,
            message: if i == 0 { header.clone() } else { Vec::new() },
            data: piece.to_vec(),
            last: i + 1 == n,
        });
    }
    c.send_snapshot(tokio_stream::iter(chunks))
        .await
        .map(|_| ())
}
