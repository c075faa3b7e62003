//! The gateway's transport to the rampkv servers: the one client transport of `rampkv-net`
//! over TCP channels registered in the gateway's own poller, so that one thread waits for RESP
//! clients and servers in one `epoll`.
//!
//! The plain TCP medium owns a poller and blocks (after a short spin) in it; a gateway using it
//! must alternate between two pollers, and a RESP request that arrives while it waits for
//! servers waits too. This medium never blocks in the event loop: the loop waits for every
//! socket at once, hands the servers' readiness to the channels ([`SharedPollTransport::mark`])
//! and steps the driver, whose `poll` (zero timeout) then reads only the ready sockets.
//!
//! In a process that also runs the servers (`rampkv local`), the gateway skips the sockets: the
//! in-process transport hands each request to the server core directly and the gateway's waker
//! is the inbox wake-up of deferred (S2PL) replies.
//!
//! The one blocking wait is the HELLO at connect time, before the loop runs: it reads every
//! socket and sleeps between attempts (at most `BLOCKING_POLL_SLEEP` each) until a reply comes
//! or the timeout passes.

use std::sync::Arc;
use std::time::Duration;

use mio::{Registry, Token};

use rampkv_core::wire::{Request, Response};
use rampkv_net::message::tcp::TcpChannel;
use rampkv_net::message::{Channel, ChannelError, ClientMedium};
use rampkv_net::transport::local::LocalTransport;
use rampkv_net::transport::{ClientTransport, ServerEvent, Transport, TransportError};

/// Longest sleep between the attempts of a blocking poll (the HELLO at connect time).
const BLOCKING_POLL_SLEEP: Duration = Duration::from_millis(1);

/// Token of server `index` in the gateway's poller: far above the RESP connection slots.
pub(crate) fn server_token(index: usize) -> Token {
    Token(SERVER_TOKEN_BASE + index)
}

/// First token of the servers; RESP connections use the tokens below it.
pub(crate) const SERVER_TOKEN_BASE: usize = 1 << 40;

/// TCP channels registered in the gateway's poller.
#[derive(Debug)]
pub(crate) struct GatewayMedium {
    registry: Arc<Registry>,
}

impl ClientMedium for GatewayMedium {
    type Channel = TcpChannel;

    fn connect(&mut self, server: usize, address: &str) -> Result<TcpChannel, ChannelError> {
        TcpChannel::connect(address, Arc::clone(&self.registry), server_token(server))
    }

    /// Only the HELLO's blocking poll comes here (the loop's steps poll with a zero timeout):
    /// sleeps a little, then lets every socket be read.
    fn wait(&mut self, channels: &mut [Option<TcpChannel>], timeout: Option<Duration>) -> Result<bool, ChannelError> {
        std::thread::sleep(timeout.map_or(BLOCKING_POLL_SLEEP, |timeout| timeout.min(BLOCKING_POLL_SLEEP)));
        for channel in channels.iter_mut().flatten() {
            channel.set_ready(true, false, false);
        }
        Ok(false)
    }
}

/// The gateway's transport: sockets in its poller, or in-process calls.
#[derive(Debug)]
pub(crate) enum SharedPollTransport {
    Sockets { transport: Transport<GatewayMedium>, work: bool },
    InProcess(LocalTransport),
}

impl SharedPollTransport {
    /// Connects to every address (server i is `addresses[i]`), the sockets registered in
    /// `registry` under [`server_token`].
    pub(crate) fn connect(registry: &Registry, addresses: &[String]) -> Result<Self, TransportError> {
        let registry = registry.try_clone().map_err(|error| TransportError::Open(error.into()))?;
        let transport = Transport::with_medium(GatewayMedium { registry: Arc::new(registry) }, addresses)?;
        Ok(SharedPollTransport::Sockets { transport, work: false })
    }

    /// Records readiness of server `server`'s socket (called by the event loop).
    pub(crate) fn mark(&mut self, server: usize, readable: bool, writable: bool, finished: bool) {
        if let SharedPollTransport::Sockets { transport, work } = self {
            if let Some(channel) = transport.channel_mut(server) {
                channel.set_ready(readable, writable, finished);
                *work = true;
            }
        }
    }

    /// Marks every server's socket readable and writable: a driver connected on another thread
    /// (after a failover) whose sockets' events the loop took before it had the driver reads
    /// what they hold at its first step (a spurious mark costs one read that finds nothing).
    pub(crate) fn mark_all_ready(&mut self) {
        if let SharedPollTransport::Sockets { transport, work } = self {
            for server in 0..transport.server_count() {
                if let Some(channel) = transport.channel_mut(server) {
                    channel.set_ready(true, true, false);
                }
            }
            *work = true;
        }
    }

    /// True if a step of the driver has something to send or to read.
    pub(crate) fn work_pending(&self) -> bool {
        match self {
            SharedPollTransport::Sockets { work, .. } => *work,
            SharedPollTransport::InProcess(local) => local.has_replies(),
        }
    }
}

impl ClientTransport for SharedPollTransport {
    fn server_count(&self) -> usize {
        match self {
            SharedPollTransport::Sockets { transport, .. } => transport.server_count(),
            SharedPollTransport::InProcess(local) => local.server_count(),
        }
    }

    /// Queues the request; the next step of the driver sends it.
    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        match self {
            SharedPollTransport::Sockets { transport, work } => {
                *work = true;
                transport.post(server, request_id, request)
            }
            SharedPollTransport::InProcess(local) => local.post(server, request_id, request),
        }
    }

    fn post_owned(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        match self {
            SharedPollTransport::Sockets { .. } => self.post(server, request_id, &request),
            SharedPollTransport::InProcess(local) => local.post_owned(server, request_id, request),
        }
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        match self {
            SharedPollTransport::Sockets { transport, .. } => transport.flush(),
            SharedPollTransport::InProcess(local) => local.flush(),
        }
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        match self {
            SharedPollTransport::Sockets { transport, work } => {
                *work = false;
                transport.poll(timeout, deliver)
            }
            SharedPollTransport::InProcess(local) => local.poll(timeout, deliver),
        }
    }

    fn take_server_events(&mut self, events: &mut Vec<ServerEvent>) {
        if let SharedPollTransport::Sockets { transport, .. } = self {
            transport.take_server_events(events);
        }
    }

    fn reconnect_due(&mut self) {
        if let SharedPollTransport::Sockets { transport, .. } = self {
            transport.reconnect_due();
        }
    }

    fn disconnect(&mut self, server: usize) {
        if let SharedPollTransport::Sockets { transport, .. } = self {
            transport.disconnect(server);
        }
    }
}
