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
//! # Layout
//! - [`router`]: inboxes and wake-ups of the front ends; deferred replies go to their owner's.
//! - [`poller`]: the front end, generic over a [`ServerMedium`] of the message layer (TCP:
//!   epoll; fabric: the doorbell).
//! - [`front`]: the fabric front end (its region, its control thread and handshake).
//! - [`durable`]: a server's log and snapshots (a data directory): recovery before serving,
//!   records appended after each call, replies held until durable.
//! - [`replication`]: the same records shipped synchronously to the server's backups, replies
//!   held until every backup applied them; the backups' replication ports.
//!
//! # Starting a group
//! One constructor, [`ServerGroup::start`], takes the servers' [`ServerConfig`]s and a
//! [`ServerOptions`] (shared secret, connection limits, persistence, replication);
//! [`ServerGroup::spawn`] is its shorthand with the defaults.

pub mod durable;
pub mod failover;
pub mod front;
pub mod poller;
pub mod replication;
pub mod resume;
pub mod router;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{GC_GRACE_MS, REPLICATION_BACKLOG_BYTES};
use rampkv_core::protocol::server::{Effects, LogPosition, Now, Reply, ServerCore};
use rampkv_core::protocol::ConnectionId;
use rampkv_core::types::{wall_clock_us, Timestamp};
use rampkv_core::wire::Request;

use crate::auth::SharedSecret;
use crate::item_slots::Publisher;
use crate::message::tcp::TcpServer;
use crate::message::{ServerMedium, Wake};
pub use durable::StartError;
use durable::{DurabilityConfig, Journal, FAILED_OVER_MARKER, SUPERSEDED_DIR};
pub use poller::{ConnectionCounts, ConnectionLimits, Eviction};
use poller::{ConnectionStats, Poller};
use rampkv_durable::{DurableError, RecoveryReport};
pub use replication::ReplicationMedium;
use replication::{BackupService, ReplicationStats, Replicator, StreamStart};
use router::Router;

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

/// One server as every front end sees it: its core and, once a front end attached them, its
/// item slots (the edge applies the core's publication effects to them).
#[derive(Debug)]
pub struct Served {
    pub core: Arc<ServerCore>,
    slots: OnceLock<Arc<dyn Publisher>>,
    /// Its log, when it has a data directory.
    journal: Option<Journal>,
    /// Its links to its backups, when the group replicates (with a journal too: records are
    /// logged, then shipped, numbered alike).
    replicator: Option<Replicator>,
}

impl Served {
    /// Serves `request` of `connection` with the core and applies its publication effects to
    /// the item slots; returns the reply (none while it waits for a lock). Replies to other
    /// requests stay in `effects.replies` for the caller to route. What it logged is written at
    /// the caller's next [`Servers::flush_logs`] (a batch of calls shares one write).
    pub fn serve(
        &self,
        connection: ConnectionId,
        request: Request,
        request_id: u64,
        now: Now,
        effects: &mut Effects,
    ) -> Option<Reply> {
        let slots = self.slots.get();
        effects.set_publishing(slots.is_some());
        effects.set_logging(self.records_kept());
        effects.release_after = None;
        let reply = self.core.handle(connection, request, request_id, now, effects);
        self.publish(effects);
        self.log(effects);
        reply
    }

    /// Commits transaction `ts` as a COMMIT request does, republishing what it advanced and
    /// logging it (recovery). Returns the keys committed.
    pub fn commit(&self, ts: Timestamp) -> usize {
        let mut effects = Effects::default();
        effects.set_publishing(self.slots.get().is_some());
        effects.set_logging(self.records_kept());
        let committed = self.core.commit(ts, &mut effects);
        self.publish(&mut effects);
        self.log(&mut effects);
        self.flush_log();
        committed
    }

    /// The core's timer (`ServerCore::tick`: the background sweep, which also reclaims
    /// expired keys), freeing the item slots of the keys it removed.
    pub fn tick(&self, now: Now) -> usize {
        let mut effects = Effects::default();
        effects.set_publishing(self.slots.get().is_some());
        let swept = self.core.tick(now, &mut effects);
        self.publish(&mut effects);
        swept
    }

    /// Aborts transaction `ts` as cooperative termination decided, logging it.
    pub fn abort(&self, ts: Timestamp, now_ms: u64) {
        let mut effects = Effects::default();
        effects.set_logging(self.records_kept());
        self.core.abort(ts, now_ms, &mut effects);
        self.log(&mut effects);
        self.flush_log();
    }

    /// Writes (or has written) what was appended; true if the durable position moved here.
    fn flush_log(&self) -> bool {
        self.journal.as_ref().is_some_and(Journal::flush)
    }

    /// Whether the core describes its changes as records (for a log or for backups).
    fn records_kept(&self) -> bool {
        self.journal.is_some() || self.replicator.is_some()
    }

    /// Appends what the call changed to the log, or ships it to the backups (if the server has
    /// either); its replies then wait for `effects.release_after`.
    fn log(&self, effects: &mut Effects) {
        match (&self.journal, &self.replicator) {
            (journal, Some(replicator)) => replicator.append_journaled(effects, journal.as_ref()),
            (Some(journal), None) => journal.append(effects),
            (None, None) => {}
        }
    }

    /// Its replication links, when the group replicates.
    pub fn replicator(&self) -> Option<&Replicator> {
        self.replicator.as_ref()
    }

    /// Its log, when it has a data directory.
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// How far its log is durable, or its records acknowledged by every backup: replies held
    /// up to here may go (everything, without either).
    pub fn durable_position(&self) -> LogPosition {
        match (&self.journal, &self.replicator) {
            (Some(journal), Some(replicator)) => journal.durable_position().min(replicator.acknowledged()),
            (Some(journal), None) => journal.durable_position(),
            (None, Some(replicator)) => replicator.acknowledged(),
            (None, None) => LogPosition(u64::MAX),
        }
    }

    fn publish(&self, effects: &mut Effects) {
        if let Some(slots) = self.slots.get() {
            slots.apply(self.core.store(), effects);
        }
        effects.committed.clear();
        effects.prepared.clear();
        effects.reclaimed.clear();
    }

    /// A GET_LOCATE key's item slot (publishing its latest committed version first if needed).
    pub fn locate(&self, key: &[u8]) -> Option<u32> {
        self.slots.get().and_then(|slots| slots.locate(self.core.store(), key))
    }

    /// The item slots, once attached.
    pub fn item_slots(&self) -> Option<&Arc<dyn Publisher>> {
        self.slots.get()
    }

    /// Moves a backup copy this server takes over (failover) into its store, leaving the copy
    /// empty (`Store::absorb`: keys move whole, without copying their versions): every version,
    /// every transaction still prepared (left to the resolver: cooperative termination) and
    /// every remembered abort; republishes the keys' item slots. Not shipped to this server's
    /// own backups (they get it with the snapshot of a catch-up, rejoin). Returns the keys moved.
    pub fn adopt(&self, copy: &rampkv_core::storage::Store, now_ms: u64) -> usize {
        let publishing = self.slots.get().is_some();
        let mut keys = Vec::new();
        // What it takes is described by no record: catching-up backups' copies of the stream so
        // far lack it (a new stream identity), and the log needs a snapshot to hold it.
        if let Some(replicator) = &self.replicator {
            replicator.new_lineage();
        }
        let count = self.core.store().absorb(copy, now_ms, publishing.then_some(&mut keys));
        if let Some(journal) = &self.journal {
            journal.snapshot_soon();
        }
        if publishing {
            let mut effects = Effects::default();
            effects.set_publishing(true);
            effects.committed = keys;
            self.publish(&mut effects);
        }
        count
    }
}

/// What every front end of a server group shares. See the module docs.
#[derive(Debug)]
pub struct Servers {
    served: Vec<Served>,
    cores: Vec<Arc<ServerCore>>,
    router: Router,
    clock: Instant,
    /// The cluster's shared secret: clients of the binary port and of the fabric control
    /// ports must prove it (None: nobody needs to).
    secret: Option<Arc<SharedSecret>>,
    connection_stats: ConnectionStats,
    /// With failover: the data address serving each server's cluster-file partitions now
    /// (`None`: the cluster file's addresses).
    routes: parking_lot::RwLock<Option<Vec<String>>>,
    /// With failover: the lease gate of the group's one server, whose serving lease its item
    /// region's lease word follows (unset: the word says no lease is needed).
    lease_gate: OnceLock<Arc<failover::LeaseGate>>,
    /// With replication: the servers' replication ports, whose copies may fail to be kept on
    /// disk ([`Servers::persistence_failure`]).
    backup_ports: OnceLock<Vec<replication::BackupTakeover>>,
}

impl Servers {
    #[cfg(test)]
    pub(crate) fn new(cores: Vec<Arc<ServerCore>>) -> Self {
        let journals = cores.iter().map(|_| None).collect();
        let replicators = cores.iter().map(|_| None).collect();
        Self::build(cores, journals, replicators, None)
    }

    fn build(
        cores: Vec<Arc<ServerCore>>,
        journals: Vec<Option<Journal>>,
        replicators: Vec<Option<Replicator>>,
        secret: Option<Arc<SharedSecret>>,
    ) -> Self {
        let served = cores
            .iter()
            .zip(journals)
            .zip(replicators)
            .map(|((core, journal), replicator)| Served {
                core: Arc::clone(core),
                slots: OnceLock::new(),
                journal,
                replicator,
            })
            .collect();
        let connection_stats = ConnectionStats::default();
        let routes = parking_lot::RwLock::new(None);
        Self {
            served,
            cores,
            router: Router::default(),
            clock: Instant::now(),
            secret,
            connection_stats,
            routes,
            lease_gate: OnceLock::new(),
            backup_ports: OnceLock::new(),
        }
    }

    /// The data address serving each server's partitions now (failover), if known.
    pub fn routes(&self) -> Option<Vec<String>> {
        self.routes.read().clone()
    }

    pub(crate) fn set_routes(&self, routes: Vec<String>) {
        *self.routes.write() = Some(routes);
    }

    /// The shared secret clients must prove, if any.
    pub fn secret(&self) -> Option<&Arc<SharedSecret>> {
        self.secret.as_ref()
    }

    /// What the group's front ends' connections hold, and the connections they closed.
    pub fn connection_stats(&self) -> &ConnectionStats {
        &self.connection_stats
    }

    /// Servers with their logs and replication links (`None`: a server without). The logs and
    /// links wake front ends of the group that hold replies when their watermark moves.
    fn with_journals(
        cores: Vec<Arc<ServerCore>>,
        journals: Vec<Option<Journal>>,
        replicators: Vec<Option<Replicator>>,
        secret: Option<Arc<SharedSecret>>,
    ) -> Arc<Self> {
        let servers = Arc::new(Self::build(cores, journals, replicators, secret));
        for served in &servers.served {
            // Weak: the servers own the logs and links, whose callbacks must not keep them alive.
            let weak = Arc::downgrade(&servers);
            let wake = move || {
                if let Some(servers) = weak.upgrade() {
                    servers.router.wake_holding();
                }
            };
            if let Some(journal) = &served.journal {
                journal.set_wake(wake.clone());
            }
            if let Some(replicator) = &served.replicator {
                replicator.set_wake(wake);
            }
            if let Some(replicator) = &served.replicator {
                replicator.set_source(Arc::clone(&served.core));
            }
        }
        servers
    }

    /// What the servers' replication links did, summed (`None`: the group does not replicate).
    pub fn replication_stats(&self) -> Option<ReplicationStats> {
        let mut replicators = self.served.iter().filter_map(Served::replicator).peekable();
        replicators.peek()?;
        let mut total = ReplicationStats::default();
        for replicator in replicators {
            total.add(&replicator.stats());
        }
        Some(total)
    }

    /// The servers, in configuration order.
    pub fn served(&self) -> &[Served] {
        &self.served
    }

    /// Their cores, in configuration order.
    pub fn cores(&self) -> &[Arc<ServerCore>] {
        &self.cores
    }

    /// The router of the group's front ends.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The clock every front end stamps prepares with.
    pub fn clock(&self) -> Instant {
        self.clock
    }

    /// Milliseconds on the group's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// The time a request is served at: the group's clock and the wall clock (read here, once
    /// per pass of a front end).
    pub fn now(&self) -> Now {
        Now { monotonic_ms: self.now_ms(), wall_clock_us: wall_clock_us() }
    }

    /// The time `request` is served at by a caller that serves one request at a time (the
    /// in-process transport): the wall clock is read only when the request carries a timestamp
    /// the core checks against it, or judges liveness at (a key listing; 0 otherwise: nothing
    /// reads it), saving a clock read per GET.
    pub fn now_for(&self, request: &Request) -> Now {
        let wall_clock_us = if request.reads_wall_clock() { wall_clock_us() } else { 0 };
        Now { monotonic_ms: self.now_ms(), wall_clock_us }
    }

    /// Ends a front end's batch of calls: every server's log writes what they appended
    /// (`server::durable`), and if that moved a durable position here (`everysec`, `no`), the
    /// other front ends holding replies are woken (`front`, the caller, releases its own).
    pub fn flush_logs(&self, front: Option<u32>) {
        let mut moved = false;
        for served in &self.served {
            moved |= served.flush_log();
        }
        if moved {
            self.router.wake_holding_except(front);
        }
    }

    /// How far server `index`'s log is durable (and replicated): its replies held behind a
    /// barrier up to here are released (all of them, for a server without a log).
    pub fn durable_position(&self, index: usize) -> LogPosition {
        self.served.get(index).map_or(LogPosition(u64::MAX), Served::durable_position)
    }

    /// The first server whose log stopped (its index and why): the group must stop and
    /// recover from its files.
    pub fn persistence_failure(&self) -> Option<(usize, Arc<DurableError>)> {
        self.served.iter().enumerate().find_map(|(index, served)| Some((index, served.journal()?.failure()?)))
    }

    /// The first server whose backup copies could not be kept on disk (its index and why): it
    /// no longer acknowledges its primaries' records, and must stop as for its own log, so
    /// that the configuration fails it over (`BackupService::failure`).
    pub fn copy_failure(&self) -> Option<(usize, String)> {
        let ports = self.backup_ports.get()?;
        ports.iter().enumerate().find_map(|(index, port)| Some((index, port.failure()?)))
    }

    /// Attaches item slots to server `index` (a fabric front end with GET\* does). Fails if it
    /// has some already. Their lease word follows the server's serving lease from now on, with
    /// failover (the configuration node's driver stores it at every change); without, it says
    /// no lease is needed.
    pub fn attach_item_slots(&self, index: usize, slots: Arc<dyn Publisher>) -> std::io::Result<()> {
        let served = self.served.get(index).ok_or_else(|| std::io::Error::other("no such server"))?;
        served.slots.set(Arc::clone(&slots)).map_err(|_| std::io::Error::other("a server already has item slots"))?;
        match self.lease_gate.get() {
            Some(gate) => {
                // Weak: the node outlives front ends, whose regions must go with them.
                let slots = Arc::downgrade(&slots);
                gate.node().watch_serving_lease(Box::new(move |end_ns| {
                    if let Some(slots) = slots.upgrade() {
                        slots.set_lease_word(crate::item_slots::lease_word_of(end_ns));
                    }
                }));
            }
            None => slots.set_lease_word(crate::item_slots::LEASE_WORD_NOT_NEEDED),
        }
        Ok(())
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
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || poller.run())?;
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

/// A random non-zero identity (the kernel's random source; the clock if it fails): process
/// incarnations, replication stream identities.
pub(crate) fn random_id() -> u64 {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_err() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        bytes = (now.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
    }
    u64::from_le_bytes(bytes).max(1)
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
