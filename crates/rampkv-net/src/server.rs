//! The server event loop: one poller thread serves one or more servers and all their
//! connections.
//!
//! Each server has its own listener and its own [`ServerCore`] (its own store). The loop reads
//! every complete frame a connection has sent, answers each in order into that connection's
//! output buffer, and writes the buffer with as few system calls as the socket takes. Nothing
//! spins: the thread blocks in `epoll` when idle.
//!
//! # Fault model for bad input
//! - A frame whose header is invalid (bad version, reserved bits, body over the maximum) gets
//!   an error reply and the connection is closed after that reply: the stream cannot be
//!   resynchronised.
//! - A frame whose header is valid but whose body does not decode gets an error reply and the
//!   connection goes on.
//! - A connection that ends in the middle of a frame is closed; the partial frame is ignored.
//! - A client that does not read its replies stops being read once
//!   `CONNECTION_WRITE_BUFFER_BYTES_MAX` of replies wait for it (back-pressure).
//!
//! None of these changes the store, and other connections are served throughout.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::recovery::{spawn_resolver, Resolver};
use crate::server_writepoll::{is_ring_connection, DeferredExchange};
use crate::transport::tcp::{poll_spinning, ReadStatus, StreamBuffer};
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{CONNECTION_WRITE_BUFFER_BYTES_MAX, GC_GRACE_MS, SERVER_CONNECTIONS_MAX};
use rampkv_core::protocol::server::{DeferredReply, ServerCore};
use rampkv_core::wire::{FrameHeader, Response};

const WAKER_TOKEN: Token = Token(usize::MAX);
const EVENTS_CAPACITY: usize = 1024;

/// Settings of one server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// How long superseded versions stay readable.
    pub gc_grace_ms: u64,
}

impl ServerConfig {
    /// A server on `listen` with the default garbage-collection grace period.
    pub fn new(listen: SocketAddr) -> Self {
        Self { listen, gc_grace_ms: GC_GRACE_MS }
    }
}

/// A running group of servers sharing one poller thread. Dropping it stops them.
#[derive(Debug)]
pub struct ServerGroup {
    addresses: Vec<SocketAddr>,
    cores: Vec<Arc<ServerCore>>,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    /// The clock the event loop stamps prepares with (recovery measures staleness with it).
    clock: Instant,
    resolver: Option<Resolver>,
    /// Deferred replies to and from a ring front end serving the same cores.
    exchange: Arc<DeferredExchange>,
}

impl ServerGroup {
    /// Binds every server's listener, then starts the poller thread.
    pub fn spawn(configs: &[ServerConfig]) -> std::io::Result<ServerGroup> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let mut listeners = Vec::with_capacity(configs.len());
        let mut addresses = Vec::with_capacity(configs.len());
        let mut cores = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            let mut listener = TcpListener::bind(config.listen)?;
            poll.registry().register(&mut listener, Token(index), Interest::READABLE)?;
            addresses.push(listener.local_addr()?);
            let core = Arc::new(ServerCore::new(config.gc_grace_ms));
            listeners.push((listener, Arc::clone(&core)));
            cores.push(core);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let clock = Instant::now();
        let exchange = Arc::new(DeferredExchange::new(Arc::clone(&waker)));
        let event_loop = EventLoop::new(poll, listeners, Arc::clone(&stop), clock, Arc::clone(&exchange));
        let thread = std::thread::Builder::new().name("rampkv-server".into()).spawn(move || event_loop.run())?;
        Ok(ServerGroup { addresses, cores, stop, waker, thread: Some(thread), clock, resolver: None, exchange })
    }

    /// Starts cooperative termination for these servers, which are servers
    /// `first_index..first_index + count` of `cluster`: transactions prepared longer than
    /// `timeout_ms` ago and not committed are resolved with the other participants.
    pub fn start_recovery(&mut self, cluster: Cluster, first_index: usize, timeout_ms: u64) -> std::io::Result<()> {
        if first_index + self.cores.len() > cluster.servers().len() {
            return Err(std::io::Error::other("these servers are not all in the cluster"));
        }
        let resolver = spawn_resolver(self.cores.clone(), first_index, cluster, self.clock, timeout_ms)?;
        self.resolver = Some(resolver);
        Ok(())
    }

    /// The bound address of every server, in configuration order.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// The clock the poller stamps prepares with (another front end serving these cores, such
    /// as [`crate::server_writepoll::WritePollGroup`], must use the same one).
    pub fn clock(&self) -> Instant {
        self.clock
    }

    /// Where deferred replies cross to and from a ring front end of these cores.
    pub fn deferred_exchange(&self) -> &Arc<DeferredExchange> {
        &self.exchange
    }

    /// The request-handling core of every server (for statistics).
    pub fn cores(&self) -> &[Arc<ServerCore>] {
        &self.cores
    }

    /// Stops the poller and waits for it; returns its result.
    pub fn shutdown(mut self) -> std::io::Result<()> {
        self.stop_and_join()
    }

    /// Blocks until the poller thread ends (it ends only on an I/O error of the poller).
    pub fn wait(mut self) -> std::io::Result<()> {
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| Err(std::io::Error::other("server thread panicked"))),
            None => Ok(()),
        }
    }

    fn stop_and_join(&mut self) -> std::io::Result<()> {
        self.resolver = None; // stops the resolver first: it talks to these servers
        self.stop.store(true, Ordering::Release);
        self.waker.wake()?;
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| Err(std::io::Error::other("server thread panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for ServerGroup {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

#[derive(Debug)]
struct Connection {
    /// `generation << 32 | slot`: unique for the loop's lifetime, so a deferred reply never
    /// reaches a newer connection that reuses the slot.
    id: u64,
    stream: TcpStream,
    core: Arc<ServerCore>,
    incoming: StreamBuffer,
    outgoing: StreamBuffer,
    /// The socket has no more bytes for now (edge-triggered: read again only after an event).
    read_drained: bool,
    /// epoll reported the peer's end of stream: read until EOF, not only until a short read
    /// (the FIN may have arrived with the last data, and no further event will come).
    peer_finished: bool,
    /// The peer finished sending, or the stream is broken: close once replies are written.
    closing: bool,
    wants_writable: bool,
}

struct EventLoop {
    poll: Poll,
    listeners: Vec<(TcpListener, Arc<ServerCore>)>,
    connections: Vec<Option<Connection>>,
    free_slots: Vec<usize>,
    stop: Arc<AtomicBool>,
    started: Instant,
    generation: u64,
    /// Replies to requests that waited (S2PL locks), to hand to their connections.
    deferred: Vec<DeferredReply>,
    exchange: Arc<DeferredExchange>,
}

impl EventLoop {
    fn new(
        poll: Poll,
        listeners: Vec<(TcpListener, Arc<ServerCore>)>,
        stop: Arc<AtomicBool>,
        clock: Instant,
        exchange: Arc<DeferredExchange>,
    ) -> Self {
        Self {
            poll,
            listeners,
            connections: Vec::new(),
            free_slots: Vec::new(),
            stop,
            started: clock,
            generation: 0,
            deferred: Vec::new(),
            exchange,
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// How long the poller may sleep: until the next lock wait expires, or indefinitely.
    fn poll_timeout(&self) -> Option<std::time::Duration> {
        let deadline = self.listeners.iter().filter_map(|(_, core)| core.next_lock_deadline_ms()).min()?;
        Some(std::time::Duration::from_millis(deadline.saturating_sub(self.now_ms()) + 1))
    }

    /// Aborts expired lock waits and delivers every deferred reply.
    fn deliver_deferred(&mut self, now_ms: u64) {
        for (_, core) in &self.listeners {
            if core.next_lock_deadline_ms().is_some_and(|deadline| deadline <= now_ms) {
                core.expire_lock_waits(now_ms, &mut self.deferred);
            }
        }
        self.exchange.take_for_tcp(&mut self.deferred);
        while let Some(reply) = self.deferred.pop() {
            if is_ring_connection(reply.connection) {
                self.exchange.send_to_rings(reply); // served by the ring poller
                continue;
            }
            let slot = (reply.connection & 0xFFFF_FFFF) as usize;
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else {
                continue; // the connection closed: nobody to tell
            };
            if connection.id != reply.connection || connection.closing {
                continue;
            }
            connection.outgoing.append(|out| out.extend_from_slice(&reply.frame));
            self.drive(slot, now_ms);
        }
    }

    fn run(mut self) -> std::io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.stop.load(Ordering::Acquire) {
            let timeout = self.poll_timeout();
            poll_spinning(&mut self.poll, &mut events, timeout)?;
            let now_ms = self.now_ms();
            for event in events.iter() {
                let token = event.token();
                if token == WAKER_TOKEN {
                    continue;
                }
                if token.0 < self.listeners.len() {
                    self.accept(token.0)?;
                } else {
                    let slot = token.0 - self.listeners.len();
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        if let Some(connection) = self.connections[slot].as_mut() {
                            connection.read_drained = false;
                            connection.peer_finished |= event.is_read_closed() || event.is_error();
                        }
                    }
                    self.drive(slot, now_ms);
                }
            }
            self.deliver_deferred(now_ms);
        }
        Ok(())
    }

    fn accept(&mut self, listener_index: usize) -> std::io::Result<()> {
        loop {
            let (mut stream, _) = match self.listeners[listener_index].0.accept() {
                Ok(accepted) => accepted,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                // A connection that failed during accept (reset, out of descriptors) only
                // affects that connection; keep serving the others.
                Err(_) => return Ok(()),
            };
            let open = self.connections.len() - self.free_slots.len();
            if open >= SERVER_CONNECTIONS_MAX {
                continue; // dropped: refused
            }
            let _ = stream.set_nodelay(true);
            let slot = self.free_slots.pop().unwrap_or_else(|| {
                self.connections.push(None);
                self.connections.len() - 1
            });
            let token = Token(self.listeners.len() + slot);
            if self.poll.registry().register(&mut stream, token, Interest::READABLE).is_err() {
                self.free_slots.push(slot);
                continue;
            }
            self.generation += 1;
            self.connections[slot] = Some(Connection {
                id: (self.generation << 32) | slot as u64,
                stream,
                core: Arc::clone(&self.listeners[listener_index].1),
                incoming: StreamBuffer::default(),
                outgoing: StreamBuffer::default(),
                read_drained: false,
                peer_finished: false,
                closing: false,
                wants_writable: false,
            });
        }
    }

    /// Reads, serves and writes a connection until it would block; closes it when done.
    fn drive(&mut self, slot: usize, now_ms: u64) {
        let Some(connection) = self.connections[slot].as_mut() else {
            return;
        };
        let keep = serve(connection, now_ms, &mut self.deferred);
        let token = Token(self.listeners.len() + slot);
        if keep && connection.wants_writable == connection.outgoing.is_empty() {
            let interest = if connection.outgoing.is_empty() {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            if self.poll.registry().reregister(&mut connection.stream, token, interest).is_ok() {
                connection.wants_writable = !connection.outgoing.is_empty();
                return;
            }
        } else if keep {
            return;
        }
        if let Some(mut connection) = self.connections[slot].take() {
            let _ = self.poll.registry().deregister(&mut connection.stream);
            connection.core.connection_closed(connection.id, &mut self.deferred);
            self.free_slots.push(slot);
        }
    }
}

/// Serves what the connection has; false when it should be closed now.
fn serve(connection: &mut Connection, now_ms: u64, deferred: &mut Vec<DeferredReply>) -> bool {
    loop {
        if !connection.closing && !process_frames(connection, now_ms, deferred) {
            connection.closing = true; // an invalid header: reply queued, then close
        }
        match connection.outgoing.write_to(&mut connection.stream) {
            Ok(true) if connection.closing => return false,
            Ok(_) => {}
            Err(_) => return false,
        }
        let backlogged = connection.outgoing.len() > CONNECTION_WRITE_BUFFER_BYTES_MAX;
        if backlogged || connection.read_drained || connection.closing {
            return true;
        }
        let room = connection.incoming.room_for_next_frame();
        match connection.incoming.read_from(&mut connection.stream, room) {
            Ok(ReadStatus::EndOfStream) => connection.closing = true,
            Ok(ReadStatus::Drained) => connection.read_drained = !connection.peer_finished,
            Ok(ReadStatus::MoreMayFollow) => {}
            Err(error) if error.kind() == ErrorKind::WouldBlock => connection.read_drained = true,
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Answers every complete frame at the front of the input while the output has room.
/// Returns false when a frame header is invalid (an error reply has been queued).
fn process_frames(connection: &mut Connection, now_ms: u64, deferred: &mut Vec<DeferredReply>) -> bool {
    while connection.outgoing.len() <= CONNECTION_WRITE_BUFFER_BYTES_MAX {
        let pending = connection.incoming.pending();
        let (header, body) = match FrameHeader::split(pending) {
            Ok(Some(split)) => split,
            Ok(None) => return true,
            Err(error) => {
                let request_id = pending.get(8..16).map_or(0, |id| u64::from_le_bytes(id.try_into().expect("8 bytes")));
                let reply = Response::bad_request(format!("invalid frame header: {error}; closing the connection"));
                connection.outgoing.append(|out| reply.encode_frame(request_id, out));
                return false;
            }
        };
        let (core, id) = (&connection.core, connection.id);
        connection
            .outgoing
            .append(|out| core.handle_frame(id, header.kind, header.request_id, body, now_ms, out, deferred));
        connection.incoming.consume(header.frame_bytes());
    }
    true
}
