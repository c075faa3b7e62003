//! Failover (issue 16, phase 4): a replicated server process driven by the configuration
//! service (`rampkv_config::node::ConfigNode`).
//!
//! # Contract
//! - **Leases gate the data path.** A server serves a key only while its configuration node
//!   says it holds a valid lease as the primary of the key's partition ([`LeaseGate`], set on
//!   the core before anything listens): a deposed primary (its lease lapsed, or the newest
//!   configuration it learned names another primary) refuses every read and write of the
//!   partition with `NotPrimary`, and so does a restarted process, which is a new incarnation
//!   holding no data. What the lease protocol promises (one lease-holding primary per partition
//!   at a time) is the configuration service's (docs/replication.md).
//! - **Promotion.** When a committed configuration names this server the primary of partitions
//!   whose data is not in its store (their primary in the previous configuration it applied,
//!   another server, failed), the [`Failover`] thread takes over its backup copy of that
//!   server's store: it fences the old primary first (its
//!   replication stream stops before its next record, and hellos of an older epoch are refused),
//!   then copies every version, every prepared (in-doubt) transaction and every remembered abort
//!   into its own store, and republishes the item slots. Only then does the gate let the
//!   partitions be served. The copy is complete: a backup acknowledges a record only once it
//!   applied it, and a primary acknowledges a write only once every backup did. In-doubt
//!   transactions are resolved by the resolver's cooperative termination (now with this server
//!   as the participant for the adopted partitions).
//! - **Backups that failed stop holding writes.** A backup the configuration removed from every
//!   replica set of this primary is no longer waited for (`Replicator::retain_backups`).
//! - **Rejoin.** A server the configuration names catching up for partitions this server is
//!   primary of gets a catch-up link (`Replicator::add_catch_up`: a snapshot of the store, then
//!   the records since), opened after every copy this server adopted is in its store; once the
//!   link is in sync (the backup holds every acknowledged record and no reply goes out without
//!   it) this server reports it caught up for those partitions (`ConfigNode::report_backup_caught_up`)
//!   and the configuration makes it an in-sync backup: f + 1 copies again. A restarted process
//!   serves nothing until then; it may be promoted later like any in-sync backup.
//! - **Routes.** The data address serving each server's cluster-file partitions now
//!   ([`routes`]) is what the resolver connects to and what clients connect to.
//!
//! # Not promised
//! A server deposed while alive (its lease lapsed under load) that becomes primary again of a
//! partition adopts its successor's copy over what its store still holds of the partition:
//! versions are merged by timestamp, so nothing acknowledged is lost, but transactions it held
//! prepared may be resolved again by cooperative termination. The copy to take over is the
//! one of the partition's primary in the last configuration this thread applied (configurations
//! are applied newest first: one skipped in between would name an older primary).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rampkv_config::auth::PortAuthenticator;
use rampkv_config::configuration::{Configuration, ServerId, BOOTSTRAP_INCARNATION};
use rampkv_config::core::StartMode;
use rampkv_config::error::ConfigError;
use rampkv_config::limits::CONFIG_LOG_ENTRIES_KEPT_MAX;
use rampkv_config::node::{ConfigNode, NodeSettings};
use rampkv_config::timing::{Clock, Timing};
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{FAILOVER_CONFIG_ASK_TIMEOUT_MS, FAILOVER_REJOIN_POLL_MS, REPLICATION_CATCH_UP_RETRY_MS};
use rampkv_core::protocol::server::PartitionGate;

use super::replication::BackupTakeover;
use super::Servers;
use crate::auth::{ConfigPortAuth, SharedSecret};

/// The partitions a server may serve now: those its configuration node says it holds a valid
/// lease for, whose data it has (its own, or an adopted copy whose takeover finished).
pub struct LeaseGate {
    node: Arc<ConfigNode>,
    /// The cluster-file owner of every partition.
    owners: Vec<u16>,
    /// Per partition: its data is in this server's store (its own from the start, or adopted).
    ready: Vec<AtomicBool>,
}

impl std::fmt::Debug for LeaseGate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LeaseGate").field("owners", &self.owners.len()).finish()
    }
}

impl LeaseGate {
    /// The gate of server `me` of `cluster`, over its configuration node. `holds_own`: its
    /// store holds its cluster-file partitions (it started with the cluster; a restarted
    /// process holds nothing).
    pub fn new(node: Arc<ConfigNode>, cluster: &Cluster, me: usize, holds_own: bool) -> LeaseGate {
        let owners: Vec<u16> = (0..cluster.partition_count())
            .map(|partition| cluster.owner_of_partition(partition).map_or(u16::MAX, |owner| owner as u16))
            .collect();
        let ready = owners.iter().map(|owner| AtomicBool::new(holds_own && usize::from(*owner) == me)).collect();
        LeaseGate { node, owners, ready }
    }

    /// The configuration node behind the gate.
    pub fn node(&self) -> &Arc<ConfigNode> {
        &self.node
    }
}

/// How a bootstrapping server's wait for its first lease ended ([`LeaseGate::wait_for_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstLease {
    /// It holds a lease for every partition its cluster file gives it.
    Held,
    /// The cluster failed it over before it got one (it started too late): it serves nothing,
    /// as a restarted server.
    FailedOver,
    /// Neither within the timeout (no majority of the servers is up).
    TimedOut,
}

impl LeaseGate {
    /// Waits until this server holds a lease for every partition its cluster file gives it
    /// (the configuration service elected a leader and granted it), or the configuration names
    /// another primary for one of them, or `timeout` passes.
    pub fn wait_for_lease(&self, me: usize, timeout: Duration) -> FirstLease {
        let deadline = std::time::Instant::now() + timeout;
        let own: Vec<u32> =
            (0..self.owners.len() as u32).filter(|p| usize::from(self.owners[*p as usize]) == me).collect();
        while std::time::Instant::now() < deadline {
            if own.iter().all(|partition| self.serves(*partition)) {
                return FirstLease::Held;
            }
            let configuration = self.node.configuration();
            if own.iter().any(|partition| configuration.primary_of(*partition) != Some(me as ServerId)) {
                return FirstLease::FailedOver;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        FirstLease::TimedOut
    }
}

impl PartitionGate for LeaseGate {
    fn serves(&self, partition: u32) -> bool {
        let ready = self.ready.get(partition as usize).is_some_and(|ready| ready.load(Ordering::Acquire));
        ready && self.node.lease_valid(partition)
    }
}

/// The subdirectory of a server's data directory where its configuration node keeps its Raft
/// state (`rampkv_config::disk`).
pub const CONFIG_STATE_DIR: &str = "config";

/// Starts server `me`'s configuration node on its cluster-file `config` address: it bootstraps
/// the cluster when no other node has committed anything yet, and otherwise rejoins it as a
/// new incarnation (a restarted process: it holds no data and is primary of nothing). With the
/// cluster's shared `secret`, every connection of its config port proves it (docs/security.md).
///
/// With the server's `data_dir`, the node keeps its Raft state in `data_dir/config` and
/// restarts from it when it holds some (`StartMode::Restart` for the node: it keeps its term,
/// vote and log, and the configuration it had). The mode returned is the *server's*, decided
/// as without it (Bootstrap: it holds its store; Rejoin: a new incarnation holding nothing):
/// the Raft state says nothing of whether this process's store is the one the configuration
/// counts on (docs/replication.md, "Raft state on disk", what remains).
///
/// # Errors
/// A cluster file the configuration refuses (no `config` addresses, ...), a port that cannot
/// be bound, or Raft state that cannot be read (locked by another process, damaged, of another
/// cluster).
pub fn start_config_node(
    cluster: &Cluster,
    me: usize,
    secret: Option<Arc<SharedSecret>>,
    data_dir: Option<&Path>,
) -> Result<(Arc<LeaseGate>, StartMode), ConfigError> {
    let initial = Configuration::initial(cluster)?;
    let id = me as ServerId;
    let authenticator: Option<Arc<dyn PortAuthenticator>> =
        secret.map(|secret| Arc::new(ConfigPortAuth(secret)) as Arc<dyn PortAuthenticator>);
    let ask_timeout = Duration::from_millis(FAILOVER_CONFIG_ASK_TIMEOUT_MS);
    let mode = rampkv_config::client::start_mode(&initial, id, ask_timeout, authenticator.as_deref());
    let incarnation = match mode {
        StartMode::Bootstrap => BOOTSTRAP_INCARNATION,
        StartMode::Rejoin | StartMode::Restart => random_incarnation(),
    };
    let node = ConfigNode::start(NodeSettings {
        me: id,
        initial,
        mode,
        incarnation,
        timing: Timing::default(),
        clock: Arc::new(HostClock),
        listener: None,
        log_entries_kept: CONFIG_LOG_ENTRIES_KEPT_MAX,
        authenticator,
        state_dir: data_dir.map(|dir| dir.join(CONFIG_STATE_DIR)),
    })?;
    let holds_own = mode == StartMode::Bootstrap;
    Ok((Arc::new(LeaseGate::new(Arc::new(node), cluster, me, holds_own)), mode))
}

/// The node's clock: the host's monotonic clock (`rampkv_fabric::clock`), so that the lease
/// end it computes is a time the clients of this host can compare with their own reading (the
/// lease word of the item region, GET\*).
#[derive(Debug)]
struct HostClock;

impl Clock for HostClock {
    fn now_ns(&self) -> u64 {
        rampkv_fabric::clock::monotonic_ns()
    }
}

/// A random non-zero incarnation.
fn random_incarnation() -> u64 {
    super::random_id()
}

/// The data address serving each server's cluster-file partitions in `configuration` (the
/// primary of the server's first partition; the partitions of one server move together).
///
/// # Errors
/// The partitions that have no primary left (every copy lost).
pub fn routes(configuration: &Configuration, cluster: &Cluster) -> Result<Vec<String>, Vec<u32>> {
    let unavailable = configuration.unavailable_partitions();
    if !unavailable.is_empty() {
        return Err(unavailable);
    }
    let routes = (0..cluster.servers().len())
        .map(|server| {
            cluster
                .partitions_of(server)
                .next()
                .and_then(|partition| configuration.primary_of(partition))
                .and_then(|primary| configuration.server(primary))
                .map_or_else(|| cluster.servers()[server].clone(), |info| info.data_address.clone())
        })
        .collect();
    Ok(routes)
}

/// The thread that applies each new configuration to this server. Stops when dropped.
#[derive(Debug)]
pub struct Failover {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Failover {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Failover {
    /// Starts applying configurations to server `me` of `cluster` (the only server of
    /// `servers`), whose replication port is `backup` (`None`: it holds no backup copies).
    pub(crate) fn spawn(
        gate: Arc<LeaseGate>,
        servers: Arc<Servers>,
        backup: Option<BackupTakeover>,
        cluster: Cluster,
        me: usize,
    ) -> std::io::Result<Failover> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let last_primary = (0..cluster.partition_count())
            .map(|partition| cluster.owner_of_partition(partition).map(|owner| owner as ServerId))
            .collect();
        let replicate_addresses = cluster.replicate_addresses().unwrap_or_default();
        let mut agent = Agent {
            gate,
            servers,
            backup,
            cluster,
            me,
            last_primary,
            replicate_addresses,
            applied: None,
            adopted_in: 0,
            catch_up_opened: HashMap::new(),
            reported: HashSet::new(),
        };
        let thread = std::thread::Builder::new().name("rampkv-failover".into()).spawn(move || {
            let mut epoch = 0;
            while !thread_stop.load(Ordering::Acquire) {
                let wait = Duration::from_millis(FAILOVER_REJOIN_POLL_MS);
                if let Some(configuration) = agent.gate.node.wait_for_epoch(epoch + 1, wait) {
                    epoch = configuration.epoch();
                    agent.apply(&configuration);
                    agent.applied = Some(configuration);
                }
                agent.tend_catch_ups();
            }
        })?;
        Ok(Failover { stop, thread: Some(thread) })
    }
}

struct Agent {
    gate: Arc<LeaseGate>,
    servers: Arc<Servers>,
    backup: Option<BackupTakeover>,
    cluster: Cluster,
    me: usize,
    /// Per partition: its primary in the last configuration applied (whose copy holds it).
    last_primary: Vec<Option<ServerId>>,
    /// Every server's replication port (the cluster file's `replicate`).
    replicate_addresses: Vec<String>,
    /// The last configuration applied.
    applied: Option<Arc<Configuration>>,
    /// The epoch of the last configuration in which this server adopted a copy: catch-up links
    /// opened before it lack what it adopted.
    adopted_in: u64,
    /// When the last catch-up link to each (backup, incarnation) was opened.
    catch_up_opened: HashMap<(usize, u64), Instant>,
    /// (backup, incarnation, partition) reported caught up in the last configuration applied.
    reported: HashSet<(usize, u64, u32)>,
}

impl Agent {
    fn apply(&mut self, configuration: &Configuration) {
        let me = self.me as ServerId;
        let epoch = configuration.epoch();
        let replicator = self.servers.served()[0].replicator();
        // A configuration that names this server with another incarnation (a restarted process
        // catching up on the epochs it missed) speaks of the process that died: this one is
        // the primary of nothing in it, and must neither take over copies (that would fence
        // the catch-up stream of the current primary) nor mark partitions ready.
        let admitted = configuration.is_admitted(me, self.gate.node.incarnation());
        let is_mine = |primary: Option<ServerId>| admitted && primary == Some(me);
        let primary_of_any = configuration.replica_sets().iter().any(|set| is_mine(set.primary));
        if let (Some(replicator), true) = (replicator, primary_of_any) {
            replicator.set_epoch(epoch);
        }
        let mut adopted: HashMap<ServerId, (usize, u128)> = HashMap::new();
        let mut deposed = false;
        for partition in 0..configuration.partition_count() {
            let Some(ready) = self.gate.ready.get(partition as usize) else { continue };
            if !is_mine(configuration.primary_of(partition)) {
                // Deposed, or never primary: what its store holds of the partition may be old.
                deposed |= ready.swap(false, Ordering::AcqRel);
                continue;
            }
            if ready.load(Ordering::Acquire) {
                continue;
            }
            // Its data is in the copy of its previous primary, which failed.
            if let Some(source) = self.last_primary[partition as usize].filter(|source| *source != me) {
                if let std::collections::hash_map::Entry::Vacant(entry) = adopted.entry(source) {
                    let started = Instant::now();
                    let copy = self.backup.as_ref().and_then(|backup| backup.take_over(source, epoch));
                    let keys = match &copy {
                        Some(copy) => self.servers.served()[0].adopt(copy.store(), self.servers.now_ms()),
                        None => 0, // it never streamed here: it acknowledged no write
                    };
                    entry.insert((keys, started.elapsed().as_millis()));
                    self.adopted_in = epoch;
                }
            }
            ready.store(true, Ordering::Release);
        }
        if deposed {
            // Its slots hold versions of partitions it no longer serves: a client must not
            // read them if this server's lease word is ever in the future again (primary of
            // another partition later). Its lease word already says unleased (the node learned
            // this configuration first); keys it still serves are published again on demand.
            if let Some(slots) = self.servers.served()[0].item_slots() {
                slots.invalidate_all();
            }
        }
        for (source, (keys, took_ms)) in adopted {
            log::warn!(
                "failover: server {me} took over server {source}'s copy in epoch {epoch} ({keys} keys, {took_ms} ms)"
            );
        }
        for (partition, primary) in self.last_primary.iter_mut().enumerate() {
            *primary = configuration.primary_of(partition as u32);
        }
        // Only while this server is still a primary: a deposed one keeps waiting for its
        // backups (a reply it holds must not go out unless the record is on the copy its
        // successor took over; the successor fenced it, so it never will).
        let incarnation = |server: ServerId| configuration.server(server).map_or(0, |info| info.incarnation);
        let keep: Vec<(usize, u64)> = configuration
            .replica_sets()
            .iter()
            .filter(|set| is_mine(set.primary))
            .flat_map(|set| set.backups.iter().chain(&set.catching_up))
            .map(|server| (usize::from(*server), incarnation(*server)))
            .collect();
        if let (Some(replicator), true) = (replicator, primary_of_any) {
            replicator.retain_backups(&keep);
        }
        self.reported.clear();
        if let Ok(routes) = routes(configuration, &self.cluster) {
            self.servers.set_routes(routes);
        }
    }

    /// Opens a catch-up link to every server catching up partitions of this primary that has
    /// none (or only one opened before this server's last adoption), and reports those whose
    /// link is in sync.
    fn tend_catch_ups(&mut self) {
        let Some(configuration) = self.applied.clone() else { return };
        let Some(replicator) = self.servers.served()[0].replicator() else { return };
        let me = self.me as ServerId;
        if !configuration.is_admitted(me, self.gate.node.incarnation()) {
            return; // an earlier process of this server was the primary, not this one
        }
        let mut catching_up: Vec<(ServerId, u32)> = Vec::new();
        for (partition, set) in configuration.replica_sets().iter().enumerate() {
            if set.primary == Some(me) {
                catching_up.extend(set.catching_up.iter().map(|server| (*server, partition as u32)));
            }
        }
        for (server, partition) in catching_up {
            let incarnation = configuration.server(server).map_or(0, |info| info.incarnation);
            let backup = usize::from(server);
            if replicator.in_sync(backup, incarnation, self.adopted_in) {
                if self.reported.insert((backup, incarnation, partition)) {
                    log::warn!("rejoin: server {server} caught up partition {partition} from server {me}");
                    self.gate.node.report_backup_caught_up(partition, server, incarnation);
                }
                continue;
            }
            if replicator.has_catch_up_link(backup, incarnation, self.adopted_in) {
                continue;
            }
            let retry = Duration::from_millis(REPLICATION_CATCH_UP_RETRY_MS);
            if self.catch_up_opened.get(&(backup, incarnation)).is_some_and(|opened| opened.elapsed() < retry) {
                continue;
            }
            let Some(address) = self.replicate_addresses.get(backup) else { continue };
            self.catch_up_opened.insert((backup, incarnation), Instant::now());
            match replicator.add_catch_up(backup, address.clone(), incarnation) {
                Ok(()) => log::warn!("rejoin: server {me} opened a catch-up link to server {server} ({address})"),
                Err(error) => log::error!("rejoin: cannot open a catch-up link to server {server}: {error}"),
            }
        }
    }
}
