//! `rampkv chaos`: the fault test (docs/reliability.md). Server processes started from this
//! binary, a workload recording its history, a nemesis that kills and restarts servers; then
//! the checker and the read-back.
//!
//! # Contract
//! Exit status: 0 passed, 1 failed (lost writes, anomalies, unavailability), 2 an error, 130
//! interrupted. Ctrl-C (and SIGTERM, SIGHUP) end the run through its own clean-up: every
//! server killed by pid, every namespace removed. The seed is printed before the run, so any run
//! replays.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use rampkv::bench;
use rampkv::chaos;

use super::args::{FabricArgs, SecretArgs};
use super::clock_seed;
use super::output::{out, out_raw, say};
use super::parse::{parse_duration, parse_duration_range};

#[derive(Debug, Args)]
pub(crate) struct ChaosArgs {
    /// Server processes (`rampkv server`, started from this binary).
    #[arg(long, default_value_t = 3)]
    servers: usize,
    /// The cluster's shared secret: the servers require it, the workload proves it.
    #[command(flatten)]
    secret: SecretArgs,
    /// Also given to every server the run starts.
    #[command(flatten)]
    fabric: FabricArgs,
    /// Copies of every partition: the servers replicate, fail over and rejoin (configuration
    /// service); the nemesis then kills only while every partition has its full replica set
    /// (it waits for a server to catch up). Above 1: kill-one, pause, partition, mixed or none,
    /// and kill-all with --data-dir.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// How long the workload runs (e.g. 60s, 2m).
    #[arg(long, default_value = "60s")]
    duration: String,
    /// Seed of the whole schedule (faults, victims, durations) and the workload (default:
    /// random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Faults: kill-one (SIGKILL a random server, restart it later; one at a time), kill-all
    /// (SIGKILL every server at once, restart all on the same --data-dir), pause (SIGSTOP a
    /// primary past its lease until it is deposed, then SIGCONT), partition (cut a primary off
    /// from every other server and the configuration service while clients still reach it,
    /// then heal; network namespaces only), mixed (each fault drawn from kill-one, pause and
    /// partition, and kill-all with --data-dir), none. kill-all with --replicas needs
    /// --data-dir (the servers and the configuration service resume from their directories).
    #[arg(long, default_value = "kill-one", value_parser = chaos::NemesisKind::from_name)]
    nemesis: chaos::NemesisKind,
    /// Time from one fault to the next, drawn per fault from MIN..MAX (or exactly DURATION).
    #[arg(long, value_name = "MIN..MAX", default_value = "2s..5s")]
    kill_interval: String,
    /// How long a fault lasts, drawn per fault from MIN..MAX: a killed server's down time; a
    /// pause or partition at least this and 503 ms, and with replication until its victim is
    /// deposed.
    #[arg(long, value_name = "MIN..MAX", default_value = "500ms..1500ms")]
    restart_after: String,
    /// Data directory of the servers (each gets DIR/server-<i>; must be empty). Needs servers
    /// with --data-dir (persistence).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// How the workload reaches the servers: tcp, sendrecv, writepoll, onesided or rfrpc (the
    /// servers get the matching front end).
    #[arg(long, default_value = "tcp", value_parser = bench::TransportKind::from_name)]
    transport: bench::TransportKind,
    /// Where the history goes (JSON lines, streamed; default: the run's working directory).
    #[arg(long)]
    history: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Fail when no transaction completed for longer than this many milliseconds.
    #[arg(long)]
    max_unavailable_ms: Option<u64>,
    /// Where the servers live: auto (namespaces as root where `ip netns` works, else
    /// loopback), loopback, or namespaces (an error where unavailable).
    #[arg(long, default_value = "auto", value_parser = chaos::NetworkChoice::from_name)]
    network: chaos::NetworkChoice,
    /// Client threads of the workload (each reconnects on its own after a failure).
    #[arg(long, default_value_t = 3)]
    client_threads: usize,
    /// Logical clients (closed-loop sessions) over all client threads.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Size of the key space (small, so that reads race writes; all of it is read back).
    #[arg(long, default_value_t = 16)]
    keys: u64,
    /// Keys per transaction.
    #[arg(long, default_value_t = 3)]
    txn_size: usize,
    /// Fraction of read-only transactions (the rest write).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Bytes per value (at least 8: the writer's timestamp comes first).
    #[arg(long, default_value_t = 32)]
    value_size: usize,
}

pub(crate) fn run(args: ChaosArgs) -> Result<ExitCode> {
    let program = std::env::current_exe().context("cannot find this binary (to start its servers)")?;
    let seed = args.seed.unwrap_or_else(clock_seed);
    let config = chaos::ChaosConfig {
        servers: args.servers,
        replicas: args.replicas,
        duration: parse_duration(&args.duration).context("--duration")?,
        seed,
        nemesis: args.nemesis,
        kill_interval: parse_duration_range(&args.kill_interval).context("--kill-interval")?,
        restart_after: parse_duration_range(&args.restart_after).context("--restart-after")?,
        data_dir: args.data_dir,
        transport: args.transport,
        history: args.history,
        network: args.network,
        max_unavailable_ms: args.max_unavailable_ms,
        client_threads: args.client_threads,
        clients: args.clients,
        keys: args.keys,
        txn_size: args.txn_size,
        read_ratio: args.read_ratio,
        value_size: args.value_size,
        secret_file: args.secret.secret_file.clone(),
        ..chaos::ChaosConfig::new(program)
    };
    args.secret.install()?;
    args.fabric.install()?;
    config.validate()?;
    // Ctrl-C (and SIGTERM, SIGHUP) end the run through its own clean-up: servers killed by pid,
    // namespaces deleted.
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("cannot install the Ctrl-C handler")?;
    say!("rampkv chaos: seed {seed} (replay with --seed {seed})");
    match chaos::run(&config, &interrupted, &|line: &str| say!("{line}")) {
        Ok(report) => {
            if args.json {
                out!("{}", serde_json::to_string(&report)?);
            } else {
                out_raw!("{report}");
            }
            Ok(if report.passed { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Err(chaos::ChaosError::Interrupted) => {
            say!("rampkv chaos: interrupted; every server killed, every namespace removed");
            Ok(ExitCode::from(130))
        }
        Err(error) => Err(error.into()),
    }
}
