//! The fabric front end: write-poll rings, send/recv queue pairs and RF-RPC connections to the
//! servers of a group, over any [`FabricHandle`].
//!
//! It registers a **doorbell region** (its poller's doorbell, which every client maps and rings:
//! one doorbell is what lets one poller sleep for all its connections) and, per connection, a
//! **connection region** holding that connection's slot (its request ring, queue or RPC reply
//! slot): a client maps only its own connection's region, so it cannot write another client's
//! rings, and a closed connection's region is gone (a late write by its old client lands
//! nowhere another connection reads). Connections are numbered by slot, a slot range per medium
//! (the caps). It runs two threads:
//! - the **control thread** owns one control listener per server. It runs a client's handshake
//!   (`message::fabric`: the hello, the challenge the client must write into the region it
//!   names, a region of the connection's own), builds the server's end of the connection in a
//!   free slot of its medium, hands it to the poller *before* answering (once the client reads
//!   the answer it may send), and watches the control connection: its end is the client's end;
//! - the **poller** ([`crate::server::poller`], the same code as the TCP front end's) serves every
//!   connection. Idle, it spins the doorbell's bounded while and sleeps on the doorbell, rung by
//!   any client that sends while it sleeps and by the router when another front end hands it a
//!   deferred reply. No `POLL_SPIN_US` spin on top: measured, that extra spin cost about 25% of
//!   throughput on the shared 2-core machine (docs/performance.md).
//!
//! With item slots configured it also registers an item region per server and attaches it, so
//! that every front end of the group publishes committed versions there (GET\*).
//!
//! # Handshakes that never finish
//! The control thread serves every handshake at once without blocking: each accepted control
//! connection has its hello and its answer to the challenge read as they arrive, each within
//! `CONTROL_HANDSHAKE_TIMEOUT_MS` of the connection opening (closed after that); at most
//! `CONTROL_HANDSHAKES_MAX` are under way, and beyond that the oldest is closed for the new
//! one (an honest client finishes its handshake in a round trip). So connections that never
//! finish, or trickle their lines, cannot keep other clients out: before, the handshake ran
//! blocking, one at a time, each read waiting up to the control timeout, so one silent
//! connection held every other client back for seconds and a trickled hello indefinitely.
//!
//! # Fault model
//! A client whose hello is malformed, names a region of this process's servers, names a region
//! it does not write the challenge into, or names a region that cannot be used is refused with
//! a typed reason, before the server writes anything into that region. A connection whose channel breaks is closed by the poller, which shuts its
//! control connection down so the client learns it, and releases its S2PL locks.

use std::io::ErrorKind;
use std::io::Read;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use rampkv_core::cluster::Front;
use rampkv_core::limits::{
    CONTROL_HANDSHAKES_MAX, CONTROL_HANDSHAKE_TIMEOUT_MS, RFRPC_GROUP_CONNECTIONS_MAX, SENDRECV_GROUP_CONNECTIONS_MAX,
    WRITEPOLL_CONTROL_LINE_BYTES_MAX, WRITEPOLL_GROUP_CONNECTIONS_MAX,
};
use rampkv_fabric::{AnyFabric, Doorbell, FabricError, Words};

use super::{PollerThread, ServerGroup, Servers};
use crate::auth::{ProofLabel, SharedSecret};
use crate::item_slots::{ItemSlotConfig, ItemSlots, Publisher};
use crate::message::control::{
    ControlHello, ControlReply, ControlResponse, ControlToken, ItemRegionInfo, MediumKind, Refusal, CONTROL_VERSION,
};
use crate::message::fabric::{
    unique_region_name, write_json_line, Endpoint, FabricHandle, FabricKind, Link, ServedRegion, DOORBELL_OFFSET_BYTES,
    HEADER_BYTES,
};
use crate::message::rfrpc::{RfRpc, RfRpcServerChannel};
use crate::message::ring::{Ring, RingChannel};
use crate::message::sendrecv::{QueueChannel, SendRecv};
use crate::message::{Channel, ChannelError, FrontEvent, ServerMedium, Wake};
use rampkv_core::limits::CONTROL_CHALLENGE_BYTES;
use rampkv_fabric::Doorbells;

/// The token of the control poll's waker (listeners are `0..servers`, control streams after,
/// handshakes under way from `HANDSHAKE_TOKEN_BASE`).
const WAKER_TOKEN: Token = Token(usize::MAX);
const HANDSHAKE_TOKEN_BASE: usize = 1 << 40;
const EVENTS_CAPACITY: usize = 256;

/// How many connections of each medium (ring, send/recv, RF-RPC) a fabric front end serves,
/// and its GET\* item slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontConfig {
    pub slots: [usize; 3],
    /// Item regions (GET\*) for the servers, if any.
    pub item_slots: Option<ItemSlotConfig>,
}

impl FrontConfig {
    /// The front end `front` names: `Ring` serves write-poll, send/recv and one-sided clients,
    /// `RfRpc` serves RF-RPC clients; each with its group limit of connections.
    pub fn of(front: Front, item_slots: Option<ItemSlotConfig>) -> Self {
        let slots = match front {
            Front::Ring => [WRITEPOLL_GROUP_CONNECTIONS_MAX, SENDRECV_GROUP_CONNECTIONS_MAX, 0],
            Front::RfRpc => [0, 0, RFRPC_GROUP_CONNECTIONS_MAX],
        };
        Self { slots, item_slots }
    }
}

/// One medium's connections: global slot numbers `first..first + slots`, each with a region of
/// `slot_bytes`.
#[derive(Debug, Clone, Copy)]
struct Area {
    first: usize,
    slots: usize,
    slot_bytes: usize,
}

/// The areas of the three media, in the order of [`MediumKind`].
fn areas<F: FabricHandle>(config: &FrontConfig) -> [Area; 3] {
    let bytes = [
        <Ring as FabricKind<F>>::SERVER_SLOT_BYTES,
        <SendRecv as FabricKind<F>>::SERVER_SLOT_BYTES,
        <RfRpc as FabricKind<F>>::SERVER_SLOT_BYTES,
    ];
    let mut first = 0;
    std::array::from_fn(|medium| {
        let area = Area { first, slots: config.slots[medium], slot_bytes: bytes[medium] };
        first += area.slots;
        area
    })
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
        self.0.fetch_add(DOORBELL_OFFSET_BYTES / 8, 1);
        self.0.wake_all(DOORBELL_OFFSET_BYTES / 8);
    }
}

/// The fabric front end's medium, for its poller.
pub struct FabricServer<F: FabricHandle> {
    region: Arc<F::LocalRegion>,
    doorbell: Doorbell<Arc<F::LocalRegion>>,
    inbox: Receiver<FrontEvent<FabricChannel<F>>>,
    shared: Arc<Shared>,
    areas: [Area; 3],
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
    /// The control handshake checks the shared secret before a connection opens.
    const AUTHENTICATES: bool = true;

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
            let pending = &self.shared.control_pending;
            let _ = self.doorbell.wait_until(|| ready() || pending.load(Ordering::Relaxed), timeout);
            self.take_control(events);
        }
        events.push(FrontEvent::AllReady);
        Ok(())
    }

    fn close(&mut self, _slot: usize, channel: FabricChannel<F>) {
        // The client learns it from its control connection; the control thread then reports
        // the end, and the slot is released.
        let _ = each!(&channel, channel => channel.control()).shutdown(Shutdown::Both);
    }

    fn release(&mut self, slot: usize) {
        if let Some(medium) = self.areas.iter().position(|area| (area.first..area.first + area.slots).contains(&slot)) {
            self.shared.free[medium].lock().push(slot);
        }
    }
}

/// The control thread. See the module docs.
struct Control<F: FabricHandle> {
    poll: Poll,
    listeners: Vec<TcpListener>,
    /// Open control connections by slot.
    streams: Vec<Option<TcpStream>>,
    /// The doorbell region (every client maps it; connections' regions are their own).
    doorbell: Endpoint<F>,
    /// The shared secret clients must prove (the group's), if any.
    secret: Option<Arc<SharedSecret>>,
    items: Vec<Option<ItemRegionInfo>>,
    events: Sender<FrontEvent<FabricChannel<F>>>,
    shared: Arc<Shared>,
    areas: [Area; 3],
    wake_poller: DoorbellWake<F>,
    /// Handshakes under way, by index (their token is `HANDSHAKE_TOKEN_BASE + index`).
    handshakes: Vec<Option<Handshake>>,
}

/// A control connection whose handshake is under way: it holds no slot yet.
struct Handshake {
    /// Non-blocking; registered with the control poll.
    stream: std::net::TcpStream,
    server: usize,
    /// The bytes of the line being received.
    line: Vec<u8>,
    step: HandshakeStep,
    /// When it opened (the oldest is closed first when too many are under way) and when it
    /// must be done.
    opened: Instant,
    deadline: Instant,
}

enum HandshakeStep {
    /// Waiting for the client's hello.
    Hello,
    /// The challenge is sent; waiting for the client's answer.
    Answer { hello: ControlHello, challenge: ControlToken },
}

/// What reading a handshake's stream found.
enum LineRead {
    Line(Vec<u8>),
    Pending,
    /// The end of the stream, an error, or a line over the bound: close it.
    Failed,
}

impl<F: FabricHandle> Control<F> {
    /// Runs until the front end stops (woken through the waker) or polling fails; then the
    /// poller keeps serving the open connections, but no new one is accepted.
    fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.shared.stop.load(Ordering::Acquire) {
            self.expire_handshakes();
            let next_deadline = self.handshakes.iter().flatten().map(|handshake| handshake.deadline).min();
            let timeout = next_deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
            for event in events.iter() {
                match event.token() {
                    WAKER_TOKEN => {}
                    Token(index) if index < self.listeners.len() => self.accept(index),
                    Token(index) if index >= HANDSHAKE_TOKEN_BASE => self.advance(index - HANDSHAKE_TOKEN_BASE),
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
            let stream: std::net::TcpStream = stream.into(); // stays non-blocking
            let _ = stream.set_nodelay(true);
            self.begin_handshake(stream, server);
        }
    }

    /// Registers a new control connection's handshake, closing the oldest one under way if
    /// `CONTROL_HANDSHAKES_MAX` are.
    fn begin_handshake(&mut self, stream: std::net::TcpStream, server: usize) {
        let index = match self.handshakes.iter().position(Option::is_none) {
            Some(index) => index,
            None if self.handshakes.len() < CONTROL_HANDSHAKES_MAX => {
                self.handshakes.push(None);
                self.handshakes.len() - 1
            }
            None => {
                let oldest = self
                    .handshakes
                    .iter()
                    .enumerate()
                    .filter_map(|(index, handshake)| handshake.as_ref().map(|handshake| (handshake.opened, index)));
                let (_, index) = oldest.min().expect("CONTROL_HANDSHAKES_MAX handshakes are under way");
                if let Some(handshake) = self.take_handshake(index) {
                    let _ = handshake.stream.shutdown(Shutdown::Both);
                }
                index
            }
        };
        let token = Token(HANDSHAKE_TOKEN_BASE + index);
        let registered = self.poll.registry().register(&mut SourceFd(&stream.as_raw_fd()), token, Interest::READABLE);
        if registered.is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        let opened = Instant::now();
        let deadline = opened + Duration::from_millis(CONTROL_HANDSHAKE_TIMEOUT_MS);
        let step = HandshakeStep::Hello;
        self.handshakes[index] = Some(Handshake { stream, server, line: Vec::new(), step, opened, deadline });
        // Bytes may have arrived before it was registered (edge-triggered: no event for them).
        self.advance(index);
    }

    /// Takes handshake `index` out of the table and the poll.
    fn take_handshake(&mut self, index: usize) -> Option<Handshake> {
        let handshake = self.handshakes.get_mut(index)?.take()?;
        let _ = self.poll.registry().deregister(&mut SourceFd(&handshake.stream.as_raw_fd()));
        Some(handshake)
    }

    /// Closes the handshakes past their deadline.
    fn expire_handshakes(&mut self) {
        let now = Instant::now();
        for index in 0..self.handshakes.len() {
            if self.handshakes[index].as_ref().is_some_and(|handshake| handshake.deadline <= now) {
                if let Some(handshake) = self.take_handshake(index) {
                    let peer = handshake.stream.peer_addr().map_or_else(|_| "?".to_string(), |peer| peer.to_string());
                    log::warn!(
                        "closing the control connection from {peer} to server {}: handshake not finished within \
                         {CONTROL_HANDSHAKE_TIMEOUT_MS} ms",
                        handshake.server
                    );
                    let _ = handshake.stream.shutdown(Shutdown::Both);
                }
            }
        }
    }

    /// Reads what arrived on handshake `index` and takes each step whose line is complete.
    fn advance(&mut self, index: usize) {
        // A client sends one line per step and waits for the answer: two steps at most.
        for _ in 0..2 {
            let Some(handshake) = self.handshakes.get_mut(index).and_then(Option::as_mut) else { return };
            let line = match read_line_now(&mut handshake.stream, &mut handshake.line) {
                LineRead::Line(line) => line,
                LineRead::Pending => return,
                LineRead::Failed => {
                    if let Some(handshake) = self.take_handshake(index) {
                        let _ = handshake.stream.shutdown(Shutdown::Both);
                    }
                    return;
                }
            };
            let Some(mut handshake) = self.take_handshake(index) else { return };
            let step = std::mem::replace(&mut handshake.step, HandshakeStep::Hello);
            let next = match step {
                HandshakeStep::Hello => self.on_hello(&mut handshake.stream, &line),
                HandshakeStep::Answer { hello, challenge } => {
                    self.on_answer(handshake.stream, handshake.server, &hello, &challenge, &line);
                    return;
                }
            };
            match next {
                Ok(step) => {
                    // Back into the table (and the poll) for the answer.
                    handshake.step = step;
                    let token = Token(HANDSHAKE_TOKEN_BASE + index);
                    let fd = handshake.stream.as_raw_fd();
                    if self.poll.registry().register(&mut SourceFd(&fd), token, Interest::READABLE).is_err() {
                        let _ = handshake.stream.shutdown(Shutdown::Both);
                        return;
                    }
                    self.handshakes[index] = Some(handshake);
                }
                Err(refusal) => {
                    refuse(handshake.stream, refusal);
                    return;
                }
            }
        }
    }

    /// The client's hello: checks it and sends the challenge (see [`Control::challenge`]).
    fn on_hello(&self, stream: &mut std::net::TcpStream, line: &[u8]) -> Result<HandshakeStep, Refusal> {
        let hello = match serde_json::from_slice::<ControlHello>(line) {
            Ok(hello) if hello.version == CONTROL_VERSION => hello,
            Ok(hello) => return Err(Refusal::Version { version: hello.version, supported: CONTROL_VERSION }),
            Err(error) => return Err(Refusal::BadHello { message: error.to_string() }),
        };
        let challenge = self.challenge(stream, &hello)?;
        Ok(HandshakeStep::Answer { hello, challenge })
    }

    /// The client's answer to the challenge: checks it (see [`Control::check_answer`]), takes a
    /// slot of its medium, builds the server's end in a region of its own, hands it to the
    /// poller and answers; the control stream is then watched for the client's end.
    fn on_answer(
        &mut self,
        mut stream: std::net::TcpStream,
        server: usize,
        hello: &ControlHello,
        challenge: &ControlToken,
        line: &[u8],
    ) {
        let (peer, peer_slot, proof) = match self.check_answer(hello, challenge, line) {
            Ok(admitted) => admitted,
            Err(refusal) => return refuse(stream, refusal),
        };
        let medium = hello.medium as usize;
        let area = self.areas[medium];
        let Some(slot) = self.shared.free[medium].lock().pop() else {
            return refuse(stream, Refusal::NoFreeSlot { medium: hello.medium, slots: area.slots as u64 });
        };
        let (channel, region) = match self.build(hello.medium, area.slot_bytes, peer, peer_slot, &stream) {
            Ok(built) => built,
            Err(refusal) => {
                self.shared.free[medium].lock().push(slot);
                return refuse(stream, refusal);
            }
        };
        self.tell_poller(FrontEvent::Open { slot, server, channel });
        let (doorbell, items) = (self.doorbell.descriptor.clone(), self.items[server].clone());
        let reply = ControlReply::Accepted { region, slot_offset_bytes: 0, doorbell, items, proof };
        // A line of a few hundred bytes into a connection that has sent one line before: the
        // socket's send buffer takes it whole.
        if write_json_line(&mut stream, &reply).is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            self.tell_poller(FrontEvent::Closed { slot });
            return;
        }
        let mut stream = TcpStream::from_std(stream);
        let token = Token(self.listeners.len() + slot);
        if self.poll.registry().register(&mut stream, token, Interest::READABLE).is_ok() {
            self.streams[slot] = Some(stream);
        } else {
            let _ = stream.shutdown(Shutdown::Both);
            self.tell_poller(FrontEvent::Closed { slot });
        }
    }

    /// The challenge step: with a shared secret the client must send a nonce and then prove the
    /// secret (before the server maps anything); the client's region must not be one of this
    /// process's servers'; and the client must write a fresh random challenge at the start of
    /// its slot there (which another user cannot do to a region file of ours). Sends the
    /// challenge; [`Control::check_answer`] checks the answer.
    fn challenge(&self, stream: &mut std::net::TcpStream, hello: &ControlHello) -> Result<ControlToken, Refusal> {
        if self.secret.is_some() && hello.nonce.is_none() {
            return Err(Refusal::AuthenticationRequired);
        }
        if ServedRegion::is_served(&hello.region) {
            return Err(Refusal::OwnRegion { name: hello.region.name.clone() });
        }
        let server_refusal = |error: &dyn std::fmt::Display| Refusal::ServerRegion { message: error.to_string() };
        let challenge = ControlToken::random().map_err(|error| server_refusal(&error))?;
        // The first line the server sends: the socket's send buffer takes it whole.
        write_json_line(stream, &ControlReply::Challenge { challenge }).map_err(|error| server_refusal(&error))?;
        Ok(challenge)
    }

    /// Checks the client's answer to `challenge`: with a secret its proof, then the challenge
    /// written in the region it named. Returns the mapped region, the slot and, with a secret,
    /// the server's proof.
    fn check_answer(
        &self,
        hello: &ControlHello,
        challenge: &ControlToken,
        line: &[u8],
    ) -> Result<(F::RemoteRegion, usize, Option<ControlToken>), Refusal> {
        let region_refusal = |error: &dyn std::fmt::Display| Refusal::Region { message: error.to_string() };
        let response = serde_json::from_slice::<ControlResponse>(line)
            .map_err(|error| Refusal::BadHello { message: error.to_string() })?;
        let mut server_proof = None;
        if let (Some(secret), Some(nonce)) = (&self.secret, hello.nonce) {
            let proven = response
                .proof
                .is_some_and(|proof| secret.verify(ProofLabel::ControlClient, &challenge.0, &nonce.0, &proof.0));
            if !proven {
                return Err(Refusal::Authentication);
            }
            server_proof = Some(ControlToken(secret.proof(ProofLabel::ControlServer, &nonce.0, &challenge.0)));
        }
        let fabric = &self.doorbell.fabric;
        let peer = fabric.map(&hello.region).map_err(|error| match error {
            FabricError::NoMedium { .. } => Refusal::NoMedium { reason: error.to_string() },
            error => region_refusal(&error),
        })?;
        let peer_slot = usize::try_from(hello.slot_offset_bytes).map_err(|error| region_refusal(&error))?;
        let mut written = [0u8; CONTROL_CHALLENGE_BYTES];
        fabric.read(&peer, peer_slot, &mut written).map_err(|error| region_refusal(&error))?;
        if written != challenge.0 {
            return Err(Refusal::ChallengeNotWritten);
        }
        Ok((peer, peer_slot, server_proof))
    }

    /// The server's end of a connection of `medium` with the client's slot at `peer_slot` of
    /// `peer` (input from outside: checked by the channel's constructors), in a fresh region of
    /// `slot_bytes` (the slot at 0). Returns the channel and the region's descriptor.
    fn build(
        &self,
        medium: MediumKind,
        slot_bytes: usize,
        peer: F::RemoteRegion,
        peer_slot: usize,
        stream: &std::net::TcpStream,
    ) -> Result<(FabricChannel<F>, rampkv_fabric::RegionDescriptor), Refusal> {
        let fabric = self.doorbell.fabric.clone();
        let local = Endpoint::register(fabric, "conn", slot_bytes)
            .map_err(|error| Refusal::ServerRegion { message: error.to_string() })?;
        let served = Some(ServedRegion::claim(&local.descriptor));
        let refusal = |error: &dyn std::fmt::Display| Refusal::Region { message: error.to_string() };
        let control = stream.try_clone().map_err(|error| refusal(&error))?;
        let doorbells = Doorbells { remote: None, local: Some(Arc::clone(&self.doorbell.region)) };
        let link = Link { local: &local, local_slot: 0, peer, peer_slot, doorbells, control, served };
        let channel = match medium {
            MediumKind::Ring => Ring::server(link).map(FabricChannel::Ring),
            MediumKind::SendRecv => SendRecv::server(link).map(FabricChannel::SendRecv),
            MediumKind::RfRpc => RfRpc::server(link).map(FabricChannel::RfRpc),
        };
        Ok((channel.map_err(|error| refusal(&error))?, local.descriptor.clone()))
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
fn refuse(mut stream: std::net::TcpStream, refusal: Refusal) {
    let _ = write_json_line(&mut stream, &ControlReply::Refused { refusal });
    let _ = stream.shutdown(Shutdown::Both);
}

/// Reads what a non-blocking handshake stream has, into `line`, until one whole line (of at
/// most `WRITEPOLL_CONTROL_LINE_BYTES_MAX` bytes, its newline included) is there. Reads one
/// byte at a time past what a line may hold, never: a client sends one line and waits, so
/// nothing after the newline is expected (anything there is an error of the client's and is
/// refused as a bad line by the next step).
fn read_line_now(stream: &mut std::net::TcpStream, line: &mut Vec<u8>) -> LineRead {
    let mut chunk = [0u8; 512];
    loop {
        let room = (WRITEPOLL_CONTROL_LINE_BYTES_MAX - line.len()).min(chunk.len());
        if room == 0 {
            return LineRead::Failed;
        }
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return LineRead::Failed,
            Ok(count) => {
                line.extend_from_slice(&chunk[..count]);
                if let Some(end) = line.iter().position(|&byte| byte == b'\n') {
                    let rest = line.split_off(end + 1);
                    return LineRead::Line(std::mem::replace(line, rest));
                }
            }
            Err(error) if error.kind() == ErrorKind::WouldBlock => return LineRead::Pending,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return LineRead::Failed,
        }
    }
}

/// The fabric front end over the shared-memory fabric.
pub type FrontEnd = FabricFront<AnyFabric>;

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
    /// The doorbell and item regions in this process's list of served regions.
    _served: Vec<ServedRegion>,
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
        let mut served = Vec::new();
        for index in 0..servers.served().len() {
            let Some(slot_config) = config.item_slots else { break };
            let slots = ItemSlots::register(&fabric, &unique_region_name("items"), slot_config)
                .map_err(std::io::Error::other)?;
            served.push(ServedRegion::claim(&slots.info().region));
            let slots = Arc::new(slots);
            servers.attach_item_slots(index, Arc::clone(&slots) as Arc<dyn Publisher>)?;
            item_slots.push(slots);
        }
        let areas = areas::<F>(&config);
        let endpoint = Endpoint::register(fabric, "doorbell", HEADER_BYTES).map_err(std::io::Error::other)?;
        served.push(ServedRegion::claim(&endpoint.descriptor));
        let free = areas.map(|area| Mutex::new((area.first..area.first + area.slots).rev().collect()));
        let shared = Arc::new(Shared { stop: AtomicBool::new(false), control_pending: AtomicBool::new(false), free });
        let poll = Poll::new()?;
        let control_waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let mut listeners = Vec::new();
        let mut control_addresses = Vec::new();
        for index in 0..servers.served().len() {
            let mut listener = TcpListener::bind(listen)?;
            poll.registry().register(&mut listener, Token(index), Interest::READABLE)?;
            control_addresses.push(listener.local_addr()?);
            listeners.push(listener);
        }
        let (events, inbox) = channel();
        let region = Arc::clone(&endpoint.region);
        let doorbell = endpoint.doorbell().map_err(std::io::Error::other)?;
        let medium = FabricServer { region: Arc::clone(&region), doorbell, inbox, shared: Arc::clone(&shared), areas };
        let control = Control {
            poll,
            listeners,
            streams: (0..config.slots.iter().sum()).map(|_| None).collect(),
            doorbell: endpoint,
            secret: servers.secret().cloned(),
            items: (0..servers.served().len())
                .map(|index| item_slots.get(index).map(|slots| slots.info().clone()))
                .collect(),
            events,
            shared: Arc::clone(&shared),
            areas,
            wake_poller: DoorbellWake::<F>(region),
            handshakes: Vec::new(),
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
            _served: served,
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
