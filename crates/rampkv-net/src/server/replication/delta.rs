//! Delta: a restarted backup that kept its copy on disk.
//!
//! # Contract
//! With a data directory a backup keeps each copy on disk
//! (`crate::server::durable::CopyJournal`: a snapshot at the copy's base point, then a log
//! numbered as the primary's stream), and a primary's stream has an identity (random; new at
//! each start, and whenever failover adopts a copy into the store: data no record describes)
//! and keeps its last `REPLICATION_BACKLOG_BYTES` of records. A restarted backup loads its
//! copies; a catch-up hello names the stream, and the backup answers with the last record it
//! holds of *that* stream (0: none). When the backlog still has every record after it, the
//! primary puts them at the front of the link's queue and sends a *delta* marker instead of a
//! snapshot: the copy goes on from where it is, through the same counting and in-sync steps as
//! a snapshot (`rejoin`). A copy of a stream is a prefix of the primary's history (every record
//! of the stream was applied to the primary's store before it was appended), so it holds
//! nothing the primary does not; a stream identity that changed, a backlog that lost the
//! records, or no copy on disk: a snapshot, as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rampkv_durable::{DurableError, RecordRef};

use super::super::durable::{CopyJournal, RestoredCopy};
use super::copy::{BackupStore, CopyPersistence};
use super::primary::{Batch, CatchUp, Link, Replicator, Shared};

/// A random non-zero stream identity.
pub(super) fn new_stream_id() -> u64 {
    super::super::ids::random_id()
}

impl Replicator {
    /// The store took what no record describes (failover adopted a copy into it): a backup's
    /// copy of the stream so far is no prefix of it any more, so the stream gets a new identity
    /// (and its backlog is dropped). Links already streaming are unaffected.
    pub(crate) fn new_lineage(&self) {
        let _sequencer = self.shared.sequencer.lock();
        let mut backlog = self.shared.backlog.lock();
        backlog.stream = new_stream_id();
        backlog.batches.clear();
        backlog.bytes = 0;
    }
}

/// A catching-up backup that holds records up to `held` of this stream (`lineage`, its identity
/// when the hello was sent) gets only the records after them, when the backlog still has every
/// one (module docs): they are put at the front of the link's queue, before the
/// records from its point on, and the first one's number is returned (for the delta marker).
/// `None`: a snapshot is due.
pub(super) fn queue_delta(shared: &Shared, link: &Link, catch_up: &CatchUp, held: u64, lineage: u64) -> Option<u64> {
    let point = catch_up.point;
    if held == 0 || held >= point {
        return None;
    }
    let backlog = shared.backlog.lock();
    let first_kept = backlog.batches.front().map_or(point, |batch| batch.first);
    if backlog.stream != lineage || first_kept > held + 1 {
        return None;
    }
    let now = Instant::now();
    let missed: Vec<Batch> = backlog
        .batches
        .iter()
        .filter(|batch| batch.last > held && batch.first < point)
        .map(|batch| Batch { queued_at: now, ..batch.clone() })
        .collect();
    drop(backlog);
    let records = point - 1 - held;
    let mut queue = link.queue.lock();
    debug_assert_eq!(queue.written, 0, "the delta goes before anything the link wrote");
    for batch in missed.into_iter().rev() {
        queue.bytes += batch.bytes.len();
        queue.batches.push_front(batch);
    }
    link.acked.store(held, Ordering::Release);
    // One-sided, the backup acknowledges what it applied from `held` on (not from the point).
    link.applied.store(held, Ordering::Release);
    drop(queue);
    let mut stats = shared.stats.lock();
    stats.catch_up_deltas += 1;
    stats.catch_up_delta_records += records;
    drop(stats);
    let versions = shared.source.get().map_or(0, |core| core.store().stats().versions);
    log::warn!(
        "replication: primary {} sent a catching-up backup a delta of {records} records ({} to {}) instead of a \
         snapshot of its store ({versions} versions)",
        shared.primary,
        held + 1,
        point - 1
    );
    Some(held + 1)
}

impl BackupStore {
    pub(super) fn restored(copy: RestoredCopy, gc_grace_ms: u64) -> BackupStore {
        let RestoredCopy { primary, stream, store, journal, applied, epoch, .. } = copy;
        BackupStore {
            store,
            applied: AtomicU64::new(applied),
            stream: AtomicU64::new(stream),
            journal: Mutex::new(Some(journal)),
            ..BackupStore::new(primary, epoch, gc_grace_ms)
        }
    }

    /// Whether a catch-up hello of stream `stream` in epoch `epoch` may continue this copy
    /// rather than start a fresh one: it is a prefix of that stream, nobody streams into it.
    pub(super) fn resumable(&self, stream: u64, epoch: u64) -> bool {
        self.stream.load(Ordering::Acquire) == stream
            && self.applied() > 0
            && self.epoch() <= epoch
            && !self.fenced.load(Ordering::Acquire)
            && self.streaming.try_lock().is_some()
    }

    /// Drops its files (the copy is dropped, replaced, or no prefix of its stream any more).
    pub(super) fn discard_journal(&self) {
        if let Some(journal) = self.journal.lock().take() {
            journal.remove();
        }
    }

    /// Starts its files as a copy of stream `stream` holding every record up to `covers`.
    ///
    /// # Errors
    /// With persistence, the files cannot be made: the copy is not kept on disk, and the backup
    /// must not acknowledge what it does not keep (the caller closes the stream and the server
    /// stops, `BackupService::failure`).
    pub(super) fn start_journal(
        &self,
        persistence: Option<&CopyPersistence>,
        stream: u64,
        covers: u64,
    ) -> Result<(), DurableError> {
        self.discard_journal();
        self.stream.store(stream, Ordering::Release);
        let Some(persistence) = persistence else { return Ok(()) };
        let (root, config) = (&persistence.root, &persistence.config);
        let journal = CopyJournal::create(root, config, self.primary, stream, &self.store, covers, self.epoch())?;
        *self.journal.lock() = Some(journal);
        Ok(())
    }

    /// Appends record `lsn` of `epoch` to its files.
    ///
    /// # Errors
    /// The files failed (the copy is no longer kept on disk; as [`BackupStore::start_journal`]).
    pub(super) fn journal_record(&self, lsn: u64, epoch: u64, record: RecordRef<'_>) -> Result<(), DurableError> {
        let mut journal = self.journal.lock();
        let Some(Err(error)) = journal.as_ref().map(|journal| journal.append(lsn, epoch, record)) else {
            return Ok(());
        };
        if let Some(journal) = journal.take() {
            journal.remove();
        }
        Err(error)
    }

    /// Writes what its files were given and waits until everything up to `lsn` is durable as
    /// the fsync policy promises: before each acknowledgement, so that a copy on disk holds
    /// every record its backup acknowledged (a whole-cluster kill -9 with any policy, a power
    /// cut with `always`).
    ///
    /// # Errors
    /// The files failed (as [`BackupStore::journal_record`]).
    pub(super) fn flush_journal(self: &Arc<Self>, lsn: u64) -> Result<(), DurableError> {
        let mut journal = self.journal.lock();
        let flushed = journal.as_mut().map(|journal| {
            journal.flush(self, BackupStore::store)?;
            journal.make_durable(lsn)
        });
        let Some(Err(error)) = flushed else { return Ok(()) };
        if let Some(journal) = journal.take() {
            journal.remove();
        }
        Err(error)
    }

    /// Marks its files as its primary's current copy since `epoch` (a restarted backup that
    /// resumes takes this one over if its primary fails).
    ///
    /// # Errors
    /// The marker cannot be written.
    pub(super) fn mark_current(&self, epoch: u64) -> std::io::Result<()> {
        match self.journal.lock().as_ref() {
            Some(journal) => journal.mark_current(epoch),
            None => Ok(()),
        }
    }
}
