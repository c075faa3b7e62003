//! The host's monotonic clock (`CLOCK_MONOTONIC`), in nanoseconds since an arbitrary point
//! (the host's boot).
//!
//! Every process on one host reads the same clock, which is what the emulated fabric models: a
//! server can write a time into a region it registered (an item region's lease word, GET\*)
//! and a client on the same host can compare it with its own reading, with no drift between
//! the two. Across hosts (a real RDMA deployment) monotonic clocks share neither origin nor
//! rate: a time written for peers must then be a duration (a lease's length, as FaRM's leases
//! are), each side measuring on its own clock with a margin for the drift between them
//! (docs/replication.md, "Leases").

use rustix::time::{clock_gettime, ClockId};

/// Now, on the host's monotonic clock, in nanoseconds. Never 0 in practice (it counts from
/// boot); it never goes back.
pub fn monotonic_ns() -> u64 {
    let now = clock_gettime(ClockId::Monotonic);
    // tv_sec and tv_nsec of CLOCK_MONOTONIC are never negative.
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_clock_moves_forward_with_instant() {
        let (first, started) = (monotonic_ns(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (second, elapsed) = (monotonic_ns(), started.elapsed());
        assert!(first > 0 && second > first);
        // Both read CLOCK_MONOTONIC: the two measures agree to well within a millisecond.
        let measured = second - first;
        assert!(measured + 1_000_000 >= elapsed.as_nanos() as u64, "{measured} ns against {elapsed:?}");
    }
}
