//! The gateway's own bounds (public as `gateway::IN_FLIGHT_POLL_TIMEOUT` and the others); the
//! crate-wide RESP bounds are in `lib.rs`.

use std::time::Duration;

/// Longest the loop blocks while transactions are in flight: how late a transaction's deadline
/// (`TXN_TIMEOUT_MS`) may be noticed.
pub const IN_FLIGHT_POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// Most pipelined commands run as one transaction.
pub const BATCH_COMMANDS_MAX: usize = 64;

/// Most keys pipelined SETs and MSETs grow a batched write to (one command alone may have up to
/// `TXN_KEYS_MAX`). RAMP-Fast stores a write's whole write set with each version it writes, so a
/// bigger batch makes every later read of those versions dearer. Measured on the 2-core machine
/// (docs/resp.md): MSET of 4 keys with `-P 16` ran at 32-39k/s merged up to 64 keys and 27k/s up
/// to 16, but MGET of 4 keys with `-P 16` over the versions written ran at 27-30k/s and 51-59k/s.
pub const WRITE_BATCH_KEYS_MAX: usize = 16;

/// Most commands a connection may queue between MULTI and EXEC. An EXEC runs at most
/// `TXN_KEYS_MAX` distinct keys, so a longer queue can only repeat keys or hold connection
/// commands; Redis clients' transactions are a handful of commands.
pub const MULTI_QUEUED_COMMANDS_MAX: usize = 1024;

/// Most bytes (keys, values, a fixed overhead per command) a connection may queue between
/// MULTI and EXEC: one largest MSET (`TXN_KEYS_MAX` values of 64 KiB) fits, twice that does
/// not. Counted in the gateway's byte budget as well.
pub const MULTI_QUEUED_BYTES_MAX: usize = 32 * 1024 * 1024;

/// INFO's replication section lists the placement of at most this many partitions (a cluster
/// may have 65,536), then how many it left out.
pub const INFO_PARTITION_LINES_MAX: u32 = 256;

/// Least time between two attempts to reconnect a failed driver.
pub const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);
