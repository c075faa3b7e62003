//! RAMP-Fast (Bailis et al., Algorithm 2): one round for reads in the common case, two when a
//! read raced a write; two rounds (PREPARE, COMMIT) for writes; metadata = the write set.
//!
//! # Read (get_all)
//! Round 1 asks each server for the latest committed version of its keys. For every key `k`
//! the reader computes `required[k]` = the highest ts among the returned versions whose write
//! set contains `k`. Where `required[k]` is newer than what round 1 returned for `k`, the reader
//! missed part of a transaction that another key shows as committed, and round 2 fetches exactly
//! version `required[k]` of `k`. That version is at least prepared on its server, because its
//! writer sent COMMIT only after every PREPARE was acknowledged. The result contains no
//! fractured read.
//!
//! # Write (put_all)
//! PREPARE every write (with the write set) to its server; once every PREPARE is acknowledged,
//! COMMIT on every participating server. Readers never wait for either.

use std::collections::HashMap;

use ahash::AHashMap;

use super::{make_tag, split_tag, Outgoing, ProtocolError, ReadItem, ReadOutcome, Step, WriteOutcome};
use crate::cluster::Cluster;
use crate::limits::{KEY_BYTES_MAX, READ_RESTARTS_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::{ErrorCode, GetItem, Request, Response, VersionItem, Write};

/// Options of a read transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// TEST ONLY: skip the round-2 repair. This breaks read atomicity on purpose; the test
    /// suite uses it to prove that the checker detects fractured reads.
    #[doc(hidden)]
    pub mutant_skip_repair: bool,
}

/// Validates the keys of a transaction before anything is sent.
pub fn validate_keys<'k>(keys: impl ExactSizeIterator<Item = &'k [u8]>) -> Result<(), ProtocolError> {
    let invalid = |why: String| Err(ProtocolError::InvalidTransaction(why));
    if keys.len() == 0 || keys.len() > TXN_KEYS_MAX {
        return invalid(format!("a transaction needs 1..={TXN_KEYS_MAX} keys, got {}", keys.len()));
    }
    for key in keys {
        if key.len() > KEY_BYTES_MAX {
            return invalid(format!("a key of {} bytes exceeds the maximum of {KEY_BYTES_MAX}", key.len()));
        }
    }
    Ok(())
}

#[derive(Debug)]
struct Part {
    server: usize,
    /// Indices into `ReadTxn::keys` this request covers, in request order.
    key_indices: Vec<usize>,
    done: bool,
}

/// A RAMP-Fast read-only transaction.
#[derive(Debug)]
pub struct ReadTxn {
    /// Distinct keys, in first-seen order.
    keys: Vec<Vec<u8>>,
    /// For each requested key (with repeats), its index in `keys`.
    positions: Vec<usize>,
    key_servers: Vec<usize>,
    results: Vec<Option<VersionItem>>,
    /// Round-2 target per key (the ts asked for), 0 when not fetched in round 2.
    repair_at: Vec<Timestamp>,
    parts: Vec<Part>,
    outstanding: usize,
    round: u8,
    attempt: u16,
    restarts: u32,
    round2_keys: u32,
    options: ReadOptions,
}

impl ReadTxn {
    /// Plans a read of `keys` (repeats allowed; each gets the same result).
    pub fn new(cluster: &Cluster, keys: Vec<Vec<u8>>, options: ReadOptions) -> Result<ReadTxn, ProtocolError> {
        validate_keys(keys.iter().map(Vec::as_slice))?;
        let mut distinct: Vec<Vec<u8>> = Vec::with_capacity(keys.len());
        let mut positions = Vec::with_capacity(keys.len());
        {
            let mut index = KeyIndex::new(keys.len());
            for key in &keys {
                let position = match index.find(&distinct, key) {
                    Some(position) => position,
                    None => {
                        index.insert(key, distinct.len());
                        distinct.push(key.clone());
                        distinct.len() - 1
                    }
                };
                positions.push(position);
            }
        }
        let key_servers = distinct.iter().map(|key| cluster.server_of(key)).collect();
        let count = distinct.len();
        Ok(ReadTxn {
            keys: distinct,
            positions,
            key_servers,
            results: vec![None; count],
            repair_at: vec![TIMESTAMP_INITIAL; count],
            parts: Vec::new(),
            outstanding: 0,
            round: 1,
            attempt: 0,
            restarts: 0,
            round2_keys: 0,
            options,
        })
    }

    /// Round 1: the latest committed version of every key, one request per server.
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.round = 1;
        self.results.iter_mut().for_each(|result| *result = None);
        self.repair_at.iter_mut().for_each(|at| *at = TIMESTAMP_INITIAL);
        let wanted: Vec<(usize, Timestamp)> = (0..self.keys.len()).map(|index| (index, 0)).collect();
        self.send_round(&wanted, out);
    }

    /// Groups `(key index, at)` by server and emits one GET per server.
    fn send_round(&mut self, wanted: &[(usize, Timestamp)], out: &mut Vec<Outgoing>) {
        self.parts.clear();
        let mut items_by_part: Vec<Vec<GetItem>> = Vec::new();
        for &(index, at) in wanted {
            let server = self.key_servers[index];
            let part = match self.parts.iter().position(|part| part.server == server) {
                Some(part) => part,
                None => {
                    self.parts.push(Part { server, key_indices: Vec::new(), done: false });
                    items_by_part.push(Vec::new());
                    self.parts.len() - 1
                }
            };
            self.parts[part].key_indices.push(index);
            items_by_part[part].push(GetItem { key: self.keys[index].clone(), at });
        }
        self.outstanding = self.parts.len();
        for (part, items) in items_by_part.into_iter().enumerate() {
            out.push(Outgoing {
                server: self.parts[part].server,
                tag: make_tag(self.attempt, part as u16),
                request: Request::Get { items },
            });
        }
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
            return Err(ProtocolError::MalformedReply {
                server: usize::MAX,
                why: format!("unknown part {part_index}"),
            });
        };
        let server = part.server;
        if part.done {
            return Err(ProtocolError::MalformedReply { server, why: "duplicate reply".into() });
        }
        part.done = true;
        let items = match response {
            Response::Versions { items } => items,
            Response::Error { code: ErrorCode::VersionGone, .. } => return self.restart(out),
            Response::Error { code, message } => return Err(ProtocolError::ServerError { server, code, message }),
            other => {
                return Err(ProtocolError::MalformedReply { server, why: format!("expected VERSIONS, got {other:?}") })
            }
        };
        let key_indices = std::mem::take(&mut part.key_indices);
        if items.len() != key_indices.len() {
            return Err(ProtocolError::MalformedReply {
                server,
                why: format!("{} versions for {} keys", items.len(), key_indices.len()),
            });
        }
        for (index, item) in key_indices.into_iter().zip(items) {
            if self.round == 2 && item.ts != self.repair_at[index] {
                return Err(ProtocolError::MalformedReply {
                    server,
                    why: format!("asked for version {}, got {}", self.repair_at[index], item.ts),
                });
            }
            self.results[index] = Some(item);
        }
        self.outstanding -= 1;
        if self.outstanding > 0 {
            return Ok(Step::Pending);
        }
        if self.round == 1 && !self.options.mutant_skip_repair && self.plan_repair(out) {
            return Ok(Step::Pending);
        }
        Ok(Step::Done(self.finish()))
    }

    /// Computes `required[k]` from the metadata of round 1 and sends round 2 where needed.
    /// Returns whether round 2 was sent.
    fn plan_repair(&mut self, out: &mut Vec<Outgoing>) -> bool {
        let mut required = vec![TIMESTAMP_INITIAL; self.keys.len()];
        let mut index_of = KeyIndex::new(self.keys.len());
        for (index, key) in self.keys.iter().enumerate() {
            index_of.insert(key, index);
        }
        for result in self.results.iter().flatten() {
            for key in &result.write_set {
                if let Some(index) = index_of.find(&self.keys, key) {
                    required[index] = required[index].max(result.ts);
                }
            }
        }
        let wanted: Vec<(usize, Timestamp)> = required
            .iter()
            .enumerate()
            .filter(|(index, required)| **required > self.result_ts(*index))
            .map(|(index, required)| (index, *required))
            .collect();
        if wanted.is_empty() {
            return false;
        }
        for &(index, at) in &wanted {
            self.repair_at[index] = at;
        }
        self.round = 2;
        self.round2_keys += wanted.len() as u32;
        self.send_round(&wanted, out);
        true
    }

    fn result_ts(&self, index: usize) -> Timestamp {
        self.results[index].as_ref().map_or(TIMESTAMP_INITIAL, |item| item.ts)
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

    fn finish(&mut self) -> ReadOutcome {
        // Moves each distinct key's value out; a key asked for twice is cloned from its first item.
        let mut first_item: Vec<Option<usize>> = vec![None; self.keys.len()];
        let mut items: Vec<ReadItem> = Vec::with_capacity(self.positions.len());
        for &index in &self.positions {
            let item = match first_item[index] {
                Some(earlier) => items[earlier].clone(),
                None => {
                    first_item[index] = Some(items.len());
                    let result = self.results[index].as_mut().expect("every key answered");
                    ReadItem { key: self.keys[index].clone(), ts: result.ts, value: std::mem::take(&mut result.value) }
                }
            };
            items.push(item);
        }
        ReadOutcome { items, round2_keys: self.round2_keys, restarts: self.restarts }
    }
}

/// Finds a key's index among a transaction's distinct keys: a linear scan for the usual
/// handful of keys (no allocation, no hashing), a hash map beyond that.
enum KeyIndex<'k> {
    Scan,
    Map(AHashMap<&'k [u8], usize>),
}

/// Transactions with at most this many keys use a linear scan.
const KEY_INDEX_SCAN_MAX: usize = 16;

impl<'k> KeyIndex<'k> {
    fn new(capacity: usize) -> Self {
        if capacity <= KEY_INDEX_SCAN_MAX {
            KeyIndex::Scan
        } else {
            KeyIndex::Map(AHashMap::with_capacity(capacity))
        }
    }

    /// Records that `key` is `keys[index]` (the scan variant reads `keys` directly).
    fn insert(&mut self, key: &'k [u8], index: usize) {
        if let KeyIndex::Map(map) = self {
            map.insert(key, index);
        }
    }

    fn find(&self, keys: &[Vec<u8>], key: &[u8]) -> Option<usize> {
        match self {
            KeyIndex::Scan => keys.iter().position(|candidate| candidate.as_slice() == key),
            KeyIndex::Map(map) => map.get(key).copied(),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum WritePhase {
    Prepare,
    Commit,
}

/// A RAMP-Fast write-only transaction.
#[derive(Debug)]
pub struct WriteTxn {
    ts: Timestamp,
    write_set: Vec<Vec<u8>>,
    /// Per participating server: its writes, until PREPARE is sent.
    parts: Vec<(usize, Vec<Write>)>,
    acknowledged: Vec<bool>,
    outstanding: usize,
    phase: WritePhase,
}

impl WriteTxn {
    /// Plans writing `writes` at timestamp `ts`. A key written twice keeps its last value.
    /// Everything is validated here, before any server state changes.
    pub fn new(cluster: &Cluster, ts: Timestamp, writes: Vec<(Vec<u8>, Vec<u8>)>) -> Result<WriteTxn, ProtocolError> {
        validate_keys(writes.iter().map(|(key, _)| key.as_slice()))?;
        if ts == TIMESTAMP_INITIAL {
            return Err(ProtocolError::InvalidTransaction("timestamp 0 is reserved".into()));
        }
        if let Some((_, value)) = writes.iter().find(|(_, value)| value.len() > VALUE_BYTES_MAX) {
            return Err(ProtocolError::InvalidTransaction(format!(
                "a value of {} bytes exceeds the maximum of {VALUE_BYTES_MAX}",
                value.len()
            )));
        }
        let mut last: HashMap<Vec<u8>, Vec<u8>> = HashMap::with_capacity(writes.len());
        let mut write_set = Vec::with_capacity(writes.len());
        for (key, value) in writes {
            if last.insert(key.clone(), value).is_none() {
                write_set.push(key);
            }
        }
        let mut parts: Vec<(usize, Vec<Write>)> = Vec::new();
        for key in &write_set {
            let server = cluster.server_of(key);
            let value = last.remove(key).expect("every write-set key has a value");
            let write = Write { key: key.clone(), value };
            match parts.iter_mut().find(|(owner, _)| *owner == server) {
                Some((_, writes)) => writes.push(write),
                None => parts.push((server, vec![write])),
            }
        }
        let count = parts.len();
        Ok(WriteTxn {
            ts,
            write_set,
            parts,
            acknowledged: vec![false; count],
            outstanding: 0,
            phase: WritePhase::Prepare,
        })
    }

    /// The transaction's timestamp.
    pub fn ts(&self) -> Timestamp {
        self.ts
    }

    /// The distinct keys written, in first-seen order.
    pub fn write_set(&self) -> &[Vec<u8>] {
        &self.write_set
    }

    /// Sends PREPARE to every participating server.
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.phase = WritePhase::Prepare;
        self.outstanding = self.parts.len();
        for (part, (server, writes)) in self.parts.iter_mut().enumerate() {
            out.push(Outgoing {
                server: *server,
                tag: make_tag(0, part as u16),
                request: Request::Prepare {
                    ts: self.ts,
                    write_set: self.write_set.clone(),
                    writes: std::mem::take(writes),
                },
            });
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
            return Err(ProtocolError::MalformedReply { server, why: format!("unexpected reply tag {tag:#x}") });
        }
        match response {
            Response::Ack => {}
            Response::Error { code, message } => return Err(ProtocolError::ServerError { server, code, message }),
            other => return Err(ProtocolError::MalformedReply { server, why: format!("expected ACK, got {other:?}") }),
        }
        self.acknowledged[part] = true;
        self.outstanding -= 1;
        if self.outstanding > 0 {
            return Ok(Step::Pending);
        }
        match self.phase {
            WritePhase::Prepare => {
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
            WritePhase::Commit => Ok(Step::Done(WriteOutcome { ts: self.ts })),
        }
    }
}
