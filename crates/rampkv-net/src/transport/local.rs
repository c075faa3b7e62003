//! The in-process transport: a client living in the same process as its servers hands each
//! request straight to the server core, on the client's own thread, and takes the typed reply
//! back. No socket, no ring, no frame, no second thread, no copy of the request (the driver
//! hands it over: `post_owned`); a read's reply is built from the stored versions as the client
//! would decode it ([`Reply::into_response`]).
//!
//! It is a front end of each server group it reaches: it registers an inbox with each group's
//! router, so S2PL works too: a lock granted later, by another front end or by this client's
//! own release, comes to the inbox as a typed reply and wakes the client's `poll`. Dropping the
//! transport closes its connections (its transactions release their locks).
//!
//! A server with a log (a data directory) holds the replies of a call that changed its store
//! until the log is durable up to the call's records, as the poller does: they wait in this
//! transport, and the log's wake-up (for front ends that hold replies) wakes `poll`.
//!
//! It serves deployments that put a client next to its partitions, such as the RESP gateway of
//! `rampkv local`, and the benchmark's `inprocess` row (the protocol's own CPU cost).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rampkv_core::protocol::server::{Addressed, Effects, LogPosition, Reply};
use rampkv_core::protocol::ConnectionId;
use rampkv_core::wire::{Request, Response};

use super::{ClientTransport, TransportError};
use crate::message::Wake;
use crate::server::router::{Inbox, Signal};
use crate::server::Servers;

/// Longest a `poll` with nothing to deliver sleeps before it looks again.
const POLL_SLEEP_MAX: Duration = Duration::from_millis(1);

/// One server as this client reaches it: its group, its index there, and the connection id
/// this client has with it.
#[derive(Debug)]
struct Route {
    group: usize,
    index: usize,
    connection: ConnectionId,
}

/// The replies of one call held until its server's log is durable up to `position`.
#[derive(Debug)]
struct Held {
    group: usize,
    index: usize,
    position: LogPosition,
    /// Its own reply (server, request id, response), if it has one yet.
    reply: Option<(usize, u64, Response)>,
    /// Deferred replies the call produced, routed once durable.
    deferred: Vec<Addressed>,
}

/// Direct calls into the server cores of this process.
#[derive(Debug)]
pub struct LocalTransport {
    /// The server groups, each with this client's inbox there.
    groups: Vec<(Arc<Servers>, Arc<Inbox>)>,
    /// Server i of the cluster.
    routes: Vec<Route>,
    replies: VecDeque<(usize, u64, Response)>,
    effects: Effects,
    routed: Vec<Addressed>,
    held: Vec<Held>,
    signal: Arc<Signal>,
}

impl LocalTransport {
    /// A transport to the servers of `groups`, in order (server i of the cluster is the i-th
    /// server counting through the groups). `wake` is how a deferred reply wakes the caller
    /// (`None`: this transport's own `poll` waits for it).
    pub fn new(groups: &[Arc<Servers>], wake: Option<Arc<dyn Wake>>) -> Self {
        let signal = Arc::new(Signal::default());
        let wake = wake.unwrap_or_else(|| Arc::clone(&signal) as Arc<dyn Wake>);
        let mut routes = Vec::new();
        let groups: Vec<(Arc<Servers>, Arc<Inbox>)> = groups
            .iter()
            .enumerate()
            .map(|(group, servers)| {
                let (front, inbox) = servers.router().register(Arc::clone(&wake));
                for index in 0..servers.served().len() {
                    routes.push(Route {
                        group,
                        index,
                        connection: ConnectionId { front, generation: 0, slot: index as u32 },
                    });
                }
                (Arc::clone(servers), inbox)
            })
            .collect();
        Self {
            groups,
            routes,
            replies: VecDeque::new(),
            effects: Effects::default(),
            routed: Vec::new(),
            held: Vec::new(),
            signal,
        }
    }

    /// True if replies wait to be polled.
    pub fn has_replies(&self) -> bool {
        !self.replies.is_empty()
            || self.groups.iter().any(|(_, inbox)| inbox.pending())
            || self.held.iter().any(|held| self.is_durable(held))
    }

    /// Has the logs of every group write what this client's calls appended (a log with nothing
    /// new costs two loads).
    fn flush_logs(&self) {
        for (group, (servers, _)) in self.groups.iter().enumerate() {
            let front = self.routes.iter().find(|route| route.group == group).map(|route| route.connection.front);
            servers.flush_logs(front);
        }
    }

    fn is_durable(&self, held: &Held) -> bool {
        held.position <= self.groups[held.group].0.durable_position(held.index)
    }

    /// Moves the held replies whose log position is durable to the replies to deliver (and
    /// routes their deferred replies).
    fn release_held(&mut self) {
        let mut index = 0;
        while index < self.held.len() {
            if !self.is_durable(&self.held[index]) {
                index += 1;
                continue;
            }
            let held = self.held.remove(index);
            self.replies.extend(held.reply);
            self.routed.extend(held.deferred);
            self.route(held.group);
        }
    }

    /// Queues the replies group `group` produced or routed for this client; hands the others to
    /// that group's router (front ids are per group).
    fn route(&mut self, group: usize) {
        for Addressed { connection, request_id, reply } in self.routed.drain(..) {
            let mine = self.routes.iter().position(|route| route.group == group && route.connection == connection);
            let servers = &self.groups[group].0;
            match mine {
                Some(server) => {
                    let served = &servers.served()[self.routes[server].index];
                    self.replies.push_back((server, request_id, reply.into_response(|key| served.locate(key))));
                }
                None => servers.router().route(Addressed { connection, request_id, reply }),
            }
        }
    }
}

impl ClientTransport for LocalTransport {
    fn server_count(&self) -> usize {
        self.routes.len()
    }

    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        self.post_owned(server, request_id, request.clone())
    }

    /// Serves `request` at once; its values move into the store without a copy.
    fn post_owned(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        let servers = self.routes.len();
        let route = self.routes.get(server).ok_or(TransportError::NoSuchServer { server, servers })?;
        let group = &self.groups[route.group].0;
        let served = &group.served()[route.index];
        let now = group.now_for(&request);
        let reply = served.serve(route.connection, request, request_id, now, &mut self.effects);
        let response = reply.map(|reply| match reply {
            Reply::Response(response) => response,
            reply => reply.into_response(|key| served.locate(key)),
        });
        if let Some(position) = self.effects.release_after {
            let deferred = std::mem::take(&mut self.effects.replies);
            let reply = response.map(|response| (server, request_id, response));
            self.held.push(Held { group: route.group, index: route.index, position, reply, deferred });
            return Ok(());
        }
        self.replies.extend(response.map(|response| (server, request_id, response)));
        let group = route.group;
        self.routed.append(&mut self.effects.replies);
        self.route(group);
        Ok(())
    }

    /// Every request was served when posted; what they logged is written now, as one group
    /// per log (`Servers::flush_logs`).
    fn flush(&mut self) -> Result<(), TransportError> {
        self.flush_logs();
        Ok(())
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        self.flush_logs(); // a caller that polls without flushing must not wait for ever
        for group in 0..self.groups.len() {
            self.groups[group].1.take(&mut self.routed);
            self.route(group);
        }
        self.release_held();
        for (group, (_, inbox)) in self.groups.iter().enumerate() {
            inbox.set_holding(self.held.iter().any(|held| held.group == group));
        }
        self.release_held(); // what became durable before the logs knew to wake this client
        if self.replies.is_empty() {
            // Only a deferred S2PL reply, or one held until its log is durable, can still
            // come: wait for the inbox's signal (a log's wake-up raises it too).
            if let Some(timeout) = timeout.filter(|timeout| !timeout.is_zero()) {
                self.signal.wait(timeout.min(POLL_SLEEP_MAX));
            }
            return Ok(0);
        }
        let delivered = self.replies.len();
        for (server, request_id, response) in self.replies.drain(..) {
            deliver(server, request_id, response);
        }
        Ok(delivered)
    }
}

impl Drop for LocalTransport {
    /// Closes this client's connections: its transactions release their locks, and the replies
    /// this unblocks for others are routed.
    fn drop(&mut self) {
        for route in &self.routes {
            let group = &self.groups[route.group].0;
            group.served()[route.index].core.connection_closed(route.connection, &mut self.effects);
            for reply in self.effects.replies.drain(..) {
                group.router().route(reply);
            }
        }
        for (group, (servers, _)) in self.groups.iter().enumerate() {
            if let Some(route) = self.routes.iter().find(|route| route.group == group) {
                servers.router().unregister(route.connection.front);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Driver, TxnResult};
    use rampkv_core::cluster::Cluster;
    use rampkv_core::protocol::server::ServerCore;

    #[test]
    fn a_driver_writes_and_reads_across_partitions_in_process() {
        let cores: Vec<Arc<ServerCore>> = (0..3).map(|_| Arc::new(ServerCore::new(1_000))).collect();
        let servers = Arc::new(Servers::new(cores.clone()));
        let cluster = Cluster::with_servers((0..3).map(|i| format!("local:{i}")).collect()).unwrap();
        let mut driver = Driver::connect(LocalTransport::new(&[servers], None), cluster, 1).unwrap();
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            (0..8).map(|i| (format!("key{i}").into_bytes(), format!("value{i}").into_bytes())).collect();
        let ts = driver.begin_write(0, pairs.clone()).unwrap();
        let mut completions = Vec::new();
        while completions.is_empty() {
            driver.step(Some(Duration::ZERO), &mut completions).unwrap();
        }
        assert!(matches!(completions[0].result, Ok(TxnResult::Write(_))));
        let partitions_written = cores.iter().filter(|core| core.store().stats().versions > 0).count();
        assert!(partitions_written > 1, "8 keys land on more than one of 3 partitions");
        completions.clear();
        driver.begin_read(0, pairs.iter().map(|(key, _)| key.clone()).collect()).unwrap();
        while completions.is_empty() {
            driver.step(Some(Duration::ZERO), &mut completions).unwrap();
        }
        let Ok(TxnResult::Read(outcome)) = &completions[0].result else { panic!("{:?}", completions[0].result) };
        for (item, (key, value)) in outcome.items.iter().zip(&pairs) {
            assert_eq!((&item.key, &item.value[..], item.ts), (key, &value[..], ts));
        }
    }
}
