//! Transports: how a client's requests reach servers and replies come back.
//!
//! Every transport implements the small, batch-oriented [`ClientTransport`] trait: post any
//! number of requests, flush them in as few operations as the medium allows, then poll for
//! replies. The driver ([`crate::client::Driver`]) is generic over it, so there is no dynamic
//! dispatch per message. Every transport carries the same frames ([`rampkv_core::wire`]).
//!
//! - [`tcp`]: one socket per server.
//! - [`writepoll`]: GET+/PUT+, message rings written one-sidedly over the fabric.
//! - [`sendrecv`]: two-sided send/recv emulated over the fabric (posted receive buffers and a
//!   completion queue, as RDMA SEND/RECV).
//! - [`onesided`]: GET\*/PUT+, round-1 reads from item slots read one-sidedly, the rest as
//!   write-poll.
//! - [`rfrpc`]: remote-fetch RPC: requests into the server's memory, replies fetched from it.
//! - [`local`]: direct calls into the server cores of the client's own process.

pub mod local;
pub mod onesided;
pub mod rfrpc;
pub mod sendrecv;
pub mod tcp;
pub mod writepoll;

use std::time::Duration;

use rampkv_core::wire::{Request, Response, WireError};

/// Why a transport failed. A failed transport is broken for good: the caller reconnects.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("cannot connect to server {server} at {address}: {error}")]
    Connect { server: usize, address: String, error: std::io::Error },
    #[error("i/o error with server {server}: {error}")]
    Io { server: usize, error: std::io::Error },
    #[error("server {server} closed the connection")]
    Closed { server: usize },
    #[error("server {server} sent bytes that are not a valid reply: {error}")]
    Malformed { server: usize, error: WireError },
    #[error("no server {server} (the cluster has {servers})")]
    NoSuchServer { server: usize, servers: usize },
    #[error("fabric or ring failure with server {server}: {reason}")]
    Fabric { server: usize, reason: String },
    #[error("server {server} cannot be asked this way: {what}")]
    Unsupported { server: usize, what: String },
    #[error("a frame of {frame_bytes} bytes for server {server} exceeds the ring message maximum {message_bytes_max}")]
    MessageTooLarge { server: usize, frame_bytes: usize, message_bytes_max: usize },
}

/// How long a message transport's `poll`, started at `started` with `timeout`, may sleep on its
/// doorbell now: what is left of the timeout, at most `WRITEPOLL_SLEEP_MS_MAX` (so the control
/// connections are checked that often); `None` once the timeout has passed.
pub(crate) fn doorbell_sleep(started: std::time::Instant, timeout: Option<Duration>) -> Option<Duration> {
    let cap = Duration::from_millis(rampkv_core::limits::WRITEPOLL_SLEEP_MS_MAX);
    match timeout {
        None => Some(cap),
        Some(timeout) => match timeout.checked_sub(started.elapsed()) {
            Some(remaining) if !remaining.is_zero() => Some(remaining.min(cap)),
            _ => None,
        },
    }
}

/// Appends `request`'s frame to `outgoing` (what a message transport has queued for `server`),
/// unless the frame alone exceeds `message_bytes_max`: then nothing is queued and the error
/// says so (the transport stays usable).
pub(crate) fn queue_frame(
    outgoing: &mut Vec<u8>,
    server: usize,
    request_id: u64,
    request: &Request,
    message_bytes_max: usize,
) -> Result<(), TransportError> {
    let start = outgoing.len();
    request.encode_frame(request_id, outgoing);
    let frame_bytes = outgoing.len() - start;
    if frame_bytes > message_bytes_max {
        outgoing.truncate(start);
        return Err(TransportError::MessageTooLarge { server, frame_bytes, message_bytes_max });
    }
    Ok(())
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

    /// GET\* counters, for a transport that reads item slots (`None` for the others).
    fn getstar_stats(&self) -> Option<onesided::GetStarStats> {
        None
    }
}
