//! Reclaiming expired keys in the background sweep, without a read touching them.
//!
//! # Contract
//! - **Stage 1, the value.** The sweep ([`Store::sweep`]) reclaims a key whose latest version
//!   expired at least `EXPIRY_RECLAIM_MARGIN_MS` ago by the store's wall clock
//!   ([`SweepClock::unix_ms`]) and is the key's only version (no superseded version still in
//!   its grace period, none prepared): the version's value is dropped and the version kept
//!   with its timestamp, metadata and deadline, marked reclaimed (`Expiry::reclaimed`). The
//!   key's `lastCommit` stays. Such a version answers a round-2 read (EXACT, HIGHEST_OF) and
//!   recovery's STATUS as before, and every read of it carries "reclaimed at deadline d": a
//!   reader then takes d as a lower bound of its clock and judges every version of its read
//!   by it, so the other keys of the same transaction (same deadline) read as expired too,
//!   even from a server whose clock is behind and has not reclaimed them (docs/architecture.md,
//!   "Expiry and deletion"). A late PREPARE or PUT of an older timestamp is stored below it and
//!   is never visible: no older value comes back.
//! - **Stage 2, the key.** `EXPIRY_RECLAIMED_RETENTION_MS` later by the store's monotonic clock
//!   (a bounded FIFO of reclaimed keys, `EXPIRY_RECLAIMED_KEYS_MAX`), the key goes, if its
//!   reclaimed version is still its only one; its memory is then zero. The store remembers only
//!   the latest deadline of the keys it removed: a round-2 read of a key it no longer holds
//!   (its reader's round 1 saw another key name it) is answered "reclaimed at that deadline",
//!   not "version gone", so that such a read neither restarts for ever nor sees part of a
//!   transaction (`read`).
//! - A key written again meanwhile is live again: stage 2 leaves it alone (its reclaimed version
//!   is superseded, and collected like any other).
//!
//! Nothing here is logged: reclaiming is a function of the data and the clocks, which a
//! restarted server or a backup applies again with its own sweep. A snapshot keeps reclaimed
//! versions as they are; loading one queues them for stage 2 again.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Key, KeyState, Reclaimed, Store, Version};
use crate::limits::{EXPIRY_RECLAIMED_KEYS_MAX, EXPIRY_RECLAIMED_RETENTION_MS, EXPIRY_RECLAIM_MARGIN_MS};
use crate::types::Timestamp;

/// The clocks a sweep runs by: the store's monotonic clock (grace periods, stage 2) and the
/// wall clock in milliseconds since the Unix epoch (deadlines; 0: unknown, nothing expires).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepClock {
    pub monotonic_ms: u64,
    pub unix_ms: u64,
}

impl SweepClock {
    /// A sweep that only collects superseded versions (no wall clock: nothing is reclaimed).
    pub fn monotonic(monotonic_ms: u64) -> Self {
        Self { monotonic_ms, unix_ms: 0 }
    }
}

/// What stage 2 does with a queued key.
enum Removal {
    /// Gone: its reclaimed version is its only one.
    Remove,
    /// Not yet: it also holds versions that are not settled (a late write, in its grace period).
    Later,
    /// Written again (or gone already): nothing to do.
    Forget,
}

impl Store {
    /// Stage 1 for one key (its shard write-locked): drops the value of an expired latest
    /// version that is the key's only one. Returns whether it did.
    pub(super) fn reclaim_value(&self, key: &[u8], state: &mut KeyState, unix_ms: u64, now_ms: u64) -> bool {
        if unix_ms == 0 || state.versions.len() != 1 {
            return false;
        }
        // The only version's flag, beside its pointer: a key that never expires costs the
        // sweep no look at the version's own block.
        if !state.versions.values().next().is_some_and(|stored| stored.expires) {
            return false;
        }
        let Some(latest) = state.latest.get_mut() else { return false };
        let expiry = latest.expiry;
        if !expiry.expires() || expiry.is_reclaimed() {
            return false;
        }
        if expiry.deadline_ms().saturating_add(EXPIRY_RECLAIM_MARGIN_MS) > unix_ms {
            return false;
        }
        let ts = latest.ts;
        let mut queue = self.reclaimed.lock();
        if queue.len() >= EXPIRY_RECLAIMED_KEYS_MAX {
            return false; // the key keeps its value until older reclaimed keys have gone
        }
        let Some(stored) = state.versions.get_mut(&ts) else {
            debug_assert!(false, "the latest version is stored");
            return false;
        };
        debug_assert!(stored.committed.load(Ordering::Acquire), "the latest version is committed");
        let skeleton = Arc::new(Version {
            ts,
            value: Box::default(),
            metadata: latest.metadata.clone(),
            expiry: expiry.reclaimed(),
        });
        let dropped = std::mem::replace(&mut stored.version, Arc::clone(&skeleton));
        stored.expires = false; // reclaimed: nothing left for a sweep to do
        *latest = skeleton;
        queue.push_back(Reclaimed { at_ms: now_ms, ts, key: Key::from(key) });
        drop(queue);
        self.forget_version_bytes(dropped.value.len());
        self.values_reclaimed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Stage 2: removes up to `keys_max` keys reclaimed at least `EXPIRY_RECLAIMED_RETENTION_MS`
    /// ago (`now_ms`, the store's monotonic clock), each pushed to `removed` (when given) with
    /// its reclaimed version's timestamp. Returns how many went.
    pub(super) fn remove_reclaimed(
        &self,
        now_ms: u64,
        keys_max: usize,
        mut removed_keys: Option<&mut Vec<(Timestamp, Key)>>,
    ) -> usize {
        let mut removed = 0;
        for _ in 0..keys_max {
            let entry = {
                let mut queue = self.reclaimed.lock();
                match queue.front() {
                    Some(front) if now_ms.saturating_sub(front.at_ms) >= EXPIRY_RECLAIMED_RETENTION_MS => {
                        queue.pop_front().expect("a front entry")
                    }
                    _ => break,
                }
            };
            let mut shard = self.shard(&entry.key).write();
            let removal = match shard.get_mut(&entry.key[..]) {
                None => Removal::Forget,
                Some(state) => match state.latest.get_mut() {
                    Some(latest) if latest.ts == entry.ts && latest.expiry.is_reclaimed() => {
                        if state.versions.len() == 1 {
                            Removal::Remove
                        } else {
                            Removal::Later
                        }
                    }
                    _ => Removal::Forget,
                },
            };
            match removal {
                Removal::Remove => {
                    // Raised before the key goes, under its shard's lock: a read that finds the
                    // key missing (after this lock) reads a deadline at least the key's.
                    let state = shard.get_mut(&entry.key[..]).expect("looked up above");
                    let deadline_ms = state.latest.get_mut().as_ref().map_or(0, |latest| latest.expiry.deadline_ms());
                    self.removed_deadline_ms.fetch_max(deadline_ms, Ordering::AcqRel);
                    shard.remove(&entry.key[..]);
                    drop(shard);
                    self.version_count.fetch_sub(1, Ordering::Relaxed);
                    self.keys_reclaimed.fetch_add(1, Ordering::Relaxed);
                    removed += 1;
                    if let Some(keys) = removed_keys.as_deref_mut() {
                        keys.push((entry.ts, entry.key));
                    }
                }
                Removal::Later => {
                    drop(shard);
                    self.reclaimed.lock().push_back(Reclaimed { at_ms: now_ms, ..entry });
                }
                Removal::Forget => {}
            }
        }
        removed
    }

    /// Queues a key whose latest version is reclaimed for stage 2 (a snapshot or another store
    /// brought it in): it goes a retention period from `now_ms`. Not bounded by
    /// `EXPIRY_RECLAIMED_KEYS_MAX`: the key is in memory already, and stage 1 adds none while
    /// the queue is over it.
    pub(super) fn queue_reclaimed(&self, key: &Key, ts: Timestamp, now_ms: u64) {
        self.reclaimed.lock().push_back(Reclaimed { at_ms: now_ms, ts, key: key.clone() });
    }

    /// The latest deadline of a reclaimed key this store removed (0: none).
    pub(super) fn removed_deadline_ms(&self) -> u64 {
        self.removed_deadline_ms.load(Ordering::Acquire)
    }
}
