//! The event loop and its connections: accepting, reading, writing and closing them, the
//! session pool, the gateway's buffer budget and the idle timeout. What a command does is in
//! `dispatch`, how pipelined commands join one transaction in `batch`, the cluster side in
//! `driver`.
//!
//! # Sessions
//! The driver runs a fixed pool of sessions (logical clients, each with its own client id and
//! clock). An accepted connection takes a free session for its lifetime; when none is free it
//! is sent `-ERR max number of clients reached` and closed. A connection runs one transaction at
//! a time, so pipelined commands are answered in order and each sees the writes of those before
//! it. A connection that closes while its transaction is in flight leaves its session
//! *orphaned*; the session goes back to the pool when the transaction finishes (at the latest
//! after `TXN_TIMEOUT_MS`).
//!
//! # Waiting
//! One poller watches the listener, the RESP connections and the driver's server connections
//! (the driver runs over `SharedPollTransport`, which registers its sockets there). Each turn
//! of the loop waits in that poller, serves the RESP connections that have something, then
//! steps the driver without blocking: it reads the server sockets that were ready, advances the
//! transactions, and the loop answers the finished ones. The loop never spins: it blocks in
//! `epoll` until something arrives, and while transactions are in flight at most
//! [`IN_FLIGHT_POLL_TIMEOUT`], so that their deadlines are checked. Replies are written at the
//! end of the turn, one send per connection (sooner past [`GATEWAY_WRITE_EARLY_BYTES`]): a
//! pipeline run as several transactions is answered in one send, not one per transaction.
//!
//! # Fault model
//! - Malformed RESP gets `-ERR Protocol error: ...`; the connection is closed once the replies
//!   before it are written. Other connections are not affected.
//! - A client that does not read its replies stops being served once
//!   [`GATEWAY_OUTPUT_BACKLOG_BYTES_MAX`] of them wait (its later commands wait in its socket).
//! - All connections together hold at most [`GatewayConfig::buffered_bytes_max`](super::GatewayConfig::buffered_bytes_max) (default
//!   [`GATEWAY_BUFFERED_BYTES_MAX`](crate::GATEWAY_BUFFERED_BYTES_MAX)) of buffered requests and unsent replies: beyond it the
//!   connection that holds the most is closed and logged, until the total is under it.
//! - A client that closes its sending side still gets the replies to the complete commands it
//!   sent; an incomplete trailing command is dropped.
//! - With an idle timeout ([`GatewayConfig::idle_timeout`](super::GatewayConfig::idle_timeout), `--timeout SECONDS` as Redis's
//!   `timeout`), a connection that sent no command for that long, has no command in flight and
//!   no reply waiting is closed (its session goes back to the pool).
//! - The cluster's faults (a failed transaction, a server or the whole driver failing): see
//!   `driver`.

use std::io::{ErrorKind, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::config::{GatewayError, InProcessServers};
use super::connect::GatewayDriver;
use super::follower::Follower;
use super::input::Retry;
use super::limits::IN_FLIGHT_POLL_TIMEOUT;
use super::state::{MultiState, Pending};
use crate::auth::{Permissions, UserId, Users};
use crate::codec::{self, Protocol, RequestLimits, RequestParser};
use crate::command::parse_request;
use crate::transport::SERVER_TOKEN_BASE;
use crate::{GATEWAY_IDLE_SCAN_INTERVAL, GATEWAY_OUTPUT_BACKLOG_BYTES_MAX, GATEWAY_WRITE_EARLY_BYTES};
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_net::client::Completion;
use rampkv_net::message::tcp::{ReadStatus, StreamBuffer};

pub(super) const WAKER_TOKEN: Token = Token(usize::MAX);
pub(super) const LISTENER_TOKEN: Token = Token(usize::MAX - 1);
const EVENTS_CAPACITY: usize = 1024;

/// Most serve-and-step rounds per turn of the loop before it polls for events again.
const SERVE_ROUNDS_MAX: usize = 64;

/// The reply to a connection beyond the session pool (Redis's text).
const MAX_CLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";

#[derive(Debug)]
pub(super) struct Connection {
    pub(super) stream: TcpStream,
    /// CLIENT ID: unique in this gateway process.
    pub(super) id: u64,
    pub(super) session: usize,
    pub(super) protocol: Protocol,
    pub(super) name: Option<Vec<u8>>,
    /// Who the connection is logged in as (None: not yet) and what that user may run.
    pub(super) user: Option<UserId>,
    pub(super) permissions: Permissions,
    pub(super) incoming: StreamBuffer,
    pub(super) outgoing: StreamBuffer,
    pub(super) pending: Option<Pending>,
    /// Between MULTI and EXEC: the queued commands (`multi`); dropped with the connection.
    pub(super) multi: Option<MultiState>,
    /// With a follower: the input of the transaction `pending` waits on, to run it again
    /// after a failover (`failover`).
    pub(super) retry: Option<Retry>,
    /// The socket had no more bytes at the last read (edge-triggered: read again after an event).
    pub(super) read_drained: bool,
    /// epoll reported the peer's end of stream: read until EOF rather than stopping at a short read.
    pub(super) peer_finished: bool,
    /// The peer sent its last byte: answer the complete commands buffered, then close.
    pub(super) input_closed: bool,
    /// Close once the replies are written (QUIT, protocol error).
    pub(super) closing: bool,
    pub(super) wants_writable: bool,
    /// In the loop's ready list.
    pub(super) queued: bool,
    /// In the loop's list of replies to write at the end of the turn.
    pub(super) flush_queued: bool,
    /// When it last sent a command (or connected): the idle timeout counts from here.
    pub(super) last_command: Instant,
    /// Bytes its buffers held when last counted (in the gateway's total).
    pub(super) held_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct SessionState {
    /// The connection slot that owns the session; None for a free or orphaned session.
    pub(super) owner: Option<usize>,
    /// A transaction of this session is in flight in the driver.
    pub(super) in_flight: bool,
}

#[derive(Debug)]
pub(super) struct Stats {
    pub(super) started: Instant,
    pub(super) port: u16,
    pub(super) sessions: usize,
    pub(super) connections_received: u64,
    pub(super) connections_rejected: u64,
    pub(super) commands_processed: u64,
}

pub(super) struct EventLoop {
    pub(super) poll: Poll,
    pub(super) listener: TcpListener,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) cluster: Cluster,
    pub(super) in_process: Option<InProcessServers>,
    /// None after the driver failed, until a reconnect works.
    pub(super) driver: Option<GatewayDriver>,
    /// With replication: learns the configuration and connects new drivers (`failover`).
    pub(super) follower: Option<Follower>,
    /// Connections (slot, client id) whose command waits for the follower's next update.
    pub(super) parked: Vec<(usize, u64)>,
    /// Wakes the loop (an in-process driver's deferred replies).
    pub(super) waker: Arc<Waker>,
    /// What a reconnected driver runs with.
    pub(super) txn_options: TxnOptions,
    pub(super) driver_error: String,
    pub(super) last_reconnect: Instant,
    /// When a step must run even without I/O, to time out transactions.
    pub(super) next_deadline_check: Instant,
    pub(super) sessions: Vec<SessionState>,
    pub(super) free_sessions: Vec<usize>,
    pub(super) connections: Vec<Option<Connection>>,
    pub(super) free_slots: Vec<usize>,
    /// Connections to serve before the loop waits again.
    pub(super) ready: Vec<usize>,
    /// Connections with replies to write at the end of the turn.
    pub(super) to_flush: Vec<usize>,
    pub(super) parser: RequestParser,
    pub(super) completions: Vec<Completion>,
    pub(super) next_client_id: u64,
    pub(super) stats: Stats,
    pub(super) users: Arc<Users>,
    pub(super) idle_timeout: Option<Duration>,
    pub(super) next_idle_scan: Instant,
    /// Bytes all connections hold, as last counted, and the most they may.
    pub(super) held_total: usize,
    pub(super) buffered_bytes_max: usize,
}

impl EventLoop {
    pub(super) fn new(
        poll: Poll,
        listener: TcpListener,
        stop: Arc<AtomicBool>,
        (cluster, in_process): (Cluster, Option<InProcessServers>),
        (driver, follower, waker): (GatewayDriver, Option<Follower>, Arc<Waker>),
        (port, users, idle_timeout): (u16, Arc<Users>, Option<Duration>),
        buffered_bytes_max: usize,
    ) -> Self {
        let session_count = driver.session_count();
        let txn_options = *driver.txn_options();
        Self {
            poll,
            listener,
            stop,
            cluster,
            in_process,
            driver: Some(driver),
            follower,
            parked: Vec::new(),
            waker,
            txn_options,
            driver_error: String::new(),
            last_reconnect: Instant::now(),
            next_deadline_check: Instant::now(),
            sessions: vec![SessionState::default(); session_count],
            // Reversed so that session 0 is handed out first (easier to read in traces).
            free_sessions: (0..session_count).rev().collect(),
            connections: Vec::new(),
            free_slots: Vec::new(),
            ready: Vec::new(),
            to_flush: Vec::new(),
            parser: RequestParser::new(),
            completions: Vec::new(),
            next_client_id: 1,
            stats: Stats {
                started: Instant::now(),
                port,
                sessions: session_count,
                connections_received: 0,
                connections_rejected: 0,
                commands_processed: 0,
            },
            users,
            idle_timeout,
            next_idle_scan: Instant::now(),
            held_total: 0,
            buffered_bytes_max,
        }
    }

    pub(super) fn run(mut self) -> Result<(), GatewayError> {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.stop.load(Ordering::Acquire) {
            let in_flight = self.driver.as_ref().is_some_and(|driver| driver.active() > 0);
            let timeout = if !self.ready.is_empty() {
                Some(Duration::ZERO) // work left from the last turn
            } else if in_flight || !self.parked.is_empty() {
                Some(IN_FLIGHT_POLL_TIMEOUT)
            } else if self.idle_timeout.is_some() && self.free_slots.len() < self.connections.len() {
                Some(GATEWAY_IDLE_SCAN_INTERVAL) // connections to time out
            } else {
                None
            };
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => return Err(error.into()),
            }
            for event in events.iter() {
                match event.token() {
                    WAKER_TOKEN => {}
                    LISTENER_TOKEN => self.accept(),
                    Token(token) if token >= SERVER_TOKEN_BASE => {
                        if let Some(driver) = self.driver.as_mut() {
                            let finished = event.is_read_closed() || event.is_error();
                            let (readable, writable) = (event.is_readable(), event.is_writable());
                            driver.transport_mut().mark(token - SERVER_TOKEN_BASE, readable, writable, finished);
                        }
                    }
                    Token(slot) => {
                        if let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) {
                            if event.is_readable() || event.is_read_closed() || event.is_error() {
                                connection.read_drained = false;
                                connection.peer_finished |= event.is_read_closed() || event.is_error();
                            }
                            self.enqueue(slot);
                        }
                    }
                }
            }
            // A new driver after a failover (the waker), or parked commands past their bound.
            self.follow_updates();
            // Serve and step until neither has anything left: answers start the next pipelined
            // commands, whose requests the next step sends. Bounded, so that a stream of
            // completions cannot keep the loop from polling for new connections and commands.
            for _ in 0..SERVE_ROUNDS_MAX {
                self.serve_ready();
                self.step_driver();
                if self.ready.is_empty() {
                    break;
                }
            }
            self.flush_replies();
            self.close_idle();
            self.enforce_budget();
        }
        Ok(())
    }

    /// Counts what connection `slot` holds now into the gateway's total.
    fn account(&mut self, slot: usize) {
        let Some(connection) = self.connections[slot].as_mut() else { return };
        let queued = connection.multi.as_ref().map_or(0, MultiState::held_bytes);
        let retry = connection.retry.as_ref().map_or(0, Retry::held_bytes);
        let held = connection.incoming.held_bytes() + connection.outgoing.held_bytes() + queued + retry;
        self.held_total = self.held_total - connection.held_bytes + held;
        connection.held_bytes = held;
    }

    /// While all connections hold more than the gateway's budget, closes the one holding the
    /// most (logged).
    fn enforce_budget(&mut self) {
        while self.held_total > self.buffered_bytes_max {
            let largest = (0..self.connections.len())
                .filter_map(|slot| self.connections[slot].as_ref().map(|connection| (connection.held_bytes, slot)))
                .max();
            let Some((held, slot)) = largest else { return };
            let peer = self.connections[slot].as_ref().and_then(|connection| connection.stream.peer_addr().ok());
            let peer = peer.map_or_else(|| "?".to_string(), |peer| peer.to_string());
            log::warn!(
                "closing the RESP connection from {peer}: all connections hold {} bytes, over the gateway's budget \
                 of {}, and this one holds the most ({held})",
                self.held_total,
                self.buffered_bytes_max
            );
            self.close(slot);
        }
    }

    /// Closes the connections idle past the idle timeout (at most every
    /// `GATEWAY_IDLE_SCAN_INTERVAL`): no command for that long, none in flight, no reply waiting.
    fn close_idle(&mut self) {
        let Some(idle_timeout) = self.idle_timeout else { return };
        let now = Instant::now();
        if now < self.next_idle_scan {
            return;
        }
        self.next_idle_scan = now + GATEWAY_IDLE_SCAN_INTERVAL;
        for slot in 0..self.connections.len() {
            let idle = self.connections[slot].as_ref().is_some_and(|connection| {
                connection.pending.is_none()
                    && connection.outgoing.is_empty()
                    && now.saturating_duration_since(connection.last_command) >= idle_timeout
            });
            if idle {
                self.close(slot);
            }
        }
    }

    pub(super) fn enqueue(&mut self, slot: usize) {
        if let Some(connection) = self.connections[slot].as_mut() {
            if !connection.queued {
                connection.queued = true;
                self.ready.push(slot);
            }
        }
    }

    /// Serves every queued connection; serving may queue more (a driver failure answers many).
    fn serve_ready(&mut self) {
        while let Some(slot) = self.ready.pop() {
            if let Some(connection) = self.connections[slot].as_mut() {
                connection.queued = false;
                self.service(slot);
            }
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                // WouldBlock: all accepted. Any other error (reset, out of descriptors) concerns
                // that one connection; the others go on.
                Err(_) => return,
            }
        }
    }

    fn admit(&mut self, mut stream: TcpStream) {
        self.stats.connections_received += 1;
        let Some(session) = self.free_sessions.pop() else {
            self.stats.connections_rejected += 1;
            // One small write to a fresh socket does not block; the stream closes when dropped.
            let _ = stream.write(MAX_CLIENTS_REPLY);
            return;
        };
        let _ = stream.set_nodelay(true);
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.connections.push(None);
            self.connections.len() - 1
        });
        if self.poll.registry().register(&mut stream, Token(slot), Interest::READABLE).is_err() {
            self.free_slots.push(slot);
            self.free_sessions.push(session);
            return;
        }
        debug_assert!(self.sessions[session].owner.is_none() && !self.sessions[session].in_flight);
        self.sessions[session].owner = Some(slot);
        let user = self.users.initial_user();
        self.connections[slot] = Some(Connection {
            stream,
            id: self.next_client_id,
            session,
            protocol: Protocol::Resp2,
            name: None,
            user,
            permissions: self.users.permissions(user),
            incoming: StreamBuffer::default(),
            outgoing: StreamBuffer::default(),
            pending: None,
            multi: None,
            retry: None,
            read_drained: false,
            peer_finished: false,
            input_closed: false,
            closing: false,
            wants_writable: false,
            queued: false,
            flush_queued: false,
            last_command: Instant::now(),
            held_bytes: 0,
        });
        self.next_client_id += 1;
        self.enqueue(slot);
    }

    /// Reads and runs commands for a connection until it must wait; closes it if done. Its
    /// replies are written at the end of the turn ([`EventLoop::flush_replies`]).
    fn service(&mut self, slot: usize) {
        let served = self.serve(slot);
        self.account(slot);
        if !served {
            return self.close(slot);
        }
        let connection = self.connections[slot].as_mut().expect("served");
        if connection.outgoing.is_empty() {
            self.update_interest(slot);
        } else if !connection.flush_queued {
            connection.flush_queued = true;
            self.to_flush.push(slot);
        }
    }

    /// Writes the replies the turn produced, one send per connection, and closes the
    /// connections that were waiting for theirs to be written.
    fn flush_replies(&mut self) {
        while let Some(slot) = self.to_flush.pop() {
            let Some(connection) = self.connections[slot].as_mut() else { continue };
            connection.flush_queued = false;
            if connection.outgoing.write_to(&mut connection.stream).is_err()
                || (connection.closing && connection.outgoing.is_empty())
            {
                self.close(slot);
            } else {
                self.account(slot);
                self.update_interest(slot);
            }
        }
    }

    /// False when the connection should be closed now.
    fn serve(&mut self, slot: usize) -> bool {
        loop {
            let Some(connection) = self.connections[slot].as_mut() else {
                return false;
            };
            // Written now only when closing or when much waits; else at the end of the turn.
            let write_now = connection.closing || connection.outgoing.len() >= GATEWAY_WRITE_EARLY_BYTES;
            if write_now && connection.outgoing.write_to(&mut connection.stream).is_err() {
                return false;
            }
            if connection.closing {
                return !connection.outgoing.is_empty();
            }
            if connection.pending.is_some() || connection.outgoing.len() > GATEWAY_OUTPUT_BACKLOG_BYTES_MAX {
                return true;
            }
            match self.parser.parse_within(connection.incoming.pending(), connection.request_limits()) {
                Err(error) => {
                    connection.outgoing.append(|out| codec::write_error(out, format!("ERR {error}").as_bytes()));
                    connection.closing = true;
                }
                Ok(Some((args, consumed))) => {
                    let request =
                        if args.is_empty() { None } else { Some(parse_request(&args, connection.permissions)) };
                    connection.incoming.consume(consumed);
                    connection.last_command = Instant::now();
                    if let Some(request) = request {
                        self.stats.commands_processed += 1;
                        self.execute(slot, request);
                    }
                }
                Ok(None) if connection.input_closed => connection.closing = true,
                Ok(None) if connection.read_drained => return true,
                Ok(None) => match connection.incoming.read_from(&mut connection.stream, 0) {
                    Ok(ReadStatus::EndOfStream) => connection.input_closed = true,
                    Ok(ReadStatus::Drained) => connection.read_drained = !connection.peer_finished,
                    Ok(ReadStatus::MoreMayFollow) => {}
                    Err(error) if error.kind() == ErrorKind::WouldBlock => connection.read_drained = true,
                    Err(error) if error.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return false,
                },
            }
        }
    }

    fn update_interest(&mut self, slot: usize) {
        let Some(connection) = self.connections[slot].as_mut() else {
            return;
        };
        let wants_writable = !connection.outgoing.is_empty();
        if wants_writable == connection.wants_writable {
            return;
        }
        let interest = if wants_writable { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
        if self.poll.registry().reregister(&mut connection.stream, Token(slot), interest).is_ok() {
            connection.wants_writable = wants_writable;
        } else {
            self.close(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(mut connection) = self.connections[slot].take() else {
            return;
        };
        let _ = self.poll.registry().deregister(&mut connection.stream);
        self.held_total -= connection.held_bytes;
        self.free_slots.push(slot);
        let session = &mut self.sessions[connection.session];
        debug_assert_eq!(session.owner, Some(slot));
        session.owner = None;
        if !session.in_flight {
            self.free_sessions.push(connection.session);
        } // else orphaned: freed when its transaction finishes
    }
}

impl Connection {
    /// The parser's limits for this connection: Redis's small ones until it has logged in.
    pub(super) fn request_limits(&self) -> RequestLimits {
        if self.permissions.authenticated() {
            RequestLimits::AUTHENTICATED
        } else {
            RequestLimits::UNAUTHENTICATED
        }
    }
}
