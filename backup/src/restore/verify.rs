//! Verifying a replayed etcd against what the source recorded: the revision
//! reached, the key count and, where recorded, `HashKV`.

use etcd_client::{Client, CompactionOptions};

use super::replay::Replayer;
use crate::codec::HashKv;
use crate::etcd;
use crate::{BackupError, Result};

/// What the verification found.
pub(super) struct Checked {
    /// The revision the restored etcd reached.
    pub(super) reached: i64,
    pub(super) keys: i64,
    /// What the `HashKV` check found.
    pub(super) hash_kv: String,
}

/// Checks the restored etcd after the replay `r`; any mismatch is an error.
/// A replay that skipped revisions is only described (it cannot match).
pub(super) async fn verify(client: &mut Client, r: &Replayer) -> Result<Checked> {
    let ep = r.ep();
    let reached = etcd::status(client, ep).await?.revision;
    // The key count is known at the last recorded revision (the snapshot may
    // hold a few more revisions, whose history the restored etcd keeps).
    let keys = etcd::key_count(client, ep, r.last_seen.min(reached)).await?;
    let mut problems = Vec::new();
    if r.aligned {
        if reached != r.target {
            problems.push(format!(
                "etcd reached revision {reached}, the target is {}",
                r.target
            ));
        }
        if keys != r.expected_keys {
            problems.push(format!(
                "etcd holds {keys} keys, the source had {}",
                r.expected_keys
            ));
        }
    }
    let hash_kv = if !r.aligned {
        "not compared: revisions were skipped".to_string()
    } else {
        match r
            .recorded_hashes
            .iter()
            .filter(|h| h.revision <= reached)
            .max_by_key(|h| h.revision)
        {
            None => "not recorded for these objects".to_string(),
            Some(h) => compare_hash(client, ep, h, &mut problems).await?,
        }
    };
    if !problems.is_empty() {
        return Err(BackupError::Verify(problems.join("; ")));
    }
    Ok(Checked {
        reached,
        keys,
        hash_kv,
    })
}

/// Compares `HashKV` at a recorded revision; compacts the restored etcd to the
/// source's compaction revision first when the source had compacted further.
async fn compare_hash(
    client: &mut Client,
    ep: &str,
    h: &HashKv,
    problems: &mut Vec<String>,
) -> Result<String> {
    let mut mine = etcd::hash_kv(client, ep, h.revision).await?;
    if mine.compact_revision < h.compact_revision && h.compact_revision <= h.revision {
        etcd::call(
            ep,
            "compacting",
            client.compact(
                h.compact_revision,
                Some(CompactionOptions::new().with_physical()),
            ),
        )
        .await?;
        mine = etcd::hash_kv(client, ep, h.revision).await?;
    }
    if mine.compact_revision != h.compact_revision {
        return Ok(format!(
            "not compared at revision {}: the restored etcd is compacted to {}, the source was at {}",
            h.revision, mine.compact_revision, h.compact_revision
        ));
    }
    if mine.hash != h.hash {
        problems.push(format!(
            "HashKV at revision {} is {:#010x}, the source had {:#010x}",
            h.revision, mine.hash, h.hash
        ));
    }
    Ok(format!(
        "equal at revision {} ({:#010x})",
        h.revision, h.hash
    ))
}
