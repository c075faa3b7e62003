//! [`VerbsError`], the verbs layer's one error enum (public as `verbs::VerbsError`).

use super::ffi;
use super::status::{QueuePairState, WorkQueue, WorkStatus};

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
        /// Its sequence number (see [`WorkRange`](super::WorkRange)).
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
