//! `rampkv chaos`: a fault test in Jepsen's manner. Real server processes, a workload recording
//! its history, a nemesis that kills servers with SIGKILL and restarts them, pauses primaries
//! with SIGSTOP or cuts them off from the other servers (and resumes or heals them), and at the
//! end the checker, a read-back of every key against the last acknowledged write, and the
//! longest window in which nothing completed. See `docs/reliability.md`.
//!
//! # Layout (bottom up: a room names only rooms above it in this list)
//! - `error`: [`ChaosError`] and [`NamespacesFault`]; `clock`: the run's clock (history
//!   nanoseconds, timeline milliseconds).
//! - [`network`]: each server in a network namespace of its own (as root), or loopback; the
//!   partitions of one server from the others.
//! - [`servers`]: the `rampkv server` processes: start, readiness, SIGKILL, SIGSTOP and
//!   SIGCONT, restart, and a guard that kills them all by pid on any exit path.
//! - [`nemesis`]: the fault schedule (a function of the seed) and the thread that carries it out.
//! - [`workload`]: client threads that survive broken connections and record every transaction.
//! - [`outcome`]: lost acknowledged writes, unavailability, the report and its verdict.
//! - this file: [`ChaosConfig`] and [`run`], which sets up, runs the workload and the
//!   nemesis, reads back and judges.
//!
//! # Contract
//! [`run`] returns a [`ChaosReport`] whose `passed` is true only when the checker's verdict is
//! clean (no anomaly, and races enough to show it could have caught one), no acknowledged
//! write was lost, the run acknowledged writes and returned reads,
//! (if asked) the longest window without a completed transaction is within bounds, and with
//! replication every replica set is whole at the end, every paused or cut-off primary was
//! deposed, and (when such a deposed primary stayed reachable) no read was stale. Every
//! thread, process, namespace and wait of the run is bounded; everything it started is gone
//! when it returns, whatever the path (error, panic, Ctrl-C through `interrupted`).
//!
//! Only the client's public interface (`Driver`, `Client`, the transports' `connect`) and
//! server processes started from the binary are used, as a user would.

mod clock;
mod error;
mod nemesis;
mod network;
mod outcome;
mod servers;
mod workload;

pub use error::{ChaosError, NamespacesFault};
pub use nemesis::{Action, Event, MillisecondRange, NemesisKind};
pub use network::{NetworkChoice, NetworkMode};
pub use outcome::{ChaosReport, Failure, FinalRead, LostWrite, Unavailability};
pub use workload::WorkloadTotals;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{TXN_KEYS_MAX, VALUE_BYTES_MAX};
use rampkv_net::client::{Client, ClientError};

use crate::bench::TransportKind;
use crate::checker;
use crate::history::{HistoryStream, ReadRecord, Record, CHECK_VALUE_PREFIX_LEN};
use crate::limits::{
    CHAOS_CLIENTS_MAX, CHAOS_CLIENT_THREADS_MAX, CHAOS_FINAL_READ_TIMEOUT_MS, CHAOS_KEYS_MAX,
    CHAOS_KILL_INTERVAL_MS_MIN, CHAOS_RECONNECT_BACKOFF_MS, CHAOS_REPLICA_WAIT_MS_MAX, CHAOS_SERVERS_MAX,
    CHAOS_SLEEP_STEP_MS,
};
use clock::RunClock;
use network::Network;
use servers::{ServerSetup, Servers};
use workload::WorkloadShared;

/// The client id the final read-back is recorded under (no driver session has 0).
const FINAL_READ_CLIENT: u64 = 0;

/// Everything that defines a chaos run.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// The `rampkv` binary whose `server` command the run starts.
    pub program: PathBuf,
    pub servers: usize,
    pub replicas: u32,
    pub duration: Duration,
    /// Every random choice of the run (schedule and workload) derives from it.
    pub seed: u64,
    pub nemesis: NemesisKind,
    /// Time from one kill to the next, drawn per kill.
    pub kill_interval: MillisecondRange,
    /// Time a killed server stays down, drawn per kill.
    pub restart_after: MillisecondRange,
    /// Passed to the servers (each gets `server-<i>` in it).
    pub data_dir: Option<PathBuf>,
    pub transport: TransportKind,
    /// Where the history goes (default: the run's working directory).
    pub history: Option<PathBuf>,
    pub network: NetworkChoice,
    /// Fail the run when no transaction completed for longer than this.
    pub max_unavailable_ms: Option<u64>,
    pub client_threads: usize,
    /// Sessions over all client threads.
    pub clients: usize,
    pub keys: u64,
    pub txn_size: usize,
    pub read_ratio: f64,
    pub value_size: usize,
    /// The cluster's shared secret, passed to the servers as `--secret-file` (the workload
    /// proves this process's client secret, which the binary sets from the same file). Without
    /// one the servers run with `--insecure-no-secret`: their addresses are the run's own
    /// network namespaces (or loopback).
    pub secret_file: Option<PathBuf>,
}

impl ChaosConfig {
    /// A run of `program`'s servers with the defaults of `rampkv chaos`.
    pub fn new(program: PathBuf) -> ChaosConfig {
        ChaosConfig {
            program,
            servers: 3,
            replicas: 1,
            duration: Duration::from_secs(60),
            seed: 1,
            nemesis: NemesisKind::KillOne,
            kill_interval: MillisecondRange { min: 2_000, max: 5_000 },
            restart_after: MillisecondRange { min: 500, max: 1_500 },
            data_dir: None,
            transport: TransportKind::Tcp,
            history: None,
            network: NetworkChoice::Auto,
            max_unavailable_ms: None,
            client_threads: 3,
            clients: 6,
            keys: 16,
            txn_size: 3,
            read_ratio: 0.5,
            value_size: 32,
            secret_file: None,
        }
    }

    /// Checks every setting before anything starts.
    ///
    /// # Errors
    /// The first setting out of range, or a feature the servers lack (replication).
    pub fn validate(&self) -> Result<(), ChaosError> {
        let range = |setting, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(ChaosError::OutOfRange { setting, value, min, max })
            }
        };
        range("--servers", self.servers as u64, 1, CHAOS_SERVERS_MAX as u64)?;
        range("--replicas", u64::from(self.replicas), 1, self.servers as u64)?;
        range("--client-threads", self.client_threads as u64, 1, CHAOS_CLIENT_THREADS_MAX as u64)?;
        range("--clients", self.clients as u64, self.client_threads as u64, CHAOS_CLIENTS_MAX as u64)?;
        range("--keys", self.keys, 1, CHAOS_KEYS_MAX)?;
        // A write carries its witness key beside its `txn_size` keys.
        range("--txn-size", self.txn_size as u64, 1, self.keys.min(TXN_KEYS_MAX as u64 - 1))?;
        range("--value-size", self.value_size as u64, CHECK_VALUE_PREFIX_LEN as u64, VALUE_BYTES_MAX as u64)?;
        range("--kill-interval", self.kill_interval.min, CHAOS_KILL_INTERVAL_MS_MIN, u64::MAX)?;
        for (setting, span) in [("--kill-interval", self.kill_interval), ("--restart-after", self.restart_after)] {
            if span.min > span.max {
                return Err(ChaosError::RangeOrder { setting, min_ms: span.min, max_ms: span.max });
            }
        }
        if !(0.0..=1.0).contains(&self.read_ratio) {
            return Err(ChaosError::ReadRatio { value: self.read_ratio });
        }
        if self.transport == TransportKind::InProcess {
            return Err(ChaosError::TransportUnsupported { transport: self.transport.name() });
        }
        if self.replicas > 1 && self.nemesis == NemesisKind::KillAll && self.data_dir.is_none() {
            return Err(ChaosError::ReplicasKillAll { replicas: self.replicas });
        }
        if self.nemesis == NemesisKind::Partition && self.network == NetworkChoice::Loopback {
            return Err(ChaosError::PartitionNeedsNamespaces { why: None });
        }
        Ok(())
    }
}

/// Sets the flag when dropped: the threads of a run stop when the harness leaves its scope,
/// by a panic too.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The run's working directory: removed after a run that passed or was interrupted, kept (and
/// named in the report or the log) otherwise.
struct WorkDirectory {
    directory: Option<tempfile::TempDir>,
}

impl WorkDirectory {
    fn path(&self) -> &Path {
        self.directory.as_ref().map_or(Path::new("."), tempfile::TempDir::path)
    }

    fn keep(&mut self) -> Option<PathBuf> {
        self.directory.take().map(tempfile::TempDir::keep)
    }
}

impl Drop for WorkDirectory {
    fn drop(&mut self) {
        // Reached with a directory only while a panic unwinds: keep the logs for whoever
        // looks into it.
        self.keep();
    }
}

/// Runs a chaos test. `log` gets a line per event as it happens (kills, restarts, phases);
/// `interrupted` (Ctrl-C) ends the run early with [`ChaosError::Interrupted`].
///
/// # Errors
/// A setting out of range, a missing server feature, a server that does not start or come
/// back, a history that cannot be written, an interruption: anything that keeps the run from a
/// verdict. A verdict of failure is an `Ok` report with `passed: false`.
pub fn run(
    config: &ChaosConfig,
    interrupted: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
) -> Result<ChaosReport, ChaosError> {
    config.validate()?;
    if let Some(data_dir) = &config.data_dir {
        prepare_data_dir(&config.program, data_dir, config.servers)?;
    }
    let directory = tempfile::Builder::new().prefix("rampkv-chaos-").tempdir().map_err(|error| ChaosError::Io {
        what: "create a working directory",
        path: None,
        error,
    })?;
    let mut work = WorkDirectory { directory: Some(directory) };
    let result = run_in(config, &mut work, interrupted, log);
    match &result {
        Ok(_) => {}                                                  // kept or removed by the verdict
        Err(ChaosError::Interrupted) => drop(work.directory.take()), // nothing to look into
        Err(_) => {
            if let Some(path) = work.keep() {
                log(&format!("rampkv chaos: cluster file and server logs kept in {}", path.display()));
            }
        }
    }
    result
}

/// [`run`] in the working directory `work`.
fn run_in(
    config: &ChaosConfig,
    work: &mut WorkDirectory,
    interrupted: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
) -> Result<ChaosReport, ChaosError> {
    let is_interrupted = || interrupted.load(Ordering::Relaxed);
    let network = Network::set_up(config.network, config.servers)?;
    let (mode, network_fallback) = (network.mode(), network.fallback.clone());
    log(&format!(
        "rampkv chaos: seed {}; {} servers on {}{}",
        config.seed,
        config.servers,
        network.mode().label(),
        network.fallback.as_ref().map(|why| format!(" (no namespaces: {why})")).unwrap_or_default()
    ));
    if config.nemesis == NemesisKind::Partition && mode == NetworkMode::Loopback {
        return Err(ChaosError::PartitionNeedsNamespaces { why: network_fallback });
    }
    if config.nemesis == NemesisKind::Mixed && mode == NetworkMode::Loopback {
        log("rampkv chaos: no partitions on loopback (they need network namespaces): mixed draws kill-one and pause");
    }
    // From here on this thread, and every thread it starts, is on the client side.
    let client_side = network.enter_client()?;
    let (cluster, cluster_file) = write_cluster_file(config, &network, work.path())?;
    let setup = ServerSetup {
        program: config.program.clone(),
        cluster_file,
        log_directory: work.path().to_path_buf(),
        data_directory: config.data_dir.clone(),
        front: config.transport.front(),
        secret_file: config.secret_file.clone(),
    };
    let mut servers = Servers::new(setup, &network, config.servers);
    let everyone: Vec<usize> = (0..config.servers).collect();
    let initial_pids = servers.start_ready(&network, &everyone, &is_interrupted)?;
    log(&format!(
        "rampkv chaos: servers up ({}); nemesis {}, {} s",
        (0..servers.count()).map(|index| servers.address(index).to_string()).collect::<Vec<_>>().join(", "),
        config.nemesis.name(),
        config.duration.as_secs_f64()
    ));
    let history_path = config.history.clone().unwrap_or_else(|| work.path().join("history.jsonl"));
    let stream = HistoryStream::start(&history_path, true)?;
    let clock = RunClock::start();
    let faults = run_workload_and_nemesis(config, &cluster, &mut servers, &network, &clock, &stream, interrupted, log)?;
    let mut timeline = faults.nemesis.events;
    let end_ns = clock.now_ns().min(config.duration.as_nanos() as u64);
    log(&format!("{:>9} workload stopped; restarting what is down, then reading every key back", clock.label()));
    restore_every_server(&mut servers, &network, &clock, &is_interrupted, log, &mut timeline)?;
    // With replication and kills: every replica set must be whole again (rejoin), asked of the
    // configuration service, before the final read.
    let replica_sets_restored = (config.replicas > 1 && config.nemesis != NemesisKind::None)
        .then(|| wait_for_full_replica_sets(&cluster, &is_interrupted))
        .transpose()?;
    let keys = every_key(config.keys, &faults.witnesses);
    let (final_reads, read_key_by_key) = read_back(&cluster, &keys, &clock, &is_interrupted)?;
    // The final reads are part of the history: the checker vouches for what they returned.
    stream.feed().send(final_reads.iter().cloned().map(Record::Read).collect());
    let records = stream.finish()?;
    // Everything the run started stops here, before the verdict is printed.
    drop(servers);
    drop(client_side);
    drop(network);
    let mut report = ChaosReport {
        seed: config.seed,
        network: mode,
        network_fallback,
        servers: config.servers,
        replicas: config.replicas,
        nemesis: config.nemesis,
        kill_interval_ms: config.kill_interval,
        restart_after_ms: config.restart_after,
        transport: config.transport.name(),
        client_threads: config.client_threads,
        clients: config.clients,
        keys: config.keys,
        duration_ms: config.duration.as_millis() as u64,
        kills: timeline.iter().filter(|event| event.action == Action::Kill).count() as u64,
        whole_cluster_kills: faults.nemesis.whole_cluster_kills,
        pauses: timeline.iter().filter(|event| event.action == Action::Pause).count() as u64,
        partitions: timeline.iter().filter(|event| event.action == Action::Partition).count() as u64,
        deposed_ms_max: faults.nemesis.deposed_ms_max,
        not_deposed: faults.nemesis.not_deposed,
        kills_skipped: faults.nemesis.skipped,
        replica_wait_ms_max: faults.nemesis.replica_wait_ms_max,
        replica_sets_restored,
        kill_late_ms_max: faults.nemesis.late_ms_max,
        initial_pids,
        timeline,
        workload: faults.totals,
        check: checker::check(&records),
        final_read: FinalRead { read_key_by_key, ..outcome::compare_final_read(&records, &final_reads) },
        unavailability: outcome::longest_unavailability(&records, 0, end_ns),
        max_unavailable_ms: config.max_unavailable_ms,
        history: Some(history_path),
        catch_ups: catch_ups_of(work.path(), config.servers),
        kept_directory: None,
        passed: false,
        failures: Vec::new(),
    };
    report.conclude();
    if report.passed {
        work.directory.take(); // removed with its logs: nothing to look at
        if config.history.is_none() {
            report.history = None;
        }
    } else {
        report.kept_directory = work.keep();
    }
    Ok(report)
}

/// The catch-ups the servers' logs in `work` report (a log that cannot be read counts none).
fn catch_ups_of(work: &Path, servers: usize) -> outcome::CatchUps {
    let mut catch_ups = outcome::CatchUps::default();
    for index in 0..servers {
        if let Ok(text) = std::fs::read_to_string(work.join(format!("server-{index}.log"))) {
            catch_ups.add_log(&text);
        }
    }
    catch_ups
}

/// What the workload and the nemesis did until the deadline.
struct FaultPhase {
    nemesis: nemesis::NemesisOutcome,
    totals: WorkloadTotals,
    /// Witness keys planned, per client thread.
    witnesses: Vec<u64>,
}

/// Runs the client threads and the nemesis from now until `config.duration` has passed (the
/// clients then drain what they have in flight); returns what they did.
///
/// # Errors
/// The nemesis's (a server that did not come back), a thread that panicked, an interruption.
fn run_workload_and_nemesis(
    config: &ChaosConfig,
    cluster: &Cluster,
    servers: &mut Servers,
    network: &Network,
    clock: &RunClock,
    stream: &HistoryStream,
    interrupted: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
) -> Result<FaultPhase, ChaosError> {
    let is_interrupted = || interrupted.load(Ordering::Relaxed);
    let deadline = clock.origin() + config.duration;
    let shared = WorkloadShared {
        cluster,
        transport: config.transport,
        keys: config.keys,
        txn_size: config.txn_size,
        read_ratio: config.read_ratio,
        value_size: config.value_size,
        seed: config.seed,
        deadline,
        clock,
        interrupted,
    };
    let schedule = nemesis::Schedule::new(config.seed, config.kill_interval, config.restart_after);
    let stop = AtomicBool::new(false);
    let (nemesis, totals, witnesses, panicked) = std::thread::scope(|scope| {
        // Set when this scope is left, by a panic too: the nemesis stops at once.
        let stop_on_exit = SetOnDrop(&stop);
        let (stop, shared) = (&stop, &shared);
        // f failures at a time: with replication, a fault waits until every partition has its
        // full replica set again (the configuration service says so).
        let may_fault = move || rampkv_net::client::full_replica_sets(cluster).unwrap_or(false);
        let primaries = move |around: Option<usize>| primaries_now(cluster, around);
        let nemesis = scope.spawn(move || {
            let environment = nemesis::Environment {
                network,
                clock,
                stop,
                interrupted: &is_interrupted,
                log,
                may_fault: &may_fault,
                primaries: (config.replicas > 1).then_some(&primaries as nemesis::Primaries<'_>),
            };
            let faults = config.nemesis.faults(network.mode(), config.data_dir.is_some());
            nemesis::run(faults, schedule, servers, &environment)
        });
        let workers: Vec<_> = (0..config.client_threads)
            .map(|thread| {
                let feed = stream.feed();
                let sessions = sessions_of_thread(config.clients, config.client_threads, thread);
                scope.spawn(move || workload::run_thread(shared, thread, sessions, feed))
            })
            .collect();
        while Instant::now() < deadline && !is_interrupted() {
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(Duration::from_millis(CHAOS_SLEEP_STEP_MS).min(left));
        }
        // The nemesis stops at the deadline; the clients drain what they have in flight.
        drop(stop_on_exit);
        let (mut totals, mut witnesses, mut panicked) = (WorkloadTotals::default(), Vec::new(), false);
        for worker in workers {
            match worker.join() {
                Ok(result) => {
                    totals.merge(result.totals);
                    witnesses.push(result.witnesses);
                }
                Err(_) => panicked = true,
            }
        }
        (nemesis.join(), totals, witnesses, panicked)
    });
    let nemesis = nemesis.map_err(|_| ChaosError::Panicked { what: "the nemesis" })??;
    if panicked {
        return Err(ChaosError::Panicked { what: "a client thread" });
    }
    if is_interrupted() {
        return Err(ChaosError::Interrupted);
    }
    Ok(FaultPhase { nemesis, totals, witnesses })
}

/// The servers the configuration service names primary of some partition now, asking every
/// node but `around`'s (`None`: no node answered).
fn primaries_now(cluster: &Cluster, around: Option<usize>) -> Option<Vec<usize>> {
    let asked = rampkv_net::client::newest_configuration_asking(cluster, |server| Some(server) != around);
    let configuration = asked.ok()??;
    let mut primaries: Vec<usize> =
        configuration.replica_sets().iter().filter_map(|set| set.primary).map(usize::from).collect();
    primaries.sort_unstable();
    primaries.dedup();
    Some(primaries)
}

/// Every key the workload may have written: the small key space, and the witness keys each
/// client thread planned.
fn every_key(keys: u64, witnesses: &[u64]) -> Vec<Vec<u8>> {
    let witness_keys = witnesses
        .iter()
        .enumerate()
        .flat_map(|(thread, count)| (0..*count).map(move |number| workload::witness_key(thread, number)));
    (0..keys).map(workload::key_name).chain(witness_keys).collect()
}

/// The sessions of client thread `thread` when `clients` sessions are spread over `threads`
/// threads: the first threads take one more when they do not divide evenly.
fn sessions_of_thread(clients: usize, threads: usize, thread: usize) -> usize {
    clients / threads + usize::from(thread < clients % threads)
}

/// Waits until the configuration service says every partition has its full replica set, at
/// most `CHAOS_REPLICA_WAIT_MS_MAX`: whether it did.
///
/// # Errors
/// [`ChaosError::Interrupted`].
fn wait_for_full_replica_sets(cluster: &Cluster, interrupted: &dyn Fn() -> bool) -> Result<bool, ChaosError> {
    let deadline = Instant::now() + Duration::from_millis(CHAOS_REPLICA_WAIT_MS_MAX);
    loop {
        if rampkv_net::client::full_replica_sets(cluster).unwrap_or(false) {
            return Ok(true);
        }
        if interrupted() {
            return Err(ChaosError::Interrupted);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(CHAOS_SLEEP_STEP_MS));
    }
}

/// Restarts every server that is down and waits until every one serves (one that exited on
/// its own is an error: a crash the run found).
fn restore_every_server(
    servers: &mut Servers,
    network: &Network,
    clock: &RunClock,
    interrupted: &dyn Fn() -> bool,
    log: &dyn Fn(&str),
    timeline: &mut Vec<Event>,
) -> Result<(), ChaosError> {
    servers.check_alive()?;
    let down: Vec<usize> = (0..servers.count()).filter(|index| !servers.is_running(*index)).collect();
    if !down.is_empty() {
        nemesis::restart(servers, &down, network, clock, interrupted, log, timeline)?;
    }
    for index in 0..servers.count() {
        servers.wait_ready(index, interrupted)?;
    }
    Ok(())
}

/// Reads `keys` back over TCP with a fresh client, in transactions of at most `TXN_KEYS_MAX`
/// keys, trying again (reconnected) until [`CHAOS_FINAL_READ_TIMEOUT_MS`]. A transaction that
/// fails is read again key by key: a lost version that another key's metadata names makes
/// every multi-key read of that key fail for good (round 2 asks for a version that is gone,
/// and the read gives up as if it had been collected), while a read of one key needs no other
/// version. Returns the reads and how many transactions had to be read key by key.
fn read_back(
    cluster: &Cluster,
    keys: &[Vec<u8>],
    clock: &RunClock,
    interrupted: &dyn Fn() -> bool,
) -> Result<(Vec<ReadRecord>, u64), ChaosError> {
    let deadline = Instant::now() + Duration::from_millis(CHAOS_FINAL_READ_TIMEOUT_MS);
    let chunks: Vec<&[Vec<u8>]> = keys.chunks(TXN_KEYS_MAX).collect();
    let (mut reads, mut next, mut key_by_key) = (Vec::new(), 0, Vec::new());
    let (mut client, mut last_error) = (None, None);
    while next < chunks.len() {
        if interrupted() {
            return Err(ChaosError::Interrupted);
        }
        if Instant::now() >= deadline {
            return Err(ChaosError::FinalRead { timeout_ms: CHAOS_FINAL_READ_TIMEOUT_MS, last_error });
        }
        let Some(active) = client.as_mut() else {
            match Client::connect(cluster) {
                Ok(connected) => client = Some(connected),
                Err(error) => {
                    last_error = Some(error);
                    std::thread::sleep(Duration::from_millis(CHAOS_RECONNECT_BACKOFF_MS));
                }
            }
            continue;
        };
        let transaction_size = if key_by_key.contains(&next) { 1 } else { TXN_KEYS_MAX };
        match read_keys(active, chunks[next], transaction_size, clock) {
            Ok(chunk_reads) => {
                reads.extend(chunk_reads);
                next += 1;
            }
            Err(error) => {
                if !key_by_key.contains(&next) {
                    key_by_key.push(next);
                }
                last_error = Some(error);
                client = None; // its connections may be what failed
            }
        }
    }
    Ok((reads, key_by_key.len() as u64))
}

/// Reads `keys` with `client`, `transaction_size` keys per transaction.
fn read_keys(
    client: &mut Client,
    keys: &[Vec<u8>],
    transaction_size: usize,
    clock: &RunClock,
) -> Result<Vec<ReadRecord>, ClientError> {
    let mut reads = Vec::with_capacity(keys.len().div_ceil(transaction_size));
    for transaction in keys.chunks(transaction_size) {
        let start_ns = clock.now_ns();
        let outcome = client.get_all(transaction.to_vec())?;
        let names = workload::history_keys(transaction);
        reads.push(ReadRecord::of_outcome(FINAL_READ_CLIENT, names, &outcome, start_ns, clock.now_ns()));
    }
    Ok(reads)
}

/// Writes the cluster file every server and client uses; returns the cluster and the file.
fn write_cluster_file(
    config: &ChaosConfig,
    network: &Network,
    directory: &Path,
) -> Result<(Cluster, PathBuf), ChaosError> {
    let addresses = (0..config.servers).map(|index| network.server_address(index).to_string()).collect();
    let mut cluster = Cluster::with_servers(addresses)?;
    if config.replicas > 1 {
        let replicate = (0..config.servers).map(|index| network.replicate_address(index).to_string()).collect();
        let configs = (0..config.servers).map(|index| network.config_address(index).to_string()).collect();
        cluster = cluster
            .with_replicas(config.replicas)?
            .with_replicate_addresses(replicate)?
            .with_config_addresses(configs)?;
    }
    if let Some(front) = config.transport.front() {
        let controls = (0..config.servers).map(|index| network.control_address(index).to_string()).collect();
        cluster = cluster.with_fronts(front, controls)?;
    }
    let path = directory.join("cluster.toml");
    std::fs::write(&path, cluster.to_toml()).map_err(|error| ChaosError::Io {
        what: "write the cluster file",
        path: Some(path.clone()),
        error,
    })?;
    Ok((cluster, path))
}

/// Checks that the servers take `--data-dir` (their help lists it) and that `data_dir` is
/// empty or absent; creates it and a directory per server.
fn prepare_data_dir(program: &Path, data_dir: &Path, servers: usize) -> Result<(), ChaosError> {
    let help = Command::new(program).args(["server", "--help"]).output().map_err(|error| ChaosError::Io {
        what: "run `rampkv server --help`",
        path: Some(program.to_path_buf()),
        error,
    })?;
    if !String::from_utf8_lossy(&help.stdout).contains("--data-dir") {
        return Err(ChaosError::PersistenceMissing { program: program.to_path_buf() });
    }
    let io_error = |what| move |error| ChaosError::Io { what, path: Some(data_dir.to_path_buf()), error };
    if data_dir.exists() && std::fs::read_dir(data_dir).map_err(io_error("read the data directory"))?.next().is_some() {
        return Err(ChaosError::DataDirNotEmpty { path: data_dir.to_path_buf() });
    }
    for index in 0..servers {
        std::fs::create_dir_all(rampkv_net::server::durable::server_data_dir(data_dir, index))
            .map_err(io_error("create a data directory"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_spread_over_threads_and_add_up() {
        for (clients, threads) in [(6, 3), (7, 3), (3, 3), (16, 5)] {
            let counts: Vec<usize> = (0..threads).map(|thread| sessions_of_thread(clients, threads, thread)).collect();
            assert_eq!(counts.iter().sum::<usize>(), clients);
            assert!(counts.iter().all(|count| *count >= 1 && *count <= clients / threads + 1), "{counts:?}");
        }
    }

    #[test]
    fn settings_out_of_range_are_refused_before_anything_starts() {
        let valid = ChaosConfig::new(PathBuf::from("rampkv"));
        assert!(valid.validate().is_ok());
        let refused = |change: fn(&mut ChaosConfig), expected: &str| {
            let mut config = valid.clone();
            change(&mut config);
            let message = config.validate().unwrap_err().to_string();
            assert!(message.contains(expected), "{message}");
        };
        refused(|config| config.servers = 0, "--servers must be 1..=64");
        refused(|config| config.replicas = 4, "--replicas must be 1..=3");
        refused(
            |config| {
                config.replicas = 2;
                config.nemesis = NemesisKind::KillAll;
            },
            "needs --data-dir",
        );
        let mut whole = valid.clone();
        (whole.replicas, whole.nemesis, whole.data_dir) = (2, NemesisKind::KillAll, Some(PathBuf::from("data")));
        assert!(whole.validate().is_ok(), "kill-all with replicas and --data-dir is promised");
        refused(|config| config.txn_size = 17, "--txn-size must be 1..=16");
        refused(|config| config.clients = 2, "--clients must be 3..=256");
        refused(|config| config.value_size = 4, "--value-size");
        refused(|config| config.read_ratio = f64::NAN, "--read-ratio");
        refused(|config| config.kill_interval = MillisecondRange { min: 50, max: 60 }, "--kill-interval");
        refused(|config| config.restart_after = MillisecondRange { min: 9, max: 1 }, "--restart-after");
        refused(|config| config.transport = TransportKind::InProcess, "inprocess");
    }

    #[test]
    fn a_data_dir_needs_servers_that_take_one() {
        // `true` prints no help at all: a binary whose servers lack --data-dir.
        let directory = tempfile::tempdir().unwrap();
        let error = prepare_data_dir(Path::new("true"), directory.path(), 2).unwrap_err();
        assert!(matches!(error, ChaosError::PersistenceMissing { .. }), "{error}");
        assert!(error.to_string().contains("has no --data-dir option"), "{error}");
    }
}
