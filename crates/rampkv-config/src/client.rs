//! Asking configuration-service nodes for the configuration: what a client does at start and
//! after a server answers that its epoch is stale, and what a restarting server does to learn
//! whether it bootstraps or rejoins.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::auth::PortAuthenticator;
use crate::configuration::{Configuration, ServerId};
use crate::core::StartMode;
use crate::error::ConfigError;
use crate::limits::CONFIG_CONNECT_TIMEOUT_MS;
use crate::wire::{encode_frame, read_frame, Message};

/// One node's answer.
#[derive(Debug, Clone)]
pub struct ConfigAnswer {
    pub configuration: Configuration,
    /// The Raft leader the node knows of.
    pub leader: Option<ServerId>,
    /// The node's Raft commit index, once it has known a leader since it started (0: the group
    /// has committed nothing it knows of in this run; a node restarted from its directory
    /// answers 0 until a leader is elected, so that a server restarting with the whole cluster
    /// is not taken for one that restarted alone into a running cluster).
    pub commit_index: u64,
}

/// Connects to the config port at `address` within `connect_timeout` and, with an
/// `authenticator`, proves the cluster's shared secret on it.
///
/// # Errors
/// Resolution and connection errors; [`ConfigError::Authentication`] when the step fails.
pub fn connect(
    address: &str,
    connect_timeout: Duration,
    authenticator: Option<&dyn PortAuthenticator>,
) -> Result<TcpStream, ConfigError> {
    let io = |action, error| ConfigError::Io { action, address: address.to_string(), error };
    let target = address
        .to_socket_addrs()
        .map_err(|error| io("resolving", error))?
        .next()
        .ok_or_else(|| io("resolving", std::io::Error::new(std::io::ErrorKind::NotFound, "no address")))?;
    let mut stream =
        TcpStream::connect_timeout(&target, connect_timeout).map_err(|error| io("connecting to", error))?;
    if let Some(authenticator) = authenticator {
        authenticator
            .prove(&mut stream)
            .map_err(|source| ConfigError::Authentication { peer: address.to_string(), source })?;
    }
    Ok(stream)
}

/// Asks one node at `address` for its configuration (`cluster_id` 0: any cluster), proving the
/// shared secret first when given an `authenticator` (the node's must match).
///
/// # Errors
/// Connection and socket errors, a refusal (wrong cluster, authentication required), a failed
/// authentication, a bad frame, a configuration of another cluster.
pub fn ask(
    address: &str,
    cluster_id: u64,
    timeout: Duration,
    authenticator: Option<&dyn PortAuthenticator>,
) -> Result<ConfigAnswer, ConfigError> {
    let io = |action, error| ConfigError::Io { action, address: address.to_string(), error };
    let mut stream = connect(address, timeout.min(Duration::from_millis(CONFIG_CONNECT_TIMEOUT_MS)), authenticator)?;
    stream.set_read_timeout(Some(timeout)).map_err(|error| io("configuring", error))?;
    stream.set_write_timeout(Some(timeout)).map_err(|error| io("configuring", error))?;
    let request = Message::ConfigRequest { cluster_id, known_epoch: 0 };
    stream.write_all(&encode_frame(&request)).map_err(|error| io("writing to", error))?;
    match read_frame(&mut stream, address)? {
        Some(Message::ConfigReply { leader, commit_index, configuration }) => {
            let configuration = Configuration::decode(&configuration)?;
            if cluster_id != 0 && configuration.cluster_id() != cluster_id {
                return Err(ConfigError::WrongCluster { expected: cluster_id, got: configuration.cluster_id() });
            }
            Ok(ConfigAnswer { configuration, leader, commit_index })
        }
        Some(Message::Refused { reason, .. }) => Err(ConfigError::Refused { address: address.to_string(), reason }),
        Some(_) => {
            Err(ConfigError::ProtocolViolation { peer: address.to_string(), problem: "not a configuration reply" })
        }
        None => Err(ConfigError::ProtocolViolation { peer: address.to_string(), problem: "closed without answering" }),
    }
}

/// The configuration of epoch `min_epoch` or newer from the first of `addresses` that has it
/// (a lagging node may not); otherwise the newest any of them gave.
///
/// # Errors
/// [`ConfigError::NoneAnswered`] when no address answered, with the last error.
pub fn fetch_configuration(
    addresses: &[String],
    cluster_id: u64,
    min_epoch: u64,
    timeout: Duration,
    authenticator: Option<&dyn PortAuthenticator>,
) -> Result<Configuration, ConfigError> {
    let mut newest: Option<Configuration> = None;
    let mut last = String::from("no address given");
    for address in addresses {
        match ask(address, cluster_id, timeout, authenticator) {
            Ok(answer) if answer.configuration.epoch() >= min_epoch => return Ok(answer.configuration),
            Ok(answer) => {
                if newest.as_ref().is_none_or(|newest| newest.epoch() < answer.configuration.epoch()) {
                    newest = Some(answer.configuration);
                }
            }
            Err(error) => last = error.to_string(),
        }
    }
    newest.ok_or(ConfigError::NoneAnswered { asked: addresses.len(), last })
}

/// Whether server `me` bootstraps the cluster of `initial` or rejoins it: it rejoins when any
/// other node answers that its group has committed something (the cluster is running and this
/// process restarted).
pub fn start_mode(
    initial: &Configuration,
    me: ServerId,
    timeout: Duration,
    authenticator: Option<&dyn PortAuthenticator>,
) -> StartMode {
    let running = initial.servers().iter().filter(|server| server.id != me).any(|server| {
        ask(&server.config_address, initial.cluster_id(), timeout, authenticator)
            .is_ok_and(|answer| answer.commit_index > 0)
    });
    if running {
        StartMode::Rejoin
    } else {
        StartMode::Bootstrap
    }
}
