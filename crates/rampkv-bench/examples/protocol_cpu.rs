//! The protocol's own CPU on the client thread, against the memory work at its core.
//!
//! Three figures, per 4-key read-only transaction, all over GET\* item slots in shared memory
//! (the emulated one-sided fabric; these are not RDMA figures):
//! - (a) **raw**: 4 verified slot reads (`rampkv_fabric::read_slot`: seqlock, checksum, key
//!   check) plus hashing the 4 keys to their servers: the floor of any GET\* read.
//! - (b) **get_all**: a RAMP-Fast read-only transaction of the same 4 keys through the client
//!   driver over the one-sided transport, on a preloaded embedded cluster (4 servers, one
//!   poller): every round-1 read is answered from slots, so no server thread takes part.
//! - (c) **bench loop**: `rampkv bench`'s own loop (workload draw, timing, histograms) at 100%
//!   reads over the same transport, 1 client, network model off.
//!
//! Every figure is the measuring thread's CPU time (the OS's per-thread accounting), not wall
//! time, so that other processes on a shared machine count for little.
//!
//! The aims (issue "performance at the limit"): (b) within 3x of (a), (c) within 1.5x of (b).
//! Run with `cargo run --release -p rampkv-bench --example protocol_cpu` (`--quick` for the
//! test command's smoke run: the same code, fewer iterations, no claims; `--only get_all` runs
//! (b) alone, for a profiler). Results with their
//! conditions are recorded in docs/performance.md.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

use rampkv_bench::bench::{self, BenchConfig, Interleave, NetworkModel, StopAfter, TransportKind};
use rampkv_core::cluster::{Cluster, Front};
use rampkv_core::storage::{Store, StoredMetadata};
use rampkv_core::wire::WriteSet;
use rampkv_fabric::{read_slot, Fabric, ShmFabric};
use rampkv_net::client::{Completion, Driver, TxnResult};
use rampkv_net::item_slots::{ItemSlotConfig, ItemSlots};
use rampkv_net::server::front::FrontEnd;
use rampkv_net::server::{ServerConfig, ServerGroup};
use rampkv_net::transport::onesided::OneSidedOptions;
use rampkv_net::transport::OneSidedClientTransport;

const KEYS_PER_TXN: usize = 4;
const VALUE_BYTES: usize = 1_024;
const SERVERS: usize = 4;
/// Repetitions of each measurement; the printed figure is their median.
const REPEATS: usize = 3;

struct Mode {
    /// Transactions per repetition of (a).
    raw_iterations: usize,
    /// Transactions per repetition of (b).
    get_all_iterations: usize,
    /// Seconds of the bench loop (c).
    bench_seconds: f64,
}

/// Runs `work` and returns the calling thread's CPU time per iteration, in ns (the OS's
/// accounting, 10 ms ticks: each measurement runs about a second). CPU time rather than wall
/// time, so that the other processes of a shared machine do not count; `None` where the OS
/// does not say.
fn cpu_ns_per(iterations: usize, work: impl FnOnce()) -> Option<f64> {
    let before = bench::thread_cpu_time()?;
    work();
    let spent = bench::thread_cpu_time()?.saturating_sub(before);
    Some(spent.as_nanos() as f64 / iterations as f64)
}

fn main() {
    let quick = std::env::args().any(|argument| argument == "--quick");
    let mode = if quick {
        Mode { raw_iterations: 20_000, get_all_iterations: 5_000, bench_seconds: 0.3 }
    } else {
        Mode { raw_iterations: 2_500_000, get_all_iterations: 500_000, bench_seconds: 5.0 }
    };
    if std::env::args().any(|argument| argument == "get_all") {
        let cpu = get_all_ns(mode.get_all_iterations * REPEATS);
        println!("(b) get_all over GET*: {}", show(cpu));
        return;
    }
    let raw = median((0..REPEATS).map(|_| raw_reads_ns(mode.raw_iterations)).collect());
    let get_all = median((0..REPEATS).map(|_| get_all_ns(mode.get_all_iterations)).collect());
    let bench_loop = bench_loop_ns(mode.bench_seconds);
    println!("CPU time per 4-key read-only transaction on one client thread (shared-memory fabric):");
    println!("  (a) raw: 4 verified slot reads + hashing   {}", show(raw));
    println!("  (b) get_all over GET*                      {}   (b)/(a) = {}", show(get_all), ratio(get_all, raw));
    println!(
        "  (c) bench loop                             {}   (c)/(b) = {}",
        show(bench_loop),
        ratio(bench_loop, get_all)
    );
    if quick {
        println!("(quick mode: few iterations, a smoke run, not a measurement)");
    }
}

/// The median of the samples the OS measured (`None` if it measured none).
fn median(samples: Vec<Option<f64>>) -> Option<f64> {
    let mut samples: Vec<f64> = samples.into_iter().flatten().collect();
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied()
}

fn show(ns: Option<f64>) -> String {
    ns.map_or_else(|| "   (no per-thread CPU time from the OS)".into(), |ns| format!("{ns:>8.0} ns"))
}

fn ratio(numerator: Option<f64>, denominator: Option<f64>) -> String {
    match (numerator, denominator) {
        (Some(numerator), Some(denominator)) if denominator > 0.0 => format!("{:.2}x", numerator / denominator),
        _ => "-".into(),
    }
}

fn key(number: usize) -> Vec<u8> {
    format!("k{number}").into_bytes()
}

/// (a): ns per 4 verified slot reads plus the 4 keys' hashing, on slots published by a store.
fn raw_reads_ns(iterations: usize) -> Option<f64> {
    let fabric = ShmFabric::new().expect("the shared-memory fabric opens");
    let config = ItemSlotConfig { slots: 64, slot_bytes: ItemSlotConfig::default().slot_bytes };
    let slots = ItemSlots::register(&fabric, "protocol-cpu", config).expect("item slots register");
    let store = Store::new(u64::MAX);
    let keys: Vec<Vec<u8>> = (0..KEYS_PER_TXN).map(key).collect();
    let write_set = WriteSet::from_keys(&keys).expect("short keys, few");
    let ts = 1 << 16;
    let writes = keys.iter().map(|key| (key.clone().into_boxed_slice(), vec![7u8; VALUE_BYTES].into_boxed_slice()));
    store
        .prepare(ts, StoredMetadata::WriteSet(write_set.clone()), write_set, writes.collect(), 0)
        .expect("the prepare is valid");
    store.commit(ts);
    for key in &keys {
        slots.locate(&store, key).expect("a committed key gets a slot");
    }
    let remote = fabric.map(&slots.info().region).expect("the item region maps");
    let offsets: Vec<usize> =
        keys.iter().map(|key| slots.slot_of(key).expect("published") as usize * config.slot_bytes).collect();
    let cluster = Cluster::with_servers((0..SERVERS).map(|n| format!("127.0.0.1:{}", 7000 + n)).collect())
        .expect("a valid cluster");
    let mut buffer = vec![0u8; config.slot_bytes];
    cpu_ns_per(iterations, || {
        for _ in 0..iterations {
            for (key, &offset) in keys.iter().zip(&offsets) {
                black_box(cluster.server_of(black_box(key)));
                let view = read_slot(&fabric, &remote, offset, config.slot_bytes, key, &mut buffer).expect("verifies");
                black_box(view.ts());
            }
        }
    })
}

/// (b): ns per `get_all` of 4 keys through the driver over GET\*, on a preloaded cluster.
fn get_all_ns(iterations: usize) -> Option<f64> {
    let localhost: SocketAddr = "127.0.0.1:0".parse().expect("valid address");
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); SERVERS]).expect("servers start");
    let cluster =
        Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).expect("a valid cluster");
    let front = FrontEnd::spawn(&group, Front::Ring, localhost, Some(ItemSlotConfig::default())).expect("front");
    let control: Vec<String> = front.control_addresses().iter().map(SocketAddr::to_string).collect();
    let transport = OneSidedClientTransport::connect(&control, OneSidedOptions::default()).expect("connects");
    let mut driver = Driver::connect(transport, cluster, 1).expect("the driver connects");
    let keys: Vec<Vec<u8>> = (0..KEYS_PER_TXN).map(key).collect();
    let mut completions = Vec::new();
    let mut finish = |driver: &mut Driver<OneSidedClientTransport>| loop {
        driver.step(Some(Duration::from_millis(100)), &mut completions).expect("the driver steps");
        if let Some(Completion { result, .. }) = completions.pop() {
            return result.expect("the transaction succeeds");
        }
    };
    driver
        .begin_write(0, keys.iter().map(|key| (key.clone(), vec![7u8; VALUE_BYTES])).collect())
        .expect("the preload starts");
    finish(&mut driver);
    // The first read fills the address cache (GET_LOCATE); the measured ones read slots only.
    driver.begin_read(0, keys.clone()).expect("the read starts");
    finish(&mut driver);
    let fallbacks_before = driver.transport().stats().fallbacks();
    let cpu = cpu_ns_per(iterations, || {
        for _ in 0..iterations {
            driver.begin_read(0, keys.clone()).expect("the read starts");
            match finish(&mut driver) {
                TxnResult::Read(outcome) => {
                    black_box(outcome);
                }
                other => panic!("a read returned {other:?}"),
            }
        }
    });
    let stats = driver.transport().stats();
    assert_eq!(stats.fallbacks(), fallbacks_before, "every measured read came from slots: {stats:?}");
    cpu
}

/// (c): the bench loop's client CPU per transaction (ns), 100% reads of 4 keys over GET\*.
fn bench_loop_ns(seconds: f64) -> Option<f64> {
    // The bench reports its client thread's CPU time per transaction itself.
    let config = BenchConfig {
        servers: SERVERS,
        clients: 1,
        client_threads: 1,
        txn_size: KEYS_PER_TXN,
        read_ratio: 1.0,
        value_size: VALUE_BYTES,
        preload: true,
        stop_after: StopAfter::Duration { seconds },
        transport: TransportKind::OneSided,
        network: NetworkModel { interleave: Interleave::Off, ..NetworkModel::default() },
        seed: 1,
        ..BenchConfig::default()
    };
    let result = bench::run(&config).expect("the bench runs");
    result.client_cpu_us_per_txn.map(|us| us * 1_000.0)
}
