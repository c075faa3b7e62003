//! Micro-benchmark of the shared-memory fabric.
//!
//! ```text
//! cargo run --release -p rampkv-fabric --example fabric_bench [-- --quick]
//! ```
//! Measures (1) a verified one-sided read of a 1 KiB item slot (`read_slot`: seqlock, checksum,
//! key check), idle and while a writer thread rewrites it; (2) a message-ring round trip (32-byte
//! ping and echo) between two threads and between two processes; (3) the same round trip over an
//! emulated send/recv queue pair (posted buffers, completion queue); (4) what a *keyed* slot
//! checksum (a MAC, against forged slots) would cost next to the unkeyed XXH3 the slot uses, on
//! the same slot image. These are shared-memory emulation figures, not RDMA: no NIC, no PCIe,
//! no network.

use rampkv_fabric::slot::SLOT_FLAG_VALID;
use rampkv_fabric::{
    read_slot, slot_bytes, Access, Doorbell, Fabric, OneSided, QueueAddresses, QueueLayout, ReceiveQueue,
    RegionDescriptor, RingAddresses, RingLayout, RingReceiver, RingSender, SendQueue, ShmFabric, ShmLocalRegion,
    SlotReadError, SlotWriter,
};
use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const CHILD_ENV: &str = "RAMPKV_FABRIC_BENCH_ECHO";
const SLOT_CAPACITY_BYTES: usize = 1024;
const KEY: &[u8] = b"bench-key-000001";
const PING_BYTES: usize = 32;
const WAIT_TIMEOUT: Duration = Duration::from_secs(10);
// Both directions use the same layout inside their receiver's region.
const DOORBELL_OFFSET_BYTES: u64 = 0;
const CREDIT_OFFSET_BYTES: u64 = 64;
const RING_OFFSET_BYTES: u64 = 128;
const RING_BYTES: u64 = 64 * 1024;
const REGION_BYTES: usize = (RING_OFFSET_BYTES + RING_BYTES) as usize;
const ADDRESSES: RingAddresses = RingAddresses {
    ring: RingLayout { offset_bytes: RING_OFFSET_BYTES, ring_bytes: RING_BYTES, body_bytes_max: 4096 },
    receiver_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
    credit_offset_bytes: CREDIT_OFFSET_BYTES,
    sender_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
};

type Region = Arc<ShmLocalRegion>;

fn main() -> Result<()> {
    if let Ok(descriptor) = std::env::var(CHILD_ENV) {
        return echo_child(&descriptor);
    }
    let quick = std::env::args().any(|arg| arg == "--quick");
    let scale = if quick { 10 } else { 1 };
    print_machine();
    let fabric = ShmFabric::new()?;
    bench_slot_reads(fabric, 2_000_000 / scale)?;
    bench_ring_threads(fabric, 200_000 / scale)?;
    bench_ring_processes(fabric, 200_000 / scale)?;
    bench_sendrecv_threads(fabric, 200_000 / scale)?;
    bench_keyed_checksums(2_000_000 / scale);
    println!("\nAll figures: shared-memory emulation of one-sided access on one machine, not RDMA.");
    Ok(())
}

fn print_machine() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|| "none (uncommitted)".into());
    println!("fabric_bench: shared-memory fabric micro-benchmark (an emulation, NOT RDMA)");
    println!(
        "machine: nproc {}, cpu {cpu}, kernel {}, git commit {commit}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    );
}

/// A checksum candidate: its name and the function (bytes to 64 bits).
type NamedChecksum<'a> = (&'a str, &'a dyn Fn(&[u8]) -> u64);

/// The checksum candidates over one slot image of `SLOT_CAPACITY_BYTES`: what `read_slot`'s
/// verification would cost with a key. Each line is ns per image, the best of five passes.
fn bench_keyed_checksums(images: u64) {
    use hmac::{Hmac, Mac};
    use std::hash::Hasher;
    let image: Vec<u8> = (0..SLOT_CAPACITY_BYTES).map(|index| (index * 31) as u8).collect();
    let (key, key16) = ([7u8; 32], [7u8; 16]);
    println!("\n4. checksum of one {SLOT_CAPACITY_BYTES}-byte slot image, {images} images per pass (best of 5)");
    let candidates: [NamedChecksum<'_>; 4] = [
        ("XXH3-64 (the slot's, unkeyed)", &|bytes| xxhash_rust::xxh3::xxh3_64(bytes)),
        ("SipHash-1-3, keyed", &|bytes| {
            let mut hasher = siphasher::sip::SipHasher13::new_with_key(&key16);
            hasher.write(bytes);
            hasher.finish()
        }),
        ("SipHash-2-4, keyed", &|bytes| {
            let mut hasher = siphasher::sip::SipHasher24::new_with_key(&key16);
            hasher.write(bytes);
            hasher.finish()
        }),
        ("HMAC-SHA-256, keyed", &|bytes| {
            let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&key).expect("any key length");
            mac.update(bytes);
            u64::from_le_bytes(mac.finalize().into_bytes()[..8].try_into().expect("8 bytes"))
        }),
    ];
    for (name, checksum) in candidates {
        let mut best_ns = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            let mut folded = 0u64;
            for _ in 0..images {
                folded ^= checksum(std::hint::black_box(&image));
            }
            std::hint::black_box(folded);
            best_ns = best_ns.min(start.elapsed().as_nanos() as f64 / images as f64);
        }
        println!("   {name:32} {best_ns:7.1} ns/image");
    }
}

fn value_for(generation: u64) -> Vec<u8> {
    let value_bytes = SLOT_CAPACITY_BYTES - slot_bytes(KEY.len(), 0, 0);
    (0..value_bytes).map(|i| (i as u64 ^ generation) as u8).collect()
}

fn bench_slot_reads(fabric: ShmFabric, reads: u64) -> Result<()> {
    let region = fabric.register("bench-slot", 4096, Access::ReadOnly)?;
    let mut writer = SlotWriter::new(SLOT_CAPACITY_BYTES);
    writer.publish(&region, 0, SLOT_CAPACITY_BYTES, KEY, 1, 0, b"", &value_for(1), SLOT_FLAG_VALID)?;
    assert_eq!(slot_bytes(KEY.len(), 0, value_for(1).len()), SLOT_CAPACITY_BYTES);
    let remote = fabric.map(&fabric.describe(&region))?;
    let mut buf = vec![0u8; SLOT_CAPACITY_BYTES];
    println!("\n1. verified one-sided read of a {SLOT_CAPACITY_BYTES}-byte slot (read_slot), {reads} reads");
    let idle = time_reads(&fabric, &remote, &mut buf, reads);
    println!(
        "   idle slot:           {:7.1} ns/read  (accepted {}, torn retries {}, fallbacks {})",
        idle.ns_per_read, idle.accepted, idle.retries, idle.fallbacks
    );

    for (label, pause) in [("rewritten nonstop:  ", None), ("rewritten every 10us:", Some(Duration::from_micros(10)))] {
        let stop = AtomicBool::new(false);
        let timing = std::thread::scope(|scope| {
            scope.spawn(|| rewrite_until(&stop, &mut writer, &region, pause));
            let result = time_reads(&fabric, &remote, &mut buf, reads);
            stop.store(true, Ordering::Relaxed);
            result
        });
        println!(
            "   {label} {:7.1} ns/read  (accepted {}, torn retries {}, fallbacks {})",
            timing.ns_per_read, timing.accepted, timing.retries, timing.fallbacks
        );
    }
    Ok(())
}

/// Rewrites the bench slot with alternating values until `stop`, pausing `pause` (spinning,
/// so the pause is exact) between writes, or not at all.
fn rewrite_until(stop: &AtomicBool, writer: &mut SlotWriter, region: &ShmLocalRegion, pause: Option<Duration>) {
    let values = [value_for(1), value_for(2)];
    let mut generation = 1u64;
    while !stop.load(Ordering::Relaxed) {
        generation += 1;
        let value = &values[(generation % 2) as usize];
        writer
            .publish(region, 0, SLOT_CAPACITY_BYTES, KEY, generation, 0, b"", value, SLOT_FLAG_VALID)
            .expect("publish");
        if let Some(pause) = pause {
            let until = Instant::now() + pause;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
    }
}

struct ReadTiming {
    ns_per_read: f64,
    accepted: u64,
    retries: u64,
    fallbacks: u64,
}

fn time_reads<F: OneSided>(fabric: &F, remote: &F::RemoteRegion, buf: &mut [u8], reads: u64) -> ReadTiming {
    let mut timing = ReadTiming { ns_per_read: 0.0, accepted: 0, retries: 0, fallbacks: 0 };
    let start = Instant::now();
    for _ in 0..reads {
        match read_slot(fabric, remote, 0, SLOT_CAPACITY_BYTES, KEY, buf) {
            Ok(view) => {
                timing.accepted += 1;
                timing.retries += u64::from(view.attempts() - 1);
                std::hint::black_box(view.value());
            }
            Err(SlotReadError::Torn { attempts }) => {
                timing.retries += u64::from(attempts);
                timing.fallbacks += 1;
            }
            Err(other) => panic!("{other}"),
        }
    }
    timing.ns_per_read = start.elapsed().as_nanos() as f64 / reads as f64;
    timing
}

/// One end of a ping-pong connection: a receiver on its own ring, a sender to the peer's.
struct Endpoint {
    receiver: RingReceiver<ShmFabric, Region>,
    sender: RingSender<ShmFabric, Region>,
    doorbell: Doorbell<Region>,
}

impl Endpoint {
    /// `local` holds this end's ring, credit word and doorbell; `peer` is the other end's
    /// region. Build both ends' endpoints before the first send (the receiver zeroes its ring).
    fn new(fabric: ShmFabric, local: &Region, peer: &RegionDescriptor) -> Result<Self> {
        let receiver = RingReceiver::new(fabric, Arc::clone(local), fabric.map(peer)?, ADDRESSES)?;
        let sender = RingSender::new(fabric, fabric.map(peer)?, Arc::clone(local), ADDRESSES)?;
        let doorbell = Doorbell::new(Arc::clone(local), DOORBELL_OFFSET_BYTES as usize)?;
        Ok(Self { receiver, sender, doorbell })
    }

    /// Waits for the next message (spin, then doorbell) and hands its body to `handle`.
    fn receive<T>(&mut self, handle: impl FnOnce(&[u8]) -> T) -> Result<T> {
        loop {
            if let Some(view) = self.receiver.poll()? {
                return Ok(handle(view.body()));
            }
            let receiver = &self.receiver;
            self.doorbell.wait_until(|| receiver.has_pending(), WAIT_TIMEOUT)?;
        }
    }

    /// Echoes every message back until an empty one arrives.
    fn echo(&mut self) -> Result<()> {
        let mut body = Vec::with_capacity(4096);
        loop {
            let empty = self.receive(|message| {
                body.clear();
                body.extend_from_slice(message);
                message.is_empty()
            })?;
            self.sender.send(&body, WAIT_TIMEOUT)?;
            if empty {
                return Ok(());
            }
        }
    }

    /// `rounds` ping/echo round trips; returns per-round latencies in ns, sorted.
    fn ping(&mut self, rounds: u64) -> Result<Vec<u64>> {
        let ping = [0x5Au8; PING_BYTES];
        let mut latencies = Vec::with_capacity(rounds as usize);
        for _ in 0..rounds {
            let start = Instant::now();
            self.sender.send(&ping, WAIT_TIMEOUT)?;
            let ok = self.receive(|reply| reply == ping)?;
            latencies.push(start.elapsed().as_nanos() as u64);
            assert!(ok, "echo differs from ping");
        }
        self.sender.send(b"", WAIT_TIMEOUT)?;
        self.receive(|_| ())?;
        latencies.sort_unstable();
        Ok(latencies)
    }
}

fn report_round_trips(label: &str, latencies: &[u64]) {
    let mean = latencies.iter().sum::<u64>() as f64 / latencies.len() as f64;
    let at = |quantile: f64| latencies[((latencies.len() - 1) as f64 * quantile) as usize];
    println!(
        "   {label}: mean {:7.0} ns, p50 {:6} ns, p99 {:7} ns, p99.9 {:8} ns",
        mean,
        at(0.50),
        at(0.99),
        at(0.999)
    );
}

fn bench_ring_threads(fabric: ShmFabric, rounds: u64) -> Result<()> {
    println!("\n2. ring round trip, {PING_BYTES}-byte ping + echo, {rounds} rounds");
    let client_region = Arc::new(fabric.register("bench-client", REGION_BYTES, Access::ReadWrite)?);
    let server_region = Arc::new(fabric.register("bench-server", REGION_BYTES, Access::ReadWrite)?);
    let mut client = Endpoint::new(fabric, &client_region, &fabric.describe(&server_region))?;
    let mut server = Endpoint::new(fabric, &server_region, &fabric.describe(&client_region))?;
    let latencies = std::thread::scope(|scope| {
        let echo = scope.spawn(move || server.echo().map_err(|error| error.to_string()));
        let latencies = client.ping(rounds).map_err(|error| error.to_string());
        echo.join().expect("echo thread panicked")?;
        latencies
    })?;
    report_round_trips("two threads  ", &latencies);
    Ok(())
}

fn bench_ring_processes(fabric: ShmFabric, rounds: u64) -> Result<()> {
    let client_region = Arc::new(fabric.register("bench-process-client", REGION_BYTES, Access::ReadWrite)?);
    let descriptor = serde_json::to_string(&fabric.describe(&client_region))?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, descriptor)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no child stdout")?).lines();
    let server_descriptor: RegionDescriptor = serde_json::from_str(&lines.next().ok_or("child exited")??)?;
    let mut client = Endpoint::new(fabric, &client_region, &server_descriptor)?;
    // The child built its endpoint before printing; ours exists now: start.
    writeln!(child.stdin.as_mut().ok_or("no child stdin")?, "go")?;
    let latencies = client.ping(rounds)?;
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("echo process failed: {status}").into());
    }
    report_round_trips("two processes", &latencies);
    Ok(())
}

/// The echo process of `bench_ring_processes`.
fn echo_child(client_descriptor: &str) -> Result<()> {
    let fabric = ShmFabric::new()?;
    let client: RegionDescriptor = serde_json::from_str(client_descriptor)?;
    let region = Arc::new(fabric.register("bench-process-server", REGION_BYTES, Access::ReadWrite)?);
    let mut server = Endpoint::new(fabric, &region, &client)?;
    println!("{}", serde_json::to_string(&fabric.describe(&region))?);
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    server.echo()?;
    // Keep `region` (and its file) alive until the client has its last reply.
    drop(server);
    drop(region);
    Ok(())
}

// Send/recv: doorbell at 0, queues and 16 buffers of 4 KiB at 128 of each side's region.
const QUEUE_OFFSET_BYTES: u64 = 128;
const QUEUE_DEPTH: usize = 16;
const QUEUE_BUFFER_BYTES: usize = 4096;
const QUEUE_REGION_BYTES: usize = QUEUE_OFFSET_BYTES as usize + QueueLayout::len_bytes(QUEUE_DEPTH, QUEUE_BUFFER_BYTES);
const QUEUE_ADDRESSES: QueueAddresses = QueueAddresses {
    queue: QueueLayout {
        offset_bytes: QUEUE_OFFSET_BYTES,
        depth: QUEUE_DEPTH as u64,
        buffer_bytes: QUEUE_BUFFER_BYTES as u64,
    },
    receiver_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
    sender_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
};

/// One end of a send/recv ping-pong: a receive queue (posted buffers) in its own region, a
/// send queue into the peer's.
struct QueueEndpoint {
    receiver: ReceiveQueue<ShmFabric, Region>,
    sender: SendQueue<ShmFabric, Region>,
    doorbell: Doorbell<Region>,
    message: Vec<u8>,
}

impl QueueEndpoint {
    fn new(fabric: ShmFabric, local: &Region, peer: &RegionDescriptor) -> Result<Self> {
        let receiver = ReceiveQueue::new(fabric, Arc::clone(local), fabric.map(peer)?, QUEUE_ADDRESSES)?;
        let sender = SendQueue::new(fabric, fabric.map(peer)?, Arc::clone(local), QUEUE_ADDRESSES)?;
        let doorbell = Doorbell::new(Arc::clone(local), DOORBELL_OFFSET_BYTES as usize)?;
        Ok(Self { receiver, sender, doorbell, message: Vec::with_capacity(QUEUE_BUFFER_BYTES) })
    }

    /// Waits for the next completion (spin, then doorbell), copies the message out and posts
    /// the buffer again: the receiver's share of a SEND.
    fn receive(&mut self) -> Result<()> {
        loop {
            if let Some(completion) = self.receiver.poll()? {
                self.message.clear();
                self.receiver.copy_message(&completion, &mut self.message);
                self.receiver.repost(completion)?;
                return Ok(());
            }
            let receiver = &self.receiver;
            self.doorbell.wait_until(|| receiver.has_pending(), WAIT_TIMEOUT)?;
        }
    }

    fn echo(&mut self) -> Result<()> {
        loop {
            self.receive()?;
            self.sender.send(&self.message, WAIT_TIMEOUT)?;
            if self.message.is_empty() {
                return Ok(());
            }
        }
    }

    fn ping(&mut self, rounds: u64) -> Result<Vec<u64>> {
        let ping = [0x5Au8; PING_BYTES];
        let mut latencies = Vec::with_capacity(rounds as usize);
        for _ in 0..rounds {
            let start = Instant::now();
            self.sender.send(&ping, WAIT_TIMEOUT)?;
            self.receive()?;
            latencies.push(start.elapsed().as_nanos() as u64);
            assert!(self.message == ping, "echo differs from ping");
        }
        self.sender.send(b"", WAIT_TIMEOUT)?;
        self.receive()?;
        latencies.sort_unstable();
        Ok(latencies)
    }
}

fn bench_sendrecv_threads(fabric: ShmFabric, rounds: u64) -> Result<()> {
    println!(
        "\n3. send/recv round trip (posted buffers, completion queue), {PING_BYTES}-byte ping + echo, {rounds} rounds"
    );
    let client_region = Arc::new(fabric.register("bench-sr-client", QUEUE_REGION_BYTES, Access::ReadWrite)?);
    let server_region = Arc::new(fabric.register("bench-sr-server", QUEUE_REGION_BYTES, Access::ReadWrite)?);
    let mut client = QueueEndpoint::new(fabric, &client_region, &fabric.describe(&server_region))?;
    let mut server = QueueEndpoint::new(fabric, &server_region, &fabric.describe(&client_region))?;
    let latencies = std::thread::scope(|scope| {
        let echo = scope.spawn(move || server.echo().map_err(|error| error.to_string()));
        let latencies = client.ping(rounds).map_err(|error| error.to_string());
        echo.join().expect("echo thread panicked")?;
        latencies
    })?;
    report_round_trips("two threads  ", &latencies);
    Ok(())
}
