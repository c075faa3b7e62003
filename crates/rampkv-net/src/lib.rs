//! rampkv-net: how requests travel and how servers serve them.
//!
//! # Layout (bottom up; see `docs/architecture.md`)
//! - [`message`]: the message layer: one [`message::Channel`] trait (send a burst of frames,
//!   receive a burst, readiness) and one adapter per medium (TCP, write-poll rings, send/recv,
//!   RF-RPC), with the fabric control handshake.
//! - [`item_slots`]: the latest committed versions published in item slots for GET\*.
//! - [`server`]: server groups, the router of deferred replies, and the one front end (poller)
//!   that serves every medium.
//! - [`transport`]: the one client transport over the message layer, GET\* one-sided reads,
//!   and in-process calls.
//! - [`recovery`]: cooperative termination of transactions whose writer died.
//! - [`client`]: the driver (the session machine over a transport) and the blocking client.
#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod item_slots;
pub mod message;
pub mod recovery;
pub mod server;
pub mod transport;
