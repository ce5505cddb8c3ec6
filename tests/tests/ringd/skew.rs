//! Leases under a skewed clock: the holder of a lease runs under `faketime`,
//! its wall clock 5 s behind everyone else's.

use std::time::Duration;

use ring_tests::ring::{faketime, RingFixture};
use ringd::config::Timing;

use super::serving_processes;

/// m1 hosts m2's control plane with its clock 5 s behind (ringd and its
/// lease guards under faketime), so the lease end it reports (`expires_at_ms`)
/// is 5 s early on everyone else's clock. m1's ringd stops (SIGSTOP): its
/// guards fence etcd and kube-apiserver when the lease m1 measured from its
/// last renewal is nearly over. The leader must not let a replacement begin
/// (`Pending`) before that: it waits by its own record of when it applied
/// m1's last renewal, not by m1's clock. Before, it opened the replacement
/// while m1's control plane still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_waits_for_a_skewed_holders_lease_by_the_leaders_clock() {
    let _slot = ring_tests::ring_slot();
    // a long lease (renewed every 4 s) makes the skew decide the outcome:
    // the wait no longer hides behind the failure window
    let timing = Timing {
        lease_ms: 12_000,
        ..Timing::default()
    };
    let mut ring = RingFixture::with_timing(3, &["m1"], timing);
    let skew = faketime("-5s");
    let env: Vec<(&str, &str)> = skew.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ring.start_with_env(0, &env);
    ring.start(1);
    ring.start(2);
    ring.wait_status(0, "m2 served by m1", Duration::from_secs(120), |s| {
        s.hosted
            .iter()
            .any(|h| h.shoot == "m2" && h.serving && h.ready)
    })
    .await;
    // the skew is in effect: on m3's clock, m1's lease ends at most 7 s
    // after a renewal (12 s lease, 5 s behind); unskewed, at least 8 s
    let s = ring
        .wait_status(2, "m1's renewed lease on m2", super::START, |s| {
            s.placements
                .iter()
                .any(|p| p.shoot == "m2" && p.lease_expires_in_ms.is_some())
        })
        .await;
    let left = s
        .placements
        .iter()
        .find(|p| p.shoot == "m2")
        .and_then(|p| p.lease_expires_in_ms)
        .unwrap_or(i64::MAX);
    assert!(
        left <= 7_200,
        "m1's clock is not 5 s behind: its lease ends in {left} ms"
    );
    let seed_dir = ring.seed_dir(0);
    assert_eq!(
        serving_processes(&seed_dir).len(),
        2,
        "etcd and kube-apiserver run"
    );

    ring.signal(0, libc::SIGSTOP);
    let serves = || !serving_processes(&seed_dir).is_empty();
    let within = Duration::from_millis(timing.lease_ms * 4);
    let (pending, last_alive_ms) = ring.pending_and_last_served(1, "m2", serves, within).await;
    assert!(
        pending > last_alive_ms,
        "the failover of m2 became Pending {} ms before m1's control plane stopped serving",
        last_alive_ms - pending
    );
}
