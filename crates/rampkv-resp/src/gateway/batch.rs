//! Pipelines: the read or write commands already buffered behind the first one join its
//! transaction, and what a connection then waits on ([`Pending`]).
//!
//! # Expiry
//! TTL and PTTL join a batch of reads (the read judges expiry at one instant for all its keys);
//! SET with an expiry, SETEX and PSETEX a batch of writes, whose relative expiries all become
//! deadlines from one reading of the gateway's clock.
//!
//! # Pipelines
//! When a read command (GET, MGET, EXISTS, STRLEN, TYPE) starts, the read commands right behind it that are
//! already buffered join it in one `get_all` (up to [`BATCH_COMMANDS_MAX`] commands and
//! `TXN_KEYS_MAX` keys); likewise SET and MSET in one `put_all` (up to
//! [`WRITE_BATCH_KEYS_MAX`] keys). Each command still gets its own reply, in order. A batch of
//! reads, or of writes with an MSET of several keys in it, is atomic as a whole: stronger than
//! what Redis promises for a pipeline, and still an execution Redis allows (the commands back to
//! back). A batch of one-key writes (SETs) is written as independent one-key writes at one
//! timestamp (`Driver::begin_independent_writes`), each atomic alone, as in Redis: their
//! versions are then alone in their write sets, which the servers free as soon as a newer
//! write supersedes them instead of keeping them for the GC grace period (a pipeline of SETs
//! otherwise grew memory by its whole volume for ten seconds: docs/performance.md, issue 18).
//! Any other command (DEL, PING, HELLO, MULTI, an error) ends a batch and runs alone. Commands
//! of a connection in MULTI are queued, never batched (`multi`). This is what lets
//! a pipelining client get more than one transaction's worth of work per round trip.

use super::event_loop::EventLoop;
use super::input::TxnInput;
use super::limits::{BATCH_COMMANDS_MAX, WRITE_BATCH_KEYS_MAX};
use super::plan::ReadCommand;
use super::state::Pending;
use crate::command::{batch_key_count, parse_request, ExpiryArg, Request};
use rampkv_core::limits::TXN_KEYS_MAX;
use rampkv_core::wire::Write;

impl EventLoop {
    /// Starts one read for `first` and the read commands right behind it in the connection's
    /// input (pipelined), as long as they are complete, consecutive and fit one transaction.
    pub(super) fn begin_read_batch(&mut self, slot: usize, first: Request) {
        let mut keys = Vec::new();
        let mut commands = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next.take() {
            let (command, more) = match request {
                Request::Get { key } => (ReadCommand::Get, vec![key]),
                Request::Strlen { key } => (ReadCommand::Strlen, vec![key]),
                Request::Type { key } => (ReadCommand::Type, vec![key]),
                Request::MultiGet { keys } => (ReadCommand::MultiGet { keys: keys.len() }, keys),
                Request::Exists { keys } => (ReadCommand::Exists { keys: keys.len() }, keys),
                Request::TimeToLive { key, unit } => (ReadCommand::TimeToLive(unit), vec![key]),
                other => unreachable!("not a read command: {other:?}"),
            };
            keys.extend(more);
            commands.push(command);
            next = self.next_batchable(slot, keys.len(), TXN_KEYS_MAX, commands.len(), |request| match request {
                Request::Get { .. } | Request::Strlen { .. } | Request::Type { .. } | Request::TimeToLive { .. } => {
                    Some(1)
                }
                Request::MultiGet { keys } | Request::Exists { keys } => Some(keys.len()),
                _ => None,
            });
        }
        self.begin_read(slot, keys, Pending::Reads(commands));
    }

    /// Starts one write for `first` and the write commands right behind it (see
    /// [`EventLoop::begin_read_batch`]). With an MSET of several keys among them, one
    /// transaction makes them atomic together, which Redis does not promise but allows; one-key
    /// writes only are independent writes (module header). A key written twice keeps the value
    /// of the later command.
    pub(super) fn begin_write_batch(&mut self, slot: usize, first: Request) {
        let mut pairs = Vec::new();
        // Expiring writes (SET EX & co.): their place in `pairs` and when they expire.
        let mut expiring: Vec<(usize, ExpiryArg)> = Vec::new();
        let mut commands = 0;
        let mut one_key_each = true;
        let mut next = Some(first);
        while let Some(request) = next.take() {
            match request {
                Request::Set { key, value } => pairs.push((key, value)),
                Request::MultiSet { pairs: more } => {
                    one_key_each &= more.len() == 1;
                    pairs.extend(more);
                }
                Request::SetExpiring { key, value, expiry } => {
                    expiring.push((pairs.len(), expiry));
                    pairs.push((key, value));
                }
                other => unreachable!("not a write command: {other:?}"),
            }
            commands += 1;
            next = self.next_batchable(slot, pairs.len(), WRITE_BATCH_KEYS_MAX, commands, |request| match request {
                Request::Set { .. } | Request::SetExpiring { .. } => Some(1),
                Request::MultiSet { pairs } => Some(pairs.len()),
                _ => None,
            });
        }
        let independent = one_key_each && commands > 1;
        let pending = Pending::Writes { commands };
        if expiring.is_empty() {
            return match independent {
                true => self.begin_independent_writes(slot, pairs, pending),
                false => self.begin_write(slot, pairs, pending),
            };
        }
        self.begin_expiring_writes(slot, expiring_writes(pairs, &expiring), pending, independent);
    }

    /// Starts a write of [`Write`]s (expiring, or deletions: DEL's second step); `independent`:
    /// one-key writes at one timestamp, as [`EventLoop::begin_independent_writes`].
    pub(super) fn begin_expiring_writes(
        &mut self,
        slot: usize,
        writes: Vec<Write>,
        pending: Pending,
        independent: bool,
    ) {
        self.begin_transaction(slot, TxnInput::Writes { writes, independent }, pending);
    }

    /// The next complete command in the connection's input, consumed, if `keys_of` accepts it
    /// (returns its key count) and the batch stays within `keys_max` keys and
    /// [`BATCH_COMMANDS_MAX`] commands. A command that does not fit stays in the input for later.
    fn next_batchable(
        &mut self,
        slot: usize,
        keys: usize,
        keys_max: usize,
        commands: usize,
        keys_of: impl Fn(&Request) -> Option<usize>,
    ) -> Option<Request> {
        if commands >= BATCH_COMMANDS_MAX {
            return None;
        }
        let connection = self.connections[slot].as_mut()?;
        let Ok(Some((args, consumed))) =
            self.parser.parse_within(connection.incoming.pending(), connection.request_limits())
        else {
            return None;
        };
        if args.is_empty() {
            return None;
        }
        // Counted from the arguments first: a command that cannot fit is left in the input
        // without its values being copied out (it is parsed when its turn comes).
        if batch_key_count(&args).is_none_or(|more| keys + more > keys_max) {
            return None;
        }
        let request = parse_request(&args, connection.permissions);
        let fits = keys_of(&request).is_some_and(|more| keys + more <= keys_max);
        if !fits {
            return None; // parsed again when its turn comes
        }
        connection.incoming.consume(consumed);
        self.stats.commands_processed += 1;
        Some(request)
    }

    pub(super) fn begin_read(&mut self, slot: usize, keys: Vec<Vec<u8>>, pending: Pending) {
        self.begin_transaction(slot, TxnInput::Read(keys), pending);
    }

    pub(super) fn begin_write(&mut self, slot: usize, pairs: Vec<(Vec<u8>, Vec<u8>)>, pending: Pending) {
        self.begin_transaction(slot, TxnInput::Write(pairs), pending);
    }

    fn begin_independent_writes(&mut self, slot: usize, pairs: Vec<(Vec<u8>, Vec<u8>)>, pending: Pending) {
        self.begin_transaction(slot, TxnInput::IndependentWrites(pairs), pending);
    }
}

/// A batch's writes with their expiries: every relative expiry of the batch from one reading
/// of this clock (Redis takes one per command; one per batch keeps a pipeline's keys written
/// with one TTL expiring together, as one MULTI/EXEC's must).
fn expiring_writes(pairs: Vec<(Vec<u8>, Vec<u8>)>, expiring: &[(usize, ExpiryArg)]) -> Vec<Write> {
    let now_ms = rampkv_core::types::wall_clock_unix_ms();
    let mut writes: Vec<Write> = pairs.into_iter().map(|(key, value)| Write::new(key, value)).collect();
    for &(index, expiry) in expiring {
        writes[index].expires_at_ms = expiry.deadline_ms(now_ms);
    }
    writes
}
