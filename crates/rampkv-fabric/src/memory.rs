//! The in-process fabric: regions are heap memory of this process, "remote" handles are shared
//! pointers to it.
//!
//! It exists so that everything above the fabric (slots, rings, the transports) can be tested
//! fast and deterministically without /dev/shm, and so that the loom models run the very same
//! slot and ring code over loom's atomics. Its one-sided operations are the same generic
//! functions the shared-memory fabric uses ([`crate::words`]), so only the mapping differs.

use crate::fabric::{Access, Fabric, FabricError, OneSided, RegionDescriptor};
use crate::limits::{REGION_BYTES_MAX, WORD_BYTES};
use crate::words::{self, FenceOrdering, HeapWords, LoadOrdering, StoreOrdering, Words};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An in-process fabric over memory `W` (heap words normally; loom words in the models).
#[derive(Debug)]
pub struct MemoryFabric<W = HeapWords> {
    regions: Mutex<HashMap<String, Arc<W>>>,
    _memory: PhantomData<W>,
}

impl<W> Default for MemoryFabric<W> {
    fn default() -> Self {
        Self { regions: Mutex::new(HashMap::new()), _memory: PhantomData }
    }
}

impl<W> MemoryFabric<W> {
    /// An empty fabric.
    pub fn new() -> Self {
        Self::default()
    }
}

/// A region registered with a [`MemoryFabric`]; the owner's view of it.
#[derive(Debug, Clone)]
pub struct MemoryLocalRegion<W = HeapWords> {
    words: Arc<W>,
    descriptor: RegionDescriptor,
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
    access: Access,
}

impl<W> Clone for MemoryRemoteRegion<W> {
    fn clone(&self) -> Self {
        Self { words: Arc::clone(&self.words), access: self.access }
    }
}

impl<W> MemoryRemoteRegion<W> {
    /// A remote handle straight onto `words` (the loom models build their memory this way).
    pub fn new(words: Arc<W>, access: Access) -> Self {
        Self { words, access }
    }
}

impl<W: Words> OneSided for MemoryFabric<W> {
    type RemoteRegion = MemoryRemoteRegion<W>;

    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize {
        remote.words.len_words() * WORD_BYTES
    }
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
        words::read_bytes(&*remote.words, offset_bytes, dst)
    }
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError> {
        words::write_bytes(&*remote.words, remote.access, offset_bytes, src)
    }
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError> {
        words::compare_and_swap(&*remote.words, remote.access, offset_bytes, expected, new)
    }
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError> {
        words::fetch_add(&*remote.words, remote.access, offset_bytes, add)
    }
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError> {
        words::read_word(&*remote.words, offset_bytes, ordering)
    }
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError> {
        words::write_word(&*remote.words, remote.access, offset_bytes, value, ordering)
    }
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError> {
        words::wake(&*remote.words, remote.access, offset_bytes)
    }
}

impl Fabric for MemoryFabric<HeapWords> {
    type LocalRegion = MemoryLocalRegion<HeapWords>;

    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError> {
        check_length(name, len_bytes as u64)?;
        let words = Arc::new(HeapWords::new(len_bytes / WORD_BYTES));
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        if regions.contains_key(name) {
            return Err(FabricError::InvalidRegion { name: name.to_owned(), reason: "name already registered" });
        }
        regions.insert(name.to_owned(), Arc::clone(&words));
        Ok(MemoryLocalRegion {
            words,
            descriptor: RegionDescriptor { name: name.to_owned(), len_bytes: len_bytes as u64, access },
        })
    }

    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor {
        local.descriptor.clone()
    }

    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError> {
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let words = regions
            .get(&descriptor.name)
            .ok_or_else(|| FabricError::RegionMissing { name: descriptor.name.clone() })?;
        if (words.len_words() * WORD_BYTES) as u64 != descriptor.len_bytes {
            return Err(FabricError::InvalidRegion {
                name: descriptor.name.clone(),
                reason: "descriptor length differs from the region's",
            });
        }
        Ok(MemoryRemoteRegion { words: Arc::clone(words), access: descriptor.access })
    }
}

/// A region length must be positive, word-padded and bounded.
pub(crate) fn check_length(name: &str, len_bytes: u64) -> Result<(), FabricError> {
    let reason = if len_bytes == 0 {
        "length is zero"
    } else if len_bytes % WORD_BYTES as u64 != 0 {
        "length is not a multiple of 8"
    } else if len_bytes > REGION_BYTES_MAX {
        "length exceeds REGION_BYTES_MAX"
    } else {
        return Ok(());
    };
    Err(FabricError::InvalidRegion { name: name.to_owned(), reason })
}

impl<W: Words> Words for MemoryLocalRegion<W> {
    fn len_words(&self) -> usize {
        self.words.len_words()
    }
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
        self.words.load(index, ordering)
    }
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
        self.words.store(index, value, ordering)
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
}
