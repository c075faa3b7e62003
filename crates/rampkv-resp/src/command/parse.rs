//! The checks every command shares: keys and values within the bounds of a transaction,
//! integers as Redis reads them, and Redis 7.0's texts for unknown commands and wrong arities.

use super::request::Pairs;
use crate::codec::{Args, Frame};
use crate::value::{self, STORED_VALUE_BYTES_MAX};
use rampkv_core::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX};

/// `args[start..]` as keys, each checked against the bounds of a transaction.
pub(super) fn checked_keys(args: &Args<'_>, start: usize) -> Result<Vec<Vec<u8>>, Frame> {
    let count = args.len() - start;
    if count > TXN_KEYS_MAX {
        return Err(Frame::error(format!("ERR too many keys: {count}, a command takes at most {TXN_KEYS_MAX}")));
    }
    args.iter_from(start).map(|key| checked_key(key).map(<[u8]>::to_vec)).collect()
}

pub(super) fn checked_key(key: &[u8]) -> Result<&[u8], Frame> {
    if key.len() > KEY_BYTES_MAX {
        return Err(Frame::error(format!("ERR key too large: {} bytes, at most {KEY_BYTES_MAX}", key.len())));
    }
    Ok(key)
}

/// `args[1..]` as key-value pairs, values in their stored form.
pub(super) fn checked_pairs(args: &Args<'_>) -> Result<Pairs, Frame> {
    debug_assert!(args.len() % 2 == 1);
    let count = (args.len() - 1) / 2;
    if count > TXN_KEYS_MAX {
        return Err(Frame::error(format!("ERR too many keys: {count}, a command takes at most {TXN_KEYS_MAX}")));
    }
    let mut pairs = Vec::with_capacity(count);
    for index in 0..count {
        let key = checked_key(args.get(1 + 2 * index))?;
        let value = args.get(2 + 2 * index);
        if value.len() > STORED_VALUE_BYTES_MAX {
            return Err(Frame::error(format!(
                "ERR value too large: {} bytes, at most {STORED_VALUE_BYTES_MAX}",
                value.len()
            )));
        }
        pairs.push((key.to_vec(), value::encode(value)));
    }
    Ok(pairs)
}

/// Redis's text: `ERR unknown command 'name', with args beginning with: 'a' 'b' `. The
/// arguments shown stop once 128 bytes of them are shown.
pub(super) fn unknown_command(args: &Args<'_>) -> Frame {
    const SHOWN_BYTES_MAX: usize = 128;
    let name = args.get(0);
    let mut message = b"ERR unknown command '".to_vec();
    message.extend_from_slice(&name[..name.len().min(SHOWN_BYTES_MAX)]);
    message.extend_from_slice(b"', with args beginning with: ");
    let mut shown = Vec::new();
    for arg in args.iter_from(1) {
        if shown.len() >= SHOWN_BYTES_MAX {
            break;
        }
        let room = SHOWN_BYTES_MAX - shown.len();
        shown.push(b'\'');
        shown.extend_from_slice(&arg[..arg.len().min(room)]);
        shown.extend_from_slice(b"' ");
    }
    message.extend_from_slice(&shown);
    Frame::Error(message)
}

pub(super) fn wrong_arity(name: &str) -> Frame {
    Frame::error(format!("ERR wrong number of arguments for '{name}' command"))
}

pub(super) fn unknown_subcommand(subcommand: &[u8], command: &str) -> Frame {
    let subcommand = String::from_utf8_lossy(subcommand);
    Frame::error(format!("ERR unknown subcommand '{subcommand}'. Try {command} HELP."))
}

/// A strict decimal i64 (Redis's `string2ll`).
pub(super) fn parse_integer(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty()
        || !digits.bytes().all(|byte| byte.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    text.parse().ok()
}

/// A value within what a stored value may hold.
pub(super) fn checked_value(value: &[u8]) -> Result<&[u8], Frame> {
    if value.len() > STORED_VALUE_BYTES_MAX {
        return Err(Frame::error(format!(
            "ERR value too large: {} bytes, at most {STORED_VALUE_BYTES_MAX}",
            value.len()
        )));
    }
    Ok(value)
}
