//! The `rampkv` command: a thin layer that parses flags, builds, and runs.
#![forbid(unsafe_code)]

/// mimalloc: the protocol core allocates small vectors per request and reply; a third of the
/// CPU of an in-process run was glibc malloc/free (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use rampkv::auth::SharedSecret;
use rampkv::bench::{self, BenchConfig, StopAfter, Workload};
use rampkv::chaos;
use rampkv::checker;
use rampkv::client::Client;
use rampkv::cluster::{Cluster, Front};
use rampkv::config::core::StartMode;
use rampkv::durable::FsyncPolicy;
use rampkv::figures;
use rampkv::item_slots::ItemSlotConfig;
use rampkv::limits::FAILOVER_FIRST_LEASE_WAIT_MS_MAX;
use rampkv::limits::GC_GRACE_MS;
use rampkv::progress::{Goal, ProgressBar};
use rampkv::protocol::bloom::BloomParameters;
use rampkv::protocol::ramp::Algorithm;
use rampkv::recovery::RECOVERY_TIMEOUT_MS;
use rampkv::resp::auth::Users;
use rampkv::resp::gateway::{Gateway, GatewayConfig, InProcessServers};
use rampkv::server::durable::{cluster_data_dirs, DurabilityConfig};
use rampkv::server::failover::FirstLease;
use rampkv::server::front::FrontEnd;
use rampkv::server::{
    ConnectionLimits, Durability, FailoverOptions, ReplicationMedium, ReplicationOptions, ReplicationPeers,
    ServerConfig, ServerGroup, ServerOptions,
};

/// Writes a line to stderr. A closed stderr (a reader that went away) is not an error worth a
/// panic, which `eprintln!` would raise: the line is dropped.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Writes a line to stdout; as [`say!`], a closed stdout (`rampkv bench | head -1`) drops it
/// instead of panicking as `println!` would.
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`out!`] without the line end.
macro_rules! out_raw {
    ($($arg:tt)*) => {{
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

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
        /// Also serve the ring transports (writepoll, sendrecv, onesided) over the shared-memory
        /// fabric, with their control port on ADDR; list it as `ring = "ADDR"` in the cluster
        /// file. Clients must run on this machine (/dev/shm).
        #[arg(long, value_name = "ADDR", conflicts_with = "rfrpc_listen")]
        ring_listen: Option<SocketAddr>,
        /// Also serve remote-fetch RPC (rfrpc), control port on ADDR (`rfrpc = "ADDR"`). A
        /// server has one one-sided front end: this or --ring-listen.
        #[arg(long, value_name = "ADDR")]
        rfrpc_listen: Option<SocketAddr>,
        /// With --ring-listen: item slots for GET* (onesided); 0: none, onesided reads use GET+.
        #[arg(long, default_value_t = rampkv::limits::ITEM_SLOTS_DEFAULT)]
        item_slots: usize,
        /// With --ring-listen: bytes per item slot (versions that do not fit are read over GET+).
        #[arg(long, default_value_t = rampkv::limits::ITEM_SLOT_BYTES_DEFAULT)]
        item_slot_bytes: usize,
        #[command(flatten)]
        secret: SecretArgs,
        /// Protected mode for the binary ports: a server without --secret-file refuses to listen
        /// (data, ring or rfrpc port) on an address other than loopback. This flag lets it,
        /// open to anyone who can reach it.
        #[arg(long)]
        insecure_no_secret: bool,
        /// Close a TCP connection that sent no request for SECONDS (0: never), as Redis's
        /// `timeout`. Clients reconnect only when a transaction fails, so set it only where
        /// idle connections must not hold the server's connection slots.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        timeout: u64,
        #[command(flatten)]
        persistence: PersistenceArgs,
        /// Exit (status 1) when standard input reaches its end: a supervisor that holds the
        /// write end of a pipe as the server's stdin takes its server down with it, even when it
        /// is killed with SIGKILL (the fault test, `rampkv chaos`, does).
        #[arg(long)]
        exit_on_stdin_eof: bool,
        /// With `replicas` above 1 in the cluster file: how records reach the backups. tcp:
        /// messages on the replication port; onesided: one-sided writes into a log region each
        /// backup registers on the shared-memory fabric (FaRM's way; servers on one host).
        /// Default: onesided when every server's `replicate` address is a loopback one (the
        /// servers share this host's fabric), tcp otherwise. A backup takes either.
        #[arg(long, value_name = "MEDIUM")]
        replication_medium: Option<ReplicationMedium>,
    },
    /// Run a local cluster of several servers in this process and write its cluster file.
    Local {
        /// Number of servers.
        #[arg(long, default_value_t = 4)]
        servers: usize,
        /// Copies of every partition (f + 1): server i's records are replicated synchronously
        /// to the N - 1 servers after it, and a write is acknowledged only once every backup
        /// holds it (docs/replication.md says what is promised). At most --servers.
        #[arg(long, default_value_t = 1, value_name = "N")]
        replicas: u32,
        /// With --replicas above 1: onesided (records written into a log region each backup
        /// registers, held once landed, applied by the backup off the write's path) or tcp
        /// (held once the backup applied it and said so).
        #[arg(long, value_name = "MEDIUM", default_value = "onesided")]
        replication_medium: ReplicationMedium,
        /// First port; server i listens on base-port + i (0: any free ports).
        #[arg(long, default_value_t = 0)]
        base_port: u16,
        /// Where to write the cluster file.
        #[arg(long, default_value = "cluster.toml")]
        cluster_file: PathBuf,
        /// Also serve the Redis protocol (RESP) on PORT of --resp-bind (see docs/resp.md).
        #[arg(long)]
        resp_port: Option<u16>,
        /// The address the RESP port listens on. An address other than loopback needs a
        /// password (--requirepass, --aclfile) unless --protected-mode no.
        #[arg(long, value_name = "IP", default_value = "127.0.0.1", requires = "resp_port")]
        resp_bind: IpAddr,
        #[command(flatten)]
        resp_auth: RespAuthArgs,
        /// The servers' one-sided front end, written into the cluster file: ring (writepoll,
        /// sendrecv, onesided clients), rfrpc, or none.
        #[arg(long, value_enum, default_value_t = FrontChoice::Ring)]
        front: FrontChoice,
        #[command(flatten)]
        secret: SecretArgs,
        #[command(flatten)]
        persistence: PersistenceArgs,
    },
    /// Serve the Redis protocol (RESP) for a running cluster: rampkv gateway --cluster FILE --listen ADDR
    Gateway {
        #[arg(long)]
        cluster: PathBuf,
        /// Address to listen on. An address other than loopback needs a password
        /// (--requirepass, --aclfile) unless --protected-mode no.
        #[arg(long, default_value = "127.0.0.1:6379")]
        listen: SocketAddr,
        #[command(flatten)]
        resp_auth: RespAuthArgs,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Write keys atomically: rampkv put k1=v1 k2=v2 --cluster FILE
    Put {
        /// KEY=VALUE pairs.
        #[arg(required = true)]
        pairs: Vec<String>,
        #[arg(long)]
        cluster: PathBuf,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Read keys atomically: rampkv get k1 k2 --cluster FILE
    Get {
        #[arg(required = true)]
        keys: Vec<String>,
        #[arg(long)]
        cluster: PathBuf,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Run the closed-loop benchmark (an embedded local cluster unless --cluster is given).
    Bench(BenchArgs),
    /// Reproduce the reference paper's four figures: benchmark sweeps written as SVG plots,
    /// Markdown tables with the paper's ratios, and every point's result (see docs/figures.md).
    Figures(FiguresArgs),
    /// Fault test: server processes (each in a network namespace of its own where the machine
    /// allows), a workload recording its history, a nemesis that kill -9's servers and restarts
    /// them; then the checker, a read-back of every key against its last acknowledged write, and
    /// the longest window with no completed transaction. Exit status: 0 passed, 1 failed (lost
    /// writes, anomalies, unavailability), 2 an error, 130 interrupted. See docs/reliability.md.
    Chaos(ChaosArgs),
    /// Check a recorded history for read atomicity. Exit status: 0 clean, 1 violated (or not
    /// checkable), 3 inconclusive (no anomaly, but no race showed the run could catch one),
    /// 2 an error (say, a malformed line). A last line cut short (a killed run) is left out.
    Check {
        /// The history file (JSON lines).
        file: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The cluster's shared secret (docs/security.md).
#[derive(Debug, Args)]
struct SecretArgs {
    /// The cluster's shared secret: a file of at least 32 bytes (e.g. head -c 32 /dev/urandom)
    /// that only its owner may access (chmod 600). Servers require every client of their binary
    /// and control ports to prove it; clients (and servers talking to each other) prove it. Give
    /// every server and client of a cluster the same file.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
}

impl SecretArgs {
    /// Reads the secret (a clear error if the file is unfit) and makes it the secret this
    /// process's clients prove. Returns it for the servers to require.
    fn install(&self) -> Result<Option<Arc<SharedSecret>>> {
        let Some(path) = &self.secret_file else { return Ok(None) };
        let secret = Arc::new(SharedSecret::from_file(path).context("--secret-file")?);
        rampkv::auth::set_client_secret(Some(Arc::clone(&secret)));
        Ok(Some(secret))
    }
}

/// Protected mode for the binary ports (Redis's, for the RESP port): a server without a shared
/// secret that would listen on an address other than loopback refuses to start, unless
/// `--insecure-no-secret`. The refusal, if any.
fn binary_protected_mode_refusal(addresses: &[SocketAddr], secret: bool, insecure_no_secret: bool) -> Option<String> {
    if secret || insecure_no_secret {
        return None;
    }
    let open = addresses.iter().find(|address| !address.ip().is_loopback())?;
    Some(format!(
        "protected mode: without --secret-file this server would let anyone who reaches {open} read and write \
         every key; give it --secret-file FILE (the same file on every server and client), listen on a loopback \
         address, or pass --insecure-no-secret"
    ))
}

/// Persistence of the servers' stores (docs/persistence.md).
#[derive(Debug, Args)]
struct PersistenceArgs {
    /// Keep the store in DIR across restarts: an append-only log of every change (written
    /// before the change is acknowledged) and snapshots; a restart on the same DIR recovers.
    /// One server per directory (it is locked). `rampkv local` and `rampkv bench`: one
    /// subdirectory server-<i> per server. Without it nothing survives a restart.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// When the log is fsynced, as Redis's appendfsync. always: before each acknowledgement
    /// (group commit: concurrent ones share an fsync); no acknowledged write is ever lost.
    /// everysec (the default, as in Redis): once a second in the background; a process crash
    /// loses nothing acknowledged, a power cut about the last second. no: when the operating
    /// system writes back.
    #[arg(long, value_name = "POLICY", default_value = "everysec", value_parser = parse_policy, requires = "data_dir")]
    appendfsync: FsyncPolicy,
    /// Write a snapshot of the store in the background after this many bytes of log (the log
    /// it covers is then dropped; a restart loads it and replays only the log after it).
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = rampkv::durable::limits::SNAPSHOT_EVERY_BYTES_DEFAULT,
        value_parser = clap::value_parser!(u64).range(rampkv::durable::limits::SNAPSHOT_EVERY_BYTES_MIN..),
        requires = "data_dir"
    )]
    snapshot_every_bytes: u64,
    /// A log damaged in the middle (a checksum mismatch a later record vouches for) refuses to
    /// start, naming the file and offset; with this flag it is cut there instead (everything
    /// after the damage is dropped) and the cut is reported. A torn tail (a crash during a
    /// write) is always cut and reported.
    #[arg(long, requires = "data_dir")]
    truncate_corrupt_log: bool,
}

impl PersistenceArgs {
    /// The data directory and how to keep it, if one was given.
    fn durability(&self) -> Option<(PathBuf, DurabilityConfig)> {
        let config = DurabilityConfig {
            policy: self.appendfsync,
            truncate_corrupt: self.truncate_corrupt_log,
            snapshot_every_bytes: self.snapshot_every_bytes,
        };
        self.data_dir.clone().map(|dir| (dir, config))
    }
}

fn parse_policy(name: &str) -> Result<FsyncPolicy, rampkv::types::UnknownName> {
    name.parse().map_err(|_| rampkv::types::UnknownName {
        what: "fsync policy",
        name: name.to_owned(),
        choices: vec!["always", "everysec", "no"],
    })
}

/// Starts the servers of `configs` with `options`, and prints what each recovery found (with
/// persistence: one data directory per server).
fn spawn_servers(configs: &[ServerConfig], options: &ServerOptions, command: &str) -> Result<ServerGroup> {
    let (group, reports) = ServerGroup::start(configs, options).context("cannot start the servers")?;
    let Some(durability) = &options.durability else {
        return Ok(group);
    };
    for ((dir, report), address) in durability.dirs.iter().zip(&reports).zip(group.addresses()) {
        say!("{command}: {address} recovered {} (appendfsync {}): {report}", dir.display(), durability.config.policy);
    }
    // A log that stops (a failed write or fsync) takes the process with it: nothing more can be
    // made durable, and the replies waiting for it are never sent.
    let servers = Arc::clone(group.servers());
    let command = command.to_owned();
    std::thread::Builder::new().name("rampkv-log-watch".into()).spawn(move || loop {
        std::thread::sleep(Duration::from_millis(PERSISTENCE_WATCH_MS));
        if let Some((index, error)) = servers.persistence_failure() {
            say!("{command}: the log of server {index} failed: {error}; stopping (restart to recover from the files)");
            std::process::exit(1);
        }
    })?;
    Ok(group)
}

/// How often a server process checks that its logs still work.
const PERSISTENCE_WATCH_MS: u64 = 100;

/// Who may use a RESP gateway (docs/resp.md, "Authentication").
#[derive(Debug, Args)]
struct RespAuthArgs {
    /// Require this password of RESP clients (Redis's requirepass): `AUTH PASSWORD`, or
    /// `HELLO 3 AUTH default PASSWORD`. Other local users can read it in the process list:
    /// prefer --aclfile with a hashed (#<sha256>) password.
    #[arg(long, value_name = "PASSWORD", conflicts_with = "aclfile")]
    requirepass: Option<String>,
    /// Users, passwords and permissions from a Redis ACL file (the subset in docs/resp.md:
    /// on/off, >password, #sha256, nopass; permissions all or nothing).
    #[arg(long, value_name = "FILE")]
    aclfile: Option<PathBuf>,
    /// Redis's protected mode: a gateway that lets anyone in (no password for the default
    /// user) refuses to listen on an address other than loopback. `no` turns the check off.
    #[arg(long, value_enum, default_value_t = YesNo::Yes)]
    protected_mode: YesNo,
    /// Close a RESP connection idle for SECONDS (0: never), as Redis's `timeout`.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    timeout: u64,
}

/// Redis's spelling of a boolean setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum YesNo {
    Yes,
    No,
}

impl RespAuthArgs {
    /// The gateway's users.
    fn users(&self) -> Result<Users> {
        match (&self.requirepass, &self.aclfile) {
            (Some(password), _) if password.is_empty() => {
                bail!("--requirepass needs a non-empty password (leave the flag out for a gateway without one)")
            }
            (Some(password), _) => Ok(Users::with_default_password(password.as_bytes())),
            (None, Some(path)) => Ok(Users::from_acl_file(path)?),
            (None, None) => Ok(Users::open()),
        }
    }

    /// `config` with these users and protected mode.
    fn apply(&self, config: GatewayConfig) -> Result<GatewayConfig> {
        Ok(GatewayConfig {
            users: Arc::new(self.users()?),
            protected_mode: self.protected_mode == YesNo::Yes,
            idle_timeout: (self.timeout > 0).then(|| Duration::from_secs(self.timeout)),
            ..config
        })
    }
}

#[derive(Debug, Args)]
struct BenchArgs {
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
    #[arg(long)]
    compare: bool,
    /// Persistence of the embedded servers (not with --cluster): --data-dir DIR (server-<i>
    /// per server; an existing one is recovered first, and the start time printed),
    /// --appendfsync, --snapshot-every-bytes, --truncate-corrupt-log. The result then shows
    /// the logs' records and fsyncs per second, records per write and per fsync.
    #[command(flatten)]
    persistence: PersistenceArgs,
}

#[derive(Debug, Args)]
struct ChaosArgs {
    /// Server processes (`rampkv server`, started from this binary).
    #[arg(long, default_value_t = 3)]
    servers: usize,
    /// The cluster's shared secret: the servers require it, the workload proves it.
    #[command(flatten)]
    secret: SecretArgs,
    /// Copies of every partition: the servers replicate, fail over and rejoin (configuration
    /// service); the nemesis then kills only while every partition has its full replica set
    /// (it waits for a server to catch up). Above 1: kill-one or none.
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// How long the workload runs (e.g. 60s, 2m).
    #[arg(long, default_value = "60s")]
    duration: String,
    /// Seed of the whole schedule (kills, victims, down times) and the workload (default:
    /// random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Faults: kill-one (SIGKILL a random server, restart it later; one at a time), kill-all
    /// (SIGKILL every server at once, restart all on the same --data-dir), none.
    #[arg(long, default_value = "kill-one", value_parser = chaos::NemesisKind::from_name)]
    nemesis: chaos::NemesisKind,
    /// Time from one kill to the next, drawn per kill from MIN..MAX (or exactly DURATION).
    #[arg(long, value_name = "MIN..MAX", default_value = "2s..5s")]
    kill_interval: String,
    /// Time a killed server stays down before its restart, drawn per kill from MIN..MAX.
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

#[derive(Debug, Args)]
struct FiguresArgs {
    /// Fewer points of a fraction of a second each: a smoke test for CI (the default).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Every point, seconds each: for numbers, on a quiet machine.
    #[arg(long)]
    full: bool,
    /// Output directory (index.md, NAME.md, NAME.svg, summary.json, results/).
    #[arg(long, default_value = "target/figures")]
    out: PathBuf,
    /// Only these figures (comma-separated): comm, txnsize, readratio, ycsb.
    #[arg(long, value_delimiter = ',', value_parser = figures::Sweep::from_name)]
    only: Vec<figures::Sweep>,
    /// Seed of every point.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measured time per point instead of the mode's (e.g. 2s, 500ms).
    #[arg(long)]
    point_duration: Option<String>,
    /// Check every point's history for read atomicity (slower; exit status 1 on any anomaly).
    /// Each point's verdict and evidence go into its table; an inconclusive point (at 100%
    /// reads there is nothing to race) does not change the exit status.
    #[arg(long)]
    check: bool,
}

/// Exits the process once standard input reaches its end or fails (`--exit-on-stdin-eof`).
fn watch_stdin() -> std::io::Result<()> {
    std::thread::Builder::new().name("rampkv-stdin".into()).spawn(|| {
        let mut buffer = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        loop {
            match std::io::Read::read(&mut stdin, &mut buffer) {
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(0) | Err(_) => {
                    eprintln!("rampkv server: standard input closed (--exit-on-stdin-eof): exiting");
                    std::process::exit(1);
                }
                Ok(_) => {}
            }
        }
    })?;
    Ok(())
}

fn main() -> ExitCode {
    // Before any thread starts and before the stores grow: fresh huge pages stall the thread
    // that touches them for milliseconds here (`rampkv::pages`).
    rampkv::pages::disable_transparent_huge_pages();
    let cli = Cli::parse();
    rampkv::logging::init();
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            say!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<ExitCode> {
    match command {
        Command::Server {
            listen,
            gc_grace_ms,
            cluster,
            ring_listen,
            rfrpc_listen,
            item_slots,
            item_slot_bytes,
            secret,
            insecure_no_secret,
            timeout,
            persistence,
            exit_on_stdin_eof,
            replication_medium,
        } => {
            if exit_on_stdin_eof {
                watch_stdin().context("cannot watch standard input (--exit-on-stdin-eof)")?;
            }
            let secret = secret.install()?;
            let addresses: Vec<SocketAddr> = [Some(listen), ring_listen, rfrpc_listen].into_iter().flatten().collect();
            if let Some(refusal) = binary_protected_mode_refusal(&addresses, secret.is_some(), insecure_no_secret) {
                bail!(refusal); // before anything listens
            }
            let idle_timeout_ms = timeout.checked_mul(1_000).context("--timeout is out of range")?;
            let limits = ConnectionLimits { idle_timeout_ms, ..ConnectionLimits::default() };
            let durability = persistence.durability().map(|(dir, config)| Durability { dirs: vec![dir], config });
            let has_cluster = cluster.is_some();
            // The cluster file first: it says where this server is and whether it replicates.
            let membership = match &cluster {
                Some(path) => {
                    let file = Cluster::from_file(path)?;
                    let index = file.servers().iter().position(|address| {
                        address.parse::<SocketAddr>().is_ok_and(|address| address == listen)
                            || *address == listen.to_string()
                    });
                    let Some(index) = index else {
                        bail!("{listen} is not one of the servers in {}", path.display());
                    };
                    Some((file, index))
                }
                None => None,
            };
            // Failover needs the configuration service: a replicated cluster file whose servers
            // have `config` addresses. Its node starts first (bootstrapping the cluster, or
            // rejoining it after a restart).
            let failover = match &membership {
                Some((file, index)) if file.replicas() > 1 && file.config_addresses().is_ok() => {
                    let data_dir = durability.as_ref().and_then(|durability| durability.dirs.first());
                    let (gate, mode) = rampkv::server::failover::start_config_node(
                        file,
                        *index,
                        secret.clone(),
                        data_dir.map(|d| d.as_path()),
                    )
                    .context("cannot start the configuration service")?;
                    Some((FailoverOptions { gate, cluster: file.clone(), index: *index }, mode))
                }
                _ => None,
            };
            // A bootstrapping server waits for its first lease (its listeners open only then).
            // One that restarted, or that the cluster failed over before it got a lease (it
            // started too late), holds nothing and serves nothing until it caught up (rejoin).
            let first_lease = match &failover {
                Some((options, StartMode::Bootstrap)) => {
                    let wait = Duration::from_millis(FAILOVER_FIRST_LEASE_WAIT_MS_MAX);
                    Some(options.gate.wait_for_lease(options.index, wait))
                }
                _ => None,
            };
            if first_lease == Some(FirstLease::TimedOut) {
                bail!(
                    "no lease from the configuration service within {} s: are a majority of the cluster's servers up?",
                    FAILOVER_FIRST_LEASE_WAIT_MS_MAX / 1_000
                );
            }
            let rejoined =
                matches!(failover, Some((_, StartMode::Rejoin))) || first_lease == Some(FirstLease::FailedOver);
            let replication = match &membership {
                // A server that holds nothing ships records to no backup until it is primary of
                // something and a backup catches up from it; its port takes catching-up copies.
                Some((file, index)) if file.replicas() > 1 => {
                    let addresses = file.replicate_addresses()?;
                    let medium = replication_medium
                        .unwrap_or_else(|| ReplicationMedium::for_addresses(addresses.iter().map(String::as_str)));
                    Some(ReplicationOptions {
                        peers: Some(ReplicationPeers { first_index: *index, addresses }),
                        rejoining: rejoined,
                        medium,
                        ..ReplicationOptions::new(file.replicas())
                    })
                }
                _ => None,
            };
            if rejoined {
                say!(
                    "rampkv server: {}; it serves no partition until the configuration service names it a backup, it \
                     catches up from the primary and is promoted in a later failover (rejoin)",
                    match first_lease {
                        Some(FirstLease::FailedOver) => "the cluster failed this server over before it started",
                        _ => "rejoined a running cluster as a new incarnation",
                    }
                );
            }
            let failover = failover.map(|(options, _)| options);
            let options = ServerOptions { secret, limits, durability, replication, failover };
            let mut group = spawn_servers(&[ServerConfig { listen, gc_grace_ms }], &options, "rampkv server")
                .with_context(|| format!("cannot start the server on {listen}"))?;
            let in_doubt = group.cores()[0].store().stats().pending_transactions;
            if in_doubt > 0 && !has_cluster {
                say!(
                    "rampkv server: {in_doubt} transactions recovered in doubt (prepared, never committed or aborted) \
                     stay undecided: give --cluster FILE so that cooperative termination can ask the other servers"
                );
            }
            if let Some((cluster, index)) = membership {
                if let Some(port) = group.backups().first() {
                    let replicas = cluster.replicas();
                    let backups =
                        rampkv::config::configuration::backups_of(index as u16, cluster.servers().len(), replicas);
                    if rejoined {
                        say!(
                            "rampkv server: {replicas} copies of every partition; replication port {}; a backup of \
                             nothing until it catches up",
                            port.address()
                        );
                    } else {
                        say!(
                            "rampkv server: {replicas} copies of every partition; replication port {}; writes \
                             acknowledged once servers {backups:?} applied them",
                            port.address()
                        );
                    }
                }
                group.start_recovery(cluster, index, RECOVERY_TIMEOUT_MS).context("cannot start recovery")?;
            }
            let front = match (ring_listen, rfrpc_listen) {
                (Some(control), _) => {
                    let slots = ItemSlotConfig { slots: item_slots, slot_bytes: item_slot_bytes };
                    let slots = match item_slots {
                        0 => None,
                        _ => Some(slots),
                    };
                    if let Some(slots) = slots {
                        slots.validate().map_err(|why| anyhow::anyhow!("--item-slots/--item-slot-bytes: {why}"))?;
                    }
                    Some(FrontEnd::spawn(&group, Front::Ring, control, slots))
                }
                (None, Some(control)) => Some(FrontEnd::spawn(&group, Front::RfRpc, control, None)),
                (None, None) => None,
            }
            .transpose()
            .context("cannot start the one-sided front end")?;
            match &front {
                Some(front) => say!(
                    "rampkv server listening on {}; {} control on {}",
                    group.addresses()[0],
                    front.kind().key(),
                    front.control_addresses()[0]
                ),
                None => say!("rampkv server listening on {}", group.addresses()[0]),
            }
            group.wait().context("server failed")?;
            drop(front);
            Ok(ExitCode::SUCCESS)
        }
        Command::Local {
            servers,
            replicas,
            replication_medium,
            base_port,
            cluster_file,
            resp_port,
            resp_bind,
            resp_auth,
            front,
            secret,
            persistence,
        } => {
            let resp = resp_port
                .map(|port| resp_auth.apply(GatewayConfig::new(SocketAddr::new(resp_bind, port))))
                .transpose()?;
            let secret = secret.install()?;
            let layout = LocalLayout { servers, replicas, base_port, medium: replication_medium };
            run_local(layout, &cluster_file, resp, front.front(), secret, &persistence)
        }
        Command::Gateway { cluster, listen, resp_auth, secret } => {
            let config = resp_auth.apply(GatewayConfig::new(listen))?;
            secret.install()?;
            // Refused before anything connects to the cluster.
            if let Some(refusal) = config.protected_mode_refusal() {
                return Err(refusal.into());
            }
            let gateway = Gateway::spawn(&Cluster::from_file(&cluster)?, &config)?;
            say!("rampkv gateway: RESP on {}", gateway.address());
            gateway.wait()?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Put { pairs, cluster, secret } => {
            secret.install()?;
            let pairs = pairs.iter().map(|pair| parse_pair(pair)).collect::<Result<Vec<_>>>()?;
            let cluster = Cluster::from_file(&cluster)?;
            let ts = Client::connect(&cluster)?.put_all(pairs)?;
            out!("OK ts={ts}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Get { keys, cluster, secret } => {
            secret.install()?;
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
        Command::Figures(args) => run_figures(args),
        Command::Chaos(args) => run_chaos(args),
        Command::Check { file, json } => {
            let report = checker::check_file(&file).with_context(|| format!("cannot check {}", file.display()))?;
            if json {
                out!("{}", serde_json::to_string(&report)?);
            } else {
                out_raw!("{report}");
            }
            Ok(ExitCode::from(report.verdict().exit_status()))
        }
    }
}

/// The exit status of a command that checked `verdicts` (none: nothing was checked, success).
fn check_exit_code(verdicts: impl IntoIterator<Item = checker::Verdict>) -> ExitCode {
    let verdict = verdicts.into_iter().reduce(checker::Verdict::combine);
    ExitCode::from(verdict.map_or(checker::EXIT_CLEAN, checker::Verdict::exit_status))
}

/// `rampkv local`: servers in this process, and a RESP gateway calling their cores if `resp` says
/// where (and with which users).
fn run_local(
    layout: LocalLayout,
    cluster_file: &PathBuf,
    resp: Option<GatewayConfig>,
    front: Option<Front>,
    secret: Option<Arc<SharedSecret>>,
    persistence: &PersistenceArgs,
) -> Result<ExitCode> {
    let LocalLayout { servers, replicas, base_port, medium } = layout;
    if !(1..=64).contains(&servers) {
        bail!("--servers must be 1..=64, got {servers}");
    }
    check_replicas(replicas, servers)?;
    if let Some(refusal) = resp.as_ref().and_then(GatewayConfig::protected_mode_refusal) {
        return Err(refusal.into()); // before any server starts
    }
    let configs = (0..servers)
        .map(|index| {
            let port = if base_port == 0 { 0 } else { base_port.checked_add(index as u16).context("port overflow")? };
            Ok(ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], port))))
        })
        .collect::<Result<Vec<_>>>()?;
    let durability = persistence
        .durability()
        .map(|(dir, config)| Ok::<_, anyhow::Error>(Durability { dirs: cluster_data_dirs(&dir, servers)?, config }))
        .transpose()?;
    let replication = (replicas != 1).then(|| ReplicationOptions { medium, ..ReplicationOptions::new(replicas) });
    let options = ServerOptions { secret, durability, replication, ..ServerOptions::default() };
    let mut group = spawn_servers(&configs, &options, "rampkv local").context("cannot start the local cluster")?;
    let mut cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect())?
        .with_replicas(replicas)?;
    group.start_recovery(cluster.clone(), 0, RECOVERY_TIMEOUT_MS).context("cannot start recovery")?;
    let localhost = SocketAddr::from(([127, 0, 0, 1], 0));
    let item_slots = Some(ItemSlotConfig::default());
    let front = front
        .map(|front| FrontEnd::spawn(&group, front, localhost, item_slots))
        .transpose()
        .context("cannot start the one-sided front end")?;
    if let Some(front) = &front {
        let controls = front.control_addresses().iter().map(SocketAddr::to_string).collect();
        cluster = cluster.with_fronts(front.kind(), controls)?;
    }
    std::fs::write(cluster_file, cluster.to_toml())
        .with_context(|| format!("cannot write {}", cluster_file.display()))?;
    let copies = match replicas {
        1 => String::new(),
        _ => format!(", {replicas} copies of every partition (synchronous replication)"),
    };
    say!(
        "rampkv local cluster: {servers} servers on {}{copies}; cluster file {}",
        group.addresses().iter().map(SocketAddr::to_string).collect::<Vec<_>>().join(", "),
        cluster_file.display()
    );
    if let Some(config) = resp {
        // The gateway lives with the servers: it calls their cores rather than their sockets.
        let in_process = InProcessServers { groups: vec![Arc::clone(group.servers())] };
        let config = GatewayConfig { in_process: Some(in_process), ..config };
        let gateway = Gateway::spawn(&cluster, &config).context("cannot start the RESP gateway")?;
        say!("rampkv local cluster: RESP on {} (try redis-cli -p {})", gateway.address(), gateway.address().port());
        // A gateway that stops (it should not) takes the process with it, rather than leaving
        // servers up behind a RESP port that refuses every connection (issue 15).
        std::thread::Builder::new().name("rampkv-gateway-watch".into()).spawn(move || {
            let outcome = gateway.wait();
            say!("rampkv local: the RESP gateway stopped ({outcome:?}); exiting");
            std::process::exit(2);
        })?;
    }
    group.wait().context("local cluster failed")?;
    drop(front);
    Ok(ExitCode::SUCCESS)
}

/// `rampkv local`'s servers: how many, how many copies of each partition, which ports.
#[derive(Debug, Clone, Copy)]
struct LocalLayout {
    servers: usize,
    replicas: u32,
    base_port: u16,
    medium: ReplicationMedium,
}

/// `--replicas N` against `--servers`: refused before anything starts.
fn check_replicas(replicas: u32, servers: usize) -> Result<()> {
    if replicas == 0 || replicas > rampkv::limits::CLUSTER_REPLICAS_MAX {
        bail!("--replicas must be 1..={}, got {replicas}", rampkv::limits::CLUSTER_REPLICAS_MAX);
    }
    if replicas as usize > servers {
        bail!("--replicas {replicas} needs at least {replicas} servers (each copy on a server of its own), got --servers {servers}");
    }
    Ok(())
}

/// `rampkv local --front`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FrontChoice {
    Ring,
    Rfrpc,
    None,
}

impl FrontChoice {
    fn front(self) -> Option<Front> {
        match self {
            FrontChoice::Ring => Some(Front::Ring),
            FrontChoice::Rfrpc => Some(Front::RfRpc),
            FrontChoice::None => None,
        }
    }
}

fn parse_algorithm(name: &str) -> Result<Algorithm, rampkv::types::UnknownName> {
    Algorithm::from_name(name).ok_or_else(|| rampkv::types::UnknownName {
        what: "protocol",
        name: name.to_owned(),
        choices: Algorithm::ALL.iter().map(Algorithm::name).collect(),
    })
}

/// Splits `KEY=VALUE` at the first `=`.
fn parse_pair(pair: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    match pair.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.as_bytes().to_vec(), value.as_bytes().to_vec())),
        _ => bail!("expected KEY=VALUE with a non-empty key, got {pair:?}"),
    }
}

/// Shortest run `--duration` / `--point-duration` accept: a shorter one may end before a
/// single transaction finishes (a loaded machine takes milliseconds to start the clients), and a
/// run that measures nothing should be refused up front rather than report zeros.
const RUN_DURATION_MS_MIN: u64 = 10;

/// Longest run they accept: one week. Bounds the arithmetic on it (a duration of 1e30 seconds
/// overflowed `Duration` and panicked).
const RUN_DURATION_S_MAX: u64 = 7 * 24 * 3600;

/// Parses `10s`, `500ms`, `2m`, `1.5s` or a plain number of seconds, within
/// [`RUN_DURATION_MS_MIN`]..=[`RUN_DURATION_S_MAX`]. NaN, infinities, zero, negative and
/// out-of-range values are errors saying what is accepted, never a panic.
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
    let accepted = format!("durations from {RUN_DURATION_MS_MIN}ms to {RUN_DURATION_S_MAX}s (7 days) are accepted");
    if seconds.is_nan() || seconds <= 0.0 {
        bail!("duration must be a positive number, got {text:?}; {accepted}");
    }
    if seconds > RUN_DURATION_S_MAX as f64 {
        // Infinities too (`inf`, or `1e308m` overflowing to one).
        bail!("duration {text:?} is too long; {accepted}");
    }
    if seconds * 1_000.0 < RUN_DURATION_MS_MIN as f64 {
        bail!("duration {text:?} is too short to run a transaction; {accepted}");
    }
    // In range, so neither conversion can panic.
    Ok(Duration::from_secs_f64(seconds))
}

fn run_bench(args: BenchArgs) -> Result<ExitCode> {
    SecretArgs { secret_file: args.secret_file.clone() }.install()?;
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

/// A random seed for a run that was given none (printed, so the run can be replayed).
fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |elapsed| elapsed.as_nanos() as u64)
}

/// Parses `MIN..MAX` (two durations as [`parse_duration`] takes them) or one duration (MIN =
/// MAX) into milliseconds.
fn parse_duration_range(text: &str) -> Result<chaos::MillisecondRange> {
    let (min, max) = text.split_once("..").unwrap_or((text, text));
    let millis = |part: &str| parse_duration(part).map(|duration| duration.as_millis() as u64);
    let range = chaos::MillisecondRange { min: millis(min)?, max: millis(max)? };
    if range.min > range.max {
        bail!("{text:?}: the lower end is above the upper end");
    }
    Ok(range)
}

fn run_chaos(args: ChaosArgs) -> Result<ExitCode> {
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

fn run_figures(args: FiguresArgs) -> Result<ExitCode> {
    let mode = if args.full { figures::Mode::Full } else { figures::Mode::Quick };
    let mut config = figures::FiguresConfig::new(mode, args.out, args.seed);
    if !args.only.is_empty() {
        config.keep_only(&args.only);
    }
    if let Some(text) = &args.point_duration {
        config.point_seconds = parse_duration(text)?.as_secs_f64();
    }
    config.check = args.check;
    config.validate()?;
    let points = figures::point_count(&config);
    say!(
        "rampkv figures: {points} points of {} s ({:?} mode), seed {}, into {}",
        config.point_seconds,
        mode,
        config.seed,
        config.out.display()
    );
    let progress = ProgressBar::new(Goal::Steps { total: points as u64 }, "starting");
    let outcome = figures::run(&config, &progress);
    progress.finish();
    let outcome = outcome?;
    for sweep in &outcome.sweeps {
        out!(
            "{}: {} and {}",
            sweep.sweep.title(),
            config.out.join(&sweep.table_file).display(),
            config.out.join(&sweep.svg_file).display()
        );
        for missing in &sweep.unavailable {
            out!("  not in this build: {missing}");
        }
    }
    out!("index: {}", outcome.index_file.display());
    let problems = outcome.problems();
    for problem in &problems {
        say!("rampkv figures: {problem}");
    }
    let inconclusive = outcome.inconclusive_points();
    if !inconclusive.is_empty() {
        say!(
            "rampkv figures: read atomicity INCONCLUSIVE at {} of {points} points (no anomaly, too few races to prove \
             anything; the evidence is in each figure's table)",
            inconclusive.len()
        );
    }
    let inconclusive_probes = outcome.inconclusive_probes();
    if !inconclusive_probes.is_empty() {
        say!(
            "rampkv figures: read atomicity INCONCLUSIVE for {} (no anomaly, too few races in the probe's time cap)",
            inconclusive_probes.join(", ")
        );
    }
    for probe in &outcome.probes {
        if let Some(summary) = &probe.summary {
            out!("{} over {}: {summary}", probe.protocol, probe.transport);
        }
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn run_comparison(config: &BenchConfig, json: bool) -> Result<ExitCode> {
    let mut transports = bench::TransportKind::ALL.to_vec();
    let in_process = config.algorithm != Algorithm::S2pl;
    if in_process {
        transports.push(bench::TransportKind::InProcess);
    }
    let progress = ProgressBar::new(Goal::Steps { total: transports.len() as u64 }, "rampkv bench --compare");
    let results = bench::compare::run_each(config, &transports, |result| {
        progress.println(&format!(
            "rampkv bench --compare: {} done, {:.0} txn/s",
            result.transport, result.throughput_txn_per_s
        ));
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
        out!("one-sided transports run over the shared-memory fabric emulation, not RDMA hardware\n");
        out_raw!("{}", bench::compare::comparison_table(&results));
        for line in results.iter().filter_map(bench::BenchResult::batching_line) {
            out!("\n{line}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_mode_for_the_binary_ports_refuses_only_open_servers_without_a_secret() {
        let address = |text: &str| text.parse::<SocketAddr>().unwrap();
        let loopback = [address("127.0.0.1:7001"), address("[::1]:7002"), address("127.0.0.9:0")];
        assert_eq!(binary_protected_mode_refusal(&loopback, false, false), None);
        for open in ["0.0.0.0:7001", "[::]:7001", "10.0.0.1:7001", "192.0.2.1:0"] {
            let addresses = [address("127.0.0.1:7001"), address(open)];
            let refusal = binary_protected_mode_refusal(&addresses, false, false).expect("refused");
            assert!(refusal.contains(open.trim_end_matches(":0")) && refusal.contains("--secret-file"), "{refusal}");
            assert_eq!(binary_protected_mode_refusal(&addresses, true, false), None, "a secret lifts it");
            assert_eq!(binary_protected_mode_refusal(&addresses, false, true), None, "so does the flag");
        }
    }

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

    /// Issue 15: `bench --duration 1e30` panicked (Duration overflow) and `--duration
    /// 0.0000001s` ran nothing and exited 0. Every value out of the documented range is a
    /// clear error; the bounds themselves are accepted.
    #[test]
    fn durations_out_of_range_are_errors_that_state_the_range() {
        for (bad, why) in [
            ("1e30", "too long"),
            ("1e30ms", "too long"),
            ("604801s", "too long"),
            ("1e308m", "too long"),
            ("0.0000001s", "too short"),
            ("9ms", "too short"),
            ("5e-324", "too short"),
            ("NaN", "positive number"),
            ("-inf", "positive number"),
            ("infs", "too long"),
            ("-0", "positive number"),
            ("-3m", "positive number"),
        ] {
            let message = format!("{:#}", parse_duration(bad).unwrap_err());
            assert!(message.contains(why) && message.contains("10ms to 604800s"), "{bad:?}: {message}");
        }
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(parse_duration("604800s").unwrap(), Duration::from_secs(RUN_DURATION_S_MAX));
        assert_eq!(parse_duration("10080m").unwrap(), Duration::from_secs(RUN_DURATION_S_MAX));
    }

    #[test]
    fn pairs_split_at_the_first_equals_sign() {
        assert_eq!(parse_pair("k=v=w").unwrap(), (b"k".to_vec(), b"v=w".to_vec()));
        assert_eq!(parse_pair("k=").unwrap(), (b"k".to_vec(), b"".to_vec()));
        assert!(parse_pair("=v").is_err());
        assert!(parse_pair("novalue").is_err());
    }
}
