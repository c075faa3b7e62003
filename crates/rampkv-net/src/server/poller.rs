//! The server front end, written once over the message layer: one poller thread serves every
//! connection of every server of a group over one medium. The TCP front end blocks in epoll,
//! a fabric front end sleeps on its region's doorbell: the same code, with a different
//! [`ServerMedium`].
//!
//! Each pass the poller takes what its medium reports (new and closed connections, readiness),
//! serves the connections that may have work (each frame decoded, handed to the server core,
//! its effects applied and its reply encoded into the connection's output, which goes out in as
//! few sends as the medium takes), then delivers deferred replies: those its own serving
//! produced, those other front ends routed to its inbox, and the aborts of lock waits past their
//! deadline. When a pass served nothing, it waits (bounded: `WRITEPOLL_SLEEP_MS_MAX`, or the
//! next lock deadline).
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
//! None of these changes the store; other connections are served throughout. A closed
//! connection's S2PL locks are released.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rampkv_core::limits::{CONNECTION_WRITE_BUFFER_BYTES_MAX, WRITEPOLL_MESSAGES_PER_PASS_MAX, WRITEPOLL_SLEEP_MS_MAX};
use rampkv_core::protocol::server::{Addressed, Effects, LogPosition, Reply};
use rampkv_core::protocol::ConnectionId;
use rampkv_core::wire::{FrameHeader, Request, Response};

use super::router::{Inbox, Wake};
use super::{Served, Servers};
use crate::message::{walk_frames, Channel, ChannelError, FrameFault, OutBuffer};

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
    events: Vec<FrontEvent<M::Channel>>,
    /// Slots with work left from the last pass.
    again: Vec<usize>,
    visit: Vec<usize>,
    stop: Arc<AtomicBool>,
}

impl<M: ServerMedium> Poller<M> {
    /// A poller over `medium` for `servers`, registered with their router; stops once `stop`
    /// is set (and its waker woken).
    pub fn new(medium: M, servers: Arc<Servers>, stop: Arc<AtomicBool>) -> Self {
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
            events: Vec::new(),
            again: Vec::new(),
            visit: Vec::new(),
            stop,
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
            let now_ms = self.servers.now_ms();
            let mut served = self.take_events();
            for index in 0..self.visit.len() {
                served += self.serve(self.visit[index], now_ms);
            }
            served += self.deliver_deferred(now_ms);
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
    fn take_events(&mut self) -> usize {
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
                    let connection = Connection { channel, server, id, out: OutBuffer::default(), closing: false };
                    self.connections[slot] = Some(connection);
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
    fn serve(&mut self, slot: usize, now_ms: u64) -> usize {
        let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { return 0 };
        let served = &self.servers.served()[connection.server];
        let outcome = serve_connection(connection, served, now_ms, &mut self.effects, &mut self.routed, &mut self.gate);
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
        self.route();
        messages
    }

    /// Drops the connection in `slot` (if open): its locks are released (the replies this
    /// unblocks are routed) and, if the poller closes it, the peer is told.
    fn close(&mut self, slot: usize, tell_peer: bool) {
        let Some(connection) = self.connections.get_mut(slot).and_then(Option::take) else { return };
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
        self.gate.release(
            |server| servers.durable_position(server),
            |held| match held {
                Held::Frames(id, frames) => {
                    if let Some(connection) = own_connection(connections, id) {
                        connection.out.frames().extend_from_slice(&frames);
                        if connection.out.flush(&mut connection.channel).is_err() {
                            connection.closing = true;
                        }
                        delivered += 1;
                    }
                }
                Held::Routed(reply) => routed.push(reply),
            },
        );
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
/// while the reply backlog is under its bound, answering every frame.
fn serve_connection<C: Channel>(
    connection: &mut Connection<C>,
    served: &Served,
    now_ms: u64,
    effects: &mut Effects,
    routed: &mut Vec<Addressed>,
    gate: &mut ReplyGate,
) -> Result<Outcome, ChannelError> {
    connection.out.flush(&mut connection.channel)?;
    let mut messages = 0;
    while !connection.closing
        && connection.out.len() <= CONNECTION_WRITE_BUFFER_BYTES_MAX
        && messages < WRITEPOLL_MESSAGES_PER_PASS_MAX
        && connection.channel.readable()
    {
        let Connection { channel, id, out, server, .. } = connection;
        let frame_max = channel.frame_bytes_max();
        let mut fault = None;
        let received = channel.receive(|bytes| {
            let (walked, walk_fault) = walk_frames(bytes, C::STREAM, |header, body| {
                let at = Address { server: *server, connection: *id };
                serve_frame(served, at, header, body, now_ms, effects, frame_max, out, gate);
                routed.append(&mut effects.replies);
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
        connection.out.flush(&mut connection.channel)?;
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
    now_ms: u64,
    effects: &mut Effects,
    frame_max: usize,
    out: &mut OutBuffer,
    gate: &mut ReplyGate,
) {
    let reply = match Request::decode(header.kind, body) {
        Ok(request) => served.serve(at.connection, request, header.request_id, now_ms, effects),
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
