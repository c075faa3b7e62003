//! Copying the store out shard by shard and loading it back (snapshots, a backup's catch-up
//! copy), and absorbing another store whole (failover).
//!
//! # Contract: why a snapshot taken under concurrent writes is enough
//! A snapshot copies one shard at a time, each under that shard's read lock, while writers go
//! on; it sees every change completed before it started and some completed during the copy.
//! The persistence layer records the log position before it starts and replays every record
//! after that position over the loaded copy. The store's own operations are what replay runs
//! (`prepare`, `commit`, `abort`, `put`), and re-applying one that the copy already reflects
//! leaves the same state: a PREPARE replaces its version with the same bytes (a COMMIT after
//! it in the log commits it again), a COMMIT of a committed or unknown transaction does
//! nothing, an ABORT of an aborted one only remembers it again, lastCommit is a max. The
//! restore functions below accept such a copy, where a COMMIT may have been seen on one key
//! and not yet on another, and pending transactions are rebuilt from the prepared versions
//! actually loaded, so the store's invariant (a pending key has its prepared version) holds
//! whatever the copy caught.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use super::{note_read, Key, KeyState, PendingTxn, Store, StoredVersion, TableKey, Version};
use crate::limits::VALUE_BYTES_MAX;
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::WriteSet;

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
fn key_versions(key: &[u8], state: &KeyState, superseded: Superseded) -> KeyVersions {
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
    KeyVersions { key: Key::from(key), collected_max_ts, versions }
}

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
        let state = shard.entry(TableKey::from_slice(&key)).or_default();
        // Its readers, if any, read another store (a restart's, a failed primary's): it counts
        // as read now, so what it brings keeps the grace period (`gc`'s contract).
        note_read(&state.read_stamp, now_ms);
        state.collected_max_ts = state.collected_max_ts.max(collected_max_ts);
        for (version, committed) in versions {
            let ts = version.ts;
            debug_assert!(ts != TIMESTAMP_INITIAL && version.value.len() <= VALUE_BYTES_MAX);
            let value_bytes = version.value.len();
            let stored = StoredVersion::new(Arc::clone(&version), committed);
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
        // A reclaimed latest version goes a retention period from now (the `expiry` module).
        let reclaimed = state.latest.get_mut().as_ref().filter(|latest| latest.expiry.is_reclaimed()).map(|v| v.ts);
        drop(shard);
        if let Some(ts) = reclaimed {
            self.queue_reclaimed(&key, ts, now_ms);
        }
    }

    /// Names transaction `ts` pending on those of `keys` that hold an uncommitted version `ts`
    /// (keys without one are left out, so a COMMIT never looks for a version that is not
    /// there). Returns how many keys that is; with none, nothing is recorded.
    pub fn restore_pending(&self, ts: Timestamp, keys: Vec<Key>, write_set: WriteSet, now_ms: u64) -> usize {
        let keys: Vec<Key> = keys
            .into_iter()
            .filter(|key| {
                let shard = self.shard(key).read();
                let stored = shard.get(&key[..]).and_then(|state| state.versions.get(&ts));
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
        self.reclaimed.lock().clear();
        self.removed_deadline_ms.store(0, Ordering::Release);
        self.version_count.store(0, Ordering::Relaxed);
        self.value_bytes.store(0, Ordering::Relaxed);
        self.versions_collected.store(0, Ordering::Relaxed);
        self.values_reclaimed.store(0, Ordering::Relaxed);
        self.keys_reclaimed.store(0, Ordering::Relaxed);
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
    /// counted as superseded `now_ms` (this store's clock: the grace starts again), and keys
    /// whose value was reclaimed wait a whole retention period again before they go. The keys
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
                    keys.push(Key::from(&key[..]));
                }
                let value_bytes: usize = state.versions.values().map(|stored| stored.version.value.len()).sum();
                let version_count = state.versions.values().count();
                source.version_count.fetch_sub(version_count, Ordering::Relaxed);
                source.forget_version_bytes(value_bytes);
                if into.contains_key(&key[..]) {
                    let versions = state
                        .versions
                        .values()
                        .map(|stored| (Arc::clone(&stored.version), stored.committed.load(Ordering::Acquire)))
                        .collect();
                    held_here.push(KeyVersions {
                        key: Key::from(&key[..]),
                        collected_max_ts: state.collected_max_ts,
                        versions,
                    });
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
        for reclaimed in std::mem::take(&mut *source.reclaimed.lock()) {
            self.queue_reclaimed(&reclaimed.key, reclaimed.ts, now_ms);
        }
        self.removed_deadline_ms.fetch_max(source.removed_deadline_ms(), Ordering::AcqRel);
        moved
    }
}
