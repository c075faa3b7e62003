//! Persistence at the edge: a server's log ([`rampkv_durable::Log`]) behind its core.
//!
//! # Contract
//! - A server with a data directory recovers its store from it *before* it serves anything
//!   ([`Journal::open`]: lock, newest valid snapshot, replay, torn tail cut; a damaged middle
//!   is an error unless `truncate_corrupt`). Transactions left in doubt (prepared, neither
//!   committed nor aborted) stay prepared, dated at the start of the group's clock, so the
//!   group's resolver decides them with cooperative termination about `RECOVERY_TIMEOUT_MS`
//!   after the start, exactly as after a client crash; they are invisible to readers meanwhile.
//! - Apply, then append: the core applies a request to the store and describes what it
//!   changed in `Effects::logged`; [`Journal::append`] appends those records and sets
//!   `Effects::release_after` to the last one's LSN. Every reply of the call is held by the
//!   front end until the log's durable watermark passes it (group commit: one fsync releases
//!   every reply that waited for it), a RAMP COMMIT's included (below).
//! - A front end appends for a whole pass over its connections, then calls
//!   [`Journal::flush`] once (`Servers::flush_logs`): that writes the pass's records with one
//!   `write` per log in the front end's own thread (no thread hand-off). With `everysec` and
//!   `no` they are then durable as the policy promises and their replies go out in the same
//!   pass; with `always` the log's syncer thread fsyncs them and then wakes the front ends of
//!   the group that hold replies. Nothing here blocks on an fsync.
//! - A COMMIT's reply waits for its COMMIT record to be durable, as every other reply, even
//!   though every PREPARE of the transaction was durable before the client sent it. Releasing
//!   it once the record is only written would save `always` a transaction's second fsync round
//!   but could lose an acknowledged write at a power cut: a server whose unfsynced COMMIT
//!   record was lost restarts with the transaction in doubt and asks the other participants;
//!   one that committed it may since have garbage collected its versions (superseded, past
//!   `GC_GRACE_MS`: a restart after a power cut easily takes longer), answers that it does not
//!   know the transaction, and cooperative termination aborts it (docs/persistence.md, "Why a
//!   COMMIT waits for its fsync").
//! - Back-pressure: when `LOG_WAITING_BYTES_MAX` bytes already wait to be written, an append
//!   writes them first (as a flush), for at most `LOG_FULL_WAIT_MS_MAX`.
//! - Failure: a log that stopped (a failed write or fsync), or an append that could not be made,
//!   leaves the store changed in memory but not durable. The replies that depend on it are held
//!   for good (never acknowledged), [`Journal::failure`] reports it, and the server must stop
//!   and recover from its files (`rampkv server` exits).
//! - Snapshots: once the log written since the last one started is at least
//!   `snapshot_every_bytes` *and* at least as long as the last snapshot written, a snapshot of
//!   the live store is written in the background (the log it covers is then dropped); a failed
//!   snapshot is kept for the statistics and tried again after as many bytes, the log goes on.
//!   The second bound is Redis's `auto-aof-rewrite-percentage 100`: a store whose snapshot is
//!   larger than `snapshot_every_bytes` (a million keys of 1 KiB is about 1 GB) is not
//!   rewritten more often than the log grows by its size, so snapshots never cost more bytes
//!   written than the log itself, and a start replays at most about one snapshot's worth of
//!   log past the newest snapshot ([`snapshot_due`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use rampkv_core::protocol::server::{Effects, LogPosition, LogRecord, ServerCore};
use rampkv_core::storage::Store;
use rampkv_durable::limits::{LOG_FULL_WAIT_MS_MAX, SNAPSHOT_EVERY_BYTES_DEFAULT};
use rampkv_durable::{
    DurableError, FsyncPolicy, Log, LogStats, OpenOptions, RecordRef, RecoveryReport, SnapshotJob, SnapshotReport,
};

/// The configuration epoch records carry (0 until replication exists).
const EPOCH: u64 = 0;

/// How a server keeps its store across restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurabilityConfig {
    /// When written records are fsynced (`--appendfsync`).
    pub policy: FsyncPolicy,
    /// Cut the log at damage in the middle (and report it) instead of refusing to start
    /// (`--truncate-corrupt-log`).
    pub truncate_corrupt: bool,
    /// A snapshot is written once this many bytes of log were written since the last one
    /// (`--snapshot-every-bytes`).
    pub snapshot_every_bytes: u64,
}

impl Default for DurabilityConfig {
    /// `everysec`, as Redis's `appendfsync` default.
    fn default() -> Self {
        Self {
            policy: FsyncPolicy::Everysec,
            truncate_corrupt: false,
            snapshot_every_bytes: SNAPSHOT_EVERY_BYTES_DEFAULT,
        }
    }
}

/// Why a group of servers did not start (persistence, replication, listeners).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    #[error("{servers} servers need as many data directories, got {directories}")]
    DirectoryCount { servers: usize, directories: usize },
    // The cause is shown here, not chained as a source: its own message already names its
    // cause (`anyhow`'s `{:#}` would print it twice).
    #[error("data directory {}: {cause}", dir.display())]
    Recovery { dir: PathBuf, cause: DurableError },
    #[error("data directory {}: the recovery thread panicked", dir.display())]
    RecoveryPanicked { dir: PathBuf },
    #[error(
        "data directory {}: it was written by a cluster of another size (it holds {found} for {servers} \
         servers); keys are placed by the number of servers, so it would put them on the wrong servers",
        dir.display()
    )]
    ClusterSizeChanged { dir: PathBuf, servers: usize, found: String },
    #[error("data directory {}: {cause}", dir.display())]
    Layout { dir: PathBuf, cause: std::io::Error },
    #[error("cannot listen: {0}")]
    Listen(std::io::Error),
    #[error("need 1..={max} replicas, got {replicas}", max = rampkv_core::limits::CLUSTER_REPLICAS_MAX)]
    ReplicaCount { replicas: u32 },
    #[error("{replicas} replicas need at least {replicas} servers (each copy of a partition on a server of its own), got {servers}")]
    TooFewServersForReplicas { replicas: u32, servers: usize },
    #[error(
        "data directory {}: this server's partitions were failed over to other servers while it was down, so its \
         files do not hold them; a cluster that starts over (every server restarted) would serve them from here \
         without the writes acknowledged since: not started (restart it while the cluster runs: it rejoins)",
        dir.display()
    )]
    FailedOverDataDir { dir: PathBuf },
    #[error("failover serves one server per group (a `rampkv server` process), got {servers}, or it joined a cluster already")]
    FailoverGroup { servers: usize },
    #[error("cannot start replication: {0}")]
    Replication(std::io::Error),
    #[error("these {group} servers from server {first} on are not all in the cluster of {servers} servers")]
    NotInCluster { first: usize, group: usize, servers: usize },
    #[error("replicate address {address:?} is not IP:PORT (a replication port binds an IP address)")]
    ReplicateAddress { address: String },
}

/// The data directory of server `index` of a cluster kept under `data_dir`: `server-<index>`
/// (`rampkv local`, `rampkv bench` and `rampkv chaos` lay them out alike).
pub fn server_data_dir(data_dir: &Path, index: usize) -> PathBuf {
    data_dir.join(format!("server-{index}"))
}

/// The data directories of a cluster of `servers` servers kept under `data_dir`, checked
/// against what it holds: a directory written by a cluster of another size is refused (a key's
/// server follows from the number of servers, so its data would be on the wrong one).
///
/// # Errors
/// `ClusterSizeChanged`; `Layout` when `data_dir` exists but cannot be listed.
pub fn cluster_data_dirs(data_dir: &Path, servers: usize) -> Result<Vec<PathBuf>, StartError> {
    let dirs: Vec<PathBuf> = (0..servers).map(|index| server_data_dir(data_dir, index)).collect();
    let entries = match std::fs::read_dir(data_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(dirs),
        Err(cause) => return Err(StartError::Layout { dir: data_dir.to_path_buf(), cause }),
    };
    let mut found: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.strip_prefix("server-").is_some_and(|index| index.parse::<usize>().is_ok()))
        .collect();
    found.sort();
    let expected: Vec<String> = (0..servers).map(|index| format!("server-{index}")).collect();
    let mut sorted_expected = expected.clone();
    sorted_expected.sort();
    if !found.is_empty() && found != sorted_expected {
        let found = found.join(", ");
        return Err(StartError::ClusterSizeChanged { dir: data_dir.to_path_buf(), servers, found });
    }
    Ok(dirs)
}

/// What a journal has done since its server started.
#[derive(Debug, Clone, Default)]
pub struct JournalStats {
    pub log: LogStats,
    /// Snapshots written (finished) since the start.
    pub snapshots_written: u64,
    /// The last snapshot written.
    pub last_snapshot: Option<SnapshotReport>,
    /// Why the last snapshot failed, if it did.
    pub last_snapshot_error: Option<Arc<DurableError>>,
}

/// The background snapshot of a journal.
#[derive(Debug, Default)]
struct Snapshots {
    running: Option<SnapshotJob>,
    written: u64,
    last: Option<SnapshotReport>,
    last_error: Option<Arc<DurableError>>,
}

impl Snapshots {
    /// Collects the running snapshot if it finished (or, `wait`, waits for it).
    fn collect(&mut self, wait: bool) {
        if self.running.as_ref().is_some_and(|job| wait || job.is_finished()) {
            match self.running.take().map(SnapshotJob::join) {
                Some(Ok(report)) => {
                    self.written += 1;
                    self.last = Some(report);
                    self.last_error = None;
                }
                Some(Err(error)) => self.last_error = Some(Arc::new(error)),
                None => {}
            }
        }
    }
}

/// One server's log, with its snapshots. See the module docs.
#[derive(Debug)]
pub struct Journal {
    log: Log,
    core: Arc<ServerCore>,
    schedule: SnapshotSchedule,
    /// A snapshot is due whatever was written ([`Journal::snapshot_soon`]).
    snapshot_due: AtomicBool,
    snapshots: Mutex<Snapshots>,
    /// The first failure: nothing appended after it is acknowledged.
    failure: OnceLock<Arc<DurableError>>,
}

impl Journal {
    /// Opens `dir` for the server `core` (whose store must be empty): recovers the store from it
    /// and starts the log after the last record found.
    ///
    /// # Errors
    /// The directory is locked by another server, cannot be read or written, or holds a
    /// damaged log or no valid way to rebuild the store (see `rampkv_durable::open`).
    pub fn open(
        dir: &Path,
        config: &DurabilityConfig,
        core: Arc<ServerCore>,
    ) -> Result<(Journal, RecoveryReport), DurableError> {
        // Recovered versions and pending transactions are dated at the start of the group's
        // clock (its `now_ms` starts at 0 once the group is made, after this).
        let options =
            OpenOptions { policy: config.policy, truncate_corrupt: config.truncate_corrupt, ..OpenOptions::default() };
        let (log, report) = rampkv_durable::open(dir, &options, core.store())?;
        let journal = Journal {
            log,
            core,
            schedule: SnapshotSchedule::recovered(config.snapshot_every_bytes, &report),
            snapshot_due: AtomicBool::new(false),
            snapshots: Mutex::new(Snapshots::default()),
            failure: OnceLock::new(),
        };
        Ok((journal, report))
    }

    /// Appends the records of one call (`effects.logged`, emptied) and sets
    /// `effects.release_after` to the position its replies wait for: the last record's LSN.
    /// After a failure that position is never reached. The records are written at the next
    /// [`Journal::flush`].
    pub fn append(&self, effects: &mut Effects) {
        if effects.logged.is_empty() {
            return;
        }
        let mut last = None;
        for record in effects.logged.drain(..) {
            match self.append_record(&record) {
                Some(lsn) => last = Some(lsn),
                None => break,
            }
        }
        let position = match (self.failure.get(), last) {
            (None, Some(lsn)) => LogPosition(lsn),
            _ => LogPosition(u64::MAX), // never durable: held for good
        };
        effects.release_after = Some(effects.release_after.map_or(position, |earlier| earlier.max(position)));
        self.maybe_snapshot();
    }

    /// Appends one record; its LSN, or `None` after a failure (nothing more is appended). The
    /// caller then calls [`Journal::appended`] once for the batch.
    pub(crate) fn append_record(&self, record: &LogRecord) -> Option<u64> {
        if self.failure.get().is_some() {
            return None;
        }
        let wait = Duration::from_millis(LOG_FULL_WAIT_MS_MAX);
        match self.log.append_timeout(EPOCH, RecordRef::from(record), wait) {
            Ok(lsn) => Some(lsn),
            Err(error) => {
                self.fail(error);
                None
            }
        }
    }

    /// After a batch of [`Journal::append_record`]s: a snapshot may be due.
    pub(crate) fn appended(&self) {
        self.maybe_snapshot();
    }

    /// The last LSN appended (0: none): a replicated server's stream numbers its records on.
    pub fn last_lsn(&self) -> u64 {
        self.log.last_lsn()
    }

    /// The store took what the log does not describe (failover adopted a copy into it): a
    /// snapshot is started now (or as soon as the running one ends, at a later append), so
    /// that a restart finds the adopted data.
    pub(crate) fn snapshot_soon(&self) {
        self.snapshot_due.store(true, Ordering::Relaxed);
        self.maybe_snapshot();
    }

    /// Ends a batch of appends (module docs). Returns whether the durable position moved here
    /// (`everysec`, `no`): the other front ends holding replies are to be woken. With `always`
    /// the syncer moves it and wakes them.
    pub fn flush(&self) -> bool {
        let before = self.log.written_lsn();
        if self.log.last_lsn() == before {
            return false;
        }
        let durable_before = self.log.durable_lsn();
        match self.log.flush() {
            Ok(_) => self.log.durable_lsn() > durable_before,
            Err(error) => {
                self.fail(error);
                false
            }
        }
    }

    /// The durable watermark: replies held up to here may go.
    pub fn durable_position(&self) -> LogPosition {
        LogPosition(self.log.durable_lsn())
    }

    /// Why the journal stopped, if it did: the server must stop and recover from its files.
    pub fn failure(&self) -> Option<Arc<DurableError>> {
        if let Some(failure) = self.failure.get() {
            return Some(Arc::clone(failure));
        }
        self.log.failure().map(|error| Arc::clone(self.failure.get_or_init(|| Arc::new(error))))
    }

    /// Counters since the start.
    pub fn stats(&self) -> JournalStats {
        let mut snapshots = self.snapshots.lock();
        snapshots.collect(false);
        JournalStats {
            log: self.log.stats(),
            snapshots_written: snapshots.written,
            last_snapshot: snapshots.last.clone(),
            last_snapshot_error: snapshots.last_error.clone(),
        }
    }

    /// The fsync policy.
    pub fn policy(&self) -> FsyncPolicy {
        self.log.policy()
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// Registers what the log's syncer calls when it moves the watermark (or the log fails).
    pub(crate) fn set_wake(&self, wake: impl Fn() + Send + Sync + 'static) {
        self.log.set_wake(move |_| wake());
    }

    fn fail(&self, error: DurableError) {
        debug_assert!(
            !matches!(error, DurableError::InvalidRecord(_)),
            "the store took what the codec refuses: {error}"
        );
        // The log's own failure, when it has one, says why better than the append's echo.
        let error = self.log.failure().unwrap_or(error);
        let _ = self.failure.set(Arc::new(error));
    }

    /// Starts a background snapshot once enough log was written since the last one.
    fn maybe_snapshot(&self) {
        let written = self.log.stats().bytes;
        let due = self.snapshot_due.load(Ordering::Relaxed);
        if !due && !self.schedule.due(written) {
            return;
        }
        // Another front end checking at the same moment starts it.
        let Some(mut snapshots) = self.snapshots.try_lock() else { return };
        snapshots.collect(false);
        if snapshots.running.is_some() {
            return;
        }
        if let Some(last) = &snapshots.last {
            // The snapshot that finished since the check above may put the next one further.
            self.schedule.finished(last.bytes);
            if !due && !self.schedule.due(written) {
                return;
            }
        }
        self.schedule.started(written);
        self.snapshot_due.store(false, Ordering::Relaxed);
        match self.log.snapshot_in_background(Arc::clone(&self.core), ServerCore::store) {
            Ok(job) => snapshots.running = Some(job),
            Err(error) => snapshots.last_error = Some(Arc::new(error)),
        }
    }

    /// Writes a snapshot now, in the calling thread (after any background one finished).
    ///
    /// # Errors
    /// As `Log::write_snapshot`.
    pub fn snapshot_now(&self) -> Result<SnapshotReport, DurableError> {
        let mut snapshots = self.snapshots.lock();
        snapshots.collect(true);
        let report = self.log.write_snapshot(self.core.store())?;
        snapshots.written += 1;
        snapshots.last = Some(report.clone());
        Ok(report)
    }
}

impl Drop for Journal {
    /// A running snapshot holds the directory's lock until it ends: wait for it, so that a
    /// server started on the same directory right after this one stops finds it free. The log
    /// then writes and fsyncs what it holds as it is dropped.
    fn drop(&mut self) {
        self.snapshots.get_mut().collect(true);
    }
}

/// Where (under its data directory) a server restarted into a running cluster sets the files
/// of its failed-over store aside.
pub const SUPERSEDED_DIR: &str = "superseded";

/// A file a server restarted into a running cluster leaves in its data directory: its
/// cluster-file partitions are served (and their writes kept) elsewhere since.
pub const FAILED_OVER_MARKER: &str = "FAILED-OVER";

/// The directory (under a server's data directory) holding the copies it keeps as a backup.
pub const COPIES_DIR: &str = "copies";

/// The log and snapshots of one backup copy of a primary's stream (replication with a data
/// directory): the copy is written as its server's own store is, numbered as the primary
/// numbered its records, so that after a restart the copy says which record of which stream
/// it holds up to, and its primary can send only the records after it (docs/replication.md,
/// "Restart with a data directory"). The backup's acknowledgements do not wait for it: the
/// copy's files are a base for catching up, never the only copy of an acknowledged write.
#[derive(Debug)]
pub struct CopyJournal {
    log: Log,
    schedule: SnapshotSchedule,
    running: Option<SnapshotJob>,
}

/// A copy found in a backup's data directory at its start.
#[derive(Debug)]
pub struct RestoredCopy {
    pub primary: u16,
    /// The identity of the stream it is a prefix of.
    pub stream: u64,
    pub store: Store,
    pub journal: CopyJournal,
    /// The last record it holds, and its epoch.
    pub applied: u64,
    pub epoch: u64,
    /// When it became its primary's current copy (the one a failover takes over), if it did:
    /// the epoch and the wall clock then, from its [`CURRENT_COPY_MARKER`] file.
    pub current_since: Option<(u64, u64)>,
}

/// The file in a copy's directory that says it became its primary's current copy (the in-sync
/// one a failover takes over): 16 bytes, the epoch then and the wall clock in ns, both u64
/// little-endian. A restarted backup that resumes its roles (`server::resume`) makes the
/// newest marked copy of each primary current again.
pub const CURRENT_COPY_MARKER: &str = "CURRENT";

/// Writes `bytes` to `dir/name` so that a crash (SIGKILL, power cut) leaves either the old
/// file or the new one whole: a temporary file written and fsynced, renamed over the old one,
/// then the directory fsynced.
///
/// # Errors
/// Any of those steps.
pub fn write_file_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let temporary = dir.join(format!("{name}.tmp"));
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

impl CopyJournal {
    /// Starts the files of a copy of `primary`'s stream `stream` in a new directory under
    /// `root`: a snapshot of `store` (which holds every record up to `covers`), then a log from
    /// `covers + 1` on.
    ///
    /// # Errors
    /// The directory cannot be made or written.
    pub fn create(
        root: &Path,
        config: &DurabilityConfig,
        primary: u16,
        stream: u64,
        store: &Store,
        covers: u64,
        epoch: u64,
    ) -> Result<CopyJournal, DurableError> {
        let mut tag = [0u8; 4];
        let _ = getrandom::getrandom(&mut tag);
        let dir = root.join(format!("primary-{primary}-{stream:016x}-{:08x}", u32::from_le_bytes(tag)));
        let log = rampkv_durable::create_at(&dir, &copy_options(config), store, covers, epoch)?;
        Ok(CopyJournal { log, schedule: SnapshotSchedule::new(config.snapshot_every_bytes, 0), running: None })
    }

    /// Loads every copy kept under `root` (copies superseded by a newer one of the same stream,
    /// and copies that cannot be read, are removed: their primary sends a snapshot instead).
    pub fn restore(root: &Path, config: &DurabilityConfig, gc_grace_ms: u64) -> Vec<RestoredCopy> {
        let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
        let mut restored: Vec<RestoredCopy> = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let dir = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let mut parts = name.strip_prefix("primary-").unwrap_or_default().split('-');
            let primary = parts.next().and_then(|part| part.parse::<u16>().ok());
            let stream = parts.next().and_then(|part| u64::from_str_radix(part, 16).ok());
            let (Some(primary), Some(stream)) = (primary, stream) else { continue };
            let store = Store::new(gc_grace_ms);
            match rampkv_durable::open(&dir, &copy_options(config), &store) {
                Ok((log, report)) if report.last_lsn > 0 => {
                    log::warn!(
                        "replication: restored a copy of primary {primary} (stream {stream:016x}) up to record {}: {report}",
                        report.last_lsn
                    );
                    let schedule = SnapshotSchedule::recovered(config.snapshot_every_bytes, &report);
                    let journal = CopyJournal { log, schedule, running: None };
                    let (applied, epoch) = (report.last_lsn, report.last_epoch);
                    let current_since = read_current_marker(&dir);
                    restored.push(RestoredCopy { primary, stream, store, journal, applied, epoch, current_since });
                }
                Ok((log, _)) => CopyJournal { log, schedule: SnapshotSchedule::new(0, 0), running: None }.remove(),
                Err(error @ DurableError::Locked { .. }) => {
                    log::warn!("replication: cannot restore the copy in {}: {error}; left alone", dir.display());
                }
                Err(error) => {
                    log::warn!("replication: cannot restore the copy in {}: {error}; removed", dir.display());
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
        // Of two copies of one stream, the one further along is kept.
        restored.sort_by_key(|copy| (copy.primary, copy.stream, std::cmp::Reverse(copy.applied)));
        let mut kept: Vec<RestoredCopy> = Vec::new();
        for copy in restored {
            if kept.last().is_some_and(|last| (last.primary, last.stream) == (copy.primary, copy.stream)) {
                copy.journal.remove();
            } else {
                kept.push(copy);
            }
        }
        kept
    }

    /// Marks the copy as its primary's current one since `epoch` ([`CURRENT_COPY_MARKER`]),
    /// durably, before it returns.
    ///
    /// # Errors
    /// The marker cannot be written.
    pub fn mark_current(&self, epoch: u64) -> std::io::Result<()> {
        let wall_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&epoch.to_le_bytes());
        bytes[8..].copy_from_slice(&(wall_ns as u64).to_le_bytes());
        write_file_durably(self.log.dir(), CURRENT_COPY_MARKER, &bytes)
    }

    /// Waits until every record up to `lsn` is durable as the fsync policy promises (written
    /// with `everysec` and `no`, fsynced with `always`), writing them first: a backup
    /// acknowledges a record only then (docs/replication.md, "Backups and a whole-cluster
    /// kill").
    ///
    /// # Errors
    /// The log failed, or the fsync took longer than `LOG_FULL_WAIT_MS_MAX`.
    pub fn make_durable(&self, lsn: u64) -> Result<(), DurableError> {
        let lsn = lsn.min(self.log.last_lsn());
        self.log.wait_durable(lsn, Duration::from_millis(LOG_FULL_WAIT_MS_MAX))
    }

    /// Appends record `lsn` (as its primary numbered it) of `epoch`.
    ///
    /// # Errors
    /// The log failed, or numbers it otherwise (the copy's files are then no prefix of the
    /// stream and must be removed).
    pub fn append(&self, lsn: u64, epoch: u64, record: RecordRef<'_>) -> Result<(), DurableError> {
        let appended = self.log.append_timeout(epoch, record, Duration::from_millis(LOG_FULL_WAIT_MS_MAX))?;
        if appended != lsn {
            return Err(DurableError::NotAppended { lsn, last_lsn: appended });
        }
        Ok(())
    }

    /// Writes what was appended (made durable as the policy says), and starts a snapshot of the
    /// copy `owner` once enough log was written since the last one.
    ///
    /// # Errors
    /// The log failed.
    pub fn flush<T: Send + Sync + 'static>(
        &mut self,
        owner: &Arc<T>,
        store_of: fn(&T) -> &Store,
    ) -> Result<(), DurableError> {
        self.log.flush()?;
        let written = self.log.stats().bytes;
        if !self.schedule.due(written) {
            return Ok(());
        }
        if self.running.as_ref().is_some_and(SnapshotJob::is_finished) {
            match self.running.take().map(SnapshotJob::join) {
                Some(Err(error)) => log::warn!("replication: a snapshot of a backup copy failed: {error}"),
                Some(Ok(report)) => self.schedule.finished(report.bytes),
                None => {}
            }
        }
        if self.running.is_none() && self.schedule.due(written) {
            self.schedule.started(written);
            self.running = Some(self.log.snapshot_in_background(Arc::clone(owner), store_of)?);
        }
        Ok(())
    }

    /// Stops the log and deletes the copy's directory (the copy was dropped or replaced).
    pub fn remove(mut self) {
        if let Some(job) = self.running.take() {
            let _ = job.join();
        }
        let dir = self.log.dir().to_path_buf();
        let _ = self.log.close();
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            log::warn!("replication: cannot remove the dropped copy {}: {error}", dir.display());
        }
    }
}

/// When a journal (or a copy's) writes its next snapshot (module docs), from the log bytes
/// written since the start. Atomics: a server's front ends check it concurrently.
#[derive(Debug)]
struct SnapshotSchedule {
    every_bytes: u64,
    /// Log bytes written (since the start) when the last snapshot was started.
    mark: AtomicU64,
    /// Bytes of the last snapshot written (0: none yet).
    last_bytes: AtomicU64,
}

impl SnapshotSchedule {
    /// For a log just opened, whose last snapshot written has `last_bytes` bytes (0: none).
    fn new(every_bytes: u64, last_bytes: u64) -> Self {
        SnapshotSchedule { every_bytes, mark: AtomicU64::new(0), last_bytes: AtomicU64::new(last_bytes) }
    }

    /// For a log opened by recovery: the snapshot it loaded, if any, is the last one written.
    fn recovered(every_bytes: u64, report: &RecoveryReport) -> Self {
        Self::new(every_bytes, report.snapshot.as_ref().map_or(0, |snapshot| snapshot.bytes))
    }

    /// Whether a snapshot is due once the log has `written` bytes ([`snapshot_due`]).
    fn due(&self, written: u64) -> bool {
        let since = written.saturating_sub(self.mark.load(Ordering::Relaxed));
        snapshot_due(since, self.every_bytes, self.last_bytes.load(Ordering::Relaxed))
    }

    /// A snapshot was started with the log at `written` bytes.
    fn started(&self, written: u64) {
        self.mark.store(written, Ordering::Relaxed);
    }

    /// The last snapshot written has `bytes` bytes.
    fn finished(&self, bytes: u64) {
        self.last_bytes.store(bytes, Ordering::Relaxed);
    }
}

/// Whether a snapshot is due after `since` bytes of log were written since the last one
/// started: at least `every_bytes` (`--snapshot-every-bytes`) and at least the last snapshot's
/// size `last_bytes` (module docs: a snapshot never costs more bytes than the log it covers).
fn snapshot_due(since: u64, every_bytes: u64, last_bytes: u64) -> bool {
    since >= every_bytes.max(last_bytes)
}

/// The epoch and wall clock a copy's [`CURRENT_COPY_MARKER`] holds, if it has a whole one.
fn read_current_marker(dir: &Path) -> Option<(u64, u64)> {
    let bytes = std::fs::read(dir.join(CURRENT_COPY_MARKER)).ok()?;
    let bytes: [u8; 16] = bytes.try_into().ok()?;
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Some((word(0), word(8)))
}

fn copy_options(config: &DurabilityConfig) -> OpenOptions {
    OpenOptions { policy: config.policy, truncate_corrupt: true, ..OpenOptions::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampkv_core::limits::GC_GRACE_MS;
    use rampkv_core::protocol::server::LogRecord;
    use rampkv_core::storage::Key;

    /// The rule of when a snapshot is due: at least `--snapshot-every-bytes` of log since the
    /// last one started, and at least the last snapshot's size.
    #[test]
    fn a_snapshot_is_due_once_the_log_grew_by_the_bound_and_by_the_last_snapshots_size() {
        let mib = 1 << 20;
        assert!(!snapshot_due(mib - 1, mib, 0), "below the bound");
        assert!(snapshot_due(mib, mib, 0), "no snapshot yet: the bound alone");
        assert!(snapshot_due(mib, mib, mib / 2), "a small snapshot: the bound");
        assert!(!snapshot_due(2 * mib, mib, 3 * mib), "a larger snapshot: its size");
        assert!(snapshot_due(3 * mib, mib, 3 * mib));
    }

    /// A journal whose store snapshots larger than `snapshot_every_bytes` writes its next
    /// snapshot only once the log grew by that snapshot's size, not after every
    /// `snapshot_every_bytes`: snapshots never write more than the log (module docs).
    #[test]
    fn a_large_store_is_snapshotted_again_only_after_as_much_log() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let every = 256 * 1024;
        let config =
            DurabilityConfig { policy: FsyncPolicy::No, snapshot_every_bytes: every, ..DurabilityConfig::default() };
        let core = Arc::new(ServerCore::new(GC_GRACE_MS));
        let (journal, _) = Journal::open(dir.path(), &config, Arc::clone(&core)).expect("open");
        // About 1 MiB of versions the log does not describe (as a copy adopted by failover).
        for index in 0..256u64 {
            let key = Key::from(format!("big{index}").as_bytes());
            core.store().put(index + 1, vec![(key, vec![7u8; 4096].into_boxed_slice())], 0).expect("stored");
        }
        journal.snapshot_now().expect("the first snapshot");
        let first = journal.stats().last_snapshot.expect("written").bytes;
        assert!(first > 4 * every, "the store's snapshot ({first} bytes) is larger than the bound");
        let written = journal.stats().log.bytes;
        journal.schedule.started(written);
        journal.schedule.finished(first);
        // Log records of 8 KiB each (small PUTs of a few keys), flushed as a server does.
        let mut ts = 1_000;
        let mut append_log = |bytes: u64| {
            let target = journal.stats().log.bytes + bytes;
            while journal.stats().log.bytes < target {
                ts += 1;
                let key = Key::from(format!("k{}", ts % 16).as_bytes());
                let mut effects = Effects::default();
                effects.logged.push(LogRecord::put(ts, vec![(key, vec![1u8; 8192].into_boxed_slice())]));
                journal.append(&mut effects);
                journal.flush();
            }
        };
        append_log(2 * every);
        let started = journal.snapshots.lock().running.is_some();
        assert!(!started, "twice the bound but less than the snapshot: none started");
        assert_eq!(journal.stats().snapshots_written, 1);
        append_log(first);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while journal.stats().snapshots_written < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(journal.stats().snapshots_written, 2, "as much log as the last snapshot: the next one");
    }

    /// With `always`, a call that logged only a COMMIT holds its reply until the COMMIT record
    /// is fsynced, as every other call: releasing it once the record is only written could
    /// lose an acknowledged write at a power cut (module docs). The position it waits for is
    /// the COMMIT's own LSN, past the written watermark until the fsync.
    #[test]
    fn a_commit_reply_waits_until_its_record_is_fsynced_with_always() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let config = DurabilityConfig { policy: FsyncPolicy::Always, ..DurabilityConfig::default() };
        let core = Arc::new(ServerCore::new(GC_GRACE_MS));
        let (journal, _) = Journal::open(dir.path(), &config, core).expect("open");
        let mut effects = Effects::default();
        effects.logged.push(LogRecord::Commit { ts: 7 });
        journal.append(&mut effects);
        assert_eq!(effects.release_after, Some(LogPosition(1)), "the COMMIT's reply is held behind its record");
        assert!(journal.durable_position() < LogPosition(1), "nothing is durable before it is written");
        journal.flush();
        journal.log.wait_durable(1, Duration::from_secs(30)).expect("fsynced");
        assert_eq!(journal.stats().log.fsyncs, 1, "durable with `always` means fsynced");
        assert!(journal.durable_position() >= LogPosition(1));
    }
}
