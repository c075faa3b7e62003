//! RAMP-Fast's metadata, a transaction's write set, in a compact form.
//!
//! # Format (after metadata tag 0x01; unchanged from a plain `keys` list)
//! ```text
//! write_set := u32 count, (u16 length, key bytes) * count
//!              count <= TXN_KEYS_MAX, every length <= KEY_BYTES_MAX
//! ```
//!
//! # Why a compact form
//! Every version a RAMP-Fast reader receives carries its writer's whole write set, and a reader
//! of `n` keys receives `n` of them per round. Decoded into a `Vec<Vec<u8>>` that is `n + 1`
//! allocations per version (`n² + n` per read) for data the reader only scans once. A
//! [`WriteSet`] keeps the keys exactly as they travel (`u16 length, bytes`, one after the
//! other) in one buffer, so decoding is one bounds walk and one copy, encoding one copy, and
//! the keys are read back as borrowed slices. The walk checks every length once; afterwards
//! the buffer is known to hold exactly `count` well-formed keys.
//!
//! The buffer is shared (`Arc<[u8]>`): a clone is a reference count, so a server's store keeps
//! the write set of a transaction once, in this form, for all of the transaction's versions
//! (`storage::StoredMetadata::WriteSet`), and the PREPAREs of one transaction to the servers of
//! one process share it too. A write set that fits [`INLINE_BYTES`] (one key of up to 20 bytes:
//! a SET's) is held inline instead, in the value that holds it: no allocation to make, and none
//! to follow when a stored version is read or dropped (on a large key space each was a cache
//! miss per SET and per GET: docs/performance.md).

use std::fmt;
use std::sync::Arc;

use super::{Decoder, Encoder, WireError};
use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX};

/// Bytes of a key's length prefix.
const KEY_LENGTH_BYTES: usize = 2;

/// Most encoded bytes a write set holds inline (so that [`WriteSet`] is 32 bytes).
pub const INLINE_BYTES: usize = 22;

/// Where a write set's encoded keys are.
#[derive(Clone)]
enum Buffer {
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    Shared(Arc<[u8]>),
}

impl Buffer {
    fn new(encoded: &[u8]) -> Buffer {
        Buffer::filled(encoded.len(), |bytes| bytes.copy_from_slice(encoded))
    }

    /// `length` bytes written by `fill`: inline when they fit, else in a buffer of their own.
    fn filled(length: usize, fill: impl FnOnce(&mut [u8])) -> Buffer {
        match length <= INLINE_BYTES {
            true => {
                let mut bytes = [0; INLINE_BYTES];
                fill(&mut bytes[..length]);
                Buffer::Inline { len: length as u8, bytes }
            }
            false => {
                let mut bytes = vec![0; length];
                fill(&mut bytes);
                Buffer::Shared(bytes.into())
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Buffer::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Buffer::Shared(shared) => shared,
        }
    }
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer::Inline { len: 0, bytes: [0; INLINE_BYTES] }
    }
}

/// A transaction's write set: its keys in wire encoding, in one buffer.
///
/// Invariant (checked by every constructor): `encoded` is exactly `count` entries of
/// `u16 length, length bytes` with `length <= KEY_BYTES_MAX`, and `count <= TXN_KEYS_MAX`.
#[derive(Clone, Default)]
pub struct WriteSet {
    encoded: Buffer,
    count: u32,
}

impl WriteSet {
    /// The write set of `keys`, in order (repeats are kept, as the wire would carry them).
    ///
    /// # Errors
    /// More than `TXN_KEYS_MAX` keys, or a key longer than `KEY_BYTES_MAX`.
    pub fn from_keys<K: AsRef<[u8]>>(keys: &[K]) -> Result<WriteSet, WireError> {
        if keys.len() > TXN_KEYS_MAX {
            return Err(WireError::FieldTooLarge { what: "write set", length: keys.len(), max: TXN_KEYS_MAX });
        }
        if let Some(key) = keys.iter().map(AsRef::as_ref).find(|key| key.len() > KEY_BYTES_MAX) {
            return Err(WireError::FieldTooLarge { what: "key", length: key.len(), max: KEY_BYTES_MAX });
        }
        let total: usize = keys.iter().map(|key| KEY_LENGTH_BYTES + key.as_ref().len()).sum();
        let fill = |encoded: &mut [u8]| {
            let mut offset = 0;
            for key in keys.iter().map(AsRef::as_ref) {
                encoded[offset..offset + KEY_LENGTH_BYTES].copy_from_slice(&(key.len() as u16).to_le_bytes());
                offset += KEY_LENGTH_BYTES;
                encoded[offset..offset + key.len()].copy_from_slice(key);
                offset += key.len();
            }
        };
        let encoded = Buffer::filled(total, fill);
        Ok(WriteSet { encoded, count: keys.len() as u32 })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The keys, borrowed, in order.
    pub fn iter(&self) -> WriteSetKeys<'_> {
        WriteSetKeys { rest: self.encoded.bytes(), remaining: self.count }
    }

    /// Whether the two share one buffer on the heap (a clone of the other, not an equal
    /// copy; a write set held inline shares none).
    pub fn shares_buffer_with(&self, other: &WriteSet) -> bool {
        matches!((&self.encoded, &other.encoded), (Buffer::Shared(one), Buffer::Shared(other)) if Arc::ptr_eq(one, other))
    }

    /// Whether the keys are held inline (see the module docs), not in a buffer on the heap.
    pub fn is_inline(&self) -> bool {
        matches!(self.encoded, Buffer::Inline { .. })
    }

    /// Whether `key` is one of the keys.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.iter().any(|entry| entry == key)
    }

    /// The keys as owned vectors (for tests and tools; the read path uses [`WriteSet::iter`]).
    pub fn to_keys(&self) -> Vec<Vec<u8>> {
        self.iter().map(<[u8]>::to_vec).collect()
    }

    /// Bytes on the wire after the metadata tag: the count and the keys.
    pub fn encoded_bytes(&self) -> usize {
        4 + self.encoded.bytes().len()
    }

    /// Decodes `u32 count, key * count`, checking every length before copying anything.
    pub fn decode(decoder: &mut Decoder<'_>) -> Result<WriteSet, WireError> {
        let count = decoder.count("write set", TXN_KEYS_MAX, KEY_LENGTH_BYTES)?;
        let span = encoded_span(decoder.remaining(), count)?;
        let encoded = decoder.take(span)?;
        Ok(WriteSet { encoded: Buffer::new(encoded), count: count as u32 })
    }

    /// Appends `u32 count, key * count`.
    pub fn encode(&self, encoder: &mut Encoder<'_>) {
        encoder.count(self.len());
        encoder.raw(self.encoded.bytes());
    }
}

/// How many leading bytes of `bytes` hold `count` keys; an error if they are truncated or a
/// length is over `KEY_BYTES_MAX`.
fn encoded_span(bytes: &[u8], count: usize) -> Result<usize, WireError> {
    let mut offset = 0;
    for _ in 0..count {
        let Some(prefix) = bytes.get(offset..offset + KEY_LENGTH_BYTES) else {
            return Err(WireError::Truncated { needed: offset + KEY_LENGTH_BYTES - bytes.len() });
        };
        let length = usize::from(u16::from_le_bytes([prefix[0], prefix[1]]));
        if length > KEY_BYTES_MAX {
            return Err(WireError::FieldTooLarge { what: "key", length, max: KEY_BYTES_MAX });
        }
        offset += KEY_LENGTH_BYTES + length;
        if offset > bytes.len() {
            return Err(WireError::Truncated { needed: offset - bytes.len() });
        }
    }
    Ok(offset)
}

/// Equal when they name the same keys in the same order (wherever the bytes are held).
impl PartialEq for WriteSet {
    fn eq(&self, other: &WriteSet) -> bool {
        self.count == other.count && (self.shares_buffer_with(other) || self.encoded.bytes() == other.encoded.bytes())
    }
}

impl Eq for WriteSet {}

impl fmt::Debug for WriteSet {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_list().entries(self.iter().map(String::from_utf8_lossy)).finish()
    }
}

impl<'a> IntoIterator for &'a WriteSet {
    type Item = &'a [u8];
    type IntoIter = WriteSetKeys<'a>;
    fn into_iter(self) -> WriteSetKeys<'a> {
        self.iter()
    }
}

/// The keys of a [`WriteSet`], borrowed from its buffer.
#[derive(Debug, Clone)]
pub struct WriteSetKeys<'a> {
    rest: &'a [u8],
    remaining: u32,
}

impl<'a> Iterator for WriteSetKeys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.remaining == 0 {
            return None;
        }
        // The constructors checked the layout; `get` keeps a broken invariant from reading
        // out of bounds (it would end the iteration early instead).
        let (prefix, rest) = self.rest.split_first_chunk::<KEY_LENGTH_BYTES>()?;
        let length = usize::from(u16::from_le_bytes(*prefix));
        let key = rest.get(..length)?;
        self.rest = &rest[length..];
        self.remaining -= 1;
        Some(key)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining as usize, Some(self.remaining as usize))
    }
}

impl ExactSizeIterator for WriteSetKeys<'_> {}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::wire::{Metadata, MetadataRef};

    fn encode_keys_plainly(keys: &[Vec<u8>]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = Encoder::new(&mut bytes);
        encoder.count(keys.len());
        for key in keys {
            encoder.key(key);
        }
        bytes
    }

    fn decode_all(bytes: &[u8]) -> Result<WriteSet, WireError> {
        let mut decoder = Decoder::new(bytes);
        let write_set = WriteSet::decode(&mut decoder)?;
        decoder.finish()?;
        Ok(write_set)
    }

    #[test]
    fn keys_come_back_in_order_with_repeats_and_empty_keys() {
        let keys: Vec<Vec<u8>> = vec![b"k1".to_vec(), Vec::new(), b"k1".to_vec(), vec![0xFF; KEY_BYTES_MAX]];
        let write_set = WriteSet::from_keys(&keys).unwrap();
        assert_eq!(write_set.len(), 4);
        assert_eq!(write_set.iter().len(), 4);
        assert_eq!(write_set.to_keys(), keys);
        assert_eq!(write_set.encoded_bytes(), encode_keys_plainly(&keys).len());
        assert!(WriteSet::default().is_empty());
        assert_eq!(WriteSet::default().iter().next(), None);
        assert_eq!(format!("{:?}", WriteSet::from_keys(&[b"a", b"b"]).unwrap()), r#"["a", "b"]"#);
    }

    #[test]
    fn a_short_write_set_is_held_inline_and_equals_the_same_keys_held_shared() {
        assert_eq!(std::mem::size_of::<WriteSet>(), 32);
        let short = WriteSet::from_keys(&[b"key:000000012345"]).unwrap();
        assert!(short.is_inline(), "one key of 16 bytes: 18 encoded bytes, inline");
        assert!(!short.shares_buffer_with(&short.clone()), "nothing on the heap to share");
        let twenty = WriteSet::from_keys(&[[7u8; 20]]).unwrap();
        assert!(twenty.is_inline());
        let long = WriteSet::from_keys(&[[7u8; 21]]).unwrap();
        assert!(!long.is_inline() && long.shares_buffer_with(&long.clone()));
        for write_set in [short, twenty, long, WriteSet::from_keys(&[b"a", b"b"]).unwrap(), WriteSet::default()] {
            let mut bytes = Vec::new();
            write_set.encode(&mut Encoder::new(&mut bytes));
            let decoded = WriteSet::decode(&mut Decoder::new(&bytes)).unwrap();
            assert_eq!((decoded.is_inline(), &decoded), (write_set.is_inline(), &write_set));
            assert_eq!(decoded.to_keys(), write_set.to_keys());
        }
        let shared = Buffer::Shared(Arc::from(&b"\x01\x00a"[..]));
        let inline = WriteSet::from_keys(&[b"a"]).unwrap();
        assert_eq!(WriteSet { encoded: shared, count: 1 }, inline, "equal wherever the bytes are");
        assert_ne!(WriteSet::from_keys(&[b"a"]).unwrap(), WriteSet::from_keys(&[b"b"]).unwrap());
    }

    #[test]
    fn oversized_keys_and_sets_are_refused_when_built() {
        let long = vec![0u8; KEY_BYTES_MAX + 1];
        assert!(matches!(WriteSet::from_keys(&[long]), Err(WireError::FieldTooLarge { what: "key", .. })));
        let many = vec![Vec::<u8>::new(); TXN_KEYS_MAX + 1];
        assert!(matches!(WriteSet::from_keys(&many), Err(WireError::FieldTooLarge { what: "write set", .. })));
        assert!(WriteSet::from_keys(&vec![Vec::<u8>::new(); TXN_KEYS_MAX]).is_ok());
    }

    #[test]
    fn bad_lengths_in_the_input_are_errors() {
        // A key length over the maximum, with the bytes present.
        let mut bytes = 1u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&((KEY_BYTES_MAX + 1) as u16).to_le_bytes());
        bytes.extend_from_slice(&[b'x'; KEY_BYTES_MAX + 1]);
        assert!(matches!(decode_all(&bytes), Err(WireError::FieldTooLarge { what: "key", .. })));
        // A count over the maximum.
        let bytes = ((TXN_KEYS_MAX + 1) as u32).to_le_bytes();
        assert!(matches!(decode_all(&bytes), Err(WireError::FieldTooLarge { what: "write set", .. })));
        // A count the bytes cannot hold, and a key running past the end.
        assert!(matches!(decode_all(&3u32.to_le_bytes()), Err(WireError::Truncated { .. })));
        let mut bytes = 1u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&5u16.to_le_bytes());
        bytes.extend_from_slice(b"abc");
        assert_eq!(decode_all(&bytes), Err(WireError::Truncated { needed: 2 }));
    }

    fn keys() -> impl Strategy<Value = Vec<Vec<u8>>> {
        vec(vec(any::<u8>(), 0..40), 0..12)
    }

    proptest! {
        /// Decoding the plain `keys` encoding gives the same keys, and encoding gives the same
        /// bytes: the wire format did not change.
        #[test]
        fn round_trips_through_the_plain_keys_encoding(keys in keys()) {
            let plain = encode_keys_plainly(&keys);
            let decoded = decode_all(&plain).unwrap();
            prop_assert_eq!(decoded.to_keys(), keys.clone());
            prop_assert_eq!(&decoded, &WriteSet::from_keys(&keys).unwrap());
            let mut encoded = Vec::new();
            decoded.encode(&mut Encoder::new(&mut encoded));
            prop_assert_eq!(&encoded, &plain);
            // The server encodes its stored keys through the borrowed form: the same bytes.
            let (mut from_keys, mut from_compact) = (Vec::new(), Vec::new());
            MetadataRef::WriteSet(&keys).encode(&mut Encoder::new(&mut from_keys));
            Metadata::WriteSet(decoded).as_ref().encode(&mut Encoder::new(&mut from_compact));
            prop_assert_eq!(&from_keys, &from_compact);
            prop_assert_eq!(&from_keys[1..], &plain[..]);
        }

        /// Every strict prefix of a valid encoding is an error, never a panic.
        #[test]
        fn truncated_input_is_an_error(keys in keys(), cut in any::<prop::sample::Index>()) {
            let plain = encode_keys_plainly(&keys);
            let cut = cut.index(plain.len());
            prop_assert!(decode_all(&plain[..cut]).is_err());
        }

        /// Arbitrary bytes decode to an error or to a write set whose keys re-encode to exactly
        /// the bytes consumed; iteration never reads out of bounds.
        #[test]
        fn garbage_never_panics(bytes in vec(any::<u8>(), 0..200)) {
            let mut decoder = Decoder::new(&bytes);
            if let Ok(write_set) = WriteSet::decode(&mut decoder) {
                let consumed = bytes.len() - decoder.remaining().len();
                prop_assert_eq!(write_set.iter().count(), write_set.len());
                prop_assert_eq!(encode_keys_plainly(&write_set.to_keys()), bytes[..consumed].to_vec());
            }
        }
    }
}
