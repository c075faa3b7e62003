//! Two hosts, one RC connection: every verbs operation checked on both sides.
//!
//! ```text
//! verbs_pair server ADDR            serve one client, check what it wrote, exit 0 if all is right
//! verbs_pair client ADDR            READ, a batch of READs, WRITE, CAS, FAA, SEND; then read latency
//! verbs_pair serve ADDR             accept one client and stay up (to be killed: the lab's kill test)
//! verbs_pair stream ADDR --seconds N
//!                                   read from a `serve` peer until it fails; exit 0 if the failure is
//!                                   a clear RDMA error within a bound, 1 if none came
//! ```
//!
//! The queue pair endpoints and the server's region descriptor travel as JSON lines over TCP
//! (any control channel would do). `scripts/rdma-lab.sh test` runs it between two QEMU guests
//! with Soft-RoCE.

use rampkv_fabric::verbs::{
    Completion, Context, DeviceSelection, Endpoint, MemoryRegion, ProtectionDomain, QueuePair, QueuePairOptions,
    ReceiveBuffer, RegionAccess, RemoteRegion, VerbsError,
};
use rampkv_fabric::words::{LoadOrdering, StoreOrdering};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const REGION_BYTES: usize = 1 << 16;
const CAS_OFFSET: u64 = 16_384;
const FAA_OFFSET: u64 = 16_392;
const WRITE_OFFSET: u64 = 8192;
const MESSAGE: &[u8] = b"hello from b";
const MESSAGE_IMMEDIATE: u32 = 0xb0b;
const WAIT: Duration = Duration::from_secs(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(90);
/// A dead peer must be reported within this long after the last completed read.
const PEER_LOSS_BOUND: Duration = Duration::from_secs(30);
const LATENCY_SAMPLES: usize = 1000;

#[derive(Serialize, Deserialize)]
struct Hello {
    endpoint: Endpoint,
    region: RemoteRegion,
}

fn server_pattern(word: u64) -> u64 {
    0xa5a5_0000_0000_0000 | word
}

fn client_pattern(word: u64) -> u64 {
    0x5a5a_0000_0000_0000 | word
}

struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Control {
    fn new(stream: TcpStream) -> Result<Control> {
        stream.set_read_timeout(Some(Duration::from_secs(300)))?;
        Ok(Control { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    fn send<T: Serialize>(&mut self, value: &T) -> Result<()> {
        let mut line = serde_json::to_string(value)?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        Ok(())
    }

    fn receive<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err("the peer closed the control connection".into());
        }
        Ok(serde_json::from_str(line.trim_end())?)
    }
}

fn accept(address: &str) -> Result<TcpStream> {
    let listener = TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                println!("control connection from {peer}");
                stream.set_nonblocking(false)?;
                return Ok(stream);
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => return Err(format!("no client within {CONNECT_TIMEOUT:?}: {error}").into()),
        }
    }
}

fn dial(address: &str) -> Result<TcpStream> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match TcpStream::connect(address) {
            Ok(stream) => return Ok(stream),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(error) => return Err(format!("cannot reach {address}: {error}").into()),
        }
    }
}

struct Side {
    pd: ProtectionDomain,
    queue_pair: QueuePair,
    region: MemoryRegion,
}

fn open_side(access: RegionAccess) -> Result<Side> {
    let context = Context::open(&DeviceSelection::default())?;
    let port = context.port();
    println!(
        "device {} port {} GID index {} ({:?}), MTU {} B, read/atomic depth {}",
        port.device, port.port, port.gid_index, port.gid_kind, port.active_mtu_bytes, port.read_atomic_depth
    );
    let pd = ProtectionDomain::new(&context)?;
    let queue_pair = QueuePair::new(&pd, &QueuePairOptions::default())?;
    let region = MemoryRegion::register(&pd, REGION_BYTES, access)?;
    Ok(Side { pd, queue_pair, region })
}

/// Exchanges hellos (the server speaks first) and connects the queue pair.
fn handshake(side: &mut Side, control: &mut Control, speak_first: bool) -> Result<Hello> {
    let mine = Hello { endpoint: side.queue_pair.endpoint(), region: side.region.remote() };
    let peer: Hello = if speak_first {
        control.send(&mine)?;
        control.receive()?
    } else {
        let peer = control.receive()?;
        control.send(&mine)?;
        peer
    };
    peer.endpoint.check()?;
    peer.region.check()?;
    side.queue_pair.connect(&peer.endpoint)?;
    println!("connected: QPN {} -> peer QPN {}", side.queue_pair.endpoint().qp_num, peer.endpoint.qp_num);
    Ok(peer)
}

fn server_side() -> Result<Side> {
    let rights = RegionAccess::LOCAL_WRITE
        | RegionAccess::REMOTE_READ
        | RegionAccess::REMOTE_WRITE
        | RegionAccess::REMOTE_ATOMIC;
    let side = open_side(rights)?;
    for word in 0..512u64 {
        side.region.store_word(word * 8, server_pattern(word), StoreOrdering::Relaxed)?;
    }
    side.region.store_word(CAS_OFFSET, 7, StoreOrdering::Relaxed)?;
    side.region.store_word(FAA_OFFSET, 100, StoreOrdering::Relaxed)?;
    Ok(side)
}

fn server(address: &str) -> Result<bool> {
    let mut side = server_side()?;
    let inbox = MemoryRegion::register(&side.pd, 4096, RegionAccess::LOCAL_WRITE)?;
    side.queue_pair.post_receives(&inbox, &[ReceiveBuffer { offset_bytes: 0, len_bytes: 4096 }])?;
    let mut control = Control::new(accept(address)?)?;
    handshake(&mut side, &mut control, true)?;
    control.send(&"ready")?;
    let done: String = control.receive()?;
    if done != "done" {
        return Err(format!("expected done, got {done}").into());
    }
    let mut problems = Vec::new();
    let mut completions = [Completion::default(); 2];
    let received = side.queue_pair.wait_receive(&mut completions, WAIT)?;
    let mut message = vec![0u8; MESSAGE.len()];
    inbox.read(0, &mut message)?;
    if received.len() != 1
        || received[0].byte_len() as usize != MESSAGE.len()
        || received[0].immediate() != Some(MESSAGE_IMMEDIATE)
        || message != MESSAGE
    {
        problems.push(format!("SEND: got {received:?} {:?}", String::from_utf8_lossy(&message)));
    }
    for word in 0..512u64 {
        let value = side.region.load_word(WRITE_OFFSET + word * 8, LoadOrdering::Acquire)?;
        if value != client_pattern(word) {
            problems.push(format!("WRITE: word {word} is {value:#x}"));
            break;
        }
    }
    let cas = side.region.load_word(CAS_OFFSET, LoadOrdering::Acquire)?;
    let faa = side.region.load_word(FAA_OFFSET, LoadOrdering::Acquire)?;
    if cas != 9 {
        problems.push(format!("CAS word is {cas}, expected 9"));
    }
    if faa != 105 {
        problems.push(format!("FAA word is {faa}, expected 105"));
    }
    let verdict = if problems.is_empty() { "ok".to_owned() } else { problems.join("; ") };
    println!("server checks: {verdict}");
    control.send(&verdict)?;
    Ok(problems.is_empty())
}

fn read_and_wait(
    queue_pair: &mut QueuePair,
    local: &MemoryRegion,
    remote: &RemoteRegion,
    offset: u64,
    len: u32,
) -> Result<()> {
    let mut batch = queue_pair.batch()?;
    batch.read(local, 0, remote, offset, len)?;
    let range = batch.post()?;
    queue_pair.wait_send_through(range.last().expect("one read"), WAIT)?;
    Ok(())
}

fn client(address: &str) -> Result<bool> {
    let mut side = open_side(RegionAccess::LOCAL_WRITE)?;
    let mut control = Control::new(dial(address)?)?;
    let peer = handshake(&mut side, &mut control, false)?;
    let ready: String = control.receive()?;
    if ready != "ready" {
        return Err(format!("expected ready, got {ready}").into());
    }
    let (queue_pair, local, remote) = (&mut side.queue_pair, &side.region, &peer.region);
    let mut problems = Vec::new();

    read_and_wait(queue_pair, local, remote, 0, 4096)?;
    if let Some(word) =
        (0..512u64).find(|word| local.load_word(word * 8, LoadOrdering::Acquire).ok() != Some(server_pattern(*word)))
    {
        problems.push(format!("READ: word {word} differs"));
    }
    println!("READ 4 KiB: {}", if problems.is_empty() { "ok" } else { "WRONG" });

    let mut batch = queue_pair.batch()?;
    for item in 0..16u64 {
        batch.read(local, 8192 + item * 8, remote, item * 256, 8)?;
    }
    let range = batch.post()?;
    queue_pair.wait_send_through(range.last().expect("16 reads"), WAIT)?;
    let batch_ok = (0..16u64)
        .all(|item| local.load_word(8192 + item * 8, LoadOrdering::Acquire).ok() == Some(server_pattern(item * 32)));
    if !batch_ok {
        problems.push("batch of 16 READs: wrong data".to_owned());
    }
    println!("16 READs in one post: {}", if batch_ok { "ok" } else { "WRONG" });

    for word in 0..512u64 {
        local.store_word(16_384 + word * 8, client_pattern(word), StoreOrdering::Relaxed)?;
    }
    local.write(32_768, MESSAGE)?;
    let mut batch = queue_pair.batch()?;
    batch.write(local, 16_384, remote, WRITE_OFFSET, 4096, None)?;
    batch.compare_and_swap(local, 24_576, remote, CAS_OFFSET, 7, 9)?;
    batch.fetch_and_add(local, 24_584, remote, FAA_OFFSET, 5)?;
    batch.compare_and_swap(local, 24_592, remote, CAS_OFFSET, 7, 11)?;
    batch.send(local, 32_768, MESSAGE.len() as u32, Some(MESSAGE_IMMEDIATE))?;
    let range = batch.post()?;
    queue_pair.wait_send_through(range.last().expect("five requests"), WAIT)?;
    let olds =
        [24_576u64, 24_584, 24_592].map(|offset| local.load_word(offset, LoadOrdering::Acquire).unwrap_or(u64::MAX));
    if olds != [7, 100, 9] {
        problems.push(format!("atomics returned {olds:?}, expected [7, 100, 9]"));
    }
    println!("WRITE 4 KiB, CAS (swapped), FAA, CAS (not swapped), SEND in one post: old values {olds:?}");

    // Measured while the server is still connected (it exits after its verdict).
    for len in [8u32, 1024] {
        let median = read_latency_median_us(queue_pair, local, remote, len)?;
        println!("READ {len} B latency: median {median:.2} us over {LATENCY_SAMPLES} reads (busy polling)");
    }
    control.send(&"done")?;
    let verdict: String = control.receive()?;
    println!("server says: {verdict}");
    if verdict != "ok" {
        problems.push(format!("server: {verdict}"));
    }
    if !problems.is_empty() {
        println!("client checks: {}", problems.join("; "));
    }
    Ok(problems.is_empty())
}

/// One READ at a time, busy-polling its completion (as perftest's ib_read_lat does).
fn read_latency_median_us(
    queue_pair: &mut QueuePair,
    local: &MemoryRegion,
    remote: &RemoteRegion,
    len: u32,
) -> Result<f64> {
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    let mut completions = [Completion::default(); 4];
    for _ in 0..LATENCY_SAMPLES {
        let started = Instant::now();
        let mut batch = queue_pair.batch()?;
        batch.read(local, 0, remote, 0, len)?;
        batch.post()?;
        while queue_pair.poll_send(&mut completions)?.is_empty() {
            if started.elapsed() > WAIT {
                return Err("a READ did not complete".into());
            }
        }
        samples.push(started.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn serve(address: &str) -> Result<bool> {
    let mut side = server_side()?;
    let mut control = Control::new(accept(address)?)?;
    handshake(&mut side, &mut control, true)?;
    println!("serving until killed");
    std::thread::sleep(Duration::from_secs(300));
    Ok(true)
}

fn stream(address: &str, seconds: u64) -> Result<bool> {
    let mut side = open_side(RegionAccess::LOCAL_WRITE)?;
    let mut control = Control::new(dial(address)?)?;
    let peer = handshake(&mut side, &mut control, false)?;
    println!("streaming reads");
    let started = Instant::now();
    let mut last_completed = Instant::now();
    let mut reads = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let mut batch = side.queue_pair.batch()?;
        for item in 0..8u64 {
            batch.read(&side.region, item * 8, &peer.region, item * 8, 8)?;
        }
        let range = batch.post()?;
        match side.queue_pair.wait_send_through(range.last().expect("8 reads"), WAIT) {
            Ok(()) => {
                reads += 8;
                last_completed = Instant::now();
            }
            Err(error) => {
                let silent = last_completed.elapsed();
                println!("peer lost after {reads} reads: {error} ({silent:?} after the last completed read)");
                // How a dead peer shows depends on what its kernel tore down first: its queue
                // pair (no answer: RETRY_EXC_ERR after the retries) or its regions (the still
                // live queue pair refuses access: REM_ACCESS_ERR at once). Either is a failed
                // completion naming its status; a Timeout of our own wait would not be.
                let clear = matches!(error, VerbsError::CompletionFailed { .. });
                let bounded = silent < PEER_LOSS_BOUND;
                println!("clear error: {clear}; within {PEER_LOSS_BOUND:?}: {bounded}");
                return Ok(clear && bounded);
            }
        }
    }
    println!("the peer never failed in {seconds} s ({reads} reads)");
    Ok(false)
}

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let result = match arguments.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["server", address] => server(address),
        ["client", address] => client(address),
        ["serve", address] => serve(address),
        ["stream", address, "--seconds", seconds] => match seconds.parse() {
            Ok(seconds) => stream(address, seconds),
            Err(_) => Err("--seconds takes a number".into()),
        },
        _ => {
            eprintln!("usage: verbs_pair server|client|serve ADDR | stream ADDR --seconds N");
            std::process::exit(2);
        }
    };
    match result {
        Ok(true) => println!("verbs_pair: ok"),
        Ok(false) => {
            println!("verbs_pair: FAILED");
            std::process::exit(1);
        }
        Err(error) => {
            println!("verbs_pair: error: {error}");
            std::process::exit(1);
        }
    }
}
