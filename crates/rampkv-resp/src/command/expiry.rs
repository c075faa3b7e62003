//! EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (with Redis 7's NX, XX, GT and LT), PERSIST and GETEX:
//! each one UPDATE at the key's primary (`rampkv_core::protocol::update`), since each rewrites
//! the key's current version (its value with a new deadline, or none).
//!
//! # Whose clock
//! A relative expiry (EXPIRE's seconds, PEXPIRE's ms, GETEX's EX and PX) becomes a deadline in
//! ms since the Unix epoch from the gateway's clock when the command is received (`now_ms`),
//! as SET EX does from its batch's reading; the primary's clock then judges whether the
//! deadline has passed (if it has, the key is deleted, as Redis does). A relative amount at or
//! below 0 is past on every clock: it is sent as deadline 0, so the primary deletes the key
//! whatever its clock says, as Redis does for `EXPIRE k 0`.
//!
//! # Texts (Redis 7.0's, in its order of checks)
//! EXPIRE & co.: the options first (`ERR Unsupported option x`, then `ERR NX and XX, GT or LT
//! options at the same time are not compatible` and `ERR GT and LT options at the same time are
//! not compatible`), then the number (`ERR value is not an integer or out of range`, then
//! `ERR invalid expire time in 'expire' command` when its milliseconds or the deadline
//! overflow an i64; negative numbers are allowed). GETEX: SET's checks of its options
//! (`ERR syntax error`) and number (`ERR invalid expire time in 'getex' command`).

use super::conditional::update;
use super::parse::parse_integer;
use super::request::{Request, UpdateReply};
use super::strings::{expiry_option, is_expiry_unit, parse_set_expiry};
use super::table::CommandKind;
use crate::codec::{Args, Frame};
use rampkv_core::types::Expiry;
use rampkv_core::wire::{ExpireCondition, GetExExpiry, UpdateOp};

/// `EXPIRE key seconds [NX | XX | GT | LT]` and PEXPIRE (ms), EXPIREAT (Unix seconds),
/// PEXPIREAT (Unix ms): `kind` says which. `now_ms` is read only for a relative one.
pub(super) fn expire(
    kind: CommandKind,
    name: &'static str,
    args: &Args<'_>,
    now_ms: impl FnOnce() -> u64,
) -> Result<Request, Frame> {
    let condition = expire_condition(args)?;
    let Some(amount) = parse_integer(args.get(2)) else {
        return Err(Frame::error("ERR value is not an integer or out of range"));
    };
    let invalid = || Frame::error(format!("ERR invalid expire time in '{}' command", name.to_ascii_lowercase()));
    let in_seconds = matches!(kind, CommandKind::Expire | CommandKind::ExpireAt);
    let amount_ms = if in_seconds { amount.checked_mul(1_000).ok_or_else(invalid)? } else { amount };
    let relative = matches!(kind, CommandKind::Expire | CommandKind::ExpireMs);
    let deadline_ms = if relative {
        let now_ms = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        if amount_ms > i64::MAX - now_ms {
            return Err(invalid());
        }
        // At or below 0: past on every clock (module docs).
        if amount_ms <= 0 {
            0
        } else {
            now_ms + amount_ms
        }
    } else {
        amount_ms.max(0)
    };
    debug_assert!(deadline_ms as u64 <= Expiry::DEADLINE_MS_MAX);
    let op = UpdateOp::Expire { deadline_ms: deadline_ms as u64, condition };
    update(name, args, op, UpdateReply::Integer)
}

/// EXPIRE's options after its number, as Redis 7.0's `parseExtendedExpireArgumentsOrReply`
/// reads them (any letter case, repeats allowed).
fn expire_condition(args: &Args<'_>) -> Result<ExpireCondition, Frame> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for option in args.iter_from(3) {
        let is = |name: &str| option.eq_ignore_ascii_case(name.as_bytes());
        if is("NX") {
            nx = true;
        } else if is("XX") {
            xx = true;
        } else if is("GT") {
            gt = true;
        } else if is("LT") {
            lt = true;
        } else {
            return Err(Frame::error(format!("ERR Unsupported option {}", String::from_utf8_lossy(option))));
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Frame::error("ERR NX and XX, GT or LT options at the same time are not compatible"));
    }
    if gt && lt {
        return Err(Frame::error("ERR GT and LT options at the same time are not compatible"));
    }
    Ok(match (nx, xx, gt, lt) {
        (true, ..) => ExpireCondition::IfNone,
        // GT fails on a key without a deadline anyway: XX adds nothing to it.
        (_, _, true, _) => ExpireCondition::IfLater,
        (_, true, _, true) => ExpireCondition::IfSomeAndEarlier,
        (_, false, _, true) => ExpireCondition::IfEarlier,
        (_, true, ..) => ExpireCondition::IfSome,
        _ => ExpireCondition::Always,
    })
}

/// `PERSIST key`.
pub(super) fn persist(args: &Args<'_>) -> Result<Request, Frame> {
    update("PERSIST", args, UpdateOp::Persist, UpdateReply::Integer)
}

/// `GETEX key [EX s | PX ms | EXAT s | PXAT ms | PERSIST]`, its options checked as Redis 7.0's
/// `parseExtendedStringArgumentsOrReply` checks a GET's: one unit (given again: the last number
/// counts) or PERSIST, not both. `now_ms` is read only for a relative expiry.
pub(super) fn getex(args: &Args<'_>, now_ms: impl FnOnce() -> u64) -> Result<Request, Frame> {
    let syntax = || Frame::error("ERR syntax error");
    let mut expiry: Option<(&[u8], &[u8])> = None;
    let mut persist = false;
    let mut position = 2;
    while position < args.len() {
        let option = args.get(position);
        let is = |name: &str| option.eq_ignore_ascii_case(name.as_bytes());
        if is("PERSIST") && expiry.is_none() {
            persist = true;
        } else if is_expiry_unit(option) {
            expiry = Some(expiry_option(args, position, expiry, persist)?);
            position += 1;
        } else {
            return Err(syntax());
        }
        position += 1;
    }
    let get_ex = match expiry {
        Some((unit, number)) => GetExExpiry::At(parse_set_expiry(unit, number, "getex")?.deadline_ms(now_ms())),
        None if persist => GetExExpiry::Persist,
        None => GetExExpiry::Keep,
    };
    update("GETEX", args, UpdateOp::GetEx(get_ex), UpdateReply::Old)
}

#[cfg(test)]
mod tests {
    use crate::auth::Permissions;
    use crate::codec::{Frame, RequestParser};
    use crate::command::{parse_request, Request, UpdateReply};
    use rampkv_core::types::wall_clock_unix_ms;
    use rampkv_core::wire::{ExpireCondition, GetExExpiry, SetCondition, SetExpiry, UpdateOp};

    fn request(line: &str) -> Request {
        let mut parser = RequestParser::new();
        let input = format!("{line}\r\n");
        let (args, _) = parser.parse(input.as_bytes()).unwrap().unwrap();
        parse_request(&args, Permissions::ALL)
    }

    fn error_text(line: &str) -> String {
        match request(line) {
            Request::Reply(Frame::Error(message)) => String::from_utf8(message).unwrap(),
            other => panic!("{line}: expected an error, got {other:?}"),
        }
    }

    /// The op and reply of a parsed update, with the gateway's clock read around the parse
    /// (the bounds a relative deadline must fall in).
    fn update(line: &str) -> (&'static str, UpdateOp, UpdateReply, (u64, u64)) {
        let before = wall_clock_unix_ms();
        let parsed = request(line);
        let after = wall_clock_unix_ms();
        match parsed {
            Request::Update { name, key, op, reply } => {
                assert_eq!(key, b"k", "{line}");
                (name, op, reply, (before, after))
            }
            other => panic!("{line}: {other:?}"),
        }
    }

    fn deadline_within(op: &UpdateOp, after_ms: u64, (before, after): (u64, u64)) {
        let deadline = match op {
            UpdateOp::Expire { deadline_ms, .. } => *deadline_ms,
            UpdateOp::GetEx(GetExExpiry::At(deadline_ms)) => *deadline_ms,
            UpdateOp::Set { expiry: SetExpiry::At(deadline_ms), .. } => *deadline_ms,
            other => panic!("{other:?}"),
        };
        assert!((before + after_ms..=after + after_ms).contains(&deadline), "{deadline} vs {before}..{after}");
    }

    #[test]
    fn expire_and_its_options_parse_as_redis_7_does() {
        let (name, op, reply, clock) = update("expire k 10");
        assert_eq!((name, reply), ("EXPIRE", UpdateReply::Integer));
        assert!(matches!(op, UpdateOp::Expire { condition: ExpireCondition::Always, .. }));
        deadline_within(&op, 10_000, clock);
        let (_, op, _, clock) = update("PEXPIRE k 1500 nx");
        assert!(matches!(op, UpdateOp::Expire { condition: ExpireCondition::IfNone, .. }));
        deadline_within(&op, 1_500, clock);
        let absolute = |line| update(line).1;
        let expire = |deadline_ms, condition| UpdateOp::Expire { deadline_ms, condition };
        assert_eq!(absolute("expireat k 1700000000 xx"), expire(1_700_000_000_000, ExpireCondition::IfSome));
        assert_eq!(absolute("pexpireat k 1700000000123 gt"), expire(1_700_000_000_123, ExpireCondition::IfLater));
        assert_eq!(absolute("pexpireat k 5 xx gt"), expire(5, ExpireCondition::IfLater));
        assert_eq!(absolute("pexpireat k 5 lt"), expire(5, ExpireCondition::IfEarlier));
        assert_eq!(absolute("pexpireat k 5 LT xx"), expire(5, ExpireCondition::IfSomeAndEarlier));
        assert_eq!(absolute("pexpireat k 5 nx nx"), expire(5, ExpireCondition::IfNone), "repeats are allowed");
        // At or below 0, relative or absolute: past on every clock.
        assert_eq!(absolute("expire k 0"), expire(0, ExpireCondition::Always));
        assert_eq!(absolute("pexpire k -5"), expire(0, ExpireCondition::Always));
        assert_eq!(absolute("expireat k -1"), expire(0, ExpireCondition::Always));

        assert_eq!(error_text("expire k 10 foo"), "ERR Unsupported option foo");
        assert_eq!(error_text("expire k x foo"), "ERR Unsupported option foo", "options are checked first");
        for line in ["expire k 1 nx xx", "expire k 1 nx gt", "expire k 1 lt nx"] {
            assert_eq!(error_text(line), "ERR NX and XX, GT or LT options at the same time are not compatible");
        }
        assert_eq!(error_text("expire k 1 gt lt"), "ERR GT and LT options at the same time are not compatible");
        assert_eq!(error_text("expire k ten"), "ERR value is not an integer or out of range");
        assert_eq!(error_text("pexpire k 1.5"), "ERR value is not an integer or out of range");
        assert_eq!(error_text("expire k 9223372036854776"), "ERR invalid expire time in 'expire' command");
        assert_eq!(error_text("expireat k -9223372036854776"), "ERR invalid expire time in 'expireat' command");
        assert_eq!(error_text("pexpire k 9223372036854775000"), "ERR invalid expire time in 'pexpire' command");
        assert_eq!(absolute("pexpireat k 9223372036854775807"), expire(i64::MAX as u64, ExpireCondition::Always));
        assert_eq!(error_text("expire k"), "ERR wrong number of arguments for 'expire' command");
        assert_eq!(error_text("pexpireat k"), "ERR wrong number of arguments for 'pexpireat' command");
    }

    #[test]
    fn persist_getex_and_set_with_keepttl_or_a_condition_and_an_expiry_are_updates() {
        assert_eq!(update("persist k").1, UpdateOp::Persist);
        assert_eq!(error_text("persist k j"), "ERR wrong number of arguments for 'persist' command");

        let (name, op, reply, _) = update("getex k");
        assert_eq!((name, op, reply), ("GETEX", UpdateOp::GetEx(GetExExpiry::Keep), UpdateReply::Old));
        assert_eq!(update("GETEX k persist persist").1, UpdateOp::GetEx(GetExExpiry::Persist));
        let (_, op, _, clock) = update("getex k ex 5 ex 7");
        deadline_within(&op, 7_000, clock);
        assert_eq!(update("getex k pxat 1700000000123").1, UpdateOp::GetEx(GetExExpiry::At(1_700_000_000_123)));
        for line in ["getex k ex", "getex k ex 1 px 2", "getex k persist ex 1", "getex k ex 1 persist", "getex k nx"] {
            assert_eq!(error_text(line), "ERR syntax error", "{line}");
        }
        assert_eq!(error_text("getex k ex 0"), "ERR invalid expire time in 'getex' command");
        assert_eq!(error_text("getex k px x"), "ERR value is not an integer or out of range");

        let set = |condition, get_old, expiry| UpdateOp::Set { value: b"v".to_vec(), condition, get_old, expiry };
        let (name, op, reply, _) = update("set k v keepttl");
        assert_eq!(
            (name, op, reply),
            ("SET", set(SetCondition::Always, false, SetExpiry::Keep), UpdateReply::OkOrNull)
        );
        assert_eq!(update("set k v xx keepttl get").1, set(SetCondition::IfPresent, true, SetExpiry::Keep));
        let (_, op, reply, clock) = update("set k v nx ex 10");
        assert!(matches!(op, UpdateOp::Set { condition: SetCondition::IfAbsent, get_old: false, .. }));
        assert_eq!(reply, UpdateReply::OkOrNull);
        deadline_within(&op, 10_000, clock);
        let (_, op, reply, _) = update("set k v get pxat 1700000000123");
        assert_eq!(op, set(SetCondition::Always, true, SetExpiry::At(1_700_000_000_123)));
        assert_eq!(reply, UpdateReply::Old);
        assert_eq!(error_text("set k v nx keepttl ex 1"), "ERR syntax error");
        assert_eq!(error_text("set k v nx ex 0"), "ERR invalid expire time in 'set' command");
    }
}
