//! A backup's copies of its primaries' stores, and the stream it reads them from (the
//! replication port's connection and, one-sided, the log region).
//!
//! # Contract
//! - A backup keeps one separate [`Store`] per primary it backs up ([`BackupStore`]): a backup
//!   copy never mixes with the partitions the server itself serves, is never served to clients,
//!   and is not touched by the server's recovery resolver (the primary's own records decide its
//!   in-doubt transactions).

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rampkv_core::limits::{REPLICATION_APPLY_POLL_US, REPLICATION_IO_TIMEOUT_MS, REPLICATION_READ_BYTES};
use rampkv_core::storage::{Store, SweepCursor};

use super::super::durable::{CopyJournal, DurabilityConfig};
use super::log_region::{LogError, LogReceiver};
use super::BackupRefusal;
use crate::auth::SharedSecret;

/// A backup's copy of one primary's store.
#[derive(Debug)]
pub struct BackupStore {
    pub(super) primary: u16,
    pub(super) store: Store,
    /// The last record applied.
    pub(super) applied: AtomicU64,
    /// The newest epoch a hello of this primary carried: older ones are refused.
    pub(super) epoch: AtomicU64,
    /// Held by the connection that streams into it (one at a time).
    pub(super) streaming: Mutex<()>,
    /// This server took the copy over (failover): no record of the primary is applied again.
    pub(super) fenced: AtomicBool,
    pub(super) sweep: Mutex<(SweepCursor, u64)>,
    /// The identity of the primary's stream it is a prefix of (0: none yet, or a snapshot is
    /// being loaded into it).
    pub(super) stream: AtomicU64,
    /// Its files, when the backup has a data directory.
    pub(super) journal: Mutex<Option<CopyJournal>>,
}

impl BackupStore {
    /// The primary it copies.
    pub fn primary(&self) -> u16 {
        self.primary
    }

    /// The copy.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The last record applied.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// The newest epoch its primary's stream carried.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
}

/// A backup's copies of one primary's store.
#[derive(Default)]
pub(super) struct Copies {
    /// The copy that holds every record the primary acknowledged (an in-sync backup's): the
    /// one a failover takes over.
    pub(super) current: Option<Arc<BackupStore>>,
    /// A copy catching up (a snapshot, then records), current once the primary's in-sync
    /// marker arrives.
    pub(super) staging: Option<Arc<BackupStore>>,
}

impl BackupStore {
    pub(super) fn new(primary: u16, epoch: u64, gc_grace_ms: u64) -> BackupStore {
        BackupStore {
            primary,
            store: Store::new(gc_grace_ms),
            applied: AtomicU64::new(0),
            epoch: AtomicU64::new(epoch),
            streaming: Mutex::new(()),
            fenced: AtomicBool::new(false),
            sweep: Mutex::new((SweepCursor::default(), 0)),
            stream: AtomicU64::new(0),
            journal: Mutex::new(None),
        }
    }
}

/// Where a backup keeps its copies on disk, and how.
#[derive(Debug, Clone)]
pub struct CopyPersistence {
    /// `copies` in the server's data directory.
    pub root: std::path::PathBuf,
    pub config: DurabilityConfig,
    /// The server restarted into a running cluster: the copies found are loaded (their primaries
    /// may send only what they missed). Otherwise (the cluster starts) they are removed: every
    /// primary's stream is new.
    pub restore: bool,
    /// The server resumes its roles from its data directory (`server::resume`): of each
    /// primary, the restored copy marked current last is its current copy again (what a
    /// failover takes over). Such a copy is only that: a catching-up stream of its primary
    /// never continues in it (it could overwrite or fence the copy a failover would take), it
    /// makes a fresh copy, which replaces it once in sync. A rejoining server makes no restored
    /// copy current (it is a backup of nothing until it caught up).
    pub resume_current: bool,
}

/// What a backup service did since it started.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct BackupStats {
    /// Records applied to a backup copy.
    pub records_applied: u64,
    /// Records the copy refused as its primary's store did (a PREPARE of an aborted
    /// transaction): applied as refusals, not damage.
    pub records_refused: u64,
    /// Connections refused or closed on bad input (each logged with its reason).
    pub connections_refused: u64,
}

pub(super) struct BackupShared {
    pub(super) gc_grace_ms: u64,
    pub(super) persistence: Option<CopyPersistence>,
    /// Copies loaded from the data directory at start, not caught up yet.
    pub(super) restored: Mutex<Vec<Arc<BackupStore>>>,
    pub(super) secret: Option<Arc<SharedSecret>>,
    pub(super) clock: Instant,
    pub(super) stores: Mutex<HashMap<u16, Copies>>,
    pub(super) stop: AtomicBool,
    pub(super) connections: AtomicUsize,
    pub(super) open: Mutex<HashMap<u64, TcpStream>>,
    pub(super) next_connection: AtomicU64,
    pub(super) stats: Mutex<BackupStats>,
    /// Why a copy could not be kept on disk (with persistence), if one could not: the backup
    /// acknowledges only what its copy's files hold, so the server must stop
    /// (`BackupService::failure`).
    pub(super) failure: OnceLock<String>,
}

impl BackupShared {
    /// The copy of `primary` could not be kept on disk: noted for the server (which stops),
    /// and returned as the refusal that closes the stream.
    pub(super) fn copy_failed(&self, primary: u16, cause: impl std::fmt::Display) -> BackupRefusal {
        let cause = cause.to_string();
        let _ = self.failure.set(format!("the copy of primary {primary}: {cause}"));
        BackupRefusal::CopyNotKept { primary, cause }
    }
}

/// What a backup has read of a primary's stream and not consumed yet.
pub(super) struct Incoming {
    pub(super) bytes: Vec<u8>,
    pub(super) start: usize,
}

impl Incoming {
    pub(super) fn pending(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    pub(super) fn consume(&mut self, count: usize) {
        self.start += count;
        if self.start == self.bytes.len() {
            self.bytes.clear();
            self.start = 0;
        }
    }

    /// Reads until at least `needed` bytes are pending (each read bounded by the socket's
    /// timeout, after which the stop flag is looked at), taking whatever else has arrived.
    /// Returns false when the primary closed the stream with nothing pending (a clean end:
    /// it stopped); a close inside a frame is an error.
    pub(super) fn fill(
        &mut self,
        shared: &BackupShared,
        fenced: Option<&AtomicBool>,
        stream: &mut PrimaryStream,
        needed: usize,
    ) -> std::io::Result<bool> {
        if self.start > 0 && self.bytes.len() - self.start < needed {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        while self.bytes.len() - self.start < needed {
            if shared.stop.load(Ordering::Acquire) {
                return Err(std::io::Error::new(ErrorKind::Interrupted, "backup service stopped"));
            }
            if fenced.is_some_and(|fenced| fenced.load(Ordering::Acquire)) && !stream.close_for_takeover() {
                return Err(std::io::Error::new(ErrorKind::Interrupted, "the primary was failed over"));
            }
            let end = self.bytes.len();
            let room = (needed - (end - self.start)).max(REPLICATION_READ_BYTES);
            self.bytes.resize(end + room, 0);
            match stream.read(&mut self.bytes[end..]) {
                Ok(0) => {
                    self.bytes.truncate(end);
                    if self.start == self.bytes.len() {
                        return Ok(false);
                    }
                    return Err(ErrorKind::UnexpectedEof.into());
                }
                Ok(read) => self.bytes.truncate(end + read),
                Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    self.bytes.truncate(end);
                }
                Err(error) => {
                    self.bytes.truncate(end);
                    return Err(error);
                }
            }
        }
        Ok(true)
    }
}

/// A primary's stream as a backup reads it: the replication port's connection and, one-sided,
/// the log region the stream arrives in. Answers and acknowledgements go on the connection.
pub(super) struct PrimaryStream {
    pub(super) control: TcpStream,
    pub(super) log: Option<LogReceiver>,
}

impl PrimaryStream {
    /// The primary was failed over. One-sided: closes the log region (a write landing from now
    /// on is not held) and returns true, as what landed before may be held and must still be
    /// read and applied (reads then stop once the region is drained). TCP: false, the stream
    /// stops here (nothing unapplied was acknowledged).
    fn close_for_takeover(&mut self) -> bool {
        match &mut self.log {
            Some(log) => {
                log.close();
                true
            }
            None => false,
        }
    }

    pub(super) fn one_sided(&self) -> bool {
        self.log.is_some()
    }

    /// One-sided: whether the primary closed the connection (looked at without waiting).
    fn control_gone(&mut self) -> std::io::Result<bool> {
        self.control.set_nonblocking(true)?;
        let read = self.control.read(&mut [0u8; 64]);
        self.control.set_nonblocking(false)?;
        Ok(match read {
            Ok(0) => true,
            Ok(_) => false, // nothing is expected on it; ignored
            Err(error) => !matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        })
    }
}

impl Read for PrimaryStream {
    /// TCP: the connection. One-sided: the log region, looked at every
    /// `REPLICATION_APPLY_POLL_US` for at most one read timeout (`WouldBlock` then); the end of
    /// the stream once the primary closed the connection and everything that had landed was
    /// read; `Interrupted` once a region closed for a takeover is drained.
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let Some(log) = &mut self.log else { return self.control.read(out) };
        let invalid = |error: LogError| std::io::Error::new(ErrorKind::InvalidData, error);
        let deadline = Instant::now() + Duration::from_millis(REPLICATION_IO_TIMEOUT_MS);
        loop {
            let read = log.read(out).map_err(invalid)?;
            if read > 0 {
                return Ok(read);
            }
            if log.is_closed() {
                return Err(std::io::Error::new(
                    ErrorKind::Interrupted,
                    "the primary was failed over (its log is drained)",
                ));
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(REPLICATION_APPLY_POLL_US));
        }
        if self.control_gone()? {
            // What landed before the primary went is held: it is read before the end.
            return match &mut self.log {
                Some(log) => log.read(out).map_err(invalid),
                None => Ok(0),
            };
        }
        Err(ErrorKind::WouldBlock.into())
    }
}

impl Drop for PrimaryStream {
    /// The region closes before the connection does: a primary that sees the connection end
    /// has had every later write refused as not held.
    fn drop(&mut self) {
        if let Some(log) = &mut self.log {
            log.close();
        }
    }
}

impl Write for PrimaryStream {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.control.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.control.flush()
    }
}
