//! The fabric layer's one error enum, at the bottom of the crate: the word operations, the
//! regions and every fabric return it (re-exported as [`crate::fabric::FabricError`]).

/// Errors of the fabric layer.
///
/// The data-path variants (`OutOfBounds`, `Misaligned`, `NoWriteAccess`) carry no heap data,
/// so returning them does not allocate.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// The access (length rounded up to words) does not fit inside the region.
    #[error("{len_bytes} bytes at offset {offset_bytes} do not fit in a region of {region_len_bytes} bytes")]
    OutOfBounds {
        /// Requested offset.
        offset_bytes: u64,
        /// Requested length.
        len_bytes: u64,
        /// Length of the region.
        region_len_bytes: u64,
    },
    /// The offset is not a multiple of 8.
    #[error("offset {offset_bytes} is not 8-byte aligned")]
    Misaligned {
        /// Requested offset.
        offset_bytes: u64,
    },
    /// A write or atomic on a region mapped read-only.
    #[error("no write access: the region is mapped read-only")]
    NoWriteAccess,
    /// The named region does not exist (its owner never registered it, or has exited).
    #[error("region {name} is missing")]
    RegionMissing {
        /// Region name.
        name: String,
    },
    /// A name, length or descriptor that cannot be registered or mapped.
    #[error("invalid region {name:?}: {reason}")]
    InvalidRegion {
        /// Region name as given.
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The operating system refused (open, truncate, map, ...).
    #[error("i/o on region {name}: {source}")]
    Io {
        /// Region name.
        name: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// No medium joins this process and the region's owner (another host without RDMA on
    /// both sides, or a forced choice that cannot be met). The layer above falls back to TCP.
    #[error("no fabric medium reaches region {name}: {reason}")]
    NoMedium {
        /// Region name.
        name: String,
        /// Why (which side lacks what).
        reason: String,
    },
    /// RDMA was asked for and cannot be used here (no libibverbs, no device, no active port,
    /// no address for the rendezvous listener).
    #[error("RDMA unavailable: {reason}")]
    VerbsUnavailable {
        /// Why.
        reason: String,
    },
    /// An RDMA operation on a peer failed: its queue pair went to error (the peer died or
    /// became unreachable), an operation did not complete within its bound, or the connection
    /// could not be set up. The link to the peer is dropped; mapping a new descriptor at the
    /// same rendezvous connects afresh.
    #[error("RDMA peer {peer} failed: {reason}")]
    PeerFailed {
        /// The peer's rendezvous address.
        peer: String,
        /// What happened.
        reason: String,
    },
}
