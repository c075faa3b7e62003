//! RESP (the Redis protocol) gateway: redis-cli, redis-benchmark and client libraries talk to
//! rampkv, and MGET/MSET run as read-atomic transactions across partitions. See `docs/resp.md`.
//!
//! # Layout
//! - [`auth`]: users and passwords (`--requirepass`, `--aclfile`), what each may run, Redis's
//!   NOAUTH / WRONGPASS / NOPERM replies. No I/O but reading the ACL file.
//! - [`codec`]: RESP2/RESP3 values ([`codec::Frame`]), the request parser (arrays of bulk
//!   strings and inline commands) and the reply encoder. No I/O.
//! - [`command`]: the command table (names, arities, flags) and the translation of one parsed
//!   command into a [`command::Request`]: a transaction to run, a single-key update or a reply
//!   to send. No I/O (its one clock reading: a relative expiry of an update, at receipt).
//! - [`keyspace`]: SCAN's and KEYS's arguments and SCAN's cursor (partition and hash position
//!   in one number). No I/O.
//! - [`value`]: how the gateway stores values in rampkv (a presence byte, so DEL can work
//!   over versions that have no tombstone).
//! - [`gateway`]: the event loop: one thread, RESP connections on one side, one
//!   [`rampkv_net::client::Driver`] with a fixed pool of sessions on the other.
//! - `transport` (private): the driver's TCP transport, with its sockets in the gateway's poller.
//!
//! # Contract
//! The gateway is a rampkv *client*: it holds no data. Each RESP connection owns one driver
//! session (its own client id and clock) and runs its commands one at a time in arrival order,
//! so pipelined commands are answered in order and a connection reads its own writes. MGET,
//! EXISTS and DEL read with one `get_all`; MSET, SET and DEL write with one `put_all`, whatever
//! partitions the keys live on. MULTI/EXEC runs a queue of reads as one `get_all` and a queue of
//! writes as one `put_all`, and refuses a queue that mixes them (a RAMP transaction is
//! read-only or write-only).
//!
//! # Bounds
//! The RESP-specific bounds live here; they are derived from the system's bounds in
//! [`rampkv_core::limits`] so that nothing the gateway accepts can be refused by rampkv for its size.
#![forbid(unsafe_code)]

pub mod auth;
pub mod codec;
pub mod command;
pub mod gateway;
pub mod keyspace;
mod transport;
pub mod value;

use rampkv_core::limits::{TXN_KEYS_MAX, VALUE_BYTES_MAX};

/// Largest bulk string a request may carry. A longer one is a protocol error (the connection
/// is closed), as Redis does past its `proto-max-bulk-len`. A value is stored with one extra
/// byte ([`value`]), so the largest value SET accepts is one byte less.
pub const RESP_BULK_BYTES_MAX: usize = VALUE_BYTES_MAX;

/// Most arguments in one request: MSET of `TXN_KEYS_MAX` pairs plus the command name. No command
/// the gateway runs can take more, so a longer array is refused as a protocol error before any
/// of it is buffered.
pub const RESP_ARGS_MAX: usize = 2 * TXN_KEYS_MAX + 1;

/// Most arguments in one request before the connection has authenticated (Redis's limit
/// for unauthenticated clients): AUTH and HELLO need far fewer, and an anonymous client cannot
/// make the gateway buffer a large request.
pub const RESP_UNAUTHENTICATED_ARGS_MAX: usize = 10;

/// Largest bulk string before the connection has authenticated (Redis's limit).
pub const RESP_UNAUTHENTICATED_BULK_BYTES_MAX: usize = 16 * 1024;

/// Longest inline command line (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const RESP_INLINE_BYTES_MAX: usize = 64 * 1024;

/// Longest header line (`*<count>` or `$<length>`) of a request, CRLF excluded. The largest
/// legitimate one is a handful of digits.
pub const RESP_HEADER_LINE_BYTES_MAX: usize = 32;

/// Deepest nesting of aggregates the general frame parser accepts (replies, tests). Bounds its
/// recursion.
pub const RESP_NESTING_DEPTH_MAX: usize = 32;

/// Longest bulk string the general frame parser accepts (Redis's default `proto-max-bulk-len`).
/// Nothing is allocated for it until all of it has arrived.
pub const RESP_REPLY_BULK_BYTES_MAX: usize = 512 * 1024 * 1024;

/// Most elements of one aggregate in the general frame parser.
pub const RESP_AGGREGATE_ITEMS_MAX: usize = 1 << 20;

/// Sessions (and so RESP connections) a gateway serves at once by default.
pub const GATEWAY_SESSIONS_DEFAULT: usize = 1024;

/// Most sessions a gateway may be configured with (client ids are 16 bits, and a cluster hands
/// them out to every client it has).
pub const GATEWAY_SESSIONS_MAX: usize = 16 * 1024;

/// Bytes of unsent replies after which a connection's next command waits until the client has
/// read them (back-pressure instead of unbounded buffering). One reply may exceed it: an MGET
/// of `TXN_KEYS_MAX` values of `VALUE_BYTES_MAX` is 16 MiB.
pub const GATEWAY_OUTPUT_BACKLOG_BYTES_MAX: usize = 1024 * 1024;

/// Most bytes all RESP connections of a gateway may hold together (their buffered requests and
/// unsent replies; each alone may hold up to one largest request plus its backlog, about 33
/// MiB). Beyond it the connection holding the most is closed, and logged, until the total is
/// back under it: 1,024 connections each holding a 32 MiB request would otherwise hold 32 GiB.
pub const GATEWAY_BUFFERED_BYTES_MAX: usize = 512 * 1024 * 1024;

/// With an idle timeout (`--timeout`, as Redis's `timeout`), how often the gateway looks for
/// connections idle past it (each look reads every connection; one closes at most this late).
pub const GATEWAY_IDLE_SCAN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Replies are written once per turn of the gateway's loop, when it has nothing left to run
/// (one send for a pipeline's replies, as Redis does before it waits), or as soon as this many
/// bytes of them wait.
pub const GATEWAY_WRITE_EARLY_BYTES: usize = 64 * 1024;

/// The Redis version the gateway reports (INFO, HELLO): the command set it follows. Clients
/// use it to choose features; rampkv's own version is reported beside it.
pub const REDIS_COMPATIBLE_VERSION: &str = "7.0.0";
