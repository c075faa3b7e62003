//! The message layer (eRPC's shape): one small [`Channel`] trait that moves bursts of whole
//! wire frames over one connection, the two sides of a medium that open channels
//! ([`ClientMedium`], [`ServerMedium`], woken through [`Wake`]), and one adapter per medium. The
//! client transport (`transport::Transport`) and the server front end (`server::poller`), in the
//! layers above, are written once over it; a new medium (a verbs backend, a replication link)
//! is one adapter. No code here imports from those layers.
//!
//! # Layout
//! - [`control`]: the lines of the fabric's control handshake (no I/O): hello, challenge,
//!   verdict, typed refusal, and the item region a server announces.
//! - [`tcp`]: sockets (a byte stream: frames may be cut anywhere).
//! - [`ring`]: GET+/PUT+ message rings written one-sidedly (whole frames per message).
//! - [`sendrecv`]: two-sided send/recv with posted receive buffers and a completion queue.
//! - [`rfrpc`]: remote-fetch RPC: requests into the server's ring, replies fetched from its slot.
//! - [`fallback`]: a fabric medium that reaches a server over TCP where the fabric cannot
//!   (another host without RDMA), and what each server got.
//! - [`fabric`]: what the fabric adapters share: the fabric handle, the client's region and
//!   doorbell, the server connection regions and doorbell region, and the client's side of the
//!   control handshake (TCP, JSON lines with a challenge, like rdma-cm).
//!
//! # The contract of a channel
//! `send` takes whole frames from the front of what it is offered, as many as the medium accepts
//! now without blocking (a stream may take any prefix); `receive` hands what arrived to a
//! consumer that takes whole frames and may stop early (back-pressure), and offers the rest again
//! first next time; `readable`/`writable` are cheap readiness checks (one load on a fabric) that
//! a poller's doorbell or epoll wait is built on. A medium's [`ClientMedium`] or
//! [`ServerMedium`] opens channels (connect or accept, with the handshake) and waits on all of
//! them at once.

pub mod control;
pub mod fabric;
pub mod fallback;
pub mod rfrpc;
pub mod ring;
pub mod sendrecv;
pub mod tcp;

use std::sync::Arc;
use std::time::Duration;

use rampkv_core::limits::STREAM_BUFFER_KEEP_BYTES;
use rampkv_core::wire::{FrameHeader, WireError, FRAME_HEADER_BYTES};
use rampkv_fabric::rpc::RpcError;
use rampkv_fabric::{FabricError, PostError, QueueError, RingError, SendError};

/// Why a channel failed. A failed channel is broken for good: close it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    #[error("the peer closed the connection")]
    Closed,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error(transparent)]
    Ring(#[from] RingError),
    #[error(transparent)]
    Send(#[from] SendError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Post(#[from] PostError),
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error("the server refused the connection: {0}")]
    Refused(#[from] control::Refusal),
    #[error("the server answered for another medium")]
    WrongMedium,
    /// The binary port's authentication step failed (the server's words, or its proof).
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    /// A fabric server did not prove it knows the shared secret.
    #[error("the server could not prove it knows the shared secret: is its --secret-file the same file?")]
    ServerUnauthenticated,
    /// The peer's control line was valid JSON but not the step the handshake was at.
    #[error("the control handshake went out of step: expected {expected}")]
    Handshake { expected: &'static str },
}

/// One connection's data path over one medium. See the module docs for the contract.
pub trait Channel {
    /// A byte stream (frames may be cut anywhere); otherwise every message holds whole frames
    /// and one that does not is corruption.
    const STREAM: bool;

    /// [`Channel::STREAM`] of this channel (a channel type that wraps media of both kinds says
    /// it per channel).
    fn is_stream(&self) -> bool {
        Self::STREAM
    }

    /// The largest frame this channel carries (a larger reply is replaced by an error reply).
    fn frame_bytes_max(&self) -> usize;

    /// Sends whole frames from the front of `frames` as far as the medium takes them now;
    /// returns the bytes taken. A channel that serves calls (RF-RPC) answers the pending call
    /// here even when `frames` is empty.
    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError>;

    /// Offers what the previous call left, then at most one newly arrived message (or one read
    /// of a stream) to `consume`, which returns the bytes it took (whole frames). What it does
    /// not take is offered again first next time. Returns whether something new arrived.
    fn receive(&mut self, consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError>;

    /// Whether something may be there to receive (cheap, for a wait condition).
    fn readable(&self) -> bool;

    /// Whether a send that took less than it was offered may take more now (cheap).
    fn writable(&self) -> bool;

    /// Readiness reported by an event loop (epoll); channels that check memory ignore it.
    fn set_ready(&mut self, _readable: bool, _writable: bool, _peer_finished: bool) {}

    /// Batching counters of a channel that batches frames into calls (RF-RPC).
    fn batch_stats(&self) -> Option<BatchStats> {
        None
    }

    /// Whether the peer is still there (a fabric channel's control connection is open).
    fn check_peer(&mut self) -> Result<(), ChannelError> {
        Ok(())
    }

    /// Bytes of memory this channel holds for what it received (a stream's input buffer; a
    /// message medium's messages live in fixed regions): counted in the server's budgets.
    fn buffered_bytes(&self) -> usize {
        0
    }

    /// Whether received bytes wait for the rest of their frame (a stream only).
    fn partial_frame(&self) -> bool {
        false
    }

    /// The peer's network address, where the medium has one (for what a server logs).
    fn peer_address(&self) -> Option<std::net::SocketAddr> {
        None
    }
}

/// The client's side of one medium: opens its channels (with the handshake) and waits on all of
/// them at once.
pub trait ClientMedium: Sized {
    type Channel: Channel;

    /// Connects to server `server` at `address` (its TCP or control address).
    fn connect(&mut self, server: usize, address: &str) -> Result<Self::Channel, ChannelError>;

    /// Blocks up to `timeout` (None: indefinitely, or a medium's slice) until a channel may be
    /// readable or writable (`None`: a server whose connection is down). Returns true if it
    /// timed out.
    fn wait(&mut self, channels: &mut [Option<Self::Channel>], timeout: Option<Duration>)
        -> Result<bool, ChannelError>;
}

/// A medium a client sets up on its own (TCP with its own poller, a fabric with its own region).
pub trait OpenMedium: ClientMedium {
    /// The client's side for `servers` servers (a fabric client registers its region).
    fn open(servers: usize) -> Result<Self, ChannelError>;
}

/// What a medium reports to its poller.
#[derive(Debug)]
pub enum FrontEvent<C> {
    /// A new connection of server `server`, in `slot`.
    Open { slot: usize, server: usize, channel: C },
    /// The connection in `slot` is gone (its peer left); the slot may be reused once released.
    Closed { slot: usize },
    /// epoll readiness of the connection in `slot`.
    Ready { slot: usize, readable: bool, writable: bool, finished: bool },
    /// Any connection may have work (a doorbell woke the poller): look at each.
    AllReady,
}

/// The server's side of one medium.
pub trait ServerMedium: Send + 'static {
    type Channel: Channel + Send;

    /// The wake-up of this poller, for its inbox in the group's router.
    fn waker(&self) -> Arc<dyn Wake>;

    /// Blocks up to `timeout` until something may be ready (`ready` is the poller's own
    /// condition: a connection's channel, the inbox, the stop flag), and reports it in `events`.
    fn wait(
        &mut self,
        timeout: Duration,
        ready: impl Fn() -> bool,
        events: &mut Vec<FrontEvent<Self::Channel>>,
    ) -> std::io::Result<()>;

    /// The poller closed the connection in `slot` (a fault, its end, or shutdown): tell the peer.
    fn close(&mut self, slot: usize, channel: Self::Channel);

    /// The slot of a connection reported `Closed` may be handed out again.
    fn release(&mut self, _slot: usize) {}

    /// Whether the medium authenticated its connections before opening them (the fabric's
    /// control handshake does); otherwise, with a shared secret, each connection runs the
    /// binary port's authentication step first.
    const AUTHENTICATES: bool = false;
}

/// How a front end is woken when replies arrive in its inbox (a server medium's epoll waker or
/// doorbell; an in-process client's condition variable). The server's router calls it.
pub trait Wake: Send + Sync {
    fn wake(&self);
}

/// How a channel that batches frames into calls did (summed over channels and threads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BatchStats {
    /// Calls sent.
    pub calls: u64,
    /// Frames they carried.
    pub frames: u64,
    /// The largest batch size in force at the end (the automatic controller's choice).
    pub size: u64,
    /// Times the controller changed a batch size.
    pub size_changes: u64,
}

impl BatchStats {
    /// Adds `other` into `self` (`size`: the larger).
    pub fn merge(&mut self, other: &BatchStats) {
        self.calls += other.calls;
        self.frames += other.frames;
        self.size = self.size.max(other.size);
        self.size_changes += other.size_changes;
    }

    /// Mean frames per call.
    pub fn frames_per_call(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.frames as f64 / self.calls as f64
        }
    }
}

impl std::fmt::Display for BatchStats {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{:.2} frames per call over {} calls; automatic batch size {} at the end ({} changes)",
            self.frames_per_call(),
            self.calls,
            self.size,
            self.size_changes
        )
    }
}

/// Frames queued for one channel: `bytes[sent..]` are not sent yet. Compacts as it drains, so
/// a connection that never fully drains does not grow without bound, and gives its memory back
/// when it empties holding more than `STREAM_BUFFER_KEEP_BYTES`.
#[derive(Debug, Default)]
pub struct OutBuffer {
    bytes: Vec<u8>,
    sent: usize,
    /// Bytes sent over the buffer's life (a server's slow-reader timeout watches it move).
    sent_total: u64,
}

impl OutBuffer {
    /// The frames not sent yet.
    pub fn unsent(&self) -> &[u8] {
        &self.bytes[self.sent..]
    }
    /// Bytes not sent yet.
    pub fn len(&self) -> usize {
        self.bytes.len() - self.sent
    }
    /// Whether everything was sent.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The buffer to append encoded frames to.
    pub fn frames(&mut self) -> &mut Vec<u8> {
        if self.sent > 0 && self.sent >= self.bytes.len() / 2 {
            self.bytes.drain(..self.sent);
            self.sent = 0;
        }
        &mut self.bytes
    }
    /// Forgets `count` sent bytes.
    pub fn advance(&mut self, count: usize) {
        self.sent += count;
        self.sent_total += count as u64;
        assert!(self.sent <= self.bytes.len(), "a channel took more than it was offered");
        if self.sent == self.bytes.len() {
            self.bytes.clear();
            self.sent = 0;
            if self.bytes.capacity() > STREAM_BUFFER_KEEP_BYTES {
                self.bytes = Vec::new(); // one large reply does not pin its size
            }
        }
    }

    /// Bytes sent over the buffer's life.
    pub fn sent_total(&self) -> u64 {
        self.sent_total
    }
    /// Sends what `channel` takes now.
    pub fn flush(&mut self, channel: &mut impl Channel) -> Result<(), ChannelError> {
        let taken = channel.send(self.unsent())?;
        self.advance(taken);
        Ok(())
    }
}

/// Received bytes a consumer did not take yet (message media keep them here; a stream keeps
/// them in its own buffer).
#[derive(Debug, Default)]
pub(crate) struct Leftover {
    bytes: Vec<u8>,
    offset: usize,
}

impl Leftover {
    pub(crate) fn is_empty(&self) -> bool {
        self.offset == self.bytes.len()
    }

    /// Offers the kept bytes to `consume`; true when none are left.
    pub(crate) fn offer(&mut self, consume: &mut impl FnMut(&[u8]) -> usize) -> bool {
        if !self.is_empty() {
            self.offset += consume(&self.bytes[self.offset..]);
        }
        if self.is_empty() {
            self.bytes.clear();
            self.offset = 0;
        }
        self.is_empty()
    }

    /// Offers `message` to `consume` and keeps what it does not take.
    pub(crate) fn offer_new(&mut self, message: &[u8], consume: &mut impl FnMut(&[u8]) -> usize) {
        debug_assert!(self.is_empty(), "a new message is offered only once the old one is taken");
        let taken = consume(message);
        self.bytes.extend_from_slice(&message[taken..]);
    }

    /// Keeps `bytes` after what is kept already (the entries of a message after the one the
    /// consumer stopped in).
    pub(crate) fn keep(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// The buffer a message is copied into before it is offered (send/recv copies anyway).
    pub(crate) fn fill(&mut self) -> &mut Vec<u8> {
        debug_assert!(self.is_empty());
        self.bytes.clear();
        self.offset = 0;
        &mut self.bytes
    }
}

/// Length of the (locally encoded, hence valid) frame at the start of `frames`.
pub(crate) fn frame_bytes_at(frames: &[u8]) -> usize {
    let body = u32::from_le_bytes(frames[0..4].try_into().expect("a frame header")) as usize;
    FRAME_HEADER_BYTES + body
}

/// Sends whole frames from `frames` in messages of at most `message_bytes_max` (a frame alone
/// may be larger only if `try_send` takes it) through `try_send` (`Ok(false)`: no room now)
/// until it refuses or everything is sent. Returns the bytes sent (a frame boundary).
pub(crate) fn send_messages<E>(
    frames: &[u8],
    message_bytes_max: usize,
    mut try_send: impl FnMut(&[u8]) -> Result<bool, E>,
) -> Result<usize, E> {
    let mut sent = 0;
    while sent < frames.len() {
        let mut end = sent;
        while end < frames.len() {
            let frame = frame_bytes_at(&frames[end..]);
            if end > sent && end + frame - sent > message_bytes_max {
                break;
            }
            end += frame;
        }
        assert!(end <= frames.len(), "frames buffer holds only whole frames");
        if !try_send(&frames[sent..end])? {
            break;
        }
        sent = end;
    }
    Ok(sent)
}

/// Why a walk over received frames stopped early.
#[derive(Debug)]
pub(crate) enum FrameFault {
    /// A frame header is invalid (the request id is the header's, if readable): a stream cannot
    /// be resynchronised.
    Invalid { error: WireError, request_id: u64 },
    /// A message of a message medium ends inside a frame.
    Cut,
}

/// Walks the whole frames at the front of `bytes`, handing each header and body to `frame`,
/// which returns whether to go on. Returns the bytes of the frames walked, and the fault that
/// ended the walk, if one did. On a stream a partial frame at the end is normal (the rest
/// follows); in a message it is a fault.
pub(crate) fn walk_frames(
    bytes: &[u8],
    stream: bool,
    mut frame: impl FnMut(FrameHeader, &[u8]) -> bool,
) -> (usize, Option<FrameFault>) {
    let mut walked = 0;
    while walked < bytes.len() {
        let rest = &bytes[walked..];
        let header = match FrameHeader::check(rest) {
            Ok(Some(header)) => header,
            Ok(None) if stream => break,
            Ok(None) => return (walked, Some(FrameFault::Cut)),
            Err(error) => {
                let request_id = rest.get(8..16).map_or(0, |id| u64::from_le_bytes(id.try_into().expect("8 bytes")));
                return (walked, Some(FrameFault::Invalid { error, request_id }));
            }
        };
        walked += header.frame_bytes();
        if !frame(header, &rest[FRAME_HEADER_BYTES..header.frame_bytes()]) {
            break;
        }
    }
    (walked, None)
}
