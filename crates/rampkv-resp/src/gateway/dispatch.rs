//! Command dispatch: what one command of a connection does ([`EventLoop::execute`]). MULTI,
//! EXEC, DISCARD and WATCH, and every command of a connection in MULTI, go to `multi` first.
//! Replies that need no transaction (PING, QUIT, AUTH, HELLO, INFO, CLIENT, ACL WHOAMI, errors)
//! are made here ([`EventLoop::local_reply`], which EXEC also runs for the queued ones) and
//! appended to the connection's output; GET, MGET, EXISTS, STRLEN, TYPE, TTL, PTTL, SET, MSET,
//! SETEX, PSETEX and SET with an expiry start a batch (`batch`); DEL and UNLINK read their keys,
//! then write a deletion of each (one write); INCR, SETNX, SET NX|XX|GET|KEEPTTL, GETSET, GETDEL,
//! APPEND, EXPIRE & co., PERSIST and GETEX are one single-key update each
//! (`command::conditional`, `command::expiry`); SCAN, KEYS and DBSIZE list or
//! count pages of the key space.
//!
//! # Contract
//! A connection runs one command at a time: `execute` is called only for a connection with
//! nothing pending, and either answers at once or starts one transaction (which may take the
//! commands buffered behind it: `batch`) whose completion answers it (`driver`); a transaction
//! that cannot start is answered at once with the error. A new command is one arm of `execute`
//! (or of `local_reply`), one entry in [`crate::command`]'s table, and its place in `multi`
//! (a read, a write, or a connection command).
//!
//! # Authentication
//! With users that need passwords ([`GatewayConfig::users`](super::GatewayConfig::users), `--requirepass` / `--aclfile`), a
//! connection starts unauthenticated: it may only run AUTH, HELLO and QUIT, and its requests are
//! parsed within Redis's limits for unauthenticated clients (10 arguments, 16 KiB bulk strings),
//! so an anonymous client cannot make the gateway buffer large requests or start transactions.
//! See [`crate::auth`]. A gateway that anyone could use refuses to start on an address other
//! than loopback (*Protected mode* in the gateway's module docs).

use ahash::AHashSet;

use super::event_loop::{Connection, EventLoop};
use super::input::TxnInput;
use super::replies::hello_reply;
use super::state::Pending;
use crate::auth::{self, Users};
use crate::codec::Frame;
use crate::command::{InfoSection, Request};
use crate::value;
use rampkv_core::protocol::ReadOutcome;
use rampkv_core::wire::Write;

impl EventLoop {
    /// Runs one command of connection `slot` (which has none pending).
    pub(super) fn execute(&mut self, slot: usize, request: Request) {
        debug_assert!(self.connections[slot].as_ref().is_some_and(|connection| connection.pending.is_none()));
        let Some(request) = self.transaction_control(slot, request) else {
            return; // MULTI, EXEC, DISCARD, WATCH, or queued (`multi`)
        };
        match request {
            Request::Get { .. }
            | Request::MultiGet { .. }
            | Request::Exists { .. }
            | Request::Strlen { .. }
            | Request::Type { .. }
            | Request::TimeToLive { .. } => self.begin_read_batch(slot, request),
            Request::Set { .. } | Request::MultiSet { .. } | Request::SetExpiring { .. } => {
                self.begin_write_batch(slot, request)
            }
            Request::Delete { keys } | Request::Unlink { keys } => self.begin_read(slot, keys, Pending::DeleteRead),
            Request::Scan(scan) => self.begin_scan(slot, scan),
            Request::Keys { pattern } => self.begin_keys(slot, &pattern),
            Request::DbSize => self.begin_count(slot, None),
            Request::Info(sections) if sections.contains(InfoSection::Keyspace) => {
                self.begin_count(slot, Some(sections))
            }
            Request::Update { key, op, reply, .. } => {
                self.begin_transaction(slot, TxnInput::Update(key, op), Pending::Update(reply));
            }
            request => {
                let reply = self.local_reply(slot, request);
                self.reply(slot, &reply);
            }
        }
    }

    /// Runs a command that needs no transaction (PING, AUTH, HELLO, INFO, CLIENT, QUIT, ...)
    /// for connection `slot`, now or at EXEC (`multi`): its reply.
    pub(super) fn local_reply(&mut self, slot: usize, request: Request) -> Frame {
        let connection = match request {
            // Inside MULTI: no count runs (`keyspace`).
            Request::Info(sections) => return Frame::Bulk(self.info_text(sections, None)),
            _ => self.connections[slot].as_mut().expect("running a command of an open connection"),
        };
        match request {
            Request::Reply(frame) => frame,
            Request::Quit => {
                connection.closing = true;
                Frame::simple("OK")
            }
            Request::Auth { user, password } => {
                if user.is_none() && !self.users.default_has_password() {
                    Frame::error(auth::AUTH_WITHOUT_PASSWORD_REPLY)
                } else {
                    let user = user.as_deref().unwrap_or(auth::DEFAULT_USER.as_bytes());
                    if connection.log_in(&self.users, user, &password) {
                        Frame::simple("OK")
                    } else {
                        Frame::error(auth::WRONGPASS_REPLY)
                    }
                }
            }
            Request::Hello { protocol, auth, name } => {
                if let Some((user, password)) = auth {
                    if !connection.log_in(&self.users, &user, &password) {
                        return Frame::error(auth::WRONGPASS_REPLY);
                    }
                }
                if !connection.permissions.authenticated() {
                    Frame::error(auth::HELLO_NOAUTH_REPLY)
                } else {
                    // The reply goes out in the protocol HELLO asked for.
                    connection.protocol = protocol.unwrap_or(connection.protocol);
                    connection.name = name.or(connection.name.take());
                    hello_reply(connection.protocol, connection.id)
                }
            }
            Request::ClientSetName(name) => {
                connection.name = if name.is_empty() { None } else { Some(name) };
                Frame::simple("OK")
            }
            Request::ClientGetName => connection.name.clone().map_or(Frame::Null, Frame::Bulk),
            Request::ClientId => Frame::Integer(i64::try_from(connection.id).unwrap_or(i64::MAX)),
            Request::AclWhoAmI => match connection.user {
                Some(user) => Frame::bulk(self.users.name(user)),
                None => Frame::error(auth::NOAUTH_REPLY), // not reached: ACL needs a login
            },
            other => {
                debug_assert!(false, "not a connection command: {other:?}");
                Frame::error("ERR internal error: not a connection command")
            }
        }
    }

    /// DEL's (and UNLINK's) second step: a deletion of every key in one write
    /// (`Write::delete`: a version that has already expired, which the servers reclaim); the
    /// reply counts the distinct keys that were present.
    pub(super) fn delete_present(&mut self, slot: usize, outcome: ReadOutcome) {
        let mut distinct = AHashSet::with_capacity(outcome.items.len());
        let mut removed = 0;
        for item in &outcome.items {
            if distinct.insert(&item.key[..]) && value::of_item(item).is_some() {
                removed += 1;
            }
        }
        let deletions = distinct.into_iter().map(|key| Write::delete(key.to_vec())).collect();
        self.begin_expiring_writes(slot, deletions, Pending::DeleteWrite { removed }, false);
        self.enqueue(slot);
    }
}

impl Connection {
    /// Logs the connection in as `user` if `password` is right; a failure changes nothing
    /// (an authenticated connection stays logged in as before, as in Redis).
    fn log_in(&mut self, users: &Users, user: &[u8], password: &[u8]) -> bool {
        let Some(id) = users.authenticate(user, password) else {
            return false;
        };
        self.user = Some(id);
        self.permissions = users.permissions(Some(id));
        true
    }
}
