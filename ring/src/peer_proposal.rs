//! Which proposals a member may make through its peers. raft-rs forwards a
//! follower's proposal to the leader as a `MsgPropose` that carries the
//! proposer's Raft id, which the transport has already tied to the sender's
//! certificate. Every member steps such messages through [`check`] first: a
//! member proposes only what its own duties need (its leases, its backups,
//! the operations it executes, probes); everything else (failovers,
//! migrations, membership, marking members down) is the leader's own work,
//! decided by the leader or asked for through its admin API. Pure checks
//! over the applied ring state, no I/O.

use raft::prelude::{EntryType, Message};
use serde::{Deserialize, Serialize};

use crate::state::{RingCommand, RingState};

/// What travels in a normal entry (and in a conf change's context).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Proposal {
    /// Unique per proposing node (its Raft id in the top 16 bits); 0 = nobody waits.
    pub id: u64,
    pub command: RingCommand,
}

/// The bits of a proposal id below the proposer's Raft id.
pub(crate) const PROPOSAL_ID_BITS: u32 = 48;

/// Whether the peer proposal `msg` may be stepped into this node; the reason
/// names the member and what it may not do. A proposal without entries is
/// refused here: raft-rs's leader panics on one.
pub(crate) fn check(state: &RingState, msg: &Message) -> Result<(), String> {
    if msg.entries.is_empty() {
        return Err(format!(
            "Raft id {} sent a proposal without entries",
            msg.from
        ));
    }
    let member = state
        .member_by_id(msg.from)
        .ok_or_else(|| format!("Raft id {} is not a member of the ring", msg.from))?;
    let who = member.name.as_str();
    for e in msg.get_entries() {
        if e.get_entry_type() != EntryType::EntryNormal {
            return Err(format!(
                "{who} proposed a membership change; only the leader does (ringctl join/leave ask it)"
            ));
        }
        let p: Proposal = serde_json::from_slice(&e.data)
            .map_err(|err| format!("{who} proposed an undecodable entry ({err})"))?;
        if p.id != 0 && p.id >> PROPOSAL_ID_BITS != msg.from {
            return Err(format!("{who} proposed under another member's proposal id"));
        }
        may_propose(state, who, &p.command)?;
    }
    Ok(())
}

/// Whether `who` may propose `cmd` through a peer (see the module doc).
pub fn may_propose(state: &RingState, who: &str, cmd: &RingCommand) -> Result<(), String> {
    let operation = |id: u64| state.operations.iter().find(|o| o.id == id);
    let allowed = match cmd {
        RingCommand::RenewLease { holder, .. } => holder == who,
        RingCommand::HandoverReady { id, .. } => operation(*id).is_some_and(|o| o.source() == who),
        RingCommand::AdvanceOperation { id, .. } => {
            operation(*id).is_some_and(|o| o.source() == who || o.target() == who)
        }
        RingCommand::ReportBackup { shoot, .. } => {
            state.placements.get(shoot).is_some_and(|p| p.host == who)
        }
        RingCommand::StandbyReady { member, .. } => member == who,
        RingCommand::Probe { .. } => true,
        RingCommand::Bootstrap { .. }
        | RingCommand::SetStandby { .. }
        | RingCommand::MarkDown { .. }
        | RingCommand::MarkUp { .. }
        | RingCommand::StartFailover { .. }
        | RingCommand::StartMigration { .. }
        | RingCommand::AddMember { .. }
        | RingCommand::RemoveMember { .. } => {
            return Err(format!(
                "{who} proposed {}, which only the leader proposes",
                command_name(cmd)
            ))
        }
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "{who} may not propose {} for what it neither hosts nor executes: {cmd:?}",
            command_name(cmd)
        ))
    }
}

/// The command's name as it is serialized (`renewLease`, ...).
fn command_name(cmd: &RingCommand) -> String {
    serde_json::to_value(cmd)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_string))
        .unwrap_or_else(|| "a command".into())
}

#[cfg(test)]
#[path = "peer_proposal_tests.rs"]
mod tests;
