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
//! - `write`: PREPARE, COMMIT and PUT; recovery's STATUS, ABORT and stale transactions.
//! - `update`: the single-key conditional update (read, decide, store and commit under the
//!   key's lock).
//! - `read`: the latest version, an exact version, the highest of candidates; the counters.
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
//! Keys live in `SHARD_COUNT` shards behind reader-writer locks. Reads and commits take a
//! shard's read lock (commit only does an atomic max, and replaces the key's latest version
//! under the key's own small lock, held for a pointer swap), so readers never wait for a
//! commit and never block writers for longer than one map lookup. Prepares take the write lock
//! of one shard per key.

use std::collections::VecDeque;

use ahash::AHashMap as HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::cluster::key_hash;
use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::Timestamp;
use crate::wire::MetadataRef;

mod copy;
mod gc;
mod read;
#[cfg(test)]
mod tests;
mod update;
mod validate;
mod version_map;
mod write;

pub use copy::{KeyVersions, Superseded};
pub use gc::SweepCursor;
pub use update::UpdateCheck;
use version_map::VersionMap;

/// Shards of the key map and of the pending-commit map.
const SHARD_COUNT: usize = 64;

/// Aborted transactions are remembered at least this long (a PREPARE delayed longer than this
/// could slip through; writers give up after `TXN_TIMEOUT_MS`, far less).
const ABORTED_RETENTION_MS: u64 = 60_000;

/// Past this many remembered aborts, the ones older than the retention are forgotten.
const ABORTED_REMEMBERED_MAX: usize = 4_096;

/// A key as stored.
pub type Key = Box<[u8]>;

/// A prepared transaction awaiting COMMIT on this server.
#[derive(Debug, Clone)]
pub struct PendingTxn {
    /// Its keys on this server.
    pub keys: Vec<Key>,
    /// Its whole write set (for recovery: who else to ask).
    pub write_set: Arc<[Key]>,
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
    /// RAMP-Fast: the transaction's whole write set.
    WriteSet(Arc<[Key]>),
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

    /// A borrowed view for encoding a reply.
    pub fn as_wire(&self) -> MetadataRef<'_, Key> {
        match self {
            StoredMetadata::None => MetadataRef::None,
            StoredMetadata::WriteSet(keys) => MetadataRef::WriteSet(keys),
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
}

/// Counters describing what the store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    pub keys: usize,
    pub versions: usize,
    pub value_bytes: usize,
    pub pending_transactions: usize,
    pub versions_collected: usize,
}

#[derive(Debug)]
struct StoredVersion {
    version: Arc<Version>,
    /// Set by COMMIT (under the shard's read lock, hence atomic).
    committed: AtomicBool,
}

#[derive(Debug, Default)]
struct KeyState {
    /// Only ever advanced (atomic max) with `latest` locked, so the two agree for whoever
    /// holds that lock.
    last_commit: AtomicU64,
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
    shards: Box<[RwLock<HashMap<Key, KeyState>>]>,
    /// ts of a prepared transaction -> its keys on this server, until it commits.
    pending: Box<[PendingShard]>,
    /// Transactions recovery aborted here, with when (pruned after `ABORTED_RETENTION_MS`).
    aborted: Mutex<HashMap<Timestamp, u64>>,
    grace_ms: u64,
    version_count: AtomicUsize,
    value_bytes: AtomicUsize,
    versions_collected: AtomicUsize,
}

impl Store {
    /// An empty store whose superseded versions live at least `grace_ms`.
    pub fn new(grace_ms: u64) -> Self {
        Self {
            shards: (0..SHARD_COUNT).map(|_| RwLock::new(HashMap::default())).collect(),
            pending: (0..SHARD_COUNT).map(|_| Mutex::new(HashMap::default())).collect(),
            aborted: Mutex::new(HashMap::default()),
            grace_ms,
            version_count: AtomicUsize::new(0),
            value_bytes: AtomicUsize::new(0),
            versions_collected: AtomicUsize::new(0),
        }
    }

    fn shard(&self, key: &[u8]) -> &RwLock<HashMap<Key, KeyState>> {
        // The high half of the hash, so shard choice does not correlate with partitions
        // (which use the hash modulo the partition count).
        &self.shards[((key_hash(key) >> 32) as usize) % SHARD_COUNT]
    }

    fn pending_shard(&self, ts: Timestamp) -> &PendingShard {
        // Timestamps end in the client id; mix so that one client's transactions spread out.
        &self.pending[(ts.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARD_COUNT]
    }

    fn forget_version_bytes(&self, bytes: usize) {
        self.value_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}
