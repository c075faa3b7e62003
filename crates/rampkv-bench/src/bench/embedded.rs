//! The embedded cluster a benchmark starts when no `--cluster` file is given: server groups
//! on loopback, a front end for each (so every transport reaches the same stores), and the
//! log counters of their servers.
//!
//! # Contract
//! [`start_embedded_cluster`] returns only once every server listens, recovered its data
//! directory (`--data-dir`) if it has one and runs cooperative termination, and every front
//! end is up: the run's first transaction finds the cluster serving. What it returns is the
//! cluster's lifetime: dropping the front ends and groups stops it.

use std::net::SocketAddr;
use std::time::Duration;

use super::config::{sessions_of_thread, BenchConfig, BenchError, TransportKind};
use rampkv_core::cluster::{Cluster, Front};
use rampkv_durable::RecoveryReport;
use rampkv_net::recovery::{StartRecovery, RECOVERY_TIMEOUT_MS};
use rampkv_net::server::durable::cluster_data_dirs;
use rampkv_net::server::front::FrontEnd;
use rampkv_net::server::{Durability, ReplicationOptions, Served, ServerConfig, ServerGroup, ServerOptions};

/// The embedded cluster: TCP server groups, and a write-poll front end for each group that
/// serves the same cores (so both transports reach the same stores).
pub(super) type Embedded = (Cluster, Vec<ServerGroup>, Vec<FrontEnd>, Vec<RecoveryReport>);

pub(super) fn start_embedded_cluster(config: &BenchConfig) -> Result<Embedded, BenchError> {
    let localhost: SocketAddr = "127.0.0.1:0".parse().expect("valid address");
    let mut groups = Vec::with_capacity(config.server_threads);
    let mut addresses = Vec::with_capacity(config.servers);
    let mut reports = Vec::new();
    let data_dirs = match &config.persistence {
        Some(persistence) => {
            cluster_data_dirs(&persistence.data_dir, config.servers).map_err(BenchError::Persistence)?
        }
        None => Vec::new(),
    };
    for thread in 0..config.server_threads {
        let servers = sessions_of_thread(config.servers, config.server_threads, thread);
        let configs = vec![ServerConfig { listen: localhost, gc_grace_ms: config.gc_grace_ms }; servers.len()];
        let durability = config
            .persistence
            .as_ref()
            .map(|persistence| Durability { dirs: data_dirs[servers].to_vec(), config: persistence.durability });
        let medium = config.replication_medium;
        let replication =
            (config.replicas != 1).then(|| ReplicationOptions { medium, ..ReplicationOptions::new(config.replicas) });
        let options = ServerOptions { durability, replication, ..ServerOptions::default() };
        let (group, recovered) = ServerGroup::start(&configs, &options).map_err(BenchError::Persistence)?;
        reports.extend(recovered);
        addresses.extend(group.addresses().iter().map(SocketAddr::to_string));
        groups.push(group);
    }
    let cluster = Cluster::with_servers(addresses)?.with_replicas(config.replicas)?;
    let mut first_index = 0;
    for group in &mut groups {
        group.start_recovery(cluster.clone(), first_index, RECOVERY_TIMEOUT_MS).map_err(BenchError::Cluster)?;
        first_index += group.addresses().len();
    }
    // Every embedded group gets a front end (the ring one unless the transport is RF-RPC).
    let front = config.transport.front().unwrap_or(Front::Ring);
    let item_slots = (config.transport == TransportKind::OneSided).then_some(config.item_slots);
    let fronts = groups
        .iter()
        .map(|group| FrontEnd::spawn(group, front, localhost, item_slots))
        .collect::<Result<_, _>>()
        .map_err(BenchError::Cluster)?;
    Ok((cluster, groups, fronts, reports))
}

/// The control addresses of the embedded cluster's front ends, in server order.
pub(super) fn embedded_control_addresses(fronts: &[FrontEnd]) -> Vec<String> {
    fronts.iter().flat_map(|front| front.control_addresses().iter().map(SocketAddr::to_string)).collect()
}

/// The log counters of every embedded server, summed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LogTotals {
    records: u64,
    groups: u64,
    fsyncs: u64,
    snapshots: u64,
    segments_recycled: u64,
}

/// What the logs did over a window.
pub(super) struct LogWindow {
    pub(super) records_per_s: f64,
    pub(super) fsyncs_per_s: f64,
    pub(super) mean_group_records: f64,
    pub(super) records_per_fsync: f64,
    pub(super) snapshots_written: u64,
    pub(super) segments_recycled: u64,
}

impl LogTotals {
    pub(super) fn difference(&self, before: &LogTotals, window: Duration) -> LogWindow {
        let seconds = window.as_secs_f64().max(f64::MIN_POSITIVE);
        let (records, groups) = (self.records - before.records, self.groups - before.groups);
        let fsyncs = self.fsyncs - before.fsyncs;
        LogWindow {
            records_per_s: records as f64 / seconds,
            fsyncs_per_s: fsyncs as f64 / seconds,
            mean_group_records: if groups == 0 { 0.0 } else { records as f64 / groups as f64 },
            records_per_fsync: if fsyncs == 0 { 0.0 } else { records as f64 / fsyncs as f64 },
            snapshots_written: self.snapshots - before.snapshots,
            segments_recycled: self.segments_recycled - before.segments_recycled,
        }
    }
}

pub(super) fn log_stats(groups: &[ServerGroup]) -> LogTotals {
    let journals = groups.iter().flat_map(|group| group.servers().served().iter().filter_map(Served::journal));
    journals.map(|journal| journal.stats()).fold(LogTotals::default(), |sum, stats| LogTotals {
        records: sum.records + stats.log.records,
        groups: sum.groups + stats.log.groups,
        fsyncs: sum.fsyncs + stats.log.fsyncs,
        snapshots: sum.snapshots + stats.snapshots_written,
        segments_recycled: sum.segments_recycled + stats.log.segments_recycled,
    })
}
