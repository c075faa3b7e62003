//! The TCP adapter: one non-blocking socket per connection, frames of
//! [`rampkv_core::wire::frame`] on a byte stream, readiness from edge-triggered epoll (`mio`).
//!
//! A poller that finds nothing ready spins a while before it blocks in epoll, looking every
//! `POLL_SPIN_CHECK_US`, as long as spinning pays ([`PollSpin`]: on a loaded machine it does
//! not, and the spin's back-to-back `epoll_wait` calls were most of a transaction's system
//! calls).
//!
//! A channel reads only after epoll reported the socket readable ([`Channel::set_ready`]), and
//! stops at a short read: an edge-triggered epoll reports every later arrival as a new event,
//! which saves one `recvfrom` returning EAGAIN per readable event. It asks for WRITABLE events
//! only while a write is incomplete. Many logical clients multiplexed on one thread share each
//! system call: a `send` writes every frame queued since the last one.
//!
//! # Memory under hostile input
//! A stream buffer grows with the bytes that arrived: a read asks for room of at least
//! `STREAM_READ_CHUNK_BYTES` and at most what is buffered already, so a 17-byte prefix declaring
//! a 20 MiB frame costs one chunk, and a frame that really arrives grows its buffer by doubling.
//! A buffer that empties while holding more than `STREAM_BUFFER_KEEP_BYTES` gives its memory
//! back. The server front end ([`TcpServer`]) refuses connections past its cap and past its
//! per-source-address cap; the poller holds every connection to its byte budgets and timeouts.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};

use super::{Channel, ChannelError, ClientMedium, FrontEvent, OpenMedium, ServerMedium, Wake};
use crate::auth::{authenticate_client, SharedSecret};
use rampkv_core::limits::{
    FRAME_BODY_BYTES_MAX, POLL_SPIN_CHECK_US, POLL_SPIN_US, SERVER_CONNECTIONS_MAX, SERVER_CONNECTIONS_PER_ADDRESS_MAX,
    STREAM_BUFFER_KEEP_BYTES, STREAM_READ_CHUNK_BYTES,
};
use rampkv_core::wire::{FrameHeader, FRAME_HEADER_BYTES};

/// How long connecting to one server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Readiness events taken per poll.
const EVENTS_CAPACITY: usize = 1024;
/// The token of a poller's waker.
const WAKER_TOKEN: Token = Token(usize::MAX);

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStatus {
    /// The peer closed its side.
    EndOfStream,
    /// Bytes were read and the socket had no more.
    Drained,
    /// The buffer filled up: there may be more to read.
    MoreMayFollow,
}

/// A byte buffer that is consumed from the front and appended at the back.
///
/// `bytes[start..end]` holds the pending data. The vector's length is its initialised size:
/// it is zero-filled once when it grows, never per read, so reading into the spare room costs
/// no `memset`.
#[derive(Debug, Default)]
pub struct StreamBuffer {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
}

impl StreamBuffer {
    pub fn pending(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
    pub fn len(&self) -> usize {
        self.end - self.start
    }
    pub fn consume(&mut self, count: usize) {
        self.start += count;
        debug_assert!(self.start <= self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.bytes.len() > STREAM_BUFFER_KEEP_BYTES {
                self.bytes = Vec::new(); // one large frame does not pin its size
            }
        }
    }

    /// Bytes of memory the buffer holds (initialised: what a read may have written).
    pub fn held_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Moves pending bytes to the front when most of the buffer is consumed.
    fn compact(&mut self) {
        if self.start > 0 && self.start >= self.end / 2 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Appends whatever `encode` writes to the vector it is given.
    pub fn append(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        self.compact();
        self.bytes.truncate(self.end);
        encode(&mut self.bytes);
        self.end = self.bytes.len();
    }

    /// Reads what `source` has into the buffer, with room for `room_bytes` (what the frame at
    /// the front still lacks), but at least `STREAM_READ_CHUNK_BYTES` and at most as much as is
    /// buffered already: the buffer grows with the bytes that arrive, never with a length the
    /// peer declared. `WouldBlock` comes back as that error. A read that did not fill the room
    /// means the socket's receive queue is empty now (`Drained`).
    pub fn read_from(&mut self, source: &mut impl Read, room_bytes: usize) -> std::io::Result<ReadStatus> {
        self.compact();
        let room_bytes = room_bytes.min(self.len()).max(STREAM_READ_CHUNK_BYTES);
        let wanted = self.end + room_bytes;
        if self.bytes.len() < wanted {
            // Exact: the doubling is the caller's (room at most what is buffered).
            self.bytes.reserve_exact(wanted - self.bytes.len());
            self.bytes.resize(wanted, 0);
        }
        let room = self.bytes.len() - self.end;
        let read = source.read(&mut self.bytes[self.end..])?;
        self.end += read;
        Ok(match read {
            0 => ReadStatus::EndOfStream,
            read if read < room => ReadStatus::Drained,
            _ => ReadStatus::MoreMayFollow,
        })
    }

    /// Writes as much as `sink` takes; Ok(true) when everything was written.
    pub fn write_to(&mut self, sink: &mut impl Write) -> std::io::Result<bool> {
        while !self.is_empty() {
            match write_some(sink, self.pending())? {
                0 => return Ok(false),
                written => self.consume(written),
            }
        }
        Ok(true)
    }

    /// Room to ask for so that the frame at the front (if its header is here) fits whole.
    pub fn room_for_next_frame(&self) -> usize {
        let pending = self.pending();
        match pending.get(..FRAME_HEADER_BYTES) {
            Some(header) => {
                let body = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
                (FRAME_HEADER_BYTES + body.min(FRAME_BODY_BYTES_MAX)).saturating_sub(pending.len())
            }
            None => FRAME_HEADER_BYTES,
        }
    }
}

/// Writes as much of `bytes` as `sink` takes without blocking (0 on `WouldBlock`).
fn write_some(sink: &mut impl Write, bytes: &[u8]) -> std::io::Result<usize> {
    loop {
        match sink.write(bytes) {
            Ok(0) if !bytes.is_empty() => return Err(ErrorKind::WriteZero.into()),
            Ok(written) => return Ok(written),
            Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(0),
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        }
    }
}

/// One TCP connection, registered with an epoll poller under `token`.
#[derive(Debug)]
pub struct TcpChannel {
    stream: TcpStream,
    /// The peer's address, for what the server logs (none if the socket could not tell).
    peer: Option<SocketAddr>,
    incoming: StreamBuffer,
    registry: Arc<Registry>,
    token: Token,
    /// epoll reported data since the last short read.
    readable: bool,
    /// epoll reported the peer's end: read until EOF, not only until a short read (the FIN may
    /// have arrived with the last data, and no further event will come).
    peer_finished: bool,
    /// WRITABLE interest is registered (only while a write is incomplete).
    wants_writable: bool,
    writable: bool,
}

impl TcpChannel {
    /// Registers `stream` under `token` for reading.
    pub fn new(mut stream: TcpStream, registry: Arc<Registry>, token: Token) -> std::io::Result<Self> {
        let _ = stream.set_nodelay(true);
        registry.register(&mut stream, token, Interest::READABLE)?;
        Ok(Self {
            peer: stream.peer_addr().ok(),
            stream,
            incoming: StreamBuffer::default(),
            registry,
            token,
            readable: true,
            peer_finished: false,
            wants_writable: false,
            writable: false,
        })
    }

    /// Connects to `address` (blocking, bounded), authenticates with this process's client
    /// secret if it has one (`crate::auth::client_secret`), and registers the socket under
    /// `token`.
    pub fn connect(address: &str, registry: Arc<Registry>, token: Token) -> Result<Self, ChannelError> {
        Self::connect_with_secret(address, registry, token, crate::auth::client_secret().as_deref())
    }

    /// [`TcpChannel::connect`] proving `secret` (None: no authentication step).
    pub fn connect_with_secret(
        address: &str,
        registry: Arc<Registry>,
        token: Token,
        secret: Option<&SharedSecret>,
    ) -> Result<Self, ChannelError> {
        let socket_address = address
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing"))?;
        let mut stream = std::net::TcpStream::connect_timeout(&socket_address, CONNECT_TIMEOUT)?;
        if let Some(secret) = secret {
            authenticate_client(&mut stream, secret)?;
        }
        stream.set_nonblocking(true)?;
        Ok(Self::new(TcpStream::from_std(stream), registry, token)?)
    }

    /// Deregisters the socket (it closes when dropped).
    pub fn deregister(&mut self) {
        let _ = self.registry.deregister(&mut self.stream);
    }
}

impl Channel for TcpChannel {
    const STREAM: bool = true;

    fn frame_bytes_max(&self) -> usize {
        FRAME_HEADER_BYTES + FRAME_BODY_BYTES_MAX
    }

    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        let mut written = 0;
        while written < frames.len() {
            match write_some(&mut self.stream, &frames[written..])? {
                0 => break,
                count => written += count,
            }
        }
        let done = written == frames.len();
        if done == self.wants_writable {
            let interest = if done { Interest::READABLE } else { Interest::READABLE | Interest::WRITABLE };
            self.registry.reregister(&mut self.stream, self.token, interest)?;
            self.wants_writable = !done;
        }
        self.writable = false;
        Ok(written)
    }

    fn receive(&mut self, mut consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        if !self.incoming.is_empty() {
            let taken = consume(self.incoming.pending());
            self.incoming.consume(taken);
        }
        if !self.readable {
            return Ok(false);
        }
        let room = self.incoming.room_for_next_frame();
        let status = match self.incoming.read_from(&mut self.stream, room) {
            Ok(status) => status,
            Err(error) if error.kind() == ErrorKind::WouldBlock => {
                self.readable = false;
                return Ok(false);
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => return Ok(true),
            Err(error) => return Err(error.into()),
        };
        let taken = consume(self.incoming.pending());
        self.incoming.consume(taken);
        match status {
            ReadStatus::EndOfStream => Err(ChannelError::Closed),
            ReadStatus::Drained => {
                self.readable = self.peer_finished;
                Ok(true)
            }
            ReadStatus::MoreMayFollow => Ok(true),
        }
    }

    fn readable(&self) -> bool {
        self.readable || matches!(FrameHeader::check(self.incoming.pending()), Ok(Some(_)) | Err(_))
    }

    /// The input buffer's memory while it holds bytes of a frame not yet served; an empty buffer
    /// counts nothing (its one read chunk is the fixed cost of an open connection, kept to save
    /// an allocation per read).
    fn buffered_bytes(&self) -> usize {
        if self.incoming.is_empty() {
            0
        } else {
            self.incoming.held_bytes()
        }
    }

    fn partial_frame(&self) -> bool {
        !self.incoming.is_empty()
    }

    fn peer_address(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn set_ready(&mut self, readable: bool, writable: bool, peer_finished: bool) {
        self.readable |= readable || peer_finished;
        self.writable |= writable;
        self.peer_finished |= peer_finished;
    }
}

/// The bounded spin of a TCP poller before it blocks in `epoll_wait`, adapted to what spinning
/// bought lately.
///
/// A spin saves a sleep and a wake-up when the next event comes within it (a reply a few
/// microseconds away on a quiet machine), but each look is an `epoll_wait` system call, and on a
/// busy machine the CPU it burns is taken from the peer that would send that event. So the
/// spin looks every `POLL_SPIN_CHECK_US` (not back to back), and its length follows the
/// outcome: an event caught while spinning, or one that woke the blocked poller within
/// `POLL_SPIN_US` of blocking (a longer spin would have caught it), doubles the budget (up to
/// `POLL_SPIN_US`); a spin that ran out and then waited longer halves it (down to none).
#[derive(Debug, Clone)]
pub struct PollSpin {
    budget_us: u64,
}

impl Default for PollSpin {
    /// Starts with the whole budget.
    fn default() -> Self {
        Self { budget_us: POLL_SPIN_US }
    }
}

const _: () = assert!(0 < POLL_SPIN_CHECK_US && POLL_SPIN_CHECK_US <= POLL_SPIN_US);

impl PollSpin {
    /// The spin budget now (µs): 0, or between `POLL_SPIN_CHECK_US` and `POLL_SPIN_US`.
    pub fn budget_us(&self) -> u64 {
        self.budget_us
    }

    /// Spinning paid (or would have): double the budget, at least one look's worth.
    fn grow(&mut self) {
        self.budget_us = (self.budget_us * 2).clamp(POLL_SPIN_CHECK_US, POLL_SPIN_US);
    }

    /// Spinning did not pay: halve the budget; below one look's worth, no spin at all.
    fn shrink(&mut self) {
        self.budget_us /= 2;
        if self.budget_us < POLL_SPIN_CHECK_US {
            self.budget_us = 0;
        }
    }

    /// Polls once without blocking; if nothing is ready, spins (looking every
    /// `POLL_SPIN_CHECK_US`) for up to the budget, then blocks for the rest of `timeout`.
    /// Returns with `events` empty on timeout or interruption.
    pub fn poll(&mut self, poll: &mut Poll, events: &mut Events, timeout: Option<Duration>) -> std::io::Result<()> {
        let look = |poll: &mut Poll, events: &mut Events, timeout| match poll.poll(events, timeout) {
            Err(error) if error.kind() != ErrorKind::Interrupted => Err(error),
            _ => Ok(()),
        };
        look(poll, events, Some(Duration::ZERO))?;
        if !events.is_empty() || timeout == Some(Duration::ZERO) {
            return Ok(());
        }
        let started = Instant::now();
        let budget = Duration::from_micros(self.budget_us);
        let spin_until = started + timeout.map_or(budget, |timeout| timeout.min(budget));
        let check = Duration::from_micros(POLL_SPIN_CHECK_US);
        loop {
            let now = Instant::now();
            if now >= spin_until {
                break;
            }
            let next_look = (now + check).min(spin_until);
            while Instant::now() < next_look {
                std::hint::spin_loop();
            }
            look(poll, events, Some(Duration::ZERO))?;
            if !events.is_empty() {
                self.grow();
                return Ok(());
            }
        }
        let blocked = Instant::now();
        let remaining = timeout.map(|timeout| timeout.saturating_sub(blocked - started));
        look(poll, events, remaining)?;
        if !events.is_empty() && blocked.elapsed() < Duration::from_micros(POLL_SPIN_US) {
            self.grow();
        } else {
            self.shrink();
        }
        Ok(())
    }
}

/// A client's TCP medium: one epoll poller for its connections (server i is token i), and the
/// secret it proves on each (None: no authentication step).
#[derive(Debug)]
pub struct TcpClient {
    poll: Poll,
    events: Events,
    registry: Arc<Registry>,
    secret: Option<Arc<SharedSecret>>,
    spin: PollSpin,
}

impl TcpClient {
    /// A medium that proves `secret` on every connection (None: none), whatever this process's
    /// client secret is.
    pub fn with_secret(secret: Option<Arc<SharedSecret>>) -> Result<Self, ChannelError> {
        let poll = Poll::new()?;
        let registry = Arc::new(poll.registry().try_clone()?);
        Ok(Self { poll, events: Events::with_capacity(EVENTS_CAPACITY), registry, secret, spin: PollSpin::default() })
    }
}

impl TcpClient {
    /// Waits up to `timeout` for epoll events and hands each to `ready` (server, readable,
    /// writable, the peer finished). True if none came.
    pub fn wait_events(
        &mut self,
        timeout: Option<Duration>,
        mut ready: impl FnMut(usize, bool, bool, bool),
    ) -> Result<bool, ChannelError> {
        self.spin.poll(&mut self.poll, &mut self.events, timeout)?;
        for event in self.events.iter() {
            ready(
                event.token().0,
                event.is_readable(),
                event.is_writable(),
                event.is_read_closed() || event.is_error(),
            );
        }
        Ok(self.events.is_empty())
    }
}

impl OpenMedium for TcpClient {
    /// Proves this process's client secret, if it has one.
    fn open(_servers: usize) -> Result<Self, ChannelError> {
        Self::with_secret(crate::auth::client_secret())
    }
}

impl ClientMedium for TcpClient {
    type Channel = TcpChannel;

    fn connect(&mut self, server: usize, address: &str) -> Result<TcpChannel, ChannelError> {
        TcpChannel::connect_with_secret(address, Arc::clone(&self.registry), Token(server), self.secret.as_deref())
    }

    fn wait(&mut self, channels: &mut [Option<TcpChannel>], timeout: Option<Duration>) -> Result<bool, ChannelError> {
        self.wait_events(timeout, |server, readable, writable, finished| {
            if let Some(Some(channel)) = channels.get_mut(server) {
                channel.set_ready(readable, writable, finished);
            }
        })
    }
}

/// The TCP front end's medium: one listener per server and every accepted connection in one
/// epoll poller (listeners are tokens `0..servers`, connection slot `s` is `servers + s`).
#[derive(Debug)]
pub struct TcpServer {
    poll: Poll,
    events: Events,
    registry: Arc<Registry>,
    waker: Arc<Waker>,
    listeners: Vec<TcpListener>,
    /// Connection slots not in use.
    free: Vec<usize>,
    /// Open connections per source address, and the address of each slot's connection.
    admitted: Admitted,
    spin: PollSpin,
}

/// Open connections per source address (the per-address cap) and the address of each slot.
#[derive(Debug)]
struct Admitted {
    per_address: HashMap<IpAddr, usize>,
    slots: Vec<Option<IpAddr>>,
    per_address_max: usize,
}

impl Admitted {
    /// Counts a connection from `address` in `slot`, or refuses it (false) past the cap.
    fn admit(&mut self, slot: usize, address: IpAddr) -> bool {
        let count = self.per_address.entry(address).or_insert(0);
        if *count >= self.per_address_max {
            return false;
        }
        *count += 1;
        self.slots[slot] = Some(address);
        true
    }

    fn release(&mut self, slot: usize) {
        let Some(address) = self.slots.get_mut(slot).and_then(Option::take) else { return };
        if let Some(count) = self.per_address.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&address);
            }
        }
    }
}

impl TcpServer {
    /// Binds one listener per address; returns the medium and the bound addresses. At most
    /// `SERVER_CONNECTIONS_MAX` connections, `SERVER_CONNECTIONS_PER_ADDRESS_MAX` per source.
    pub fn bind(addresses: &[SocketAddr]) -> std::io::Result<(Self, Vec<SocketAddr>)> {
        Self::bind_capped(addresses, SERVER_CONNECTIONS_MAX, SERVER_CONNECTIONS_PER_ADDRESS_MAX)
    }

    /// As [`TcpServer::bind`], with at most `connections_max` connections at once, at most
    /// `per_address_max` of them from one source address.
    pub fn bind_capped(
        addresses: &[SocketAddr],
        connections_max: usize,
        per_address_max: usize,
    ) -> std::io::Result<(Self, Vec<SocketAddr>)> {
        let poll = Poll::new()?;
        let registry = Arc::new(poll.registry().try_clone()?);
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let mut listeners = Vec::with_capacity(addresses.len());
        let mut bound = Vec::with_capacity(addresses.len());
        for (index, address) in addresses.iter().enumerate() {
            let mut listener = TcpListener::bind(*address)?;
            registry.register(&mut listener, Token(index), Interest::READABLE)?;
            bound.push(listener.local_addr()?);
            listeners.push(listener);
        }
        let free = (0..connections_max).rev().collect();
        let admitted = Admitted { per_address: HashMap::new(), slots: vec![None; connections_max], per_address_max };
        let events = Events::with_capacity(EVENTS_CAPACITY);
        Ok((Self { poll, events, registry, waker, listeners, free, admitted, spin: PollSpin::default() }, bound))
    }
}

/// Accepts every pending connection of `listener` (the listener of server `server`); a failed
/// accept only affects that connection; past the connection cap, or the cap per source address,
/// new ones are refused (closed at once, logged).
fn accept(
    listener: &TcpListener,
    server: usize,
    token_base: usize,
    (free, admitted): (&mut Vec<usize>, &mut Admitted),
    registry: &Arc<Registry>,
    events: &mut Vec<FrontEvent<TcpChannel>>,
) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return, // WouldBlock, or a failed connection
        };
        let Some(slot) = free.pop() else {
            log::warn!("refusing a connection from {peer}: all {} connections are open", admitted.slots.len());
            continue;
        };
        if !admitted.admit(slot, peer.ip()) {
            free.push(slot);
            let cap = admitted.per_address_max;
            log::warn!("refusing a connection from {peer}: {cap} connections from {} are open", peer.ip());
            continue;
        }
        match TcpChannel::new(stream, Arc::clone(registry), Token(token_base + slot)) {
            Ok(channel) => events.push(FrontEvent::Open { slot, server, channel }),
            Err(_) => {
                admitted.release(slot);
                free.push(slot);
            }
        }
    }
}

impl ServerMedium for TcpServer {
    type Channel = TcpChannel;

    fn waker(&self) -> Arc<dyn Wake> {
        Arc::clone(&self.waker) as Arc<dyn Wake>
    }

    fn wait(
        &mut self,
        timeout: Duration,
        _ready: impl Fn() -> bool,
        events: &mut Vec<FrontEvent<TcpChannel>>,
    ) -> std::io::Result<()> {
        self.spin.poll(&mut self.poll, &mut self.events, Some(timeout))?;
        let Self { events: readiness, listeners, free, admitted, registry, .. } = self;
        let base = listeners.len();
        for event in readiness.iter() {
            match event.token() {
                WAKER_TOKEN => {}
                Token(index) if index < base => {
                    accept(&listeners[index], index, base, (free, admitted), registry, events)
                }
                Token(index) => events.push(FrontEvent::Ready {
                    slot: index - base,
                    readable: event.is_readable(),
                    writable: event.is_writable(),
                    finished: event.is_read_closed() || event.is_error(),
                }),
            }
        }
        Ok(())
    }

    fn close(&mut self, slot: usize, mut channel: TcpChannel) {
        channel.deregister();
        self.admitted.release(slot);
        self.free.push(slot);
    }
}

impl Wake for Waker {
    fn wake(&self) {
        // A failed wake only delays: the poller wakes on a timeout too.
        let _ = Waker::wake(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spin budget starts full, halves down to nothing while spinning does not pay, and
    /// doubles back (from one look's worth) up to `POLL_SPIN_US` when it does.
    #[test]
    fn the_spin_budget_shrinks_to_nothing_and_grows_back_within_its_bounds() {
        let mut spin = PollSpin::default();
        assert_eq!(spin.budget_us(), POLL_SPIN_US);
        let mut misses = 0;
        while spin.budget_us() > 0 {
            spin.shrink();
            misses += 1;
            assert!(spin.budget_us() == 0 || spin.budget_us() >= POLL_SPIN_CHECK_US, "{}", spin.budget_us());
            assert!(misses <= 64, "the budget never reached 0");
        }
        spin.grow();
        assert_eq!(spin.budget_us(), POLL_SPIN_CHECK_US);
        for _ in 0..64 {
            spin.grow();
            assert!(spin.budget_us() <= POLL_SPIN_US);
        }
        assert_eq!(spin.budget_us(), POLL_SPIN_US);
    }

    /// A poller with nothing to report waits out its timeout (spinning, then blocking), returns
    /// no event, and spins less next time; a ready socket is reported by the first look.
    #[test]
    fn an_idle_wait_times_out_and_shrinks_the_spin_and_a_ready_socket_returns_at_once() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let mut spin = PollSpin::default();
        let timeout = Duration::from_millis(2);
        let started = Instant::now();
        spin.poll(&mut poll, &mut events, Some(timeout)).unwrap();
        assert!(events.is_empty());
        assert!(started.elapsed() >= timeout, "returned after {:?}", started.elapsed());
        assert_eq!(spin.budget_us(), POLL_SPIN_US / 2);

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut server = TcpStream::from_std(server);
        poll.registry().register(&mut server, Token(1), Interest::READABLE).unwrap();
        client.write_all(b"x").unwrap();
        let budget = spin.budget_us();
        // Blocks until the byte's event (no timeout): it is already on its way.
        spin.poll(&mut poll, &mut events, None).unwrap();
        assert_eq!(events.iter().map(|event| event.token()).collect::<Vec<_>>(), [Token(1)]);
        assert!(spin.budget_us() >= budget.min(POLL_SPIN_CHECK_US));
    }
}
