//! A fence time by the guard's own clock, from successive readings of the
//! lease record ringd writes (pure).
//!
//! ringd records the fence time by its wall clock, and how long that was
//! from when it wrote the record. A guard on another host (a pod on a node,
//! or any process whose clock is not ringd's) must not trust the first: a
//! ringd clock 5 s ahead would keep the guard serving 5 s past the lease the
//! leader counts. It counts the validity from its own observation instead:
//! a record it had not seen before was written after its previous reading
//! began, so the previous reading's start plus the validity is never later
//! than what ringd meant (at most one poll earlier). Only a record seen on
//! the very first reading has no such bound: then the earlier of ringd's
//! fence time and this reading plus the validity holds, until the next
//! renewal.

/// One reading of the lease record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReading {
    /// Unix ms after which nothing may serve, by the writer's clock (0: fenced).
    pub fence_at_ms: u64,
    /// How long until then when it was written (ms); `None` from an older Ring.
    pub valid_for_ms: Option<u64>,
}

/// Successive readings of one lease record.
#[derive(Debug, Default)]
pub struct LeaseClock {
    last: Option<LeaseReading>,
    /// When the newest successful reading began (this host's unix ms).
    last_read_at_ms: Option<u64>,
    fence_at_ms: u64,
}

impl LeaseClock {
    /// Takes a successful reading begun at `read_at_ms` (this host's clock);
    /// returns the fence time by this host's clock (0: fenced).
    pub fn observe(&mut self, reading: LeaseReading, read_at_ms: u64) -> u64 {
        if self.last != Some(reading) {
            self.fence_at_ms = match (reading.valid_for_ms, self.last_read_at_ms) {
                _ if reading.fence_at_ms == 0 => 0,
                // written after the previous reading began
                (Some(valid), Some(before)) => before.saturating_add(valid),
                // first seen: no later than the writer's fence time, nor than
                // now plus the validity it had when written
                (Some(valid), None) => reading.fence_at_ms.min(read_at_ms.saturating_add(valid)),
                (None, _) => reading.fence_at_ms,
            };
            self.last = Some(reading);
        }
        self.last_read_at_ms = Some(read_at_ms);
        self.fence_at_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(fence_at_ms: u64, valid_for_ms: u64) -> LeaseReading {
        LeaseReading {
            fence_at_ms,
            valid_for_ms: Some(valid_for_ms),
        }
    }

    /// Readings every 500 ms on the guard's clock (t = 10_000, 10_500, ...)
    /// of records a ringd wrote with its clock `skew` ms off the guard's,
    /// each meaning "5 s from now".
    #[test]
    fn a_skewed_writer_never_extends_what_the_guard_serves() {
        for skew in [-5_000i64, 0, 5_000] {
            let mut clock = LeaseClock::default();
            let wall = |t: u64| (t as i64 + skew) as u64;
            // written at t = 9_900 (guard's clock), read at 10_000
            let first = reading(wall(9_900) + 5_000, 5_000);
            let at = clock.observe(first, 10_000);
            assert!(at <= 15_000, "skew {skew}: first reading fences at {at}");
            assert_eq!(
                clock.observe(first, 10_500),
                at,
                "unchanged: the same fence"
            );
            // renewed at t = 10_700, read at 11_000: counted from 10_500
            let renewed = reading(wall(10_700) + 5_000, 5_000);
            let at = clock.observe(renewed, 11_000);
            assert_eq!(at, 15_500, "skew {skew}");
            assert!(at <= 10_700 + 5_000, "never past what ringd meant");
        }
    }

    #[test]
    fn fenced_records_older_writers_and_failed_reads() {
        let mut clock = LeaseClock::default();
        assert_eq!(clock.observe(reading(20_000, 5_000), 10_000), 15_000);
        // a fence now
        assert_eq!(clock.observe(reading(0, 0), 10_500), 0);
        // a record without validity (an older Ring): its fence time as written
        let old = LeaseReading {
            fence_at_ms: 30_000,
            valid_for_ms: None,
        };
        assert_eq!(clock.observe(old, 11_000), 30_000);
        // a failed reading is not observed: the next change counts from the
        // last reading that succeeded
        assert_eq!(clock.observe(reading(40_000, 5_000), 13_000), 16_000);
    }
}
