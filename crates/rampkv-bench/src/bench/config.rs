//! A benchmark's configuration and its errors: everything that defines a run (recorded with
//! its result), checked whole before anything starts.
//!
//! # Contract
//! [`BenchConfig::validate`] refuses, with a typed [`ConfigError`] naming the flag, every
//! setting out of its range and every pair of settings that do not go together, before a
//! server or client starts; nothing later in a run re-checks them. A run's randomness all
//! derives from [`BenchConfig::seed`] (the workload per client thread, the network model per
//! thread, the probe), so a configuration and its seed replay a run's transaction streams.
//! Bounds are named here ([`BENCH_CLIENTS_MAX`], [`BENCH_KEYS_MAX`]) or in `crate::limits`.

use std::path::PathBuf;

use super::workload::Workload;
use crate::history;
use rampkv_core::cluster::Front;
use rampkv_core::limits::{CLUSTER_REPLICAS_MAX, GC_GRACE_MS, INTERLEAVE_DELAY_US_MAX, TXN_KEYS_MAX, VALUE_BYTES_MAX};
use rampkv_core::protocol::bloom::BloomParameters;
use rampkv_core::protocol::ramp::Algorithm;
use rampkv_core::types::UnknownName;
use rampkv_net::client::ClientError;
use rampkv_net::item_slots::ItemSlotConfig;
use rampkv_net::server::durable::{DurabilityConfig, StartError};
use rampkv_net::server::ReplicationMedium;
use rampkv_net::transport::interleave::{InterleaveOptions, Pacing};

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

/// The contiguous share `thread` gets of `total` items split over `threads`.
pub(super) fn sessions_of_thread(total: usize, threads: usize, thread: usize) -> std::ops::Range<usize> {
    let base = total / threads;
    let extra = total % threads;
    let start = thread * base + thread.min(extra);
    start..start + base + usize::from(thread < extra)
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
mod network_tests {
    use super::*;
    use rampkv_net::transport::interleave::Pacing;

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
}
