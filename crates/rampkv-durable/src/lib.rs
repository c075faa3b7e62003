//! rampkv-durable: persistence for a rampkv server. An append-only, checksummed log of what the
//! server did to its store, written with group commit under a Redis-like fsync policy;
//! snapshots of the store written in the background; and recovery, which loads the newest
//! valid snapshot, replays the log after it, cuts a torn tail and names the transactions left
//! in doubt. The byte formats are in `docs/persistence.md`.
//!
//! # Layout
//! - [`record`]: the record codec (PREPARE, COMMIT, ABORT, PUT with LSN, epoch and checksum),
//!   standalone so that replication can ship the same records.
//! - [`log`]: [`Log`]: appends, the writer thread (group commit), the durable watermark.
//! - [`snapshot`]: snapshot files, written from a live store and loaded at start.
//! - [`recovery`]: [`open`]: lock, load, replay, cut, and start the log.
//! - `files`: names, the file header, the directory lock.
//! - [`error`]: [`DurableError`], the layer's one error enum, and what a damaged file reports.
//! - [`limits`]: every bound; at the bottom (it names no other module of the crate).
//!
//! # Intended use by a server
//! ```text
//! start:   let core = ServerCore::new(..);                  // an empty store
//!          let (log, report) = rampkv_durable::open(dir, &options, core.store())?;
//!          print the report (snapshot, records replayed, cuts);
//!          resolve report.in_doubt with cooperative termination before serving
//!          (as after a client crash: STATUS to the other participants, then COMMIT or ABORT,
//!          each logged like any other);
//!          log.set_wake(move |_| poller_waker.wake());
//! serve:   for each request that changes the store (PREPARE, COMMIT, PUT, COMMIT_LOCKED,
//!          a cooperative-termination ABORT, a STATUS that marks an unknown transaction
//!          aborted): apply it to the store, THEN append its record
//!          (`log.append(epoch, record)`) and hold its reply until
//!          `log.durable_lsn() >= lsn`; on a wake-up, release the replies whose LSN the
//!          watermark passed. A refused request changes nothing and is not logged.
//!          `LogFull`: stop reading requests until the watermark moves.
//! now and then (by log size or time):
//!          log.snapshot_in_background(Arc::clone(&core), ServerCore::store)
//! stop:    join a running snapshot job (it holds the directory's lock until it ends),
//!          then log.close()
//! ```
//! Apply-then-append is what makes a snapshot of the live store right (see [`snapshot`]); it
//! also means a change is visible to readers a moment before it is durable, which RAMP
//! tolerates: a COMMIT is only sent once every PREPARE was acknowledged, hence durable, so a
//! transaction whose COMMIT was seen and then lost in a crash is committed again by
//! cooperative termination at restart.
#![forbid(unsafe_code)]

pub mod error;
mod files;
pub mod limits;
pub mod log;
pub mod record;
pub mod recovery;
pub mod snapshot;

pub use error::{DurableError, FileHeaderError, SnapshotDamage};
pub use log::{FsyncPolicy, Log, LogStats};
pub use record::{Lsn, Record, RecordError, RecordHeader, RecordRef, Writes, WritesRef};
pub use recovery::{apply_record, create_at, open, set_aside, Cut, CutReason, InDoubt, OpenOptions, RecoveryReport};
pub use snapshot::{LoadedSnapshot, SnapshotCounts, SnapshotJob, SnapshotReport};
