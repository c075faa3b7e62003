//! The server side of the write-poll transport (GET+/PUT+): a ring poller per server group.
//!
//! A [`WritePollGroup`] serves the same [`ServerCore`]s as a TCP [`crate::server::ServerGroup`]
//! (same stores, same clock), over message rings instead of sockets. It has two threads:
//! - the **control thread** owns one control listener per server (a second port next to the
//!   server's TCP port; see `docs/wire.md`, "Write-poll transport (GET+/PUT+)"). It runs the JSON
//!   handshake of a new client, builds the connection's rings, and hands them to the poller. It
//!   keeps every control connection open and, when one ends, tells the poller to drop that
//!   connection (the client is gone) and free its ring slot;
//! - the **ring poller** polls every request ring of every server of the group, serves each
//!   frame with `ServerCore::handle_frame`, and writes the replies into the client's reply ring
//!   (batched: as few ring messages as the maximum message size allows). When every ring is
//!   empty it spins a bounded while (the doorbell's `DOORBELL_SPIN_ITERATIONS` checks of every
//!   ring), then sleeps on the group's doorbell (rung by any client that writes a request while
//!   it sleeps), at most `WRITEPOLL_SLEEP_MS_MAX` at a time. It does not add a `POLL_SPIN_US`
//!   spin on top: measured, that extra spin cost about 25% of throughput on the shared 2-core
//!   machine (it takes CPU from the clients); see `docs/performance.md`.
//!
//! The group registers **one** region at start-up: the doorbell and
//! `WRITEPOLL_GROUP_CONNECTIONS_MAX` slots, each a request ring plus the credit word of that
//! connection's reply ring (layout: [`RegionLayout`]), followed by
//! `SENDRECV_GROUP_CONNECTIONS_MAX` send/recv request-queue slots. One region is what lets one
//! poller sleep for all its connections on one doorbell. Pages are touched only for slots in use.
//!
//! The same control port and the same poller also serve **send/recv** clients
//! ([`crate::transport::sendrecv`]): the hello line tells the two apart, and the submodule
//! `sendrecv` holds their connections (global slots `WRITEPOLL_GROUP_CONNECTIONS_MAX..`).
//!
//! # Fault model
//! A request ring holding something no correct client writes (`RingError::Corrupt`), a ring
//! message that ends inside a frame, a frame with an invalid header, or a client that corrupts
//! its reply ring's credit word: that connection is closed (its rings dropped and unmapped, its
//! control connection shut down, its S2PL locks released). Never a panic, never an access
//! outside a ring (the fabric checks every address); other connections are served throughout.
//! A valid frame whose body does not decode gets an ERROR reply and the connection goes on, as
//! over TCP. A reply too large for one ring message is replaced by an ERROR reply.
//! A client that stops reading replies gets no more requests served until it returns credit
//! (back-pressure, as over TCP): the poller stops serving a connection's frames once its unsent
//! replies exceed `CONNECTION_WRITE_BUFFER_BYTES_MAX`, keeps the rest of that request message
//! (at most one message), and takes no new message from the ring until the backlog is sent.
//!
//! # Deferred replies across front ends
//! S2PL defers replies: a lock released by one connection grants a request that waits on
//! another, and a lock wait past its deadline is aborted by whichever loop expires it. The TCP
//! loop and the ring poller serve the same cores, so such a reply can be produced by the front
//! end that does not own the waiting connection. A [`DeferredExchange`] per server group hands
//! it over: ring connection ids carry [`RING_CONNECTION_ID_BIT`], each loop forwards the replies
//! that are not its own and wakes the other (`tests/writepoll.rs`,
//! `s2pl_lock_grants_cross_between_tcp_and_ring_clients`, hung without it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use mio::Waker;
use parking_lot::Mutex;
use rampkv_fabric::{
    Doorbell, Fabric, LoadOrdering, RingAddresses, RingReceiver, RingSender, SendError, ShmFabric, ShmLocalRegion,
    Words,
};

use crate::front::control::{
    self, admit, bound_reply, gather_deferred, refuse, release_connection, sleep_timeout, slot_of, Admitted,
    ControlLoop, FrontThreads, Handshake, Notify, Setup, SlotPool,
};
use crate::item_slots::{ItemSlotConfig, ItemSlots};
use crate::server::ServerGroup;
use crate::transport::writepoll::{
    read_json_line, send_frames, unique_region_name, ClientHello, RegionLayout, ServerReply, ShmReceiver, ShmSender,
    CONTROL_VERSION,
};
use rampkv_core::limits::{
    CONNECTION_WRITE_BUFFER_BYTES_MAX, SENDRECV_GROUP_CONNECTIONS_MAX, WRITEPOLL_GROUP_CONNECTIONS_MAX,
    WRITEPOLL_MESSAGES_PER_PASS_MAX, WRITEPOLL_MESSAGE_BYTES_MIN,
};
use rampkv_core::protocol::server::{DeferredReply, ServerCore};
use rampkv_core::wire::FrameHeader;

mod sendrecv;
use sendrecv::{ControlHello, SendRecvConnection};

/// Ring connection ids have this bit set, so they never equal a TCP connection id of the same
/// core (both are `generation << 32 | slot`), and S2PL lock ownership stays apart.
pub const RING_CONNECTION_ID_BIT: u64 = 1 << 63;

/// Whether a server-core connection id belongs to a ring connection (else: TCP).
pub fn is_ring_connection(connection: u64) -> bool {
    connection & RING_CONNECTION_ID_BIT != 0
}

/// Hands deferred replies between the TCP loop and the ring poller of one server group.
pub struct DeferredExchange {
    to_tcp: Mutex<Vec<DeferredReply>>,
    to_tcp_pending: AtomicBool,
    tcp_waker: Arc<Waker>,
    to_rings: Mutex<Vec<DeferredReply>>,
    pub(crate) to_rings_pending: AtomicBool,
    /// The ring poller's region (its doorbell), once a ring front end is attached.
    pub(crate) rings: std::sync::OnceLock<Arc<ShmLocalRegion>>,
}

impl std::fmt::Debug for DeferredExchange {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("DeferredExchange").field("rings_attached", &self.rings.get().is_some()).finish()
    }
}

impl DeferredExchange {
    /// An exchange whose TCP side is woken with `tcp_waker`.
    pub(crate) fn new(tcp_waker: Arc<Waker>) -> Self {
        Self {
            to_tcp: Mutex::new(Vec::new()),
            to_tcp_pending: AtomicBool::new(false),
            tcp_waker,
            to_rings: Mutex::new(Vec::new()),
            to_rings_pending: AtomicBool::new(false),
            rings: std::sync::OnceLock::new(),
        }
    }

    /// TCP loop: moves replies the ring poller produced for TCP connections into `out`.
    pub(crate) fn take_for_tcp(&self, out: &mut Vec<DeferredReply>) {
        if self.to_tcp_pending.swap(false, Ordering::AcqRel) {
            out.append(&mut self.to_tcp.lock());
        }
    }

    /// TCP loop: hands a reply for a ring connection to the ring poller (dropped if no ring
    /// front end is attached: then no ring connection exists).
    pub(crate) fn send_to_rings(&self, reply: DeferredReply) {
        let Some(region) = self.rings.get() else { return };
        self.to_rings.lock().push(reply);
        self.to_rings_pending.store(true, Ordering::Release);
        region.fetch_add(DOORBELL_WORD_INDEX, 1);
        region.wake_all(DOORBELL_WORD_INDEX);
    }

    pub(crate) fn take_for_rings(&self, out: &mut Vec<DeferredReply>) {
        if self.to_rings_pending.swap(false, Ordering::AcqRel) {
            out.append(&mut self.to_rings.lock());
        }
    }

    pub(crate) fn send_to_tcp(&self, reply: DeferredReply) {
        self.to_tcp.lock().push(reply);
        self.to_tcp_pending.store(true, Ordering::Release);
        let _ = self.tcp_waker.wake(); // a failed wake only delays: the loop polls on a timeout too
    }
}

/// What carries replies, named in the ERROR reply that replaces one too large for it.
pub(super) const RING_MESSAGE: &str = "ring message";
const DOORBELL_WORD_INDEX: usize = RegionLayout::DOORBELL_OFFSET_BYTES as usize / 8;

/// What the control thread tells the poller.
enum ControlEvent {
    /// A new connection, ready to serve.
    Open(Box<RingConnection>),
    /// A new send/recv connection, ready to serve.
    OpenSendRecv(Box<SendRecvConnection>),
    /// The control connection of `slot` ended: drop the connection (if still open) and free
    /// the slot.
    Closed { slot: usize },
}

/// The slots not in use, per kind of connection.
pub(super) struct FreeSlots {
    /// Ring slots.
    ring: Mutex<Vec<usize>>,
    /// Send/recv slots (global slot numbers).
    sendrecv: Mutex<Vec<usize>>,
}

type Shared = control::Shared<FreeSlots>;

/// A running write-poll front end for a group of servers. Dropping it stops it.
pub struct WritePollGroup {
    control_addresses: Vec<SocketAddr>,
    _threads: FrontThreads<FreeSlots>,
}

impl std::fmt::Debug for WritePollGroup {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("WritePollGroup").field("control_addresses", &self.control_addresses).finish()
    }
}

impl WritePollGroup {
    /// Serves the cores of the TCP `group` over rings too: binds one control listener per
    /// server on `listen` (port 0: any free port), registers the group's region, and starts
    /// the control and poller threads. It uses the group's clock (prepares are stamped with it
    /// and recovery measures staleness with it) and its deferred-reply exchange. One ring front
    /// end per group.
    pub fn spawn(group: &ServerGroup, listen: SocketAddr) -> std::io::Result<WritePollGroup> {
        Self::spawn_with_item_slots(group, listen, None)
    }

    /// [`WritePollGroup::spawn`], and with `item_slots` also GET\*: registers an item region
    /// per server of the group, attaches it to the server's core (which from then on publishes
    /// committed versions in it), and announces it in the control handshake
    /// (`ServerReply::Accepted::items`). Fails if a core already has item slots.
    pub fn spawn_with_item_slots(
        group: &ServerGroup,
        listen: SocketAddr,
        item_slots: Option<ItemSlotConfig>,
    ) -> std::io::Result<WritePollGroup> {
        let cores = group.cores().to_vec();
        if let Some(config) = item_slots {
            let fabric = ShmFabric::new().map_err(std::io::Error::other)?;
            for core in &cores {
                let slots = ItemSlots::register(&fabric, &unique_region_name("items"), config)
                    .map_err(std::io::Error::other)?;
                if core.attach_item_slots(Arc::new(slots)).is_err() {
                    return Err(std::io::Error::other("a server already has item slots"));
                }
            }
        }
        let free = FreeSlots {
            ring: Mutex::new((0..WRITEPOLL_GROUP_CONNECTIONS_MAX).rev().collect()),
            sendrecv: Mutex::new(sendrecv::slots().rev().collect()),
        };
        let region_bytes = RegionLayout::region_bytes(WRITEPOLL_GROUP_CONNECTIONS_MAX) + sendrecv::AREA_BYTES;
        let doorbell_offset = RegionLayout::DOORBELL_OFFSET_BYTES as usize;
        let setup = Setup::new(group, listen, "wp-server", region_bytes, doorbell_offset, free)?;
        let Setup { fabric, shared, poll, waker, listeners, control_addresses, doorbell, exchange, clock } = setup;
        let (events, inbox) = channel();
        let handshake = WritePollHandshake { fabric, shared: Arc::clone(&shared), events, generation: 0 };
        let slots = WRITEPOLL_GROUP_CONNECTIONS_MAX + SENDRECV_GROUP_CONNECTIONS_MAX;
        let control = ControlLoop::new(poll, listeners, slots, handshake);
        let poller = Poller {
            shared: Arc::clone(&shared),
            doorbell,
            inbox,
            connections: (0..WRITEPOLL_GROUP_CONNECTIONS_MAX).map(|_| None).collect(),
            sendrecv: (0..SENDRECV_GROUP_CONNECTIONS_MAX).map(|_| None).collect(),
            clock,
            deferred: Vec::new(),
            exchange,
            cores: control.cores(),
        };
        let threads = FrontThreads::start("wp", shared, waker, control, move || poller.run())?;
        Ok(WritePollGroup { control_addresses, _threads: threads })
    }

    /// The control address of every server, in the order of the cores given to `spawn`.
    pub fn control_addresses(&self) -> &[SocketAddr] {
        &self.control_addresses
    }
}

/// The control thread's handshake: write-poll and send/recv clients share the control port.
struct WritePollHandshake {
    fabric: ShmFabric,
    shared: Arc<Shared>,
    events: Sender<ControlEvent>,
    generation: u64,
}

impl Handshake for WritePollHandshake {
    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    fn handshake(
        &mut self,
        mut stream: std::net::TcpStream,
        core: Arc<ServerCore>,
    ) -> Option<(usize, std::net::TcpStream)> {
        let hello = match read_json_line(&mut stream) {
            Ok(ControlHello::WritePoll(hello)) => hello,
            Ok(ControlHello::SendRecv(hello)) => return self.handshake_sendrecv(stream, core, &hello),
            Err(error) => {
                refuse(&mut stream, &ServerReply::Refused { reason: format!("bad hello: {error}") });
                return None;
            }
        };
        let (fabric, region) = (self.fabric, Arc::clone(&self.shared.region));
        let shared = Arc::clone(&self.shared);
        let pool = SlotPool { free: &shared.free.ring, capacity: WRITEPOLL_GROUP_CONNECTIONS_MAX, name: "ring slots" };
        let item_info = crate::item_slots::of_core(&core).map(|slots| slots.info().clone());
        admit(
            stream,
            &pool,
            &mut self.generation,
            |reason| ServerReply::Refused { reason },
            |slot, id, control| {
                let connection = build_connection(fabric, &region, &hello, slot, id, core, control)?;
                let accepted = ServerReply::Accepted {
                    region: region.descriptor().clone(),
                    request_ring: RegionLayout::ring(slot),
                    doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
                    reply_credit_offset_bytes: RegionLayout::credit_offset_bytes(slot),
                    items: item_info,
                };
                Ok((connection, accepted))
            },
            &mut Notify { events: &self.events, shared: &shared },
        )
    }

    fn closed(&mut self, slot: usize) {
        Notify { events: &self.events, shared: &self.shared }.send(ControlEvent::Closed { slot });
    }
}

impl Admitted<RingConnection> for Notify<'_, ControlEvent, FreeSlots> {
    fn open(&mut self, connection: RingConnection) {
        self.send(ControlEvent::Open(Box::new(connection)));
    }

    fn closed(&mut self, slot: usize) {
        self.send(ControlEvent::Closed { slot });
    }
}

impl Admitted<SendRecvConnection> for Notify<'_, ControlEvent, FreeSlots> {
    fn open(&mut self, connection: SendRecvConnection) {
        self.send(ControlEvent::OpenSendRecv(Box::new(connection)));
    }

    fn closed(&mut self, slot: usize) {
        self.send(ControlEvent::Closed { slot });
    }
}

/// Maps the client's region and builds both rings of a connection from the client's hello
/// (input from outside: the fabric checks the descriptor, the ring constructors every offset).
fn build_connection(
    fabric: ShmFabric,
    region: &Arc<ShmLocalRegion>,
    hello: &ClientHello,
    slot: usize,
    id: u64,
    core: Arc<ServerCore>,
    control: std::net::TcpStream,
) -> Result<RingConnection, String> {
    if hello.version != CONTROL_VERSION {
        return Err(format!("control version {} is not {CONTROL_VERSION}", hello.version));
    }
    if hello.reply_ring.body_bytes_max < WRITEPOLL_MESSAGE_BYTES_MIN as u64 {
        return Err(format!("reply ring messages must allow at least {WRITEPOLL_MESSAGE_BYTES_MIN} bytes"));
    }
    let client = fabric.map(&hello.region).map_err(|error| error.to_string())?;
    let receiver = RingReceiver::new(
        fabric,
        Arc::clone(region),
        client.clone(),
        RingAddresses {
            ring: RegionLayout::ring(slot),
            receiver_doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
            credit_offset_bytes: hello.request_credit_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        },
    )
    .map_err(|error| error.to_string())?;
    let sender = RingSender::new(
        fabric,
        client,
        Arc::clone(region),
        RingAddresses {
            ring: hello.reply_ring,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            credit_offset_bytes: RegionLayout::credit_offset_bytes(slot),
            sender_doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
        },
    )
    .map_err(|error| error.to_string())?;
    Ok(RingConnection {
        slot,
        id,
        core,
        receiver: Some(receiver),
        sender,
        control,
        replies: Vec::new(),
        sent: 0,
        credit_seen: 0,
        pending: Vec::new(),
        pending_offset: 0,
    })
}

/// One client's ring pair, served by the poller.
struct RingConnection {
    slot: usize,
    /// `RING_CONNECTION_ID_BIT | generation << 32 | slot`: a deferred reply never reaches a
    /// newer connection that reuses the slot.
    id: u64,
    core: Arc<ServerCore>,
    /// Always `Some` between calls (taken out while a message borrows it).
    receiver: Option<ShmReceiver>,
    sender: ShmSender,
    /// A clone of the control stream, to shut it down when we drop the connection.
    control: std::net::TcpStream,
    /// Reply frames not yet in the reply ring: `replies[sent..]`.
    replies: Vec<u8>,
    sent: usize,
    /// The reply credit word's value before the poller last slept with replies backlogged.
    credit_seen: u64,
    /// Request frames taken from the ring but not yet served: `pending[pending_offset..]`
    /// (the rest of a message whose replies reached the backlog bound).
    pending: Vec<u8>,
    pending_offset: usize,
}

impl RingConnection {
    fn backlogged(&self) -> bool {
        self.sent < self.replies.len()
    }

    fn credit_index(&self) -> usize {
        RegionLayout::credit_offset_bytes(self.slot) as usize / 8
    }

    /// Sends queued replies as far as credit allows. Err: the client broke the credit word.
    fn flush(&mut self) -> Result<(), SendError> {
        if !self.backlogged() {
            return Ok(());
        }
        self.sent += send_frames(&mut self.sender, &self.replies[self.sent..])?;
        if self.sent == self.replies.len() {
            self.replies.clear();
            self.sent = 0;
        }
        Ok(())
    }
}

/// Why a connection is dropped.
enum Fault {
    Corrupt,
}

struct Poller {
    shared: Arc<Shared>,
    doorbell: Doorbell<Arc<ShmLocalRegion>>,
    inbox: Receiver<ControlEvent>,
    connections: Vec<Option<RingConnection>>,
    /// Send/recv connections, by global slot minus `WRITEPOLL_GROUP_CONNECTIONS_MAX`.
    sendrecv: Vec<Option<SendRecvConnection>>,
    clock: Instant,
    deferred: Vec<DeferredReply>,
    exchange: Arc<DeferredExchange>,
    cores: Vec<Arc<ServerCore>>,
}

impl Poller {
    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    fn run(mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            self.take_control_events();
            let now_ms = self.now_ms();
            let mut served = 0;
            for slot in 0..self.connections.len() {
                served += self.serve(slot, now_ms);
            }
            served += self.serve_sendrecv(now_ms);
            self.deliver_deferred(now_ms);
            if served == 0 {
                // Spins `DOORBELL_SPIN_ITERATIONS` ring checks, then sleeps (see `sleep`).
                self.sleep(now_ms);
            }
        }
        // Stopping: drop every connection and tell their clients.
        for slot in 0..self.connections.len() + self.sendrecv.len() {
            self.close(slot);
        }
    }

    fn take_control_events(&mut self) {
        if !self.shared.control_pending.swap(false, Ordering::AcqRel) {
            return;
        }
        while let Ok(event) = self.inbox.try_recv() {
            match event {
                ControlEvent::Open(connection) => {
                    let slot = connection.slot;
                    debug_assert!(self.connections[slot].is_none(), "a slot is handed out once");
                    self.connections[slot] = Some(*connection);
                }
                ControlEvent::OpenSendRecv(connection) => self.open_sendrecv(*connection),
                ControlEvent::Closed { slot } if sendrecv::is_sendrecv_slot(slot) => {
                    self.close(slot);
                    self.shared.free.sendrecv.lock().push(slot);
                }
                ControlEvent::Closed { slot } => {
                    self.close(slot);
                    self.shared.free.ring.lock().push(slot);
                }
            }
        }
    }

    /// Sleeps on the doorbell until a request, credit for backlogged replies, a control
    /// event or the stop flag, or a lock deadline / `WRITEPOLL_SLEEP_MS_MAX`.
    fn sleep(&mut self, now_ms: u64) {
        let timeout = sleep_timeout(&self.cores, now_ms);
        let region = &self.shared.region;
        for connection in self.connections.iter_mut().flatten() {
            connection.credit_seen = region.load(connection.credit_index(), LoadOrdering::Relaxed);
        }
        let (connections, shared, exchange) = (&self.connections, &self.shared, &self.exchange);
        let sendrecv_connections = &self.sendrecv;
        let ready = || {
            shared.stop.load(Ordering::Relaxed)
                || sendrecv_connections.iter().flatten().any(SendRecvConnection::ready)
                || shared.control_pending.load(Ordering::Relaxed)
                || exchange.to_rings_pending.load(Ordering::Relaxed)
                || connections.iter().flatten().any(|connection| {
                    (!connection.backlogged()
                        && (connection.receiver.as_ref().is_some_and(ShmReceiver::has_pending)
                            || !connection.pending.is_empty()))
                        || (connection.backlogged()
                            && region.load(connection.credit_index(), LoadOrdering::Relaxed) != connection.credit_seen)
                })
        };
        let _ = self.doorbell.wait_until(ready, timeout);
    }

    /// Serves one connection: sends backlogged replies, then (if none are left) takes up to
    /// `WRITEPOLL_MESSAGES_PER_PASS_MAX` request messages and answers their frames. Returns the
    /// messages taken.
    fn serve(&mut self, slot: usize, now_ms: u64) -> usize {
        let Some(connection) = self.connections[slot].as_mut() else { return 0 };
        let outcome = serve_connection(connection, now_ms, &mut self.deferred);
        match outcome {
            Ok(taken) => taken,
            Err(Fault::Corrupt) => {
                self.close(slot);
                1
            }
        }
    }

    /// Drops the connection in `slot` (if open): rings unmapped, locks released, control
    /// connection shut down so the client learns it. The slot is freed when the control
    /// thread reports the control connection's end.
    fn close(&mut self, slot: usize) {
        if sendrecv::is_sendrecv_slot(slot) {
            return self.close_sendrecv(slot);
        }
        if let Some(connection) = self.connections[slot].take() {
            release_connection(&connection.control, &connection.core, connection.id, &mut self.deferred);
        }
    }

    /// Aborts expired lock waits and routes every deferred reply to its connection's ring
    /// (or, for a TCP connection, to the TCP loop).
    fn deliver_deferred(&mut self, now_ms: u64) {
        gather_deferred(&self.cores, &self.exchange, now_ms, &mut self.deferred);
        while let Some(reply) = self.deferred.pop() {
            let slot = slot_of(reply.connection);
            if sendrecv::is_sendrecv_slot(slot) {
                self.deliver_sendrecv(slot, reply);
                continue;
            }
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { continue };
            if connection.id != reply.connection {
                continue; // the connection closed: nobody to tell
            }
            let start = connection.replies.len();
            connection.replies.extend_from_slice(&reply.frame);
            bound_reply(&mut connection.replies, start, connection.sender.body_bytes_max(), RING_MESSAGE);
            if connection.flush().is_err() {
                self.close(slot);
            }
        }
    }
}

fn serve_connection(
    connection: &mut RingConnection,
    now_ms: u64,
    deferred: &mut Vec<DeferredReply>,
) -> Result<usize, Fault> {
    connection.flush().map_err(|_| Fault::Corrupt)?;
    let mut progress = 0;
    if !connection.backlogged() && connection.pending_offset < connection.pending.len() {
        // Frames left over from a message when the reply backlog reached its bound.
        let pending = std::mem::take(&mut connection.pending);
        let consumed = serve_frames(connection, &pending[connection.pending_offset..], now_ms, deferred)?;
        connection.pending = pending;
        connection.pending_offset += consumed;
        if connection.pending_offset == connection.pending.len() {
            connection.pending.clear();
            connection.pending_offset = 0;
        }
        connection.flush().map_err(|_| Fault::Corrupt)?;
        progress += 1;
    }
    while !connection.backlogged() && connection.pending.is_empty() && progress < WRITEPOLL_MESSAGES_PER_PASS_MAX {
        // The message borrows the receiver: take the receiver out for the call.
        let mut receiver = connection.receiver.take();
        let Some(ring) = receiver.as_mut() else { return Err(Fault::Corrupt) };
        let outcome = match ring.poll() {
            Ok(Some(message)) => {
                let body = message.body();
                serve_frames(connection, body, now_ms, deferred).map(|consumed| {
                    // Keep what the reply bound stopped (bounded by one message).
                    connection.pending.extend_from_slice(&body[consumed..]);
                    true
                })
            }
            Ok(None) => Ok(false),
            Err(_) => Err(Fault::Corrupt),
        };
        connection.receiver = receiver;
        if !outcome? {
            break;
        }
        progress += 1;
        connection.flush().map_err(|_| Fault::Corrupt)?;
    }
    Ok(progress)
}

/// Answers the whole frames at the front of `body` until it ends or the unsent replies exceed
/// `CONNECTION_WRITE_BUFFER_BYTES_MAX` (as over TCP: back-pressure instead of unbounded
/// buffering). Returns the bytes consumed (a frame boundary).
fn serve_frames(
    connection: &mut RingConnection,
    body: &[u8],
    now_ms: u64,
    deferred: &mut Vec<DeferredReply>,
) -> Result<usize, Fault> {
    let message_bytes_max = connection.sender.body_bytes_max();
    let mut consumed = 0;
    while consumed < body.len() && connection.replies.len() - connection.sent <= CONNECTION_WRITE_BUFFER_BYTES_MAX {
        let rest = &body[consumed..];
        let (header, frame) = match FrameHeader::split(rest) {
            Ok(Some(split)) => split,
            // A message holds whole frames: a partial or invalid one is corruption.
            Ok(None) | Err(_) => return Err(Fault::Corrupt),
        };
        let start = connection.replies.len();
        let (core, id) = (&connection.core, connection.id);
        core.handle_frame(id, header.kind, header.request_id, frame, now_ms, &mut connection.replies, deferred);
        bound_reply(&mut connection.replies, start, message_bytes_max, RING_MESSAGE);
        consumed += header.frame_bytes();
    }
    Ok(consumed)
}
