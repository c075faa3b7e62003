//! rampkv-net: how requests travel and how servers serve them.
//!
//! # Layout (bottom up; see `docs/architecture.md`)
//! Each layer imports only from the layers listed before it: `transport` (its in-process calls)
//! imports from `server`, never the reverse; `recovery` and `client` sit side by side on top.
//! - [`auth`]: the shared secret and the proofs built on it (the binary port's step, the
//!   fabric handshake's proofs), and the random bytes of challenges and nonces.
//! - [`message`]: the message layer: the [`message::Channel`] trait (send a burst of frames,
//!   receive a burst, readiness), the two sides of a medium ([`message::ClientMedium`],
//!   [`message::ServerMedium`], [`message::Wake`]), and one adapter per medium (`tcp`, `ring`,
//!   `sendrecv`, `rfrpc`, with what the fabric ones share in `fabric` and the control
//!   handshake's lines in `control`).
//! - [`item_slots`]: the latest committed versions published in item slots for GET\*.
//! - [`server`]: server groups, the router of deferred replies, the one front end (poller)
//!   that serves every medium, the fabric front end, persistence, replication and failover.
//! - [`transport`]: the one client transport over the message layer, GET\* one-sided reads,
//!   the interleaving model, and in-process calls into `server`.
//! - [`recovery`]: cooperative termination of transactions whose writer died (a client of the
//!   other servers; it starts on a group through [`recovery::StartRecovery`]).
//! - [`client`]: the driver (the session machine over a transport) and the blocking client.
#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod item_slots;
pub mod message;
pub mod recovery;
pub mod server;
pub mod transport;
