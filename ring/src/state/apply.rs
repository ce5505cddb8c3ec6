//! Applying commands to the ring state: one named step per command.

use super::*;

/// A failover's facts besides its shoot and target.
struct NewFailover {
    at_ms: u64,
    not_before_ms: u64,
    seen: Option<SeenRevision>,
    promote: bool,
}

impl RingState {
    /// Applies `cmd`; a rejected command changes nothing.
    pub fn apply(&mut self, cmd: &RingCommand) -> Result<(), Rejection> {
        match cmd {
            RingCommand::Bootstrap {
                members,
                epochs,
                hosts,
            } => self.bootstrap(members, epochs, hosts),
            RingCommand::MarkDown { member, at_ms } => self.mark_down(member, *at_ms),
            RingCommand::MarkUp { member, at_ms } => self.mark_up(member, *at_ms),
            RingCommand::RenewLease {
                shoot,
                holder,
                epoch,
                expires_at_ms,
            } => self.renew_lease(shoot, holder, *epoch, *expires_at_ms),
            RingCommand::StartFailover {
                shoot,
                to,
                at_ms,
                not_before_ms,
                seen,
                promote,
            } => {
                let failover = NewFailover {
                    at_ms: *at_ms,
                    not_before_ms: *not_before_ms,
                    seen: *seen,
                    promote: *promote,
                };
                self.start_failover(shoot, to, failover)
            }
            RingCommand::SetStandby {
                shoot,
                epoch,
                member,
            } => self.set_standby(shoot, *epoch, member.as_deref()),
            RingCommand::StandbyReady {
                shoot,
                epoch,
                member,
                warm,
            } => self.standby_ready(shoot, *epoch, member, *warm),
            RingCommand::StartMigration { shoot, to, at_ms } => {
                self.start_migration(shoot, to, *at_ms)
            }
            RingCommand::HandoverReady {
                id,
                revision,
                at_ms,
            } => self.handover_ready(*id, *revision, *at_ms),
            RingCommand::AdvanceOperation {
                id,
                step,
                detail,
                at_ms,
                outcome,
            } => self.advance_operation(*id, *step, detail, *at_ms, outcome.as_ref()),
            RingCommand::ReportBackup {
                shoot,
                revision,
                at_ms,
                seen,
            } => self.report_backup(shoot, *revision, *at_ms, *seen),
            RingCommand::AddMember {
                name,
                id,
                address,
                epoch,
            } => self.add_member(name, *id, address, *epoch),
            RingCommand::RemoveMember { name } => self.remove_member(name),
            RingCommand::Probe { .. } => Ok(()),
        }
    }

    /// Creates the ring: each member hosts its successor, but for the shoots
    /// `hosts` places elsewhere.
    fn bootstrap(
        &mut self,
        members: &[(String, u64, String)],
        epochs: &std::collections::BTreeMap<String, u64>,
        hosts: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), Rejection> {
        if !self.members.is_empty() {
            return Err("the ring is already bootstrapped".into());
        }
        let known = |name: &str| members.iter().any(|(m, _, _)| m == name);
        if let Some((shoot, host)) = hosts.iter().find(|(s, h)| !known(s) || !known(h)) {
            return Err(format!(
                "the first host of {shoot} is {host}, but both must be members of the new ring"
            ));
        }
        let n = members.len();
        for (i, (name, id, address)) in members.iter().enumerate() {
            self.members.push(Member {
                name: name.clone(),
                id: *id,
                address: address.clone(),
                state: MemberState::Up,
                down_since_ms: None,
                up_since_ms: None,
            });
            self.next_member_id = self.next_member_id.max(id + 1);
            let host = hosts.get(name).unwrap_or(&members[(i + n - 1) % n].0);
            self.placements.insert(
                name.to_string(),
                Placement {
                    shoot: name.to_string(),
                    host: host.clone(),
                    epoch: epochs.get(name).copied().unwrap_or(1).max(1),
                    lease: None,
                    standby: None,
                },
            );
        }
        Ok(())
    }

    /// The leader declared `member` down.
    fn mark_down(&mut self, member: &str, at_ms: u64) -> Result<(), Rejection> {
        let m = self.member_mut(member)?;
        if m.state == MemberState::Down {
            return Err(format!("member {member} is already down"));
        }
        m.state = MemberState::Down;
        m.down_since_ms = Some(at_ms);
        Ok(())
    }

    /// `member` reports again.
    fn mark_up(&mut self, member: &str, at_ms: u64) -> Result<(), Rejection> {
        let m = self.member_mut(member)?;
        if m.state == MemberState::Up {
            return Err(format!("member {member} is already up"));
        }
        m.state = MemberState::Up;
        m.down_since_ms = None;
        m.up_since_ms = Some(at_ms);
        Ok(())
    }

    /// Extends (or grants) the lease of the shoot's host for the current epoch.
    fn renew_lease(
        &mut self,
        shoot: &str,
        holder: &str,
        epoch: u64,
        expires_at_ms: u64,
    ) -> Result<(), Rejection> {
        if let Some(op) = self.open_operation(shoot) {
            if op.target() != holder || op.step != OperationStep::Restoring {
                return Err(format!(
                    "operation {} on shoot {shoot} is {:?}; no lease until it is done",
                    op.id, op.step
                ));
            }
        }
        let p = self
            .placements
            .get_mut(shoot)
            .ok_or_else(|| format!("no shoot {shoot}"))?;
        if p.host != holder {
            return Err(format!(
                "shoot {shoot} is hosted by {}, not {holder}",
                p.host
            ));
        }
        if p.epoch != epoch {
            return Err(format!(
                "stale epoch {epoch}: shoot {shoot} is at epoch {}",
                p.epoch
            ));
        }
        let expires = p
            .lease
            .as_ref()
            .map_or(0, |l| l.expires_at_ms)
            .max(expires_at_ms);
        p.lease = Some(Lease {
            holder: holder.to_string(),
            epoch,
            expires_at_ms: expires,
        });
        Ok(())
    }

    /// Moves `shoot` to `to` under a new epoch; waits for the old lease first.
    fn start_failover(&mut self, shoot: &str, to: &str, f: NewFailover) -> Result<(), Rejection> {
        let NewFailover {
            at_ms,
            not_before_ms,
            seen,
            promote,
        } = f;
        if let Some(op) = self.open_operation(shoot) {
            return Err(format!("operation {} already moves shoot {shoot}", op.id));
        }
        if self.member(to).is_none_or(|m| m.state != MemberState::Up) {
            return Err(format!("target {to} is not an up member"));
        }
        let p = self
            .placements
            .get_mut(shoot)
            .ok_or_else(|| format!("no shoot {shoot}"))?;
        if promote
            && p.standby
                .as_ref()
                .is_none_or(|s| s.member != to || !s.ready)
        {
            return Err(format!(
                "{to} holds no ready standby of shoot {shoot} to promote"
            ));
        }
        let from = std::mem::replace(&mut p.host, to.to_string());
        p.epoch += 1;
        p.lease = None;
        p.standby = None;
        let epoch = p.epoch;
        let id = self.next_operation_id;
        self.next_operation_id += 1;
        self.operations.push(Operation::new(
            id,
            OperationKind::Failover {
                shoot: shoot.to_string(),
                from,
                to: to.to_string(),
                epoch,
                not_before_ms,
                seen,
                promote,
            },
            OperationStep::WaitingForLeaseExpiry,
            "waiting for the old host's lease to expire".into(),
            at_ms,
        ));
        Ok(())
    }

    /// Opens a planned migration; the placement moves at handover.
    fn start_migration(&mut self, shoot: &str, to: &str, at_ms: u64) -> Result<(), Rejection> {
        if let Some(op) = self.open_operation(shoot) {
            return Err(format!("operation {} already moves shoot {shoot}", op.id));
        }
        let p = self
            .placements
            .get(shoot)
            .ok_or_else(|| format!("no shoot {shoot}"))?;
        if p.host == to {
            return Err(format!("shoot {shoot} is already hosted by {to}"));
        }
        if self.member(to).is_none_or(|m| m.state != MemberState::Up) {
            return Err(format!("target {to} is not an up member"));
        }
        if self
            .member(&p.host)
            .is_none_or(|m| m.state != MemberState::Up)
        {
            return Err(format!(
                "the host {} is down: that takes a failover, not a migration",
                p.host
            ));
        }
        let id = self.next_operation_id;
        self.next_operation_id += 1;
        let (from, epoch) = (p.host.clone(), p.epoch + 1);
        // the standby leaves before the handover: its seed may be the target,
        // and the target restores a cluster of one
        if let Some(p) = self.placements.get_mut(shoot) {
            p.standby = None;
        }
        self.operations.push(Operation::new(
            id,
            OperationKind::Migration {
                shoot: shoot.to_string(),
                from: from.clone(),
                to: to.to_string(),
                epoch,
                revision: None,
            },
            OperationStep::Pending,
            format!("{from} stops the writers and takes the final snapshot"),
            at_ms,
        ));
        Ok(())
    }

    /// The source took the final snapshot: the placement moves to the target.
    fn handover_ready(&mut self, id: u64, revision: i64, at_ms: u64) -> Result<(), Rejection> {
        let op = self
            .operations
            .iter_mut()
            .find(|o| o.id == id)
            .ok_or_else(|| format!("no operation {id}"))?;
        if op.step != OperationStep::Pending {
            // the same report committed twice (its proposer timed out
            // while the first copy was on its way): taken once
            let same = matches!(op.kind, OperationKind::Migration { revision: Some(r), .. } if r == revision);
            if same && !op.step.is_finished() {
                return Ok(());
            }
            return Err(format!("operation {id} is {:?}, not Pending", op.step));
        }
        let OperationKind::Migration {
            shoot,
            to,
            epoch,
            revision: rev,
            ..
        } = &mut op.kind
        else {
            return Err(format!("operation {id} is not a migration"));
        };
        *rev = Some(revision);
        let (shoot, to, epoch) = (shoot.clone(), to.clone(), *epoch);
        op.step = OperationStep::Restoring;
        op.detail = format!("{to} restores revision {revision}");
        op.updated_at_ms = at_ms;
        op.history.push(StepTime {
            step: op.step,
            at_ms,
        });
        let p = self
            .placements
            .get_mut(&shoot)
            .ok_or_else(|| format!("no shoot {shoot}"))?;
        p.host = to;
        p.epoch = epoch;
        p.lease = None;
        p.standby = None;
        Ok(())
    }

    /// Assigns or drops the hot standby of `shoot` (at its current epoch,
    /// with no operation open; never on its host or a member that is down).
    fn set_standby(
        &mut self,
        shoot: &str,
        epoch: u64,
        member: Option<&str>,
    ) -> Result<(), Rejection> {
        if let Some(op) = self.open_operation(shoot) {
            return Err(format!("operation {} moves shoot {shoot}", op.id));
        }
        if let Some(m) = member {
            if self.member(m).is_none_or(|m| m.state != MemberState::Up) {
                return Err(format!("standby {m} is not an up member"));
            }
        }
        let p = self
            .placements
            .get_mut(shoot)
            .ok_or_else(|| format!("no shoot {shoot}"))?;
        if p.epoch != epoch {
            return Err(format!(
                "stale epoch {epoch}: shoot {shoot} is at epoch {}",
                p.epoch
            ));
        }
        if member == Some(p.host.as_str()) {
            return Err(format!(
                "{} hosts shoot {shoot}; its standby goes elsewhere",
                p.host
            ));
        }
        p.standby = member.map(|m| Standby {
            member: m.to_string(),
            ready: false,
            warm: false,
        });
        Ok(())
    }

    /// The assigned standby of `shoot` votes.
    fn standby_ready(
        &mut self,
        shoot: &str,
        epoch: u64,
        member: &str,
        warm: bool,
    ) -> Result<(), Rejection> {
        let p = self
            .placements
            .get_mut(shoot)
            .ok_or_else(|| format!("no shoot {shoot}"))?;
        match &mut p.standby {
            Some(s) if s.member == member && p.epoch == epoch => {
                s.ready = true;
                s.warm = warm;
                Ok(())
            }
            _ => Err(format!(
                "{member} is not the standby of shoot {shoot} at epoch {epoch}"
            )),
        }
    }

    /// Moves an operation to `step`; a failed move rolls its placement back.
    fn advance_operation(
        &mut self,
        id: u64,
        step: OperationStep,
        detail: &str,
        at_ms: u64,
        outcome: Option<&Outcome>,
    ) -> Result<(), Rejection> {
        let op = self
            .operations
            .iter_mut()
            .find(|o| o.id == id)
            .ok_or_else(|| format!("no operation {id}"))?;
        if op.step == OperationStep::Done && step == OperationStep::Done {
            // the same report committed twice: taken once (its proposer
            // goes on with what follows it)
            return Ok(());
        }
        if op.step.is_finished() {
            return Err(format!("operation {id} is already {:?}", op.step));
        }
        if op.step != step {
            op.history.push(StepTime { step, at_ms });
        }
        op.step = step;
        op.detail = detail.to_string();
        op.updated_at_ms = at_ms;
        if outcome.is_some() {
            op.outcome = outcome.cloned();
        }
        // A failed move whose placement already went to the target rolls
        // back: the shoot returns to its source under a new epoch (the
        // target's lease, if any, becomes stale). After a planned handover
        // the source still has all the data and serves again; after a
        // failed failover the source is the dead member, so the leader
        // starts a new failover elsewhere.
        let rollback = match &op.kind {
            OperationKind::Migration {
                shoot,
                from,
                revision: Some(_),
                ..
            }
            | OperationKind::Failover { shoot, from, .. }
                if step == OperationStep::Failed =>
            {
                Some((shoot.to_string(), from.clone(), op.target().to_string()))
            }
            _ => None,
        };
        if let Some((shoot, from, to)) = rollback {
            if let Some(p) = self.placements.get_mut(&shoot) {
                if p.host == to {
                    p.host = from;
                    p.epoch += 1;
                    p.lease = None;
                    p.standby = None;
                }
            }
        }
        self.trim_operations();
        Ok(())
    }

    /// Keeps the newest durable backup revision of a shoot. While a failover
    /// of the shoot is open, the pointer keeps what the ring knew when it
    /// began: the failover's RPO is measured against it, and reports in that
    /// window come from the new host's restored data.
    fn report_backup(
        &mut self,
        shoot: &str,
        revision: u64,
        at_ms: u64,
        seen: Option<SeenRevision>,
    ) -> Result<(), Rejection> {
        if self
            .open_operation(shoot)
            .is_some_and(|o| matches!(o.kind, OperationKind::Failover { .. }))
        {
            return Ok(());
        }
        let entry = self
            .backups
            .entry(shoot.to_string())
            .or_insert(BackupPointer {
                revision: 0,
                at_ms: 0,
                seen: None,
            });
        if revision >= entry.revision {
            let seen = seen.max(entry.seen).filter(|s| s.revision >= revision);
            *entry = BackupPointer {
                revision,
                at_ms,
                seen,
            };
        }
        Ok(())
    }

    /// Adds a member at the end of the ring order.
    fn add_member(
        &mut self,
        name: &str,
        id: u64,
        address: &str,
        epoch: u64,
    ) -> Result<(), Rejection> {
        if self.member(name).is_some() || self.member_by_id(id).is_some() {
            return Err(format!("member {name} (id {id}) already exists"));
        }
        // The new member joins at the end of the ring order: its predecessor
        // (the previous last member) hosts its control plane.
        let host = self.members.last().map(|m| m.name.to_string());
        self.next_member_id = self.next_member_id.max(id + 1);
        self.members.push(Member {
            name: name.to_string(),
            id,
            address: address.to_string(),
            state: MemberState::Up,
            down_since_ms: None,
            up_since_ms: None,
        });
        if let Some(host) = host {
            self.placements
                .entry(name.to_string())
                .or_insert(Placement {
                    shoot: name.to_string(),
                    host,
                    epoch: epoch.max(1),
                    lease: None,
                    standby: None,
                });
        }
        Ok(())
    }

    /// Removes a member that hosts no other shoot.
    fn remove_member(&mut self, name: &str) -> Result<(), Rejection> {
        if self.member(name).is_none() {
            return Err(format!("no member {name}"));
        }
        let hosted: Vec<&str> = self
            .placements
            .values()
            .filter(|p| p.host == name && p.shoot != name)
            .map(|p| p.shoot.as_str())
            .collect();
        if !hosted.is_empty() {
            return Err(format!(
                "{name} hosts the control plane of {}; move it first (planned migration)",
                hosted.join(", ")
            ));
        }
        self.members.retain(|m| m.name != name);
        // The member's own cluster leaves the ring with it.
        self.placements.remove(name);
        Ok(())
    }
}
