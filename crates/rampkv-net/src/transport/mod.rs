//! Transports: how a client's requests reach servers and replies come back.
//!
//! Every transport implements the small, batch-oriented [`ClientTransport`] trait: post any
//! number of requests, flush them in as few operations as the medium allows, then poll for
//! replies. The driver ([`crate::client::Driver`]) is generic over it, so there is no dynamic
//! dispatch per message. Every transport carries the same frames ([`rampkv_core::wire`]).
//!
//! [`Transport`] is the one implementation over the message layer ([`crate::message`]): posting,
//! flushing and polling are written once and run over any [`ClientMedium`]; the aliases below
//! name it per medium. Beside it:
//! - [`onesided`]: GET\*/PUT+, round-1 reads from item slots read one-sidedly, everything else
//!   over the write-poll transport it wraps;
//! - [`local`]: direct calls into the server cores of the client's own process, with the typed
//!   replies (no frame), S2PL included.
//!
//! # A server that fails
//! A transport that reconnects ([`Transport`], and those built on it) keeps working when one
//! server's connection fails (the server died, was killed, or sent garbage): that server's
//! channel is dropped, what was queued for it is discarded, requests posted for it meanwhile
//! are discarded too, and [`ClientTransport::take_server_events`] reports a
//! [`ServerEvent::Down`]. The other servers are served as before. The transport connects
//! again after `CLIENT_RECONNECT_BACKOFF_MS_MIN`, doubling the wait after each failed attempt
//! up to `CLIENT_RECONNECT_BACKOFF_MS_MAX`, inside `poll` or [`ClientTransport::reconnect_due`]
//! (an attempt blocks for at most the medium's connect timeout: immediate on a refused
//! connection, seconds on an address that drops packets), and reports a [`ServerEvent::Up`]
//! when it succeeds. The driver fails the transactions that needed the server and checks a
//! reconnected server's cluster file again before it uses it.
//!
//! [`interleave::Interleaving`] decorates any of them with a seeded network model (per-request
//! delays, per-link FIFO), so that servers see the requests of different sessions in different
//! orders, as separate machines do.

pub mod interleave;
pub mod local;
pub mod onesided;

use std::time::{Duration, Instant};

use rampkv_core::limits::{CLIENT_RECONNECT_BACKOFF_MS_MAX, CLIENT_RECONNECT_BACKOFF_MS_MIN};
use rampkv_core::wire::{Request, Response, WireError};
use rampkv_fabric::AnyFabric;

use crate::message::fabric::{FabricClient, FabricHandle, FabricKind};
use crate::message::fallback::Fallback;
use crate::message::rfrpc::RfRpc;
use crate::message::ring::Ring;
use crate::message::sendrecv::SendRecv;
use crate::message::tcp::TcpClient;
use crate::message::{walk_frames, BatchStats, Channel, ChannelError, ClientMedium, FrameFault, OpenMedium, OutBuffer};

/// TCP: one socket per server.
pub type TcpClientTransport = Transport<TcpClient>;
/// GET+/PUT+: message rings written one-sidedly over the fabric (shared memory or RDMA).
pub type WritePollClientTransport = Transport<FabricClient<AnyFabric, Ring>>;
/// Two-sided send/recv emulated over the fabric (posted receive buffers, a completion queue).
pub type SendRecvClientTransport = Transport<FabricClient<AnyFabric, SendRecv>>;
/// Remote-fetch RPC: requests into the server's memory, replies fetched from it.
pub type RfRpcClientTransport = Transport<FabricClient<AnyFabric, RfRpc>>;
/// GET\*/PUT+ over the (shared-memory) fabric.
pub type OneSidedClientTransport = onesided::GetStarTransport<AnyFabric>;
/// [`WritePollClientTransport`] that reaches over TCP a server the fabric cannot reach
/// ([`Transport::connect_or_tcp`]).
pub type MixedWritePollTransport = Transport<Fallback<AnyFabric, Ring>>;
/// [`SendRecvClientTransport`] with the TCP fallback.
pub type MixedSendRecvTransport = Transport<Fallback<AnyFabric, SendRecv>>;
/// [`RfRpcClientTransport`] with the TCP fallback.
pub type MixedRfRpcTransport = Transport<Fallback<AnyFabric, RfRpc>>;

/// Why a transport failed. A failed transport is broken for good: the caller reconnects.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    #[error("cannot set up the client's side of the medium: {0}")]
    Open(ChannelError),
    #[error("cannot connect to server {server} at {address}: {error}")]
    Connect { server: usize, address: String, error: ChannelError },
    #[error("server {server}: {error}")]
    Channel { server: usize, error: ChannelError },
    #[error("server {server} closed the connection")]
    Closed { server: usize },
    #[error("server {server} sent bytes that are not a valid reply: {error}")]
    Malformed { server: usize, error: WireError },
    #[error("server {server} sent a message that ends inside a frame")]
    CutFrame { server: usize },
    #[error("waiting for the servers failed: {0}")]
    Wait(ChannelError),
    #[error("no server {server} (the cluster has {servers})")]
    NoSuchServer { server: usize, servers: usize },
    #[error("a frame of {frame_bytes} bytes for server {server} exceeds the message maximum {message_bytes_max}")]
    MessageTooLarge { server: usize, frame_bytes: usize, message_bytes_max: usize },
    #[error("server {server} announced an item region that cannot be read: {error}")]
    ItemRegion { server: usize, error: onesided::ItemRegionError },
}

impl TransportError {
    /// A channel error of `server`, with the end of the connection told apart.
    pub fn channel(server: usize, error: ChannelError) -> TransportError {
        match error {
            ChannelError::Closed => TransportError::Closed { server },
            error => TransportError::Channel { server, error },
        }
    }
}

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
    fn getstar_stats(&self) -> Option<onesided::GetStarStats> {
        None
    }

    /// Batching counters, for a transport whose medium batches frames into calls (RF-RPC).
    fn batch_stats(&self) -> Option<BatchStats> {
        None
    }

    /// The interleaving model's counters, for a transport behind one.
    fn interleave_stats(&self) -> Option<interleave::InterleaveStats> {
        None
    }
}

/// The client transport over any medium: per server a channel (while it is up) and the frames
/// queued for it.
#[derive(Debug)]
pub struct Transport<M: ClientMedium> {
    medium: M,
    addresses: Vec<String>,
    channels: Vec<Option<M::Channel>>,
    outgoing: Vec<OutBuffer>,
    /// Per server: when to try to connect again while it is down, and the wait after that.
    reconnect: Vec<Reconnect>,
    /// Servers whose channel is down.
    down: usize,
    events: Vec<ServerEvent>,
}

/// When a down server is tried again.
#[derive(Debug, Clone, Copy)]
struct Reconnect {
    at: Instant,
    backoff: Duration,
}

impl Reconnect {
    fn first() -> Reconnect {
        let backoff = Duration::from_millis(CLIENT_RECONNECT_BACKOFF_MS_MIN);
        Reconnect { at: Instant::now() + backoff, backoff }
    }

    fn failed_again(&mut self) {
        self.backoff = (self.backoff * 2).min(Duration::from_millis(CLIENT_RECONNECT_BACKOFF_MS_MAX));
        self.at = Instant::now() + self.backoff;
    }
}

impl<M: OpenMedium> Transport<M> {
    /// Connects to every address (server i is `addresses[i]`: its TCP address, or its front
    /// end's control address for a fabric medium).
    pub fn connect(addresses: &[String]) -> Result<Self, TransportError> {
        Self::with_medium(M::open(addresses.len()).map_err(TransportError::Open)?, addresses)
    }
}

impl<F: FabricHandle, K: FabricKind<F>> Transport<Fallback<F, K>> {
    /// Connects to every server's front end at `control_addresses`; a server the fabric cannot
    /// reach (another host, no RDMA on one side) is reached over TCP at `tcp_addresses[i]`
    /// instead, and said so (`crate::message::fallback`).
    pub fn connect_or_tcp(control_addresses: &[String], tcp_addresses: &[String]) -> Result<Self, TransportError> {
        let fabric = FabricClient::open(control_addresses.len()).map_err(TransportError::Open)?;
        Self::with_medium(Fallback::new(fabric, tcp_addresses), control_addresses)
    }
}

impl<M: ClientMedium> Transport<M> {
    /// Connects to every address over `medium`.
    pub fn with_medium(mut medium: M, addresses: &[String]) -> Result<Self, TransportError> {
        let mut channels = Vec::with_capacity(addresses.len());
        for (server, address) in addresses.iter().enumerate() {
            let connected = medium.connect(server, address);
            channels.push(Some(connected.map_err(|error| TransportError::Connect {
                server,
                address: address.clone(),
                error,
            })?));
        }
        let outgoing = addresses.iter().map(|_| OutBuffer::default()).collect();
        let reconnect = addresses.iter().map(|_| Reconnect::first()).collect();
        Ok(Self { medium, addresses: addresses.to_vec(), channels, outgoing, reconnect, down: 0, events: Vec::new() })
    }

    /// The medium (e.g. the fabric a fabric client maps with).
    pub fn medium(&self) -> &M {
        &self.medium
    }

    /// Server `server`'s channel (its statistics, its test hooks); `None` while it is down.
    pub fn channel(&self, server: usize) -> Option<&M::Channel> {
        self.channels.get(server).and_then(Option::as_ref)
    }

    /// Server `server`'s channel, mutable (fault-injection hooks); `None` while it is down.
    pub fn channel_mut(&mut self, server: usize) -> Option<&mut M::Channel> {
        self.channels.get_mut(server).and_then(Option::as_mut)
    }

    /// Whether server `server`'s connection is down.
    pub fn is_down(&self, server: usize) -> bool {
        self.channels.get(server).is_some_and(Option::is_none)
    }

    /// Server `server`'s connection failed: drops it and what was queued for it, and reports it.
    fn fail(&mut self, server: usize, error: TransportError) {
        if self.drop_channel(server) {
            self.events.push(ServerEvent::Down { server, error });
        }
    }

    /// Drops server `server`'s channel and its queue; true if it was up.
    fn drop_channel(&mut self, server: usize) -> bool {
        let Some(slot) = self.channels.get_mut(server) else { return false };
        if slot.take().is_none() {
            return false;
        }
        self.outgoing[server] = OutBuffer::default();
        self.reconnect[server] = Reconnect::first();
        self.down += 1;
        true
    }

    /// Checks that every server's peer is still there (a fabric channel's control connection
    /// is open) and reports those that are not as down. `poll` does it whenever a wait times
    /// out; a caller that answers from elsewhere without waiting (GET\* from item slots) calls
    /// it itself.
    pub fn check_peers(&mut self) {
        for server in 0..self.channels.len() {
            let Some(channel) = self.channels[server].as_mut() else { continue };
            if let Err(error) = channel.check_peer() {
                self.fail(server, TransportError::channel(server, error));
            }
        }
    }

    /// Connects again to the down servers whose backoff is over.
    fn reconnect_servers(&mut self) {
        if self.down == 0 {
            return;
        }
        let now = Instant::now();
        for server in 0..self.channels.len() {
            if self.channels[server].is_some() || self.reconnect[server].at > now {
                continue;
            }
            match self.medium.connect(server, &self.addresses[server]) {
                Ok(channel) => {
                    self.channels[server] = Some(channel);
                    self.down -= 1;
                    self.events.push(ServerEvent::Up { server });
                }
                Err(_) => self.reconnect[server].failed_again(),
            }
        }
    }

    fn has_unsent(&self) -> bool {
        self.outgoing.iter().any(|out| !out.is_empty())
    }

    /// Delivers every reply that is there now.
    fn receive_all<F>(&mut self, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut delivered = 0;
        for server in 0..self.channels.len() {
            let Some(channel) = self.channels[server].as_mut() else { continue };
            let stream = channel.is_stream();
            let mut failure = None;
            let mut consume = |bytes: &[u8]| {
                let (walked, fault) =
                    walk_frames(bytes, stream, |header, body| match Response::decode(header.kind, body) {
                        Ok(response) => {
                            deliver(server, header.request_id, response);
                            delivered += 1;
                            true
                        }
                        Err(error) => {
                            failure.get_or_insert(TransportError::Malformed { server, error });
                            false
                        }
                    });
                match fault {
                    Some(FrameFault::Invalid { error, .. }) => {
                        failure.get_or_insert(TransportError::Malformed { server, error });
                    }
                    Some(FrameFault::Cut) => {
                        failure.get_or_insert(TransportError::CutFrame { server });
                    }
                    None => {}
                }
                walked
            };
            let received = loop {
                match channel.receive(&mut consume) {
                    Ok(true) => {}
                    Ok(false) => break Ok(()),
                    Err(error) => break Err(TransportError::channel(server, error)),
                }
            };
            if let Some(failure) = received.err().or(failure) {
                self.fail(server, failure);
            }
        }
        Ok(delivered)
    }
}

impl<M: ClientMedium> ClientTransport for Transport<M> {
    fn server_count(&self) -> usize {
        self.channels.len()
    }

    /// Queues the frame, unless it alone exceeds what one message carries: then nothing is
    /// queued and the error says so (the transport stays usable). A request for a server that
    /// is down is discarded (the transactions that need it fail through its
    /// [`ServerEvent::Down`]).
    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let servers = self.channels.len();
        let slot = self.channels.get(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let Some(channel) = slot else { return Ok(()) };
        let message_bytes_max = channel.frame_bytes_max();
        let frames = self.outgoing[server].frames();
        let start = frames.len();
        request.encode_frame(request_id, frames);
        let frame_bytes = frames.len() - start;
        if frame_bytes > message_bytes_max {
            frames.truncate(start);
            return Err(TransportError::MessageTooLarge { server, frame_bytes, message_bytes_max });
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        for server in 0..self.channels.len() {
            let (Some(channel), out) = (self.channels[server].as_mut(), &mut self.outgoing[server]) else { continue };
            if out.is_empty() {
                continue;
            }
            if let Err(error) = out.flush(channel) {
                self.fail(server, TransportError::channel(server, error));
            }
        }
        Ok(())
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut started = None; // read only when a wait is due: a poll that finds replies reads no clock
        self.reconnect_servers();
        let events_before = self.events.len();
        loop {
            if self.has_unsent() {
                self.flush()?; // room may have come back
            }
            let delivered = self.receive_all(&mut deliver)?;
            // A server that went down or came back is news the caller hears of now.
            if delivered > 0 || timeout == Some(Duration::ZERO) || self.events.len() != events_before {
                return Ok(delivered);
            }
            let started = *started.get_or_insert_with(Instant::now);
            let remaining = match timeout.map(|timeout| timeout.saturating_sub(started.elapsed())) {
                Some(remaining) if remaining.is_zero() => return Ok(0),
                remaining => remaining,
            };
            // A fabric medium spins a bounded while before it sleeps, and no `POLL_SPIN_US`
            // spin on top: on this shared 2-core machine the extra spin took CPU from the server
            // poller and cost about 25% of throughput (docs/performance.md).
            // A wait is cut at the next reconnection attempt (no longer than the backoff).
            let remaining = match self.down {
                0 => remaining,
                _ => Some(remaining.map_or(Duration::from_millis(CLIENT_RECONNECT_BACKOFF_MS_MIN), |remaining| {
                    remaining.min(Duration::from_millis(CLIENT_RECONNECT_BACKOFF_MS_MIN))
                })),
            };
            if self.medium.wait(&mut self.channels, remaining).map_err(TransportError::Wait)? {
                self.check_peers();
            }
            self.reconnect_servers();
        }
    }

    fn take_server_events(&mut self, events: &mut Vec<ServerEvent>) {
        events.append(&mut self.events);
    }

    fn reconnect_due(&mut self) {
        self.reconnect_servers();
    }

    fn disconnect(&mut self, server: usize) {
        let Some(mut reconnect) = self.reconnect.get(server).copied() else { return };
        if self.drop_channel(server) {
            // Refused after it connected: wait longer each time, as after a failed connect.
            reconnect.failed_again();
            self.reconnect[server] = reconnect;
        }
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        self.channels.iter().flatten().filter_map(Channel::batch_stats).reduce(|mut total, stats| {
            total.merge(&stats);
            total
        })
    }
}
