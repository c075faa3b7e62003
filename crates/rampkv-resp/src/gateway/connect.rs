//! Connecting the gateway's [`Driver`]: over TCP with its sockets in the loop's poller, or
//! into the servers of this process. Called by the loop (`driver`) and, off the loop, by the
//! follower (`follower`).

use std::sync::Arc;

use mio::Waker;

use super::config::InProcessServers;
use crate::transport::SharedPollTransport;
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_net::client::{ClientError, Driver};
use rampkv_net::transport::local::LocalTransport;

/// The gateway's driver: TCP with its sockets in the loop's poller, or calls in process.
pub(super) type GatewayDriver = Driver<SharedPollTransport>;

/// A driver whose server sockets are registered in `registry` (or that calls the servers of
/// this process, waking the loop through `waker` when a deferred reply comes).
pub(super) fn connect_driver(
    registry: &mio::Registry,
    waker: &Arc<Waker>,
    cluster: &Cluster,
    in_process: Option<&InProcessServers>,
    sessions: usize,
    options: TxnOptions,
) -> Result<GatewayDriver, ClientError> {
    let transport = match in_process {
        Some(servers) => {
            let wake = Arc::clone(waker) as Arc<dyn rampkv_net::message::Wake>;
            SharedPollTransport::InProcess(LocalTransport::new(&servers.groups, Some(wake)))
        }
        None => return connect_driver_to(registry, cluster, cluster.servers(), sessions, options),
    };
    let mut driver = Driver::connect(transport, cluster.clone(), sessions)?;
    driver.set_txn_options(options);
    Ok(driver)
}

/// A driver whose connection to server i goes to `routes[i]` (the cluster file's address, or
/// with failover the current primary of its partitions), its sockets registered in `registry`.
/// Blocks for the connects and the HELLOs (the follower calls it on its own thread).
pub(super) fn connect_driver_to(
    registry: &mio::Registry,
    cluster: &Cluster,
    routes: &[String],
    sessions: usize,
    options: TxnOptions,
) -> Result<GatewayDriver, ClientError> {
    let transport = SharedPollTransport::connect(registry, routes)?;
    let mut driver = Driver::connect(transport, cluster.clone(), sessions)?;
    driver.set_txn_options(options);
    Ok(driver)
}
