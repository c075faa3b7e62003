//! The RF-RPC adapter (remote fetch, as in Jakiro; `rampkv_fabric::rpc`): requests written into
//! the server's memory, replies fetched from a slot in the server's memory with one-sided reads.
//!
//! # Per connection
//! One fetch-only RF-RPC connection with *stream* replies: a request message carries frames, one
//! per entry, and at most one call is outstanding; frames sent meanwhile wait for its reply. How
//! many frames go into one call is the automatic batch-size controller's choice
//! (`rampkv_fabric::rpc::SizeController`, the paper's rule): it counts each call's round trip
//! against `RFRPC_BATCH_LATENCY_LIMIT_US` and shrinks the batch when more than 5% of the frames
//! waited longer, grows it when almost none did. The server answers a call at once with the
//! reply frames it has (fewer than the request's when S2PL defers a reply) in its reply slot;
//! deferred replies and replies that overflow the slot come later as unsolicited pushes through
//! the push ring in the client's region, which also gives the client's wait a doorbell. The
//! server rings that doorbell after publishing a reply only if the client sleeps.
//!
//! Slots (layout in `docs/fabric.md`): in the connection's region of the server `+0` the push ring's credit
//! word (rest of 64 reserved), `+64` the reply slot (`RFRPC_REPLY_SLOT_BYTES`), then the request
//! ring (`RFRPC_RING_BYTES`); in the client's region `+0` the request ring's credit word, `+64`
//! the push ring.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_fabric::limits::RPC_BATCH_ENTRIES_MAX;
use rampkv_fabric::rpc::{
    AutoBatchConfig, EntryList, ReplyMode, RpcClient, RpcConfig, RpcLayout, RpcServerEndpoint, SizeController,
};
use rampkv_fabric::{RingAddresses, RingLayout};

use super::control::MediumKind;
use super::fabric::{check_control, FabricHandle, FabricKind, Link, ServedRegion, DOORBELL_OFFSET_BYTES};
use super::{frame_bytes_at, BatchStats, Channel, ChannelError, Leftover};
use rampkv_core::limits::{RFRPC_BATCH_LATENCY_LIMIT_US, RFRPC_REPLY_SLOT_BYTES, RFRPC_RING_BYTES};

/// The RF-RPC medium.
#[derive(Debug)]
pub struct RfRpc;

/// How long a push waits for ring credit (the poller retries a refused push on a later pass).
const PUSH_TIMEOUT: Duration = Duration::from_millis(1);
/// Bytes an entry's size prefix takes in a packed entry list.
const ENTRY_PREFIX_BYTES: usize = 4;

fn ring_at(offset_bytes: usize) -> RingLayout {
    RingLayout {
        offset_bytes: offset_bytes as u64,
        ring_bytes: RFRPC_RING_BYTES as u64,
        body_bytes_max: (RFRPC_RING_BYTES / 2 - 16) as u64,
    }
}

/// The connection's addresses, from the client's slot and the server's (see the module docs).
fn layout(client_slot: usize, server_slot: usize) -> RpcLayout {
    let doorbell = DOORBELL_OFFSET_BYTES as u64;
    RpcLayout {
        request: RingAddresses {
            ring: ring_at(server_slot + 64 + RFRPC_REPLY_SLOT_BYTES),
            receiver_doorbell_offset_bytes: doorbell,
            credit_offset_bytes: client_slot as u64,
            sender_doorbell_offset_bytes: doorbell,
        },
        push: RingAddresses {
            ring: ring_at(client_slot + 64),
            receiver_doorbell_offset_bytes: doorbell,
            credit_offset_bytes: server_slot as u64,
            sender_doorbell_offset_bytes: doorbell,
        },
        reply_slot_offset_bytes: server_slot as u64 + 64,
        reply_slot_bytes: RFRPC_REPLY_SLOT_BYTES as u64,
    }
}

/// Packs whole frames from the front of `frames` into `entries`, one per entry, at most
/// `count_max` of them and `bytes_max` packed bytes (at least one frame); returns the bytes.
fn pack(frames: &[u8], entries: &mut EntryList, count_max: usize, bytes_max: usize) -> usize {
    entries.clear();
    let mut taken = 0;
    while taken < frames.len() && entries.len() < count_max {
        let frame = frame_bytes_at(&frames[taken..]);
        if !entries.is_empty() && entries.packed().len() + ENTRY_PREFIX_BYTES + frame > bytes_max {
            break;
        }
        entries.push(&frames[taken..taken + frame]);
        taken += frame;
    }
    taken
}

/// The client end of an RF-RPC connection.
pub struct RfRpcClientChannel<F: FabricHandle> {
    client: RpcClient<F, Arc<F::LocalRegion>>,
    entries: EntryList,
    control: TcpStream,
    batch: SizeController,
    /// When the outstanding call was sent, and with how many frames.
    call: Option<(Instant, usize)>,
    stats: BatchStats,
}

impl<F: FabricHandle> std::fmt::Debug for RfRpcClientChannel<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RfRpcClientChannel").field("stats", &self.stats).finish()
    }
}

impl<F: FabricHandle> Channel for RfRpcClientChannel<F> {
    const STREAM: bool = false;

    fn frame_bytes_max(&self) -> usize {
        self.client.request_entries_bytes_max() - ENTRY_PREFIX_BYTES
    }

    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        if frames.is_empty() || self.client.has_outstanding() {
            return Ok(0);
        }
        let size = self.batch.size();
        let taken = pack(frames, &mut self.entries, size, self.client.request_entries_bytes_max());
        self.client.client_send(&self.entries, size as u16)?;
        self.call = Some((Instant::now(), self.entries.len()));
        self.stats.calls += 1;
        self.stats.frames += self.entries.len() as u64;
        Ok(taken)
    }

    fn receive(&mut self, mut consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        let mut received = false;
        if self.client.has_outstanding() {
            if let Some(reply) = self.client.try_client_recv()? {
                for entry in reply.entries.iter() {
                    consume(entry);
                }
                if let Some((sent, frames)) = self.call.take() {
                    let (latency, size) = (sent.elapsed(), self.batch.size());
                    for _ in 0..frames {
                        self.batch.record(latency);
                    }
                    self.stats.size_changes += u64::from(self.batch.size() != size);
                }
                received = true;
            }
        }
        if let Some(entries) = self.client.try_recv_unsolicited()? {
            for entry in entries.iter() {
                consume(entry);
            }
            received = true;
        }
        Ok(received)
    }

    fn readable(&self) -> bool {
        self.client.push_pending() || self.client.reply_may_be_ready()
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        Some(BatchStats { size: self.batch.size() as u64, ..self.stats })
    }

    fn writable(&self) -> bool {
        false // a call completes when its reply is received: `readable` wakes the sender
    }

    fn check_peer(&mut self) -> Result<(), ChannelError> {
        check_control(&mut self.control)
    }
}

/// The server end of an RF-RPC connection.
pub struct RfRpcServerChannel<F: FabricHandle> {
    endpoint: RpcServerEndpoint<F, Arc<F::LocalRegion>>,
    entries: EntryList,
    leftover: Leftover,
    /// The push ring's credit word when a push last found no room.
    blocked_credit: Option<u64>,
    control: TcpStream,
    /// The connection's region stays in the list of served regions while we hold it.
    _served: Option<ServedRegion>,
}

impl<F: FabricHandle> std::fmt::Debug for RfRpcServerChannel<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RfRpcServerChannel").field("blocked", &self.blocked_credit.is_some()).finish()
    }
}

impl<F: FabricHandle> RfRpcServerChannel<F> {
    /// The client's control connection (the front end shuts it down to drop the client).
    pub fn control(&self) -> &TcpStream {
        &self.control
    }
}

impl<F: FabricHandle> Channel for RfRpcServerChannel<F> {
    const STREAM: bool = false;

    fn frame_bytes_max(&self) -> usize {
        self.endpoint.unsolicited_entries_bytes_max() - ENTRY_PREFIX_BYTES
    }

    /// Answers the pending call with the frames that fit its reply slot (none, if none are
    /// queued), then pushes the rest as far as the push ring has room.
    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        let mut taken = 0;
        if self.endpoint.call_pending() {
            taken = match frames.is_empty() {
                true => {
                    self.entries.clear();
                    0
                }
                false => {
                    pack(frames, &mut self.entries, RPC_BATCH_ENTRIES_MAX, self.endpoint.reply_entries_bytes_max())
                }
            };
            let fits = self.entries.packed().len() <= self.endpoint.reply_entries_bytes_max();
            if !fits {
                self.entries.clear();
                taken = 0;
            }
            self.endpoint.server_send(&self.entries)?;
        }
        let bytes_max = self.endpoint.unsolicited_entries_bytes_max();
        while taken < frames.len() {
            let count = pack(&frames[taken..], &mut self.entries, RPC_BATCH_ENTRIES_MAX, bytes_max);
            if !self.endpoint.try_push_unsolicited(&self.entries)? {
                self.blocked_credit = Some(self.endpoint.push_credit());
                return Ok(taken);
            }
            taken += count;
        }
        self.blocked_credit = None;
        Ok(taken)
    }

    fn receive(&mut self, mut consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        if !self.leftover.offer(&mut consume) {
            return Ok(false);
        }
        let Some(request) = self.endpoint.server_recv()? else { return Ok(false) };
        let mut stopped = false;
        for entry in request.entries.iter() {
            if stopped {
                self.leftover.keep(entry);
                continue;
            }
            let taken = consume(entry);
            if taken < entry.len() {
                self.leftover.keep(&entry[taken..]);
                stopped = true;
            }
        }
        Ok(true)
    }

    fn readable(&self) -> bool {
        !self.leftover.is_empty() || self.endpoint.has_pending()
    }

    fn writable(&self) -> bool {
        self.blocked_credit.is_some_and(|seen| self.endpoint.push_credit() != seen)
    }
}

impl<F: FabricHandle> FabricKind<F> for RfRpc {
    const KIND: MediumKind = MediumKind::RfRpc;
    const CLIENT_SLOT_BYTES: usize = 64 + RFRPC_RING_BYTES;
    const SERVER_SLOT_BYTES: usize = 64 + RFRPC_REPLY_SLOT_BYTES + RFRPC_RING_BYTES;
    type Client = RfRpcClientChannel<F>;
    type Server = RfRpcServerChannel<F>;

    fn client(link: Link<'_, F>) -> Result<RfRpcClientChannel<F>, ChannelError> {
        let Link { local, local_slot, peer, peer_slot, doorbells, control, served: _ } = link;
        let config =
            RpcConfig { hybrid: false, initial_mode: ReplyMode::Fetch, stream_replies: true, ..RpcConfig::default() };
        // Our push ring is fresh and the server pushes only after our first request, so building
        // the client (which zeroes the push ring) after the handshake is in time.
        let layout = layout(local_slot, peer_slot);
        let (fabric, region) = (local.fabric.clone(), Arc::clone(&local.region));
        let client = RpcClient::with_server_doorbell(fabric, peer, doorbells.remote, region, layout, config)?;
        let auto = AutoBatchConfig::new(Duration::from_micros(RFRPC_BATCH_LATENCY_LIMIT_US));
        let batch = SizeController::new(auto, RPC_BATCH_ENTRIES_MAX);
        Ok(RfRpcClientChannel {
            client,
            entries: EntryList::new(),
            control,
            batch,
            call: None,
            stats: BatchStats::default(),
        })
    }

    fn server(link: Link<'_, F>) -> Result<RfRpcServerChannel<F>, ChannelError> {
        let Link { local, local_slot, peer, peer_slot, doorbells, control, served } = link;
        let layout = layout(peer_slot, local_slot);
        let (fabric, region) = (local.fabric.clone(), Arc::clone(&local.region));
        let mut endpoint =
            RpcServerEndpoint::with_local_doorbell(fabric, region, doorbells.local, peer, layout, PUSH_TIMEOUT)?;
        // The client sleeps on its doorbell while a call is outstanding (after a bounded spin).
        endpoint.set_notify_fetchers(true);
        let (entries, leftover) = (EntryList::new(), Leftover::default());
        Ok(RfRpcServerChannel { endpoint, entries, leftover, blocked_credit: None, control, _served: served })
    }
}
