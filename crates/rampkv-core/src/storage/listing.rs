//! The key listing: the live keys in the order of their 64-bit key hash, page by page, and
//! their count (the servers' side of SCAN, KEYS and DBSIZE).
//!
//! # Contract
//! - A key is *live* at an instant when its newest committed version is not a deletion
//!   ([`is_live_at`], the one place that says so).
//! - [`Store::list_keys`] returns, in increasing hash order, live keys whose hash is above the
//!   cursor, and a cursor to resume after (the highest hash it has looked at), or none when no
//!   hash is left. So a listing resumed page after page from the start returns every key that
//!   was live for the whole listing at least once, whatever was written or deleted in between
//!   (Redis's SCAN guarantee): such a key's hash is above the cursor until the page that
//!   passes it, and that page, looking at its hash range, finds it live. A key written or
//!   deleted during the listing may or may not be returned; one whose hash the cursor already
//!   passed is not returned again, so no key comes twice.
//! - A page holds at most `keys_max` keys and `bytes_max` key bytes, except that the keys of
//!   one *hash block* (2^`LIST_HASH_BLOCK_BITS` consecutive hashes: one key, but for
//!   collisions and near-collisions) always go together: a page whose first block holds more
//!   holds that block alone. A page ends at the end of a block, so a resume point is always a
//!   block's last hash and fits 48 bits (the RESP gateway's SCAN cursor holds it with the
//!   partition in 64). It looks at no more than about `visited_max` keys: past that it ends at
//!   the end of the shard it is in, with fewer keys, or none.
//!
//! # Why hash order
//! Shards hold consecutive hash ranges (`shard_of_hash`), so a page reads the shards from the
//! cursor's on, each under its read lock for one pass (writers of that shard wait for one pass,
//! never for the whole listing), and sorts only the keys of the shards it reads. Insertion order
//! or a snapshot would need state kept per listing; the hash order needs none, and a cursor is
//! one number.

use super::{shard_of_hash, Key, KeyState, Store, Version, SHARD_BITS, SHARD_COUNT};
use crate::cluster::key_hash;
use crate::limits::{LIST_HASH_BLOCK_BITS, LIST_PAGE_BYTES_MAX, LIST_VISITED_KEYS_MAX};

/// The whole stored value of a key the RESP gateway deleted before deletions were versions
/// (`rampkv_resp::value`); data written then may still hold it, and it reads absent through
/// the gateway, so the listing leaves it out too.
const GATEWAY_TOMBSTONE: [u8; 1] = [0x00];

/// Whether a key whose newest committed version is `version` is live at `wall_clock_us` (the
/// server's wall clock, as `Now::wall_clock_us`): not expired at that instant (a deletion is a
/// version already expired, a reclaimed one expired long ago) and not the gateway's old
/// tombstone. The one place that judges liveness.
pub fn is_live_at(version: &Version, wall_clock_us: u64) -> bool {
    !version.expiry.is_reclaimed()
        && !version.expiry.is_expired_at(wall_clock_us / 1_000)
        && *version.value != GATEWAY_TOMBSTONE
}

/// The bounds of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListBounds {
    pub keys_max: usize,
    pub bytes_max: usize,
    pub visited_max: usize,
}

impl ListBounds {
    /// A page of at most `keys_max` keys, within the listing's byte and work bounds.
    pub fn keys(keys_max: usize) -> ListBounds {
        ListBounds { keys_max: keys_max.max(1), bytes_max: LIST_PAGE_BYTES_MAX, visited_max: LIST_VISITED_KEYS_MAX }
    }
}

/// One page of [`Store::list_keys`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyListing {
    /// In increasing key-hash order.
    pub keys: Vec<Key>,
    /// Resume after this hash (`None`: no hash is left).
    pub resume: Option<u64>,
}

/// Bytes a key takes in a page (its length field too).
fn listed_bytes(key: &[u8]) -> usize {
    key.len() + 2
}

fn live(state: &KeyState, wall_clock_us: u64) -> bool {
    // `latest` is the version at lastCommit (none while nothing is committed).
    let latest = state.latest.lock();
    latest.as_deref().is_some_and(|version| is_live_at(version, wall_clock_us))
}

/// A page being filled, one hash group at a time.
struct PageBuilder {
    page: KeyListing,
    bytes: usize,
    bounds: ListBounds,
}

/// Whether a page takes more groups.
#[derive(Debug, PartialEq, Eq)]
enum Offer {
    Taken,
    Full,
}

impl PageBuilder {
    /// Offers the live keys of hash block `block` (above every block offered before). A group
    /// that does not fit ends the page before it (resume at the end of the block below) unless
    /// the page is empty: then it is taken whole, so that no cursor falls inside a block.
    fn offer(&mut self, block: u64, group: &[&[u8]]) -> Offer {
        debug_assert!(self.page.resume.is_none(), "a full page takes nothing more");
        if group.is_empty() {
            return Offer::Taken;
        }
        let group_bytes: usize = group.iter().map(|key| listed_bytes(key)).sum();
        let keys = self.page.keys.len() + group.len();
        if (keys > self.bounds.keys_max || self.bytes + group_bytes > self.bounds.bytes_max)
            && !self.page.keys.is_empty()
        {
            // Everything below this block was looked at (block > 0: a smaller one was taken).
            self.page.resume = Some((block << LIST_HASH_BLOCK_BITS) - 1);
            return Offer::Full;
        }
        self.page.keys.extend(group.iter().map(|&key| Key::from(key)));
        self.bytes += group_bytes;
        if self.page.keys.len() >= self.bounds.keys_max || self.bytes >= self.bounds.bytes_max {
            self.page.resume = Some(block_last_hash(block));
            return Offer::Full;
        }
        Offer::Taken
    }
}

impl Store {
    /// One page of the live keys whose hash `wanted` accepts (a partition's), from the first
    /// hash (`after` None) or after hash `after`, judged live at `wall_clock_us`; see the
    /// module's contract.
    pub fn list_keys(
        &self,
        after: Option<u64>,
        wanted: impl Fn(u64) -> bool,
        wall_clock_us: u64,
        bounds: ListBounds,
    ) -> KeyListing {
        let from = match after {
            None => 0,
            Some(u64::MAX) => return KeyListing::default(),
            Some(hash) => hash + 1,
        };
        let mut builder = PageBuilder { page: KeyListing::default(), bytes: 0, bounds };
        let mut visited = 0;
        for shard_index in shard_of_hash(from)..SHARD_COUNT {
            let shard = self.shards[shard_index].read();
            visited += shard.len();
            let mut candidates: Vec<(u64, &[u8], &KeyState)> = shard
                .iter()
                .filter_map(|(key, state)| {
                    let hash = key_hash(key);
                    (hash >= from && wanted(hash)).then_some((hash, &key[..], state))
                })
                .collect();
            candidates.sort_unstable_by_key(|(hash, _, _)| *hash);
            let mut group: Vec<&[u8]> = Vec::new();
            let block_of = |hash: u64| hash >> LIST_HASH_BLOCK_BITS;
            for same_block in candidates.chunk_by(|left, right| block_of(left.0) == block_of(right.0)) {
                group.clear();
                group.extend(
                    same_block.iter().filter(|(_, _, state)| live(state, wall_clock_us)).map(|(_, key, _)| *key),
                );
                if builder.offer(block_of(same_block[0].0), &group) == Offer::Full {
                    return builder.page;
                }
            }
            let shard_last_hash = shard_last_hash(shard_index);
            if visited >= bounds.visited_max && shard_last_hash != u64::MAX {
                builder.page.resume = Some(shard_last_hash);
                return builder.page;
            }
        }
        builder.page
    }

    /// How many keys whose hash `wanted` accepts are live at `wall_clock_us` (exact while no
    /// write runs; a key written or deleted during the count may be counted either way).
    pub fn count_live_keys(&self, wanted: impl Fn(u64) -> bool, wall_clock_us: u64) -> u64 {
        let mut count = 0;
        for shard in self.shards.iter() {
            let shard = shard.read();
            count +=
                shard.iter().filter(|(key, state)| wanted(key_hash(key)) && live(state, wall_clock_us)).count() as u64;
        }
        count
    }
}

/// The highest hash of hash block `block`.
fn block_last_hash(block: u64) -> u64 {
    (block << LIST_HASH_BLOCK_BITS) | ((1 << LIST_HASH_BLOCK_BITS) - 1)
}

/// The highest hash shard `shard_index` holds.
fn shard_last_hash(shard_index: usize) -> u64 {
    let shift = u64::BITS - SHARD_BITS;
    ((shard_index as u64) << shift) | ((1u64 << shift) - 1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn put(store: &Store, ts: u64, key: &[u8], value: &[u8]) {
        store.put(ts, vec![(key.into(), value.into())], 0).unwrap();
    }

    fn listed_all(store: &Store, bounds: ListBounds, wanted: impl Fn(u64) -> bool + Copy) -> Vec<Key> {
        let mut keys = Vec::new();
        let mut after = None;
        for _ in 0..100_000 {
            let page = store.list_keys(after, wanted, 0, bounds);
            assert!(page.keys.len() <= bounds.keys_max, "no collisions here: {} keys", page.keys.len());
            keys.extend(page.keys);
            match page.resume {
                None => return keys,
                Some(resume) => after = Some(resume),
            }
        }
        panic!("the listing did not end");
    }

    #[test]
    fn shards_hold_consecutive_hash_ranges() {
        assert_eq!(shard_of_hash(0), 0);
        assert_eq!(shard_of_hash(u64::MAX), SHARD_COUNT - 1);
        for shard in 0..SHARD_COUNT {
            assert_eq!(shard_of_hash(shard_last_hash(shard)), shard);
            assert_eq!(shard_of_hash(shard_last_hash(shard).wrapping_add(1)), (shard + 1) % SHARD_COUNT);
        }
    }

    #[test]
    fn a_listing_returns_each_live_key_once_in_hash_order_and_leaves_out_deletions() {
        let store = Store::new(10_000);
        for index in 0..2_000u64 {
            put(&store, index + 1, format!("key:{index}").as_bytes(), b"value");
        }
        for index in (0..2_000u64).step_by(3) {
            put(&store, 10_000 + index, format!("key:{index}").as_bytes(), &GATEWAY_TOMBSTONE);
        }
        let expected: BTreeSet<Key> = (0..2_000u64)
            .filter(|index| index % 3 != 0)
            .map(|index| format!("key:{index}").into_bytes().into_boxed_slice())
            .collect();
        for keys_max in [1, 7, 100, 5_000] {
            let listed = listed_all(&store, ListBounds::keys(keys_max), |_| true);
            assert!(listed.iter().map(|key| key_hash(key)).is_sorted());
            assert_eq!(listed.len(), expected.len(), "each once (keys_max {keys_max})");
            assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), expected);
        }
        assert_eq!(store.count_live_keys(|_| true, 0), expected.len() as u64);
        // One partition of four: the keys whose hash is 1 modulo 4.
        let partition = |hash: u64| hash % 4 == 1;
        let listed = listed_all(&store, ListBounds::keys(10), partition);
        let expected_partition: BTreeSet<Key> =
            expected.iter().filter(|key| partition(key_hash(key))).cloned().collect();
        assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), expected_partition);
        assert_eq!(store.count_live_keys(partition, 0), expected_partition.len() as u64);
    }

    #[test]
    fn pages_keep_their_byte_bound_and_the_visit_bound_ends_a_page_early() {
        let store = Store::new(10_000);
        for index in 0..300u64 {
            put(&store, index + 1, format!("{index:0>200}").as_bytes(), b"v");
        }
        let bounds = ListBounds { keys_max: 1_000, bytes_max: 2_020, visited_max: usize::MAX };
        let page = store.list_keys(None, |_| true, 0, bounds);
        assert_eq!(page.keys.len(), 10, "10 keys of 202 bytes fill 2,020");
        let listed = listed_all(&store, bounds, |_| true);
        assert_eq!(listed.len(), 300);

        // Visiting at most one key a page: each page ends with its shard, so the listing takes
        // at least one page per shard and still returns every key once.
        let sparse = ListBounds { keys_max: 1_000, bytes_max: usize::MAX, visited_max: 1 };
        let page = store.list_keys(None, |_| true, 0, sparse);
        let resume = page.resume.expect("more shards");
        assert_eq!(resume, shard_last_hash(shard_of_hash(resume)), "the page ends with its (first non-empty) shard");
        assert!(
            !page.keys.is_empty() && page.keys.iter().all(|key| shard_of_hash(key_hash(key)) == shard_of_hash(resume))
        );
        assert_eq!(listed_all(&store, sparse, |_| true).len(), 300);
    }

    #[test]
    fn a_page_never_splits_a_hash_block_and_ends_at_a_block_end() {
        // Blocks holding several keys (64-bit FNV-1a collisions, or hashes within 2^16 of one
        // another) are rare in a test: the page builder is offered made-up blocks instead.
        let keys: Vec<Key> = (0..6u8).map(|index| vec![index].into_boxed_slice()).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|key| &key[..]).collect();
        let end_of = |block: u64| (block << LIST_HASH_BLOCK_BITS) | 0xFFFF;
        let mut builder = PageBuilder { page: KeyListing::default(), bytes: 0, bounds: ListBounds::keys(3) };
        assert_eq!(builder.offer(10, &refs[0..2]), Offer::Taken);
        assert_eq!(builder.offer(11, &refs[2..4]), Offer::Full, "two more would make four");
        assert_eq!(builder.page.keys.len(), 2, "block 11 goes whole to the next page");
        assert_eq!(builder.page.resume, Some(end_of(10)), "resume after block 10: block 11 comes next");

        let mut builder = PageBuilder { page: KeyListing::default(), bytes: 0, bounds: ListBounds::keys(3) };
        assert_eq!(builder.offer(7, &refs[0..5]), Offer::Full, "a first block larger than the page");
        assert_eq!((builder.page.keys.len(), builder.page.resume), (5, Some(end_of(7))), "taken whole");

        let mut builder = PageBuilder { page: KeyListing::default(), bytes: 0, bounds: ListBounds::keys(3) };
        assert_eq!(builder.offer(1, &[]), Offer::Taken, "no live key in that block");
        assert_eq!(builder.offer(2, &refs[0..3]), Offer::Full);
        assert_eq!(builder.page.resume, Some(end_of(2)), "a full page resumes after its last block");
    }

    #[test]
    fn every_resume_point_is_a_block_end() {
        let store = Store::new(10_000);
        for index in 0..500u64 {
            put(&store, index + 1, format!("ks:{index}").as_bytes(), b"v");
        }
        for keys_max in [1, 3, 10] {
            let mut after = None;
            loop {
                let page = store.list_keys(after, |_| true, 0, ListBounds::keys(keys_max));
                let Some(resume) = page.resume else { break };
                assert_eq!(resume & 0xFFFF, 0xFFFF, "{resume:#x}");
                after = Some(resume);
            }
        }
    }

    #[test]
    fn a_listing_under_concurrent_writes_returns_every_key_live_throughout() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = StdRng::seed_from_u64(seed);
        let store = Arc::new(Store::new(10_000));
        let stable: Vec<Vec<u8>> = (0..1_000).map(|index| format!("stable:{index}").into_bytes()).collect();
        for (index, key) in stable.iter().enumerate() {
            put(&store, index as u64 + 1, key, b"v");
        }
        let writer = {
            let store = Arc::clone(&store);
            let writer_seed = rng.gen::<u64>();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(writer_seed);
                for ts in 10_000..40_000u64 {
                    let key = format!("churn:{}", rng.gen_range(0..2_000));
                    let value: &[u8] = if rng.gen_bool(0.5) { &GATEWAY_TOMBSTONE } else { b"v" };
                    put(&store, ts, key.as_bytes(), value);
                }
            })
        };
        let mut listed = Vec::new();
        while !writer.is_finished() || listed.is_empty() {
            listed = listed_all(&store, ListBounds::keys(rng.gen_range(1..64)), |_| true);
            let set: BTreeSet<&[u8]> = listed.iter().map(|key| &key[..]).collect();
            assert_eq!(set.len(), listed.len(), "no key twice (seed {seed})");
            for key in &stable {
                assert!(set.contains(&key[..]), "{} missing (seed {seed})", String::from_utf8_lossy(key));
            }
        }
        writer.join().unwrap();
    }
}
