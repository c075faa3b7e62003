//! Per-server choice of medium on the client's side: a fabric medium where the server's regions
//! can be mapped, TCP to that server otherwise.
//!
//! A cluster may mix hosts: a server on this host is reached through shared memory, one on a
//! host with RDMA (when this one has it too) through verbs, and one that neither reaches (another
//! host without RDMA on one side) only over the network. The fabric says which when it maps a
//! region (`FabricError::NoMedium`), on either side of the control handshake: the server, mapping
//! the client's region, refuses with [`Refusal::NoMedium`]; the client, mapping the server's, gets
//! the error itself. [`Fallback`] then connects to that server's TCP address instead, logs it
//! once on stderr, and records it with the medium each other server got
//! ([`take_chosen_media`]: `bench` prints it). The channels above see whole frames either way;
//! the protocol core does not know which medium carried them.
//!
//! Waiting: a fabric waits on its doorbell, TCP on epoll. With only one kind of channel open the
//! wait is that medium's own; with both, epoll is looked at without blocking and the doorbell
//! wait is cut into slices of `FALLBACK_MIXED_WAIT_US`, so a TCP reply waits at most that long
//! beyond its arrival (a mixed cluster's price, paid only by the servers reached over TCP).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use rampkv_fabric::FabricError;

use super::control::Refusal;
use super::fabric::{FabricClient, FabricHandle, FabricKind};
use super::tcp::{TcpChannel, TcpClient};
use super::{BatchStats, Channel, ChannelError, ClientMedium, OpenMedium};
use crate::message::control::ItemRegionInfo;

/// The longest a doorbell wait lasts while TCP channels are open too (their epoll is looked at
/// between slices).
pub const FALLBACK_MIXED_WAIT_US: u64 = 200;

/// What a client chose for one server (`bench` prints it, `INFO` shows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChosenMedium {
    /// A fabric medium: its name (`shm`, `verbs`, `memory`).
    Fabric(&'static str),
    /// The fabric could not reach the server (the reason): TCP instead.
    TcpFallback(String),
}

impl ChosenMedium {
    /// `shm`, `verbs`, `tcp-fallback`, ...
    pub fn name(&self) -> &'static str {
        match self {
            ChosenMedium::Fabric(name) => name,
            ChosenMedium::TcpFallback(_) => "tcp-fallback",
        }
    }
}

/// What this process's clients chose per server address (with the server's index), the latest
/// choice for each; bounded by the addresses a process connects to (its clusters').
static CHOSEN: Mutex<BTreeMap<String, (usize, ChosenMedium)>> = Mutex::new(BTreeMap::new());

fn chosen() -> std::sync::MutexGuard<'static, BTreeMap<String, (usize, ChosenMedium)>> {
    CHOSEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Records `medium` for server `server` at `address`; true if that is news (a first choice, or
/// a change).
fn record(server: usize, address: &str, medium: &ChosenMedium) -> bool {
    chosen().insert(address.to_owned(), (server, medium.clone())).is_none_or(|(_, before)| before != *medium)
}

/// What this process's clients chose since the last call: per server (index, the address of
/// its front end, the medium), in server order.
pub fn take_chosen_media() -> Vec<(usize, String, ChosenMedium)> {
    let mut media: Vec<_> = std::mem::take(&mut *chosen())
        .into_iter()
        .map(|(address, (server, medium))| (server, address, medium))
        .collect();
    media.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    media
}

/// One line of what [`take_chosen_media`] returns: `server 0 (ADDRESS) shm, server 1 (...)
/// tcp-fallback`; None when nothing was chosen (no fabric transport ran).
pub fn media_line(media: &[(usize, String, ChosenMedium)]) -> Option<String> {
    let parts: Vec<String> = media
        .iter()
        .map(|(server, address, medium)| format!("server {server} ({address}) {}", medium.name()))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Why `error` means the fabric cannot reach the peer at all (so TCP is the way), if it does.
pub fn no_medium_reason(error: &ChannelError) -> Option<String> {
    match error {
        ChannelError::Refused(Refusal::NoMedium { reason }) => Some(format!("the server cannot map ours: {reason}")),
        ChannelError::Fabric(error @ FabricError::NoMedium { .. }) => Some(error.to_string()),
        _ => None,
    }
}

/// A channel of [`Fallback`]: the fabric's, or TCP's to a server the fabric cannot reach.
#[derive(Debug)]
pub enum FallbackChannel<C> {
    Fabric(C),
    Tcp(TcpChannel),
}

impl<C: Channel> Channel for FallbackChannel<C> {
    /// Per channel: see [`Channel::is_stream`].
    const STREAM: bool = true;

    fn is_stream(&self) -> bool {
        match self {
            FallbackChannel::Fabric(_) => C::STREAM,
            FallbackChannel::Tcp(_) => TcpChannel::STREAM,
        }
    }

    fn frame_bytes_max(&self) -> usize {
        match self {
            FallbackChannel::Fabric(channel) => channel.frame_bytes_max(),
            FallbackChannel::Tcp(channel) => channel.frame_bytes_max(),
        }
    }

    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        match self {
            FallbackChannel::Fabric(channel) => channel.send(frames),
            FallbackChannel::Tcp(channel) => channel.send(frames),
        }
    }

    fn receive(&mut self, consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        match self {
            FallbackChannel::Fabric(channel) => channel.receive(consume),
            FallbackChannel::Tcp(channel) => channel.receive(consume),
        }
    }

    fn readable(&self) -> bool {
        match self {
            FallbackChannel::Fabric(channel) => channel.readable(),
            FallbackChannel::Tcp(channel) => channel.readable(),
        }
    }

    fn writable(&self) -> bool {
        match self {
            FallbackChannel::Fabric(channel) => channel.writable(),
            FallbackChannel::Tcp(channel) => channel.writable(),
        }
    }

    fn set_ready(&mut self, readable: bool, writable: bool, peer_finished: bool) {
        match self {
            FallbackChannel::Fabric(channel) => channel.set_ready(readable, writable, peer_finished),
            FallbackChannel::Tcp(channel) => channel.set_ready(readable, writable, peer_finished),
        }
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        match self {
            FallbackChannel::Fabric(channel) => channel.batch_stats(),
            FallbackChannel::Tcp(channel) => channel.batch_stats(),
        }
    }

    fn check_peer(&mut self) -> Result<(), ChannelError> {
        match self {
            FallbackChannel::Fabric(channel) => channel.check_peer(),
            FallbackChannel::Tcp(channel) => channel.check_peer(),
        }
    }

    fn partial_frame(&self) -> bool {
        match self {
            FallbackChannel::Fabric(channel) => channel.partial_frame(),
            FallbackChannel::Tcp(channel) => channel.partial_frame(),
        }
    }
}

/// A fabric medium `K` that reaches a server over TCP when the fabric cannot (see the module
/// docs). Without TCP addresses it is the fabric medium alone.
pub struct Fallback<F: FabricHandle, K: FabricKind<F>> {
    fabric: FabricClient<F, K>,
    /// Server i's TCP address (empty: no fallback).
    tcp_addresses: Vec<String>,
    /// Opened at the first fallback.
    tcp: Option<TcpClient>,
}

impl<F: FabricHandle, K: FabricKind<F>> std::fmt::Debug for Fallback<F, K> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Fallback").field("fabric", &self.fabric).field("tcp", &self.tcp_addresses).finish()
    }
}

impl<F: FabricHandle, K: FabricKind<F>> Fallback<F, K> {
    /// `fabric`, falling back to server i's `tcp_addresses[i]` (none: no fallback).
    pub fn new(fabric: FabricClient<F, K>, tcp_addresses: &[String]) -> Self {
        Self { fabric, tcp_addresses: tcp_addresses.to_vec(), tcp: None }
    }

    /// The fabric medium (its fabric, the item regions servers announced).
    pub fn fabric_client(&self) -> &FabricClient<F, K> {
        &self.fabric
    }

    /// The fabric the client maps regions with.
    pub fn fabric(&self) -> &F {
        self.fabric.fabric()
    }

    /// GET\*: the item region server `server` announced, if any (none over TCP).
    pub fn item_region(&self, server: usize) -> Option<&ItemRegionInfo> {
        self.fabric.item_region(server)
    }
}

impl<F: FabricHandle, K: FabricKind<F>> OpenMedium for Fallback<F, K> {
    /// No TCP addresses: the fabric alone.
    fn open(servers: usize) -> Result<Self, ChannelError> {
        Ok(Self::new(FabricClient::open(servers)?, &[]))
    }
}

impl<F: FabricHandle, K: FabricKind<F>> ClientMedium for Fallback<F, K> {
    type Channel = FallbackChannel<K::Client>;

    fn connect(&mut self, server: usize, address: &str) -> Result<Self::Channel, ChannelError> {
        let error = match self.fabric.connect(server, address) {
            Ok(channel) => {
                let medium = ChosenMedium::Fabric(self.fabric.medium_name(server));
                if record(server, address, &medium) {
                    log::info!("server {server} ({address}): {} medium", medium.name());
                }
                return Ok(FallbackChannel::Fabric(channel));
            }
            Err(error) => error,
        };
        let (Some(reason), Some(tcp_address)) = (no_medium_reason(&error), self.tcp_addresses.get(server)) else {
            return Err(error);
        };
        let tcp = match &mut self.tcp {
            Some(tcp) => tcp,
            None => self.tcp.insert(TcpClient::open(self.tcp_addresses.len())?),
        };
        let channel = tcp.connect(server, tcp_address)?;
        let medium = ChosenMedium::TcpFallback(reason.clone());
        if record(server, address, &medium) {
            log::warn!("server {server}: no fabric medium reaches {address} ({reason}); using TCP to {tcp_address}");
        }
        Ok(FallbackChannel::Tcp(channel))
    }

    fn wait(
        &mut self,
        channels: &mut [Option<Self::Channel>],
        timeout: Option<Duration>,
    ) -> Result<bool, ChannelError> {
        let tcp_open = channels.iter().flatten().any(|channel| matches!(channel, FallbackChannel::Tcp(_)));
        let fabric_open = channels.iter().flatten().any(|channel| matches!(channel, FallbackChannel::Fabric(_)));
        let Some(tcp) = self.tcp.as_mut().filter(|_| tcp_open) else {
            return Ok(self.fabric.wait_ready(|| any_ready(channels), timeout));
        };
        let mut set_ready = |server: usize, readable, writable, finished| {
            if let Some(Some(channel @ FallbackChannel::Tcp(_))) = channels.get_mut(server) {
                channel.set_ready(readable, writable, finished);
            }
        };
        if !fabric_open {
            return tcp.wait_events(timeout, &mut set_ready);
        }
        // Both: epoll without blocking, then a slice of the doorbell wait.
        if !tcp.wait_events(Some(Duration::ZERO), &mut set_ready)? {
            return Ok(false);
        }
        let slice = Duration::from_micros(FALLBACK_MIXED_WAIT_US);
        let slice = timeout.map_or(slice, |timeout| timeout.min(slice));
        Ok(self.fabric.wait_ready(|| any_ready(channels), Some(slice)))
    }
}

fn any_ready<C: Channel>(channels: &[Option<C>]) -> bool {
    channels.iter().flatten().any(|channel| channel.readable() || channel.writable())
}
