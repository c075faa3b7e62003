//! Bounds of the benchmark tooling, in one place.

use rampkv_core::limits::TXN_TIMEOUT_MS;

/// How long a streamed history may sit written but not flushed: the file a killed run leaves
/// is at most about this much (plus [`HISTORY_SEND_INTERVAL_MS`]) behind the run.
pub const HISTORY_FLUSH_INTERVAL_MS: u64 = 500;

/// How long a client thread keeps finished records before handing them to the history writer.
pub const HISTORY_SEND_INTERVAL_MS: u64 = 200;

/// Records a client thread hands over at once at most (sooner than the interval if it has this
/// many), so a batch stays small next to the writer's buffer.
pub const HISTORY_SEND_RECORDS_MAX: usize = 4096;

/// Batches waiting for the history writer at most; a client thread that finds the queue full
/// waits (back-pressure) rather than let the queue grow without bound.
pub const HISTORY_QUEUE_BATCHES_MAX: usize = 64;

/// How long the history writer holds a read back while a version it returned has no write
/// record yet (a write still finishing). A write gives up within `TXN_TIMEOUT_MS` and is then
/// recorded too; beyond that (and the client's hand-over interval) the read is written anyway,
/// so a read of a version no write will ever name still reaches the checker as garbage.
pub const HISTORY_READ_HOLD_MS_MAX: u64 = TXN_TIMEOUT_MS + 2 * HISTORY_SEND_INTERVAL_MS + 1_000;

/// Reads the history writer holds back at most; beyond, the oldest is written anyway.
pub const HISTORY_HELD_READS_MAX: usize = 1 << 16;

/// Write timestamps the history writer remembers (the most recent ones), to tell whether a
/// read's versions already have their write records in the file. A read of an older version
/// is held until [`HISTORY_READ_HOLD_MS_MAX`]: later, never wrong.
pub const HISTORY_KNOWN_WRITES_MAX: usize = 1 << 20;

/// Writes overlapping a read in time (of any key) the checker compares with the read's keys one
/// by one; beyond, it asks its per-key index instead, which finds only writes of the read's keys.
pub const CHECKER_TIME_OVERLAPS_SCAN_MAX: usize = 64;
