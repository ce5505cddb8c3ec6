//! The restore as an explicit state machine: [`RestoreState::action`] says
//! what to do next, the pure [`step`] applies what happened, and the state is
//! saved in the work dir after every step so a rerun resumes.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{FullInfo, RestoreReport};
use crate::catalog::Plan;
use crate::error::io_at;
use crate::{BackupError, Result};

/// Where a restore is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum RestoreState {
    /// Nothing chosen yet; `excluded` full snapshots turned out too new.
    Start { excluded: Vec<String> },
    /// Objects chosen.
    Planned { plan: Plan, excluded: Vec<String> },
    /// The full snapshot is downloaded, checked and decrypted.
    Downloaded {
        plan: Plan,
        excluded: Vec<String>,
        full: FullInfo,
    },
    /// `etcdutl snapshot restore` made the data dir in the work dir.
    SnapshotRestored {
        plan: Plan,
        excluded: Vec<String>,
        full: FullInfo,
    },
    /// Deltas replayed and verified; the data dir waits to be moved in place.
    Replayed { report: RestoreReport },
    /// Finished.
    Done { report: RestoreReport },
}

impl RestoreState {
    /// The full snapshots found too new or damaged so far (none once the
    /// replay ended: nothing is planned again then).
    pub fn excluded(&self) -> &[String] {
        match self {
            RestoreState::Start { excluded }
            | RestoreState::Planned { excluded, .. }
            | RestoreState::Downloaded { excluded, .. }
            | RestoreState::SnapshotRestored { excluded, .. } => excluded,
            RestoreState::Replayed { .. } | RestoreState::Done { .. } => &[],
        }
    }

    /// The objects chosen, once they are and until the replay ends.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            RestoreState::Planned { plan, .. }
            | RestoreState::Downloaded { plan, .. }
            | RestoreState::SnapshotRestored { plan, .. } => Some(plan),
            RestoreState::Start { .. }
            | RestoreState::Replayed { .. }
            | RestoreState::Done { .. } => None,
        }
    }
}

/// The next thing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Plan,
    Download,
    RestoreSnapshot,
    Replay,
    Finalize,
    Done,
}

/// What an action achieved.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Planned(Plan),
    Downloaded(FullInfo),
    SnapshotRestored,
    Replayed(RestoreReport),
    /// The restored snapshot already holds revisions past the target (it was
    /// taken while etcd was written): plan again without it.
    FullTooNew {
        restored_revision: i64,
    },
    /// The planned full snapshot failed its checks: plan again without it.
    FullCorrupt {
        object: String,
        problem: String,
    },
    Finalized,
}

impl RestoreState {
    /// What to do next.
    pub fn action(&self) -> Action {
        match self {
            RestoreState::Start { .. } => Action::Plan,
            RestoreState::Planned { .. } => Action::Download,
            RestoreState::Downloaded { .. } => Action::RestoreSnapshot,
            RestoreState::SnapshotRestored { .. } => Action::Replay,
            RestoreState::Replayed { .. } => Action::Finalize,
            RestoreState::Done { .. } => Action::Done,
        }
    }
}

/// The state after `outcome` (pure). An outcome that does not fit the state is
/// an error, never a silent skip.
pub fn step(state: RestoreState, outcome: Outcome) -> Result<RestoreState> {
    use Outcome as O;
    use RestoreState as S;
    Ok(match (state, outcome) {
        (S::Start { excluded }, O::Planned(plan)) => S::Planned { plan, excluded },
        (S::Planned { plan, excluded }, O::Downloaded(full)) => S::Downloaded {
            plan,
            excluded,
            full,
        },
        (
            S::Downloaded {
                plan,
                excluded,
                full,
            },
            O::SnapshotRestored,
        ) => S::SnapshotRestored {
            plan,
            excluded,
            full,
        },
        (S::SnapshotRestored { .. }, O::Replayed(report)) => S::Replayed { report },
        (
            S::SnapshotRestored {
                plan, mut excluded, ..
            },
            O::FullTooNew { .. },
        ) => {
            excluded.push(plan.full.name);
            S::Start { excluded }
        }
        (S::Planned { plan, mut excluded }, O::FullCorrupt { .. }) => {
            excluded.push(plan.full.name);
            S::Start { excluded }
        }
        (S::Replayed { report }, O::Finalized) => S::Done { report },
        (state, outcome) => {
            return Err(BackupError::Restore(format!(
                "internal: outcome {outcome:?} does not fit state {:?}",
                state.action()
            )))
        }
    })
}

#[derive(Serialize, Deserialize)]
struct Saved {
    fingerprint: String,
    state: RestoreState,
    /// The full snapshots found corrupt so far, with what was wrong (for the
    /// report, also after a restart).
    #[serde(default)]
    damaged: Vec<(String, String)>,
}

/// The saved state of the restore with `fingerprint` and the damage found so
/// far; a fresh start if none is saved or the options differ.
pub(super) fn load_state(path: &Path, fingerprint: &str) -> (RestoreState, Vec<(String, String)>) {
    let fresh = (RestoreState::Start { excluded: vec![] }, vec![]);
    let Ok(bytes) = std::fs::read(path) else {
        return fresh;
    };
    match serde_json::from_slice::<Saved>(&bytes) {
        Ok(s) if s.fingerprint == fingerprint => {
            tracing::info!(state = ?s.state.action(), "resuming a restore");
            (s.state, s.damaged)
        }
        _ => fresh,
    }
}

pub(super) fn save_state(
    path: &Path,
    fingerprint: &str,
    state: &RestoreState,
    damaged: &[(String, String)],
) -> Result<()> {
    let json = serde_json::to_vec_pretty(&Saved {
        fingerprint: fingerprint.to_string(),
        state: state.clone(),
        damaged: damaged.to_vec(),
    })
    .map_err(|e| BackupError::Restore(format!("cannot encode the state: {e}")))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, json).map_err(io_at("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_at("renaming", &tmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{object_name, Entry, Kind};
    use crate::restore::RestoreReport;

    fn plan(full: i64) -> Plan {
        let name = object_name(Kind::Full, full, full, 0, true, false);
        Plan {
            target_revision: 50,
            full: crate::catalog::parse_name(&name, 1).unwrap(),
            deltas: Vec::<Entry>::new(),
            gaps: vec![],
        }
    }

    fn info() -> FullInfo {
        FullInfo {
            base_revision: 40,
            revision_after: 45,
            keys: 3,
            hash_kv: None,
            db_bytes: 10,
        }
    }

    fn report() -> RestoreReport {
        RestoreReport {
            data_dir: "/d".into(),
            target_revision: 50,
            reached_revision: 50,
            full: "f".into(),
            full_revision: 41,
            deltas: 1,
            revisions_replayed: 9,
            events_replayed: 9,
            revisions_from_log: 0,
            replay_seconds: 0.1,
            expected_keys: 3,
            keys: 3,
            hash_kv: "equal".into(),
            gaps: vec![],
            verified: true,
            total_seconds: 0.0,
            corrupt: vec![],
            objects: None,
            hash_kv_at_reached: None,
        }
    }

    #[test]
    fn walks_every_step_in_order() {
        let mut s = RestoreState::Start { excluded: vec![] };
        let mut seen = vec![];
        loop {
            let a = s.action();
            seen.push(a);
            let o = match a {
                Action::Plan => Outcome::Planned(plan(40)),
                Action::Download => Outcome::Downloaded(info()),
                Action::RestoreSnapshot => Outcome::SnapshotRestored,
                Action::Replay => Outcome::Replayed(report()),
                Action::Finalize => Outcome::Finalized,
                Action::Done => break,
            };
            s = step(s, o).unwrap();
        }
        use Action::*;
        assert_eq!(
            seen,
            [Plan, Download, RestoreSnapshot, Replay, Finalize, Done]
        );
    }

    #[test]
    fn a_too_new_full_snapshot_is_excluded_and_planning_starts_over() {
        let s = RestoreState::SnapshotRestored {
            plan: plan(45),
            excluded: vec!["older-too-new".into()],
            full: info(),
        };
        let s = step(
            s,
            Outcome::FullTooNew {
                restored_revision: 51,
            },
        )
        .unwrap();
        match &s {
            RestoreState::Start { excluded } => {
                assert_eq!(excluded.len(), 2);
                assert!(excluded[1].starts_with("full-00000000000000000045"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_corrupt_full_snapshot_is_excluded_and_planning_starts_over() {
        let s = RestoreState::Planned {
            plan: plan(45),
            excluded: vec![],
        };
        let s = step(
            s,
            Outcome::FullCorrupt {
                object: "full-x".into(),
                problem: "checksum".into(),
            },
        )
        .unwrap();
        match &s {
            RestoreState::Start { excluded } => {
                assert_eq!(excluded.len(), 1);
                assert!(excluded[0].starts_with("full-00000000000000000045"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn outcomes_that_do_not_fit_are_errors_and_state_survives_a_round_trip() {
        let s = RestoreState::Start { excluded: vec![] };
        assert!(step(s.clone(), Outcome::Finalized).is_err());
        assert!(step(s, Outcome::SnapshotRestored).is_err());
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("state.json");
        let state = RestoreState::SnapshotRestored {
            plan: plan(40),
            excluded: vec![],
            full: info(),
        };
        let damaged = vec![("full-9".to_string(), "checksum mismatch".to_string())];
        save_state(&path, "fp", &state, &damaged).unwrap();
        assert_eq!(load_state(&path, "fp"), (state, damaged), "resumes");
        assert_eq!(
            load_state(&path, "other"),
            (RestoreState::Start { excluded: vec![] }, vec![]),
            "other options start over"
        );
    }
}
