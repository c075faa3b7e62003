//! rampkv-net: how requests travel and how servers serve them.
//!
//! # Layout (bottom up; see `docs/architecture.md`)
//! - [`item_slots`]: the latest committed versions published in item slots for GET\*.
//! - [`transport`]: the client side of every medium (TCP, write-poll rings, send/recv,
//!   RF-RPC, GET\* one-sided reads, in-process calls).
//! - [`server`]: the TCP event loop that serves connections with the server cores.
//! - [`server_writepoll`], [`server_rfrpc`], [`front`]: the fabric front ends.
//! - [`recovery`]: cooperative termination of transactions whose writer died.
//! - [`client`]: the driver that runs transactions over a transport, and the blocking client.
#![forbid(unsafe_code)]

pub mod client;
pub mod front;
pub mod item_slots;
pub mod recovery;
pub mod server;
pub mod server_rfrpc;
pub mod server_writepoll;
pub mod transport;
