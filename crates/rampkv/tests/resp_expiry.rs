//! Issue 31, expiry through the gateway under concurrency: MULTI/EXEC write groups, each
//! setting its keys (on several partitions) to one value with one relative expiry, race MGETs
//! and MULTI/EXEC read groups (GETs and a PTTL) of those groups across the moments they expire.
//! No read may ever see part of a group: a read sees every key of a group with the value of one
//! write, or every key missing.
//!
//! Why it holds (docs/resp.md, "Expiry"): the gateway turns every relative expiry of one EXEC
//! into a deadline from one reading of its clock, so a group's keys carry one deadline; RAMP
//! gives a read the versions of one write; the reader judges all of them at one instant.
//!
//! The writers mix the forms of a relative expiry in one EXEC (`SET k v PX ms`, `PSETEX`,
//! `SET k v EX s`): a gateway that took a clock reading per command would give one group
//! deadlines a millisecond apart, which a read at that millisecond would see fractured.
//!
//! The clients speak RESP over TCP (no tool needed). The run prints its seed; set
//! `RAMPKV_TEST_SEED` to replay the writers' and readers' choices.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rampkv::cluster::Cluster;
use rampkv::resp::codec::{parse_frame, Frame};
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::{ServerConfig, ServerGroup};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const GROUPS: usize = 4;
const KEYS_PER_GROUP: usize = 4;
const READERS: usize = 4;
const RUN: Duration = Duration::from_secs(5);
/// A group's relative expiry is drawn from this range (ms); one group in eight uses `EX 1`.
const TTL_MS_MIN: u64 = 20;
const TTL_MS_MAX: u64 = 250;
const SOCKET_TIMEOUT: Duration = Duration::from_secs(20);

fn seed() -> u64 {
    let seed = std::env::var("RAMPKV_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (replay with RAMPKV_TEST_SEED={seed})");
    seed
}

/// A RESP connection to a gateway: pipelined requests, replies read one whole frame at a time.
struct Connection {
    stream: TcpStream,
    buffered: Vec<u8>,
}

impl Connection {
    fn open(port: u16) -> Connection {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Connection { stream, buffered: Vec::new() }
    }

    /// Sends `commands` in one write (a pipeline) and returns their replies, in order.
    fn run(&mut self, commands: &[Vec<String>]) -> Vec<Frame> {
        let mut request = Vec::new();
        for words in commands {
            request.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
            for word in words {
                request.extend_from_slice(format!("${}\r\n{word}\r\n", word.len()).as_bytes());
            }
        }
        self.stream.write_all(&request).unwrap();
        (0..commands.len()).map(|_| self.next_frame()).collect()
    }

    fn next_frame(&mut self) -> Frame {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some((frame, length)) = parse_frame(&self.buffered).unwrap() {
                self.buffered.drain(..length);
                return frame;
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("the gateway closed the connection"),
                Ok(read) => self.buffered.extend_from_slice(&chunk[..read]),
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => panic!("reading a reply: {error}"),
            }
        }
    }
}

fn words(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|part| part.to_string()).collect()
}

fn group_keys(group: usize) -> Vec<String> {
    (0..KEYS_PER_GROUP).map(|key| format!("expiry{group}:k{key}")).collect()
}

/// One writer's group write: MULTI, a SET with a relative expiry of each key in mixed forms,
/// EXEC, pipelined. Returns the TTL it gave (ms).
fn write_group(connection: &mut Connection, rng: &mut SmallRng, keys: &[String], value: &str) -> u64 {
    let seconds = rng.gen_ratio(1, 8);
    let ttl_ms = if seconds { 1_000 } else { rng.gen_range(TTL_MS_MIN..=TTL_MS_MAX) };
    let mut commands = vec![words(&["MULTI"])];
    for key in keys {
        let ttl = ttl_ms.to_string();
        commands.push(match (seconds, rng.gen_range(0..2)) {
            (true, 0) => words(&["SET", key, value, "EX", "1"]),
            (true, _) => words(&["SETEX", key, "1", value]),
            (false, 0) => words(&["SET", key, value, "PX", &ttl]),
            (false, _) => words(&["PSETEX", key, &ttl, value]),
        });
    }
    commands.push(words(&["EXEC"]));
    let replies = connection.run(&commands);
    assert_eq!(replies[0], Frame::simple("OK"));
    assert!(replies[1..=keys.len()].iter().all(|reply| *reply == Frame::simple("QUEUED")), "{replies:?}");
    let expected = Frame::Array(vec![Frame::simple("OK"); keys.len()]);
    assert_eq!(replies[keys.len() + 1], expected, "EXEC of {value}");
    ttl_ms
}

/// What a reader saw, over the run.
#[derive(Debug, Default)]
struct ReadCounts {
    reads: usize,
    present: usize,
    absent: usize,
    /// Reads that found a group missing after this reader had seen it present: the group
    /// expired between the two (the writers never delete).
    expiries_seen: usize,
    /// Present reads whose PTTL was at most 10 ms: read within 10 ms of the group's deadline.
    close_to_deadline: usize,
}

/// The values of one read of a group's keys: every one the same value, or every one missing.
/// Returns the value (None: all missing); panics on a partial group.
fn whole_group<'f>(values: &'f [Frame], context: &dyn Fn() -> String) -> Option<&'f [u8]> {
    let first = match &values[0] {
        Frame::Bulk(bytes) => Some(&bytes[..]),
        Frame::Null => None,
        other => panic!("{}: not a value: {other:?}", context()),
    };
    for value in values {
        let same = match (value, first) {
            (Frame::Null, None) => true,
            (Frame::Bulk(bytes), Some(first)) => bytes[..] == *first,
            _ => false,
        };
        assert!(same, "{}: a read saw part of a group: {values:?}", context());
    }
    first
}

/// One reader: MGETs (3 in 4) and MULTI/EXEC read groups of GETs and a PTTL of a random group.
fn read_groups(port: u16, seed: u64, reader: usize, stop: &AtomicBool) -> ReadCounts {
    let mut rng = SmallRng::seed_from_u64(seed.wrapping_mul(31) ^ (reader as u64 + 100));
    let mut connection = Connection::open(port);
    let mut counts = ReadCounts::default();
    let mut last_seen_present = [false; GROUPS];
    while !stop.load(Ordering::Relaxed) {
        let group = rng.gen_range(0..GROUPS);
        let keys = group_keys(group);
        let multi = rng.gen_ratio(1, 4);
        let (values, pttl) = if multi {
            let mut commands = vec![words(&["MULTI"])];
            commands.extend(keys.iter().map(|key| words(&["GET", key])));
            commands.push(words(&["PTTL", &keys[rng.gen_range(0..keys.len())]]));
            commands.push(words(&["EXEC"]));
            let mut replies = connection.run(&commands);
            let Some(Frame::Array(mut replies)) = replies.pop() else { panic!("EXEC: {replies:?}") };
            let Some(Frame::Integer(pttl)) = replies.pop() else { panic!("PTTL in EXEC: {replies:?}") };
            (replies, Some(pttl))
        } else {
            let mut command = words(&["MGET"]);
            command.extend(keys.iter().cloned());
            let mut replies = connection.run(&[command]);
            let Some(Frame::Array(values)) = replies.pop() else { panic!("MGET: {replies:?}") };
            (values, None)
        };
        assert_eq!(values.len(), KEYS_PER_GROUP);
        let context = || {
            let read = if multi { "MULTI/EXEC" } else { "MGET" };
            format!("seed {seed} (RAMPKV_TEST_SEED), reader {reader}, group {group}, {read}")
        };
        let present = whole_group(&values, &context).is_some();
        counts.reads += 1;
        if present {
            counts.present += 1;
        } else {
            counts.absent += 1;
            counts.expiries_seen += usize::from(last_seen_present[group]);
        }
        last_seen_present[group] = present;
        if let Some(pttl) = pttl {
            // The PTTL was judged at the same instant as the GETs.
            match present {
                true => assert!((1..=1_000).contains(&pttl), "{}: PTTL {pttl} of a present key", context()),
                false => assert_eq!(pttl, -2, "{}: PTTL of a missing key", context()),
            }
            counts.close_to_deadline += usize::from(present && pttl <= 10);
        }
    }
    counts
}

/// One writer: its group rewritten with a fresh value and expiry, then a pause of up to twice
/// the TTL, so that the group is sometimes missing and sometimes rewritten before it expires.
fn write_groups(port: u16, group: usize, seed: u64, stop: &AtomicBool) -> usize {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut connection = Connection::open(port);
    let keys = group_keys(group);
    let mut writes = 0;
    while !stop.load(Ordering::Relaxed) {
        let ttl_ms = write_group(&mut connection, &mut rng, &keys, &format!("g{group}-w{writes}"));
        writes += 1;
        thread::sleep(Duration::from_millis(rng.gen_range(0..=ttl_ms.min(TTL_MS_MAX) * 2)));
    }
    writes
}

#[test]
fn multi_exec_groups_with_an_expiry_are_never_read_in_part_across_their_expiry() {
    let seed = seed();
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 4]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    for index in 0..GROUPS {
        let servers: std::collections::HashSet<usize> =
            group_keys(index).iter().map(|key| cluster.server_of(key.as_bytes())).collect();
        assert!(servers.len() >= 2, "group {index}'s keys must span partitions, got {servers:?}");
    }
    // Writers and half of the readers on a gateway calling the servers in process (as `rampkv
    // local`), the other readers on one reaching them over TCP.
    let config = GatewayConfig { sessions: 32, ..GatewayConfig::new(localhost) };
    let tcp_gateway = Gateway::spawn(&cluster, &config).unwrap();
    let in_process = Some(InProcessServers { groups: vec![Arc::clone(group.servers())] });
    let gateway = Gateway::spawn(&cluster, &GatewayConfig { in_process, ..config }).unwrap();
    let (port, tcp_port) = (gateway.address().port(), tcp_gateway.address().port());

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..GROUPS)
        .map(|index| {
            let stop = Arc::clone(&stop);
            thread::spawn(move || write_groups(port, index, seed ^ (index as u64 + 1), &stop))
        })
        .collect();
    let readers: Vec<_> = (0..READERS)
        .map(|index| {
            let stop = Arc::clone(&stop);
            let port = if index % 2 == 0 { port } else { tcp_port };
            thread::spawn(move || read_groups(port, seed, index, &stop))
        })
        .collect();
    let started = Instant::now();
    let finished = |writers: &[thread::JoinHandle<usize>], readers: &[thread::JoinHandle<ReadCounts>]| {
        writers.iter().any(|writer| writer.is_finished()) || readers.iter().any(|reader| reader.is_finished())
    };
    while started.elapsed() < RUN && !finished(&writers, &readers) {
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let writes: usize = writers.into_iter().map(|writer| writer.join().expect("a writer failed")).sum();
    let counts: Vec<ReadCounts> = readers.into_iter().map(|reader| reader.join().expect("a reader failed")).collect();

    let total = |field: fn(&ReadCounts) -> usize| counts.iter().map(field).sum::<usize>();
    let (reads, present, absent) = (total(|c| c.reads), total(|c| c.present), total(|c| c.absent));
    let (expiries_seen, close) = (total(|c| c.expiries_seen), total(|c| c.close_to_deadline));
    println!(
        "seed {seed}: {writes} group writes; {reads} reads: {present} whole, {absent} missing, {expiries_seen} saw \
         a group expire since their last read of it, {close} read a group within 10 ms of its deadline"
    );
    // The verdict is only worth something if the reads raced the expiries.
    assert!(writes >= GROUPS * 20, "only {writes} group writes");
    assert!(present >= 200 && absent >= 200, "{present} whole reads, {absent} missing ones");
    assert!(expiries_seen >= 50, "only {expiries_seen} reads found a group expired since they saw it");
    gateway.shutdown().unwrap();
    tcp_gateway.shutdown().unwrap();
}
