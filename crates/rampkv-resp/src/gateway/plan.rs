//! What a read answers and what an EXEC runs: one read command of a batch ([`ReadCommand`]),
//! and an EXEC's plan ([`ExecPlan`]: its transaction and how each queued command is answered
//! from it; `multi` runs it).

use ahash::AHashMap;

use crate::command::{Request, TtlUnit};
use rampkv_core::limits::TXN_KEYS_MAX;
use rampkv_core::wire::Write;

/// One read command of a batch; its keys are the next ones of the batch's read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadCommand {
    Get,
    Strlen,
    Type,
    MultiGet {
        keys: usize,
    },
    Exists {
        keys: usize,
    },
    /// TTL or PTTL of one key.
    TimeToLive(TtlUnit),
}

impl ReadCommand {
    /// How many keys of the read are this command's.
    pub(super) fn keys(self) -> usize {
        match self {
            ReadCommand::Get | ReadCommand::Strlen | ReadCommand::Type | ReadCommand::TimeToLive(_) => 1,
            ReadCommand::MultiGet { keys } | ReadCommand::Exists { keys } => keys,
        }
    }
}

/// What an EXEC runs: its transaction and how to answer each queued command from it.
#[derive(Debug)]
pub(super) struct ExecPlan {
    pub(super) steps: Vec<Step>,
    pub(super) transaction: Transaction,
}

/// How one queued command is answered.
#[derive(Debug)]
pub(super) enum Step {
    /// A connection command: run once the transaction has finished.
    Local(Request),
    /// A read command; its keys' values are at the read's next positions.
    Read(ReadCommand),
    /// SET (with an expiry or not), SETEX, PSETEX or MSET: `+OK`.
    Written,
    /// DEL or UNLINK: `known_present` of its keys were present by the queue's earlier commands,
    /// plus those of `read` (positions in the read of DEL's counts) that the read found.
    Deleted { known_present: i64, read: Vec<usize> },
}

#[derive(Debug)]
pub(super) enum Transaction {
    /// Only connection commands.
    None,
    /// One `get_all` of the distinct `keys` (taken when it starts); `positions` are, for each
    /// read command's keys in order, their positions in `keys`.
    Read { keys: Vec<Vec<u8>>, key_count: usize, positions: Vec<usize> },
    /// One `put_all` of `writes`, after one `get_all` of `counted` (the keys whose presence
    /// DEL's counts need and the queue does not tell; skipped if none) whose answers are
    /// `present`, by position.
    Write { writes: Vec<Write>, counted: Vec<Vec<u8>>, counted_count: usize, present: Vec<bool> },
}

/// Whether a queued command reads, writes or neither; its name for errors.
enum Access {
    Read(&'static str),
    Write(&'static str),
    Local,
}

fn access(request: &Request) -> Access {
    match request {
        Request::Get { .. } => Access::Read("GET"),
        Request::MultiGet { .. } => Access::Read("MGET"),
        Request::Exists { .. } => Access::Read("EXISTS"),
        Request::Strlen { .. } => Access::Read("STRLEN"),
        Request::Type { .. } => Access::Read("TYPE"),
        Request::TimeToLive { unit: TtlUnit::Seconds, .. } => Access::Read("TTL"),
        Request::TimeToLive { unit: TtlUnit::Milliseconds, .. } => Access::Read("PTTL"),
        Request::Set { .. } | Request::SetExpiring { .. } => Access::Write("SET"),
        Request::MultiSet { .. } => Access::Write("MSET"),
        Request::Delete { .. } => Access::Write("DEL"),
        Request::Unlink { .. } => Access::Write("UNLINK"),
        _ => Access::Local,
    }
}

impl ExecPlan {
    /// The plan of a queue, or why EXEC refuses it (reads mixed with writes, too many keys).
    /// The one place where queued commands become the transaction (module docs, *Expiry*):
    /// `now_ms`, the EXEC's one reading of the clock (Unix ms), turns every relative expiry of
    /// the queue into a deadline.
    pub(super) fn new(queued: Vec<Request>, now_ms: u64) -> Result<ExecPlan, String> {
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        for request in &queued {
            match access(request) {
                Access::Read(name) if !reads.contains(&name) => reads.push(name),
                Access::Write(name) if !writes.contains(&name) => writes.push(name),
                _ => {}
            }
        }
        if !reads.is_empty() && !writes.is_empty() {
            return Err(format!(
                "it mixes reads ({}) and writes ({}): rampkv runs a transaction as read-only or write-only (RAMP); \
                 send them in two MULTI blocks",
                reads.join(", "),
                writes.join(", ")
            ));
        }
        let plan = if writes.is_empty() { Self::reads(queued) } else { Self::writes(queued, now_ms) };
        let keys = match &plan.transaction {
            Transaction::None => 0,
            Transaction::Read { key_count, .. } => *key_count,
            Transaction::Write { writes, .. } => writes.len(),
        };
        if keys > TXN_KEYS_MAX {
            return Err(format!(
                "it touches {keys} distinct keys, and a rampkv transaction takes at most {TXN_KEYS_MAX}"
            ));
        }
        Ok(plan)
    }

    fn reads(queued: Vec<Request>) -> ExecPlan {
        let mut keys = DistinctKeys::default();
        let mut positions = Vec::new();
        let mut read = |command: ReadCommand, command_keys: Vec<Vec<u8>>| {
            debug_assert_eq!(command.keys(), command_keys.len());
            positions.extend(command_keys.into_iter().map(|key| keys.position(key)));
            Step::Read(command)
        };
        let steps: Vec<Step> = queued
            .into_iter()
            .map(|request| match request {
                Request::Get { key } => read(ReadCommand::Get, vec![key]),
                Request::Strlen { key } => read(ReadCommand::Strlen, vec![key]),
                Request::Type { key } => read(ReadCommand::Type, vec![key]),
                Request::MultiGet { keys } => read(ReadCommand::MultiGet { keys: keys.len() }, keys),
                Request::Exists { keys } => read(ReadCommand::Exists { keys: keys.len() }, keys),
                Request::TimeToLive { key, unit } => read(ReadCommand::TimeToLive(unit), vec![key]),
                other => Step::Local(other),
            })
            .collect();
        let transaction = match keys.len() {
            0 => Transaction::None,
            key_count => Transaction::Read { keys: keys.into_keys(), key_count, positions },
        };
        ExecPlan { steps, transaction }
    }

    fn writes(queued: Vec<Request>, now_ms: u64) -> ExecPlan {
        let mut written = LastWrites { now_ms, ..LastWrites::default() };
        let mut counted = DistinctKeys::default();
        let steps = queued
            .into_iter()
            .map(|request| match request {
                Request::Set { key, value } => {
                    written.put(Write::new(key, value));
                    Step::Written
                }
                Request::SetExpiring { key, value, expiry } => {
                    written.put(Write::expiring(key, value, expiry.deadline_ms(now_ms)));
                    Step::Written
                }
                Request::MultiSet { pairs } => {
                    pairs.into_iter().for_each(|(key, value)| written.put(Write::new(key, value)));
                    Step::Written
                }
                Request::Delete { keys } | Request::Unlink { keys } => {
                    let (mut known_present, mut read) = (0, Vec::new());
                    for key in keys {
                        match written.present(&key) {
                            Some(present) => known_present += i64::from(present),
                            None => read.push(counted.position(key.clone())),
                        }
                        written.put(Write::delete(key));
                    }
                    Step::Deleted { known_present, read }
                }
                other => Step::Local(other),
            })
            .collect();
        let counted_count = counted.len();
        let transaction = Transaction::Write {
            writes: written.into_writes(),
            counted: counted.into_keys(),
            counted_count,
            present: Vec::new(),
        };
        ExecPlan { steps, transaction }
    }
}

/// Distinct keys in first-seen order, each with its position.
#[derive(Debug, Default)]
struct DistinctKeys {
    positions: AHashMap<Vec<u8>, usize>,
}

impl DistinctKeys {
    fn position(&mut self, key: Vec<u8>) -> usize {
        let next = self.positions.len();
        *self.positions.entry(key).or_insert(next)
    }

    fn get(&self, key: &[u8]) -> Option<usize> {
        self.positions.get(key).copied()
    }

    fn len(&self) -> usize {
        self.positions.len()
    }

    fn into_keys(self) -> Vec<Vec<u8>> {
        let mut keys = vec![Vec::new(); self.positions.len()];
        for (key, position) in self.positions {
            keys[position] = key;
        }
        keys
    }
}

/// The last write (value and deadline) of each key, keys in first-seen order.
#[derive(Debug, Default)]
struct LastWrites {
    keys: DistinctKeys,
    /// `writes[position]` is the last write of the key at that position.
    writes: Vec<Write>,
    /// The EXEC's instant: a key the queue wrote with a deadline at or before it is absent.
    now_ms: u64,
}

impl LastWrites {
    fn put(&mut self, write: Write) {
        let position = self.keys.position(write.key.clone());
        match self.writes.get_mut(position) {
            Some(last) => *last = write,
            None => self.writes.push(write),
        }
        debug_assert_eq!(self.writes.len(), self.keys.len());
    }

    /// Whether the queue so far leaves `key` present (None: it has not written it): not
    /// deleted, and not expired at the EXEC's instant.
    fn present(&self, key: &[u8]) -> Option<bool> {
        let expired = |write: &Write| write.expires_at_ms != 0 && write.expires_at_ms <= self.now_ms;
        self.keys.get(key).map(|position| !expired(&self.writes[position]))
    }

    fn into_writes(self) -> Vec<Write> {
        debug_assert!(self.writes.iter().zip(self.keys.into_keys()).all(|(write, key)| write.key == key));
        self.writes
    }
}
