//! Tests of [`super`] (etcd.rs).
use super::*;

/// Ports taken together never repeat (one at a time, two members of a
/// test ring once got the same port and the second could not listen).
#[test]
fn sync_tree_reaches_every_file_and_names_a_missing_dir() {
    let dir = std::env::temp_dir().join(format!("ring-sync-tree-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("member/wal")).unwrap();
    std::fs::write(dir.join("member/wal/0.wal"), b"x").unwrap();
    std::fs::write(dir.join("top"), b"y").unwrap();
    assert!(sync_tree(&dir).is_ok());
    // an unreadable file inside stops it (nothing is skipped silently)
    std::fs::remove_file(dir.join("top")).unwrap();
    std::os::unix::fs::symlink(dir.join("absent"), dir.join("top")).unwrap();
    assert!(sync_tree(&dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(sync_tree(&dir).is_err());
}

#[test]
fn free_ports_are_distinct() {
    let ports = free_ports(64).unwrap();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), 64, "{ports:?}");
    assert!(ports.iter().all(|p| *p != 0));
}

#[test]
fn only_out_of_range_means_compacted() {
    let compacted = etcd_client::Error::GRpcStatus(tonic::Status::out_of_range(
        "etcdserver: mvcc: required revision has been compacted",
    ));
    assert!(is_compacted(&compacted));
    // the word alone does not make it a compaction: the code does
    let other =
        etcd_client::Error::GRpcStatus(tonic::Status::unavailable("compacted connection refused"));
    assert!(!is_compacted(&other));
    assert!(!is_compacted(&etcd_client::Error::InvalidArgs(
        "compacted".into()
    )));
    let taken = etcd_client::Error::GRpcStatus(tonic::Status::failed_precondition(
        "etcdserver: lease already exists",
    ));
    assert!(is_lease_taken(&taken) && !is_compacted(&taken));
    assert!(!is_lease_taken(&compacted));
}
