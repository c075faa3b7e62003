//! The single-key conditional update: read a key's newest committed version, decide, and store
//! and commit the new version, all under the key's shard write lock.
//!
//! # Contract
//! [`Store::update_keeping`] holds the key's shard write lock from the checks to the commit, so
//! it is atomic against every PREPARE, COMMIT, PUT, read and other update of the key (they all
//! take that shard's lock, read or write). Under the lock:
//! - if the key has a prepared version not yet committed, nothing changes and the answer is
//!   [`UpdateCheck::Busy`]: an update never decides from a value that a write in flight below
//!   it is about to replace (its writer commits, or recovery resolves it, soon);
//! - else if the key has a version (stored, committed or collected) at or above `ts`, nothing
//!   changes and the answer is [`UpdateCheck::TsTooLow`] with the newest timestamp: the new
//!   version must be the key's newest, so that it becomes the latest at once;
//! - else `decide` gets the latest committed version (`None`: the initial value) and either
//!   keeps the key as it is or gives the value to write; that value is stored as version `ts`
//!   with `metadata`, committed (`lastCommit` advances to `ts`, the latest version is it), and
//!   what was latest is marked superseded, exactly as a PREPARE of the one key followed by its
//!   COMMIT would leave the store. The server logs it so (a PREPARE and a COMMIT record).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::validate::validate_prepare;
use super::{
    Key, KeyState, Store, StoreError, StoreWrite, StoredMetadata, StoredVersion, StoredWrites, TableKey, Version,
};
use crate::types::{Expiry, Timestamp};

/// Why an update changed nothing before deciding, or what its decision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateCheck<R> {
    /// The key has a prepared, uncommitted version (this one, the lowest found).
    Busy { prepared: Timestamp },
    /// The key's newest version is at or above the update's timestamp.
    TsTooLow { newest: Timestamp },
    /// `decide` ran; `written` says whether it stored a version. `outcome` is what it returned.
    Decided { written: bool, outcome: R },
}

impl Store {
    /// The update described in the module docs. `decide` returns the value to store (`None`:
    /// store nothing) and an outcome passed back. When `stored` is given, the version stored is
    /// pushed to it (for the log), as [`Store::prepare_keeping`] does.
    ///
    /// # Errors
    /// As a PREPARE of one key would be refused (the timestamp 0, a key or the decided value
    /// over the limits, a write set that does not name the key, `ts` aborted here): nothing is
    /// stored then.
    pub fn update_keeping<R>(
        &self,
        ts: Timestamp,
        key: Key,
        metadata: StoredMetadata,
        decide: impl FnOnce(Option<&Version>) -> (Option<(Box<[u8]>, Expiry)>, R),
        now_ms: u64,
        stored: Option<&mut StoredWrites>,
    ) -> Result<UpdateCheck<R>, StoreError> {
        // The key checked in place (moved in and out, not copied), its value not decided yet.
        let unvalued = [StoreWrite::new(key, Box::default())];
        validate_prepare(ts, &metadata, &unvalued)?;
        let [StoreWrite { key, .. }] = unvalued;
        if self.aborted.lock().contains_key(&ts) {
            return Err(StoreError::Aborted { ts });
        }
        let index = Self::shard_index(&key);
        let mut shard = self.shards[index].write();
        // One lookup for the checks and the latest version (timestamps read from the key's
        // entries, not from the versions: a version is a block of its own).
        let (value, outcome) = match shard.get(&key[..]) {
            None => decide(None),
            Some(state) => {
                if let Some(prepared) = lowest_uncommitted(state) {
                    return Ok(UpdateCheck::Busy { prepared });
                }
                let newest_stored = state.versions.newest_ts().unwrap_or(0);
                let newest = newest_stored.max(state.last_commit.load(Ordering::Acquire)).max(state.collected_max_ts);
                if newest >= ts {
                    return Ok(UpdateCheck::TsTooLow { newest });
                }
                // Decided under the lock, on the version in place (no count taken on it).
                let latest = state.latest.lock();
                decide(latest.as_deref())
            }
        };
        let Some((value, expiry)) = value else {
            return Ok(UpdateCheck::Decided { written: false, outcome });
        };
        let write = [StoreWrite { key, value, expiry }];
        validate_prepare(ts, &metadata, &write)?;
        let [StoreWrite { key, value, expiry }] = write;
        let value_bytes = value.len();
        let version = Arc::new(Version { ts, value, metadata, expiry });
        if let Some(stored) = stored {
            stored.push((key.clone(), Arc::clone(&version)));
        }
        // A reader that found the key missing may come back for this version (`gc`'s contract).
        let absent_read = &self.absent_read_stamps[index];
        let state = shard.entry(TableKey::from_slice(&key)).or_insert_with(|| KeyState {
            read_stamp: AtomicU64::new(absent_read.load(Ordering::Relaxed)),
            ..KeyState::default()
        });
        let committed = StoredVersion::new(Arc::clone(&version), true);
        let replaced = state.versions.insert(ts, committed);
        debug_assert!(replaced.is_none(), "ts is above every stored version");
        self.version_count.fetch_add(1, Ordering::Relaxed);
        self.value_bytes.fetch_add(value_bytes, Ordering::Relaxed);
        state.unmarked.push(ts);
        let mut latest = state.latest.lock();
        let before = state.last_commit.load(Ordering::Acquire);
        debug_assert!(ts > before, "ts is above lastCommit");
        *latest = Some(version);
        let previous = state.last_commit.fetch_max(ts, Ordering::AcqRel);
        assert_eq!(previous, before, "lastCommit moved without its lock");
        drop(latest);
        // What was latest is superseded now: marked (and collected when the grace allows),
        // as the next write of the key would.
        self.collect_superseded(state, now_ms);
        Ok(UpdateCheck::Decided { written: true, outcome })
    }
}

/// The lowest timestamp of a prepared, uncommitted version of the key. Every such version is
/// listed in `unmarked` (a PREPARE lists it; marking keeps uncommitted versions listed).
fn lowest_uncommitted(state: &KeyState) -> Option<Timestamp> {
    let uncommitted =
        |ts: &&Timestamp| state.versions.get(ts).is_some_and(|stored| !stored.committed.load(Ordering::Acquire));
    let found = state.unmarked.iter().filter(uncommitted).min().copied();
    debug_assert_eq!(
        found,
        state
            .versions
            .values()
            .filter(|stored| !stored.committed.load(Ordering::Acquire))
            .map(|stored| stored.version.ts)
            .min(),
        "every uncommitted version is listed unmarked"
    );
    found
}
