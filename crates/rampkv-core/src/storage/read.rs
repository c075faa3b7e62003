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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Store, StoreError, StoreStats, Version};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};

impl Store {
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
}
