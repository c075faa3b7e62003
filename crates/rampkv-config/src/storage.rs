//! The Raft log, hard state and snapshot of one node, behind raft-rs's `Storage` trait.
//!
//! # Contract
//! Held in memory, and, for a node given a directory ([`RaftStore::create`], [`RaftStore::open`]),
//! on disk too (`crate::disk`: one redb file, every change one transaction with fsync). Every
//! mutation goes through the methods of [`RaftStore`] (`persist`/`append`, `set_hard_state`,
//! `set_commit`, `apply_snapshot`, `compact`, `set_votes`); each writes the disk first and
//! returns only once the change is on it, then changes the memory, which serves every read.
//! The core calls them before it sends anything that depends on the change (Raft's rule).
//! A failed write leaves the memory as it was and is an error the core stops on
//! ([`disk_failure`]): a node that cannot keep its state must not go on voting or acknowledging.
//!
//! Without a directory a restarted node has lost its log and rejoins as a follower that
//! catches up from the leader (and does not vote until it has, see `core.rs`); with one it
//! restarts from what it kept, as any Raft node.
//! A snapshot's data is the encoded [`crate::configuration::Configuration`] at its index: the
//! whole replicated state, a few bytes per partition.

use std::path::Path;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::disk::{Change, DiskState, Loaded, Opened};
use crate::error::ConfigError;

/// A node's Raft storage: in memory, and on disk when it has a directory.
#[derive(Debug)]
pub struct RaftStore {
    hard_state: HardState,
    conf_state: ConfState,
    /// entries[i] has index snapshot.index + 1 + i.
    entries: Vec<Entry>,
    snapshot_metadata: SnapshotMetadata,
    snapshot_data: Vec<u8>,
    /// The node votes (false: a rejoining node that has not caught up; kept on disk so that a
    /// restart does not open the gate, see `core.rs`, `VoteGate`).
    votes: bool,
    disk: Option<DiskState>,
    /// The state was read from disk (the node restarts from it).
    restored: bool,
}

/// The error a disk failure is carried in through raft-rs's `Result`.
fn disk_error(error: ConfigError) -> raft::Error {
    raft::Error::Store(StorageError::Other(Box::new(error)))
}

/// The disk failure inside a [`RaftStore`] error, if it is one (the others are refusals of a
/// change that does not fit the log, which leave the store as it was).
pub fn disk_failure(error: &raft::Error) -> Option<&ConfigError> {
    match error {
        raft::Error::Store(StorageError::Other(inner)) => inner.downcast_ref::<ConfigError>(),
        _ => None,
    }
}

/// The disk failure inside a [`RaftStore`] error, taken out of it; the error itself when it
/// is a refusal.
///
/// # Errors
/// `error` when it is not a disk failure.
pub fn into_disk_failure(error: raft::Error) -> Result<ConfigError, raft::Error> {
    match error {
        raft::Error::Store(StorageError::Other(inner)) => match inner.downcast::<ConfigError>() {
            Ok(failure) => Ok(*failure),
            Err(inner) => Err(raft::Error::Store(StorageError::Other(inner))),
        },
        other => Err(other),
    }
}

impl RaftStore {
    /// An empty log of a group whose voters are `voters` (raft ids), whose state at index 0 is
    /// `initial_state` (the encoded first configuration), in memory only.
    pub fn new(voters: Vec<u64>, initial_state: Vec<u8>) -> RaftStore {
        let conf_state = ConfState { voters, ..Default::default() };
        let mut snapshot_metadata = SnapshotMetadata::default();
        snapshot_metadata.set_conf_state(conf_state.clone());
        RaftStore {
            hard_state: HardState::default(),
            conf_state,
            entries: Vec::new(),
            snapshot_metadata,
            snapshot_data: initial_state,
            votes: true,
            disk: None,
            restored: false,
        }
    }

    /// As [`RaftStore::new`], kept in `dir` (created if need be) from now on. `votes`: false for
    /// a node that rejoins a running group with nothing (it must catch up before it votes).
    ///
    /// # Errors
    /// [`ConfigError::State`]: the directory holds Raft state already (restart from it with
    /// [`RaftStore::open`]), or it cannot be opened or written.
    pub fn create(dir: &Path, voters: Vec<u64>, initial_state: Vec<u8>, votes: bool) -> Result<RaftStore, ConfigError> {
        let (disk, loaded, _) = DiskState::open(dir)?;
        let mut store = RaftStore::new(voters, initial_state);
        if loaded.is_some() {
            return Err(ConfigError::State {
                path: disk.path().to_path_buf(),
                problem: crate::error::StateProblem::HoldsState,
            });
        }
        disk.create((&store.snapshot_metadata, &store.snapshot_data), votes)?;
        store.votes = votes;
        store.disk = Some(disk);
        Ok(store)
    }

    /// The state kept in `dir`, if any (`None`: none was created there; start the node with
    /// [`RaftStore::create`]), with how the file was found (repaired after a crash, a torn
    /// tail cut).
    ///
    /// # Errors
    /// [`ConfigError::State`] naming the file: locked by another process, damaged,
    /// inconsistent.
    pub fn open(dir: &Path) -> Result<Option<(RaftStore, Opened)>, ConfigError> {
        let (disk, loaded, opened) = DiskState::open(dir)?;
        Ok(loaded.map(|loaded| (RaftStore::restored(disk, loaded), opened)))
    }

    #[cfg(test)]
    pub(crate) fn open_backend(backend: impl redb::StorageBackend) -> Result<(RaftStore, Opened), ConfigError> {
        let (disk, loaded, opened) = DiskState::open_backend(backend)?;
        match loaded {
            Some(loaded) => Ok((RaftStore::restored(disk, loaded), opened)),
            None => {
                let mut store = RaftStore::new(vec![1, 2, 3], vec![7]);
                disk.create((&store.snapshot_metadata, &store.snapshot_data), true)?;
                store.disk = Some(disk);
                Ok((store, opened))
            }
        }
    }

    fn restored(disk: DiskState, loaded: Loaded) -> RaftStore {
        RaftStore {
            hard_state: loaded.hard_state,
            conf_state: loaded.snapshot_metadata.get_conf_state().clone(),
            entries: loaded.entries,
            snapshot_metadata: loaded.snapshot_metadata,
            snapshot_data: loaded.snapshot_data,
            votes: loaded.votes,
            disk: Some(disk),
            restored: true,
        }
    }

    /// The state was read from a directory (the node restarts from it).
    pub fn is_restored(&self) -> bool {
        self.restored
    }

    /// The state is kept on disk.
    pub fn is_durable(&self) -> bool {
        self.disk.is_some()
    }

    /// The file the state is kept in (`None`: in memory).
    pub fn path(&self) -> Option<&Path> {
        self.disk.as_ref().map(DiskState::path)
    }

    /// Whether the node votes (see [`RaftStore::set_votes`]).
    pub fn votes(&self) -> bool {
        self.votes
    }

    /// The snapshot's metadata and data (the configuration at its index).
    pub fn snapshot_parts(&self) -> (&SnapshotMetadata, &[u8]) {
        (&self.snapshot_metadata, &self.snapshot_data)
    }

    fn write(&self, change: &Change<'_>) -> raft::Result<()> {
        match &self.disk {
            Some(disk) => disk.write(change).map_err(disk_error),
            None => Ok(()),
        }
    }

    fn first(&self) -> u64 {
        self.snapshot_metadata.index + 1
    }

    fn last(&self) -> u64 {
        self.snapshot_metadata.index + self.entries.len() as u64
    }

    /// Appends entries from raft-rs's `Ready`, replacing any conflicting suffix.
    pub fn append(&mut self, entries: &[Entry]) -> raft::Result<()> {
        self.persist(entries, None)
    }

    /// Appends `entries` (replacing any conflicting suffix) and sets `hard_state`, both from one
    /// raft-rs `Ready`, in one write.
    pub fn persist(&mut self, entries: &[Entry], hard_state: Option<&HardState>) -> raft::Result<()> {
        if let Some(first) = entries.first() {
            // raft-rs hands us entries that continue or overwrite the log, never older than the
            // snapshot nor past a gap; anything else is a bug in the caller, so it is an error.
            if first.index < self.first() || first.index > self.last() + 1 {
                return Err(raft::Error::Store(StorageError::Unavailable));
            }
            let contiguous = entries.windows(2).all(|pair| pair[1].index == pair[0].index + 1);
            if !contiguous {
                return Err(raft::Error::Store(StorageError::Unavailable));
            }
        }
        let hard_state = hard_state.filter(|hard_state| **hard_state != self.hard_state);
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        let truncate_from = entries.first().map(|first| first.index);
        self.write(&Change { truncate_from, entries, hard_state, ..Change::default() })?;
        if let Some(first) = entries.first() {
            self.entries.truncate((first.index - self.first()) as usize);
            self.entries.extend_from_slice(entries);
        }
        if let Some(hard_state) = hard_state {
            self.hard_state = hard_state.clone();
        }
        Ok(())
    }

    pub fn set_hard_state(&mut self, hard_state: HardState) -> raft::Result<()> {
        self.persist(&[], Some(&hard_state))
    }

    /// Sets the commit index. Kept on disk although Raft could relearn it from the leader: a
    /// restarted node then re-applies everything it had applied before, so its configuration
    /// never goes back across a restart.
    pub fn set_commit(&mut self, commit: u64) -> raft::Result<()> {
        let hard_state = HardState { commit, ..self.hard_state.clone() };
        self.persist(&[], Some(&hard_state))
    }

    /// Marks the node as voting (a rejoining node that caught up), on disk before it votes.
    pub fn set_votes(&mut self) -> raft::Result<()> {
        if self.votes {
            return Ok(());
        }
        self.write(&Change { votes: Some(true), ..Change::default() })?;
        self.votes = true;
        Ok(())
    }

    /// Replaces the log with a snapshot received from the leader.
    pub fn apply_snapshot(&mut self, mut snapshot: Snapshot) -> raft::Result<()> {
        let metadata = snapshot.take_metadata();
        if metadata.index < self.snapshot_metadata.index {
            return Err(raft::Error::Store(StorageError::SnapshotOutOfDate));
        }
        let mut hard_state = self.hard_state.clone();
        hard_state.term = hard_state.term.max(metadata.term);
        hard_state.commit = hard_state.commit.max(metadata.index);
        self.write(&Change {
            drop_through: Some(u64::MAX),
            hard_state: Some(&hard_state),
            snapshot: Some((&metadata, &snapshot.data)),
            ..Change::default()
        })?;
        self.hard_state = hard_state;
        self.entries.clear();
        self.conf_state = metadata.get_conf_state().clone();
        self.snapshot_metadata = metadata;
        self.snapshot_data = snapshot.data.to_vec();
        Ok(())
    }

    /// Drops entries up to `index` (applied), keeping `state` (the configuration at `index`)
    /// as the snapshot that replaces them.
    pub fn compact(&mut self, index: u64, state: Vec<u8>) -> raft::Result<()> {
        if index <= self.snapshot_metadata.index {
            return Ok(());
        }
        if index > self.last() || index > self.hard_state.commit {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let term = self.term(index)?;
        let mut metadata = self.snapshot_metadata.clone();
        metadata.index = index;
        metadata.term = term;
        metadata.set_conf_state(self.conf_state.clone());
        self.write(&Change { drop_through: Some(index), snapshot: Some((&metadata, &state)), ..Change::default() })?;
        self.entries.drain(..(index - self.snapshot_metadata.index) as usize);
        self.snapshot_metadata = metadata;
        self.snapshot_data = state;
        Ok(())
    }

    /// Entries kept (in memory, and on disk when durable).
    pub fn entry_count(&self) -> u64 {
        self.entries.len() as u64
    }
}

impl Storage for RaftStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = self.first();
        let mut entries = self.entries[(low - offset) as usize..(high - offset) as usize].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index == self.snapshot_metadata.index {
            return Ok(self.snapshot_metadata.term);
        }
        if index < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if index > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(index - self.first()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // The snapshot is refreshed at every compaction, which is the only time a follower can
        // need one (its next entry was dropped); raft-rs sends it and then the entries after.
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(self.snapshot_metadata.clone());
        snapshot.data = self.snapshot_data.clone().into();
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, ..Default::default() }
    }

    #[test]
    fn append_overwrites_the_suffix_and_compaction_keeps_terms_and_state() {
        let mut store = RaftStore::new(vec![1, 2, 3], vec![7]);
        store.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]).unwrap();
        store.append(&[entry(3, 2), entry(4, 2)]).unwrap();
        assert_eq!((store.first_index().unwrap(), store.last_index().unwrap()), (1, 4));
        assert_eq!(store.term(3).unwrap(), 2);
        assert!(store.append(&[entry(9, 2)]).is_err(), "a gap is refused, not a panic");
        store.set_commit(3).unwrap();
        assert!(store.compact(4, vec![]).is_err(), "past the commit index");
        store.compact(2, vec![5, 5]).unwrap();
        assert_eq!(store.first_index().unwrap(), 3);
        assert_eq!(store.term(2).unwrap(), 1);
        assert!(matches!(store.term(1), Err(raft::Error::Store(StorageError::Compacted))));
        assert!(store.entries(1, 3, None, GetEntriesContext::empty(false)).is_err());
        assert_eq!(store.entries(3, 5, None, GetEntriesContext::empty(false)).unwrap().len(), 2);
        let snapshot = store.snapshot(0, 2).unwrap();
        assert_eq!((snapshot.get_metadata().index, snapshot.data.to_vec()), (2, vec![5, 5]));
        let mut follower = RaftStore::new(vec![1, 2, 3], vec![7]);
        follower.apply_snapshot(snapshot).unwrap();
        assert_eq!((follower.first_index().unwrap(), follower.last_index().unwrap()), (3, 2));
    }
}

/// The durable store: round trips across a reopen, and every crash point of every kind of
/// write (`crate::crash_medium`).
#[cfg(test)]
mod durable_tests {
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    use super::*;
    use crate::crash_medium::{CrashBackend, Medium};
    use crate::error::StateProblem;

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, data: format!("entry {index} of term {term}").into_bytes().into(), ..Default::default() }
    }

    fn entries(indexes: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
        indexes.map(|index| entry(index, term)).collect()
    }

    fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
        HardState { term, vote, commit, ..Default::default() }
    }

    fn snapshot(index: u64, term: u64, data: &[u8]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = index;
        snapshot.mut_metadata().term = term;
        snapshot.mut_metadata().set_conf_state(ConfState { voters: vec![1, 2, 3], ..Default::default() });
        snapshot.data = data.to_vec().into();
        snapshot
    }

    /// Everything a store holds, comparable.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Summary {
        first: u64,
        last: u64,
        entries: Vec<(u64, u64, Vec<u8>)>,
        hard_state: (u64, u64, u64),
        snapshot: (u64, u64, Vec<u64>, Vec<u8>),
        votes: bool,
    }

    fn summary(store: &RaftStore) -> Summary {
        let (first, last) = (store.first_index().unwrap(), store.last_index().unwrap());
        let entries = store.entries(first, last + 1, None, GetEntriesContext::empty(false)).unwrap();
        let state = store.initial_state().unwrap();
        let snapshot = store.snapshot(0, 0).unwrap();
        let metadata = snapshot.get_metadata();
        Summary {
            first,
            last,
            entries: entries.iter().map(|entry| (entry.index, entry.term, entry.data.to_vec())).collect(),
            hard_state: (state.hard_state.term, state.hard_state.vote, state.hard_state.commit),
            snapshot: (metadata.index, metadata.term, state.conf_state.voters.clone(), snapshot.data.to_vec()),
            votes: store.votes(),
        }
    }

    #[test]
    fn a_durable_store_restarts_with_its_log_hard_state_snapshot_and_vote_gate() {
        let dir = tempfile::tempdir().unwrap();
        assert!(RaftStore::open(dir.path()).unwrap().is_none(), "an empty directory holds no state");
        let mut store = RaftStore::create(dir.path(), vec![1, 2, 3], vec![7], false).unwrap();
        assert!(store.is_durable() && !store.is_restored() && !store.votes());
        store.persist(&entries(1..=5, 1), Some(&hard_state(1, 2, 0))).unwrap();
        store.append(&entries(4..=6, 2)).unwrap();
        store.set_hard_state(hard_state(2, 3, 2)).unwrap();
        store.set_commit(5).unwrap();
        store.compact(3, b"state at 3".to_vec()).unwrap();
        let gated = summary(&store);
        drop(store);

        let (mut store, opened) = RaftStore::open(dir.path()).unwrap().expect("state kept");
        assert_eq!(summary(&store), gated);
        assert!(store.is_restored() && !store.votes(), "a gated node stays gated across a restart");
        assert!(!opened.repaired && !opened.rolled_back, "closed cleanly: {opened:?}");
        assert_eq!((store.first_index().unwrap(), store.last_index().unwrap()), (4, 6));
        assert_eq!((store.term(3).unwrap(), store.term(4).unwrap()), (1, 2));
        assert!(matches!(store.term(2), Err(raft::Error::Store(StorageError::Compacted))));
        store.set_votes().unwrap();
        store.apply_snapshot(snapshot(10, 4, b"state at 10")).unwrap();
        let replaced = summary(&store);
        assert_eq!((replaced.first, replaced.last, replaced.hard_state), (11, 10, (4, 3, 10)));
        let second = RaftStore::open(dir.path()).unwrap_err();
        assert!(
            error_names(&second, dir.path()),
            "a second node on the same directory is refused, naming the file: {second}"
        );
        drop(store);

        let (store, _) = RaftStore::open(dir.path()).unwrap().expect("state kept");
        assert_eq!(summary(&store), replaced);
        assert!(store.votes());
        drop(store);
        let error = RaftStore::create(dir.path(), vec![1, 2, 3], vec![7], true).unwrap_err();
        assert!(matches!(error, ConfigError::State { problem: StateProblem::HoldsState, .. }), "{error}");
    }

    fn error_names(error: &ConfigError, dir: &Path) -> bool {
        error.to_string().contains(&dir.join(crate::disk::STATE_FILE).display().to_string())
    }

    /// Damage in the middle of the file (a value whose bytes changed after it was written) is
    /// an error naming the file and the value, not a guess.
    #[test]
    fn a_damaged_value_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = RaftStore::create(dir.path(), vec![1, 2, 3], vec![7], true).unwrap();
        store.persist(&entries(1..=4, 1), Some(&hard_state(1, 1, 0))).unwrap();
        drop(store);
        let path = dir.path().join(crate::disk::STATE_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let marker = b"entry 2 of term 1";
        let mut damaged = 0;
        for start in 0..bytes.len() - marker.len() {
            if &bytes[start..start + marker.len()] == marker {
                bytes[start + 6] ^= 0x01; // "2" becomes "3": the value still decodes
                damaged += 1;
            }
        }
        assert!(damaged > 0, "the value is in the file");
        std::fs::write(&path, bytes).unwrap();
        let error = RaftStore::open(dir.path()).unwrap_err();
        assert!(error_names(&error, dir.path()), "{error}");
        assert!(
            matches!(&error, ConfigError::State { problem: StateProblem::Damaged { key, .. }, .. } if key == "entries[2]"),
            "{error}"
        );
    }

    type Step = (&'static str, fn(&mut RaftStore) -> raft::Result<()>);

    /// Every kind of write, each cut at every operation it makes on the medium (writes,
    /// resizes, fsyncs), with a random part of what was not synced kept (a power cut): reopened,
    /// the store holds the state before the write or after it, never a mix, and after it
    /// whenever the write had returned `Ok`. A torn newest commit is reported as rolled back.
    #[test]
    fn a_crash_at_any_point_of_a_write_leaves_it_whole_or_absent() {
        let seed: u64 =
            std::env::var("RAMPKV_TEST_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(rand::random);
        println!("seed {seed} (RAMPKV_TEST_SEED={seed} replays it)");
        let mut rng = SmallRng::seed_from_u64(seed);
        let steps: [Step; 5] = [
            ("append with a hard state", |store| store.persist(&entries(1..=6, 1), Some(&hard_state(1, 1, 3)))),
            ("overwrite a suffix", |store| store.persist(&entries(5..=8, 2), Some(&hard_state(2, 2, 4)))),
            ("set the commit index", |store| store.set_commit(6)),
            ("compact", |store| store.compact(5, b"state at 5".to_vec())),
            ("install a snapshot", |store| store.apply_snapshot(snapshot(12, 3, b"state at 12"))),
        ];
        let backend = CrashBackend::default();
        let (store, _) = RaftStore::open_backend(backend.clone()).unwrap();
        let mut model = RaftStore::new(vec![1, 2, 3], vec![7]);
        let mut image = backend.medium();
        drop(store);
        let (mut cases, mut rolled_back) = (0, 0);
        for (name, step) in steps {
            let before = summary(&model);
            step(&mut model).unwrap();
            let after = summary(&model);
            // The same write uncut: how many operations it makes, and the image after it.
            let counter = CrashBackend::over(image.clone());
            let (mut store, _) = RaftStore::open_backend(counter.clone()).unwrap();
            let opening = counter.operations_done();
            step(&mut store).unwrap();
            let operations = counter.operations_done() - opening;
            assert_eq!(summary(&store), after, "{name}");
            let next_image = counter.medium();
            drop(store);
            for cut in 0..=operations {
                for _ in 0..4 {
                    let backend = CrashBackend::over(image.clone());
                    let (mut store, _) = RaftStore::open_backend(backend.clone()).unwrap();
                    assert_eq!(summary(&store), before, "{name}: seed {seed}");
                    backend.crash_after(cut);
                    let result = step(&mut store);
                    let crashed: Medium = backend.medium().after_crash(&mut rng);
                    drop(store);
                    let (reopened, opened) = RaftStore::open_backend(CrashBackend::over(crashed))
                        .unwrap_or_else(|error| panic!("{name}, cut after {cut} operations: {error} (seed {seed})"));
                    let found = summary(&reopened);
                    assert!(
                        found == before || found == after,
                        "{name}, cut after {cut} of {operations} operations: a mix {found:?} (seed {seed})"
                    );
                    if result.is_ok() {
                        assert_eq!(found, after, "{name}: returned Ok but is not on disk (seed {seed})");
                    }
                    cases += 1;
                    rolled_back += usize::from(opened.rolled_back);
                }
            }
            image = next_image;
        }
        println!("{cases} crashes, {rolled_back} torn newest commits rolled back");
        assert!(rolled_back > 0, "no torn commit was detected and rolled back (seed {seed})");
    }
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    /// Bound everything: a long run of appends, commits and compactions (what a node does as
    /// changes commit) leaves the file no larger than a short one; redb reuses freed pages.
    #[test]
    fn the_state_file_stays_bounded_over_a_long_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = RaftStore::create(dir.path(), vec![1, 2, 3], vec![7; 256], true).unwrap();
        let path = dir.path().join(crate::disk::STATE_FILE);
        let mut sizes = Vec::new();
        for index in 1..=1_500u64 {
            let entry = Entry { index, term: 1, data: vec![index as u8; 64].into(), ..Default::default() };
            let hard_state = HardState { term: 1, vote: 1, commit: index - 1, ..Default::default() };
            store.persist(&[entry], Some(&hard_state)).unwrap();
            store.set_commit(index).unwrap();
            if index % 100 == 0 {
                store.compact(index - 50, vec![index as u8; 256]).unwrap();
                sizes.push(std::fs::metadata(&path).unwrap().len());
            }
        }
        println!("file size every 100 entries: {sizes:?}");
        let (early, late) = (sizes[2], *sizes.last().unwrap());
        assert!(late <= early, "the file grew from {early} to {late} bytes");
    }
}
