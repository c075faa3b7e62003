#![forbid(unsafe_code)]
//! rampkv's configuration service: which servers hold which partition, who is primary in which
//! epoch, leases and failure detection, held by an embedded Raft group (tikv's raft-rs) among
//! the servers. See docs/replication.md for what it promises.
//!
//! # Layout
//! - `configuration`: the replicated state, its changes (each one epoch), placement, encoding.
//! - `core`: one node without I/O: raft-rs plus leases, heartbeats and the failure detector.
//! - `storage`: the Raft log behind raft-rs's `Storage`, in memory and, with a directory, on disk.
//! - `disk`: the node's Raft state on disk (one redb file; every change fsynced before it is used).
//! - `crash_medium` (tests only): a crash-simulating storage medium under redb.
//! - `wire`: checksummed, bounded frames of the configuration port.
//! - `node`: a node over TCP (threads, peers) and the API a server uses (`lease_valid`, ...).
//! - `auth`: the seam through which the server layer makes every connection prove the shared
//!   secret.
//! - `client`: asking nodes for the configuration; bootstrap or rejoin.
//! - `timing`: timing settings and clocks (a manual clock for tests); `limits`: every bound.
//! - `error`: the crate's error enum.
//! - `codec`: little-endian writing and bounded reading (above `error`).
//! - `ids`: `ServerId`, at the bottom: the errors and the configuration both name servers.
pub mod auth;
pub mod client;
mod codec;
pub mod configuration;
pub mod core;
#[cfg(test)]
mod crash_medium;
pub mod disk;
pub mod error;
mod ids;
pub mod limits;
pub mod node;
pub mod storage;
pub mod timing;
pub mod wire;
