//! Rejoin: a backup that catches up ([`Replicator::add_catch_up`]).
//!
//! # Contract
//! A server the configuration names catching up for partitions of this primary (a restarted
//! server, or one that takes the place of a failed backup) gets a new link whose hello asks
//! for a fresh copy. Under the sequencer lock the link joins the others at point `N` (the next
//! sequence number): every record from `N` on is queued to it, and every record before `N` was
//! applied to the store before it was appended. The link's writer then sends a *snapshot*
//! marker and a snapshot of the store (`rampkv_durable::snapshot::write_to`: header with the
//! epoch and `N - 1`, CRC32C per entry, counts at the end), in chunks, and then the records
//! from `N`. The copy may already reflect some records from `N` on (the store kept changing
//! while it was copied); applying them again leaves the same store (the log's replay rule).
//! Until the backup acknowledged the snapshot its link does not hold replies. Then, under the
//! sequencer lock, it starts to (from the next record on: *counted*) and the primary notes the
//! last record `M` appended so far; once the backup acknowledged `M` it holds every record a
//! reply was released for and no reply goes out without it: the primary sends an *in-sync*
//! marker, the backup makes the copy its current one for this primary (a copy it held before
//! stays current until then, so a failover meanwhile takes a complete copy) and acknowledges
//! the marker, and only then does the primary report the backup caught up to the
//! configuration service ([`Replicator::in_sync`], read by the failover thread). A link that
//! fails before it is counted holds nothing and is replaced; once counted it is failed for
//! good, as any other.

use std::io::{ErrorKind, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_core::limits::{REPLICATION_SNAPSHOT_CHUNK_BYTES, REPLICATION_SNAPSHOT_WAIT_MS_MAX};

use super::copy::{BackupShared, BackupStore, Incoming, PrimaryStream};
use super::primary::{CatchUp, Replicator, Shared, MARKER_ACKNOWLEDGED};
use super::wire::{encode_marker, u32_at, MARKER_SNAPSHOT};
use super::{BackupRefusal, ReplicationError};

impl Replicator {
    /// Whether catching-up `backup` (process `incarnation`) has a catch-up link opened in
    /// epoch `since` or later that has not failed (the failover thread opens one otherwise).
    pub fn has_catch_up_link(&self, backup: usize, incarnation: u64, since: u64) -> bool {
        self.shared.links.read().iter().any(|link| link.catches_up(backup, incarnation, since))
    }

    /// Whether the link to in-sync `backup` (process `incarnation`) failed while it still holds
    /// replies (counted, not removed): the configuration still counts that backup, which
    /// restarted and resumed its roles, or whose connection broke. Failover opens a catch-up
    /// link to it, which retires the failed one once in sync ([`Replicator::in_sync`]).
    pub fn has_failed_link(&self, backup: usize, incarnation: u64) -> bool {
        self.shared.links.read().iter().any(|link| {
            link.backup == backup
                && link.incarnation == incarnation
                && link.counted.load(Ordering::Acquire)
                && !link.removed.load(Ordering::Acquire)
                && link.failed()
        })
    }

    /// Whether catching-up `backup` (process `incarnation`) is in sync through a catch-up link
    /// opened in epoch `since` or later: it holds every record a reply was released for, no
    /// reply goes out without it, and it made that copy its current one (module
    /// docs). The configuration may then count it as a backup. The older links to that
    /// backup are retired then (the copies they fed are no longer its current one).
    pub fn in_sync(&self, backup: usize, incarnation: u64, since: u64) -> bool {
        let links = self.shared.links.read();
        let synced = links.iter().find(|link| {
            link.catches_up(backup, incarnation, since)
                && link.counted.load(Ordering::Acquire)
                && link
                    .catch_up
                    .as_ref()
                    .is_some_and(|catch_up| catch_up.marker.load(Ordering::Acquire) == MARKER_ACKNOWLEDGED)
        });
        let Some(synced) = synced else { return false };
        for older in links.iter().filter(|older| older.backup == backup && !Arc::ptr_eq(older, synced)) {
            if !older.removed.swap(true, Ordering::AcqRel) {
                let error = ReplicationError::Superseded { backup: older.backup, address: older.address.clone() };
                older.fail(error, &self.shared);
            }
        }
        drop(links);
        self.shared.wake();
        true
    }
}

/// A catching-up backup's snapshot: the marker, then the store in the snapshot file format,
/// in chunks, then the empty chunk.
pub(super) fn send_snapshot(shared: &Shared, catch_up: &CatchUp, stream: &mut impl Write) -> std::io::Result<()> {
    let Some(core) = shared.source.get() else {
        return Err(std::io::Error::other("no store to take a snapshot of"));
    };
    let epoch = shared.epoch.load(Ordering::Acquire);
    stream.write_all(&encode_marker(MARKER_SNAPSHOT, catch_up.point, epoch))?;
    let mut chunks = ChunkWriter { stream, buffer: Vec::with_capacity(REPLICATION_SNAPSHOT_CHUNK_BYTES) };
    let counts = rampkv_durable::snapshot::write_to(&mut chunks, core.store(), catch_up.point - 1, epoch)?;
    chunks.stream.write_all(&0u32.to_le_bytes())?;
    let mut stats = shared.stats.lock();
    stats.catch_up_snapshots += 1;
    stats.catch_up_snapshot_versions += counts.versions;
    drop(stats);
    log::warn!(
        "replication: primary {} sent a catching-up backup its snapshot at record {} ({} keys, {} versions)",
        shared.primary,
        catch_up.point - 1,
        counts.keys,
        counts.versions
    );
    Ok(())
}

/// Cuts what is written into chunks of at most `REPLICATION_SNAPSHOT_CHUNK_BYTES`, each sent
/// after its length.
struct ChunkWriter<'a, W: Write> {
    stream: &'a mut W,
    buffer: Vec<u8>,
}

impl<W: Write> Write for ChunkWriter<'_, W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let room = REPLICATION_SNAPSHOT_CHUNK_BYTES - self.buffer.len();
        let taken = bytes.len().min(room);
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == REPLICATION_SNAPSHOT_CHUNK_BYTES {
            self.flush()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buffer.is_empty() {
            self.stream.write_all(&(self.buffer.len() as u32).to_le_bytes())?;
            self.stream.write_all(&self.buffer)?;
            self.buffer.clear();
        }
        Ok(())
    }
}

/// Loads the snapshot that follows a snapshot marker into a fresh copy: everything up to
/// record `covers` (the snapshot's header must say so).
pub(super) fn receive_snapshot(
    shared: &BackupShared,
    copy: &BackupStore,
    incoming: &mut Incoming,
    stream: &mut PrimaryStream,
    covers: u64,
) -> Result<(), BackupRefusal> {
    let primary = copy.primary;
    let started = Instant::now();
    let mut reader = SnapshotReader {
        incoming,
        shared,
        fenced: &copy.fenced,
        stream,
        chunk_left: 0,
        ended: false,
        deadline: started + Duration::from_millis(REPLICATION_SNAPSHOT_WAIT_MS_MAX),
        refusal: None,
        primary,
    };
    let source = std::path::PathBuf::from(format!("the replication stream of primary {primary}"));
    let now_ms = shared.clock.elapsed().as_millis() as u64;
    let loaded = rampkv_durable::snapshot::load_from(&mut reader, &source, &copy.store, now_ms);
    if let Some(refusal) = reader.refusal.take() {
        return Err(refusal);
    }
    let loaded = loaded.map_err(|cause| BackupRefusal::BadSnapshot { primary, cause })?;
    if loaded.lsn != covers {
        return Err(BackupRefusal::BadMarker { primary });
    }
    copy.applied.store(covers, Ordering::Release);
    log::warn!(
        "replication: loaded a snapshot of primary {primary} at record {covers} ({} keys, {} versions) in {} ms",
        loaded.counts.keys,
        loaded.counts.versions,
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The snapshot's bytes out of its chunks (`wire` module docs): reads end at the empty chunk.
struct SnapshotReader<'a> {
    incoming: &'a mut Incoming,
    shared: &'a BackupShared,
    fenced: &'a AtomicBool,
    stream: &'a mut PrimaryStream,
    chunk_left: usize,
    ended: bool,
    deadline: Instant,
    /// Why reading stopped, when it was the stream's fault rather than the snapshot's.
    refusal: Option<BackupRefusal>,
    primary: u16,
}

impl SnapshotReader<'_> {
    fn refuse(&mut self, refusal: BackupRefusal) -> std::io::Error {
        let error = std::io::Error::new(ErrorKind::InvalidData, refusal.to_string());
        self.refusal = Some(refusal);
        error
    }
}

impl Read for SnapshotReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.ended || out.is_empty() {
            return Ok(0);
        }
        if Instant::now() > self.deadline {
            let primary = self.primary;
            return Err(
                self.refuse(BackupRefusal::SnapshotTooSlow { primary, waited_ms: REPLICATION_SNAPSHOT_WAIT_MS_MAX })
            );
        }
        if self.chunk_left == 0 {
            if !self.incoming.fill(self.shared, Some(self.fenced), self.stream, 4)? {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            let length = u32_at(self.incoming.pending(), 0) as usize;
            self.incoming.consume(4);
            if length == 0 {
                self.ended = true;
                return Ok(0);
            }
            if length > REPLICATION_SNAPSHOT_CHUNK_BYTES {
                let (primary, max) = (self.primary, REPLICATION_SNAPSHOT_CHUNK_BYTES);
                return Err(self.refuse(BackupRefusal::SnapshotChunk { primary, length, max }));
            }
            self.chunk_left = length;
        }
        if self.incoming.pending().is_empty() && !self.incoming.fill(self.shared, Some(self.fenced), self.stream, 1)? {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let count = out.len().min(self.chunk_left).min(self.incoming.pending().len());
        out[..count].copy_from_slice(&self.incoming.pending()[..count]);
        self.incoming.consume(count);
        self.chunk_left -= count;
        Ok(count)
    }
}
