//! What a key costs in a server's store, counted by a counting allocator (requested bytes, so
//! without the allocator's own overhead; compare with the resident set size that
//! `scripts/resp_bench.sh --memory` reads for the whole process).
//!
//! The load is the memory benchmark's, on one store: SETs of 1 KiB values (RAMP-Fast, so each
//! version carries its one-key write set) over random keys, all within the GC grace period, then
//! sweeps past it. Prints the bytes held at the peak and after the sweeps, per key.
//!
//! Usage: cargo run --release -p rampkv --example store_memory [WRITES] [KEYSPACE] (defaults
//! 200000 and 100000). Prints its seed; RAMPKV_STORE_MEMORY_SEED=S replays it.

use std::alloc::System;

use rand::{rngs::SmallRng, Rng, SeedableRng};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

use rampkv::limits::{GC_GRACE_MS, GC_SWEEP_KEYS_PER_TICK};
use rampkv::storage::{Key, Store, StoredMetadata, SweepCursor};
use rampkv::wire::WriteSet;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const VALUE_BYTES: usize = 1_024;

fn held(region: &Region<'_, System>) -> i64 {
    let change = region.change();
    // A reallocation's growth is in bytes_allocated, its shrinking in bytes_deallocated.
    change.bytes_allocated as i64 - change.bytes_deallocated as i64
}

fn main() {
    let mut arguments = std::env::args().skip(1).map(|text| text.parse::<u64>().expect("a count"));
    let writes = arguments.next().unwrap_or(200_000);
    let keyspace = arguments.next().unwrap_or(100_000);
    let seed: u64 =
        std::env::var("RAMPKV_STORE_MEMORY_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(rand::random);
    println!("seed {seed} (replay with RAMPKV_STORE_MEMORY_SEED={seed}); {writes} writes of {VALUE_BYTES} B over {keyspace} keys");
    let mut random = SmallRng::seed_from_u64(seed);

    let store = Store::new(GC_GRACE_MS);
    let region = Region::new(GLOBAL);
    for ts in 1..=writes {
        let key: Key = format!("key:{:012}", random.gen_range(0..keyspace)).into_bytes().into();
        let write_set = WriteSet::from_keys(&[&key]).expect("a short key");
        let value = vec![b'x'; VALUE_BYTES].into_boxed_slice();
        let metadata = StoredMetadata::WriteSet(write_set.clone());
        store.prepare(ts, metadata, write_set, vec![(key, value)], 0).expect("a valid prepare");
        store.commit(ts);
    }
    let peak = held(&region);
    let stats = store.stats();
    let keys = stats.keys as i64;
    println!(
        "within the grace period: {} keys, {} versions, {:.1} MB held: {:.0} B per key, {:.0} B per version",
        keys,
        stats.versions,
        peak as f64 / 1e6,
        peak as f64 / keys as f64,
        peak as f64 / stats.versions as f64
    );

    // A pass marks the superseded versions (as the server's sweep does lazily); passes a grace
    // period later collect them and copy the survivors (two: the copying has a byte budget).
    let mut cursor = SweepCursor::default();
    let pass = stats.keys / GC_SWEEP_KEYS_PER_TICK + store.shard_count() + 1;
    for (passes, now_ms) in [(1, 1), (2, GC_GRACE_MS + 1)] {
        for _ in 0..passes * pass {
            store.sweep(&mut cursor, GC_SWEEP_KEYS_PER_TICK, rampkv::storage::SweepClock::monotonic(now_ms), None);
        }
    }
    let after = held(&region);
    let stats = store.stats();
    println!(
        "after the sweeps: {} versions, {:.1} MB held: {:.0} B per key, of which {} B the value and {:.0} B the rest",
        stats.versions,
        after as f64 / 1e6,
        after as f64 / keys as f64,
        VALUE_BYTES,
        after as f64 / keys as f64 - VALUE_BYTES as f64
    );
}
