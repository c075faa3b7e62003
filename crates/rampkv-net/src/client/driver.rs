//! The driver: runs many logical clients' transactions over one transport.
//!
//! Each *session* is one logical client: its own client id and timestamp clock, and at most
//! one transaction at a time (a closed loop). The driver turns the protocol core's outgoing
//! requests into transport posts, routes replies back by request id, and reports finished
//! transactions. Many sessions share a thread and its connections, which is how a 2-core
//! machine runs dozens of clients without a thread each.
//!
//! # Request ids
//! `session (24 bits) << 40 | generation (8 bits) << 32 | tag (32 bits)`. The generation
//! changes with every transaction of a session, so a late reply to an abandoned transaction
//! (a timeout) is recognised and dropped instead of reaching the next one.

use std::time::{Duration, Instant};

use super::ClientError;
use crate::transport::ClientTransport;
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{DRIVER_EXPIRY_SCAN_INTERVAL_MS, TXN_TIMEOUT_MS};
use rampkv_core::protocol::locking::{LockingReadTxn, LockingWriteTxn};
use rampkv_core::protocol::ramp::{Algorithm, ReadTxn, TxnOptions, WriteTxn};
use rampkv_core::protocol::{Outgoing, ReadOutcome, Step, WriteOutcome};
use rampkv_core::types::{wall_clock_us, Timestamp, TimestampClock};
use rampkv_core::wire::{Request, Response};

const SESSION_BITS: u32 = 24;
/// Most sessions one driver can run (request ids carry 24 bits of session).
pub const DRIVER_SESSIONS_MAX: usize = 1 << SESSION_BITS;

/// How long a driver waits for the HELLO reply that hands out client ids.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// A finished transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    Read(ReadOutcome),
    Write(WriteOutcome),
}

/// One finished transaction of a session, as reported by [`Driver::step`].
#[derive(Debug)]
pub struct Completion {
    pub session: usize,
    pub result: Result<TxnResult, ClientError>,
}

#[derive(Debug)]
enum ActiveTxn {
    Read(ReadTxn),
    Write(WriteTxn),
    LockingRead(LockingReadTxn),
    LockingWrite(LockingWriteTxn),
}

#[derive(Debug)]
struct Session {
    clock: TimestampClock,
    generation: u8,
    txn: Option<ActiveTxn>,
    deadline: Instant,
    /// When an aborted (S2PL) transaction starts its next attempt.
    restart_at: Option<Instant>,
}

/// Runs transactions of many sessions over one transport.
#[derive(Debug)]
pub struct Driver<T: ClientTransport> {
    transport: T,
    cluster: Cluster,
    sessions: Vec<Session>,
    outgoing: Vec<Outgoing>,
    active: usize,
    /// Sessions whose `restart_at` is set (the scans for them are skipped while there are none).
    backing_off: usize,
    /// When `expire` next looks at the sessions' deadlines (at most every
    /// `DRIVER_EXPIRY_SCAN_INTERVAL_MS`: a scan reads every session, and a gateway has 1,024).
    next_expiry_scan: Instant,
    options: TxnOptions,
    /// Replies of one poll, kept between steps to avoid an allocation per step.
    replies: Vec<(u64, Response)>,
}

fn request_id(session: usize, generation: u8, tag: u32) -> u64 {
    ((session as u64) << 40) | (u64::from(generation) << 32) | u64::from(tag)
}

fn split_request_id(request_id: u64) -> (usize, u8, u32) {
    ((request_id >> 40) as usize, (request_id >> 32) as u8, request_id as u32)
}

impl<T: ClientTransport> Driver<T> {
    /// A driver with `sessions` logical clients; asks the cluster's first server for their
    /// client ids (so timestamps are unique across every client of the cluster).
    pub fn connect(mut transport: T, cluster: Cluster, sessions: usize) -> Result<Self, ClientError> {
        if sessions == 0 || sessions > DRIVER_SESSIONS_MAX || sessions > usize::from(u16::MAX) {
            return Err(ClientError::Config(format!("need 1..=65535 sessions, got {sessions}")));
        }
        if transport.server_count() != cluster.servers().len() {
            return Err(ClientError::Config("transport and cluster disagree on the servers".into()));
        }
        let first_id = hello(&mut transport, sessions as u16)?;
        let now = Instant::now();
        let sessions = (0..sessions)
            .map(|index| Session {
                clock: TimestampClock::new(first_id + index as u16),
                generation: 0,
                txn: None,
                deadline: now,
                restart_at: None,
            })
            .collect();
        Ok(Driver {
            transport,
            cluster,
            sessions,
            outgoing: Vec::new(),
            active: 0,
            backing_off: 0,
            next_expiry_scan: Instant::now(),
            options: TxnOptions::default(),
            replies: Vec::new(),
        })
    }

    /// Sets the algorithm (and its options) of every later transaction.
    pub fn set_txn_options(&mut self, options: TxnOptions) {
        self.options = options;
    }

    /// The transport (for its statistics).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The options transactions run with.
    pub fn txn_options(&self) -> &TxnOptions {
        &self.options
    }

    /// Number of sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The client id of a session.
    pub fn client_id(&self, session: usize) -> u16 {
        self.sessions[session].clock.client_id()
    }

    /// Sessions with a transaction in flight.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Starts a read-only transaction of `keys` on an idle session.
    pub fn begin_read(&mut self, session: usize, keys: Vec<Vec<u8>>) -> Result<(), ClientError> {
        self.check_idle(session)?;
        let txn = if self.options.algorithm == Algorithm::S2pl {
            // Locking reads need a timestamp: their age under wait-die.
            let ts = self.sessions[session].clock.next(wall_clock_us())?;
            let mut txn = LockingReadTxn::new(&self.cluster, ts, keys)?;
            txn.start(&mut self.outgoing);
            ActiveTxn::LockingRead(txn)
        } else {
            let mut txn = ReadTxn::new(&self.cluster, keys, self.options)?;
            txn.start(&mut self.outgoing);
            ActiveTxn::Read(txn)
        };
        self.activate(session, txn)
    }

    /// Starts a write-only transaction on an idle session; `value_for` builds each value from
    /// the transaction's timestamp (check-mode values embed it). Returns the timestamp.
    pub fn begin_write(&mut self, session: usize, writes: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Timestamp, ClientError> {
        self.begin_write_with(session, |_| writes)
    }

    /// Like [`Driver::begin_write`], with the writes built once the timestamp is known.
    pub fn begin_write_with(
        &mut self,
        session: usize,
        build: impl FnOnce(Timestamp) -> Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Timestamp, ClientError> {
        self.check_idle(session)?;
        let ts = self.sessions[session].clock.next(wall_clock_us())?;
        let txn = if self.options.algorithm == Algorithm::S2pl {
            let mut txn = LockingWriteTxn::new(&self.cluster, ts, build(ts))?;
            txn.start(&mut self.outgoing);
            ActiveTxn::LockingWrite(txn)
        } else {
            let mut txn = WriteTxn::new(&self.cluster, ts, build(ts), self.options)?;
            txn.start(&mut self.outgoing);
            ActiveTxn::Write(txn)
        };
        self.activate(session, txn)?;
        Ok(ts)
    }

    fn check_idle(&self, session: usize) -> Result<(), ClientError> {
        match self.sessions.get(session) {
            None => Err(ClientError::Config(format!("no session {session}"))),
            Some(state) if state.txn.is_some() => Err(ClientError::Config(format!("session {session} is busy"))),
            Some(_) => Ok(()),
        }
    }

    fn activate(&mut self, session: usize, txn: ActiveTxn) -> Result<(), ClientError> {
        let state = &mut self.sessions[session];
        state.generation = state.generation.wrapping_add(1);
        state.deadline = Instant::now() + Duration::from_millis(TXN_TIMEOUT_MS);
        state.txn = Some(txn);
        self.active += 1;
        self.post_outgoing(session)
    }

    fn post_outgoing(&mut self, session: usize) -> Result<(), ClientError> {
        let generation = self.sessions[session].generation;
        for outgoing in self.outgoing.drain(..) {
            let id = request_id(session, generation, outgoing.tag);
            self.transport.post_owned(outgoing.server, id, outgoing.request)?;
        }
        Ok(())
    }

    /// Sends what is queued, waits up to `timeout` for replies, advances the transactions they
    /// answer, sends what that queued, and appends finished ones to `completions`. Transactions past their deadline
    /// finish with [`ClientError::Timeout`].
    pub fn step(&mut self, timeout: Option<Duration>, completions: &mut Vec<Completion>) -> Result<(), ClientError> {
        self.transport.flush()?;
        let next_restart = match self.backing_off {
            0 => None,
            _ => self.sessions.iter().filter_map(|state| state.restart_at).min(),
        };
        let timeout = match next_restart {
            Some(restart_at) => {
                let until = restart_at.saturating_duration_since(Instant::now());
                Some(timeout.map_or(until, |timeout| timeout.min(until)))
            }
            None => timeout,
        };
        let mut replies = std::mem::take(&mut self.replies);
        let polled = self.transport.poll(timeout, |_server, id, response| replies.push((id, response)));
        let mut result: Result<(), ClientError> = polled.map(|_| ()).map_err(ClientError::from);
        for (id, response) in replies.drain(..) {
            if result.is_ok() {
                result = self.on_reply(id, response, completions);
            }
        }
        self.replies = replies;
        result?;
        self.restart_backed_off()?;
        self.expire(completions);
        // Send what the replies caused (COMMITs, round-2 reads, restarts) now, not at the next
        // step: a caller that waits on something else first (the RESP gateway) must not sit on
        // them.
        self.transport.flush()?;
        Ok(())
    }

    /// Starts the next attempt of every transaction whose backoff is over.
    fn restart_backed_off(&mut self) -> Result<(), ClientError> {
        if self.backing_off == 0 {
            return Ok(());
        }
        let now = Instant::now();
        for session in 0..self.sessions.len() {
            let state = &mut self.sessions[session];
            if state.restart_at.is_none_or(|restart_at| restart_at > now) {
                continue;
            }
            state.restart_at = None;
            self.backing_off -= 1;
            match state.txn.as_mut() {
                Some(ActiveTxn::LockingRead(txn)) => txn.start(&mut self.outgoing),
                Some(ActiveTxn::LockingWrite(txn)) => txn.start(&mut self.outgoing),
                _ => {}
            }
            self.post_outgoing(session)?;
        }
        Ok(())
    }

    fn on_reply(&mut self, id: u64, response: Response, completions: &mut Vec<Completion>) -> Result<(), ClientError> {
        let (session, generation, tag) = split_request_id(id);
        let Some(state) = self.sessions.get_mut(session) else {
            return Ok(()); // not ours: ignore
        };
        if state.generation != generation {
            return Ok(()); // a late reply to an abandoned transaction
        }
        let step = match state.txn.as_mut() {
            None => return Ok(()),
            Some(ActiveTxn::Read(txn)) => {
                txn.on_reply(tag, response, &mut self.outgoing).map(|step| map_step(step, TxnResult::Read))
            }
            Some(ActiveTxn::Write(txn)) => {
                txn.on_reply(tag, response, &mut self.outgoing).map(|step| map_step(step, TxnResult::Write))
            }
            Some(ActiveTxn::LockingRead(txn)) => {
                txn.on_reply(tag, response, &mut self.outgoing).map(|step| map_step(step, TxnResult::Read))
            }
            Some(ActiveTxn::LockingWrite(txn)) => {
                txn.on_reply(tag, response, &mut self.outgoing).map(|step| map_step(step, TxnResult::Write))
            }
        };
        match step {
            Ok(Step::Pending) => self.post_outgoing(session)?,
            Ok(Step::Backoff(delay)) => {
                self.post_outgoing(session)?; // the releases
                let state = &mut self.sessions[session];
                if state.restart_at.replace(Instant::now() + delay).is_none() {
                    self.backing_off += 1;
                }
            }
            Ok(Step::Done(result)) => {
                // A finished transaction may still have messages to send (S2PL releases);
                // their replies come back under this generation and are dropped later.
                self.post_outgoing(session)?;
                let state = &mut self.sessions[session];
                if let TxnResult::Read(outcome) = &result {
                    let newest = outcome.items.iter().map(|item| item.ts).max().unwrap_or(0);
                    state.clock.observe(newest, wall_clock_us());
                }
                self.finish(session, Ok(result), completions);
            }
            Err(error) => {
                self.outgoing.clear();
                self.finish(session, Err(error.into()), completions);
            }
        }
        Ok(())
    }

    fn finish(&mut self, session: usize, result: Result<TxnResult, ClientError>, completions: &mut Vec<Completion>) {
        let state = &mut self.sessions[session];
        debug_assert!(state.txn.is_some());
        state.txn = None;
        self.active -= 1;
        completions.push(Completion { session, result });
    }

    fn expire(&mut self, completions: &mut Vec<Completion>) {
        if self.active == 0 {
            return;
        }
        let now = Instant::now();
        if now < self.next_expiry_scan {
            return;
        }
        self.next_expiry_scan = now + Duration::from_millis(DRIVER_EXPIRY_SCAN_INTERVAL_MS);
        for session in 0..self.sessions.len() {
            let state = &mut self.sessions[session];
            if state.txn.is_some() && state.deadline <= now {
                // Bump the generation so that late replies are dropped.
                state.generation = state.generation.wrapping_add(1);
                if state.restart_at.take().is_some() {
                    self.backing_off -= 1;
                }
                self.finish(session, Err(ClientError::Timeout), completions);
            }
        }
    }
}

fn map_step<O>(step: Step<O>, wrap: impl FnOnce(O) -> TxnResult) -> Step<TxnResult> {
    match step {
        Step::Pending => Step::Pending,
        Step::Backoff(delay) => Step::Backoff(delay),
        Step::Done(outcome) => Step::Done(wrap(outcome)),
    }
}

/// Asks server 0 for `count` client ids; returns the first.
fn hello<T: ClientTransport>(transport: &mut T, count: u16) -> Result<u16, ClientError> {
    transport.post(0, 0, &Request::Hello { client_ids_wanted: count })?;
    transport.flush()?;
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let mut reply = None;
    while reply.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        transport.poll(Some(left), |_, _, response| reply = Some(response))?;
    }
    match reply {
        Some(Response::Hello { client_id_first, client_ids_granted })
            if client_ids_granted >= count && client_id_first > 0 =>
        {
            Ok(client_id_first)
        }
        other => Err(ClientError::Handshake(format!("unexpected HELLO reply {other:?}"))),
    }
}
