//! The chaos workload: a few client threads, each a [`Driver`] with a few sessions, running
//! read-only and write-only transactions over a small key space (so reads race writes), and
//! recording every transaction in the history, failed ones included.
//!
//! # Witness keys
//! The small key space is overwritten thousands of times a second, so a write lost to a crash
//! is soon hidden by a newer one. Every write transaction therefore also writes a *witness
//! key* of its own (`chaos:w<thread>:<n>`), written by no other transaction (its retries
//! aside): a lost witness stays lost, and the final read-back finds it. Reads stay on the small
//! key space, where they race writes.
//!
//! # Surviving faults
//! A killed server fails the transactions that need its partitions (`ClientError::Unavailable`,
//! recorded `ok: false`; a failed write may still have taken effect, which the checker accepts)
//! and the others go on; the driver reconnects to the server on its own once it is back. A
//! session whose transaction failed for an unavailable partition waits
//! [`CHAOS_RECONNECT_BACKOFF_MS`] before its next try (a refused transaction fails at once: without
//! the wait the thread would spin through its tries). If the driver fails as a whole, the thread
//! records every transaction in flight as failed, drops the driver, and connects again every
//! [`CHAOS_RECONNECT_BACKOFF_MS`] until the cluster takes it back. A failed transaction is tried
//! again (as a new transaction, with a new timestamp) up to [`CHAOS_TRIES_PER_TRANSACTION_MAX`]
//! times in all. With replication (`--replicas` above 1) a failed server is replaced rather than
//! waited for: a transaction failed for an unavailable partition, or refused by a server that is
//! no longer its primary (`NotPrimary`), makes the thread drop its driver and connect again to
//! the primaries the configuration service names now.
//!
//! # Bounds
//! A thread stops starting transactions at the run's deadline, lets those in flight finish for
//! at most [`CHAOS_DRAIN_MS_MAX`], records what is left as failed, and returns; an interruption
//! (Ctrl-C) ends it at the next poll.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rampkv_core::cluster::Cluster;
use rampkv_net::client::{connect, ClientError, Completion, Driver, TxnResult};
use rampkv_net::transport::ClientTransport;
use rampkv_ycsb::Random;
use serde::Serialize;

use super::clock::RunClock;
use crate::bench::{check_values, TransportKind};
use crate::history::{self, HistoryFeed, ReadRecord, Record, WriteRecord};
use crate::limits::{
    CHAOS_DRAIN_MS_MAX, CHAOS_ERRORS_KEPT_MAX, CHAOS_POLL_INTERVAL_MS, CHAOS_RECONNECT_BACKOFF_MS,
    CHAOS_TRIES_PER_TRANSACTION_MAX, HISTORY_SEND_INTERVAL_MS, HISTORY_SEND_RECORDS_MAX,
};

/// What every client thread of a run shares.
#[derive(Debug)]
pub(super) struct WorkloadShared<'a> {
    pub cluster: &'a Cluster,
    pub transport: TransportKind,
    pub keys: u64,
    pub txn_size: usize,
    pub read_ratio: f64,
    pub value_size: usize,
    pub seed: u64,
    /// When the threads stop starting transactions.
    pub deadline: Instant,
    pub clock: &'a RunClock,
    /// Ctrl-C.
    pub interrupted: &'a AtomicBool,
}

/// What the client threads did, added up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WorkloadTotals {
    /// Read-only transactions that returned.
    pub reads_ok: u64,
    /// Write-only transactions acknowledged.
    pub writes_ok: u64,
    pub reads_failed: u64,
    pub writes_failed: u64,
    /// Times a thread connected again after its connections broke.
    pub reconnects: u64,
    /// Connection attempts that failed (the cluster, or part of it, was down).
    pub connect_failures: u64,
    /// Planned transactions given up after [`CHAOS_TRIES_PER_TRANSACTION_MAX`] tries.
    pub given_up: u64,
    /// The first distinct errors met (at most [`CHAOS_ERRORS_KEPT_MAX`]).
    pub errors: Vec<String>,
}

impl WorkloadTotals {
    pub(super) fn merge(&mut self, other: WorkloadTotals) {
        self.reads_ok += other.reads_ok;
        self.writes_ok += other.writes_ok;
        self.reads_failed += other.reads_failed;
        self.writes_failed += other.writes_failed;
        self.reconnects += other.reconnects;
        self.connect_failures += other.connect_failures;
        self.given_up += other.given_up;
        for error in other.errors {
            self.note_error(error);
        }
    }

    fn note_error(&mut self, error: String) {
        if self.errors.len() < CHAOS_ERRORS_KEPT_MAX && !self.errors.contains(&error) {
            self.errors.push(error);
        }
    }
}

/// Runs client thread `thread` with `sessions` sessions over the run's transport until the
/// deadline; its records go to `feed`.
pub(super) fn run_thread(
    shared: &WorkloadShared<'_>,
    thread: usize,
    sessions: usize,
    feed: HistoryFeed,
) -> ThreadResult {
    let worker = Worker::new(shared, thread, sessions, feed);
    let cluster = shared.cluster;
    // The one place that names transports: each connects a fresh transport to the servers
    // serving each server's partitions now (with replication: the primaries the configuration
    // service names, so that a transport rebuilt after a failover reaches them).
    match shared.transport {
        TransportKind::Tcp => worker.run(|| connect::tcp(cluster)),
        TransportKind::WritePoll => worker.run(|| connect::writepoll(cluster)),
        TransportKind::SendRecv => worker.run(|| connect::sendrecv(cluster)),
        TransportKind::OneSided => worker.run(|| connect::onesided(cluster)),
        TransportKind::RfRpc => worker.run(|| connect::rfrpc(cluster)),
        // Refused when the configuration is validated: there are no in-process servers here.
        TransportKind::InProcess => unreachable!("the chaos configuration refuses --transport inprocess"),
    }
}

/// What one client thread did.
#[derive(Debug)]
pub(super) struct ThreadResult {
    pub totals: WorkloadTotals,
    /// Witness keys it planned: `witness_key(thread, 0..witnesses)`.
    pub witnesses: u64,
}

/// A transaction the workload wants done.
#[derive(Debug, Clone)]
struct Planned {
    write: bool,
    keys: Vec<Vec<u8>>,
    /// Tries so far (including the one in flight).
    tries: u32,
}

#[derive(Debug)]
struct InFlight {
    planned: Planned,
    /// The client id of the driver that runs it (for its record).
    client: u64,
    /// A write's timestamp, once the driver issued one.
    ts: Option<u64>,
    start_ns: u64,
}

#[derive(Debug, Default)]
struct Session {
    in_flight: Option<InFlight>,
    retry: Option<Planned>,
    /// No transaction starts before this (after one failed for an unavailable partition).
    not_before: Option<Instant>,
}

struct Worker<'a> {
    shared: &'a WorkloadShared<'a>,
    thread: usize,
    /// Witness keys planned so far.
    witnesses: u64,
    random: Random,
    sessions: Vec<Session>,
    records: Vec<Record>,
    feed: HistoryFeed,
    last_handover: Instant,
    totals: WorkloadTotals,
}

impl<'a> Worker<'a> {
    fn new(shared: &'a WorkloadShared<'a>, thread: usize, sessions: usize, feed: HistoryFeed) -> Self {
        // Each thread draws from a stream of its own (SplitMix's increment spreads the threads).
        let seed = shared.seed ^ (thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Worker {
            shared,
            thread,
            witnesses: 0,
            random: Random::new(seed),
            sessions: (0..sessions).map(|_| Session::default()).collect(),
            records: Vec::new(),
            feed,
            last_handover: Instant::now(),
            totals: WorkloadTotals::default(),
        }
    }

    fn run<T: ClientTransport>(mut self, connect: impl Fn() -> Result<T, ClientError>) -> ThreadResult {
        let drain_end = self.shared.deadline + Duration::from_millis(CHAOS_DRAIN_MS_MAX);
        let poll = Some(Duration::from_millis(CHAOS_POLL_INTERVAL_MS));
        let mut driver: Option<Driver<T>> = None;
        let mut connected_before = false;
        let mut completions = Vec::new();
        loop {
            let now = Instant::now();
            let stopping = now >= self.shared.deadline;
            let idle = driver.as_ref().is_none_or(|driver| driver.active() == 0);
            if self.shared.interrupted.load(Ordering::Relaxed) || (stopping && idle) || now >= drain_end {
                break;
            }
            let Some(active) = driver.as_mut() else {
                match connect()
                    .and_then(|transport| Driver::connect(transport, self.shared.cluster.clone(), self.sessions.len()))
                {
                    Ok(connected) => {
                        self.totals.reconnects += u64::from(connected_before);
                        connected_before = true;
                        driver = Some(connected);
                    }
                    Err(error) => {
                        self.totals.connect_failures += 1;
                        self.totals.note_error(format!("connect: {error}"));
                        std::thread::sleep(Duration::from_millis(CHAOS_RECONNECT_BACKOFF_MS));
                    }
                }
                continue;
            };
            let mut result = if stopping { Ok(()) } else { self.start_idle(active) };
            if result.is_ok() {
                result = active.step(poll, &mut completions);
            }
            let mut stale = false;
            for completion in completions.drain(..) {
                let client = u64::from(active.client_id(completion.session));
                stale |= self.complete(client, completion);
            }
            if stale && result.is_ok() {
                // Replication: a server failed or was deposed; learn the configuration again
                // (after a pause: the failover may not be committed yet).
                self.fail_in_flight();
                driver = None;
                std::thread::sleep(Duration::from_millis(CHAOS_RECONNECT_BACKOFF_MS));
                continue;
            }
            if let Err(error) = result {
                // The connections are broken: everything in flight failed with them.
                self.totals.note_error(error.to_string());
                self.fail_in_flight();
                driver = None;
                std::thread::sleep(Duration::from_millis(CHAOS_RECONNECT_BACKOFF_MS));
            }
            self.hand_over(false);
        }
        self.fail_in_flight();
        self.hand_over(true);
        ThreadResult { totals: self.totals, witnesses: self.witnesses }
    }

    /// Starts a transaction on every idle session: its retry if it has one, else a new one.
    fn start_idle<T: ClientTransport>(&mut self, driver: &mut Driver<T>) -> Result<(), ClientError> {
        let now = Instant::now();
        for session in 0..self.sessions.len() {
            let waiting = self.sessions[session].not_before.is_some_and(|not_before| now < not_before);
            if self.sessions[session].in_flight.is_some() || waiting {
                continue;
            }
            let mut planned = match self.sessions[session].retry.take() {
                Some(retry) => retry,
                None => self.plan(),
            };
            planned.tries += 1;
            let keys = planned.keys.clone();
            let write = planned.write;
            let client = u64::from(driver.client_id(session));
            let start_ns = self.shared.clock.now_ns();
            self.sessions[session].in_flight = Some(InFlight { planned, client, ts: None, start_ns });
            if write {
                let value_size = self.shared.value_size;
                let mut issued = None;
                let started = driver.begin_write_with(session, |ts| {
                    issued = Some(ts);
                    check_values(keys, ts, value_size)
                });
                // Known even when posting failed: some servers may have the prepare already.
                if let Some(in_flight) = self.sessions[session].in_flight.as_mut() {
                    in_flight.ts = issued;
                }
                started?;
            } else {
                driver.begin_read(session, keys)?;
            }
        }
        Ok(())
    }

    /// A new transaction: a read with probability `read_ratio`, else a write, of `txn_size`
    /// distinct keys; a write also writes a new witness key.
    fn plan(&mut self) -> Planned {
        let write = self.random.next_f64() >= self.shared.read_ratio;
        let mut numbers: Vec<u64> = Vec::with_capacity(self.shared.txn_size);
        while numbers.len() < self.shared.txn_size {
            // txn_size <= keys (validated), so this ends; small key spaces make it quick.
            let number = self.random.below(self.shared.keys);
            if !numbers.contains(&number) {
                numbers.push(number);
            }
        }
        let mut keys: Vec<Vec<u8>> = numbers.into_iter().map(key_name).collect();
        if write {
            keys.push(witness_key(self.thread, self.witnesses));
            self.witnesses += 1;
        }
        Planned { write, keys, tries: 0 }
    }

    /// Records a finished transaction; a failed one is tried again later. Returns whether it
    /// failed because a server is no longer the primary (the routes are stale).
    fn complete(&mut self, client: u64, completion: Completion) -> bool {
        let Some(in_flight) = self.sessions[completion.session].in_flight.take() else {
            return false; // a driver reports only transactions it was given
        };
        let end_ns = self.shared.clock.now_ns();
        let keys = history_keys(&in_flight.planned.keys);
        match completion.result {
            Ok(TxnResult::Read(outcome)) => {
                self.totals.reads_ok += 1;
                self.records.push(Record::Read(ReadRecord::of_outcome(
                    client,
                    keys,
                    &outcome,
                    in_flight.start_ns,
                    end_ns,
                )));
            }
            Ok(TxnResult::Write(outcome)) => {
                self.totals.writes_ok += 1;
                debug_assert_eq!(Some(outcome.ts), in_flight.ts, "the driver acknowledged another timestamp");
                let (start_ns, ok) = (in_flight.start_ns, true);
                self.records.push(Record::Write(WriteRecord { client, ts: outcome.ts, keys, start_ns, end_ns, ok }));
            }
            Ok(TxnResult::Keys(_) | TxnResult::KeyCount(_)) => unreachable!("the chaos workload lists no keys"),
            Ok(TxnResult::Update(_)) => debug_assert!(false, "the chaos workload runs no single-key updates"),
            Err(error) => {
                if let ClientError::Unavailable { .. } = error {
                    let wait = Duration::from_millis(CHAOS_RECONNECT_BACKOFF_MS);
                    self.sessions[completion.session].not_before = Some(Instant::now() + wait);
                }
                self.totals.note_error(error.to_string());
                self.fail(completion.session, in_flight, end_ns);
                // With replication a server that failed or was deposed is replaced, not waited
                // for: learn the configuration again (without, wait for it to come back).
                let replicated = self.shared.cluster.replicas() > 1;
                return error.is_not_primary() || (replicated && matches!(error, ClientError::Unavailable { .. }));
            }
        }
        false
    }

    /// Records every transaction in flight as failed (their driver is gone, or the run is).
    fn fail_in_flight(&mut self) {
        let end_ns = self.shared.clock.now_ns();
        for session in 0..self.sessions.len() {
            if let Some(in_flight) = self.sessions[session].in_flight.take() {
                self.fail(session, in_flight, end_ns);
            }
        }
    }

    /// Records `in_flight` as failed and plans its next try, if it has tries left.
    fn fail(&mut self, session: usize, in_flight: InFlight, end_ns: u64) {
        let InFlight { planned, client, ts, start_ns } = in_flight;
        let keys = history_keys(&planned.keys);
        if planned.write {
            self.totals.writes_failed += 1;
            // A write that got no timestamp sent nothing: there is nothing a read could see.
            if let Some(ts) = ts {
                self.records.push(Record::Write(WriteRecord { client, ts, keys, start_ns, end_ns, ok: false }));
            }
        } else {
            self.totals.reads_failed += 1;
            self.records.push(Record::Read(failed_read(client, keys, start_ns, end_ns)));
        }
        if planned.tries < CHAOS_TRIES_PER_TRANSACTION_MAX {
            self.sessions[session].retry = Some(planned);
        } else {
            self.totals.given_up += 1;
        }
    }

    /// Hands the records so far to the history writer when due (or `now`).
    fn hand_over(&mut self, now: bool) {
        let due = self.last_handover.elapsed() >= Duration::from_millis(HISTORY_SEND_INTERVAL_MS);
        if !self.records.is_empty() && (now || due || self.records.len() >= HISTORY_SEND_RECORDS_MAX) {
            // A stopped writer reports its error when the history is finished.
            self.feed.send(std::mem::take(&mut self.records));
            self.last_handover = Instant::now();
        }
    }
}

/// The key of number `number` in the chaos key space.
pub(super) fn key_name(number: u64) -> Vec<u8> {
    format!("chaos:{number}").into_bytes()
}

/// Witness key `number` of client thread `thread`.
pub(super) fn witness_key(thread: usize, number: u64) -> Vec<u8> {
    format!("chaos:w{thread}:{number}").into_bytes()
}

/// The keys as a history shows them.
pub(super) fn history_keys(keys: &[Vec<u8>]) -> Vec<String> {
    keys.iter().map(|key| history::key_to_history_string(key)).collect()
}

/// The record of a read that returned nothing (the checker skips it; it shows the failure).
fn failed_read(client: u64, keys: Vec<String>, start_ns: u64, end_ns: u64) -> ReadRecord {
    ReadRecord {
        client,
        keys,
        reads: Default::default(),
        value_ts: Default::default(),
        round1: None,
        round2: Vec::new(),
        start_ns,
        end_ns,
        ok: false,
    }
}
