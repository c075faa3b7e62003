//! Every bound and default of the configuration service, in one place.

/// Largest frame body on the configuration port. The largest message is a configuration of
/// `CLUSTER_PARTITIONS_MAX` partitions with `CLUSTER_REPLICAS_MAX` replicas each (about 20 B a
/// partition) inside a Raft snapshot, which stays under this bound.
pub const CONFIG_FRAME_BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Most connections one node accepts at once (peers and configuration clients); more are
/// closed at once.
pub const CONFIG_CONNECTIONS_MAX: usize = 256;

/// Most inbound connections that may be in their handshake at once (the shared-secret step
/// and the first frame); a new connection beyond it closes the oldest handshake, so silent
/// connections cannot hold every slot of `CONFIG_CONNECTIONS_MAX` and lock peers out (an
/// honest peer finishes in a round trip or two).
pub const CONFIG_HANDSHAKES_MAX: usize = 64;

/// An inbound connection must finish its handshake (the shared-secret step, when the cluster
/// has a secret, and its first frame) within this of being accepted, however it trickles.
pub const CONFIG_HANDSHAKE_TIMEOUT_MS: u64 = 5_000;

/// Messages queued for one peer while its connection is down or slow; past it, messages are
/// dropped (Raft and the heartbeats tolerate loss; a queue that grows without bound would not).
pub const CONFIG_PEER_QUEUE_MESSAGES_MAX: usize = 1024;

/// Events (messages from peers, reports from the server) queued for a node's driver thread.
pub const CONFIG_EVENT_QUEUE_MAX: usize = 8192;

/// How long connecting to a peer may take before the attempt is given up (and retried).
pub const CONFIG_CONNECT_TIMEOUT_MS: u64 = 200;

/// Pause between attempts to reach a peer that is down.
pub const CONFIG_RECONNECT_BACKOFF_MS: u64 = 50;

/// A connection silent this long after its handshake is dead or hung (peers heartbeat every
/// few tens of ms), and a configuration client must get its answer within it.
pub const CONFIG_IO_TIMEOUT_MS: u64 = 2_000;

/// A writer blocked this long on a peer's socket gives the connection up (the peer is hung).
pub const CONFIG_WRITE_TIMEOUT_MS: u64 = 500;

/// A configuration change proposed but not applied within this is forgotten; the leader may
/// propose again (its proposal may have been lost with a leader change).
pub const CONFIG_PROPOSAL_TIMEOUT_MS: u64 = 2_000;

/// A server the leader never heard from (a cluster's processes start one by one) is judged
/// failed only this long after the leader first judged failures.
pub const CONFIG_STARTUP_GRACE_MS: u64 = 5_000;

/// A lease-confirmation round (Raft ReadIndex) not answered within this is dropped; the
/// heartbeats it carried are answered by a later round.
pub const CONFIG_READ_INDEX_TIMEOUT_MS: u64 = 500;

/// Raft log entries kept after they are applied; past this, the log is compacted into a
/// snapshot (the configuration itself), so memory stays bounded over any run.
pub const CONFIG_LOG_ENTRIES_KEPT_MAX: u64 = 256;

/// Cache of a node's Raft state file (redb's page cache; the state is a configuration and a
/// few hundred small entries, far below it).
pub const CONFIG_STATE_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Most changes in one configuration change (one epoch): a change is per (partition, server).
pub const CONFIG_CHANGES_MAX: usize = 1 << 20;

/// Raft entries per append message (bounds message size with the frame bound above).
pub const CONFIG_RAFT_ENTRIES_PER_MESSAGE_MAX: u64 = 64;

/// Default tick of the Raft core and of the failure detector.
pub const DEFAULT_TICK_MS: u64 = 10;

/// Default interval at which every server heartbeats the configuration service.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 50;

/// Default lease a heartbeat buys. Six heartbeat intervals: five heartbeats in a row may be
/// lost or late before a live server loses its lease (see docs/replication.md, "Timing").
pub const DEFAULT_LEASE_MS: u64 = 300;

/// Default bound on how far two clocks may disagree about an elapsed time, in parts per
/// million. 1% is far above what quartz clocks do (tens of ppm); it is cheap margin.
pub const DEFAULT_CLOCK_DRIFT_PPM: u64 = 10_000;

/// Default Raft election timeout in ticks (randomised by raft-rs in [this, 2 x this)).
pub const DEFAULT_ELECTION_TICKS: usize = 10;

/// Default interval of the Raft leader's own heartbeats, in ticks.
pub const DEFAULT_RAFT_HEARTBEAT_TICKS: usize = 2;

/// The layout version of a node's Raft state on disk, written in `meta.format` (`disk.rs`).
pub const STATE_FORMAT: u32 = 1;
