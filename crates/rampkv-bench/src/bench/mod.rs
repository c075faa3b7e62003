//! The closed-loop benchmark: logical clients run read-only and write-only transactions
//! back to back against an embedded local cluster (default) or an external one.
//!
//! Logical clients are multiplexed over a few client threads (a [`Driver`] per thread), so a
//! 2-core machine can run many clients without a thread each. Every value written is a
//! check-mode value (it starts with the writer's timestamp, see [`crate::history`]), so any
//! run can record a history and be checked for read atomicity at the end.

pub mod compare;
mod report;
mod workload;

use workload::TxnSource;

pub use report::{BenchResult, LatencySummary, MachineInfo, PersistenceSummary, ReplicationSummary, RoundTwoSummary};
pub use workload::{Workload, WorkloadNameError};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rampkv_ycsb::{Txn, TxnKind};

use crate::checker;
use crate::history::{self, HistoryFeed, HistoryStream, ReadRecord, Record, WriteRecord};
use crate::limits::{
    HISTORY_SEND_INTERVAL_MS, HISTORY_SEND_RECORDS_MAX, PROBE_CHECK_INTERVAL_MS, PROBE_KEYS, PROBE_RACES_TARGET,
    PROBE_READ_RATIO, PROBE_SECONDS_MAX, PROBE_TXN_SIZE,
};
use rampkv_core::cluster::{Cluster, Front};
use rampkv_core::limits::{CLUSTER_REPLICAS_MAX, GC_GRACE_MS, INTERLEAVE_DELAY_US_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use rampkv_core::protocol::bloom::BloomParameters;
use rampkv_core::protocol::ramp::{metadata_for, Algorithm, TxnOptions};
use rampkv_core::types::UnknownName;
use rampkv_durable::RecoveryReport;
use rampkv_net::client::{ClientError, Completion, Driver, TxnResult};
use rampkv_net::item_slots::ItemSlotConfig;
use rampkv_net::message::BatchStats;
use rampkv_net::recovery::{StartRecovery, RECOVERY_TIMEOUT_MS};
use rampkv_net::server::durable::{cluster_data_dirs, DurabilityConfig, StartError};
use rampkv_net::server::front::FrontEnd;
use rampkv_net::server::{
    Durability, ReplicationMedium, ReplicationOptions, Served, ServerConfig, ServerGroup, ServerOptions, Servers,
};
use rampkv_net::transport::interleave::{InterleaveOptions, InterleaveStats, Interleaving, Pacing};
use rampkv_net::transport::local::LocalTransport;
use rampkv_net::transport::onesided::{GetStarStats, OneSidedOptions};
use rampkv_net::transport::{
    ClientTransport, OneSidedClientTransport, RfRpcClientTransport, SendRecvClientTransport, TcpClientTransport,
    WritePollClientTransport,
};

/// How long a driver waits in one poll before checking the clock again.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Most logical clients in one benchmark.
pub const BENCH_CLIENTS_MAX: usize = 4096;
/// Most keys in the benchmark's key space.
pub const BENCH_KEYS_MAX: u64 = 100_000_000;

/// When a benchmark stops.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopAfter {
    Duration { seconds: f64 },
    Transactions { count: u64 },
}

/// How the benchmark's clients reach the servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// One TCP connection per (client thread, server).
    #[default]
    Tcp,
    /// GET+/PUT+: message rings written one-sidedly over the shared-memory fabric.
    #[serde(rename = "writepoll")]
    WritePoll,
    /// No transport: client threads call the embedded server cores directly, doing the servers'
    /// work themselves (the CPU cost of protocol, store and workload alone). Not
    /// in [`TransportKind::ALL`].
    #[serde(rename = "inprocess")]
    InProcess,
    /// Two-sided send/recv emulated over the shared-memory fabric (posted receive buffers and a
    /// completion queue, as RDMA SEND/RECV).
    #[serde(rename = "sendrecv")]
    SendRecv,
    /// GET\*/PUT+: round-1 reads from item slots read one-sidedly, the rest as write-poll.
    #[serde(rename = "onesided")]
    OneSided,
    /// Remote-fetch RPC: requests written into the server's memory, replies fetched from it.
    #[serde(rename = "rfrpc")]
    RfRpc,
}

impl TransportKind {
    /// Every transport, TCP first (the baseline of comparisons).
    pub const ALL: &'static [TransportKind] = &[
        TransportKind::Tcp,
        TransportKind::SendRecv,
        TransportKind::WritePoll,
        TransportKind::RfRpc,
        TransportKind::OneSided,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::WritePoll => "writepoll",
            TransportKind::InProcess => "inprocess",
            TransportKind::SendRecv => "sendrecv",
            TransportKind::OneSided => "onesided",
            TransportKind::RfRpc => "rfrpc",
        }
    }

    /// The server front end its clients connect to, if not the TCP port (or no transport).
    pub fn front(self) -> Option<Front> {
        match self {
            TransportKind::WritePoll | TransportKind::SendRecv | TransportKind::OneSided => Some(Front::Ring),
            TransportKind::RfRpc => Some(Front::RfRpc),
            TransportKind::Tcp | TransportKind::InProcess => None,
        }
    }

    /// Parses a transport's [name](TransportKind::name).
    pub fn from_name(name: &str) -> Result<Self, UnknownName> {
        let all = TransportKind::ALL.iter().chain([&TransportKind::InProcess]);
        all.clone().copied().find(|kind| kind.name() == name).ok_or_else(|| UnknownName {
            what: "transport",
            name: name.to_owned(),
            choices: all.map(|kind| kind.name()).collect(),
        })
    }
}

/// Everything that defines a benchmark run (recorded with its result).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchConfig {
    /// The transaction algorithm.
    pub algorithm: Algorithm,
    /// RAMP-Hybrid's Bloom filter parameters.
    pub bloom: BloomParameters,
    /// Servers of the embedded cluster (ignored with `cluster_file`).
    pub servers: usize,
    /// Copies of every partition in the embedded cluster (`--replicas`; 1: no replication):
    /// writes are acknowledged once every backup holds them.
    pub replicas: u32,
    /// How the embedded servers' records reach their backups (`--replication-medium`).
    pub replication_medium: ReplicationMedium,
    /// Poller threads the embedded servers share.
    pub server_threads: usize,
    /// How long the embedded servers keep superseded versions.
    pub gc_grace_ms: u64,
    /// Logical clients (closed-loop transaction streams).
    pub clients: usize,
    /// Threads the logical clients are multiplexed over.
    pub client_threads: usize,
    /// Keys per transaction.
    pub txn_size: usize,
    /// Fraction of transactions that are read-only.
    pub read_ratio: f64,
    /// Size of the key space (`k0` .. `k{keys-1}`).
    pub keys: u64,
    /// Bytes per value (at least 8: values carry the writer's timestamp).
    pub value_size: usize,
    /// What the clients run.
    pub workload: Workload,
    /// Micro-benchmark: write every key once (in transactions of `txn_size`, recorded in the
    /// history) before the measured window, so that reads find versions with their metadata
    /// and GET\* finds them in item slots, as in the paper, whose clients get the items'
    /// addresses at initialisation. YCSB workloads always have their load phase.
    #[serde(default)]
    pub preload: bool,
    pub stop_after: StopAfter,
    pub seed: u64,
    /// An external cluster instead of the embedded one.
    pub cluster_file: Option<PathBuf>,
    /// Where to write the history (JSON lines), if anywhere.
    pub history: Option<PathBuf>,
    /// Check the history for read atomicity at the end.
    pub check: bool,
    /// With `check`: after the workload, run the evidence probe (a short run of the same
    /// protocol, transport, cluster and clients under contention, checked on its own) so that a
    /// workload too quiet to race still gets a verdict with teeth (`--no-probe` turns it off).
    pub probe: bool,
    /// TEST ONLY: readers skip the RAMP round-2 repair (must make the checker fail).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mutant_skip_repair: bool,
    /// How the clients reach the servers (the embedded cluster serves both).
    pub transport: TransportKind,
    /// GET\* (`onesided`): item slots per server and their size.
    pub item_slots: ItemSlotConfig,
    /// GET\* (`onesided`): fall back to GET+ when a slot's newer-prepared bit is set.
    pub getstar_newer_prepared_fallback: bool,
    /// The interleaving network model in front of every client thread's transport.
    #[serde(default)]
    pub network: NetworkModel,
    /// The embedded servers keep their stores in data directories (`--data-dir`): server `i`
    /// in `server-<i>` under it, recovered at start if they hold something.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence: Option<BenchPersistence>,
}

/// `bench --data-dir DIR --appendfsync POLICY`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchPersistence {
    pub data_dir: PathBuf,
    #[serde(serialize_with = "policy_name")]
    pub durability: DurabilityConfig,
}

fn policy_name<S: serde::Serializer>(durability: &DurabilityConfig, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(durability.policy.name())
}

/// Whether the interleaving network model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Interleave {
    /// On for the embedded cluster, off against an external one (`--cluster`: servers in
    /// their own processes progress independently by themselves).
    #[default]
    Auto,
    On,
    Off,
}

/// The benchmark's network model (`rampkv_net::transport::interleave`): without it, one client
/// thread's requests reach every server in one order and no read can fracture
/// (docs/history.md, "Evidence and verdict").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct NetworkModel {
    pub interleave: Interleave,
    /// `--net-delay`: fixed delay of every request (wall clock), in microseconds.
    pub delay_us: u64,
    /// `--jitter`: mean of the long-tailed random delay (wall clock), in microseconds; `None`:
    /// [`NETWORK_JITTER_US_DEFAULT`] with the idle time skipped.
    pub jitter_us: Option<u64>,
}

/// The model's mean jitter when neither `--net-delay` nor `--jitter` is given. The clock then
/// skips idle time, so it orders requests without adding idle latency.
pub const NETWORK_JITTER_US_DEFAULT: u64 = 50;

impl NetworkModel {
    /// The model's options for one run (`None`: the model is off), seeded from the run's seed
    /// and the client thread.
    pub fn options(&self, external_cluster: bool, seed: u64, thread: usize) -> Option<InterleaveOptions> {
        let on = match self.interleave {
            Interleave::Auto => !external_cluster,
            Interleave::On => true,
            Interleave::Off => false,
        };
        if !on {
            return None;
        }
        let (jitter_us, pacing) = match (self.delay_us, self.jitter_us) {
            (0, None) => (NETWORK_JITTER_US_DEFAULT, Pacing::SkipIdle),
            (_, jitter_us) => (jitter_us.unwrap_or(0), Pacing::WallClock),
        };
        // Another stream than the workload's (which is seeded from the same seed and thread).
        let seed = (seed ^ NETWORK_SEED_SALT).wrapping_add((thread as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Some(InterleaveOptions { seed, delay_us: self.delay_us, jitter_us, pacing })
    }

    /// One line saying what the model does, for the report.
    pub fn describe(&self, external_cluster: bool) -> String {
        match self.options(external_cluster, 0, 0) {
            None => "off".into(),
            Some(InterleaveOptions { delay_us, jitter_us, pacing: Pacing::SkipIdle, .. }) => {
                format!("on: {delay_us} us delay, {jitter_us} us mean jitter, idle time skipped")
            }
            Some(InterleaveOptions { delay_us, jitter_us, pacing: Pacing::WallClock, .. }) => {
                format!("on: {delay_us} us delay, {jitter_us} us mean jitter, wall clock")
            }
        }
    }
}

impl Interleave {
    /// Parses `on` or `off` (`auto` is the default, not a choice on the command line).
    pub fn from_name(name: &str) -> Result<Self, UnknownName> {
        match name {
            "on" => Ok(Interleave::On),
            "off" => Ok(Interleave::Off),
            _ => Err(UnknownName { what: "--interleave setting", name: name.to_owned(), choices: vec!["on", "off"] }),
        }
    }
}

/// Why a `--net-delay` or `--jitter` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetworkDurationError {
    #[error("invalid network delay {text:?}: a number with a unit, such as 20us, 1.5ms or 0")]
    Invalid { text: String },
    #[error("network delay {text:?} is out of range: 0 to {max_us} us", max_us = INTERLEAVE_DELAY_US_MAX)]
    OutOfRange { text: String },
}

/// Parses a network delay (`500ns`, `20us` or `20µs`, `1.5ms`, `1s`, or `0`) into whole
/// microseconds (rounded to the nearest), within 0..=`INTERLEAVE_DELAY_US_MAX`.
pub fn parse_network_duration_us(text: &str) -> Result<u64, NetworkDurationError> {
    let trimmed = text.trim();
    let units: [(&str, f64); 5] = [("ns", 1e-3), ("us", 1.0), ("µs", 1.0), ("ms", 1e3), ("s", 1e6)];
    let parsed = units.iter().find_map(|(unit, scale)| {
        let number = trimmed.strip_suffix(unit)?;
        Some(number.trim().parse::<f64>().map(|value| value * scale))
    });
    let micros = match parsed {
        Some(Ok(micros)) => micros,
        None if trimmed == "0" => 0.0,
        _ => return Err(NetworkDurationError::Invalid { text: text.to_owned() }),
    };
    if !(0.0..=INTERLEAVE_DELAY_US_MAX as f64).contains(&micros) {
        return Err(NetworkDurationError::OutOfRange { text: text.to_owned() }); // NaN too
    }
    Ok(micros.round() as u64)
}

/// Mixed into the run's seed for the network model's draws.
const NETWORK_SEED_SALT: u64 = 0x6E65_7477_6F72_6B21; // "network!"

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            algorithm: Algorithm::RampFast,
            bloom: BloomParameters::default(),
            servers: 4,
            replicas: 1,
            replication_medium: ReplicationMedium::default(),
            server_threads: 1,
            gc_grace_ms: GC_GRACE_MS,
            clients: 8,
            client_threads: 1,
            txn_size: 4,
            read_ratio: 0.95,
            keys: 1_000,
            value_size: 1_024,
            workload: Workload::Micro { zipfian: false },
            preload: false,
            stop_after: StopAfter::Duration { seconds: 10.0 },
            seed: 0,
            cluster_file: None,
            history: None,
            check: false,
            probe: true,
            mutant_skip_repair: false,
            transport: TransportKind::Tcp,
            item_slots: ItemSlotConfig::default(),
            getstar_newer_prepared_fallback: false,
            network: NetworkModel::default(),
            persistence: None,
        }
    }
}

/// A benchmark setting out of its range, or settings that do not go together.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A whole-number setting outside `min..=max`.
    #[error("{flag} must be {min}..={max}, got {got}")]
    OutOfRange { flag: &'static str, min: u64, max: u64, got: u64 },
    /// A whole-number setting outside `1..=` another setting (named).
    #[error("{flag} must be 1..={bound}, got {got}")]
    AboveOther { flag: &'static str, bound: &'static str, got: u64 },
    #[error("--keys must be txn-size..={max}, got {got}")]
    Keys { max: u64, got: u64 },
    #[error("--value-size must be {min}..={max} (values carry the writer's timestamp), got {got}")]
    ValueSize { min: usize, max: usize, got: usize },
    #[error("--read-ratio must be within 0..=1, got {0}")]
    ReadRatio(f64),
    #[error("--duration must be within (0, 24h], got {0}s")]
    Duration(f64),
    #[error("--txns must be at least 1")]
    NoTransactions,
    #[error("--replicas {replicas} needs at least {replicas} servers (each copy on a server of its own), got --servers {servers}")]
    ReplicasAboveServers { replicas: u32, servers: usize },
    /// Two settings that do not go together (`what` and why, fixed texts).
    #[error("{what} {why}")]
    NotTogether { what: &'static str, why: &'static str },
    /// The network model's settings.
    #[error(transparent)]
    Network(#[from] rampkv_net::transport::interleave::InterleaveError),
    /// The workload generator refused its settings or ran out.
    #[error("workload: {0}")]
    Workload(#[from] rampkv_ycsb::Error),
    /// No YCSB workload has this letter.
    #[error("unknown YCSB workload {0}")]
    UnknownYcsb(char),
    /// The item slots cannot be sized for the widest transaction's metadata.
    #[error(transparent)]
    Metadata(#[from] rampkv_core::protocol::ProtocolError),
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("invalid benchmark configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("invalid benchmark configuration: {0}")]
    Bloom(#[from] rampkv_core::protocol::bloom::BloomError),
    #[error("invalid benchmark configuration: {0}")]
    ItemSlots(#[from] rampkv_net::item_slots::ItemSlotsError),
    #[error("cannot start the embedded cluster: {0}")]
    Cluster(std::io::Error),
    #[error("cannot start the embedded cluster: {0}")]
    Persistence(StartError),
    #[error(transparent)]
    ClusterFile(#[from] rampkv_core::cluster::ClusterError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    History(#[from] history::HistoryError),
    #[error("client thread failed: {0}")]
    Thread(std::io::Error),
    #[error("client thread failed: a client thread panicked")]
    ThreadPanicked,
}

impl BenchConfig {
    /// Checks every field before anything starts.
    pub fn validate(&self) -> Result<(), BenchError> {
        let fail = |error: ConfigError| Err(BenchError::Config(error));
        let not_together = |what, why| fail(ConfigError::NotTogether { what, why });
        self.bloom.validate()?;
        if self.persistence.is_some() && self.cluster_file.is_some() {
            return not_together("--data-dir", "is for the embedded cluster's servers: not with --cluster");
        }
        if self.replicas != 1 {
            if self.cluster_file.is_some() {
                return not_together(
                    "--replicas",
                    "is for the embedded cluster: an external cluster's file says its own",
                );
            }
            if self.replicas == 0 || self.replicas > CLUSTER_REPLICAS_MAX {
                let (max, got) = (u64::from(CLUSTER_REPLICAS_MAX), u64::from(self.replicas));
                return fail(ConfigError::OutOfRange { flag: "--replicas", min: 1, max, got });
            }
            if self.replicas as usize > self.servers {
                return fail(ConfigError::ReplicasAboveServers { replicas: self.replicas, servers: self.servers });
            }
            if self.server_threads != 1 {
                return not_together(
                    "--replicas",
                    "with --server-threads above 1 is not built (the backups must be in the primaries' group)",
                );
            }
            if self.persistence.is_some() {
                return not_together(
                    "--replicas",
                    "with --data-dir is not built yet (a backup cannot catch up with a recovered log)",
                );
            }
        }
        if self.transport == TransportKind::InProcess && self.cluster_file.is_some() {
            return not_together("--transport inprocess", "calls the embedded cluster's servers: not with --cluster");
        }
        self.item_slots.validate()?;
        if let Some(options) = self.network.options(self.cluster_file.is_some(), self.seed, 0) {
            options.validate().map_err(ConfigError::from)?;
        }
        if self.cluster_file.is_none() && !(1..=64).contains(&self.servers) {
            return fail(ConfigError::OutOfRange { flag: "--servers", min: 1, max: 64, got: self.servers as u64 });
        }
        if self.server_threads == 0 || self.server_threads > self.servers.max(1) {
            let got = self.server_threads as u64;
            return fail(ConfigError::AboveOther { flag: "--server-threads", bound: "servers", got });
        }
        if !(1..=BENCH_CLIENTS_MAX).contains(&self.clients) {
            let (max, got) = (BENCH_CLIENTS_MAX as u64, self.clients as u64);
            return fail(ConfigError::OutOfRange { flag: "--clients", min: 1, max, got });
        }
        if self.client_threads == 0 || self.client_threads > self.clients {
            let got = self.client_threads as u64;
            return fail(ConfigError::AboveOther { flag: "--client-threads", bound: "clients", got });
        }
        if !(1..=TXN_KEYS_MAX).contains(&self.txn_size) {
            let (max, got) = (TXN_KEYS_MAX as u64, self.txn_size as u64);
            return fail(ConfigError::OutOfRange { flag: "--txn-size", min: 1, max, got });
        }
        if !(0.0..=1.0).contains(&self.read_ratio) {
            return fail(ConfigError::ReadRatio(self.read_ratio));
        }
        if self.keys < self.txn_size as u64 || self.keys > BENCH_KEYS_MAX {
            return fail(ConfigError::Keys { max: BENCH_KEYS_MAX, got: self.keys });
        }
        if !(history::CHECK_VALUE_PREFIX_LEN..=VALUE_BYTES_MAX).contains(&self.value_size) {
            let (min, max) = (history::CHECK_VALUE_PREFIX_LEN, VALUE_BYTES_MAX);
            return fail(ConfigError::ValueSize { min, max, got: self.value_size });
        }
        match self.stop_after {
            StopAfter::Duration { seconds } if !(seconds > 0.0 && seconds <= 86_400.0) => {
                fail(ConfigError::Duration(seconds))
            }
            StopAfter::Transactions { count: 0 } => fail(ConfigError::NoTransactions),
            _ => Ok(()),
        }
    }
}

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

/// Where client threads reach the servers.
#[derive(Clone)]
struct Endpoints {
    cluster: Cluster,
    /// The front ends' control addresses (the one-sided transports).
    control_addresses: Vec<String>,
    /// The embedded servers (the `inprocess` transport calls their cores).
    local_servers: Vec<Arc<Servers>>,
}

type ClientThreadHandle = std::thread::JoinHandle<Result<ThreadTotals, BenchError>>;

/// Starts `config.client_threads` client threads running `config`'s workload; `feed(thread)`
/// is where a thread hands its finished records while it runs, if anywhere.
fn spawn_client_threads(
    config: &BenchConfig,
    endpoints: &Endpoints,
    shared: &Arc<Shared>,
    keep_records: bool,
    feed: impl Fn(usize) -> Option<HistoryFeed>,
) -> Result<Vec<ClientThreadHandle>, BenchError> {
    (0..config.client_threads)
        .map(|thread| {
            let sessions = sessions_of_thread(config.clients, config.client_threads, thread);
            let config = config.clone();
            let Endpoints { cluster, control_addresses, local_servers } = endpoints.clone();
            let shared = Arc::clone(shared);
            let history = feed(thread);
            std::thread::Builder::new().name(format!("rampkv-bench-{thread}")).spawn(move || {
                let context = ThreadContext { sessions, thread, shared: &shared, keep_records, history };
                match config.transport {
                    TransportKind::Tcp => {
                        let transport = TcpClientTransport::connect(cluster.servers()).map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::WritePoll => {
                        let transport =
                            WritePollClientTransport::connect(&control_addresses).map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::InProcess => {
                        run_client_thread(&config, LocalTransport::new(&local_servers, None), cluster, context)
                    }
                    TransportKind::SendRecv => {
                        let transport =
                            SendRecvClientTransport::connect(&control_addresses).map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::OneSided => {
                        let options = OneSidedOptions {
                            newer_prepared_fallback: config.getstar_newer_prepared_fallback,
                            ..OneSidedOptions::default()
                        };
                        let transport =
                            OneSidedClientTransport::connect(&control_addresses, options).map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::RfRpc => {
                        let transport = RfRpcClientTransport::connect(&control_addresses).map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                }
            })
        })
        .collect::<Result<_, _>>()
        .map_err(BenchError::Thread)
}

/// Waits for every client thread; returns their totals merged and the first error (after
/// which the others are told to stop).
fn join_client_threads(threads: Vec<ClientThreadHandle>, shared: &Shared) -> (ThreadTotals, Option<BenchError>) {
    let mut totals = ThreadTotals::new();
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(result)) => totals.merge(result),
            Ok(Err(error)) => {
                shared.stop.store(true, Ordering::Release);
                first_error.get_or_insert(error);
            }
            Err(_) => {
                shared.stop.store(true, Ordering::Release);
                first_error.get_or_insert(BenchError::ThreadPanicked);
            }
        }
    }
    (totals, first_error)
}

/// The control addresses of the embedded cluster's front ends, in server order.
fn embedded_control_addresses(fronts: &[FrontEnd]) -> Vec<String> {
    fronts.iter().flat_map(|front| front.control_addresses().iter().map(SocketAddr::to_string)).collect()
}

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
fn run_probe(
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

/// The log counters of every embedded server, summed.
#[derive(Debug, Clone, Copy, Default)]
struct LogTotals {
    records: u64,
    groups: u64,
    fsyncs: u64,
    snapshots: u64,
    segments_recycled: u64,
}

/// What the logs did over a window.
struct LogWindow {
    records_per_s: f64,
    fsyncs_per_s: f64,
    mean_group_records: f64,
    records_per_fsync: f64,
    snapshots_written: u64,
    segments_recycled: u64,
}

impl LogTotals {
    fn difference(&self, before: &LogTotals, window: Duration) -> LogWindow {
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

fn log_stats(groups: &[ServerGroup]) -> LogTotals {
    let journals = groups.iter().flat_map(|group| group.servers().served().iter().filter_map(Served::journal));
    journals.map(|journal| journal.stats()).fold(LogTotals::default(), |sum, stats| LogTotals {
        records: sum.records + stats.log.records,
        groups: sum.groups + stats.log.groups,
        fsyncs: sum.fsyncs + stats.log.fsyncs,
        snapshots: sum.snapshots + stats.snapshots_written,
        segments_recycled: sum.segments_recycled + stats.log.segments_recycled,
    })
}

/// The embedded cluster: TCP server groups, and a write-poll front end for each group that
/// serves the same cores (so both transports reach the same stores).
type Embedded = (Cluster, Vec<ServerGroup>, Vec<FrontEnd>, Vec<RecoveryReport>);

fn start_embedded_cluster(config: &BenchConfig) -> Result<Embedded, BenchError> {
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

/// The contiguous share `thread` gets of `total` items split over `threads`.
fn sessions_of_thread(total: usize, threads: usize, thread: usize) -> std::ops::Range<usize> {
    let base = total / threads;
    let extra = total % threads;
    let start = thread * base + thread.min(extra);
    start..start + base + usize::from(thread < extra)
}

struct Shared {
    clock_origin: Instant,
    started: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.clock_origin.elapsed().as_nanos() as u64
    }
}

/// What one client thread measured.
pub(crate) struct ThreadTotals {
    pub(crate) read_latency_us: Histogram<u64>,
    pub(crate) write_latency_us: Histogram<u64>,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) reads_with_round2: u64,
    pub(crate) round2_keys: u64,
    pub(crate) round2_found_nothing: u64,
    /// Bytes of per-version metadata written (as encoded on the wire), over all written items.
    pub(crate) metadata_bytes: u64,
    pub(crate) written_items: u64,
    pub(crate) read_restarts: u64,
    pub(crate) failed: u64,
    pub(crate) first_failure: Option<String>,
    pub(crate) records: Vec<Record>,
    /// CPU time the client threads spent during the run (user + system), when the OS says.
    pub(crate) client_cpu: Option<Duration>,
    /// When the thread's measured run started (after connecting) and ended; merged: the
    /// earliest start to the latest end.
    pub(crate) window: Option<(Instant, Instant)>,
    /// GET\* counters (onesided transport only).
    pub(crate) getstar: Option<GetStarStats>,
    /// RF-RPC batching counters (rfrpc transport only).
    pub(crate) batching: Option<BatchStats>,
    /// The network model's counters (when it runs).
    pub(crate) interleave: Option<InterleaveStats>,
}

impl ThreadTotals {
    fn new() -> Self {
        let histogram = || Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds");
        Self {
            read_latency_us: histogram(),
            write_latency_us: histogram(),
            reads: 0,
            writes: 0,
            reads_with_round2: 0,
            round2_keys: 0,
            round2_found_nothing: 0,
            metadata_bytes: 0,
            written_items: 0,
            read_restarts: 0,
            failed: 0,
            first_failure: None,
            records: Vec::new(),
            client_cpu: Some(Duration::ZERO),
            window: None,
            getstar: None,
            batching: None,
            interleave: None,
        }
    }

    fn merge(&mut self, other: ThreadTotals) {
        self.read_latency_us.add(&other.read_latency_us).expect("same histogram bounds");
        self.write_latency_us.add(&other.write_latency_us).expect("same histogram bounds");
        self.reads += other.reads;
        self.writes += other.writes;
        self.reads_with_round2 += other.reads_with_round2;
        self.round2_keys += other.round2_keys;
        self.round2_found_nothing += other.round2_found_nothing;
        self.metadata_bytes += other.metadata_bytes;
        self.written_items += other.written_items;
        self.read_restarts += other.read_restarts;
        self.failed += other.failed;
        self.client_cpu = match (self.client_cpu, other.client_cpu) {
            (Some(mine), Some(theirs)) => Some(mine + theirs),
            _ => None,
        };
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
        self.records.extend(other.records);
        self.window = match (self.window, other.window) {
            (Some((start, end)), Some((other_start, other_end))) => Some((start.min(other_start), end.max(other_end))),
            (window, None) | (None, window) => window,
        };
        if let Some(other) = other.batching {
            self.batching.get_or_insert_with(BatchStats::default).merge(&other);
        }
        if let Some(other) = other.getstar {
            self.getstar.get_or_insert_with(GetStarStats::default).merge(&other);
        }
        if let Some(other) = other.interleave {
            self.interleave.get_or_insert_with(InterleaveStats::default).merge(&other);
        }
    }
}

/// What a session is doing now.
struct InFlight {
    keys: Vec<Vec<u8>>,
    write_ts: Option<u64>,
    /// A YCSB read-modify-write: the read is done first, then a write of the same keys.
    then_write: bool,
    start: Instant,
    start_ns: u64,
}

struct ClientThread<'a, T: ClientTransport> {
    config: &'a BenchConfig,
    shared: &'a Shared,
    deadline: Option<Instant>,
    driver: Driver<T>,
    source: TxnSource,
    /// Each session's current transaction as generated (YCSB acknowledges inserts with it).
    txns: Vec<Txn>,
    in_flight: Vec<Option<InFlight>>,
    totals: ThreadTotals,
    keep_records: bool,
    history: Option<HistoryFeed>,
    /// When records were last handed to `history`.
    last_handover: Instant,
}

/// What a client thread is given besides its transport.
struct ThreadContext<'a> {
    sessions: std::ops::Range<usize>,
    thread: usize,
    shared: &'a Shared,
    keep_records: bool,
    /// Where finished records go while the run goes on, if the history streams to a file.
    history: Option<HistoryFeed>,
}

/// Runs one client thread over `transport`, behind the network model if it is on.
fn run_client_thread<T: ClientTransport>(
    config: &BenchConfig,
    transport: T,
    cluster: Cluster,
    context: ThreadContext<'_>,
) -> Result<ThreadTotals, BenchError> {
    match config.network.options(config.cluster_file.is_some(), config.seed, context.thread) {
        Some(options) => {
            let transport = Interleaving::new(transport, options).map_err(ConfigError::from)?;
            run_sessions(config, transport, cluster, context)
        }
        None => run_sessions(config, transport, cluster, context),
    }
}

fn run_sessions<T: ClientTransport>(
    config: &BenchConfig,
    transport: T,
    cluster: Cluster,
    context: ThreadContext<'_>,
) -> Result<ThreadTotals, BenchError> {
    let ThreadContext { sessions, thread, shared, keep_records, history } = context;
    let mut driver = Driver::connect(transport, cluster, sessions.len())?;
    driver.set_txn_options(TxnOptions {
        algorithm: config.algorithm,
        bloom: config.bloom,
        mutant_skip_repair: config.mutant_skip_repair,
    });
    let seed = config.seed ^ (thread as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let source = TxnSource::new(config, seed)?;
    let started = Instant::now();
    let deadline = match config.stop_after {
        StopAfter::Duration { seconds } => Some(started + Duration::from_secs_f64(seconds)),
        StopAfter::Transactions { .. } => None,
    };
    let mut state = ClientThread {
        config,
        shared,
        deadline,
        source,
        txns: (0..sessions.len()).map(|_| Txn::new()).collect(),
        in_flight: (0..sessions.len()).map(|_| None).collect(),
        driver,
        totals: ThreadTotals::new(),
        keep_records,
        history,
        last_handover: Instant::now(),
    };
    let cpu_before = thread_cpu_time();
    state.run()?;
    state.totals.client_cpu = match (cpu_before, thread_cpu_time()) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    state.totals.window = Some((started, Instant::now()));
    state.totals.getstar = state.driver.transport().getstar_stats();
    state.totals.batching = state.driver.transport().batch_stats();
    state.totals.interleave = state.driver.transport().interleave_stats();
    Ok(state.totals)
}

/// CPU time (user + system) of the calling thread so far, from `/proc/thread-self/stat`
/// (Linux; clock ticks of 1/100 s: fine over a run of seconds). None where that is missing.
pub fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at its closing parenthesis:
    // state is field 3, utime 14 and stime 15 (1-based), so 11 and 12 after the name.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

impl<T: ClientTransport> ClientThread<'_, T> {
    fn run(&mut self) -> Result<(), BenchError> {
        for session in 0..self.in_flight.len() {
            self.start_next(session)?;
        }
        let mut completions = Vec::new();
        while self.driver.active() > 0 {
            self.driver.step(Some(POLL_INTERVAL), &mut completions)?;
            for completion in completions.drain(..) {
                let session = completion.session;
                match self.record(completion) {
                    // A read-modify-write goes on with its write, whatever the stop condition.
                    Some(keys) => self.begin_write(session, keys)?,
                    None => {
                        self.source.acknowledge(&self.txns[session]);
                        self.start_next(session)?;
                    }
                }
            }
            self.hand_over_history(false);
        }
        self.hand_over_history(true);
        Ok(())
    }

    /// Hands the records finished so far to the history stream, if there is one and it is time
    /// (or `now`). A stopped stream reports its error at the end of the run.
    fn hand_over_history(&mut self, now: bool) {
        let Some(history) = &self.history else {
            return;
        };
        let pending = self.totals.records.len();
        let due = self.last_handover.elapsed() >= Duration::from_millis(HISTORY_SEND_INTERVAL_MS);
        if pending > 0 && (now || due || pending >= HISTORY_SEND_RECORDS_MAX) {
            history.send(std::mem::take(&mut self.totals.records));
            self.last_handover = Instant::now();
        }
    }

    fn should_stop(&self) -> bool {
        if self.shared.stop.load(Ordering::Relaxed) {
            return true;
        }
        match (self.deadline, self.config.stop_after) {
            (Some(deadline), _) => Instant::now() >= deadline,
            (None, StopAfter::Transactions { count }) => self.shared.started.fetch_add(1, Ordering::Relaxed) >= count,
            (None, StopAfter::Duration { .. }) => unreachable!("a duration run has a deadline"),
        }
    }

    fn start_next(&mut self, session: usize) -> Result<(), BenchError> {
        if self.should_stop() {
            return Ok(());
        }
        self.source.next(&mut self.txns[session])?;
        let txn = &self.txns[session];
        let keys: Vec<Vec<u8>> = txn.keys().map(<[u8]>::to_vec).collect();
        match txn.kind() {
            TxnKind::ReadOnly => self.begin_read(session, keys, false),
            TxnKind::ReadThenWrite => self.begin_read(session, keys, true),
            TxnKind::WriteOnly => self.begin_write(session, keys),
        }
    }

    fn begin_read(&mut self, session: usize, keys: Vec<Vec<u8>>, then_write: bool) -> Result<(), BenchError> {
        let (start, start_ns) = (Instant::now(), self.shared.now_ns());
        self.driver.begin_read(session, keys)?;
        // The keys come back with the outcome (each item names its key, in request order): a
        // read keeps no copy of its own (`record` takes them from the outcome if it needs them).
        self.in_flight[session] = Some(InFlight { keys: Vec::new(), write_ts: None, then_write, start, start_ns });
        Ok(())
    }

    /// Writes check-mode values (the writer's timestamp first) of the configured size.
    fn begin_write(&mut self, session: usize, keys: Vec<Vec<u8>>) -> Result<(), BenchError> {
        let (start, start_ns) = (Instant::now(), self.shared.now_ns());
        let value_size = self.config.value_size;
        let write_keys = keys.clone();
        let ts = self.driver.begin_write_with(session, move |ts| check_values(write_keys, ts, value_size))?;
        self.in_flight[session] = Some(InFlight { keys, write_ts: Some(ts), then_write: false, start, start_ns });
        Ok(())
    }

    /// Records a finished transaction; returns the keys to write next for the read half of a
    /// read-modify-write that succeeded.
    fn record(&mut self, completion: Completion) -> Option<Vec<Vec<u8>>> {
        let mut in_flight = self.in_flight[completion.session].take().expect("a completed session was in flight");
        let then_write = in_flight.then_write && completion.result.is_ok();
        let keys_needed = then_write || self.keep_records || self.config.history.is_some();
        if let (Ok(TxnResult::Read(outcome)), true) = (&completion.result, keys_needed) {
            in_flight.keys = outcome.items.iter().map(|item| item.key.clone()).collect();
        }
        let latency_us = (in_flight.start.elapsed().as_micros() as u64).max(1);
        match &completion.result {
            Ok(TxnResult::Read(outcome)) => {
                self.totals.reads += 1;
                self.totals.read_latency_us.saturating_record(latency_us);
                self.totals.round2_keys += u64::from(outcome.round2_keys);
                self.totals.round2_found_nothing += u64::from(outcome.round2_found_nothing);
                self.totals.reads_with_round2 += u64::from(outcome.round2_keys > 0);
                self.totals.read_restarts += u64::from(outcome.restarts);
            }
            Ok(TxnResult::Write(_)) => {
                self.totals.writes += 1;
                let metadata_bytes = metadata_for(self.driver.txn_options(), &in_flight.keys)
                    .map_or(0, |metadata| metadata.encoded_bytes());
                self.totals.metadata_bytes += (metadata_bytes * in_flight.keys.len()) as u64;
                self.totals.written_items += in_flight.keys.len() as u64;
                self.totals.write_latency_us.saturating_record(latency_us);
            }
            Err(error) => {
                self.totals.failed += 1;
                self.totals.first_failure.get_or_insert_with(|| error.to_string());
            }
        }
        // Rendering keys and verifying every value byte is history work: skipped when no history
        // is kept, so that it does not load the measured client thread.
        if self.keep_records || self.config.history.is_some() {
            let client = u64::from(self.driver.client_id(completion.session));
            let end_ns = self.shared.now_ns();
            if let Some(record) = history_record(&in_flight, client, end_ns, completion.result) {
                self.totals.records.push(record);
            }
        }
        then_write.then_some(in_flight.keys)
    }
}

/// The history line of a finished transaction (`None` for a failed read: nothing to check).
fn history_record(
    in_flight: &InFlight,
    client: u64,
    end_ns: u64,
    result: Result<TxnResult, ClientError>,
) -> Option<Record> {
    let keys: Vec<String> = in_flight.keys.iter().map(|key| history::key_to_history_string(key)).collect();
    let (start_ns, ok) = (in_flight.start_ns, result.is_ok());
    match result {
        Ok(TxnResult::Read(outcome)) => {
            Some(Record::Read(ReadRecord::of_outcome(client, keys, &outcome, start_ns, end_ns)))
        }
        Ok(TxnResult::Write(outcome)) => {
            Some(Record::Write(WriteRecord { client, ts: outcome.ts, keys, start_ns, end_ns, ok }))
        }
        // A failed write may have prepared or committed somewhere: record it.
        Err(_) => in_flight.write_ts.map(|ts| Record::Write(WriteRecord { client, ts, keys, start_ns, end_ns, ok })),
    }
}

/// Check-mode values for `keys`: each starts with the writer's timestamp (see `history`).
pub(crate) fn check_values(keys: Vec<Vec<u8>>, ts: u64, value_size: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    keys.into_iter()
        .map(|key| {
            let mut value = vec![0u8; value_size];
            history::fill_check_value(ts, &mut value);
            (key, value)
        })
        .collect()
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

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn each_setting_out_of_range_is_a_typed_config_error_with_the_flag_named() {
        let refused = |config: BenchConfig| match config.validate() {
            Err(BenchError::Config(error)) => error,
            other => panic!("expected a config error, got {other:?}"),
        };
        let error = refused(BenchConfig { servers: 0, ..BenchConfig::default() });
        assert!(matches!(error, ConfigError::OutOfRange { flag: "--servers", min: 1, max: 64, got: 0 }), "{error}");
        assert_eq!(error.to_string(), "--servers must be 1..=64, got 0");
        let error = refused(BenchConfig { clients: 4, client_threads: 5, ..BenchConfig::default() });
        assert_eq!(error.to_string(), "--client-threads must be 1..=clients, got 5");
        let error = refused(BenchConfig { read_ratio: 1.5, ..BenchConfig::default() });
        assert!(matches!(error, ConfigError::ReadRatio(ratio) if ratio == 1.5), "{error}");
        let error = refused(BenchConfig { stop_after: StopAfter::Transactions { count: 0 }, ..BenchConfig::default() });
        assert!(matches!(error, ConfigError::NoTransactions), "{error}");
        let error = refused(BenchConfig { replicas: 3, servers: 2, ..BenchConfig::default() });
        assert!(matches!(error, ConfigError::ReplicasAboveServers { replicas: 3, servers: 2 }), "{error}");
        let external = BenchConfig {
            transport: TransportKind::InProcess,
            cluster_file: Some("cluster.toml".into()),
            ..BenchConfig::default()
        };
        let error = refused(external);
        assert!(matches!(error, ConfigError::NotTogether { what: "--transport inprocess", .. }), "{error}");
        assert!(error.to_string().ends_with("not with --cluster"), "{error}");
    }
}

#[cfg(test)]
mod cpu_time_tests {
    use super::*;

    #[test]
    fn network_durations_parse_in_their_units_and_bad_ones_are_refused() {
        let cases =
            [("20us", 20), ("20µs", 20), ("1.5ms", 1_500), ("1s", 1_000_000), ("500ns", 1), ("0", 0), ("0us", 0)];
        for (text, micros) in cases {
            assert_eq!(parse_network_duration_us(text), Ok(micros), "{text}");
        }
        for bad in ["", "20", "fast", "-1us", "NaNus", "2s", "infms", "1e9us"] {
            assert!(parse_network_duration_us(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_network_model_is_on_for_the_embedded_cluster_and_off_for_an_external_one_unless_told() {
        let default = NetworkModel::default();
        let embedded = default.options(false, 1, 0).expect("on by default for the embedded cluster");
        assert_eq!((embedded.jitter_us, embedded.pacing), (NETWORK_JITTER_US_DEFAULT, Pacing::SkipIdle));
        assert!(default.options(true, 1, 0).is_none(), "off against --cluster");
        let on = NetworkModel { interleave: Interleave::On, ..default };
        assert!(on.options(true, 1, 0).is_some());
        let off = NetworkModel { interleave: Interleave::Off, ..default };
        assert!(off.options(false, 1, 0).is_none());
        let timed = NetworkModel { delay_us: 20, jitter_us: Some(50), ..default }.options(false, 1, 0).unwrap();
        assert_eq!((timed.delay_us, timed.jitter_us, timed.pacing), (20, 50, Pacing::WallClock));
        assert_ne!(default.options(false, 1, 0).unwrap().seed, default.options(false, 1, 1).unwrap().seed);
    }

    #[test]
    fn thread_cpu_time_counts_this_threads_work() {
        let before = thread_cpu_time();
        if !cfg!(target_os = "linux") && before.is_none() {
            return; // only Linux is promised the figure
        }
        let before = before.expect("Linux has /proc/thread-self/stat");
        let started = Instant::now();
        let mut spin = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let used = thread_cpu_time().unwrap().saturating_sub(before);
        // At least some of 200 ms of spinning, however busy the machine; never more than the
        // wall time plus a tick.
        assert!(used >= Duration::from_millis(20) && used <= Duration::from_millis(300), "{used:?}");
    }
}
