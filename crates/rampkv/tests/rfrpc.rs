//! The RF-RPC transport end to end: real servers (TCP groups with an RF-RPC front end over the
//! shared-memory fabric) and clients on this machine.
//!
//! - put/get round trips, and a batch of large writes whose replies overflow the reply slot
//!   (they follow as unsolicited pushes);
//! - the contention test over RF-RPC with the checker: every RAMP variant and S2PL (whose lock
//!   waits defer replies to unsolicited pushes) are clean; NoCC and the skip-repair mutant of
//!   every RAMP variant are caught.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod common;

use common::{assert_clean, assert_no_anomaly, caught, contended, contended_transactions, seed};
use rampkv::bench::TransportKind;
use rampkv::client::{Driver, TxnResult};
use rampkv::cluster::Cluster;
use rampkv::cluster::Front;
use rampkv::protocol::ramp::Algorithm;
use rampkv::server::front::FrontEnd;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::ClientTransport;
use rampkv::transport::RfRpcClientTransport;
use rampkv::wire::{GetItem, Request, Selector, Write};

const RFRPC: TransportKind = TransportKind::RfRpc;

/// Two servers on one TCP group, with an RF-RPC front end serving the same cores.
fn cluster() -> (ServerGroup, FrontEnd, Cluster, Vec<String>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost), ServerConfig::new(localhost)]).unwrap();
    let front = FrontEnd::spawn(&group, Front::RfRpc, localhost, None).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let control = front.control_addresses().iter().map(SocketAddr::to_string).collect();
    (group, front, cluster, control)
}

#[test]
fn put_then_get_round_trips_over_remote_fetch() {
    let (_group, _front, cluster, control) = cluster();
    let transport = RfRpcClientTransport::connect(&control).unwrap();
    let mut driver = Driver::connect(transport, cluster, 1).unwrap();
    for round in 0..50u32 {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..6)
            .map(|key| (format!("key-{key}").into_bytes(), format!("value-{key}-{round}").into_bytes()))
            .collect();
        let keys: Vec<Vec<u8>> = pairs.iter().map(|(key, _)| key.clone()).collect();
        let ts = driver.begin_write(0, pairs.clone()).unwrap();
        let TxnResult::Write(outcome) = common::wait_for(&mut driver) else { panic!("a write finished as a read") };
        assert_eq!(outcome.ts, ts);
        driver.begin_read(0, keys).unwrap();
        let TxnResult::Read(read) = common::wait_for(&mut driver) else { panic!("a read finished as a write") };
        for ((_, value), item) in pairs.iter().zip(&read.items) {
            assert_eq!(&item.value, value);
            assert_eq!(item.ts, ts);
        }
    }
}

#[test]
fn many_large_requests_and_replies_overflowing_the_slot_all_arrive() {
    // 2,000 writes of 2 KiB, then reads of them all: requests are split over many calls (128
    // entries or 128 KiB each), and the read replies (about 2 KiB each) overflow the 128 KiB
    // reply slot, so most of them come back as unsolicited pushes.
    let (_group, _front, cluster, control) = cluster();
    let mut transport = RfRpcClientTransport::connect(&control).unwrap();
    let requests = 2_000u64;
    let key_of = |id: u64| format!("big-{id}").into_bytes();
    for id in 0..requests {
        let key = key_of(id);
        let request = Request::Put { ts: ((1 + id) << 16) | 1, writes: vec![Write::new(key, vec![id as u8; 2048])] };
        transport.post(cluster.server_of(&key_of(id)), id + 1, &request).unwrap();
    }
    transport.flush().unwrap();
    let mut replies = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while replies < requests && Instant::now() < deadline {
        replies += transport.poll(Some(Duration::from_millis(50)), |_, _, _| {}).unwrap() as u64;
    }
    assert_eq!(replies, requests);
    for id in 0..requests {
        let request = Request::Get { items: vec![GetItem { key: key_of(id), selector: Selector::Latest }] };
        transport.post(cluster.server_of(&key_of(id)), requests + id + 1, &request).unwrap();
    }
    transport.flush().unwrap();
    let mut replies = 0;
    let mut value_bytes = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while replies < requests && Instant::now() < deadline {
        replies += transport
            .poll(Some(Duration::from_millis(50)), |_, _, response| {
                value_bytes += format!("{response:?}").len();
            })
            .unwrap() as u64;
    }
    assert_eq!(replies, requests);
    assert!(value_bytes > requests as usize * 2048, "every read reply carries its 2 KiB value");
}

fn assert_clean_over_rfrpc(algorithm: Algorithm, reads_and_writes_min: u64) {
    let result = assert_clean(&contended(algorithm, RFRPC, seed(), 2.0), reads_and_writes_min);
    assert_eq!(result.transport, "rfrpc");
}

#[test]
fn ramp_fast_over_remote_fetch_under_contention_is_checker_clean() {
    assert_clean_over_rfrpc(Algorithm::RampFast, 300);
}

#[test]
fn ramp_small_over_remote_fetch_under_contention_is_checker_clean() {
    assert_clean_over_rfrpc(Algorithm::RampSmall, 300);
}

#[test]
fn ramp_hybrid_over_remote_fetch_under_contention_is_checker_clean() {
    assert_clean_over_rfrpc(Algorithm::RampHybrid, 300);
}

#[test]
fn s2pl_over_remote_fetch_under_contention_is_checker_clean() {
    // Lock waits defer replies: they travel as unsolicited pushes.
    let result = assert_no_anomaly(&contended_transactions(Algorithm::S2pl, RFRPC, seed(), 500), 100);
    assert!(result.round2.read_restarts > 0, "contention must exercise wait-die aborts and retries");
}

#[test]
fn nocc_over_remote_fetch_is_caught_with_fractured_reads() {
    caught(contended(Algorithm::NoCc, RFRPC, seed(), 2.0));
}

#[test]
fn the_skip_repair_mutant_of_every_ramp_variant_is_caught_over_remote_fetch() {
    for algorithm in [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid] {
        let mut config = contended(algorithm, RFRPC, seed(), 1.5);
        config.mutant_skip_repair = true;
        caught(config);
    }
}
