//! Cooperative termination under fault injection: a writer "dies" (its connection is dropped)
//! at chosen points between PREPARE and COMMIT. Within the recovery timeout the servers resolve
//! the transaction from its metadata; readers see all of its writes or none, and never wait.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::recovery::StartRecovery;
use rampkv::server::{ServerConfig, ServerGroup};
use rampkv::transport::ClientTransport;
use rampkv::transport::TcpClientTransport;
use rampkv::wire::{Metadata, Request, Write, WriteSet};

const TIMEOUT_MS: u64 = 300;

fn cluster() -> (ServerGroup, Cluster, Vec<Vec<u8>>) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 2]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    group.start_recovery(cluster.clone(), 0, TIMEOUT_MS).unwrap();
    let x = (0..).map(|i| format!("x{i}").into_bytes()).find(|key| cluster.server_of(key) == 0).unwrap();
    let y = (0..).map(|i| format!("y{i}").into_bytes()).find(|key| cluster.server_of(key) == 1).unwrap();
    (group, cluster, vec![x, y])
}

/// A writer that sends exactly the given requests, waits for their replies, then vanishes.
fn dying_writer(cluster: &Cluster, requests: &[(usize, Request)]) {
    dying_writer_to(cluster.servers(), requests);
}

/// [`dying_writer`] connected to `addresses` only (servers `0..addresses.len()`).
fn dying_writer_to(addresses: &[String], requests: &[(usize, Request)]) {
    let mut transport = TcpClientTransport::connect(addresses).unwrap();
    for (id, (server, request)) in requests.iter().enumerate() {
        transport.post(*server, id as u64, request).unwrap();
    }
    transport.flush().unwrap();
    let mut replies = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while replies < requests.len() && Instant::now() < deadline {
        replies += transport.poll(Some(Duration::from_millis(50)), |_, _, _| {}).unwrap();
    }
    assert_eq!(replies, requests.len());
}

fn prepare(ts: u64, keys: &[Vec<u8>], key: &[u8]) -> Request {
    Request::Prepare {
        ts,
        metadata: Metadata::WriteSet(WriteSet::from_keys(keys).unwrap()),
        write_set: vec![],
        writes: vec![Write { key: key.to_vec(), value: ts.to_le_bytes().to_vec() }],
    }
}

/// Reads both keys until `done` says the result is final or the deadline passes; every read
/// must be atomic with respect to transaction `ts` and must return at once.
fn read_until(cluster: &Cluster, keys: &[Vec<u8>], ts: u64, done: impl Fn(&[u64]) -> bool) -> Vec<u64> {
    let mut client = Client::connect(cluster).unwrap();
    let deadline = Instant::now() + Duration::from_millis(TIMEOUT_MS * 10);
    loop {
        let started = Instant::now();
        let read = client.get_all(keys.to_vec()).unwrap();
        assert!(started.elapsed() < Duration::from_millis(200), "a reader never waits for recovery");
        let seen: Vec<u64> = read.items.iter().map(|item| item.ts).collect();
        assert!(seen.iter().all(|&t| t == ts) || seen.iter().all(|&t| t != ts), "fractured: {seen:?}");
        if done(&seen) || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_writer_that_died_after_one_commit_is_committed_everywhere() {
    let (group, cluster, keys) = cluster();
    let ts = (1 << 40) | 7;
    dying_writer(
        &cluster,
        &[(0, prepare(ts, &keys, &keys[0])), (1, prepare(ts, &keys, &keys[1])), (0, Request::Commit { ts })],
    );
    let started = Instant::now();
    // Readers see both writes at once, through RAMP's round-2 repair, even before recovery.
    let seen = read_until(&cluster, &keys, ts, |seen| seen.iter().all(|&t| t == ts));
    assert_eq!(seen, vec![ts, ts]);
    wait_resolved(&group);
    assert!(started.elapsed() < Duration::from_millis(TIMEOUT_MS * 5), "resolved within the timeout");
    assert_eq!(group.cores()[1].store().last_commit(&keys[1]), ts, "recovery committed the second key");
}

/// Waits (bounded) until no server has a prepared transaction waiting for COMMIT.
fn wait_resolved(group: &ServerGroup) {
    let deadline = Instant::now() + Duration::from_millis(TIMEOUT_MS * 10);
    let pending = || group.cores().iter().map(|core| core.store().stats().pending_transactions).sum::<usize>();
    while pending() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(pending(), 0, "every prepared transaction was resolved");
}

#[test]
fn a_writer_that_died_after_all_prepares_is_committed_everywhere() {
    let (group, cluster, keys) = cluster();
    let ts = (2 << 40) | 7;
    dying_writer(&cluster, &[(0, prepare(ts, &keys, &keys[0])), (1, prepare(ts, &keys, &keys[1]))]);
    // Nothing is committed yet, so readers see neither write until recovery commits both.
    let seen = read_until(&cluster, &keys, ts, |seen| seen.iter().all(|&t| t == ts));
    assert_eq!(seen, vec![ts, ts]);
    wait_resolved(&group);
}

#[test]
fn a_writer_that_died_before_preparing_everywhere_is_aborted_and_its_late_prepare_refused() {
    let (group, cluster, keys) = cluster();
    let ts = (3 << 40) | 7;
    dying_writer(&cluster, &[(0, prepare(ts, &keys, &keys[0]))]);
    wait_resolved(&group);
    assert_eq!(group.cores()[0].store().stats().versions, 0, "the prepared version was dropped");
    // The PREPARE that never arrived now arrives: it is refused, so nobody can commit ts.
    let mut transport = TcpClientTransport::connect(cluster.servers()).unwrap();
    transport.post(1, 9, &prepare(ts, &keys, &keys[1])).unwrap();
    transport.flush().unwrap();
    let mut reply = None;
    while reply.is_none() {
        transport.poll(Some(Duration::from_millis(100)), |_, _, response| reply = Some(response)).unwrap();
    }
    assert!(matches!(reply, Some(rampkv::wire::Response::Error { .. })), "{reply:?}");
    assert_eq!(read_until(&cluster, &keys, ts, |_| true), vec![0, 0]);
}

/// A participant that goes down after the resolver connected to it leaves the resolver
/// working: it asks the live participants (without waiting out a reply timeout for the dead
/// one) and keeps its connections, so every later transaction that a live participant
/// committed is committed too. (A resolver that dropped its connections on a dead peer could
/// not connect again while that peer was down, and left every later transaction prepared.)
#[test]
fn a_participant_that_went_down_does_not_stop_the_resolver() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut live = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 2]).unwrap();
    let doomed = ServerGroup::spawn(&[ServerConfig::new(localhost)]).unwrap();
    let addresses: Vec<String> = live.addresses().iter().chain(doomed.addresses()).map(SocketAddr::to_string).collect();
    let cluster = Cluster::with_servers(addresses.clone()).unwrap();
    live.start_recovery(cluster.clone(), 0, TIMEOUT_MS).unwrap();
    let key_of = |server: usize| {
        (0..).map(|i| format!("k{i}").into_bytes()).find(|key| cluster.server_of(key) == server).unwrap()
    };
    let keys = vec![key_of(0), key_of(1), key_of(2)];
    let committed_at_1 = |ts: u64, prepared_at: &[usize]| {
        let mut requests: Vec<(usize, Request)> =
            prepared_at.iter().map(|&server| (server, prepare(ts, &keys, &keys[server]))).collect();
        requests.push((1, Request::Commit { ts }));
        requests
    };

    // With every participant up, server 0's resolver connects to all three and commits.
    let warm_up = (4 << 40) | 7;
    dying_writer(&cluster, &committed_at_1(warm_up, &[0, 1, 2]));
    wait_resolved(&live);
    assert_eq!(live.cores()[0].store().last_commit(&keys[0]), warm_up);

    doomed.shutdown().unwrap();
    for (round, ts) in [(5 << 40) | 7, (6 << 40) | 7].into_iter().enumerate() {
        let started = Instant::now();
        dying_writer_to(&addresses[..2], &committed_at_1(ts, &[0, 1]));
        wait_resolved(&live);
        assert_eq!(live.cores()[0].store().last_commit(&keys[0]), ts, "round {round}: committed at server 0");
        println!("round {round}: resolved in {:?} with a participant down", started.elapsed());
    }
}

/// A gate a test opens and closes: all partitions served, or none (a deposed primary).
#[derive(Debug, Default)]
struct Switch(std::sync::atomic::AtomicBool);

impl rampkv::protocol::server::PartitionGate for Switch {
    fn serves(&self, _partition: u32) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Found while building `rampkv chaos --nemesis partition` (issue 30), by reading what a
/// deposed primary still alive does: cut off from its backup (or paused), a primary applies a
/// PREPARE whose record never reaches the backup (its reply is held, so the client is never
/// answered); the backup is promoted without it. The deposed primary, back in touch, still held
/// the transaction prepared in its old store. Its resolver asked the other participant, found
/// the transaction still prepared there (not resolved yet) and, by the rule "prepared
/// everywhere: commit", committed it there: half a transaction visible, its other half on no
/// copy the cluster serves (a fractured read, or a read that can never finish). The gate
/// refused a COMMIT request from outside, but the resolver went around it. This test makes the
/// same state in one process (a gate closed after the PREPAREs) and failed before the fix: the
/// other participant's key was committed. Now a server resolves only transactions whose keys
/// here it serves now: a deposed primary decides nothing.
#[test]
fn a_deposed_primarys_resolver_commits_nothing_its_successor_may_not_hold() {
    let (mut group, cluster, keys) = {
        let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 2]).unwrap();
        let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
        let x = (0..).map(|i| format!("x{i}").into_bytes()).find(|key| cluster.server_of(key) == 0).unwrap();
        let y = (0..).map(|i| format!("y{i}").into_bytes()).find(|key| cluster.server_of(key) == 1).unwrap();
        (group, cluster, vec![x, y])
    };
    // Server 0 is gated (as a replicated server is): open while the writer prepares.
    let deposed = std::sync::Arc::new(Switch::default());
    assert!(group.cores()[0].set_gate(deposed.clone()));
    group.start_recovery(cluster.clone(), 0, TIMEOUT_MS).unwrap();
    let ts = (7 << 40) | 7;
    dying_writer(&cluster, &[(0, prepare(ts, &keys, &keys[0])), (1, prepare(ts, &keys, &keys[1]))]);
    // Deposed before its resolver looks: what its store holds is no longer the partition's.
    deposed.0.store(true, std::sync::atomic::Ordering::Release);
    std::thread::sleep(Duration::from_millis(TIMEOUT_MS * 5));
    // Server 1's resolver cannot ask server 0 (it refuses: no primary answers for it in this
    // test), so the transaction stays prepared at server 1; server 0's must not commit it.
    assert_eq!(group.cores()[1].store().last_commit(&keys[1]), 0, "a deposed primary committed at a participant");
    assert_eq!(group.cores()[0].store().last_commit(&keys[0]), 0, "a deposed primary committed in its old store");
    assert_eq!(group.cores()[1].store().stats().pending_transactions, 1);
    // Serving again (made primary again), it resolves as before: prepared everywhere, commit.
    deposed.0.store(false, std::sync::atomic::Ordering::Release);
    wait_resolved(&group);
    assert_eq!(group.cores()[1].store().last_commit(&keys[1]), ts);
}

/// Issue 30: during fault runs the servers logged `closing the connection ... handshake not
/// finished ... 10046 ms after it opened`, again and again. The cause was the resolver: it
/// connected one transport to *every* server (its own included) and sent requests only to the
/// participants it asked, so the connections it never used sent no frame, and a server closes
/// a connection that sent no complete frame within the handshake timeout
/// (`CONNECTION_HANDSHAKE_TIMEOUT_MS`, here 500 ms). The transport then saw them closed,
/// reconnected, and the next idle one was closed again. The resolver now connects to a server
/// only to ask it something, and sends the request at once: with three servers and a
/// transaction prepared at two, no connection is closed by the handshake timeout, even after
/// several timeouts went by.
#[test]
fn the_resolver_opens_no_connection_it_does_not_use() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let limits = rampkv::server::ConnectionLimits { handshake_timeout_ms: 500, ..Default::default() };
    let options = rampkv::server::ServerOptions { limits, ..Default::default() };
    let (mut group, _) = ServerGroup::start(&vec![ServerConfig::new(localhost); 3], &options).unwrap();
    let addresses: Vec<String> = group.addresses().iter().map(SocketAddr::to_string).collect();
    let cluster = Cluster::with_servers(addresses.clone()).unwrap();
    group.start_recovery(cluster.clone(), 0, TIMEOUT_MS).unwrap();
    let key_of = |server: usize| {
        (0..).map(|i| format!("h{i}").into_bytes()).find(|key| cluster.server_of(key) == server).unwrap()
    };
    let keys = vec![key_of(0), key_of(1)];
    let ts = (7 << 40) | 7;
    dying_writer_to(&addresses[..2], &[(0, prepare(ts, &keys, &keys[0])), (1, prepare(ts, &keys, &keys[1]))]);
    wait_resolved(&group);
    assert_eq!(group.cores()[1].store().last_commit(&keys[1]), ts, "resolved by committing");
    std::thread::sleep(Duration::from_millis(1_600)); // three handshake timeouts and a scan
    let counts = group.servers().connection_stats().read();
    assert_eq!(
        counts.closed_handshake, 0,
        "the resolver left a connection idle until its handshake timed out: {counts:?}"
    );
}
