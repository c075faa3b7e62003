//! Client-to-server messages.
//!
//! # Format (frame bodies, all integers little-endian)
//! ```text
//! key      := u16 length, bytes                 (length <= KEY_BYTES_MAX)
//! value    := u32 length, bytes                 (length <= VALUE_BYTES_MAX)
//! keys     := u32 count, key * count            (count <= TXN_KEYS_MAX)
//! metadata := see metadata.rs
//! selector := u8 tag, then
//!   0x00 LATEST                    the latest committed version, with value and metadata
//!   0x01 LATEST_TS                 only the timestamp of the latest committed version
//!   0x02 EXACT      u64 ts         exactly version ts, prepared or committed
//!   0x03 HIGHEST_OF u32 n, u64 * n the highest stored version whose ts is one of these
//!                                  (n <= TXN_KEYS_MAX); ts 0 in the reply: none is stored
//!
//! 0x01 HELLO    u16 client_ids_wanted [u32 partitions, u32 server_index]
//!                                                 ask for a block of unique client ids (and
//!                                                 check the cluster files agree)
//! writes   := u32 count, (key, value) * count [, expiries]   (expiries.rs: present only
//!                                                when a write expires)
//!
//! 0x02 GET      u32 count, (key, selector) * count
//! 0x03 PREPARE  u64 ts, metadata, keys write_set, store versions, not yet visible; the
//!               writes                           write set is for recovery (cooperative
//!                                                termination), empty when the metadata is it
//! 0x04 COMMIT   u64 ts                           make the versions of ts visible
//! 0x05 PUT      u64 ts, writes                   store and make visible at once (NoCC)
//! 0x06 LOCK_READ      u64 ts, keys               S2PL: shared-lock the keys, then reply with
//!                                                their latest versions (or ERROR Aborted)
//! 0x07 LOCK_WRITE     u64 ts, writes
//!                                                S2PL 2PC prepare: exclusive-lock the keys and
//!                                                stage the writes; ACK votes yes
//! 0x08 COMMIT_LOCKED  u64 ts                     S2PL 2PC commit: apply staged writes, unlock
//! 0x09 RELEASE        u64 ts                     S2PL: drop ts's locks, staged writes and any
//!                                                waiting request (which gets ERROR Aborted)
//! 0x0A STATUS         u64 ts, keys               recovery: has this server prepared or
//!                                                committed ts (on these keys)? reply STATUS;
//!                                                "unknown" also marks ts aborted here
//! 0x0B GET_LOCATE     as GET                     GET, and also say where each key's item slot
//!                                                is (reply VERSIONS_LOCATED); sent only by the
//!                                                one-sided (GET*) transport to fill its
//!                                                address cache
//! 0x0E PREPARE_COMMIT as PREPARE                 a whole RAMP write in one request: store the
//!                                                versions, then make them visible; only for a
//!                                                transaction whose write set is all on this
//!                                                server (the write set must name exactly the
//!                                                keys written)
//! 0x0F UPDATE         u64 ts, metadata, key, op   a single-key conditional write (update.rs):
//!                                                applied at once to the key's newest
//!                                                committed value, stored and committed as a
//!                                                one-key write at ts; reply UPDATED
//! 0x10 LIST_KEYS, 0x11 COUNT_KEYS                the key space: see keyspace.rs
//! ```

use super::expiries::{decode_expiries, encode_expiries};
use super::frame::append_frame;
use super::keyspace::{CountKeys, ListKeys, KIND_COUNT_KEYS, KIND_LIST_KEYS};
use super::metadata::Metadata;
use super::update::UpdateOp;
use super::{ClusterView, Decoder, Encoder, WireError};
use crate::limits::TXN_KEYS_MAX;
use crate::types::Timestamp;

pub const KIND_HELLO: u8 = 0x01;
pub const KIND_GET: u8 = 0x02;
pub const KIND_PREPARE: u8 = 0x03;
pub const KIND_COMMIT: u8 = 0x04;
pub const KIND_PUT: u8 = 0x05;
pub const KIND_LOCK_READ: u8 = 0x06;
pub const KIND_LOCK_WRITE: u8 = 0x07;
pub const KIND_COMMIT_LOCKED: u8 = 0x08;
pub const KIND_RELEASE: u8 = 0x09;
pub const KIND_STATUS: u8 = 0x0A;
pub const KIND_GET_LOCATE: u8 = 0x0B;
pub const KIND_PREPARE_COMMIT: u8 = 0x0E;
pub const KIND_UPDATE: u8 = 0x0F;

const SELECTOR_LATEST: u8 = 0;
const SELECTOR_LATEST_TS: u8 = 1;
const SELECTOR_EXACT: u8 = 2;
const SELECTOR_HIGHEST_OF: u8 = 3;

/// Which version of a key a GET asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// The latest committed version with its value and metadata (round 1 of RAMP-Fast and
    /// RAMP-Hybrid; NoCC reads).
    Latest,
    /// Only the timestamp of the latest committed version (round 1 of RAMP-Small).
    LatestTimestamp,
    /// Exactly this version, prepared or committed (round 2 of RAMP-Fast).
    Exact(Timestamp),
    /// The highest stored version whose timestamp is one of these (round 2 of RAMP-Small and
    /// RAMP-Hybrid); the reply has ts 0 when none is stored.
    HighestOf(Vec<Timestamp>),
}

/// One key of a GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetItem {
    pub key: Vec<u8>,
    pub selector: Selector,
}

/// One write of a transaction (a PREPARE, PUT or LOCK_WRITE carries them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// When the version written stops being visible, in ms since the Unix epoch, judged by
    /// each reader's clock: 0 never, 1 already (a deletion: [`Write::delete`]). At most
    /// `types::Expiry::DEADLINE_MS_MAX` (bit 63 is the servers').
    pub expires_at_ms: u64,
}

impl Write {
    /// A write of `value` to `key` that never expires.
    pub fn new(key: Vec<u8>, value: Vec<u8>) -> Self {
        Self { key, value, expires_at_ms: 0 }
    }

    /// A write of `value` to `key` that expires at `expires_at_ms` (ms since the Unix epoch; 0:
    /// never).
    pub fn expiring(key: Vec<u8>, value: Vec<u8>, expires_at_ms: u64) -> Self {
        Self { key, value, expires_at_ms }
    }

    /// The deletion of `key`: a version with no value that has already expired. A read sees
    /// the key absent, exactly as an expired one, and the server reclaims it the same way.
    pub fn delete(key: Vec<u8>) -> Self {
        Self { key, value: Vec::new(), expires_at_ms: crate::types::Expiry::DELETED.to_word() }
    }
}

/// A request from a client to one server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// Asks for `client_ids_wanted` consecutive unique client ids; `cluster`: the client's
    /// cluster file's partition count and the index it gives this server (checked by a server
    /// that has a cluster file).
    Hello { client_ids_wanted: u16, cluster: Option<ClusterView> },
    /// Reads keys stored on this server.
    Get { items: Vec<GetItem> },
    /// As `Get`, and the reply (`Response::VersionsLocated`) also gives each key's item slot
    /// (GET*: the one-sided transport fills its address cache from it).
    GetLocate { items: Vec<GetItem> },
    /// Stores the transaction's writes on this server as prepared (invisible) versions, each
    /// with the transaction's metadata.
    /// `write_set` is the transaction's whole write set, kept for recovery only (empty when
    /// `metadata` is the write set).
    Prepare { ts: Timestamp, metadata: Metadata, write_set: Vec<Vec<u8>>, writes: Vec<Write> },
    /// Makes the prepared versions of transaction `ts` on this server visible.
    Commit { ts: Timestamp },
    /// PREPARE then COMMIT in one request, for a transaction every key of which is on this
    /// server (a one-partition RAMP write: there is no other PREPARE to wait for). Refused
    /// unless the write set (`metadata`'s, else `write_set`) names exactly the keys written, so
    /// a server can tell such a transaction from one part of a wider one.
    PrepareCommit { ts: Timestamp, metadata: Metadata, write_set: Vec<Vec<u8>>, writes: Vec<Write> },
    /// Stores and commits at once, with no metadata (NoCC: no atomicity across keys).
    Put { ts: Timestamp, writes: Vec<Write> },
    /// S2PL: shared locks on `keys` for transaction `ts`, then their latest versions.
    LockRead { ts: Timestamp, keys: Vec<Vec<u8>> },
    /// S2PL two-phase commit, phase 1: exclusive locks on the keys, writes staged.
    LockWrite { ts: Timestamp, writes: Vec<Write> },
    /// S2PL two-phase commit, phase 2: apply the staged writes of `ts` and release its locks.
    CommitLocked { ts: Timestamp },
    /// S2PL: release everything `ts` holds or waits for on this server (end of a read, or abort).
    Release { ts: Timestamp },
    /// Recovery: what this server knows of transaction `ts` on `keys` (its keys here).
    Status { ts: Timestamp, keys: Vec<Vec<u8>> },
    /// A single-key conditional write: `op` applied to `key`'s newest committed value, the
    /// result stored and committed at once as a one-key write at `ts` carrying `metadata`
    /// (what the client's algorithm attaches to a write of `key` alone). Answered UPDATED.
    Update { ts: Timestamp, metadata: Metadata, key: Vec<u8>, op: UpdateOp },
    /// One page of a partition's live keys, in key-hash order (reply KEYS).
    ListKeys(ListKeys),
    /// How many live keys some partitions hold (reply KEY_COUNT).
    CountKeys(CountKeys),
}

impl Request {
    /// The frame kind byte of this request.
    pub fn kind(&self) -> u8 {
        match self {
            Request::Hello { .. } => KIND_HELLO,
            Request::Get { .. } => KIND_GET,
            Request::GetLocate { .. } => KIND_GET_LOCATE,
            Request::Prepare { .. } => KIND_PREPARE,
            Request::Commit { .. } => KIND_COMMIT,
            Request::PrepareCommit { .. } => KIND_PREPARE_COMMIT,
            Request::Put { .. } => KIND_PUT,
            Request::LockRead { .. } => KIND_LOCK_READ,
            Request::LockWrite { .. } => KIND_LOCK_WRITE,
            Request::CommitLocked { .. } => KIND_COMMIT_LOCKED,
            Request::Release { .. } => KIND_RELEASE,
            Request::Status { .. } => KIND_STATUS,
            Request::Update { .. } => KIND_UPDATE,
            Request::ListKeys(_) => KIND_LIST_KEYS,
            Request::CountKeys(_) => KIND_COUNT_KEYS,
        }
    }

    /// The timestamp this request writes at or commits: the timestamps a server checks against
    /// its clock (PREPARE, PREPARE_COMMIT, PUT, LOCK_WRITE, COMMIT, COMMIT_LOCKED, UPDATE). None for reads, locks for
    /// reading, releases and status asks, which store nothing at their timestamp.
    pub fn written_timestamp(&self) -> Option<Timestamp> {
        match self {
            Request::Prepare { ts, .. }
            | Request::PrepareCommit { ts, .. }
            | Request::Put { ts, .. }
            | Request::LockWrite { ts, .. }
            | Request::Commit { ts }
            | Request::CommitLocked { ts }
            | Request::Update { ts, .. } => Some(*ts),
            _ => None,
        }
    }

    /// Whether serving this request reads the server's wall clock: a written timestamp is
    /// checked against it, and the key space judges each key's liveness at one instant (for
    /// expiry).
    pub fn reads_wall_clock(&self) -> bool {
        self.written_timestamp().is_some()
            || matches!(self, Request::ListKeys(_) | Request::CountKeys(_) | Request::Update { .. })
    }

    /// Appends this request as one frame to `out`.
    pub fn encode_frame(&self, request_id: u64, out: &mut Vec<u8>) {
        append_frame(out, self.kind(), request_id, |body| self.encode_body(body));
    }

    /// Appends the body of this request (no frame header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        let mut encoder = Encoder::new(out);
        match self {
            Request::Hello { client_ids_wanted, cluster } => {
                encoder.u16(*client_ids_wanted);
                ClusterView::encode(*cluster, &mut encoder);
            }
            Request::Get { items } | Request::GetLocate { items } => {
                assert!(items.len() <= TXN_KEYS_MAX);
                encoder.count(items.len());
                for item in items {
                    encoder.key(&item.key);
                    encode_selector(&mut encoder, &item.selector);
                }
            }
            Request::Prepare { ts, metadata, write_set, writes }
            | Request::PrepareCommit { ts, metadata, write_set, writes } => {
                encoder.u64(*ts);
                metadata.as_ref().encode(&mut encoder);
                encode_keys(&mut encoder, write_set);
                encode_writes(&mut encoder, writes);
            }
            Request::Commit { ts } | Request::CommitLocked { ts } | Request::Release { ts } => encoder.u64(*ts),
            Request::Put { ts, writes } | Request::LockWrite { ts, writes } => {
                encoder.u64(*ts);
                encode_writes(&mut encoder, writes);
            }
            Request::LockRead { ts, keys } | Request::Status { ts, keys } => {
                encoder.u64(*ts);
                encode_keys(&mut encoder, keys);
            }
            Request::Update { ts, metadata, key, op } => {
                encoder.u64(*ts);
                metadata.as_ref().encode(&mut encoder);
                encoder.key(key);
                op.encode(&mut encoder);
            }
            Request::ListKeys(list) => list.encode(&mut encoder),
            Request::CountKeys(count) => count.encode(&mut encoder),
        }
    }

    /// Decodes a request body of the given kind; every byte must be consumed.
    pub fn decode(kind: u8, body: &[u8]) -> Result<Request, WireError> {
        let mut decoder = Decoder::new(body);
        let request = match kind {
            KIND_HELLO => {
                Request::Hello { client_ids_wanted: decoder.u16()?, cluster: ClusterView::decode(&mut decoder)? }
            }
            KIND_GET | KIND_GET_LOCATE => {
                let count = decoder.count("get items", TXN_KEYS_MAX, 3)?;
                let items = (0..count)
                    .map(|_| Ok(GetItem { key: decoder.key()?, selector: decode_selector(&mut decoder)? }))
                    .collect::<Result<_, WireError>>()?;
                if kind == KIND_GET {
                    Request::Get { items }
                } else {
                    Request::GetLocate { items }
                }
            }
            KIND_PREPARE | KIND_PREPARE_COMMIT => {
                let ts = decoder.u64()?;
                let metadata = Metadata::decode(&mut decoder)?;
                let write_set = decoder.keys("write set")?;
                let writes = decode_writes(&mut decoder)?;
                if kind == KIND_PREPARE {
                    Request::Prepare { ts, metadata, write_set, writes }
                } else {
                    Request::PrepareCommit { ts, metadata, write_set, writes }
                }
            }
            KIND_COMMIT => Request::Commit { ts: decoder.u64()? },
            KIND_PUT => {
                let ts = decoder.u64()?;
                Request::Put { ts, writes: decode_writes(&mut decoder)? }
            }
            KIND_LOCK_READ => {
                let ts = decoder.u64()?;
                Request::LockRead { ts, keys: decoder.keys("keys")? }
            }
            KIND_LOCK_WRITE => {
                let ts = decoder.u64()?;
                Request::LockWrite { ts, writes: decode_writes(&mut decoder)? }
            }
            KIND_COMMIT_LOCKED => Request::CommitLocked { ts: decoder.u64()? },
            KIND_RELEASE => Request::Release { ts: decoder.u64()? },
            KIND_STATUS => {
                let ts = decoder.u64()?;
                Request::Status { ts, keys: decoder.keys("keys")? }
            }
            KIND_UPDATE => {
                let ts = decoder.u64()?;
                let metadata = Metadata::decode(&mut decoder)?;
                let key = decoder.key()?;
                Request::Update { ts, metadata, key, op: UpdateOp::decode(&mut decoder)? }
            }
            KIND_LIST_KEYS => Request::ListKeys(ListKeys::decode(&mut decoder)?),
            KIND_COUNT_KEYS => Request::CountKeys(CountKeys::decode(&mut decoder)?),
            other => return Err(WireError::UnknownKind(other)),
        };
        decoder.finish()?;
        Ok(request)
    }
}

fn encode_selector(encoder: &mut Encoder<'_>, selector: &Selector) {
    match selector {
        Selector::Latest => encoder.u8(SELECTOR_LATEST),
        Selector::LatestTimestamp => encoder.u8(SELECTOR_LATEST_TS),
        Selector::Exact(ts) => {
            encoder.u8(SELECTOR_EXACT);
            encoder.u64(*ts);
        }
        Selector::HighestOf(candidates) => {
            assert!(candidates.len() <= TXN_KEYS_MAX);
            encoder.u8(SELECTOR_HIGHEST_OF);
            encoder.count(candidates.len());
            for ts in candidates {
                encoder.u64(*ts);
            }
        }
    }
}

fn decode_selector(decoder: &mut Decoder<'_>) -> Result<Selector, WireError> {
    match decoder.u8()? {
        SELECTOR_LATEST => Ok(Selector::Latest),
        SELECTOR_LATEST_TS => Ok(Selector::LatestTimestamp),
        SELECTOR_EXACT => Ok(Selector::Exact(decoder.u64()?)),
        SELECTOR_HIGHEST_OF => {
            let count = decoder.count("candidate timestamps", TXN_KEYS_MAX, 8)?;
            Ok(Selector::HighestOf((0..count).map(|_| decoder.u64()).collect::<Result<_, _>>()?))
        }
        _ => Err(WireError::Invalid("unknown selector tag")),
    }
}

fn encode_keys(encoder: &mut Encoder<'_>, keys: &[Vec<u8>]) {
    assert!(keys.len() <= TXN_KEYS_MAX);
    encoder.count(keys.len());
    for key in keys {
        encoder.key(key);
    }
}

/// The writes, then their expiries section (if one expires): the last fields of every message
/// that carries writes.
fn encode_writes(encoder: &mut Encoder<'_>, writes: &[Write]) {
    assert!(writes.len() <= TXN_KEYS_MAX);
    encoder.count(writes.len());
    for write in writes {
        encoder.key(&write.key);
        encoder.bytes(&write.value);
    }
    encode_expiries(encoder, writes.iter().map(|write| write.expires_at_ms));
}

fn decode_writes(decoder: &mut Decoder<'_>) -> Result<Vec<Write>, WireError> {
    let count = decoder.count("writes", TXN_KEYS_MAX, 6)?;
    let mut writes =
        (0..count).map(|_| Ok(Write::new(decoder.key()?, decoder.value()?))).collect::<Result<Vec<_>, WireError>>()?;
    if let Some(expiries) = decode_expiries(decoder, count, false)? {
        for (write, expires_at_ms) in writes.iter_mut().zip(expiries) {
            write.expires_at_ms = expires_at_ms;
        }
    }
    Ok(writes)
}
