//! Generation rate: operations with key numbers, key names, whole transactions.
//!
//! Run with `cargo bench -p rampkv-ycsb --bench generate`. Every benchmark draws `BATCH`
//! items per sample from a generator seeded with `SEED`, so the rate divan reports
//! ("items/s" / "Mitem/s") is operations (or transactions, where named) per second on one core.
//! Results with their machine and commit are recorded in `docs/ycsb.md`.

use std::hint::black_box;

use divan::counter::ItemsCount;
use divan::Bencher;
use rampkv_ycsb::{
    BuiltinWorkload, CoreWorkload, CoreWorkloadConfig, MicroWorkload, Operation, RequestDistribution, Txn, TxnGenerator,
};

const SEED: u64 = 0x00C0_FFEE;
const BATCH: usize = 10_000;

fn main() {
    println!("seed {SEED}, {BATCH} items per sample");
    divan::main();
}

/// The workloads measured: the request distributions A (zipfian), D (latest, with inserts),
/// and C with uniform keys.
const WORKLOADS: [&str; 3] = ["A zipfian", "D latest", "C uniform"];

fn config(name: &str) -> CoreWorkloadConfig {
    let (builtin, distribution) = match name {
        "A zipfian" => (BuiltinWorkload::A, RequestDistribution::Zipfian),
        "D latest" => (BuiltinWorkload::D, RequestDistribution::Latest),
        _ => (BuiltinWorkload::C, RequestDistribution::Uniform),
    };
    let mut config = builtin.config();
    config.record_count = 1_000_000;
    config.operation_count = 10_000_000;
    config.request_distribution = distribution;
    config
}

fn workload(name: &str) -> CoreWorkload {
    CoreWorkload::new(config(name), SEED).expect("valid workload")
}

/// `next_operation`: operation kind and key number (inserts acknowledged at once).
#[divan::bench(args = WORKLOADS)]
fn operation_and_key_number(bencher: Bencher, name: &str) {
    let mut workload = workload(name);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        for _ in 0..BATCH {
            let operation = workload.next_operation().expect("no error");
            if let Operation::Insert { key_number } = operation {
                workload.acknowledge_insert(key_number).expect("valid");
            }
            black_box(operation);
        }
    });
}

/// `next_operation` plus the key name written into a reused buffer.
#[divan::bench(args = WORKLOADS)]
fn operation_and_key_name(bencher: Bencher, name: &str) {
    let mut workload = workload(name);
    let names = *workload.key_names();
    let mut key = Vec::with_capacity(64);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        for _ in 0..BATCH {
            let operation = workload.next_operation().expect("no error");
            if let Operation::Insert { key_number } = operation {
                workload.acknowledge_insert(key_number).expect("valid");
            }
            key.clear();
            names.append_name(operation.key_number(), &mut key);
            black_box(&key);
        }
    });
}

/// `next_operation` plus the key name formatted on the stack ([`rampkv_ycsb::KeyName`]).
#[divan::bench(args = WORKLOADS)]
fn operation_and_stack_key_name(bencher: Bencher, name: &str) {
    let mut workload = workload(name);
    let names = *workload.key_names();
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        for _ in 0..BATCH {
            let operation = workload.next_operation().expect("no error");
            if let Operation::Insert { key_number } = operation {
                workload.acknowledge_insert(key_number).expect("valid");
            }
            black_box(names.name(operation.key_number()));
        }
    });
}

/// Whole transactions of 8 operations (keys, and 100-byte field values for writes); the
/// counter is transactions.
#[divan::bench(args = WORKLOADS)]
fn txn_of_8(bencher: Bencher, name: &str) {
    let mut generator = TxnGenerator::new(workload(name), 8).expect("valid");
    let mut txn = Txn::with_capacity(8, 1000);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        for _ in 0..BATCH {
            generator.next_txn(&mut txn).expect("no error");
            generator.acknowledge(&txn).expect("valid");
            black_box(&txn);
        }
    });
}

/// The paper's micro-benchmark (95% reads, 8 keys, 1,000 keys, 1 KiB values); the counter is
/// transactions.
#[divan::bench]
fn micro_txn_of_8(bencher: Bencher) {
    let mut generator = MicroWorkload::paper_default().generator(SEED).expect("valid");
    let mut txn = Txn::with_capacity(8, 1024);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        for _ in 0..BATCH {
            generator.next_txn(&mut txn).expect("no error");
            black_box(&txn);
        }
    });
}

/// The key name alone (FNV hash and decimal digits), of consecutive key numbers.
#[divan::bench]
fn key_name_only(bencher: Bencher) {
    let names = rampkv_ycsb::KeyNames::default();
    let mut key_number = 0u64;
    let mut key = Vec::with_capacity(64);
    bencher.counter(ItemsCount::new(BATCH)).bench_local(|| {
        for _ in 0..BATCH {
            key.clear();
            names.append_name(key_number, &mut key);
            key_number += 1;
            black_box(&key);
        }
    });
}
