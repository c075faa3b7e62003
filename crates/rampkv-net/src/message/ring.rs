//! The write-poll adapter (GET+/PUT+): per connection, a request ring in the server group's
//! region that the client writes one-sidedly, and a reply ring in the client's region that the
//! server writes (`rampkv_fabric::ring`: HydraDB's message format, credit flow control, the
//! poller's doorbell). A ring message carries one or more *whole* frames; a single frame above
//! `WRITEPOLL_MESSAGE_BYTES_MAX` is refused.
//!
//! Both sides of a connection are the same [`RingChannel`]: it sends on the peer's ring and
//! receives on its own. A connection's slot in either region (layout: `docs/fabric.md`):
//! ```text
//! +0   credit word of the ring the region's owner SENDS on (written by the peer), rest of 64
//! +64  the ring the region's owner RECEIVES on (WRITEPOLL_RING_BYTES)
//! ```
//!
//! # Fault model
//! A ring holding something no correct peer writes, a message that ends inside a frame, or a
//! corrupt credit word breaks the channel (the poller closes the connection; a client's
//! transport fails). Nothing is ever accessed outside a ring: the fabric checks every address.

use std::net::TcpStream;
use std::sync::Arc;

use rampkv_fabric::{
    LoadOrdering, RegionDescriptor, RingAddresses, RingLayout, RingReceiver, RingSender, SendError, StoreOrdering,
    Words,
};
use serde::{Deserialize, Serialize};

use super::fabric::{
    check_control, Endpoint, FabricHandle, FabricKind, MediumAccept, MediumHello, MediumKind, Refusal,
};
use super::{send_messages, Channel, ChannelError, Leftover};
use crate::item_slots::ItemRegionInfo;
use rampkv_core::limits::{WRITEPOLL_MESSAGE_BYTES_MAX, WRITEPOLL_MESSAGE_BYTES_MIN, WRITEPOLL_RING_BYTES};

/// The write-poll medium.
#[derive(Debug)]
pub struct Ring;

/// The client's hello: where its reply ring and the request ring's credit word are.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingHello {
    pub region: RegionDescriptor,
    pub reply_ring: RingLayout,
    pub doorbell_offset_bytes: u64,
    pub request_credit_offset_bytes: u64,
}

/// The server's answer: the request ring, the reply ring's credit word, and (GET\*) the
/// server's item region.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingAccept {
    pub region: RegionDescriptor,
    pub request_ring: RingLayout,
    pub doorbell_offset_bytes: u64,
    pub reply_credit_offset_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<ItemRegionInfo>,
}

const SLOT_BYTES: usize = 64 + WRITEPOLL_RING_BYTES;

fn ring_at(slot_offset_bytes: usize) -> RingLayout {
    RingLayout {
        offset_bytes: slot_offset_bytes as u64 + 64,
        ring_bytes: WRITEPOLL_RING_BYTES as u64,
        body_bytes_max: WRITEPOLL_MESSAGE_BYTES_MAX as u64,
    }
}

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
    /// The client's control connection: its end is the other side's end.
    control: TcpStream,
    /// The peer's region and the ring we write there (for the fault-injection hooks).
    peer: F::RemoteRegion,
    peer_ring: RingLayout,
    peer_doorbell_offset_bytes: usize,
    /// GET\*: the server's item region (client side, when the server has one).
    items: Option<ItemRegionInfo>,
}

impl<F: FabricHandle> std::fmt::Debug for RingChannel<F> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RingChannel").field("blocked", &self.blocked_credit.is_some()).finish()
    }
}

impl<F: FabricHandle> RingChannel<F> {
    /// The control connection (its end is the other side's end; the front end shuts it down
    /// to drop the client).
    pub fn control(&self) -> &TcpStream {
        &self.control
    }

    /// Builds one end: we receive on `own` (in `local`), send on `peer_ring` (in `peer`).
    fn build(
        local: &Endpoint<F>,
        peer: F::RemoteRegion,
        receive: RingAddresses,
        send: RingAddresses,
        control: TcpStream,
    ) -> Result<Self, ChannelError> {
        let fabric = local.fabric.clone();
        let receiver = RingReceiver::new(fabric.clone(), Arc::clone(&local.region), peer.clone(), receive)?;
        let sender = RingSender::new(fabric.clone(), peer.clone(), Arc::clone(&local.region), send)?;
        Ok(Self {
            fabric,
            sender,
            receiver,
            local: Arc::clone(&local.region),
            credit_index: send.credit_offset_bytes as usize / 8,
            blocked_credit: None,
            leftover: Leftover::default(),
            control,
            peer,
            peer_ring: send.ring,
            peer_doorbell_offset_bytes: send.receiver_doorbell_offset_bytes as usize,
            items: None,
        })
    }

    /// GET\*: the item region the server announced, if any.
    pub fn item_region(&self) -> Option<&ItemRegionInfo> {
        self.items.as_ref()
    }

    /// TEST HOOK (fault injection): writes `word` one-sidedly at the start of the peer's ring,
    /// where the first message header goes: on a connection that has sent nothing yet, the peer
    /// finds it as its next header, as if a buggy or hostile peer had written it.
    #[doc(hidden)]
    pub fn inject_ring_start_word_for_test(&mut self, word: u64) -> Result<(), ChannelError> {
        let offset = self.peer_ring.offset_bytes as usize;
        self.fabric.write_word(&self.peer, offset, word, StoreOrdering::Release)?;
        Ok(self.fabric.wake(&self.peer, self.peer_doorbell_offset_bytes)?)
    }

    /// TEST HOOK (fault injection): sends `body` as one message, unchecked (it need not hold
    /// valid frames).
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
        match self.receiver.poll()? {
            Some(message) => {
                self.leftover.offer_new(message.body(), &mut consume);
                Ok(true)
            }
            None => Ok(false),
        }
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
    const CLIENT_SLOT_BYTES: usize = SLOT_BYTES;
    const SERVER_SLOT_BYTES: usize = SLOT_BYTES;
    type Client = RingChannel<F>;
    type Server = RingChannel<F>;
    type Hello = RingHello;
    type Accept = RingAccept;

    fn hello(client: &Endpoint<F>, slot_offset_bytes: usize) -> RingHello {
        RingHello {
            region: client.descriptor.clone(),
            reply_ring: ring_at(slot_offset_bytes),
            doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
            request_credit_offset_bytes: slot_offset_bytes as u64,
        }
    }

    fn wrap_hello(hello: RingHello) -> MediumHello {
        MediumHello::Ring(hello)
    }

    fn wrap_accept(accept: RingAccept) -> MediumAccept {
        MediumAccept::Ring(accept)
    }

    fn unwrap_accept(accept: MediumAccept) -> Option<RingAccept> {
        match accept {
            MediumAccept::Ring(accept) => Some(accept),
            _ => None,
        }
    }

    fn connect(
        client: &Endpoint<F>,
        hello: RingHello,
        accept: RingAccept,
        control: TcpStream,
    ) -> Result<RingChannel<F>, ChannelError> {
        let server = client.fabric.map(&accept.region)?;
        let receive = RingAddresses {
            ring: hello.reply_ring,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            credit_offset_bytes: accept.reply_credit_offset_bytes,
            sender_doorbell_offset_bytes: accept.doorbell_offset_bytes,
        };
        let send = RingAddresses {
            ring: accept.request_ring,
            receiver_doorbell_offset_bytes: accept.doorbell_offset_bytes,
            credit_offset_bytes: hello.request_credit_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        };
        // Our reply ring is fresh and the server writes it only in answer to a request, so
        // building the receiver (which zeroes it) after the handshake is in time.
        let mut channel = RingChannel::build(client, server, receive, send, control)?;
        channel.items = accept.items;
        Ok(channel)
    }

    fn accept(
        server: &Endpoint<F>,
        slot_offset_bytes: usize,
        hello: RingHello,
        control: TcpStream,
        items: Option<ItemRegionInfo>,
    ) -> Result<(RingChannel<F>, RingAccept), Refusal> {
        if hello.reply_ring.body_bytes_max < WRITEPOLL_MESSAGE_BYTES_MIN as u64 {
            return Err(Refusal::MessagesTooSmall { bytes_min: WRITEPOLL_MESSAGE_BYTES_MIN as u64 });
        }
        let client = server.fabric.map(&hello.region).map_err(Refusal::region)?;
        let request_ring = ring_at(slot_offset_bytes);
        let receive = RingAddresses {
            ring: request_ring,
            receiver_doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
            credit_offset_bytes: hello.request_credit_offset_bytes,
            sender_doorbell_offset_bytes: hello.doorbell_offset_bytes,
        };
        let send = RingAddresses {
            ring: hello.reply_ring,
            receiver_doorbell_offset_bytes: hello.doorbell_offset_bytes,
            credit_offset_bytes: slot_offset_bytes as u64,
            sender_doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
        };
        let channel = RingChannel::build(server, client, receive, send, control).map_err(Refusal::layout)?;
        let accept = RingAccept {
            region: server.descriptor.clone(),
            request_ring,
            doorbell_offset_bytes: Endpoint::<F>::DOORBELL_OFFSET_BYTES,
            reply_credit_offset_bytes: slot_offset_bytes as u64,
            items,
        };
        Ok((channel, accept))
    }
}
