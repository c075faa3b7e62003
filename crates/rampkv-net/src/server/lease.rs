//! The lease gate (issue 16): the partitions a server may serve now, by its configuration
//! node's leases ([`LeaseGate`]), how a bootstrapping server's wait for its first lease ends,
//! and the host clock the node's leases are measured with. Below both `failover` (which moves
//! the gate as configurations change) and `resume` (which builds it at start); public under
//! `server::failover`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rampkv_config::configuration::ServerId;
use rampkv_config::node::ConfigNode;
use rampkv_config::timing::Clock;
use rampkv_core::cluster::Cluster;
use rampkv_core::protocol::server::PartitionGate;

/// The partitions a server may serve now: those its configuration node says it holds a valid
/// lease for, whose data it has (its own, or an adopted copy whose takeover finished).
pub struct LeaseGate {
    pub(super) node: Arc<ConfigNode>,
    /// The cluster-file owner of every partition.
    owners: Vec<u16>,
    /// Per partition: its data is in this server's store (its own from the start, or adopted).
    pub(super) ready: Vec<AtomicBool>,
}

impl std::fmt::Debug for LeaseGate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LeaseGate").field("owners", &self.owners.len()).finish()
    }
}

impl LeaseGate {
    /// The gate of server `me` of `cluster`, over its configuration node. `holds(partition)`:
    /// its store holds the partition's data (its own from the start, or kept in its data
    /// directory: [`super::resume`]; a rejoining process holds nothing).
    pub fn new(node: Arc<ConfigNode>, cluster: &Cluster, holds: impl Fn(u32) -> bool) -> LeaseGate {
        let owners: Vec<u16> = (0..cluster.partition_count())
            .map(|partition| cluster.owner_of_partition(partition).map_or(u16::MAX, |owner| owner as u16))
            .collect();
        let ready = (0..owners.len() as u32).map(|partition| AtomicBool::new(holds(partition))).collect();
        LeaseGate { node, owners, ready }
    }

    /// The configuration node behind the gate.
    pub fn node(&self) -> &Arc<ConfigNode> {
        &self.node
    }
}

/// How a bootstrapping server's wait for its first lease ended ([`LeaseGate::wait_for_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstLease {
    /// It holds a lease for every partition its cluster file gives it.
    Held,
    /// The cluster failed it over before it got one (it started too late): it serves nothing,
    /// as a restarted server.
    FailedOver,
    /// Neither within the timeout (no majority of the servers is up).
    TimedOut,
}

impl LeaseGate {
    /// Waits until this server holds a lease for every partition its cluster file gives it
    /// (the configuration service elected a leader and granted it), or the configuration names
    /// another primary for one of them, or `timeout` passes.
    pub fn wait_for_lease(&self, me: usize, timeout: Duration) -> FirstLease {
        let deadline = std::time::Instant::now() + timeout;
        let own: Vec<u32> =
            (0..self.owners.len() as u32).filter(|p| usize::from(self.owners[*p as usize]) == me).collect();
        while std::time::Instant::now() < deadline {
            if own.iter().all(|partition| self.serves(*partition)) {
                return FirstLease::Held;
            }
            let configuration = self.node.configuration();
            if own.iter().any(|partition| configuration.primary_of(*partition) != Some(me as ServerId)) {
                return FirstLease::FailedOver;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        FirstLease::TimedOut
    }
}

impl PartitionGate for LeaseGate {
    fn serves(&self, partition: u32) -> bool {
        let ready = self.ready.get(partition as usize).is_some_and(|ready| ready.load(Ordering::Acquire));
        ready && self.node.lease_valid(partition)
    }
}

/// The subdirectory of a server's data directory where its configuration node keeps its Raft
/// state (`rampkv_config::disk`).
pub const CONFIG_STATE_DIR: &str = "config";

/// The node's clock: the host's monotonic clock (`rampkv_fabric::clock`), so that the lease
/// end it computes is a time the clients of this host can compare with their own reading (the
/// lease word of the item region, GET\*).
#[derive(Debug)]
pub(crate) struct HostClock;

impl Clock for HostClock {
    fn now_ns(&self) -> u64 {
        rampkv_fabric::clock::monotonic_ns()
    }
}
