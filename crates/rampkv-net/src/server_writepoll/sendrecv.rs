//! The server side of the send/recv transport, served by the write-poll group's control
//! thread and poller (one poller for every connection of the group, one doorbell).
//!
//! A send/recv connection's request queue, completion queue and receive buffers live in the
//! group's region after the write-poll slots (global slot `s >= WRITEPOLL_GROUP_CONNECTIONS_MAX`
//! at `REQUEST_AREA_OFFSET_BYTES + (s - WRITEPOLL_GROUP_CONNECTIONS_MAX) * QUEUE_BYTES`). The
//! poller polls each connection's completion queue, copies the message out of its buffer, posts
//! the buffer again, answers the frames and sends the replies into the client's posted buffers
//! (batched, as few messages as the buffer size allows). A client with no buffer posted holds
//! its replies back (receiver not ready) until it posts, as a client without ring credit does.
//!
//! # Fault model
//! A completion no correct client writes, a length-error completion (the client sent a message
//! larger than our buffers), a message that ends inside a frame or holds an invalid frame
//! header, or a client that corrupts its own receive queue: that connection is closed (queues
//! dropped, control connection shut down, S2PL locks released); others are served throughout.

use std::ops::Range;
use std::sync::Arc;

use rampkv_fabric::{
    Fabric, PostError, QueueAddresses, QueueLayout, ReceiveQueue, SendQueue, ShmFabric, ShmLocalRegion,
};
use serde::Deserialize;

use super::{Fault, Poller, RegionLayout, WritePollHandshake, RING_MESSAGE};
use crate::front::control::{admit, bound_reply, release_connection, Notify, SlotPool};
use crate::transport::sendrecv::{
    queue_layout, send_frames, SendRecvHello, SendRecvServerReply, ShmReceiveQueue, ShmSendQueue, QUEUE_BYTES,
    SENDRECV_CONTROL_VERSION,
};
use crate::transport::writepoll::ClientHello;
use rampkv_core::limits::{
    CONNECTION_WRITE_BUFFER_BYTES_MAX, SENDRECV_GROUP_CONNECTIONS_MAX, WRITEPOLL_GROUP_CONNECTIONS_MAX,
    WRITEPOLL_MESSAGES_PER_PASS_MAX, WRITEPOLL_MESSAGE_BYTES_MIN,
};
use rampkv_core::protocol::server::{DeferredReply, ServerCore};
use rampkv_core::wire::FrameHeader;

/// Where the send/recv request queues start in the group's region.
const REQUEST_AREA_OFFSET_BYTES: usize = RegionLayout::region_bytes(WRITEPOLL_GROUP_CONNECTIONS_MAX);

/// Bytes the send/recv slots add to the group's region.
pub(super) const AREA_BYTES: usize = SENDRECV_GROUP_CONNECTIONS_MAX * QUEUE_BYTES;

/// The global slot numbers of send/recv connections.
pub(super) fn slots() -> Range<usize> {
    WRITEPOLL_GROUP_CONNECTIONS_MAX..WRITEPOLL_GROUP_CONNECTIONS_MAX + SENDRECV_GROUP_CONNECTIONS_MAX
}

/// Whether a global slot number is a send/recv connection's (else a ring connection's).
pub(super) fn is_sendrecv_slot(slot: usize) -> bool {
    slot >= WRITEPOLL_GROUP_CONNECTIONS_MAX
}

fn request_queue(slot: usize) -> QueueLayout {
    queue_layout(REQUEST_AREA_OFFSET_BYTES + (slot - WRITEPOLL_GROUP_CONNECTIONS_MAX) * QUEUE_BYTES)
}

/// A client's hello on the shared control port: the field names tell them apart.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ControlHello {
    /// A send/recv client (its hello has `sendrecv_version` and no unknown fields).
    SendRecv(SendRecvHello),
    /// A write-poll client.
    WritePoll(ClientHello),
}

impl WritePollHandshake {
    /// The send/recv handshake: builds the queue pairs (posting the server's receive buffers)
    /// and hands the connection to the poller before answering, so the client's first request
    /// finds buffers posted.
    pub(super) fn handshake_sendrecv(
        &mut self,
        stream: std::net::TcpStream,
        core: Arc<ServerCore>,
        hello: &SendRecvHello,
    ) -> Option<(usize, std::net::TcpStream)> {
        let (fabric, region) = (self.fabric, Arc::clone(&self.shared.region));
        let shared = Arc::clone(&self.shared);
        let pool =
            SlotPool { free: &shared.free.sendrecv, capacity: SENDRECV_GROUP_CONNECTIONS_MAX, name: "send/recv slots" };
        admit(
            stream,
            &pool,
            &mut self.generation,
            |reason| SendRecvServerReply::Refused { reason },
            |slot, id, control| {
                let connection = build_connection(fabric, &region, hello, slot, id, core, control)?;
                let accepted = SendRecvServerReply::Accepted {
                    region: region.descriptor().clone(),
                    request_queue: request_queue(slot),
                    doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
                };
                Ok((connection, accepted))
            },
            &mut Notify { events: &self.events, shared: &shared },
        )
    }
}

/// Maps the client's region and builds both queue pairs from its hello (input from outside:
/// the fabric checks the descriptor, the queue constructors every offset).
fn build_connection(
    fabric: ShmFabric,
    region: &Arc<ShmLocalRegion>,
    hello: &SendRecvHello,
    slot: usize,
    id: u64,
    core: Arc<ServerCore>,
    control: std::net::TcpStream,
) -> Result<SendRecvConnection, String> {
    if hello.sendrecv_version != SENDRECV_CONTROL_VERSION {
        return Err(format!("send/recv version {} is not {SENDRECV_CONTROL_VERSION}", hello.sendrecv_version));
    }
    if hello.reply_queue.buffer_bytes < WRITEPOLL_MESSAGE_BYTES_MIN as u64 {
        return Err(format!("reply buffers must hold at least {WRITEPOLL_MESSAGE_BYTES_MIN} bytes"));
    }
    let client = fabric.map(&hello.region).map_err(|error| error.to_string())?;
    let receiver = ReceiveQueue::new(
        fabric,
        Arc::clone(region),
        client.clone(),
        QueueAddresses {
            queue: request_queue(slot),
            receiver_doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        },
    )
    .map_err(|error| error.to_string())?;
    let sender = SendQueue::new(
        fabric,
        client,
        Arc::clone(region),
        QueueAddresses {
            queue: hello.reply_queue,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            sender_doorbell_offset_bytes: RegionLayout::DOORBELL_OFFSET_BYTES,
        },
    )
    .map_err(|error| error.to_string())?;
    Ok(SendRecvConnection {
        slot,
        id,
        core,
        sender,
        receiver,
        control,
        replies: Vec::new(),
        sent: 0,
        incoming: Vec::new(),
        incoming_offset: 0,
    })
}

/// One client's send/recv queue pairs, served by the poller.
pub(super) struct SendRecvConnection {
    /// Global slot number.
    slot: usize,
    /// `RING_CONNECTION_ID_BIT | generation << 32 | slot`.
    id: u64,
    core: Arc<ServerCore>,
    sender: ShmSendQueue,
    receiver: ShmReceiveQueue,
    /// A clone of the control stream, to shut it down when we drop the connection.
    control: std::net::TcpStream,
    /// Reply frames not yet sent: `replies[sent..]`.
    replies: Vec<u8>,
    sent: usize,
    /// The last request message (copied out of its buffer, which was posted again), served up
    /// to `incoming_offset` (the rest waits while the reply backlog is at its bound).
    incoming: Vec<u8>,
    incoming_offset: usize,
}

impl SendRecvConnection {
    fn backlogged(&self) -> bool {
        self.sent < self.replies.len()
    }

    /// The poller's wake condition: a request to serve, or a posted buffer for backlogged
    /// replies (one or two loads).
    pub(super) fn ready(&self) -> bool {
        if self.backlogged() {
            return self.sender.receiver_ready();
        }
        self.incoming_offset < self.incoming.len() || self.receiver.has_pending()
    }

    /// Sends queued replies as far as the client's posted buffers allow.
    fn flush(&mut self) -> Result<(), PostError> {
        if !self.backlogged() {
            return Ok(());
        }
        self.sent += send_frames(&mut self.sender, &self.replies[self.sent..])?;
        if self.sent == self.replies.len() {
            self.replies.clear();
            self.sent = 0;
        }
        Ok(())
    }

    /// Answers the whole frames of `incoming[incoming_offset..]` until they end or the unsent
    /// replies exceed `CONNECTION_WRITE_BUFFER_BYTES_MAX` (back-pressure, as over TCP).
    fn serve_incoming(&mut self, now_ms: u64, deferred: &mut Vec<DeferredReply>) -> Result<(), Fault> {
        let message_bytes_max = self.sender.message_bytes_max();
        while self.incoming_offset < self.incoming.len()
            && self.replies.len() - self.sent <= CONNECTION_WRITE_BUFFER_BYTES_MAX
        {
            let (header, frame) = match FrameHeader::split(&self.incoming[self.incoming_offset..]) {
                Ok(Some(split)) => split,
                // A message holds whole frames: a partial or invalid one is corruption.
                Ok(None) | Err(_) => return Err(Fault::Corrupt),
            };
            let start = self.replies.len();
            self.core.handle_frame(self.id, header.kind, header.request_id, frame, now_ms, &mut self.replies, deferred);
            bound_reply(&mut self.replies, start, message_bytes_max, RING_MESSAGE);
            self.incoming_offset += header.frame_bytes();
        }
        if self.incoming_offset == self.incoming.len() {
            self.incoming.clear();
            self.incoming_offset = 0;
        }
        Ok(())
    }

    /// Sends backlogged replies, then (if none are left) serves leftover frames and takes up to
    /// `WRITEPOLL_MESSAGES_PER_PASS_MAX` request messages. Returns the messages served.
    fn serve(&mut self, now_ms: u64, deferred: &mut Vec<DeferredReply>) -> Result<usize, Fault> {
        self.flush().map_err(|_| Fault::Corrupt)?;
        let mut progress = 0;
        if !self.backlogged() && !self.incoming.is_empty() {
            self.serve_incoming(now_ms, deferred)?;
            self.flush().map_err(|_| Fault::Corrupt)?;
            progress += 1;
        }
        while !self.backlogged() && self.incoming.is_empty() && progress < WRITEPOLL_MESSAGES_PER_PASS_MAX {
            let Some(completion) = self.receiver.poll().map_err(|_| Fault::Corrupt)? else { break };
            self.receiver.copy_message(&completion, &mut self.incoming);
            self.receiver.repost(completion).map_err(|_| Fault::Corrupt)?;
            self.serve_incoming(now_ms, deferred)?;
            self.flush().map_err(|_| Fault::Corrupt)?;
            progress += 1;
        }
        Ok(progress)
    }
}

impl Poller {
    pub(super) fn open_sendrecv(&mut self, connection: SendRecvConnection) {
        let index = connection.slot - WRITEPOLL_GROUP_CONNECTIONS_MAX;
        debug_assert!(self.sendrecv[index].is_none(), "a slot is handed out once");
        self.sendrecv[index] = Some(connection);
    }

    /// Serves every send/recv connection once; returns the messages served (a corrupt
    /// connection, closed, counts as progress).
    pub(super) fn serve_sendrecv(&mut self, now_ms: u64) -> usize {
        let mut served = 0;
        for index in 0..self.sendrecv.len() {
            let Some(connection) = self.sendrecv[index].as_mut() else { continue };
            match connection.serve(now_ms, &mut self.deferred) {
                Ok(taken) => served += taken,
                Err(Fault::Corrupt) => {
                    self.close_sendrecv(WRITEPOLL_GROUP_CONNECTIONS_MAX + index);
                    served += 1;
                }
            }
        }
        served
    }

    /// Drops the send/recv connection in global `slot` (if open): locks released, control
    /// connection shut down so the client learns it.
    pub(super) fn close_sendrecv(&mut self, slot: usize) {
        let Some(entry) = self.sendrecv.get_mut(slot - WRITEPOLL_GROUP_CONNECTIONS_MAX) else { return };
        if let Some(connection) = entry.take() {
            release_connection(&connection.control, &connection.core, connection.id, &mut self.deferred);
        }
    }

    /// Queues a deferred reply for the send/recv connection in global `slot` and sends it.
    pub(super) fn deliver_sendrecv(&mut self, slot: usize, reply: DeferredReply) {
        let index = slot - WRITEPOLL_GROUP_CONNECTIONS_MAX;
        let Some(connection) = self.sendrecv.get_mut(index).and_then(Option::as_mut) else { return };
        if connection.id != reply.connection {
            return; // the connection closed: nobody to tell
        }
        let start = connection.replies.len();
        connection.replies.extend_from_slice(&reply.frame);
        bound_reply(&mut connection.replies, start, connection.sender.message_bytes_max(), RING_MESSAGE);
        if connection.flush().is_err() {
            self.close_sendrecv(slot);
        }
    }
}
