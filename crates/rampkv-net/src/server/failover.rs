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
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rampkv_config::configuration::{Configuration, ServerId};
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{FAILOVER_REJOIN_POLL_MS, REPLICATION_CATCH_UP_RETRY_MS};

pub use super::lease::{FirstLease, LeaseGate, CONFIG_STATE_DIR};
use super::replication::BackupTakeover;
use super::resume::ServerState;
use super::servers::Servers;

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
    /// `state`: what its files hold (per partition, the primary in the last configuration
    /// applied whose data they hold), kept up to date in `state_dir` (its data directory) if
    /// given.
    pub(crate) fn spawn(
        gate: Arc<LeaseGate>,
        servers: Arc<Servers>,
        backup: Option<BackupTakeover>,
        cluster: Cluster,
        me: usize,
        state: (ServerState, Option<PathBuf>),
    ) -> std::io::Result<Failover> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let (state, state_dir) = state;
        let replicate_addresses = cluster.replicate_addresses().unwrap_or_default();
        let mut agent = Agent {
            gate,
            servers,
            backup,
            cluster,
            me,
            last_primary: state.last_primary.clone(),
            state,
            state_dir,
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
    /// What the server's files hold, as last written to `state_dir`.
    state: ServerState,
    /// The server's data directory, where `state` is kept (`None`: no directory).
    state_dir: Option<PathBuf>,
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
        let servers = Arc::clone(&self.servers);
        let replicator = servers.served()[0].replicator();
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
        let mut opening: Vec<u32> = Vec::new();
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
            opening.push(partition);
        }
        // What it adopted is in its files before the state says so and before it is served: a
        // whole-cluster kill from now on finds it there (`resume`), and the records its log
        // takes for those partitions from now on follow it.
        let (in_files, snapshot) = self.snapshot_adopted(&adopted);
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
                "failover: server {me} took over server {source}'s copy in epoch {epoch} ({keys} keys, {took_ms} ms{snapshot})"
            );
        }
        for (partition, primary) in self.last_primary.iter_mut().enumerate() {
            *primary = configuration.primary_of(partition as u32);
        }
        self.keep_state(&opening, in_files);
        for partition in opening {
            self.gate.ready[partition as usize].store(true, Ordering::Release);
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

    /// With a data directory, writes a snapshot of the store (fsynced) once copies were adopted
    /// into it. Returns whether what it adopted is in its files, and what to say of it in the
    /// log line.
    fn snapshot_adopted(&self, adopted: &HashMap<ServerId, (usize, u128)>) -> (bool, String) {
        let Some(journal) = self.servers.served()[0].journal().filter(|_| !adopted.is_empty()) else {
            return (true, String::new());
        };
        let started = Instant::now();
        match journal.snapshot_now() {
            Ok(report) => {
                let (keys, took_ms) = (report.counts.keys, started.elapsed().as_millis());
                (true, format!("; in its files after a snapshot of {keys} keys, {took_ms} ms"))
            }
            Err(error) => {
                log::error!("failover: the snapshot after an adoption failed: {error}");
                (false, String::from("; its snapshot failed"))
            }
        }
    }

    /// Writes what the server's files hold now to its state file (with a data directory):
    /// the configuration's primaries. The partitions it opens now are in its files unless the
    /// snapshot of what it adopted failed (`in_files`): the state then keeps naming the copy
    /// they come from, so that a restart adopts the copy it kept again (`resume`).
    fn keep_state(&mut self, opening: &[u32], in_files: bool) {
        let Some(dir) = &self.state_dir else { return };
        let mut state = ServerState { incarnation: self.state.incarnation, last_primary: self.last_primary.clone() };
        if !in_files {
            for partition in opening {
                let partition = *partition as usize;
                state.last_primary[partition] = self.state.last_primary.get(partition).copied().flatten();
            }
        }
        if state == self.state {
            return;
        }
        match state.write(dir) {
            Ok(()) => self.state = state,
            Err(error) => log::error!("failover: cannot keep the server's state: {error}"),
        }
    }

    /// Opens a catch-up link to every server catching up partitions of this primary that has
    /// none (or only one opened before this server's last adoption), and reports those whose
    /// link is in sync. Also opens one to every in-sync backup whose link failed while the
    /// configuration still counts it (it restarted and resumed its roles with the same
    /// process incarnation, or its connection broke): the failed link holds this primary's
    /// writes until the new one is in sync and retires it (nothing to report: the
    /// configuration counts that backup already).
    fn tend_catch_ups(&mut self) {
        let Some(configuration) = self.applied.clone() else { return };
        let servers = Arc::clone(&self.servers);
        let Some(replicator) = servers.served()[0].replicator() else { return };
        let me = self.me as ServerId;
        if !configuration.is_admitted(me, self.gate.node.incarnation()) {
            return; // an earlier process of this server was the primary, not this one
        }
        let mut catching_up: Vec<(ServerId, u32)> = Vec::new();
        let mut in_sync: Vec<ServerId> = Vec::new();
        for (partition, set) in configuration.replica_sets().iter().enumerate() {
            if set.primary == Some(me) {
                catching_up.extend(set.catching_up.iter().map(|server| (*server, partition as u32)));
                in_sync.extend(&set.backups);
            }
        }
        let incarnation = |server: ServerId| configuration.server(server).map_or(0, |info| info.incarnation);
        for (server, partition) in catching_up {
            let (backup, incarnation) = (usize::from(server), incarnation(server));
            if replicator.in_sync(backup, incarnation, self.adopted_in) {
                if self.reported.insert((backup, incarnation, partition)) {
                    log::warn!("rejoin: server {server} caught up partition {partition} from server {me}");
                    self.gate.node.report_backup_caught_up(partition, server, incarnation);
                }
                continue;
            }
            self.open_catch_up(replicator, backup, incarnation, "a catch-up link");
        }
        in_sync.sort_unstable();
        in_sync.dedup();
        for server in in_sync {
            let (backup, incarnation) = (usize::from(server), incarnation(server));
            if !replicator.has_failed_link(backup, incarnation)
                || replicator.in_sync(backup, incarnation, self.adopted_in)
            {
                continue;
            }
            self.open_catch_up(replicator, backup, incarnation, "a link in place of its failed one");
        }
    }

    /// Opens a catch-up link to `backup` (process `incarnation`) unless one is open (since the
    /// last adoption) or was opened less than `REPLICATION_CATCH_UP_RETRY_MS` ago.
    fn open_catch_up(
        &mut self,
        replicator: &super::replication::Replicator,
        backup: usize,
        incarnation: u64,
        what: &str,
    ) {
        if replicator.has_catch_up_link(backup, incarnation, self.adopted_in) {
            return;
        }
        let retry = Duration::from_millis(REPLICATION_CATCH_UP_RETRY_MS);
        if self.catch_up_opened.get(&(backup, incarnation)).is_some_and(|opened| opened.elapsed() < retry) {
            return;
        }
        let Some(address) = self.replicate_addresses.get(backup) else { return };
        self.catch_up_opened.insert((backup, incarnation), Instant::now());
        let me = self.me;
        match replicator.add_catch_up(backup, address.clone(), incarnation) {
            Ok(()) => log::warn!("rejoin: server {me} opened {what} to server {backup} ({address})"),
            Err(error) => log::error!("rejoin: cannot open {what} to server {backup}: {error}"),
        }
    }
}
