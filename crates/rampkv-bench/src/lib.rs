//! rampkv-bench: measuring and checking rampkv.
//!
//! # Layout
//! - [`bench`]: the closed-loop benchmark over an embedded or external cluster.
//! - [`history`], [`checker`]: recording histories and checking them for read atomicity.
//! - [`figures`]: the reference paper's four figures as benchmark sweeps, plots and tables.
//! - [`chaos`]: `rampkv chaos`, the fault test: server processes, a nemesis, a workload, a verdict.
//! - [`progress`]: a progress line on stderr for long runs.
//! - [`limits`]: every bound of the above.
#![forbid(unsafe_code)]

pub mod bench;
pub mod chaos;
pub mod checker;
pub mod figures;
pub mod history;
pub mod limits;
pub mod progress;
#[cfg(test)]
mod test_support;
