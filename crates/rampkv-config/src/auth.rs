//! Authentication of the configuration port: the seam through which the server layer plugs in
//! the cluster's shared secret.
//!
//! # Contract
//! With an authenticator, every connection to the configuration port, a peer node's or a
//! configuration client's, proves the cluster's shared secret before its first frame of this
//! port: the dialing side runs [`PortAuthenticator::prove`] right after it connects, the
//! accepting side [`PortAuthenticator::check`] before it reads a frame. The step itself is the
//! binary port's (rampkv-net's `auth` module implements this trait with it); this crate sits
//! below that layer, so it names the step here rather than depending on it. A connection whose
//! step fails sends nothing of this port and is closed: no Raft message, heartbeat or
//! configuration request of an unauthenticated peer reaches the node.
//!
//! # Fault model
//! The peer may send anything, slowly or not at all: `check` returns by its deadline with an
//! error, never panics, and tells the peer why it was refused in the step's own words.

use std::net::TcpStream;
use std::time::Instant;

/// An authentication failure, in the words of the layer that implements the step.
pub type AuthFailure = Box<dyn std::error::Error + Send + Sync>;

/// Proves and checks the cluster's shared secret on configuration-port connections.
pub trait PortAuthenticator: Send + Sync {
    /// The dialing side's step on a freshly connected `stream`.
    ///
    /// # Errors
    /// The peer refused us, could not prove the secret itself, or the connection failed.
    fn prove(&self, stream: &mut TcpStream) -> Result<(), AuthFailure>;

    /// The accepting side's step on a freshly accepted `stream`, finished by `deadline`. On a
    /// failure the peer has been told why (as far as the connection still carries it).
    ///
    /// # Errors
    /// The peer did not prove the secret by `deadline`, proved another one, or sent something
    /// else.
    fn check(&self, stream: &mut TcpStream, deadline: Instant) -> Result<(), AuthFailure>;
}
