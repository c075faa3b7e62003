//! The RESP gateway: RESP connections on one side, one rampkv
//! [`Driver`](rampkv_net::client::Driver) on the other, all on one thread.
//!
//! # Contract
//! Each RESP connection owns one driver session for its lifetime and runs one transaction at a
//! time, so pipelined commands are answered in order and each sees the writes of those before
//! it; consecutive pipelined reads (or writes) may run as one transaction. Bad input from a
//! client (malformed RESP, a client that does not read, too many bytes held) costs that
//! connection, never the gateway; a server that fails costs the commands that need its
//! partitions (with replication: waits for the failover, within one bound: `failover`);
//! everything the gateway holds is bounded ([`crate::GATEWAY_SESSIONS_MAX`],
//! [`crate::GATEWAY_BUFFERED_BYTES_MAX`], ...). Each room (# Layout) states its part in full.
//!
//! # Layout
//! - this module: [`Gateway`] (start, wait, stop), [`GatewayConfig`], [`GatewayError`], the
//!   gateway's bounds, and protected mode.
//! - `event_loop`: the loop and its connections: accepting, reading, writing and closing them,
//!   the session pool, the buffer budget and the idle timeout (*Sessions*, *Waiting*, *Fault
//!   model* of the connections).
//! - `dispatch`: what one command does (`EventLoop::execute`): a reply made in place (PING,
//!   AUTH, HELLO, INFO, CLIENT ...) or a transaction started; DEL's two steps. A new command
//!   goes here (*Authentication*).
//! - `multi`: MULTI / EXEC / DISCARD / WATCH: a connection's queue and its EXEC as one RAMP
//!   transaction, read-only or write-only.
//! - `batch`: pipelines: the consecutive reads or writes that join one transaction, and what
//!   a connection waits on (*Pipelines*).
//! - `driver`: the cluster side: connecting, stepping and reconnecting the driver, starting and
//!   answering transactions, failing the commands of a broken driver (*Fault model* of the
//!   cluster).
//! - `failover`: with replication, following the configuration: the follower thread that
//!   learns the current primaries and connects new drivers off the loop, the commands that
//!   wait through a failover and run again, and the one bound past which they are answered
//!   `-TRYAGAIN` / `-CLUSTERDOWN`.
//! - `replies`: reply writers: errors, read commands' replies, HELLO's map.
//! - `info`: INFO's sections, from the gateway, its cluster file and in-process servers.
//! - `keyspace`: SCAN, KEYS, DBSIZE and INFO's key count, over the servers' key listing.
//!
//! # Protected mode
//! A gateway that anyone could use (no password for `default`) refuses to listen on an address
//! other than loopback unless protected mode is off ([`GatewayConfig::protected_mode`], Redis's
//! `protected-mode`); [`Gateway::spawn`] checks it before anything listens.

mod batch;
mod dispatch;
mod driver;
mod event_loop;
mod failover;
mod info;
mod keyspace;
mod multi;
mod replies;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mio::net::TcpListener;
use mio::{Interest, Poll, Waker};

use super::auth::Users;
use super::{GATEWAY_BUFFERED_BYTES_MAX, GATEWAY_SESSIONS_DEFAULT, GATEWAY_SESSIONS_MAX};
use driver::{connect_driver, connect_driver_to};
use event_loop::{EventLoop, LISTENER_TOKEN, WAKER_TOKEN};
use failover::{follows_configuration, Follower, FollowerSetup};
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_net::client::{connect_within_failover_bound, current_addresses, ClientError};
use rampkv_net::server::Servers;

/// Longest the loop blocks while transactions are in flight: how late a transaction's deadline
/// (`TXN_TIMEOUT_MS`) may be noticed.
pub const IN_FLIGHT_POLL_TIMEOUT: Duration = Duration::from_millis(100);

/// Most pipelined commands run as one transaction.
pub const BATCH_COMMANDS_MAX: usize = 64;

/// Most keys pipelined SETs and MSETs grow a batched write to (one command alone may have up to
/// `TXN_KEYS_MAX`). RAMP-Fast stores a write's whole write set with each version it writes, so a
/// bigger batch makes every later read of those versions dearer. Measured on the 2-core machine
/// (docs/resp.md): MSET of 4 keys with `-P 16` ran at 32-39k/s merged up to 64 keys and 27k/s up
/// to 16, but MGET of 4 keys with `-P 16` over the versions written ran at 27-30k/s and 51-59k/s.
pub const WRITE_BATCH_KEYS_MAX: usize = 16;

/// Most commands a connection may queue between MULTI and EXEC. An EXEC runs at most
/// `TXN_KEYS_MAX` distinct keys, so a longer queue can only repeat keys or hold connection
/// commands; Redis clients' transactions are a handful of commands.
pub const MULTI_QUEUED_COMMANDS_MAX: usize = 1024;

/// Most bytes (keys, values, a fixed overhead per command) a connection may queue between
/// MULTI and EXEC: one largest MSET (`TXN_KEYS_MAX` values of 64 KiB) fits, twice that does
/// not. Counted in the gateway's byte budget as well.
pub const MULTI_QUEUED_BYTES_MAX: usize = 32 * 1024 * 1024;

/// INFO's replication section lists the placement of at most this many partitions (a cluster
/// may have 65,536), then how many it left out.
pub const INFO_PARTITION_LINES_MAX: u32 = 256;

/// Least time between two attempts to reconnect a failed driver.
pub const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);

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

/// A running gateway. Dropping it stops it.
#[derive(Debug)]
pub struct Gateway {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<Result<(), GatewayError>>>,
}

impl Gateway {
    /// Connects a driver to `cluster` (which must be up; with replication, to its current
    /// primaries, tried again within the failover bound, and starts the follower: `failover`),
    /// binds the listener, and starts the event loop thread.
    pub fn spawn(cluster: &Cluster, config: &GatewayConfig) -> Result<Gateway, GatewayError> {
        if let Some(refusal) = config.protected_mode_refusal() {
            return Err(refusal);
        }
        if !(1..=GATEWAY_SESSIONS_MAX).contains(&config.sessions) {
            return Err(GatewayError::Sessions { sessions: config.sessions });
        }
        if let Some(servers) = &config.in_process {
            let count = servers.groups.iter().map(|group| group.served().len()).sum::<usize>();
            if count != cluster.servers().len() {
                return Err(GatewayError::InProcessServers { count, servers: cluster.servers().len() });
            }
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let in_process = config.in_process.as_ref();
        let (sessions, options) = (config.sessions, config.txn_options);
        let (driver, follower) = if follows_configuration(cluster, in_process.is_some()) {
            // The current primaries, tried again within the failover bound as a Client's connect.
            let (driver, routes) = connect_within_failover_bound(cluster, || {
                let routes = current_addresses(cluster)?;
                Ok((connect_driver_to(poll.registry(), cluster, &routes, sessions, options)?, routes))
            })?;
            let registry = poll.registry().try_clone()?;
            let setup =
                FollowerSetup { registry, waker: Arc::clone(&waker), cluster: cluster.clone(), sessions, options };
            (driver, Some(Follower::spawn(setup, routes)?))
        } else {
            (connect_driver(poll.registry(), &waker, cluster, in_process, sessions, options)?, None)
        };
        let mut listener = TcpListener::bind(config.listen)?;
        poll.registry().register(&mut listener, LISTENER_TOKEN, Interest::READABLE)?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let event_loop = EventLoop::new(
            poll,
            listener,
            Arc::clone(&stop),
            (cluster.clone(), config.in_process.clone()),
            (driver, follower, Arc::clone(&waker)),
            (address.port(), Arc::clone(&config.users), config.idle_timeout),
            config.buffered_bytes_max,
        );
        let thread = std::thread::Builder::new().name("rampkv-gateway".into()).spawn(move || event_loop.run())?;
        Ok(Gateway { address, stop, waker, thread: Some(thread) })
    }

    /// The bound address of the RESP listener.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops the event loop and waits for it; returns its result.
    pub fn shutdown(mut self) -> Result<(), GatewayError> {
        self.stop_and_join()
    }

    /// Blocks until the event loop ends (only on an I/O error of its poller).
    pub fn wait(mut self) -> Result<(), GatewayError> {
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("gateway thread panicked").into()))
            }
            None => Ok(()),
        }
    }

    fn stop_and_join(&mut self) -> Result<(), GatewayError> {
        self.stop.store(true, Ordering::Release);
        self.waker.wake()?;
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("gateway thread panicked").into()))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
