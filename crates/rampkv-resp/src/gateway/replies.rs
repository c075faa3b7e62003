//! Reply writers: the replies that are more than one frame or one constant. They append to a
//! connection's outgoing bytes and do no I/O.

use super::batch::ReadCommand;
use super::event_loop::EventLoop;
use crate::codec::{self, Frame, Protocol};
use crate::command::{UpdateReply, NOT_AN_INTEGER_REPLY, OVERFLOW_REPLY};
use crate::{value, REDIS_COMPATIBLE_VERSION};
use rampkv_core::protocol::update::UPDATE_VALUE_BYTES_MAX;
use rampkv_core::protocol::ReadOutcome;
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

/// The replies of a batch of read commands, each from its slice of the read's items.
pub(super) fn write_read_replies(
    out: &mut Vec<u8>,
    protocol: Protocol,
    commands: &[ReadCommand],
    outcome: &ReadOutcome,
) {
    let mut values = outcome.items.iter().map(|item| value::decode(item.ts, &item.value));
    for command in commands {
        write_read_reply(out, protocol, *command, &mut values);
    }
    debug_assert!(values.next().is_none(), "every item answered");
}

/// The reply of one read command from the values of its keys, taken from `values` in order
/// (`None`: the key is absent).
pub(super) fn write_read_reply<'v>(
    out: &mut Vec<u8>,
    protocol: Protocol,
    command: ReadCommand,
    values: &mut impl Iterator<Item = Option<&'v [u8]>>,
) {
    let mut next = || values.next().expect("one value per key of the command");
    let write_value = |out: &mut Vec<u8>, value: Option<&[u8]>| match value {
        Some(bytes) => codec::write_bulk(out, bytes),
        None => codec::write_null(out, protocol),
    };
    match command {
        ReadCommand::Get => write_value(out, next()),
        ReadCommand::Strlen => codec::write_integer(out, next().map_or(0, |value| value.len() as i64)),
        // Every value the gateway stores is a Redis string.
        ReadCommand::Type => codec::write_simple(out, if next().is_some() { b"string" } else { b"none" }),
        ReadCommand::MultiGet { keys } => {
            codec::write_array_header(out, keys);
            for _ in 0..keys {
                write_value(out, next());
            }
        }
        ReadCommand::Exists { keys } => {
            let present = (0..keys).filter(|_| next().is_some()).count();
            codec::write_integer(out, present as i64);
        }
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
