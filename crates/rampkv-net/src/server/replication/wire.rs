//! The replication port's bytes: the hello and its answer, the records and markers a primary
//! sends, the backup's acknowledgements; each encoded and checked here, for both sides.
//!
//! # Wire (replication port, all integers little-endian)
//! ```text
//! hello, primary -> backup (40 bytes)
//!   0 u32 magic "RKVR"   4 u16 version (3)   6 u16 primary (server index)
//!   8 u64 epoch          16 u64 first sequence number the primary will send
//!   24 u64 the stream's identity (`delta`)
//!   32 u32 flags: bit 0 catch-up (a snapshot or a delta comes first); bit 1 log region
//!               (one-sided: what follows the answer travels through the backup's log
//!               region, `log_region`); others 0
//!   36 u32 CRC32C of bytes [0, 36)
//! answer, backup -> primary (24 bytes)
//!   0 u32 magic "RKVA"   4 u16 version (3)   6 u16 status: 0 accepted, 1 stale epoch,
//!                                                  2 needs catching up, 3 malformed hello, 4 busy
//!   8 u64 accepted: the last sequence number applied (catch-up: the last one it holds of
//!         that stream, 0 for none); stale epoch: the epoch it knows
//!   16 u32 CRC32C of bytes [0, 16)           20 u32 reserved, zero
//! (bit 1: then the log region handshake, JSON lines that may fall back to TCP, `log_region`)
//! then records, primary -> backup (over TCP, or written into the log region): log record
//! frames (docs/persistence.md), lsn = sequence number, epoch = the primary's epoch when it
//! appended (never older than the hello's, but a delta's records before the hello's first
//! sequence number keep their older epochs),
//! synced_lsn = 0; and markers, which a record frame cannot be mistaken for (40 bytes):
//!   0 u32 0xFFFF_FFFF (no record is that long)   4 u32 kind: 1 snapshot, 2 in sync, 3 delta
//!   8 u64 snapshot: the first record after it; in sync: the record the backup holds up to;
//!         delta: the first record that follows (the one after what the answer said it holds)
//!   16 u64 epoch   24 u64 reserved, zero   32 u32 CRC32C of bytes [0, 32)   36 u32 magic "RKVM"
//! a snapshot marker is followed by the snapshot (rampkv_durable's snapshot file format) in
//! chunks: u32 length (1..=REPLICATION_SNAPSHOT_CHUNK_BYTES) then the bytes; length 0 ends it
//! acknowledgements, backup -> primary (16 bytes)
//!   0 u64 last sequence number applied   8 u32 CRC32C of bytes [0, 8)   12 u32 magic "RKVK"
//!   (magic "RKVY": the in-sync marker of that record was applied)
//! ```
//! With a shared secret, the binary port's authentication step (`crate::auth`) comes first.

use rampkv_durable::limits::RECORD_PAYLOAD_BYTES_MAX;
use rampkv_durable::record::RECORD_HEADER_BYTES;

const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RKVR");
const ANSWER_MAGIC: u32 = u32::from_le_bytes(*b"RKVA");
const ACK_MAGIC: u32 = u32::from_le_bytes(*b"RKVK");
const IN_SYNC_ACK_MAGIC: u32 = u32::from_le_bytes(*b"RKVY");
const MARKER_MAGIC: u32 = u32::from_le_bytes(*b"RKVM");
/// The first word of a marker: longer than any record's payload may be.
pub(super) const MARKER_LENGTH: u32 = u32::MAX;
pub(super) const MARKER_BYTES: usize = 40;
pub(super) const MARKER_SNAPSHOT: u32 = 1;
pub(super) const MARKER_IN_SYNC: u32 = 2;
pub(super) const MARKER_DELTA: u32 = 3;
pub(super) const HELLO_CATCH_UP: u32 = 1;
pub(super) const HELLO_LOG_REGION: u32 = 2;
const VERSION: u16 = 3;
// A marker is read where a record header would be, and no record's length is its first word.
const _: () = assert!(MARKER_BYTES == RECORD_HEADER_BYTES && RECORD_PAYLOAD_BYTES_MAX < MARKER_LENGTH as usize);
pub(super) const HELLO_BYTES: usize = 40;
pub(super) const ANSWER_BYTES: usize = 24;
pub(super) const ACK_BYTES: usize = 16;

pub(super) fn encode_hello(fields: &Hello) -> [u8; HELLO_BYTES] {
    let mut hello = [0u8; HELLO_BYTES];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[4..6].copy_from_slice(&VERSION.to_le_bytes());
    hello[6..8].copy_from_slice(&fields.primary.to_le_bytes());
    hello[8..16].copy_from_slice(&fields.epoch.to_le_bytes());
    hello[16..24].copy_from_slice(&fields.first.to_le_bytes());
    hello[24..32].copy_from_slice(&fields.stream.to_le_bytes());
    let flags = if fields.catch_up { HELLO_CATCH_UP } else { 0 } | if fields.log_region { HELLO_LOG_REGION } else { 0 };
    hello[32..36].copy_from_slice(&flags.to_le_bytes());
    let crc = crc32c::crc32c(&hello[0..36]);
    hello[36..40].copy_from_slice(&crc.to_le_bytes());
    hello
}

/// A well-formed hello.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) primary: u16,
    pub(super) epoch: u64,
    pub(super) first: u64,
    /// The stream's identity (`delta` module docs).
    pub(super) stream: u64,
    pub(super) catch_up: bool,
    pub(super) log_region: bool,
}

pub(super) fn decode_hello(hello: &[u8; HELLO_BYTES]) -> Option<Hello> {
    let flags = u32_at(hello, 32);
    let valid = u32_at(hello, 0) == HELLO_MAGIC
        && u16_at(hello, 4) == VERSION
        && u32_at(hello, 36) == crc32c::crc32c(&hello[0..36])
        && flags & !(HELLO_CATCH_UP | HELLO_LOG_REGION) == 0;
    valid.then(|| Hello {
        primary: u16_at(hello, 6),
        epoch: u64_at(hello, 8),
        first: u64_at(hello, 16),
        stream: u64_at(hello, 24),
        catch_up: flags & HELLO_CATCH_UP != 0,
        log_region: flags & HELLO_LOG_REGION != 0,
    })
}

pub(super) fn encode_marker(kind: u32, value: u64, epoch: u64) -> [u8; MARKER_BYTES] {
    let mut marker = [0u8; MARKER_BYTES];
    marker[0..4].copy_from_slice(&MARKER_LENGTH.to_le_bytes());
    marker[4..8].copy_from_slice(&kind.to_le_bytes());
    marker[8..16].copy_from_slice(&value.to_le_bytes());
    marker[16..24].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32c::crc32c(&marker[0..32]);
    marker[32..36].copy_from_slice(&crc.to_le_bytes());
    marker[36..40].copy_from_slice(&MARKER_MAGIC.to_le_bytes());
    marker
}

/// `(kind, value, epoch)` of a well-formed marker.
pub(super) fn decode_marker(marker: &[u8]) -> Option<(u32, u64, u64)> {
    let marker = marker.get(..MARKER_BYTES)?;
    let kind = u32_at(marker, 4);
    let valid = u32_at(marker, 0) == MARKER_LENGTH
        && matches!(kind, MARKER_SNAPSHOT | MARKER_IN_SYNC | MARKER_DELTA)
        && u64_at(marker, 24) == 0
        && u32_at(marker, 32) == crc32c::crc32c(&marker[0..32])
        && u32_at(marker, 36) == MARKER_MAGIC;
    valid.then(|| (kind, u64_at(marker, 8), u64_at(marker, 16)))
}

pub(super) fn encode_answer(status: u16, value: u64) -> [u8; ANSWER_BYTES] {
    let mut answer = [0u8; ANSWER_BYTES];
    answer[0..4].copy_from_slice(&ANSWER_MAGIC.to_le_bytes());
    answer[4..6].copy_from_slice(&VERSION.to_le_bytes());
    answer[6..8].copy_from_slice(&status.to_le_bytes());
    answer[8..16].copy_from_slice(&value.to_le_bytes());
    let crc = crc32c::crc32c(&answer[0..16]);
    answer[16..20].copy_from_slice(&crc.to_le_bytes());
    answer
}

pub(super) fn decode_answer(answer: &[u8; ANSWER_BYTES]) -> Option<(u16, u64)> {
    let valid = u32_at(answer, 0) == ANSWER_MAGIC
        && u16_at(answer, 4) == VERSION
        && u32_at(answer, 16) == crc32c::crc32c(&answer[0..16])
        && u32_at(answer, 20) == 0;
    valid.then(|| (u16_at(answer, 6), u64_at(answer, 8)))
}

pub(super) fn encode_ack(applied: u64, in_sync: bool) -> [u8; ACK_BYTES] {
    let mut ack = [0u8; ACK_BYTES];
    ack[0..8].copy_from_slice(&applied.to_le_bytes());
    let crc = crc32c::crc32c(&ack[0..8]);
    ack[8..12].copy_from_slice(&crc.to_le_bytes());
    let magic = if in_sync { IN_SYNC_ACK_MAGIC } else { ACK_MAGIC };
    ack[12..16].copy_from_slice(&magic.to_le_bytes());
    ack
}

/// `(applied, in_sync)` of a well-formed acknowledgement (`in_sync`: of the in-sync marker).
pub(super) fn decode_ack(ack: &[u8; ACK_BYTES]) -> Option<(u64, bool)> {
    let magic = u32_at(ack, 12);
    let valid = matches!(magic, ACK_MAGIC | IN_SYNC_ACK_MAGIC) && u32_at(ack, 8) == crc32c::crc32c(&ack[0..8]);
    valid.then(|| (u64_at(ack, 0), magic == IN_SYNC_ACK_MAGIC))
}

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

pub(super) fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut array = [0u8; 4];
    array.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(array)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(array)
}
