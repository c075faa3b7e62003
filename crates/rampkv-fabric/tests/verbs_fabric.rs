//! The verbs fabric on a real RDMA device, between processes (rxe's loopback in one lab guest:
//! `scripts/rdma-lab.sh test`, or `up --one` and `a <this binary> --ignored`).
//!
//! A peer is this test binary run again with `RAMPKV_VERBS_PEER=<role>` as the test
//! `peer_process`; it registers its regions, prints their descriptors on lines starting with
//! `PEER `, plays its role and exits when its stdin closes (or after `PEER_LIFETIME`).
//! Every test needs a device, so all are `#[ignore]`d.

use rampkv_fabric::slot::SLOT_FLAG_VALID;
use rampkv_fabric::verbs_fabric::registry;
use rampkv_fabric::{
    read_slot, slot_bytes, Access, AnyFabric, Fabric, FabricChoice, FabricError, LoadOrdering, Medium, OneSided,
    RegionDescriptor, SlotReadError, SlotWriter, StoreOrdering, VerbsConfig, VerbsFabric, Words,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const PEER_LIFETIME: Duration = Duration::from_secs(180);
const LINE_WAIT: Duration = Duration::from_secs(60);
const REGION_BYTES: usize = 256 << 10;
const SLOT_KEY: &[u8] = b"torn-key";
const SLOT_VALUE_BYTES: usize = 1_000;

fn slot_capacity() -> usize {
    slot_bytes(SLOT_KEY.len(), 0, SLOT_VALUE_BYTES)
}

/// A peer process and the lines it prints.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Peer {
    fn spawn(role: &str) -> Peer {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .args(["--exact", "peer_process", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("RAMPKV_VERBS_PEER", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the peer");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // libtest may print "test peer_process ... " on the same line first.
                if let Some(at) = line.find("PEER ") {
                    if sender.send(line[at + 5..].to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        let stdin = child.stdin.take();
        Peer { child, stdin, lines }
    }

    fn line(&self) -> String {
        match self.lines.recv_timeout(LINE_WAIT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("the peer printed nothing within {LINE_WAIT:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the peer exited"),
        }
    }

    fn descriptor(&self) -> RegionDescriptor {
        let line = self.line();
        let json = line.strip_prefix("descriptor ").unwrap_or_else(|| panic!("expected a descriptor, got {line}"));
        serde_json::from_str(json).expect("a descriptor")
    }

    fn kill(&mut self) {
        // SIGKILL by the peer's own pid (Child::kill sends SIGKILL).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }
}

/// The peer's side: runs only when spawned by a test.
#[test]
#[ignore = "a peer process of the verbs fabric tests (RAMPKV_VERBS_PEER)"]
fn peer_process() {
    let Ok(role) = std::env::var("RAMPKV_VERBS_PEER") else { return };
    // Exit when the test closes our stdin, or at the latest after PEER_LIFETIME.
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        std::process::exit(0);
    });
    std::thread::spawn(|| {
        std::thread::sleep(PEER_LIFETIME);
        std::process::exit(3);
    });
    let fabric = VerbsFabric::open(&VerbsConfig::default()).expect("the peer's verbs fabric");
    let say = |text: String| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "PEER {text}").expect("stdout");
        out.flush().expect("flush");
    };
    match role.as_str() {
        "owner" => {
            let region = fabric.register("owner", REGION_BYTES, Access::ReadWrite).expect("register");
            for word in 0..REGION_BYTES / 8 {
                region.store(word, 0x5a5a_0000_0000_0000 | word as u64, StoreOrdering::Relaxed);
            }
            region.store(0, 0, StoreOrdering::Release);
            say(format!("descriptor {}", serde_json::to_string(&fabric.describe(&region)).expect("json")));
            // Sleep on word 0 until woken: writing it does not wake a futex, only a wake does.
            let started = Instant::now();
            region.wait_while_equal(0, 0, Duration::from_secs(120));
            say(format!(
                "woken after {} ms: word0={} word1={} word2={}",
                started.elapsed().as_millis(),
                region.load(0, LoadOrdering::Acquire),
                region.load(1, LoadOrdering::Acquire),
                region.load(2, LoadOrdering::Acquire)
            ));
        }
        "slots" => {
            let region = fabric.register("slots", 4096, Access::ReadOnly).expect("register");
            let mut writer = SlotWriter::new(slot_capacity());
            let mut value = vec![0u8; SLOT_VALUE_BYTES];
            let mut publish = |ts: u64| {
                value[..8].copy_from_slice(&ts.to_le_bytes());
                value[8..].fill(ts as u8);
                writer
                    .publish(&region, 0, slot_capacity(), SLOT_KEY, ts, 0, &[], &value, SLOT_FLAG_VALID)
                    .expect("publish");
            };
            publish(1);
            say(format!("descriptor {}", serde_json::to_string(&fabric.describe(&region)).expect("json")));
            let mut ts = 1u64;
            loop {
                ts += 1;
                publish(ts);
            }
        }
        other => panic!("unknown peer role {other}"),
    }
    // Stay alive (the test holds our regions) until stdin closes.
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_peer_processs_region_is_read_written_and_woken_over_rdma() {
    let peer = Peer::spawn("owner");
    let descriptor = peer.descriptor();
    eprintln!("peer descriptor: {descriptor:?}");
    assert!(descriptor.host.is_some() && descriptor.verbs.is_some());

    // auto: the same host is shared memory.
    let auto = AnyFabric::open(FabricChoice::Auto).expect("auto");
    assert!(auto.capabilities().verbs.is_ok(), "{}", auto.capabilities());
    assert_eq!(auto.medium_for(&descriptor).expect("medium"), Medium::Shm);

    // verbs, forced: RDMA even on one host.
    let fabric = AnyFabric::open(FabricChoice::Verbs).expect("verbs");
    eprintln!("{}", fabric.capabilities());
    let remote = fabric.map(&descriptor).expect("map over RDMA");
    assert_eq!(fabric.medium_of(&remote), Medium::Verbs);
    assert_eq!(fabric.remote_len_bytes(&remote), REGION_BYTES);

    // Reads: one word, a large range (more than one bounce buffer), and an odd length.
    assert_eq!(fabric.read_word(&remote, 8 * 9, LoadOrdering::Acquire).expect("read word"), 0x5a5a_0000_0000_0009);
    let mut big = vec![0u8; 100_000];
    fabric.read(&remote, 4096, &mut big).expect("read 100 kB");
    for (index, chunk) in big.chunks(8).enumerate() {
        let word = 0x5a5a_0000_0000_0000u64 | (512 + index) as u64;
        assert_eq!(chunk, &word.to_le_bytes()[..chunk.len()], "word {index}");
    }
    // Batched reads (one doorbell): a word, a slot-sized range and an odd length, each where
    // it was asked; ranges over one bounce buffer in all are read one by one; a bad range fails
    // before anything is posted.
    let pattern = |offset: usize| 0x5a5a_0000_0000_0000u64 | (offset / 8) as u64;
    let (mut word, mut range, mut odd) = ([0u8; 8], vec![0u8; 1280], [0u8; 13]);
    let mut reads = [(8 * 9, &mut word[..]), (4096, &mut range[..]), (8 * 3, &mut odd[..])];
    fabric.read_many(&remote, &mut reads).expect("read_many");
    assert_eq!(u64::from_le_bytes(word), pattern(8 * 9));
    for (index, chunk) in range.chunks(8).enumerate() {
        assert_eq!(chunk, &pattern(4096 + 8 * index).to_le_bytes()[..], "batched word {index}");
    }
    assert_eq!(&odd[..8], &pattern(24).to_le_bytes()[..]);
    assert_eq!(&odd[8..], &pattern(32).to_le_bytes()[..5]);
    let mut over = vec![0u8; 70_000];
    let mut reads = [(8 * 9, &mut word[..]), (8, &mut over[..])];
    fabric.read_many(&remote, &mut reads).expect("read_many over the bounce buffer");
    assert_eq!(&over[..8], &pattern(8).to_le_bytes()[..]);
    assert_eq!(&over[69_992..], &pattern(8 + 69_992).to_le_bytes()[..]);
    let mut reads = [(8, &mut word[..]), (3, &mut odd[..])];
    assert!(matches!(fabric.read_many(&remote, &mut reads), Err(FabricError::Misaligned { .. })));
    let mut reads = [(8, &mut word[..]), (REGION_BYTES - 8, &mut range[..])];
    assert!(matches!(fabric.read_many(&remote, &mut reads), Err(FabricError::OutOfBounds { .. })));
    // Writes, read back.
    let message: Vec<u8> = (0..70_001u32).map(|i| (i % 251) as u8).collect();
    fabric.write(&remote, 8192, &message).expect("write 70 kB");
    let mut back = vec![0u8; message.len()];
    fabric.read(&remote, 8192, &mut back).expect("read back");
    assert_eq!(back, message);
    // Atomics.
    assert_eq!(fabric.compare_and_swap(&remote, 8, 0x5a5a_0000_0000_0001, 7).expect("cas"), 0x5a5a_0000_0000_0001);
    assert_eq!(fabric.compare_and_swap(&remote, 8, 0, 9).expect("cas fails"), 7);
    assert_eq!(fabric.fetch_add(&remote, 8, 5).expect("faa"), 7);
    fabric.write_word(&remote, 16, 4242, StoreOrdering::Release).expect("write word");
    assert_eq!(fabric.read_word(&remote, 16, LoadOrdering::Acquire).expect("read word"), 4242);
    // Checked before posting, like the shm fabric.
    assert!(matches!(fabric.read(&remote, 3, &mut back[..8]), Err(FabricError::Misaligned { .. })));
    assert!(matches!(fabric.read(&remote, REGION_BYTES - 8, &mut back[..16]), Err(FabricError::OutOfBounds { .. })));
    assert!(matches!(fabric.fetch_add(&remote, REGION_BYTES, 1), Err(FabricError::OutOfBounds { .. })));

    // The doorbell: store the word, then wake the owner sleeping on it.
    fabric.write_word(&remote, 0, 1, StoreOrdering::Release).expect("doorbell word");
    let woken_at = Instant::now();
    fabric.wake(&remote, 0).expect("wake");
    let line = peer.line();
    eprintln!("owner: {line} ({:?} after the wake)", woken_at.elapsed());
    assert!(line.starts_with("woken"), "{line}");
    assert!(line.contains("word0=1 word1=12 word2=4242"), "the owner sees every write: {line}");
    assert!(woken_at.elapsed() < Duration::from_secs(30), "the wake, not the owner's 120 s bound, woke it");
    assert_eq!(fabric.verbs().expect("verbs").links(), 1, "one queue pair to the peer");
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn wakes_are_relayed_to_futex_waiters_and_unknown_ones_are_ignored_and_counted() {
    let fabric = VerbsFabric::open(&VerbsConfig::default()).expect("verbs");
    let region = std::sync::Arc::new(fabric.register("wakes", 64, Access::ReadWrite).expect("register"));
    let descriptor = fabric.describe(&region);
    // This process maps its own region: the link goes through its own rendezvous.
    let remote = fabric.map(&descriptor).expect("map");
    let relayed = registry::relayed_wakes();
    let waiter = {
        let region = std::sync::Arc::clone(&region);
        std::thread::spawn(move || {
            let started = Instant::now();
            region.wait_while_equal(2, 0, Duration::from_secs(60));
            started.elapsed()
        })
    };
    std::thread::sleep(Duration::from_millis(500)); // let it sleep
    fabric.wake(&remote, 16).expect("wake");
    let slept = waiter.join().expect("waiter");
    eprintln!("waiter slept {slept:?}");
    assert!(slept < Duration::from_secs(30), "woken by the wake, not by its bound");
    assert!(registry::relayed_wakes() > relayed);

    // A forged descriptor naming no region of ours: the wake arrives and is ignored.
    let ignored = registry::ignored_wakes();
    let mut forged = descriptor.clone();
    forged.verbs.as_mut().expect("verbs info").addr += 1 << 30;
    let forged_remote = fabric.map(&forged).expect("map a forged address (nothing checks it locally)");
    fabric.wake(&forged_remote, 0).expect("the SEND itself succeeds");
    let deadline = Instant::now() + Duration::from_secs(20);
    while registry::ignored_wakes() == ignored && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(registry::ignored_wakes() > ignored, "the unknown region's wake is counted");
    // A READ at the forged address is refused by the device: a typed error, never a panic.
    let error = fabric.read_word(&forged_remote, 0, LoadOrdering::Acquire).expect_err("no such registration");
    assert!(matches!(error, FabricError::PeerFailed { .. }), "{error}");
    eprintln!("forged read: {error}");
    // The failed link left the set: a new map connects afresh, to the same rendezvous.
    let again = fabric.map(&descriptor).expect("map again");
    fabric.write_word(&again, 8, 99, StoreOrdering::Release).expect("write over the new link");
    assert_eq!(region.load(1, LoadOrdering::Acquire), 99);
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn torn_reads_of_a_slot_rewritten_by_its_owner_are_caught_by_the_slot() {
    let peer = Peer::spawn("slots");
    let descriptor = peer.descriptor();
    let fabric = VerbsFabric::open(&VerbsConfig::default()).expect("verbs");
    let remote = fabric.map(&descriptor).expect("map");
    let mut buf = vec![0u8; slot_capacity()];
    let (mut accepted, mut retried, mut torn, mut reads) = (0u32, 0u32, 0u32, 0u32);
    let started = Instant::now();
    let mut last_ts = 0;
    while reads < 3_000 && started.elapsed() < Duration::from_secs(60) && (retried + torn < 20 || reads < 200) {
        reads += 1;
        match read_slot(&fabric, &remote, 0, slot_capacity(), SLOT_KEY, &mut buf) {
            Ok(view) => {
                accepted += 1;
                if view.attempts() > 1 {
                    retried += 1;
                }
                // Every accepted version is whole: its value was written for its timestamp.
                let ts = view.ts();
                let value = view.value();
                assert_eq!(value.len(), SLOT_VALUE_BYTES);
                assert_eq!(&value[..8], &ts.to_le_bytes(), "value of another version");
                assert!(value[8..].iter().all(|&byte| byte == ts as u8), "a torn value was accepted (ts {ts})");
                assert!(ts >= last_ts, "versions went back: {ts} after {last_ts}");
                last_ts = ts;
            }
            Err(SlotReadError::Torn { .. }) => torn += 1,
            Err(other) => panic!("unexpected slot read error: {other}"),
        }
    }
    eprintln!(
        "{reads} slot reads over RDMA in {:?}: {accepted} accepted ({retried} after retries), {torn} torn in every attempt; last ts {last_ts}",
        started.elapsed()
    );
    assert!(accepted > 0, "no read accepted");
    assert!(retried + torn > 0, "no read raced a rewrite: the test proved nothing");
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_peer_killed_mid_transfer_fails_within_a_bound_and_a_new_peer_connects() {
    let mut peer = Peer::spawn("owner");
    let descriptor = peer.descriptor();
    let fabric = VerbsFabric::open(&VerbsConfig::default()).expect("verbs");
    let remote = fabric.map(&descriptor).expect("map");
    let pid = peer.child.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        // Our own child, by its pid; still unreaped (the main thread reaps it later), so the
        // pid cannot name another process.
        let status = Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill");
        assert!(status.success());
        Instant::now()
    });
    let mut buf = vec![0u8; 64 << 10];
    let mut transfers = 0u32;
    let started = Instant::now();
    let error = loop {
        match rampkv_fabric::OneSided::read(&fabric, &remote, 0, &mut buf) {
            Ok(()) => transfers += 1,
            Err(error) => break error,
        }
        assert!(started.elapsed() < Duration::from_secs(120), "reads kept succeeding after the kill");
    };
    let killed_at = killer.join().expect("killer");
    let detected = killed_at.elapsed();
    eprintln!("{transfers} reads of 64 KiB, then {detected:?} after the kill: {error}");
    assert!(
        matches!(&error, FabricError::PeerFailed { peer, .. } if peer == &descriptor.verbs.as_ref().unwrap().rendezvous)
    );
    assert!(detected < Duration::from_secs(30), "detected {detected:?} after the kill");
    // Every later operation fails at once with the same error.
    let at = Instant::now();
    let again = fabric.write_word(&remote, 0, 1, StoreOrdering::Release).expect_err("the link failed");
    assert!(matches!(again, FabricError::PeerFailed { .. }), "{again}");
    assert!(at.elapsed() < Duration::from_secs(1));
    peer.kill();
    assert_eq!(fabric.links(), 0, "the failed link left the set");

    // A new peer: a new link.
    let second = Peer::spawn("owner");
    let remote = fabric.map(&second.descriptor()).expect("map the new peer");
    assert_eq!(fabric.read_word(&remote, 8, LoadOrdering::Acquire).expect("read"), 0x5a5a_0000_0000_0001);
}
