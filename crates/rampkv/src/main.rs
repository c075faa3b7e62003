//! The `rampkv` command: a thin layer that parses flags, builds, and runs.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use rampkv::bench::{self, BenchConfig, StopAfter, Workload};
use rampkv::checker;
use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::limits::GC_GRACE_MS;
use rampkv::protocol::bloom::BloomParameters;
use rampkv::protocol::ramp::Algorithm;
use rampkv::recovery::RECOVERY_TIMEOUT_MS;
use rampkv::resp::gateway::{Gateway, GatewayConfig};
use rampkv::server::{ServerConfig, ServerGroup};

#[derive(Debug, Parser)]
#[command(
    name = "rampkv",
    version,
    about = "Read-atomic (RAMP) transactions over a partitioned in-memory key-value store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one server (one store) listening on ADDR.
    Server {
        /// Address to listen on, e.g. 127.0.0.1:7001.
        #[arg(long)]
        listen: SocketAddr,
        /// How long superseded versions stay readable, in milliseconds.
        #[arg(long, default_value_t = GC_GRACE_MS)]
        gc_grace_ms: u64,
        /// The cluster this server belongs to (its --listen address must be listed): enables
        /// cooperative termination of transactions whose writer died.
        #[arg(long)]
        cluster: Option<PathBuf>,
    },
    /// Run a local cluster of several servers in this process and write its cluster file.
    Local {
        /// Number of servers.
        #[arg(long, default_value_t = 4)]
        servers: usize,
        /// First port; server i listens on base-port + i (0: any free ports).
        #[arg(long, default_value_t = 0)]
        base_port: u16,
        /// Where to write the cluster file.
        #[arg(long, default_value = "cluster.toml")]
        cluster_file: PathBuf,
        /// Also serve the Redis protocol (RESP) on 127.0.0.1:PORT (see docs/resp.md).
        #[arg(long)]
        resp_port: Option<u16>,
    },
    /// Serve the Redis protocol (RESP) for a running cluster: rampkv gateway --cluster FILE --listen ADDR
    Gateway {
        #[arg(long)]
        cluster: PathBuf,
        /// Address to listen on, e.g. 127.0.0.1:6379.
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Write keys atomically: rampkv put k1=v1 k2=v2 --cluster FILE
    Put {
        /// KEY=VALUE pairs.
        #[arg(required = true)]
        pairs: Vec<String>,
        #[arg(long)]
        cluster: PathBuf,
    },
    /// Read keys atomically: rampkv get k1 k2 --cluster FILE
    Get {
        #[arg(required = true)]
        keys: Vec<String>,
        #[arg(long)]
        cluster: PathBuf,
    },
    /// Run the closed-loop benchmark (an embedded local cluster unless --cluster is given).
    Bench(BenchArgs),
    /// Check a recorded history for read atomicity (exit status 1 on any anomaly).
    Check {
        /// The history file (JSON lines).
        file: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Workload: micro (the paper's micro-benchmark, uniform keys), micro-zipfian, or a YCSB
    /// core workload a, b, c, d or f (--keys is its recordcount; its own read proportion).
    #[arg(long, default_value = "micro", value_parser = Workload::from_name)]
    workload: Workload,
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
    /// Fraction of read-only transactions (0 to 1).
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
    /// Check the history for read atomicity at the end; exit status 1 on any anomaly.
    #[arg(long)]
    check: bool,
    /// Print one JSON object with the result on stdout.
    #[arg(long)]
    json: bool,
    /// Use the servers of this cluster file instead of an embedded cluster.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// TEST ONLY: readers skip the RAMP round-2 repair (the checker must then fail).
    #[arg(long, hide = true)]
    mutant_skip_repair: bool,
    /// Transport: tcp, or writepoll (GET+/PUT+ message rings over shared memory; embedded
    /// cluster only), or rfrpc (remote-fetch RPC over shared memory; embedded cluster only).
    #[arg(long, default_value = "tcp", value_parser = bench::TransportKind::from_name)]
    transport: bench::TransportKind,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Server { listen, gc_grace_ms, cluster } => {
            let mut group = ServerGroup::spawn(&[ServerConfig { listen, gc_grace_ms }])
                .with_context(|| format!("cannot listen on {listen}"))?;
            if let Some(path) = cluster {
                let cluster = Cluster::from_file(&path)?;
                let index = cluster.servers().iter().position(|address| {
                    address.parse::<SocketAddr>().is_ok_and(|address| address == listen)
                        || *address == listen.to_string()
                });
                let Some(index) = index else {
                    bail!("{listen} is not one of the servers in {}", path.display());
                };
                group.start_recovery(cluster, index, RECOVERY_TIMEOUT_MS).context("cannot start recovery")?;
            }
            eprintln!("rampkv server listening on {}", group.addresses()[0]);
            group.wait().context("server failed")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Local { servers, base_port, cluster_file, resp_port } => {
            run_local(servers, base_port, &cluster_file, resp_port)
        }
        Command::Gateway { cluster, listen } => {
            let gateway = Gateway::spawn(&Cluster::from_file(&cluster)?, &GatewayConfig::new(listen))?;
            eprintln!("rampkv gateway: RESP on {}", gateway.address());
            gateway.wait()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Put { pairs, cluster } => {
            let pairs = pairs.iter().map(|pair| parse_pair(pair)).collect::<Result<Vec<_>>>()?;
            let cluster = Cluster::from_file(&cluster)?;
            let ts = Client::connect(&cluster)?.put_all(pairs)?;
            println!("OK ts={ts}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Get { keys, cluster } => {
            let cluster = Cluster::from_file(&cluster)?;
            let outcome = Client::connect(&cluster)?.get_all(keys.into_iter().map(String::into_bytes).collect())?;
            let mut stdout = std::io::stdout().lock();
            for item in outcome.items {
                let key = String::from_utf8_lossy(&item.key);
                if item.ts == 0 {
                    writeln!(stdout, "{key} (nil)")?;
                } else {
                    writeln!(stdout, "{key}={}", String::from_utf8_lossy(&item.value))?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => run_bench(args),
        Command::Check { file, json } => {
            let report = checker::check_file(&file).with_context(|| format!("cannot check {}", file.display()))?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{report}");
            }
            Ok(if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
    }
}

fn run_local(servers: usize, base_port: u16, cluster_file: &PathBuf, resp_port: Option<u16>) -> Result<ExitCode> {
    if !(1..=64).contains(&servers) {
        bail!("--servers must be 1..=64, got {servers}");
    }
    let configs = (0..servers)
        .map(|index| {
            let port = if base_port == 0 { 0 } else { base_port.checked_add(index as u16).context("port overflow")? };
            Ok(ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], port))))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut group = ServerGroup::spawn(&configs).context("cannot start the local cluster")?;
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect())?;
    group.start_recovery(cluster.clone(), 0, RECOVERY_TIMEOUT_MS).context("cannot start recovery")?;
    std::fs::write(cluster_file, cluster.to_toml())
        .with_context(|| format!("cannot write {}", cluster_file.display()))?;
    eprintln!(
        "rampkv local cluster: {servers} servers on {}; cluster file {}",
        group.addresses().iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(", "),
        cluster_file.display()
    );
    let _gateway = match resp_port {
        Some(port) => {
            let config = GatewayConfig::new(SocketAddr::from(([127, 0, 0, 1], port)));
            let gateway = Gateway::spawn(&cluster, &config).context("cannot start the RESP gateway")?;
            eprintln!(
                "rampkv local cluster: RESP on {} (try redis-cli -p {})",
                gateway.address(),
                gateway.address().port()
            );
            Some(gateway)
        }
        None => None,
    };
    group.wait().context("local cluster failed")?;
    Ok(ExitCode::SUCCESS)
}

fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    Algorithm::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Algorithm::ALL.iter().map(Algorithm::name).collect();
        format!("unknown protocol {name:?}; choose one of {}", known.join(", "))
    })
}

/// Splits `KEY=VALUE` at the first `=`.
fn parse_pair(pair: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    match pair.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.as_bytes().to_vec(), value.as_bytes().to_vec())),
        _ => bail!("expected KEY=VALUE with a non-empty key, got {pair:?}"),
    }
}

/// Parses `10s`, `500ms`, `2m`, `1.5s` or a plain number of seconds.
fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    let (number, scale) = if let Some(number) = text.strip_suffix("ms") {
        (number, 0.001)
    } else if let Some(number) = text.strip_suffix('s') {
        (number, 1.0)
    } else if let Some(number) = text.strip_suffix('m') {
        (number, 60.0)
    } else {
        (text, 1.0)
    };
    let value: f64 =
        number.trim().parse().with_context(|| format!("invalid duration {text:?} (try 10s, 500ms, 2m)"))?;
    let seconds = value * scale;
    if !(seconds.is_finite() && seconds > 0.0) {
        bail!("duration must be positive, got {text:?}");
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn run_bench(args: BenchArgs) -> Result<ExitCode> {
    let stop_after = match (&args.duration, args.txns) {
        (_, Some(count)) => StopAfter::Transactions { count },
        (Some(text), None) => StopAfter::Duration { seconds: parse_duration(text)?.as_secs_f64() },
        (None, None) => StopAfter::Duration { seconds: 10.0 },
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.as_nanos() as u64)
    });
    let config = BenchConfig {
        algorithm: args.protocol,
        bloom: BloomParameters { bits: args.bloom_bits, hashes: args.bloom_hashes },
        servers: args.servers,
        server_threads: args.server_threads,
        gc_grace_ms: args.gc_grace_ms,
        clients: args.clients,
        client_threads: args.client_threads,
        txn_size: args.txn_size,
        read_ratio: args.read_ratio,
        keys: args.keys,
        value_size: args.value_size,
        workload: args.workload,
        stop_after,
        seed,
        cluster_file: args.cluster,
        history: args.history,
        check: args.check,
        mutant_skip_repair: args.mutant_skip_repair,
        transport: args.transport,
    };
    config.validate()?;
    eprintln!("rampkv bench: seed {seed}");
    let result = bench::run(&config)?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{result}");
    }
    if args.ycsb {
        print!("{}", result.ycsb_text());
    }
    let clean = result.check.as_ref().is_none_or(|report| report.is_clean());
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_documented_forms_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "abc", "-1s", "0", "nan", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn pairs_split_at_the_first_equals_sign() {
        assert_eq!(parse_pair("k=v=w").unwrap(), (b"k".to_vec(), b"v=w".to_vec()));
        assert_eq!(parse_pair("k=").unwrap(), (b"k".to_vec(), b"".to_vec()));
        assert!(parse_pair("=v").is_err());
        assert!(parse_pair("novalue").is_err());
    }
}
