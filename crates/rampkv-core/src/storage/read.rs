//! The read path: the latest version, an exact version, the highest of a set of candidates;
//! and the store's counters.
//!
//! # Contract
//! - [`Store::get_latest`] returns the version at `lastCommit` (or `None`: the initial value),
//!   one hash lookup under the shard's read lock: it never waits for a writer's commit.
//! - [`Store::get_at`] returns exactly the version with a given ts, prepared or committed, or
//!   [`StoreError::VersionGone`] when it was collected or never existed.
//! - [`Store::get_highest_of`] never answers below a candidate that may have been collected:
//!   it refuses with `VersionGone`, and the reader restarts.
//! - Expiry (`expiry`): a key the store no longer holds, once it has removed a reclaimed key,
//!   is answered to a round-2 read (EXACT, HIGHEST_OF) as reclaimed at the latest deadline of
//!   the keys it removed: a version with no value, the asked timestamp (EXACT) or 0
//!   (HIGHEST_OF: none stored), no metadata, and that deadline marked reclaimed. Round 2 asks
//!   for a version of a key only because another key's version named it, so a key missing here
//!   was removed after its reclaimed version superseded what was asked for (or its data is
//!   lost); a reader takes the key as absent and that deadline as a lower bound of its clock,
//!   and neither restarts for ever nor sees part of a transaction whose versions expired.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{note_read, Store, StoreError, StoreStats, StoredMetadata, Version, READ_ALWAYS};
use crate::types::{Expiry, Timestamp, TIMESTAMP_INITIAL};

impl Store {
    /// The highest stored version of `key` whose timestamp is in `candidates`, prepared or
    /// committed (RAMP-Small and RAMP-Hybrid round 2); `Ok(None)` when none is stored.
    /// `VersionGone` when a candidate above the best stored one may have been collected: the
    /// answer could be wrong, so the reader must restart.
    pub fn get_highest_of(&self, key: &[u8], candidates: &[Timestamp]) -> Result<Option<Arc<Version>>, StoreError> {
        let shard = self.shard(key).read();
        let Some(state) = shard.get(key) else {
            drop(shard);
            return Ok(self.removed_key_answer(TIMESTAMP_INITIAL));
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

    /// [`Store::get_latest`] for a round-1 read at `now_ms`, noted in the key (`gc`'s
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

    /// Exactly version `ts` of `key`, prepared or committed (or, for a key this store no
    /// longer holds, the reclaimed answer of the module docs).
    pub fn get_at(&self, key: &[u8], ts: Timestamp) -> Result<Arc<Version>, StoreError> {
        let shard = self.shard(key).read();
        let Some(state) = shard.get(key) else {
            drop(shard);
            return self.removed_key_answer(ts).ok_or(StoreError::VersionGone { ts });
        };
        state.versions.get(&ts).map(|stored| Arc::clone(&stored.version)).ok_or(StoreError::VersionGone { ts })
    }

    /// What a round-2 read of a key this store does not hold gets once it has removed a
    /// reclaimed key (the module docs); `None` before (nothing is known of the key).
    fn removed_key_answer(&self, ts: Timestamp) -> Option<Arc<Version>> {
        let deadline_ms = self.removed_deadline_ms();
        let expiry = Expiry::at_ms(deadline_ms).filter(|expiry| expiry.expires())?.reclaimed();
        Some(Arc::new(Version { ts, value: Box::default(), metadata: StoredMetadata::None, expiry }))
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
            values_reclaimed: self.values_reclaimed.load(Ordering::Relaxed),
            keys_reclaimed: self.keys_reclaimed.load(Ordering::Relaxed),
            keys_reclaiming: self.reclaimed.lock().len(),
        }
    }
}
