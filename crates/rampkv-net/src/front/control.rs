//! What the one-sided front ends share (write-poll with send/recv in `server_writepoll`,
//! RF-RPC in `server_rfrpc`): the control thread's loop, the admission of a new connection into
//! a slot, and the poller's handling of lock deadlines, deferred replies and oversized replies.
//!
//! Each front end has a control thread and one poller thread. The control thread accepts on one
//! listener per server, runs the JSON handshake of each new client (blocking, bounded by the
//! control timeout), hands the connection to the poller, and watches the control connection:
//! its end is the client's end, and the poller then drops the connection and frees the slot.
//! What differs between front ends is only the handshake ([`Handshake`]) and the connections.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use rampkv_fabric::{Access, Doorbell, Fabric, ShmFabric, ShmLocalRegion, Words};
use serde::Serialize;

use crate::server::ServerGroup;
use crate::server_writepoll::{is_ring_connection, DeferredExchange, RING_CONNECTION_ID_BIT};
use crate::transport::writepoll::{unique_region_name, write_json_line};
use rampkv_core::limits::{WRITEPOLL_CONTROL_TIMEOUT_MS, WRITEPOLL_SLEEP_MS_MAX};
use rampkv_core::protocol::server::{DeferredReply, ServerCore};
use rampkv_core::wire::Response;

/// The token of the control poll's waker (listeners are `0..servers`, control streams after).
pub(crate) const WAKER_TOKEN: Token = Token(usize::MAX);
const EVENTS_CAPACITY: usize = 256;

/// A front end's part of the control loop.
pub(crate) trait Handshake {
    /// Whether the front end is stopping.
    fn stopped(&self) -> bool;

    /// Runs the handshake of a new client of `core` on its control `stream` (blocking, with
    /// the control timeouts). On success the connection is with the poller, and the result is
    /// its slot and the control stream (now non-blocking) to watch.
    fn handshake(&mut self, stream: std::net::TcpStream, core: Arc<ServerCore>)
        -> Option<(usize, std::net::TcpStream)>;

    /// The control connection of `slot` ended (or cannot be watched): the poller must drop the
    /// connection and free the slot.
    fn closed(&mut self, slot: usize);
}

/// Control listeners, each with the core its clients reach.
type Listeners = Vec<(TcpListener, Arc<ServerCore>)>;

/// Binds one control listener per core on `listen` (port 0: a free port each) and registers
/// them with `poll` as tokens `0..cores.len()`; returns them and their addresses.
fn bind_listeners(
    poll: &Poll,
    cores: Vec<Arc<ServerCore>>,
    listen: SocketAddr,
) -> std::io::Result<(Listeners, Vec<SocketAddr>)> {
    let mut listeners = Vec::with_capacity(cores.len());
    let mut addresses = Vec::with_capacity(cores.len());
    for (index, core) in cores.into_iter().enumerate() {
        let mut listener = TcpListener::bind(listen)?;
        poll.registry().register(&mut listener, Token(index), Interest::READABLE)?;
        addresses.push(listener.local_addr()?);
        listeners.push((listener, core));
    }
    Ok((listeners, addresses))
}

/// The control thread of a front end.
pub(crate) struct ControlLoop<H> {
    poll: Poll,
    listeners: Listeners,
    /// Open control connections by slot.
    streams: Vec<Option<TcpStream>>,
    handshake: H,
}

impl<H: Handshake> ControlLoop<H> {
    /// A loop over `listeners` (registered with `poll`) for at most `slots` connections.
    pub(crate) fn new(poll: Poll, listeners: Vec<(TcpListener, Arc<ServerCore>)>, slots: usize, handshake: H) -> Self {
        Self { poll, listeners, streams: (0..slots).map(|_| None).collect(), handshake }
    }

    /// The cores, in listener order (for the poller).
    pub(crate) fn cores(&self) -> Vec<Arc<ServerCore>> {
        self.listeners.iter().map(|(_, core)| Arc::clone(core)).collect()
    }

    /// Runs until the front end stops (woken through the waker) or polling fails; then the
    /// poller keeps serving the open connections, but no new one is accepted.
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.handshake.stopped() {
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
                Err(_) => return, // WouldBlock, or a failed connection: only that one
            };
            let core = Arc::clone(&self.listeners[index].1);
            // The handshake is short and bounded by the control timeout; it runs blocking.
            let Ok(stream) = into_blocking(stream) else { continue };
            let Some((slot, connection_stream)) = self.handshake.handshake(stream, core) else { continue };
            let mut stream = TcpStream::from_std(connection_stream);
            let token = Token(self.listeners.len() + slot);
            let watched = slot < self.streams.len()
                && self.poll.registry().register(&mut stream, token, Interest::READABLE).is_ok();
            if watched {
                self.streams[slot] = Some(stream);
            } else {
                let _ = stream.shutdown(Shutdown::Both);
                self.handshake.closed(slot);
            }
        }
    }

    /// A control connection is readable: the client sends nothing after its hello, so this
    /// is its end (or garbage, which is drained and ignored, bounded per event).
    fn check_stream(&mut self, slot: usize) {
        let Some(stream) = self.streams.get_mut(slot).and_then(Option::as_mut) else { return };
        if !control_stream_ended(stream) {
            return;
        }
        if let Some(mut stream) = self.streams[slot].take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        self.handshake.closed(slot);
    }
}

/// Reads what a readable control stream holds (bounded per call). True if the peer closed it
/// or it failed: after its hello a client sends nothing, so anything else is drained and
/// ignored.
fn control_stream_ended(stream: &mut TcpStream) -> bool {
    let mut scratch = [0u8; 256];
    for _ in 0..16 {
        match std::io::Read::read(stream, &mut scratch) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(error) if error.kind() == ErrorKind::WouldBlock => return false,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
    true
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

/// Answers a client with `reply` (a refusal) and closes its control connection.
pub(crate) fn refuse<R: Serialize>(stream: &mut std::net::TcpStream, reply: &R) {
    let _ = write_json_line(stream, reply);
    let _ = stream.shutdown(Shutdown::Both);
}

/// The slots of one kind of connection: the free list (the control thread takes, the poller
/// gives back) and what a refusal calls them.
pub(crate) struct SlotPool<'a> {
    pub(crate) free: &'a Mutex<Vec<usize>>,
    pub(crate) capacity: usize,
    /// Plural noun for the refusal: "ring slots", ...
    pub(crate) name: &'static str,
}

/// What the poller is told about a connection during admission.
pub(crate) trait Admitted<C> {
    /// Hands the built connection to the poller.
    fn open(&mut self, connection: C);
    /// The connection in `slot` is gone before it was watched.
    fn closed(&mut self, slot: usize);
}

/// Admits a client whose hello was read and checked: takes a slot from `pool` (or refuses),
/// builds the connection with a fresh connection id (`build` returns it with the reply that
/// accepts it; on an error the slot is given back and the client refused with the reason),
/// hands it to the poller *before* answering (once the client reads the answer it may send),
/// and answers. Returns the slot and the control stream, now non-blocking.
pub(crate) fn admit<C, R: Serialize>(
    mut stream: std::net::TcpStream,
    pool: &SlotPool<'_>,
    generation: &mut u64,
    refused: impl Fn(String) -> R,
    build: impl FnOnce(usize, u64, std::net::TcpStream) -> Result<(C, R), String>,
    poller: &mut impl Admitted<C>,
) -> Option<(usize, std::net::TcpStream)> {
    let Some(slot) = pool.free.lock().pop() else {
        refuse(&mut stream, &refused(format!("all {} {} are in use", pool.capacity, pool.name)));
        return None;
    };
    *generation += 1;
    let id = connection_id(*generation, slot);
    let built = stream.try_clone().map_err(|error| error.to_string()).and_then(|control| build(slot, id, control));
    let (connection, accepted) = match built {
        Ok(built) => built,
        Err(reason) => {
            pool.free.lock().push(slot);
            refuse(&mut stream, &refused(reason));
            return None;
        }
    };
    poller.open(connection);
    if write_json_line(&mut stream, &accepted).is_err() || stream.set_nonblocking(true).is_err() {
        let _ = stream.shutdown(Shutdown::Both);
        poller.closed(slot);
        return None;
    }
    Some((slot, stream))
}

/// The server-core connection id of the `generation`-th connection, in `slot`:
/// `RING_CONNECTION_ID_BIT | generation << 32 | slot` (31 bits of generation), so that a
/// deferred reply for a closed connection never reaches a newer one in the same slot.
fn connection_id(generation: u64, slot: usize) -> u64 {
    RING_CONNECTION_ID_BIT | ((generation & 0x7FFF_FFFF) << 32) | slot as u64
}

/// The slot a ring connection id names.
pub(crate) fn slot_of(connection: u64) -> usize {
    (connection & 0xFFFF_FFFF) as usize
}

/// How long a poller may sleep: `WRITEPOLL_SLEEP_MS_MAX`, or until just after the earliest
/// lock-wait deadline of `cores`.
pub(crate) fn sleep_timeout(cores: &[Arc<ServerCore>], now_ms: u64) -> Duration {
    let timeout = Duration::from_millis(WRITEPOLL_SLEEP_MS_MAX);
    match cores.iter().filter_map(|core| core.next_lock_deadline_ms()).min() {
        Some(deadline) => timeout.min(Duration::from_millis(deadline.saturating_sub(now_ms) + 1)),
        None => timeout,
    }
}

/// Aborts the expired lock waits of `cores` and takes the deferred replies the TCP loop handed
/// over, then routes: replies for TCP connections go to the TCP loop, the ring connections'
/// stay in `deferred` for the poller to deliver.
pub(crate) fn gather_deferred(
    cores: &[Arc<ServerCore>],
    exchange: &DeferredExchange,
    now_ms: u64,
    deferred: &mut Vec<DeferredReply>,
) {
    for core in cores {
        if core.next_lock_deadline_ms().is_some_and(|deadline| deadline <= now_ms) {
            core.expire_lock_waits(now_ms, deferred);
        }
    }
    exchange.take_for_rings(deferred);
    let mut index = 0;
    while index < deferred.len() {
        if is_ring_connection(deferred[index].connection) {
            index += 1;
        } else {
            exchange.send_to_tcp(deferred.swap_remove(index));
        }
    }
}

/// Drops a connection's server-side state: its control connection is shut down (so the
/// client learns it) and the core releases what it held (S2PL locks, waits).
pub(crate) fn release_connection(
    control: &std::net::TcpStream,
    core: &ServerCore,
    id: u64,
    deferred: &mut Vec<DeferredReply>,
) {
    let _ = control.shutdown(Shutdown::Both);
    core.connection_closed(id, deferred);
}

/// Replaces the reply frame at `replies[start..]` (if any) by an ERROR reply when it is larger
/// than `bytes_max`, the most one `message` (ring message, push message, ...) carries, so that
/// every queued frame can be sent.
pub(crate) fn bound_reply(replies: &mut Vec<u8>, start: usize, bytes_max: usize, message: &str) {
    let frame_bytes = replies.len() - start;
    if frame_bytes <= bytes_max {
        return;
    }
    let request_id = u64::from_le_bytes(replies[start + 8..start + 16].try_into().expect("a frame header"));
    replies.truncate(start);
    let reply = Response::bad_request(format!(
        "reply of {frame_bytes} bytes exceeds the {message} maximum of {bytes_max} bytes"
    ));
    reply.encode_frame(request_id, replies);
}

/// State a front end's control thread, poller and handle share.
pub(crate) struct Shared<P> {
    /// The front end's registered region; the poller sleeps on its doorbell word.
    pub(crate) region: Arc<ShmLocalRegion>,
    doorbell_word: usize,
    pub(crate) stop: AtomicBool,
    /// Set by the control thread after it sent an event; checked by the poller's sleep.
    pub(crate) control_pending: AtomicBool,
    /// The slots not in use, per kind of connection: the control thread takes, the poller
    /// gives back.
    pub(crate) free: P,
}

impl<P> Shared<P> {
    /// Shared state over `region`, whose poller doorbell is the word at `doorbell_offset_bytes`.
    pub(crate) fn new(region: Arc<ShmLocalRegion>, doorbell_offset_bytes: usize, free: P) -> Self {
        Self {
            region,
            doorbell_word: doorbell_offset_bytes / 8,
            stop: AtomicBool::new(false),
            control_pending: AtomicBool::new(false),
            free,
        }
    }

    /// Wakes the poller if it sleeps on the doorbell (a local ring of the bell).
    pub(crate) fn wake_poller(&self) {
        self.region.fetch_add(self.doorbell_word, 1);
        self.region.wake_all(self.doorbell_word);
    }
}

/// The control thread's channel to the poller: events of type `E`, and a wake-up.
pub(crate) struct Notify<'a, E, P> {
    pub(crate) events: &'a Sender<E>,
    pub(crate) shared: &'a Shared<P>,
}

impl<E, P> Notify<'_, E, P> {
    /// Sends `event` and wakes the poller (nothing if the poller is gone).
    pub(crate) fn send(&self, event: E) {
        if self.events.send(event).is_ok() {
            self.shared.control_pending.store(true, Ordering::Release);
            self.shared.wake_poller();
        }
    }
}

/// The threads of a running front end. Dropping it stops them (the stop flag, the poller's
/// doorbell, the control poll's waker) and joins them.
pub(crate) struct FrontThreads<P> {
    shared: Arc<Shared<P>>,
    waker: Arc<Waker>,
    threads: Vec<JoinHandle<()>>,
}

impl<P: Send + Sync + 'static> FrontThreads<P> {
    /// Starts the control thread (`control`, woken by `waker`) and the poller thread
    /// (`poller`), named `rampkv-<name>-control` and `rampkv-<name>-poller`.
    pub(crate) fn start<H: Handshake + Send + 'static>(
        name: &str,
        shared: Arc<Shared<P>>,
        waker: Arc<Waker>,
        control: ControlLoop<H>,
        poller: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let mut running = Self { shared, waker, threads: Vec::with_capacity(2) };
        let control =
            std::thread::Builder::new().name(format!("rampkv-{name}-control")).spawn(move || control.run())?;
        running.threads.push(control);
        // If the poller cannot start, dropping `running` stops the control thread.
        running.threads.push(std::thread::Builder::new().name(format!("rampkv-{name}-poller")).spawn(poller)?);
        Ok(running)
    }
}

impl<P> Drop for FrontThreads<P> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_poller();
        let _ = self.waker.wake();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// What every front end sets up before its own parts: its region, registered and attached to
/// the server group's deferred-reply exchange (whose doorbell the TCP loop rings); the shared
/// state; the control poll with its waker and one listener per server; the poller's doorbell;
/// and the group's clock and exchange.
pub(crate) struct Setup<P> {
    pub(crate) fabric: ShmFabric,
    pub(crate) shared: Arc<Shared<P>>,
    pub(crate) poll: Poll,
    pub(crate) waker: Arc<Waker>,
    pub(crate) listeners: Listeners,
    pub(crate) control_addresses: Vec<SocketAddr>,
    pub(crate) doorbell: Doorbell<Arc<ShmLocalRegion>>,
    pub(crate) exchange: Arc<DeferredExchange>,
    pub(crate) clock: Instant,
}

impl<P> Setup<P> {
    /// Sets up a front end for `group` named `region_name` (its region file), whose region has
    /// `region_bytes` with the doorbell word at `doorbell_offset_bytes`, with `free` slots,
    /// listening on `listen` (port 0: a free port per server).
    pub(crate) fn new(
        group: &ServerGroup,
        listen: SocketAddr,
        region_name: &str,
        region_bytes: usize,
        doorbell_offset_bytes: usize,
        free: P,
    ) -> std::io::Result<Self> {
        let exchange = Arc::clone(group.deferred_exchange());
        let fabric = ShmFabric::new().map_err(std::io::Error::other)?;
        let region = fabric
            .register(&unique_region_name(region_name), region_bytes, Access::ReadWrite)
            .map_err(std::io::Error::other)?;
        let region = Arc::new(region);
        if exchange.rings.set(Arc::clone(&region)).is_err() {
            return Err(std::io::Error::other("this server group already has a ring front end"));
        }
        let doorbell = Doorbell::new(Arc::clone(&region), doorbell_offset_bytes).map_err(std::io::Error::other)?;
        let shared = Arc::new(Shared::new(region, doorbell_offset_bytes, free));
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let (listeners, control_addresses) = bind_listeners(&poll, group.cores().to_vec(), listen)?;
        Ok(Self { fabric, shared, poll, waker, listeners, control_addresses, doorbell, exchange, clock: group.clock() })
    }
}
