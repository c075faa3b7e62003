//! Read-only and write-only transactions of the RAMP family (Bailis et al., SIGMOD 2014) and
//! of the NoCC baseline, as I/O-free state machines.
//!
//! # Reads (get_all)
//! - **RAMP-Fast** (metadata: the write set). Round 1 asks for the latest committed version of
//!   every key, with metadata. For every key `k`, `required[k]` is the highest ts among the
//!   returned versions whose write set contains `k`; where that is newer than what round 1
//!   returned for `k`, the reader missed part of a committed transaction, and round 2 fetches
//!   exactly version `required[k]` (EXACT). One round when nothing raced.
//! - **RAMP-Small** (no metadata). Round 1 asks only for the timestamps of the latest committed
//!   versions. Round 2 asks every key for the highest stored version whose ts is one of the
//!   timestamps round 1 returned (HIGHEST_OF). Always two rounds; constant-size metadata.
//! - **RAMP-Hybrid** (metadata: a Bloom filter of the write set). Round 1 as RAMP-Fast. For
//!   every key `k`, the candidates are the timestamps of returned versions that are newer than
//!   `k`'s and whose filter may contain `k`; round 2 asks for the highest stored version among
//!   them (HIGHEST_OF, the RAMP-Small rule: an EXACT fetch would be wrong, because a false
//!   positive names a transaction that never wrote `k`). A reply of "none stored" was a false
//!   positive and keeps round 1's version.
//! - **NoCC**: one round of latest versions, no repair. It is not read-atomic, on purpose.
//!
//! Every repaired version is at least prepared on its server, because writers send COMMIT only
//! after every PREPARE was acknowledged; so round 2 always finds what it needs unless garbage
//! collection removed it, in which case the server answers VersionGone and the read restarts.
//!
//! # Writes (put_all)
//! RAMP: PREPARE every write with the algorithm's metadata; once every PREPARE is
//! acknowledged, COMMIT on every participating server. NoCC: one PUT per server, visible at
//! once. Readers never wait for either.
//!
//! A RAMP write whose keys are all on one server is one PREPARE_COMMIT: that server stores
//! every version of the transaction and then makes them visible, in one call. The invariant
//! readers rely on (a version is visible only once every version of its transaction is
//! stored) holds as it does after the acknowledged PREPAREs and a COMMIT; the server checks
//! that the write set names exactly the keys written, so no other server can hold a part.

use ahash::AHashMap;

use super::bloom::{may_contain, BloomParameters};
use super::{
    make_tag, split_tag, writes_of_pairs, InvalidTransaction, MalformedReply, Outgoing, ProtocolError, ReadItem,
    ReadOutcome, Step, WriteOutcome,
};
use crate::cluster::Cluster;
use crate::limits::{KEY_BYTES_MAX, READ_RESTARTS_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Expiry, Timestamp, TIMESTAMP_INITIAL};
use crate::wire::{ErrorCode, GetItem, Metadata, Request, Response, Selector, VersionItem, Write, WriteSet};

/// The transaction algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Algorithm {
    RampFast,
    RampSmall,
    RampHybrid,
    /// No concurrency control: a baseline that shows fractured reads under contention.
    NoCc,
    /// Strict two-phase locking with two-phase commit (see `protocol::locking`): the baseline
    /// the RAMP papers compare against. Readers take locks, so they can block writers.
    S2pl,
}

impl Algorithm {
    /// Every algorithm, in the order reports list them.
    pub const ALL: [Algorithm; 5] =
        [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid, Algorithm::NoCc, Algorithm::S2pl];

    /// The name used on the command line and in results.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::RampFast => "ramp-fast",
            Algorithm::RampSmall => "ramp-small",
            Algorithm::RampHybrid => "ramp-hybrid",
            Algorithm::NoCc => "nocc",
            Algorithm::S2pl => "s2pl",
        }
    }

    /// Parses a name given by [`Algorithm::name`].
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|algorithm| algorithm.name() == name)
    }
}

/// How a client runs its transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TxnOptions {
    pub algorithm: Algorithm,
    /// Filter size and hash count for RAMP-Hybrid.
    pub bloom: BloomParameters,
    /// TEST ONLY: readers skip the round-2 repair (RAMP-Small: ask each key only for its own
    /// round-1 version). This breaks read atomicity on purpose; the tests use it to prove that
    /// the checker detects fractured reads.
    #[doc(hidden)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mutant_skip_repair: bool,
}

impl Default for TxnOptions {
    fn default() -> Self {
        Self { algorithm: Algorithm::RampFast, bloom: BloomParameters::default(), mutant_skip_repair: false }
    }
}

/// Validates the keys of a transaction before anything is sent.
pub fn validate_keys<'k>(keys: impl ExactSizeIterator<Item = &'k [u8]>) -> Result<(), ProtocolError> {
    if keys.len() == 0 || keys.len() > TXN_KEYS_MAX {
        return Err(InvalidTransaction::KeyCount { count: keys.len() }.into());
    }
    match keys.map(<[u8]>::len).find(|bytes| *bytes > KEY_BYTES_MAX) {
        Some(bytes) => Err(InvalidTransaction::KeyTooLarge { bytes }.into()),
        None => Ok(()),
    }
}

/// The distinct keys of a transaction in first-seen order, and for each requested key (with
/// repeats) its index among them. No key is copied: the distinct ones move out of `keys` (a
/// pipeline of 16 MGETs of 10 keys is one read of 160; copying each key into the map cost an
/// allocation per key, issue 31).
pub(super) fn distinct_keys(keys: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, Vec<usize>) {
    let mut positions: Vec<usize> = Vec::with_capacity(keys.len());
    let mut first_seen: Vec<bool> = Vec::with_capacity(keys.len());
    let mut distinct_count = 0;
    {
        // A linear scan for the usual handful of keys; a map of borrowed keys beyond that.
        let mut seen: Option<AHashMap<&[u8], usize>> =
            (keys.len() > KEY_INDEX_SCAN_MAX).then(|| AHashMap::with_capacity(keys.len()));
        for (index, key) in keys.iter().enumerate() {
            let position = match seen.as_mut() {
                Some(map) => *map.entry(key.as_slice()).or_insert(distinct_count),
                None => keys[..index]
                    .iter()
                    .zip(&positions)
                    .find(|(known, _)| *known == key)
                    .map_or(distinct_count, |(_, &position)| position),
            };
            let first = position == distinct_count;
            distinct_count += usize::from(first);
            first_seen.push(first);
            positions.push(position);
        }
    }
    let distinct = keys.into_iter().zip(first_seen).filter_map(|(key, first)| first.then_some(key)).collect();
    (distinct, positions)
}

/// Checks value sizes and expiries and keeps the last write of a key written twice (its value
/// and expiry), in first-seen key order.
pub(super) fn last_write_wins(writes: Vec<Write>) -> Result<Vec<Write>, ProtocolError> {
    if let Some(write) = writes.iter().find(|write| write.value.len() > VALUE_BYTES_MAX) {
        return Err(InvalidTransaction::ValueTooLarge { bytes: write.value.len() }.into());
    }
    if let Some(write) = writes.iter().find(|write| Expiry::at_ms(write.expires_at_ms).is_none()) {
        return Err(InvalidTransaction::Expiry { expires_at_ms: write.expires_at_ms }.into());
    }
    let mut deduplicated: Vec<Write> = Vec::with_capacity(writes.len());
    for write in writes {
        match deduplicated.iter_mut().find(|kept| kept.key == write.key) {
            Some(kept) => *kept = write,
            None => deduplicated.push(write),
        }
    }
    Ok(deduplicated)
}

/// The metadata each version written by a transaction with `write_set` carries.
///
/// # Errors
/// A write set over the limits (`validate_keys` refuses those first).
pub fn metadata_for(options: &TxnOptions, write_set: &[Vec<u8>]) -> Result<Metadata, ProtocolError> {
    Ok(match options.algorithm {
        Algorithm::RampFast => {
            Metadata::WriteSet(WriteSet::from_keys(write_set).map_err(InvalidTransaction::WriteSet)?)
        }
        Algorithm::RampHybrid => Metadata::Bloom(options.bloom.build(write_set.iter().map(Vec::as_slice))),
        Algorithm::RampSmall | Algorithm::NoCc | Algorithm::S2pl => Metadata::None,
    })
}

/// The RAMP machines do not run S2PL (its machines are in `protocol::locking`).
fn refuse_locking(options: &TxnOptions) -> Result<(), ProtocolError> {
    match options.algorithm {
        Algorithm::S2pl => Err(InvalidTransaction::LockingAlgorithm.into()),
        _ => Ok(()),
    }
}

#[derive(Debug)]
struct Part {
    server: usize,
    /// How many keys this request covers: the keys whose `KeyPlan::part` is this part, in key
    /// order (requests list their keys in key order).
    keys: usize,
    done: bool,
}

/// What a read plans for one of its distinct keys.
#[derive(Debug)]
struct KeyPlan {
    server: usize,
    /// The part of the current round that asks for the key (`NOT_ASKED`: none).
    part: u16,
    /// What round 2 asked the key for (LATEST: not asked).
    repair: Selector,
}

/// `KeyPlan::part` of a key the current round does not ask for.
const NOT_ASKED: u16 = u16::MAX;

/// A read-only transaction.
#[derive(Debug)]
pub struct ReadTxn {
    /// Distinct keys, in first-seen order.
    keys: Vec<Vec<u8>>,
    /// For each requested key (with repeats), its index in `keys`; empty when the requested
    /// keys are distinct (the usual case: each is its own index, and nothing is allocated).
    positions: Vec<usize>,
    plan: Vec<KeyPlan>,
    results: Vec<Option<VersionItem>>,
    /// Round 1's timestamp per key, kept when round 2 is planned (it overwrites `results`);
    /// empty otherwise. Reported with the outcome for the read-atomicity checker.
    round1: Vec<Timestamp>,
    /// Per key, whether round 2 of this attempt fetched it (empty: no round 2).
    fetched_in_round2: Vec<bool>,
    parts: Vec<Part>,
    outstanding: usize,
    round: u8,
    attempt: u16,
    restarts: u32,
    round2_keys: u32,
    round2_found_nothing: u32,
    /// The latest deadline of a reclaimed version any answer carried (0: none).
    reclaimed_deadline_ms: u64,
    options: TxnOptions,
}

/// Whether `keys` holds a key twice (a pairwise scan for the usual handful; `None` beyond
/// that: the caller deduplicates with a map).
fn has_repeats_scan(keys: &[Vec<u8>]) -> Option<bool> {
    if keys.len() > KEY_INDEX_SCAN_MAX {
        return None;
    }
    Some(keys.iter().enumerate().any(|(index, key)| keys[..index].contains(key)))
}

/// The bookkeeping buffers of a finished read, empty, for the next one to reuse (the session
/// machine keeps one set, so that a read allocates none of them per transaction). Their
/// capacity is bounded by `TXN_KEYS_MAX` keys and the cluster's servers.
#[derive(Debug, Default)]
pub struct ReadBuffers {
    plan: Vec<KeyPlan>,
    results: Vec<Option<VersionItem>>,
    round1: Vec<Timestamp>,
    fetched_in_round2: Vec<bool>,
    parts: Vec<Part>,
}

impl ReadTxn {
    /// Plans a read of `keys` (repeats allowed; each gets the same result).
    pub fn new(cluster: &Cluster, keys: Vec<Vec<u8>>, options: TxnOptions) -> Result<ReadTxn, ProtocolError> {
        Self::with_buffers(cluster, keys, options, ReadBuffers::default())
    }

    /// [`ReadTxn::new`] in the buffers of an earlier read ([`ReadTxn::take_buffers`]).
    pub fn with_buffers(
        cluster: &Cluster,
        keys: Vec<Vec<u8>>,
        options: TxnOptions,
        buffers: ReadBuffers,
    ) -> Result<ReadTxn, ProtocolError> {
        validate_keys(keys.iter().map(Vec::as_slice))?;
        refuse_locking(&options)?;
        // Distinct keys (the usual case) are used as they came: no copy, no positions.
        let (distinct, positions) = match has_repeats_scan(&keys) {
            Some(false) => (keys, Vec::new()),
            _ => distinct_keys(keys),
        };
        let ReadBuffers { mut plan, mut results, round1, fetched_in_round2, parts } = buffers;
        debug_assert!(plan.is_empty() && results.is_empty() && round1.is_empty() && fetched_in_round2.is_empty());
        plan.extend(distinct.iter().map(|key| KeyPlan {
            server: cluster.server_of(key),
            part: NOT_ASKED,
            repair: Selector::Latest,
        }));
        results.resize_with(distinct.len(), || None);
        Ok(ReadTxn {
            keys: distinct,
            positions,
            plan,
            results,
            round1,
            fetched_in_round2,
            parts,
            outstanding: 0,
            round: 1,
            attempt: 0,
            restarts: 0,
            round2_keys: 0,
            round2_found_nothing: 0,
            reclaimed_deadline_ms: 0,
            options,
        })
    }

    /// The distinct keys read.
    pub fn keys(&self) -> &[Vec<u8>] {
        &self.keys
    }

    /// Takes the transaction's buffers, emptied, for the next read to reuse; the transaction
    /// is over (finished or abandoned) and only to be dropped.
    pub fn take_buffers(&mut self) -> ReadBuffers {
        let mut buffers = ReadBuffers {
            plan: std::mem::take(&mut self.plan),
            results: std::mem::take(&mut self.results),
            round1: std::mem::take(&mut self.round1),
            fetched_in_round2: std::mem::take(&mut self.fetched_in_round2),
            parts: std::mem::take(&mut self.parts),
        };
        buffers.plan.clear();
        buffers.results.clear();
        buffers.round1.clear();
        buffers.fetched_in_round2.clear();
        buffers.parts.clear();
        buffers
    }

    /// Round 1, one request per server.
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.round = 1;
        self.results.iter_mut().for_each(|result| *result = None);
        self.round1.clear();
        self.fetched_in_round2.clear();
        self.send_round(out);
    }

    /// Emits one GET per server for the keys this round asks for, in key order: round 1 every
    /// key (LATEST, or LATEST_TS for RAMP-Small), round 2 the keys `fetched_in_round2` marks,
    /// each with its `repair` selector.
    fn send_round(&mut self, out: &mut Vec<Outgoing>) {
        self.parts.clear();
        let round1_selector = match self.options.algorithm {
            Algorithm::RampSmall => Selector::LatestTimestamp,
            _ => Selector::Latest,
        };
        // The parts' requests go straight to `out`, from here on, in part order.
        let first = out.len();
        for (index, plan) in self.plan.iter_mut().enumerate() {
            plan.part = NOT_ASKED;
            let selector = match self.round {
                1 => round1_selector.clone(),
                _ if self.fetched_in_round2[index] => plan.repair.clone(),
                _ => continue,
            };
            let part = match self.parts.iter().position(|part| part.server == plan.server) {
                Some(part) => part,
                None => {
                    let tag = make_tag(self.attempt, self.parts.len() as u16);
                    out.push(Outgoing { server: plan.server, tag, request: Request::Get { items: Vec::new() } });
                    self.parts.push(Part { server: plan.server, keys: 0, done: false });
                    self.parts.len() - 1
                }
            };
            plan.part = part as u16;
            self.parts[part].keys += 1;
            let Request::Get { items } = &mut out[first + part].request else {
                unreachable!("this round's requests are GETs")
            };
            items.push(GetItem { key: self.keys[index].clone(), selector });
        }
        self.outstanding = self.parts.len();
    }

    /// Feeds one reply. Replies of an earlier attempt are ignored.
    pub fn on_reply(
        &mut self,
        tag: u32,
        response: Response,
        out: &mut Vec<Outgoing>,
    ) -> Result<Step<ReadOutcome>, ProtocolError> {
        let (attempt, part_index) = split_tag(tag);
        if attempt != self.attempt {
            return Ok(Step::Pending);
        }
        let Some(part) = self.parts.get_mut(usize::from(part_index)) else {
            return Err(ProtocolError::MalformedReply { server: usize::MAX, why: MalformedReply::UnknownTag { tag } });
        };
        let (server, part_keys) = (part.server, part.keys);
        if part.done {
            return Err(ProtocolError::MalformedReply { server, why: MalformedReply::Duplicate });
        }
        part.done = true;
        let items = match response {
            Response::Versions { items } => items,
            Response::Error { code: ErrorCode::VersionGone, .. } => return self.restart(out),
            Response::Error { code, message } => return Err(ProtocolError::ServerError { server, code, message }),
            other => {
                let why = MalformedReply::UnexpectedKind { kind: other.kind(), expected: "VERSIONS" };
                return Err(ProtocolError::MalformedReply { server, why });
            }
        };
        if items.len() != part_keys {
            let why = MalformedReply::VersionCount { versions: items.len(), keys: part_keys };
            return Err(ProtocolError::MalformedReply { server, why });
        }
        // The part's keys, in key order, are the order its request listed them in.
        let mut items = items.into_iter();
        for index in 0..self.plan.len() {
            if self.plan[index].part != part_index {
                continue;
            }
            let Some(item) = items.next() else { break };
            self.accept(server, index, item)?;
        }
        self.outstanding -= 1;
        if self.outstanding > 0 {
            return Ok(Step::Pending);
        }
        if self.round == 1 && self.plan_round_two(out) {
            return Ok(Step::Pending);
        }
        Ok(Step::Done(self.finish()))
    }

    /// Stores one returned version, checking it answers what was asked. A reclaimed one (its
    /// value dropped by its server) raises the read's instant to its deadline, whatever else
    /// happens to it: the other keys of its transaction must read as expired too.
    fn accept(&mut self, server: usize, index: usize, item: VersionItem) -> Result<(), ProtocolError> {
        let malformed = |why| Err(ProtocolError::MalformedReply { server, why });
        if item.expiry.is_reclaimed() {
            self.reclaimed_deadline_ms = self.reclaimed_deadline_ms.max(item.expiry.deadline_ms());
        }
        if self.round == 1 {
            self.results[index] = Some(item);
            return Ok(());
        }
        match &self.plan[index].repair {
            Selector::Exact(ts) if item.ts != *ts => {
                malformed(MalformedReply::WrongVersion { asked: *ts, got: item.ts })
            }
            Selector::HighestOf(candidates) if item.ts != TIMESTAMP_INITIAL && !candidates.contains(&item.ts) => {
                malformed(MalformedReply::NotACandidate { got: item.ts })
            }
            Selector::HighestOf(_) if item.ts == TIMESTAMP_INITIAL => {
                // None of the candidates is stored: a Bloom false positive (RAMP-Hybrid) keeps
                // round 1's version; for RAMP-Small the key has no version among them: initial.
                self.round2_found_nothing += 1;
                if self.options.algorithm == Algorithm::RampSmall {
                    self.results[index] = Some(item);
                }
                Ok(())
            }
            _ => {
                self.results[index] = Some(item);
                Ok(())
            }
        }
    }

    /// Decides round 2 from round 1's results and sends it; false when none is needed.
    fn plan_round_two(&mut self, out: &mut Vec<Outgoing>) -> bool {
        let wanted = match self.options.algorithm {
            Algorithm::NoCc | Algorithm::S2pl => Vec::new(),
            Algorithm::RampFast if self.options.mutant_skip_repair => Vec::new(),
            Algorithm::RampHybrid if self.options.mutant_skip_repair => Vec::new(),
            Algorithm::RampFast => self.fast_repairs(),
            Algorithm::RampSmall => self.small_round_two(),
            Algorithm::RampHybrid => self.hybrid_repairs(),
        };
        if wanted.is_empty() {
            return false;
        }
        self.round1.clear();
        self.round1.extend(self.results.iter().map(|result| result.as_ref().map_or(TIMESTAMP_INITIAL, |item| item.ts)));
        self.fetched_in_round2.clear();
        self.fetched_in_round2.resize(self.keys.len(), false);
        self.round2_keys += wanted.len() as u32;
        for (index, selector) in wanted {
            self.plan[index].repair = selector;
            self.fetched_in_round2[index] = true;
        }
        self.round = 2;
        self.send_round(out);
        true
    }

    fn result_ts(&self, index: usize) -> Timestamp {
        self.results[index].as_ref().map_or(TIMESTAMP_INITIAL, |item| item.ts)
    }

    /// RAMP-Fast: `required[k]` from the write sets; EXACT where it is newer than round 1's.
    fn fast_repairs(&self) -> Vec<(usize, Selector)> {
        fast_repairs(&self.keys, &self.results, key_index(&self.keys))
            .into_iter()
            .map(|(index, ts)| (index, Selector::Exact(ts)))
            .collect()
    }

    /// RAMP-Small: every key, for the highest of round 1's timestamps it has.
    fn small_round_two(&self) -> Vec<(usize, Selector)> {
        let mut seen: Vec<Timestamp> = self.results.iter().flatten().map(|item| item.ts).collect();
        seen.retain(|&ts| ts != TIMESTAMP_INITIAL);
        seen.sort_unstable();
        seen.dedup();
        if seen.is_empty() {
            return Vec::new(); // nothing was ever written: every key reads its initial value
        }
        (0..self.keys.len())
            .map(|index| {
                let candidates =
                    if self.options.mutant_skip_repair { vec![self.result_ts(index)] } else { seen.clone() };
                (index, Selector::HighestOf(candidates))
            })
            .collect()
    }

    /// RAMP-Hybrid: per key, the newer round-1 versions whose filter may contain it.
    fn hybrid_repairs(&self) -> Vec<(usize, Selector)> {
        let hashes = self.options.bloom.hashes;
        (0..self.keys.len())
            .filter_map(|index| {
                let own_ts = self.result_ts(index);
                let mut candidates: Vec<Timestamp> = self
                    .results
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .filter_map(|(_, result)| result.as_ref())
                    .filter(|result| result.ts > own_ts)
                    .filter(|result| match &result.metadata {
                        Metadata::Bloom(filter) => may_contain(filter, hashes, &self.keys[index]),
                        _ => false,
                    })
                    .map(|result| result.ts)
                    .collect();
                candidates.sort_unstable();
                candidates.dedup();
                (!candidates.is_empty()).then_some((index, Selector::HighestOf(candidates)))
            })
            .collect()
    }

    fn restart(&mut self, out: &mut Vec<Outgoing>) -> Result<Step<ReadOutcome>, ProtocolError> {
        self.restarts += 1;
        if self.restarts > READ_RESTARTS_MAX {
            return Err(ProtocolError::TooManyRestarts(self.restarts - 1));
        }
        self.attempt = self.attempt.wrapping_add(1);
        self.start(out);
        Ok(Step::Pending)
    }

    /// Ends the transaction (it takes no more replies), moving each distinct key and its value
    /// into the outcome; a key asked for twice is cloned from its first item.
    fn finish(&mut self) -> ReadOutcome {
        let items = if self.positions.is_empty() {
            // Distinct keys: each is its own item, in order.
            (0..self.keys.len()).map(|index| self.take_item(index)).collect()
        } else {
            let mut first_item: Vec<Option<usize>> = vec![None; self.keys.len()];
            let mut items: Vec<ReadItem> = Vec::with_capacity(self.positions.len());
            for position in 0..self.positions.len() {
                let index = self.positions[position];
                let item = match first_item[index] {
                    Some(earlier) => items[earlier].clone(),
                    None => {
                        first_item[index] = Some(items.len());
                        self.take_item(index)
                    }
                };
                items.push(item);
            }
            items
        };
        ReadOutcome {
            items,
            round2_keys: self.round2_keys,
            round2_found_nothing: self.round2_found_nothing,
            restarts: self.restarts,
            read_at_ms: 0,
            reclaimed_deadline_ms: self.reclaimed_deadline_ms,
        }
    }

    /// Moves the distinct key `index` and its value into an outcome item (the transaction is
    /// over: nothing reads them again).
    fn take_item(&mut self, index: usize) -> ReadItem {
        let result = self.results[index].as_mut().expect("every key answered");
        let key = std::mem::take(&mut self.keys[index]);
        // Without a round 2, round 1's answer is the final one.
        let round1_ts = self.round1.get(index).copied().unwrap_or(result.ts);
        read_item(key, result, Some(round1_ts), self.fetched_in_round2.get(index).copied().unwrap_or(false))
    }
}

/// The outcome item of a returned version (its value moved out): present unless it is the
/// initial value or reclaimed (whether it expired is judged once the read is over:
/// [`ReadOutcome::judge_expiry`]).
pub(super) fn read_item(
    key: Vec<u8>,
    result: &mut VersionItem,
    round1_ts: Option<Timestamp>,
    fetched_in_round2: bool,
) -> ReadItem {
    let exists = result.ts != TIMESTAMP_INITIAL && !result.expiry.is_reclaimed();
    ReadItem {
        key,
        ts: result.ts,
        value: if exists { std::mem::take(&mut result.value) } else { bytes::Bytes::new() },
        round1_ts,
        fetched_in_round2,
        expires_at_ms: result.expiry.deadline_ms(),
        exists,
    }
}

/// RAMP-Fast's round-2 plan from round 1's `results` (one per key of `keys`, in order): for
/// every key `k`, `required[k]` is the highest ts among the returned versions whose write set
/// contains `k`; returns `(index, required[k])` for each key where that is newer than the
/// version returned for it, in key order.
///
/// A version of ts `t` can only decide anything for keys whose own version is older than `t`,
/// so versions no older than the oldest returned one are skipped without reading their write
/// sets (the result is the same: a skipped version's ts never exceeds any key's own).
fn fast_repairs<F: Fn(&[u8]) -> u64>(
    keys: &[Vec<u8>],
    results: &[Option<VersionItem>],
    index: KeyIndex<'_, F>,
) -> Vec<(usize, Timestamp)> {
    debug_assert_eq!(keys.len(), results.len());
    let result_ts = |result: &Option<VersionItem>| result.as_ref().map_or(TIMESTAMP_INITIAL, |item| item.ts);
    let Some(oldest) = results.iter().map(result_ts).min() else {
        return Vec::new();
    };
    // On the stack for the usual handful of keys.
    let mut required_small = [TIMESTAMP_INITIAL; KEY_INDEX_SCAN_MAX];
    let mut required_large = Vec::new();
    let required: &mut [Timestamp] = if keys.len() <= KEY_INDEX_SCAN_MAX {
        &mut required_small[..keys.len()]
    } else {
        required_large.resize(keys.len(), TIMESTAMP_INITIAL);
        &mut required_large
    };
    for result in results.iter().flatten().filter(|result| result.ts > oldest) {
        if let Metadata::WriteSet(write_set) = &result.metadata {
            for key in write_set {
                if let Some(position) = index.find(key) {
                    required[position] = required[position].max(result.ts);
                }
            }
        }
    }
    required
        .iter()
        .copied()
        .zip(results)
        .enumerate()
        .filter(|(_, (required, result))| *required > result_ts(result))
        .map(|(position, (required, _))| (position, required))
        .collect()
}

/// Finds a key's index among a transaction's distinct keys without allocating: for the usual
/// handful of keys, a scan of their precomputed 64-bit fingerprints, comparing bytes only where
/// a fingerprint matches (so a write-set key costs one multiply and a few integer compares,
/// not a `memcmp` per key of the transaction); a hash map beyond that.
enum KeyIndex<'k, F> {
    Scan { keys: &'k [Vec<u8>], fingerprints: [u64; KEY_INDEX_SCAN_MAX], fingerprint: F },
    Map(AHashMap<&'k [u8], usize>),
}

/// Transactions with at most this many keys use a linear scan.
const KEY_INDEX_SCAN_MAX: usize = 16;

/// A key's fingerprint for the scan: its length and its first and last 8 bytes, folded with two
/// multiplies. The three inputs determine a key of up to 16 bytes (shorter keys are read as
/// overlapping 4-byte or single-byte pieces that cover every byte, without a copy). Not a hash
/// for tables: equal keys have equal fingerprints, and distinct keys almost never do unless
/// they differ only in the middle of a key over 16 bytes; such keys cost a byte comparison
/// each, never a wrong match.
fn key_fingerprint(key: &[u8]) -> u64 {
    const ODD: u64 = 0x9e37_79b9_7f4a_7c15;
    let length = key.len();
    let (head, tail) = if let (Some(head), Some(tail)) = (key.first_chunk::<8>(), key.last_chunk::<8>()) {
        (u64::from_le_bytes(*head), u64::from_le_bytes(*tail))
    } else if let (Some(head), Some(tail)) = (key.first_chunk::<4>(), key.last_chunk::<4>()) {
        (u64::from(u32::from_le_bytes(*head)), u64::from(u32::from_le_bytes(*tail)))
    } else if let (Some(&first), Some(&last)) = (key.first(), key.last()) {
        let middle = key[length / 2];
        (u64::from(first) | u64::from(middle) << 8 | u64::from(last) << 16, 0)
    } else {
        (0, 0)
    };
    (head.wrapping_mul(ODD) ^ tail ^ length as u64).wrapping_mul(ODD)
}

/// An index of `keys` (distinct) by [`key_fingerprint`].
fn key_index(keys: &[Vec<u8>]) -> KeyIndex<'_, impl Fn(&[u8]) -> u64> {
    KeyIndex::with_fingerprint(keys, key_fingerprint)
}

impl<'k, F: Fn(&[u8]) -> u64> KeyIndex<'k, F> {
    /// An index of `keys` (distinct) by `fingerprint` (tests use colliding ones).
    fn with_fingerprint(keys: &'k [Vec<u8>], fingerprint: F) -> Self {
        if keys.len() <= KEY_INDEX_SCAN_MAX {
            let mut fingerprints = [0; KEY_INDEX_SCAN_MAX];
            for (slot, key) in fingerprints.iter_mut().zip(keys) {
                *slot = fingerprint(key);
            }
            KeyIndex::Scan { keys, fingerprints, fingerprint }
        } else {
            KeyIndex::Map(keys.iter().enumerate().map(|(index, key)| (key.as_slice(), index)).collect())
        }
    }

    fn find(&self, key: &[u8]) -> Option<usize> {
        match self {
            KeyIndex::Scan { keys, fingerprints, fingerprint } => {
                let wanted = fingerprint(key);
                let fingerprints = &fingerprints[..keys.len()];
                // Fingerprints may collide: a match is confirmed by the bytes, and a mismatch
                // goes on scanning.
                let mut start = 0;
                while let Some(offset) = fingerprints[start..].iter().position(|&candidate| candidate == wanted) {
                    let position = start + offset;
                    if keys[position].as_slice() == key {
                        return Some(position);
                    }
                    start = position + 1;
                }
                None
            }
            KeyIndex::Map(map) => map.get(key).copied(),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum WritePhase {
    Prepare,
    Commit,
}

/// A write-only transaction.
#[derive(Debug)]
pub struct WriteTxn {
    ts: Timestamp,
    write_set: Vec<Vec<u8>>,
    /// Per participating server: its writes, until PREPARE (or PUT) is sent.
    parts: Vec<(usize, Vec<Write>)>,
    acknowledged: Vec<bool>,
    outstanding: usize,
    phase: WritePhase,
    /// One server holds every key: PREPARE_COMMIT, one round trip (RAMP algorithms only).
    /// Independent writes are one-phase too: one PREPARE_COMMIT per key.
    one_phase: bool,
    /// What every version of this transaction carries (independent writes: unused).
    metadata: Metadata,
    /// Independent writes ([`WriteTxn::independent`]): each part's own metadata, a write set
    /// of its one key. Empty otherwise.
    part_metadata: Vec<Metadata>,
    options: TxnOptions,
}

impl WriteTxn {
    /// Plans writing `writes` at timestamp `ts`. A key written twice keeps its last value.
    /// Everything is validated here, before any server state changes.
    pub fn new(
        cluster: &Cluster,
        ts: Timestamp,
        writes: Vec<(Vec<u8>, Vec<u8>)>,
        options: TxnOptions,
    ) -> Result<WriteTxn, ProtocolError> {
        Self::with_writes(cluster, ts, writes_of_pairs(writes), options)
    }

    /// [`WriteTxn::new`] of [`Write`]s with their expiries (deletions among them): every
    /// version of the transaction carries its own, typically one deadline for all. A key
    /// written twice keeps its last write.
    pub fn with_writes(
        cluster: &Cluster,
        ts: Timestamp,
        writes: Vec<Write>,
        options: TxnOptions,
    ) -> Result<WriteTxn, ProtocolError> {
        Self::plan(cluster, ts, writes, options, true)
    }

    /// [`WriteTxn::with_writes`]; without `whole_metadata` the transaction's own metadata is
    /// left empty ([`WriteTxn::independent`] gives each part its own: building one for the
    /// whole batch, then dropping it, cost an encoding and an allocation per batch).
    fn plan(
        cluster: &Cluster,
        ts: Timestamp,
        writes: Vec<Write>,
        options: TxnOptions,
        whole_metadata: bool,
    ) -> Result<WriteTxn, ProtocolError> {
        validate_keys(writes.iter().map(|write| write.key.as_slice()))?;
        refuse_locking(&options)?;
        if ts == TIMESTAMP_INITIAL {
            return Err(InvalidTransaction::ReservedTimestamp.into());
        }
        let writes = last_write_wins(writes)?;
        let write_set: Vec<Vec<u8>> = writes.iter().map(|write| write.key.clone()).collect();
        let metadata = match whole_metadata {
            true => metadata_for(&options, &write_set)?,
            false => Metadata::None,
        };
        let mut parts: Vec<(usize, Vec<Write>)> = Vec::new();
        for write in writes {
            let server = cluster.server_of(&write.key);
            match parts.iter_mut().find(|(owner, _)| *owner == server) {
                Some((_, writes)) => writes.push(write),
                None => parts.push((server, vec![write])),
            }
        }
        let count = parts.len();
        let one_phase = count == 1 && options.algorithm != Algorithm::NoCc;
        Ok(WriteTxn {
            ts,
            write_set,
            parts,
            acknowledged: vec![false; count],
            outstanding: 0,
            phase: WritePhase::Prepare,
            one_phase,
            metadata,
            part_metadata: Vec::new(),
            options,
        })
    }

    /// Plans `writes` as independent one-key writes sharing timestamp `ts` (RAMP-Fast; other
    /// algorithms get [`WriteTxn::new`]): each key is its own PREPARE_COMMIT whose write set
    /// names that key alone, all sent at once. Readers never repair one of these versions from
    /// another, so the batch is not atomic as a whole (each write is), which is what Redis
    /// promises for pipelined SETs; in exchange a server frees each version as soon as a newer
    /// one supersedes it, instead of keeping it for the GC grace period (docs/architecture.md,
    /// "versions alone in their write set"). A key written twice keeps its last value.
    pub fn independent(
        cluster: &Cluster,
        ts: Timestamp,
        writes: Vec<(Vec<u8>, Vec<u8>)>,
        options: TxnOptions,
    ) -> Result<WriteTxn, ProtocolError> {
        Self::independent_writes(cluster, ts, writes_of_pairs(writes), options)
    }

    /// [`WriteTxn::independent`] of [`Write`]s with their expiries.
    pub fn independent_writes(
        cluster: &Cluster,
        ts: Timestamp,
        writes: Vec<Write>,
        options: TxnOptions,
    ) -> Result<WriteTxn, ProtocolError> {
        if options.algorithm != Algorithm::RampFast {
            return Self::with_writes(cluster, ts, writes, options);
        }
        let mut txn = Self::plan(cluster, ts, writes, options, false)?;
        let writes: Vec<Write> = txn.parts.drain(..).flat_map(|(_, writes)| writes).collect();
        txn.part_metadata = writes
            .iter()
            .map(|write| metadata_for(&options, std::slice::from_ref(&write.key)))
            .collect::<Result<_, _>>()?;
        txn.parts = writes.into_iter().map(|write| (cluster.server_of(&write.key), vec![write])).collect();
        txn.acknowledged = vec![false; txn.parts.len()];
        txn.one_phase = true;
        Ok(txn)
    }

    /// The transaction's timestamp.
    pub fn ts(&self) -> Timestamp {
        self.ts
    }

    /// The distinct keys written, in first-seen order.
    pub fn write_set(&self) -> &[Vec<u8>] {
        &self.write_set
    }

    /// Sends PREPARE (NoCC: PUT; one server: PREPARE_COMMIT) to every participating server.
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.phase = WritePhase::Prepare;
        self.outstanding = self.parts.len();
        let last_part = self.parts.len().saturating_sub(1);
        for (part, (server, writes)) in self.parts.iter_mut().enumerate() {
            let writes = std::mem::take(writes);
            let request = match self.options.algorithm {
                Algorithm::NoCc => Request::Put { ts: self.ts, writes },
                _ => {
                    // Recovery needs the write set; RAMP-Fast's metadata (the whole
                    // transaction's, or each independent write's own) already is it.
                    let write_set =
                        if self.options.algorithm == Algorithm::RampFast { Vec::new() } else { self.write_set.clone() };
                    // Moved, not copied, where it is needed no more: a write starts once (its
                    // writes are taken above too), and its COMMIT carries no metadata.
                    let metadata = match self.part_metadata.get_mut(part) {
                        Some(own) => std::mem::take(own),
                        None if part == last_part => std::mem::take(&mut self.metadata),
                        None => self.metadata.clone(),
                    };
                    let ts = self.ts;
                    match self.one_phase {
                        true => Request::PrepareCommit { ts, metadata, write_set, writes },
                        false => Request::Prepare { ts, metadata, write_set, writes },
                    }
                }
            };
            out.push(Outgoing { server: *server, tag: make_tag(0, part as u16), request });
        }
    }

    /// Feeds one reply.
    pub fn on_reply(
        &mut self,
        tag: u32,
        response: Response,
        out: &mut Vec<Outgoing>,
    ) -> Result<Step<WriteOutcome>, ProtocolError> {
        let (attempt, part) = split_tag(tag);
        let part = usize::from(part);
        let server = self.parts.get(part).map_or(usize::MAX, |(server, _)| *server);
        let expected_attempt = match self.phase {
            WritePhase::Prepare => 0,
            WritePhase::Commit => 1,
        };
        if attempt != expected_attempt || part >= self.parts.len() || self.acknowledged[part] {
            return Err(ProtocolError::MalformedReply { server, why: MalformedReply::UnknownTag { tag } });
        }
        match response {
            Response::Ack => {}
            Response::Error { code, message } => return Err(ProtocolError::ServerError { server, code, message }),
            other => {
                let why = MalformedReply::UnexpectedKind { kind: other.kind(), expected: "ACK" };
                return Err(ProtocolError::MalformedReply { server, why });
            }
        }
        self.acknowledged[part] = true;
        self.outstanding -= 1;
        if self.outstanding > 0 {
            return Ok(Step::Pending);
        }
        match self.phase {
            WritePhase::Prepare if self.options.algorithm != Algorithm::NoCc && !self.one_phase => {
                // Every PREPARE is acknowledged: only now may any server make ts visible.
                self.phase = WritePhase::Commit;
                self.outstanding = self.parts.len();
                self.acknowledged.iter_mut().for_each(|done| *done = false);
                for (part, (server, _)) in self.parts.iter().enumerate() {
                    out.push(Outgoing {
                        server: *server,
                        tag: make_tag(1, part as u16),
                        request: Request::Commit { ts: self.ts },
                    });
                }
                Ok(Step::Pending)
            }
            _ => Ok(Step::Done(WriteOutcome { ts: self.ts })),
        }
    }
}

#[cfg(test)]
mod tests;
