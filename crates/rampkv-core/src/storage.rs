//! The multi-version partition store of one server.
//!
//! # Contract
//! - [`Store::prepare`] stores versions that are not yet visible. Calling it again for the
//!   same (key, ts) replaces the version (a retried PREPARE is harmless).
//! - [`Store::commit`] makes the versions of a transaction visible by advancing each key's
//!   `lastCommit` with an atomic max, never a blind store: a commit of an older transaction
//!   arriving late never hides a newer one.
//! - [`Store::get_latest`] returns the version at `lastCommit` (or `None`: the initial value),
//!   [`Store::get_at`] exactly the version with a given ts, prepared or committed, or
//!   [`StoreError::VersionGone`] when it was collected or never existed.
//! - Garbage collection: a version older than its key's `lastCommit` is removed only after it
//!   has been seen superseded for at least the grace period. A reader that needs such a version
//!   (round 2) started its read after the version was prepared and before it was superseded,
//!   so a grace period longer than any read transaction means no live reader loses a version
//!   it may ask for. Versions are marked lazily, when the key is next written, which only
//!   makes them live longer. A version whose COMMIT has not arrived yet is never collected
//!   (its writer may be slow; cooperative termination will resolve a dead one).
//! - Except a version that is the only write of its RAMP-Fast transaction (its write set names
//!   its own key alone, [`StoredMetadata::names_only_its_key`]): it is removed as soon as it is
//!   seen superseded, with no grace period. Round 2 asks for exactly version `ts` of key `k`
//!   only because another key's version of transaction `ts` named `k` in its write set; a
//!   transaction that wrote `k` alone has no such sibling, so no reader can ask for its version
//!   once a newer one is the latest (a reader that got it in round 1 holds its own reference).
//!   RAMP-Small and RAMP-Hybrid versions carry no write set and keep the grace period (their
//!   round 2 names timestamps, not versions). This is what keeps a stream of single-key writes
//!   (Redis SETs) at its live set instead of ten seconds of every version written.
//! - And except the superseded versions of a key no reader may come back for: in a store that
//!   tracks reads ([`Store::new_tracking_reads`], a serving server's), every round-1 read notes
//!   its time in the key it reads ([`Store::read_latest`], [`Store::read_last_commit`]; a read
//!   of a key not stored yet notes it in the key's shard, which a key created later inherits),
//!   and a key with an item slot counts as read at every moment ([`Store::get_latest_for_slot`]:
//!   its slot is read without the server seeing it). Once a key's last noted read is a grace
//!   period old, every version of it but the latest goes at once. The argument: a round 2
//!   asks this server for a version of `k` only if the reader's round 1 read `k` here and got
//!   an older one (RAMP-Fast repairs `k` from a sibling's write set; RAMP-Small and Hybrid read
//!   every key in round 1), and that read was noted; the grace period already assumes that a
//!   read ends within it, so a reader whose round 1 is a grace period old has sent its round 2.
//!   A read the store did not see (a server that took the key over: failover) is covered by
//!   counting the key as read when it arrives ([`Store::absorb`], [`Store::restore_key`]).
//!   Were a version freed all the same, the reader is told `VersionGone` and restarts: freeing
//!   early costs a restart, never a wrong answer. This is what keeps a stream of MSETs nobody
//!   reads at its live set.
//! - A background sweep ([`Store::sweep`], a bounded number of keys per call) does for keys not
//!   written again what their next write would: marks superseded versions and collects those
//!   past the grace period.
//! - Each key keeps its committed latest version beside its version map, so `get_latest` is
//!   one hash lookup and a reference-count increment, not a walk of the (often long) map.
//!   Garbage collection costs each write in proportion to the versions it marks or collects,
//!   not to how many versions the key holds: versions not yet seen superseded are kept in a
//!   short list, and those seen superseded in a queue ordered by when.
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
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::{MetadataRef, TxnState};

mod version_map;
use version_map::VersionMap;

/// Shards of the key map and of the pending-commit map.
const SHARD_COUNT: usize = 64;

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
    shards: Box<[RwLock<HashMap<Key, KeyState>>]>,
    /// Per shard: the read stamp of the last round-1 read of a key the shard did not hold; a
    /// key created in the shard starts with it (a reader may come back for its first version).
    absent_read_stamps: Box<[AtomicU64]>,
    /// Whether round-1 reads are noted, so that versions of keys nobody read for a grace period
    /// go at once (module contract). A backup's copy, whose readers read elsewhere, does not.
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
        }
    }

    /// [`Store::new`] for a server that serves reads: every round-1 read goes through
    /// [`Store::read_latest`], [`Store::read_last_commit`] or [`Store::get_latest_for_slot`],
    /// and superseded versions of keys no read touched for `grace_ms` go at once (module
    /// contract).
    pub fn new_tracking_reads(grace_ms: u64) -> Self {
        Self { tracks_reads: true, ..Self::new(grace_ms) }
    }

    fn shard_index(key: &[u8]) -> usize {
        // The high half of the hash, so shard choice does not correlate with partitions
        // (which use the hash modulo the partition count).
        ((key_hash(key) >> 32) as usize) % SHARD_COUNT
    }

    fn shard(&self, key: &[u8]) -> &RwLock<HashMap<Key, KeyState>> {
        &self.shards[Self::shard_index(key)]
    }

    /// Moves the store's clock up to `now_ms` (never back).
    fn advance_clock(&self, now_ms: u64) {
        if self.clock_ms.load(Ordering::Relaxed) < now_ms {
            self.clock_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    /// Whether no reader may come back for a superseded version of the key (module contract):
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

    /// Stores `writes` as prepared versions of transaction `ts`. Everything is validated first,
    /// so an invalid prepare changes nothing. `now_ms` is the caller's monotonic clock.
    pub fn prepare(
        &self,
        ts: Timestamp,
        metadata: StoredMetadata,
        write_set: Arc<[Key]>,
        writes: Vec<(Key, Box<[u8]>)>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.prepare_keeping(ts, metadata, write_set, writes, now_ms, None)
    }

    /// [`Store::prepare`], and when `stored` is given, each version stored is pushed to it in
    /// the order of `writes` (shared, not copied: what a server's log encodes). Nothing is
    /// pushed when the prepare is refused.
    pub fn prepare_keeping(
        &self,
        ts: Timestamp,
        metadata: StoredMetadata,
        write_set: Arc<[Key]>,
        writes: Vec<(Key, Box<[u8]>)>,
        now_ms: u64,
        mut stored: Option<&mut StoredWrites>,
    ) -> Result<(), StoreError> {
        validate_prepare(ts, &metadata, &writes)?;
        if self.aborted.lock().contains_key(&ts) {
            return Err(StoreError::Aborted { ts });
        }
        self.advance_clock(now_ms);
        let mut keys: Vec<Key> = Vec::with_capacity(writes.len());
        for (key, value) in writes {
            let value_bytes = value.len();
            let version = Arc::new(Version { ts, value, metadata: metadata.clone() });
            if let Some(stored) = stored.as_deref_mut() {
                stored.push((key.clone(), Arc::clone(&version)));
            }
            let index = Self::shard_index(&key);
            let mut shard = self.shards[index].write();
            if !shard.contains_key(&key) {
                // A reader that found the key missing may come back for this version.
                let read_stamp = AtomicU64::new(self.absent_read_stamps[index].load(Ordering::Relaxed));
                shard.insert(key.clone(), KeyState { read_stamp, ..KeyState::default() });
            }
            let state = shard.get_mut(&key).expect("inserted above");
            let replaced = state.versions.insert(ts, StoredVersion { version, committed: AtomicBool::new(false) });
            match replaced {
                Some(old) => self.forget_version_bytes(old.version.value.len()),
                None => {
                    self.version_count.fetch_add(1, Ordering::Relaxed);
                }
            }
            // A replaced version may already have been marked superseded; collection checks
            // that what it removes is committed, so listing it again is what keeps it.
            if !state.unmarked.contains(&ts) {
                state.unmarked.push(ts);
            }
            self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
            self.collect_superseded(state, now_ms);
            drop(shard);
            // A key written twice (a hostile client, or S2PL staging a retried attempt's writes
            // twice) keeps its last value and is committed once.
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        // A second PREPARE of a pending transaction adds its keys: after a failover one server
        // serves the partitions of two, and a client sends it one PREPARE per partition's
        // former server (replacing the list would leave the first PREPARE's versions pending
        // for ever: never committed, invisible).
        let mut pending = self.pending_shard(ts).lock();
        match pending.get_mut(&ts) {
            Some(existing) => {
                for key in keys {
                    if !existing.keys.contains(&key) {
                        existing.keys.push(key);
                    }
                }
            }
            None => {
                pending.insert(ts, PendingTxn { keys, write_set, prepared_at_ms: now_ms });
            }
        }
        Ok(())
    }

    /// A one-phase write (PREPARE_COMMIT): stores `writes` of transaction `ts` and makes them
    /// visible, as [`Store::prepare_keeping`] then [`Store::commit_keys`] would, without a
    /// pending entry (nothing waits for a COMMIT, so recovery has nothing to ask about). The
    /// caller checked that `writes` are the transaction's whole write set. Every version is
    /// stored before any becomes visible, so a reader that sees one and repairs another in
    /// round 2 finds it; a single write is stored and made visible under one lock and one
    /// lookup of its key. Each version stored goes to `stored` (the log's record), each key
    /// committed to `committed` (the item slots'), when given. Validated first: an invalid or
    /// aborted write changes nothing.
    pub fn prepare_commit_keeping(
        &self,
        ts: Timestamp,
        metadata: StoredMetadata,
        writes: Vec<(Key, Box<[u8]>)>,
        now_ms: u64,
        mut stored: Option<&mut StoredWrites>,
        mut committed: Option<&mut Vec<Key>>,
    ) -> Result<(), StoreError> {
        validate_prepare(ts, &metadata, &writes)?;
        if self.aborted.lock().contains_key(&ts) {
            return Err(StoreError::Aborted { ts });
        }
        self.advance_clock(now_ms);
        let single = writes.len() == 1;
        let mut keys: SmallVec<[Key; 4]> = SmallVec::new();
        for (key, value) in writes {
            let value_bytes = value.len();
            let version = Arc::new(Version { ts, value, metadata: metadata.clone() });
            if let Some(stored) = stored.as_deref_mut() {
                stored.push((key.clone(), Arc::clone(&version)));
            }
            if let Some(committed) = committed.as_deref_mut() {
                committed.push(key.clone());
            }
            let index = Self::shard_index(&key);
            let mut shard = self.shards[index].write();
            let absent_read = &self.absent_read_stamps[index];
            // One lookup; the key moves in only if it is new (a key written again is dropped:
            // the map holds its own).
            let keep_key = !single && !keys.contains(&key);
            let key_for_later = keep_key.then(|| key.clone());
            let state = shard.entry(key).or_insert_with(|| KeyState {
                // A reader that found the key missing may come back for this version.
                read_stamp: AtomicU64::new(absent_read.load(Ordering::Relaxed)),
                ..KeyState::default()
            });
            let replaced =
                state.versions.insert(ts, StoredVersion { version, committed: AtomicBool::new(false) });
            match replaced {
                Some(old) => self.forget_version_bytes(old.version.value.len()),
                None => {
                    self.version_count.fetch_add(1, Ordering::Relaxed);
                }
            }
            if !state.unmarked.contains(&ts) {
                state.unmarked.push(ts);
            }
            self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
            if single {
                // Stored and visible under this one lock: nobody can see it only stored.
                self.commit_locked(state, ts, now_ms);
            } else {
                self.collect_superseded(state, now_ms);
            }
            drop(shard);
            keys.extend(key_for_later);
        }
        for key in &keys {
            let mut shard = self.shard(key).write();
            let state = shard.get_mut(key).expect("a key stored above stays");
            self.commit_locked(state, ts, now_ms);
        }
        Ok(())
    }

    /// Makes version `ts` of a key (stored, not yet committed) visible and collects what it
    /// supersedes. Called with the key's shard write-locked.
    fn commit_locked(&self, state: &mut KeyState, ts: Timestamp, now_ms: u64) {
        let stored = state.versions.get(&ts).expect("a version stored is not collected before its commit");
        let committed_before = stored.committed.swap(true, Ordering::AcqRel);
        assert!(!committed_before, "version {ts} committed twice");
        let mut latest = state.latest.lock();
        let before = state.last_commit.load(Ordering::Acquire);
        if ts > before {
            *latest = Some(Arc::clone(&stored.version));
        }
        let previous = state.last_commit.fetch_max(ts, Ordering::AcqRel);
        // lastCommit only moves forward, and only with `latest` locked, so the two agree.
        assert_eq!(previous, before, "lastCommit moved without its lock");
        drop(latest);
        self.collect_superseded(state, now_ms);
    }

    /// Makes transaction `ts` visible on this server. Returns how many keys it advanced
    /// (0 for an unknown or already committed `ts`: a retried COMMIT is harmless).
    pub fn commit(&self, ts: Timestamp) -> usize {
        self.commit_keys(ts).len()
    }

    /// [`Store::commit`], returning the keys it committed (empty for an unknown or already
    /// committed `ts`), for the item slots to publish.
    pub fn commit_keys(&self, ts: Timestamp) -> Vec<Key> {
        let Some(PendingTxn { keys, .. }) = self.pending_shard(ts).lock().remove(&ts) else {
            return Vec::new();
        };
        for key in &keys {
            let shard = self.shard(key).read();
            // A version is prepared before it is committed, and committed once: the pending
            // entry just taken is its prepare's, and a pending version is never collected.
            let state = shard.get(key).expect("a pending key has a prepared version");
            let stored = state.versions.get(&ts).expect("a pending version is never collected");
            let committed_before = stored.committed.swap(true, Ordering::AcqRel);
            assert!(!committed_before, "version {ts} committed twice");
            let mut latest = state.latest.lock();
            let before = state.last_commit.load(Ordering::Acquire);
            let mut replaced_goes = false;
            if ts > before {
                let replaced = latest.replace(Arc::clone(&stored.version));
                replaced_goes = replaced.is_some_and(|version| {
                    version.metadata.names_only_its_key() || self.unread(state, self.clock_ms.load(Ordering::Relaxed))
                });
            }
            let previous = state.last_commit.fetch_max(ts, Ordering::AcqRel);
            // lastCommit only moves forward, and only with `latest` locked, so the two agree.
            assert_eq!(previous, before, "lastCommit moved without its lock");
            debug_assert_eq!(
                latest.as_ref().map_or(TIMESTAMP_INITIAL, |version| version.ts),
                state.last_commit.load(Ordering::Acquire),
                "the latest version is the one at lastCommit"
            );
            drop(latest);
            drop(shard);
            if replaced_goes {
                // The version this commit superseded can go now (alone in its write set, or no
                // reader may come back for it: module contract): without this it would wait for
                // the key's next write, holding its value meanwhile.
                let mut shard = self.shard(key).write();
                let state = shard.get_mut(key).expect("a committed key stays");
                self.mark_superseded(state, None);
            }
        }
        keys
    }

    /// The keys transaction `ts` has prepared here and not committed yet (empty: none).
    pub fn pending_keys(&self, ts: Timestamp) -> Vec<Key> {
        self.pending_shard(ts).lock().get(&ts).map_or_else(Vec::new, |pending| pending.keys.clone())
    }

    /// Stores `writes` of transaction `ts` and makes them visible at once, key by key, with no
    /// metadata: NoCC, which promises no atomicity across keys.
    pub fn put(&self, ts: Timestamp, writes: Vec<(Key, Box<[u8]>)>, now_ms: u64) -> Result<(), StoreError> {
        self.put_keeping(ts, writes, now_ms, None)
    }

    /// [`Store::put`], pushing each version stored to `stored` as [`Store::prepare_keeping`].
    pub fn put_keeping(
        &self,
        ts: Timestamp,
        writes: Vec<(Key, Box<[u8]>)>,
        now_ms: u64,
        stored: Option<&mut StoredWrites>,
    ) -> Result<(), StoreError> {
        self.prepare_keeping(ts, StoredMetadata::None, Arc::from([]), writes, now_ms, stored)?;
        self.commit(ts);
        Ok(())
    }

    /// Recovery: what this store knows of transaction `ts` on `keys` (its keys here). A
    /// transaction never prepared here is from now on aborted here, so that a PREPARE still in
    /// flight is refused and its writer can never commit it anywhere.
    pub fn status(&self, ts: Timestamp, keys: &[Key], now_ms: u64) -> TxnState {
        if self.aborted.lock().contains_key(&ts) {
            return TxnState::Aborted;
        }
        let mut state = TxnState::Unknown;
        for key in keys {
            let shard = self.shard(key).read();
            if let Some(stored) = shard.get(key).and_then(|entry| entry.versions.get(&ts)) {
                if stored.committed.load(Ordering::Acquire) {
                    return TxnState::Committed;
                }
                state = TxnState::Prepared;
            }
        }
        if state == TxnState::Unknown {
            self.remember_aborted(ts, now_ms);
        }
        state
    }

    /// Recovery: drops the uncommitted versions of `ts` and refuses it from now on.
    pub fn abort(&self, ts: Timestamp, now_ms: u64) {
        self.remember_aborted(ts, now_ms);
        let Some(pending) = self.pending_shard(ts).lock().remove(&ts) else {
            return;
        };
        for key in &pending.keys {
            let mut shard = self.shard(key).write();
            let Some(state) = shard.get_mut(key) else { continue };
            let committed = state.versions.get(&ts).is_some_and(|stored| stored.committed.load(Ordering::Acquire));
            if !committed {
                if let Some(removed) = state.versions.remove(&ts) {
                    self.forget_version_bytes(removed.version.value.len());
                    self.version_count.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether transaction `ts` was aborted here (by recovery, or ended unresolved) and is
    /// still remembered (at least `ABORTED_RETENTION_MS`).
    pub fn was_aborted(&self, ts: Timestamp) -> bool {
        self.aborted.lock().contains_key(&ts)
    }

    /// Garbage-collects up to `keys_max` keys from where `cursor` stands (shard by shard, round
    /// and round): what a write of each would collect ([`Store::prepare`]). Returns the keys
    /// visited. Keys inserted while a shard is walked may be visited twice or skipped until
    /// the next round: harmless, a sweep only collects what may go.
    pub fn sweep(&self, cursor: &mut SweepCursor, keys_max: usize, now_ms: u64) -> usize {
        self.advance_clock(now_ms);
        let mut visited = 0;
        for _ in 0..SHARD_COUNT {
            if visited >= keys_max {
                break;
            }
            let mut shard = self.shards[cursor.shard % SHARD_COUNT].write();
            let mut taken = 0;
            for state in shard.values_mut().skip(cursor.offset).take(keys_max - visited) {
                self.collect_superseded(state, now_ms);
                state.versions.shrink_at_rest();
                taken += 1;
            }
            let keys = shard.len();
            drop(shard);
            visited += taken;
            cursor.offset += taken;
            if cursor.offset < keys {
                break; // the budget ran out inside this shard
            }
            cursor.shard = (cursor.shard + 1) % SHARD_COUNT;
            cursor.offset = 0;
        }
        visited
    }

    /// Prepared transactions waiting for COMMIT since before `prepared_before_ms`.
    pub fn stale_pending(&self, prepared_before_ms: u64) -> Vec<(Timestamp, PendingTxn)> {
        self.pending
            .iter()
            .flat_map(|shard| {
                let shard = shard.lock();
                shard
                    .iter()
                    .filter(|(_, pending)| pending.prepared_at_ms < prepared_before_ms)
                    .map(|(ts, pending)| (*ts, pending.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn remember_aborted(&self, ts: Timestamp, now_ms: u64) {
        let mut aborted = self.aborted.lock();
        if aborted.len() >= ABORTED_REMEMBERED_MAX {
            aborted.retain(|_, at_ms| now_ms.saturating_sub(*at_ms) < ABORTED_RETENTION_MS);
        }
        aborted.insert(ts, now_ms);
    }

    /// The highest stored version of `key` whose timestamp is in `candidates`, prepared or
    /// committed (RAMP-Small and RAMP-Hybrid round 2); `Ok(None)` when none is stored.
    /// `VersionGone` when a candidate above the best stored one may have been collected: the
    /// answer could be wrong, so the reader must restart.
    pub fn get_highest_of(&self, key: &[u8], candidates: &[Timestamp]) -> Result<Option<Arc<Version>>, StoreError> {
        let shard = self.shard(key).read();
        let Some(state) = shard.get(key) else {
            return Ok(None);
        };
        let best = candidates.iter().filter_map(|ts| state.versions.get(ts)).max_by_key(|stored| stored.version.ts);
        let best_ts = best.map_or(TIMESTAMP_INITIAL, |stored| stored.version.ts);
        let maybe_collected = candidates
            .iter()
            .find(|&&ts| ts > best_ts && ts <= state.collected_max_ts && !state.versions.contains_key(&ts));
        if let Some(&ts) = maybe_collected {
            return Err(StoreError::VersionGone { ts });
        }
        Ok(best.map(|stored| Arc::clone(&stored.version)))
    }

    /// The latest committed version of `key`, or `None` when it has none (initial value). Not
    /// noted as a read: for what is no transaction's round 1 (S2PL, tests, statistics).
    pub fn get_latest(&self, key: &[u8]) -> Option<Arc<Version>> {
        let shard = self.shard(key).read();
        let state = shard.get(key)?;
        let latest = state.latest.lock().clone();
        latest
    }

    /// [`Store::get_latest`] for a round-1 read at `now_ms`, noted in the key (module
    /// contract: a reader may come back for a version it did not get).
    pub fn read_latest(&self, key: &[u8], now_ms: u64) -> Option<Arc<Version>> {
        let index = Self::shard_index(key);
        let shard = self.shards[index].read();
        let Some(state) = shard.get(key) else {
            note_read(&self.absent_read_stamps[index], now_ms);
            return None;
        };
        note_read(&state.read_stamp, now_ms);
        let latest = state.latest.lock().clone();
        latest
    }

    /// [`Store::last_commit`] for a round-1 read at `now_ms` (RAMP-Small's), noted as
    /// [`Store::read_latest`] notes it.
    pub fn read_last_commit(&self, key: &[u8], now_ms: u64) -> Timestamp {
        let index = Self::shard_index(key);
        let shard = self.shards[index].read();
        let Some(state) = shard.get(key) else {
            note_read(&self.absent_read_stamps[index], now_ms);
            return TIMESTAMP_INITIAL;
        };
        note_read(&state.read_stamp, now_ms);
        state.last_commit.load(Ordering::Acquire)
    }

    /// [`Store::get_latest`] for an item slot: from now on the key counts as read at every
    /// moment (its slot is read one-sidedly, without the server seeing it), so its superseded
    /// versions keep the whole grace period.
    pub fn get_latest_for_slot(&self, key: &[u8]) -> Option<Arc<Version>> {
        let shard = self.shard(key).read();
        let state = shard.get(key)?;
        if state.read_stamp.load(Ordering::Relaxed) != READ_ALWAYS {
            state.read_stamp.store(READ_ALWAYS, Ordering::Relaxed);
        }
        let latest = state.latest.lock().clone();
        latest
    }

    /// Exactly version `ts` of `key`, prepared or committed.
    pub fn get_at(&self, key: &[u8], ts: Timestamp) -> Result<Arc<Version>, StoreError> {
        let shard = self.shard(key).read();
        shard
            .get(key)
            .and_then(|state| state.versions.get(&ts))
            .map(|stored| Arc::clone(&stored.version))
            .ok_or(StoreError::VersionGone { ts })
    }

    /// The `lastCommit` of `key` (0 when never committed).
    pub fn last_commit(&self, key: &[u8]) -> Timestamp {
        let shard = self.shard(key).read();
        shard.get(key).map_or(TIMESTAMP_INITIAL, |state| state.last_commit.load(Ordering::Acquire))
    }

    /// What the store holds now.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            keys: self.shards.iter().map(|shard| shard.read().len()).sum(),
            versions: self.version_count.load(Ordering::Relaxed),
            value_bytes: self.value_bytes.load(Ordering::Relaxed),
            pending_transactions: self.pending.iter().map(|shard| shard.lock().len()).sum(),
            versions_collected: self.versions_collected.load(Ordering::Relaxed),
        }
    }

    /// Marks versions below `lastCommit` as superseded and removes those marked longer ago
    /// than the grace period. Called with the key's shard write-locked.
    fn collect_superseded(&self, state: &mut KeyState, now_ms: u64) {
        let last_commit = state.last_commit.load(Ordering::Acquire);
        self.mark_superseded(state, Some(now_ms));
        // No reader may come back for any of them: the whole queue may go (module contract).
        let unread = self.unread(state, now_ms);
        let KeyState { versions, superseded, collected_max_ts, .. } = state;
        while let Some(&(superseded_at_ms, ts)) = superseded.front() {
            if !unread && now_ms.saturating_sub(superseded_at_ms) < self.grace_ms {
                break;
            }
            superseded.pop_front();
            match versions.get(&ts) {
                None => continue, // aborted, or listed twice and already collected
                Some(stored) if !stored.committed.load(Ordering::Acquire) => {
                    // Replaced by a retried PREPARE since it was marked: listed again above.
                    continue;
                }
                Some(_) => {}
            }
            // Only a committed version superseded by a newer commit is ever collected.
            assert!(ts < last_commit, "collecting version {ts}, not below lastCommit {last_commit}");
            self.remove_collected(versions, collected_max_ts, ts);
        }
        // A key at rest gives its queue's memory back (geometric: amortized O(1) per entry).
        if superseded.len() <= superseded.capacity() / 4 {
            superseded.shrink_to_fit();
        }
    }

    /// Walks the versions not yet seen superseded: a committed one below `lastCommit` is
    /// superseded from now on. One alone in its write set, or of a key no reader may come back
    /// for, is removed at once (no round 2 can ask for it: module contract); another is queued
    /// as superseded at `now_ms`, or, without a clock (COMMIT), left for the next call that has
    /// one. An uncommitted version waits for its COMMIT (a slow writer's version is never
    /// collected). Called with the key's shard write-locked.
    fn mark_superseded(&self, state: &mut KeyState, now_ms: Option<u64>) {
        let last_commit = state.last_commit.load(Ordering::Acquire);
        // Without a clock, the store's: behind the caller's, so it lets go of no more.
        let unread = self.unread(state, now_ms.unwrap_or_else(|| self.clock_ms.load(Ordering::Relaxed)));
        let KeyState { versions, unmarked, superseded, collected_max_ts, .. } = state;
        unmarked.retain(|&mut ts| {
            let Some(stored) = versions.get(&ts) else {
                return false; // aborted
            };
            if ts >= last_commit || !stored.committed.load(Ordering::Acquire) {
                return true;
            }
            if unread || stored.version.metadata.names_only_its_key() {
                self.remove_collected(versions, collected_max_ts, ts);
                return false;
            }
            let Some(now_ms) = now_ms else {
                return true;
            };
            // Kept in order of time: callers' clocks may disagree a little, so a time can be
            // below the newest listed (then it goes before it, mostly at the end).
            match superseded.back() {
                Some(&(newest_ms, _)) if newest_ms > now_ms => {
                    let position = superseded.partition_point(|&(at_ms, _)| at_ms <= now_ms);
                    superseded.insert(position, (now_ms, ts));
                }
                _ => superseded.push_back((now_ms, ts)),
            }
            false
        });
        if unmarked.spilled() && unmarked.len() <= unmarked.inline_size() {
            unmarked.shrink_to_fit(); // back inline after a burst of writes in flight
        }
    }

    /// Removes collected version `ts` (present) of a key and counts it.
    fn remove_collected(
        &self,
        versions: &mut VersionMap<StoredVersion>,
        collected_max_ts: &mut Timestamp,
        ts: Timestamp,
    ) {
        *collected_max_ts = (*collected_max_ts).max(ts);
        let removed = versions.remove(&ts).expect("a version present is collected");
        self.forget_version_bytes(removed.version.value.len());
        self.version_count.fetch_sub(1, Ordering::Relaxed);
        self.versions_collected.fetch_add(1, Ordering::Relaxed);
    }

    fn forget_version_bytes(&self, bytes: usize) {
        self.value_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Where a background sweep stands ([`Store::sweep`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SweepCursor {
    shard: usize,
    offset: usize,
}

/// One key's stored state as a snapshot copies it ([`Store::shard_versions`]) and a restart
/// loads it back ([`Store::restore_key`]).
#[derive(Debug, Clone)]
pub struct KeyVersions {
    pub key: Key,
    /// The highest timestamp ever collected for the key (0: none), so that a HIGHEST_OF read
    /// after a restart still refuses rather than answer below a collected version.
    pub collected_max_ts: Timestamp,
    /// Its versions in timestamp order, each with whether it is committed.
    pub versions: Vec<(Arc<Version>, bool)>,
}

/// Which committed versions [`Store::shard_versions`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Superseded {
    /// Every version (a backup's catch-up copy: the exact store).
    Keep,
    /// A key's committed versions older than its newest committed one are left out, as if
    /// garbage collection had collected them when the copy was taken, and the key's
    /// `collected_max_ts` is raised past them, as a collection raises it: a read that would
    /// need one is refused, never answered wrongly (a snapshot file). Leaving them out under
    /// the shard's lock, not after, spares a shared pointer per version of the copy.
    LeaveOut,
}

/// One key's copy (called under its shard's lock).
fn key_versions(key: &Key, state: &KeyState, superseded: Superseded) -> KeyVersions {
    let copy = |stored: &StoredVersion| (Arc::clone(&stored.version), stored.committed.load(Ordering::Acquire));
    let mut collected_max_ts = state.collected_max_ts;
    let versions = match superseded {
        Superseded::Keep => state.versions.values().map(copy).collect(),
        Superseded::LeaveOut => {
            // What is kept is listed in `unmarked` (every uncommitted version, and every one at
            // or above lastCommit, is: `mark_superseded` keeps them there), so the copy costs
            // the few versions in flight, not the thousands a key written often holds through
            // the grace period. lastCommit is the newest committed version's timestamp (the
            // latest is never collected).
            let last_commit = state.last_commit.load(Ordering::Acquire);
            let mut listed: SmallVec<[Timestamp; 8]> = state.unmarked.iter().copied().collect();
            listed.sort_unstable();
            let kept = listed
                .into_iter()
                .filter_map(|ts| state.versions.get(&ts))
                .filter(|stored| stored.version.ts >= last_commit || !stored.committed.load(Ordering::Acquire))
                .map(copy)
                .collect();
            // The newest version left out: the newest committed one below lastCommit.
            let newest_left_out = state
                .versions
                .values()
                .rev()
                .skip_while(|stored| stored.version.ts >= last_commit)
                .find(|stored| stored.committed.load(Ordering::Acquire));
            if let Some(stored) = newest_left_out {
                collected_max_ts = collected_max_ts.max(stored.version.ts);
            }
            kept
        }
    };
    KeyVersions { key: key.clone(), collected_max_ts, versions }
}

/// Persistence support: copying the store out shard by shard, and loading it back.
///
/// # Why a snapshot taken under concurrent writes is enough
/// A snapshot copies one shard at a time, each under that shard's read lock, while writers go
/// on; it sees every change completed before it started and some completed during the copy.
/// The persistence layer records the log position before it starts and replays every record
/// after that position over the loaded copy. The store's own operations are what replay runs
/// (`prepare`, `commit`, `abort`, `put`), and re-applying one that the copy already reflects
/// leaves the same state: a PREPARE replaces its version with the same bytes (a COMMIT after
/// it in the log commits it again), a COMMIT of a committed or unknown transaction does
/// nothing, an ABORT of an aborted one only remembers it again, lastCommit is a max. The
/// restore functions below accept such a copy, where a COMMIT may have been seen on one key
/// and not yet on another, and pending transactions are rebuilt from the prepared versions
/// actually loaded, so the store's invariant (a pending key has its prepared version) holds
/// whatever the copy caught.
impl Store {
    /// How many shards [`Store::shard_versions`] takes (0..this).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Every key of shard `shard` with its versions, copied under the shard's read lock (the
    /// versions are shared, not copied: a snapshot holds them while it writes them out).
    /// Returns nothing for a shard index out of range.
    pub fn shard_versions(&self, shard: usize, superseded: Superseded) -> Vec<KeyVersions> {
        let Some(shard) = self.shards.get(shard) else {
            return Vec::new();
        };
        let shard = shard.read();
        shard.iter().map(|(key, state)| key_versions(key, state, superseded)).collect()
    }

    /// The transactions recovery aborted here and still remembers.
    pub fn aborted_transactions(&self) -> Vec<Timestamp> {
        self.aborted.lock().keys().copied().collect()
    }

    /// Loads one key's versions (from a snapshot): versions with the same timestamp replace
    /// what is stored, committed ones advance lastCommit (a max) and the latest version. An
    /// uncommitted version waits for [`Store::restore_pending`] to name its transaction
    /// pending. Lengths must be within the limits (the snapshot decoder checks them).
    pub fn restore_key(&self, entry: KeyVersions, now_ms: u64) {
        let KeyVersions { key, collected_max_ts, versions } = entry;
        self.advance_clock(now_ms);
        let mut shard = self.shard(&key).write();
        let state = shard.entry(key).or_default();
        // Its readers, if any, read another store (a restart's, a failed primary's): it counts
        // as read now, so what it brings keeps the grace period (module contract).
        note_read(&state.read_stamp, now_ms);
        state.collected_max_ts = state.collected_max_ts.max(collected_max_ts);
        for (version, committed) in versions {
            let ts = version.ts;
            debug_assert!(ts != TIMESTAMP_INITIAL && version.value.len() <= VALUE_BYTES_MAX);
            let value_bytes = version.value.len();
            let stored = StoredVersion { version: Arc::clone(&version), committed: AtomicBool::new(committed) };
            match state.versions.insert(ts, stored) {
                Some(old) => self.forget_version_bytes(old.version.value.len()),
                None => {
                    self.version_count.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
            if !state.unmarked.contains(&ts) {
                state.unmarked.push(ts);
            }
            if committed {
                let mut latest = state.latest.lock();
                if ts > state.last_commit.load(Ordering::Acquire) {
                    *latest = Some(version);
                }
                state.last_commit.fetch_max(ts, Ordering::AcqRel);
            }
        }
        self.collect_superseded(state, now_ms);
    }

    /// Names transaction `ts` pending on those of `keys` that hold an uncommitted version `ts`
    /// (keys without one are left out, so a COMMIT never looks for a version that is not
    /// there). Returns how many keys that is; with none, nothing is recorded.
    pub fn restore_pending(&self, ts: Timestamp, keys: Vec<Key>, write_set: Arc<[Key]>, now_ms: u64) -> usize {
        let keys: Vec<Key> = keys
            .into_iter()
            .filter(|key| {
                let shard = self.shard(key).read();
                let stored = shard.get(key).and_then(|state| state.versions.get(&ts));
                stored.is_some_and(|stored| !stored.committed.load(Ordering::Acquire))
            })
            .collect();
        let count = keys.len();
        if count > 0 {
            self.pending_shard(ts).lock().insert(ts, PendingTxn { keys, write_set, prepared_at_ms: now_ms });
        }
        count
    }

    /// Empties the store (a restart that loaded part of a damaged snapshot starts over).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.write().clear();
        }
        for pending in self.pending.iter() {
            pending.lock().clear();
        }
        self.aborted.lock().clear();
        self.version_count.store(0, Ordering::Relaxed);
        self.value_bytes.store(0, Ordering::Relaxed);
        self.versions_collected.store(0, Ordering::Relaxed);
    }

    /// Remembers `ts` as aborted here (from a snapshot), as recovery's abort does.
    pub fn restore_aborted(&self, ts: Timestamp, now_ms: u64) {
        self.remember_aborted(ts, now_ms);
    }

    /// Moves everything `source` holds into this store and leaves `source` empty (failover:
    /// a promoted backup takes its copy of the failed primary's store in). A key this store
    /// does not hold moves whole, without a copy of its versions (the two stores shard keys
    /// alike, so shard `i` goes to shard `i`); a key it holds gets `source`'s versions as
    /// [`Store::restore_key`] would give them. Pending transactions move too (the keys of one
    /// pending in both are joined), and so do remembered aborts. Superseded versions are
    /// counted as superseded `now_ms` (this store's clock: the grace starts again). The keys
    /// moved are appended to `keys` when given. Returns how many keys moved.
    pub fn absorb(&self, source: &Store, now_ms: u64, mut keys: Option<&mut Vec<Key>>) -> usize {
        debug_assert_eq!(self.shards.len(), source.shards.len());
        self.advance_clock(now_ms);
        let mut moved = 0;
        for (into, from) in self.shards.iter().zip(source.shards.iter()) {
            let taken = std::mem::take(&mut *from.write());
            let mut held_here = Vec::new();
            let mut into = into.write();
            for (key, mut state) in taken {
                moved += 1;
                if let Some(keys) = keys.as_deref_mut() {
                    keys.push(key.clone());
                }
                let value_bytes: usize = state.versions.values().map(|stored| stored.version.value.len()).sum();
                let version_count = state.versions.values().count();
                source.version_count.fetch_sub(version_count, Ordering::Relaxed);
                source.forget_version_bytes(value_bytes);
                if into.contains_key(&key) {
                    let versions = state
                        .versions
                        .values()
                        .map(|stored| (Arc::clone(&stored.version), stored.committed.load(Ordering::Acquire)))
                        .collect();
                    held_here.push(KeyVersions { key, collected_max_ts: state.collected_max_ts, versions });
                    continue;
                }
                for entry in state.superseded.iter_mut() {
                    entry.0 = now_ms;
                }
                // Read at the failed primary, as far as this store knows: read now.
                note_read(&state.read_stamp, now_ms);
                self.version_count.fetch_add(version_count, Ordering::Relaxed);
                self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
                into.insert(key, state);
            }
            drop(into);
            for entry in held_here {
                self.restore_key(entry, now_ms);
            }
        }
        for from in source.pending.iter() {
            for (ts, pending) in std::mem::take(&mut *from.lock()) {
                let mut into = self.pending_shard(ts).lock();
                match into.get_mut(&ts) {
                    Some(held) => {
                        for key in pending.keys {
                            if !held.keys.contains(&key) {
                                held.keys.push(key);
                            }
                        }
                    }
                    None => {
                        into.insert(ts, PendingTxn { prepared_at_ms: now_ms, ..pending });
                    }
                }
            }
        }
        for (ts, _) in std::mem::take(&mut *source.aborted.lock()) {
            self.remember_aborted(ts, now_ms);
        }
        moved
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

fn validate_prepare(ts: Timestamp, metadata: &StoredMetadata, writes: &[(Key, Box<[u8]>)]) -> Result<(), StoreError> {
    let invalid = |why: InvalidPrepare| Err(StoreError::InvalidPrepare(why));
    if ts == TIMESTAMP_INITIAL {
        return invalid(InvalidPrepare::ReservedTimestamp);
    }
    if writes.is_empty() || writes.len() > TXN_KEYS_MAX {
        return invalid(InvalidPrepare::WriteCount { count: writes.len() });
    }
    if let StoredMetadata::WriteSet(write_set) = metadata {
        if write_set.len() > TXN_KEYS_MAX {
            return invalid(InvalidPrepare::WriteSetTooLarge { count: write_set.len() });
        }
        if writes.iter().any(|(key, _)| !write_set.contains(key)) {
            return invalid(InvalidPrepare::KeyNotInWriteSet);
        }
    }
    match writes.iter().find(|(key, value)| key.len() > KEY_BYTES_MAX || value.len() > VALUE_BYTES_MAX) {
        Some((key, value)) => invalid(InvalidPrepare::TooLarge { key_bytes: key.len(), value_bytes: value.len() }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn key(text: &str) -> Key {
        text.as_bytes().into()
    }

    fn write_set(keys: &[&str]) -> StoredMetadata {
        StoredMetadata::WriteSet(keys.iter().map(|text| key(text)).collect())
    }

    /// The story: S2PL over a connection that reorders its messages staged a retried attempt's
    /// writes twice, and its COMMIT_LOCKED put the same key twice in one transaction; the new
    /// commit-once assertion fired. A key written twice keeps its last value, committed once.
    #[test]
    fn a_key_written_twice_in_one_transaction_keeps_its_last_value() {
        let store = Store::new(1_000);
        let writes = vec![(key("a"), b"first".to_vec().into()), (key("a"), b"last".to_vec().into())];
        store.put(7, writes, 0).unwrap();
        assert_eq!(&*store.get_latest(b"a").unwrap().value, b"last");
        assert_eq!((store.last_commit(b"a"), store.stats().versions), (7, 1));
    }

    fn prepare(store: &Store, ts: Timestamp, keys: &[&str], now_ms: u64) {
        let writes = keys.iter().map(|text| (key(text), format!("{text}@{ts}").into_bytes().into())).collect();
        store.prepare(ts, write_set(keys), Arc::from([]), writes, now_ms).unwrap();
    }

    #[test]
    fn prepared_versions_are_invisible_until_commit() {
        let store = Store::new(1_000);
        prepare(&store, 10, &["a", "b"], 0);
        assert!(store.get_latest(b"a").is_none());
        assert_eq!(store.get_at(b"a", 10).unwrap().ts, 10);
        assert_eq!(store.commit(10), 2);
        assert_eq!(store.get_latest(b"a").unwrap().ts, 10);
        assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@10");
    }

    #[test]
    fn two_prepares_of_one_transaction_are_committed_together() {
        // After a failover one server serves two servers' partitions, and a client sends it
        // one PREPARE per former server: the second must not drop the first one's keys.
        let store = Store::new(1_000);
        prepare(&store, 10, &["a"], 0);
        prepare(&store, 10, &["b", "a"], 0);
        assert_eq!(store.pending_keys(10).len(), 2);
        assert_eq!(store.commit(10), 2);
        assert_eq!((store.last_commit(b"a"), store.last_commit(b"b")), (10, 10));
        assert!(store.pending_keys(10).is_empty());
    }

    #[test]
    fn a_late_commit_of_an_older_transaction_never_hides_a_newer_one() {
        // The bug this pins: lastCommit written with a blind store goes backwards.
        let store = Store::new(1_000);
        prepare(&store, 10, &["a"], 0);
        prepare(&store, 20, &["a"], 0);
        store.commit(20);
        store.commit(10);
        assert_eq!(store.last_commit(b"a"), 20);
    }

    #[test]
    fn last_commit_keeps_advancing_after_the_first_write() {
        let store = Store::new(1_000);
        for ts in 1..=5 {
            prepare(&store, ts, &["a"], 0);
            store.commit(ts);
            assert_eq!(store.last_commit(b"a"), ts);
        }
    }

    #[test]
    fn a_retried_commit_is_harmless() {
        let store = Store::new(1_000);
        prepare(&store, 10, &["a"], 0);
        assert_eq!(store.commit(10), 1);
        assert_eq!(store.commit(10), 0);
        assert_eq!(store.last_commit(b"a"), 10);
    }

    #[test]
    fn an_invalid_prepare_changes_nothing() {
        let store = Store::new(1_000);
        let oversized = vec![0u8; VALUE_BYTES_MAX + 1].into_boxed_slice();
        let writes = vec![(key("a"), b"ok".to_vec().into()), (key("b"), oversized)];
        let error = store.prepare(5, write_set(&["a", "b"]), Arc::from([]), writes, 0).unwrap_err();
        assert!(matches!(error, StoreError::InvalidPrepare(_)));
        assert_eq!(store.stats(), StoreStats::default());
        let outside = vec![(key("c"), b"x".to_vec().into())];
        assert!(store.prepare(6, write_set(&["a"]), Arc::from([]), outside, 0).is_err());
        assert!(store.prepare(0, write_set(&["a"]), Arc::from([]), vec![(key("a"), b"x".to_vec().into())], 0).is_err());
    }

    #[test]
    fn superseded_versions_survive_the_grace_period_then_go() {
        // Two-key transactions: a reader that got `b`'s version of one may ask for `a`'s.
        let store = Store::new(100);
        prepare(&store, 1, &["a", "b"], 0);
        store.commit(1);
        prepare(&store, 2, &["a", "b"], 10);
        store.commit(2);
        // Version 1 is marked superseded at t=50 and still readable within the grace period.
        prepare(&store, 3, &["a", "b"], 50);
        assert_eq!(store.get_at(b"a", 1).unwrap().ts, 1);
        store.commit(3);
        prepare(&store, 4, &["a", "b"], 149);
        assert!(store.get_at(b"a", 1).is_ok(), "still inside the grace period");
        prepare(&store, 5, &["a", "b"], 150);
        assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 });
        // The committed latest is never collected.
        assert_eq!(store.get_latest(b"a").unwrap().ts, 3);
        assert_eq!(store.stats().versions_collected, 2, "version 1 of a and of b");
    }

    /// Issue 31 (memory and speed of MSET): in a store that tracks reads, a superseded version
    /// of a multi-key write goes at the COMMIT that supersedes it when no round-1 read of its
    /// key is within the grace period; a read within it (of the key, of the key before it
    /// existed, or through an item slot) keeps the grace period, counted from the read; a
    /// store that does not track reads (a backup's copy) keeps it always.
    #[test]
    fn superseded_versions_of_keys_nobody_read_go_at_once_and_a_read_keeps_the_grace() {
        let grace = 1_000;
        let store = Store::new_tracking_reads(grace);
        let untracked = Store::new(grace);
        for store in [&store, &untracked] {
            prepare(store, 1, &["a", "b"], 0);
            store.commit(1);
            prepare(store, 2, &["a", "b"], 5);
            store.commit(2);
        }
        assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 }, "never read: gone");
        assert_eq!(store.stats().versions, 2, "the latest of a and b");
        assert!(untracked.get_at(b"a", 1).is_ok(), "a copy keeps the grace period");
        // A round-1 read of a at 100: its superseded versions keep the grace from the read on.
        assert_eq!(store.read_latest(b"a", 100).unwrap().ts, 2);
        prepare(&store, 3, &["a", "b"], 200);
        store.commit(3);
        assert!(store.get_at(b"a", 2).is_ok(), "a was read 100 ms ago");
        assert!(store.get_at(b"b", 2).is_err(), "b was not read");
        prepare(&store, 4, &["b"], 1_099);
        assert!(store.get_at(b"a", 2).is_ok(), "still within the grace of the read");
        let mut cursor = SweepCursor::default();
        store.sweep(&mut cursor, usize::MAX, 1_100);
        assert!(store.get_at(b"a", 2).is_err(), "the read is a grace period old: gone before its own grace");
        // RAMP-Small's round 1 (the latest timestamp) is a read too.
        assert_eq!(store.read_last_commit(b"a", 2_000), 3);
        prepare(&store, 5, &["a", "b"], 2_000);
        store.commit(5);
        assert!(store.get_at(b"a", 3).is_ok());
        // A key read while it did not exist inherits the read when it is created.
        assert!(store.read_latest(b"c", 2_000).is_none());
        prepare(&store, 6, &["c", "b"], 2_001);
        store.commit(6);
        prepare(&store, 7, &["c", "b"], 2_002);
        store.commit(7);
        assert!(store.get_at(b"c", 6).is_ok(), "a reader that found c missing may want version 6");
        // A key with an item slot is read without the store seeing it: always the grace.
        assert_eq!(store.get_latest_for_slot(b"b").unwrap().ts, 7);
        prepare(&store, 8, &["b", "d"], 50_000);
        store.commit(8);
        assert!(store.get_at(b"b", 7).is_ok(), "read through its slot at any moment");
        prepare(&store, 9, &["b", "d"], 50_000); // sees 7 superseded
        store.commit(9);
        prepare(&store, 10, &["b", "d"], 50_999);
        assert!(store.get_at(b"b", 7).is_ok());
        prepare(&store, 11, &["b", "d"], 51_000);
        assert!(store.get_at(b"b", 7).is_err(), "its own grace period, as before");
    }

    /// PREPARE_COMMIT's store side: visible at once, no pending entry left, a key written
    /// twice committed once with its last value, the superseded version collected as a COMMIT
    /// would; refused (aborted, invalid) without a change.
    #[test]
    fn a_one_phase_write_is_stored_and_visible_in_one_call() {
        let store = Store::new_tracking_reads(1_000);
        let one = |ts: Timestamp, text: &str| {
            let writes = vec![(key(text), format!("{text}@{ts}").into_bytes().into())];
            let (mut stored, mut committed) = (Vec::new(), Vec::new());
            store.prepare_commit_keeping(ts, write_set(&[text]), writes, 5, Some(&mut stored), Some(&mut committed))?;
            assert_eq!((stored.len(), committed), (1, vec![key(text)]));
            Ok::<_, StoreError>(())
        };
        one(1, "a").unwrap();
        assert_eq!(store.get_latest(b"a").unwrap().ts, 1);
        one(2, "a").unwrap();
        assert_eq!(&*store.get_latest(b"a").unwrap().value, b"a@2");
        assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 }, "alone: gone at once");
        let stats = store.stats();
        assert_eq!((stats.versions, stats.pending_transactions), (1, 0));
        // Several keys, one of them twice: every one visible, the last value kept.
        let writes = vec![
            (key("b"), b"b-first".to_vec().into()),
            (key("c"), b"c".to_vec().into()),
            (key("b"), b"b-last".to_vec().into()),
        ];
        let mut committed = Vec::new();
        store.prepare_commit_keeping(3, write_set(&["b", "c"]), writes, 5, None, Some(&mut committed)).unwrap();
        assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b-last");
        assert_eq!((store.last_commit(b"b"), store.last_commit(b"c")), (3, 3));
        assert_eq!(store.stats().pending_transactions, 0);
        // Refused: changes nothing.
        store.abort(9, 5);
        assert_eq!(one(9, "a"), Err(StoreError::Aborted { ts: 9 }));
        let bad = vec![(key("d"), b"x".to_vec().into())];
        let refused = store.prepare_commit_keeping(10, write_set(&["e"]), bad, 5, None, None);
        assert_eq!(refused, Err(StoreError::InvalidPrepare(InvalidPrepare::KeyNotInWriteSet)));
        assert_eq!((store.last_commit(b"a"), store.last_commit(b"d")), (2, 0));
    }

    /// A reader's round 2 for a version the store let go early is refused (`VersionGone`, the
    /// reader restarts), never answered with another version; HIGHEST_OF too.
    #[test]
    fn a_version_let_go_early_is_refused_never_answered_wrongly() {
        let store = Store::new_tracking_reads(1_000);
        for ts in 1..=3 {
            prepare(&store, ts, &["a", "b"], 2_000 + ts);
            store.commit(ts);
        }
        for ts in 1..=2 {
            assert_eq!(store.get_at(b"a", ts).unwrap_err(), StoreError::VersionGone { ts });
        }
        assert!(matches!(store.get_highest_of(b"a", &[2]), Err(StoreError::VersionGone { ts: 2 })));
        assert_eq!(store.get_highest_of(b"a", &[2, 3]).unwrap().unwrap().ts, 3);
        assert_eq!(store.stats().versions_collected, 4);
    }

    /// Issue 18 (memory per key): a version whose transaction wrote its key alone goes as soon
    /// as a newer commit supersedes it (no reader's round 2 can name it), from the COMMIT
    /// itself; a HIGHEST_OF read that could have wanted it refuses; a two-key version beside
    /// it keeps its grace period, and so does one with no write set (RAMP-Small, NoCC).
    #[test]
    fn a_version_alone_in_its_write_set_goes_when_superseded() {
        let store = Store::new(1_000);
        prepare(&store, 1, &["a"], 0);
        store.commit(1);
        prepare(&store, 2, &["a"], 0);
        assert_eq!(store.get_at(b"a", 1).unwrap().ts, 1, "the latest until 2 commits");
        let held = store.get_latest(b"a").unwrap();
        store.commit(2);
        assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 });
        assert_eq!(&*held.value, b"a@1", "a reader that got it keeps it");
        assert_eq!((store.stats().versions, store.stats().versions_collected), (1, 1));
        assert!(matches!(store.get_highest_of(b"a", &[1]), Err(StoreError::VersionGone { ts: 1 })));
        // A two-key version superseded by a one-key one keeps its grace period.
        prepare(&store, 3, &["a", "b"], 0);
        store.commit(3);
        assert_eq!(store.get_at(b"a", 2).unwrap_err(), StoreError::VersionGone { ts: 2 });
        prepare(&store, 4, &["a"], 10);
        store.commit(4);
        prepare(&store, 5, &["a"], 10); // marks 3 superseded at 10
        store.commit(5);
        assert!(store.get_at(b"a", 4).is_err(), "one-key, gone at the commit of 5");
        assert_eq!(store.get_at(b"a", 3).unwrap().ts, 3, "two-key: within the grace period");
        prepare(&store, 6, &["a"], 1_010);
        assert!(store.get_at(b"a", 3).is_err(), "past the grace period");
        // No write set (RAMP-Small, NoCC): the grace period.
        store.put(10, vec![(key("c"), b"x".to_vec().into())], 0).unwrap();
        store.put(11, vec![(key("c"), b"y".to_vec().into())], 0).unwrap();
        store.put(12, vec![(key("c"), b"z".to_vec().into())], 0).unwrap();
        assert_eq!(store.get_at(b"c", 10).unwrap().ts, 10);
        // A late COMMIT of an older one-key version leaves it superseded at once: it goes at
        // the key's next write.
        prepare(&store, 20, &["d"], 0);
        prepare(&store, 21, &["d"], 0);
        store.commit(21);
        store.commit(20);
        assert_eq!(store.get_at(b"d", 20).unwrap().ts, 20);
        prepare(&store, 22, &["d"], 0);
        assert!(store.get_at(b"d", 20).is_err());
    }

    /// Issue 15: "a key's old versions are freed only when it is written again". The sweep
    /// collects them once the grace period is over, whether or not the key is written again,
    /// and visits no more keys per call than it is allowed.
    #[test]
    fn a_sweep_collects_superseded_versions_of_keys_not_written_again() {
        let store = Store::new(100);
        for ts in [1, 2, 3] {
            store.put(ts, vec![(key("k"), vec![0u8; 8].into())], 0).unwrap();
        }
        assert_eq!(store.stats().versions, 3, "superseded, within the grace period");
        let mut cursor = SweepCursor::default();
        store.sweep(&mut cursor, usize::MAX, 50);
        assert_eq!(store.stats().versions, 3, "still within the grace period");
        store.sweep(&mut cursor, usize::MAX, 150);
        assert_eq!((store.stats().versions, store.stats().versions_collected), (1, 2));
        assert_eq!(store.get_latest(b"k").unwrap().ts, 3, "the latest stays");

        let many = Store::new(0);
        for index in 0..3_000u64 {
            let name = format!("key{index}");
            for ts in [index * 2 + 1, index * 2 + 2] {
                many.put(ts, vec![(key(&name), vec![1u8; 4].into())], 0).unwrap();
            }
        }
        let mut cursor = SweepCursor::default();
        let mut visits = Vec::new();
        while many.stats().versions > 3_000 {
            let visited = many.sweep(&mut cursor, 1_024, 1);
            assert!(visited <= 1_024);
            visits.push(visited);
            assert!(visits.len() <= 4, "a pass of 3,000 keys takes 3 sweeps of 1,024: {visits:?}");
        }
        assert_eq!(many.stats().versions_collected, 3_000);
    }

    /// Issue 18 (memory per key): a key back to its one version holds one version entry, its
    /// timestamp inline and no superseded queue; the per-key state stays within 136 bytes, so
    /// that a field added to every key is a decision.
    #[test]
    fn a_key_at_rest_holds_no_more_than_its_version() {
        assert!(std::mem::size_of::<KeyState>() <= 136, "KeyState is {} bytes", std::mem::size_of::<KeyState>());
        assert_eq!(std::mem::size_of::<StoredVersion>(), 16);
        let store = Store::new(100);
        for ts in 1..=5 {
            store.put(ts, vec![(key("a"), b"x".to_vec().into())], 0).unwrap();
        }
        let mut cursor = SweepCursor::default();
        store.sweep(&mut cursor, usize::MAX, 0);
        store.sweep(&mut cursor, usize::MAX, 100);
        let shard = store.shard(b"a").read();
        let state = shard.get(&b"a"[..]).unwrap();
        assert_eq!((store.stats().versions, state.versions.capacity()), (1, 1));
        assert!(!state.unmarked.spilled(), "the latest's timestamp is inline");
        assert_eq!(state.superseded.capacity(), 0, "the emptied queue was given back");
    }

    #[test]
    fn a_prepared_version_waiting_for_its_commit_is_never_collected() {
        // The bug this pins: a slow writer's version, superseded by a newer commit while its
        // own COMMIT was in flight, was collected; its COMMIT then found nothing.
        let store = Store::new(10);
        prepare(&store, 5, &["a"], 0);
        prepare(&store, 9, &["a"], 0);
        store.commit(9);
        prepare(&store, 12, &["a"], 1_000);
        prepare(&store, 13, &["a"], 5_000);
        assert_eq!(store.get_at(b"a", 5).unwrap().ts, 5, "still awaiting its COMMIT");
        assert_eq!(store.commit(5), 1);
        assert_eq!(store.last_commit(b"a"), 9, "an older commit never moves lastCommit back");
        prepare(&store, 14, &["a"], 6_000);
        prepare(&store, 15, &["a"], 7_000);
        assert!(store.get_at(b"a", 5).is_err(), "collected once committed and past the grace period");
    }

    #[test]
    fn highest_of_returns_the_newest_stored_candidate_prepared_or_committed() {
        let store = Store::new(1_000);
        prepare(&store, 10, &["a"], 0);
        prepare(&store, 20, &["a"], 0);
        store.commit(10);
        let found = store.get_highest_of(b"a", &[5, 10, 20, 30]).unwrap().unwrap();
        assert_eq!(found.ts, 20, "a prepared version counts");
        assert!(store.get_highest_of(b"a", &[7, 30]).unwrap().is_none());
        assert!(store.get_highest_of(b"nothing", &[7]).unwrap().is_none());
    }

    #[test]
    fn highest_of_refuses_rather_than_answer_below_a_collected_candidate() {
        let store = Store::new(10);
        for (ts, now_ms) in [(1, 0), (2, 0), (3, 100), (4, 200), (5, 300)] {
            prepare(&store, ts, &["a"], now_ms);
            store.commit(ts);
        }
        assert!(store.get_at(b"a", 2).is_err(), "version 2 was collected");
        assert!(matches!(store.get_highest_of(b"a", &[1, 2]), Err(StoreError::VersionGone { .. })));
        assert_eq!(store.get_highest_of(b"a", &[2, 5]).unwrap().unwrap().ts, 5, "a newer stored candidate wins");
    }

    #[test]
    fn recovery_sees_prepared_and_committed_and_an_unknown_transaction_becomes_aborted() {
        let store = Store::new(1_000);
        prepare(&store, 10, &["a"], 0);
        assert_eq!(store.status(10, &[key("a")], 0), TxnState::Prepared);
        assert_eq!(store.stale_pending(1).len(), 1);
        assert!(store.stale_pending(0).is_empty(), "not stale yet");
        store.commit(10);
        assert_eq!(store.status(10, &[key("a")], 0), TxnState::Committed);
        assert_eq!(store.status(20, &[key("a")], 0), TxnState::Unknown);
        // A PREPARE of 20 still in flight is now refused, so its writer can never commit it.
        let late = store.prepare(20, write_set(&["a"]), Arc::from([]), vec![(key("a"), b"x".to_vec().into())], 0);
        assert_eq!(late.unwrap_err(), StoreError::Aborted { ts: 20 });
        assert_eq!(store.status(20, &[key("a")], 0), TxnState::Aborted);
    }

    #[test]
    fn abort_drops_the_uncommitted_versions() {
        let store = Store::new(1_000);
        prepare(&store, 10, &["a", "b"], 0);
        store.abort(10, 0);
        assert!(store.get_at(b"a", 10).is_err());
        assert_eq!(store.stats().versions, 0);
        assert_eq!(store.stats().pending_transactions, 0);
        assert_eq!(store.commit(10), 0, "nothing left to commit");
    }

    #[test]
    fn put_is_visible_at_once() {
        let store = Store::new(1_000);
        store.put(7, vec![(key("a"), b"x".to_vec().into())], 0).unwrap();
        assert_eq!(store.get_latest(b"a").unwrap().ts, 7);
        assert_eq!(store.stats().pending_transactions, 0);
    }

    #[test]
    fn concurrent_writers_and_readers_see_only_committed_increasing_versions() {
        let store = Arc::new(Store::new(50));
        let writers: Vec<_> = (0..2u64)
            .map(|writer| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for round in 1..=2_000u64 {
                        let ts = round * 2 + writer;
                        prepare(&store, ts, &["a", "b"], round);
                        store.commit(ts);
                    }
                })
            })
            .collect();
        let reader = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut last_seen = 0;
                for _ in 0..20_000 {
                    if let Some(version) = store.get_latest(b"a") {
                        assert!(version.ts >= last_seen, "lastCommit went backwards");
                        assert_eq!(&*version.value, format!("a@{}", version.ts).as_bytes());
                        last_seen = version.ts;
                    }
                }
            })
        };
        for writer in writers {
            writer.join().unwrap();
        }
        reader.join().unwrap();
        assert_eq!(store.last_commit(b"a"), 4_001);
        assert!(store.stats().versions < 4_000, "old versions were collected");
    }

    /// What the store must hold, computed the slow way: every version of every key with
    /// whether it is committed and since when it has been seen superseded (marked, as the
    /// store does, when the key is next prepared).
    /// A version alone in its write set goes when first seen superseded, at a prepare of its
    /// key or at a COMMIT that supersedes a latest version alone in its write set.
    #[derive(Default)]
    struct ModelKey {
        /// ts -> (committed, seen superseded at, alone in its write set).
        versions: BTreeMap<Timestamp, (bool, Option<u64>, bool)>,
        last_commit: Timestamp,
    }

    impl ModelKey {
        /// Version `ts` was (re)prepared at `now_ms`: mark, then collect.
        fn prepared(&mut self, ts: Timestamp, alone: bool, now_ms: u64, grace_ms: u64) {
            self.versions.insert(ts, (false, None, alone));
            self.collect_alone();
            let last_commit = self.last_commit;
            for (version_ts, (committed, seen, _)) in self.versions.iter_mut() {
                if *committed && *version_ts < last_commit && seen.is_none() {
                    *seen = Some(now_ms);
                }
            }
            self.versions.retain(|_, (_, seen, _)| seen.is_none_or(|seen| now_ms - seen < grace_ms));
        }

        fn committed(&mut self, ts: Timestamp) {
            self.versions.get_mut(&ts).unwrap().0 = true;
            let replaced = self.last_commit;
            self.last_commit = self.last_commit.max(ts);
            if ts > replaced && self.versions.get(&replaced).is_some_and(|&(_, _, alone)| alone) {
                self.collect_alone();
            }
        }

        fn collect_alone(&mut self) {
            let last_commit = self.last_commit;
            self.versions.retain(|&ts, &mut (committed, seen, alone)| {
                !(alone && committed && ts < last_commit && seen.is_none())
            });
        }
    }

    /// A snapshot file's copy of every key is its full copy without the committed versions
    /// below the newest committed one, with `collected_max_ts` raised past them (the rule as
    /// stated, applied to every version).
    fn assert_leave_out_is_the_rule(store: &Store, step: usize) {
        for shard in 0..store.shard_count() {
            let full = store.shard_versions(shard, Superseded::Keep);
            let left = store.shard_versions(shard, Superseded::LeaveOut);
            assert_eq!(full.len(), left.len(), "step {step}");
            for (full, left) in full.into_iter().zip(left) {
                assert_eq!(full.key, left.key, "step {step}");
                let newest = full.versions.iter().filter(|(_, committed)| *committed).map(|(v, _)| v.ts).max();
                let superseded = |ts: Timestamp, committed: bool| committed && newest.is_some_and(|newest| ts < newest);
                let collected = full
                    .versions
                    .iter()
                    .filter(|(version, committed)| superseded(version.ts, *committed))
                    .map(|(version, _)| version.ts)
                    .fold(full.collected_max_ts, Timestamp::max);
                let kept: Vec<(Timestamp, bool)> = full
                    .versions
                    .iter()
                    .filter(|(version, committed)| !superseded(version.ts, *committed))
                    .map(|(version, committed)| (version.ts, *committed))
                    .collect();
                let found: Vec<(Timestamp, bool)> =
                    left.versions.iter().map(|(version, committed)| (version.ts, *committed)).collect();
                assert_eq!((found, left.collected_max_ts), (kept, collected), "step {step} key {:?}", full.key);
            }
        }
    }

    #[test]
    fn latest_and_collection_match_a_model_under_out_of_order_commits_and_aborts() {
        use rand::{rngs::SmallRng, Rng, SeedableRng};
        let seed: u64 =
            std::env::var("STORE_MODEL_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(rand::random);
        println!("seed {seed} (replay with STORE_MODEL_SEED={seed})");
        let mut random = SmallRng::seed_from_u64(seed);
        const GRACE_MS: u64 = 40;
        const KEYS: [&str; 3] = ["a", "b", "c"];
        let store = Store::new(GRACE_MS);
        let mut model: HashMap<&str, ModelKey> = KEYS.iter().map(|&key| (key, ModelKey::default())).collect();
        let mut pending: Vec<(Timestamp, Vec<&str>)> = Vec::new();
        let mut now_ms = 0u64;
        let mut next_ts = 1u64;
        for step in 0..4_000 {
            now_ms += random.gen_range(0..8);
            match random.gen_range(0..10) {
                0..=3 => {
                    // A new transaction; its ts jumps ahead by a random amount, so commits of
                    // transactions prepared earlier often arrive after newer ones.
                    next_ts += random.gen_range(1..4);
                    let ts = next_ts;
                    let mut keys: Vec<&str> = KEYS.iter().copied().filter(|_| random.gen_bool(0.5)).collect();
                    if keys.is_empty() {
                        keys.push(KEYS[random.gen_range(0..KEYS.len())]);
                    }
                    prepare(&store, ts, &keys, now_ms);
                    for key in &keys {
                        model.get_mut(key).unwrap().prepared(ts, keys.len() == 1, now_ms, GRACE_MS);
                    }
                    pending.push((ts, keys));
                }
                4..=7 if !pending.is_empty() => {
                    let (ts, keys) = pending.swap_remove(random.gen_range(0..pending.len()));
                    assert_eq!(store.commit(ts), keys.len(), "step {step}");
                    for key in keys {
                        model.get_mut(key).unwrap().committed(ts);
                    }
                }
                8 if !pending.is_empty() => {
                    let (ts, keys) = pending.swap_remove(random.gen_range(0..pending.len()));
                    store.abort(ts, now_ms);
                    for key in keys {
                        model.get_mut(key).unwrap().versions.remove(&ts);
                    }
                }
                _ if !pending.is_empty() => {
                    // A retried PREPARE of a transaction awaiting its COMMIT.
                    let (ts, keys) = pending[random.gen_range(0..pending.len())].clone();
                    let writes =
                        keys.iter().map(|text| (key(text), format!("{text}@{ts}").into_bytes().into())).collect();
                    store.prepare(ts, write_set(&keys), Arc::from([]), writes, now_ms).unwrap();
                    for key in &keys {
                        model.get_mut(key).unwrap().prepared(ts, keys.len() == 1, now_ms, GRACE_MS);
                    }
                }
                _ => {}
            }
            let mut versions = 0;
            for (name, entry) in &model {
                let latest = store.get_latest(name.as_bytes());
                assert_eq!(
                    latest.as_ref().map_or(0, |version| version.ts),
                    entry.last_commit,
                    "step {step} key {name}"
                );
                if let Some(latest) = latest {
                    assert_eq!(&*latest.value, format!("{name}@{}", latest.ts).as_bytes(), "step {step}");
                }
                assert_eq!(store.last_commit(name.as_bytes()), entry.last_commit, "step {step} key {name}");
                for &ts in entry.versions.keys() {
                    assert_eq!(
                        store.get_at(name.as_bytes(), ts).map(|version| version.ts),
                        Ok(ts),
                        "step {step} {name}@{ts}"
                    );
                }
                // Nothing the model collected is still there.
                for ts in 1..=next_ts {
                    if !entry.versions.contains_key(&ts) {
                        assert!(store.get_at(name.as_bytes(), ts).is_err(), "step {step}: {name}@{ts} should be gone");
                    }
                }
                versions += entry.versions.len();
            }
            assert_eq!(store.stats().versions, versions, "step {step}");
            assert_leave_out_is_the_rule(&store, step);
        }
        assert!(store.stats().versions_collected > 100, "the run collected versions");
    }

    #[test]
    fn latest_follows_last_commit_while_threads_commit_out_of_order() {
        // Four writers each prepare a batch of transactions, then commit them newest first,
        // while readers check that the latest version never goes back, always carries its own
        // value, and is never newer than lastCommit read right after it.
        let store = Arc::new(Store::new(5));
        let done = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|writer| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for batch in 0..200u64 {
                        let batch_ts: Vec<Timestamp> = (0..8).map(|i| ((batch * 8 + i + 1) << 2) | writer).collect();
                        for (round, &ts) in batch_ts.iter().enumerate() {
                            prepare(&store, ts, &["a", "b"], batch * 8 + round as u64);
                        }
                        for &ts in batch_ts.iter().rev() {
                            assert_eq!(store.commit(ts), 2);
                        }
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (store, done) = (Arc::clone(&store), Arc::clone(&done));
                std::thread::spawn(move || {
                    let mut last_seen = 0;
                    while !done.load(Ordering::Acquire) {
                        for name in ["a", "b"] {
                            if let Some(version) = store.get_latest(name.as_bytes()) {
                                assert_eq!(&*version.value, format!("{name}@{}", version.ts).as_bytes());
                                assert!(version.ts <= store.last_commit(name.as_bytes()));
                                if name == "a" {
                                    assert!(version.ts >= last_seen, "latest went back");
                                    last_seen = version.ts;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        done.store(true, Ordering::Release);
        for reader in readers {
            reader.join().unwrap();
        }
        let highest = ((199 * 8 + 8) << 2) | 3;
        for name in ["a", "b"] {
            assert_eq!(store.get_latest(name.as_bytes()).unwrap().ts, highest);
            assert_eq!(store.last_commit(name.as_bytes()), highest);
        }
        assert!(store.stats().versions_collected > 0);
    }

    /// A copy for a snapshot file leaves out exactly the committed versions below the newest
    /// committed one (prepared ones stay, above or below it) and says so in
    /// `collected_max_ts`; a catch-up copy keeps every version.
    #[test]
    fn a_copy_leaves_out_superseded_versions_only_when_asked() {
        let store = Store::new(1_000);
        for (ts, commit) in [(10, true), (20, true), (15, false), (30, true), (40, false)] {
            prepare(&store, ts, &["a", "b"], 0);
            if commit {
                store.commit(ts);
            }
        }
        let copy_of_a = |superseded| {
            let entries = (0..store.shard_count()).flat_map(|shard| store.shard_versions(shard, superseded));
            let entry = entries.into_iter().find(|entry| entry.key == key("a")).expect("a is stored");
            let versions: Vec<(Timestamp, bool)> =
                entry.versions.iter().map(|(version, committed)| (version.ts, *committed)).collect();
            (versions, entry.collected_max_ts)
        };
        let all = vec![(10, true), (15, false), (20, true), (30, true), (40, false)];
        assert_eq!(copy_of_a(Superseded::Keep), (all, 0));
        assert_eq!(copy_of_a(Superseded::LeaveOut), (vec![(15, false), (30, true), (40, false)], 20));
        assert_eq!(store.stats().versions, 10, "copying changes nothing");
    }

    /// Copies `store` into a new store through the snapshot functions, as a restart would.
    fn copy_through_restore(store: &Store) -> Store {
        let copy = Store::new(1_000);
        let mut uncommitted: HashMap<Timestamp, Vec<Key>> = HashMap::default();
        for shard in 0..store.shard_count() {
            for entry in store.shard_versions(shard, Superseded::Keep) {
                for (version, committed) in &entry.versions {
                    if !committed {
                        uncommitted.entry(version.ts).or_default().push(entry.key.clone());
                    }
                }
                copy.restore_key(entry, 0);
            }
        }
        for (ts, pending) in store.stale_pending(u64::MAX) {
            let keys = uncommitted.remove(&ts).unwrap_or_default();
            assert_eq!(copy.restore_pending(ts, keys, pending.write_set, 0), pending.keys.len());
        }
        for ts in store.aborted_transactions() {
            copy.restore_aborted(ts, 0);
        }
        copy
    }

    /// Failover moves a backup copy into the server's store: every version, pending
    /// transaction and abort moves (a key held on both sides gets the copy's versions), the
    /// copy is left empty, the counts follow, and a moved pending transaction commits.
    #[test]
    fn absorbing_a_copy_moves_everything_and_leaves_it_empty() {
        let copy = Store::new(1_000);
        prepare(&copy, 10, &["a", "b"], 0);
        copy.commit(10);
        prepare(&copy, 20, &["a"], 0);
        copy.commit(20);
        prepare(&copy, 30, &["b", "c"], 0);
        copy.restore_aborted(40, 0);
        let store = Store::new(1_000);
        prepare(&store, 5, &["b", "z"], 0);
        store.commit(5);
        let (copied_versions, held_versions) = (copy.stats().versions, store.stats().versions);
        let mut keys = Vec::new();
        assert_eq!(store.absorb(&copy, 7, Some(&mut keys)), 3);
        keys.sort();
        assert_eq!(keys, vec![key("a"), key("b"), key("c")]);
        assert_eq!(copy.stats().versions, 0);
        assert_eq!(copy.shard_versions(0, Superseded::Keep).len() + copy.stale_pending(u64::MAX).len(), 0);
        assert!(copy.aborted_transactions().is_empty());
        assert_eq!(store.stats().versions, copied_versions + held_versions);
        assert_eq!(&*store.get_latest(b"a").unwrap().value, b"a@20");
        assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@10");
        assert_eq!(&*store.get_latest(b"z").unwrap().value, b"z@5");
        assert!(store.get_latest(b"c").is_none(), "prepared, not committed");
        assert!(store.was_aborted(40));
        assert_eq!(store.commit_keys(30).len(), 2, "the moved pending transaction commits");
        assert_eq!(&*store.get_latest(b"c").unwrap().value, b"c@30");
        assert_eq!(&*store.get_latest(b"b").unwrap().value, b"b@30");
    }

    #[test]
    fn a_store_copied_shard_by_shard_and_restored_answers_as_the_original() {
        let store = Store::new(1_000);
        prepare(&store, 10, &["a", "b"], 0);
        store.commit(10);
        prepare(&store, 20, &["a"], 0);
        store.commit(20);
        prepare(&store, 30, &["a", "c"], 0);
        prepare(&store, 40, &["b"], 0);
        store.abort(40, 0);
        let copy = copy_through_restore(&store);
        assert_eq!(copy.stats(), store.stats());
        for name in ["a", "b", "c"] {
            assert_eq!(copy.last_commit(name.as_bytes()), store.last_commit(name.as_bytes()), "{name}");
            let latest = copy.get_latest(name.as_bytes()).map(|version| version.ts);
            assert_eq!(latest, store.get_latest(name.as_bytes()).map(|version| version.ts), "{name}");
        }
        assert_eq!(copy.get_at(b"a", 30).unwrap().ts, 30, "a prepared version is restored");
        assert_eq!(copy.status(30, &[key("a")], 0), TxnState::Prepared);
        assert_eq!(copy.commit(30), 2, "and commits on both of its keys");
        assert_eq!(copy.last_commit(b"c"), 30);
        let refused = copy.prepare(40, write_set(&["b"]), Arc::from([]), vec![(key("b"), b"x".to_vec().into())], 0);
        assert_eq!(refused.unwrap_err(), StoreError::Aborted { ts: 40 }, "the aborted set is restored");
        copy.clear();
        assert_eq!(copy.stats(), StoreStats::default());
        assert!(copy.get_latest(b"a").is_none() && copy.aborted_transactions().is_empty());
    }

    #[test]
    fn a_restored_pending_transaction_names_only_keys_holding_its_prepared_version() {
        // A snapshot copies the pending map and the shards at different moments: it may name
        // a transaction pending whose versions it copied already committed (or not at all).
        let store = Store::new(1_000);
        let committed = KeyVersions {
            key: key("a"),
            collected_max_ts: 0,
            versions: vec![(
                Arc::new(Version { ts: 7, value: b"a@7".to_vec().into(), metadata: write_set(&["a"]) }),
                true,
            )],
        };
        store.restore_key(committed, 0);
        assert_eq!(store.restore_pending(7, vec![key("a"), key("z")], Arc::from([key("a")]), 0), 0);
        assert_eq!(store.stats().pending_transactions, 0);
        assert_eq!(store.commit(7), 0, "a replayed COMMIT finds nothing left to do");
        assert_eq!(store.get_latest(b"a").unwrap().ts, 7);
    }
}
