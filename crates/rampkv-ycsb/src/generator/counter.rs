//! `CounterGenerator` and `AcknowledgedCounterGenerator`.
//!
//! The load phase inserts key numbers in counter order. The run phase hands out new key numbers
//! for inserts from a second counter that starts at `recordcount`; a new key becomes visible to
//! the key choosers (and is the "latest" key) only once its insert is acknowledged and every
//! smaller key is too. Reads therefore never target a key whose insert may still be in flight.
//!
//! # Contract
//! Every value returned by [`AcknowledgedCounter::next_value`] must be acknowledged exactly once,
//! after its insert finished (successfully or not: YCSB acknowledges in a `finally`). At most
//! [`ACKNOWLEDGEMENT_WINDOW_KEYS`] may be outstanding; beyond that `next_value` fails with
//! [`Error::TooManyUnacknowledgedInserts`] (YCSB throws a `RuntimeException` when acknowledging).

use crate::limits::ACKNOWLEDGEMENT_WINDOW_KEYS;
use crate::Error;

/// A plain counter: `start`, `start + 1`, ...
#[derive(Clone, Debug)]
pub struct Counter {
    next: u64,
}

impl Counter {
    /// A counter whose first value is `start`.
    pub fn new(start: u64) -> Self {
        Counter { next: start }
    }

    /// The next value, or `None` once the counter would pass `u64::MAX`.
    #[inline]
    pub fn next_value(&mut self) -> Option<u64> {
        let value = self.next;
        self.next = self.next.checked_add(1)?;
        Some(value)
    }

    /// The value the next call returns.
    pub fn peek(&self) -> u64 {
        self.next
    }
}

/// Words of the pending-acknowledgement bit set.
const WINDOW_WORDS: usize = (ACKNOWLEDGEMENT_WINDOW_KEYS / 64) as usize;

/// A counter whose "last value" is the highest value below which everything was acknowledged.
#[derive(Clone, Debug)]
pub struct AcknowledgedCounter {
    /// The next value to hand out.
    next: u64,
    /// Every value in `[start, acknowledged_end)` is acknowledged.
    acknowledged_end: u64,
    /// Bit `v % window` is set when `v` in `[acknowledged_end, next)` was acknowledged early.
    /// Allocated once (128 KiB) at construction.
    pending: Vec<u64>,
}

impl AcknowledgedCounter {
    /// A counter whose first value is `start`; its last value is `start - 1` until the first
    /// acknowledgement (YCSB: `limit = countstart - 1`).
    pub fn new(start: u64) -> Self {
        AcknowledgedCounter { next: start, acknowledged_end: start, pending: vec![0; WINDOW_WORDS] }
    }

    /// The next value to insert.
    ///
    /// # Errors
    /// [`Error::TooManyUnacknowledgedInserts`] if the window of outstanding values is full.
    #[inline]
    pub fn next_value(&mut self) -> Result<u64, Error> {
        if self.outstanding() >= ACKNOWLEDGEMENT_WINDOW_KEYS || self.next == u64::MAX {
            return Err(Error::TooManyUnacknowledgedInserts {
                outstanding: self.outstanding(),
                window: ACKNOWLEDGEMENT_WINDOW_KEYS,
            });
        }
        let value = self.next;
        self.next += 1;
        Ok(value)
    }

    /// Values handed out and not yet part of the acknowledged prefix.
    pub fn outstanding(&self) -> u64 {
        self.next - self.acknowledged_end
    }

    /// How many more values `next_value` can hand out before the window is full.
    pub fn available(&self) -> u64 {
        ACKNOWLEDGEMENT_WINDOW_KEYS - self.outstanding()
    }

    /// The highest value `v` such that every value from the start up to `v` is acknowledged;
    /// `None` while that prefix is empty and the counter started at 0 (YCSB's `-1`).
    #[inline]
    pub fn last_value(&self) -> Option<u64> {
        self.acknowledged_end.checked_sub(1)
    }

    /// Marks `value` as inserted; advances the last value over every contiguous acknowledged
    /// value.
    ///
    /// # Errors
    /// [`Error::InvalidAcknowledgement`] if `value` was never handed out or is acknowledged
    /// already.
    pub fn acknowledge(&mut self, value: u64) -> Result<(), Error> {
        if value >= self.next {
            return Err(Error::InvalidAcknowledgement {
                key_number: value,
                reason: "never handed out by the insert counter",
            });
        }
        if value < self.acknowledged_end || self.is_pending(value) {
            return Err(Error::InvalidAcknowledgement { key_number: value, reason: "acknowledged already" });
        }
        self.set_pending(value, true);
        // Bounded: at most `outstanding() <= window` steps.
        while self.acknowledged_end < self.next && self.is_pending(self.acknowledged_end) {
            self.set_pending(self.acknowledged_end, false);
            self.acknowledged_end += 1;
        }
        Ok(())
    }

    fn slot(value: u64) -> (usize, u64) {
        let bit = value % ACKNOWLEDGEMENT_WINDOW_KEYS;
        ((bit / 64) as usize, 1u64 << (bit % 64))
    }

    fn is_pending(&self, value: u64) -> bool {
        let (word, mask) = Self::slot(value);
        self.pending[word] & mask != 0
    }

    fn set_pending(&mut self, value: u64, pending: bool) {
        let (word, mask) = Self::slot(value);
        if pending {
            self.pending[word] |= mask;
        } else {
            self.pending[word] &= !mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_counts() {
        let mut counter = Counter::new(5);
        assert_eq!(counter.next_value(), Some(5));
        assert_eq!(counter.next_value(), Some(6));
        assert_eq!(counter.peek(), 7);
        let mut last = Counter::new(u64::MAX);
        assert_eq!(last.next_value(), None);
    }

    #[test]
    fn last_value_follows_contiguous_acknowledgements() {
        let mut counter = AcknowledgedCounter::new(100);
        assert_eq!(counter.last_value(), Some(99));
        let first = counter.next_value().expect("room");
        let second = counter.next_value().expect("room");
        let third = counter.next_value().expect("room");
        assert_eq!((first, second, third), (100, 101, 102));
        // Out of order: 101 and 102 wait for 100.
        counter.acknowledge(102).expect("valid");
        counter.acknowledge(101).expect("valid");
        assert_eq!(counter.last_value(), Some(99));
        counter.acknowledge(100).expect("valid");
        assert_eq!(counter.last_value(), Some(102));
        assert_eq!(counter.outstanding(), 0);
    }

    #[test]
    fn bad_acknowledgements_are_errors() {
        let mut counter = AcknowledgedCounter::new(0);
        assert_eq!(counter.last_value(), None);
        assert!(counter.acknowledge(0).is_err(), "never handed out");
        let value = counter.next_value().expect("room");
        counter.acknowledge(value).expect("valid");
        assert!(counter.acknowledge(value).is_err(), "twice");
        let pending = counter.next_value().expect("room");
        let _ = counter.next_value().expect("room");
        counter.acknowledge(pending + 1).expect("valid");
        assert!(counter.acknowledge(pending + 1).is_err(), "twice while pending");
    }

    #[test]
    fn full_window_is_an_error_not_a_panic() {
        let mut counter = AcknowledgedCounter::new(0);
        for _ in 0..ACKNOWLEDGEMENT_WINDOW_KEYS {
            counter.next_value().expect("room");
        }
        assert_eq!(counter.available(), 0);
        assert!(matches!(counter.next_value(), Err(Error::TooManyUnacknowledgedInserts { .. })));
        counter.acknowledge(0).expect("valid");
        assert_eq!(counter.next_value().expect("room again"), ACKNOWLEDGEMENT_WINDOW_KEYS);
        // The slot of value 0 is reused by the window-size value: acknowledging it must work.
        for value in 1..=ACKNOWLEDGEMENT_WINDOW_KEYS {
            counter.acknowledge(value).expect("valid");
        }
        assert_eq!(counter.last_value(), Some(ACKNOWLEDGEMENT_WINDOW_KEYS));
    }
}
