//! The write-poll transport (GET+/PUT+) end to end: real servers (TCP groups with a ring front
//! end over the shared-memory fabric) and clients on this machine.
//!
//! - a put/get round trip over rings;
//! - the contention test over rings is checker-clean (RAMP-Fast and S2PL), and the
//!   skip-repair mutant is caught;
//! - a large batch is split into ring messages, waits for credit and wraps the ring;
//! - S2PL deferred replies cross between TCP and ring clients of the same servers;
//! - a corrupt message in a server's request ring closes that connection (and only that one).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod common;

use common::{
    assert_a_large_batch_is_answered, assert_clean, assert_closed, assert_no_anomaly,
    assert_s2pl_grants_cross_front_ends, caught, contended, contended_transactions, put_get_round_trip, seed,
};
use rampkv::bench::TransportKind;
use rampkv::client::Driver;
use rampkv::cluster::Cluster;
use rampkv::cluster::Front;
use rampkv::protocol::ramp::Algorithm;
use rampkv::server::front::FrontEnd;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::ClientTransport;
use rampkv::transport::WritePollClientTransport;
use rampkv::wire::{Request, Write};

const RINGS: TransportKind = TransportKind::WritePoll;

/// Two servers on one TCP group, with a ring front end serving the same cores.
fn cluster() -> (ServerGroup, FrontEnd, Cluster, Vec<String>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost), ServerConfig::new(localhost)]).unwrap();
    let rings = FrontEnd::spawn(&group, Front::Ring, localhost, None).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let control = rings.control_addresses().iter().map(SocketAddr::to_string).collect();
    (group, rings, cluster, control)
}

#[test]
fn put_then_get_round_trips_over_message_rings() {
    let (_group, _rings, cluster, control) = cluster();
    let transport = WritePollClientTransport::connect(&control).unwrap();
    let mut driver = Driver::connect(transport, cluster, 1).unwrap();
    for round in 0..50 {
        put_get_round_trip(&mut driver, round);
    }
}

#[test]
fn a_large_batch_spans_several_ring_messages_and_wraps_the_ring() {
    // 3,000 writes of 2 KiB posted at once: about 6 MiB for two 1 MiB rings, so the client
    // must split the batch into messages, wait for credit and wrap, and the server must do the
    // same with the replies.
    let (_group, _rings, cluster, control) = cluster();
    let mut transport = WritePollClientTransport::connect(&control).unwrap();
    assert_a_large_batch_is_answered(&cluster, &mut transport);
}

#[test]
fn replies_far_larger_than_the_rings_all_arrive_to_a_client_that_reads_late() {
    // 1,500 GETs of a 60 KiB value (about 90 MiB of replies) posted in one batch, before the
    // client reads anything: the server fills the 1 MiB reply ring, then stops at its backlog
    // bound (keeping the rest of the request message for later) until the client returns
    // credit. Every reply must still arrive, in order.
    let (_group, _rings, cluster, control) = cluster();
    let mut transport = WritePollClientTransport::connect(&control).unwrap();
    let key = b"large".to_vec();
    let server = cluster.server_of(&key);
    let put = Request::Put { ts: (7 << 16) | 1, writes: vec![Write::new(key.clone(), vec![7; 60 * 1024])] };
    transport.post(server, 1, &put).unwrap();
    transport.flush().unwrap();
    while transport.poll(Some(Duration::from_millis(50)), |_, _, _| {}).unwrap() == 0 {}
    let get = Request::Get {
        items: vec![rampkv::wire::GetItem { key: key.clone(), selector: rampkv::wire::Selector::Latest }],
    };
    let requests = 1_500u64;
    for id in 0..requests {
        transport.post(server, 100 + id, &get).unwrap();
    }
    transport.flush().unwrap();
    std::thread::sleep(Duration::from_millis(200)); // let the server hit its bounds
    let mut next = 100;
    let deadline = Instant::now() + Duration::from_secs(30);
    while next < 100 + requests && Instant::now() < deadline {
        transport
            .poll(Some(Duration::from_millis(50)), |_, id, response| {
                assert_eq!(id, next, "replies arrive in order");
                assert!(matches!(response, rampkv::wire::Response::Versions { .. }), "{response:?}");
                next += 1;
            })
            .unwrap();
    }
    assert_eq!(next, 100 + requests, "every reply arrived");
}

#[test]
fn ramp_fast_over_message_rings_under_contention_is_checker_clean() {
    let result = assert_clean(&contended(Algorithm::RampFast, RINGS, seed(), 2.0), 300);
    assert_eq!(result.transport, "writepoll");
    assert!(result.round2.reads_with_round2 > 0, "contention must exercise round 2");
}

#[test]
fn s2pl_over_message_rings_under_contention_is_checker_clean() {
    // Deferred lock grants and wait aborts travel over the reply rings.
    let result = assert_no_anomaly(&contended_transactions(Algorithm::S2pl, RINGS, seed(), 500), 100);
    assert!(result.round2.read_restarts > 0, "contention must exercise wait-die aborts and retries");
}

#[test]
fn the_skip_repair_mutant_is_caught_over_message_rings() {
    let mut config = contended(Algorithm::RampFast, RINGS, seed(), 1.5);
    config.mutant_skip_repair = true;
    caught(config);
}

#[test]
fn a_corrupt_request_ring_closes_that_connection_and_others_keep_working() {
    let (_group, _rings, cluster, control) = cluster();
    let mut healthy =
        Driver::connect(WritePollClientTransport::connect(&control).unwrap(), cluster.clone(), 1).unwrap();
    put_get_round_trip(&mut healthy, 0);

    // Three kinds of corruption, each on a fresh connection to server 0.
    let garbage_header = |transport: &mut WritePollClientTransport| {
        transport.channel_mut(0).unwrap().inject_ring_start_word_for_test(0x0123_4567_89AB_CDEF).unwrap();
    };
    let invalid_frame = |transport: &mut WritePollClientTransport| {
        let mut frame = vec![0u8; 32];
        frame[0..4].copy_from_slice(&16u32.to_le_bytes());
        frame[4] = 9; // protocol version 9 does not exist
        transport.channel_mut(0).unwrap().send_raw_message_for_test(&frame).unwrap();
    };
    let cut_frame = |transport: &mut WritePollClientTransport| {
        let mut frame = vec![0u8; 24];
        frame[0..4].copy_from_slice(&100u32.to_le_bytes()); // claims 100 body bytes, has 8
        frame[4] = 1;
        frame[5] = 0x02;
        transport.channel_mut(0).unwrap().send_raw_message_for_test(&frame).unwrap();
    };
    let corruptions: [&dyn Fn(&mut WritePollClientTransport); 3] = [&garbage_header, &invalid_frame, &cut_frame];
    for (index, corrupt) in corruptions.iter().enumerate() {
        let mut victim = WritePollClientTransport::connect(&control).unwrap();
        corrupt(&mut victim);
        let deadline = Instant::now() + Duration::from_secs(5);
        assert!(Instant::now() < deadline);
        assert_closed(&mut victim, &format!("corruption {index}"));
        // The healthy client is served throughout, on the same server.
        put_get_round_trip(&mut healthy, index as u32 + 1);
    }
}

#[test]
#[ignore]
fn round_trip_latency_probe() {
    let (_group, _rings, cluster, control) = cluster();
    let rings = WritePollClientTransport::connect(&control).unwrap();
    let tcp = rampkv::transport::TcpClientTransport::connect(cluster.servers()).unwrap();
    println!("rings: {}", probe(rings));
    println!("tcp:   {}", probe(tcp));
}

fn probe<T: ClientTransport>(mut transport: T) -> String {
    let request = Request::Get {
        items: vec![rampkv::wire::GetItem { key: b"probe".to_vec(), selector: rampkv::wire::Selector::Latest }],
    };
    let mut samples_ns = Vec::with_capacity(20_000);
    for id in 0..20_000u64 {
        let start = Instant::now();
        transport.post(0, id, &request).unwrap();
        transport.flush().unwrap();
        let mut got = 0;
        while got == 0 {
            got = transport.poll(Some(Duration::from_secs(1)), |_, _, _| {}).unwrap();
        }
        samples_ns.push(start.elapsed().as_nanos() as u64);
    }
    samples_ns.sort_unstable();
    let at = |quantile: f64| samples_ns[((samples_ns.len() - 1) as f64 * quantile) as usize];
    format!("p50 {} ns, p99 {} ns, p99.9 {} ns", at(0.5), at(0.99), at(0.999))
}

/// The story: S2PL defers a lock grant (or a wait's abort) and emits it as a reply for the
/// connection that waits, which may be served by the other front end (TCP loop or ring
/// poller) than the one that released the lock or expired the wait. Before the deferred
/// exchange, such a reply was dropped and the waiting transaction hung until its timeout.
/// TCP and ring clients write the same two keys under S2PL; every transaction must finish,
/// without error, well within `TXN_TIMEOUT_MS`.
#[test]
fn s2pl_lock_grants_cross_between_tcp_and_ring_clients() {
    let (_group, _rings, cluster, control) = cluster();
    assert_s2pl_grants_cross_front_ends(&cluster, WritePollClientTransport::connect(&control).unwrap());
}
