//! The multi-version partition store of one server.
//!
//! # Contract
//! A PREPARE stores versions that are not visible; a COMMIT makes a transaction's versions
//! visible by advancing each key's `lastCommit` with an atomic max; a read gets the version at
//! `lastCommit`, or exactly a given version while it is stored; versions older than the latest
//! are collected once no reader can still ask for them. Each room below states its part of the
//! contract at its top.
//!
//! # Layout (bottom up: a room names only what is above it in this list)
//! - `version_map`: one key's versions by timestamp (a sorted ring buffer).
//! - this file: the store's state ([`Store`], a key's versions and its `lastCommit`, the
//!   pending and aborted transactions), versions and their metadata, the errors; of its rooms
//!   it names only `version_map`, and the others' public types to re-export them.
//! - `validate`: what a PREPARE or PUT must be before it changes anything.
//! - `gc`: marking superseded versions and collecting them, on each write and in the
//!   background sweep ([`Store::sweep`]).
//! - `expiry`: reclaiming expired keys in the sweep: their values first, the keys later.
//! - `write`: PREPARE, COMMIT and PUT; recovery's STATUS, ABORT and stale transactions.
//! - `update`: the single-key conditional update (read, decide, store and commit under the
//!   key's lock).
//! - `read`: the latest version, an exact version, the highest of candidates; the counters.
//! - `listing`: the live keys in key-hash order, page by page, and their count (SCAN, DBSIZE).
//! - `copy`: the store copied out shard by shard (snapshots, a backup's catch-up), loaded
//!   back, and another store absorbed whole (failover).
//!
//! # Representation
//! Each key keeps its committed latest version beside its version map, so `get_latest` is one
//! hash lookup and a reference-count increment, not a walk of the (often long) map. Garbage
//! collection costs each write in proportion to the versions it marks or collects, not to how
//! many versions the key holds: versions not yet seen superseded are kept in a short list, and
//! those seen superseded in a queue ordered by when.
//!
//! # Concurrency
//! Keys live in `SHARD_COUNT` shards behind reader-writer locks. Reads take a shard's read
//! lock. Prepares and commits take the write lock of one shard per key, for one map lookup and
//! the key's own work: a commit does an atomic max, replaces the key's latest version under the
//! key's own small lock (a pointer swap) and marks the version it superseded in the same visit,
//! so a key written costs one lookup per phase (two lookups, read then write lock, before
//! issue 31). Readers wait at most for that one key's work.

use std::collections::VecDeque;

use ahash::AHashMap as HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::cluster::key_hash;
use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Expiry, Timestamp};
use crate::wire::{MetadataRef, WireError, WriteSet};

mod copy;
mod expiry;
mod gc;
mod listing;
mod read;
#[cfg(test)]
mod tests;
mod update;
mod validate;
mod version_map;
mod write;

pub use copy::{KeyVersions, Superseded};
pub use expiry::SweepClock;
pub use gc::SweepCursor;
pub use listing::{is_live_at, KeyListing, ListBounds};
pub use update::UpdateCheck;
use version_map::VersionMap;

/// Shards of the key map and of the pending-commit map: a key's shard is the top
/// `SHARD_BITS` bits of its key hash, so shard `i` holds a range of hashes and the key listing
/// (`listing`) walks the shards in hash order.
const SHARD_BITS: u32 = 6;
const SHARD_COUNT: usize = 1 << SHARD_BITS;

/// A key's (or a shard's) read stamp: never read. Otherwise the stamp is the read's time in ms
/// plus one (so that a read at time 0 is not "never").
const READ_NEVER: u64 = 0;

/// A key's read stamp: it has an item slot, read one-sidedly without the server seeing it, so
/// it counts as read at every moment.
const READ_ALWAYS: u64 = u64::MAX;

/// Aborted transactions are remembered at least this long (a PREPARE delayed longer than this
/// could slip through; writers give up after `TXN_TIMEOUT_MS`, far less).
const ABORTED_RETENTION_MS: u64 = 60_000;

/// Past this many remembered aborts, the ones older than the retention are forgotten.
const ABORTED_REMEMBERED_MAX: usize = 4_096;

/// A key as stored.
pub type Key = Box<[u8]>;

/// A key as the table holds it: up to 24 bytes inline in the table's bucket, beside its state
/// (a lookup compares it without following a pointer to a separate allocation: one cache miss
/// fewer per lookup of a key not in cache; docs/performance.md), longer keys on the heap.
pub(crate) type TableKey = SmallVec<[u8; 24]>;

/// One shard's keys.
type Table = HashMap<TableKey, KeyState>;

/// A prepared transaction awaiting COMMIT on this server.
#[derive(Debug, Clone)]
pub struct PendingTxn {
    /// Its keys on this server.
    pub keys: Vec<Key>,
    /// Its whole write set (for recovery: who else to ask).
    pub write_set: WriteSet,
    /// When it was prepared here (store clock, ms).
    pub prepared_at_ms: u64,
}

/// Prepared transactions awaiting COMMIT, by timestamp (one shard of them).
type PendingShard = Mutex<HashMap<Timestamp, PendingTxn>>;

/// What a version carries about its transaction (shared by its versions on one server).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StoredMetadata {
    /// RAMP-Small and NoCC: nothing.
    #[default]
    None,
    /// RAMP-Fast: the transaction's whole write set, in its compact form: one buffer, shared
    /// by the transaction's versions (and its pending entry and log record), so a version
    /// superseded drops a reference, not a list of boxed keys.
    WriteSet(WriteSet),
    /// RAMP-Hybrid: a Bloom filter of the write set.
    Bloom(Arc<[u8]>),
}

impl StoredMetadata {
    /// Whether this is a RAMP-Fast write set of one key (the version's own: a prepare checks
    /// that the written keys are in the write set). No other version names such a version, so
    /// no round 2 asks for it: it may go as soon as it is superseded (module contract).
    pub fn names_only_its_key(&self) -> bool {
        matches!(self, StoredMetadata::WriteSet(keys) if keys.len() == 1)
    }

    /// RAMP-Fast metadata naming `keys`.
    ///
    /// # Errors
    /// More than `TXN_KEYS_MAX` keys, or a key longer than `KEY_BYTES_MAX`.
    pub fn write_set<K: AsRef<[u8]>>(keys: &[K]) -> Result<StoredMetadata, WireError> {
        WriteSet::from_keys(keys).map(StoredMetadata::WriteSet)
    }

    /// A borrowed view for encoding a reply.
    pub fn as_wire(&self) -> MetadataRef<'_, Key> {
        match self {
            StoredMetadata::None => MetadataRef::None,
            StoredMetadata::WriteSet(keys) => MetadataRef::EncodedWriteSet(keys),
            StoredMetadata::Bloom(bits) => MetadataRef::Bloom(bits),
        }
    }
}

/// One stored version of a key.
#[derive(Debug, PartialEq, Eq)]
pub struct Version {
    pub ts: Timestamp,
    pub value: Box<[u8]>,
    pub metadata: StoredMetadata,
    /// When the version stops being visible (never, a deadline, or already: a deletion); a
    /// reclaimed version's value was dropped by the sweep (`expiry` module).
    pub expiry: Expiry,
}

impl Version {
    /// A version that never expires.
    pub fn new(ts: Timestamp, value: Box<[u8]>, metadata: StoredMetadata) -> Self {
        Self { ts, value, metadata, expiry: Expiry::NEVER }
    }
}

/// One write of a PREPARE or PUT as the store takes it: a key, its value and its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreWrite {
    pub key: Key,
    pub value: Box<[u8]>,
    pub expiry: Expiry,
}

impl StoreWrite {
    /// A write that never expires.
    pub fn new(key: Key, value: Box<[u8]>) -> Self {
        Self { key, value, expiry: Expiry::NEVER }
    }
}

impl From<(Key, Box<[u8]>)> for StoreWrite {
    fn from((key, value): (Key, Box<[u8]>)) -> Self {
        Self::new(key, value)
    }
}

/// The versions a PREPARE or PUT stored, each with its key, in the order of its writes, shared
/// with the store ([`Store::prepare_keeping`]).
pub type StoredWrites = Vec<(Key, Arc<Version>)>;

/// Why the store refused an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("version {ts} of the key is not stored (collected, or never prepared)")]
    VersionGone { ts: Timestamp },
    #[error("invalid prepare: {0}")]
    InvalidPrepare(#[from] InvalidPrepare),
    #[error("transaction {ts} was aborted by recovery; it cannot be prepared")]
    Aborted { ts: Timestamp },
}

/// Why a PREPARE (or PUT) is refused before it changes anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidPrepare {
    #[error("timestamp 0 is reserved for the initial value")]
    ReservedTimestamp,
    #[error("{count} writes (need 1..={TXN_KEYS_MAX})")]
    WriteCount { count: usize },
    #[error("a write set of {count} keys (at most {TXN_KEYS_MAX})")]
    WriteSetTooLarge { count: usize },
    #[error("a written key is missing from the write set")]
    KeyNotInWriteSet,
    #[error(
        "a one-phase write (PREPARE_COMMIT) must write exactly the keys of its write set, all on this server; \
         use PREPARE and COMMIT for a transaction with writes elsewhere"
    )]
    NotWholeWriteSet,
    #[error("a key of {key_bytes} bytes or value of {value_bytes} bytes over the limits ({KEY_BYTES_MAX}, {VALUE_BYTES_MAX})")]
    TooLarge { key_bytes: usize, value_bytes: usize },
    #[error("a write's expiry {word:#x} is marked reclaimed, which only a server sets")]
    ReclaimedExpiry { word: u64 },
}

/// Counters describing what the store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    pub keys: usize,
    pub versions: usize,
    pub value_bytes: usize,
    pub pending_transactions: usize,
    pub versions_collected: usize,
    /// Expired versions whose value the sweep dropped (reclaimed), since the start.
    pub values_reclaimed: usize,
    /// Reclaimed keys removed from the store, since the start.
    pub keys_reclaimed: usize,
    /// Reclaimed keys waiting to be removed now.
    pub keys_reclaiming: usize,
}

/// A key whose value the sweep dropped (stage 1 of reclaiming, `expiry`), waiting for stage 2.
/// Held by the store, filled and emptied by `expiry` (defined here so that the store's rooms
/// name the store, never the other way).
#[derive(Debug)]
struct Reclaimed {
    /// When (the store's monotonic clock, ms).
    at_ms: u64,
    /// The reclaimed version.
    ts: Timestamp,
    key: Key,
}

#[derive(Debug)]
struct StoredVersion {
    version: Arc<Version>,
    /// Set by COMMIT (under the shard's read lock, hence atomic).
    committed: AtomicBool,
    /// Whether the version has a deadline the sweep may reclaim it at (`version.expiry`, kept
    /// beside the pointer, in what was padding): the sweep visits every key and reads this
    /// instead of the version's own block, a cache miss per key (`expiry`).
    expires: bool,
}

impl StoredVersion {
    fn new(version: Arc<Version>, committed: bool) -> Self {
        let expires = version.expiry.expires() && !version.expiry.is_reclaimed();
        Self { version, committed: AtomicBool::new(committed), expires }
    }
}

#[derive(Debug, Default)]
struct KeyState {
    /// Only ever advanced (atomic max) with `latest` locked, so the two agree for whoever
    /// holds that lock.
    last_commit: AtomicU64,
    /// When a round-1 read last read the key (a read stamp: [`READ_NEVER`], [`READ_ALWAYS`],
    /// else ms + 1). Written under the shard's read lock (an atomic max) and read under its
    /// write lock, so a read that returned is seen by every later collection.
    read_stamp: AtomicU64,
    /// The version at `last_commit` (`None` while it is 0): `get_latest`'s fast path.
    latest: Mutex<Option<Arc<Version>>>,
    versions: VersionMap<StoredVersion>,
    /// The highest timestamp ever collected for this key (0: none). A HIGHEST_OF read whose
    /// answer might have been a collected version is refused, never answered wrongly.
    collected_max_ts: Timestamp,
    /// Stored versions not yet seen superseded (uncommitted, or at or above `last_commit` when
    /// last looked): the latest and the writes in flight, so a few. Three inline: a key written
    /// again and again holds the latest before last (marked at the next write), the latest and
    /// the one being written, and allocates nothing for them.
    unmarked: SmallVec<[Timestamp; 3]>,
    /// Versions seen superseded, with when (store clock, ms), ordered by that time (collected
    /// from the front while the front has been superseded for the grace period).
    superseded: VecDeque<(u64, Timestamp)>,
}

/// The store of one server: every key it owns, with its versions.
#[derive(Debug)]
pub struct Store {
    shards: Box<[RwLock<Table>]>,
    /// Per shard: the read stamp of the last round-1 read of a key the shard did not hold; a
    /// key created in the shard starts with it (a reader may come back for its first version).
    absent_read_stamps: Box<[AtomicU64]>,
    /// Whether round-1 reads are noted, so that versions of keys nobody read for a grace period
    /// go at once (`gc`'s contract). A backup's copy, whose readers read elsewhere, does not.
    tracks_reads: bool,
    /// The latest time (ms) a call gave the store: what a COMMIT, which is given none, measures
    /// with. Never ahead of the callers' clock, so what it lets go early is safe to.
    clock_ms: AtomicU64,
    /// ts of a prepared transaction -> its keys on this server, until it commits.
    pending: Box<[PendingShard]>,
    /// Transactions recovery aborted here, with when (pruned after `ABORTED_RETENTION_MS`).
    aborted: Mutex<HashMap<Timestamp, u64>>,
    grace_ms: u64,
    version_count: AtomicUsize,
    value_bytes: AtomicUsize,
    versions_collected: AtomicUsize,
    /// Keys whose expired latest version the sweep reclaimed, oldest first, until they go
    /// (`expiry` module; bounded by `EXPIRY_RECLAIMED_KEYS_MAX`).
    reclaimed: Mutex<VecDeque<Reclaimed>>,
    /// The latest deadline of any reclaimed key removed from this store (0: none): what a
    /// round-2 read of a key the store no longer holds is answered with (`read`).
    removed_deadline_ms: AtomicU64,
    values_reclaimed: AtomicUsize,
    keys_reclaimed: AtomicUsize,
}

impl Store {
    /// An empty store whose superseded versions live at least `grace_ms` (those of a
    /// single-key write: until superseded). Its reads are not tracked: what a backup's copy of
    /// another server's store uses (its readers read that server).
    pub fn new(grace_ms: u64) -> Self {
        Self {
            shards: (0..SHARD_COUNT).map(|_| RwLock::new(HashMap::default())).collect(),
            absent_read_stamps: (0..SHARD_COUNT).map(|_| AtomicU64::new(READ_NEVER)).collect(),
            tracks_reads: false,
            clock_ms: AtomicU64::new(0),
            pending: (0..SHARD_COUNT).map(|_| Mutex::new(HashMap::default())).collect(),
            aborted: Mutex::new(HashMap::default()),
            grace_ms,
            version_count: AtomicUsize::new(0),
            value_bytes: AtomicUsize::new(0),
            versions_collected: AtomicUsize::new(0),
            reclaimed: Mutex::new(VecDeque::new()),
            removed_deadline_ms: AtomicU64::new(0),
            values_reclaimed: AtomicUsize::new(0),
            keys_reclaimed: AtomicUsize::new(0),
        }
    }

    /// [`Store::new`] for a server that serves reads: every round-1 read goes through
    /// [`Store::read_latest`], [`Store::read_last_commit`] or [`Store::get_latest_for_slot`],
    /// and superseded versions of keys no read touched for `grace_ms` go at once (`gc`'s
    /// contract).
    pub fn new_tracking_reads(grace_ms: u64) -> Self {
        Self { tracks_reads: true, ..Self::new(grace_ms) }
    }

    fn shard_index(key: &[u8]) -> usize {
        // Shards hold consecutive ranges of hashes (`shard_of_hash`).
        shard_of_hash(key_hash(key))
    }

    fn shard(&self, key: &[u8]) -> &RwLock<Table> {
        &self.shards[Self::shard_index(key)]
    }

    /// Moves the store's clock up to `now_ms` (never back).
    fn advance_clock(&self, now_ms: u64) {
        if self.clock_ms.load(Ordering::Relaxed) < now_ms {
            self.clock_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    /// Whether no reader may come back for a superseded version of the key (`gc`'s contract):
    /// its last noted read is at least a grace period before `now_ms`. Called with the key's
    /// shard write-locked.
    fn unread(&self, state: &KeyState, now_ms: u64) -> bool {
        let stamp = state.read_stamp.load(Ordering::Relaxed);
        self.tracks_reads && (stamp == READ_NEVER || (stamp - 1).saturating_add(self.grace_ms) <= now_ms)
    }

    fn pending_shard(&self, ts: Timestamp) -> &PendingShard {
        // Timestamps end in the client id; mix so that one client's transactions spread out.
        &self.pending[(ts.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARD_COUNT]
    }

    fn forget_version_bytes(&self, bytes: usize) {
        self.value_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Notes a round-1 read at `now_ms` in `stamp` (a key's, or a shard's for keys it lacks): an
/// atomic max, skipped when the stamp is already there (most reads: no write to the line).
fn note_read(stamp: &AtomicU64, now_ms: u64) {
    let read = now_ms.saturating_add(1).min(READ_ALWAYS - 1);
    if stamp.load(Ordering::Relaxed) < read {
        stamp.fetch_max(read, Ordering::Relaxed);
    }
}

/// The shard of a key hash: its top bits, so that shards hold consecutive ranges of hashes (the
/// key listing's order), and shard choice does not correlate with partitions (which use the
/// hash modulo the partition count).
fn shard_of_hash(hash: u64) -> usize {
    (hash >> (u64::BITS - SHARD_BITS)) as usize
}
