//! Two hosts, the product's fabric ([`AnyFabric`], choice `auto`): the owner's regions reached
//! over RDMA from another host, every operation checked, a GET\*-style slot read timed.
//!
//! ```text
//! verbs_fabric_pair owner             register a read-write region and a slot region (its slot
//!                                     rewritten without pause), print both descriptors as
//!                                     `descriptor JSON` lines, sleep on word 0 until woken; exit 0
//!                                     if the client's writes are all there
//! verbs_fabric_pair client JSON JSON  map both (auto must choose verbs: another host), run every
//!                                     operation, time reads and slot reads, check that a shm-only fabric
//!                                     refuses with NoMedium, then ring the owner's doorbell
//! ```
//!
//! `scripts/rdma-lab.sh test` runs it between two QEMU guests with Soft-RoCE.

use rampkv_fabric::slot::SLOT_FLAG_VALID;
use rampkv_fabric::{
    read_slot, slot_bytes, Access, AnyFabric, Fabric, FabricChoice, FabricError, LoadOrdering, Medium, OneSided,
    RegionDescriptor, SlotReadError, SlotWriter, StoreOrdering, Words,
};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const REGION_BYTES: usize = 256 << 10;
const SLOT_KEY: &[u8] = b"pair-key";
const SLOT_VALUE_BYTES: usize = 1_000;
const SLOT_READS: usize = 500;
const LATENCY_SAMPLES: usize = 500;
const WAKE_WAIT: Duration = Duration::from_secs(120);

fn pattern(word: usize) -> u64 {
    0x5a5a_0000_0000_0000 | word as u64
}

fn capacity() -> usize {
    slot_bytes(SLOT_KEY.len(), 0, SLOT_VALUE_BYTES)
}

fn owner() -> Result<()> {
    let fabric = AnyFabric::open(FabricChoice::Auto)?;
    println!("{}", fabric.capabilities());
    let region = fabric.register("pair-owner", REGION_BYTES, Access::ReadWrite)?;
    for word in 1..REGION_BYTES / 8 {
        region.store(word, pattern(word), StoreOrdering::Relaxed);
    }
    region.store(3, 0, StoreOrdering::Relaxed); // the client's "start rewriting the slot"
    region.store(0, 0, StoreOrdering::Release);
    let region = std::sync::Arc::new(region);
    let slots = std::sync::Arc::new(fabric.register("pair-slots", 4096, Access::ReadOnly)?);
    let (writer_slots, start) = (std::sync::Arc::clone(&slots), std::sync::Arc::clone(&region));
    {
        let mut writer = SlotWriter::new(capacity());
        let value = vec![0u8; SLOT_VALUE_BYTES];
        writer.publish(&*slots, 0, capacity(), SLOT_KEY, 0, 0, &[], &value, SLOT_FLAG_VALID)?;
    }
    std::thread::spawn(move || {
        // Rewrite only once the client asks (word 3), so that its latency figures before that
        // time the fabric, not a busy owner.
        while start.load(3, LoadOrdering::Acquire) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut writer = SlotWriter::new(capacity());
        let mut value = vec![0u8; SLOT_VALUE_BYTES];
        for ts in 1u64.. {
            value[..8].copy_from_slice(&ts.to_le_bytes());
            value[8..].fill(ts as u8);
            if writer.publish(&*writer_slots, 0, capacity(), SLOT_KEY, ts, 0, &[], &value, SLOT_FLAG_VALID).is_err() {
                return;
            }
            // Bursts of rewrites with pauses: the owner's CPU also runs its side of Soft-RoCE,
            // which a writer that never sleeps would starve (the reads would time the writer).
            if ts % 64 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    println!("descriptor {}", serde_json::to_string(&fabric.describe(&region))?);
    println!("descriptor {}", serde_json::to_string(&fabric.describe(&slots))?);
    let started = Instant::now();
    region.wait_while_equal(0, 0, WAKE_WAIT);
    let (word0, word1, word2) = (
        region.load(0, LoadOrdering::Acquire),
        region.load(1, LoadOrdering::Acquire),
        region.load(2, LoadOrdering::Acquire),
    );
    println!("woken after {:?}: word0={word0} word1={word1} word2={word2}", started.elapsed());
    if (word0, word1, word2) != (1, 12, 4242) {
        return Err("the client's writes are not all there".into());
    }
    Ok(())
}

fn client(region_json: &str, slots_json: &str) -> Result<()> {
    let region: RegionDescriptor = serde_json::from_str(region_json)?;
    let slots: RegionDescriptor = serde_json::from_str(slots_json)?;
    // Without RDMA on this side, another host's region has no medium: a clear error.
    let shm_only = AnyFabric::open(FabricChoice::Shm)?;
    match shm_only.map(&region) {
        Err(error @ FabricError::NoMedium { .. }) => println!("shm-only fabric: {error}"),
        other => return Err(format!("a shm-only fabric mapped another host's region: {other:?}").into()),
    }
    let fabric = AnyFabric::open(FabricChoice::Auto)?;
    println!("{}", fabric.capabilities());
    let remote = fabric.map(&region)?;
    if fabric.medium_of(&remote) != Medium::Verbs {
        return Err("auto did not choose verbs for another host".into());
    }
    println!("medium for the owner's region: {}", fabric.medium_of(&remote));
    let mut buf = vec![0u8; 100_000];
    fabric.read(&remote, 4096, &mut buf)?;
    for (index, chunk) in buf.chunks(8).enumerate() {
        if chunk != &pattern(512 + index).to_le_bytes()[..chunk.len()] {
            return Err(format!("READ: word {index} differs").into());
        }
    }
    let message: Vec<u8> = (0..70_001u32).map(|i| (i % 251) as u8).collect();
    fabric.write(&remote, 8192, &message)?;
    fabric.read(&remote, 8192, &mut buf[..message.len()])?;
    if buf[..message.len()] != message[..] {
        return Err("WRITE then READ differs".into());
    }
    if fabric.compare_and_swap(&remote, 8, pattern(1), 7)? != pattern(1) || fabric.fetch_add(&remote, 8, 5)? != 7 {
        return Err("CAS/FAA returned the wrong previous value".into());
    }
    fabric.write_word(&remote, 16, 4242, StoreOrdering::Release)?;
    if fabric.read_word(&remote, 16, LoadOrdering::Acquire)? != 4242 {
        return Err("write_word then read_word differs".into());
    }
    println!("READ 100 kB, WRITE 70 kB, CAS, FAA, word write/read: ok");

    // One-sided read latency, one operation at a time (each waits for its completion).
    for size in [8usize, 1024] {
        let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
        for _ in 0..LATENCY_SAMPLES {
            let started = Instant::now();
            fabric.read(&remote, 4096, &mut buf[..size])?;
            samples.push(started.elapsed());
        }
        samples.sort();
        println!(
            "fabric READ {size} B latency: median {:.1} us, p99 {:.1} us ({LATENCY_SAMPLES} reads)",
            samples[samples.len() / 2].as_secs_f64() * 1e6,
            samples[samples.len() * 99 / 100].as_secs_f64() * 1e6
        );
    }

    // GET*-style slot reads against a writer that rewrites the slot in bursts.
    let slot_remote = fabric.map(&slots)?;
    let mut image = vec![0u8; capacity()];
    let mut quiet = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES {
        let started = Instant::now();
        read_slot(&fabric, &slot_remote, 0, capacity(), SLOT_KEY, &mut image)?;
        quiet.push(started.elapsed());
    }
    quiet.sort();
    println!(
        "slot read (1 KiB value, no writer) latency: median {:.1} us ({LATENCY_SAMPLES} reads)",
        quiet[quiet.len() / 2].as_secs_f64() * 1e6
    );
    fabric.write_word(&remote, 24, 1, StoreOrdering::Release)?; // start the owner's writer
    let (mut latencies, mut retried, mut torn) = (Vec::with_capacity(SLOT_READS), 0u32, 0u32);
    for _ in 0..SLOT_READS {
        let started = Instant::now();
        match read_slot(&fabric, &slot_remote, 0, capacity(), SLOT_KEY, &mut image) {
            Ok(view) => {
                latencies.push(started.elapsed());
                retried += u32::from(view.attempts() > 1);
                let ts = view.ts();
                let value = view.value();
                if value[..8] != ts.to_le_bytes() || value[8..].iter().any(|&byte| byte != ts as u8) {
                    return Err(format!("a torn slot was accepted (ts {ts})").into());
                }
            }
            Err(SlotReadError::Torn { .. }) => torn += 1,
            Err(other) => return Err(format!("slot read: {other}").into()),
        }
    }
    latencies.sort();
    let median = latencies.get(latencies.len() / 2).copied().unwrap_or_default();
    println!(
        "slot reads: {} accepted ({retried} after retries), {torn} torn in every attempt; median {:.1} us per verified 1 KiB slot read",
        latencies.len(),
        median.as_secs_f64() * 1e6
    );

    // Ring the doorbell: the word, then the wake.
    fabric.write_word(&remote, 0, 1, StoreOrdering::Release)?;
    fabric.wake(&remote, 0)?;
    println!("doorbell rung");
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("owner") => owner(),
        Some("client") if args.len() == 4 => client(&args[2], &args[3]),
        _ => Err("usage: verbs_fabric_pair owner | client REGION_JSON SLOTS_JSON".into()),
    };
    if let Err(error) = result {
        eprintln!("verbs_fabric_pair: {error}");
        std::process::exit(1);
    }
}
