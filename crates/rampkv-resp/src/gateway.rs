//! The gateway's event loop: RESP connections on one side, one rampkv [`Driver`] on the other,
//! all on one thread.
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
//! # Pipelines
//! When a read command (GET, MGET, EXISTS) starts, the read commands right behind it that are
//! already buffered join it in one `get_all` (up to [`BATCH_COMMANDS_MAX`] commands and
//! `TXN_KEYS_MAX` keys); likewise SET and MSET in one `put_all` (up to
//! [`WRITE_BATCH_KEYS_MAX`] keys). Each command still gets its own reply, in order. A batch of
//! reads, or of writes with an MSET of several keys in it, is atomic as a whole: stronger than
//! what Redis promises for a pipeline, and still an execution Redis allows (the commands back to
//! back). A batch of one-key writes (SETs) is written as independent one-key writes at one
//! timestamp (`Driver::begin_independent_writes`), each atomic alone, as in Redis: their
//! versions are then alone in their write sets, which the servers free as soon as a newer
//! write supersedes them instead of keeping them for the GC grace period (a pipeline of SETs
//! otherwise grew memory by its whole volume for ten seconds: docs/performance.md, issue 18).
//! Any other command (DEL, PING, HELLO, an error) ends
//! a batch and runs alone. This is what lets a pipelining client get more than one transaction's
//! worth of work per round trip.
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
//! # Authentication
//! With users that need passwords ([`GatewayConfig::users`], `--requirepass` / `--aclfile`), a
//! connection starts unauthenticated: it may only run AUTH, HELLO and QUIT, and its requests are
//! parsed within Redis's limits for unauthenticated clients (10 arguments, 16 KiB bulk strings),
//! so an anonymous client cannot make the gateway buffer large requests or start transactions.
//! See [`crate::auth`]. A gateway that anyone could use (no password for `default`) refuses to
//! listen on an address other than loopback unless protected mode is off
//! ([`GatewayConfig::protected_mode`], Redis's `protected-mode`).
//!
//! # Fault model
//! - Malformed RESP gets `-ERR Protocol error: ...`; the connection is closed once the replies
//!   before it are written. Other connections are not affected.
//! - A client that does not read its replies stops being served once
//!   [`GATEWAY_OUTPUT_BACKLOG_BYTES_MAX`] of them wait (its later commands wait in its socket).
//! - All connections together hold at most [`GatewayConfig::buffered_bytes_max`] (default
//!   [`GATEWAY_BUFFERED_BYTES_MAX`]) of buffered requests and unsent replies: beyond it the
//!   connection that holds the most is closed and logged, until the total is under it.
//! - A client that closes its sending side still gets the replies to the complete commands it
//!   sent; an incomplete trailing command is dropped.
//! - With an idle timeout ([`GatewayConfig::idle_timeout`], `--timeout SECONDS` as Redis's
//!   `timeout`), a connection that sent no command for that long, has no command in flight and
//!   no reply waiting is closed (its session goes back to the pool).
//! - A transaction that fails (timeout, server error) gets `-ERR rampkv: ...`. A timed-out
//!   write may or may not have taken effect, as with any store.
//! - If one server's connection fails, the commands that need its partitions get
//!   `-CLUSTERDOWN rampkv: partitions [...] are unavailable ...` and the others go on; the driver
//!   reconnects to it on its own. If the driver fails as a whole, every command in flight gets
//!   an error, and later commands try to reconnect at most once per [`RECONNECT_INTERVAL`];
//!   until that works they get `-ERR rampkv cluster unavailable: ...`.

use std::io::{ErrorKind, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ahash::AHashSet;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use super::auth::{self, Permissions, UserId, Users};
use super::codec::{self, Frame, Protocol, RequestLimits, RequestParser};
use super::command::{parse_request, Request};
use super::transport::{SharedPollTransport, SERVER_TOKEN_BASE};
use super::{
    value, GATEWAY_BUFFERED_BYTES_MAX, GATEWAY_IDLE_SCAN_INTERVAL, GATEWAY_OUTPUT_BACKLOG_BYTES_MAX,
    GATEWAY_SESSIONS_DEFAULT, GATEWAY_SESSIONS_MAX, GATEWAY_WRITE_EARLY_BYTES, REDIS_COMPATIBLE_VERSION,
};
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::TXN_KEYS_MAX;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_core::protocol::ReadOutcome;
use rampkv_net::client::{ClientError, Completion, Driver, TxnResult};
use rampkv_net::message::tcp::{ReadStatus, StreamBuffer};
use rampkv_net::server::Servers;
use rampkv_net::transport::local::LocalTransport;

const WAKER_TOKEN: Token = Token(usize::MAX);
const LISTENER_TOKEN: Token = Token(usize::MAX - 1);
const EVENTS_CAPACITY: usize = 1024;

/// Longest the loop blocks while transactions are in flight: how late a transaction's deadline
/// (`TXN_TIMEOUT_MS`) may be noticed.
pub const IN_FLIGHT_POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// Most serve-and-step rounds per turn of the loop before it polls for events again.
const SERVE_ROUNDS_MAX: usize = 64;

/// Most pipelined commands run as one transaction.
pub const BATCH_COMMANDS_MAX: usize = 64;

/// Most keys pipelined SETs and MSETs grow a batched write to (one command alone may have up to
/// `TXN_KEYS_MAX`). RAMP-Fast stores a write's whole write set with each version it writes, so a
/// bigger batch makes every later read of those versions dearer. Measured on the 2-core machine
/// (docs/resp.md): MSET of 4 keys with `-P 16` ran at 32-39k/s merged up to 64 keys and 27k/s up
/// to 16, but MGET of 4 keys with `-P 16` over the versions written ran at 27-30k/s and 51-59k/s.
pub const WRITE_BATCH_KEYS_MAX: usize = 16;

/// Least time between two attempts to reconnect a failed driver.
pub const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);

/// The reply to a connection beyond the session pool (Redis's text).
const MAX_CLIENTS_REPLY: &[u8] = b"-ERR max number of clients reached\r\n";

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    #[error("gateway i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot reach the rampkv cluster: {0}")]
    Client(#[from] ClientError),
    #[error("sessions must be 1..={GATEWAY_SESSIONS_MAX}, got {sessions}")]
    Sessions { sessions: usize },
    #[error("{count} in-process servers for a cluster of {servers}")]
    InProcessServers { count: usize, servers: usize },
    /// Redis's protected mode, at start-up: anyone who can reach `address` could read and write
    /// every key.
    #[error(
        "refusing to serve RESP on {address} without a password (protected mode): anyone who can reach it could \
         read and write every key. Set a password (--requirepass PASSWORD, or --aclfile FILE giving the default \
         user one), listen on a loopback address (127.0.0.1), or pass --protected-mode no to accept the risk"
    )]
    ProtectedMode { address: SocketAddr },
}

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Address of the RESP listener; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Size of the session pool: the most RESP connections served at once.
    pub sessions: usize,
    /// The transaction algorithm (RAMP-Fast by default; the tests also run the no-concurrency-
    /// control baseline to show that their checks catch fractured reads).
    pub txn_options: TxnOptions,
    /// The cluster's servers run in this process: call their cores directly rather than over
    /// TCP (`rampkv local` does this).
    pub in_process: Option<InProcessServers>,
    /// Who may log in, and what each user may run ([`Users::open`]: no authentication).
    pub users: Arc<Users>,
    /// Redis's `protected-mode` (on by default): a gateway without a password for `default`
    /// refuses to listen on anything but a loopback address.
    pub protected_mode: bool,
    /// Redis's `timeout`: close a connection idle this long (`None`, the default: never).
    pub idle_timeout: Option<Duration>,
    /// Most bytes all connections may hold together (default `GATEWAY_BUFFERED_BYTES_MAX`).
    pub buffered_bytes_max: usize,
}

/// The server groups of this process ([`rampkv_net::server::ServerGroup::servers`]); server i
/// of the cluster is the i-th server counting through the groups.
#[derive(Debug, Clone)]
pub struct InProcessServers {
    pub groups: Vec<Arc<Servers>>,
}

impl GatewayConfig {
    /// A gateway on `listen` with the default session pool and RAMP-Fast.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            sessions: GATEWAY_SESSIONS_DEFAULT,
            txn_options: TxnOptions::default(),
            in_process: None,
            users: Arc::new(Users::open()),
            protected_mode: true,
            idle_timeout: None,
            buffered_bytes_max: GATEWAY_BUFFERED_BYTES_MAX,
        }
    }

    /// The start-up refusal of protected mode, if it applies: an address other than loopback
    /// (the unspecified 0.0.0.0 and :: included) and users that let anyone in.
    pub fn protected_mode_refusal(&self) -> Option<GatewayError> {
        let ip = self.listen.ip().to_canonical();
        let exposed = !ip.is_loopback();
        (self.protected_mode && exposed && self.users.open_to_anyone())
            .then_some(GatewayError::ProtectedMode { address: self.listen })
    }
}

/// A running gateway. Dropping it stops it.
#[derive(Debug)]
pub struct Gateway {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<Result<(), GatewayError>>>,
}

impl Gateway {
    /// Connects a driver to `cluster` (which must be up), binds the listener, and starts the
    /// event loop thread.
    pub fn spawn(cluster: &Cluster, config: &GatewayConfig) -> Result<Gateway, GatewayError> {
        if let Some(refusal) = config.protected_mode_refusal() {
            return Err(refusal);
        }
        if !(1..=GATEWAY_SESSIONS_MAX).contains(&config.sessions) {
            return Err(GatewayError::Sessions { sessions: config.sessions });
        }
        if let Some(servers) = &config.in_process {
            let count = servers.groups.iter().map(|group| group.served().len()).sum::<usize>();
            if count != cluster.servers().len() {
                return Err(GatewayError::InProcessServers { count, servers: cluster.servers().len() });
            }
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let in_process = config.in_process.as_ref();
        let driver = connect_driver(poll.registry(), &waker, cluster, in_process, config.sessions, config.txn_options)?;
        let mut listener = TcpListener::bind(config.listen)?;
        poll.registry().register(&mut listener, LISTENER_TOKEN, Interest::READABLE)?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let event_loop = EventLoop::new(
            poll,
            listener,
            Arc::clone(&stop),
            (cluster.clone(), config.in_process.clone()),
            (driver, Arc::clone(&waker)),
            (address.port(), Arc::clone(&config.users), config.idle_timeout),
            config.buffered_bytes_max,
        );
        let thread = std::thread::Builder::new().name("rampkv-gateway".into()).spawn(move || event_loop.run())?;
        Ok(Gateway { address, stop, waker, thread: Some(thread) })
    }

    /// The bound address of the RESP listener.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops the event loop and waits for it; returns its result.
    pub fn shutdown(mut self) -> Result<(), GatewayError> {
        self.stop_and_join()
    }

    /// Blocks until the event loop ends (only on an I/O error of its poller).
    pub fn wait(mut self) -> Result<(), GatewayError> {
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("gateway thread panicked").into()))
            }
            None => Ok(()),
        }
    }

    fn stop_and_join(&mut self) -> Result<(), GatewayError> {
        self.stop.store(true, Ordering::Release);
        self.waker.wake()?;
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("gateway thread panicked").into()))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

type GatewayDriver = Driver<SharedPollTransport>;

/// A driver whose server sockets are registered in `registry` (or that calls the servers of
/// this process, waking the loop through `waker` when a deferred reply comes).
fn connect_driver(
    registry: &mio::Registry,
    waker: &Arc<Waker>,
    cluster: &Cluster,
    in_process: Option<&InProcessServers>,
    sessions: usize,
    options: TxnOptions,
) -> Result<GatewayDriver, ClientError> {
    let transport = match in_process {
        Some(servers) => {
            let wake = Arc::clone(waker) as Arc<dyn rampkv_net::message::Wake>;
            SharedPollTransport::InProcess(LocalTransport::new(&servers.groups, Some(wake)))
        }
        None => SharedPollTransport::connect(registry, cluster.servers())?,
    };
    let mut driver = Driver::connect(transport, cluster.clone(), sessions)?;
    driver.set_txn_options(options);
    Ok(driver)
}

/// One read command of a batch; its keys are the next ones of the batch's read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadCommand {
    Get,
    MultiGet { keys: usize },
    Exists { keys: usize },
}

/// The commands a connection waits on; says how to answer the transaction's result.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pending {
    /// Consecutive GET, MGET and EXISTS commands read by one `get_all`, in order.
    Reads(Vec<ReadCommand>),
    /// Consecutive SET and MSET commands written by one `put_all`: `commands` OK replies.
    Writes { commands: usize },
    /// DEL, first step: reading the keys to count the present ones.
    DeleteRead,
    /// DEL, second step: writing the tombstones; `removed` keys were present.
    DeleteWrite { removed: i64 },
}

#[derive(Debug)]
struct Connection {
    stream: TcpStream,
    /// CLIENT ID: unique in this gateway process.
    id: u64,
    session: usize,
    protocol: Protocol,
    name: Option<Vec<u8>>,
    /// Who the connection is logged in as (None: not yet) and what that user may run.
    user: Option<UserId>,
    permissions: Permissions,
    incoming: StreamBuffer,
    outgoing: StreamBuffer,
    pending: Option<Pending>,
    /// The socket had no more bytes at the last read (edge-triggered: read again after an event).
    read_drained: bool,
    /// epoll reported the peer's end of stream: read until EOF rather than stopping at a short read.
    peer_finished: bool,
    /// The peer sent its last byte: answer the complete commands buffered, then close.
    input_closed: bool,
    /// Close once the replies are written (QUIT, protocol error).
    closing: bool,
    wants_writable: bool,
    /// In the loop's ready list.
    queued: bool,
    /// In the loop's list of replies to write at the end of the turn.
    flush_queued: bool,
    /// When it last sent a command (or connected): the idle timeout counts from here.
    last_command: Instant,
    /// Bytes its buffers held when last counted (in the gateway's total).
    held_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct SessionState {
    /// The connection slot that owns the session; None for a free or orphaned session.
    owner: Option<usize>,
    /// A transaction of this session is in flight in the driver.
    in_flight: bool,
}

#[derive(Debug)]
struct Stats {
    started: Instant,
    port: u16,
    sessions: usize,
    connections_received: u64,
    connections_rejected: u64,
    commands_processed: u64,
}

struct EventLoop {
    poll: Poll,
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    cluster: Cluster,
    in_process: Option<InProcessServers>,
    /// None after the driver failed, until a reconnect works.
    driver: Option<GatewayDriver>,
    /// Wakes the loop (an in-process driver's deferred replies).
    waker: Arc<Waker>,
    /// What a reconnected driver runs with.
    txn_options: TxnOptions,
    driver_error: String,
    last_reconnect: Instant,
    /// When a step must run even without I/O, to time out transactions.
    next_deadline_check: Instant,
    sessions: Vec<SessionState>,
    free_sessions: Vec<usize>,
    connections: Vec<Option<Connection>>,
    free_slots: Vec<usize>,
    /// Connections to serve before the loop waits again.
    ready: Vec<usize>,
    /// Connections with replies to write at the end of the turn.
    to_flush: Vec<usize>,
    parser: RequestParser,
    completions: Vec<Completion>,
    next_client_id: u64,
    stats: Stats,
    users: Arc<Users>,
    idle_timeout: Option<Duration>,
    next_idle_scan: Instant,
    /// Bytes all connections hold, as last counted, and the most they may.
    held_total: usize,
    buffered_bytes_max: usize,
}

impl EventLoop {
    fn new(
        poll: Poll,
        listener: TcpListener,
        stop: Arc<AtomicBool>,
        (cluster, in_process): (Cluster, Option<InProcessServers>),
        (driver, waker): (GatewayDriver, Arc<Waker>),
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

    fn run(mut self) -> Result<(), GatewayError> {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.stop.load(Ordering::Acquire) {
            let in_flight = self.driver.as_ref().is_some_and(|driver| driver.active() > 0);
            let timeout = if !self.ready.is_empty() {
                Some(Duration::ZERO) // work left from the last turn
            } else if in_flight {
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
        let held = connection.incoming.held_bytes() + connection.outgoing.held_bytes();
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

    fn enqueue(&mut self, slot: usize) {
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

    /// Runs one command of connection `slot` (which has none pending).
    fn execute(&mut self, slot: usize, request: Request) {
        let connected = self.connections.len() - self.free_slots.len();
        let connection = self.connections[slot].as_mut().expect("executing for an open connection");
        debug_assert!(connection.pending.is_none());
        let reply = match request {
            Request::Get { .. } | Request::MultiGet { .. } | Request::Exists { .. } => {
                return self.begin_read_batch(slot, request)
            }
            Request::Set { .. } | Request::MultiSet { .. } => return self.begin_write_batch(slot, request),
            Request::Delete { keys } => return self.begin_read(slot, keys, Pending::DeleteRead),
            Request::Reply(frame) => frame,
            Request::Quit => {
                connection.closing = true;
                Frame::simple("OK")
            }
            Request::Auth { user, password } => {
                if user.is_none() && !self.users.default_has_password() {
                    Frame::error(auth::AUTH_WITHOUT_PASSWORD_REPLY)
                } else {
                    let user = user.as_deref().unwrap_or(auth::DEFAULT_USER.as_bytes());
                    if connection.log_in(&self.users, user, &password) {
                        Frame::simple("OK")
                    } else {
                        Frame::error(auth::WRONGPASS_REPLY)
                    }
                }
            }
            Request::Hello { protocol, auth, name } => {
                if let Some((user, password)) = auth {
                    if !connection.log_in(&self.users, &user, &password) {
                        let protocol = connection.protocol;
                        return connection
                            .outgoing
                            .append(|out| Frame::error(auth::WRONGPASS_REPLY).encode(protocol, out));
                    }
                }
                if !connection.permissions.authenticated() {
                    Frame::error(auth::HELLO_NOAUTH_REPLY)
                } else {
                    // The reply is already in the protocol HELLO asked for.
                    connection.protocol = protocol.unwrap_or(connection.protocol);
                    connection.name = name.or(connection.name.take());
                    hello_reply(connection.protocol, connection.id)
                }
            }
            Request::Info => Frame::Bulk(info_text(&self.stats, connected)),
            Request::ClientSetName(name) => {
                connection.name = if name.is_empty() { None } else { Some(name) };
                Frame::simple("OK")
            }
            Request::ClientGetName => connection.name.clone().map_or(Frame::Null, Frame::Bulk),
            Request::ClientId => Frame::Integer(i64::try_from(connection.id).unwrap_or(i64::MAX)),
            Request::AclWhoAmI => match connection.user {
                Some(user) => Frame::bulk(self.users.name(user)),
                None => Frame::error(auth::NOAUTH_REPLY), // not reached: ACL needs a login
            },
        };
        let protocol = connection.protocol;
        connection.outgoing.append(|out| reply.encode(protocol, out));
    }

    /// Starts one read for `first` and the read commands right behind it in the connection's
    /// input (pipelined), as long as they are complete, consecutive and fit one transaction.
    fn begin_read_batch(&mut self, slot: usize, first: Request) {
        let mut keys = Vec::new();
        let mut commands = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next.take() {
            let (command, more) = match request {
                Request::Get { key } => (ReadCommand::Get, vec![key]),
                Request::MultiGet { keys } => (ReadCommand::MultiGet { keys: keys.len() }, keys),
                Request::Exists { keys } => (ReadCommand::Exists { keys: keys.len() }, keys),
                other => unreachable!("not a read command: {other:?}"),
            };
            keys.extend(more);
            commands.push(command);
            next = self.next_batchable(slot, keys.len(), TXN_KEYS_MAX, commands.len(), |request| match request {
                Request::Get { .. } => Some(1),
                Request::MultiGet { keys } | Request::Exists { keys } => Some(keys.len()),
                _ => None,
            });
        }
        self.begin_read(slot, keys, Pending::Reads(commands));
    }

    /// Starts one write for `first` and the write commands right behind it (see
    /// [`EventLoop::begin_read_batch`]). With an MSET of several keys among them, one
    /// transaction makes them atomic together, which Redis does not promise but allows; one-key
    /// writes only are independent writes (module header). A key written twice keeps the value
    /// of the later command.
    fn begin_write_batch(&mut self, slot: usize, first: Request) {
        let mut pairs = Vec::new();
        let mut commands = 0;
        let mut one_key_each = true;
        let mut next = Some(first);
        while let Some(request) = next.take() {
            match request {
                Request::Set { key, value } => pairs.push((key, value)),
                Request::MultiSet { pairs: more } => {
                    one_key_each &= more.len() == 1;
                    pairs.extend(more);
                }
                other => unreachable!("not a write command: {other:?}"),
            }
            commands += 1;
            next = self.next_batchable(slot, pairs.len(), WRITE_BATCH_KEYS_MAX, commands, |request| match request {
                Request::Set { .. } => Some(1),
                Request::MultiSet { pairs } => Some(pairs.len()),
                _ => None,
            });
        }
        match one_key_each && commands > 1 {
            true => self.begin_independent_writes(slot, pairs, Pending::Writes { commands }),
            false => self.begin_write(slot, pairs, Pending::Writes { commands }),
        }
    }

    /// The next complete command in the connection's input, consumed, if `keys_of` accepts it
    /// (returns its key count) and the batch stays within `keys_max` keys and
    /// [`BATCH_COMMANDS_MAX`] commands. A command that does not fit stays in the input for later.
    fn next_batchable(
        &mut self,
        slot: usize,
        keys: usize,
        keys_max: usize,
        commands: usize,
        keys_of: impl Fn(&Request) -> Option<usize>,
    ) -> Option<Request> {
        if commands >= BATCH_COMMANDS_MAX {
            return None;
        }
        let connection = self.connections[slot].as_mut()?;
        let Ok(Some((args, consumed))) =
            self.parser.parse_within(connection.incoming.pending(), connection.request_limits())
        else {
            return None;
        };
        if args.is_empty() {
            return None;
        }
        let request = parse_request(&args, connection.permissions);
        let fits = keys_of(&request).is_some_and(|more| keys + more <= keys_max);
        if !fits {
            return None; // parsed again when its turn comes
        }
        connection.incoming.consume(consumed);
        self.stats.commands_processed += 1;
        Some(request)
    }

    fn begin_read(&mut self, slot: usize, keys: Vec<Vec<u8>>, pending: Pending) {
        let session = self.connections[slot].as_ref().expect("open").session;
        let started = match self.driver() {
            Some(driver) => driver.begin_read(session, keys),
            None => return self.reply_unavailable(slot, pending.replies()),
        };
        self.on_begin(slot, session, started, pending);
    }

    fn begin_write(&mut self, slot: usize, pairs: Vec<(Vec<u8>, Vec<u8>)>, pending: Pending) {
        self.begin_write_as(slot, pairs, pending, false);
    }

    fn begin_independent_writes(&mut self, slot: usize, pairs: Vec<(Vec<u8>, Vec<u8>)>, pending: Pending) {
        self.begin_write_as(slot, pairs, pending, true);
    }

    fn begin_write_as(&mut self, slot: usize, pairs: Vec<(Vec<u8>, Vec<u8>)>, pending: Pending, independent: bool) {
        let session = self.connections[slot].as_ref().expect("open").session;
        let started = match self.driver() {
            Some(driver) if independent => driver.begin_independent_writes(session, pairs).map(|_ts| ()),
            Some(driver) => driver.begin_write(session, pairs).map(|_ts| ()),
            None => return self.reply_unavailable(slot, pending.replies()),
        };
        self.on_begin(slot, session, started, pending);
    }

    fn on_begin(&mut self, slot: usize, session: usize, started: Result<(), ClientError>, pending: Pending) {
        match started {
            Ok(()) => {
                debug_assert!(!self.sessions[session].in_flight);
                self.sessions[session].in_flight = true;
                self.connections[slot].as_mut().expect("open").pending = Some(pending);
            }
            Err(error @ ClientError::Transport(_)) => {
                self.reply_errors(slot, &format!("ERR rampkv: {error}"), pending.replies());
                self.fail_driver(error);
            }
            Err(error) => self.reply_errors(slot, &format!("ERR rampkv: {error}"), pending.replies()),
        }
    }

    /// Answers `count` commands with the same error.
    fn reply_errors(&mut self, slot: usize, message: &str, count: usize) {
        if let Some(connection) = self.connections[slot].as_mut() {
            connection.outgoing.append(|out| write_errors(out, message, count));
        }
    }

    /// Answers `count` commands that the cluster cannot serve now, with why.
    fn reply_unavailable(&mut self, slot: usize, count: usize) {
        let message = format!("ERR rampkv cluster unavailable: {}", self.driver_error);
        self.reply_errors(slot, &message, count);
    }

    /// The driver, reconnecting it if it failed and the last attempt is long enough ago
    /// (`None`: unavailable, `driver_error` says why). Reconnecting blocks this thread for at
    /// most the connect and HELLO timeouts.
    fn driver(&mut self) -> Option<&mut GatewayDriver> {
        if self.driver.is_none() && self.last_reconnect.elapsed() >= RECONNECT_INTERVAL {
            self.last_reconnect = Instant::now();
            let in_process = self.in_process.as_ref();
            let (registry, waker) = (self.poll.registry(), &self.waker);
            match connect_driver(registry, waker, &self.cluster, in_process, self.sessions.len(), self.txn_options) {
                Ok(driver) => self.driver = Some(driver),
                Err(error) => self.driver_error = error.to_string(),
            }
        }
        self.driver.as_mut()
    }

    /// Reads the server replies that arrived (never blocks) and answers finished commands.
    ///
    /// Steps only when there is something to send or read, or deadlines to check (a step scans
    /// every session for expired transactions). Steps again if the first step's replies queued
    /// requests (a write's COMMIT, a read's second round), so that they leave now rather than
    /// after the loop's next wait.
    fn step_driver(&mut self) {
        for _ in 0..2 {
            let Some(driver) = self.driver.as_mut() else {
                return;
            };
            if driver.active() == 0 {
                return;
            }
            let now = Instant::now();
            let check_deadlines = now >= self.next_deadline_check;
            if !check_deadlines && !driver.transport().work_pending() && !driver.has_ready() {
                return;
            }
            if check_deadlines {
                self.next_deadline_check = now + IN_FLIGHT_POLL_TIMEOUT;
            }
            let mut completions = std::mem::take(&mut self.completions);
            let stepped = driver.step(Some(Duration::ZERO), &mut completions);
            for completion in completions.drain(..) {
                self.complete(completion);
            }
            self.completions = completions;
            if let Err(error) = stepped {
                return self.fail_driver(error);
            }
        }
    }

    /// The driver is broken for good: answer every command whose transaction was in flight.
    fn fail_driver(&mut self, error: ClientError) {
        self.driver = None;
        self.driver_error = error.to_string();
        self.last_reconnect = Instant::now();
        let message = format!("ERR rampkv: the connection to the cluster failed: {error}");
        for session in 0..self.sessions.len() {
            let state = &mut self.sessions[session];
            if !state.in_flight {
                continue;
            }
            state.in_flight = false;
            match state.owner {
                None => self.free_sessions.push(session),
                Some(slot) => {
                    let connection = self.connections[slot].as_mut().expect("a session's owner is open");
                    let count = connection.pending.take().map_or(0, |pending| pending.replies());
                    connection.outgoing.append(|out| write_errors(out, &message, count));
                    self.enqueue(slot);
                }
            }
        }
    }

    /// Answers the command a finished transaction belongs to.
    fn complete(&mut self, completion: Completion) {
        let session = completion.session;
        let state = &mut self.sessions[session];
        debug_assert!(state.in_flight);
        state.in_flight = false;
        let Some(slot) = state.owner else {
            self.free_sessions.push(session); // an orphan: its connection is gone
            return;
        };
        let connection = self.connections[slot].as_mut().expect("a session's owner is open");
        let pending = connection.pending.take().expect("a finished transaction answers a pending command");
        let protocol = connection.protocol;
        let out = &mut connection.outgoing;
        match (pending, completion.result) {
            (pending, Err(error)) => out.append(|out| write_errors(out, &transaction_error(&error), pending.replies())),
            (Pending::Reads(commands), Ok(TxnResult::Read(outcome))) => {
                out.append(|out| write_read_replies(out, protocol, &commands, &outcome));
            }
            (Pending::DeleteRead, Ok(TxnResult::Read(outcome))) => return self.delete_present(slot, outcome),
            (Pending::Writes { commands }, Ok(TxnResult::Write(_))) => out.append(|out| {
                for _ in 0..commands {
                    codec::write_simple(out, b"OK");
                }
            }),
            (Pending::DeleteWrite { removed }, Ok(TxnResult::Write(_))) => {
                out.append(|out| codec::write_integer(out, removed));
            }
            (pending, Ok(result)) => {
                debug_assert!(false, "{pending:?} finished with {result:?}");
                out.append(|out| codec::write_error(out, b"ERR internal error: mismatched transaction result"));
            }
        }
        self.enqueue(slot);
    }

    /// DEL's second step: tombstones for every key in one write; the reply counts the distinct
    /// keys that were present.
    fn delete_present(&mut self, slot: usize, outcome: ReadOutcome) {
        let mut distinct = AHashSet::with_capacity(outcome.items.len());
        let mut removed = 0;
        for item in &outcome.items {
            if distinct.insert(&item.key[..]) && value::decode(item.ts, &item.value).is_some() {
                removed += 1;
            }
        }
        let tombstones = distinct.into_iter().map(|key| (key.to_vec(), value::tombstone())).collect();
        self.begin_write(slot, tombstones, Pending::DeleteWrite { removed });
        self.enqueue(slot);
    }
}

impl Connection {
    /// The parser's limits for this connection: Redis's small ones until it has logged in.
    fn request_limits(&self) -> RequestLimits {
        if self.permissions.authenticated() {
            RequestLimits::AUTHENTICATED
        } else {
            RequestLimits::UNAUTHENTICATED
        }
    }

    /// Logs the connection in as `user` if `password` is right; a failure changes nothing
    /// (an authenticated connection stays logged in as before, as in Redis).
    fn log_in(&mut self, users: &Users, user: &[u8], password: &[u8]) -> bool {
        let Some(id) = users.authenticate(user, password) else {
            return false;
        };
        self.user = Some(id);
        self.permissions = users.permissions(Some(id));
        true
    }
}

impl Pending {
    /// How many commands wait on the transaction: each gets a reply, an error included.
    fn replies(&self) -> usize {
        match self {
            Pending::Reads(commands) => commands.len(),
            Pending::Writes { commands } => *commands,
            Pending::DeleteRead | Pending::DeleteWrite { .. } => 1,
        }
    }
}

/// The Redis error for a failed transaction. Partitions that no reachable server holds get
/// Redis Cluster's `CLUSTERDOWN` code (clients treat it as "the cluster cannot serve this now,
/// retry later"), with the partitions named; other commands keep working.
fn transaction_error(error: &ClientError) -> String {
    match error {
        ClientError::Unavailable { .. } => format!("CLUSTERDOWN rampkv: {error}"),
        error => format!("ERR rampkv: {error}"),
    }
}

fn write_errors(out: &mut Vec<u8>, message: &str, count: usize) {
    for _ in 0..count {
        codec::write_error(out, message.as_bytes());
    }
}

/// The replies of a batch of read commands, each from its slice of the read's items.
fn write_read_replies(out: &mut Vec<u8>, protocol: Protocol, commands: &[ReadCommand], outcome: &ReadOutcome) {
    let mut items = outcome.items.iter().map(|item| value::decode(item.ts, &item.value));
    let write_value = |out: &mut Vec<u8>, value: Option<&[u8]>| match value {
        Some(bytes) => codec::write_bulk(out, bytes),
        None => codec::write_null(out, protocol),
    };
    for command in commands {
        match *command {
            ReadCommand::Get => write_value(out, items.next().expect("one item per key")),
            ReadCommand::MultiGet { keys } => {
                codec::write_array_header(out, keys);
                for value in items.by_ref().take(keys) {
                    write_value(out, value);
                }
            }
            ReadCommand::Exists { keys } => {
                let present = items.by_ref().take(keys).filter(Option::is_some).count();
                codec::write_integer(out, present as i64);
            }
        }
    }
    debug_assert!(items.next().is_none(), "every item answered");
}

/// HELLO's reply: a map in RESP3, a flat array of names and values in RESP2.
fn hello_reply(protocol: Protocol, id: u64) -> Frame {
    let field = |name: &str, value: Frame| (Frame::bulk(name), value);
    Frame::Map(vec![
        field("server", Frame::bulk("rampkv")),
        field("version", Frame::bulk(REDIS_COMPATIBLE_VERSION)),
        field("proto", Frame::Integer(protocol.number())),
        field("id", Frame::Integer(i64::try_from(id).unwrap_or(i64::MAX))),
        field("mode", Frame::bulk("standalone")),
        field("role", Frame::bulk("master")),
        field("modules", Frame::Array(Vec::new())),
    ])
}

/// INFO's text: the fields redis-cli and redis-benchmark read, plus rampkv's own.
fn info_text(stats: &Stats, connected: usize) -> Vec<u8> {
    let uptime = stats.started.elapsed().as_secs();
    let lines = [
        "# Server".to_string(),
        format!("redis_version:{REDIS_COMPATIBLE_VERSION}"),
        format!("rampkv_version:{}", env!("CARGO_PKG_VERSION")),
        "redis_mode:standalone".to_string(),
        format!("os:{} {}", std::env::consts::OS, std::env::consts::ARCH),
        format!("arch_bits:{}", usize::BITS),
        format!("process_id:{}", std::process::id()),
        format!("tcp_port:{}", stats.port),
        format!("uptime_in_seconds:{uptime}"),
        format!("uptime_in_days:{}", uptime / 86_400),
        String::new(),
        "# Clients".to_string(),
        format!("connected_clients:{connected}"),
        format!("maxclients:{}", stats.sessions),
        String::new(),
        "# Stats".to_string(),
        format!("total_connections_received:{}", stats.connections_received),
        format!("total_commands_processed:{}", stats.commands_processed),
        format!("rejected_connections:{}", stats.connections_rejected),
        String::new(),
        "# Keyspace".to_string(),
    ];
    let mut text = lines.join("\r\n");
    text.push_str("\r\n");
    text.into_bytes()
}
