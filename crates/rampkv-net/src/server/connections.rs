//! What a server group's front ends count about their connections: why a front end closed one
//! on its own ([`Eviction`]), and the bytes they hold and the connections they closed
//! ([`ConnectionStats`], read as [`ConnectionCounts`]). Shared by every poller of a group
//! through `Servers`; public under `server::poller`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a front end closed a connection on its own (logged with the peer's address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Eviction {
    #[error("it holds {held_bytes} bytes (input and unsent replies), over the budget of {max_bytes} per connection")]
    ConnectionBudget { held_bytes: usize, max_bytes: usize },
    #[error(
        "all connections hold {total_bytes} bytes, over the front end's budget of {max_bytes}, and this one \
         holds the most ({held_bytes})"
    )]
    ServerBudget { held_bytes: usize, total_bytes: usize, max_bytes: usize },
    #[error(
        "{unsent_bytes} bytes of replies made no progress for {quiet_ms} ms (slow-reader timeout {timeout_ms} ms)"
    )]
    SlowReader { unsent_bytes: usize, quiet_ms: u64, timeout_ms: u64 },
    #[error(
        "{held_bytes} bytes of a partial frame, no frame completed for {quiet_ms} ms (frame timeout {timeout_ms} ms)"
    )]
    FrameTimeout { held_bytes: usize, quiet_ms: u64, timeout_ms: u64 },
    #[error("no request for {quiet_ms} ms (idle timeout {timeout_ms} ms)")]
    Idle { quiet_ms: u64, timeout_ms: u64 },
    #[error(
        "handshake not finished (not authenticated, or no complete frame) {open_ms} ms after it opened \
         (handshake timeout {timeout_ms} ms)"
    )]
    Handshake { open_ms: u64, timeout_ms: u64 },
}

/// Bytes the connections of a server group's front ends hold, and the connections they closed
/// on their own, by reason (shared by the group's front ends).
#[derive(Debug, Default)]
pub struct ConnectionStats {
    held_bytes: AtomicU64,
    closed: [AtomicU64; 6],
}

/// A reading of [`ConnectionStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectionCounts {
    /// Bytes all connections hold now (input buffers and unsent replies).
    pub held_bytes: u64,
    pub closed_over_connection_budget: u64,
    pub closed_over_server_budget: u64,
    pub closed_slow_reader: u64,
    pub closed_frame_timeout: u64,
    pub closed_idle: u64,
    pub closed_handshake: u64,
}

impl ConnectionStats {
    /// What the counters say now.
    pub fn read(&self) -> ConnectionCounts {
        let closed = |index: usize| self.closed[index].load(Ordering::Relaxed);
        ConnectionCounts {
            held_bytes: self.held_bytes.load(Ordering::Relaxed),
            closed_over_connection_budget: closed(0),
            closed_over_server_budget: closed(1),
            closed_slow_reader: closed(2),
            closed_frame_timeout: closed(3),
            closed_idle: closed(4),
            closed_handshake: closed(5),
        }
    }

    pub(super) fn count(&self, eviction: &Eviction) {
        let index = match eviction {
            Eviction::ConnectionBudget { .. } => 0,
            Eviction::ServerBudget { .. } => 1,
            Eviction::SlowReader { .. } => 2,
            Eviction::FrameTimeout { .. } => 3,
            Eviction::Idle { .. } => 4,
            Eviction::Handshake { .. } => 5,
        };
        self.closed[index].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn held_changed(&self, before: usize, after: usize) {
        if after > before {
            self.held_bytes.fetch_add((after - before) as u64, Ordering::Relaxed);
        } else if before > after {
            self.held_bytes.fetch_sub((before - after) as u64, Ordering::Relaxed);
        }
    }
}
