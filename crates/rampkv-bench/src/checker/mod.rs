//! The read-atomicity checker: finds, in a recorded history, the reads that RAMP forbids.
//!
//! # Contract
//! Input: a history (see [`crate::history`] and `docs/history.md`). Only reads with `ok: true`
//! are checked. Every write record, ok or not, is a version a read may legitimately return: a
//! client that died after preparing or committing some keys is logged with `ok: false`, and
//! cooperative termination may still commit its versions.
//!
//! Output: a [`Report`] that counts every finding and keeps up to [`EXAMPLES_PER_CLASS_MAX`]
//! examples per class, each naming the transactions involved.
//! - **garbage**: a read returned, on key `k`, a timestamp `t > 0` that no write with `k` in its
//!   write set has; or the value's own timestamp (`value_ts[k]`, check mode) differs from
//!   `reads[k]`; or two write records share a timestamp (timestamps must be unique, or "the
//!   version with ts t" means nothing).
//! - **fractured**: a read returned `k` at `t_k` from write `W` (ts `t_k`), `W` also wrote `k'`,
//!   and the read returned `k'` at a timestamp older than `t_k`. Counted once per (read, `k'`):
//!   the witness kept is the newest such `W`, which is exactly RAMP's `req[k']`.
//! - **stale** (not an anomaly, counted apart): an ok write of `k` finished before the read
//!   started and is newer than what the read returned for `k`. RAMP promises read atomicity,
//!   not freshness across clients, so this only measures how fresh reads were.
//!
//! Beside the findings, the report carries the [`Evidence`] the history offers (how many reads
//! overlapped writes of their keys, how many raced a write at the servers and were repaired)
//! and a [`Verdict`]: violated, not checkable, clean, or inconclusive when the history shows
//! too little concurrency to prove anything (see [`verdict`]). [`Report::is_clean`] means only
//! "no garbage and no fractured read"; [`Report::verdict`] says whether that is evidence. The
//! checker never panics, even on records that break [`Record::validate`] (built in code rather
//! than read from a file).
//!
//! # Cost
//! Writes are indexed by timestamp in a hash map, and per key sorted by `end_ns` with a running
//! maximum of `ts`, so each stale check is one binary search, and per key as intervals sorted by
//! start in an implicit tree of latest ends (`overlap.rs`), so finding the writes a read
//! overlapped costs O(log n) per key plus the overlaps found. A read of `n` keys costs the sizes
//! of the writes it read from (twice when it recorded round 1), summed over its keys: total work
//! is O(sum of transaction sizes squared), memory O(writes). [`check_file`] streams the file
//! twice (writes, then reads) so the reads, most of a typical history, are never all held in
//! memory.

mod overlap;
pub mod verdict;

pub use verdict::{Evidence, Verdict, EXIT_CLEAN, EXIT_INCONCLUSIVE, EXIT_VIOLATED, RACES_MIN};

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::history::{self, HistoryError, ReadRecord, Record, WriteRecord, TIMESTAMP_INITIAL, VALUE_TS_CORRUPT};
use crate::limits::CHECKER_TIME_OVERLAPS_SCAN_MAX;
use overlap::{Interval, OverlapIndex};

/// Examples kept per class of finding; findings beyond this are counted, not kept, so a report
/// stays small however broken the history is.
pub const EXAMPLES_PER_CLASS_MAX: usize = 20;

/// Where a record sits in its history.
#[derive(Debug, Clone, Copy)]
struct Location {
    record_index: usize,
    line: Option<u64>,
}

/// Whether a referenced transaction was a read or a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransactionKind {
    Read,
    Write,
}

/// A transaction named in a finding: enough to find its line and see what it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionRef {
    pub kind: TransactionKind,
    /// 0-based position among the records of the history (empty lines not counted).
    pub record_index: usize,
    /// 1-based line in the history file; known only for [`check_file`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    pub client: u64,
    /// The write's timestamp; `None` for reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<u64>,
    pub keys: Vec<String>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ok: bool,
}

impl TransactionRef {
    fn of_write(location: Location, write: &WriteRecord) -> Self {
        Self {
            kind: TransactionKind::Write,
            record_index: location.record_index,
            line: location.line,
            client: write.client,
            ts: Some(write.ts),
            keys: write.keys.clone(),
            start_ns: write.start_ns,
            end_ns: write.end_ns,
            ok: write.ok,
        }
    }

    fn of_read(location: Location, read: &ReadRecord) -> Self {
        Self {
            kind: TransactionKind::Read,
            record_index: location.record_index,
            line: location.line,
            client: read.client,
            ts: None,
            keys: read.keys.clone(),
            start_ns: read.start_ns,
            end_ns: read.end_ns,
            ok: read.ok,
        }
    }
}

impl fmt::Display for TransactionRef {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ts {
            Some(ts) => write!(formatter, "write ts {ts} by client {}", self.client)?,
            None => write!(formatter, "read by client {}", self.client)?,
        }
        if !self.ok {
            write!(formatter, " (not ok)")?;
        }
        write!(formatter, " [record {}", self.record_index)?;
        if let Some(line) = self.line {
            write!(formatter, ", line {line}")?;
        }
        write!(formatter, ", {}..{} ns]", self.start_ns, self.end_ns)
    }
}

/// A garbage finding: a read of a version that does not exist, or a value that is not the
/// version's, or a timestamp that names two versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum GarbageExample {
    /// The read returned `key` at `ts`, and no write has `ts`.
    UnknownVersion { read: TransactionRef, key: String, ts: u64 },
    /// The read returned `key` at `ts`; the write with `ts` exists but did not write `key`.
    KeyNotWritten { read: TransactionRef, writer: TransactionRef, key: String, ts: u64 },
    /// The read returned `key` at `ts`, but the value bytes carry `value_ts` (torn, misplaced,
    /// or [`VALUE_TS_CORRUPT`] when they failed verification).
    ValueMismatch { read: TransactionRef, key: String, ts: u64, value_ts: u64 },
    /// Two write records share `ts`; the first is the one reads are checked against.
    DuplicateWriteTimestamp { ts: u64, first: TransactionRef, second: TransactionRef },
}

impl fmt::Display for GarbageExample {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GarbageExample::UnknownVersion { read, key, ts } => {
                write!(formatter, "{read} returned {key:?} at ts {ts}, which no write has")
            }
            GarbageExample::KeyNotWritten { read, writer, key, ts } => {
                write!(formatter, "{read} returned {key:?} at ts {ts}, but {writer} did not write {key:?}")
            }
            GarbageExample::ValueMismatch { read, key, ts, value_ts } if *value_ts == VALUE_TS_CORRUPT => {
                write!(formatter, "{read} returned {key:?} at ts {ts}, but the value failed verification (torn)")
            }
            GarbageExample::ValueMismatch { read, key, ts, value_ts } => {
                write!(formatter, "{read} returned {key:?} at ts {ts}, but the value is the one of ts {value_ts}")
            }
            GarbageExample::DuplicateWriteTimestamp { ts, first, second } => {
                write!(formatter, "ts {ts} is used by {first} and by {second}; timestamps must be unique")
            }
        }
    }
}

/// A fractured read: `read` saw `writer`'s write of `key` but missed its write of `sibling_key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FracturedExample {
    pub read: TransactionRef,
    /// The write the read returned `key` from; it also wrote `sibling_key`.
    pub writer: TransactionRef,
    pub key: String,
    /// The timestamp read on `key`: `writer`'s.
    pub key_ts: u64,
    pub sibling_key: String,
    /// The timestamp read on `sibling_key`: older than `key_ts`.
    pub sibling_ts: u64,
}

impl fmt::Display for FracturedExample {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} returned {:?} at ts {} from {}, which also wrote {:?}, but returned {:?} at older ts {}",
            self.read, self.key, self.key_ts, self.writer, self.sibling_key, self.sibling_key, self.sibling_ts
        )
    }
}

/// A stale read: `newer_write` of `key` had finished before `read` started, and is newer than
/// what `read` returned for `key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleExample {
    pub read: TransactionRef,
    pub key: String,
    pub read_ts: u64,
    /// The newest ok write of `key` that finished before `read` started.
    pub newer_write: TransactionRef,
}

impl fmt::Display for StaleExample {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{} returned {:?} at ts {}, though {} had finished before it started",
            self.read, self.key, self.read_ts, self.newer_write
        )
    }
}

/// What the checker found. Counts are complete; example lists hold at most
/// [`EXAMPLES_PER_CLASS_MAX`] each, the first ones met.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// Reads with `ok: true`: the ones checked.
    pub reads_checked: u64,
    /// Reads with `ok: false`: not checked.
    pub reads_not_ok: u64,
    /// Write records, ok or not.
    pub writes: u64,
    /// Write records with `ok: false` (still valid sources for reads).
    pub writes_not_ok: u64,
    /// Garbage findings of every kind, duplicate write timestamps included.
    pub garbage: u64,
    /// Of `garbage`, the write records whose timestamp an earlier record already had.
    pub duplicate_write_timestamps: u64,
    /// Of `garbage`, reads of an unknown version whose timestamp is below every write of the
    /// history: most likely data the cluster held before the run (a history can only be
    /// checked against a cluster that starts empty). Still garbage: the check cannot vouch
    /// for them.
    #[serde(default)]
    pub older_than_history: u64,
    /// Fractured findings, one per (read, missed key).
    pub fractured: u64,
    /// Reads with at least one fractured finding.
    pub fractured_reads: u64,
    /// Stale findings, one per (read, key). Not an anomaly.
    pub stale: u64,
    pub garbage_examples: Vec<GarbageExample>,
    pub fractured_examples: Vec<FracturedExample>,
    pub stale_examples: Vec<StaleExample>,
    /// How much the history exposed its reads to concurrent writes.
    #[serde(default)]
    pub evidence: Evidence,
    /// The verdict: anomalies first, then whether the evidence suffices.
    #[serde(default)]
    pub verdict: Verdict,
    /// The history file's last line was cut (no newline, not a record): a run killed while
    /// writing. It was left out; every whole line was checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_last_line: Option<CutLine>,
}

/// A last line cut short, left out of the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutLine {
    /// Its 1-based line number.
    pub line: u64,
    /// The bytes it had.
    pub bytes: u64,
}

impl Report {
    /// True when no anomaly was found: no garbage and no fractured read. Stale reads do not
    /// count: RAMP does not promise freshness across clients. This says nothing about whether
    /// the history could have shown an anomaly: see [`Report::verdict`].
    pub fn is_clean(&self) -> bool {
        self.garbage == 0 && self.fractured == 0
    }

    /// The verdict (computed when the check ends).
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Decides the verdict from the counts; called once every record was checked.
    fn conclude(&mut self) {
        self.verdict = if self.fractured == 0 && self.garbage > 0 && self.garbage == self.older_than_history {
            Verdict::NotCheckable
        } else if !self.is_clean() {
            Verdict::Violated
        } else if self.evidence.is_sufficient() {
            Verdict::Clean
        } else {
            Verdict::Inconclusive
        };
    }

    fn note_garbage(&mut self, make_example: impl FnOnce() -> GarbageExample) {
        self.garbage += 1;
        keep_example(&mut self.garbage_examples, make_example);
    }

    fn note_fractured(&mut self, make_example: impl FnOnce() -> FracturedExample) {
        self.fractured += 1;
        keep_example(&mut self.fractured_examples, make_example);
    }

    fn note_stale(&mut self, make_example: impl FnOnce() -> StaleExample) {
        self.stale += 1;
        keep_example(&mut self.stale_examples, make_example);
    }
}

/// Builds the example only when it will be kept: building clones keys, which a history with
/// millions of findings must not pay for each one.
fn keep_example<T>(examples: &mut Vec<T>, make_example: impl FnOnce() -> T) {
    if examples.len() < EXAMPLES_PER_CLASS_MAX {
        examples.push(make_example());
    }
}

impl fmt::Display for Report {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let evidence = &self.evidence;
        let summary = format!(
            "{} races repaired, {} reads overlapped a write",
            evidence.repaired_reads, evidence.overlapping_reads
        );
        match self.verdict {
            Verdict::Clean => writeln!(formatter, "read atomicity: clean (no garbage, no fractured reads; {summary})")?,
            Verdict::Inconclusive => writeln!(
                formatter,
                "read atomicity: INCONCLUSIVE (no garbage, no fractured reads, but too little concurrency to \
                 prove anything: {}; {summary})",
                evidence.shortfall()
            )?,
            Verdict::NotCheckable => {
                writeln!(formatter, "read atomicity: NOT CHECKABLE (reads returned versions older than this history)")?
            }
            Verdict::Violated => writeln!(formatter, "read atomicity: VIOLATED")?,
        }
        write_evidence(formatter, evidence)?;
        if let Some(cut) = self.cut_last_line {
            writeln!(
                formatter,
                "  last line {} cut short ({} bytes, no newline; a run killed while writing?): left out, \
                 every whole line checked",
                cut.line, cut.bytes
            )?;
        }
        writeln!(
            formatter,
            "  reads checked: {} ({} failed, not checked); writes: {} ({} failed: may have taken effect)",
            self.reads_checked, self.reads_not_ok, self.writes, self.writes_not_ok
        )?;
        writeln!(
            formatter,
            "  garbage: {} (of which duplicate write timestamps: {})",
            self.garbage, self.duplicate_write_timestamps
        )?;
        if self.older_than_history > 0 {
            writeln!(
                formatter,
                "  of the garbage, {} reads of versions older than every write of this history: the \
                 cluster held data from before it; check a run against a fresh cluster",
                self.older_than_history
            )?;
        }
        writeln!(formatter, "  fractured: {} (in {} reads)", self.fractured, self.fractured_reads)?;
        writeln!(formatter, "  stale: {} (counted only: RAMP promises no freshness across clients)", self.stale)?;
        write_examples(formatter, "garbage", self.garbage, &self.garbage_examples)?;
        write_examples(formatter, "fractured", self.fractured, &self.fractured_examples)?;
        write_examples(formatter, "stale", self.stale, &self.stale_examples)
    }
}

fn write_evidence(formatter: &mut fmt::Formatter<'_>, evidence: &Evidence) -> fmt::Result {
    writeln!(
        formatter,
        "  evidence: {} reads overlapped in time a write of one of their keys by another client, {} of them \
         a write of two or more",
        evidence.overlapping_reads, evidence.contended_reads
    )?;
    if evidence.reads_with_round1 == 0 {
        return writeln!(formatter, "  races: not recorded (no read of this history records its round 1)");
    }
    writeln!(
        formatter,
        "  races: {} reads' round 1 alone was fractured (would have been fractured without RAMP's round 2 or \
         S2PL's lock wait), {} of them repaired; {} of {} reads ran round 2",
        evidence.round1_fractured_reads, evidence.repaired_reads, evidence.round2_reads, evidence.reads_with_round1
    )
}

fn write_examples<T: fmt::Display>(
    formatter: &mut fmt::Formatter<'_>,
    class: &str,
    count: u64,
    examples: &[T],
) -> fmt::Result {
    if examples.is_empty() {
        return Ok(());
    }
    writeln!(formatter, "  {class} examples ({} of {count}):", examples.len())?;
    for example in examples {
        writeln!(formatter, "    - {example}")?;
    }
    Ok(())
}

/// A write record and where it came from.
struct IndexedWrite<'a> {
    location: Location,
    record: &'a WriteRecord,
}

/// One entry of a key's finished-writes list, sorted by `end_ns`. `newest_ts` and
/// `newest_writer` describe the newest write among this entry and all before it.
#[derive(Debug, Clone, Copy)]
struct FinishedWrite {
    end_ns: u64,
    newest_ts: u64,
    newest_writer: usize,
}

/// A key of the read being checked, resolved against the index: the key's id (keys no write
/// wrote have none and cannot be part of a fractured or stale finding), the timestamp read,
/// and the write that timestamp names if that write wrote the key.
#[derive(Debug, Clone, Copy)]
struct ResolvedRead {
    key_id: usize,
    ts: u64,
    writer: Option<usize>,
}

/// A fracture: (the key read too old, the key whose writer also wrote it, that writer).
type Violation = (ResolvedRead, ResolvedRead, usize);

/// Buffers reused from read to read.
#[derive(Default)]
struct Scratch {
    resolved: Vec<ResolvedRead>,
    violations: Vec<Violation>,
    writers: Vec<usize>,
}

/// Every write of a history, indexed for the read checks.
///
/// Keys are interned to dense ids and each write's keys stored as one flat slice of ids: the
/// checks walk the keys of the writes a read returned, and chasing one heap string per key
/// there (cache misses and string compares) was most of the checker's time.
struct WriteIndex<'a> {
    writes: Vec<IndexedWrite<'a>>,
    /// Timestamp to position in `writes` (the first record with that timestamp).
    writer_by_ts: HashMap<u64, usize>,
    key_ids: HashMap<&'a str, usize>,
    /// Key id to key.
    key_names: Vec<&'a str>,
    /// The key ids of write `w` are `written_key_ids[written_key_offsets[w]..written_key_offsets[w + 1]]`.
    written_key_ids: Vec<usize>,
    written_key_offsets: Vec<usize>,
    /// Per key id, its ok writes sorted by `end_ns` with a running newest timestamp.
    finished_by_key: Vec<Vec<FinishedWrite>>,
    /// Per key id, every write as a time interval, to find the writes a read overlapped.
    overlaps: OverlapIndex,
    /// Every write as a time interval (one key, 0).
    all_writes: OverlapIndex,
    /// The smallest timestamp of any write (`u64::MAX` without writes).
    oldest_ts: u64,
}

impl<'a> WriteIndex<'a> {
    /// Indexes `writes`, counting them and noting duplicate timestamps in `report`.
    fn build(writes: Vec<IndexedWrite<'a>>, report: &mut Report) -> Self {
        let writer_by_ts = index_timestamps(&writes, report);
        let mut index = Self {
            writes: Vec::new(),
            writer_by_ts,
            key_ids: HashMap::new(),
            key_names: Vec::new(),
            written_key_ids: Vec::new(),
            written_key_offsets: Vec::with_capacity(writes.len() + 1),
            finished_by_key: Vec::new(),
            overlaps: OverlapIndex::default(),
            all_writes: OverlapIndex::default(),
            oldest_ts: writes.iter().map(|write| write.record.ts).min().unwrap_or(u64::MAX),
        };
        index.written_key_offsets.push(0);
        for write in &writes {
            let record: &'a WriteRecord = write.record;
            for key in &record.keys {
                let key_id = index.intern(key);
                index.written_key_ids.push(key_id);
            }
            index.written_key_offsets.push(index.written_key_ids.len());
        }
        index.writes = writes;
        index.finished_by_key = index.finished_writes_by_key();
        (index.overlaps, index.all_writes) = index.write_intervals();
        index
    }

    /// Per key id, every write (ok or not: a failed write may still have taken effect) as its
    /// time interval, once per write even if it names the key twice; and every write in one
    /// index (key 0 of the second).
    fn write_intervals(&self) -> (OverlapIndex, OverlapIndex) {
        let mut by_key: Vec<Vec<Interval>> = vec![Vec::new(); self.key_names.len()];
        let mut all = Vec::with_capacity(self.writes.len());
        for (writer, write) in self.writes.iter().enumerate() {
            let interval = Interval { start_ns: write.record.start_ns, end_ns: write.record.end_ns, writer };
            all.push(interval);
            for &key_id in self.written_key_ids(writer) {
                if by_key[key_id].last().is_none_or(|last| last.writer != writer) {
                    by_key[key_id].push(interval);
                }
            }
        }
        (OverlapIndex::build(by_key), OverlapIndex::build(vec![all]))
    }

    fn intern(&mut self, key: &'a str) -> usize {
        let next_id = self.key_names.len();
        let key_id = *self.key_ids.entry(key).or_insert(next_id);
        if key_id == next_id {
            self.key_names.push(key);
        }
        key_id
    }

    fn written_key_ids(&self, writer: usize) -> &[usize] {
        &self.written_key_ids[self.written_key_offsets[writer]..self.written_key_offsets[writer + 1]]
    }

    /// Per key id, the ok writes of the key sorted by `end_ns`, each entry carrying the newest
    /// timestamp among the writes that finished no later than it (a running maximum), so that
    /// "the newest write finished before time t" is one binary search.
    fn finished_writes_by_key(&self) -> Vec<Vec<FinishedWrite>> {
        let mut by_key: Vec<Vec<FinishedWrite>> = vec![Vec::new(); self.key_names.len()];
        for (writer, write) in self.writes.iter().enumerate() {
            if !write.record.ok {
                continue;
            }
            for &key_id in self.written_key_ids(writer) {
                by_key[key_id].push(FinishedWrite {
                    end_ns: write.record.end_ns,
                    newest_ts: write.record.ts,
                    newest_writer: writer,
                });
            }
        }
        for finished in &mut by_key {
            finished.sort_unstable_by_key(|entry| entry.end_ns);
            for position in 1..finished.len() {
                let previous = finished[position - 1];
                if previous.newest_ts > finished[position].newest_ts {
                    finished[position].newest_ts = previous.newest_ts;
                    finished[position].newest_writer = previous.newest_writer;
                }
            }
        }
        by_key
    }

    /// Checks one read. `scratch` is reused across reads to spare allocations.
    fn check_read(&self, location: Location, read: &ReadRecord, scratch: &mut Scratch, report: &mut Report) {
        if !read.ok {
            report.reads_not_ok += 1;
            return;
        }
        report.reads_checked += 1;
        check_values(location, read, report);
        self.resolve(location, read, &mut scratch.resolved, report);
        let fractured = self.check_fractured(location, read, &scratch.resolved, &mut scratch.violations, report);
        self.check_stale(location, read, &scratch.resolved, report);
        self.note_overlaps(read, &scratch.resolved, &mut scratch.writers, &mut report.evidence);
        if let Some(round1) = &read.round1 {
            let evidence = &mut report.evidence;
            evidence.reads_with_round1 += 1;
            evidence.round2_reads += u64::from(!read.round2.is_empty());
            self.resolve_round1(read, round1, &mut scratch.resolved);
            if self.find_fractures(&scratch.resolved, &mut scratch.violations) {
                evidence.round1_fractured_reads += 1;
                evidence.repaired_reads += u64::from(!fractured);
            }
        }
    }

    /// Counts the read as overlapping if some write of one of its keys by another client
    /// overlapped it in time, and as contended if one such write wrote two or more of its
    /// keys. `resolved` holds the read's distinct keys (the ones some write wrote), by key id.
    ///
    /// Usually few writes of any key overlap a read in time: then one query of the index of
    /// all writes finds them, and each one's keys are compared with the read's. When more than
    /// [`CHECKER_TIME_OVERLAPS_SCAN_MAX`] do (many clients), one query per key of the read
    /// finds only the writes of its keys. On the checker's synthetic history of a million
    /// records (8 keys per transaction), per-key queries for every read cost about 3 s of CPU,
    /// the one query of all writes about 1 s (2-core machine, under load).
    fn note_overlaps(
        &self,
        read: &ReadRecord,
        resolved: &[ResolvedRead],
        writers: &mut Vec<usize>,
        evidence: &mut Evidence,
    ) {
        writers.clear();
        let few = self.all_writes.visit(0, read.start_ns, read.end_ns, &mut |interval| {
            writers.push(interval.writer);
            writers.len() <= CHECKER_TIME_OVERLAPS_SCAN_MAX
        });
        let (overlapping, contended) = match few {
            true => self.shared_keys_of_writers(read, resolved, writers),
            false => self.overlaps_per_key(read, resolved, writers),
        };
        evidence.overlapping_reads += u64::from(overlapping);
        evidence.contended_reads += u64::from(contended);
    }

    /// (overlapping, contended) from `writers`, the writes that overlapped the read in time.
    fn shared_keys_of_writers(&self, read: &ReadRecord, resolved: &[ResolvedRead], writers: &[usize]) -> (bool, bool) {
        let mut overlapping = false;
        for &writer in writers {
            if self.writes[writer].record.client == read.client {
                continue;
            }
            // Distinct keys of the read this write wrote: a write may name a key twice.
            let mut first_shared = None;
            for &key_id in self.written_key_ids(writer) {
                if resolved.binary_search_by_key(&key_id, |entry| entry.key_id).is_err() {
                    continue;
                }
                match first_shared {
                    None => first_shared = Some(key_id),
                    Some(first) if first != key_id => return (true, true),
                    Some(_) => {}
                }
            }
            overlapping |= first_shared.is_some();
        }
        (overlapping, false)
    }

    /// (overlapping, contended) from one query per key of the read.
    fn overlaps_per_key(&self, read: &ReadRecord, resolved: &[ResolvedRead], writers: &mut Vec<usize>) -> (bool, bool) {
        writers.clear();
        for entry in resolved {
            self.overlaps.visit(entry.key_id, read.start_ns, read.end_ns, &mut |interval| {
                if self.writes[interval.writer].record.client != read.client {
                    writers.push(interval.writer);
                }
                true
            });
        }
        // A key lists a write once (see `write_intervals_by_key`), so a repeat is one write of
        // two of the read's keys.
        writers.sort_unstable();
        (!writers.is_empty(), writers.windows(2).any(|pair| pair[0] == pair[1]))
    }

    /// Resolves round 1's answer into `resolved`, sorted by key id: per distinct key (the first
    /// entry of a key asked for twice), the timestamp and its writer if that write wrote the
    /// key. Versions round 1 got that no write has are not findings (the final answer is what
    /// the read returned); they just cannot witness a fracture.
    fn resolve_round1(&self, read: &ReadRecord, round1: &[u64], resolved: &mut Vec<ResolvedRead>) {
        resolved.clear();
        for (key, &ts) in read.keys.iter().zip(round1) {
            let Some(&key_id) = self.key_ids.get(key.as_str()) else {
                continue;
            };
            let writer = self
                .writer_by_ts
                .get(&ts)
                .copied()
                .filter(|&writer| ts != TIMESTAMP_INITIAL && self.written_key_ids(writer).contains(&key_id));
            resolved.push(ResolvedRead { key_id, ts, writer });
        }
        // A stable sort keeps the first entry of a repeated key first, for dedup to keep it.
        resolved.sort_by_key(|entry| entry.key_id);
        resolved.dedup_by_key(|entry| entry.key_id);
    }

    /// Resolves the read's keys into `resolved`, sorted by key id, noting reads of versions
    /// that do not exist as garbage.
    fn resolve(&self, location: Location, read: &ReadRecord, resolved: &mut Vec<ResolvedRead>, report: &mut Report) {
        resolved.clear();
        for (key, &ts) in &read.reads {
            let key_id = self.key_ids.get(key.as_str()).copied();
            let writer = self.writer_by_ts.get(&ts).copied();
            let wrote_key = match (key_id, writer) {
                (Some(key_id), Some(writer)) => self.written_key_ids(writer).contains(&key_id),
                _ => false,
            };
            if ts != TIMESTAMP_INITIAL && !wrote_key {
                if writer.is_none() && ts < self.oldest_ts {
                    report.older_than_history += 1;
                }
                report.note_garbage(|| self.missing_version(location, read, key, ts, writer));
            }
            if let Some(key_id) = key_id {
                let writer = writer.filter(|_| wrote_key && ts != TIMESTAMP_INITIAL);
                resolved.push(ResolvedRead { key_id, ts, writer });
            }
        }
        resolved.sort_unstable_by_key(|entry| entry.key_id);
    }

    fn missing_version(
        &self,
        location: Location,
        read: &ReadRecord,
        key: &str,
        ts: u64,
        writer: Option<usize>,
    ) -> GarbageExample {
        let read_ref = TransactionRef::of_read(location, read);
        match writer {
            None => GarbageExample::UnknownVersion { read: read_ref, key: key.to_owned(), ts },
            Some(writer) => GarbageExample::KeyNotWritten {
                read: read_ref,
                writer: self.write_ref(writer),
                key: key.to_owned(),
                ts,
            },
        }
    }

    /// Fills `violations` with the (sibling, key, writer) triples where the read returned the
    /// sibling older than the key's writer, which also wrote the sibling; true if any.
    fn find_fractures(&self, resolved: &[ResolvedRead], violations: &mut Vec<Violation>) -> bool {
        violations.clear();
        for entry in resolved {
            let Some(writer) = entry.writer else {
                continue;
            };
            for &sibling_id in self.written_key_ids(writer) {
                let Ok(position) = resolved.binary_search_by_key(&sibling_id, |other| other.key_id) else {
                    continue;
                };
                if resolved[position].ts < entry.ts {
                    violations.push((resolved[position], *entry, writer));
                }
            }
        }
        !violations.is_empty()
    }

    /// Notes the read's fractured findings; true if there were any.
    fn check_fractured(
        &self,
        location: Location,
        read: &ReadRecord,
        resolved: &[ResolvedRead],
        violations: &mut Vec<Violation>,
        report: &mut Report,
    ) -> bool {
        if !self.find_fractures(resolved, violations) {
            return false;
        }
        // One finding per missed key, witnessed by the newest write that required it.
        violations.sort_unstable_by(|(left_sibling, left, _), (right_sibling, right, _)| {
            (left_sibling.key_id.cmp(&right_sibling.key_id)).then(right.ts.cmp(&left.ts))
        });
        violations.dedup_by(|(later, _, _), (earlier, _, _)| later.key_id == earlier.key_id);
        report.fractured_reads += 1;
        for &(sibling, entry, writer) in violations.iter() {
            report.note_fractured(|| FracturedExample {
                read: TransactionRef::of_read(location, read),
                writer: self.write_ref(writer),
                key: self.key_names[entry.key_id].to_owned(),
                key_ts: entry.ts,
                sibling_key: self.key_names[sibling.key_id].to_owned(),
                sibling_ts: sibling.ts,
            });
        }
        true
    }

    fn check_stale(&self, location: Location, read: &ReadRecord, resolved: &[ResolvedRead], report: &mut Report) {
        for entry in resolved {
            let finished = &self.finished_by_key[entry.key_id];
            let finished_count = finished.partition_point(|write| write.end_ns < read.start_ns);
            let Some(newest) = finished[..finished_count].last() else {
                continue;
            };
            if newest.newest_ts > entry.ts {
                report.note_stale(|| StaleExample {
                    read: TransactionRef::of_read(location, read),
                    key: self.key_names[entry.key_id].to_owned(),
                    read_ts: entry.ts,
                    newer_write: self.write_ref(newest.newest_writer),
                });
            }
        }
    }

    fn write_ref(&self, writer: usize) -> TransactionRef {
        let write = &self.writes[writer];
        TransactionRef::of_write(write.location, write.record)
    }
}

/// Maps each timestamp to the first write that has it, counting writes and noting every later
/// write with the same timestamp as garbage.
fn index_timestamps(writes: &[IndexedWrite<'_>], report: &mut Report) -> HashMap<u64, usize> {
    let mut writer_by_ts = HashMap::with_capacity(writes.len());
    for (writer, write) in writes.iter().enumerate() {
        report.writes += 1;
        if !write.record.ok {
            report.writes_not_ok += 1;
        }
        match writer_by_ts.entry(write.record.ts) {
            Entry::Vacant(vacant) => {
                vacant.insert(writer);
            }
            Entry::Occupied(occupied) => {
                let first = &writes[*occupied.get()];
                report.duplicate_write_timestamps += 1;
                report.note_garbage(|| GarbageExample::DuplicateWriteTimestamp {
                    ts: write.record.ts,
                    first: TransactionRef::of_write(first.location, first.record),
                    second: TransactionRef::of_write(write.location, write.record),
                });
            }
        }
    }
    writer_by_ts
}

/// Notes every key whose value carries another timestamp than the version read (check mode).
/// Both maps are sorted by key, so one merge walk compares them.
fn check_values(location: Location, read: &ReadRecord, report: &mut Report) {
    let mut reads = read.reads.iter().peekable();
    for (key, &value_ts) in &read.value_ts {
        while reads.next_if(|(read_key, _)| *read_key < key).is_some() {}
        let Some((_, &ts)) = reads.next_if(|(read_key, _)| *read_key == key) else {
            continue; // No version read for this key: an invalid record, nothing to compare.
        };
        if value_ts != ts {
            report.note_garbage(|| GarbageExample::ValueMismatch {
                read: TransactionRef::of_read(location, read),
                key: key.clone(),
                ts,
                value_ts,
            });
        }
    }
}

/// Checks a history held in memory. Findings name records by their index in `records`.
pub fn check(records: &[Record]) -> Report {
    let location = |record_index| Location { record_index, line: None };
    let writes = records
        .iter()
        .enumerate()
        .filter_map(|(record_index, record)| match record {
            Record::Write(write) => Some(IndexedWrite { location: location(record_index), record: write }),
            Record::Read(_) => None,
        })
        .collect();
    let mut report = Report::default();
    let index = WriteIndex::build(writes, &mut report);
    let mut scratch = Scratch::default();
    for (record_index, record) in records.iter().enumerate() {
        if let Record::Read(read) = record {
            index.check_read(location(record_index), read, &mut scratch, &mut report);
        }
    }
    report.conclude();
    report
}

/// Checks the history file at `path`, streaming it twice: once for the writes, once for the
/// reads. Findings name records by index and line. The file must not change between the passes
/// (check a finished run's history, or the prefix a killed one left).
///
/// A last line without a newline that is not a record was cut short by a writer that died (a
/// killed benchmark): it is left out and named in [`Report::cut_last_line`], and every whole
/// line is checked.
///
/// # Errors
/// The first other [`HistoryError`] met in either pass: a history the checker could not read
/// in full is not one it can vouch for.
pub fn check_file(path: impl AsRef<Path>) -> Result<Report, HistoryError> {
    let path = path.as_ref();
    let mut report = Report::default();
    let mut owned_writes = Vec::new();
    for (record_index, numbered) in history::open_history(path)?.enumerate() {
        let Some(numbered) = whole_line(numbered, &mut report)? else {
            continue;
        };
        if let Record::Write(write) = numbered.record {
            owned_writes.push((located(record_index, numbered.line), write));
        }
    }
    let writes = owned_writes.iter().map(|(location, record)| IndexedWrite { location: *location, record }).collect();
    let index = WriteIndex::build(writes, &mut report);
    let mut scratch = Scratch::default();
    for (record_index, numbered) in history::open_history(path)?.enumerate() {
        let Some(numbered) = whole_line(numbered, &mut report)? else {
            continue;
        };
        if let Record::Read(read) = &numbered.record {
            let location = located(record_index, numbered.line);
            index.check_read(location, read, &mut scratch, &mut report);
        }
    }
    report.conclude();
    Ok(report)
}

/// The record of a whole line; `None` for a cut last line, which is noted in `report`.
fn whole_line(
    numbered: Result<history::NumberedRecord, HistoryError>,
    report: &mut Report,
) -> Result<Option<history::NumberedRecord>, HistoryError> {
    match numbered {
        Ok(numbered) => Ok(Some(numbered)),
        Err(HistoryError::CutLastLine { line, bytes, .. }) => {
            report.cut_last_line = Some(CutLine { line, bytes });
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

fn located(record_index: usize, line: u64) -> Location {
    Location { record_index, line: Some(line) }
}

#[cfg(test)]
mod tests;
