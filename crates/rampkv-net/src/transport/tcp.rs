//! The TCP transport: one non-blocking socket per server, frames of [`rampkv_core::wire::frame`].
//!
//! Requests are pipelined: many may be outstanding on one connection, matched to replies by
//! request id. `post` only appends encoded frames to a per-server buffer; `flush` writes each
//! buffer with as few `write` calls as the socket allows, so many logical clients multiplexed
//! on one thread share each system call. One `mio` poller watches every connection.

use std::io::{ErrorKind, Read, Write};
use std::net::ToSocketAddrs;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token};

use super::{ClientTransport, TransportError};
use rampkv_core::limits::{FRAME_BODY_BYTES_MAX, POLL_SPIN_US};
use rampkv_core::wire::{FrameHeader, Request, Response, FRAME_HEADER_BYTES};

/// How long connecting to one server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read from a socket per `read` call at least.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Readiness events taken per poll.
const EVENTS_CAPACITY: usize = 256;

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
        }
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

    /// Reads what `source` has into the buffer, with room for at least `room_bytes`.
    /// `WouldBlock` comes back as that error.
    ///
    /// A read that did not fill the room means the socket's receive queue is empty now
    /// (`ReadStatus::Drained`); the caller need not call again to see `WouldBlock`, because an
    /// edge-triggered epoll reports every later arrival as a new event. That saves one
    /// `recvfrom` returning EAGAIN per readable event, about half of all reads.
    pub fn read_from(&mut self, source: &mut impl Read, room_bytes: usize) -> std::io::Result<ReadStatus> {
        self.compact();
        let wanted = self.end + room_bytes.max(READ_CHUNK_BYTES);
        if self.bytes.len() < wanted {
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
            match sink.write(self.pending()) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(written) => self.consume(written),
                Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
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

/// A client's connection to one server: a non-blocking socket and its two buffers. Shared by
/// every client-side TCP transport (this one, and the RESP gateway's, whose sockets sit in the
/// gateway's own poller).
#[derive(Debug)]
pub struct ServerConnection {
    stream: TcpStream,
    outgoing: StreamBuffer,
    incoming: StreamBuffer,
    /// Whether WRITABLE interest is registered (only while a write is incomplete).
    wants_writable: bool,
}

impl ServerConnection {
    /// Connects to server number `server` at `address` and registers the socket for reading.
    pub fn connect(
        server: usize,
        address: &str,
        registry: &Registry,
        token: Token,
    ) -> Result<ServerConnection, TransportError> {
        let connect_error = |error| TransportError::Connect { server, address: address.to_string(), error };
        let socket_address =
            address.to_socket_addrs().map_err(connect_error)?.next().ok_or_else(|| {
                connect_error(std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing"))
            })?;
        let stream = std::net::TcpStream::connect_timeout(&socket_address, CONNECT_TIMEOUT).map_err(connect_error)?;
        stream.set_nodelay(true).map_err(connect_error)?;
        stream.set_nonblocking(true).map_err(connect_error)?;
        let mut stream = TcpStream::from_std(stream);
        registry
            .register(&mut stream, token, Interest::READABLE)
            .map_err(|error| TransportError::Io { server, error })?;
        Ok(ServerConnection {
            stream,
            outgoing: StreamBuffer::default(),
            incoming: StreamBuffer::default(),
            wants_writable: false,
        })
    }

    /// Queues one request frame.
    pub fn post(&mut self, request_id: u64, request: &Request) {
        self.outgoing.append(|out| request.encode_frame(request_id, out));
    }

    /// Whether frames wait to be written.
    pub fn has_outgoing(&self) -> bool {
        !self.outgoing.is_empty()
    }

    /// Writes what the socket takes; asks for WRITABLE events only while a write is incomplete.
    pub fn write(&mut self, server: usize, registry: &Registry, token: Token) -> Result<(), TransportError> {
        let done = self.outgoing.write_to(&mut self.stream).map_err(|error| TransportError::Io { server, error })?;
        if done == self.wants_writable {
            let interest = if done { Interest::READABLE } else { Interest::READABLE | Interest::WRITABLE };
            registry
                .reregister(&mut self.stream, token, interest)
                .map_err(|error| TransportError::Io { server, error })?;
            self.wants_writable = !done;
        }
        Ok(())
    }

    /// Reads and delivers what the connection has. `peer_finished`: epoll saw the server's end
    /// of stream, so read until EOF rather than stopping at a short read.
    pub fn read<F>(&mut self, server: usize, peer_finished: bool, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut delivered = 0;
        loop {
            let room = self.incoming.room_for_next_frame();
            match self.incoming.read_from(&mut self.stream, room) {
                Ok(ReadStatus::EndOfStream) => return Err(TransportError::Closed { server }),
                Ok(status) => {
                    delivered += deliver_frames(server, &mut self.incoming, deliver)?;
                    if status == ReadStatus::Drained && !peer_finished {
                        return Ok(delivered);
                    }
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => return Ok(delivered),
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => return Err(TransportError::Io { server, error }),
            }
        }
    }
}

/// A client's TCP connections to every server of a cluster.
#[derive(Debug)]
pub struct TcpClientTransport {
    poll: Poll,
    events: Events,
    connections: Vec<ServerConnection>,
}

impl TcpClientTransport {
    /// Connects to every address (server i is `addresses[i]`).
    pub fn connect(addresses: &[String]) -> Result<Self, TransportError> {
        let poll = Poll::new().map_err(|error| TransportError::Io { server: 0, error })?;
        let connections = addresses
            .iter()
            .enumerate()
            .map(|(server, address)| ServerConnection::connect(server, address, poll.registry(), Token(server)))
            .collect::<Result<_, _>>()?;
        Ok(Self { poll, events: Events::with_capacity(EVENTS_CAPACITY), connections })
    }
}

/// Decodes and delivers every complete frame at the front of `incoming`.
fn deliver_frames<F>(server: usize, incoming: &mut StreamBuffer, deliver: &mut F) -> Result<usize, TransportError>
where
    F: FnMut(usize, u64, Response),
{
    let mut delivered = 0;
    loop {
        let pending = incoming.pending();
        let (header, body) = match FrameHeader::split(pending) {
            Ok(Some(split)) => split,
            Ok(None) => return Ok(delivered),
            Err(error) => return Err(TransportError::Malformed { server, error }),
        };
        let response =
            Response::decode(header.kind, body).map_err(|error| TransportError::Malformed { server, error })?;
        incoming.consume(header.frame_bytes());
        deliver(server, header.request_id, response);
        delivered += 1;
    }
}

impl ClientTransport for TcpClientTransport {
    fn server_count(&self) -> usize {
        self.connections.len()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        connection.post(request_id, request);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        for (server, connection) in self.connections.iter_mut().enumerate() {
            if connection.has_outgoing() {
                connection.write(server, self.poll.registry(), Token(server))?;
            }
        }
        Ok(())
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        poll_spinning(&mut self.poll, &mut self.events, timeout)
            .map_err(|error| TransportError::Io { server: 0, error })?;
        // Taken out for the loop (no allocation: an empty `Events` has no buffer), put back after.
        let events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        let mut result = Ok(0);
        for event in events.iter() {
            let server = event.token().0;
            if event.is_writable() {
                if let Err(error) = self.connections[server].write(server, self.poll.registry(), Token(server)) {
                    result = Err(error);
                    break;
                }
            }
            if event.is_readable() || event.is_read_closed() {
                match self.connections[server].read(server, event.is_read_closed(), &mut deliver) {
                    Ok(count) => result = result.map(|total| total + count),
                    Err(error) => {
                        result = Err(error);
                        break;
                    }
                }
            }
        }
        self.events = events;
        result
    }
}

/// Polls without blocking for up to `POLL_SPIN_US`, then blocks for the rest of `timeout`.
/// Returns with `events` empty on timeout or interruption.
pub fn poll_spinning(poll: &mut Poll, events: &mut Events, timeout: Option<Duration>) -> std::io::Result<()> {
    let spin_until = std::time::Instant::now() + Duration::from_micros(POLL_SPIN_US);
    loop {
        match poll.poll(events, Some(Duration::ZERO)) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::Interrupted => return Ok(()),
            Err(error) => return Err(error),
        }
        if !events.is_empty() || timeout == Some(Duration::ZERO) {
            return Ok(());
        }
        if std::time::Instant::now() >= spin_until {
            break;
        }
        std::hint::spin_loop();
    }
    match poll.poll(events, timeout) {
        Err(error) if error.kind() != ErrorKind::Interrupted => Err(error),
        _ => Ok(()),
    }
}
