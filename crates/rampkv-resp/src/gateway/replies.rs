//! Reply writers: the replies that are more than one frame or one constant. They append to a
//! connection's outgoing bytes and do no I/O.

use super::event_loop::EventLoop;
use super::plan::ReadCommand;
use crate::codec::{self, Frame, Protocol};
use crate::command::{TtlUnit, UpdateReply, NOT_AN_INTEGER_REPLY, OVERFLOW_REPLY};
use crate::{value, REDIS_COMPATIBLE_VERSION};
use rampkv_core::protocol::update::UPDATE_VALUE_BYTES_MAX;
use rampkv_core::protocol::{ReadItem, ReadOutcome};
use rampkv_core::wire::UpdateResult;
use rampkv_net::client::ClientError;

impl EventLoop {
    /// Appends to connection `slot`'s replies what `write` writes in the connection's protocol.
    pub(super) fn append(&mut self, slot: usize, write: impl FnOnce(&mut Vec<u8>, Protocol)) {
        if let Some(connection) = self.connections[slot].as_mut() {
            let protocol = connection.protocol;
            connection.outgoing.append(|out| write(out, protocol));
        }
    }

    /// Appends `reply` to connection `slot`'s replies.
    pub(super) fn reply(&mut self, slot: usize, reply: &Frame) {
        self.append(slot, |out, protocol| reply.encode(protocol, out));
    }

    /// Answers `count` commands with the same error.
    pub(super) fn reply_errors(&mut self, slot: usize, message: &str, count: usize) {
        if let Some(connection) = self.connections[slot].as_mut() {
            connection.outgoing.append(|out| write_errors(out, message, count));
        }
    }

    /// Answers `count` commands that the cluster cannot serve now, with why.
    pub(super) fn reply_unavailable(&mut self, slot: usize, count: usize) {
        let message = format!("ERR rampkv cluster unavailable: {}", self.driver_error);
        self.reply_errors(slot, &message, count);
    }
}

/// The Redis error for a failed transaction. Partitions that no reachable server holds get
/// Redis Cluster's `CLUSTERDOWN` code (clients treat it as "the cluster cannot serve this now,
/// retry later"), with the partitions named; other commands keep working.
pub(super) fn transaction_error(error: &ClientError) -> String {
    match error {
        ClientError::Unavailable { .. } => format!("CLUSTERDOWN rampkv: {error}"),
        error => format!("ERR rampkv: {error}"),
    }
}

pub(super) fn write_errors(out: &mut Vec<u8>, message: &str, count: usize) {
    for _ in 0..count {
        codec::write_error(out, message.as_bytes());
    }
}

/// What a read command's reply needs of one key the read returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KeyRead<'v> {
    /// Its value; `None`: absent at the read (never written, deleted, expired at the read's
    /// instant, or an old tombstone).
    pub(super) value: Option<&'v [u8]>,
    /// When its version expires, Unix ms (0: never).
    pub(super) expires_at_ms: u64,
}

impl<'v> KeyRead<'v> {
    pub(super) fn of(item: &'v ReadItem) -> KeyRead<'v> {
        KeyRead { value: value::of_item(item), expires_at_ms: item.expires_at_ms }
    }
}

/// The replies of a batch of read commands, each from its slice of the read's items.
pub(super) fn write_read_replies(
    out: &mut Vec<u8>,
    protocol: Protocol,
    commands: &[ReadCommand],
    outcome: &ReadOutcome,
) {
    let mut keys = outcome.items.iter().map(KeyRead::of);
    for command in commands {
        write_read_reply(out, protocol, *command, outcome.read_at_ms, &mut keys);
    }
    debug_assert!(keys.next().is_none(), "every item answered");
}

/// The reply of one read command from what the read returned for its keys, taken from `keys`
/// in order; `read_at_ms` is the instant the read judged expiry at.
pub(super) fn write_read_reply<'v>(
    out: &mut Vec<u8>,
    protocol: Protocol,
    command: ReadCommand,
    read_at_ms: u64,
    keys: &mut impl Iterator<Item = KeyRead<'v>>,
) {
    let mut next = || keys.next().expect("one value per key of the command");
    let write_value = |out: &mut Vec<u8>, value: Option<&[u8]>| match value {
        Some(bytes) => codec::write_bulk(out, bytes),
        None => codec::write_null(out, protocol),
    };
    match command {
        ReadCommand::Get => write_value(out, next().value),
        ReadCommand::Strlen => codec::write_integer(out, next().value.map_or(0, |value| value.len() as i64)),
        // Every value the gateway stores is a Redis string.
        ReadCommand::Type => codec::write_simple(out, if next().value.is_some() { b"string" } else { b"none" }),
        ReadCommand::MultiGet { keys } => {
            codec::write_array_header(out, keys);
            for _ in 0..keys {
                write_value(out, next().value);
            }
        }
        ReadCommand::Exists { keys } => {
            let present = (0..keys).filter(|_| next().value.is_some()).count();
            codec::write_integer(out, present as i64);
        }
        ReadCommand::TimeToLive(unit) => codec::write_integer(out, time_to_live(next(), read_at_ms, unit)),
    }
}

/// TTL's and PTTL's answer for a key a read returned, judged at the read's instant
/// (`read_at_ms`): -2 absent, -1 no expiry, else the time left, in milliseconds or in seconds
/// rounded to the nearest (as Redis 7.0).
fn time_to_live(key: KeyRead<'_>, read_at_ms: u64, unit: TtlUnit) -> i64 {
    if key.value.is_none() {
        return -2;
    }
    if key.expires_at_ms == 0 {
        return -1;
    }
    // A present version that expires was judged at `read_at_ms`: its deadline is after it.
    let left_ms = i64::try_from(key.expires_at_ms.saturating_sub(read_at_ms)).unwrap_or(i64::MAX);
    match unit {
        TtlUnit::Milliseconds => left_ms,
        TtlUnit::Seconds => left_ms.saturating_add(500) / 1_000,
    }
}

/// HELLO's reply: a map in RESP3, a flat array of names and values in RESP2.
pub(super) fn hello_reply(protocol: Protocol, id: u64) -> Frame {
    let field = |name: &str, value: Frame| (Frame::bulk(name), value);
    Frame::Map(vec![
        field("server", Frame::bulk("rampkv")),
        field("version", Frame::bulk(REDIS_COMPATIBLE_VERSION)),
        field("proto", Frame::Integer(protocol.number())),
        field("id", Frame::Integer(i64::try_from(id).unwrap_or(i64::MAX))),
        field("mode", Frame::bulk("standalone")),
        field("role", Frame::bulk("master")),
        field("modules", Frame::Array(Vec::new())),
    ])
}

/// The reply to a single-key conditional write (`command::conditional`): Redis's types
/// (integer, `+OK` or null, the old value or null) and texts for the op's refusals.
pub(super) fn write_update_reply(out: &mut Vec<u8>, protocol: Protocol, reply: UpdateReply, result: &UpdateResult) {
    match (result, reply) {
        (UpdateResult::Done { integer, .. }, UpdateReply::Integer) => codec::write_integer(out, *integer),
        (UpdateResult::Done { written: Some(_), .. }, UpdateReply::OkOrNull) => codec::write_simple(out, b"OK"),
        (UpdateResult::Done { written: None, .. }, UpdateReply::OkOrNull) => codec::write_null(out, protocol),
        (UpdateResult::Done { old: Some(old), .. }, UpdateReply::Old) => codec::write_bulk(out, old),
        (UpdateResult::Done { old: None, .. }, UpdateReply::Old) => codec::write_null(out, protocol),
        (UpdateResult::NotAnInteger, _) => codec::write_error(out, NOT_AN_INTEGER_REPLY.as_bytes()),
        (UpdateResult::Overflow, _) => codec::write_error(out, OVERFLOW_REPLY.as_bytes()),
        (UpdateResult::TooLarge { bytes }, _) => {
            let message = format!(
                "ERR string exceeds maximum allowed size (rampkv: {bytes} bytes, at most {UPDATE_VALUE_BYTES_MAX})"
            );
            codec::write_error(out, message.as_bytes());
        }
        (other, _) => {
            debug_assert!(false, "the session retries {other:?}");
            codec::write_error(out, b"ERR internal error: an update finished unresolved");
        }
    }
}
