//! Memory seen as an array of 64-bit atomic words: the one abstraction that the slot and ring
//! code is written against.
//!
//! # Contract
//! Memory that another process (or the fabric's "remote" side) may write at any moment is
//! never read with `ptr::read` or through `&[u8]`: that would be a data race, undefined
//! behaviour. It is accessed only as 8-byte aligned atomic words, which is also all the
//! atomicity RDMA hardware offers. Three memories implement [`Words`]: [`HeapWords`] (in-process
//! memory, for tests and the in-process fabric), the shared-memory mappings of
//! [`crate::shm`], and, under `cfg(loom)`, a loom-checked memory for the model tests.
//!
//! The byte-level one-sided operations ([`read_bytes`], [`write_bytes`], word operations) are
//! written once here, generic over `Words`, and every fabric backend delegates to them.

use crate::error::FabricError;
use crate::futex::{futex_wait, futex_wake_all};
use crate::limits::WORD_BYTES;
use crate::region::Access;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Ordering of a single-word load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadOrdering {
    /// Atomic (never torn), no ordering with other accesses.
    Relaxed,
    /// Later loads of this thread see at least what the writer had stored before the release
    /// store (or release fence) whose value this load returned.
    Acquire,
}

/// Ordering of a single-word store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOrdering {
    /// Atomic (never torn), no ordering with other accesses.
    Relaxed,
    /// Every store this thread made before becomes visible to a reader that acquires this
    /// value.
    Release,
}

/// A memory fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceOrdering {
    /// Pairs with an earlier relaxed load: later accesses cannot move before it.
    Acquire,
    /// Pairs with a later relaxed store: earlier accesses cannot move after it.
    Release,
    /// Total order with every other sequentially consistent fence (Dekker-style
    /// "store my flag, then load yours", as the doorbell needs).
    SeqCst,
}

/// The body of an `impl Words` that hands every method to the field `$field` (itself
/// [`Words`]): for a region that wraps another one and adds no word behaviour of its own.
macro_rules! delegate_words {
    ($field:ident) => {
        #[inline]
        fn len_words(&self) -> usize {
            self.$field.len_words()
        }
        #[inline]
        fn load(&self, index: usize, ordering: $crate::words::LoadOrdering) -> u64 {
            self.$field.load(index, ordering)
        }
        #[inline]
        fn store(&self, index: usize, value: u64, ordering: $crate::words::StoreOrdering) {
            self.$field.store(index, value, ordering)
        }
        fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
            self.$field.compare_and_swap(index, expected, new)
        }
        fn fetch_add(&self, index: usize, add: u64) -> u64 {
            self.$field.fetch_add(index, add)
        }
        #[inline]
        fn fence(&self, ordering: $crate::words::FenceOrdering) {
            self.$field.fence(ordering)
        }
        fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: std::time::Duration) {
            self.$field.wait_while_equal(index, expected_low, timeout)
        }
        fn wake_all(&self, index: usize) {
            self.$field.wake_all(index)
        }
        fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
            self.$field.copy_out(first_index, dst)
        }
        fn copy_in(&self, first_index: usize, src: &[u8]) {
            self.$field.copy_in(first_index, src)
        }
    };
}
pub(crate) use delegate_words;

/// An array of 64-bit atomic words.
///
/// Indices are in words. Every method panics if `index >= self.len_words()`: callers check
/// ranges first (and return errors for bad input from outside), so a panic here is a bug in
/// this crate, never a reaction to data.
pub trait Words {
    /// Number of words.
    fn len_words(&self) -> usize;
    /// Atomic load of word `index`.
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64;
    /// Atomic store to word `index`.
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering);
    /// Atomic compare-and-swap (acquire-release); returns the previous value.
    fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64;
    /// Atomic wrapping add (acquire-release); returns the previous value.
    fn fetch_add(&self, index: usize, add: u64) -> u64;
    /// A memory fence. A method rather than a free function so that the loom memory can use
    /// loom's fences.
    fn fence(&self, ordering: FenceOrdering);
    /// Blocks while the low 32 bits of word `index` equal `expected_low`, at most `timeout`
    /// (a futex wait: may return early, spuriously; callers re-check their condition).
    fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: Duration);
    /// Wakes every thread, in any process, blocked in `wait_while_equal` on word `index`.
    fn wake_all(&self, index: usize);

    /// Copies words from `first_index` on into `dst` with relaxed loads, in no promised
    /// order; a partial last word contributes its first bytes (little-endian). Panics if the
    /// range leaves the memory. Std-backed memories override this with one range check for
    /// the whole copy (it is the hot loop of every one-sided read).
    fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
        let mut chunks = dst.chunks_exact_mut(WORD_BYTES);
        let mut index = first_index;
        for chunk in chunks.by_ref() {
            chunk.copy_from_slice(&self.load(index, LoadOrdering::Relaxed).to_le_bytes());
            index += 1;
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let word = self.load(index, LoadOrdering::Relaxed).to_le_bytes();
            tail.copy_from_slice(&word[..tail.len()]);
        }
    }

    /// Stores `src` into words from `first_index` on with relaxed stores, in no promised
    /// order; a partial last word is zero-padded. Panics if the range leaves the memory.
    /// Std-backed memories override this with one range check for the whole copy (it is the
    /// hot loop of every one-sided write and every item-slot publication).
    fn copy_in(&self, first_index: usize, src: &[u8]) {
        let mut chunks = src.chunks_exact(WORD_BYTES);
        let mut index = first_index;
        for chunk in chunks.by_ref() {
            self.store(index, word_of(chunk), StoreOrdering::Relaxed);
            index += 1;
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            self.store(index, word_of(tail), StoreOrdering::Relaxed);
        }
    }
}

/// The little-endian word of up to 8 bytes, zero-padded.
#[inline]
fn word_of(bytes: &[u8]) -> u64 {
    let mut word = [0u8; WORD_BYTES];
    word[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(word)
}

impl<T: Words + ?Sized> Words for &T {
    fn len_words(&self) -> usize {
        (**self).len_words()
    }
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
        (**self).load(index, ordering)
    }
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
        (**self).store(index, value, ordering)
    }
    fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
        (**self).compare_and_swap(index, expected, new)
    }
    fn fetch_add(&self, index: usize, add: u64) -> u64 {
        (**self).fetch_add(index, add)
    }
    fn fence(&self, ordering: FenceOrdering) {
        (**self).fence(ordering)
    }
    fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: Duration) {
        (**self).wait_while_equal(index, expected_low, timeout)
    }
    fn wake_all(&self, index: usize) {
        (**self).wake_all(index)
    }
    fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
        (**self).copy_out(first_index, dst)
    }
    fn copy_in(&self, first_index: usize, src: &[u8]) {
        (**self).copy_in(first_index, src)
    }
}

impl<T: Words + ?Sized> Words for Arc<T> {
    fn len_words(&self) -> usize {
        (**self).len_words()
    }
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
        (**self).load(index, ordering)
    }
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
        (**self).store(index, value, ordering)
    }
    fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
        (**self).compare_and_swap(index, expected, new)
    }
    fn fetch_add(&self, index: usize, add: u64) -> u64 {
        (**self).fetch_add(index, add)
    }
    fn fence(&self, ordering: FenceOrdering) {
        (**self).fence(ordering)
    }
    fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: Duration) {
        (**self).wait_while_equal(index, expected_low, timeout)
    }
    fn wake_all(&self, index: usize) {
        (**self).wake_all(index)
    }
    fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
        (**self).copy_out(first_index, dst)
    }
    fn copy_in(&self, first_index: usize, src: &[u8]) {
        (**self).copy_in(first_index, src)
    }
}

#[inline]
pub(crate) fn std_load(word: &AtomicU64, ordering: LoadOrdering) -> u64 {
    // An acquire load is written as a relaxed load plus an acquire fence: the same guarantee,
    // and std documents only small *relaxed* loads as fine on read-only memory, which a client's
    // mapping of a server region is.
    let value = word.load(Ordering::Relaxed);
    if ordering == LoadOrdering::Acquire {
        std::sync::atomic::fence(Ordering::Acquire);
    }
    value
}

#[inline]
pub(crate) fn std_store(word: &AtomicU64, value: u64, ordering: StoreOrdering) {
    let ordering = match ordering {
        StoreOrdering::Relaxed => Ordering::Relaxed,
        StoreOrdering::Release => Ordering::Release,
    };
    word.store(value, ordering);
}

#[inline]
pub(crate) fn std_fence(ordering: FenceOrdering) {
    let ordering = match ordering {
        FenceOrdering::Acquire => Ordering::Acquire,
        FenceOrdering::Release => Ordering::Release,
        FenceOrdering::SeqCst => Ordering::SeqCst,
    };
    std::sync::atomic::fence(ordering);
}

/// Process-local memory: the in-process fabric's regions and the unit tests' memory.
#[derive(Debug)]
pub struct HeapWords {
    words: Box<[AtomicU64]>,
}

impl HeapWords {
    /// `len_words` zeroed words.
    pub fn new(len_words: usize) -> Self {
        Self { words: (0..len_words).map(|_| AtomicU64::new(0)).collect() }
    }
}

impl Words for HeapWords {
    fn len_words(&self) -> usize {
        self.words.len()
    }
    fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
        std_load(&self.words[index], ordering)
    }
    fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
        std_store(&self.words[index], value, ordering)
    }
    fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
        match self.words[index].compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(previous) | Err(previous) => previous,
        }
    }
    fn fetch_add(&self, index: usize, add: u64) -> u64 {
        self.words[index].fetch_add(add, Ordering::AcqRel)
    }
    fn fence(&self, ordering: FenceOrdering) {
        std_fence(ordering)
    }
    fn wait_while_equal(&self, index: usize, expected_low: u32, timeout: Duration) {
        futex_wait(&self.words[index], expected_low, timeout)
    }
    fn wake_all(&self, index: usize) {
        futex_wake_all(&self.words[index])
    }
    fn copy_out(&self, first_index: usize, dst: &mut [u8]) {
        copy_out_atomics(&self.words, first_index, dst)
    }
    fn copy_in(&self, first_index: usize, src: &[u8]) {
        copy_in_atomics(&self.words, first_index, src)
    }
}

/// Rounds `bytes` up to a whole number of words.
pub const fn padded_bytes(bytes: usize) -> usize {
    bytes.div_ceil(WORD_BYTES) * WORD_BYTES
}

/// Checks that `len_bytes` (rounded up to words) at `offset_bytes` lies inside `words` and that
/// the offset is word-aligned; returns the first word index.
pub fn check_range<W: Words + ?Sized>(words: &W, offset_bytes: usize, len_bytes: usize) -> Result<usize, FabricError> {
    if offset_bytes % WORD_BYTES != 0 {
        return Err(FabricError::Misaligned { offset_bytes: offset_bytes as u64 });
    }
    let region_len_bytes = words.len_words() * WORD_BYTES;
    let end_bytes = offset_bytes.checked_add(padded_bytes(len_bytes));
    match end_bytes {
        Some(end_bytes) if end_bytes <= region_len_bytes => Ok(offset_bytes / WORD_BYTES),
        _ => Err(FabricError::OutOfBounds {
            offset_bytes: offset_bytes as u64,
            len_bytes: len_bytes as u64,
            region_len_bytes: region_len_bytes as u64,
        }),
    }
}

/// `Words::copy_out` over a slice of std atomics: one range check, then a tight loop that
/// loads four words into registers and stores them as one 32-byte block (relaxed atomic loads
/// are never merged or vectorised by the compiler, so the unrolling is done by hand).
pub(crate) fn copy_out_atomics(words: &[AtomicU64], first_index: usize, dst: &mut [u8]) {
    const BLOCK_WORDS: usize = 4;
    let words = &words[first_index..first_index + dst.len().div_ceil(WORD_BYTES)];
    let mut blocks = dst.chunks_exact_mut(BLOCK_WORDS * WORD_BYTES);
    let mut sources = words.chunks_exact(BLOCK_WORDS);
    for (block, source) in blocks.by_ref().zip(sources.by_ref()) {
        let loaded: [u64; BLOCK_WORDS] = std::array::from_fn(|i| source[i].load(Ordering::Relaxed));
        for (chunk, word) in block.chunks_exact_mut(WORD_BYTES).zip(loaded) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
    }
    let rest = blocks.into_remainder();
    let rest_words = &words[words.len() - rest.len().div_ceil(WORD_BYTES)..];
    let mut chunks = rest.chunks_exact_mut(WORD_BYTES);
    for (chunk, word) in chunks.by_ref().zip(rest_words) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    let tail = chunks.into_remainder();
    if let Some(last) = rest_words.last().filter(|_| !tail.is_empty()) {
        tail.copy_from_slice(&last.load(Ordering::Relaxed).to_le_bytes()[..tail.len()]);
    }
}

/// `Words::copy_in` over a slice of std atomics: one range check, then relaxed stores in a
/// tight loop (a partial last word zero-padded).
pub(crate) fn copy_in_atomics(words: &[AtomicU64], first_index: usize, src: &[u8]) {
    let words = &words[first_index..first_index + src.len().div_ceil(WORD_BYTES)];
    let mut chunks = src.chunks_exact(WORD_BYTES);
    for (word, chunk) in words.iter().zip(chunks.by_ref()) {
        word.store(word_of(chunk), Ordering::Relaxed);
    }
    let tail = chunks.remainder();
    if let Some(last) = words.last().filter(|_| !tail.is_empty()) {
        last.store(word_of(tail), Ordering::Relaxed);
    }
}

/// One-sided read: relaxed word loads into `dst`, then an acquire fence (as an RDMA read's
/// completion makes the data visible to the CPU that polled it).
///
/// `offset_bytes` must be 8-aligned; `dst.len()` need not be a multiple of 8, but the range
/// checked is rounded up to whole words. The words are loaded in no promised order: callers
/// must not rely on it (real RDMA does not order the bytes of one read either).
pub fn read_bytes<W: Words + ?Sized>(words: &W, offset_bytes: usize, dst: &mut [u8]) -> Result<(), FabricError> {
    let first_index = check_range(words, offset_bytes, dst.len())?;
    words.copy_out(first_index, dst);
    words.fence(FenceOrdering::Acquire);
    Ok(())
}

/// One-sided write: relaxed word stores of `src`, the last partial word zero-padded.
///
/// No ordering among the words; to publish data, follow the write with a release
/// [`write_word`] (a second write on the same connection, which RDMA does order).
pub fn write_bytes<W: Words + ?Sized>(
    words: &W,
    access: Access,
    offset_bytes: usize,
    src: &[u8],
) -> Result<(), FabricError> {
    check_writable(access)?;
    let first_index = check_range(words, offset_bytes, src.len())?;
    words.copy_in(first_index, src);
    Ok(())
}

/// One-sided atomic load of one word.
pub fn read_word<W: Words + ?Sized>(
    words: &W,
    offset_bytes: usize,
    ordering: LoadOrdering,
) -> Result<u64, FabricError> {
    let index = check_range(words, offset_bytes, WORD_BYTES)?;
    Ok(words.load(index, ordering))
}

/// One-sided atomic store of one word.
pub fn write_word<W: Words + ?Sized>(
    words: &W,
    access: Access,
    offset_bytes: usize,
    value: u64,
    ordering: StoreOrdering,
) -> Result<(), FabricError> {
    check_writable(access)?;
    let index = check_range(words, offset_bytes, WORD_BYTES)?;
    words.store(index, value, ordering);
    Ok(())
}

/// One-sided compare-and-swap of one word; returns the previous value.
pub fn compare_and_swap<W: Words + ?Sized>(
    words: &W,
    access: Access,
    offset_bytes: usize,
    expected: u64,
    new: u64,
) -> Result<u64, FabricError> {
    check_writable(access)?;
    let index = check_range(words, offset_bytes, WORD_BYTES)?;
    Ok(words.compare_and_swap(index, expected, new))
}

/// One-sided fetch-and-add of one word; returns the previous value.
pub fn fetch_add<W: Words + ?Sized>(
    words: &W,
    access: Access,
    offset_bytes: usize,
    add: u64,
) -> Result<u64, FabricError> {
    check_writable(access)?;
    let index = check_range(words, offset_bytes, WORD_BYTES)?;
    Ok(words.fetch_add(index, add))
}

/// Wakes the waiters of one word (the doorbell's "interrupt").
pub fn wake<W: Words + ?Sized>(words: &W, access: Access, offset_bytes: usize) -> Result<(), FabricError> {
    check_writable(access)?;
    let index = check_range(words, offset_bytes, WORD_BYTES)?;
    words.wake_all(index);
    Ok(())
}

pub(crate) fn check_writable(access: Access) -> Result<(), FabricError> {
    match access {
        Access::ReadWrite => Ok(()),
        Access::ReadOnly => Err(FabricError::NoWriteAccess),
    }
}

/// Loom-checked memory for the model tests: same contract, loom's atomics and fences.
#[cfg(all(test, loom))]
pub(crate) mod loom_words {
    use super::{FenceOrdering, LoadOrdering, StoreOrdering, Words};
    use loom::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[derive(Debug)]
    pub(crate) struct LoomWords {
        words: Vec<AtomicU64>,
    }

    impl LoomWords {
        pub(crate) fn new(len_words: usize) -> Self {
            Self { words: (0..len_words).map(|_| AtomicU64::new(0)).collect() }
        }
    }

    impl Words for LoomWords {
        fn len_words(&self) -> usize {
            self.words.len()
        }
        fn load(&self, index: usize, ordering: LoadOrdering) -> u64 {
            let value = self.words[index].load(Ordering::Relaxed);
            if ordering == LoadOrdering::Acquire {
                loom::sync::atomic::fence(Ordering::Acquire);
            }
            value
        }
        fn store(&self, index: usize, value: u64, ordering: StoreOrdering) {
            let ordering = match ordering {
                StoreOrdering::Relaxed => Ordering::Relaxed,
                StoreOrdering::Release => Ordering::Release,
            };
            self.words[index].store(value, ordering)
        }
        fn compare_and_swap(&self, index: usize, expected: u64, new: u64) -> u64 {
            match self.words[index].compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(previous) | Err(previous) => previous,
            }
        }
        fn fetch_add(&self, index: usize, add: u64) -> u64 {
            self.words[index].fetch_add(add, Ordering::AcqRel)
        }
        fn fence(&self, ordering: FenceOrdering) {
            let ordering = match ordering {
                FenceOrdering::Acquire => Ordering::Acquire,
                FenceOrdering::Release => Ordering::Release,
                FenceOrdering::SeqCst => Ordering::SeqCst,
            };
            loom::sync::atomic::fence(ordering)
        }
        fn wait_while_equal(&self, _index: usize, _expected_low: u32, _timeout: Duration) {
            loom::thread::yield_now();
        }
        fn wake_all(&self, _index: usize) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_bytes_handles_an_unaligned_tail_and_rounds_the_range_up() {
        let words = HeapWords::new(3);
        write_bytes(&words, Access::ReadWrite, 0, b"0123456789abc").unwrap();
        // The 3 bytes after "abc" in word 1 were zero-padded by the write.
        assert_eq!(words.load(1, LoadOrdering::Relaxed), u64::from_le_bytes(*b"89abc\0\0\0"));
        let mut dst = [0xFFu8; 11];
        read_bytes(&words, 0, &mut dst).unwrap();
        assert_eq!(&dst, b"0123456789a");
        // 17 bytes at offset 8 round up to 24 bytes: past the 24-byte region.
        let mut big = [0u8; 17];
        assert!(matches!(read_bytes(&words, 8, &mut big), Err(FabricError::OutOfBounds { .. })));
        assert!(matches!(read_bytes(&words, 4, &mut dst), Err(FabricError::Misaligned { offset_bytes: 4 })));
        assert!(matches!(read_bytes(&words, usize::MAX - 7, &mut dst), Err(FabricError::OutOfBounds { .. })));
    }

    #[test]
    fn writes_and_atomics_need_write_access() {
        let words = HeapWords::new(1);
        assert!(matches!(
            write_word(&words, Access::ReadOnly, 0, 1, StoreOrdering::Relaxed),
            Err(FabricError::NoWriteAccess)
        ));
        assert!(matches!(fetch_add(&words, Access::ReadOnly, 0, 1), Err(FabricError::NoWriteAccess)));
        assert_eq!(compare_and_swap(&words, Access::ReadWrite, 0, 0, 7).unwrap(), 0);
        assert_eq!(compare_and_swap(&words, Access::ReadWrite, 0, 0, 9).unwrap(), 7);
        assert_eq!(fetch_add(&words, Access::ReadWrite, 0, 3).unwrap(), 7);
        assert_eq!(read_word(&words, 0, LoadOrdering::Acquire).unwrap(), 10);
    }
}
