//! Real `ringd` processes on loopback: elections, leader kills, restarts,
//! partitions (SIGSTOP), mutual TLS, and lease fencing of a hosted control plane.

// Each test runs on its own runtime; `ring_slot` only serialises whole tests.
#![allow(clippy::await_holding_lock)]

use std::time::{Duration, Instant};

use ring_tests::ring::RingFixture;
use ringd::identity::{IdentityPem, RingPki};
use ringd::state::{MemberState, OperationStep};

const START: Duration = Duration::from_secs(30);

#[path = "ringd/skew.rs"]
mod skew;

/// Commits a probe through member `i`, retrying until `timeout`; returns when it committed.
async fn commit_via(ring: &RingFixture, i: usize, timeout: Duration) -> Instant {
    let mut client = ring.client(i);
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = client.probe(b"probe".to_vec()).await;
        if attempt.is_ok() {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "no probe committed through {} within {timeout:?}: {attempt:?}",
            ring.members[i].name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn leader_kill_elects_and_commits(n: usize) {
    let mut ring = RingFixture::new(n, &[]);
    ring.start_all();
    let leader = ring.leader_seen_by(0, START).await;
    let survivor = (leader + 1) % n;
    commit_via(&ring, survivor, START).await;

    let election = Duration::from_millis(ring.timing.election_timeout_ms);
    let before = ring.status(survivor).await.unwrap();
    let dead = ring.members[leader].name.clone();
    let killed_at = Instant::now();
    ring.kill(leader);
    // A new leader has committed once a survivor sees it with a higher term and
    // a commit index past the old one (the new leader's first entry).
    let mut client = ring.client(survivor);
    let took = loop {
        if let Ok(s) = client.status().await {
            if s.leader.as_ref().is_some_and(|l| *l != dead)
                && s.term > before.term
                && s.commit_index > before.commit_index
            {
                break killed_at.elapsed();
            }
        }
        assert!(
            killed_at.elapsed() < election * 10,
            "no new leader committed within {:?}",
            election * 10
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    commit_via(&ring, survivor, START).await;
    let status = ring.status(survivor).await.unwrap();
    // How fast is a benchmark's business (`ringctl bench raft` reports leader
    // kill -> new leader commit); here only that it happens, within the loop bound.
    eprintln!("a new leader committed {took:?} after the kill");
    // the leader marks the dead member down and opens a failover for what it hosted
    let hosted_by_dead: Vec<String> = status
        .placements
        .iter()
        .filter(|p| p.host == ring.members[leader].name)
        .map(|p| p.shoot.clone())
        .collect();
    let s = ring
        .wait_status(
            survivor,
            "the dead leader marked down with failover operations",
            START,
            |s| {
                s.members
                    .iter()
                    .any(|m| m.name == dead && m.state == MemberState::Down)
                    && s.operations
                        .iter()
                        .filter(|o| o.step == OperationStep::Pending)
                        .count()
                        >= 1
            },
        )
        .await;
    for op in &s.operations {
        assert_ne!(op.target(), dead);
    }
    assert!(
        hosted_by_dead.is_empty()
            || s.operations
                .iter()
                .any(|o| hosted_by_dead.contains(&o.shoot().to_string()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_and_survive_a_leader_kill() {
    leader_kill_elects_and_commits(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_elect_and_survive_a_leader_kill() {
    leader_kill_elects_and_commits(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_restart_keeps_the_ring_state() {
    let mut ring = RingFixture::new(3, &[]);
    ring.start_all();
    let leader = ring.leader_seen_by(0, START).await;
    // a recorded change: kill one member so an operation and a down member are committed
    let victim = (leader + 1) % 3;
    ring.kill(victim);
    let other = 3 - leader - victim;
    let before = ring
        .wait_status(other, "a failover operation", START, |s| {
            !s.operations.is_empty()
        })
        .await;
    for i in 0..3 {
        if i != victim {
            ring.stop(i);
        }
    }
    ring.start_all();
    let after = ring
        .wait_status(other, "the same state after a full restart", START, |s| {
            s.leader.is_some() && s.applied_index >= before.applied_index
        })
        .await;
    assert_eq!(
        after
            .placements
            .iter()
            .map(|p| (&p.shoot, &p.host, p.epoch))
            .collect::<Vec<_>>(),
        before
            .placements
            .iter()
            .map(|p| (&p.shoot, &p.host, p.epoch))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        after.operations.first().map(|o| o.id),
        before.operations.first().map(|o| o.id)
    );
    assert!(
        after.term > before.term,
        "a new election happened after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_cannot_commit_until_the_partition_heals() {
    let mut ring = RingFixture::new(3, &[]);
    ring.start_all();
    ring.leader_seen_by(0, START).await;
    commit_via(&ring, 0, START).await;
    // cut member 0 off: freeze the other two (SIGSTOP); it is a minority of one
    ring.signal(1, libc::SIGSTOP);
    ring.signal(2, libc::SIGSTOP);
    let s = ring
        .wait_status(0, "loss of quorum contact", START, |s| !s.quorum_contact)
        .await;
    let mut client = ring.client(0);
    let attempt = client.probe(b"must not commit".to_vec()).await;
    assert!(attempt.is_err(), "a minority committed: {attempt:?}");
    let after = ring.status(0).await.unwrap();
    assert_eq!(
        after.commit_index, s.commit_index,
        "the minority's commit index moved"
    );
    ring.signal(1, libc::SIGCONT);
    ring.signal(2, libc::SIGCONT);
    commit_via(&ring, 0, START).await;
    let healed = ring.status(0).await.unwrap();
    assert!(healed.quorum_contact && healed.commit_index > s.commit_index);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_ca_and_unexpected_identities_are_refused() {
    let mut ring = RingFixture::new(3, &[]);
    ring.start_all();
    ring.leader_seen_by(0, START).await;

    // an admin certificate from another CA: the TLS handshake fails
    let foreign = ring.sandbox.path().join("foreign-pki");
    RingPki::new(&foreign).ensure_admin().unwrap();
    let mut stranger =
        ringd::client::AdminClient::connect(&ring.members[0].address, &foreign).unwrap();
    let err = stranger.status().await.unwrap_err().to_string();
    assert!(err.contains("ringd at"), "{err}");

    // a certificate from the ring's CA, but for an identity that is neither a member nor ringctl
    let files = RingPki::new(&ring.pki)
        .ensure_member("intruder", "127.0.0.1".parse().unwrap())
        .unwrap();
    let id = IdentityPem::read(&files).unwrap();
    let ch = ringd::transport::channel(&id, &ring.members[0].address, "ringd").unwrap();
    let mut client = ring_proto::v1::ring_admin_client::RingAdminClient::new(ch);
    let refused = client
        .status(ring_proto::v1::StatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // and as a Raft peer
    let ch = ringd::transport::channel(&id, &ring.members[0].address, "ringd").unwrap();
    let mut raft = ring_proto::v1::raft_transport_client::RaftTransportClient::new(ch);
    let refused = raft
        .send(ring_proto::v1::RaftBatch {
            from: 9,
            messages: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    let log = std::fs::read_to_string(ring.log(0)).unwrap();
    assert!(
        log.contains("refused an unexpected identity") && log.contains("intruder"),
        "{log}"
    );

    // a member may not send Raft messages in another member's name
    let m2 = IdentityPem::read(&RingPki::new(&ring.pki).files("m2")).unwrap();
    let ch = ringd::transport::channel(&m2, &ring.members[0].address, "m1").unwrap();
    let mut raft = ring_proto::v1::raft_transport_client::RaftTransportClient::new(ch);
    let msg = raft::prelude::Message {
        from: 3,
        to: 1,
        ..Default::default()
    };
    use protobuf::Message as _;
    let forged = raft
        .send(ring_proto::v1::RaftBatch {
            from: 3,
            messages: vec![msg.write_to_bytes().unwrap()],
        })
        .await
        .unwrap_err();
    assert_eq!(forged.code(), tonic::Code::PermissionDenied);
    // the ring still works
    commit_via(&ring, 0, START).await;

    // m2's own certificate, its own Raft id: an empty proposal (raft-rs's
    // leader panics on one) and a command only the leader makes (marking m1
    // down) reach every member, followers forwarding them to the leader
    let proposal = |entries: Vec<raft::prelude::Entry>| raft::prelude::Message {
        msg_type: raft::prelude::MessageType::MsgPropose,
        from: 2,
        entries: entries.into(),
        ..Default::default()
    };
    let mark_down = raft::prelude::Entry {
        data: serde_json::to_vec(&serde_json::json!({
            "id": 0,
            "command": ringd::state::RingCommand::MarkDown { member: "m1".into(), at_ms: 1 },
        }))
        .unwrap()
        .into(),
        ..Default::default()
    };
    for i in 0..3 {
        let ch = ringd::transport::channel(&m2, &ring.members[i].address, "ringd").unwrap();
        let mut raft = ring_proto::v1::raft_transport_client::RaftTransportClient::new(ch);
        for msg in [proposal(vec![]), proposal(vec![mark_down.clone()])] {
            let mut msg = msg;
            msg.to = i as u64 + 1;
            raft.send(ring_proto::v1::RaftBatch {
                from: 2,
                messages: vec![msg.write_to_bytes().unwrap()],
            })
            .await
            .unwrap();
        }
    }
    // every member still commits, and nobody was marked down
    for i in 0..3 {
        commit_via(&ring, i, START).await;
    }
    let s = ring.status(0).await.unwrap();
    assert!(
        s.members.iter().all(|m| m.state == MemberState::Up),
        "{:?}",
        s.members
    );
    let leader = s.leader.clone().expect("a leader");
    let i = ring.members.iter().position(|m| m.name == leader).unwrap();
    let log = std::fs::read_to_string(ring.log(i)).unwrap();
    assert!(
        log.contains("dropped a peer's proposal") && log.contains("only the leader proposes"),
        "{log}"
    );

    // m2's certificate and key copied over m1's (a valid pair from the ring's
    // CA): m1's ringd must not take it on its next read of the files, or it
    // would speak to its peers as m2
    let pki = RingPki::new(&ring.pki);
    let (m1, m2) = (pki.files("m1"), pki.files("m2"));
    let kept = (
        std::fs::read(&m1.cert).unwrap(),
        std::fs::read(&m1.key).unwrap(),
    );
    std::fs::copy(&m2.key, &m1.key).unwrap();
    std::fs::copy(&m2.cert, &m1.cert).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(ring.log(0)).unwrap();
        assert!(
            !log.contains("serving and calling with the new identity"),
            "m1 took m2's certificate: {log}"
        );
        if log.contains("cannot be used") && log.contains("but this member is") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "m1 did not refuse m2's certificate within 20 s: {log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(&m1.key, &kept.1).unwrap();
    std::fs::write(&m1.cert, &kept.0).unwrap();
    commit_via(&ring, 0, START).await;
}

/// m1 hosts m2's real control plane. Cut m1 off from the quorum: it must stop
/// serving before its lease ends, and say so in its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_host_fences_its_control_plane_before_the_lease_ends() {
    let _slot = ring_tests::ring_slot();
    let mut ring = RingFixture::new(3, &["m1"]);
    ring.start_all();
    let serving = ring
        .wait_status(
            0,
            "m2's control plane served by m1",
            Duration::from_secs(120),
            |s| {
                s.hosted
                    .iter()
                    .any(|h| h.shoot == "m2" && h.serving && h.ready)
            },
        )
        .await;
    assert_eq!(
        serving
            .placements
            .iter()
            .find(|p| p.shoot == "m2")
            .unwrap()
            .host,
        "m1"
    );
    let seed_dir = ring.seed_dir(0);
    assert!(
        !ring_tests::processes_mentioning(&seed_dir).is_empty(),
        "the control plane's processes run"
    );
    let kubeconfig = seed_dir.join("shoots/m2/kubeconfig/admin.kubeconfig");
    ring_tests::kubectl(&kubeconfig, &["get", "namespaces"]);

    ring.signal(1, libc::SIGSTOP);
    ring.signal(2, libc::SIGSTOP);
    let lease = Duration::from_millis(ring.timing.lease_ms);
    // observe the fencing: not serving, processes gone, own lease still running
    let fenced = ring
        .wait_status(0, "m2's control plane fenced", lease * 2, |s| {
            let h = s.hosted.iter().find(|h| h.shoot == "m2");
            h.is_some_and(|h| !h.serving) && ring_tests::processes_mentioning(&seed_dir).is_empty()
        })
        .await;
    let h = fenced.hosted.iter().find(|h| h.shoot == "m2").unwrap();
    let left = h.lease_valid_for_ms.expect("m1 had a lease");
    assert!(left > 0, "fenced only {}ms after the lease ended", -left);
    assert!(h.detail.contains("fenced"), "{}", h.detail);

    // The partition heals before anyone declared m1 dead: it renews and serves again.
    ring.signal(1, libc::SIGCONT);
    ring.signal(2, libc::SIGCONT);
    ring.wait_status(
        0,
        "m2's control plane served again",
        Duration::from_secs(120),
        |s| {
            s.hosted
                .iter()
                .any(|h| h.shoot == "m2" && h.serving && h.ready)
                && s.placements
                    .iter()
                    .any(|p| p.shoot == "m2" && p.host == "m1" && p.epoch == 1)
        },
    )
    .await;
    ring_tests::kubectl(&kubeconfig, &["get", "namespaces"]);
}

/// etcd and kube-apiserver processes of a control plane in `seed_dir`.
fn serving_processes(seed_dir: &std::path::Path) -> Vec<(u32, String, String)> {
    scenarios::procs::processes_mentioning(&seed_dir.to_string_lossy())
        .into_iter()
        .filter(|(_, name, _)| name == "etcd" || name == "kube-apiserver")
        .collect()
}

/// m1 hosts m2's control plane as local processes, and m1's own ringd stops
/// (SIGSTOP): nothing renews the lease and nothing in ringd can fence, yet
/// etcd and kube-apiserver stop at the fence time (ring-agent's lease guard,
/// by its own clock). Resumed after the others started a failover, m1 gets no
/// lease back and its guards keep the control plane down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_ringds_control_plane_stops_at_the_fence_time_by_itself() {
    let _slot = ring_tests::ring_slot();
    let mut ring = RingFixture::new(3, &["m1"]);
    ring.start_all();
    ring.wait_status(0, "m2 served by m1", Duration::from_secs(120), |s| {
        s.hosted
            .iter()
            .any(|h| h.shoot == "m2" && h.serving && h.ready)
    })
    .await;
    let seed_dir = ring.seed_dir(0);
    assert_eq!(
        serving_processes(&seed_dir).len(),
        2,
        "etcd and kube-apiserver run"
    );

    ring.signal(0, libc::SIGSTOP);
    let lease = Duration::from_millis(ring.timing.lease_ms);
    ring_tests::wait_for(
        "m2's etcd and kube-apiserver to stop while m1's ringd is stopped",
        lease * 2,
        || async { serving_processes(&seed_dir).is_empty().then_some(()) },
    )
    .await;
    ring.wait_status(1, "a failover of m2 begun", START, |s| {
        s.operations.iter().any(|o| o.shoot() == "m2")
    })
    .await;
    ring.signal(0, libc::SIGCONT);
    let s = ring
        .wait_status(0, "m1 to see it lost m2's lease", START, |s| {
            s.hosted.iter().any(|h| h.shoot == "m2" && !h.serving)
        })
        .await;
    assert!(
        serving_processes(&seed_dir).is_empty(),
        "no lease, no serving: {:?}",
        s.hosted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_and_leave_through_raft_configuration_changes() {
    let mut ring = RingFixture::new(3, &[]);
    ring.start_all();
    ring.leader_seen_by(0, START).await;
    let mut admin = ringd::client::AdminClient::connect_leader(&ring.members[0].address, &ring.pki)
        .await
        .unwrap();
    // a fourth member: started empty, then added
    let m4 = ring.add_joiner("m4");
    ring.start(m4);
    let (detail, id) = admin
        .add_member("m4", &ring.members[m4].address)
        .await
        .unwrap();
    assert_eq!(id, 4);
    assert!(detail.contains("m4"), "{detail}");
    let s = ring
        .wait_status(m4, "m4 as a voter that knows the ring", START, |s| {
            s.members.iter().any(|m| m.name == "m4" && m.voter)
                && s.members.len() == 4
                && s.leader.is_some()
        })
        .await;
    assert_eq!(s.members.iter().filter(|m| m.voter).count(), 4);
    commit_via(&ring, m4, START).await;
    // bad requests are refused with a reason
    let dup = admin
        .add_member("m4", "127.0.0.1:1")
        .await
        .unwrap_err()
        .to_string();
    assert!(dup.contains("exists"), "{dup}");
    let bad = admin
        .add_member("M_5", "127.0.0.1:1")
        .await
        .unwrap_err()
        .to_string();
    assert!(bad.contains("invalid shoot name"), "{bad}");
    // leave: back to 3, then refused
    admin.remove_member("m4").await.unwrap();
    ring.wait_status(0, "m4 gone", START, |s| {
        s.members.len() == 3 && s.members.iter().all(|m| m.name != "m4")
    })
    .await;
    let refused = admin.remove_member("m3").await.unwrap_err().to_string();
    assert!(refused.contains("at least 3"), "{refused}");
    commit_via(&ring, 0, START).await;
}

/// A seed that dies and comes back after its shoot was failed over elsewhere never
/// serves the stale control plane again (its epoch is stale, its placement moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_seed_does_not_serve_a_moved_control_plane() {
    let _slot = ring_tests::ring_slot();
    let mut ring = RingFixture::new(3, &["m1", "m2", "m3"]);
    ring.start_all();
    // every member serves its successor's control plane
    for (i, shoot) in [(0, "m2"), (1, "m3"), (2, "m1")] {
        ring.wait_status(
            i,
            "its successor's control plane served",
            Duration::from_secs(120),
            |s| {
                s.hosted
                    .iter()
                    .any(|h| h.shoot == shoot && h.serving && h.ready)
            },
        )
        .await;
    }
    let m1_shoots = ring.seed_dir(0).join("shoots/m2");
    assert!(!ring_tests::processes_mentioning(&m1_shoots).is_empty());

    // m1 dies (its ringd and the control plane of m2 it hosted)
    ring.kill(0);
    let left = ring
        .sandbox
        .wait_no_processes_matching(&m1_shoots, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "m2's control plane outlived its seed: {left:?}"
    );
    let s = ring
        .wait_status(1, "m2 failed over to m3 under epoch 2", START, |s| {
            s.placements
                .iter()
                .any(|p| p.shoot == "m2" && p.host == "m3" && p.epoch == 2)
                && s.members
                    .iter()
                    .any(|m| m.name == "m1" && m.state == MemberState::Down)
        })
        .await;
    let op = s
        .operations
        .iter()
        .find(|o| o.shoot() == "m2")
        .expect("a failover operation");
    assert_eq!(op.source(), "m1");

    // m1 comes back: it is marked up again, but never restarts m2's control plane
    ring.start(0);
    ring.wait_status(1, "m1 up again", START, |s| {
        s.members
            .iter()
            .any(|m| m.name == "m1" && m.state == MemberState::Up)
    })
    .await;
    let back = ring
        .wait_status(0, "m1 knows m2 moved", START, |s| {
            s.hosted
                .iter()
                .any(|h| h.shoot == "m2" && !h.serving && h.detail.contains("moved to m3"))
        })
        .await;
    assert!(back
        .placements
        .iter()
        .any(|p| p.shoot == "m2" && p.host == "m3"));
    // and for a few lease periods nothing of m2 runs on m1
    let lease = Duration::from_millis(ring.timing.lease_ms);
    let until = std::time::Instant::now() + lease * 2;
    while std::time::Instant::now() < until {
        let procs = ring_tests::processes_mentioning(&m1_shoots);
        assert!(
            procs.is_empty(),
            "m1 restarted the stale control plane of m2: {procs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
