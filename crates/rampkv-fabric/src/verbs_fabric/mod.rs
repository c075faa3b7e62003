//! The verbs fabric: [`Fabric`] and [`OneSided`] over real RDMA (libibverbs, see
//! [`crate::verbs`]), so every one-sided path written over the fabric traits runs across hosts.
//!
//! # Design
//! - **Local regions are the shared-memory fabric's**, additionally registered with the device
//!   (`ibv_reg_mr`: remote READ for [`Access::ReadOnly`], READ/WRITE/atomics for
//!   [`Access::ReadWrite`]). The owner keeps its [`Words`] access and its futex doorbells exactly
//!   as on one host, and a peer on the same host can still map the region through /dev/shm.
//! - **A descriptor says both ways in**: [`RegionDescriptor::host`] (this boot's identity) and
//!   [`RegionDescriptor::verbs`] (the owner's rendezvous address, the region's address and rkey).
//! - **One RC queue pair per pair of processes, set up lazily**: `map` of a descriptor whose
//!   rendezvous has no live link connects to the owner's rendezvous listener (a thread of its
//!   fabric, bound to the address of the RDMA port's GID or the one given at open) and exchanges
//!   queue pair endpoints as JSON lines (see `link`). Either side then uses the link for its
//!   own operations: a server mapping its client's regions reuses the client's link.
//! - **Operations** are RDMA READ, WRITE, compare-and-swap and fetch-and-add through a
//!   registered bounce buffer per link, each waited to completion with a bound.
//!   `write_word(Release)` needs no fence of its own: every earlier operation of this process
//!   already completed (each waits for its completion, which for a WRITE means the peer
//!   acknowledged it), and operations on one reliable connection are executed in order.
//! - **Wakes** are SENDs of (region address, word offset) that the owner's wake thread turns
//!   into a futex wake of the local word.
//! - **A dead peer** fails its link (its queue pair's completion fails, or its control
//!   connection ends): every operation on it returns [`FabricError::PeerFailed`] naming the
//!   peer, never hangs; mapping a new descriptor at the same rendezvous connects afresh.

mod link;
pub mod registry;

use crate::error::FabricError;
use crate::fabric::{Access, Fabric, OneSided, RegionDescriptor, VerbsRegionInfo};
use crate::limits::{VERBS_BOUNCE_BYTES, VERBS_LINKS_MAX, VERBS_READ_BATCH_MAX, WORD_BYTES};
use crate::region::host_identity;
use crate::shm::{ShmFabric, ShmLocalRegion};
use crate::verbs::{
    Context, DeviceSelection, LinkLayer, MemoryRegion, PortInfo, ProtectionDomain, RegionAccess, RemoteRegion,
};
use crate::words::{self, FenceOrdering, LoadOrdering, StoreOrdering, Words};
use link::{Link, LinkSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How to open the verbs fabric.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Which device, port and GID (default: the first ACTIVE port, its best GID).
    pub selection: DeviceSelection,
    /// The address the rendezvous listener binds and peers connect to. Default: the IPv4
    /// address of the chosen RoCE GID (InfiniBand has none: give the port's IPoIB address).
    pub rendezvous_ip: Option<IpAddr>,
}

/// What RDMA this process has: the port its verbs fabric uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsPort {
    /// Device name (e.g. `rxe0`, `mlx5_0`).
    pub device: String,
    /// Port number.
    pub port: u8,
    /// The GID used, as an IPv6 address text (RoCE: `::ffff:a.b.c.d`).
    pub gid: String,
    /// The rendezvous listener's address (`ip:port`).
    pub rendezvous: String,
}

impl std::fmt::Display for VerbsPort {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{} port {} gid {} rendezvous {}", self.device, self.port, self.gid, self.rendezvous)
    }
}

/// The verbs fabric of this process. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct VerbsFabric {
    shared: Arc<Shared>,
}

struct Shared {
    shm: ShmFabric,
    pd: ProtectionDomain,
    port: PortInfo,
    rendezvous: String,
    links: Arc<LinkSet>,
    /// Serialises connecting, so that one process makes one link per peer.
    connecting: Mutex<()>,
    stopping: Arc<AtomicBool>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("VerbsFabric")
            .field("device", &self.port.device)
            .field("rendezvous", &self.rendezvous)
            .finish()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Stop the listener: it blocks in accept, so poke it with a connection it will drop.
        self.stopping.store(true, Ordering::Release);
        if let Ok(address) = self.rendezvous.parse::<SocketAddr>() {
            let _ = TcpStream::connect_timeout(&address, Duration::from_millis(200));
        }
        let links: Vec<Arc<Link>> = std::mem::take(&mut *self.links.lock().unwrap_or_else(PoisonError::into_inner));
        for link in links {
            link.fail("the fabric was dropped".to_owned());
        }
    }
}

/// The IP address of a RoCE GID (an IPv4-mapped GID gives the IPv4 address).
fn gid_address(gid: &[u8; 16]) -> Option<IpAddr> {
    let address = Ipv6Addr::from(*gid);
    if let Some(v4) = address.to_ipv4_mapped() {
        return (!v4.is_unspecified()).then_some(IpAddr::V4(v4));
    }
    // A link-local IPv6 GID would need a scope id to connect to; only routable ones serve.
    let link_local = gid[0] == 0xfe && gid[1] & 0xc0 == 0x80;
    (!address.is_unspecified() && !link_local).then_some(IpAddr::V6(address))
}

impl VerbsFabric {
    /// Opens the device, binds the rendezvous listener and starts its thread.
    ///
    /// # Errors
    /// `VerbsUnavailable` naming why: no libibverbs, no device, no active port, no usable GID,
    /// no address for the rendezvous, or the listener cannot bind; `Io` when /dev/shm cannot be
    /// listed (see [`ShmFabric::new`]).
    pub fn open(config: &VerbsConfig) -> Result<VerbsFabric, FabricError> {
        let unavailable = |reason: String| FabricError::VerbsUnavailable { reason };
        let shm = ShmFabric::new()?;
        let context = Context::open(&config.selection).map_err(|error| unavailable(error.to_string()))?;
        let port = context.port().clone();
        let ip = match config.rendezvous_ip {
            Some(ip) => ip,
            None => match port.link_layer {
                LinkLayer::InfiniBand => {
                    return Err(unavailable(format!(
                        "{} is InfiniBand: give the address of its IPoIB interface for the rendezvous",
                        port.device
                    )))
                }
                _ => gid_address(&port.gid).ok_or_else(|| {
                    unavailable(format!("the GID of {} port {} names no usable IP address", port.device, port.port))
                })?,
            },
        };
        let pd = ProtectionDomain::new(&context).map_err(|error| unavailable(error.to_string()))?;
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|error| unavailable(format!("binding the rendezvous listener to {ip}: {error}")))?;
        let rendezvous = listener
            .local_addr()
            .map_err(|error| unavailable(format!("the rendezvous listener's address: {error}")))?
            .to_string();
        let shared = Arc::new(Shared {
            shm,
            pd,
            port,
            rendezvous,
            links: Arc::new(Mutex::new(Vec::new())),
            connecting: Mutex::new(()),
            stopping: Arc::new(AtomicBool::new(false)),
        });
        let weak = Arc::downgrade(&shared);
        let stopping = Arc::clone(&shared.stopping);
        std::thread::Builder::new()
            .name("rampkv-verbs-rendezvous".to_owned())
            .spawn(move || serve_rendezvous(&listener, &weak, &stopping))
            .map_err(|error| unavailable(format!("starting the rendezvous thread: {error}")))?;
        Ok(VerbsFabric { shared })
    }

    /// The port this fabric uses, and its rendezvous.
    pub fn port(&self) -> VerbsPort {
        let port = &self.shared.port;
        VerbsPort {
            device: port.device.clone(),
            port: port.port,
            gid: Ipv6Addr::from(port.gid).to_string(),
            rendezvous: self.shared.rendezvous.clone(),
        }
    }

    /// The rendezvous listener's address.
    pub fn rendezvous(&self) -> &str {
        &self.shared.rendezvous
    }

    /// Live links (queue pairs to peers) of this fabric.
    pub fn links(&self) -> usize {
        self.shared.links.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Registers `region` (an shm region of this process) with the device.
    fn register_shm(&self, region: ShmLocalRegion, access: Access) -> Result<VerbsLocalRegion, FabricError> {
        let region = Arc::new(region);
        let rights = match access {
            Access::ReadOnly => RegionAccess::REMOTE_READ,
            Access::ReadWrite => {
                RegionAccess::LOCAL_WRITE
                    | RegionAccess::REMOTE_READ
                    | RegionAccess::REMOTE_WRITE
                    | RegionAccess::REMOTE_ATOMIC
            }
        };
        let (address, len_bytes) = region.mapped_range();
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(&region) as _;
        // SAFETY: `address` is the start of the region's page-aligned shared mapping of
        // `len_bytes`, which lives as long as the `Arc<ShmLocalRegion>` handed over as `owner`;
        // every process reaches that memory only through atomic 8-byte words (see `shm`).
        let memory = unsafe { MemoryRegion::register_borrowed(&self.shared.pd, address, len_bytes, rights, owner) }
            .map_err(|error| FabricError::VerbsUnavailable { reason: format!("registering a region: {error}") })?;
        let registered = registry::register(address as u64, &region);
        Ok(VerbsLocalRegion { registration: Some(Registration { memory, _registered: registered }), shm: region })
    }

    /// Adds the verbs half of a descriptor.
    fn describe_into(&self, local: &VerbsLocalRegion, descriptor: &mut RegionDescriptor) {
        descriptor.host = host_identity().map(str::to_owned);
        if let Some(registration) = &local.registration {
            let remote = registration.memory.remote();
            descriptor.verbs = Some(VerbsRegionInfo {
                rendezvous: self.shared.rendezvous.clone(),
                addr: remote.address,
                rkey: remote.rkey,
            });
        }
    }

    /// The live link to `peer`, connecting when there is none.
    fn link_to(&self, peer: &str) -> Result<Arc<Link>, FabricError> {
        let find = || {
            let links = self.shared.links.lock().unwrap_or_else(PoisonError::into_inner);
            links.iter().find(|link| link.peer == peer && !link.is_failed()).cloned()
        };
        if let Some(link) = find() {
            return Ok(link);
        }
        let _connecting = self.shared.connecting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(link) = find() {
            return Ok(link);
        }
        if self.links() >= VERBS_LINKS_MAX {
            return Err(FabricError::PeerFailed { peer: peer.to_owned(), reason: "too many RDMA links".to_owned() });
        }
        let link = Link::connect(&self.shared.pd, peer, &self.shared.rendezvous, &self.shared.links)?;
        self.shared.links.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::clone(&link));
        Ok(link)
    }

    fn map_verbs(&self, descriptor: &RegionDescriptor) -> Result<VerbsRemoteRegion, FabricError> {
        let name = &descriptor.name;
        crate::region::check_length(name, descriptor.len_bytes)?;
        let Some(info) = &descriptor.verbs else {
            return Err(FabricError::NoMedium {
                name: name.clone(),
                reason: "the descriptor has no RDMA address".to_owned(),
            });
        };
        let remote = RemoteRegion { address: info.addr, len_bytes: descriptor.len_bytes, rkey: info.rkey };
        remote.check().map_err(|_| FabricError::InvalidRegion { name: name.clone(), reason: "RDMA address range" })?;
        if info.addr % WORD_BYTES as u64 != 0 {
            return Err(FabricError::InvalidRegion { name: name.clone(), reason: "RDMA address not 8-aligned" });
        }
        link::parse_rendezvous(&info.rendezvous)
            .map_err(|_| FabricError::InvalidRegion { name: name.clone(), reason: "rendezvous is not ip:port" })?;
        let link = self.link_to(&info.rendezvous)?;
        Ok(VerbsRemoteRegion { link, remote, access: descriptor.access })
    }
}

/// The rendezvous listener's thread: accepts connections, each served (and then relayed) by a
/// thread of its own, until the fabric is dropped.
fn serve_rendezvous(listener: &TcpListener, fabric: &std::sync::Weak<Shared>, stopping: &AtomicBool) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Some(shared) = fabric.upgrade() else { return };
        let pd = shared.pd.clone();
        let links = Arc::clone(&shared.links);
        drop(shared);
        let spawned = std::thread::Builder::new()
            .name("rampkv-verbs-link".to_owned())
            .spawn(move || Link::accept(&pd, stream, &links, VERBS_LINKS_MAX));
        if let Err(error) = spawned {
            eprintln!("rampkv-fabric: cannot serve an RDMA rendezvous: {error}");
        }
    }
}

/// A region this process registered: shared memory (the owner's [`Words`] and futex doorbells),
/// registered with the RDMA device when there is one.
#[derive(Debug)]
pub struct VerbsLocalRegion {
    // Field order is drop order: deregister, leave the registry, then unmap (the registration
    // holds the mapping alive too).
    registration: Option<Registration>,
    shm: Arc<ShmLocalRegion>,
}

#[derive(Debug)]
struct Registration {
    memory: MemoryRegion,
    _registered: registry::Registered,
}

impl VerbsLocalRegion {
    /// A region without RDMA registration.
    pub(crate) fn shm_only(region: ShmLocalRegion) -> Self {
        VerbsLocalRegion { registration: None, shm: Arc::new(region) }
    }

    /// The shared-memory region.
    pub fn shm(&self) -> &ShmLocalRegion {
        &self.shm
    }

    /// Whether the region is registered with an RDMA device.
    pub fn is_registered(&self) -> bool {
        self.registration.is_some()
    }
}

impl Words for VerbsLocalRegion {
    crate::words::delegate_words!(shm);
}

/// A peer's region reached over RDMA. Cloning shares the link.
#[derive(Clone, Debug)]
pub struct VerbsRemoteRegion {
    link: Arc<Link>,
    remote: RemoteRegion,
    access: Access,
}

impl VerbsRemoteRegion {
    /// The peer's rendezvous address.
    pub fn peer(&self) -> &str {
        &self.link.peer
    }

    fn len_bytes(&self) -> usize {
        self.remote.len_bytes as usize
    }

    /// Checks alignment and range (`len_bytes` rounded up to words), as the shm fabric does.
    fn check(&self, offset_bytes: usize, len_bytes: usize) -> Result<u64, FabricError> {
        if offset_bytes % WORD_BYTES != 0 {
            return Err(FabricError::Misaligned { offset_bytes: offset_bytes as u64 });
        }
        match offset_bytes.checked_add(words::padded_bytes(len_bytes)) {
            Some(end) if end <= self.len_bytes() => Ok(offset_bytes as u64),
            _ => Err(FabricError::OutOfBounds {
                offset_bytes: offset_bytes as u64,
                len_bytes: len_bytes as u64,
                region_len_bytes: self.remote.len_bytes,
            }),
        }
    }

    fn check_writable(&self) -> Result<(), FabricError> {
        match self.access {
            Access::ReadWrite => Ok(()),
            Access::ReadOnly => Err(FabricError::NoWriteAccess),
        }
    }
}

/// The one-sided operations, on the region itself (it carries its link): the verbs fabric and
/// [`crate::any::AnyFabric`] both run them.
impl VerbsRemoteRegion {
    pub(crate) fn remote_len_bytes(&self) -> usize {
        self.len_bytes()
    }

    pub(crate) fn read(&self, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        let offset = self.check(offset_bytes, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.link.read(&self.remote, offset, dst)?;
        words::std_fence(FenceOrdering::Acquire);
        Ok(())
    }

    /// Every range checked first (nothing is posted if one is bad); then, if they fit the
    /// link's bounce buffer and one batch, one doorbell and one wait for them all (the
    /// ordering argument is the trait's: one RC queue pair's READs execute in posted order);
    /// otherwise one read after another.
    pub(crate) fn read_many(&self, reads: &mut [(usize, &mut [u8])]) -> Result<(), FabricError> {
        let mut staged = 0usize;
        let mut bytes = 0usize;
        for (offset_bytes, dst) in reads.iter() {
            self.check(*offset_bytes, dst.len())?;
            if !dst.is_empty() {
                staged += 1;
                bytes = bytes.saturating_add(words::padded_bytes(dst.len()));
            }
        }
        if staged <= 1 || staged > VERBS_READ_BATCH_MAX || bytes > VERBS_BOUNCE_BYTES {
            for (offset_bytes, dst) in reads.iter_mut() {
                self.read(*offset_bytes, dst)?;
            }
            return Ok(());
        }
        self.link.read_many(&self.remote, reads)?;
        words::std_fence(FenceOrdering::Acquire);
        Ok(())
    }

    pub(crate) fn write(&self, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        self.check_writable()?;
        let offset = self.check(offset_bytes, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.link.write(&self.remote, offset, src)
    }

    pub(crate) fn compare_and_swap(&self, offset_bytes: usize, expected: u64, new: u64) -> Result<u64, FabricError> {
        self.check_writable()?;
        let offset = self.check(offset_bytes, WORD_BYTES)?;
        self.link.compare_and_swap(&self.remote, offset, expected, new)
    }

    pub(crate) fn fetch_add(&self, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        self.check_writable()?;
        let offset = self.check(offset_bytes, WORD_BYTES)?;
        self.link.fetch_add(&self.remote, offset, add)
    }

    /// Always acquire: the READ completed before the value is loaded from the bounce buffer.
    pub(crate) fn read_word(&self, offset_bytes: usize) -> Result<u64, FabricError> {
        let offset = self.check(offset_bytes, WORD_BYTES)?;
        self.link.read_word(&self.remote, offset)
    }

    /// Release whatever was asked: every earlier operation of this process completed before
    /// this one is posted (see the module's design notes).
    pub(crate) fn write_word(&self, offset_bytes: usize, value: u64) -> Result<(), FabricError> {
        self.check_writable()?;
        let offset = self.check(offset_bytes, WORD_BYTES)?;
        self.link.write_word(&self.remote, offset, value)
    }

    pub(crate) fn wake(&self, offset_bytes: usize) -> Result<(), FabricError> {
        self.check_writable()?;
        let offset = self.check(offset_bytes, WORD_BYTES)?;
        self.link.wake(self.remote.address, offset)
    }
}

impl OneSided for VerbsFabric {
    type RemoteRegion = VerbsRemoteRegion;

    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        remote.remote_len_bytes()
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        remote.read(offset_bytes, dst)
    }
    fn read_many(&self, remote: &Self::RemoteRegion, reads: &mut [(usize, &mut [u8])]) -> Result<(), FabricError> {
        remote.read_many(reads)
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        remote.write(offset_bytes, src)
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        remote.compare_and_swap(offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        remote.fetch_add(offset_bytes, add)
    }
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        _ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        remote.read_word(offset_bytes)
    }
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        _ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        remote.write_word(offset_bytes, value)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        remote.wake(offset_bytes)
    }
    fn reads_are_round_trips(&self, _remote: &Self::RemoteRegion) -> bool {
        true
    }
}

impl Fabric for VerbsFabric {
    type LocalRegion = VerbsLocalRegion;

    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError> {
        let region = self.shared.shm.register(name, len_bytes, access)?;
        self.register_shm(region, access)
    }

    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor {
        let mut descriptor = local.shm.descriptor().clone();
        self.describe_into(local, &mut descriptor);
        descriptor
    }

    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError> {
        self.map_verbs(descriptor)
    }
}

/// Crate-internal hooks for [`crate::any`]: register a shm region with the device, describe
/// either kind, map over RDMA.
impl VerbsFabric {
    pub(crate) fn register_region(
        &self,
        region: ShmLocalRegion,
        access: Access,
    ) -> Result<VerbsLocalRegion, FabricError> {
        self.register_shm(region, access)
    }

    pub(crate) fn describe_region(&self, local: &VerbsLocalRegion, descriptor: &mut RegionDescriptor) {
        self.describe_into(local, descriptor)
    }

    pub(crate) fn map_region(&self, descriptor: &RegionDescriptor) -> Result<VerbsRemoteRegion, FabricError> {
        self.map_verbs(descriptor)
    }
}
