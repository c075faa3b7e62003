//! The write path: PREPARE, COMMIT and PUT, and what recovery asks and does (STATUS, ABORT,
//! transactions left pending).
//!
//! # Contract
//! - [`Store::prepare`] stores versions that are not yet visible. Calling it again for the
//!   same (key, ts) replaces the version (a retried PREPARE is harmless). Everything is
//!   validated first (`validate`), so a refused PREPARE changes nothing.
//! - [`Store::commit`] makes the versions of a transaction visible by advancing each key's
//!   `lastCommit` with an atomic max, never a blind store: a commit of an older transaction
//!   arriving late never hides a newer one.
//! - [`Store::prepare_commit_keeping`] (PREPARE_COMMIT, a write whose whole write set is on
//!   this server) stores every version before it makes any visible, so it reads as a PREPARE
//!   then its COMMIT would, with no pending entry in between.
//! - [`Store::put`] (NoCC) is a PREPARE and its COMMIT at once, key by key.
//! - Recovery: [`Store::status`] of a transaction never prepared here marks it aborted here,
//!   and [`Store::abort`] drops its uncommitted versions; either way a PREPARE of it arriving
//!   later is refused, so its writer can never commit it anywhere.
//! - Each write collects what its key's superseded versions allow (`gc`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use super::validate::validate_prepare;
use super::{
    Key, KeyState, PendingTxn, Store, StoreError, StoreWrite, StoredMetadata, StoredVersion, StoredWrites, TableKey,
    Version, ABORTED_REMEMBERED_MAX, ABORTED_RETENTION_MS,
};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::{TxnState, WriteSet};

impl Store {
    /// Stores `writes` as prepared versions of transaction `ts` that never expire. Everything is
    /// validated first, so an invalid prepare changes nothing. `now_ms` is the caller's
    /// monotonic clock.
    pub fn prepare(
        &self,
        ts: Timestamp,
        metadata: StoredMetadata,
        write_set: WriteSet,
        writes: Vec<(Key, Box<[u8]>)>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let writes = writes.into_iter().map(StoreWrite::from).collect();
        self.prepare_keeping(ts, metadata, write_set, writes, now_ms, None)
    }

    /// [`Store::prepare`] of writes with their expiries.
    pub fn prepare_writes(
        &self,
        ts: Timestamp,
        metadata: StoredMetadata,
        write_set: WriteSet,
        writes: Vec<StoreWrite>,
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
        write_set: WriteSet,
        writes: Vec<StoreWrite>,
        now_ms: u64,
        mut stored: Option<&mut StoredWrites>,
    ) -> Result<(), StoreError> {
        validate_prepare(ts, &metadata, &writes)?;
        if self.aborted.lock().contains_key(&ts) {
            return Err(StoreError::Aborted { ts });
        }
        self.advance_clock(now_ms);
        let mut keys: Vec<Key> = Vec::with_capacity(writes.len());
        for StoreWrite { key, value, expiry } in writes {
            let value_bytes = value.len();
            let version = Arc::new(Version { ts, value, metadata: metadata.clone(), expiry });
            if let Some(stored) = stored.as_deref_mut() {
                stored.push((key.clone(), Arc::clone(&version)));
            }
            let index = Self::shard_index(&key);
            let mut shard = self.shards[index].write();
            // One lookup for a key already stored (most writes); a new key is inserted.
            match shard.get_mut(&key[..]) {
                Some(state) => self.store_prepared(state, version, value_bytes, now_ms),
                None => {
                    // A reader that found the key missing may come back for this version.
                    let read_stamp = AtomicU64::new(self.absent_read_stamps[index].load(Ordering::Relaxed));
                    let state = shard
                        .entry(TableKey::from_slice(&key))
                        .or_insert(KeyState { read_stamp, ..KeyState::default() });
                    self.store_prepared(state, version, value_bytes, now_ms);
                }
            }
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
        writes: Vec<StoreWrite>,
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
        for StoreWrite { key, value, expiry } in writes {
            let value_bytes = value.len();
            let version = Arc::new(Version { ts, value, metadata: metadata.clone(), expiry });
            if let Some(stored) = stored.as_deref_mut() {
                stored.push((key.clone(), Arc::clone(&version)));
            }
            if let Some(committed) = committed.as_deref_mut() {
                committed.push(key.clone());
            }
            let index = Self::shard_index(&key);
            let mut shard = self.shards[index].write();
            let absent_read = &self.absent_read_stamps[index];
            // One lookup; the table copies the key in only if it is new (inline when short).
            let keep_key = !single && !keys.contains(&key);
            let state = shard.entry(TableKey::from_slice(&key)).or_insert_with(|| KeyState {
                // A reader that found the key missing may come back for this version.
                read_stamp: AtomicU64::new(absent_read.load(Ordering::Relaxed)),
                ..KeyState::default()
            });
            match single {
                true => {
                    // Stored and visible under this one lock: nobody can see it only stored.
                    self.insert_version(state, version, value_bytes);
                    self.commit_locked(state, ts, now_ms);
                }
                false => self.store_prepared(state, version, value_bytes, now_ms),
            }
            drop(shard);
            if keep_key {
                keys.push(key);
            }
        }
        for key in &keys {
            let mut shard = self.shard(key).write();
            let state = shard.get_mut(&key[..]).expect("a key stored above stays");
            self.commit_locked(state, ts, now_ms);
        }
        Ok(())
    }

    /// Stores `version` (prepared, not visible) in a key and collects what the key's superseded
    /// versions allow. Called with the key's shard write-locked.
    fn store_prepared(&self, state: &mut KeyState, version: Arc<Version>, value_bytes: usize, now_ms: u64) {
        self.insert_version(state, version, value_bytes);
        self.collect_superseded(state, now_ms);
    }

    /// Puts `version` (not committed) in a key's versions, replacing one of the same ts (a
    /// retried PREPARE), and lists it as not yet seen superseded. Called with the key's shard
    /// write-locked.
    fn insert_version(&self, state: &mut KeyState, version: Arc<Version>, value_bytes: usize) {
        let ts = version.ts;
        let replaced = state.versions.insert(ts, StoredVersion::new(version, false));
        match replaced {
            Some(old) => self.forget_version_bytes(old.version.value.len()),
            None => {
                self.version_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        // A replaced version may already have been marked superseded; collection checks that
        // what it removes is committed, so listing it again is what keeps it.
        if !state.unmarked.contains(&ts) {
            state.unmarked.push(ts);
        }
        self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
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
            // Write-locked, so that what the commit supersedes is marked in the same lookup
            // (held for a pointer swap and that marking: a reader of the shard waits no longer).
            let mut shard = self.shard(key).write();
            // A version is prepared before it is committed, and committed once: the pending
            // entry just taken is its prepare's, and a pending version is never collected.
            let state = shard.get_mut(&key[..]).expect("a pending key has a prepared version");
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
            if replaced_goes {
                // The version this commit superseded can go now (alone in its write set, or no
                // reader may come back for it: `gc`'s contract): without this it would wait for
                // the key's next write, holding its value meanwhile.
                self.mark_superseded(state, None);
            }
            drop(shard);
        }
        keys
    }

    /// The keys transaction `ts` has prepared here and not committed yet (empty: none).
    pub fn pending_keys(&self, ts: Timestamp) -> Vec<Key> {
        self.pending_shard(ts).lock().get(&ts).map_or_else(Vec::new, |pending| pending.keys.clone())
    }

    /// Stores `writes` of transaction `ts` and makes them visible at once, key by key, with no
    /// metadata and no expiry: NoCC, which promises no atomicity across keys.
    pub fn put(&self, ts: Timestamp, writes: Vec<(Key, Box<[u8]>)>, now_ms: u64) -> Result<(), StoreError> {
        self.put_keeping(ts, writes.into_iter().map(StoreWrite::from).collect(), now_ms, None)
    }

    /// [`Store::put`] of writes with their expiries, pushing each version stored to `stored`
    /// as [`Store::prepare_keeping`].
    pub fn put_keeping(
        &self,
        ts: Timestamp,
        writes: Vec<StoreWrite>,
        now_ms: u64,
        stored: Option<&mut StoredWrites>,
    ) -> Result<(), StoreError> {
        self.prepare_keeping(ts, StoredMetadata::None, WriteSet::default(), writes, now_ms, stored)?;
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
            if let Some(stored) = shard.get(&key[..]).and_then(|entry| entry.versions.get(&ts)) {
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
            let Some(state) = shard.get_mut(&key[..]) else { continue };
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

    pub(super) fn remember_aborted(&self, ts: Timestamp, now_ms: u64) {
        let mut aborted = self.aborted.lock();
        if aborted.len() >= ABORTED_REMEMBERED_MAX {
            aborted.retain(|_, at_ms| now_ms.saturating_sub(*at_ms) < ABORTED_RETENTION_MS);
        }
        aborted.insert(ts, now_ms);
    }
}
