//! The command table: every command the gateway knows, with Redis 7's name, arity, flags, key
//! positions and ACL categories (what `COMMAND INFO` reports), and the subcommands of the
//! container commands.

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
    // Expiry (docs/resp.md, "Expiry"): SETEX and PSETEX write, TTL and PTTL read; EXPIRE &
    // co., PERSIST and GETEX are single-key updates.
    SetExpire,
    SetExpireMs,
    TimeToLive,
    TimeToLiveMs,
    Expire,
    ExpireMs,
    ExpireAt,
    ExpireAtMs,
    Persist,
    GetEx,
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
    spec("expire", CommandKind::Expire, -3, &["write", "fast"], (1, 1, 1), &["@keyspace", "@write", "@fast"]),
    spec("pexpire", CommandKind::ExpireMs, -3, &["write", "fast"], (1, 1, 1), &["@keyspace", "@write", "@fast"]),
    spec("expireat", CommandKind::ExpireAt, -3, &["write", "fast"], (1, 1, 1), &["@keyspace", "@write", "@fast"]),
    spec("pexpireat", CommandKind::ExpireAtMs, -3, &["write", "fast"], (1, 1, 1), &["@keyspace", "@write", "@fast"]),
    spec("persist", CommandKind::Persist, 2, &["write", "fast"], (1, 1, 1), &["@keyspace", "@write", "@fast"]),
    spec("getex", CommandKind::GetEx, -2, &["write", "fast"], (1, 1, 1), &["@write", "@string", "@fast"]),
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
pub(super) fn subcommands(kind: CommandKind) -> &'static [SubcommandSpec] {
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

/// The entry for `name`, in any letter case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS.iter().find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}
