//! The in-process transport end to end: clients in the servers' process call the server cores
//! directly and take typed replies, with no frame and no socket. S2PL works over it: a lock
//! granted later comes to the client's inbox in the server group's router, whichever front end
//! released the lock or expired the wait.
//!
//! - S2PL and RAMP-Fast over in-process clients under contention are checker-clean, NoCC is
//!   caught;
//! - S2PL lock grants cross between TCP and in-process clients of the same servers.

use std::net::SocketAddr;
use std::sync::Arc;

mod common;

use common::{
    assert_clean, assert_no_anomaly, assert_s2pl_grants_cross_front_ends, caught, contended, contended_transactions,
    seed,
};
use rampkv::bench::TransportKind;
use rampkv::cluster::Cluster;
use rampkv::protocol::ramp::Algorithm;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::local::LocalTransport;

const IN_PROCESS: TransportKind = TransportKind::InProcess;

#[test]
fn s2pl_over_in_process_clients_under_contention_is_checker_clean() {
    // Lock waits defer replies: they reach the in-process clients through their inboxes (two
    // server groups here: one inbox in each group's router).
    let result = assert_no_anomaly(&contended_transactions(Algorithm::S2pl, IN_PROCESS, seed(), 500), 100);
    assert!(result.round2.read_restarts > 0, "contention must exercise wait-die aborts and retries");
}

#[test]
fn ramp_fast_over_in_process_clients_under_contention_is_checker_clean() {
    let result = assert_clean(&contended(Algorithm::RampFast, IN_PROCESS, seed(), 1.5), 200);
    assert!(result.round2.reads_with_round2 > 0, "contention must exercise round 2");
}

#[test]
fn nocc_over_in_process_clients_is_caught_with_fractured_reads() {
    caught(contended(Algorithm::NoCc, IN_PROCESS, seed(), 1.5));
}

/// The story: before the router, the in-process transport refused S2PL, because a lock granted
/// later was a frame addressed to a connection id that only the serving event loop could
/// deliver. TCP and in-process clients now write the same two keys under S2PL; every
/// transaction must finish without error (a lost deferred reply would hang one until its
/// timeout).
#[test]
fn s2pl_lock_grants_cross_between_tcp_and_in_process_clients() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost), ServerConfig::new(localhost)]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let local = LocalTransport::new(&[Arc::clone(group.servers())], None);
    assert_s2pl_grants_cross_front_ends(&cluster, local);
}
