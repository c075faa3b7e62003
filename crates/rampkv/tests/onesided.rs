//! The one-sided transport (GET\*/PUT+) end to end: servers with item regions over the
//! shared-memory fabric, clients that read slots one-sidedly.
//!
//! - the contention test over `onesided` is checker-clean for every RAMP variant and S2PL,
//!   NoCC and the skip-repair mutant are caught, and GET\* served reads in those runs;
//! - GET\* actually serves reads: hits counted, and the servers saw fewer GETs than over
//!   write-poll for the same reads;
//! - a slot rewritten with a newer version is read as that version; a slot reused for another
//!   key is rejected, the address evicted, and the read falls back to GET+ with the right answer;
//! - garbage written into a slot from the server side never makes a client accept wrong data
//!   or panic;
//! - the newer-prepared option makes a reader fall back while a newer version is prepared;
//! - YCSB's versions fit item slots fitted to the workload and are read one-sidedly.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod common;

use common::{assert_clean, assert_no_anomaly, caught, contended, contended_transactions, seed};
use rampkv::bench::{BenchConfig, StopAfter, TransportKind, Workload};
use rampkv::client::{Driver, TxnResult};
use rampkv::cluster::Cluster;
use rampkv::cluster::Front;
use rampkv::item_slots::ItemSlotConfig;
use rampkv::protocol::ramp::Algorithm;
use rampkv::protocol::ReadOutcome;
use rampkv::server::front::FrontEnd;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::onesided::OneSidedOptions;
use rampkv::transport::ClientTransport;
use rampkv::transport::OneSidedClientTransport;
use rampkv::transport::WritePollClientTransport;
use rampkv::wire::{Metadata, Request, Response, Write, WriteSet};

const ONESIDED: TransportKind = TransportKind::OneSided;

/// Two servers on one TCP group, with a ring front end and item regions of `slots` slots.
fn cluster(slots: ItemSlotConfig) -> (ServerGroup, FrontEnd, Cluster, Vec<String>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost), ServerConfig::new(localhost)]).unwrap();
    let rings = FrontEnd::spawn(&group, Front::Ring, localhost, Some(slots)).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let control = rings.control_addresses().iter().map(SocketAddr::to_string).collect();
    (group, rings, cluster, control)
}

fn write<T: ClientTransport>(driver: &mut Driver<T>, pairs: &[(&[u8], Vec<u8>)]) -> u64 {
    let pairs = pairs.iter().map(|(key, value)| (key.to_vec(), value.clone())).collect();
    let ts = driver.begin_write(0, pairs).unwrap();
    let TxnResult::Write(outcome) = common::wait_for(driver) else { panic!("a write finished as a read") };
    assert_eq!(outcome.ts, ts);
    ts
}

fn read<T: ClientTransport>(driver: &mut Driver<T>, keys: &[&[u8]]) -> ReadOutcome {
    driver.begin_read(0, keys.iter().map(|key| key.to_vec()).collect()).unwrap();
    let TxnResult::Read(outcome) = common::wait_for(driver) else { panic!("a read finished as a write") };
    outcome
}

/// `count` keys that live on server `server` of `cluster`.
fn keys_on(cluster: &Cluster, server: usize, count: usize) -> Vec<Vec<u8>> {
    (0..).map(|n| format!("key-{n}").into_bytes()).filter(|key| cluster.server_of(key) == server).take(count).collect()
}

fn onesided(control: &[String], options: OneSidedOptions, cluster: &Cluster) -> Driver<OneSidedClientTransport> {
    let transport = OneSidedClientTransport::connect(control, options).unwrap();
    Driver::connect(transport, cluster.clone(), 1).unwrap()
}

#[test]
fn ramp_variants_over_onesided_under_contention_are_checker_clean_and_use_getstar() {
    for algorithm in [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid] {
        let result = assert_clean(&contended(algorithm, ONESIDED, seed(), 1.5), 200);
        assert_eq!(result.transport, "onesided");
        let getstar = result.getstar.expect("onesided runs report GET* counters");
        assert!(getstar.hits > 0, "{}: GET* served no read: {getstar:?}", algorithm.name());
        if algorithm == Algorithm::RampFast {
            assert!(result.round2.reads_with_round2 > 0, "contention must exercise round 2");
        }
    }
}

#[test]
fn s2pl_over_onesided_under_contention_is_checker_clean() {
    // S2PL reads take locks (LOCK_READ), so they never go to slots; its commits publish.
    assert_no_anomaly(&contended_transactions(Algorithm::S2pl, ONESIDED, seed(), 500), 100);
}

#[test]
fn nocc_over_onesided_under_contention_is_caught_with_fractured_reads() {
    let result = caught(contended(Algorithm::NoCc, ONESIDED, seed(), 1.5));
    assert!(result.getstar.unwrap().hits > 0);
}

#[test]
fn the_skip_repair_mutant_is_caught_over_onesided() {
    let mut config = contended(Algorithm::RampFast, ONESIDED, seed(), 1.5);
    config.mutant_skip_repair = true;
    caught(config);
}

#[test]
fn getstar_serves_reads_and_the_servers_see_fewer_gets() {
    let (group, _rings, cluster, control) = cluster(ItemSlotConfig::default());
    let keys: Vec<Vec<u8>> = (0..8).map(|n| format!("hot-{n}").into_bytes()).collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let gets = || group.cores().iter().map(|core| core.gets_served()).sum::<u64>();
    let mut plain = Driver::connect(WritePollClientTransport::connect(&control).unwrap(), cluster.clone(), 1).unwrap();
    let pairs: Vec<(&[u8], Vec<u8>)> = key_refs.iter().map(|key| (*key, format!("{key:?}-v1").into_bytes())).collect();
    let ts = write(&mut plain, &pairs);
    let reads = 100;
    let before = gets();
    for _ in 0..reads {
        read(&mut plain, &key_refs);
    }
    let over_rings = gets() - before;
    let mut driver = onesided(&control, OneSidedOptions::default(), &cluster);
    let before = gets();
    for _ in 0..reads {
        let outcome = read(&mut driver, &key_refs);
        for ((_, value), item) in pairs.iter().zip(&outcome.items) {
            assert_eq!((&item.value[..], item.ts), (&value[..], ts));
        }
    }
    let over_slots = gets() - before;
    let stats = driver.transport().stats();
    println!("server GETs: {over_rings} over write-poll, {over_slots} over onesided; {stats:?}");
    let mut servers: Vec<usize> = keys.iter().map(|key| cluster.server_of(key)).collect();
    servers.dedup();
    servers.sort_unstable();
    servers.dedup();
    let servers = servers.len() as u64;
    assert_eq!(over_rings, servers * reads, "one GET per server per read over write-poll");
    assert!(stats.hits >= servers * (reads - 1), "every read after the first is served from slots: {stats:?}");
    assert!(over_slots <= servers, "only the first read (learning the addresses) reached the servers: {over_slots}");
    assert_eq!(stats.evictions, 0);
}

#[test]
fn a_rewritten_slot_is_read_as_the_new_version_and_a_reused_slot_is_rejected() {
    // One slot of 256 bytes per server: the key that has it loses it when its version grows
    // past the slot, and the next key takes the slot over.
    let (_group, _rings, cluster, control) = cluster(ItemSlotConfig { slots: 1, slot_bytes: 256 });
    let keys = keys_on(&cluster, 0, 2);
    let (a, b) = (keys[0].as_slice(), keys[1].as_slice());
    let mut driver = onesided(&control, OneSidedOptions::default(), &cluster);
    let ts1 = write(&mut driver, &[(a, b"a-1".to_vec())]);
    read(&mut driver, &[a]); // learns a's address
    let hits = driver.transport().stats().hits;
    let outcome = read(&mut driver, &[a]);
    assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts1, &b"a-1"[..]));
    assert_eq!(driver.transport().stats().hits, hits + 1, "served from the slot");
    // Rewritten in place: the next one-sided read sees the new version.
    let ts2 = write(&mut driver, &[(a, b"a-2".to_vec())]);
    let outcome = read(&mut driver, &[a]);
    assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts2, &b"a-2"[..]));
    assert_eq!(driver.transport().stats().hits, hits + 2, "served from the rewritten slot");
    // a outgrows the slot (freed), b takes it over.
    let large = vec![7u8; 1024];
    let ts3 = write(&mut driver, &[(a, large.clone())]);
    let ts4 = write(&mut driver, &[(b, b"b-1".to_vec())]);
    // b's first read (GET_LOCATE) gives it the freed slot; a's address is still cached.
    let outcome = read(&mut driver, &[b]);
    assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts4, &b"b-1"[..]));
    let before = driver.transport().stats();
    let outcome = read(&mut driver, &[a]);
    assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts3, &large[..]), "the right answer, over GET+");
    let after = driver.transport().stats();
    assert_eq!(after.fallback_wrong_key, before.fallback_wrong_key + 1, "{after:?}");
    assert_eq!(after.evictions, before.evictions + 1);
    assert_eq!(after.hits, before.hits);
    let outcome = read(&mut driver, &[b]);
    assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts4, &b"b-1"[..]));
    // a has no slot any more: it keeps being read over GET+, correctly.
    for _ in 0..3 {
        let outcome = read(&mut driver, &[a]);
        assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts3, &large[..]));
    }
}

#[test]
fn garbage_in_a_slot_is_never_accepted_and_never_panics() {
    let seed = seed();
    let mut rng = seed | 1;
    let mut next = move || {
        // xorshift64*: deterministic from the printed seed.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let (_group, rings, cluster, control) = cluster(ItemSlotConfig { slots: 4, slot_bytes: 256 });
    let key = keys_on(&cluster, 1, 1).remove(0);
    let mut driver = onesided(&control, OneSidedOptions::default(), &cluster);
    let ts = write(&mut driver, &[(&key, b"the value".to_vec())]);
    let slots = rings.item_slots(1).unwrap();
    read(&mut driver, &[&key]); // GET_LOCATE: the key gets its slot
    let index = slots.slot_of(&key).expect("the key was published");
    // The metadata RAMP-Fast wrote (the write set [key]), as the wire encodes it.
    let mut metadata = vec![1, 1, 0, 0, 0, key.len() as u8, 0];
    metadata.extend_from_slice(&key);
    for round in 0..200 {
        read(&mut driver, &[&key]); // (re)learns the address
        let words: Vec<u64> = match round % 4 {
            // Random words.
            0 => (0..32).map(|_| next()).collect(),
            // An even seq everywhere (seq and trailer copy agree), random lengths.
            1 => (0..32).map(|word| if word % 2 == 0 { 2 } else { next() }).collect(),
            // All zero except the seq: a "valid-looking" empty slot.
            2 => (0..32).map(|word| if word == 0 { 4 } else { 0 }).collect(),
            _ => vec![next()],
        };
        slots.scribble_for_test(index, &words);
        let outcome = read(&mut driver, &[&key]);
        assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts, &b"the value"[..]), "round {round}");
        // Repair the slot the way the server would: publish the key's version again.
        slots.overwrite_for_test(index, &key, ts, &metadata, b"the value");
    }
    // A well-formed slot with the right key but metadata that does not decode: rejected too.
    slots.overwrite_for_test(index, &key, ts, &[9, 9, 9], b"the value");
    let before = driver.transport().stats();
    let outcome = read(&mut driver, &[&key]);
    assert_eq!(outcome.items[0].ts, ts);
    let after = driver.transport().stats();
    assert_eq!(after.fallback_corrupt, before.fallback_corrupt + 1, "{after:?}");
    println!("{after:?}");
    assert_eq!(after.hits + after.fallbacks(), after.eligible_gets);
}

#[test]
fn with_the_option_a_newer_prepared_version_sends_the_read_to_the_server() {
    let (_group, _rings, cluster, control) = cluster(ItemSlotConfig::default());
    let key = keys_on(&cluster, 0, 1).remove(0);
    let mut careful =
        onesided(&control, OneSidedOptions { newer_prepared_fallback: true, ..OneSidedOptions::default() }, &cluster);
    let mut relaxed = onesided(&control, OneSidedOptions::default(), &cluster);
    let ts = write(&mut careful, &[(&key, b"committed".to_vec())]);
    read(&mut careful, &[&key]);
    read(&mut relaxed, &[&key]);
    // A newer version is prepared (and never committed: its writer is this raw transport).
    let mut raw = WritePollClientTransport::connect(&control).unwrap();
    let prepare = Request::Prepare {
        ts: ts + (1 << 20),
        metadata: Metadata::WriteSet(WriteSet::from_keys(&[&key]).unwrap()),
        write_set: Vec::new(),
        writes: vec![Write::new(key.clone(), b"prepared".to_vec())],
    };
    raw.post(0, 1, &prepare).unwrap();
    raw.flush().unwrap();
    let mut acked = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !acked && Instant::now() < deadline {
        raw.poll(Some(Duration::from_millis(20)), |_, _, response| acked = matches!(response, Response::Ack)).unwrap();
    }
    assert!(acked);
    for driver_is_careful in [true, false] {
        let outcome = if driver_is_careful { read(&mut careful, &[&key]) } else { read(&mut relaxed, &[&key]) };
        assert_eq!((outcome.items[0].ts, &outcome.items[0].value[..]), (ts, &b"committed"[..]));
    }
    let (careful, relaxed) = (careful.transport().stats(), relaxed.transport().stats());
    assert_eq!(careful.fallback_newer_prepared, 1, "{careful:?}");
    assert_eq!(careful.evictions, 0, "the address stays cached");
    assert_eq!(relaxed.fallback_newer_prepared, 0);
    assert_eq!(relaxed.hits, 1, "without the option the committed version in the slot is served: {relaxed:?}");
}

/// Story: YCSB's 24-byte keys make an 8-key write set 213 bytes, and a 1,000-byte record with
/// its key and write set did not fit the 1,280-byte default slot, so the server never
/// published YCSB versions and every GET* fell back to GET+ (Fig. 8's GET* series was GET+).
/// With the slot fitted to the workload, reads come from slots, and stay checker-clean.
#[test]
fn ycsb_versions_fit_fitted_item_slots_and_are_read_one_sidedly() {
    let seed = seed();
    let ycsb = |slot_bytes: Option<usize>| {
        let mut config = BenchConfig {
            transport: ONESIDED,
            workload: Workload::YcsbReadRatio,
            read_ratio: 0.95,
            txn_size: 8,
            keys: 1_000,
            value_size: 1_000,
            servers: 2,
            stop_after: StopAfter::Duration { seconds: 1.0 },
            seed,
            check: true,
            probe: false, // the workload's own history is what this test judges
            ..BenchConfig::default()
        };
        config.item_slots.slot_bytes = slot_bytes.unwrap_or_else(|| config.fitted_item_slot_bytes().unwrap());
        // One client thread and 1,000 records: few races, so no anomaly is all this asks.
        assert_no_anomaly(&config, 10).getstar.expect("onesided runs report GET* counters")
    };
    let fitted = ycsb(None);
    assert!(fitted.hits * 2 > fitted.eligible_gets, "seed {seed}: most round-1 GETs from slots: {fitted:?}");
    let default = ycsb(Some(rampkv::limits::ITEM_SLOT_BYTES_DEFAULT));
    assert!(default.hits * 10 < default.eligible_gets, "seed {seed}: YCSB versions fit 1,280 B now? {default:?}");
}

/// The micro-benchmark at 100% reads: without a preload every key is unwritten and GET* finds
/// no slot; with `preload` every key has a version (with its write set) before the measured
/// window, the reads come from item slots, and the history (the load included) is clean.
#[test]
fn preloaded_micro_keys_are_read_from_item_slots() {
    let seed = seed();
    let run = |preload: bool| {
        let config = BenchConfig {
            transport: ONESIDED,
            read_ratio: 1.0,
            txn_size: 8,
            keys: 400,
            servers: 2,
            preload,
            stop_after: StopAfter::Duration { seconds: 0.5 },
            seed,
            check: true,
            probe: false, // the workload's own history is what this test judges
            ..BenchConfig::default()
        };
        let result = rampkv::bench::run(&config).expect("the run completes");
        let report = result.check.as_ref().expect("checked");
        assert!(report.is_clean(), "seed {seed}, preload {preload}: {report}");
        assert!(result.read.count > 100, "seed {seed}: the run read");
        (report.writes, result.getstar.expect("onesided reports GET* counters"))
    };
    let (writes, cold) = run(false);
    assert_eq!((writes, cold.hits), (0, 0), "seed {seed}: nothing written, nothing in slots: {cold:?}");
    let (writes, warm) = run(true);
    assert_eq!(writes, 50, "seed {seed}: 400 keys loaded in transactions of 8");
    assert!(warm.hits * 10 > warm.eligible_gets * 9, "seed {seed}: reads come from slots: {warm:?}");
}
