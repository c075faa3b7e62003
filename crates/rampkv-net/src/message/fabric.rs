//! What the fabric adapters (ring, send/recv, RF-RPC) share: the fabric handle, a side's own
//! region, the control handshake, and the client medium.
//!
//! # Regions
//! Each side registers one region: a 64-byte header (the doorbell of its poller, at offset 0),
//! then one slot per connection (a client: one per server; a server group: one per connection
//! of each medium, in one area per medium). A medium ([`FabricKind`]) says how many bytes its
//! slot takes on either side and builds its channel from the two slots' addresses.
//!
//! # Control path (like rdma-cm)
//! The client opens a TCP *control* connection to the server's control address, sends one JSON
//! line ([`ControlHello`]: the medium and where its slot lies in the client's region) and gets
//! one back ([`ControlReply`]: where the connection lies in the server group's region, or a
//! typed [`Refusal`]). Both then map the other's region. The control connection stays open: its
//! end tells the server the client is gone (the slot is freed), and the server shutting it down
//! tells the client it was dropped. Byte-level formats: `docs/wire.md`.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::marker::PhantomData;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rampkv_fabric::{Access, Doorbell, Fabric, FabricError, OneSided, RegionDescriptor, ShmFabric};
use serde::{Deserialize, Serialize};

use super::rfrpc::{RfRpcAccept, RfRpcHello};
use super::ring::{RingAccept, RingHello};
use super::sendrecv::{SendRecvAccept, SendRecvHello};
use super::{Channel, ChannelError};
use crate::item_slots::ItemRegionInfo;
use crate::transport::{ClientMedium, OpenMedium};
use rampkv_core::limits::{WRITEPOLL_CONTROL_LINE_BYTES_MAX, WRITEPOLL_CONTROL_TIMEOUT_MS, WRITEPOLL_SLEEP_MS_MAX};

/// Version of the control handshake.
pub const CONTROL_VERSION: u32 = 2;

/// A fabric the store runs over: the shared-memory fabric by default, the in-memory one in
/// tests. Bundles the bounds the adapters need, and how to open the process's fabric.
pub trait FabricHandle:
    Fabric<LocalRegion: Send + Sync + 'static>
    + OneSided<RemoteRegion: Clone + Send + Sync + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
    /// This process's fabric.
    fn open() -> Result<Self, FabricError>;
}

impl FabricHandle for ShmFabric {
    fn open() -> Result<Self, FabricError> {
        ShmFabric::new()
    }
}

impl FabricHandle for rampkv_fabric::MemoryFabric {
    fn open() -> Result<Self, FabricError> {
        Ok(rampkv_fabric::MemoryFabric::global())
    }
}

static REGION_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A region name unique in this process (`<prefix>-<n>`).
pub(crate) fn unique_region_name(prefix: &str) -> String {
    format!("{prefix}-{}", REGION_COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// One side's own region: the fabric, the region, its descriptor.
pub struct Endpoint<F: FabricHandle> {
    pub fabric: F,
    pub region: Arc<F::LocalRegion>,
    pub descriptor: RegionDescriptor,
}

impl<F: FabricHandle> Endpoint<F> {
    /// The doorbell of the region owner's poller.
    pub const DOORBELL_OFFSET_BYTES: u64 = 0;
    /// Bytes before the first slot.
    pub const HEADER_BYTES: usize = 64;

    /// Registers a region named `<prefix>-<n>` of `bytes` (read-write for peers).
    pub fn register(fabric: F, prefix: &str, bytes: usize) -> Result<Self, FabricError> {
        let region = fabric.register(&unique_region_name(prefix), bytes, Access::ReadWrite)?;
        let descriptor = fabric.describe(&region);
        Ok(Self { fabric, region: Arc::new(region), descriptor })
    }

    /// The doorbell of this side's poller.
    pub fn doorbell(&self) -> Result<Doorbell<Arc<F::LocalRegion>>, FabricError> {
        Doorbell::new(Arc::clone(&self.region), Self::DOORBELL_OFFSET_BYTES as usize)
    }
}

/// The fabric media.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediumKind {
    Ring,
    SendRecv,
    RfRpc,
}

/// One fabric medium: its slots, its handshake and its channels.
pub trait FabricKind<F: FabricHandle>: 'static {
    const KIND: MediumKind;
    /// Bytes of one connection's slot in the client's region and in the server group's.
    const CLIENT_SLOT_BYTES: usize;
    const SERVER_SLOT_BYTES: usize;
    type Client: Channel;
    type Server: Channel;
    type Hello: Clone;
    type Accept;

    /// The client's hello for the slot at `slot_offset_bytes` of its region.
    fn hello(client: &Endpoint<F>, slot_offset_bytes: usize) -> Self::Hello;
    fn wrap_hello(hello: Self::Hello) -> MediumHello;
    fn wrap_accept(accept: Self::Accept) -> MediumAccept;
    fn unwrap_accept(accept: MediumAccept) -> Option<Self::Accept>;

    /// The client's channel once the server accepted (input from outside: checked).
    fn connect(
        client: &Endpoint<F>,
        hello: Self::Hello,
        accept: Self::Accept,
        control: TcpStream,
    ) -> Result<Self::Client, ChannelError>;

    /// The server's channel for a client's hello in the slot at `slot_offset_bytes` of the
    /// group's region (input from outside: the fabric checks the descriptor, the ring and queue
    /// constructors every offset), and the answer; `items` is the server's item region.
    fn accept(
        server: &Endpoint<F>,
        slot_offset_bytes: usize,
        hello: Self::Hello,
        control: TcpStream,
        items: Option<ItemRegionInfo>,
    ) -> Result<(Self::Server, Self::Accept), Refusal>;
}

/// A client's hello, per medium.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "medium", rename_all = "snake_case")]
pub enum MediumHello {
    Ring(RingHello),
    SendRecv(SendRecvHello),
    RfRpc(RfRpcHello),
}

/// The server's acceptance, per medium.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "medium", rename_all = "snake_case")]
pub enum MediumAccept {
    Ring(RingAccept),
    SendRecv(SendRecvAccept),
    RfRpc(RfRpcAccept),
}

/// The client's control line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlHello {
    /// Must be [`CONTROL_VERSION`].
    pub version: u32,
    pub hello: MediumHello,
}

/// The server's control line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ControlReply {
    Accepted { accept: MediumAccept },
    Refused { refusal: Refusal },
}

/// Why a server refused a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "refusal", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Refusal {
    #[error("control version {version} is not {supported}")]
    Version { version: u32, supported: u32 },
    /// The line did not parse (the parser's words).
    #[error("bad hello: {message}")]
    BadHello { message: String },
    #[error("all {slots} {medium:?} connection slots are in use")]
    NoFreeSlot { medium: MediumKind, slots: u64 },
    #[error("the client's messages must allow at least {bytes_min} bytes")]
    MessagesTooSmall { bytes_min: u64 },
    /// The client's region could not be mapped (the fabric's words).
    #[error("cannot map the client's region: {message}")]
    Region { message: String },
    /// The client's addresses break a layout rule (the fabric's words).
    #[error("the client's addresses are invalid: {message}")]
    Layout { message: String },
}

impl Refusal {
    pub(crate) fn region(error: FabricError) -> Refusal {
        Refusal::Region { message: error.to_string() }
    }
    pub(crate) fn layout(error: impl std::fmt::Display) -> Refusal {
        Refusal::Layout { message: error.to_string() }
    }
}

/// Writes `value` as one JSON line.
pub(crate) fn write_json_line<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one JSON line of at most `WRITEPOLL_CONTROL_LINE_BYTES_MAX` bytes (the stream's read
/// timeout bounds the wait). The reader is limited to that many bytes, so a peer cannot make us
/// buffer more; one line is all either side sends before waiting for the other, so the buffered
/// reader cannot swallow bytes meant for later.
pub(crate) fn read_json_line<T: for<'de> Deserialize<'de>>(stream: &mut TcpStream) -> std::io::Result<T> {
    let mut line = Vec::with_capacity(256);
    let limit = WRITEPOLL_CONTROL_LINE_BYTES_MAX as u64 + 1;
    BufReader::new(Read::by_ref(stream).take(limit)).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "control line too long or cut off"));
    }
    serde_json::from_slice(&line).map_err(|error| std::io::Error::new(ErrorKind::InvalidData, error))
}

/// Checks a control connection without blocking: nothing is sent after the handshake, so the
/// end of the stream means the other side dropped the connection.
pub(crate) fn check_control(control: &mut TcpStream) -> Result<(), ChannelError> {
    let mut scratch = [0u8; 64];
    match control.read(&mut scratch) {
        Ok(0) => Err(ChannelError::Closed),
        Ok(_) => Ok(()), // nothing is expected after the handshake; ignore it
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Opens the control connection to `address` and runs the client's side of the handshake
/// (blocking, each step bounded by the control timeout). Returns the server's acceptance and
/// the control stream, now non-blocking.
fn handshake(address: &str, hello: MediumHello) -> Result<(MediumAccept, TcpStream), ChannelError> {
    let timeout = Duration::from_millis(WRITEPOLL_CONTROL_TIMEOUT_MS);
    let socket_address = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing"))?;
    let mut control = TcpStream::connect_timeout(&socket_address, timeout)?;
    control.set_read_timeout(Some(timeout))?;
    control.set_nodelay(true)?;
    write_json_line(&mut control, &ControlHello { version: CONTROL_VERSION, hello })?;
    match read_json_line(&mut control)? {
        ControlReply::Accepted { accept } => {
            control.set_nonblocking(true)?;
            Ok((accept, control))
        }
        ControlReply::Refused { refusal } => Err(ChannelError::Refused(refusal)),
    }
}

/// A client's fabric medium `K`: its region (one slot per server) and its poller's doorbell.
pub struct FabricClient<F: FabricHandle, K> {
    endpoint: Endpoint<F>,
    doorbell: Doorbell<Arc<F::LocalRegion>>,
    _kind: PhantomData<K>,
}

impl<F: FabricHandle, K> std::fmt::Debug for FabricClient<F, K> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("FabricClient").field("region", &self.endpoint.descriptor.name).finish()
    }
}

impl<F: FabricHandle, K> FabricClient<F, K> {
    /// The fabric the client maps regions with.
    pub fn fabric(&self) -> &F {
        &self.endpoint.fabric
    }
}

impl<F: FabricHandle, K: FabricKind<F>> OpenMedium for FabricClient<F, K> {
    fn open(servers: usize) -> Result<Self, ChannelError> {
        let bytes = Endpoint::<F>::HEADER_BYTES + servers * K::CLIENT_SLOT_BYTES;
        let endpoint = Endpoint::register(F::open()?, "client", bytes)?;
        let doorbell = endpoint.doorbell()?;
        Ok(Self { endpoint, doorbell, _kind: PhantomData })
    }
}

impl<F: FabricHandle, K: FabricKind<F>> ClientMedium for FabricClient<F, K> {
    type Channel = K::Client;

    fn connect(&mut self, server: usize, address: &str) -> Result<K::Client, ChannelError> {
        let hello = K::hello(&self.endpoint, Endpoint::<F>::HEADER_BYTES + server * K::CLIENT_SLOT_BYTES);
        let (accept, control) = handshake(address, K::wrap_hello(hello.clone()))?;
        let accept = K::unwrap_accept(accept).ok_or(ChannelError::WrongMedium)?;
        K::connect(&self.endpoint, hello, accept, control)
    }

    /// Waits on the doorbell (a bounded spin, then a sleep of at most `WRITEPOLL_SLEEP_MS_MAX`,
    /// so that the control connections are checked that often) for a channel to become
    /// readable or writable. True if it timed out.
    fn wait(&mut self, channels: &mut [K::Client], timeout: Option<Duration>) -> Result<bool, ChannelError> {
        let slice = Duration::from_millis(WRITEPOLL_SLEEP_MS_MAX);
        let ready = || channels.iter().any(|channel| channel.readable() || channel.writable());
        Ok(self.doorbell.wait_until(ready, timeout.map_or(slice, |timeout| timeout.min(slice))).is_err())
    }
}
