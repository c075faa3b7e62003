//! Cluster membership and key routing.
//!
//! # Partitioning
//! A key belongs to partition `fnv1a64(key) % partitions` ([`key_hash`]: FNV-1a, 64-bit, offset
//! basis 0xcbf29ce484222325, prime 0x100000001b3, over the key bytes), and each partition to
//! exactly one server. This hash is part of the on-disk contract of cluster files: changing it
//! moves keys.
//!
//! # Cluster file (TOML)
//! ```toml
//! partitions = 8                  # optional; default: one partition per server
//! [[servers]]
//! address = "127.0.0.1:7001"
//! partitions = [0, 2, 4, 6]       # optional; default: partition p goes to server p % servers
//! [[servers]]
//! address = "127.0.0.1:7002"
//! partitions = [1, 3, 5, 7]
//! ring = "127.0.0.1:7102"         # optional: control address of the ring front end
//! config = "127.0.0.1:7202"       # optional: address of its configuration service (replication)
//! replicate = "127.0.0.1:7302"    # optional: its replication port (replication between processes)
//! ```
//! Either every server lists its partitions or none does; every partition must be owned by
//! exactly one server; a server (or a control address) may appear only once. Any other shape is
//! refused with an error naming the problem: a wrong cluster file must not route keys to a
//! server that does not own them (it would answer "never written" for keys it lacks).
//!
//! # Replication
//! `replicas = N` (top level, default 1) asks for every partition on N distinct servers: its
//! owner above is the first primary, and the configuration service (crate `rampkv-config`)
//! places the N - 1 backups. A file asking for more replicas than it has servers is refused.
//! With N > 1 every server needs a `config` address: the port of the configuration service
//! (an embedded Raft group among the servers) that holds who is primary in which epoch; and
//! `rampkv server` processes need a `replicate` address each: the port where a server receives
//! its primaries' records (embedded clusters pick their own).
//!
//! `address` is the server's TCP port. The optional `ring` and `rfrpc` are the control
//! addresses of its one-sided front ends (`rampkv server --ring-listen` / `--rfrpc-listen`):
//! `ring` serves the write-poll family (`writepoll`, `sendrecv`, `onesided`), `rfrpc` serves
//! remote-fetch RPC. A client of those transports needs the address of every server.

use std::path::Path;

use serde::Deserialize;

use crate::limits::{CLUSTER_PARTITIONS_MAX, CLUSTER_REPLICAS_MAX, CLUSTER_SERVERS_MAX};

/// FNV-1a 64-bit hash of a key: the stable partitioning hash.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Why a cluster description was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("cannot read cluster file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    /// The file is not TOML of the cluster file's shape (the parser's words).
    #[error("cluster file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("invalid cluster: {0}")]
    Invalid(#[from] InvalidCluster),
    /// Two server entries name the same address (compared as socket addresses where they
    /// parse as such, else as text ignoring letter case).
    #[error("server {address} is listed twice (entries {first} and {second}, counting from 0)")]
    DuplicateServer { address: String, first: usize, second: usize },
    /// Two servers give the same control address for a one-sided front end.
    #[error("{front} address {address} is listed for two servers ({first} and {second})")]
    DuplicateFrontAddress { front: &'static str, address: String, first: String, second: String },
    #[error("partition {partition} is listed twice: by server {first} and by server {second}")]
    PartitionListedTwice { partition: u32, first: String, second: String },
    #[error("partition {partition} is owned by no server (every partition 0..{partitions} needs one)")]
    PartitionUnowned { partition: u32, partitions: u32 },
    #[error("server {server} lists partition {partition}, but there are only {partitions}")]
    PartitionOutOfRange { server: String, partition: u32, partitions: u32 },
    /// A cluster file that parsed but describes no valid cluster.
    #[error("cluster file {path} is not valid: {source}")]
    InFile { path: String, source: Box<ClusterError> },
}

/// What is wrong with a cluster description.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidCluster {
    #[error("need 1..={CLUSTER_SERVERS_MAX} servers, got {count}")]
    ServerCount { count: usize },
    #[error("need 1..={CLUSTER_PARTITIONS_MAX} partitions, got {count}")]
    PartitionCount { count: u32 },
    /// `what`: "server", "ring" or "rfrpc".
    #[error("{what} address {address:?} is not HOST:PORT")]
    Address { what: &'static str, address: String },
    #[error("either every server lists its partitions or none does")]
    SomeListsMissing,
    #[error("{count} {front} addresses for {servers} servers", front = front.key())]
    FrontCount { front: Front, count: usize, servers: usize },
    #[error(
        "server {server} has no `{key}` control address: start it with `rampkv server {flag} ADDR` and add \
         `{key} = \"ADDR\"` to its [[servers]] entry",
        key = front.key(),
        flag = front.flag()
    )]
    NoFrontAddress { server: String, front: Front },
    #[error("need 1..={CLUSTER_REPLICAS_MAX} replicas, got {replicas}")]
    ReplicaCount { replicas: u32 },
    #[error("{replicas} replicas need at least {replicas} servers, the cluster has {servers}")]
    TooFewServersForReplicas { replicas: u32, servers: usize },
    #[error("{count} config addresses for {servers} servers")]
    ConfigCount { count: usize, servers: usize },
    #[error("server {server} has no `config` address: add `config = \"ADDR\"` to its [[servers]] entry")]
    NoConfigAddress { server: String },
    #[error("{count} replicate addresses for {servers} servers")]
    ReplicateCount { count: usize, servers: usize },
    #[error(
        "server {server} has no `replicate` address (the file asks for {replicas} replicas): add \
         `replicate = \"ADDR\"` to its [[servers]] entry"
    )]
    NoReplicateAddress { server: String, replicas: u32 },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    partitions: Option<u32>,
    replicas: Option<u32>,
    servers: Vec<ServerEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerEntry {
    address: String,
    partitions: Option<Vec<u32>>,
    ring: Option<String>,
    rfrpc: Option<String>,
    config: Option<String>,
    replicate: Option<String>,
}

/// A server's one-sided front end, reached through a control address of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// The write-poll ring front end: `writepoll`, `sendrecv` and `onesided` clients.
    Ring,
    /// The remote-fetch RPC front end: `rfrpc` clients.
    RfRpc,
}

impl Front {
    /// The key naming it in a cluster file.
    pub fn key(self) -> &'static str {
        match self {
            Front::Ring => "ring",
            Front::RfRpc => "rfrpc",
        }
    }

    /// The `rampkv server` flag that starts it.
    pub fn flag(self) -> &'static str {
        match self {
            Front::Ring => "--ring-listen",
            Front::RfRpc => "--rfrpc-listen",
        }
    }
}

/// A validated cluster: server addresses, the owner of every partition, and the control
/// addresses of the servers' one-sided front ends where known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    servers: Vec<String>,
    partition_owner: Vec<u16>,
    ring: Vec<Option<String>>,
    rfrpc: Vec<Option<String>>,
    /// Copies of every partition (1 = no replication).
    replicas: u32,
    /// Per server: the address of its configuration service, where known.
    config: Vec<Option<String>>,
    /// Per server: its replication port, where known.
    replicate: Vec<Option<String>>,
}

impl Cluster {
    /// A cluster of `addresses` with one partition per server.
    pub fn with_servers(addresses: Vec<String>) -> Result<Cluster, ClusterError> {
        let partitions = u32::try_from(addresses.len()).unwrap_or(u32::MAX);
        Self::build(addresses, partitions, None)
    }

    /// Reads and validates a cluster file.
    pub fn from_file(path: &Path) -> Result<Cluster, ClusterError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| ClusterError::Read { path: shown.clone(), error })?;
        Self::from_toml(&text).map_err(|error| match error {
            ClusterError::Parse { message, .. } => ClusterError::Parse { path: shown, message },
            other => ClusterError::InFile { path: shown, source: Box::new(other) },
        })
    }

    /// Parses and validates the text of a cluster file.
    pub fn from_toml(text: &str) -> Result<Cluster, ClusterError> {
        let file: ClusterFile = toml::from_str(text)
            .map_err(|error| ClusterError::Parse { path: "<text>".into(), message: error.to_string() })?;
        let partitions = file.partitions.unwrap_or(file.servers.len() as u32);
        let listed: Vec<Option<Vec<u32>>> = file.servers.iter().map(|s| s.partitions.clone()).collect();
        let ring: Vec<Option<String>> = file.servers.iter().map(|s| s.ring.clone()).collect();
        let rfrpc: Vec<Option<String>> = file.servers.iter().map(|s| s.rfrpc.clone()).collect();
        let config: Vec<Option<String>> = file.servers.iter().map(|s| s.config.clone()).collect();
        let replicate: Vec<Option<String>> = file.servers.iter().map(|s| s.replicate.clone()).collect();
        let addresses = file.servers.into_iter().map(|server| server.address).collect();
        let assignment = match listed.iter().filter(|list| list.is_some()).count() {
            0 => None,
            count if count == listed.len() => Some(listed.into_iter().flatten().collect()),
            _ => return Err(InvalidCluster::SomeListsMissing.into()),
        };
        let mut cluster = Self::build(addresses, partitions, assignment)?;
        cluster.set_fronts(Front::Ring, ring)?;
        cluster.set_fronts(Front::RfRpc, rfrpc)?;
        cluster = cluster.with_replicas(file.replicas.unwrap_or(1))?;
        for address in config.iter().flatten() {
            validate_address("config", address)?;
        }
        cluster.config = config;
        for address in replicate.iter().flatten() {
            validate_address("replicate", address)?;
        }
        cluster.replicate = replicate;
        Ok(cluster)
    }

    /// This cluster with every partition on `replicas` distinct servers.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] when `replicas` is 0, above `CLUSTER_REPLICAS_MAX`, or above the
    /// number of servers (each copy of a partition needs a server of its own).
    pub fn with_replicas(mut self, replicas: u32) -> Result<Cluster, ClusterError> {
        if replicas == 0 || replicas > CLUSTER_REPLICAS_MAX {
            return Err(InvalidCluster::ReplicaCount { replicas }.into());
        }
        if replicas as usize > self.servers.len() {
            return Err(InvalidCluster::TooFewServersForReplicas { replicas, servers: self.servers.len() }.into());
        }
        self.replicas = replicas;
        Ok(self)
    }

    /// Copies of every partition (1 = no replication).
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// This cluster with the configuration-service address of every server (in server order).
    pub fn with_config_addresses(mut self, addresses: Vec<String>) -> Result<Cluster, ClusterError> {
        if addresses.len() != self.servers.len() {
            return Err(InvalidCluster::ConfigCount { count: addresses.len(), servers: self.servers.len() }.into());
        }
        for address in &addresses {
            validate_address("config", address)?;
        }
        self.config = addresses.into_iter().map(Some).collect();
        Ok(self)
    }

    /// The configuration-service address of every server, in server order.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] naming the first server without one.
    pub fn config_addresses(&self) -> Result<Vec<String>, ClusterError> {
        self.servers
            .iter()
            .zip(&self.config)
            .map(|(server, address)| {
                address.clone().ok_or_else(|| InvalidCluster::NoConfigAddress { server: server.clone() }.into())
            })
            .collect()
    }

    /// This cluster with the replication port of every server (in server order).
    pub fn with_replicate_addresses(mut self, addresses: Vec<String>) -> Result<Cluster, ClusterError> {
        if addresses.len() != self.servers.len() {
            return Err(InvalidCluster::ReplicateCount { count: addresses.len(), servers: self.servers.len() }.into());
        }
        for address in &addresses {
            validate_address("replicate", address)?;
        }
        self.replicate = addresses.into_iter().map(Some).collect();
        Ok(self)
    }

    /// The replication port of every server, in server order.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] naming the first server without one.
    pub fn replicate_addresses(&self) -> Result<Vec<String>, ClusterError> {
        let replicas = self.replicas;
        self.servers
            .iter()
            .zip(&self.replicate)
            .map(|(server, address)| {
                address
                    .clone()
                    .ok_or_else(|| InvalidCluster::NoReplicateAddress { server: server.clone(), replicas }.into())
            })
            .collect()
    }

    /// The server (index into [`Cluster::servers`]) the cluster file gives `partition`: its
    /// only copy without replication, its first primary with. `None` past the last partition.
    pub fn owner_of_partition(&self, partition: u32) -> Option<usize> {
        self.partition_owner.get(partition as usize).map(|owner| usize::from(*owner))
    }

    /// The partitions the cluster file gives `server` (those it is the owner of), in order.
    pub fn partitions_of(&self, server: usize) -> impl Iterator<Item = u32> + '_ {
        (0..self.partition_count()).filter(move |partition| self.owner_of_partition(*partition) == Some(server))
    }

    /// This cluster with the control addresses of every server's `front` (in server order).
    pub fn with_fronts(mut self, front: Front, addresses: Vec<String>) -> Result<Cluster, ClusterError> {
        if addresses.len() != self.servers.len() {
            return Err(
                InvalidCluster::FrontCount { front, count: addresses.len(), servers: self.servers.len() }.into()
            );
        }
        self.set_fronts(front, addresses.into_iter().map(Some).collect())?;
        Ok(self)
    }

    fn set_fronts(&mut self, front: Front, addresses: Vec<Option<String>>) -> Result<(), ClusterError> {
        for address in addresses.iter().flatten() {
            validate_address(front.key(), address)?;
        }
        let listed: Vec<(usize, &str)> =
            addresses.iter().enumerate().filter_map(|(server, address)| Some((server, address.as_deref()?))).collect();
        if let Some((i, j)) = first_duplicate(listed.iter().map(|&(_, address)| address)) {
            let ((first, _), (second, address)) = (listed[i], listed[j]);
            return Err(ClusterError::DuplicateFrontAddress {
                front: front.key(),
                address: address.to_owned(),
                first: self.servers[first].clone(),
                second: self.servers[second].clone(),
            });
        }
        match front {
            Front::Ring => self.ring = addresses,
            Front::RfRpc => self.rfrpc = addresses,
        }
        Ok(())
    }

    /// The control addresses of every server's `front`, in server order.
    ///
    /// # Errors
    /// [`ClusterError::Invalid`] naming the first server without one, and how to give it one.
    pub fn front_addresses(&self, front: Front) -> Result<Vec<String>, ClusterError> {
        let listed = match front {
            Front::Ring => &self.ring,
            Front::RfRpc => &self.rfrpc,
        };
        self.servers
            .iter()
            .zip(listed)
            .map(|(server, address)| {
                address.clone().ok_or_else(|| InvalidCluster::NoFrontAddress { server: server.clone(), front }.into())
            })
            .collect()
    }

    fn build(
        servers: Vec<String>,
        partitions: u32,
        assignment: Option<Vec<Vec<u32>>>,
    ) -> Result<Cluster, ClusterError> {
        let invalid = |invalid: InvalidCluster| Err(ClusterError::Invalid(invalid));
        if servers.is_empty() || servers.len() > CLUSTER_SERVERS_MAX {
            return invalid(InvalidCluster::ServerCount { count: servers.len() });
        }
        if partitions == 0 || partitions > CLUSTER_PARTITIONS_MAX {
            return invalid(InvalidCluster::PartitionCount { count: partitions });
        }
        for address in &servers {
            validate_address("server", address)?;
        }
        if let Some((first, second)) = first_duplicate(servers.iter().map(String::as_str)) {
            return Err(ClusterError::DuplicateServer { address: servers[second].clone(), first, second });
        }
        let mut partition_owner = vec![u16::MAX; partitions as usize];
        match assignment {
            None => {
                for (partition, owner) in partition_owner.iter_mut().enumerate() {
                    *owner = (partition % servers.len()) as u16;
                }
            }
            Some(lists) => {
                for (server, list) in lists.iter().enumerate() {
                    for &partition in list {
                        let Some(owner) = partition_owner.get_mut(partition as usize) else {
                            return Err(ClusterError::PartitionOutOfRange {
                                server: servers[server].clone(),
                                partition,
                                partitions,
                            });
                        };
                        if *owner != u16::MAX {
                            return Err(ClusterError::PartitionListedTwice {
                                partition,
                                first: servers[usize::from(*owner)].clone(),
                                second: servers[server].clone(),
                            });
                        }
                        *owner = server as u16;
                    }
                }
                if let Some(missing) = partition_owner.iter().position(|owner| *owner == u16::MAX) {
                    return Err(ClusterError::PartitionUnowned { partition: missing as u32, partitions });
                }
            }
        }
        let unknown = vec![None; servers.len()];
        Ok(Cluster {
            servers,
            partition_owner,
            ring: unknown.clone(),
            rfrpc: unknown.clone(),
            replicas: 1,
            config: unknown.clone(),
            replicate: unknown,
        })
    }

    /// Server addresses, indexed by server number.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// Number of partitions.
    pub fn partition_count(&self) -> u32 {
        self.partition_owner.len() as u32
    }

    /// The partition of `key`.
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        (key_hash(key) % self.partition_owner.len() as u64) as u32
    }

    /// The server (index into [`Cluster::servers`]) that owns `key`.
    pub fn server_of(&self, key: &[u8]) -> usize {
        usize::from(self.partition_owner[self.partition_of(key) as usize])
    }

    /// Renders this cluster as a cluster file.
    pub fn to_toml(&self) -> String {
        let mut text = format!("partitions = {}\n", self.partition_owner.len());
        if self.replicas != 1 {
            text.push_str(&format!("replicas = {}\n", self.replicas));
        }
        for (server, address) in self.servers.iter().enumerate() {
            let owned: Vec<String> = (0..self.partition_owner.len())
                .filter(|p| usize::from(self.partition_owner[*p]) == server)
                .map(|p| p.to_string())
                .collect();
            text.push_str(&format!("\n[[servers]]\naddress = \"{address}\"\npartitions = [{}]\n", owned.join(", ")));
            for (front, listed) in [(Front::Ring, &self.ring), (Front::RfRpc, &self.rfrpc)] {
                if let Some(control) = &listed[server] {
                    text.push_str(&format!("{} = \"{control}\"\n", front.key()));
                }
            }
            if let Some(config) = &self.config[server] {
                text.push_str(&format!("config = \"{config}\"\n"));
            }
            if let Some(replicate) = &self.replicate[server] {
                text.push_str(&format!("replicate = \"{replicate}\"\n"));
            }
        }
        text
    }
}

/// The positions of the first address that appears twice, if any. Addresses that parse as
/// socket addresses compare as such (`127.0.0.1:07001` is `127.0.0.1:7001`, `[::1]:1` is
/// `[0::1]:1`); host names compare ignoring letter case (DNS names do). Two names that resolve
/// to one host are not caught: the core does no I/O.
fn first_duplicate<'a>(addresses: impl Iterator<Item = &'a str>) -> Option<(usize, usize)> {
    let mut seen = std::collections::HashMap::new();
    for (index, address) in addresses.enumerate() {
        let canonical = match address.parse::<std::net::SocketAddr>() {
            Ok(parsed) => parsed.to_string(),
            Err(_) => address.to_ascii_lowercase(),
        };
        if let Some(&first) = seen.get(&canonical) {
            return Some((first, index));
        }
        seen.insert(canonical, index);
    }
    None
}

/// Checks that `address` (the `what` address: "server", "ring", "rfrpc") is HOST:PORT.
fn validate_address(what: &'static str, address: &str) -> Result<(), InvalidCluster> {
    let port_ok = address.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    match port_ok {
        true => Ok(()),
        false => Err(InvalidCluster::Address { what, address: address.to_owned() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(key_hash(b""), 0xcbf29ce484222325);
        assert_eq!(key_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(key_hash(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn a_cluster_file_round_trips_and_routes_every_key_to_its_partition_owner() {
        let text = "partitions = 4\n[[servers]]\naddress = \"127.0.0.1:1\"\npartitions = [0, 3]\n\
                    [[servers]]\naddress = \"127.0.0.1:2\"\npartitions = [1, 2]\n";
        let cluster = Cluster::from_toml(text).unwrap();
        assert_eq!(Cluster::from_toml(&cluster.to_toml()).unwrap(), cluster);
        for key in ["k1", "k2", "user1234", ""] {
            let expected = match cluster.partition_of(key.as_bytes()) {
                0 | 3 => 0,
                _ => 1,
            };
            assert_eq!(cluster.server_of(key.as_bytes()), expected);
        }
    }

    #[test]
    fn front_addresses_round_trip_and_a_missing_one_is_named() {
        let text = "[[servers]]\naddress = \"127.0.0.1:1\"\nring = \"127.0.0.1:11\"\n\
                    [[servers]]\naddress = \"127.0.0.1:2\"\nring = \"127.0.0.1:12\"\nrfrpc = \"127.0.0.1:22\"\n";
        let cluster = Cluster::from_toml(text).unwrap();
        assert_eq!(Cluster::from_toml(&cluster.to_toml()).unwrap(), cluster);
        assert_eq!(cluster.front_addresses(Front::Ring).unwrap(), ["127.0.0.1:11", "127.0.0.1:12"]);
        let missing = cluster.front_addresses(Front::RfRpc).unwrap_err().to_string();
        assert!(missing.contains("server 127.0.0.1:1 has no `rfrpc`"), "{missing}");
        assert!(missing.contains("--rfrpc-listen"), "{missing}");

        let plain = Cluster::with_servers(vec!["127.0.0.1:1".into()]).unwrap();
        assert!(plain.front_addresses(Front::Ring).is_err());
        let given = plain.clone().with_fronts(Front::Ring, vec!["127.0.0.1:9".into()]).unwrap();
        assert_eq!(given.front_addresses(Front::Ring).unwrap(), ["127.0.0.1:9"]);
        assert_eq!(Cluster::from_toml(&given.to_toml()).unwrap(), given);
        assert!(plain.clone().with_fronts(Front::Ring, vec![]).is_err());
        assert!(plain.with_fronts(Front::RfRpc, vec!["nohost".into()]).is_err());
    }

    #[test]
    fn replicas_and_config_addresses_round_trip_and_bad_ones_are_named() {
        let text = "partitions = 4\nreplicas = 2\n[[servers]]\naddress = \"127.0.0.1:1\"\nconfig = \"127.0.0.1:21\"\n\
                    [[servers]]\naddress = \"127.0.0.1:2\"\nconfig = \"127.0.0.1:22\"\n";
        let cluster = Cluster::from_toml(text).unwrap();
        assert_eq!(cluster.replicas(), 2);
        assert_eq!(cluster.config_addresses().unwrap(), ["127.0.0.1:21", "127.0.0.1:22"]);
        assert_eq!(Cluster::from_toml(&cluster.to_toml()).unwrap(), cluster);
        assert_eq!(cluster.owner_of_partition(3), Some(1));
        assert_eq!(cluster.owner_of_partition(4), None);

        let plain = Cluster::with_servers(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]).unwrap();
        assert_eq!(plain.replicas(), 1);
        let missing = plain.config_addresses().unwrap_err().to_string();
        assert!(missing.contains("server 127.0.0.1:1 has no `config` address"), "{missing}");
        let given = plain.clone().with_config_addresses(vec!["127.0.0.1:9".into(), "127.0.0.1:8".into()]).unwrap();
        assert_eq!(Cluster::from_toml(&given.to_toml()).unwrap(), given);
        assert!(plain.clone().with_config_addresses(vec!["127.0.0.1:9".into()]).is_err());
        let too_many = plain.clone().with_replicas(3).unwrap_err().to_string();
        assert!(too_many.contains("3 replicas need at least 3 servers, the cluster has 2"), "{too_many}");
        assert!(plain.with_replicas(0).is_err());
    }

    #[test]
    fn malformed_cluster_files_give_clear_errors() {
        let cases = [
            ("servers = []", "need 1..="),
            ("[[servers]]\naddress = \"nohost\"", "not HOST:PORT"),
            ("[[servers]]\naddress = \"h:1\"\nbogus = 1", "unknown field"),
            ("partitions = 2\n[[servers]]\naddress = \"h:1\"\npartitions = [0]", "owned by no server"),
            ("partitions = 1\n[[servers]]\naddress = \"h:1\"\npartitions = [0, 0]", "listed twice"),
            ("partitions = 1\n[[servers]]\naddress = \"h:1\"\npartitions = [7]", "only 1"),
            (
                "partitions = 2\n[[servers]]\naddress = \"h:1\"\npartitions = [0, 1]\n[[servers]]\naddress = \"h:2\"",
                "every server lists",
            ),
            ("this is not toml", "expected"),
            ("[[servers]]\naddress = \"h:1\"\nring = \"h\"", "ring address \"h\" is not HOST:PORT"),
            ("[[servers]]\naddress = \"h:1\"\nrfrpc = 7", "invalid type"),
            ("replicas = 2\n[[servers]]\naddress = \"h:1\"", "2 replicas need at least 2 servers, the cluster has 1"),
            ("replicas = 0\n[[servers]]\naddress = \"h:1\"", "need 1..="),
            ("[[servers]]\naddress = \"h:1\"\nconfig = \"nope\"", "config address \"nope\" is not HOST:PORT"),
            (
                "[[servers]]\naddress = \"h:1\"\n[[servers]]\naddress = \"H:1\"",
                "server H:1 is listed twice (entries 0 and 1",
            ),
        ];
        for (text, expected) in cases {
            let message = Cluster::from_toml(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{text:?} gave {message:?}");
        }
    }

    /// Issue 15: a server listed twice was accepted, and a wrong cluster file silently routed
    /// keys to servers that never stored them (reads answered nil). Each mistake is now refused
    /// with a typed error naming it.
    #[test]
    fn duplicate_servers_and_partition_mistakes_are_typed_errors_naming_the_culprit() {
        let twice = "[[servers]]\naddress = \"127.0.0.1:7001\"\n[[servers]]\naddress = \"127.0.0.1:7002\"\n\
                     [[servers]]\naddress = \"127.0.0.1:07001\"\n";
        assert!(matches!(
            Cluster::from_toml(twice),
            Err(ClusterError::DuplicateServer { ref address, first: 0, second: 2 }) if address == "127.0.0.1:07001"
        ));
        let ipv6 = vec!["[::1]:5".to_string(), "[0:0::1]:5".to_string()];
        assert!(matches!(Cluster::with_servers(ipv6), Err(ClusterError::DuplicateServer { first: 0, second: 1, .. })));

        let listed_twice = "partitions = 2\n[[servers]]\naddress = \"a:1\"\npartitions = [0, 1]\n\
                            [[servers]]\naddress = \"b:1\"\npartitions = [1]\n";
        assert!(matches!(
            Cluster::from_toml(listed_twice),
            Err(ClusterError::PartitionListedTwice { partition: 1, ref first, ref second }) if first == "a:1" && second == "b:1"
        ));
        let uncovered = "partitions = 3\n[[servers]]\naddress = \"a:1\"\npartitions = [0]\n\
                         [[servers]]\naddress = \"b:1\"\npartitions = [2]\n";
        assert!(matches!(
            Cluster::from_toml(uncovered),
            Err(ClusterError::PartitionUnowned { partition: 1, partitions: 3 })
        ));
        let beyond = "partitions = 1\n[[servers]]\naddress = \"a:1\"\npartitions = [0, 4]\n";
        assert!(matches!(
            Cluster::from_toml(beyond),
            Err(ClusterError::PartitionOutOfRange { partition: 4, partitions: 1, .. })
        ));
        let shared_ring =
            "[[servers]]\naddress = \"a:1\"\nring = \"c:9\"\n[[servers]]\naddress = \"b:1\"\nring = \"C:9\"\n";
        let error = Cluster::from_toml(shared_ring).unwrap_err();
        assert!(
            matches!(&error, ClusterError::DuplicateFrontAddress { front: "ring", first, second, .. } if first == "a:1" && second == "b:1"),
            "{error}"
        );
        let plain = Cluster::with_servers(vec!["a:1".into(), "b:1".into()]).unwrap();
        assert!(matches!(
            plain.with_fronts(Front::RfRpc, vec!["c:9".into(), "c:9".into()]),
            Err(ClusterError::DuplicateFrontAddress { front: "rfrpc", .. })
        ));
    }

    #[test]
    fn a_cluster_file_error_names_the_file() {
        let directory = std::env::temp_dir().join(format!("rampkv-cluster-test-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let path = directory.join("twice.toml");
        std::fs::write(&path, "[[servers]]\naddress = \"a:1\"\n[[servers]]\naddress = \"a:1\"\n").unwrap();
        let error = Cluster::from_file(&path).unwrap_err();
        std::fs::remove_dir_all(&directory).unwrap();
        let message = error.to_string();
        assert!(message.contains("twice.toml") && message.contains("server a:1 is listed twice"), "{message}");
        let ClusterError::InFile { source, .. } = error else { panic!("expected InFile, got {error:?}") };
        assert!(matches!(*source, ClusterError::DuplicateServer { .. }));
    }
}
