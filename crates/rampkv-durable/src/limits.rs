//! Every bound of the persistence layer, in one place (the data bounds come from
//! `rampkv_core::limits`).

use rampkv_core::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use rampkv_core::wire::BLOOM_BYTES_MAX;

/// Bytes of an encoded key list of the largest transaction: `u32 count`, then per key a `u16`
/// length and the bytes.
const KEY_LIST_BYTES_MAX: usize = 4 + TXN_KEYS_MAX * (2 + KEY_BYTES_MAX);

/// Bytes of the largest encoded metadata (tag, then a write set or a Bloom filter).
const METADATA_BYTES_MAX: usize =
    1 + if KEY_LIST_BYTES_MAX > 2 + BLOOM_BYTES_MAX { KEY_LIST_BYTES_MAX } else { 2 + BLOOM_BYTES_MAX };

/// Largest record payload: a PREPARE of the largest transaction (ts, flags, metadata, write
/// set, then every write: key, `u32` length, value). A record header declaring more is refused
/// before anything is read or allocated.
pub const RECORD_PAYLOAD_BYTES_MAX: usize =
    8 + 1 + METADATA_BYTES_MAX + KEY_LIST_BYTES_MAX + 4 + TXN_KEYS_MAX * (2 + KEY_BYTES_MAX + 4 + VALUE_BYTES_MAX);

/// Largest snapshot entry payload: one version (kind, ts, flags, metadata, value), a key
/// header, or a pending transaction with its write set; the version is the largest.
pub const SNAPSHOT_ENTRY_BYTES_MAX: usize = 1 + 8 + 1 + METADATA_BYTES_MAX + 4 + VALUE_BYTES_MAX;

/// Bytes appended to a log but not yet handed to the file system (appended, not yet flushed).
/// An append that would go past it is refused with `DurableError::LogFull` (or, with
/// `Log::append_timeout`, writes them first): bounded memory for appenders that flush late.
pub const LOG_WAITING_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A segment file is closed and a new one started before the first write that finds it at
/// least this long. A segment can exceed it by one group of records (at most
/// `LOG_WAITING_BYTES_MAX`). Recovery reads one segment into memory at a time.
pub const SEGMENT_BYTES_TARGET: u64 = 64 * 1024 * 1024;
/// A log's segments are allocated (`fallocate`: blocks reserved, reading as zeros) and fsynced
/// before they take records, in the background, `SEGMENT_BYTES_TARGET` at a time: a write
/// then never grows the file, so an `fdatasync` of it has no file size to commit. The first
/// segment after a start is allocated in the starting thread, only this long; the log moves to
/// a whole prepared segment once it is used up.
pub const SEGMENT_FIRST_PREALLOCATED_BYTES: u64 = 4 * 1024 * 1024;

/// Policy `everysec`: the longest written data waits for its fsync.
pub const EVERYSEC_SYNC_INTERVAL_MS: u64 = 1_000;

/// Snapshots kept in a data directory. The log is dropped only where the *oldest* kept
/// snapshot covers it, so that a newest snapshot found damaged at start falls back to the one
/// before it and the log after that one.
pub const SNAPSHOTS_KEPT: usize = 2;

/// After a write, the writer thread keeps at most this much of its group buffer's capacity
/// (a burst does not pin `LOG_WAITING_BYTES_MAX` of memory for ever).
pub const LOG_BUFFER_RETAINED_BYTES: usize = 4 * 1024 * 1024;

/// Buffer of the snapshot writer and reader.
pub const SNAPSHOT_IO_BUFFER_BYTES: usize = 1024 * 1024;

/// Bytes of the lock file's contents read to name the process holding a directory.
pub const LOCK_HOLDER_BYTES_MAX: u64 = 64;

const _: () = assert!(RECORD_PAYLOAD_BYTES_MAX < u32::MAX as usize);

/// A server writes a snapshot in the background once this many bytes of log were written since
/// the last one started (`--snapshot-every-bytes`; Redis rewrites its append-only file from
/// 64 MB). One segment's worth: the log a start replays stays about one segment past the
/// newest snapshot.
pub const SNAPSHOT_EVERY_BYTES_DEFAULT: u64 = SEGMENT_BYTES_TARGET;

/// Smallest `--snapshot-every-bytes`: a snapshot copies the whole store, so one after every
/// few records would do nothing but copy.
pub const SNAPSHOT_EVERY_BYTES_MIN: u64 = 1024 * 1024;

/// How long a server's append keeps trying to make room when `LOG_WAITING_BYTES_MAX` bytes
/// already wait to be written (it writes them itself; the poller takes no requests meanwhile).
/// A disk that cannot take 64 MiB in this long is treated as failed: the server stops rather
/// than acknowledge what it cannot make durable.
pub const LOG_FULL_WAIT_MS_MAX: u64 = 30_000;
