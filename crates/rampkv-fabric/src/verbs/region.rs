//! Protection domains and registered memory.
//!
//! # Contract
//! A [`MemoryRegion`] owns its memory: an anonymous, page-aligned, zeroed mapping that is
//! registered with the NIC for its whole life and unmapped only after it is deregistered.
//! Because the NIC (a peer's RDMA WRITE or atomic, or the completion of our own READ) may
//! change any byte at any time, the CPU reaches the memory only through 8-byte atomic words
//! (the rule of [`crate::words`]); no `&[u8]` of it ever exists. Every queue pair that has a
//! work request outstanding on a region holds a reference to it, so the registration outlives
//! the request whatever the caller drops.
//!
//! A [`RemoteRegion`] is what a peer needs to name a region: address, length and rkey, a plain
//! value for any control channel. Access is enforced by the NIC: a region registered without
//! `REMOTE_WRITE` cannot be written by any peer, whatever it claims.

use super::device::{call_error, Context};
use super::error::VerbsError;
use super::ffi::{self, IbvMr, IbvPd};
use super::limits::REGION_BYTES_MAX;
use crate::words::{LoadOrdering, StoreOrdering};
use memmap2::MmapMut;
use serde::{Deserialize, Serialize};
use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const WORD_BYTES: u64 = 8;

/// A protection domain: regions and queue pairs of one domain can be used together (and only
/// together). Cheap to clone (shared).
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    pub(crate) context: Context,
    pub(crate) raw: NonNull<IbvPd>,
}

// SAFETY: a protection domain is only passed to verbs, which are thread-safe.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd, freed once; regions and queue pairs hold an Arc of
        // this domain, so none is left.
        let _ = unsafe { (self.context.inner.api.dealloc_pd)(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ProtectionDomain").field("device", &self.inner.context.port().device).finish()
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on `context`'s device.
    ///
    /// # Errors
    /// `Call` when the device refuses (out of resources).
    pub fn new(context: &Context) -> Result<ProtectionDomain, VerbsError> {
        let api = context.inner.api;
        // SAFETY: a live context.
        let raw = unsafe { (api.alloc_pd)(context.inner.raw.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_alloc_pd", 0))?;
        Ok(ProtectionDomain { inner: Arc::new(PdInner { context: context.clone(), raw }) })
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }
}

/// Access rights of a memory region (`IBV_ACCESS_*`), combined with `|`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionAccess(u8);

impl RegionAccess {
    /// The NIC may write it for local work requests: the target of an RDMA READ, of an atomic's
    /// old value, of a received message. Required with `REMOTE_WRITE` and `REMOTE_ATOMIC`.
    pub const LOCAL_WRITE: RegionAccess = RegionAccess(ffi::IBV_ACCESS_LOCAL_WRITE as u8);
    /// Peers may write it (RDMA WRITE).
    pub const REMOTE_WRITE: RegionAccess = RegionAccess(ffi::IBV_ACCESS_REMOTE_WRITE as u8);
    /// Peers may read it (RDMA READ).
    pub const REMOTE_READ: RegionAccess = RegionAccess(ffi::IBV_ACCESS_REMOTE_READ as u8);
    /// Peers may run 8-byte atomics on it.
    pub const REMOTE_ATOMIC: RegionAccess = RegionAccess(ffi::IBV_ACCESS_REMOTE_ATOMIC as u8);
    /// No rights (a source of local sends and writes only).
    pub const NONE: RegionAccess = RegionAccess(0);

    /// Whether every right of `other` is in `self`.
    pub fn contains(self, other: RegionAccess) -> bool {
        self.0 & other.0 == other.0
    }

    fn to_raw(self) -> c_int {
        c_int::from(self.0)
    }
}

impl std::ops::BitOr for RegionAccess {
    type Output = RegionAccess;
    fn bitor(self, other: RegionAccess) -> RegionAccess {
        RegionAccess(self.0 | other.0)
    }
}

/// A peer's region as a plain value: what an RDMA READ, WRITE or atomic names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RemoteRegion {
    /// The region's first byte in the owner's address space.
    pub address: u64,
    /// Its length in bytes.
    pub len_bytes: u64,
    /// The key that grants access.
    pub rkey: u32,
}

impl RemoteRegion {
    /// Checks a descriptor that came from a peer: a length within `REGION_BYTES_MAX` and an
    /// address range that does not wrap.
    ///
    /// # Errors
    /// `InvalidPeer` naming the rule broken.
    pub fn check(&self) -> Result<(), VerbsError> {
        if self.len_bytes == 0 || self.len_bytes > REGION_BYTES_MAX {
            return Err(VerbsError::InvalidPeer { reason: "region length is zero or above REGION_BYTES_MAX" });
        }
        if self.address.checked_add(self.len_bytes).is_none() {
            return Err(VerbsError::InvalidPeer { reason: "region address range wraps" });
        }
        Ok(())
    }

    /// The remote address of `len_bytes` at `offset_bytes`, checked against the region.
    pub(crate) fn address_of(&self, offset_bytes: u64, len_bytes: u64) -> Result<u64, VerbsError> {
        check_range(offset_bytes, len_bytes, self.len_bytes)?;
        self.address.checked_add(offset_bytes).ok_or(VerbsError::InvalidPeer { reason: "region address range wraps" })
    }
}

fn check_range(offset_bytes: u64, len_bytes: u64, region_len_bytes: u64) -> Result<(), VerbsError> {
    match offset_bytes.checked_add(len_bytes) {
        Some(end) if end <= region_len_bytes => Ok(()),
        _ => Err(VerbsError::OutOfBounds { offset_bytes, len_bytes, region_len_bytes }),
    }
}

fn check_aligned(offset_bytes: u64) -> Result<(), VerbsError> {
    if offset_bytes % WORD_BYTES != 0 {
        return Err(VerbsError::Misaligned { offset_bytes });
    }
    Ok(())
}

/// Registered local memory. Cheap to clone (shared); deregistered and unmapped when the last
/// clone and the last work request naming it are gone.
#[derive(Clone)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
}

pub(crate) struct MrInner {
    pub(crate) pd: ProtectionDomain,
    raw: NonNull<IbvMr>,
    pub(crate) lkey: u32,
    rkey: u32,
    pub(crate) address: u64,
    pub(crate) len_bytes: u64,
    pub(crate) access: RegionAccess,
    /// Dropped after `Drop::drop` deregistered the region.
    _memory: Memory,
}

/// The memory behind a registration: its own anonymous mapping, or memory someone else owns
/// (a shared-memory region of the verbs fabric), kept alive by the handle held here.
enum Memory {
    Owned(#[allow(dead_code)] MmapMut),
    Borrowed(#[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>),
}

// SAFETY: the registration is only passed to verbs (thread-safe); the memory is reached only
// through atomic words.
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr, deregistered once. No work request names it any
        // more: each holds an Arc of this region until its completion.
        let _ = unsafe { (self.pd.inner.context.inner.api.dereg_mr)(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryRegion")
            .field("len_bytes", &self.inner.len_bytes)
            .field("access", &self.inner.access)
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates `len_bytes` (a positive multiple of 8) of zeroed, page-aligned memory and
    /// registers it with `access`.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad length, or for `REMOTE_WRITE` / `REMOTE_ATOMIC` without
    /// `LOCAL_WRITE` (verbs requires it); `Call` when the mapping or the registration fails
    /// (e.g. the locked-memory limit, `ulimit -l`).
    pub fn register(pd: &ProtectionDomain, len_bytes: usize, access: RegionAccess) -> Result<MemoryRegion, VerbsError> {
        if len_bytes == 0 || len_bytes as u64 % WORD_BYTES != 0 || len_bytes as u64 > REGION_BYTES_MAX {
            return Err(VerbsError::InvalidArgument {
                reason: "region length must be a positive multiple of 8 within REGION_BYTES_MAX",
            });
        }
        let needs_local_write =
            access.contains(RegionAccess::REMOTE_WRITE) || access.contains(RegionAccess::REMOTE_ATOMIC);
        if needs_local_write && !access.contains(RegionAccess::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument { reason: "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE" });
        }
        let memory =
            MmapMut::map_anon(len_bytes).map_err(|source| VerbsError::Call { call: "mmap (region memory)", source })?;
        let api = pd.inner.context.inner.api;
        // SAFETY: a live protection domain and `len_bytes` of mapped memory that stays mapped
        // until after ibv_dereg_mr (field order of MrInner and its Drop).
        let raw = unsafe {
            (api.reg_mr)(pd.inner.raw.as_ptr(), memory.as_ptr().cast_mut().cast(), len_bytes, access.to_raw())
        };
        let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_reg_mr", 0))?;
        // SAFETY: ibv_reg_mr returned a valid ibv_mr, which lives until ibv_dereg_mr.
        let (lkey, rkey, address) =
            unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey, (*raw.as_ptr()).addr as u64) };
        debug_assert_eq!(address, memory.as_ptr() as u64);
        Ok(MemoryRegion {
            inner: Arc::new(MrInner {
                pd: pd.clone(),
                raw,
                lkey,
                rkey,
                address,
                len_bytes: len_bytes as u64,
                access,
                _memory: Memory::Owned(memory),
            }),
        })
    }

    /// Registers `len_bytes` of memory that `owner` keeps mapped (the verbs fabric's
    /// shared-memory regions: the owner's CPU and the NIC reach the same pages).
    ///
    /// # Safety
    /// `address` must point to `len_bytes` of mapped, 8-aligned memory that stays mapped as long
    /// as `owner` lives, and that memory must only ever be accessed through atomic 8-byte words
    /// (by every thread and process), since the NIC may write any of it at any time.
    ///
    /// # Errors
    /// As [`MemoryRegion::register`].
    pub(crate) unsafe fn register_borrowed(
        pd: &ProtectionDomain,
        address: *mut u8,
        len_bytes: usize,
        access: RegionAccess,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<MemoryRegion, VerbsError> {
        if len_bytes == 0 || len_bytes as u64 % WORD_BYTES != 0 || len_bytes as u64 > REGION_BYTES_MAX {
            return Err(VerbsError::InvalidArgument {
                reason: "region length must be a positive multiple of 8 within REGION_BYTES_MAX",
            });
        }
        if address as u64 % WORD_BYTES != 0 {
            return Err(VerbsError::Misaligned { offset_bytes: address as u64 });
        }
        let needs_local_write =
            access.contains(RegionAccess::REMOTE_WRITE) || access.contains(RegionAccess::REMOTE_ATOMIC);
        if needs_local_write && !access.contains(RegionAccess::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument { reason: "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE" });
        }
        let api = pd.inner.context.inner.api;
        // SAFETY: a live protection domain; the caller promises `len_bytes` of mapped memory at
        // `address` for as long as `owner` lives, and `owner` is dropped only after
        // ibv_dereg_mr (field order of MrInner and its Drop).
        let raw = unsafe { (api.reg_mr)(pd.inner.raw.as_ptr(), address.cast(), len_bytes, access.to_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_reg_mr", 0))?;
        // SAFETY: ibv_reg_mr returned a valid ibv_mr, which lives until ibv_dereg_mr.
        let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
        Ok(MemoryRegion {
            inner: Arc::new(MrInner {
                pd: pd.clone(),
                raw,
                lkey,
                rkey,
                address: address as u64,
                len_bytes: len_bytes as u64,
                access,
                _memory: Memory::Borrowed(owner),
            }),
        })
    }

    /// Its length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.inner.len_bytes
    }

    /// The rights it was registered with.
    pub fn access(&self) -> RegionAccess {
        self.inner.access
    }

    /// The descriptor a peer needs to reach it (useful only if registered with remote rights).
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { address: self.inner.address, len_bytes: self.inner.len_bytes, rkey: self.inner.rkey }
    }

    /// The protection domain it belongs to.
    pub fn protection_domain(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    fn words(&self) -> &[AtomicU64] {
        let words = (self.inner.len_bytes / WORD_BYTES) as usize;
        // SAFETY: the memory at `address` (an owned page-aligned mapping, or borrowed memory
        // whose owner promised 8-alignment) is `len_bytes` long (a multiple of 8) and lives as
        // long as `self.inner`; AtomicU64 has u64's size and alignment and allows the
        // concurrent writes that the NIC and other threads make.
        unsafe { std::slice::from_raw_parts(self.inner.address as *const AtomicU64, words) }
    }

    /// Copies `dst.len()` bytes from `offset_bytes` (8-aligned) with relaxed word loads in no
    /// promised order (the NIC may be writing them: validate what you read).
    ///
    /// # Errors
    /// `Misaligned` or `OutOfBounds`.
    pub fn read(&self, offset_bytes: u64, dst: &mut [u8]) -> Result<(), VerbsError> {
        check_aligned(offset_bytes)?;
        check_range(offset_bytes, dst.len() as u64, self.inner.len_bytes)?;
        let words = &self.words()[(offset_bytes / WORD_BYTES) as usize..];
        for (chunk, word) in dst.chunks_mut(WORD_BYTES as usize).zip(words) {
            let bytes = word.load(Ordering::Relaxed).to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }

    /// Stores `src` at `offset_bytes` (8-aligned) with relaxed word stores in no promised order;
    /// a partial last word is zero-padded.
    ///
    /// # Errors
    /// `Misaligned`, or `OutOfBounds` (the length rounded up to words must fit).
    pub fn write(&self, offset_bytes: u64, src: &[u8]) -> Result<(), VerbsError> {
        check_aligned(offset_bytes)?;
        let padded = (src.len() as u64).div_ceil(WORD_BYTES) * WORD_BYTES;
        check_range(offset_bytes, padded, self.inner.len_bytes)?;
        let words = &self.words()[(offset_bytes / WORD_BYTES) as usize..];
        for (chunk, word) in src.chunks(WORD_BYTES as usize).zip(words) {
            let mut bytes = [0u8; WORD_BYTES as usize];
            bytes[..chunk.len()].copy_from_slice(chunk);
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Atomic load of the word at `offset_bytes` (8-aligned).
    ///
    /// # Errors
    /// `Misaligned` or `OutOfBounds`.
    pub fn load_word(&self, offset_bytes: u64, ordering: LoadOrdering) -> Result<u64, VerbsError> {
        check_aligned(offset_bytes)?;
        check_range(offset_bytes, WORD_BYTES, self.inner.len_bytes)?;
        let ordering = match ordering {
            LoadOrdering::Relaxed => Ordering::Relaxed,
            LoadOrdering::Acquire => Ordering::Acquire,
        };
        Ok(self.words()[(offset_bytes / WORD_BYTES) as usize].load(ordering))
    }

    /// Atomic store of the word at `offset_bytes` (8-aligned).
    ///
    /// # Errors
    /// `Misaligned` or `OutOfBounds`.
    pub fn store_word(&self, offset_bytes: u64, value: u64, ordering: StoreOrdering) -> Result<(), VerbsError> {
        check_aligned(offset_bytes)?;
        check_range(offset_bytes, WORD_BYTES, self.inner.len_bytes)?;
        let ordering = match ordering {
            StoreOrdering::Relaxed => Ordering::Relaxed,
            StoreOrdering::Release => Ordering::Release,
        };
        self.words()[(offset_bytes / WORD_BYTES) as usize].store(value, ordering);
        Ok(())
    }

    /// The local address of `len_bytes` at `offset_bytes`, checked.
    pub(crate) fn local_address(&self, offset_bytes: u64, len_bytes: u64) -> Result<u64, VerbsError> {
        check_range(offset_bytes, len_bytes, self.inner.len_bytes)?;
        Ok(self.inner.address + offset_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_region_is_a_plain_value_that_round_trips() {
        let region = RemoteRegion { address: 0x7f00_dead_0000, len_bytes: 65_536, rkey: 0x1234 };
        let json = serde_json::to_string(&region).expect("serialize");
        assert_eq!(serde_json::from_str::<RemoteRegion>(&json).expect("deserialize"), region);
        region.check().expect("a sane descriptor");
        assert_eq!(region.address_of(8, 8).expect("inside"), 0x7f00_dead_0008);
    }

    #[test]
    fn a_peer_descriptor_out_of_range_is_refused() {
        let empty = RemoteRegion { address: 4096, len_bytes: 0, rkey: 1 };
        assert!(matches!(empty.check(), Err(VerbsError::InvalidPeer { .. })));
        let huge = RemoteRegion { address: 4096, len_bytes: REGION_BYTES_MAX + 8, rkey: 1 };
        assert!(matches!(huge.check(), Err(VerbsError::InvalidPeer { .. })));
        let wraps = RemoteRegion { address: u64::MAX - 7, len_bytes: 16, rkey: 1 };
        assert!(matches!(wraps.check(), Err(VerbsError::InvalidPeer { .. })));
        let region = RemoteRegion { address: 4096, len_bytes: 64, rkey: 1 };
        assert!(matches!(region.address_of(60, 8), Err(VerbsError::OutOfBounds { .. })));
        assert!(matches!(region.address_of(u64::MAX, 8), Err(VerbsError::OutOfBounds { .. })));
    }

    #[test]
    fn access_rights_combine() {
        let access = RegionAccess::LOCAL_WRITE | RegionAccess::REMOTE_READ;
        assert!(access.contains(RegionAccess::REMOTE_READ));
        assert!(access.contains(RegionAccess::LOCAL_WRITE | RegionAccess::REMOTE_READ));
        assert!(!access.contains(RegionAccess::REMOTE_WRITE));
        assert!(access.contains(RegionAccess::NONE));
        assert_eq!(access.to_raw(), 1 | 4);
    }
}
