//! The client's errors: [`ClientError`], why a client operation failed, and [`UpdateError`],
//! why an update's op wrote nothing. Below the driver, the blocking client and its rooms, which
//! all return them; public as `client::ClientError` and `client::UpdateError`.

use crate::transport::TransportError;
use rampkv_core::protocol::session::SessionError;
use rampkv_core::protocol::ProtocolError;
use rampkv_core::wire::ErrorCode;

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The session's clock cannot issue a timestamp (the wall clock is past 2033, or wrong).
    #[error(transparent)]
    Clock(#[from] rampkv_core::types::ClockError),
    #[error("the transaction did not finish in time")]
    Timeout,
    /// The transaction needs partitions that no reachable server holds (their server is down or
    /// unreachable); transactions on the other partitions go on, and the client reconnects on
    /// its own. A write that failed this way in flight may be visible where its commit arrived.
    #[error("partitions {partitions:?} are unavailable: no reachable server holds them")]
    Unavailable { partitions: Vec<u32> },
    /// A transaction could not start (no such session, the session is busy), or the sessions
    /// could not be set up.
    #[error(transparent)]
    Session(SessionError),
    #[error("the first server answered HELLO with something else")]
    HelloReply,
    /// A server refused the HELLO (its cluster file differs from the client's, say); the
    /// message is the server's.
    #[error("server {server} ({address}) refused the connection: {message}")]
    HelloRefused { server: usize, address: String, message: String },
    #[error(
        "cluster files differ: this client's has {partitions} partitions and calls {address} server {server}; \
         that server's has {server_partitions} partitions and it is server {server_index}"
    )]
    ClusterMismatch { server: usize, address: String, partitions: u32, server_partitions: u32, server_index: u32 },
    #[error(
        "asked for {wanted} client ids, the first server granted {granted} from {first} (refused: need {wanted} \
         ids, none 0, the last at most 65535)"
    )]
    HelloGranted { wanted: u16, first: u16, granted: u16 },
    #[error("need 1..=65535 sessions, got {sessions}")]
    Sessions { sessions: usize },
    #[error("the transport reaches {transport} servers, the cluster has {cluster}")]
    ServerCount { transport: usize, cluster: usize },
    /// Replication: connecting kept failing for reasons a failover explains (a server down or
    /// refusing, no configuration node answering) until the failover bound passed; `last` is
    /// the last failure.
    #[error("cannot connect to the cluster within the failover bound ({waited_ms} ms); the last attempt: {last}")]
    FailoverBound { waited_ms: u64, last: Box<ClientError> },
    /// A single-key update's op refused the value it found (INCR on a value that is not an
    /// integer, say); nothing was written.
    #[error(transparent)]
    Update(#[from] UpdateError),
    /// Replication: the configuration service could not be asked (or the cluster file gives
    /// it no addresses).
    #[error("configuration service: {0}")]
    Configuration(#[from] rampkv_config::error::ConfigError),
}

impl ClientError {
    /// Whether the transaction may succeed if tried again once the client has learned the
    /// current configuration (a server failed, or was deposed, under it).
    pub fn is_failover(&self) -> bool {
        matches!(self, ClientError::Transport(_) | ClientError::Timeout | ClientError::Unavailable { .. })
            || self.is_not_primary()
    }

    /// Whether connecting may succeed if tried again once a failover completes: a server down,
    /// refusing or not answering its HELLO (a backup still taking over refuses it), or no
    /// configuration node answering. Not when the configuration says a partition has no copy
    /// left ([`ClientError::Unavailable`]), nor for a cluster file that differs.
    pub fn is_connect_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::Transport(_)
                | ClientError::Timeout
                | ClientError::HelloRefused { .. }
                | ClientError::HelloReply
                | ClientError::Configuration(_)
        ) || self.is_not_primary()
    }

    /// Whether a server refused because it is not (or no longer) the primary of a partition
    /// the transaction names: the client's routes are stale.
    pub fn is_not_primary(&self) -> bool {
        matches!(self, ClientError::Protocol(ProtocolError::ServerError { code: ErrorCode::NotPrimary, .. }))
    }
}

/// Why an update's op wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateError {
    #[error("value is not an integer or out of range")]
    NotAnInteger,
    #[error("increment or decrement would overflow")]
    Overflow,
    #[error("the value would be {bytes} bytes, over the limit")]
    TooLarge { bytes: u64 },
}

impl From<SessionError> for ClientError {
    fn from(error: SessionError) -> Self {
        match error {
            SessionError::Protocol(error) => ClientError::Protocol(error),
            SessionError::Clock(error) => ClientError::Clock(error),
            error => ClientError::Session(error),
        }
    }
}
