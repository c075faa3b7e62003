//! The Raft state of one configuration-service node on disk: hard state, log entries, the
//! snapshot and whether the node votes, in one redb file, `DIR/raft.redb`.
//!
//! # Contract
//! - Every change is one redb write transaction committed with `Durability::Immediate`: when
//!   [`DiskState::write`] returns `Ok`, the change is on disk (redb's commit ends with an fsync),
//!   and a crash at any point leaves the file holding the whole change or none of it. The
//!   caller (`storage::RaftStore`) writes before it changes its memory, and the core sends
//!   nothing that depends on a change before the write returned (Raft's rule: term, vote and
//!   log are stable before the messages that reveal them leave).
//! - Bounded: the log holds the entries not yet compacted (`CONFIG_LOG_ENTRIES_KEPT_MAX`
//!   applied ones and those in flight), the snapshot is one configuration (a few bytes a
//!   partition), and redb reuses the pages that compaction frees, so the file does not grow
//!   with the length of the run. Its cache is `CONFIG_STATE_CACHE_BYTES`.
//! - Exclusive: redb locks the file (flock), so a second process on the same directory is
//!   refused with an error naming the file.
//!
//! # Layout (redb tables)
//! - `entries`: Raft index (u64) -> value of a protobuf `Entry` (its own index inside).
//! - `meta`: name -> value: `format` (u32 LE, [`crate::limits::STATE_FORMAT`]), `hard_state` (protobuf
//!   `HardState`), `snapshot_metadata` (protobuf `SnapshotMetadata`, with the voters),
//!   `snapshot_data` (the encoded `Configuration` at the snapshot's index), `votes` (one byte,
//!   1: the node votes; 0: a rejoining node that has not caught up, see `core.rs`, `VoteGate`).
//!
//! Every value is `[xxh3-64 of the payload, u64 LE][payload]`. The state is created in one
//! transaction, so a file without `format` holds no state (a crash before that commit).
//!
//! # Faults
//! - **A torn tail** (a crash in the middle of a commit): redb writes a commit's pages, then its
//!   root with a checksum, then fsyncs; at the next open, a newest root that does not check is
//!   rolled back to the commit before it, the last one [`DiskState::write`] returned from
//!   (reported: [`Opened::rolled_back`]). A file that was not closed cleanly is checked and its
//!   free-page state rebuilt (reported: [`Opened::repaired`]).
//! - **Damage in the middle** (a value whose checksum fails, entries that are not contiguous,
//!   a commit index outside the log, a page redb cannot read): an error naming the file and
//!   what is wrong ([`StateProblem`]); nothing is guessed or skipped. redb checks its own pages'
//!   checksums when it repairs; ours cover every value at every open.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{Entry, HardState, SnapshotMetadata};
use redb::{Database, ReadableTable, TableDefinition};

use crate::error::ConfigError;
use crate::error::StateProblem;
use crate::limits::{CONFIG_STATE_CACHE_BYTES, STATE_FORMAT};

/// The state file's name inside the node's directory.
pub const STATE_FILE: &str = "raft.redb";

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

const KEY_FORMAT: &str = "format";
const KEY_HARD_STATE: &str = "hard_state";
const KEY_SNAPSHOT_METADATA: &str = "snapshot_metadata";
const KEY_SNAPSHOT_DATA: &str = "snapshot_data";
const KEY_VOTES: &str = "votes";

const CHECKSUM_BYTES: usize = 8;

/// What a node's directory held, read at open.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub hard_state: HardState,
    pub snapshot_metadata: SnapshotMetadata,
    pub snapshot_data: Vec<u8>,
    /// The entries after the snapshot, contiguous.
    pub entries: Vec<Entry>,
    pub votes: bool,
}

/// How the file was found at open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opened {
    /// It was not closed cleanly (a crash): redb checked it and rebuilt its free-page state.
    pub repaired: bool,
    /// Its newest commit did not check (a crash while it was written) and was rolled back to
    /// the one before: a torn tail cut. No write the caller was told of is lost (a commit
    /// returns only after its fsync).
    pub rolled_back: bool,
}

/// One change to the state, written in one transaction.
#[derive(Debug, Default)]
pub struct Change<'a> {
    /// Drop every entry from this index on (a suffix that new entries replace).
    pub truncate_from: Option<u64>,
    /// Drop every entry up to this index (compacted into the snapshot, or replaced by one).
    pub drop_through: Option<u64>,
    pub entries: &'a [Entry],
    pub hard_state: Option<&'a HardState>,
    pub snapshot: Option<(&'a SnapshotMetadata, &'a [u8])>,
    pub votes: Option<bool>,
}

/// The open state file of one node.
pub struct DiskState {
    database: Database,
    path: PathBuf,
}

impl std::fmt::Debug for DiskState {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("DiskState").field("path", &self.path).finish()
    }
}

impl DiskState {
    /// Opens (creating the directory and an empty file if need be) the state file in `dir`,
    /// and reads what it holds (`None`: no state).
    ///
    /// # Errors
    /// [`ConfigError::State`] naming the file: it cannot be opened (locked by another process,
    /// I/O), or what it holds is damaged or inconsistent.
    pub fn open(dir: &Path) -> Result<(DiskState, Option<Loaded>, Opened), ConfigError> {
        let path = dir.join(STATE_FILE);
        let failed = |problem| ConfigError::State { path: path.clone(), problem };
        std::fs::create_dir_all(dir).map_err(|error| failed(StateProblem::Directory(error)))?;
        Self::open_with(path.clone(), |builder| builder.create(&path))
    }

    /// Opens the state kept by a redb storage backend (tests: a crash-simulating one).
    #[cfg(test)]
    pub(crate) fn open_backend(
        backend: impl redb::StorageBackend,
    ) -> Result<(DiskState, Option<Loaded>, Opened), ConfigError> {
        Self::open_with(PathBuf::from("(test backend)"), move |builder| builder.create_with_backend(backend))
    }

    fn open_with(
        path: PathBuf,
        create: impl FnOnce(&redb::Builder) -> Result<Database, redb::DatabaseError>,
    ) -> Result<(DiskState, Option<Loaded>, Opened), ConfigError> {
        let failed = |problem| ConfigError::State { path: path.clone(), problem };
        let repaired = Arc::new(AtomicBool::new(false));
        let rolled_back = Arc::new(AtomicBool::new(false));
        let mut builder = Database::builder();
        builder.set_cache_size(CONFIG_STATE_CACHE_BYTES);
        let (repaired_seen, rolled_back_seen) = (Arc::clone(&repaired), Arc::clone(&rolled_back));
        builder.set_repair_callback(move |session| {
            repaired_seen.store(true, Ordering::Relaxed);
            // redb 2.6 reports 0.3 exactly when the newest commit failed its checksum and is
            // being rolled back (`Database::do_repair`); the crash tests pin this down.
            if (session.progress() - 0.3).abs() < 1e-9 {
                rolled_back_seen.store(true, Ordering::Relaxed);
            }
        });
        // redb checks what it reads and reports damage as errors; should it panic on a file
        // damaged in a way it did not foresee, that is bad input, not a reason to crash.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let database = create(&builder).map_err(|error| StateProblem::Database(Box::new(error.into())))?;
            let loaded = load(&database)?;
            Ok::<_, StateProblem>((database, loaded))
        }));
        let (database, loaded) = opened.map_err(|_| failed(StateProblem::Unreadable))?.map_err(failed)?;
        let opened =
            Opened { repaired: repaired.load(Ordering::Relaxed), rolled_back: rolled_back.load(Ordering::Relaxed) };
        Ok((DiskState { database, path }, loaded, opened))
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes a new state (the group's first configuration as the snapshot at index 0).
    ///
    /// # Errors
    /// [`StateProblem::HoldsState`] when the file holds state already; redb's errors.
    pub fn create(&self, snapshot: (&SnapshotMetadata, &[u8]), votes: bool) -> Result<(), ConfigError> {
        if load(&self.database).map_err(|problem| self.failed(problem))?.is_some() {
            return Err(self.failed(StateProblem::HoldsState));
        }
        let change = Change {
            hard_state: Some(&HardState::default()),
            snapshot: Some(snapshot),
            votes: Some(votes),
            drop_through: Some(u64::MAX),
            ..Change::default()
        };
        self.commit(&change, true)
    }

    /// Writes `change` in one transaction and returns once it is on disk.
    ///
    /// # Errors
    /// redb's errors (I/O, a full disk), naming the file. The change is then wholly absent.
    pub fn write(&self, change: &Change<'_>) -> Result<(), ConfigError> {
        self.commit(change, false)
    }

    fn commit(&self, change: &Change<'_>, create: bool) -> Result<(), ConfigError> {
        let database = |error: redb::Error| self.failed(StateProblem::Database(Box::new(error)));
        let transaction = self.database.begin_write().map_err(|error| database(error.into()))?;
        {
            let mut entries = transaction.open_table(ENTRIES).map_err(|error| database(error.into()))?;
            if let Some(from) = change.truncate_from {
                entries.retain_in(from.., |_, _| false).map_err(|error| database(error.into()))?;
            }
            if let Some(through) = change.drop_through {
                entries.retain_in(..=through, |_, _| false).map_err(|error| database(error.into()))?;
            }
            for entry in change.entries {
                let value = sealed(&entry.write_to_bytes().expect("raft entries always encode"));
                entries.insert(entry.index, value.as_slice()).map_err(|error| database(error.into()))?;
            }
            let mut meta = transaction.open_table(META).map_err(|error| database(error.into()))?;
            let mut put = |key: &str, payload: &[u8]| {
                meta.insert(key, sealed(payload).as_slice()).map(|_| ()).map_err(|error| database(error.into()))
            };
            if let Some(hard_state) = change.hard_state {
                put(KEY_HARD_STATE, &hard_state.write_to_bytes().expect("hard states always encode"))?;
            }
            if let Some((metadata, data)) = change.snapshot {
                put(KEY_SNAPSHOT_METADATA, &metadata.write_to_bytes().expect("snapshot metadata always encodes"))?;
                put(KEY_SNAPSHOT_DATA, data)?;
            }
            if let Some(votes) = change.votes {
                put(KEY_VOTES, &[u8::from(votes)])?;
            }
            if create {
                put(KEY_FORMAT, &STATE_FORMAT.to_le_bytes())?;
            }
        }
        // `Durability::Immediate` is redb's default: the commit returns after its fsync.
        transaction.commit().map_err(|error| database(error.into()))
    }

    fn failed(&self, problem: StateProblem) -> ConfigError {
        ConfigError::State { path: self.path.clone(), problem }
    }
}

/// `[xxh3-64 of payload, u64 LE][payload]`.
fn sealed(payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(CHECKSUM_BYTES + payload.len());
    value.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(payload).to_le_bytes());
    value.extend_from_slice(payload);
    value
}

/// The payload of a sealed value, checked.
fn unsealed<'a>(key: &str, value: &'a [u8]) -> Result<&'a [u8], StateProblem> {
    let damaged = |problem| StateProblem::Damaged { key: key.to_string(), problem };
    let (checksum, payload) =
        value.split_at_checked(CHECKSUM_BYTES).ok_or_else(|| damaged("shorter than its checksum"))?;
    let checksum = u64::from_le_bytes(checksum.try_into().expect("split at 8 bytes"));
    if checksum != xxhash_rust::xxh3::xxh3_64(payload) {
        return Err(damaged("checksum mismatch"));
    }
    Ok(payload)
}

fn parsed<M: protobuf::Message>(key: &str, payload: &[u8]) -> Result<M, StateProblem> {
    M::parse_from_bytes(payload).map_err(|_| StateProblem::Damaged { key: key.to_string(), problem: "does not decode" })
}

/// Reads the whole state (`None`: none was created), checking every value and how they fit.
fn load(database: &Database) -> Result<Option<Loaded>, StateProblem> {
    let database_error = |error: redb::Error| StateProblem::Database(Box::new(error));
    let transaction = database.begin_read().map_err(|error| database_error(error.into()))?;
    let meta = match transaction.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(error) => return Err(database_error(error.into())),
    };
    let get = |key: &str| -> Result<Option<Vec<u8>>, StateProblem> {
        let value = meta.get(key).map_err(|error| database_error(error.into()))?;
        value.map(|value| unsealed(key, value.value()).map(<[u8]>::to_vec)).transpose()
    };
    let Some(format) = get(KEY_FORMAT)? else {
        return Ok(None);
    };
    let format = <[u8; 4]>::try_from(format.as_slice())
        .map_err(|_| StateProblem::Damaged { key: KEY_FORMAT.into(), problem: "not 4 bytes" })?;
    if u32::from_le_bytes(format) != STATE_FORMAT {
        return Err(StateProblem::Format { found: u32::from_le_bytes(format) });
    }
    let missing = |key: &str| StateProblem::Inconsistent { problem: format!("{key} is missing") };
    let required = |key: &str| get(key)?.ok_or_else(|| missing(key));
    let hard_state: HardState = parsed(KEY_HARD_STATE, &required(KEY_HARD_STATE)?)?;
    let snapshot_metadata: SnapshotMetadata = parsed(KEY_SNAPSHOT_METADATA, &required(KEY_SNAPSHOT_METADATA)?)?;
    let snapshot_data = required(KEY_SNAPSHOT_DATA)?;
    let votes = match required(KEY_VOTES)?.as_slice() {
        [0] => false,
        [1] => true,
        _ => return Err(StateProblem::Damaged { key: KEY_VOTES.into(), problem: "not 0 or 1" }),
    };
    let table = transaction.open_table(ENTRIES).map_err(|error| database_error(error.into()))?;
    let mut entries = Vec::new();
    let mut expected = snapshot_metadata.index + 1;
    let mut previous_term = snapshot_metadata.term;
    for item in table.iter().map_err(|error| database_error(error.into()))? {
        let (index, value) = item.map_err(|error| database_error(error.into()))?;
        let key = format!("entries[{}]", index.value());
        let entry: Entry = parsed(&key, unsealed(&key, value.value())?)?;
        if index.value() != expected || entry.index != expected || entry.term < previous_term {
            return Err(StateProblem::Inconsistent {
                problem: format!(
                    "{key} holds index {} of term {}: expected index {expected}, term {previous_term} or above",
                    entry.index, entry.term
                ),
            });
        }
        expected += 1;
        previous_term = entry.term;
        entries.push(entry);
    }
    let last = expected - 1;
    if hard_state.commit < snapshot_metadata.index || hard_state.commit > last {
        return Err(StateProblem::Inconsistent {
            problem: format!(
                "commit index {} outside the log [{}, {last}]",
                hard_state.commit, snapshot_metadata.index
            ),
        });
    }
    if hard_state.term < previous_term {
        return Err(StateProblem::Inconsistent {
            problem: format!("term {} below the log's last term {previous_term}", hard_state.term),
        });
    }
    Ok(Some(Loaded { hard_state, snapshot_metadata, snapshot_data, entries, votes }))
}
