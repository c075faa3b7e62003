//! Random identities: process incarnations (`resume`) and replication stream identities
//! (`replication::delta`).

/// A random non-zero identity (the kernel's random source; the clock if it fails): process
/// incarnations, replication stream identities.
pub(crate) fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_err() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = (now.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    u64::from_le_bytes(bytes).max(1)
}
