//! The in-process fabric: regions are heap memory of this process, "remote" handles are shared
//! pointers to it.
//!
//! It exists so that everything above the fabric (slots, rings, the transports, the whole
//! store) can be tested fast and deterministically without /dev/shm, and so that the loom models
//! run the very same slot and ring code over loom's atomics. Its one-sided operations are the
//! same generic functions the shared-memory fabric uses ([`crate::words`]), so only the mapping
//! differs. [`MemoryFabric::global`] shares one registry per process, so that regions can be
//! mapped by the name a control handshake carries, exactly as with the shared-memory fabric.
//!
//! # Fault mode
//! The shared-memory fabric is kinder than RDMA: x86 keeps stores in order and a read's words
//! are loaded in address order. [`MemoryFabric::with_faults`] injects, seeded, what RDMA may do
//! and the fabric contract allows (`fabric.rs`), so that the code above can be shown to cope:
//! - a one-sided **read** copies the 64-byte lines of its range in a shuffled order and, half
//!   way (one read in four), waits (bounded) until the region's owner stores something: a read
//!   that overlaps a write returns a mix of old and new words (a torn copy);
//! - a one-sided **write** stores its 64-byte lines in a shuffled order, yielding in between: a
//!   multi-word write becomes visible out of order across lines.
//!
//! Single words stay atomic and release/acquire words keep their meaning (the contract's
//! promises); everything else may tear.
//!
//! # Round-trip mode
//! [`MemoryFabric::with_round_trips`] makes the fabric say what the verbs fabric says, that every
//! read is a network round trip (`OneSided::reads_are_round_trips`): readers of item slots then
//! take their one-read path, which this mode lets the tests run without a device. It counts the
//! one-sided operations and `read_many` batches it is asked for ([`RoundTripCounts`]).

use crate::fabric::{Access, Fabric, FabricError, OneSided, RegionDescriptor};
use crate::limits::{MEMORY_FAULT_WAIT_SPINS_MAX, WORD_BYTES};
use crate::region::check_length;
use crate::words::{self, check_range, check_writable, FenceOrdering, HeapWords, LoadOrdering, StoreOrdering, Words};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Bytes of the "cache line" the fault mode shuffles.
const LINE_BYTES: usize = 64;

/// Registered regions by name (weak: a region lives as long as its owner's handle).
type Registry<W> = Mutex<HashMap<String, (Weak<W>, Arc<AtomicU64>)>>;

/// An in-process fabric over memory `W` (heap words normally; loom words in the models).
/// Clones share the registry.
#[derive(Debug)]
pub struct MemoryFabric<W = HeapWords> {
    registry: Arc<Registry<W>>,
    faults: Option<Arc<Faults>>,
    round_trips: Option<Arc<RoundTripCounts>>,
}

/// What a fabric in round-trip mode was asked for (module docs).
#[derive(Debug, Default)]
pub struct RoundTripCounts {
    /// One-sided operations: reads (each of a `read_many` too), writes, atomics, word loads and
    /// stores.
    pub operations: AtomicU64,
    /// `read_many` batches.
    pub batches: AtomicU64,
}

impl<W> Clone for MemoryFabric<W> {
    fn clone(&self) -> Self {
        Self {
            registry: Arc::clone(&self.registry),
            faults: self.faults.clone(),
            round_trips: self.round_trips.clone(),
        }
    }
}

impl<W> Default for MemoryFabric<W> {
    fn default() -> Self {
        Self { registry: Arc::new(Mutex::new(HashMap::new())), faults: None, round_trips: None }
    }
}

impl<W> MemoryFabric<W> {
    /// An empty fabric with a registry of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same fabric (same registry), with seeded fault injection (see the module docs).
    pub fn with_faults(&self, seed: u64) -> Self {
        Self { faults: Some(Arc::new(Faults::new(seed))), ..self.clone() }
    }

    /// The same fabric (same registry, same fault mode), in round-trip mode (module docs).
    pub fn with_round_trips(&self) -> Self {
        Self { round_trips: Some(Arc::default()), ..self.clone() }
    }

    /// What round-trip mode counted; `None` outside it.
    pub fn round_trip_counts(&self) -> Option<&RoundTripCounts> {
        self.round_trips.as_deref()
    }

    /// Counts one operation in round-trip mode.
    fn count(&self) {
        if let Some(counts) = &self.round_trips {
            counts.operations.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Torn reads the fault mode produced: reads that saw the owner store during their copy.
    pub fn torn_reads(&self) -> u64 {
        self.faults.as_ref().map_or(0, |faults| faults.torn_reads.load(Ordering::Relaxed))
    }
}

impl MemoryFabric<HeapWords> {
    /// The process-wide fabric: every handle from here shares one registry, so a region
    /// registered by a server is mapped by a client through its descriptor's name.
    pub fn global() -> Self {
        static GLOBAL: OnceLock<Arc<Registry<HeapWords>>> = OnceLock::new();
        Self { registry: Arc::clone(GLOBAL.get_or_init(Default::default)), faults: None, round_trips: None }
    }
}

/// The seeded choices of the fault mode.
#[derive(Debug)]
struct Faults {
    /// A splitmix64 state: every choice comes from it, so a seed replays the same choices
    /// (thread interleavings aside).
    state: AtomicU64,
    torn_reads: AtomicU64,
}

impl Faults {
    fn new(seed: u64) -> Self {
        Self { state: AtomicU64::new(seed), torn_reads: AtomicU64::new(0) }
    }

    fn next(&self) -> u64 {
        let mut z = self.state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The word ranges (first index, words) of the lines that `len_words` words from
    /// `first_index` touch, shuffled.
    fn shuffled_lines(&self, first_index: usize, len_words: usize, lines: &mut Vec<(usize, usize)>) {
        let line_words = LINE_BYTES / WORD_BYTES;
        let mut index = first_index;
        let end = first_index + len_words;
        while index < end {
            let line_end = ((index / line_words) + 1) * line_words;
            let words = line_end.min(end) - index;
            lines.push((index, words));
            index += words;
        }
        for at in (1..lines.len()).rev() {
            lines.swap(at, (self.next() % (at as u64 + 1)) as usize);
        }
    }
}

/// A region registered with a [`MemoryFabric`]; the owner's view of it.
#[derive(Debug)]
pub struct MemoryLocalRegion<W = HeapWords> {
    words: Arc<W>,
    /// Counts the owner's stores (the fault mode waits for one to tear a read).
    stores: Arc<AtomicU64>,
    descriptor: RegionDescriptor,
}

impl<W> Clone for MemoryLocalRegion<W> {
    fn clone(&self) -> Self {
        Self { words: Arc::clone(&self.words), stores: Arc::clone(&self.stores), descriptor: self.descriptor.clone() }
    }
}

impl<W> MemoryLocalRegion<W> {
    /// The descriptor of this region.
    pub fn descriptor(&self) -> &RegionDescriptor {
        &self.descriptor
    }
}

/// A peer's region as mapped through a [`MemoryFabric`].
#[derive(Debug)]
pub struct MemoryRemoteRegion<W = HeapWords> {
    words: Arc<W>,
    stores: Option<Arc<AtomicU64>>,
    access: Access,
}

impl<W> Clone for MemoryRemoteRegion<W> {
    fn clone(&self) -> Self {
        Self { words: Arc::clone(&self.words), stores: self.stores.clone(), access: self.access }
    }
}

impl<W> MemoryRemoteRegion<W> {
    /// A remote handle straight onto `words` (the loom models build their memory this way).
    pub fn new(words: Arc<W>, access: Access) -> Self {
        Self { words, stores: None, access }
    }
}

impl<W: Words> MemoryFabric<W> {
    /// A read in fault mode: lines in a shuffled order, waiting half way for the owner to store.
    fn faulty_read(
        &self,
        faults: &Faults,
        remote: &MemoryRemoteRegion<W>,
        offset_bytes: usize,
        dst: &mut [u8],
    ) -> Result<(), FabricError> {
        let first_index = check_range(&*remote.words, offset_bytes, dst.len())?;
        let mut lines = Vec::new();
        faults.shuffled_lines(first_index, dst.len().div_ceil(WORD_BYTES), &mut lines);
        let stores_before = remote.stores.as_ref().map(|stores| stores.load(Ordering::Acquire));
        for (at, (index, words)) in lines.iter().enumerate() {
            if at == lines.len() / 2 && faults.next() % 4 == 0 {
                wait_for_store(faults, remote.stores.as_deref(), stores_before);
            }
            let start = (index - first_index) * WORD_BYTES;
            let end = (start + words * WORD_BYTES).min(dst.len());
            remote.words.copy_out(*index, &mut dst[start..end]);
        }
        remote.words.fence(FenceOrdering::Acquire);
        Ok(())
    }

    /// A write in fault mode: lines stored in a shuffled order, yielding in between.
    fn faulty_write(
        &self,
        faults: &Faults,
        remote: &MemoryRemoteRegion<W>,
        offset_bytes: usize,
        src: &[u8],
    ) -> Result<(), FabricError> {
        check_writable(remote.access)?;
        let first_index = check_range(&*remote.words, offset_bytes, src.len())?;
        let mut lines = Vec::new();
        faults.shuffled_lines(first_index, src.len().div_ceil(WORD_BYTES), &mut lines);
        for (index, words) in lines {
            let start = (index - first_index) * WORD_BYTES;
            let end = (start + words * WORD_BYTES).min(src.len());
            remote.words.copy_in(index, &src[start..end]);
            if faults.next() % 4 == 0 {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// Waits (bounded) until the owner stored something since `before`, and counts a torn read if
/// it did.
fn wait_for_store(faults: &Faults, stores: Option<&AtomicU64>, before: Option<u64>) {
    let (Some(stores), Some(before)) = (stores, before) else { return };
    for spin in 0..MEMORY_FAULT_WAIT_SPINS_MAX {
        if stores.load(Ordering::Acquire) != before {
            faults.torn_reads.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if spin % 64 == 63 {
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

impl<W: Words> OneSided for MemoryFabric<W> {
    type RemoteRegion = MemoryRemoteRegion<W>;

    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        remote.words.len_words() * WORD_BYTES
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        self.count();
        match &self.faults {
            Some(faults) => self.faulty_read(faults, remote, offset_bytes, dst),
            None => words::read_bytes(&*remote.words, offset_bytes, dst),
        }
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        self.count();
        match &self.faults {
            Some(faults) => self.faulty_write(faults, remote, offset_bytes, src),
            None => words::write_bytes(&*remote.words, remote.access, offset_bytes, src),
        }
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        self.count();
        words::compare_and_swap(&*remote.words, remote.access, offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        self.count();
        words::fetch_add(&*remote.words, remote.access, offset_bytes, add)
    }
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        self.count();
        words::read_word(&*remote.words, offset_bytes, ordering)
    }
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        self.count();
        words::write_word(&*remote.words, remote.access, offset_bytes, value, ordering)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        words::wake(&*remote.words, remote.access, offset_bytes)
    }
    fn read_many(&self, remote: &Self::RemoteRegion, reads: &mut [(usize, &mut [u8])]) -> Result<(), FabricError> {
        if let Some(counts) = &self.round_trips {
            counts.batches.fetch_add(1, Ordering::Relaxed);
        }
        reads.iter_mut().try_for_each(|(offset_bytes, dst)| self.read(remote, *offset_bytes, dst))
    }
    fn reads_are_round_trips(&self, _remote: &Self::RemoteRegion) -> bool {
        self.round_trips.is_some()
    }
}

impl Fabric for MemoryFabric<HeapWords> {
    type LocalRegion = MemoryLocalRegion<HeapWords>;

    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError> {
        check_length(name, len_bytes as u64)?;
        let mut regions = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        regions.retain(|_, (words, _)| words.strong_count() > 0);
        if regions.contains_key(name) {
            return Err(FabricError::InvalidRegion { name: name.to_owned(), reason: "name already registered" });
        }
        let words = Arc::new(HeapWords::new(len_bytes / WORD_BYTES));
        let stores = Arc::new(AtomicU64::new(0));
        regions.insert(name.to_owned(), (Arc::downgrade(&words), Arc::clone(&stores)));
        let descriptor = RegionDescriptor::new(name, len_bytes as u64, access);
        Ok(MemoryLocalRegion { words, stores, descriptor })
    }

    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor {
        local.descriptor.clone()
    }

    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError> {
        let regions = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let missing = || FabricError::RegionMissing { name: descriptor.name.clone() };
        let (words, stores) = regions.get(&descriptor.name).ok_or_else(missing)?;
        let words = words.upgrade().ok_or_else(missing)?;
        if (words.len_words() * WORD_BYTES) as u64 != descriptor.len_bytes {
            return Err(FabricError::InvalidRegion {
                name: descriptor.name.clone(),
                reason: "descriptor length differs from the region's",
            });
        }
        Ok(MemoryRemoteRegion { words, stores: Some(Arc::clone(stores)), access: descriptor.access })
    }
}

impl<W: Words> Words for MemoryLocalRegion<W> {
    fn len_words(&self) -> usize {
        self.words.len_words()
    }
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
        self.words.load(index, ordering)
    }
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
        self.words.store(index, value, ordering);
        self.stores.fetch_add(1, Ordering::Release);
    }
    fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
        self.words.compare_and_swap(index, expected, new)
    }
    fn fetch_add(&self, index: usize, add: u64) -> u64 {
        self.words.fetch_add(index, add)
    }
    fn fence(&self, ordering: FenceOrdering) {
        self.words.fence(ordering)
    }
    fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: Duration) {
        self.words.wait_while_equal(index, expected_low, timeout)
    }
    fn wake_all(&self, index: usize) {
        self.words.wake_all(index)
    }
    fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
        self.words.copy_out(first_index, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_finds_registered_regions_and_checks_descriptors() {
        let fabric = MemoryFabric::new();
        let local = fabric.register("r", 64, Access::ReadOnly).unwrap();
        let descriptor = fabric.describe(&local);
        let remote = fabric.map(&descriptor).unwrap();
        local.store(1, 42, StoreOrdering::Release);
        assert_eq!(fabric.read_word(&remote, 8, LoadOrdering::Acquire).unwrap(), 42);
        assert!(matches!(fabric.write_word(&remote, 8, 1, StoreOrdering::Release), Err(FabricError::NoWriteAccess)));
        let mut wrong = descriptor.clone();
        wrong.len_bytes = 128;
        assert!(matches!(fabric.map(&wrong), Err(FabricError::InvalidRegion { .. })));
        wrong.name = "absent".into();
        assert!(matches!(fabric.map(&wrong), Err(FabricError::RegionMissing { .. })));
        assert!(matches!(fabric.register("r", 64, Access::ReadOnly), Err(FabricError::InvalidRegion { .. })));
        assert!(fabric.register("odd", 12, Access::ReadOnly).is_err());
    }

    #[test]
    fn the_global_fabric_maps_by_name_and_forgets_dropped_regions() {
        let name = "memory-global-test";
        let local = MemoryFabric::global().register(name, 64, Access::ReadWrite).unwrap();
        let descriptor = local.descriptor().clone();
        let remote = MemoryFabric::global().map(&descriptor).unwrap();
        local.store(0, 7, StoreOrdering::Release);
        assert_eq!(MemoryFabric::global().read_word(&remote, 0, LoadOrdering::Acquire).unwrap(), 7);
        drop((local, remote));
        assert!(matches!(MemoryFabric::global().map(&descriptor), Err(FabricError::RegionMissing { .. })));
        MemoryFabric::global().register(name, 64, Access::ReadWrite).expect("the name is free again");
    }

    /// The fault mode's promise: a read that overlaps the owner rewriting a region sees a mix of
    /// the two versions, and a write's words still all land.
    #[test]
    fn the_fault_mode_tears_reads_that_overlap_a_write_and_lands_every_word_of_a_write() {
        let seed = 0x5EED;
        println!("seed {seed}");
        let fabric = MemoryFabric::new().with_faults(seed);
        let local = fabric.register("torn", 1024, Access::ReadWrite).unwrap();
        let remote = fabric.map(local.descriptor()).unwrap();
        let source: Vec<u8> = (0..1024u32).map(|byte| byte as u8).collect();
        fabric.write(&remote, 0, &source).unwrap();
        let mut copy = vec![0; 1024];
        fabric.read(&remote, 0, &mut copy).unwrap();
        assert_eq!(copy, source, "a write in shuffled lines still lands whole");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (local, stop) = (local.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut version = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    for index in 0..128 {
                        local.store(index, version, StoreOrdering::Relaxed);
                    }
                    version += 1;
                }
            })
        };
        let mut mixed = 0;
        for _ in 0..200 {
            fabric.read(&remote, 0, &mut copy).unwrap();
            let words: Vec<u64> =
                copy.chunks_exact(8).map(|word| u64::from_le_bytes(word.try_into().unwrap())).collect();
            mixed += usize::from(words.iter().any(|word| *word != words[0]));
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(fabric.torn_reads() > 0 && mixed > 0, "reads overlapping a write were torn: {mixed} mixed copies");
    }
}
