//! Message rings: the GET+/PUT+ message buffers (HydraDB format, as in the paper), with credit
//! flow control and a cross-process doorbell.
//!
//! # Roles and memory
//! Per connection and direction, the **receiver** owns a ring in its own region; the
//! **sender** writes frames into it one-sidedly. The sender owns a **credit word** in its own
//! region, into which the receiver writes, one-sidedly, how many stream bytes it has consumed.
//! Each **poller** (a thread serving many connections) owns one **doorbell** in its region,
//! shared by all its rings. So a sender reads credit from local memory (no round trip), and
//! the receiver writes it back lazily, in batches.
//!
//! # Format
//! The stream position `p` counts bytes ever sent on the ring; a frame at `p` starts at ring
//! offset `p % ring_bytes`. Little-endian words:
//! ```text
//! frame:   +0           header  bits 0..32  body length in bytes (<= body_bytes_max)
//!                               bits 32..62 tag = (p / 8) mod 2^30 (stale or desynchronised
//!                                           headers fail the check)
//!                               bit 62      WRAP (0 in a frame)
//!                               bit 63      NEW (always 1: a zero word means "nothing")
//!          +8           body, zero-padded to pad8(length)
//!          +8+pad8(len) trailer = header XOR TRAILER_MAGIC (transfer complete)
//! wrap:    +0           header with NEW | WRAP | tag and length 0: the sender skipped the
//!                       rest of the ring (the frame did not fit); continue at offset 0
//! credit:  one word in the sender's region: stream bytes consumed (monotonic, 8-aligned)
//! doorbell: +0 bell (a counter; its low 32 bits are the futex word)
//!           +8 sleepers (threads blocked, or about to block, on this doorbell)
//! ```
//!
//! # Protocol
//! Sender: needs `sent - consumed + frame (+ wrap) <= ring_bytes` (else `NoCredit`); stores
//! header (relaxed), body (relaxed), trailer (**release**). The release store is the second
//! write on the connection, which RDMA orders after the first; the bytes inside one write are
//! never assumed ordered.
//! Receiver: loads the header at its head (acquire); zero means nothing yet. It checks NEW,
//! tag, length (`<= body_bytes_max`, inside the ring) and refuses anything else as `Corrupt`
//! (the caller closes the connection): never an access outside the ring. Then it loads the
//! trailer (acquire): zero means "still in transfer", the expected value means complete,
//! anything else is `Corrupt`. It copies the body out with atomic loads (a peer may still
//! write that memory), zeroes the frame (the paper's "reinitialise"), and advances. Once a
//! quarter of the ring is freed, or when it finds the ring empty, it writes its consumed count
//! to the credit word (**release**, after the zeroing; the sender loads it with acquire), so
//! the sender never overwrites unconsumed bytes and never sees stale ones.
//! Doorbell: a waiter spins `DOORBELL_SPIN_ITERATIONS` times, then increments `sleepers`, runs
//! a SeqCst fence, loads `bell` (acquire), re-checks its condition and futex-waits on `bell`
//! until the deadline. A notifier (after its release store) runs a SeqCst fence and loads
//! `sleepers`; only if non-zero does it increment `bell` and wake. The two fences make it
//! impossible that the waiter misses the data *and* the notifier misses the sleeper, and no
//! message costs a syscall while the receiver is awake.

use crate::fabric::{FabricError, OneSided};
use crate::limits::{
    DOORBELL_SPIN_ITERATIONS, RING_BYTES_MAX, RING_BYTES_MIN, RING_CREDIT_RETURN_DIVISOR, RING_TAG_BITS, WORD_BYTES,
};
use crate::words::{check_range, padded_bytes, FenceOrdering, LoadOrdering, StoreOrdering, Words};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

const HEADER_LENGTH_MASK: u64 = 0xFFFF_FFFF;
const HEADER_TAG_SHIFT: u32 = 32;
const HEADER_TAG_MASK: u64 = (1 << RING_TAG_BITS) - 1;
const HEADER_WRAP_BIT: u64 = 1 << 62;
const HEADER_NEW_BIT: u64 = 1 << 63;
/// Bit 63 clear, so a trailer (header has bit 63 set) is never zero and never equals its
/// header.
const TRAILER_MAGIC: u64 = 0x2F6B_9A1C_D3E4_5F87;

/// Bytes of a doorbell (bell word, sleepers word).
pub const DOORBELL_BYTES: usize = 16;
/// Bytes of a credit word.
pub const CREDIT_BYTES: usize = 8;
/// Framing bytes around a body (header and trailer).
pub const FRAME_OVERHEAD_BYTES: usize = 16;

/// Bytes a frame with a body of `body_bytes` occupies in a ring.
pub const fn frame_bytes(body_bytes: usize) -> usize {
    FRAME_OVERHEAD_BYTES + padded_bytes(body_bytes)
}

fn tag(stream_bytes: u64) -> u64 {
    (stream_bytes / WORD_BYTES as u64) & HEADER_TAG_MASK
}

fn frame_header(body_bytes: usize, stream_bytes: u64) -> u64 {
    HEADER_NEW_BIT | (tag(stream_bytes) << HEADER_TAG_SHIFT) | body_bytes as u64
}

fn wrap_header(stream_bytes: u64) -> u64 {
    HEADER_NEW_BIT | HEADER_WRAP_BIT | (tag(stream_bytes) << HEADER_TAG_SHIFT)
}

fn trailer_of(header: u64) -> u64 {
    header ^ TRAILER_MAGIC
}

/// Where a ring lies in its receiver's region, and the largest body it carries. Agreed over
/// the control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingLayout {
    /// Offset of the ring in the receiver's region (8-aligned).
    pub offset_bytes: u64,
    /// Ring length, a multiple of 8 in `RING_BYTES_MIN..=RING_BYTES_MAX`.
    pub ring_bytes: u64,
    /// Largest body; `frame_bytes(body_bytes_max) <= ring_bytes`. Larger sends are refused.
    pub body_bytes_max: u64,
}

/// Everything both ends of one ring need to know, agreed over the control channel: the ring
/// and the receiver's doorbell live in the receiver's region, the credit word and the sender's
/// doorbell in the sender's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingAddresses {
    /// The ring, in the receiver's region.
    pub ring: RingLayout,
    /// The receiver's poller doorbell, in the receiver's region.
    pub receiver_doorbell_offset_bytes: u64,
    /// The credit word, in the sender's region.
    pub credit_offset_bytes: u64,
    /// The sender's poller doorbell, in the sender's region (rung when credit comes back).
    pub sender_doorbell_offset_bytes: u64,
}

/// Where the two pollers' doorbells of a connection live when not in the regions that hold its
/// ring and credit word (the default, `Doorbells::default()`). A server that gives every
/// connection a region of its own keeps its poller's one doorbell in a region of its own, which
/// every peer maps: the offsets in [`RingAddresses`] and [`crate::QueueAddresses`] then refer to
/// these regions. (RDMA connections with their own registrations share one completion channel
/// the same way.)
#[derive(Debug, Clone)]
pub struct Doorbells<R, L> {
    /// The peer's doorbell region (None: the peer's region that holds the ring or credit word).
    pub remote: Option<R>,
    /// This side's doorbell region (None: this side's region).
    pub local: Option<L>,
}

impl<R, L> Default for Doorbells<R, L> {
    fn default() -> Self {
        Self { remote: None, local: None }
    }
}

/// The doorbell region: the override if there is one, else the ring's own region.
pub(crate) fn doorbell_region<'a, T>(over: &'a Option<T>, default: &'a T) -> &'a T {
    over.as_ref().unwrap_or(default)
}

/// The lengths of the regions holding the peer's doorbell and ours (`remote`, `local`: the
/// regions of the ring or queue, where the doorbells are unless `doorbells` says otherwise).
pub(crate) fn doorbell_region_lengths<F: OneSided, L: Words>(
    fabric: &F,
    doorbells: &Doorbells<F::RemoteRegion, L>,
    remote: &F::RemoteRegion,
    local: &L,
) -> (usize, usize) {
    let remote_len_bytes = fabric.remote_len_bytes(doorbell_region(&doorbells.remote, remote));
    (remote_len_bytes, doorbell_region(&doorbells.local, local).len_words() * WORD_BYTES)
}

/// Errors of ring set-up and of the receiver.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// Addresses that do not fit the regions or break a layout rule.
    #[error("invalid ring layout: {reason}")]
    InvalidLayout {
        /// Which rule.
        reason: &'static str,
    },
    /// The ring holds something no correct sender writes. The connection must be closed.
    #[error("corrupt ring at stream byte {stream_bytes}: {reason} (header {header:#018x})")]
    Corrupt {
        /// Stream position of the bad frame.
        stream_bytes: u64,
        /// The header word found.
        header: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A fabric operation failed (cannot happen with validated addresses; kept as a value).
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Errors of the sender.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Not enough credit now: the receiver has not freed enough of the ring. Try later.
    #[error("no credit")]
    NoCredit,
    /// The body exceeds the ring's `body_bytes_max`. Nothing was written.
    #[error("body of {body_bytes} bytes exceeds the maximum {body_bytes_max}")]
    TooLarge {
        /// Body length.
        body_bytes: usize,
        /// The ring's maximum.
        body_bytes_max: usize,
    },
    /// The credit word holds a value no correct receiver writes (backwards, past what was
    /// sent, or misaligned). The connection must be closed.
    #[error("corrupt credit {credit_bytes} (sent {sent_bytes}, last credit {consumed_bytes})")]
    CreditCorrupt {
        /// Value found.
        credit_bytes: u64,
        /// Bytes sent so far.
        sent_bytes: u64,
        /// Last valid credit.
        consumed_bytes: u64,
    },
    /// `send` found no credit before its deadline.
    #[error("timed out waiting for credit")]
    Timeout,
    /// A fabric operation failed (cannot happen with validated addresses; kept as a value).
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// A doorbell wait ran out of time.
#[non_exhaustive]
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WaitError {
    /// The condition did not become true before the deadline.
    #[error("timed out")]
    Timeout,
}

/// Validated, in-word form of a [`RingLayout`].
#[derive(Clone, Copy, Debug)]
struct Ring {
    first_index: usize,
    ring_bytes: u64,
    body_bytes_max: usize,
}

impl Ring {
    fn new(layout: RingLayout, region_len_bytes: usize) -> Result<Self, RingError> {
        let invalid = |reason| Err(RingError::InvalidLayout { reason });
        let (Ok(offset), Ok(ring_bytes), Ok(body_bytes_max)) = (
            usize::try_from(layout.offset_bytes),
            usize::try_from(layout.ring_bytes),
            usize::try_from(layout.body_bytes_max),
        ) else {
            return invalid("field does not fit in usize");
        };
        if offset % WORD_BYTES != 0 || ring_bytes % WORD_BYTES != 0 {
            return invalid("ring offset and length must be multiples of 8");
        }
        if !(RING_BYTES_MIN..=RING_BYTES_MAX).contains(&ring_bytes) {
            return invalid("ring length outside RING_BYTES_MIN..=RING_BYTES_MAX");
        }
        if body_bytes_max > HEADER_LENGTH_MASK as usize || frame_bytes(body_bytes_max) > ring_bytes {
            return invalid("a frame of body_bytes_max must fit in the ring");
        }
        match offset.checked_add(ring_bytes) {
            Some(end) if end <= region_len_bytes => {}
            _ => return invalid("ring does not fit in the receiver's region"),
        }
        Ok(Self { first_index: offset / WORD_BYTES, ring_bytes: ring_bytes as u64, body_bytes_max })
    }

    fn position_bytes(&self, stream_bytes: u64) -> u64 {
        stream_bytes % self.ring_bytes
    }
}

fn check_words(region_len_bytes: usize, offset_bytes: u64, len_bytes: usize) -> Result<usize, RingError> {
    let offset = usize::try_from(offset_bytes)
        .map_err(|_| RingError::InvalidLayout { reason: "offset does not fit in usize" })?;
    if offset % WORD_BYTES != 0 {
        return Err(RingError::InvalidLayout { reason: "doorbell and credit offsets must be multiples of 8" });
    }
    match offset.checked_add(len_bytes) {
        Some(end) if end <= region_len_bytes => Ok(offset),
        _ => Err(RingError::InvalidLayout { reason: "doorbell or credit word outside its region" }),
    }
}

/// Notifies a remote doorbell, after the caller's release store of the data: SeqCst fence,
/// then only if someone sleeps there, bump the bell and wake. `fence_memory` is any local
/// memory (it supplies the fence, so that loom can check this too).
pub(crate) fn notify<F: OneSided, L: Words + ?Sized>(
    fabric: &F,
    remote: &F::RemoteRegion,
    doorbell_offset_bytes: usize,
    fence_memory: &L,
) -> Result<(), FabricError> {
    fence_memory.fence(FenceOrdering::SeqCst);
    if fabric.read_word(remote, doorbell_offset_bytes + WORD_BYTES, LoadOrdering::Relaxed)? != 0 {
        fabric.fetch_add(remote, doorbell_offset_bytes, 1)?;
        fabric.wake(remote, doorbell_offset_bytes)?;
    }
    Ok(())
}

/// A poller's doorbell: one word pair in its own region that every sender to this poller
/// notifies, so that one thread can block for all its connections at once.
#[derive(Debug)]
pub struct Doorbell<L> {
    region: L,
    bell_index: usize,
}

impl<L: Words> Doorbell<L> {
    /// The doorbell at `offset_bytes` (8-aligned, `DOORBELL_BYTES` long) of the local `region`.
    ///
    /// # Errors
    /// `Misaligned` or `OutOfBounds`.
    pub fn new(region: L, offset_bytes: usize) -> Result<Self, FabricError> {
        let bell_index = check_range(&region, offset_bytes, DOORBELL_BYTES)?;
        Ok(Self { region, bell_index })
    }

    /// Returns once `ready()` is true: spins `DOORBELL_SPIN_ITERATIONS` times, then blocks on
    /// the doorbell (woken by any sender to this poller), re-checking after every wake.
    ///
    /// `ready` must only look at memory that notifiers write *before* notifying (ring headers,
    /// credit words). It may be called many times.
    ///
    /// # Errors
    /// `Timeout` if `ready()` is still false after `timeout`.
    pub fn wait_until(&self, mut ready: impl FnMut() -> bool, timeout: Duration) -> Result<(), WaitError> {
        for _ in 0..DOORBELL_SPIN_ITERATIONS {
            if ready() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let deadline = Instant::now() + timeout;
        let sleepers_index = self.bell_index + 1;
        self.region.fetch_add(sleepers_index, 1);
        self.region.fence(FenceOrdering::SeqCst);
        let outcome = loop {
            // Acquire: a bell value bumped by a notifier brings its data along, so the check
            // below sees it, and a bump after this load changes the futex word: no lost wake.
            let observed = self.region.load(self.bell_index, LoadOrdering::Acquire);
            if ready() {
                break Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(WaitError::Timeout);
            }
            self.region.wait_while_equal(self.bell_index, observed as u32, deadline - now);
        };
        self.region.fetch_add(sleepers_index, u64::MAX); // wrapping -1
        outcome
    }
}

/// The sending end of a ring. Writes into the receiver's region; reads credit from its own.
#[derive(Debug)]
pub struct RingSender<F: OneSided, L> {
    fabric: F,
    receiver: F::RemoteRegion,
    local: L,
    ring: Ring,
    receiver_doorbell_offset_bytes: usize,
    credit_index: usize,
    sender_doorbell_offset_bytes: usize,
    doorbells: Doorbells<F::RemoteRegion, L>,
    sent_bytes: u64,
    consumed_bytes: u64,
}

impl<F: OneSided, L: Words> RingSender<F, L> {
    /// The sender of the ring at `addresses` in the (mapped) `receiver` region; `local` is the
    /// sender's own region (credit word, doorbell). Resets the credit word to zero.
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn new(fabric: F, receiver: F::RemoteRegion, local: L, addresses: RingAddresses) -> Result<Self, RingError> {
        Self::with_doorbells(fabric, receiver, local, addresses, Doorbells::default())
    }

    /// [`RingSender::new`] with the doorbells in the regions `doorbells` names (the offsets in
    /// `addresses` then refer to those).
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn with_doorbells(
        fabric: F,
        receiver: F::RemoteRegion,
        local: L,
        addresses: RingAddresses,
        doorbells: Doorbells<F::RemoteRegion, L>,
    ) -> Result<Self, RingError> {
        let receiver_len_bytes = fabric.remote_len_bytes(&receiver);
        let local_len_bytes = local.len_words() * WORD_BYTES;
        let ring = Ring::new(addresses.ring, receiver_len_bytes)?;
        let (receiver_doorbell_len_bytes, sender_doorbell_len_bytes) =
            doorbell_region_lengths(&fabric, &doorbells, &receiver, &local);
        let receiver_doorbell =
            check_words(receiver_doorbell_len_bytes, addresses.receiver_doorbell_offset_bytes, DOORBELL_BYTES)?;
        let credit = check_words(local_len_bytes, addresses.credit_offset_bytes, CREDIT_BYTES)?;
        let sender_doorbell =
            check_words(sender_doorbell_len_bytes, addresses.sender_doorbell_offset_bytes, DOORBELL_BYTES)?;
        let credit_index = credit / WORD_BYTES;
        local.store(credit_index, 0, StoreOrdering::Release);
        Ok(Self {
            fabric,
            receiver,
            local,
            ring,
            receiver_doorbell_offset_bytes: receiver_doorbell,
            credit_index,
            sender_doorbell_offset_bytes: sender_doorbell,
            doorbells,
            sent_bytes: 0,
            consumed_bytes: 0,
        })
    }

    /// Bytes written but not yet known to be consumed; never above the ring length.
    pub fn in_flight_bytes(&self) -> u64 {
        self.sent_bytes - self.consumed_bytes
    }

    /// Largest body this ring carries.
    pub fn body_bytes_max(&self) -> usize {
        self.ring.body_bytes_max
    }

    /// The credit word as it is now (one local load): a sender that found no credit waits for
    /// it to change.
    pub fn credit_word(&self) -> u64 {
        self.local.load(self.credit_index, LoadOrdering::Relaxed)
    }

    /// Bytes this send needs: the frame, plus the rest of the ring if it must wrap first.
    fn needed_bytes(&self, body_bytes: usize) -> (u64, u64) {
        let frame = frame_bytes(body_bytes) as u64;
        let position = self.ring.position_bytes(self.sent_bytes);
        let wrap = if position + frame > self.ring.ring_bytes { self.ring.ring_bytes - position } else { 0 };
        (wrap, frame)
    }

    /// Reloads the credit word, checking it as input from outside.
    fn refresh_credit(&mut self) -> Result<(), SendError> {
        let credit_bytes = self.local.load(self.credit_index, LoadOrdering::Acquire);
        if credit_bytes < self.consumed_bytes || credit_bytes > self.sent_bytes || credit_bytes % WORD_BYTES as u64 != 0
        {
            return Err(SendError::CreditCorrupt {
                credit_bytes,
                sent_bytes: self.sent_bytes,
                consumed_bytes: self.consumed_bytes,
            });
        }
        self.consumed_bytes = credit_bytes;
        Ok(())
    }

    /// Sends `body` if the credit allows it now, and notifies the receiver's poller if it
    /// sleeps. Never blocks.
    ///
    /// # Errors
    /// `TooLarge` (nothing written), `NoCredit` (nothing written; retry later),
    /// `CreditCorrupt` (close the connection).
    pub fn try_send(&mut self, body: &[u8]) -> Result<(), SendError> {
        if body.len() > self.ring.body_bytes_max {
            return Err(SendError::TooLarge { body_bytes: body.len(), body_bytes_max: self.ring.body_bytes_max });
        }
        let (wrap, frame) = self.needed_bytes(body.len());
        if self.in_flight_bytes() + wrap + frame > self.ring.ring_bytes {
            self.refresh_credit()?;
            if self.in_flight_bytes() + wrap + frame > self.ring.ring_bytes {
                return Err(SendError::NoCredit);
            }
        }
        let ring_offset = self.ring.first_index * WORD_BYTES;
        if wrap > 0 {
            let position = self.ring.position_bytes(self.sent_bytes) as usize;
            let header = wrap_header(self.sent_bytes);
            self.fabric.write_word(&self.receiver, ring_offset + position, header, StoreOrdering::Release)?;
            self.sent_bytes += wrap;
        }
        let base = ring_offset + self.ring.position_bytes(self.sent_bytes) as usize;
        let header = frame_header(body.len(), self.sent_bytes);
        self.fabric.write_word(&self.receiver, base, header, StoreOrdering::Relaxed)?;
        if !body.is_empty() {
            self.fabric.write(&self.receiver, base + WORD_BYTES, body)?;
        }
        let trailer_offset = base + WORD_BYTES + padded_bytes(body.len());
        self.fabric.write_word(&self.receiver, trailer_offset, trailer_of(header), StoreOrdering::Release)?;
        self.sent_bytes += frame;
        assert!(self.in_flight_bytes() <= self.ring.ring_bytes, "credit exceeded");
        self.notify_receiver()?;
        Ok(())
    }

    /// Rings the receiver's doorbell if its poller sleeps, as every send does: for a sender that
    /// publishes something else the receiver waits for (a release store into memory the
    /// receiver reads, e.g. an RF-RPC reply slot) and must wake it.
    ///
    /// # Errors
    /// `Fabric` only (addresses were validated).
    pub fn notify_receiver(&self) -> Result<(), FabricError> {
        let doorbell = doorbell_region(&self.doorbells.remote, &self.receiver);
        notify(&self.fabric, doorbell, self.receiver_doorbell_offset_bytes, &self.local)
    }

    /// Sends `body`, waiting on the sender's own doorbell for credit if needed.
    ///
    /// # Errors
    /// As `try_send`, and `Timeout` if no credit came within `timeout`.
    pub fn send(&mut self, body: &[u8], timeout: Duration) -> Result<(), SendError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_send(body) {
                Err(SendError::NoCredit) => {}
                other => return other,
            }
            let (wrap, frame) = self.needed_bytes(body.len());
            let required = (self.sent_bytes + wrap + frame).saturating_sub(self.ring.ring_bytes);
            let region = doorbell_region(&self.doorbells.local, &self.local);
            let doorbell = Doorbell { region, bell_index: self.sender_doorbell_offset_bytes / WORD_BYTES };
            let credit_index = self.credit_index;
            let remaining = deadline.saturating_duration_since(Instant::now());
            doorbell
                .wait_until(|| self.local.load(credit_index, LoadOrdering::Acquire) >= required, remaining)
                .map_err(|WaitError::Timeout| SendError::Timeout)?;
        }
    }
}

/// A received message; borrows the receiver until dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageView<'a> {
    body: &'a [u8],
    stream_bytes: u64,
}

impl<'a> MessageView<'a> {
    /// The message body (copied out of the ring).
    pub fn body(&self) -> &'a [u8] {
        self.body
    }
    /// Stream position of the frame (bytes sent on this ring before it).
    pub fn stream_bytes(&self) -> u64 {
        self.stream_bytes
    }
}

/// The receiving end of a ring. Polls its own region; returns credit into the sender's.
#[derive(Debug)]
pub struct RingReceiver<F: OneSided, L> {
    fabric: F,
    local: L,
    sender: F::RemoteRegion,
    ring: Ring,
    credit_offset_bytes: usize,
    sender_doorbell_offset_bytes: usize,
    doorbells: Doorbells<F::RemoteRegion, L>,
    consumed_bytes: u64,
    returned_bytes: u64,
    body: Vec<u8>,
}

enum Decoded {
    Wrap,
    Frame { body_bytes: usize },
}

impl<F: OneSided, L: Words> RingReceiver<F, L> {
    /// The receiver of the ring at `addresses` in its own `local` region; `sender` is the
    /// sender's (mapped) region. Zeroes the ring: build the receiver before telling the sender
    /// where the ring is. Allocates its body buffer (`body_bytes_max`) here, once.
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn new(fabric: F, local: L, sender: F::RemoteRegion, addresses: RingAddresses) -> Result<Self, RingError> {
        Self::with_doorbells(fabric, local, sender, addresses, Doorbells::default())
    }

    /// [`RingReceiver::new`] with the doorbells in the regions `doorbells` names (the offsets in
    /// `addresses` then refer to those).
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn with_doorbells(
        fabric: F,
        local: L,
        sender: F::RemoteRegion,
        addresses: RingAddresses,
        doorbells: Doorbells<F::RemoteRegion, L>,
    ) -> Result<Self, RingError> {
        let local_len_bytes = local.len_words() * WORD_BYTES;
        let sender_len_bytes = fabric.remote_len_bytes(&sender);
        let ring = Ring::new(addresses.ring, local_len_bytes)?;
        let (sender_doorbell_len_bytes, receiver_doorbell_len_bytes) =
            doorbell_region_lengths(&fabric, &doorbells, &sender, &local);
        check_words(receiver_doorbell_len_bytes, addresses.receiver_doorbell_offset_bytes, DOORBELL_BYTES)?;
        let credit = check_words(sender_len_bytes, addresses.credit_offset_bytes, CREDIT_BYTES)?;
        let sender_doorbell =
            check_words(sender_doorbell_len_bytes, addresses.sender_doorbell_offset_bytes, DOORBELL_BYTES)?;
        for index in ring.first_index..ring.first_index + ring.ring_bytes as usize / WORD_BYTES {
            local.store(index, 0, StoreOrdering::Relaxed);
        }
        local.fence(FenceOrdering::Release);
        Ok(Self {
            fabric,
            local,
            sender,
            ring,
            credit_offset_bytes: credit,
            sender_doorbell_offset_bytes: sender_doorbell,
            doorbells,
            consumed_bytes: 0,
            returned_bytes: 0,
            body: vec![0; ring.body_bytes_max],
        })
    }

    fn head_index(&self) -> usize {
        self.ring.first_index + self.ring.position_bytes(self.consumed_bytes) as usize / WORD_BYTES
    }

    /// Whether something (a frame, possibly still in transfer, or garbage) is at the head.
    /// Cheap: one load. Meant for a poller's doorbell condition.
    pub fn has_pending(&self) -> bool {
        self.local.load(self.head_index(), LoadOrdering::Relaxed) != 0
    }

    fn decode(&self, header: u64) -> Result<Decoded, RingError> {
        let corrupt = |reason| Err(RingError::Corrupt { stream_bytes: self.consumed_bytes, header, reason });
        if header & HEADER_NEW_BIT == 0 {
            return corrupt("new-message bit clear");
        }
        if (header >> HEADER_TAG_SHIFT) & HEADER_TAG_MASK != tag(self.consumed_bytes) {
            return corrupt("tag does not match the stream position");
        }
        let body_bytes = (header & HEADER_LENGTH_MASK) as usize;
        let position = self.ring.position_bytes(self.consumed_bytes);
        if header & HEADER_WRAP_BIT != 0 {
            if body_bytes != 0 || position == 0 {
                return corrupt("wrap marker with a length or at the ring start");
            }
            return Ok(Decoded::Wrap);
        }
        if body_bytes > self.ring.body_bytes_max {
            return corrupt("length above body_bytes_max");
        }
        if position + frame_bytes(body_bytes) as u64 > self.ring.ring_bytes {
            return corrupt("frame crosses the ring end");
        }
        Ok(Decoded::Frame { body_bytes })
    }

    /// The next complete message, if any. Its body is copied out and its ring space zeroed and
    /// freed before this returns (the copy is needed anyway: a peer may write ring memory at
    /// any time, so it is never lent out as `&[u8]`); the view borrows the receiver's buffer.
    /// Credit goes back to the sender in batches, and at once when the ring is found empty.
    ///
    /// # Errors
    /// `Corrupt` if the ring holds something no correct sender writes: close the connection.
    pub fn poll(&mut self) -> Result<Option<MessageView<'_>>, RingError> {
        // At most a wrap marker, then a frame at the ring start.
        for _ in 0..2 {
            let head = self.head_index();
            let header = self.local.load(head, LoadOrdering::Acquire);
            if header == 0 {
                self.flush_credit()?;
                return Ok(None);
            }
            let body_bytes = match self.decode(header)? {
                Decoded::Wrap => {
                    // Everything after the marker up to the ring end was zeroed when it was
                    // last consumed, so only the marker needs clearing.
                    self.local.store(head, 0, StoreOrdering::Relaxed);
                    let position = self.ring.position_bytes(self.consumed_bytes);
                    self.consumed_bytes += self.ring.ring_bytes - position;
                    continue;
                }
                Decoded::Frame { body_bytes } => body_bytes,
            };
            let trailer_index = head + 1 + padded_bytes(body_bytes) / WORD_BYTES;
            let trailer = self.local.load(trailer_index, LoadOrdering::Acquire);
            if trailer == 0 {
                self.flush_credit()?;
                return Ok(None); // still in transfer
            }
            if trailer != trailer_of(header) {
                return Err(RingError::Corrupt {
                    stream_bytes: self.consumed_bytes,
                    header,
                    reason: "trailer does not match the header",
                });
            }
            self.local.copy_out(head + 1, &mut self.body[..body_bytes]);
            for index in head..=trailer_index {
                self.local.store(index, 0, StoreOrdering::Relaxed);
            }
            let stream_bytes = self.consumed_bytes;
            self.consumed_bytes += frame_bytes(body_bytes) as u64;
            if self.consumed_bytes - self.returned_bytes >= self.ring.ring_bytes / RING_CREDIT_RETURN_DIVISOR as u64 {
                self.flush_credit()?;
            }
            return Ok(Some(MessageView { body: &self.body[..body_bytes], stream_bytes }));
        }
        Err(RingError::Corrupt { stream_bytes: self.consumed_bytes, header: 0, reason: "two wrap markers in a row" })
    }

    /// Writes the consumed count to the sender's credit word (release: after the zeroing of
    /// what it frees) and notifies the sender's doorbell if it sleeps. Called by `poll`; call
    /// it before blocking if you stop polling for other reasons.
    ///
    /// # Errors
    /// `Fabric` only (addresses were validated).
    pub fn flush_credit(&mut self) -> Result<(), RingError> {
        if self.consumed_bytes == self.returned_bytes {
            return Ok(());
        }
        self.fabric.write_word(&self.sender, self.credit_offset_bytes, self.consumed_bytes, StoreOrdering::Release)?;
        self.returned_bytes = self.consumed_bytes;
        let doorbell = doorbell_region(&self.doorbells.remote, &self.sender);
        notify(&self.fabric, doorbell, self.sender_doorbell_offset_bytes, &self.local)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::fabric::Access;
    use crate::memory::{MemoryFabric, MemoryRemoteRegion};
    use crate::words::loom_words::LoomWords;
    use std::sync::Arc;

    // Receiver region: ring (32 bytes) + doorbell. Sender region: credit + doorbell.
    const ADDRESSES: RingAddresses = RingAddresses {
        ring: RingLayout { offset_bytes: 0, ring_bytes: 32, body_bytes_max: 8 },
        receiver_doorbell_offset_bytes: 32,
        credit_offset_bytes: 0,
        sender_doorbell_offset_bytes: 8,
    };

    /// Attempts each side makes per step. Bounded so that the model is finite (an unbounded
    /// poll loop lets a relaxed load return the old value forever).
    const TRIES: usize = 3;

    /// Three messages through a ring that holds one frame at a time, so every send after the
    /// first waits for credit, and both later ones wrap. The sender gives up after `TRIES`
    /// refusals; the receiver polls `TRIES` times per message while the sender runs, then
    /// drains after joining it. Everything sent arrives exactly once, in order and whole, and
    /// nothing else; the sender's in-flight bytes never exceed the ring.
    #[test]
    fn loom_ring_delivers_in_order_without_loss_or_overwrite() {
        // Over all executions (std atomics: outside the model), to show the model exercises
        // the credit path and concurrent delivery, not only a sequential run.
        use std::sync::atomic::{AtomicU64 as Count, Ordering::Relaxed};
        static EXECUTIONS: Count = Count::new(0);
        static NO_CREDIT: Count = Count::new(0);
        static RECEIVED_CONCURRENTLY: Count = Count::new(0);
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(|| {
            EXECUTIONS.fetch_add(1, Relaxed);
            let receiver_memory = Arc::new(LoomWords::new(6));
            let sender_memory = Arc::new(LoomWords::new(3));
            let messages: [&[u8]; 3] = [b"ABCDEFGH", b"xyz", b""];
            let receiver_remote = MemoryRemoteRegion::new(Arc::clone(&receiver_memory), Access::ReadWrite);
            let sender_remote = MemoryRemoteRegion::new(Arc::clone(&sender_memory), Access::ReadWrite);
            let mut receiver =
                RingReceiver::new(MemoryFabric::<LoomWords>::new(), receiver_memory, sender_remote, ADDRESSES).unwrap();
            let sender_thread = loom::thread::spawn(move || {
                let mut sender =
                    RingSender::new(MemoryFabric::<LoomWords>::new(), receiver_remote, sender_memory, ADDRESSES)
                        .unwrap();
                let mut sent = 0;
                'messages: for message in messages {
                    for attempt in 1..=TRIES {
                        match sender.try_send(message) {
                            Ok(()) => break,
                            Err(SendError::NoCredit) if attempt < TRIES => {
                                NO_CREDIT.fetch_add(1, Relaxed);
                                loom::thread::yield_now();
                            }
                            Err(SendError::NoCredit) => break 'messages,
                            Err(other) => panic!("{other}"),
                        }
                    }
                    assert!(sender.in_flight_bytes() <= 32);
                    sent += 1;
                }
                sent
            });
            let mut received = 0;
            for _ in 0..messages.len() * TRIES {
                match receiver.poll().unwrap() {
                    Some(view) => {
                        assert_eq!(view.body(), messages[received]);
                        received += 1;
                        RECEIVED_CONCURRENTLY.fetch_add(1, Relaxed);
                    }
                    None => loom::thread::yield_now(),
                }
            }
            let sent = sender_thread.join().unwrap();
            while let Some(view) = receiver.poll().unwrap() {
                assert!(received < sent, "a message arrived that was not sent");
                assert_eq!(view.body(), messages[received]);
                received += 1;
            }
            assert_eq!(received, sent, "a sent message was lost");
        });
        let (executions, refused, concurrent) =
            (EXECUTIONS.load(Relaxed), NO_CREDIT.load(Relaxed), RECEIVED_CONCURRENTLY.load(Relaxed));
        println!(
            "loom ring model: {executions} executions, {refused} sends refused for lack of credit, \
             {concurrent} messages received while the sender ran"
        );
        assert!(refused > 0 && concurrent > 0);
    }
}
