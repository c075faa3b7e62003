//! The primary's sequencer: [`Replicator`] numbers the records of each call, ships them to every
//! backup's link, and says how far every backup holds them. A link's own life (connect, hello,
//! writes, acknowledgements) is in `link`.
//!
//! # Contract
//! - The records are the ones persistence logs ([`Effects::logged`]: PREPARE, COMMIT, ABORT,
//!   PUT, made by the core *after* it applied them), encoded with the log's own record codec
//!   (`rampkv_durable::record`: a 40-byte header with a sequence number, the configuration
//!   epoch and a CRC32C over header and payload). A primary numbers its records 1, 2, ... in
//!   the order it appends them, and ships every record to every backup of its partitions
//!   (placement: `rampkv_config::configuration::backups_of`).
//! - A call's replies are held until **every** backup *holds* the call's last record
//!   ([`Replicator::append`] sets `Effects::release_after`; [`Replicator::acknowledged`] is the
//!   lowest sequence number every backup holds), so an acknowledged PREPARE or COMMIT is in the
//!   memory of f + 1 servers. Over TCP a backup holds a record once it acknowledged it, which it
//!   does only once it has applied it (and every record before it) to its copy of the primary's
//!   store: its apply lag at the acknowledgement is zero, and the time from append to
//!   acknowledgement (the replication round trip, apply included) is measured. One-sided, a
//!   backup holds a record once the primary's write of it completed into the backup's open log
//!   region (`log_region` module docs); the backup applies it later, in order, and
//!   acknowledges what it applied on the TCP connection: the time from the write to that
//!   acknowledgement is the apply lag, bounded by the region (`REPLICATION_LOG_RING_BYTES`: a
//!   full region makes the primary's writes wait) and measured ([`ReplicationStats`]).

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use rampkv_core::limits::{
    REPLICATION_FULL_WAIT_MS_MAX, REPLICATION_IO_TIMEOUT_MS, REPLICATION_LOG_RING_BYTES, REPLICATION_UNACKED_BYTES_MAX,
};
use rampkv_core::protocol::server::{Effects, LogPosition, ServerCore};
use rampkv_durable::record::{encode_record, RECORD_HEADER_BYTES};
use rampkv_durable::{RecordHeader, RecordRef};

use super::super::durable::Journal;
use super::log_region::{LogError, LogSender};
use super::{ReplicationError, ReplicationMedium};
use crate::auth::SharedSecret;

/// A histogram of apply lags in µs: 4 buckets per power of two (25% resolution) up to
/// `LAG_BUCKETS` buckets (about 131 ms; longer lags land in the last one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LagHistogram {
    buckets: [u64; LAG_BUCKETS],
}

const LAG_BUCKETS: usize = 64;

impl Default for LagHistogram {
    fn default() -> Self {
        Self { buckets: [0; LAG_BUCKETS] }
    }
}

impl LagHistogram {
    pub(super) fn bucket(value_us: u64) -> usize {
        if value_us < 4 {
            return value_us as usize;
        }
        let octave = u64::from(63 - value_us.leading_zeros()); // at least 2
        let sub = (value_us >> (octave - 2)) & 3;
        (((octave - 1) * 4 + sub) as usize).min(LAG_BUCKETS - 1)
    }

    /// The first value above bucket `index`.
    pub(super) fn upper_us(index: usize) -> u64 {
        if index < 4 {
            return index as u64 + 1;
        }
        let (octave, sub) = (index as u64 / 4 + 1, index as u64 % 4);
        (5 + sub) << (octave - 2)
    }

    /// Counts one lag.
    pub fn record(&mut self, value_us: u64) {
        self.buckets[Self::bucket(value_us)] += 1;
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &LagHistogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *mine += theirs;
        }
    }

    /// Lags counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// An upper bound of the `quantile` (0..=1) lag, in µs (the end of its bucket; 0 if none).
    pub fn quantile_us(&self, quantile: f64) -> u64 {
        let count = self.count();
        if count == 0 {
            return 0;
        }
        let rank = ((quantile.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, bucket) in self.buckets.iter().enumerate() {
            seen += bucket;
            if seen >= rank {
                return Self::upper_us(index);
            }
        }
        Self::upper_us(LAG_BUCKETS - 1)
    }
}

/// What one primary's replication did since it started.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ReplicationStats {
    /// Records appended (each shipped to every backup).
    pub records: u64,
    /// Bytes of records appended (per backup).
    pub bytes: u64,
    /// Appends (calls) acknowledged by a backup, and the time from append to acknowledgement
    /// (network both ways and the backup's apply).
    pub acks: u64,
    pub ack_latency_us_total: u64,
    pub ack_latency_us_max: u64,
    /// Links failed (a failed link holds the primary's writes for good).
    pub links_failed: u64,
    /// One-sided: records' apply lag, from the write that landed them in a backup's log region
    /// to the primary's receipt of the backup's acknowledgement that it applied them (an upper
    /// bound: the acknowledgement's trip is included), per landed call.
    #[serde(skip)]
    pub apply_lag: LagHistogram,
    pub apply_lag_us_max: u64,
    /// Catching-up backups sent a snapshot of the store, and the versions those held.
    pub catch_up_snapshots: u64,
    pub catch_up_snapshot_versions: u64,
    /// Catching-up backups sent only the records they missed (a delta), and those records.
    pub catch_up_deltas: u64,
    pub catch_up_delta_records: u64,
}

impl ReplicationStats {
    /// Adds `other` (another server's) to these.
    pub fn add(&mut self, other: &ReplicationStats) {
        self.records += other.records;
        self.bytes += other.bytes;
        self.acks += other.acks;
        self.ack_latency_us_total += other.ack_latency_us_total;
        self.ack_latency_us_max = self.ack_latency_us_max.max(other.ack_latency_us_max);
        self.links_failed += other.links_failed;
        self.apply_lag.add(&other.apply_lag);
        self.apply_lag_us_max = self.apply_lag_us_max.max(other.apply_lag_us_max);
        self.catch_up_snapshots += other.catch_up_snapshots;
        self.catch_up_snapshot_versions += other.catch_up_snapshot_versions;
        self.catch_up_deltas += other.catch_up_deltas;
        self.catch_up_delta_records += other.catch_up_delta_records;
    }

    /// Mean time from append to a backup's acknowledgement, in µs.
    pub fn ack_latency_us_mean(&self) -> f64 {
        if self.acks == 0 {
            0.0
        } else {
            self.ack_latency_us_total as f64 / self.acks as f64
        }
    }
}

/// A call's records, encoded once and shared by every link.
#[derive(Clone)]
pub(super) struct Batch {
    pub(super) first: u64,
    pub(super) last: u64,
    pub(super) bytes: Arc<[u8]>,
    pub(super) queued_at: Instant,
}

#[derive(Default)]
pub(super) struct LinkQueue {
    /// TCP: batches not acknowledged yet, oldest first. One-sided: batches not written into
    /// the log region yet (a written one is held, and dropped).
    pub(super) batches: VecDeque<Batch>,
    /// TCP: batches at the front already written to the socket.
    pub(super) written: usize,
    pub(super) bytes: usize,
    /// One-sided: the backup's log region, once the link is up.
    pub(super) log: Option<LogSender>,
    /// One-sided: bytes of the front batch already in the log region.
    pub(super) front_written: usize,
    /// One-sided: nothing waits to be written before a new batch (the link is up, a
    /// catching-up backup's snapshot went, the queue is empty): `append` writes it itself.
    pub(super) direct: bool,
}

/// One backup of a primary: its queue, its writer and its acknowledgements.
pub(super) struct Link {
    pub(super) backup: usize,
    pub(super) address: String,
    pub(super) queue: Mutex<LinkQueue>,
    /// Signalled when a batch is queued (the writer waits) or acknowledged (a full append waits).
    pub(super) changed: Condvar,
    pub(super) acked: AtomicU64,
    pub(super) failure: OnceLock<ReplicationError>,
    pub(super) stream: Mutex<Option<TcpStream>>,
    /// The configuration removed this backup from every replica set of the primary (it
    /// failed), or a newer link to it took its place: its acknowledgements are no longer
    /// waited for.
    pub(super) removed: AtomicBool,
    /// The backup's process incarnation (the configuration's) this link was opened for.
    pub(super) incarnation: u64,
    /// Its acknowledgements hold the primary's replies: an in-sync backup's from the start, a
    /// catching-up one's once it applied its snapshot.
    pub(super) counted: AtomicBool,
    /// A catching-up backup's link (a snapshot first), else `None`.
    pub(super) catch_up: Option<CatchUp>,
    /// One-sided: the last record the backup said it applied, and when the calls not yet
    /// applied landed (last record, time; oldest first; for the apply lag).
    pub(super) applied: AtomicU64,
    pub(super) landed: Mutex<VecDeque<(u64, Instant)>>,
    /// One-sided: the last record whose write into the log region began (the backup cannot
    /// have applied one after it).
    pub(super) written: AtomicU64,
    /// One-sided, with persistence (`StreamStart::held_once_applied`): a record is held once
    /// the backup acknowledged that it applied it and made its copy's log durable up to it,
    /// not once it landed in the log region.
    pub(super) held_once_applied: bool,
    /// The stream goes one-sided into the backup's log region: the replicator's medium, until
    /// the log region handshake falls back to TCP for this backup (`log_region`: a region that
    /// cannot be mapped), before the link takes its first acknowledgement.
    pub(super) one_sided: AtomicBool,
}

/// The progress of a catching-up backup's link (`rejoin` module docs).
pub(super) struct CatchUp {
    /// The link's first record: the snapshot holds every record before it.
    pub(super) point: u64,
    /// The primary's epoch when the link was opened.
    opened_in: u64,
    /// The last record appended when the link became counted (`u64::MAX`: not yet).
    pub(super) sync_point: AtomicU64,
    /// The in-sync marker: `MARKER_*` states below.
    pub(super) marker: AtomicU8,
    /// A recovered primary's first link: it holds replies from the start (nothing before its
    /// point was acknowledged in this process), in sync once its snapshot is applied.
    pub(super) counted_from_start: bool,
}

impl CatchUp {
    pub(super) fn new(point: u64, opened_in: u64, counted_from_start: bool) -> CatchUp {
        let sync_point = AtomicU64::new(u64::MAX);
        CatchUp { point, opened_in, sync_point, marker: AtomicU8::new(MARKER_NOT_DUE), counted_from_start }
    }

    /// The same, joining at `point`.
    pub(super) fn at(self, point: u64) -> CatchUp {
        let sync_point = if self.counted_from_start { point - 1 } else { u64::MAX };
        CatchUp { point, sync_point: AtomicU64::new(sync_point), ..self }
    }
}

pub(super) const MARKER_NOT_DUE: u8 = 0;
pub(super) const MARKER_DUE: u8 = 1;
pub(super) const MARKER_SENT: u8 = 2;
pub(super) const MARKER_ACKNOWLEDGED: u8 = 3;

impl Link {
    pub(super) fn fail(&self, error: ReplicationError, shared: &Shared) {
        if self.failure.set(error).is_ok() {
            if let Some(error) = self.failure.get() {
                let holds = self.counted.load(Ordering::Acquire) && !self.removed.load(Ordering::Acquire);
                if !shared.stop.load(Ordering::Acquire) && holds {
                    log::error!("replication link failed: {error}; this primary's writes are held");
                } else if !shared.stop.load(Ordering::Acquire) && !self.removed.load(Ordering::Acquire) {
                    log::warn!("replication: a catch-up link failed: {error}");
                }
            }
            shared.stats.lock().links_failed += 1;
        }
        if let Some(stream) = self.stream.lock().as_ref() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.changed.notify_all();
    }

    pub(super) fn failed(&self) -> bool {
        self.failure.get().is_some()
    }

    /// What its acknowledgements release: a recovered primary's first link releases nothing
    /// of this process until the backup made its copy current (a failover meanwhile would take
    /// over the older copy, without the writes released).
    fn releases_up_to(&self) -> u64 {
        match &self.catch_up {
            Some(catch_up)
                if catch_up.counted_from_start && catch_up.marker.load(Ordering::SeqCst) != MARKER_ACKNOWLEDGED =>
            {
                catch_up.point - 1
            }
            _ if self.held_once_applied() => self.applied.load(Ordering::SeqCst).min(self.acked.load(Ordering::SeqCst)),
            _ => self.acked.load(Ordering::SeqCst),
        }
    }

    /// Whether a record is held once the backup applied it rather than once it landed: a
    /// one-sided link with persistence (a TCP link's acknowledgements say applied anyway).
    pub(super) fn held_once_applied(&self) -> bool {
        self.held_once_applied && self.one_sided.load(Ordering::SeqCst)
    }

    /// Whether the stream goes one-sided (else over the replication port's TCP connection).
    pub(super) fn one_sided(&self) -> bool {
        self.one_sided.load(Ordering::Acquire)
    }

    pub(super) fn catches_up(&self, backup: usize, incarnation: u64, since: u64) -> bool {
        self.backup == backup
            && self.incarnation == incarnation
            && self.catch_up.as_ref().is_some_and(|catch_up| catch_up.opened_in >= since)
            && !self.removed.load(Ordering::Acquire)
            && !self.failed()
    }
}

pub(super) struct Shared {
    pub(super) primary: u16,
    pub(super) medium: ReplicationMedium,
    /// One-sided links hold a record once the backup applied it and made it durable
    /// (`StreamStart::held_once_applied`).
    pub(super) held_once_applied: bool,
    /// The configuration epoch records are appended with (raised by failover as it learns).
    pub(super) epoch: AtomicU64,
    pub(super) secret: Option<Arc<SharedSecret>>,
    pub(super) links: RwLock<Vec<Arc<Link>>>,
    /// The next sequence number, and a buffer to encode into. The lock keeps every link's
    /// queue in sequence order, and a link joins under it (its first record and its snapshot
    /// point agree).
    pub(super) sequencer: Mutex<(u64, Vec<u8>)>,
    /// The store a catching-up backup's snapshot is taken of.
    pub(super) source: OnceLock<Arc<ServerCore>>,
    /// The stream's identity and its last records (`delta` module docs).
    pub(super) backlog: Mutex<Backlog>,
    /// Bumped whenever a link starts to count ([`Replicator::acknowledged`] reads it).
    pub(super) membership: AtomicU64,
    pub(super) stop: AtomicBool,
    pub(super) stats: Mutex<ReplicationStats>,
    pub(super) wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The identity of a primary's stream and its last records, for catching-up backups that hold
/// a prefix of it (`delta` module docs).
pub(super) struct Backlog {
    /// Random; new whenever the store took what no record describes (a process start, an
    /// adopted copy): a backup's copy of another stream is no prefix of this one.
    pub(super) stream: u64,
    /// The last batches appended, oldest first, at most `max_bytes` of them (0: none kept).
    pub(super) batches: VecDeque<Batch>,
    pub(super) bytes: usize,
    pub(super) max_bytes: usize,
}

impl Shared {
    pub(super) fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            wake();
        }
    }
}

/// The primary's side: numbers the records of each call, ships them to every backup, and says
/// how far every backup acknowledged. See the module docs (and `replication`'s).
pub struct Replicator {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Replicator")
            .field("primary", &self.shared.primary)
            .field("epoch", &self.shared.epoch.load(Ordering::Acquire))
            .field("backups", &self.shared.links.read().iter().map(|link| link.backup).collect::<Vec<_>>())
            .finish()
    }
}

impl Replicator {
    /// Sets the store catching-up backups' snapshots are taken of (the primary's).
    pub(crate) fn set_source(&self, core: Arc<ServerCore>) {
        let _ = self.shared.source.set(core);
    }

    /// Records appended from now on carry `epoch` (never lowered).
    pub fn set_epoch(&self, epoch: u64) {
        self.shared.epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    /// Registers what an acknowledgement (or a failure) calls: the front ends holding replies.
    pub(crate) fn set_wake(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.shared.wake.set(Box::new(wake));
    }

    /// Ships the records of one call (`effects.logged`, emptied) to every backup and sets
    /// `effects.release_after` to the last one's sequence number. After a link failed that
    /// position is never reached (the replies are held).
    pub fn append(&self, effects: &mut Effects) {
        self.append_journaled(effects, None);
    }

    /// [`Replicator::append`] of a server with a data directory: each record is appended to
    /// `journal` first, under the sequencer lock, so that the stream numbers its records as
    /// the log does (the stream started at the log's next LSN; nothing else appends to it).
    /// After a failure of the log nothing more is shipped and the position is never reached.
    pub(crate) fn append_journaled(&self, effects: &mut Effects, journal: Option<&Journal>) {
        if effects.logged.is_empty() {
            return;
        }
        let mut sequencer = self.shared.sequencer.lock();
        let links = self.shared.links.read();
        let (next, buffer) = &mut *sequencer;
        buffer.clear();
        let first = *next;
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        let mut journal_failed = false;
        for record in effects.logged.drain(..) {
            if let Some(journal) = journal {
                let lsn = journal.append_record(&record);
                debug_assert!(lsn.is_none_or(|lsn| lsn == *next), "the log and the stream number records alike");
                if lsn != Some(*next) {
                    journal_failed = true;
                    break;
                }
            }
            let header = RecordHeader { lsn: *next, epoch, synced_lsn: 0 };
            if let Err(error) = encode_record(header, RecordRef::from(&record), buffer) {
                debug_assert!(false, "the store took what the codec refuses: {error}");
                for link in links.iter() {
                    link.fail(ReplicationError::Encode(error.clone()), &self.shared);
                }
                break;
            }
            *next += 1;
        }
        let last = *next - 1;
        let position = LogPosition(if last >= first && !journal_failed { last } else { u64::MAX });
        if last >= first {
            let batch = Batch { first, last, bytes: Arc::from(buffer.as_slice()), queued_at: Instant::now() };
            let bytes = batch.bytes.len();
            for link in links.iter() {
                self.push(link, batch.clone());
            }
            let mut backlog = self.shared.backlog.lock();
            if backlog.max_bytes > 0 {
                backlog.bytes += bytes;
                backlog.batches.push_back(batch);
                while backlog.bytes > backlog.max_bytes {
                    let Some(oldest) = backlog.batches.pop_front() else { break };
                    backlog.bytes -= oldest.bytes.len();
                }
            }
            drop(backlog);
            let mut stats = self.shared.stats.lock();
            stats.records += last + 1 - first;
            stats.bytes += bytes as u64;
        }
        drop(links);
        drop(sequencer);
        if let Some(journal) = journal {
            journal.appended();
        }
        effects.release_after = Some(effects.release_after.map_or(position, |earlier| earlier.max(position)));
    }

    /// Queues `batch` for `link`, waiting for room (bounded: a backup that stays behind fails).
    /// A link that holds no reply (catching up, before its snapshot is applied) does not make
    /// writes wait: it fails at once when full (and is opened again). Its reader takes the
    /// sequencer lock to start counting, which the caller holds: it must not be waited for.
    fn push(&self, link: &Link, batch: Batch) {
        if link.removed.load(Ordering::Acquire) {
            return;
        }
        let wait_ms = if link.counted.load(Ordering::Acquire) { REPLICATION_FULL_WAIT_MS_MAX } else { 0 };
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut queue = link.queue.lock();
        if queue.direct
            && queue.batches.is_empty()
            && !link.failed()
            && self.write_direct(link, &mut queue, &batch, wait_ms)
        {
            return;
        }
        while queue.bytes + batch.bytes.len() > REPLICATION_UNACKED_BYTES_MAX && !queue.batches.is_empty() {
            if link.failed() || link.changed.wait_until(&mut queue, deadline).timed_out() {
                break;
            }
        }
        if link.failed() {
            return; // never acknowledged: the position stays out of reach
        }
        if queue.bytes + batch.bytes.len() > REPLICATION_UNACKED_BYTES_MAX && !queue.batches.is_empty() {
            let bytes = queue.bytes;
            drop(queue);
            let error = ReplicationError::TooFarBehind {
                backup: link.backup,
                address: link.address.clone(),
                bytes,
                waited_ms: wait_ms,
            };
            link.fail(error, &self.shared);
            return;
        }
        queue.bytes += batch.bytes.len();
        queue.batches.push_back(batch);
        drop(queue);
        link.changed.notify_all();
    }

    /// One-sided: writes `batch` into the log region at once (the link is up and nothing waits
    /// before it), waiting for room up to `wait_ms` (a full region: back-pressure from the
    /// backup's apply). True: written and held, or the link failed. False: the region stayed
    /// full on a link that holds no reply (which does not make writes wait); the part written
    /// is noted, and the batch goes to the queue for the link's thread to finish.
    fn write_direct(&self, link: &Link, queue: &mut LinkQueue, batch: &Batch, wait_ms: u64) -> bool {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let Some(log) = queue.log.as_mut() else { return false };
        let mut written = 0;
        link.written.fetch_max(batch.last, Ordering::AcqRel);
        // A full region is waited for in slices: a backup that died (its link fails when its
        // connection ends) never frees room, and the write must not wait out the whole bound.
        let slice = Duration::from_millis(REPLICATION_IO_TIMEOUT_MS);
        let appended = loop {
            let until = (wait_ms > 0).then(|| deadline.min(Instant::now() + slice));
            match log.append(&batch.bytes, &mut written, until) {
                Ok(false) if wait_ms > 0 && !link.failed() && Instant::now() < deadline => continue,
                other => break other,
            }
        };
        if link.failed() {
            return true; // never held: the position stays out of reach
        }
        match appended {
            Ok(true) => landed(&self.shared, link, batch),
            Ok(false) if wait_ms > 0 => {
                let (backup, address) = (link.backup, link.address.clone());
                let bytes = REPLICATION_LOG_RING_BYTES;
                link.fail(ReplicationError::TooFarBehind { backup, address, bytes, waited_ms: wait_ms }, &self.shared);
            }
            Ok(false) => {
                queue.front_written = written;
                queue.direct = false;
                return false;
            }
            Err(error) => link.fail(log_error(link, error), &self.shared),
        }
        true
    }

    /// The highest sequence number every backup still in a replica set holds: replies
    /// held up to here may go.
    pub fn acknowledged(&self) -> LogPosition {
        loop {
            // A catching-up link that starts to count while this reads would be missed by a
            // read that then takes another link's acknowledgement of a record after it: read
            // again when the counted set changed meanwhile.
            let membership = self.shared.membership.load(Ordering::SeqCst);
            let lowest = self
                .shared
                .links
                .read()
                .iter()
                .filter(|link| !link.removed.load(Ordering::SeqCst) && link.counted.load(Ordering::SeqCst))
                .map(|link| link.releases_up_to())
                .min();
            if self.shared.membership.load(Ordering::SeqCst) == membership {
                return LogPosition(lowest.unwrap_or(u64::MAX));
            }
        }
    }

    /// The first failure of a link that holds replies, rendered, if any: the primary's writes
    /// since are held.
    pub fn failure(&self) -> Option<String> {
        let links = self.shared.links.read();
        let mut holding =
            links.iter().filter(|link| link.counted.load(Ordering::Acquire) && !link.removed.load(Ordering::Acquire));
        holding.find_map(|link| link.failure.get().map(ToString::to_string))
    }

    /// Counters since the start.
    pub fn stats(&self) -> ReplicationStats {
        *self.shared.stats.lock()
    }

    /// The epoch its records carry.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch.load(Ordering::Acquire)
    }

    /// Stops the links (their threads end; nothing more is acknowledged). The group does this
    /// before it stops the backups, so that the links' end is not reported as a failure.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for link in self.shared.links.read().iter() {
            link.fail(ReplicationError::Stopped, &self.shared);
        }
    }
}

impl Drop for Replicator {
    fn drop(&mut self) {
        self.stop();
        let threads = std::mem::take(&mut *self.shared.threads.lock());
        for thread in threads {
            let _ = thread.join();
        }
    }
}

pub(super) fn io_error(link: &Link, error: std::io::Error) -> ReplicationError {
    ReplicationError::Io { backup: link.backup, address: link.address.clone(), error }
}

pub(super) fn log_error(link: &Link, error: LogError) -> ReplicationError {
    ReplicationError::Log { backup: link.backup, address: link.address.clone(), error }
}

/// One-sided: most landed calls whose apply is awaited that a link remembers (each is in the
/// log region until applied, and takes at least a record header there).
const LANDED_TRACKED_MAX: usize = REPLICATION_LOG_RING_BYTES / RECORD_HEADER_BYTES;

/// One-sided: `batch` is held by `link`'s backup (written into its open log region).
pub(super) fn landed(shared: &Shared, link: &Link, batch: &Batch) {
    let now = Instant::now();
    link.acked.fetch_max(batch.last, Ordering::AcqRel);
    {
        let mut landed = link.landed.lock();
        if landed.len() >= LANDED_TRACKED_MAX {
            landed.pop_front(); // its lag goes unmeasured; its record is held all the same
        }
        landed.push_back((batch.last, now));
    }
    let latency_us = now.duration_since(batch.queued_at).as_micros() as u64;
    let mut stats = shared.stats.lock();
    stats.acks += 1;
    stats.ack_latency_us_total += latency_us;
    stats.ack_latency_us_max = stats.ack_latency_us_max.max(latency_us);
}
