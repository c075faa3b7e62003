//! Garbage collection: marking superseded versions and collecting them.
//!
//! # Contract
//! - A version older than its key's `lastCommit` is removed only after it has been seen
//!   superseded for at least the grace period. A reader that needs such a version (round 2)
//!   started its read after the version was prepared and before it was superseded, so a grace
//!   period longer than any read transaction means no live reader loses a version it may ask
//!   for. Versions are marked lazily, when the key is next written, which only makes them live
//!   longer. A version whose COMMIT has not arrived yet is never collected (its writer may be
//!   slow; cooperative termination will resolve a dead one).
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
//! - A collected version raises its key's `collected_max_ts`, so that a read that might have
//!   wanted it is refused rather than answered wrongly (`read`).
//! - The same sweep reclaims expired keys (`expiry`).
//!
//! [`StoredMetadata::names_only_its_key`]: super::StoredMetadata::names_only_its_key

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::expiry::SweepClock;
use super::version_map::VersionMap;
use super::{Key, KeyState, Store, StoredVersion, Version, SHARD_COUNT};
use crate::spare;
use crate::types::Timestamp;

/// Where a background sweep stands ([`Store::sweep`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SweepCursor {
    shard: usize,
    offset: usize,
}

impl Store {
    /// Garbage-collects up to `keys_max` keys from where `cursor` stands (shard by shard, round
    /// and round): what a write of each would collect ([`Store::prepare`]), and reclaims the
    /// expired ones (with a wall clock, `clock.unix_ms`; the `expiry` module); first removes up
    /// to `keys_max` keys reclaimed a retention period ago (pushed to `removed` when given, with
    /// their reclaimed version's timestamp: the edge frees their item slots). Returns the keys
    /// visited. Keys inserted while a shard is walked may be visited twice or skipped until the
    /// next round: harmless, a sweep only collects what may go.
    pub fn sweep(
        &self,
        cursor: &mut SweepCursor,
        keys_max: usize,
        clock: SweepClock,
        removed: Option<&mut Vec<(Timestamp, Key)>>,
    ) -> usize {
        let now_ms = clock.monotonic_ms;
        self.remove_reclaimed(now_ms, keys_max, removed);
        self.advance_clock(now_ms);
        let mut visited = 0;
        for _ in 0..SHARD_COUNT {
            if visited >= keys_max {
                break;
            }
            let mut shard = self.shards[cursor.shard % SHARD_COUNT].write();
            let mut taken = 0;
            for (key, state) in shard.iter_mut().skip(cursor.offset).take(keys_max - visited) {
                self.collect_superseded(state, now_ms);
                self.reclaim_value(key, state, clock.unix_ms, now_ms);
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

    /// Marks versions below `lastCommit` as superseded and removes those marked longer ago
    /// than the grace period. Called with the key's shard write-locked.
    pub(super) fn collect_superseded(&self, state: &mut KeyState, now_ms: u64) {
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
    pub(super) fn mark_superseded(&self, state: &mut KeyState, now_ms: Option<u64>) {
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
        // Its value's buffer, when no reader holds the version, serves the thread's next value
        // of its length (`spare`).
        if let Ok(Version { value, .. }) = Arc::try_unwrap(removed.version) {
            spare::give(value);
        }
        self.version_count.fetch_sub(1, Ordering::Relaxed);
        self.versions_collected.fetch_add(1, Ordering::Relaxed);
    }
}
