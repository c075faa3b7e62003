//! Page size policy of the `rampkv` process: no transparent huge pages.
//!
//! Every write stores a new version and keeps the one it supersedes for the GC grace period, so
//! a server's memory grows for the first grace period of any write load, and the allocator
//! (mimalloc) asks the kernel for fresh memory all along. With transparent huge pages (mimalloc
//! advises them for its arenas), the first touch of each 2 MiB of that memory is one fault that
//! zeroes the whole huge page before the faulting thread goes on. On the virtual machines this
//! was measured on, whose host backs guest memory lazily, one such fault took 4-21 ms
//! (docs/performance.md, issue 18 item 2): a poller thread that stores a value into a fresh huge
//! page stalls every connection it serves for that long, several times a second. With 4 KiB
//! pages the same memory is faulted in small steps of a few microseconds each, spread over the
//! writes that use it.
//!
//! The switch is process-wide (`PR_SET_THP_DISABLE`, inherited by child processes) and only
//! changes page sizes, never contents: when the kernel refuses it (not Linux, an old kernel),
//! the process runs as before.

/// Turns transparent huge pages off for this process (module docs). Returns whether the kernel
/// accepted it.
pub fn disable_transparent_huge_pages() -> bool {
    rustix::thread::disable_transparent_huge_pages(true).is_ok()
}

#[cfg(test)]
mod tests {
    /// On Linux the switch is accepted and reads back as set (the test process keeps it: it only
    /// changes page sizes).
    #[test]
    #[cfg(target_os = "linux")]
    fn transparent_huge_pages_are_off_after_the_switch() {
        assert!(super::disable_transparent_huge_pages());
        assert_eq!(rustix::thread::transparent_huge_pages_are_disabled().ok(), Some(true));
    }
}
