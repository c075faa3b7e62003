//! Spare value buffers: values a store let go of, kept on their thread for the next value of
//! the same length.
//!
//! # Why
//! A stream of writes over a large key space frees one value per write (the version it
//! supersedes, a cold block written long ago) and allocates one (the new value, copied out of
//! a request). Profiled on the RESP gateway (`SET -P 16` and `MSET -P 16`, 1 KiB values over
//! 100,000 keys), the allocator's free of the cold block and its allocation of another cold one
//! took 15-19% of the thread's time: the allocator follows and writes free-list links inside
//! those blocks, and a block in a page it had set aside as full goes back through its
//! cross-thread path (docs/performance.md). Here a superseded value's buffer is handed,
//! untouched, to the next value of its length: a pointer pushed and popped, and the copy of the
//! new bytes is the first touch.
//!
//! # Contract
//! - Only a thread that asked for it ([`keep_on_this_thread`]: the RESP gateway's thread, a
//!   server's poller) keeps spares; on any other thread [`give`] drops the buffer as before.
//! - A thread keeps at most `SPARE_BUFFERS_MAX` buffers and `SPARE_BYTES_MAX` bytes, of at
//!   most `SPARE_LENGTHS_MAX` distinct lengths, each at most `SPARE_VALUE_BYTES_MAX` bytes
//!   (`limits`). Past those bounds a buffer given is dropped. A thread that stops writing holds
//!   at most those bytes.
//! - [`copy`] returns a vector holding exactly the bytes given, whose capacity is its length
//!   (so `into_boxed_slice` keeps the buffer): a spare of that length if the thread has one,
//!   otherwise a new allocation. A spare's old bytes are all overwritten before anyone sees it.

use std::cell::RefCell;

use crate::limits::{SPARE_BUFFERS_MAX, SPARE_BYTES_MAX, SPARE_LENGTHS_MAX, SPARE_VALUE_BYTES_MAX};

/// One thread's spares, by length.
#[derive(Debug, Default)]
struct Spares {
    /// Up to `SPARE_LENGTHS_MAX` lengths, each with its buffers (an emptied stack may be taken
    /// over by another length).
    stacks: Vec<(usize, Vec<Box<[u8]>>)>,
    buffers: usize,
    bytes: usize,
}

impl Spares {
    fn give(&mut self, buffer: Box<[u8]>) {
        let length = buffer.len();
        if length == 0
            || length > SPARE_VALUE_BYTES_MAX
            || self.buffers >= SPARE_BUFFERS_MAX
            || self.bytes + length > SPARE_BYTES_MAX
        {
            return;
        }
        let stack = match self.stacks.iter().position(|(stack_length, _)| *stack_length == length) {
            Some(index) => &mut self.stacks[index].1,
            None => match self.stacks.iter().position(|(_, buffers)| buffers.is_empty()) {
                Some(index) => {
                    self.stacks[index].0 = length;
                    &mut self.stacks[index].1
                }
                None if self.stacks.len() < SPARE_LENGTHS_MAX => {
                    self.stacks.push((length, Vec::new()));
                    &mut self.stacks.last_mut().expect("just pushed").1
                }
                None => return,
            },
        };
        stack.push(buffer);
        self.buffers += 1;
        self.bytes += length;
    }

    fn take(&mut self, length: usize) -> Option<Box<[u8]>> {
        let (_, stack) = self.stacks.iter_mut().find(|(stack_length, _)| *stack_length == length)?;
        let buffer = stack.pop()?;
        self.buffers -= 1;
        self.bytes -= length;
        Some(buffer)
    }
}

thread_local! {
    /// `None` on a thread that did not ask to keep spares.
    static SPARES: RefCell<Option<Spares>> = const { RefCell::new(None) };
}

/// From now on this thread keeps the buffers given to it (module contract), for [`copy`].
pub fn keep_on_this_thread() {
    SPARES.with(|spares| {
        let mut spares = spares.borrow_mut();
        if spares.is_none() {
            *spares = Some(Spares::default());
        }
    });
}

/// A buffer no one else holds, kept for a later [`copy`] of its length on a thread that keeps
/// spares, dropped otherwise.
pub fn give(buffer: Box<[u8]>) {
    SPARES.with(|spares| {
        if let Some(spares) = spares.borrow_mut().as_mut() {
            spares.give(buffer);
        }
    });
}

/// `bytes` in a vector of its own whose capacity is its length: a spare buffer of that length
/// when this thread has one, otherwise a new allocation.
pub fn copy(bytes: &[u8]) -> Vec<u8> {
    copy_with_prefix(None, bytes)
}

/// `prefix` (when given) then `bytes`, as [`copy`].
pub fn copy_with_prefix(prefix: Option<u8>, bytes: &[u8]) -> Vec<u8> {
    let length = bytes.len() + usize::from(prefix.is_some());
    let spare = SPARES.with(|spares| spares.borrow_mut().as_mut().and_then(|spares| spares.take(length)));
    let mut vector = match spare {
        Some(buffer) => {
            let mut vector = Vec::from(buffer);
            vector.clear();
            vector
        }
        None => Vec::with_capacity(length),
    };
    vector.extend(prefix);
    vector.extend_from_slice(bytes);
    vector
}

/// This thread's spares: how many buffers, how many bytes (tests).
pub fn held() -> (usize, usize) {
    SPARES.with(|spares| spares.borrow().as_ref().map_or((0, 0), |spares| (spares.buffers, spares.bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_keeps_no_spares_drops_what_it_is_given() {
        std::thread::spawn(|| {
            give(vec![7; 100].into_boxed_slice());
            assert_eq!(held(), (0, 0));
            assert_eq!(copy(b"abc"), b"abc");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_spare_is_reused_for_a_value_of_its_length_and_overwritten_whole() {
        std::thread::spawn(|| {
            keep_on_this_thread();
            let old = vec![0xAA; 1024].into_boxed_slice();
            let address = old.as_ptr();
            give(old);
            assert_eq!(held(), (1, 1024));
            assert_eq!(copy(&[1; 100]), vec![1; 100], "another length: a new buffer");
            assert_eq!(held(), (1, 1024));
            let new = copy(&[5; 1024]);
            assert_eq!(held(), (0, 0));
            assert_eq!(new.as_ptr(), address, "the spare itself");
            assert_eq!((new.len(), new.capacity()), (1024, 1024));
            assert!(new.iter().all(|&byte| byte == 5), "no byte of the old value left");
            let boxed = new.into_boxed_slice();
            assert_eq!(boxed.as_ptr(), address, "boxed without reallocation");
            let prefixed = {
                give(boxed);
                copy_with_prefix(Some(1), &[9; 1023])
            };
            assert_eq!(prefixed.as_ptr(), address);
            assert_eq!((prefixed[0], prefixed[1], prefixed[1023]), (1, 9, 9));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn spares_stay_within_their_bounds() {
        std::thread::spawn(|| {
            keep_on_this_thread();
            for _ in 0..2 * SPARE_BUFFERS_MAX {
                give(vec![1; 10].into_boxed_slice());
            }
            assert_eq!(held(), (SPARE_BUFFERS_MAX, SPARE_BUFFERS_MAX * 10), "buffers bounded");
            while held().0 > 0 {
                copy(&[0; 10]);
            }
            for _ in 0..64 {
                give(vec![1; SPARE_VALUE_BYTES_MAX].into_boxed_slice());
            }
            assert_eq!(held(), (16, SPARE_BYTES_MAX), "bytes bounded");
            give(vec![1; SPARE_VALUE_BYTES_MAX + 1].into_boxed_slice());
            assert_eq!(held().0, 16, "too long to keep");
            while held().0 > 0 {
                copy(&[0; SPARE_VALUE_BYTES_MAX]);
            }
            for length in 1..=SPARE_LENGTHS_MAX + 2 {
                give(vec![1; length].into_boxed_slice());
            }
            assert_eq!(held(), (SPARE_LENGTHS_MAX, (1..=SPARE_LENGTHS_MAX).sum()), "lengths bounded");
            copy(&[0; 1]);
            give(vec![1; 40].into_boxed_slice());
            assert_eq!(held().0, SPARE_LENGTHS_MAX, "an emptied length's place is taken over");
            assert_eq!(copy(&[3; 40]), vec![3; 40]);
        })
        .join()
        .unwrap();
    }
}
