//! `OneSided::read_many`'s default (the ranges read one after another, exactly as `read` reads
//! each) and `verify_image`'s verdicts on images read by the caller. No device needed.

use rampkv_fabric::memory::{MemoryFabric, MemoryRemoteRegion};
use rampkv_fabric::slot::{SLOT_FLAG_VALID, SLOT_HEADER_BYTES};
use rampkv_fabric::{
    slot_bytes, verify_image, Access, Fabric, FabricError, LoadOrdering, OneSided, SlotReadError, SlotWriter,
    StoreOrdering, Words,
};
use std::sync::Mutex;

/// The in-memory fabric, recording every `read` it is asked for (offset, length).
struct Recording {
    inner: MemoryFabric,
    reads: Mutex<Vec<(usize, usize)>>,
}

impl OneSided for Recording {
    type RemoteRegion = MemoryRemoteRegion;

    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        self.inner.remote_len_bytes(remote)
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        self.reads.lock().unwrap().push((offset_bytes, dst.len()));
        self.inner.read(remote, offset_bytes, dst)
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        self.inner.write(remote, offset_bytes, src)
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        self.inner.compare_and_swap(remote, offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        self.inner.fetch_add(remote, offset_bytes, add)
    }
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        self.inner.read_word(remote, offset_bytes, ordering)
    }
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        self.inner.write_word(remote, offset_bytes, value, ordering)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        self.inner.wake(remote, offset_bytes)
    }
}

const REGION_BYTES: usize = 4096;

fn word_of(index: usize) -> u64 {
    0xabcd_0000_0000_0000 | index as u64
}

#[test]
fn read_many_by_default_reads_each_range_in_order_as_read_does() {
    let inner = MemoryFabric::new();
    let local = inner.register("read-many", REGION_BYTES, Access::ReadOnly).unwrap();
    for index in 0..REGION_BYTES / 8 {
        local.store(index, word_of(index), StoreOrdering::Relaxed);
    }
    let remote = inner.map(&inner.describe(&local)).unwrap();
    let fabric = Recording { inner, reads: Mutex::new(Vec::new()) };

    let (mut word, mut range, mut odd, mut empty) = ([0u8; 8], vec![0u8; 1280], [0u8; 13], [0u8; 0]);
    let mut reads = [(4088, &mut word[..]), (64, &mut range[..]), (8, &mut odd[..]), (0, &mut empty[..])];
    fabric.read_many(&remote, &mut reads).unwrap();
    assert_eq!(*fabric.reads.lock().unwrap(), [(4088, 8), (64, 1280), (8, 13), (0, 0)], "one read per range, in order");
    assert_eq!(u64::from_le_bytes(word), word_of(511));
    let mut expected = vec![0u8; 1280];
    fabric.read(&remote, 64, &mut expected).unwrap();
    assert_eq!(range, expected, "the same bytes as a read");
    for (index, chunk) in range.chunks(8).enumerate() {
        assert_eq!(chunk, &word_of(8 + index).to_le_bytes()[..]);
    }
    assert_eq!(&odd[..8], &word_of(1).to_le_bytes()[..]);
    assert_eq!(&odd[8..], &word_of(2).to_le_bytes()[..5]);

    // The first bad range stops it, with read's error; the ranges before it were read.
    for (bad_offset, bad_len) in [(12, 8), (REGION_BYTES - 8, 16), (REGION_BYTES, 8)] {
        fabric.reads.lock().unwrap().clear();
        let (mut first, mut bad, mut after) = ([0u8; 8], vec![0u8; bad_len], [0u8; 8]);
        let mut reads = [(0, &mut first[..]), (bad_offset, &mut bad[..]), (16, &mut after[..])];
        let batched = fabric.read_many(&remote, &mut reads).unwrap_err();
        let single = fabric.inner.read(&remote, bad_offset, &mut vec![0u8; bad_len]).unwrap_err();
        assert_eq!(batched.to_string(), single.to_string(), "offset {bad_offset}, {bad_len} B");
        assert_eq!(fabric.reads.lock().unwrap().len(), 2, "nothing read after the bad range");
        assert_eq!(u64::from_le_bytes(first), word_of(0));
        assert_eq!(after, [0u8; 8]);
    }
}

const KEY: &[u8] = b"image-key";
const METADATA: &[u8] = b"meta";
const VALUE: &[u8] = b"the value of the version";
const CAPACITY: usize = 256;

/// A slot published at offset 0 and read back whole, as a batch would read it.
fn published_image() -> Vec<u8> {
    let fabric = MemoryFabric::new();
    let local = fabric.register("verify-image", CAPACITY, Access::ReadOnly).unwrap();
    let mut writer = SlotWriter::new(CAPACITY);
    writer.publish(&local, 0, CAPACITY, KEY, 77, 5, METADATA, VALUE, SLOT_FLAG_VALID).unwrap();
    let remote = fabric.map(&fabric.describe(&local)).unwrap();
    let mut image = vec![0u8; CAPACITY];
    fabric.read(&remote, 0, &mut image).unwrap();
    image
}

#[test]
fn verify_image_accepts_a_whole_version_and_rejects_torn_and_wrong_ones() {
    let image = published_image();
    let view = verify_image(&image, KEY).expect("a published slot verifies");
    assert_eq!((view.ts(), view.expiry(), view.attempts()), (77, 5, 1));
    assert_eq!((view.key(), view.metadata(), view.value()), (KEY, METADATA, VALUE));
    assert_eq!(view.seq() % 2, 0);
    assert!(!view.newer_prepared());

    assert!(matches!(verify_image(&image, b"another-key"), Err(SlotReadError::WrongKey)));
    assert!(matches!(verify_image(&vec![0u8; CAPACITY], KEY), Err(SlotReadError::NotValid)));

    let used = slot_bytes(KEY.len(), METADATA.len(), VALUE.len());
    let torn = |edit: &dyn Fn(&mut Vec<u8>), what: &str| {
        let mut bad = image.clone();
        edit(&mut bad);
        let verdict = verify_image(&bad, KEY);
        assert!(matches!(verdict, Err(SlotReadError::Torn { attempts: 1 })), "{what}: {verdict:?}");
    };
    torn(&|bad| bad[0] |= 1, "an odd seq (caught mid-write)");
    torn(&|bad| bad[used - 8] ^= 2, "a trailer seq copy of another write");
    torn(&|bad| bad[used - 16] ^= 1, "a checksum of another write");
    torn(&|bad| bad[used - 17] ^= 0x40, "a value byte of another write");
    torn(&|bad| bad[SLOT_HEADER_BYTES] ^= 1, "a key byte of another write");
    torn(&|bad| bad[8] ^= 1, "a timestamp of another write");

    for length in [CAPACITY - 4, 8, 0] {
        let verdict = verify_image(&image[..length], KEY);
        assert!(matches!(verdict, Err(SlotReadError::InvalidCapacity { .. })), "{length} B: {verdict:?}");
    }
}
