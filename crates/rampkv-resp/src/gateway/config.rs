//! A gateway's settings ([`GatewayConfig`], [`InProcessServers`]) and why it could not start
//! or stopped ([`GatewayError`]); public under `gateway`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::Users;
use crate::{GATEWAY_BUFFERED_BYTES_MAX, GATEWAY_SESSIONS_DEFAULT, GATEWAY_SESSIONS_MAX};
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_net::client::ClientError;
use rampkv_net::server::Servers;

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    #[error("gateway i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot reach the rampkv cluster: {0}")]
    Client(#[from] ClientError),
    #[error("sessions must be 1..={GATEWAY_SESSIONS_MAX}, got {sessions}")]
    Sessions { sessions: usize },
    #[error("{count} in-process servers for a cluster of {servers}")]
    InProcessServers { count: usize, servers: usize },
    /// Redis's protected mode, at start-up: anyone who can reach `address` could read and write
    /// every key.
    #[error(
        "refusing to serve RESP on {address} without a password (protected mode): anyone who can reach it could \
         read and write every key. Set a password (--requirepass PASSWORD, or --aclfile FILE giving the default \
         user one), listen on a loopback address (127.0.0.1), or pass --protected-mode no to accept the risk"
    )]
    ProtectedMode { address: SocketAddr },
}

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Address of the RESP listener; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Size of the session pool: the most RESP connections served at once.
    pub sessions: usize,
    /// The transaction algorithm (RAMP-Fast by default; the tests also run the no-concurrency-
    /// control baseline to show that their checks catch fractured reads).
    pub txn_options: TxnOptions,
    /// The cluster's servers run in this process: call their cores directly rather than over
    /// TCP (`rampkv local` does this).
    pub in_process: Option<InProcessServers>,
    /// Who may log in, and what each user may run ([`Users::open`]: no authentication).
    pub users: Arc<Users>,
    /// Redis's `protected-mode` (on by default): a gateway without a password for `default`
    /// refuses to listen on anything but a loopback address.
    pub protected_mode: bool,
    /// Redis's `timeout`: close a connection idle this long (`None`, the default: never).
    pub idle_timeout: Option<Duration>,
    /// Most bytes all connections may hold together (default `GATEWAY_BUFFERED_BYTES_MAX`).
    pub buffered_bytes_max: usize,
}

/// The server groups of this process ([`rampkv_net::server::ServerGroup::servers`]); server i
/// of the cluster is the i-th server counting through the groups.
#[derive(Debug, Clone)]
pub struct InProcessServers {
    pub groups: Vec<Arc<Servers>>,
}

impl GatewayConfig {
    /// A gateway on `listen` with the default session pool and RAMP-Fast.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            sessions: GATEWAY_SESSIONS_DEFAULT,
            txn_options: TxnOptions::default(),
            in_process: None,
            users: Arc::new(Users::open()),
            protected_mode: true,
            idle_timeout: None,
            buffered_bytes_max: GATEWAY_BUFFERED_BYTES_MAX,
        }
    }

    /// The start-up refusal of protected mode, if it applies: an address other than loopback
    /// (the unspecified 0.0.0.0 and :: included) and users that let anyone in.
    pub fn protected_mode_refusal(&self) -> Option<GatewayError> {
        let ip = self.listen.ip().to_canonical();
        let exposed = !ip.is_loopback();
        (self.protected_mode && exposed && self.users.open_to_anyone())
            .then_some(GatewayError::ProtectedMode { address: self.listen })
    }
}
