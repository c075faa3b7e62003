//! The server side of the protocol: one request in, one reply frame out, over the [`Store`].
//!
//! It owns no socket and no clock: the event loop passes the time (for garbage collection)
//! and the output buffer. A request is validated completely before it changes anything, so a
//! refused request leaves the store as it was.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::limits::CLIENT_IDS_MAX;
use crate::storage::{Key, Store, StoreError, StoredMetadata, Version};
use crate::types::{Timestamp, TIMESTAMP_INITIAL};
use crate::wire::response::append_versions_frame;
use crate::wire::{ErrorCode, GetItem, Metadata, MetadataRef, Request, Response, Selector, WireError, Write};

/// The request-handling state of one server.
#[derive(Debug)]
pub struct ServerCore {
    store: Store,
    /// Next client id to hand out (ids are 16 bits, never 0; they wrap after 65,535).
    next_client_id: AtomicU32,
}

impl ServerCore {
    /// A server whose store keeps superseded versions for `gc_grace_ms`.
    pub fn new(gc_grace_ms: u64) -> Self {
        Self { store: Store::new(gc_grace_ms), next_client_id: AtomicU32::new(1) }
    }

    /// The store, for statistics and tests.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Decodes a request frame body and appends the reply frame to `out`. A body that does
    /// not decode gets a `BadRequest` reply (the framing is intact, so the connection goes on).
    pub fn handle_frame(&self, kind: u8, request_id: u64, body: &[u8], now_ms: u64, out: &mut Vec<u8>) {
        match Request::decode(kind, body) {
            Ok(request) => self.handle(request, request_id, now_ms, out),
            Err(error) => reply_decode_error(&error, request_id, out),
        }
    }

    /// Serves one request and appends the reply frame to `out`.
    pub fn handle(&self, request: Request, request_id: u64, now_ms: u64, out: &mut Vec<u8>) {
        let result = match request {
            Request::Hello { client_ids_wanted } => {
                self.hello(client_ids_wanted).encode_frame(request_id, out);
                return;
            }
            Request::Get { items } => return self.get(&items, request_id, out),
            Request::Prepare { ts, metadata, writes } => {
                self.store.prepare(ts, stored_metadata(metadata), stored_writes(writes), now_ms)
            }
            Request::Commit { ts } => {
                self.store.commit(ts);
                Ok(())
            }
            Request::Put { ts, writes } => self.store.put(ts, stored_writes(writes), now_ms),
        };
        match result {
            Ok(()) => Response::Ack.encode_frame(request_id, out),
            Err(error) => Response::bad_request(error.to_string()).encode_frame(request_id, out),
        }
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

    fn get(&self, items: &[GetItem], request_id: u64, out: &mut Vec<u8>) {
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
                    Response::Error { code: ErrorCode::VersionGone, message }.encode_frame(request_id, out);
                    return;
                }
                Err(other) => {
                    Response::Error { code: ErrorCode::Internal, message: other.to_string() }
                        .encode_frame(request_id, out);
                    return;
                }
            }
        }
        let entries = answers.iter().map(|answer| match answer {
            Answer::Version(version) => (version.ts, &*version.value, version.metadata.as_wire()),
            Answer::TimestampOnly(ts) => (*ts, &[][..], MetadataRef::None),
            Answer::Initial => (TIMESTAMP_INITIAL, &[][..], MetadataRef::None),
        });
        append_versions_frame(out, request_id, entries);
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
        Metadata::WriteSet(keys) => StoredMetadata::WriteSet(keys.into_iter().map(Vec::into_boxed_slice).collect()),
        Metadata::Bloom(bits) => StoredMetadata::Bloom(bits.into()),
    }
}

fn stored_writes(writes: Vec<Write>) -> Vec<(Key, Box<[u8]>)> {
    writes.into_iter().map(|write| (write.key.into_boxed_slice(), write.value.into_boxed_slice())).collect()
}

fn reply_decode_error(error: &WireError, request_id: u64, out: &mut Vec<u8>) {
    Response::bad_request(format!("malformed request: {error}")).encode_frame(request_id, out);
}
