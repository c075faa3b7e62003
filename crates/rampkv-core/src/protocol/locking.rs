//! Strict two-phase locking with two-phase commit (S2PL+2PC): the client side, the baseline
//! the RAMP papers compare against.
//!
//! - Read: LOCK_READ to every server (shared locks, then the latest versions); once every server
//!   has answered, all locks are held at once, so the values form a consistent snapshot; then
//!   RELEASE everywhere (the read is done when the releases are sent).
//! - Write: LOCK_WRITE to every server (exclusive locks, writes staged: the 2PC prepare and the
//!   vote); once every server voted yes, COMMIT_LOCKED everywhere (apply and unlock); done when
//!   every commit is acknowledged.
//! - Abort: any server may answer Aborted (wait-die, or a lock wait timed out). The transaction
//!   then sends RELEASE to every server it contacted and starts again with the same timestamp,
//!   which keeps its age, so it eventually becomes the oldest and cannot be aborted by wait-die.
//!   Attempts are bounded ([`LOCKING_ATTEMPTS_MAX`]). A RELEASE follows the lock request on the
//!   same connection, so it always arrives after it and cancels it if it is still waiting.
//!
//! Tags: attempt in the high 16 bits; the low 16 bits are the part, with `RELEASE_PART` set on
//! releases (whose acknowledgements are not awaited).

use super::ramp::{distinct_keys, last_write_wins, read_item, validate_keys};
use super::{
    make_tag, split_tag, writes_of_pairs, MalformedReply, Outgoing, ProtocolError, ReadOutcome, Step, WriteOutcome,
};
use crate::cluster::Cluster;
use crate::limits::{LOCKING_ATTEMPTS_MAX, LOCK_BACKOFF_US_MAX, LOCK_BACKOFF_US_MIN};
use crate::types::Timestamp;
use crate::wire::{ErrorCode, Request, Response, VersionItem, Write};

const RELEASE_PART: u16 = 0x8000;

/// Per-server share of a locking transaction.
#[derive(Debug)]
struct Part {
    server: usize,
    /// Indices into the transaction's keys.
    key_indices: Vec<usize>,
    answered: bool,
}

/// What a reply means for the transaction.
enum Reply {
    Answered,
    Aborted,
}

/// Shared bookkeeping of both locking machines.
#[derive(Debug)]
struct Attempts {
    ts: Timestamp,
    parts: Vec<Part>,
    outstanding: usize,
    attempt: u16,
}

impl Attempts {
    fn new(ts: Timestamp, key_servers: impl Iterator<Item = usize>) -> Attempts {
        let mut parts: Vec<Part> = Vec::new();
        for (index, server) in key_servers.enumerate() {
            match parts.iter_mut().find(|part| part.server == server) {
                Some(part) => part.key_indices.push(index),
                None => parts.push(Part { server, key_indices: vec![index], answered: false }),
            }
        }
        Attempts { ts, parts, outstanding: 0, attempt: 0 }
    }

    /// Sends one request per part, built by `request`.
    fn send(&mut self, phase: u16, out: &mut Vec<Outgoing>, mut request: impl FnMut(&Part) -> Request) {
        self.outstanding = self.parts.len();
        for (index, part) in self.parts.iter_mut().enumerate() {
            part.answered = false;
            let tag = make_tag(self.attempt, phase | index as u16);
            out.push(Outgoing { server: part.server, tag, request: request(part) });
        }
    }

    /// Checks a reply's tag; returns the part it answers, or `None` for a reply to an earlier
    /// attempt or a RELEASE (neither is awaited).
    fn part_of(&mut self, tag: u32, phase: u16) -> Result<Option<usize>, ProtocolError> {
        let (attempt, part) = split_tag(tag);
        if attempt != self.attempt || part & RELEASE_PART != 0 {
            return Ok(None);
        }
        let index = usize::from(part & !COMMIT_PHASE);
        let Some(state) = self.parts.get_mut(index).filter(|_| part & COMMIT_PHASE == phase) else {
            return Err(ProtocolError::MalformedReply { server: usize::MAX, why: MalformedReply::UnknownTag { tag } });
        };
        if state.answered {
            return Err(ProtocolError::MalformedReply { server: state.server, why: MalformedReply::Duplicate });
        }
        state.answered = true;
        self.outstanding -= 1;
        Ok(Some(index))
    }

    /// Releases everything on every server and counts the next attempt (bounded); returns how
    /// long to wait before it: exponential in the attempt, with jitter from the timestamp so
    /// that transactions aborted together do not retry together.
    fn abort_and_retry(&mut self, out: &mut Vec<Outgoing>) -> Result<std::time::Duration, ProtocolError> {
        for (index, part) in self.parts.iter().enumerate() {
            let tag = make_tag(self.attempt, RELEASE_PART | index as u16);
            out.push(Outgoing { server: part.server, tag, request: Request::Release { ts: self.ts } });
        }
        self.attempt += 1;
        if u32::from(self.attempt) >= LOCKING_ATTEMPTS_MAX {
            return Err(ProtocolError::TooManyAborts(u32::from(self.attempt)));
        }
        let ceiling = (LOCK_BACKOFF_US_MIN << self.attempt.min(16)).min(LOCK_BACKOFF_US_MAX);
        let jitter = (self.ts ^ u64::from(self.attempt)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        Ok(std::time::Duration::from_micros(ceiling / 2 + jitter % (ceiling / 2 + 1)))
    }

    /// Classifies a reply to a lock or commit request.
    fn classify(&self, index: usize, response: &Response) -> Result<Reply, ProtocolError> {
        let server = self.parts[index].server;
        match response {
            Response::Error { code: ErrorCode::Aborted, .. } => Ok(Reply::Aborted),
            Response::Error { code, message } => {
                Err(ProtocolError::ServerError { server, code: *code, message: message.clone() })
            }
            _ => Ok(Reply::Answered),
        }
    }
}

/// Marks the second phase (COMMIT_LOCKED) of a write in tags.
const COMMIT_PHASE: u16 = 0x4000;

/// An S2PL read-only transaction.
#[derive(Debug)]
pub struct LockingReadTxn {
    /// Distinct keys, first-seen order.
    keys: Vec<Vec<u8>>,
    /// For each requested key (with repeats), its index in `keys`.
    positions: Vec<usize>,
    results: Vec<Option<VersionItem>>,
    /// Per key of `keys`: its latest committed timestamp when the lock request arrived, as its
    /// server reported it (S2PL evidence; `None`: not reported).
    on_arrival: Vec<Option<Timestamp>>,
    attempts: Attempts,
    aborted: bool,
}

impl LockingReadTxn {
    /// Plans a locking read of `keys` (distinct) with priority `ts` (a fresh timestamp).
    pub fn new(cluster: &Cluster, ts: Timestamp, keys: Vec<Vec<u8>>) -> Result<Self, ProtocolError> {
        validate_keys(keys.iter().map(Vec::as_slice))?;
        let (distinct, positions) = distinct_keys(keys);
        let attempts = Attempts::new(ts, distinct.iter().map(|key| cluster.server_of(key)));
        Ok(LockingReadTxn {
            results: vec![None; distinct.len()],
            on_arrival: vec![None; distinct.len()],
            keys: distinct,
            positions,
            attempts,
            aborted: false,
        })
    }

    /// The distinct keys read.
    pub fn keys(&self) -> &[Vec<u8>] {
        &self.keys
    }

    /// Sends the lock round (again, after a [`Step::Backoff`]).
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.aborted = false;
        let (ts, keys) = (self.attempts.ts, &self.keys);
        self.attempts.send(0, out, |part| Request::LockRead {
            ts,
            keys: part.key_indices.iter().map(|&index| keys[index].clone()).collect(),
        });
    }

    /// Feeds one reply.
    pub fn on_reply(
        &mut self,
        tag: u32,
        response: Response,
        out: &mut Vec<Outgoing>,
    ) -> Result<Step<ReadOutcome>, ProtocolError> {
        let Some(index) = self.attempts.part_of(tag, 0)? else {
            return Ok(Step::Pending);
        };
        match self.attempts.classify(index, &response)? {
            Reply::Aborted => self.aborted = true,
            Reply::Answered => {
                let server = self.attempts.parts[index].server;
                let (items, on_arrival) = match response {
                    Response::VersionsLocked { items, on_arrival } => (items, Some(on_arrival)),
                    // A server that does not report arrival timestamps: the read has no evidence.
                    Response::Versions { items } => (items, None),
                    response => {
                        let why = MalformedReply::UnexpectedKind { kind: response.kind(), expected: "VERSIONS_LOCKED" };
                        return Err(ProtocolError::MalformedReply { server, why });
                    }
                };
                let indices = &self.attempts.parts[index].key_indices;
                if items.len() != indices.len() {
                    let why = MalformedReply::VersionCount { versions: items.len(), keys: indices.len() };
                    return Err(ProtocolError::MalformedReply { server, why });
                }
                for (position, (&key_index, item)) in indices.iter().zip(items).enumerate() {
                    self.results[key_index] = Some(item);
                    // The wire decoder checked one arrival timestamp per version.
                    self.on_arrival[key_index] = on_arrival.as_ref().map(|on_arrival| on_arrival[position]);
                }
            }
        }
        if self.attempts.outstanding > 0 {
            return Ok(Step::Pending);
        }
        if self.aborted {
            return Ok(Step::Backoff(self.attempts.abort_and_retry(out)?));
        }
        // Every lock is held: release them all; the read is complete.
        let ts = self.attempts.ts;
        for (index, part) in self.attempts.parts.iter().enumerate() {
            let tag = make_tag(self.attempts.attempt, RELEASE_PART | index as u16);
            out.push(Outgoing { server: part.server, tag, request: Request::Release { ts } });
        }
        let every_arrival = self.on_arrival.iter().all(Option::is_some);
        let mut reclaimed_deadline_ms = 0;
        let items = self
            .positions
            .iter()
            .map(|&index| {
                let mut result = self.results[index].clone().expect("every key answered");
                if result.expiry.is_reclaimed() {
                    reclaimed_deadline_ms = u64::max(reclaimed_deadline_ms, result.expiry.deadline_ms());
                }
                // Round 1 of a locking read: what a read taking no lock would have returned
                // when the lock request arrived (the answer without the lock wait). Every key
                // has it or none does, as the history wants.
                let round1_ts = every_arrival.then(|| self.on_arrival[index]).flatten();
                read_item(self.keys[index].clone(), &mut result, round1_ts, false)
            })
            .collect();
        let restarts = u32::from(self.attempts.attempt);
        Ok(Step::Done(ReadOutcome {
            items,
            round2_keys: 0,
            round2_found_nothing: 0,
            restarts,
            read_at_ms: 0,
            reclaimed_deadline_ms,
        }))
    }
}

/// An S2PL write-only transaction (two-phase commit).
#[derive(Debug)]
pub struct LockingWriteTxn {
    writes: Vec<Write>,
    attempts: Attempts,
    committing: bool,
    aborted: bool,
}

impl LockingWriteTxn {
    /// Plans writing `writes` at `ts`; a key written twice keeps its last value.
    pub fn new(cluster: &Cluster, ts: Timestamp, writes: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Self, ProtocolError> {
        Self::with_writes(cluster, ts, writes_of_pairs(writes))
    }

    /// [`LockingWriteTxn::new`] of [`Write`]s with their expiries.
    pub fn with_writes(cluster: &Cluster, ts: Timestamp, writes: Vec<Write>) -> Result<Self, ProtocolError> {
        validate_keys(writes.iter().map(|write| write.key.as_slice()))?;
        let deduplicated = last_write_wins(writes)?;
        let attempts = Attempts::new(ts, deduplicated.iter().map(|write| cluster.server_of(&write.key)));
        Ok(LockingWriteTxn { writes: deduplicated, attempts, committing: false, aborted: false })
    }

    /// The transaction's timestamp.
    pub fn ts(&self) -> Timestamp {
        self.attempts.ts
    }

    /// The distinct keys written.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.writes.iter().map(|write| write.key.as_slice())
    }

    /// Sends the 2PC prepare: exclusive locks, staged writes (again, after a [`Step::Backoff`]).
    pub fn start(&mut self, out: &mut Vec<Outgoing>) {
        self.committing = false;
        self.aborted = false;
        let (ts, writes) = (self.attempts.ts, &self.writes);
        self.attempts.send(0, out, |part| Request::LockWrite {
            ts,
            writes: part.key_indices.iter().map(|&index| writes[index].clone()).collect(),
        });
    }

    /// Feeds one reply.
    pub fn on_reply(
        &mut self,
        tag: u32,
        response: Response,
        out: &mut Vec<Outgoing>,
    ) -> Result<Step<WriteOutcome>, ProtocolError> {
        let phase = if self.committing { COMMIT_PHASE } else { 0 };
        let Some(index) = self.attempts.part_of(tag, phase)? else {
            return Ok(Step::Pending);
        };
        match self.attempts.classify(index, &response)? {
            Reply::Aborted if self.committing => {
                let server = self.attempts.parts[index].server;
                return Err(ProtocolError::MalformedReply { server, why: MalformedReply::CommitAborted });
            }
            Reply::Aborted => self.aborted = true,
            Reply::Answered if !matches!(response, Response::Ack) => {
                let server = self.attempts.parts[index].server;
                let why = MalformedReply::UnexpectedKind { kind: response.kind(), expected: "ACK" };
                return Err(ProtocolError::MalformedReply { server, why });
            }
            Reply::Answered => {}
        }
        if self.attempts.outstanding > 0 {
            return Ok(Step::Pending);
        }
        if self.committing {
            return Ok(Step::Done(WriteOutcome { ts: self.attempts.ts }));
        }
        if self.aborted {
            return Ok(Step::Backoff(self.attempts.abort_and_retry(out)?));
        }
        // Every server voted yes: commit everywhere.
        self.committing = true;
        let ts = self.attempts.ts;
        self.attempts.send(COMMIT_PHASE, out, |_| Request::CommitLocked { ts });
        Ok(Step::Pending)
    }
}
