//! YCSB's number generators (`site.ycsb.generator`), one type each.
//!
//! Each generator keeps its parameters and takes the random source as an argument, so that one
//! seeded [`crate::Random`] per workload drives every draw in a fixed order. The formulas are
//! YCSB's, with its quirks kept (they are named where they occur) so that a distribution
//! generated here is the distribution YCSB generates.
//!
//! - [`counter`]: `CounterGenerator` (load order) and `AcknowledgedCounterGenerator` (inserts of
//!   the run phase; the "latest" key is the highest acknowledged one).
//! - [`uniform`]: uniform integers (YCSB's `UniformLongGenerator`).
//! - [`zipfian`]: `ZipfianGenerator` (Gray et al.'s method, incremental zeta) and
//!   `ScrambledZipfianGenerator` (zipfian over 10^10 ranks, scattered by FNV).
//! - [`latest`]: popularity by recency (YCSB's `SkewedLatestGenerator`).
//! - [`hotspot`]: a hot set and a cold set (YCSB's `HotspotIntegerGenerator`).
//! - [`discrete`]: `DiscreteGenerator` (the operation chooser).

pub mod counter;
pub mod discrete;
pub mod hotspot;
pub mod latest;
pub mod uniform;
pub mod zipfian;

pub use counter::{AcknowledgedCounter, Counter};
pub use discrete::Discrete;
pub use hotspot::Hotspot;
pub use latest::SkewedLatest;
pub use uniform::Uniform;
pub use zipfian::{zeta, ScrambledZipfian, Zipfian};
