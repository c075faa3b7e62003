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
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use rampkv_fabric::rpc::{EntryList, RpcLayout, RpcServerEndpoint};
use rampkv_fabric::{Access, Doorbell, Fabric, RingAddresses, ShmFabric, ShmLocalRegion, Words};

use crate::limits::{RFRPC_GROUP_CONNECTIONS_MAX, WRITEPOLL_SLEEP_MS_MAX};
use crate::protocol::server::{DeferredReply, ServerCore};
use crate::server::ServerGroup;
use crate::server_writepoll::{
    control_stream_ended, into_blocking, is_ring_connection, DeferredExchange, RING_CONNECTION_ID_BIT,
};
use crate::transport::rfrpc::{RfRpcClientHello, RfRpcRegionLayout, RfRpcServerReply, RFRPC_CONTROL_VERSION};
use crate::transport::writepoll::{read_json_line, unique_region_name, write_json_line};
use crate::wire::{FrameHeader, Response};

type Endpoint = RpcServerEndpoint<ShmFabric, Arc<ShmLocalRegion>>;

const WAKER_TOKEN: Token = Token(usize::MAX);
const EVENTS_CAPACITY: usize = 256;
const DOORBELL_WORD_INDEX: usize = 0;
/// How long a push waits for ring credit before the poller retries it on a later pass.
const BACKLOG_RETRY: Duration = Duration::from_millis(1);

enum ControlEvent {
    Open(Box<Connection>),
    Closed { slot: usize },
}

struct Shared {
    region: Arc<ShmLocalRegion>,
    stop: AtomicBool,
    control_pending: AtomicBool,
    free_slots: Mutex<Vec<usize>>,
}

impl Shared {
    fn wake_poller(&self) {
        self.region.fetch_add(DOORBELL_WORD_INDEX, 1);
        self.region.wake_all(DOORBELL_WORD_INDEX);
    }
}

/// A running RF-RPC front end for a group of servers. Dropping it stops it.
pub struct RfRpcGroup {
    control_addresses: Vec<SocketAddr>,
    shared: Arc<Shared>,
    waker: Arc<Waker>,
    threads: Vec<JoinHandle<()>>,
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
        let cores = group.cores().to_vec();
        let clock = group.clock();
        let exchange = Arc::clone(group.deferred_exchange());
        let fabric = ShmFabric::new().map_err(std::io::Error::other)?;
        let region = fabric
            .register(
                &unique_region_name("rf-server"),
                RfRpcRegionLayout::server_region_bytes(RFRPC_GROUP_CONNECTIONS_MAX),
                Access::ReadWrite,
            )
            .map_err(std::io::Error::other)?;
        let region = Arc::new(region);
        if exchange.rings.set(Arc::clone(&region)).is_err() {
            return Err(std::io::Error::other("this server group already has a ring front end"));
        }
        let shared = Arc::new(Shared {
            region,
            stop: AtomicBool::new(false),
            control_pending: AtomicBool::new(false),
            free_slots: Mutex::new((0..RFRPC_GROUP_CONNECTIONS_MAX).rev().collect()),
        });
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let mut listeners = Vec::with_capacity(cores.len());
        let mut control_addresses = Vec::with_capacity(cores.len());
        for (index, core) in cores.into_iter().enumerate() {
            let mut listener = TcpListener::bind(listen)?;
            poll.registry().register(&mut listener, Token(index), Interest::READABLE)?;
            control_addresses.push(listener.local_addr()?);
            listeners.push((listener, core));
        }
        let (events, inbox) = channel();
        let control = ControlLoop {
            poll,
            listeners,
            streams: (0..RFRPC_GROUP_CONNECTIONS_MAX).map(|_| None).collect(),
            fabric,
            shared: Arc::clone(&shared),
            events,
            generation: 0,
        };
        let doorbell = Doorbell::new(Arc::clone(&shared.region), 0).map_err(std::io::Error::other)?;
        let poller = Poller {
            shared: Arc::clone(&shared),
            doorbell,
            inbox,
            connections: (0..RFRPC_GROUP_CONNECTIONS_MAX).map(|_| None).collect(),
            clock,
            deferred: Vec::new(),
            exchange,
            cores: control.listeners.iter().map(|(_, core)| Arc::clone(core)).collect(),
            frames: Vec::new(),
            replies: EntryList::new(),
        };
        let control_thread =
            std::thread::Builder::new().name("rampkv-rf-control".into()).spawn(move || control.run())?;
        let poller_thread = std::thread::Builder::new().name("rampkv-rf-poller".into()).spawn(move || poller.run())?;
        Ok(RfRpcGroup { control_addresses, shared, waker, threads: vec![control_thread, poller_thread] })
    }

    /// The control address of every server, in the order of the group's cores.
    pub fn control_addresses(&self) -> &[SocketAddr] {
        &self.control_addresses
    }
}

impl Drop for RfRpcGroup {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_poller();
        let _ = self.waker.wake();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

struct ControlLoop {
    poll: Poll,
    listeners: Vec<(TcpListener, Arc<ServerCore>)>,
    streams: Vec<Option<TcpStream>>,
    fabric: ShmFabric,
    shared: Arc<Shared>,
    events: Sender<ControlEvent>,
    generation: u64,
}

impl ControlLoop {
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.shared.stop.load(Ordering::Acquire) {
            match self.poll.poll(&mut events, None) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
            for event in events.iter() {
                let token = event.token();
                if token == WAKER_TOKEN {
                    continue;
                }
                if token.0 < self.listeners.len() {
                    self.accept(token.0);
                } else {
                    self.check_stream(token.0 - self.listeners.len());
                }
            }
        }
    }

    fn accept(&mut self, index: usize) {
        loop {
            let stream = match self.listeners[index].0.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            let core = Arc::clone(&self.listeners[index].1);
            let Ok(stream) = into_blocking(stream) else { continue };
            if let Some((slot, connection_stream)) = self.handshake(stream, core) {
                let mut stream = TcpStream::from_std(connection_stream);
                let token = Token(self.listeners.len() + slot);
                if self.poll.registry().register(&mut stream, token, Interest::READABLE).is_err() {
                    let _ = stream.shutdown(Shutdown::Both);
                    self.send(ControlEvent::Closed { slot });
                    continue;
                }
                self.streams[slot] = Some(stream);
            }
        }
    }

    fn handshake(
        &mut self,
        mut stream: std::net::TcpStream,
        core: Arc<ServerCore>,
    ) -> Option<(usize, std::net::TcpStream)> {
        let hello: RfRpcClientHello = match read_json_line(&mut stream) {
            Ok(hello) => hello,
            Err(error) => {
                refuse(&mut stream, format!("bad hello: {error}"));
                return None;
            }
        };
        let Some(slot) = self.shared.free_slots.lock().pop() else {
            refuse(&mut stream, format!("all {RFRPC_GROUP_CONNECTIONS_MAX} connection slots are in use"));
            return None;
        };
        self.generation += 1;
        let id = RING_CONNECTION_ID_BIT | (self.generation << 32) | slot as u64;
        let built = stream
            .try_clone()
            .map_err(|error| error.to_string())
            .and_then(|control| build_connection(self.fabric, &self.shared.region, &hello, slot, id, core, control));
        let connection = match built {
            Ok(connection) => connection,
            Err(reason) => {
                self.shared.free_slots.lock().push(slot);
                refuse(&mut stream, reason);
                return None;
            }
        };
        let accepted = RfRpcServerReply::Accepted {
            region: self.shared.region.descriptor().clone(),
            request_ring: RfRpcRegionLayout::request_ring(slot),
            reply_slot_offset_bytes: RfRpcRegionLayout::reply_slot_offset_bytes(slot),
            reply_slot_bytes: RfRpcRegionLayout::REPLY_SLOT_BYTES as u64,
            doorbell_offset_bytes: RfRpcRegionLayout::DOORBELL_OFFSET_BYTES,
            push_credit_offset_bytes: RfRpcRegionLayout::push_credit_offset_bytes(slot),
        };
        // The poller gets the connection first: once the client reads the reply it may send.
        self.send(ControlEvent::Open(Box::new(connection)));
        if write_json_line(&mut stream, &accepted).is_err() || stream.set_nonblocking(true).is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            self.send(ControlEvent::Closed { slot });
            return None;
        }
        Some((slot, stream))
    }

    fn check_stream(&mut self, slot: usize) {
        let Some(stream) = self.streams.get_mut(slot).and_then(Option::as_mut) else { return };
        if !control_stream_ended(stream) {
            return;
        }
        if let Some(mut stream) = self.streams[slot].take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        self.send(ControlEvent::Closed { slot });
    }

    fn send(&self, event: ControlEvent) {
        if self.events.send(event).is_ok() {
            self.shared.control_pending.store(true, Ordering::Release);
            self.shared.wake_poller();
        }
    }
}

fn refuse(stream: &mut std::net::TcpStream, reason: String) {
    let _ = write_json_line(stream, &RfRpcServerReply::Refused { reason });
    let _ = stream.shutdown(Shutdown::Both);
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
                    self.shared.free_slots.lock().push(slot);
                }
            }
        }
    }

    fn sleep(&mut self, now_ms: u64) {
        let mut timeout = Duration::from_millis(WRITEPOLL_SLEEP_MS_MAX);
        if let Some(deadline) = self.cores.iter().filter_map(|core| core.next_lock_deadline_ms()).min() {
            timeout = timeout.min(Duration::from_millis(deadline.saturating_sub(now_ms) + 1));
        }
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
            let _ = connection.control.shutdown(Shutdown::Both);
            connection.core.connection_closed(connection.id, &mut self.deferred);
        }
    }

    fn deliver_deferred(&mut self, now_ms: u64) {
        for core in &self.cores {
            if core.next_lock_deadline_ms().is_some_and(|deadline| deadline <= now_ms) {
                core.expire_lock_waits(now_ms, &mut self.deferred);
            }
        }
        self.exchange.take_for_rings(&mut self.deferred);
        while let Some(reply) = self.deferred.pop() {
            if !is_ring_connection(reply.connection) {
                self.exchange.send_to_tcp(reply);
                continue;
            }
            let slot = (reply.connection & 0xFFFF_FFFF) as usize;
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else { continue };
            if connection.id != reply.connection {
                continue; // the connection closed: nobody to tell
            }
            let mut frame = reply.frame;
            bound_frame(&mut frame, connection.endpoint.unsolicited_entries_bytes_max() - 4);
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
            bound_frame(&mut frame, push_frame_max);
            backlog.push_back(frame);
        }
    }
    endpoint.server_send(replies).map_err(|_| Fault::Corrupt)?;
    connection.push_backlog(replies)?;
    Ok(1)
}

/// Replaces a reply frame too large for a push message by an ERROR reply (as the write-poll
/// front end does for its ring messages).
fn bound_frame(frame: &mut Vec<u8>, bytes_max: usize) {
    if frame.len() <= bytes_max {
        return;
    }
    let request_id = u64::from_le_bytes(frame[8..16].try_into().expect("a frame header"));
    let reply = Response::bad_request(format!(
        "reply of {} bytes exceeds the push message maximum of {bytes_max} bytes",
        frame.len()
    ));
    frame.clear();
    reply.encode_frame(request_id, frame);
}
