//! The fabric front end: write-poll rings, send/recv queue pairs and RF-RPC connections to the
//! servers of a group, over any [`FabricHandle`].
//!
//! It registers **one** region at start-up: the doorbell of its poller, then one area per
//! medium with a slot per connection (`FrontConfig` says how many; pages are touched only for
//! slots in use). One region is what lets one poller sleep for all its connections on one
//! doorbell. It runs two threads:
//! - the **control thread** owns one control listener per server (`docs/wire.md`, "Control
//!   handshake"). It reads a client's hello, takes a slot of its medium, builds the connection's
//!   channel, hands it to the poller *before* answering (once the client reads the answer it may
//!   send), and answers. It keeps every control connection open and, when one ends, tells the
//!   poller to drop that connection and free its slot;
//! - the **poller** ([`crate::server::poller`], the same code as the TCP front end's) serves every
//!   connection; idle, it spins a bounded while (the doorbell's) and sleeps on the doorbell, rung
//!   by any client that sends while it sleeps and by the router when another front end hands it a
//!   deferred reply. It does not add a `POLL_SPIN_US` spin on top: measured, that extra spin cost
//!   about 25% of throughput on the shared 2-core machine (docs/performance.md).
//!
//! With item slots configured it also registers an item region per server and attaches it, so
//! that every front end of the group publishes committed versions there (GET\*).
//!
//! # Fault model
//! A client whose hello is malformed, names a bad region or addresses outside it is refused with
//! a typed reason. A connection whose channel breaks (anything no correct client writes) is
//! closed by the poller, which shuts its control connection down so the client learns it, and
//! releases its S2PL locks; others are served throughout.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use rampkv_core::cluster::Front;
use rampkv_core::limits::{
    RFRPC_GROUP_CONNECTIONS_MAX, SENDRECV_GROUP_CONNECTIONS_MAX, WRITEPOLL_CONTROL_TIMEOUT_MS,
    WRITEPOLL_GROUP_CONNECTIONS_MAX,
};
use rampkv_fabric::{Doorbell, ShmFabric, Words};

use super::poller::{FrontEvent, ServerMedium};
use super::router::Wake;
use super::{PollerThread, ServerGroup, Servers};
use crate::item_slots::{ItemRegionInfo, ItemSlotConfig, ItemSlots, Publisher};
use crate::message::fabric::{
    read_json_line, unique_region_name, write_json_line, ControlHello, ControlReply, Endpoint, FabricHandle,
    FabricKind, MediumHello, MediumKind, Refusal, CONTROL_VERSION,
};
use crate::message::rfrpc::{RfRpc, RfRpcServerChannel};
use crate::message::ring::{Ring, RingChannel};
use crate::message::sendrecv::{QueueChannel, SendRecv};
use crate::message::{Channel, ChannelError};

/// The token of the control poll's waker (listeners are `0..servers`, control streams after).
const WAKER_TOKEN: Token = Token(usize::MAX);
const EVENTS_CAPACITY: usize = 256;

/// How many connections of each medium a fabric front end serves, and its GET\* item slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontConfig {
    pub ring_slots: usize,
    pub sendrecv_slots: usize,
    pub rfrpc_slots: usize,
    /// Item regions (GET\*) for the servers, if any.
    pub item_slots: Option<ItemSlotConfig>,
}

impl FrontConfig {
    /// The front end `front` names: `Ring` serves write-poll, send/recv and one-sided clients,
    /// `RfRpc` serves RF-RPC clients; each with its group limit of connections.
    pub fn of(front: Front, item_slots: Option<ItemSlotConfig>) -> Self {
        match front {
            Front::Ring => Self {
                ring_slots: WRITEPOLL_GROUP_CONNECTIONS_MAX,
                sendrecv_slots: SENDRECV_GROUP_CONNECTIONS_MAX,
                rfrpc_slots: 0,
                item_slots,
            },
            Front::RfRpc => {
                Self { ring_slots: 0, sendrecv_slots: 0, rfrpc_slots: RFRPC_GROUP_CONNECTIONS_MAX, item_slots }
            }
        }
    }
}

/// Where one medium's slots lie: global slot numbers `first..first + slots`, at
/// `offset_bytes + (slot - first) * slot_bytes` of the region.
#[derive(Debug, Clone, Copy)]
struct Area {
    first: usize,
    slots: usize,
    offset_bytes: usize,
    slot_bytes: usize,
}

/// The areas of the three media, in the order ring, send/recv, RF-RPC.
#[derive(Debug, Clone, Copy)]
struct Areas([Area; 3]);

impl Areas {
    fn new<F: FabricHandle>(config: &FrontConfig) -> Self {
        let sizes = [
            (config.ring_slots, <Ring as FabricKind<F>>::SERVER_SLOT_BYTES),
            (config.sendrecv_slots, <SendRecv as FabricKind<F>>::SERVER_SLOT_BYTES),
            (config.rfrpc_slots, <RfRpc as FabricKind<F>>::SERVER_SLOT_BYTES),
        ];
        let (mut first, mut offset_bytes) = (0, Endpoint::<F>::HEADER_BYTES);
        Areas(sizes.map(|(slots, slot_bytes)| {
            let area = Area { first, slots, offset_bytes, slot_bytes };
            first += slots;
            offset_bytes += slots * slot_bytes;
            area
        }))
    }

    fn of(&self, kind: MediumKind) -> &Area {
        &self.0[kind as usize]
    }

    fn kind_of(&self, slot: usize) -> Option<MediumKind> {
        [MediumKind::Ring, MediumKind::SendRecv, MediumKind::RfRpc]
            .into_iter()
            .find(|kind| (self.of(*kind).first..self.of(*kind).first + self.of(*kind).slots).contains(&slot))
    }

    fn region_bytes(&self) -> usize {
        let last = &self.0[2];
        last.offset_bytes + last.slots * last.slot_bytes
    }
}

/// A server's end of a fabric connection, of any medium (static dispatch per message).
pub enum FabricChannel<F: FabricHandle> {
    Ring(RingChannel<F>),
    SendRecv(QueueChannel<F>),
    RfRpc(RfRpcServerChannel<F>),
}

macro_rules! each {
    ($channel:expr, $inner:ident => $body:expr) => {
        match $channel {
            FabricChannel::Ring($inner) => $body,
            FabricChannel::SendRecv($inner) => $body,
            FabricChannel::RfRpc($inner) => $body,
        }
    };
}

impl<F: FabricHandle> FabricChannel<F> {
    fn control(&self) -> &std::net::TcpStream {
        each!(self, channel => channel.control())
    }
}

impl<F: FabricHandle> Channel for FabricChannel<F> {
    const STREAM: bool = false;
    fn frame_bytes_max(&self) -> usize {
        each!(self, channel => channel.frame_bytes_max())
    }
    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        each!(self, channel => channel.send(frames))
    }
    fn receive(&mut self, consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        each!(self, channel => channel.receive(consume))
    }
    fn readable(&self) -> bool {
        each!(self, channel => channel.readable())
    }
    fn writable(&self) -> bool {
        each!(self, channel => channel.writable())
    }
}

impl<F: FabricHandle> From<RingChannel<F>> for FabricChannel<F> {
    fn from(channel: RingChannel<F>) -> Self {
        FabricChannel::Ring(channel)
    }
}
impl<F: FabricHandle> From<QueueChannel<F>> for FabricChannel<F> {
    fn from(channel: QueueChannel<F>) -> Self {
        FabricChannel::SendRecv(channel)
    }
}
impl<F: FabricHandle> From<RfRpcServerChannel<F>> for FabricChannel<F> {
    fn from(channel: RfRpcServerChannel<F>) -> Self {
        FabricChannel::RfRpc(channel)
    }
}

/// What the control thread and the poller share.
struct Shared {
    stop: AtomicBool,
    /// Set by the control thread after it sent an event; checked by the poller's wait.
    control_pending: AtomicBool,
    /// Free slots per medium: the control thread takes, the poller gives back.
    free: [Mutex<Vec<usize>>; 3],
}

/// Rings the poller's doorbell (a local ring of the bell: the region is ours).
struct DoorbellWake<F: FabricHandle>(Arc<F::LocalRegion>);

impl<F: FabricHandle> Wake for DoorbellWake<F> {
    fn wake(&self) {
        let index = Endpoint::<F>::DOORBELL_OFFSET_BYTES as usize / 8;
        self.0.fetch_add(index, 1);
        self.0.wake_all(index);
    }
}

/// The fabric front end's medium, for its poller.
pub struct FabricServer<F: FabricHandle> {
    region: Arc<F::LocalRegion>,
    doorbell: Doorbell<Arc<F::LocalRegion>>,
    inbox: Receiver<FrontEvent<FabricChannel<F>>>,
    shared: Arc<Shared>,
    areas: Areas,
}

impl<F: FabricHandle> FabricServer<F> {
    /// Moves what the control thread sent into `events`; true if there was something.
    fn take_control(&self, events: &mut Vec<FrontEvent<FabricChannel<F>>>) -> bool {
        if !self.shared.control_pending.swap(false, Ordering::AcqRel) {
            return false;
        }
        events.extend(self.inbox.try_iter());
        true
    }
}

impl<F: FabricHandle> ServerMedium for FabricServer<F> {
    type Channel = FabricChannel<F>;

    fn waker(&self) -> Arc<dyn Wake> {
        Arc::new(DoorbellWake::<F>(Arc::clone(&self.region)))
    }

    /// Spins the doorbell's bounded while, then sleeps on it, until a connection has work, the
    /// control thread sent something or the poller's condition holds.
    fn wait(
        &mut self,
        timeout: Duration,
        ready: impl Fn() -> bool,
        events: &mut Vec<FrontEvent<FabricChannel<F>>>,
    ) -> std::io::Result<()> {
        if !self.take_control(events) && !timeout.is_zero() {
            let control_pending = &self.shared.control_pending;
            let _ = self.doorbell.wait_until(|| ready() || control_pending.load(Ordering::Relaxed), timeout);
            self.take_control(events);
        }
        events.push(FrontEvent::AllReady);
        Ok(())
    }

    fn close(&mut self, _slot: usize, channel: FabricChannel<F>) {
        // The client learns it from its control connection; the control thread then reports
        // the end, and the slot is released.
        let _ = channel.control().shutdown(Shutdown::Both);
    }

    fn release(&mut self, slot: usize) {
        if let Some(kind) = self.areas.kind_of(slot) {
            self.shared.free[kind as usize].lock().push(slot);
        }
    }
}

/// The control thread. See the module docs.
struct Control<F: FabricHandle> {
    poll: Poll,
    listeners: Vec<TcpListener>,
    /// Open control connections by slot.
    streams: Vec<Option<TcpStream>>,
    endpoint: Endpoint<F>,
    items: Vec<Option<ItemRegionInfo>>,
    events: Sender<FrontEvent<FabricChannel<F>>>,
    shared: Arc<Shared>,
    areas: Areas,
    wake_poller: DoorbellWake<F>,
}

impl<F: FabricHandle> Control<F> {
    /// Runs until the front end stops (woken through the waker) or polling fails; then the
    /// poller keeps serving the open connections, but no new one is accepted.
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.shared.stop.load(Ordering::Acquire) {
            match self.poll.poll(&mut events, None) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
            for event in events.iter() {
                match event.token() {
                    WAKER_TOKEN => {}
                    Token(index) if index < self.listeners.len() => self.accept(index),
                    Token(index) => self.check_stream(index - self.listeners.len()),
                }
            }
        }
    }

    fn tell_poller(&self, event: FrontEvent<FabricChannel<F>>) {
        if self.events.send(event).is_ok() {
            self.shared.control_pending.store(true, Ordering::Release);
            self.wake_poller.wake();
        }
    }

    fn accept(&mut self, server: usize) {
        loop {
            let stream = match self.listeners[server].accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return, // WouldBlock, or a failed connection: only that one
            };
            // The handshake is short and bounded by the control timeout; it runs blocking.
            let Ok(stream) = into_blocking(stream) else { continue };
            let Some((slot, stream)) = self.handshake(stream, server) else { continue };
            let mut stream = TcpStream::from_std(stream);
            let token = Token(self.listeners.len() + slot);
            if self.poll.registry().register(&mut stream, token, Interest::READABLE).is_ok() {
                self.streams[slot] = Some(stream);
            } else {
                let _ = stream.shutdown(Shutdown::Both);
                self.tell_poller(FrontEvent::Closed { slot });
            }
        }
    }

    /// Reads the client's hello and admits it on its medium. Returns its slot and the control
    /// stream (now non-blocking) to watch.
    fn handshake(&mut self, mut stream: std::net::TcpStream, server: usize) -> Option<(usize, std::net::TcpStream)> {
        let hello = match read_json_line::<ControlHello>(&mut stream) {
            Ok(hello) if hello.version == CONTROL_VERSION => hello.hello,
            Ok(hello) => {
                return refuse(stream, Refusal::Version { version: hello.version, supported: CONTROL_VERSION })
            }
            Err(error) => return refuse(stream, Refusal::BadHello { message: error.to_string() }),
        };
        match hello {
            MediumHello::Ring(hello) => self.admit::<Ring>(stream, server, hello),
            MediumHello::SendRecv(hello) => self.admit::<SendRecv>(stream, server, hello),
            MediumHello::RfRpc(hello) => self.admit::<RfRpc>(stream, server, hello),
        }
    }

    /// Takes a slot of medium `K` (or refuses), builds the connection, hands it to the poller
    /// and answers.
    fn admit<K: FabricKind<F>>(
        &mut self,
        mut stream: std::net::TcpStream,
        server: usize,
        hello: K::Hello,
    ) -> Option<(usize, std::net::TcpStream)>
    where
        FabricChannel<F>: From<K::Server>,
    {
        let area = *self.areas.of(K::KIND);
        let Some(slot) = self.shared.free[K::KIND as usize].lock().pop() else {
            return refuse(stream, Refusal::NoFreeSlot { medium: K::KIND, slots: area.slots as u64 });
        };
        let offset = area.offset_bytes + (slot - area.first) * area.slot_bytes;
        let accepted = stream
            .try_clone()
            .map_err(Refusal::layout)
            .and_then(|control| K::accept(&self.endpoint, offset, hello, control, self.items[server].clone()));
        let (channel, accept) = match accepted {
            Ok(accepted) => accepted,
            Err(refusal) => {
                self.shared.free[K::KIND as usize].lock().push(slot);
                return refuse(stream, refusal);
            }
        };
        self.tell_poller(FrontEvent::Open { slot, server, channel: channel.into() });
        let reply = ControlReply::Accepted { accept: K::wrap_accept(accept) };
        if write_json_line(&mut stream, &reply).is_err() || stream.set_nonblocking(true).is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            self.tell_poller(FrontEvent::Closed { slot });
            return None;
        }
        Some((slot, stream))
    }

    /// A control connection is readable: the client sends nothing after its hello, so this is
    /// its end (or garbage, which is drained and ignored, bounded per event).
    fn check_stream(&mut self, slot: usize) {
        let Some(stream) = self.streams.get_mut(slot).and_then(Option::as_mut) else { return };
        let mut scratch = [0u8; 256];
        for _ in 0..16 {
            match std::io::Read::read(stream, &mut scratch) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        if let Some(mut stream) = self.streams[slot].take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        self.tell_poller(FrontEvent::Closed { slot });
    }
}

/// Answers a client with `refusal` and closes its control connection.
fn refuse(mut stream: std::net::TcpStream, refusal: Refusal) -> Option<(usize, std::net::TcpStream)> {
    let _ = write_json_line(&mut stream, &ControlReply::Refused { refusal });
    let _ = stream.shutdown(Shutdown::Both);
    None
}

/// A freshly accepted control stream, made blocking with the handshake's timeouts.
fn into_blocking(stream: TcpStream) -> std::io::Result<std::net::TcpStream> {
    let stream: std::net::TcpStream = stream.into();
    stream.set_nonblocking(false)?;
    let timeout = Some(Duration::from_millis(WRITEPOLL_CONTROL_TIMEOUT_MS));
    stream.set_read_timeout(timeout)?;
    stream.set_write_timeout(timeout)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// The fabric front end over the shared-memory fabric.
pub type FrontEnd = FabricFront<ShmFabric>;

/// A running fabric front end. Dropping it stops it (the control thread first, then the
/// poller, which drops every connection and tells the clients).
pub struct FabricFront<F: FabricHandle> {
    kind: Front,
    control_addresses: Vec<SocketAddr>,
    item_slots: Vec<Arc<ItemSlots<F>>>,
    shared: Arc<Shared>,
    control_waker: Arc<Waker>,
    control: Option<JoinHandle<()>>,
    _poller: PollerThread,
}

impl<F: FabricHandle> std::fmt::Debug for FabricFront<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("FabricFront")
            .field("kind", &self.kind)
            .field("control", &self.control_addresses)
            .finish()
    }
}

impl<F: FabricHandle> FabricFront<F> {
    /// Starts front end `front` for the servers of `group`, one control listener per server on
    /// `listen` (port 0: any free port, each its own). `item_slots` gives it GET\* item regions.
    pub fn spawn(
        group: &ServerGroup,
        front: Front,
        listen: SocketAddr,
        item_slots: Option<ItemSlotConfig>,
    ) -> std::io::Result<Self> {
        Self::spawn_with(group.servers(), front, listen, FrontConfig::of(front, item_slots))
    }

    /// [`FabricFront::spawn`] with explicit slot counts (tests use few, to keep regions small).
    pub fn spawn_with(
        servers: &Arc<Servers>,
        front: Front,
        listen: SocketAddr,
        config: FrontConfig,
    ) -> std::io::Result<Self> {
        let fabric = F::open().map_err(std::io::Error::other)?;
        let mut item_slots = Vec::new();
        if let Some(slot_config) = config.item_slots {
            for index in 0..servers.served().len() {
                let name = unique_region_name("items");
                let slots = Arc::new(ItemSlots::register(&fabric, &name, slot_config).map_err(std::io::Error::other)?);
                servers.attach_item_slots(index, Arc::clone(&slots) as Arc<dyn Publisher>)?;
                item_slots.push(slots);
            }
        }
        let areas = Areas::new::<F>(&config);
        let endpoint = Endpoint::register(fabric, "front", areas.region_bytes()).map_err(std::io::Error::other)?;
        let free = [MediumKind::Ring, MediumKind::SendRecv, MediumKind::RfRpc].map(|kind| {
            let area = areas.of(kind);
            Mutex::new((area.first..area.first + area.slots).rev().collect())
        });
        let shared = Arc::new(Shared { stop: AtomicBool::new(false), control_pending: AtomicBool::new(false), free });
        let poll = Poll::new()?;
        let control_waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let mut listeners = Vec::with_capacity(servers.served().len());
        let mut control_addresses = Vec::with_capacity(servers.served().len());
        for index in 0..servers.served().len() {
            let mut listener = TcpListener::bind(listen)?;
            poll.registry().register(&mut listener, Token(index), Interest::READABLE)?;
            control_addresses.push(listener.local_addr()?);
            listeners.push(listener);
        }
        let (events, inbox) = channel();
        let medium = FabricServer {
            region: Arc::clone(&endpoint.region),
            doorbell: endpoint.doorbell().map_err(std::io::Error::other)?,
            inbox,
            shared: Arc::clone(&shared),
            areas,
        };
        let total_slots = areas.0.iter().map(|area| area.slots).sum();
        let control = Control {
            poll,
            listeners,
            streams: (0..total_slots).map(|_| None).collect(),
            items: (0..servers.served().len())
                .map(|index| item_slots.get(index).map(|slots| slots.info().clone()))
                .collect(),
            wake_poller: DoorbellWake::<F>(Arc::clone(&endpoint.region)),
            endpoint,
            events,
            shared: Arc::clone(&shared),
            areas,
        };
        let poller = PollerThread::spawn(&format!("rampkv-{}-poller", front.key()), medium, Arc::clone(servers))?;
        let control =
            std::thread::Builder::new().name(format!("rampkv-{}-control", front.key())).spawn(move || control.run())?;
        Ok(Self {
            kind: front,
            control_addresses,
            item_slots,
            shared,
            control_waker,
            control: Some(control),
            _poller: poller,
        })
    }

    /// The control address of every server, in the group's order.
    pub fn control_addresses(&self) -> &[SocketAddr] {
        &self.control_addresses
    }

    /// Which kind it is.
    pub fn kind(&self) -> Front {
        self.kind
    }

    /// Server `index`'s item slots, if the front end has GET\*.
    pub fn item_slots(&self, index: usize) -> Option<&Arc<ItemSlots<F>>> {
        self.item_slots.get(index)
    }
}

impl<F: FabricHandle> Drop for FabricFront<F> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.control_waker.wake();
        if let Some(control) = self.control.take() {
            let _ = control.join();
        }
    }
}
