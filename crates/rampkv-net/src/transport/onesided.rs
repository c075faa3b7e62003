//! The one-sided transport (the paper's GET\*/PUT+): round-1 reads are one-sided reads of the
//! servers' item slots; everything else goes over the write-poll rings (GET+/PUT+).
//!
//! # How a GET is served
//! A GET whose selectors are all LATEST or LATEST_TS, to a server that announced an item
//! region, with every key in the **address cache** (key -> server and slot), is read
//! one-sidedly: each slot with `rampkv_fabric::read_slot` (seqlock, checksum, trailer seq copy
//! and key check; bounded retries). If every slot verifies and holds its key, the VERSIONS
//! reply is synthesized locally and delivered by the next `poll` (LATEST_TS: the timestamp
//! only, as the server answers it). Where reads are round trips (RDMA), the lease word and all
//! of a request's slots are read together, one doorbell and one round trip, each image checked
//! with `rampkv_fabric::verify_image` and only a torn one read again with `read_slot`. Otherwise the request goes over the ring as GET_LOCATE,
//! whose reply (VERSIONS_LOCATED) also names each key's slot: the transport fills the cache
//! from it and hands the driver a plain VERSIONS reply. Round-2 reads (EXACT, HIGHEST_OF),
//! PREPARE/COMMIT/PUT, locks and STATUS go over the rings unchanged; the protocol state
//! machines never see a difference.
//!
//! A slot that fails a check (torn in every attempt, another key, not valid, over its
//! capacity, undecodable metadata) evicts the key's cache entry, and the request falls back to
//! GET_LOCATE, which re-learns where (and whether) the key is published. With
//! [`OneSidedOptions::newer_prepared_fallback`] a slot whose "newer version prepared" bit is
//! set also falls back (without eviction): the reader asks the server, which may have
//! committed the newer version by then. Off by default: the slot's version is committed and
//! any committed version is a valid round-1 answer for RAMP.
//!
//! # Reads trust a lease (a deposed primary that is still alive)
//! With failover, a server's item region ends with a lease word (`crate::item_slots`): the end
//! of the lease it serves under, on the host's monotonic clock. Every GET\* read loads it
//! (one atomic 8-byte load per request, before the slots) and, unless it says no lease is
//! needed, reads the clock *after* the slots: the read is accepted only if that reading is
//! [`GETSTAR_LEASE_MARGIN_US`] or more before the end. Every slot was then read before the end
//! of the server's lease, while no other server could be the primary of its partitions (the
//! configuration service promotes a backup only after a lease lapsed, on its own clock with a
//! drift margin). Otherwise the request goes to the server as GET_LOCATE (GET+), without
//! evicting anything: a deposed server's lease gate refuses it with `NotPrimary`, which makes
//! the client follow the failover; a server whose renewal was merely late answers it.
//! A region's word settles for the region's life once it says no lease is needed (a server
//! without a configuration service sets it so once, for good), or, for a region on another
//! host, once it holds a lease's end (such a server never says otherwise): from then on GET\*
//! does not read it again, or sends that server's reads straight to it (GET+), instead of
//! reading slots it would refuse (`KnownLease`; over RDMA one READ less per GET\*).
//! The end is on the server host's `CLOCK_MONOTONIC`: a client on another host (its region
//! mapped over RDMA) reads the word as well (an RDMA READ), but cannot compare it with its own
//! clock (neither origin nor rate is shared: docs/replication.md), so it trusts that server's
//! slots only when the word says no lease is needed, and otherwise asks the server (GET+),
//! whose lease gate is the fence: a cluster with failover across hosts reads over GET+ until
//! leases are on a clock both sides relate to (the fix docs/replication.md describes).
//!
//! # Why round 1 from a slot is correct
//! A slot only ever holds a committed version with the metadata it was written with
//! (`crate::item_slots`), and RAMP's round 1 may return any committed version. Round 2 asks
//! the server (GET+) for the versions the metadata names, which it keeps for the GC grace
//! period; a slot lags `lastCommit` by one COMMIT's handling at most.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ahash::AHashMap as HashMap;
use rampkv_fabric::limits::{VERBS_BOUNCE_BYTES, VERBS_READ_BATCH_MAX};
use rampkv_fabric::slot::SLOT_BYTES_MIN;
use rampkv_fabric::{read_slot, verify_image, Access, LoadOrdering, SlotReadError};
use serde::Serialize;

use super::client::{ClientTransport, ServerEvent};
pub use super::error::ItemRegionError;
use super::error::TransportError;
use super::medium::Transport;
pub use super::stats::GetStarStats;
use crate::item_slots::{lease_word_offset, LEASE_LINE_BYTES, LEASE_WORD_NOT_NEEDED};
use crate::message::control::ItemRegionInfo;
use crate::message::fabric::FabricClient;
use crate::message::fabric::FabricHandle;
use crate::message::fallback::Fallback as MediumFallback;
use crate::message::ring::Ring;
use rampkv_core::limits::{
    ADDRESS_CACHE_ENTRIES_MAX, GETSTAR_LEASE_MARGIN_US, ITEM_REGION_BYTES_MAX, WRITEPOLL_SLEEP_MS_MAX,
};
use rampkv_core::types::Expiry;
use rampkv_core::wire::{Decoder, GetItem, Metadata, Request, Response, Selector, VersionItem};

/// Bytes of the lease word read with the slots.
const LEASE_WORD_BYTES: usize = 8;
/// Most bytes of slot images read in one batch (with the lease word: one verbs bounce buffer).
const GETSTAR_BATCH_BYTES: usize = VERBS_BOUNCE_BYTES - LEASE_WORD_BYTES;
/// Most reads in one batch (the lease word's included).
const GETSTAR_BATCH_READS_MAX: usize = VERBS_READ_BATCH_MAX;

/// Options of the one-sided transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OneSidedOptions {
    /// Fall back to GET+ when a slot's "newer version prepared" bit is set (the paper's
    /// invalid bit). Default off.
    pub newer_prepared_fallback: bool,
    /// Most address-cache entries (at most `ADDRESS_CACHE_ENTRIES_MAX`).
    pub address_cache_entries: usize,
}

impl Default for OneSidedOptions {
    fn default() -> Self {
        Self { newer_prepared_fallback: false, address_cache_entries: ADDRESS_CACHE_ENTRIES_MAX }
    }
}

/// Why a GET was not served one-sidedly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fallback {
    Miss,
    Torn,
    WrongKey,
    NotValid,
    Corrupt,
    NewerPrepared,
    Unleased,
}

/// A server's item region, mapped read-only.
#[derive(Debug)]
struct ItemRegion<R> {
    remote: R,
    slot_bytes: usize,
    slots: u32,
    /// Byte offset of the lease word (after the last slot).
    lease_word_offset: usize,
    /// The region's owner runs on this host (its descriptor names this host, or no host): its
    /// lease word's end is on the clock this process reads. A region on another host (mapped
    /// over RDMA) has its end on another host's clock, which this one cannot compare with: its
    /// slots are trusted only where no lease is needed (module docs).
    same_clock: bool,
    /// What the lease word has shown of the region's owner so far (it reads the word until
    /// the word settles that for the region's life).
    lease: KnownLease,
}

/// What a region's lease word says for as long as the region lives. A server sets its word
/// once it has item slots: to [`LEASE_WORD_NOT_NEEDED`] for good if it runs without a
/// configuration service (nothing can depose it), otherwise to its lease ends from then on,
/// which never read as not needed (`crate::item_slots`). A new region says unleased until
/// then, which settles nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KnownLease {
    /// Not settled: every GET\* reads the word.
    Unknown,
    /// The owner needs no lease: the word is not read again (one READ less per GET\* over
    /// RDMA).
    NotNeeded,
    /// The owner serves under leases on another host's clock, which this process cannot
    /// compare with: its slots are never trusted, so GET\* goes to the server at once (GET+)
    /// instead of reading slots it would then refuse.
    OtherClock,
}

impl KnownLease {
    /// What a word read from a region (of this host's clock or not) settles.
    fn learn(self, word: u64, same_clock: bool) -> KnownLease {
        match word {
            LEASE_WORD_NOT_NEEDED => KnownLease::NotNeeded,
            crate::item_slots::LEASE_WORD_UNLEASED => self,
            _ if !same_clock => KnownLease::OtherClock,
            _ => self,
        }
    }
}

/// Where a key's slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Location {
    server: u32,
    slot: u32,
}

/// The bounded address cache: key -> (server, slot).
#[derive(Debug)]
struct AddressCache {
    entries: HashMap<Box<[u8]>, Location>,
    capacity: usize,
}

impl AddressCache {
    fn get(&self, key: &[u8]) -> Option<Location> {
        self.entries.get(key).copied()
    }

    /// Returns whether the entry is new or changed.
    fn insert(&mut self, key: &[u8], location: Location) -> bool {
        if let Some(entry) = self.entries.get_mut(key) {
            let changed = *entry != location;
            *entry = location;
            return changed;
        }
        if self.entries.len() >= self.capacity {
            // Full: make room by dropping an arbitrary entry (a later miss re-learns it).
            let victim = self.entries.keys().next().cloned();
            if let Some(victim) = victim {
                self.entries.remove(&victim);
            }
        }
        self.entries.insert(key.into(), location);
        true
    }

    fn evict(&mut self, key: &[u8]) -> bool {
        self.entries.remove(key).is_some()
    }
}

/// GET\* reads over item slots, everything else over the write-poll transport.
pub struct GetStarTransport<F: FabricHandle> {
    inner: Transport<MediumFallback<F, Ring>>,
    fabric: F,
    /// Per server: its item region, if it announced one.
    regions: Vec<Option<ItemRegion<F::RemoteRegion>>>,
    cache: AddressCache,
    /// Replies synthesized from slots, delivered by the next `poll`.
    ready: VecDeque<(usize, u64, Response)>,
    /// GET_LOCATE requests in flight: (server, request id) -> their keys.
    locating: HashMap<(usize, u64), Vec<Box<[u8]>>>,
    /// Slot read buffer (the largest slot of any server).
    buffer: Vec<u8>,
    /// The lease word and slot images of one batched read (round-trip fabrics only; grown on
    /// first use, at most `LEASE_WORD_BYTES + GETSTAR_BATCH_BYTES` or one slot more).
    batch: Vec<u8>,
    options: OneSidedOptions,
    stats: GetStarStats,
    /// When the servers' control connections were last checked (a read answered from slots
    /// never waits, and a wait is where the write-poll transport checks them).
    peers_checked: Instant,
}

impl<F: FabricHandle> std::fmt::Debug for GetStarTransport<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("GetStarTransport").field("stats", &self.stats).finish()
    }
}

impl<F: FabricHandle> GetStarTransport<F> {
    /// Connects to every server's control address as the write-poll transport does and maps the
    /// item region each server announces, read-only.
    pub fn connect(control_addresses: &[String], options: OneSidedOptions) -> Result<Self, TransportError> {
        Self::connect_with(F::open().map_err(|error| TransportError::Open(error.into()))?, control_addresses, options)
    }

    /// [`GetStarTransport::connect`] over `fabric` (a handle of its own, e.g. the in-memory
    /// fabric in its fault mode, which then tears the slot reads).
    pub fn connect_with(
        fabric: F,
        control_addresses: &[String],
        options: OneSidedOptions,
    ) -> Result<Self, TransportError> {
        Self::connect_with_fallback(fabric, control_addresses, &[], options)
    }

    /// [`GetStarTransport::connect`] that reaches server i over TCP at `tcp_addresses[i]` where
    /// the fabric cannot (`crate::message::fallback`): that server's reads go to it as plain GETs.
    pub fn connect_or_tcp(
        control_addresses: &[String],
        tcp_addresses: &[String],
        options: OneSidedOptions,
    ) -> Result<Self, TransportError> {
        let fabric = F::open().map_err(|error| TransportError::Open(error.into()))?;
        Self::connect_with_fallback(fabric, control_addresses, tcp_addresses, options)
    }

    fn connect_with_fallback(
        fabric: F,
        control_addresses: &[String],
        tcp_addresses: &[String],
        options: OneSidedOptions,
    ) -> Result<Self, TransportError> {
        let medium = FabricClient::with_fabric(fabric, control_addresses.len()).map_err(TransportError::Open)?;
        let inner = Transport::with_medium(MediumFallback::new(medium, tcp_addresses), control_addresses)?;
        let fabric = inner.medium().fabric().clone();
        let mut regions = Vec::with_capacity(control_addresses.len());
        for server in 0..control_addresses.len() {
            let info = inner.medium().item_region(server);
            let region = info.map(|info| map_item_region(&fabric, info)).transpose();
            regions.push(region.map_err(|error| TransportError::ItemRegion { server, error })?);
        }
        let slot_bytes_max = regions.iter().flatten().map(|region| region.slot_bytes).max().unwrap_or(0);
        let capacity = options.address_cache_entries.clamp(1, ADDRESS_CACHE_ENTRIES_MAX);
        Ok(Self {
            inner,
            fabric,
            regions,
            cache: AddressCache { entries: HashMap::default(), capacity },
            ready: VecDeque::new(),
            locating: HashMap::default(),
            buffer: vec![0; slot_bytes_max],
            batch: Vec::new(),
            options,
            stats: GetStarStats::default(),
            peers_checked: Instant::now(),
        })
    }

    /// The GET\* counters so far.
    pub fn stats(&self) -> GetStarStats {
        self.stats
    }

    /// Entries in the address cache.
    pub fn cached_addresses(&self) -> usize {
        self.cache.entries.len()
    }

    /// Reads every item of a GET from slots; `Err` names the first reason it cannot.
    fn read_slots(&mut self, server: usize, items: &[GetItem]) -> Result<Vec<VersionItem>, Fallback> {
        let batched = self
            .regions
            .get(server)
            .and_then(Option::as_ref)
            .is_some_and(|region| self.fabric.reads_are_round_trips(&region.remote));
        if batched {
            return self.read_slots_batched(server, items);
        }
        let Some(region) = self.regions.get(server).and_then(Option::as_ref) else {
            return Err(Fallback::Miss);
        };
        // The lease word first, the clock after the slots (module docs). A word that cannot be
        // read (it can: the region was checked to hold it) counts as no lease.
        let lease_end = match region.lease {
            KnownLease::NotNeeded => LEASE_WORD_NOT_NEEDED,
            KnownLease::OtherClock => return Err(Fallback::Unleased),
            KnownLease::Unknown => {
                self.stats.lease_word_reads += 1;
                self.fabric
                    .read_word(&region.remote, region.lease_word_offset, LoadOrdering::Acquire)
                    .unwrap_or(crate::item_slots::LEASE_WORD_UNLEASED)
            }
        };
        let mut versions = Vec::with_capacity(items.len());
        for item in items {
            let Some(location) = self.cache.get(&item.key) else {
                return Err(Fallback::Miss);
            };
            if location.server as usize != server || location.slot >= region.slots {
                self.stats.evictions += u64::from(self.cache.evict(&item.key));
                return Err(Fallback::Miss);
            }
            let offset = location.slot as usize * region.slot_bytes;
            let read = read_slot(&self.fabric, &region.remote, offset, region.slot_bytes, &item.key, &mut self.buffer);
            match judge(read, 0, &item.selector, self.options.newer_prepared_fallback) {
                Ok((version, retries)) => {
                    self.stats.torn_retries += retries;
                    self.stats.slots_accepted += 1;
                    versions.push(version);
                }
                Err(Judged::NewerPrepared) => return Err(Fallback::NewerPrepared),
                Err(Judged::Failed(failure)) => {
                    // A failed check: forget the address; GET_LOCATE re-learns it.
                    self.stats.evictions += u64::from(self.cache.evict(&item.key));
                    return Err(failure);
                }
            }
        }
        self.settle_lease(server, lease_end)?;
        Ok(versions)
    }

    /// Notes what `lease_end`, just read from `server`'s region, settles for the region's life
    /// ([`KnownLease`]); `Err` unless it lets this process trust the slots read before it.
    fn settle_lease(&mut self, server: usize, lease_end: u64) -> Result<(), Fallback> {
        let Some(region) = self.regions.get_mut(server).and_then(Option::as_mut) else {
            return Err(Fallback::Miss);
        };
        region.lease = region.lease.learn(lease_end, region.same_clock);
        match lease_trusted(lease_end, region.same_clock) {
            true => Ok(()),
            false => Err(Fallback::Unleased),
        }
    }

    /// [`Self::read_slots`] over a fabric whose reads are round trips (RDMA): the lease word and
    /// the slots in one [`rampkv_fabric::OneSided::read_many`] (one doorbell, one round trip; groups of
    /// `GETSTAR_BATCH_BYTES`), each image checked by [`verify_image`], and only a torn one read
    /// again with [`read_slot`]. The lease word is staged first: one reliable connection's
    /// READs execute in posted order, so it is read before every slot, as the sequential path
    /// reads it; the clock is still read after the last slot.
    fn read_slots_batched(&mut self, server: usize, items: &[GetItem]) -> Result<Vec<VersionItem>, Fallback> {
        let Some(region) = self.regions.get(server).and_then(Option::as_ref) else {
            return Err(Fallback::Miss);
        };
        // A word that settled is not read again (`KnownLease`).
        let mut lease_end = match region.lease {
            KnownLease::NotNeeded => Some(LEASE_WORD_NOT_NEEDED),
            KnownLease::OtherClock => return Err(Fallback::Unleased),
            KnownLease::Unknown => None,
        };
        let mut offsets = Vec::with_capacity(items.len());
        for item in items {
            let Some(location) = self.cache.get(&item.key) else {
                return Err(Fallback::Miss);
            };
            if location.server as usize != server || location.slot >= region.slots {
                self.stats.evictions += u64::from(self.cache.evict(&item.key));
                return Err(Fallback::Miss);
            }
            offsets.push(location.slot as usize * region.slot_bytes);
        }
        let slot_bytes = region.slot_bytes;
        let per_batch = (GETSTAR_BATCH_BYTES / slot_bytes).clamp(1, GETSTAR_BATCH_READS_MAX - 1);
        let needed = LEASE_WORD_BYTES + per_batch.min(items.len()) * slot_bytes;
        if self.batch.len() < needed {
            self.batch.resize(needed, 0);
        }
        let mut versions = Vec::with_capacity(items.len());
        for (group, group_offsets) in items.chunks(per_batch).zip(offsets.chunks(per_batch)) {
            let (lease, images) = self.batch.split_at_mut(LEASE_WORD_BYTES);
            let mut reads: Vec<(usize, &mut [u8])> = Vec::with_capacity(group.len() + 1);
            if lease_end.is_none() {
                self.stats.lease_word_reads += 1;
                reads.push((region.lease_word_offset, lease));
            }
            reads.extend(group_offsets.iter().copied().zip(images.chunks_exact_mut(slot_bytes)));
            let read = self.fabric.read_many(&region.remote, &mut reads);
            drop(reads);
            // A word that cannot be read counts as no lease (as on the sequential path).
            let first = lease_end.is_none();
            if first {
                let word = u64::from_le_bytes(self.batch[..LEASE_WORD_BYTES].try_into().unwrap_or_default());
                lease_end = Some(if read.is_ok() { word } else { crate::item_slots::LEASE_WORD_UNLEASED });
            }
            if read.is_err() {
                self.stats.evictions += u64::from(self.cache.evict(&group[0].key));
                return Err(Fallback::Corrupt);
            }
            for ((item, &offset), index) in group.iter().zip(group_offsets).zip(0..) {
                let start = LEASE_WORD_BYTES + index * slot_bytes;
                let image = &self.batch[start..start + slot_bytes];
                let mut retried = 0;
                let mut read = verify_image(image, &item.key);
                if let Err(SlotReadError::Torn { .. }) = read {
                    retried = 1;
                    read = read_slot(&self.fabric, &region.remote, offset, slot_bytes, &item.key, &mut self.buffer);
                }
                match judge(read, retried, &item.selector, self.options.newer_prepared_fallback) {
                    Ok((version, retries)) => {
                        self.stats.torn_retries += retries;
                        self.stats.slots_accepted += 1;
                        versions.push(version);
                    }
                    Err(Judged::NewerPrepared) => return Err(Fallback::NewerPrepared),
                    Err(Judged::Failed(failure)) => {
                        self.stats.evictions += u64::from(self.cache.evict(&item.key));
                        return Err(failure);
                    }
                }
            }
        }
        self.settle_lease(server, lease_end.unwrap_or(crate::item_slots::LEASE_WORD_UNLEASED))?;
        Ok(versions)
    }

    /// Follows a server's connection going down (its region is no longer read: a killed
    /// server's slots stay mapped but are stale) or coming back (the new server process's item
    /// region is mapped; the addresses cached for the old one are forgotten).
    fn on_server_event(&mut self, event: &ServerEvent) {
        let server = match *event {
            ServerEvent::Down { server, .. } | ServerEvent::Up { server } => server,
        };
        let Some(region) = self.regions.get_mut(server) else { return };
        *region = None;
        self.cache.entries.retain(|_, location| location.server as usize != server);
        self.locating.retain(|(located, _), _| *located != server);
        if let ServerEvent::Up { .. } = event {
            // A region that cannot be read leaves the server's reads on the message path.
            let info = self.inner.medium().item_region(server);
            *region = info.and_then(|info| map_item_region(&self.fabric, info).ok());
            if let Some(mapped) = region.as_ref() {
                if mapped.slot_bytes > self.buffer.len() {
                    self.buffer.resize(mapped.slot_bytes, 0);
                }
            }
        }
    }

    fn count(&mut self, fallback: Fallback) {
        let counter = match fallback {
            Fallback::Miss => &mut self.stats.fallback_miss,
            Fallback::Torn => &mut self.stats.fallback_torn,
            Fallback::WrongKey => &mut self.stats.fallback_wrong_key,
            Fallback::NotValid => &mut self.stats.fallback_not_valid,
            Fallback::Corrupt => &mut self.stats.fallback_corrupt,
            Fallback::NewerPrepared => &mut self.stats.fallback_newer_prepared,
            Fallback::Unleased => &mut self.stats.fallback_unleased,
        };
        *counter += 1;
    }
}

/// Checks an announced item region and maps it read-only (input from the server).
fn map_item_region<F: FabricHandle>(
    fabric: &F,
    info: &ItemRegionInfo,
) -> Result<ItemRegion<F::RemoteRegion>, ItemRegionError> {
    if info.region.access != Access::ReadOnly {
        return Err(ItemRegionError::Writable);
    }
    let (slots_wire, slot_bytes_wire) = (info.slots, info.slot_bytes);
    let slot_bytes = usize::try_from(slot_bytes_wire)
        .ok()
        .filter(|bytes| bytes % 8 == 0 && (SLOT_BYTES_MIN..=rampkv_fabric::limits::SLOT_BYTES_MAX).contains(bytes))
        .ok_or(ItemRegionError::SlotBytes { slot_bytes: slot_bytes_wire })?;
    let too_large = || ItemRegionError::TooLarge { slots: slots_wire, slot_bytes: slot_bytes_wire };
    let slots = u32::try_from(slots_wire).map_err(|_| too_large())?;
    let region_bytes = (slots as usize).checked_mul(slot_bytes).filter(|&bytes| bytes <= ITEM_REGION_BYTES_MAX);
    // The slots, then the lease line.
    let lease_word = region_bytes.and_then(|_| lease_word_offset(slots as usize, slot_bytes));
    let lease_word_offset = match lease_word {
        Some(offset) if (offset + LEASE_LINE_BYTES) as u64 <= info.region.len_bytes => offset,
        _ => return Err(too_large()),
    };
    let remote = fabric.map(&info.region)?;
    let same_clock = info.region.host.as_deref().is_none_or(|host| rampkv_fabric::host_identity() == Some(host));
    Ok(ItemRegion { remote, slot_bytes, slots, lease_word_offset, same_clock, lease: KnownLease::Unknown })
}

/// Why a slot read gave no version (see [`judge`]).
enum Judged {
    /// The newer-prepared bit with the option on: fall back, keep the address.
    NewerPrepared,
    /// A failed check: fall back and forget the address.
    Failed(Fallback),
}

/// What a slot read (`retried` torn attempts before it) means for a GET: the version and the
/// torn attempts it took, or why not.
fn judge(
    read: Result<rampkv_fabric::SlotView<'_>, SlotReadError>,
    retried: u32,
    selector: &Selector,
    newer_prepared_fallback: bool,
) -> Result<(VersionItem, u64), Judged> {
    let failure = match read {
        Ok(view) => {
            if view.newer_prepared() && newer_prepared_fallback {
                return Err(Judged::NewerPrepared);
            }
            let retries = u64::from(retried + view.attempts() - 1);
            match decode_slot_version(view.ts(), view.expiry(), view.metadata(), view.value(), selector) {
                Some(version) => return Ok((version, retries)),
                None => Fallback::Corrupt,
            }
        }
        Err(SlotReadError::Torn { .. }) => Fallback::Torn,
        Err(SlotReadError::WrongKey) => Fallback::WrongKey,
        Err(SlotReadError::NotValid) => Fallback::NotValid,
        Err(_) => Fallback::Corrupt,
    };
    Err(Judged::Failed(failure))
}

/// The reply entry a server would send for `selector` from a verified slot's fields, its
/// expiry with it (the reader judges it as any VERSIONS entry's); `None` if they are not a
/// version a server publishes (ts 0, metadata that does not decode).
fn decode_slot_version(
    ts: u64,
    expiry: u64,
    metadata: &[u8],
    value: &[u8],
    selector: &Selector,
) -> Option<VersionItem> {
    if ts == 0 {
        return None;
    }
    let mut decoder = Decoder::new(metadata);
    let metadata = Metadata::decode(&mut decoder).ok()?;
    decoder.finish().ok()?;
    Some(match selector {
        Selector::LatestTimestamp => VersionItem::new(ts, Vec::new(), Metadata::None),
        _ => VersionItem {
            ts,
            value: rampkv_core::types::Bytes::copy_from_slice(value),
            metadata,
            expiry: Expiry::from_word(expiry),
        },
    })
}

/// Whether slots read under a lease word of `lease_end` may be trusted now (read the clock only
/// after the slots: module docs).
fn lease_covers(lease_end: u64) -> bool {
    lease_end == LEASE_WORD_NOT_NEEDED
        || rampkv_fabric::clock::monotonic_ns().saturating_add(GETSTAR_LEASE_MARGIN_US * 1_000) < lease_end
}

/// [`lease_covers`] for a region whose lease word is on this host's clock (`same_clock`); one on
/// another host's clock is trusted only when it says no lease is needed (module docs).
fn lease_trusted(lease_end: u64, same_clock: bool) -> bool {
    lease_end == LEASE_WORD_NOT_NEEDED || (same_clock && lease_covers(lease_end))
}

fn round_one(items: &[GetItem]) -> bool {
    items.iter().all(|item| matches!(item.selector, Selector::Latest | Selector::LatestTimestamp))
}

impl<F: FabricHandle> ClientTransport for GetStarTransport<F> {
    fn server_count(&self) -> usize {
        self.inner.server_count()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        let Request::Get { items } = request else {
            return self.inner.post(server, request_id, request);
        };
        // A server whose connection is down is not read from (its slots are stale): the wrapped
        // transport discards the request and the driver fails the transaction.
        if items.is_empty() || !round_one(items) || server >= self.regions.len() || self.inner.is_down(server) {
            return self.inner.post(server, request_id, request);
        }
        self.stats.eligible_gets += 1;
        match self.read_slots(server, items) {
            Ok(versions) => {
                self.stats.hits += 1;
                self.ready.push_back((server, request_id, Response::Versions { items: versions }));
                Ok(())
            }
            Err(fallback) => {
                self.count(fallback);
                if self.regions[server].is_none() {
                    return self.inner.post(server, request_id, request);
                }
                self.inner.post(server, request_id, &Request::GetLocate { items: items.clone() })?;
                let keys = items.iter().map(|item| item.key.clone().into_boxed_slice()).collect();
                self.locating.insert((server, request_id), keys);
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        self.inner.flush()
    }

    fn take_server_events(&mut self, events: &mut Vec<ServerEvent>) {
        let start = events.len();
        self.inner.take_server_events(events);
        for event in &events[start..] {
            self.on_server_event(event);
        }
    }

    fn reconnect_due(&mut self) {
        self.inner.reconnect_due();
    }

    fn disconnect(&mut self, server: usize) {
        self.inner.disconnect(server);
        if let Some(region) = self.regions.get_mut(server) {
            *region = None;
        }
    }

    fn poll<D>(&mut self, timeout: Option<Duration>, mut deliver: D) -> Result<usize, TransportError>
    where
        D: FnMut(usize, u64, Response),
    {
        if self.peers_checked.elapsed() >= Duration::from_millis(WRITEPOLL_SLEEP_MS_MAX) {
            self.peers_checked = Instant::now();
            self.inner.check_peers();
        }
        let mut delivered = 0;
        while let Some((server, request_id, response)) = self.ready.pop_front() {
            deliver(server, request_id, response);
            delivered += 1;
        }
        let timeout = if delivered > 0 { Some(Duration::ZERO) } else { timeout };
        let (cache, locating, regions, stats) = (&mut self.cache, &mut self.locating, &self.regions, &mut self.stats);
        delivered += self.inner.poll(timeout, |server, request_id, response| {
            let response = match response {
                Response::VersionsLocated { items, slots } => {
                    let keys = locating.remove(&(server, request_id)).unwrap_or_default();
                    let region_slots = regions.get(server).and_then(Option::as_ref).map_or(0, |region| region.slots);
                    for (key, slot) in keys.iter().zip(&slots) {
                        match slot {
                            Some(slot) if *slot < region_slots => {
                                let location = Location { server: server as u32, slot: *slot };
                                stats.cache_fills += u64::from(cache.insert(key, location));
                            }
                            _ => {}
                        }
                    }
                    Response::Versions { items }
                }
                other => {
                    if !locating.is_empty() {
                        locating.remove(&(server, request_id));
                    }
                    other
                }
            };
            deliver(server, request_id, response);
        })?;
        Ok(delivered)
    }

    fn getstar_stats(&self) -> Option<GetStarStats> {
        Some(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item_slots::{ItemSlotConfig, ItemSlots};
    use rampkv_fabric::{RegionDescriptor, ShmFabric};

    #[test]
    fn a_bad_item_region_descriptor_is_refused_with_a_reason() {
        let fabric = ShmFabric::new().unwrap();
        let slots =
            ItemSlots::register(&fabric, "onesided-descriptor-test", ItemSlotConfig { slots: 4, slot_bytes: 128 })
                .unwrap();
        let good = slots.info().clone();
        let mapped = map_item_region(&fabric, &good).unwrap();
        assert_eq!((mapped.slot_bytes, mapped.slots), (128, 4));
        let writable = ItemRegionInfo {
            region: RegionDescriptor { access: Access::ReadWrite, ..good.region.clone() },
            ..good.clone()
        };
        let bad = [
            writable,
            ItemRegionInfo { slot_bytes: 100, ..good.clone() },
            ItemRegionInfo { slot_bytes: 8, ..good.clone() },
            ItemRegionInfo { slots: 5, ..good.clone() },
            ItemRegionInfo { slots: u64::MAX, ..good.clone() },
            ItemRegionInfo { slot_bytes: u64::MAX, ..good.clone() },
            ItemRegionInfo { region: RegionDescriptor { name: "../etc/passwd".into(), ..good.region.clone() }, ..good },
        ];
        for info in bad {
            let refused = map_item_region(&fabric, &info);
            assert!(refused.is_err(), "{info:?} was accepted");
        }
    }

    #[test]
    fn slots_are_trusted_only_before_the_lease_ends_by_more_than_the_margin() {
        let margin_ns = GETSTAR_LEASE_MARGIN_US * 1_000;
        let now = rampkv_fabric::clock::monotonic_ns();
        assert!(lease_covers(LEASE_WORD_NOT_NEEDED), "no lease needed: trusted without a clock");
        assert!(!lease_covers(crate::item_slots::LEASE_WORD_UNLEASED));
        assert!(!lease_covers(now), "a lease that ended");
        assert!(!lease_covers(now + margin_ns / 2), "within the margin");
        assert!(lease_covers(now + margin_ns + 10_000_000_000), "a lease ten seconds ahead");
    }

    /// A server on another host (its item region mapped over RDMA) writes its lease's end on its
    /// own clock: a reader here cannot compare it with this host's, and trusts the slots only
    /// when no lease is needed.
    #[test]
    fn a_lease_on_another_hosts_clock_is_never_trusted_but_no_lease_needed_is() {
        let ahead = rampkv_fabric::clock::monotonic_ns() + 10_000_000_000;
        assert!(lease_trusted(ahead, true), "this host's clock: trusted before the end");
        assert!(!lease_trusted(ahead, false), "another host's clock: never trusted");
        assert!(lease_trusted(LEASE_WORD_NOT_NEEDED, false), "no lease needed: trusted on any host");
        assert!(!lease_trusted(crate::item_slots::LEASE_WORD_UNLEASED, false));
        let fabric = ShmFabric::new().unwrap();
        let slots =
            ItemSlots::register(&fabric, "onesided-clock-test", ItemSlotConfig { slots: 4, slot_bytes: 128 }).unwrap();
        let mut info = slots.info().clone();
        info.region.host = rampkv_fabric::host_identity().map(str::to_owned);
        assert!(map_item_region(&fabric, &info).unwrap().same_clock, "a region of this host");
        info.region.host = None;
        assert!(map_item_region(&fabric, &info).unwrap().same_clock, "a plain shared-memory descriptor");
        info.region.host = Some("another-boot".to_owned());
        assert!(!map_item_region(&fabric, &info).unwrap().same_clock, "a region of another host");
    }

    /// A region's lease word settles what GET\* does with it for the region's life: no lease
    /// needed (never read again), or a lease on another host's clock (slots never read); an
    /// unleased word (a new region, or a deposed server) and a lease on this host's clock
    /// settle nothing.
    #[test]
    fn a_lease_word_settles_only_what_it_says_for_the_regions_life() {
        let unleased = crate::item_slots::LEASE_WORD_UNLEASED;
        let lease = crate::item_slots::lease_word_of(rampkv_fabric::clock::monotonic_ns() + 10_000_000_000);
        for same_clock in [true, false] {
            assert_eq!(KnownLease::Unknown.learn(LEASE_WORD_NOT_NEEDED, same_clock), KnownLease::NotNeeded);
            assert_eq!(KnownLease::Unknown.learn(unleased, same_clock), KnownLease::Unknown);
        }
        assert_eq!(KnownLease::Unknown.learn(lease, true), KnownLease::Unknown, "read again every GET*");
        assert_eq!(KnownLease::Unknown.learn(lease, false), KnownLease::OtherClock);
    }

    #[test]
    fn the_address_cache_stays_within_its_bound() {
        let mut cache = AddressCache { entries: HashMap::default(), capacity: 3 };
        for n in 0..10u32 {
            assert!(cache.insert(&n.to_le_bytes(), Location { server: 0, slot: n }));
            assert!(cache.entries.len() <= 3);
        }
        assert!(cache.get(&9u32.to_le_bytes()).is_some(), "the newest entry is kept");
        assert!(!cache.insert(&9u32.to_le_bytes(), Location { server: 0, slot: 9 }), "unchanged");
        assert!(cache.evict(&9u32.to_le_bytes()));
        assert!(!cache.evict(&9u32.to_le_bytes()));
    }
}
