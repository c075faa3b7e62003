//! Send/recv unit tests: exact layout, RNR, oversize, corrupt completions and receive entries
//! from a hostile peer, invalid layouts, the doorbell wait, and randomized single-threaded runs.

use super::*;
use crate::fabric::{Access, Fabric};
use crate::memory::{MemoryFabric, MemoryLocalRegion};
use proptest::prelude::*;
use std::sync::Arc;

// `impl OneSided for Arc<MemoryFabric>` lives in the ring tests.
type Sender = SendQueue<Arc<MemoryFabric>, Arc<MemoryLocalRegion>>;
type Receiver = ReceiveQueue<Arc<MemoryFabric>, Arc<MemoryLocalRegion>>;

const QUEUE_OFFSET_BYTES: u64 = 64;

fn addresses(depth: u64, buffer_bytes: u64) -> QueueAddresses {
    QueueAddresses {
        queue: QueueLayout { offset_bytes: QUEUE_OFFSET_BYTES, depth, buffer_bytes },
        receiver_doorbell_offset_bytes: 0,
        sender_doorbell_offset_bytes: 0,
    }
}

struct Pair {
    sender: Sender,
    receiver: Receiver,
    receiver_region: Arc<MemoryLocalRegion>,
}

fn queue_pair(depth: u64, buffer_bytes: u64) -> Pair {
    let fabric = Arc::new(MemoryFabric::new());
    let len_bytes = QUEUE_OFFSET_BYTES as usize + QueueLayout::len_bytes(depth as usize, buffer_bytes as usize);
    let receiver_region = Arc::new(fabric.register("rx", len_bytes, Access::ReadWrite).unwrap());
    let sender_region = Arc::new(fabric.register("tx", 64, Access::ReadWrite).unwrap());
    let addresses = addresses(depth, buffer_bytes);
    let receiver_remote = fabric.map(&fabric.describe(&receiver_region)).unwrap();
    let sender_remote = fabric.map(&fabric.describe(&sender_region)).unwrap();
    let receiver =
        ReceiveQueue::new(Arc::clone(&fabric), Arc::clone(&receiver_region), sender_remote, addresses).unwrap();
    let sender = SendQueue::new(fabric, receiver_remote, sender_region, addresses).unwrap();
    Pair { sender, receiver, receiver_region }
}

fn word(pair: &Pair, offset_bytes: usize) -> u64 {
    pair.receiver_region.load((QUEUE_OFFSET_BYTES as usize + offset_bytes) / WORD_BYTES, LoadOrdering::Relaxed)
}

fn store(pair: &Pair, offset_bytes: usize, value: u64) {
    pair.receiver_region.store((QUEUE_OFFSET_BYTES as usize + offset_bytes) / WORD_BYTES, value, StoreOrdering::Release)
}

/// Polls, copies and re-posts: the message, if any.
fn receive(receiver: &mut Receiver) -> Option<Vec<u8>> {
    let completion = receiver.poll().unwrap()?;
    let mut message = Vec::new();
    receiver.copy_message(&completion, &mut message);
    receiver.repost(completion).unwrap();
    Some(message)
}

#[test]
fn layout_is_exact_byte_by_byte() {
    // depth 2, 16-byte buffers: receive queue at +0 (2 words), completions at +16 (2 x 16),
    // buffers at +48 and +64.
    let mut pair = queue_pair(2, 16);
    assert_eq!(QueueLayout::len_bytes(2, 16), 80);
    // Set-up posted buffers 0 and 1 as posts 0 and 1.
    assert_eq!(word(&pair, 0), 1 << 63);
    assert_eq!(word(&pair, 8), (1 << 63) | (1 << 32) | 1);
    pair.sender.try_send(b"hello").unwrap();
    assert_eq!(word(&pair, 16), 1 << 63, "completion 0: tag 0, status 0, buffer 0");
    assert_eq!(word(&pair, 24), 5, "length word");
    assert_eq!(word(&pair, 48).to_le_bytes(), *b"hello\0\0\0");
    pair.sender.try_send(b"").unwrap();
    assert_eq!(word(&pair, 32), (1 << 63) | (1 << 32) | 1, "completion 1: tag 1, buffer 1");
    assert_eq!(word(&pair, 40), 0);
    let completion = pair.receiver.poll().unwrap().unwrap();
    assert_eq!((completion.buffer_id(), completion.len_bytes(), completion.sequence()), (0, 5, 0));
    assert_eq!(word(&pair, 16), 0, "the receiver zeroes a consumed completion header");
    // Re-posting buffer 0 is post 2: entry 0, tag 2.
    pair.receiver.repost(completion).unwrap();
    assert_eq!(word(&pair, 0), (1 << 63) | (2 << 32));
    assert_eq!(receive(&mut pair.receiver).as_deref(), Some(&b""[..]));
    assert_eq!(word(&pair, 8), (1 << 63) | (3 << 32) | 1);
}

#[test]
fn a_send_without_a_posted_buffer_is_receiver_not_ready_and_writes_nothing() {
    let mut pair = queue_pair(2, 16);
    pair.sender.try_send(b"one").unwrap();
    pair.sender.try_send(b"two").unwrap();
    assert!(!pair.sender.receiver_ready());
    let before: Vec<u64> = (0..80).step_by(8).map(|offset| word(&pair, offset)).collect();
    assert!(matches!(pair.sender.try_send(b"three"), Err(PostError::ReceiverNotReady)));
    assert!(matches!(pair.sender.send(b"three", Duration::from_millis(20)), Err(PostError::Timeout)));
    let after: Vec<u64> = (0..80).step_by(8).map(|offset| word(&pair, offset)).collect();
    assert_eq!(before, after, "an RNR send writes nothing");
    assert_eq!(pair.sender.sent(), 2);
    // Holding a completed buffer keeps it unposted; re-posting it lets the send through.
    let completion = pair.receiver.poll().unwrap().unwrap();
    assert!(!pair.sender.receiver_ready());
    pair.receiver.repost(completion).unwrap();
    assert!(pair.sender.receiver_ready());
    pair.sender.try_send(b"three").unwrap();
    assert_eq!(receive(&mut pair.receiver).as_deref(), Some(&b"two"[..]));
    assert_eq!(receive(&mut pair.receiver).as_deref(), Some(&b"three"[..]));
    assert_eq!(receive(&mut pair.receiver), None);
}

#[test]
fn an_oversized_message_is_refused_with_a_length_error_completion() {
    let mut pair = queue_pair(2, 16);
    match pair.sender.try_send(&[7; 17]) {
        Err(PostError::TooLarge { message_bytes: 17, buffer_bytes: 16 }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(word(&pair, 48), 0, "no data written");
    match pair.receiver.poll() {
        Err(QueueError::LengthError { message_bytes: 17, buffer_bytes: 16 }) => {}
        other => panic!("{other:?}"),
    }
    // A message of exactly the buffer length fits.
    let mut fits = queue_pair(2, 16);
    fits.sender.try_send(&[9; 16]).unwrap();
    assert_eq!(receive(&mut fits.receiver), Some(vec![9; 16]));
}

#[test]
fn corrupt_completions_are_errors_never_panics_or_reads_outside_the_region() {
    let valid = |sequence: u64, buffer: u32| completion_header(sequence, buffer, STATUS_SUCCESS);
    let cases: [(u64, u64, &str); 8] = [
        (5, 0, "valid bit clear or reserved bit set"),
        (valid(0, 0) | RESERVED_BIT, 0, "valid bit clear or reserved bit set"),
        (valid(1, 0), 0, "tag does not match the completion's sequence number"),
        (valid(0, 1), 0, "buffer id is not the one posted"),
        (valid(0, 0xFF_FFFF), 0, "buffer id is not the one posted"),
        (valid(0, 0), 17, "length exceeds the buffer"),
        (valid(0, 0), u64::MAX, "reserved bits of the length word set"),
        (completion_header(0, 0, 9), 0, "unknown status"),
    ];
    for (header, length, reason) in cases {
        let mut pair = queue_pair(2, 16);
        store(&pair, 24, length);
        store(&pair, 16, header);
        assert!(pair.receiver.has_pending());
        match pair.receiver.poll() {
            Err(QueueError::Corrupt { reason: got, .. }) => assert_eq!(got, reason, "{header:#x} {length:#x}"),
            other => panic!("{header:#x} {length:#x}: {other:?}"),
        }
    }
    // A completion for a post that was never made: depth 1, its one buffer held by us.
    let mut unposted = queue_pair(1, 16);
    unposted.sender.try_send(b"x").unwrap();
    let held = unposted.receiver.poll().unwrap().unwrap();
    store(&unposted, 8, valid(1, 0)); // depth 1: the completion queue is at +8
    match unposted.receiver.poll() {
        Err(QueueError::Corrupt { reason, .. }) => assert_eq!(reason, "completion without a posted receive"),
        other => panic!("{other:?}"),
    }
    unposted.receiver.repost(held).unwrap();
}

#[test]
fn corrupt_receive_entries_are_errors_for_the_sender() {
    let cases: [(u64, &str); 4] = [
        (7, "valid bit clear or reserved bit set"),
        (receive_entry(0, 2), "buffer id not below the depth"),
        (receive_entry(0, u32::MAX), "buffer id not below the depth"),
        (receive_entry(5, 0), "tag is neither this post's nor the previous lap's"),
    ];
    for (entry, reason) in cases {
        let mut pair = queue_pair(2, 16);
        store(&pair, 0, entry);
        assert!(pair.sender.receiver_ready(), "an error is reported by try_send");
        match pair.sender.try_send(b"x") {
            Err(PostError::Corrupt { reason: got, post: 0, .. }) => assert_eq!(got, reason, "{entry:#x}"),
            other => panic!("{entry:#x}: {other:?}"),
        }
    }
    // After the first lap, a zeroed entry is no longer "never posted".
    let mut lapped = queue_pair(1, 16);
    lapped.sender.try_send(b"x").unwrap();
    assert!(matches!(lapped.sender.try_send(b"y"), Err(PostError::ReceiverNotReady)), "previous lap's post");
    store(&lapped, 0, 0);
    assert!(matches!(lapped.sender.try_send(b"y"), Err(PostError::Corrupt { .. })));
}

#[test]
fn invalid_layouts_are_refused() {
    let fabric = Arc::new(MemoryFabric::new());
    let region = Arc::new(fabric.register("rx", 256, Access::ReadWrite).unwrap());
    let remote = fabric.map(&fabric.describe(&region)).unwrap();
    let cases = [
        (QueueLayout { offset_bytes: 4, depth: 1, buffer_bytes: 8 }, 0),
        (QueueLayout { offset_bytes: 0, depth: 0, buffer_bytes: 8 }, 0),
        (QueueLayout { offset_bytes: 0, depth: 1, buffer_bytes: 12 }, 0),
        (QueueLayout { offset_bytes: 0, depth: 1, buffer_bytes: 0 }, 0),
        (QueueLayout { offset_bytes: 0, depth: SENDRECV_DEPTH_MAX as u64 + 1, buffer_bytes: 8 }, 0),
        (QueueLayout { offset_bytes: 0, depth: 1, buffer_bytes: SENDRECV_BUFFER_BYTES_MAX as u64 + 8 }, 0),
        (QueueLayout { offset_bytes: 0, depth: 8, buffer_bytes: 16 }, 0), // 320 bytes > 256
        (QueueLayout { offset_bytes: u64::MAX - 7, depth: 1, buffer_bytes: 8 }, 0),
        (QueueLayout { offset_bytes: 0, depth: 1, buffer_bytes: 8 }, 250),
        (QueueLayout { offset_bytes: 0, depth: 1, buffer_bytes: 8 }, 244),
    ];
    for (queue, doorbell) in cases {
        let addresses =
            QueueAddresses { queue, receiver_doorbell_offset_bytes: doorbell, sender_doorbell_offset_bytes: doorbell };
        let result = ReceiveQueue::new(Arc::clone(&fabric), Arc::clone(&region), remote.clone(), addresses);
        assert!(matches!(result, Err(QueueError::InvalidLayout { .. })), "{queue:?} {doorbell}");
        let result = SendQueue::new(Arc::clone(&fabric), remote.clone(), Arc::clone(&region), addresses);
        assert!(matches!(result, Err(QueueError::InvalidLayout { .. })), "{queue:?} {doorbell}");
    }
}

#[test]
fn a_blocked_send_is_woken_by_the_receivers_post() {
    let mut pair = queue_pair(1, 16);
    pair.sender.try_send(b"first").unwrap();
    let Pair { mut sender, mut receiver, .. } = pair;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            // Past the sender's spin: it sleeps on its doorbell until the post rings it.
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(receive(&mut receiver).as_deref(), Some(&b"first"[..]));
            let deadline = Instant::now() + Duration::from_secs(10);
            while receive(&mut receiver).is_none() {
                assert!(Instant::now() < deadline);
                std::thread::yield_now();
            }
        });
        sender.send(b"second", Duration::from_secs(10)).unwrap();
    });
}

#[test]
fn many_messages_cross_threads_in_order_through_a_small_queue() {
    let Pair { mut sender, mut receiver, receiver_region } = queue_pair(3, 24);
    let doorbell = Doorbell::new(Arc::clone(&receiver_region), 0).unwrap();
    let count = 20_000u64;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for sequence in 0..count {
                let message = body_of(sequence, (sequence % 25) as usize);
                sender.send(&message, Duration::from_secs(10)).unwrap();
            }
        });
        for sequence in 0..count {
            doorbell.wait_until(|| receiver.has_pending(), Duration::from_secs(10)).unwrap();
            assert_eq!(receive(&mut receiver).unwrap(), body_of(sequence, (sequence % 25) as usize));
        }
    });
}

fn body_of(sequence: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (sequence as usize * 31 + i * 7) as u8).collect()
}

/// One step of a randomized single-threaded run.
#[derive(Debug, Clone)]
enum Step {
    Send(usize),
    Poll,
    /// Re-post the oldest held buffer.
    Repost,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any mix of sends (RNR when nothing is posted), polls and late re-posts delivers exactly
    /// the accepted messages, in order, intact; the sender never has more outstanding than the
    /// depth, and never uses a buffer the receiver holds.
    #[test]
    fn random_send_poll_repost_sequences_are_fifo_and_intact(
        depth in 1u64..5,
        steps in prop::collection::vec(
            prop_oneof![(0usize..=24).prop_map(Step::Send), Just(Step::Poll), Just(Step::Repost)], 1..200),
    ) {
        let mut pair = queue_pair(depth, 24);
        let mut expected = std::collections::VecDeque::new();
        let mut held = std::collections::VecDeque::new();
        let mut sequence = 0u64;
        for step in steps {
            match step {
                Step::Send(len) => {
                    let message = body_of(sequence, len);
                    match pair.sender.try_send(&message) {
                        Ok(()) => { expected.push_back(message); sequence += 1; }
                        Err(PostError::ReceiverNotReady) => {
                            prop_assert_eq!(pair.receiver.outstanding(), expected.len() as u64);
                        }
                        Err(other) => panic!("{other}"),
                    }
                }
                Step::Poll => {
                    if let Some(completion) = pair.receiver.poll().unwrap() {
                        let mut message = Vec::new();
                        pair.receiver.copy_message(&completion, &mut message);
                        prop_assert_eq!(Some(message), expected.pop_front());
                        prop_assert!(held.iter().all(|other: &Completion| other.buffer_id() != completion.buffer_id()));
                        held.push_back(completion);
                    } else {
                        prop_assert!(expected.is_empty());
                    }
                }
                Step::Repost => {
                    if let Some(completion) = held.pop_front() {
                        pair.receiver.repost(completion).unwrap();
                    }
                }
            }
            prop_assert_eq!(pair.receiver.outstanding() + held.len() as u64, depth);
        }
    }
}
