//! rampkv-core: the layers of rampkv that do no I/O.
//!
//! Nothing here opens a socket, maps shared memory, starts a thread or reads a clock: the
//! transports, front ends and servers (`rampkv-net`) feed these types requests, replies and
//! the time, and carry out what they return. That is what lets the seeded simulation and the
//! model check run the exact code the servers run.
//!
//! # Layout (bottom up; see `docs/architecture.md`)
//! - [`limits`]: every bound, in one place.
//! - [`types`]: timestamps, the per-client timestamp clock, and the value type reads return.
//! - [`spare`]: value buffers a store let go of, kept per thread for the next value of their
//!   length.
//! - [`wire`]: the binary message format, framed for byte streams and message rings.
//! - [`storage`]: the multi-version partition store (lastCommit by atomic max, GC), in rooms:
//!   validation, garbage collection, the write path, the read path, the snapshot copy.
//! - [`cluster`]: cluster files and key routing (FNV-1a hash partitioning).
//! - [`pattern`]: Redis's glob-style key patterns (the key listing's MATCH).
//! - [`protocol`]: RAMP-Fast/Small/Hybrid, NoCC and S2PL+2PC as I/O-free state machines: the
//!   client's transactions and its session machine (`protocol::session`), and the server core
//!   (`protocol::server`: a typed request in, a typed reply and effects out).
#![forbid(unsafe_code)]

pub mod cluster;
pub mod limits;
pub mod pattern;
pub mod protocol;
pub mod spare;
pub mod storage;
pub mod types;
pub mod wire;
