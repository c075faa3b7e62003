//! The run's clock, at the bottom of the chaos rooms: the history, the nemesis's timeline and
//! the report all count from the workload's start, so their times compare.

use std::time::Instant;

/// The run's clock: the history's nanoseconds and the timeline's milliseconds count from the
/// workload's start.
#[derive(Debug)]
pub(crate) struct RunClock {
    origin: Instant,
}

impl RunClock {
    pub(super) fn start() -> RunClock {
        RunClock { origin: Instant::now() }
    }

    pub(super) fn origin(&self) -> Instant {
        self.origin
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// The time now as the report prints it (`+12.345s`).
    pub(super) fn label(&self) -> String {
        Self::label_of(self.now_ms())
    }

    pub(super) fn label_of(ms: u64) -> String {
        format!("+{}.{:03}s", ms / 1_000, ms % 1_000)
    }
}
