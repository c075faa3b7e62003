//! Item slots (the server side of GET\*): each server publishes the latest committed version
//! of its keys in fixed-size slots of a registered item region that clients map read-only and
//! read one-sidedly (`rampkv_fabric::slot` has the slot format and the seqlock).
//!
//! # Rules
//! - **Expiry.** A slot carries its version's expiry word (`rampkv_fabric::slot`): a GET\*
//!   reader judges it as a GET+ reader judges a VERSIONS entry. A key the store removed after
//!   reclaiming it (expired) loses its slot (`Effects::reclaimed`), unless a newer version was
//!   published since; a slot whose version the sweep reclaimed (value dropped) keeps serving it
//!   until then: readers judge it expired by its deadline.
//! - **Only committed versions are published.** A slot is (re)written after COMMIT (RAMP),
//!   PUT (NoCC), COMMIT_LOCKED (S2PL) and a commit by recovery (`ServerCore::commit`), from
//!   `Store::get_latest`, which only returns the
//!   version at `lastCommit`; and lazily on GET_LOCATE for a committed key with no slot yet.
//! - **Only keys a GET\* client asked for have slots.** A key gets its slot from GET_LOCATE
//!   (how a client learns where a key's slot is: it cannot read a slot it was not told of);
//!   commits republish only keys that have one. A key written but never read over GET\*
//!   (a RESP client's, say) costs no slot memory (1,280 bytes a key at the defaults, a second
//!   copy of the value) and no publish on its writes. Slots are handed out in the order keys
//!   are first located, so they cache the keys GET\* readers use.
//! - **A key with a slot counts as read at every moment** (`Store::get_latest_for_slot`): its
//!   readers read the slot without the server seeing it, so its superseded versions keep the
//!   whole GC grace period (docs/architecture.md, "Storage").
//! - **The slot's ts only grows.** `lastCommit` is an atomic max; a slot is rewritten only when
//!   the latest committed version is newer than the one it holds. The check and the write
//!   happen under one mutex per server, so two server threads (TCP loop and ring poller serve
//!   the same core) never write a slot at once (the seqlock needs a single writer).
//! - **Bounded.** `slots` slots of `slot_bytes` each (limits.rs; configurable). A key gets a
//!   slot on its first GET_LOCATE while free slots remain. A version that does not fit the slot
//!   is not published, and the key's slot (if it had one) is invalidated and freed, so that a
//!   slot never keeps serving an old version while a newer one is committed: a stale slot
//!   could outlive the GC grace period of the versions its metadata points a round-2 read to.
//! - **Newer version prepared** (the paper's "invalid bit"): PREPARE of a version newer than
//!   the slot's sets `SLOT_FLAG_NEWER_PREPARED` (one store of the flags word, outside the
//!   seqlock and the checksum: docs/fabric.md); a republish sets it only if a prepared version
//!   newer than the published one is still known (`prepared_max`). The bit is advisory: the
//!   slot still holds a committed version. Clients ignore it unless their option says to fall
//!   back to GET+ when it is set. An aborted (recovered) prepare leaves it set until the next
//!   newer commit.
//!
//! # The lease word (fencing GET\* reads of a deposed primary)
//! After the last slot, at [`lease_word_offset`], the region holds one 8-byte word: the end,
//! on the host's monotonic clock (`rampkv_fabric::clock`), of the lease this server serves
//! under ([`LEASE_WORD_UNLEASED`] without one: never granted, deposed, not admitted), or
//! [`LEASE_WORD_NOT_NEEDED`] for a server without a configuration service (no replication, or
//! an embedded cluster: nothing can depose it). The server stores it atomically at every grant
//! and change of configuration its node learns; a client accepts slots only while the clock
//! is before it (`transport::onesided`). A stopped or cut-off primary cannot renew: its word
//! ends before the configuration service promotes a backup, so no client reads its slots once
//! a successor may have taken a write. Slots of partitions the server was deposed of are
//! invalidated when it learns it ([`Publisher::invalidate_all`]), so that a server that becomes
//! primary again (a word in the future again) serves none of them.
//!
//! # Staleness and GC
//! A slot lags `lastCommit` by at most the handling of one COMMIT (the publish follows the
//! store's commit in the same call), far less than the GC grace period (`GC_GRACE_MS`), so a
//! round-2 read for a version named by a slot's metadata finds it; if ever it does not, the
//! server answers `VersionGone` and the read restarts (bounded), never a wrong answer.

use std::sync::Arc;

use ahash::AHashMap as HashMap;
use parking_lot::Mutex;
use rampkv_fabric::slot::{SLOT_BYTES_MIN, SLOT_FLAG_NEWER_PREPARED, SLOT_FLAG_VALID};
use rampkv_fabric::{slot_bytes, Access, AnyFabric, FabricError, SlotWriter, StoreOrdering, Words};
use serde::{Deserialize, Serialize};

use crate::message::control::ItemRegionInfo;
use crate::message::fabric::FabricHandle;
use rampkv_core::limits::{ITEM_REGION_BYTES_MAX, ITEM_SLOTS_DEFAULT, ITEM_SLOTS_MAX, ITEM_SLOT_BYTES_DEFAULT};
use rampkv_core::protocol::server::Effects;
use rampkv_core::storage::{Key, Store};
use rampkv_core::types::Timestamp;
use rampkv_core::wire::Encoder;

/// Lease word: the server holds no lease (never granted, lapsed as its node last knew, deposed,
/// a restarted process not admitted yet): every GET\* read falls back to GET+. What a freshly
/// registered region says until its server writes otherwise.
pub const LEASE_WORD_UNLEASED: u64 = 0;

/// Lease word: the server needs no lease (it runs without a configuration service, so no
/// configuration can depose it): GET\* reads trust its slots as they are, with no clock read.
pub const LEASE_WORD_NOT_NEEDED: u64 = u64::MAX;

/// Bytes of the lease line after the last slot: the lease word and zeros, one cache line of its
/// own (a slot write never shares a line with it).
pub const LEASE_LINE_BYTES: usize = 64;

/// Where the lease word of a region of `slots` slots of `slot_bytes` is: the first 64-byte
/// boundary at or after the last slot's end. `None` if it overflows.
pub fn lease_word_offset(slots: usize, slot_bytes: usize) -> Option<usize> {
    slots.checked_mul(slot_bytes)?.checked_next_multiple_of(LEASE_LINE_BYTES)
}

/// The lease word for a lease ending at `end_ns` on the host's monotonic clock (0: no lease).
pub fn lease_word_of(end_ns: u64) -> u64 {
    match end_ns {
        0 => LEASE_WORD_UNLEASED,
        // Never the "not needed" value, whatever the clock says.
        end_ns => end_ns.min(LEASE_WORD_NOT_NEEDED - 1),
    }
}

/// How many slots of what size a server's item region has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemSlotConfig {
    /// Slots in the region.
    pub slots: usize,
    /// Bytes per slot (a multiple of 8, at least the empty slot's 64 bytes).
    pub slot_bytes: usize,
}

impl Default for ItemSlotConfig {
    fn default() -> Self {
        Self { slots: ITEM_SLOTS_DEFAULT, slot_bytes: ITEM_SLOT_BYTES_DEFAULT }
    }
}

/// Why item slots cannot be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ItemSlotsError {
    #[error("item slots must be 1..={ITEM_SLOTS_MAX}, got {slots}")]
    Slots { slots: usize },
    #[error("item slot bytes must be a multiple of 8, at least {SLOT_BYTES_MIN}, got {slot_bytes}")]
    SlotBytes { slot_bytes: usize },
    #[error("an item region of {slots} x {slot_bytes} bytes exceeds {ITEM_REGION_BYTES_MAX}")]
    RegionTooLarge { slots: usize, slot_bytes: usize },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

impl ItemSlotConfig {
    /// Checks the bounds (limits.rs).
    pub fn validate(&self) -> Result<(), ItemSlotsError> {
        let (slots, slot_bytes) = (self.slots, self.slot_bytes);
        if !(1..=ITEM_SLOTS_MAX).contains(&slots) {
            return Err(ItemSlotsError::Slots { slots });
        }
        if slot_bytes % 8 != 0 || slot_bytes < SLOT_BYTES_MIN {
            return Err(ItemSlotsError::SlotBytes { slot_bytes });
        }
        match slots.checked_mul(slot_bytes) {
            Some(bytes) if bytes <= ITEM_REGION_BYTES_MAX => Ok(()),
            _ => Err(ItemSlotsError::RegionTooLarge { slots, slot_bytes }),
        }
    }
}

/// Counters of a server's item slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ItemSlotStats {
    /// Slots in use.
    pub used: usize,
    /// Slot writes (publishes).
    pub publishes: u64,
    /// Versions not published because they exceed the slot size.
    pub too_large: u64,
    /// Keys that found no free slot.
    pub no_free_slot: u64,
    /// Times the newer-prepared bit was set.
    pub newer_prepared_marks: u64,
}

#[derive(Debug)]
struct SlotEntry {
    index: u32,
    /// ts of the published version.
    ts: Timestamp,
    /// Highest ts prepared for the key since the slot was assigned.
    prepared_max: Timestamp,
    /// Flags of the published image.
    flags: u64,
}

#[derive(Debug)]
struct SlotTable {
    entries: HashMap<Key, SlotEntry>,
    free: Vec<u32>,
    next_unused: u32,
    writer: SlotWriter,
    /// Scratch for the encoded metadata (allocated once, reused).
    metadata: Vec<u8>,
    stats: ItemSlotStats,
}

/// Where a server's committed versions are published: the edge (every front end, recovery)
/// applies the server core's publication effects to it.
pub trait Publisher: Send + Sync + std::fmt::Debug {
    /// Republishes the keys a call committed and marks the ones it prepared a newer version of.
    fn apply(&self, store: &Store, effects: &Effects);
    /// A GET_LOCATE key's slot, publishing its latest committed version first if needed.
    fn locate(&self, store: &Store, key: &[u8]) -> Option<u32>;
    /// Stores the region's lease word (see the module docs), atomically.
    fn set_lease_word(&self, word: u64);
    /// Invalidates every slot and forgets them all (the server was deposed of partitions whose
    /// keys it published): each key is published again on its next commit or GET_LOCATE.
    fn invalidate_all(&self);
}

/// One server's item region and its slot table.
pub struct ItemSlots<F: FabricHandle = AnyFabric> {
    region: Arc<F::LocalRegion>,
    info: ItemRegionInfo,
    config: ItemSlotConfig,
    /// Byte offset of the lease word.
    lease_word_offset: usize,
    table: Mutex<SlotTable>,
}

impl<F: FabricHandle> std::fmt::Debug for ItemSlots<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("ItemSlots").field("info", &self.info).finish()
    }
}

impl<F: FabricHandle> Publisher for ItemSlots<F> {
    fn apply(&self, store: &Store, effects: &Effects) {
        if !effects.committed.is_empty() {
            self.publish_committed(store, effects.committed.iter().map(|key| &key[..]));
        }
        if !effects.prepared.is_empty() {
            self.note_prepared_each(effects.prepared.iter().map(|(ts, key)| (*ts, &key[..])));
        }
        if !effects.reclaimed.is_empty() {
            self.free_reclaimed(effects.reclaimed.iter().map(|(ts, key)| (*ts, &key[..])));
        }
    }
    fn locate(&self, store: &Store, key: &[u8]) -> Option<u32> {
        ItemSlots::locate(self, store, key)
    }
    fn set_lease_word(&self, word: u64) {
        self.region.store(self.lease_word_offset / 8, word, StoreOrdering::Release);
    }
    fn invalidate_all(&self) {
        let mut table = self.table.lock();
        let SlotTable { entries, free, next_unused, writer, .. } = &mut *table;
        for (_, entry) in entries.drain() {
            // Cannot fail: the slot is inside the region (checked when it was assigned).
            let _ = writer.set_flags(&*self.region, self.offset(entry.index), self.config.slot_bytes, 0);
        }
        free.clear();
        *next_unused = 0;
    }
}

impl<F: FabricHandle> ItemSlots<F> {
    /// Registers an item region (read-only for peers) of `config.slots` slots and the lease
    /// line; its lease word says [`LEASE_WORD_UNLEASED`] until the server sets it.
    pub fn register(fabric: &F, name: &str, config: ItemSlotConfig) -> Result<Self, ItemSlotsError> {
        config.validate()?;
        let (slots, slot_bytes) = (config.slots, config.slot_bytes);
        // Validated: slots x slot_bytes is at most ITEM_REGION_BYTES_MAX, far from overflowing.
        let lease_word_offset =
            lease_word_offset(slots, slot_bytes).ok_or(ItemSlotsError::RegionTooLarge { slots, slot_bytes })?;
        let region = fabric.register(name, lease_word_offset + LEASE_LINE_BYTES, Access::ReadOnly)?;
        let info = ItemRegionInfo {
            region: fabric.describe(&region),
            slot_bytes: config.slot_bytes as u64,
            slots: config.slots as u64,
        };
        let table = SlotTable {
            entries: HashMap::default(),
            free: Vec::new(),
            next_unused: 0,
            writer: SlotWriter::new(config.slot_bytes),
            metadata: Vec::with_capacity(256),
            stats: ItemSlotStats::default(),
        };
        let slots = Self { region: Arc::new(region), info, config, lease_word_offset, table: Mutex::new(table) };
        slots.set_lease_word(LEASE_WORD_UNLEASED);
        Ok(slots)
    }

    /// The descriptor clients map.
    pub fn info(&self) -> &ItemRegionInfo {
        &self.info
    }

    /// Counters.
    pub fn stats(&self) -> ItemSlotStats {
        let table = self.table.lock();
        ItemSlotStats { used: table.entries.len(), ..table.stats }
    }

    /// Publishes the latest committed version of each key that has a slot (after a COMMIT,
    /// PUT or COMMIT_LOCKED that advanced them), where it is newer than its slot's. A key
    /// without a slot gets none here: only GET_LOCATE hands slots out (module docs).
    pub fn publish_committed<'k>(&self, store: &Store, keys: impl IntoIterator<Item = &'k [u8]>) {
        let mut table = self.table.lock();
        for key in keys {
            if table.entries.contains_key(key) {
                self.publish_latest(&mut table, store, key);
            }
        }
    }

    /// The slot of each key, publishing its latest committed version first if it is newer than
    /// the slot's or the key has no slot yet (GET_LOCATE). `None`: the key has no committed
    /// version, does not fit, or found no free slot.
    pub fn locate(&self, store: &Store, key: &[u8]) -> Option<u32> {
        let mut table = self.table.lock();
        self.publish_latest(&mut table, store, key)
    }

    /// PREPARE of version `ts` of `keys`: marks slots holding an older version with the
    /// newer-prepared bit.
    pub fn note_prepared<'k>(&self, ts: Timestamp, keys: impl IntoIterator<Item = &'k [u8]>) {
        self.note_prepared_each(keys.into_iter().map(|key| (ts, key)));
    }

    /// [`ItemSlots::note_prepared`] of (ts, key) pairs, under one lock.
    fn note_prepared_each<'k>(&self, prepared: impl IntoIterator<Item = (Timestamp, &'k [u8])>) {
        let mut table = self.table.lock();
        let SlotTable { entries, writer, stats, .. } = &mut *table;
        for (ts, key) in prepared {
            let Some(entry) = entries.get_mut(key) else { continue };
            if ts <= entry.ts {
                continue;
            }
            entry.prepared_max = entry.prepared_max.max(ts);
            if entry.flags & SLOT_FLAG_NEWER_PREPARED == 0 {
                let flags = SLOT_FLAG_VALID | SLOT_FLAG_NEWER_PREPARED;
                if writer.mark_newer_prepared(&*self.region, self.offset(entry.index), self.config.slot_bytes).is_ok() {
                    entry.flags = flags;
                    stats.newer_prepared_marks += 1;
                }
            }
        }
    }

    /// Keys the store removed after reclaiming them (expired), each with the timestamp of its
    /// last version: their slots are invalidated and freed, unless a newer version was
    /// published since (the key was written again).
    pub fn free_reclaimed<'k>(&self, reclaimed: impl IntoIterator<Item = (Timestamp, &'k [u8])>) {
        let mut table = self.table.lock();
        let SlotTable { entries, free, writer, .. } = &mut *table;
        for (ts, key) in reclaimed {
            if entries.get(key).is_none_or(|entry| entry.ts > ts) {
                continue;
            }
            let entry = entries.remove(key).expect("looked up above");
            // Cannot fail: the slot is inside the region (checked when it was assigned).
            let _ = writer.set_flags(&*self.region, self.offset(entry.index), self.config.slot_bytes, 0);
            free.push(entry.index);
        }
    }

    fn offset(&self, index: u32) -> usize {
        index as usize * self.config.slot_bytes
    }

    /// Publishes `key`'s latest committed version into its slot if newer (allocating a slot if
    /// it has none). Returns the slot, if the key has one afterwards.
    fn publish_latest(&self, table: &mut SlotTable, store: &Store, key: &[u8]) -> Option<u32> {
        // Read under the table lock: the ts compared is the ts written, so slot ts only grows.
        // From now on the key counts as read at every moment (its slot is read one-sidedly).
        let Some(version) = store.get_latest_for_slot(key) else {
            return table.entries.get(key).map(|entry| entry.index);
        };
        let SlotTable { entries, free, next_unused, writer, metadata, stats } = table;
        // One lookup here and one to record the publish (the key is copied only for a new entry).
        let existing = entries.get(key).map(|entry| (entry.index, entry.ts, entry.prepared_max));
        if let Some((index, ts, _)) = existing {
            if version.ts <= ts {
                return Some(index);
            }
        }
        metadata.clear();
        version.metadata.as_wire().encode(&mut Encoder::new(metadata));
        let needed = slot_bytes(key.len(), metadata.len(), version.value.len());
        if needed > self.config.slot_bytes {
            stats.too_large += 1;
            if let Some(entry) = entries.remove(key) {
                // Never leave an older version served while a newer one is committed.
                let _ = writer.set_flags(&*self.region, self.offset(entry.index), self.config.slot_bytes, 0);
                free.push(entry.index);
            }
            return None;
        }
        let index = match existing {
            Some((index, _, _)) => index,
            None => match free.pop() {
                Some(index) => index,
                None if (*next_unused as usize) < self.config.slots => {
                    *next_unused += 1;
                    *next_unused - 1
                }
                None => {
                    stats.no_free_slot += 1;
                    return None;
                }
            },
        };
        // Only committed versions are published, and a slot's version only grows.
        debug_assert!(version.ts <= store.last_commit(key), "publishing an uncommitted version");
        assert!((index as usize) < self.config.slots, "slot {index} outside the region");
        let prepared_max = existing.map_or(0, |(_, _, prepared_max)| prepared_max);
        let flags = SLOT_FLAG_VALID | if prepared_max > version.ts { SLOT_FLAG_NEWER_PREPARED } else { 0 };
        let published = writer.publish(
            &*self.region,
            self.offset(index),
            self.config.slot_bytes,
            key,
            version.ts,
            version.expiry.to_word(),
            metadata,
            &version.value,
            flags,
        );
        if published.is_err() {
            // Checked above; a failure here leaves the slot as it was (nothing was written).
            if existing.is_none() {
                free.push(index);
            }
            return existing.map(|(index, _, _)| index);
        }
        stats.publishes += 1;
        match entries.get_mut(key) {
            Some(entry) => {
                assert!(entry.ts < version.ts && entry.index == index, "a slot went back or moved");
                entry.ts = version.ts;
                entry.flags = flags;
            }
            None => {
                entries.insert(key.into(), SlotEntry { index, ts: version.ts, prepared_max: 0, flags });
            }
        }
        Some(index)
    }

    /// TEST HOOK (fault injection): overwrites slot `index` with `words` (wrapping over the
    /// slot), as a buggy server or a stray write would. Nothing outside the slot is touched.
    #[doc(hidden)]
    pub fn scribble_for_test(&self, index: u32, words: &[u64]) {
        let _table = self.table.lock();
        if index as usize >= self.config.slots || words.is_empty() {
            return;
        }
        let first = self.offset(index) / 8;
        for word in 0..self.config.slot_bytes / 8 {
            self.region.store(first + word, words[word % words.len()], StoreOrdering::Release);
        }
    }

    /// TEST HOOK: publishes `key` with `ts`, `metadata` (wire-encoded) and `value` into slot
    /// `index` regardless of the table (e.g. to make a cached slot hold another key).
    #[doc(hidden)]
    pub fn overwrite_for_test(&self, index: u32, key: &[u8], ts: Timestamp, metadata: &[u8], value: &[u8]) {
        let mut table = self.table.lock();
        if index as usize >= self.config.slots {
            return;
        }
        let offset = self.offset(index);
        let _ = table.writer.publish(
            &*self.region,
            offset,
            self.config.slot_bytes,
            key,
            ts,
            0,
            metadata,
            value,
            SLOT_FLAG_VALID,
        );
    }

    /// The slot `key` has, if any (tests and statistics).
    pub fn slot_of(&self, key: &[u8]) -> Option<u32> {
        self.table.lock().entries.get(key).map(|entry| entry.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rampkv_core::storage::StoredMetadata;
    use rampkv_core::wire::WriteSet;
    use rampkv_fabric::{read_slot, Fabric, OneSided, ShmFabric, ShmRemoteRegion, SlotReadError};

    static NAMES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn slots(config: ItemSlotConfig) -> (ShmFabric, ItemSlots<ShmFabric>, ShmRemoteRegion) {
        let fabric = ShmFabric::new().unwrap();
        let name = format!("items-test-{}", NAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let slots = ItemSlots::register(&fabric, &name, config).unwrap();
        let remote = fabric.map(&slots.info().region).unwrap();
        (fabric, slots, remote)
    }

    fn prepare(store: &Store, ts: Timestamp, key: &[u8], value: &[u8]) {
        let metadata = StoredMetadata::write_set(&[key]).unwrap();
        store.prepare(ts, metadata, WriteSet::default(), vec![(key.into(), value.into())], 0).unwrap();
    }

    /// (ts, value, newer_prepared) of `key`'s slot as a client reads it.
    fn read<F: OneSided<RemoteRegion = ShmRemoteRegion>>(
        fabric: &F,
        remote: &ShmRemoteRegion,
        slots: &ItemSlots<ShmFabric>,
        key: &[u8],
    ) -> Result<(Timestamp, Vec<u8>, bool), SlotReadError> {
        let index = slots.slot_of(key).expect("the key has a slot");
        let bytes = slots.config.slot_bytes;
        let mut buffer = vec![0; bytes];
        let view = read_slot(fabric, remote, index as usize * bytes, bytes, key, &mut buffer)?;
        Ok((view.ts(), view.value().to_vec(), view.newer_prepared()))
    }

    #[test]
    fn only_committed_versions_are_published_and_the_bit_marks_a_newer_prepared_one() {
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 4, slot_bytes: 256 });
        let store = Store::new(1_000);
        prepare(&store, 10, b"a", b"ten");
        slots.note_prepared(10, [&b"a"[..]]);
        assert_eq!(slots.locate(&store, b"a"), None, "a prepared version is not published");
        assert_eq!(slots.slot_of(b"a"), None);
        store.commit(10);
        assert_eq!(slots.locate(&store, b"a"), Some(0), "committed: published on demand");
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (10, b"ten".to_vec(), false));
        prepare(&store, 20, b"a", b"twenty");
        slots.note_prepared(20, [&b"a"[..]]);
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (10, b"ten".to_vec(), true), "still 10, marked");
        store.commit(20);
        slots.publish_committed(&store, [&b"a"[..]]);
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (20, b"twenty".to_vec(), false), "bit cleared");
    }

    #[test]
    fn the_server_core_publishes_on_commit_requests_and_on_a_recovery_commit() {
        use rampkv_core::protocol::server::{Now, ServerCore};
        use rampkv_core::protocol::ConnectionId;
        use rampkv_core::wire::{Request, Write};
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 4, slot_bytes: 256 });
        let slots = Arc::new(slots);
        let servers = crate::server::Servers::new(vec![Arc::new(ServerCore::new(1_000))]);
        servers.attach_item_slots(0, Arc::clone(&slots) as Arc<dyn Publisher>).unwrap();
        let served = &servers.served()[0];
        let mut effects = Effects::default();
        let mut handle = |request, id| served.serve(ConnectionId::default(), request, id, Now::default(), &mut effects);
        let prepare = |ts: Timestamp, value: &[u8]| Request::Prepare {
            ts,
            metadata: rampkv_core::wire::Metadata::WriteSet(rampkv_core::wire::WriteSet::from_keys(&[b"a"]).unwrap()),
            write_set: Vec::new(),
            writes: vec![Write::new(b"a".to_vec(), value.to_vec())],
        };
        handle(prepare(10, b"ten"), 1);
        handle(Request::Commit { ts: 10 }, 2);
        assert_eq!(slots.slot_of(b"a"), None, "no slot before a GET_LOCATE asks for one");
        assert_eq!(served.locate(b"a"), Some(0));
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (10, b"ten".to_vec(), false));
        handle(prepare(20, b"twenty"), 3);
        assert!(read(&fabric, &remote, &slots, b"a").unwrap().2, "newer prepared");
        assert_eq!(served.commit(20), 1, "what recovery calls");
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (20, b"twenty".to_vec(), false));
        handle(prepare(30, b"thirty"), 4);
        handle(Request::Commit { ts: 30 }, 5);
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (30, b"thirty".to_vec(), false));
    }

    /// Issue 31 (memory): a key written but never located (a RESP client's) gets no slot, so
    /// no second copy of its value in the item region and no publish on its writes; once a
    /// GET_LOCATE gave it one, every commit republishes it; and it then counts as read at
    /// every moment, so its superseded versions keep the grace period.
    #[test]
    fn commits_publish_only_keys_a_get_locate_gave_a_slot() {
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 4, slot_bytes: 256 });
        let store = Store::new_tracking_reads(1_000);
        let write_set = |key: &[u8]| StoredMetadata::write_set(&[key, b"z"]).unwrap();
        let write = |ts: Timestamp, key: &[u8], value: &[u8]| {
            let writes = vec![(Key::from(key), Box::from(value))];
            store.prepare(ts, write_set(key), WriteSet::default(), writes, 20_000).unwrap();
            store.commit(ts);
        };
        write(10, b"a", b"ten");
        write(11, b"b", b"eleven");
        slots.publish_committed(&store, [&b"a"[..], b"b"]);
        assert_eq!((slots.stats().used, slots.stats().publishes), (0, 0), "nothing located, nothing published");
        assert_eq!(slots.locate(&store, b"a"), Some(0));
        write(20, b"a", b"twenty");
        write(21, b"b", b"twenty-one");
        slots.publish_committed(&store, [&b"a"[..], b"b"]);
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap(), (20, b"twenty".to_vec(), false));
        assert_eq!((slots.slot_of(b"b"), slots.stats().publishes), (None, 2), "b still has no slot");
        // Nobody read either over the server (the store's clock is past the grace): b's old
        // version went at its commit; a's, read through its slot, is kept.
        assert_eq!(store.get_at(b"b", 11), Err(rampkv_core::storage::StoreError::VersionGone { ts: 11 }));
        assert_eq!(store.get_at(b"a", 10).map(|version| version.ts), Ok(10));
    }

    #[test]
    fn the_lease_word_follows_the_slots_and_invalidating_all_serves_no_old_slot() {
        use rampkv_fabric::{LoadOrdering, OneSided};
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 3, slot_bytes: 136 });
        // 3 x 136 = 408 bytes of slots: the lease word is on the next 64-byte boundary.
        let offset = lease_word_offset(3, 136).unwrap();
        assert_eq!(offset, 448);
        assert!(fabric.remote_len_bytes(&remote) >= offset + LEASE_LINE_BYTES);
        let word = || fabric.read_word(&remote, offset, LoadOrdering::Acquire).unwrap();
        assert_eq!(word(), LEASE_WORD_UNLEASED, "a new region says unleased until its server says otherwise");
        slots.set_lease_word(lease_word_of(123_456_789));
        assert_eq!(word(), 123_456_789);
        slots.set_lease_word(lease_word_of(0));
        assert_eq!(word(), LEASE_WORD_UNLEASED);
        assert_eq!(lease_word_of(u64::MAX), LEASE_WORD_NOT_NEEDED - 1, "a lease end never reads as not needed");
        slots.set_lease_word(LEASE_WORD_NOT_NEEDED);
        assert_eq!(word(), LEASE_WORD_NOT_NEEDED);
        let store = Store::new(1_000);
        for (ts, key) in [(10, &b"a"[..]), (11, b"b")] {
            prepare(&store, ts, key, b"value");
            store.commit(ts);
        }
        assert_eq!((slots.locate(&store, b"a"), slots.locate(&store, b"b")), (Some(0), Some(1)));
        let indexes = [slots.slot_of(b"a").unwrap(), slots.slot_of(b"b").unwrap()];
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap().0, 10);
        slots.invalidate_all();
        assert_eq!((slots.slot_of(b"a"), slots.stats().used), (None, 0), "every slot forgotten");
        for (index, key) in indexes.iter().zip([&b"a"[..], b"b"]) {
            let mut buffer = vec![0; 136];
            let old = read_slot(&fabric, &remote, *index as usize * 136, 136, key, &mut buffer);
            assert!(matches!(old, Err(SlotReadError::NotValid)), "slot {index} still serves: {old:?}");
        }
        assert_eq!(word(), LEASE_WORD_NOT_NEEDED, "the lease word is not a slot");
        assert_eq!(slots.locate(&store, b"b"), Some(0), "published again on demand");
        assert_eq!(read(&fabric, &remote, &slots, b"b").unwrap().0, 11);
    }

    #[test]
    fn a_late_commit_of_an_older_version_never_moves_the_slot_back() {
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 4, slot_bytes: 256 });
        let store = Store::new(1_000);
        prepare(&store, 10, b"a", b"ten");
        prepare(&store, 20, b"a", b"twenty");
        store.commit(20);
        assert_eq!(slots.locate(&store, b"a"), Some(0));
        store.commit(10);
        slots.publish_committed(&store, [&b"a"[..]]);
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap().0, 20);
        assert_eq!(slots.stats().publishes, 1);
    }

    #[test]
    fn a_version_that_outgrows_its_slot_frees_it_and_full_tables_publish_nothing() {
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 1, slot_bytes: 128 });
        let store = Store::new(1_000);
        prepare(&store, 10, b"a", b"small");
        store.commit(10);
        assert_eq!(slots.locate(&store, b"a"), Some(0));
        prepare(&store, 11, b"b", b"small");
        store.commit(11);
        assert_eq!(slots.locate(&store, b"b"), None, "no free slot");
        prepare(&store, 12, b"a", &[1; 200]);
        store.commit(12);
        let index = slots.slot_of(b"a").unwrap();
        slots.publish_committed(&store, [&b"a"[..]]);
        assert_eq!(slots.slot_of(b"a"), None, "freed");
        let mut buffer = vec![0; 128];
        let stale = read_slot(&fabric, &remote, index as usize * 128, 128, b"a", &mut buffer);
        assert!(matches!(stale, Err(SlotReadError::NotValid)), "the old version is no longer served: {stale:?}");
        assert_eq!(slots.locate(&store, b"b"), Some(0), "b takes the slot over");
        assert_eq!(read(&fabric, &remote, &slots, b"b").unwrap().0, 11);
        let stats = slots.stats();
        assert_eq!((stats.used, stats.too_large, stats.no_free_slot), (1, 1, 1));
    }

    #[test]
    fn concurrent_publishers_keep_the_slot_increasing_and_readers_see_whole_versions() {
        let (fabric, slots, remote) = slots(ItemSlotConfig { slots: 4, slot_bytes: 512 });
        let (store, slots) = (Arc::new(Store::new(50)), Arc::new(slots));
        let value_of = |ts: u64| -> Vec<u8> {
            ts.to_le_bytes().iter().copied().cycle().take(8 * (ts % 40) as usize + 8).collect()
        };
        prepare(&store, 1, b"a", &value_of(1));
        store.commit(1);
        assert_eq!(slots.locate(&store, b"a"), Some(0));
        let publishers: Vec<_> = (0..2u64)
            .map(|thread| {
                let (store, slots) = (Arc::clone(&store), Arc::clone(&slots));
                std::thread::spawn(move || {
                    for round in 1..=3_000u64 {
                        let ts = round * 2 + thread;
                        prepare(&store, ts, b"a", &value_of(ts));
                        slots.note_prepared(ts, [&b"a"[..]]);
                        store.commit(ts);
                        slots.publish_committed(&store, [&b"a"[..]]);
                    }
                })
            })
            .collect();
        let mut last = 0;
        let mut accepted = 0;
        while publishers.iter().any(|publisher| !publisher.is_finished()) {
            match read(&fabric, &remote, &slots, b"a") {
                Ok((ts, value, _)) => {
                    assert!(ts >= last, "the slot went back from {last} to {ts}");
                    assert_eq!(&value[..8], &ts.to_le_bytes(), "value of another version");
                    assert_eq!(value, value_of(ts), "a whole version");
                    last = ts;
                    accepted += 1;
                }
                Err(SlotReadError::Torn { .. }) => {}
                Err(other) => panic!("{other}"),
            }
        }
        for publisher in publishers {
            publisher.join().unwrap();
        }
        assert!(accepted > 0);
        assert_eq!(read(&fabric, &remote, &slots, b"a").unwrap().0, store.last_commit(b"a"));
    }
}
