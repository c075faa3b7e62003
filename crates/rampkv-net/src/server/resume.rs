//! How a replicated server process starts under the configuration service (issue 30): with
//! the cluster, into a running cluster, or resuming from its data directory what the durable
//! configuration still gives it.
//!
//! # Contract
//! - **The server's state file.** A server with a data directory keeps `SERVER-STATE` in it
//!   ([`ServerState`], byte layout below): the process incarnation it runs as, and per
//!   partition the primary in the last configuration its failover thread applied *whose data
//!   its files hold* (a copy it adopted is in its files first: a snapshot of its log, fsynced,
//!   before the state says so, before the partition is served). It is written with fsync
//!   before the configuration node first heartbeats with a new incarnation, and again after
//!   every configuration applied ([`super::failover`]).
//! - **The start decision** ([`start_config_node`]). A server whose data directory holds Raft
//!   state (`DIR/config`) restarts its node from it (`StartMode::Restart`) with the incarnation
//!   of its state file, waits until the node caught up with a leader (its configuration is
//!   then at least the newest committed before: `ConfigNode::wait_caught_up`), and:
//!   - **resumes** when that configuration still admits its incarnation and names it the
//!     primary or an in-sync backup of some partition: it serves what the configuration makes
//!     it primary of from its files (partitions its state says its files hold; one whose copy
//!     it had not adopted into its files yet is adopted from the copy it kept, `copies/`), and
//!     its replication port makes the copies it kept current again (what a failover takes over
//!     if their primary does not come back). Its links to its backups start with a snapshot
//!     and release nothing until the backup made that copy current;
//!   - **rejoins** otherwise (the configuration failed it over while it was down): its store
//!     is set aside, it holds nothing, and it catches up like a new process (with the same
//!     incarnation when that one is admitted and holds nothing: it is one).
//!
//!   A server without Raft state decides as before: with the cluster (`Bootstrap`: the
//!   bootstrap incarnation, its cluster-file partitions, after its first lease) or, when
//!   another node says the group committed something in this run, as a new incarnation that
//!   holds nothing (`Rejoin`).
//!
//! # Why resuming loses nothing acknowledged
//! A primary acknowledged a write only once it was durable in its log (the fsync policy) and
//! held by every in-sync backup's copy *on disk* (a backup acknowledges only then:
//! `replication`, `held_once_applied`). So after a whole-cluster kill every copy the
//! configuration counts on holds every acknowledged write: the primary's files if it resumes,
//! the backup's kept copy if the primary does not come back and the backup is promoted. The
//! configuration itself is the one the Raft group committed (docs/replication.md, "Raft state
//! on disk").
//!
//! # `SERVER-STATE`, byte by byte (little-endian)
//! ```text
//! offset    bytes  field
//! 0         8      magic "RKVSTATE"
//! 8         4      format version (1)
//! 12        8      incarnation
//! 20        4      partitions (n, at most CLUSTER_PARTITIONS_MAX)
//! 24        2n     per partition: its primary in the last configuration applied whose data
//!                  these files hold (u16::MAX: none)
//! 24 + 2n   4      CRC32C of bytes 0 .. 24 + 2n
//! ```
//! Written to `SERVER-STATE.tmp`, fsynced, renamed, the directory fsynced: a crash leaves the
//! old file or the new one. A file that does not check stops the start with an error naming
//! it, never a guess.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rampkv_config::auth::PortAuthenticator;
use rampkv_config::configuration::{Configuration, ServerId, BOOTSTRAP_INCARNATION};
use rampkv_config::core::StartMode;
use rampkv_config::error::ConfigError;
use rampkv_config::limits::CONFIG_LOG_ENTRIES_KEPT_MAX;
use rampkv_config::node::{ConfigNode, NodeSettings};
use rampkv_config::timing::Timing;
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::{CLUSTER_PARTITIONS_MAX, FAILOVER_CONFIG_ASK_TIMEOUT_MS, FAILOVER_FIRST_LEASE_WAIT_MS_MAX};

use super::durable::write_file_durably;
use super::ids::random_id;
use super::lease::{FirstLease, HostClock, LeaseGate, CONFIG_STATE_DIR};
use crate::auth::{ConfigPortAuth, SharedSecret};

/// The server's state file in its data directory (module docs).
pub const SERVER_STATE_FILE: &str = "SERVER-STATE";

const STATE_MAGIC: &[u8; 8] = b"RKVSTATE";
const STATE_FORMAT: u32 = 1;
const STATE_HEADER_BYTES: usize = 24;
const NO_PRIMARY: u16 = u16::MAX;

/// What a server's data directory says of its process and its files (module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerState {
    /// The process incarnation the server ran as.
    pub incarnation: u64,
    /// Per partition: its primary in the last configuration applied whose data the files
    /// hold (this server's own number: the files hold the partition as its primary's).
    pub last_primary: Vec<Option<ServerId>>,
}

/// Why the server's state cannot be used, or the start cannot be decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: {problem}; not started (it says which process this directory belongs to)", path.display())]
    StateFile { path: PathBuf, problem: String },
    #[error(
        "the configuration service elected no leader within {waited_ms} ms of this restart: are a majority of \
         the cluster's servers up?"
    )]
    NoLeader { waited_ms: u64 },
    #[error(
        "no lease from the configuration service within {waited_ms} ms: are a majority of the cluster's servers up?"
    )]
    NoLease { waited_ms: u64 },
}

impl ServerState {
    /// A server that starts with the cluster: the bootstrap incarnation, its files hold its
    /// cluster-file partitions.
    pub fn bootstrap(cluster: &Cluster) -> ServerState {
        ServerState { incarnation: BOOTSTRAP_INCARNATION, last_primary: owners(cluster) }
    }

    /// Process `incarnation` of server `me`, whose files hold nothing (a rejoining process; its
    /// store was set aside). The other partitions' primaries are their cluster-file owners
    /// until a configuration is applied.
    pub fn holding_nothing(cluster: &Cluster, me: ServerId, incarnation: u64) -> ServerState {
        let mut state = ServerState { incarnation, last_primary: owners(cluster) };
        state.forget_own(me);
        state
    }

    /// The files of server `me` hold nothing any more (set aside for a rejoin).
    pub fn forget_own(&mut self, me: ServerId) {
        for primary in &mut self.last_primary {
            if *primary == Some(me) {
                *primary = None;
            }
        }
    }

    /// Whether server `me`'s files hold `partition` (as its primary's data).
    pub fn holds(&self, me: ServerId, partition: u32) -> bool {
        self.last_primary.get(partition as usize).is_some_and(|primary| *primary == Some(me))
    }

    /// The bytes of the file (module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(STATE_HEADER_BYTES + 2 * self.last_primary.len() + 4);
        bytes.extend_from_slice(STATE_MAGIC);
        bytes.extend_from_slice(&STATE_FORMAT.to_le_bytes());
        bytes.extend_from_slice(&self.incarnation.to_le_bytes());
        bytes.extend_from_slice(&(self.last_primary.len() as u32).to_le_bytes());
        for primary in &self.last_primary {
            bytes.extend_from_slice(&primary.unwrap_or(NO_PRIMARY).to_le_bytes());
        }
        let checksum = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Reads the bytes of the file (module docs).
    ///
    /// # Errors
    /// What does not check, said in words.
    pub fn decode(bytes: &[u8]) -> Result<ServerState, String> {
        if bytes.len() < STATE_HEADER_BYTES + 4 {
            return Err(format!("{} bytes, shorter than the smallest state", bytes.len()));
        }
        let (body, checksum) = bytes.split_at(bytes.len() - 4);
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        if &body[..8] != STATE_MAGIC {
            return Err("not a server state file (its magic)".into());
        }
        if u32_at(8) != STATE_FORMAT {
            return Err(format!("format {}, this build reads format {STATE_FORMAT}", u32_at(8)));
        }
        if crc32c::crc32c(body) != u32::from_le_bytes(checksum.try_into().expect("4 bytes")) {
            return Err("its checksum does not match (damaged)".into());
        }
        let incarnation = u64::from_le_bytes(body[12..20].try_into().expect("8 bytes"));
        let partitions = u32_at(20);
        if partitions > CLUSTER_PARTITIONS_MAX || body.len() != STATE_HEADER_BYTES + 2 * partitions as usize {
            return Err(format!("{partitions} partitions do not fit its {} bytes", bytes.len()));
        }
        let last_primary = body[STATE_HEADER_BYTES..]
            .chunks_exact(2)
            .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
            .map(|primary| (primary != NO_PRIMARY).then_some(primary))
            .collect();
        Ok(ServerState { incarnation, last_primary })
    }

    /// The state kept in data directory `dir`; `None` when it has none.
    ///
    /// # Errors
    /// A file that cannot be read or does not check ([`ResumeError::StateFile`]).
    pub fn read(dir: &Path) -> Result<Option<ServerState>, ResumeError> {
        let path = dir.join(SERVER_STATE_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(ResumeError::StateFile { path, problem: error.to_string() }),
        };
        ServerState::decode(&bytes).map(Some).map_err(|problem| ResumeError::StateFile { path, problem })
    }

    /// Writes the state into data directory `dir`, durably (module docs), before it returns.
    ///
    /// # Errors
    /// The file cannot be written ([`ResumeError::StateFile`]).
    pub fn write(&self, dir: &Path) -> Result<(), ResumeError> {
        std::fs::create_dir_all(dir)
            .and_then(|()| write_file_durably(dir, SERVER_STATE_FILE, &self.encode()))
            .map_err(|error| ResumeError::StateFile { path: dir.join(SERVER_STATE_FILE), problem: error.to_string() })
    }
}

/// The cluster-file owner of every partition.
fn owners(cluster: &Cluster) -> Vec<Option<ServerId>> {
    (0..cluster.partition_count())
        .map(|partition| cluster.owner_of_partition(partition).map(|owner| owner as ServerId))
        .collect()
}

/// How a replicated server process starts ([`start_config_node`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStart {
    /// With the cluster: it holds its cluster-file partitions and has its first lease.
    Bootstrap,
    /// It holds nothing: restarted into a running cluster, failed over while it was down, or
    /// failed over before it got its first lease. `why` says which.
    Rejoin { why: &'static str },
    /// From its data directory: the configuration of `epoch` still counts on its process.
    Resume {
        epoch: u64,
        /// The in-sync backups (server, incarnation) of the partitions it is primary of.
        backups: Vec<(usize, u64)>,
    },
}

/// A started configuration node and what the server does with it.
#[derive(Debug)]
pub struct ConfigStart {
    /// The server's lease gate over its node, its partitions' data marked as its files hold it.
    pub gate: Arc<LeaseGate>,
    pub start: ServerStart,
    /// What its files hold now (after a rejoin decided here: nothing of its own).
    pub state: ServerState,
}

/// Starts server `me`'s configuration node on its cluster-file `config` address and decides
/// how the server starts (module docs). With the cluster's shared `secret`, every connection
/// of its config port proves it (docs/security.md). With the server's `data_dir`, the node
/// keeps its Raft state in `data_dir/config` and the server its [`ServerState`] in `data_dir`.
///
/// # Errors
/// A cluster file the configuration refuses (no `config` addresses, ...), a port that cannot be
/// bound, Raft or server state that cannot be read (locked by another process, damaged, of
/// another cluster) or written, no leader (restarting) or no first lease (bootstrapping)
/// within `FAILOVER_FIRST_LEASE_WAIT_MS_MAX`.
pub fn start_config_node(
    cluster: &Cluster,
    me: usize,
    secret: Option<Arc<SharedSecret>>,
    data_dir: Option<&Path>,
) -> Result<ConfigStart, ResumeError> {
    let initial = Configuration::initial(cluster)?;
    let id = me as ServerId;
    let authenticator: Option<Arc<dyn PortAuthenticator>> =
        secret.map(|secret| Arc::new(ConfigPortAuth(secret)) as Arc<dyn PortAuthenticator>);
    let state_dir = data_dir.map(|dir| dir.join(CONFIG_STATE_DIR));
    let restarting = state_dir.as_ref().is_some_and(|dir| dir.join(rampkv_config::disk::STATE_FILE).exists());
    let saved = match data_dir {
        Some(dir) if restarting => ServerState::read(dir)?,
        _ => None,
    };
    let (mode, mut state) = match &saved {
        // Its incarnation: the process it ran as (without a state file, one that cannot be
        // admitted: it rejoins, below).
        Some(saved) => (StartMode::Restart, saved.clone()),
        None if restarting => (StartMode::Restart, ServerState::holding_nothing(cluster, id, random_id())),
        None => {
            let ask_timeout = Duration::from_millis(FAILOVER_CONFIG_ASK_TIMEOUT_MS);
            match rampkv_config::client::start_mode(&initial, id, ask_timeout, authenticator.as_deref()) {
                StartMode::Bootstrap => (StartMode::Bootstrap, ServerState::bootstrap(cluster)),
                mode => (mode, ServerState::holding_nothing(cluster, id, random_id())),
            }
        }
    };
    // On disk before the node first heartbeats with it: a restart finds the process it was.
    if let (Some(dir), None) = (data_dir, &saved) {
        state.write(dir)?;
    }
    let node = Arc::new(ConfigNode::start(NodeSettings {
        me: id,
        initial,
        mode,
        incarnation: state.incarnation,
        timing: Timing::default(),
        clock: Arc::new(HostClock),
        listener: None,
        log_entries_kept: CONFIG_LOG_ENTRIES_KEPT_MAX,
        authenticator,
        state_dir,
    })?);
    let wait = Duration::from_millis(FAILOVER_FIRST_LEASE_WAIT_MS_MAX);
    let start = match node.start_mode() {
        StartMode::Restart => {
            if !node.wait_caught_up(wait) {
                return Err(ResumeError::NoLeader { waited_ms: FAILOVER_FIRST_LEASE_WAIT_MS_MAX });
            }
            match decide_restart(&node.configuration(), id, node.incarnation()) {
                ServerStart::Resume { .. } => {
                    // As at a first start, it listens once it may serve as primary. Decided
                    // again then: a server restarted alone, down for about a lease, may be
                    // failed over while it waits (the leader's failure detector was already at
                    // it); it then rejoins rather than resume what it no longer has.
                    wait_for_resumed_lease(&node, id, wait);
                    decide_restart(&node.configuration(), id, node.incarnation())
                }
                start => start,
            }
        }
        StartMode::Bootstrap => {
            // Its listeners open only once it holds its first lease.
            let gate = LeaseGate::new(Arc::clone(&node), cluster, |partition| state.holds(id, partition));
            match gate.wait_for_lease(me, wait) {
                FirstLease::Held => ServerStart::Bootstrap,
                FirstLease::FailedOver => {
                    ServerStart::Rejoin { why: "the cluster failed this server over before it started" }
                }
                FirstLease::TimedOut => {
                    return Err(ResumeError::NoLease { waited_ms: FAILOVER_FIRST_LEASE_WAIT_MS_MAX })
                }
            }
        }
        StartMode::Rejoin => ServerStart::Rejoin { why: "rejoined a running cluster as a new incarnation" },
    };
    if matches!(start, ServerStart::Rejoin { .. }) && state.last_primary.contains(&Some(id)) {
        // Its store is set aside: its files hold nothing of its own from now on.
        state.forget_own(id);
        if let Some(dir) = data_dir {
            state.write(dir)?;
        }
    }
    let gate = Arc::new(LeaseGate::new(node, cluster, |partition| state.holds(id, partition)));
    Ok(ConfigStart { gate, start, state })
}

/// Waits (at most `timeout`) until a resuming server holds a lease for the partitions the
/// configuration makes it primary of, or the configuration no longer does (it was failed over
/// meanwhile: its failover thread deals with that as with any deposition). Without a lease a
/// client connecting to it would be refused (`NotPrimary`) for the moment it takes.
fn wait_for_resumed_lease(node: &ConfigNode, me: ServerId, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        let configuration = node.configuration();
        let primary_of: Vec<u32> =
            (0..configuration.partition_count()).filter(|p| configuration.primary_of(*p) == Some(me)).collect();
        if primary_of.iter().all(|partition| node.lease_valid(*partition)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The start of server `me`, process `incarnation`, restarted from its directory, once its
/// node caught up with `configuration` (module docs).
fn decide_restart(configuration: &Configuration, me: ServerId, incarnation: u64) -> ServerStart {
    let sets = configuration.replica_sets();
    let roles = sets.iter().any(|set| set.primary == Some(me) || set.backups.contains(&me));
    if !configuration.is_admitted(me, incarnation) || !roles {
        return ServerStart::Rejoin { why: "the configuration service failed this server over while it was down" };
    }
    let mut backups: Vec<(usize, u64)> = sets
        .iter()
        .filter(|set| set.primary == Some(me))
        .flat_map(|set| set.backups.iter())
        .map(|backup| (usize::from(*backup), configuration.server(*backup).map_or(0, |info| info.incarnation)))
        .collect();
    backups.sort_unstable();
    backups.dedup();
    ServerStart::Resume { epoch: configuration.epoch(), backups }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(servers: usize) -> Cluster {
        let addresses: Vec<String> = (0..servers).map(|index| format!("127.0.0.1:{}", 7001 + index)).collect();
        let config: Vec<String> = (0..servers).map(|index| format!("127.0.0.1:{}", 8001 + index)).collect();
        Cluster::with_servers(addresses).unwrap().with_replicas(2).unwrap().with_config_addresses(config).unwrap()
    }

    /// The state file round-trips, and every damage (a flipped bit anywhere, a cut, another
    /// format, partitions that do not fit) is an error, never a state.
    #[test]
    fn the_state_file_round_trips_and_refuses_every_damage() {
        let state =
            ServerState { incarnation: 0x1234_5678_9abc_def0, last_primary: vec![Some(0), None, Some(2), Some(1)] };
        let bytes = state.encode();
        assert_eq!(bytes.len(), STATE_HEADER_BYTES + 2 * 4 + 4);
        assert_eq!(ServerState::decode(&bytes).unwrap(), state);
        for index in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[index] ^= 1 << bit;
                assert!(ServerState::decode(&damaged).is_err(), "byte {index} bit {bit}");
            }
        }
        for length in 0..bytes.len() {
            assert!(ServerState::decode(&bytes[..length]).is_err(), "cut at {length}");
        }
        let directory = tempfile::tempdir().unwrap();
        assert_eq!(ServerState::read(directory.path()).unwrap(), None, "no file: no state");
        state.write(directory.path()).unwrap();
        assert_eq!(ServerState::read(directory.path()).unwrap(), Some(state));
        std::fs::write(directory.path().join(SERVER_STATE_FILE), b"RKVSTATE garbage").unwrap();
        let error = ServerState::read(directory.path()).unwrap_err();
        assert!(error.to_string().contains(SERVER_STATE_FILE), "{error}");
    }

    /// A bootstrapping server's files hold its cluster-file partitions; a rejoining one's hold
    /// nothing of its own.
    #[test]
    fn a_bootstrapping_server_holds_its_partitions_and_a_rejoining_one_nothing() {
        let cluster = cluster(3);
        let bootstrap = ServerState::bootstrap(&cluster);
        assert_eq!(bootstrap.incarnation, BOOTSTRAP_INCARNATION);
        for partition in 0..cluster.partition_count() {
            let owner = cluster.owner_of_partition(partition).unwrap() as ServerId;
            assert!(bootstrap.holds(owner, partition));
        }
        let rejoining = ServerState::holding_nothing(&cluster, 1, 77);
        assert!((0..cluster.partition_count()).all(|partition| !rejoining.holds(1, partition)));
        assert!((0..cluster.partition_count()).any(|partition| rejoining.holds(0, partition)));
    }

    /// A restarted process resumes only while the configuration admits its incarnation and
    /// gives it a role; its backups are those of the partitions it is primary of.
    #[test]
    fn a_restarted_server_resumes_only_what_the_configuration_still_gives_its_process() {
        let cluster = cluster(3);
        let initial = Configuration::initial(&cluster).unwrap();
        match decide_restart(&initial, 0, BOOTSTRAP_INCARNATION) {
            ServerStart::Resume { epoch, backups } => {
                assert_eq!(epoch, initial.epoch());
                assert_eq!(backups, vec![(1, BOOTSTRAP_INCARNATION)]);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(decide_restart(&initial, 0, 99), ServerStart::Rejoin { .. }),
            "another incarnation is not admitted"
        );
        // Server 0 failed over: promoted backup 1, removed from server 2's replica set.
        use rampkv_config::configuration::{Change, Proposal};
        let mut changes = Vec::new();
        for partition in 0..initial.partition_count() {
            let set = initial.replica_set(partition).unwrap();
            if set.primary == Some(0) {
                changes.push(Change::Promote { partition, server: 1 });
            } else if set.backups.contains(&0) {
                changes.push(Change::RemoveReplica { partition, server: 0 });
            }
        }
        let failed = initial.apply(&Proposal { base_epoch: initial.epoch(), changes }).unwrap();
        assert!(matches!(decide_restart(&failed, 0, BOOTSTRAP_INCARNATION), ServerStart::Rejoin { .. }));
        // Server 1 is primary of its own partitions (backup 2) and of server 0's (no backup
        // left); server 2 of its own, whose backup 0 was removed, and a backup of server 1's.
        match decide_restart(&failed, 1, BOOTSTRAP_INCARNATION) {
            ServerStart::Resume { epoch, backups } => {
                assert_eq!(epoch, failed.epoch());
                assert_eq!(backups, vec![(2, BOOTSTRAP_INCARNATION)]);
            }
            other => panic!("{other:?}"),
        }
        match decide_restart(&failed, 2, BOOTSTRAP_INCARNATION) {
            ServerStart::Resume { backups, .. } => assert!(backups.is_empty(), "{backups:?}"),
            other => panic!("{other:?}"),
        }
    }
}
