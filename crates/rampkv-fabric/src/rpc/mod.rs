//! Remote-fetch RPC (RF-RPC, as in the Jakiro key-value store), over any [`OneSided`] fabric.
//!
//! A client writes its request into the server's memory (a message ring, `ring.rs`); the
//! server leaves its reply in a **reply slot** in its *own* registered memory; the client
//! fetches it with one-sided reads: the first `fetch_bytes` (F) at once, the rest only if the
//! reply is longer. On RDMA this turns the server's out-bound writes into in-bound reads, which
//! NICs serve far more cheaply; the shared-memory fabric has no such asymmetry (see
//! `docs/fabric.md` and `docs/performance.md` for what this machine can and cannot show).
//!
//! # Layout
//! - [`reply`]: the reply slot format, its writer and the validating fetch.
//! - [`message`]: the request message (head, per-entry sizes, tail) and entry lists.
//! - [`endpoint`]: [`RpcClient`] (`client_send` / `client_recv` / `call`) with the hybrid
//!   fetch/push switch, and [`RpcServerEndpoint`] (`server_recv` / `server_send`).
//! - [`batch`]: [`Batcher`], batching many small requests per message, and the automatic
//!   batch-size controller.
//! - this file, below the rooms: [`RpcError`], [`RpcConfig`] (with [`ReplyMode`]) and
//!   [`RpcLayout`], which the rooms use; it names none of them but to re-export.
//!
//! # Hybrid mode
//! Every call starts in the connection's current mode. In **fetch** mode the client fetches
//! until the reply is there, pacing failed fetches `fetch_interval` apart. A call that needed
//! `fetch_retries` (R) or more failed fetches is *slow*; after `slow_calls_to_push` consecutive
//! slow calls the connection switches to **push** mode: requests carry the PUSH bit and the
//! server writes the reply into a ring in the client's memory (the write-poll path), where the
//! client waits with a bounded spin, then its doorbell. Every reply reports the server's
//! processing time; a pushed reply reporting at most `push_back_below` switches the connection
//! back to fetch mode. The mode travels in each request (the PUSH bit) rather than in a
//! separate flag word as in the paper, so client and server can never disagree about a call.
//!
//! # Fault model
//! Everything read from the peer's memory is checked: a request or reply no correct peer writes
//! is `Corrupt` (close the connection), never a panic or an access outside a region. Every wait
//! ends at `call_timeout`.

pub mod batch;
pub mod endpoint;
pub mod message;
pub mod reply;

pub use batch::{AutoBatchConfig, BatchConfig, BatchStats, Batcher, Completion, FlushReason, SizeController};
pub use endpoint::{Reply, RpcClient, RpcServerEndpoint, RpcStats};
pub use message::{Entries, EntryList, RequestMessage};

use crate::fabric::FabricError;
use crate::limits::{
    RPC_CALL_TIMEOUT_MS_DEFAULT, RPC_FETCH_BYTES_DEFAULT, RPC_FETCH_INTERVAL_NS_DEFAULT, RPC_FETCH_RETRIES_DEFAULT,
    RPC_PUSH_BACK_BELOW_NS_DEFAULT, RPC_SLOW_CALLS_TO_PUSH_DEFAULT,
};
use crate::ring::{frame_bytes, RingAddresses, RingError, RingLayout, SendError, DOORBELL_BYTES};
use crate::words::padded_bytes;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Errors of the RPC layer.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The peer's memory holds something no correct peer writes: close the connection.
    #[error("corrupt rpc data: {reason}")]
    Corrupt {
        /// What is wrong.
        reason: &'static str,
    },
    /// A request, batch or reply above its bound. Nothing was sent.
    #[error("{bytes} bytes exceed the maximum {bytes_max}")]
    TooLarge {
        /// Size asked for.
        bytes: usize,
        /// The bound.
        bytes_max: usize,
    },
    /// The API was used out of order (a second call while one is outstanding, a reply without
    /// a request, a reply with the wrong number of entries).
    #[error("rpc misuse: {reason}")]
    Protocol {
        /// Which rule.
        reason: &'static str,
    },
    /// Addresses that break a layout rule.
    #[error("invalid rpc layout: {reason}")]
    InvalidLayout {
        /// Which rule.
        reason: &'static str,
    },
    /// No reply within the call timeout.
    #[error("rpc call timed out")]
    Timeout,
    /// The request or push ring failed.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Sending on a ring failed.
    #[error(transparent)]
    Send(#[from] SendError),
    /// A fabric operation failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// How the reply of a call comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplyMode {
    /// The server leaves it in its reply slot; the client fetches it (remote fetch).
    Fetch,
    /// The server writes it into the client's push ring (server-reply, write-poll).
    Push,
}

/// Tunables of one connection. Defaults from `limits.rs`, as the paper chose them where it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcConfig {
    /// F: bytes of the first fetch (header included).
    pub fetch_bytes: usize,
    /// R: failed fetches that make a call slow.
    pub fetch_retries: u32,
    /// Consecutive slow calls that switch the connection to push mode.
    pub slow_calls_to_push: u32,
    /// Pause between failed fetches (busy, while at most R fetches failed).
    pub fetch_interval: Duration,
    /// A pushed reply whose server time is at most this switches back to fetch mode.
    pub push_back_below: Duration,
    /// Whether the connection switches modes at all (false: it stays in `initial_mode`).
    pub hybrid: bool,
    /// The mode of the first call.
    pub initial_mode: ReplyMode,
    /// Bound on one call.
    pub call_timeout: Duration,
    /// Requests carry the STREAM bit: a reply may hold any number of entries (0..=128), not one
    /// per request entry (the rampkv transport: replies deferred by a lock wait come later, as
    /// unsolicited pushes).
    pub stream_replies: bool,
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self {
            fetch_bytes: RPC_FETCH_BYTES_DEFAULT,
            fetch_retries: RPC_FETCH_RETRIES_DEFAULT,
            slow_calls_to_push: RPC_SLOW_CALLS_TO_PUSH_DEFAULT,
            fetch_interval: Duration::from_nanos(RPC_FETCH_INTERVAL_NS_DEFAULT),
            push_back_below: Duration::from_nanos(RPC_PUSH_BACK_BELOW_NS_DEFAULT),
            hybrid: true,
            initial_mode: ReplyMode::Fetch,
            call_timeout: Duration::from_millis(RPC_CALL_TIMEOUT_MS_DEFAULT),
            stream_replies: false,
        }
    }
}

/// Where one connection's memory lies, agreed over the control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcLayout {
    /// The request ring: in the server's region; credit and the client's doorbell in the
    /// client's region.
    pub request: RingAddresses,
    /// The push ring: in the client's region; credit and the server's doorbell in the
    /// server's region.
    pub push: RingAddresses,
    /// The reply slot, in the server's region (8-aligned).
    pub reply_slot_offset_bytes: u64,
    /// Its length in bytes.
    pub reply_slot_bytes: u64,
}

/// A layout for one connection with regions of its own (`dedicated`'s result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedicatedLayout {
    /// The addresses.
    pub layout: RpcLayout,
    /// Bytes the server's region needs.
    pub server_region_bytes: usize,
    /// Bytes the client's region needs.
    pub client_region_bytes: usize,
}

impl RpcLayout {
    /// A connection with a region on each side:
    /// ```text
    /// server region: +0 doorbell (16, rest of 64 reserved) +64 push credit word (rest of 64
    ///                reserved) +128 reply slot (pad8(reply_slot_bytes)) then the request ring
    /// client region: +0 doorbell  +64 request credit word  +128 push ring
    /// ```
    /// Both rings are `ring_bytes` long and carry messages up to half of that (so that a
    /// message never waits for a wrap that cannot fit).
    pub fn dedicated(ring_bytes: usize, reply_slot_bytes: usize) -> DedicatedLayout {
        const DOORBELL_OFFSET_BYTES: u64 = 0;
        const CREDIT_OFFSET_BYTES: u64 = 64;
        const AREA_OFFSET_BYTES: u64 = 128;
        let ring_bytes = padded_bytes(ring_bytes);
        let slot_bytes = padded_bytes(reply_slot_bytes);
        let body_bytes_max = (ring_bytes / 2).saturating_sub(frame_bytes(0)) as u64;
        let request_ring_offset = AREA_OFFSET_BYTES + slot_bytes as u64;
        let layout = RpcLayout {
            request: RingAddresses {
                ring: RingLayout { offset_bytes: request_ring_offset, ring_bytes: ring_bytes as u64, body_bytes_max },
                receiver_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
                credit_offset_bytes: CREDIT_OFFSET_BYTES,
                sender_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
            },
            push: RingAddresses {
                ring: RingLayout { offset_bytes: AREA_OFFSET_BYTES, ring_bytes: ring_bytes as u64, body_bytes_max },
                receiver_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
                credit_offset_bytes: CREDIT_OFFSET_BYTES,
                sender_doorbell_offset_bytes: DOORBELL_OFFSET_BYTES,
            },
            reply_slot_offset_bytes: AREA_OFFSET_BYTES,
            reply_slot_bytes: slot_bytes as u64,
        };
        debug_assert!(DOORBELL_BYTES <= CREDIT_OFFSET_BYTES as usize);
        DedicatedLayout {
            layout,
            server_region_bytes: request_ring_offset as usize + ring_bytes,
            client_region_bytes: AREA_OFFSET_BYTES as usize + ring_bytes,
        }
    }
}

#[cfg(test)]
mod tests;
