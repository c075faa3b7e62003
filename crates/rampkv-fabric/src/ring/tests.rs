//! Ring unit tests: exact layout, credit, wrap-around, corrupt input, doorbell, and randomized
//! single-threaded send/poll sequences.

use super::*;
use crate::fabric::{Access, Fabric};
use crate::memory::{MemoryFabric, MemoryLocalRegion, MemoryRemoteRegion};
use proptest::prelude::*;
use std::sync::Arc;

type Sender = RingSender<Arc<MemoryFabric>, Arc<MemoryLocalRegion>>;
type Receiver = RingReceiver<Arc<MemoryFabric>, Arc<MemoryLocalRegion>>;

const RING_OFFSET_BYTES: u64 = 64;

impl OneSided for Arc<MemoryFabric> {
    type RemoteRegion = MemoryRemoteRegion;
    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        (**self).remote_len_bytes(remote)
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        (**self).read(remote, offset_bytes, dst)
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        (**self).write(remote, offset_bytes, src)
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        (**self).compare_and_swap(remote, offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        (**self).fetch_add(remote, offset_bytes, add)
    }
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        (**self).read_word(remote, offset_bytes, ordering)
    }
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        (**self).write_word(remote, offset_bytes, value, ordering)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        (**self).wake(remote, offset_bytes)
    }
}

fn addresses(ring_bytes: u64, body_bytes_max: u64) -> RingAddresses {
    RingAddresses {
        ring: RingLayout { offset_bytes: RING_OFFSET_BYTES, ring_bytes, body_bytes_max },
        receiver_doorbell_offset_bytes: 0,
        credit_offset_bytes: 0,
        sender_doorbell_offset_bytes: 64,
    }
}

struct Pair {
    sender: Sender,
    receiver: Receiver,
    receiver_region: Arc<MemoryLocalRegion>,
    sender_region: Arc<MemoryLocalRegion>,
}

fn pair(ring_bytes: u64, body_bytes_max: u64) -> Pair {
    let fabric = Arc::new(MemoryFabric::new());
    let receiver_region =
        Arc::new(fabric.register("rx", (RING_OFFSET_BYTES + ring_bytes) as usize, Access::ReadWrite).unwrap());
    let sender_region = Arc::new(fabric.register("tx", 128, Access::ReadWrite).unwrap());
    let addresses = addresses(ring_bytes, body_bytes_max);
    let receiver_remote = fabric.map(&fabric.describe(&receiver_region)).unwrap();
    let sender_remote = fabric.map(&fabric.describe(&sender_region)).unwrap();
    let receiver =
        RingReceiver::new(Arc::clone(&fabric), Arc::clone(&receiver_region), sender_remote, addresses).unwrap();
    let sender = RingSender::new(fabric, receiver_remote, Arc::clone(&sender_region), addresses).unwrap();
    Pair { sender, receiver, receiver_region, sender_region }
}

fn ring_word(pair: &Pair, position_bytes: usize) -> u64 {
    pair.receiver_region.load((RING_OFFSET_BYTES as usize + position_bytes) / WORD_BYTES, LoadOrdering::Relaxed)
}

fn poll_body(receiver: &mut Receiver) -> Option<Vec<u8>> {
    receiver.poll().unwrap().map(|view| view.body().to_vec())
}

#[test]
fn frame_layout_is_exact_byte_by_byte() {
    let mut pair = pair(64, 24);
    pair.sender.try_send(b"hello").unwrap();
    let header = ring_word(&pair, 0);
    assert_eq!(header, (1 << 63) | 5);
    assert_eq!(ring_word(&pair, 8).to_le_bytes(), *b"hello\0\0\0");
    assert_eq!(ring_word(&pair, 16), header ^ TRAILER_MAGIC);
    assert_eq!(ring_word(&pair, 24), 0);
    // Second frame at stream byte 24: tag 3.
    pair.sender.try_send(b"").unwrap();
    let second = ring_word(&pair, 24);
    assert_eq!(second, (1 << 63) | (3 << 32));
    assert_eq!(ring_word(&pair, 32), second ^ TRAILER_MAGIC);
    assert_eq!(frame_bytes(5), 24);
    assert_eq!(frame_bytes(0), 16);
}

#[test]
fn poll_clears_frames_and_credit_flows_back() {
    let mut pair = pair(64, 24);
    assert!(!pair.receiver.has_pending());
    assert_eq!(poll_body(&mut pair.receiver), None);
    pair.sender.try_send(b"one").unwrap(); // 24 bytes
    pair.sender.try_send(b"two").unwrap(); // 48
    pair.sender.try_send(b"").unwrap(); // 64: ring full
    assert_eq!(pair.sender.in_flight_bytes(), 64);
    assert!(matches!(pair.sender.try_send(b""), Err(SendError::NoCredit)));
    assert!(pair.receiver.has_pending());
    assert_eq!(poll_body(&mut pair.receiver).as_deref(), Some(&b"one"[..]));
    // 24 freed bytes >= 64 / 4: credit returned at once, and the frame is zeroed.
    assert_eq!(pair.sender_region.load(0, LoadOrdering::Relaxed), 24);
    assert_eq!((ring_word(&pair, 0), ring_word(&pair, 8), ring_word(&pair, 16)), (0, 0, 0));
    pair.sender.try_send(b"").unwrap();
    assert_eq!(poll_body(&mut pair.receiver).as_deref(), Some(&b"two"[..]));
    assert_eq!(poll_body(&mut pair.receiver).as_deref(), Some(&b""[..]));
    assert_eq!(poll_body(&mut pair.receiver).as_deref(), Some(&b""[..]));
    assert_eq!(poll_body(&mut pair.receiver), None);
    // Finding the ring empty returns all credit.
    assert_eq!(pair.sender_region.load(0, LoadOrdering::Relaxed), 80);
    assert!((0..64).step_by(8).all(|position| ring_word(&pair, position) == 0));
}

#[test]
fn wrap_marker_skips_the_ring_end() {
    let mut pair = pair(64, 24);
    pair.sender.try_send(&[1; 20]).unwrap(); // frame 40 at 0
    assert_eq!(poll_body(&mut pair.receiver).unwrap(), vec![1; 20]);
    // 40 + 32 > 64: wrap marker at 40 (tag 5), frame at stream byte 64 (tag 8, offset 0).
    pair.sender.try_send(&[2; 16]).unwrap();
    assert_eq!(ring_word(&pair, 40), (1 << 63) | (1 << 62) | (5 << 32));
    assert_eq!(ring_word(&pair, 0), (1 << 63) | (8 << 32) | 16);
    assert_eq!(poll_body(&mut pair.receiver).unwrap(), vec![2; 16]);
    let view_stream = {
        pair.sender.try_send(b"x").unwrap();
        pair.receiver.poll().unwrap().unwrap().stream_bytes()
    };
    assert_eq!(view_stream, 96);
}

#[test]
fn too_large_is_refused_before_writing() {
    let mut pair = pair(64, 24);
    assert!(matches!(pair.sender.try_send(&[0; 25]), Err(SendError::TooLarge { body_bytes: 25, body_bytes_max: 24 })));
    assert_eq!(pair.sender.in_flight_bytes(), 0);
    assert_eq!(ring_word(&pair, 0), 0);
}

#[test]
fn corrupt_credit_is_an_error() {
    let mut pair = pair(64, 24);
    pair.sender.try_send(&[0; 24]).unwrap();
    pair.sender.try_send(&[0; 24]).unwrap_err();
    pair.sender_region.store(0, 1000, StoreOrdering::Release); // more than was sent
    assert!(matches!(pair.sender.try_send(&[0; 24]), Err(SendError::CreditCorrupt { credit_bytes: 1000, .. })));
}

#[test]
fn invalid_layouts_are_refused() {
    let fabric = Arc::new(MemoryFabric::new());
    let region = Arc::new(fabric.register("rx", 256, Access::ReadWrite).unwrap());
    let remote = fabric.map(&fabric.describe(&region)).unwrap();
    let cases = [
        (RingLayout { offset_bytes: 4, ring_bytes: 64, body_bytes_max: 8 }, 0),
        (RingLayout { offset_bytes: 0, ring_bytes: 60, body_bytes_max: 8 }, 0),
        (RingLayout { offset_bytes: 0, ring_bytes: 16, body_bytes_max: 0 }, 0),
        (RingLayout { offset_bytes: 0, ring_bytes: 64, body_bytes_max: 49 }, 0),
        (RingLayout { offset_bytes: 200, ring_bytes: 64, body_bytes_max: 8 }, 0),
        (RingLayout { offset_bytes: u64::MAX - 7, ring_bytes: 64, body_bytes_max: 8 }, 0),
        (RingLayout { offset_bytes: 64, ring_bytes: 64, body_bytes_max: 8 }, 250),
    ];
    for (ring, doorbell) in cases {
        let addresses = RingAddresses {
            ring,
            receiver_doorbell_offset_bytes: doorbell,
            credit_offset_bytes: 0,
            sender_doorbell_offset_bytes: 16,
        };
        let result = RingReceiver::new(Arc::clone(&fabric), Arc::clone(&region), remote.clone(), addresses);
        assert!(matches!(result, Err(RingError::InvalidLayout { .. })), "{ring:?}");
    }
}

#[test]
fn corrupt_headers_are_errors_never_reads_outside_the_ring() {
    let cases: [(u64, &str); 6] = [
        (5, "new-message bit clear"),
        ((1 << 63) | (7 << 32), "tag does not match the stream position"),
        ((1 << 63) | 25, "length above body_bytes_max"),
        ((1 << 63) | u64::from(u32::MAX), "length above body_bytes_max"),
        ((1 << 63) | (1 << 62), "wrap marker with a length or at the ring start"),
        ((1 << 63) | (1 << 62) | 8, "wrap marker with a length or at the ring start"),
    ];
    for (header, reason) in cases {
        let mut pair = pair(64, 24);
        pair.receiver_region.store(RING_OFFSET_BYTES as usize / WORD_BYTES, header, StoreOrdering::Release);
        match pair.receiver.poll() {
            Err(RingError::Corrupt { reason: got, .. }) => assert_eq!(got, reason, "{header:#x}"),
            other => panic!("{header:#x}: {other:?}"),
        }
    }
    // A frame whose trailer is neither zero nor the expected value.
    let mut pair = pair(64, 24);
    let base = RING_OFFSET_BYTES as usize / WORD_BYTES;
    pair.receiver_region.store(base, (1 << 63) | 3, StoreOrdering::Relaxed);
    pair.receiver_region.store(base + 2, 42, StoreOrdering::Release);
    assert!(matches!(pair.receiver.poll(), Err(RingError::Corrupt { .. })));
    // A frame in transfer (trailer still zero) is simply not there yet.
    pair.receiver_region.store(base + 2, 0, StoreOrdering::Release);
    assert!(pair.receiver.poll().unwrap().is_none());
}

#[test]
fn doorbell_wait_times_out_and_wakes_across_threads() {
    let region = Arc::new(crate::words::HeapWords::new(4));
    let doorbell = Doorbell::new(Arc::clone(&region), 0).unwrap();
    let start = Instant::now();
    assert_eq!(doorbell.wait_until(|| false, Duration::from_millis(30)), Err(WaitError::Timeout));
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert_eq!(region.load(1, LoadOrdering::Relaxed), 0, "sleepers restored");

    let mut pair = pair(64, 24);
    let doorbell = Doorbell::new(Arc::clone(&pair.receiver_region), 0).unwrap();
    std::thread::scope(|scope| {
        let receiver = &pair.receiver;
        let waiter = scope.spawn(move || {
            let start = Instant::now();
            doorbell.wait_until(|| receiver.has_pending(), Duration::from_secs(10)).unwrap();
            start.elapsed()
        });
        // Let the waiter get past its spin phase and sleep.
        std::thread::sleep(Duration::from_millis(50));
        pair.sender.try_send(b"wake up").unwrap();
        assert!(waiter.join().unwrap() < Duration::from_secs(5));
    });
    assert_eq!(poll_body(&mut pair.receiver).as_deref(), Some(&b"wake up"[..]));
}

#[test]
fn blocking_send_waits_for_credit_and_is_woken_by_the_receiver() {
    let mut pair = pair(64, 24);
    pair.sender.try_send(&[9; 24]).unwrap();
    pair.sender.try_send(&[8; 8]).unwrap(); // 40 + 24 = 64: full
    assert!(matches!(pair.sender.send(b"late", Duration::from_millis(20)), Err(SendError::Timeout)));
    let Pair { mut sender, mut receiver, .. } = pair;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(poll_body(&mut receiver).unwrap(), vec![9; 24]);
            receiver.flush_credit().unwrap();
        });
        sender.send(b"late", Duration::from_secs(10)).unwrap();
    });
}

/// One step of a randomized single-threaded run.
#[derive(Debug, Clone)]
enum Step {
    Send(usize),
    Poll,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(prop_oneof![(0usize..=40).prop_map(Step::Send), Just(Step::Poll)], 1..200)
}

fn body_of(sequence: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (sequence as usize * 31 + i * 7) as u8).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any mix of sends (random sizes, refused when credit is short) and polls delivers exactly
    /// the accepted messages, in order, with their bytes; credit is never exceeded.
    #[test]
    fn random_send_poll_sequences_are_fifo_and_intact(
        ring_words in 8u64..24,
        steps in steps(),
    ) {
        let ring_bytes = ring_words * 8;
        let body_bytes_max = (ring_bytes - 16).min(40);
        let mut pair = pair(ring_bytes, body_bytes_max);
        let mut expected = std::collections::VecDeque::new();
        let mut sequence = 0u64;
        for step in steps {
            match step {
                Step::Send(len) => {
                    let body = body_of(sequence, len);
                    match pair.sender.try_send(&body) {
                        Ok(()) => {
                            expected.push_back(body);
                            sequence += 1;
                        }
                        Err(SendError::NoCredit) => {}
                        Err(SendError::TooLarge { .. }) => prop_assert!(len as u64 > body_bytes_max),
                        Err(other) => prop_assert!(false, "{other}"),
                    }
                    prop_assert!(pair.sender.in_flight_bytes() <= ring_bytes);
                }
                Step::Poll => {
                    let got = poll_body(&mut pair.receiver);
                    prop_assert_eq!(got, expected.pop_front());
                }
            }
        }
        while let Some(body) = expected.pop_front() {
            prop_assert_eq!(poll_body(&mut pair.receiver), Some(body));
        }
        prop_assert_eq!(poll_body(&mut pair.receiver), None);
    }

    /// Whatever garbage a peer writes into the ring, `poll` returns a value (a message, nothing,
    /// or `Corrupt`) and never panics or reads outside the ring (the memory would panic).
    #[test]
    fn corrupt_ring_contents_never_panic(
        garbage in prop::collection::vec(any::<u64>(), 8),
        biased in prop::collection::vec((0usize..8, 0u64..64, any::<bool>()), 0..8),
    ) {
        let mut pair = pair(64, 24);
        let base = RING_OFFSET_BYTES as usize / WORD_BYTES;
        for (index, word) in garbage.iter().enumerate() {
            pair.receiver_region.store(base + index, *word, StoreOrdering::Relaxed);
        }
        // Also plant plausible headers (NEW bit, small lengths, right or wrong tags), which
        // reach the deeper checks more often than uniform garbage does.
        for (index, length, wrap) in biased {
            let header = (1 << 63) | (u64::from(wrap) << 62) | ((index as u64) << 32) | length;
            pair.receiver_region.store(base + index, header, StoreOrdering::Relaxed);
        }
        for _ in 0..8 {
            match pair.receiver.poll() {
                Ok(Some(view)) => prop_assert!(view.body().len() <= 24),
                Ok(None) | Err(RingError::Corrupt { .. }) => break,
                Err(other) => prop_assert!(false, "{other}"),
            }
        }
    }
}
