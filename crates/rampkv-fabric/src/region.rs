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
    /// The owner's host: this boot's identity (`/proc/sys/kernel/random/boot_id`). Equal to the
    /// mapper's means both run on one host, so shared memory reaches the region. Absent in
    /// descriptors of the plain shared-memory fabric (and of older peers): same host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// How to reach the region over RDMA, when its owner registered it with a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbs: Option<VerbsRegionInfo>,
}

impl RegionDescriptor {
    /// A descriptor of the shared-memory kind: no host, no RDMA.
    pub fn new(name: impl Into<String>, len_bytes: u64, access: Access) -> Self {
        Self { name: name.into(), len_bytes, access, host: None, verbs: None }
    }
}

/// What a peer needs to reach a region over RDMA: the owner's rendezvous (where queue pairs are
/// set up) and the region's `(address, rkey)` in the owner's registration.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VerbsRegionInfo {
    /// The owner's rendezvous listener, `ip:port` (one per process).
    pub rendezvous: String,
    /// The region's first byte in the owner's address space.
    pub addr: u64,
    /// The remote key of the registration.
    pub rkey: u32,
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

/// This host's identity: the kernel's boot id (`/proc/sys/kernel/random/boot_id`), which two
/// processes share exactly when they run on one booted kernel, i.e. when shared memory joins
/// them. `None` where it cannot be read. Read once.
pub fn host_identity() -> Option<&'static str> {
    static HOST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = text.trim();
        let plausible = !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
        plausible.then(|| id.to_owned())
    })
    .as_deref()
}
