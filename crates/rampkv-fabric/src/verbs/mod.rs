//! Real RDMA through libibverbs: devices, protection domains, registered memory, reliable
//! connected queue pairs, batched one-sided and two-sided work requests, completions.
//!
//! # Contract
//! - **Run-time loading.** libibverbs is opened with `dlopen` on first use, so this module is
//!   always compiled and the one binary runs everywhere: where libibverbs is missing every call
//!   returns [`VerbsError::LibraryNotFound`], where it has no device [`VerbsError::NoDevice`];
//!   neither panics. Nothing here links against libibverbs or needs its headers to build.
//! - **Types carry the rules** (rust-ibverbs' habits). Posting needs `&mut` on the
//!   [`QueuePair`]. A [`MemoryRegion`] named by a work request is kept registered and mapped
//!   until the hardware is done with it: the queue pair holds a reference to the region for
//!   every outstanding request and lets go only when a completion (or the queue pair's
//!   destruction) proves the request finished, so dropping a region early cannot free memory
//!   that the NIC still writes. A [`Completion`] is a value in the caller's buffer, borrowed from
//!   the poll that filled it. Every object keeps its parents alive (a queue pair its protection
//!   domain and device), so they are destroyed in the order libibverbs requires.
//! - **Registered memory is touched by the CPU only as 8-byte atomic words** (as in
//!   [`crate::words`]): the NIC may write it at any moment, so no Rust reference to its bytes is
//!   ever made.
//! - **Everything is bounded.** Send and receive queues have a fixed depth (a full queue is
//!   [`VerbsError::SendQueueFull`], not a wait); at least one send in every `signal_interval`
//!   is signalled, so a full queue always has a completion on its way; every wait takes a
//!   timeout (spin, then the completion channel's file descriptor, then
//!   [`VerbsError::Timeout`]). A failed completion (say, `RETRY_EXC_ERR` when the peer died)
//!   is [`VerbsError::CompletionFailed`] naming the status, and the queue pair refuses further
//!   posts with [`VerbsError::QueuePairFailed`]: never a hang.
//! - **Connection set-up is plain data.** A queue pair's [`Endpoint`] (QPN, PSN, GID, LID,
//!   MTU) and a region's [`RemoteRegion`] (address, length, rkey) are serializable values to
//!   exchange over any control channel.
//!
//! # Layout
//! - `ffi`: the C declarations and the run-time loader (all FFI types are private).
//! - `device`: device discovery, ports, GID choice, [`Context`] (an opened device and port).
//! - `region`: [`ProtectionDomain`], [`MemoryRegion`], [`RegionAccess`], [`RemoteRegion`].
//! - `endpoint`: [`Endpoint`] (what peers exchange to connect) and [`QueuePairOptions`].
//! - `queue_pair`: [`QueuePair`] (RC): connect, post receives, poll and wait with a bound.
//! - `batch`: [`SendBatch`]: READ, WRITE, atomics and SEND posted together, one doorbell.
//! - `completion`: [`Completion`], sequence numbers, the regions pinned by outstanding requests.
//! - `limits`: every bound of this module.
//!
//! # Fault model
//! A peer is trusted for nothing: its endpoint and region descriptors are checked for range
//! before use, and what it does with its memory can only fail our work requests (a
//! completion error), never our process. The NIC enforces access with rkeys; this module adds
//! no authentication (the control channel that carries the values must).
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc, clippy::missing_errors_doc)]

mod batch;
mod completion;
mod device;
mod endpoint;
mod ffi;
pub mod limits;
mod queue_pair;
mod region;

pub use batch::SendBatch;
pub use completion::{Completion, CompletionKind, WorkQueue, WorkRange};
pub use device::{
    choose_gid, devices, Context, DeviceSelection, DeviceSummary, GidEntry, GidKind, LinkLayer, PortInfo, PortSummary,
};
pub use endpoint::{Endpoint, QueuePairOptions};
pub use queue_pair::{QueuePair, QueuePairState, ReceiveBuffer};
pub use region::{MemoryRegion, ProtectionDomain, RegionAccess, RemoteRegion};

/// The status of a failed work completion (`enum ibv_wc_status`).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkStatus {
    /// `IBV_WC_LOC_LEN_ERR`: a local buffer too small (a receive shorter than the message).
    LocalLength,
    /// `IBV_WC_LOC_QP_OP_ERR`: the local queue pair found an inconsistent request.
    LocalQueuePairOperation,
    /// `IBV_WC_LOC_PROT_ERR`: a local buffer outside its region, or the wrong protection domain.
    LocalProtection,
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the queue pair was already in the error state.
    Flushed,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response from the peer.
    BadResponse,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local protection error on incoming data.
    LocalAccess,
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid (e.g. a message too long
    /// for its receive buffer).
    RemoteInvalidRequest,
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused access (wrong rkey, out of its region, or a
    /// right the region was not registered with).
    RemoteAccess,
    /// `IBV_WC_REM_OP_ERR`: the peer could not complete the operation.
    RemoteOperation,
    /// `IBV_WC_RETRY_EXC_ERR`: no answer within the transport retries (the peer is gone or
    /// unreachable).
    RetryExceeded,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive buffer posted, retries exhausted.
    ReceiverNotReadyRetryExceeded,
    /// `IBV_WC_REM_ABORT_ERR`: the peer aborted the operation.
    RemoteAborted,
    /// `IBV_WC_FATAL_ERR`: the device failed.
    Fatal,
    /// `IBV_WC_RESP_TIMEOUT_ERR`: the response did not come in time.
    ResponseTimeout,
    /// `IBV_WC_GENERAL_ERR`: any other error the provider reports.
    General,
    /// A status value this crate does not name.
    Other(u32),
}

impl WorkStatus {
    /// The status of a completion's `status` field; `None` for `IBV_WC_SUCCESS`.
    pub fn from_raw(status: u32) -> Option<WorkStatus> {
        Some(match status {
            0 => return None,
            1 => WorkStatus::LocalLength,
            2 => WorkStatus::LocalQueuePairOperation,
            4 => WorkStatus::LocalProtection,
            5 => WorkStatus::Flushed,
            7 => WorkStatus::BadResponse,
            8 => WorkStatus::LocalAccess,
            9 => WorkStatus::RemoteInvalidRequest,
            10 => WorkStatus::RemoteAccess,
            11 => WorkStatus::RemoteOperation,
            12 => WorkStatus::RetryExceeded,
            13 => WorkStatus::ReceiverNotReadyRetryExceeded,
            16 => WorkStatus::RemoteAborted,
            19 => WorkStatus::Fatal,
            20 => WorkStatus::ResponseTimeout,
            21 => WorkStatus::General,
            other => WorkStatus::Other(other),
        })
    }

    /// The libibverbs name of the status.
    pub fn name(self) -> &'static str {
        match self {
            WorkStatus::LocalLength => "IBV_WC_LOC_LEN_ERR",
            WorkStatus::LocalQueuePairOperation => "IBV_WC_LOC_QP_OP_ERR",
            WorkStatus::LocalProtection => "IBV_WC_LOC_PROT_ERR",
            WorkStatus::Flushed => "IBV_WC_WR_FLUSH_ERR",
            WorkStatus::BadResponse => "IBV_WC_BAD_RESP_ERR",
            WorkStatus::LocalAccess => "IBV_WC_LOC_ACCESS_ERR",
            WorkStatus::RemoteInvalidRequest => "IBV_WC_REM_INV_REQ_ERR",
            WorkStatus::RemoteAccess => "IBV_WC_REM_ACCESS_ERR",
            WorkStatus::RemoteOperation => "IBV_WC_REM_OP_ERR",
            WorkStatus::RetryExceeded => "IBV_WC_RETRY_EXC_ERR",
            WorkStatus::ReceiverNotReadyRetryExceeded => "IBV_WC_RNR_RETRY_EXC_ERR",
            WorkStatus::RemoteAborted => "IBV_WC_REM_ABORT_ERR",
            WorkStatus::Fatal => "IBV_WC_FATAL_ERR",
            WorkStatus::ResponseTimeout => "IBV_WC_RESP_TIMEOUT_ERR",
            WorkStatus::General => "IBV_WC_GENERAL_ERR",
            WorkStatus::Other(_) => "unnamed status",
        }
    }

    /// What the status means, for an error message.
    pub fn meaning(self) -> &'static str {
        match self {
            WorkStatus::LocalLength => "local buffer too small",
            WorkStatus::LocalQueuePairOperation => "local queue pair operation error",
            WorkStatus::LocalProtection => "local protection error",
            WorkStatus::Flushed => "flushed: the queue pair had failed",
            WorkStatus::BadResponse => "bad response from the peer",
            WorkStatus::LocalAccess => "local access error",
            WorkStatus::RemoteInvalidRequest => "the peer found the request invalid",
            WorkStatus::RemoteAccess => "the peer refused access to its memory",
            WorkStatus::RemoteOperation => "the peer failed the operation",
            WorkStatus::RetryExceeded => "transport retries exceeded: the peer is gone or unreachable",
            WorkStatus::ReceiverNotReadyRetryExceeded => "the peer posted no receive buffer in time",
            WorkStatus::RemoteAborted => "the peer aborted the operation",
            WorkStatus::Fatal => "fatal device error",
            WorkStatus::ResponseTimeout => "response timeout",
            WorkStatus::General => "general error",
            WorkStatus::Other(_) => "a status this build does not know",
        }
    }
}

impl std::fmt::Display for WorkStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkStatus::Other(raw) => write!(formatter, "status {raw} ({})", self.meaning()),
            _ => write!(formatter, "{} ({})", self.name(), self.meaning()),
        }
    }
}

/// Errors of the verbs layer.
///
/// The data-path variants (`SendQueueFull`, `OutOfBounds`, `Misaligned`, `CompletionFailed`,
/// `QueuePairFailed`, `Timeout`) carry no heap data, so returning them does not allocate.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// libibverbs could not be loaded (not installed: Debian/Ubuntu package `libibverbs1`,
    /// with `ibverbs-providers` for the drivers).
    #[error("libibverbs not found ({library}: {detail})")]
    LibraryNotFound {
        /// What was loaded.
        library: String,
        /// The dynamic linker's message.
        detail: String,
    },
    /// The loaded libibverbs lacks a function.
    #[error("{library} lacks {symbol}: not a usable libibverbs")]
    MissingSymbol {
        /// What was loaded.
        library: String,
        /// The missing function.
        symbol: &'static str,
    },
    /// libibverbs loaded but found no RDMA device.
    #[error("no RDMA device")]
    NoDevice,
    /// A device was asked for by name and is not there.
    #[error("no RDMA device named {name} (present: {present})")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The devices present, comma-separated.
        present: String,
    },
    /// No port of the device(s) is ACTIVE, or the one asked for is not.
    #[error("no active port on RDMA device {device}")]
    NoActivePort {
        /// The device looked at (or every device, comma-separated).
        device: String,
    },
    /// The port has no GID that a connection could use (or the GID index asked for is empty).
    #[error("no usable GID on {device} port {port}")]
    NoUsableGid {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
    },
    /// A libibverbs call failed.
    #[error("{call} failed: {source}")]
    Call {
        /// The function.
        call: &'static str,
        /// The errno it reported.
        #[source]
        source: std::io::Error,
    },
    /// An argument breaks a rule of this API (stated in the reason).
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// The rule.
        reason: &'static str,
    },
    /// A peer's endpoint or region descriptor is malformed.
    #[error("invalid peer descriptor: {reason}")]
    InvalidPeer {
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A byte range does not fit in a region.
    #[error("{len_bytes} bytes at offset {offset_bytes} do not fit in a region of {region_len_bytes} bytes")]
    OutOfBounds {
        /// Requested offset.
        offset_bytes: u64,
        /// Requested length.
        len_bytes: u64,
        /// The region's length.
        region_len_bytes: u64,
    },
    /// An atomic or word access not 8-byte aligned.
    #[error("offset {offset_bytes} is not 8-byte aligned")]
    Misaligned {
        /// The offending offset (or address).
        offset_bytes: u64,
    },
    /// The region lacks the access right an operation needs.
    #[error("the memory region was not registered with {needed}")]
    AccessDenied {
        /// The missing right.
        needed: &'static str,
    },
    /// The send queue (or receive queue) has no room: poll completions first.
    #[error("{queue:?} queue full: {outstanding} work requests outstanding, depth {depth}")]
    QueueFull {
        /// Which queue.
        queue: WorkQueue,
        /// Requests posted and not yet known complete.
        outstanding: u32,
        /// The queue's depth.
        depth: u32,
    },
    /// The queue pair is not connected yet (or no longer).
    #[error("queue pair is {state:?}, not ready to send")]
    NotConnected {
        /// Its state.
        state: QueuePairState,
    },
    /// A work request completed with an error; the queue pair is now in the error state.
    #[error("{queue:?} work request {sequence} failed: {status}")]
    CompletionFailed {
        /// The completion's status.
        status: WorkStatus,
        /// The queue it was posted to.
        queue: WorkQueue,
        /// Its sequence number (see [`WorkRange`]).
        sequence: u64,
        /// The provider's own error code.
        vendor_error: u32,
    },
    /// The queue pair failed earlier (this was the first failed completion's status).
    #[error("queue pair failed earlier: {status}")]
    QueuePairFailed {
        /// The first failure's status.
        status: WorkStatus,
    },
    /// No completion within the bound.
    #[error("no completion within {waited_ms} ms")]
    Timeout {
        /// How long the wait lasted.
        waited_ms: u64,
    },
}

impl From<ffi::LoadError> for VerbsError {
    fn from(error: ffi::LoadError) -> Self {
        match error {
            ffi::LoadError::NotFound { library, detail } => VerbsError::LibraryNotFound { library, detail },
            ffi::LoadError::MissingSymbol { library, symbol } => VerbsError::MissingSymbol { library, symbol },
        }
    }
}

/// Is libibverbs usable here, and with which port? The probe a process makes at start to
/// tell peers what it can do: `Ok` with the first active port (by the default
/// [`DeviceSelection`]), or the reason it cannot.
///
/// # Errors
/// `LibraryNotFound`, `NoDevice`, `NoActivePort`, `NoUsableGid`, or `Call` when a device cannot
/// be opened or queried.
pub fn probe() -> Result<PortInfo, VerbsError> {
    Context::open(&DeviceSelection::default()).map(|context| context.port().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_value_maps_and_names_itself() {
        assert_eq!(WorkStatus::from_raw(0), None);
        assert_eq!(WorkStatus::from_raw(12), Some(WorkStatus::RetryExceeded));
        assert_eq!(WorkStatus::from_raw(5), Some(WorkStatus::Flushed));
        assert_eq!(WorkStatus::from_raw(999), Some(WorkStatus::Other(999)));
        for raw in 1..=25 {
            let status = WorkStatus::from_raw(raw).expect("not success");
            assert!(!status.to_string().is_empty());
        }
        let message = VerbsError::CompletionFailed {
            status: WorkStatus::RetryExceeded,
            queue: WorkQueue::Send,
            sequence: 7,
            vendor_error: 0,
        }
        .to_string();
        assert!(message.contains("IBV_WC_RETRY_EXC_ERR"), "{message}");
        assert!(message.contains("peer is gone"), "{message}");
    }

    #[test]
    fn probing_a_machine_without_rdma_is_an_error_value_not_a_panic() {
        // Whatever this machine has, probing returns; where there is no device at all (no
        // /sys/class/infiniband entries) it must say so as a value.
        let devices_present =
            std::fs::read_dir("/sys/class/infiniband").map(|mut dir| dir.next().is_some()).unwrap_or(false);
        let result = probe();
        if !devices_present {
            match result {
                Err(VerbsError::NoDevice) | Err(VerbsError::LibraryNotFound { .. }) => {}
                other => panic!("no device in sysfs, but probe returned {other:?}"),
            }
        }
        // And devices() agrees.
        if !devices_present {
            assert!(matches!(devices(), Err(VerbsError::NoDevice) | Err(VerbsError::LibraryNotFound { .. })));
        }
    }

    #[test]
    fn load_errors_become_typed_errors() {
        let error: VerbsError =
            ffi::LoadError::NotFound { library: "libibverbs.so.1".into(), detail: "no such file".into() }.into();
        assert!(error.to_string().starts_with("libibverbs not found"), "{error}");
        let error: VerbsError =
            ffi::LoadError::MissingSymbol { library: "x.so".into(), symbol: "ibv_open_device" }.into();
        assert!(matches!(error, VerbsError::MissingSymbol { symbol: "ibv_open_device", .. }));
    }
}
