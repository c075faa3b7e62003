//! [`Transport`]: the one client transport over the message layer, written once over any
//! [`ClientMedium`]: per server a channel (while it is up) and the frames queued for it,
//! reconnection with a backoff (see the `transport` module docs, "A server that fails").

use std::time::{Duration, Instant};

use rampkv_core::limits::{CLIENT_RECONNECT_BACKOFF_MS_MAX, CLIENT_RECONNECT_BACKOFF_MS_MIN};
use rampkv_core::wire::{Request, Response};

use super::client::{ClientTransport, ServerEvent};
use super::error::TransportError;
use crate::message::fabric::{FabricClient, FabricHandle, FabricKind};
use crate::message::fallback::Fallback;
use crate::message::{walk_frames, BatchStats, Channel, ClientMedium, FrameFault, OpenMedium, OutBuffer};

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
