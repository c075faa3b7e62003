//! The client's session machine: the transactions of many logical clients, I/O-free.
//!
//! Each *session* is one logical client: its own client id and timestamp clock, and at most one
//! transaction at a time (a closed loop). The machine starts transactions, picks the algorithm's
//! machine (RAMP read or write, S2PL locking read or write), numbers the requests they emit,
//! routes replies back to them, backs off and restarts aborted S2PL attempts, abandons
//! transactions past their deadline, and reports finished ones. It owns no transport, thread or
//! clock: the caller passes the time, posts the [`Post`]s it returns and feeds it the replies.
//! The client driver (`rampkv_net::client::Driver`) is this machine plus a transport and a
//! clock; the seeded simulation and the model check drive the very same machine.
//!
//! # Unavailable servers
//! The caller says which servers it cannot reach ([`Sessions::set_server_available`]). A
//! transaction that needs a partition whose server is unavailable fails with
//! [`TxnError::Unavailable`] naming those partitions: one in flight at once (its late replies
//! are dropped), a new one before it sends anything (reported by the next
//! [`Sessions::tick`]). Transactions on the other partitions go on. A write that fails this
//! way after its commit was sent may be visible on the servers that got the commit (as after a
//! timeout): the error says the outcome is unknown, not that nothing was written.
//!
//! # Request ids
//! `session (24 bits) << 40 | generation (8 bits) << 32 | tag (32 bits)`. The generation
//! changes with every transaction of a session, so a late reply to an abandoned transaction
//! (a timeout) is recognised and dropped instead of reaching the next one.

use std::time::Duration;

use super::keyspace::{CountTxn, ListTxn};
use super::locking::{LockingReadTxn, LockingWriteTxn};
use super::ramp::{Algorithm, ReadBuffers, ReadTxn, TxnOptions, WriteTxn};
use super::update::{UpdateStep, UpdateTxn};
use super::{writes_of_pairs, Outgoing, ProtocolError, ReadOutcome, Step, WriteOutcome};
use crate::cluster::Cluster;
use crate::limits::{DRIVER_EXPIRY_SCAN_INTERVAL_MS, TXN_TIMEOUT_MS};
use crate::types::{unix_ms_of_wall_clock_us, ClockError, Timestamp, TimestampClock};
use crate::wire::{KeyPage, Request, Response, UpdateOp, UpdateResult, Write};

const SESSION_BITS: u32 = 24;
/// Most sessions one machine runs (request ids carry 24 bits of session; client ids 16).
pub const SESSIONS_MAX: usize = u16::MAX as usize;

/// A request to post: the caller hands it to its transport (or simulated network).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    pub server: usize,
    pub request_id: u64,
    pub request: Request,
}

/// A finished transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnResult {
    Read(ReadOutcome),
    Write(WriteOutcome),
    /// A page of a partition's live keys ([`Sessions::begin_list`]).
    Keys(KeyPage),
    /// The count of the cluster's live keys ([`Sessions::begin_count`]).
    KeyCount(u64),
    /// A single-key update's result (`Done` or a refusal of the op: never `Busy` or
    /// `TsTooLow`, which the session retries).
    Update(UpdateResult),
}

/// Why a transaction failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("the transaction did not finish in time")]
    Timeout,
    /// The session's clock could not issue the timestamp an update's retry needs.
    #[error(transparent)]
    Clock(#[from] ClockError),
    /// The transaction needs partitions no reachable server holds (their server is down or
    /// unreachable). Nothing was sent for a transaction refused before it started; one that
    /// failed in flight may have been applied where it reached (a write past its commit).
    #[error("partitions {partitions:?} are unavailable: no reachable server holds them")]
    Unavailable { partitions: Vec<u32> },
}

/// One finished transaction of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub session: usize,
    pub result: Result<TxnResult, TxnError>,
}

/// Why a transaction could not start, or the machine not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("need 1..={SESSIONS_MAX} sessions with client ids that fit 16 bits, got {sessions} from client id {first_client_id}")]
    Sessions { sessions: usize, first_client_id: u16 },
    #[error("no session {session} (there are {sessions})")]
    NoSuchSession { session: usize, sessions: usize },
    #[error("session {session} is busy")]
    Busy { session: usize },
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The session's clock cannot issue a timestamp (the wall clock is past 2033, or wrong).
    #[error(transparent)]
    Clock(#[from] ClockError),
}

/// The transaction a session runs: one of the five machines.
#[derive(Debug)]
enum ActiveTxn {
    Read(ReadTxn),
    Write(WriteTxn),
    LockingRead(LockingReadTxn),
    LockingWrite(LockingWriteTxn),
    List(ListTxn),
    Count(CountTxn),
    Update(UpdateTxn),
}

impl ActiveTxn {
    fn on_reply(
        &mut self,
        tag: u32,
        response: Response,
        out: &mut Vec<Outgoing>,
    ) -> Result<Step<TxnResult>, ProtocolError> {
        Ok(match self {
            ActiveTxn::Read(txn) => map_step(txn.on_reply(tag, response, out)?, TxnResult::Read),
            ActiveTxn::Write(txn) => map_step(txn.on_reply(tag, response, out)?, TxnResult::Write),
            ActiveTxn::LockingRead(txn) => map_step(txn.on_reply(tag, response, out)?, TxnResult::Read),
            ActiveTxn::LockingWrite(txn) => map_step(txn.on_reply(tag, response, out)?, TxnResult::Write),
            ActiveTxn::List(txn) => map_step(txn.on_reply(tag, response)?, TxnResult::Keys),
            ActiveTxn::Count(txn) => map_step(txn.on_reply(tag, response)?, TxnResult::KeyCount),
            ActiveTxn::Update(_) => {
                unreachable!("a session takes an update's replies itself (Sessions::on_update_reply)")
            }
        })
    }

    /// Calls `each` with the partition of every key the transaction touches (of every
    /// partition a key space request names).
    fn for_each_partition(&self, cluster: &Cluster, mut each: impl FnMut(u32)) {
        let mut key = |key: &[u8]| each(cluster.partition_of(key));
        match self {
            ActiveTxn::Read(txn) => txn.keys().iter().for_each(|k| key(k)),
            ActiveTxn::Write(txn) => txn.write_set().iter().for_each(|k| key(k)),
            ActiveTxn::LockingRead(txn) => txn.keys().iter().for_each(|k| key(k)),
            ActiveTxn::LockingWrite(txn) => txn.keys().for_each(key),
            ActiveTxn::List(txn) => each(txn.partition()),
            ActiveTxn::Count(txn) => txn.partitions().for_each(each),
            ActiveTxn::Update(txn) => key(txn.key()),
        }
    }

    fn restart(&mut self, out: &mut Vec<Outgoing>) {
        match self {
            ActiveTxn::LockingRead(txn) => txn.start(out),
            ActiveTxn::LockingWrite(txn) => txn.start(out),
            ActiveTxn::Update(txn) => txn.restart(out),
            _ => debug_assert!(false, "only locking transactions and updates back off"),
        }
    }
}

#[derive(Debug)]
struct Session {
    clock: TimestampClock,
    generation: u8,
    txn: Option<ActiveTxn>,
    deadline_us: u64,
    /// When an aborted (S2PL) transaction starts its next attempt.
    restart_at_us: Option<u64>,
}

/// Which servers the caller can reach.
#[derive(Debug)]
struct Availability {
    /// Per server: whether it is unavailable.
    down: Vec<bool>,
    /// How many are (the checks are skipped while none is).
    down_count: usize,
}

/// The transactions of many sessions; see the module docs.
#[derive(Debug)]
pub struct Sessions {
    cluster: Cluster,
    sessions: Vec<Session>,
    /// What the transaction machines emitted, before it is numbered into posts.
    outgoing: Vec<Outgoing>,
    active: usize,
    /// Sessions whose `restart_at_us` is set (the scans for them are skipped while there are none).
    backing_off: usize,
    /// When `tick` next looks at the sessions' deadlines (at most every
    /// `DRIVER_EXPIRY_SCAN_INTERVAL_MS`: a scan reads every session, and a gateway has 1,024).
    next_expiry_scan_us: u64,
    options: TxnOptions,
    txn_timeout_us: u64,
    availability: Availability,
    /// Transactions refused before they started (they need an unavailable partition), with
    /// those partitions: failed by the next `tick`.
    refused: Vec<(usize, Vec<u32>)>,
    /// The buffers of the last finished RAMP read, for the next one (one set for all
    /// sessions: a closed loop starts its next read right after one finishes).
    spare_read: ReadBuffers,
}

fn request_id(session: usize, generation: u8, tag: u32) -> u64 {
    ((session as u64) << 40) | (u64::from(generation) << 32) | u64::from(tag)
}

fn split_request_id(request_id: u64) -> (usize, u8, u32) {
    ((request_id >> 40) as usize, (request_id >> 32) as u8, request_id as u32)
}

/// The session a request id of this machine belongs to (a network model keeps each
/// session's requests to one server in order: a RELEASE must follow its lock request).
pub fn session_of_request(request_id: u64) -> usize {
    split_request_id(request_id).0
}

impl Sessions {
    /// `sessions` logical clients with client ids `first_client_id..` (handed out by a server's
    /// HELLO, so that timestamps are unique across the cluster).
    pub fn new(cluster: Cluster, first_client_id: u16, sessions: usize) -> Result<Self, SessionError> {
        let last_client_id = usize::from(first_client_id) + sessions.saturating_sub(1);
        let fits = first_client_id > 0 && last_client_id <= usize::from(u16::MAX);
        if sessions == 0 || sessions > SESSIONS_MAX || sessions >= 1 << SESSION_BITS || !fits {
            return Err(SessionError::Sessions { sessions, first_client_id });
        }
        let sessions = (0..sessions)
            .map(|index| Session {
                clock: TimestampClock::new(first_client_id + index as u16),
                generation: 0,
                txn: None,
                deadline_us: 0,
                restart_at_us: None,
            })
            .collect();
        Ok(Sessions {
            sessions,
            outgoing: Vec::new(),
            active: 0,
            backing_off: 0,
            next_expiry_scan_us: 0,
            options: TxnOptions::default(),
            txn_timeout_us: TXN_TIMEOUT_MS * 1_000,
            availability: Availability { down: vec![false; cluster.servers().len()], down_count: 0 },
            refused: Vec::new(),
            spare_read: ReadBuffers::default(),
            cluster,
        })
    }

    /// Sets the algorithm (and its options) of every later transaction.
    pub fn set_txn_options(&mut self, options: TxnOptions) {
        self.options = options;
    }

    /// The options transactions run with.
    pub fn txn_options(&self) -> &TxnOptions {
        &self.options
    }

    /// How long a transaction may take before it fails with a timeout (default
    /// `TXN_TIMEOUT_MS`; `Duration::MAX`: never).
    pub fn set_txn_timeout(&mut self, timeout: Duration) {
        self.txn_timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    }

    /// The cluster the transactions run on.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Number of sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Moves every session's clock past everything the same session of `earlier` issued or
    /// observed ([`TimestampClock::follow`]): sessions that replace those (a client reconnected
    /// after a failover) keep each session's timestamps increasing.
    pub fn follow_clocks(&mut self, earlier: &Sessions) {
        for (session, before) in self.sessions.iter_mut().zip(&earlier.sessions) {
            session.clock.follow(&before.clock);
        }
    }

    /// The client id of a session.
    pub fn client_id(&self, session: usize) -> u16 {
        self.sessions[session].clock.client_id()
    }

    /// Sessions with a transaction in flight.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Whether `session` runs a transaction.
    pub fn is_busy(&self, session: usize) -> bool {
        self.sessions.get(session).is_some_and(|state| state.txn.is_some())
    }

    /// Starts a read-only transaction of `keys` on an idle session at `now_us` (the caller's
    /// monotonic clock); `wall_us` reads the wall clock a locking read's timestamp is taken
    /// from (only S2PL reads need one: a RAMP read costs no clock read). Its requests go to
    /// `posts`.
    pub fn begin_read(
        &mut self,
        session: usize,
        keys: Vec<Vec<u8>>,
        now_us: u64,
        wall_us: impl FnOnce() -> u64,
        posts: &mut Vec<Post>,
    ) -> Result<(), SessionError> {
        self.check_idle(session)?;
        let txn = if self.options.algorithm == Algorithm::S2pl {
            // Locking reads need a timestamp: their age under wait-die.
            let ts = self.sessions[session].clock.next(wall_us())?;
            ActiveTxn::LockingRead(LockingReadTxn::new(&self.cluster, ts, keys)?)
        } else {
            let buffers = std::mem::take(&mut self.spare_read);
            ActiveTxn::Read(ReadTxn::with_buffers(&self.cluster, keys, self.options, buffers)?)
        };
        self.activate(session, txn, now_us, posts);
        Ok(())
    }

    /// Starts a write-only transaction on an idle session, with the writes `build` makes from
    /// the transaction's timestamp (check-mode values embed it). Returns the timestamp.
    pub fn begin_write_with(
        &mut self,
        session: usize,
        build: impl FnOnce(Timestamp) -> Vec<(Vec<u8>, Vec<u8>)>,
        now_us: u64,
        wall_us: u64,
        posts: &mut Vec<Post>,
    ) -> Result<Timestamp, SessionError> {
        self.begin_write_planned(session, |ts| writes_of_pairs(build(ts)), false, now_us, wall_us, posts)
    }

    /// Starts a write-only transaction of [`Write`]s, which may expire or delete, on an idle
    /// session, with the writes `build` makes from the timestamp; `independent` as
    /// [`Sessions::begin_independent_writes`]. Returns the timestamp.
    pub fn begin_writes(
        &mut self,
        session: usize,
        build: impl FnOnce(Timestamp) -> Vec<Write>,
        independent: bool,
        now_us: u64,
        wall_us: u64,
        posts: &mut Vec<Post>,
    ) -> Result<Timestamp, SessionError> {
        self.begin_write_planned(session, build, independent, now_us, wall_us, posts)
    }

    /// Starts independent one-key writes sharing one timestamp on an idle session
    /// ([`WriteTxn::independent`]: not atomic together; RAMP-Fast only, other algorithms
    /// write them as one transaction). Returns the timestamp.
    pub fn begin_independent_writes(
        &mut self,
        session: usize,
        writes: Vec<(Vec<u8>, Vec<u8>)>,
        now_us: u64,
        wall_us: u64,
        posts: &mut Vec<Post>,
    ) -> Result<Timestamp, SessionError> {
        self.begin_write_planned(session, |_| writes_of_pairs(writes), true, now_us, wall_us, posts)
    }

    fn begin_write_planned(
        &mut self,
        session: usize,
        build: impl FnOnce(Timestamp) -> Vec<Write>,
        independent: bool,
        now_us: u64,
        wall_us: u64,
        posts: &mut Vec<Post>,
    ) -> Result<Timestamp, SessionError> {
        self.check_idle(session)?;
        let ts = self.sessions[session].clock.next(wall_us)?;
        let txn = match (self.options.algorithm, independent) {
            (Algorithm::S2pl, _) => {
                ActiveTxn::LockingWrite(LockingWriteTxn::with_writes(&self.cluster, ts, build(ts))?)
            }
            (_, true) => ActiveTxn::Write(WriteTxn::independent_writes(&self.cluster, ts, build(ts), self.options)?),
            (_, false) => ActiveTxn::Write(WriteTxn::with_writes(&self.cluster, ts, build(ts), self.options)?),
        };
        self.activate(session, txn, now_us, posts);
        Ok(ts)
    }

    /// Starts a listing page on an idle session: the live keys of `partition` after hash
    /// `after` (`None`: from its start), at most `keys_max` (clamped to the listing's bound).
    pub fn begin_list(
        &mut self,
        session: usize,
        partition: u32,
        after: Option<u64>,
        keys_max: usize,
        now_us: u64,
        posts: &mut Vec<Post>,
    ) -> Result<(), SessionError> {
        self.check_idle(session)?;
        let txn = ActiveTxn::List(ListTxn::new(&self.cluster, partition, after, keys_max)?);
        self.activate(session, txn, now_us, posts);
        Ok(())
    }

    /// Starts counting the cluster's live keys on an idle session.
    pub fn begin_count(&mut self, session: usize, now_us: u64, posts: &mut Vec<Post>) -> Result<(), SessionError> {
        self.check_idle(session)?;
        let txn = CountTxn::new(&self.cluster);
        debug_assert!(!txn.is_done(), "a cluster has partitions");
        self.activate(session, ActiveTxn::Count(txn), now_us, posts);
        Ok(())
    }

    /// Starts a single-key conditional update (`protocol::update`) of `key` on an idle
    /// session. Returns its first timestamp (a retry after `TsTooLow` takes a newer one).
    /// Refused under S2PL.
    pub fn begin_update(
        &mut self,
        session: usize,
        key: Vec<u8>,
        op: UpdateOp,
        now_us: u64,
        wall_us: u64,
        posts: &mut Vec<Post>,
    ) -> Result<Timestamp, SessionError> {
        self.check_idle(session)?;
        let ts = self.sessions[session].clock.next(wall_us)?;
        let txn = ActiveTxn::Update(UpdateTxn::new(&self.cluster, ts, key, op, &self.options)?);
        self.activate(session, txn, now_us, posts);
        Ok(ts)
    }

    fn check_idle(&self, session: usize) -> Result<(), SessionError> {
        match self.sessions.get(session) {
            None => Err(SessionError::NoSuchSession { session, sessions: self.sessions.len() }),
            Some(state) if state.txn.is_some() => Err(SessionError::Busy { session }),
            Some(_) => Ok(()),
        }
    }

    /// Starts `txn` on `session`, unless it needs an unavailable partition: then it sends
    /// nothing and the next `tick` fails it.
    fn activate(&mut self, session: usize, mut txn: ActiveTxn, now_us: u64, posts: &mut Vec<Post>) {
        let unavailable = self.unavailable_partitions(&txn, None);
        if unavailable.is_empty() {
            match &mut txn {
                ActiveTxn::Read(txn) => txn.start(&mut self.outgoing),
                ActiveTxn::Write(txn) => txn.start(&mut self.outgoing),
                ActiveTxn::LockingRead(txn) => txn.start(&mut self.outgoing),
                ActiveTxn::LockingWrite(txn) => txn.start(&mut self.outgoing),
                ActiveTxn::List(txn) => txn.start(&mut self.outgoing),
                ActiveTxn::Count(txn) => txn.start(&mut self.outgoing),
                ActiveTxn::Update(txn) => txn.start(&mut self.outgoing),
            }
        } else {
            self.refused.push((session, unavailable));
        }
        let state = &mut self.sessions[session];
        state.generation = state.generation.wrapping_add(1);
        state.deadline_us = now_us.saturating_add(self.txn_timeout_us);
        state.txn = Some(txn);
        self.active += 1;
        self.number_outgoing(session, posts);
    }

    /// The partitions `txn` needs whose server is unavailable (`only`: that server's alone),
    /// sorted and distinct. Reads no key while every server is available.
    fn unavailable_partitions(&self, txn: &ActiveTxn, only: Option<usize>) -> Vec<u32> {
        let mut partitions = Vec::new();
        if self.availability.down_count == 0 {
            return partitions;
        }
        txn.for_each_partition(&self.cluster, |partition| {
            let owner = self.cluster.owner_of_partition(partition);
            let unavailable = owner.is_some_and(|owner| {
                only.map_or(self.availability.down.get(owner).copied().unwrap_or(false), |only| owner == only)
            });
            if unavailable {
                partitions.push(partition);
            }
        });
        partitions.sort_unstable();
        partitions.dedup();
        partitions
    }

    /// Whether the caller can reach every server (as it last said).
    pub fn all_available(&self) -> bool {
        self.availability.down_count == 0
    }

    /// Whether the caller can reach `server` (as it last said; all can at first).
    pub fn server_available(&self, server: usize) -> bool {
        !self.availability.down.get(server).copied().unwrap_or(false)
    }

    /// Says whether the caller can reach `server`. When it cannot, every transaction in flight
    /// that needs one of its partitions fails now with [`TxnError::Unavailable`] (to
    /// `completions`; late replies are dropped), and later ones that need them fail before
    /// they send anything, until the server is available again.
    pub fn set_server_available(&mut self, server: usize, available: bool, completions: &mut Vec<Completion>) {
        let Some(down) = self.availability.down.get_mut(server) else {
            debug_assert!(false, "no server {server}");
            return;
        };
        if *down != available {
            return; // already so (down is the opposite of available)
        }
        *down = !available;
        if available {
            self.availability.down_count -= 1;
            return;
        }
        self.availability.down_count += 1;
        for session in 0..self.sessions.len() {
            let Some(txn) = self.sessions[session].txn.as_ref() else { continue };
            if self.refused.iter().any(|(refused, _)| *refused == session) {
                continue; // failed by the next tick already
            }
            let partitions = self.unavailable_partitions(txn, Some(server));
            if partitions.is_empty() {
                continue;
            }
            let state = &mut self.sessions[session];
            state.generation = state.generation.wrapping_add(1); // late replies are dropped
            if state.restart_at_us.take().is_some() {
                self.backing_off -= 1;
            }
            self.finish(session, Err(TxnError::Unavailable { partitions }), completions);
        }
    }

    /// Whether transactions refused at their start wait for the next `tick` to report them
    /// (the caller should tick without waiting).
    pub fn has_refused(&self) -> bool {
        !self.refused.is_empty()
    }

    /// Turns what the session's transaction emitted into posts under its current generation.
    fn number_outgoing(&mut self, session: usize, posts: &mut Vec<Post>) {
        let generation = self.sessions[session].generation;
        posts.extend(self.outgoing.drain(..).map(|Outgoing { server, tag, request }| Post {
            server,
            request_id: request_id(session, generation, tag),
            request,
        }));
    }

    /// Feeds one reply (`request_id` as posted) at `now_us` (`wall_us` reads the wall clock,
    /// at most once: when a finished read's newest timestamp is to be observed, or a version
    /// it got expires and is to be judged, [`ReadOutcome::judge_expiry`]): the requests it
    /// causes go to `posts`, a transaction it finishes to `completions`. A reply to no current
    /// transaction (another machine's, an abandoned transaction's) is dropped.
    pub fn on_reply(
        &mut self,
        request_id: u64,
        response: Response,
        now_us: u64,
        wall_us: impl FnOnce() -> u64,
        posts: &mut Vec<Post>,
        completions: &mut Vec<Completion>,
    ) {
        let (session, generation, tag) = split_request_id(request_id);
        let Some(state) = self.sessions.get_mut(session) else { return };
        if state.generation != generation {
            return; // a late reply to an abandoned transaction
        }
        let Some(txn) = state.txn.as_mut() else { return };
        if let ActiveTxn::Update(_) = txn {
            return self.on_update_reply(session, tag, response, now_us, wall_us, posts, completions);
        }
        match txn.on_reply(tag, response, &mut self.outgoing) {
            Ok(Step::Pending) => self.number_outgoing(session, posts),
            Ok(Step::Backoff(delay)) => {
                self.number_outgoing(session, posts); // the releases
                let restart_at_us = now_us.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX));
                if self.sessions[session].restart_at_us.replace(restart_at_us).is_none() {
                    self.backing_off += 1;
                }
            }
            Ok(Step::Done(result)) => {
                // A finished transaction may still have messages to send (S2PL releases);
                // their replies come back under this generation and are dropped later.
                self.number_outgoing(session, posts);
                let mut result = result;
                if let TxnResult::Read(outcome) = &mut result {
                    // The wall clock is read only when needed, and once.
                    let mut wall_us = LazyClock::new(wall_us);
                    outcome.judge_expiry(|| unix_ms_of_wall_clock_us(wall_us.read()));
                    let newest = outcome.items.iter().map(|item| item.ts).max().unwrap_or(0);
                    let clock = &mut self.sessions[session].clock;
                    // The wall clock bounds how far ahead an observed timestamp may be; it is
                    // read only when the read would move the clock.
                    if clock.is_behind(newest) {
                        clock.observe(newest, wall_us.read());
                    }
                }
                self.finish(session, Ok(result), completions);
            }
            Err(error) => {
                self.outgoing.clear();
                self.finish(session, Err(error.into()), completions);
            }
        }
    }

    /// An update's reply: done, a backoff (`Busy`), or at once a new attempt with a newer
    /// timestamp (`TsTooLow`: the clock observes the newest the server named first).
    #[allow(clippy::too_many_arguments)] // on_reply's arguments, passed on
    fn on_update_reply(
        &mut self,
        session: usize,
        tag: u32,
        response: Response,
        now_us: u64,
        wall_us: impl FnOnce() -> u64,
        posts: &mut Vec<Post>,
        completions: &mut Vec<Completion>,
    ) {
        let state = &mut self.sessions[session];
        let Some(ActiveTxn::Update(txn)) = state.txn.as_mut() else { return };
        let step = match txn.on_reply(tag, response) {
            Ok(None) => return, // a late reply to an earlier attempt
            Ok(Some(step)) => step,
            Err(error) => return self.finish(session, Err(error.into()), completions),
        };
        match step {
            UpdateStep::Done(result) => self.finish(session, Ok(TxnResult::Update(result)), completions),
            UpdateStep::Backoff(delay) => {
                let restart_at_us = now_us.saturating_add(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX));
                if state.restart_at_us.replace(restart_at_us).is_none() {
                    self.backing_off += 1;
                }
            }
            UpdateStep::NewTimestamp { newest } => {
                let wall = wall_us();
                // A newest timestamp too far ahead of the wall clock is not followed (observe
                // refuses it): the next attempt is then refused again, and the bound ends it.
                state.clock.observe(newest, wall);
                match state.clock.next(wall) {
                    Ok(ts) => {
                        txn.restart_at(ts, &mut self.outgoing);
                        self.number_outgoing(session, posts);
                    }
                    Err(error) => self.finish(session, Err(error.into()), completions),
                }
            }
        }
    }

    /// Advances time to `now_us`: aborted transactions whose backoff is over start their next
    /// attempt (to `posts`), and transactions past their deadline fail with a timeout.
    pub fn tick(&mut self, now_us: u64, posts: &mut Vec<Post>, completions: &mut Vec<Completion>) {
        for (session, partitions) in std::mem::take(&mut self.refused) {
            self.finish(session, Err(TxnError::Unavailable { partitions }), completions);
        }
        self.restart_backed_off(now_us, posts);
        self.expire(now_us, completions);
    }

    /// When the earliest backed-off transaction restarts (the caller wakes up for it), if any.
    pub fn next_restart_us(&self) -> Option<u64> {
        match self.backing_off {
            0 => None,
            _ => self.sessions.iter().filter_map(|state| state.restart_at_us).min(),
        }
    }

    /// Abandons every session's transaction without a completion (a client that crashed): late
    /// replies to them are dropped.
    pub fn abandon_all(&mut self) {
        for state in &mut self.sessions {
            if state.txn.take().is_some() {
                state.generation = state.generation.wrapping_add(1);
            }
            state.restart_at_us = None;
        }
        self.active = 0;
        self.backing_off = 0;
        self.refused.clear();
    }

    fn restart_backed_off(&mut self, now_us: u64, posts: &mut Vec<Post>) {
        if self.backing_off == 0 {
            return;
        }
        for session in 0..self.sessions.len() {
            let state = &mut self.sessions[session];
            if state.restart_at_us.is_none_or(|restart_at_us| restart_at_us > now_us) {
                continue;
            }
            state.restart_at_us = None;
            self.backing_off -= 1;
            if let Some(txn) = state.txn.as_mut() {
                txn.restart(&mut self.outgoing);
            }
            self.number_outgoing(session, posts);
        }
    }

    fn finish(&mut self, session: usize, result: Result<TxnResult, TxnError>, completions: &mut Vec<Completion>) {
        let state = &mut self.sessions[session];
        debug_assert!(state.txn.is_some(), "only a running transaction finishes");
        // The buffers are taken in place: moving the whole machine out costs a copy of it.
        if let Some(ActiveTxn::Read(txn)) = state.txn.as_mut() {
            self.spare_read = txn.take_buffers();
        }
        state.txn = None;
        self.active -= 1;
        completions.push(Completion { session, result });
    }

    fn expire(&mut self, now_us: u64, completions: &mut Vec<Completion>) {
        if self.active == 0 || now_us < self.next_expiry_scan_us {
            return;
        }
        self.next_expiry_scan_us = now_us + DRIVER_EXPIRY_SCAN_INTERVAL_MS * 1_000;
        for session in 0..self.sessions.len() {
            let state = &mut self.sessions[session];
            if state.txn.is_some() && state.deadline_us <= now_us {
                // Bump the generation so that late replies are dropped.
                state.generation = state.generation.wrapping_add(1);
                if state.restart_at_us.take().is_some() {
                    self.backing_off -= 1;
                }
                self.finish(session, Err(TxnError::Timeout), completions);
            }
        }
    }
}

/// A clock read at most once, when first asked.
struct LazyClock<F: FnOnce() -> u64> {
    read: Option<F>,
    value: u64,
}

impl<F: FnOnce() -> u64> LazyClock<F> {
    fn new(read: F) -> Self {
        Self { read: Some(read), value: 0 }
    }

    fn read(&mut self) -> u64 {
        if let Some(read) = self.read.take() {
            self.value = read();
        }
        self.value
    }
}

fn map_step<O>(step: Step<O>, wrap: impl FnOnce(O) -> TxnResult) -> Step<TxnResult> {
    match step {
        Step::Pending => Step::Pending,
        Step::Backoff(delay) => Step::Backoff(delay),
        Step::Done(outcome) => Step::Done(wrap(outcome)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of each server of `cluster` (the first names that land there).
    fn key_on(cluster: &Cluster, server: usize) -> Vec<u8> {
        (0u32..10_000)
            .map(|n| format!("key-{n}").into_bytes())
            .find(|key| cluster.server_of(key) == server)
            .expect("some key lands on every server")
    }

    #[test]
    fn an_unavailable_server_fails_only_the_transactions_that_need_its_partitions() {
        let addresses = (0..3).map(|n| format!("127.0.0.1:{}", 7000 + n)).collect();
        let cluster = Cluster::with_servers(addresses).unwrap();
        let keys: Vec<Vec<u8>> = (0..3).map(|server| key_on(&cluster, server)).collect();
        let dead_partition = cluster.partition_of(&keys[1]);
        let mut sessions = Sessions::new(cluster, 1, 4).unwrap();
        let (mut posts, mut completions) = (Vec::new(), Vec::new());
        // In flight: a read of servers 0 and 1, a write to 2, a read of 0.
        sessions.begin_read(0, vec![keys[0].clone(), keys[1].clone()], 0, || 1, &mut posts).unwrap();
        sessions.begin_write_with(1, |_| vec![(keys[2].clone(), b"v".to_vec())], 0, 1_000, &mut posts).unwrap();
        sessions.begin_read(2, vec![keys[0].clone()], 0, || 1, &mut posts).unwrap();
        let before = posts.len();
        sessions.set_server_available(1, false, &mut completions);
        assert_eq!(completions.len(), 1, "{completions:?}");
        assert_eq!(completions[0].session, 0);
        assert_eq!(completions[0].result, Err(TxnError::Unavailable { partitions: vec![dead_partition] }));
        assert_eq!(sessions.active(), 2, "the others go on");
        // A late reply to the failed read is dropped.
        let late = posts.iter().find(|post| post.server == 0 && session_of_request(post.request_id) == 0).unwrap();
        sessions.on_reply(late.request_id, Response::Versions { items: vec![] }, 1, || 1, &mut posts, &mut completions);
        assert_eq!(completions.len(), 1);
        // A new transaction on the dead partition sends nothing and fails at the next tick; one
        // on a live partition starts.
        completions.clear();
        posts.truncate(before);
        sessions.begin_read(0, vec![keys[1].clone(), keys[0].clone()], 2, || 1, &mut posts).unwrap();
        assert_eq!(posts.len(), before, "nothing is sent for a refused transaction");
        assert!(sessions.has_refused() && sessions.is_busy(0));
        sessions.begin_read(3, vec![keys[2].clone()], 2, || 1, &mut posts).unwrap();
        assert!(posts.len() > before);
        sessions.tick(3, &mut posts, &mut completions);
        assert_eq!(completions.len(), 1);
        assert_eq!(completions[0].result, Err(TxnError::Unavailable { partitions: vec![dead_partition] }));
        assert!(!sessions.has_refused() && !sessions.is_busy(0));
        let message = completions[0].result.as_ref().unwrap_err().to_string();
        assert!(message.contains(&format!("[{dead_partition}]")), "{message}");
        // Available again: the next transaction on it is sent.
        sessions.set_server_available(1, true, &mut completions);
        let sent = posts.len();
        sessions.begin_read(0, vec![keys[1].clone()], 4, || 1, &mut posts).unwrap();
        assert!(posts[sent..].iter().any(|post| post.server == 1));
        assert!(!sessions.has_refused());
    }
}
