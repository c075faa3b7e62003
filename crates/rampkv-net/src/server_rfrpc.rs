//! The server side of the RF-RPC transport (`--transport rfrpc`): remote-fetch replies.
//!
//! An [`RfRpcGroup`] serves the cores of a TCP [`ServerGroup`] (same stores, same clock) over
//! RF-RPC connections (`rampkv_fabric::rpc`), with the write-poll front end's structure
//! (`server_writepoll.rs`): a **control thread** runs the JSON handshake per new client and
//! watches control connections for their end, and one **poller thread** serves every connection
//! of every server of the group. A request message carries whole wire frames, one per entry; the
//! poller serves them with `ServerCore::handle_frame` and publishes the replies it has *now* in
//! the connection's reply slot in the group's own region, where the client fetches them with
//! one-sided reads (a reply may hold fewer frames than the request: S2PL defers replies to lock
//! waits). Deferred replies, and replies that do not fit in the slot, go to the client as
//! unsolicited pushes through the push ring in the client's region. When no connection has
//! work the poller spins a bounded while (the doorbell's spin), then sleeps on the group's
//! doorbell, rung by clients that send while it sleeps.
//!
//! The group registers one region: the doorbell, then `RFRPC_GROUP_CONNECTIONS_MAX` slots, each
//! the push ring's credit word, the reply slot and the request ring (layout:
//! [`RfRpcRegionLayout`]).
//!
//! # Fault model
//! As the write-poll front end: a request no correct client writes (corrupt ring, malformed
//! message, an entry that is not exactly one valid frame) closes that connection (its S2PL locks
//! released); other connections are served throughout; nothing is accessed outside a region.
//! A reply frame larger than a push message is replaced by an ERROR reply.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rampkv_fabric::rpc::{EntryList, RpcLayout, RpcServerEndpoint};
use rampkv_fabric::{Doorbell, Fabric, RingAddresses, ShmFabric, ShmLocalRegion};

use crate::front::control::{
    self, admit, bound_reply, gather_deferred, refuse, release_connection, sleep_timeout, slot_of, Admitted,
    ControlLoop, FrontThreads, Handshake, Notify, Setup, SlotPool,
};
use crate::server::ServerGroup;
use crate::server_writepoll::DeferredExchange;
use crate::transport::rfrpc::{RfRpcClientHello, RfRpcRegionLayout, RfRpcServerReply, RFRPC_CONTROL_VERSION};
use crate::transport::writepoll::read_json_line;
use rampkv_core::limits::RFRPC_GROUP_CONNECTIONS_MAX;
use rampkv_core::protocol::server::{DeferredReply, ServerCore};
use rampkv_core::wire::FrameHeader;

type Endpoint = RpcServerEndpoint<ShmFabric, Arc<ShmLocalRegion>>;

/// What carries a deferred or overflowing reply, named in the ERROR reply that replaces one
/// too large for it.
const PUSH_MESSAGE: &str = "push message";
/// How long a push waits for ring credit before the poller retries it on a later pass.
const BACKLOG_RETRY: Duration = Duration::from_millis(1);

enum ControlEvent {
    Open(Box<Connection>),
    Closed { slot: usize },
}

/// The connection slots not in use.
type FreeSlots = Mutex<Vec<usize>>;
type Shared = control::Shared<FreeSlots>;

/// A running RF-RPC front end for a group of servers. Dropping it stops it.
pub struct RfRpcGroup {
    control_addresses: Vec<SocketAddr>,
    _threads: FrontThreads<FreeSlots>,
}

impl std::fmt::Debug for RfRpcGroup {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RfRpcGroup").field("control_addresses", &self.control_addresses).finish()
    }
}

impl RfRpcGroup {
    /// Serves the cores of the TCP `group` over RF-RPC too: one control listener per server on
    /// `listen` (port 0: any free port), one registered region, a control and a poller thread.
    /// Uses the group's clock and deferred-reply exchange; a group has one ring front end
    /// (write-poll or this one).
    pub fn spawn(group: &ServerGroup, listen: SocketAddr) -> std::io::Result<RfRpcGroup> {
        let free = Mutex::new((0..RFRPC_GROUP_CONNECTIONS_MAX).rev().collect());
        let region_bytes = RfRpcRegionLayout::server_region_bytes(RFRPC_GROUP_CONNECTIONS_MAX);
        let doorbell_offset = RfRpcRegionLayout::DOORBELL_OFFSET_BYTES as usize;
        let setup = Setup::new(group, listen, "rf-server", region_bytes, doorbell_offset, free)?;
        let Setup { fabric, shared, poll, waker, listeners, control_addresses, doorbell, exchange, clock } = setup;
        let (events, inbox) = channel();
        let handshake = RfRpcHandshake { fabric, shared: Arc::clone(&shared), events, generation: 0 };
        let control = ControlLoop::new(poll, listeners, RFRPC_GROUP_CONNECTIONS_MAX, handshake);
        let poller = Poller {
            shared: Arc::clone(&shared),
            doorbell,
            inbox,
            connections: (0..RFRPC_GROUP_CONNECTIONS_MAX).map(|_| None).collect(),
            clock,
            deferred: Vec::new(),
            exchange,
            cores: control.cores(),
            frames: Vec::new(),
            replies: EntryList::new(),
        };
        let threads = FrontThreads::start("rf", shared, waker, control, move || poller.run())?;
        Ok(RfRpcGroup { control_addresses, _threads: threads })
    }

    /// The control address of every server, in the order of the group's cores.
    pub fn control_addresses(&self) -> &[SocketAddr] {
        &self.control_addresses
    }
}

/// The RF-RPC handshake, run by the control thread.
struct RfRpcHandshake {
    fabric: ShmFabric,
    shared: Arc<Shared>,
    events: Sender<ControlEvent>,
    generation: u64,
}

impl Handshake for RfRpcHandshake {
    fn stopped(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    fn handshake(
        &mut self,
        mut stream: std::net::TcpStream,
        core: Arc<ServerCore>,
    ) -> Option<(usize, std::net::TcpStream)> {
        let refused = |reason| RfRpcServerReply::Refused { reason };
        let hello: RfRpcClientHello = match read_json_line(&mut stream) {
            Ok(hello) => hello,
            Err(error) => {
                refuse(&mut stream, &refused(format!("bad hello: {error}")));
                return None;
            }
        };
        let (fabric, region) = (self.fabric, Arc::clone(&self.shared.region));
        let shared = Arc::clone(&self.shared);
        let pool = SlotPool { free: &shared.free, capacity: RFRPC_GROUP_CONNECTIONS_MAX, name: "connection slots" };
        let mut poller = Notify { events: &self.events, shared: &shared };
        admit(
            stream,
            &pool,
            &mut self.generation,
            refused,
            |slot, id, control| {
                let connection = build_connection(fabric, &region, &hello, slot, id, core, control)?;
                let accepted = RfRpcServerReply::Accepted {
                    region: region.descriptor().clone(),
                    request_ring: RfRpcRegionLayout::request_ring(slot),
                    reply_slot_offset_bytes: RfRpcRegionLayout::reply_slot_offset_bytes(slot),
                    reply_slot_bytes: RfRpcRegionLayout::REPLY_SLOT_BYTES as u64,
                    doorbell_offset_bytes: RfRpcRegionLayout::DOORBELL_OFFSET_BYTES,
                    push_credit_offset_bytes: RfRpcRegionLayout::push_credit_offset_bytes(slot),
                };
                Ok((connection, accepted))
            },
            &mut poller,
        )
    }

    fn closed(&mut self, slot: usize) {
        Notify { events: &self.events, shared: &self.shared }.send(ControlEvent::Closed { slot });
    }
}

impl Admitted<Connection> for Notify<'_, ControlEvent, FreeSlots> {
    fn open(&mut self, connection: Connection) {
        self.send(ControlEvent::Open(Box::new(connection)));
    }

    fn closed(&mut self, slot: usize) {
        self.send(ControlEvent::Closed { slot });
    }
}

/// Maps the client's region and builds the connection's endpoint from the client's hello
/// (input from outside: the fabric checks the descriptor, the endpoint every offset).
fn build_connection(
    fabric: ShmFabric,
    region: &Arc<ShmLocalRegion>,
    hello: &RfRpcClientHello,
    slot: usize,
    id: u64,
    core: Arc<ServerCore>,
    control: std::net::TcpStream,
) -> Result<Connection, String> {
    if hello.version != RFRPC_CONTROL_VERSION {
        return Err(format!("control version {} is not {RFRPC_CONTROL_VERSION}", hello.version));
    }
    let client = fabric.map(&hello.region).map_err(|error| error.to_string())?;
    let layout = RpcLayout {
        request: RingAddresses {
            ring: RfRpcRegionLayout::request_ring(slot),
            receiver_doorbell_offset_bytes: RfRpcRegionLayout::DOORBELL_OFFSET_BYTES,
            credit_offset_bytes: hello.request_credit_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        },
        push: RingAddresses {
            ring: hello.push_ring,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            credit_offset_bytes: RfRpcRegionLayout::push_credit_offset_bytes(slot),
            sender_doorbell_offset_bytes: RfRpcRegionLayout::DOORBELL_OFFSET_BYTES,
        },
        reply_slot_offset_bytes: RfRpcRegionLayout::reply_slot_offset_bytes(slot),
        reply_slot_bytes: RfRpcRegionLayout::REPLY_SLOT_BYTES as u64,
    };
    let mut endpoint = RpcServerEndpoint::new(fabric, Arc::clone(region), client, layout, BACKLOG_RETRY)
        .map_err(|error| error.to_string())?;
    // The client sleeps on its doorbell while a call is outstanding (after a bounded spin).
    endpoint.set_notify_fetchers(true);
    Ok(Connection { slot, id, core, endpoint, control, backlog: VecDeque::new() })
}

struct Connection {
    slot: usize,
    id: u64,
    core: Arc<ServerCore>,
    endpoint: Endpoint,
    control: std::net::TcpStream,
    /// Reply frames waiting to be pushed unsolicited (deferred replies, slot overflow).
    backlog: VecDeque<Vec<u8>>,
}

impl Connection {
    /// Pushes backlog frames, as many per message as fit, while the push ring has room.
    fn push_backlog(&mut self, scratch: &mut EntryList) -> Result<(), Fault> {
        let bytes_max = self.endpoint.unsolicited_entries_bytes_max();
        while !self.backlog.is_empty() {
            scratch.clear();
            let mut taken = 0;
            for frame in &self.backlog {
                if taken == rampkv_fabric::limits::RPC_BATCH_ENTRIES_MAX
                    || (taken > 0 && scratch.packed().len() + 4 + frame.len() > bytes_max)
                {
                    break;
                }
                scratch.push(frame);
                taken += 1;
            }
            match self.endpoint.try_push_unsolicited(scratch) {
                Ok(true) => {
                    self.backlog.drain(..taken);
                }
                Ok(false) => return Ok(()),
                Err(_) => return Err(Fault::Corrupt),
            }
        }
        Ok(())
    }
}

enum Fault {
    Corrupt,
}

struct Poller {
    shared: Arc<Shared>,
    doorbell: Doorbell<Arc<ShmLocalRegion>>,
    inbox: Receiver<ControlEvent>,
    connections: Vec<Option<Connection>>,
    clock: Instant,
    deferred: Vec<DeferredReply>,
    exchange: Arc<DeferredExchange>,
    cores: Vec<Arc<ServerCore>>,
    /// Reply frames of one request message (allocated once).
    frames: Vec<u8>,
    replies: EntryList,
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
            self.deliver_deferred(now_ms);
            if served == 0 {
                self.sleep(now_ms);
            }
        }
        for slot in 0..self.connections.len() {
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
                ControlEvent::Closed { slot } => {
                    self.close(slot);
                    self.shared.free.lock().push(slot);
                }
            }
        }
    }

    fn sleep(&mut self, now_ms: u64) {
        let mut timeout = sleep_timeout(&self.cores, now_ms);
        if self.connections.iter().flatten().any(|connection| !connection.backlog.is_empty()) {
            timeout = timeout.min(BACKLOG_RETRY);
        }
        let (connections, shared, exchange) = (&self.connections, &self.shared, &self.exchange);
        let ready = || {
            shared.stop.load(Ordering::Relaxed)
                || shared.control_pending.load(Ordering::Relaxed)
                || exchange.to_rings_pending.load(Ordering::Relaxed)
                || connections.iter().flatten().any(|connection| connection.endpoint.has_pending())
        };
        let _ = self.doorbell.wait_until(ready, timeout);
    }

    fn serve(&mut self, slot: usize, now_ms: u64) -> usize {
        let Some(connection) = self.connections[slot].as_mut() else { return 0 };
        let outcome = serve_connection(connection, now_ms, &mut self.deferred, &mut self.frames, &mut self.replies);
        match outcome {
            Ok(served) => served,
            Err(Fault::Corrupt) => {
                self.close(slot);
                1
            }
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(connection) = self.connections[slot].take() {
            release_connection(&connection.control, &connection.core, connection.id, &mut self.deferred);
        }
    }

    fn deliver_deferred(&mut self, now_ms: u64) {
        gather_deferred(&self.cores, &self.exchange, now_ms, &mut self.deferred);
        while let Some(reply) = self.deferred.pop() {
            let slot = slot_of(reply.connection);
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { continue };
            if connection.id != reply.connection {
                continue; // the connection closed: nobody to tell
            }
            let mut frame = reply.frame;
            bound_reply(&mut frame, 0, connection.endpoint.unsolicited_entries_bytes_max() - 4, PUSH_MESSAGE);
            connection.backlog.push_back(frame);
            if connection.push_backlog(&mut self.replies).is_err() {
                self.close(slot);
            }
        }
    }
}

/// Serves at most one request message of `connection`: every frame of it, then its reply (the
/// frames produced now, as far as the slot holds them; the rest join the push backlog).
fn serve_connection(
    connection: &mut Connection,
    now_ms: u64,
    deferred: &mut Vec<DeferredReply>,
    frames: &mut Vec<u8>,
    replies: &mut EntryList,
) -> Result<usize, Fault> {
    connection.push_backlog(replies)?;
    let Connection { endpoint, core, id, backlog, .. } = connection;
    let Some(request) = endpoint.server_recv().map_err(|_| Fault::Corrupt)? else {
        return Ok(0);
    };
    frames.clear();
    for entry in request.entries.iter() {
        let (header, frame) = match FrameHeader::split(entry) {
            Ok(Some(split)) if split.0.frame_bytes() == entry.len() => split,
            _ => return Err(Fault::Corrupt),
        };
        core.handle_frame(*id, header.kind, header.request_id, frame, now_ms, frames, deferred);
    }
    let slot_bytes_max = endpoint.reply_entries_bytes_max();
    let push_frame_max = endpoint.unsolicited_entries_bytes_max() - 4;
    replies.clear();
    let mut rest = &frames[..];
    while !rest.is_empty() {
        let Ok(Some((header, _))) = FrameHeader::split(rest) else {
            debug_assert!(false, "the server core encodes whole, valid frames");
            break;
        };
        let frame_bytes = header.frame_bytes();
        let (frame, after) = rest.split_at(frame_bytes);
        rest = after;
        let fits = replies.len() < rampkv_fabric::limits::RPC_BATCH_ENTRIES_MAX
            && replies.packed().len() + 4 + frame.len() <= slot_bytes_max;
        if fits && backlog.is_empty() {
            replies.push(frame);
        } else {
            let mut frame = frame.to_vec();
            bound_reply(&mut frame, 0, push_frame_max, PUSH_MESSAGE);
            backlog.push_back(frame);
        }
    }
    endpoint.server_send(replies).map_err(|_| Fault::Corrupt)?;
    connection.push_backlog(replies)?;
    Ok(1)
}
