//! Futex waits and wakes on a 64-bit word: the doorbells' sleep, for every memory a [`Words`]
//! can be (heap words of this process and shared-memory mappings alike). At the bottom of the
//! crate, beside `error`: the words and the shared-memory fabric both call it.
//!
//! # Contract
//! A futex is keyed by the address of the word's low 32 bits (little-endian, checked below at
//! build time). The waits are process-shared, so a waker in another process that maps the same
//! file page reaches a sleeper. A wait returns on a wake, a signal, a changed value, its
//! timeout or spuriously: callers always re-check their condition.
//!
//! With `shm`, the one module of the crate that holds `unsafe` (two system calls, each with
//! its SAFETY note).
//!
//! [`Words`]: crate::words::Words

use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[cfg(not(target_endian = "little"))]
compile_error!("the fabric's futex doorbell waits on the low half of a 64-bit word: little-endian only");

/// Blocks while the low 32 bits of `word` equal `expected_low`, at most `timeout`. Returns
/// early on a wake, a signal, a value change or spuriously; callers re-check.
///
/// Uses a process-shared futex (no `FUTEX_PRIVATE_FLAG`), so a waker in another process that
/// maps the same file page reaches it.
pub(crate) fn futex_wait(word: &AtomicU64, expected_low: u32, timeout: Duration) {
    let timeout = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the address is that of a live, 8-aligned `AtomicU64`, so its first 4 bytes (the
    // low half on little-endian) are a valid, 4-aligned futex word for the whole call. The
    // timeout pointer refers to a local that outlives the call. FUTEX_WAIT only reads the
    // word. The result is ignored on purpose: EAGAIN (value changed), ETIMEDOUT and EINTR all
    // mean "re-check your condition", which every caller does.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr() as *const u32,
            libc::FUTEX_WAIT,
            expected_low,
            &timeout as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter on `word` in any process.
pub(crate) fn futex_wake_all(word: &AtomicU64) {
    // SAFETY: the address is that of a live, 8-aligned `AtomicU64` (see `futex_wait`);
    // FUTEX_WAKE neither reads nor writes user memory through it, it only keys the wait
    // queue. The number of woken waiters is not needed.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr() as *const u32,
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn futex_wait_returns_at_once_on_a_changed_value_and_times_out_otherwise() {
        let word = AtomicU64::new(5);
        let start = std::time::Instant::now();
        futex_wait(&word, 4, Duration::from_secs(5));
        assert!(start.elapsed() < Duration::from_secs(1));
        let start = std::time::Instant::now();
        futex_wait(&word, 5, Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(15));
    }
}
