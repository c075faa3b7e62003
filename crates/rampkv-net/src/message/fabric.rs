//! What the fabric adapters (ring, send/recv, RF-RPC) share: the fabric handle, a side's own
//! region, the client's side of the control handshake (its lines are in [`super::control`]),
//! and the client medium.
//!
//! # Regions
//! A client registers one region: a 64-byte header (the doorbell of its poller, at offset 0),
//! then one slot per server. A server's fabric front end registers a *doorbell region* (its
//! poller's doorbell, which every client maps to ring it) and **one region per connection**
//! (the connection's slot at offset 0), so that a client maps only its own connection's memory
//! read-write (and the item slots read-only): it cannot reach another client's rings. A medium
//! ([`FabricKind`]) fixes its slot's layout on either side, so a slot's offset is all a peer
//! needs to know; it builds the channel from the two slots and the two doorbells.
//!
//! # Control path (like rdma-cm)
//! The client opens a TCP *control* connection to the server's control address and sends one
//! JSON line ([`ControlHello`]: the medium, its region and its slot's offset). The server answers
//! with a random challenge ([`ControlReply::Challenge`]); the client writes it at the start of
//! its slot and says so ([`ControlResponse`]); the server maps the client's region (only if it is
//! not one of the server's own), reads the challenge back, registers the connection's region,
//! builds its end and answers ([`ControlReply::Accepted`]: the connection's region and slot, its
//! doorbell region, GET\*'s item region), or refuses with a typed
//! [`Refusal`](super::control::Refusal) at any step. The control connection stays open: its end
//! tells the server the client is gone (the slot is freed), and the server shutting it down
//! tells the client it was dropped. Byte formats: `docs/wire.md`.
//!
//! # Fault model
//! A region descriptor and an offset from the peer are input from outside: the fabric checks the
//! descriptor when mapping, the ring, queue and RPC constructors check every address against the
//! region. A hello naming a region of this process's servers is refused; one naming a region
//! the client cannot write (another user's, or another user naming ours) fails the challenge.
//! A peer that breaks its channel later is the poller's business (the channel fails): it can
//! reach only its own connection's region and the shared doorbell, whose corruption costs other
//! connections at most a sleep slice of latency (`docs/security.md`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::marker::PhantomData;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rampkv_fabric::{
    Access, AnyFabric, Capabilities, Doorbell, Doorbells, Fabric, FabricChoice, FabricError, OneSided,
    RegionDescriptor, ShmFabric, StoreOrdering, Words,
};
use serde::{Deserialize, Serialize};

use super::control::{
    ControlHello, ControlReply, ControlResponse, ControlToken, ItemRegionInfo, MediumKind, CONTROL_VERSION,
};
use super::{Channel, ChannelError, ClientMedium, OpenMedium};
use crate::auth::{ProofLabel, SharedSecret};
use rampkv_core::limits::{
    CONTROL_CHALLENGE_BYTES, WRITEPOLL_CONTROL_LINE_BYTES_MAX, WRITEPOLL_CONTROL_TIMEOUT_MS, WRITEPOLL_SLEEP_MS_MAX,
};

/// A fabric the store runs over: [`AnyFabric`] (shared memory on one host, RDMA verbs across
/// hosts, as `--fabric` chose; replication's log regions too), the shared-memory one alone, the
/// in-memory one in tests. Bundles the bounds the adapters need, and how to open the process's fabric.
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

    /// The medium a mapped region is reached through (`shm`, `verbs`, ...), for what a client
    /// reports it chose.
    fn medium_name(&self, _remote: &Self::RemoteRegion) -> &'static str;
}

/// The fabric choice of this process (`--fabric`), and its fabric once opened: every front end,
/// item region and client of the process shares one [`AnyFabric`] (one RDMA device context,
/// one rendezvous listener, one queue pair per peer process).
static PROCESS_FABRIC: Mutex<(Option<FabricChoice>, Option<AnyFabric>)> = Mutex::new((None, None));

fn process_fabric() -> std::sync::MutexGuard<'static, (Option<FabricChoice>, Option<AnyFabric>)> {
    PROCESS_FABRIC.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sets this process's fabric choice (`--fabric`; without a call: [`FabricChoice::Auto`]) and
/// opens the fabric now, so that a forced choice that cannot be met (`verbs` without an active
/// RDMA port) is an error at start-up. Returns what the opened fabric can do.
///
/// # Errors
/// The fabric's, e.g. [`FabricError::VerbsUnavailable`] for a forced `verbs`.
pub fn set_fabric_choice(choice: FabricChoice) -> Result<Capabilities, FabricError> {
    let fabric = AnyFabric::open(choice)?;
    let capabilities = fabric.capabilities();
    *process_fabric() = (Some(choice), Some(fabric));
    Ok(capabilities)
}

/// This process's fabric choice ([`FabricChoice::Auto`] unless [`set_fabric_choice`] said
/// otherwise): what a process passes on to the server processes it starts.
pub fn fabric_choice() -> FabricChoice {
    process_fabric().0.unwrap_or(FabricChoice::Auto)
}

/// What this process's fabric chose and can do, e.g. `fabric auto: shm, no verbs (no RDMA
/// device)`, once it is open (None before).
pub fn fabric_summary() -> Option<String> {
    process_fabric().1.as_ref().map(|opened| opened.capabilities().to_string())
}

impl FabricHandle for AnyFabric {
    /// The process's fabric (opened at the first call with the process's choice).
    fn open() -> Result<Self, FabricError> {
        let mut fabric = process_fabric();
        if let Some(opened) = &fabric.1 {
            return Ok(opened.clone());
        }
        let opened = AnyFabric::open(fabric.0.unwrap_or(FabricChoice::Auto))?;
        fabric.1 = Some(opened.clone());
        Ok(opened)
    }

    fn medium_name(&self, remote: &Self::RemoteRegion) -> &'static str {
        self.medium_of(remote).as_str()
    }
}

impl FabricHandle for ShmFabric {
    fn open() -> Result<Self, FabricError> {
        ShmFabric::new()
    }

    fn medium_name(&self, _remote: &Self::RemoteRegion) -> &'static str {
        "shm"
    }
}

impl FabricHandle for rampkv_fabric::MemoryFabric {
    fn open() -> Result<Self, FabricError> {
        Ok(rampkv_fabric::MemoryFabric::global())
    }

    fn medium_name(&self, _remote: &Self::RemoteRegion) -> &'static str {
        "memory"
    }
}

static REGION_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A region name unique in this process (`<prefix>-<n>`).
pub(crate) fn unique_region_name(prefix: &str) -> String {
    format!("{prefix}-{}", REGION_COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Where a region's owner keeps the doorbell of its poller.
pub const DOORBELL_OFFSET_BYTES: usize = 0;
/// Bytes of a client region before its first slot; also the size of a server's doorbell region.
pub const HEADER_BYTES: usize = 64;

/// Names of the regions this process's server front ends registered (their doorbell,
/// connection and item regions). A control hello that names one is refused: otherwise a client
/// could make a server use its own item region, or another connection's region, as that
/// client's memory. Bounded by what is registered at once (connection caps, servers).
static SERVED_REGIONS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn served_regions() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    SERVED_REGIONS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A server region's entry in this process's list of served regions; removed when dropped.
#[derive(Debug)]
pub struct ServedRegion(String);

impl ServedRegion {
    /// Records `descriptor` as a region of this process's servers.
    pub fn claim(descriptor: &RegionDescriptor) -> Self {
        served_regions().insert(descriptor.name.clone());
        Self(descriptor.name.clone())
    }

    /// Whether `descriptor` names a region of this process's servers.
    pub fn is_served(descriptor: &RegionDescriptor) -> bool {
        served_regions().contains(&descriptor.name)
    }
}

impl Drop for ServedRegion {
    fn drop(&mut self) {
        served_regions().remove(&self.0);
    }
}

/// One side's own region.
pub struct Endpoint<F: FabricHandle> {
    pub fabric: F,
    pub region: Arc<F::LocalRegion>,
    pub descriptor: RegionDescriptor,
}

impl<F: FabricHandle> Endpoint<F> {
    /// Registers a region named `<prefix>-<n>` of `bytes` (read-write for peers).
    pub fn register(fabric: F, prefix: &str, bytes: usize) -> Result<Self, FabricError> {
        let region = fabric.register(&unique_region_name(prefix), bytes, Access::ReadWrite)?;
        let descriptor = fabric.describe(&region);
        Ok(Self { fabric, region: Arc::new(region), descriptor })
    }

    /// The doorbell of this side's poller.
    pub fn doorbell(&self) -> Result<Doorbell<Arc<F::LocalRegion>>, FabricError> {
        Doorbell::new(Arc::clone(&self.region), DOORBELL_OFFSET_BYTES)
    }
}

/// The two slots of a connection: ours in our region, the peer's in its region, and where the
/// two pollers' doorbells are when not at `DOORBELL_OFFSET_BYTES` of those regions (a server's
/// doorbell is in its doorbell region).
pub struct Link<'a, F: FabricHandle> {
    pub local: &'a Endpoint<F>,
    pub local_slot: usize,
    pub peer: F::RemoteRegion,
    pub peer_slot: usize,
    pub doorbells: Doorbells<F::RemoteRegion, Arc<F::LocalRegion>>,
    /// Kept open: its end is the other side's end.
    pub control: TcpStream,
    /// The server's connection region in this process's list of served regions (None on a
    /// client): kept by the channel, which holds the region.
    pub served: Option<ServedRegion>,
}

/// One fabric medium: its slots and the two ends of its channels.
pub trait FabricKind<F: FabricHandle>: 'static {
    const KIND: MediumKind;
    /// Bytes of a connection's slot in the client's region and in the server's connection region.
    const CLIENT_SLOT_BYTES: usize;
    const SERVER_SLOT_BYTES: usize;
    type Client: Channel;
    type Server: Channel;

    /// The client's end, once the server accepted.
    fn client(link: Link<'_, F>) -> Result<Self::Client, ChannelError>;

    /// The server's end, built before the server answers (so that the client's first message
    /// finds it ready).
    fn server(link: Link<'_, F>) -> Result<Self::Server, ChannelError>;
}

/// Writes `value` as one JSON line.
pub(crate) fn write_json_line<T: Serialize>(stream: &mut TcpStream, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)
}

/// Reads one JSON line of at most `WRITEPOLL_CONTROL_LINE_BYTES_MAX` bytes (the stream's read
/// timeout bounds the wait; the reader is limited to that many bytes, so a peer cannot make us
/// buffer more; one line is all either side sends before waiting for the other).
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
    match control.read(&mut [0u8; 64]) {
        Ok(0) => Err(ChannelError::Closed),
        Ok(_) => Ok(()), // nothing is expected after the handshake; ignore it
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// A client's fabric medium `K`: its region (one slot per server), its poller's doorbell, and
/// the item region each server announced.
pub struct FabricClient<F: FabricHandle, K> {
    endpoint: Endpoint<F>,
    /// The shared secret this client proves (None: it does not authenticate).
    secret: Option<Arc<SharedSecret>>,
    doorbell: Doorbell<Arc<F::LocalRegion>>,
    items: Vec<Option<ItemRegionInfo>>,
    /// Per server: the medium its connection region was mapped through.
    media: Vec<&'static str>,
    _kind: PhantomData<K>,
}

impl<F: FabricHandle, K> std::fmt::Debug for FabricClient<F, K> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("FabricClient").field("region", &self.endpoint.descriptor.name).finish()
    }
}

impl<F: FabricHandle, K: FabricKind<F>> FabricClient<F, K> {
    /// The client's side for `servers` servers over `fabric` (a fabric handle of its own, e.g.
    /// the in-memory fabric in its fault mode).
    pub fn with_fabric(fabric: F, servers: usize) -> Result<Self, ChannelError> {
        let endpoint = Endpoint::register(fabric, "client", HEADER_BYTES + servers * K::CLIENT_SLOT_BYTES)?;
        let doorbell = endpoint.doorbell()?;
        let secret = crate::auth::client_secret();
        Ok(Self { endpoint, secret, doorbell, items: Vec::new(), media: Vec::new(), _kind: PhantomData })
    }
}

impl<F: FabricHandle, K> FabricClient<F, K> {
    /// Stores `challenge` (None: zeroes) at the start of our slot at `slot` (release: the
    /// server reads it after our next control line).
    fn write_challenge(&self, slot: usize, challenge: Option<&ControlToken>) {
        let first = slot / 8;
        let words =
            (0..CONTROL_CHALLENGE_BYTES / 8).map(|index| challenge.map_or(0, |challenge| challenge.word(index)));
        for (index, word) in words.enumerate() {
            self.endpoint.region.store(first + index, word, StoreOrdering::Release);
        }
    }

    /// With a secret: the proof `label`'s side sends for `first` and `second` (as
    /// `crate::auth` orders them: the client puts the challenge first).
    fn control_proof(
        &self,
        label: ProofLabel,
        first: &ControlToken,
        second: Option<&ControlToken>,
    ) -> Option<ControlToken> {
        let (secret, second) = (self.secret.as_ref()?, second?);
        Some(ControlToken(secret.proof(label, &first.0, &second.0)))
    }

    /// Replaces the secret this client proves (None: none), e.g. to play a client without the
    /// cluster's secret in a test.
    pub fn set_secret(&mut self, secret: Option<Arc<SharedSecret>>) {
        self.secret = secret;
    }

    /// The fabric the client maps regions with.
    pub fn fabric(&self) -> &F {
        &self.endpoint.fabric
    }

    /// GET\*: the item region server `server` announced, if any.
    pub fn item_region(&self, server: usize) -> Option<&ItemRegionInfo> {
        self.items.get(server).and_then(Option::as_ref)
    }

    /// The medium server `server`'s region was last mapped through (`-` before it was).
    pub fn medium_name(&self, server: usize) -> &'static str {
        self.media.get(server).copied().unwrap_or("-")
    }

    /// Waits on the doorbell (a bounded spin, then a sleep of at most `WRITEPOLL_SLEEP_MS_MAX`,
    /// so that the control connections are checked that often) until `ready`. True if it timed
    /// out.
    pub fn wait_ready(&self, ready: impl Fn() -> bool, timeout: Option<Duration>) -> bool {
        let slice = Duration::from_millis(WRITEPOLL_SLEEP_MS_MAX);
        self.doorbell.wait_until(ready, timeout.map_or(slice, |timeout| timeout.min(slice))).is_err()
    }
}

impl<F: FabricHandle, K: FabricKind<F>> OpenMedium for FabricClient<F, K> {
    fn open(servers: usize) -> Result<Self, ChannelError> {
        Self::with_fabric(F::open()?, servers)
    }
}

impl<F: FabricHandle, K: FabricKind<F>> ClientMedium for FabricClient<F, K> {
    type Channel = K::Client;

    /// Runs the client's side of the handshake (blocking, each step bounded by the control
    /// timeout) and builds the channel.
    fn connect(&mut self, server: usize, address: &str) -> Result<K::Client, ChannelError> {
        let slot = HEADER_BYTES + server * K::CLIENT_SLOT_BYTES;
        let timeout = Duration::from_millis(WRITEPOLL_CONTROL_TIMEOUT_MS);
        let socket_address = address
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::new(ErrorKind::NotFound, "address resolves to nothing"))?;
        let mut control = TcpStream::connect_timeout(&socket_address, timeout)?;
        control.set_read_timeout(Some(timeout))?;
        control.set_nodelay(true)?;
        let region = self.endpoint.descriptor.clone();
        let nonce = self.secret.as_ref().map(|_| ControlToken::random()).transpose()?;
        let slot_offset_bytes = slot as u64;
        let hello = ControlHello { version: CONTROL_VERSION, medium: K::KIND, region, slot_offset_bytes, nonce };
        write_json_line(&mut control, &hello)?;
        let challenge = match read_json_line(&mut control)? {
            ControlReply::Challenge { challenge } => challenge,
            ControlReply::Refused { refusal } => return Err(ChannelError::Refused(refusal)),
            ControlReply::Accepted { .. } => return Err(ChannelError::Handshake { expected: "a challenge" }),
        };
        self.write_challenge(slot, Some(&challenge));
        let proof = self.control_proof(ProofLabel::ControlClient, &challenge, nonce.as_ref());
        write_json_line(&mut control, &ControlResponse { proof })?;
        let reply = read_json_line(&mut control);
        // The challenge is no part of any layout: zero it before the slot is used.
        self.write_challenge(slot, None);
        let (region, peer_slot, doorbell, items) = match reply? {
            ControlReply::Accepted { region, slot_offset_bytes, doorbell, items, proof } => {
                if let (Some(secret), Some(nonce)) = (&self.secret, &nonce) {
                    let proven = proof.is_some_and(|proof| {
                        secret.verify(ProofLabel::ControlServer, &nonce.0, &challenge.0, &proof.0)
                    });
                    if !proven {
                        return Err(ChannelError::ServerUnauthenticated);
                    }
                }
                (region, slot_offset_bytes, doorbell, items)
            }
            ControlReply::Refused { refusal } => return Err(ChannelError::Refused(refusal)),
            ControlReply::Challenge { .. } => return Err(ChannelError::Handshake { expected: "a verdict" }),
        };
        control.set_nonblocking(true)?;
        let peer = self.endpoint.fabric.map(&region)?;
        let doorbells = Doorbells { remote: Some(self.endpoint.fabric.map(&doorbell)?), local: None };
        self.items.resize(server + 1, None);
        self.items[server] = items;
        self.media.resize(server + 1, "-");
        self.media[server] = self.endpoint.fabric.medium_name(&peer);
        // Our receiving side is fresh, and the server writes to it only in answer to a request:
        // building it (which zeroes it) after the handshake is in time.
        let peer_slot = peer_slot as usize;
        K::client(Link { local: &self.endpoint, local_slot: slot, peer, peer_slot, doorbells, control, served: None })
    }

    /// Waits on the doorbell (a bounded spin, then a sleep of at most `WRITEPOLL_SLEEP_MS_MAX`,
    /// so that the control connections are checked that often) for a channel to become
    /// readable or writable. True if it timed out.
    fn wait(&mut self, channels: &mut [Option<K::Client>], timeout: Option<Duration>) -> Result<bool, ChannelError> {
        let ready = || channels.iter().flatten().any(|channel| channel.readable() || channel.writable());
        Ok(self.wait_ready(ready, timeout))
    }
}
