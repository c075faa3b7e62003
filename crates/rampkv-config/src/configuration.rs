//! The replicated state: which servers hold which partition, who is primary, in which epoch.
//!
//! # Contract
//! A [`Configuration`] is a value. It changes only through [`Configuration::apply`] of a
//! [`Proposal`] (a list of [`Change`]s made against one epoch), which checks every change,
//! bumps the epoch by exactly one and validates the result, so every configuration the Raft
//! group commits is valid and epochs only grow. Applying is a pure function of the
//! configuration and the proposal: every node that applies the same log reaches the same
//! configuration, and a refused proposal is refused everywhere.
//!
//! # Invariants ([`Configuration::validate`])
//! - 1 <= replicas <= servers; servers are numbered by position; no two share an address.
//! - Every partition: members (primary, in-sync backups, catching-up servers) are distinct,
//!   known servers, at most `replicas` of them; a partition without a primary has no members
//!   (it lost every copy: unavailable).
//!
//! # Placement ([`Configuration::initial`])
//! Partition p's primary is its owner in the cluster file (p mod servers by default, which
//! spreads primaries evenly); its backups are the `replicas - 1` servers that follow the
//! primary in server order, so backups spread evenly too.
//!
//! # Encoding
//! Little-endian, documented byte by byte in docs/replication.md ("Encodings").

use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{CLUSTER_PARTITIONS_MAX, CLUSTER_REPLICAS_MAX, CLUSTER_SERVERS_MAX};

use crate::codec::{Reader, Writer};
use crate::error::{ConfigError, ReplicaSetProblem};
use crate::limits::CONFIG_CHANGES_MAX;

pub use crate::ids::ServerId;

/// The incarnation of a server process that started with the cluster (bootstrap). A process
/// that restarts into a running cluster picks a random non-zero incarnation.
pub const BOOTSTRAP_INCARNATION: u64 = 0;

/// One server of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Its number (position in the cluster file).
    pub id: ServerId,
    /// Where clients reach its data path (the cluster file's `address`).
    pub data_address: String,
    /// Where its configuration-service node listens (the cluster file's `config`).
    pub config_address: String,
    /// The process incarnation whose replicas this configuration counts. A restarted process
    /// is a new incarnation holding no data; it is admitted (this field set to it) only once
    /// the old incarnation is in no replica set.
    pub incarnation: u64,
}

/// The copies of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaSet {
    /// The server that serves reads and orders writes; `None` once every copy is lost.
    pub primary: Option<ServerId>,
    /// Backups holding every acknowledged record: a primary acknowledges a write only when
    /// all of them hold it, and only they may be promoted.
    pub backups: Vec<ServerId>,
    /// Servers copying the partition from its primary (rejoin); not yet promotable.
    pub catching_up: Vec<ServerId>,
}

impl ReplicaSet {
    /// Every member: primary, in-sync backups, catching-up servers.
    pub fn members(&self) -> impl Iterator<Item = ServerId> + '_ {
        self.primary.iter().copied().chain(self.backups.iter().copied()).chain(self.catching_up.iter().copied())
    }

    /// Whether `server` holds (or is copying) this partition.
    pub fn contains(&self, server: ServerId) -> bool {
        self.members().any(|member| member == server)
    }
}

/// One change of a partition's replica set (or of a server's admitted incarnation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// An in-sync backup becomes primary; the old primary (if any) leaves the replica set.
    Promote { partition: u32, server: ServerId },
    /// The primary died with no in-sync backup left: the partition has no copy (unavailable).
    PrimaryLost { partition: u32 },
    /// A backup or catching-up server leaves (it died, or its copy is no longer in sync).
    RemoveReplica { partition: u32, server: ServerId },
    /// An admitted server starts copying the partition from its primary (rejoin).
    AddCatchingUp { partition: u32, server: ServerId },
    /// A catching-up server holds the partition's snapshot and log: it becomes an in-sync backup.
    CaughtUp { partition: u32, server: ServerId },
    /// A restarted server's new incarnation is admitted (it must be in no replica set).
    Admit { server: ServerId, incarnation: u64 },
}

impl Change {
    fn name(&self) -> &'static str {
        match self {
            Change::Promote { .. } => "promote",
            Change::PrimaryLost { .. } => "primary-lost",
            Change::RemoveReplica { .. } => "remove-replica",
            Change::AddCatchingUp { .. } => "add-catching-up",
            Change::CaughtUp { .. } => "caught-up",
            Change::Admit { .. } => "admit",
        }
    }

    fn code(&self) -> u8 {
        match self {
            Change::Promote { .. } => 1,
            Change::PrimaryLost { .. } => 2,
            Change::RemoveReplica { .. } => 3,
            Change::AddCatchingUp { .. } => 4,
            Change::CaughtUp { .. } => 5,
            Change::Admit { .. } => 6,
        }
    }
}

/// Changes made against the configuration of `base_epoch`, applied together as one new epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub base_epoch: u64,
    pub changes: Vec<Change>,
}

/// Bytes of one encoded change: kind u8, partition u32, server u16, incarnation u64.
const CHANGE_BYTES: usize = 15;

impl Proposal {
    /// The bytes of a Raft log entry.
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::default();
        writer.u64(self.base_epoch);
        writer.u32(self.changes.len() as u32);
        for change in &self.changes {
            let (partition, server, incarnation) = match *change {
                Change::Promote { partition, server }
                | Change::RemoveReplica { partition, server }
                | Change::AddCatchingUp { partition, server }
                | Change::CaughtUp { partition, server } => (partition, server, 0),
                Change::PrimaryLost { partition } => (partition, 0, 0),
                Change::Admit { server, incarnation } => (0, server, incarnation),
            };
            writer.u8(change.code());
            writer.u32(partition);
            writer.u16(server);
            writer.u64(incarnation);
        }
        writer.bytes
    }

    /// Decodes a Raft log entry; refuses truncated, trailing or unknown bytes.
    pub fn decode(bytes: &[u8]) -> Result<Proposal, ConfigError> {
        let mut reader = Reader::new(bytes, "configuration change");
        let base_epoch = reader.u64()?;
        let count = reader.count(CHANGE_BYTES, CONFIG_CHANGES_MAX)?;
        let mut changes = Vec::with_capacity(count);
        for _ in 0..count {
            let code = reader.u8()?;
            let partition = reader.u32()?;
            let server = reader.u16()?;
            let incarnation = reader.u64()?;
            changes.push(match code {
                1 => Change::Promote { partition, server },
                2 => Change::PrimaryLost { partition },
                3 => Change::RemoveReplica { partition, server },
                4 => Change::AddCatchingUp { partition, server },
                5 => Change::CaughtUp { partition, server },
                6 => Change::Admit { server, incarnation },
                _ => return Err(reader.error("unknown change kind")),
            });
        }
        reader.finish()?;
        Ok(Proposal { base_epoch, changes })
    }
}

/// The configuration of a cluster at one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    cluster_id: u64,
    epoch: u64,
    replicas: u32,
    servers: Vec<ServerInfo>,
    partitions: Vec<ReplicaSet>,
}

/// The epoch of every cluster's first configuration (0 means "none known").
pub const FIRST_EPOCH: u64 = 1;

impl Configuration {
    /// The first configuration of the cluster a cluster file describes (epoch 1).
    ///
    /// # Errors
    /// A server without a `config` address, fewer servers than replicas, duplicate addresses.
    pub fn initial(cluster: &Cluster) -> Result<Configuration, ConfigError> {
        let config_addresses = cluster.config_addresses()?;
        let servers = cluster.servers().iter().cloned().zip(config_addresses).collect();
        let owners = (0..cluster.partition_count())
            .map(|partition| cluster.owner_of_partition(partition).expect("partition below the count") as ServerId)
            .collect();
        Self::placed(servers, owners, cluster.replicas())
    }

    /// The first configuration of servers `(data address, config address)`, with partition p's
    /// primary `owners[p]` and its backups the servers that follow it.
    pub fn placed(
        servers: Vec<(String, String)>,
        owners: Vec<ServerId>,
        replicas: u32,
    ) -> Result<Configuration, ConfigError> {
        check_counts(servers.len(), owners.len(), replicas)?;
        let count = servers.len();
        let servers: Vec<ServerInfo> = servers
            .into_iter()
            .enumerate()
            .map(|(id, (data_address, config_address))| ServerInfo {
                id: id as ServerId,
                data_address,
                config_address,
                incarnation: BOOTSTRAP_INCARNATION,
            })
            .collect();
        let mut partitions = Vec::with_capacity(owners.len());
        for (partition, owner) in owners.into_iter().enumerate() {
            if usize::from(owner) >= count {
                return Err(ConfigError::UnknownServer { server: owner, servers: count });
            }
            let backups = backups_of(owner, count, replicas);
            debug_assert!(partition < CLUSTER_PARTITIONS_MAX as usize);
            partitions.push(ReplicaSet { primary: Some(owner), backups, catching_up: Vec::new() });
        }
        let mut configuration = Configuration { cluster_id: 0, epoch: FIRST_EPOCH, replicas, servers, partitions };
        configuration.validate()?;
        // The cluster's identity is a hash of its first configuration: two cluster files that
        // differ in any server, address, partition or replica count make different clusters.
        configuration.cluster_id = xxhash_rust::xxh3::xxh3_64(&configuration.encode()) | 1;
        Ok(configuration)
    }

    /// Identity of the cluster (hash of its first configuration; never 0).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The epoch: grows by one with every committed change.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Copies of each partition the cluster asks for (f + 1).
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Every server, indexed by [`ServerId`].
    pub fn servers(&self) -> &[ServerInfo] {
        &self.servers
    }

    /// One server, if it exists.
    pub fn server(&self, server: ServerId) -> Option<&ServerInfo> {
        self.servers.get(usize::from(server))
    }

    /// Number of partitions.
    pub fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// The replica set of `partition`, if it exists.
    pub fn replica_set(&self, partition: u32) -> Option<&ReplicaSet> {
        self.partitions.get(partition as usize)
    }

    /// Every partition's replica set, indexed by partition.
    pub fn replica_sets(&self) -> &[ReplicaSet] {
        &self.partitions
    }

    /// The primary of `partition` (None: unknown partition, or no copy left).
    pub fn primary_of(&self, partition: u32) -> Option<ServerId> {
        self.replica_set(partition).and_then(|set| set.primary)
    }

    /// Partitions with no copy left (no primary): clients get an Unavailable error naming them.
    pub fn unavailable_partitions(&self) -> Vec<u32> {
        (0..self.partition_count()).filter(|p| self.partitions[*p as usize].primary.is_none()).collect()
    }

    /// Whether `server` is a member (primary, backup or catching up) of any partition.
    pub fn is_member(&self, server: ServerId) -> bool {
        self.partitions.iter().any(|set| set.contains(server))
    }

    /// Whether the process `incarnation` of `server` is the one this configuration counts.
    pub fn is_admitted(&self, server: ServerId, incarnation: u64) -> bool {
        self.server(server).is_some_and(|info| info.incarnation == incarnation)
    }

    /// Accepts `epoch` (of a record, request or peer) if it is not older than this one.
    ///
    /// # Errors
    /// [`ConfigError::StaleEpoch`] naming both epochs.
    pub fn check_epoch(&self, epoch: u64) -> Result<(), ConfigError> {
        if epoch < self.epoch {
            return Err(ConfigError::StaleEpoch { got: epoch, current: self.epoch });
        }
        Ok(())
    }

    /// The configuration after `proposal` (epoch + 1).
    ///
    /// # Errors
    /// [`ConfigError::StaleProposal`] when it was made against another epoch; the first change
    /// that does not apply; an invalid result. `self` is unchanged in every case.
    pub fn apply(&self, proposal: &Proposal) -> Result<Configuration, ConfigError> {
        if proposal.base_epoch != self.epoch {
            return Err(ConfigError::StaleProposal { base_epoch: proposal.base_epoch, epoch: self.epoch });
        }
        let mut next = self.clone();
        for change in &proposal.changes {
            next.apply_change(change)?;
        }
        next.epoch += 1;
        next.validate()?;
        Ok(next)
    }

    fn apply_change(&mut self, change: &Change) -> Result<(), ConfigError> {
        let servers = self.servers.len();
        let refused =
            |partition: u32, problem| ConfigError::ChangeRefused { change: change.name(), partition, problem };
        if let Change::Admit { server, incarnation } = *change {
            if usize::from(server) >= servers {
                return Err(ConfigError::UnknownServer { server, servers });
            }
            if let Some(partition) = self.partitions.iter().position(|set| set.contains(server)) {
                return Err(refused(partition as u32, ReplicaSetProblem::AlreadyMember(server)));
            }
            self.servers[usize::from(server)].incarnation = incarnation;
            return Ok(());
        }
        let partition = match *change {
            Change::Promote { partition, .. }
            | Change::PrimaryLost { partition }
            | Change::RemoveReplica { partition, .. }
            | Change::AddCatchingUp { partition, .. }
            | Change::CaughtUp { partition, .. } => partition,
            Change::Admit { .. } => unreachable!("handled above"),
        };
        let partitions = self.partitions.len();
        let Some(set) = self.partitions.get_mut(partition as usize) else {
            return Err(ConfigError::UnknownPartition { partition, partitions });
        };
        match *change {
            Change::Promote { server, .. } => {
                let Some(position) = set.backups.iter().position(|backup| *backup == server) else {
                    return Err(refused(partition, ReplicaSetProblem::NotInSyncBackup(server)));
                };
                set.backups.remove(position);
                set.primary = Some(server);
            }
            Change::PrimaryLost { .. } => {
                if !set.backups.is_empty() || set.primary.is_none() {
                    return Err(refused(partition, ReplicaSetProblem::StillServed));
                }
                // The catching-up servers had no complete copy: nothing is left to copy from.
                *set = ReplicaSet::default();
            }
            Change::RemoveReplica { server, .. } => {
                let before = set.backups.len() + set.catching_up.len();
                set.backups.retain(|member| *member != server);
                set.catching_up.retain(|member| *member != server);
                if set.backups.len() + set.catching_up.len() == before {
                    return Err(refused(partition, ReplicaSetProblem::NotAReplica(server)));
                }
            }
            Change::AddCatchingUp { server, .. } => {
                if usize::from(server) >= servers {
                    return Err(refused(partition, ReplicaSetProblem::UnknownMember(server)));
                }
                if set.primary.is_none() {
                    return Err(refused(partition, ReplicaSetProblem::NoPrimary));
                }
                if set.contains(server) {
                    return Err(refused(partition, ReplicaSetProblem::AlreadyMember(server)));
                }
                set.catching_up.push(server);
            }
            Change::CaughtUp { server, .. } => {
                let Some(position) = set.catching_up.iter().position(|member| *member == server) else {
                    return Err(refused(partition, ReplicaSetProblem::NotCatchingUp(server)));
                };
                set.catching_up.remove(position);
                set.backups.push(server);
            }
            Change::Admit { .. } => unreachable!("handled above"),
        }
        Ok(())
    }

    /// Checks every invariant of the module header.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_counts(self.servers.len(), self.partitions.len(), self.replicas)?;
        for (position, server) in self.servers.iter().enumerate() {
            if usize::from(server.id) != position {
                return Err(ConfigError::ServerOutOfPlace { position, server: server.id });
            }
            for earlier in &self.servers[..position] {
                for (mine, theirs) in [
                    (&server.data_address, &earlier.data_address),
                    (&server.config_address, &earlier.config_address),
                    (&server.data_address, &earlier.config_address),
                    (&server.config_address, &earlier.data_address),
                ] {
                    if mine == theirs {
                        return Err(ConfigError::DuplicateServer {
                            first: earlier.id,
                            second: server.id,
                            address: mine.clone(),
                        });
                    }
                }
            }
        }
        for (partition, set) in self.partitions.iter().enumerate() {
            let bad = |problem| ConfigError::BadReplicaSet { partition: partition as u32, problem };
            if set.primary.is_none() && (!set.backups.is_empty() || !set.catching_up.is_empty()) {
                return Err(bad(ReplicaSetProblem::BackupsWithoutPrimary));
            }
            let members: Vec<ServerId> = set.members().collect();
            if members.len() > self.replicas as usize {
                return Err(bad(ReplicaSetProblem::TooManyMembers));
            }
            for (index, member) in members.iter().enumerate() {
                if usize::from(*member) >= self.servers.len() {
                    return Err(bad(ReplicaSetProblem::UnknownMember(*member)));
                }
                if members[..index].contains(member) {
                    return Err(bad(ReplicaSetProblem::DuplicateMember(*member)));
                }
            }
        }
        Ok(())
    }

    /// The bytes of this configuration (docs/replication.md, "Encodings").
    pub fn encode(&self) -> Vec<u8> {
        let mut writer = Writer::default();
        writer.u64(self.cluster_id);
        writer.u64(self.epoch);
        writer.u32(self.replicas);
        writer.u32(self.servers.len() as u32);
        for server in &self.servers {
            writer.u16(server.id);
            writer.blob(server.data_address.as_bytes());
            writer.blob(server.config_address.as_bytes());
            writer.u64(server.incarnation);
        }
        writer.u32(self.partitions.len() as u32);
        for set in &self.partitions {
            writer.u16(set.primary.unwrap_or(NO_SERVER));
            for list in [&set.backups, &set.catching_up] {
                writer.u8(list.len() as u8);
                for member in list {
                    writer.u16(*member);
                }
            }
        }
        writer.bytes
    }

    /// Decodes and validates a configuration: refuses truncated, trailing or invalid bytes.
    pub fn decode(bytes: &[u8]) -> Result<Configuration, ConfigError> {
        let mut reader = Reader::new(bytes, "configuration");
        let cluster_id = reader.u64()?;
        let epoch = reader.u64()?;
        let replicas = reader.u32()?;
        // A server takes at least 2 + 4 + 4 + 8 bytes, a partition at least 4.
        let server_count = reader.count(18, CLUSTER_SERVERS_MAX)?;
        let mut servers = Vec::with_capacity(server_count);
        for _ in 0..server_count {
            let id = reader.u16()?;
            let data_address = reader.text()?;
            let config_address = reader.text()?;
            let incarnation = reader.u64()?;
            servers.push(ServerInfo { id, data_address, config_address, incarnation });
        }
        let partition_count = reader.count(4, CLUSTER_PARTITIONS_MAX as usize)?;
        let mut partitions = Vec::with_capacity(partition_count);
        for _ in 0..partition_count {
            let primary = reader.u16()?;
            let mut lists = [Vec::new(), Vec::new()];
            for list in &mut lists {
                let count = reader.u8()?;
                if u32::from(count) > CLUSTER_REPLICAS_MAX {
                    return Err(reader.error("replica list longer than the replica limit"));
                }
                for _ in 0..count {
                    list.push(reader.u16()?);
                }
            }
            let [backups, catching_up] = lists;
            let primary = (primary != NO_SERVER).then_some(primary);
            partitions.push(ReplicaSet { primary, backups, catching_up });
        }
        reader.finish()?;
        let configuration = Configuration { cluster_id, epoch, replicas, servers, partitions };
        configuration.validate()?;
        Ok(configuration)
    }
}

/// "No server" in encodings (a partition without a primary).
const NO_SERVER: ServerId = u16::MAX;

/// The first backups of a partition whose primary is `primary` in a cluster of `servers`
/// servers with `replicas` copies: the `replicas - 1` servers that follow it in server order
/// (the placement of the module header; a server's records go to exactly these servers).
pub fn backups_of(primary: ServerId, servers: usize, replicas: u32) -> Vec<ServerId> {
    let count = servers.max(1);
    let copies = (replicas as usize).min(count);
    (1..copies).map(|step| ((usize::from(primary) + step) % count) as ServerId).collect()
}

fn check_counts(servers: usize, partitions: usize, replicas: u32) -> Result<(), ConfigError> {
    if servers == 0 || servers > CLUSTER_SERVERS_MAX {
        return Err(ConfigError::ServersOutOfRange { servers, max: CLUSTER_SERVERS_MAX });
    }
    if partitions == 0 || partitions > CLUSTER_PARTITIONS_MAX as usize {
        return Err(ConfigError::PartitionsOutOfRange { partitions, max: CLUSTER_PARTITIONS_MAX });
    }
    if replicas == 0 || replicas > CLUSTER_REPLICAS_MAX {
        return Err(ConfigError::ReplicasOutOfRange { replicas, max: CLUSTER_REPLICAS_MAX });
    }
    if replicas as usize > servers {
        return Err(ConfigError::TooFewServers { servers, replicas });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(count: usize) -> Vec<(String, String)> {
        (0..count).map(|i| (format!("127.0.0.1:{}", 7000 + i), format!("127.0.0.1:{}", 7100 + i))).collect()
    }

    fn three_by_six() -> Configuration {
        Configuration::placed(servers(3), (0..6).map(|p| (p % 3) as ServerId).collect(), 2).unwrap()
    }

    #[test]
    fn placement_puts_each_partition_on_distinct_servers_and_spreads_primaries() {
        for (count, partitions, replicas) in [(3, 6, 2), (3, 9, 3), (5, 7, 2), (4, 16, 3), (1, 4, 1)] {
            let owners = (0..partitions).map(|p| (p % count) as ServerId).collect();
            let configuration = Configuration::placed(servers(count), owners, replicas).unwrap();
            let mut primaries = vec![0usize; count];
            let mut copies = vec![0usize; count];
            for set in configuration.replica_sets() {
                assert_eq!(set.members().count(), replicas as usize);
                primaries[usize::from(set.primary.unwrap())] += 1;
                for member in set.members() {
                    copies[usize::from(member)] += 1;
                }
            }
            let spread = |counts: &[usize]| counts.iter().max().unwrap() - counts.iter().min().unwrap();
            assert!(spread(&primaries) <= 1, "{primaries:?}");
            assert!(spread(&copies) <= replicas as usize, "{copies:?}");
            assert_eq!(configuration.epoch(), FIRST_EPOCH);
            assert_ne!(configuration.cluster_id(), 0);
        }
    }

    #[test]
    fn bad_clusters_get_typed_errors() {
        let owners = vec![0, 1];
        assert!(matches!(
            Configuration::placed(servers(2), owners.clone(), 3),
            Err(ConfigError::TooFewServers { servers: 2, replicas: 3 })
        ));
        assert!(matches!(
            Configuration::placed(servers(2), owners.clone(), 0),
            Err(ConfigError::ReplicasOutOfRange { .. })
        ));
        let mut duplicate = servers(2);
        duplicate[1].0 = duplicate[0].0.clone();
        let error = Configuration::placed(duplicate, owners, 1).unwrap_err();
        assert!(matches!(error, ConfigError::DuplicateServer { first: 0, second: 1, .. }), "{error}");
        assert!(matches!(
            Configuration::placed(servers(2), vec![0, 5], 1),
            Err(ConfigError::UnknownServer { server: 5, servers: 2 })
        ));
        assert!(matches!(Configuration::placed(Vec::new(), vec![0], 1), Err(ConfigError::ServersOutOfRange { .. })));
    }

    #[test]
    fn a_cluster_file_with_fewer_servers_than_replicas_or_without_config_addresses_is_refused() {
        let text = "replicas = 2\n[[servers]]\naddress = \"127.0.0.1:1\"\nconfig = \"127.0.0.1:11\"\n\
                    [[servers]]\naddress = \"127.0.0.1:2\"\n";
        let cluster = Cluster::from_toml(text).unwrap();
        let error = Configuration::initial(&cluster).unwrap_err().to_string();
        assert!(error.contains("server 127.0.0.1:2 has no `config` address"), "{error}");
        let text = "replicas = 3\n[[servers]]\naddress = \"127.0.0.1:1\"\n[[servers]]\naddress = \"127.0.0.1:2\"\n";
        let error = Cluster::from_toml(text).unwrap_err().to_string();
        assert!(error.contains("3 replicas need at least 3 servers"), "{error}");
    }

    #[test]
    fn failover_rejoin_and_loss_bump_the_epoch_and_keep_the_invariants() {
        let first = three_by_six();
        // Server 0 dies: it is primary of 0 and 3 (backups 1), backup of 2 and 5.
        let changes = vec![
            Change::Promote { partition: 0, server: 1 },
            Change::Promote { partition: 3, server: 1 },
            Change::RemoveReplica { partition: 2, server: 0 },
            Change::RemoveReplica { partition: 5, server: 0 },
        ];
        let second = first.apply(&Proposal { base_epoch: 1, changes }).unwrap();
        assert_eq!(second.epoch(), 2);
        assert_eq!(second.primary_of(0), Some(1));
        assert!(!second.is_member(0));
        assert_eq!(second.replica_set(2).unwrap().backups, Vec::<ServerId>::new());
        // The old epoch's change no longer applies; the restarted server is admitted, copies, joins.
        assert!(matches!(
            second.apply(&Proposal { base_epoch: 1, changes: vec![] }),
            Err(ConfigError::StaleProposal { base_epoch: 1, epoch: 2 })
        ));
        let admit =
            vec![Change::Admit { server: 0, incarnation: 77 }, Change::AddCatchingUp { partition: 0, server: 0 }];
        let third = second.apply(&Proposal { base_epoch: 2, changes: admit }).unwrap();
        assert!(third.is_admitted(0, 77) && !third.is_admitted(0, BOOTSTRAP_INCARNATION));
        let fourth = third
            .apply(&Proposal { base_epoch: 3, changes: vec![Change::CaughtUp { partition: 0, server: 0 }] })
            .unwrap();
        assert_eq!(fourth.replica_set(0).unwrap().backups, vec![0]);
        // Losing a partition's last copy makes it unavailable, by name.
        let lost = vec![Change::RemoveReplica { partition: 2, server: 2 }];
        assert!(fourth.apply(&Proposal { base_epoch: 4, changes: lost }).is_err());
        let lost = vec![Change::PrimaryLost { partition: 2 }];
        let fifth = fourth.apply(&Proposal { base_epoch: 4, changes: lost }).unwrap();
        assert_eq!(fifth.unavailable_partitions(), vec![2]);
        assert!(fifth.check_epoch(4).is_err() && fifth.check_epoch(5).is_ok());
    }

    #[test]
    fn changes_that_do_not_apply_are_refused_and_leave_the_configuration_unchanged() {
        let first = three_by_six();
        let cases = [
            Change::Promote { partition: 0, server: 2 },
            Change::Promote { partition: 0, server: 0 },
            Change::PrimaryLost { partition: 0 },
            Change::RemoveReplica { partition: 0, server: 0 },
            Change::AddCatchingUp { partition: 0, server: 1 },
            Change::AddCatchingUp { partition: 0, server: 9 },
            Change::CaughtUp { partition: 0, server: 2 },
            Change::Admit { server: 0, incarnation: 5 },
            Change::Admit { server: 7, incarnation: 5 },
            Change::Promote { partition: 99, server: 1 },
        ];
        for change in cases {
            let result = first.apply(&Proposal { base_epoch: 1, changes: vec![change] });
            assert!(result.is_err(), "{change:?} applied");
        }
        // Replicas cap the members: a third copy of a 2-replica partition is refused.
        let extra = vec![Change::AddCatchingUp { partition: 0, server: 2 }];
        let error = first.apply(&Proposal { base_epoch: 1, changes: extra }).unwrap_err();
        assert!(matches!(error, ConfigError::BadReplicaSet { problem: ReplicaSetProblem::TooManyMembers, .. }));
        assert_eq!(first, three_by_six());
    }

    #[test]
    fn encodings_round_trip_and_garbage_is_refused_without_panic() {
        let configuration = three_by_six();
        let bytes = configuration.encode();
        assert_eq!(Configuration::decode(&bytes).unwrap(), configuration);
        let proposal = Proposal {
            base_epoch: 9,
            changes: vec![
                Change::Promote { partition: 3, server: 1 },
                Change::PrimaryLost { partition: 4 },
                Change::Admit { server: 2, incarnation: u64::MAX },
            ],
        };
        assert_eq!(Proposal::decode(&proposal.encode()).unwrap(), proposal);
        for cut in 0..bytes.len() {
            assert!(Configuration::decode(&bytes[..cut]).is_err());
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(Configuration::decode(&trailing).is_err());
        // A hostile count does not allocate: 4 billion servers in 20 bytes is refused.
        let mut huge = vec![0u8; 20];
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Configuration::decode(&huge).is_err());
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2_000 {
            let mut mutated = bytes.clone();
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let at = (seed >> 33) as usize % mutated.len();
            mutated[at] ^= (seed >> 8) as u8 | 1;
            if let Ok(decoded) = Configuration::decode(&mutated) {
                decoded.validate().unwrap();
            }
            let _ = Proposal::decode(&mutated);
        }
    }
}
