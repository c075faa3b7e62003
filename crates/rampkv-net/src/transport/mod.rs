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
//! [`interleave::Interleaving`] decorates any of them with a seeded network model (per-request
//! delays, per-link FIFO), so that servers see the requests of different sessions in different
//! orders, as separate machines do.

pub mod interleave;
pub mod local;
pub mod onesided;

use std::time::{Duration, Instant};

use rampkv_core::wire::{Request, Response, WireError};
use rampkv_fabric::ShmFabric;

use crate::message::fabric::FabricClient;
use crate::message::rfrpc::RfRpc;
use crate::message::ring::Ring;
use crate::message::sendrecv::SendRecv;
use crate::message::tcp::TcpClient;
use crate::message::{walk_frames, BatchStats, Channel, ChannelError, FrameFault, OutBuffer};

/// TCP: one socket per server.
pub type TcpClientTransport = Transport<TcpClient>;
/// GET+/PUT+: message rings written one-sidedly over the (shared-memory) fabric.
pub type WritePollClientTransport = Transport<FabricClient<ShmFabric, Ring>>;
/// Two-sided send/recv emulated over the fabric (posted receive buffers, a completion queue).
pub type SendRecvClientTransport = Transport<FabricClient<ShmFabric, SendRecv>>;
/// Remote-fetch RPC: requests into the server's memory, replies fetched from it.
pub type RfRpcClientTransport = Transport<FabricClient<ShmFabric, RfRpc>>;
/// GET\*/PUT+ over the (shared-memory) fabric.
pub type OneSidedClientTransport = onesided::GetStarTransport<ShmFabric>;

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

    /// Batching counters, for a transport whose medium batches frames into calls (RF-RPC).
    fn batch_stats(&self) -> Option<BatchStats> {
        None
    }

    /// The interleaving model's counters, for a transport behind one.
    fn interleave_stats(&self) -> Option<interleave::InterleaveStats> {
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
    /// readable or writable. Returns true if it timed out.
    fn wait(&mut self, channels: &mut [Self::Channel], timeout: Option<Duration>) -> Result<bool, ChannelError>;
}

/// A medium a client sets up on its own (TCP with its own poller, a fabric with its own region).
pub trait OpenMedium: ClientMedium {
    /// The client's side for `servers` servers (a fabric client registers its region).
    fn open(servers: usize) -> Result<Self, ChannelError>;
}

/// The client transport over any medium: per server a channel and the frames queued for it.
#[derive(Debug)]
pub struct Transport<M: ClientMedium> {
    medium: M,
    channels: Vec<M::Channel>,
    outgoing: Vec<OutBuffer>,
}

impl<M: OpenMedium> Transport<M> {
    /// Connects to every address (server i is `addresses[i]`: its TCP address, or its front
    /// end's control address for a fabric medium).
    pub fn connect(addresses: &[String]) -> Result<Self, TransportError> {
        Self::with_medium(M::open(addresses.len()).map_err(TransportError::Open)?, addresses)
    }
}

impl<M: ClientMedium> Transport<M> {
    /// Connects to every address over `medium`.
    pub fn with_medium(mut medium: M, addresses: &[String]) -> Result<Self, TransportError> {
        let mut channels = Vec::with_capacity(addresses.len());
        for (server, address) in addresses.iter().enumerate() {
            let connected = medium.connect(server, address);
            channels.push(connected.map_err(|error| TransportError::Connect {
                server,
                address: address.clone(),
                error,
            })?);
        }
        let outgoing = addresses.iter().map(|_| OutBuffer::default()).collect();
        Ok(Self { medium, channels, outgoing })
    }

    /// The medium (e.g. the fabric a fabric client maps with).
    pub fn medium(&self) -> &M {
        &self.medium
    }

    /// Server `server`'s channel (its statistics, its test hooks).
    pub fn channel(&self, server: usize) -> Option<&M::Channel> {
        self.channels.get(server)
    }

    /// Server `server`'s channel, mutable (fault-injection hooks).
    pub fn channel_mut(&mut self, server: usize) -> Option<&mut M::Channel> {
        self.channels.get_mut(server)
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
        for (server, channel) in self.channels.iter_mut().enumerate() {
            let mut failure = None;
            let mut consume = |bytes: &[u8]| {
                let (walked, fault) =
                    walk_frames(bytes, M::Channel::STREAM, |header, body| match Response::decode(header.kind, body) {
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
            loop {
                let more = channel.receive(&mut consume).map_err(|error| TransportError::channel(server, error))?;
                if !more {
                    break;
                }
            }
            if let Some(failure) = failure {
                return Err(failure);
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
    /// queued and the error says so (the transport stays usable).
    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let servers = self.channels.len();
        let channel = self.channels.get(server).ok_or(TransportError::NoSuchServer { server, servers })?;
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
        for (server, (channel, out)) in self.channels.iter_mut().zip(&mut self.outgoing).enumerate() {
            if !out.is_empty() {
                out.flush(channel).map_err(|error| TransportError::channel(server, error))?;
            }
        }
        Ok(())
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut started = None; // read only when a wait is due: a poll that finds replies reads no clock
        loop {
            if self.has_unsent() {
                self.flush()?; // room may have come back
            }
            let delivered = self.receive_all(&mut deliver)?;
            if delivered > 0 || timeout == Some(Duration::ZERO) {
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
            if self.medium.wait(&mut self.channels, remaining).map_err(|error| TransportError::channel(0, error))? {
                for (server, channel) in self.channels.iter_mut().enumerate() {
                    channel.check_peer().map_err(|error| TransportError::channel(server, error))?;
                }
            }
        }
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        self.channels.iter().filter_map(Channel::batch_stats).reduce(|mut total, stats| {
            total.merge(&stats);
            total
        })
    }
}
