//! The fabric traits: registered regions and one-sided operations on a peer's memory.
//!
//! # Contract
//! A process *registers* a region of its memory (RDMA: `ibv_reg_mr`) and hands its
//! [`RegionDescriptor`] to peers over a control channel (RDMA: rdma-cm private data). A peer
//! *maps* the descriptor and then reads, writes and runs 8-byte atomics on the region
//! **one-sidedly**: the owner's CPU takes no part and is not told.
//!
//! The split follows the control-path / data-path split of eRPC's transports: [`Fabric`]
//! (register, map; may allocate, open files, fail in many ways) and [`OneSided`] (the data
//! path: generic, no `dyn`, no allocation, only range/alignment/access errors).
//!
//! # What a one-sided operation promises (and what it does not)
//! - 8-byte aligned words are single-copy atomic: a word is never torn. Nothing larger is.
//! - A [`OneSided::read`] can interleave with the owner rewriting the bytes; its words are
//!   loaded in no promised order. Readers must validate what they read (see `slot`).
//! - A [`OneSided::write`] followed by a release [`OneSided::write_word`] to the same region is
//!   seen in that order (like two RDMA writes posted on one reliable connection). The words
//!   inside one write are not ordered among themselves.
//! - Offsets are in bytes and must be 8-aligned; lengths are rounded up to whole words
//!   (a write zero-fills the padding). Our layouts are all word-aligned and word-padded.

pub use crate::error::FabricError;
pub use crate::region::{Access, RegionDescriptor, VerbsRegionInfo};
use crate::words::{LoadOrdering, StoreOrdering, Words};

/// The data path: one-sided operations on a mapped peer region.
///
/// Every method checks range, alignment and access and returns an error value; none panics on
/// bad offsets. All are generic (static dispatch) and allocation-free.
pub trait OneSided {
    /// A peer's region as mapped by this process.
    type RemoteRegion;

    /// Length of a mapped region in bytes.
    fn remote_len_bytes(&self, remote: &Self::RemoteRegion) -> usize;

    /// Reads `dst.len()` bytes at `offset_bytes` (8-aligned). The read may interleave with
    /// writers; its words are atomic but mutually unordered. It ends with an acquire fence.
    fn read(&self, remote: &Self::RemoteRegion, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError>;

    /// Writes `src` at `offset_bytes` (8-aligned), zero-padding a partial last word. Words are
    /// stored relaxed, in no promised order.
    fn write(&self, remote: &Self::RemoteRegion, offset_bytes: usize, src: &[u8]) -> Result<(), FabricError>;

    /// Atomic compare-and-swap of the word at `offset_bytes`; returns the previous value
    /// (the swap happened iff it equals `expected`). Acquire-release.
    fn compare_and_swap(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        expected: u64,
        new: u64,
    ) -> Result<u64, FabricError>;

    /// Atomic wrapping add to the word at `offset_bytes`; returns the previous value.
    /// Acquire-release.
    fn fetch_add(&self, remote: &Self::RemoteRegion, offset_bytes: usize, add: u64) -> Result<u64, FabricError>;

    /// Atomic load of one word. `Acquire` orders every later read of this process after it.
    fn read_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        ordering: LoadOrdering,
    ) -> Result<u64, FabricError>;

    /// Atomic store of one word. `Release` makes every earlier write of this process (to any
    /// region) visible before it: the completion marker of a message is written this way.
    fn write_word(
        &self,
        remote: &Self::RemoteRegion,
        offset_bytes: usize,
        value: u64,
        ordering: StoreOrdering,
    ) -> Result<(), FabricError>;

    /// Wakes the owner's threads blocked on the word at `offset_bytes` (see `ring::Doorbell`).
    /// The one operation that involves the target's CPU, and only because it asked to sleep:
    /// on RDMA this would be a write-with-immediate raising a completion event.
    fn wake(&self, remote: &Self::RemoteRegion, offset_bytes: usize) -> Result<(), FabricError>;

    /// Reads several ranges of one region, `(offset_bytes, dst)` each, as [`OneSided::read`]
    /// would one after another (every range checked the same way; the first error stops).
    /// The default does exactly that. A backend whose reads are round trips (verbs) posts them
    /// all with one doorbell and waits once: one round trip for the lot. The ranges are read
    /// in the order given: on one RDMA reliable connection the responder executes READs in the
    /// order they were posted, so a word read staged first is read before what follows it (as
    /// a sequential reader would read it). Each range ends with the acquire of a `read`.
    fn read_many(&self, remote: &Self::RemoteRegion, reads: &mut [(usize, &mut [u8])]) -> Result<(), FabricError> {
        for (offset_bytes, dst) in reads.iter_mut() {
            self.read(remote, *offset_bytes, dst)?;
        }
        Ok(())
    }

    /// Whether every operation on `remote` is a network round trip whose bytes arrive in no
    /// order (RDMA). Readers of self-verifying layouts (item slots) then read once and rely on
    /// the layout's own checks instead of bracketing the read with loads of its sequence word,
    /// each a round trip of its own. Shared memory: `false` (loads are cheap, and the brackets
    /// are what the seqlock's proof rests on).
    fn reads_are_round_trips(&self, _remote: &Self::RemoteRegion) -> bool {
        false
    }
}

/// The control path: registering local regions and mapping peers' regions.
pub trait Fabric: OneSided {
    /// A region of this process's memory, registered for peers. The owner accesses it as
    /// [`Words`] (it is the CPU-side view, not a one-sided operation).
    type LocalRegion: Words;

    /// Registers `len_bytes` (a positive multiple of 8) of zeroed memory under `name`.
    ///
    /// # Errors
    /// `InvalidRegion` for a bad name or length or a name already registered; `Io` when the
    /// operating system refuses.
    fn register(&self, name: &str, len_bytes: usize, access: Access) -> Result<Self::LocalRegion, FabricError>;

    /// The descriptor that peers need to map `local`.
    fn describe(&self, local: &Self::LocalRegion) -> RegionDescriptor;

    /// Maps a peer's region. A descriptor comes from outside: it is checked, never trusted.
    ///
    /// # Errors
    /// `RegionMissing` if it does not exist, `InvalidRegion` if the descriptor is malformed or
    /// disagrees with the region, `Io` when the operating system refuses.
    fn map(&self, descriptor: &RegionDescriptor) -> Result<Self::RemoteRegion, FabricError>;
}
