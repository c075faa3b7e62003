//! The result of a benchmark run: numbers, configuration, seed, commit and machine.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::client_thread::ThreadTotals;
use super::config::BenchConfig;
use super::probe::{ProbeResult, ProbeStop};
use crate::checker::{Report, Verdict};
use rampkv_core::storage::StoreStats;
use rampkv_net::message::BatchStats;
use rampkv_net::transport::interleave::InterleaveStats;
use rampkv_net::transport::onesided::GetStarStats;

/// Latency percentiles of one transaction type, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_us: f64,
    pub min_us: u64,
    pub p95_us: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl LatencySummary {
    fn from_histogram(histogram: &Histogram<u64>) -> Self {
        Self {
            count: histogram.len(),
            mean_us: histogram.mean(),
            min_us: histogram.min(),
            p95_us: histogram.value_at_quantile(0.95),
            p50_us: histogram.value_at_quantile(0.50),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

/// How often reads needed the RAMP round-2 repair.
#[derive(Debug, Clone, Serialize)]
pub struct RoundTwoSummary {
    /// Reads that fetched at least one key in round 2.
    pub reads_with_round2: u64,
    /// Keys fetched in round 2, over all reads.
    pub round2_keys: u64,
    /// Mean keys fetched in round 2 per read.
    pub round2_keys_per_read: f64,
    /// Round-2 fetches that found none of their candidates (RAMP-Hybrid: Bloom false positives).
    pub round2_found_nothing: u64,
    /// `reads_with_round2 / reads`.
    pub fraction_of_reads: f64,
    /// Reads restarted: a version they needed was collected (RAMP), or lock conflicts (S2PL).
    pub read_restarts: u64,
    /// Mean bytes of metadata stored and sent with each written version (wire encoding).
    pub metadata_bytes_per_item: f64,
}

/// Where the benchmark ran.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    pub cpus: usize,
    pub cpu_model: String,
    pub os: String,
}

impl MachineInfo {
    /// Reads this machine's description (Linux; "unknown" elsewhere).
    pub fn current() -> Self {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split(':').nth(1))
                    .map(|model| model.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let os = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|release| format!("Linux {}", release.trim()))
            .unwrap_or_else(|_| std::env::consts::OS.into());
        Self { cpus: std::thread::available_parallelism().map_or(1, |n| n.get()), cpu_model, os }
    }
}

/// The git commit of the working directory, if it is a git checkout ("unknown" otherwise).
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|commit| commit.trim().to_string())
        .filter(|commit| !commit.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// One benchmark run's result.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub rampkv_version: &'static str,
    pub git_commit: String,
    pub machine: MachineInfo,
    pub protocol: &'static str,
    pub transport: &'static str,
    pub config: BenchConfig,
    pub seed: u64,
    pub elapsed_s: f64,
    pub transactions: u64,
    pub throughput_txn_per_s: f64,
    pub read: LatencySummary,
    pub write: LatencySummary,
    pub round2: RoundTwoSummary,
    /// Client-side overhead: CPU time (user + system) of the client threads per transaction,
    /// in µs, from the OS's per-thread accounting (10 ms ticks). With `inprocess` it includes
    /// the servers' work, which runs on the client threads there. None where the OS does not
    /// say.
    pub client_cpu_us_per_txn: Option<f64>,
    pub failed_transactions: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// The check of the workload's own history (`--check`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<Report>,
    /// The evidence probe run after the workload (`--check` without `--no-probe`): its
    /// settings, what it ran, and the check of its history. Not part of any other figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeResult>,
    /// The run's read-atomicity verdict: the workload's, backed by the probe's
    /// ([`Verdict::with_probe`]); what the exit status says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// What each embedded server's store held at the end (empty for an external cluster).
    pub store: Vec<StoreStats>,
    /// GET\* counters summed over client threads (`onesided` transport only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub getstar: Option<GetStarStats>,
    /// RF-RPC batching counters summed over client threads (`rfrpc` transport only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batching: Option<BatchStats>,
    /// What the network model did: `off`, or its parameters.
    pub network: String,
    /// The network model's counters summed over client threads (when it ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interleave: Option<InterleaveStats>,
    /// What the embedded servers' logs did (`--data-dir` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistenceSummary>,
    /// What the embedded servers' replication did over the whole run (`--replicas` above 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSummary>,
}

/// The embedded servers' synchronous replication over a run (`--replicas N`), summed over
/// primaries: records shipped to every backup, and the time from a call's append to the
/// point a backup holds it (the write cost: over TCP, network both ways and the backup's
/// apply; one-sided, the write into its log region). One-sided, the apply lag: from the
/// write to the primary's receipt of the backup's acknowledgement that it applied it
/// (percentiles are bucket ends, 25% resolution).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicationSummary {
    pub replicas: u32,
    pub medium: &'static str,
    pub records: u64,
    pub acks: u64,
    pub ack_latency_us_mean: f64,
    pub ack_latency_us_max: u64,
    pub links_failed: u64,
    pub apply_lags: u64,
    pub apply_lag_us_p50: u64,
    pub apply_lag_us_p99: u64,
    pub apply_lag_us_p999: u64,
    pub apply_lag_us_max: u64,
}

impl std::fmt::Display for ReplicationSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} copies over {}: {} records shipped to each backup, {} held, append to held {:.0} us mean, {} us \
             max; {} links failed",
            self.replicas,
            self.medium,
            self.records,
            self.acks,
            self.ack_latency_us_mean,
            self.ack_latency_us_max,
            self.links_failed
        )?;
        if self.apply_lags > 0 {
            write!(
                f,
                "; apply lag (write to applied) p50 <= {} us, p99 <= {} us, p99.9 <= {} us, max {} us over {} calls",
                self.apply_lag_us_p50,
                self.apply_lag_us_p99,
                self.apply_lag_us_p999,
                self.apply_lag_us_max,
                self.apply_lags
            )?;
        }
        Ok(())
    }
}

/// The embedded servers' persistence over a run (`--data-dir`), summed over servers.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PersistenceSummary {
    pub policy: &'static str,
    /// Time to start the embedded cluster: recovering every store (in parallel), binding.
    pub start_ms: u64,
    /// Log records replayed at start, and keys loaded from snapshots.
    pub records_replayed: u64,
    pub snapshot_keys_loaded: u64,
    /// Parts of logs cut at start (torn tails).
    pub cuts: u64,
    /// During the measured window: records appended, fsyncs, per second.
    pub records_per_s: f64,
    pub fsyncs_per_s: f64,
    /// Records per group written (one `write` system call each: a front end's pass).
    pub mean_group_records: f64,
    /// Records per fsync: with `always`, the benefit of group commit.
    pub records_per_fsync: f64,
    pub snapshots_written: u64,
    /// Log segments made of recycled ones (covered by a snapshot) rather than new files.
    pub segments_recycled: u64,
}

impl std::fmt::Display for PersistenceSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "appendfsync {}: {:.0} records/s, {:.0} fsyncs/s, {:.1} records per write, {:.1} records per fsync, {} \
             snapshots, {} segments recycled; start {} ms ({} records replayed, {} keys from snapshots, {} cuts)",
            self.policy,
            self.records_per_s,
            self.fsyncs_per_s,
            self.mean_group_records,
            self.records_per_fsync,
            self.snapshots_written,
            self.segments_recycled,
            self.start_ms,
            self.records_replayed,
            self.snapshot_keys_loaded,
            self.cuts
        )
    }
}

impl BenchResult {
    /// Adds the evidence probe's result; the run's verdict is then the workload's backed by
    /// the probe's.
    pub fn set_probe(&mut self, probe: Option<ProbeResult>) {
        self.verdict = match (&self.check, &probe) {
            (Some(check), Some(probe)) => Some(check.verdict().with_probe(probe.check.verdict())),
            (check, _) => check.as_ref().map(Report::verdict),
        };
        self.probe = probe;
    }

    /// One line on how an RF-RPC run batched frames into calls (none for other transports).
    pub fn batching_line(&self) -> Option<String> {
        self.batching.map(|batching| format!("{}: {batching}", self.transport))
    }
}

pub(crate) fn build(
    config: &BenchConfig,
    totals: &ThreadTotals,
    elapsed: Duration,
    check: Option<Report>,
    store: Vec<StoreStats>,
) -> BenchResult {
    let transactions = totals.reads + totals.writes;
    let elapsed_s = elapsed.as_secs_f64();
    BenchResult {
        rampkv_version: env!("CARGO_PKG_VERSION"),
        git_commit: git_commit(),
        machine: MachineInfo::current(),
        protocol: config.algorithm.name(),
        transport: config.transport.name(),
        config: config.clone(),
        seed: config.seed,
        elapsed_s,
        transactions,
        throughput_txn_per_s: transactions as f64 / elapsed_s.max(f64::MIN_POSITIVE),
        read: LatencySummary::from_histogram(&totals.read_latency_us),
        write: LatencySummary::from_histogram(&totals.write_latency_us),
        round2: RoundTwoSummary {
            reads_with_round2: totals.reads_with_round2,
            round2_keys: totals.round2_keys,
            round2_keys_per_read: totals.round2_keys as f64 / (totals.reads.max(1)) as f64,
            round2_found_nothing: totals.round2_found_nothing,
            fraction_of_reads: totals.reads_with_round2 as f64 / (totals.reads.max(1)) as f64,
            read_restarts: totals.read_restarts,
            metadata_bytes_per_item: totals.metadata_bytes as f64 / (totals.written_items.max(1)) as f64,
        },
        client_cpu_us_per_txn: totals
            .client_cpu
            .filter(|_| transactions > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / transactions as f64),
        failed_transactions: totals.failed,
        first_failure: totals.first_failure.clone(),
        verdict: check.as_ref().map(Report::verdict),
        check,
        probe: None,
        store,
        getstar: totals.getstar,
        batching: totals.batching,
        network: config.network.describe(config.cluster_file.is_some()),
        interleave: totals.interleave,
        persistence: None,
        replication: None,
    }
}

impl BenchResult {
    /// The result in YCSB's text format, as YCSB's own client prints it, so that YCSB tooling
    /// reads it. Operations count keys (a transaction of `txn_size` keys is `txn_size` YCSB
    /// operations); latencies are per transaction: `[READ]` are read-only transactions,
    /// `[UPDATE]` write-only ones.
    pub fn ycsb_text(&self) -> String {
        let operations = self.transactions * self.config.txn_size as u64;
        let mut text = format!(
            "[OVERALL], RunTime(ms), {}\n[OVERALL], Throughput(ops/sec), {}\n",
            (self.elapsed_s * 1000.0).round() as u64,
            operations as f64 / self.elapsed_s.max(f64::MIN_POSITIVE)
        );
        for (name, latency) in [("READ", &self.read), ("UPDATE", &self.write)] {
            if latency.count == 0 {
                continue;
            }
            text.push_str(&format!(
                "[{name}], Operations, {}\n[{name}], AverageLatency(us), {}\n[{name}], MinLatency(us), {}\n\
                 [{name}], MaxLatency(us), {}\n[{name}], 95thPercentileLatency(us), {}\n\
                 [{name}], 99thPercentileLatency(us), {}\n[{name}], Return=OK, {}\n",
                latency.count * self.config.txn_size as u64,
                latency.mean_us,
                latency.min_us,
                latency.max_us,
                latency.p95_us,
                latency.p99_us,
                latency.count * self.config.txn_size as u64,
            ));
        }
        if self.failed_transactions > 0 {
            text.push_str(&format!("[FAILED-TXN], Return=ERROR, {}\n", self.failed_transactions));
        }
        text
    }
}

impl fmt::Display for BenchResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.config;
        writeln!(
            f,
            "rampkv bench: {} over {}, workload {}, {} servers, {} clients on {} client threads, {} keys/txn, {:.0}% reads, {} keys, {} B values, seed {}",
            self.protocol,
            self.transport,
            config.workload.name(),
            config.servers,
            config.clients,
            config.client_threads,
            config.txn_size,
            config.read_ratio * 100.0,
            config.keys,
            config.value_size,
            self.seed
        )?;
        writeln!(
            f,
            "  {} transactions in {:.2} s: {:.0} txn/s ({} failed)",
            self.transactions, self.elapsed_s, self.throughput_txn_per_s, self.failed_transactions
        )?;
        match &self.interleave {
            Some(stats) => writeln!(
                f,
                "  network model: {}; {} of {} requests overtaken at their server by a later one",
                self.network, stats.overtaken, stats.delivered
            )?,
            None => writeln!(f, "  network model: {}", self.network)?,
        }
        if let Some(cpu) = self.client_cpu_us_per_txn {
            writeln!(f, "  client threads: {cpu:.1} us of CPU per transaction")?;
        }
        for (name, latency) in [("read ", &self.read), ("write", &self.write)] {
            writeln!(
                f,
                "  {name} n={:<9} mean {:>8.1} us  p50 {:>6} us  p99 {:>6} us  p99.9 {:>6} us  max {:>7} us",
                latency.count, latency.mean_us, latency.p50_us, latency.p99_us, latency.p999_us, latency.max_us
            )?;
        }
        writeln!(
            f,
            "  round 2: {} reads ({:.3}%), {} keys ({:.4} per read, {} found nothing); {} read restarts; {:.1} B metadata per item",
            self.round2.reads_with_round2,
            self.round2.fraction_of_reads * 100.0,
            self.round2.round2_keys,
            self.round2.round2_keys_per_read,
            self.round2.round2_found_nothing,
            self.round2.read_restarts,
            self.round2.metadata_bytes_per_item
        )?;
        if let Some(getstar) = &self.getstar {
            writeln!(
                f,
                "  GET*: {} of {} round-1 GETs from slots ({:.1}%), {} slots read, {} torn retries; fallbacks: {} miss, {} torn, {} wrong key, {} not valid, {} corrupt, {} newer prepared, {} unleased; {} evictions, {} cache fills",
                getstar.hits,
                getstar.eligible_gets,
                getstar.hits as f64 * 100.0 / getstar.eligible_gets.max(1) as f64,
                getstar.slots_accepted,
                getstar.torn_retries,
                getstar.fallback_miss,
                getstar.fallback_torn,
                getstar.fallback_wrong_key,
                getstar.fallback_not_valid,
                getstar.fallback_corrupt,
                getstar.fallback_newer_prepared,
                getstar.fallback_unleased,
                getstar.evictions,
                getstar.cache_fills
            )?;
        }
        if let Some(line) = self.batching_line() {
            writeln!(f, "  {line}")?;
        }
        if let Some(persistence) = &self.persistence {
            writeln!(f, "  persistence: {persistence}")?;
        }
        if let Some(replication) = &self.replication {
            writeln!(f, "  replication: {replication}")?;
        }
        if let Some(failure) = &self.first_failure {
            writeln!(f, "  first failure: {failure}")?;
        }
        match (&self.check, &self.probe) {
            (Some(check), Some(probe)) => {
                write!(f, "workload history: {check}")?;
                writeln!(f, "{}", probe.summary())?;
                if probe.check.verdict() != Verdict::Clean {
                    write!(f, "evidence probe history: {}", probe.check)?;
                }
                let verdict = self.verdict.unwrap_or_default();
                writeln!(f, "read atomicity (workload and evidence probe): {}", verdict.label())?;
            }
            (Some(check), None) => write!(f, "{check}")?,
            (None, _) => {}
        }
        write!(
            f,
            "  machine: {} x {}, {}; commit {}",
            self.machine.cpus, self.machine.cpu_model, self.machine.os, self.git_commit
        )
    }
}

impl ProbeResult {
    /// One line: what the probe ran, its evidence and its verdict ("evidence probe: 16 keys,
    /// 50% reads, 0.52 s: ... 35 races, 35 repaired: clean").
    pub fn summary(&self) -> String {
        let evidence = &self.check.evidence;
        let stopped = match self.stopped {
            ProbeStop::RacesTarget => "stopped at its race target".to_string(),
            ProbeStop::TimeCap => format!("stopped at its {} s cap", crate::limits::PROBE_SECONDS_MAX),
        };
        format!(
            "evidence probe: {} keys, {:.0}% reads, {} keys/txn, {:.2} s, {} transactions ({} failed; {stopped}): {} \
             overlapping reads, {} contended, {} races, {} repaired, {} round-2 reads, {} fractured: {}",
            self.keys,
            self.read_ratio * 100.0,
            self.txn_size,
            self.elapsed_s,
            self.transactions,
            self.failed_transactions,
            evidence.overlapping_reads,
            evidence.contended_reads,
            evidence.round1_fractured_reads,
            evidence.repaired_reads,
            self.reads_with_round2,
            self.check.fractured,
            self.check.verdict().label()
        )
    }
}
