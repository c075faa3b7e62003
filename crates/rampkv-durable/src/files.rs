//! The data directory: file names, the 32-byte file header of segments and snapshots, the
//! directory lock and directory fsync.
//!
//! # File header (32 bytes, little-endian)
//! ```text
//! 0  [u8; 8] magic     "RKVLOG\0\0" (log segment) or "RKVSNAP\0" (snapshot)
//! 8  u32     version   FORMAT_VERSION
//! 12 u32     crc32c    CRC32C of bytes [0, 12) then [16, 32)
//! 16 u64     lsn       segment: the LSN of its first record; snapshot: the last LSN it covers
//! 24 u64     epoch     the configuration epoch when the file was started
//! ```
//!
//! # Names
//! `segment-<first LSN, 20 digits>.log` (allocated as `segment-next.log.tmp`, or recycled
//! from `segment-recycled.log.tmp`, then renamed), `snapshot-<LSN, 20 digits>.snap` (written
//! as `….snap.tmp`, then renamed), `LOCK`. Zero-padded numbers sort as text in LSN order.
//! Other files are left alone.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use fs4::FileExt;

use crate::error::{DurableError, FileHeaderError};
use crate::limits::LOCK_HOLDER_BYTES_MAX;
use crate::record::Lsn;

/// Bytes of a segment's or snapshot's file header.
pub const FILE_HEADER_BYTES: usize = 32;

/// The format version this build writes. Version 2 (expiry): log records and snapshot
/// VERSION entries may end with an expiry (docs/persistence.md); a build that predates it
/// refuses such files by this number, before it meets a record it would take for damage.
pub const FORMAT_VERSION: u32 = 2;

/// The oldest format version this build reads: version 1 files are version 2 files in which
/// nothing expires, byte for byte.
pub const FORMAT_VERSION_OLDEST: u32 = 1;

/// Magic bytes of a log segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"RKVLOG\0\0";

/// Magic bytes of a snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"RKVSNAP\0";

const SEGMENT_PREFIX: &str = "segment-";
const SEGMENT_SUFFIX: &str = ".log";
const SNAPSHOT_PREFIX: &str = "snapshot-";
const SNAPSHOT_SUFFIX: &str = ".snap";
const TEMPORARY_SUFFIX: &str = ".tmp";
pub(crate) const LOCK_FILE: &str = "LOCK";

/// A decoded file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub lsn: Lsn,
    pub epoch: u64,
}

impl FileHeader {
    /// The header's bytes, with `magic`.
    pub fn encode(&self, magic: [u8; 8]) -> [u8; FILE_HEADER_BYTES] {
        let mut bytes = [0u8; FILE_HEADER_BYTES];
        bytes[0..8].copy_from_slice(&magic);
        bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.lsn.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        let crc = header_crc(&bytes);
        bytes[12..16].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Checks and decodes the header at the start of `bytes`, which must carry `magic`.
    pub fn decode(bytes: &[u8], magic: [u8; 8]) -> Result<FileHeader, FileHeaderError> {
        let Some(bytes) = bytes.get(..FILE_HEADER_BYTES) else {
            return Err(FileHeaderError::Short { length: bytes.len() as u64, expected: FILE_HEADER_BYTES });
        };
        if bytes[0..8] != magic {
            return Err(FileHeaderError::Magic);
        }
        let word =
            |range: std::ops::Range<usize>| bytes[range].iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        let version = word(8..12) as u32;
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
            return Err(FileHeaderError::Version(version));
        }
        if word(12..16) as u32 != header_crc(bytes) {
            return Err(FileHeaderError::Checksum);
        }
        Ok(FileHeader { lsn: word(16..24), epoch: word(24..32) })
    }
}

fn header_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&bytes[0..12]), &bytes[16..FILE_HEADER_BYTES])
}

/// The path of the segment whose first record has `first_lsn`.
pub fn segment_path(dir: &Path, first_lsn: Lsn) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}{first_lsn:020}{SEGMENT_SUFFIX}"))
}

/// The path of the snapshot covering the log up to `lsn`.
pub fn snapshot_path(dir: &Path, lsn: Lsn) -> PathBuf {
    dir.join(format!("{SNAPSHOT_PREFIX}{lsn:020}{SNAPSHOT_SUFFIX}"))
}

/// The allocated file the log prepares as its next segment (renamed to the segment's name when
/// the log moves to it; a leftover is deleted at start, as a snapshot's temporary file).
pub fn prepared_segment_path(dir: &Path) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}next{SEGMENT_SUFFIX}{TEMPORARY_SUFFIX}"))
}

/// A segment a snapshot covers, kept to become a later segment instead of being deleted: its
/// pages are still in the page cache and its blocks written, so the log writes over them
/// without allocating either (recovery: `Replay::stale_tail`). Deleted at start.
pub fn recycled_segment_path(dir: &Path) -> PathBuf {
    dir.join(format!("{SEGMENT_PREFIX}recycled{SEGMENT_SUFFIX}{TEMPORARY_SUFFIX}"))
}

/// Where a snapshot is written before it is complete.
pub fn temporary_snapshot_path(dir: &Path, lsn: Lsn) -> PathBuf {
    dir.join(format!("{SNAPSHOT_PREFIX}{lsn:020}{SNAPSHOT_SUFFIX}{TEMPORARY_SUFFIX}"))
}

/// The files of a data directory, by kind, each list in LSN order.
#[derive(Debug, Default)]
pub struct DirListing {
    pub segments: Vec<(Lsn, PathBuf)>,
    pub snapshots: Vec<(Lsn, PathBuf)>,
    pub temporaries: Vec<PathBuf>,
    /// A allocated segment prepared and not used (it holds no record).
    pub prepared_segment: Option<PathBuf>,
    /// A segment kept for reuse (its records were covered by a snapshot).
    pub recycled_segment: Option<PathBuf>,
}

/// Lists `dir`.
pub fn list(dir: &Path) -> Result<DirListing, DurableError> {
    let mut listing = DirListing::default();
    let entries = std::fs::read_dir(dir).map_err(DurableError::io("list", dir))?;
    for entry in entries {
        let entry = entry.map_err(DurableError::io("list", dir))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        if entry.path() == prepared_segment_path(dir) {
            listing.prepared_segment = Some(entry.path());
        } else if entry.path() == recycled_segment_path(dir) {
            listing.recycled_segment = Some(entry.path());
        } else if name.starts_with(SNAPSHOT_PREFIX) && name.ends_with(TEMPORARY_SUFFIX) {
            listing.temporaries.push(entry.path());
        } else if let Some(lsn) = numbered(&name, SEGMENT_PREFIX, SEGMENT_SUFFIX) {
            listing.segments.push((lsn, entry.path()));
        } else if let Some(lsn) = numbered(&name, SNAPSHOT_PREFIX, SNAPSHOT_SUFFIX) {
            listing.snapshots.push((lsn, entry.path()));
        }
    }
    listing.segments.sort();
    listing.snapshots.sort();
    Ok(listing)
}

fn numbered(name: &str, prefix: &str, suffix: &str) -> Option<Lsn> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Makes the directory's entries (created, renamed, removed files) durable.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    fsync_dir(dir).map_err(DurableError::io("fsync directory", dir))
}

/// [`sync_dir`] for a caller that reports `std::io::Error`s.
pub(crate) fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir).and_then(|handle| handle.sync_all())
}

/// The exclusive lock on a data directory, held while the value lives (the kernel releases it
/// when the process dies, however it dies).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock on `dir` (creating `dir/LOCK`), and writes this process's id into it so
    /// that a second opener's error names the holder.
    pub fn acquire(dir: &Path) -> Result<DirLock, DurableError> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(DurableError::io("open", &path))?;
        if let Err(error) = FileExt::try_lock(&file) {
            return match error {
                fs4::TryLockError::WouldBlock => {
                    Err(DurableError::Locked { dir: dir.to_path_buf(), holder_pid: read_holder(&mut file) })
                }
                fs4::TryLockError::Error(source) => Err(DurableError::Io { action: "lock", path, source }),
            };
        }
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.write_all(pid.as_bytes()))
            .and_then(|()| file.flush())
            .map_err(DurableError::io("write", &path))?;
        Ok(DirLock { _file: file })
    }
}

fn read_holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.take(LOCK_HOLDER_BYTES_MAX).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_every_damage_is_named() {
        let header = FileHeader { lsn: 42, epoch: 7 };
        let bytes = header.encode(SEGMENT_MAGIC);
        assert_eq!(FileHeader::decode(&bytes, SEGMENT_MAGIC), Ok(header));
        assert_eq!(FileHeader::decode(&bytes, SNAPSHOT_MAGIC), Err(FileHeaderError::Magic));
        assert!(matches!(FileHeader::decode(&bytes[..31], SEGMENT_MAGIC), Err(FileHeaderError::Short { .. })));
        let mut damaged = bytes;
        damaged[20] ^= 1;
        assert_eq!(FileHeader::decode(&damaged, SEGMENT_MAGIC), Err(FileHeaderError::Checksum));
        let mut future = bytes;
        future[8] = 9;
        assert_eq!(FileHeader::decode(&future, SEGMENT_MAGIC), Err(FileHeaderError::Version(9)));
    }

    #[test]
    fn names_sort_in_lsn_order_and_other_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        for lsn in [100, 7, 12_345_678_901] {
            std::fs::write(segment_path(dir.path(), lsn), b"").unwrap();
        }
        std::fs::write(snapshot_path(dir.path(), 9), b"").unwrap();
        std::fs::write(temporary_snapshot_path(dir.path(), 11), b"").unwrap();
        std::fs::write(dir.path().join("segment-12.log"), b"").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        let listing = list(dir.path()).unwrap();
        let lsns: Vec<Lsn> = listing.segments.iter().map(|(lsn, _)| *lsn).collect();
        assert_eq!(lsns, [7, 100, 12_345_678_901]);
        assert_eq!(listing.snapshots.len(), 1);
        assert_eq!(listing.snapshots[0].0, 9);
        assert_eq!(listing.temporaries.len(), 1);
    }

    #[test]
    fn a_second_lock_on_a_directory_is_refused_with_the_holder_named_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        match DirLock::acquire(dir.path()) {
            Err(DurableError::Locked { dir: named, holder_pid }) => {
                assert_eq!(named, dir.path());
                assert_eq!(holder_pid, Some(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
