//! The RingAdmin gRPC service: status, health reports, leases, membership,
//! migrations, the handover stream and probes, each authorized by the
//! caller's certificate.

use std::net::SocketAddr;
use std::sync::Arc;

use raft::StateRole;
use ring_proto::v1::ring_admin_server::RingAdmin;
use ring_proto::v1::{
    AddMemberRequest, HandoverChunk, HandoverRequest, HealthAck, HealthReport, LeaseReply,
    LeaseRequest, MembershipReply, MigrateReply, MigrateRequest, ProbeReply, ProbeRequest,
    RemoveMemberRequest, StatusReply, StatusRequest,
};
use tonic::{Request, Response, Status};

use crate::node_task::ProposeError;
use crate::now_ms;
use crate::shared::Shared;
use crate::state::{OperationStep, RingCommand};
use crate::transport::{authorize, Caller};

/// The RingAdmin gRPC service.
pub struct AdminService {
    shared: Arc<Shared>,
}

impl AdminService {
    /// The service over a daemon's shared state.
    pub fn new(shared: Arc<Shared>) -> Self {
        AdminService { shared }
    }

    /// The leader's name as this member knows it ("" when none is known).
    fn leader_name(&self, v: &crate::node::NodeView) -> String {
        self.shared
            .directory
            .by_id(v.leader_id)
            .map(|(n, _)| n)
            .unwrap_or_default()
    }

    /// The open migration of `shoot` to `to`, as this member's state has it.
    fn open_migration(&self, shoot: &str, to: &str) -> Option<u64> {
        let state = self.shared.node.view().state;
        let op = state.open_operation(shoot)?;
        (op.is_migration() && op.target() == to).then_some(op.id)
    }

    /// Membership changes and migrations are the leader's to propose (peers'
    /// proposals of them are refused): any other member says who leads.
    fn require_leader(&self) -> Result<(), Status> {
        let v = self.shared.node.view();
        if v.role == StateRole::Leader {
            return Ok(());
        }
        Err(Status::unavailable(format!(
            "{} is not the leader; ask the leader {} (ringctl finds it by itself)",
            self.shared.name(),
            match self.leader_name(&v) {
                n if n.is_empty() => "once one is elected".to_string(),
                n => n,
            }
        )))
    }
}

fn propose_status(e: ProposeError) -> Status {
    match e {
        ProposeError::Rejected(r) => Status::failed_precondition(r),
        ProposeError::Timeout(_) | ProposeError::LeaderChanged | ProposeError::Dropped => {
            Status::unavailable(format!("{e}"))
        }
        ProposeError::Stopped => Status::unavailable("ringd is shutting down"),
        ProposeError::Invalid(r) => Status::invalid_argument(r),
    }
}

#[tonic::async_trait]
impl RingAdmin for AdminService {
    async fn status(&self, req: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::MemberOrAdmin)?;
        let json = serde_json::to_string(&self.shared.status())
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(StatusReply { status_json: json }))
    }

    async fn report_health(
        &self,
        req: Request<HealthReport>,
    ) -> Result<Response<HealthAck>, Status> {
        let caller = authorize(&req, &self.shared.directory, Caller::Member)?;
        let report = req.into_inner();
        if report.member != caller {
            return Err(Status::permission_denied(format!(
                "{caller} may not report for {}",
                report.member
            )));
        }
        let v = self.shared.node.view();
        if v.role != StateRole::Leader {
            let leader = self.leader_name(&v);
            return Ok(Response::new(HealthAck { leader }));
        }
        self.shared.record_report(&caller, report.shoots);
        Ok(Response::new(HealthAck {
            leader: String::new(),
        }))
    }

    async fn renew_lease(
        &self,
        req: Request<LeaseRequest>,
    ) -> Result<Response<LeaseReply>, Status> {
        let caller = authorize(&req, &self.shared.directory, Caller::Member)?;
        let r = req.into_inner();
        if r.holder != caller {
            return Err(Status::permission_denied(format!(
                "{caller} may not renew a lease held by {}",
                r.holder
            )));
        }
        let cmd = RingCommand::RenewLease {
            shoot: r.shoot,
            holder: r.holder,
            epoch: r.epoch,
            expires_at_ms: r.expires_at_ms,
        };
        match self.shared.propose(cmd).await {
            Ok(_) => Ok(Response::new(LeaseReply {
                granted: true,
                reason: String::new(),
                epoch: r.epoch,
            })),
            Err(ProposeError::Rejected(reason)) => Ok(Response::new(LeaseReply {
                granted: false,
                reason,
                epoch: r.epoch,
            })),
            Err(e) => Err(propose_status(e)),
        }
    }

    async fn add_member(
        &self,
        req: Request<AddMemberRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::Admin)?;
        self.require_leader()?;
        let r = req.into_inner();
        seed::validate_shoot_name(&r.name).map_err(|e| Status::invalid_argument(e.to_string()))?;
        r.address.parse::<SocketAddr>().map_err(|e| {
            Status::invalid_argument(format!("address {:?} is not host:port ({e})", r.address))
        })?;
        let state = self.shared.node.view().state;
        if state.member(&r.name).is_some() {
            return Err(Status::already_exists(format!("member {} exists", r.name)));
        }
        let id = state
            .next_member_id
            .max(state.members.iter().map(|m| m.id).max().unwrap_or(0) + 1);
        let epoch = match self.shared.bucket() {
            Some(bucket) => bucket.first_epoch(&r.name).await.map_err(|e| {
                Status::unavailable(format!(
                    "cannot read the epochs of shoot {} in the ring's bucket: {e}",
                    r.name
                ))
            })?,
            None => 1,
        };
        self.shared.directory.insert(&r.name, id, &r.address);
        let cmd = RingCommand::AddMember {
            name: r.name.clone(),
            id,
            address: r.address,
            epoch,
        };
        self.shared
            .node
            .change_membership(cmd, self.shared.proposal_timeout())
            .await
            .map_err(propose_status)?;
        Ok(Response::new(MembershipReply {
            detail: format!("added {} with Raft id {id}", r.name),
            id,
        }))
    }

    async fn remove_member(
        &self,
        req: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::Admin)?;
        self.require_leader()?;
        let r = req.into_inner();
        let state = self.shared.node.view().state;
        if state.member(&r.name).is_none() {
            return Err(Status::not_found(format!("no member {}", r.name)));
        }
        if state.members.len() <= 3 {
            return Err(Status::failed_precondition(format!(
                "removing {} would leave {} members; a ring needs at least 3",
                r.name,
                state.members.len() - 1
            )));
        }
        let hosted: Vec<&str> = state
            .placements
            .values()
            .filter(|p| p.host == r.name && p.shoot != r.name)
            .map(|p| p.shoot.as_str())
            .collect();
        if !hosted.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{} hosts the control plane of {}; it can leave once that moved (planned migration)",
                r.name,
                hosted.join(", ")
            )));
        }
        let cmd = RingCommand::RemoveMember {
            name: r.name.clone(),
        };
        self.shared
            .node
            .change_membership(cmd, self.shared.proposal_timeout())
            .await
            .map_err(propose_status)?;
        Ok(Response::new(MembershipReply {
            detail: format!("removed {}", r.name),
            id: 0,
        }))
    }

    async fn migrate(
        &self,
        req: Request<MigrateRequest>,
    ) -> Result<Response<MigrateReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::Admin)?;
        self.require_leader()?;
        let r = req.into_inner();
        // asked again while the move runs (a client retrying after a
        // timeout whose proposal committed after all): the same move
        if let Some(id) = self.open_migration(&r.shoot, &r.to) {
            return Ok(Response::new(MigrateReply { operation: id }));
        }
        let cmd = RingCommand::StartMigration {
            shoot: r.shoot.clone(),
            to: r.to.clone(),
            at_ms: now_ms(),
        };
        match self.shared.propose(cmd).await {
            Ok(_) => {}
            // a proposal that timed out may still commit: wait a little for it
            Err(e @ (ProposeError::Timeout(_) | ProposeError::LeaderChanged)) => {
                let deadline = tokio::time::Instant::now() + self.shared.proposal_timeout();
                while tokio::time::Instant::now() < deadline {
                    if let Some(id) = self.open_migration(&r.shoot, &r.to) {
                        return Ok(Response::new(MigrateReply { operation: id }));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                return Err(Status::unavailable(format!(
                    "{e}; it may still start: `ringctl status` shows it, and asking again follows it"
                )));
            }
            Err(e) => return Err(propose_status(e)),
        }
        let op = self
            .open_migration(&r.shoot, &r.to)
            .ok_or_else(|| Status::internal("the migration was committed but is not open"))?;
        Ok(Response::new(MigrateReply { operation: op }))
    }

    type FetchHandoverStream =
        tokio_stream::wrappers::ReceiverStream<Result<HandoverChunk, Status>>;

    async fn fetch_handover(
        &self,
        req: Request<HandoverRequest>,
    ) -> Result<Response<Self::FetchHandoverStream>, Status> {
        let caller = authorize(&req, &self.shared.directory, Caller::Member)?;
        let r = req.into_inner();
        let state = self.shared.node.view().state;
        let op = state
            .operations
            .iter()
            .find(|o| o.id == r.operation)
            .ok_or_else(|| Status::not_found(format!("no operation {}", r.operation)))?;
        if !op.is_migration()
            || op.shoot() != r.shoot
            || op.target() != caller
            || op.source() != self.shared.name()
        {
            return Err(Status::permission_denied(format!(
                "operation {} does not hand {} over from {} to {caller}",
                r.operation,
                r.shoot,
                self.shared.name()
            )));
        }
        if op.step != OperationStep::Restoring {
            return Err(Status::failed_precondition(format!(
                "operation {} is {:?}, not Restoring",
                op.id, op.step
            )));
        }
        let (dir, files) = handover_files(&self.shared, &r.shoot)?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(stream_files(dir, files, tx));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn probe(&self, req: Request<ProbeRequest>) -> Result<Response<ProbeReply>, Status> {
        authorize(&req, &self.shared.directory, Caller::MemberOrAdmin)?;
        let payload = req.into_inner().payload;
        if payload.len() > 64 * 1024 {
            return Err(Status::invalid_argument("probe payload larger than 64 KiB"));
        }
        let index = self
            .shared
            .propose(RingCommand::Probe { payload })
            .await
            .map_err(propose_status)?;
        Ok(Response::new(ProbeReply {
            index,
            term: self.shared.node.view().term,
        }))
    }
}

/// The handover files of `shoot` on this member's seed.
fn handover_files(
    shared: &Shared,
    shoot: &str,
) -> Result<(std::path::PathBuf, Vec<std::path::PathBuf>), Status> {
    let executor = shared
        .executor()
        .ok_or_else(|| Status::failed_precondition("this member has no seed"))?;
    let mover = executor.mover().map_err(Status::failed_precondition)?;
    mover
        .handover_files(shoot)
        .map_err(|e| Status::internal(e.to_string()))
}

/// Sends `files` (relative to `dir`) in chunks of 256 KiB, each file ending
/// with an empty `eof` chunk; stops at the first error (sent to the caller).
async fn stream_files(
    dir: std::path::PathBuf,
    files: Vec<std::path::PathBuf>,
    tx: tokio::sync::mpsc::Sender<Result<HandoverChunk, Status>>,
) {
    use tokio::io::AsyncReadExt;
    for rel in files {
        let path = dir.join(&rel);
        let name = rel.display().to_string();
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) => {
                let _ = tx
                    .send(Err(Status::internal(format!("{}: {e}", path.display()))))
                    .await;
                return;
            }
        };
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = match file.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    let _ = tx
                        .send(Err(Status::internal(format!("{}: {e}", path.display()))))
                        .await;
                    return;
                }
            };
            let chunk = HandoverChunk {
                path: name.clone(),
                data: buf[..n].to_vec(),
                eof: n == 0,
            };
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
            if n == 0 {
                break;
            }
        }
    }
}
