//! Synchronous replication of a server's record stream to its backups, over TCP or one-sided
//! into a log region each backup registers ([`ReplicationMedium`]; the one-sided medium is in
//! `log_region`: FaRM's way, the backup applying off the primary's critical path).
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
//! - A backup keeps one separate [`Store`] per primary it backs up ([`BackupStore`]): a backup
//!   copy never mixes with the partitions the server itself serves, is never served to clients,
//!   and is not touched by the server's recovery resolver (the primary's own records decide its
//!   in-doubt transactions).
//! - A backup refuses, with a clear error and without applying anything: a hello of an epoch
//!   older than the newest it saw for that primary (fencing), a record whose checksum does not
//!   match, a record of an older epoch than its stream's, a sequence number out of order, a
//!   stream that starts after what it holds without a snapshot, and a snapshot that does not
//!   check (header, entry checksums, counts). The link is then failed (see below); nothing is
//!   applied past the refusal.
//!
//! # Rejoin: a backup that catches up ([`Replicator::add_catch_up`])
//! A server the configuration names catching up for partitions of this primary (a restarted
//! server, or one that takes the place of a failed backup) gets a new link whose hello asks
//! for a fresh copy. Under the sequencer lock the link joins the others at point `N` (the next
//! sequence number): every record from `N` on is queued to it, and every record before `N` was
//! applied to the store before it was appended. The link's writer then sends a *snapshot*
//! marker and a snapshot of the store (`rampkv_durable::snapshot::write_to`: header with the
//! epoch and `N - 1`, CRC32C per entry, counts at the end), in chunks, and then the records
//! from `N`. The copy may already reflect some records from `N` on (the store kept changing
//! while it was copied); applying them again leaves the same store (the log's replay rule).
//! Until the backup acknowledged the snapshot its link does not hold replies. Then, under the
//! sequencer lock, it starts to (from the next record on: *counted*) and the primary notes the
//! last record `M` appended so far; once the backup acknowledged `M` it holds every record a
//! reply was released for and no reply goes out without it: the primary sends an *in-sync*
//! marker, the backup makes the copy its current one for this primary (a copy it held before
//! stays current until then, so a failover meanwhile takes a complete copy) and acknowledges
//! the marker, and only then does the primary report the backup caught up to the
//! configuration service ([`Replicator::in_sync`], read by the failover thread). A link that
//! fails before it is counted holds nothing and is replaced; once counted it is failed for
//! good, as any other.
//!
//! # Delta: a restarted backup that kept its copy on disk
//! With a data directory a backup keeps each copy on disk (`super::durable::CopyJournal`: a
//! snapshot at the copy's base point, then a log numbered as the primary's stream), and a
//! primary's stream has an identity (random; new at each start, and whenever failover adopts a
//! copy into the store: data no record describes) and keeps its last
//! `REPLICATION_BACKLOG_BYTES` of records. A restarted backup loads its copies; a catch-up hello
//! names the stream, and the backup answers with the last record it holds of *that* stream (0:
//! none). When the backlog still has every record after it, the primary puts them at the front
//! of the link's queue and sends a *delta* marker instead of a snapshot: the copy goes on from
//! where it is, through the same counting and in-sync steps as above. A copy of a stream is a
//! prefix of the primary's history (every record of the stream was applied to the primary's
//! store before it was appended), so it holds nothing the primary does not; a stream identity
//! that changed, a backlog that lost the records, or no copy on disk: a snapshot, as before.
//!
//! # Fault model (what is built today)
//! A link that fails (the backup died, refused, or stayed `REPLICATION_FULL_WAIT_MS_MAX` behind)
//! is failed for good: the primary's later writes are held until a committed configuration
//! removes that backup from the primary's replica sets ([`Replicator::retain_backups`], called
//! by failover), because acknowledging them without the backup before that would break "every
//! acknowledged write is on f + 1 servers". A backup that takes a copy over
//! ([`BackupService::take_over`], failover) fences the copy's primary first: its stream stops
//! before its next record and its hellos are refused from then on, unless a catch-up hello of a
//! newer epoch (a new incarnation of that server, primary again after it caught up).
//!
//! # Wire (replication port, all integers little-endian)
//! ```text
//! hello, primary -> backup (40 bytes)
//!   0 u32 magic "RKVR"   4 u16 version (3)   6 u16 primary (server index)
//!   8 u64 epoch          16 u64 first sequence number the primary will send
//!   24 u64 the stream's identity ("Delta")
//!   32 u32 flags: bit 0 catch-up (a snapshot or a delta comes first); bit 1 log region
//!               (one-sided: what follows the answer travels through the backup's log
//!               region, `log_region`); others 0
//!   36 u32 CRC32C of bytes [0, 36)
//! answer, backup -> primary (24 bytes)
//!   0 u32 magic "RKVA"   4 u16 version (3)   6 u16 status: 0 accepted, 1 stale epoch,
//!                                                  2 needs catching up, 3 malformed hello, 4 busy
//!   8 u64 accepted: the last sequence number applied (catch-up: the last one it holds of
//!         that stream, 0 for none); stale epoch: the epoch it knows
//!   16 u32 CRC32C of bytes [0, 16)           20 u32 reserved, zero
//! (bit 1: then the log region handshake, one JSON line each way, `log_region`)
//! then records, primary -> backup (over TCP, or written into the log region): log record
//! frames (docs/persistence.md), lsn = sequence number, epoch = the primary's epoch when it
//! appended (never older than the hello's, but a delta's records before the hello's first
//! sequence number keep their older epochs),
//! synced_lsn = 0; and markers, which a record frame cannot be mistaken for (40 bytes):
//!   0 u32 0xFFFF_FFFF (no record is that long)   4 u32 kind: 1 snapshot, 2 in sync, 3 delta
//!   8 u64 snapshot: the first record after it; in sync: the record the backup holds up to;
//!         delta: the first record that follows (the one after what the answer said it holds)
//!   16 u64 epoch   24 u64 reserved, zero   32 u32 CRC32C of bytes [0, 32)   36 u32 magic "RKVM"
//! a snapshot marker is followed by the snapshot (rampkv_durable's snapshot file format) in
//! chunks: u32 length (1..=REPLICATION_SNAPSHOT_CHUNK_BYTES) then the bytes; length 0 ends it
//! acknowledgements, backup -> primary (16 bytes)
//!   0 u64 last sequence number applied   8 u32 CRC32C of bytes [0, 8)   12 u32 magic "RKVK"
//!   (magic "RKVY": the in-sync marker of that record was applied)
//! ```
//! With a shared secret, the binary port's authentication step (`crate::auth`) comes first.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use rampkv_config::configuration::BOOTSTRAP_INCARNATION;
use rampkv_core::limits::{
    GC_SWEEP_INTERVAL_MS, GC_SWEEP_KEYS_PER_TICK, REPLICATION_APPLY_POLL_US, REPLICATION_CONNECTIONS_MAX,
    REPLICATION_CONNECT_BACKOFF_MS, REPLICATION_CONNECT_WAIT_MS_MAX, REPLICATION_FULL_WAIT_MS_MAX,
    REPLICATION_IO_TIMEOUT_MS, REPLICATION_LOG_FULL_BACKOFF_US, REPLICATION_LOG_HANDSHAKE_TIMEOUT_MS,
    REPLICATION_LOG_RING_BYTES, REPLICATION_READ_BYTES, REPLICATION_SNAPSHOT_CHUNK_BYTES,
    REPLICATION_SNAPSHOT_WAIT_MS_MAX, REPLICATION_UNACKED_BYTES_MAX,
};
use rampkv_core::protocol::server::{Effects, LogPosition, ServerCore};
use rampkv_core::storage::{Store, StoreError, SweepClock, SweepCursor};
use rampkv_durable::limits::RECORD_PAYLOAD_BYTES_MAX;
use rampkv_durable::record::{check_frame, encode_record, RECORD_HEADER_BYTES};
use rampkv_durable::{apply_record, RecordError, RecordHeader, RecordRef};

use super::durable::{CopyJournal, DurabilityConfig, Journal, RestoredCopy};
use crate::auth::{authenticate_client, AuthError, SharedSecret};

mod log_region;
pub use log_region::LogError;
use log_region::{LogReceiver, LogSender};

const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RKVR");
const ANSWER_MAGIC: u32 = u32::from_le_bytes(*b"RKVA");
const ACK_MAGIC: u32 = u32::from_le_bytes(*b"RKVK");
const IN_SYNC_ACK_MAGIC: u32 = u32::from_le_bytes(*b"RKVY");
const MARKER_MAGIC: u32 = u32::from_le_bytes(*b"RKVM");
/// The first word of a marker: longer than any record's payload may be.
const MARKER_LENGTH: u32 = u32::MAX;
const MARKER_BYTES: usize = 40;
const MARKER_SNAPSHOT: u32 = 1;
const MARKER_IN_SYNC: u32 = 2;
const MARKER_DELTA: u32 = 3;
const HELLO_CATCH_UP: u32 = 1;
const HELLO_LOG_REGION: u32 = 2;
const VERSION: u16 = 3;
// A marker is read where a record header would be, and no record's length is its first word.
const _: () = assert!(MARKER_BYTES == RECORD_HEADER_BYTES && RECORD_PAYLOAD_BYTES_MAX < MARKER_LENGTH as usize);
const HELLO_BYTES: usize = 40;
const ANSWER_BYTES: usize = 24;
const ACK_BYTES: usize = 16;

/// Why a replication link or a backup's connection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicationError {
    #[error("backup {backup} ({address}): {error}")]
    Io { backup: usize, address: String, error: std::io::Error },
    #[error("backup {backup} ({address}): authentication: {error}")]
    Auth { backup: usize, address: String, error: AuthError },
    #[error("backup {backup} ({address}) refused epoch {epoch}: it has seen epoch {known} of this primary (fenced)")]
    StaleEpoch { backup: usize, address: String, epoch: u64, known: u64 },
    #[error(
        "backup {backup} ({address}) holds records up to {applied} but the primary starts at {first}: it needs \
         catching up (a snapshot and the log since)"
    )]
    NeedsCatchUp { backup: usize, address: String, applied: u64, first: u64 },
    #[error("backup {backup} ({address}) refused the hello as malformed")]
    HelloRefused { backup: usize, address: String },
    #[error("backup {backup} ({address}) already has a stream from this primary")]
    Busy { backup: usize, address: String },
    #[error("backup {backup} ({address}) sent a malformed {what}")]
    Malformed { backup: usize, address: String, what: &'static str },
    #[error("backup {backup} ({address}) stayed {bytes} bytes behind for {waited_ms} ms: treated as failed")]
    TooFarBehind { backup: usize, address: String, bytes: usize, waited_ms: u64 },
    #[error("the store took a record the codec refuses: {0}")]
    Encode(RecordError),
    #[error("replication stopped")]
    Stopped,
    #[error("backup {backup} was removed from the replica sets (failover)")]
    Removed { backup: usize },
    #[error("backup {backup} ({address}): a newer link of this primary took its place")]
    Superseded { backup: usize, address: String },
    /// The one-sided medium: the log region could not be set up, was closed, or failed.
    #[error("backup {backup} ({address}): log region: {error}")]
    Log { backup: usize, address: String, error: LogError },
}

/// Why a backup refused (and closed) a primary's connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupRefusal {
    #[error("malformed hello")]
    MalformedHello,
    #[error("hello of epoch {epoch} from primary {primary}: epoch {known} was seen (stale, fenced)")]
    StaleEpoch { primary: u16, epoch: u64, known: u64 },
    #[error("primary {primary} starts at record {first}, this backup holds up to {applied}: needs catching up")]
    NeedsCatchUp { primary: u16, first: u64, applied: u64 },
    #[error("primary {primary} already streams to this backup")]
    Busy { primary: u16 },
    #[error("record {lsn} of primary {primary}: {cause}")]
    BadRecord { primary: u16, lsn: u64, cause: RecordError },
    #[error("record of primary {primary}: {cause}")]
    BadFrame { primary: u16, cause: RecordError },
    #[error("record {lsn} of primary {primary} has epoch {found}, older than the stream's {epoch} (fenced)")]
    WrongEpoch { primary: u16, lsn: u64, found: u64, epoch: u64 },
    #[error("primary {primary} sent a malformed marker")]
    BadMarker { primary: u16 },
    #[error("primary {primary} sent {what} where a catch-up stream has its snapshot first")]
    SnapshotExpected { primary: u16, what: &'static str },
    #[error("snapshot of primary {primary}: {cause}")]
    BadSnapshot { primary: u16, cause: rampkv_durable::DurableError },
    #[error("snapshot of primary {primary}: a chunk of {length} bytes (at most {max})")]
    SnapshotChunk { primary: u16, length: usize, max: usize },
    #[error("snapshot of primary {primary} not finished within {waited_ms} ms")]
    SnapshotTooSlow { primary: u16, waited_ms: u64 },
    #[error("record {found} of primary {primary} out of order: expected {expected}")]
    OutOfOrder { primary: u16, found: u64, expected: u64 },
    #[error("primary {primary} was failed over: this server serves its copy now (its records are fenced)")]
    Fenced { primary: u16 },
    #[error("record {lsn} of primary {primary}: the store refused it: {cause}")]
    StoreRefused { primary: u16, lsn: u64, cause: StoreError },
    #[error("authentication: {0}")]
    Auth(AuthError),
    #[error("log region of primary {primary}: {error}")]
    Log { primary: u16, error: LogError },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How a primary's records reach its backups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ReplicationMedium {
    /// Messages on the replication port's TCP connection; a backup holds a record once it
    /// applied it and said so.
    #[serde(rename = "tcp")]
    Tcp,
    /// One-sided writes into a log region the backup registered on the host's shared-memory
    /// fabric (FaRM's way); a backup holds a record once the write completed into its open
    /// region, and applies it off the primary's critical path. Needs the servers on one host.
    #[default]
    #[serde(rename = "onesided")]
    OneSided,
}

impl ReplicationMedium {
    /// The name the command line and the cluster file use.
    pub fn name(self) -> &'static str {
        match self {
            ReplicationMedium::Tcp => "tcp",
            ReplicationMedium::OneSided => "onesided",
        }
    }

    /// The default for servers whose replication ports are `addresses`: one-sided when every
    /// one is a loopback address (the servers share the host, hence its fabric), TCP otherwise
    /// (a region on another host cannot be mapped).
    pub fn for_addresses<'a>(addresses: impl IntoIterator<Item = &'a str>) -> ReplicationMedium {
        let local = |address: &str| address.parse::<SocketAddr>().is_ok_and(|address| address.ip().is_loopback());
        if addresses.into_iter().all(local) {
            ReplicationMedium::OneSided
        } else {
            ReplicationMedium::Tcp
        }
    }
}

/// A replication medium's name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replication medium {0:?}: expected tcp or onesided")]
pub struct UnknownMedium(pub String);

impl std::str::FromStr for ReplicationMedium {
    type Err = UnknownMedium;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "tcp" => Ok(ReplicationMedium::Tcp),
            "onesided" => Ok(ReplicationMedium::OneSided),
            other => Err(UnknownMedium(other.to_owned())),
        }
    }
}

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
    fn bucket(value_us: u64) -> usize {
        if value_us < 4 {
            return value_us as usize;
        }
        let octave = u64::from(63 - value_us.leading_zeros()); // at least 2
        let sub = (value_us >> (octave - 2)) & 3;
        (((octave - 1) * 4 + sub) as usize).min(LAG_BUCKETS - 1)
    }

    /// The first value above bucket `index`.
    fn upper_us(index: usize) -> u64 {
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
struct Batch {
    first: u64,
    last: u64,
    bytes: Arc<[u8]>,
    queued_at: Instant,
}

#[derive(Default)]
struct LinkQueue {
    /// TCP: batches not acknowledged yet, oldest first. One-sided: batches not written into
    /// the log region yet (a written one is held, and dropped).
    batches: VecDeque<Batch>,
    /// TCP: batches at the front already written to the socket.
    written: usize,
    bytes: usize,
    /// One-sided: the backup's log region, once the link is up.
    log: Option<LogSender>,
    /// One-sided: bytes of the front batch already in the log region.
    front_written: usize,
    /// One-sided: nothing waits to be written before a new batch (the link is up, a
    /// catching-up backup's snapshot went, the queue is empty): `append` writes it itself.
    direct: bool,
}

/// One backup of a primary: its queue, its writer and its acknowledgements.
struct Link {
    backup: usize,
    address: String,
    queue: Mutex<LinkQueue>,
    /// Signalled when a batch is queued (the writer waits) or acknowledged (a full append waits).
    changed: Condvar,
    acked: AtomicU64,
    failure: OnceLock<ReplicationError>,
    stream: Mutex<Option<TcpStream>>,
    /// The configuration removed this backup from every replica set of the primary (it
    /// failed), or a newer link to it took its place: its acknowledgements are no longer
    /// waited for.
    removed: AtomicBool,
    /// The backup's process incarnation (the configuration's) this link was opened for.
    incarnation: u64,
    /// Its acknowledgements hold the primary's replies: an in-sync backup's from the start, a
    /// catching-up one's once it applied its snapshot.
    counted: AtomicBool,
    /// A catching-up backup's link (a snapshot first), else `None`.
    catch_up: Option<CatchUp>,
    /// One-sided: the last record the backup said it applied, and when the calls not yet
    /// applied landed (last record, time; oldest first; for the apply lag).
    applied: AtomicU64,
    landed: Mutex<VecDeque<(u64, Instant)>>,
    /// One-sided: the last record whose write into the log region began (the backup cannot
    /// have applied one after it).
    written: AtomicU64,
}

/// The progress of a catching-up backup's link (module docs, "Rejoin").
struct CatchUp {
    /// The link's first record: the snapshot holds every record before it.
    point: u64,
    /// The primary's epoch when the link was opened.
    opened_in: u64,
    /// The last record appended when the link became counted (`u64::MAX`: not yet).
    sync_point: AtomicU64,
    /// The in-sync marker: `MARKER_*` states below.
    marker: AtomicU8,
    /// A recovered primary's first link: it holds replies from the start (nothing before its
    /// point was acknowledged in this process), in sync once its snapshot is applied.
    counted_from_start: bool,
}

impl CatchUp {
    fn new(point: u64, opened_in: u64, counted_from_start: bool) -> CatchUp {
        let sync_point = AtomicU64::new(u64::MAX);
        CatchUp { point, opened_in, sync_point, marker: AtomicU8::new(MARKER_NOT_DUE), counted_from_start }
    }

    /// The same, joining at `point`.
    fn at(self, point: u64) -> CatchUp {
        let sync_point = if self.counted_from_start { point - 1 } else { u64::MAX };
        CatchUp { point, sync_point: AtomicU64::new(sync_point), ..self }
    }
}

const MARKER_NOT_DUE: u8 = 0;
const MARKER_DUE: u8 = 1;
const MARKER_SENT: u8 = 2;
const MARKER_ACKNOWLEDGED: u8 = 3;

impl Link {
    fn fail(&self, error: ReplicationError, shared: &Shared) {
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

    fn failed(&self) -> bool {
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
            _ => self.acked.load(Ordering::SeqCst),
        }
    }

    fn catches_up(&self, backup: usize, incarnation: u64, since: u64) -> bool {
        self.backup == backup
            && self.incarnation == incarnation
            && self.catch_up.as_ref().is_some_and(|catch_up| catch_up.opened_in >= since)
            && !self.removed.load(Ordering::Acquire)
            && !self.failed()
    }
}

struct Shared {
    primary: u16,
    medium: ReplicationMedium,
    /// The configuration epoch records are appended with (raised by failover as it learns).
    epoch: AtomicU64,
    secret: Option<Arc<SharedSecret>>,
    links: RwLock<Vec<Arc<Link>>>,
    /// The next sequence number, and a buffer to encode into. The lock keeps every link's
    /// queue in sequence order, and a link joins under it (its first record and its snapshot
    /// point agree).
    sequencer: Mutex<(u64, Vec<u8>)>,
    /// The store a catching-up backup's snapshot is taken of.
    source: OnceLock<Arc<ServerCore>>,
    /// The stream's identity and its last records (module docs, "Delta").
    backlog: Mutex<Backlog>,
    /// Bumped whenever a link starts to count ([`Replicator::acknowledged`] reads it).
    membership: AtomicU64,
    stop: AtomicBool,
    stats: Mutex<ReplicationStats>,
    wake: OnceLock<Box<dyn Fn() + Send + Sync>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The identity of a primary's stream and its last records, for catching-up backups that hold
/// a prefix of it (module docs, "Delta").
struct Backlog {
    /// Random; new whenever the store took what no record describes (a process start, an
    /// adopted copy): a backup's copy of another stream is no prefix of this one.
    stream: u64,
    /// The last batches appended, oldest first, at most `max_bytes` of them (0: none kept).
    batches: VecDeque<Batch>,
    bytes: usize,
    max_bytes: usize,
}

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
}

impl Default for StreamStart {
    fn default() -> Self {
        StreamStart { first: 1, backlog_bytes: 0, snapshot_first: false }
    }
}

/// A random non-zero stream identity.
fn new_stream_id() -> u64 {
    super::random_id()
}

impl Shared {
    fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            wake();
        }
    }
}

/// The primary's side: numbers the records of each call, ships them to every backup, and says
/// how far every backup acknowledged. See the module docs.
pub struct Replicator {
    shared: Arc<Shared>,
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
        Self::start_with(primary, epoch, backups, secret, medium, StreamStart::default(), None)
    }

    /// [`Replicator::start`] with its stream's start (`start`) and the store catching-up
    /// backups' snapshots are taken of (`source`; needed from the start with
    /// `start.snapshot_first`, else it may be set later).
    ///
    /// # Errors
    /// A thread could not be started.
    pub fn start_with(
        primary: u16,
        epoch: u64,
        backups: Vec<(usize, String)>,
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
        for (backup, address) in backups {
            // The cluster's first configuration counts these backups in sync from the start
            // (a recovered store's links hold replies from the start, after a snapshot).
            let catch_up = start.snapshot_first.then(|| CatchUp::new(0, epoch, true));
            replicator.add_link(backup, address, BOOTSTRAP_INCARNATION, catch_up)?;
        }
        Ok(replicator)
    }

    /// Opens a link to catching-up `backup` (process `incarnation`, replication port
    /// `address`): a snapshot of the store, then every record from now on (module docs,
    /// "Rejoin"). An earlier link to that backup stays until this one is in sync.
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

    /// The store took what no record describes (failover adopted a copy into it): a backup's
    /// copy of the stream so far is no prefix of it any more, so the stream gets a new identity
    /// (and its backlog is dropped). Links already streaming are unaffected.
    pub(crate) fn new_lineage(&self) {
        let _sequencer = self.shared.sequencer.lock();
        let mut backlog = self.shared.backlog.lock();
        backlog.stream = new_stream_id();
        backlog.batches.clear();
        backlog.bytes = 0;
    }

    /// Sets the store catching-up backups' snapshots are taken of (the primary's).
    pub(crate) fn set_source(&self, core: Arc<ServerCore>) {
        let _ = self.shared.source.set(core);
    }

    /// Records appended from now on carry `epoch` (never lowered).
    pub fn set_epoch(&self, epoch: u64) {
        self.shared.epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    /// Whether catching-up `backup` (process `incarnation`) has a catch-up link opened in
    /// epoch `since` or later that has not failed (the failover thread opens one otherwise).
    pub fn has_catch_up_link(&self, backup: usize, incarnation: u64, since: u64) -> bool {
        self.shared.links.read().iter().any(|link| link.catches_up(backup, incarnation, since))
    }

    /// Whether catching-up `backup` (process `incarnation`) is in sync through a catch-up link
    /// opened in epoch `since` or later: it holds every record a reply was released for, no
    /// reply goes out without it, and it made that copy its current one (module docs,
    /// "Rejoin"). The configuration may then count it as a backup. The older links to that
    /// backup are retired then (the copies they fed are no longer its current one).
    pub fn in_sync(&self, backup: usize, incarnation: u64, since: u64) -> bool {
        let links = self.shared.links.read();
        let synced = links.iter().find(|link| {
            link.catches_up(backup, incarnation, since)
                && link.counted.load(Ordering::Acquire)
                && link
                    .catch_up
                    .as_ref()
                    .is_some_and(|catch_up| catch_up.marker.load(Ordering::Acquire) == MARKER_ACKNOWLEDGED)
        });
        let Some(synced) = synced else { return false };
        for older in links.iter().filter(|older| older.backup == backup && !Arc::ptr_eq(older, synced)) {
            if !older.removed.swap(true, Ordering::AcqRel) {
                let error = ReplicationError::Superseded { backup: older.backup, address: older.address.clone() };
                older.fail(error, &self.shared);
            }
        }
        drop(links);
        self.shared.wake();
        true
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

    /// Keeps waiting only for the backups in `keep` (server index and process incarnation):
    /// the others were removed from every replica set of this primary by a committed
    /// configuration (they failed), so a write they do not hold is still on every copy the
    /// configuration counts. Never undone (a removed backup comes back only by rejoining, with
    /// a new link). Wakes the front ends: replies held only for a removed backup may go.
    pub fn retain_backups(&self, keep: &[(usize, u64)]) {
        for link in self.shared.links.read().iter() {
            if !keep.contains(&(link.backup, link.incarnation)) && !link.removed.swap(true, Ordering::AcqRel) {
                log::warn!(
                    "replication: backup {} ({}) left the replica sets of primary {}; its acknowledgements are no \
                     longer waited for",
                    link.backup,
                    link.address,
                    self.shared.primary
                );
                link.fail(ReplicationError::Removed { backup: link.backup }, &self.shared);
            }
        }
        self.shared.wake();
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

/// A catching-up backup that holds records up to `held` of this stream (`lineage`, its identity
/// when the hello was sent) gets only the records after them, when the backlog still has every
/// one (module docs, "Delta"): they are put at the front of the link's queue, before the
/// records from its point on, and the first one's number is returned (for the delta marker).
/// `None`: a snapshot is due.
fn queue_delta(shared: &Shared, link: &Link, catch_up: &CatchUp, held: u64, lineage: u64) -> Option<u64> {
    let point = catch_up.point;
    if held == 0 || held >= point {
        return None;
    }
    let backlog = shared.backlog.lock();
    let first_kept = backlog.batches.front().map_or(point, |batch| batch.first);
    if backlog.stream != lineage || first_kept > held + 1 {
        return None;
    }
    let now = Instant::now();
    let missed: Vec<Batch> = backlog
        .batches
        .iter()
        .filter(|batch| batch.last > held && batch.first < point)
        .map(|batch| Batch { queued_at: now, ..batch.clone() })
        .collect();
    drop(backlog);
    let records = point - 1 - held;
    let mut queue = link.queue.lock();
    debug_assert_eq!(queue.written, 0, "the delta goes before anything the link wrote");
    for batch in missed.into_iter().rev() {
        queue.bytes += batch.bytes.len();
        queue.batches.push_front(batch);
    }
    link.acked.store(held, Ordering::Release);
    // One-sided, the backup acknowledges what it applied from `held` on (not from the point).
    link.applied.store(held, Ordering::Release);
    drop(queue);
    let mut stats = shared.stats.lock();
    stats.catch_up_deltas += 1;
    stats.catch_up_delta_records += records;
    drop(stats);
    let versions = shared.source.get().map_or(0, |core| core.store().stats().versions);
    log::warn!(
        "replication: primary {} sent a catching-up backup a delta of {records} records ({} to {}) instead of a \
         snapshot of its store ({versions} versions)",
        shared.primary,
        held + 1,
        point - 1
    );
    Some(held + 1)
}

/// A catching-up backup's snapshot: the marker, then the store in the snapshot file format,
/// in chunks, then the empty chunk.
fn send_snapshot(shared: &Shared, catch_up: &CatchUp, stream: &mut impl Write) -> std::io::Result<()> {
    let Some(core) = shared.source.get() else {
        return Err(std::io::Error::other("no store to take a snapshot of"));
    };
    let epoch = shared.epoch.load(Ordering::Acquire);
    stream.write_all(&encode_marker(MARKER_SNAPSHOT, catch_up.point, epoch))?;
    let mut chunks = ChunkWriter { stream, buffer: Vec::with_capacity(REPLICATION_SNAPSHOT_CHUNK_BYTES) };
    let counts = rampkv_durable::snapshot::write_to(&mut chunks, core.store(), catch_up.point - 1, epoch)?;
    chunks.stream.write_all(&0u32.to_le_bytes())?;
    let mut stats = shared.stats.lock();
    stats.catch_up_snapshots += 1;
    stats.catch_up_snapshot_versions += counts.versions;
    drop(stats);
    log::warn!(
        "replication: primary {} sent a catching-up backup its snapshot at record {} ({} keys, {} versions)",
        shared.primary,
        catch_up.point - 1,
        counts.keys,
        counts.versions
    );
    Ok(())
}

/// Cuts what is written into chunks of at most `REPLICATION_SNAPSHOT_CHUNK_BYTES`, each sent
/// after its length.
struct ChunkWriter<'a, W: Write> {
    stream: &'a mut W,
    buffer: Vec<u8>,
}

impl<W: Write> Write for ChunkWriter<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = REPLICATION_SNAPSHOT_CHUNK_BYTES - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == REPLICATION_SNAPSHOT_CHUNK_BYTES {
            self.flush()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buffer.is_empty() {
            self.stream.write_all(&(self.buffer.len() as u32).to_le_bytes())?;
            self.stream.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }
}

fn io_error(link: &Link, error: std::io::Error) -> ReplicationError {
    ReplicationError::Io { backup: link.backup, address: link.address.clone(), error }
}

fn log_error(link: &Link, error: LogError) -> ReplicationError {
    ReplicationError::Log { backup: link.backup, address: link.address.clone(), error }
}

/// One-sided: most landed calls whose apply is awaited that a link remembers (each is in the
/// log region until applied, and takes at least a record header there).
const LANDED_TRACKED_MAX: usize = REPLICATION_LOG_RING_BYTES / RECORD_HEADER_BYTES;

/// One-sided: `batch` is held by `link`'s backup (written into its open log region).
fn landed(shared: &Shared, link: &Link, batch: &Batch) {
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
            let log = if flags & HELLO_LOG_REGION != 0 {
                Some(LogSender::connect(&mut stream).map_err(|error| log_error(link, error))?)
            } else {
                None
            };
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
        let taken = match shared.medium {
            ReplicationMedium::Tcp => take_acknowledgement(shared, link, applied),
            ReplicationMedium::OneSided => take_applied(shared, link, applied),
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
        // catching-up link starts to count (which moves the watermark).
        if shared.medium == ReplicationMedium::Tcp || link.catch_up.is_some() {
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

fn encode_hello(fields: &Hello) -> [u8; HELLO_BYTES] {
    let mut hello = [0u8; HELLO_BYTES];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[4..6].copy_from_slice(&VERSION.to_le_bytes());
    hello[6..8].copy_from_slice(&fields.primary.to_le_bytes());
    hello[8..16].copy_from_slice(&fields.epoch.to_le_bytes());
    hello[16..24].copy_from_slice(&fields.first.to_le_bytes());
    hello[24..32].copy_from_slice(&fields.stream.to_le_bytes());
    let flags = if fields.catch_up { HELLO_CATCH_UP } else { 0 } | if fields.log_region { HELLO_LOG_REGION } else { 0 };
    hello[32..36].copy_from_slice(&flags.to_le_bytes());
    let crc = crc32c::crc32c(&hello[0..36]);
    hello[36..40].copy_from_slice(&crc.to_le_bytes());
    hello
}

/// A well-formed hello.
#[derive(Debug, PartialEq, Eq)]
struct Hello {
    primary: u16,
    epoch: u64,
    first: u64,
    /// The stream's identity (module docs, "Delta").
    stream: u64,
    catch_up: bool,
    log_region: bool,
}

fn decode_hello(hello: &[u8; HELLO_BYTES]) -> Option<Hello> {
    let flags = u32_at(hello, 32);
    let valid = u32_at(hello, 0) == HELLO_MAGIC
        && u16_at(hello, 4) == VERSION
        && u32_at(hello, 36) == crc32c::crc32c(&hello[0..36])
        && flags & !(HELLO_CATCH_UP | HELLO_LOG_REGION) == 0;
    valid.then(|| Hello {
        primary: u16_at(hello, 6),
        epoch: u64_at(hello, 8),
        first: u64_at(hello, 16),
        stream: u64_at(hello, 24),
        catch_up: flags & HELLO_CATCH_UP != 0,
        log_region: flags & HELLO_LOG_REGION != 0,
    })
}

fn encode_marker(kind: u32, value: u64, epoch: u64) -> [u8; MARKER_BYTES] {
    let mut marker = [0u8; MARKER_BYTES];
    marker[0..4].copy_from_slice(&MARKER_LENGTH.to_le_bytes());
    marker[4..8].copy_from_slice(&kind.to_le_bytes());
    marker[8..16].copy_from_slice(&value.to_le_bytes());
    marker[16..24].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&marker[0..32]);
    marker[32..36].copy_from_slice(&crc.to_le_bytes());
    marker[36..40].copy_from_slice(&MARKER_MAGIC.to_le_bytes());
    marker
}

/// `(kind, value, epoch)` of a well-formed marker.
fn decode_marker(marker: &[u8]) -> Option<(u32, u64, u64)> {
    let marker = marker.get(..MARKER_BYTES)?;
    let kind = u32_at(marker, 4);
    let valid = u32_at(marker, 0) == MARKER_LENGTH
        && matches!(kind, MARKER_SNAPSHOT | MARKER_IN_SYNC | MARKER_DELTA)
        && u64_at(marker, 24) == 0
        && u32_at(marker, 32) == crc32c::crc32c(&marker[0..32])
        && u32_at(marker, 36) == MARKER_MAGIC;
    valid.then(|| (kind, u64_at(marker, 8), u64_at(marker, 16)))
}

fn encode_answer(status: u16, value: u64) -> [u8; ANSWER_BYTES] {
    let mut answer = [0u8; ANSWER_BYTES];
    answer[0..4].copy_from_slice(&ANSWER_MAGIC.to_le_bytes());
    answer[4..6].copy_from_slice(&VERSION.to_le_bytes());
    answer[6..8].copy_from_slice(&status.to_le_bytes());
    answer[8..16].copy_from_slice(&value.to_le_bytes());
    let crc = crc32c::crc32c(&answer[0..16]);
    answer[16..20].copy_from_slice(&crc.to_le_bytes());
    answer
}

fn decode_answer(answer: &[u8; ANSWER_BYTES]) -> Option<(u16, u64)> {
    let valid = u32_at(answer, 0) == ANSWER_MAGIC
        && u16_at(answer, 4) == VERSION
        && u32_at(answer, 16) == crc32c::crc32c(&answer[0..16])
        && u32_at(answer, 20) == 0;
    valid.then(|| (u16_at(answer, 6), u64_at(answer, 8)))
}

fn encode_ack(applied: u64, in_sync: bool) -> [u8; ACK_BYTES] {
    let mut ack = [0u8; ACK_BYTES];
    ack[0..8].copy_from_slice(&applied.to_le_bytes());
    let crc = crc32c::crc32c(&ack[0..8]);
    ack[8..12].copy_from_slice(&crc.to_le_bytes());
    let magic = if in_sync { IN_SYNC_ACK_MAGIC } else { ACK_MAGIC };
    ack[12..16].copy_from_slice(&magic.to_le_bytes());
    ack
}

/// `(applied, in_sync)` of a well-formed acknowledgement (`in_sync`: of the in-sync marker).
fn decode_ack(ack: &[u8; ACK_BYTES]) -> Option<(u64, bool)> {
    let magic = u32_at(ack, 12);
    let valid = matches!(magic, ACK_MAGIC | IN_SYNC_ACK_MAGIC) && u32_at(ack, 8) == crc32c::crc32c(&ack[0..8]);
    valid.then(|| (u64_at(ack, 0), magic == IN_SYNC_ACK_MAGIC))
}

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut array = [0u8; 4];
    array.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(array)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(array)
}

/// A backup's copy of one primary's store.
#[derive(Debug)]
pub struct BackupStore {
    primary: u16,
    store: Store,
    /// The last record applied.
    applied: AtomicU64,
    /// The newest epoch a hello of this primary carried: older ones are refused.
    epoch: AtomicU64,
    /// Held by the connection that streams into it (one at a time).
    streaming: Mutex<()>,
    /// This server took the copy over (failover): no record of the primary is applied again.
    fenced: AtomicBool,
    sweep: Mutex<(SweepCursor, u64)>,
    /// The identity of the primary's stream it is a prefix of (0: none yet, or a snapshot is
    /// being loaded into it).
    stream: AtomicU64,
    /// Its files, when the backup has a data directory.
    journal: Mutex<Option<CopyJournal>>,
}

impl BackupStore {
    /// The primary it copies.
    pub fn primary(&self) -> u16 {
        self.primary
    }

    /// The copy.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The last record applied.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// The newest epoch its primary's stream carried.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
}

/// A backup's copies of one primary's store.
#[derive(Default)]
struct Copies {
    /// The copy that holds every record the primary acknowledged (an in-sync backup's): the
    /// one a failover takes over.
    current: Option<Arc<BackupStore>>,
    /// A copy catching up (a snapshot, then records), current once the primary's in-sync
    /// marker arrives.
    staging: Option<Arc<BackupStore>>,
}

impl BackupStore {
    fn new(primary: u16, epoch: u64, gc_grace_ms: u64) -> BackupStore {
        BackupStore {
            primary,
            store: Store::new(gc_grace_ms),
            applied: AtomicU64::new(0),
            epoch: AtomicU64::new(epoch),
            streaming: Mutex::new(()),
            fenced: AtomicBool::new(false),
            sweep: Mutex::new((SweepCursor::default(), 0)),
            stream: AtomicU64::new(0),
            journal: Mutex::new(None),
        }
    }

    fn restored(copy: RestoredCopy, gc_grace_ms: u64) -> BackupStore {
        let RestoredCopy { primary, stream, store, journal, applied, epoch } = copy;
        BackupStore {
            store,
            applied: AtomicU64::new(applied),
            stream: AtomicU64::new(stream),
            journal: Mutex::new(Some(journal)),
            ..BackupStore::new(primary, epoch, gc_grace_ms)
        }
    }

    /// Whether a catch-up hello of stream `stream` in epoch `epoch` may continue this copy
    /// rather than start a fresh one: it is a prefix of that stream, nobody streams into it.
    fn resumable(&self, stream: u64, epoch: u64) -> bool {
        self.stream.load(Ordering::Acquire) == stream
            && self.applied() > 0
            && self.epoch() <= epoch
            && !self.fenced.load(Ordering::Acquire)
            && self.streaming.try_lock().is_some()
    }

    /// Drops its files (the copy is dropped, replaced, or no prefix of its stream any more).
    fn discard_journal(&self) {
        if let Some(journal) = self.journal.lock().take() {
            journal.remove();
        }
    }

    /// Starts its files as a copy of stream `stream` holding every record up to `covers`.
    fn start_journal(&self, persistence: Option<&CopyPersistence>, stream: u64, covers: u64) {
        self.discard_journal();
        self.stream.store(stream, Ordering::Release);
        let Some(persistence) = persistence else { return };
        let (root, config) = (&persistence.root, &persistence.config);
        match CopyJournal::create(root, config, self.primary, stream, &self.store, covers, self.epoch()) {
            Ok(journal) => *self.journal.lock() = Some(journal),
            Err(error) => log::warn!("replication: the copy of primary {} is not kept on disk: {error}", self.primary),
        }
    }

    /// Appends record `lsn` of `epoch` to its files; a copy whose files fail is no longer kept.
    fn journal_record(&self, lsn: u64, epoch: u64, record: RecordRef<'_>) {
        let mut journal = self.journal.lock();
        if let Some(Err(error)) = journal.as_ref().map(|journal| journal.append(lsn, epoch, record)) {
            log::warn!("replication: the copy of primary {} is no longer kept on disk: {error}", self.primary);
            if let Some(journal) = journal.take() {
                journal.remove();
            }
        }
    }

    /// Writes what its files were given (once per acknowledged burst).
    fn flush_journal(self: &Arc<Self>) {
        let mut journal = self.journal.lock();
        if let Some(Err(error)) = journal.as_mut().map(|journal| journal.flush(self, BackupStore::store)) {
            log::warn!("replication: the copy of primary {} is no longer kept on disk: {error}", self.primary);
            if let Some(journal) = journal.take() {
                journal.remove();
            }
        }
    }
}

/// Where a backup keeps its copies on disk, and how.
#[derive(Debug, Clone)]
pub struct CopyPersistence {
    /// `copies` in the server's data directory.
    pub root: std::path::PathBuf,
    pub config: DurabilityConfig,
    /// The server restarted into a running cluster: the copies found are loaded (their primaries
    /// may send only what they missed). Otherwise (the cluster starts) they are removed: every
    /// primary's stream is new.
    pub restore: bool,
}

/// What a backup service did since it started.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct BackupStats {
    /// Records applied to a backup copy.
    pub records_applied: u64,
    /// Records the copy refused as its primary's store did (a PREPARE of an aborted
    /// transaction): applied as refusals, not damage.
    pub records_refused: u64,
    /// Connections refused or closed on bad input (each logged with its reason).
    pub connections_refused: u64,
}

struct BackupShared {
    gc_grace_ms: u64,
    persistence: Option<CopyPersistence>,
    /// Copies loaded from the data directory at start, not caught up yet.
    restored: Mutex<Vec<Arc<BackupStore>>>,
    secret: Option<Arc<SharedSecret>>,
    clock: Instant,
    stores: Mutex<HashMap<u16, Copies>>,
    stop: AtomicBool,
    connections: AtomicUsize,
    open: Mutex<HashMap<u64, TcpStream>>,
    next_connection: AtomicU64,
    stats: Mutex<BackupStats>,
}

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
        let restored = match &persistence {
            Some(persistence) if persistence.restore => {
                CopyJournal::restore(&persistence.root, &persistence.config, gc_grace_ms)
                    .into_iter()
                    .map(|copy| Arc::new(BackupStore::restored(copy, gc_grace_ms)))
                    .collect()
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
        let shared = Arc::new(BackupShared {
            gc_grace_ms,
            persistence,
            restored: Mutex::new(restored),
            secret,
            clock: Instant::now(),
            stores: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            open: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
            stats: Mutex::new(BackupStats::default()),
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

/// [`BackupService::take_over`] for a thread that does not own the service.
pub(crate) struct BackupTakeover {
    shared: Arc<BackupShared>,
}

impl BackupTakeover {
    /// As [`BackupService::take_over`].
    pub(crate) fn take_over(&self, primary: u16, epoch: u64) -> Option<Arc<BackupStore>> {
        let copy = {
            let stores = self.shared.stores.lock();
            let copies = stores.get(&primary)?;
            // A copy still catching up is fenced too (its stream stops), but not taken.
            for copy in copies.current.iter().chain(&copies.staging) {
                copy.epoch.fetch_max(epoch, Ordering::AcqRel);
                copy.fenced.store(true, Ordering::Release);
            }
            copies.current.clone()?
        };
        // The stream thread sees the flag before its next record or at its next read timeout.
        drop(copy.streaming.lock());
        Some(copy)
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

/// What a backup has read of a primary's stream and not consumed yet.
struct Incoming {
    bytes: Vec<u8>,
    start: usize,
}

impl Incoming {
    fn pending(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    fn consume(&mut self, count: usize) {
        self.start += count;
        if self.start == self.bytes.len() {
            self.bytes.clear();
            self.start = 0;
        }
    }

    /// Reads until at least `needed` bytes are pending (each read bounded by the socket's
    /// timeout, after which the stop flag is looked at), taking whatever else has arrived.
    /// Returns false when the primary closed the stream with nothing pending (a clean end:
    /// it stopped); a close inside a frame is an error.
    fn fill(
        &mut self,
        shared: &BackupShared,
        fenced: Option<&AtomicBool>,
        stream: &mut PrimaryStream,
        needed: usize,
    ) -> std::io::Result<bool> {
        if self.start > 0 && self.bytes.len() - self.start < needed {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        while self.bytes.len() - self.start < needed {
            if shared.stop.load(Ordering::Acquire) {
                return Err(std::io::Error::new(ErrorKind::Interrupted, "backup service stopped"));
            }
            if fenced.is_some_and(|fenced| fenced.load(Ordering::Acquire)) && !stream.close_for_takeover() {
                return Err(std::io::Error::new(ErrorKind::Interrupted, "the primary was failed over"));
            }
            let end = self.bytes.len();
            let room = (needed - (end - self.start)).max(REPLICATION_READ_BYTES);
            self.bytes.resize(end + room, 0);
            match stream.read(&mut self.bytes[end..]) {
                Ok(0) => {
                    self.bytes.truncate(end);
                    if self.start == self.bytes.len() {
                        return Ok(false);
                    }
                    return Err(ErrorKind::UnexpectedEof.into());
                }
                Ok(read) => self.bytes.truncate(end + read),
                Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    self.bytes.truncate(end);
                }
                Err(error) => {
                    self.bytes.truncate(end);
                    return Err(error);
                }
            }
        }
        Ok(true)
    }
}

/// A primary's stream as a backup reads it: the replication port's connection and, one-sided,
/// the log region the stream arrives in. Answers and acknowledgements go on the connection.
struct PrimaryStream {
    control: TcpStream,
    log: Option<LogReceiver>,
}

impl PrimaryStream {
    /// The primary was failed over. One-sided: closes the log region (a write landing from now
    /// on is not held) and returns true, as what landed before may be held and must still be
    /// read and applied (reads then stop once the region is drained). TCP: false, the stream
    /// stops here (nothing unapplied was acknowledged).
    fn close_for_takeover(&mut self) -> bool {
        match &mut self.log {
            Some(log) => {
                log.close();
                true
            }
            None => false,
        }
    }

    fn one_sided(&self) -> bool {
        self.log.is_some()
    }

    /// One-sided: whether the primary closed the connection (looked at without waiting).
    fn control_gone(&mut self) -> std::io::Result<bool> {
        self.control.set_nonblocking(true)?;
        let read = self.control.read(&mut [0u8; 64]);
        self.control.set_nonblocking(false)?;
        Ok(match read {
            Ok(0) => true,
            Ok(_) => false, // nothing is expected on it; ignored
            Err(error) => !matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        })
    }
}

impl Read for PrimaryStream {
    /// TCP: the connection. One-sided: the log region, looked at every
    /// `REPLICATION_APPLY_POLL_US` for at most one read timeout (`WouldBlock` then); the end of
    /// the stream once the primary closed the connection and everything that had landed was
    /// read; `Interrupted` once a region closed for a takeover is drained.
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let Some(log) = &mut self.log else { return self.control.read(out) };
        let invalid = |error: LogError| std::io::Error::new(ErrorKind::InvalidData, error);
        let deadline = Instant::now() + Duration::from_millis(REPLICATION_IO_TIMEOUT_MS);
        loop {
            let read = log.read(out).map_err(invalid)?;
            if read > 0 {
                return Ok(read);
            }
            if log.is_closed() {
                return Err(std::io::Error::new(
                    ErrorKind::Interrupted,
                    "the primary was failed over (its log is drained)",
                ));
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(REPLICATION_APPLY_POLL_US));
        }
        if self.control_gone()? {
            // What landed before the primary went is held: it is read before the end.
            return match &mut self.log {
                Some(log) => log.read(out).map_err(invalid),
                None => Ok(0),
            };
        }
        Err(ErrorKind::WouldBlock.into())
    }
}

impl Drop for PrimaryStream {
    /// The region closes before the connection does: a primary that sees the connection end
    /// has had every later write refused as not held.
    fn drop(&mut self) {
        if let Some(log) = &mut self.log {
            log.close();
        }
    }
}

impl Write for PrimaryStream {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.control.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.control.flush()
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
                    // goes on from where it is (module docs, "Delta").
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
        copy.start_journal(shared.persistence.as_ref(), lineage, applied); // a new, empty copy
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
        let log = LogReceiver::accept(&mut stream.control).map_err(|error| BackupRefusal::Log { primary, error })?;
        stream.control.set_read_timeout(Some(Duration::from_millis(REPLICATION_IO_TIMEOUT_MS)))?;
        stream.log = Some(log);
    }
    let mut acked = applied;
    let mut awaiting_snapshot = catch_up;
    loop {
        sweep(shared, &copy);
        // Acknowledge once what arrived is applied: one acknowledgement per burst (also after a
        // marker: records it followed in the same burst are acknowledged before waiting).
        let applied = copy.applied();
        if applied > acked && incoming.pending().is_empty() {
            copy.flush_journal();
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
                copy.start_journal(shared.persistence.as_ref(), lineage, value - 1);
                awaiting_snapshot = false;
                // The primary counts this link from its first acknowledgement on.
                stream.write_all(&encode_ack(value - 1, false))?;
                acked = value - 1;
            } else {
                if awaiting_snapshot || !catch_up || copy.applied() < value {
                    return Err(BackupRefusal::BadMarker { primary });
                }
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
            copy.journal_record(lsn, frame.header.epoch, record.as_ref());
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

/// Loads the snapshot that follows a snapshot marker into a fresh copy: everything up to
/// record `covers` (the snapshot's header must say so).
fn receive_snapshot(
    shared: &BackupShared,
    copy: &BackupStore,
    incoming: &mut Incoming,
    stream: &mut PrimaryStream,
    covers: u64,
) -> Result<(), BackupRefusal> {
    let primary = copy.primary;
    let started = Instant::now();
    let mut reader = SnapshotReader {
        incoming,
        shared,
        fenced: &copy.fenced,
        stream,
        chunk_left: 0,
        ended: false,
        deadline: started + Duration::from_millis(REPLICATION_SNAPSHOT_WAIT_MS_MAX),
        refusal: None,
        primary,
    };
    let source = std::path::PathBuf::from(format!("the replication stream of primary {primary}"));
    let now_ms = shared.clock.elapsed().as_millis() as u64;
    let loaded = rampkv_durable::snapshot::load_from(&mut reader, &source, &copy.store, now_ms);
    if let Some(refusal) = reader.refusal.take() {
        return Err(refusal);
    }
    let loaded = loaded.map_err(|cause| BackupRefusal::BadSnapshot { primary, cause })?;
    if loaded.lsn != covers {
        return Err(BackupRefusal::BadMarker { primary });
    }
    copy.applied.store(covers, Ordering::Release);
    log::warn!(
        "replication: loaded a snapshot of primary {primary} at record {covers} ({} keys, {} versions) in {} ms",
        loaded.counts.keys,
        loaded.counts.versions,
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The snapshot's bytes out of its chunks (module docs, "Wire"): reads end at the empty chunk.
struct SnapshotReader<'a> {
    incoming: &'a mut Incoming,
    shared: &'a BackupShared,
    fenced: &'a AtomicBool,
    stream: &'a mut PrimaryStream,
    chunk_left: usize,
    ended: bool,
    deadline: Instant,
    /// Why reading stopped, when it was the stream's fault rather than the snapshot's.
    refusal: Option<BackupRefusal>,
    primary: u16,
}

impl SnapshotReader<'_> {
    fn refuse(&mut self, refusal: BackupRefusal) -> std::io::Error {
        let error = std::io::Error::new(ErrorKind::InvalidData, refusal.to_string());
        self.refusal = Some(refusal);
        error
    }
}

impl Read for SnapshotReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.ended || out.is_empty() {
            return Ok(0);
        }
        if Instant::now() > self.deadline {
            let primary = self.primary;
            return Err(
                self.refuse(BackupRefusal::SnapshotTooSlow { primary, waited_ms: REPLICATION_SNAPSHOT_WAIT_MS_MAX })
            );
        }
        if self.chunk_left == 0 {
            if !self.incoming.fill(self.shared, Some(self.fenced), self.stream, 4)? {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            let length = u32_at(self.incoming.pending(), 0) as usize;
            self.incoming.consume(4);
            if length == 0 {
                self.ended = true;
                return Ok(0);
            }
            if length > REPLICATION_SNAPSHOT_CHUNK_BYTES {
                let (primary, max) = (self.primary, REPLICATION_SNAPSHOT_CHUNK_BYTES);
                return Err(self.refuse(BackupRefusal::SnapshotChunk { primary, length, max }));
            }
            self.chunk_left = length;
        }
        if self.incoming.pending().is_empty() && !self.incoming.fill(self.shared, Some(self.fenced), self.stream, 1)? {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let count = out.len().min(self.chunk_left).min(self.incoming.pending().len());
        out[..count].copy_from_slice(&self.incoming.pending()[..count]);
        self.incoming.consume(count);
        self.chunk_left -= count;
        Ok(count)
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
        let clock = SweepClock { monotonic_ms: now_ms, unix_ms: rampkv_core::types::wall_clock_unix_ms() };
        copy.store.sweep(&mut sweep.0, GC_SWEEP_KEYS_PER_TICK, clock, None);
    }
}

#[cfg(test)]
mod tests;
