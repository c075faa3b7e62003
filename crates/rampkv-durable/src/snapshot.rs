//! Snapshots: every version of a store in one compact file, so that a restart replays only the
//! log after it and the log before it can be dropped.
//!
//! # Format (little-endian; `docs/persistence.md` has the same tables)
//! ```text
//! file header (32 bytes, files.rs): magic "RKVSNAP\0", version, crc32c, lsn, epoch
//!   lsn: every log record up to it is reflected in the snapshot; replay starts after it
//! entries, each:
//!   0 u32 payload_bytes          <= SNAPSHOT_ENTRY_BYTES_MAX
//!   4 u32 crc32c                 CRC32C of bytes [0, 4) then the payload
//!   8 payload: u8 kind, then
//!     1 KEY      key, u64 collected_max_ts, u32 versions   the next `versions` entries are
//!                                                          this key's VERSION entries
//!     2 VERSION  u64 ts, u8 committed (0 or 1), metadata, value [, u64 expiry]
//!                (the expiry only when the version expires or was reclaimed: not 0;
//!                `types::Expiry`, docs/persistence.md; format version 2)
//!     3 PENDING  u64 ts, keys write_set                    a prepared transaction awaiting
//!                                                          its COMMIT here
//!     4 ABORTED  u64 ts                                    a transaction aborted here
//!     5 END      u64 keys, u64 versions, u64 pending, u64 aborted   (counts of the above)
//! ```
//! (key, keys, metadata and value as in records, `record.rs`.) A snapshot is valid only if
//! every entry checks, the END entry's counts match, and nothing follows END; a torn or
//! damaged file is refused whole (recovery then falls back to the snapshot before it).
//!
//! # Why a snapshot of a live store is right
//! The log position `lsn` is read before the copy starts, and the server applies each change
//! to the store *before* it appends the change's record (the contract of the integration).
//! So every record up to `lsn` was applied before the copy began and is in it; what the copy
//! misses was applied later, and its record has a larger LSN, which replay applies. The copy
//! may also catch some changes whose records come after `lsn` (it visits shards one at a
//! time while writers go on); replay applies those again, which leaves the same store (see
//! `Store::restore_key` in rampkv-core for why each operation is idempotent that way). The
//! copy is written to a temporary file, fsynced, renamed and the directory fsynced: a crash
//! leaves either the previous snapshots or the new one complete, never a half file under a
//! snapshot name.
//!
//! # What a file snapshot leaves out
//! A snapshot file keeps, of each key, its newest committed version and every version still
//! prepared; the committed versions the newest supersedes are left out and the key's
//! `collected_max_ts` raised past them, exactly as if garbage collection had collected them
//! as the snapshot was taken. Such versions are kept in a live store only through the GC grace
//! period, for reads in flight (a round-2 read of an older version, a RAMP-Small or -Hybrid
//! read's `HIGHEST_OF`): after a restart those reads are gone or get `VersionGone` and restart,
//! as after a collection; and a transaction in doubt at another server that asks about one
//! learns what it learns of a collected one (docs/persistence.md, "Why a COMMIT waits for its
//! fsync"). Without it a write-heavy store's snapshot held every version of the last 10 s
//! (larger than the log it replaced) and cost more than the log itself. Replay after the
//! snapshot can bring such versions back (records after `lsn`); the next collection takes them
//! again. The catch-up stream of a backup ([`write_to`]) keeps every version: the copy it makes
//! may serve in-flight reads after a failover.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use rampkv_core::storage::{Key, KeyVersions, PendingTxn, Store, StoredMetadata, Superseded, Version};
use rampkv_core::types::{Expiry, Timestamp, TIMESTAMP_INITIAL};
use rampkv_core::wire::{Decoder, Encoder, Metadata, WireError, WriteSet};

use crate::error::{DurableError, SnapshotDamage};
use crate::files::{
    list, recycled_segment_path, snapshot_path, sync_dir, temporary_snapshot_path, FileHeader, FILE_HEADER_BYTES,
    SNAPSHOT_MAGIC,
};
use crate::limits::{SNAPSHOTS_KEPT, SNAPSHOT_ENTRY_BYTES_MAX, SNAPSHOT_IO_BUFFER_BYTES};
use crate::log::{Log, Shared};
use crate::record::{stored_metadata, Lsn, RecordError};

const ENTRY_HEADER_BYTES: usize = 8;

const KIND_KEY: u8 = 1;
const KIND_VERSION: u8 = 2;
const KIND_PENDING: u8 = 3;
const KIND_ABORTED: u8 = 4;
const KIND_END: u8 = 5;

/// How many of each entry a snapshot holds (its END entry).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    pub keys: u64,
    pub versions: u64,
    pub pending: u64,
    pub aborted: u64,
}

/// A snapshot written.
#[derive(Debug, Clone)]
pub struct SnapshotReport {
    pub path: PathBuf,
    /// Every log record up to this LSN is reflected in it.
    pub lsn: Lsn,
    pub counts: SnapshotCounts,
    pub bytes: u64,
    pub duration_ms: u64,
    /// Log segments and older snapshots it made unnecessary, deleted.
    pub dropped: Vec<PathBuf>,
}

/// A snapshot loaded at start.
#[derive(Debug, Clone)]
pub struct LoadedSnapshot {
    pub path: PathBuf,
    pub lsn: Lsn,
    pub epoch: u64,
    pub counts: SnapshotCounts,
    pub bytes: u64,
    pub duration_ms: u64,
}

/// A snapshot being written by its own thread.
#[derive(Debug)]
pub struct SnapshotJob {
    thread: JoinHandle<Result<SnapshotReport, DurableError>>,
}

impl SnapshotJob {
    /// Whether the snapshot is done (then `join` does not wait).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the snapshot and returns what it wrote.
    pub fn join(self) -> Result<SnapshotReport, DurableError> {
        self.thread.join().map_err(|_| DurableError::SnapshotThreadLost)?
    }
}

/// The claim of the one snapshot a log writes at a time; released when dropped.
struct Running(Arc<Shared>);

impl Running {
    fn claim(shared: &Arc<Shared>) -> Result<Running, DurableError> {
        if shared.snapshot_running.swap(true, Ordering::AcqRel) {
            return Err(DurableError::SnapshotInProgress);
        }
        Ok(Running(Arc::clone(shared)))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.snapshot_running.store(false, Ordering::Release);
    }
}

impl Log {
    /// Writes a snapshot of `store` in the calling thread (see [`Log::snapshot_in_background`]).
    ///
    /// # Errors
    /// `SnapshotInProgress` when another is being written; I/O errors (the log itself goes on,
    /// and the previous snapshots stay valid).
    pub fn write_snapshot(&self, store: &Store) -> Result<SnapshotReport, DurableError> {
        let _running = Running::claim(self.shared())?;
        let (lsn, epoch) = self.shared().position();
        write(&self.shared().dir, store, lsn, epoch)
    }

    /// Starts writing a snapshot of the store `store_of(&owner)` in a new thread, covering the
    /// log up to the last LSN appended *now*: every change whose record was appended before
    /// this call must already be applied to the store (the server applies, then appends).
    /// Appends and the server go on meanwhile. When it is written, older snapshots beyond
    /// `SNAPSHOTS_KEPT` and the segments the oldest kept one covers are deleted.
    ///
    /// # Errors
    /// `SnapshotInProgress` when another is being written; a thread that cannot start.
    pub fn snapshot_in_background<T: Send + Sync + 'static>(
        &self,
        owner: Arc<T>,
        store_of: fn(&T) -> &Store,
    ) -> Result<SnapshotJob, DurableError> {
        let running = Running::claim(self.shared())?;
        let (lsn, epoch) = self.shared().position();
        let shared = Arc::clone(self.shared());
        let thread = std::thread::Builder::new()
            .name("rampkv-snapshot".into())
            .spawn(move || {
                let _running = running;
                write(&shared.dir, store_of(&owner), lsn, epoch)
            })
            .map_err(DurableError::io("start the snapshot thread for", self.dir()))?;
        Ok(SnapshotJob { thread })
    }
}

/// Writes a snapshot of `store` covering the log up to `lsn`, then drops what it made
/// unnecessary (older snapshots beyond `SNAPSHOTS_KEPT`, and log segments that the oldest kept
/// snapshot covers).
pub(crate) fn write(dir: &Path, store: &Store, lsn: Lsn, epoch: u64) -> Result<SnapshotReport, DurableError> {
    let image = StoreImage::of(store, Superseded::LeaveOut);
    let started = Instant::now();
    let temporary = temporary_snapshot_path(dir, lsn);
    let (counts, bytes) = match write_temporary(&temporary, &image, FileHeader { lsn, epoch }) {
        Ok(written) => written,
        Err(error) => {
            // Best effort: a leftover is also deleted at the next start.
            let _ = std::fs::remove_file(&temporary);
            return Err(error);
        }
    };
    let path = snapshot_path(dir, lsn);
    std::fs::rename(&temporary, &path).map_err(DurableError::io("rename", &temporary))?;
    sync_dir(dir)?;
    let dropped = drop_covered(dir)?;
    Ok(SnapshotReport { path, lsn, counts, bytes, duration_ms: started.elapsed().as_millis() as u64, dropped })
}

/// Writes and fsyncs the snapshot file at `temporary`; returns its counts and length.
fn write_temporary(
    temporary: &Path,
    image: &StoreImage,
    header: FileHeader,
) -> Result<(SnapshotCounts, u64), DurableError> {
    let file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temporary)
        .map_err(DurableError::io("create", temporary))?;
    let mut writer = EntryWriter { out: BufWriter::with_capacity(SNAPSHOT_IO_BUFFER_BYTES, file), scratch: Vec::new() };
    let counts = writer.write_store(image, header).map_err(DurableError::io("write", temporary))?;
    writer.out.flush().map_err(DurableError::io("write", temporary))?;
    let file = writer.out.into_inner().map_err(|error| DurableError::io("write", temporary)(error.into_error()))?;
    file.sync_all().map_err(DurableError::io("fsync", temporary))?;
    let bytes = file.metadata().map_err(DurableError::io("stat", temporary))?.len();
    Ok((counts, bytes))
}

/// Deletes snapshots beyond the newest `SNAPSHOTS_KEPT`, and segments whose every record the
/// oldest kept snapshot covers (a segment is covered when the next one starts at or before the
/// snapshot's LSN + 1; the last segment, being written, never is). The newest covered segment
/// is renamed to the recycled segment's name instead, when none is kept yet: the log's preparer
/// makes its next segment of it.
fn drop_covered(dir: &Path) -> Result<Vec<PathBuf>, DurableError> {
    let listing = list(dir)?;
    let mut dropped = Vec::new();
    let kept_from = listing.snapshots.len().saturating_sub(SNAPSHOTS_KEPT);
    for (_, path) in &listing.snapshots[..kept_from] {
        std::fs::remove_file(path).map_err(DurableError::io("remove", path))?;
        dropped.push(path.clone());
    }
    if listing.snapshots.len() >= SNAPSHOTS_KEPT {
        let covered_lsn = listing.snapshots[kept_from].0;
        let mut recycle = listing.recycled_segment.is_none();
        let mut segments = Vec::new();
        // Newest first: the one kept for reuse is the most recently written (its pages the
        // likeliest to be cached).
        for pair in listing.segments.windows(2).rev() {
            let ((_, path), (next_first_lsn, _)) = (&pair[0], &pair[1]);
            if *next_first_lsn <= covered_lsn + 1 {
                if std::mem::take(&mut recycle) {
                    let recycled = recycled_segment_path(dir);
                    std::fs::rename(path, &recycled).map_err(DurableError::io("rename", path))?;
                } else {
                    std::fs::remove_file(path).map_err(DurableError::io("remove", path))?;
                }
                segments.push(path.clone());
            }
        }
        dropped.extend(segments.into_iter().rev());
    }
    if !dropped.is_empty() {
        sync_dir(dir)?;
    }
    Ok(dropped)
}

/// Writes a snapshot of `store` covering the records up to `lsn` of epoch `epoch` to `out`, in
/// the file format above (header, entries, END): what a primary sends a backup that catches up
/// (replication). The caller reads `lsn` before it calls this, after every change up to `lsn`
/// was applied to `store` (see the module docs for why a live store's copy is then right).
///
/// # Errors
/// What `out` returns.
pub fn write_to<W: Write>(out: W, store: &Store, lsn: Lsn, epoch: u64) -> std::io::Result<SnapshotCounts> {
    let mut writer = EntryWriter { out, scratch: Vec::new() };
    let counts = writer.write_store(&StoreImage::of(store, Superseded::Keep), FileHeader { lsn, epoch })?;
    writer.out.flush()?;
    Ok(counts)
}

/// Loads a snapshot in the file format above from `input` into `store`, which may already
/// hold versions (a copy that catches up again: restoring is idempotent, see the module docs);
/// `source` names the input in errors. Everything up to the END entry is checked as when a
/// file is loaded, and `input` must end right after it.
///
/// # Errors
/// [`DurableError::CorruptSnapshot`] (bad header, checksum, counts, trailing bytes, no END)
/// or an I/O error of `input`. `store` may then hold part of the snapshot.
pub fn load_from<R: Read>(input: R, source: &Path, store: &Store, now_ms: u64) -> Result<LoadedSnapshot, DurableError> {
    load_entries(input, source, store, now_ms)
}

/// What a snapshot writes of a store, taken under its locks one shard at a time (each key's
/// versions shared, not copied), so that encoding and writing it out holds no lock: every key
/// with its versions, then the pending transactions and the aborted ones (in this order, as
/// the module docs' argument for a live store's copy has it). It costs a key's bytes and one
/// pointer per version while the snapshot is written.
struct StoreImage {
    keys: Vec<KeyVersions>,
    pending: Vec<(Timestamp, PendingTxn)>,
    aborted: Vec<Timestamp>,
}

impl StoreImage {
    /// `superseded`: `LeaveOut` for a file (module docs, "What a file snapshot leaves out"),
    /// `Keep` for a catch-up stream.
    fn of(store: &Store, superseded: Superseded) -> StoreImage {
        let keys = (0..store.shard_count()).flat_map(|shard| store.shard_versions(shard, superseded)).collect();
        let pending = store.stale_pending(u64::MAX);
        let aborted = store.aborted_transactions();
        StoreImage { keys, pending, aborted }
    }
}

struct EntryWriter<W: Write> {
    out: W,
    scratch: Vec<u8>,
}

impl<W: Write> EntryWriter<W> {
    fn write_store(&mut self, image: &StoreImage, header: FileHeader) -> std::io::Result<SnapshotCounts> {
        self.out.write_all(&header.encode(SNAPSHOT_MAGIC))?;
        let mut counts = SnapshotCounts::default();
        for entry in &image.keys {
            self.entry(KIND_KEY, |encoder| {
                encoder.key(&entry.key);
                encoder.u64(entry.collected_max_ts);
                encoder.count(entry.versions.len());
            })?;
            for (version, committed) in &entry.versions {
                self.entry(KIND_VERSION, |encoder| {
                    encoder.u64(version.ts);
                    encoder.u8(u8::from(*committed));
                    version.metadata.as_wire().encode(encoder);
                    encoder.bytes(&version.value);
                    if version.expiry != Expiry::NEVER {
                        encoder.u64(version.expiry.to_word());
                    }
                })?;
            }
            counts.keys += 1;
            counts.versions += entry.versions.len() as u64;
        }
        for (ts, pending) in &image.pending {
            self.entry(KIND_PENDING, |encoder| {
                encoder.u64(*ts);
                pending.write_set.encode(encoder);
            })?;
            counts.pending += 1;
        }
        for &ts in &image.aborted {
            self.entry(KIND_ABORTED, |encoder| encoder.u64(ts))?;
            counts.aborted += 1;
        }
        self.entry(KIND_END, |encoder| {
            for count in [counts.keys, counts.versions, counts.pending, counts.aborted] {
                encoder.u64(count);
            }
        })?;
        Ok(counts)
    }

    fn entry(&mut self, kind: u8, fill: impl FnOnce(&mut Encoder<'_>)) -> std::io::Result<()> {
        self.scratch.clear();
        self.scratch.resize(ENTRY_HEADER_BYTES, 0);
        let mut encoder = Encoder::new(&mut self.scratch);
        encoder.u8(kind);
        fill(&mut encoder);
        let payload_bytes = self.scratch.len() - ENTRY_HEADER_BYTES;
        // The store holds only versions within the limits, so its entries fit the bound.
        assert!(payload_bytes <= SNAPSHOT_ENTRY_BYTES_MAX, "a snapshot entry over the entry bound");
        self.scratch[0..4].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
        let crc = entry_crc(&self.scratch);
        self.scratch[4..8].copy_from_slice(&crc.to_le_bytes());
        self.out.write_all(&self.scratch)
    }
}

fn entry_crc(entry: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&entry[0..4]), &entry[ENTRY_HEADER_BYTES..])
}

/// Loads the snapshot at `path` into `store` (which should be empty). On an error, `store`
/// may hold part of it: the caller clears it before trying anything else.
pub(crate) fn load(path: &Path, store: &Store, now_ms: u64) -> Result<LoadedSnapshot, DurableError> {
    let file = File::open(path).map_err(DurableError::io("open", path))?;
    load_entries(BufReader::with_capacity(SNAPSHOT_IO_BUFFER_BYTES, file), path, store, now_ms)
}

fn load_entries<R: Read>(input: R, path: &Path, store: &Store, now_ms: u64) -> Result<LoadedSnapshot, DurableError> {
    let started = Instant::now();
    let mut reader = EntryReader { input, path, offset: 0, payload: Vec::new() };
    let header = reader.header()?;
    let mut loader = Loader { store, now_ms, current: None, uncommitted: HashMap::new(), pending: Vec::new() };
    let mut found = SnapshotCounts::default();
    loop {
        let entry_offset = reader.offset;
        let damage =
            |cause: SnapshotDamage| DurableError::CorruptSnapshot { file: path.into(), offset: entry_offset, cause };
        let Some(kind) = reader.next_entry()? else {
            return Err(damage(SnapshotDamage::NoEnd));
        };
        let mut decoder = Decoder::new(&reader.payload[1..]);
        let decoded = match kind {
            KIND_END => {
                let counted = decode_counts(&mut decoder).map_err(|cause| damage(SnapshotDamage::Entry(cause)))?;
                loader.finish().map_err(damage)?;
                check_counts(counted, found).map_err(damage)?;
                let trailing = reader.remaining_bytes()?;
                if trailing > 0 {
                    return Err(damage(SnapshotDamage::TrailingBytes(trailing)));
                }
                let bytes = reader.offset;
                let duration_ms = started.elapsed().as_millis() as u64;
                let (lsn, epoch) = (header.lsn, header.epoch);
                return Ok(LoadedSnapshot { path: path.into(), lsn, epoch, counts: found, bytes, duration_ms });
            }
            kind => loader.entry(kind, &mut decoder, &mut found),
        };
        decoded.map_err(damage)?;
    }
}

fn decode_counts(decoder: &mut Decoder<'_>) -> Result<SnapshotCounts, RecordError> {
    let counts = SnapshotCounts {
        keys: decoder.u64()?,
        versions: decoder.u64()?,
        pending: decoder.u64()?,
        aborted: decoder.u64()?,
    };
    end(decoder)?;
    Ok(counts)
}

fn check_counts(counted: SnapshotCounts, found: SnapshotCounts) -> Result<(), SnapshotDamage> {
    let pairs = [
        ("keys", counted.keys, found.keys),
        ("versions", counted.versions, found.versions),
        ("pending transactions", counted.pending, found.pending),
        ("aborted transactions", counted.aborted, found.aborted),
    ];
    match pairs.into_iter().find(|(_, counted, found)| counted != found) {
        Some((what, counted, found)) => Err(SnapshotDamage::CountMismatch { what, counted, found }),
        None => Ok(()),
    }
}

struct EntryReader<'a, R: Read> {
    input: R,
    path: &'a Path,
    offset: u64,
    /// The current entry's payload (kind first).
    payload: Vec<u8>,
}

impl<R: Read> EntryReader<'_, R> {
    fn damage(&self, cause: SnapshotDamage) -> DurableError {
        DurableError::CorruptSnapshot { file: self.path.into(), offset: self.offset, cause }
    }

    fn header(&mut self) -> Result<FileHeader, DurableError> {
        let mut bytes = Vec::with_capacity(FILE_HEADER_BYTES);
        self.read_up_to(FILE_HEADER_BYTES, &mut bytes)?;
        let header =
            FileHeader::decode(&bytes, SNAPSHOT_MAGIC).map_err(|cause| self.damage(SnapshotDamage::Header(cause)))?;
        self.offset = FILE_HEADER_BYTES as u64;
        Ok(header)
    }

    /// Reads up to `length` bytes into `out` (fewer only at the end of the file). The buffer
    /// grows with the bytes read, never with a declared length.
    fn read_up_to(&mut self, length: usize, out: &mut Vec<u8>) -> Result<(), DurableError> {
        let path = self.path;
        (&mut self.input).take(length as u64).read_to_end(out).map_err(DurableError::io("read", path))?;
        Ok(())
    }

    /// Reads the next entry into `payload` and returns its kind; `None` at the end of the file.
    fn next_entry(&mut self) -> Result<Option<u8>, DurableError> {
        let mut header = Vec::with_capacity(ENTRY_HEADER_BYTES);
        self.read_up_to(ENTRY_HEADER_BYTES, &mut header)?;
        if header.is_empty() {
            return Ok(None);
        }
        if header.len() < ENTRY_HEADER_BYTES {
            let needed = ENTRY_HEADER_BYTES - header.len();
            return Err(self.damage(SnapshotDamage::Entry(RecordError::Truncated { needed })));
        }
        let payload_bytes = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if payload_bytes > SNAPSHOT_ENTRY_BYTES_MAX || payload_bytes == 0 {
            let cause = RecordError::PayloadTooLarge { length: payload_bytes, max: SNAPSHOT_ENTRY_BYTES_MAX };
            return Err(self.damage(SnapshotDamage::Entry(cause)));
        }
        let mut payload = std::mem::take(&mut self.payload);
        payload.clear();
        payload.extend_from_slice(&header);
        self.read_up_to(payload_bytes, &mut payload)?;
        let result = if payload.len() < ENTRY_HEADER_BYTES + payload_bytes {
            Err(RecordError::Truncated { needed: ENTRY_HEADER_BYTES + payload_bytes - payload.len() })
        } else {
            let stored = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            let computed = entry_crc(&payload);
            if stored == computed {
                Ok(())
            } else {
                Err(RecordError::ChecksumMismatch { stored, computed })
            }
        };
        payload.drain(..ENTRY_HEADER_BYTES);
        self.payload = payload;
        result.map_err(|cause| self.damage(SnapshotDamage::Entry(cause)))?;
        self.offset += (ENTRY_HEADER_BYTES + payload_bytes) as u64;
        Ok(Some(self.payload[0]))
    }

    /// Bytes left after the current position.
    fn remaining_bytes(&mut self) -> Result<u64, DurableError> {
        let path = self.path;
        std::io::copy(&mut self.input, &mut std::io::sink()).map_err(DurableError::io("read", path))
    }
}

/// Builds the store from entries as they come.
struct Loader<'a> {
    store: &'a Store,
    now_ms: u64,
    /// The key whose versions are being read, and how many are still to come.
    current: Option<(KeyVersions, u64)>,
    /// Uncommitted versions loaded, by transaction: where a pending transaction's keys are.
    uncommitted: HashMap<Timestamp, Vec<Key>>,
    /// Pending transactions, applied at END, once every version is in.
    pending: Vec<(Timestamp, WriteSet)>,
}

impl Loader<'_> {
    fn entry(&mut self, kind: u8, decoder: &mut Decoder<'_>, found: &mut SnapshotCounts) -> Result<(), SnapshotDamage> {
        if kind != KIND_VERSION {
            self.end_key()?;
        }
        match kind {
            KIND_KEY => {
                self.current = Some(read_key(decoder).map_err(SnapshotDamage::Entry)?);
                found.keys += 1;
            }
            KIND_VERSION => {
                let version = read_version(decoder).map_err(SnapshotDamage::Entry)?;
                match self.current.as_mut() {
                    Some((key_versions, remaining)) if *remaining > 0 => {
                        *remaining -= 1;
                        key_versions.versions.push(version);
                    }
                    _ => return Err(SnapshotDamage::VersionWithoutKey),
                }
                found.versions += 1;
            }
            KIND_PENDING => {
                self.pending.push(read_pending(decoder).map_err(SnapshotDamage::Entry)?);
                found.pending += 1;
            }
            KIND_ABORTED => {
                let ts = read_ts(decoder).and_then(|ts| end(decoder).map(|()| ts));
                self.store.restore_aborted(ts.map_err(SnapshotDamage::Entry)?, self.now_ms);
                found.aborted += 1;
            }
            other => return Err(SnapshotDamage::Entry(RecordError::UnknownKind(other))),
        }
        Ok(())
    }

    /// Stores the key being read, once all its versions are in.
    fn end_key(&mut self) -> Result<(), SnapshotDamage> {
        let Some((entry, remaining)) = self.current.take() else { return Ok(()) };
        if remaining != 0 {
            let found = entry.versions.len() as u64;
            return Err(SnapshotDamage::VersionCount { announced: found + remaining, found });
        }
        for (version, committed) in &entry.versions {
            if !committed {
                self.uncommitted.entry(version.ts).or_default().push(entry.key.clone());
            }
        }
        self.store.restore_key(entry, self.now_ms);
        Ok(())
    }

    /// At END: the last key, then the pending transactions on the prepared versions loaded.
    /// A prepared version whose transaction the snapshot did not list as pending (the copy
    /// caught the version before the pending entry) is named pending with the write set its
    /// metadata gives (or its keys here); the PREPARE record replayed after the snapshot
    /// replaces that with the record's own.
    fn finish(&mut self) -> Result<(), SnapshotDamage> {
        self.end_key()?;
        for (ts, write_set) in std::mem::take(&mut self.pending) {
            let keys = self.uncommitted.remove(&ts).unwrap_or_default();
            self.store.restore_pending(ts, keys, write_set, self.now_ms);
        }
        for (ts, keys) in std::mem::take(&mut self.uncommitted) {
            let version = self.store.get_at(&keys[0], ts).ok();
            let write_set = match version.as_ref().map(|version| &version.metadata) {
                Some(StoredMetadata::WriteSet(write_set)) => write_set.clone(),
                _ => WriteSet::from_keys(&keys).map_err(|error| SnapshotDamage::Entry(error.into()))?,
            };
            self.store.restore_pending(ts, keys, write_set, self.now_ms);
        }
        Ok(())
    }
}

/// A PENDING entry: the transaction and its write set.
fn read_pending(decoder: &mut Decoder<'_>) -> Result<(Timestamp, WriteSet), RecordError> {
    let ts = read_ts(decoder)?;
    let write_set = WriteSet::decode(decoder)?;
    end(decoder)?;
    Ok((ts, write_set))
}

/// A KEY entry: the key and how many VERSION entries follow.
fn read_key(decoder: &mut Decoder<'_>) -> Result<(KeyVersions, u64), RecordError> {
    let key = decoder.key()?.into_boxed_slice();
    let collected_max_ts = decoder.u64()?;
    let announced = u64::from(decoder.u32()?);
    end(decoder)?;
    Ok((KeyVersions { key, collected_max_ts, versions: Vec::new() }, announced))
}

/// Every byte of an entry must be consumed.
fn end(decoder: &Decoder<'_>) -> Result<(), RecordError> {
    match decoder.remaining().len() {
        0 => Ok(()),
        trailing => Err(WireError::TrailingBytes(trailing).into()),
    }
}

fn read_ts(decoder: &mut Decoder<'_>) -> Result<Timestamp, RecordError> {
    let ts = decoder.u64()?;
    if ts == TIMESTAMP_INITIAL {
        return Err(RecordError::Invalid("timestamp 0 is the initial value"));
    }
    Ok(ts)
}

fn read_version(decoder: &mut Decoder<'_>) -> Result<(Arc<Version>, bool), RecordError> {
    let ts = read_ts(decoder)?;
    let committed = match decoder.u8()? {
        0 => false,
        1 => true,
        _ => return Err(RecordError::Invalid("a committed flag other than 0 or 1")),
    };
    let metadata = stored_metadata(Metadata::decode(decoder)?);
    let value = decoder.value()?.into_boxed_slice();
    let expiry = match decoder.remaining().is_empty() {
        true => Expiry::NEVER,
        false => match Expiry::from_word(decoder.u64()?) {
            Expiry::NEVER => return Err(RecordError::Invalid("a version's expiry written as 0")),
            expiry => expiry,
        },
    };
    end(decoder)?;
    Ok((Arc::new(Version { ts, value, metadata, expiry }), committed))
}

#[cfg(test)]
mod tests;
