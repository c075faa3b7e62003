//! The protocol core: transactions as I/O-free state machines.
//!
//! A client transaction is a value that, when started, returns the requests it wants sent
//! (each tagged, and addressed to a server index), and that is fed the replies as they arrive;
//! it answers with more requests or with its outcome. It never touches a socket, a thread or a
//! clock, so the same code runs over every transport and under the simulated network of the
//! tests. The server side ([`server::ServerCore`]) is likewise a function from a request to a
//! reply over the [`crate::storage::Store`].
//!
//! # Tags
//! Every outgoing request carries a `tag` (attempt in the high 16 bits, part in the low 16).
//! The driver echoes it with the reply. A reply whose attempt is not the current one (a read
//! that restarted) is ignored, so late replies can never mix into a newer attempt.

pub mod bloom;
pub mod keyspace;
pub mod locking;
pub mod locks;
pub mod ramp;
pub mod server;
pub mod session;
pub mod update;

use crate::types::Timestamp;
use crate::wire::{ErrorCode, Request, Write};

/// A server-side connection, as the server core sees it: which front end serves it (a TCP
/// poller, a fabric poller, an in-process client), its slot there, and the generation of that
/// slot (a reply for a closed connection never reaches a newer one in the same slot). S2PL lock
/// ownership and deferred replies are keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ConnectionId {
    /// The front end (its inbox in the server group's router).
    pub front: u32,
    /// Bumped every time the front end opens a connection.
    pub generation: u32,
    /// The connection's slot in its front end.
    pub slot: u32,
}

/// A request the transaction wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Index of the destination server in the cluster.
    pub server: usize,
    /// Echoed back with the reply; see the module docs.
    pub tag: u32,
    pub request: Request,
}

/// Makes a tag from an attempt number and a part index.
pub fn make_tag(attempt: u16, part: u16) -> u32 {
    (u32::from(attempt) << 16) | u32::from(part)
}

/// Splits a tag into (attempt, part).
pub fn split_tag(tag: u32) -> (u16, u16) {
    ((tag >> 16) as u16, tag as u16)
}

/// What a transaction does after a reply.
#[derive(Debug)]
pub enum Step<T> {
    /// Waiting for more replies (any new requests were appended to the output).
    Pending,
    /// Aborted (S2PL): call `restart` after this long. The delay lets the older transaction
    /// that caused the abort finish first; without it a younger one retries into the same
    /// conflict and burns its attempts in one round trip.
    Backoff(std::time::Duration),
    /// Finished.
    Done(T),
}

/// One key's result of a read transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadItem {
    pub key: Vec<u8>,
    /// Timestamp of the version returned; 0 for the initial (empty) value.
    pub ts: Timestamp,
    /// The value (shared, not copied, with a reply from a server in the same process).
    pub value: bytes::Bytes,
    /// What round 1 of the attempt that finished returned for this key: the answer the read
    /// would have given without its round-2 repair (the read-atomicity checker counts the
    /// reads whose round 1 alone was fractured). S2PL: the key's latest committed timestamp
    /// when the lock request reached its server, the answer without the lock wait (`None` if
    /// the server does not report it).
    pub round1_ts: Option<Timestamp>,
    /// Whether round 2 of that attempt fetched this key.
    pub fetched_in_round2: bool,
    /// When the version read expires, in ms since the Unix epoch (0: never; 1: a deletion).
    pub expires_at_ms: u64,
    /// Whether the key has a value at this read: false for a key never written (ts 0),
    /// deleted, reclaimed by its server, or expired at the read's instant
    /// ([`ReadOutcome::read_at_ms`]). Its value is then empty, and `ts` is still the version's
    /// (RAMP's evidence, and the history's).
    pub exists: bool,
}

impl ReadItem {
    /// The value, if the key has one at this read.
    pub fn present_value(&self) -> Option<&[u8]> {
        self.exists.then_some(&self.value[..])
    }
}

/// The result of a read-only transaction, one item per requested key, in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOutcome {
    pub items: Vec<ReadItem>,
    /// Keys fetched in round 2 (the RAMP repair), over all attempts.
    pub round2_keys: u32,
    /// Round-2 fetches that found none of their candidates (RAMP-Hybrid: Bloom false positives).
    pub round2_found_nothing: u32,
    /// Times the read restarted because a version it needed was collected.
    pub restarts: u32,
    /// The instant the read judged expiry at, in ms since the Unix epoch: the reader's clock
    /// when the read finished, raised to [`ReadOutcome::reclaimed_deadline_ms`]; 0 when no
    /// version it got expires (no clock was read). One instant for every key of the read, so
    /// versions of one transaction with one deadline are judged alike.
    pub read_at_ms: u64,
    /// The latest deadline of a version the read got reclaimed (its server dropped the value,
    /// the deadline long past by the server's clock); 0: none. The read's instant is at least
    /// this, whatever the reader's clock says: a server whose clock runs ahead of the reader's
    /// never makes it see part of a transaction expired.
    pub reclaimed_deadline_ms: u64,
}

impl ReadOutcome {
    /// Judges expiry at one instant: the reader's clock (`now_ms`, ms since the Unix epoch,
    /// read only if a version the read got expires after every reclaimed deadline), raised to
    /// [`ReadOutcome::reclaimed_deadline_ms`]. A version whose deadline is at or before that
    /// instant reads as absent. The session machine calls it when a read finishes; a caller
    /// that drives a read machine itself calls it before it uses the items.
    pub fn judge_expiry(&mut self, now_ms: impl FnOnce() -> u64) {
        let floor_ms = self.reclaimed_deadline_ms;
        let expiring = |item: &ReadItem| item.exists && item.expires_at_ms != 0;
        if !self.items.iter().any(expiring) {
            self.read_at_ms = self.read_at_ms.max(floor_ms);
            return;
        }
        let needs_clock = self.items.iter().any(|item| expiring(item) && item.expires_at_ms > floor_ms);
        let at_ms = if needs_clock { now_ms().max(floor_ms) } else { floor_ms };
        self.read_at_ms = self.read_at_ms.max(at_ms);
        let at_ms = self.read_at_ms;
        for item in self.items.iter_mut().filter(|item| item.exists && item.expires_at_ms != 0) {
            if item.expires_at_ms <= at_ms {
                item.exists = false;
                item.value = bytes::Bytes::new();
            }
        }
    }
}

/// Key-value pairs as writes that never expire.
pub fn writes_of_pairs(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<Write> {
    pairs.into_iter().map(|(key, value)| Write::new(key, value)).collect()
}

/// The result of a write-only transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    pub ts: Timestamp,
}

/// Why a transaction is refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTransaction {
    #[error("a transaction needs 1..={max} keys, got {count}", max = crate::limits::TXN_KEYS_MAX)]
    KeyCount { count: usize },
    #[error("a key of {bytes} bytes exceeds the maximum of {max}", max = crate::limits::KEY_BYTES_MAX)]
    KeyTooLarge { bytes: usize },
    #[error("a value of {bytes} bytes exceeds the maximum of {max}", max = crate::limits::VALUE_BYTES_MAX)]
    ValueTooLarge { bytes: usize },
    #[error("timestamp 0 is reserved for the initial value")]
    ReservedTimestamp,
    #[error("S2PL runs on the locking machines")]
    LockingAlgorithm,
    #[error("the write set does not encode: {0}")]
    WriteSet(crate::wire::WireError),
    #[error("an expiry of {expires_at_ms} ms since the Unix epoch is beyond the largest, {max}", max = crate::types::Expiry::DEADLINE_MS_MAX)]
    Expiry { expires_at_ms: u64 },
    #[error("partition {partition}: {why}")]
    Partition { partition: u32, why: &'static str },
}

/// How a reply does not fit the request it answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MalformedReply {
    #[error("unexpected reply tag {tag:#x}")]
    UnknownTag { tag: u32 },
    #[error("a second reply to the same request")]
    Duplicate,
    #[error("a reply of kind {kind:#04x} where {expected} was expected")]
    UnexpectedKind { kind: u8, expected: &'static str },
    #[error("{versions} versions for {keys} keys")]
    VersionCount { versions: usize, keys: usize },
    #[error("asked for version {asked}, got {got}")]
    WrongVersion { asked: Timestamp, got: Timestamp },
    #[error("version {got} is not among the candidates asked for")]
    NotACandidate { got: Timestamp },
    #[error("a commit cannot abort")]
    CommitAborted,
    #[error("a key listing page that cannot be right: {why}")]
    Listing { why: &'static str },
}

/// Why a transaction failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("invalid transaction: {0}")]
    InvalidTransaction(#[from] InvalidTransaction),
    /// The server's error reply (its message is the server's words).
    #[error("server {server} refused the request ({code:?}): {message}")]
    ServerError { server: usize, code: ErrorCode, message: String },
    /// `server` is `usize::MAX` when the reply names no part of the transaction.
    #[error("server {server} sent a reply that does not fit the request: {why}")]
    MalformedReply { server: usize, why: MalformedReply },
    #[error("read restarted {0} times because versions it needed were collected")]
    TooManyRestarts(u32),
    #[error("transaction aborted {0} times by lock conflicts (S2PL wait-die or lock timeouts)")]
    TooManyAborts(u32),
    /// A single-key update found its key prepared by a write in flight this many times.
    #[error(
        "the update found its key prepared by a write in flight {attempts} times (the last at {prepared}); \
         that write did not commit or resolve in time"
    )]
    UpdateBusy { attempts: u32, prepared: Timestamp },
    /// A single-key update's timestamp was too low this many times (updates of the same key
    /// racing it).
    #[error("the update's timestamp was below its key's newest ({newest}) {attempts} times")]
    UpdateTimestamps { attempts: u32, newest: Timestamp },
}
