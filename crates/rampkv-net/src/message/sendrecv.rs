//! The send/recv adapter: two-sided messaging emulated as RDMA SEND/RECV does it
//! (`rampkv_fabric::sendrecv`).
//!
//! # How it differs from write-poll
//! In the write-poll medium a sender writes into a byte ring the receiver merely polls. Here the
//! **receiver** takes part as with RDMA SEND: it posts receive buffers of its own memory, each
//! message lands in the next posted buffer (a message with no posted buffer is refused,
//! receiver-not-ready, and retried; a message larger than the buffer is a length error), and
//! the receiver learns of it from a completion queue, copies it out and posts the buffer again.
//!
//! Per connection there are two queue pairs, each with its receive queue, completion queue and
//! buffers in its *receiver's* region: requests in the server group's region, replies in the
//! client's (one slot of `QUEUE_BYTES` each; layout in `docs/fabric.md`). Messages carry one or
//! more whole frames, up to `SENDRECV_BUFFER_BYTES`; a single frame above it is refused.
//!
//! # Fault model
//! A completion no correct peer writes, a length-error completion, a message that ends inside a
//! frame, or a peer that corrupts its receive queue breaks the channel (the connection closes).

use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rampkv_fabric::{PostError, QueueAddresses, QueueLayout, ReceiveQueue, RegionDescriptor, SendQueue, StoreOrdering};
use serde::{Deserialize, Serialize};

use super::fabric::{
    check_control, Endpoint, FabricHandle, FabricKind, MediumAccept, MediumHello, MediumKind, Refusal,
};
use super::{send_messages, Channel, ChannelError, Leftover};
use crate::item_slots::ItemRegionInfo;
use rampkv_core::limits::{SENDRECV_BUFFER_BYTES, SENDRECV_QUEUE_DEPTH, WRITEPOLL_MESSAGE_BYTES_MIN};

/// The send/recv medium.
#[derive(Debug)]
pub struct SendRecv;

/// Bytes of one direction's queues and buffers.
pub const QUEUE_BYTES: usize = QueueLayout::len_bytes(SENDRECV_QUEUE_DEPTH, SENDRECV_BUFFER_BYTES);

/// The queues of one direction at `offset_bytes`, with the configured depth and buffer size.
fn queue_at(offset_bytes: usize) -> QueueLayout {
    QueueLayout {
        offset_bytes: offset_bytes as u64,
        depth: SENDRECV_QUEUE_DEPTH as u64,
        buffer_bytes: SENDRECV_BUFFER_BYTES as u64,
    }
}

/// The client's hello: its reply queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRecvHello {
    pub region: RegionDescriptor,
    pub reply_queue: QueueLayout,
    pub doorbell_offset_bytes: u64,
}

/// The server's answer: the request queue (its buffers are posted already).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendRecvAccept {
    pub region: RegionDescriptor,
    pub request_queue: QueueLayout,
    pub doorbell_offset_bytes: u64,
}

/// One end of a send/recv connection.
pub struct QueueChannel<F: FabricHandle> {
    fabric: F,
    sender: SendQueue<F, Arc<F::LocalRegion>>,
    receiver: ReceiveQueue<F, Arc<F::LocalRegion>>,
    /// A send found no posted buffer.
    blocked: bool,
    /// The message last received (copied out before its buffer is posted again).
    leftover: Leftover,
    control: TcpStream,
    /// The peer's region and the queue we send into (for the fault-injection hooks).
    peer: F::RemoteRegion,
    peer_queue: QueueLayout,
}

impl<F: FabricHandle> std::fmt::Debug for QueueChannel<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("QueueChannel").field("blocked", &self.blocked).finish()
    }
}

impl<F: FabricHandle> QueueChannel<F> {
    /// The control connection (its end is the other side's end; the front end shuts it down
    /// to drop the client).
    pub fn control(&self) -> &TcpStream {
        &self.control
    }

    fn build(
        local: &Endpoint<F>,
        peer: F::RemoteRegion,
        receive: QueueAddresses,
        send: QueueAddresses,
        control: TcpStream,
    ) -> Result<Self, ChannelError> {
        let fabric = local.fabric.clone();
        let receiver = ReceiveQueue::new(fabric.clone(), Arc::clone(&local.region), peer.clone(), receive)?;
        let sender = SendQueue::new(fabric.clone(), peer.clone(), Arc::clone(&local.region), send)?;
        Ok(Self {
            fabric,
            sender,
            receiver,
            blocked: false,
            leftover: Leftover::default(),
            control,
            peer,
            peer_queue: send.queue,
        })
    }

    /// TEST HOOK (fault injection): writes `header` and `length` one-sidedly as the first
    /// completion of the peer's receive queue (on a connection that has sent nothing yet, the
    /// peer polls it next), as a buggy or hostile peer could, and rings the peer's doorbell.
    #[doc(hidden)]
    pub fn inject_completion_for_test(&mut self, header: u64, length: u64) -> Result<(), ChannelError> {
        let completion = (self.peer_queue.offset_bytes + self.peer_queue.depth * 8) as usize;
        self.fabric.write_word(&self.peer, completion + 8, length, StoreOrdering::Relaxed)?;
        self.fabric.write_word(&self.peer, completion, header, StoreOrdering::Release)?;
        Ok(self.fabric.wake(&self.peer, 0)?)
    }

    /// TEST HOOK (fault injection): sends `message` unchecked (it need not hold valid frames,
    /// and may exceed the peer's buffers: then the post is consumed with a length-error
    /// completion and this returns `PostError::TooLarge`).
    #[doc(hidden)]
    pub fn send_raw_message_for_test(&mut self, message: &[u8]) -> Result<(), ChannelError> {
        Ok(self.sender.send(message, Duration::from_secs(5))?)
    }
}

impl<F: FabricHandle> Channel for QueueChannel<F> {
    const STREAM: bool = false;

    fn frame_bytes_max(&self) -> usize {
        self.sender.message_bytes_max()
    }

    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        let sender = &mut self.sender;
        let sent = send_messages(frames, sender.message_bytes_max(), |message| match sender.try_send(message) {
            Ok(()) => Ok(true),
            Err(PostError::ReceiverNotReady) => Ok(false),
            Err(error) => Err(error),
        })?;
        self.blocked = sent < frames.len();
        Ok(sent)
    }

    fn receive(&mut self, mut consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        if !self.leftover.offer(&mut consume) {
            return Ok(false);
        }
        let Some(completion) = self.receiver.poll()? else { return Ok(false) };
        self.receiver.copy_message(&completion, self.leftover.fill());
        self.receiver.repost(completion)?;
        self.leftover.offer(&mut consume);
        Ok(true)
    }

    fn readable(&self) -> bool {
        !self.leftover.is_empty() || self.receiver.has_pending()
    }

    fn writable(&self) -> bool {
        self.blocked && self.sender.receiver_ready()
    }

    fn check_peer(&mut self) -> Result<(), ChannelError> {
        check_control(&mut self.control)
    }
}

impl<F: FabricHandle> FabricKind<F> for SendRecv {
    const KIND: MediumKind = MediumKind::SendRecv;
    const CLIENT_SLOT_BYTES: usize = QUEUE_BYTES;
    const SERVER_SLOT_BYTES: usize = QUEUE_BYTES;
    type Client = QueueChannel<F>;
    type Server = QueueChannel<F>;
    type Hello = SendRecvHello;
    type Accept = SendRecvAccept;

    fn hello(client: &Endpoint<F>, slot_offset_bytes: usize) -> SendRecvHello {
        SendRecvHello {
            region: client.descriptor.clone(),
            reply_queue: queue_at(slot_offset_bytes),
            doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
        }
    }

    fn wrap_hello(hello: SendRecvHello) -> MediumHello {
        MediumHello::SendRecv(hello)
    }

    fn wrap_accept(accept: SendRecvAccept) -> MediumAccept {
        MediumAccept::SendRecv(accept)
    }

    fn unwrap_accept(accept: MediumAccept) -> Option<SendRecvAccept> {
        match accept {
            MediumAccept::SendRecv(accept) => Some(accept),
            _ => None,
        }
    }

    fn connect(
        client: &Endpoint<F>,
        hello: SendRecvHello,
        accept: SendRecvAccept,
        control: TcpStream,
    ) -> Result<QueueChannel<F>, ChannelError> {
        let server = client.fabric.map(&accept.region)?;
        // Our reply queue is fresh and the server sends only in answer to a request, so posting
        // our receive buffers now, before the first request, is in time.
        let receive = QueueAddresses {
            queue: hello.reply_queue,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            sender_doorbell_offset_bytes: accept.doorbell_offset_bytes,
        };
        let send = QueueAddresses {
            queue: accept.request_queue,
            receiver_doorbell_offset_bytes: accept.doorbell_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        };
        QueueChannel::build(client, server, receive, send, control)
    }

    fn accept(
        server: &Endpoint<F>,
        slot_offset_bytes: usize,
        hello: SendRecvHello,
        control: TcpStream,
        _items: Option<ItemRegionInfo>,
    ) -> Result<(QueueChannel<F>, SendRecvAccept), Refusal> {
        if hello.reply_queue.buffer_bytes < WRITEPOLL_MESSAGE_BYTES_MIN as u64 {
            return Err(Refusal::MessagesTooSmall { bytes_min: WRITEPOLL_MESSAGE_BYTES_MIN as u64 });
        }
        let client = server.fabric.map(&hello.region).map_err(Refusal::region)?;
        let request_queue = queue_at(slot_offset_bytes);
        let receive = QueueAddresses {
            queue: request_queue,
            receiver_doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        };
        let send = QueueAddresses {
            queue: hello.reply_queue,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            sender_doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
        };
        let channel = QueueChannel::build(server, client, receive, send, control).map_err(Refusal::layout)?;
        let accept = SendRecvAccept {
            region: server.descriptor.clone(),
            request_queue,
            doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
        };
        Ok((channel, accept))
    }
}
