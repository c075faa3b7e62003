//! rampkv-ycsb: YCSB core-workload generation for rampkv, deterministic and allocation-free on
//! the hot path.
//!
//! It reproduces YCSB's `CoreWorkload` (operation mix, request distributions, key names, load
//! and run phases, workloads A to F) formula for formula, so that a rampkv run touches the keys
//! with the skew YCSB would, and groups operations into rampkv's read-only and write-only
//! transactions. Where YCSB and this crate differ, the item says so and why (collected in
//! `docs/ycsb.md`).
//!
//! # Layout
//! - [`limits`]: every bound, in one place.
//! - [`error`]: the crate's one error type.
//! - [`random`]: the seeded random source (xoshiro256++); all draws come from it.
//! - [`hash`]: YCSB's `fnvhash64`.
//! - [`generator`]: YCSB's number generators (counter, uniform, zipfian, scrambled zipfian,
//!   latest, hotspot, discrete).
//! - [`properties`]: YCSB property files.
//! - [`config`]: CoreWorkload settings and defaults; the shipped workloads A to F.
//! - [`key`]: key names (`user` + number, hashed or ordered, zero padding).
//! - [`workload`]: the core workload at run time: load order, operations, key numbers.
//! - [`txn`]: grouping operations into rampkv transactions.
//! - [`micro`]: the reference paper's micro-benchmark, producing the same transactions.
//!
//! # Example
//! ```
//! use rampkv_ycsb::{BuiltinWorkload, CoreWorkload, Txn, TxnGenerator, TxnKind};
//!
//! let seed = 42;
//! let workload = CoreWorkload::new(BuiltinWorkload::A.config(), seed)?;
//! let mut generator = TxnGenerator::new(workload, 8)?;
//! let mut txn = Txn::new();
//! generator.next_txn(&mut txn)?;
//! match txn.kind() {
//!     TxnKind::ReadOnly => assert_eq!(txn.keys().count(), 8),
//!     TxnKind::WriteOnly => assert_eq!(txn.writes().count(), 8),
//!     TxnKind::ReadThenWrite => unreachable!("workload A has no read-modify-write"),
//! }
//! generator.acknowledge(&txn)?;
//! # Ok::<(), rampkv_ycsb::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod generator;
pub mod hash;
pub mod key;
pub mod limits;
pub mod micro;
pub mod properties;
pub mod random;
pub mod txn;
pub mod workload;

pub use config::{
    unrecognized_properties, BuiltinWorkload, CoreWorkloadConfig, FieldLengthDistribution, Proportions,
    RequestDistribution, ScanLengthDistribution,
};
pub use error::{Error, Expected};
pub use hash::fnv_hash64;
pub use key::{InsertOrder, KeyName, KeyNames};
pub use micro::{micro_key, MicroDistribution, MicroGenerator, MicroKey, MicroWorkload};
pub use properties::Properties;
pub use random::Random;
pub use txn::{Field, Txn, TxnGenerator, TxnKind, Write};
pub use workload::{CoreWorkload, Operation, OperationKind};
