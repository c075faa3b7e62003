//! The write-poll adapter (GET+/PUT+): per connection, a request ring in the server's region for
//! that connection that the client writes one-sidedly, and a reply ring in the client's region that the
//! server writes (`rampkv_fabric::ring`: HydraDB's message format, credit flow control, the
//! poller's doorbell). A ring message carries one or more *whole* frames; a single frame above
//! `WRITEPOLL_MESSAGE_BYTES_MAX` is refused.
//!
//! Both ends are the same [`RingChannel`], and a connection's slot has the same layout in either
//! region: `+0` the credit word of the ring the region's owner *sends* on (the peer writes it),
//! rest of 64 reserved; `+64` the ring the owner *receives* on (`WRITEPOLL_RING_BYTES`).
//!
//! # Fault model
//! A ring holding something no correct peer writes, a message that ends inside a frame, or a
//! corrupt credit word breaks the channel. Nothing is ever accessed outside a ring.

use std::net::TcpStream;
use std::sync::Arc;

use rampkv_fabric::{
    LoadOrdering, RingAddresses, RingLayout, RingReceiver, RingSender, SendError, StoreOrdering, Words,
};

use super::control::MediumKind;
use super::fabric::{check_control, FabricHandle, FabricKind, Link, ServedRegion, DOORBELL_OFFSET_BYTES};
use super::{send_messages, Channel, ChannelError, Leftover};
use rampkv_core::limits::{WRITEPOLL_MESSAGE_BYTES_MAX, WRITEPOLL_RING_BYTES};

/// The write-poll medium.
#[derive(Debug)]
pub struct Ring;

/// One end of a ring connection.
pub struct RingChannel<F: FabricHandle> {
    fabric: F,
    sender: RingSender<F, Arc<F::LocalRegion>>,
    receiver: RingReceiver<F, Arc<F::LocalRegion>>,
    local: Arc<F::LocalRegion>,
    /// Word index of the credit word of the ring we send on (in our region).
    credit_index: usize,
    /// The credit word when a send last found no room (None: nothing waits for credit).
    blocked_credit: Option<u64>,
    leftover: Leftover,
    control: TcpStream,
    /// The peer's region, its doorbell's region and the ring we write there (for the
    /// fault-injection hooks).
    peer: F::RemoteRegion,
    peer_doorbell: F::RemoteRegion,
    peer_ring_offset_bytes: usize,
    /// A server's connection region stays in the list of served regions while we hold it.
    _served: Option<ServedRegion>,
}

impl<F: FabricHandle> std::fmt::Debug for RingChannel<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RingChannel").field("blocked", &self.blocked_credit.is_some()).finish()
    }
}

/// The ring received on in the slot at `slot` of its owner's region, with the sender's credit
/// word in the slot at `peer_slot` of the sender's region.
fn addresses(slot: usize, peer_slot: usize) -> RingAddresses {
    let ring = RingLayout {
        offset_bytes: slot as u64 + 64,
        ring_bytes: WRITEPOLL_RING_BYTES as u64,
        body_bytes_max: WRITEPOLL_MESSAGE_BYTES_MAX as u64,
    };
    let doorbell = DOORBELL_OFFSET_BYTES as u64;
    RingAddresses {
        ring,
        receiver_doorbell_offset_bytes: doorbell,
        credit_offset_bytes: peer_slot as u64,
        sender_doorbell_offset_bytes: doorbell,
    }
}

impl<F: FabricHandle> RingChannel<F> {
    /// Receives on our slot's ring, sends on the peer's (the same on either side).
    fn build(link: Link<'_, F>) -> Result<Self, ChannelError> {
        let Link { local, local_slot, peer, peer_slot, doorbells, control, served } = link;
        let fabric = local.fabric.clone();
        let peer_doorbell = doorbells.remote.clone().unwrap_or_else(|| peer.clone());
        let receive = addresses(local_slot, peer_slot);
        let receiver = RingReceiver::with_doorbells(
            fabric.clone(),
            Arc::clone(&local.region),
            peer.clone(),
            receive,
            doorbells.clone(),
        )?;
        let send = addresses(peer_slot, local_slot);
        let sender =
            RingSender::with_doorbells(fabric.clone(), peer.clone(), Arc::clone(&local.region), send, doorbells)?;
        Ok(Self {
            fabric,
            sender,
            receiver,
            local: Arc::clone(&local.region),
            credit_index: local_slot / 8,
            blocked_credit: None,
            leftover: Leftover::default(),
            control,
            peer,
            peer_doorbell,
            peer_ring_offset_bytes: send.ring.offset_bytes as usize,
            _served: served,
        })
    }

    /// The control connection (the front end shuts it down to drop the client).
    pub fn control(&self) -> &TcpStream {
        &self.control
    }

    /// TEST HOOK (fault injection): writes `word` one-sidedly at the start of the peer's ring,
    /// where the first message header goes: on a connection that has sent nothing yet, the peer
    /// finds it as its next header, as if a buggy or hostile peer had written it.
    #[doc(hidden)]
    pub fn inject_ring_start_word_for_test(&mut self, word: u64) -> Result<(), ChannelError> {
        self.fabric.write_word(&self.peer, self.peer_ring_offset_bytes, word, StoreOrdering::Release)?;
        Ok(self.fabric.wake(&self.peer_doorbell, DOORBELL_OFFSET_BYTES)?)
    }

    /// TEST HOOK (fault injection): writes `word` over every word of the peer's memory this
    /// end can reach: the whole peer region it mapped for the connection, and the doorbell
    /// (bell and sleeper count), as a buggy or hostile peer could; then wakes the peer.
    #[doc(hidden)]
    pub fn overwrite_peer_memory_for_test(&mut self, word: u64) -> Result<(), ChannelError> {
        let words = self.fabric.remote_len_bytes(&self.peer) / 8;
        for index in 0..words {
            self.fabric.write_word(&self.peer, index * 8, word, StoreOrdering::Relaxed)?;
        }
        for offset in [DOORBELL_OFFSET_BYTES, DOORBELL_OFFSET_BYTES + 8] {
            self.fabric.write_word(&self.peer_doorbell, offset, word, StoreOrdering::Release)?;
        }
        Ok(self.fabric.wake(&self.peer_doorbell, DOORBELL_OFFSET_BYTES)?)
    }

    /// TEST HOOK (fault injection): sends `body` as one message, unchecked.
    #[doc(hidden)]
    pub fn send_raw_message_for_test(&mut self, body: &[u8]) -> Result<(), ChannelError> {
        Ok(self.sender.try_send(body)?)
    }
}

impl<F: FabricHandle> Channel for RingChannel<F> {
    const STREAM: bool = false;

    fn frame_bytes_max(&self) -> usize {
        self.sender.body_bytes_max()
    }

    fn send(&mut self, frames: &[u8]) -> Result<usize, ChannelError> {
        let sender = &mut self.sender;
        let sent = send_messages(frames, sender.body_bytes_max(), |message| match sender.try_send(message) {
            Ok(()) => Ok(true),
            Err(SendError::NoCredit) => Ok(false),
            Err(error) => Err(error),
        })?;
        self.blocked_credit = (sent < frames.len()).then(|| self.local.load(self.credit_index, LoadOrdering::Relaxed));
        Ok(sent)
    }

    fn receive(&mut self, mut consume: impl FnMut(&[u8]) -> usize) -> Result<bool, ChannelError> {
        if !self.leftover.offer(&mut consume) {
            return Ok(false);
        }
        let Some(message) = self.receiver.poll()? else { return Ok(false) };
        self.leftover.offer_new(message.body(), &mut consume);
        Ok(true)
    }

    fn readable(&self) -> bool {
        !self.leftover.is_empty() || self.receiver.has_pending()
    }

    fn writable(&self) -> bool {
        self.blocked_credit.is_some_and(|seen| self.local.load(self.credit_index, LoadOrdering::Relaxed) != seen)
    }

    fn check_peer(&mut self) -> Result<(), ChannelError> {
        check_control(&mut self.control)
    }
}

impl<F: FabricHandle> FabricKind<F> for Ring {
    const KIND: MediumKind = MediumKind::Ring;
    const CLIENT_SLOT_BYTES: usize = 64 + WRITEPOLL_RING_BYTES;
    const SERVER_SLOT_BYTES: usize = 64 + WRITEPOLL_RING_BYTES;
    type Client = RingChannel<F>;
    type Server = RingChannel<F>;

    fn client(link: Link<'_, F>) -> Result<RingChannel<F>, ChannelError> {
        RingChannel::build(link)
    }

    fn server(link: Link<'_, F>) -> Result<RingChannel<F>, ChannelError> {
        RingChannel::build(link)
    }
}
