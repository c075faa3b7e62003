//! Single-key conditional writes (issue 31 item 4) against concurrent RAMP transactions, with
//! the read-atomicity checker running.
//!
//! Four servers over TCP. Incrementers INCR counters that nothing else writes; MSET writers
//! write a group of keys on several partitions (check values); a group updater runs
//! GETSET / APPEND / SET XX / EXPIRE / PERSIST / GETEX EXAT on single keys of that group
//! (one-key writes at the update's timestamp); readers read the group and the counters read-atomically. Every transaction goes
//! into a history. Asserted: every counter ends at the number of acknowledged increments (no
//! increment lost, none counted twice), the checker finds the history clean (no read saw an
//! MSET on one key and missed it on another, updates and all), and the run raced updates
//! against the group's writes and reads. The seed (`RAMPKV_TEST_SEED` replays the workload's
//! choices) is printed.

#[allow(dead_code)] // the shared harness: this test uses its seed and addresses only
mod common;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rampkv::checker;
use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::history::{fill_check_value, key_to_history_string, ReadRecord, Record, WriteRecord};
use rampkv::protocol::ramp::{Algorithm, TxnOptions};
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::wire::{ExpireCondition, GetExExpiry, SetCondition, SetExpiry, UpdateOp};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const GROUP_KEYS: usize = 6;
const COUNTERS: usize = 2;
const INCREMENTERS: usize = 3;
const MSET_WRITERS: usize = 2;
const READERS: usize = 3;
/// Every thread runs this long.
const RUN_MS: u64 = 2_000;

fn group_key(index: usize) -> Vec<u8> {
    format!("group:k{index}").into_bytes()
}

fn counter_key(index: usize) -> Vec<u8> {
    format!("counter:{index}").into_bytes()
}

/// What the threads share: the history, the run's clock, the acknowledged increments.
struct Shared {
    origin: Instant,
    records: Mutex<Vec<Record>>,
    increments: Vec<AtomicU64>,
    /// Timestamps of the updates' versions (a read of a non-check value must be one of them).
    update_ts: Mutex<HashSet<u64>>,
}

impl Shared {
    fn running(&self) -> bool {
        self.origin.elapsed().as_millis() < u128::from(RUN_MS)
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn write(&self, client: u64, ts: u64, keys: &[Vec<u8>], start_ns: u64) {
        let keys = keys.iter().map(|key| key_to_history_string(key)).collect();
        let record = WriteRecord { client, ts, keys, start_ns, end_ns: self.now_ns(), ok: true };
        self.records.lock().unwrap().push(Record::Write(record));
    }
}

fn run(algorithm: Algorithm) {
    let seed = common::seed();
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 4]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let servers: HashSet<usize> = (0..GROUP_KEYS).map(|index| cluster.server_of(&group_key(index))).collect();
    assert!(servers.len() >= 2, "the group must span servers: {servers:?}");
    let shared = Arc::new(Shared {
        origin: Instant::now(),
        records: Mutex::new(Vec::new()),
        increments: (0..COUNTERS).map(|_| AtomicU64::new(0)).collect(),
        update_ts: Mutex::new(HashSet::new()),
    });
    let options = TxnOptions { algorithm, ..TxnOptions::default() };
    let connect = |cluster: &Cluster| {
        let mut client = Client::connect(cluster).unwrap();
        client.set_txn_options(options);
        client
    };
    let mut threads = Vec::new();
    let mut thread_id = 0u64;
    let mut spawn = |body: Box<dyn FnOnce(u64, Client, SmallRng, Arc<Shared>) + Send>| {
        thread_id += 1;
        let (client, rng, shared) = (connect(&cluster), SmallRng::seed_from_u64(seed ^ thread_id), Arc::clone(&shared));
        let id = thread_id;
        threads.push(std::thread::spawn(move || body(id, client, rng, shared)));
    };
    for _ in 0..INCREMENTERS {
        spawn(Box::new(|id, mut client, mut rng, shared| {
            while shared.running() {
                let counter = rng.gen_range(0..COUNTERS);
                let start_ns = shared.now_ns();
                let updated = client.update(counter_key(counter), UpdateOp::IncrBy(1)).expect("INCR failed");
                let ts = updated.written.expect("an INCR writes");
                shared.increments[counter].fetch_add(1, Ordering::Relaxed);
                shared.update_ts.lock().unwrap().insert(ts);
                shared.write(id, ts, &[counter_key(counter)], start_ns);
            }
        }));
    }
    for _ in 0..MSET_WRITERS {
        spawn(Box::new(|id, mut client, mut rng, shared| {
            let keys: Vec<Vec<u8>> = (0..GROUP_KEYS).map(group_key).collect();
            while shared.running() {
                let start_ns = shared.now_ns();
                let size = rng.gen_range(16..64);
                let build = |ts| {
                    let value = |_| {
                        let mut value = vec![0; size];
                        fill_check_value(ts, &mut value);
                        value
                    };
                    keys.iter().map(|key| (key.clone(), value(key))).collect()
                };
                let ts = client.put_all_with(build).expect("MSET failed");
                shared.write(id, ts, &keys, start_ns);
                // A pause between MSETs, as a real writer has: back to back, two writers keep a
                // prepared version on every group key nearly always, and an update (which waits
                // while one is prepared) gets through only a few times a second.
                std::thread::sleep(std::time::Duration::from_micros(rng.gen_range(0..400)));
            }
        }));
    }
    spawn(Box::new(|id, mut client, mut rng, shared| {
        while shared.running() {
            let key = group_key(rng.gen_range(0..GROUP_KEYS));
            // The expiry ops' deadline is an hour away: the keys stay readable.
            let far_ms = rampkv::types::wall_clock_unix_ms() + 3_600_000;
            let op = match rng.gen_range(0..6) {
                0 => UpdateOp::Set {
                    value: b"getset".to_vec(),
                    condition: SetCondition::Always,
                    get_old: true,
                    expiry: SetExpiry::Clear,
                },
                1 => UpdateOp::Append(b"+".to_vec()),
                2 => UpdateOp::Expire { deadline_ms: far_ms, condition: ExpireCondition::Always },
                3 => UpdateOp::Persist,
                4 => UpdateOp::GetEx(GetExExpiry::At(far_ms)),
                _ => UpdateOp::Set {
                    value: b"xx".to_vec(),
                    condition: SetCondition::IfPresent,
                    get_old: false,
                    expiry: SetExpiry::Clear,
                },
            };
            let start_ns = shared.now_ns();
            let updated = client.update(key.clone(), op).expect("update failed");
            if let Some(ts) = updated.written {
                shared.update_ts.lock().unwrap().insert(ts);
                shared.write(id, ts, &[key], start_ns);
            }
        }
    }));
    for _ in 0..READERS {
        spawn(Box::new(|id, mut client, _rng, shared| {
            let keys: Vec<Vec<u8>> = (0..GROUP_KEYS).map(group_key).chain((0..COUNTERS).map(counter_key)).collect();
            let names: Vec<String> = keys.iter().map(|key| key_to_history_string(key)).collect();
            while shared.running() {
                let start_ns = shared.now_ns();
                let outcome = client.get_all(keys.clone()).expect("read failed");
                let record = ReadRecord::of_outcome(id, names.clone(), &outcome, start_ns, shared.now_ns());
                shared.records.lock().unwrap().push(Record::Read(record));
            }
        }));
    }
    for thread in threads {
        thread.join().expect("a workload thread failed");
    }

    // No increment lost or doubled.
    let mut client = connect(&cluster);
    let finals = client.get_all((0..COUNTERS).map(counter_key).collect()).unwrap();
    let mut counted = BTreeMap::new();
    for (index, item) in finals.items.iter().enumerate() {
        let value: u64 = std::str::from_utf8(&item.value).unwrap().parse().unwrap();
        let acknowledged = shared.increments[index].load(Ordering::Relaxed);
        assert_eq!(value, acknowledged, "counter {index}: {value} after {acknowledged} acknowledged INCRs");
        counted.insert(index, value);
    }
    let total: u64 = shared.increments.iter().map(|count| count.load(Ordering::Relaxed)).sum();
    assert!(total >= 100, "only {total} increments ran");
    // A version an update wrote holds the op's value, not a check value (APPEND's is an MSET's
    // with a byte more): its value is not checked. Every other version read must be an MSET's
    // check value of its own timestamp (the checker verifies it).
    let update_ts = shared.update_ts.lock().unwrap();
    let group_names: HashSet<String> = (0..GROUP_KEYS).map(|index| key_to_history_string(&group_key(index))).collect();
    let mut records = shared.records.lock().unwrap();
    let mut updates_seen = 0;
    for record in records.iter_mut() {
        let Record::Read(read) = record else { continue };
        for (key, ts) in &read.reads {
            if *ts == 0 || update_ts.contains(ts) {
                read.value_ts.remove(key);
                updates_seen += usize::from(*ts != 0 && group_names.contains(key));
            }
        }
    }
    let report = checker::check(&records);
    println!("seed {seed}, {algorithm:?}: {} records, counters {counted:?}; checker: {report}", records.len());
    assert!(report.is_clean(), "read atomicity violated with single-key updates running:\n{report}");
    let group_updates = records
        .iter()
        .filter(|record| matches!(record, Record::Write(write) if write.keys.len() == 1 && group_names.contains(&write.keys[0])))
        .count();
    println!("{group_updates} updates of the group's keys, seen by {updates_seen} reads of them");
    assert!(group_updates >= 20, "only {group_updates} updates of the group's keys ran");
    assert!(updates_seen > 0, "no read of the group saw an update's version: the run raced nothing");
}

#[test]
fn increments_and_updates_beside_ramp_fast_transactions_lose_nothing_and_tear_nothing() {
    run(Algorithm::RampFast);
}

#[test]
fn increments_and_updates_beside_ramp_small_transactions_lose_nothing_and_tear_nothing() {
    run(Algorithm::RampSmall);
}

#[test]
fn increments_and_updates_beside_ramp_hybrid_transactions_lose_nothing_and_tear_nothing() {
    run(Algorithm::RampHybrid);
}
