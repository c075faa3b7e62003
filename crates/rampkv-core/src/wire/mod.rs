//! The binary wire format shared by every message transport (TCP frames, ring messages).
//!
//! # Layout
//! - [`frame`]: the fixed 16-byte frame header and the "check complete, then parse" step.
//! - [`request`]: client-to-server messages, encoder and decoder, with their byte format.
//! - [`response`]: server-to-client messages, likewise.
//! - [`keyspace`]: listing a partition's live keys page by page, and counting them.
//! - [`auth`]: the binary port's authentication step (connection-level frames, before any
//!   request, on a server with a shared secret).
//! - [`metadata`]: what a version carries about its transaction; [`write_set`]: RAMP-Fast's
//!   write set in one buffer (decoded without an allocation per key).
//! - [`expiries`]: when written and returned versions expire (a section after the rest,
//!   present only when one does).
//!
//! All integers are little-endian and fixed-width. A decoder never trusts a length or count
//! field: it checks it against the bytes present and against the limits in [`crate::limits`]
//! before allocating, so truncated, oversized or garbage input decodes to a [`WireError`],
//! never a panic and never a huge allocation. `docs/wire.md` has the byte tables.

pub mod auth;
pub mod expiries;
pub mod frame;
pub mod keyspace;
pub mod metadata;
pub mod request;
pub mod response;
pub mod update;
pub mod write_set;

pub use auth::{AuthFrame, AUTH_BYTES};
pub use frame::{FrameHeader, FRAME_HEADER_BYTES};
pub use keyspace::{CountKeys, KeyPage, ListKeys};
pub use metadata::{Metadata, MetadataRef, BLOOM_BYTES_MAX};
pub use request::{GetItem, Request, Selector, Write};
pub use response::{ErrorCode, Response, TxnState, VersionItem};
pub use update::{ExpireCondition, GetExExpiry, SetCondition, SetExpiry, UpdateOp, UpdateResult};
pub use write_set::{WriteSet, WriteSetKeys};

/// What a HELLO says of the cluster file its sender runs with: the partition count, and the
/// index of the server the HELLO is addressed to (in a request) or answered by (in a reply). A
/// client and a server started with different cluster files refuse each other instead of
/// routing keys to a server that does not own them. Absent (`None`): the sender has no cluster
/// file (a server without `--cluster`) or predates the field; nothing is checked then.
///
/// # Format
/// Appended to the HELLO body: u32 `partitions`, u32 `server_index` (8 bytes), or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterView {
    pub partitions: u32,
    pub server_index: u32,
}

impl ClusterView {
    /// Appends the view, if any (nothing for `None`: the body an older peer sends).
    pub fn encode(view: Option<ClusterView>, encoder: &mut Encoder<'_>) {
        if let Some(view) = view {
            encoder.u32(view.partitions);
            encoder.u32(view.server_index);
        }
    }

    /// Decodes the view at the end of a HELLO body: none if no byte is left.
    pub fn decode(decoder: &mut Decoder<'_>) -> Result<Option<ClusterView>, WireError> {
        if decoder.remaining().is_empty() {
            return Ok(None);
        }
        Ok(Some(ClusterView { partitions: decoder.u32()?, server_index: decoder.u32()? }))
    }
}

use crate::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};

/// Why bytes from the network were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    #[error("message truncated: needed {needed} more bytes")]
    Truncated { needed: usize },
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown message kind {0:#04x}")]
    UnknownKind(u8),
    #[error("reserved header bits are set: {0:#06x}")]
    ReservedBitsSet(u16),
    #[error("frame body of {length} bytes exceeds the maximum of {max}")]
    FrameTooLarge { length: usize, max: usize },
    #[error("{what} of {length} exceeds the maximum of {max}")]
    FieldTooLarge { what: &'static str, length: usize, max: usize },
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    #[error("invalid field: {0}")]
    Invalid(&'static str),
}

/// Appends little-endian fields to a buffer.
pub struct Encoder<'a> {
    buffer: &'a mut Vec<u8>,
}

impl<'a> Encoder<'a> {
    pub fn new(buffer: &'a mut Vec<u8>) -> Self {
        Self { buffer }
    }
    pub fn u8(&mut self, value: u8) {
        self.buffer.push(value);
    }
    pub fn raw(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }
    pub fn u16(&mut self, value: u16) {
        self.buffer.extend_from_slice(&value.to_le_bytes());
    }
    pub fn u32(&mut self, value: u32) {
        self.buffer.extend_from_slice(&value.to_le_bytes());
    }
    pub fn u64(&mut self, value: u64) {
        self.buffer.extend_from_slice(&value.to_le_bytes());
    }
    /// A count of following items, checked by the caller against the limits.
    pub fn count(&mut self, count: usize) {
        self.u32(u32::try_from(count).expect("count checked against limits"));
    }
    /// A key: u16 length then the bytes.
    pub fn key(&mut self, key: &[u8]) {
        debug_assert!(key.len() <= KEY_BYTES_MAX);
        self.u16(key.len() as u16);
        self.buffer.extend_from_slice(key);
    }
    /// A value or other byte string: u32 length then the bytes.
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.count(bytes.len());
        self.buffer.extend_from_slice(bytes);
    }
}

/// Reads little-endian fields from a complete message body.
pub struct Decoder<'a> {
    bytes: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }
    /// The bytes not consumed yet.
    pub fn remaining(&self) -> &'a [u8] {
        self.bytes
    }
    pub fn take(&mut self, length: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < length {
            return Err(WireError::Truncated { needed: length - self.bytes.len() });
        }
        let (head, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A count of items, each at least `item_bytes_min` long: refused if above `max` or if the
    /// remaining bytes cannot hold that many items (so garbage never drives an allocation).
    pub fn count(&mut self, what: &'static str, max: usize, item_bytes_min: usize) -> Result<usize, WireError> {
        let count = self.u32()? as usize;
        if count > max {
            return Err(WireError::FieldTooLarge { what, length: count, max });
        }
        let needed = count.saturating_mul(item_bytes_min);
        if needed > self.bytes.len() {
            return Err(WireError::Truncated { needed: needed - self.bytes.len() });
        }
        Ok(count)
    }
    pub fn key(&mut self) -> Result<Vec<u8>, WireError> {
        let length = self.u16()? as usize;
        if length > KEY_BYTES_MAX {
            return Err(WireError::FieldTooLarge { what: "key", length, max: KEY_BYTES_MAX });
        }
        Ok(self.take(length)?.to_vec())
    }
    /// A value: in a spare buffer of its length when this thread keeps them (`spare`).
    pub fn value(&mut self) -> Result<Vec<u8>, WireError> {
        Ok(crate::spare::copy(self.field_up_to("value", VALUE_BYTES_MAX)?))
    }
    pub fn bytes_up_to(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, WireError> {
        Ok(self.field_up_to(what, max)?.to_vec())
    }
    /// A u32 length then that many bytes, borrowed; an error past `max`.
    fn field_up_to(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], WireError> {
        let length = self.u32()? as usize;
        if length > max {
            return Err(WireError::FieldTooLarge { what, length, max });
        }
        self.take(length)
    }
    /// A list of keys: u32 count then keys.
    pub fn keys(&mut self, what: &'static str) -> Result<Vec<Vec<u8>>, WireError> {
        let count = self.count(what, TXN_KEYS_MAX, 2)?;
        (0..count).map(|_| self.key()).collect()
    }
    /// Succeeds only if every byte was consumed.
    pub fn finish(self) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::TrailingBytes(self.bytes.len()))
        }
    }
}

#[cfg(test)]
mod tests;
