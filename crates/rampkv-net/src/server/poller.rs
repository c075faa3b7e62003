//! The server front end, written once over the message layer: one poller thread serves every
//! connection of every server of a group over one medium. The TCP front end blocks in epoll,
//! a fabric front end sleeps on its region's doorbell: the same code, with a different
//! [`ServerMedium`].
//!
//! Each pass the poller takes what its medium reports (new and closed connections, readiness),
//! serves the connections that may have work (each frame decoded, handed to the server core,
//! its effects applied and its reply encoded into the connection's output, which goes out in as
//! few sends as the medium takes, or held behind its server's log; a connection to a server with
//! a log sends once, at the end of the pass, with the replies released then), has the logs write what the
//! pass appended (`Servers::flush_logs`: one write per log and pass), then delivers deferred
//! replies: those held behind a log that is now durable, those its own serving produced, those
//! other front ends routed to its inbox, and the aborts of lock waits past their deadline. When
//! a pass served nothing, it waits (bounded: `WRITEPOLL_SLEEP_MS_MAX`, or the next lock
//! deadline).
//!
//! # Fault model for bad input
//! - A stream frame whose header is invalid gets an error reply and the connection closes
//!   after it (the stream cannot be resynchronised); on a message medium anything no correct
//!   client writes (a corrupt ring, a message that ends inside a frame) closes the connection.
//! - A frame whose header is valid but whose body does not decode gets an error reply and the
//!   connection goes on.
//! - A reply larger than the medium carries is replaced by an error reply.
//! - A client that does not read its replies stops being read once
//!   `CONNECTION_WRITE_BUFFER_BYTES_MAX` of replies wait for it (back-pressure).
//!
//! # Budgets and timeouts ([`ConnectionLimits`])
//! Every connection's memory is counted: what its channel holds of its input
//! ([`Channel::buffered_bytes`]) and its unsent replies. A connection over its budget
//! (`CONNECTION_BUFFERED_BYTES_MAX`) is closed; when all connections together pass the front
//! end's budget (`SERVER_BUFFERED_BYTES_MAX`), the one holding the most is closed until the
//! total is back under it. Every `CONNECTION_TIMEOUT_SCAN_INTERVAL_MS` the poller closes the
//! connections whose unsent replies made no progress for the slow-reader timeout, those with a
//! partial frame and no frame completed for the frame timeout, and (if set) those that sent no
//! request for the idle timeout. Each close is logged (`log::warn!`) with its reason and the
//! peer's address, and counted ([`ConnectionCounts`]).
//!
//! None of these changes the store; other connections are served throughout. A closed
//! connection's S2PL locks are released.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rampkv_core::limits::{
    CONNECTION_BUFFERED_BYTES_MAX, CONNECTION_FRAME_TIMEOUT_MS, CONNECTION_HANDSHAKE_TIMEOUT_MS,
    CONNECTION_IDLE_TIMEOUT_MS_DEFAULT, CONNECTION_SLOW_READER_TIMEOUT_MS, CONNECTION_TIMEOUT_SCAN_INTERVAL_MS,
    CONNECTION_WRITE_BUFFER_BYTES_MAX, SERVER_BUFFERED_BYTES_MAX, SERVER_CONNECTIONS_MAX,
    SERVER_CONNECTIONS_PER_ADDRESS_MAX, WRITEPOLL_MESSAGES_PER_PASS_MAX, WRITEPOLL_SLEEP_MS_MAX,
};
use rampkv_core::protocol::server::{Addressed, Effects, LogPosition, Now, Reply};
use rampkv_core::protocol::ConnectionId;
use rampkv_core::wire::{AuthFrame, FrameHeader, Request, Response};

pub use super::connections::{ConnectionCounts, ConnectionStats, Eviction};
use super::router::Inbox;
use super::servers::{Served, Servers};
use crate::auth::{AuthStep, ServerAuth};
use crate::message::{walk_frames, Channel, ChannelError, FrameFault, FrontEvent, OutBuffer, ServerMedium};

/// The bounds a front end holds its connections to (module docs). The defaults are the
/// constants of `limits.rs`; tests shorten the timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once (the TCP front end refuses more).
    pub connections_max: usize,
    /// Most connections open at once from one source address (TCP).
    pub connections_per_address_max: usize,
    /// Most bytes one connection may hold (input and unsent replies).
    pub connection_buffered_bytes_max: usize,
    /// Most bytes all connections of the front end may hold together.
    pub server_buffered_bytes_max: usize,
    /// Close a connection that sent no request for this long (0: never).
    pub idle_timeout_ms: u64,
    /// Close a connection whose unsent replies made no progress for this long.
    pub slow_reader_timeout_ms: u64,
    /// Close a connection with a partial frame and no frame completed for this long.
    pub frame_timeout_ms: u64,
    /// Close a connection that has not authenticated (with a secret) or sent a complete frame
    /// (without one) this long after it opened.
    pub handshake_timeout_ms: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            connections_max: SERVER_CONNECTIONS_MAX,
            connections_per_address_max: SERVER_CONNECTIONS_PER_ADDRESS_MAX,
            connection_buffered_bytes_max: CONNECTION_BUFFERED_BYTES_MAX,
            server_buffered_bytes_max: SERVER_BUFFERED_BYTES_MAX,
            idle_timeout_ms: CONNECTION_IDLE_TIMEOUT_MS_DEFAULT,
            slow_reader_timeout_ms: CONNECTION_SLOW_READER_TIMEOUT_MS,
            frame_timeout_ms: CONNECTION_FRAME_TIMEOUT_MS,
            handshake_timeout_ms: CONNECTION_HANDSHAKE_TIMEOUT_MS,
        }
    }
}

/// A reply held behind the log.
#[derive(Debug)]
enum Held {
    /// The encoded reply frames of one of this front end's connections.
    Frames(ConnectionId, Vec<u8>),
    /// A deferred reply the same call produced (an S2PL grant: it may read what the call wrote),
    /// routed once durable.
    Routed(Addressed),
}

/// Replies held until their server's log is durable up to their position (see
/// `protocol::server` and `server::durable`), one queue per server of the group. A poller
/// appends to a server's log in order, so each queue's positions never go down.
#[derive(Debug, Default)]
struct ReplyGate {
    held: Vec<VecDeque<(LogPosition, Held)>>,
}

impl ReplyGate {
    fn queue(&mut self, server: usize) -> &mut VecDeque<(LogPosition, Held)> {
        if self.held.len() <= server {
            self.held.resize_with(server + 1, VecDeque::new);
        }
        let queue = &mut self.held[server];
        debug_assert!(queue.iter().zip(queue.iter().skip(1)).all(|(a, b)| a.0 <= b.0), "positions only grow");
        queue
    }

    /// A buffer for the reply frames of `connection` of `server` that wait for `position`.
    fn hold(&mut self, server: usize, position: LogPosition, connection: ConnectionId) -> &mut Vec<u8> {
        let queue = self.queue(server);
        queue.push_back((position, Held::Frames(connection, Vec::new())));
        match &mut queue.back_mut().expect("just pushed").1 {
            Held::Frames(_, frames) => frames,
            Held::Routed(_) => unreachable!("just pushed frames"),
        }
    }

    /// Holds a deferred reply of a call on `server` until `position` is durable.
    fn hold_routed(&mut self, server: usize, position: LogPosition, reply: Addressed) {
        self.queue(server).push_back((position, Held::Routed(reply)));
    }

    /// Whether any reply is held.
    fn is_holding(&self) -> bool {
        self.held.iter().any(|queue| !queue.is_empty())
    }

    /// Whether a held reply may go (`durable`: a server's durable position).
    fn releasable(&self, durable: impl Fn(usize) -> LogPosition) -> bool {
        self.held.iter().enumerate().any(|(server, queue)| queue.front().is_some_and(|(at, _)| *at <= durable(server)))
    }

    /// Hands every reply whose position is durable to `release`, in order per server.
    fn release(&mut self, durable: impl Fn(usize) -> LogPosition, mut release: impl FnMut(Held)) {
        for (server, queue) in self.held.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            let durable = durable(server);
            while queue.front().is_some_and(|(position, _)| *position <= durable) {
                release(queue.pop_front().expect("checked").1);
            }
        }
    }
}

struct Connection<C> {
    channel: C,
    server: usize,
    id: ConnectionId,
    out: OutBuffer,
    /// The peer finished, or sent what cannot be answered: close once replies are sent.
    closing: bool,
    /// The authentication step, until it accepts (None: authenticated, or no secret).
    auth: Option<ServerAuth>,
    peer: Option<SocketAddr>,
    /// Bytes it held when last counted (input and unsent replies).
    held_bytes: usize,
    /// Frames received over its life.
    frames_received: u64,
    /// The timeout scan's view: frames received and bytes sent at the last scan, and since when
    /// (monotonic ms) each has not moved.
    seen_frames: u64,
    request_seen_ms: u64,
    seen_sent: u64,
    output_moved_ms: u64,
    /// When it opened (monotonic ms), for the handshake timeout.
    opened_ms: u64,
}

impl<C: Channel> Connection<C> {
    fn new(channel: C, server: usize, id: ConnectionId, now_ms: u64, auth: Option<ServerAuth>) -> Self {
        Self {
            peer: channel.peer_address(),
            channel,
            server,
            id,
            out: OutBuffer::default(),
            closing: false,
            auth,
            held_bytes: 0,
            frames_received: 0,
            seen_frames: 0,
            request_seen_ms: now_ms,
            seen_sent: 0,
            output_moved_ms: now_ms,
            opened_ms: now_ms,
        }
    }

    /// Why the timeout scan at `now_ms` closes this connection, if it does.
    fn timed_out(&mut self, now_ms: u64, limits: &ConnectionLimits) -> Option<Eviction> {
        if self.frames_received != self.seen_frames {
            self.seen_frames = self.frames_received;
            self.request_seen_ms = now_ms;
        }
        if self.out.is_empty() || self.out.sent_total() != self.seen_sent {
            self.seen_sent = self.out.sent_total();
            self.output_moved_ms = now_ms;
        }
        let quiet_ms = now_ms.saturating_sub(self.request_seen_ms);
        let stalled_ms = now_ms.saturating_sub(self.output_moved_ms);
        let open_ms = now_ms.saturating_sub(self.opened_ms);
        // Still authenticating, or (without a secret) not one frame yet: a connection that holds
        // a slot without saying anything.
        let handshaking = self.auth.is_some() || self.frames_received == 0;
        if handshaking && open_ms >= limits.handshake_timeout_ms {
            return Some(Eviction::Handshake { open_ms, timeout_ms: limits.handshake_timeout_ms });
        }
        if stalled_ms >= limits.slow_reader_timeout_ms {
            let timeout_ms = limits.slow_reader_timeout_ms;
            return Some(Eviction::SlowReader { unsent_bytes: self.out.len(), quiet_ms: stalled_ms, timeout_ms });
        }
        if self.channel.partial_frame() && quiet_ms >= limits.frame_timeout_ms {
            let (held_bytes, timeout_ms) = (self.channel.buffered_bytes(), limits.frame_timeout_ms);
            return Some(Eviction::FrameTimeout { held_bytes, quiet_ms, timeout_ms });
        }
        let idle = limits.idle_timeout_ms > 0 && self.out.is_empty() && !self.channel.partial_frame();
        (idle && quiet_ms >= limits.idle_timeout_ms)
            .then_some(Eviction::Idle { quiet_ms, timeout_ms: limits.idle_timeout_ms })
    }
}

impl<C: Channel> Connection<C> {
    /// Whether a wait should end for this connection.
    fn wants_service(&self) -> bool {
        match self.out.len() > CONNECTION_WRITE_BUFFER_BYTES_MAX {
            true => self.channel.writable(),
            false => self.channel.readable() || (!self.out.is_empty() && self.channel.writable()),
        }
    }
}

/// How a connection left a pass.
enum Outcome {
    /// Messages served, and whether work is left (it is visited again next pass).
    Served {
        messages: usize,
        more: bool,
    },
    Close,
}

/// One front end's poller. See the module docs.
pub struct Poller<M: ServerMedium> {
    medium: M,
    servers: Arc<Servers>,
    front: u32,
    inbox: Arc<Inbox>,
    connections: Vec<Option<Connection<M::Channel>>>,
    generation: u32,
    effects: Effects,
    /// Deferred replies to route (allocated once).
    routed: Vec<Addressed>,
    gate: ReplyGate,
    /// Slots to send once each at the end of the pass: their held replies were released, or
    /// (a server with a log) their replies wait to go out with the pass's released ones.
    released: Vec<usize>,
    events: Vec<FrontEvent<M::Channel>>,
    /// Slots with work left from the last pass.
    again: Vec<usize>,
    visit: Vec<usize>,
    stop: Arc<AtomicBool>,
    limits: ConnectionLimits,
    /// Bytes all connections hold, as last counted.
    held_total: usize,
    /// Connections to close at the end of the pass, and why.
    evictions: Vec<(ConnectionId, Eviction)>,
    next_timeout_scan_ms: u64,
}

impl<M: ServerMedium> Poller<M> {
    /// A poller over `medium` for `servers`, registered with their router; stops once `stop`
    /// is set (and its waker woken).
    pub fn new(medium: M, servers: Arc<Servers>, stop: Arc<AtomicBool>, limits: ConnectionLimits) -> Self {
        let (front, inbox) = servers.router().register(medium.waker());
        Self {
            medium,
            servers,
            front,
            inbox,
            connections: Vec::new(),
            generation: 0,
            effects: Effects::default(),
            routed: Vec::new(),
            gate: ReplyGate::default(),
            released: Vec::new(),
            events: Vec::new(),
            again: Vec::new(),
            visit: Vec::new(),
            stop,
            limits,
            held_total: 0,
            evictions: Vec::new(),
            next_timeout_scan_ms: 0,
        }
    }

    /// Serves until stopped; then closes every connection.
    pub fn run(mut self) -> std::io::Result<()> {
        let mut progress = false;
        let outcome = loop {
            if self.stop.load(Ordering::Acquire) {
                break Ok(());
            }
            let timeout = if progress { Duration::ZERO } else { self.sleep_timeout() };
            let (connections, inbox, stop) = (&self.connections, &self.inbox, &self.stop);
            let (gate, servers) = (&self.gate, &self.servers);
            let ready = || {
                stop.load(Ordering::Relaxed)
                    || inbox.pending()
                    || connections.iter().flatten().any(Connection::wants_service)
                    || gate.releasable(|server| servers.durable_position(server))
            };
            if let Err(error) = self.medium.wait(timeout, ready, &mut self.events) {
                break Err(error);
            }
            let now = self.servers.now();
            let mut served = self.take_events(now.monotonic_ms);
            for index in 0..self.visit.len() {
                served += self.serve(self.visit[index], now);
            }
            // One write per log for the whole pass; with `everysec` and `no` the replies it held
            // go out below, in this pass (with `always`, once the log's syncer fsynced them).
            self.servers.flush_logs(Some(self.front));
            served += self.deliver_deferred(now.monotonic_ms);
            if now.monotonic_ms >= self.next_timeout_scan_ms {
                self.next_timeout_scan_ms = now.monotonic_ms + CONNECTION_TIMEOUT_SCAN_INTERVAL_MS;
                self.scan_timeouts(now.monotonic_ms);
                for served in self.servers.served() {
                    served.tick(now); // the background GC sweep (bounded), expiry's too
                }
            }
            served += self.enforce_budgets();
            // Held replies: ask the logs for a wake-up, then look once more (one that moved
            // before the request would not wake this poller).
            let holding = self.gate.is_holding();
            self.inbox.set_holding(holding);
            let servers = &self.servers;
            progress = served > 0 || (holding && self.gate.releasable(|server| servers.durable_position(server)));
        };
        for slot in 0..self.connections.len() {
            self.close(slot, true);
        }
        self.servers.router().unregister(self.front);
        outcome
    }

    /// How long to wait when idle: until the next lock deadline, at most `WRITEPOLL_SLEEP_MS_MAX`.
    fn sleep_timeout(&self) -> Duration {
        let now_ms = self.servers.now_ms();
        let deadline = self.servers.cores().iter().filter_map(|core| core.next_lock_deadline_ms()).min();
        let slice = Duration::from_millis(WRITEPOLL_SLEEP_MS_MAX);
        deadline.map_or(slice, |deadline| slice.min(Duration::from_millis(deadline.saturating_sub(now_ms) + 1)))
    }

    /// Applies the medium's events; fills the slots to visit. Returns connections opened or
    /// closed (progress).
    fn take_events(&mut self, now_ms: u64) -> usize {
        self.visit.clear();
        self.visit.append(&mut self.again);
        let mut events = std::mem::take(&mut self.events);
        let mut changed = 0;
        for event in events.drain(..) {
            match event {
                FrontEvent::Open { slot, server, channel } => {
                    if self.connections.len() <= slot {
                        self.connections.resize_with(slot + 1, || None);
                    }
                    debug_assert!(self.connections[slot].is_none(), "a slot is handed out once");
                    self.generation = self.generation.wrapping_add(1);
                    let id = ConnectionId { front: self.front, generation: self.generation, slot: slot as u32 };
                    let auth = match M::AUTHENTICATES {
                        true => None,
                        false => self.servers.secret().map(|secret| ServerAuth::new(Arc::clone(secret))),
                    };
                    self.connections[slot] = Some(Connection::new(channel, server, id, now_ms, auth));
                    self.visit.push(slot);
                    changed += 1;
                }
                FrontEvent::Closed { slot } => {
                    self.close(slot, false);
                    self.medium.release(slot);
                    changed += 1;
                }
                FrontEvent::Ready { slot, readable, writable, finished } => {
                    if let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) {
                        connection.channel.set_ready(readable, writable, finished);
                        self.visit.push(slot);
                    }
                }
                FrontEvent::AllReady => {
                    let open = self.connections.iter().enumerate().filter(|(_, slot)| slot.is_some());
                    self.visit.extend(open.map(|(slot, _)| slot));
                }
            }
        }
        self.events = events;
        self.visit.sort_unstable();
        self.visit.dedup();
        changed
    }

    /// Serves one connection; returns the messages it served (a closed one counts one).
    fn serve(&mut self, slot: usize, now: Now) -> usize {
        let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { return 0 };
        let served = &self.servers.served()[connection.server];
        // A server with a log holds its write replies until the pass's records are written:
        // this connection's other replies wait for them and all go out in one send at the end
        // of the pass (`deliver_deferred`), not one send now and one then.
        let defer_send = served.records_kept();
        let outcome =
            serve_connection(connection, served, now, &mut self.effects, &mut self.routed, &mut self.gate, defer_send);
        if defer_send && !connection.out.is_empty() {
            self.released.push(slot);
        }
        let messages = match outcome {
            Ok(Outcome::Served { messages, more }) => {
                if more {
                    self.again.push(slot);
                }
                messages
            }
            Ok(Outcome::Close) | Err(_) => {
                self.close(slot, true);
                1
            }
        };
        self.account(slot);
        self.route();
        messages
    }

    /// Counts what the connection in `slot` holds now; one over its budget is closed at the end
    /// of the pass.
    fn account(&mut self, slot: usize) {
        let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { return };
        let held_bytes = connection.channel.buffered_bytes() + connection.out.len();
        if held_bytes == connection.held_bytes {
            return;
        }
        self.servers.connection_stats().held_changed(connection.held_bytes, held_bytes);
        self.held_total = self.held_total - connection.held_bytes + held_bytes;
        connection.held_bytes = held_bytes;
        let max_bytes = self.limits.connection_buffered_bytes_max;
        if held_bytes > max_bytes {
            self.evictions.push((connection.id, Eviction::ConnectionBudget { held_bytes, max_bytes }));
        }
    }

    /// Closes the connections past a timeout (see the module docs).
    fn scan_timeouts(&mut self, now_ms: u64) {
        for connection in self.connections.iter_mut().flatten() {
            if let Some(eviction) = connection.timed_out(now_ms, &self.limits) {
                self.evictions.push((connection.id, eviction));
            }
        }
    }

    /// Closes the connections found over a budget or past a timeout, then, while all together
    /// hold more than the front end's budget, the one that holds the most. Returns how many.
    fn enforce_budgets(&mut self) -> usize {
        let mut closed = 0;
        let mut evictions = std::mem::take(&mut self.evictions);
        for (id, eviction) in evictions.drain(..) {
            closed += self.evict(id, eviction);
        }
        self.evictions = evictions;
        let max_bytes = self.limits.server_buffered_bytes_max;
        while self.held_total > max_bytes {
            // Among equals, the one that sent the fewest frames (a prefix that never completes).
            let largest = self
                .connections
                .iter()
                .flatten()
                .max_by_key(|connection| (connection.held_bytes, std::cmp::Reverse(connection.frames_received)));
            let Some(connection) = largest else { break };
            let (id, held_bytes, total_bytes) = (connection.id, connection.held_bytes, self.held_total);
            closed += self.evict(id, Eviction::ServerBudget { held_bytes, total_bytes, max_bytes });
        }
        closed
    }

    /// Closes connection `id` (if still open) for `eviction`, logged with its peer's address.
    fn evict(&mut self, id: ConnectionId, eviction: Eviction) -> usize {
        let slot = id.slot as usize;
        let Some(connection) = self.connections.get(slot).and_then(Option::as_ref) else { return 0 };
        if connection.id != id {
            return 0;
        }
        let peer = connection.peer.map_or_else(|| "a fabric peer".to_string(), |peer| peer.to_string());
        log::warn!("closing the connection from {peer} to server {}: {eviction}", connection.server);
        self.servers.connection_stats().count(&eviction);
        self.close(slot, true);
        1
    }

    /// Drops the connection in `slot` (if open): its locks are released (the replies this
    /// unblocks are routed) and, if the poller closes it, the peer is told.
    fn close(&mut self, slot: usize, tell_peer: bool) {
        let Some(connection) = self.connections.get_mut(slot).and_then(Option::take) else { return };
        self.held_total -= connection.held_bytes;
        self.servers.connection_stats().held_changed(connection.held_bytes, 0);
        let core = &self.servers.served()[connection.server].core;
        core.connection_closed(connection.id, &mut self.effects);
        self.routed.append(&mut self.effects.replies);
        if tell_peer {
            self.medium.close(slot, connection.channel);
        }
    }

    /// Expires lock waits, takes the inbox, releases held replies, and delivers the deferred
    /// replies. Returns how many it delivered here.
    fn deliver_deferred(&mut self, now_ms: u64) -> usize {
        for core in self.servers.cores() {
            if core.next_lock_deadline_ms().is_some_and(|deadline| deadline <= now_ms) {
                core.expire_lock_waits(now_ms, &mut self.effects);
                self.routed.append(&mut self.effects.replies);
            }
        }
        self.inbox.take(&mut self.routed);
        let mut delivered = 0;
        let (connections, servers, routed) = (&mut self.connections, &self.servers, &mut self.routed);
        let released = &mut self.released;
        self.gate.release(
            |server| servers.durable_position(server),
            |held| match held {
                Held::Frames(id, frames) => {
                    if let Some(connection) = own_connection(connections, id) {
                        connection.out.frames().extend_from_slice(&frames);
                        released.push(id.slot as usize);
                        delivered += 1;
                    }
                }
                Held::Routed(reply) => routed.push(reply),
            },
        );
        // One send per connection for all its released replies (a connection carries many
        // clients' requests: one send per reply would multiply the sends).
        let mut released = std::mem::take(&mut self.released);
        released.sort_unstable();
        released.dedup();
        for slot in released.drain(..) {
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { continue };
            if connection.out.flush(&mut connection.channel).is_err() {
                connection.closing = true;
                self.again.push(slot); // the next pass finds the broken channel and closes it
            }
            self.account(slot);
        }
        self.released = released;
        delivered + self.route()
    }

    /// Delivers the routed replies: this front end's into their connections, others' to the
    /// router. Returns how many were delivered here.
    fn route(&mut self) -> usize {
        let mut delivered = 0;
        let mut routed = std::mem::take(&mut self.routed);
        for Addressed { connection: id, request_id, reply } in routed.drain(..) {
            if id.front != self.front {
                self.servers.router().route(Addressed { connection: id, request_id, reply });
                continue;
            }
            let Some(connection) = own_connection(&mut self.connections, id) else { continue };
            let served = &self.servers.served()[connection.server];
            let frame_max = connection.channel.frame_bytes_max();
            encode_reply(served, &reply, request_id, connection.out.frames(), frame_max);
            if connection.out.flush(&mut connection.channel).is_err() {
                connection.closing = true;
                self.again.push(id.slot as usize); // the next pass finds the broken channel and closes it
            }
            self.account(id.slot as usize);
            delivered += 1;
        }
        self.routed = routed;
        delivered
    }
}

/// This front end's open connection `id` (none if it closed: nobody to tell).
fn own_connection<C>(connections: &mut [Option<Connection<C>>], id: ConnectionId) -> Option<&mut Connection<C>> {
    let connection = connections.get_mut(id.slot as usize)?.as_mut()?;
    (connection.id == id && !connection.closing).then_some(connection)
}

/// Sends what is queued, then takes up to `WRITEPOLL_MESSAGES_PER_PASS_MAX` received messages
/// while the reply backlog is under its bound, answering every frame; sends the replies after
/// each message unless `defer_send` (the caller sends them at the end of its pass).
fn serve_connection<C: Channel>(
    connection: &mut Connection<C>,
    served: &Served,
    now: Now,
    effects: &mut Effects,
    routed: &mut Vec<Addressed>,
    gate: &mut ReplyGate,
    defer_send: bool,
) -> Result<Outcome, ChannelError> {
    connection.out.flush(&mut connection.channel)?;
    let mut messages = 0;
    while !connection.closing
        && connection.out.len() <= CONNECTION_WRITE_BUFFER_BYTES_MAX
        && messages < WRITEPOLL_MESSAGES_PER_PASS_MAX
        && connection.channel.readable()
    {
        let Connection { channel, id, out, auth, closing, frames_received, server, .. } = connection;
        let frame_max = channel.frame_bytes_max();
        let mut fault = None;
        let received = channel.receive(|bytes| {
            let (walked, walk_fault) = walk_frames(bytes, C::STREAM, |header, body| {
                if !authenticate_frame(auth, header, body, out) {
                    *closing = true; // refused: nothing after this frame is read
                    return false;
                }
                if auth.is_none() && !AuthFrame::is_auth_kind(header.kind) {
                    *frames_received += 1;
                    let at = Address { server: *server, connection: *id };
                    serve_frame(served, at, header, body, now, effects, frame_max, out, gate);
                    routed.append(&mut effects.replies);
                }
                out.len() <= CONNECTION_WRITE_BUFFER_BYTES_MAX
            });
            fault = fault.take().or(walk_fault);
            walked
        });
        let more = match received {
            Ok(more) => more,
            Err(ChannelError::Closed) if C::STREAM => {
                connection.closing = true;
                false
            }
            Err(error) => return Err(error),
        };
        match fault {
            Some(FrameFault::Invalid { error, request_id }) if C::STREAM => {
                let reply = Response::bad_request(format!("invalid frame header: {error}; closing the connection"));
                reply.encode_frame(request_id, connection.out.frames());
                connection.closing = true;
            }
            Some(_) => return Ok(Outcome::Close), // a message medium: the peer is broken
            None => {}
        }
        // Deferred, the replies still go out here once they fill half the bound (the loop
        // stops reading past it, and nothing but this send would make room).
        if !defer_send || connection.out.len() > CONNECTION_WRITE_BUFFER_BYTES_MAX / 2 {
            connection.out.flush(&mut connection.channel)?;
        }
        if !more {
            break;
        }
        messages += 1;
    }
    if connection.closing && connection.out.is_empty() {
        return Ok(Outcome::Close);
    }
    let more = !connection.closing
        && connection.out.len() <= CONNECTION_WRITE_BUFFER_BYTES_MAX
        && connection.channel.readable();
    Ok(Outcome::Served { messages, more })
}

/// The authentication step's share of one frame: while `auth` waits, the frame is its business
/// (a reply, acceptance, or a refusal); once authenticated, an authentication frame gets an
/// error reply. Returns false if the connection is refused (an ERROR reply is queued).
fn authenticate_frame(auth: &mut Option<ServerAuth>, header: FrameHeader, body: &[u8], out: &mut OutBuffer) -> bool {
    let Some(state) = auth else {
        if AuthFrame::is_auth_kind(header.kind) {
            let message = "no authentication step on this connection: it is authenticated, or the server has no \
                           shared secret";
            Response::bad_request(message).encode_frame(header.request_id, out.frames());
        }
        return true;
    };
    match state.on_frame(header.kind, body) {
        AuthStep::Reply(frame) => frame.encode_frame(header.request_id, out.frames()),
        AuthStep::Accepted(frame) => {
            frame.encode_frame(header.request_id, out.frames());
            *auth = None;
        }
        AuthStep::Deny(message) => Response::bad_request(message).encode_frame(header.request_id, out.frames()),
        AuthStep::Refuse(message) => {
            Response::bad_request(message).encode_frame(header.request_id, out.frames());
            return false;
        }
    }
    true
}

/// Where a request came from: its server (index in the group) and connection.
#[derive(Debug, Clone, Copy)]
struct Address {
    server: usize,
    connection: ConnectionId,
}

/// Serves one request frame: decodes it, hands it to the core (which applies its effects to
/// the item slots and the log), and encodes its reply into `out`, or holds it, and the deferred
/// replies of the call, behind the log barrier the effects name.
fn serve_frame(
    served: &Served,
    at: Address,
    header: FrameHeader,
    body: &[u8],
    now: Now,
    effects: &mut Effects,
    frame_max: usize,
    out: &mut OutBuffer,
    gate: &mut ReplyGate,
) {
    let reply = match Request::decode(header.kind, body) {
        Ok(request) => served.serve(at.connection, request, header.request_id, now, effects),
        Err(error) => Some(Reply::Response(Response::bad_request(format!("malformed request: {error}")))),
    };
    if let Some(position) = effects.release_after {
        for deferred in effects.replies.drain(..) {
            gate.hold_routed(at.server, position, deferred);
        }
    }
    let Some(reply) = reply else { return }; // it waits for a lock
    let frames = match effects.release_after {
        Some(position) => gate.hold(at.server, position, at.connection),
        None => out.frames(),
    };
    encode_reply(served, &reply, header.request_id, frames, frame_max);
}

/// Encodes `reply` into `frames`; a frame larger than `frame_max` (what one message of the
/// medium carries) is replaced by an error reply, so that every queued frame can be sent.
pub(crate) fn encode_reply(served: &Served, reply: &Reply, request_id: u64, frames: &mut Vec<u8>, frame_max: usize) {
    let start = frames.len();
    reply.encode_frame(request_id, frames, |key| served.locate(key));
    let frame_bytes = frames.len() - start;
    if frame_bytes > frame_max {
        frames.truncate(start);
        let message = format!("reply of {frame_bytes} bytes exceeds the message maximum of {frame_max} bytes");
        Response::bad_request(message).encode_frame(request_id, frames);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_gate_releases_replies_in_order_once_their_servers_position_is_durable() {
        let mut gate = ReplyGate::default();
        let connection = |slot| ConnectionId { slot, ..ConnectionId::default() };
        gate.hold(0, LogPosition(5), connection(1)).extend_from_slice(b"first");
        gate.hold(0, LogPosition(9), connection(2)).extend_from_slice(b"second");
        let grant = Addressed { connection: connection(3), request_id: 7, reply: Reply::Response(Response::Ack) };
        gate.hold_routed(1, LogPosition(2), grant);
        let mut released = Vec::new();
        let mut take = |held: Held| match held {
            Held::Frames(id, frames) => released.push((id.slot, frames)),
            Held::Routed(reply) => released.push((reply.connection.slot, b"routed".to_vec())),
        };
        // Each server's log has its own positions: server 1 is durable up to 1 only.
        let durable = |first: u64, second: u64| move |server| LogPosition(if server == 0 { first } else { second });
        assert!(!gate.releasable(durable(4, 1)));
        gate.release(durable(4, 1), &mut take);
        assert!(gate.releasable(durable(7, 1)));
        gate.release(durable(7, 1), &mut take);
        gate.release(durable(7, 2), &mut take);
        gate.release(durable(u64::MAX, 2), &mut take);
        assert_eq!(released, vec![(1, b"first".to_vec()), (3, b"routed".to_vec()), (2, b"second".to_vec())]);
        assert!(gate.held.iter().all(VecDeque::is_empty));
    }
}
