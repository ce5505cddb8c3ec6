use raft::prelude::{ConfChange, Entry, MessageType};

use super::*;
use crate::state::tests::ring3;

/// Ring a, b, c (a hosts b, b hosts c, c hosts a) with a planned move of
/// shoot c from b to a open, and that operation's id.
fn ring_with_migration() -> (RingState, u64) {
    let mut s = ring3();
    s.apply(&RingCommand::StartMigration {
        shoot: "c".into(),
        to: "a".into(),
        at_ms: 1_000,
    })
    .unwrap();
    let id = s.operations[0].id;
    (s, id)
}

fn renew(holder: &str, shoot: &str) -> RingCommand {
    RingCommand::RenewLease {
        shoot: shoot.into(),
        holder: holder.into(),
        epoch: 1,
        expires_at_ms: 10_000,
    }
}

fn advance(id: u64) -> RingCommand {
    RingCommand::AdvanceOperation {
        id,
        step: crate::state::OperationStep::Restoring,
        detail: String::new(),
        at_ms: 2_000,
        outcome: None,
    }
}

fn backup(shoot: &str) -> RingCommand {
    RingCommand::ReportBackup {
        shoot: shoot.into(),
        revision: 7,
        at_ms: 2_000,
        seen: None,
    }
}

/// Each member may propose what its own duties need, and nothing for
/// another member's shoots or operations; the leader's commands never.
#[test]
fn a_member_proposes_only_for_what_it_hosts_or_executes() {
    let (s, op) = ring_with_migration();
    let leader_only = [
        RingCommand::Bootstrap {
            members: vec![],
            epochs: Default::default(),
            hosts: Default::default(),
        },
        RingCommand::MarkDown {
            member: "a".into(),
            at_ms: 1,
        },
        RingCommand::MarkUp {
            member: "a".into(),
            at_ms: 1,
        },
        RingCommand::StartFailover {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
            not_before_ms: 1,
            seen: None,
            promote: false,
        },
        RingCommand::StartMigration {
            shoot: "b".into(),
            to: "c".into(),
            at_ms: 1,
        },
        RingCommand::AddMember {
            name: "d".into(),
            id: 4,
            address: "127.0.0.1:4".into(),
            epoch: 0,
        },
        RingCommand::RemoveMember { name: "a".into() },
    ];
    let mut table: Vec<(&str, RingCommand, bool)> = vec![
        ("a", renew("a", "b"), true),
        ("b", renew("a", "b"), false), // in another member's name
        ("b", backup("c"), true),      // b hosts c
        ("a", backup("c"), false),     // the target does not host it yet
        ("c", backup("c"), false),
        ("a", advance(op), true), // target of the move
        ("b", advance(op), true), // its source
        ("c", advance(op), false),
        ("c", advance(op + 9), false), // no such operation
        (
            "b",
            RingCommand::HandoverReady {
                id: op,
                revision: 5,
                at_ms: 3_000,
            },
            true,
        ),
        (
            "a",
            RingCommand::HandoverReady {
                id: op,
                revision: 5,
                at_ms: 3_000,
            },
            false,
        ),
        ("c", RingCommand::Probe { payload: vec![1] }, true),
    ];
    for cmd in leader_only {
        table.push(("a", cmd, false));
    }
    for (who, cmd, allowed) in table {
        let got = may_propose(&s, who, &cmd);
        assert_eq!(got.is_ok(), allowed, "{who} proposes {cmd:?}: {got:?}");
        if let Err(reason) = got {
            assert!(reason.starts_with(who), "{reason}");
        }
    }
}

fn propose_msg(from: u64, entries: Vec<Entry>) -> Message {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgPropose);
    m.from = from;
    m.to = 1;
    m.set_entries(entries.into());
    m
}

fn entry(proposal_id: u64, cmd: &RingCommand) -> Entry {
    let proposal = Proposal {
        id: proposal_id,
        command: cmd.clone(),
    };
    Entry {
        data: serde_json::to_vec(&proposal).unwrap().into(),
        ..Default::default()
    }
}

/// Whole messages: the proposer is the message's Raft id (b = 2); an empty
/// proposal, an unknown id, a membership change, a garbled entry and a
/// proposal id in another member's name are refused with the reason.
#[test]
fn peer_proposals_are_checked_as_a_whole() {
    let (s, _) = ring_with_migration();
    let ok = entry(2 << PROPOSAL_ID_BITS | 5, &backup("c"));
    assert_eq!(check(&s, &propose_msg(2, vec![ok.clone()])), Ok(()));
    assert_eq!(
        check(&s, &propose_msg(2, vec![entry(0, &backup("c"))])),
        Ok(())
    );

    let mut conf = Entry::default();
    conf.set_entry_type(EntryType::EntryConfChange);
    conf.data = protobuf::Message::write_to_bytes(&ConfChange::default())
        .unwrap()
        .into();
    let garbled = Entry {
        data: b"{not json".to_vec().into(),
        ..Default::default()
    };
    let cases: Vec<(Message, &str)> = vec![
        (propose_msg(2, vec![]), "without entries"),
        (propose_msg(9, vec![ok.clone()]), "not a member"),
        (propose_msg(2, vec![ok.clone(), conf]), "membership change"),
        (propose_msg(2, vec![garbled]), "undecodable"),
        (
            propose_msg(2, vec![entry(1 << PROPOSAL_ID_BITS | 5, &backup("c"))]),
            "another member's proposal id",
        ),
        (
            propose_msg(2, vec![ok, entry(0, &renew("a", "b"))]),
            "may not propose",
        ),
    ];
    for (msg, want) in cases {
        let err = check(&s, &msg).unwrap_err();
        assert!(err.contains(want), "{want}: {err}");
    }
}
