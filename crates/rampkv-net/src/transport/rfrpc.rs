//! The RF-RPC transport (`--transport rfrpc`): requests written into the server's memory,
//! replies fetched from a slot in the server's memory with one-sided reads
//! (`rampkv_fabric::rpc`; the design is in `docs/fabric.md`, "Remote-fetch RPC").
//!
//! # Per connection (client, server)
//! One RF-RPC connection, fetch-only (no hybrid switch: the driver keeps many requests in
//! flight, so the client polls anyway) with *stream* replies: each request message carries the
//! frames posted since the last call, one wire frame per entry, and at most one call is
//! outstanding; frames posted meanwhile wait for its reply. The server answers a call at once
//! with the reply frames it has (fewer than the request's when S2PL defers a reply to a lock
//! wait) in its reply slot; deferred replies and replies that overflow the slot come later as
//! unsolicited pushes through the push ring in the client's region. The client's `poll` waits
//! on its doorbell: the doorbell's bounded spin reads the outstanding calls' slot status words
//! (8-byte one-sided reads) and the push rings, then it sleeps; the server rings the doorbell
//! after publishing a reply or pushing, but only if the client sleeps (`set_notify_fetchers`).
//!
//! # Control path
//! As write-poll (`transport/writepoll.rs`): a TCP control connection per server with one JSON
//! line each way ([`RfRpcClientHello`], [`RfRpcServerReply`]), kept open so that either side
//! sees the other go.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_fabric::limits::RPC_BATCH_ENTRIES_MAX;
use rampkv_fabric::rpc::{EntryList, ReplyMode, RpcClient, RpcConfig, RpcLayout};
use rampkv_fabric::{Access, Doorbell, Fabric, RegionDescriptor, RingAddresses, RingLayout, ShmFabric, ShmLocalRegion};
use serde::{Deserialize, Serialize};

use super::writepoll::{
    check_control_stream, frame_bytes_at, open_control, read_json_line, unique_region_name, write_json_line,
};
use super::{ClientTransport, TransportError};
use rampkv_core::limits::{RFRPC_REPLY_SLOT_BYTES, RFRPC_RING_BYTES};
use rampkv_core::wire::{FrameHeader, Request, Response};

/// Version of the RF-RPC control handshake.
pub const RFRPC_CONTROL_VERSION: u32 = 1;

/// Where things lie in RF-RPC regions, all 8-aligned:
/// ```text
/// server group: +0 doorbell (16 B, rest of 64 reserved)
///               +64 + i * STRIDE  slot i: +0 push-ring credit word (rest of 64 reserved)
///                                 +64 reply slot (RFRPC_REPLY_SLOT_BYTES)
///                                 +64 + slot bytes: request ring (RFRPC_RING_BYTES)
/// client:       +0 doorbell; +64 + i * (64 + RFRPC_RING_BYTES) per server i: +0 request-ring
///               credit word, +64 push ring
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RfRpcRegionLayout;

impl RfRpcRegionLayout {
    /// Offset of the doorbell in either region.
    pub const DOORBELL_OFFSET_BYTES: u64 = 0;
    /// Bytes of a reply slot.
    pub const REPLY_SLOT_BYTES: usize = RFRPC_REPLY_SLOT_BYTES;
    const HEADER_BYTES: usize = 64;
    const SERVER_STRIDE_BYTES: usize = 64 + RFRPC_REPLY_SLOT_BYTES + RFRPC_RING_BYTES;
    const CLIENT_STRIDE_BYTES: usize = 64 + RFRPC_RING_BYTES;

    /// Bytes of a server group's region with `slots` connection slots.
    pub fn server_region_bytes(slots: usize) -> usize {
        Self::HEADER_BYTES + slots * Self::SERVER_STRIDE_BYTES
    }
    /// Offset of slot `slot`'s push-ring credit word (server region).
    pub fn push_credit_offset_bytes(slot: usize) -> u64 {
        (Self::HEADER_BYTES + slot * Self::SERVER_STRIDE_BYTES) as u64
    }
    /// Offset of slot `slot`'s reply slot (server region).
    pub fn reply_slot_offset_bytes(slot: usize) -> u64 {
        Self::push_credit_offset_bytes(slot) + 64
    }
    /// Slot `slot`'s request ring (server region).
    pub fn request_ring(slot: usize) -> RingLayout {
        Self::ring(Self::reply_slot_offset_bytes(slot) + RFRPC_REPLY_SLOT_BYTES as u64)
    }
    /// Bytes of a client's region for `servers` servers.
    pub fn client_region_bytes(servers: usize) -> usize {
        Self::HEADER_BYTES + servers * Self::CLIENT_STRIDE_BYTES
    }
    /// Offset of the request-ring credit word for server `server` (client region).
    pub fn request_credit_offset_bytes(server: usize) -> u64 {
        (Self::HEADER_BYTES + server * Self::CLIENT_STRIDE_BYTES) as u64
    }
    /// The push ring from server `server` (client region).
    pub fn push_ring(server: usize) -> RingLayout {
        Self::ring(Self::request_credit_offset_bytes(server) + 64)
    }
    fn ring(offset_bytes: u64) -> RingLayout {
        RingLayout {
            offset_bytes,
            ring_bytes: RFRPC_RING_BYTES as u64,
            body_bytes_max: (RFRPC_RING_BYTES / 2 - 16) as u64,
        }
    }
}

/// The client's handshake line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RfRpcClientHello {
    /// Must be [`RFRPC_CONTROL_VERSION`].
    pub version: u32,
    /// The client's region.
    pub region: RegionDescriptor,
    /// The push ring, in the client's region.
    pub push_ring: RingLayout,
    /// The client's doorbell, in the client's region.
    pub doorbell_offset_bytes: u64,
    /// The request ring's credit word, in the client's region.
    pub request_credit_offset_bytes: u64,
}

/// The server's handshake line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RfRpcServerReply {
    /// The connection is set up; the client maps `region`.
    Accepted {
        /// The server group's region.
        region: RegionDescriptor,
        /// This connection's request ring, in the server's region.
        request_ring: RingLayout,
        /// This connection's reply slot, in the server's region.
        reply_slot_offset_bytes: u64,
        /// Its length.
        reply_slot_bytes: u64,
        /// The server poller's doorbell.
        doorbell_offset_bytes: u64,
        /// The push ring's credit word, in the server's region.
        push_credit_offset_bytes: u64,
    },
    /// Refused, and why.
    Refused {
        /// Why.
        reason: String,
    },
}

type Client = RpcClient<ShmFabric, Arc<ShmLocalRegion>>;

struct Connection {
    /// Kept open: its end tells the server we are gone, and us that the server dropped us.
    control: TcpStream,
    client: Client,
    /// Encoded frames not yet sent.
    queued: Vec<u8>,
    entries: EntryList,
}

/// A client's RF-RPC connections to every server of a cluster.
pub struct RfRpcClientTransport {
    _region: Arc<ShmLocalRegion>,
    doorbell: Doorbell<Arc<ShmLocalRegion>>,
    connections: Vec<Connection>,
}

impl std::fmt::Debug for RfRpcClientTransport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RfRpcClientTransport").field("servers", &self.connections.len()).finish()
    }
}

fn fabric_error(server: usize, error: impl std::fmt::Display) -> TransportError {
    TransportError::Fabric { server, reason: error.to_string() }
}

/// The connection settings: fetch-only, stream replies.
fn rpc_config() -> RpcConfig {
    RpcConfig { hybrid: false, initial_mode: ReplyMode::Fetch, stream_replies: true, ..RpcConfig::default() }
}

impl RfRpcClientTransport {
    /// Connects to every server's control address (server i is `control_addresses[i]`).
    pub fn connect(control_addresses: &[String]) -> Result<Self, TransportError> {
        let fabric = ShmFabric::new().map_err(|error| fabric_error(0, error))?;
        let region = fabric
            .register(
                &unique_region_name("rf-client"),
                RfRpcRegionLayout::client_region_bytes(control_addresses.len()),
                Access::ReadWrite,
            )
            .map_err(|error| fabric_error(0, error))?;
        let region = Arc::new(region);
        let doorbell = Doorbell::new(Arc::clone(&region), RfRpcRegionLayout::DOORBELL_OFFSET_BYTES as usize)
            .map_err(|error| fabric_error(0, error))?;
        let connections = control_addresses
            .iter()
            .enumerate()
            .map(|(server, address)| connect_one(fabric, &region, server, address))
            .collect::<Result<_, _>>()?;
        Ok(Self { _region: region, doorbell, connections })
    }

    /// Sends the queued frames of every connection with no call outstanding.
    fn send_queued(&mut self) -> Result<(), TransportError> {
        for (server, connection) in self.connections.iter_mut().enumerate() {
            if connection.client.has_outstanding() || connection.queued.is_empty() {
                continue;
            }
            let bytes_max = connection.client.request_entries_bytes_max();
            connection.entries.clear();
            let mut taken = 0;
            while taken < connection.queued.len() && connection.entries.len() < RPC_BATCH_ENTRIES_MAX {
                let frame = frame_bytes_at(&connection.queued[taken..]);
                if !connection.entries.is_empty() && connection.entries.packed().len() + 4 + frame > bytes_max {
                    break;
                }
                connection.entries.push(&connection.queued[taken..taken + frame]);
                taken += frame;
            }
            connection.client.client_send(&connection.entries, 0).map_err(|error| fabric_error(server, error))?;
            connection.queued.drain(..taken);
        }
        Ok(())
    }

    /// Delivers every reply frame that is there now: unsolicited pushes, then fetched replies.
    fn drain<F>(&mut self, deliver: &mut F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let mut delivered = 0;
        for (server, connection) in self.connections.iter_mut().enumerate() {
            while let Some(entries) =
                connection.client.try_recv_unsolicited().map_err(|error| fabric_error(server, error))?
            {
                for frame in entries.iter() {
                    deliver_frame(server, frame, deliver)?;
                    delivered += 1;
                }
            }
            if connection.client.has_outstanding() {
                if let Some(reply) = connection.client.try_client_recv().map_err(|error| fabric_error(server, error))? {
                    for frame in reply.entries.iter() {
                        deliver_frame(server, frame, deliver)?;
                        delivered += 1;
                    }
                }
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
}

/// Decodes one reply frame (an entry must be exactly one frame) and delivers it.
fn deliver_frame<F>(server: usize, entry: &[u8], deliver: &mut F) -> Result<(), TransportError>
where
    F: FnMut(usize, u64, Response),
{
    let (header, frame) = match FrameHeader::split(entry) {
        Ok(Some(split)) if split.0.frame_bytes() == entry.len() => split,
        Ok(_) => return Err(TransportError::Fabric { server, reason: "reply entry is not exactly one frame".into() }),
        Err(error) => return Err(TransportError::Malformed { server, error }),
    };
    let response = Response::decode(header.kind, frame).map_err(|error| TransportError::Malformed { server, error })?;
    deliver(server, header.request_id, response);
    Ok(())
}

/// Control handshake and connection set-up for one server.
fn connect_one(
    fabric: ShmFabric,
    region: &Arc<ShmLocalRegion>,
    server: usize,
    address: &str,
) -> Result<Connection, TransportError> {
    let connect_error = |error| TransportError::Connect { server, address: address.to_string(), error };
    let mut control = open_control(server, address)?;
    let hello = RfRpcClientHello {
        version: RFRPC_CONTROL_VERSION,
        region: region.descriptor().clone(),
        push_ring: RfRpcRegionLayout::push_ring(server),
        doorbell_offset_bytes: RfRpcRegionLayout::DOORBELL_OFFSET_BYTES,
        request_credit_offset_bytes: RfRpcRegionLayout::request_credit_offset_bytes(server),
    };
    write_json_line(&mut control, &hello).map_err(connect_error)?;
    let reply: RfRpcServerReply = read_json_line(&mut control).map_err(connect_error)?;
    let (server_descriptor, request_ring, reply_slot_offset_bytes, reply_slot_bytes, server_doorbell, push_credit) =
        match reply {
            RfRpcServerReply::Accepted {
                region,
                request_ring,
                reply_slot_offset_bytes,
                reply_slot_bytes,
                doorbell_offset_bytes,
                push_credit_offset_bytes,
            } => (
                region,
                request_ring,
                reply_slot_offset_bytes,
                reply_slot_bytes,
                doorbell_offset_bytes,
                push_credit_offset_bytes,
            ),
            RfRpcServerReply::Refused { reason } => {
                return Err(connect_error(std::io::Error::new(ErrorKind::ConnectionRefused, reason)))
            }
        };
    let remote = fabric.map(&server_descriptor).map_err(|error| fabric_error(server, error))?;
    let layout = RpcLayout {
        request: RingAddresses {
            ring: request_ring,
            receiver_doorbell_offset_bytes: server_doorbell,
            credit_offset_bytes: hello.request_credit_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        },
        push: RingAddresses {
            ring: hello.push_ring,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            credit_offset_bytes: push_credit,
            sender_doorbell_offset_bytes: server_doorbell,
        },
        reply_slot_offset_bytes,
        reply_slot_bytes,
    };
    // Our push ring is fresh and the server pushes only after our first request, so building
    // the client (which zeroes the push ring) after the handshake is safe.
    let client = RpcClient::new(fabric, remote, Arc::clone(region), layout, rpc_config())
        .map_err(|error| fabric_error(server, error))?;
    control.set_nonblocking(true).map_err(|error| TransportError::Io { server, error })?;
    Ok(Connection { control, client, queued: Vec::new(), entries: EntryList::new() })
}

impl ClientTransport for RfRpcClientTransport {
    fn server_count(&self) -> usize {
        self.connections.len()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let servers = self.connections.len();
        let connection = self.connections.get_mut(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let message_bytes_max = connection.client.request_entries_bytes_max() - 4;
        super::queue_frame(&mut connection.queued, server, request_id, request, message_bytes_max)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        self.send_queued()
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let started = Instant::now();
        loop {
            let delivered = self.drain(&mut deliver)?;
            self.send_queued()?; // a reply frees its connection for the next call
            if delivered > 0 || timeout == Some(Duration::ZERO) {
                return Ok(delivered);
            }
            let Some(sleep) = super::doorbell_sleep(started, timeout) else { return Ok(0) };
            // Wait for a fetched reply (the doorbell's bounded spin reads the slots' status words;
            // the server rings the doorbell after publishing a reply if we sleep) or for an
            // unsolicited push (which rings it too).
            let connections = &self.connections;
            let ready = || {
                connections
                    .iter()
                    .any(|connection| connection.client.push_pending() || connection.client.reply_may_be_ready())
            };
            if self.doorbell.wait_until(ready, sleep).is_err() {
                self.check_control()?;
            }
        }
    }
}
