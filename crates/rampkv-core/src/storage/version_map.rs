//! One key's versions by timestamp: a sorted ring buffer instead of a `BTreeMap`.
//!
//! # Why
//! Most keys hold one version (their latest) most of the time, and a few more only while
//! superseded ones wait out the GC grace period. A `BTreeMap` allocates a whole leaf node for
//! the first entry (about 280 bytes for 16-byte values): with 1 KiB values that was a fifth of
//! a key's memory. Here one version costs one 24-byte entry.
//!
//! # Costs
//! Versions arrive mostly newest last (timestamps grow) and are collected mostly oldest first,
//! so both ends of the ring are where the work is: O(1) there (amortized; the newest few are
//! scanned), O(log n) to find a version elsewhere, O(distance to the nearer end) to insert or
//! remove one elsewhere (a late PREPARE, an abort). The buffer shrinks when it is a quarter
//! full (geometric, so amortized O(1) per removal), and to exactly one entry when the store's
//! sweep finds a key back to one version ([`VersionMap::shrink_at_rest`]): not on the write
//! path, where a key written again and again would otherwise reallocate twice per write (from
//! one entry to two for the new version, back to one when the old goes: issue 31).

use std::collections::VecDeque;

use crate::types::Timestamp;

/// How many of the newest entries [`VersionMap::position`] scans before it searches (two or
/// three cache lines of entries).
const NEWEST_SCANNED: usize = 8;

/// Versions of one key in timestamp order (each timestamp at most once).
#[derive(Debug)]
pub(super) struct VersionMap<V> {
    entries: VecDeque<(Timestamp, V)>,
}

impl<V> Default for VersionMap<V> {
    fn default() -> Self {
        Self { entries: VecDeque::new() }
    }
}

impl<V> VersionMap<V> {
    /// Where `ts` is (`Ok`) or would go (`Err`). The ends are looked at first, then a binary
    /// search: most lookups are for the newest few (COMMIT, reads of the latest, the
    /// superseded-version walk over the writes in flight) or the oldest (collection). A key
    /// written often holds thousands of versions through the GC grace period, and a binary
    /// search over them misses the cache at nearly every step.
    fn position(&self, ts: Timestamp) -> Result<usize, usize> {
        let len = self.entries.len();
        for (back, &(entry_ts, _)) in self.entries.iter().rev().take(NEWEST_SCANNED).enumerate() {
            if entry_ts <= ts {
                return if entry_ts == ts { Ok(len - 1 - back) } else { Err(len - back) };
            }
        }
        match self.entries.front() {
            None => Err(0),
            Some(&(oldest, _)) if ts < oldest => Err(0),
            Some(&(oldest, _)) if ts == oldest => Ok(0),
            Some(_) => self.entries.binary_search_by_key(&ts, |&(entry_ts, _)| entry_ts),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries the buffer has room for.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    pub(super) fn get(&self, ts: &Timestamp) -> Option<&V> {
        self.position(*ts).ok().map(|index| &self.entries[index].1)
    }

    pub(super) fn get_mut(&mut self, ts: &Timestamp) -> Option<&mut V> {
        self.position(*ts).ok().map(|index| &mut self.entries[index].1)
    }

    pub(super) fn contains_key(&self, ts: &Timestamp) -> bool {
        self.position(*ts).is_ok()
    }

    /// Stores `value` at `ts`, returning what was stored there before.
    pub(super) fn insert(&mut self, ts: Timestamp, value: V) -> Option<V> {
        match self.position(ts) {
            Ok(index) => Some(std::mem::replace(&mut self.entries[index].1, value)),
            Err(index) => {
                if self.entries.len() == self.entries.capacity() && self.entries.capacity() < 4 {
                    // The first versions: one entry more at a time (VecDeque would reserve four;
                    // most keys hold one, two while a write replaces it).
                    self.entries.reserve_exact(1);
                }
                self.entries.insert(index, (ts, value));
                None
            }
        }
    }

    pub(super) fn remove(&mut self, ts: &Timestamp) -> Option<V> {
        let index = self.position(*ts).ok()?;
        let (_, value) = self.entries.remove(index).expect("position is in range");
        // A quarter full: halving at least, so shrinking costs O(1) per removal, amortized.
        let (len, capacity) = (self.entries.len(), self.entries.capacity());
        if len <= capacity / 4 {
            self.entries.shrink_to_fit();
        }
        Some(value)
    }

    /// A key at rest (the sweep's visit): back to one version, exactly one entry.
    pub(super) fn shrink_at_rest(&mut self) {
        if self.entries.len() == 1 && self.entries.capacity() > 1 {
            self.entries.shrink_to_fit();
        }
    }

    /// In timestamp order.
    pub(super) fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.entries.iter().map(|(_, value)| value)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{rngs::SmallRng, Rng, SeedableRng};

    use super::*;

    #[test]
    fn behaves_as_a_btree_map_under_random_inserts_and_removes() {
        let seed: u64 =
            std::env::var("VERSION_MAP_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(rand::random);
        println!("seed {seed} (replay with VERSION_MAP_SEED={seed})");
        let mut random = SmallRng::seed_from_u64(seed);
        let mut map = VersionMap::default();
        let mut model = BTreeMap::new();
        for step in 0..20_000u64 {
            // Mostly new timestamps above the newest and removals of the oldest, as a store
            // sees them, with inserts and removes anywhere mixed in.
            let ts = match random.gen_range(0..10) {
                0..=4 => model.keys().next_back().map_or(1, |newest| newest + random.gen_range(1..3)),
                5..=6 => model.keys().next().copied().unwrap_or(1),
                _ => random.gen_range(1..64),
            };
            if random.gen_bool(0.55) {
                assert_eq!(map.insert(ts, step), model.insert(ts, step), "step {step} insert {ts}");
            } else {
                assert_eq!(map.remove(&ts), model.remove(&ts), "step {step} remove {ts}");
            }
            assert_eq!(map.len(), model.len(), "step {step}");
            assert_eq!(map.get(&ts), model.get(&ts), "step {step}");
            assert!(map.values().eq(model.values()), "step {step}: order");
            assert!(map.capacity() <= 4 * map.len().max(1), "step {step}: shrinks");
        }
    }

    #[test]
    fn one_version_takes_one_entry() {
        let mut map = VersionMap::default();
        map.insert(7, "a");
        assert_eq!(map.capacity(), 1);
        map.insert(9, "b");
        assert_eq!(map.remove(&7), Some("a"));
        assert_eq!(map.capacity(), 2, "room for the next write's version");
        map.insert(11, "c");
        assert_eq!((map.remove(&9), map.capacity()), (Some("b"), 2), "no reallocation while written");
        map.shrink_at_rest();
        assert_eq!(map.capacity(), 1, "at rest: shrunk back to its one version");
        map.insert(9, "b");
        assert_eq!(map.remove(&9), Some("b"));
        assert_eq!(map.remove(&11), Some("c"));
        assert_eq!(map.capacity(), 0, "nothing held for an empty key");
    }
}
