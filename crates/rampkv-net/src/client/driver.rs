//! The driver: the session machine ([`rampkv_core::protocol::session`]) over a transport, with
//! the clock.
//!
//! The machine runs many logical clients' transactions without I/O; the driver posts what it
//! emits, feeds it the replies the transport delivers and the time, and reports finished
//! transactions. Many sessions share a thread and its connections, which is how a 2-core
//! machine runs dozens of clients without a thread each.
//!
//! # A server that fails
//! When the transport reports a server down ([`ServerEvent::Down`]), the transactions that need
//! its partitions fail with [`ClientError::Unavailable`] naming them, at once if in flight and
//! before they send anything if new; the others go on. When the transport has connected again
//! ([`ServerEvent::Up`]), the driver says HELLO to the server (without asking for client ids)
//! and uses it once the reply shows the same cluster file; a server that refuses, or answers
//! with another cluster file, is disconnected and tried again after the backoff. A transaction
//! that needs a down server first lets the transport try to reconnect if its backoff is over,
//! so a blocking client that waits for nothing else sees a restarted server come back.

use std::time::{Duration, Instant};

use super::error::ClientError;
use crate::transport::{ClientTransport, ServerEvent};
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_core::protocol::session::{self, Post, Sessions, TxnError};
use rampkv_core::types::{wall_clock_us, Timestamp};
use rampkv_core::wire::{ClusterView, Request, Response, UpdateOp, Write};

pub use rampkv_core::protocol::session::{TxnResult, SESSIONS_MAX as DRIVER_SESSIONS_MAX};

/// How long a driver waits for the HELLO reply that hands out client ids (or, from a
/// reconnected server, checks its cluster file).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The request id of the HELLO to a reconnected server: its session part (the top 24 bits) is
/// past every session, so no transaction's reply can be taken for it, nor it for one.
const REHELLO_REQUEST_ID: u64 = u64::MAX;

/// One finished transaction of a session, as reported by [`Driver::step`].
#[derive(Debug)]
pub struct Completion {
    pub session: usize,
    pub result: Result<TxnResult, ClientError>,
}

/// Runs transactions of many sessions over one transport.
#[derive(Debug)]
pub struct Driver<T: ClientTransport> {
    transport: T,
    sessions: Sessions,
    /// The origin of the monotonic time the machine is fed.
    origin: Instant,
    /// What the machine emitted, before it is posted (allocated once).
    posts: Vec<Post>,
    /// Replies of one poll and completions of one step (allocated once).
    replies: Vec<(u64, Response)>,
    finished: Vec<session::Completion>,
    /// Server events taken from the transport, being handled.
    events: Vec<ServerEvent>,
}

impl<T: ClientTransport> Driver<T> {
    /// A driver with `sessions` logical clients; asks the cluster's first server for their
    /// client ids (so timestamps are unique across every client of the cluster).
    pub fn connect(mut transport: T, cluster: Cluster, sessions: usize) -> Result<Self, ClientError> {
        if transport.server_count() != cluster.servers().len() {
            let (transport, cluster) = (transport.server_count(), cluster.servers().len());
            return Err(ClientError::ServerCount { transport, cluster });
        }
        let wanted = u16::try_from(sessions).map_err(|_| ClientError::Sessions { sessions })?;
        let first_id = hello(&mut transport, &cluster, wanted)?;
        let sessions = Sessions::new(cluster, first_id, sessions)?;
        Ok(Driver {
            transport,
            sessions,
            origin: Instant::now(),
            posts: Vec::new(),
            replies: Vec::new(),
            finished: Vec::new(),
            events: Vec::new(),
        })
    }

    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    /// Sets the algorithm (and its options) of every later transaction.
    pub fn set_txn_options(&mut self, options: TxnOptions) {
        self.sessions.set_txn_options(options);
    }

    /// The transport (for its statistics).
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The transport, mutable (an event loop that owns the sockets hands it their readiness).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// The options transactions run with.
    pub fn txn_options(&self) -> &TxnOptions {
        self.sessions.txn_options()
    }

    /// Moves each session's clock past that of the same session of `earlier`, the driver this
    /// one replaces (after a failover): a session's timestamps keep increasing across drivers.
    pub fn follow_clocks<U: ClientTransport>(&mut self, earlier: &Driver<U>) {
        self.sessions.follow_clocks(&earlier.sessions);
    }

    /// Number of sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.session_count()
    }

    /// The client id of a session.
    pub fn client_id(&self, session: usize) -> u16 {
        self.sessions.client_id(session)
    }

    /// Sessions with a transaction in flight.
    pub fn active(&self) -> usize {
        self.sessions.active()
    }

    /// Whether finished transactions wait to be reported (failed for an unavailable server):
    /// the next [`Driver::step`] reports them without waiting.
    pub fn has_ready(&self) -> bool {
        self.sessions.has_refused() || !self.finished.is_empty()
    }

    /// Whether every server is in use (none is down or being reconnected).
    pub fn all_servers_available(&self) -> bool {
        self.sessions.all_available()
    }

    /// Starts a read-only transaction of `keys` on an idle session.
    pub fn begin_read(&mut self, session: usize, keys: Vec<Vec<u8>>) -> Result<(), ClientError> {
        self.revive();
        let now_us = self.now_us();
        self.sessions.begin_read(session, keys, now_us, wall_clock_us, &mut self.posts)?;
        self.post()
    }

    /// Starts a write-only transaction on an idle session. Returns its timestamp.
    pub fn begin_write(&mut self, session: usize, writes: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Timestamp, ClientError> {
        self.begin_write_with(session, |_| writes)
    }

    /// Starts a write-only transaction of [`Write`]s, which may expire or delete, on an idle
    /// session; `independent`: as one-key writes at one timestamp, not atomic together
    /// ([`Driver::begin_independent_writes`]). Returns its timestamp.
    pub fn begin_writes(
        &mut self,
        session: usize,
        writes: Vec<Write>,
        independent: bool,
    ) -> Result<Timestamp, ClientError> {
        self.revive();
        let now_us = self.now_us();
        let ts =
            self.sessions.begin_writes(session, |_| writes, independent, now_us, wall_clock_us(), &mut self.posts)?;
        self.post()?;
        Ok(ts)
    }

    /// Starts independent one-key writes on an idle session, all at one timestamp and not
    /// atomic together (RAMP-Fast; other algorithms write them as one transaction): what a
    /// Redis pipeline of SETs promises, at the memory cost of single-key writes (each version
    /// is freed as soon as it is superseded). Returns the timestamp.
    pub fn begin_independent_writes(
        &mut self,
        session: usize,
        writes: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Timestamp, ClientError> {
        self.revive();
        let now_us = self.now_us();
        let ts = self.sessions.begin_independent_writes(session, writes, now_us, wall_clock_us(), &mut self.posts)?;
        self.post()?;
        Ok(ts)
    }

    /// Like [`Driver::begin_write`], with the writes built once the timestamp is known.
    pub fn begin_write_with(
        &mut self,
        session: usize,
        build: impl FnOnce(Timestamp) -> Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Timestamp, ClientError> {
        self.revive();
        let now_us = self.now_us();
        let ts = self.sessions.begin_write_with(session, build, now_us, wall_clock_us(), &mut self.posts)?;
        self.post()?;
        Ok(ts)
    }

    /// Starts a key listing page on an idle session: the live keys of `partition` after hash
    /// `after` (`None`: from its start), at most `keys_max` (clamped to `LIST_PAGE_KEYS_MAX`);
    /// it finishes as [`TxnResult::Keys`].
    pub fn begin_list(
        &mut self,
        session: usize,
        partition: u32,
        after: Option<u64>,
        keys_max: usize,
    ) -> Result<(), ClientError> {
        self.revive();
        let now_us = self.now_us();
        self.sessions.begin_list(session, partition, after, keys_max, now_us, &mut self.posts)?;
        self.post()
    }

    /// Starts counting the cluster's live keys on an idle session; it finishes as
    /// [`TxnResult::KeyCount`].
    pub fn begin_count(&mut self, session: usize) -> Result<(), ClientError> {
        self.revive();
        let now_us = self.now_us();
        self.sessions.begin_count(session, now_us, &mut self.posts)?;
        self.post()
    }

    /// Starts a single-key conditional update of `key` on an idle session
    /// (`rampkv_core::protocol::update`); it finishes as [`TxnResult::Update`]. Returns its
    /// first timestamp.
    pub fn begin_update(&mut self, session: usize, key: Vec<u8>, op: UpdateOp) -> Result<Timestamp, ClientError> {
        self.revive();
        let now_us = self.now_us();
        let ts = self.sessions.begin_update(session, key, op, now_us, wall_clock_us(), &mut self.posts)?;
        self.post()?;
        Ok(ts)
    }

    /// While a server is unavailable: lets the transport reconnect to those whose backoff is
    /// over, and takes the servers that came back into use (before a transaction is refused
    /// for needing one).
    fn revive(&mut self) {
        if self.sessions.all_available() {
            return;
        }
        self.transport.reconnect_due();
        let mut replies = std::mem::take(&mut self.replies);
        self.on_server_events(&mut replies);
        self.replies = replies; // fed to the sessions by the next step
    }

    /// Handles what the transport reports of its servers: a server down fails the
    /// transactions that need it (to `finished`); a server back is checked with a HELLO
    /// (replies of other requests meanwhile go to `replies`) and then used again.
    fn on_server_events(&mut self, replies: &mut Vec<(u64, Response)>) {
        // Each round handles what the previous one's HELLOs let happen; a server comes back at
        // most once per backoff, so this ends; the bound keeps it so.
        for _ in 0..2 * self.transport.server_count() + 1 {
            self.transport.take_server_events(&mut self.events);
            if self.events.is_empty() {
                return;
            }
            for event in std::mem::take(&mut self.events) {
                match event {
                    ServerEvent::Down { server, .. } => {
                        self.sessions.set_server_available(server, false, &mut self.finished);
                    }
                    ServerEvent::Up { server } => {
                        if self.hello_again(server, replies) {
                            self.sessions.set_server_available(server, true, &mut self.finished);
                        } else {
                            self.transport.disconnect(server);
                        }
                    }
                }
            }
        }
    }

    /// Says HELLO to a reconnected server (no client ids wanted) and waits for its reply;
    /// true if it is the server the cluster file names (same partition count and index).
    fn hello_again(&mut self, server: usize, replies: &mut Vec<(u64, Response)>) -> bool {
        let cluster = self.sessions.cluster();
        let view = ClusterView { partitions: cluster.partition_count(), server_index: server as u32 };
        let hello = Request::Hello { client_ids_wanted: 0, cluster: Some(view) };
        if self.transport.post(server, REHELLO_REQUEST_ID, &hello).is_err() || self.transport.flush().is_err() {
            return false;
        }
        let deadline = Instant::now() + HELLO_TIMEOUT;
        let mut reply = None;
        while reply.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let polled = self.transport.poll(Some(left), |from, id, response| {
                if from == server && id == REHELLO_REQUEST_ID {
                    reply = Some(response);
                } else {
                    replies.push((id, response));
                }
            });
            if polled.is_err() {
                return false;
            }
            // Events of other servers wait for the next round; this one going down again ends it.
            let before = self.events.len();
            self.transport.take_server_events(&mut self.events);
            let down_again = self.events[before..]
                .iter()
                .any(|event| matches!(event, ServerEvent::Down { server: down, .. } if *down == server));
            if down_again {
                return false;
            }
        }
        let cluster = self.sessions.cluster();
        reply.is_some_and(|reply| check_hello_reply(cluster, server, reply).is_ok())
    }

    fn post(&mut self) -> Result<(), ClientError> {
        for Post { server, request_id, request } in self.posts.drain(..) {
            self.transport.post_owned(server, request_id, request)?;
        }
        Ok(())
    }

    /// Sends what is queued, waits up to `timeout` for replies (less if a backed-off
    /// transaction restarts sooner), advances the transactions they answer, sends what that
    /// queued, and appends finished ones to `completions`. Transactions past their deadline
    /// finish with [`ClientError::Timeout`].
    pub fn step(&mut self, timeout: Option<Duration>, completions: &mut Vec<Completion>) -> Result<(), ClientError> {
        self.transport.flush()?;
        // Transactions already failed (a server down, a refused start) are reported now.
        let timeout = if self.has_ready() { Some(Duration::ZERO) } else { timeout };
        let timeout = match self.sessions.next_restart_us() {
            Some(restart_us) => {
                let until = Duration::from_micros(restart_us.saturating_sub(self.now_us()));
                Some(timeout.map_or(until, |timeout| timeout.min(until)))
            }
            None => timeout,
        };
        let mut replies = std::mem::take(&mut self.replies);
        let polled = self.transport.poll(timeout, |_server, id, response| replies.push((id, response)));
        self.on_server_events(&mut replies);
        let now_us = self.now_us();
        for (id, response) in replies.drain(..) {
            self.sessions.on_reply(id, response, now_us, wall_clock_us, &mut self.posts, &mut self.finished);
        }
        self.replies = replies;
        self.sessions.tick(now_us, &mut self.posts, &mut self.finished);
        completions.extend(self.finished.drain(..).map(|done| Completion {
            session: done.session,
            result: done.result.map_err(|error| match error {
                TxnError::Protocol(error) => ClientError::Protocol(error),
                TxnError::Unavailable { partitions } => ClientError::Unavailable { partitions },
                TxnError::Clock(error) => ClientError::Clock(error),
                // Timeout, and any later variant: the transaction did not finish.
                _ => ClientError::Timeout,
            }),
        }));
        polled?;
        self.post()?;
        // Send what the replies caused (COMMITs, round-2 reads, restarts) now, not at the next
        // step: a caller that waits on something else first (the RESP gateway) must not sit on
        // them.
        self.transport.flush()?;
        Ok(())
    }
}

/// Says HELLO to every server, with what the client's cluster file says of it (so that a
/// server with another cluster file refuses, and the client refuses a server whose file
/// differs); asks server 0 for `count` client ids. Returns the first.
fn hello<T: ClientTransport>(transport: &mut T, cluster: &Cluster, count: u16) -> Result<u16, ClientError> {
    let servers = cluster.servers().len();
    for server in 0..servers {
        let view = ClusterView { partitions: cluster.partition_count(), server_index: server as u32 };
        let wanted = if server == 0 { count } else { 0 }; // only server 0's ids are used
        transport.post(server, server as u64, &Request::Hello { client_ids_wanted: wanted, cluster: Some(view) })?;
    }
    transport.flush()?;
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let mut replies: Vec<Option<Response>> = vec![None; servers];
    while replies.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        transport.poll(Some(left), |server, _, response| {
            if let Some(slot) = replies.get_mut(server) {
                *slot = Some(response);
            }
        })?;
        // A server lost before it answered: the client cannot start (it would not know that
        // server's cluster file).
        let mut events = Vec::new();
        transport.take_server_events(&mut events);
        for event in events {
            if let ServerEvent::Down { error, .. } = event {
                return Err(ClientError::Transport(error));
            }
        }
    }
    let mut first_id = None;
    for (server, reply) in replies.into_iter().enumerate() {
        let (first, granted) = check_hello_reply(cluster, server, reply.ok_or(ClientError::HelloReply)?)?;
        if server == 0 {
            if !granted_ids(count, first, granted) {
                return Err(ClientError::HelloGranted { wanted: count, first, granted });
            }
            first_id = Some(first);
        }
    }
    first_id.ok_or(ClientError::HelloReply)
}

/// Checks server `server`'s HELLO reply against the client's cluster file; returns the client
/// ids it granted (first, count).
fn check_hello_reply(cluster: &Cluster, server: usize, reply: Response) -> Result<(u16, u16), ClientError> {
    let address = || cluster.servers()[server].clone();
    let (first, granted, view) = match reply {
        Response::Hello { client_id_first, client_ids_granted, cluster } => {
            (client_id_first, client_ids_granted, cluster)
        }
        Response::Error { message, .. } => {
            return Err(ClientError::HelloRefused { server, address: address(), message })
        }
        _ => return Err(ClientError::HelloReply),
    };
    let partitions = cluster.partition_count();
    if let Some(view) = view.filter(|view| view.partitions != partitions || view.server_index != server as u32) {
        let (server_partitions, server_index) = (view.partitions, view.server_index);
        let address = address();
        return Err(ClientError::ClusterMismatch { server, address, partitions, server_partitions, server_index });
    }
    Ok((first, granted))
}

/// Whether a HELLO reply grants `wanted` usable client ids: none of them 0 (reserved for the
/// initial value) and the last within 16 bits. A server is not trusted to get this right: a
/// reply that breaks it (a hostile or broken server) is an error, never a panic or a clock
/// with id 0.
fn granted_ids(wanted: u16, first: u16, granted: u16) -> bool {
    let last = u32::from(first) + u32::from(wanted.max(1)) - 1;
    first > 0 && granted >= wanted && last <= u32::from(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::granted_ids;

    #[test]
    fn a_hello_reply_with_client_id_0_or_ids_past_16_bits_is_refused() {
        assert!(granted_ids(4, 1, 4) && granted_ids(1, u16::MAX, 1) && granted_ids(2, u16::MAX - 1, 2));
        assert!(!granted_ids(1, 0, 1), "client id 0");
        assert!(!granted_ids(2, u16::MAX, 2), "the second id would overflow");
        assert!(!granted_ids(u16::MAX, 2, u16::MAX), "the block would overflow");
        assert!(!granted_ids(4, 1, 3), "fewer than asked");
    }
}
