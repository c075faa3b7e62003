//! Servers: a group of server cores and the front ends that serve them.
//!
//! A [`ServerGroup`] owns one or more servers (each a [`ServerCore`] with its own store, and its
//! own TCP listener) and the TCP front end, one [`poller::Poller`] thread for every connection of
//! every server of the group. A fabric front end ([`front::FrontEnd`]: write-poll rings,
//! send/recv queue pairs, RF-RPC) serves the same servers with the same poller code over the
//! fabric, and an in-process client ([`crate::transport::local`]) calls them directly. What they
//! share is [`Servers`]: the cores, their item slots (GET\*), the group's clock (prepares are
//! stamped with it; recovery measures staleness with it) and the [`router::Router`] that carries
//! S2PL's deferred replies between them.
//!
//! # Layout
//! - [`router`]: inboxes and wake-ups of the front ends; deferred replies go to their owner's.
//! - [`poller`]: the front end, generic over a [`poller::ServerMedium`] (TCP: epoll; fabric:
//!   the doorbell).
//! - [`front`]: the fabric front end (its region, its control thread and handshake).
//! - [`durable`]: a server's log and snapshots (a data directory): recovery before serving,
//!   records appended after each call, replies held until durable.

pub mod durable;
pub mod front;
pub mod poller;
pub mod router;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use rampkv_core::cluster::Cluster;
use rampkv_core::limits::GC_GRACE_MS;
use rampkv_core::protocol::server::{Effects, LogPosition, Now, Reply, ServerCore};
use rampkv_core::protocol::ConnectionId;
use rampkv_core::types::{wall_clock_us, Timestamp};
use rampkv_core::wire::Request;

use crate::auth::SharedSecret;
use crate::item_slots::Publisher;
use crate::message::tcp::TcpServer;
use crate::recovery::{spawn_resolver, Resolver};
use durable::{DurabilityConfig, Journal};
pub use poller::{ConnectionCounts, ConnectionLimits, Eviction};
use poller::{ConnectionStats, Poller, ServerMedium};
use rampkv_durable::{DurableError, RecoveryReport};
use router::{Router, Wake};

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
        effects.set_logging(self.journal.is_some());
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
        effects.set_logging(self.journal.is_some());
        let committed = self.core.commit(ts, &mut effects);
        self.publish(&mut effects);
        self.log(&mut effects);
        self.flush_log();
        committed
    }

    /// Aborts transaction `ts` as cooperative termination decided, logging it.
    pub fn abort(&self, ts: Timestamp, now_ms: u64) {
        let mut effects = Effects::default();
        effects.set_logging(self.journal.is_some());
        self.core.abort(ts, now_ms, &mut effects);
        self.log(&mut effects);
        self.flush_log();
    }

    /// Writes (or has written) what was appended; true if the durable position moved here.
    fn flush_log(&self) -> bool {
        self.journal.as_ref().is_some_and(Journal::flush)
    }

    /// Appends what the call changed to the log (if the server has one); its replies then wait
    /// for `effects.release_after`.
    fn log(&self, effects: &mut Effects) {
        if let Some(journal) = &self.journal {
            journal.append(effects);
        }
    }

    /// Its log, when it has a data directory.
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// How far its log is durable: replies held up to here may go (everything, without a log).
    pub fn durable_position(&self) -> LogPosition {
        self.journal.as_ref().map_or(LogPosition(u64::MAX), Journal::durable_position)
    }

    fn publish(&self, effects: &mut Effects) {
        if let Some(slots) = self.slots.get() {
            slots.apply(self.core.store(), effects);
        }
        effects.committed.clear();
        effects.prepared.clear();
    }

    /// A GET_LOCATE key's item slot (publishing its latest committed version first if needed).
    pub fn locate(&self, key: &[u8]) -> Option<u32> {
        self.slots.get().and_then(|slots| slots.locate(self.core.store(), key))
    }

    /// The item slots, once attached.
    pub fn item_slots(&self) -> Option<&Arc<dyn Publisher>> {
        self.slots.get()
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
}

impl Servers {
    #[cfg(test)]
    pub(crate) fn new(cores: Vec<Arc<ServerCore>>) -> Self {
        let journals = cores.iter().map(|_| None).collect();
        Self::build(cores, journals, None)
    }

    fn build(cores: Vec<Arc<ServerCore>>, journals: Vec<Option<Journal>>, secret: Option<Arc<SharedSecret>>) -> Self {
        let served = cores
            .iter()
            .zip(journals)
            .map(|(core, journal)| Served { core: Arc::clone(core), slots: OnceLock::new(), journal })
            .collect();
        let connection_stats = ConnectionStats::default();
        Self { served, cores, router: Router::default(), clock: Instant::now(), secret, connection_stats }
    }

    /// The shared secret clients must prove, if any.
    pub fn secret(&self) -> Option<&Arc<SharedSecret>> {
        self.secret.as_ref()
    }

    /// What the group's front ends' connections hold, and the connections they closed.
    pub fn connection_stats(&self) -> &ConnectionStats {
        &self.connection_stats
    }

    /// Servers with their logs (`None`: a server without a data directory). The logs wake
    /// front ends of the group that hold replies when their watermark moves.
    fn with_journals(
        cores: Vec<Arc<ServerCore>>,
        journals: Vec<Option<Journal>>,
        secret: Option<Arc<SharedSecret>>,
    ) -> Arc<Self> {
        let servers = Arc::new(Self::build(cores, journals, secret));
        for served in &servers.served {
            if let Some(journal) = &served.journal {
                // Weak: the servers own the logs, and a log's callback must not keep them alive.
                let servers = Arc::downgrade(&servers);
                journal.set_wake(move || {
                    if let Some(servers) = servers.upgrade() {
                        servers.router.wake_holding();
                    }
                });
            }
        }
        servers
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
    /// the core checks against it (0 otherwise: nothing reads it), saving a clock read per GET.
    pub fn now_for(&self, request: &Request) -> Now {
        let wall_clock_us = if request.written_timestamp().is_some() { wall_clock_us() } else { 0 };
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

    /// Attaches item slots to server `index` (a fabric front end with GET\* does). Fails if it
    /// has some already.
    pub fn attach_item_slots(&self, index: usize, slots: Arc<dyn Publisher>) -> std::io::Result<()> {
        let served = self.served.get(index).ok_or_else(|| std::io::Error::other("no such server"))?;
        served.slots.set(slots).map_err(|_| std::io::Error::other("a server already has item slots"))
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

/// A running group of servers sharing one TCP poller thread. Dropping it stops them.
#[derive(Debug)]
pub struct ServerGroup {
    addresses: Vec<SocketAddr>,
    servers: Arc<Servers>,
    /// Stopped before the poller: it talks to these servers.
    resolver: Option<Resolver>,
    poller: PollerThread,
}

impl ServerGroup {
    /// Binds every server's listener, then starts the poller thread (with the default
    /// [`ConnectionLimits`]).
    pub fn spawn(configs: &[ServerConfig]) -> std::io::Result<ServerGroup> {
        Self::spawn_with(configs, None, ConnectionLimits::default())
    }

    /// [`ServerGroup::spawn`] for servers whose clients must prove `secret` (the binary port's
    /// authentication step; the fabric front ends of the group check it in their handshake).
    pub fn spawn_with_secret(
        configs: &[ServerConfig],
        secret: Option<Arc<SharedSecret>>,
    ) -> std::io::Result<ServerGroup> {
        Self::spawn_with(configs, secret, ConnectionLimits::default())
    }

    /// As [`ServerGroup::spawn`], holding the TCP connections to `limits`.
    pub fn spawn_limited(configs: &[ServerConfig], limits: ConnectionLimits) -> std::io::Result<ServerGroup> {
        Self::spawn_with(configs, None, limits)
    }

    /// As [`ServerGroup::spawn`], with a shared secret (or none) and connection limits.
    pub fn spawn_with(
        configs: &[ServerConfig],
        secret: Option<Arc<SharedSecret>>,
        limits: ConnectionLimits,
    ) -> std::io::Result<ServerGroup> {
        let cores: Vec<Arc<ServerCore>> =
            configs.iter().map(|config| Arc::new(ServerCore::new(config.gc_grace_ms))).collect();
        let journals = cores.iter().map(|_| None).collect();
        Self::start(configs, cores, journals, secret, limits)
    }
    /// [`ServerGroup::spawn`] with persistence: server `i` keeps its store in `data_dirs[i]`.
    /// Each store is recovered from its directory before any listener is bound (a server that
    /// accepts connections has recovered). Returns each server's recovery report.
    ///
    /// # Errors
    /// A directory that cannot be opened or recovered (in use by another server, unreadable,
    /// a damaged log): nothing was started, and the directories opened are released.
    pub fn spawn_durable(
        configs: &[ServerConfig],
        data_dirs: &[PathBuf],
        durability: &DurabilityConfig,
    ) -> Result<(ServerGroup, Vec<RecoveryReport>), durable::StartError> {
        Self::spawn_durable_with(configs, data_dirs, durability, None, ConnectionLimits::default())
    }

    /// [`ServerGroup::spawn_durable`] with a shared secret (or none) and connection limits.
    ///
    /// # Errors
    /// As [`ServerGroup::spawn_durable`].
    pub fn spawn_durable_with(
        configs: &[ServerConfig],
        data_dirs: &[PathBuf],
        durability: &DurabilityConfig,
        secret: Option<Arc<SharedSecret>>,
        limits: ConnectionLimits,
    ) -> Result<(ServerGroup, Vec<RecoveryReport>), durable::StartError> {
        if data_dirs.len() != configs.len() {
            return Err(durable::StartError::DirectoryCount { servers: configs.len(), directories: data_dirs.len() });
        }
        let cores: Vec<Arc<ServerCore>> =
            configs.iter().map(|config| Arc::new(ServerCore::new(config.gc_grace_ms))).collect();
        // The stores recover in parallel, as separate server processes would.
        let opened: Vec<_> = std::thread::scope(|scope| {
            let opening: Vec<_> = cores
                .iter()
                .zip(data_dirs)
                .map(|(core, dir)| scope.spawn(move || Journal::open(dir, durability, Arc::clone(core))))
                .collect();
            opening.into_iter().map(|thread| thread.join()).collect()
        });
        let mut journals = Vec::with_capacity(configs.len());
        let mut reports = Vec::with_capacity(configs.len());
        for (outcome, dir) in opened.into_iter().zip(data_dirs) {
            let recovery = |cause| durable::StartError::Recovery { dir: dir.clone(), cause };
            let (journal, report) =
                outcome.map_err(|_| durable::StartError::RecoveryPanicked { dir: dir.clone() })?.map_err(recovery)?;
            journals.push(Some(journal));
            reports.push(report);
        }
        let group = Self::start(configs, cores, journals, secret, limits).map_err(durable::StartError::Listen)?;
        Ok((group, reports))
    }

    fn start(
        configs: &[ServerConfig],
        cores: Vec<Arc<ServerCore>>,
        journals: Vec<Option<Journal>>,
        secret: Option<Arc<SharedSecret>>,
        limits: ConnectionLimits,
    ) -> std::io::Result<ServerGroup> {
        let listen: Vec<SocketAddr> = configs.iter().map(|config| config.listen).collect();
        let (medium, addresses) =
            TcpServer::bind_capped(&listen, limits.connections_max, limits.connections_per_address_max)?;
        let servers = Servers::with_journals(cores, journals, secret);
        let poller = PollerThread::spawn_limited("rampkv-server", medium, Arc::clone(&servers), limits)?;
        Ok(ServerGroup { addresses, servers, resolver: None, poller })
    }

    /// Starts cooperative termination for these servers, which are servers
    /// `first_index..first_index + count` of `cluster`: transactions prepared longer than
    /// `timeout_ms` ago and not committed are resolved with the other participants. From now on
    /// each server also refuses requests for keys outside its partitions and HELLOs from
    /// clients whose cluster file differs (`ServerCore::join_cluster`).
    pub fn start_recovery(&mut self, cluster: Cluster, first_index: usize, timeout_ms: u64) -> std::io::Result<()> {
        if first_index + self.servers.served.len() > cluster.servers().len() {
            return Err(std::io::Error::other("these servers are not all in the cluster"));
        }
        for (offset, core) in self.servers.cores().iter().enumerate() {
            if !core.join_cluster(cluster.clone(), first_index + offset) {
                return Err(std::io::Error::other("a server was given its cluster twice"));
            }
        }
        self.resolver = Some(spawn_resolver(Arc::clone(&self.servers), first_index, cluster, timeout_ms)?);
        Ok(())
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
        self.resolver = None;
        self.poller.stop()
    }

    /// Blocks until the poller thread ends (it ends only on an I/O error of the poller).
    pub fn wait(mut self) -> std::io::Result<()> {
        self.poller.join()
    }
}
