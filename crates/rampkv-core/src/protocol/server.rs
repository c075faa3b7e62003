//! The server side of the protocol: one request in, one reply frame out, over the [`Store`].
//!
//! It owns no socket and no clock: the event loop passes the time (for garbage collection)
//! and the output buffer. A request is validated completely before it changes anything, so a
//! refused request leaves the store as it was.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::locks::{LockDecision, LockMode, LockTable};
use crate::limits::{CLIENT_IDS_MAX, KEY_BYTES_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use crate::storage::{Key, Store, StoreError, StoredMetadata, Version};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::response::{append_versions_frame, append_versions_located_frame};
use crate::wire::{
    ErrorCode, FrameHeader, GetItem, Metadata, MetadataRef, Request, Response, Selector, VersionItem, WireError, Write,
    WriteSet,
};

/// Where a server publishes committed versions for one-sided GET\* reads (item slots). The
/// server core calls it after the store changed; what it writes to, and how, is the edge's
/// business (`rampkv_net::item_slots` over the fabric).
pub trait ItemPublisher: Send + Sync + std::fmt::Debug {
    /// Publishes the latest committed version of each of `keys` (after a COMMIT, PUT or
    /// COMMIT_LOCKED that advanced them).
    fn publish_committed(&self, store: &Store, keys: &[Key]);
    /// A PREPARE of version `ts` of `keys`: marks the slots of older versions.
    fn note_prepared(&self, ts: Timestamp, keys: &[Key]);
    /// The slot of `key` (publishing its latest committed version first if needed), for
    /// GET_LOCATE replies.
    fn locate(&self, store: &Store, key: &[u8]) -> Option<u32>;
    /// The publisher as `Any`, for the edge that attached it to find its own type again.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A reply to a request that arrived earlier, possibly on another connection (an S2PL lock
/// granted or aborted when another transaction released its locks).
#[derive(Debug)]
pub struct DeferredReply {
    pub connection: u64,
    pub frame: Vec<u8>,
}

/// The request-handling state of one server.
#[derive(Debug)]
pub struct ServerCore {
    store: Store,
    /// S2PL locks. One poller serves a server, so the mutex is uncontended; it makes the core
    /// `Sync` for statistics readers.
    locks: Mutex<LockTable>,
    /// Next client id to hand out (ids are 16 bits, never 0; they wrap after 65,535).
    next_client_id: AtomicU32,
    /// GET\*: the item slots this server publishes committed versions in, once attached.
    item_slots: OnceLock<Arc<dyn ItemPublisher>>,
    /// GET and GET_LOCATE requests served (statistics: how many reads GET\* saved).
    gets_served: AtomicU64,
}

impl ServerCore {
    /// A server whose store keeps superseded versions for `gc_grace_ms`.
    pub fn new(gc_grace_ms: u64) -> Self {
        Self {
            store: Store::new(gc_grace_ms),
            locks: Mutex::new(LockTable::default()),
            next_client_id: AtomicU32::new(1),
            item_slots: OnceLock::new(),
            gets_served: AtomicU64::new(0),
        }
    }

    /// GET\*: from now on, publish committed versions in `slots`. Returns the slots already
    /// attached if there are (one item region per server).
    pub fn attach_item_slots(&self, slots: Arc<dyn ItemPublisher>) -> Result<(), Arc<dyn ItemPublisher>> {
        self.item_slots.set(slots)
    }

    /// GET and GET_LOCATE requests this server has served.
    pub fn gets_served(&self) -> u64 {
        self.gets_served.load(Ordering::Relaxed)
    }

    /// Commits transaction `ts` in the store (as a COMMIT request does) and publishes the keys
    /// it advanced in the item slots, if attached. Recovery uses it, so that a transaction it
    /// commits does not leave a slot behind `lastCommit`.
    pub fn commit(&self, ts: Timestamp) -> usize {
        let keys = self.store.commit_keys(ts);
        if let Some(slots) = self.item_slots() {
            slots.publish_committed(&self.store, &keys);
        }
        keys.len()
    }

    /// The item slots, if attached.
    pub fn item_slots(&self) -> Option<&Arc<dyn ItemPublisher>> {
        self.item_slots.get()
    }

    /// The store, for statistics and tests.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Decodes a request frame body and appends the reply frame to `out`. A body that does
    /// not decode gets a `BadRequest` reply (the framing is intact, so the connection goes on).
    pub fn handle_frame(
        &self,
        connection: u64,
        kind: u8,
        request_id: u64,
        body: &[u8],
        now_ms: u64,
        out: &mut Vec<u8>,
        deferred: &mut Vec<DeferredReply>,
    ) {
        match Request::decode(kind, body) {
            Ok(request) => self.handle_from(connection, request, request_id, now_ms, out, deferred),
            Err(error) => reply_decode_error(&error, request_id, out),
        }
    }

    /// Serves one request from a client on a single connection and appends the reply (and any
    /// reply it releases) to `out`. For tests and tools that do not multiplex connections.
    pub fn handle(&self, request: Request, request_id: u64, now_ms: u64, out: &mut Vec<u8>) {
        let mut deferred = Vec::new();
        self.handle_from(0, request, request_id, now_ms, out, &mut deferred);
        for reply in deferred {
            out.extend_from_slice(&reply.frame);
        }
    }

    /// Serves one request that came over `connection`. Its reply is appended to `out`, unless
    /// it must wait for locks; replies to other waiting requests that it unblocks go to
    /// `deferred`.
    pub fn handle_from(
        &self,
        connection: u64,
        request: Request,
        request_id: u64,
        now_ms: u64,
        out: &mut Vec<u8>,
        deferred: &mut Vec<DeferredReply>,
    ) {
        match request {
            Request::LockRead { ts, keys } => {
                let keys = keys.into_iter().map(Vec::into_boxed_slice).collect();
                let decisions =
                    self.locks.lock().request(ts, LockMode::Shared, connection, request_id, keys, Vec::new(), now_ms);
                self.reply_to_decisions(decisions, deferred);
            }
            Request::LockWrite { ts, writes } => {
                let writes = stored_writes(writes);
                if let Err(error) = validate_writes(&writes) {
                    return Response::bad_request(error).encode_frame(request_id, out);
                }
                let keys = writes.iter().map(|(key, _)| key.clone()).collect();
                let decisions =
                    self.locks.lock().request(ts, LockMode::Exclusive, connection, request_id, keys, writes, now_ms);
                self.reply_to_decisions(decisions, deferred);
            }
            Request::CommitLocked { ts } => {
                let (staged, decisions) = self.locks.lock().finish(ts);
                let keys = self.item_slots().map(|_| staged_keys(&staged));
                let applied = if staged.is_empty() { Ok(()) } else { self.store.put(ts, staged, now_ms) };
                if let (Ok(()), Some(slots), Some(keys)) = (&applied, self.item_slots(), keys) {
                    slots.publish_committed(&self.store, &keys);
                }
                reply_ack_or_error(applied, request_id, out);
                self.reply_to_decisions(decisions, deferred);
            }
            Request::Release { ts } => {
                let (_, decisions) = self.locks.lock().finish(ts);
                Response::Ack.encode_frame(request_id, out);
                self.reply_to_decisions(decisions, deferred);
            }
            other => self.handle_plain(other, request_id, now_ms, out),
        }
    }

    /// Aborts lock waits past their deadline; replies go to `deferred`.
    pub fn expire_lock_waits(&self, now_ms: u64, deferred: &mut Vec<DeferredReply>) {
        let decisions = self.locks.lock().expire(now_ms);
        self.reply_to_decisions(decisions, deferred);
    }

    /// When the next lock wait expires (the event loop wakes up then), if any waits.
    pub fn next_lock_deadline_ms(&self) -> Option<u64> {
        self.locks.lock().next_deadline_ms()
    }

    /// A connection closed: the transactions it was running release their locks.
    pub fn connection_closed(&self, connection: u64, deferred: &mut Vec<DeferredReply>) {
        let decisions = self.locks.lock().release_connection(connection);
        self.reply_to_decisions(decisions, deferred);
    }

    /// Serves granted lock requests (reads answered, writes staged) and aborted ones.
    fn reply_to_decisions(&self, decisions: Vec<LockDecision>, deferred: &mut Vec<DeferredReply>) {
        for decision in decisions {
            let mut frame = Vec::new();
            let connection = match decision {
                LockDecision::Granted(request) => {
                    match request.mode {
                        LockMode::Shared => {
                            let answers: Vec<Answer> = request
                                .keys
                                .iter()
                                .map(|key| self.store.get_latest(key).map_or(Answer::Initial, Answer::Version))
                                .collect();
                            encode_answers(&answers, request.request_id, &mut frame);
                        }
                        LockMode::Exclusive => {
                            self.locks.lock().stage(request.ts, request.writes);
                            Response::Ack.encode_frame(request.request_id, &mut frame);
                        }
                    }
                    request.connection
                }
                LockDecision::Aborted(request) => {
                    let message = format!("transaction {} aborted (wait-die or lock timeout); retry", request.ts);
                    Response::Error { code: ErrorCode::Aborted, message }.encode_frame(request.request_id, &mut frame);
                    request.connection
                }
            };
            deferred.push(DeferredReply { connection, frame });
        }
    }

    /// Requests that never wait; each writes its one reply.
    fn handle_plain(&self, request: Request, request_id: u64, now_ms: u64, out: &mut Vec<u8>) {
        let result = match request {
            Request::Hello { client_ids_wanted } => {
                return self.hello(client_ids_wanted).encode_frame(request_id, out);
            }
            Request::Get { items } => return self.get(&items, request_id, false, out),
            Request::GetLocate { items } => return self.get(&items, request_id, true, out),
            Request::Prepare { ts, metadata, write_set, writes } => {
                let metadata = stored_metadata(metadata);
                let write_set: Arc<[Key]> = match (&metadata, write_set.is_empty()) {
                    (StoredMetadata::WriteSet(keys), true) => Arc::clone(keys),
                    _ => write_set.into_iter().map(Vec::into_boxed_slice).collect(),
                };
                let writes = stored_writes(writes);
                let keys = self.item_slots().map(|_| staged_keys(&writes));
                let prepared = self.store.prepare(ts, metadata, write_set, writes, now_ms);
                if let (Ok(()), Some(slots), Some(keys)) = (&prepared, self.item_slots(), keys) {
                    slots.note_prepared(ts, &keys);
                }
                prepared
            }
            Request::Status { ts, keys } => {
                let keys: Vec<Key> = keys.into_iter().map(Vec::into_boxed_slice).collect();
                let state = self.store.status(ts, &keys, now_ms);
                return Response::Status { state }.encode_frame(request_id, out);
            }
            Request::Commit { ts } => {
                self.commit(ts);
                Ok(())
            }
            Request::Put { ts, writes } => {
                let writes = stored_writes(writes);
                let keys = self.item_slots().map(|_| staged_keys(&writes));
                let put = self.store.put(ts, writes, now_ms);
                if let (Ok(()), Some(slots), Some(keys)) = (&put, self.item_slots(), keys) {
                    slots.publish_committed(&self.store, &keys);
                }
                put
            }
            other => {
                let message = format!("request kind {:#04x} is not served here", other.kind());
                Err(StoreError::InvalidPrepare(message))
            }
        };
        reply_ack_or_error(result, request_id, out);
    }

    fn hello(&self, wanted: u16) -> Response {
        let wanted = u32::from(wanted.max(1));
        let first = self.next_client_id.fetch_add(wanted, Ordering::Relaxed);
        // Ids wrap within 1..=CLIENT_IDS_MAX; a block never straddles the wrap.
        let span = CLIENT_IDS_MAX as u32;
        let mut first = (first - 1) % span + 1;
        if first + wanted - 1 > span {
            first = 1;
        }
        Response::Hello { client_id_first: first as u16, client_ids_granted: wanted as u16 }
    }

    /// Serves a GET, or with `locate` a GET_LOCATE (whose reply also names each key's slot).
    fn get(&self, items: &[GetItem], request_id: u64, locate: bool, out: &mut Vec<u8>) {
        let answers = match self.answers(items) {
            Ok(answers) => answers,
            Err(error) => return error.encode_frame(request_id, out),
        };
        match (locate, self.item_slots()) {
            (false, _) => encode_answers(&answers, request_id, out),
            (true, slots) => {
                let slots = items.iter().map(|item| slots.and_then(|slots| slots.locate(&self.store, &item.key)));
                let slots: Vec<Option<u32>> = slots.collect();
                append_versions_located_frame(out, request_id, answer_entries(&answers), slots.into_iter());
            }
        }
    }

    /// What a GET of `items` finds, or the error reply that ends it.
    fn answers(&self, items: &[GetItem]) -> Result<Vec<Answer>, Response> {
        self.gets_served.fetch_add(1, Ordering::Relaxed);
        let mut answers: Vec<Answer> = Vec::with_capacity(items.len());
        for item in items {
            let answer = match &item.selector {
                Selector::Latest => Ok(self.store.get_latest(&item.key).map_or(Answer::Initial, Answer::Version)),
                Selector::LatestTimestamp => Ok(Answer::TimestampOnly(self.store.last_commit(&item.key))),
                Selector::Exact(ts) => self.store.get_at(&item.key, *ts).map(Answer::Version),
                Selector::HighestOf(candidates) => self
                    .store
                    .get_highest_of(&item.key, candidates)
                    .map(|found| found.map_or(Answer::Initial, Answer::Version)),
            };
            match answer {
                Ok(answer) => answers.push(answer),
                Err(StoreError::VersionGone { ts }) => {
                    let message = format!("version {ts} is gone; restart the read");
                    return Err(Response::Error { code: ErrorCode::VersionGone, message });
                }
                Err(other) => return Err(Response::Error { code: ErrorCode::Internal, message: other.to_string() }),
            }
        }
        Ok(answers)
    }

    /// Serves `request` for a client in this process and returns the reply as the client would
    /// decode it from the frame [`ServerCore::handle_from`] writes, without the frame: a GET's
    /// versions are copied once, into the reply, instead of into a frame and out of it. Other
    /// requests go through the frame (their replies are small); `frame` is scratch space for
    /// them. Requests that may wait for locks must not come here: their replies are deferred.
    pub fn serve(
        &self,
        connection: u64,
        request: Request,
        request_id: u64,
        now_ms: u64,
        frame: &mut Vec<u8>,
        deferred: &mut Vec<DeferredReply>,
    ) -> Result<Option<Response>, WireError> {
        if let Request::Get { items } = &request {
            let response = match self.answers(items) {
                Ok(answers) => match answers.iter().map(owned_item).collect() {
                    Ok(items) => Response::Versions { items },
                    Err(error) => Response::bad_request(format!("a stored write set does not encode: {error}")),
                },
                Err(error) => error,
            };
            return Ok(Some(response));
        }
        frame.clear();
        self.handle_from(connection, request, request_id, now_ms, frame, deferred);
        match FrameHeader::split(frame)? {
            Some((header, body)) => Response::decode(header.kind, body).map(Some),
            None => Ok(None),
        }
    }
}

/// The keys of `writes` (copied before the writes move into the store).
fn staged_keys(writes: &[(Key, Box<[u8]>)]) -> Vec<Key> {
    writes.iter().map(|(key, _)| key.clone()).collect()
}

/// An answer as a client decodes it from a reply frame. A stored write set was checked against
/// the limits when it was prepared, so it always encodes; were it not, the error says why
/// (the frame encoder would refuse it as well).
fn owned_item(answer: &Answer) -> Result<VersionItem, WireError> {
    Ok(match answer {
        Answer::Version(version) => VersionItem {
            ts: version.ts,
            value: version.value.to_vec(),
            metadata: match &version.metadata {
                StoredMetadata::None => Metadata::None,
                StoredMetadata::WriteSet(keys) => Metadata::WriteSet(WriteSet::from_keys(keys)?),
                StoredMetadata::Bloom(bits) => Metadata::Bloom(bits.to_vec()),
            },
        },
        Answer::TimestampOnly(ts) => VersionItem { ts: *ts, value: Vec::new(), metadata: Metadata::None },
        Answer::Initial => VersionItem { ts: TIMESTAMP_INITIAL, value: Vec::new(), metadata: Metadata::None },
    })
}

fn answer_entries(answers: &[Answer]) -> impl ExactSizeIterator<Item = (Timestamp, &[u8], MetadataRef<'_, Key>)> {
    answers.iter().map(|answer| match answer {
        Answer::Version(version) => (version.ts, &*version.value, version.metadata.as_wire()),
        Answer::TimestampOnly(ts) => (*ts, &[][..], MetadataRef::None),
        Answer::Initial => (TIMESTAMP_INITIAL, &[][..], MetadataRef::None),
    })
}

fn encode_answers(answers: &[Answer], request_id: u64, out: &mut Vec<u8>) {
    append_versions_frame(out, request_id, answer_entries(answers));
}

fn reply_ack_or_error(result: Result<(), StoreError>, request_id: u64, out: &mut Vec<u8>) {
    match result {
        Ok(()) => Response::Ack.encode_frame(request_id, out),
        Err(error) => Response::bad_request(error.to_string()).encode_frame(request_id, out),
    }
}

/// The limits a write must meet before it touches the lock table or the store.
fn validate_writes(writes: &[(Key, Box<[u8]>)]) -> Result<(), String> {
    if writes.is_empty() || writes.len() > TXN_KEYS_MAX {
        return Err(format!("{} writes (need 1..={TXN_KEYS_MAX})", writes.len()));
    }
    match writes.iter().find(|(key, value)| key.len() > KEY_BYTES_MAX || value.len() > VALUE_BYTES_MAX) {
        Some((key, value)) => Err(format!("a key of {} or value of {} bytes over the limits", key.len(), value.len())),
        None => Ok(()),
    }
}

/// What a GET item is answered with.
enum Answer {
    Version(Arc<Version>),
    TimestampOnly(Timestamp),
    /// The initial value, or no candidate stored.
    Initial,
}

fn stored_metadata(metadata: Metadata) -> StoredMetadata {
    match metadata {
        Metadata::None => StoredMetadata::None,
        Metadata::WriteSet(write_set) => StoredMetadata::WriteSet(write_set.iter().map(Key::from).collect()),
        Metadata::Bloom(bits) => StoredMetadata::Bloom(bits.into()),
    }
}

fn stored_writes(writes: Vec<Write>) -> Vec<(Key, Box<[u8]>)> {
    writes.into_iter().map(|write| (write.key.into_boxed_slice(), write.value.into_boxed_slice())).collect()
}

fn reply_decode_error(error: &WireError, request_id: u64, out: &mut Vec<u8>) {
    Response::bad_request(format!("malformed request: {error}")).encode_frame(request_id, out);
}
