//! The regions this process registered for RDMA, by address: where a wake that a peer SENDs
//! (region address, word offset) is turned into a futex wake of the local word.
//!
//! A wake comes from outside: an address that names no live region of this process, or an
//! offset outside it or not word-aligned, is ignored and counted ([`ignored_wakes`]), never a
//! panic.

use crate::limits::WORD_BYTES;
use crate::shm::ShmLocalRegion;
use crate::words::Words;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

struct Entry {
    len_bytes: u64,
    region: Weak<ShmLocalRegion>,
}

static REGIONS: Mutex<BTreeMap<u64, Entry>> = Mutex::new(BTreeMap::new());
static WAKES_RELAYED: AtomicU64 = AtomicU64::new(0);
static WAKES_IGNORED: AtomicU64 = AtomicU64::new(0);

/// Wakes relayed to a local word since the process started.
pub fn relayed_wakes() -> u64 {
    WAKES_RELAYED.load(Ordering::Relaxed)
}

/// Wakes ignored since the process started (unknown region, bad offset, malformed message).
pub fn ignored_wakes() -> u64 {
    WAKES_IGNORED.load(Ordering::Relaxed)
}

/// A region's place in the registry, removed on drop.
#[derive(Debug)]
pub(crate) struct Registered {
    address: u64,
    region: Weak<ShmLocalRegion>,
}

/// Enters `region` (registered with the device at `address`) into the registry.
pub(crate) fn register(address: u64, region: &Arc<ShmLocalRegion>) -> Registered {
    let (_, len_bytes) = region.mapped_range();
    let weak = Arc::downgrade(region);
    REGIONS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(address, Entry { len_bytes: len_bytes as u64, region: weak.clone() });
    Registered { address, region: weak }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut regions = REGIONS.lock().unwrap_or_else(PoisonError::into_inner);
        // The address may have been reused by a newer region already: remove only our own.
        if regions.get(&self.address).is_some_and(|entry| Weak::ptr_eq(&entry.region, &self.region)) {
            regions.remove(&self.address);
        }
    }
}

/// Counts a malformed wake message.
pub(crate) fn ignore_wake() {
    WAKES_IGNORED.fetch_add(1, Ordering::Relaxed);
}

/// Relays a wake for the word at `offset_bytes` of the region at `address`; returns whether it
/// named a live region of this process (otherwise it is counted as ignored).
pub(crate) fn relay_wake(address: u64, offset_bytes: u64) -> bool {
    let region = {
        let regions = REGIONS.lock().unwrap_or_else(PoisonError::into_inner);
        match regions.get(&address) {
            Some(entry)
                if offset_bytes % WORD_BYTES as u64 == 0
                    && offset_bytes.checked_add(WORD_BYTES as u64).is_some_and(|end| end <= entry.len_bytes) =>
            {
                entry.region.upgrade()
            }
            _ => None,
        }
    };
    match region {
        Some(region) => {
            region.wake_all((offset_bytes / WORD_BYTES as u64) as usize);
            WAKES_RELAYED.fetch_add(1, Ordering::Relaxed);
            true
        }
        None => {
            ignore_wake();
            false
        }
    }
}
