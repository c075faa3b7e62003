//! The error type of the persistence layer.

use std::path::PathBuf;

use rampkv_core::storage::StoreError;

use crate::record::{Lsn, RecordError};

/// Why opening, appending, snapshotting or recovering failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableError {
    #[error(
        "data directory {dir} is in use by another process{}",
        .holder_pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    Locked { dir: PathBuf, holder_pid: Option<u32> },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{file}: damaged log record at byte offset {offset} (LSN {lsn}): {cause}; a later record shows it had \
         been fsynced, so this is not a torn write; open with truncate_corrupt to drop the log from there"
    )]
    CorruptLog { file: PathBuf, offset: u64, lsn: Lsn, cause: RecordError },
    #[error("{file}: record at byte offset {offset} has LSN {found}, expected {expected}")]
    LsnOutOfOrder { file: PathBuf, offset: u64, expected: Lsn, found: Lsn },
    #[error("{file}: damaged segment header: {cause}")]
    BadSegmentHeader { file: PathBuf, cause: FileHeaderError },
    #[error("log records {first} to {last} are missing (the log resumes in {file})")]
    MissingRecords { first: Lsn, last: Lsn, file: PathBuf },
    #[error("{file}: record at byte offset {offset} (LSN {lsn}) cannot be replayed: {cause}")]
    ReplayRefused { file: PathBuf, offset: u64, lsn: Lsn, cause: StoreError },
    #[error("{file}: damaged snapshot at byte offset {offset}: {cause}")]
    CorruptSnapshot { file: PathBuf, offset: u64, cause: SnapshotDamage },
    #[error("{}: holds a log or a snapshot already", dir.display())]
    DirectoryNotEmpty { dir: PathBuf },
    #[error("recovery needs an empty store")]
    StoreNotEmpty,
    #[error("invalid record: {0}")]
    InvalidRecord(#[from] RecordError),
    #[error("log full: {waiting_bytes} bytes wait to be written (at most {max}); flush, then retry")]
    LogFull { waiting_bytes: usize, max: usize },
    #[error("log stopped after a failure ({action} {path}: {message}); nothing more is made durable")]
    LogFailed { action: &'static str, path: PathBuf, message: String },
    #[error("LSN {lsn} not durable within {timeout_ms} ms (durable up to {durable_lsn})")]
    DurableTimeout { lsn: Lsn, durable_lsn: Lsn, timeout_ms: u64 },
    #[error("LSN {lsn} was never appended (the last is {last_lsn})")]
    NotAppended { lsn: Lsn, last_lsn: Lsn },
    #[error("a snapshot is already being written")]
    SnapshotInProgress,
    #[error("the snapshot thread stopped unexpectedly")]
    SnapshotThreadLost,
}

/// What is wrong with a segment's or a snapshot's file header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileHeaderError {
    #[error("shorter than its {expected}-byte header ({length} bytes)")]
    Short { length: u64, expected: usize },
    #[error("wrong magic bytes")]
    Magic,
    #[error("unsupported format version {0}")]
    Version(u32),
    #[error("header checksum mismatch")]
    Checksum,
    #[error("the header says LSN {in_header}, the file name {in_name}")]
    NameMismatch { in_header: Lsn, in_name: Lsn },
}

/// What is wrong inside a snapshot file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotDamage {
    #[error("file header: {0}")]
    Header(FileHeaderError),
    #[error("entry: {0}")]
    Entry(RecordError),
    #[error("the file ends before its END entry")]
    NoEnd,
    #[error("{0} bytes after the END entry")]
    TrailingBytes(u64),
    #[error("{what}: the END entry counts {counted}, the file holds {found}")]
    CountMismatch { what: &'static str, counted: u64, found: u64 },
    #[error("a version entry before any key entry")]
    VersionWithoutKey,
    #[error("a key entry announces {announced} versions, {found} follow")]
    VersionCount { announced: u64, found: u64 },
}

impl DurableError {
    /// An I/O error while doing `action` on `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> DurableError {
        let path = path.into();
        move |source| DurableError::Io { action, path, source }
    }
}
