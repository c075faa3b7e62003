//! Reliable connected queue pairs: connection set-up from a peer's [`Endpoint`], posted
//! receives, completions polled in batches and waited for with a bound. Sends are posted in
//! batches (`batch.rs`); sequence numbers and completions are in `completion.rs`.
//!
//! # Contract
//! - A queue pair owns two completion queues (sends, receives) and, if asked, one completion
//!   channel that both report to: its file descriptor ([`QueuePair::event_fd`]) is what an idle
//!   poller sleeps on (epoll or poll), after [`QueuePair::arm`].
//! - Every wait is bounded: it spins on the queue, then sleeps on the channel (or in short
//!   steps without one), then returns [`VerbsError::Timeout`]. A wait for the queue pair's own
//!   sends spins through twice their typical round trip (`SpinBudget`, at most
//!   `SEND_SPIN_MAX_US`) before it sleeps; a wait for receives spins `WAIT_SPIN_POLLS` polls.
//! - The first failed completion moves the queue pair to the error state: it is returned as
//!   [`VerbsError::CompletionFailed`], and every later post or wait returns
//!   [`VerbsError::QueuePairFailed`] with that first status. The caller reconnects with a new
//!   queue pair.

use super::completion::{Channel, Completion, CompletionQueue, SpinBudget, Tracker, WorkRange, RECEIVE_BIT};
use super::device::{call_error, Context, LinkLayer, PortInfo};
use super::endpoint::{mtu_code, Endpoint, QueuePairOptions, TWENTY_FOUR_BITS};
use super::error::VerbsError;
use super::ffi::{self, Api, IbvCq, IbvQp, IbvQpAttr, IbvQpInitAttr, IbvRecvWr, IbvSendWr, IbvSge, IbvWc};
use super::limits::{
    HOP_LIMIT, POLL_BATCH, READ_ATOMIC_DEPTH_MAX, TRANSFER_BYTES_MAX, WAIT_SLEEP_MAX_US, WAIT_SPIN_POLLS,
};
use super::region::{MemoryRegion, ProtectionDomain, RegionAccess};
use super::status::{QueuePairState, WorkQueue, WorkStatus};
use std::ffi::{c_int, c_uint};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The number of requests of a linked list of `count` that a failed post accepted: those
/// before `bad` (all of them if `bad` is not in the list).
///
/// A provider that reports no `bad` (or one outside the list) is taken to have accepted all:
/// the safe side, since a request wrongly thought posted only keeps its region pinned until a
/// later completion, while one wrongly thought refused would unpin memory the NIC may write.
pub(crate) fn accepted_before<T>(first: *mut T, bad: *mut T, count: usize) -> usize {
    let offset = (bad as usize).wrapping_sub(first as usize) / std::mem::size_of::<T>().max(1);
    if bad.is_null() || offset > count {
        count
    } else {
        offset
    }
}

/// Most channel events taken in one call (each CQ raises at most one per arming).
const EVENTS_PER_TAKE_MAX: u32 = 64;

/// A receive buffer to post: `len_bytes` at `offset_bytes` of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveBuffer {
    /// Offset in the region.
    pub offset_bytes: u64,
    /// Length (the largest message it accepts).
    pub len_bytes: u32,
}

/// The queue pair itself, destroyed on drop (first of all a QueuePair's parts).
pub(crate) struct RawQueuePair {
    pub(crate) api: &'static Api,
    pub(crate) raw: NonNull<IbvQp>,
}

impl Drop for RawQueuePair {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once. After this the device touches none
        // of the memory its requests named, so the region references may go.
        let _ = unsafe { (self.api.destroy_qp)(self.raw.as_ptr()) };
    }
}

pub(crate) type PostSend = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
type PollCq = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
type NotifyCq = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;

/// A reliable connected (RC) queue pair with its completion queues.
pub struct QueuePair {
    // Field order is drop order: the queue pair, then its completion queues, then the channel,
    // then the region references, then the protection domain.
    pub(crate) raw: RawQueuePair,
    pub(crate) send_cq: CompletionQueue,
    pub(crate) receive_cq: CompletionQueue,
    pub(crate) channel: Option<Channel>,
    pub(crate) send: Tracker,
    pub(crate) receive: Tracker,
    pub(crate) pd: ProtectionDomain,
    pub(crate) post_send: PostSend,
    pub(crate) post_recv: PostRecv,
    pub(crate) poll_cq: PollCq,
    pub(crate) notify_cq: NotifyCq,
    pub(crate) options: QueuePairOptions,
    pub(crate) port: PortInfo,
    pub(crate) qp_num: u32,
    pub(crate) psn: u32,
    pub(crate) state: QueuePairState,
    pub(crate) failure: Option<WorkStatus>,
    /// Sends since the last signalled one.
    pub(crate) unsignalled_run: u32,
    /// The highest signalled send sequence posted.
    pub(crate) last_signalled: Option<u64>,
    pub(crate) event_wakeups: u64,
    /// How long a wait for this queue pair's sends spins before it sleeps.
    pub(crate) send_spin: SpinBudget,
    // Scratch work requests, reused by every post (no allocation on the data path).
    pub(crate) send_requests: Box<[IbvSendWr]>,
    pub(crate) send_entries: Box<[IbvSge]>,
    pub(crate) receive_requests: Box<[IbvRecvWr]>,
    pub(crate) receive_entries: Box<[IbvSge]>,
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
            send_spin: SpinBudget::default(),
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

    pub(crate) fn check_usable(&self) -> Result<(), VerbsError> {
        if let Some(status) = self.failure {
            return Err(VerbsError::QueuePairFailed { status });
        }
        Ok(())
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

    pub(crate) fn check_region(&self, region: &MemoryRegion, needed: RegionAccess) -> Result<(), VerbsError> {
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
    /// signalled send, e.g. the last of a batch posted with
    /// [`SendBatch::post`](super::SendBatch::post)) completed.
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
        let found = self.wait_queue_inner(queue, out, timeout, started)?;
        if queue == WorkQueue::Send {
            self.send_spin.observe(started.elapsed());
        }
        Ok(found)
    }

    fn wait_queue_inner(
        &mut self,
        queue: WorkQueue,
        out: &mut [Completion],
        timeout: Duration,
        started: Instant,
    ) -> Result<usize, VerbsError> {
        // Sends spin through their usual round trip (SpinBudget); receives, which wait for
        // whenever a peer speaks, spin only WAIT_SPIN_POLLS polls.
        let spin_for = match queue {
            WorkQueue::Send => self.send_spin.budget().min(timeout),
            WorkQueue::Receive => Duration::ZERO,
        };
        let mut polls = 0u32;
        loop {
            let found = self.poll_queue(queue, out)?;
            if found > 0 {
                return Ok(found);
            }
            polls = polls.wrapping_add(1);
            // Past the fixed spin, every 64 polls: read the clock, and yield the CPU to any
            // thread that waits for it (a vCPU shared by several clients' threads keeps serving
            // them all while each spins through its round trip).
            if polls >= WAIT_SPIN_POLLS && polls % 64 == 0 {
                if started.elapsed() >= spin_for {
                    break;
                }
                std::thread::yield_now();
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

    /// Arms only the receive queue (a thread that sleeps for received messages while others
    /// wait for their sends arms only what it waits for, so their completions do not wake it).
    ///
    /// # Errors
    /// `InvalidArgument` without a channel; `Call` when the device refuses.
    pub(crate) fn arm_receive(&mut self) -> Result<(), VerbsError> {
        if self.channel.is_none() {
            return Err(VerbsError::InvalidArgument { reason: "the queue pair has no completion channel" });
        }
        self.arm_queue(WorkQueue::Receive)
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
