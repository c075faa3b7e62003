//! Servers: a group of server cores and the front ends that serve them.
//!
//! A [`ServerGroup`] owns one or more servers (each a [`ServerCore`] with its own store, and its
//! own TCP listener) and the TCP front end, one [`poller::Poller`] thread for every connection of
//! every server of the group. A fabric front end ([`front::FrontEnd`]: write-poll rings,
//! send/recv queue pairs, RF-RPC) serves the same servers with the same poller code over the
//! fabric, and an in-process client (`transport::local`, a layer above) calls them directly. What they
//! share is [`Servers`]: the cores, their item slots (GET\*), the group's clock (prepares are
//! stamped with it; recovery measures staleness with it) and the [`router::Router`] that carries
//! S2PL's deferred replies between them.
//!
//! # Layout (bottom up: a module names only those listed before it)
//! - `ids`: random identities (process incarnations, replication stream identities).
//! - [`router`]: inboxes and wake-ups of the front ends; deferred replies go to their owner's.
//! - `connections`: the connection counters the group's front ends share ([`Eviction`],
//!   [`ConnectionCounts`]; public under [`poller`]).
//! - `lease`: the lease gate that lets a server serve a partition, and its first-lease wait
//!   (public under [`failover`]).
//! - [`durable`]: a server's log and snapshots (a data directory): recovery before serving,
//!   records appended after each call, replies held until durable.
//! - [`replication`]: the same records shipped synchronously to the server's backups, replies
//!   held until every backup applied them; the backups' replication ports.
//! - `servers`: [`Servers`] and [`Served`], what every front end of a group shares.
//! - [`poller`]: the front end, generic over a [`ServerMedium`] of the message layer (TCP:
//!   epoll; fabric: the doorbell).
//! - [`resume`]: what a server process keeps in its data directory to start again as the same
//!   server (its incarnation), and how it starts under the configuration service.
//! - [`failover`]: the thread that applies each new configuration (promotion, rejoin, routes).
//! - this file: [`ServerGroup`], its options, and starting a group.
//! - [`front`]: the fabric front end (its region, its control thread and handshake), started
//!   on a [`ServerGroup`].
//!
//! # Starting a group
//! One constructor, [`ServerGroup::start`], takes the servers' [`ServerConfig`]s and a
//! [`ServerOptions`] (shared secret, connection limits, persistence, replication);
//! [`ServerGroup::spawn`] is its shorthand with the defaults.

mod connections;
pub mod durable;
pub mod failover;
pub mod front;
mod ids;
mod lease;
pub mod poller;
pub mod replication;
pub mod resume;
pub mod router;
mod servers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{GC_GRACE_MS, REPLICATION_BACKLOG_BYTES};
use rampkv_core::protocol::server::ServerCore;

use crate::auth::SharedSecret;
use crate::message::tcp::TcpServer;
use crate::message::{ServerMedium, Wake};
pub use durable::StartError;
use durable::{DurabilityConfig, Journal, FAILED_OVER_MARKER, SUPERSEDED_DIR};
use poller::Poller;
pub use poller::{ConnectionCounts, ConnectionLimits, Eviction};
use rampkv_durable::RecoveryReport;
pub use replication::ReplicationMedium;
use replication::{BackupService, Replicator, StreamStart};
pub use servers::{Served, Servers};

/// Settings of one server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// How long superseded versions stay readable.
    pub gc_grace_ms: u64,
}

impl ServerConfig {
    /// A server on `listen` with the default garbage-collection grace period.
    pub fn new(listen: SocketAddr) -> Self {
        Self { listen, gc_grace_ms: GC_GRACE_MS }
    }
}

/// A running poller thread; dropping it stops and joins the thread.
pub struct PollerThread {
    stop: Arc<AtomicBool>,
    wake: Arc<dyn Wake>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl std::fmt::Debug for PollerThread {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("PollerThread").field("running", &self.thread.is_some()).finish()
    }
}

impl PollerThread {
    /// Starts a poller over `medium` for `servers`, on a thread named `name`, with the default
    /// [`ConnectionLimits`].
    pub fn spawn<M: ServerMedium>(name: &str, medium: M, servers: Arc<Servers>) -> std::io::Result<Self> {
        Self::spawn_limited(name, medium, servers, ConnectionLimits::default())
    }

    /// As [`PollerThread::spawn`], holding the connections to `limits`.
    pub fn spawn_limited<M: ServerMedium>(
        name: &str,
        medium: M,
        servers: Arc<Servers>,
        limits: ConnectionLimits,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = medium.waker();
        let poller = Poller::new(medium, servers, Arc::clone(&stop), limits);
        // A poller serves its servers' writes: superseded values' buffers serve the next ones
        // (`rampkv_core::spare`).
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            rampkv_core::spare::keep_on_this_thread();
            poller.run()
        })?;
        Ok(Self { stop, wake, thread: Some(thread) })
    }

    /// Blocks until the thread ends (on an I/O error of its medium, or once stopped).
    pub fn join(&mut self) -> std::io::Result<()> {
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| Err(std::io::Error::other("poller thread panicked"))),
            None => Ok(()),
        }
    }

    /// Stops the poller and waits for it; returns its result.
    pub fn stop(&mut self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::Release);
        self.wake.wake();
        self.join()
    }
}

impl Drop for PollerThread {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// How a group of servers is started ([`ServerGroup::start`]); the default is what
/// [`ServerGroup::spawn`] starts: no secret, default limits, no persistence, no replication.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// The cluster's shared secret: clients of the binary port and of the fabric control ports
    /// (and primaries at the replication ports) must prove it. `None`: nobody needs to.
    pub secret: Option<Arc<SharedSecret>>,
    /// Bounds of the TCP connections.
    pub limits: ConnectionLimits,
    /// Persistence: server `i` keeps its store in `dirs[i]` (recovered before anything listens).
    pub durability: Option<Durability>,
    /// Replication among the servers of the group.
    pub replication: Option<ReplicationOptions>,
    /// Failover: the group's one server serves what its configuration node's leases allow.
    pub failover: Option<FailoverOptions>,
}

/// A replicated server process under the configuration service ([`failover`]).
#[derive(Debug, Clone)]
pub struct FailoverOptions {
    /// Its gate (over its configuration node).
    pub gate: Arc<failover::LeaseGate>,
    /// Its cluster and its index in it (the group holds exactly this one server).
    pub cluster: Cluster,
    pub index: usize,
    /// What its files hold (per partition, the primary in the last configuration applied:
    /// [`resume::ServerState`]), where the failover thread starts from.
    pub state: resume::ServerState,
    /// Its data directory, where the failover thread keeps that state (`None`: no directory).
    pub state_dir: Option<PathBuf>,
}

/// The data directories of a group's servers, one per server, and how they are kept.
#[derive(Debug, Clone)]
pub struct Durability {
    pub dirs: Vec<PathBuf>,
    pub config: DurabilityConfig,
}

/// Replication: every partition on `replicas` servers. Server `i` is the primary of its own
/// partitions and ships their records to its backups, the `replicas - 1` servers after it
/// (`rampkv_config::configuration::backups_of`), over `medium`: TCP to their replication
/// ports, or one-sided writes into a log region each backup registers (`replication` module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationOptions {
    /// Copies of every partition (f + 1); 1 means no replication.
    pub replicas: u32,
    /// The configuration epoch the records carry (`rampkv_config::configuration::FIRST_EPOCH`
    /// for a cluster's first configuration).
    pub epoch: u64,
    /// Where the other servers are. `None`: the group is the whole cluster (an embedded one)
    /// and binds its replication ports on its listen addresses, ports of the system's choice.
    pub peers: Option<ReplicationPeers>,
    /// The group's servers restarted into a running cluster (or were failed over before they
    /// started): they hold nothing, so their records go to no backup until failover opens
    /// catch-up links (rejoin); their replication ports take catching-up copies.
    pub rejoining: bool,
    /// The group's one server resumes from its data directory the roles the configuration
    /// (`epoch`) still gives its process ([`resume`]): its records go to these backups (server
    /// index and process incarnation: the in-sync backups of the partitions it is primary of),
    /// and its replication port makes the copies it kept current again.
    pub resume: Option<Vec<(usize, u64)>>,
    /// How records reach the backups (one-sided by default: an embedded cluster's servers share
    /// the process, hence the host's fabric).
    pub medium: ReplicationMedium,
}

/// The replication ports of a whole cluster, for a group that is part of it (`rampkv server`:
/// one server per process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationPeers {
    /// The group's servers are servers `first_index..` of the cluster.
    pub first_index: usize,
    /// Every server's replication port, in server order (the cluster file's `replicate`); the
    /// group binds its own servers' there.
    pub addresses: Vec<String>,
}

impl ReplicationOptions {
    /// `replicas` copies in the cluster's first configuration, within the group.
    pub fn new(replicas: u32) -> Self {
        Self {
            replicas,
            epoch: rampkv_config::configuration::FIRST_EPOCH,
            peers: None,
            rejoining: false,
            resume: None,
            medium: ReplicationMedium::default(),
        }
    }
}

/// A running group of servers sharing one TCP poller thread. Dropping it stops them.
#[derive(Debug)]
pub struct ServerGroup {
    addresses: Vec<SocketAddr>,
    servers: Arc<Servers>,
    /// Cooperative termination's resolver, started by the layer above (`recovery`, a client of
    /// the other servers), which hands it over to be kept: dropping it stops it. Stopped before
    /// the poller: it talks to these servers.
    resolver: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
    poller: PollerThread,
    /// The replication ports of the servers (empty without replication).
    backups: Vec<BackupService>,
    /// Stopped first: it adopts copies into these servers.
    failover: Option<failover::Failover>,
}

impl ServerGroup {
    /// Binds every server's listener, then starts the poller thread, with the default
    /// [`ServerOptions`].
    pub fn spawn(configs: &[ServerConfig]) -> std::io::Result<ServerGroup> {
        match Self::start(configs, &ServerOptions::default()) {
            Ok((group, _)) => Ok(group),
            Err(StartError::Listen(error)) => Err(error),
            Err(other) => Err(std::io::Error::other(other)),
        }
    }

    /// [`ServerGroup::start`] with persistence: server `i` keeps its store in `data_dirs[i]`.
    ///
    /// # Errors
    /// As [`ServerGroup::start`].
    pub fn spawn_durable(
        configs: &[ServerConfig],
        data_dirs: &[PathBuf],
        durability: &DurabilityConfig,
    ) -> Result<(ServerGroup, Vec<RecoveryReport>), StartError> {
        let durability = Durability { dirs: data_dirs.to_vec(), config: *durability };
        Self::start(configs, &ServerOptions { durability: Some(durability), ..ServerOptions::default() })
    }

    /// Starts the servers of `configs` with `options`. With persistence, each store is
    /// recovered from its directory before any listener is bound (a server that accepts
    /// connections has recovered), and each server's recovery report is returned (none
    /// without). With replication, the backups' replication ports are bound and every link
    /// has said hello before the poller starts.
    ///
    /// # Errors
    /// A directory that cannot be opened or recovered (in use by another server, unreadable,
    /// a damaged log): nothing was started, and the directories opened are released.
    /// Replication asked with fewer servers than replicas, or together with persistence (not
    /// built). A listener that cannot be bound.
    pub fn start(
        configs: &[ServerConfig],
        options: &ServerOptions,
    ) -> Result<(ServerGroup, Vec<RecoveryReport>), StartError> {
        let cores: Vec<Arc<ServerCore>> =
            configs.iter().map(|config| Arc::new(ServerCore::new(config.gc_grace_ms))).collect();
        let replication = options.replication.as_ref().filter(|replication| replication.replicas != 1);
        if let Some(replication) = replication {
            check_replication(replication, configs.len())?;
        }
        let rejoining = replication.is_some_and(|replication| replication.rejoining);
        let resuming = replication.is_some_and(|replication| replication.resume.is_some());
        let (journals, reports) = match &options.durability {
            Some(durability) => open_journals(configs, &cores, durability, rejoining, resuming)?,
            None => (cores.iter().map(|_| None).collect(), Vec::new()),
        };
        let (backups, replicators) = match replication {
            Some(replication) => start_replication(configs, replication, options, &journals, &cores)?,
            None => (Vec::new(), cores.iter().map(|_| None).collect()),
        };
        let limits = options.limits;
        let listen: Vec<SocketAddr> = configs.iter().map(|config| config.listen).collect();
        let (medium, addresses) =
            TcpServer::bind_capped(&listen, limits.connections_max, limits.connections_per_address_max)
                .map_err(StartError::Listen)?;
        let failover = match &options.failover {
            Some(failover) => Some(start_failover(failover, &cores, &backups)?),
            None => None,
        };
        let servers = Servers::with_journals(cores, journals, replicators, options.secret.clone());
        let _ = servers.backup_ports.set(backups.iter().map(BackupService::takeover).collect());
        if let Some((failover, _)) = &failover {
            // Set before any front end attaches item slots (they are attached to a started group).
            let _ = servers.lease_gate.set(Arc::clone(&failover.gate));
        }
        let failover = match failover {
            Some((options, backup)) => Some(
                failover::Failover::spawn(
                    Arc::clone(&options.gate),
                    Arc::clone(&servers),
                    backup,
                    options.cluster.clone(),
                    options.index,
                    (options.state.clone(), options.state_dir.clone()),
                )
                .map_err(StartError::Listen)?,
            ),
            None => None,
        };
        let poller = PollerThread::spawn_limited("rampkv-server", medium, Arc::clone(&servers), limits)
            .map_err(StartError::Listen)?;
        Ok((ServerGroup { addresses, servers, resolver: None, poller, backups, failover }, reports))
    }

    /// Joins these servers, which are servers `first_index..first_index + count` of `cluster`,
    /// to it: from now on each server refuses requests for keys outside its partitions and
    /// HELLOs from clients whose cluster file differs (`ServerCore::join_cluster`). The first
    /// step of starting cooperative termination (`recovery::StartRecovery`).
    pub(crate) fn join_cluster(&self, cluster: &Cluster, first_index: usize) -> std::io::Result<()> {
        if first_index + self.servers.served.len() > cluster.servers().len() {
            return Err(std::io::Error::other("these servers are not all in the cluster"));
        }
        for (offset, core) in self.servers.cores().iter().enumerate() {
            let joined = core.cluster_index() == Some(first_index + offset); // failover joins at start
            if !joined && !core.join_cluster(cluster.clone(), first_index + offset) {
                return Err(std::io::Error::other("a server was given its cluster twice"));
            }
        }
        Ok(())
    }

    /// Keeps `resolver` (cooperative termination's thread over these servers, replacing one
    /// kept before) until the group stops: it is dropped, which stops it, before the poller.
    pub(crate) fn keep_resolver(&mut self, resolver: Box<dyn std::fmt::Debug + Send + Sync>) {
        self.resolver = Some(resolver);
    }

    /// The bound address of every server, in configuration order.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// What the group's front ends share (a fabric front end, an in-process client).
    pub fn servers(&self) -> &Arc<Servers> {
        &self.servers
    }

    /// The request-handling core of every server (for statistics).
    pub fn cores(&self) -> &[Arc<ServerCore>] {
        self.servers.cores()
    }

    /// The clock every front end stamps prepares with.
    pub fn clock(&self) -> Instant {
        self.servers.clock
    }

    /// Stops the poller and waits for it; returns its result.
    pub fn shutdown(mut self) -> std::io::Result<()> {
        self.failover = None;
        self.resolver = None;
        self.poller.stop()
    }

    /// Blocks until the poller thread ends (it ends only on an I/O error of the poller).
    pub fn wait(mut self) -> std::io::Result<()> {
        self.poller.join()
    }

    /// The servers' replication ports, in server order (empty without replication).
    pub fn backups(&self) -> &[BackupService] {
        &self.backups
    }
}

impl Drop for ServerGroup {
    /// The links stop before the backups' ports close under them (which would read as a
    /// backup's failure).
    fn drop(&mut self) {
        self.failover = None;
        for replicator in self.servers.served.iter().filter_map(Served::replicator) {
            replicator.stop();
        }
    }
}

/// Joins the group's one server to its cluster under its lease gate, before anything
/// listens (a restarted process must not serve a single request from its empty store).
fn start_failover<'a>(
    options: &'a FailoverOptions,
    cores: &[Arc<ServerCore>],
    backups: &[BackupService],
) -> Result<(&'a FailoverOptions, Option<replication::BackupTakeover>), StartError> {
    let [core] = cores else {
        return Err(StartError::FailoverGroup { servers: cores.len() });
    };
    if !core.join_cluster(options.cluster.clone(), options.index) {
        return Err(StartError::FailoverGroup { servers: cores.len() });
    }
    let gate: Arc<dyn rampkv_core::protocol::server::PartitionGate> = options.gate.clone();
    core.set_gate(gate);
    Ok((options, backups.first().map(BackupService::takeover)))
}

/// Replication's own checks of a group's start (the cluster file's are the same, earlier).
fn check_replication(replication: &ReplicationOptions, group: usize) -> Result<(), StartError> {
    let replicas = replication.replicas;
    if replicas == 0 || replicas > rampkv_core::limits::CLUSTER_REPLICAS_MAX {
        return Err(StartError::ReplicaCount { replicas });
    }
    let servers = replication.peers.as_ref().map_or(group, |peers| peers.addresses.len());
    if let Some(peers) = &replication.peers {
        if peers.first_index + group > servers {
            return Err(StartError::NotInCluster { first: peers.first_index, group, servers });
        }
    }
    if replicas as usize > servers {
        return Err(StartError::TooFewServersForReplicas { replicas, servers });
    }
    Ok(())
}

/// Opens (recovers) every server's data directory, in parallel as separate processes would.
/// `rejoining` (replication: restarted into a running cluster, which failed its partitions over
/// to their backups): the store its files hold is superseded and may hold writes the cluster
/// never acknowledged (held for a backup that never got them); they are set aside
/// (`superseded/`, the previous such set removed) and the store starts empty. The copies it
/// kept as a backup (`copies/`) are what it catches up from (docs/replication.md).
/// `resuming` (the configuration service, from the Raft state the directory kept, still counts
/// on this server's process: [`resume`]): the store is recovered, and a `FAILED-OVER` marker of
/// an earlier rejoin is removed (the configuration, not the marker, says whose files count).
/// Otherwise (a start without Raft state) a directory with that marker is refused.
fn open_journals(
    configs: &[ServerConfig],
    cores: &[Arc<ServerCore>],
    durability: &Durability,
    rejoining: bool,
    resuming: bool,
) -> Result<(Vec<Option<Journal>>, Vec<RecoveryReport>), StartError> {
    let data_dirs = &durability.dirs;
    if data_dirs.len() != configs.len() {
        return Err(StartError::DirectoryCount { servers: configs.len(), directories: data_dirs.len() });
    }
    for dir in data_dirs {
        let marker = dir.join(FAILED_OVER_MARKER);
        if rejoining {
            let moved = rampkv_durable::set_aside(dir, SUPERSEDED_DIR)
                .map_err(|cause| StartError::Recovery { dir: dir.clone(), cause })?;
            if moved > 0 {
                log::warn!(
                    "data directory {}: restarted into a running cluster: the store of the process that died is \
                     set aside in {SUPERSEDED_DIR}/",
                    dir.display()
                );
            }
            std::fs::write(&marker, b"this server's partitions were failed over to other servers\n")
                .map_err(|cause| StartError::Layout { dir: dir.clone(), cause })?;
        } else if resuming {
            match std::fs::remove_file(&marker) {
                Err(cause) if cause.kind() != std::io::ErrorKind::NotFound => {
                    return Err(StartError::Layout { dir: dir.clone(), cause });
                }
                _ => {}
            }
        } else if marker.exists() {
            return Err(StartError::FailedOverDataDir { dir: dir.clone() });
        }
    }
    let config = &durability.config;
    let opened: Vec<_> = std::thread::scope(|scope| {
        let opening: Vec<_> = cores
            .iter()
            .zip(data_dirs)
            .map(|(core, dir)| scope.spawn(move || Journal::open(dir, config, Arc::clone(core))))
            .collect();
        opening.into_iter().map(|thread| thread.join()).collect()
    });
    let mut journals = Vec::with_capacity(configs.len());
    let mut reports = Vec::with_capacity(configs.len());
    for (outcome, dir) in opened.into_iter().zip(data_dirs) {
        let recovery = |cause| StartError::Recovery { dir: dir.clone(), cause };
        let (journal, report) =
            outcome.map_err(|_| StartError::RecoveryPanicked { dir: dir.clone() })?.map_err(recovery)?;
        journals.push(Some(journal));
        reports.push(report);
    }
    Ok((journals, reports))
}

/// Binds every server's replication port (the peers' address for it, or its listen address
/// with a port of the system's choosing), then starts every primary's links to its backups
/// (which, in other processes, may come up a moment later: the links retry).
fn start_replication(
    configs: &[ServerConfig],
    replication: &ReplicationOptions,
    options: &ServerOptions,
    journals: &[Option<Journal>],
    cores: &[Arc<ServerCore>],
) -> Result<(Vec<BackupService>, Vec<Option<Replicator>>), StartError> {
    let first_index = replication.peers.as_ref().map_or(0, |peers| peers.first_index);
    let mut backups = Vec::with_capacity(configs.len());
    for (offset, config) in configs.iter().enumerate() {
        let bind = match &replication.peers {
            None => SocketAddr::new(config.listen.ip(), 0),
            Some(peers) => {
                let address = &peers.addresses[first_index + offset];
                address.parse().map_err(|_| StartError::ReplicateAddress { address: address.clone() })?
            }
        };
        let listener = std::net::TcpListener::bind(bind).map_err(StartError::Replication)?;
        let persistence = options.durability.as_ref().and_then(|durability| {
            let dir = durability.dirs.get(offset)?;
            // A rejoining or resuming server loads the copies it kept (deltas; what a failover
            // takes over); one that starts with the cluster has none worth keeping.
            let (config, restore) = (durability.config, replication.rejoining || replication.resume.is_some());
            let resume_current = replication.resume.is_some();
            Some(replication::CopyPersistence { root: dir.join(durable::COPIES_DIR), config, restore, resume_current })
        });
        let service = BackupService::start_durable(listener, config.gc_grace_ms, options.secret.clone(), persistence)
            .map_err(StartError::Replication)?;
        backups.push(service);
    }
    let addresses: Vec<String> = match &replication.peers {
        None => backups.iter().map(|backup| backup.address().to_string()).collect(),
        Some(peers) => peers.addresses.clone(),
    };
    let mut replicators = Vec::with_capacity(configs.len());
    for primary in first_index..first_index + configs.len() {
        let targets: Vec<(usize, String, u64)> = match &replication.resume {
            // The in-sync backups the configuration names for the partitions it resumes.
            Some(backups) => backups
                .iter()
                .filter_map(|&(backup, incarnation)| Some((backup, addresses.get(backup)?.clone(), incarnation)))
                .collect(),
            None if replication.rejoining => Vec::new(),
            None => rampkv_config::configuration::backups_of(primary as u16, addresses.len(), replication.replicas)
                .into_iter()
                .map(|backup| {
                    let address = addresses[usize::from(backup)].clone();
                    (usize::from(backup), address, rampkv_config::configuration::BOOTSTRAP_INCARNATION)
                })
                .collect(),
        };
        // With a data directory the stream numbers records as the log does, keeps a backlog
        // for restarted backups' deltas, and a recovered store goes to every backup first; a
        // reply waits until every backup's copy on disk holds it.
        let start = match journals.get(primary - first_index).and_then(Option::as_ref) {
            Some(journal) => StreamStart {
                first: journal.last_lsn() + 1,
                backlog_bytes: REPLICATION_BACKLOG_BYTES,
                snapshot_first: journal.last_lsn() > 0,
                held_once_applied: true,
            },
            None => StreamStart::default(),
        };
        let secret = options.secret.clone();
        let source = cores.get(primary - first_index).cloned();
        let replicator = Replicator::start_with(
            primary as u16,
            replication.epoch,
            targets,
            secret,
            replication.medium,
            start,
            source,
        )
        .map_err(StartError::Replication)?;
        replicators.push(Some(replicator));
    }
    Ok((backups, replicators))
}
