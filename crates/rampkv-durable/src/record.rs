//! Records: what a server did to its store, as the log keeps it and as replication will ship
//! it to backups. The codec stands alone: bytes in, a record or a [`RecordError`] out.
//!
//! # Format (all integers little-endian; `docs/persistence.md` has the same tables)
//! ```text
//! header (40 bytes)
//!   0  u32  payload_bytes   bytes after the header, <= RECORD_PAYLOAD_BYTES_MAX
//!   4  u32  crc32c          CRC32C of bytes [0, 4) then [8, 40 + payload_bytes)
//!   8  u8   kind            1 PREPARE, 2 COMMIT, 3 ABORT, 4 PUT
//!   9  [u8; 7]              reserved, zero
//!   16 u64  lsn             log sequence number, >= 1, consecutive within a log
//!   24 u64  epoch           configuration epoch of the writer (0 until replication exists)
//!   32 u64  synced_lsn      the highest LSN known fsynced when this record was appended
//!                           (recovery tells a torn tail from damage in the middle with it)
//! payload
//!   key      := u16 length, bytes           (length <= KEY_BYTES_MAX)
//!   value    := u32 length, bytes           (length <= VALUE_BYTES_MAX)
//!   keys     := u32 count, key * count      (count <= TXN_KEYS_MAX)
//!   writes   := u32 count, (key, value) * count   (1 <= count <= TXN_KEYS_MAX),
//!               then, only when a write expires, the expiries section of the wire
//!               (u32 count = the writes', u64 expiry * count; docs/wire.md), which ends the
//!               payload
//!   metadata := as on the wire (docs/wire.md): u8 tag 0 NONE | 1 WRITE_SET keys |
//!               2 BLOOM u16 length, bytes
//!   1 PREPARE  u64 ts, u8 flags, metadata, [keys write_set], writes
//!              flags bit 0: the write set is the metadata's write set and is not repeated
//!              (RAMP-Fast); other bits zero
//!   2 COMMIT   u64 ts
//!   3 ABORT    u64 ts                        (cooperative termination, or a STATUS that found
//!                                             the transaction unknown and marked it aborted)
//!   4 PUT      u64 ts, writes                (NoCC PUT, and S2PL's staged writes at
//!                                             COMMIT_LOCKED: stored and visible at once)
//! ```
//! Timestamps are never 0 (the initial value).
//!
//! # Contract
//! The encoder refuses (with an error, before writing a byte) what the decoder would refuse,
//! and the decoder takes any bytes: truncated, oversized or garbage input is an error value,
//! never a panic; a declared length or count is checked against the limits and against the
//! bytes present before anything is allocated, so memory grows with the input, not with what
//! it claims.

use std::sync::Arc;

use rampkv_core::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use rampkv_core::protocol::server::LogRecord;
use rampkv_core::storage::{Key, StoreWrite, StoredMetadata, Version};
use rampkv_core::types::{Expiry, Timestamp, TIMESTAMP_INITIAL};
use rampkv_core::wire::expiries::{decode_expiries, encode_expiries};
use rampkv_core::wire::{Decoder, Encoder, Metadata, WireError, WriteSet, BLOOM_BYTES_MAX};

use crate::limits::{LOG_WAITING_BYTES_MAX, RECORD_PAYLOAD_BYTES_MAX};

/// A log sequence number: 1 for a log's first record, then consecutive; 0 means "none".
pub type Lsn = u64;

/// The writes of a PREPARE or PUT: key, value and expiry, as the store takes them.
pub type Writes = Vec<StoreWrite>;

/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 40;

// The log's bound on bytes waiting for the file system takes the largest record (checked here,
// where the header's size is known, so that `limits` stays below every other module).
const _: () = assert!(LOG_WAITING_BYTES_MAX >= RECORD_HEADER_BYTES + RECORD_PAYLOAD_BYTES_MAX);

const KIND_PREPARE: u8 = 1;
const KIND_COMMIT: u8 = 2;
const KIND_ABORT: u8 = 3;
const KIND_PUT: u8 = 4;

/// PREPARE flags bit 0: the write set is the metadata's and is not repeated.
const FLAG_WRITE_SET_IS_METADATA: u8 = 1;

/// Bytes of a key's and of a value's length prefix.
const KEY_LENGTH_BYTES: usize = 2;
const VALUE_LENGTH_BYTES: usize = 4;

/// Why bytes were refused as a record (or a record as bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("record truncated: {needed} more bytes needed")]
    Truncated { needed: usize },
    #[error("record payload of {length} bytes exceeds the maximum of {max}")]
    PayloadTooLarge { length: usize, max: usize },
    #[error("record checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    #[error("reserved header bytes are not zero")]
    ReservedBytesSet,
    #[error("record with log sequence number 0")]
    ZeroLsn,
    #[error("record payload: {0}")]
    Payload(#[from] WireError),
    #[error("invalid record: {0}")]
    Invalid(&'static str),
}

/// The log position and provenance every record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordHeader {
    pub lsn: Lsn,
    pub epoch: u64,
    pub synced_lsn: Lsn,
}

/// A store operation, owned (what decoding gives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Prepare { ts: Timestamp, metadata: StoredMetadata, write_set: WriteSet, writes: Writes },
    Commit { ts: Timestamp },
    Abort { ts: Timestamp },
    Put { ts: Timestamp, writes: Writes },
}

/// A store operation, borrowed (what encoding takes, so a caller encodes without copies).
#[derive(Debug, Clone, Copy)]
pub enum RecordRef<'a> {
    Prepare { ts: Timestamp, metadata: &'a StoredMetadata, write_set: &'a WriteSet, writes: WritesRef<'a> },
    Commit { ts: Timestamp },
    Abort { ts: Timestamp },
    Put { ts: Timestamp, writes: WritesRef<'a> },
}

/// The writes of a record to encode, borrowed: writes as decoded or built, or the versions a
/// server stored (its log encodes them where the store keeps them).
#[derive(Debug, Clone, Copy)]
pub enum WritesRef<'a> {
    Values(&'a [StoreWrite]),
    /// Key-value pairs that never expire (tools, tests).
    Pairs(&'a [(Key, Box<[u8]>)]),
    Stored(&'a [(Key, Arc<Version>)]),
}

impl<'a> WritesRef<'a> {
    fn len(&self) -> usize {
        match self {
            WritesRef::Values(writes) => writes.len(),
            WritesRef::Pairs(writes) => writes.len(),
            WritesRef::Stored(writes) => writes.len(),
        }
    }

    /// Write `index`: its key and value.
    fn pair(self, index: usize) -> (&'a Key, &'a [u8]) {
        match self {
            WritesRef::Values(writes) => (&writes[index].key, &writes[index].value),
            WritesRef::Pairs(writes) => (&writes[index].0, &writes[index].1),
            WritesRef::Stored(writes) => (&writes[index].0, &writes[index].1.value),
        }
    }

    /// Write `index`'s expiry.
    fn expiry(self, index: usize) -> Expiry {
        match self {
            WritesRef::Values(writes) => writes[index].expiry,
            WritesRef::Pairs(_) => Expiry::NEVER,
            WritesRef::Stored(writes) => writes[index].1.expiry,
        }
    }

    /// Each key with its value, in order.
    fn pairs(self) -> impl ExactSizeIterator<Item = (&'a Key, &'a [u8])> {
        (0..self.len()).map(move |index| self.pair(index))
    }

    /// Each write's expiry word, in order.
    fn expiries(self) -> impl ExactSizeIterator<Item = u64> + Clone + 'a {
        (0..self.len()).map(move |index| self.expiry(index).to_word())
    }
}

impl<'a> From<&'a Vec<(Key, Box<[u8]>)>> for WritesRef<'a> {
    fn from(writes: &'a Vec<(Key, Box<[u8]>)>) -> Self {
        WritesRef::Pairs(writes)
    }
}

impl<'a> From<&'a [StoreWrite]> for WritesRef<'a> {
    fn from(writes: &'a [StoreWrite]) -> Self {
        WritesRef::Values(writes)
    }
}

impl<'a> From<&'a Writes> for WritesRef<'a> {
    fn from(writes: &'a Writes) -> Self {
        WritesRef::Values(writes)
    }
}

impl Record {
    /// A borrowed view, for encoding.
    pub fn as_ref(&self) -> RecordRef<'_> {
        match self {
            Record::Prepare { ts, metadata, write_set, writes } => {
                RecordRef::Prepare { ts: *ts, metadata, write_set, writes: writes.into() }
            }
            Record::Commit { ts } => RecordRef::Commit { ts: *ts },
            Record::Abort { ts } => RecordRef::Abort { ts: *ts },
            Record::Put { ts, writes } => RecordRef::Put { ts: *ts, writes: writes.into() },
        }
    }

    /// The transaction the record is about.
    pub fn ts(&self) -> Timestamp {
        self.as_ref().ts()
    }
}

/// What the server core asks to log ([`LogRecord`], built after it changed the store) is a
/// record as it is.
impl<'a> From<&'a LogRecord> for RecordRef<'a> {
    fn from(record: &'a LogRecord) -> Self {
        match record {
            LogRecord::Prepare { ts, metadata, write_set, writes } => {
                RecordRef::Prepare { ts: *ts, metadata, write_set, writes: WritesRef::Stored(writes) }
            }
            LogRecord::Commit { ts } => RecordRef::Commit { ts: *ts },
            LogRecord::Abort { ts } => RecordRef::Abort { ts: *ts },
            LogRecord::Put { ts, writes } => RecordRef::Put { ts: *ts, writes: WritesRef::Stored(writes) },
        }
    }
}

impl RecordRef<'_> {
    /// The transaction the record is about.
    pub fn ts(&self) -> Timestamp {
        match *self {
            RecordRef::Prepare { ts, .. }
            | RecordRef::Commit { ts }
            | RecordRef::Abort { ts }
            | RecordRef::Put { ts, .. } => ts,
        }
    }

    fn kind(&self) -> u8 {
        match self {
            RecordRef::Prepare { .. } => KIND_PREPARE,
            RecordRef::Commit { .. } => KIND_COMMIT,
            RecordRef::Abort { .. } => KIND_ABORT,
            RecordRef::Put { .. } => KIND_PUT,
        }
    }

    /// Whether the decoder would accept this record: what the encoder checks first.
    fn validate(&self) -> Result<(), RecordError> {
        if self.ts() == TIMESTAMP_INITIAL {
            return Err(RecordError::Invalid("timestamp 0 is the initial value"));
        }
        match self {
            RecordRef::Prepare { metadata, writes, .. } => {
                // A write set holds at most TXN_KEYS_MAX keys of at most KEY_BYTES_MAX bytes
                // by construction (`WriteSet`).
                validate_metadata(metadata)?;
                validate_writes(*writes)
            }
            RecordRef::Commit { .. } | RecordRef::Abort { .. } => Ok(()),
            RecordRef::Put { writes, .. } => validate_writes(*writes),
        }
    }

    /// Appends the payload (no header). Call [`RecordRef::validate`] first.
    fn encode_payload(&self, encoder: &mut Encoder<'_>) {
        encoder.u64(self.ts());
        match self {
            RecordRef::Prepare { metadata, write_set, writes, .. } => {
                let shared = matches!(metadata, StoredMetadata::WriteSet(keys) if keys == *write_set);
                encoder.u8(if shared { FLAG_WRITE_SET_IS_METADATA } else { 0 });
                metadata.as_wire().encode(encoder);
                if !shared {
                    write_set.encode(encoder);
                }
                encode_writes(*writes, encoder);
            }
            RecordRef::Commit { .. } | RecordRef::Abort { .. } => {}
            RecordRef::Put { writes, .. } => encode_writes(*writes, encoder),
        }
    }
}

fn validate_keys<'k>(keys: impl ExactSizeIterator<Item = &'k Key>, what: &'static str) -> Result<(), RecordError> {
    if keys.len() > TXN_KEYS_MAX {
        return Err(WireError::FieldTooLarge { what, length: keys.len(), max: TXN_KEYS_MAX }.into());
    }
    for key in keys {
        if key.len() > KEY_BYTES_MAX {
            return Err(WireError::FieldTooLarge { what: "key", length: key.len(), max: KEY_BYTES_MAX }.into());
        }
    }
    Ok(())
}

fn validate_metadata(metadata: &StoredMetadata) -> Result<(), RecordError> {
    match metadata {
        StoredMetadata::None => Ok(()),
        StoredMetadata::WriteSet(_) => Ok(()), // within the limits by construction
        StoredMetadata::Bloom(bits) if bits.len() > BLOOM_BYTES_MAX => {
            Err(WireError::FieldTooLarge { what: "bloom filter", length: bits.len(), max: BLOOM_BYTES_MAX }.into())
        }
        StoredMetadata::Bloom(_) => Ok(()),
    }
}

fn validate_writes(writes: WritesRef<'_>) -> Result<(), RecordError> {
    if writes.len() == 0 {
        return Err(RecordError::Invalid("a record with no writes"));
    }
    validate_keys(writes.pairs().map(|(key, _)| key), "writes")?;
    for (_, value) in writes.pairs() {
        if value.len() > VALUE_BYTES_MAX {
            return Err(WireError::FieldTooLarge { what: "value", length: value.len(), max: VALUE_BYTES_MAX }.into());
        }
    }
    if writes.expiries().any(|word| Expiry::from_word(word).is_reclaimed()) {
        return Err(RecordError::Invalid("a written expiry is marked reclaimed"));
    }
    Ok(())
}

/// The writes, then their expiries section if one expires (it ends the payload).
fn encode_writes(writes: WritesRef<'_>, encoder: &mut Encoder<'_>) {
    encoder.count(writes.len());
    for (key, value) in writes.pairs() {
        encoder.key(key);
        encoder.bytes(value);
    }
    encode_expiries(encoder, writes.expiries());
}

/// Appends `record` with `header` to `out`, as one checksummed frame; returns its length.
///
/// # Errors
/// A record the decoder would refuse (timestamp 0, no writes, a length or count over the
/// limits): nothing is appended.
pub fn encode_record(header: RecordHeader, record: RecordRef<'_>, out: &mut Vec<u8>) -> Result<usize, RecordError> {
    record.validate()?;
    if header.lsn == 0 {
        return Err(RecordError::ZeroLsn);
    }
    let start = out.len();
    out.resize(start + RECORD_HEADER_BYTES, 0);
    record.encode_payload(&mut Encoder::new(out));
    let payload_bytes = out.len() - start - RECORD_HEADER_BYTES;
    assert!(payload_bytes <= RECORD_PAYLOAD_BYTES_MAX, "validated records fit the payload bound");
    let frame = &mut out[start..];
    frame[0..4].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
    frame[8] = record.kind();
    frame[16..24].copy_from_slice(&header.lsn.to_le_bytes());
    frame[24..32].copy_from_slice(&header.epoch.to_le_bytes());
    frame[32..40].copy_from_slice(&header.synced_lsn.to_le_bytes());
    let crc = frame_crc(frame);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(frame.len())
}

/// CRC32C of a frame's bytes but its checksum field.
fn frame_crc(frame: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&frame[0..4]), &frame[8..])
}

/// A record frame whose header and checksum were verified; the payload is not decoded yet.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub header: RecordHeader,
    kind: u8,
    payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Bytes the frame occupies (header and payload).
    pub fn len(&self) -> usize {
        RECORD_HEADER_BYTES + self.payload.len()
    }

    /// Never true: a frame has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Decodes the payload.
    ///
    /// # Errors
    /// A payload that does not decode to a valid record of the frame's kind.
    pub fn record(&self) -> Result<Record, RecordError> {
        decode_payload(self.kind, self.payload)
    }
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(array)
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut array = [0u8; 4];
    array.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(array)
}

/// The LSN field of the record header at the start of `bytes`, whether or not the record
/// checks (`None`: too short to hold it): recovery tells a record the writer began from other
/// bytes with it.
pub(crate) fn header_lsn(bytes: &[u8]) -> Option<Lsn> {
    (bytes.len() >= 24).then(|| u64_at(bytes, 16))
}

/// Checks the frame at the start of `bytes` (its header, its length against the bytes present
/// and its checksum) without decoding the payload: recovery scans with it.
///
/// # Errors
/// `Truncated` when `bytes` end inside the frame; any other variant when the bytes are not a
/// record frame.
pub fn check_frame(bytes: &[u8]) -> Result<Frame<'_>, RecordError> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return Err(RecordError::Truncated { needed: RECORD_HEADER_BYTES - bytes.len() });
    }
    let payload_bytes = u32_at(bytes, 0) as usize;
    if payload_bytes > RECORD_PAYLOAD_BYTES_MAX {
        return Err(RecordError::PayloadTooLarge { length: payload_bytes, max: RECORD_PAYLOAD_BYTES_MAX });
    }
    let kind = bytes[8];
    if !(KIND_PREPARE..=KIND_PUT).contains(&kind) {
        return Err(RecordError::UnknownKind(kind));
    }
    if bytes[9..16].iter().any(|&byte| byte != 0) {
        return Err(RecordError::ReservedBytesSet);
    }
    let length = RECORD_HEADER_BYTES + payload_bytes;
    if bytes.len() < length {
        return Err(RecordError::Truncated { needed: length - bytes.len() });
    }
    let frame = &bytes[..length];
    let stored = u32_at(frame, 4);
    let computed = frame_crc(frame);
    if stored != computed {
        return Err(RecordError::ChecksumMismatch { stored, computed });
    }
    let header = RecordHeader { lsn: u64_at(frame, 16), epoch: u64_at(frame, 24), synced_lsn: u64_at(frame, 32) };
    if header.lsn == 0 {
        return Err(RecordError::ZeroLsn);
    }
    Ok(Frame { header, kind, payload: &frame[RECORD_HEADER_BYTES..] })
}

/// Decodes the record frame at the start of `bytes`: its header, the record and the frame's
/// length (bytes after it are left alone).
///
/// # Errors
/// See [`check_frame`] and [`Frame::record`].
pub fn decode_record(bytes: &[u8]) -> Result<(RecordHeader, Record, usize), RecordError> {
    let frame = check_frame(bytes)?;
    Ok((frame.header, frame.record()?, frame.len()))
}

fn decode_payload(kind: u8, payload: &[u8]) -> Result<Record, RecordError> {
    let mut decoder = Decoder::new(payload);
    let ts = decoder.u64()?;
    if ts == TIMESTAMP_INITIAL {
        return Err(RecordError::Invalid("timestamp 0 is the initial value"));
    }
    let record = match kind {
        KIND_PREPARE => {
            let flags = decoder.u8()?;
            if flags & !FLAG_WRITE_SET_IS_METADATA != 0 {
                return Err(RecordError::Invalid("unknown PREPARE flags"));
            }
            let metadata = stored_metadata(Metadata::decode(&mut decoder)?);
            let write_set = if flags & FLAG_WRITE_SET_IS_METADATA != 0 {
                match &metadata {
                    StoredMetadata::WriteSet(keys) => keys.clone(),
                    _ => return Err(RecordError::Invalid("write set said to be the metadata's, which has none")),
                }
            } else {
                WriteSet::decode(&mut decoder)?
            };
            Record::Prepare { ts, metadata, write_set, writes: decode_writes(&mut decoder)? }
        }
        KIND_COMMIT => Record::Commit { ts },
        KIND_ABORT => Record::Abort { ts },
        KIND_PUT => Record::Put { ts, writes: decode_writes(&mut decoder)? },
        other => return Err(RecordError::UnknownKind(other)),
    };
    decoder.finish()?;
    Ok(record)
}

/// Metadata as the store keeps it.
pub(crate) fn stored_metadata(metadata: Metadata) -> StoredMetadata {
    match metadata {
        Metadata::None => StoredMetadata::None,
        Metadata::WriteSet(write_set) => StoredMetadata::WriteSet(write_set),
        Metadata::Bloom(bits) => StoredMetadata::Bloom(bits.into()),
    }
}

fn decode_writes(decoder: &mut Decoder<'_>) -> Result<Writes, RecordError> {
    let count = decoder.count("writes", TXN_KEYS_MAX, KEY_LENGTH_BYTES + VALUE_LENGTH_BYTES)?;
    if count == 0 {
        return Err(RecordError::Invalid("a record with no writes"));
    }
    let mut writes = (0..count)
        .map(|_| Ok(StoreWrite::new(decoder.key()?.into_boxed_slice(), decoder.value()?.into_boxed_slice())))
        .collect::<Result<Writes, RecordError>>()?;
    if let Some(expiries) = decode_expiries(decoder, count, false)? {
        for (write, word) in writes.iter_mut().zip(expiries) {
            write.expiry = Expiry::from_word(word);
        }
    }
    Ok(writes)
}

#[cfg(test)]
mod tests;
