//! Helpers shared by the contention tests over every transport: the contended configuration,
//! the printed and replayable seed, and the assertions that a run is clean or that an
//! anomaly was caught.

use std::time::{Duration, Instant};

use rampkv::bench::{self, BenchConfig, BenchResult, StopAfter, TransportKind};
use rampkv::checker::Verdict;
use rampkv::client::{Completion, Driver, TxnResult};
use rampkv::cluster::Cluster;
use rampkv::protocol::ramp::{Algorithm, TxnOptions};
use rampkv::transport::TcpClientTransport;
use rampkv::transport::{ClientTransport, ServerEvent, TransportError};
use rampkv::wire::{Request, Response, Write};

/// Many clients, few keys, half writes: reads race writes all the time.
pub fn contended(algorithm: Algorithm, transport: TransportKind, seed: u64, seconds: f64) -> BenchConfig {
    BenchConfig {
        algorithm,
        transport,
        servers: 3,
        server_threads: 2,
        clients: 24,
        client_threads: 2,
        txn_size: 3,
        read_ratio: 0.5,
        keys: 6,
        value_size: 24,
        stop_after: StopAfter::Duration { seconds },
        seed,
        check: true,
        // These runs race by themselves (6 keys, half writes) and their own history is what
        // the tests judge; the evidence probe has tests of its own (tests/cli.rs).
        probe: false,
        ..BenchConfig::default()
    }
}

/// [`contended`], stopped after `transactions` instead of after a time: S2PL under this
/// contention runs a few hundred transactions a second, fewer on a loaded machine, so a timed
/// run would do a load-dependent amount of work.
pub fn contended_transactions(
    algorithm: Algorithm,
    transport: TransportKind,
    seed: u64,
    transactions: u64,
) -> BenchConfig {
    BenchConfig {
        stop_after: StopAfter::Transactions { count: transactions },
        ..contended(algorithm, transport, seed, 1.0)
    }
}

/// The workload seed: `RAMPKV_TEST_SEED` to replay, otherwise the clock; printed either way.
pub fn seed() -> u64 {
    let seed = std::env::var("RAMPKV_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (replay the workload with RAMPKV_TEST_SEED={seed})");
    seed
}

/// Runs `config` and asserts the history is read-atomic, the run did real work, and it showed
/// the races that make the verdict clean rather than inconclusive (the network model
/// interleaves the servers' order). Not for S2PL under heavy contention: its reads record only
/// the arrival timestamps of the attempt that finished, and wait-die aborts (and retries) most
/// of the readers that would have raced (docs/history.md, "Evidence and verdict").
pub fn assert_clean(config: &BenchConfig, reads_and_writes_min: u64) -> BenchResult {
    let result = assert_no_anomaly(config, reads_and_writes_min);
    let report = result.check.as_ref().unwrap();
    assert_eq!(report.verdict(), Verdict::Clean, "{report}");
    result
}

/// Runs `config` and asserts the checker found no anomaly (whether or not the run showed races)
/// and the run did real work.
pub fn assert_no_anomaly(config: &BenchConfig, reads_and_writes_min: u64) -> BenchResult {
    let result = bench::run(config).unwrap();
    println!("{result}");
    let report = result.check.as_ref().unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(result.failed_transactions, 0, "{:?}", result.first_failure);
    assert!(
        result.read.count > reads_and_writes_min && result.write.count > reads_and_writes_min,
        "the run did real work"
    );
    result
}

/// Runs `config` until the checker reports an anomaly (bounded), which must be a fractured read.
pub fn caught(mut config: BenchConfig) -> BenchResult {
    for attempt in 0..5 {
        config.seed = config.seed.wrapping_add(attempt);
        let result = bench::run(&config).unwrap();
        let report = result.check.as_ref().unwrap();
        println!("attempt {attempt}: {report}");
        if !report.is_clean() {
            assert!(report.fractured_reads > 0, "the anomaly must be a fractured read: {report}");
            return result;
        }
    }
    panic!("{} (mutant: {}) was never caught", config.algorithm.name(), config.mutant_skip_repair);
}

/// Writes six keys in one transaction, then reads them back in one, and checks the values and
/// timestamps (`round` makes the values differ from run to run).
#[allow(dead_code)] // used by the ring transports' tests
pub fn put_get_round_trip<T: ClientTransport>(driver: &mut Driver<T>, round: u32) {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> =
        (0..6).map(|key| (format!("key-{key}").into_bytes(), format!("value-{key}-{round}").into_bytes())).collect();
    let keys: Vec<Vec<u8>> = pairs.iter().map(|(key, _)| key.clone()).collect();
    let ts = driver.begin_write(0, pairs.clone()).unwrap();
    let TxnResult::Write(outcome) = wait_for(driver) else { panic!("a write finished as a read") };
    assert_eq!(outcome.ts, ts);
    driver.begin_read(0, keys).unwrap();
    let TxnResult::Read(read) = wait_for(driver) else { panic!("a read finished as a write") };
    for ((_, value), item) in pairs.iter().zip(&read.items) {
        assert_eq!(&item.value, value);
        assert_eq!(item.ts, ts);
    }
}

/// Waits (at most 10 s) until the server drops `victim`: the transport reports server 0 down,
/// its connection closed (the transport itself keeps working). `what` names the case in a
/// failure.
#[allow(dead_code)] // used by the fabric transports' tests
pub fn assert_closed<T: ClientTransport>(victim: &mut T, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut events = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "{what}: the server did not close the connection");
        if let Err(error) = victim.poll(Some(Duration::from_millis(100)), |_, _, _| panic!("{what}: no reply expected"))
        {
            panic!("{what}: the transport failed as a whole: {error}");
        }
        victim.take_server_events(&mut events);
        if let Some(event) = events.pop() {
            match event {
                ServerEvent::Down { server: 0, error: TransportError::Closed { server: 0 } } => return,
                other => panic!("{what}: unexpected {other:?}"),
            }
        }
    }
}

/// Steps `driver` until one transaction completes (at most 10 s) and returns its result.
#[allow(dead_code)] // not every test binary that includes this module drives a transport itself
pub fn wait_for<T: ClientTransport>(driver: &mut Driver<T>) -> TxnResult {
    let mut completions = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        driver.step(Some(Duration::from_millis(20)), &mut completions).unwrap();
        if let Some(completion) = completions.pop() {
            return completion.result.unwrap();
        }
    }
    panic!("no completion within 10 s");
}

/// S2PL defers a lock grant (or a wait's abort) as a reply for the waiting connection, which
/// may be served by another front end than the one that released the lock or expired the wait.
/// Two sessions over TCP and two over `other` (a ring front end's clients) write the same two
/// keys under S2PL for 1.5 s; every transaction must finish without error and none may wait
/// 3 s for a reply (a lost deferred reply would hang one until `TXN_TIMEOUT_MS`).
#[allow(dead_code)] // only the ring transports' tests have a second front end
pub fn assert_s2pl_grants_cross_front_ends<T: ClientTransport>(cluster: &Cluster, other: T) {
    let options = TxnOptions { algorithm: Algorithm::S2pl, ..TxnOptions::default() };
    let sessions = 2;
    let tcp_transport = TcpClientTransport::connect(cluster.servers()).unwrap();
    let mut tcp = Driver::connect(tcp_transport, cluster.clone(), sessions).unwrap();
    let mut other = Driver::connect(other, cluster.clone(), sessions).unwrap();
    tcp.set_txn_options(options);
    other.set_txn_options(options);
    let pairs = || vec![(b"lock-a".to_vec(), vec![1u8; 16]), (b"lock-b".to_vec(), vec![2u8; 16])];
    for session in 0..sessions {
        tcp.begin_write(session, pairs()).unwrap();
        other.begin_write(session, pairs()).unwrap();
    }
    let (mut finished, mut last_progress) = (0, Instant::now());
    let run_until = Instant::now() + Duration::from_millis(1500);
    let mut completions = Vec::new();
    // Steps `driver` once; each finished write must have succeeded, and is followed by
    // another until `run_until`.
    fn step<T: ClientTransport>(
        driver: &mut Driver<T>,
        completions: &mut Vec<Completion>,
        again: bool,
        write: impl Fn() -> Vec<(Vec<u8>, Vec<u8>)>,
    ) -> usize {
        driver.step(Some(Duration::from_micros(100)), completions).unwrap();
        let mut finished = 0;
        for completion in completions.drain(..) {
            completion.result.unwrap();
            finished += 1;
            if again {
                driver.begin_write(completion.session, write()).unwrap();
            }
        }
        finished
    }
    while tcp.active() + other.active() > 0 {
        assert!(last_progress.elapsed() < Duration::from_secs(3), "no transaction finished for 3 s: a reply was lost");
        let again = Instant::now() < run_until;
        let done = step(&mut tcp, &mut completions, again, pairs) + step(&mut other, &mut completions, again, pairs);
        if done > 0 {
            finished += done;
            last_progress = Instant::now();
        }
    }
    println!("{finished} S2PL write transactions finished");
    assert!(finished > 50, "the run did real work");
}

/// Posts 3,000 writes of 2 KiB (about 6 MiB) at once over `transport` and waits (at most 20 s)
/// until every one is answered: more than any ring or set of posted buffers holds, so both
/// sides must split the batch into messages and wait for room to send the rest.
#[allow(dead_code)] // only the message transports' tests
pub fn assert_a_large_batch_is_answered<T: ClientTransport>(cluster: &Cluster, transport: &mut T) {
    let requests = 3_000u64;
    for id in 0..requests {
        let key = format!("big-{id}").into_bytes();
        let server = cluster.server_of(&key);
        let request = Request::Put { ts: ((1 + id) << 16) | 1, writes: vec![Write::new(key, vec![id as u8; 2048])] };
        transport.post(server, id + 1, &request).unwrap();
    }
    transport.flush().unwrap();
    let mut replies = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while replies < requests && Instant::now() < deadline {
        replies += transport.poll(Some(Duration::from_millis(50)), |_, _, _| {}).unwrap() as u64;
    }
    assert_eq!(replies, requests);
}

/// Sends `request` to `server` and waits for its reply (at most 10 s).
#[allow(dead_code)] // used by the tests that speak to servers request by request
pub fn ask(transport: &mut TcpClientTransport, server: usize, id: u64, request: &Request) -> Response {
    transport.post(server, id, request).unwrap();
    transport.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reply = None;
    while reply.is_none() && Instant::now() < deadline {
        transport
            .poll(Some(Duration::from_millis(50)), |_, reply_id, response| {
                if reply_id == id {
                    reply = Some(response);
                }
            })
            .unwrap();
    }
    reply.expect("a reply within 10 s")
}

/// `count` distinct loopback addresses free right now: all bound at once, then released for
/// the servers to bind. (Bound and released one at a time, the kernel may hand the same port
/// out twice, and a server then fails to start with "Address already in use".)
#[allow(dead_code)] // only the tests that start server processes
pub fn free_addresses(count: usize) -> Vec<String> {
    let listeners: Vec<std::net::TcpListener> =
        (0..count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
    listeners.iter().map(|listener| listener.local_addr().expect("bound").to_string()).collect()
}

/// A replicated cluster of `servers` servers on fresh loopback addresses: data, replication and
/// configuration-service addresses all distinct, `replicas` copies of every partition.
#[allow(dead_code)] // only the tests that start replicated server processes
pub fn replicated_cluster(servers: usize, replicas: u32) -> Cluster {
    let mut addresses = free_addresses(3 * servers).into_iter();
    let mut next = || addresses.by_ref().take(servers).collect::<Vec<String>>();
    let (data, replicate, config) = (next(), next(), next());
    Cluster::with_servers(data)
        .expect("fresh data addresses")
        .with_replicas(replicas)
        .expect("replicas within the servers")
        .with_replicate_addresses(replicate)
        .expect("fresh replication addresses")
        .with_config_addresses(config)
        .expect("fresh configuration addresses")
}
