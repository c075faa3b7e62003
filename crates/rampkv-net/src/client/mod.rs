//! The client side: the multi-session [`Driver`] and the blocking [`Client`] built on it.

mod driver;

pub use driver::{Completion, Driver, TxnResult, DRIVER_SESSIONS_MAX};

use std::time::Duration;

use crate::transport::{TcpClientTransport, TransportError};
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_core::protocol::session::SessionError;
use rampkv_core::protocol::{ProtocolError, ReadOutcome};
use rampkv_core::types::Timestamp;

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

/// A blocking client: one transaction at a time over TCP.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cluster = rampkv::cluster::Cluster::from_file("cluster.toml".as_ref())?;
/// let mut client = rampkv::client::Client::connect(&cluster)?;
/// client.put_all(vec![(b"k1".to_vec(), b"v1".to_vec()), (b"k2".to_vec(), b"v2".to_vec())])?;
/// let read = client.get_all(vec![b"k1".to_vec(), b"k2".to_vec()])?;
/// assert_eq!(read.items[0].value, b"v1");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Client {
    driver: Driver<TcpClientTransport>,
}

impl Client {
    /// Connects to every server of `cluster`.
    pub fn connect(cluster: &Cluster) -> Result<Client, ClientError> {
        let transport = TcpClientTransport::connect(cluster.servers())?;
        Ok(Client { driver: Driver::connect(transport, cluster.clone(), 1)? })
    }

    /// Reads `keys` read-atomically. Each item has the key, the version's timestamp (0 for a
    /// key never written, whose value is empty) and the value, in the order of `keys`.
    pub fn get_all(&mut self, keys: Vec<Vec<u8>>) -> Result<ReadOutcome, ClientError> {
        self.driver.begin_read(0, keys)?;
        match self.wait()? {
            TxnResult::Read(outcome) => Ok(outcome),
            TxnResult::Write(_) => unreachable!("a read session finished a write"),
        }
    }

    /// Writes every pair atomically (readers see all of them or none). Returns the
    /// transaction's timestamp. Invalid input fails before any server is contacted.
    pub fn put_all(&mut self, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Timestamp, ClientError> {
        self.put_all_with(|_| pairs)
    }

    /// Like [`Client::put_all`], with the pairs built once the timestamp is known.
    pub fn put_all_with(
        &mut self,
        build: impl FnOnce(Timestamp) -> Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Timestamp, ClientError> {
        self.driver.begin_write_with(0, build)?;
        match self.wait()? {
            TxnResult::Write(outcome) => Ok(outcome.ts),
            TxnResult::Read(_) => unreachable!("a write session finished a read"),
        }
    }

    /// Sets the algorithm (and its options) of later transactions (default RAMP-Fast).
    pub fn set_txn_options(&mut self, options: TxnOptions) {
        self.driver.set_txn_options(options);
    }

    fn wait(&mut self) -> Result<TxnResult, ClientError> {
        let mut completions = Vec::with_capacity(1);
        loop {
            self.driver.step(Some(Duration::from_millis(50)), &mut completions)?;
            if let Some(completion) = completions.pop() {
                return completion.result;
            }
        }
    }
}
