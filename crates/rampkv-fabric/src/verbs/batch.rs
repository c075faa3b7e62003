//! Send requests staged and posted together: one `ibv_post_send`, one doorbell, for a whole
//! batch (all of a transaction's reads go out at once).
//!
//! # Contract
//! A [`SendBatch`] holds its queue pair mutably. Each staged request is checked (range,
//! alignment, access rights, protection domain, queue room) before anything is posted, and
//! pins the local region it names until its completion. [`SendBatch::post`] signals the last
//! request; every post signals at least one request in each `signal_interval`, so a full send
//! queue always has a completion coming.

use super::completion::WorkRange;
use super::device::call_error;
use super::error::VerbsError;
use super::ffi::{self, IbvSendWr, IbvSge};
use super::limits::TRANSFER_BYTES_MAX;
use super::queue_pair::{accepted_before, QueuePair};
use super::region::{MemoryRegion, RegionAccess, RemoteRegion};
use super::status::{QueuePairState, WorkQueue};
use std::ffi::c_uint;
use std::sync::Arc;

/// Send requests staged to be posted together (one `ibv_post_send`, one doorbell). Holds the
/// queue pair mutably; dropping it unposted posts nothing.
pub struct SendBatch<'q> {
    pub(crate) queue_pair: &'q mut QueuePair,
    pub(crate) len: u32,
}

impl std::fmt::Debug for SendBatch<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SendBatch").field("len", &self.len).finish()
    }
}

impl QueuePair {
    /// Starts a batch of send requests, posted together with one doorbell.
    ///
    /// # Errors
    /// `QueuePairFailed` after a failure; `NotConnected` before [`QueuePair::connect`].
    pub fn batch(&mut self) -> Result<SendBatch<'_>, VerbsError> {
        self.check_usable()?;
        if self.state != QueuePairState::ReadyToSend {
            return Err(VerbsError::NotConnected { state: self.state });
        }
        Ok(SendBatch { queue_pair: self, len: 0 })
    }
}

/// The local side of a request: the region, offset and length.
struct Local<'r> {
    region: &'r MemoryRegion,
    offset_bytes: u64,
    len_bytes: u64,
    /// The NIC writes it (READ, atomics).
    written: bool,
}

impl SendBatch<'_> {
    /// Requests staged so far.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn stage(
        &mut self,
        opcode: c_uint,
        local: Local<'_>,
        remote: Option<(u64, u32)>,
        fill: impl FnOnce(&mut IbvSendWr),
    ) -> Result<u64, VerbsError> {
        let queue_pair = &mut *self.queue_pair;
        let outstanding = queue_pair.send.outstanding();
        if outstanding + self.len >= queue_pair.send.depth {
            return Err(VerbsError::QueueFull {
                queue: WorkQueue::Send,
                outstanding: outstanding + self.len,
                depth: queue_pair.send.depth,
            });
        }
        let needed = if local.written { RegionAccess::LOCAL_WRITE } else { RegionAccess::NONE };
        queue_pair.check_region(local.region, needed)?;
        if local.len_bytes == 0 || local.len_bytes > u64::from(TRANSFER_BYTES_MAX) {
            return Err(VerbsError::InvalidArgument { reason: "a transfer must move 1 to 2^31 bytes" });
        }
        let address = local.region.local_address(local.offset_bytes, local.len_bytes)?;
        let index = self.len as usize;
        let sequence = queue_pair.send.next + u64::from(self.len);
        queue_pair.send_entries[index] =
            IbvSge { addr: address, length: local.len_bytes as u32, lkey: local.region.inner.lkey };
        let mut request = IbvSendWr::zeroed();
        request.wr_id = sequence;
        request.num_sge = 1;
        request.opcode = opcode;
        if let Some((remote_address, rkey)) = remote {
            request.wr.rdma = ffi::IbvRdmaWr { remote_addr: remote_address, rkey };
        }
        fill(&mut request);
        queue_pair.send_requests[index] = request;
        let slot = queue_pair.send.slot(sequence);
        queue_pair.send.pins[slot] = Some(Arc::clone(&local.region.inner));
        self.len += 1;
        Ok(sequence)
    }

    /// RDMA READ of `len_bytes` at `remote_offset_bytes` of `remote` into `local` at
    /// `local_offset_bytes` (a `LOCAL_WRITE` region). Returns the request's sequence number.
    /// More than 8 bytes are not read atomically, in no promised order.
    ///
    /// # Errors
    /// `QueueFull`, `OutOfBounds` (either side), `AccessDenied`, `InvalidArgument`.
    pub fn read(
        &mut self,
        local: &MemoryRegion,
        local_offset_bytes: u64,
        remote: &RemoteRegion,
        remote_offset_bytes: u64,
        len_bytes: u32,
    ) -> Result<u64, VerbsError> {
        let remote_address = remote.address_of(remote_offset_bytes, u64::from(len_bytes))?;
        let local =
            Local { region: local, offset_bytes: local_offset_bytes, len_bytes: u64::from(len_bytes), written: true };
        self.stage(ffi::IBV_WR_RDMA_READ, local, Some((remote_address, remote.rkey)), |_| {})
    }

    /// RDMA WRITE of `len_bytes` from `local` at `local_offset_bytes` to `remote` at
    /// `remote_offset_bytes`, with an immediate value if given (which consumes one of the
    /// peer's posted receives and raises a completion there: the way to wake a peer).
    ///
    /// # Errors
    /// `QueueFull`, `OutOfBounds` (either side), `InvalidArgument`.
    pub fn write(
        &mut self,
        local: &MemoryRegion,
        local_offset_bytes: u64,
        remote: &RemoteRegion,
        remote_offset_bytes: u64,
        len_bytes: u32,
        immediate: Option<u32>,
    ) -> Result<u64, VerbsError> {
        let remote_address = remote.address_of(remote_offset_bytes, u64::from(len_bytes))?;
        let local =
            Local { region: local, offset_bytes: local_offset_bytes, len_bytes: u64::from(len_bytes), written: false };
        let opcode = if immediate.is_some() { ffi::IBV_WR_RDMA_WRITE_WITH_IMM } else { ffi::IBV_WR_RDMA_WRITE };
        self.stage(opcode, local, Some((remote_address, remote.rkey)), |request| {
            request.imm_data = immediate.unwrap_or(0).to_be();
        })
    }

    /// 8-byte compare-and-swap on the word at `remote_offset_bytes` (8-aligned): if it equals
    /// `expected` it becomes `new`. The old value lands in `local` at `local_offset_bytes`
    /// (8-aligned, `LOCAL_WRITE`): the swap happened iff it equals `expected`.
    ///
    /// # Errors
    /// `Misaligned`, `QueueFull`, `OutOfBounds`, `AccessDenied`, `InvalidArgument`.
    pub fn compare_and_swap(
        &mut self,
        local: &MemoryRegion,
        local_offset_bytes: u64,
        remote: &RemoteRegion,
        remote_offset_bytes: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64, VerbsError> {
        self.atomic(
            ffi::IBV_WR_ATOMIC_CMP_AND_SWP,
            local,
            local_offset_bytes,
            remote,
            remote_offset_bytes,
            expected,
            new,
        )
    }

    /// 8-byte fetch-and-add (wrapping) on the word at `remote_offset_bytes` (8-aligned); the
    /// old value lands in `local` at `local_offset_bytes` (8-aligned, `LOCAL_WRITE`).
    ///
    /// # Errors
    /// `Misaligned`, `QueueFull`, `OutOfBounds`, `AccessDenied`, `InvalidArgument`.
    pub fn fetch_and_add(
        &mut self,
        local: &MemoryRegion,
        local_offset_bytes: u64,
        remote: &RemoteRegion,
        remote_offset_bytes: u64,
        add: u64,
    ) -> Result<u64, VerbsError> {
        self.atomic(ffi::IBV_WR_ATOMIC_FETCH_AND_ADD, local, local_offset_bytes, remote, remote_offset_bytes, add, 0)
    }

    fn atomic(
        &mut self,
        opcode: c_uint,
        local: &MemoryRegion,
        local_offset_bytes: u64,
        remote: &RemoteRegion,
        remote_offset_bytes: u64,
        compare_add: u64,
        swap: u64,
    ) -> Result<u64, VerbsError> {
        if local_offset_bytes % 8 != 0 {
            return Err(VerbsError::Misaligned { offset_bytes: local_offset_bytes });
        }
        let remote_address = remote.address_of(remote_offset_bytes, 8)?;
        if remote_address % 8 != 0 {
            return Err(VerbsError::Misaligned { offset_bytes: remote_offset_bytes });
        }
        let local = Local { region: local, offset_bytes: local_offset_bytes, len_bytes: 8, written: true };
        let rkey = remote.rkey;
        self.stage(opcode, local, None, |request| {
            request.wr.atomic = ffi::IbvAtomicWr { remote_addr: remote_address, compare_add, swap, rkey };
        })
    }

    /// SEND of `len_bytes` from `local` at `offset_bytes` into the peer's next posted receive
    /// buffer, with an immediate value if given.
    ///
    /// # Errors
    /// `QueueFull`, `OutOfBounds`, `InvalidArgument`.
    pub fn send(
        &mut self,
        local: &MemoryRegion,
        offset_bytes: u64,
        len_bytes: u32,
        immediate: Option<u32>,
    ) -> Result<u64, VerbsError> {
        let local = Local { region: local, offset_bytes, len_bytes: u64::from(len_bytes), written: false };
        let opcode = if immediate.is_some() { ffi::IBV_WR_SEND_WITH_IMM } else { ffi::IBV_WR_SEND };
        self.stage(opcode, local, None, |request| {
            request.imm_data = immediate.unwrap_or(0).to_be();
        })
    }

    /// Posts the batch with one doorbell; the last request is signalled (so
    /// [`QueuePair::wait_send_through`] can wait for the whole batch), and at least one in
    /// every `signal_interval`.
    ///
    /// # Errors
    /// `Call` when the post fails (the requests before the failing one were posted).
    pub fn post(self) -> Result<WorkRange, VerbsError> {
        self.post_with(true)
    }

    /// Posts the batch with one doorbell, signalling only as `signal_interval` requires (for
    /// streams of writes whose completions nobody waits for one by one).
    ///
    /// # Errors
    /// As [`SendBatch::post`].
    pub fn post_unsignalled(self) -> Result<WorkRange, VerbsError> {
        self.post_with(false)
    }

    fn post_with(mut self, signal_last: bool) -> Result<WorkRange, VerbsError> {
        let count = self.len as usize;
        let queue_pair = &mut *self.queue_pair;
        let first = queue_pair.send.next;
        if count == 0 {
            return Ok(WorkRange { first, end: first });
        }
        let requests = queue_pair.send_requests.as_mut_ptr();
        let entries = queue_pair.send_entries.as_mut_ptr();
        let mut last_signalled = queue_pair.last_signalled;
        let mut run = queue_pair.unsignalled_run;
        for index in 0..count {
            // SAFETY: index < count <= send_depth, the length of both scratch slices; every
            // pointer here derives from `requests` / `entries`, taken once above, so the
            // addresses handed to the device stay valid.
            let (request, entry, next) = unsafe {
                let next = if index + 1 < count { requests.add(index + 1) } else { std::ptr::null_mut() };
                (&mut *requests.add(index), entries.add(index), next)
            };
            request.sg_list = entry;
            request.next = next;
            run += 1;
            if run >= queue_pair.options.signal_interval || (signal_last && index + 1 == count) {
                request.send_flags = ffi::IBV_SEND_SIGNALED;
                last_signalled = Some(first + index as u64);
                run = 0;
            }
        }
        let mut bad: *mut IbvSendWr = std::ptr::null_mut();
        // SAFETY: a live queue pair in RTS; `count` linked requests and their entries live in
        // this queue pair's scratch buffers; every local buffer is in a registered region
        // pinned until its completion; remote addresses are only named, never dereferenced.
        let returned = unsafe { (queue_pair.post_send)(queue_pair.raw.raw.as_ptr(), requests, &mut bad) };
        let accepted = if returned == 0 { count } else { accepted_before(requests, bad, count) };
        queue_pair.send.unstage(accepted as u32, count as u32);
        queue_pair.send.next += accepted as u64;
        self.len = 0;
        if returned != 0 {
            // Only what the device accepted counts, signalled or not.
            let signalled = queue_pair.send_requests[..accepted]
                .iter()
                .rposition(|request| request.send_flags & ffi::IBV_SEND_SIGNALED != 0);
            if let Some(index) = signalled {
                queue_pair.last_signalled = Some(first + index as u64);
            }
            queue_pair.unsignalled_run = 0;
            return Err(call_error("ibv_post_send", returned));
        }
        queue_pair.unsignalled_run = run;
        queue_pair.last_signalled = last_signalled;
        Ok(WorkRange { first, end: queue_pair.send.next })
    }
}

impl Drop for SendBatch<'_> {
    fn drop(&mut self) {
        // Staged and never posted: let go of the regions they named.
        let len = self.len;
        self.queue_pair.send.unstage(0, len);
    }
}

#[cfg(test)]
mod tests {
    use super::super::ffi::IbvRecvWr;
    use super::*;

    #[test]
    fn a_failed_post_counts_the_requests_before_the_bad_one() {
        let mut requests = [IbvRecvWr::zeroed(); 4];
        let first = requests.as_mut_ptr();
        // SAFETY: index 2 of a 4-element array.
        let bad = unsafe { first.add(2) };
        assert_eq!(accepted_before(first, bad, 4), 2);
        assert_eq!(accepted_before(first, std::ptr::null_mut(), 4), 4);
        assert_eq!(accepted_before(first, first, 4), 0);
    }
}
