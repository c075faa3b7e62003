//! Two-sided send/recv, emulated: posted receive buffers and a completion queue, as RDMA's
//! SEND/RECV verbs on a reliable connection.
//!
//! # What it stands for
//! With RDMA SEND the **receiver's CPU takes part**: it must post receive work requests
//! (`ibv_post_recv`, each naming a buffer of its own memory) before anything can arrive; the
//! NIC places each incoming message into the next posted buffer, in order, and appends a
//! completion (work-request id, byte length, status) to the receiver's completion queue; the
//! receiver polls the queue, processes the message and posts the buffer again. A message that
//! finds no posted buffer is a *receiver-not-ready* (RNR) error the sending NIC retries; a
//! message larger than the posted buffer is a *local length error*.
//!
//! There is no NIC and no target CPU here, so the sender's thread plays the receiving NIC: it
//! reads the receiver's next posted entry one-sidedly, writes the message into the buffer it
//! names and the completion entry after it. Only memory the receiver owns is written, only
//! where the receiver posted, and the receiver trusts none of it.
//!
//! # Roles and memory
//! Per connection and direction, in the **receiver's** region (a [`QueueLayout`]):
//! ```text
//! +0                        receive queue: depth entries of 8 bytes, written by the receiver
//! +8 * depth                completion queue: depth entries of 16 bytes, written by the sender
//! +24 * depth               buffers: depth buffers of buffer_bytes (a multiple of 8)
//!
//! receive entry (post n at entry n % depth):
//!   bits 0..32   buffer id (< depth)
//!   bits 32..62  tag = n mod 2^30
//!   bit 62       reserved, 0
//!   bit 63       VALID, 1 (a zero word is "never posted")
//! completion entry (completion n at entry n % depth), two words:
//!   +0 header:   bits 0..24 buffer id, bits 24..32 status (0 success, 1 length error),
//!                bits 32..62 tag = n mod 2^30, bit 62 reserved 0, bit 63 VALID 1
//!   +8 length:   bits 0..32 message bytes (for a length error: the refused length, saturated),
//!                bits 32..64 reserved 0
//! ```
//! Each side's poller owns a doorbell (the ring's, [`Doorbell`]): the receiver's is rung when a
//! completion is written, the sender's when a buffer is posted (it may wait on RNR).
//!
//! # Protocol
//! Receiver: at set-up it zeroes both queues and posts every buffer (ids `0..depth`). Post `n`
//! is a **release** store of its entry. It polls the completion entry at `completed % depth`
//! (**acquire**): zero is "nothing yet"; anything but VALID with tag `completed`, the buffer id
//! of post `completed`, a known status and a length within the buffer is `Corrupt` (close the
//! connection). It zeroes the header, hands out a [`Completion`] (the buffer is now the
//! receiver's: not posted), copies the message out, and posts the buffer again by consuming the
//! completion token. There is one buffer per queue entry, so the receiver can always post every
//! buffer it holds, never more than `depth` posts are outstanding, and the completion queue
//! can never overflow: the sender writes completion `n` only after it read post `n`, which the
//! receiver made only after it had consumed completion `n - depth` (and zeroed its entry).
//! Sender: loads the receive entry at `sent % depth` (**acquire**, pairing with the post): tag
//! `sent` with a buffer id below depth is a posted buffer; zero (first lap) or the previous
//! lap's tag is RNR (nothing written; wait on the own doorbell, bounded); anything else is
//! `Corrupt`. It writes the message into that buffer (relaxed), the completion's length word
//! (relaxed) and header (**release**: ordered after the data, as an RDMA completion after its
//! DMA), then notifies the receiver's doorbell. A message above `buffer_bytes` consumes the
//! posted entry with a length-error completion (the receiver's poll reports it and the
//! connection is broken, as RDMA moves the queue pair to the error state) and is refused.
//!
//! The acquire load of post `n` synchronises with the receiver's release store of it, so the
//! sender's writes to a buffer happen after the receiver finished reading the buffer's last
//! message: a buffer is never written while it is not posted (checked by the loom model).

use crate::fabric::{FabricError, OneSided};
use crate::limits::{SENDRECV_BUFFER_BYTES_MAX, SENDRECV_DEPTH_MAX, SENDRECV_TAG_BITS, WORD_BYTES};
use crate::ring::{doorbell_region, doorbell_region_lengths, notify, Doorbell, Doorbells, WaitError, DOORBELL_BYTES};
use crate::words::{FenceOrdering, LoadOrdering, StoreOrdering, Words};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

const VALID_BIT: u64 = 1 << 63;
const RESERVED_BIT: u64 = 1 << 62;
const TAG_SHIFT: u32 = 32;
const TAG_MASK: u64 = (1 << SENDRECV_TAG_BITS) - 1;
const RECEIVE_BUFFER_MASK: u64 = 0xFFFF_FFFF;
const COMPLETION_BUFFER_MASK: u64 = 0xFF_FFFF;
const COMPLETION_STATUS_SHIFT: u32 = 24;
const COMPLETION_STATUS_MASK: u64 = 0xFF;
const LENGTH_MASK: u64 = 0xFFFF_FFFF;

/// Completion status: the message is in the buffer.
pub const STATUS_SUCCESS: u8 = 0;
/// Completion status: the message was larger than the posted buffer and was not placed.
pub const STATUS_LENGTH_ERROR: u8 = 1;

/// Bytes of one receive-queue entry.
pub const RECEIVE_ENTRY_BYTES: usize = 8;
/// Bytes of one completion-queue entry.
pub const COMPLETION_ENTRY_BYTES: usize = 16;

fn tag(sequence: u64) -> u64 {
    sequence & TAG_MASK
}

fn receive_entry(sequence: u64, buffer: u32) -> u64 {
    VALID_BIT | (tag(sequence) << TAG_SHIFT) | u64::from(buffer)
}

fn completion_header(sequence: u64, buffer: u32, status: u8) -> u64 {
    VALID_BIT | (tag(sequence) << TAG_SHIFT) | (u64::from(status) << COMPLETION_STATUS_SHIFT) | u64::from(buffer)
}

/// Where a queue pair's receive side lies in its receiver's region. Agreed over the control
/// channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLayout {
    /// Offset of the receive queue in the receiver's region (8-aligned).
    pub offset_bytes: u64,
    /// Entries of the receive queue, of the completion queue, and buffers:
    /// `1..=SENDRECV_DEPTH_MAX`.
    pub depth: u64,
    /// Bytes of each receive buffer: a multiple of 8 in `8..=SENDRECV_BUFFER_BYTES_MAX`. The
    /// largest message.
    pub buffer_bytes: u64,
}

impl QueueLayout {
    /// Bytes the queues and buffers of `depth` entries of `buffer_bytes` occupy.
    pub const fn len_bytes(depth: usize, buffer_bytes: usize) -> usize {
        depth * (RECEIVE_ENTRY_BYTES + COMPLETION_ENTRY_BYTES + buffer_bytes)
    }
}

/// Everything both ends of one queue pair direction need, agreed over the control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueAddresses {
    /// Queues and buffers, in the receiver's region.
    pub queue: QueueLayout,
    /// The receiver's poller doorbell, in the receiver's region (rung on a completion).
    pub receiver_doorbell_offset_bytes: u64,
    /// The sender's poller doorbell, in the sender's region (rung on a post).
    pub sender_doorbell_offset_bytes: u64,
}

/// Errors of set-up and of the receiver.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Addresses that do not fit the regions or break a layout rule.
    #[error("invalid send/recv layout: {reason}")]
    InvalidLayout {
        /// Which rule.
        reason: &'static str,
    },
    /// The completion queue holds something no correct sender writes. Close the connection.
    #[error("corrupt completion {completion}: {reason} (entry {entry:#018x})")]
    Corrupt {
        /// Sequence number of the completion expected.
        completion: u64,
        /// The header (or length) word found.
        entry: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// The sender sent a message larger than the posted buffer (RDMA: local length error).
    /// The queue pair is broken: close the connection.
    #[error("a message of {message_bytes} bytes exceeded the posted buffer of {buffer_bytes} bytes")]
    LengthError {
        /// Length the sender attempted (saturated at `u32::MAX`).
        message_bytes: u64,
        /// The posted buffer's length.
        buffer_bytes: u64,
    },
    /// A fabric operation failed (cannot happen with validated addresses; kept as a value).
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Errors of the sender.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// Receiver not ready (RNR): no buffer is posted now. Nothing was written; retry later.
    #[error("receiver not ready: no receive buffer posted")]
    ReceiverNotReady,
    /// The message exceeds the posted buffer: the posted entry was consumed with a
    /// length-error completion (the receiver will close the connection). No data was written.
    #[error("message of {message_bytes} bytes exceeds the posted buffer of {buffer_bytes} bytes")]
    TooLarge {
        /// Message length.
        message_bytes: usize,
        /// The receiver's buffer length.
        buffer_bytes: usize,
    },
    /// The receive queue holds an entry no correct receiver writes. Close the connection.
    #[error("corrupt receive-queue entry for post {post}: {reason} (entry {entry:#018x})")]
    Corrupt {
        /// Sequence number of the post expected.
        post: u64,
        /// The entry found.
        entry: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// `send` found no posted buffer before its deadline (RDMA: RNR retries exceeded).
    #[error("timed out waiting for a posted receive buffer")]
    Timeout,
    /// A fabric operation failed (cannot happen with validated addresses; kept as a value).
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Validated, in-word form of a [`QueueLayout`].
#[derive(Clone, Copy, Debug)]
struct Queue {
    receive_offset_bytes: usize,
    completion_offset_bytes: usize,
    buffers_offset_bytes: usize,
    depth: u64,
    buffer_bytes: usize,
}

impl Queue {
    fn new(layout: QueueLayout, region_len_bytes: usize) -> Result<Self, QueueError> {
        let invalid = |reason| Err(QueueError::InvalidLayout { reason });
        let (Ok(offset), Ok(depth), Ok(buffer_bytes)) =
            (usize::try_from(layout.offset_bytes), usize::try_from(layout.depth), usize::try_from(layout.buffer_bytes))
        else {
            return invalid("field does not fit in usize");
        };
        if offset % WORD_BYTES != 0 || buffer_bytes % WORD_BYTES != 0 {
            return invalid("offset and buffer length must be multiples of 8");
        }
        if !(1..=SENDRECV_DEPTH_MAX).contains(&depth) {
            return invalid("depth outside 1..=SENDRECV_DEPTH_MAX");
        }
        if !(WORD_BYTES..=SENDRECV_BUFFER_BYTES_MAX).contains(&buffer_bytes) {
            return invalid("buffer length outside 8..=SENDRECV_BUFFER_BYTES_MAX");
        }
        // Bounded by the two checks above: cannot overflow.
        let len_bytes = QueueLayout::len_bytes(depth, buffer_bytes);
        match offset.checked_add(len_bytes) {
            Some(end) if end <= region_len_bytes => {}
            _ => return invalid("queues and buffers do not fit in the receiver's region"),
        }
        Ok(Self {
            receive_offset_bytes: offset,
            completion_offset_bytes: offset + depth * RECEIVE_ENTRY_BYTES,
            buffers_offset_bytes: offset + depth * (RECEIVE_ENTRY_BYTES + COMPLETION_ENTRY_BYTES),
            depth: depth as u64,
            buffer_bytes,
        })
    }

    fn receive_entry_offset_bytes(&self, sequence: u64) -> usize {
        self.receive_offset_bytes + (sequence % self.depth) as usize * RECEIVE_ENTRY_BYTES
    }

    fn completion_entry_offset_bytes(&self, sequence: u64) -> usize {
        self.completion_offset_bytes + (sequence % self.depth) as usize * COMPLETION_ENTRY_BYTES
    }

    fn buffer_offset_bytes(&self, buffer: u32) -> usize {
        self.buffers_offset_bytes + buffer as usize * self.buffer_bytes
    }
}

fn check_doorbell(region_len_bytes: usize, offset_bytes: u64) -> Result<usize, QueueError> {
    let invalid = |reason| Err(QueueError::InvalidLayout { reason });
    let Ok(offset) = usize::try_from(offset_bytes) else { return invalid("doorbell offset does not fit in usize") };
    if offset % WORD_BYTES != 0 {
        return invalid("doorbell offset must be a multiple of 8");
    }
    match offset.checked_add(DOORBELL_BYTES) {
        Some(end) if end <= region_len_bytes => Ok(offset),
        _ => invalid("doorbell outside its region"),
    }
}

/// The sending end of a queue pair direction: plays the receiving NIC, writing into the
/// receiver's region; waits for posts on its own doorbell.
#[derive(Debug)]
pub struct SendQueue<F: OneSided, L> {
    fabric: F,
    receiver: F::RemoteRegion,
    local: L,
    queue: Queue,
    receiver_doorbell_offset_bytes: usize,
    sender_doorbell_offset_bytes: usize,
    doorbells: Doorbells<F::RemoteRegion, L>,
    /// Messages sent (successfully or with a length error): the next post to consume.
    sent: u64,
}

impl<F: OneSided, L: Words> SendQueue<F, L> {
    /// The sender into the queues at `addresses` in the (mapped) `receiver` region; `local` is
    /// the sender's own region (its doorbell).
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn new(fabric: F, receiver: F::RemoteRegion, local: L, addresses: QueueAddresses) -> Result<Self, QueueError> {
        Self::with_doorbells(fabric, receiver, local, addresses, Doorbells::default())
    }

    /// [`SendQueue::new`] with the doorbells in the regions `doorbells` names (the doorbell
    /// offsets in `addresses` then refer to those).
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn with_doorbells(
        fabric: F,
        receiver: F::RemoteRegion,
        local: L,
        addresses: QueueAddresses,
        doorbells: Doorbells<F::RemoteRegion, L>,
    ) -> Result<Self, QueueError> {
        let receiver_len_bytes = fabric.remote_len_bytes(&receiver);
        let queue = Queue::new(addresses.queue, receiver_len_bytes)?;
        let (receiver_doorbell_len_bytes, sender_doorbell_len_bytes) =
            doorbell_region_lengths(&fabric, &doorbells, &receiver, &local);
        let receiver_doorbell = check_doorbell(receiver_doorbell_len_bytes, addresses.receiver_doorbell_offset_bytes)?;
        let sender_doorbell = check_doorbell(sender_doorbell_len_bytes, addresses.sender_doorbell_offset_bytes)?;
        Ok(Self {
            fabric,
            receiver,
            local,
            queue,
            receiver_doorbell_offset_bytes: receiver_doorbell,
            sender_doorbell_offset_bytes: sender_doorbell,
            doorbells,
            sent: 0,
        })
    }

    /// Largest message: the receiver's buffer length.
    pub fn message_bytes_max(&self) -> usize {
        self.queue.buffer_bytes
    }

    /// Messages sent so far (each consumed one post).
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The buffer of the next post, if the receiver has posted it. One one-sided load.
    fn next_buffer(&self) -> Result<Option<u32>, PostError> {
        let offset = self.queue.receive_entry_offset_bytes(self.sent);
        let entry = self.fabric.read_word(&self.receiver, offset, LoadOrdering::Acquire)?;
        let corrupt = |reason| Err(PostError::Corrupt { post: self.sent, entry, reason });
        if entry == 0 {
            if self.sent < self.queue.depth {
                return Ok(None);
            }
            return corrupt("entry zeroed after it was posted");
        }
        if entry & VALID_BIT == 0 || entry & RESERVED_BIT != 0 {
            return corrupt("valid bit clear or reserved bit set");
        }
        let entry_tag = (entry >> TAG_SHIFT) & TAG_MASK;
        if entry_tag == tag(self.sent) {
            let buffer = entry & RECEIVE_BUFFER_MASK;
            if buffer >= self.queue.depth {
                return corrupt("buffer id not below the depth");
            }
            return Ok(Some(buffer as u32));
        }
        if self.sent >= self.queue.depth && entry_tag == tag(self.sent - self.queue.depth) {
            return Ok(None); // the previous lap's post, already consumed: not posted again yet
        }
        corrupt("tag is neither this post's nor the previous lap's")
    }

    /// Whether a send now would find a posted buffer (or an error, which `try_send` reports).
    /// Cheap: one load. Meant for a poller's doorbell condition.
    pub fn receiver_ready(&self) -> bool {
        !matches!(self.next_buffer(), Ok(None))
    }

    /// Places `message` into the receiver's next posted buffer, appends its completion and
    /// notifies the receiver's poller if it sleeps. Never blocks.
    ///
    /// # Errors
    /// `ReceiverNotReady` (nothing written; retry later), `TooLarge` (the post was consumed by
    /// a length-error completion), `Corrupt` (close the connection).
    pub fn try_send(&mut self, message: &[u8]) -> Result<(), PostError> {
        let Some(buffer) = self.next_buffer()? else { return Err(PostError::ReceiverNotReady) };
        let completion = self.queue.completion_entry_offset_bytes(self.sent);
        let too_large = message.len() > self.queue.buffer_bytes;
        let (status, length) = if too_large {
            (STATUS_LENGTH_ERROR, (message.len() as u64).min(LENGTH_MASK))
        } else {
            if !message.is_empty() {
                self.fabric.write(&self.receiver, self.queue.buffer_offset_bytes(buffer), message)?;
            }
            (STATUS_SUCCESS, message.len() as u64)
        };
        self.fabric.write_word(&self.receiver, completion + WORD_BYTES, length, StoreOrdering::Relaxed)?;
        let header = completion_header(self.sent, buffer, status);
        self.fabric.write_word(&self.receiver, completion, header, StoreOrdering::Release)?;
        self.sent += 1;
        let doorbell = doorbell_region(&self.doorbells.remote, &self.receiver);
        notify(&self.fabric, doorbell, self.receiver_doorbell_offset_bytes, &self.local)?;
        if too_large {
            return Err(PostError::TooLarge { message_bytes: message.len(), buffer_bytes: self.queue.buffer_bytes });
        }
        Ok(())
    }

    /// Sends `message`, waiting on the sender's own doorbell (bounded spin, then sleep) while
    /// the receiver has no buffer posted.
    ///
    /// # Errors
    /// As `try_send`, and `Timeout` if no buffer was posted within `timeout`.
    pub fn send(&mut self, message: &[u8], timeout: Duration) -> Result<(), PostError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_send(message) {
                Err(PostError::ReceiverNotReady) => {}
                other => return other,
            }
            let doorbell =
                Doorbell::new(doorbell_region(&self.doorbells.local, &self.local), self.sender_doorbell_offset_bytes)?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            doorbell
                .wait_until(|| self.receiver_ready(), remaining)
                .map_err(|WaitError::Timeout| PostError::Timeout)?;
        }
    }
}

/// A received message's buffer, taken off the completion queue: the buffer is the receiver's
/// until it is posted again with [`ReceiveQueue::repost`], which consumes this token (so a
/// buffer cannot be posted twice).
#[must_use = "a completed buffer must be posted again, or the queue shrinks"]
#[derive(Debug, PartialEq, Eq)]
pub struct Completion {
    buffer: u32,
    len_bytes: u32,
    sequence: u64,
}

impl Completion {
    /// Id of the buffer holding the message.
    pub fn buffer_id(&self) -> u32 {
        self.buffer
    }
    /// Message length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes as usize
    }
    /// Sequence number of the completion (messages received before it).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }
}

/// The receiving end of a queue pair direction: owns the buffers and both queues in its own
/// region; notifies the sender's doorbell when it posts.
#[derive(Debug)]
pub struct ReceiveQueue<F: OneSided, L> {
    fabric: F,
    local: L,
    sender: F::RemoteRegion,
    queue: Queue,
    sender_doorbell_offset_bytes: usize,
    doorbells: Doorbells<F::RemoteRegion, L>,
    posted: u64,
    completed: u64,
    /// Buffer id of post `n` at `n % depth`: what completion `n` must name.
    posted_buffers: Box<[u32]>,
    /// Per buffer: posted and not completed (asserts the ownership rules).
    buffer_posted: Box<[bool]>,
}

impl<F: OneSided, L: Words> ReceiveQueue<F, L> {
    /// The receiver of the queues at `addresses` in its own `local` region; `sender` is the
    /// sender's (mapped) region. Zeroes both queues and posts every buffer: build it before
    /// telling the sender where the queues are. Allocates its bookkeeping here, once.
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn new(fabric: F, local: L, sender: F::RemoteRegion, addresses: QueueAddresses) -> Result<Self, QueueError> {
        Self::with_doorbells(fabric, local, sender, addresses, Doorbells::default())
    }

    /// [`ReceiveQueue::new`] with the doorbells in the regions `doorbells` names (the doorbell
    /// offsets in `addresses` then refer to those).
    ///
    /// # Errors
    /// `InvalidLayout` if any address breaks a rule or leaves its region.
    pub fn with_doorbells(
        fabric: F,
        local: L,
        sender: F::RemoteRegion,
        addresses: QueueAddresses,
        doorbells: Doorbells<F::RemoteRegion, L>,
    ) -> Result<Self, QueueError> {
        let queue = Queue::new(addresses.queue, local.len_words() * WORD_BYTES)?;
        let (sender_doorbell_len_bytes, receiver_doorbell_len_bytes) =
            doorbell_region_lengths(&fabric, &doorbells, &sender, &local);
        check_doorbell(receiver_doorbell_len_bytes, addresses.receiver_doorbell_offset_bytes)?;
        let sender_doorbell = check_doorbell(sender_doorbell_len_bytes, addresses.sender_doorbell_offset_bytes)?;
        let first = queue.receive_offset_bytes / WORD_BYTES;
        let queue_words = queue.depth as usize * (RECEIVE_ENTRY_BYTES + COMPLETION_ENTRY_BYTES) / WORD_BYTES;
        for index in first..first + queue_words {
            local.store(index, 0, StoreOrdering::Relaxed);
        }
        local.fence(FenceOrdering::Release);
        let depth = queue.depth as usize;
        let mut receive_queue = Self {
            fabric,
            local,
            sender,
            queue,
            sender_doorbell_offset_bytes: sender_doorbell,
            doorbells,
            posted: 0,
            completed: 0,
            posted_buffers: vec![0; depth].into_boxed_slice(),
            buffer_posted: vec![false; depth].into_boxed_slice(),
        };
        for buffer in 0..depth as u32 {
            receive_queue.post(buffer);
        }
        Ok(receive_queue)
    }

    /// Largest message: the buffer length.
    pub fn message_bytes_max(&self) -> usize {
        self.queue.buffer_bytes
    }

    /// Posts not yet completed (the buffers the sender may write): at most the depth.
    pub fn outstanding(&self) -> u64 {
        self.posted - self.completed
    }

    fn completion_index(&self) -> usize {
        self.queue.completion_entry_offset_bytes(self.completed) / WORD_BYTES
    }

    /// Whether something (a completion, or garbage) is at the completion queue's head.
    /// Cheap: one load. Meant for a poller's doorbell condition.
    pub fn has_pending(&self) -> bool {
        self.local.load(self.completion_index(), LoadOrdering::Relaxed) != 0
    }

    /// The next completion, if any: the message is in the buffer it names, which is the
    /// receiver's until it is posted again. Copy the message with [`ReceiveQueue::copy_message`].
    ///
    /// # Errors
    /// `Corrupt` if the completion queue holds something no correct sender writes,
    /// `LengthError` if the sender refused an oversized message: close the connection.
    pub fn poll(&mut self) -> Result<Option<Completion>, QueueError> {
        let index = self.completion_index();
        let header = self.local.load(index, LoadOrdering::Acquire);
        if header == 0 {
            return Ok(None);
        }
        let corrupt = |entry, reason| Err(QueueError::Corrupt { completion: self.completed, entry, reason });
        if header & VALID_BIT == 0 || header & RESERVED_BIT != 0 {
            return corrupt(header, "valid bit clear or reserved bit set");
        }
        if (header >> TAG_SHIFT) & TAG_MASK != tag(self.completed) {
            return corrupt(header, "tag does not match the completion's sequence number");
        }
        if self.completed == self.posted {
            return corrupt(header, "completion without a posted receive");
        }
        let buffer = (header & COMPLETION_BUFFER_MASK) as u32;
        if buffer != self.posted_buffers[(self.completed % self.queue.depth) as usize] {
            return corrupt(header, "buffer id is not the one posted");
        }
        let length = self.local.load(index + 1, LoadOrdering::Relaxed);
        if length & !LENGTH_MASK != 0 {
            return corrupt(length, "reserved bits of the length word set");
        }
        match ((header >> COMPLETION_STATUS_SHIFT) & COMPLETION_STATUS_MASK) as u8 {
            STATUS_SUCCESS if length <= self.queue.buffer_bytes as u64 => {}
            STATUS_SUCCESS => return corrupt(length, "length exceeds the buffer"),
            STATUS_LENGTH_ERROR => {
                return Err(QueueError::LengthError {
                    message_bytes: length,
                    buffer_bytes: self.queue.buffer_bytes as u64,
                })
            }
            _ => return corrupt(header, "unknown status"),
        }
        self.local.store(index, 0, StoreOrdering::Relaxed);
        let sequence = self.completed;
        self.completed += 1;
        assert!(self.buffer_posted[buffer as usize], "a completed buffer was posted");
        self.buffer_posted[buffer as usize] = false;
        Ok(Some(Completion { buffer, len_bytes: length as u32, sequence }))
    }

    /// Appends the message of `completion` to `dst`, with atomic loads (the peer can write
    /// this memory at any time; a correct one does not while the buffer is not posted).
    pub fn copy_message(&self, completion: &Completion, dst: &mut Vec<u8>) {
        assert!(!self.buffer_posted[completion.buffer as usize], "the completion belongs to this queue");
        let start = dst.len();
        dst.resize(start + completion.len_bytes(), 0);
        let first = self.queue.buffer_offset_bytes(completion.buffer) / WORD_BYTES;
        self.local.copy_out(first, &mut dst[start..]);
    }

    /// Posts the buffer of `completion` again and notifies the sender if it waits (RNR).
    ///
    /// # Errors
    /// `Fabric` only (addresses were validated).
    pub fn repost(&mut self, completion: Completion) -> Result<(), QueueError> {
        self.post(completion.buffer);
        let doorbell = doorbell_region(&self.doorbells.remote, &self.sender);
        notify(&self.fabric, doorbell, self.sender_doorbell_offset_bytes, &self.local)?;
        Ok(())
    }

    fn post(&mut self, buffer: u32) {
        let slot = buffer as usize;
        assert!(slot < self.buffer_posted.len() && !self.buffer_posted[slot], "only a held buffer is posted");
        assert!(self.outstanding() < self.queue.depth, "never more posts than queue entries");
        self.buffer_posted[slot] = true;
        self.posted_buffers[(self.posted % self.queue.depth) as usize] = buffer;
        let index = self.queue.receive_entry_offset_bytes(self.posted) / WORD_BYTES;
        // Release: the reads of the buffer's previous message happen before the sender's
        // writes of the next (it loads this entry with acquire).
        self.local.store(index, receive_entry(self.posted, buffer), StoreOrdering::Release);
        self.posted += 1;
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

    // Receiver region: one receive entry (1 word), one completion (2), one 16-byte buffer (2),
    // doorbell (2). Sender region: doorbell.
    const ADDRESSES: QueueAddresses = QueueAddresses {
        queue: QueueLayout { offset_bytes: 0, depth: 1, buffer_bytes: 16 },
        receiver_doorbell_offset_bytes: 40,
        sender_doorbell_offset_bytes: 0,
    };

    /// Attempts each side makes per step, so the model stays finite.
    const TRIES: usize = 3;

    /// Three messages (two words, one word, empty) through a queue pair with a single posted
    /// buffer, so every send after the first meets RNR until the receiver re-posts. The
    /// receiver copies each message twice with a yield between (and before re-posting): if the
    /// sender ever wrote a buffer that was not posted, some execution sees the copies differ.
    /// Everything sent arrives exactly once, in order and whole, and nothing else.
    #[test]
    fn loom_sendrecv_delivers_in_order_and_never_writes_an_unposted_buffer() {
        use std::sync::atomic::{AtomicU64 as Count, Ordering::Relaxed};
        static EXECUTIONS: Count = Count::new(0);
        static NOT_READY: Count = Count::new(0);
        static RECEIVED_CONCURRENTLY: Count = Count::new(0);
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(3);
        builder.check(|| {
            EXECUTIONS.fetch_add(1, Relaxed);
            let receiver_memory = Arc::new(LoomWords::new(7));
            let sender_memory = Arc::new(LoomWords::new(2));
            let messages: [&[u8]; 3] = [b"ABCDEFGHIJKLMNOP", b"xyz", b""];
            let receiver_remote = MemoryRemoteRegion::new(Arc::clone(&receiver_memory), Access::ReadWrite);
            let sender_remote = MemoryRemoteRegion::new(Arc::clone(&sender_memory), Access::ReadWrite);
            let mut receiver =
                ReceiveQueue::new(MemoryFabric::<LoomWords>::new(), receiver_memory, sender_remote, ADDRESSES).unwrap();
            let sender_thread = loom::thread::spawn(move || {
                let mut sender =
                    SendQueue::new(MemoryFabric::<LoomWords>::new(), receiver_remote, sender_memory, ADDRESSES)
                        .unwrap();
                let mut sent = 0;
                'messages: for message in messages {
                    for attempt in 1..=TRIES {
                        match sender.try_send(message) {
                            Ok(()) => break,
                            Err(PostError::ReceiverNotReady) if attempt < TRIES => {
                                NOT_READY.fetch_add(1, Relaxed);
                                loom::thread::yield_now();
                            }
                            Err(PostError::ReceiverNotReady) => break 'messages,
                            Err(other) => panic!("{other}"),
                        }
                    }
                    sent += 1;
                }
                sent
            });
            let mut received = 0;
            let (mut first, mut second) = (Vec::new(), Vec::new());
            let mut receive = |receiver: &mut ReceiveQueue<_, _>, received: &mut usize| -> bool {
                let Some(completion) = receiver.poll().unwrap() else { return false };
                first.clear();
                second.clear();
                receiver.copy_message(&completion, &mut first);
                loom::thread::yield_now();
                receiver.copy_message(&completion, &mut second);
                assert_eq!(first, second, "a buffer was written while not posted");
                assert_eq!(first, messages[*received], "lost, duplicated or half-written");
                *received += 1;
                receiver.repost(completion).unwrap();
                true
            };
            for _ in 0..messages.len() * TRIES {
                if receive(&mut receiver, &mut received) {
                    RECEIVED_CONCURRENTLY.fetch_add(1, Relaxed);
                } else {
                    loom::thread::yield_now();
                }
            }
            let sent = sender_thread.join().unwrap();
            while receive(&mut receiver, &mut received) {
                assert!(received <= sent, "a message arrived that was not sent");
            }
            assert_eq!(received, sent, "a sent message was lost");
            assert!(receiver.outstanding() == 1, "the one buffer is posted again");
        });
        let (executions, refused, concurrent) =
            (EXECUTIONS.load(Relaxed), NOT_READY.load(Relaxed), RECEIVED_CONCURRENTLY.load(Relaxed));
        println!(
            "loom send/recv model: {executions} executions, {refused} sends met RNR, \
             {concurrent} messages received while the sender ran"
        );
        assert!(refused > 0 && concurrent > 0);
    }
}
