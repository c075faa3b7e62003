//! The server side of the protocol: one request in, one reply frame out, over the [`Store`].
//!
//! It owns no socket and no clock: the event loop passes the time (for garbage collection)
//! and the output buffer. A request is validated completely before it changes anything, so a
//! refused request leaves the store as it was.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::limits::CLIENT_IDS_MAX;
use crate::storage::{Key, Store, StoreError, Version};
use crate::types::Timestamp;
use crate::wire::response::append_versions_frame;
use crate::wire::{ErrorCode, GetItem, Request, Response, WireError};

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
        match request {
            Request::Hello { client_ids_wanted } => self.hello(client_ids_wanted).encode_frame(request_id, out),
            Request::Get { items } => self.get(&items, request_id, out),
            Request::Prepare { ts, write_set, writes } => {
                let write_set: Arc<[Key]> = write_set.into_iter().map(Vec::into_boxed_slice).collect();
                let writes = writes
                    .into_iter()
                    .map(|write| (write.key.into_boxed_slice(), write.value.into_boxed_slice()))
                    .collect();
                match self.store.prepare(ts, write_set, writes, now_ms) {
                    Ok(()) => Response::Ack.encode_frame(request_id, out),
                    Err(error) => Response::bad_request(error.to_string()).encode_frame(request_id, out),
                }
            }
            Request::Commit { ts } => {
                self.store.commit(ts);
                Response::Ack.encode_frame(request_id, out);
            }
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
        let mut versions: Vec<Option<Arc<Version>>> = Vec::with_capacity(items.len());
        for item in items {
            if item.at == 0 {
                versions.push(self.store.get_latest(&item.key));
                continue;
            }
            match self.store.get_at(&item.key, item.at) {
                Ok(version) => versions.push(Some(version)),
                Err(StoreError::VersionGone { ts }) => {
                    let message = format!("version {ts} is gone; restart the read");
                    Response::Error { code: ErrorCode::VersionGone, message }.encode_frame(request_id, out);
                    return;
                }
                Err(other) => {
                    let message = other.to_string();
                    Response::Error { code: ErrorCode::Internal, message }.encode_frame(request_id, out);
                    return;
                }
            }
        }
        const NO_KEYS: &[Key] = &[];
        let entries = versions.iter().map(|version| match version {
            Some(version) => (version.ts, &*version.value, &*version.write_set),
            None => (0 as Timestamp, &[][..], NO_KEYS),
        });
        append_versions_frame(out, request_id, entries);
    }
}

fn reply_decode_error(error: &WireError, request_id: u64, out: &mut Vec<u8>) {
    Response::bad_request(format!("malformed request: {error}")).encode_frame(request_id, out);
}
