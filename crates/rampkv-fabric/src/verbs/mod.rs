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
//! # Layout (bottom up: a module names only those above it in this list)
//! - `ffi`: the C declarations and the run-time loader (all FFI types are private).
//! - `limits`: every bound of this module.
//! - `status`: [`WorkQueue`], [`QueuePairState`], [`WorkStatus`]: what errors and completions
//!   report about a queue.
//! - `error`: [`VerbsError`], the module's one error enum.
//! - `device`: device discovery, ports, GID choice, [`Context`] (an opened device and port).
//! - `region`: [`ProtectionDomain`], [`MemoryRegion`], [`RegionAccess`], [`RemoteRegion`].
//! - `endpoint`: [`Endpoint`] (what peers exchange to connect) and [`QueuePairOptions`].
//! - `completion`: [`Completion`], sequence numbers, the regions pinned by outstanding requests.
//! - `queue_pair`: [`QueuePair`] (RC): connect, post receives, poll and wait with a bound.
//! - `batch`: [`SendBatch`]: READ, WRITE, atomics and SEND posted together, one doorbell
//!   ([`QueuePair::batch`] starts one).
//! - this file: [`probe`] and the re-exports.
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
mod error;
mod ffi;
pub mod limits;
mod queue_pair;
mod region;
mod status;

pub use batch::SendBatch;
pub use completion::{Completion, CompletionKind, WorkRange};
pub use device::{
    choose_gid, devices, Context, DeviceSelection, DeviceSummary, GidEntry, GidKind, LinkLayer, PortInfo, PortSummary,
};
pub use endpoint::{Endpoint, QueuePairOptions};
pub use error::VerbsError;
pub use queue_pair::{QueuePair, ReceiveBuffer};
pub use region::{MemoryRegion, ProtectionDomain, RegionAccess, RemoteRegion};
pub use status::{QueuePairState, WorkQueue, WorkStatus};

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
