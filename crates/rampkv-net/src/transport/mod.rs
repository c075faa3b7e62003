//! Transports: how a client's requests reach servers and replies come back.
//!
//! Every transport implements the small, batch-oriented [`ClientTransport`] trait: post any
//! number of requests, flush them in as few operations as the medium allows, then poll for
//! replies. The driver ([`crate::client::Driver`]) is generic over it, so there is no dynamic
//! dispatch per message. Every transport carries the same frames ([`rampkv_core::wire`]).
//!
//! [`Transport`] is the one implementation over the message layer ([`crate::message`]): posting,
//! flushing and polling are written once and run over any [`ClientMedium`]; the aliases below
//! name it per medium. Beside it:
//! - [`onesided`]: GET\*/PUT+, round-1 reads from item slots read one-sidedly, everything else
//!   over the write-poll transport it wraps;
//! - [`local`]: direct calls into the server cores of the client's own process, with the typed
//!   replies (no frame), S2PL included.
//!
//! # A server that fails
//! A transport that reconnects ([`Transport`], and those built on it) keeps working when one
//! server's connection fails (the server died, was killed, or sent garbage): that server's
//! channel is dropped, what was queued for it is discarded, requests posted for it meanwhile
//! are discarded too, and [`ClientTransport::take_server_events`] reports a
//! [`ServerEvent::Down`]. The other servers are served as before. The transport connects
//! again after `CLIENT_RECONNECT_BACKOFF_MS_MIN`, doubling the wait after each failed attempt
//! up to `CLIENT_RECONNECT_BACKOFF_MS_MAX`, inside `poll` or [`ClientTransport::reconnect_due`]
//! (an attempt blocks for at most the medium's connect timeout: immediate on a refused
//! connection, seconds on an address that drops packets), and reports a [`ServerEvent::Up`]
//! when it succeeds. The driver fails the transactions that needed the server and checks a
//! reconnected server's cluster file again before it uses it.
//!
//! [`interleave::Interleaving`] decorates any of them with a seeded network model (per-request
//! delays, per-link FIFO), so that servers see the requests of different sessions in different
//! orders, as separate machines do.
//!
//! # Layout (bottom up)
//! - `stats`: the counters transports report (GET\*, the interleaving model).
//! - `error`: [`TransportError`] (and the item-region errors GET\* reports in it).
//! - `client`: the [`ClientTransport`] trait and [`ServerEvent`].
//! - `medium`: [`Transport`], the one implementation over the message layer.
//! - [`onesided`]: GET\* over item slots, on top of a write-poll [`Transport`].
//! - [`interleave`]: the network model, over any [`ClientTransport`].
//! - [`local`]: in-process calls into the server cores.
//! - this file: the per-medium aliases ([`TcpClientTransport`] and the others).

mod client;
mod error;
pub mod interleave;
pub mod local;
mod medium;
pub mod onesided;
mod stats;

pub use client::{ClientTransport, ServerEvent};
pub use error::TransportError;
pub use medium::Transport;

use rampkv_fabric::AnyFabric;

use crate::message::fabric::FabricClient;
use crate::message::fallback::Fallback;
use crate::message::rfrpc::RfRpc;
use crate::message::ring::Ring;
use crate::message::sendrecv::SendRecv;
use crate::message::tcp::TcpClient;

/// TCP: one socket per server.
pub type TcpClientTransport = Transport<TcpClient>;
/// GET+/PUT+: message rings written one-sidedly over the fabric (shared memory or RDMA).
pub type WritePollClientTransport = Transport<FabricClient<AnyFabric, Ring>>;
/// Two-sided send/recv emulated over the fabric (posted receive buffers, a completion queue).
pub type SendRecvClientTransport = Transport<FabricClient<AnyFabric, SendRecv>>;
/// Remote-fetch RPC: requests into the server's memory, replies fetched from it.
pub type RfRpcClientTransport = Transport<FabricClient<AnyFabric, RfRpc>>;
/// GET\*/PUT+ over the (shared-memory) fabric.
pub type OneSidedClientTransport = onesided::GetStarTransport<AnyFabric>;
/// [`WritePollClientTransport`] that reaches over TCP a server the fabric cannot reach
/// ([`Transport::connect_or_tcp`]).
pub type MixedWritePollTransport = Transport<Fallback<AnyFabric, Ring>>;
/// [`SendRecvClientTransport`] with the TCP fallback.
pub type MixedSendRecvTransport = Transport<Fallback<AnyFabric, SendRecv>>;
/// [`RfRpcClientTransport`] with the TCP fallback.
pub type MixedRfRpcTransport = Transport<Fallback<AnyFabric, RfRpc>>;
