//! The Raft log, hard state and snapshot of one node, behind raft-rs's `Storage` trait.
//!
//! # Contract
//! Held in memory for now: a restarted node has lost its log and rejoins as a follower that
//! catches up from the leader (and does not vote until it has, see `core.rs`). Every mutation
//! goes through the four methods of [`RaftStore`] (`append`, `set_hard_state`, `set_commit`,
//! `apply_snapshot`, plus `compact`), which is the seam where a durable log under a data
//! directory (issue 17) writes and syncs before the core sends what depends on it.
//! A snapshot's data is the encoded [`crate::configuration::Configuration`] at its index: the
//! whole replicated state, a few bytes per partition.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// A node's Raft storage, in memory.
#[derive(Debug)]
pub struct RaftStore {
    hard_state: HardState,
    conf_state: ConfState,
    /// entries[i] has index snapshot.index + 1 + i.
    entries: Vec<Entry>,
    snapshot_metadata: SnapshotMetadata,
    snapshot_data: Vec<u8>,
}

impl RaftStore {
    /// An empty log of a group whose voters are `voters` (raft ids), whose state at index 0 is
    /// `initial_state` (the encoded first configuration).
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
        let Some(first) = entries.first() else {
            return Ok(());
        };
        // raft-rs hands us entries that continue or overwrite the log, never older than the
        // snapshot nor past a gap; anything else is a bug in the caller, so it is an error.
        if first.index < self.first() || first.index > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        self.entries.truncate((first.index - self.first()) as usize);
        self.entries.extend_from_slice(entries);
        Ok(())
    }

    pub fn set_hard_state(&mut self, hard_state: HardState) {
        self.hard_state = hard_state;
    }

    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// Replaces the log with a snapshot received from the leader.
    pub fn apply_snapshot(&mut self, mut snapshot: Snapshot) -> raft::Result<()> {
        let metadata = snapshot.take_metadata();
        if metadata.index < self.snapshot_metadata.index {
            return Err(raft::Error::Store(StorageError::SnapshotOutOfDate));
        }
        self.hard_state.term = self.hard_state.term.max(metadata.term);
        self.hard_state.commit = self.hard_state.commit.max(metadata.index);
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
        self.entries.drain(..(index - self.snapshot_metadata.index) as usize);
        self.snapshot_metadata.index = index;
        self.snapshot_metadata.term = term;
        self.snapshot_metadata.set_conf_state(self.conf_state.clone());
        self.snapshot_data = state;
        Ok(())
    }

    /// Entries kept in memory.
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
        store.set_commit(3);
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
