//! SET with its options, SETEX and PSETEX, and the expiry numbers they take.
//!
//! # Which path a SET takes
//! `SET k v` and `SET k v EX|PX|EXAT|PXAT n` (and SETEX, PSETEX) write without reading: a
//! `put_all`, batched with the writes pipelined behind them; a relative expiry becomes a
//! deadline from the batch's (or the EXEC's) one reading of the gateway's clock
//! ([`ExpiryArg`]). `SET` with NX, XX, GET or KEEPTTL reads the key's current version, so it is
//! a single-key update at the key's primary (`conditional::set`), with or without an expiry:
//! its relative expiry becomes a deadline from the gateway's clock when the command is received
//! (`now_ms`), and the primary's clock judges whether that deadline has passed.

use super::conditional;
use super::parse::{checked_key, checked_value, parse_integer};
use super::request::{ExpiryArg, Request};
use super::table::{CommandKind, CommandSpec};
use crate::codec::{Args, Frame};
use crate::value;
use rampkv_core::wire::{SetCondition, SetExpiry};

/// The key and the stored value of SET's first two arguments, checked.
fn set_key_value(args: &Args<'_>) -> Result<(Vec<u8>, Vec<u8>), Frame> {
    let key = checked_key(args.get(1))?.to_vec();
    let value = checked_value(args.get(2))?;
    Ok((key, value::encode(value)))
}

/// `SET key value [NX | XX] [GET] [EX s | PX ms | EXAT s | PXAT ms | KEEPTTL]`, Redis 7.0's
/// checks in its order: the options' syntax first (`ERR syntax error`), then the expiry's
/// number (`ERR value is not an integer or out of range`, then `ERR invalid expire time in
/// 'set' command` for one not above 0 or whose milliseconds overflow). NX, XX, GET and KEEPTTL
/// make it a single-key update (module docs), which takes an expiry too; `now_ms` reads the
/// gateway's clock (ms since the Unix epoch) for a relative one, only then.
pub(super) fn set_with_options(args: &Args<'_>, now_ms: impl FnOnce() -> u64) -> Result<Request, Frame> {
    let syntax = || Frame::error("ERR syntax error");
    let mut expiry: Option<(&[u8], &[u8])> = None;
    let (mut not_existing, mut existing, mut keep_ttl, mut get) = (false, false, false, false);
    let mut position = 3;
    while position < args.len() {
        let option = args.get(position);
        let is = |name: &str| option.eq_ignore_ascii_case(name.as_bytes());
        if is("NX") && !existing {
            not_existing = true;
        } else if is("XX") && !not_existing {
            existing = true;
        } else if is("GET") {
            get = true;
        } else if is("KEEPTTL") && expiry.is_none() {
            keep_ttl = true;
        } else if is_expiry_unit(option) {
            expiry = Some(expiry_option(args, position, expiry, keep_ttl)?);
            position += 1;
        } else {
            return Err(syntax());
        }
        position += 1;
    }
    let expiry = match expiry {
        Some((unit, number)) => Some(parse_set_expiry(unit, number, "set")?),
        None => None,
    };
    if not_existing || existing || get || keep_ttl {
        // One single-key update at the key's primary: it reads the key's version.
        let condition = match (not_existing, existing) {
            (true, _) => SetCondition::IfAbsent,
            (_, true) => SetCondition::IfPresent,
            _ => SetCondition::Always,
        };
        let set_expiry = match expiry {
            _ if keep_ttl => SetExpiry::Keep,
            Some(expiry) => SetExpiry::At(expiry.deadline_ms(now_ms())),
            None => SetExpiry::Clear,
        };
        return conditional::set(args, condition, get, set_expiry);
    }
    let (key, value) = set_key_value(args)?;
    Ok(match expiry {
        Some(expiry) => Request::SetExpiring { key, value, expiry },
        None => Request::Set { key, value },
    })
}

/// `SETEX key seconds value`, `PSETEX key milliseconds value`: the expiry checked as SET's.
pub(super) fn set_expire(spec: &CommandSpec, args: &Args<'_>) -> Result<Request, Frame> {
    let unit: &[u8] = if spec.kind == CommandKind::SetExpire { b"EX" } else { b"PX" };
    let expiry = parse_set_expiry(unit, args.get(2), spec.name)?;
    let key = checked_key(args.get(1))?.to_vec();
    let value = checked_value(args.get(3))?;
    Ok(Request::SetExpiring { key, value: value::encode(value), expiry })
}

/// Whether `option` names an expiry unit: `EX`, `PX`, `EXAT` or `PXAT`, any letter case.
pub(super) fn is_expiry_unit(option: &[u8]) -> bool {
    [&b"EX"[..], b"PX", b"EXAT", b"PXAT"].iter().any(|unit| option.eq_ignore_ascii_case(unit))
}

/// The expiry unit at `position` of SET's or GETEX's options and the number after it, as Redis
/// 7.0's `parseExtendedStringArgumentsOrReply` takes them: one unit, given again or not (the
/// last number counts), never after another unit nor where `excluded` (KEEPTTL for SET,
/// PERSIST for GETEX) was given; `ERR syntax error` otherwise, or when the number is missing.
pub(super) fn expiry_option<'a>(
    args: &Args<'a>,
    position: usize,
    earlier: Option<(&'a [u8], &'a [u8])>,
    excluded: bool,
) -> Result<(&'a [u8], &'a [u8]), Frame> {
    let option = args.get(position);
    let other_unit = earlier.is_some_and(|(unit, _)| !unit.eq_ignore_ascii_case(option));
    match args.iter_from(position + 1).next() {
        Some(number) if !other_unit && !excluded => Ok((option, number)),
        _ => Err(Frame::error("ERR syntax error")),
    }
}

/// An expiry option's number (`EX`, `PX`, `EXAT`, `PXAT`, any letter case) as Redis 7.0
/// checks it for SET, SETEX, PSETEX and GETEX: an `i64` above 0 whose milliseconds do not
/// overflow.
pub(super) fn parse_set_expiry(unit: &[u8], number: &[u8], command: &str) -> Result<ExpiryArg, Frame> {
    let Some(amount) = parse_integer(number) else {
        return Err(Frame::error("ERR value is not an integer or out of range"));
    };
    let invalid = || Frame::error(format!("ERR invalid expire time in '{command}' command"));
    let seconds = unit.eq_ignore_ascii_case(b"EX") || unit.eq_ignore_ascii_case(b"EXAT");
    let milliseconds = match seconds {
        true => amount.checked_mul(1_000),
        false => Some(amount),
    };
    let milliseconds = match milliseconds {
        Some(milliseconds) if amount > 0 => milliseconds as u64,
        _ => return Err(invalid()),
    };
    let absolute = unit.eq_ignore_ascii_case(b"EXAT") || unit.eq_ignore_ascii_case(b"PXAT");
    Ok(if absolute { ExpiryArg::AtMs(milliseconds) } else { ExpiryArg::AfterMs(milliseconds) })
}
