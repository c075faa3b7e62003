//! The closed-loop benchmark: logical clients run read-only and write-only transactions
//! back to back against an embedded local cluster (default) or an external one.
//!
//! Logical clients are multiplexed over a few client threads (a [`Driver`] per thread), so a
//! 2-core machine can run many clients without a thread each. Every value written is a
//! check-mode value (it starts with the writer's timestamp, see [`crate::history`]), so any
//! run can record a history and be checked for read atomicity at the end.
//!
//! # Layout (bottom up: a room names only rooms above it in this list)
//! - `workload`: what the clients run ([`Workload`]: the micro-benchmark or a YCSB workload).
//! - `config`: [`BenchConfig`], its validation, the network model's settings, the errors.
//! - `txn_source`: one client thread's transaction generator from the configuration, and the
//!   item slot size that fits the run's largest version.
//! - `embedded`: the embedded cluster and its servers' log counters.
//! - `client_thread`: the client threads, their sessions and what they measure.
//! - `probe`: the evidence probe ([`probe_alone`], and after a checked run).
//! - `report`: the result ([`BenchResult`]) and how it prints.
//! - this file: [`run`]: start, load, run the client threads, check, probe, report.
//! - [`compare`]: `--compare`, one run per transport and a table.
//!
//! [`Driver`]: rampkv_net::client::Driver

mod client_thread;
pub mod compare;
mod config;
mod embedded;
mod probe;
mod report;
mod txn_source;
mod workload;

pub(crate) use client_thread::check_values;
pub use client_thread::thread_cpu_time;
pub use config::{
    parse_network_duration_us, BenchConfig, BenchError, BenchPersistence, ConfigError, Interleave,
    NetworkDurationError, NetworkModel, StopAfter, TransportKind, BENCH_CLIENTS_MAX, BENCH_KEYS_MAX,
    NETWORK_JITTER_US_DEFAULT,
};
pub use probe::{probe_alone, ProbeResult, ProbeStop};
pub use report::{BenchResult, LatencySummary, MachineInfo, PersistenceSummary, ReplicationSummary, RoundTwoSummary};
pub use workload::{Workload, WorkloadNameError};

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use rampkv_ycsb::Txn;

use crate::checker;
use crate::history::{self, HistoryStream, Record, WriteRecord};
use client_thread::{join_client_threads, spawn_client_threads, Endpoints, Shared};
use embedded::{embedded_control_addresses, log_stats, start_embedded_cluster};
use probe::run_probe;
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_net::server::Servers;
use txn_source::TxnSource;

/// Runs a benchmark to completion.
pub fn run(config: &BenchConfig) -> Result<BenchResult, BenchError> {
    config.validate()?;
    let started = Instant::now();
    let (cluster, embedded, fronts, reports) = match &config.cluster_file {
        Some(path) => (Cluster::from_file(path)?, Vec::new(), Vec::new(), Vec::new()),
        None => start_embedded_cluster(config)?,
    };
    let start_ms = started.elapsed().as_millis() as u64;
    // An external cluster has as many servers as its file lists (--servers is for the embedded
    // one); the result records what ran.
    let external;
    let config = match &config.cluster_file {
        Some(_) => {
            external = BenchConfig { servers: cluster.servers().len(), ..config.clone() };
            &external
        }
        None => config,
    };
    // The one-sided transports reach each server through its front end's control address:
    // an external cluster lists them in its file, an embedded one was just started.
    let control_addresses: Vec<String> = match (&config.cluster_file, config.transport.front()) {
        (Some(_), Some(front)) => cluster.front_addresses(front)?,
        _ => embedded_control_addresses(&fronts),
    };
    let local_servers: Vec<Arc<Servers>> = embedded.iter().map(|group| Arc::clone(group.servers())).collect();
    let endpoints = Endpoints { cluster: cluster.clone(), control_addresses, local_servers };
    let keep_records = config.check;
    // The history streams to its file while the run goes on (a killed run leaves a checkable
    // prefix); with a stream, the records for the check come back from it at the end.
    let stream = config.history.as_ref().map(|path| HistoryStream::start(path, keep_records)).transpose()?;
    let shared =
        Arc::new(Shared { clock_origin: Instant::now(), started: AtomicU64::new(0), stop: AtomicBool::new(false) });
    let mut load_records = load_phase(config, &cluster, &shared)?;
    if let Some(stream) = &stream {
        stream.feed().send(std::mem::take(&mut load_records));
    }
    let run_started = Instant::now();
    let log_before = log_stats(&embedded);
    let threads =
        spawn_client_threads(config, &endpoints, &shared, keep_records, |_| stream.as_ref().map(HistoryStream::feed))?;
    let (mut totals, first_error) = join_client_threads(threads, &shared);
    totals.records.splice(0..0, load_records);
    // Finish the stream even after a failed thread: the file then holds what the run did.
    let streamed = stream.map(HistoryStream::finish).transpose();
    if let Some(error) = first_error {
        return Err(error);
    }
    if let Some(records) = streamed? {
        totals.records = records;
    }
    // The measured window starts once the client threads have connected (connection set-up,
    // such as zeroing message rings, is not transaction time) and ends when the last finishes.
    let log_window = log_stats(&embedded).difference(&log_before, run_started.elapsed());
    let elapsed = totals.window.map_or_else(|| run_started.elapsed(), |(start, end)| end - start);
    let check = keep_records.then(|| checker::check(&totals.records));
    let store_stats = embedded.iter().flat_map(|group| group.cores().iter().map(|core| core.store().stats())).collect();
    let replication =
        embedded.iter().filter_map(|group| group.servers().replication_stats()).reduce(|mut total, more| {
            total.add(&more);
            total
        });
    // The probe runs after every figure of the workload was taken, on the same servers: its
    // reads may return the workload's versions, so the workload's writes join its history.
    // With one client nothing runs concurrently, so nothing could race: no probe.
    let probe = if config.check && config.probe && config.clients > 1 {
        let mut writes = std::mem::take(&mut totals.records);
        writes.retain(|record| matches!(record, Record::Write(_)));
        Some(run_probe(config, &endpoints, shared.clock_origin, writes)?)
    } else {
        None
    };
    drop(fronts);
    drop(embedded);
    let mut result = report::build(config, &totals, elapsed, check, store_stats);
    result.set_probe(probe);
    result.replication = replication.map(|stats| report::ReplicationSummary {
        replicas: config.replicas,
        medium: config.replication_medium.name(),
        records: stats.records,
        acks: stats.acks,
        ack_latency_us_mean: stats.ack_latency_us_mean(),
        ack_latency_us_max: stats.ack_latency_us_max,
        links_failed: stats.links_failed,
        apply_lags: stats.apply_lag.count(),
        apply_lag_us_p50: stats.apply_lag.quantile_us(0.50),
        apply_lag_us_p99: stats.apply_lag.quantile_us(0.99),
        apply_lag_us_p999: stats.apply_lag.quantile_us(0.999),
        apply_lag_us_max: stats.apply_lag_us_max,
    });
    result.persistence = config.persistence.as_ref().map(|persistence| PersistenceSummary {
        policy: persistence.durability.policy.name(),
        start_ms,
        records_replayed: reports.iter().map(|report| report.records_replayed).sum(),
        snapshot_keys_loaded: reports.iter().filter_map(|report| report.snapshot.as_ref()).map(|s| s.counts.keys).sum(),
        cuts: reports.iter().map(|report| report.cuts.len() as u64).sum(),
        records_per_s: log_window.records_per_s,
        fsyncs_per_s: log_window.fsyncs_per_s,
        mean_group_records: log_window.mean_group_records,
        records_per_fsync: log_window.records_per_fsync,
        snapshots_written: log_window.snapshots_written,
        segments_recycled: log_window.segments_recycled,
    });
    Ok(result)
}

/// YCSB's load phase: writes records `0..keys` before the run, so reads find them. Returns the
/// history records of the load (its writes may be read by the run).
/// The load phase before the measured window: YCSB's (every record, in its load order), or
/// with `preload` every micro-benchmark key; in transactions of `txn_size` keys, recorded as
/// writes of the history.
fn load_phase(config: &BenchConfig, cluster: &Cluster, shared: &Shared) -> Result<Vec<Record>, BenchError> {
    let loader = TxnSource::loader(config)?;
    let micro_preload = config.preload && matches!(config.workload, Workload::Micro { .. });
    if loader.is_none() && !micro_preload {
        return Ok(Vec::new());
    }
    let mut client = rampkv_net::client::Client::connect(cluster)?;
    client.set_txn_options(TxnOptions { algorithm: config.algorithm, bloom: config.bloom, mutant_skip_repair: false });
    let mut records = Vec::new();
    let mut load = |keys: Vec<Vec<u8>>| -> Result<(), BenchError> {
        let start_ns = shared.now_ns();
        let ts = client.put_all_with(|ts| check_values(keys.clone(), ts, config.value_size))?;
        let keys = keys.iter().map(|key| history::key_to_history_string(key)).collect();
        records.push(Record::Write(WriteRecord { client: 0, ts, keys, start_ns, end_ns: shared.now_ns(), ok: true }));
        Ok(())
    };
    match loader {
        Some(mut loader) => {
            let mut txn = Txn::new();
            while loader.next_load_txn(&mut txn) {
                load(txn.keys().map(<[u8]>::to_vec).collect())?;
            }
        }
        None => {
            let txn_size = config.txn_size as u64;
            for first in (0..config.keys).step_by(config.txn_size) {
                let chunk = first..(first + txn_size).min(config.keys);
                load(chunk.map(|key| rampkv_ycsb::micro_key(key).as_slice().to_vec()).collect())?;
            }
        }
    }
    Ok(records)
}
