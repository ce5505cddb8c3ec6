//! Tests of [`super`] (runner.rs).
use super::*;

/// A spool kept from an earlier epoch's hosting is uploaded, but what it
/// reaches is not the new epoch's durable revision (the ring would take
/// revisions this etcd never had for backed up).
#[test]
fn only_this_epochs_deltas_count_as_durable() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), 1 << 20, 1 << 20).unwrap();
    let (metrics, progress) = (Metrics::new("s"), watch::channel(Progress::default()).0);
    let pending = |epoch, last| Pending {
        name: object_name_in_epoch(epoch, Kind::Delta, last - 9, last, 1, true, false),
        bytes: Bytes::from_static(b"x"),
        last_revision: last,
        oldest_ms: 1,
    };
    delta_stored(&pending(1, 600), 3, &spool, &metrics, &progress);
    assert_eq!(progress.borrow().durable_revision, 0, "epoch 1's delta");
    delta_stored(&pending(3, 490), 3, &spool, &metrics, &progress);
    assert_eq!(progress.borrow().durable_revision, 490, "epoch 3's delta");
}

#[test]
fn backoff_doubles_up_to_the_cap_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
    let d: Vec<u64> = (0..4).map(|_| b.next_delay().as_millis() as u64).collect();
    assert_eq!(d, [100, 200, 350, 350]);
    b.reset();
    assert_eq!(b.next_delay(), Duration::from_millis(100));
}
