//! The single-key conditional update: its operation (in an UPDATE request) and its result (in
//! an UPDATED reply). The request and reply frames themselves are in `request.rs` and
//! `response.rs`; what the server does with them is in `protocol::server::update`.
//!
//! # Format (all integers little-endian; `value` as in request.rs)
//! ```text
//! op := u8 tag, then
//!   0x01 INCR_BY  u64 delta (an i64, two's complement)
//!   0x02 SET      u8 condition (0 always, 1 only if absent, 2 only if present),
//!                 u8 flags (bit 0: reply with the old value; bit 1: KEEPTTL, keep the key's
//!                 deadline; bit 2: a deadline follows; bits 1 and 2 not both; other bits 0),
//!                 [u64 deadline_ms if bit 2], value
//!   0x03 GET_DEL
//!   0x04 APPEND   value
//!   0x05 EXPIRE   u8 condition (0 always, 1 NX: no deadline yet, 2 XX: has one, 3 GT: has a
//!                 sooner one, 4 LT: has none or a later one, 5 XX+LT: has a later one),
//!                 u64 deadline_ms
//!   0x06 PERSIST
//!   0x07 GET_EX   u8 mode (0 keep the deadline, 1 PERSIST, 2 a deadline follows),
//!                 [u64 deadline_ms if mode 2]
//!   (tags 0x08.. are free)
//!
//! deadline_ms: ms since the Unix epoch, at most 2^63 - 1 (`Expiry::DEADLINE_MS_MAX`); the
//! primary's clock judges it: at or before its now, the op deletes the key (SET, EXPIRE,
//! GET_EX), as Redis does for a deadline in the past. 0 is in the past for every clock.
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
use crate::types::{Expiry, Timestamp};

const OP_INCR_BY: u8 = 0x01;
const OP_SET: u8 = 0x02;
const OP_GET_DEL: u8 = 0x03;
const OP_APPEND: u8 = 0x04;
const OP_EXPIRE: u8 = 0x05;
const OP_PERSIST: u8 = 0x06;
const OP_GET_EX: u8 = 0x07;

const SET_FLAG_GET_OLD: u8 = 0x01;
const SET_FLAG_KEEP_TTL: u8 = 0x02;
const SET_FLAG_DEADLINE: u8 = 0x04;

const GET_EX_KEEP: u8 = 0;
const GET_EX_PERSIST: u8 = 1;
const GET_EX_DEADLINE: u8 = 2;

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

/// What a SET update does to its key's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetExpiry {
    /// The value never expires (SET without an expiry option, GETSET, SETNX).
    Clear,
    /// KEEPTTL: the key keeps the deadline it has (none if absent).
    Keep,
    /// Expires at this deadline (ms since the Unix epoch; at or before the primary's clock:
    /// the SET deletes the key).
    At(u64),
}

/// When an EXPIRE sets its deadline: Redis 7's NX, XX, GT and LT, as the key's current deadline
/// (none: it never expires, which GT and LT take as an infinite TTL) compares with the new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireCondition {
    /// No option.
    Always,
    /// NX: only if the key has no deadline.
    IfNone,
    /// XX: only if the key has a deadline.
    IfSome,
    /// GT (alone or with XX): only if the key has a deadline sooner than the new one.
    IfLater,
    /// LT: only if the key has no deadline or a later one.
    IfEarlier,
    /// XX with LT: only if the key has a deadline later than the new one.
    IfSomeAndEarlier,
}

/// What a GETEX does to its key's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetExExpiry {
    /// No option: a GET.
    Keep,
    /// PERSIST: the key no longer expires.
    Persist,
    /// EX, PX, EXAT, PXAT: expires at this deadline (ms since the Unix epoch; at or before the
    /// primary's clock: the GETEX deletes the key).
    At(u64),
}

/// What an UPDATE does to its key's newest committed value (semantics in
/// `protocol::update`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpdateOp {
    /// Adds `delta` to the value read as a decimal i64 (absent: 0); the result is the sum.
    IncrBy(i64),
    /// Stores `value` if `condition` holds, expiring as `expiry` says; the result's integer is 1
    /// if it wrote, else 0, and with `get_old` the result carries the value before.
    Set { value: Vec<u8>, condition: SetCondition, get_old: bool, expiry: SetExpiry },
    /// Deletes the key; the result carries the value before.
    GetDel,
    /// Appends to the value (absent: empty); the result's integer is the new length.
    Append(Vec<u8>),
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT: gives a present key the deadline `deadline_ms` (ms
    /// since the Unix epoch; at or before the primary's clock: deletes it) if `condition` holds;
    /// the result's integer is 1 if it did, else 0.
    Expire { deadline_ms: u64, condition: ExpireCondition },
    /// PERSIST: removes a present key's deadline; the result's integer is 1 if it had one.
    Persist,
    /// GETEX: the value (the result's old value), and the key's deadline changed as `expiry`
    /// says if the key is present.
    GetEx(GetExExpiry),
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
            UpdateOp::Set { value, condition, get_old, expiry } => {
                encoder.u8(OP_SET);
                encoder.u8(match condition {
                    SetCondition::Always => 0,
                    SetCondition::IfAbsent => 1,
                    SetCondition::IfPresent => 2,
                });
                let get_old = if *get_old { SET_FLAG_GET_OLD } else { 0 };
                match expiry {
                    SetExpiry::Clear => encoder.u8(get_old),
                    SetExpiry::Keep => encoder.u8(get_old | SET_FLAG_KEEP_TTL),
                    SetExpiry::At(deadline_ms) => {
                        encoder.u8(get_old | SET_FLAG_DEADLINE);
                        encoder.u64(*deadline_ms);
                    }
                }
                encoder.bytes(value);
            }
            UpdateOp::GetDel => encoder.u8(OP_GET_DEL),
            UpdateOp::Append(suffix) => {
                encoder.u8(OP_APPEND);
                encoder.bytes(suffix);
            }
            UpdateOp::Expire { deadline_ms, condition } => {
                encoder.u8(OP_EXPIRE);
                encoder.u8(match condition {
                    ExpireCondition::Always => 0,
                    ExpireCondition::IfNone => 1,
                    ExpireCondition::IfSome => 2,
                    ExpireCondition::IfLater => 3,
                    ExpireCondition::IfEarlier => 4,
                    ExpireCondition::IfSomeAndEarlier => 5,
                });
                encoder.u64(*deadline_ms);
            }
            UpdateOp::Persist => encoder.u8(OP_PERSIST),
            UpdateOp::GetEx(expiry) => {
                encoder.u8(OP_GET_EX);
                match expiry {
                    GetExExpiry::Keep => encoder.u8(GET_EX_KEEP),
                    GetExExpiry::Persist => encoder.u8(GET_EX_PERSIST),
                    GetExExpiry::At(deadline_ms) => {
                        encoder.u8(GET_EX_DEADLINE);
                        encoder.u64(*deadline_ms);
                    }
                }
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
                if flags & !(SET_FLAG_GET_OLD | SET_FLAG_KEEP_TTL | SET_FLAG_DEADLINE) != 0 {
                    return Err(WireError::Invalid("unknown SET flag"));
                }
                let expiry = match (flags & SET_FLAG_KEEP_TTL != 0, flags & SET_FLAG_DEADLINE != 0) {
                    (false, false) => SetExpiry::Clear,
                    (true, false) => SetExpiry::Keep,
                    (false, true) => SetExpiry::At(deadline(decoder)?),
                    (true, true) => return Err(WireError::Invalid("SET with both KEEPTTL and a deadline")),
                };
                let get_old = flags & SET_FLAG_GET_OLD != 0;
                UpdateOp::Set { value: decoder.value()?, condition, get_old, expiry }
            }
            OP_GET_DEL => UpdateOp::GetDel,
            OP_APPEND => UpdateOp::Append(decoder.value()?),
            OP_EXPIRE => {
                let condition = match decoder.u8()? {
                    0 => ExpireCondition::Always,
                    1 => ExpireCondition::IfNone,
                    2 => ExpireCondition::IfSome,
                    3 => ExpireCondition::IfLater,
                    4 => ExpireCondition::IfEarlier,
                    5 => ExpireCondition::IfSomeAndEarlier,
                    _ => return Err(WireError::Invalid("unknown EXPIRE condition")),
                };
                UpdateOp::Expire { deadline_ms: deadline(decoder)?, condition }
            }
            OP_PERSIST => UpdateOp::Persist,
            OP_GET_EX => UpdateOp::GetEx(match decoder.u8()? {
                GET_EX_KEEP => GetExExpiry::Keep,
                GET_EX_PERSIST => GetExExpiry::Persist,
                GET_EX_DEADLINE => GetExExpiry::At(deadline(decoder)?),
                _ => return Err(WireError::Invalid("unknown GETEX mode")),
            }),
            _ => return Err(WireError::Invalid("unknown update operation")),
        })
    }
}

/// A deadline in ms since the Unix epoch, within what a version carries.
fn deadline(decoder: &mut Decoder<'_>) -> Result<u64, WireError> {
    let deadline_ms = decoder.u64()?;
    if deadline_ms > Expiry::DEADLINE_MS_MAX {
        return Err(WireError::Invalid("deadline beyond 2^63 - 1 ms"));
    }
    Ok(deadline_ms)
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

    fn set(value: &[u8], condition: SetCondition, get_old: bool, expiry: SetExpiry) -> UpdateOp {
        UpdateOp::Set { value: value.to_vec(), condition, get_old, expiry }
    }

    #[test]
    fn update_requests_and_results_round_trip_and_garbage_is_refused() {
        let ops = [
            UpdateOp::IncrBy(-7),
            UpdateOp::IncrBy(i64::MIN),
            set(b"v", SetCondition::IfAbsent, false, SetExpiry::Clear),
            set(b"", SetCondition::IfPresent, true, SetExpiry::Clear),
            set(&[0; 3], SetCondition::Always, true, SetExpiry::Clear),
            set(b"v", SetCondition::Always, false, SetExpiry::Keep),
            set(b"v", SetCondition::IfAbsent, true, SetExpiry::At(1_700_000_000_000)),
            set(b"v", SetCondition::IfPresent, false, SetExpiry::At(Expiry::DEADLINE_MS_MAX)),
            UpdateOp::GetDel,
            UpdateOp::Append(b"tail".to_vec()),
            UpdateOp::Expire { deadline_ms: 0, condition: ExpireCondition::Always },
            UpdateOp::Expire { deadline_ms: 5, condition: ExpireCondition::IfNone },
            UpdateOp::Expire { deadline_ms: 6, condition: ExpireCondition::IfSome },
            UpdateOp::Expire { deadline_ms: 7, condition: ExpireCondition::IfLater },
            UpdateOp::Expire { deadline_ms: 8, condition: ExpireCondition::IfEarlier },
            UpdateOp::Expire { deadline_ms: Expiry::DEADLINE_MS_MAX, condition: ExpireCondition::IfSomeAndEarlier },
            UpdateOp::Persist,
            UpdateOp::GetEx(GetExExpiry::Keep),
            UpdateOp::GetEx(GetExExpiry::Persist),
            UpdateOp::GetEx(GetExExpiry::At(1_700_000_000_123)),
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
        // Unknown op, condition, flag, mode and status bytes, and deadlines beyond the largest.
        let far = (Expiry::DEADLINE_MS_MAX + 1).to_le_bytes();
        let bad: [(&[u8], &str); 9] = [
            (&[0x09], "unknown update operation"),
            (&[OP_SET, 3, 0, 0, 0, 0, 0], "unknown SET condition"),
            (&[OP_SET, 0, 8, 0, 0, 0, 0], "unknown SET flag"),
            (&[OP_SET, 0, SET_FLAG_KEEP_TTL | SET_FLAG_DEADLINE, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "both"),
            (&[OP_SET, 0, SET_FLAG_DEADLINE, far[0], far[1], far[2], far[3], far[4], far[5], far[6], far[7]], "2^63"),
            (&[OP_EXPIRE, 6, 1, 0, 0, 0, 0, 0, 0, 0], "unknown EXPIRE condition"),
            (&[OP_EXPIRE, 0, far[0], far[1], far[2], far[3], far[4], far[5], far[6], far[7]], "2^63"),
            (&[OP_GET_EX, 3], "unknown GETEX mode"),
            (&[OP_GET_EX, GET_EX_DEADLINE, far[0], far[1], far[2], far[3], far[4], far[5], far[6], far[7]], "2^63"),
        ];
        for (body, why) in bad {
            let mut decoder = Decoder::new(body);
            match UpdateOp::decode(&mut decoder) {
                Err(WireError::Invalid(message)) => assert!(message.contains(why), "{body:?}: {message}"),
                other => panic!("{body:?}: {other:?}"),
            }
        }
        assert!(UpdateResult::decode(&mut Decoder::new(&[6])).is_err());
        assert!(UpdateResult::decode(&mut Decoder::new(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 2])).is_err());
    }
}
