//! The write-poll transport (the paper's GET+/PUT+): requests and replies travel as one-sided
//! writes into message rings over the fabric (`rampkv-fabric`, shared memory here).
//!
//! # Memory
//! Per connection (client, server) there are two rings, each living in its *receiver's*
//! registered region and written one-sidedly by the sender:
//! - the **request ring** in the server group's region (one slot per connection), written by
//!   the client; the server group's one poller thread polls every request ring;
//! - the **reply ring** in the client's region (one per server), written by the server; the
//!   client polls its reply rings in [`ClientTransport::poll`].
//!
//! Each side's region starts with its poller's doorbell; credit words sit in the sender's
//! region next to the ring it receives on (see [`RegionLayout`]). Ring messages carry the same
//! frames as TCP ([`rampkv_core::wire`]): one or more *whole* frames per message, so a batch of
//! frames posted for one server goes out in as few ring messages as the ring's maximum message
//! size allows. A single frame above `WRITEPOLL_MESSAGE_BYTES_MAX` is refused.
//!
//! # Control path (like rdma-cm)
//! The client opens a TCP *control* connection to the server's control address, sends one
//! JSON line ([`ClientHello`]: its region descriptor and where its reply ring and credit word
//! are), and gets one JSON line back ([`ServerReply`]: the server group's region descriptor,
//! the request ring's slot and credit word, or a refusal). Both then map the other's region.
//! The control connection stays open: its closing tells the server the client is gone (the
//! server frees the slot and unmaps the client), and the server closing it tells the client
//! its connection was dropped (for example after a corrupt message).
//!
//! # Fault model
//! A reply ring holding something no correct server writes, or a reply frame that does not
//! decode, breaks the transport for good (`Fabric`/`Malformed` errors, like TCP). Nothing is
//! ever read or written outside a ring: the fabric crate checks every address.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_fabric::{
    Access, Doorbell, Fabric, LoadOrdering, OneSided, RegionDescriptor, RingAddresses, RingLayout, RingReceiver,
    RingSender, SendError, ShmFabric, ShmLocalRegion, ShmRemoteRegion, Words,
};
use serde::{Deserialize, Serialize};

use super::{ClientTransport, TransportError};
use crate::item_slots::ItemRegionInfo;
use rampkv_core::limits::{
    WRITEPOLL_CONTROL_LINE_BYTES_MAX, WRITEPOLL_CONTROL_TIMEOUT_MS, WRITEPOLL_MESSAGE_BYTES_MAX, WRITEPOLL_RING_BYTES,
};
use rampkv_core::wire::{FrameHeader, Request, Response, FRAME_HEADER_BYTES};

/// Version of the control handshake.
pub const CONTROL_VERSION: u32 = 1;

/// The local end of a ring pair, over the shared-memory fabric.
pub(crate) type ShmSender = RingSender<ShmFabric, Arc<ShmLocalRegion>>;
/// The receiving end of a ring, over the shared-memory fabric.
pub(crate) type ShmReceiver = RingReceiver<ShmFabric, Arc<ShmLocalRegion>>;

/// Where things lie in a write-poll region (client or server group), all 8-aligned:
/// ```text
/// +0                 doorbell of the region owner's poller (16 bytes), rest of 64 reserved
/// +64 + i * STRIDE   slot i: +0 credit word of the ring the owner SENDS on for connection i
///                            (written by the peer that receives), rest of 64 reserved
///                            +64 the ring the owner RECEIVES on for connection i
/// STRIDE = 64 + WRITEPOLL_RING_BYTES
/// ```
/// A client has one slot per server; a server group one per ring connection.
#[derive(Debug, Clone, Copy)]
pub struct RegionLayout;

impl RegionLayout {
    /// Offset of the doorbell.
    pub const DOORBELL_OFFSET_BYTES: u64 = 0;
    const HEADER_BYTES: usize = 64;
    const STRIDE_BYTES: usize = 64 + WRITEPOLL_RING_BYTES;

    /// Bytes of a region with `slots` slots.
    pub const fn region_bytes(slots: usize) -> usize {
        Self::HEADER_BYTES + slots * Self::STRIDE_BYTES
    }
    /// Offset of slot `slot`'s credit word.
    pub fn credit_offset_bytes(slot: usize) -> u64 {
        (Self::HEADER_BYTES + slot * Self::STRIDE_BYTES) as u64
    }
    /// Slot `slot`'s receive ring.
    pub fn ring(slot: usize) -> RingLayout {
        RingLayout {
            offset_bytes: Self::credit_offset_bytes(slot) + 64,
            ring_bytes: WRITEPOLL_RING_BYTES as u64,
            body_bytes_max: WRITEPOLL_MESSAGE_BYTES_MAX as u64,
        }
    }
}

/// The client's handshake line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientHello {
    /// Must be [`CONTROL_VERSION`].
    pub version: u32,
    /// The client's region (reply ring, doorbell, request credit word).
    pub region: RegionDescriptor,
    /// The reply ring, in the client's region.
    pub reply_ring: RingLayout,
    /// The client's doorbell, in the client's region.
    pub doorbell_offset_bytes: u64,
    /// The credit word of the request ring, in the client's region.
    pub request_credit_offset_bytes: u64,
}

/// The server's handshake line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ServerReply {
    /// The connection is set up; the client maps `region`.
    Accepted {
        /// The server group's region (request rings, doorbell, reply credit words).
        region: RegionDescriptor,
        /// This connection's request ring, in the server's region.
        request_ring: RingLayout,
        /// The server poller's doorbell, in the server's region.
        doorbell_offset_bytes: u64,
        /// The credit word of the reply ring, in the server's region.
        reply_credit_offset_bytes: u64,
        /// GET\*: the server's item region (absent when it publishes no item slots; a client
        /// that does not read slots ignores it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        items: Option<ItemRegionInfo>,
    },
    /// The server will not serve this client (no free slot, bad hello, ...).
    Refused {
        /// Why.
        reason: String,
    },
}

/// Writes `value` as one JSON line.
pub(crate) fn write_json_line<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one JSON line of at most `WRITEPOLL_CONTROL_LINE_BYTES_MAX` bytes (the stream's
/// read timeout bounds the wait). The reader is limited to that many bytes, so a peer cannot
/// make us buffer more.
pub(crate) fn read_json_line<T: for<'de> Deserialize<'de>>(stream: &mut TcpStream) -> std::io::Result<T> {
    let mut line = Vec::with_capacity(256);
    let limit = WRITEPOLL_CONTROL_LINE_BYTES_MAX as u64 + 1;
    // One line is all either side sends before waiting for the other, so a buffered reader
    // cannot swallow bytes meant for later.
    let mut reader = BufReader::new(Read::by_ref(stream).take(limit));
    reader.read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "control line too long or cut off"));
    }
    serde_json::from_slice(&line).map_err(|error| std::io::Error::new(ErrorKind::InvalidData, error))
}

/// Sends whole frames from `frames` in ring messages of at most the ring's maximum body,
/// as far as credit allows. Returns the bytes of `frames` sent (a frame boundary).
///
/// # Errors
/// `TooLarge` if one frame alone exceeds the maximum (nothing of it was sent); others from
/// the ring (the connection is broken).
pub(crate) fn send_frames(sender: &mut ShmSender, frames: &[u8]) -> Result<usize, SendError> {
    let message_bytes_max = sender.body_bytes_max();
    send_frames_with(frames, message_bytes_max, |message| match sender.try_send(message) {
        Ok(()) => Ok(true),
        Err(SendError::NoCredit) => Ok(false),
        Err(error) => Err(error),
    })
}

/// Sends whole frames from `frames` in messages of at most `message_bytes_max` through
/// `try_send` (`Ok(false)`: no room now, try later) until it refuses or everything is sent.
/// Returns the bytes of `frames` sent (a frame boundary). Shared by every message transport
/// (rings, send/recv).
pub(crate) fn send_frames_with<E>(
    frames: &[u8],
    message_bytes_max: usize,
    mut try_send: impl FnMut(&[u8]) -> Result<bool, E>,
) -> Result<usize, E> {
    let mut sent = 0;
    while sent < frames.len() {
        let mut end = sent;
        while end < frames.len() {
            let frame = frame_bytes_at(&frames[end..]);
            if end > sent && end + frame - sent > message_bytes_max {
                break;
            }
            end += frame;
        }
        assert!(end <= frames.len(), "frames buffer holds only whole frames");
        if !try_send(&frames[sent..end])? {
            return Ok(sent);
        }
        sent = end;
    }
    Ok(sent)
}

/// Sends the unsent part `outgoing[*sent..]` of a connection's queued frames with `send`
/// (which returns how many bytes it took, at a frame boundary) and forgets them once all are
/// gone. Shared by the message transports (write-poll, send/recv).
pub(crate) fn flush_outgoing<E>(
    outgoing: &mut Vec<u8>,
    sent: &mut usize,
    send: impl FnOnce(&[u8]) -> Result<usize, E>,
) -> Result<(), E> {
    if *sent == outgoing.len() {
        return Ok(());
    }
    *sent += send(&outgoing[*sent..])?;
    if *sent == outgoing.len() {
        outgoing.clear();
        *sent = 0;
    }
    Ok(())
}

/// Checks a client's control connection to `server` without blocking: the server sends
/// nothing after the handshake, so the end of the stream means it dropped us. Shared by the
/// fabric transports (write-poll, send/recv, RF-RPC).
pub(crate) fn check_control_stream(server: usize, control: &mut TcpStream) -> Result<(), TransportError> {
    let mut scratch = [0u8; 64];
    match control.read(&mut scratch) {
        Ok(0) => Err(TransportError::Closed { server }),
        Ok(_) => Ok(()), // nothing is expected after the handshake; ignore it
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(()),
        Err(error) => Err(TransportError::Io { server, error }),
    }
}

/// Length of the (locally encoded, hence valid) frame at the start of `frames`.
pub(crate) fn frame_bytes_at(frames: &[u8]) -> usize {
    let body = u32::from_le_bytes(frames[0..4].try_into().expect("a frame header")) as usize;
    FRAME_HEADER_BYTES + body
}

static REGION_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A region name unique in this process (`<prefix>-<n>`).
pub(crate) fn unique_region_name(prefix: &str) -> String {
    format!("{prefix}-{}", REGION_COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[derive(Debug)]
struct Connection {
    /// Kept open: its end tells the server we are gone, and us that the server dropped us.
    control: TcpStream,
    sender: ShmSender,
    receiver: ShmReceiver,
    /// Encoded frames not yet in the ring: `outgoing[sent..]`.
    outgoing: Vec<u8>,
    sent: usize,
    /// The server's region and our request ring in it (for the fault-injection hook only).
    server_region: ShmRemoteRegion,
    request_ring: RingLayout,
    /// GET\*: the server's item region, if it has one.
    items: Option<ItemRegionInfo>,
}

/// A client's ring connections to every server of a cluster.
#[derive(Debug)]
pub struct WritePollClientTransport {
    fabric: ShmFabric,
    region: Arc<ShmLocalRegion>,
    doorbell: Doorbell<Arc<ShmLocalRegion>>,
    connections: Vec<Connection>,
    /// Per server: the request credit word's value before the last sleep (allocated once).
    credit_seen: Vec<u64>,
}

pub(crate) fn fabric_error(server: usize, error: impl std::fmt::Display) -> TransportError {
    TransportError::Fabric { server, reason: error.to_string() }
}

impl WritePollClientTransport {
    /// Connects to every server's *control* address (server i is `control_addresses[i]`),
    /// registers this client's region and sets up a ring pair per server.
    pub fn connect(control_addresses: &[String]) -> Result<Self, TransportError> {
        let fabric = ShmFabric::new().map_err(|error| fabric_error(0, error))?;
        let name = unique_region_name("wp-client");
        let region = fabric
            .register(&name, RegionLayout::region_bytes(control_addresses.len()), Access::ReadWrite)
            .map_err(|error| fabric_error(0, error))?;
        let region = Arc::new(region);
        let doorbell = Doorbell::new(Arc::clone(&region), RegionLayout::DOORBELL_OFFSET_BYTES as usize)
            .map_err(|error| fabric_error(0, error))?;
        let mut connections = Vec::with_capacity(control_addresses.len());
        for (server, address) in control_addresses.iter().enumerate() {
            connections.push(connect_one(fabric, &region, server, address)?);
        }
        let credit_seen = vec![0; connections.len()];
        Ok(Self { fabric, region, doorbell, connections, credit_seen })
    }

    /// Sends what is queued for `server` as far as credit allows.
    fn flush_server(&mut self, server: usize) -> Result<(), TransportError> {
        let Connection { outgoing, sent, sender, .. } = &mut self.connections[server];
        flush_outgoing(outgoing, sent, |frames| send_frames(sender, frames))
            .map_err(|error| fabric_error(server, error))
    }

    fn has_unsent(&self) -> bool {
        self.connections.iter().any(|connection| connection.sent < connection.outgoing.len())
    }

    /// Delivers every reply waiting in the reply rings.
    fn drain<F>(&mut self, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut delivered = 0;
        for (server, connection) in self.connections.iter_mut().enumerate() {
            while let Some(message) = connection.receiver.poll().map_err(|error| fabric_error(server, error))? {
                delivered += deliver_frames(server, message.body(), deliver)?;
            }
        }
        Ok(delivered)
    }

    /// Whether any server closed its control connection (it dropped us).
    fn check_control(&mut self) -> Result<(), TransportError> {
        for (server, connection) in self.connections.iter_mut().enumerate() {
            check_control_stream(server, &mut connection.control)?;
        }
        Ok(())
    }

    /// GET\*: the item region server `server` announced in the handshake, if any.
    pub fn item_region(&self, server: usize) -> Option<&ItemRegionInfo> {
        self.connections.get(server).and_then(|connection| connection.items.as_ref())
    }

    /// The fabric this transport maps regions with.
    pub fn fabric(&self) -> ShmFabric {
        self.fabric
    }

    /// TEST HOOK (fault injection): writes `word` one-sidedly at the start of `server`'s
    /// request ring, which is where the first frame header goes: on a connection that has sent
    /// nothing yet, the server finds it as its next header, as if a buggy or hostile client
    /// had written it.
    #[doc(hidden)]
    pub fn inject_ring_start_word_for_test(&mut self, server: usize, word: u64) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let offset = connection.request_ring.offset_bytes as usize;
        self.fabric
            .write_word(&connection.server_region, offset, word, rampkv_fabric::StoreOrdering::Release)
            .map_err(|error| fabric_error(server, error))?;
        self.fabric
            .wake(&connection.server_region, RegionLayout::DOORBELL_OFFSET_BYTES as usize)
            .map_err(|error| fabric_error(server, error))
    }

    /// TEST HOOK (fault injection): sends `body` as one ring message, unchecked (it need not
    /// hold valid frames).
    #[doc(hidden)]
    pub fn send_raw_message_for_test(&mut self, server: usize, body: &[u8]) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        connection.sender.try_send(body).map_err(|error| fabric_error(server, error))
    }
}

/// Opens the control connection to `address` (blocking, with the control timeout for
/// connecting and reading the handshake reply). Shared by every fabric transport.
pub(crate) fn open_control(server: usize, address: &str) -> Result<TcpStream, TransportError> {
    let connect_error = |error| TransportError::Connect { server, address: address.to_string(), error };
    let timeout = Duration::from_millis(WRITEPOLL_CONTROL_TIMEOUT_MS);
    let socket_address = address
        .to_socket_addrs()
        .map_err(connect_error)?
        .next()
        .ok_or_else(|| connect_error(std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing")))?;
    let control = TcpStream::connect_timeout(&socket_address, timeout).map_err(connect_error)?;
    control.set_read_timeout(Some(timeout)).map_err(connect_error)?;
    control.set_nodelay(true).map_err(connect_error)?;
    Ok(control)
}

/// Control handshake and ring set-up for one server.
fn connect_one(
    fabric: ShmFabric,
    region: &Arc<ShmLocalRegion>,
    server: usize,
    address: &str,
) -> Result<Connection, TransportError> {
    let connect_error = |error| TransportError::Connect { server, address: address.to_string(), error };
    let mut control = open_control(server, address)?;
    let hello = ClientHello {
        version: CONTROL_VERSION,
        region: region.descriptor().clone(),
        reply_ring: RegionLayout::ring(server),
        doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
        request_credit_offset_bytes: RegionLayout::credit_offset_bytes(server),
    };
    write_json_line(&mut control, &hello).map_err(connect_error)?;
    let reply: ServerReply = read_json_line(&mut control).map_err(connect_error)?;
    let (server_descriptor, request_ring, server_doorbell, reply_credit, items) = match reply {
        ServerReply::Accepted { region, request_ring, doorbell_offset_bytes, reply_credit_offset_bytes, items } => {
            (region, request_ring, doorbell_offset_bytes, reply_credit_offset_bytes, items)
        }
        ServerReply::Refused { reason } => {
            return Err(connect_error(std::io::Error::new(ErrorKind::ConnectionRefused, reason)))
        }
    };
    let remote = fabric.map(&server_descriptor).map_err(|error| fabric_error(server, error))?;
    let server_region = remote.clone();
    // Our reply ring is fresh (registered zeroed) and the server writes it only in answer to
    // a request, so building the receiver (which zeroes it again) after the handshake is safe.
    let receiver = RingReceiver::new(
        fabric,
        Arc::clone(region),
        remote.clone(),
        RingAddresses {
            ring: hello.reply_ring,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            credit_offset_bytes: reply_credit,
            sender_doorbell_offset_bytes: server_doorbell,
        },
    )
    .map_err(|error| fabric_error(server, error))?;
    let sender = RingSender::new(
        fabric,
        remote,
        Arc::clone(region),
        RingAddresses {
            ring: request_ring,
            receiver_doorbell_offset_bytes: server_doorbell,
            credit_offset_bytes: hello.request_credit_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        },
    )
    .map_err(|error| fabric_error(server, error))?;
    control.set_nonblocking(true).map_err(|error| TransportError::Io { server, error })?;
    Ok(Connection { control, sender, receiver, outgoing: Vec::new(), sent: 0, server_region, request_ring, items })
}

/// Decodes and delivers every frame of one ring message (whole frames only).
pub(crate) fn deliver_frames<F>(server: usize, mut body: &[u8], deliver: &mut F) -> Result<usize, TransportError>
where
    F: FnMut(usize, u64, Response),
{
    let mut delivered = 0;
    while !body.is_empty() {
        let (header, frame) = match FrameHeader::split(body) {
            Ok(Some(split)) => split,
            Ok(None) => {
                return Err(TransportError::Fabric { server, reason: "ring message ends inside a frame".into() })
            }
            Err(error) => return Err(TransportError::Malformed { server, error }),
        };
        let response =
            Response::decode(header.kind, frame).map_err(|error| TransportError::Malformed { server, error })?;
        deliver(server, header.request_id, response);
        delivered += 1;
        body = &body[header.frame_bytes()..];
    }
    Ok(delivered)
}

impl ClientTransport for WritePollClientTransport {
    fn server_count(&self) -> usize {
        self.connections.len()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let message_bytes_max = connection.sender.body_bytes_max();
        super::queue_frame(&mut connection.outgoing, server, request_id, request, message_bytes_max)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        for server in 0..self.connections.len() {
            self.flush_server(server)?;
        }
        Ok(())
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let started = Instant::now();
        loop {
            if self.has_unsent() {
                self.flush()?; // credit may have come back
            }
            let delivered = self.drain(&mut deliver)?;
            if delivered > 0 || timeout == Some(Duration::ZERO) {
                return Ok(delivered);
            }
            // The bounded spin is the doorbell's (`DOORBELL_SPIN_ITERATIONS` checks of the
            // rings, a few tens of µs) before it sleeps. No `POLL_SPIN_US` spin on top: on this
            // shared 2-core machine the extra spin took CPU from the server poller and cost
            // about 25% of throughput (docs/performance.md).
            let Some(sleep) = super::doorbell_sleep(started, timeout) else { return Ok(0) };
            for (server, seen) in self.credit_seen.iter_mut().enumerate() {
                *seen = self.region.load(credit_index(server), LoadOrdering::Relaxed);
            }
            let (connections, region, credit_seen) = (&self.connections, &self.region, &self.credit_seen);
            // Wake for a reply, or for credit a blocked send waits for.
            let ready = || {
                connections.iter().any(|connection| connection.receiver.has_pending())
                    || connections.iter().zip(credit_seen).enumerate().any(|(server, (connection, &seen))| {
                        connection.sent < connection.outgoing.len()
                            && region.load(credit_index(server), LoadOrdering::Relaxed) != seen
                    })
            };
            if self.doorbell.wait_until(ready, sleep).is_err() {
                self.check_control()?;
            }
        }
    }
}

/// Word index of server `server`'s request credit word in the client's region.
fn credit_index(server: usize) -> usize {
    RegionLayout::credit_offset_bytes(server) as usize / 8
}
