//! The member's hot standby duties (protection `standby`), decided like the
//! rest of [`super::duties`]: as the assigned standby, join the shoot's etcd
//! and report ready once it votes; as a seed running a standby no longer
//! assigned to it, leave; as the serving host, keep the shoot's etcd to the
//! standby the ring assigned (members it no longer has are removed).

use std::time::Instant;

use super::{Duty, Observed, ShootSeen};
use crate::state::RingState;

/// The standby duties of `me` for `shoot`.
pub(super) fn standby_duties(
    state: &RingState,
    me: &str,
    shoot: &str,
    seen: &ShootSeen,
    observed: &Observed,
    now: Instant,
    out: &mut Vec<Duty>,
) {
    let Some(p) = state.placements.get(shoot) else {
        return;
    };
    if seen.standby_retry_at.is_some_and(|t| now < t) {
        return;
    }
    let op = state.open_operation(shoot);
    let promoting_here = op.is_some_and(|o| o.promotes() && o.target() == me);
    let assigned = p
        .standby
        .as_ref()
        .filter(|s| s.member == me && p.host != me);
    let shoot_s = shoot.to_string();
    match assigned {
        Some(s) if op.is_none() => {
            let detail = match (&observed.seed.standby, observed.seed.bucket) {
                (Err(why), _) => format!("cannot run the standby of {shoot}: {why}"),
                (Ok(()), false) => format!(
                    "cannot run the standby of {shoot}: no backup bucket to fetch its certificates from"
                ),
                (Ok(()), true) => {
                    if !seen.standby_running || !s.ready {
                        let slot = state.member(me).map_or(0, |m| m.id);
                        out.push(Duty::JoinStandby {
                            shoot: shoot_s.clone(),
                            epoch: p.epoch,
                            slot,
                        });
                    }
                    // its etcd's certificates are the shoot's leaves, renewed
                    // here as the host renews its own, once it votes
                    let due = seen.certificates_at.is_none_or(|t| now >= t);
                    if seen.standby_running && s.ready && due {
                        out.push(Duty::RenewCertificates {
                            shoot: shoot_s.clone(),
                        });
                    }
                    let how = if s.ready { "votes" } else { "joining" };
                    format!("standby of {shoot} (served by {}): {how}", p.host)
                }
            };
            out.push(Duty::Report {
                shoot: shoot_s.clone(),
                detail,
            });
        }
        None if seen.standby_running && !promoting_here => out.push(Duty::LeaveStandby {
            shoot: shoot_s.clone(),
            keep: p.host == me,
        }),
        _ => {}
    }
    if p.host == me && seen.serving && op.is_none() {
        let keep = p
            .standby
            .as_ref()
            .and_then(|s| state.member(&s.member))
            .map(|m| m.id % 1000);
        let peers = seen.etcd_peers.as_deref().unwrap_or(&[]);
        let stray = peers.iter().any(|slot| slot.is_none() || *slot != keep);
        // a standby that does not vote yet cannot have taken the quorum: a
        // voter from before did (its member died, or died and came back and
        // is assigned again under the same id): every peer goes, known or
        // not (an etcd that lost its quorum before it became ready answers
        // no member list)
        let ready = p.standby.as_ref().is_some_and(|s| s.ready);
        let some_or_unknown = seen.etcd_peers.as_ref().is_none_or(|p| !p.is_empty());
        let stale = !ready && some_or_unknown && seen.etcd_quorum == Some(false);
        if stray || stale {
            out.push(Duty::DropPeers {
                shoot: shoot_s,
                keep: if stale { None } else { keep },
            });
        }
    }
}
