//! Following a failover: the gateway learns the current primaries as the blocking `Client` does,
//! without its loop ever waiting for the configuration service or for a connect.
//!
//! # Contract
//! With replication (a cluster file with `replicas` above 1 and `config` addresses; the servers
//! of `rampkv local` have no configuration service, so there is nothing to follow):
//! - The driver connects to the current primaries (`client::current_addresses`), at start and
//!   after every failover.
//! - A transaction that fails for a reason a failover explains (`ClientError::is_failover`: a
//!   server down or unreachable, a timeout, `NotPrimary`) is not answered: its command is
//!   *parked* and the [`Follower`] is asked for the configuration.
//! - The follower, a thread of its own, waits `FAILOVER_RETRY_BACKOFF_MS`, asks every
//!   configuration node (`current_addresses`: the newest configuration any of them holds), and,
//!   when the routes differ from the driver's (or the driver failed as a whole), connects a new
//!   driver to them (TCP connects and HELLOs, on its own thread); it hands the result to the
//!   loop and wakes it through the loop's waker.
//! - The loop swaps the driver in: the transactions in flight on the old one are parked too
//!   (their replies would come from the old routes); every session's clock carries over, so a
//!   connection's timestamps keep increasing; then every parked command runs again. A
//!   connection runs one transaction at a time and its later commands wait in its input, so
//!   its replies stay in order. A write run again is a new transaction with a new timestamp, as
//!   in `Client`; the attempt that failed, if it prepared anywhere, is resolved by cooperative
//!   termination (its values are the same).
//! - When the routes did not change (the failover is not committed yet, or the failure was
//!   not one), the parked commands run again on the same driver, and park again if they fail
//!   again: one ask per `FAILOVER_RETRY_BACKOFF_MS` at most while any command is parked.
//! - **The bound:** a command is run again only within `FAILOVER_CLIENT_RETRY_MS_MAX` (10 s, the
//!   `Client`'s bound) of its start; past it, it is answered `-CLUSTERDOWN` when its last
//!   attempt failed because no reachable server held some of its partitions, `-TRYAGAIN`
//!   otherwise (both name the last error). An attempt under way when the bound passes runs to
//!   its end (at most the transaction timeout, `TXN_TIMEOUT_MS`).
//!
//! # Fault model
//! The gateway keeps a copy of each transaction's keys and values while it runs (it is counted
//! in its connection's bytes, under the gateway's budget). A follower that cannot connect (no
//! configuration node answers, a primary refuses its HELLO while it takes over) reports the
//! failure and is asked again while commands wait; nothing it does blocks the loop. Parked
//! commands hold their sessions; a parked connection that closes frees its session at once.

use std::time::{Duration, Instant};

use super::connect::GatewayDriver;
use super::event_loop::EventLoop;
use super::follower::Update;
use super::input::{Retry, TxnInput};
use super::replies::write_errors;
use rampkv_core::limits::FAILOVER_CLIENT_RETRY_MS_MAX;
use rampkv_net::client::ClientError;

impl EventLoop {
    /// Starts `input` for connection `slot` (which waits on `pending`, already set) and keeps a
    /// copy to run it again after a failover, within the bound from the command's start.
    pub(super) fn begin_followed(&mut self, slot: usize, input: TxnInput) {
        let connection = self.connections[slot].as_mut().expect("open");
        let deadline = connection.last_command + Duration::from_millis(FAILOVER_CLIENT_RETRY_MS_MAX);
        let held_bytes = input.held_bytes();
        connection.retry = Some(Retry { input, deadline, last_error: None, held_bytes });
        self.attempt(slot);
    }

    /// Runs connection `slot`'s transaction (its `retry`) once more, or parks it.
    fn attempt(&mut self, slot: usize) {
        let connection = self.connections[slot].as_mut().expect("open");
        let session = connection.session;
        let input = connection.retry.as_ref().expect("a followed transaction").input.clone();
        let Some(driver) = self.driver.as_mut() else {
            let error = format!("no connection to the cluster: {}", self.driver_error);
            return self.park(slot, (error, false));
        };
        match input.begin(driver, session) {
            Ok(()) => {
                debug_assert!(!self.sessions[session].in_flight);
                self.sessions[session].in_flight = true;
            }
            Err(error) if error.is_failover() => {
                let noted = note(&error);
                if matches!(error, ClientError::Transport(_)) {
                    self.fail_driver(error);
                }
                self.park(slot, noted);
            }
            Err(error) => {
                let connection = self.connections[slot].as_mut().expect("open");
                connection.retry = None;
                let count = connection.pending.take().map_or(0, |pending| pending.replies());
                let message = format!("ERR rampkv: {error}");
                connection.outgoing.append(|out| write_errors(out, &message, count));
                self.enqueue(slot);
            }
        }
    }

    /// Whether a finished transaction's failure parks its command (a failover explains it and
    /// the gateway follows the configuration); if so, parks it.
    pub(super) fn park_failed(&mut self, slot: usize, error: &ClientError) -> bool {
        let followed = self.connections[slot]
            .as_ref()
            .and_then(|connection| connection.retry.as_ref())
            .is_some_and(|retry| retry.input.runs_again_after(error));
        if self.follower.is_none() || !followed || !error.is_failover() {
            return false;
        }
        self.park(slot, note(error));
        true
    }

    /// Parks connection `slot`'s command until the follower's next update, or answers it if
    /// its bound has passed.
    pub(super) fn park(&mut self, slot: usize, error: (String, bool)) {
        let connection = self.connections[slot].as_mut().expect("open");
        let retry = connection.retry.as_mut().expect("a followed transaction");
        retry.last_error = Some(error);
        if Instant::now() >= retry.deadline {
            return self.give_up(slot);
        }
        self.parked.push((slot, connection.id));
        if let Some(follower) = self.follower.as_mut() {
            follower.ask();
        }
    }

    /// Answers connection `slot`'s command with its last error: the bound has passed.
    fn give_up(&mut self, slot: usize) {
        let connection = self.connections[slot].as_mut().expect("open");
        let retry = connection.retry.take().expect("a followed transaction");
        let count = connection.pending.take().map_or(0, |pending| pending.replies());
        let (error, unavailable) = retry.last_error.unwrap_or_default();
        let code = if unavailable { "CLUSTERDOWN" } else { "TRYAGAIN" };
        let message = format!(
            "{code} rampkv: the cluster did not recover within {FAILOVER_CLIENT_RETRY_MS_MAX} ms (the failover \
             bound); last error: {error}"
        );
        connection.outgoing.append(|out| write_errors(out, &message, count));
        self.enqueue(slot);
    }

    /// Takes the follower's updates (swapping the driver in if one brings it) and runs the
    /// parked commands again; answers those past their bound; asks again while some wait or
    /// the loop has no driver. Called every turn of the loop (cheap without a follower).
    pub(super) fn follow_updates(&mut self) {
        let Some(follower) = self.follower.as_mut() else { return };
        let updates: Vec<Update> = follower.updates.try_iter().collect();
        if updates.is_empty() {
            self.expire_parked();
        } else {
            follower.asked = false;
            for update in updates {
                match update {
                    Update::Driver { driver, routes } => self.swap_driver(*driver, routes),
                    Update::Unchanged => {}
                    Update::Failed(error) => self.note_follower_failure(&error),
                }
            }
            self.run_parked();
        }
        let waiting = !self.parked.is_empty() || self.driver.is_none();
        if let (true, Some(follower)) = (waiting, self.follower.as_mut()) {
            follower.ask();
        }
    }

    /// The follower could not bring a driver: the parked commands' answer, if their bound
    /// passes before the next update, says why.
    fn note_follower_failure(&mut self, error: &ClientError) {
        self.driver_error = error.to_string();
        let noted = note(error);
        for &(slot, id) in &self.parked {
            let connection = self.connections[slot].as_mut().filter(|connection| connection.id == id);
            if let Some(retry) = connection.and_then(|connection| connection.retry.as_mut()) {
                retry.last_error = Some(noted.clone());
            }
        }
    }

    /// Puts `driver` (connected to `routes`) in the old one's place. The old one's transactions
    /// in flight are parked, to run again on the new one.
    fn swap_driver(&mut self, mut driver: GatewayDriver, routes: Vec<String>) {
        if let Some(old) = self.driver.take() {
            driver.follow_clocks(&old); // each connection's next timestamp above its last
        }
        // Its sockets' events may have reached the loop before it did (and were taken for the
        // old driver's): let the first step read them all.
        driver.transport_mut().mark_all_ready();
        self.driver = Some(driver);
        if let Some(follower) = self.follower.as_mut() {
            follower.routes = Some(routes);
        }
        let noted = ("the gateway reconnected to the current primaries".to_string(), false);
        for session in 0..self.sessions.len() {
            if self.sessions[session].in_flight {
                self.sessions[session].in_flight = false;
                self.requeue_in_flight(session, &noted);
            }
        }
    }

    /// A session whose transaction was in flight on a driver that is gone (`in_flight` already
    /// cleared): its command is parked, or the session freed if its connection closed. False
    /// if the command cannot run again (the gateway does not follow the configuration).
    pub(super) fn requeue_in_flight(&mut self, session: usize, error: &(String, bool)) -> bool {
        let Some(slot) = self.sessions[session].owner else {
            self.free_sessions.push(session); // an orphan: its connection is gone
            return true;
        };
        let connection = self.connections[slot].as_mut().expect("a session's owner is open");
        let Some(retry) = connection.retry.as_mut().filter(|_| self.follower.is_some()) else { return false };
        if let TxnInput::Update(..) = retry.input {
            connection.retry = None; // the update may have been applied: answered with the error
            return false;
        }
        retry.last_error = Some(error.clone());
        self.parked.push((slot, connection.id));
        true
    }

    /// Runs every parked command again (or answers it, past its bound).
    fn run_parked(&mut self) {
        let now = Instant::now();
        for (slot, id) in std::mem::take(&mut self.parked) {
            let Some(connection) = self.connections[slot].as_ref().filter(|connection| connection.id == id) else {
                continue; // closed
            };
            let Some(retry) = connection.retry.as_ref().filter(|_| connection.pending.is_some()) else { continue };
            if now >= retry.deadline {
                self.give_up(slot);
            } else {
                self.attempt(slot);
            }
        }
    }

    /// Answers the parked commands whose bound has passed; forgets those of closed connections.
    fn expire_parked(&mut self) {
        let now = Instant::now();
        let mut index = 0;
        while index < self.parked.len() {
            let (slot, id) = self.parked[index];
            let connection = self.connections[slot].as_ref().filter(|connection| connection.id == id);
            let deadline = connection
                .filter(|connection| connection.pending.is_some())
                .and_then(|connection| connection.retry.as_ref())
                .map(|retry| retry.deadline);
            match deadline {
                None => {
                    self.parked.swap_remove(index);
                }
                Some(deadline) if now >= deadline => {
                    self.parked.swap_remove(index);
                    self.give_up(slot);
                }
                Some(_) => index += 1,
            }
        }
    }
}

/// What a parked command keeps of a failure: the message, and whether it was for partitions no
/// reachable server held (`-CLUSTERDOWN` rather than `-TRYAGAIN` past the bound).
pub(super) fn note(error: &ClientError) -> (String, bool) {
    (error.to_string(), matches!(error, ClientError::Unavailable { .. }))
}
