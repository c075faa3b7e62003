//! The configuration service's errors: one enum for the layer.

use crate::ids::ServerId;

/// Why a configuration, a change, a message or a node was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The cluster asks for more copies of each partition than it has servers.
    #[error("{replicas} replicas need at least {replicas} servers, the cluster has {servers}")]
    TooFewServers { servers: usize, replicas: u32 },
    /// `replicas` is 0 or above the limit.
    #[error("need 1..={max} replicas, got {replicas}")]
    ReplicasOutOfRange { replicas: u32, max: u32 },
    /// No server, or more than the limit.
    #[error("need 1..={max} servers, got {servers}")]
    ServersOutOfRange { servers: usize, max: usize },
    /// No partition, or more than the limit.
    #[error("need 1..={max} partitions, got {partitions}")]
    PartitionsOutOfRange { partitions: usize, max: u32 },
    /// Two servers share an address.
    #[error("servers {first} and {second} share the address {address}")]
    DuplicateServer { first: ServerId, second: ServerId, address: String },
    /// A server of the configuration is not numbered by its position.
    #[error("server at position {position} is numbered {server}")]
    ServerOutOfPlace { position: usize, server: ServerId },
    /// A server the configuration service was started for is not in the cluster, or a message
    /// or change names one that is not.
    #[error("server {server} is not in the cluster ({servers} servers)")]
    UnknownServer { server: ServerId, servers: usize },
    /// A change names a partition the cluster does not have.
    #[error("partition {partition} does not exist ({partitions} partitions)")]
    UnknownPartition { partition: u32, partitions: usize },
    /// The cluster file gives no configuration-service address for a server.
    #[error("server {server} has no configuration-service address (`config` in the cluster file)")]
    MissingConfigAddress { server: ServerId },
    /// A partition's replica set breaks an invariant (named by `problem`).
    #[error("partition {partition}: {problem}")]
    BadReplicaSet { partition: u32, problem: ReplicaSetProblem },
    /// A change does not apply to the configuration it was made for.
    #[error("change {change} does not apply to partition {partition}: {problem}")]
    ChangeRefused { change: &'static str, partition: u32, problem: ReplicaSetProblem },
    /// A change was proposed against an older configuration than the current one.
    #[error("change made for epoch {base_epoch}, but the configuration is at epoch {epoch}")]
    StaleProposal { base_epoch: u64, epoch: u64 },
    /// A record, request or server carries an epoch older than the current configuration's.
    #[error("epoch {got} is stale: the configuration is at epoch {current}")]
    StaleEpoch { got: u64, current: u64 },
    /// A message or configuration belongs to another cluster (another cluster file).
    #[error("message of cluster {got:#018x}, but this is cluster {expected:#018x}")]
    WrongCluster { expected: u64, got: u64 },
    /// Bytes that do not decode: truncated, out of range or trailing.
    #[error("cannot decode {what}: {problem} at byte {offset}")]
    Decode { what: &'static str, problem: &'static str, offset: usize },
    /// A frame on the configuration port that is not one (magic, version, size or checksum).
    #[error("bad frame from {peer}: {problem}")]
    BadFrame { peer: String, problem: FrameProblem },
    /// A peer broke the protocol (a frame it may not send, or one naming the wrong server).
    #[error("peer {peer} broke the protocol: {problem}")]
    ProtocolViolation { peer: String, problem: &'static str },
    /// A node refused our request (answered with a refusal frame).
    #[error("{address} refused the request: {reason}")]
    Refused { address: String, reason: RefusalReason },
    /// The timing settings cannot give safe leases (named by `problem`).
    #[error("timing settings refused: {problem}")]
    BadTiming { problem: &'static str },
    /// The shared-secret step on a configuration-port connection failed (the cause in the
    /// words of the layer that implements the step: `crate::auth`).
    #[error("authentication with {peer} on the configuration port failed: {source}")]
    Authentication {
        peer: String,
        #[source]
        source: crate::auth::AuthFailure,
    },
    /// Socket errors (binding, connecting, reading, writing).
    #[error("{action} {address}: {error}")]
    Io { action: &'static str, address: String, error: std::io::Error },
    /// No configuration-service address answered.
    #[error("no configuration service answered (asked {asked} addresses; last error: {last})")]
    NoneAnswered { asked: usize, last: String },
    /// The node's Raft state on disk (`crate::disk`, the file named) cannot be read or written,
    /// or what it holds is damaged or belongs to another cluster.
    #[error("configuration-service state {}: {problem}", path.display())]
    State { path: std::path::PathBuf, problem: StateProblem },
    /// raft-rs refused an operation (its own message: foreign text).
    #[error("raft: {message}")]
    Raft { message: String },
    /// The cluster file does not describe a valid cluster (rendered cause from rampkv-core).
    #[error(transparent)]
    Cluster(#[from] rampkv_core::cluster::ClusterError),
}

/// What is wrong with a partition's replica set or a change to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaSetProblem {
    #[error("server {0} appears twice")]
    DuplicateMember(ServerId),
    #[error("server {0} is not in the cluster")]
    UnknownMember(ServerId),
    #[error("more members than the replication factor")]
    TooManyMembers,
    #[error("backups without a primary")]
    BackupsWithoutPrimary,
    #[error("server {0} is not an in-sync backup")]
    NotInSyncBackup(ServerId),
    #[error("server {0} is not catching up")]
    NotCatchingUp(ServerId),
    #[error("server {0} is already a member")]
    AlreadyMember(ServerId),
    #[error("server {0} is not a backup or catching up")]
    NotAReplica(ServerId),
    #[error("the partition still has a primary or in-sync backups")]
    StillServed,
    #[error("the partition has no primary to copy from")]
    NoPrimary,
    #[error("server {0} is not admitted (a member of an older incarnation remains)")]
    NotAdmitted(ServerId),
}

/// What is wrong with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameProblem {
    #[error("bad magic number")]
    Magic,
    #[error("unsupported version {0}")]
    Version(u8),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("body of {0} bytes is above the limit")]
    TooLarge(usize),
    #[error("checksum mismatch")]
    Checksum,
    #[error("body does not decode")]
    Body,
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

/// Why a node refused a request (sent in a refusal frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefusalReason {
    #[error("wrong cluster (another cluster file)")]
    WrongCluster,
    #[error("unknown server id")]
    UnknownServer,
    #[error("too many connections")]
    TooManyConnections,
    #[error("unexpected message")]
    Unexpected,
    #[error(
        "authentication required: this configuration service has a shared secret; start with --secret-file \
         naming the same file as its servers'"
    )]
    AuthenticationRequired,
}

impl RefusalReason {
    pub(crate) fn code(self) -> u8 {
        match self {
            RefusalReason::WrongCluster => 1,
            RefusalReason::UnknownServer => 2,
            RefusalReason::TooManyConnections => 3,
            RefusalReason::Unexpected => 4,
            RefusalReason::AuthenticationRequired => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<RefusalReason> {
        match code {
            1 => Some(RefusalReason::WrongCluster),
            2 => Some(RefusalReason::UnknownServer),
            3 => Some(RefusalReason::TooManyConnections),
            4 => Some(RefusalReason::Unexpected),
            5 => Some(RefusalReason::AuthenticationRequired),
            _ => None,
        }
    }
}

/// What is wrong with a node's Raft state on disk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateProblem {
    /// redb's own error: the file cannot be opened, read or written (I/O, locked by another
    /// process, pages that do not check).
    /// (Boxed: redb's error is large, and this one is rare.)
    #[error("{0}")]
    Database(Box<redb::Error>),
    /// The directory cannot be made.
    #[error("{0}")]
    Directory(std::io::Error),
    /// A value whose checksum fails or that does not decode.
    #[error("value {key} is damaged ({problem})")]
    Damaged { key: String, problem: &'static str },
    /// Values that check but do not fit together.
    #[error("inconsistent state: {problem}")]
    Inconsistent { problem: String },
    /// A layout this build does not know.
    #[error("layout version {found}, this build reads {}", crate::limits::STATE_FORMAT)]
    Format { found: u32 },
    /// The state belongs to another cluster (another cluster file: other servers or
    /// partitions), or to another group of voters.
    #[error("it belongs to another cluster ({problem}): give this cluster a directory of its own")]
    OtherCluster { problem: String },
    /// A new state was to be created where one is kept already (a node that kept its Raft
    /// state must restart from it, never start over: it could vote twice in a term).
    #[error("it holds Raft state already; the node restarts from it")]
    HoldsState,
    /// A restart was asked for where no state is kept.
    #[error("it holds no Raft state to restart from")]
    NoState,
    /// redb panicked on what the file holds (redb checks what it reads, but a panic on a
    /// damaged file is turned into this error, never into a crash of the server).
    #[error("damaged beyond what redb reports as an error (it panicked reading it)")]
    Unreadable,
}
