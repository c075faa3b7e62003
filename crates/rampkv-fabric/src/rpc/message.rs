//! Request messages and the entry list shared by requests and replies.
//!
//! # Format (little-endian; byte by byte in `docs/fabric.md`)
//! A request message is the body of one ring frame (`ring.rs`) in the server's region:
//! ```text
//! +0     8  head: bit 63 HEAD (always 1), bits 0..32 generation, bits 32..48 entry count
//!           (1..=RPC_BATCH_ENTRIES_MAX), bit 48 PUSH (reply through the push ring instead of
//!           the slot), bit 49 STREAM (the reply may carry any number of entries, 0..=128,
//!           instead of one per request entry), bits 50..63 zero
//! +8     2  aux: the client's current batch size (the automatic batch-size controller's
//!           choice, so that the server sees it; informational)
//! +10    6  reserved, zero
//! +16    E  entries, packed: each a u32 length, then that many bytes
//! +16+E  .  zero padding to a multiple of 8
//! +..    8  tail: head XOR REQUEST_TAIL_MAGIC (the tail status: written with the rest)
//! ```
//! A reply body holds its entries in the same packed form, one reply entry per request entry,
//! in order. The head and tail words repeat, inside the message, what the ring's frame header
//! and trailer already guarantee (the paper's head and tail status bits): the server checks
//! both, so a message spliced from two sends is refused even if a ring bug let it through.

use super::RpcError;
use crate::limits::RPC_BATCH_ENTRIES_MAX;
use crate::rpc::reply::{u32_at, word_at};
use crate::words::padded_bytes;

/// Head bit of a request message.
pub const REQUEST_HEAD_BIT: u64 = 1 << 63;
/// Push bit of a request message: the client waits for a pushed reply.
pub const REQUEST_PUSH_BIT: u64 = 1 << 48;
/// Stream bit of a request message: the reply's entry count is free (the rampkv transport's
/// mode: a request whose reply is deferred gets none now).
pub const REQUEST_STREAM_BIT: u64 = 1 << 49;
/// XORed into the head to form the tail (bit 63 clear, so the tail never equals the head).
pub const REQUEST_TAIL_MAGIC: u64 = 0x4A61_6B69_726F_5246;
const GENERATION_MASK: u64 = 0xFFFF_FFFF;
const COUNT_SHIFT: u32 = 32;
const COUNT_MASK: u64 = 0xFFFF;
/// Bytes before the entries of a request.
pub const REQUEST_HEADER_BYTES: usize = 16;
/// Bytes of the tail word.
pub const REQUEST_TAIL_BYTES: usize = 8;
/// Bytes of an entry's length prefix.
pub const ENTRY_PREFIX_BYTES: usize = 4;

/// Bytes a request message with `entries_bytes` of packed entries occupies.
pub const fn request_message_bytes(entries_bytes: usize) -> usize {
    REQUEST_HEADER_BYTES + padded_bytes(entries_bytes) + REQUEST_TAIL_BYTES
}

/// Appends one entry (length prefix and bytes) to `out`.
pub fn push_entry(out: &mut Vec<u8>, entry: &[u8]) {
    out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
    out.extend_from_slice(entry);
}

/// Entries under construction: a packed entry list and its count. Used for request batches
/// and for the server's replies.
#[derive(Debug, Default, Clone)]
pub struct EntryList {
    bytes: Vec<u8>,
    count: usize,
}

impl EntryList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }
    /// Appends an entry.
    pub fn push(&mut self, entry: &[u8]) {
        push_entry(&mut self.bytes, entry);
        self.count += 1;
    }
    /// Removes every entry (keeps the allocation).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }
    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// The packed bytes.
    pub fn packed(&self) -> &[u8] {
        &self.bytes
    }
}

/// Encodes a request message into `out`.
pub fn encode_request(out: &mut Vec<u8>, generation: u32, push: bool, stream: bool, aux: u16, entries: &EntryList) {
    debug_assert!((1..=RPC_BATCH_ENTRIES_MAX).contains(&entries.len()));
    let head = REQUEST_HEAD_BIT
        | if push { REQUEST_PUSH_BIT } else { 0 }
        | if stream { REQUEST_STREAM_BIT } else { 0 }
        | ((entries.len() as u64) << COUNT_SHIFT)
        | u64::from(generation);
    out.clear();
    out.extend_from_slice(&head.to_le_bytes());
    out.extend_from_slice(&aux.to_le_bytes());
    out.extend_from_slice(&[0; 6]);
    out.extend_from_slice(entries.packed());
    out.resize(REQUEST_HEADER_BYTES + padded_bytes(entries.packed().len()), 0);
    out.extend_from_slice(&(head ^ REQUEST_TAIL_MAGIC).to_le_bytes());
}

/// A decoded request message; borrows the receiver's copy.
#[derive(Debug, Clone, Copy)]
pub struct RequestMessage<'a> {
    /// The call's generation.
    pub generation: u32,
    /// Whether the reply is to be pushed.
    pub push: bool,
    /// Whether the reply's entry count is free.
    pub stream: bool,
    /// The client's batch size (aux field).
    pub aux: u16,
    /// The entries.
    pub entries: Entries<'a>,
}

/// Decodes and checks a request message. Bad input from a peer is an error, never a panic.
///
/// # Errors
/// `Corrupt` for a message no correct client writes.
pub fn decode_request(message: &[u8]) -> Result<RequestMessage<'_>, RpcError> {
    let corrupt = |reason| Err(RpcError::Corrupt { reason });
    if message.len() < REQUEST_HEADER_BYTES + REQUEST_TAIL_BYTES || message.len() % 8 != 0 {
        return corrupt("request message length");
    }
    let head = word_at(message, 0);
    let known =
        REQUEST_HEAD_BIT | REQUEST_PUSH_BIT | REQUEST_STREAM_BIT | (COUNT_MASK << COUNT_SHIFT) | GENERATION_MASK;
    if head & REQUEST_HEAD_BIT == 0 || head & !known != 0 {
        return corrupt("request head bits");
    }
    if word_at(message, message.len() - REQUEST_TAIL_BYTES) != head ^ REQUEST_TAIL_MAGIC {
        return corrupt("request tail does not match its head");
    }
    if message[10..16].iter().any(|&byte| byte != 0) {
        return corrupt("request reserved bytes not zero");
    }
    let count = ((head >> COUNT_SHIFT) & COUNT_MASK) as usize;
    if !(1..=RPC_BATCH_ENTRIES_MAX).contains(&count) {
        return corrupt("request entry count");
    }
    let area = &message[REQUEST_HEADER_BYTES..message.len() - REQUEST_TAIL_BYTES];
    let entries = Entries::parse(area, count)?;
    if padded_bytes(entries.bytes.len()) != area.len() || area[entries.bytes.len()..].iter().any(|&byte| byte != 0) {
        return corrupt("request padding");
    }
    Ok(RequestMessage {
        generation: (head & GENERATION_MASK) as u32,
        push: head & REQUEST_PUSH_BIT != 0,
        stream: head & REQUEST_STREAM_BIT != 0,
        aux: u16::from_le_bytes([message[8], message[9]]),
        entries,
    })
}

/// A checked packed entry list: iterating yields each entry's bytes.
#[derive(Debug, Clone, Copy)]
pub struct Entries<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> Entries<'a> {
    /// Checks that `area` starts with exactly `count` well-formed entries and returns them
    /// (bytes after them are left to the caller: padding).
    ///
    /// # Errors
    /// `Corrupt` if an entry runs past the area.
    pub fn parse(area: &'a [u8], count: usize) -> Result<Self, RpcError> {
        let mut at = 0usize;
        for _ in 0..count {
            if area.len() - at < ENTRY_PREFIX_BYTES {
                return Err(RpcError::Corrupt { reason: "entry length prefix past the end" });
            }
            let len = u32_at(area, at) as usize;
            at += ENTRY_PREFIX_BYTES;
            if area.len() - at < len {
                return Err(RpcError::Corrupt { reason: "entry past the end" });
            }
            at += len;
        }
        Ok(Self { bytes: &area[..at], count })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes the packed entries occupy.
    pub fn bytes_len(&self) -> usize {
        self.bytes.len()
    }

    /// The entries in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let bytes = self.bytes;
        let mut at = 0usize;
        (0..self.count).map(move |_| {
            let len = u32_at(bytes, at) as usize;
            let entry = &bytes[at + ENTRY_PREFIX_BYTES..at + ENTRY_PREFIX_BYTES + len];
            at += ENTRY_PREFIX_BYTES + len;
            entry
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_layout_round_trips_and_is_exact() {
        let mut entries = EntryList::new();
        entries.push(b"ab");
        entries.push(b"");
        let mut message = Vec::new();
        encode_request(&mut message, 9, true, false, 4, &entries);
        let head = (1u64 << 63) | (1 << 48) | (2 << 32) | 9;
        assert_eq!(word_at(&message, 0), head);
        assert_eq!(&message[8..16], &[4, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&message[16..26], &[2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        assert_eq!(message.len(), request_message_bytes(10));
        assert_eq!(word_at(&message, 32), head ^ REQUEST_TAIL_MAGIC);
        let decoded = decode_request(&message).unwrap();
        assert_eq!((decoded.generation, decoded.push, decoded.aux), (9, true, 4));
        assert_eq!(decoded.entries.iter().collect::<Vec<_>>(), vec![&b"ab"[..], &b""[..]]);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let mut entries = EntryList::new();
        entries.push(b"abcdef");
        let mut good = Vec::new();
        encode_request(&mut good, 1, false, true, 1, &entries);
        assert!(decode_request(&good).unwrap().stream);
        assert!(decode_request(&good).is_ok());
        let mutate = |at: usize, value: u8| {
            let mut bad = good.clone();
            bad[at] = value;
            decode_request(&bad).map(|_| ())
        };
        assert!(mutate(7, 0x00).is_err(), "head bit clear");
        assert!(mutate(16, 200).is_err(), "entry longer than the message");
        assert!(mutate(12, 1).is_err(), "reserved byte");
        assert!(mutate(26, 1).is_err(), "padding byte");
        assert!(mutate(good.len() - 1, 0).is_err(), "tail");
        assert!(decode_request(&good[..16]).is_err());
        // A count of zero (head and tail consistent) is refused too.
        let head = REQUEST_HEAD_BIT | 1;
        let mut zero = head.to_le_bytes().to_vec();
        zero.extend_from_slice(&[0; 8]);
        zero.extend_from_slice(&(head ^ REQUEST_TAIL_MAGIC).to_le_bytes());
        assert!(decode_request(&zero).is_err());
    }
}
