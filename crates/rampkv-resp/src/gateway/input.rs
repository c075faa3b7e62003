//! A transaction's input ([`TxnInput`]), kept while it runs so that it can run again after a
//! failover, and what a connection's transaction needs to run again ([`Retry`]); see
//! `failover` for when it does.

use std::time::Instant;

use super::connect::GatewayDriver;
use rampkv_core::wire::{UpdateOp, Write};
use rampkv_net::client::ClientError;

/// A transaction's input, kept while it runs so that it can run again after a failover.
#[derive(Debug, Clone)]
pub(super) enum TxnInput {
    Read(Vec<Vec<u8>>),
    Write(Vec<(Vec<u8>, Vec<u8>)>),
    /// One-key writes at one timestamp, not atomic together (a pipeline of SETs).
    IndependentWrites(Vec<(Vec<u8>, Vec<u8>)>),
    /// Writes that may expire or delete; `independent` as `IndependentWrites`. Their deadlines
    /// are absolute already, so running them again after a failover keeps them.
    Writes {
        writes: Vec<Write>,
        independent: bool,
    },
    /// A page of the key listing (SCAN, KEYS: `keyspace`).
    List {
        partition: u32,
        after: Option<u64>,
        keys_max: usize,
    },
    /// The count of live keys (DBSIZE, INFO).
    Count,
    /// A single-key conditional write (INCR, SETNX, ...). Not idempotent: run again only after
    /// a refusal that applied nothing ([`TxnInput::runs_again_after`]).
    Update(Vec<u8>, UpdateOp),
}

impl TxnInput {
    /// Starts it on `session` of `driver`.
    pub(super) fn begin(self, driver: &mut GatewayDriver, session: usize) -> Result<(), ClientError> {
        match self {
            TxnInput::Read(keys) => driver.begin_read(session, keys),
            TxnInput::Write(pairs) => driver.begin_write(session, pairs).map(|_ts| ()),
            TxnInput::IndependentWrites(pairs) => driver.begin_independent_writes(session, pairs).map(|_ts| ()),
            TxnInput::Writes { writes, independent } => driver.begin_writes(session, writes, independent).map(|_ts| ()),
            TxnInput::List { partition, after, keys_max } => driver.begin_list(session, partition, after, keys_max),
            TxnInput::Count => driver.begin_count(session),
            TxnInput::Update(key, op) => driver.begin_update(session, key, op).map(|_ts| ()),
        }
    }

    /// Whether it may run again after failing with `error`: a read or a write always (a write
    /// run again writes the same values), an update only when the server refused it without
    /// applying it (not the primary): after a timeout or a lost connection it may have been
    /// applied, and an INCR run twice counts twice.
    pub(super) fn runs_again_after(&self, error: &ClientError) -> bool {
        match self {
            TxnInput::Update(..) => error.is_not_primary(),
            _ => true,
        }
    }

    /// Bytes of keys and values it holds.
    pub(super) fn held_bytes(&self) -> usize {
        match self {
            TxnInput::Read(keys) => keys.iter().map(Vec::len).sum(),
            TxnInput::Write(pairs) | TxnInput::IndependentWrites(pairs) => {
                pairs.iter().map(|(key, value)| key.len() + value.len()).sum()
            }
            TxnInput::Writes { writes, .. } => writes.iter().map(|write| write.key.len() + write.value.len()).sum(),
            TxnInput::List { .. } | TxnInput::Count => 0,
            TxnInput::Update(key, op) => {
                key.len()
                    + match op {
                        UpdateOp::Set { value, .. } | UpdateOp::Append(value) => value.len(),
                        _ => 0,
                    }
            }
        }
    }
}

/// What a connection's transaction needs to run again (with a follower only).
#[derive(Debug)]
pub(super) struct Retry {
    pub(super) input: TxnInput,
    /// Past it, the command is answered with the last error rather than run again.
    pub(super) deadline: Instant,
    /// Why the last attempt failed, and whether for partitions no reachable server held.
    pub(super) last_error: Option<(String, bool)>,
    pub(super) held_bytes: usize,
}

impl Retry {
    /// Bytes it holds (counted in its connection's, under the gateway's budget).
    pub(super) fn held_bytes(&self) -> usize {
        self.held_bytes
    }
}
