//! The reply slot: where a server leaves a reply in its own registered memory for the client to
//! fetch with one-sided reads.
//!
//! # Format (little-endian; byte by byte in `docs/fabric.md`)
//! ```text
//! +0        8  status: bit 63 READY, bit 62 UNSOLICITED (pushed only: not the answer to a
//!              call; generation 0), bits 0..32 generation (the call's number), bits 32..48
//!              entry count, bits 48..62 zero
//! +8        4  body length L in bytes
//! +12       2  server processing time, in RPC_TIME_UNIT_NS units, saturating
//! +14       2  reserved, zero
//! +16       P  body (reply entries), zero-padded to P = pad8(L)
//! +16+P     8  checksum: XXH3-64 of bytes [0, 16+P) (status included)
//! +24+P     8  trailer: a copy of the status word (the completion marker)
//! ```
//! A pushed reply (server-reply mode) carries the first `16 + L` bytes as a ring message; the
//! ring's own header and trailer mark it complete.
//!
//! # Protocol
//! Writer (the server, the only writer of its slot): every word but the status (relaxed), then
//! the status (**release**). It writes generation `g` only after it received request `g`, and
//! the client reads the slot for `g` only after it sent request `g` and finished `g - 1`.
//! Reader: one read of the first `F` bytes (relaxed words, in no promised order, then an acquire
//! fence); if the status is not READY with the expected generation, the fetch failed (the reply
//! is not there yet, or the slot still holds the previous reply: *stale*). Otherwise, if the
//! reply is longer than `F`, one more read for the rest. The image is accepted only if its
//! trailer equals its status and its checksum matches; else the fetch failed (*torn*: some words
//! came from the previous reply because the read overlapped the write) and is retried.
//!
//! Why this is enough: words are never torn, so an accepted image with status `g` and a
//! matching checksum over status, length, time and body is the image the server wrote for `g`
//! unless XXH3-64 collides (as for item slots, `slot.rs`). Stale images fail the generation
//! check outright. One read per fetch is what RDMA costs too: a seqlock's second status read
//! would add a round trip there.

use super::RpcError;
use crate::fabric::{FabricError, OneSided};
use crate::limits::{RPC_TIME_UNIT_NS, WORD_BYTES};
use crate::words::{check_range, padded_bytes, LoadOrdering, StoreOrdering, Words};

/// Status bit: the slot holds a complete reply.
pub const REPLY_READY_BIT: u64 = 1 << 63;
/// Status bit of a pushed message that answers no call (generation 0).
pub const REPLY_UNSOLICITED_BIT: u64 = 1 << 62;
const GENERATION_MASK: u64 = 0xFFFF_FFFF;
const COUNT_SHIFT: u32 = 32;
const COUNT_MASK: u64 = 0xFFFF;
/// Bytes of the reply header (status, length, time, reserved).
pub const REPLY_HEADER_BYTES: usize = 16;
/// Bytes after the body (checksum, trailer).
pub const REPLY_TRAILER_BYTES: usize = 16;

/// Bytes a reply slot needs for a body of `body_bytes`.
pub const fn reply_slot_bytes(body_bytes: usize) -> usize {
    REPLY_HEADER_BYTES + padded_bytes(body_bytes) + REPLY_TRAILER_BYTES
}

/// The status word of a complete reply.
pub fn reply_status(generation: u32, entry_count: u16) -> u64 {
    REPLY_READY_BIT | (u64::from(entry_count) << COUNT_SHIFT) | u64::from(generation)
}

/// A server processing time in the compact 16-bit field (saturating).
pub fn encode_time(nanos: u64) -> u16 {
    u16::try_from(nanos / RPC_TIME_UNIT_NS).unwrap_or(u16::MAX)
}

/// The nanoseconds a compact time field stands for (its lower bound).
pub fn decode_time(field: u16) -> u64 {
    u64::from(field) * RPC_TIME_UNIT_NS
}

pub(crate) fn word_at(image: &[u8], offset_bytes: usize) -> u64 {
    let mut word = [0u8; WORD_BYTES];
    word.copy_from_slice(&image[offset_bytes..offset_bytes + WORD_BYTES]);
    u64::from_le_bytes(word)
}

pub(crate) fn u32_at(image: &[u8], offset_bytes: usize) -> u32 {
    let mut half = [0u8; 4];
    half.copy_from_slice(&image[offset_bytes..offset_bytes + 4]);
    u32::from_le_bytes(half)
}

fn checksum(image: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(image)
}

/// Decoded reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyHeader {
    /// The call's generation.
    pub generation: u32,
    /// Entries in the body.
    pub entry_count: u16,
    /// Body length in bytes.
    pub body_bytes: usize,
    /// Server processing time, compact field.
    pub time_field: u16,
    /// An unsolicited pushed message (answers no call).
    pub unsolicited: bool,
}

/// Encodes header and body (`REPLY_HEADER_BYTES + body.len()` bytes, unpadded) into `out`: the
/// pushed form; the slot form adds padding, checksum and trailer.
pub fn encode_reply(out: &mut Vec<u8>, generation: u32, entry_count: u16, time_field: u16, body: &[u8]) {
    encode_with_status(out, reply_status(generation, entry_count), time_field, body);
}

/// Encodes an unsolicited pushed message (status READY | UNSOLICITED, generation 0).
pub fn encode_unsolicited(out: &mut Vec<u8>, entry_count: u16, body: &[u8]) {
    encode_with_status(out, reply_status(0, entry_count) | REPLY_UNSOLICITED_BIT, 0, body);
}

fn encode_with_status(out: &mut Vec<u8>, status: u64, time_field: u16, body: &[u8]) {
    out.clear();
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&time_field.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(body);
}

/// Decodes and checks a reply header (from a slot or a pushed message). `capacity_bytes` bounds
/// the body.
///
/// # Errors
/// `Corrupt` for bits no correct server sets or a length above the capacity.
pub fn decode_reply_header(image: &[u8], capacity_bytes: usize) -> Result<ReplyHeader, RpcError> {
    if image.len() < REPLY_HEADER_BYTES {
        return Err(RpcError::Corrupt { reason: "reply shorter than its header" });
    }
    let status = word_at(image, 0);
    let known = REPLY_READY_BIT | REPLY_UNSOLICITED_BIT | (COUNT_MASK << COUNT_SHIFT) | GENERATION_MASK;
    if status & REPLY_READY_BIT == 0 || status & !known != 0 {
        return Err(RpcError::Corrupt { reason: "reply status has unknown bits" });
    }
    let body_bytes = u32_at(image, 8) as usize;
    if body_bytes > capacity_bytes {
        return Err(RpcError::Corrupt { reason: "reply body longer than its slot" });
    }
    if u16::from_le_bytes([image[14], image[15]]) != 0 {
        return Err(RpcError::Corrupt { reason: "reply reserved field not zero" });
    }
    Ok(ReplyHeader {
        generation: (status & GENERATION_MASK) as u32,
        entry_count: ((status >> COUNT_SHIFT) & COUNT_MASK) as u16,
        body_bytes,
        time_field: u16::from_le_bytes([image[12], image[13]]),
        unsolicited: status & REPLY_UNSOLICITED_BIT != 0,
    })
}

/// The server's side of a reply slot: publishes replies into its own memory.
#[derive(Debug)]
pub struct ReplySlotWriter {
    first_index: usize,
    slot_bytes: usize,
    image: Vec<u8>,
}

impl ReplySlotWriter {
    /// The slot at `offset_bytes` (8-aligned), `slot_bytes` long, of `memory`. Allocates its image
    /// buffer here, once.
    ///
    /// # Errors
    /// `Misaligned` or `OutOfBounds`.
    pub fn new<W: Words + ?Sized>(memory: &W, offset_bytes: usize, slot_bytes: usize) -> Result<Self, FabricError> {
        let first_index = check_range(memory, offset_bytes, slot_bytes)?;
        Ok(Self { first_index, slot_bytes: padded_bytes(slot_bytes), image: Vec::with_capacity(slot_bytes) })
    }

    /// Largest body this slot holds.
    pub fn body_bytes_max(&self) -> usize {
        self.slot_bytes.saturating_sub(REPLY_HEADER_BYTES + REPLY_TRAILER_BYTES)
    }

    /// Publishes the reply for `generation`: every other word first (relaxed), then the status
    /// word with a release store.
    ///
    /// # Errors
    /// `TooLarge` if the body does not fit (nothing written).
    pub fn publish<W: Words + ?Sized>(
        &mut self,
        memory: &W,
        generation: u32,
        entry_count: u16,
        time_field: u16,
        body: &[u8],
    ) -> Result<(), RpcError> {
        if body.len() > self.body_bytes_max() {
            return Err(RpcError::TooLarge { bytes: body.len(), bytes_max: self.body_bytes_max() });
        }
        encode_reply(&mut self.image, generation, entry_count, time_field, body);
        self.image.resize(REPLY_HEADER_BYTES + padded_bytes(body.len()), 0);
        let sum = checksum(&self.image);
        let status = reply_status(generation, entry_count);
        self.image.extend_from_slice(&sum.to_le_bytes());
        self.image.extend_from_slice(&status.to_le_bytes());
        debug_assert_eq!(self.image.len(), reply_slot_bytes(body.len()));
        for (offset, chunk) in self.image.chunks_exact(WORD_BYTES).enumerate().skip(1) {
            let mut word = [0u8; WORD_BYTES];
            word.copy_from_slice(chunk);
            memory.store(self.first_index + offset, u64::from_le_bytes(word), StoreOrdering::Relaxed);
        }
        memory.store(self.first_index, status, StoreOrdering::Release);
        Ok(())
    }

    /// The status word now in the slot (tests and assertions).
    pub fn status<W: Words + ?Sized>(&self, memory: &W) -> u64 {
        memory.load(self.first_index, LoadOrdering::Relaxed)
    }
}

/// What one fetch attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// A complete reply for the expected generation is in the image buffer.
    Complete {
        /// Its header.
        header: ReplyHeader,
        /// One-sided reads it took (1 or 2).
        reads: u32,
    },
    /// The slot does not hold the expected generation yet (in progress or stale).
    NotReady,
    /// The read overlapped a write: trailer or checksum does not match.
    Torn {
        /// One-sided reads it took (1 or 2).
        reads: u32,
    },
}

/// One fetch: reads the first `fetch_bytes` of the slot at `offset_bytes` (`slot_bytes` long) of
/// `remote`, the rest only if the reply is longer, and validates it (see the module docs).
/// `image` must be `slot_bytes` long; on `Complete` it holds the reply (header at 0).
///
/// # Errors
/// `Fabric` for addresses outside the region, `Corrupt` for a complete-looking reply whose
/// header no correct server writes.
pub fn fetch_reply<F: OneSided>(
    fabric: &F,
    remote: &F::RemoteRegion,
    offset_bytes: usize,
    fetch_bytes: usize,
    expected_generation: u32,
    image: &mut [u8],
) -> Result<Fetched, RpcError> {
    let slot_bytes = image.len();
    let first = padded_bytes(fetch_bytes.max(REPLY_HEADER_BYTES)).min(slot_bytes);
    fabric.read(remote, offset_bytes, &mut image[..first])?;
    let Some(header) = expected_header(image, expected_generation)? else {
        return Ok(Fetched::NotReady);
    };
    let total = reply_slot_bytes(header.body_bytes);
    if total <= first {
        return Ok(validate_image(image, header, 1));
    }
    fabric.read(remote, offset_bytes + first, &mut image[first..total])?;
    Ok(validate_image(image, header, 2))
}

/// The header of `image` if its status is READY with `expected_generation`; `None` if not
/// (not there yet, or stale).
///
/// # Errors
/// `Corrupt` for a header no correct server writes (the image must hold the whole slot's
/// length, so that the length can be checked against it).
fn expected_header(image: &[u8], expected_generation: u32) -> Result<Option<ReplyHeader>, RpcError> {
    let status = word_at(image, 0);
    if status & REPLY_READY_BIT == 0 || (status & GENERATION_MASK) as u32 != expected_generation {
        return Ok(None);
    }
    if status & REPLY_UNSOLICITED_BIT != 0 {
        return Err(RpcError::Corrupt { reason: "unsolicited status in a reply slot" });
    }
    let capacity = image.len().saturating_sub(REPLY_HEADER_BYTES + REPLY_TRAILER_BYTES);
    decode_reply_header(image, capacity).map(Some)
}

/// Checks the trailer and checksum of a whole image whose header is `header`.
fn validate_image(image: &[u8], header: ReplyHeader, reads: u32) -> Fetched {
    let status = word_at(image, 0);
    let checksum_at = REPLY_HEADER_BYTES + padded_bytes(header.body_bytes);
    if word_at(image, checksum_at + WORD_BYTES) != status
        || word_at(image, checksum_at) != checksum(&image[..checksum_at])
    {
        return Fetched::Torn { reads };
    }
    Fetched::Complete { header, reads }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{Access, Fabric};
    use crate::memory::MemoryFabric;

    #[test]
    fn slot_layout_is_exact_byte_by_byte() {
        let fabric = MemoryFabric::new();
        let local = fabric.register("slot", 128, Access::ReadOnly).unwrap();
        let mut writer = ReplySlotWriter::new(&local, 8, 120).unwrap();
        assert_eq!(writer.body_bytes_max(), 88);
        writer.publish(&local, 7, 2, encode_time(1_234), b"hello").unwrap();
        let status = reply_status(7, 2);
        assert_eq!(status, (1 << 63) | (2 << 32) | 7);
        assert_eq!(local.load(1, LoadOrdering::Relaxed), status);
        assert_eq!(local.load(2, LoadOrdering::Relaxed), 5 | (12 << 32)); // length 5, time 12 units
        assert_eq!(local.load(3, LoadOrdering::Relaxed).to_le_bytes(), *b"hello\0\0\0");
        let mut image = vec![0u8; 24];
        local.copy_out(1, &mut image);
        assert_eq!(local.load(4, LoadOrdering::Relaxed), checksum(&image));
        assert_eq!(local.load(5, LoadOrdering::Relaxed), status);
        assert!(writer.publish(&local, 8, 1, 0, &[0; 89]).is_err());
        assert_eq!(encode_time(u64::MAX), u16::MAX);
        assert_eq!(decode_time(encode_time(250)), 200);
    }

    #[test]
    fn fetch_reads_once_when_the_reply_fits_and_twice_otherwise() {
        let fabric = MemoryFabric::new();
        let local = fabric.register("slot", 1024, Access::ReadOnly).unwrap();
        let remote = fabric.map(&fabric.describe(&local)).unwrap();
        let mut writer = ReplySlotWriter::new(&local, 0, 1024).unwrap();
        let mut image = vec![0u8; 1024];
        assert_eq!(fetch_reply(&fabric, &remote, 0, 64, 1, &mut image).unwrap(), Fetched::NotReady);
        writer.publish(&local, 1, 1, 3, &[9; 32]).unwrap();
        let header = ReplyHeader { generation: 1, entry_count: 1, body_bytes: 32, time_field: 3, unsolicited: false };
        assert_eq!(
            fetch_reply(&fabric, &remote, 0, 64, 1, &mut image).unwrap(),
            Fetched::Complete { header, reads: 1 }
        );
        assert_eq!(&image[16..48], &[9; 32]);
        // Stale: the slot holds generation 1, the client waits for 2.
        assert_eq!(fetch_reply(&fabric, &remote, 0, 64, 2, &mut image).unwrap(), Fetched::NotReady);
        writer.publish(&local, 2, 1, 0, &[5; 300]).unwrap();
        let Fetched::Complete { header, reads } = fetch_reply(&fabric, &remote, 0, 64, 2, &mut image).unwrap() else {
            panic!("not complete")
        };
        assert_eq!((header.body_bytes, reads), (300, 2));
        assert_eq!(&image[16..316], &[5; 300][..]);
    }

    #[test]
    fn torn_and_corrupt_images_are_refused() {
        let fabric = MemoryFabric::new();
        let local = fabric.register("slot", 256, Access::ReadWrite).unwrap();
        let remote = fabric.map(&fabric.describe(&local)).unwrap();
        let mut writer = ReplySlotWriter::new(&local, 0, 256).unwrap();
        let mut image = vec![0u8; 256];
        writer.publish(&local, 3, 1, 0, b"abcdefgh").unwrap();
        // A body word left over from an earlier reply: the checksum no longer matches.
        local.store(2, u64::from_le_bytes(*b"abcdefgX"), StoreOrdering::Relaxed);
        assert_eq!(fetch_reply(&fabric, &remote, 0, 256, 3, &mut image).unwrap(), Fetched::Torn { reads: 1 });
        // Unknown status bits and an impossible length are corruption, not a retry.
        local.store(0, reply_status(3, 1) | (1 << 50), StoreOrdering::Relaxed);
        assert!(matches!(fetch_reply(&fabric, &remote, 0, 256, 3, &mut image), Err(RpcError::Corrupt { .. })));
        local.store(0, reply_status(3, 1) | REPLY_UNSOLICITED_BIT, StoreOrdering::Relaxed);
        assert!(matches!(fetch_reply(&fabric, &remote, 0, 256, 3, &mut image), Err(RpcError::Corrupt { .. })));
        writer.publish(&local, 4, 1, 0, b"x").unwrap();
        local.store(1, 10_000, StoreOrdering::Relaxed);
        assert!(matches!(fetch_reply(&fabric, &remote, 0, 256, 4, &mut image), Err(RpcError::Corrupt { .. })));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::fabric::Access;
    use crate::memory::{MemoryFabric, MemoryRemoteRegion};
    use crate::words::loom_words::LoomWords;
    use std::sync::Arc;

    /// A slot of 48 bytes: header 16, body up to 16, checksum and trailer 16.
    const SLOT_BYTES: usize = 48;
    const OLD_BODY: &[u8] = b"old-old-OLD-OLD-";
    const NEW_BODY: &[u8] = b"new-new-NEW-NEW-";

    /// The slot holds generation 1's reply; the server publishes generation 2 while the client
    /// fetches for 2, a bounded number of times, with `fetch_bytes` = 24 (two reads: the
    /// second read can overlap the write too). Whatever the interleaving, the client accepts
    /// nothing but generation 2's exact reply (never the stale one, never a mix).
    fn model(fetch_bytes: usize) -> (u64, u64) {
        // Counted over all executions with std atomics (outside the model), per test.
        use std::sync::atomic::{AtomicU64 as Count, Ordering::Relaxed};
        let accepted = Arc::new(Count::new(0));
        let refused = Arc::new(Count::new(0));
        let (accepted_in_model, refused_in_model) = (Arc::clone(&accepted), Arc::clone(&refused));
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(move || {
            let memory = Arc::new(LoomWords::new(SLOT_BYTES / WORD_BYTES));
            let mut writer = ReplySlotWriter::new(&*memory, 0, SLOT_BYTES).unwrap();
            writer.publish(&*memory, 1, 1, 0, OLD_BODY).unwrap();
            let server_memory = Arc::clone(&memory);
            let server = loom::thread::spawn(move || {
                writer.publish(&*server_memory, 2, 1, 5, NEW_BODY).unwrap();
            });
            let fabric = MemoryFabric::<LoomWords>::new();
            let remote = MemoryRemoteRegion::new(Arc::clone(&memory), Access::ReadOnly);
            let mut image = [0u8; SLOT_BYTES];
            for _ in 0..2 {
                match fetch_reply(&fabric, &remote, 0, fetch_bytes, 2, &mut image).unwrap() {
                    Fetched::Complete { header, .. } => {
                        assert_eq!(
                            header,
                            ReplyHeader {
                                generation: 2,
                                entry_count: 1,
                                body_bytes: 16,
                                time_field: 5,
                                unsolicited: false
                            }
                        );
                        assert_eq!(&image[16..32], NEW_BODY);
                        accepted_in_model.fetch_add(1, Relaxed);
                        break;
                    }
                    Fetched::NotReady | Fetched::Torn { .. } => {
                        refused_in_model.fetch_add(1, Relaxed);
                        loom::thread::yield_now();
                    }
                }
            }
            server.join().unwrap();
            // Once the server is done, a fetch always succeeds.
            let fetched = fetch_reply(&fabric, &remote, 0, fetch_bytes, 2, &mut image).unwrap();
            assert!(matches!(fetched, Fetched::Complete { .. }));
            assert_eq!(&image[16..32], NEW_BODY);
            // And a client waiting for the next generation sees the slot as stale.
            assert_eq!(fetch_reply(&fabric, &remote, 0, fetch_bytes, 3, &mut image).unwrap(), Fetched::NotReady);
        });
        (accepted.load(Relaxed), refused.load(Relaxed))
    }

    /// The fabric promises no order among the words of one read. This model reads the slot
    /// body first, then the status, length, checksum and trailer (an order an RDMA NIC may
    /// use), so a read can see the new status and trailer around an old body word: only the
    /// checksum tells. Without the checksum check this model fails.
    #[test]
    fn loom_reply_slot_checksum_catches_a_body_read_before_the_status() {
        use std::sync::atomic::{AtomicU64 as Count, Ordering::Relaxed};
        let torn = Arc::new(Count::new(0));
        let torn_in_model = Arc::clone(&torn);
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(move || {
            let memory = Arc::new(LoomWords::new(SLOT_BYTES / WORD_BYTES));
            let mut writer = ReplySlotWriter::new(&*memory, 0, SLOT_BYTES).unwrap();
            writer.publish(&*memory, 1, 1, 0, OLD_BODY).unwrap();
            let server_memory = Arc::clone(&memory);
            let server = loom::thread::spawn(move || {
                writer.publish(&*server_memory, 2, 1, 5, NEW_BODY).unwrap();
            });
            let mut image = [0u8; SLOT_BYTES];
            for index in [2, 3, 0, 1, 4, 5] {
                let word = memory.load(index, LoadOrdering::Relaxed);
                image[index * WORD_BYTES..(index + 1) * WORD_BYTES].copy_from_slice(&word.to_le_bytes());
            }
            memory.fence(crate::words::FenceOrdering::Acquire);
            if let Some(header) = expected_header(&image, 2).unwrap() {
                match validate_image(&image, header, 1) {
                    Fetched::Complete { .. } => assert_eq!(&image[16..32], NEW_BODY),
                    Fetched::Torn { .. } => {
                        torn_in_model.fetch_add(1, Relaxed);
                    }
                    Fetched::NotReady => unreachable!(),
                }
            }
            server.join().unwrap();
        });
        let torn = torn.load(Relaxed);
        println!("loom reply slot (body read first): {torn} torn images refused");
        assert!(torn > 0, "the model must produce torn images");
    }

    #[test]
    fn loom_reply_slot_never_accepts_a_stale_or_half_written_reply() {
        let (accepted, refused) = model(SLOT_BYTES);
        println!("loom reply slot (one read): {accepted} fetches accepted mid-run, {refused} refused");
        assert!(accepted > 0 && refused > 0, "the model must exercise both outcomes");
    }

    #[test]
    fn loom_reply_slot_two_reads_never_accept_a_mix() {
        let (accepted, refused) = model(24);
        println!("loom reply slot (two reads): {accepted} fetches accepted mid-run, {refused} refused");
        assert!(accepted > 0 && refused > 0, "the model must exercise both outcomes");
    }
}
