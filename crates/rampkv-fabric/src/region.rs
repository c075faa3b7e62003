//! A registered region as a plain value: the rights peers get on it ([`Access`]), the
//! descriptor that travels over a control channel ([`RegionDescriptor`]), and the rule every
//! fabric applies to a region's length. Below the word operations and every fabric
//! (re-exported from [`crate::fabric`], their public path).

use crate::error::FabricError;
use crate::limits::{REGION_BYTES_MAX, WORD_BYTES};
use serde::{Deserialize, Serialize};

/// Rights a peer gets on a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Peers may only read (item slots: only the server writes them). A peer maps the region
    /// with `PROT_READ`, so even a buggy peer cannot write it.
    ReadOnly,
    /// Peers may read, write and run atomics (message rings, credit and doorbell words).
    ReadWrite,
}

/// A region as a plain value that can travel over a control channel (the analogue of an RDMA
/// `(address, length, rkey)` triple).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionDescriptor {
    /// Global name of the region (for the shm fabric: the file name under /dev/shm).
    pub name: String,
    /// Length in bytes, a multiple of 8.
    pub len_bytes: u64,
    /// What peers may do with it.
    pub access: Access,
}

/// A region length must be positive, word-padded and bounded.
pub(crate) fn check_length(name: &str, len_bytes: u64) -> Result<(), FabricError> {
    let reason = if len_bytes == 0 {
        "length is zero"
    } else if len_bytes % WORD_BYTES as u64 != 0 {
        "length is not a multiple of 8"
    } else if len_bytes > REGION_BYTES_MAX {
        "length exceeds REGION_BYTES_MAX"
    } else {
        return Ok(());
    };
    Err(FabricError::InvalidRegion { name: name.to_owned(), reason })
}
