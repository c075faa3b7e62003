//! The evidence probe: after a checked run's workload, a short run of the same protocol,
//! transport, cluster and clients under contention, checked on its own, so that a workload too
//! quiet to race still gets a verdict with teeth (docs/history.md, "Evidence and verdict").
//!
//! # Contract
//! The probe stops once its history shows [`PROBE_RACES_TARGET`] races or after
//! [`PROBE_SECONDS_MAX`], whichever comes first; the races are counted on the history so far,
//! a lower bound, so it never stops early. Its verdict is the check of its whole history with
//! the workload's writes (whose versions its reads may return), on the run's clock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client_thread::{join_client_threads, spawn_client_threads, Endpoints, Shared};
use super::config::{BenchConfig, BenchError, ConfigError, StopAfter};
use super::embedded::{embedded_control_addresses, start_embedded_cluster};
use super::workload::Workload;
use crate::checker;
use crate::history::{HistoryFeed, Record};
use crate::limits::{
    PROBE_CHECK_INTERVAL_MS, PROBE_KEYS, PROBE_RACES_TARGET, PROBE_READ_RATIO, PROBE_SECONDS_MAX, PROBE_TXN_SIZE,
};

/// Runs only the evidence probe of `config`, on an embedded cluster of its own (`rampkv
/// figures --check` runs one per protocol and transport rather than one per point).
pub fn probe_alone(config: &BenchConfig) -> Result<ProbeResult, BenchError> {
    config.validate()?;
    if config.cluster_file.is_some() {
        let why = "alone starts its own cluster: not with --cluster";
        return Err(ConfigError::NotTogether { what: "the probe", why }.into());
    }
    let (cluster, embedded, fronts, _) = start_embedded_cluster(config)?;
    let local_servers = embedded.iter().map(|group| Arc::clone(group.servers())).collect();
    let endpoints = Endpoints { cluster, control_addresses: embedded_control_addresses(&fronts), local_servers };
    let result = run_probe(config, &endpoints, Instant::now(), Vec::new());
    drop(fronts);
    drop(embedded);
    result
}

/// What the evidence probe ran and found (`bench --check` unless `--no-probe`; see
/// [`run_probe`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeResult {
    pub keys: u64,
    pub read_ratio: f64,
    pub txn_size: usize,
    pub elapsed_s: f64,
    pub transactions: u64,
    /// Reads that ran a round 2.
    pub reads_with_round2: u64,
    pub failed_transactions: u64,
    /// Why it stopped: enough races, or its time cap.
    pub stopped: ProbeStop,
    /// The check of its history (with the workload's writes, whose versions it may read).
    pub check: checker::Report,
}

/// Why the evidence probe stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStop {
    /// Its history so far showed [`PROBE_RACES_TARGET`] races.
    RacesTarget,
    /// [`PROBE_SECONDS_MAX`] passed first.
    TimeCap,
}

impl BenchConfig {
    /// The evidence probe's configuration: this run's protocol, transport, cluster, clients,
    /// client threads, network model, value size and seed, with the micro-benchmark on a small
    /// uniform key space ([`PROBE_KEYS`]), [`PROBE_TXN_SIZE`] keys per transaction, half reads,
    /// for at most [`PROBE_SECONDS_MAX`].
    pub fn probe_config(&self) -> BenchConfig {
        BenchConfig {
            txn_size: PROBE_TXN_SIZE,
            keys: PROBE_KEYS,
            read_ratio: PROBE_READ_RATIO,
            workload: Workload::Micro { zipfian: false },
            preload: false,
            stop_after: StopAfter::Duration { seconds: PROBE_SECONDS_MAX },
            seed: self.seed ^ PROBE_SEED_SALT,
            history: None,
            check: true,
            probe: false,
            ..self.clone()
        }
    }
}

/// Mixed into the run's seed for the probe's transaction stream.
const PROBE_SEED_SALT: u64 = 0x7072_6F62_6521_2121; // "probe!!!"

/// Runs the evidence probe against `endpoints` (the servers the workload ran on) until its
/// history shows [`PROBE_RACES_TARGET`] races or [`PROBE_SECONDS_MAX`] pass, and checks that
/// history together with `earlier_writes` (the workload's writes, whose versions its reads may
/// return). Records use the run's clock (`clock_origin`), so the two histories' times compare.
///
/// The races are counted on the history so far every [`PROBE_CHECK_INTERVAL_MS`]: a read whose
/// write has not been handed over yet cannot show as a race then, so the count is a lower
/// bound and the probe never stops early. Its verdict comes from the check of the whole history
/// once every client thread has finished.
pub(super) fn run_probe(
    config: &BenchConfig,
    endpoints: &Endpoints,
    clock_origin: Instant,
    earlier_writes: Vec<Record>,
) -> Result<ProbeResult, BenchError> {
    let probe = config.probe_config();
    probe.validate()?;
    let shared = Arc::new(Shared { clock_origin, started: AtomicU64::new(0), stop: AtomicBool::new(false) });
    let (feed, receiver) = HistoryFeed::in_memory();
    let threads = spawn_client_threads(&probe, endpoints, &shared, true, |_| Some(feed.clone()))?;
    drop(feed); // the channel closes when the last client thread ends
    let interval = Duration::from_millis(PROBE_CHECK_INTERVAL_MS);
    let mut records = earlier_writes;
    let probe_start = records.len();
    let mut stopped = ProbeStop::TimeCap;
    let mut next_count = Instant::now() + interval;
    loop {
        match receiver.recv_timeout(next_count.saturating_duration_since(Instant::now())) {
            Ok(batch) => records.extend(batch),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if stopped == ProbeStop::TimeCap && Instant::now() >= next_count {
            // The probe's records alone: reads of the workload's versions show as garbage
            // here and are ignored; only the race count matters until the final check.
            let races = checker::check(&records[probe_start..]).evidence.round1_fractured_reads;
            if races >= PROBE_RACES_TARGET {
                shared.stop.store(true, Ordering::Release);
                stopped = ProbeStop::RacesTarget;
            }
            next_count = Instant::now() + interval;
        }
    }
    let (totals, first_error) = join_client_threads(threads, &shared);
    if let Some(error) = first_error {
        return Err(error);
    }
    let elapsed = totals.window.map_or(Duration::ZERO, |(start, end)| end - start);
    Ok(ProbeResult {
        keys: probe.keys,
        read_ratio: probe.read_ratio,
        txn_size: probe.txn_size,
        elapsed_s: elapsed.as_secs_f64(),
        transactions: totals.reads + totals.writes,
        reads_with_round2: totals.reads_with_round2,
        failed_transactions: totals.failed,
        stopped,
        check: checker::check(&records),
    })
}
