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

/// What etcd and etcdutl write when they give up, as they write it.
#[test]
fn the_reason_is_the_error_or_the_last_fatal_entry_not_the_stack() {
    let etcd = concat!(
        r#"{"level":"info","ts":"2026-01-01T00:00:00Z","caller":"etcdserver/server.go:1","msg":"starting"}"#,
        "\n",
        r#"{"level":"panic","ts":"2026-01-01T00:00:00Z","caller":"schedule/schedule.go:202","msg":"execute job failed","job":"server_applyAll","panic":"unmarshal should never fail (proto: cannot parse invalid wire-format data)","stacktrace":"go.etcd.io/etcd/pkg/v3/schedule.(*fifo).executeJob.func1"}"#,
        "\npanic: execute job failed [recovered]\n\ngoroutine 190 [running]:\nmain.main()\n",
    );
    assert_eq!(
        reason(etcd).as_deref(),
        Some("execute job failed: unmarshal should never fail (proto: cannot parse invalid wire-format data)")
    );
    let etcdutl = concat!(
        "2026-01-01T00:00:00Z\tinfo\tsnapshot/v3_snapshot.go:306\trestoring snapshot\t{\"path\": \"bad.db\"}\n",
        "2026-01-01T00:00:00Z\terror\tbbolt\tbbolt@v1.5.0/db.go:297\tboth meta pages are invalid\n",
        "2026-01-01T00:00:00Z\tpanic\tbackend/backend.go:215\tfailed to open database\t{\"path\": \"db\", \"error\": \"invalid database\"}\n",
        "go.etcd.io/etcd/server/v3/storage/backend.newBackend\n\tbackend.go:215\npanic: failed to open database\n\ngoroutine 1 [running]:\n",
    );
    assert_eq!(
        reason(etcdutl).as_deref(),
        Some("failed to open database: invalid database")
    );
    let named = "2026-01-01T00:00:00Z\tfatal\tbbolt\tbbolt@v1.5.0/db.go:1\tno room\n";
    assert_eq!(reason(named).as_deref(), Some("no room"));
    let returned = "2026-01-01T00:00:00Z\tinfo\tsnapshot/v3_snapshot.go:306\trestoring snapshot\nError: expected sha256 [1 2], got [3 4]\n";
    assert_eq!(
        reason(returned).as_deref(),
        Some("expected sha256 [1 2], got [3 4]")
    );
    assert_eq!(reason("no structure here\nat all\n"), None);
}
