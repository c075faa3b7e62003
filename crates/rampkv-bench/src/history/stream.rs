//! Streaming a history to its file while a run goes on, so that a run killed half-way leaves a
//! checkable prefix.
//!
//! # Contract
//! - Client threads hand over batches of finished records through a [`HistoryFeed`] (a bounded
//!   queue: a full queue makes the sender wait). One writer thread serializes them into the
//!   [`HistorySink`] and flushes the file at least every [`HISTORY_FLUSH_INTERVAL_MS`] while it
//!   has something unflushed, so the file trails the run by about a second at most.
//! - **Reads after their writes.** A read may return a version whose write has not finished
//!   (a write is recorded when it ends, and is visible on some servers before that). The
//!   writer holds such a read back until the write records of all its versions are written, so
//!   that any prefix of the file (what a killed run leaves) names every version its reads
//!   returned, and the checker finds no garbage that is only a cut. A read is held at most
//!   [`HISTORY_READ_HOLD_MS_MAX`] (a write gives up within the transaction timeout and is then
//!   recorded too) and at most [`HISTORY_HELD_READS_MAX`] reads are held; past either bound a
//!   read is written anyway, so a read of a version no write names still reaches the checker.
//! - [`HistoryStream::finish`] writes every held read, flushes and syncs the file, and returns
//!   the records written, in the order written, if asked to keep them (for an in-memory check).
//! - Errors: the first write error stops the writer; senders then find the queue closed and
//!   drop their batches, and [`HistoryStream::finish`] returns the error.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{HistoryError, HistorySink, ReadRecord, Record, TIMESTAMP_INITIAL};
use crate::limits::{
    HISTORY_FLUSH_INTERVAL_MS, HISTORY_HELD_READS_MAX, HISTORY_KNOWN_WRITES_MAX, HISTORY_QUEUE_BATCHES_MAX,
    HISTORY_READ_HOLD_MS_MAX,
};

/// A history file being written by a thread of its own.
#[derive(Debug)]
pub struct HistoryStream {
    path: PathBuf,
    sender: SyncSender<Vec<Record>>,
    writer: JoinHandle<Result<Vec<Record>, HistoryError>>,
}

/// Where a client thread hands its finished records to a [`HistoryStream`].
#[derive(Debug, Clone)]
pub struct HistoryFeed {
    sender: SyncSender<Vec<Record>>,
}

impl HistoryFeed {
    /// A feed whose batches go to `receiver` in memory instead of a file (the benchmark's
    /// evidence probe watches its history this way while it runs). Bounded like a stream's
    /// queue: the receiver must keep draining until every feed is dropped.
    pub fn in_memory() -> (HistoryFeed, Receiver<Vec<Record>>) {
        let (sender, receiver) = mpsc::sync_channel(HISTORY_QUEUE_BATCHES_MAX);
        (HistoryFeed { sender }, receiver)
    }

    /// Hands `batch` to the writer, waiting while its queue is full. Returns false if the
    /// writer has stopped (its error comes from [`HistoryStream::finish`]); the batch is lost.
    pub fn send(&self, batch: Vec<Record>) -> bool {
        batch.is_empty() || self.sender.send(batch).is_ok()
    }
}

impl HistoryStream {
    /// Creates (or truncates) the history file at `path` and starts its writer thread.
    /// With `keep_records`, [`HistoryStream::finish`] returns every record written.
    ///
    /// # Errors
    /// [`HistoryError::Create`] when the file cannot be created, [`HistoryError::Write`] when the
    /// thread cannot be started.
    pub fn start(path: impl AsRef<Path>, keep_records: bool) -> Result<Self, HistoryError> {
        let sink = HistorySink::create(path)?;
        let path = sink.path().to_path_buf();
        let (sender, receiver) = mpsc::sync_channel(HISTORY_QUEUE_BATCHES_MAX);
        let writer = std::thread::Builder::new()
            .name("rampkv-history".into())
            .spawn(move || write_stream(sink, &receiver, keep_records))
            .map_err(|error| HistoryError::Write { path: path.clone(), error })?;
        Ok(Self { path, sender, writer })
    }

    /// A feed for one client thread.
    pub fn feed(&self) -> HistoryFeed {
        HistoryFeed { sender: self.sender.clone() }
    }

    /// Waits until every feed is dropped, writes what is held, flushes and syncs the file;
    /// returns the records written if the stream keeps them (else an empty vector).
    ///
    /// # Errors
    /// The first error writing the file; [`HistoryError::Write`] if the writer thread panicked.
    pub fn finish(self) -> Result<Vec<Record>, HistoryError> {
        drop(self.sender);
        let path = self.path;
        self.writer
            .join()
            .unwrap_or_else(|_| Err(HistoryError::Write { path, error: std::io::Error::other("the writer panicked") }))
    }
}

/// The writer thread: orders, writes and flushes until every sender is gone.
fn write_stream(
    sink: HistorySink,
    receiver: &Receiver<Vec<Record>>,
    keep_records: bool,
) -> Result<Vec<Record>, HistoryError> {
    let flush_interval = Duration::from_millis(HISTORY_FLUSH_INTERVAL_MS);
    let mut order = ReadsAfterWrites::default();
    let mut kept = Vec::new();
    let mut ready = Vec::new();
    let mut last_flush = Instant::now();
    let mut unflushed = false;
    loop {
        let open = match receiver.recv_timeout(flush_interval) {
            Ok(batch) => {
                order.add(batch, Instant::now(), &mut ready);
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        if open {
            order.release_overdue(Instant::now(), &mut ready);
        } else {
            order.release_all(&mut ready);
        }
        if !ready.is_empty() {
            sink.append(&ready)?;
            unflushed = true;
            if keep_records {
                kept.append(&mut ready);
            }
            ready.clear();
        }
        if !open {
            sink.finish()?;
            return Ok(kept);
        }
        if unflushed && last_flush.elapsed() >= flush_interval {
            sink.flush()?;
            (last_flush, unflushed) = (Instant::now(), false);
        }
    }
}

/// Orders records so that a read comes after the write records of the versions it returned.
#[derive(Debug, Default)]
struct ReadsAfterWrites {
    /// Timestamps of the most recent writes written, and the same in arrival order for
    /// forgetting the oldest beyond [`HISTORY_KNOWN_WRITES_MAX`].
    known: HashSet<u64>,
    known_order: VecDeque<u64>,
    /// Reads waiting for a write record, with when they arrived, oldest first.
    held: VecDeque<(Instant, ReadRecord)>,
}

impl ReadsAfterWrites {
    /// Takes a batch: its writes go to `ready` at once, then every read (held or new) whose
    /// versions all have write records.
    fn add(&mut self, batch: Vec<Record>, now: Instant, ready: &mut Vec<Record>) {
        let mut reads = Vec::new();
        for record in batch {
            match record {
                Record::Write(write) => {
                    self.remember(write.ts);
                    ready.push(Record::Write(write));
                }
                Record::Read(read) => reads.push(read),
            }
        }
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            for (arrived, read) in held {
                self.place(read, arrived, ready);
            }
        }
        for read in reads {
            self.place(read, now, ready);
        }
        while self.held.len() > HISTORY_HELD_READS_MAX {
            if let Some((_, read)) = self.held.pop_front() {
                ready.push(Record::Read(read));
            }
        }
    }

    /// Writes reads held longer than [`HISTORY_READ_HOLD_MS_MAX`].
    fn release_overdue(&mut self, now: Instant, ready: &mut Vec<Record>) {
        let hold_max = Duration::from_millis(HISTORY_READ_HOLD_MS_MAX);
        while self.held.front().is_some_and(|(arrived, _)| now.duration_since(*arrived) >= hold_max) {
            if let Some((_, read)) = self.held.pop_front() {
                ready.push(Record::Read(read));
            }
        }
    }

    /// Writes every held read (the run is over: no write record will come).
    fn release_all(&mut self, ready: &mut Vec<Record>) {
        ready.extend(self.held.drain(..).map(|(_, read)| Record::Read(read)));
    }

    fn place(&mut self, read: ReadRecord, arrived: Instant, ready: &mut Vec<Record>) {
        // Failed reads are not checked: nothing to wait for.
        let complete = !read.ok || read.reads.values().all(|ts| *ts == TIMESTAMP_INITIAL || self.known.contains(ts));
        if complete {
            ready.push(Record::Read(read));
        } else {
            self.held.push_back((arrived, read));
        }
    }

    fn remember(&mut self, ts: u64) {
        if self.known.insert(ts) {
            self.known_order.push_back(ts);
        }
        if self.known_order.len() > HISTORY_KNOWN_WRITES_MAX {
            if let Some(oldest) = self.known_order.pop_front() {
                self.known.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::{read_history, WriteRecord};

    fn write(ts: u64) -> Record {
        Record::Write(WriteRecord { client: 1, ts, keys: vec!["a".into()], start_ns: 1, end_ns: 2, ok: true })
    }

    fn read(ts: u64) -> Record {
        Record::Read(ReadRecord {
            client: 2,
            keys: vec!["a".into()],
            reads: BTreeMap::from([("a".to_owned(), ts)]),
            value_ts: BTreeMap::new(),
            round1: None,
            round2: Vec::new(),
            start_ns: 1,
            end_ns: 2,
            ok: true,
        })
    }

    fn read_ts(record: &Record) -> Option<u64> {
        match record {
            Record::Read(read) => read.reads.get("a").copied(),
            Record::Write(_) => None,
        }
    }

    #[test]
    fn a_read_waits_for_the_write_record_of_its_version() {
        let mut order = ReadsAfterWrites::default();
        let mut ready = Vec::new();
        let now = Instant::now();
        // A read of the initial value and one of a known write go at once.
        order.add(vec![write(5), read(0), read(5)], now, &mut ready);
        assert_eq!(ready.len(), 3);
        ready.clear();
        // A read of ts 7 waits for the write of ts 7, which a later batch brings.
        order.add(vec![read(7)], now, &mut ready);
        assert!(ready.is_empty());
        order.add(vec![write(9)], now, &mut ready);
        assert_eq!(ready.len(), 1, "only the write: {ready:?}");
        order.add(vec![write(7)], now, &mut ready);
        assert_eq!((ready.len(), read_ts(&ready[2])), (3, Some(7)), "{ready:?}");
        assert!(order.held.is_empty());
    }

    #[test]
    fn a_read_of_a_version_no_write_names_is_written_after_the_hold() {
        let mut order = ReadsAfterWrites::default();
        let mut ready = Vec::new();
        let start = Instant::now();
        order.add(vec![read(42)], start, &mut ready);
        order.release_overdue(start + Duration::from_millis(HISTORY_READ_HOLD_MS_MAX - 1), &mut ready);
        assert!(ready.is_empty());
        order.release_overdue(start + Duration::from_millis(HISTORY_READ_HOLD_MS_MAX), &mut ready);
        assert_eq!(ready.iter().map(read_ts).collect::<Vec<_>>(), [Some(42)]);
        // At the end of the run everything held goes out.
        order.add(vec![read(43)], start, &mut ready);
        order.release_all(&mut ready);
        assert_eq!(ready.len(), 2);
    }

    #[test]
    fn held_reads_and_known_writes_are_bounded() {
        let mut order = ReadsAfterWrites::default();
        let mut ready = Vec::new();
        let now = Instant::now();
        let reads = (0..HISTORY_HELD_READS_MAX as u64 + 3).map(|step| read(1_000_000 + step)).collect();
        order.add(reads, now, &mut ready);
        assert_eq!((order.held.len(), ready.len()), (HISTORY_HELD_READS_MAX, 3));
        assert_eq!(read_ts(&ready[0]), Some(1_000_000), "the oldest go first");
        let mut order = ReadsAfterWrites::default();
        for ts in 1..=HISTORY_KNOWN_WRITES_MAX as u64 + 10 {
            order.remember(ts);
        }
        assert_eq!((order.known.len(), order.known_order.len()), (HISTORY_KNOWN_WRITES_MAX, HISTORY_KNOWN_WRITES_MAX));
        assert!(!order.known.contains(&10) && order.known.contains(&11));
    }

    #[test]
    fn the_stream_writes_every_record_and_keeps_them_if_asked() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("history.jsonl");
        let stream = HistoryStream::start(&path, true).expect("start");
        std::thread::scope(|scope| {
            for thread in 0..3u64 {
                let feed = stream.feed();
                scope.spawn(move || {
                    for batch in 0..20u64 {
                        let ts = 1 + thread * 1000 + batch;
                        // The read of each write comes in the batch before the write.
                        assert!(feed.send(vec![read(ts + 1), write(ts)]));
                    }
                    assert!(feed.send(vec![write(thread * 1000 + 21)]));
                });
            }
        });
        let kept = stream.finish().expect("finish");
        let written = read_history(&path).expect("read back");
        assert_eq!(written, kept);
        assert_eq!(written.len(), 3 * 41);
        // Every read comes after the write record of its version.
        let mut seen = HashSet::new();
        for record in &written {
            match record {
                Record::Write(write) => {
                    seen.insert(write.ts);
                }
                Record::Read(read) => assert!(seen.contains(&read.reads["a"]), "{read:?} before its write"),
            }
        }
    }

    #[test]
    fn the_file_trails_the_run_by_at_most_a_flush_interval() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let path = directory.path().join("history.jsonl");
        let stream = HistoryStream::start(&path, false).expect("start");
        let feed = stream.feed();
        assert!(feed.send(vec![write(1), read(1)]));
        // Poll rather than sleep a fixed time: the writer flushes within the interval, but
        // a loaded machine may delay the thread; give up only after a generous bound.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut lines = 0;
        while lines < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            lines = std::fs::read_to_string(&path).map_or(0, |text| text.lines().count());
        }
        assert_eq!(lines, 2, "nothing flushed while the stream stayed open");
        drop(feed);
        assert!(stream.finish().expect("finish").is_empty(), "not kept unless asked");
    }
}
