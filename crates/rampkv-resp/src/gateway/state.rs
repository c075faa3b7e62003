//! What a connection holds while it waits: the commands it waits on ([`Pending`]), a SCAN or
//! KEYS under way ([`Listing`]), and its queue between MULTI and EXEC ([`MultiState`]). The
//! rooms that act on them (`batch`, `keyspace`, `multi`) hold the rules.

use rampkv_core::pattern::Pattern;

use super::input::TxnInput;
use super::limits::{MULTI_QUEUED_BYTES_MAX, MULTI_QUEUED_COMMANDS_MAX};
use super::plan::{ExecPlan, ReadCommand};
use crate::codec::{Frame, Protocol};
use crate::command::{InfoSections, Request, UpdateReply};

/// The commands a connection waits on; says how to answer the transaction's result.
#[derive(Debug)]
pub(super) enum Pending {
    /// Consecutive GET, MGET and EXISTS commands read by one `get_all`, in order.
    Reads(Vec<ReadCommand>),
    /// Consecutive SET and MSET commands written by one `put_all`: `commands` OK replies.
    Writes { commands: usize },
    /// DEL, first step: reading the keys to count the present ones.
    DeleteRead,
    /// DEL, second step: writing the tombstones; `removed` keys were present.
    DeleteWrite { removed: i64 },
    /// A single-key conditional write (INCR, SETNX, ...): its result answered as this says.
    Update(UpdateReply),
    /// EXEC: the queued commands' transaction (a read, or a write and maybe a read before it
    /// for DEL's counts); EXEC's one reply is written when it has finished (`multi`).
    Exec(Box<ExecPlan>),
    /// SCAN or KEYS: a page of the key listing (`keyspace`).
    Listing(Box<Listing>),
    /// DBSIZE: the count of live keys.
    DbSize,
    /// INFO with its keyspace section: the count, then the text.
    Info(InfoSections),
}

impl Pending {
    /// How many commands wait on the transaction: each gets a reply, an error included.
    pub(super) fn replies(&self) -> usize {
        match self {
            Pending::Reads(commands) => commands.len(),
            Pending::Writes { commands } => *commands,
            Pending::DeleteRead
            | Pending::DeleteWrite { .. }
            | Pending::Exec(_)
            | Pending::Listing(_)
            | Pending::DbSize
            | Pending::Info(_)
            | Pending::Update(_) => 1,
        }
    }
}

/// A SCAN or KEYS under way.
#[derive(Debug)]
pub(super) struct Listing {
    pub(super) mode: Mode,
    pub(super) partition: u32,
    pub(super) after: Option<u64>,
    pub(super) keys_max: usize,
    /// `None`: every key (no MATCH, or `*`).
    pub(super) pattern: Option<Pattern>,
    /// False for a TYPE other than `string`: no key matches, the cursor still moves.
    pub(super) type_matches: bool,
    pub(super) found: Vec<Vec<u8>>,
    /// Pages asked so far by this command.
    pub(super) pages: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Scan,
    Keys,
}

impl Listing {
    pub(super) fn input(&self) -> TxnInput {
        // SCAN asks only for what COUNT still wants; KEYS takes whole pages.
        let keys_max = match self.mode {
            Mode::Scan => self.keys_max.saturating_sub(self.found.len()).max(1),
            Mode::Keys => self.keys_max,
        };
        TxnInput::List { partition: self.partition, after: self.after, keys_max }
    }
}

/// SCAN, KEYS and DBSIZE are not queued: a RAMP transaction reads named keys, and a listing
/// or a count is no part of one (the transaction is discarded, as for a command Redis refuses).
const KEYSPACE_INSIDE_MULTI_REPLY: &str =
    "ERR SCAN, KEYS and DBSIZE are not supported inside MULTI by rampkv (a RAMP transaction reads named keys)";

/// Why a conditional write (INCR, SETNX, ...) is refused inside MULTI.
fn conditional_refusal(name: &str) -> String {
    format!(
        "ERR {name} inside MULTI is not supported by rampkv: it reads its key and writes it, and a MULTI/EXEC runs as \
         one RAMP transaction, which is read-only or write-only; run it outside MULTI, where it is atomic on its own. \
         The transaction is discarded"
    )
}

/// What one queued command holds beyond its keys and values (its `Request`, its allocations),
/// for the queue's byte count.
pub(super) const QUEUED_COMMAND_OVERHEAD_BYTES: usize = 64;

/// A connection's state between MULTI and EXEC (or DISCARD, or its close).
#[derive(Debug, Default)]
pub(super) struct MultiState {
    pub(super) queued: Vec<Request>,
    /// What `queued` holds ([`queued_bytes`]).
    bytes: usize,
    /// A command failed to queue: EXEC answers EXECABORT, and nothing more is kept.
    pub(super) doomed: bool,
}

impl MultiState {
    /// Bytes the queue holds (for the gateway's budget).
    pub(super) fn held_bytes(&self) -> usize {
        self.bytes
    }

    /// Queues `request` (checked already); its reply.
    pub(super) fn queue(&mut self, request: Request) -> Frame {
        if let Request::Reply(Frame::Error(message)) = request {
            self.doom();
            return Frame::Error(message);
        }
        if self.doomed {
            return Frame::simple("QUEUED"); // never run: EXEC discards the transaction
        }
        if matches!(request, Request::Scan(_) | Request::Keys { .. } | Request::DbSize) {
            self.doom();
            return Frame::error(KEYSPACE_INSIDE_MULTI_REPLY);
        }
        if let Request::Update { name, .. } = request {
            self.doom();
            return Frame::error(conditional_refusal(name));
        }
        let bytes = queued_bytes(&request);
        if self.queued.len() >= MULTI_QUEUED_COMMANDS_MAX || self.bytes + bytes > MULTI_QUEUED_BYTES_MAX {
            self.doom();
            return Frame::error(format!(
                "ERR MULTI queue full: rampkv queues at most {MULTI_QUEUED_COMMANDS_MAX} commands and \
                 {MULTI_QUEUED_BYTES_MAX} bytes between MULTI and EXEC; the transaction is discarded"
            ));
        }
        self.bytes += bytes;
        self.queued.push(request);
        debug_assert!(self.queued.len() <= MULTI_QUEUED_COMMANDS_MAX && self.bytes <= MULTI_QUEUED_BYTES_MAX);
        Frame::simple("QUEUED")
    }

    fn doom(&mut self) {
        self.doomed = true;
        self.queued = Vec::new();
        self.bytes = 0;
    }
}

/// Bytes a queued command holds: its keys, values and a fixed overhead.
fn queued_bytes(request: &Request) -> usize {
    let keys = |keys: &[Vec<u8>]| keys.iter().map(Vec::len).sum::<usize>();
    let data = match request {
        Request::Get { key } | Request::Strlen { key } | Request::Type { key } => key.len(),
        Request::MultiGet { keys: list }
        | Request::Exists { keys: list }
        | Request::Delete { keys: list }
        | Request::Unlink { keys: list } => keys(list),
        Request::Set { key, value } | Request::SetExpiring { key, value, .. } => key.len() + value.len(),
        Request::TimeToLive { key, .. } => key.len(),
        Request::MultiSet { pairs } => pairs.iter().map(|(key, value)| key.len() + value.len()).sum(),
        Request::Reply(frame) => frame.to_bytes(Protocol::Resp3).len(),
        Request::ClientSetName(name) => name.len(),
        Request::Auth { user, password } => user.as_ref().map_or(0, Vec::len) + password.len(),
        Request::Hello { auth, name, .. } => {
            auth.as_ref().map_or(0, |(user, password)| user.len() + password.len()) + name.as_ref().map_or(0, Vec::len)
        }
        _ => 0,
    };
    data + QUEUED_COMMAND_OVERHEAD_BYTES
}
