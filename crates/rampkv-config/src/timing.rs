//! Timing settings of the failure detector and the Raft core, and the clock they are read on.
//!
//! # Leases and clocks
//! Each node reads its own monotonic clock; clocks are never compared across nodes. A lease is
//! measured twice, each side on its own clock and each with a margin of `clock_drift_ppm`
//! against the other: the holder counts it from the moment it *sent* the heartbeat that bought
//! it and stops `lease * (1 - drift)` later; the leader counts it from the moment it *received*
//! that heartbeat (later, in real time) and considers it held until `lease * (1 + drift)`
//! later. As long as no clock's rate is off by more than the drift bound, the leader's end is
//! never before the holder's (docs/replication.md, "Leases").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::ConfigError;
use crate::limits::{
    DEFAULT_CLOCK_DRIFT_PPM, DEFAULT_ELECTION_TICKS, DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_LEASE_MS,
    DEFAULT_RAFT_HEARTBEAT_TICKS, DEFAULT_TICK_MS,
};

const NANOS_PER_MS: u64 = 1_000_000;
const PPM: u64 = 1_000_000;

/// Timing of one node. Every node of a cluster should use the same settings (the holder's and
/// the leader's margins are computed from their own settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often the Raft core ticks and the failure detector looks.
    pub tick_ms: u64,
    /// How often a server heartbeats (asks to extend its lease).
    pub heartbeat_interval_ms: u64,
    /// How long a heartbeat's lease lasts (before the drift margin).
    pub lease_ms: u64,
    /// Bound on clock-rate disagreement, in parts per million.
    pub clock_drift_ppm: u64,
    /// Raft election timeout in ticks (randomised in [this, 2 x this)).
    pub election_ticks: usize,
    /// Raft leader heartbeat interval in ticks.
    pub raft_heartbeat_ticks: usize,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            tick_ms: DEFAULT_TICK_MS,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            lease_ms: DEFAULT_LEASE_MS,
            clock_drift_ppm: DEFAULT_CLOCK_DRIFT_PPM,
            election_ticks: DEFAULT_ELECTION_TICKS,
            raft_heartbeat_ticks: DEFAULT_RAFT_HEARTBEAT_TICKS,
        }
    }
}

impl Timing {
    /// Refuses settings that cannot give safe or live leases.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let problem = if self.tick_ms == 0 {
            "tick_ms must be at least 1"
        } else if self.heartbeat_interval_ms < self.tick_ms {
            "heartbeat_interval_ms must be at least tick_ms"
        } else if self.lease_ms < 3 * self.heartbeat_interval_ms {
            "lease_ms must be at least 3 heartbeat intervals (a lost heartbeat must not cost the lease)"
        } else if self.clock_drift_ppm >= PPM / 10 {
            "clock_drift_ppm must be below 100000 (10%)"
        } else if self.raft_heartbeat_ticks == 0 || self.election_ticks <= self.raft_heartbeat_ticks {
            "election_ticks must exceed raft_heartbeat_ticks, which must be at least 1"
        } else {
            return Ok(());
        };
        Err(ConfigError::BadTiming { problem })
    }

    pub(crate) fn tick_ns(&self) -> u64 {
        self.tick_ms * NANOS_PER_MS
    }

    pub(crate) fn heartbeat_interval_ns(&self) -> u64 {
        self.heartbeat_interval_ms * NANOS_PER_MS
    }

    /// The lease a grant carries.
    pub(crate) fn lease_ns(&self) -> u64 {
        self.lease_ms * NANOS_PER_MS
    }

    /// How long after sending its heartbeat a holder may use the lease `lease_ns` it bought.
    pub(crate) fn holder_lease_ns(&self, lease_ns: u64) -> u64 {
        lease_ns - lease_ns / PPM * self.clock_drift_ppm - (lease_ns % PPM) * self.clock_drift_ppm / PPM
    }

    /// How long after receiving a heartbeat the leader must assume its lease may be held.
    pub fn leader_lease_ns(&self) -> u64 {
        let lease_ns = self.lease_ns();
        lease_ns + lease_ns / PPM * self.clock_drift_ppm + (lease_ns % PPM) * self.clock_drift_ppm / PPM + 1
    }
}

/// A monotonic clock in nanoseconds from an arbitrary origin (per node).
pub trait Clock: Send + Sync + 'static {
    fn now_ns(&self) -> u64;
}

/// The process's monotonic clock (`Instant`).
#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> MonotonicClock {
        MonotonicClock { origin: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> MonotonicClock {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        // Starts at 1 ms so that 0 can mean "never" in lease bookkeeping.
        self.origin.elapsed().as_nanos() as u64 + NANOS_PER_MS
    }
}

/// A clock moved by hand (tests): shared, so a test can hold one handle and give a node another.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now_ns: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start_ns: u64) -> ManualClock {
        ManualClock { now_ns: Arc::new(AtomicU64::new(start_ns)) }
    }

    pub fn advance_ns(&self, ns: u64) {
        self.now_ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holders_end_is_before_the_leaders_and_bad_settings_are_refused() {
        let timing = Timing::default();
        timing.validate().unwrap();
        assert_eq!(timing.holder_lease_ns(timing.lease_ns()), 297 * NANOS_PER_MS);
        assert_eq!(timing.leader_lease_ns(), 303 * NANOS_PER_MS + 1);
        for bad in [
            Timing { tick_ms: 0, ..timing },
            Timing { lease_ms: 100, ..timing },
            Timing { clock_drift_ppm: 200_000, ..timing },
            Timing { election_ticks: 2, ..timing },
            Timing { heartbeat_interval_ms: 5, ..timing },
        ] {
            assert!(matches!(bad.validate(), Err(ConfigError::BadTiming { .. })), "{bad:?}");
        }
    }
}
