//! The latency of one GET\* item-slot read across two hosts, at the fabric level (issue 29).
//!
//! ```text
//! slot_read_lat server ADDR [--fabric verbs|auto|shm]
//!                 register an item-slot region, publish SLOTS valid slots, send its descriptor
//!                 as one JSON line to the client that connects to ADDR, stay up until it is done
//! slot_read_lat client ADDR [--fabric verbs|auto|shm] [--reads N]
//!                 map the descriptor and time N single-slot reads as GET* does them
//! ```
//!
//! One GET\* slot read, as `rampkv-net`'s one-sided transport does it for a one-key GET of a
//! server that needs no lease (no configuration service): the transport reads the region's lease
//! word until it says no lease is needed, which holds for the region's life, and not again after
//! that (`KnownLease`), so the client reads the word once first, as a settled transport has.
//! Then per read, over verbs (reads are round trips): the whole slot in one
//! [`OneSided::read_many`] (one READ, one doorbell, one round trip), then [`verify_image`]
//! (seq even, trailer copy, checksum, flags and key); [`read_slot`] only for a torn image. Over
//! shared memory: [`read_slot`] (`seq`, the 48-byte header, the rest of the version, `seq`
//! again; then the same checks). Each slot is
//! `SLOT_BYTES` (1,280 B, the bench's default slot) and its version fills it, so the slot bytes
//! read equal perftest's `ib_read_lat -s 1280`. The client also times the parts: `read_slot`
//! alone (one whole-slot READ over verbs), each fabric operation on its own, one whole-slot read,
//! and the verification alone (over memory).
//! `scripts/rdma-lab.sh` runs it between two QEMU guests with Soft-RoCE.

use rampkv_fabric::memory::MemoryFabric;
use rampkv_fabric::slot::SLOT_HEADER_BYTES;
use rampkv_fabric::{
    read_slot, slot_bytes, verify_image, Access, AnyFabric, Fabric, FabricChoice, LoadOrdering, OneSided,
    RegionDescriptor, SlotReadError, SlotWriter, StoreOrdering, Words,
};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The bench's default item slot.
const SLOT_BYTES: usize = 1280;
const SLOTS: usize = 64;
const KEY_BYTES: usize = 16;
const METADATA_BYTES: usize = 16;
/// The value that makes a version fill its slot exactly.
const VALUE_BYTES: usize = SLOT_BYTES - slot_bytes(KEY_BYTES, METADATA_BYTES, 0);
/// The lease word sits on its own 64-byte line after the slots, as in `rampkv-net`.
const LEASE_OFFSET: usize = SLOTS * SLOT_BYTES;
const REGION_BYTES: usize = LEASE_OFFSET + 64;
const READS_DEFAULT: usize = 1000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(90);
/// The whole client run (every loop) ends within this.
const RUN_BOUND: Duration = Duration::from_secs(400);

fn key_of(slot: usize) -> Vec<u8> {
    format!("slot-key-{slot:07}").into_bytes()
}

fn value_of(slot: usize) -> Vec<u8> {
    (0..VALUE_BYTES).map(|byte| (byte + slot) as u8).collect()
}

fn accept(address: &str) -> Result<TcpStream> {
    let listener = TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
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

fn server(address: &str, choice: FabricChoice) -> Result<()> {
    let fabric = AnyFabric::open(choice)?;
    let name = format!("rampkv-slot-read-lat-{}", std::process::id());
    let region = fabric.register(&name, REGION_BYTES, Access::ReadOnly)?;
    let mut writer = SlotWriter::new(SLOT_BYTES);
    let metadata = [7u8; METADATA_BYTES];
    for slot in 0..SLOTS {
        writer.publish(
            &region,
            slot * SLOT_BYTES,
            SLOT_BYTES,
            &key_of(slot),
            1000 + slot as u64,
            0,
            &metadata,
            &value_of(slot),
            rampkv_fabric::slot::SLOT_FLAG_VALID,
        )?;
    }
    region.store(LEASE_OFFSET / 8, u64::MAX, StoreOrdering::Release);
    println!("{SLOTS} slots of {SLOT_BYTES} B published in {name}");
    let stream = accept(address)?;
    stream.set_read_timeout(Some(RUN_BOUND + CONNECT_TIMEOUT))?;
    let mut writer_side = stream.try_clone()?;
    let mut line = serde_json::to_string(&fabric.describe(&region))?;
    line.push('\n');
    writer_side.write_all(line.as_bytes())?;
    let mut done = String::new();
    BufReader::new(stream).read_line(&mut done)?;
    println!("client says: {}", done.trim_end());
    Ok(())
}

struct Samples(Vec<f64>);

impl Samples {
    fn time<T>(&mut self, operation: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let result = operation();
        self.0.push(started.elapsed().as_secs_f64() * 1e6);
        result
    }

    fn report(mut self, what: &str) -> f64 {
        self.0.sort_by(f64::total_cmp);
        let at = |quantile: f64| self.0[((self.0.len() - 1) as f64 * quantile).round() as usize];
        let median = at(0.5);
        println!(
            "{what}: min {:.2} us, median {median:.2} us, p99 {:.2} us over {} reads",
            at(0.0),
            at(0.99),
            self.0.len()
        );
        median
    }
}

fn client(address: &str, choice: FabricChoice, reads: usize) -> Result<()> {
    let started = Instant::now();
    let fabric = AnyFabric::open(choice)?;
    let stream = dial(address)?;
    stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    let mut done_side = stream.try_clone()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let descriptor: RegionDescriptor = serde_json::from_str(line.trim_end())?;
    let medium = fabric.medium_for(&descriptor)?;
    let remote = fabric.map(&descriptor)?;
    println!("mapped {} over {} ({} B slots, all bytes of each read)", descriptor.name, medium.as_str(), SLOT_BYTES);
    let mut buffer = vec![0u8; SLOT_BYTES];
    let keys: Vec<Vec<u8>> = (0..SLOTS).map(key_of).collect();
    let bound = |done: usize| -> Result<()> {
        if started.elapsed() > RUN_BOUND {
            return Err(format!("stopped after {done} reads: over {RUN_BOUND:?}").into());
        }
        Ok(())
    };

    // Warm up (the queue pair is set up at the first operation).
    for (slot, key) in keys.iter().enumerate().take(reads) {
        read_slot(&fabric, &remote, slot * SLOT_BYTES, SLOT_BYTES, key, &mut buffer)?;
    }

    // The lease word, read until it settles (it says no lease is needed for the region's life).
    let lease = fabric.read_word(&remote, LEASE_OFFSET, LoadOrdering::Acquire)?;
    if lease != u64::MAX {
        return Err(format!("the lease word says {lease:#x}, not 'no lease needed'").into());
    }
    // The GET* slot read, as the one-sided transport does it on this medium once the word
    // settled. Reads that are round trips (verbs): the whole slot in one batch (one doorbell,
    // one round trip), the image checked by verify_image (read_slot only if it was torn).
    // Shared memory: read_slot (seq, header, rest, seq).
    let batched = fabric.reads_are_round_trips(&remote);
    let mut lease_word = [0u8; 8];
    let mut whole = Samples(Vec::new());
    let mut torn = 0u32;
    for read in 0..reads {
        bound(read)?;
        let slot = read % SLOTS;
        let started = Instant::now();
        let value_ok = if batched {
            let mut batch = [(slot * SLOT_BYTES, &mut buffer[..])];
            fabric.read_many(&remote, &mut batch)?;
            match verify_image(&buffer, &keys[slot]) {
                Ok(view) => view.value() == value_of(slot).as_slice(),
                Err(SlotReadError::Torn { .. }) => {
                    torn += 1;
                    let view = read_slot(&fabric, &remote, slot * SLOT_BYTES, SLOT_BYTES, &keys[slot], &mut buffer)?;
                    view.value() == value_of(slot).as_slice()
                }
                Err(error) => return Err(error.into()),
            }
        } else {
            let view = read_slot(&fabric, &remote, slot * SLOT_BYTES, SLOT_BYTES, &keys[slot], &mut buffer)?;
            view.value() == value_of(slot).as_slice() && view.attempts() == 1
        };
        whole.0.push(started.elapsed().as_secs_f64() * 1e6);
        if !value_ok {
            return Err(format!("slot {slot}: wrong value, or torn").into());
        }
    }
    if torn > 0 {
        return Err(format!("{torn} of {reads} batched images torn: no writer runs, none should be").into());
    }
    let getstar = whole.report(if batched {
        "GET* slot read (lease word settled; the whole slot in one batch: one doorbell, one round trip; verified)"
    } else {
        "GET* slot read (lease word settled; read_slot: seq, header, rest, seq; verified)"
    });

    // Where the time goes: read_slot alone, then each fabric operation on its own.
    let parts = reads.min(500);
    let mut slot_only = Samples(Vec::new());
    for read in 0..parts {
        bound(read)?;
        let slot = read % SLOTS;
        slot_only.time(|| read_slot(&fabric, &remote, slot * SLOT_BYTES, SLOT_BYTES, &keys[slot], &mut buffer))?;
    }
    slot_only.report(if batched {
        "  part: read_slot alone (one whole-slot READ; verified)"
    } else {
        "  part: read_slot alone (seq, header, rest, seq; verified)"
    });
    let (mut word, mut header, mut rest, mut full, mut pair, mut sequential) = (
        Samples(Vec::new()),
        Samples(Vec::new()),
        Samples(Vec::new()),
        Samples(Vec::new()),
        Samples(Vec::new()),
        Samples(Vec::new()),
    );
    for read in 0..parts {
        bound(read)?;
        let slot = read % SLOTS;
        let offset = slot * SLOT_BYTES;
        word.time(|| fabric.read_word(&remote, offset, LoadOrdering::Acquire))?;
        full.time(|| fabric.read(&remote, offset, &mut buffer))?;
        if batched {
            let mut batch = [(LEASE_OFFSET, &mut lease_word[..]), (offset, &mut buffer[..])];
            pair.time(|| fabric.read_many(&remote, &mut batch))?;
            sequential.time(|| {
                fabric.read_word(&remote, LEASE_OFFSET, LoadOrdering::Acquire)?;
                read_slot(&fabric, &remote, offset, SLOT_BYTES, &keys[slot], &mut buffer).map(|view| view.seq())
            })?;
        } else {
            header.time(|| fabric.read(&remote, offset, &mut buffer[..SLOT_HEADER_BYTES]))?;
            rest.time(|| fabric.read(&remote, offset + SLOT_HEADER_BYTES, &mut buffer[SLOT_HEADER_BYTES..]))?;
        }
    }
    if batched {
        word.report("  part: one word read (one READ: what the lease word cost before it joined the batch)");
        pair.report(&format!(
            "  part: one batch of two READs (8 B lease word + {SLOT_BYTES} B slot: GET* before the word settles; no verification)"
        ));
        sequential.report("  before batching: lease word READ, then read_slot (two dependent round trips; verified)");
    } else {
        word.report("  part: one word read (lease, seq before, seq after: 3 of these)");
        header.report("  part: one 48 B header read");
        rest.report(&format!("  part: one {} B body read", SLOT_BYTES - SLOT_HEADER_BYTES));
    }
    let one_read = full.report(&format!("  reference: one whole {SLOT_BYTES} B fabric read (no seq, no verification)"));

    // The verification alone: the same read_slot over an in-process memory fabric.
    let memory = MemoryFabric::new();
    let local = memory.register("verify", SLOT_BYTES, Access::ReadOnly)?;
    let mut writer = SlotWriter::new(SLOT_BYTES);
    writer.publish(
        &local,
        0,
        SLOT_BYTES,
        &keys[0],
        1,
        0,
        &[7u8; METADATA_BYTES],
        &value_of(0),
        rampkv_fabric::slot::SLOT_FLAG_VALID,
    )?;
    let mapped = memory.map(&memory.describe(&local))?;
    let mut verify = Samples(Vec::new());
    for _ in 0..reads {
        verify.time(|| read_slot(&memory, &mapped, 0, SLOT_BYTES, &keys[0], &mut buffer).map(|view| view.seq()))?;
    }
    verify.report("  part: read_slot over local memory (copy + verification, no network)");
    println!("summary: GET* slot read median {getstar:.2} us; one {SLOT_BYTES} B fabric read median {one_read:.2} us");
    done_side.write_all(b"done\n")?;
    Ok(())
}

fn parse_choice(text: &str) -> Result<FabricChoice> {
    Ok(text.parse()?)
}

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    let mut choice = Ok(FabricChoice::Verbs);
    let mut reads = Ok(READS_DEFAULT);
    let mut rest = Vec::new();
    let mut index = 0;
    while index < arguments.len() {
        match (arguments[index], arguments.get(index + 1)) {
            ("--fabric", Some(value)) => {
                choice = parse_choice(value);
                index += 1;
            }
            ("--reads", Some(value)) => {
                reads = value.parse::<usize>().map_err(|_| "--reads takes a number".into()).and_then(|reads| {
                    if (1..=1_000_000).contains(&reads) {
                        Ok(reads)
                    } else {
                        Err("--reads must be 1..=1000000".into())
                    }
                });
                index += 1;
            }
            (argument, _) => rest.push(argument),
        }
        index += 1;
    }
    let result = match (choice, reads, rest.as_slice()) {
        (Err(error), _, _) | (_, Err(error), _) => Err(error),
        (Ok(choice), _, ["server", address]) => server(address, choice),
        (Ok(choice), Ok(reads), ["client", address]) => client(address, choice, reads),
        _ => {
            eprintln!("usage: slot_read_lat server|client ADDR [--fabric verbs|auto|shm] [--reads N]");
            std::process::exit(2);
        }
    };
    if let Err(error) = result {
        println!("slot_read_lat: error: {error}");
        std::process::exit(1);
    }
}
