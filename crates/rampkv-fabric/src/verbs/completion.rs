//! Completions and the bookkeeping behind them: sequence numbers per queue, the regions that
//! outstanding requests name, and the completion queues and channel (destroyed on drop).
//!
//! # Contract
//! Work requests get sequence numbers, per queue, from 0 in posting order; a completion names
//! the sequence of its request. On a reliable connection requests complete in order per queue,
//! so a completion (successful or not) for sequence `s` proves every request up to `s` done:
//! that is how unsignalled sends are known complete, and when [`Tracker`] lets go of the
//! regions they named.

use super::ffi::{self, Api, IbvCompChannel, IbvCq, IbvWc};
use super::limits::SEND_SPIN_MAX_US;
use super::region::MrInner;
use super::status::WorkQueue;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// Set in the `wr_id` of receive requests, so that a completion names its queue even when it
/// failed (a failed completion's opcode is undefined).
pub(crate) const RECEIVE_BIT: u64 = 1 << 63;

/// Sequence numbers `first..end` of requests posted together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkRange {
    /// The first request's sequence number.
    pub first: u64,
    /// One past the last.
    pub end: u64,
}

impl WorkRange {
    /// The last request's sequence number, if any.
    pub fn last(&self) -> Option<u64> {
        (self.end > self.first).then(|| self.end - 1)
    }

    /// How many requests.
    pub fn len(&self) -> u64 {
        self.end - self.first
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.end == self.first
    }
}

/// What a successful completion reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompletionKind {
    /// A SEND (with or without immediate) completed.
    Send,
    /// An RDMA WRITE (with or without immediate) completed.
    Write,
    /// An RDMA READ completed: the data is in the local buffer.
    Read,
    /// A compare-and-swap completed: the old value is in the local buffer.
    CompareAndSwap,
    /// A fetch-and-add completed: the old value is in the local buffer.
    FetchAndAdd,
    /// A message arrived in a posted receive buffer.
    Receive,
    /// A peer's RDMA WRITE with immediate arrived (it consumed a posted receive).
    ReceiveWriteWithImmediate,
    /// An opcode this crate does not name.
    Other(u32),
}

/// One work completion, as `ibv_poll_cq` wrote it into the caller's buffer. Only successful
/// completions are ever handed out (a failed one is an error value).
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion(pub(crate) IbvWc);

impl Completion {
    /// The sequence number of the request it completes.
    pub fn sequence(&self) -> u64 {
        self.0.wr_id & !RECEIVE_BIT
    }

    /// The queue of the request.
    pub fn queue(&self) -> WorkQueue {
        if self.0.wr_id & RECEIVE_BIT != 0 {
            WorkQueue::Receive
        } else {
            WorkQueue::Send
        }
    }

    /// What completed.
    pub fn kind(&self) -> CompletionKind {
        match self.0.opcode {
            ffi::IBV_WC_SEND => CompletionKind::Send,
            ffi::IBV_WC_RDMA_WRITE => CompletionKind::Write,
            ffi::IBV_WC_RDMA_READ => CompletionKind::Read,
            ffi::IBV_WC_COMP_SWAP => CompletionKind::CompareAndSwap,
            ffi::IBV_WC_FETCH_ADD => CompletionKind::FetchAndAdd,
            ffi::IBV_WC_RECV => CompletionKind::Receive,
            ffi::IBV_WC_RECV_RDMA_WITH_IMM => CompletionKind::ReceiveWriteWithImmediate,
            other => CompletionKind::Other(other),
        }
    }

    /// Bytes received (receives only).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate value the sender attached, if any.
    pub fn immediate(&self) -> Option<u32> {
        (self.0.wc_flags & ffi::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(self.0.imm_data))
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Completion")
            .field("queue", &self.queue())
            .field("sequence", &self.sequence())
            .field("kind", &self.kind())
            .field("byte_len", &self.byte_len())
            .field("immediate", &self.immediate())
            .finish()
    }
}

/// Sequence numbers and region references of one queue.
pub(crate) struct Tracker {
    pub(crate) depth: u32,
    /// The sequence number the next request gets.
    pub(crate) next: u64,
    /// Every request below this is known complete.
    pub(crate) completed: u64,
    /// The region each outstanding request names, by `sequence % depth`.
    pub(crate) pins: Box<[Option<Arc<MrInner>>]>,
}

impl Tracker {
    pub(crate) fn new(depth: u32) -> Tracker {
        Tracker { depth, next: 0, completed: 0, pins: (0..depth).map(|_| None).collect() }
    }

    pub(crate) fn outstanding(&self) -> u32 {
        (self.next - self.completed) as u32
    }

    pub(crate) fn slot(&self, sequence: u64) -> usize {
        (sequence % u64::from(self.depth)) as usize
    }

    /// Requests up to `sequence` are done: release their regions.
    pub(crate) fn complete_through(&mut self, sequence: u64) {
        // A sequence from outside the posted range (a provider bug) releases nothing wrongly.
        let end = sequence.saturating_add(1).min(self.next);
        while self.completed < end {
            let slot = self.slot(self.completed);
            self.pins[slot] = None;
            self.completed += 1;
        }
    }

    /// Forgets requests staged from `self.next + from` on (not posted).
    pub(crate) fn unstage(&mut self, from: u32, to: u32) {
        for offset in from..to {
            let slot = self.slot(self.next + u64::from(offset));
            self.pins[slot] = None;
        }
    }
}

/// How long a wait for a queue pair's own sends spins on the queue before it sleeps on the
/// completion channel: twice the typical wait of late (an average that gives the newest wait an
/// eighth), at most `SEND_SPIN_MAX_US`. A send's completion is a round trip that is already
/// under way, so a wait that spins through its usual length costs what busy polling costs
/// (perftest's way) and skips the channel's arm, sleep and wake-up, which under a loaded or
/// emulated vCPU cost as much as the round trip; a link whose round trips are a few
/// microseconds spins a few microseconds. A wait that outlasts the budget (a peer gone, a lost
/// packet being retried) sleeps, so a dead link costs no CPU.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SpinBudget {
    typical_ns: u64,
}

impl SpinBudget {
    /// How long the next wait spins.
    pub(crate) fn budget(&self) -> Duration {
        Duration::from_nanos(self.typical_ns.saturating_mul(2).min(SEND_SPIN_MAX_US * 1_000))
    }

    /// A wait found its completion after `waited`. A wait longer than the largest budget counts
    /// as that long, so one slow wait does not keep later ones spinning long.
    pub(crate) fn observe(&mut self, waited: Duration) {
        let waited_ns = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX).min(SEND_SPIN_MAX_US * 1_000);
        self.typical_ns =
            if self.typical_ns == 0 { waited_ns } else { self.typical_ns - self.typical_ns / 8 + waited_ns / 8 };
    }
}

/// A completion queue, destroyed on drop.
pub(crate) struct CompletionQueue {
    pub(crate) api: &'static Api,
    pub(crate) raw: NonNull<IbvCq>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once, after the queue pair that used it
        // (field order of QueuePair); every event taken from the channel was acked at once.
        let _ = unsafe { (self.api.destroy_cq)(self.raw.as_ptr()) };
    }
}

/// A completion channel, destroyed on drop (after its completion queues).
pub(crate) struct Channel {
    pub(crate) api: &'static Api,
    pub(crate) raw: NonNull<IbvCompChannel>,
    pub(crate) fd: RawFd,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed once, after the completion
        // queues attached to it (field order of QueuePair).
        let _ = unsafe { (self.api.destroy_comp_channel)(self.raw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracker_releases_regions_in_order_and_ignores_sequences_never_posted() {
        let mut tracker = Tracker::new(4);
        tracker.next = 3;
        assert_eq!(tracker.outstanding(), 3);
        tracker.complete_through(1);
        assert_eq!((tracker.completed, tracker.outstanding()), (2, 1));
        tracker.complete_through(0); // stale: nothing changes
        assert_eq!(tracker.completed, 2);
        tracker.complete_through(1_000); // beyond what was posted: up to `next` only
        assert_eq!((tracker.completed, tracker.outstanding()), (3, 0));
    }

    #[test]
    fn completions_decode_queue_kind_and_immediate() {
        let receive = Completion(IbvWc {
            wr_id: 5 | RECEIVE_BIT,
            opcode: ffi::IBV_WC_RECV_RDMA_WITH_IMM,
            wc_flags: ffi::IBV_WC_WITH_IMM,
            imm_data: 0xdead_beef_u32.to_be(),
            byte_len: 0,
            ..IbvWc::default()
        });
        assert_eq!(receive.queue(), WorkQueue::Receive);
        assert_eq!(receive.sequence(), 5);
        assert_eq!(receive.kind(), CompletionKind::ReceiveWriteWithImmediate);
        assert_eq!(receive.immediate(), Some(0xdead_beef));
        let read = Completion(IbvWc { wr_id: 9, opcode: ffi::IBV_WC_RDMA_READ, ..IbvWc::default() });
        assert_eq!(
            (read.queue(), read.sequence(), read.kind(), read.immediate()),
            (WorkQueue::Send, 9, CompletionKind::Read, None)
        );
    }

    #[test]
    fn a_spin_budget_follows_the_typical_wait_within_its_bound() {
        let mut spin = SpinBudget::default();
        assert_eq!(spin.budget(), Duration::ZERO);
        spin.observe(Duration::from_micros(400));
        assert_eq!(spin.budget(), Duration::from_micros(800));
        // One slow wait moves the typical wait by an eighth of at most the bound.
        spin.observe(Duration::from_secs(5));
        let after_slow = spin.budget();
        assert!(after_slow < Duration::from_micros(SEND_SPIN_MAX_US), "{after_slow:?}");
        assert!(after_slow > Duration::from_micros(800), "{after_slow:?}");
        // Fast waits bring it down again.
        for _ in 0..64 {
            spin.observe(Duration::from_micros(3));
        }
        assert!(spin.budget() < Duration::from_micros(10), "{:?}", spin.budget());
        // Never above the bound, however slow every wait is.
        for _ in 0..64 {
            spin.observe(Duration::from_secs(1));
        }
        assert!(spin.budget() <= Duration::from_micros(SEND_SPIN_MAX_US), "{:?}", spin.budget());
    }

    #[test]
    fn work_ranges_count() {
        let range = WorkRange { first: 4, end: 7 };
        assert_eq!((range.len(), range.last(), range.is_empty()), (3, Some(6), false));
        let empty = WorkRange { first: 4, end: 4 };
        assert_eq!((empty.len(), empty.last(), empty.is_empty()), (0, None, true));
    }
}
