//! The send/recv adapter: two-sided messaging emulated as RDMA SEND/RECV does it
//! (`rampkv_fabric::sendrecv`).
//!
//! In the write-poll medium a sender writes into a byte ring the receiver merely polls. Here the
//! **receiver** takes part as with RDMA SEND: it posts receive buffers of its own memory, each
//! message lands in the next posted buffer (none posted: receiver-not-ready, retried; too large:
//! a length error), and the receiver learns of it from a completion queue, copies it out and
//! posts the buffer again. A connection's slot in either region holds the receive queue, the
//! completion queue and the buffers of the messages its owner receives (`QUEUE_BYTES`). Messages
//! carry whole frames, up to `SENDRECV_BUFFER_BYTES`; a single frame above it is refused.
//!
//! # Fault model
//! A completion no correct peer writes, a length-error completion, a message that ends inside a
//! frame, or a peer that corrupts its receive queue breaks the channel.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rampkv_fabric::{PostError, QueueAddresses, QueueLayout, ReceiveQueue, SendQueue, StoreOrdering};

use super::control::MediumKind;
use super::fabric::{check_control, FabricHandle, FabricKind, Link, ServedRegion, DOORBELL_OFFSET_BYTES};
use super::{send_messages, Channel, ChannelError, Leftover};
use rampkv_core::limits::{SENDRECV_BUFFER_BYTES, SENDRECV_QUEUE_DEPTH};

/// The send/recv medium.
#[derive(Debug)]
pub struct SendRecv;

/// Bytes of one direction's queues and buffers.
pub const QUEUE_BYTES: usize = QueueLayout::len_bytes(SENDRECV_QUEUE_DEPTH, SENDRECV_BUFFER_BYTES);

/// The queue received on in the slot at `slot` of its owner's region.
fn addresses(slot: usize) -> QueueAddresses {
    let queue = QueueLayout {
        offset_bytes: slot as u64,
        depth: SENDRECV_QUEUE_DEPTH as u64,
        buffer_bytes: SENDRECV_BUFFER_BYTES as u64,
    };
    let doorbell = DOORBELL_OFFSET_BYTES as u64;
    QueueAddresses { queue, receiver_doorbell_offset_bytes: doorbell, sender_doorbell_offset_bytes: doorbell }
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
    /// The peer's region, its doorbell's region and the queue we send into (for the
    /// fault-injection hooks).
    peer: F::RemoteRegion,
    peer_doorbell: F::RemoteRegion,
    peer_queue: QueueLayout,
    /// A server's connection region stays in the list of served regions while we hold it.
    _served: Option<ServedRegion>,
}

impl<F: FabricHandle> std::fmt::Debug for QueueChannel<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("QueueChannel").field("blocked", &self.blocked).finish()
    }
}

impl<F: FabricHandle> QueueChannel<F> {
    /// Receives on our slot's queue (posting its buffers), sends into the peer's.
    fn build(link: Link<'_, F>) -> Result<Self, ChannelError> {
        let Link { local, local_slot, peer, peer_slot, doorbells, control, served } = link;
        let fabric = local.fabric.clone();
        let peer_doorbell = doorbells.remote.clone().unwrap_or_else(|| peer.clone());
        let (region, receive) = (Arc::clone(&local.region), addresses(local_slot));
        let receiver = ReceiveQueue::with_doorbells(fabric.clone(), region, peer.clone(), receive, doorbells.clone())?;
        let send = addresses(peer_slot);
        let sender =
            SendQueue::with_doorbells(fabric.clone(), peer.clone(), Arc::clone(&local.region), send, doorbells)?;
        let leftover = Leftover::default();
        Ok(Self {
            fabric,
            sender,
            receiver,
            blocked: false,
            leftover,
            control,
            peer,
            peer_doorbell,
            peer_queue: send.queue,
            _served: served,
        })
    }

    /// The control connection (the front end shuts it down to drop the client).
    pub fn control(&self) -> &TcpStream {
        &self.control
    }

    /// TEST HOOK (fault injection): writes `header` and `length` one-sidedly as the first
    /// completion of the peer's receive queue (on a connection that has sent nothing yet, the
    /// peer polls it next), as a buggy or hostile peer could, and rings the peer's doorbell.
    #[doc(hidden)]
    pub fn inject_completion_for_test(&mut self, header: u64, length: u64) -> Result<(), ChannelError> {
        let completion = (self.peer_queue.offset_bytes + self.peer_queue.depth * 8) as usize;
        self.fabric.write_word(&self.peer, completion + 8, length, StoreOrdering::Relaxed)?;
        self.fabric.write_word(&self.peer, completion, header, StoreOrdering::Release)?;
        Ok(self.fabric.wake(&self.peer_doorbell, DOORBELL_OFFSET_BYTES)?)
    }

    /// TEST HOOK (fault injection): sends `message` unchecked (it may exceed the peer's buffers:
    /// then the post is consumed with a length-error completion and this returns
    /// `PostError::TooLarge`).
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

    fn client(link: Link<'_, F>) -> Result<QueueChannel<F>, ChannelError> {
        QueueChannel::build(link)
    }

    fn server(link: Link<'_, F>) -> Result<QueueChannel<F>, ChannelError> {
        QueueChannel::build(link)
    }
}
