//! RPC micro-benchmark: remote fetch (RF-RPC), server reply (write-poll), hybrid, batched and
//! server-bypass (Pilaf-style one-sided reads of item slots), over request and reply sizes, in
//! one run and one table.
//!
//! ```text
//! cargo run --release -p rampkv-fabric --example rpc_bench [-- --quick] [-- --seconds S]
//! ```
//! One client thread and one server thread in one process over the shared-memory fabric
//! (`/dev/shm` regions). The server looks the key up in a table of values and replies with the
//! value; the client checks every reply's bytes. These are figures of a shared-memory
//! EMULATION of one-sided access on one machine, not RDMA: there is no NIC, so no in-bound /
//! out-bound asymmetry (see docs/performance.md).

use rampkv_fabric::rpc::{
    AutoBatchConfig, BatchConfig, Batcher, Completion, EntryList, ReplyMode, RpcClient, RpcConfig, RpcLayout,
    RpcServerEndpoint, RpcStats,
};
use rampkv_fabric::slot::SLOT_FLAG_VALID;
use rampkv_fabric::{read_slot, slot_bytes, Access, Doorbell, Fabric, ShmFabric, ShmLocalRegion, SlotWriter};
use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn Error>>;
type Region = Arc<ShmLocalRegion>;
type Client = RpcClient<ShmFabric, Region>;

const KEYS: usize = 1024;
const RING_BYTES: usize = 128 * 1024;
const SLOT_BYTES: usize = 64 * 1024;
const BATCH_SIZE: usize = 16;
const AUTO_LATENCY_LIMIT: Duration = Duration::from_micros(20);
const SIZES: [(usize, usize); 3] = [(16, 32), (16, 512), (256, 32)];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|arg| arg == "--quick");
    let seconds: f64 = args
        .iter()
        .position(|arg| arg == "--seconds")
        .and_then(|at| args.get(at + 1))
        .and_then(|text| text.parse().ok())
        .unwrap_or(if quick { 0.05 } else { 1.0 });
    let duration = Duration::from_secs_f64(seconds);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("rpc_bench: {seconds} s per cell, 1 client + 1 server thread, shared-memory fabric (EMULATED, not RDMA)");
    println!("load average at start: {}", load.trim());
    println!(
        "defaults: F = 256 B, R = 5, fetch interval 1 us (fetch mode: 0), push back below 2 us, batch {BATCH_SIZE} \
         entries / 2048 B, auto batch limit {} us",
        AUTO_LATENCY_LIMIT.as_micros()
    );
    println!(
        "\n| mode | request B | reply B | ops/s | p50 us | p99 us | slot reads/op | notes |\n|---|---:|---:|---:|---:|---:|---:|---|"
    );
    let fabric = ShmFabric::new()?;
    for (cell, &(request_bytes, reply_bytes)) in SIZES.iter().enumerate() {
        let values = values(reply_bytes);
        let fetch = RpcConfig { hybrid: false, fetch_interval: Duration::ZERO, ..RpcConfig::default() };
        let push = RpcConfig { hybrid: false, initial_mode: ReplyMode::Push, ..RpcConfig::default() };
        let modes: [(&str, RpcConfig, Option<BatchConfig>); 5] = [
            ("remote fetch", fetch, None),
            ("server reply", push, None),
            ("hybrid", RpcConfig::default(), None),
            ("batched x16", fetch, Some(BatchConfig { size: BATCH_SIZE, ..BatchConfig::default() })),
            (
                "batched auto",
                fetch,
                Some(BatchConfig {
                    size: 1,
                    auto: Some(AutoBatchConfig::new(AUTO_LATENCY_LIMIT)),
                    ..BatchConfig::default()
                }),
            ),
        ];
        for (index, (name, config, batch)) in modes.into_iter().enumerate() {
            let tag = format!("c{cell}m{index}");
            let (client, server) = connect(fabric, &tag, config, Arc::clone(&values))?;
            let row = match batch {
                None => run_calls(client, request_bytes, &values, duration)?,
                Some(batch) => run_batched(client, batch, request_bytes, &values, duration)?,
            };
            server.stop()?;
            row.print(name, request_bytes, reply_bytes);
        }
        run_bypass(fabric, &format!("c{cell}b"), &values, duration)?.print("server bypass", request_bytes, reply_bytes);
    }
    println!("\nops/s counts operations (batch entries, not batches). All figures: shared-memory emulation, not RDMA.");
    Ok(())
}

fn values(reply_bytes: usize) -> Arc<Vec<Vec<u8>>> {
    Arc::new((0..KEYS).map(|key| (0..reply_bytes).map(|i| (key * 31 + i) as u8).collect()).collect())
}

fn key_of(state: &mut u64) -> usize {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state % KEYS as u64) as usize
}

/// A request: the key index (8 bytes) padded to `request_bytes`.
fn request(key: usize, request_bytes: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(key as u64).to_le_bytes());
    out.resize(request_bytes.max(8), 0);
}

/// What the server thread can fail with (sent back to the main thread).
type ThreadError = Box<dyn std::error::Error + Send + Sync>;

struct Server {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::result::Result<(), ThreadError>>,
}

impl Server {
    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let served = self.thread.join().map_err(|_| "server thread panicked")?;
        served.map_err(|error| -> Box<dyn Error> { error })
    }
}

fn connect(fabric: ShmFabric, tag: &str, config: RpcConfig, values: Arc<Vec<Vec<u8>>>) -> Result<(Client, Server)> {
    let dedicated = RpcLayout::dedicated(RING_BYTES, SLOT_BYTES);
    let server_region: Region =
        Arc::new(fabric.register(&format!("rpcb-{tag}-s"), dedicated.server_region_bytes, Access::ReadWrite)?);
    let client_region: Region =
        Arc::new(fabric.register(&format!("rpcb-{tag}-c"), dedicated.client_region_bytes, Access::ReadWrite)?);
    let server_remote = fabric.map(&fabric.describe(&server_region))?;
    let client_remote = fabric.map(&fabric.describe(&client_region))?;
    let client = RpcClient::new(fabric, server_remote, client_region, dedicated.layout, config)?;
    let mut endpoint = RpcServerEndpoint::new(
        fabric,
        Arc::clone(&server_region),
        client_remote,
        dedicated.layout,
        Duration::from_secs(5),
    )?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = Arc::clone(&stop);
    let thread = std::thread::spawn(move || -> std::result::Result<(), ThreadError> {
        let doorbell = Doorbell::new(Arc::clone(&server_region), 0)?;
        let mut replies = EntryList::new();
        while !thread_stop.load(Ordering::Relaxed) {
            let _ = doorbell.wait_until(|| endpoint.has_pending(), Duration::from_millis(10));
            let Some(request) = endpoint.server_recv()? else { continue };
            replies.clear();
            for entry in request.entries.iter() {
                let key = entry.get(..8).map_or(0, |bytes| u64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])));
                replies.push(&values[key as usize % KEYS]);
            }
            endpoint.server_send(&replies)?;
        }
        Ok(())
    });
    Ok((client, Server { stop, thread }))
}

struct Row {
    ops: u64,
    elapsed: Duration,
    latencies_ns: Vec<u64>,
    stats: RpcStats,
    notes: String,
}

impl Row {
    fn print(mut self, name: &str, request_bytes: usize, reply_bytes: usize) {
        self.latencies_ns.sort_unstable();
        let percentile = |p: f64| {
            let at = ((self.latencies_ns.len() as f64 * p) as usize).min(self.latencies_ns.len().saturating_sub(1));
            self.latencies_ns.get(at).copied().unwrap_or(0) as f64 / 1000.0
        };
        let reads = if self.ops == 0 { 0.0 } else { self.stats.slot_reads as f64 / self.ops as f64 };
        println!(
            "| {name} | {request_bytes} | {reply_bytes} | {:.0} | {:.2} | {:.2} | {reads:.2} | {} |",
            self.ops as f64 / self.elapsed.as_secs_f64(),
            percentile(0.50),
            percentile(0.99),
            self.notes
        );
    }
}

fn run_calls(mut client: Client, request_bytes: usize, values: &[Vec<u8>], duration: Duration) -> Result<Row> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut entries = EntryList::new();
    let mut body = Vec::new();
    let mut latencies_ns = Vec::with_capacity(1 << 20);
    let started = Instant::now();
    let mut ops = 0u64;
    while started.elapsed() < duration {
        let key = key_of(&mut state);
        request(key, request_bytes, &mut body);
        entries.clear();
        entries.push(&body);
        let call_started = Instant::now();
        let reply = client.call(&entries, 0)?;
        let latency = call_started.elapsed();
        if reply.entries.iter().next() != Some(&values[key][..]) {
            return Err("wrong reply".into());
        }
        latencies_ns.push(latency.as_nanos() as u64);
        ops += 1;
    }
    let elapsed = started.elapsed();
    let stats = client.stats();
    let notes = format!(
        "pushed {:.0} %, switches {}/{}",
        100.0 * stats.pushed_calls as f64 / stats.calls.max(1) as f64,
        stats.switches_to_push,
        stats.switches_to_fetch
    );
    Ok(Row { ops, elapsed, latencies_ns, stats, notes })
}

fn run_batched(
    client: Client,
    config: BatchConfig,
    request_bytes: usize,
    values: &[Vec<u8>],
    duration: Duration,
) -> Result<Row> {
    let mut batcher = Batcher::new(client, config)?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut body = Vec::new();
    let keys = std::cell::RefCell::new(std::collections::VecDeque::new());
    let mut latencies_ns = Vec::with_capacity(1 << 20);
    let mut wrong = 0u64;
    let started = Instant::now();
    {
        let mut on_reply = |completion: Completion<'_>| {
            let key = keys.borrow_mut().pop_front().unwrap_or(usize::MAX);
            if values.get(key).map(Vec::as_slice) != Some(completion.reply) {
                wrong += 1;
            }
            latencies_ns.push(completion.latency.as_nanos() as u64);
        };
        while started.elapsed() < duration {
            let key = key_of(&mut state);
            request(key, request_bytes, &mut body);
            // The key is queued before the enqueue: the batch may be sent (and replied) inside it.
            keys.borrow_mut().push_back(key);
            batcher.enqueue(&body, &mut on_reply)?;
        }
        batcher.flush(&mut on_reply)?;
    }
    let elapsed = started.elapsed();
    if wrong > 0 {
        return Err(format!("{wrong} wrong replies").into());
    }
    let stats = batcher.stats();
    let trace = &stats.size_trace;
    let notes = format!(
        "mean batch {:.1}, size chosen {} (from {}, {} decisions)",
        stats.mean_entries(),
        batcher.size(),
        trace[0],
        trace.len() - 1
    );
    Ok(Row { ops: stats.entries, elapsed, latencies_ns, stats: batcher.rpc_stats(), notes })
}

/// Pilaf-style server bypass: the server publishes every value in an item slot (seqlock,
/// checksum, key check) once; the client reads the slot of a key with one-sided reads alone.
/// The server thread takes no part (here it does not even run).
fn run_bypass(fabric: ShmFabric, tag: &str, values: &[Vec<u8>], duration: Duration) -> Result<Row> {
    let key_name = |key: usize| format!("key-{key:012}");
    let capacity = slot_bytes(16, 0, values[0].len());
    let region: Region = Arc::new(fabric.register(&format!("rpcb-{tag}"), capacity * KEYS, Access::ReadOnly)?);
    let mut writer = SlotWriter::new(capacity);
    for (key, value) in values.iter().enumerate() {
        writer.publish(
            &*region,
            key * capacity,
            capacity,
            key_name(key).as_bytes(),
            1,
            0,
            &[],
            value,
            SLOT_FLAG_VALID,
        )?;
    }
    let remote = fabric.map(&fabric.describe(&region))?;
    let mut buf = vec![0u8; capacity];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut latencies_ns = Vec::with_capacity(1 << 20);
    let started = Instant::now();
    let mut ops = 0u64;
    while started.elapsed() < duration {
        let key = key_of(&mut state);
        let name = key_name(key);
        let read_started = Instant::now();
        let view = read_slot(&fabric, &remote, key * capacity, capacity, name.as_bytes(), &mut buf)?;
        let latency = read_started.elapsed();
        if view.value() != values[key].as_slice() {
            return Err("wrong value".into());
        }
        latencies_ns.push(latency.as_nanos() as u64);
        ops += 1;
    }
    let elapsed = started.elapsed();
    let stats = RpcStats { slot_reads: ops * 3, ..RpcStats::default() };
    Ok(Row { ops, elapsed, latencies_ns, stats, notes: "seq, slot, seq: 3 one-sided reads per GET".into() })
}
