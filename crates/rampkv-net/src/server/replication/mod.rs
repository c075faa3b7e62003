//! Synchronous replication of a server's record stream to its backups, over TCP or one-sided
//! into a log region each backup registers ([`ReplicationMedium`]; the one-sided medium is in
//! `log_region`: FaRM's way, the backup applying off the primary's critical path).
//!
//! # Contract (in short: each room's docs hold the whole of its part)
//! - Every acknowledged PREPARE or COMMIT is in the memory of f + 1 servers: a call's replies
//!   are held until every backup of its primary holds the call's last record (`primary`).
//! - A backup applies each primary's records in order to a separate copy of that primary's
//!   store, and refuses bad input without applying anything past it (`copy`, `backup`).
//! - A backup that is new, or missed records, catches up before it counts: a snapshot, then the
//!   records (`rejoin`), or only the records it missed when it kept its copy on disk (`delta`).
//! - A failed link holds the primary's writes until a committed configuration removes that
//!   backup; a backup that takes a copy over fences the copy's primary first (`fencing`).
//!
//! # Layout
//! One room per mechanism, its contract at its top. A room imports this module's shared types
//! and lower rooms only (`wire`, `log_region` < `primary`, `copy` < `delta`, `rejoin`,
//! `fencing` < `link`, `backup`); this module re-exports what the rest of the crate uses.
//! - `wire`: the replication port's bytes (hello, answer, markers, acknowledgements).
//! - `log_region`: the one-sided medium (the backup's log region, FaRM's way).
//! - `primary`: the primary's sequencer ([`Replicator`]): numbers each call's records, queues
//!   them to every link, and says how far every backup holds them.
//! - `link`: a link's life on the primary: connect, hello, write, take the acknowledgements.
//! - `copy`: a backup's copies of its primaries' stores ([`BackupStore`]) and the stream it
//!   reads them from.
//! - `backup`: the backup's side ([`BackupService`]): a primary's records applied in order,
//!   and what it refuses.
//! - `rejoin`: a backup that catches up: a snapshot, then the records, then in sync.
//! - `delta`: a restarted backup that kept its copy on disk gets only the records it missed.
//! - `fencing`: what a failed link holds, and how a takeover fences the copy's primary.

use std::net::SocketAddr;

use rampkv_core::storage::StoreError;
use rampkv_durable::RecordError;

use crate::auth::AuthError;
use crate::message::fabric::FabricHandle;

mod backup;
mod copy;
mod delta;
mod fencing;
mod link;
mod log_region;
mod primary;
mod rejoin;
mod wire;

pub use backup::BackupService;
pub use copy::{BackupStats, BackupStore, CopyPersistence};
pub(crate) use fencing::BackupTakeover;
pub use link::StreamStart;
pub use log_region::LogError;
pub use primary::{LagHistogram, ReplicationStats, Replicator};

/// Why a replication link or a backup's connection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicationError {
    #[error("backup {backup} ({address}): {error}")]
    Io { backup: usize, address: String, error: std::io::Error },
    #[error("backup {backup} ({address}): authentication: {error}")]
    Auth { backup: usize, address: String, error: AuthError },
    #[error("backup {backup} ({address}) refused epoch {epoch}: it has seen epoch {known} of this primary (fenced)")]
    StaleEpoch { backup: usize, address: String, epoch: u64, known: u64 },
    #[error(
        "backup {backup} ({address}) holds records up to {applied} but the primary starts at {first}: it needs \
         catching up (a snapshot and the log since)"
    )]
    NeedsCatchUp { backup: usize, address: String, applied: u64, first: u64 },
    #[error("backup {backup} ({address}) refused the hello as malformed")]
    HelloRefused { backup: usize, address: String },
    #[error("backup {backup} ({address}) already has a stream from this primary")]
    Busy { backup: usize, address: String },
    #[error("backup {backup} ({address}) sent a malformed {what}")]
    Malformed { backup: usize, address: String, what: &'static str },
    #[error("backup {backup} ({address}) stayed {bytes} bytes behind for {waited_ms} ms: treated as failed")]
    TooFarBehind { backup: usize, address: String, bytes: usize, waited_ms: u64 },
    #[error("the store took a record the codec refuses: {0}")]
    Encode(RecordError),
    #[error("replication stopped")]
    Stopped,
    #[error("backup {backup} was removed from the replica sets (failover)")]
    Removed { backup: usize },
    #[error("backup {backup} ({address}): a newer link of this primary took its place")]
    Superseded { backup: usize, address: String },
    /// The one-sided medium: the log region could not be set up, was closed, or failed.
    #[error("backup {backup} ({address}): log region: {error}")]
    Log { backup: usize, address: String, error: LogError },
}

/// Why a backup refused (and closed) a primary's connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupRefusal {
    #[error("malformed hello")]
    MalformedHello,
    #[error("hello of epoch {epoch} from primary {primary}: epoch {known} was seen (stale, fenced)")]
    StaleEpoch { primary: u16, epoch: u64, known: u64 },
    #[error("primary {primary} starts at record {first}, this backup holds up to {applied}: needs catching up")]
    NeedsCatchUp { primary: u16, first: u64, applied: u64 },
    #[error("primary {primary} already streams to this backup")]
    Busy { primary: u16 },
    #[error("record {lsn} of primary {primary}: {cause}")]
    BadRecord { primary: u16, lsn: u64, cause: RecordError },
    #[error("record of primary {primary}: {cause}")]
    BadFrame { primary: u16, cause: RecordError },
    #[error("record {lsn} of primary {primary} has epoch {found}, older than the stream's {epoch} (fenced)")]
    WrongEpoch { primary: u16, lsn: u64, found: u64, epoch: u64 },
    #[error("primary {primary} sent a malformed marker")]
    BadMarker { primary: u16 },
    #[error("primary {primary} sent {what} where a catch-up stream has its snapshot first")]
    SnapshotExpected { primary: u16, what: &'static str },
    #[error("snapshot of primary {primary}: {cause}")]
    BadSnapshot { primary: u16, cause: rampkv_durable::DurableError },
    #[error("snapshot of primary {primary}: a chunk of {length} bytes (at most {max})")]
    SnapshotChunk { primary: u16, length: usize, max: usize },
    #[error("snapshot of primary {primary} not finished within {waited_ms} ms")]
    SnapshotTooSlow { primary: u16, waited_ms: u64 },
    #[error("record {found} of primary {primary} out of order: expected {expected}")]
    OutOfOrder { primary: u16, found: u64, expected: u64 },
    #[error("primary {primary} was failed over: this server serves its copy now (its records are fenced)")]
    Fenced { primary: u16 },
    #[error("record {lsn} of primary {primary}: the store refused it: {cause}")]
    StoreRefused { primary: u16, lsn: u64, cause: StoreError },
    #[error("authentication: {0}")]
    Auth(AuthError),
    #[error("the copy of primary {primary} cannot be kept on disk: {cause}")]
    CopyNotKept { primary: u16, cause: String },
    #[error("log region of primary {primary}: {error}")]
    Log { primary: u16, error: LogError },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How a primary's records reach its backups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ReplicationMedium {
    /// Messages on the replication port's TCP connection; a backup holds a record once it
    /// applied it and said so.
    #[serde(rename = "tcp")]
    Tcp,
    /// One-sided writes into a log region the backup registered on the process's fabric
    /// (FaRM's way): shared memory with a backup on this host, RDMA WRITE with one on another
    /// host where both have an RDMA port; a backup holds a record once the write completed into
    /// its open region, and applies it off the primary's critical path. A backup whose region
    /// cannot be reached so gets this primary's records over TCP instead (`log_region`).
    #[default]
    #[serde(rename = "onesided")]
    OneSided,
}

impl ReplicationMedium {
    /// The name the command line and the cluster file use.
    pub fn name(self) -> &'static str {
        match self {
            ReplicationMedium::Tcp => "tcp",
            ReplicationMedium::OneSided => "onesided",
        }
    }

    /// The default for servers whose replication ports are `addresses`: one-sided when every
    /// one is a loopback address (the servers share the host, hence its fabric), TCP otherwise
    /// (a region on another host cannot be mapped).
    pub fn for_addresses<'a>(addresses: impl IntoIterator<Item = &'a str>) -> ReplicationMedium {
        let local = |address: &str| address.parse::<SocketAddr>().is_ok_and(|address| address.ip().is_loopback());
        if addresses.into_iter().all(local) {
            ReplicationMedium::OneSided
        } else {
            ReplicationMedium::Tcp
        }
    }
}

impl ReplicationMedium {
    /// A server process's default ([`ReplicationMedium::for_addresses`], with this process's
    /// fabric): one-sided also when the fabric has an RDMA port, as backups on other hosts with
    /// RDMA are then written by RDMA WRITE (a backup that cannot be reached one-sidedly gets
    /// TCP on its own, said in a log line).
    pub fn for_process<'a>(addresses: impl IntoIterator<Item = &'a str>) -> ReplicationMedium {
        match ReplicationMedium::for_addresses(addresses) {
            ReplicationMedium::Tcp if process_has_rdma() => ReplicationMedium::OneSided,
            medium => medium,
        }
    }
}

/// Whether this process's fabric (`--fabric`) has an RDMA port.
fn process_has_rdma() -> bool {
    <log_region::LogFabric as FabricHandle>::open().is_ok_and(|fabric| fabric.verbs().is_some())
}

/// A replication medium's name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replication medium {0:?}: expected tcp or onesided")]
pub struct UnknownMedium(pub String);

impl std::str::FromStr for ReplicationMedium {
    type Err = UnknownMedium;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "tcp" => Ok(ReplicationMedium::Tcp),
            "onesided" => Ok(ReplicationMedium::OneSided),
            other => Err(UnknownMedium(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests;
