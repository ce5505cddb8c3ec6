//! Tests of [`super`] (failover.rs).
use super::*;

#[tokio::test]
async fn the_first_read_counts_only_from_the_decision_on() {
    let (tx, answered) = tokio::sync::mpsc::channel(8);
    let mut probe = ReadProbe {
        answered,
        seen: Vec::new(),
        task: tokio::spawn(async {}),
    };
    assert_eq!(probe.first_after(3.0), None);
    // answers arrive out of order (reads overlap); one before the decision
    for t in [1.0, 9.4, 9.1] {
        tx.try_send(t).unwrap();
    }
    assert_eq!(probe.first_after(3.0), Some(9.1));
    // answers already taken stay known
    assert_eq!(probe.first_after(9.2), Some(9.4));
    assert_eq!(probe.first_after(0.5), Some(1.0));
}
