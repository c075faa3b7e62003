//! The server side of the protocol: a typed request in, a typed reply and typed effects out,
//! over the [`Store`] (raft-rs's shape: the core does no I/O).
//!
//! [`ServerCore::handle`] serves one [`Request`] that came over a connection and returns the
//! [`Reply`] for it, or nothing when it waits for a lock. What else it caused goes into
//! [`Effects`]: replies to *other* requests (an S2PL lock granted or aborted because this one
//! released its locks), the keys whose latest committed version advanced (the edge republishes
//! their GET\* item slots) and the keys a PREPARE marked "newer version prepared". The core does
//! not encode frames, touch shared memory or know that item slots exist: the front end encodes
//! a reply straight from the stored versions ([`Reply::encode_frame`], no copy of a value), the
//! in-process client takes it as a [`Response`] ([`Reply::into_response`], one copy), and the
//! edge applies the effects.
//!
//! # Persistence (and later replication)
//! When the edge asks for it ([`Effects::set_logging`]: the server has a data directory), every
//! change the call made to the store is also described in [`Effects::logged`], *after* it was
//! applied: a PREPARE as [`LogRecord::Prepare`], a COMMIT (or cooperative termination's commit)
//! as `Commit`, a PREPARE_COMMIT and an UPDATE that wrote as both, NoCC's PUT and S2PL's COMMIT_LOCKED as `Put`, and an abort (cooperative
//! termination's, or a STATUS that found the transaction unknown and marked it aborted) as
//! `Abort`. A request the store refused changed nothing and logs nothing. The edge appends
//! those records to the server's log and sets [`Effects::release_after`] to the position they
//! reach; every reply of the call (its own and the deferred ones) is held by the front end
//! until that position is durable. Without logging nothing is copied for it and replies go out
//! at once.
//!
//! A request is validated completely before it changes anything, so a refused request leaves
//! the store as it was. The core takes the time as an argument ([`Now`]): the monotonic clock
//! for garbage collection and lock deadlines, the wall clock for the timestamps clients send.
//!
//! # Timestamps from clients
//! A PREPARE, PREPARE_COMMIT, PUT, LOCK_WRITE, COMMIT or COMMIT_LOCKED whose timestamp no honest client issues
//! (0, client id 0, or further ahead of the server's wall clock than `TIMESTAMP_FUTURE_SKEW_MS`:
//! [`check_client_timestamp`]) is refused with a BAD_REQUEST error naming the timestamp, how far
//! ahead it is and the bound. Stored, such a version would pin its key: every later write is
//! older, hence invisible, and readers would carry the forged timestamp on (issue 15).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

mod keyspace;
mod update;

use super::locks::{LockDecision, LockMode, LockTable};
use super::ConnectionId;
use crate::cluster::Cluster;
use crate::limits::{
    CLIENT_IDS_MAX, GC_SWEEP_INTERVAL_MS, GC_SWEEP_KEYS_PER_TICK, KEY_BYTES_MAX, PREPARED_ABANDON_MS, TXN_KEYS_MAX,
    VALUE_BYTES_MAX,
};
use crate::storage::{
    InvalidPrepare, Key, Store, StoreError, StoreWrite, StoredMetadata, StoredWrites, SweepClock, SweepCursor, Version,
};
use crate::types::{check_client_timestamp, unix_ms_of_wall_clock_us, Expiry, Timestamp, TIMESTAMP_INITIAL};
use crate::wire::response::{
    append_versions_frame, append_versions_located_frame, append_versions_locked_frame, EntryRef,
};
use crate::wire::{
    ClusterView, ErrorCode, GetItem, Metadata, MetadataRef, Request, Response, Selector, TxnState, VersionItem, Write,
    WriteSet,
};

/// What a GET item is answered with: a stored version itself (shared, not copied), so that the
/// front end encodes the reply frame straight from the store.
#[derive(Debug, Clone)]
pub enum Answer {
    Version(Arc<Version>),
    /// LATEST_TS: the timestamp only.
    TimestampOnly(Timestamp),
    /// The initial value, or no candidate stored.
    Initial,
}

/// The reply to one request.
#[derive(Debug)]
pub enum Reply {
    /// GET: one answer per item, in request order.
    Versions(Vec<Answer>),
    /// GET_LOCATE: the answers, and the keys, whose item slots the edge fills in.
    Located { answers: Vec<Answer>, keys: Vec<Vec<u8>> },
    /// LOCK_READ granted: the answers, and per key its latest committed timestamp when the
    /// request arrived (S2PL evidence).
    Locked { answers: Vec<Answer>, on_arrival: Vec<Timestamp> },
    /// Every other reply (small: acknowledgements, errors, client ids, states).
    Response(Response),
}

impl Reply {
    /// Appends the reply frame for `request_id` to `out`. `locate` gives a GET_LOCATE key's
    /// item slot (the edge's item slots; `None`: the key has none).
    pub fn encode_frame(&self, request_id: u64, out: &mut Vec<u8>, locate: impl FnMut(&[u8]) -> Option<u32>) {
        match self {
            Reply::Versions(answers) => append_versions_frame(out, request_id, answer_entries(answers)),
            Reply::Located { answers, keys } => {
                let slots = keys.iter().map(|key| key.as_slice()).map(locate);
                append_versions_located_frame(out, request_id, answer_entries(answers), slots);
            }
            Reply::Locked { answers, on_arrival } => {
                append_versions_locked_frame(out, request_id, answer_entries(answers), on_arrival.iter().copied())
            }
            Reply::Response(response) => response.encode_frame(request_id, out),
        }
    }

    /// The reply as a client decodes it from the frame [`Reply::encode_frame`] writes, without
    /// the frame: a version's value is not copied but shared with the stored version
    /// (`shared_value`).
    pub fn into_response(self, locate: impl FnMut(&[u8]) -> Option<u32>) -> Response {
        let versions = |answers: &[Answer]| answers.iter().map(owned_item).collect::<Result<Vec<_>, _>>();
        let converted = match self {
            Reply::Response(response) => return response,
            Reply::Versions(answers) => versions(&answers).map(|items| Response::Versions { items }),
            Reply::Located { answers, keys } => versions(&answers).map(|items| Response::VersionsLocated {
                items,
                slots: keys.iter().map(|key| key.as_slice()).map(locate).collect(),
            }),
            Reply::Locked { answers, on_arrival } => {
                versions(&answers).map(|items| Response::VersionsLocked { items, on_arrival })
            }
        };
        converted.unwrap_or_else(|error| Response::bad_request(format!("a stored write set does not encode: {error}")))
    }
}

/// When a request is served: the server's monotonic clock (garbage collection, lock deadlines,
/// recovery) and its wall clock (microseconds since `types::CLOCK_EPOCH_UNIX_US`), which a
/// client's timestamp may not run ahead of by more than `TIMESTAMP_FUTURE_SKEW_MS`. The front
/// end reads both once per pass; a caller serving one request at a time may leave the wall
/// clock 0 for a request without a [`Request::written_timestamp`] (nothing reads it then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    pub monotonic_ms: u64,
    pub wall_clock_us: u64,
}

/// A reply to a request that arrived earlier, possibly on another connection of another front
/// end (an S2PL lock granted or aborted when another transaction released its locks).
#[derive(Debug)]
pub struct Addressed {
    pub connection: ConnectionId,
    pub request_id: u64,
    pub reply: Reply,
}

/// A position in the log of records that must be durable (and replicated) before a reply that
/// depends on them is released (a log sequence number of the server's log); see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogPosition(pub u64);

/// A change the core made to the store, described for the server's log (owned: the writes the
/// store took are copied for it, only when logging). The log's record codec encodes exactly
/// these four.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRecord {
    /// Versions stored prepared (a RAMP PREPARE), with the transaction's whole write set.
    /// `writes` are the versions stored, shared with the store (the log copies no value).
    Prepare { ts: Timestamp, metadata: StoredMetadata, write_set: WriteSet, writes: StoredWrites },
    /// Transaction `ts` made visible (a no-op for one not prepared here: logged all the same,
    /// so that its reply waits for every record before it).
    Commit { ts: Timestamp },
    /// Transaction `ts` aborted here: its prepared versions dropped, a late PREPARE refused.
    Abort { ts: Timestamp },
    /// Versions stored and made visible at once (NoCC PUT, S2PL COMMIT_LOCKED).
    Put { ts: Timestamp, writes: StoredWrites },
}

impl LogRecord {
    /// A PUT of `writes` held by no store (tests, tools): each value in a version of its own,
    /// that never expires.
    pub fn put(ts: Timestamp, writes: Vec<(Key, Box<[u8]>)>) -> LogRecord {
        let stored = |(key, value)| (key, Arc::new(Version::new(ts, value, StoredMetadata::None)));
        LogRecord::Put { ts, writes: writes.into_iter().map(stored).collect() }
    }
}

/// What serving a request caused besides its own reply. Reused across calls: the caller
/// clears it (allocation-free once warm).
#[derive(Debug, Default)]
pub struct Effects {
    /// Replies to other requests (S2PL grants and aborts), to route to their connections.
    pub replies: Vec<Addressed>,
    /// Keys whose latest committed version may have advanced (only when publishing).
    pub committed: Vec<Key>,
    /// Keys of which a newer version was prepared, with its timestamp (only when publishing).
    pub prepared: Vec<(Timestamp, Key)>,
    /// Keys the sweep removed after reclaiming them (expired), with the timestamp of their
    /// last version (only when publishing): their item slots go, unless a newer version has
    /// been published since.
    pub reclaimed: Vec<(Timestamp, Key)>,
    /// Every reply of this call waits until the log is durable up to here (`None`: at once).
    pub release_after: Option<LogPosition>,
    /// The changes this call made to the store, in the order made (only when logging).
    pub logged: Vec<LogRecord>,
    publishing: bool,
    logging: bool,
}

impl Effects {
    /// Effects of a server that publishes committed versions (`publishing`: fill `committed`
    /// and `prepared`; off, the core does not copy the keys for them).
    pub fn new(publishing: bool) -> Self {
        Self { publishing, ..Self::default() }
    }

    /// Whether `committed` and `prepared` are filled.
    pub fn publishing(&self) -> bool {
        self.publishing
    }

    /// Sets whether `committed` and `prepared` are filled (the edge does before each call: a
    /// server gains item slots when a front end with GET\* attaches them).
    pub fn set_publishing(&mut self, publishing: bool) {
        self.publishing = publishing;
    }

    /// Whether `logged` is filled.
    pub fn logging(&self) -> bool {
        self.logging
    }

    /// Sets whether `logged` is filled (the edge does before each call, when the server has a
    /// log).
    pub fn set_logging(&mut self, logging: bool) {
        self.logging = logging;
    }

    /// Empties every list, keeping their capacity and the publishing and logging settings.
    pub fn clear(&mut self) {
        self.replies.clear();
        self.committed.clear();
        self.prepared.clear();
        self.reclaimed.clear();
        self.logged.clear();
        self.release_after = None;
    }

    fn log(&mut self, record: impl FnOnce() -> LogRecord) {
        if self.logging {
            self.logged.push(record());
        }
    }

    fn note_committed(&mut self, keys: impl IntoIterator<Item = Key>) {
        if self.publishing {
            self.committed.extend(keys);
        }
    }
}

/// The request-handling state of one server.
#[derive(Debug)]
pub struct ServerCore {
    store: Store,
    /// S2PL locks. Every front end of a server group serves this core (the TCP poller and a
    /// fabric poller), so the table sits behind a mutex; only lock requests take it.
    locks: Mutex<LockTable>,
    /// Next client id to hand out (ids are 16 bits, never 0; they wrap after 65,535).
    next_client_id: AtomicU32,
    /// GET and GET_LOCATE requests served (statistics: how many reads GET\* saved).
    gets_served: AtomicU64,
    /// The cluster file this server was started with and its index in it, once known: keys
    /// outside its partitions are refused, and so is a HELLO from a client whose file differs.
    ownership: OnceLock<Ownership>,
    /// With replication and failover: the partitions it may serve now (see [`PartitionGate`]).
    gate: OnceLock<Arc<dyn PartitionGate>>,
    /// The background sweep: where it stands and when it runs next (whichever front end's
    /// timer gets the lock runs it).
    sweep: Mutex<Sweep>,
    /// A server without a cluster file ends prepared transactions this old (ms).
    prepared_abandon_ms: AtomicU64,
}

#[derive(Debug, Default)]
struct Sweep {
    cursor: SweepCursor,
    next_ms: u64,
}

/// Which partitions a replicated server may serve *now*: those it is the primary of in the
/// newest configuration it knows, while its lease holds (replication's failover, issue 16).
/// Asked for every key of every request, so it must be cheap; it lives outside the core
/// (the configuration service is I/O).
pub trait PartitionGate: Send + Sync + std::fmt::Debug {
    /// Whether this server may serve `partition` now.
    fn serves(&self, partition: u32) -> bool;
}

/// A server's place in its cluster file.
#[derive(Debug)]
struct Ownership {
    cluster: Cluster,
    index: usize,
}

impl Ownership {
    /// The refusal of `key` if this server does not own it (with a gate: does not serve its
    /// partition now).
    fn check(&self, key: &[u8], gate: Option<&Arc<dyn PartitionGate>>) -> Result<(), OwnershipError> {
        let partition = self.cluster.partition_of(key);
        if let Some(gate) = gate {
            if gate.serves(partition) {
                return Ok(());
            }
            return Err(OwnershipError::NotPrimary { partition, index: self.index });
        }
        let owner = self.cluster.owner_of_partition(partition).unwrap_or(usize::MAX);
        if owner == self.index {
            return Ok(());
        }
        let owner_address = self.cluster.servers().get(owner).cloned().unwrap_or_default();
        let key = String::from_utf8_lossy(&key[..key.len().min(64)]).into_owned();
        Err(OwnershipError::NotOwned { key, partition, owner, owner_address, index: self.index })
    }

    fn view(&self) -> ClusterView {
        ClusterView { partitions: self.cluster.partition_count(), server_index: self.index as u32 }
    }
}

/// Why a server refuses a request for a key, or a client's HELLO, under its cluster file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OwnershipError {
    #[error(
        "key {key:?} is in partition {partition}, which server {owner} ({owner_address}) owns, not this server \
         ({index}): the client's cluster file differs from the servers'"
    )]
    NotOwned { key: String, partition: u32, owner: usize, owner_address: String, index: usize },
    #[error(
        "this server ({index}) is not the primary of partition {partition} now (failed over, or its lease \
         lapsed): ask the configuration service for the current primary"
    )]
    NotPrimary { partition: u32, index: usize },
    #[error(
        "cluster files differ: the client's has {client_partitions} partitions and calls this server {client_index}; \
         this server's has {partitions} partitions and it is server {index}"
    )]
    ClusterMismatch { client_partitions: u32, client_index: u32, partitions: u32, index: usize },
}

impl ServerCore {
    /// A server whose store keeps superseded versions for `gc_grace_ms`.
    pub fn new(gc_grace_ms: u64) -> Self {
        Self {
            store: Store::new_tracking_reads(gc_grace_ms),
            locks: Mutex::new(LockTable::default()),
            next_client_id: AtomicU32::new(1),
            gets_served: AtomicU64::new(0),
            ownership: OnceLock::new(),
            gate: OnceLock::new(),
            sweep: Mutex::new(Sweep::default()),
            prepared_abandon_ms: AtomicU64::new(PREPARED_ABANDON_MS),
        }
    }

    /// How long a server without a cluster file waits for a prepared transaction's COMMIT
    /// before it ends it (default `PREPARED_ABANDON_MS`; tests shorten it).
    pub fn set_prepared_abandon_ms(&self, abandon_ms: u64) {
        self.prepared_abandon_ms.store(abandon_ms, Ordering::Relaxed);
    }

    /// The core's timer: at most every `GC_SWEEP_INTERVAL_MS`, sweeps up to
    /// `GC_SWEEP_KEYS_PER_TICK` keys (collecting superseded versions of keys not written again),
    /// and, on a server without a cluster file (no recovery will resolve them), ends the
    /// prepared transactions older than the abandon timeout: their versions are dropped and a
    /// late COMMIT gets an error. With a cluster file, cooperative termination resolves them.
    /// The same sweep reclaims expired keys by the server's wall clock (`now.wall_clock_us`; 0:
    /// none is); the keys it removed go to `effects.reclaimed` when publishing (their item slots
    /// are freed). Returns the keys swept (0: not its time, or another front end is sweeping).
    pub fn tick(&self, now: Now, effects: &mut Effects) -> usize {
        let now_ms = now.monotonic_ms;
        let Some(mut sweep) = self.sweep.try_lock() else { return 0 };
        if now_ms < sweep.next_ms {
            return 0;
        }
        sweep.next_ms = now_ms + GC_SWEEP_INTERVAL_MS;
        let unix_ms = if now.wall_clock_us == 0 { 0 } else { unix_ms_of_wall_clock_us(now.wall_clock_us) };
        let clock = SweepClock { monotonic_ms: now_ms, unix_ms };
        let removed = effects.publishing.then_some(&mut effects.reclaimed);
        let swept = self.store.sweep(&mut sweep.cursor, GC_SWEEP_KEYS_PER_TICK, clock, removed);
        if self.ownership.get().is_none() {
            let abandon_ms = self.prepared_abandon_ms.load(Ordering::Relaxed);
            if let Some(prepared_before_ms) = now_ms.checked_sub(abandon_ms) {
                for (ts, _) in self.store.stale_pending(prepared_before_ms) {
                    self.store.abort(ts, now_ms);
                }
            }
        }
        swept
    }

    /// Makes this server server `index` of `cluster`: from now on it refuses requests for keys
    /// outside its partitions and HELLOs from clients whose cluster file differs. Once only: a
    /// second call (or `index` beyond the cluster) returns false and changes nothing.
    pub fn join_cluster(&self, cluster: Cluster, index: usize) -> bool {
        index < cluster.servers().len() && self.ownership.set(Ownership { cluster, index }).is_ok()
    }

    /// Serves only the partitions `gate` allows from now on (replication's failover: the
    /// configuration service's leases), instead of those its cluster file gives it, and takes
    /// a HELLO naming another server whose partitions it serves now. Once only (false after).
    pub fn set_gate(&self, gate: Arc<dyn PartitionGate>) -> bool {
        self.gate.set(gate).is_ok()
    }

    /// Whether this server serves `key` now: its cluster file gives it the key's partition
    /// (true without a cluster file), and with a gate (failover) the gate says it serves the
    /// partition now. Recovery asks it before it decides a transaction prepared here: a
    /// deposed primary's store is no longer the partition's, so it must decide nothing from it.
    pub fn serves_key(&self, key: &[u8]) -> bool {
        self.ownership.get().is_none_or(|ownership| ownership.check(key, self.gate.get()).is_ok())
    }

    /// Its index in the cluster it joined, once it joined one.
    pub fn cluster_index(&self) -> Option<usize> {
        self.ownership.get().map(|ownership| ownership.index)
    }

    /// GET and GET_LOCATE requests this server has served.
    pub fn gets_served(&self) -> u64 {
        self.gets_served.load(Ordering::Relaxed)
    }

    /// The store, for statistics, recovery and tests.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Commits transaction `ts` in the store (as a COMMIT request does); the keys it advanced
    /// go to `effects`. Recovery uses it, so that what it commits is republished.
    pub fn commit(&self, ts: Timestamp, effects: &mut Effects) -> usize {
        let keys = self.store.commit_keys(ts);
        let count = keys.len();
        effects.note_committed(keys);
        effects.log(|| LogRecord::Commit { ts });
        count
    }

    /// Aborts transaction `ts` in the store (cooperative termination decided so): its prepared
    /// versions are dropped and a late PREPARE of it is refused.
    pub fn abort(&self, ts: Timestamp, now_ms: u64, effects: &mut Effects) {
        self.store.abort(ts, now_ms);
        effects.log(|| LogRecord::Abort { ts });
    }

    /// Serves one request that came over `connection`. Returns its reply, or `None` when it
    /// waits for locks (its reply comes later, in the effects of another call). Replies to
    /// other waiting requests it unblocks, and what must be republished, go to `effects`.
    pub fn handle(
        &self,
        connection: ConnectionId,
        request: Request,
        request_id: u64,
        now: Now,
        effects: &mut Effects,
    ) -> Option<Reply> {
        let plain = |response: Response| Some(Reply::Response(response));
        if let Some(ts) = request.written_timestamp() {
            if let Err(error) = check_client_timestamp(ts, now.wall_clock_us) {
                return plain(Response::bad_request(error.to_string()));
            }
        }
        if let Err(error) = self.check_ownership(&request) {
            let code = match error {
                OwnershipError::NotPrimary { .. } => ErrorCode::NotPrimary,
                _ => ErrorCode::BadRequest,
            };
            return plain(Response::Error { code, message: error.to_string() });
        }
        let now_ms = now.monotonic_ms;
        match request {
            Request::Hello { client_ids_wanted, cluster } => plain(self.hello(client_ids_wanted, cluster)),
            Request::Get { items } => Some(self.get(&items, now_ms).map_or_else(Reply::Response, Reply::Versions)),
            Request::GetLocate { items } => Some(match self.get(&items, now_ms) {
                Ok(answers) => Reply::Located { answers, keys: items.into_iter().map(|item| item.key).collect() },
                Err(error) => Reply::Response(error),
            }),
            Request::Prepare { ts, metadata, write_set, writes } => {
                plain(ack_or_error(self.prepare(ts, metadata, write_set, writes, now_ms, effects)))
            }
            Request::PrepareCommit { ts, metadata, write_set, writes } => {
                plain(ack_or_error(self.prepare_commit(ts, metadata, write_set, writes, now_ms, effects)))
            }
            Request::Commit { ts } => {
                // Nothing committed: an unknown or already committed ts (a retried COMMIT: an
                // ACK), or one that was ended unresolved (its versions are gone: an error).
                if self.commit(ts, effects) == 0 && self.store.was_aborted(ts) {
                    let message = format!(
                        "transaction {ts} was ended without a COMMIT (recovery aborted it, or no COMMIT came \
                         for {} ms); its prepared versions were dropped",
                        self.prepared_abandon_ms.load(Ordering::Relaxed)
                    );
                    return plain(Response::bad_request(message));
                }
                plain(Response::Ack)
            }
            Request::Put { ts, writes } => plain(ack_or_error(self.put(ts, stored_writes(writes), now_ms, effects))),
            Request::Status { ts, keys } => {
                let keys: Vec<Key> = keys.into_iter().map(Vec::into_boxed_slice).collect();
                let state = self.store.status(ts, &keys, now_ms);
                if state == TxnState::Unknown {
                    // Never prepared here: the store now refuses it for good, which must
                    // survive a restart (the writer may still be sending its PREPARE).
                    effects.log(|| LogRecord::Abort { ts });
                }
                plain(Response::Status { state })
            }
            Request::LockRead { ts, keys } => {
                let keys: Vec<Key> = keys.into_iter().map(Vec::into_boxed_slice).collect();
                let decisions = {
                    let mut locks = self.locks.lock();
                    // What a read taking no lock would return now: the evidence that the lock
                    // wait, if any, mattered (taken under the lock table, as the grant is).
                    let on_arrival = keys.iter().map(|key| self.store.last_commit(key)).collect();
                    locks.request_read(ts, (connection, request_id), keys, on_arrival, now_ms)
                };
                self.decide(decisions, connection, request_id, effects)
            }
            Request::LockWrite { ts, writes } => {
                let writes = stored_writes(writes);
                if let Err(error) = validate_writes(&writes) {
                    return plain(Response::bad_request(error.to_string()));
                }
                let keys = staged_keys(&writes);
                let decisions =
                    self.locks.lock().request(ts, LockMode::Exclusive, connection, request_id, keys, writes, now_ms);
                self.decide(decisions, connection, request_id, effects)
            }
            Request::CommitLocked { ts } => {
                // The staged writes are applied before the locks go (the lock table stays locked
                // until they are): another front end's thread (an in-process client serves on its
                // own) granted a lock in between would read the old values, and a reader that read
                // another key of the transaction on another server already saw the new ones: a
                // fractured read (seen once in `tests/inprocess.rs` under load).
                let mut locks = self.locks.lock();
                let (staged, decisions) = locks.finish(ts);
                let applied = if staged.is_empty() { Ok(()) } else { self.put(ts, staged, now_ms, effects) };
                drop(locks);
                self.route_decisions(decisions, effects);
                plain(ack_or_error(applied))
            }
            Request::Release { ts } => {
                let (_, decisions) = self.locks.lock().finish(ts);
                self.route_decisions(decisions, effects);
                plain(Response::Ack)
            }
            Request::ListKeys(list) => Some(self.list_keys(list, now)),
            Request::CountKeys(count) => Some(self.count_keys(count, now)),
            Request::Update { ts, metadata, key, op } => plain(self.update(ts, metadata, key, &op, now, effects)),
        }
    }

    /// Refuses a request for a key this server does not own, or a HELLO from a client whose
    /// cluster file differs (a server with no cluster file checks nothing).
    fn check_ownership(&self, request: &Request) -> Result<(), OwnershipError> {
        let Some(ownership) = self.ownership.get() else { return Ok(()) };
        let gate = self.gate.get();
        let check = |key: &[u8]| ownership.check(key, gate);
        match request {
            Request::Hello { cluster: Some(view), .. } => {
                let own = ownership.view();
                if *view == own || (view.partitions == own.partitions && self.serves_server(ownership, view)) {
                    return Ok(());
                }
                if gate.is_some() && view.partitions == own.partitions {
                    // The same cluster: this server does not serve that server's partitions
                    // (not yet taken over, or it was deposed), which a retry after learning
                    // the configuration fixes.
                    let named = view.server_index as usize;
                    let partition = ownership.cluster.partitions_of(named).next().unwrap_or(0);
                    return Err(OwnershipError::NotPrimary { partition, index: ownership.index });
                }
                Err(OwnershipError::ClusterMismatch {
                    client_partitions: view.partitions,
                    client_index: view.server_index,
                    partitions: own.partitions,
                    index: ownership.index,
                })
            }
            Request::Get { items } | Request::GetLocate { items } => items.iter().try_for_each(|item| check(&item.key)),
            Request::Prepare { writes, .. }
            | Request::PrepareCommit { writes, .. }
            | Request::Put { writes, .. }
            | Request::LockWrite { writes, .. } => writes.iter().try_for_each(|write| check(&write.key)),
            Request::LockRead { keys, .. } => keys.iter().try_for_each(|key| check(key)),
            Request::Update { key, .. } => check(key),
            // With a gate (failover), a COMMIT is checked against the keys it would commit
            // here, and a STATUS against its keys: a deposed primary must neither commit what
            // its successor may have resolved otherwise nor answer for partitions it lost.
            Request::Commit { ts } if gate.is_some() => {
                self.store.pending_keys(*ts).iter().try_for_each(|key| check(key))
            }
            Request::Status { keys, .. } if gate.is_some() => keys.iter().try_for_each(|key| check(key)),
            // COMMIT, COMMIT_LOCKED and RELEASE name no key; STATUS asks about the keys a
            // prepared transaction wrote here (recovery), answered from what is stored.
            _ => Ok(()),
        }
    }

    /// With a gate: whether this server serves every partition the cluster file gives server
    /// `view.server_index` now (it took them over), so a client may call it that server.
    fn serves_server(&self, ownership: &Ownership, view: &ClusterView) -> bool {
        let Some(gate) = self.gate.get() else { return false };
        let named = view.server_index as usize;
        let mut partitions = ownership.cluster.partitions_of(named).peekable();
        partitions.peek().is_some() && partitions.all(|partition| gate.serves(partition))
    }

    /// Aborts lock waits past their deadline; their replies go to `effects`.
    pub fn expire_lock_waits(&self, now_ms: u64, effects: &mut Effects) {
        let decisions = self.locks.lock().expire(now_ms);
        self.route_decisions(decisions, effects);
    }

    /// When the next lock wait expires (the front end wakes up then), if any waits.
    pub fn next_lock_deadline_ms(&self) -> Option<u64> {
        self.locks.lock().next_deadline_ms()
    }

    /// A connection closed: the transactions it was running release their locks; the replies
    /// this unblocks go to `effects`.
    pub fn connection_closed(&self, connection: ConnectionId, effects: &mut Effects) {
        let decisions = self.locks.lock().release_connection(connection);
        self.route_decisions(decisions, effects);
    }

    /// Stores `writes` and makes them visible at once (NoCC PUT, S2PL COMMIT_LOCKED).
    fn put(
        &self,
        ts: Timestamp,
        writes: Vec<StoreWrite>,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Result<(), StoreError> {
        let keys = effects.publishing.then(|| staged_keys(&writes));
        let mut stored = StoredWrites::new();
        self.store.put_keeping(ts, writes, now_ms, effects.logging.then_some(&mut stored))?;
        effects.note_committed(keys.into_iter().flatten());
        if effects.logging {
            effects.logged.push(LogRecord::Put { ts, writes: stored });
        }
        Ok(())
    }

    fn prepare(
        &self,
        ts: Timestamp,
        metadata: Metadata,
        write_set: Vec<Vec<u8>>,
        writes: Vec<Write>,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Result<(), StoreError> {
        let (metadata, write_set) = stored_write_set(metadata, write_set)?;
        let writes = stored_writes(writes);
        let keys = effects.publishing.then(|| staged_keys(&writes));
        self.prepare_stored(ts, metadata, write_set, writes, now_ms, effects)?;
        effects.prepared.extend(keys.into_iter().flatten().map(|key| (ts, key)));
        Ok(())
    }

    /// PREPARE_COMMIT: a transaction whose whole write set is on this server, prepared and
    /// committed in one call. Sound for RAMP because every version of the transaction is stored
    /// (prepared) before any becomes visible, exactly as after PREPARE's acknowledgement and a
    /// COMMIT: a reader that sees one of them and repairs the others in round 2 finds them.
    /// That no other server holds part of it is checked (the write set names exactly the keys
    /// written), so a client cannot make a fraction of a wider transaction visible this way.
    /// Nothing is marked "newer version prepared" (the edge would mark a slot and republish it
    /// at once: there is no window in which the version is only prepared to advise readers
    /// about), and the log gets the PREPARE and the COMMIT record, as for the two requests.
    fn prepare_commit(
        &self,
        ts: Timestamp,
        metadata: Metadata,
        write_set: Vec<Vec<u8>>,
        writes: Vec<Write>,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Result<(), StoreError> {
        let (metadata, write_set) = stored_write_set(metadata, write_set)?;
        let writes = stored_writes(writes);
        let whole = !write_set.is_empty()
            && write_set.iter().all(|key| writes.iter().any(|written| *written.key == *key))
            && writes.iter().all(|written| write_set.contains(&written.key));
        if !whole {
            return Err(StoreError::InvalidPrepare(InvalidPrepare::NotWholeWriteSet));
        }
        // Stored and committed in one store call (no pending entry); logged as the PREPARE
        // and COMMIT records the two requests would have logged.
        let logged = effects.logging.then(|| (metadata.clone(), write_set));
        let mut stored = StoredWrites::new();
        let stored_out = logged.is_some().then_some(&mut stored);
        let committed_out = effects.publishing.then_some(&mut effects.committed);
        self.store.prepare_commit_keeping(ts, metadata, writes, now_ms, stored_out, committed_out)?;
        if let Some((metadata, write_set)) = logged {
            effects.logged.push(LogRecord::Prepare { ts, metadata, write_set, writes: stored });
        }
        effects.log(|| LogRecord::Commit { ts });
        Ok(())
    }

    /// Stores prepared versions (PREPARE and PREPARE_COMMIT), and their log record when logging.
    fn prepare_stored(
        &self,
        ts: Timestamp,
        metadata: StoredMetadata,
        write_set: WriteSet,
        writes: Vec<StoreWrite>,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Result<(), StoreError> {
        let logged = effects.logging.then(|| (metadata.clone(), write_set.clone()));
        let mut stored = StoredWrites::new();
        self.store.prepare_keeping(ts, metadata, write_set, writes, now_ms, logged.is_some().then_some(&mut stored))?;
        if let Some((metadata, write_set)) = logged {
            effects.logged.push(LogRecord::Prepare { ts, metadata, write_set, writes: stored });
        }
        Ok(())
    }

    /// The reply of the request being handled among `decisions` (none: it waits), the others
    /// to `effects`.
    fn decide(
        &self,
        decisions: Vec<LockDecision>,
        connection: ConnectionId,
        request_id: u64,
        effects: &mut Effects,
    ) -> Option<Reply> {
        let start = effects.replies.len();
        self.route_decisions(decisions, effects);
        let own = effects.replies[start..]
            .iter()
            .position(|reply| reply.connection == connection && reply.request_id == request_id)?;
        Some(effects.replies.remove(start + own).reply)
    }

    /// Serves granted lock requests (reads answered, writes staged) and aborted ones.
    fn route_decisions(&self, decisions: Vec<LockDecision>, effects: &mut Effects) {
        for decision in decisions {
            let (request, reply) = match decision {
                LockDecision::Granted(request) => {
                    let reply = match request.mode {
                        LockMode::Shared => {
                            let answers = request
                                .keys
                                .iter()
                                .map(|key| self.store.get_latest(key).map_or(Answer::Initial, Answer::Version))
                                .collect();
                            match request.on_arrival.len() == request.keys.len() {
                                true => Reply::Locked { answers, on_arrival: request.on_arrival },
                                false => Reply::Versions(answers), // a request without arrival timestamps
                            }
                        }
                        LockMode::Exclusive => {
                            self.locks.lock().stage(request.ts, request.writes);
                            Reply::Response(Response::Ack)
                        }
                    };
                    ((request.connection, request.request_id), reply)
                }
                LockDecision::Aborted(request) => {
                    let message = format!("transaction {} aborted (wait-die or lock timeout); retry", request.ts);
                    let reply = Reply::Response(Response::Error { code: ErrorCode::Aborted, message });
                    ((request.connection, request.request_id), reply)
                }
            };
            let (connection, request_id) = request;
            effects.replies.push(Addressed { connection, request_id, reply });
        }
    }

    /// Hands out client ids; answers with the server's place in the cluster (the client's
    /// `asked` view once accepted: a server that took over another's partitions answers as it).
    fn hello(&self, wanted: u16, asked: Option<ClusterView>) -> Response {
        let wanted = u32::from(wanted.max(1));
        let first = self.next_client_id.fetch_add(wanted, Ordering::Relaxed);
        // Ids wrap within 1..=CLIENT_IDS_MAX; a block never straddles the wrap. With failover,
        // another server hands out ids for this one's clients once it took over, so each
        // server keeps to a band of its own (timestamps end in the client id: two servers
        // counting from 1 would give two live clients one id).
        let (base, span) = match (self.gate.get(), self.ownership.get()) {
            (Some(_), Some(ownership)) => {
                let band = CLIENT_IDS_MAX as u32 / ownership.cluster.servers().len().max(1) as u32;
                if wanted <= band {
                    (ownership.index as u32 * band, band)
                } else {
                    (0, CLIENT_IDS_MAX as u32)
                }
            }
            _ => (0, CLIENT_IDS_MAX as u32),
        };
        let mut first = (first - 1) % span + 1;
        if first + wanted - 1 > span {
            first = 1;
        }
        let first = base + first;
        debug_assert!(
            first >= 1 && first + wanted - 1 <= CLIENT_IDS_MAX as u32,
            "a block of ids never holds 0 or wraps"
        );
        let cluster = self.ownership.get().map(|ownership| match asked {
            Some(view) if self.gate.get().is_some() => view,
            _ => ownership.view(),
        });
        Response::Hello { client_id_first: first as u16, client_ids_granted: wanted as u16, cluster }
    }

    /// What a GET of `items` at `now_ms` finds, or the error reply that ends it. Round-1 reads
    /// (LATEST, LATEST_TS) are noted in the store: a reader may come back for a version.
    fn get(&self, items: &[GetItem], now_ms: u64) -> Result<Vec<Answer>, Response> {
        self.gets_served.fetch_add(1, Ordering::Relaxed);
        let mut answers: Vec<Answer> = Vec::with_capacity(items.len());
        for item in items {
            let answer = match &item.selector {
                Selector::Latest => {
                    Ok(self.store.read_latest(&item.key, now_ms).map_or(Answer::Initial, Answer::Version))
                }
                Selector::LatestTimestamp => Ok(Answer::TimestampOnly(self.store.read_last_commit(&item.key, now_ms))),
                Selector::Exact(ts) => self.store.get_at(&item.key, *ts).map(Answer::Version),
                Selector::HighestOf(candidates) => self
                    .store
                    .get_highest_of(&item.key, candidates)
                    .map(|found| found.map_or(Answer::Initial, Answer::Version)),
            };
            match answer {
                Ok(answer) => answers.push(answer),
                Err(StoreError::VersionGone { ts }) => {
                    let message = format!("version {ts} is gone; restart the read");
                    return Err(Response::Error { code: ErrorCode::VersionGone, message });
                }
                Err(other) => return Err(Response::Error { code: ErrorCode::Internal, message: other.to_string() }),
            }
        }
        Ok(answers)
    }
}

/// The keys of `writes` (copied before the writes move into the store).
fn staged_keys(writes: &[StoreWrite]) -> Vec<Key> {
    writes.iter().map(|write| write.key.clone()).collect()
}

/// An answer as a client decodes it from a reply frame. A stored write set was checked against
/// the limits when it was prepared, so it always encodes; were it not, the error says why
/// (the frame encoder would refuse it as well).
fn owned_item(answer: &Answer) -> Result<VersionItem, crate::wire::WireError> {
    Ok(match answer {
        Answer::Version(version) => VersionItem {
            ts: version.ts,
            value: shared_value(version),
            metadata: match &version.metadata {
                StoredMetadata::None => Metadata::None,
                StoredMetadata::WriteSet(keys) => Metadata::WriteSet(keys.clone()),
                StoredMetadata::Bloom(bits) => Metadata::Bloom(bits.to_vec()),
            },
            expiry: version.expiry,
        },
        Answer::TimestampOnly(ts) => VersionItem::new(*ts, Vec::new(), Metadata::None),
        Answer::Initial => VersionItem::new(TIMESTAMP_INITIAL, Vec::new(), Metadata::None),
    })
}

/// A stored version's value, shared: the answer holds the version (an `Arc`) for as long as the
/// value is used, so no byte is copied and nothing is allocated but the owner's handle.
fn shared_value(version: &Arc<Version>) -> bytes::Bytes {
    struct Shared(Arc<Version>);
    impl AsRef<[u8]> for Shared {
        fn as_ref(&self) -> &[u8] {
            &self.0.value
        }
    }
    if version.value.is_empty() {
        return bytes::Bytes::new();
    }
    bytes::Bytes::from_owner(Shared(Arc::clone(version)))
}

/// The entries of a reply, borrowed from the stored versions. A LATEST_TS answer carries no
/// expiry: RAMP-Small's round 1 judges nothing, its round 2 returns the versions themselves.
fn answer_entries(answers: &[Answer]) -> impl ExactSizeIterator<Item = EntryRef<'_, Key>> + Clone {
    answers.iter().map(|answer| match answer {
        Answer::Version(version) => (version.ts, &*version.value, version.metadata.as_wire(), version.expiry.to_word()),
        Answer::TimestampOnly(ts) => (*ts, &[][..], MetadataRef::None, 0),
        Answer::Initial => (TIMESTAMP_INITIAL, &[][..], MetadataRef::None, 0),
    })
}

fn ack_or_error(result: Result<(), StoreError>) -> Response {
    match result {
        Ok(()) => Response::Ack,
        Err(error) => Response::bad_request(error.to_string()),
    }
}

/// Why a write breaks the limits before it touches the lock table or the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteLimitError {
    #[error("{count} writes (need 1..={TXN_KEYS_MAX})")]
    Count { count: usize },
    #[error(
        "a key of {key_bytes} or value of {value_bytes} bytes over the limits ({KEY_BYTES_MAX}, {VALUE_BYTES_MAX})"
    )]
    TooLarge { key_bytes: usize, value_bytes: usize },
    #[error("a write's expiry {word:#x} is marked reclaimed, which only a server sets")]
    ReclaimedExpiry { word: u64 },
}

/// The limits a write must meet before it touches the lock table or the store.
fn validate_writes(writes: &[StoreWrite]) -> Result<(), WriteLimitError> {
    if writes.is_empty() || writes.len() > TXN_KEYS_MAX {
        return Err(WriteLimitError::Count { count: writes.len() });
    }
    if let Some(write) = writes.iter().find(|write| write.expiry.is_reclaimed()) {
        return Err(WriteLimitError::ReclaimedExpiry { word: write.expiry.to_word() });
    }
    match writes.iter().find(|write| write.key.len() > KEY_BYTES_MAX || write.value.len() > VALUE_BYTES_MAX) {
        Some(write) => Err(WriteLimitError::TooLarge { key_bytes: write.key.len(), value_bytes: write.value.len() }),
        None => Ok(()),
    }
}

fn stored_metadata(metadata: Metadata) -> StoredMetadata {
    match metadata {
        Metadata::None => StoredMetadata::None,
        // Kept as it arrived: one buffer, shared by the transaction's versions here (and, in
        // process, with the client and the other servers it prepared on).
        Metadata::WriteSet(write_set) => StoredMetadata::WriteSet(write_set),
        Metadata::Bloom(bits) => StoredMetadata::Bloom(bits.into()),
    }
}

/// A PREPARE's metadata as stored, and the transaction's whole write set (the metadata's when
/// it is the write set, else the one the request carries for recovery).
fn stored_write_set(metadata: Metadata, write_set: Vec<Vec<u8>>) -> Result<(StoredMetadata, WriteSet), StoreError> {
    let metadata = stored_metadata(metadata);
    let write_set = match (&metadata, write_set.is_empty()) {
        (StoredMetadata::WriteSet(keys), true) => keys.clone(),
        _ => WriteSet::from_keys(&write_set)
            .map_err(|_| StoreError::InvalidPrepare(InvalidPrepare::WriteSetTooLarge { count: write_set.len() }))?,
    };
    Ok((metadata, write_set))
}

fn stored_writes(writes: Vec<Write>) -> Vec<StoreWrite> {
    writes
        .into_iter()
        .map(|write| StoreWrite {
            key: write.key.into_boxed_slice(),
            value: write.value.into_boxed_slice(),
            expiry: Expiry::from_word(write.expires_at_ms),
        })
        .collect()
}

#[cfg(test)]
mod tests;
