//! The client threads: each runs its share of the logical clients as sessions of one
//! [`Driver`] over its own transport, closed loop, and measures them.
//!
//! # Contract
//! A client thread starts a session's next transaction as soon as its last one finished, until
//! the run's stop condition (its deadline, the run's transaction count, or the shared stop
//! flag after another thread failed). Every value it writes is a check-mode value (the
//! writer's timestamp first, [`check_values`]), and with a history kept every finished
//! transaction becomes a record, handed to the history stream at most
//! `HISTORY_SEND_INTERVAL_MS` or `HISTORY_SEND_RECORDS_MAX` apart. A thread's first error ends
//! it and, through [`join_client_threads`], stops the others; a panic is an error too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rampkv_ycsb::{Txn, TxnKind};

use super::config::{sessions_of_thread, BenchConfig, BenchError, ConfigError, StopAfter, TransportKind};
use super::txn_source::TxnSource;
use crate::history::{self, HistoryFeed, ReadRecord, Record, WriteRecord};
use crate::limits::{HISTORY_SEND_INTERVAL_MS, HISTORY_SEND_RECORDS_MAX};
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::{metadata_for, TxnOptions};
use rampkv_net::client::{ClientError, Completion, Driver, TxnResult};
use rampkv_net::message::BatchStats;
use rampkv_net::server::Servers;
use rampkv_net::transport::interleave::{InterleaveStats, Interleaving};
use rampkv_net::transport::local::LocalTransport;
use rampkv_net::transport::onesided::{GetStarStats, OneSidedOptions};
use rampkv_net::transport::{
    ClientTransport, MixedRfRpcTransport, MixedSendRecvTransport, MixedWritePollTransport, OneSidedClientTransport,
    TcpClientTransport,
};

/// How long a driver waits in one poll before checking the clock again.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Where client threads reach the servers.
#[derive(Clone)]
pub(super) struct Endpoints {
    pub(super) cluster: Cluster,
    /// The front ends' control addresses (the one-sided transports).
    pub(super) control_addresses: Vec<String>,
    /// The embedded servers (the `inprocess` transport calls their cores).
    pub(super) local_servers: Vec<Arc<Servers>>,
}

pub(super) type ClientThreadHandle = std::thread::JoinHandle<Result<ThreadTotals, BenchError>>;

/// Starts `config.client_threads` client threads running `config`'s workload; `feed(thread)`
/// is where a thread hands its finished records while it runs, if anywhere.
pub(super) fn spawn_client_threads(
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
                        let transport = MixedWritePollTransport::connect_or_tcp(&control_addresses, cluster.servers())
                            .map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::InProcess => {
                        run_client_thread(&config, LocalTransport::new(&local_servers, None), cluster, context)
                    }
                    TransportKind::SendRecv => {
                        let transport = MixedSendRecvTransport::connect_or_tcp(&control_addresses, cluster.servers())
                            .map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::OneSided => {
                        let options = OneSidedOptions {
                            newer_prepared_fallback: config.getstar_newer_prepared_fallback,
                            ..OneSidedOptions::default()
                        };
                        let transport =
                            OneSidedClientTransport::connect_or_tcp(&control_addresses, cluster.servers(), options)
                                .map_err(ClientError::from)?;
                        run_client_thread(&config, transport, cluster, context)
                    }
                    TransportKind::RfRpc => {
                        let transport = MixedRfRpcTransport::connect_or_tcp(&control_addresses, cluster.servers())
                            .map_err(ClientError::from)?;
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
pub(super) fn join_client_threads(
    threads: Vec<ClientThreadHandle>,
    shared: &Shared,
) -> (ThreadTotals, Option<BenchError>) {
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

/// What every client thread of a run shares: the run's clock, the transactions started so
/// far (a run of a given count) and the stop flag.
pub(super) struct Shared {
    pub(super) clock_origin: Instant,
    pub(super) started: AtomicU64,
    pub(super) stop: AtomicBool,
}

impl Shared {
    pub(super) fn now_ns(&self) -> u64 {
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
            Ok(TxnResult::Keys(_) | TxnResult::KeyCount(_)) => unreachable!("the benchmark lists no keys"),
            Ok(TxnResult::Update(_)) => debug_assert!(false, "the benchmark runs no single-key updates"),
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
        Ok(TxnResult::Keys(_) | TxnResult::KeyCount(_)) => None, // the benchmark lists no keys
        Ok(TxnResult::Update(_)) => None,                        // the benchmark runs none
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

#[cfg(test)]
mod cpu_time_tests {
    use super::*;

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
