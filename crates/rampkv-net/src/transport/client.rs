//! The client side of a transport: the [`ClientTransport`] trait every transport implements,
//! and the [`ServerEvent`]s a transport that survives one server's failure reports.

use std::time::Duration;

use rampkv_core::wire::{Request, Response};

use super::error::TransportError;
use super::stats::{GetStarStats, InterleaveStats};
use crate::message::BatchStats;

/// A change of one server's connection, reported by [`ClientTransport::take_server_events`].
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerEvent {
    /// The connection to `server` failed (`error` says how): what was queued for it is
    /// discarded and nothing is sent to it until it is [`ServerEvent::Up`] again.
    Down { server: usize, error: TransportError },
    /// A new connection to `server` is open (after a [`ServerEvent::Down`]).
    Up { server: usize },
}

/// The client side of a transport, connected to every server of a cluster.
pub trait ClientTransport {
    /// Number of servers this transport reaches.
    fn server_count(&self) -> usize;

    /// Queues `request` for `server`; it is sent by the next [`ClientTransport::flush`]
    /// (or earlier, if the transport must make room).
    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError>;

    /// [`ClientTransport::post`] of a request the caller no longer needs. A transport that
    /// hands requests over in process takes it as it is instead of copying it; the others
    /// encode it as `post` does.
    fn post_owned(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        self.post(server, request_id, &request)
    }

    /// Sends everything queued, as far as the medium accepts without blocking.
    fn flush(&mut self) -> Result<(), TransportError>;

    /// Waits up to `timeout` (None: until something arrives) for replies and hands each one,
    /// with its server and request id, to `deliver`. Returns how many were delivered.
    fn poll<F>(&mut self, timeout: Option<Duration>, deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response);

    /// Moves the server events since the last call to `events` (a transport that survives the
    /// failure of one server's connection; the others fail as a whole and report none).
    fn take_server_events(&mut self, _events: &mut Vec<ServerEvent>) {}

    /// Tries to connect again to the servers that are down and whose backoff is over (also
    /// done by `poll`); successes are reported as [`ServerEvent::Up`].
    fn reconnect_due(&mut self) {}

    /// Drops the connection to `server` (the driver refuses what answered on it) and connects
    /// again after the backoff. No event is reported for it.
    fn disconnect(&mut self, _server: usize) {}

    /// GET\* counters, for a transport that reads item slots (`None` for the others).
    fn getstar_stats(&self) -> Option<GetStarStats> {
        None
    }

    /// Batching counters, for a transport whose medium batches frames into calls (RF-RPC).
    fn batch_stats(&self) -> Option<BatchStats> {
        None
    }

    /// The interleaving model's counters, for a transport behind one.
    fn interleave_stats(&self) -> Option<InterleaveStats> {
        None
    }
}
