//! The append-only log of one server: appenders queue records and write them in groups; one
//! background thread fsyncs them.
//!
//! # Contract
//! - [`Log::append`] encodes the record into the group being gathered and returns its LSN at
//!   once; it never writes or fsyncs itself. LSNs are consecutive, and their order is the
//!   order of the bytes in the file.
//! - Appenders call [`Log::flush`] once they have appended what they will for a while (a
//!   poller: at the end of its pass over its connections): the caller writes everything
//!   gathered so far as one group, with one `write` (into the operating system's page cache:
//!   no disk wait). The written watermark ([`Log::written_lsn`]: what survives a crash of the
//!   process) has moved when it returns: no thread hand-off.
//! - One background thread, the syncer, fsyncs. With `always` it fsyncs whenever something was
//!   written that is not yet fsynced, one fsync for everything written meanwhile, while
//!   appenders write the next groups (group commit: the cost of an fsync is shared by every
//!   record written while the previous one ran); the caller of `flush` never waits for it.
//!   With `everysec` it fsyncs what was written once a second, so that writes and
//!   acknowledgements never wait for that fsync (as Redis's background fsync of `appendfsync
//!   everysec`). A record appended and never flushed is written at the next flush of any
//!   appender, at the syncer's next timed turn (a safety net), or at close.
//! - The durable watermark ([`Log::durable_lsn`]) is the LSN up to which records are as
//!   durable as the policy promises: fsynced (`always`), or handed to the operating system
//!   (`everysec`, fsynced within about `EVERYSEC_SYNC_INTERVAL_MS`; `no`, whenever the
//!   operating system writes back; with these two it moves with the written watermark). It
//!   only grows. When it advances, waiters of [`Log::wait_durable`] wake, and, when the syncer
//!   moved it (not a caller of `flush`, which knows), the callback registered with
//!   [`Log::set_wake`] runs.
//! - Bounded: at most `LOG_WAITING_BYTES_MAX` bytes wait for the writer; beyond that
//!   [`Log::append`] refuses with `LogFull` (a poller stops taking requests until the
//!   watermark moves) and [`Log::append_timeout`] flushes to make room.
//!
//! # Fault model
//! A process crash (kill -9) loses what was not yet written; a power cut also what was not
//! fsynced. In both cases the file ends with whole groups and possibly one partly written
//! group, which recovery cuts (see `recovery.rs`). A failed write or fsync stops the log for
//! good (`LogFailed`): after a failed fsync the kernel may have dropped the dirty pages, so
//! retrying could report as durable what is not. The server must stop and recover from the
//! files.
//! A new segment's header and directory entry are fsynced before it receives a record (by the
//! caller of `flush` that fills the segment: two small fsyncs every `SEGMENT_BYTES_TARGET`
//! bytes). The syncer fsyncs a closed segment as soon as it is closed, in the background (no
//! writer waits for a whole segment's fsync), before it fsyncs the next one. Recovery tells torn writes from corruption by the fsynced LSN each record
//! stamps, not by segment order.
//! Segments are allocated ahead (`fallocate`, fsynced) by a second background thread, the
//! preparer, as `segment-next.log.tmp`, renamed once its header is written: records are
//! written over allocated zeros, so no write grows a file and an `fdatasync` has no size to
//! commit. Zeros after the last record are the end of the log (recovery); `close` cuts them.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::DurableError;
use crate::files::{
    fsync_dir, prepared_segment_path, recycled_segment_path, segment_path, sync_dir, DirLock, FileHeader, SEGMENT_MAGIC,
};
use crate::limits::{EVERYSEC_SYNC_INTERVAL_MS, LOG_BUFFER_RETAINED_BYTES, SEGMENT_FIRST_PREALLOCATED_BYTES};
use crate::record::{encode_record, Lsn, RecordHeader, RecordRef};

/// When written records are fsynced, as Redis's `appendfsync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Every group is fsynced before its records count as durable: no record whose LSN the
    /// watermark passed is lost, even in a power cut.
    #[default]
    Always,
    /// Records count as durable once written; fsynced at least every
    /// `EVERYSEC_SYNC_INTERVAL_MS`: a power cut loses about the last second, a process crash
    /// nothing that was written.
    Everysec,
    /// Records count as durable once written; the operating system decides when they reach
    /// the disk (a power cut may lose anything not yet written back).
    No,
}

impl FsyncPolicy {
    /// The policy's name, as `--appendfsync` takes it.
    pub fn name(self) -> &'static str {
        match self {
            FsyncPolicy::Always => "always",
            FsyncPolicy::Everysec => "everysec",
            FsyncPolicy::No => "no",
        }
    }
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// A policy name that is none of `always`, `everysec`, `no`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fsync policy (expected always, everysec or no)")]
pub struct UnknownPolicy;

impl std::str::FromStr for FsyncPolicy {
    type Err = UnknownPolicy;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "always" => Ok(FsyncPolicy::Always),
            "everysec" => Ok(FsyncPolicy::Everysec),
            "no" => Ok(FsyncPolicy::No),
            _ => Err(UnknownPolicy),
        }
    }
}

/// What the log has done since it was opened (for benchmarks and statistics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Records written to the file.
    pub records: u64,
    /// Bytes written to the file (records only).
    pub bytes: u64,
    /// Groups written (one write system call each).
    pub groups: u64,
    /// fsyncs of segment files (in the syncer thread): with `always` one per group of records
    /// written while the previous fsync ran; with `everysec` at most one per second; one per
    /// closed segment; one at close.
    pub fsyncs: u64,
    /// The last LSN appended.
    pub last_lsn: Lsn,
    /// The durable watermark.
    pub durable_lsn: Lsn,
    /// Segments made of a recycled one (a segment a snapshot covered) rather than a new file.
    pub segments_recycled: u64,
}

impl LogStats {
    /// Records per fsync: the benefit of group commit (with `always`).
    pub fn records_per_fsync(&self) -> f64 {
        if self.fsyncs == 0 {
            0.0
        } else {
            self.records as f64 / self.fsyncs as f64
        }
    }

    /// Records per group written (one `write` each).
    pub fn mean_group_records(&self) -> f64 {
        if self.groups == 0 {
            0.0
        } else {
            self.records as f64 / self.groups as f64
        }
    }
}

/// A callback run by the syncer thread when it advances the durable watermark, with the new
/// watermark. It must be quick and must not block (wake a poller, nothing more).
pub type WakeFn = dyn Fn(Lsn) + Send + Sync;

/// Why the writer stopped: kept for every later caller.
#[derive(Debug, Clone)]
struct Failure {
    action: &'static str,
    path: PathBuf,
    message: String,
}

impl Failure {
    fn error(&self) -> DurableError {
        DurableError::LogFailed { action: self.action, path: self.path.clone(), message: self.message.clone() }
    }
}

/// Records gathered for the next group.
#[derive(Debug)]
struct Queue {
    buffer: Vec<u8>,
    /// LSN of the first record in `buffer` (meaningful while it is not empty).
    first_lsn: Lsn,
    records: u64,
    next_lsn: Lsn,
    /// Epoch of the last record appended.
    epoch: u64,
    closing: bool,
    failure: Option<Failure>,
}

/// The state appenders, waiters, the writer and snapshots share.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    policy: FsyncPolicy,
    segment_bytes_target: u64,
    waiting_bytes_max: usize,
    queue: Mutex<Queue>,
    /// Waiters of the watermark wait here.
    progress: Condvar,
    /// The syncer waits here for work (`always`), its next turn, or closing.
    syncer: Condvar,
    /// What the syncer fsyncs: closed segments, and the current one.
    sync_target: Mutex<SyncTarget>,
    /// The segment being written, held by whoever writes a group (a caller of `flush`, the
    /// syncer's safety net, close). Taken before `queue` when both are.
    writer: Mutex<WriterState>,
    /// Every record up to here was written to the file (it survives a crash of the process).
    written_lsn: AtomicU64,
    durable_lsn: AtomicU64,
    /// The highest LSN known fsynced (stamped into every record; recovery reads it).
    synced_lsn: AtomicU64,
    last_lsn: AtomicU64,
    wake: Mutex<Option<Arc<WakeFn>>>,
    records: AtomicU64,
    bytes: AtomicU64,
    groups: AtomicU64,
    fsyncs: AtomicU64,
    segments_recycled: AtomicU64,
    pub(crate) snapshot_running: AtomicBool,
    /// The next segment, allocated in the background by the preparer thread.
    prepared: Mutex<Prepared>,
    /// The preparer waits here for a segment to prepare, or for closing.
    preparer: Condvar,
    /// A prepared segment is ready (read by writers without taking `prepared`).
    prepared_ready: AtomicBool,
    /// The writer asked for the next prepared segment (once per segment).
    prepare_asked: AtomicBool,
    _lock: DirLock,
}

/// The preparer's state.
#[derive(Debug, Default)]
struct Prepared {
    /// A allocated file ready to become the next segment.
    file: Option<PreparedFile>,
    /// Make one once `file` is taken (asked by the writer once its segment is half used).
    wanted: bool,
    closing: bool,
}

/// A file of `bytes` bytes allocated (reading as zeros, or as a recycled segment's old
/// records) and fsynced, under a temporary name.
#[derive(Debug)]
struct PreparedFile {
    file: File,
    path: PathBuf,
    bytes: u64,
    /// Made of the recycled segment.
    recycled: bool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Shared").field("dir", &self.dir).field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl Shared {
    /// The last LSN appended and its epoch, read together.
    pub(crate) fn position(&self) -> (Lsn, u64) {
        let queue = self.queue.lock();
        (queue.next_lsn - 1, queue.epoch)
    }
}

/// Where a log resumes after recovery.
#[derive(Debug)]
pub(crate) struct Start {
    pub dir: PathBuf,
    pub policy: FsyncPolicy,
    pub segment_bytes_target: u64,
    pub waiting_bytes_max: usize,
    pub next_lsn: Lsn,
    pub epoch: u64,
    pub lock: DirLock,
}

/// The append-only log of one server. See the module docs.
#[derive(Debug)]
pub struct Log {
    shared: Arc<Shared>,
    /// The syncer.
    threads: Vec<JoinHandle<()>>,
}

impl Log {
    /// Starts a log whose next record gets `start.next_lsn`, in a new segment.
    pub(crate) fn start(start: Start) -> Result<Log, DurableError> {
        let Start { dir, policy, segment_bytes_target, waiting_bytes_max, next_lsn, epoch, lock } = start;
        // The first segment is allocated here, small (a start stays quick); once it is full
        // the writer moves to a whole segment the preparer allocated meanwhile.
        let first_bytes = segment_bytes_target.min(SEGMENT_FIRST_PREALLOCATED_BYTES);
        // A file system that cannot allocate ahead (or a full disk) gets a segment that grows
        // with its writes, as the preparer's failures do.
        let segment = match prepare_file(&prepared_segment_path(&dir), first_bytes, None, &|| false) {
            Ok(first) => Segment::install(&dir, first, next_lsn, epoch)?,
            Err(_) => Segment::create(&dir, next_lsn, epoch)?,
        };
        let recovered = next_lsn - 1;
        let sync_target = SyncTarget {
            retired: Vec::new(),
            file: Arc::clone(&segment.file),
            path: segment.path.clone(),
            written_lsn: recovered,
        };
        let shared = Arc::new(Shared {
            dir,
            policy,
            segment_bytes_target,
            waiting_bytes_max,
            queue: Mutex::new(Queue {
                buffer: Vec::new(),
                first_lsn: next_lsn,
                records: 0,
                next_lsn,
                epoch,
                closing: false,
                failure: None,
            }),
            progress: Condvar::new(),
            syncer: Condvar::new(),
            sync_target: Mutex::new(sync_target),
            writer: Mutex::new(WriterState { segment, spare: Vec::new() }),
            written_lsn: AtomicU64::new(recovered),
            durable_lsn: AtomicU64::new(recovered),
            synced_lsn: AtomicU64::new(recovered),
            last_lsn: AtomicU64::new(recovered),
            wake: Mutex::new(None),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            segments_recycled: AtomicU64::new(0),
            snapshot_running: AtomicBool::new(false),
            prepared: Mutex::new(Prepared { file: None, wanted: false, closing: false }),
            preparer: Condvar::new(),
            prepared_ready: AtomicBool::new(false),
            prepare_asked: AtomicBool::new(false),
            _lock: lock,
        });
        let mut log = Log { shared: Arc::clone(&shared), threads: Vec::new() };
        let syncer = Arc::clone(&shared);
        log.spawn("rampkv-log-syncer", move || run_syncer(&syncer))?;
        log.spawn("rampkv-log-prepare", move || run_preparer(&shared))?;
        Ok(log)
    }

    fn spawn(&mut self, name: &str, body: impl FnOnce() + Send + 'static) -> Result<(), DurableError> {
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(body)
            .map_err(DurableError::io("start a log thread for", &self.shared.dir))?;
        self.threads.push(thread);
        Ok(())
    }

    /// Queues `record` (stamped with `epoch`) for the next group and returns its LSN. Never
    /// blocks on I/O. The record is written once some appender calls [`Log::flush`].
    ///
    /// # Errors
    /// `LogFull` when `LOG_WAITING_BYTES_MAX` bytes already wait (nothing was queued: retry
    /// once the watermark moves); `InvalidRecord` for a record the decoder would refuse;
    /// `LogFailed` after a write or fsync failed.
    pub fn append(&self, epoch: u64, record: RecordRef<'_>) -> Result<Lsn, DurableError> {
        let mut queue = self.shared.queue.lock();
        self.append_locked(&mut queue, epoch, record)
    }

    /// [`Log::append`], making room when the log is full by writing what waits (in this
    /// thread, as [`Log::flush`]); `timeout` bounds the tries.
    pub fn append_timeout(&self, epoch: u64, record: RecordRef<'_>, timeout: Duration) -> Result<Lsn, DurableError> {
        let deadline = Instant::now() + timeout;
        let mut queue = self.shared.queue.lock();
        loop {
            match self.append_locked(&mut queue, epoch, record) {
                Err(DurableError::LogFull { .. }) if Instant::now() < deadline => {
                    drop(queue);
                    self.flush()?;
                    queue = self.shared.queue.lock();
                }
                result => return result,
            }
        }
    }

    /// Ends a batch of appends: everything appended so far is written here as one group, with
    /// one `write`; the written watermark has moved when this returns. With `everysec` and `no`
    /// so has the durable one (the callback of [`Log::set_wake`] does not run: the caller
    /// knows); with `always` the syncer is told, fsyncs, then moves it and runs the callback.
    /// Returns the durable watermark.
    ///
    /// # Errors
    /// `LogFailed` after a write or fsync failed (here or earlier).
    pub fn flush(&self) -> Result<Lsn, DurableError> {
        write_gathered(&self.shared, false)?;
        Ok(self.durable_lsn())
    }

    fn append_locked(&self, queue: &mut Queue, epoch: u64, record: RecordRef<'_>) -> Result<Lsn, DurableError> {
        if let Some(failure) = &queue.failure {
            return Err(failure.error());
        }
        let lsn = queue.next_lsn;
        let header = RecordHeader { lsn, epoch, synced_lsn: self.shared.synced_lsn.load(Ordering::Acquire) };
        let before = queue.buffer.len();
        encode_record(header, record, &mut queue.buffer)?;
        // A record always goes into an empty buffer (the default bound is at least the largest
        // record, and a smaller one must not stop the log for ever).
        let max = self.shared.waiting_bytes_max;
        if before > 0 && queue.buffer.len() > max {
            queue.buffer.truncate(before);
            return Err(DurableError::LogFull { waiting_bytes: before, max });
        }
        if queue.records == 0 {
            queue.first_lsn = lsn;
        }
        queue.records += 1;
        queue.next_lsn = lsn + 1;
        queue.epoch = epoch;
        self.shared.last_lsn.store(lsn, Ordering::Release);
        Ok(lsn)
    }

    /// The durable watermark: every record up to it is as durable as the policy promises.
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// The written watermark: every record up to it was handed to the operating system (it
    /// survives a crash of the process, not necessarily a power cut). At least the durable one.
    pub fn written_lsn(&self) -> Lsn {
        self.shared.written_lsn.load(Ordering::Acquire)
    }

    /// The last LSN appended (0 when the log has none).
    pub fn last_lsn(&self) -> Lsn {
        self.shared.last_lsn.load(Ordering::Acquire)
    }

    /// Waits until `lsn` is durable (flushing first if it is not yet).
    ///
    /// # Errors
    /// `DurableTimeout` after `timeout`; `NotAppended` for an LSN not appended yet (it would
    /// never become durable by waiting); `LogFailed` if the writer stopped.
    pub fn wait_durable(&self, lsn: Lsn, timeout: Duration) -> Result<(), DurableError> {
        let deadline = Instant::now() + timeout;
        if self.durable_lsn() < lsn && lsn <= self.last_lsn() {
            self.flush()?;
        }
        let mut queue = self.shared.queue.lock();
        if lsn >= queue.next_lsn {
            return Err(DurableError::NotAppended { lsn, last_lsn: queue.next_lsn - 1 });
        }
        loop {
            let durable_lsn = self.durable_lsn();
            if durable_lsn >= lsn {
                return Ok(());
            }
            if let Some(failure) = &queue.failure {
                return Err(failure.error());
            }
            if self.shared.progress.wait_until(&mut queue, deadline).timed_out() && self.durable_lsn() < lsn {
                let timeout_ms = timeout.as_millis() as u64;
                return Err(DurableError::DurableTimeout { lsn, durable_lsn: self.durable_lsn(), timeout_ms });
            }
        }
    }

    /// Registers the callback the syncer runs when it advances the watermark (replacing any
    /// earlier one): after each fsync with `always`, and when it wrote records nobody flushed.
    /// It also runs once when the log fails, so that a poller holding replies notices.
    pub fn set_wake(&self, wake: impl Fn(Lsn) + Send + Sync + 'static) {
        *self.shared.wake.lock() = Some(Arc::new(wake));
    }

    /// The failure that stopped the log, if one did (nothing more becomes durable: the server
    /// must stop and recover from the files).
    pub fn failure(&self) -> Option<DurableError> {
        self.shared.queue.lock().failure.as_ref().map(Failure::error)
    }

    /// The fsync policy.
    pub fn policy(&self) -> FsyncPolicy {
        self.shared.policy
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Counters since the log was opened.
    pub fn stats(&self) -> LogStats {
        let shared = &self.shared;
        LogStats {
            records: shared.records.load(Ordering::Relaxed),
            bytes: shared.bytes.load(Ordering::Relaxed),
            groups: shared.groups.load(Ordering::Relaxed),
            fsyncs: shared.fsyncs.load(Ordering::Relaxed),
            last_lsn: self.last_lsn(),
            durable_lsn: self.durable_lsn(),
            segments_recycled: shared.segments_recycled.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Writes and fsyncs everything appended, whatever the policy, and stops the writer.
    ///
    /// # Errors
    /// The failure that stopped the writer, if one did.
    pub fn close(mut self) -> Result<(), DurableError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), DurableError> {
        if self.threads.is_empty() {
            return Ok(());
        }
        self.shared.queue.lock().closing = true;
        self.shared.syncer.notify_all();
        self.shared.prepared.lock().closing = true;
        self.shared.preparer.notify_all();
        let panicked = self.threads.drain(..).map(JoinHandle::join).filter(Result::is_err).count();
        if panicked > 0 {
            return Err(DurableError::LogFailed {
                action: "run the log threads for",
                path: self.shared.dir.clone(),
                message: "a log thread panicked".into(),
            });
        }
        // Closing: whatever the policy, everything appended is written and fsynced (the log
        // threads have ended: nothing else writes).
        let shared = &self.shared;
        if shared.queue.lock().failure.is_none() && write_gathered(shared, false).is_ok() {
            let writer = shared.writer.lock();
            match sync_all_written(shared, &writer).and_then(|()| writer.segment.cut_zero_tail()) {
                Ok(()) => shared.publish(shared.written_lsn.load(Ordering::Acquire)),
                Err(failure) => drop(shared.fail(failure)),
            }
        }
        // A prepared segment nobody will use.
        if let Some(unused) = shared.prepared.lock().file.take() {
            let _ = std::fs::remove_file(&unused.path);
        }
        match &self.shared.queue.lock().failure {
            Some(failure) => Err(failure.error()),
            None => Ok(()),
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // A drop cannot report; `close` is how a caller learns of a last failure.
        let _ = self.stop();
    }
}

/// The segment the writer appends to.
struct Segment {
    /// Shared with the syncer, which fsyncs it while the writer goes on.
    file: Arc<File>,
    path: PathBuf,
    /// Where the next group goes: the header and the records written so far.
    bytes: u64,
    /// The file's length when it was installed: the bytes after `bytes` up to here were
    /// allocated (and fsynced) beforehand and read as zeros or, in a recycled segment, as the
    /// records of an older segment, so a write there does not grow the file and an
    /// `fdatasync` of it has no file size to commit. 0 for a segment not allocated ahead.
    preallocated: u64,
}

impl Segment {
    /// Creates the segment whose first record will be `first_lsn`, with its header fsynced and
    /// its directory entry made durable before any record goes in. Not allocated ahead: for when no
    /// prepared file is ready.
    fn create(dir: &Path, first_lsn: Lsn, epoch: u64) -> Result<Segment, DurableError> {
        let path = segment_path(dir, first_lsn);
        let mut file =
            File::options().write(true).create_new(true).open(&path).map_err(DurableError::io("create", &path))?;
        let header = FileHeader { lsn: first_lsn, epoch }.encode(SEGMENT_MAGIC);
        file.write_all(&header).and_then(|()| file.sync_data()).map_err(DurableError::io("write", &path))?;
        sync_dir(dir)?;
        Ok(Segment { file: Arc::new(file), path, bytes: header.len() as u64, preallocated: 0 })
    }

    /// Makes the allocated `prepared` file the segment whose first record will be
    /// `first_lsn`: its header written over the first zeros and fsynced, then the file renamed
    /// to the segment's name and the directory fsynced, before any record goes in. A crash in
    /// between leaves the temporary file (deleted at start) or a segment of a header and zeros
    /// (no records).
    fn install(dir: &Path, prepared: PreparedFile, first_lsn: Lsn, epoch: u64) -> Result<Segment, DurableError> {
        let PreparedFile { file, path: temporary, bytes, .. } = prepared;
        let path = segment_path(dir, first_lsn);
        let header = FileHeader { lsn: first_lsn, epoch }.encode(SEGMENT_MAGIC);
        file.write_all_at(&header, 0).and_then(|()| file.sync_data()).map_err(DurableError::io("write", &temporary))?;
        std::fs::rename(&temporary, &path).map_err(DurableError::io("rename", &temporary))?;
        sync_dir(dir)?;
        Ok(Segment { file: Arc::new(file), path, bytes: header.len() as u64, preallocated: bytes })
    }

    /// Closing: drops the zeros (or a recycled segment's old records) after the last record
    /// (recovery would take them as the end of the log anyway; a cleanly closed segment is
    /// exactly its records).
    fn cut_zero_tail(&self) -> Result<(), Failure> {
        if self.preallocated <= self.bytes {
            return Ok(());
        }
        self.file
            .set_len(self.bytes)
            .and_then(|()| self.file.sync_all())
            .map_err(|error| failure("truncate", &self.path, &error))
    }
}

/// Makes a file of at least `bytes` bytes at `path` (replacing a leftover), allocated
/// (`fallocate`: blocks reserved, reading as zeros) and fsynced with its size; gives up (the
/// file removed) if `halted()` says so first. With `recycled` (the recycled segment's path)
/// and such a file there, that file is renamed to `path` and used, its old records left in
/// place (the log writes over them; recovery tells them from its own: `Replay::stale_tail`),
/// extended to `bytes` if it is shorter.
fn prepare_file(
    path: &Path,
    bytes: u64,
    recycled: Option<&Path>,
    halted: &dyn Fn() -> bool,
) -> std::io::Result<PreparedFile> {
    let prepare = || {
        let reused = recycled.is_some_and(|recycled| std::fs::rename(recycled, path).is_ok());
        if reused {
            // The rename made durable before the writer puts a new header on the file: else a
            // crash could leave it under the covered segment's name (the snapshot's rename not
            // yet synced either) with another segment's header, which a start refuses.
            fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
        }
        let file = File::options().write(true).create(true).truncate(!reused).open(path)?;
        if halted() {
            return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "the log is closing"));
        }
        let length = file.metadata()?.len();
        if length < bytes {
            fs4::FileExt::allocate(&file, bytes)?;
        }
        file.sync_all()?;
        Ok(PreparedFile { file, path: path.to_path_buf(), bytes: length.max(bytes), recycled: reused })
    };
    prepare().inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// The preparer: keeps one allocated segment of `segment_bytes_target` bytes ready for the
/// writer's next rotation, so that no writer waits for a file to be filled; the recycled
/// segment a snapshot left, when there is one (`prepare_file`). A failed
/// preparation (a full disk) is not an error of the log: the next segment is then created
/// empty and grows with its writes, as without preparation (and the preparer tries again
/// after that rotation).
fn run_preparer(shared: &Shared) {
    let path = prepared_segment_path(&shared.dir);
    let recycled = recycled_segment_path(&shared.dir);
    let closing = || shared.prepared.lock().closing;
    loop {
        {
            let mut prepared = shared.prepared.lock();
            // Never while one is ready: it would be overwritten (one path).
            let work = |prepared: &Prepared| prepared.closing || (prepared.wanted && prepared.file.is_none());
            while !work(&prepared) {
                shared.preparer.wait(&mut prepared);
            }
            if prepared.closing {
                return;
            }
        }
        let made = prepare_file(&path, shared.segment_bytes_target, Some(&recycled), &closing);
        let mut prepared = shared.prepared.lock();
        prepared.wanted = false;
        match made {
            Ok(file) if prepared.closing => {
                let _ = std::fs::remove_file(&file.path);
            }
            Ok(file) => {
                prepared.file = Some(file);
                shared.prepared_ready.store(true, Ordering::Release);
            }
            Err(_) => {}
        }
    }
}

/// What the syncer fsyncs.
#[derive(Debug, Clone)]
struct SyncTarget {
    /// Segments closed and not yet fsynced, oldest first, each with its last LSN.
    retired: Vec<(Arc<File>, PathBuf, Lsn)>,
    /// The segment being written.
    file: Arc<File>,
    path: PathBuf,
    /// Every record up to this LSN was written to `file` or to an earlier segment.
    written_lsn: Lsn,
}

/// A group taken from the queue.
struct Group {
    first_lsn: Lsn,
    last_lsn: Lsn,
    records: u64,
    epoch: u64,
}

/// What whoever writes a group holds: the segment being written, and the buffer swapped with
/// the queue's (one group is written while the next gathers).
struct WriterState {
    segment: Segment,
    spare: Vec<u8>,
}

/// Takes what was gathered as one group (into `spare`), under the queue's lock; `None` when
/// nothing was.
fn take_group(shared: &Shared, spare: &mut Vec<u8>) -> Result<Option<Group>, DurableError> {
    let mut queue = shared.queue.lock();
    if let Some(failure) = &queue.failure {
        return Err(failure.error());
    }
    if queue.buffer.is_empty() {
        return Ok(None);
    }
    std::mem::swap(&mut queue.buffer, spare);
    let group =
        Group { first_lsn: queue.first_lsn, last_lsn: queue.next_lsn - 1, records: queue.records, epoch: queue.epoch };
    queue.records = 0;
    Ok(Some(group))
}

/// Writes what was gathered as one group and advances the written watermark; with `everysec`
/// and `no` the durable one too (and with `wake` runs the wake-up callback), with `always`
/// tells the syncer. Returns whether anything was written.
fn write_gathered(shared: &Shared, wake: bool) -> Result<bool, DurableError> {
    let mut writer = shared.writer.lock();
    let Some(group) = take_group(shared, &mut writer.spare)? else { return Ok(false) };
    if let Err(failure) = write_group(shared, &mut writer, &group) {
        return Err(shared.fail(failure));
    }
    drop(writer);
    if shared.policy == FsyncPolicy::Always {
        // Notified under the queue lock, under which the syncer looks for work: it either sees
        // the new written watermark or is already waiting when the notification comes.
        let _queue = shared.queue.lock();
        shared.syncer.notify_one();
    } else {
        shared.publish(group.last_lsn);
        if wake {
            shared.run_wake();
        }
    }
    Ok(true)
}

/// Writes `spare` (the group) and advances the written watermark; the caller, the durable one.
fn write_group(shared: &Shared, writer: &mut WriterState, group: &Group) -> Result<(), Failure> {
    let segment = &writer.segment;
    // A segment is closed once full, or, to move to an allocated one, once it used up its own
    // zeros (the small first segment, or one created empty when none was ready): it never
    // closes with zeros after its records.
    let outgrown = segment.bytes >= segment.preallocated && shared.prepared_ready.load(Ordering::Acquire);
    if segment.bytes >= shared.segment_bytes_target || outgrown {
        rotate(shared, writer, group)?;
    }
    let segment = &mut writer.segment;
    segment.file.write_all_at(&writer.spare, segment.bytes).map_err(|error| failure("write", &segment.path, &error))?;
    segment.bytes += writer.spare.len() as u64;
    // Half used: time to have the next one allocated (a log that never writes that much,
    // a short test's, never fills a whole segment of zeros).
    if segment.bytes >= segment.preallocated / 2 && !shared.prepare_asked.swap(true, Ordering::AcqRel) {
        shared.prepared.lock().wanted = true;
        shared.preparer.notify_all();
    }
    shared.records.fetch_add(group.records, Ordering::Relaxed);
    shared.bytes.fetch_add(writer.spare.len() as u64, Ordering::Relaxed);
    shared.groups.fetch_add(1, Ordering::Relaxed);
    writer.spare.clear();
    writer.spare.shrink_to(LOG_BUFFER_RETAINED_BYTES);
    // The syncer fsyncs what is written without holding up the writes.
    shared.sync_target.lock().written_lsn = group.last_lsn;
    shared.written_lsn.store(group.last_lsn, Ordering::Release);
    Ok(())
}

/// fsyncs the segment: everything written so far (up to `written_lsn`) is on disk.
fn sync_to(shared: &Shared, writer: &WriterState, written_lsn: Lsn) -> Result<(), Failure> {
    writer.segment.file.sync_data().map_err(|error| failure("fsync", &writer.segment.path, &error))?;
    shared.fsyncs.fetch_add(1, Ordering::Relaxed);
    shared.synced_lsn.fetch_max(written_lsn, Ordering::AcqRel);
    Ok(())
}

/// Closing: fsyncs every closed segment the syncer has not, then the current one.
fn sync_all_written(shared: &Shared, writer: &WriterState) -> Result<(), Failure> {
    let retired = std::mem::take(&mut shared.sync_target.lock().retired);
    sync_retired(shared, retired)?;
    let written = shared.written_lsn.load(Ordering::Acquire);
    if shared.synced_lsn.load(Ordering::Acquire) < written {
        sync_to(shared, writer, written)?;
    }
    Ok(())
}

/// Closes the current segment and starts the next at the group's first LSN; the syncer fsyncs
/// the closed one in the background (no writer waits for a whole segment's fsync), before it
/// fsyncs the next.
fn rotate(shared: &Shared, writer: &mut WriterState, group: &Group) -> Result<(), Failure> {
    let next = {
        // Installed under the lock: the preparer reuses the temporary name for the next one
        // and must not open it before it is renamed.
        let mut prepared = shared.prepared.lock();
        shared.prepared_ready.store(false, Ordering::Release);
        shared.prepare_asked.store(false, Ordering::Release);
        match prepared.file.take() {
            Some(file) => {
                if file.recycled {
                    shared.segments_recycled.fetch_add(1, Ordering::Relaxed);
                }
                Segment::install(&shared.dir, file, group.first_lsn, group.epoch)
            }
            None => Segment::create(&shared.dir, group.first_lsn, group.epoch),
        }
    };
    let next = next.map_err(|error| match error {
        DurableError::Io { action, path, source } => failure(action, &path, &source),
        other => Failure { action: "create a segment in", path: shared.dir.clone(), message: other.to_string() },
    })?;
    let closed = std::mem::replace(&mut writer.segment, next);
    {
        let mut target = shared.sync_target.lock();
        target.retired.push((closed.file, closed.path, group.first_lsn - 1));
        target.file = Arc::clone(&writer.segment.file);
        target.path = writer.segment.path.clone();
    }
    // Notified under the queue lock, which the syncer holds while it looks for work: it
    // either sees the closed segment or is already waiting when the notification comes.
    let _queue = shared.queue.lock();
    shared.syncer.notify_all();
    Ok(())
}

/// The syncer: fsyncs closed segments as soon as they are closed; with `always` whatever was
/// written and not yet fsynced (one fsync for everything written meanwhile: group commit),
/// then advances the durable watermark and runs the wake-up callback; with `everysec` what was
/// written every `EVERYSEC_SYNC_INTERVAL_MS`, in its own thread so that writes and
/// acknowledgements go on during the fsync (as Redis does its everysec fsync in a background
/// thread). Records written before an fsync starts are on disk when it returns, so the LSN read
/// before it is what becomes synced. At each timed turn it also writes records appended and
/// not flushed (a safety net: every appender flushes).
fn run_syncer(shared: &Shared) {
    let interval = Duration::from_millis(EVERYSEC_SYNC_INTERVAL_MS);
    let always = shared.policy == FsyncPolicy::Always;
    let mut next_turn = Instant::now() + interval;
    loop {
        let turn = {
            let mut queue = shared.queue.lock();
            loop {
                if queue.closing || queue.failure.is_some() {
                    return; // closing fsyncs what is left
                }
                let turn = Instant::now() >= next_turn;
                let unsynced =
                    always && shared.written_lsn.load(Ordering::Acquire) > shared.synced_lsn.load(Ordering::Acquire);
                if turn || unsynced || !shared.sync_target.lock().retired.is_empty() {
                    break turn;
                }
                shared.syncer.wait_until(&mut queue, next_turn);
            }
        };
        if turn {
            next_turn = Instant::now() + interval;
            if write_gathered(shared, true).is_err() {
                return; // stored, reported to every later call
            }
        }
        // The closed segments and the current one are read together: an fsync of the current
        // one covers what was written to it, and the closed ones before it are fsynced first.
        let target = {
            let mut target = shared.sync_target.lock();
            let retired = std::mem::take(&mut target.retired);
            SyncTarget { retired, ..target.clone() }
        };
        let sync_current = always || (turn && shared.policy == FsyncPolicy::Everysec);
        let result = sync_retired(shared, target.retired).and_then(|()| {
            if !sync_current || target.written_lsn <= shared.synced_lsn.load(Ordering::Acquire) {
                return Ok(());
            }
            target.file.sync_data().map_err(|error| failure("fsync", &target.path, &error))?;
            shared.fsyncs.fetch_add(1, Ordering::Relaxed);
            shared.synced_lsn.fetch_max(target.written_lsn, Ordering::AcqRel);
            Ok(())
        });
        if let Err(failure) = result {
            shared.fail(failure);
            return;
        }
        if always && target.written_lsn > shared.durable_lsn.load(Ordering::Acquire) {
            // The watermark of `always` waits for the fsync.
            shared.publish(target.written_lsn);
            shared.run_wake();
        }
    }
}

/// fsyncs closed segments in order, advancing the synced LSN past each.
fn sync_retired(shared: &Shared, retired: Vec<(Arc<File>, PathBuf, Lsn)>) -> Result<(), Failure> {
    for (file, path, last_lsn) in retired {
        file.sync_data().map_err(|error| failure("fsync", &path, &error))?;
        shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        shared.synced_lsn.fetch_max(last_lsn, Ordering::AcqRel);
    }
    Ok(())
}

impl Shared {
    /// Advances the watermark to `lsn` and wakes waiters (not the callback).
    fn publish(&self, lsn: Lsn) {
        {
            // Stored under the queue lock: a waiter checks the watermark under it, so it either
            // sees the new value or is already waiting when the notification comes.
            let _queue = self.queue.lock();
            self.durable_lsn.fetch_max(lsn, Ordering::AcqRel);
        }
        self.progress.notify_all();
    }

    fn run_wake(&self) {
        let wake = self.wake.lock().clone();
        if let Some(wake) = wake {
            wake(self.durable_lsn.load(Ordering::Acquire));
        }
    }

    /// Stops the log for good: every later call gets the failure (the first one, returned).
    fn fail(&self, failure: Failure) -> DurableError {
        let error = self.queue.lock().failure.get_or_insert(failure).error();
        self.syncer.notify_all();
        self.progress.notify_all();
        self.run_wake();
        error
    }
}

fn failure(action: &'static str, path: &Path, error: &std::io::Error) -> Failure {
    Failure { action, path: path.to_path_buf(), message: error.to_string() }
}
