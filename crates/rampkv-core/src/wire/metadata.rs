//! Per-version metadata: what a reader learns about the rest of the writing transaction.
//!
//! # Format
//! ```text
//! metadata := u8 tag, then
//!   0x00 NONE                                   (RAMP-Small, NoCC, the initial value)
//!   0x01 WRITE_SET  keys                        (RAMP-Fast: the transaction's write set;
//!                                                see write_set.rs)
//!   0x02 BLOOM      u16 length, bytes           (RAMP-Hybrid: Bloom filter of the write set,
//!                                                length <= BLOOM_BYTES_MAX)
//! ```

use super::write_set::WriteSet;
use super::{Decoder, Encoder, WireError};

/// Largest Bloom filter accepted (8,192 bits).
pub const BLOOM_BYTES_MAX: usize = 1024;

const TAG_NONE: u8 = 0;
const TAG_WRITE_SET: u8 = 1;
const TAG_BLOOM: u8 = 2;

/// Metadata as decoded from the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Metadata {
    #[default]
    None,
    /// The write set, its keys in one buffer ([`WriteSet::from_keys`] builds one).
    WriteSet(WriteSet),
    Bloom(Vec<u8>),
}

/// Metadata borrowed from wherever it is stored, for encoding without copies.
#[derive(Debug, Clone, Copy)]
pub enum MetadataRef<'a, K> {
    None,
    /// A write set stored as separate keys (the server's versions).
    WriteSet(&'a [K]),
    /// A write set already in its compact wire form (a client's PREPARE, a decoded reply).
    EncodedWriteSet(&'a WriteSet),
    Bloom(&'a [u8]),
}

impl Metadata {
    /// A borrowed view, for encoding.
    pub fn as_ref(&self) -> MetadataRef<'_, Vec<u8>> {
        match self {
            Metadata::None => MetadataRef::None,
            Metadata::WriteSet(write_set) => MetadataRef::EncodedWriteSet(write_set),
            Metadata::Bloom(bits) => MetadataRef::Bloom(bits),
        }
    }

    /// Bytes this metadata occupies on the wire (the per-item metadata cost of an algorithm).
    pub fn encoded_bytes(&self) -> usize {
        match self {
            Metadata::None => 1,
            Metadata::WriteSet(write_set) => 1 + write_set.encoded_bytes(),
            Metadata::Bloom(bits) => 1 + 2 + bits.len(),
        }
    }

    pub fn decode(decoder: &mut Decoder<'_>) -> Result<Metadata, WireError> {
        match decoder.u8()? {
            TAG_NONE => Ok(Metadata::None),
            TAG_WRITE_SET => Ok(Metadata::WriteSet(WriteSet::decode(decoder)?)),
            TAG_BLOOM => {
                let length = decoder.u16()? as usize;
                if length > BLOOM_BYTES_MAX {
                    return Err(WireError::FieldTooLarge { what: "bloom filter", length, max: BLOOM_BYTES_MAX });
                }
                Ok(Metadata::Bloom(decoder.take(length)?.to_vec()))
            }
            _ => Err(WireError::Invalid("unknown metadata tag")),
        }
    }
}

impl<K: AsRef<[u8]>> MetadataRef<'_, K> {
    pub fn encode(&self, encoder: &mut Encoder<'_>) {
        match self {
            MetadataRef::None => encoder.u8(TAG_NONE),
            MetadataRef::WriteSet(keys) => {
                encoder.u8(TAG_WRITE_SET);
                encoder.count(keys.len());
                for key in keys.iter() {
                    encoder.key(key.as_ref());
                }
            }
            MetadataRef::EncodedWriteSet(write_set) => {
                encoder.u8(TAG_WRITE_SET);
                write_set.encode(encoder);
            }
            MetadataRef::Bloom(bits) => {
                assert!(bits.len() <= BLOOM_BYTES_MAX);
                encoder.u8(TAG_BLOOM);
                encoder.u16(bits.len() as u16);
                encoder.raw(bits);
            }
        }
    }
}
