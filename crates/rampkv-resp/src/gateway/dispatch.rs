//! Command dispatch: what one command of a connection does ([`EventLoop::execute`]). Replies
//! that need no transaction (PING, QUIT, AUTH, HELLO, INFO, CLIENT, ACL WHOAMI, errors) are
//! made here and appended to the connection's output; GET, MGET, EXISTS, SET and MSET start a
//! batch (`batch`), and so do TTL, PTTL, SETEX, PSETEX and SET with an expiry; DEL reads its
//! keys, then writes a deletion of each.
//!
//! # Contract
//! A connection runs one command at a time: `execute` is called only for a connection with
//! nothing pending, and either answers at once or starts one transaction (which may take the
//! commands buffered behind it: `batch`) whose completion answers it (`driver`); a transaction
//! that cannot start is answered at once with the error. A new command is one arm of `execute` (and one entry in
//! [`crate::command`]'s table).
//!
//! # Authentication
//! With users that need passwords ([`GatewayConfig::users`](super::GatewayConfig::users), `--requirepass` / `--aclfile`), a
//! connection starts unauthenticated: it may only run AUTH, HELLO and QUIT, and its requests are
//! parsed within Redis's limits for unauthenticated clients (10 arguments, 16 KiB bulk strings),
//! so an anonymous client cannot make the gateway buffer large requests or start transactions.
//! See [`crate::auth`]. A gateway that anyone could use refuses to start on an address other
//! than loopback (*Protected mode* in the gateway's module docs).

use ahash::AHashSet;

use super::batch::Pending;
use super::event_loop::{Connection, EventLoop};
use super::replies::{hello_reply, info_text};
use crate::auth::{self, Users};
use crate::codec::Frame;
use crate::command::Request;
use crate::value;
use rampkv_core::protocol::ReadOutcome;
use rampkv_core::wire::Write;

impl EventLoop {
    /// Runs one command of connection `slot` (which has none pending).
    pub(super) fn execute(&mut self, slot: usize, request: Request) {
        let connected = self.connections.len() - self.free_slots.len();
        let connection = self.connections[slot].as_mut().expect("executing for an open connection");
        debug_assert!(connection.pending.is_none());
        let reply = match request {
            Request::Get { .. } | Request::MultiGet { .. } | Request::Exists { .. } => {
                return self.begin_read_batch(slot, request)
            }
            Request::Set { .. } | Request::MultiSet { .. } => return self.begin_write_batch(slot, request),
            Request::SetExpiring { .. } => return self.begin_write_batch(slot, request),
            Request::TimeToLive { .. } => return self.begin_read_batch(slot, request),
            Request::Delete { keys } => return self.begin_read(slot, keys, Pending::DeleteRead),
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
                        let protocol = connection.protocol;
                        return connection
                            .outgoing
                            .append(|out| Frame::error(auth::WRONGPASS_REPLY).encode(protocol, out));
                    }
                }
                if !connection.permissions.authenticated() {
                    Frame::error(auth::HELLO_NOAUTH_REPLY)
                } else {
                    // The reply is already in the protocol HELLO asked for.
                    connection.protocol = protocol.unwrap_or(connection.protocol);
                    connection.name = name.or(connection.name.take());
                    hello_reply(connection.protocol, connection.id)
                }
            }
            Request::Info => Frame::Bulk(info_text(&self.stats, connected)),
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
        };
        let protocol = connection.protocol;
        connection.outgoing.append(|out| reply.encode(protocol, out));
    }

    /// DEL's second step: a deletion of every key in one write (`Write::delete`: a version that
    /// has already expired, which the servers reclaim); the reply counts the distinct keys that
    /// were present.
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
