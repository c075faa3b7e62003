//! What every front end of a server group shares ([`Servers`]) and one server as they all see
//! it ([`Served`]): the cores, their item slots (GET\*), logs and replication links, the
//! group's clock, the router of deferred replies, the connection counters and, with failover,
//! the lease gate and the current routes. Public as `server::Servers` and `server::Served`
//! (see the `server` module docs).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rampkv_core::protocol::server::{Effects, LogPosition, Now, Reply, ServerCore};
use rampkv_core::protocol::ConnectionId;
use rampkv_core::types::{wall_clock_us, Timestamp};
use rampkv_core::wire::Request;
use rampkv_durable::DurableError;

use super::connections::ConnectionStats;
use super::durable::Journal;
use super::lease::LeaseGate;
use super::replication::{BackupTakeover, ReplicationStats, Replicator};
use super::router::Router;
use crate::auth::SharedSecret;
use crate::item_slots::Publisher;

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
    pub(super) fn records_kept(&self) -> bool {
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
    pub(super) served: Vec<Served>,
    cores: Vec<Arc<ServerCore>>,
    router: Router,
    pub(super) clock: Instant,
    /// The cluster's shared secret: clients of the binary port and of the fabric control
    /// ports must prove it (None: nobody needs to).
    secret: Option<Arc<SharedSecret>>,
    connection_stats: ConnectionStats,
    /// With failover: the data address serving each server's cluster-file partitions now
    /// (`None`: the cluster file's addresses).
    routes: parking_lot::RwLock<Option<Vec<String>>>,
    /// With failover: the lease gate of the group's one server, whose serving lease its item
    /// region's lease word follows (unset: the word says no lease is needed).
    pub(super) lease_gate: OnceLock<Arc<LeaseGate>>,
    /// With replication: the servers' replication ports, whose copies may fail to be kept on
    /// disk ([`Servers::persistence_failure`]).
    pub(super) backup_ports: OnceLock<Vec<BackupTakeover>>,
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
    pub(super) fn with_journals(
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
