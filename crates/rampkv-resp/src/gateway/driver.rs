//! The cluster side of the gateway: one [`Driver`] (a fixed pool of sessions over a transport
//! whose sockets sit in the loop's poller, or calls into the servers of this process), stepped
//! without blocking once per serve round; finished transactions answered; a failed driver
//! replaced.
//!
//! # Fault model
//! With replication the gateway follows the configuration and a failure a failover explains
//! makes the command wait and run again, within one bound (`failover`); what follows is the
//! rest, and the gateway without replication.
//! - A transaction that fails (timeout, server error) gets `-ERR rampkv: ...`. A timed-out
//!   write may or may not have taken effect, as with any store.
//! - If one server's connection fails, the commands that need its partitions get
//!   `-CLUSTERDOWN rampkv: partitions [...] are unavailable ...` and the others go on; the driver
//!   reconnects to it on its own. If the driver fails as a whole, every command in flight gets
//!   an error, and later commands try to reconnect at most once per [`RECONNECT_INTERVAL`];
//!   until that works they get `-ERR rampkv cluster unavailable: ...`.

use std::time::{Duration, Instant};

use super::connect::{connect_driver, GatewayDriver};
use super::event_loop::EventLoop;
use super::failover;
use super::input::TxnInput;
use super::limits::{IN_FLIGHT_POLL_TIMEOUT, RECONNECT_INTERVAL};
use super::replies::{transaction_error, write_errors, write_read_replies, write_update_reply};
use super::state::Pending;
use crate::codec;
use rampkv_net::client::{ClientError, Completion, TxnResult};

impl EventLoop {
    /// Starts `input` for connection `slot`, which then waits on `pending`; answers at once
    /// if it cannot start. With a follower, a copy is kept to run it again after a failover
    /// (`failover`).
    pub(super) fn begin_transaction(&mut self, slot: usize, input: TxnInput, pending: Pending) {
        if self.follower.is_some() {
            self.connections[slot].as_mut().expect("open").pending = Some(pending);
            return self.begin_followed(slot, input);
        }
        let session = self.connections[slot].as_ref().expect("open").session;
        let started = match self.driver() {
            Some(driver) => input.begin(driver, session),
            None => return self.reply_unavailable(slot, pending.replies()),
        };
        match started {
            Ok(()) => {
                debug_assert!(!self.sessions[session].in_flight);
                self.sessions[session].in_flight = true;
                self.connections[slot].as_mut().expect("open").pending = Some(pending);
            }
            Err(error @ ClientError::Transport(_)) => {
                self.reply_errors(slot, &format!("ERR rampkv: {error}"), pending.replies());
                self.fail_driver(error);
            }
            Err(error) => self.reply_errors(slot, &format!("ERR rampkv: {error}"), pending.replies()),
        }
    }

    /// The driver, reconnecting it if it failed and the last attempt is long enough ago
    /// (`None`: unavailable, `driver_error` says why). Reconnecting blocks this thread for at
    /// most the connect and HELLO timeouts.
    pub(super) fn driver(&mut self) -> Option<&mut GatewayDriver> {
        if self.driver.is_none() && self.last_reconnect.elapsed() >= RECONNECT_INTERVAL {
            self.last_reconnect = Instant::now();
            let in_process = self.in_process.as_ref();
            let (registry, waker) = (self.poll.registry(), &self.waker);
            match connect_driver(registry, waker, &self.cluster, in_process, self.sessions.len(), self.txn_options) {
                Ok(driver) => self.driver = Some(driver),
                Err(error) => self.driver_error = error.to_string(),
            }
        }
        self.driver.as_mut()
    }

    /// Reads the server replies that arrived (never blocks) and answers finished commands.
    ///
    /// Steps only when there is something to send or read, or deadlines to check (a step scans
    /// every session for expired transactions). Steps again if the first step's replies queued
    /// requests (a write's COMMIT, a read's second round), so that they leave now rather than
    /// after the loop's next wait.
    pub(super) fn step_driver(&mut self) {
        for _ in 0..2 {
            let Some(driver) = self.driver.as_mut() else {
                return;
            };
            if driver.active() == 0 {
                return;
            }
            let now = Instant::now();
            let check_deadlines = now >= self.next_deadline_check;
            if !check_deadlines && !driver.transport().work_pending() && !driver.has_ready() {
                return;
            }
            if check_deadlines {
                self.next_deadline_check = now + IN_FLIGHT_POLL_TIMEOUT;
            }
            let mut completions = std::mem::take(&mut self.completions);
            let stepped = driver.step(Some(Duration::ZERO), &mut completions);
            for completion in completions.drain(..) {
                self.complete(completion);
            }
            self.completions = completions;
            if let Err(error) = stepped {
                return self.fail_driver(error);
            }
        }
    }

    /// The driver is broken for good: answer every command whose transaction was in flight
    /// (with a follower: park it, and ask for a new driver).
    pub(super) fn fail_driver(&mut self, error: ClientError) {
        self.driver = None;
        self.driver_error = error.to_string();
        self.last_reconnect = Instant::now();
        let message = format!("ERR rampkv: the connection to the cluster failed: {error}");
        let noted = failover::note(&error);
        for session in 0..self.sessions.len() {
            let state = &mut self.sessions[session];
            if !state.in_flight {
                continue;
            }
            state.in_flight = false;
            if self.requeue_in_flight(session, &noted) {
                continue;
            }
            let slot = self.sessions[session].owner.expect("requeued unless owned");
            let connection = self.connections[slot].as_mut().expect("a session's owner is open");
            let count = connection.pending.take().map_or(0, |pending| pending.replies());
            connection.outgoing.append(|out| write_errors(out, &message, count));
            self.enqueue(slot);
        }
        if let Some(follower) = self.follower.as_mut() {
            follower.lost_driver();
        }
    }

    /// Answers the command a finished transaction belongs to.
    fn complete(&mut self, completion: Completion) {
        let session = completion.session;
        let state = &mut self.sessions[session];
        debug_assert!(state.in_flight);
        state.in_flight = false;
        let Some(slot) = state.owner else {
            self.free_sessions.push(session); // an orphan: its connection is gone
            return;
        };
        if let Err(error) = &completion.result {
            if self.park_failed(slot, error) {
                return; // run again once the configuration is known
            }
        }
        let connection = self.connections[slot].as_mut().expect("a session's owner is open");
        connection.retry = None;
        let pending = connection.pending.take().expect("a finished transaction answers a pending command");
        let protocol = connection.protocol;
        let out = &mut connection.outgoing;
        match (pending, completion.result) {
            // INFO answers without its key count rather than fail (`keyspace`).
            (Pending::Info(sections), Err(_)) => return self.answer_info(slot, sections, None),
            (pending, Err(error)) => out.append(|out| write_errors(out, &transaction_error(&error), pending.replies())),
            (Pending::Reads(commands), Ok(TxnResult::Read(outcome))) => {
                out.append(|out| write_read_replies(out, protocol, &commands, &outcome));
            }
            (Pending::DeleteRead, Ok(TxnResult::Read(outcome))) => return self.delete_present(slot, outcome),
            (Pending::Exec(plan), Ok(result)) => return self.exec_finished(slot, plan, result),
            (Pending::Writes { commands }, Ok(TxnResult::Write(_))) => out.append(|out| {
                for _ in 0..commands {
                    codec::write_simple(out, b"OK");
                }
            }),
            (Pending::DeleteWrite { removed }, Ok(TxnResult::Write(_))) => {
                out.append(|out| codec::write_integer(out, removed));
            }
            (Pending::Listing(listing), Ok(TxnResult::Keys(page))) => return self.listed_page(slot, listing, page),
            (Pending::DbSize, Ok(TxnResult::KeyCount(count))) => {
                out.append(|out| codec::write_integer(out, i64::try_from(count).unwrap_or(i64::MAX)));
            }
            (Pending::Info(sections), Ok(TxnResult::KeyCount(count))) => {
                return self.answer_info(slot, sections, Some(count))
            }
            (Pending::Update(reply), Ok(TxnResult::Update(result))) => {
                out.append(|out| write_update_reply(out, protocol, reply, &result));
            }
            (pending, Ok(result)) => {
                debug_assert!(false, "{pending:?} finished with {result:?}");
                out.append(|out| codec::write_error(out, b"ERR internal error: mismatched transaction result"));
            }
        }
        self.enqueue(slot);
    }
}
