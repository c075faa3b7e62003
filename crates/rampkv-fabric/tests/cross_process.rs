//! Cross-process tests of the shared-memory fabric: real processes, real /dev/shm mappings,
//! one-sided access with no cooperation from the owner.
//!
//! The test binary re-executes itself (`std::env::current_exe()`) with `CHILD_ROLE_ENV` set;
//! the child runs only `child_process_entry`, which dispatches on the role. Children talk to
//! the parent through stdout lines starting with `LINE_PREFIX` and read "go" / EOF on stdin.
//! Every wait is bounded, and children are killed if the parent fails.

use rampkv_fabric::slot::SLOT_FLAG_VALID;
use rampkv_fabric::{
    read_slot, Access, Doorbell, Fabric, QueueAddresses, QueueLayout, ReceiveQueue, RegionDescriptor, RingAddresses,
    RingLayout, RingReceiver, RingSender, SendQueue, ShmFabric, SlotReadError, SlotWriter,
};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD_ROLE_ENV: &str = "RAMPKV_FABRIC_CHILD_ROLE";
const CHILD_ARGUMENT_ENV: &str = "RAMPKV_FABRIC_CHILD_ARGUMENT";
const LINE_PREFIX: &str = "RAMPKV:";
/// How long readers read while the writer rewrites.
const STRESS_DURATION: Duration = Duration::from_secs(2);
/// Bound on any wait for a child (start-up, a line, exit).
const CHILD_TIMEOUT: Duration = Duration::from_secs(30);

const SLOT_KEYS: usize = 16;
const SLOT_CAPACITY_BYTES: usize = 4096;
/// Value lengths vary in 20..=VALUE_BYTES_MAX so that writes take different times and slots
/// shrink and grow under the readers.
const VALUE_BYTES_MAX: usize = 3000;

const RING_MESSAGES: u64 = 20_000;
const RING_BYTES: u64 = 16 * 1024;
const RING_BODY_BYTES_MAX: u64 = 2048;

/// The entry point of child processes; does nothing when the harness runs it normally.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(CHILD_ROLE_ENV) else {
        return;
    };
    let argument = std::env::var(CHILD_ARGUMENT_ENV).unwrap_or_default();
    match role.as_str() {
        "slot-writer" => slot_writer_child(),
        "slot-reader" => {
            let descriptor: RegionDescriptor = serde_json::from_str(&argument).unwrap();
            let stats = read_slots_for(&descriptor, STRESS_DURATION);
            emit(&format!("stats={}", stats.to_line()));
        }
        "ring-sender" => ring_sender_child(&argument),
        "sendrecv-sender" => sendrecv_sender_child(&argument),
        "rpc-server" => rpc_server_child(&argument),
        other => panic!("unknown child role {other}"),
    }
}

fn emit(line: &str) {
    println!("{LINE_PREFIX}{line}");
    std::io::stdout().flush().unwrap();
}

/// A child process, killed if still running when dropped (so a failing parent leaves none).
struct ChildGuard {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ChildGuard {
    fn spawn(role: &str, argument: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child_process_entry", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ROLE_ENV, role)
            .env(CHILD_ARGUMENT_ENV, argument)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness may print "test child_process_entry ... " on the same line.
                if let Some(start) = line.find(LINE_PREFIX) {
                    if sender.send(line[start + LINE_PREFIX.len()..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        Self { child, lines }
    }

    /// The value of the next `key=value` line from the child.
    fn expect(&self, key: &str) -> String {
        let line = self
            .lines
            .recv_timeout(CHILD_TIMEOUT)
            .unwrap_or_else(|_| panic!("child sent no {key}= line within {CHILD_TIMEOUT:?}"));
        let (got, value) = line.split_once('=').unwrap();
        assert_eq!(got, key, "unexpected line {line}");
        value.to_owned()
    }

    fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn close_stdin(&mut self) {
        self.child.stdin.take();
    }

    fn wait_success(&mut self) {
        let deadline = Instant::now() + CHILD_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "child failed: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "child did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn key_of(key_id: usize) -> Vec<u8> {
    format!("key-{key_id:04}").into_bytes()
}

fn value_len_of(key_id: usize, generation: u64) -> usize {
    20 + ((key_id as u64 * 131 + generation * 977) % (VALUE_BYTES_MAX as u64 - 19)) as usize
}

fn pattern_byte(key_id: usize, generation: u64, index: usize) -> u8 {
    (key_id as u64 * 7 + generation * 13 + index as u64 * 3) as u8
}

/// A self-describing value: key id (u32), generation (u64), length (u32), then a pattern that
/// depends on all three. The checker needs no checksum to spot a torn or misplaced value.
fn value_of(key_id: usize, generation: u64) -> Vec<u8> {
    let len = value_len_of(key_id, generation);
    let mut value = Vec::with_capacity(len);
    value.extend_from_slice(&(key_id as u32).to_le_bytes());
    value.extend_from_slice(&generation.to_le_bytes());
    value.extend_from_slice(&(len as u32).to_le_bytes());
    value.extend((16..len).map(|index| pattern_byte(key_id, generation, index)));
    value
}

/// Whether `value`, read with timestamp `ts` for `key_id`, is exactly what the writer wrote.
fn value_is_intact(key_id: usize, ts: u64, metadata: &[u8], value: &[u8]) -> bool {
    if value.len() < 16 || metadata != format!("writeset-{key_id}").as_bytes() {
        return false;
    }
    let id = u32::from_le_bytes(value[0..4].try_into().unwrap()) as usize;
    let generation = u64::from_le_bytes(value[4..12].try_into().unwrap());
    let len = u32::from_le_bytes(value[12..16].try_into().unwrap()) as usize;
    id == key_id
        && generation == ts
        && len == value.len()
        && len == value_len_of(key_id, generation)
        && value[16..].iter().enumerate().all(|(offset, &byte)| byte == pattern_byte(key_id, generation, offset + 16))
}

fn slot_writer_child() {
    let fabric = ShmFabric::new().unwrap();
    let region = fabric.register("stress-slots", SLOT_KEYS * SLOT_CAPACITY_BYTES, Access::ReadOnly).unwrap();
    let mut writer = SlotWriter::new(SLOT_CAPACITY_BYTES);
    let publish = |writer: &mut SlotWriter, key_id: usize, generation: u64| {
        let metadata = format!("writeset-{key_id}");
        writer
            .publish(
                &region,
                key_id * SLOT_CAPACITY_BYTES,
                SLOT_CAPACITY_BYTES,
                &key_of(key_id),
                generation,
                generation, // the expiry word travels as any other: the reader checks it
                metadata.as_bytes(),
                &value_of(key_id, generation),
                SLOT_FLAG_VALID,
            )
            .unwrap();
    };
    for key_id in 0..SLOT_KEYS {
        publish(&mut writer, key_id, 1);
    }
    emit(&format!("descriptor={}", serde_json::to_string(&fabric.describe(&region)).unwrap()));
    // Rewrite until the parent closes stdin (or a hard bound passes).
    let stop = Arc::new(AtomicBool::new(false));
    let stop_reader = Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop_reader.store(true, Ordering::Relaxed);
    });
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut generation = 1;
    let mut writes = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        generation += 1;
        for key_id in 0..SLOT_KEYS {
            publish(&mut writer, key_id, generation);
            writes += 1;
        }
    }
    emit(&format!("writes={writes}"));
}

#[derive(Debug, Default)]
struct ReaderStats {
    accepted: u64,
    torn_retries: u64,
    torn_fallbacks: u64,
    bad: u64,
    regressions: u64,
}

impl ReaderStats {
    fn to_line(&self) -> String {
        format!("{} {} {} {} {}", self.accepted, self.torn_retries, self.torn_fallbacks, self.bad, self.regressions)
    }

    fn from_line(line: &str) -> Self {
        let numbers: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        Self {
            accepted: numbers[0],
            torn_retries: numbers[1],
            torn_fallbacks: numbers[2],
            bad: numbers[3],
            regressions: numbers[4],
        }
    }
}

/// Reads every slot round-robin for `duration`, checking each accepted value byte by byte and
/// that a key's generation never goes backwards.
fn read_slots_for(descriptor: &RegionDescriptor, duration: Duration) -> ReaderStats {
    let fabric = ShmFabric::new().unwrap();
    let remote = fabric.map(descriptor).unwrap();
    let keys: Vec<Vec<u8>> = (0..SLOT_KEYS).map(key_of).collect();
    let mut last_generation = [0u64; SLOT_KEYS];
    let mut buf = vec![0u8; SLOT_CAPACITY_BYTES];
    let mut stats = ReaderStats::default();
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        for key_id in 0..SLOT_KEYS {
            let offset = key_id * SLOT_CAPACITY_BYTES;
            match read_slot(&fabric, &remote, offset, SLOT_CAPACITY_BYTES, &keys[key_id], &mut buf) {
                Ok(view) => {
                    stats.accepted += 1;
                    stats.torn_retries += u64::from(view.attempts() - 1);
                    if !value_is_intact(key_id, view.ts(), view.metadata(), view.value()) || view.expiry() != view.ts()
                    {
                        stats.bad += 1;
                        eprintln!("BAD value accepted for key {key_id} at ts {}", view.ts());
                    }
                    if view.ts() < last_generation[key_id] {
                        stats.regressions += 1;
                    }
                    last_generation[key_id] = view.ts();
                }
                Err(SlotReadError::Torn { attempts }) => {
                    stats.torn_retries += u64::from(attempts);
                    stats.torn_fallbacks += 1;
                }
                Err(other) => panic!("unexpected slot error for key {key_id}: {other}"),
            }
        }
    }
    stats
}

/// A writer process rewrites 16 slots (values of 20..3000 bytes) as fast as it can; a reader
/// process and this process read them one-sidedly for 2 s. No torn or misattributed value may
/// be accepted, and a key's generation never goes backwards for one reader.
#[test]
fn slot_stress_across_processes_accepts_no_torn_value() {
    let mut writer = ChildGuard::spawn("slot-writer", "");
    let descriptor_json = writer.expect("descriptor");
    let descriptor: RegionDescriptor = serde_json::from_str(&descriptor_json).unwrap();
    assert_eq!(descriptor.access, Access::ReadOnly);
    let reader = ChildGuard::spawn("slot-reader", &descriptor_json);
    let local_stats = read_slots_for(&descriptor, STRESS_DURATION);
    let child_stats = ReaderStats::from_line(&reader.expect("stats"));
    writer.close_stdin();
    let writes: u64 = writer.expect("writes").parse().unwrap();
    writer.wait_success();
    println!("slot stress: {writes} slot writes by the writer process");
    for (name, stats) in [("parent reader", &local_stats), ("child reader", &child_stats)] {
        println!(
            "slot stress, {name}: accepted {} reads, detected {} torn reads (retried), {} fell back \
             after {} attempts, {} bad values accepted, {} generation regressions",
            stats.accepted,
            stats.torn_retries,
            stats.torn_fallbacks,
            rampkv_fabric::limits::SLOT_READ_ATTEMPTS_MAX,
            stats.bad,
            stats.regressions
        );
        assert_eq!(stats.bad, 0, "{name} accepted a torn or misattributed value");
        assert_eq!(stats.regressions, 0, "{name} saw a generation go backwards");
        assert!(stats.accepted > 0, "{name} accepted nothing");
    }
    assert!(writes > 0);
}

// ---- ring ----

fn ring_addresses() -> RingAddresses {
    RingAddresses {
        ring: RingLayout { offset_bytes: 64, ring_bytes: RING_BYTES, body_bytes_max: RING_BODY_BYTES_MAX },
        receiver_doorbell_offset_bytes: 0,
        credit_offset_bytes: 0,
        sender_doorbell_offset_bytes: 64,
    }
}

/// Deterministic message `index` of a run with `seed`: index, length, then a pattern.
fn message_of(seed: u64, index: u64) -> Vec<u8> {
    let mut state = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    state ^= state >> 29;
    state = state.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state ^= state >> 32;
    let len = 12 + (state % (RING_BODY_BYTES_MAX - 12)) as usize;
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(&index.to_le_bytes());
    body.extend_from_slice(&(len as u32).to_le_bytes());
    body.extend((12..len).map(|offset| (state as usize + offset * 11) as u8));
    body
}

fn ring_sender_child(argument: &str) {
    let (receiver_json, seed) = argument.rsplit_once(' ').unwrap();
    let receiver_descriptor: RegionDescriptor = serde_json::from_str(receiver_json).unwrap();
    let seed: u64 = seed.parse().unwrap();
    let fabric = ShmFabric::new().unwrap();
    let local = Arc::new(fabric.register("ring-sender", 128, Access::ReadWrite).unwrap());
    let receiver = fabric.map(&receiver_descriptor).unwrap();
    emit(&format!("descriptor={}", serde_json::to_string(&fabric.describe(&local)).unwrap()));
    // Wait for "go": the receiver must exist (it zeroes the ring) before the first send.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "go");
    let mut sender = RingSender::new(fabric, receiver, Arc::clone(&local), ring_addresses()).unwrap();
    for index in 0..RING_MESSAGES {
        sender.send(&message_of(seed, index), CHILD_TIMEOUT).unwrap();
    }
    emit(&format!("sent={RING_MESSAGES}"));
}

/// A sender process pushes 20,000 messages of random size (seeded, printed) through a 16 KiB
/// ring, so it waits for credit many times; this process receives them with doorbell waits.
/// Every message arrives once, in order, byte for byte.
#[test]
fn ring_messages_from_another_process_arrive_intact_and_in_order() {
    let seed = std::env::var("RAMPKV_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("ring cross-process test seed: {seed} (rerun with RAMPKV_SEED={seed})");
    let fabric = ShmFabric::new().unwrap();
    let local = Arc::new(fabric.register("ring-receiver", 64 + RING_BYTES as usize, Access::ReadWrite).unwrap());
    let argument = format!("{} {seed}", serde_json::to_string(&fabric.describe(&local)).unwrap());
    let mut child = ChildGuard::spawn("ring-sender", &argument);
    let sender_descriptor: RegionDescriptor = serde_json::from_str(&child.expect("descriptor")).unwrap();
    let sender_region = fabric.map(&sender_descriptor).unwrap();
    let mut receiver = RingReceiver::new(fabric, Arc::clone(&local), sender_region, ring_addresses()).unwrap();
    let doorbell = Doorbell::new(Arc::clone(&local), 0).unwrap();
    child.say("go");
    let mut next = 0u64;
    let mut lengths: HashMap<bool, u64> = HashMap::new();
    let start = Instant::now();
    while next < RING_MESSAGES {
        while let Some(view) = receiver.poll().unwrap() {
            assert_eq!(view.body(), &message_of(seed, next)[..], "message {next} (seed {seed})");
            *lengths.entry(view.body().len() > 1024).or_default() += 1;
            next += 1;
        }
        if next < RING_MESSAGES {
            doorbell.wait_until(|| receiver.has_pending(), CHILD_TIMEOUT).expect("no message within the timeout");
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(child.expect("sent"), RING_MESSAGES.to_string());
    child.wait_success();
    assert!(receiver.poll().unwrap().is_none());
    println!(
        "ring cross-process: {RING_MESSAGES} messages ({} over 1 KiB) in {elapsed:?}",
        lengths.get(&true).copied().unwrap_or(0)
    );
}

// ---- send/recv ----

/// Four posted buffers of `RING_BODY_BYTES_MAX` at 64 of the receiver's region; doorbells at 0.
fn queue_addresses() -> QueueAddresses {
    QueueAddresses {
        queue: QueueLayout { offset_bytes: 64, depth: 4, buffer_bytes: RING_BODY_BYTES_MAX },
        receiver_doorbell_offset_bytes: 0,
        sender_doorbell_offset_bytes: 0,
    }
}

fn sendrecv_sender_child(argument: &str) {
    let (receiver_json, seed) = argument.rsplit_once(' ').unwrap();
    let receiver_descriptor: RegionDescriptor = serde_json::from_str(receiver_json).unwrap();
    let seed: u64 = seed.parse().unwrap();
    let fabric = ShmFabric::new().unwrap();
    let local = Arc::new(fabric.register("sendrecv-sender", 64, Access::ReadWrite).unwrap());
    let receiver = fabric.map(&receiver_descriptor).unwrap();
    emit(&format!("descriptor={}", serde_json::to_string(&fabric.describe(&local)).unwrap()));
    // Wait for "go": the receiver must have posted its buffers before the first send.
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "go");
    let mut sender = SendQueue::new(fabric, receiver, Arc::clone(&local), queue_addresses()).unwrap();
    for index in 0..RING_MESSAGES {
        sender.send(&message_of(seed, index), CHILD_TIMEOUT).unwrap();
    }
    emit(&format!("sent={RING_MESSAGES}"));
}

/// A sender process pushes 20,000 messages of random size (seeded, printed) through a send/recv
/// queue pair with four posted buffers, so it meets "receiver not ready" and sleeps on its
/// doorbell until this process re-posts; this process polls completions with doorbell waits.
/// Every message arrives once, in order, byte for byte, in the buffer its completion names.
#[test]
fn sendrecv_messages_from_another_process_arrive_intact_and_in_order() {
    let seed = std::env::var("RAMPKV_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("send/recv cross-process test seed: {seed} (rerun with RAMPKV_SEED={seed})");
    let fabric = ShmFabric::new().unwrap();
    let len_bytes = 64 + QueueLayout::len_bytes(4, RING_BODY_BYTES_MAX as usize);
    let local = Arc::new(fabric.register("sendrecv-receiver", len_bytes, Access::ReadWrite).unwrap());
    let argument = format!("{} {seed}", serde_json::to_string(&fabric.describe(&local)).unwrap());
    let mut child = ChildGuard::spawn("sendrecv-sender", &argument);
    let sender_descriptor: RegionDescriptor = serde_json::from_str(&child.expect("descriptor")).unwrap();
    let sender_region = fabric.map(&sender_descriptor).unwrap();
    let mut receiver = ReceiveQueue::new(fabric, Arc::clone(&local), sender_region, queue_addresses()).unwrap();
    let doorbell = Doorbell::new(Arc::clone(&local), 0).unwrap();
    child.say("go");
    let mut next = 0u64;
    let mut message = Vec::with_capacity(RING_BODY_BYTES_MAX as usize);
    let start = Instant::now();
    while next < RING_MESSAGES {
        while let Some(completion) = receiver.poll().unwrap() {
            assert_eq!(completion.sequence(), next);
            message.clear();
            receiver.copy_message(&completion, &mut message);
            receiver.repost(completion).unwrap();
            assert_eq!(message, message_of(seed, next), "message {next} (seed {seed})");
            next += 1;
        }
        if next < RING_MESSAGES {
            doorbell.wait_until(|| receiver.has_pending(), CHILD_TIMEOUT).expect("no message within the timeout");
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(child.expect("sent"), RING_MESSAGES.to_string());
    child.wait_success();
    assert!(receiver.poll().unwrap().is_none());
    assert_eq!(receiver.outstanding(), 4, "every buffer is posted again");
    println!("send/recv cross-process: {RING_MESSAGES} messages in {elapsed:?}");
}

// ---------------------------------------------------------------------------------------------
// RF-RPC across processes.

const RPC_RING_BYTES: usize = 16 * 1024;
const RPC_SLOT_BYTES: usize = 4096;
/// A request entry starting with this byte makes the server spin this long before replying.
const RPC_SLOW_MARKER: u8 = b'S';
const RPC_SLOW_DELAY: Duration = Duration::from_millis(2);

fn rpc_answer(entry: &[u8]) -> Vec<u8> {
    let mut reply: Vec<u8> = entry.iter().rev().copied().collect();
    reply.extend_from_slice(&(entry.len() as u32).to_le_bytes());
    reply
}

/// The server process: registers its region, builds its endpoint (which zeroes the request
/// ring) before publishing its descriptor, then serves until its stdin closes.
fn rpc_server_child(argument: &str) {
    use rampkv_fabric::rpc::{EntryList, RpcLayout, RpcServerEndpoint};
    let client_descriptor: RegionDescriptor = serde_json::from_str(argument).unwrap();
    let dedicated = RpcLayout::dedicated(RPC_RING_BYTES, RPC_SLOT_BYTES);
    let fabric = ShmFabric::new().unwrap();
    let local = Arc::new(fabric.register("rpc-server", dedicated.server_region_bytes, Access::ReadWrite).unwrap());
    let client = fabric.map(&client_descriptor).unwrap();
    let mut endpoint =
        RpcServerEndpoint::new(fabric, Arc::clone(&local), client, dedicated.layout, CHILD_TIMEOUT).unwrap();
    let doorbell = Doorbell::new(Arc::clone(&local), 0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stdin_stop = Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stdin_stop.store(true, Ordering::Relaxed);
    });
    emit(&format!("descriptor={}", serde_json::to_string(&fabric.describe(&local)).unwrap()));
    let mut replies = EntryList::new();
    let mut calls = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let _ = doorbell.wait_until(|| endpoint.has_pending(), Duration::from_millis(10));
        let Some(request) = endpoint.server_recv().unwrap() else { continue };
        replies.clear();
        let mut slow = false;
        for entry in request.entries.iter() {
            slow |= entry.first() == Some(&RPC_SLOW_MARKER);
            replies.push(&rpc_answer(entry));
        }
        let started = Instant::now();
        while slow && started.elapsed() < RPC_SLOW_DELAY {
            std::hint::spin_loop();
        }
        endpoint.server_send(&replies).unwrap();
        calls += 1;
    }
    emit(&format!("calls={calls}"));
}

/// A server in another process: 300 calls of seeded sizes (replies from 4 bytes to past the
/// first fetch), a run of ten 2 ms calls that must switch the connection to pushed replies and
/// fast calls after them that must switch it back, then 400 entries through a batcher. Every reply is checked
/// byte for byte.
#[test]
fn rpc_calls_to_a_server_process_fetch_push_and_batch() {
    use rampkv_fabric::rpc::{BatchConfig, Batcher, EntryList, ReplyMode, RpcClient, RpcConfig, RpcLayout};
    let seed = std::env::var("RAMPKV_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("rpc cross-process test seed: {seed} (rerun with RAMPKV_SEED={seed})");
    let dedicated = RpcLayout::dedicated(RPC_RING_BYTES, RPC_SLOT_BYTES);
    let fabric = ShmFabric::new().unwrap();
    let local = Arc::new(fabric.register("rpc-client", dedicated.client_region_bytes, Access::ReadWrite).unwrap());
    let mut child = ChildGuard::spawn("rpc-server", &serde_json::to_string(&fabric.describe(&local)).unwrap());
    let server_descriptor: RegionDescriptor = serde_json::from_str(&child.expect("descriptor")).unwrap();
    let server = fabric.map(&server_descriptor).unwrap();
    let mut client =
        RpcClient::new(fabric, server, Arc::clone(&local), dedicated.layout, RpcConfig::default()).unwrap();
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut entries = EntryList::new();
    let mut modes = Vec::new();
    let mut calls = 0u64;
    for index in 0..300 {
        let slow = (100..110).contains(&index);
        let len = (next() % 600) as usize;
        let mut request: Vec<u8> = (0..len).map(|_| b'a' + (next() % 26) as u8).collect();
        if slow {
            request.insert(0, RPC_SLOW_MARKER);
        }
        entries.clear();
        entries.push(&request);
        let reply = client.call(&entries, 0).unwrap();
        assert_eq!(reply.entries.iter().collect::<Vec<_>>(), vec![&rpc_answer(&request)[..]], "call {index}");
        modes.push(reply.mode);
        calls += 1;
    }
    let stats = client.stats();
    println!("rpc cross-process stats: {stats:?}");
    assert!(stats.switches_to_push >= 1, "ten 2 ms calls in a row must switch to push: {stats:?}");
    assert!(stats.switches_to_fetch >= 1, "fast pushed replies must switch back: {stats:?}");
    assert!(modes[..100].contains(&ReplyMode::Fetch) && modes[100..].contains(&ReplyMode::Push));
    assert!(stats.second_reads > 0, "replies above 256 bytes need a second read");
    let config = BatchConfig { size: 8, bytes_max: 2048, alone_above_bytes: 512, ..BatchConfig::default() };
    let mut batcher = Batcher::new(client, config).unwrap();
    let sent = std::cell::RefCell::new(std::collections::VecDeque::new());
    let mut received = 0usize;
    let mut on_reply = |completion: rampkv_fabric::rpc::Completion<'_>| {
        let request: Vec<u8> = sent.borrow_mut().pop_front().unwrap();
        assert_eq!(completion.reply, &rpc_answer(&request)[..]);
        received += 1;
    };
    for _ in 0..400 {
        let len = if next() % 20 == 0 { 600 } else { (next() % 64) as usize };
        let request: Vec<u8> = (0..len).map(|_| b'a' + (next() % 26) as u8).collect();
        sent.borrow_mut().push_back(request.clone());
        batcher.enqueue(&request, &mut on_reply).unwrap();
    }
    batcher.flush(&mut on_reply).unwrap();
    assert_eq!(received, 400);
    let batches = batcher.stats().batches;
    println!("rpc cross-process batches: {:?}", batcher.stats().by_reason);
    assert!(batches < 200, "400 entries in {batches} batches");
    child.close_stdin();
    assert_eq!(child.expect("calls"), (calls + batches).to_string());
    child.wait_success();
}
