//! Helpers shared by the integration tests: seeds, directories, a random workload that
//! changes a store and logs it as a server would (apply, then append), and a comparison of
//! two stores.
#![allow(dead_code)] // each test file uses part of it

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use rampkv_core::storage::{Key, Store, StoredMetadata};
use rampkv_core::types::Timestamp;
use rampkv_core::wire::{TxnState, WriteSet};
use rampkv_durable::{open, FsyncPolicy, Log, Lsn, OpenOptions, RecordRef, RecoveryReport};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The seed of a randomized test: `RAMPKV_DURABLE_SEED` if set, else random; printed.
pub fn seed(test: &str) -> u64 {
    let seed =
        std::env::var("RAMPKV_DURABLE_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(rand::random);
    println!("{test}: seed {seed} (replay with RAMPKV_DURABLE_SEED={seed})");
    seed
}

/// A fresh directory on the disk the build uses (not a RAM file system, where an fsync
/// costs nothing and group commit has nothing to group).
pub fn test_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("durable-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temporary directory")
}

pub fn options(policy: FsyncPolicy) -> OpenOptions {
    OpenOptions { policy, ..OpenOptions::default() }
}

/// Opens `dir` into a new store (GC grace long enough that nothing is collected in a test).
pub fn reopen(dir: &Path, options: &OpenOptions) -> (Log, Store, RecoveryReport) {
    let store = Store::new(u64::MAX / 4);
    let (log, report) = open(dir, options, &store).expect("open");
    (log, store, report)
}

pub fn key(text: &str) -> Key {
    text.as_bytes().into()
}

/// A server's writes, randomized: transactions of its own (timestamps end in `writer`),
/// prepared, committed, aborted, PUT, retried, and STATUS probes of transactions never seen
/// (which mark them aborted). Each change is applied to the store, then its record appended.
pub struct Workload {
    random: SmallRng,
    writer: u64,
    counter: u64,
    keys: usize,
    pending: Vec<(Timestamp, Vec<Key>)>,
    aborted: Vec<Timestamp>,
}

impl Workload {
    pub fn new(seed: u64, writer: u16, keys: usize) -> Workload {
        Workload {
            random: SmallRng::seed_from_u64(seed ^ u64::from(writer).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            writer: u64::from(writer),
            counter: 0,
            keys,
            pending: Vec::new(),
            aborted: Vec::new(),
        }
    }

    fn next_ts(&mut self) -> Timestamp {
        self.counter += 1;
        self.counter << 16 | self.writer
    }

    fn some_keys(&mut self) -> Vec<Key> {
        let count = self.random.gen_range(1..=4);
        let mut keys: Vec<Key> =
            (0..count).map(|_| key(&format!("k{}", self.random.gen_range(0..self.keys)))).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    fn value(&mut self, key: &Key, ts: Timestamp) -> Box<[u8]> {
        let mut value = format!("{}@{ts}:", String::from_utf8_lossy(key)).into_bytes();
        let padding = self.random.gen_range(0..200);
        value.extend((0..padding).map(|index| (index as u8).wrapping_add(ts as u8)));
        value.into()
    }

    /// One change (applied, then appended, then flushed, as a server does after each call);
    /// returns the LSN of its record, if it made one.
    pub fn step(&mut self, store: &Store, log: &Log) -> Option<Lsn> {
        let lsn = self.change(store, log);
        log.flush().expect("flush");
        lsn
    }

    fn change(&mut self, store: &Store, log: &Log) -> Option<Lsn> {
        match self.random.gen_range(0..20) {
            0..=6 => Some(self.prepare(store, log)),
            7..=11 if !self.pending.is_empty() => {
                let (ts, _) = self.pending.swap_remove(self.random.gen_range(0..self.pending.len()));
                store.commit(ts);
                Some(log.append(0, RecordRef::Commit { ts }).expect("append"))
            }
            12 if !self.pending.is_empty() => {
                let (ts, _) = self.pending.swap_remove(self.random.gen_range(0..self.pending.len()));
                store.abort(ts, 0);
                self.aborted.push(ts);
                Some(log.append(0, RecordRef::Abort { ts }).expect("append"))
            }
            13..=15 => {
                let ts = self.next_ts();
                let writes: Vec<(Key, Box<[u8]>)> =
                    self.some_keys().into_iter().map(|key| (key.clone(), self.value(&key, ts))).collect();
                store.put(ts, writes.clone(), 0).expect("put");
                Some(log.append(0, RecordRef::Put { ts, writes: (&writes).into() }).expect("append"))
            }
            16 => {
                // A STATUS probe of a transaction never prepared here marks it aborted.
                let ts = self.next_ts();
                let keys = self.some_keys();
                assert_eq!(store.status(ts, &keys, 0), TxnState::Unknown);
                self.aborted.push(ts);
                Some(log.append(0, RecordRef::Abort { ts }).expect("append"))
            }
            17 if !self.aborted.is_empty() => {
                // A late PREPARE of an aborted transaction is refused and logs nothing.
                let ts = self.aborted[self.random.gen_range(0..self.aborted.len())];
                let keys = self.some_keys();
                let writes = keys.iter().map(|key| (key.clone(), Box::from(&b"late"[..]))).collect();
                assert!(store.prepare(ts, StoredMetadata::None, WriteSet::default(), writes, 0).is_err());
                None
            }
            18 if !self.pending.is_empty() => {
                // A retried PREPARE (same transaction, same writes).
                let (ts, keys) = self.pending[self.random.gen_range(0..self.pending.len())].clone();
                Some(self.prepare_as(store, log, ts, keys))
            }
            _ => Some(self.prepare(store, log)),
        }
    }

    fn prepare(&mut self, store: &Store, log: &Log) -> Lsn {
        let ts = self.next_ts();
        let keys = self.some_keys();
        self.pending.push((ts, keys.clone()));
        self.prepare_as(store, log, ts, keys)
    }

    /// PREPARE `ts` on `keys`; its metadata follows the transaction (RAMP-Fast, -Small or
    /// -Hybrid), so a retry carries the same.
    fn prepare_as(&mut self, store: &Store, log: &Log, ts: Timestamp, keys: Vec<Key>) -> Lsn {
        let write_set = WriteSet::from_keys(&keys).expect("short keys, few");
        let metadata = match ts % 3 {
            0 => StoredMetadata::WriteSet(write_set.clone()),
            1 => StoredMetadata::None,
            _ => StoredMetadata::Bloom(Arc::from(&ts.to_le_bytes()[..])),
        };
        let writes: Vec<(Key, Box<[u8]>)> = keys
            .iter()
            .map(|key| {
                let mut value = format!("{}@{ts}", String::from_utf8_lossy(key)).into_bytes();
                value.resize(value.len() + (ts as usize % 97), b'.');
                (key.clone(), value.into())
            })
            .collect();
        store.prepare(ts, metadata.clone(), write_set.clone(), writes.clone(), 0).expect("prepare");
        let record = RecordRef::Prepare { ts, metadata: &metadata, write_set: &write_set, writes: (&writes).into() };
        log.append(0, record).expect("append")
    }
}

/// One version as compared: committed, value, metadata.
pub type VersionImage = (bool, Box<[u8]>, StoredMetadata);

/// One key as compared: its versions by timestamp, lastCommit, the latest version's ts.
pub type KeyImage = (BTreeMap<Timestamp, VersionImage>, Timestamp, Timestamp);

/// What a store holds: `keys`, `pending` and `aborted` are what a restart must give back;
/// `superseded` it may give back in part or not at all.
#[derive(Debug, PartialEq, Eq)]
pub struct StoreImage {
    /// Every key's versions but the committed ones its newest committed version supersedes,
    /// lastCommit and the latest version.
    pub keys: BTreeMap<Key, KeyImage>,
    /// ts -> (keys here, write set)
    pub pending: BTreeMap<Timestamp, (BTreeSet<Key>, Vec<Key>)>,
    pub aborted: BTreeSet<Timestamp>,
    /// The superseded committed versions: a file snapshot leaves them out as collected, replay
    /// after it may bring some back.
    pub superseded: BTreeMap<(Key, Timestamp), VersionImage>,
}

pub fn image(store: &Store) -> StoreImage {
    let mut keys = BTreeMap::new();
    let mut superseded = BTreeMap::new();
    for shard in 0..store.shard_count() {
        for entry in store.shard_versions(shard, rampkv_core::storage::Superseded::Keep) {
            let last_commit = store.last_commit(&entry.key);
            let mut versions = BTreeMap::new();
            for (version, committed) in &entry.versions {
                let image = (*committed, version.value.clone(), version.metadata.clone());
                if *committed && version.ts < last_commit {
                    superseded.insert((entry.key.clone(), version.ts), image);
                } else {
                    versions.insert(version.ts, image);
                }
            }
            let latest = store.get_latest(&entry.key).map_or(0, |version| version.ts);
            keys.insert(entry.key.clone(), (versions, last_commit, latest));
        }
    }
    let pending = store
        .stale_pending(u64::MAX)
        .into_iter()
        .map(|(ts, pending)| {
            (ts, (pending.keys.into_iter().collect(), pending.write_set.iter().map(Key::from).collect()))
        })
        .collect();
    let aborted = store.aborted_transactions().into_iter().collect();
    StoreImage { keys, pending, aborted, superseded }
}

/// Asserts that a recovered store gives back what a restart must of the live one: the same
/// versions (superseded ones aside), lastCommit, latest versions, pending and aborted
/// transactions; and that every superseded version it holds (replayed after its snapshot) is
/// one the live store holds, the same (with a readable first difference).
pub fn assert_same_store(live: &Store, recovered: &Store) {
    let (live, recovered) = (image(live), image(recovered));
    for ((key, ts), version) in &recovered.superseded {
        let found = live.superseded.get(&(key.clone(), *ts));
        assert_eq!(found, Some(version), "superseded version {ts} of {}", String::from_utf8_lossy(key));
    }
    for (key, state) in &live.keys {
        assert_eq!(recovered.keys.get(key), Some(state), "key {}", String::from_utf8_lossy(key));
    }
    assert_eq!(live.keys.len(), recovered.keys.len(), "number of keys");
    assert_eq!(live.pending, recovered.pending, "pending transactions");
    assert_eq!(live.aborted, recovered.aborted, "aborted transactions");
}
