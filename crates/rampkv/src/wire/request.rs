//! Client-to-server messages.
//!
//! # Format (frame bodies, all integers little-endian)
//! ```text
//! key      := u16 length, bytes                 (length <= KEY_BYTES_MAX)
//! value    := u32 length, bytes                 (length <= VALUE_BYTES_MAX)
//! keys     := u32 count, key * count            (count <= TXN_KEYS_MAX)
//!
//! 0x01 HELLO    u16 client_ids_wanted            ask for a block of unique client ids
//! 0x02 GET      u32 count, (key, u64 at) * count at = 0: the latest committed version;
//!                                                 at = ts: exactly version ts (round 2)
//! 0x03 PREPARE  u64 ts, keys write_set,           store versions, not yet visible
//!               u32 count, (key, value) * count
//! 0x04 COMMIT   u64 ts                           make the versions of ts visible
//! ```

use super::frame::append_frame;
use super::{Decoder, Encoder, WireError};
use crate::limits::TXN_KEYS_MAX;
use crate::types::Timestamp;

pub const KIND_HELLO: u8 = 0x01;
pub const KIND_GET: u8 = 0x02;
pub const KIND_PREPARE: u8 = 0x03;
pub const KIND_COMMIT: u8 = 0x04;

/// One key of a GET: the latest committed version (`at == 0`) or exactly version `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetItem {
    pub key: Vec<u8>,
    pub at: Timestamp,
}

/// One write of a PREPARE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// A request from a client to one server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// Asks for `client_ids_wanted` consecutive unique client ids.
    Hello { client_ids_wanted: u16 },
    /// Reads keys stored on this server.
    Get { items: Vec<GetItem> },
    /// Stores the transaction's writes on this server as prepared (invisible) versions;
    /// `write_set` is the transaction's whole write set (RAMP-Fast metadata).
    Prepare { ts: Timestamp, write_set: Vec<Vec<u8>>, writes: Vec<Write> },
    /// Makes the prepared versions of transaction `ts` on this server visible.
    Commit { ts: Timestamp },
}

impl Request {
    /// The frame kind byte of this request.
    pub fn kind(&self) -> u8 {
        match self {
            Request::Hello { .. } => KIND_HELLO,
            Request::Get { .. } => KIND_GET,
            Request::Prepare { .. } => KIND_PREPARE,
            Request::Commit { .. } => KIND_COMMIT,
        }
    }

    /// Appends this request as one frame to `out`.
    pub fn encode_frame(&self, request_id: u64, out: &mut Vec<u8>) {
        append_frame(out, self.kind(), request_id, |body| self.encode_body(body));
    }

    /// Appends the body of this request (no frame header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        let mut encoder = Encoder::new(out);
        match self {
            Request::Hello { client_ids_wanted } => encoder.u16(*client_ids_wanted),
            Request::Get { items } => {
                assert!(items.len() <= TXN_KEYS_MAX);
                encoder.count(items.len());
                for item in items {
                    encoder.key(&item.key);
                    encoder.u64(item.at);
                }
            }
            Request::Prepare { ts, write_set, writes } => {
                assert!(write_set.len() <= TXN_KEYS_MAX && writes.len() <= TXN_KEYS_MAX);
                encoder.u64(*ts);
                encoder.count(write_set.len());
                for key in write_set {
                    encoder.key(key);
                }
                encoder.count(writes.len());
                for write in writes {
                    encoder.key(&write.key);
                    encoder.bytes(&write.value);
                }
            }
            Request::Commit { ts } => encoder.u64(*ts),
        }
    }

    /// Decodes a request body of the given kind; every byte must be consumed.
    pub fn decode(kind: u8, body: &[u8]) -> Result<Request, WireError> {
        let mut decoder = Decoder::new(body);
        let request = match kind {
            KIND_HELLO => Request::Hello { client_ids_wanted: decoder.u16()? },
            KIND_GET => {
                let count = decoder.count("get items", TXN_KEYS_MAX, 10)?;
                let items = (0..count)
                    .map(|_| Ok(GetItem { key: decoder.key()?, at: decoder.u64()? }))
                    .collect::<Result<_, WireError>>()?;
                Request::Get { items }
            }
            KIND_PREPARE => {
                let ts = decoder.u64()?;
                let write_set = decoder.keys("write set")?;
                let count = decoder.count("writes", TXN_KEYS_MAX, 6)?;
                let writes = (0..count)
                    .map(|_| Ok(Write { key: decoder.key()?, value: decoder.value()? }))
                    .collect::<Result<_, WireError>>()?;
                Request::Prepare { ts, write_set, writes }
            }
            KIND_COMMIT => Request::Commit { ts: decoder.u64()? },
            other => return Err(WireError::UnknownKind(other)),
        };
        decoder.finish()?;
        Ok(request)
    }
}
