//! The send/recv transport: two-sided messaging emulated as RDMA SEND/RECV does it
//! (`rampkv_fabric::sendrecv`), over the shared-memory fabric.
//!
//! # How it differs from write-poll
//! In the write-poll transport (GET+/PUT+) a sender writes into a byte ring the receiver merely
//! polls. Here the **receiver** takes part as with RDMA SEND: it posts receive buffers of its
//! own memory, each message lands in the next posted buffer (a message with no posted buffer is
//! refused, receiver-not-ready, and retried; a message larger than the buffer is a length
//! error), and the receiver learns of it from a completion queue, then posts the buffer again.
//!
//! # Memory
//! Per connection (client, server) there are two queue pairs, each with its receive queue,
//! completion queue and buffers in its *receiver's* region (layout: `docs/fabric.md`):
//! - **requests**: in the server group's region (one slot per connection, after the write-poll
//!   slots), posted by the server, written by the client;
//! - **replies**: in the client's region (one slot per server), posted by the client, written
//!   by the server.
//!
//! Each region's first 64 bytes hold its poller's doorbell ([`ClientRegionLayout`]). Messages
//! carry the same frames as TCP ([`rampkv_core::wire`]), one or more *whole* frames per message, up to
//! `SENDRECV_BUFFER_BYTES`; a single frame above it is refused with `MessageTooLarge`.
//!
//! # Control path
//! As for write-poll (same control port; see `docs/wire.md`): the client sends one JSON line
//! ([`SendRecvHello`]) and gets one back ([`SendRecvServerReply`]); the control connection
//! stays open, and its end tells either side that the other is gone.
//!
//! # Fault model
//! A completion no correct server writes, a reply that does not decode, or a server that
//! corrupts its receive queue breaks the transport for good (`Fabric`/`Malformed` errors).
//! Nothing is ever read or written outside the queues: the fabric crate checks every address.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_fabric::{
    Access, Doorbell, Fabric, OneSided, PostError, QueueAddresses, QueueLayout, ReceiveQueue, RegionDescriptor,
    SendQueue, ShmFabric, ShmLocalRegion, ShmRemoteRegion, StoreOrdering,
};
use serde::{Deserialize, Serialize};

use super::writepoll::{
    check_control_stream, deliver_frames, fabric_error, flush_outgoing, open_control, read_json_line, send_frames_with,
    unique_region_name, write_json_line,
};
use super::{ClientTransport, TransportError};
use rampkv_core::limits::{SENDRECV_BUFFER_BYTES, SENDRECV_QUEUE_DEPTH};
use rampkv_core::wire::{Request, Response};

/// Version of the send/recv control handshake.
pub const SENDRECV_CONTROL_VERSION: u32 = 1;

/// The sending end of a queue pair over the shared-memory fabric.
pub(crate) type ShmSendQueue = SendQueue<ShmFabric, Arc<ShmLocalRegion>>;
/// The receiving end of a queue pair over the shared-memory fabric.
pub(crate) type ShmReceiveQueue = ReceiveQueue<ShmFabric, Arc<ShmLocalRegion>>;

/// Bytes of one queue pair direction's queues and buffers.
pub const QUEUE_BYTES: usize = QueueLayout::len_bytes(SENDRECV_QUEUE_DEPTH, SENDRECV_BUFFER_BYTES);

/// The queues of one direction at `offset_bytes`, with the configured depth and buffer size.
pub fn queue_layout(offset_bytes: usize) -> QueueLayout {
    QueueLayout {
        offset_bytes: offset_bytes as u64,
        depth: SENDRECV_QUEUE_DEPTH as u64,
        buffer_bytes: SENDRECV_BUFFER_BYTES as u64,
    }
}

/// Where things lie in a send/recv client's region, all 8-aligned:
/// ```text
/// +0                 doorbell of the client's poller (16 bytes), rest of 64 reserved
/// +64 + i * QUEUE_BYTES   reply queues and buffers of server i (posted by the client)
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ClientRegionLayout;

impl ClientRegionLayout {
    /// Offset of the doorbell.
    pub const DOORBELL_OFFSET_BYTES: u64 = 0;
    const HEADER_BYTES: usize = 64;

    /// Bytes of a region for `servers` servers.
    pub fn region_bytes(servers: usize) -> usize {
        Self::HEADER_BYTES + servers * QUEUE_BYTES
    }
    /// Server `server`'s reply queue.
    pub fn reply_queue(server: usize) -> QueueLayout {
        queue_layout(Self::HEADER_BYTES + server * QUEUE_BYTES)
    }
}

/// The client's handshake line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRecvHello {
    /// Must be [`SENDRECV_CONTROL_VERSION`].
    pub sendrecv_version: u32,
    /// The client's region (reply queues, doorbell).
    pub region: RegionDescriptor,
    /// The reply queue, in the client's region.
    pub reply_queue: QueueLayout,
    /// The client's doorbell, in the client's region.
    pub doorbell_offset_bytes: u64,
}

/// The server's handshake line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SendRecvServerReply {
    /// The connection is set up (the server posted its receive buffers); the client maps
    /// `region`.
    Accepted {
        /// The server group's region (request queues, doorbell).
        region: RegionDescriptor,
        /// This connection's request queue, in the server's region.
        request_queue: QueueLayout,
        /// The server poller's doorbell, in the server's region.
        doorbell_offset_bytes: u64,
    },
    /// The server will not serve this client (no free slot, bad hello, ...).
    Refused {
        /// Why.
        reason: String,
    },
}

#[derive(Debug)]
struct Connection {
    /// Kept open: its end tells the server we are gone, and us that the server dropped us.
    control: TcpStream,
    sender: ShmSendQueue,
    receiver: ShmReceiveQueue,
    /// Encoded frames not yet sent: `outgoing[sent..]`.
    outgoing: Vec<u8>,
    sent: usize,
    /// The message last received (copied out of its buffer before the buffer is re-posted).
    incoming: Vec<u8>,
    /// The server's region and our request queue in it (for the fault-injection hook only).
    server_region: ShmRemoteRegion,
    request_queue: QueueLayout,
}

/// A client's send/recv queue pairs to every server of a cluster.
#[derive(Debug)]
pub struct SendRecvClientTransport {
    fabric: ShmFabric,
    doorbell: Doorbell<Arc<ShmLocalRegion>>,
    connections: Vec<Connection>,
}

/// Sends queued frames through `sender` as far as posted buffers allow; returns the bytes sent.
pub(crate) fn send_frames(sender: &mut ShmSendQueue, frames: &[u8]) -> Result<usize, PostError> {
    let message_bytes_max = sender.message_bytes_max();
    send_frames_with(frames, message_bytes_max, |message| match sender.try_send(message) {
        Ok(()) => Ok(true),
        Err(PostError::ReceiverNotReady) => Ok(false),
        Err(error) => Err(error),
    })
}

impl SendRecvClientTransport {
    /// Connects to every server's *control* address (server i is `control_addresses[i]`, the
    /// write-poll front end's control port), registers this client's region and sets up a
    /// queue pair per server.
    pub fn connect(control_addresses: &[String]) -> Result<Self, TransportError> {
        let fabric = ShmFabric::new().map_err(|error| fabric_error(0, error))?;
        let name = unique_region_name("sr-client");
        let region = fabric
            .register(&name, ClientRegionLayout::region_bytes(control_addresses.len()), Access::ReadWrite)
            .map_err(|error| fabric_error(0, error))?;
        let region = Arc::new(region);
        let doorbell = Doorbell::new(Arc::clone(&region), ClientRegionLayout::DOORBELL_OFFSET_BYTES as usize)
            .map_err(|error| fabric_error(0, error))?;
        let mut connections = Vec::with_capacity(control_addresses.len());
        for (server, address) in control_addresses.iter().enumerate() {
            connections.push(connect_one(fabric, &region, server, address)?);
        }
        Ok(Self { fabric, doorbell, connections })
    }

    fn flush_server(&mut self, server: usize) -> Result<(), TransportError> {
        let Connection { outgoing, sent, sender, .. } = &mut self.connections[server];
        flush_outgoing(outgoing, sent, |frames| send_frames(sender, frames))
            .map_err(|error| fabric_error(server, error))
    }

    fn has_unsent(&self) -> bool {
        self.connections.iter().any(|connection| connection.sent < connection.outgoing.len())
    }

    /// Delivers every reply waiting in the completion queues: poll, copy the message out,
    /// post the buffer again, decode.
    fn drain<F>(&mut self, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut delivered = 0;
        for (server, connection) in self.connections.iter_mut().enumerate() {
            let Connection { receiver, incoming, .. } = connection;
            while let Some(completion) = receiver.poll().map_err(|error| fabric_error(server, error))? {
                incoming.clear();
                receiver.copy_message(&completion, incoming);
                receiver.repost(completion).map_err(|error| fabric_error(server, error))?;
                delivered += deliver_frames(server, incoming, deliver)?;
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

    /// TEST HOOK (fault injection): writes `header` one-sidedly as the first completion of
    /// `server`'s request queue (on a connection that has sent nothing yet, the server polls it
    /// next), as a buggy or hostile client could, and rings the server's doorbell.
    #[doc(hidden)]
    pub fn inject_request_completion_for_test(
        &mut self,
        server: usize,
        header: u64,
        length: u64,
    ) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let queue = connection.request_queue;
        let completion = (queue.offset_bytes + queue.depth * 8) as usize;
        let region = &connection.server_region;
        let write = |offset, word, ordering| self.fabric.write_word(region, offset, word, ordering);
        write(completion + 8, length, StoreOrdering::Relaxed).map_err(|error| fabric_error(server, error))?;
        write(completion, header, StoreOrdering::Release).map_err(|error| fabric_error(server, error))?;
        self.fabric.wake(region, 0).map_err(|error| fabric_error(server, error))
    }

    /// TEST HOOK (fault injection): sends `message` as one message, unchecked (it need not hold
    /// valid frames, and may exceed the server's buffers: then the post is consumed with a
    /// length-error completion and this returns the `TooLarge` error).
    #[doc(hidden)]
    pub fn send_raw_message_for_test(&mut self, server: usize, message: &[u8]) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        connection.sender.send(message, Duration::from_secs(5)).map_err(|error| fabric_error(server, error))
    }
}

/// Control handshake and queue pair set-up for one server.
fn connect_one(
    fabric: ShmFabric,
    region: &Arc<ShmLocalRegion>,
    server: usize,
    address: &str,
) -> Result<Connection, TransportError> {
    let connect_error = |error| TransportError::Connect { server, address: address.to_string(), error };
    let mut control = open_control(server, address)?;
    let hello = SendRecvHello {
        sendrecv_version: SENDRECV_CONTROL_VERSION,
        region: region.descriptor().clone(),
        reply_queue: ClientRegionLayout::reply_queue(server),
        doorbell_offset_bytes: ClientRegionLayout::DOORBELL_OFFSET_BYTES,
    };
    write_json_line(&mut control, &hello).map_err(connect_error)?;
    let reply: SendRecvServerReply = read_json_line(&mut control).map_err(connect_error)?;
    let (server_descriptor, request_queue, server_doorbell) = match reply {
        SendRecvServerReply::Accepted { region, request_queue, doorbell_offset_bytes } => {
            (region, request_queue, doorbell_offset_bytes)
        }
        SendRecvServerReply::Refused { reason } => {
            return Err(connect_error(std::io::Error::new(ErrorKind::ConnectionRefused, reason)))
        }
    };
    let remote = fabric.map(&server_descriptor).map_err(|error| fabric_error(server, error))?;
    // Our reply queue is fresh (registered zeroed) and the server sends only in answer to a
    // request, so posting our receive buffers now, before the first request, is in time.
    let receiver = ReceiveQueue::new(
        fabric,
        Arc::clone(region),
        remote.clone(),
        QueueAddresses {
            queue: hello.reply_queue,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            sender_doorbell_offset_bytes: server_doorbell,
        },
    )
    .map_err(|error| fabric_error(server, error))?;
    let sender = SendQueue::new(
        fabric,
        remote.clone(),
        Arc::clone(region),
        QueueAddresses {
            queue: request_queue,
            receiver_doorbell_offset_bytes: server_doorbell,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        },
    )
    .map_err(|error| fabric_error(server, error))?;
    control.set_nonblocking(true).map_err(|error| TransportError::Io { server, error })?;
    Ok(Connection {
        control,
        sender,
        receiver,
        outgoing: Vec::new(),
        sent: 0,
        incoming: Vec::with_capacity(SENDRECV_BUFFER_BYTES),
        server_region: remote,
        request_queue,
    })
}

impl ClientTransport for SendRecvClientTransport {
    fn server_count(&self) -> usize {
        self.connections.len()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let message_bytes_max = connection.sender.message_bytes_max();
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
                self.flush()?; // the server may have posted buffers again
            }
            let delivered = self.drain(&mut deliver)?;
            if delivered > 0 || timeout == Some(Duration::ZERO) {
                return Ok(delivered);
            }
            // Bounded spin (the doorbell's), then sleep, as the write-poll transport does.
            let Some(sleep) = super::doorbell_sleep(started, timeout) else { return Ok(0) };
            let connections = &self.connections;
            // Wake for a completion, or for a post that a blocked send (RNR) waits for.
            let ready = || {
                connections.iter().any(|connection| {
                    connection.receiver.has_pending()
                        || (connection.sent < connection.outgoing.len() && connection.sender.receiver_ready())
                })
            };
            if self.doorbell.wait_until(ready, sleep).is_err() {
                self.check_control()?;
            }
        }
    }
}
