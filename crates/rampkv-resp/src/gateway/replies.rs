//! Reply writers: the replies that are more than one frame or one constant. They append to a
//! connection's outgoing bytes and do no I/O.

use super::batch::ReadCommand;
use super::event_loop::{EventLoop, Stats};
use crate::codec::{self, Frame, Protocol};
use crate::command::TtlUnit;
use crate::{value, REDIS_COMPATIBLE_VERSION};
use rampkv_core::protocol::{ReadItem, ReadOutcome};
use rampkv_net::client::ClientError;

impl EventLoop {
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
    let mut items = outcome.items.iter();
    let write_value = |out: &mut Vec<u8>, item: &ReadItem| match value::of_item(item) {
        Some(bytes) => codec::write_bulk(out, bytes),
        None => codec::write_null(out, protocol),
    };
    for command in commands {
        match *command {
            ReadCommand::Get => write_value(out, items.next().expect("one item per key")),
            ReadCommand::MultiGet { keys } => {
                codec::write_array_header(out, keys);
                for item in items.by_ref().take(keys) {
                    write_value(out, item);
                }
            }
            ReadCommand::Exists { keys } => {
                let present = items.by_ref().take(keys).filter(|item| value::of_item(item).is_some()).count();
                codec::write_integer(out, present as i64);
            }
            ReadCommand::TimeToLive(unit) => {
                let item = items.next().expect("one item per key");
                codec::write_integer(out, time_to_live(item, outcome.read_at_ms, unit));
            }
        }
    }
    debug_assert!(items.next().is_none(), "every item answered");
}

/// TTL's and PTTL's answer for a key a read returned, judged at the read's instant
/// (`read_at_ms`): -2 absent, -1 no expiry, else the time left, in milliseconds or in seconds
/// rounded to the nearest (as Redis 7.0).
fn time_to_live(item: &ReadItem, read_at_ms: u64, unit: TtlUnit) -> i64 {
    if value::of_item(item).is_none() {
        return -2;
    }
    if item.expires_at_ms == 0 {
        return -1;
    }
    // A present version that expires was judged at `read_at_ms`: its deadline is after it.
    let left_ms = i64::try_from(item.expires_at_ms.saturating_sub(read_at_ms)).unwrap_or(i64::MAX);
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

/// INFO's text: the fields redis-cli and redis-benchmark read, plus rampkv's own.
pub(super) fn info_text(stats: &Stats, connected: usize) -> Vec<u8> {
    let uptime = stats.started.elapsed().as_secs();
    let lines = [
        "# Server".to_string(),
        format!("redis_version:{REDIS_COMPATIBLE_VERSION}"),
        format!("rampkv_version:{}", env!("CARGO_PKG_VERSION")),
        "redis_mode:standalone".to_string(),
        format!("os:{} {}", std::env::consts::OS, std::env::consts::ARCH),
        format!("arch_bits:{}", usize::BITS),
        format!("process_id:{}", std::process::id()),
        format!("tcp_port:{}", stats.port),
        format!("uptime_in_seconds:{uptime}"),
        format!("uptime_in_days:{}", uptime / 86_400),
        String::new(),
        "# Clients".to_string(),
        format!("connected_clients:{connected}"),
        format!("maxclients:{}", stats.sessions),
        String::new(),
        "# Stats".to_string(),
        format!("total_connections_received:{}", stats.connections_received),
        format!("total_commands_processed:{}", stats.commands_processed),
        format!("rejected_connections:{}", stats.connections_rejected),
        String::new(),
        "# Keyspace".to_string(),
    ];
    let mut text = lines.join("\r\n");
    text.push_str("\r\n");
    text.into_bytes()
}
