//! The single-key conditional update: its operation (in an UPDATE request) and its result (in
//! an UPDATED reply). The request and reply frames themselves are in `request.rs` and
//! `response.rs`; what the server does with them is in `protocol::server::update`.
//!
//! # Format (all integers little-endian; `value` as in request.rs)
//! ```text
//! op := u8 tag, then
//!   0x01 INCR_BY  u64 delta (an i64, two's complement)
//!   0x02 SET      u8 condition (0 always, 1 only if absent, 2 only if present),
//!                 u8 flags (bit 0: reply with the old value; other bits 0), value
//!   0x03 GET_DEL
//!   0x04 APPEND   value
//!   (tags 0x05.. are free for the expiry operations: EXPIRE, PERSIST, GETEX, SET KEEPTTL)
//!
//! result := u8 status, then
//!   0 DONE         u64 written (ts of the version written; 0: nothing written),
//!                  u8 has_old (0 or 1), [value old], u64 integer (an i64)
//!   1 BUSY         u64 ts of the prepared, uncommitted version of the key
//!   2 TS_TOO_LOW   u64 the newest timestamp stored for the key
//!   3 NOT_INTEGER  (INCR_BY: the value is not a 64-bit decimal integer)
//!   4 OVERFLOW     (INCR_BY: the result is beyond i64)
//!   5 TOO_LARGE    u64 bytes (the value it would store exceeds the limit)
//! ```
//! Decoders are strict: an unknown tag or status, a flag bit not defined, or a trailing byte
//! is an error.

use super::{Decoder, Encoder, WireError};
use crate::limits::VALUE_BYTES_MAX;
use crate::types::Timestamp;

const OP_INCR_BY: u8 = 0x01;
const OP_SET: u8 = 0x02;
const OP_GET_DEL: u8 = 0x03;
const OP_APPEND: u8 = 0x04;

const SET_FLAG_GET_OLD: u8 = 0x01;

const STATUS_DONE: u8 = 0;
const STATUS_BUSY: u8 = 1;
const STATUS_TS_TOO_LOW: u8 = 2;
const STATUS_NOT_INTEGER: u8 = 3;
const STATUS_OVERFLOW: u8 = 4;
const STATUS_TOO_LARGE: u8 = 5;

/// When a SET update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetCondition {
    /// Always (GETSET, SET ... GET).
    Always,
    /// Only if the key is absent (SETNX, SET NX).
    IfAbsent,
    /// Only if the key is present (SET XX).
    IfPresent,
}

/// What an UPDATE does to its key's newest committed value (semantics in
/// `protocol::update`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpdateOp {
    /// Adds `delta` to the value read as a decimal i64 (absent: 0); the result is the sum.
    IncrBy(i64),
    /// Stores `value` if `condition` holds; the result's integer is 1 if it wrote, else 0, and
    /// with `get_old` the result carries the value before.
    Set { value: Vec<u8>, condition: SetCondition, get_old: bool },
    /// Deletes the key; the result carries the value before.
    GetDel,
    /// Appends to the value (absent: empty); the result's integer is the new length.
    Append(Vec<u8>),
}

/// What an UPDATE did, or why it did nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpdateResult {
    /// Applied (`written`: the timestamp of the version written; `None`: the op wrote nothing,
    /// e.g. SET NX on a present key). `old`: the value before, for ops that return it (`None`:
    /// absent, or not asked for). `integer`: the op's number (INCR's new value, APPEND's new
    /// length, SET's 1 or 0).
    Done { written: Option<Timestamp>, old: Option<Vec<u8>>, integer: i64 },
    /// The key has a prepared, uncommitted version (a multi-key write in flight): retry later.
    Busy { prepared: Timestamp },
    /// The key already has a version at or above the request's timestamp: retry with a newer
    /// one.
    TsTooLow { newest: Timestamp },
    /// INCR_BY on a value that is not a decimal 64-bit integer.
    NotAnInteger,
    /// INCR_BY whose result does not fit an i64.
    Overflow,
    /// The value the op would store is longer than the limit.
    TooLarge { bytes: u64 },
}

impl UpdateOp {
    pub(super) fn encode(&self, encoder: &mut Encoder<'_>) {
        match self {
            UpdateOp::IncrBy(delta) => {
                encoder.u8(OP_INCR_BY);
                encoder.u64(*delta as u64);
            }
            UpdateOp::Set { value, condition, get_old } => {
                encoder.u8(OP_SET);
                encoder.u8(match condition {
                    SetCondition::Always => 0,
                    SetCondition::IfAbsent => 1,
                    SetCondition::IfPresent => 2,
                });
                encoder.u8(if *get_old { SET_FLAG_GET_OLD } else { 0 });
                encoder.bytes(value);
            }
            UpdateOp::GetDel => encoder.u8(OP_GET_DEL),
            UpdateOp::Append(suffix) => {
                encoder.u8(OP_APPEND);
                encoder.bytes(suffix);
            }
        }
    }

    pub(super) fn decode(decoder: &mut Decoder<'_>) -> Result<UpdateOp, WireError> {
        Ok(match decoder.u8()? {
            OP_INCR_BY => UpdateOp::IncrBy(decoder.u64()? as i64),
            OP_SET => {
                let condition = match decoder.u8()? {
                    0 => SetCondition::Always,
                    1 => SetCondition::IfAbsent,
                    2 => SetCondition::IfPresent,
                    _ => return Err(WireError::Invalid("unknown SET condition")),
                };
                let flags = decoder.u8()?;
                if flags & !SET_FLAG_GET_OLD != 0 {
                    return Err(WireError::Invalid("unknown SET flag"));
                }
                UpdateOp::Set { value: decoder.value()?, condition, get_old: flags & SET_FLAG_GET_OLD != 0 }
            }
            OP_GET_DEL => UpdateOp::GetDel,
            OP_APPEND => UpdateOp::Append(decoder.value()?),
            _ => return Err(WireError::Invalid("unknown update operation")),
        })
    }
}

impl UpdateResult {
    pub(super) fn encode(&self, encoder: &mut Encoder<'_>) {
        match self {
            UpdateResult::Done { written, old, integer } => {
                encoder.u8(STATUS_DONE);
                encoder.u64(written.unwrap_or(0));
                match old {
                    Some(old) => {
                        encoder.u8(1);
                        encoder.bytes(old);
                    }
                    None => encoder.u8(0),
                }
                encoder.u64(*integer as u64);
            }
            UpdateResult::Busy { prepared } => {
                encoder.u8(STATUS_BUSY);
                encoder.u64(*prepared);
            }
            UpdateResult::TsTooLow { newest } => {
                encoder.u8(STATUS_TS_TOO_LOW);
                encoder.u64(*newest);
            }
            UpdateResult::NotAnInteger => encoder.u8(STATUS_NOT_INTEGER),
            UpdateResult::Overflow => encoder.u8(STATUS_OVERFLOW),
            UpdateResult::TooLarge { bytes } => {
                encoder.u8(STATUS_TOO_LARGE);
                encoder.u64(*bytes);
            }
        }
    }

    pub(super) fn decode(decoder: &mut Decoder<'_>) -> Result<UpdateResult, WireError> {
        Ok(match decoder.u8()? {
            STATUS_DONE => {
                let written = decoder.u64()?;
                let old = match decoder.u8()? {
                    0 => None,
                    1 => Some(decoder.bytes_up_to("old value", VALUE_BYTES_MAX)?),
                    _ => return Err(WireError::Invalid("has_old is neither 0 nor 1")),
                };
                let integer = decoder.u64()? as i64;
                UpdateResult::Done { written: (written != 0).then_some(written), old, integer }
            }
            STATUS_BUSY => UpdateResult::Busy { prepared: decoder.u64()? },
            STATUS_TS_TOO_LOW => UpdateResult::TsTooLow { newest: decoder.u64()? },
            STATUS_NOT_INTEGER => UpdateResult::NotAnInteger,
            STATUS_OVERFLOW => UpdateResult::Overflow,
            STATUS_TOO_LARGE => UpdateResult::TooLarge { bytes: decoder.u64()? },
            _ => return Err(WireError::Invalid("unknown update status")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Metadata, Request, Response, WriteSet};

    #[test]
    fn update_requests_and_results_round_trip_and_garbage_is_refused() {
        let ops = [
            UpdateOp::IncrBy(-7),
            UpdateOp::IncrBy(i64::MIN),
            UpdateOp::Set { value: b"v".to_vec(), condition: SetCondition::IfAbsent, get_old: false },
            UpdateOp::Set { value: Vec::new(), condition: SetCondition::IfPresent, get_old: true },
            UpdateOp::Set { value: vec![0; 3], condition: SetCondition::Always, get_old: true },
            UpdateOp::GetDel,
            UpdateOp::Append(b"tail".to_vec()),
        ];
        for op in ops {
            let metadata = Metadata::WriteSet(WriteSet::from_keys(&[b"k".to_vec()]).unwrap());
            let request = Request::Update { ts: 9 << 16 | 1, metadata, key: b"k".to_vec(), op };
            let mut body = Vec::new();
            request.encode_body(&mut body);
            assert_eq!(Request::decode(request.kind(), &body), Ok(request.clone()));
            for cut in 0..body.len() {
                assert!(Request::decode(request.kind(), &body[..cut]).is_err(), "{request:?} cut at {cut}");
            }
            body.push(0);
            assert!(Request::decode(request.kind(), &body).is_err(), "a trailing byte is refused");
        }
        let results = [
            UpdateResult::Done { written: Some(5), old: Some(b"old".to_vec()), integer: -1 },
            UpdateResult::Done { written: None, old: None, integer: i64::MAX },
            UpdateResult::Busy { prepared: 3 },
            UpdateResult::TsTooLow { newest: 4 },
            UpdateResult::NotAnInteger,
            UpdateResult::Overflow,
            UpdateResult::TooLarge { bytes: 1 << 40 },
        ];
        for result in results {
            let response = Response::Updated(result);
            let mut body = Vec::new();
            response.encode_body(&mut body);
            assert_eq!(Response::decode(response.kind(), &body), Ok(response.clone()));
            for cut in 0..body.len() {
                assert!(Response::decode(response.kind(), &body[..cut]).is_err());
            }
        }
        // Unknown op, condition, flag and status bytes.
        for body in [&[0x09][..], &[OP_SET, 3, 0, 0, 0, 0, 0], &[OP_SET, 0, 2, 0, 0, 0, 0]] {
            let mut decoder = Decoder::new(body);
            assert!(UpdateOp::decode(&mut decoder).is_err(), "{body:?}");
        }
        assert!(UpdateResult::decode(&mut Decoder::new(&[6])).is_err());
        assert!(UpdateResult::decode(&mut Decoder::new(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 2])).is_err());
    }
}
