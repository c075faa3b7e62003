//! One RC queue pair between this process and a peer process (a *link*), how it comes up over
//! the peer's rendezvous, how its operations run, and the thread that relays the peer's wakes.
//!
//! # Handshake (JSON lines over TCP, each at most `VERBS_RENDEZVOUS_LINE_BYTES_MAX` bytes, each
//! read and write bounded by `VERBS_RENDEZVOUS_TIMEOUT_MS`)
//! 1. The connector sends [`Hello`]: the version, its queue pair's [`Endpoint`] and its own
//!    rendezvous address (so that the acceptor reuses this link when it maps the connector's
//!    regions in turn).
//! 2. The acceptor creates its queue pair, posts its receive buffers, brings it to RTS and
//!    answers [`Reply`] with its endpoint (or an error).
//! 3. The connector brings its queue pair to RTS and sends [`Ready`]; only then may the
//!    acceptor send on the link (before, the connector's queue pair could drop its packets).
//!
//! The TCP connection stays open for the life of the link: its end (the peer exited or was
//! killed: the kernel closes its sockets) fails the link at once, before any queue pair timer.
//!
//! # Operations
//! Every operation takes the link's lock, stages its work request against the link's
//! registered bounce buffer, posts it signalled and waits for its completion (bounded by
//! `VERBS_OP_TIMEOUT_MS`). A failed completion, a timeout or the end of the control connection
//! fails the link: this and every later operation return `FabricError::PeerFailed`, and the
//! link leaves the fabric's set, so the next `map` of the peer's regions connects afresh.
//!
//! # Wakes
//! A wake is a 16-byte SEND (region address, word offset) into one of the receive buffers the
//! peer keeps posted. Each link has one thread that sleeps in `poll(2)` on the queue pair's
//! completion channel and the control socket together (no spinning), and on each receive
//! completion relays the wake to the futex of the named local word (`registry`) and re-posts
//! the buffer. An operation that slept on the same channel and took the receive queue's event
//! drains the receive queue itself before it unlocks, so no wake waits for the next event.

use super::registry;
use crate::error::FabricError;
use crate::limits::{
    VERBS_BOUNCE_BYTES, VERBS_MIN_RNR_TIMER, VERBS_OP_TIMEOUT_MS, VERBS_RECEIVER_POLL_MS,
    VERBS_RENDEZVOUS_LINE_BYTES_MAX, VERBS_RENDEZVOUS_TIMEOUT_MS, VERBS_WAKE_BUFFERS, VERBS_WAKE_MESSAGE_BYTES,
};
use crate::verbs::{
    Completion, Endpoint, MemoryRegion, ProtectionDomain, QueuePair, QueuePairOptions, ReceiveBuffer, RegionAccess,
    RemoteRegion, VerbsError,
};
use crate::words::{LoadOrdering, StoreOrdering};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

/// Version of the rendezvous handshake.
const RENDEZVOUS_VERSION: u32 = 1;

/// The connector's first line.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub(crate) version: u32,
    pub(crate) endpoint: Endpoint,
    pub(crate) rendezvous: String,
}

/// The acceptor's answer: its endpoint, or why not.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Reply {
    pub(crate) version: u32,
    #[serde(default)]
    pub(crate) endpoint: Option<Endpoint>,
    #[serde(default)]
    pub(crate) error: Option<String>,
}

/// The connector's last line: its queue pair is ready to receive.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Ready {
    pub(crate) ready: bool,
}

/// The links of one fabric (every live one, connected or accepted): each is kept here until it
/// fails, so an accepted link (which only its peer uses) lives as long as its peer.
pub(crate) type LinkSet = Mutex<Vec<Arc<Link>>>;

/// A link to one peer process.
pub(crate) struct Link {
    /// The peer's rendezvous address (its name in errors).
    pub(crate) peer: String,
    state: Mutex<LinkState>,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    /// The completion channel's descriptor, valid as long as `state`'s queue pair (so as long
    /// as `self`).
    event_fd: RawFd,
    control: TcpStream,
    links: Weak<LinkSet>,
}

struct LinkState {
    qp: QueuePair,
    bounce: MemoryRegion,
    receives: MemoryRegion,
    /// The receive sequence of buffer 0's first posting: buffer `(s - base) % N` holds
    /// receive `s` (receives complete in order and are re-posted in order).
    receive_base: u64,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Link").field("peer", &self.peer).field("failed", &self.is_failed()).finish()
    }
}

fn options() -> QueuePairOptions {
    QueuePairOptions {
        receive_depth: VERBS_WAKE_BUFFERS,
        min_rnr_timer: VERBS_MIN_RNR_TIMER,
        completion_channel: true,
        ..QueuePairOptions::default()
    }
}

fn rendezvous_timeout() -> Duration {
    Duration::from_millis(VERBS_RENDEZVOUS_TIMEOUT_MS)
}

/// A queue pair with its wake buffers posted (INIT), and the link's registered buffers.
fn prepare(pd: &ProtectionDomain) -> Result<LinkState, VerbsError> {
    let mut qp = QueuePair::new(pd, &options())?;
    let bounce = MemoryRegion::register(pd, VERBS_BOUNCE_BYTES, RegionAccess::LOCAL_WRITE)?;
    let receives = MemoryRegion::register(
        pd,
        (VERBS_WAKE_BUFFERS * VERBS_WAKE_MESSAGE_BYTES) as usize,
        RegionAccess::LOCAL_WRITE,
    )?;
    let buffers: Vec<ReceiveBuffer> = (0..VERBS_WAKE_BUFFERS)
        .map(|index| ReceiveBuffer {
            offset_bytes: u64::from(index * VERBS_WAKE_MESSAGE_BYTES),
            len_bytes: VERBS_WAKE_MESSAGE_BYTES,
        })
        .collect();
    let range = qp.post_receives(&receives, &buffers)?;
    Ok(LinkState { qp, bounce, receives, receive_base: range.first })
}

/// Writes one JSON line.
fn write_line<T: Serialize>(stream: &mut TcpStream, value: &T) -> Result<(), String> {
    let mut line = serde_json::to_vec(value).map_err(|error| format!("encoding a handshake line: {error}"))?;
    line.push(b'\n');
    stream.write_all(&line).map_err(|error| format!("writing the handshake: {error}"))
}

/// Reads one JSON line of at most `VERBS_RENDEZVOUS_LINE_BYTES_MAX` bytes.
fn read_line<T: for<'de> Deserialize<'de>>(reader: &mut BufReader<TcpStream>) -> Result<T, String> {
    let mut line = Vec::new();
    let limit = VERBS_RENDEZVOUS_LINE_BYTES_MAX as u64 + 1;
    let read = reader
        .by_ref()
        .take(limit)
        .read_until(b'\n', &mut line)
        .map_err(|error| format!("reading the handshake: {error}"))?;
    if read == 0 {
        return Err("the peer closed the connection during the handshake".to_owned());
    }
    if line.last() != Some(&b'\n') {
        return Err(if line.len() as u64 >= limit {
            "a handshake line longer than VERBS_RENDEZVOUS_LINE_BYTES_MAX".to_owned()
        } else {
            "the peer closed the connection inside a handshake line".to_owned()
        });
    }
    serde_json::from_slice(&line).map_err(|error| format!("a malformed handshake line: {error}"))
}

/// Checks a rendezvous address that came from a peer.
pub(crate) fn parse_rendezvous(text: &str) -> Result<SocketAddr, String> {
    if text.len() > 64 {
        return Err("a rendezvous address longer than 64 bytes".to_owned());
    }
    let address: SocketAddr = text.parse().map_err(|_| format!("rendezvous {text:?} is not ip:port"))?;
    if address.port() == 0 || address.ip().is_unspecified() {
        return Err(format!("rendezvous {text:?} names no reachable address"));
    }
    Ok(address)
}

impl Link {
    fn new(peer: String, state: LinkState, control: TcpStream, links: &Arc<LinkSet>) -> Result<Arc<Link>, String> {
        let event_fd = state.qp.event_fd().map(|fd| fd.as_raw_fd()).ok_or("the queue pair has no channel")?;
        // The handshake's timeouts end here: the control socket is only watched from now on.
        control.set_read_timeout(None).map_err(|error| format!("control socket: {error}"))?;
        Ok(Arc::new(Link {
            peer,
            state: Mutex::new(state),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            event_fd,
            control,
            links: Arc::downgrade(links),
        }))
    }

    /// Connects to the rendezvous at `peer` (the connector's side of the handshake).
    pub(crate) fn connect(
        pd: &ProtectionDomain,
        peer: &str,
        own_rendezvous: &str,
        links: &Arc<LinkSet>,
    ) -> Result<Arc<Link>, FabricError> {
        let failed = |reason: String| FabricError::PeerFailed { peer: peer.to_owned(), reason };
        let address = parse_rendezvous(peer).map_err(failed)?;
        let mut state = prepare(pd).map_err(|error| failed(format!("creating a queue pair: {error}")))?;
        let mut stream = TcpStream::connect_timeout(&address, rendezvous_timeout())
            .map_err(|error| failed(format!("connecting to the rendezvous: {error}")))?;
        let timeouts = stream
            .set_read_timeout(Some(rendezvous_timeout()))
            .and_then(|()| stream.set_write_timeout(Some(rendezvous_timeout())))
            .and_then(|()| stream.set_nodelay(true));
        timeouts.map_err(|error| failed(format!("control socket: {error}")))?;
        let hello =
            Hello { version: RENDEZVOUS_VERSION, endpoint: state.qp.endpoint(), rendezvous: own_rendezvous.to_owned() };
        write_line(&mut stream, &hello).map_err(failed)?;
        let mut reader =
            BufReader::new(stream.try_clone().map_err(|error| failed(format!("control socket: {error}")))?);
        let reply: Reply = read_line(&mut reader).map_err(failed)?;
        if reply.version != RENDEZVOUS_VERSION {
            return Err(failed(format!(
                "handshake version {} (this build speaks {RENDEZVOUS_VERSION})",
                reply.version
            )));
        }
        if let Some(error) = reply.error {
            return Err(failed(format!("the peer refused: {}", truncated(&error))));
        }
        let endpoint = reply.endpoint.ok_or_else(|| failed("a reply without an endpoint".to_owned()))?;
        state.qp.connect(&endpoint).map_err(|error| failed(format!("connecting the queue pair: {error}")))?;
        write_line(&mut stream, &Ready { ready: true }).map_err(failed)?;
        let link = Link::new(peer.to_owned(), state, stream, links).map_err(failed)?;
        Link::start(&link)?;
        Ok(link)
    }

    /// Serves one connection accepted by the rendezvous listener (the acceptor's side), then
    /// becomes the link's wake thread. Returns when the link fails.
    pub(crate) fn accept(pd: &ProtectionDomain, stream: TcpStream, links: &Arc<LinkSet>, links_max: usize) {
        let from = stream.peer_addr().map_or_else(|_| "an unknown peer".to_owned(), |address| address.to_string());
        if let Err(reason) = Self::accept_inner(pd, stream, links, links_max) {
            // Nobody to return the error to: the connector sees the refusal or the closed
            // socket. Say it once on stderr, as the fabric's only diagnostic of a bad peer.
            eprintln!("rampkv-fabric: refused an RDMA rendezvous from {from}: {reason}");
        }
    }

    fn accept_inner(
        pd: &ProtectionDomain,
        mut stream: TcpStream,
        links: &Arc<LinkSet>,
        links_max: usize,
    ) -> Result<(), String> {
        stream
            .set_read_timeout(Some(rendezvous_timeout()))
            .and_then(|()| stream.set_write_timeout(Some(rendezvous_timeout())))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|error| format!("control socket: {error}"))?;
        let mut reader = BufReader::new(stream.try_clone().map_err(|error| format!("control socket: {error}"))?);
        let hello: Hello = read_line(&mut reader)?;
        let refuse = |stream: &mut TcpStream, reason: String| {
            let _ =
                write_line(stream, &Reply { version: RENDEZVOUS_VERSION, endpoint: None, error: Some(reason.clone()) });
            Err(reason)
        };
        if hello.version != RENDEZVOUS_VERSION {
            return refuse(
                &mut stream,
                format!("handshake version {} (this side speaks {RENDEZVOUS_VERSION})", hello.version),
            );
        }
        if let Err(reason) = parse_rendezvous(&hello.rendezvous) {
            return refuse(&mut stream, reason);
        }
        if links.lock().unwrap_or_else(PoisonError::into_inner).len() >= links_max {
            return refuse(&mut stream, "too many RDMA links (VERBS_LINKS_MAX)".to_owned());
        }
        let mut state = match prepare(pd) {
            Ok(state) => state,
            Err(error) => return refuse(&mut stream, format!("creating a queue pair: {error}")),
        };
        if let Err(error) = state.qp.connect(&hello.endpoint) {
            return refuse(&mut stream, format!("connecting the queue pair: {error}"));
        }
        let reply = Reply { version: RENDEZVOUS_VERSION, endpoint: Some(state.qp.endpoint()), error: None };
        write_line(&mut stream, &reply)?;
        let ready: Ready = read_line(&mut reader)?;
        if !ready.ready || !reader.buffer().is_empty() {
            return Err("the peer broke the handshake after the reply".to_owned());
        }
        let link = Link::new(hello.rendezvous, state, stream, links)?;
        links.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::clone(&link));
        link.relay_wakes();
        Ok(())
    }

    /// Starts the wake thread of a connected link.
    fn start(link: &Arc<Link>) -> Result<(), FabricError> {
        let thread_link = Arc::clone(link);
        std::thread::Builder::new()
            .name("rampkv-verbs-wakes".to_owned())
            .spawn(move || thread_link.relay_wakes())
            .map(drop)
            .map_err(|error| FabricError::PeerFailed {
                peer: link.peer.clone(),
                reason: format!("starting the wake thread: {error}"),
            })
    }

    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The error every operation returns once the link failed.
    fn failed_error(&self) -> FabricError {
        let reason = self.failure.lock().unwrap_or_else(PoisonError::into_inner).clone();
        FabricError::PeerFailed {
            peer: self.peer.clone(),
            reason: reason.unwrap_or_else(|| "the link failed".to_owned()),
        }
    }

    /// Fails the link (first reason wins): removes it from its fabric's set, then marks it
    /// failed and closes its control connection (the peer's link fails too).
    pub(crate) fn fail(self: &Arc<Self>, reason: String) {
        {
            let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
            failure.get_or_insert(reason);
        }
        // Out of the set before the failure shows: whoever sees the link failed (an operation
        // that returns `PeerFailed`) finds it gone, and a new map makes a new link.
        if let Some(links) = self.links.upgrade() {
            links.lock().unwrap_or_else(PoisonError::into_inner).retain(|link| !Arc::ptr_eq(link, self));
        }
        self.failed.store(true, Ordering::Release);
        let _ = self.control.shutdown(Shutdown::Both);
    }

    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one operation under the link's lock; any verbs error fails the link.
    fn run<T>(
        self: &Arc<Self>,
        operation: impl FnOnce(&mut LinkState) -> Result<T, VerbsError>,
    ) -> Result<T, FabricError> {
        if self.is_failed() {
            return Err(self.failed_error());
        }
        let mut state = self.lock();
        let wakeups = state.qp.event_wakeups();
        let result = operation(&mut state);
        // The wait may have slept on the channel and taken the receive queue's event: drain
        // the receive queue here, and re-arm it for the wake thread.
        let drained = if state.qp.event_wakeups() != wakeups { state.drain_receives() } else { Ok(()) };
        match result.and_then(|value| drained.map(|()| value)) {
            Ok(value) => Ok(value),
            Err(error) => {
                // Still under the lock: the wake thread, which would meet the same queue pair
                // failure as a flushed receive, cannot record a less telling reason first.
                self.fail(error.to_string());
                drop(state);
                Err(self.failed_error())
            }
        }
    }

    /// RDMA READ of `dst.len()` bytes at `offset_bytes` of `remote`, in bounce-buffer chunks.
    pub(crate) fn read(
        self: &Arc<Self>,
        remote: &RemoteRegion,
        offset_bytes: u64,
        dst: &mut [u8],
    ) -> Result<(), FabricError> {
        self.run(|state| {
            let mut done = 0usize;
            for chunk in dst.chunks_mut(VERBS_BOUNCE_BYTES) {
                let len = chunk.len().div_ceil(8) * 8;
                state.post_and_wait(|qp, bounce| {
                    let mut batch = qp.batch()?;
                    batch.read(bounce, 0, remote, offset_bytes + done as u64, len as u32)?;
                    batch.post()
                })?;
                state.bounce.read(0, chunk)?;
                done += chunk.len();
            }
            Ok(())
        })
    }

    /// RDMA READs of several ranges of `remote` (checked by the caller; together within the
    /// bounce buffer and one batch), staged at consecutive word-aligned sub-ranges of the
    /// bounce buffer and posted with one doorbell; one wait for the last completion (an RC
    /// queue pair completes its sends in order, and a failed one fails the wait), then each
    /// copied out. Empty ranges are skipped.
    pub(crate) fn read_many(
        self: &Arc<Self>,
        remote: &RemoteRegion,
        reads: &mut [(usize, &mut [u8])],
    ) -> Result<(), FabricError> {
        self.run(|state| {
            state.post_and_wait(|qp, bounce| {
                let mut batch = qp.batch()?;
                let mut at = 0u64;
                for (offset_bytes, dst) in reads.iter().filter(|(_, dst)| !dst.is_empty()) {
                    let len = dst.len().div_ceil(8) * 8;
                    batch.read(bounce, at, remote, *offset_bytes as u64, len as u32)?;
                    at += len as u64;
                }
                batch.post()
            })?;
            let mut at = 0u64;
            for (_, dst) in reads.iter_mut().filter(|(_, dst)| !dst.is_empty()) {
                state.bounce.read(at, dst)?;
                at += (dst.len().div_ceil(8) * 8) as u64;
            }
            Ok(())
        })
    }

    /// RDMA WRITE of `src` (zero-padded to whole words) at `offset_bytes` of `remote`.
    pub(crate) fn write(
        self: &Arc<Self>,
        remote: &RemoteRegion,
        offset_bytes: u64,
        src: &[u8],
    ) -> Result<(), FabricError> {
        self.run(|state| {
            let mut done = 0usize;
            for chunk in src.chunks(VERBS_BOUNCE_BYTES) {
                let len = chunk.len().div_ceil(8) * 8;
                state.bounce.write(0, chunk)?;
                state.post_and_wait(|qp, bounce| {
                    let mut batch = qp.batch()?;
                    batch.write(bounce, 0, remote, offset_bytes + done as u64, len as u32, None)?;
                    batch.post()
                })?;
                done += chunk.len();
            }
            Ok(())
        })
    }

    /// 8-byte compare-and-swap; returns the previous value.
    pub(crate) fn compare_and_swap(
        self: &Arc<Self>,
        remote: &RemoteRegion,
        offset_bytes: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        self.run(|state| {
            state.post_and_wait(|qp, bounce| {
                let mut batch = qp.batch()?;
                batch.compare_and_swap(bounce, 0, remote, offset_bytes, expected, new)?;
                batch.post()
            })?;
            state.bounce.load_word(0, LoadOrdering::Acquire)
        })
    }

    /// 8-byte fetch-and-add; returns the previous value.
    pub(crate) fn fetch_add(
        self: &Arc<Self>,
        remote: &RemoteRegion,
        offset_bytes: u64,
        add: u64,
    ) -> Result<u64, FabricError> {
        self.run(|state| {
            state.post_and_wait(|qp, bounce| {
                let mut batch = qp.batch()?;
                batch.fetch_and_add(bounce, 0, remote, offset_bytes, add)?;
                batch.post()
            })?;
            state.bounce.load_word(0, LoadOrdering::Acquire)
        })
    }

    /// RDMA READ of one word.
    pub(crate) fn read_word(self: &Arc<Self>, remote: &RemoteRegion, offset_bytes: u64) -> Result<u64, FabricError> {
        self.run(|state| {
            state.post_and_wait(|qp, bounce| {
                let mut batch = qp.batch()?;
                batch.read(bounce, 0, remote, offset_bytes, 8)?;
                batch.post()
            })?;
            state.bounce.load_word(0, LoadOrdering::Acquire)
        })
    }

    /// RDMA WRITE of one word.
    pub(crate) fn write_word(
        self: &Arc<Self>,
        remote: &RemoteRegion,
        offset_bytes: u64,
        value: u64,
    ) -> Result<(), FabricError> {
        self.run(|state| {
            state.bounce.store_word(0, value, StoreOrdering::Release)?;
            state.post_and_wait(|qp, bounce| {
                let mut batch = qp.batch()?;
                batch.write(bounce, 0, remote, offset_bytes, 8, None)?;
                batch.post()
            })
        })
    }

    /// SENDs a wake of the word at `offset_bytes` of the peer's region at `address`.
    pub(crate) fn wake(self: &Arc<Self>, address: u64, offset_bytes: u64) -> Result<(), FabricError> {
        self.run(|state| {
            state.bounce.store_word(0, address, StoreOrdering::Relaxed)?;
            state.bounce.store_word(8, offset_bytes, StoreOrdering::Relaxed)?;
            state.post_and_wait(|qp, bounce| {
                let mut batch = qp.batch()?;
                batch.send(bounce, 0, VERBS_WAKE_MESSAGE_BYTES, None)?;
                batch.post()
            })
        })
    }

    /// The wake thread: sleeps on the completion channel and the control socket; relays each
    /// received wake; ends when the link fails (the peer closed its control connection, the
    /// queue pair failed) or its fabric is gone.
    fn relay_wakes(self: Arc<Self>) {
        loop {
            if self.is_failed() {
                return;
            }
            if self.links.strong_count() == 0 {
                self.fail("the fabric was dropped".to_owned());
                return;
            }
            if let Err(error) = self.lock().drain_receives() {
                self.fail(error.to_string());
                return;
            }
            let mut descriptors = [
                libc::pollfd { fd: self.event_fd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.control.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfd entries; both descriptors are owned by `self` (the queue
            // pair's channel and the control socket), which this thread keeps alive.
            let ready = unsafe { libc::poll(descriptors.as_mut_ptr(), 2, VERBS_RECEIVER_POLL_MS) };
            if ready < 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    self.fail(format!("poll: {error}"));
                    return;
                }
                continue;
            }
            if descriptors[1].revents != 0 {
                let mut byte = [0u8; 1];
                let reason = match (&self.control).read(&mut byte) {
                    Ok(0) => "the peer closed its control connection (exited or killed)".to_owned(),
                    Ok(_) => "the peer sent data on its control connection after the handshake".to_owned(),
                    Err(error) => format!("control connection: {error}"),
                };
                self.fail(reason);
                return;
            }
            if descriptors[0].revents != 0 {
                if let Err(error) = self.lock().qp.take_events() {
                    self.fail(error.to_string());
                    return;
                }
            }
        }
    }
}

fn truncated(text: &str) -> String {
    text.chars().take(200).collect()
}

impl LinkState {
    /// Posts what `stage` stages (one signalled batch) and waits for its completion.
    fn post_and_wait(
        &mut self,
        stage: impl FnOnce(&mut QueuePair, &MemoryRegion) -> Result<crate::verbs::WorkRange, VerbsError>,
    ) -> Result<(), VerbsError> {
        let range = stage(&mut self.qp, &self.bounce)?;
        let last = range.last().ok_or(VerbsError::InvalidArgument { reason: "an empty batch" })?;
        self.qp.wait_send_through(last, Duration::from_millis(VERBS_OP_TIMEOUT_MS))
    }

    /// Arms the receive queue, then relays and re-posts every received wake (arming first: a
    /// wake that lands after the poll raises an event).
    fn drain_receives(&mut self) -> Result<(), VerbsError> {
        self.qp.arm_receive()?;
        let mut completions = [Completion::default(); 32];
        loop {
            let found = self.qp.poll_receive(&mut completions)?;
            if found.is_empty() {
                return Ok(());
            }
            for completion in found {
                let index =
                    (completion.sequence().wrapping_sub(self.receive_base) % u64::from(VERBS_WAKE_BUFFERS)) as u32;
                let offset = u64::from(index * VERBS_WAKE_MESSAGE_BYTES);
                if completion.byte_len() == VERBS_WAKE_MESSAGE_BYTES {
                    let address = self.receives.load_word(offset, LoadOrdering::Acquire)?;
                    let word_offset = self.receives.load_word(offset + 8, LoadOrdering::Relaxed)?;
                    registry::relay_wake(address, word_offset);
                } else {
                    registry::ignore_wake();
                }
                let buffer = ReceiveBuffer { offset_bytes: offset, len_bytes: VERBS_WAKE_MESSAGE_BYTES };
                self.qp.post_receives(&self.receives, &[buffer])?;
            }
        }
    }
}
