//! The backup's side ([`BackupService`]): a replication port whose connections each stream one
//! primary's records into that primary's copy (`copy`), applied in order and acknowledged once
//! applied.
//!
//! # Contract
//! - A backup refuses, with a clear error and without applying anything: a hello of an epoch
//!   older than the newest it saw for that primary (fencing), a record whose checksum does not
//!   match, a record of an older epoch than its stream's, a sequence number out of order, a
//!   stream that starts after what it holds without a snapshot, and a snapshot that does not
//!   check (header, entry checksums, counts). The link is then failed (`fencing`); nothing is
//!   applied past the refusal.

use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rampkv_core::limits::{
    GC_SWEEP_INTERVAL_MS, GC_SWEEP_KEYS_PER_TICK, REPLICATION_CONNECTIONS_MAX, REPLICATION_IO_TIMEOUT_MS,
    REPLICATION_LOG_HANDSHAKE_TIMEOUT_MS, REPLICATION_READ_BYTES,
};
use rampkv_core::storage::{StoreError, SweepClock};
use rampkv_core::types::wall_clock_unix_ms;
use rampkv_durable::limits::RECORD_PAYLOAD_BYTES_MAX;
use rampkv_durable::record::{check_frame, RECORD_HEADER_BYTES};
use rampkv_durable::{apply_record, RecordError};

use super::super::durable::{CopyJournal, RestoredCopy};
use super::copy::{BackupShared, BackupStats, BackupStore, Copies, CopyPersistence, Incoming, PrimaryStream};
use super::fencing::BackupTakeover;
use super::log_region::{LogFabric, LogReceiver, Negotiated};
use super::rejoin::receive_snapshot;
use super::wire::{
    decode_hello, decode_marker, encode_ack, encode_answer, u32_at, Hello, HELLO_BYTES, MARKER_BYTES, MARKER_DELTA,
    MARKER_LENGTH, MARKER_SNAPSHOT,
};
use super::BackupRefusal;
use crate::auth::SharedSecret;
use crate::message::fabric::FabricHandle;

/// The backup's side: a replication port whose connections each stream one primary's records
/// into that primary's [`BackupStore`]. Stops (and joins its threads) when dropped.
pub struct BackupService {
    shared: Arc<BackupShared>,
    address: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for BackupService {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("BackupService").field("address", &self.address).finish()
    }
}

impl BackupService {
    /// Serves the replication port `listener` (copies keep superseded versions `gc_grace_ms`,
    /// as the servers do; primaries must prove `secret` if one is given).
    ///
    /// # Errors
    /// The listener's address cannot be read or its thread started.
    pub fn start(
        listener: TcpListener,
        gc_grace_ms: u64,
        secret: Option<Arc<SharedSecret>>,
    ) -> std::io::Result<BackupService> {
        Self::start_durable(listener, gc_grace_ms, secret, None)
    }

    /// [`BackupService::start`], keeping the copies on disk as `persistence` says.
    ///
    /// # Errors
    /// As [`BackupService::start`].
    pub fn start_durable(
        listener: TcpListener,
        gc_grace_ms: u64,
        secret: Option<Arc<SharedSecret>>,
        persistence: Option<CopyPersistence>,
    ) -> std::io::Result<BackupService> {
        let address = listener.local_addr()?;
        let restored: Vec<RestoredCopy> = match &persistence {
            Some(persistence) if persistence.restore => {
                CopyJournal::restore(&persistence.root, &persistence.config, gc_grace_ms)
            }
            Some(persistence) => {
                if let Err(error) = std::fs::remove_dir_all(&persistence.root) {
                    if error.kind() != ErrorKind::NotFound {
                        return Err(error);
                    }
                }
                Vec::new()
            }
            None => Vec::new(),
        };
        // Of each primary, the copy marked current last is current again: the one a failover
        // takes over if that primary does not come back (a restarted backup that resumes its
        // roles, `server::resume`). Its primary's next stream makes a fresh copy.
        let resume_current = persistence.as_ref().is_some_and(|persistence| persistence.resume_current);
        let mut current: HashMap<u16, ((u64, u64), Arc<BackupStore>)> = HashMap::new();
        let mut restored: Vec<Arc<BackupStore>> = restored
            .into_iter()
            .map(|copy| {
                let (primary, since) = (copy.primary, copy.current_since);
                let copy = Arc::new(BackupStore::restored(copy, gc_grace_ms));
                if let Some(since) = since.filter(|_| resume_current) {
                    if current.get(&primary).is_none_or(|(newest, _)| *newest < since) {
                        current.insert(primary, (since, Arc::clone(&copy)));
                    }
                }
                copy
            })
            .collect();
        // A current copy is not continued by a catching-up stream (`CopyPersistence::resume_current`).
        restored.retain(|copy| !current.values().any(|(_, current)| Arc::ptr_eq(current, copy)));
        let stores: HashMap<u16, Copies> = current
            .into_iter()
            .map(|(primary, (_, copy))| {
                log::warn!(
                    "replication: the restored copy of primary {primary} (up to record {}) is its current copy again",
                    copy.applied()
                );
                (primary, Copies { current: Some(copy), staging: None })
            })
            .collect();
        let shared = Arc::new(BackupShared {
            gc_grace_ms,
            persistence,
            restored: Mutex::new(restored),
            secret,
            clock: Instant::now(),
            stores: Mutex::new(stores),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            open: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
            stats: Mutex::new(BackupStats::default()),
            failure: std::sync::OnceLock::new(),
        });
        let accept_shared = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("rampkv-backup".into())
            .spawn(move || accept(&accept_shared, &listener))?;
        Ok(BackupService { shared, address, acceptor: Some(acceptor) })
    }

    /// The replication port's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The copy of `primary`'s store, once it streamed.
    pub fn copy_of(&self, primary: u16) -> Option<Arc<BackupStore>> {
        self.shared.stores.lock().get(&primary).and_then(|copies| copies.current.clone())
    }

    /// Counters since the start.
    pub fn stats(&self) -> BackupStats {
        *self.shared.stats.lock()
    }

    /// Why a copy could not be kept on disk, if one could not (with persistence): the backup
    /// stopped acknowledging that primary's records, and the server must stop (fail-stop, as
    /// for its own log: `rampkv server` exits) so that the configuration fails it over.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure.get().cloned()
    }

    /// A handle the failover thread takes copies over with.
    pub(crate) fn takeover(&self) -> BackupTakeover {
        BackupTakeover { shared: Arc::clone(&self.shared) }
    }

    /// Takes over the copy of `primary`'s store (failover: this server is its partitions'
    /// primary in configuration `epoch`). Fences the primary first: hellos of an older epoch
    /// are refused from now on, and its stream, if one is open, stops before its next record;
    /// returns once no stream writes into the copy (at most one read timeout). `None`: the
    /// primary never streamed here (it acknowledged no write).
    pub fn take_over(&self, primary: u16, epoch: u64) -> Option<Arc<BackupStore>> {
        self.takeover().take_over(primary, epoch)
    }
}

impl Drop for BackupService {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the acceptor out of accept().
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_millis(REPLICATION_IO_TIMEOUT_MS));
        for stream in self.shared.open.lock().values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // Connection threads see the stop flag within one read timeout; they hold only the
        // shared state, which outlives them.
        let deadline = Instant::now() + Duration::from_millis(10 * REPLICATION_IO_TIMEOUT_MS);
        while self.shared.connections.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn accept(shared: &Arc<BackupShared>, listener: &TcpListener) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if shared.connections.fetch_add(1, Ordering::AcqRel) >= REPLICATION_CONNECTIONS_MAX {
            shared.connections.fetch_sub(1, Ordering::AcqRel);
            shared.stats.lock().connections_refused += 1;
            continue; // dropped: closed
        }
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            shared.open.lock().insert(id, clone);
        }
        let thread_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new().name("rampkv-backup-stream".into()).spawn(move || {
            if let Err(refusal) = serve_primary(&thread_shared, stream) {
                if !thread_shared.stop.load(Ordering::Acquire) {
                    log::warn!("replication: closed a primary's stream: {refusal}");
                }
                if !matches!(refusal, BackupRefusal::Io(_)) {
                    thread_shared.stats.lock().connections_refused += 1;
                }
            }
            thread_shared.open.lock().remove(&id);
            thread_shared.connections.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            shared.open.lock().remove(&id);
            shared.connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One primary's stream: authentication, hello, then records applied in order, each run of
/// them acknowledged once applied.
fn serve_primary(shared: &BackupShared, mut control: TcpStream) -> Result<(), BackupRefusal> {
    let _ = control.set_nodelay(true);
    control.set_read_timeout(Some(Duration::from_millis(REPLICATION_IO_TIMEOUT_MS)))?;
    if let Some(secret) = &shared.secret {
        crate::auth::authenticate_server_blocking(&mut control, secret).map_err(BackupRefusal::Auth)?;
    }
    let mut stream = PrimaryStream { control, log: None };
    let mut incoming = Incoming { bytes: Vec::with_capacity(REPLICATION_READ_BYTES), start: 0 };
    if !incoming.fill(shared, None, &mut stream, HELLO_BYTES)? {
        return Ok(()); // connected and left (the acceptor's own wake-up does)
    }
    let mut hello = [0u8; HELLO_BYTES];
    hello.copy_from_slice(&incoming.pending()[..HELLO_BYTES]);
    incoming.consume(HELLO_BYTES);
    let Some(Hello { primary, epoch, first, stream: lineage, catch_up, log_region }) = decode_hello(&hello) else {
        stream.write_all(&encode_answer(3, 0))?;
        return Err(BackupRefusal::MalformedHello);
    };
    let copy = {
        let mut stores = shared.stores.lock();
        let copies = stores.entry(primary).or_default();
        if catch_up {
            // A catching-up stream makes a fresh copy, unless it is of an epoch the current
            // copy's primary was fenced in (or before): a deposed primary's.
            let refused = copies.current.as_ref().and_then(|current| {
                let (known, fenced) = (current.epoch(), current.fenced.load(Ordering::Acquire));
                (epoch < known || (fenced && epoch == known)).then_some(known)
            });
            match refused {
                Some(known) => Err(known),
                None => {
                    // A copy of this very stream (loaded from disk, or a catch-up cut short)
                    // goes on from where it is (`delta` module docs).
                    let mut restored = shared.restored.lock();
                    let resumed =
                        restored.iter().position(|copy| copy.primary == primary && copy.resumable(lineage, epoch));
                    let copy = match (resumed, &copies.staging) {
                        (Some(index), _) => restored.swap_remove(index),
                        (None, Some(staging)) if staging.resumable(lineage, epoch) => Arc::clone(staging),
                        _ => Arc::new(BackupStore::new(primary, epoch, shared.gc_grace_ms)),
                    };
                    drop(restored);
                    if let Some(older) = copies.staging.replace(Arc::clone(&copy)) {
                        if !Arc::ptr_eq(&older, &copy) {
                            older.fenced.store(true, Ordering::Release); // its stream ends
                            older.discard_journal();
                        }
                    }
                    Ok(copy)
                }
            }
        } else {
            Ok(Arc::clone(
                copies.current.get_or_insert_with(|| Arc::new(BackupStore::new(primary, 0, shared.gc_grace_ms))),
            ))
        }
    };
    if catch_up {
        log::warn!("replication: primary {primary} asks for a catch-up copy (epoch {epoch}, from record {first})");
    }
    let copy = match copy {
        Ok(copy) => copy,
        Err(known) => {
            stream.write_all(&encode_answer(1, known))?;
            return Err(BackupRefusal::StaleEpoch { primary, epoch, known });
        }
    };
    let Some(_streaming) = copy.streaming.try_lock() else {
        stream.write_all(&encode_answer(4, 0))?;
        return Err(BackupRefusal::Busy { primary });
    };
    let known = copy.epoch();
    if epoch < known || copy.fenced.load(Ordering::Acquire) {
        stream.write_all(&encode_answer(1, known))?;
        return Err(BackupRefusal::StaleEpoch { primary, epoch, known });
    }
    let applied = copy.applied();
    let other_stream = copy.stream.load(Ordering::Acquire) != lineage && applied > 0;
    if !catch_up && (first > applied + 1 || other_stream) {
        stream.write_all(&encode_answer(2, applied))?;
        return Err(BackupRefusal::NeedsCatchUp { primary, first, applied });
    }
    if !catch_up && copy.stream.load(Ordering::Acquire) != lineage {
        // A new, empty copy, current from the start (the cluster's first configuration counts
        // this backup in sync).
        copy.start_journal(shared.persistence.as_ref(), lineage, applied)
            .map_err(|cause| shared.copy_failed(primary, cause))?;
        copy.mark_current(epoch).map_err(|cause| shared.copy_failed(primary, cause))?;
    }
    copy.epoch.store(epoch, Ordering::Release);
    stream.write_all(&encode_answer(0, applied))?;
    if log_region {
        // The primary sends its region only once it read the answer: nothing else is pending.
        if !incoming.pending().is_empty() {
            return Err(BackupRefusal::MalformedHello);
        }
        let handshake = Duration::from_millis(REPLICATION_LOG_HANDSHAKE_TIMEOUT_MS);
        stream.control.set_read_timeout(Some(handshake))?;
        let fabric =
            <LogFabric as FabricHandle>::open().map_err(|error| BackupRefusal::Log { primary, error: error.into() })?;
        let negotiated = LogReceiver::negotiate(fabric, &mut stream.control)
            .map_err(|error| BackupRefusal::Log { primary, error })?;
        stream.control.set_read_timeout(Some(Duration::from_millis(REPLICATION_IO_TIMEOUT_MS)))?;
        stream.log = match negotiated {
            Negotiated::OneSided(log) => {
                if log.medium() != "shm" {
                    log::warn!(
                        "replication: primary {primary} writes its records into this backup's log region over {}",
                        log.medium()
                    );
                }
                Some(log)
            }
            Negotiated::Tcp { reason } => {
                log::warn!("replication: primary {primary}'s records come over TCP ({reason})");
                None
            }
        };
    }
    let mut acked = applied;
    let mut awaiting_snapshot = catch_up;
    loop {
        sweep(shared, &copy);
        // Acknowledge once what arrived is applied: one acknowledgement per burst (also after a
        // marker: records it followed in the same burst are acknowledged before waiting).
        let applied = copy.applied();
        if applied > acked && incoming.pending().is_empty() {
            copy.flush_journal(applied).map_err(|cause| shared.copy_failed(primary, cause))?;
            stream.write_all(&encode_ack(applied, false))?;
            acked = applied;
        }
        // One record (its header says how long it is) or one marker.
        if !incoming.fill(shared, Some(&copy.fenced), &mut stream, RECORD_HEADER_BYTES)? {
            return Ok(()); // the primary stopped between records
        }
        if u32_at(incoming.pending(), 0) == MARKER_LENGTH {
            let Some((kind, value, _)) = decode_marker(incoming.pending()) else {
                return Err(BackupRefusal::BadMarker { primary });
            };
            incoming.consume(MARKER_BYTES);
            if kind == MARKER_DELTA {
                // Only the records after what this copy holds of the stream follow.
                if !awaiting_snapshot || applied == 0 || value != applied + 1 {
                    return Err(BackupRefusal::BadMarker { primary });
                }
                awaiting_snapshot = false;
                log::warn!("replication: primary {primary} sends the records from {value} on (a delta)");
                stream.write_all(&encode_ack(applied, false))?;
            } else if kind == MARKER_SNAPSHOT {
                if !awaiting_snapshot || value != first || value == 0 {
                    return Err(BackupRefusal::BadMarker { primary });
                }
                if copy.applied() > 0 {
                    // The primary could not send a delta: the copy starts over.
                    copy.discard_journal();
                    copy.stream.store(0, Ordering::Release);
                    copy.store.clear();
                    copy.applied.store(0, Ordering::Release);
                }
                receive_snapshot(shared, &copy, &mut incoming, &mut stream, value - 1)?;
                copy.start_journal(shared.persistence.as_ref(), lineage, value - 1)
                    .map_err(|cause| shared.copy_failed(primary, cause))?;
                awaiting_snapshot = false;
                // The primary counts this link from its first acknowledgement on.
                stream.write_all(&encode_ack(value - 1, false))?;
                acked = value - 1;
            } else {
                if awaiting_snapshot || !catch_up || copy.applied() < value {
                    return Err(BackupRefusal::BadMarker { primary });
                }
                // On disk first: a restart must find this copy current once it is acknowledged.
                copy.mark_current(copy.epoch()).map_err(|cause| shared.copy_failed(primary, cause))?;
                let mut stores = shared.stores.lock();
                let copies = stores.entry(primary).or_default();
                if !copies.staging.as_ref().is_some_and(|staging| Arc::ptr_eq(staging, &copy)) {
                    return Err(BackupRefusal::BadMarker { primary }); // a newer catch-up replaced it
                }
                let older = std::mem::replace(&mut copies.current, copies.staging.take());
                drop(stores);
                if let Some(older) = older.filter(|older| !Arc::ptr_eq(older, &copy)) {
                    older.discard_journal();
                }
                // Copies of older streams of this primary are of no use any more.
                let stale: Vec<Arc<BackupStore>> = {
                    let mut restored = shared.restored.lock();
                    let (stale, kept) = restored.drain(..).partition(|restored| restored.primary == primary);
                    *restored = kept;
                    stale
                };
                stale.iter().for_each(|stale| stale.discard_journal());
                log::warn!("replication: the copy of primary {primary} caught up (in sync at record {value})");
                stream.write_all(&encode_ack(value, true))?;
            }
            continue;
        }
        if awaiting_snapshot {
            return Err(BackupRefusal::SnapshotExpected { primary, what: "a record" });
        }
        let payload = u32_at(incoming.pending(), 0) as usize;
        if payload > RECORD_PAYLOAD_BYTES_MAX {
            let cause = RecordError::PayloadTooLarge { length: payload, max: RECORD_PAYLOAD_BYTES_MAX };
            return Err(BackupRefusal::BadFrame { primary, cause });
        }
        if !incoming.fill(shared, Some(&copy.fenced), &mut stream, RECORD_HEADER_BYTES + payload)? {
            return Err(BackupRefusal::Io(ErrorKind::UnexpectedEof.into()));
        }
        let frame = check_frame(incoming.pending()).map_err(|cause| BackupRefusal::BadFrame { primary, cause })?;
        let (lsn, length) = (frame.header.lsn, frame.len());
        let expected = copy.applied() + 1;
        if lsn > expected {
            return Err(BackupRefusal::OutOfOrder { primary, found: lsn, expected });
        }
        if lsn == expected {
            // A delta's records (before the hello's first) were appended in earlier epochs.
            if frame.header.epoch < epoch && lsn >= first {
                return Err(BackupRefusal::WrongEpoch { primary, lsn, found: frame.header.epoch, epoch });
            }
            let record = frame.record().map_err(|cause| BackupRefusal::BadRecord { primary, lsn, cause })?;
            // Checked with the stream held: the takeover waits for it, so every record applied
            // here is in the copy it takes over, and none after. One-sided, a record read from
            // the log region may be held: the region was closed when the takeover began and
            // is read to its end (`PrimaryStream::close_for_takeover`) before the copy goes.
            if copy.fenced.load(Ordering::Acquire) && !stream.one_sided() {
                return Err(BackupRefusal::Fenced { primary });
            }
            let now_ms = shared.clock.elapsed().as_millis() as u64;
            copy.journal_record(lsn, frame.header.epoch, record.as_ref())
                .map_err(|cause| shared.copy_failed(primary, cause))?;
            match apply_record(&copy.store, record, now_ms) {
                Ok(()) => shared.stats.lock().records_applied += 1,
                Err(StoreError::Aborted { .. }) => shared.stats.lock().records_refused += 1,
                Err(cause) => return Err(BackupRefusal::StoreRefused { primary, lsn, cause }),
            }
            copy.epoch.fetch_max(frame.header.epoch, Ordering::AcqRel);
            copy.applied.store(lsn, Ordering::Release);
        } // below `expected`: sent again after a reconnection, already applied
        incoming.consume(length);
    }
}

/// Collects superseded versions of a copy, and reclaims its expired keys by this server's
/// wall clock, as the server's own sweep does for its store (reclaiming is logged nowhere: each
/// copy does it by itself).
fn sweep(shared: &BackupShared, copy: &BackupStore) {
    let now_ms = shared.clock.elapsed().as_millis() as u64;
    let mut sweep = copy.sweep.lock();
    if now_ms >= sweep.1 {
        sweep.1 = now_ms + GC_SWEEP_INTERVAL_MS;
        let clock = SweepClock { monotonic_ms: now_ms, unix_ms: wall_clock_unix_ms() };
        copy.store.sweep(&mut sweep.0, GC_SWEEP_KEYS_PER_TICK, clock, None);
    }
}
