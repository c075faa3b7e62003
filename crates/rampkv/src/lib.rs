//! rampkv: read-atomic multi-key transactions (RAMP) over a hash-partitioned in-memory store.
//!
//! This crate is the command-line binary and one front door to the layers, which live in
//! their own crates (see `docs/architecture.md` for the diagram):
//! - `rampkv-core`: limits, timestamps, wire format, storage, cluster routing, the protocol
//!   machines (no I/O);
//! - `rampkv-fabric`: registered regions and one-sided operations (shared memory);
//! - `rampkv-net`: the message layer, transports, the front end, servers, item slots,
//!   recovery, the client;
//! - `rampkv-resp`: the Redis-protocol gateway;
//! - `rampkv-bench`: the benchmark, histories, the read-atomicity checker, the figures, the
//!   fault test (`chaos`);
//! - `rampkv-ycsb`: YCSB workload generators;
//! - `rampkv-durable`: the persistence engine (log, group commit, snapshots, recovery).
//! - `rampkv-config`: the configuration service (replica sets, epochs, leases over raft-rs;
//!   its placement is what replication uses).
//!
//! Every module keeps its path under `rampkv::` (`rampkv::client::Client`, ...).
#![forbid(unsafe_code)]

pub mod logging;
pub mod pages;

pub use rampkv_bench::{bench, chaos, checker, figures, history, progress};
pub use rampkv_config as config;
pub use rampkv_core::{cluster, limits, protocol, storage, types, wire};
pub use rampkv_durable as durable;
pub use rampkv_fabric as fabric;
pub use rampkv_net::{auth, client, item_slots, message, recovery, server, transport};
pub use rampkv_resp as resp;
