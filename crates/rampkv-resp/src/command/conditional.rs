//! The single-key conditional writes: INCR, INCRBY, DECR, DECRBY, SETNX, SET with NX, XX, GET
//! or KEEPTTL, GETSET, GETDEL and APPEND, each one UPDATE at the key's server
//! (`rampkv_core::protocol::update`: linearizable per key, a one-key RAMP write); and MSETNX,
//! refused.
//!
//! # Texts
//! Redis 7.0's, for its errors (compared against redis-server 7.0.15): a bad increment
//! `ERR value is not an integer or out of range`, DECRBY of i64::MIN `ERR decrement would
//! overflow`, SET's conflicting or unknown options `ERR syntax error`. The op's own refusals
//! (not an integer, overflow, too large) are answered when the update returns
//! ([`UpdateReply`]).

use super::parse::{checked_key, checked_value, wrong_arity};
use super::request::{Request, UpdateReply};
use crate::codec::{Args, Frame};
use rampkv_core::wire::{SetCondition, SetExpiry, UpdateOp};

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
    Ok(checked_value(bytes)?.to_vec())
}

/// The update `op` of the key `args` name first, answered as `reply` says.
pub(super) fn update(name: &'static str, args: &Args<'_>, op: UpdateOp, reply: UpdateReply) -> Result<Request, Frame> {
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
    let op = UpdateOp::Set {
        value: value(args.get(2))?,
        condition: SetCondition::IfAbsent,
        get_old: false,
        expiry: SetExpiry::Clear,
    };
    update("SETNX", args, op, UpdateReply::Integer)
}

pub(super) fn getset(args: &Args<'_>) -> Result<Request, Frame> {
    let op = UpdateOp::Set {
        value: value(args.get(2))?,
        condition: SetCondition::Always,
        get_old: true,
        expiry: SetExpiry::Clear,
    };
    update("GETSET", args, op, UpdateReply::Old)
}

pub(super) fn getdel(args: &Args<'_>) -> Result<Request, Frame> {
    update("GETDEL", args, UpdateOp::GetDel, UpdateReply::Old)
}

pub(super) fn append(args: &Args<'_>) -> Result<Request, Frame> {
    update("APPEND", args, UpdateOp::Append(value(args.get(2))?), UpdateReply::Integer)
}

/// `SET key value [NX | XX] [GET] [EX s | PX ms | EXAT s | PXAT ms | KEEPTTL]` as one
/// single-key update, its options already parsed (Redis 7.0's order of checks,
/// `strings::set_with_options`): `condition` from NX / XX, `get_old` from GET, `expiry` from
/// KEEPTTL or the expiry (a deadline already).
pub(super) fn set(
    args: &Args<'_>,
    condition: SetCondition,
    get_old: bool,
    expiry: SetExpiry,
) -> Result<Request, Frame> {
    let reply = if get_old { UpdateReply::Old } else { UpdateReply::OkOrNull };
    let op = UpdateOp::Set { value: value(args.get(2))?, condition, get_old, expiry };
    update("SET", args, op, reply)
}

/// MSETNX: its arity checked as Redis does, then refused ([`MSETNX_REFUSAL`]).
pub(super) fn msetnx(args: &Args<'_>) -> Result<Request, Frame> {
    if args.len() % 2 == 0 {
        return Err(wrong_arity("msetnx"));
    }
    Err(Frame::error(MSETNX_REFUSAL))
}
