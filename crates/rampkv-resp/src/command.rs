//! The command table and the translation of a parsed command into a [`Request`].
//!
//! No I/O and no gateway state: a command either becomes a transaction to run (GET, MGET,
//! EXISTS, STRLEN, TYPE, SET, MSET, DEL, UNLINK; and for expiry SET EX/PX/EXAT/PXAT, SETEX,
//! PSETEX, TTL, PTTL), a key space request (SCAN, KEYS, DBSIZE: listing or counting pages,
//! [`crate::keyspace`]), a request that needs the connection's or gateway's state (AUTH, HELLO,
//! INFO, CLIENT SETNAME/GETNAME/ID, QUIT, MULTI, EXEC, DISCARD, WATCH), or a reply known at once
//! (PING, UNWATCH, errors, ...).
//!
//! # Errors
//! Unknown commands, wrong arities and unknown subcommands get Redis's exact texts (Redis 7.0),
//! so tools that match on them keep working. Commands rampkv cannot honour (yet: SET NX, XX,
//! GET and KEEPTTL; other databases) get an error that says so. Every check happens here, before a transaction
//! starts: a command that fails here changes no state.
//!
//! # Order of checks (Redis 7.0's)
//! Command name, then arity (of the subcommand too, `client|setname`), then the connection's
//! [`Permissions`] (`-NOAUTH`, `-NOPERM`), then the command's own checks (sizes, options).

mod conditional;

pub use conditional::{UpdateReply, MSETNX_REFUSAL, NOT_AN_INTEGER_REPLY, OVERFLOW_REPLY};

use super::auth::Permissions;
use super::codec::{Args, Frame, Protocol};
use super::keyspace::{parse_scan, ScanRequest};
use super::value::{self, STORED_VALUE_BYTES_MAX};
use rampkv_core::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX};
use rampkv_core::wire::SetCondition;

/// What a command does, beyond its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    Get,
    Set,
    MultiGet,
    MultiSet,
    Delete,
    Unlink,
    Exists,
    Strlen,
    Type,
    Incr,
    Decr,
    IncrBy,
    DecrBy,
    SetNx,
    GetSet,
    GetDel,
    Append,
    MultiSetNx,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    Ping,
    Echo,
    Hello,
    Info,
    DbSize,
    Scan,
    Keys,
    Command,
    Select,
    Quit,
    Client,
    Config,
    Auth,
    Acl,
    // Expiry (docs/resp.md, "Expiry"): SETEX and PSETEX write, TTL and PTTL read.
    SetExpire,
    SetExpireMs,
    TimeToLive,
    TimeToLiveMs,
}

/// One entry of the command table, as `COMMAND INFO` reports it.
#[derive(Debug)]
pub struct CommandSpec {
    /// Lower case, as Redis names commands in replies and errors.
    pub name: &'static str,
    pub kind: CommandKind,
    /// Redis's convention: `n > 0` exactly n arguments (name included), `n < 0` at least -n.
    pub arity: i64,
    pub flags: &'static [&'static str],
    /// Position of the first key argument (0: none), of the last (-1: the last argument), step.
    pub first_key: i64,
    pub last_key: i64,
    pub key_step: i64,
    pub categories: &'static [&'static str],
}

const fn spec(
    name: &'static str,
    kind: CommandKind,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    categories: &'static [&'static str],
) -> CommandSpec {
    CommandSpec { name, kind, arity, flags, first_key: keys.0, last_key: keys.1, key_step: keys.2, categories }
}

/// Every command the gateway knows.
pub const COMMANDS: &[CommandSpec] = &[
    spec("get", CommandKind::Get, 2, &["readonly", "fast"], (1, 1, 1), &["@read", "@string", "@fast"]),
    spec("set", CommandKind::Set, -3, &["write", "denyoom"], (1, 1, 1), &["@write", "@string", "@slow"]),
    spec("mget", CommandKind::MultiGet, -2, &["readonly", "fast"], (1, -1, 1), &["@read", "@string", "@fast"]),
    spec("mset", CommandKind::MultiSet, -3, &["write", "denyoom"], (1, -1, 2), &["@write", "@string", "@slow"]),
    spec("del", CommandKind::Delete, -2, &["write"], (1, -1, 1), &["@keyspace", "@write", "@slow"]),
    spec("exists", CommandKind::Exists, -2, &["readonly", "fast"], (1, -1, 1), &["@keyspace", "@read", "@fast"]),
    spec("setex", CommandKind::SetExpire, 4, &["write", "denyoom"], (1, 1, 1), &["@write", "@string", "@slow"]),
    spec("psetex", CommandKind::SetExpireMs, 4, &["write", "denyoom"], (1, 1, 1), &["@write", "@string", "@slow"]),
    spec("ttl", CommandKind::TimeToLive, 2, &["readonly", "fast"], (1, 1, 1), &["@keyspace", "@read", "@fast"]),
    spec("pttl", CommandKind::TimeToLiveMs, 2, &["readonly", "fast"], (1, 1, 1), &["@keyspace", "@read", "@fast"]),
    spec("unlink", CommandKind::Unlink, -2, &["write", "fast"], (1, -1, 1), &["@keyspace", "@write", "@fast"]),
    spec("strlen", CommandKind::Strlen, 2, &["readonly", "fast"], (1, 1, 1), &["@read", "@string", "@fast"]),
    spec("type", CommandKind::Type, 2, &["readonly", "fast"], (1, 1, 1), &["@keyspace", "@read", "@fast"]),
    spec("incr", CommandKind::Incr, 2, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("decr", CommandKind::Decr, 2, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("incrby", CommandKind::IncrBy, 3, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("decrby", CommandKind::DecrBy, 3, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("setnx", CommandKind::SetNx, 3, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("getset", CommandKind::GetSet, 3, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("getdel", CommandKind::GetDel, 2, &["write", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("append", CommandKind::Append, 3, &["write", "denyoom", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
    spec("msetnx", CommandKind::MultiSetNx, -3, &["write", "denyoom"], (1, -1, 2), &["@write", "@string", "@slow"]),
    spec(
        "multi",
        CommandKind::Multi,
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        (0, 0, 0),
        &["@fast", "@transaction"],
    ),
    spec(
        "exec",
        CommandKind::Exec,
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        (0, 0, 0),
        &["@slow", "@transaction"],
    ),
    spec(
        "discard",
        CommandKind::Discard,
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        (0, 0, 0),
        &["@fast", "@transaction"],
    ),
    spec(
        "watch",
        CommandKind::Watch,
        -2,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        (1, -1, 1),
        &["@fast", "@transaction"],
    ),
    spec(
        "unwatch",
        CommandKind::Unwatch,
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        (0, 0, 0),
        &["@fast", "@transaction"],
    ),
    spec("ping", CommandKind::Ping, -1, &["fast"], (0, 0, 0), &["@fast", "@connection"]),
    spec("echo", CommandKind::Echo, 2, &["fast"], (0, 0, 0), &["@fast", "@connection"]),
    spec(
        "hello",
        CommandKind::Hello,
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        (0, 0, 0),
        &["@fast", "@connection"],
    ),
    spec(
        "auth",
        CommandKind::Auth,
        -2,
        &["noscript", "loading", "stale", "fast", "no_auth", "allow_busy"],
        (0, 0, 0),
        &["@fast", "@connection"],
    ),
    spec("acl", CommandKind::Acl, -2, &[], (0, 0, 0), &["@slow"]),
    spec("info", CommandKind::Info, -1, &["loading", "stale"], (0, 0, 0), &["@slow", "@dangerous"]),
    spec("dbsize", CommandKind::DbSize, 1, &["readonly", "fast"], (0, 0, 0), &["@keyspace", "@read", "@fast"]),
    spec("scan", CommandKind::Scan, -2, &["readonly"], (0, 0, 0), &["@keyspace", "@read", "@slow"]),
    spec("keys", CommandKind::Keys, 2, &["readonly"], (0, 0, 0), &["@keyspace", "@read", "@slow", "@dangerous"]),
    spec("command", CommandKind::Command, -1, &["loading", "stale"], (0, 0, 0), &["@slow", "@connection"]),
    spec("select", CommandKind::Select, 2, &["loading", "stale", "fast"], (0, 0, 0), &["@fast", "@connection"]),
    spec(
        "quit",
        CommandKind::Quit,
        -1,
        &["noscript", "loading", "stale", "fast", "no_auth"],
        (0, 0, 0),
        &["@fast", "@connection"],
    ),
    spec("client", CommandKind::Client, -2, &["noscript", "loading", "stale"], (0, 0, 0), &["@slow", "@connection"]),
    spec(
        "config",
        CommandKind::Config,
        -2,
        &["admin", "noscript", "loading", "stale"],
        (0, 0, 0),
        &["@admin", "@slow", "@dangerous"],
    ),
];

/// A subcommand of a container command, with Redis 7's full name and arity (its own name
/// counted as an argument, as for the command: `CLIENT SETNAME n` is 3).
#[derive(Debug)]
pub struct SubcommandSpec {
    pub name: &'static str,
    pub arity: i64,
}

const fn subcommand(name: &'static str, arity: i64) -> SubcommandSpec {
    SubcommandSpec { name, arity }
}

/// The subcommands of CLIENT, CONFIG and COMMAND that the gateway knows (none for the others).
fn subcommands(kind: CommandKind) -> &'static [SubcommandSpec] {
    const CLIENT: &[SubcommandSpec] = &[
        subcommand("client|setname", 3),
        subcommand("client|getname", 2),
        subcommand("client|id", 2),
        subcommand("client|setinfo", 4),
    ];
    const CONFIG: &[SubcommandSpec] =
        &[subcommand("config|get", -3), subcommand("config|set", -4), subcommand("config|resetstat", 2)];
    const COMMAND: &[SubcommandSpec] = &[
        subcommand("command|count", 2),
        subcommand("command|list", -2),
        subcommand("command|info", -2),
        subcommand("command|docs", -2),
    ];
    const ACL: &[SubcommandSpec] = &[subcommand("acl|whoami", 2)];
    match kind {
        CommandKind::Acl => ACL,
        CommandKind::Client => CLIENT,
        CommandKind::Config => CONFIG,
        CommandKind::Command => COMMAND,
        _ => &[],
    }
}

/// The configuration parameters `CONFIG GET` reports: those redis-benchmark asks for.
const CONFIG_PARAMETERS: &[(&str, &str)] = &[("save", ""), ("appendonly", "no")];

/// The entry for `name`, in any letter case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Key-value pairs of a write, values in their stored form.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a command asks the gateway to do.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Request {
    /// Read one key (one `get_all`).
    Get {
        key: Vec<u8>,
    },
    /// Read every key in one read-atomic `get_all`; reply one value or null per key.
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    /// Read every key in one `get_all`; reply how many are present (repeats count each time).
    Exists {
        keys: Vec<Vec<u8>>,
    },
    /// Write one key; `value` is already in its stored form ([`value::encode`]).
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Write every pair in one `put_all`; values in stored form.
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Write one key that expires (SET with EX, PX, EXAT or PXAT; SETEX; PSETEX); `value` in
    /// its stored form. A relative expiry becomes a deadline with the batch's one clock reading.
    SetExpiring {
        key: Vec<u8>,
        value: Vec<u8>,
        expiry: ExpiryArg,
    },
    /// Read one key's time to live (TTL in seconds, PTTL in milliseconds): -2 absent, -1 no
    /// expiry.
    TimeToLive {
        key: Vec<u8>,
        unit: TtlUnit,
    },
    /// Read the keys (to count the present ones), then write a tombstone to each in one
    /// `put_all`.
    Delete {
        keys: Vec<Vec<u8>>,
    },
    /// UNLINK: what DEL does (Redis frees an unlinked value in the background; rampkv writes a
    /// tombstone either way). Its own variant only so that errors can name it.
    Unlink {
        keys: Vec<Vec<u8>>,
    },
    /// A single-key conditional write (INCR, SETNX, SET NX|XX|GET, GETSET, GETDEL, APPEND):
    /// one UPDATE of `key` (values in `op` as the client gave them: the op stores them in the
    /// stored form); `name` for errors, `reply` how its result is answered.
    Update {
        name: &'static str,
        key: Vec<u8>,
        op: rampkv_core::wire::UpdateOp,
        reply: UpdateReply,
    },
    /// Read one key; reply the length of its value (0 if absent).
    Strlen {
        key: Vec<u8>,
    },
    /// Read one key; reply `string`, or `none` if absent (every rampkv value is a string).
    Type {
        key: Vec<u8>,
    },
    /// Start queueing the connection's commands (`gateway::multi`).
    Multi,
    /// Run the queued commands as one transaction.
    Exec,
    /// An EXEC refused before it runs (its arity, permissions): reply this EXECABORT and end
    /// the transaction, as Redis does.
    ExecRefused(Frame),
    /// Drop the queued commands.
    Discard,
    /// WATCH: refused (optimistic check-and-set needs a transaction that reads and writes);
    /// the gateway answers it, inside MULTI with Redis's own error.
    Watch,
    /// Log in: `AUTH password` (user None: `default`) or `AUTH user password`.
    Auth {
        user: Option<Vec<u8>>,
        password: Vec<u8>,
    },
    /// Log in first if `auth` (user, password) is given, then switch protocol (None: keep it) and
    /// optionally name the connection; reply the greeting.
    Hello {
        protocol: Option<Protocol>,
        auth: Option<(Vec<u8>, Vec<u8>)>,
        name: Option<Vec<u8>>,
    },
    /// Reply the INFO text of these sections.
    Info(InfoSections),
    /// One SCAN step: a page (or a few) of the key listing from the cursor.
    Scan(ScanRequest),
    /// KEYS: every live key matching the pattern (the whole listing).
    Keys {
        pattern: Vec<u8>,
    },
    /// DBSIZE: the count of live keys.
    DbSize,
    /// Name the connection (empty: remove the name).
    ClientSetName(Vec<u8>),
    ClientGetName,
    ClientId,
    /// Reply the name of the user the connection is logged in as.
    AclWhoAmI,
    /// Reply OK, then close the connection.
    Quit,
    /// Reply this at once.
    Reply(Frame),
}

/// When a key written by SET EX/PX/EXAT/PXAT, SETEX or PSETEX expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryArg {
    /// This many milliseconds after the writer's clock reading (one per batch or transaction:
    /// every key of it from one instant, as Redis's `commandTimeSnapshot`).
    AfterMs(u64),
    /// At this many milliseconds since the Unix epoch.
    AtMs(u64),
}

impl ExpiryArg {
    /// The deadline in ms since the Unix epoch, given the writer's clock reading `now_ms`; a
    /// deadline beyond the largest a version carries is the largest (Redis refuses an overflow
    /// of `i64` when it parses, which [`parse_set_expiry`] does too).
    pub fn deadline_ms(self, now_ms: u64) -> u64 {
        let deadline = match self {
            ExpiryArg::AfterMs(after_ms) => now_ms.saturating_add(after_ms),
            ExpiryArg::AtMs(at_ms) => at_ms,
        };
        deadline.min(rampkv_core::types::Expiry::DEADLINE_MS_MAX)
    }
}

/// The unit TTL and PTTL answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlUnit {
    Seconds,
    Milliseconds,
}

/// One section of INFO's text, in Redis's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoSection {
    Server,
    Clients,
    Memory,
    Persistence,
    Stats,
    Replication,
    Cluster,
    Keyspace,
}

impl InfoSection {
    /// Every section the gateway writes, in the order Redis writes them.
    pub const ALL: [InfoSection; 8] = [
        InfoSection::Server,
        InfoSection::Clients,
        InfoSection::Memory,
        InfoSection::Persistence,
        InfoSection::Stats,
        InfoSection::Replication,
        InfoSection::Cluster,
        InfoSection::Keyspace,
    ];

    /// Its name as INFO takes it (lower case) and as its header shows it (`# Server`).
    pub fn name(self) -> &'static str {
        match self {
            InfoSection::Server => "server",
            InfoSection::Clients => "clients",
            InfoSection::Memory => "memory",
            InfoSection::Persistence => "persistence",
            InfoSection::Stats => "stats",
            InfoSection::Replication => "replication",
            InfoSection::Cluster => "cluster",
            InfoSection::Keyspace => "keyspace",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The sections an INFO request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfoSections(u16);

impl InfoSections {
    /// `INFO`, `INFO default`, `INFO all` and `INFO everything`: every section the gateway has.
    /// (Redis's `all` adds commandstats and latencystats, and `everything` modules: the gateway
    /// keeps none of those.)
    pub const DEFAULT: InfoSections = InfoSections((1 << InfoSection::ALL.len()) - 1);

    /// `INFO [section ...]` as Redis 7 reads it: names in any letter case, several at once,
    /// unknown ones ignored (so that `INFO nosuch` is an empty text, as in Redis).
    pub fn parse(args: &Args<'_>) -> InfoSections {
        if args.len() == 1 {
            return InfoSections::DEFAULT;
        }
        let mut wanted = 0;
        for name in args.iter_from(1) {
            let everything = [&b"default"[..], b"all", b"everything"];
            if everything.iter().any(|group| group.eq_ignore_ascii_case(name)) {
                wanted |= InfoSections::DEFAULT.0;
            }
            for section in InfoSection::ALL {
                if section.name().as_bytes().eq_ignore_ascii_case(name) {
                    wanted |= section.bit();
                }
            }
        }
        InfoSections(wanted)
    }

    pub fn contains(self, section: InfoSection) -> bool {
        self.0 & section.bit() != 0
    }
}

/// Whether `count` arguments fit Redis's `arity` (`n > 0`: exactly n; `n < 0`: at least -n).
fn arity_fits(arity: i64, count: usize) -> bool {
    let count = count as i64;
    (arity > 0 && count == arity) || (arity < 0 && count >= -arity)
}

/// Translates one non-empty request into what the gateway should do, for a connection that may
/// do what `permissions` allow.
pub fn parse_request(args: &Args<'_>, permissions: Permissions) -> Request {
    debug_assert!(!args.is_empty(), "empty requests are skipped before");
    let name = args.get(0);
    let Some(spec) = lookup(name) else {
        return Request::Reply(unknown_command(args));
    };
    match checked_request(spec, args, permissions) {
        Ok(request) => request,
        // Redis answers an EXEC it refuses (arity, permissions) with EXECABORT and the reason,
        // and ends the transaction.
        Err(Frame::Error(reason)) if spec.kind == CommandKind::Exec => {
            let reason = reason.strip_prefix(b"ERR ").unwrap_or(&reason);
            let mut message = b"EXECABORT Transaction discarded because of: ".to_vec();
            message.extend_from_slice(reason);
            Request::ExecRefused(Frame::Error(message))
        }
        Err(reply) => Request::Reply(reply),
    }
}

/// The request `args` make of `spec`, after Redis's checks in Redis's order.
fn checked_request(spec: &CommandSpec, args: &Args<'_>, permissions: Permissions) -> Result<Request, Frame> {
    if !arity_fits(spec.arity, args.len()) {
        return Err(wrong_arity(spec.name));
    }
    let full_name = full_name(spec, args)?;
    if let Some(refusal) = permissions.refusal(full_name, spec.flags.contains(&"no_auth"), spec.first_key > 0) {
        return Err(refusal);
    }
    translate(spec, args)
}

/// How many keys `args` would add to a pipeline batch if it is a GET, STRLEN, TYPE, MGET,
/// EXISTS, SET or MSET of the right arity, read from the arguments alone (nothing copied): a batch checks it
/// before it parses a request that might not fit (an MSET of 10 keys behind another), which
/// would otherwise be copied out only to be parsed again on its turn. `None` for any other
/// command. [`parse_request`] still decides: this only says what would not fit.
pub fn batch_key_count(args: &Args<'_>) -> Option<usize> {
    let count = args.len();
    let spec = lookup(args.get(0))?;
    if !arity_fits(spec.arity, count) {
        return None;
    }
    match spec.kind {
        CommandKind::Get
        | CommandKind::Strlen
        | CommandKind::Type
        | CommandKind::Set
        | CommandKind::SetExpire
        | CommandKind::SetExpireMs
        | CommandKind::TimeToLive
        | CommandKind::TimeToLiveMs => Some(1),
        CommandKind::MultiGet | CommandKind::Exists => Some(count - 1),
        CommandKind::MultiSet => Some((count - 1) / 2),
        _ => None,
    }
}

/// Redis's full name of what `args` runs (`client|setname`; the command's own name if it has no
/// subcommands), or the reply refusing an unknown subcommand or a wrong arity of a known one.
fn full_name(spec: &CommandSpec, args: &Args<'_>) -> Result<&'static str, Frame> {
    let table = subcommands(spec.kind);
    if table.is_empty() || args.len() < 2 {
        return Ok(spec.name); // no subcommands, or COMMAND alone
    }
    let wanted = args.get(1);
    let own_name = |sub: &SubcommandSpec| sub.name.split('|').nth(1).unwrap_or_default().as_bytes();
    let Some(sub) = table.iter().find(|sub| own_name(sub).eq_ignore_ascii_case(wanted)) else {
        return Err(unknown_subcommand(wanted, &spec.name.to_ascii_uppercase()));
    };
    if !arity_fits(sub.arity, args.len()) {
        return Err(wrong_arity(sub.name));
    }
    Ok(sub.name)
}

fn translate(spec: &CommandSpec, args: &Args<'_>) -> Result<Request, Frame> {
    let ok = || Ok(Request::Reply(Frame::simple("OK")));
    match spec.kind {
        CommandKind::Get => Ok(Request::Get { key: checked_keys(args, 1)?.remove(0) }),
        CommandKind::MultiGet => Ok(Request::MultiGet { keys: checked_keys(args, 1)? }),
        CommandKind::Exists => Ok(Request::Exists { keys: checked_keys(args, 1)? }),
        CommandKind::Delete => Ok(Request::Delete { keys: checked_keys(args, 1)? }),
        CommandKind::Set if args.len() > 3 => set_with_options(args),
        CommandKind::Unlink => Ok(Request::Unlink { keys: checked_keys(args, 1)? }),
        CommandKind::Strlen => Ok(Request::Strlen { key: checked_keys(args, 1)?.remove(0) }),
        CommandKind::Type => Ok(Request::Type { key: checked_keys(args, 1)?.remove(0) }),
        CommandKind::Multi => Ok(Request::Multi),
        CommandKind::Exec => Ok(Request::Exec),
        CommandKind::Discard => Ok(Request::Discard),
        CommandKind::Watch => Ok(Request::Watch),
        // Nothing is ever watched (WATCH is refused), so there is nothing to forget: what Redis
        // answers when no key is watched. A client that unwatches on its way out keeps working.
        CommandKind::Unwatch => ok(),
        CommandKind::Incr => conditional::incr(args, "INCR", 1),
        CommandKind::Decr => conditional::incr(args, "DECR", -1),
        CommandKind::IncrBy => conditional::incr_by(args, "INCRBY", false),
        CommandKind::DecrBy => conditional::incr_by(args, "DECRBY", true),
        CommandKind::SetNx => conditional::setnx(args),
        CommandKind::GetSet => conditional::getset(args),
        CommandKind::GetDel => conditional::getdel(args),
        CommandKind::Append => conditional::append(args),
        CommandKind::MultiSetNx => conditional::msetnx(args),
        CommandKind::Set => {
            let pairs = checked_pairs(args)?;
            let (key, value) = pairs.into_iter().next().expect("arity 3 gives one pair");
            Ok(Request::Set { key, value })
        }
        CommandKind::SetExpire | CommandKind::SetExpireMs => set_expire(spec, args),
        CommandKind::TimeToLive => {
            Ok(Request::TimeToLive { key: checked_keys(args, 1)?.remove(0), unit: TtlUnit::Seconds })
        }
        CommandKind::TimeToLiveMs => {
            Ok(Request::TimeToLive { key: checked_keys(args, 1)?.remove(0), unit: TtlUnit::Milliseconds })
        }
        CommandKind::MultiSet => {
            if args.len() % 2 == 0 {
                return Err(wrong_arity(spec.name));
            }
            Ok(Request::MultiSet { pairs: checked_pairs(args)? })
        }
        CommandKind::Ping => match args.len() {
            1 => Ok(Request::Reply(Frame::simple("PONG"))),
            2 => Ok(Request::Reply(Frame::bulk(args.get(1)))),
            _ => Err(wrong_arity(spec.name)),
        },
        CommandKind::Echo => Ok(Request::Reply(Frame::bulk(args.get(1)))),
        CommandKind::Hello => hello(args),
        CommandKind::Info => Ok(Request::Info(InfoSections::parse(args))),
        CommandKind::DbSize => Ok(Request::DbSize),
        CommandKind::Scan => Ok(Request::Scan(parse_scan(args)?)),
        CommandKind::Keys => Ok(Request::Keys { pattern: args.get(1).to_vec() }),
        CommandKind::Command => command(args).map(Request::Reply),
        CommandKind::Select => match parse_integer(args.get(1)) {
            Some(0) => ok(),
            Some(_) => Err(Frame::error("ERR DB index is out of range")),
            None => Err(Frame::error("ERR value is not an integer or out of range")),
        },
        CommandKind::Quit => Ok(Request::Quit),
        CommandKind::Client => client(args),
        CommandKind::Config => config(args).map(Request::Reply),
        CommandKind::Acl => Ok(Request::AclWhoAmI), // the only subcommand parse_request lets through
        CommandKind::Auth => match args.len() {
            2 => Ok(Request::Auth { user: None, password: args.get(1).to_vec() }),
            3 => Ok(Request::Auth { user: Some(args.get(1).to_vec()), password: args.get(2).to_vec() }),
            _ => Err(Frame::error("ERR syntax error")),
        },
    }
}

/// `args[start..]` as keys, each checked against the bounds of a transaction.
fn checked_keys(args: &Args<'_>, start: usize) -> Result<Vec<Vec<u8>>, Frame> {
    let count = args.len() - start;
    if count > TXN_KEYS_MAX {
        return Err(Frame::error(format!("ERR too many keys: {count}, a command takes at most {TXN_KEYS_MAX}")));
    }
    args.iter_from(start).map(|key| checked_key(key).map(<[u8]>::to_vec)).collect()
}

fn checked_key(key: &[u8]) -> Result<&[u8], Frame> {
    if key.len() > KEY_BYTES_MAX {
        return Err(Frame::error(format!("ERR key too large: {} bytes, at most {KEY_BYTES_MAX}", key.len())));
    }
    Ok(key)
}

/// `args[1..]` as key-value pairs, values in their stored form.
fn checked_pairs(args: &Args<'_>) -> Result<Pairs, Frame> {
    debug_assert!(args.len() % 2 == 1);
    let count = (args.len() - 1) / 2;
    if count > TXN_KEYS_MAX {
        return Err(Frame::error(format!("ERR too many keys: {count}, a command takes at most {TXN_KEYS_MAX}")));
    }
    let mut pairs = Vec::with_capacity(count);
    for index in 0..count {
        let key = checked_key(args.get(1 + 2 * index))?;
        let value = args.get(2 + 2 * index);
        if value.len() > STORED_VALUE_BYTES_MAX {
            return Err(Frame::error(format!(
                "ERR value too large: {} bytes, at most {STORED_VALUE_BYTES_MAX}",
                value.len()
            )));
        }
        pairs.push((key.to_vec(), value::encode(value)));
    }
    Ok(pairs)
}

/// The key and the stored value of SET's first two arguments, checked.
fn set_key_value(args: &Args<'_>) -> Result<(Vec<u8>, Vec<u8>), Frame> {
    let key = checked_key(args.get(1))?.to_vec();
    let value = args.get(2);
    if value.len() > STORED_VALUE_BYTES_MAX {
        return Err(Frame::error(format!(
            "ERR value too large: {} bytes, at most {STORED_VALUE_BYTES_MAX}",
            value.len()
        )));
    }
    Ok((key, value::encode(value)))
}

/// `SET key value [NX | XX] [GET] [EX s | PX ms | EXAT s | PXAT ms | KEEPTTL]`, Redis 7.0's
/// checks in its order: the options' syntax first (`ERR syntax error`), then the expiry's
/// number (`ERR value is not an integer or out of range`, then `ERR invalid expire time in
/// 'set' command` for one not above 0 or whose milliseconds overflow). NX, XX and GET are a
/// single-key update (`conditional`); KEEPTTL, or NX/XX/GET together with an expiry, are
/// refused until the update ops carry expiries, saying so.
fn set_with_options(args: &Args<'_>) -> Result<Request, Frame> {
    let syntax = || Frame::error("ERR syntax error");
    let mut expiry: Option<(&[u8], &[u8])> = None;
    let mut conditional: Option<&'static str> = None;
    let (mut not_existing, mut existing, mut keep_ttl, mut get) = (false, false, false, false);
    let mut position = 3;
    while position < args.len() {
        let option = args.get(position);
        let is = |name: &str| option.eq_ignore_ascii_case(name.as_bytes());
        if is("NX") && !existing {
            (not_existing, conditional) = (true, conditional.or(Some("NX")));
        } else if is("XX") && !not_existing {
            (existing, conditional) = (true, conditional.or(Some("XX")));
        } else if is("GET") {
            (get, conditional) = (true, conditional.or(Some("GET")));
        } else if is("KEEPTTL") && expiry.is_none() {
            (keep_ttl, conditional) = (true, conditional.or(Some("KEEPTTL")));
        } else if is("EX") || is("PX") || is("EXAT") || is("PXAT") {
            // As Redis: one unit, given again or not (the last number counts), and no KEEPTTL.
            let other_unit = expiry.is_some_and(|(unit, _)| !unit.eq_ignore_ascii_case(option));
            let Some(number) = args.iter_from(position + 1).next().filter(|_| !other_unit && !keep_ttl) else {
                return Err(syntax());
            };
            expiry = Some((option, number));
            position += 1;
        } else {
            return Err(syntax());
        }
        position += 1;
    }
    debug_assert!(!get || conditional.is_some());
    if let Some(option) = conditional {
        if keep_ttl || expiry.is_some() {
            return Err(Frame::error(format!(
                "ERR SET {option} is not supported by rampkv yet with an expiry or KEEPTTL: keeping or setting \
                 the key's expiry in a conditional write needs the expiry update ops (see docs/resp.md)"
            )));
        }
        // NX, XX and GET alone: one single-key update at the key's primary.
        let condition = match (not_existing, existing) {
            (true, _) => SetCondition::IfAbsent,
            (_, true) => SetCondition::IfPresent,
            _ => SetCondition::Always,
        };
        return conditional::set(args, condition, get);
    }
    let (key, value) = set_key_value(args)?;
    let Some((unit, number)) = expiry else {
        return Ok(Request::Set { key, value });
    };
    let expiry = parse_set_expiry(unit, number, "set")?;
    Ok(Request::SetExpiring { key, value, expiry })
}

/// `SETEX key seconds value`, `PSETEX key milliseconds value`: the expiry checked as SET's.
fn set_expire(spec: &CommandSpec, args: &Args<'_>) -> Result<Request, Frame> {
    let unit: &[u8] = if spec.kind == CommandKind::SetExpire { b"EX" } else { b"PX" };
    let expiry = parse_set_expiry(unit, args.get(2), spec.name)?;
    let key = checked_key(args.get(1))?.to_vec();
    let value = args.get(3);
    if value.len() > STORED_VALUE_BYTES_MAX {
        return Err(Frame::error(format!(
            "ERR value too large: {} bytes, at most {STORED_VALUE_BYTES_MAX}",
            value.len()
        )));
    }
    Ok(Request::SetExpiring { key, value: value::encode(value), expiry })
}

/// An expiry option's number (`EX`, `PX`, `EXAT`, `PXAT`, any letter case) as Redis 7.0
/// checks it: an `i64` above 0 whose milliseconds do not overflow.
fn parse_set_expiry(unit: &[u8], number: &[u8], command: &str) -> Result<ExpiryArg, Frame> {
    let Some(amount) = parse_integer(number) else {
        return Err(Frame::error("ERR value is not an integer or out of range"));
    };
    let invalid = || Frame::error(format!("ERR invalid expire time in '{command}' command"));
    let seconds = unit.eq_ignore_ascii_case(b"EX") || unit.eq_ignore_ascii_case(b"EXAT");
    let milliseconds = match seconds {
        true => amount.checked_mul(1_000),
        false => Some(amount),
    };
    let milliseconds = match milliseconds {
        Some(milliseconds) if amount > 0 => milliseconds as u64,
        _ => return Err(invalid()),
    };
    let absolute = unit.eq_ignore_ascii_case(b"EXAT") || unit.eq_ignore_ascii_case(b"PXAT");
    Ok(if absolute { ExpiryArg::AtMs(milliseconds) } else { ExpiryArg::AfterMs(milliseconds) })
}

/// Redis's text: `ERR unknown command 'name', with args beginning with: 'a' 'b' `. The
/// arguments shown stop once 128 bytes of them are shown.
fn unknown_command(args: &Args<'_>) -> Frame {
    const SHOWN_BYTES_MAX: usize = 128;
    let name = args.get(0);
    let mut message = b"ERR unknown command '".to_vec();
    message.extend_from_slice(&name[..name.len().min(SHOWN_BYTES_MAX)]);
    message.extend_from_slice(b"', with args beginning with: ");
    let mut shown = Vec::new();
    for arg in args.iter_from(1) {
        if shown.len() >= SHOWN_BYTES_MAX {
            break;
        }
        let room = SHOWN_BYTES_MAX - shown.len();
        shown.push(b'\'');
        shown.extend_from_slice(&arg[..arg.len().min(room)]);
        shown.extend_from_slice(b"' ");
    }
    message.extend_from_slice(&shown);
    Frame::Error(message)
}

fn wrong_arity(name: &str) -> Frame {
    Frame::error(format!("ERR wrong number of arguments for '{name}' command"))
}

fn unknown_subcommand(subcommand: &[u8], command: &str) -> Frame {
    let subcommand = String::from_utf8_lossy(subcommand);
    Frame::error(format!("ERR unknown subcommand '{subcommand}'. Try {command} HELP."))
}

/// A strict decimal i64 (Redis's `string2ll`).
fn parse_integer(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty()
        || !digits.bytes().all(|byte| byte.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    text.parse().ok()
}

/// Redis accepts client names of printable ASCII without blanks.
fn valid_client_name(name: &[u8]) -> bool {
    name.iter().all(|byte| (b'!'..=b'~').contains(byte))
}

fn invalid_client_name() -> Frame {
    Frame::error("ERR Client names cannot contain spaces, newlines or special characters.")
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
fn hello(args: &Args<'_>) -> Result<Request, Frame> {
    let mut protocol = None;
    let mut name = None;
    let mut auth = None;
    if args.len() >= 2 {
        protocol = Some(match parse_integer(args.get(1)) {
            Some(2) => Protocol::Resp2,
            Some(3) => Protocol::Resp3,
            Some(_) => return Err(Frame::error("NOPROTO unsupported protocol version")),
            None => return Err(Frame::error("ERR Protocol version is not an integer or out of range")),
        });
    }
    let mut position = 2;
    while position < args.len() {
        let option = args.get(position);
        let left = args.len() - position - 1;
        if option.eq_ignore_ascii_case(b"AUTH") && left >= 2 {
            // Checked by the gateway, which knows the users. Unlike Redis, which logs in as it
            // meets the option, a HELLO with an error in a later option logs nobody in.
            auth = Some((args.get(position + 1).to_vec(), args.get(position + 2).to_vec()));
            position += 3;
        } else if option.eq_ignore_ascii_case(b"SETNAME") && left >= 1 {
            let wanted = args.get(position + 1);
            if !valid_client_name(wanted) {
                return Err(invalid_client_name());
            }
            name = Some(wanted.to_vec());
            position += 2;
        } else {
            let option = String::from_utf8_lossy(option);
            return Err(Frame::error(format!("ERR Syntax error in HELLO option '{option}'")));
        }
    }
    Ok(Request::Hello { protocol, auth, name })
}

/// `CLIENT SETNAME | GETNAME | ID | SETINFO` (arities checked by [`parse_request`]).
fn client(args: &Args<'_>) -> Result<Request, Frame> {
    let subcommand = args.get(1);
    if subcommand.eq_ignore_ascii_case(b"SETNAME") {
        if !valid_client_name(args.get(2)) {
            return Err(invalid_client_name());
        }
        Ok(Request::ClientSetName(args.get(2).to_vec()))
    } else if subcommand.eq_ignore_ascii_case(b"GETNAME") {
        Ok(Request::ClientGetName)
    } else if subcommand.eq_ignore_ascii_case(b"ID") {
        Ok(Request::ClientId)
    } else if subcommand.eq_ignore_ascii_case(b"SETINFO") {
        let attribute = args.get(2);
        if attribute.eq_ignore_ascii_case(b"LIB-NAME") || attribute.eq_ignore_ascii_case(b"LIB-VER") {
            Ok(Request::Reply(Frame::simple("OK")))
        } else {
            Err(Frame::error(format!("ERR Unrecognized option '{}'", String::from_utf8_lossy(attribute))))
        }
    } else {
        Err(unknown_subcommand(subcommand, "CLIENT"))
    }
}

/// `CONFIG GET pattern [pattern ...] | SET | RESETSTAT` (arities checked by [`parse_request`]).
fn config(args: &Args<'_>) -> Result<Frame, Frame> {
    let subcommand = args.get(1);
    if subcommand.eq_ignore_ascii_case(b"GET") {
        let pairs = CONFIG_PARAMETERS
            .iter()
            .filter(|(name, _)| args.iter_from(2).any(|pattern| glob_matches(pattern, name.as_bytes())))
            .map(|(name, value)| (Frame::bulk(*name), Frame::bulk(*value)))
            .collect();
        Ok(Frame::Map(pairs))
    } else if subcommand.eq_ignore_ascii_case(b"SET") {
        Err(Frame::error("ERR CONFIG SET is not supported by rampkv"))
    } else if subcommand.eq_ignore_ascii_case(b"RESETSTAT") {
        Ok(Frame::simple("OK"))
    } else {
        Err(unknown_subcommand(subcommand, "CONFIG"))
    }
}

/// Glob matching with `*` and `?`, ignoring letter case (how CONFIG GET matches names).
/// Greedy with one backtracking point: O(pattern × text) at worst, no recursion.
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&byte) if byte == b'?' || byte.eq_ignore_ascii_case(&text[t]) => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&byte| byte == b'*')
}

/// `COMMAND`, `COMMAND COUNT | LIST | INFO [name ...] | DOCS [name ...]`.
fn command(args: &Args<'_>) -> Result<Frame, Frame> {
    if args.len() == 1 {
        return Ok(Frame::Array(COMMANDS.iter().map(command_info).collect()));
    }
    let subcommand = args.get(1);
    if subcommand.eq_ignore_ascii_case(b"COUNT") {
        Ok(Frame::Integer(COMMANDS.len() as i64))
    } else if subcommand.eq_ignore_ascii_case(b"LIST") {
        Ok(Frame::Array(COMMANDS.iter().map(|spec| Frame::bulk(spec.name)).collect()))
    } else if subcommand.eq_ignore_ascii_case(b"INFO") {
        if args.len() == 2 {
            return Ok(Frame::Array(COMMANDS.iter().map(command_info).collect()));
        }
        Ok(Frame::Array(args.iter_from(2).map(|name| lookup(name).map_or(Frame::Null, command_info)).collect()))
    } else if subcommand.eq_ignore_ascii_case(b"DOCS") {
        // Documentation is optional for clients: redis-cli falls back to its built-in help.
        Ok(Frame::Map(Vec::new()))
    } else {
        Err(unknown_subcommand(subcommand, "COMMAND"))
    }
}

/// One command's entry in Redis 7's `COMMAND INFO` layout: name, arity, flags, first key, last
/// key, step, ACL categories, tips, key specifications, subcommands.
fn command_info(spec: &CommandSpec) -> Frame {
    let simple_set = |items: &[&str]| Frame::Set(items.iter().map(|item| Frame::simple(item)).collect());
    Frame::Array(vec![
        Frame::bulk(spec.name),
        Frame::Integer(spec.arity),
        simple_set(spec.flags),
        Frame::Integer(spec.first_key),
        Frame::Integer(spec.last_key),
        Frame::Integer(spec.key_step),
        simple_set(spec.categories),
        Frame::Set(Vec::new()),
        Frame::Array(Vec::new()),
        Frame::Array(Vec::new()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::RequestParser;

    fn request(line: &str) -> Request {
        request_as(line, Permissions::ALL)
    }

    fn request_as(line: &str, permissions: Permissions) -> Request {
        let mut parser = RequestParser::new();
        let input = format!("{line}\r\n");
        let (args, _) = parser.parse(input.as_bytes()).unwrap().unwrap();
        parse_request(&args, permissions)
    }

    fn error_text(line: &str) -> String {
        match request(line) {
            Request::Reply(Frame::Error(message)) => String::from_utf8(message).unwrap(),
            other => panic!("{line}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn data_commands_become_transactions_with_stored_values() {
        assert_eq!(request("get k"), Request::Get { key: b"k".to_vec() });
        assert_eq!(
            request("MGET a b a"),
            Request::MultiGet { keys: vec![b"a".to_vec(), b"b".to_vec(), b"a".to_vec()] }
        );
        assert_eq!(request("set k v"), Request::Set { key: b"k".to_vec(), value: value::encode(b"v") });
        assert_eq!(
            request("mset a 1 b 2"),
            Request::MultiSet {
                pairs: vec![(b"a".to_vec(), value::encode(b"1")), (b"b".to_vec(), value::encode(b"2"))]
            }
        );
        assert_eq!(request("Del a"), Request::Delete { keys: vec![b"a".to_vec()] });
        assert_eq!(request("exists a"), Request::Exists { keys: vec![b"a".to_vec()] });
    }

    /// Issue 31: what a pipeline batch counts before parsing agrees with what parsing gives,
    /// and names no key for commands that never join a batch.
    #[test]
    fn the_batch_key_count_agrees_with_the_parsed_request() {
        let count = |line: &str| {
            let input = format!("{line}\r\n");
            let mut parser = RequestParser::new();
            let (args, _) = parser.parse(input.as_bytes()).unwrap().unwrap();
            batch_key_count(&args)
        };
        for (line, keys) in [
            ("get k", 1),
            ("strlen k", 1),
            ("TYPE k", 1),
            ("SET k v", 1),
            ("mget a b a", 3),
            ("EXISTS a b", 2),
            ("mset a 1 b 2 c 3", 3),
        ] {
            assert_eq!(count(line), Some(keys), "{line}");
            let parsed = match request(line) {
                Request::Get { .. } | Request::Strlen { .. } | Request::Type { .. } | Request::Set { .. } => 1,
                Request::MultiGet { keys } | Request::Exists { keys } => keys.len(),
                Request::MultiSet { pairs } => pairs.len(),
                other => panic!("{line}: {other:?}"),
            };
            assert_eq!(parsed, keys, "{line}");
        }
        for line in ["del a", "ping", "get", "get a b", "mget", "set k", "mset a", "foo a b", "hello 3"] {
            assert_eq!(count(line), None, "{line}");
        }
    }

    #[test]
    fn errors_use_redis_texts() {
        assert_eq!(error_text("foo a b"), "ERR unknown command 'foo', with args beginning with: 'a' 'b' ");
        assert_eq!(error_text("foo"), "ERR unknown command 'foo', with args beginning with: ");
        let long = "x".repeat(200);
        assert_eq!(
            error_text(&format!("foo {long} y")),
            format!("ERR unknown command 'foo', with args beginning with: '{}' ", "x".repeat(128))
        );
        assert_eq!(error_text("GET"), "ERR wrong number of arguments for 'get' command");
        assert_eq!(error_text("get a b"), "ERR wrong number of arguments for 'get' command");
        assert_eq!(error_text("mset a"), "ERR wrong number of arguments for 'mset' command");
        assert_eq!(error_text("mset a b c"), "ERR wrong number of arguments for 'mset' command");
        assert_eq!(error_text("ping a b"), "ERR wrong number of arguments for 'ping' command");
        assert_eq!(error_text("select 1"), "ERR DB index is out of range");
        assert_eq!(error_text("select x"), "ERR value is not an integer or out of range");
        assert_eq!(error_text("client foo"), "ERR unknown subcommand 'foo'. Try CLIENT HELP.");
        assert_eq!(error_text("client setname"), "ERR wrong number of arguments for 'client|setname' command");
        assert_eq!(
            error_text("client setname \"a b\""),
            "ERR Client names cannot contain spaces, newlines or special characters."
        );
        assert_eq!(error_text("hello 4"), "NOPROTO unsupported protocol version");
        assert_eq!(error_text("auth a b c"), "ERR syntax error");
        assert_eq!(error_text("auth"), "ERR wrong number of arguments for 'auth' command");
        assert_eq!(error_text("config set a"), "ERR wrong number of arguments for 'config|set' command");
        assert_eq!(error_text("command count x"), "ERR wrong number of arguments for 'command|count' command");
        assert_eq!(error_text("command nosuch"), "ERR unknown subcommand 'nosuch'. Try COMMAND HELP.");
        assert!(error_text("set k v keepttl").contains("SET KEEPTTL is not supported by rampkv yet"));
        assert_eq!(request("dbsize").clone(), Request::DbSize);
        assert_eq!(request("keys a*").clone(), Request::Keys { pattern: b"a*".to_vec() });
        assert_eq!(error_text("keys"), "ERR wrong number of arguments for 'keys' command");
        assert_eq!(error_text("scan x"), "ERR invalid cursor");
    }

    /// SET's expiry options, SETEX, PSETEX, TTL and PTTL, with Redis 7.0's error texts in its
    /// order of checks (syntax first, then the number, then its range).
    #[test]
    fn expiry_options_and_commands_parse_as_redis_does() {
        let set = |expiry| Request::SetExpiring { key: b"k".to_vec(), value: value::encode(b"v"), expiry };
        assert_eq!(request("set k v ex 10"), set(ExpiryArg::AfterMs(10_000)));
        assert_eq!(request("SET k v PX 1500"), set(ExpiryArg::AfterMs(1_500)));
        assert_eq!(request("set k v exat 1700000000"), set(ExpiryArg::AtMs(1_700_000_000_000)));
        assert_eq!(request("set k v pxat 1700000000123"), set(ExpiryArg::AtMs(1_700_000_000_123)));
        assert_eq!(request("set k v ex 5 ex 7"), set(ExpiryArg::AfterMs(7_000)), "the same unit again: the last");
        assert_eq!(request("setex k 3 v"), set(ExpiryArg::AfterMs(3_000)));
        assert_eq!(request("psetex k 30 v"), set(ExpiryArg::AfterMs(30)));
        assert_eq!(request("ttl k"), Request::TimeToLive { key: b"k".to_vec(), unit: TtlUnit::Seconds });
        assert_eq!(request("PTTL k"), Request::TimeToLive { key: b"k".to_vec(), unit: TtlUnit::Milliseconds });
        for line in [
            "set k v ex",
            "set k v ex 1 px 2",
            "set k v px 1 keepttl",
            "set k v keepttl px 1",
            "set k v nx xx",
            "set k v foo",
        ] {
            assert_eq!(error_text(line), "ERR syntax error", "{line}");
        }
        for line in ["set k v ex ten", "set k v px 1.5", "set k v ex 99999999999999999999", "setex k x v"] {
            assert_eq!(error_text(line), "ERR value is not an integer or out of range", "{line}");
        }
        for line in ["set k v ex 0", "set k v px -1", "set k v exat 0", "set k v ex 9223372036854776"] {
            assert_eq!(error_text(line), "ERR invalid expire time in 'set' command", "{line}");
        }
        assert_eq!(error_text("setex k 0 v"), "ERR invalid expire time in 'setex' command");
        assert_eq!(error_text("psetex k -5 v"), "ERR invalid expire time in 'psetex' command");
        assert_eq!(error_text("setex k 1"), "ERR wrong number of arguments for 'setex' command");
        assert_eq!(error_text("ttl"), "ERR wrong number of arguments for 'ttl' command");
        for option in ["NX", "XX", "GET"] {
            let text = error_text(&format!("set k v {option} px 10"));
            assert!(text.starts_with(&format!("ERR SET {option} is not supported by rampkv yet")), "{text}");
        }
        // A relative expiry becomes a deadline from the writer's one reading of its clock.
        assert_eq!(ExpiryArg::AfterMs(1_500).deadline_ms(1_000), 2_500);
        assert_eq!(ExpiryArg::AtMs(7).deadline_ms(1_000), 7, "an absolute deadline in the past stays");
        assert_eq!(ExpiryArg::AfterMs(u64::MAX).deadline_ms(5), rampkv_core::types::Expiry::DEADLINE_MS_MAX);
    }

    #[test]
    fn oversized_keys_values_and_key_counts_are_refused_before_any_transaction() {
        let big_key = "k".repeat(KEY_BYTES_MAX + 1);
        assert!(error_text(&format!("get {big_key}")).starts_with("ERR key too large"));
        assert!(error_text(&format!("mset a 1 {big_key} 2")).starts_with("ERR key too large"));
        let keys = (0..=TXN_KEYS_MAX).map(|i| i.to_string()).collect::<Vec<_>>().join(" ");
        assert!(error_text(&format!("mget {keys}")).starts_with("ERR too many keys"));
        assert_eq!(
            request(&format!("get {}", "k".repeat(KEY_BYTES_MAX))).clone(),
            Request::Get { key: vec![b'k'; KEY_BYTES_MAX] }
        );
    }

    #[test]
    fn connection_and_introspection_commands() {
        assert_eq!(request("ping"), Request::Reply(Frame::simple("PONG")));
        assert_eq!(request("PING hi"), Request::Reply(Frame::bulk("hi")));
        assert_eq!(request("echo hi"), Request::Reply(Frame::bulk("hi")));
        assert_eq!(request("select 0"), Request::Reply(Frame::simple("OK")));
        assert_eq!(request("hello"), Request::Hello { protocol: None, auth: None, name: None });
        assert_eq!(
            request("hello 3 auth default pw setname me"),
            Request::Hello {
                protocol: Some(Protocol::Resp3),
                auth: Some((b"default".to_vec(), b"pw".to_vec())),
                name: Some(b"me".to_vec())
            }
        );
        assert_eq!(request("acl whoami"), Request::AclWhoAmI);
        assert_eq!(error_text("acl setuser x"), "ERR unknown subcommand 'setuser'. Try ACL HELP.");
        assert_eq!(request("auth pw"), Request::Auth { user: None, password: b"pw".to_vec() });
        assert_eq!(request("AUTH u pw"), Request::Auth { user: Some(b"u".to_vec()), password: b"pw".to_vec() });
        assert_eq!(request("client setname me"), Request::ClientSetName(b"me".to_vec()));
        assert_eq!(request("client setinfo lib-name redis-py"), Request::Reply(Frame::simple("OK")));
        assert_eq!(request("command count"), Request::Reply(Frame::Integer(COMMANDS.len() as i64)));
        assert_eq!(request("command docs"), Request::Reply(Frame::Map(vec![])));
        assert_eq!(
            request("config get save appendonly"),
            Request::Reply(Frame::Map(vec![
                (Frame::bulk("save"), Frame::bulk("")),
                (Frame::bulk("appendonly"), Frame::bulk("no"))
            ]))
        );
        assert_eq!(request("config get maxmemory"), Request::Reply(Frame::Map(vec![])));
        let Request::Reply(Frame::Array(info)) = request("command info get nosuch") else { panic!() };
        assert_eq!((info.len(), &info[1]), (2, &Frame::Null));
    }

    #[test]
    fn issue_31_commands_parse_as_redis_s() {
        assert_eq!(request("type k"), Request::Type { key: b"k".to_vec() });
        assert_eq!(request("STRLEN k"), Request::Strlen { key: b"k".to_vec() });
        assert_eq!(request("unlink a b"), Request::Unlink { keys: vec![b"a".to_vec(), b"b".to_vec()] });
        assert_eq!(request("multi"), Request::Multi);
        assert_eq!(request("EXEC"), Request::Exec);
        assert_eq!(request("discard"), Request::Discard);
        assert_eq!(request("watch a b"), Request::Watch);
        assert_eq!(request("unwatch"), Request::Reply(Frame::simple("OK")));
        assert_eq!(error_text("type"), "ERR wrong number of arguments for 'type' command");
        assert_eq!(error_text("strlen a b"), "ERR wrong number of arguments for 'strlen' command");
        assert_eq!(error_text("multi x"), "ERR wrong number of arguments for 'multi' command");
        assert_eq!(error_text("watch"), "ERR wrong number of arguments for 'watch' command");
        // Redis answers an EXEC it refuses with EXECABORT and the reason (without ERR).
        let aborted = |reason: &str| {
            Request::ExecRefused(Frame::error(format!("EXECABORT Transaction discarded because of: {reason}")))
        };
        assert_eq!(request("exec x"), aborted("wrong number of arguments for 'exec' command"));
        assert_eq!(request_as("exec", Permissions::UNAUTHENTICATED), aborted("NOAUTH Authentication required."));
        let Request::Reply(Frame::Array(info)) = request("command info type strlen unlink multi exec watch") else {
            panic!()
        };
        let arities: Vec<&Frame> = info
            .iter()
            .map(|entry| match entry {
                Frame::Array(fields) => &fields[1],
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(arities, [2, 2, -2, 1, 1, -2].map(Frame::Integer).iter().collect::<Vec<_>>());
    }

    #[test]
    fn info_sections_are_read_as_redis_7_reads_them() {
        let sections = |line: &str| match request(line) {
            Request::Info(sections) => sections,
            other => panic!("{line}: {other:?}"),
        };
        for line in ["info", "info default", "INFO all", "info EVERYTHING", "info server all"] {
            assert_eq!(sections(line), InfoSections::DEFAULT, "{line}");
        }
        let some = sections("info SERVER keyspace nosuch");
        let wanted: Vec<InfoSection> = InfoSection::ALL.into_iter().filter(|section| some.contains(*section)).collect();
        assert_eq!(wanted, [InfoSection::Server, InfoSection::Keyspace]);
        let none = sections("info nosuch");
        assert!(InfoSection::ALL.iter().all(|section| !none.contains(*section)));
        assert!(InfoSection::ALL.iter().all(|section| InfoSections::DEFAULT.contains(*section)));
    }

    #[test]
    fn glob_patterns_match_like_config_get() {
        assert!(glob_matches(b"*", b"save"));
        assert!(glob_matches(b"SA?E", b"save"));
        assert!(glob_matches(b"*only", b"appendonly"));
        assert!(glob_matches(b"a*p*y", b"appendonly"));
        assert!(!glob_matches(b"a*x", b"appendonly"));
        assert!(!glob_matches(b"", b"save"));
        assert!(glob_matches(b"**", b""));
    }

    /// Redis 7.0's order, pinned against redis-server 7.0.15 with `requirepass`: name and arity
    /// errors first, then NOAUTH for everything but AUTH, HELLO and QUIT.
    #[test]
    fn before_authentication_only_auth_hello_and_quit_run() {
        let anonymous = Permissions::UNAUTHENTICATED;
        let noauth = Request::Reply(Frame::error(crate::auth::NOAUTH_REPLY));
        for line in [
            "ping",
            "get k",
            "mget a b",
            "set k v",
            "client id",
            "select 0",
            "command count",
            "echo x",
            "info",
            "config get save",
            "client setname x",
            "dbsize",
            "scan 0",
            "keys *",
            "multi",
            "discard",
            "watch k",
            "unwatch",
            "type k",
            "strlen k",
            "unlink k",
        ] {
            assert_eq!(request_as(line, anonymous), noauth, "{line}");
        }
        assert_eq!(request_as("auth pw", anonymous), Request::Auth { user: None, password: b"pw".to_vec() });
        assert_eq!(request_as("quit", anonymous), Request::Quit);
        assert!(matches!(request_as("hello 3", anonymous), Request::Hello { .. }));
        let reply_text = |line| match request_as(line, anonymous) {
            Request::Reply(Frame::Error(message)) => String::from_utf8(message).unwrap(),
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(reply_text("foo a b"), "ERR unknown command 'foo', with args beginning with: 'a' 'b' ");
        assert_eq!(reply_text("get"), "ERR wrong number of arguments for 'get' command");
        assert_eq!(reply_text("client foo"), "ERR unknown subcommand 'foo'. Try CLIENT HELP.");
        assert_eq!(reply_text("client setname"), "ERR wrong number of arguments for 'client|setname' command");
    }
}
