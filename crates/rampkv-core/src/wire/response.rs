//! Server-to-client messages.
//!
//! # Format (frame bodies, all integers little-endian; `key`, `value`, `keys` as in request.rs)
//! ```text
//! 0x81 HELLO     u16 client_id_first, u16 client_ids_granted [u32 partitions, u32 server_index]
//! 0x82 VERSIONS  u32 count, (u64 ts, value, metadata) * count [, expiries]
//!                one entry per GET item, in request order; ts 0 = the initial (empty) value,
//!                or for HIGHEST_OF: none of the candidates is stored; expiries (expiries.rs)
//!                last of all (after the slots or arrival timestamps below too), present only
//!                when an entry expires
//! 0x83 ACK       (empty)                        PREPARE, COMMIT, PUT, LOCK_WRITE, COMMIT_LOCKED, RELEASE done
//! 0x84 STATUS    u8 state                       0 unknown (now aborted here), 1 prepared,
//!                                               2 committed, 3 aborted
//! 0x85 VERSIONS_LOCATED  the VERSIONS body, then u32 count (equal to the VERSIONS count),
//!                u32 slot * count: the item slot of each GET_LOCATE key in the server's item
//!                region (u32::MAX = the key has no slot; see docs/fabric.md, "GET*")
//! 0x86 VERSIONS_LOCKED  the VERSIONS body, then u32 count (equal to the VERSIONS count),
//!                u64 ts * count: per LOCK_READ key, the timestamp of its latest committed
//!                version when the lock request arrived, before any lock wait (S2PL evidence:
//!                what a read taking no lock would have returned; docs/history.md)
//! 0x8B UPDATED  result                          the outcome of an UPDATE (update.rs)
//! 0xFF ERROR     u16 code, u32 length, UTF-8 message (length <= ERROR_MESSAGE_BYTES_MAX)
//!                codes: 1 BadRequest, 2 VersionGone, 3 Internal, 4 Aborted
//! 0x89 KEYS, 0x8A KEY_COUNT                     the key space: see keyspace.rs
//! ```

use super::expiries::{decode_expiries, encode_expiries};
use super::frame::{append_frame, try_append_frame};
use super::keyspace::{KeyPage, KIND_KEYS, KIND_KEY_COUNT};
use super::metadata::{Metadata, MetadataRef};
use super::update::UpdateResult;
use super::{ClusterView, Decoder, Encoder, WireError};
use crate::limits::{TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Expiry, Timestamp};
use bytes::Bytes;

pub const KIND_HELLO_REPLY: u8 = 0x81;
pub const KIND_VERSIONS: u8 = 0x82;
pub const KIND_ACK: u8 = 0x83;
pub const KIND_STATUS: u8 = 0x84;
pub const KIND_VERSIONS_LOCATED: u8 = 0x85;
pub const KIND_VERSIONS_LOCKED: u8 = 0x86;
pub const KIND_UPDATED: u8 = 0x8B;
pub const KIND_ERROR: u8 = 0xFF;

/// In VERSIONS_LOCATED: the key has no item slot.
pub const SLOT_NONE: u32 = u32::MAX;

/// Longest error message sent; longer ones are cut.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;

/// One version returned by a GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionItem {
    pub ts: Timestamp,
    /// The value: decoded from a frame, or shared with the stored version it was read from
    /// (a server in the same process answers without copying it).
    pub value: Bytes,
    /// What the writing transaction attached (its write set, a Bloom filter of it, or nothing).
    pub metadata: Metadata,
    /// When the version stops being visible (the reader judges it), or that the server
    /// reclaimed it (its value is gone).
    pub expiry: Expiry,
}

impl VersionItem {
    /// A version that never expires.
    pub fn new(ts: Timestamp, value: impl Into<Bytes>, metadata: Metadata) -> Self {
        Self { ts, value: value.into(), metadata, expiry: Expiry::NEVER }
    }
}

/// Why a server refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request was malformed or broke a limit; nothing was changed.
    BadRequest,
    /// A requested version is no longer stored (collected); the read should restart.
    VersionGone,
    /// The server could not serve the request for a reason of its own.
    Internal,
    /// S2PL: the transaction must abort (wait-die, or a lock wait timed out) and retry.
    Aborted,
    /// Replication: this server is not (or no longer) the primary of a partition the request
    /// names, or its lease lapsed; nothing was changed. The client fetches the configuration
    /// and goes to the partition's current primary.
    NotPrimary,
    /// A code this build does not know (from a newer peer).
    Unknown(u16),
}

impl ErrorCode {
    fn to_wire(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 1,
            ErrorCode::VersionGone => 2,
            ErrorCode::Internal => 3,
            ErrorCode::Aborted => 4,
            ErrorCode::NotPrimary => 5,
            ErrorCode::Unknown(code) => code,
        }
    }
    fn from_wire(code: u16) -> Self {
        match code {
            1 => ErrorCode::BadRequest,
            2 => ErrorCode::VersionGone,
            3 => ErrorCode::Internal,
            4 => ErrorCode::Aborted,
            5 => ErrorCode::NotPrimary,
            other => ErrorCode::Unknown(other),
        }
    }
}

/// What a server knows of a transaction (recovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnState {
    /// Never prepared here; from now on a PREPARE of it is refused here.
    Unknown,
    Prepared,
    Committed,
    Aborted,
}

/// A reply from a server to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Response {
    /// `cluster`: the server's cluster file's partition count and its index in it (none: it
    /// has no cluster file).
    Hello {
        client_id_first: u16,
        client_ids_granted: u16,
        cluster: Option<ClusterView>,
    },
    Versions {
        items: Vec<VersionItem>,
    },
    /// The reply to GET_LOCATE: the versions, and per item its slot index in the server's
    /// item region (`None`: not published in a slot).
    VersionsLocated {
        items: Vec<VersionItem>,
        slots: Vec<Option<u32>>,
    },
    /// The reply to LOCK_READ (S2PL): the versions, and per item the timestamp of the key's
    /// latest committed version when the lock request arrived.
    VersionsLocked {
        items: Vec<VersionItem>,
        on_arrival: Vec<Timestamp>,
    },
    Ack,
    Status {
        state: TxnState,
    },
    /// The reply to UPDATE.
    Updated(UpdateResult),
    Error {
        code: ErrorCode,
        message: String,
    },
    /// The reply to LIST_KEYS.
    Keys(KeyPage),
    /// The reply to COUNT_KEYS.
    KeyCount {
        count: u64,
    },
}

impl Response {
    /// A `BadRequest` error reply.
    pub fn bad_request(message: impl Into<String>) -> Response {
        Response::Error { code: ErrorCode::BadRequest, message: message.into() }
    }

    /// The frame kind byte of this response.
    pub fn kind(&self) -> u8 {
        match self {
            Response::Hello { .. } => KIND_HELLO_REPLY,
            Response::Versions { .. } => KIND_VERSIONS,
            Response::VersionsLocated { .. } => KIND_VERSIONS_LOCATED,
            Response::VersionsLocked { .. } => KIND_VERSIONS_LOCKED,
            Response::Ack => KIND_ACK,
            Response::Status { .. } => KIND_STATUS,
            Response::Updated(_) => KIND_UPDATED,
            Response::Error { .. } => KIND_ERROR,
            Response::Keys(_) => KIND_KEYS,
            Response::KeyCount { .. } => KIND_KEY_COUNT,
        }
    }

    /// Appends this response as one frame to `out` (as [`append_reply_frame`]: a reply too
    /// large for a frame becomes an ERROR).
    pub fn encode_frame(&self, request_id: u64, out: &mut Vec<u8>) {
        append_reply_frame(out, self.kind(), request_id, |body| self.encode_body(body));
    }

    /// Appends the body of this response (no frame header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        let mut encoder = Encoder::new(out);
        match self {
            Response::Hello { client_id_first, client_ids_granted, cluster } => {
                encoder.u16(*client_id_first);
                encoder.u16(*client_ids_granted);
                ClusterView::encode(*cluster, &mut encoder);
            }
            Response::Versions { items } => {
                assert!(items.len() <= TXN_KEYS_MAX);
                encoder.count(items.len());
                for item in items {
                    encode_version(&mut encoder, item.ts, &item.value, item.metadata.as_ref());
                }
                encode_expiries(&mut encoder, items.iter().map(|item| item.expiry.to_word()));
            }
            Response::VersionsLocated { items, slots } => {
                assert!(items.len() <= TXN_KEYS_MAX && slots.len() == items.len());
                encoder.count(items.len());
                for item in items {
                    encode_version(&mut encoder, item.ts, &item.value, item.metadata.as_ref());
                }
                encode_slots(&mut encoder, slots.iter().copied());
                encode_expiries(&mut encoder, items.iter().map(|item| item.expiry.to_word()));
            }
            Response::VersionsLocked { items, on_arrival } => {
                assert!(items.len() <= TXN_KEYS_MAX && on_arrival.len() == items.len());
                encoder.count(items.len());
                for item in items {
                    encode_version(&mut encoder, item.ts, &item.value, item.metadata.as_ref());
                }
                encode_timestamps(&mut encoder, on_arrival.iter().copied());
                encode_expiries(&mut encoder, items.iter().map(|item| item.expiry.to_word()));
            }
            Response::Ack => {}
            Response::Status { state } => encoder.u8(match state {
                TxnState::Unknown => 0,
                TxnState::Prepared => 1,
                TxnState::Committed => 2,
                TxnState::Aborted => 3,
            }),
            Response::Updated(result) => result.encode(&mut encoder),
            Response::Error { code, message } => {
                encoder.u16(code.to_wire());
                encoder.bytes(truncate_utf8(message, ERROR_MESSAGE_BYTES_MAX).as_bytes());
            }
            Response::Keys(page) => page.encode(&mut encoder),
            Response::KeyCount { count } => encoder.u64(*count),
        }
    }

    /// Decodes a response body of the given kind; every byte must be consumed.
    pub fn decode(kind: u8, body: &[u8]) -> Result<Response, WireError> {
        let mut decoder = Decoder::new(body);
        let response = match kind {
            KIND_HELLO_REPLY => Response::Hello {
                client_id_first: decoder.u16()?,
                client_ids_granted: decoder.u16()?,
                cluster: ClusterView::decode(&mut decoder)?,
            },
            KIND_VERSIONS => {
                let mut items = decode_versions(&mut decoder)?;
                decode_item_expiries(&mut decoder, &mut items)?;
                Response::Versions { items }
            }
            KIND_VERSIONS_LOCATED => {
                let items = decode_versions(&mut decoder)?;
                let count = decoder.count("slots", TXN_KEYS_MAX, 4)?;
                if count != items.len() {
                    return Err(WireError::Invalid("slot count differs from the version count"));
                }
                let slots = (0..count)
                    .map(|_| decoder.u32().map(|slot| (slot != SLOT_NONE).then_some(slot)))
                    .collect::<Result<_, WireError>>()?;
                let mut items = items;
                decode_item_expiries(&mut decoder, &mut items)?;
                Response::VersionsLocated { items, slots }
            }
            KIND_VERSIONS_LOCKED => {
                let items = decode_versions(&mut decoder)?;
                let count = decoder.count("arrival timestamps", TXN_KEYS_MAX, 8)?;
                if count != items.len() {
                    return Err(WireError::Invalid("arrival timestamp count differs from the version count"));
                }
                let on_arrival = (0..count).map(|_| decoder.u64()).collect::<Result<_, WireError>>()?;
                let mut items = items;
                decode_item_expiries(&mut decoder, &mut items)?;
                Response::VersionsLocked { items, on_arrival }
            }
            KIND_ACK => Response::Ack,
            KIND_STATUS => Response::Status {
                state: match decoder.u8()? {
                    0 => TxnState::Unknown,
                    1 => TxnState::Prepared,
                    2 => TxnState::Committed,
                    3 => TxnState::Aborted,
                    _ => return Err(WireError::Invalid("unknown transaction state")),
                },
            },
            KIND_UPDATED => Response::Updated(UpdateResult::decode(&mut decoder)?),
            KIND_ERROR => {
                let code = ErrorCode::from_wire(decoder.u16()?);
                let message = decoder.bytes_up_to("error message", ERROR_MESSAGE_BYTES_MAX)?;
                let message =
                    String::from_utf8(message).map_err(|_| WireError::Invalid("error message is not UTF-8"))?;
                Response::Error { code, message }
            }
            KIND_KEYS => Response::Keys(KeyPage::decode(&mut decoder)?),
            KIND_KEY_COUNT => Response::KeyCount { count: decoder.u64()? },
            other => return Err(WireError::UnknownKind(other)),
        };
        decoder.finish()?;
        Ok(response)
    }
}

fn decode_versions(decoder: &mut Decoder<'_>) -> Result<Vec<VersionItem>, WireError> {
    let count = decoder.count("versions", TXN_KEYS_MAX, 13)?;
    (0..count)
        .map(|_| {
            Ok(VersionItem::new(
                decoder.u64()?,
                decoder.bytes_up_to("value", VALUE_BYTES_MAX)?,
                Metadata::decode(decoder)?,
            ))
        })
        .collect()
}

/// The expiries section at the end of a reply, if any, into its entries.
fn decode_item_expiries(decoder: &mut Decoder<'_>, items: &mut [VersionItem]) -> Result<(), WireError> {
    if let Some(expiries) = decode_expiries(decoder, items.len(), true)? {
        for (item, word) in items.iter_mut().zip(expiries) {
            item.expiry = Expiry::from_word(word);
        }
    }
    Ok(())
}

fn encode_slots(encoder: &mut Encoder<'_>, slots: impl ExactSizeIterator<Item = Option<u32>>) {
    encoder.count(slots.len());
    for slot in slots {
        debug_assert!(slot != Some(SLOT_NONE), "slot indices stay below u32::MAX");
        encoder.u32(slot.unwrap_or(SLOT_NONE));
    }
}

fn encode_timestamps(encoder: &mut Encoder<'_>, timestamps: impl ExactSizeIterator<Item = Timestamp>) {
    encoder.count(timestamps.len());
    for ts in timestamps {
        encoder.u64(ts);
    }
}

/// Encodes one VERSIONS entry straight from borrowed parts, so a server can reply from its
/// stored versions without building a `VersionItem` copy first.
pub fn encode_version<K: AsRef<[u8]>>(
    encoder: &mut Encoder<'_>,
    ts: Timestamp,
    value: &[u8],
    metadata: MetadataRef<'_, K>,
) {
    encoder.u64(ts);
    encoder.bytes(value);
    metadata.encode(encoder);
}

/// Appends a reply frame; a reply whose body exceeds `FRAME_BODY_BYTES_MAX` is replaced by an
/// `ERROR BadRequest` saying so. Requests are bounded by the limits, VERSIONS replies are not: a
/// read of `TXN_KEYS_MAX` keys on one server, each 64 KiB with a RAMP-Fast write set of 256
/// 256-byte keys, is a 33.7 MB body. The reader's transaction fails with that error instead of
/// the server refusing to encode it.
pub fn append_reply_frame(out: &mut Vec<u8>, kind: u8, request_id: u64, encode_body: impl FnOnce(&mut Vec<u8>)) {
    if let Err(error) = try_append_frame(out, kind, request_id, encode_body) {
        let message = format!("the reply is too large to send ({error}): read fewer or smaller keys at a time");
        append_frame(out, KIND_ERROR, request_id, |body| Response::bad_request(message).encode_body(body));
    }
}

/// One VERSIONS entry borrowed from where it is stored: ts, value, metadata, expiry word.
pub type EntryRef<'v, K> = (Timestamp, &'v [u8], MetadataRef<'v, K>, u64);

/// Appends a VERSIONS frame whose entries are produced by `entries` (count known up front;
/// walked twice when an entry expires: once for the entries, once for the expiries section).
pub fn append_versions_frame<'v, K: AsRef<[u8]> + 'v>(
    out: &mut Vec<u8>,
    request_id: u64,
    entries: impl ExactSizeIterator<Item = EntryRef<'v, K>> + Clone,
) {
    append_reply_frame(out, KIND_VERSIONS, request_id, |body| {
        let mut encoder = Encoder::new(body);
        encode_entries(&mut encoder, entries.clone());
        encode_expiries(&mut encoder, entries.map(|entry| entry.3));
    });
}

fn truncate_utf8(text: &str, bytes_max: usize) -> &str {
    if text.len() <= bytes_max {
        return text;
    }
    let mut end = bytes_max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Appends a VERSIONS_LOCATED frame: the entries as in [`append_versions_frame`], then each
/// entry's slot (same count).
pub fn append_versions_located_frame<'v, K: AsRef<[u8]> + 'v>(
    out: &mut Vec<u8>,
    request_id: u64,
    entries: impl ExactSizeIterator<Item = EntryRef<'v, K>> + Clone,
    slots: impl ExactSizeIterator<Item = Option<u32>>,
) {
    assert_eq!(entries.len(), slots.len(), "one slot per entry");
    append_reply_frame(out, KIND_VERSIONS_LOCATED, request_id, |body| {
        let mut encoder = Encoder::new(body);
        encode_entries(&mut encoder, entries.clone());
        encode_slots(&mut encoder, slots);
        encode_expiries(&mut encoder, entries.map(|entry| entry.3));
    });
}

/// The VERSIONS body: the count, then each entry (not the expiries section).
fn encode_entries<'v, K: AsRef<[u8]> + 'v>(
    encoder: &mut Encoder<'_>,
    entries: impl ExactSizeIterator<Item = EntryRef<'v, K>>,
) {
    encoder.count(entries.len());
    for (ts, value, metadata, _) in entries {
        encode_version(encoder, ts, value, metadata);
    }
}

/// Appends a VERSIONS_LOCKED frame: the entries as in [`append_versions_frame`], then each
/// entry's arrival timestamp (same count).
pub fn append_versions_locked_frame<'v, K: AsRef<[u8]> + 'v>(
    out: &mut Vec<u8>,
    request_id: u64,
    entries: impl ExactSizeIterator<Item = EntryRef<'v, K>> + Clone,
    on_arrival: impl ExactSizeIterator<Item = Timestamp>,
) {
    assert_eq!(entries.len(), on_arrival.len(), "one arrival timestamp per entry");
    append_reply_frame(out, KIND_VERSIONS_LOCKED, request_id, |body| {
        let mut encoder = Encoder::new(body);
        encode_entries(&mut encoder, entries.clone());
        encode_timestamps(&mut encoder, on_arrival);
        encode_expiries(&mut encoder, entries.map(|entry| entry.3));
    });
}
