//! Reliable connected queue pairs: connection set-up from a peer's [`Endpoint`], batched
//! posting with one doorbell, completions polled in batches and waited for with a bound.
//!
//! # Contract
//! - A queue pair owns two completion queues (sends, receives) and, if asked, one completion
//!   channel that both report to: its file descriptor ([`QueuePair::event_fd`]) is what an idle
//!   poller sleeps on (epoll or poll), after [`QueuePair::arm`].
//! - Work requests get sequence numbers, per queue, from 0 in posting order; a completion names
//!   the sequence of its request. On a reliable connection requests complete in order per
//!   queue, so a completion for sequence `s` proves every request up to `s` done: that is how
//!   unsignalled sends are known complete, and how the references to the memory regions they
//!   named are released (see the module docs of `verbs`).
//! - Sends are signalled selectively: the last request of a batch posted with
//!   [`SendBatch::post`], and at least one in every `signal_interval` requests whatever the
//!   caller asks, so a full send queue always has a completion coming.
//! - The first failed completion moves the queue pair to the error state: it is returned as
//!   [`VerbsError::CompletionFailed`], and every later post or wait returns
//!   [`VerbsError::QueuePairFailed`] with that first status. The caller reconnects with a new
//!   queue pair.

use super::device::{call_error, Context, LinkLayer, PortInfo};
use super::ffi::{
    self, Api, IbvCompChannel, IbvCq, IbvQp, IbvQpAttr, IbvQpInitAttr, IbvRecvWr, IbvSendWr, IbvSge, IbvWc,
};
use super::limits::{
    HOP_LIMIT, MIN_RNR_TIMER_DEFAULT, POLL_BATCH, QUEUE_DEPTH_MAX, READ_ATOMIC_DEPTH_MAX, RECEIVE_DEPTH_DEFAULT,
    RETRY_COUNT_DEFAULT, RNR_RETRY_DEFAULT, SEND_DEPTH_DEFAULT, SIGNAL_INTERVAL_DEFAULT, TIMEOUT_EXPONENT_DEFAULT,
    TRANSFER_BYTES_MAX, WAIT_SLEEP_MAX_US, WAIT_SPIN_POLLS,
};
use super::region::{MemoryRegion, MrInner, ProtectionDomain, RegionAccess, RemoteRegion};
use super::{VerbsError, WorkStatus};
use serde::{Deserialize, Serialize};
use std::ffi::{c_int, c_uint};
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in the `wr_id` of receive requests, so that a completion names its queue even when it
/// failed (a failed completion's opcode is undefined).
const RECEIVE_BIT: u64 = 1 << 63;

/// Largest queue pair number and packet sequence number (24 bits).
const TWENTY_FOUR_BITS: u32 = (1 << 24) - 1;

/// Most channel events taken in one call (each CQ raises at most one per arming).
const EVENTS_PER_TAKE_MAX: u32 = 64;

/// Which queue of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    /// The send queue: READ, WRITE, atomics, SEND.
    Send,
    /// The receive queue: posted receive buffers.
    Receive,
}

/// The state of a queue pair as this process drove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueuePairState {
    /// Created, not yet usable.
    Reset,
    /// May post receives; not connected.
    Init,
    /// Connected for receiving.
    ReadyToReceive,
    /// Connected: may post sends.
    ReadyToSend,
    /// Send queue drained (only [`QueuePair::query_state`] reports it).
    SendQueueDrained,
    /// Send queue error (only [`QueuePair::query_state`] reports it).
    SendQueueError,
    /// A work request failed, or the device moved it to the error state: unusable.
    Error,
}

impl QueuePairState {
    fn from_raw(raw: c_uint) -> Option<QueuePairState> {
        Some(match raw {
            ffi::IBV_QPS_RESET => QueuePairState::Reset,
            ffi::IBV_QPS_INIT => QueuePairState::Init,
            ffi::IBV_QPS_RTR => QueuePairState::ReadyToReceive,
            ffi::IBV_QPS_RTS => QueuePairState::ReadyToSend,
            ffi::IBV_QPS_SQD => QueuePairState::SendQueueDrained,
            ffi::IBV_QPS_SQE => QueuePairState::SendQueueError,
            ffi::IBV_QPS_ERR => QueuePairState::Error,
            _ => return None,
        })
    }
}

/// What a queue pair tells its peer so that the peer can connect to it: a plain value for any
/// control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qp_num: u32,
    /// First packet sequence number it sends (24 bits).
    pub psn: u32,
    /// Its port's GID (RoCE: the IP address it sends from).
    pub gid: [u8; 16],
    /// Its port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Its port's active MTU in bytes (256, 512, 1024, 2048 or 4096).
    pub mtu_bytes: u32,
    /// Most RDMA READs and atomics it accepts outstanding from us (and issues to us).
    pub read_atomic_depth: u8,
}

impl Endpoint {
    /// Checks an endpoint that came from a peer.
    ///
    /// # Errors
    /// `InvalidPeer` naming the rule broken.
    pub fn check(&self) -> Result<(), VerbsError> {
        if self.qp_num > TWENTY_FOUR_BITS || self.qp_num < 2 {
            return Err(VerbsError::InvalidPeer { reason: "queue pair number outside 2..2^24" });
        }
        if self.psn > TWENTY_FOUR_BITS {
            return Err(VerbsError::InvalidPeer { reason: "packet sequence number above 2^24" });
        }
        if mtu_code(self.mtu_bytes).is_none() {
            return Err(VerbsError::InvalidPeer { reason: "MTU is not 256, 512, 1024, 2048 or 4096" });
        }
        if self.read_atomic_depth == 0 {
            return Err(VerbsError::InvalidPeer { reason: "read/atomic depth is zero" });
        }
        Ok(())
    }
}

fn mtu_code(bytes: u32) -> Option<c_uint> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// How a queue pair is made and connected. `Default` gives the bounds of `verbs::limits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePairOptions {
    /// Send requests posted and not yet known complete, at most (1 to `QUEUE_DEPTH_MAX`).
    pub send_depth: u32,
    /// Receive buffers posted at once, at most (1 to `QUEUE_DEPTH_MAX`).
    pub receive_depth: u32,
    /// At least one send in this many is signalled (1 to `send_depth`).
    pub signal_interval: u32,
    /// Whether to create a completion channel (an fd to sleep on when idle).
    pub completion_channel: bool,
    /// Local ACK timeout exponent (4.096 µs * 2^n per attempt; 1 to 31).
    pub timeout_exponent: u8,
    /// Transport retries before `RETRY_EXC_ERR` (0 to 6; Soft-RoCE takes 7 as "forever").
    pub retry_count: u8,
    /// Receiver-not-ready retries (0 to 6; 7, "forever", is refused: it could hang).
    pub rnr_retry: u8,
    /// The RNR NAK timer code this side asks senders to wait (0 to 31).
    pub min_rnr_timer: u8,
}

impl Default for QueuePairOptions {
    fn default() -> Self {
        QueuePairOptions {
            send_depth: SEND_DEPTH_DEFAULT,
            receive_depth: RECEIVE_DEPTH_DEFAULT,
            signal_interval: SIGNAL_INTERVAL_DEFAULT,
            completion_channel: true,
            timeout_exponent: TIMEOUT_EXPONENT_DEFAULT,
            retry_count: RETRY_COUNT_DEFAULT,
            rnr_retry: RNR_RETRY_DEFAULT,
            min_rnr_timer: MIN_RNR_TIMER_DEFAULT,
        }
    }
}

impl QueuePairOptions {
    /// Checks every field against its range.
    ///
    /// # Errors
    /// `InvalidArgument` naming the rule broken.
    pub fn validate(&self) -> Result<(), VerbsError> {
        let invalid = |reason| Err(VerbsError::InvalidArgument { reason });
        if self.send_depth == 0 || self.send_depth > QUEUE_DEPTH_MAX {
            return invalid("send_depth must be 1 to QUEUE_DEPTH_MAX");
        }
        if self.receive_depth == 0 || self.receive_depth > QUEUE_DEPTH_MAX {
            return invalid("receive_depth must be 1 to QUEUE_DEPTH_MAX");
        }
        if self.signal_interval == 0 || self.signal_interval > self.send_depth {
            return invalid("signal_interval must be 1 to send_depth");
        }
        if self.timeout_exponent == 0 || self.timeout_exponent > 31 {
            return invalid("timeout_exponent must be 1 to 31 (0 would mean: wait forever)");
        }
        if self.retry_count > 6 {
            return invalid("retry_count must be 0 to 6 (7 means retry forever on Soft-RoCE)");
        }
        if self.rnr_retry > 6 {
            return invalid("rnr_retry must be 0 to 6 (7 means retry forever)");
        }
        if self.min_rnr_timer > 31 {
            return invalid("min_rnr_timer must be 0 to 31");
        }
        Ok(())
    }
}

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

/// A receive buffer to post: `len_bytes` at `offset_bytes` of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveBuffer {
    /// Offset in the region.
    pub offset_bytes: u64,
    /// Length (the largest message it accepts).
    pub len_bytes: u32,
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
pub struct Completion(IbvWc);

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
struct Tracker {
    depth: u32,
    /// The sequence number the next request gets.
    next: u64,
    /// Every request below this is known complete.
    completed: u64,
    /// The region each outstanding request names, by `sequence % depth`.
    pins: Box<[Option<Arc<MrInner>>]>,
}

impl Tracker {
    fn new(depth: u32) -> Tracker {
        Tracker { depth, next: 0, completed: 0, pins: (0..depth).map(|_| None).collect() }
    }

    fn outstanding(&self) -> u32 {
        (self.next - self.completed) as u32
    }

    fn slot(&self, sequence: u64) -> usize {
        (sequence % u64::from(self.depth)) as usize
    }

    /// Requests up to `sequence` are done: release their regions.
    fn complete_through(&mut self, sequence: u64) {
        // A sequence from outside the posted range (a provider bug) releases nothing wrongly.
        let end = sequence.saturating_add(1).min(self.next);
        while self.completed < end {
            let slot = self.slot(self.completed);
            self.pins[slot] = None;
            self.completed += 1;
        }
    }

    /// Forgets requests staged from `self.next + from` on (not posted).
    fn unstage(&mut self, from: u32, to: u32) {
        for offset in from..to {
            let slot = self.slot(self.next + u64::from(offset));
            self.pins[slot] = None;
        }
    }
}

/// A completion queue, destroyed on drop.
struct CompletionQueue {
    api: &'static Api,
    raw: NonNull<IbvCq>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq, destroyed once, after the queue pair that used it
        // (field order of QueuePair); every event taken from the channel was acked at once.
        let _ = unsafe { (self.api.destroy_cq)(self.raw.as_ptr()) };
    }
}

/// A completion channel, destroyed on drop (after its completion queues).
struct Channel {
    api: &'static Api,
    raw: NonNull<IbvCompChannel>,
    fd: RawFd,
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed once, after the completion
        // queues attached to it (field order of QueuePair).
        let _ = unsafe { (self.api.destroy_comp_channel)(self.raw.as_ptr()) };
    }
}

/// The queue pair itself, destroyed on drop (first of all a QueuePair's parts).
struct RawQueuePair {
    api: &'static Api,
    raw: NonNull<IbvQp>,
}

impl Drop for RawQueuePair {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once. After this the device touches none
        // of the memory its requests named, so the region references may go.
        let _ = unsafe { (self.api.destroy_qp)(self.raw.as_ptr()) };
    }
}

type PostSend = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
type PollCq = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
type NotifyCq = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;

/// A reliable connected (RC) queue pair with its completion queues.
pub struct QueuePair {
    // Field order is drop order: the queue pair, then its completion queues, then the channel,
    // then the region references, then the protection domain.
    raw: RawQueuePair,
    send_cq: CompletionQueue,
    receive_cq: CompletionQueue,
    channel: Option<Channel>,
    send: Tracker,
    receive: Tracker,
    pd: ProtectionDomain,
    post_send: PostSend,
    post_recv: PostRecv,
    poll_cq: PollCq,
    notify_cq: NotifyCq,
    options: QueuePairOptions,
    port: PortInfo,
    qp_num: u32,
    psn: u32,
    state: QueuePairState,
    failure: Option<WorkStatus>,
    /// Sends since the last signalled one.
    unsignalled_run: u32,
    /// The highest signalled send sequence posted.
    last_signalled: Option<u64>,
    event_wakeups: u64,
    // Scratch work requests, reused by every post (no allocation on the data path).
    send_requests: Box<[IbvSendWr]>,
    send_entries: Box<[IbvSge]>,
    receive_requests: Box<[IbvRecvWr]>,
    receive_entries: Box<[IbvSge]>,
}

// SAFETY: the raw pointers are libibverbs objects (usable from any thread) and the scratch
// buffers, which are owned by this value and touched only through `&mut self`.
unsafe impl Send for QueuePair {}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("QueuePair")
            .field("qp_num", &self.qp_num)
            .field("state", &self.state)
            .field("send_outstanding", &self.send.outstanding())
            .field("receive_outstanding", &self.receive.outstanding())
            .finish()
    }
}

fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is seeded from the OS once per thread and then perturbed per
    // instance; mixed with the time, it makes PSNs differ across connections and restarts,
    // which is all a PSN needs (it is not a secret).
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    (hasher.finish() as u32) & TWENTY_FOUR_BITS
}

fn missing_op(name: &'static str) -> VerbsError {
    VerbsError::Call { call: name, source: std::io::Error::from_raw_os_error(libc::ENOSYS) }
}

fn create_cq(
    context: &Context,
    depth: u32,
    token: usize,
    channel: Option<&Channel>,
) -> Result<CompletionQueue, VerbsError> {
    let api = context.inner.api;
    let channel = channel.map_or(std::ptr::null_mut(), |channel| channel.raw.as_ptr());
    // SAFETY: a live context; the channel (if any) outlives the CQ (QueuePair field order);
    // the cq_context is an opaque token, never dereferenced.
    let raw = unsafe { (api.create_cq)(context.inner.raw.as_ptr(), depth as c_int, token as *mut _, channel, 0) };
    let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_create_cq", 0))?;
    Ok(CompletionQueue { api, raw })
}

fn create_channel(context: &Context) -> Result<Channel, VerbsError> {
    let api = context.inner.api;
    // SAFETY: a live context.
    let raw = unsafe { (api.create_comp_channel)(context.inner.raw.as_ptr()) };
    let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_create_comp_channel", 0))?;
    // SAFETY: ibv_create_comp_channel returned a valid channel.
    let fd = unsafe { (*raw.as_ptr()).fd };
    let channel = Channel { api, raw, fd };
    // Non-blocking, so that taking events never blocks: waits sleep in poll(2) with a bound.
    // SAFETY: fcntl on a descriptor the channel owns, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(VerbsError::Call { call: "fcntl (completion channel)", source: std::io::Error::last_os_error() });
    }
    Ok(channel)
}

impl QueuePair {
    /// Creates an RC queue pair on `pd` and moves it to INIT (receives may be posted from now).
    ///
    /// # Errors
    /// `InvalidArgument` for options out of range; `Call` when the device refuses a completion
    /// channel, completion queue or queue pair, or the INIT transition.
    pub fn new(pd: &ProtectionDomain, options: &QueuePairOptions) -> Result<QueuePair, VerbsError> {
        options.validate()?;
        let context = pd.context();
        let api = context.inner.api;
        // SAFETY: a live context; the ops table is filled by the provider at open and never
        // changes after.
        let ops = unsafe { &(*context.inner.raw.as_ptr()).ops };
        let post_send = ops.post_send.ok_or_else(|| missing_op("ibv_post_send"))?;
        let post_recv = ops.post_recv.ok_or_else(|| missing_op("ibv_post_recv"))?;
        let poll_cq = ops.poll_cq.ok_or_else(|| missing_op("ibv_poll_cq"))?;
        let notify_cq = ops.req_notify_cq.ok_or_else(|| missing_op("ibv_req_notify_cq"))?;
        let channel = if options.completion_channel { Some(create_channel(context)?) } else { None };
        let send_cq = create_cq(context, options.send_depth, 1, channel.as_ref())?;
        let receive_cq = create_cq(context, options.receive_depth, 2, channel.as_ref())?;
        let mut init = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.raw.as_ptr(),
            recv_cq: receive_cq.raw.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: ffi::IbvQpCap {
                max_send_wr: options.send_depth,
                max_recv_wr: options.receive_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a live protection domain and CQs of the same device; `init` is a valid
        // ibv_qp_init_attr.
        let raw = unsafe { (api.create_qp)(pd.inner.raw.as_ptr(), &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| call_error("ibv_create_qp", 0))?;
        // SAFETY: ibv_create_qp returned a valid queue pair.
        let qp_num = unsafe { (*raw.as_ptr()).qp_num };
        let send_depth = options.send_depth as usize;
        let receive_depth = options.receive_depth as usize;
        let mut queue_pair = QueuePair {
            raw: RawQueuePair { api, raw },
            send_cq,
            receive_cq,
            channel,
            send: Tracker::new(options.send_depth),
            receive: Tracker::new(options.receive_depth),
            pd: pd.clone(),
            post_send,
            post_recv,
            poll_cq,
            notify_cq,
            options: options.clone(),
            port: context.port().clone(),
            qp_num,
            psn: random_psn(),
            state: QueuePairState::Reset,
            failure: None,
            unsignalled_run: 0,
            last_signalled: None,
            event_wakeups: 0,
            send_requests: vec![IbvSendWr::zeroed(); send_depth].into_boxed_slice(),
            send_entries: vec![IbvSge::default(); send_depth].into_boxed_slice(),
            receive_requests: vec![IbvRecvWr::zeroed(); receive_depth].into_boxed_slice(),
            receive_entries: vec![IbvSge::default(); receive_depth].into_boxed_slice(),
        };
        let mut attr = IbvQpAttr {
            qp_state: ffi::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: queue_pair.port.port,
            qp_access_flags: (ffi::IBV_ACCESS_REMOTE_READ
                | ffi::IBV_ACCESS_REMOTE_WRITE
                | ffi::IBV_ACCESS_REMOTE_ATOMIC) as c_uint,
            ..IbvQpAttr::default()
        };
        queue_pair.modify(
            &mut attr,
            ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS,
        )?;
        queue_pair.state = QueuePairState::Init;
        Ok(queue_pair)
    }

    fn modify(&mut self, attr: &mut IbvQpAttr, mask: c_int) -> Result<(), VerbsError> {
        // SAFETY: a live queue pair and a valid attribute struct.
        let returned = unsafe { (self.raw.api.modify_qp)(self.raw.raw.as_ptr(), attr, mask) };
        if returned != 0 {
            return Err(call_error("ibv_modify_qp", returned));
        }
        Ok(())
    }

    /// What the peer needs to connect to this queue pair.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            qp_num: self.qp_num,
            psn: self.psn,
            gid: self.port.gid,
            lid: self.port.lid,
            mtu_bytes: self.port.active_mtu_bytes,
            read_atomic_depth: self.port.read_atomic_depth.min(READ_ATOMIC_DEPTH_MAX),
        }
    }

    /// Connects to `peer` (INIT -> RTR -> RTS). Once.
    ///
    /// # Errors
    /// `InvalidPeer` for a malformed endpoint (or a zero GID on RoCE), `InvalidArgument` when
    /// not in INIT, `Call` when the device refuses a transition (e.g. no route to the GID).
    pub fn connect(&mut self, peer: &Endpoint) -> Result<(), VerbsError> {
        peer.check()?;
        if self.state != QueuePairState::Init {
            return Err(VerbsError::InvalidArgument { reason: "connect once, from INIT" });
        }
        let routed = self.port.link_layer != LinkLayer::InfiniBand;
        if routed && peer.gid == [0; 16] {
            return Err(VerbsError::InvalidPeer { reason: "a RoCE peer needs a GID" });
        }
        let mtu = mtu_code(self.port.active_mtu_bytes.min(peer.mtu_bytes)).unwrap_or(ffi::IBV_MTU_256);
        let depth = self.port.read_atomic_depth.min(peer.read_atomic_depth).max(1);
        let mut attr = IbvQpAttr {
            qp_state: ffi::IBV_QPS_RTR,
            path_mtu: mtu,
            dest_qp_num: peer.qp_num,
            rq_psn: peer.psn,
            max_dest_rd_atomic: self.port.read_atomic_depth,
            min_rnr_timer: self.options.min_rnr_timer,
            ah_attr: ffi::IbvAhAttr {
                grh: ffi::IbvGlobalRoute {
                    dgid: ffi::IbvGid { raw: peer.gid },
                    flow_label: 0,
                    sgid_index: self.port.gid_index,
                    hop_limit: HOP_LIMIT,
                    traffic_class: 0,
                },
                dlid: peer.lid,
                sl: 0,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(routed),
                port_num: self.port.port,
            },
            ..IbvQpAttr::default()
        };
        self.modify(
            &mut attr,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
        )?;
        self.state = QueuePairState::ReadyToReceive;
        let mut attr = IbvQpAttr {
            qp_state: ffi::IBV_QPS_RTS,
            timeout: self.options.timeout_exponent,
            retry_cnt: self.options.retry_count,
            rnr_retry: self.options.rnr_retry,
            sq_psn: self.psn,
            max_rd_atomic: depth,
            ..IbvQpAttr::default()
        };
        self.modify(
            &mut attr,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
        )?;
        self.state = QueuePairState::ReadyToSend;
        Ok(())
    }

    /// Its state as this process drove it.
    pub fn state(&self) -> QueuePairState {
        self.state
    }

    /// Asks the device for the queue pair's state (it may have moved to the error state on
    /// its own, e.g. on a fatal device event, before any completion said so).
    ///
    /// # Errors
    /// `Call` when the query fails or returns a state this crate does not know.
    pub fn query_state(&self) -> Result<QueuePairState, VerbsError> {
        let mut attr = IbvQpAttr::default();
        // SAFETY: an all-zero ibv_qp_init_attr is valid (null pointers, zero integers).
        let mut init: IbvQpInitAttr = unsafe { std::mem::zeroed() };
        // SAFETY: a live queue pair and two valid out-structs.
        let returned =
            unsafe { (self.raw.api.query_qp)(self.raw.raw.as_ptr(), &mut attr, ffi::IBV_QP_STATE, &mut init) };
        if returned != 0 {
            return Err(call_error("ibv_query_qp", returned));
        }
        QueuePairState::from_raw(attr.qp_state).ok_or_else(|| VerbsError::Call {
            call: "ibv_query_qp",
            source: std::io::Error::other(format!("unknown queue pair state {}", attr.qp_state)),
        })
    }

    /// The first failed completion's status, if one failed.
    pub fn failure(&self) -> Option<WorkStatus> {
        self.failure
    }

    /// The port it uses.
    pub fn port(&self) -> &PortInfo {
        &self.port
    }

    /// Send requests posted and not yet known complete.
    pub fn send_outstanding(&self) -> u32 {
        self.send.outstanding()
    }

    /// Receive buffers posted and not yet filled.
    pub fn receive_outstanding(&self) -> u32 {
        self.receive.outstanding()
    }

    /// How often a wait slept on the completion channel and was woken by an event.
    pub fn event_wakeups(&self) -> u64 {
        self.event_wakeups
    }

    fn check_usable(&self) -> Result<(), VerbsError> {
        if let Some(status) = self.failure {
            return Err(VerbsError::QueuePairFailed { status });
        }
        Ok(())
    }

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

    /// Posts receive buffers in `region`, with one doorbell. Allowed from INIT on.
    ///
    /// # Errors
    /// `QueuePairFailed` after a failure; `QueueFull` beyond `receive_depth`; `OutOfBounds`,
    /// `AccessDenied` (the region needs `LOCAL_WRITE`), `InvalidArgument` (a region of another
    /// protection domain, an empty or oversized buffer); `Call` when the post fails.
    pub fn post_receives(&mut self, region: &MemoryRegion, buffers: &[ReceiveBuffer]) -> Result<WorkRange, VerbsError> {
        self.check_usable()?;
        let first = self.receive.next;
        if buffers.is_empty() {
            return Ok(WorkRange { first, end: first });
        }
        let free = self.receive.depth - self.receive.outstanding();
        if buffers.len() > free as usize {
            return Err(VerbsError::QueueFull {
                queue: WorkQueue::Receive,
                outstanding: self.receive.outstanding(),
                depth: self.receive.depth,
            });
        }
        self.check_region(region, RegionAccess::LOCAL_WRITE)?;
        for buffer in buffers {
            if buffer.len_bytes == 0 || buffer.len_bytes > TRANSFER_BYTES_MAX {
                return Err(VerbsError::InvalidArgument { reason: "a receive buffer must hold 1 to 2^31 bytes" });
            }
            region.local_address(buffer.offset_bytes, u64::from(buffer.len_bytes))?;
        }
        let count = buffers.len();
        let requests = self.receive_requests.as_mut_ptr();
        let entries = self.receive_entries.as_mut_ptr();
        for (index, buffer) in buffers.iter().enumerate() {
            let sequence = first + index as u64;
            let entry = IbvSge {
                addr: region.inner.address + buffer.offset_bytes,
                length: buffer.len_bytes,
                lkey: region.inner.lkey,
            };
            // SAFETY: index < count <= receive_depth, the length of both scratch slices; every
            // pointer here derives from `requests` / `entries`, taken once above, so the
            // addresses handed to the device stay valid.
            unsafe {
                let next = if index + 1 < count { requests.add(index + 1) } else { std::ptr::null_mut() };
                entries.add(index).write(entry);
                let sg_list = entries.add(index);
                requests.add(index).write(IbvRecvWr { wr_id: sequence | RECEIVE_BIT, next, sg_list, num_sge: 1 });
            }
            let slot = self.receive.slot(sequence);
            self.receive.pins[slot] = Some(Arc::clone(&region.inner));
        }
        let mut bad: *mut IbvRecvWr = std::ptr::null_mut();
        // SAFETY: a live queue pair; `count` linked requests and their entries live in this
        // value's scratch buffers and name memory of registered regions, which the pins keep
        // registered until their completions.
        let returned = unsafe { (self.post_recv)(self.raw.raw.as_ptr(), requests, &mut bad) };
        let accepted = if returned == 0 { count } else { accepted_before(requests, bad, count) };
        self.receive.unstage(accepted as u32, count as u32);
        self.receive.next += accepted as u64;
        if returned != 0 {
            return Err(call_error("ibv_post_recv", returned));
        }
        Ok(WorkRange { first, end: self.receive.next })
    }

    fn check_region(&self, region: &MemoryRegion, needed: RegionAccess) -> Result<(), VerbsError> {
        if !Arc::ptr_eq(&region.inner.pd.inner, &self.pd.inner) {
            return Err(VerbsError::InvalidArgument { reason: "the region belongs to another protection domain" });
        }
        if !region.access().contains(needed) {
            return Err(VerbsError::AccessDenied { needed: "LOCAL_WRITE" });
        }
        Ok(())
    }

    /// Polls up to `out.len()` send completions; returns those found (maybe none).
    ///
    /// # Errors
    /// `CompletionFailed` for the first failed completion, `QueuePairFailed` for any after it;
    /// `Call` when polling itself fails.
    pub fn poll_send<'c>(&mut self, out: &'c mut [Completion]) -> Result<&'c [Completion], VerbsError> {
        let found = self.poll_queue(WorkQueue::Send, out)?;
        Ok(&out[..found])
    }

    /// Polls up to `out.len()` receive completions; returns those found (maybe none).
    ///
    /// # Errors
    /// As [`QueuePair::poll_send`].
    pub fn poll_receive<'c>(&mut self, out: &'c mut [Completion]) -> Result<&'c [Completion], VerbsError> {
        let found = self.poll_queue(WorkQueue::Receive, out)?;
        Ok(&out[..found])
    }

    fn poll_queue(&mut self, queue: WorkQueue, out: &mut [Completion]) -> Result<usize, VerbsError> {
        let (cq, tracker) = match queue {
            WorkQueue::Send => (self.send_cq.raw, &mut self.send),
            WorkQueue::Receive => (self.receive_cq.raw, &mut self.receive),
        };
        let capacity = out.len().min(c_int::MAX as usize) as c_int;
        // SAFETY: a live CQ; `out` holds `capacity` ibv_wc (Completion is repr(transparent)).
        let found = unsafe { (self.poll_cq)(cq.as_ptr(), capacity, out.as_mut_ptr().cast::<IbvWc>()) };
        if found < 0 {
            return Err(VerbsError::Call {
                call: "ibv_poll_cq",
                source: std::io::Error::other(format!("returned {found}")),
            });
        }
        let found = found as usize;
        let mut first_failure = None;
        for completion in &out[..found] {
            tracker.complete_through(completion.sequence());
            if let Some(status) = WorkStatus::from_raw(completion.0.status) {
                first_failure.get_or_insert((status, completion.sequence(), completion.0.vendor_err));
            }
        }
        let Some((status, sequence, vendor_error)) = first_failure else {
            return Ok(found);
        };
        self.state = QueuePairState::Error;
        match self.failure {
            Some(first) => Err(VerbsError::QueuePairFailed { status: first }),
            None => {
                self.failure = Some(status);
                Err(VerbsError::CompletionFailed { status, queue, sequence, vendor_error })
            }
        }
    }

    /// Waits up to `timeout` for send completions: spins on the queue, then (with a channel)
    /// sleeps on the channel's descriptor, else sleeps in short steps polling in between.
    ///
    /// # Errors
    /// `Timeout` when none came; `InvalidArgument` when no send is outstanding; the errors of
    /// [`QueuePair::poll_send`].
    pub fn wait_send<'c>(
        &mut self,
        out: &'c mut [Completion],
        timeout: Duration,
    ) -> Result<&'c [Completion], VerbsError> {
        let found = self.wait_queue(WorkQueue::Send, out, timeout)?;
        Ok(&out[..found])
    }

    /// Waits up to `timeout` for receive completions (see [`QueuePair::wait_send`]).
    ///
    /// # Errors
    /// `Timeout` when none came; `InvalidArgument` when no receive is posted; the errors of
    /// [`QueuePair::poll_receive`].
    pub fn wait_receive<'c>(
        &mut self,
        out: &'c mut [Completion],
        timeout: Duration,
    ) -> Result<&'c [Completion], VerbsError> {
        let found = self.wait_queue(WorkQueue::Receive, out, timeout)?;
        Ok(&out[..found])
    }

    /// Waits up to `timeout` until every send up to `sequence` (which must be covered by a
    /// signalled send, e.g. the last of a batch posted with [`SendBatch::post`]) completed.
    ///
    /// # Errors
    /// `InvalidArgument` for a sequence not posted or not covered by a signalled send;
    /// otherwise as [`QueuePair::wait_send`].
    pub fn wait_send_through(&mut self, sequence: u64, timeout: Duration) -> Result<(), VerbsError> {
        if sequence >= self.send.next {
            return Err(VerbsError::InvalidArgument { reason: "that send was never posted" });
        }
        if self.last_signalled.is_none_or(|signalled| signalled < sequence) {
            return Err(VerbsError::InvalidArgument { reason: "no signalled send covers that sequence" });
        }
        let started = Instant::now();
        let mut scratch = [Completion::default(); POLL_BATCH];
        while self.send.completed <= sequence {
            let remaining = timeout.saturating_sub(started.elapsed());
            self.wait_queue(WorkQueue::Send, &mut scratch, remaining)?;
        }
        Ok(())
    }

    fn wait_queue(&mut self, queue: WorkQueue, out: &mut [Completion], timeout: Duration) -> Result<usize, VerbsError> {
        let outstanding = match queue {
            WorkQueue::Send => self.send.outstanding(),
            WorkQueue::Receive => self.receive.outstanding(),
        };
        if outstanding == 0 {
            self.check_usable()?;
            return Err(VerbsError::InvalidArgument { reason: "nothing outstanding to wait for" });
        }
        if out.is_empty() {
            return Err(VerbsError::InvalidArgument { reason: "an empty completion buffer" });
        }
        let started = Instant::now();
        for _ in 0..WAIT_SPIN_POLLS {
            let found = self.poll_queue(queue, out)?;
            if found > 0 {
                return Ok(found);
            }
            std::hint::spin_loop();
        }
        let mut sleep_us = 1;
        loop {
            let elapsed = started.elapsed();
            if elapsed >= timeout {
                return Err(VerbsError::Timeout { waited_ms: elapsed.as_millis() as u64 });
            }
            let remaining = timeout - elapsed;
            if self.channel.is_some() {
                // Arm, then poll again: a completion that came before the arming raises no
                // event, and would otherwise be slept past.
                self.arm_queue(queue)?;
                let found = self.poll_queue(queue, out)?;
                if found > 0 {
                    return Ok(found);
                }
                if self.sleep_on_channel(remaining)? > 0 {
                    self.event_wakeups += 1;
                }
            } else {
                std::thread::sleep(Duration::from_micros(sleep_us).min(remaining));
                sleep_us = (sleep_us * 2).min(WAIT_SLEEP_MAX_US);
            }
            let found = self.poll_queue(queue, out)?;
            if found > 0 {
                return Ok(found);
            }
        }
    }

    fn arm_queue(&mut self, queue: WorkQueue) -> Result<(), VerbsError> {
        let cq = match queue {
            WorkQueue::Send => self.send_cq.raw,
            WorkQueue::Receive => self.receive_cq.raw,
        };
        // SAFETY: a live CQ; 0 = notify on any completion, not only solicited ones.
        let returned = unsafe { (self.notify_cq)(cq.as_ptr(), 0) };
        if returned != 0 {
            return Err(call_error("ibv_req_notify_cq", returned));
        }
        Ok(())
    }

    /// Sleeps until the channel's descriptor is readable or `timeout` passes; then takes the
    /// events. Returns how many it took.
    fn sleep_on_channel(&mut self, timeout: Duration) -> Result<u32, VerbsError> {
        let Some(channel) = &self.channel else { return Ok(0) };
        let mut descriptor = libc::pollfd { fd: channel.fd, events: libc::POLLIN, revents: 0 };
        let timeout_ms = timeout.as_millis().clamp(1, c_int::MAX as u128) as c_int;
        // SAFETY: one valid pollfd for a descriptor the channel owns.
        let ready = unsafe { libc::poll(&mut descriptor, 1, timeout_ms) };
        if ready < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(VerbsError::Call { call: "poll (completion channel)", source: error });
        }
        if ready == 0 {
            return Ok(0);
        }
        self.take_events()
    }

    /// The completion channel's descriptor (readable when an armed completion queue got a
    /// completion), for a poller's epoll; `None` without a channel.
    pub fn event_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the descriptor is owned by the channel, which lives as long as `self`.
        self.channel.as_ref().map(|channel| unsafe { BorrowedFd::borrow_raw(channel.fd) })
    }

    /// Arms both completion queues: the next completion of each makes [`QueuePair::event_fd`]
    /// readable. Poll both queues after arming, before sleeping (a completion that came first
    /// raises no event).
    ///
    /// # Errors
    /// `InvalidArgument` without a channel; `Call` when the device refuses.
    pub fn arm(&mut self) -> Result<(), VerbsError> {
        if self.channel.is_none() {
            return Err(VerbsError::InvalidArgument { reason: "the queue pair has no completion channel" });
        }
        self.arm_queue(WorkQueue::Send)?;
        self.arm_queue(WorkQueue::Receive)
    }

    /// Takes (and acknowledges) every event waiting on the channel without blocking; returns
    /// how many. A poller calls it when [`QueuePair::event_fd`] is readable, then polls.
    ///
    /// # Errors
    /// `Call` when reading the channel fails for another reason than "no event".
    pub fn take_events(&mut self) -> Result<u32, VerbsError> {
        let Some(channel) = &self.channel else { return Ok(0) };
        let mut taken = 0;
        while taken < EVENTS_PER_TAKE_MAX {
            let mut cq: *mut IbvCq = std::ptr::null_mut();
            let mut token: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: a live channel (non-blocking) and two valid out-pointers.
            let returned = unsafe { (channel.api.get_cq_event)(channel.raw.as_ptr(), &mut cq, &mut token) };
            if returned != 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() == std::io::ErrorKind::WouldBlock {
                    break;
                }
                return Err(VerbsError::Call { call: "ibv_get_cq_event", source: error });
            }
            // SAFETY: `cq` is one of this queue pair's CQs (the only ones on this channel),
            // alive; acking at once keeps ibv_destroy_cq from waiting on it.
            unsafe { (channel.api.ack_cq_events)(cq, 1) };
            taken += 1;
        }
        Ok(taken)
    }
}

/// The number of requests of a linked list of `count` that a failed post accepted: those
/// before `bad` (all of them if `bad` is not in the list).
///
/// A provider that reports no `bad` (or one outside the list) is taken to have accepted all:
/// the safe side, since a request wrongly thought posted only keeps its region pinned until a
/// later completion, while one wrongly thought refused would unpin memory the NIC may write.
fn accepted_before<T>(first: *mut T, bad: *mut T, count: usize) -> usize {
    let offset = (bad as usize).wrapping_sub(first as usize) / std::mem::size_of::<T>().max(1);
    if bad.is_null() || offset > count {
        count
    } else {
        offset
    }
}

/// Send requests staged to be posted together (one `ibv_post_send`, one doorbell). Holds the
/// queue pair mutably; dropping it unposted posts nothing.
pub struct SendBatch<'q> {
    queue_pair: &'q mut QueuePair,
    len: u32,
}

impl std::fmt::Debug for SendBatch<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SendBatch").field("len", &self.len).finish()
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
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint { qp_num: 17, psn: 0x12_3456, gid: [7; 16], lid: 0, mtu_bytes: 1024, read_atomic_depth: 16 }
    }

    #[test]
    fn an_endpoint_is_a_plain_value_that_round_trips() {
        let json = serde_json::to_string(&endpoint()).expect("serialize");
        assert_eq!(serde_json::from_str::<Endpoint>(&json).expect("deserialize"), endpoint());
        endpoint().check().expect("valid");
    }

    #[test]
    fn a_malformed_peer_endpoint_is_refused() {
        let cases = [
            Endpoint { qp_num: 1 << 24, ..endpoint() },
            Endpoint { qp_num: 1, ..endpoint() },
            Endpoint { psn: 1 << 24, ..endpoint() },
            Endpoint { mtu_bytes: 1500, ..endpoint() },
            Endpoint { read_atomic_depth: 0, ..endpoint() },
        ];
        for case in cases {
            assert!(matches!(case.check(), Err(VerbsError::InvalidPeer { .. })), "{case:?}");
        }
    }

    #[test]
    fn options_out_of_range_are_refused() {
        QueuePairOptions::default().validate().expect("defaults are valid");
        let defaults = QueuePairOptions::default();
        let cases = [
            QueuePairOptions { send_depth: 0, ..defaults.clone() },
            QueuePairOptions { receive_depth: QUEUE_DEPTH_MAX + 1, ..defaults.clone() },
            QueuePairOptions { signal_interval: defaults.send_depth + 1, ..defaults.clone() },
            QueuePairOptions { signal_interval: 0, ..defaults.clone() },
            QueuePairOptions { timeout_exponent: 0, ..defaults.clone() },
            QueuePairOptions { retry_count: 7, ..defaults.clone() },
            QueuePairOptions { rnr_retry: 7, ..defaults.clone() },
            QueuePairOptions { min_rnr_timer: 32, ..defaults.clone() },
        ];
        for case in cases {
            assert!(matches!(case.validate(), Err(VerbsError::InvalidArgument { .. })), "{case:?}");
        }
    }

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
    fn a_failed_post_counts_the_requests_before_the_bad_one() {
        let mut requests = [IbvRecvWr::zeroed(); 4];
        let first = requests.as_mut_ptr();
        // SAFETY: index 2 of a 4-element array.
        let bad = unsafe { first.add(2) };
        assert_eq!(accepted_before(first, bad, 4), 2);
        assert_eq!(accepted_before(first, std::ptr::null_mut(), 4), 4);
        assert_eq!(accepted_before(first, first, 4), 0);
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
    fn work_ranges_count() {
        let range = WorkRange { first: 4, end: 7 };
        assert_eq!((range.len(), range.last(), range.is_empty()), (3, Some(6), false));
        let empty = WorkRange { first: 4, end: 4 };
        assert_eq!((empty.len(), empty.last(), empty.is_empty()), (0, None, true));
    }
}
