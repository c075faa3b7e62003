//! The single-key conditional writes: INCR, INCRBY, DECR, DECRBY, SETNX, SET with NX, XX or
//! GET, GETSET, GETDEL and APPEND, each one UPDATE at the key's server
//! (`rampkv_core::protocol::update`: linearizable per key, a one-key RAMP write); and MSETNX,
//! refused.
//!
//! # Texts
//! Redis 7.0's, for its errors (compared against redis-server 7.0.15): a bad increment
//! `ERR value is not an integer or out of range`, DECRBY of i64::MIN `ERR decrement would
//! overflow`, SET's conflicting or unknown options `ERR syntax error`. The op's own refusals
//! (not an integer, overflow, too large) are answered when the update returns
//! ([`UpdateReply`]).

use super::{checked_key, wrong_arity, Request, STORED_VALUE_BYTES_MAX};
use crate::codec::{Args, Frame};
use rampkv_core::wire::{SetCondition, UpdateOp};

/// How an update's result is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateReply {
    /// The op's integer (INCR's new value, APPEND's new length, SETNX's 1 or 0).
    Integer,
    /// `+OK` if it wrote, else a null (SET NX, SET XX).
    OkOrNull,
    /// The value before, or a null (GETSET, GETDEL, SET ... GET).
    Old,
}

/// Why MSETNX is refused.
pub const MSETNX_REFUSAL: &str = "ERR MSETNX is not supported by rampkv: setting several keys only if none of them \
                                  exists reads them and writes them in one transaction across partitions, and a RAMP \
                                  transaction is read-only or write-only. SETNX and SET NX work (on one key)";

/// Redis's texts.
pub const NOT_AN_INTEGER_REPLY: &str = "ERR value is not an integer or out of range";
pub const OVERFLOW_REPLY: &str = "ERR increment or decrement would overflow";
const DECREMENT_OVERFLOW_REPLY: &str = "ERR decrement would overflow";

/// A strict decimal i64, as Redis reads one (`string2ll`).
fn integer(text: &[u8]) -> Result<i64, Frame> {
    rampkv_core::protocol::update::parse_integer(text).ok_or_else(|| Frame::error(NOT_AN_INTEGER_REPLY))
}

fn value(bytes: &[u8]) -> Result<Vec<u8>, Frame> {
    if bytes.len() > STORED_VALUE_BYTES_MAX {
        return Err(Frame::error(format!(
            "ERR value too large: {} bytes, at most {STORED_VALUE_BYTES_MAX}",
            bytes.len()
        )));
    }
    Ok(bytes.to_vec())
}

fn update(name: &'static str, args: &Args<'_>, op: UpdateOp, reply: UpdateReply) -> Result<Request, Frame> {
    let key = checked_key(args.get(1))?.to_vec();
    Ok(Request::Update { name, key, op, reply })
}

/// INCR and DECR (`sign` 1 or -1).
pub(super) fn incr(args: &Args<'_>, name: &'static str, sign: i64) -> Result<Request, Frame> {
    update(name, args, UpdateOp::IncrBy(sign), UpdateReply::Integer)
}

/// INCRBY and DECRBY (`negate` for DECRBY).
pub(super) fn incr_by(args: &Args<'_>, name: &'static str, negate: bool) -> Result<Request, Frame> {
    let mut delta = integer(args.get(2))?;
    if negate {
        delta = delta.checked_neg().ok_or_else(|| Frame::error(DECREMENT_OVERFLOW_REPLY))?;
    }
    update(name, args, UpdateOp::IncrBy(delta), UpdateReply::Integer)
}

pub(super) fn setnx(args: &Args<'_>) -> Result<Request, Frame> {
    let op = UpdateOp::Set { value: value(args.get(2))?, condition: SetCondition::IfAbsent, get_old: false };
    update("SETNX", args, op, UpdateReply::Integer)
}

pub(super) fn getset(args: &Args<'_>) -> Result<Request, Frame> {
    let op = UpdateOp::Set { value: value(args.get(2))?, condition: SetCondition::Always, get_old: true };
    update("GETSET", args, op, UpdateReply::Old)
}

pub(super) fn getdel(args: &Args<'_>) -> Result<Request, Frame> {
    update("GETDEL", args, UpdateOp::GetDel, UpdateReply::Old)
}

pub(super) fn append(args: &Args<'_>) -> Result<Request, Frame> {
    update("APPEND", args, UpdateOp::Append(value(args.get(2))?), UpdateReply::Integer)
}

/// `SET key value [NX | XX] [GET]` as one single-key update, its options already parsed (Redis
/// 7.0's order of checks, `command::set_with_options`): `condition` from NX / XX, `get_old`
/// from GET.
pub(super) fn set(args: &Args<'_>, condition: SetCondition, get_old: bool) -> Result<Request, Frame> {
    let reply = if get_old { UpdateReply::Old } else { UpdateReply::OkOrNull };
    let op = UpdateOp::Set { value: value(args.get(2))?, condition, get_old };
    update("SET", args, op, reply)
}

/// MSETNX: its arity checked as Redis does, then refused ([`MSETNX_REFUSAL`]).
pub(super) fn msetnx(args: &Args<'_>) -> Result<Request, Frame> {
    if args.len() % 2 == 0 {
        return Err(wrong_arity("msetnx"));
    }
    Err(Frame::error(MSETNX_REFUSAL))
}
