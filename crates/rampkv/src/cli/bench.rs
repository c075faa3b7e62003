//! `rampkv bench`: the closed-loop benchmark, over an embedded cluster or the servers of a
//! cluster file; `--compare` runs it over every transport in turn. With `--check` the exit
//! status is the checker's verdict ([`check_exit_code`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;

use rampkv::bench::{self, BenchConfig, StopAfter, Workload};
use rampkv::limits::GC_GRACE_MS;
use rampkv::message::fallback::{media_line, take_chosen_media};
use rampkv::progress::{Goal, ProgressBar};
use rampkv::protocol::bloom::BloomParameters;
use rampkv::protocol::ramp::Algorithm;
use rampkv::server::ReplicationMedium;

use super::args::{FabricArgs, PersistenceArgs, SecretArgs};
use super::check::check_exit_code;
use super::clock_seed;
use super::output::{out, out_raw, say};
use super::parse::{parse_algorithm, parse_duration};

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Workload: micro (the paper's micro-benchmark, uniform keys), micro-zipfian, a YCSB
    /// core workload a, b, c, d or f (--keys is its recordcount; its own read proportion), or
    /// ycsb-read-ratio (YCSB workload A with readproportion = --read-ratio, the rest updates).
    #[arg(long, default_value = "micro", value_parser = Workload::from_name)]
    workload: Workload,
    /// Micro-benchmark: write every key once before the measured window (reads then find
    /// versions, and GET* finds them in item slots). YCSB workloads always load their records.
    #[arg(long)]
    preload: bool,
    /// Also print the result in YCSB's text format ([OVERALL], [READ], [UPDATE] lines).
    #[arg(long)]
    ycsb: bool,
    /// Transaction algorithm: ramp-fast, ramp-small, ramp-hybrid, s2pl or nocc.
    #[arg(long, default_value = "ramp-fast", value_parser = parse_algorithm)]
    protocol: Algorithm,
    /// RAMP-Hybrid: Bloom filter size in bits (a multiple of 8).
    #[arg(long, default_value_t = BloomParameters::default().bits)]
    bloom_bits: u32,
    /// RAMP-Hybrid: hash functions per key.
    #[arg(long, default_value_t = BloomParameters::default().hashes)]
    bloom_hashes: u8,
    /// Servers of the embedded cluster.
    #[arg(long, default_value_t = 4)]
    servers: usize,
    /// Copies of every partition in the embedded cluster (1: no replication, the paper's
    /// configuration). With N > 1 every write is acknowledged once the N - 1 backups of its
    /// partition hold it (synchronous replication; see docs/replication.md).
    #[arg(long, default_value_t = 1, value_name = "N")]
    replicas: u32,
    /// With --replicas above 1: how records reach the backups: onesided (written into a log
    /// region each backup registers; the servers share this process) or tcp.
    #[arg(long, value_name = "MEDIUM", default_value = "onesided")]
    replication_medium: ReplicationMedium,
    /// Poller threads the embedded servers share.
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// How long the embedded servers keep superseded versions, in milliseconds.
    #[arg(long, default_value_t = GC_GRACE_MS)]
    gc_grace_ms: u64,
    /// Logical clients (closed-loop transaction streams).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Threads the logical clients are multiplexed over.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Keys per transaction.
    #[arg(long, default_value_t = 4)]
    txn_size: usize,
    /// Fraction of read-only transactions (0 to 1; micro and ycsb-read-ratio workloads).
    #[arg(long, default_value_t = 0.95)]
    read_ratio: f64,
    /// Size of the key space.
    #[arg(long, default_value_t = 1_000)]
    keys: u64,
    /// Bytes per value (at least 8).
    #[arg(long, default_value_t = 1_024)]
    value_size: usize,
    /// Run for this long (e.g. 10s, 500ms, 2m).
    #[arg(long, conflicts_with = "txns")]
    duration: Option<String>,
    /// Run this many transactions instead of a duration.
    #[arg(long)]
    txns: Option<u64>,
    /// Seed of the workload (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Record the history (JSON lines) to this file.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Check the history for read atomicity at the end, then run the evidence probe (a short
    /// run of the same protocol, transport and cluster on 16 keys, half reads, checked on its
    /// own; not part of the measured figures). Exit status: 0 clean (no anomaly in either
    /// history, and one of them showed enough races), 1 violated (in either), 3 inconclusive
    /// (no anomaly, but neither showed the races that prove anything; see docs/history.md),
    /// 2 an error.
    #[arg(long)]
    check: bool,
    /// With --check: skip the evidence probe (the workload's own history alone decides, and at
    /// the defaults it seldom races enough: INCONCLUSIVE).
    #[arg(long, requires = "check")]
    no_probe: bool,
    /// Print one JSON object with the result on stdout.
    #[arg(long)]
    json: bool,
    /// Use the servers of this cluster file instead of an embedded cluster.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// With --cluster: the cluster's shared secret (see `rampkv server --secret-file`).
    #[arg(long, value_name = "FILE", requires = "cluster")]
    secret_file: Option<PathBuf>,
    /// TEST ONLY: readers skip the RAMP round-2 repair (the checker must then fail).
    #[arg(long, hide = true)]
    mutant_skip_repair: bool,
    /// Transport: tcp; sendrecv (two-sided send/recv emulated over shared memory); writepoll
    /// (GET+/PUT+ message rings over shared memory); onesided (GET* reads of item slots, PUT+
    /// writes); rfrpc (remote-fetch RPC over shared memory); inprocess (no transport: client
    /// threads call the embedded servers' cores: the protocol's own CPU cost).
    /// With --cluster, the ring transports use the servers' `ring`/`rfrpc` control addresses.
    #[arg(long, default_value = "tcp", value_parser = bench::TransportKind::from_name)]
    transport: bench::TransportKind,
    /// onesided: item slots per server.
    #[arg(long, default_value_t = rampkv::limits::ITEM_SLOTS_DEFAULT)]
    item_slots: usize,
    /// onesided: bytes per item slot (versions that do not fit are read over GET+). Default:
    /// fitted to the workload's largest version (key, metadata at --txn-size, value).
    #[arg(long)]
    item_slot_bytes: Option<usize>,
    /// onesided: fall back to GET+ when a slot's "newer version prepared" bit is set.
    #[arg(long)]
    getstar_newer_prepared_fallback: bool,
    /// The network model (on|off): each request gets its own seeded, long-tailed delay, so
    /// servers see different sessions' requests in different orders, as separate machines do.
    /// Default: on for the embedded cluster, off with --cluster.
    #[arg(long, value_parser = bench::Interleave::from_name)]
    interleave: Option<bench::Interleave>,
    /// Network model: fixed delay of every request (e.g. 20us, 1ms); real latency.
    #[arg(long, value_parser = bench::parse_network_duration_us, default_value = "0")]
    net_delay: u64,
    /// Network model: mean of each request's long-tailed random delay (e.g. 50us); real
    /// latency. Neither given: a 50 µs mean whose idle time is skipped.
    #[arg(long, value_parser = bench::parse_network_duration_us)]
    jitter: Option<u64>,
    /// Run this configuration over every transport in turn (--transport is ignored) and print
    /// a table side by side, with throughput ratios to TCP. With --json: one result per line.
    /// With --cluster: tcp and the transports of the front end the cluster file lists.
    #[arg(long)]
    compare: bool,
    /// Persistence of the embedded servers (not with --cluster): --data-dir DIR (server-<i>
    /// per server; an existing one is recovered first, and the start time printed),
    /// --appendfsync, --snapshot-every-bytes, --truncate-corrupt-log. The result then shows
    /// the logs' records and fsyncs per second, records per write and per fsync.
    #[command(flatten)]
    persistence: PersistenceArgs,
    #[command(flatten)]
    fabric: FabricArgs,
}

pub(crate) fn run(args: BenchArgs) -> Result<ExitCode> {
    SecretArgs { secret_file: args.secret_file.clone() }.install()?;
    args.fabric.install()?;
    let stop_after = match (&args.duration, args.txns) {
        (_, Some(count)) => StopAfter::Transactions { count },
        (Some(text), None) => StopAfter::Duration { seconds: parse_duration(text)?.as_secs_f64() },
        (None, None) => StopAfter::Duration { seconds: 10.0 },
    };
    let seed = args.seed.unwrap_or_else(clock_seed);
    let mut config = BenchConfig {
        algorithm: args.protocol,
        bloom: BloomParameters { bits: args.bloom_bits, hashes: args.bloom_hashes },
        servers: args.servers,
        replicas: args.replicas,
        replication_medium: args.replication_medium,
        server_threads: args.server_threads,
        gc_grace_ms: args.gc_grace_ms,
        clients: args.clients,
        client_threads: args.client_threads,
        txn_size: args.txn_size,
        read_ratio: args.read_ratio,
        keys: args.keys,
        value_size: args.value_size,
        workload: args.workload,
        preload: args.preload,
        stop_after,
        seed,
        cluster_file: args.cluster,
        history: args.history,
        check: args.check,
        probe: !args.no_probe,
        mutant_skip_repair: args.mutant_skip_repair,
        transport: args.transport,
        item_slots: rampkv::item_slots::ItemSlotConfig {
            slots: args.item_slots,
            slot_bytes: args.item_slot_bytes.unwrap_or(rampkv::limits::ITEM_SLOT_BYTES_DEFAULT),
        },
        getstar_newer_prepared_fallback: args.getstar_newer_prepared_fallback,
        network: bench::NetworkModel {
            interleave: args.interleave.unwrap_or_default(),
            delay_us: args.net_delay,
            jitter_us: args.jitter,
        },
        persistence: args
            .persistence
            .durability()
            .map(|(data_dir, durability)| bench::BenchPersistence { data_dir, durability }),
    };
    config.validate()?;
    if args.item_slot_bytes.is_none() {
        config.item_slots.slot_bytes = config.fitted_item_slot_bytes()?;
        config.validate()?;
    }
    say!("rampkv bench: seed {seed}");
    if args.compare {
        return run_comparison(&config, args.json);
    }
    let progress = ProgressBar::new(bench_goal(&config.stop_after), "rampkv bench");
    let result = bench::run(&config);
    progress.finish();
    let result = result?;
    if args.json {
        out!("{}", serde_json::to_string(&result)?);
    } else {
        out!("{result}");
        if let Some(line) = media_line(&take_chosen_media()) {
            out!("media: {line}");
        }
    }
    if args.ycsb {
        out_raw!("{}", result.ycsb_text());
    }
    Ok(check_exit_code(result.verdict))
}

/// The progress bar of a benchmark: its duration, or open-ended for a transaction count.
fn bench_goal(stop_after: &StopAfter) -> Goal {
    match *stop_after {
        StopAfter::Duration { seconds } => Goal::Time { total: Duration::from_secs_f64(seconds) },
        StopAfter::Transactions { .. } => Goal::Open,
    }
}

/// `--compare`: `config` over every transport (and in-process, but for S2PL), one table.
fn run_comparison(config: &BenchConfig, json: bool) -> Result<ExitCode> {
    let mut transports = bench::TransportKind::ALL.to_vec();
    // Against a cluster file: the transports its servers serve (tcp, and those of the front
    // end it lists); the embedded cluster serves every one, and in process too.
    if let Some(path) = &config.cluster_file {
        let cluster = rampkv::cluster::Cluster::from_file(path)?;
        transports.retain(|transport| transport.front().is_none_or(|front| cluster.front_addresses(front).is_ok()));
    }
    let in_process = config.algorithm != Algorithm::S2pl && config.cluster_file.is_none();
    if in_process {
        transports.push(bench::TransportKind::InProcess);
    }
    let progress = ProgressBar::new(Goal::Steps { total: transports.len() as u64 }, "rampkv bench --compare");
    let mut media = Vec::new();
    let results = bench::compare::run_each(config, &transports, |result| {
        progress.println(&format!(
            "rampkv bench --compare: {} done, {:.0} txn/s",
            result.transport, result.throughput_txn_per_s
        ));
        if let Some(line) = media_line(&take_chosen_media()) {
            media.push(format!("media of {}: {line}", result.transport));
        }
        progress.inc();
    });
    progress.finish();
    let results = results?;
    if json {
        for result in &results {
            out!("{}", serde_json::to_string(result)?);
        }
    } else {
        let first = &results[0];
        out!(
            "protocol {}, {} servers, {} clients, {} keys/txn, {:.0}% reads, {} keys, {} B values, seed {}",
            first.protocol,
            config.servers,
            config.clients,
            config.txn_size,
            config.read_ratio * 100.0,
            config.keys,
            config.value_size,
            config.seed
        );
        out!("machine: {} x {} ({})", first.machine.cpus, first.machine.cpu_model, first.machine.os);
        match rampkv::message::fabric::fabric_summary() {
            Some(fabric) => out!("fabric: {fabric}; the medium per server is in the media lines below\n"),
            None => out!("fabric: not opened\n"),
        }
        out_raw!("{}", bench::compare::comparison_table(&results));
        for line in results.iter().filter_map(bench::BenchResult::batching_line) {
            out!("\n{line}");
        }
        for line in &media {
            out!("{line}");
        }
        if in_process {
            out!(
                "\ninprocess: no transport at all: each client thread does its servers' work itself, so this row \
                 is the CPU cost of protocol, store and workload alone on --client-threads cores (the other rows \
                 also have a server poller thread)"
            );
        }
    }
    Ok(check_exit_code(results.iter().filter_map(|result| result.verdict)))
}
