//! A link's life on the primary, one per backup ([`Replicator::start`],
//! [`Replicator::add_catch_up`]): connect (retrying while the backup is not there yet),
//! authenticate, say hello (`wire`); a catching-up backup's snapshot or delta first (`rejoin`,
//! `delta`); then write what is queued while a reader thread takes the acknowledgements. Over
//! TCP the link's thread writes its queue to the socket; one-sided it writes what waited into
//! the log region and then lets `append` write directly (`primary`).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use rampkv_config::configuration::BOOTSTRAP_INCARNATION;
use rampkv_core::limits::{
    REPLICATION_CONNECT_BACKOFF_MS, REPLICATION_CONNECT_WAIT_MS_MAX, REPLICATION_FULL_WAIT_MS_MAX,
    REPLICATION_IO_TIMEOUT_MS, REPLICATION_LOG_FULL_BACKOFF_US, REPLICATION_LOG_HANDSHAKE_TIMEOUT_MS,
    REPLICATION_SNAPSHOT_WAIT_MS_MAX,
};
use rampkv_core::protocol::server::ServerCore;

use super::delta::{new_stream_id, queue_delta};
use super::log_region::{LogFabric, LogSender, Negotiated};
use super::primary::{
    io_error, landed, log_error, Backlog, CatchUp, LagHistogram, Link, LinkQueue, ReplicationStats, Replicator, Shared,
    MARKER_ACKNOWLEDGED, MARKER_DUE, MARKER_NOT_DUE, MARKER_SENT,
};
use super::rejoin::send_snapshot;
use super::wire::{
    decode_ack, decode_answer, encode_hello, encode_marker, Hello, ACK_BYTES, ANSWER_BYTES, HELLO_CATCH_UP,
    HELLO_LOG_REGION, MARKER_DELTA, MARKER_IN_SYNC,
};
use super::{ReplicationError, ReplicationMedium};
use crate::auth::{authenticate_client, SharedSecret};
use crate::message::fabric::FabricHandle;

/// How a primary's stream starts ([`Replicator::start_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStart {
    /// The first record's sequence number (a server with a data directory numbers its records
    /// as its log does: the log's next LSN).
    pub first: u64,
    /// Bytes of the last records kept for catching-up backups' deltas (0: none).
    pub backlog_bytes: usize,
    /// The store is not empty (recovered from its files): every backup gets a snapshot first,
    /// and its link holds the primary's replies from the start.
    pub snapshot_first: bool,
    /// The primary keeps a log and its backups keep their copies on disk: a reply must not go
    /// out before every backup's copy *on disk* holds it, so that a whole cluster killed at
    /// once loses no acknowledged write whichever copy the configuration promotes after the
    /// restart. Over TCP a backup acknowledges only then anyway; one-sided a record is then
    /// held once the backup acknowledged it (applied, its copy's log durable as the fsync
    /// policy says), not once it landed in the log region (docs/replication.md, "Backups and
    /// a whole-cluster kill").
    pub held_once_applied: bool,
}

impl Default for StreamStart {
    fn default() -> Self {
        StreamStart { first: 1, backlog_bytes: 0, snapshot_first: false, held_once_applied: false }
    }
}

impl Replicator {
    /// Starts the links of primary `primary` (epoch `epoch`) to `backups` (server index and
    /// replication address each) over `medium`: each connects (retrying up to
    /// `REPLICATION_CONNECT_WAIT_MS_MAX`), authenticates with `secret` if any, and says hello.
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn start(
        primary: u16,
        epoch: u64,
        backups: Vec<(usize, String)>,
        secret: Option<Arc<SharedSecret>>,
        medium: ReplicationMedium,
    ) -> std::io::Result<Replicator> {
        let backups = backups.into_iter().map(|(backup, address)| (backup, address, BOOTSTRAP_INCARNATION)).collect();
        Self::start_with(primary, epoch, backups, secret, medium, StreamStart::default(), None)
    }

    /// [`Replicator::start`] with its stream's start (`start`), each backup's process
    /// incarnation (the configuration's: `BOOTSTRAP_INCARNATION` in the cluster's first one)
    /// and the store catching-up backups' snapshots are taken of (`source`; needed from the
    /// start with `start.snapshot_first`, else it may be set later).
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn start_with(
        primary: u16,
        epoch: u64,
        backups: Vec<(usize, String, u64)>,
        secret: Option<Arc<SharedSecret>>,
        medium: ReplicationMedium,
        start: StreamStart,
        source: Option<Arc<ServerCore>>,
    ) -> std::io::Result<Replicator> {
        let backlog =
            Backlog { stream: new_stream_id(), batches: VecDeque::new(), bytes: 0, max_bytes: start.backlog_bytes };
        let shared = Arc::new(Shared {
            primary,
            medium,
            held_once_applied: start.held_once_applied && medium == ReplicationMedium::OneSided,
            epoch: AtomicU64::new(epoch),
            secret,
            links: RwLock::new(Vec::new()),
            sequencer: Mutex::new((start.first.max(1), Vec::new())),
            source: OnceLock::new(),
            backlog: Mutex::new(backlog),
            membership: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stats: Mutex::new(ReplicationStats::default()),
            wake: OnceLock::new(),
            threads: Mutex::new(Vec::new()),
        });
        let replicator = Replicator { shared };
        if let Some(source) = source {
            replicator.set_source(source);
        }
        for (backup, address, incarnation) in backups {
            // The configuration counts these backups in sync from the start (a recovered
            // store's links hold replies from the start, after a snapshot).
            let catch_up = start.snapshot_first.then(|| CatchUp::new(0, epoch, true));
            replicator.add_link(backup, address, incarnation, catch_up)?;
        }
        Ok(replicator)
    }

    /// Opens a link to catching-up `backup` (process `incarnation`, replication port
    /// `address`): a snapshot of the store, then every record from now on (`rejoin`
    /// module docs). An earlier link to that backup stays until this one is in sync.
    ///
    /// # Errors
    /// The store to take snapshots of was not set, or a thread could not be started.
    pub fn add_catch_up(&self, backup: usize, address: String, incarnation: u64) -> std::io::Result<()> {
        if self.shared.source.get().is_none() {
            return Err(std::io::Error::other("replication: no store to take a catching-up backup's snapshot of"));
        }
        let catch_up = CatchUp::new(0, self.shared.epoch.load(Ordering::Acquire), false);
        self.add_link(backup, address, incarnation, Some(catch_up))
    }

    fn add_link(
        &self,
        backup: usize,
        address: String,
        incarnation: u64,
        catch_up: Option<CatchUp>,
    ) -> std::io::Result<()> {
        let counted = catch_up.as_ref().is_none_or(|catch_up| catch_up.counted_from_start);
        let link = {
            // The link joins at the next sequence number: it gets every record from there on.
            let sequencer = self.shared.sequencer.lock();
            let point = sequencer.0;
            let link = Arc::new(Link {
                backup,
                address,
                queue: Mutex::new(LinkQueue::default()),
                changed: Condvar::new(),
                acked: AtomicU64::new(point - 1),
                failure: OnceLock::new(),
                stream: Mutex::new(None),
                removed: AtomicBool::new(false),
                incarnation,
                counted: AtomicBool::new(counted),
                catch_up: catch_up.map(|catch_up| catch_up.at(point)),
                applied: AtomicU64::new(point - 1),
                landed: Mutex::new(VecDeque::new()),
                written: AtomicU64::new(point - 1),
                held_once_applied: self.shared.held_once_applied,
                one_sided: AtomicBool::new(self.shared.medium == ReplicationMedium::OneSided),
            });
            let mut links = self.shared.links.write();
            // Links that hold nothing any more are dropped (a failed, counted one stays: its
            // backup's absence holds writes until the configuration removes it).
            links.retain(|link| {
                !link.removed.load(Ordering::Acquire) && (!link.failed() || link.counted.load(Ordering::Acquire))
            });
            links.push(Arc::clone(&link));
            drop(sequencer);
            link
        };
        let shared = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new().name("rampkv-replicate".into()).spawn({
            let link = Arc::clone(&link);
            move || run_link(&shared, &link)
        });
        match thread {
            Ok(thread) => {
                let mut threads = self.shared.threads.lock();
                threads.retain(|thread| !thread.is_finished());
                threads.push(thread);
                Ok(())
            }
            Err(error) => {
                link.fail(ReplicationError::Stopped, &self.shared);
                Err(error)
            }
        }
    }
}

/// A link's life: connect, hello, (a catching-up backup's snapshot,) then write what is queued
/// while a reader thread takes the acknowledgements.
fn run_link(shared: &Arc<Shared>, link: &Arc<Link>) {
    let (mut stream, applied, lineage, log) = match connect(shared, link) {
        Ok(connected) => connected,
        Err(error) => return link.fail(error, shared),
    };
    if link.catch_up.is_none() {
        link.acked.store(applied, Ordering::Release);
        link.applied.store(applied, Ordering::Release);
        link.written.fetch_max(applied, Ordering::AcqRel);
    }
    let one_sided = log.is_some();
    link.queue.lock().log = log;
    let reader = match stream.try_clone() {
        Ok(reader) => reader,
        Err(error) => return link.fail(io_error(link, error), shared),
    };
    *link.stream.lock() = stream.try_clone().ok();
    if link.removed.load(Ordering::Acquire) || link.failed() {
        // Removed while it connected: it sends nothing (as in `connect`).
        let _ = stream.shutdown(Shutdown::Both);
        return link.fail(ReplicationError::Removed { backup: link.backup }, shared);
    }
    if shared.stop.load(Ordering::Acquire) {
        return link.fail(ReplicationError::Stopped, shared);
    }
    let reader = {
        let (shared, link) = (Arc::clone(shared), Arc::clone(link));
        std::thread::Builder::new()
            .name("rampkv-replicate-acks".into())
            .spawn(move || read_acks(&shared, &link, reader))
    };
    let reader = match reader {
        Ok(reader) => reader,
        Err(error) => return link.fail(io_error(link, error), shared),
    };
    if let Some(catch_up) = &link.catch_up {
        let deadline = Instant::now() + Duration::from_millis(REPLICATION_SNAPSHOT_WAIT_MS_MAX);
        let sent = match (queue_delta(shared, link, catch_up, applied, lineage), one_sided) {
            (Some(first), one_sided) => {
                let marker = encode_marker(MARKER_DELTA, first, shared.epoch.load(Ordering::Acquire));
                match one_sided {
                    true => LogWriter { link, deadline }.write_all(&marker),
                    false => stream.write_all(&marker),
                }
            }
            (None, true) => send_snapshot(shared, catch_up, &mut LogWriter { link, deadline }),
            (None, false) => send_snapshot(shared, catch_up, &mut stream),
        };
        if let Err(error) = sent {
            link.fail(io_error(link, error), shared);
        }
    }
    if one_sided {
        write_log(shared, link);
        let _ = stream.shutdown(Shutdown::Both);
        let _ = reader.join();
        return shared.wake();
    }
    let mut pending: Vec<Arc<[u8]>> = Vec::new();
    let marker_due = |link: &Link| {
        link.catch_up.as_ref().is_some_and(|catch_up| catch_up.marker.load(Ordering::Acquire) == MARKER_DUE)
    };
    while !link.failed() {
        let mut marker = None;
        {
            let mut queue = link.queue.lock();
            while queue.written == queue.batches.len() && !link.failed() && !marker_due(link) {
                link.changed.wait(&mut queue);
            }
            let written = queue.written;
            pending.extend(queue.batches.iter().skip(written).map(|batch| Arc::clone(&batch.bytes)));
            queue.written = queue.batches.len();
            if let Some(catch_up) = &link.catch_up {
                if catch_up
                    .marker
                    .compare_exchange(MARKER_DUE, MARKER_SENT, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let epoch = shared.epoch.load(Ordering::Acquire);
                    marker = Some(encode_marker(MARKER_IN_SYNC, catch_up.sync_point.load(Ordering::Acquire), epoch));
                }
            }
        }
        for bytes in pending.drain(..) {
            if let Err(error) = stream.write_all(&bytes) {
                link.fail(io_error(link, error), shared);
                break;
            }
        }
        if let Some(marker) = marker {
            if let Err(error) = stream.write_all(&marker) {
                link.fail(io_error(link, error), shared);
            }
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
    let _ = reader.join();
    shared.wake();
}

/// One-sided: writes what waited into the log region (records queued before the link was up,
/// behind a catching-up backup's snapshot, or behind a full region on a link that holds no
/// reply), then lets `append` write directly; sends the in-sync marker when it is due.
fn write_log(shared: &Shared, link: &Link) {
    let mut stalled_since: Option<Instant> = None;
    let marker_due = |link: &Link| {
        link.catch_up.as_ref().is_some_and(|catch_up| catch_up.marker.load(Ordering::Acquire) == MARKER_DUE)
    };
    while !link.failed() {
        let mut guard = link.queue.lock();
        while guard.batches.is_empty() && !link.failed() && !marker_due(link) {
            guard.direct = true;
            link.changed.wait(&mut guard);
        }
        if link.failed() {
            break;
        }
        let queue = &mut *guard;
        let Some(log) = queue.log.as_mut() else { break };
        if let Some(batch) = queue.batches.front().cloned() {
            let mut back_off = false;
            let mut written = queue.front_written;
            link.written.fetch_max(batch.last, Ordering::AcqRel);
            match log.append(&batch.bytes, &mut written, None) {
                Ok(true) => {
                    queue.batches.pop_front();
                    queue.bytes -= batch.bytes.len();
                    queue.front_written = 0;
                    stalled_since = None;
                    landed(shared, link, &batch);
                    link.changed.notify_all();
                    shared.wake();
                }
                Ok(false) => {
                    if written > queue.front_written {
                        stalled_since = None;
                    }
                    queue.front_written = written;
                    let since = *stalled_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_millis(REPLICATION_FULL_WAIT_MS_MAX) {
                        let (backup, address) = (link.backup, link.address.clone());
                        let (bytes, waited_ms) = (queue.bytes, REPLICATION_FULL_WAIT_MS_MAX);
                        link.fail(ReplicationError::TooFarBehind { backup, address, bytes, waited_ms }, shared);
                        break;
                    }
                    back_off = true;
                }
                Err(error) => link.fail(log_error(link, error), shared),
            }
            drop(guard);
            if back_off {
                std::thread::sleep(Duration::from_micros(REPLICATION_LOG_FULL_BACKOFF_US));
            }
            continue;
        }
        // The in-sync marker, with the queue empty: every record up to its point is written.
        let Some(catch_up) = &link.catch_up else { continue };
        if catch_up.marker.compare_exchange(MARKER_DUE, MARKER_SENT, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let epoch = shared.epoch.load(Ordering::Acquire);
            let marker = encode_marker(MARKER_IN_SYNC, catch_up.sync_point.load(Ordering::Acquire), epoch);
            let deadline = Instant::now() + Duration::from_millis(REPLICATION_FULL_WAIT_MS_MAX);
            match log.append(&marker, &mut 0, Some(deadline)) {
                Ok(true) => {}
                Ok(false) => {
                    let (backup, address) = (link.backup, link.address.clone());
                    let waited_ms = REPLICATION_FULL_WAIT_MS_MAX;
                    link.fail(ReplicationError::TooFarBehind { backup, address, bytes: 0, waited_ms }, shared);
                }
                Err(error) => link.fail(log_error(link, error), shared),
            }
        }
    }
}

/// One-sided: writes a catching-up backup's snapshot into the log region, a message at a
/// time, waiting (without the queue's lock: writes queue meanwhile) while the region is full.
struct LogWriter<'a> {
    link: &'a Link,
    deadline: Instant,
}

impl Write for LogWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        loop {
            {
                let mut queue = self.link.queue.lock();
                if self.link.failed() {
                    return Err(std::io::Error::new(ErrorKind::BrokenPipe, "the link failed"));
                }
                let Some(log) = queue.log.as_mut() else {
                    return Err(std::io::Error::new(ErrorKind::NotConnected, "no log region"));
                };
                let taken = log.write_message(bytes, None).map_err(std::io::Error::other)?;
                if taken > 0 || bytes.is_empty() {
                    return Ok(taken);
                }
            }
            if Instant::now() > self.deadline {
                return Err(std::io::Error::new(ErrorKind::TimedOut, "the log region stayed full"));
            }
            std::thread::sleep(Duration::from_micros(REPLICATION_LOG_FULL_BACKOFF_US));
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Connects to the backup (retrying while it is not there yet), authenticates, says hello;
/// returns the stream, the last record the backup applied (a catching-up backup: the last one
/// it holds of this stream, 0 for none), the stream's identity the hello named and, one-sided,
/// the backup's log region.
fn connect(shared: &Shared, link: &Link) -> Result<(TcpStream, u64, u64, Option<LogSender>), ReplicationError> {
    let deadline = Instant::now() + Duration::from_millis(REPLICATION_CONNECT_WAIT_MS_MAX);
    let address: SocketAddr = link
        .address
        .parse()
        .map_err(|_| io_error(link, std::io::Error::new(ErrorKind::InvalidInput, "not a socket address")))?;
    let timeout = Duration::from_millis(REPLICATION_IO_TIMEOUT_MS);
    let mut stream = loop {
        if shared.stop.load(Ordering::Acquire) {
            return Err(ReplicationError::Stopped);
        }
        // A link removed (or failed) while it waits for its backup to come back must not
        // connect later: a second catching-up stream of this primary at the backup would
        // replace the live one's copy (the replica set then never became whole again).
        if link.removed.load(Ordering::Acquire) || link.failed() {
            return Err(ReplicationError::Removed { backup: link.backup });
        }
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(stream) => break stream,
            Err(error) if Instant::now() >= deadline => return Err(io_error(link, error)),
            Err(_) => std::thread::sleep(Duration::from_millis(REPLICATION_CONNECT_BACKOFF_MS)),
        }
    };
    let _ = stream.set_nodelay(true);
    if let Some(secret) = &shared.secret {
        authenticate_client(&mut stream, secret).map_err(|error| ReplicationError::Auth {
            backup: link.backup,
            address: link.address.clone(),
            error,
        })?;
    }
    stream.set_read_timeout(Some(Duration::from_secs(1))).map_err(|error| io_error(link, error))?;
    let (first, mut flags) = match &link.catch_up {
        Some(catch_up) => (catch_up.point, HELLO_CATCH_UP),
        None => (link.queue.lock().batches.front().map_or(1, |batch| batch.first), 0),
    };
    if shared.medium == ReplicationMedium::OneSided {
        flags |= HELLO_LOG_REGION;
    }
    let epoch = shared.epoch.load(Ordering::Acquire);
    let lineage = shared.backlog.lock().stream;
    let hello = encode_hello(&Hello {
        primary: shared.primary,
        epoch,
        first,
        stream: lineage,
        catch_up: flags & HELLO_CATCH_UP != 0,
        log_region: flags & HELLO_LOG_REGION != 0,
    });
    stream.write_all(&hello).map_err(|error| io_error(link, error))?;
    let mut answer = [0u8; ANSWER_BYTES];
    stream.read_exact(&mut answer).map_err(|error| io_error(link, error))?;
    let (backup, address) = (link.backup, link.address.clone());
    match decode_answer(&answer) {
        Some((0, applied)) => {
            let log = if flags & HELLO_LOG_REGION != 0 { negotiate_log(link, &mut stream)? } else { None };
            stream.set_read_timeout(None).map_err(|error| io_error(link, error))?;
            Ok((stream, applied, lineage, log))
        }
        Some((1, known)) => Err(ReplicationError::StaleEpoch { backup, address, epoch, known }),
        Some((2, applied)) => Err(ReplicationError::NeedsCatchUp { backup, address, applied, first }),
        Some((3, _)) => Err(ReplicationError::HelloRefused { backup, address }),
        Some((4, _)) => Err(ReplicationError::Busy { backup, address }),
        _ => Err(ReplicationError::Malformed { backup, address, what: "hello answer" }),
    }
}

/// One-sided: the log region handshake (`log_region`). A backup whose region cannot be mapped
/// (or that cannot map the primary's) gets this stream over TCP, said in a log line; so does
/// the medium of a backup written over RDMA (a region on this host, written through shared
/// memory, is the quiet default).
fn negotiate_log(link: &Link, stream: &mut TcpStream) -> Result<Option<LogSender>, ReplicationError> {
    let handshake = Duration::from_millis(REPLICATION_LOG_HANDSHAKE_TIMEOUT_MS);
    stream.set_read_timeout(Some(handshake)).map_err(|error| io_error(link, error))?;
    let fabric = <LogFabric as FabricHandle>::open().map_err(|error| log_error(link, error.into()))?;
    let (backup, address) = (link.backup, &link.address);
    match LogSender::negotiate(fabric, stream).map_err(|error| log_error(link, error))? {
        Negotiated::OneSided(log) => {
            if log.medium() != "shm" {
                let how = if log.medium() == "verbs" { "RDMA WRITE into its log region" } else { "its log region" };
                log::warn!(
                    "replication: records to backup {backup} ({address}) go one-sided over {} ({how})",
                    log.medium()
                );
            }
            Ok(Some(log))
        }
        Negotiated::Tcp { reason } => {
            log::warn!(
                "replication: records to backup {backup} ({address}) go over TCP (the replication medium falls back \
                 for this backup: {reason})"
            );
            link.one_sided.store(false, Ordering::Release);
            Ok(None)
        }
    }
}

/// Takes the backup's acknowledgements: drops what they cover, measures, wakes the front ends;
/// moves a catching-up backup's link on (counted after its snapshot, in sync after its marker).
fn read_acks(shared: &Shared, link: &Link, mut stream: TcpStream) {
    let mut ack = [0u8; ACK_BYTES];
    loop {
        if let Err(error) = stream.read_exact(&mut ack) {
            return link.fail(io_error(link, error), shared);
        }
        let malformed = |what| ReplicationError::Malformed { backup: link.backup, address: link.address.clone(), what };
        let Some((applied, in_sync)) = decode_ack(&ack) else {
            return link.fail(malformed("acknowledgement"), shared);
        };
        if in_sync {
            let Some(catch_up) = &link.catch_up else {
                return link.fail(malformed("in-sync acknowledgement (not catching up)"), shared);
            };
            let sent = catch_up.marker.load(Ordering::Acquire) == MARKER_SENT;
            if !sent || applied != catch_up.sync_point.load(Ordering::Acquire) {
                return link.fail(malformed("in-sync acknowledgement (no such marker)"), shared);
            }
            catch_up.marker.store(MARKER_ACKNOWLEDGED, Ordering::Release);
            shared.wake(); // a recovered primary's replies held for it may go
            continue;
        }
        let taken = match link.one_sided() {
            false => take_acknowledgement(shared, link, applied),
            true => take_applied(shared, link, applied),
        };
        if let Err(error) = taken {
            return link.fail(error, shared);
        }
        if let Some(catch_up) = &link.catch_up {
            // A catching-up backup acknowledges nothing before it applied its snapshot.
            if !link.counted.load(Ordering::Acquire) {
                let sequencer = shared.sequencer.lock();
                catch_up.sync_point.store(sequencer.0 - 1, Ordering::Release);
                link.counted.store(true, Ordering::Release);
                shared.membership.fetch_add(1, Ordering::AcqRel);
                drop(sequencer);
            }
            let due = applied >= catch_up.sync_point.load(Ordering::Acquire)
                && catch_up
                    .marker
                    .compare_exchange(MARKER_NOT_DUE, MARKER_DUE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
            if due {
                let _queue = link.queue.lock();
                link.changed.notify_all();
            }
        }
        // Over TCP an acknowledgement makes room in the queue and releases replies. One-sided it
        // does neither (the records were held once written): waking the link's thread and the
        // front ends for it would cost two thread wake-ups per call for nothing, but while a
        // catching-up link starts to count (which moves the watermark), and with persistence
        // (`held_once_applied`: the acknowledgement is what releases the replies).
        if !link.one_sided() || link.catch_up.is_some() || link.held_once_applied() {
            link.changed.notify_all();
            shared.wake();
        }
    }
}

/// TCP: the backup applied (and so holds) every record up to `applied`: drops the batches it
/// covers and measures their round trip.
fn take_acknowledgement(shared: &Shared, link: &Link, applied: u64) -> Result<(), ReplicationError> {
    let now = Instant::now();
    let (mut acks, mut total_us, mut max_us) = (0u64, 0u64, 0u64);
    {
        let mut queue = link.queue.lock();
        let sent_last =
            queue.written.checked_sub(1).and_then(|index| queue.batches.get(index)).map_or(0, |batch| batch.last);
        if applied < link.acked.load(Ordering::Acquire) || applied > sent_last.max(link.acked.load(Ordering::Acquire)) {
            let (backup, address) = (link.backup, link.address.clone());
            return Err(ReplicationError::Malformed { backup, address, what: "acknowledgement (out of range)" });
        }
        while queue.batches.front().is_some_and(|batch| batch.last <= applied) {
            if let Some(batch) = queue.batches.pop_front() {
                queue.bytes -= batch.bytes.len();
                queue.written -= 1;
                let latency_us = now.duration_since(batch.queued_at).as_micros() as u64;
                acks += 1;
                total_us += latency_us;
                max_us = max_us.max(latency_us);
            }
        }
        link.acked.store(applied, Ordering::Release);
    }
    if acks > 0 {
        let mut stats = shared.stats.lock();
        stats.acks += acks;
        stats.ack_latency_us_total += total_us;
        stats.ack_latency_us_max = stats.ack_latency_us_max.max(max_us);
    }
    Ok(())
}

/// One-sided: the backup applied every record up to `applied` (it held them since they
/// landed): measures the apply lag of the calls that covers.
fn take_applied(shared: &Shared, link: &Link, applied: u64) -> Result<(), ReplicationError> {
    let now = Instant::now();
    if applied < link.applied.load(Ordering::Acquire) || applied > link.written.load(Ordering::Acquire) {
        let (backup, address) = (link.backup, link.address.clone());
        return Err(ReplicationError::Malformed { backup, address, what: "acknowledgement (out of range)" });
    }
    link.applied.store(applied, Ordering::Release);
    let mut lags = LagHistogram::default();
    let mut lag_us_max = 0;
    {
        let mut landed = link.landed.lock();
        while landed.front().is_some_and(|&(last, _)| last <= applied) {
            if let Some((_, at)) = landed.pop_front() {
                let lag_us = now.duration_since(at).as_micros() as u64;
                lags.record(lag_us);
                lag_us_max = lag_us_max.max(lag_us);
            }
        }
    }
    if lags.count() > 0 {
        let mut stats = shared.stats.lock();
        stats.apply_lag.add(&lags);
        stats.apply_lag_us_max = stats.apply_lag_us_max.max(lag_us_max);
    }
    Ok(())
}
