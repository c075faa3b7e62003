//! Keys, values, timestamps and the timestamp clock.
//!
//! # Timestamps
//! A transaction timestamp is 64 bits: `(clock_us << 16) | client_id`. `clock_us` is a hybrid
//! logical clock in microseconds since [`CLOCK_EPOCH_UNIX_US`] that never goes backwards and
//! never repeats for one client, and `client_id` (16 bits, never 0) is unique among live clients
//! of a cluster (handed out by the cluster's first server, see `wire::Request::Hello`). Hence two
//! transactions never share a timestamp, and timestamps from one client increase. Timestamp 0
//! means "the initial value, never written". 48 bits of microseconds last 8.9 years from the
//! epoch.

use std::time::{SystemTime, UNIX_EPOCH};

/// A name (of a protocol, a transport, a figure ...) that is none of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}; choose one of {}", choices.join(", "))]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
    pub choices: Vec<&'static str>,
}

/// A transaction timestamp. See the module docs for the layout.
pub type Timestamp = u64;

/// The timestamp of the initial (never written) value of every key; its value is empty.
pub const TIMESTAMP_INITIAL: Timestamp = 0;

/// Bits of the timestamp that carry the client id.
pub const CLIENT_ID_BITS: u32 = 16;

/// 2025-01-01T00:00:00Z in microseconds since the Unix epoch.
pub const CLOCK_EPOCH_UNIX_US: u64 = 1_735_689_600_000_000;

/// The client id a timestamp was issued by.
pub fn timestamp_client_id(ts: Timestamp) -> u16 {
    (ts & ((1 << CLIENT_ID_BITS) - 1)) as u16
}

/// Microseconds since [`CLOCK_EPOCH_UNIX_US`], from the wall clock (0 if the clock is before it).
pub fn wall_clock_us() -> u64 {
    let since_unix =
        SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_micros() as u64).unwrap_or(0);
    since_unix.saturating_sub(CLOCK_EPOCH_UNIX_US)
}

/// A per-client hybrid logical clock issuing unique, increasing timestamps.
///
/// Wall time keeps clients' timestamps near each other (so a later write usually wins the
/// `lastCommit` max); the logical part guarantees increase even if the wall clock stalls or
/// steps back; the client id makes timestamps of different clients distinct.
#[derive(Debug, Clone)]
pub struct TimestampClock {
    client_id: u16,
    last_us: u64,
}

impl TimestampClock {
    /// A clock for `client_id`, which must not be 0 (0 is reserved for the initial value).
    pub fn new(client_id: u16) -> Self {
        assert!(client_id != 0, "client id 0 is reserved");
        Self { client_id, last_us: 0 }
    }

    /// The client id stamped into every timestamp.
    pub fn client_id(&self) -> u16 {
        self.client_id
    }

    /// The next timestamp, given the current wall clock reading.
    pub fn next(&mut self, now_us: u64) -> Timestamp {
        self.last_us = now_us.max(self.last_us + 1);
        assert!(self.last_us < 1 << (64 - CLIENT_ID_BITS), "clock overflow");
        let ts = (self.last_us << CLIENT_ID_BITS) | u64::from(self.client_id);
        debug_assert!(ts != TIMESTAMP_INITIAL);
        ts
    }

    /// Moves the clock past a timestamp seen from another client, so that this client's next
    /// write is newer than anything it has read (a Lamport step).
    pub fn observe(&mut self, ts: Timestamp) {
        self.last_us = self.last_us.max(ts >> CLIENT_ID_BITS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_increase_and_carry_the_client_id_even_when_the_wall_clock_stalls() {
        let mut clock = TimestampClock::new(7);
        let first = clock.next(1_000);
        let second = clock.next(1_000);
        let third = clock.next(500);
        assert!(first < second && second < third);
        for ts in [first, second, third] {
            assert_eq!(timestamp_client_id(ts), 7);
        }
    }

    #[test]
    fn observing_a_newer_timestamp_moves_the_clock_past_it() {
        let mut writer = TimestampClock::new(1);
        let mut reader = TimestampClock::new(2);
        let seen = writer.next(1_000_000);
        reader.observe(seen);
        assert!(reader.next(10) > seen);
    }

    #[test]
    fn two_clients_never_share_a_timestamp() {
        let mut a = TimestampClock::new(1);
        let mut b = TimestampClock::new(2);
        for now in 0..1000 {
            assert_ne!(a.next(now), b.next(now));
        }
    }
}
