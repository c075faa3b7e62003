//! The gateway's transport to the rampkv servers: TCP, with the server sockets registered in the
//! gateway's own poller, so that one thread waits for RESP clients and servers in one `epoll`.
//!
//! [`rampkv_net::transport::tcp::TcpClientTransport`] owns a poller and blocks (after a short spin) in
//! it; a gateway using it must alternate between two pollers, and a RESP request that arrives
//! while it waits for servers waits too. This transport never blocks in the event loop: the loop
//! waits for every socket at once, marks the servers whose sockets are ready in [`TransportSignals`],
//! and steps the driver, whose [`ClientTransport::poll`] then reads only those sockets. Frames
//! and their checks are the wire format's ([`rampkv_core::wire`]), as in the TCP transport.
//!
//! In a process that also runs the servers (`rampkv local`), the gateway can skip the sockets:
//! [`SharedPollTransport::in_process`] hands each request to the server core directly
//! ([`LocalTransport`]) and marks the replies ready for the loop's next step.
//!
//! The one blocking wait is the HELLO at connect time, before the loop runs: a poll with a
//! non-zero timeout reads every socket and sleeps between attempts (backing off from 20 µs to
//! 1 ms) until a reply comes or the timeout passes.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Registry, Token};

use rampkv_core::wire::{Request, Response};
use rampkv_net::transport::local::LocalTransport;
use rampkv_net::transport::tcp::ServerConnection;
use rampkv_net::transport::{ClientTransport, TransportError};

/// Sleeps between the attempts of a blocking poll: from the first to the last, doubling.
const BLOCKING_POLL_SLEEP_FIRST: Duration = Duration::from_micros(20);
const BLOCKING_POLL_SLEEP_LAST: Duration = Duration::from_millis(1);

/// Token of server `index` in the gateway's poller: far above the RESP connection slots.
pub(crate) fn server_token(index: usize) -> Token {
    Token(SERVER_TOKEN_BASE + index)
}

/// First token of the servers; RESP connections use the tokens below it.
pub(crate) const SERVER_TOKEN_BASE: usize = 1 << 40;

const READY_READABLE: u8 = 1;
/// epoll reported the server's end of stream: read to EOF, not only to a short read.
const READY_FINISHED: u8 = 2;

/// What the event loop and the transport tell each other (both run on the loop's thread; the
/// atomics only make the shared value `Send`): which server sockets were seen ready since the
/// transport last read them, and whether requests wait to be sent. The loop steps the driver
/// only when one of them says there is something to do.
#[derive(Debug)]
pub(crate) struct TransportSignals {
    servers: Vec<AtomicU8>,
    any_ready: AtomicBool,
    unsent: AtomicBool,
}

impl TransportSignals {
    fn new(servers: usize) -> Self {
        Self {
            servers: (0..servers).map(|_| AtomicU8::new(0)).collect(),
            any_ready: AtomicBool::new(false),
            unsent: AtomicBool::new(false),
        }
    }

    /// Records a readiness event of `server` (called by the event loop).
    pub(crate) fn mark(&self, server: usize, finished: bool) {
        let bits = READY_READABLE | if finished { READY_FINISHED } else { 0 };
        if let Some(flags) = self.servers.get(server) {
            flags.fetch_or(bits, Ordering::Relaxed);
            self.any_ready.store(true, Ordering::Relaxed);
        }
    }

    /// Records a WRITABLE event of a server whose last write was partial.
    pub(crate) fn mark_writable(&self) {
        self.unsent.store(true, Ordering::Relaxed);
    }

    /// True if a step of the driver has something to send or to read.
    pub(crate) fn work_pending(&self) -> bool {
        self.any_ready.load(Ordering::Relaxed) || self.unsent.load(Ordering::Relaxed)
    }

    fn take(&self, server: usize) -> u8 {
        self.servers[server].swap(0, Ordering::Relaxed)
    }
}

/// TCP connections to every server, registered in a poller the gateway owns.
#[derive(Debug)]
pub(crate) struct SharedPollTransport {
    registry: Registry,
    connections: Vec<ServerConnection>,
    /// Set when the servers are in this process: every request goes here, none to a socket.
    local: Option<LocalTransport>,
    ready: Arc<TransportSignals>,
}

impl SharedPollTransport {
    /// Connects to every address (server i is `addresses[i]`) and registers the sockets in
    /// `registry` under [`server_token`]. The returned flags are for the event loop.
    pub(crate) fn connect(
        registry: &Registry,
        addresses: &[String],
    ) -> Result<(Self, Arc<TransportSignals>), TransportError> {
        let registry = registry.try_clone().map_err(|error| TransportError::Io { server: 0, error })?;
        let connections = addresses
            .iter()
            .enumerate()
            .map(|(server, address)| ServerConnection::connect(server, address, &registry, server_token(server)))
            .collect::<Result<_, _>>()?;
        let ready = Arc::new(TransportSignals::new(addresses.len()));
        Ok((Self { registry, connections, local: None, ready: Arc::clone(&ready) }, ready))
    }

    /// Reaches the servers of this process through `local` instead of sockets.
    pub(crate) fn in_process(
        registry: &Registry,
        local: LocalTransport,
    ) -> Result<(Self, Arc<TransportSignals>), TransportError> {
        let registry = registry.try_clone().map_err(|error| TransportError::Io { server: 0, error })?;
        let ready = Arc::new(TransportSignals::new(local.server_count()));
        Ok((Self { registry, connections: Vec::new(), local: Some(local), ready: Arc::clone(&ready) }, ready))
    }

    /// Reads every server the event loop marked ready.
    fn read_marked<F>(&mut self, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut delivered = 0;
        self.ready.any_ready.store(false, Ordering::Relaxed);
        for server in 0..self.connections.len() {
            let flags = self.ready.take(server);
            if flags & READY_READABLE != 0 {
                delivered += self.connections[server].read(server, flags & READY_FINISHED != 0, deliver)?;
            }
        }
        Ok(delivered)
    }

    /// Reads every server, sleeping between attempts, until something arrives or `timeout`.
    fn read_blocking<F>(&mut self, timeout: Option<Duration>, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let deadline = timeout.map(|timeout| Instant::now() + timeout);
        let mut sleep = BLOCKING_POLL_SLEEP_FIRST;
        loop {
            let mut delivered = 0;
            for server in 0..self.connections.len() {
                delivered += self.connections[server].read(server, false, deliver)?;
            }
            let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            if delivered > 0 || left == Some(Duration::ZERO) {
                return Ok(delivered);
            }
            std::thread::sleep(left.map_or(sleep, |left| left.min(sleep)));
            sleep = (sleep * 2).min(BLOCKING_POLL_SLEEP_LAST);
        }
    }
}

impl ClientTransport for SharedPollTransport {
    fn server_count(&self) -> usize {
        self.local.as_ref().map_or(self.connections.len(), LocalTransport::server_count)
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        if let Some(local) = self.local.as_mut() {
            local.post(server, request_id, request)?;
            self.ready.any_ready.store(true, Ordering::Relaxed); // its reply is there to read
            return Ok(());
        }
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        connection.post(request_id, request);
        self.ready.unsent.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn post_owned(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        match self.local.as_mut() {
            Some(local) => {
                local.post_owned(server, request_id, request)?;
                self.ready.any_ready.store(true, Ordering::Relaxed); // its reply is there to read
                Ok(())
            }
            None => self.post(server, request_id, &request),
        }
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        for (server, connection) in self.connections.iter_mut().enumerate() {
            if connection.has_outgoing() {
                connection.write(server, &self.registry, server_token(server))?;
            }
        }
        // What a partial write left waits for the socket's WRITABLE event (mark_writable).
        self.ready.unsent.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// With a zero timeout (the event loop's steps): reads the servers marked ready, never
    /// blocks. Otherwise (the HELLO at connect time): waits as the module docs say.
    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        if let Some(local) = self.local.as_mut() {
            self.ready.any_ready.store(false, Ordering::Relaxed);
            return local.poll(timeout, deliver);
        }
        if timeout == Some(Duration::ZERO) {
            self.read_marked(&mut deliver)
        } else {
            self.read_blocking(timeout, &mut deliver)
        }
    }
}
