//! A hot standby of a shoot's etcd: a second voting member, on another seed,
//! that holds every write etcd acknowledged; and its promotion when the host
//! is gone.
//!
//! **Joining** ([`add_learner`], [`joining_args`], [`promote_learner`]): the
//! standby is added as a learner, so the host keeps its quorum while the
//! standby copies the data, and is made a voter once etcd says it caught up.
//! From then on etcd acknowledges a write only once both members persisted it
//! in their logs.
//!
//! **Promotion** ([`promote`]): with the host gone the standby cannot elect
//! itself. Its log holds every acknowledged write, but its record of what is
//! committed may lag the dead leader's by a heartbeat, and etcd's
//! `--force-new-cluster` drops the entries past that record. So the log's
//! commit is first raised to its last entry ([`commit_log`]; an entry there
//! that was never committed was never acknowledged either, and a client that
//! saw its request fail may find it applied), then etcd re-forms the cluster
//! around this member alone and the member's peer URL becomes the one it
//! will serve at.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Instant;

use etcd_client::Client;
use prost::Message;

use crate::config::EtcdConfig;
use crate::error::io_at;
use crate::etcd::{self, call, TempEtcd};
use crate::etcd_wal::{self, chained, corrupt, scan, HardState, STATE};
use crate::{BackupError, Result};

/// A standby member's place in the cluster it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    /// Its etcd member id.
    pub id: u64,
    /// `--initial-cluster` for its first start: every member, itself included.
    pub initial_cluster: String,
    /// It was added now (not found from an earlier attempt).
    pub added: bool,
}

/// Adds a member at `peer_url` as a learner of the cluster `cfg` reaches and
/// returns how it starts as `name`. Idempotent: a member already listed with
/// that peer URL (an earlier attempt) is reused.
pub async fn add_learner(cfg: &EtcdConfig, name: &str, peer_url: &str) -> Result<Joined> {
    let endpoint = cfg.endpoints.join(",");
    let mut client = etcd::connect(cfg).await?;
    let listed = call(&endpoint, "listing members", client.member_list()).await?;
    let mut members: Vec<(u64, String, Vec<String>)> = listed
        .members()
        .iter()
        .map(|m| (m.id(), m.name().to_string(), m.peer_urls().to_vec()))
        .collect();
    let mine = |urls: &[String]| urls.iter().any(|u| u == peer_url);
    let added = !members.iter().any(|(_, _, urls)| mine(urls));
    if added {
        let opts = etcd_client::MemberAddOptions::new().with_is_learner();
        let added = call(
            &endpoint,
            "adding the standby as a learner",
            client.member_add([peer_url.to_string()], Some(opts)),
        )
        .await?;
        members = added
            .member_list()
            .iter()
            .map(|m| (m.id(), m.name().to_string(), m.peer_urls().to_vec()))
            .collect();
    }
    let mut joined = initial_cluster(&members, name, peer_url)?;
    joined.added = added;
    Ok(joined)
}

/// `--initial-cluster` from the member list: the new member (named `name`,
/// at `peer_url`) and every started one.
fn initial_cluster(
    members: &[(u64, String, Vec<String>)],
    name: &str,
    peer_url: &str,
) -> Result<Joined> {
    let mut parts = Vec::new();
    let mut id = None;
    for (member_id, member_name, urls) in members {
        let member_name = if urls.iter().any(|u| u == peer_url) {
            id = Some(*member_id);
            name
        } else if member_name.is_empty() {
            return Err(BackupError::Etcd {
                endpoint: urls.join(","),
                message: format!(
                    "member {member_id:x} at {} was added but never started; remove it (etcdctl member remove {member_id:x}) before a standby joins",
                    urls.join(",")
                ),
            });
        } else {
            member_name
        };
        parts.extend(urls.iter().map(|u| format!("{member_name}={u}")));
    }
    let id = id.ok_or_else(|| BackupError::Etcd {
        endpoint: peer_url.to_string(),
        message: "the member just added is missing from etcd's member list".into(),
    })?;
    Ok(Joined {
        id,
        initial_cluster: parts.join(","),
        added: false,
    })
}

/// The flags of a standby member's first start into an existing cluster
/// (TLS flags come on top).
pub fn joining_args(
    name: &str,
    data_dir: &Path,
    client_url: &str,
    peer_url: &str,
    initial_cluster: &str,
) -> Vec<String> {
    let mut args = etcd::single_member_args(name, data_dir, client_url, peer_url);
    for a in args
        .iter_mut()
        .filter(|a| a.starts_with("--initial-cluster="))
    {
        *a = format!("--initial-cluster={initial_cluster}");
    }
    args.push("--initial-cluster-state=existing".into());
    args
}

/// Makes learner `id` a voter once etcd says it caught up with the leader:
/// `Ok(false)` while it has not (ask again), `Ok(true)` once it votes.
pub async fn promote_learner(cfg: &EtcdConfig, id: u64) -> Result<bool> {
    let endpoint = cfg.endpoints.join(",");
    let mut client = etcd::connect(cfg).await?;
    if !is_learner(&mut client, &endpoint, id).await? {
        return Ok(true);
    }
    match client.member_promote(id).await {
        Ok(_) => Ok(true),
        // etcd refuses while the learner lags (FailedPrecondition)
        Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::FailedPrecondition => {
            Ok(false)
        }
        Err(e) => Err(etcd::err(&endpoint, "promoting the standby to a voter", e)),
    }
}

async fn is_learner(client: &mut Client, endpoint: &str, id: u64) -> Result<bool> {
    let listed = call(endpoint, "listing members", client.member_list()).await?;
    match listed.members().iter().find(|m| m.id() == id) {
        Some(m) => Ok(m.is_learner()),
        None => Err(BackupError::Etcd {
            endpoint: endpoint.to_string(),
            message: format!("member {id:x} is no longer in the cluster (removed?)"),
        }),
    }
}

/// The other members of the cluster `cfg` reaches (the one answering is left
/// out): (id, peer URLs).
pub async fn peers(cfg: &EtcdConfig) -> Result<Vec<(u64, Vec<String>)>> {
    let endpoint = cfg.endpoints.join(",");
    let mut client = etcd::connect(cfg).await?;
    let me = call(&endpoint, "status", client.status())
        .await?
        .header()
        .map_or(0, |h| h.member_id());
    let listed = call(&endpoint, "listing members", client.member_list()).await?;
    Ok(listed
        .members()
        .iter()
        .filter(|m| m.id() != me)
        .map(|m| (m.id(), m.peer_urls().to_vec()))
        .collect())
}

/// Removes member `id` from the cluster `cfg` reaches (it needs the
/// cluster's quorum: a voter that is gone takes a re-forming instead).
pub async fn remove(cfg: &EtcdConfig, id: u64) -> Result<()> {
    let endpoint = cfg.endpoints.join(",");
    let mut client = etcd::connect(cfg).await?;
    let removing = client.member_remove(id);
    match tokio::time::timeout(std::time::Duration::from_secs(3), removing).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(etcd::err(&endpoint, &format!("removing member {id:x}"), e)),
        Err(_) => Err(etcd::err(
            &endpoint,
            &format!("removing member {id:x}"),
            "no answer within 3 s (the cluster lost its quorum?)",
        )),
    }
}

/// Whether the cluster `cfg` reaches has a quorum: a linearizable read
/// answers within `within` (it needs the leader to hear from a majority).
pub async fn has_quorum(cfg: &EtcdConfig, within: std::time::Duration) -> bool {
    let Ok(mut client) = etcd::connect(cfg).await else {
        return false;
    };
    let read = client.get("ring/quorum-probe", None);
    matches!(tokio::time::timeout(within, read).await, Ok(Ok(_)))
}

/// Raises the commit recorded in the log under `data` (a stopped member's
/// data dir) to its last entry, so that a restart with `--force-new-cluster`
/// keeps every entry the log holds. Returns how many entries that counted as
/// committed anew (0: the log's commit was at its end already).
pub fn commit_log(data: &Path) -> Result<u64> {
    let files = etcd_wal::files(data)?;
    let Some(last) = files.last() else {
        return Err(BackupError::Restore(format!(
            "{} holds no etcd write-ahead log (member/wal/*.wal)",
            data.display()
        )));
    };
    let bytes = std::fs::read(last).map_err(io_at("reading", last))?;
    let tail = scan(last, &bytes)?;
    let (mut last_index, mut state) = (tail.last_index, tail.state);
    for file in files.iter().rev().skip(1) {
        if last_index.is_some() && state.is_some() {
            break;
        }
        let bytes = std::fs::read(file).map_err(io_at("reading", file))?;
        let s = scan(file, &bytes)?;
        last_index = last_index.or(s.last_index);
        state = state.or(s.state);
    }
    let Some(state) = state else {
        return Err(corrupt(last, "no raft state in any log file"));
    };
    let last_index = last_index.unwrap_or(0);
    if state.commit >= last_index {
        return Ok(0);
    }
    let raised = HardState {
        commit: last_index,
        ..state
    };
    let mut out = Vec::new();
    let mut crc = tail.crc;
    chained(&mut out, &mut crc, STATE, raised.encode_to_vec());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(last)
        .map_err(io_at("opening", last))?;
    f.seek(SeekFrom::Start(tail.end as u64))
        .and_then(|_| f.write_all(&out))
        .and_then(|_| f.sync_all())
        .map_err(io_at("writing", last))?;
    Ok(last_index - state.commit)
}

/// What a promotion did.
#[derive(Debug, Clone, PartialEq)]
pub struct Promotion {
    /// The revision the promoted member serves from.
    pub revision: i64,
    /// Keys at that revision.
    pub keys: i64,
    /// Log entries that counted as committed only once the log's commit was
    /// raised (the dead leader had not told this member yet).
    pub entries_committed: u64,
    pub seconds: f64,
}

/// Re-forms the stopped standby's data under `data` as a one-member cluster
/// holding everything in its log (see the module doc), with its peer URL set
/// to `peer_url`. etcd runs once for this on loopback (its log at `log`).
pub async fn promote(
    etcd_bin: &Path,
    data: &Path,
    name: &str,
    peer_url: &str,
    log: &Path,
) -> Result<Promotion> {
    let began = Instant::now();
    let entries_committed = commit_log(data)?;
    let mut temp = TempEtcd::start_alone(etcd_bin, data, name, log).await?;
    let result = async {
        let mut client = temp.client().await?;
        let status = etcd::status(&mut client, &temp.url).await?;
        let keys = etcd::key_count(&mut client, &temp.url, status.revision).await?;
        let listed = call(&temp.url, "listing members", client.member_list()).await?;
        let [me] = listed.members() else {
            return Err(BackupError::Restore(format!(
                "etcd kept {} members after --force-new-cluster on {}",
                listed.members().len(),
                data.display()
            )));
        };
        call(
            &temp.url,
            "setting the promoted member's peer URL",
            client.member_update(me.id(), [peer_url.to_string()]),
        )
        .await?;
        Ok(Promotion {
            revision: status.revision,
            keys,
            entries_committed,
            seconds: 0.0,
        })
    }
    .await;
    temp.stop().await;
    let mut p = result?;
    p.seconds = began.elapsed().as_secs_f64();
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd_wal::tests::{entry, log_from, state};
    use crate::etcd_wal::ENTRY;

    fn data_dir_with(files: &[Vec<u8>]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("member").join("wal");
        std::fs::create_dir_all(&wal).unwrap();
        for (i, bytes) in files.iter().enumerate() {
            std::fs::write(wal.join(format!("{i:016x}-{:016x}.wal", i * 10)), bytes).unwrap();
        }
        dir
    }

    fn commit_of_last(data: &Path) -> (Option<u64>, u64) {
        let files = etcd_wal::files(data).unwrap();
        let last = files.last().unwrap();
        let s = scan(last, &std::fs::read(last).unwrap()).unwrap();
        (s.last_index, s.state.unwrap().commit)
    }

    #[test]
    fn a_lagging_commit_is_raised_to_the_last_entry_once() {
        let put = |i| (ENTRY, entry(i, format!("put{i}").into_bytes()));
        let dir = data_dir_with(&[log_from(
            0,
            &[
                (ENTRY, entry(1, vec![1])),
                (STATE, state(1)),
                put(2),
                put(3),
                (STATE, state(2)),
                put(4),
            ],
        )]);
        assert_eq!(commit_log(dir.path()).unwrap(), 2);
        assert_eq!(commit_of_last(dir.path()), (Some(4), 4));
        assert_eq!(commit_log(dir.path()).unwrap(), 0, "raised already");
    }

    #[test]
    fn the_last_entry_may_be_in_an_earlier_file() {
        // a cut: the new file starts with the chain's CRC and a state record
        let first = log_from(
            0,
            &[
                (ENTRY, entry(1, vec![1])),
                (ENTRY, entry(2, b"a".to_vec())),
                (ENTRY, entry(3, b"b".to_vec())),
            ],
        );
        let crc_after_first = scan(Path::new("0.wal"), &first).unwrap().crc;
        let second = log_from(crc_after_first, &[(STATE, state(1))]);
        let dir = data_dir_with(&[first, second]);
        assert_eq!(commit_log(dir.path()).unwrap(), 2);
        assert_eq!(commit_of_last(dir.path()).1, 3);
    }

    #[test]
    fn a_missing_or_damaged_log_is_refused_with_its_path() {
        let empty = tempfile::tempdir().unwrap();
        let err = commit_log(empty.path()).unwrap_err().to_string();
        assert!(
            err.contains("member/wal") || err.contains("reading"),
            "{err}"
        );
        let mut bytes = log_from(0, &[(ENTRY, entry(1, vec![1])), (STATE, state(1))]);
        let at = bytes.len() - 64 - 1;
        bytes[at - 2] ^= 0xff;
        let dir = data_dir_with(&[bytes]);
        assert!(commit_log(dir.path()).is_err());
    }

    #[test]
    fn the_initial_cluster_names_the_new_member_and_refuses_an_unstarted_one() {
        let host = (
            1,
            "m2".to_string(),
            vec!["https://127.0.0.1:2380".to_string()],
        );
        let new = (2, String::new(), vec!["https://127.0.0.1:2402".to_string()]);
        let joined = initial_cluster(
            &[host.clone(), new.clone()],
            "standby-m3",
            "https://127.0.0.1:2402",
        )
        .unwrap();
        assert_eq!(
            joined,
            Joined {
                id: 2,
                initial_cluster: "m2=https://127.0.0.1:2380,standby-m3=https://127.0.0.1:2402"
                    .into(),
                added: false,
            }
        );
        let err =
            initial_cluster(&[host, new], "standby-m1", "https://127.0.0.1:2404").unwrap_err();
        assert!(err.to_string().contains("never started"), "{err}");
    }
}
