//! Tests of [`super`] (wal.rs) against the etcd and etcdutl that Ring runs:
//! what this log writer appends, etcd applies; what etcd cannot read, it
//! refuses with its reason.

use std::collections::BTreeSet;

use super::*;
use crate::etcd::{self, Member, TempEtcd};

/// A snapshot of a fresh etcd holding `a=1` (revision 2), restored by
/// etcdutl into `dir/data` as member `t`.
async fn restored_data(dir: &Path) -> PathBuf {
    let bin = etcd::find_binary("etcd", None).unwrap();
    let mut source = TempEtcd::start(&bin, &dir.join("source"), "s", &dir.join("source.log"))
        .await
        .unwrap();
    let snap = dir.join("snapshot.db");
    let taken = async {
        let mut c = source.client().await?;
        etcd::call(&source.url, "put", c.put("a", "1", None)).await?;
        let mut stream = etcd::call(&source.url, "snapshot", c.snapshot()).await?;
        let mut bytes = Vec::new();
        while let Some(m) = etcd::call(&source.url, "snapshot stream", stream.message()).await? {
            bytes.extend_from_slice(m.blob());
        }
        Ok::<_, crate::BackupError>(bytes)
    }
    .await;
    source.stop().await;
    std::fs::write(&snap, taken.unwrap()).unwrap();
    let data = dir.join("data");
    let member = Member {
        name: "t".into(),
        peer_url: "https://127.0.0.1:2380".into(),
        cluster_token: "ring-t".into(),
    };
    let etcdutl = etcd::find_binary("etcdutl", None).unwrap();
    etcd::restore_snapshot(&etcdutl, &snap, &data, &member)
        .await
        .unwrap();
    data
}

fn put(revision: i64, key: &str, lease: i64) -> RevisionRecord {
    RevisionRecord {
        revision,
        time_ms: 0,
        events: vec![EventRecord {
            delete: false,
            key: key.into(),
            value: format!("v{revision}").into_bytes(),
            lease,
            version: 1,
        }],
    }
}

/// etcdutl's fresh log takes the revisions after its snapshot's (a put, a
/// leased put, a transaction), etcd applies them at the recorded revisions
/// when it starts, and takes a raft snapshot at the log's end.
#[tokio::test]
async fn etcd_applies_the_revisions_appended_to_etcdutls_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = restored_data(dir.path()).await;
    let tail = read_tail(&data).unwrap().expect("etcdutl's log is fresh");
    assert_eq!(tail.snapshot_index, tail.last_index, "{tail:?}");
    let mut requests = Requests::default();
    let mut granted = BTreeSet::new();
    let ttls = BTreeMap::from([(0x77, 600)]);
    let mut txn = put(5, "c", 0);
    txn.events.push(EventRecord {
        delete: true,
        key: b"a".to_vec(),
        value: vec![],
        lease: 0,
        version: 0,
    });
    for r in [put(3, "b", 0), put(4, "leased", 0x77), txn] {
        requests.push(&r, &mut granted, &ttls);
    }
    let last = append(&tail, &requests).unwrap();
    let bin = etcd::find_binary("etcd", None).unwrap();
    let log = dir.path().join("replay.log");
    let past = Some(tail.entries_past_snapshot(last));
    let mut temp = TempEtcd::start_unsynced(&bin, &data, "t", &log, past)
        .await
        .unwrap();
    let read = async {
        let mut c = temp.client().await?;
        let status = etcd::status(&mut c, &temp.url).await?;
        let leased = etcd::call(&temp.url, "get", c.get("leased", None)).await?;
        let gone = etcd::call(&temp.url, "get", c.get("a", None)).await?;
        let kv = leased
            .kvs()
            .first()
            .map(|kv| (kv.mod_revision(), kv.lease()));
        Ok::<_, crate::BackupError>((status.revision, kv, gone.count()))
    }
    .await;
    temp.stop().await;
    assert_eq!(read.unwrap(), (5, Some((4, 0x77)), 0));
    // raft snapshot files are named <term>-<index>.snap, in hex
    let newest = crate::etcd_wal::raft_snapshots(&data.join("member/snap"))
        .unwrap()
        .iter()
        .filter_map(|p| {
            let stem = p.file_stem()?.to_str()?;
            u64::from_str_radix(stem.split_once('-')?.1, 16).ok()
        })
        .max();
    assert!(
        newest.is_some_and(|i| i >= last),
        "no raft snapshot at or past entry {last}: {newest:?}"
    );
}

/// An entry etcd cannot read fails its start, and the error says etcd's
/// reason, not the stack trace of its panic.
#[tokio::test]
async fn etcd_refusing_the_log_fails_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = restored_data(dir.path()).await;
    let tail = read_tail(&data).unwrap().expect("fresh");
    let mut requests = Requests::default();
    requests.push(&put(3, "b", 0), &mut BTreeSet::new(), &BTreeMap::new());
    // not an InternalRaftRequest (a truncated varint)
    requests.encoded.push(vec![0x08, 0xff]);
    append(&tail, &requests).unwrap();
    let bin = etcd::find_binary("etcd", None).unwrap();
    let log = dir.path().join("replay.log");
    let err = match TempEtcd::start_unsynced(&bin, &data, "t", &log, None).await {
        Ok(mut temp) => {
            temp.stop().await;
            panic!("etcd served a log it cannot apply");
        }
        Err(e) => e.to_string(),
    };
    eprintln!("{err}");
    assert!(err.contains("unmarshal"), "{err}");
    assert!(!err.contains("goroutine"), "{err}");
}

/// A revision larger than etcd takes as a request (12 MiB, more than
/// `--max-request-bytes` allows a transaction) is one record of the log, and
/// etcd applies it from there.
#[tokio::test]
async fn etcd_applies_a_revision_larger_than_a_request_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = restored_data(dir.path()).await;
    let tail = read_tail(&data).unwrap().expect("fresh");
    let mut large = put(3, "large", 0);
    large.events[0].value = vec![b'x'; 12 << 20];
    let mut requests = Requests::default();
    requests.push(&large, &mut BTreeSet::new(), &BTreeMap::new());
    append(&tail, &requests).unwrap();
    let bin = etcd::find_binary("etcd", None).unwrap();
    let log = dir.path().join("replay.log");
    let mut temp = TempEtcd::start_unsynced(&bin, &data, "t", &log, None)
        .await
        .unwrap();
    let read = async {
        let mut c = temp.client().await?;
        let revision = etcd::status(&mut c, &temp.url).await?.revision;
        let opts = etcd_client::GetOptions::new().with_count_only();
        let got = etcd::call(&temp.url, "get", c.get("large", Some(opts))).await?;
        Ok::<_, crate::BackupError>((revision, got.count()))
    }
    .await;
    temp.stop().await;
    assert_eq!(read.unwrap(), (3, 1));
}
