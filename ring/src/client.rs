//! Talking to a ringd as an administrator (ringctl).

use std::path::Path;
use std::time::Duration;

use ring_proto::v1::ring_admin_client::RingAdminClient;
use ring_proto::v1::{
    AddMemberRequest, MigrateRequest, ProbeRequest, RemoveMemberRequest, StatusRequest,
};
use tonic::transport::Channel;

use crate::identity::{IdentityPem, RingPki, ADMIN_NAME, ANY_MEMBER};
use crate::status::RingStatus;
use crate::transport::channel;
use crate::RingError;

/// How long [`AdminClient::ring_status`] waits for one member before it asks
/// the next.
pub const MEMBER_ANSWER: Duration = Duration::from_secs(2);

/// An administrator's connection to one ringd.
pub struct AdminClient {
    inner: RingAdminClient<Channel>,
    address: String,
}

fn rpc_err(address: &str, e: tonic::Status) -> RingError {
    RingError::Transport(format!(
        "ringd at {address}: {} ({:?})",
        e.message(),
        e.code()
    ))
}

impl AdminClient {
    /// Connects to `address` with the admin certificate in the ring PKI dir `pki`.
    pub fn connect(address: &str, pki: &Path) -> Result<Self, RingError> {
        let identity = IdentityPem::read(&RingPki::new(pki).files(ADMIN_NAME))?;
        Ok(AdminClient {
            inner: RingAdminClient::new(channel(&identity, address, ANY_MEMBER)?),
            address: address.to_string(),
        })
    }

    /// Connects to the current leader, asking the member at `address` who it is.
    pub async fn connect_leader(address: &str, pki: &Path) -> Result<Self, RingError> {
        Self::connect_leader_of(&[address.to_string()], pki).await
    }

    /// The ring's status as seen by the first of `addresses` that answers,
    /// preferring the leader's own view; a member that knows no leader (one
    /// cut off, or just restarted) is used only when no other answers. The
    /// error names every address tried and why it did not answer.
    pub async fn ring_status(addresses: &[String], pki: &Path) -> Result<RingStatus, RingError> {
        let mut failures = Vec::new();
        let mut leaderless = None;
        for address in addresses {
            let status = Self::status_within(address, pki, MEMBER_ANSWER).await;
            let s = match status {
                Ok(s) => s,
                Err(e) => {
                    failures.push(e.to_string());
                    continue;
                }
            };
            if s.leader.is_none() {
                leaderless.get_or_insert(s);
                continue;
            }
            if s.leader.as_ref() != Some(&s.member) {
                if let Some(leader) = s.leader_address() {
                    if let Ok(ls) = Self::status_within(leader, pki, MEMBER_ANSWER).await {
                        return Ok(ls);
                    }
                }
            }
            return Ok(s);
        }
        if let Some(s) = leaderless {
            return Ok(s);
        }
        Err(RingError::Transport(if failures.is_empty() {
            "no ringd address to ask".to_string()
        } else {
            format!("no member answered: {}", failures.join("; "))
        }))
    }

    /// The status of the member at `address`, if it answers within `bound`:
    /// a stopped ringd (SIGSTOP, a frozen VM) still has its connections
    /// accepted by the kernel and would hold the caller for ever.
    pub async fn status_within(
        address: &str,
        pki: &Path,
        bound: Duration,
    ) -> Result<RingStatus, RingError> {
        let asked = async { Self::connect(address, pki)?.status().await };
        tokio::time::timeout(bound, asked).await.unwrap_or_else(|_| {
            Err(RingError::Transport(format!(
                "ringd at {address} did not answer within {bound:?} (stopped, or its machine overloaded)"
            )))
        })
    }

    /// Connects to the current leader, found through whichever of `addresses`
    /// answers first (any member may be down).
    pub async fn connect_leader_of(addresses: &[String], pki: &Path) -> Result<Self, RingError> {
        let status = Self::ring_status(addresses, pki).await?;
        let leader = status.leader.as_deref().ok_or_else(|| {
            RingError::Transport(format!(
                "{} answered but knows no leader (no quorum?)",
                status.member
            ))
        })?;
        let address = status.leader_address().ok_or_else(|| {
            RingError::Transport(format!("leader {leader} is not in the member list"))
        })?;
        Self::connect(address, pki)
    }

    /// The member's view of the ring.
    pub async fn status(&mut self) -> Result<RingStatus, RingError> {
        let reply = self
            .inner
            .status(StatusRequest {})
            .await
            .map_err(|e| rpc_err(&self.address, e))?;
        serde_json::from_str(&reply.into_inner().status_json).map_err(|e| {
            RingError::Transport(format!(
                "ringd at {}: undecodable status: {e}",
                self.address
            ))
        })
    }

    /// Commits a marker entry; returns its index and term.
    pub async fn probe(&mut self, payload: Vec<u8>) -> Result<(u64, u64), RingError> {
        let r = self
            .inner
            .probe(ProbeRequest { payload })
            .await
            .map_err(|e| rpc_err(&self.address, e))?
            .into_inner();
        Ok((r.index, r.term))
    }

    /// Adds a member; returns what happened and the member's Raft id.
    pub async fn add_member(
        &mut self,
        name: &str,
        address: &str,
    ) -> Result<(String, u64), RingError> {
        let r = self
            .inner
            .add_member(AddMemberRequest {
                name: name.into(),
                address: address.into(),
            })
            .await
            .map_err(|e| rpc_err(&self.address, e))?
            .into_inner();
        Ok((r.detail, r.id))
    }

    /// Starts a planned migration of `shoot`'s control plane to member `to`; returns the operation id.
    pub async fn migrate(&mut self, shoot: &str, to: &str) -> Result<u64, RingError> {
        let r = self
            .inner
            .migrate(MigrateRequest {
                shoot: shoot.into(),
                to: to.into(),
            })
            .await
            .map_err(|e| rpc_err(&self.address, e))?;
        Ok(r.into_inner().operation)
    }

    /// Waits until operation `id` is finished; returns it (Done or Failed).
    /// `on_step` sees every step change with the time since the start.
    pub async fn wait_operation(
        &mut self,
        id: u64,
        timeout: Duration,
        mut on_step: impl FnMut(&crate::state::Operation, Duration),
    ) -> Result<crate::state::Operation, RingError> {
        let started = tokio::time::Instant::now();
        let mut last: Option<crate::state::OperationStep> = None;
        loop {
            if let Ok(s) = self.status().await {
                if let Some(op) = s.operations.iter().find(|o| o.id == id) {
                    if last != Some(op.step) {
                        on_step(op, started.elapsed());
                        last = Some(op.step);
                    }
                    if op.step.is_finished() {
                        return Ok(op.clone());
                    }
                }
            }
            if started.elapsed() >= timeout {
                return Err(RingError::Transport(format!(
                    "operation {id} did not finish within {timeout:?} (last step {last:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Removes a member.
    pub async fn remove_member(&mut self, name: &str) -> Result<String, RingError> {
        let r = self
            .inner
            .remove_member(RemoveMemberRequest { name: name.into() })
            .await
            .map_err(|e| rpc_err(&self.address, e))?;
        Ok(r.into_inner().detail)
    }
}

/// Polls `address` until `check` accepts its status, or fails after `timeout` with the last answer.
pub async fn wait_status(
    address: &str,
    pki: &Path,
    timeout: Duration,
    mut check: impl FnMut(&RingStatus) -> bool,
) -> Result<RingStatus, RingError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut client = AdminClient::connect(address, pki)?;
    loop {
        let last = match client.status().await {
            Ok(s) if check(&s) => return Ok(s),
            Ok(s) => format!("{s:?}"),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(RingError::Transport(format!(
                "timed out after {timeout:?}; last answer: {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member whose connections are accepted but never answered (a ringd
    /// under SIGSTOP) costs [`MEMBER_ANSWER`], and the error names it; it
    /// held the caller until the member continued before (the drill's
    /// observer saw a stalled leader's ring for 20 s late).
    #[tokio::test]
    async fn a_member_that_never_answers_is_given_up_after_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let pki = RingPki::new(dir.path());
        pki.ensure_ca().unwrap();
        pki.ensure_admin().unwrap();
        let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = stalled.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((conn, _)) = stalled.accept().await {
                open.push(conn);
            }
        });
        let addresses = [address.clone()];
        let asked = AdminClient::ring_status(&addresses, dir.path());
        let answer = tokio::time::timeout(MEMBER_ANSWER * 3, asked)
            .await
            .expect("ring_status gave up on the stalled member within its bound");
        let e = answer.unwrap_err().to_string();
        assert!(
            e.contains(&address) && e.contains("did not answer within"),
            "{e}"
        );
        held.abort();
    }
}
