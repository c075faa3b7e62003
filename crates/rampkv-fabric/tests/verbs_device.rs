//! The verbs core on a real RDMA device: two queue pairs of one process connected to each other
//! through the device (rxe's loopback in the lab, `scripts/rdma-lab.sh test`).
//!
//! Every test needs a device, so all are `#[ignore]`d: `cargo test` on a machine without one
//! skips them, and the lab runs them with `--ignored` inside a QEMU guest with Soft-RoCE.

use rampkv_fabric::verbs::{
    self, CompletionKind, Context, DeviceSelection, GidKind, MemoryRegion, ProtectionDomain, QueuePair,
    QueuePairOptions, ReceiveBuffer, RegionAccess, VerbsError, WorkQueue, WorkStatus,
};
use rampkv_fabric::words::{LoadOrdering, StoreOrdering};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);
fn all_rights() -> RegionAccess {
    RegionAccess::LOCAL_WRITE | RegionAccess::REMOTE_READ | RegionAccess::REMOTE_WRITE | RegionAccess::REMOTE_ATOMIC
}

/// Two queue pairs on one device, connected to each other.
fn connected_pair(options: &QueuePairOptions) -> (ProtectionDomain, QueuePair, QueuePair) {
    let context = Context::open(&DeviceSelection::default()).expect("an RDMA device with an active port");
    let pd = ProtectionDomain::new(&context).expect("protection domain");
    let mut first = QueuePair::new(&pd, options).expect("queue pair");
    let mut second = QueuePair::new(&pd, options).expect("queue pair");
    let (first_endpoint, second_endpoint) = (first.endpoint(), second.endpoint());
    first.connect(&second_endpoint).expect("connect first");
    second.connect(&first_endpoint).expect("connect second");
    (pd, first, second)
}

fn word_at(region: &MemoryRegion, offset: u64) -> u64 {
    region.load_word(offset, LoadOrdering::Acquire).expect("word in range")
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn the_device_is_found_with_an_active_port_and_a_roce_v2_gid() {
    let port = verbs::probe().expect("probe");
    eprintln!("probe: {port:?}");
    assert!(port.active_mtu_bytes >= 256);
    assert_eq!(port.gid_kind, GidKind::RoceV2, "rxe lists RoCE v2 GIDs only");
    let devices = verbs::devices().expect("devices");
    assert!(devices.iter().any(|device| device.name == port.device));
    let wrong = Context::open(&DeviceSelection { device: Some("no-such-device".into()), ..DeviceSelection::default() });
    assert!(matches!(wrong, Err(VerbsError::DeviceNotFound { .. })), "{wrong:?}");
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn read_write_compare_and_swap_and_fetch_and_add() {
    let (pd, mut client, _server) = connected_pair(&QueuePairOptions::default());
    let remote_region = MemoryRegion::register(&pd, 1 << 16, all_rights()).expect("remote region");
    let local = MemoryRegion::register(&pd, 1 << 16, RegionAccess::LOCAL_WRITE).expect("local region");
    for word in 0..512u64 {
        remote_region.store_word(word * 8, 0xa5a5_0000_0000_0000 | word, StoreOrdering::Relaxed).expect("fill");
    }
    remote_region.store_word(16_384, 7, StoreOrdering::Relaxed).expect("cas word");
    remote_region.store_word(16_392, 100, StoreOrdering::Relaxed).expect("faa word");
    let remote = remote_region.remote();

    let mut batch = client.batch().expect("batch");
    batch.read(&local, 0, &remote, 0, 4096).expect("read");
    let range = batch.post().expect("post");
    client.wait_send_through(range.last().expect("one"), WAIT).expect("read completes");
    for word in 0..512u64 {
        assert_eq!(word_at(&local, word * 8), 0xa5a5_0000_0000_0000 | word, "word {word} read");
    }

    for word in 0..128u64 {
        local.store_word(8192 + word * 8, 0x5a5a_0000_0000_0000 | word, StoreOrdering::Relaxed).expect("fill");
    }
    let mut batch = client.batch().expect("batch");
    batch.write(&local, 8192, &remote, 8192, 1024, None).expect("write");
    batch.compare_and_swap(&local, 24_576, &remote, 16_384, 7, 9).expect("cas");
    batch.fetch_and_add(&local, 24_584, &remote, 16_392, 5).expect("faa");
    batch.compare_and_swap(&local, 24_592, &remote, 16_384, 7, 11).expect("cas that must fail");
    let range = batch.post().expect("post");
    assert_eq!(range.len(), 4);
    client.wait_send_through(range.last().expect("four"), WAIT).expect("batch completes");
    for word in 0..128u64 {
        assert_eq!(word_at(&remote_region, 8192 + word * 8), 0x5a5a_0000_0000_0000 | word, "word {word} written");
    }
    assert_eq!(word_at(&local, 24_576), 7, "first CAS saw 7 and swapped");
    assert_eq!(word_at(&local, 24_584), 100, "FAA returns the old value");
    assert_eq!(word_at(&local, 24_592), 9, "second CAS saw 9 and did not swap");
    assert_eq!(word_at(&remote_region, 16_384), 9);
    assert_eq!(word_at(&remote_region, 16_392), 105);

    // Misuse is refused before anything is posted.
    let mut batch = client.batch().expect("batch");
    assert!(matches!(batch.fetch_and_add(&local, 4, &remote, 16_392, 1), Err(VerbsError::Misaligned { .. })));
    assert!(matches!(batch.compare_and_swap(&local, 0, &remote, 16_388, 0, 1), Err(VerbsError::Misaligned { .. })));
    assert!(matches!(batch.read(&local, 0, &remote, (1 << 16) - 8, 16), Err(VerbsError::OutOfBounds { .. })));
    let read_only = MemoryRegion::register(&pd, 4096, RegionAccess::NONE).expect("region without LOCAL_WRITE");
    assert!(matches!(batch.read(&read_only, 0, &remote, 0, 8), Err(VerbsError::AccessDenied { .. })));
    assert!(batch.is_empty());
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn send_and_write_with_immediate_consume_posted_receives() {
    let (pd, mut sender, mut receiver) = connected_pair(&QueuePairOptions::default());
    let inbox = MemoryRegion::register(&pd, 8192, all_rights()).expect("inbox");
    let outbox = MemoryRegion::register(&pd, 8192, RegionAccess::NONE).expect("outbox");
    let buffers =
        [ReceiveBuffer { offset_bytes: 0, len_bytes: 4096 }, ReceiveBuffer { offset_bytes: 4096, len_bytes: 4096 }];
    let posted = receiver.post_receives(&inbox, &buffers).expect("post receives");
    assert_eq!((posted.len(), receiver.receive_outstanding()), (2, 2));
    outbox.write(0, b"hello over SEND!").expect("message");
    outbox.write(64, &0x1122_3344_5566_7788u64.to_le_bytes()).expect("payload");
    let mut batch = sender.batch().expect("batch");
    batch.send(&outbox, 0, 16, Some(0xb0b)).expect("send");
    // A WRITE with immediate lands in the region like a WRITE and raises a receive completion.
    batch.write(&outbox, 64, &inbox.remote(), 6000, 8, Some(42)).expect("write with immediate");
    let range = batch.post().expect("post");
    sender.wait_send_through(range.last().expect("two"), WAIT).expect("sends complete");

    let mut completions = [verbs::Completion::default(); 4];
    let mut received = Vec::new();
    let deadline = Instant::now() + WAIT;
    while received.len() < 2 && Instant::now() < deadline {
        received.extend_from_slice(receiver.wait_receive(&mut completions, WAIT).expect("receive"));
    }
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!((received[0].queue(), received[0].kind()), (WorkQueue::Receive, CompletionKind::Receive));
    assert_eq!((received[0].byte_len(), received[0].immediate()), (16, Some(0xb0b)));
    let mut message = [0u8; 16];
    inbox.read(0, &mut message).expect("read inbox");
    assert_eq!(&message, b"hello over SEND!");
    assert_eq!(received[1].kind(), CompletionKind::ReceiveWriteWithImmediate);
    assert_eq!(received[1].immediate(), Some(42));
    assert_eq!(word_at(&inbox, 6000), 0x1122_3344_5566_7788);
    assert_eq!(receiver.receive_outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_batch_of_reads_is_one_post_with_selective_signalling() {
    let options = QueuePairOptions { signal_interval: 16, ..QueuePairOptions::default() };
    let (pd, mut client, _server) = connected_pair(&options);
    let remote_region = MemoryRegion::register(&pd, 1 << 16, all_rights()).expect("remote region");
    let local = MemoryRegion::register(&pd, 1 << 16, RegionAccess::LOCAL_WRITE).expect("local region");
    for item in 0..64u64 {
        remote_region.store_word(item * 1024, 1_000 + item, StoreOrdering::Relaxed).expect("fill");
    }
    let remote = remote_region.remote();
    let mut batch = client.batch().expect("batch");
    for item in 0..32u64 {
        batch.read(&local, item * 8, &remote, item * 2048, 8).expect("read");
    }
    let range = batch.post().expect("one post");
    assert_eq!(range.len(), 32);
    // Signalled: the 16th (interval) and the 32nd (last of the batch): two completions.
    let mut completions = [verbs::Completion::default(); 8];
    let mut seen = Vec::new();
    while client.send_outstanding() > 0 {
        seen.extend(client.wait_send(&mut completions, WAIT).expect("completions").iter().map(|c| c.sequence()));
    }
    assert_eq!(seen, vec![range.first + 15, range.first + 31]);
    for item in 0..32u64 {
        assert_eq!(word_at(&local, item * 8), 1_000 + item * 2, "item {item}");
    }
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_full_send_queue_is_an_error_value_not_a_wait() {
    let options = QueuePairOptions { send_depth: 4, signal_interval: 4, ..QueuePairOptions::default() };
    let (pd, mut client, _server) = connected_pair(&options);
    let region = MemoryRegion::register(&pd, 4096, all_rights()).expect("region");
    let remote = region.remote();
    let mut batch = client.batch().expect("batch");
    for item in 0..4 {
        batch.read(&region, item * 8, &remote, 2048, 8).expect("fits");
    }
    assert!(matches!(batch.read(&region, 64, &remote, 2048, 8), Err(VerbsError::QueueFull { depth: 4, .. })));
    let range = batch.post().expect("post");
    assert!(matches!(
        client.batch().expect("batch").read(&region, 64, &remote, 0, 8),
        Err(VerbsError::QueueFull { .. })
    ));
    client.wait_send_through(range.last().expect("four"), WAIT).expect("complete");
    assert_eq!(client.send_outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_1_kib_read_racing_a_writer_can_be_torn() {
    // The writer stores one generation number into all 128 words of a 1 KiB item, over and
    // over; a reader that sees two generations in one READ saw a torn item. This is what the
    // slot's seqlock and checksum exist for (docs/fabric.md).
    let (pd, mut client, _server) = connected_pair(&QueuePairOptions::default());
    let item = MemoryRegion::register(&pd, 1024, all_rights()).expect("item region");
    let local = MemoryRegion::register(&pd, 1024, RegionAccess::LOCAL_WRITE).expect("local");
    let remote = item.remote();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (item, stop) = (item.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut generation = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                generation += 1;
                for word in 0..128 {
                    item.store_word(word * 8, generation, StoreOrdering::Relaxed).expect("store");
                }
            }
            generation
        })
    };
    let (mut reads, mut torn) = (0u32, 0u32);
    let started = Instant::now();
    while torn < 20 && reads < 20_000 && started.elapsed() < Duration::from_secs(30) {
        let mut batch = client.batch().expect("batch");
        batch.read(&local, 0, &remote, 0, 1024).expect("read");
        let range = batch.post().expect("post");
        client.wait_send_through(range.last().expect("one"), WAIT).expect("read completes");
        reads += 1;
        let first = word_at(&local, 0);
        if (1..128).any(|word| word_at(&local, word * 8) != first) {
            torn += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let generations = writer.join().expect("writer");
    eprintln!(
        "torn reads: {torn} of {reads} 1 KiB READs against {generations} writer passes in {:?}",
        started.elapsed()
    );
    assert!(torn > 0, "no torn read in {reads} READs racing the writer");
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn the_completion_channel_wakes_a_sleeping_waiter() {
    let (pd, mut sender, mut receiver) = connected_pair(&QueuePairOptions::default());
    let inbox = MemoryRegion::register(&pd, 4096, all_rights()).expect("inbox");
    let outbox = MemoryRegion::register(&pd, 4096, RegionAccess::NONE).expect("outbox");
    receiver.post_receives(&inbox, &[ReceiveBuffer { offset_bytes: 0, len_bytes: 4096 }]).expect("post");
    assert!(receiver.event_fd().is_some());
    let delay = Duration::from_millis(500);
    let sending = std::thread::spawn(move || {
        std::thread::sleep(delay);
        let mut batch = sender.batch().expect("batch");
        batch.send(&outbox, 0, 8, None).expect("send");
        let range = batch.post().expect("post");
        sender.wait_send_through(range.last().expect("one"), WAIT).expect("sent");
    });
    let started = Instant::now();
    let mut completions = [verbs::Completion::default(); 2];
    let received = receiver.wait_receive(&mut completions, WAIT).expect("woken by the message").len();
    let waited = started.elapsed();
    sending.join().expect("sender");
    eprintln!("woken after {waited:?}, {} channel wakeups", receiver.event_wakeups());
    assert_eq!(received, 1);
    assert!(waited >= delay / 2 && waited < WAIT / 2, "{waited:?}");
    assert!(receiver.event_wakeups() >= 1, "the wait should have slept on the channel and been woken");
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_wait_without_completion_ends_at_its_bound() {
    let (pd, _sender, mut receiver) = connected_pair(&QueuePairOptions::default());
    let inbox = MemoryRegion::register(&pd, 4096, all_rights()).expect("inbox");
    receiver.post_receives(&inbox, &[ReceiveBuffer { offset_bytes: 0, len_bytes: 4096 }]).expect("post");
    let started = Instant::now();
    let mut completions = [verbs::Completion::default(); 2];
    let result = receiver.wait_receive(&mut completions, Duration::from_millis(300)).map(<[_]>::len);
    assert!(matches!(result, Err(VerbsError::Timeout { .. })), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_wrong_rkey_fails_with_a_typed_error_and_the_queue_pair_refuses_more() {
    let (pd, mut client, _server) = connected_pair(&QueuePairOptions::default());
    let region = MemoryRegion::register(&pd, 4096, all_rights()).expect("region");
    let mut forged = region.remote();
    forged.rkey ^= 0x00ff_0000;
    let mut batch = client.batch().expect("batch");
    batch.read(&region, 0, &forged, 0, 8).expect("staged");
    let range = batch.post().expect("post");
    let result = client.wait_send_through(range.last().expect("one"), WAIT);
    eprintln!("wrong rkey: {result:?}");
    match result {
        Err(VerbsError::CompletionFailed { status, queue: WorkQueue::Send, .. }) => {
            assert!(matches!(status, WorkStatus::RemoteAccess | WorkStatus::RemoteInvalidRequest), "{status}")
        }
        other => panic!("expected a failed completion, got {other:?}"),
    }
    assert!(matches!(client.batch(), Err(VerbsError::QueuePairFailed { .. })));
    assert_eq!(client.query_state().expect("query"), verbs::QueuePairState::Error);
}

#[test]
#[ignore = "needs an RDMA device (scripts/rdma-lab.sh test)"]
fn a_vanished_peer_gives_retry_exceeded_within_a_bound() {
    let (pd, mut client, server) = connected_pair(&QueuePairOptions::default());
    let region = MemoryRegion::register(&pd, 4096, all_rights()).expect("region");
    let remote = region.remote();
    drop(server); // the peer's queue pair is gone: its packets now go nowhere
    let started = Instant::now();
    let mut batch = client.batch().expect("batch");
    batch.read(&region, 0, &remote, 2048, 8).expect("staged");
    let range = batch.post().expect("post");
    let result = client.wait_send_through(range.last().expect("one"), Duration::from_secs(60));
    let waited = started.elapsed();
    eprintln!("vanished peer: {result:?} after {waited:?}");
    assert!(
        matches!(result, Err(VerbsError::CompletionFailed { status: WorkStatus::RetryExceeded, .. })),
        "{result:?}"
    );
    assert!(waited < Duration::from_secs(30), "{waited:?}");
}
