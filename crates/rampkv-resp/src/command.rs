//! The command table and the translation of a parsed command into a [`Request`].
//!
//! No I/O and no gateway state: a command either becomes a transaction to run (GET, MGET,
//! EXISTS, STRLEN, TYPE, SET, MSET, DEL, UNLINK; and for expiry SET EX/PX/EXAT/PXAT, SETEX,
//! PSETEX, TTL, PTTL), a single-key update (INCR & co., SETNX, SET NX|XX|GET|KEEPTTL, GETSET,
//! GETDEL, APPEND, EXPIRE & co., PERSIST, GETEX), a key space request (SCAN, KEYS, DBSIZE: listing or counting pages,
//! [`crate::keyspace`]), a request that needs the connection's or gateway's state (AUTH, HELLO,
//! INFO, CLIENT SETNAME/GETNAME/ID, QUIT, MULTI, EXEC, DISCARD, WATCH), or a reply known at once
//! (PING, UNWATCH, errors, ...).
//!
//! # Errors
//! Unknown commands, wrong arities and unknown subcommands get Redis's exact texts (Redis 7.0),
//! so tools that match on them keep working. Commands rampkv cannot honour (MSETNX, WATCH,
//! other databases) get an error that says so. Every check happens here, before a transaction
//! starts: a command that fails here changes no state. The one clock reading here is the
//! gateway's, at receipt, for the relative expiry of an update (EXPIRE, PEXPIRE, GETEX EX|PX,
//! SET NX|XX|GET EX|PX): `expiry` and `strings` say why.
//!
//! # Order of checks (Redis 7.0's)
//! Command name, then arity (of the subcommand too, `client|setname`), then the connection's
//! [`Permissions`] (`-NOAUTH`, `-NOPERM`), then the command's own checks (sizes, options).
//!
//! # Layout
//! - `table`: the command table (names, arities, flags) and [`lookup`].
//! - `request`: [`Request`], what a command asks the gateway to do, and the types it carries.
//! - `parse`: the checks every command shares (keys, values, integers, Redis's texts).
//! - `strings`: SET with its options, SETEX, PSETEX.
//! - `conditional`: INCR & co., SETNX, GETSET, GETDEL, APPEND, MSETNX (refused).
//! - `expiry`: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT, PERSIST, GETEX.
//! - `connection`: HELLO, CLIENT, CONFIG, COMMAND.
//! - this file: [`parse_request`], which checks a command in Redis's order and dispatches it.

mod conditional;
mod connection;
mod expiry;
mod parse;
mod request;
mod strings;
mod table;

pub use conditional::{MSETNX_REFUSAL, NOT_AN_INTEGER_REPLY, OVERFLOW_REPLY};
pub use request::{ExpiryArg, InfoSection, InfoSections, Pairs, Request, TtlUnit, UpdateReply};
pub use table::{lookup, CommandKind, CommandSpec, SubcommandSpec, COMMANDS};

use crate::auth::Permissions;
use crate::codec::{Args, Frame};
use crate::keyspace::parse_scan;
use parse::{checked_keys, checked_pairs, parse_integer, unknown_command, unknown_subcommand, wrong_arity};
use rampkv_core::types::wall_clock_unix_ms;
use table::subcommands;

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
        CommandKind::Set if args.len() > 3 => strings::set_with_options(args, wall_clock_unix_ms),
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
        CommandKind::SetExpire | CommandKind::SetExpireMs => strings::set_expire(spec, args),
        CommandKind::Expire => expiry::expire(spec.kind, "EXPIRE", args, wall_clock_unix_ms),
        CommandKind::ExpireMs => expiry::expire(spec.kind, "PEXPIRE", args, wall_clock_unix_ms),
        CommandKind::ExpireAt => expiry::expire(spec.kind, "EXPIREAT", args, wall_clock_unix_ms),
        CommandKind::ExpireAtMs => expiry::expire(spec.kind, "PEXPIREAT", args, wall_clock_unix_ms),
        CommandKind::Persist => expiry::persist(args),
        CommandKind::GetEx => expiry::getex(args, wall_clock_unix_ms),
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
        CommandKind::Hello => connection::hello(args),
        CommandKind::Info => Ok(Request::Info(InfoSections::parse(args))),
        CommandKind::DbSize => Ok(Request::DbSize),
        CommandKind::Scan => Ok(Request::Scan(parse_scan(args)?)),
        CommandKind::Keys => Ok(Request::Keys { pattern: args.get(1).to_vec() }),
        CommandKind::Command => connection::command(args).map(Request::Reply),
        CommandKind::Select => match parse_integer(args.get(1)) {
            Some(0) => ok(),
            Some(_) => Err(Frame::error("ERR DB index is out of range")),
            None => Err(Frame::error("ERR value is not an integer or out of range")),
        },
        CommandKind::Quit => Ok(Request::Quit),
        CommandKind::Client => connection::client(args),
        CommandKind::Config => connection::config(args).map(Request::Reply),
        CommandKind::Acl => Ok(Request::AclWhoAmI), // the only subcommand parse_request lets through
        CommandKind::Auth => match args.len() {
            2 => Ok(Request::Auth { user: None, password: args.get(1).to_vec() }),
            3 => Ok(Request::Auth { user: Some(args.get(1).to_vec()), password: args.get(2).to_vec() }),
            _ => Err(Frame::error("ERR syntax error")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Protocol, RequestParser};
    use crate::value;
    use rampkv_core::limits::{KEY_BYTES_MAX, TXN_KEYS_MAX};

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
        // With NX, XX, GET or KEEPTTL, an expiry goes with the update (`expiry`'s tests).
        for option in ["NX", "XX", "GET", "KEEPTTL"] {
            assert!(matches!(request(&format!("set k v {option}")), Request::Update { .. }), "{option}");
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
