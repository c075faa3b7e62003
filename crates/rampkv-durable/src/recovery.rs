//! Opening a data directory: lock it, load the newest valid snapshot, replay the log after it
//! into the store, cut a torn tail, and start the log where it ended.
//!
//! # Rules
//! - Snapshots are tried newest first; one that does not load (damaged, torn) is reported and
//!   skipped, and the store is cleared before the next is tried. With none, replay starts at
//!   LSN 1.
//! - Segments are read in LSN order. Records must be consecutive from each segment's first
//!   LSN; between segments a jump is allowed only over LSNs the snapshot covers (a restart
//!   after a snapshot newer than the durable log resumes the log after the snapshot).
//!   Records the snapshot covers are read and skipped; the others are applied with the
//!   store's own operations (PREPARE, COMMIT, ABORT, PUT); a PREPARE or PUT of a transaction
//!   the store already knows aborted is refused by the store, as it was when first applied.
//! - Damage (a record that does not check: cut short, wrong checksum, garbage) is a **torn
//!   write** when no valid record after it (in its segment or a later one) was written once
//!   the damaged one had been fsynced: every record stamps the highest LSN fsynced when it was
//!   appended (`synced_lsn`), so a later record with `synced_lsn` at or past the damaged LSN
//!   proves that the damaged bytes had reached the disk whole. A torn write is cut (the file is
//!   truncated at the damage, later segments are deleted) and reported: file, offset, bytes
//!   and records dropped. Such records were never fsynced, so never acknowledged under
//!   `always`. (Closed segments are fsynced in the background with `everysec` and `no`, so
//!   after a power cut an older segment may have a hole that a later one does not vouch for.)
//! - Older bytes after a segment's last record (a recycled segment is written over an older
//!   one) end the segment as zeros do, when no valid record at or past the LSN expected follows
//!   and the next segment starts at that LSN, or, in the last segment, when no record was begun
//!   there and a whole record older than the segment follows (`Replay::stale_tail`).
//! - Any other damage is **corruption**: an error naming the file and offset, unless
//!   `truncate_corrupt` is set, which cuts the log there (and deletes later segments) and
//!   reports what it dropped. Damage in records the snapshot covers is skipped over when a
//!   valid record follows within the covered range (reported, nothing cut).
//! - A record that checks but cannot be what the writer wrote (an LSN out of order, a payload
//!   that does not decode, a PREPARE the store refuses as invalid) is corruption too.
//! - Limit: damage in the last records written (those no later record vouches for: the stamp
//!   is taken at append time, so it lags by about one group) cannot be told from a torn write;
//!   it is cut and reported, never silently.
//!
//! After replay, the transactions still prepared and neither committed nor aborted are
//! returned as in doubt: the server resolves them with cooperative termination before it
//! serves, as after a client crash.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rampkv_core::storage::{Key, Store, StoreError};
use rampkv_core::types::Timestamp;
use rampkv_core::wire::WriteSet;

use crate::error::{DurableError, FileHeaderError};
use crate::files::{list, segment_path, DirLock, FileHeader, FILE_HEADER_BYTES, SEGMENT_MAGIC};
use crate::limits::{LOG_WAITING_BYTES_MAX, SEGMENT_BYTES_TARGET};
use crate::log::{FsyncPolicy, Log, Start};
use crate::record::{check_frame, header_lsn, Frame, Lsn, Record, RecordError};
use crate::snapshot::{self, LoadedSnapshot};

/// How to open a data directory.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub policy: FsyncPolicy,
    /// Cut the log at damage in the middle (and report it) instead of refusing to start.
    pub truncate_corrupt: bool,
    /// The store clock (ms) at start: loaded versions and pending transactions date from it.
    pub now_ms: u64,
    /// Segment size target (`SEGMENT_BYTES_TARGET`; tests make it small).
    pub segment_bytes_target: u64,
    /// Bound on bytes waiting for the writer (`LOG_WAITING_BYTES_MAX`; tests make it small).
    pub waiting_bytes_max: usize,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            policy: FsyncPolicy::Always,
            truncate_corrupt: false,
            now_ms: 0,
            segment_bytes_target: SEGMENT_BYTES_TARGET,
            waiting_bytes_max: LOG_WAITING_BYTES_MAX,
        }
    }
}

/// Why part of the log was cut at start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CutReason {
    /// A write the crash interrupted (see the module docs).
    TornTail(RecordError),
    /// Damage in the middle, cut because `truncate_corrupt` was set.
    Corrupt(RecordError),
    /// A segment whose header was never completely written (a crash while creating it).
    TornSegmentHeader(FileHeaderError),
    /// A segment with a damaged header, dropped with everything after it (`truncate_corrupt`).
    CorruptSegmentHeader(FileHeaderError),
    /// A whole segment after a cut, deleted (`truncate_corrupt`).
    AfterCut,
}

/// A part of the log dropped at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub file: PathBuf,
    /// Where the file was cut (it keeps the bytes before).
    pub offset: u64,
    pub bytes_dropped: u64,
    /// Whole, valid records among the dropped bytes (found by scanning past the damage).
    pub records_dropped: u64,
    /// The LSN the first dropped record had or should have had.
    pub first_lsn_dropped: Lsn,
    pub reason: CutReason,
}

/// A snapshot that did not load and was skipped.
#[derive(Debug)]
pub struct SkippedSnapshot {
    pub path: PathBuf,
    pub error: DurableError,
}

/// A transaction prepared here and neither committed nor aborted: cooperative termination
/// must decide it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InDoubt {
    pub ts: Timestamp,
    /// Its keys on this server.
    pub keys: Vec<Key>,
    /// Its whole write set (whom to ask).
    pub write_set: WriteSet,
}

/// What opening a data directory found and did.
#[derive(Debug, Default)]
pub struct RecoveryReport {
    pub snapshot: Option<LoadedSnapshot>,
    pub skipped_snapshots: Vec<SkippedSnapshot>,
    /// Leftovers of snapshots a crash interrupted, deleted.
    pub removed_temporaries: Vec<PathBuf>,
    /// Records applied to the store.
    pub records_replayed: u64,
    /// Records read and skipped because the snapshot covers them.
    pub records_covered: u64,
    /// PREPAREs and PUTs the store refused because their transaction was aborted here (as it
    /// did live, or because the snapshot already holds the ABORT that follows them in the log).
    pub records_refused: u64,
    pub cuts: Vec<Cut>,
    /// Damage in records the snapshot covers, skipped over (file, offset, LSN).
    pub covered_damage: Vec<(PathBuf, u64, Lsn)>,
    /// The last LSN the directory holds (snapshot or log); the log resumes after it.
    pub last_lsn: Lsn,
    /// The epoch of the last record (or of the snapshot).
    pub last_epoch: u64,
    pub in_doubt: Vec<InDoubt>,
    /// Time spent replaying the log (the snapshot's load time is in `snapshot`).
    pub replay_ms: u64,
}

impl std::fmt::Display for CutReason {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutReason::TornTail(cause) => write!(formatter, "torn write at the tail, never fsynced: {cause}"),
            CutReason::Corrupt(cause) => write!(formatter, "damage in the middle, cut as asked: {cause}"),
            CutReason::TornSegmentHeader(cause) => {
                write!(formatter, "segment header never completely written: {cause}")
            }
            CutReason::CorruptSegmentHeader(cause) => {
                write!(formatter, "damaged segment header, cut as asked: {cause}")
            }
            CutReason::AfterCut => formatter.write_str("a later segment, after the cut"),
        }
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} cut at byte offset {}: {} bytes and {} whole records dropped, from LSN {} ({})",
            self.file.display(),
            self.offset,
            self.bytes_dropped,
            self.records_dropped,
            self.first_lsn_dropped,
            self.reason
        )
    }
}

/// What a start found, as a server prints it: one line, then one line per cut, skipped
/// snapshot, damage skipped and leftover removed.
impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.snapshot {
            Some(loaded) => write!(
                formatter,
                "snapshot {} (LSN {}, {} keys, {} versions) loaded in {} ms; ",
                loaded.path.display(),
                loaded.lsn,
                loaded.counts.keys,
                loaded.counts.versions,
                loaded.duration_ms
            )?,
            None => formatter.write_str("no snapshot; ")?,
        }
        write!(
            formatter,
            "{} log records replayed in {} ms ({} covered by the snapshot, {} of aborted transactions refused); \
             {} transactions in doubt; the log resumes after LSN {}",
            self.records_replayed,
            self.replay_ms,
            self.records_covered,
            self.records_refused,
            self.in_doubt.len(),
            self.last_lsn
        )?;
        for cut in &self.cuts {
            write!(formatter, "\n  {cut}")?;
        }
        for skipped in &self.skipped_snapshots {
            write!(formatter, "\n  snapshot {} skipped: {}", skipped.path.display(), skipped.error)?;
        }
        for (file, offset, lsn) in &self.covered_damage {
            write!(
                formatter,
                "\n  {} damaged at byte offset {offset} (LSN {lsn}), covered by the snapshot: skipped",
                file.display()
            )?;
        }
        for path in &self.removed_temporaries {
            write!(formatter, "\n  {} (an interrupted snapshot) removed", path.display())?;
        }
        Ok(())
    }
}

/// Opens (creating if needed) the data directory `dir`: takes its lock, recovers its contents
/// into `store` (which must be empty), and starts the log after the last record found.
///
/// # Errors
/// `Locked` when another process (or another `Log` of this one) holds the directory; I/O
/// errors; corruption (see the module docs) unless `truncate_corrupt`; `StoreNotEmpty`. After
/// an error `store` may hold part of what was read: discard it (or `Store::clear` it).
pub fn open(dir: &Path, options: &OpenOptions, store: &Store) -> Result<(Log, RecoveryReport), DurableError> {
    let stats = store.stats();
    if stats.keys != 0 || stats.pending_transactions != 0 || !store.aborted_transactions().is_empty() {
        return Err(DurableError::StoreNotEmpty);
    }
    std::fs::create_dir_all(dir).map_err(DurableError::io("create", dir))?;
    let lock = DirLock::acquire(dir)?;
    let listing = list(dir)?;
    let mut report = RecoveryReport::default();
    for path in listing.temporaries {
        std::fs::remove_file(&path).map_err(DurableError::io("remove", &path))?;
        report.removed_temporaries.push(path);
    }
    // Zeros, or records a snapshot covers: not worth a line of the report.
    for path in listing.prepared_segment.into_iter().chain(listing.recycled_segment) {
        std::fs::remove_file(&path).map_err(DurableError::io("remove", &path))?;
    }
    for (_, path) in listing.snapshots.iter().rev() {
        match snapshot::load(path, store, options.now_ms) {
            Ok(loaded) => {
                report.snapshot = Some(loaded);
                break;
            }
            Err(error) => {
                store.clear();
                report.skipped_snapshots.push(SkippedSnapshot { path: path.clone(), error });
            }
        }
    }
    let covered_lsn = report.snapshot.as_ref().map_or(0, |loaded| loaded.lsn);
    report.last_epoch = report.snapshot.as_ref().map_or(0, |loaded| loaded.epoch);
    let started = Instant::now();
    let mut replay =
        Replay { store, options, covered_lsn, last_lsn: 0, report: &mut report, segments: &listing.segments };
    replay.run()?;
    let last_lsn = replay.last_lsn.max(covered_lsn);
    report.replay_ms = started.elapsed().as_millis() as u64;
    report.last_lsn = last_lsn;
    report.in_doubt = store
        .stale_pending(u64::MAX)
        .into_iter()
        .map(|(ts, pending)| InDoubt { ts, keys: pending.keys, write_set: pending.write_set })
        .collect();
    // A segment already named for the next LSN holds no record (or it would be past it).
    let next_segment = segment_path(dir, last_lsn + 1);
    if next_segment.exists() {
        std::fs::remove_file(&next_segment).map_err(DurableError::io("remove", &next_segment))?;
    }
    let start = Start {
        dir: dir.to_path_buf(),
        policy: options.policy,
        segment_bytes_target: options.segment_bytes_target,
        waiting_bytes_max: options.waiting_bytes_max,
        next_lsn: last_lsn + 1,
        epoch: report.last_epoch,
        lock,
    };
    Ok((Log::start(start)?, report))
}

/// Moves every file of the data directory `dir` but its lock into its subdirectory `aside`
/// (replacing what an earlier call left there), under the directory's lock: a server that must
/// not use its store any more keeps it for inspection. Returns how many files were moved.
///
/// # Errors
/// `Locked` (a running server uses `dir`: nothing is moved); I/O errors.
pub fn set_aside(dir: &Path, aside: &str) -> Result<usize, DurableError> {
    if !dir.exists() {
        return Ok(0);
    }
    let _lock = DirLock::acquire(dir)?;
    let entries = std::fs::read_dir(dir).map_err(DurableError::io("list", dir))?;
    let files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && path.file_name().is_some_and(|name| name != crate::files::LOCK_FILE))
        .collect();
    if files.is_empty() {
        return Ok(0);
    }
    let target = dir.join(aside);
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(DurableError::io("remove", &target))?;
    }
    std::fs::create_dir_all(&target).map_err(DurableError::io("create", &target))?;
    for path in &files {
        let name = path.file_name().unwrap_or_default();
        std::fs::rename(path, target.join(name)).map_err(DurableError::io("move", path))?;
    }
    crate::files::sync_dir(dir)?;
    Ok(files.len())
}

/// Creates the data directory `dir` (which must hold no log and no snapshot) for `store`, whose
/// contents already stand for every record up to `lsn` (of epoch `epoch`): writes a snapshot
/// of it at `lsn`, then starts the log at `lsn + 1`. What a replication backup does with a copy
/// it received as a snapshot (or starts empty, `lsn` 0): its log then numbers records as its
/// primary does, and a restart finds the copy at the last record it holds.
///
/// # Errors
/// `Locked`, I/O errors; `DirectoryNotEmpty` when `dir` holds a log or a snapshot.
pub fn create_at(dir: &Path, options: &OpenOptions, store: &Store, lsn: Lsn, epoch: u64) -> Result<Log, DurableError> {
    std::fs::create_dir_all(dir).map_err(DurableError::io("create", dir))?;
    let lock = DirLock::acquire(dir)?;
    let listing = list(dir)?;
    if !listing.segments.is_empty() || !listing.snapshots.is_empty() {
        return Err(DurableError::DirectoryNotEmpty { dir: dir.to_path_buf() });
    }
    // Old records of another log: never to be written over by this one (their LSNs are not
    // below this log's).
    for path in listing.prepared_segment.into_iter().chain(listing.recycled_segment) {
        std::fs::remove_file(&path).map_err(DurableError::io("remove", &path))?;
    }
    snapshot::write(dir, store, lsn, epoch)?;
    let start = Start {
        dir: dir.to_path_buf(),
        policy: options.policy,
        segment_bytes_target: options.segment_bytes_target,
        waiting_bytes_max: options.waiting_bytes_max,
        next_lsn: lsn + 1,
        epoch,
        lock,
    };
    Log::start(start)
}

/// Applies one record to `store` with the store's own operations, as it was applied when
/// first made: recovery replays the log with it, and a replication backup applies the records
/// its primary ships. `now_ms` dates what it stores (the store's clock).
///
/// # Errors
/// What the store refuses: `StoreError::Aborted` for a PREPARE or PUT of a transaction the
/// store knows aborted (refused when first applied too: not damage), anything else means the
/// record cannot be what the writer's store took.
pub fn apply_record(store: &Store, record: Record, now_ms: u64) -> Result<(), StoreError> {
    match record {
        Record::Prepare { ts, metadata, write_set, writes } => {
            store.prepare_writes(ts, metadata, write_set, writes, now_ms)
        }
        Record::Commit { ts } => {
            store.commit(ts);
            Ok(())
        }
        Record::Abort { ts } => {
            store.abort(ts, now_ms);
            Ok(())
        }
        Record::Put { ts, writes } => store.put_keeping(ts, writes, now_ms, None),
    }
}

/// Replay of the segments into the store.
struct Replay<'a> {
    store: &'a Store,
    options: &'a OpenOptions,
    covered_lsn: Lsn,
    /// The last LSN read from the log (0: none yet).
    last_lsn: Lsn,
    report: &'a mut RecoveryReport,
    segments: &'a [(Lsn, PathBuf)],
}

/// How reading a segment ended.
enum SegmentEnd {
    /// Read to its end; go on with the next.
    Complete,
    /// The log was cut here; later segments (if any) were dealt with; stop.
    Cut,
}

impl Replay<'_> {
    fn run(&mut self) -> Result<(), DurableError> {
        for index in 0..self.segments.len() {
            if let SegmentEnd::Cut = self.segment(index)? {
                return Ok(());
            }
        }
        Ok(())
    }

    fn is_last(&self, index: usize) -> bool {
        index + 1 == self.segments.len()
    }

    fn segment(&mut self, index: usize) -> Result<SegmentEnd, DurableError> {
        let segments = self.segments;
        let (name_lsn, path) = &segments[index];
        let bytes = std::fs::read(path).map_err(DurableError::io("read", path))?;
        let header = match FileHeader::decode(&bytes, SEGMENT_MAGIC) {
            Ok(header) if header.lsn == *name_lsn => header,
            Ok(header) => {
                let cause = FileHeaderError::NameMismatch { in_header: header.lsn, in_name: *name_lsn };
                return self.bad_header(index, cause, bytes.len() as u64);
            }
            Err(cause) => return self.bad_header(index, cause, bytes.len() as u64),
        };
        self.check_continuity(header.lsn, path)?;
        let mut expected = header.lsn;
        let mut offset = FILE_HEADER_BYTES;
        while offset < bytes.len() {
            let frame = match check_frame(&bytes[offset..]) {
                Ok(frame) => frame,
                Err(_) if self.zero_tail(index, &bytes, offset, expected)? => return Ok(SegmentEnd::Complete),
                Err(_) if self.stale_tail(index, &bytes, offset, header.lsn, expected, false)? => {
                    return Ok(SegmentEnd::Complete)
                }
                Err(cause) => match self.damage(index, &bytes, offset, expected, cause)? {
                    Some((resume_offset, resume_lsn)) => {
                        (offset, expected) = (resume_offset, resume_lsn);
                        continue;
                    }
                    None => return Ok(SegmentEnd::Cut),
                },
            };
            if frame.header.lsn < header.lsn && self.stale_tail(index, &bytes, offset, header.lsn, expected, true)? {
                return Ok(SegmentEnd::Complete);
            }
            if frame.header.lsn != expected {
                let error = DurableError::LsnOutOfOrder {
                    file: path.clone(),
                    offset: offset as u64,
                    expected,
                    found: frame.header.lsn,
                };
                return self.corrupt(index, &bytes, offset, expected, error, RecordError::Invalid("LSN out of order"));
            }
            if let Err(error) = self.apply(&frame, path, offset as u64) {
                let cause = match &error {
                    DurableError::CorruptLog { cause, .. } => cause.clone(),
                    _ => RecordError::Invalid("a record the store refuses"),
                };
                return self.corrupt(index, &bytes, offset, expected, error, cause);
            }
            self.last_lsn = expected;
            self.report.last_epoch = frame.header.epoch;
            expected += 1;
            offset += frame.len();
        }
        Ok(SegmentEnd::Complete)
    }

    /// Whether the segment ends at `offset` with the zeros it was filled with before it took
    /// records (the log writes over them): nothing but zero bytes follow, and the log goes on
    /// at `expected` (this is the last segment, or the next one starts there). The last
    /// segment's zeros are cut (they are not records: nothing reported), so that it is exactly
    /// its records, as one closed cleanly. Anything else is damage.
    fn zero_tail(&mut self, index: usize, bytes: &[u8], offset: usize, expected: Lsn) -> Result<bool, DurableError> {
        if bytes[offset..].iter().any(|&byte| byte != 0) {
            return Ok(false);
        }
        self.ends_at(index, offset, expected)
    }

    /// For a segment whose records end at `offset`: whether the log goes on at `expected`
    /// (the next segment starts there), or, for the last segment, true once what follows
    /// `offset` is cut from the file (not records: nothing reported).
    fn ends_at(&mut self, index: usize, offset: usize, expected: Lsn) -> Result<bool, DurableError> {
        if !self.is_last(index) {
            return Ok(self.segments[index + 1].0 == expected);
        }
        truncate(&self.segments[index].1, offset as u64)?;
        Ok(true)
    }

    /// Whether the segment ends at `offset` with bytes the writer never wrote there (a recycled
    /// segment's older records: the log writes over them), as [`Replay::zero_tail`] for zeros:
    /// no whole record at or past `expected` follows in the segment (else a hole before one is
    /// damage or a torn write, decided as before), and
    /// - the next segment starts at `expected`: the writer moved on to it after LSN
    ///   `expected - 1`, so nothing after that record here was written by it; or
    /// - this is the last segment, the bytes at `offset` are not a record the writer began (its
    ///   header would carry `expected`: a torn write, cut and reported as before), and a whole
    ///   record with an LSN below `first_lsn`, the segment's first, lies after `offset`: no
    ///   record written into this segment has one (LSNs only grow), so it is an older
    ///   segment's. The older bytes are cut without a report. Without such a record (the
    ///   writer stopped inside an older record's bytes) they are cut as a torn tail is, and
    ///   reported (no record of this log is in them).
    ///
    /// `older_at_offset`: the bytes at `offset` are a whole record older than the segment.
    fn stale_tail(
        &mut self,
        index: usize,
        bytes: &[u8],
        offset: usize,
        first_lsn: Lsn,
        expected: Lsn,
        older_at_offset: bool,
    ) -> Result<bool, DurableError> {
        let after = scan_after(bytes, offset, expected);
        if after.records > 0 {
            return Ok(false);
        }
        if self.is_last(index) {
            let begun = header_lsn(&bytes[offset..]).is_none_or(|lsn| lsn == expected);
            let older = older_at_offset || after.lowest_older_lsn.is_some_and(|lsn| lsn < first_lsn);
            if begun || !older {
                return Ok(false);
            }
        }
        self.ends_at(index, offset, expected)
    }

    /// A segment starting at `first_lsn` must continue the log, or jump only over LSNs the
    /// snapshot covers.
    fn check_continuity(&self, first_lsn: Lsn, path: &Path) -> Result<(), DurableError> {
        let next = self.last_lsn + 1;
        if first_lsn < next && self.last_lsn > 0 {
            return Err(DurableError::LsnOutOfOrder { file: path.into(), offset: 0, expected: next, found: first_lsn });
        }
        if first_lsn > next && first_lsn > self.covered_lsn + 1 {
            let first = next.max(self.covered_lsn + 1);
            return Err(DurableError::MissingRecords { first, last: first_lsn - 1, file: path.into() });
        }
        Ok(())
    }

    /// Applies a checked frame with the store's own operations.
    fn apply(&mut self, frame: &Frame<'_>, path: &Path, offset: u64) -> Result<(), DurableError> {
        let lsn = frame.header.lsn;
        let record =
            frame.record().map_err(|cause| DurableError::CorruptLog { file: path.into(), offset, lsn, cause })?;
        if lsn <= self.covered_lsn {
            self.report.records_covered += 1;
            return Ok(());
        }
        match apply_record(self.store, record, self.options.now_ms) {
            Ok(()) => self.report.records_replayed += 1,
            Err(StoreError::Aborted { .. }) => self.report.records_refused += 1,
            Err(cause) => return Err(DurableError::ReplayRefused { file: path.into(), offset, lsn, cause }),
        }
        Ok(())
    }

    /// Damage at `offset` (the record that should have had LSN `expected`): skip it when the
    /// snapshot covers it (returns where to resume), cut a torn tail, or treat it as
    /// corruption.
    fn damage(
        &mut self,
        index: usize,
        bytes: &[u8],
        offset: usize,
        expected: Lsn,
        cause: RecordError,
    ) -> Result<Option<(usize, Lsn)>, DurableError> {
        let after = scan_after(bytes, offset, expected);
        let segments = self.segments;
        let path = &segments[index].1;
        if expected <= self.covered_lsn {
            let resume = after.first.filter(|&(_, lsn)| lsn <= self.covered_lsn + 1);
            let next_segment_covered =
                self.segments.get(index + 1).is_some_and(|(first_lsn, _)| *first_lsn <= self.covered_lsn + 1);
            if resume.is_some() || (after.first.is_none() && next_segment_covered) {
                self.report.covered_damage.push((path.clone(), offset as u64, expected));
                // Without a valid record after it, resume at the end (the next segment goes on).
                let resume = resume.unwrap_or((bytes.len(), expected));
                self.last_lsn = resume.1 - 1;
                return Ok(Some(resume));
            }
        }
        if !self.vouched_after(index, &after, expected) {
            self.cut(index, bytes.len() as u64, offset as u64, after.records, expected, CutReason::TornTail(cause))?;
            self.drop_later_segments(index)?;
            return Ok(None);
        }
        let error =
            DurableError::CorruptLog { file: path.clone(), offset: offset as u64, lsn: expected, cause: cause.clone() };
        self.corrupt(index, bytes, offset, expected, error, cause).map(|_| None)
    }

    /// Whether a valid record after damage at LSN `expected` (later in segment `index`, whose
    /// scan is `after`, or in a later segment) was written once that LSN had been fsynced: then
    /// the damaged bytes had reached the disk whole, and the damage is not a torn write.
    fn vouched_after(&self, index: usize, after: &After, expected: Lsn) -> bool {
        let vouches = |synced: Option<Lsn>| synced.is_some_and(|synced| synced >= expected);
        if vouches(after.max_synced_lsn) {
            return true;
        }
        self.segments[index + 1..].iter().any(|(_, path)| {
            // An unreadable later segment vouches for nothing; reading it again for the cut
            // reports its error.
            let later = std::fs::read(path).unwrap_or_default();
            later.len() > FILE_HEADER_BYTES
                && vouches(scan_after(&later, FILE_HEADER_BYTES - 1, expected).max_synced_lsn)
        })
    }

    /// Corruption at `offset`: `error`, or with `truncate_corrupt` a cut there and the removal
    /// of every later segment.
    fn corrupt(
        &mut self,
        index: usize,
        bytes: &[u8],
        offset: usize,
        expected: Lsn,
        error: DurableError,
        cause: RecordError,
    ) -> Result<SegmentEnd, DurableError> {
        if !self.options.truncate_corrupt {
            return Err(error);
        }
        let records = scan_after(bytes, offset, expected).records;
        self.cut(index, bytes.len() as u64, offset as u64, records, expected, CutReason::Corrupt(cause))?;
        self.drop_later_segments(index)?;
        Ok(SegmentEnd::Cut)
    }

    /// A segment whose header does not check: a torn creation when it is the last one and
    /// holds nothing more than a header's worth of bytes (removed), else corruption.
    fn bad_header(&mut self, index: usize, cause: FileHeaderError, length: u64) -> Result<SegmentEnd, DurableError> {
        let path = self.segments[index].1.clone();
        let first_lsn_dropped = self.last_lsn.max(self.covered_lsn) + 1;
        let torn = self.is_last(index) && length <= FILE_HEADER_BYTES as u64;
        if !torn && !self.options.truncate_corrupt {
            return Err(DurableError::BadSegmentHeader { file: path, cause });
        }
        std::fs::remove_file(&path).map_err(DurableError::io("remove", &path))?;
        let reason = if torn { CutReason::TornSegmentHeader(cause) } else { CutReason::CorruptSegmentHeader(cause) };
        let cut = Cut { file: path, offset: 0, bytes_dropped: length, records_dropped: 0, first_lsn_dropped, reason };
        self.report.cuts.push(cut);
        self.drop_later_segments(index)?;
        Ok(SegmentEnd::Cut)
    }

    /// Truncates segment `index` at `offset` (fsynced) and reports the cut.
    fn cut(
        &mut self,
        index: usize,
        length: u64,
        offset: u64,
        records_dropped: u64,
        first_lsn_dropped: Lsn,
        reason: CutReason,
    ) -> Result<(), DurableError> {
        let segments = self.segments;
        let path = &segments[index].1;
        truncate(path, offset)?;
        let bytes_dropped = length - offset;
        let cut = Cut { file: path.clone(), offset, bytes_dropped, records_dropped, first_lsn_dropped, reason };
        self.report.cuts.push(cut);
        Ok(())
    }

    fn drop_later_segments(&mut self, index: usize) -> Result<(), DurableError> {
        let segments = self.segments;
        for (first_lsn, path) in &segments[index + 1..] {
            let bytes = std::fs::read(path).map_err(DurableError::io("read", path))?;
            // From its first LSN on: a recycled segment's older records are not counted.
            let (length, records) = (bytes.len() as u64, scan_after(&bytes, FILE_HEADER_BYTES - 1, *first_lsn).records);
            std::fs::remove_file(path).map_err(DurableError::io("remove", path))?;
            let first_lsn_dropped = *first_lsn;
            let cut = Cut {
                file: path.clone(),
                offset: 0,
                bytes_dropped: length,
                records_dropped: records,
                first_lsn_dropped,
                reason: CutReason::AfterCut,
            };
            self.report.cuts.push(cut);
        }
        Ok(())
    }
}

/// Valid records found after damage in a segment.
#[derive(Debug, Default)]
struct After {
    records: u64,
    /// The highest `synced_lsn` among them.
    max_synced_lsn: Option<Lsn>,
    /// The first one: offset and LSN.
    first: Option<(usize, Lsn)>,
    /// The lowest LSN of the valid records passed over for being below `expected` (a recycled
    /// segment's older records).
    lowest_older_lsn: Option<Lsn>,
}

/// Cuts the file at `path` to `length` bytes, fsynced.
fn truncate(path: &Path, length: u64) -> Result<(), DurableError> {
    let file = File::options().write(true).open(path).map_err(DurableError::io("open", path))?;
    file.set_len(length).and_then(|()| file.sync_all()).map_err(DurableError::io("truncate", path))
}

/// Scans `bytes` after damage at `offset` for valid records with an LSN at least `expected`
/// (noting the lowest LSN of the valid ones below it): byte by byte until one checks, then
/// record by record (a value that happens to hold a record's bytes is inside a record already
/// checked, so it is never taken for one).
fn scan_after(bytes: &[u8], offset: usize, expected: Lsn) -> After {
    let mut after = After::default();
    let mut position = offset + 1;
    while position < bytes.len() {
        // A record's first 4 bytes (its payload length, at least 8) are never all zero: skip a
        // run of zeros (a allocated segment's tail) at once.
        if bytes[position..].starts_with(&[0; 4]) {
            match bytes[position..].iter().position(|&byte| byte != 0) {
                Some(nonzero) => position = (position + nonzero).saturating_sub(3).max(position + 1),
                None => break,
            }
            continue;
        }
        match check_frame(&bytes[position..]) {
            Ok(frame) if frame.header.lsn >= expected => {
                after.records += 1;
                after.max_synced_lsn = after.max_synced_lsn.max(Some(frame.header.synced_lsn));
                after.first.get_or_insert((position, frame.header.lsn));
                position += frame.len();
            }
            Ok(frame) => {
                let lsn = frame.header.lsn;
                after.lowest_older_lsn = Some(after.lowest_older_lsn.map_or(lsn, |lowest| lowest.min(lsn)));
                position += 1;
            }
            Err(_) => position += 1,
        }
    }
    after
}

#[cfg(test)]
mod tests;
