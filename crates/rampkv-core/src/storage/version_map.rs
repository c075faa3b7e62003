//! One key's versions by timestamp: up to two inline, more in a sorted ring buffer, instead
//! of a `BTreeMap`.
//!
//! # Why
//! Most keys hold one version (their latest) most of the time, two while a write replaces it,
//! and more only while superseded ones wait out the GC grace period. A `BTreeMap` allocates a
//! whole leaf node for the first entry (about 280 bytes for 16-byte values): with 1 KiB values
//! that was a fifth of a key's memory. Here one or two versions live in the key's own state
//! (24 bytes each), so a write of a key at rest reads and writes no block of its own for them:
//! on a large key space that block was a cache miss per write, 7% of a pipelined SET's time
//! (docs/performance.md).
//!
//! # Costs
//! Versions arrive mostly newest last (timestamps grow) and are collected mostly oldest first,
//! so both ends of the ring are where the work is: O(1) there (amortized; the newest few are
//! scanned), O(log n) to find a version elsewhere, O(distance to the nearer end) to insert or
//! remove one elsewhere (a late PREPARE, an abort). A third version moves the entries to a
//! ring with room for four. The ring shrinks when it is a quarter full (geometric, so amortized
//! O(1) per removal), and its entries move back inline then if they fit, or when the store's
//! sweep finds the key back to at most two versions ([`VersionMap::shrink_at_rest`]).

use std::collections::{vec_deque, VecDeque};
use std::iter::Flatten;
use std::slice;

use crate::types::Timestamp;

/// How many of the newest entries [`VersionMap::position`] scans before it searches (two or
/// three cache lines of entries).
const NEWEST_SCANNED: usize = 8;

/// Entries held in the key's own state before the map moves them to a ring buffer: a key at
/// rest holds one version, two while a write replaces it.
const INLINE_MAX: usize = 2;

/// Versions of one key in timestamp order (each timestamp at most once).
#[derive(Debug)]
pub(super) struct VersionMap<V> {
    entries: Entries<V>,
}

#[derive(Debug)]
enum Entries<V> {
    /// Up to [`INLINE_MAX`] entries in order, the empty places last.
    Inline([Option<(Timestamp, V)>; INLINE_MAX]),
    /// More: a sorted ring buffer.
    Ring(VecDeque<(Timestamp, V)>),
}

impl<V> Default for VersionMap<V> {
    fn default() -> Self {
        Self { entries: Entries::Inline([None, None]) }
    }
}

impl<V> VersionMap<V> {
    /// Where `ts` is (`Ok`) or would go (`Err`) in the ring. The ends are looked at first, then
    /// a binary search: most lookups are for the newest few (COMMIT, reads of the latest, the
    /// superseded-version walk over the writes in flight) or the oldest (collection). A key
    /// written often holds thousands of versions through the GC grace period, and a binary
    /// search over them misses the cache at nearly every step.
    fn position(ring: &VecDeque<(Timestamp, V)>, ts: Timestamp) -> Result<usize, usize> {
        let len = ring.len();
        for (back, &(entry_ts, _)) in ring.iter().rev().take(NEWEST_SCANNED).enumerate() {
            if entry_ts <= ts {
                return if entry_ts == ts { Ok(len - 1 - back) } else { Err(len - back) };
            }
        }
        match ring.front() {
            None => Err(0),
            Some(&(oldest, _)) if ts < oldest => Err(0),
            Some(&(oldest, _)) if ts == oldest => Ok(0),
            Some(_) => ring.binary_search_by_key(&ts, |&(entry_ts, _)| entry_ts),
        }
    }

    pub(super) fn len(&self) -> usize {
        match &self.entries {
            Entries::Inline(slots) => slots.iter().take_while(|slot| slot.is_some()).count(),
            Entries::Ring(ring) => ring.len(),
        }
    }

    /// Entries the map has room for without allocating more.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        match &self.entries {
            Entries::Inline(_) => INLINE_MAX,
            Entries::Ring(ring) => ring.capacity(),
        }
    }

    /// Whether the entries are on the heap (more than fit inline, and not moved back yet).
    #[cfg(test)]
    pub(super) fn spilled(&self) -> bool {
        matches!(self.entries, Entries::Ring(_))
    }

    pub(super) fn get(&self, ts: &Timestamp) -> Option<&V> {
        match &self.entries {
            Entries::Inline(slots) => {
                slots.iter().flatten().find(|(entry_ts, _)| entry_ts == ts).map(|(_, value)| value)
            }
            Entries::Ring(ring) => Self::position(ring, *ts).ok().map(|index| &ring[index].1),
        }
    }

    pub(super) fn get_mut(&mut self, ts: &Timestamp) -> Option<&mut V> {
        match &mut self.entries {
            Entries::Inline(slots) => {
                slots.iter_mut().flatten().find(|(entry_ts, _)| entry_ts == ts).map(|(_, value)| value)
            }
            Entries::Ring(ring) => Self::position(ring, *ts).ok().map(|index| &mut ring[index].1),
        }
    }

    pub(super) fn contains_key(&self, ts: &Timestamp) -> bool {
        self.get(ts).is_some()
    }

    /// Stores `value` at `ts`, returning what was stored there before.
    pub(super) fn insert(&mut self, ts: Timestamp, value: V) -> Option<V> {
        if let Entries::Inline(slots) = &mut self.entries {
            let len = slots.iter().take_while(|slot| slot.is_some()).count();
            let index = slots[..len].iter().flatten().position(|&(entry_ts, _)| entry_ts >= ts).unwrap_or(len);
            if let Some(Some((entry_ts, entry))) = slots.get_mut(index) {
                if *entry_ts == ts {
                    return Some(std::mem::replace(entry, value));
                }
            }
            if len < INLINE_MAX {
                slots[index..=len].rotate_right(1);
                slots[index] = Some((ts, value));
                return None;
            }
            // Full: to a ring buffer with room for a few more (writes in flight).
            let mut ring = VecDeque::with_capacity(2 * INLINE_MAX);
            ring.extend(slots.iter_mut().filter_map(Option::take));
            self.entries = Entries::Ring(ring);
        }
        let Entries::Ring(ring) = &mut self.entries else { unreachable!("moved to a ring above") };
        match Self::position(ring, ts) {
            Ok(index) => Some(std::mem::replace(&mut ring[index].1, value)),
            Err(index) => {
                ring.insert(index, (ts, value));
                None
            }
        }
    }

    pub(super) fn remove(&mut self, ts: &Timestamp) -> Option<V> {
        match &mut self.entries {
            Entries::Inline(slots) => {
                let index = slots.iter().position(|slot| slot.as_ref().is_some_and(|(entry_ts, _)| entry_ts == ts))?;
                let (_, value) = slots[index].take().expect("found above");
                slots[index..].rotate_left(1);
                Some(value)
            }
            Entries::Ring(ring) => {
                let index = Self::position(ring, *ts).ok()?;
                let (_, value) = ring.remove(index).expect("position is in range");
                // A quarter full: halving at least, so shrinking costs O(1) per removal,
                // amortized; back inline once few enough.
                let (len, capacity) = (ring.len(), ring.capacity());
                if len <= capacity / 4 {
                    match len <= INLINE_MAX {
                        true => self.move_inline(),
                        false => ring.shrink_to_fit(),
                    }
                }
                Some(value)
            }
        }
    }

    /// A key at rest (the sweep's visit): its versions back inline if they fit.
    pub(super) fn shrink_at_rest(&mut self) {
        if self.len() <= INLINE_MAX {
            self.move_inline();
        }
    }

    /// Moves the entries (at most [`INLINE_MAX`]) back inline.
    fn move_inline(&mut self) {
        if let Entries::Ring(ring) = &mut self.entries {
            debug_assert!(ring.len() <= INLINE_MAX);
            let mut slots = [None, None];
            for (slot, entry) in slots.iter_mut().zip(ring.drain(..)) {
                *slot = Some(entry);
            }
            self.entries = Entries::Inline(slots);
        }
    }

    /// The newest timestamp stored (`None`: no version).
    pub(super) fn newest_ts(&self) -> Option<Timestamp> {
        match &self.entries {
            Entries::Inline(slots) => slots.iter().flatten().next_back().map(|&(ts, _)| ts),
            Entries::Ring(ring) => ring.back().map(|&(ts, _)| ts),
        }
    }

    /// In timestamp order.
    pub(super) fn values(&self) -> Values<'_, V> {
        match &self.entries {
            Entries::Inline(slots) => Values::Inline(slots.iter().flatten()),
            Entries::Ring(ring) => Values::Ring(ring.iter()),
        }
    }
}

/// [`VersionMap::values`].
pub(super) enum Values<'a, V> {
    Inline(Flatten<slice::Iter<'a, Option<(Timestamp, V)>>>),
    Ring(vec_deque::Iter<'a, (Timestamp, V)>),
}

impl<'a, V> Iterator for Values<'a, V> {
    type Item = &'a V;

    fn next(&mut self) -> Option<&'a V> {
        match self {
            Values::Inline(entries) => entries.next().map(|(_, value)| value),
            Values::Ring(entries) => entries.next().map(|(_, value)| value),
        }
    }
}

impl<V> DoubleEndedIterator for Values<'_, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Values::Inline(entries) => entries.next_back().map(|(_, value)| value),
            Values::Ring(entries) => entries.next_back().map(|(_, value)| value),
        }
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
            assert_eq!(map.newest_ts(), model.keys().next_back().copied(), "step {step}: newest");
            assert!(map.capacity() <= 4 * map.len().max(1), "step {step}: shrinks");
        }
    }

    #[test]
    fn two_versions_stay_inline_and_a_third_spills_until_the_key_is_back_at_rest() {
        let mut map = VersionMap::default();
        map.insert(7, "a");
        map.insert(9, "b");
        assert!(!map.spilled(), "a key and the write replacing its version: inline");
        assert_eq!(map.remove(&7), Some("a"));
        map.insert(11, "c");
        assert_eq!(map.insert(11, "C"), Some("c"), "a retried PREPARE replaces inline");
        assert!(!map.spilled());
        map.insert(10, "x");
        assert!(map.spilled(), "a third version goes to the ring");
        assert!(map.values().eq(["b", "x", "C"].iter()));
        assert_eq!(map.remove(&10), Some("x"));
        assert!(map.spilled(), "two in a ring of four: kept, no churn while written");
        map.shrink_at_rest();
        assert!(!map.spilled(), "at rest: back inline");
        assert!(map.values().eq(["b", "C"].iter()));
        assert_eq!(map.values().next_back(), Some(&"C"));
        assert_eq!(map.remove(&9), Some("b"));
        assert_eq!(map.remove(&11), Some("C"));
        assert_eq!((map.len(), map.remove(&11)), (0, None));
    }
}
