//! The RESP gateway: RESP connections on one side, one rampkv
//! [`Driver`](rampkv_net::client::Driver) on the other, all on one thread.
//!
//! # Contract
//! Each RESP connection owns one driver session for its lifetime and runs one transaction at a
//! time, so pipelined commands are answered in order and each sees the writes of those before
//! it; consecutive pipelined reads (or writes) may run as one transaction. Bad input from a
//! client (malformed RESP, a client that does not read, too many bytes held) costs that
//! connection, never the gateway; a server that fails costs the commands that need its
//! partitions (with replication: waits for the failover, within one bound: `failover`);
//! everything the gateway holds is bounded ([`crate::GATEWAY_SESSIONS_MAX`],
//! [`crate::GATEWAY_BUFFERED_BYTES_MAX`], ...). Each room (# Layout) states its part in full.
//!
//! # Layout
//! Bottom up: what the loop holds first, then the loop, then the rooms that act on it (each
//! adds its part of `EventLoop`'s methods); a module names only those listed before it.
//! - `limits`: the gateway's bounds (public here: [`BATCH_COMMANDS_MAX`] and the others).
//! - `config`: [`GatewayConfig`], [`InProcessServers`], [`GatewayError`].
//! - `connect`: connecting the driver (over TCP in the loop's poller, or in process).
//! - `input`: a transaction's input, kept to run it again after a failover, and its retry.
//! - `plan`: one read command of a batch, and an EXEC's plan (its transaction, its replies).
//! - `state`: what a connection waits on (a batch, a DEL, an EXEC, a listing ...) and its
//!   queue between MULTI and EXEC.
//! - `follower`: with replication, the thread that learns the current primaries and connects
//!   new drivers off the loop.
//! - `event_loop`: the loop and its connections: accepting, reading, writing and closing them,
//!   the session pool, the buffer budget and the idle timeout (*Sessions*, *Waiting*, *Fault
//!   model* of the connections).
//! - `replies`: reply writers: errors, read commands' replies, HELLO's map.
//! - `batch`: pipelines: the consecutive reads or writes that join one transaction, and what
//!   a connection waits on (*Pipelines*).
//! - `keyspace`: SCAN, KEYS, DBSIZE and INFO's key count, over the servers' key listing.
//! - `dispatch`: what one command does (`EventLoop::execute`): a reply made in place (PING,
//!   AUTH, HELLO, INFO, CLIENT ...) or a transaction started; DEL's two steps. A new command
//!   goes here (*Authentication*).
//! - `multi`: MULTI / EXEC / DISCARD / WATCH: a connection's queue and its EXEC as one RAMP
//!   transaction, read-only or write-only.
//! - `failover`: with replication, following the configuration: the commands that wait
//!   through a failover and run again, the drivers the follower brings swapped in, and the
//!   one bound past which they are answered `-TRYAGAIN` / `-CLUSTERDOWN`.
//! - `driver`: the cluster side: stepping and reconnecting the driver, starting and answering
//!   transactions, failing the commands of a broken driver (*Fault model* of the cluster).
//! - `info`: INFO's sections, from the gateway, its cluster file and in-process servers.
//! - this module: [`Gateway`] (start, wait, stop) and protected mode.
//!
//! # Protected mode
//! A gateway that anyone could use (no password for `default`) refuses to listen on an address
//! other than loopback unless protected mode is off ([`GatewayConfig::protected_mode`], Redis's
//! `protected-mode`); [`Gateway::spawn`] checks it before anything listens.

mod batch;
mod config;
mod connect;
mod dispatch;
mod driver;
mod event_loop;
mod failover;
mod follower;
mod info;
mod input;
mod keyspace;
mod limits;
mod multi;
mod plan;
mod replies;
mod state;

pub use config::{GatewayConfig, GatewayError, InProcessServers};
pub use limits::{
    BATCH_COMMANDS_MAX, INFO_PARTITION_LINES_MAX, IN_FLIGHT_POLL_TIMEOUT, MULTI_QUEUED_BYTES_MAX,
    MULTI_QUEUED_COMMANDS_MAX, RECONNECT_INTERVAL, WRITE_BATCH_KEYS_MAX,
};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use mio::net::TcpListener;
use mio::{Interest, Poll, Waker};

use super::GATEWAY_SESSIONS_MAX;
use connect::{connect_driver, connect_driver_to};
use event_loop::{EventLoop, LISTENER_TOKEN, WAKER_TOKEN};
use follower::{follows_configuration, Follower, FollowerSetup};
use rampkv_core::cluster::Cluster;
use rampkv_net::client::{connect_within_failover_bound, current_addresses};

/// A running gateway. Dropping it stops it.
#[derive(Debug)]
pub struct Gateway {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<Result<(), GatewayError>>>,
}

impl Gateway {
    /// Connects a driver to `cluster` (which must be up; with replication, to its current
    /// primaries, tried again within the failover bound, and starts the follower: `failover`),
    /// binds the listener, and starts the event loop thread.
    pub fn spawn(cluster: &Cluster, config: &GatewayConfig) -> Result<Gateway, GatewayError> {
        if let Some(refusal) = config.protected_mode_refusal() {
            return Err(refusal);
        }
        if !(1..=GATEWAY_SESSIONS_MAX).contains(&config.sessions) {
            return Err(GatewayError::Sessions { sessions: config.sessions });
        }
        if let Some(servers) = &config.in_process {
            let count = servers.groups.iter().map(|group| group.served().len()).sum::<usize>();
            if count != cluster.servers().len() {
                return Err(GatewayError::InProcessServers { count, servers: cluster.servers().len() });
            }
        }
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let in_process = config.in_process.as_ref();
        let (sessions, options) = (config.sessions, config.txn_options);
        let (driver, follower) = if follows_configuration(cluster, in_process.is_some()) {
            // The current primaries, tried again within the failover bound as a Client's connect.
            let (driver, routes) = connect_within_failover_bound(cluster, || {
                let routes = current_addresses(cluster)?;
                Ok((connect_driver_to(poll.registry(), cluster, &routes, sessions, options)?, routes))
            })?;
            let registry = poll.registry().try_clone()?;
            let setup =
                FollowerSetup { registry, waker: Arc::clone(&waker), cluster: cluster.clone(), sessions, options };
            (driver, Some(Follower::spawn(setup, routes)?))
        } else {
            (connect_driver(poll.registry(), &waker, cluster, in_process, sessions, options)?, None)
        };
        let mut listener = TcpListener::bind(config.listen)?;
        poll.registry().register(&mut listener, LISTENER_TOKEN, Interest::READABLE)?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let event_loop = EventLoop::new(
            poll,
            listener,
            Arc::clone(&stop),
            (cluster.clone(), config.in_process.clone()),
            (driver, follower, Arc::clone(&waker)),
            (address.port(), Arc::clone(&config.users), config.idle_timeout),
            config.buffered_bytes_max,
        );
        // The gateway copies values out of requests, and its in-process servers let go of the
        // values those supersede: one thread, so the buffers go round (`rampkv_core::spare`).
        let thread = std::thread::Builder::new().name("rampkv-gateway".into()).spawn(move || {
            rampkv_core::spare::keep_on_this_thread();
            event_loop.run()
        })?;
        Ok(Gateway { address, stop, waker, thread: Some(thread) })
    }

    /// The bound address of the RESP listener.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops the event loop and waits for it; returns its result.
    pub fn shutdown(mut self) -> Result<(), GatewayError> {
        self.stop_and_join()
    }

    /// Blocks until the event loop ends (only on an I/O error of its poller).
    pub fn wait(mut self) -> Result<(), GatewayError> {
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("gateway thread panicked").into()))
            }
            None => Ok(()),
        }
    }

    fn stop_and_join(&mut self) -> Result<(), GatewayError> {
        self.stop.store(true, Ordering::Release);
        self.waker.wake()?;
        match self.thread.take() {
            Some(thread) => {
                thread.join().unwrap_or_else(|_| Err(std::io::Error::other("gateway thread panicked").into()))
            }
            None => Ok(()),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}
