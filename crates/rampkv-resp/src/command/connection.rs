//! The connection and introspection commands that need no transaction: HELLO, CLIENT, CONFIG
//! and COMMAND (AUTH, QUIT, PING and the like are short enough to stay in the dispatch of
//! `command.rs`).

use super::parse::{parse_integer, unknown_subcommand};
use super::request::Request;
use super::table::{lookup, CommandSpec, COMMANDS};
use crate::codec::{Args, Frame, Protocol};

/// The configuration parameters `CONFIG GET` reports: those redis-benchmark asks for.
const CONFIG_PARAMETERS: &[(&str, &str)] = &[("save", ""), ("appendonly", "no")];

/// Redis accepts client names of printable ASCII without blanks.
fn valid_client_name(name: &[u8]) -> bool {
    name.iter().all(|byte| (b'!'..=b'~').contains(byte))
}

fn invalid_client_name() -> Frame {
    Frame::error("ERR Client names cannot contain spaces, newlines or special characters.")
}

/// `HELLO [protover [AUTH username password] [SETNAME clientname]]`.
pub(super) fn hello(args: &Args<'_>) -> Result<Request, Frame> {
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
pub(super) fn client(args: &Args<'_>) -> Result<Request, Frame> {
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
pub(super) fn config(args: &Args<'_>) -> Result<Frame, Frame> {
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
pub(super) fn command(args: &Args<'_>) -> Result<Frame, Frame> {
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
}
