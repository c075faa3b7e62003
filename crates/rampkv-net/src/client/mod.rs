//! The client side: the multi-session [`Driver`] and the blocking [`Client`] built on it.
//!
//! # Layout (bottom up)
//! - `error`: [`ClientError`] and [`UpdateError`].
//! - `driver`: the [`Driver`], the session machine over a transport.
//! - this file: the blocking [`Client`], the failover helpers and the [`connect`] functions.
//! - `update`: the blocking client's single-key conditional writes ([`Updated`]).
//! - `keyspace`: the blocking client's key space ([`Keys`], [`ScanOptions`]).

mod driver;
mod error;
mod keyspace;
mod update;

pub use driver::{Completion, Driver, TxnResult, DRIVER_SESSIONS_MAX};
pub use error::{ClientError, UpdateError};
pub use keyspace::{Keys, ScanOptions};
pub use update::Updated;

use std::time::Duration;

use crate::transport::onesided::OneSidedOptions;
use crate::transport::{
    ClientTransport, OneSidedClientTransport, RfRpcClientTransport, SendRecvClientTransport, TcpClientTransport,
    WritePollClientTransport,
};
use rampkv_config::configuration::Configuration;
use rampkv_core::cluster::{Cluster, Front};
use rampkv_core::limits::{FAILOVER_CLIENT_RETRY_MS_MAX, FAILOVER_CONFIG_ASK_TIMEOUT_MS, FAILOVER_RETRY_BACKOFF_MS};
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_core::protocol::ReadOutcome;
use rampkv_core::types::Timestamp;
use rampkv_core::wire::Write;

/// Whether a client of `cluster` follows a failover: the cluster is replicated and has a
/// configuration service to ask (the blocking [`Client`], `rampkv get/put` and the RESP gateway
/// then retry within `FAILOVER_CLIENT_RETRY_MS_MAX`).
pub fn follows_failover(cluster: &Cluster) -> bool {
    cluster.replicas() > 1 && cluster.config_addresses().is_ok()
}

/// Runs `connect` (which learns the current configuration and connects to the servers it
/// names) and, for a cluster that fails over ([`follows_failover`]), runs it again after an
/// error a failover explains ([`ClientError::is_connect_retryable`]) until it works, for at most
/// `FAILOVER_CLIENT_RETRY_MS_MAX`, every `FAILOVER_RETRY_BACKOFF_MS`: a client started in the
/// moment between a primary's death and its backup's promotion connects once the failover is
/// done rather than fail with `Connection refused`. Without replication it runs once.
///
/// # Errors
/// [`ClientError::FailoverBound`] with the last error once the bound has passed (a cluster file
/// whose servers never answer fails so after the bound); at once, an error a failover does not
/// explain, or any error without replication.
pub fn connect_within_failover_bound<R>(
    cluster: &Cluster,
    mut connect: impl FnMut() -> Result<R, ClientError>,
) -> Result<R, ClientError> {
    let started = std::time::Instant::now();
    let bound = Duration::from_millis(FAILOVER_CLIENT_RETRY_MS_MAX);
    let retry = follows_failover(cluster);
    loop {
        match connect() {
            Err(error) if retry && error.is_connect_retryable() => {
                if started.elapsed() >= bound {
                    let waited_ms = started.elapsed().as_millis() as u64;
                    return Err(ClientError::FailoverBound { waited_ms, last: Box::new(error) });
                }
                std::thread::sleep(Duration::from_millis(FAILOVER_RETRY_BACKOFF_MS));
            }
            result => return result,
        }
    }
}

/// The newest configuration any of the cluster's configuration nodes holds (every node is
/// asked: a lagging or just restarted one may answer an old epoch). `None`: the cluster file
/// has no configuration service (no replication, or no `config` addresses).
///
/// # Errors
/// [`ClientError::Configuration`] when no node answered (with the last error).
pub fn newest_configuration(cluster: &Cluster) -> Result<Option<Configuration>, ClientError> {
    newest_configuration_asking(cluster, |_| true)
}

/// [`newest_configuration`], asking only the nodes of the servers `ask` picks (by cluster-file
/// index): a fault harness asks around a server it stopped or cut off, whose node cannot know
/// the newest configuration and would cost every question its timeout.
///
/// # Errors
/// As [`newest_configuration`] (none asked: `Ok(None)`).
pub fn newest_configuration_asking(
    cluster: &Cluster,
    ask: impl Fn(usize) -> bool,
) -> Result<Option<Configuration>, ClientError> {
    let Ok(config_addresses) = cluster.config_addresses() else { return Ok(None) };
    if cluster.replicas() == 1 {
        return Ok(None);
    }
    let cluster_id = Configuration::initial(cluster)?.cluster_id();
    let timeout = Duration::from_millis(FAILOVER_CONFIG_ASK_TIMEOUT_MS);
    let mut newest: Option<Configuration> = None;
    let mut last = None;
    // The secret this process's clients prove on the data ports opens the config port too.
    let authenticator = crate::auth::client_secret().map(crate::auth::ConfigPortAuth);
    for (_, address) in config_addresses.iter().enumerate().filter(|(server, _)| ask(*server)) {
        let authenticator = authenticator.as_ref().map(|auth| auth as &dyn rampkv_config::auth::PortAuthenticator);
        match rampkv_config::client::ask(address, cluster_id, timeout, authenticator) {
            Ok(answer) => {
                if newest.as_ref().is_none_or(|newest| newest.epoch() < answer.configuration.epoch()) {
                    newest = Some(answer.configuration);
                }
            }
            Err(error) => last = Some(error),
        }
    }
    match (newest, last) {
        (Some(newest), _) => Ok(Some(newest)),
        (None, Some(error)) => Err(ClientError::Configuration(error)),
        (None, None) => Ok(None),
    }
}

/// The data address serving each server's cluster-file partitions now: the cluster file's
/// addresses without replication; with it (a cluster file with `replicas` above 1 and `config`
/// addresses), the current primaries the configuration service names.
///
/// # Errors
/// [`ClientError::Unavailable`] naming the partitions with no copy left;
/// [`ClientError::Configuration`] when no configuration node answered.
pub fn current_addresses(cluster: &Cluster) -> Result<Vec<String>, ClientError> {
    match newest_configuration(cluster)? {
        None => Ok(cluster.servers().to_vec()),
        Some(configuration) => crate::server::failover::routes(&configuration, cluster)
            .map_err(|partitions| ClientError::Unavailable { partitions }),
    }
}

/// The control addresses of `front` serving each server's cluster-file partitions now, for the
/// fabric transports (write-poll, send-recv and GET\* on the ring front end, RF-RPC on its
/// own): the cluster file's without replication; with it, those of the servers the
/// configuration service names primary now, as [`current_addresses`] names their data
/// addresses. A server that took another's partitions over accepts a HELLO that calls it by
/// that server's number, on every medium (the check is the core's). A transport built from
/// these after a failover starts with nothing cached (GET\*: no slot address of an older
/// epoch).
///
/// # Errors
/// As [`current_addresses`]; [`ClientError::Configuration`] when the cluster file gives a
/// server no `front` address.
pub fn current_front_addresses(cluster: &Cluster, front: Front) -> Result<Vec<String>, ClientError> {
    let controls = cluster.front_addresses(front).map_err(rampkv_config::error::ConfigError::from)?;
    let routes = current_addresses(cluster)?;
    // Each route is some server's data address: that server's front end serves the route.
    Ok(routes
        .iter()
        .enumerate()
        .map(|(server, route)| {
            let serving = cluster.servers().iter().position(|address| address == route).unwrap_or(server);
            controls[serving].clone()
        })
        .collect())
}

/// [`Connector`]s of every transport that reaches server processes: each connects to the
/// servers serving each server's partitions now ([`current_addresses`] for TCP,
/// [`current_front_addresses`] for the fabric transports, whose front ends the cluster file
/// must name), so that a [`Client`] built with one follows a failover.
pub mod connect {
    use super::*;

    /// TCP.
    pub fn tcp(cluster: &Cluster) -> Result<TcpClientTransport, ClientError> {
        Ok(TcpClientTransport::connect(&current_addresses(cluster)?)?)
    }

    /// Write-poll rings (the `ring` front end).
    pub fn writepoll(cluster: &Cluster) -> Result<WritePollClientTransport, ClientError> {
        Ok(WritePollClientTransport::connect(&current_front_addresses(cluster, Front::Ring)?)?)
    }

    /// Send/recv (the `ring` front end).
    pub fn sendrecv(cluster: &Cluster) -> Result<SendRecvClientTransport, ClientError> {
        Ok(SendRecvClientTransport::connect(&current_front_addresses(cluster, Front::Ring)?)?)
    }

    /// GET\* over item slots, the rest over write-poll rings (the `ring` front end), default
    /// options.
    pub fn onesided(cluster: &Cluster) -> Result<OneSidedClientTransport, ClientError> {
        let controls = current_front_addresses(cluster, Front::Ring)?;
        Ok(OneSidedClientTransport::connect(&controls, OneSidedOptions::default())?)
    }

    /// Remote-fetch RPC (the `rfrpc` front end).
    pub fn rfrpc(cluster: &Cluster) -> Result<RfRpcClientTransport, ClientError> {
        Ok(RfRpcClientTransport::connect(&current_front_addresses(cluster, Front::RfRpc)?)?)
    }
}

/// Whether every partition has its primary and all its in-sync backups (a fault harness kills
/// a server only then: f failures at a time). True without replication.
///
/// # Errors
/// As [`newest_configuration`].
pub fn full_replica_sets(cluster: &Cluster) -> Result<bool, ClientError> {
    Ok(newest_configuration(cluster)?.is_none_or(|configuration| {
        let copies = configuration.replicas() as usize;
        configuration.replica_sets().iter().all(|set| set.primary.is_some() && set.backups.len() + 1 >= copies)
    }))
}

/// A blocking client: one transaction at a time, over TCP ([`Client::connect`]) or any transport
/// a [`Connector`] builds ([`Client::connect_with`] and the [`connect`] functions: the fabric
/// transports of a cluster file that names their front ends).
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
///
/// With replication (a cluster file with `replicas` and `config` addresses), it connects to the
/// current primaries, and a transaction that fails because a server failed or was deposed is
/// tried again, transparently, once the client has learned the new configuration (for at most
/// `FAILOVER_CLIENT_RETRY_MS_MAX`): the caller sees latency, not an error, unless no copy of a
/// partition is left ([`ClientError::Unavailable`]). A write tried again is a new transaction
/// with a new timestamp; the failed attempt, if it prepared anywhere, is resolved by
/// cooperative termination (its values are the same).
#[derive(Debug)]
pub struct Client<T: ClientTransport = TcpClientTransport> {
    driver: Driver<T>,
    cluster: Cluster,
    options: Option<TxnOptions>,
    connect: Connector<T>,
}

/// Builds a transport to the servers serving a cluster's partitions now (with replication: the
/// current primaries); a [`Client`] calls it again after a failover.
pub type Connector<T> = fn(&Cluster) -> Result<T, ClientError>;

impl Client {
    /// Connects over TCP to every server of `cluster` (with replication: to the current
    /// primaries).
    pub fn connect(cluster: &Cluster) -> Result<Client, ClientError> {
        Client::connect_with(cluster, connect::tcp)
    }
}

impl<T: ClientTransport> Client<T> {
    /// Connects with the transport `connect` builds (e.g. [`connect::onesided`]), and builds
    /// it again to follow a failover. With replication, a connect that fails for a reason a
    /// failover explains is tried again within the failover bound
    /// ([`connect_within_failover_bound`]), as a transaction is.
    pub fn connect_with(cluster: &Cluster, connect: Connector<T>) -> Result<Client<T>, ClientError> {
        let driver = connect_within_failover_bound(cluster, || Driver::connect(connect(cluster)?, cluster.clone(), 1))?;
        Ok(Client { driver, cluster: cluster.clone(), options: None, connect })
    }

    /// The transport (its counters: GET\* statistics, batching).
    pub fn transport(&self) -> &T {
        self.driver.transport()
    }

    /// Runs `attempt` and, with replication, tries again after a failover-related failure
    /// (reconnecting to the current primaries first), within `FAILOVER_CLIENT_RETRY_MS_MAX`.
    fn with_failover<R>(
        &mut self,
        mut attempt: impl FnMut(&mut Self) -> Result<R, ClientError>,
    ) -> Result<R, ClientError> {
        let deadline = std::time::Instant::now() + Duration::from_millis(FAILOVER_CLIENT_RETRY_MS_MAX);
        let replicated = follows_failover(&self.cluster);
        let mut result = attempt(self);
        while replicated && std::time::Instant::now() < deadline {
            match &result {
                Err(error) if error.is_failover() => {}
                _ => return result,
            }
            // Reconnect until it works (a server may still be taking over: it refuses HELLO
            // meanwhile), then try again.
            loop {
                std::thread::sleep(Duration::from_millis(FAILOVER_RETRY_BACKOFF_MS));
                match self.reconnect() {
                    Ok(()) => break,
                    Err(error @ ClientError::Unavailable { .. }) => return Err(error),
                    Err(error) if std::time::Instant::now() >= deadline => return Err(error),
                    Err(_) => {}
                }
            }
            result = attempt(self);
        }
        result
    }

    fn reconnect(&mut self) -> Result<(), ClientError> {
        let mut driver = Driver::connect((self.connect)(&self.cluster)?, self.cluster.clone(), 1)?;
        if let Some(options) = &self.options {
            driver.set_txn_options(*options);
        }
        driver.follow_clocks(&self.driver); // its next write above every one before
        self.driver = driver;
        Ok(())
    }

    /// Reads `keys` read-atomically. Each item has the key, the version's timestamp (0 for a
    /// key never written) and the value, in the order of `keys`; `exists` is false (and the
    /// value empty) for a key never written, deleted, or expired at the read's one instant
    /// ([`ReadOutcome::read_at_ms`]): keys one transaction wrote with one deadline are all
    /// there or all gone.
    pub fn get_all(&mut self, keys: Vec<Vec<u8>>) -> Result<ReadOutcome, ClientError> {
        self.with_failover(|client| client.get_once(keys.clone()))
    }

    fn get_once(&mut self, keys: Vec<Vec<u8>>) -> Result<ReadOutcome, ClientError> {
        self.driver.begin_read(0, keys)?;
        match self.wait()? {
            TxnResult::Read(outcome) => Ok(outcome),
            other => unreachable!("a read session finished as {other:?}"),
        }
    }

    /// Writes every pair atomically (readers see all of them or none). Returns the
    /// transaction's timestamp. Invalid input fails before any server is contacted.
    pub fn put_all(&mut self, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Timestamp, ClientError> {
        self.with_failover(|client| client.put_all_with(|_| pairs.clone()))
    }

    /// Writes every [`Write`] atomically, as [`Client::put_all`]: each may expire
    /// ([`Write::expiring`], a deadline in ms since the Unix epoch) or delete its key
    /// ([`Write::delete`]). A transaction's writes with one deadline expire together for every
    /// reader (docs/architecture.md, "Expiry and deletion"): a read never sees some of them
    /// there and others gone.
    pub fn put_writes(&mut self, writes: Vec<Write>) -> Result<Timestamp, ClientError> {
        self.with_failover(|client| client.put_once(writes.clone()))
    }

    /// Writes every pair atomically, every version expiring at `expires_at_ms` (ms since the
    /// Unix epoch, by this client's clock; each reader judges it by its own). To expire a group
    /// `ttl` from now, take `now` once for all of it (`types::wall_clock_unix_ms`).
    pub fn put_all_expiring(
        &mut self,
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        expires_at_ms: u64,
    ) -> Result<Timestamp, ClientError> {
        self.put_writes(pairs.into_iter().map(|(key, value)| Write::expiring(key, value, expires_at_ms)).collect())
    }

    /// Deletes every key atomically: readers see all of them gone or none. A deletion is a
    /// version that has already expired, reclaimed by the servers like any expired one.
    pub fn delete_all(&mut self, keys: Vec<Vec<u8>>) -> Result<Timestamp, ClientError> {
        self.put_writes(keys.into_iter().map(Write::delete).collect())
    }

    fn put_once(&mut self, writes: Vec<Write>) -> Result<Timestamp, ClientError> {
        self.driver.begin_writes(0, writes, false)?;
        match self.wait()? {
            TxnResult::Write(outcome) => Ok(outcome.ts),
            other => unreachable!("a write session finished as {other:?}"),
        }
    }

    /// Like [`Client::put_all`], with the pairs built once the timestamp is known (one
    /// attempt: no retry after a failover).
    pub fn put_all_with(
        &mut self,
        build: impl FnOnce(Timestamp) -> Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Timestamp, ClientError> {
        self.driver.begin_write_with(0, build)?;
        match self.wait()? {
            TxnResult::Write(outcome) => Ok(outcome.ts),
            other => unreachable!("a write session finished as {other:?}"),
        }
    }

    /// Sets the algorithm (and its options) of later transactions (default RAMP-Fast).
    pub fn set_txn_options(&mut self, options: TxnOptions) {
        self.options = Some(options);
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
