//! Item slots: the latest committed version of a key, published by the server in a registered
//! region and read by clients with one-sided reads (the paper's GET\*).
//!
//! # Format
//! A slot starts at an 8-aligned offset and occupies `slot_bytes(key, metadata, value)` bytes
//! of its fixed capacity. All integers are little-endian.
//! ```text
//! offset          size  field
//! 0               8     seq: even = stable, odd = being written (bumped twice per write)
//! 8               8     ts: timestamp of the version
//! 16              8     flags: bit 0 NEWER_PREPARED (a newer version is prepared: prefer GET+),
//!                              bit 1 VALID (the slot holds a version); other bits zero
//! 24              4     key_len (bytes)
//! 28              4     value_len (bytes)
//! 32              4     metadata_len (bytes)
//! 36              4     reserved, zero
//! 40              8     expiry: when the version stops being visible (rampkv's `Expiry`
//!                       word: a deadline in ms since the Unix epoch, 0 never; bit 63 set on
//!                       a version whose value the server reclaimed); opaque to this module
//! 48              K     key, zero-padded to K = pad8(key_len)
//! 48+K            M     metadata, zero-padded to M = pad8(metadata_len)
//! 48+K+M          V     value, zero-padded to V = pad8(value_len)
//! 48+K+M+V        8     checksum: XXH3-64 of bytes [0, 24) (seq, ts, flags with bit 0
//!                       cleared) XOR XXH3-64 of bytes [24, 48+K+M+V) (lengths, expiry,
//!                       key, metadata, value)
//! 56+K+M+V        8     seq copy: equal to the seq word of a completed write
//! ```
//!
//! # Protocol (a seqlock, after Linux's and Hans Boehm's "Can seqlocks get along with
//! programming language memory models?")
//! Writer (the server, one writer per slot): `seq := odd` (relaxed); **release fence**; every
//! other word (relaxed); `seq := even` (**release** store).
//! Reader: `s1 := seq` (**acquire**); if odd, retry; read the whole capacity (relaxed words,
//! then an **acquire fence**); `s2 := seq` (relaxed); accept only if `s1 == s2`, the image's
//! seq and its trailer copy equal `s1`, the checksum matches, the slot is valid and its key is
//! the one asked for. Otherwise retry, at most `SLOT_READ_ATTEMPTS_MAX` times, then report
//! `Torn` so that the caller falls back to GET+.
//!
//! Why this is enough on shared memory: if any word the reader loaded was stored by a later
//! write W', that store follows W''s release fence, so the reader's acquire fence synchronises
//! with it and W''s odd `seq` store happens-before `s2`: `s2 != s1`. If `s1` read the even
//! `seq` of write W (a release store), all of W's words happen-before the reader's loads. So
//! an accepted image is exactly one write's.
//! Why the checksum and trailer as well: real RDMA neither orders the bytes of one read nor
//! lets `s1`/`s2` be free (each is a round trip), so a verbs backend reads the slot once and
//! depends on the trailer copy and the checksum. Both are checked here too, so the format and
//! the reader are the same on both backends.

use crate::fabric::{FabricError, OneSided};
use crate::limits::{SLOT_BYTES_MAX, SLOT_READ_ATTEMPTS_MAX, WORD_BYTES};
use crate::words::{check_range, padded_bytes, FenceOrdering, LoadOrdering, StoreOrdering, Words};
use std::ops::Range;

/// Byte offset of the sequence word.
pub const SLOT_SEQ_OFFSET_BYTES: usize = 0;
/// Byte offset of the timestamp.
pub const SLOT_TS_OFFSET_BYTES: usize = 8;
/// Byte offset of the flags word.
pub const SLOT_FLAGS_OFFSET_BYTES: usize = 16;
/// Byte offset of the key length (u32).
pub const SLOT_KEY_LEN_OFFSET_BYTES: usize = 24;
/// Where the lengths start: the checksum hashes the header words before it (seq, ts, flags)
/// apart from everything after.
const SLOT_LENGTHS_OFFSET_BYTES: usize = SLOT_KEY_LEN_OFFSET_BYTES;
/// Byte offset of the value length (u32).
pub const SLOT_VALUE_LEN_OFFSET_BYTES: usize = 28;
/// Byte offset of the metadata length (u32).
pub const SLOT_METADATA_LEN_OFFSET_BYTES: usize = 32;
/// Byte offset of the reserved u32 (zero).
pub const SLOT_RESERVED_OFFSET_BYTES: usize = 36;
/// Byte offset of the expiry word (u64).
pub const SLOT_EXPIRY_OFFSET_BYTES: usize = 40;
/// Bytes before the key.
pub const SLOT_HEADER_BYTES: usize = 48;
/// Bytes of the trailer (checksum, seq copy).
pub const SLOT_TRAILER_BYTES: usize = 16;
/// Smallest slot (empty key, metadata and value).
pub const SLOT_BYTES_MIN: usize = SLOT_HEADER_BYTES + SLOT_TRAILER_BYTES;

/// Flag bit: a newer version of this key is prepared (the paper's "invalid bit"): the version
/// in the slot is still the latest committed one, but a reader that wants fresh data should
/// ask the server (GET+).
pub const SLOT_FLAG_NEWER_PREPARED: u64 = 1 << 0;
/// Flag bit: the slot holds a version (a cleared slot is not valid).
pub const SLOT_FLAG_VALID: u64 = 1 << 1;
const SLOT_FLAGS_KNOWN: u64 = SLOT_FLAG_NEWER_PREPARED | SLOT_FLAG_VALID;

const SEQ_INDEX: usize = SLOT_SEQ_OFFSET_BYTES / WORD_BYTES;
const FLAGS_INDEX: usize = SLOT_FLAGS_OFFSET_BYTES / WORD_BYTES;

/// Bytes a slot with these lengths occupies (header, padded fields, trailer).
pub const fn slot_bytes(key_len: usize, metadata_len: usize, value_len: usize) -> usize {
    SLOT_HEADER_BYTES
        + padded_bytes(key_len)
        + padded_bytes(metadata_len)
        + padded_bytes(value_len)
        + SLOT_TRAILER_BYTES
}

/// Where the fields of a slot lie, relative to its start.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SlotLayout {
    key: Range<usize>,
    metadata: Range<usize>,
    value: Range<usize>,
    checksum_offset_bytes: usize,
    total_bytes: usize,
}

impl SlotLayout {
    fn new(key_len: usize, metadata_len: usize, value_len: usize) -> Self {
        let key_start = SLOT_HEADER_BYTES;
        let metadata_start = key_start + padded_bytes(key_len);
        let value_start = metadata_start + padded_bytes(metadata_len);
        let checksum_offset_bytes = value_start + padded_bytes(value_len);
        Self {
            key: key_start..key_start + key_len,
            metadata: metadata_start..metadata_start + metadata_len,
            value: value_start..value_start + value_len,
            checksum_offset_bytes,
            total_bytes: checksum_offset_bytes + SLOT_TRAILER_BYTES,
        }
    }
}

/// The slot checksum of an image's bytes before the trailer: XXH3-64 of the header's first
/// three words (seq, ts, flags without the newer-prepared bit) XOR XXH3-64 of the rest
/// (lengths, key, metadata, value). Split so that the writer can change seq and flags without
/// hashing or even reading the body again: it recovers the body's hash from the stored
/// checksum ([`SlotWriter::set_flags`]). The newer-prepared bit is left out because it is set
/// by one store outside the seqlock ([`SlotWriter::mark_newer_prepared`]).
fn checksum(image: &[u8]) -> u64 {
    let head = |offset_bytes| word_at(image, offset_bytes);
    head_hash_of(head(SLOT_SEQ_OFFSET_BYTES), head(SLOT_TS_OFFSET_BYTES), head(SLOT_FLAGS_OFFSET_BYTES))
        ^ xxhash_rust::xxh3::xxh3_64(&image[SLOT_LENGTHS_OFFSET_BYTES..])
}

/// XXH3-64 of the header's seq, ts and flags words (24 bytes), the newer-prepared bit cleared.
fn head_hash_of(seq: u64, ts: u64, flags: u64) -> u64 {
    let mut head = [0u8; SLOT_LENGTHS_OFFSET_BYTES];
    head[..8].copy_from_slice(&seq.to_le_bytes());
    head[8..16].copy_from_slice(&ts.to_le_bytes());
    head[16..].copy_from_slice(&(flags & !SLOT_FLAG_NEWER_PREPARED).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&head)
}

fn word_at(image: &[u8], offset_bytes: usize) -> u64 {
    let mut word = [0u8; WORD_BYTES];
    word.copy_from_slice(&image[offset_bytes..offset_bytes + WORD_BYTES]);
    u64::from_le_bytes(word)
}

fn u32_at(image: &[u8], offset_bytes: usize) -> u32 {
    let mut half = [0u8; 4];
    half.copy_from_slice(&image[offset_bytes..offset_bytes + 4]);
    u32::from_le_bytes(half)
}

/// Errors of the slot writer (server side). All are caller errors: nothing was written.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SlotWriteError {
    /// The version does not fit the slot's capacity (or the writer's buffer).
    #[error("slot of {slot_bytes} bytes exceeds capacity {capacity_bytes}")]
    TooLarge {
        /// Bytes the version needs.
        slot_bytes: usize,
        /// Bytes available.
        capacity_bytes: usize,
    },
    /// A capacity that is not a multiple of 8, below `SLOT_BYTES_MIN` or above
    /// `SLOT_BYTES_MAX`.
    #[error("invalid slot capacity {capacity_bytes}")]
    InvalidCapacity {
        /// The capacity given.
        capacity_bytes: usize,
    },
    /// Flag bits this format does not define.
    #[error("unknown slot flags {flags:#x}")]
    UnknownFlags {
        /// The flags given.
        flags: u64,
    },
    /// `set_flags` on a slot that was never published, or whose stored lengths exceed its
    /// capacity.
    #[error("slot holds no consistent version")]
    NotPublished,
    /// The slot range is misaligned or outside the region.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Why a slot read did not return a version. Every variant is an expected outcome on the hot
/// path; the usual reaction is to evict the address-cache entry and fall back to GET+.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SlotReadError {
    /// Every attempt overlapped a write (odd or changed seq, trailer or checksum mismatch).
    #[error("slot torn in all {attempts} attempts")]
    Torn {
        /// Attempts made.
        attempts: u32,
    },
    /// The slot holds another key (slots are reused).
    #[error("slot holds another key")]
    WrongKey,
    /// The slot holds no version (never published, or cleared).
    #[error("slot holds no valid version")]
    NotValid,
    /// The stored lengths exceed the capacity the reader was told.
    #[error("slot of {slot_bytes} bytes exceeds capacity {capacity_bytes}")]
    TooLarge {
        /// Bytes the stored lengths imply.
        slot_bytes: usize,
        /// Capacity given to the reader.
        capacity_bytes: usize,
    },
    /// A stable, checksummed slot with undefined flag bits or a non-zero reserved field.
    #[error("slot has undefined flags {flags:#x} or reserved bits set")]
    Corrupt {
        /// The flags word.
        flags: u64,
    },
    /// A capacity that is not a multiple of 8 or outside `SLOT_BYTES_MIN..=SLOT_BYTES_MAX`,
    /// or a buffer shorter than it.
    #[error("invalid capacity {capacity_bytes} or buffer of {buffer_bytes} bytes")]
    InvalidCapacity {
        /// Capacity given.
        capacity_bytes: usize,
        /// Buffer length given.
        buffer_bytes: usize,
    },
    /// The slot range is misaligned or outside the region.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

fn valid_capacity(capacity_bytes: usize) -> bool {
    capacity_bytes % WORD_BYTES == 0 && (SLOT_BYTES_MIN..=SLOT_BYTES_MAX).contains(&capacity_bytes)
}

/// Publishes versions into slots of a local region. Owns a scratch buffer (allocated once) in
/// which it assembles the slot image before storing it.
#[derive(Debug)]
pub struct SlotWriter {
    image: Vec<u8>,
}

impl SlotWriter {
    /// A writer for slots of up to `slot_bytes_max` bytes (capped at `SLOT_BYTES_MAX`).
    pub fn new(slot_bytes_max: usize) -> Self {
        Self { image: vec![0; padded_bytes(slot_bytes_max.min(SLOT_BYTES_MAX))] }
    }

    /// Writes a version into the slot at `offset_bytes` of capacity `capacity_bytes`, under the
    /// seqlock; returns the new (even) sequence number.
    ///
    /// # Errors
    /// `TooLarge`, `InvalidCapacity`, `UnknownFlags`, or `Fabric` for a bad range; in every
    /// case nothing was written.
    pub fn publish<W: Words + ?Sized>(
        &mut self,
        region: &W,
        offset_bytes: usize,
        capacity_bytes: usize,
        key: &[u8],
        ts: u64,
        expiry: u64,
        metadata: &[u8],
        value: &[u8],
        flags: u64,
    ) -> Result<u64, SlotWriteError> {
        let first_index = self.check_target(region, offset_bytes, capacity_bytes, flags)?;
        let layout = SlotLayout::new(key.len(), metadata.len(), value.len());
        if layout.total_bytes > capacity_bytes || layout.total_bytes > self.image.len() {
            return Err(SlotWriteError::TooLarge {
                slot_bytes: layout.total_bytes,
                capacity_bytes: capacity_bytes.min(self.image.len()),
            });
        }
        let lengths_fit = [key.len(), metadata.len(), value.len()].iter().all(|&len| u32::try_from(len).is_ok());
        debug_assert!(lengths_fit, "lengths below SLOT_BYTES_MAX fit in u32");
        let seq = next_seq(region.load(first_index + SEQ_INDEX, LoadOrdering::Relaxed));
        let image = &mut self.image[..layout.total_bytes];
        image[0..8].copy_from_slice(&seq.to_le_bytes());
        image[8..16].copy_from_slice(&ts.to_le_bytes());
        image[16..24].copy_from_slice(&flags.to_le_bytes());
        image[24..28].copy_from_slice(&(key.len() as u32).to_le_bytes());
        image[28..32].copy_from_slice(&(value.len() as u32).to_le_bytes());
        image[32..36].copy_from_slice(&(metadata.len() as u32).to_le_bytes());
        image[36..40].fill(0);
        image[40..48].copy_from_slice(&expiry.to_le_bytes());
        // Each field is followed by its zero padding (the scratch buffer holds older images).
        for (field, bytes) in [(&layout.key, key), (&layout.metadata, metadata), (&layout.value, value)] {
            image[field.clone()].copy_from_slice(bytes);
            image[field.end..field.start + padded_bytes(bytes.len())].fill(0);
        }
        seal(image, &layout, seq);
        write_locked(region, first_index, seq, |region| region.copy_in(first_index + 1, &image[WORD_BYTES..]));
        Ok(seq)
    }

    /// Replaces the flags of the version in the slot (e.g. clears `SLOT_FLAG_VALID` to
    /// invalidate it), under the seqlock and with a fresh checksum; returns the new sequence
    /// number. (A PREPARE's newer-prepared mark is [`SlotWriter::mark_newer_prepared`].)
    ///
    /// Reads five words of the slot, not its body: the body's hash is the stored checksum with
    /// the old head's hash taken out ([`checksum`]), so the new checksum needs only the new
    /// head's. Stores flags, checksum and seq copy.
    ///
    /// # Errors
    /// `NotPublished` if the slot holds no version; otherwise as `publish`.
    pub fn set_flags<W: Words + ?Sized>(
        &mut self,
        region: &W,
        offset_bytes: usize,
        capacity_bytes: usize,
        flags: u64,
    ) -> Result<u64, SlotWriteError> {
        let first_index = self.check_target(region, offset_bytes, capacity_bytes, flags)?;
        let capacity = capacity_bytes.min(self.image.len());
        // Only this writer stores into the slot, so relaxed loads of it return our own last
        // stores: one consistent image.
        let load = |byte_offset: usize| region.load(first_index + byte_offset / WORD_BYTES, LoadOrdering::Relaxed);
        let current_seq = load(SLOT_SEQ_OFFSET_BYTES);
        let (lengths, metadata_len) = (load(SLOT_KEY_LEN_OFFSET_BYTES), load(SLOT_METADATA_LEN_OFFSET_BYTES));
        let layout = SlotLayout::new(
            (lengths & 0xffff_ffff) as usize,
            (metadata_len & 0xffff_ffff) as usize,
            (lengths >> 32) as usize,
        );
        if current_seq == 0 || layout.total_bytes > capacity {
            return Err(SlotWriteError::NotPublished);
        }
        let (ts, old_flags) = (load(SLOT_TS_OFFSET_BYTES), load(SLOT_FLAGS_OFFSET_BYTES));
        let body_hash = load(layout.checksum_offset_bytes) ^ head_hash_of(current_seq, ts, old_flags);
        let seq = next_seq(current_seq);
        let checksum = body_hash ^ head_hash_of(seq, ts, flags);
        let trailer_index = first_index + layout.checksum_offset_bytes / WORD_BYTES;
        write_locked(region, first_index, seq, |region| {
            region.store(first_index + FLAGS_INDEX, flags, StoreOrdering::Relaxed);
            region.store(trailer_index, checksum, StoreOrdering::Relaxed);
            region.store(trailer_index + 1, seq, StoreOrdering::Relaxed);
        });
        Ok(seq)
    }

    /// Sets `SLOT_FLAG_NEWER_PREPARED` on the valid version in the slot (a PREPARE of a newer
    /// one) with one store of the flags word, outside the seqlock: the bit is advisory and
    /// outside the checksum, so a reader racing the store sees the slot with or without it, both
    /// whole versions. No reader retries, and the store touches one cache line.
    ///
    /// # Errors
    /// `NotPublished` if the slot holds no valid version; `InvalidCapacity` or `Fabric` for a
    /// bad range.
    pub fn mark_newer_prepared<W: Words + ?Sized>(
        &mut self,
        region: &W,
        offset_bytes: usize,
        capacity_bytes: usize,
    ) -> Result<(), SlotWriteError> {
        let first_index = self.check_target(region, offset_bytes, capacity_bytes, SLOT_FLAG_VALID)?;
        let flags = region.load(first_index + FLAGS_INDEX, LoadOrdering::Relaxed);
        if region.load(first_index + SEQ_INDEX, LoadOrdering::Relaxed) == 0 || flags & SLOT_FLAG_VALID == 0 {
            return Err(SlotWriteError::NotPublished);
        }
        region.store(first_index + FLAGS_INDEX, flags | SLOT_FLAG_NEWER_PREPARED, StoreOrdering::Relaxed);
        Ok(())
    }

    fn check_target<W: Words + ?Sized>(
        &self,
        region: &W,
        offset_bytes: usize,
        capacity_bytes: usize,
        flags: u64,
    ) -> Result<usize, SlotWriteError> {
        if flags & !SLOT_FLAGS_KNOWN != 0 {
            return Err(SlotWriteError::UnknownFlags { flags });
        }
        if !valid_capacity(capacity_bytes) {
            return Err(SlotWriteError::InvalidCapacity { capacity_bytes });
        }
        Ok(check_range(region, offset_bytes, capacity_bytes)?)
    }
}

/// The even sequence number that follows `current` (odd only if a write of this writer was
/// interrupted, which the single-writer rule excludes; skip past it all the same).
fn next_seq(current: u64) -> u64 {
    (current | 1).wrapping_add(1)
}

/// Fills in the checksum and seq copy of a slot image whose seq word is `seq`.
fn seal(image: &mut [u8], layout: &SlotLayout, seq: u64) {
    let offset = layout.checksum_offset_bytes;
    let sum = checksum(&image[..offset]);
    image[offset..offset + WORD_BYTES].copy_from_slice(&sum.to_le_bytes());
    image[offset + WORD_BYTES..offset + 2 * WORD_BYTES].copy_from_slice(&seq.to_le_bytes());
}

/// The writer side of the seqlock: `seq` odd (relaxed), release fence, `store_body`, `seq` even
/// (release). `final_seq` is the even value the slot ends with.
///
/// The release fence after the odd store is what makes a reader that saw *any* of the new
/// body words also see the odd `seq` (see the module docs); a release store of the odd value
/// would not do it, because release orders only what comes *before* the store.
fn write_locked<W: Words + ?Sized>(region: &W, first_index: usize, final_seq: u64, store_body: impl FnOnce(&W)) {
    debug_assert!(final_seq % 2 == 0);
    region.store(first_index + SEQ_INDEX, final_seq.wrapping_sub(1), StoreOrdering::Relaxed);
    region.fence(FenceOrdering::Release);
    store_body(region);
    region.store(first_index + SEQ_INDEX, final_seq, StoreOrdering::Release);
}

/// The reader side of the seqlock over a whole image (the loom model of the bare seqlock uses
/// it; `read_slot` uses [`read_stable_used`]): reads `image.len()` bytes of the slot at `offset_bytes`
/// between two reads of `seq`; returns `Some(seq)` if both were equal and even, so the image is
/// one write's (on shared memory; see the module docs for RDMA).
#[cfg(all(test, loom))]
fn read_stable<F: OneSided>(
    fabric: &F,
    remote: &F::RemoteRegion,
    offset_bytes: usize,
    image: &mut [u8],
) -> Result<Option<u64>, FabricError> {
    let before = fabric.read_word(remote, offset_bytes, LoadOrdering::Acquire)?;
    if before % 2 == 1 {
        return Ok(None);
    }
    fabric.read(remote, offset_bytes, image)?; // ends with an acquire fence
    let after = fabric.read_word(remote, offset_bytes, LoadOrdering::Relaxed)?;
    Ok((after == before).then_some(before))
}

/// [`read_stable`], reading only the bytes the slot's version occupies rather than the whole
/// capacity: the 48-byte header first, then (from the lengths in it) the rest up to the end of
/// the trailer. Lengths that exceed `image.len()` (torn, or a real overflow) make it read the
/// whole image, so that the verdict is the same as a whole-capacity read's. Returns the seq and
/// the bytes read (`image[..bytes]` is the image to verify).
///
/// The seqlock argument is unchanged: every load, header or body, comes between the acquire
/// load of `s1` and the acquire fence that ends the second read, and `s2` follows that fence.
fn read_stable_used<F: OneSided>(
    fabric: &F,
    remote: &F::RemoteRegion,
    offset_bytes: usize,
    image: &mut [u8],
) -> Result<Option<(u64, usize)>, FabricError> {
    let before = fabric.read_word(remote, offset_bytes, LoadOrdering::Acquire)?;
    if before % 2 == 1 {
        return Ok(None);
    }
    fabric.read(remote, offset_bytes, &mut image[..SLOT_HEADER_BYTES])?;
    let used = SlotLayout::new(
        u32_at(image, SLOT_KEY_LEN_OFFSET_BYTES) as usize,
        u32_at(image, SLOT_METADATA_LEN_OFFSET_BYTES) as usize,
        u32_at(image, SLOT_VALUE_LEN_OFFSET_BYTES) as usize,
    )
    .total_bytes;
    let bytes = if used <= image.len() { used } else { image.len() };
    fabric.read(remote, offset_bytes + SLOT_HEADER_BYTES, &mut image[SLOT_HEADER_BYTES..bytes])?; // acquire fence
    let after = fabric.read_word(remote, offset_bytes, LoadOrdering::Relaxed)?;
    Ok((after == before).then_some((before, bytes)))
}

/// The whole capacity in one read, for a backend whose reads are round trips with unordered
/// bytes (RDMA READ): no brackets, one round trip. The image's own seq word stands for `s1`;
/// [`verify`] then accepts it only if that seq is even and non-zero, the trailer's seq copy
/// equals it and the checksum over everything else matches, so an image mixing two writes, or
/// caught in the middle of one (odd seq, a trailer or checksum of another write), is rejected
/// as torn (the format's "Why the checksum and trailer as well"). Returns the seq and the bytes
/// read, as [`read_stable_used`] does.
fn read_once<F: OneSided>(
    fabric: &F,
    remote: &F::RemoteRegion,
    offset_bytes: usize,
    image: &mut [u8],
) -> Result<Option<(u64, usize)>, FabricError> {
    fabric.read(remote, offset_bytes, image)?;
    let seq = word_at(image, SLOT_SEQ_OFFSET_BYTES);
    Ok((seq % 2 == 0).then_some((seq, image.len())))
}

/// A version read from a slot and verified. Borrows the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotView<'a> {
    seq: u64,
    ts: u64,
    flags: u64,
    expiry: u64,
    key: &'a [u8],
    metadata: &'a [u8],
    value: &'a [u8],
    attempts: u32,
}

impl<'a> SlotView<'a> {
    /// The slot's (even) sequence number when read.
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// Timestamp of the version.
    pub fn ts(&self) -> u64 {
        self.ts
    }
    /// Raw flags word.
    pub fn flags(&self) -> u64 {
        self.flags
    }
    /// The version's expiry word, as the server wrote it.
    pub fn expiry(&self) -> u64 {
        self.expiry
    }
    /// Whether the server has marked a newer version as prepared.
    pub fn newer_prepared(&self) -> bool {
        self.flags & SLOT_FLAG_NEWER_PREPARED != 0
    }
    /// The key (equal to the one asked for).
    pub fn key(&self) -> &'a [u8] {
        self.key
    }
    /// The version's metadata (the transaction's write set, encoded by the storage layer).
    pub fn metadata(&self) -> &'a [u8] {
        self.metadata
    }
    /// The value.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }
    /// Attempts it took (1 = no torn read seen).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

enum Verdict {
    /// Inconsistent image: try again.
    Torn,
    /// A stable answer that another attempt would not change.
    Final(SlotReadError),
}

/// Checks a slot image read under sequence number `seq`.
fn verify(image: &[u8], seq: u64, expected_key: &[u8]) -> Result<(SlotLayout, u64, u64), Verdict> {
    if word_at(image, SLOT_SEQ_OFFSET_BYTES) != seq {
        return Err(Verdict::Torn);
    }
    if seq == 0 {
        return Err(Verdict::Final(SlotReadError::NotValid));
    }
    let layout = SlotLayout::new(
        u32_at(image, SLOT_KEY_LEN_OFFSET_BYTES) as usize,
        u32_at(image, SLOT_METADATA_LEN_OFFSET_BYTES) as usize,
        u32_at(image, SLOT_VALUE_LEN_OFFSET_BYTES) as usize,
    );
    if layout.total_bytes > image.len() {
        // Lengths read under a stable seq: a real overflow (on a backend without ordered
        // reads it could be torn too; the caller's answer, GET+, is the same).
        return Err(Verdict::Final(SlotReadError::TooLarge {
            slot_bytes: layout.total_bytes,
            capacity_bytes: image.len(),
        }));
    }
    let offset = layout.checksum_offset_bytes;
    if word_at(image, offset + WORD_BYTES) != seq || word_at(image, offset) != checksum(&image[..offset]) {
        return Err(Verdict::Torn);
    }
    let flags = word_at(image, SLOT_FLAGS_OFFSET_BYTES);
    if flags & !SLOT_FLAGS_KNOWN != 0 || u32_at(image, SLOT_RESERVED_OFFSET_BYTES) != 0 {
        return Err(Verdict::Final(SlotReadError::Corrupt { flags }));
    }
    if flags & SLOT_FLAG_VALID == 0 {
        return Err(Verdict::Final(SlotReadError::NotValid));
    }
    if &image[layout.key.clone()] != expected_key {
        return Err(Verdict::Final(SlotReadError::WrongKey));
    }
    Ok((layout, word_at(image, SLOT_TS_OFFSET_BYTES), flags))
}

/// Reads and verifies the slot at `offset_bytes` (capacity `capacity_bytes`, the length the
/// address cache holds) of a peer's region, expecting `expected_key`. `buf` must hold at least
/// `capacity_bytes`; the returned view borrows it.
///
/// One attempt is: acquire-read `seq`, read the header and then only the bytes its lengths say
/// the version occupies (the whole capacity if they exceed it), re-read `seq`, then check
/// trailer copy, checksum, flags and key. Torn attempts are retried up to
/// `SLOT_READ_ATTEMPTS_MAX` times.
///
/// # Errors
/// Expected outcomes as values: `Torn`, `WrongKey`, `NotValid`, `TooLarge`, `Corrupt`;
/// `InvalidCapacity` and `Fabric` for bad arguments.
pub fn read_slot<'b, F: OneSided>(
    fabric: &F,
    remote: &F::RemoteRegion,
    offset_bytes: usize,
    capacity_bytes: usize,
    expected_key: &[u8],
    buf: &'b mut [u8],
) -> Result<SlotView<'b>, SlotReadError> {
    read_slot_attempts(fabric, remote, offset_bytes, capacity_bytes, expected_key, buf, SLOT_READ_ATTEMPTS_MAX)
}

/// Verifies a slot image the caller read itself, in one read of the whole capacity
/// (`image.len()`), e.g. together with other ranges in one [`OneSided::read_many`]: the checks
/// of [`read_slot`]'s one-read mode (its seq even and non-zero, the trailer's copy equal to it,
/// the checksum, flags and key), for a backend whose reads are round trips with unordered
/// bytes. On shared memory an image read without the seqlock's brackets proves nothing: use
/// [`read_slot`] there.
///
/// # Errors
/// `Torn { attempts: 1 }` for an image caught mid-write or mixing writes: retriable, e.g. with
/// [`read_slot`]. The other verdicts as [`read_slot`]'s; `InvalidCapacity` for a length that is
/// not a valid capacity.
pub fn verify_image<'b>(image: &'b [u8], expected_key: &[u8]) -> Result<SlotView<'b>, SlotReadError> {
    if !valid_capacity(image.len()) {
        return Err(SlotReadError::InvalidCapacity { capacity_bytes: image.len(), buffer_bytes: image.len() });
    }
    let seq = word_at(image, SLOT_SEQ_OFFSET_BYTES);
    let verdict = if seq % 2 == 0 { verify(image, seq, expected_key) } else { Err(Verdict::Torn) };
    match verdict {
        Ok((layout, ts, flags)) => Ok(view_of(image, seq, ts, flags, layout, 1)),
        Err(Verdict::Final(error)) => Err(error),
        Err(Verdict::Torn) => Err(SlotReadError::Torn { attempts: 1 }),
    }
}

fn view_of(image: &[u8], seq: u64, ts: u64, flags: u64, layout: SlotLayout, attempts: u32) -> SlotView<'_> {
    SlotView {
        seq,
        ts,
        flags,
        expiry: word_at(image, SLOT_EXPIRY_OFFSET_BYTES),
        key: &image[layout.key],
        metadata: &image[layout.metadata],
        value: &image[layout.value],
        attempts,
    }
}

fn read_slot_attempts<'b, F: OneSided>(
    fabric: &F,
    remote: &F::RemoteRegion,
    offset_bytes: usize,
    capacity_bytes: usize,
    expected_key: &[u8],
    buf: &'b mut [u8],
    attempts_max: u32,
) -> Result<SlotView<'b>, SlotReadError> {
    if !valid_capacity(capacity_bytes) || buf.len() < capacity_bytes {
        return Err(SlotReadError::InvalidCapacity { capacity_bytes, buffer_bytes: buf.len() });
    }
    let image = &mut buf[..capacity_bytes];
    let once = fabric.reads_are_round_trips(remote);
    let mut accepted = None;
    for attempt in 1..=attempts_max {
        let stable = if once {
            read_once(fabric, remote, offset_bytes, image)?
        } else {
            read_stable_used(fabric, remote, offset_bytes, image)?
        };
        if let Some((seq, bytes)) = stable {
            match verify(&image[..bytes], seq, expected_key) {
                Ok((layout, ts, flags)) => {
                    accepted = Some((seq, ts, flags, layout, attempt));
                    break;
                }
                Err(Verdict::Final(error)) => return Err(error),
                Err(Verdict::Torn) => {}
            }
        }
        std::hint::spin_loop();
    }
    let Some((seq, ts, flags, layout, attempts)) = accepted else {
        return Err(SlotReadError::Torn { attempts: attempts_max });
    };
    let image: &'b [u8] = buf;
    Ok(view_of(image, seq, ts, flags, layout, attempts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Access, Fabric};
    use crate::memory::MemoryFabric;
    use crate::words::HeapWords;

    const CAPACITY: usize = 256;

    fn setup() -> (MemoryFabric, crate::memory::MemoryLocalRegion, crate::memory::MemoryRemoteRegion) {
        let fabric = MemoryFabric::new();
        let local = fabric.register("slots", 4 * CAPACITY, Access::ReadOnly).unwrap();
        let remote = fabric.map(&fabric.describe(&local)).unwrap();
        (fabric, local, remote)
    }

    fn bytes_of(words: &impl Words, range: Range<usize>) -> Vec<u8> {
        let mut out = vec![0u8; range.len()];
        crate::words::read_bytes(words, range.start, &mut out).unwrap();
        out
    }

    #[test]
    fn layout_is_exact_byte_by_byte() {
        let words = HeapWords::new(64);
        let mut writer = SlotWriter::new(CAPACITY);
        let seq = writer
            .publish(
                &words,
                64,
                CAPACITY,
                b"key",
                0x1122_3344_5566_7788,
                0x0102_0304_0506,
                b"meta!",
                b"v",
                SLOT_FLAG_VALID,
            )
            .unwrap();
        assert_eq!(seq, 2);
        let size = slot_bytes(3, 5, 1);
        assert_eq!(size, 48 + 8 + 8 + 8 + 16);
        let image = bytes_of(&words, 64..64 + size);
        assert_eq!(&image[0..8], &2u64.to_le_bytes());
        assert_eq!(&image[8..16], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&image[16..24], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&image[24..28], &[3, 0, 0, 0]); // key_len
        assert_eq!(&image[28..32], &[1, 0, 0, 0]); // value_len
        assert_eq!(&image[32..36], &[5, 0, 0, 0]); // metadata_len
        assert_eq!(&image[36..40], &[0, 0, 0, 0]); // reserved
        assert_eq!(&image[40..48], &[6, 5, 4, 3, 2, 1, 0, 0]); // expiry
        assert_eq!(&image[48..56], b"key\0\0\0\0\0");
        assert_eq!(&image[56..64], b"meta!\0\0\0");
        assert_eq!(&image[64..72], b"v\0\0\0\0\0\0\0");
        let (head, body) = (xxhash_rust::xxh3::xxh3_64(&image[..24]), xxhash_rust::xxh3::xxh3_64(&image[24..72]));
        assert_eq!(&image[72..80], &(head ^ body).to_le_bytes());
        assert_eq!(&image[80..88], &2u64.to_le_bytes());
        // Nothing before the slot was touched.
        assert_eq!(bytes_of(&words, 0..64), vec![0u8; 64]);
    }

    #[test]
    fn publish_then_read_round_trips_and_counts_writes_in_seq() {
        let (fabric, local, remote) = setup();
        let mut writer = SlotWriter::new(CAPACITY);
        let mut buf = vec![0u8; CAPACITY];
        for (round, value) in [&b"first"[..], b"a longer second value", b""].iter().enumerate() {
            let expiry = [0, 1_700_000_000_000, 1 << 63 | 5][round];
            writer
                .publish(&local, CAPACITY, CAPACITY, b"k1", 10 + round as u64, expiry, b"w", value, SLOT_FLAG_VALID)
                .unwrap();
            let view = read_slot(&fabric, &remote, CAPACITY, CAPACITY, b"k1", &mut buf).unwrap();
            assert_eq!(view.value(), *value);
            assert_eq!(view.ts(), 10 + round as u64);
            assert_eq!(view.expiry(), expiry, "the expiry word travels as it is");
            assert_eq!(view.metadata(), b"w");
            assert_eq!(view.seq(), 2 * (round as u64 + 1));
            assert_eq!(view.attempts(), 1);
            assert!(!view.newer_prepared());
        }
    }

    #[test]
    fn set_flags_goes_through_the_seqlock_and_keeps_the_checksum_valid() {
        let (fabric, local, remote) = setup();
        let mut writer = SlotWriter::new(CAPACITY);
        let mut buf = vec![0u8; CAPACITY];
        assert!(matches!(writer.set_flags(&local, 0, CAPACITY, SLOT_FLAG_VALID), Err(SlotWriteError::NotPublished)));
        writer.publish(&local, 0, CAPACITY, b"k", 5, 0, b"", b"value", SLOT_FLAG_VALID).unwrap();
        let seq = writer.set_flags(&local, 0, CAPACITY, SLOT_FLAG_VALID | SLOT_FLAG_NEWER_PREPARED).unwrap();
        assert_eq!(seq, 4);
        let view = read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf).unwrap();
        assert!(view.newer_prepared());
        assert_eq!((view.value(), view.ts(), view.seq()), (&b"value"[..], 5, 4));
        // The head is checksummed too: another ts or the valid bit under this checksum, what a
        // read torn between two writes could see, is rejected.
        let (ts_index, flags_index) = (SLOT_TS_OFFSET_BYTES / WORD_BYTES, SLOT_FLAGS_OFFSET_BYTES / WORD_BYTES);
        for (index, changed) in [(ts_index, 6), (flags_index, SLOT_FLAG_NEWER_PREPARED)] {
            let good = local.load(index, LoadOrdering::Relaxed);
            local.store(index, changed, StoreOrdering::Relaxed);
            assert!(matches!(
                read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf),
                Err(SlotReadError::Torn { .. })
            ));
            local.store(index, good, StoreOrdering::Relaxed);
        }
        // A mark on a slot republished with another body still checks.
        writer
            .publish(&local, 0, CAPACITY, b"k", 6, 0, b"meta", b"a longer value than before", SLOT_FLAG_VALID)
            .unwrap();
        writer.set_flags(&local, 0, CAPACITY, SLOT_FLAG_VALID | SLOT_FLAG_NEWER_PREPARED).unwrap();
        let view = read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf).unwrap();
        assert_eq!(
            (view.value(), view.metadata(), view.ts(), view.newer_prepared()),
            (&b"a longer value than before"[..], &b"meta"[..], 6, true)
        );
        writer.set_flags(&local, 0, CAPACITY, 0).unwrap();
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::NotValid)));
    }

    #[test]
    fn the_newer_prepared_mark_is_one_store_outside_the_seqlock_and_the_checksum() {
        let (fabric, local, remote) = setup();
        let mut writer = SlotWriter::new(CAPACITY);
        let mut buf = vec![0u8; CAPACITY];
        assert!(matches!(writer.mark_newer_prepared(&local, 0, CAPACITY), Err(SlotWriteError::NotPublished)));
        writer.publish(&local, 0, CAPACITY, b"k", 5, 0, b"w", b"value", SLOT_FLAG_VALID).unwrap();
        let before = bytes_of(&local, 0..CAPACITY);
        writer.mark_newer_prepared(&local, 0, CAPACITY).unwrap();
        let after = bytes_of(&local, 0..CAPACITY);
        // Only the flags word changed (seq and checksum did not), and the slot still checks.
        let changed: Vec<usize> = (0..CAPACITY / WORD_BYTES)
            .filter(|word| before[word * WORD_BYTES..][..WORD_BYTES] != after[word * WORD_BYTES..][..WORD_BYTES])
            .collect();
        assert_eq!(changed, vec![SLOT_FLAGS_OFFSET_BYTES / WORD_BYTES]);
        let view = read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf).unwrap();
        assert_eq!((view.value(), view.ts(), view.seq(), view.newer_prepared()), (&b"value"[..], 5, 2, true));
        // A republish clears it; an invalidated slot cannot be marked.
        writer.publish(&local, 0, CAPACITY, b"k", 6, 0, b"w", b"newer", SLOT_FLAG_VALID).unwrap();
        assert!(!read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf).unwrap().newer_prepared());
        writer.set_flags(&local, 0, CAPACITY, 0).unwrap();
        assert!(matches!(writer.mark_newer_prepared(&local, 0, CAPACITY), Err(SlotWriteError::NotPublished)));
    }

    #[test]
    fn expected_conditions_are_values() {
        let (fabric, local, remote) = setup();
        let mut writer = SlotWriter::new(CAPACITY);
        let mut buf = vec![0u8; CAPACITY];
        // Never written.
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::NotValid)));
        writer.publish(&local, 0, CAPACITY, b"k", 1, 0, b"", b"value", SLOT_FLAG_VALID).unwrap();
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"other", &mut buf), Err(SlotReadError::WrongKey)));
        // A reader told a smaller capacity than the slot needs.
        assert!(matches!(
            read_slot(&fabric, &remote, 0, SLOT_BYTES_MIN, b"k", &mut buf),
            Err(SlotReadError::TooLarge { .. })
        ));
        assert!(matches!(
            read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf[..8]),
            Err(SlotReadError::InvalidCapacity { .. })
        ));
        assert!(matches!(
            read_slot(&fabric, &remote, 4, CAPACITY, b"k", &mut buf),
            Err(SlotReadError::Fabric(FabricError::Misaligned { .. }))
        ));
        // A flipped value byte (a torn RDMA read would look like this): checksum mismatch.
        let value_index = (SLOT_HEADER_BYTES + 8) / WORD_BYTES;
        let good = local.load(value_index, LoadOrdering::Relaxed);
        local.store(value_index, good ^ 0x100, StoreOrdering::Relaxed);
        assert!(matches!(
            read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf),
            Err(SlotReadError::Torn { attempts: SLOT_READ_ATTEMPTS_MAX })
        ));
        local.store(value_index, good, StoreOrdering::Relaxed);
        // A writer stuck mid-write (odd seq).
        local.store(0, 3, StoreOrdering::Relaxed);
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::Torn { .. })));
        // Trailer copy disagreeing with seq.
        local.store(0, 2, StoreOrdering::Relaxed);
        let trailer_index = slot_bytes(1, 0, 5) / WORD_BYTES - 1;
        local.store(trailer_index, 4, StoreOrdering::Relaxed);
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::Torn { .. })));
    }

    #[test]
    fn writer_refuses_what_does_not_fit_and_writes_nothing() {
        let (_fabric, local, _remote) = setup();
        let mut writer = SlotWriter::new(CAPACITY);
        let big = vec![7u8; CAPACITY];
        assert!(matches!(
            writer.publish(&local, 0, CAPACITY, b"k", 1, 0, b"", &big, SLOT_FLAG_VALID),
            Err(SlotWriteError::TooLarge { .. })
        ));
        assert!(matches!(
            writer.publish(&local, 0, CAPACITY, b"k", 1, 0, b"", b"", 1 << 5),
            Err(SlotWriteError::UnknownFlags { .. })
        ));
        assert!(matches!(
            writer.publish(&local, 0, 100, b"k", 1, 0, b"", b"", SLOT_FLAG_VALID),
            Err(SlotWriteError::InvalidCapacity { .. })
        ));
        assert!(matches!(
            writer.publish(&local, 4 * CAPACITY - 8, CAPACITY, b"k", 1, 0, b"", b"", SLOT_FLAG_VALID),
            Err(SlotWriteError::Fabric(FabricError::OutOfBounds { .. }))
        ));
        assert_eq!(local.load(0, LoadOrdering::Relaxed), 0);
    }

    #[test]
    fn a_stable_slot_with_unknown_flags_is_corrupt() {
        let (fabric, local, remote) = setup();
        let mut writer = SlotWriter::new(CAPACITY);
        let mut buf = vec![0u8; CAPACITY];
        writer.publish(&local, 0, CAPACITY, b"k", 1, 0, b"", b"", SLOT_FLAG_VALID).unwrap();
        // Re-seal an image with a flag bit the format does not define.
        let size = slot_bytes(1, 0, 0);
        let mut image = bytes_of(&local, 0..size);
        image[16] |= 1 << 4;
        let layout = SlotLayout::new(1, 0, 0);
        seal(&mut image, &layout, 2);
        crate::words::write_bytes(&local, Access::ReadWrite, 0, &image).unwrap();
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::Corrupt { .. })));
    }

    #[test]
    fn where_reads_are_round_trips_a_slot_is_read_once_and_its_checks_still_hold() {
        let (plain, local, remote) = setup();
        let fabric = plain.with_round_trips();
        let operations = || fabric.round_trip_counts().unwrap().operations.load(std::sync::atomic::Ordering::Relaxed);
        let mut writer = SlotWriter::new(CAPACITY);
        let mut buf = vec![0u8; CAPACITY];
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::NotValid)));
        writer.publish(&local, 0, CAPACITY, b"k", 7, 0, b"", b"value", SLOT_FLAG_VALID).unwrap();
        let before = operations();
        let view = read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf).unwrap();
        assert_eq!((view.ts(), view.value(), view.attempts()), (7, &b"value"[..], 1));
        assert_eq!(operations() - before, 1, "one round trip");
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"other", &mut buf), Err(SlotReadError::WrongKey)));
        // A flipped value byte, a writer stuck mid-write, a trailer of another write: torn.
        let value_index = (SLOT_HEADER_BYTES + 8) / WORD_BYTES;
        let good = local.load(value_index, LoadOrdering::Relaxed);
        local.store(value_index, good ^ 0x100, StoreOrdering::Relaxed);
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::Torn { .. })));
        local.store(value_index, good, StoreOrdering::Relaxed);
        local.store(0, 3, StoreOrdering::Relaxed);
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::Torn { .. })));
        local.store(0, 2, StoreOrdering::Relaxed);
        let trailer_index = slot_bytes(1, 0, 5) / WORD_BYTES - 1;
        local.store(trailer_index, 4, StoreOrdering::Relaxed);
        assert!(matches!(read_slot(&fabric, &remote, 0, CAPACITY, b"k", &mut buf), Err(SlotReadError::Torn { .. })));
    }

    #[test]
    fn concurrent_writer_and_reader_threads_never_accept_a_torn_value() {
        // A fast in-process smoke version of the cross-process stress test.
        let fabric = MemoryFabric::new();
        let local = fabric.register("stress", CAPACITY, Access::ReadOnly).unwrap();
        let remote = fabric.map(&fabric.describe(&local)).unwrap();
        never_accept_a_torn_value(&fabric, &local, &remote);
    }

    #[test]
    fn concurrent_writer_and_one_read_readers_never_accept_a_torn_value() {
        let fabric = MemoryFabric::new().with_round_trips();
        let local = fabric.register("stress-once", CAPACITY, Access::ReadOnly).unwrap();
        let remote = fabric.map(&fabric.describe(&local)).unwrap();
        never_accept_a_torn_value(&fabric, &local, &remote);
    }

    fn never_accept_a_torn_value<F: OneSided + Sync>(
        fabric: &F,
        local: &(impl Words + Sync),
        remote: &F::RemoteRegion,
    ) {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut writer = SlotWriter::new(CAPACITY);
                let mut generation = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    generation += 1;
                    let len = (generation % 150) as usize;
                    let value = vec![generation as u8; len];
                    writer.publish(local, 0, CAPACITY, b"k", generation, 0, b"", &value, SLOT_FLAG_VALID).unwrap();
                }
            });
            let mut buf = vec![0u8; CAPACITY];
            let mut accepted = 0;
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
            while std::time::Instant::now() < deadline {
                match read_slot(fabric, remote, 0, CAPACITY, b"k", &mut buf) {
                    Ok(view) => {
                        let generation = view.ts();
                        assert_eq!(view.value().len(), (generation % 150) as usize);
                        assert!(view.value().iter().all(|&b| b == generation as u8));
                        accepted += 1;
                    }
                    Err(SlotReadError::Torn { .. } | SlotReadError::NotValid) => {}
                    Err(other) => panic!("{other}"),
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(accepted > 0);
        });
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::fabric::Access;
    use crate::memory::{MemoryFabric, MemoryRemoteRegion};
    use crate::words::loom_words::LoomWords;
    use std::sync::Arc;

    const KEY: &[u8] = b"k";
    // 48 header + 8 key + 8 value + 16 trailer = 80 bytes = 10 words.
    const CAPACITY: usize = slot_bytes(1, 0, 8);

    fn builder() -> loom::model::Builder {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder
    }

    fn publish(writer: &mut SlotWriter, memory: &LoomWords, generation: u64) {
        let value = [generation as u8; 8];
        writer.publish(memory, 0, CAPACITY, KEY, generation, 0, b"", &value, SLOT_FLAG_VALID).unwrap();
    }

    /// The full slot: generation 1 is published before the threads start; a writer thread
    /// rewrites it with generation 2 while a reader runs `read_slot` (two attempts). Whatever
    /// it accepts is one whole version. (One concurrent write keeps the model small: every
    /// relaxed load may read from each store not yet overwritten, so the state space grows
    /// exponentially with the writes a reader can race.)
    #[test]
    fn loom_slot_reader_never_accepts_a_torn_slot() {
        // Outcomes over all executions (std atomics: outside the model), to show that the
        // model does reach torn reads, not only clean ones.
        use std::sync::atomic::{AtomicU64 as Count, Ordering::Relaxed};
        static OUTCOMES: [Count; 3] = [Count::new(0), Count::new(0), Count::new(0)];
        builder().check(|| {
            let memory = Arc::new(LoomWords::new(CAPACITY / WORD_BYTES));
            publish(&mut SlotWriter::new(CAPACITY), &memory, 1);
            let writer_memory = Arc::clone(&memory);
            let writer = loom::thread::spawn(move || {
                publish(&mut SlotWriter::new(CAPACITY), &writer_memory, 2);
            });
            let fabric = MemoryFabric::<LoomWords>::new();
            let remote = MemoryRemoteRegion::new(memory, Access::ReadOnly);
            let mut buf = [0u8; CAPACITY];
            match read_slot_attempts(&fabric, &remote, 0, CAPACITY, KEY, &mut buf, 2) {
                Ok(view) => {
                    let generation = view.ts();
                    assert!(generation == 1 || generation == 2);
                    assert_eq!(view.value(), &[generation as u8; 8]);
                    assert_eq!(view.seq(), 2 * generation);
                    OUTCOMES[generation as usize].fetch_add(1, Relaxed);
                }
                Err(SlotReadError::Torn { .. }) => {
                    OUTCOMES[0].fetch_add(1, Relaxed);
                }
                Err(other) => panic!("unexpected {other}"),
            }
            writer.join().unwrap();
        });
        let [torn, first, second] = OUTCOMES.each_ref().map(|count| count.load(Relaxed));
        println!("loom slot model: executions accepting gen 1: {first}, gen 2: {second}, torn: {torn}");
        assert!(torn > 0 && first > 0 && second > 0);
    }

    /// The seqlock alone, without the checksum that would otherwise hide an ordering bug:
    /// every image `read_stable` accepts has all words of one generation.
    fn seqlock_model(writer_fences: bool) {
        const WORDS: usize = 4; // seq + 3 body words
        builder().check(move || {
            let memory = Arc::new(LoomWords::new(WORDS));
            let writer_memory = Arc::clone(&memory);
            let writer = loom::thread::spawn(move || {
                for generation in 1..=2u64 {
                    let store_body = |region: &LoomWords| {
                        for index in 1..WORDS {
                            region.store(index, generation, StoreOrdering::Relaxed);
                        }
                    };
                    if writer_fences {
                        write_locked(&*writer_memory, 0, 2 * generation, store_body);
                    } else {
                        // The bug the fences prevent: a plain odd/even bracket.
                        writer_memory.store(0, 2 * generation - 1, StoreOrdering::Relaxed);
                        store_body(&writer_memory);
                        writer_memory.store(0, 2 * generation, StoreOrdering::Relaxed);
                    }
                }
            });
            let fabric = MemoryFabric::<LoomWords>::new();
            let remote = MemoryRemoteRegion::new(memory, Access::ReadOnly);
            let mut image = [0u8; WORDS * WORD_BYTES];
            if let Some(seq) = read_stable(&fabric, &remote, 0, &mut image).unwrap() {
                let generation = seq / 2;
                for index in 1..WORDS {
                    assert_eq!(word_at(&image, index * WORD_BYTES), generation, "torn image accepted");
                }
            }
            writer.join().unwrap();
        });
    }

    #[test]
    fn loom_seqlock_snapshot_is_one_generation() {
        seqlock_model(true);
    }

    /// Proves the model has teeth: without the fences loom finds a torn image.
    #[test]
    #[should_panic]
    fn loom_seqlock_without_fences_is_caught() {
        seqlock_model(false);
    }
}
