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
//!
//! # Concurrency
//! Keys live in `SHARD_COUNT` shards behind reader-writer locks. Reads and commits take a
//! shard's read lock (commit only does an atomic max), so readers never wait for a commit and
//! never block writers for longer than one map lookup. Prepares take the write lock of one
//! shard per key.

use std::collections::BTreeMap;

use ahash::AHashMap as HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::cluster::key_hash;
use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::{MetadataRef, TxnState};

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
#[derive(Debug)]
pub struct Version {
    pub ts: Timestamp,
    pub value: Box<[u8]>,
    pub metadata: StoredMetadata,
}

/// Why the store refused an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("version {ts} of the key is not stored (collected, or never prepared)")]
    VersionGone { ts: Timestamp },
    #[error("invalid prepare: {0}")]
    InvalidPrepare(String),
    #[error("transaction {ts} was aborted by recovery; it cannot be prepared")]
    Aborted { ts: Timestamp },
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
    /// When (store clock, ms) the version was first seen older than `lastCommit`.
    superseded_at_ms: Option<u64>,
}

#[derive(Debug, Default)]
struct KeyState {
    last_commit: AtomicU64,
    versions: BTreeMap<Timestamp, StoredVersion>,
    /// The highest timestamp ever collected for this key (0: none). A HIGHEST_OF read whose
    /// answer might have been a collected version is refused, never answered wrongly.
    collected_max_ts: Timestamp,
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
        validate_prepare(ts, &metadata, &writes)?;
        if self.aborted.lock().contains_key(&ts) {
            return Err(StoreError::Aborted { ts });
        }
        let keys: Vec<Key> = writes.iter().map(|(key, _)| key.clone()).collect();
        for (key, value) in writes {
            let value_bytes = value.len();
            let version = Arc::new(Version { ts, value, metadata: metadata.clone() });
            let mut shard = self.shard(&key).write();
            let state = shard.entry(key).or_default();
            let replaced = state
                .versions
                .insert(ts, StoredVersion { version, committed: AtomicBool::new(false), superseded_at_ms: None });
            match replaced {
                Some(old) => self.forget_version_bytes(old.version.value.len()),
                None => {
                    self.version_count.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
            self.collect_superseded(state, now_ms);
        }
        self.pending_shard(ts).lock().insert(ts, PendingTxn { keys, write_set, prepared_at_ms: now_ms });
        Ok(())
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
            let state = shard.get(key).expect("a pending key has a prepared version");
            let stored = state.versions.get(&ts).expect("a pending version is never collected");
            stored.committed.store(true, Ordering::Release);
            state.last_commit.fetch_max(ts, Ordering::AcqRel);
        }
        keys
    }

    /// Stores `writes` of transaction `ts` and makes them visible at once, key by key, with no
    /// metadata: NoCC, which promises no atomicity across keys.
    pub fn put(&self, ts: Timestamp, writes: Vec<(Key, Box<[u8]>)>, now_ms: u64) -> Result<(), StoreError> {
        self.prepare(ts, StoredMetadata::None, Arc::from([]), writes, now_ms)?;
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

    /// The latest committed version of `key`, or `None` when it has none (initial value).
    pub fn get_latest(&self, key: &[u8]) -> Option<Arc<Version>> {
        let shard = self.shard(key).read();
        let state = shard.get(key)?;
        let ts = state.last_commit.load(Ordering::Acquire);
        if ts == TIMESTAMP_INITIAL {
            return None;
        }
        let stored = state.versions.get(&ts).expect("lastCommit names a stored version");
        Some(Arc::clone(&stored.version))
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
        let mut expired = Vec::new();
        for (ts, stored) in state.versions.range_mut(..last_commit) {
            if !stored.committed.load(Ordering::Acquire) {
                continue; // its COMMIT is still to come
            }
            let superseded_at_ms = *stored.superseded_at_ms.get_or_insert(now_ms);
            if now_ms.saturating_sub(superseded_at_ms) >= self.grace_ms {
                expired.push(*ts);
            }
        }
        for ts in expired {
            state.collected_max_ts = state.collected_max_ts.max(ts);
            let removed = state.versions.remove(&ts).expect("collected version exists");
            self.forget_version_bytes(removed.version.value.len());
            self.version_count.fetch_sub(1, Ordering::Relaxed);
            self.versions_collected.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn forget_version_bytes(&self, bytes: usize) {
        self.value_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

fn validate_prepare(ts: Timestamp, metadata: &StoredMetadata, writes: &[(Key, Box<[u8]>)]) -> Result<(), StoreError> {
    let invalid = |why: String| Err(StoreError::InvalidPrepare(why));
    if ts == TIMESTAMP_INITIAL {
        return invalid("timestamp 0 is reserved for the initial value".into());
    }
    if writes.is_empty() || writes.len() > TXN_KEYS_MAX {
        return invalid(format!("{} writes (need 1..={TXN_KEYS_MAX})", writes.len()));
    }
    if let StoredMetadata::WriteSet(write_set) = metadata {
        if write_set.len() > TXN_KEYS_MAX {
            return invalid(format!("a write set of {} keys (at most {TXN_KEYS_MAX})", write_set.len()));
        }
        if writes.iter().any(|(key, _)| !write_set.contains(key)) {
            return invalid("a written key is missing from the write set".into());
        }
    }
    for (key, value) in writes {
        if key.len() > KEY_BYTES_MAX || value.len() > VALUE_BYTES_MAX {
            return invalid(format!(
                "key of {} bytes or value of {} bytes over the limits ({KEY_BYTES_MAX}, {VALUE_BYTES_MAX})",
                key.len(),
                value.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Key {
        text.as_bytes().into()
    }

    fn write_set(keys: &[&str]) -> StoredMetadata {
        StoredMetadata::WriteSet(keys.iter().map(|text| key(text)).collect())
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
        let store = Store::new(100);
        prepare(&store, 1, &["a"], 0);
        store.commit(1);
        prepare(&store, 2, &["a"], 10);
        store.commit(2);
        // Version 1 is marked superseded at t=50 and still readable within the grace period.
        prepare(&store, 3, &["a"], 50);
        assert_eq!(store.get_at(b"a", 1).unwrap().ts, 1);
        store.commit(3);
        prepare(&store, 4, &["a"], 149);
        assert!(store.get_at(b"a", 1).is_ok(), "still inside the grace period");
        prepare(&store, 5, &["a"], 150);
        assert_eq!(store.get_at(b"a", 1).unwrap_err(), StoreError::VersionGone { ts: 1 });
        // The committed latest is never collected.
        assert_eq!(store.get_latest(b"a").unwrap().ts, 3);
        assert_eq!(store.stats().versions_collected, 1);
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
}
