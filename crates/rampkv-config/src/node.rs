//! A configuration-service node over TCP: the [`ConfigCore`] driven by a thread, peers reached
//! over the configuration port, and the API a server uses.
//!
//! # Threads
//! - driver: owns the core; takes events (peer messages, reports) from a bounded queue, ticks it
//!   on time, hands its outgoing messages to the peer writers and publishes the configuration
//!   and the lease for the server's threads.
//! - acceptor, and one reader per inbound connection (at most `CONFIG_CONNECTIONS_MAX`): a
//!   connection first proves the cluster's shared secret when the node has an authenticator
//!   (`crate::auth`; one that sends a frame of this port instead is refused with
//!   `RefusalReason::AuthenticationRequired`), then opens with a hello (a peer node, checked for cluster and server id) or a
//!   configuration request (a client, answered from the published configuration by the reader
//!   itself). A frame that is not one, a wrong cluster, an unknown server or a message a peer
//!   may not send closes the connection; none panics. The handshake (the secret, the first
//!   frame) must end within `CONFIG_HANDSHAKE_TIMEOUT_MS` however the peer trickles, and at most
//!   `CONFIG_HANDSHAKES_MAX` run at once (a new connection beyond closes the oldest), so silent
//!   or slow connections cannot take the slots peers need.
//! - one writer per peer: connects (with a timeout), proves the secret, says hello, writes frames from a bounded
//!   queue; while the peer is unreachable its messages are dropped (Raft and heartbeats retry).
//!   Reconnection attempts are spaced by `CONFIG_RECONNECT_BACKOFF_MS`, except that a hello from
//!   the peer (it is back, typically restarted) makes the next attempt at once.
//!
//! # Raft over a lossy transport
//! raft-rs does not learn by itself that a message was lost. The driver never blocks on a
//! writer (a full queue drops the frame); whoever drops a Raft frame reports it to the driver
//! (`ConfigCore::report_undelivered`), and a writer reports every snapshot it wrote whole
//! (`ConfigCore::report_snapshot_sent`): without these reports a lost snapshot leaves the
//! leader waiting for it forever, and a follower that missed appends is probed only at the next
//! heartbeat answer. A restarted peer's node is caught up this way within tens of ms of its
//! restart; one without kept state does not vote until then (docs/replication.md, "Raft state
//! on disk").
//!
//! # Raft state on disk
//! With `NodeSettings::state_dir` the node keeps its Raft state there (`crate::disk`) and, when
//! the directory holds state, restarts from it whatever `mode` says ([`StartMode::Restart`]): a
//! node that kept its vote and log never starts over. A write that fails stops the node
//! (`ConfigCore::failure`; logged, [`ConfigNode::failure`]); its lease ends with it.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::auth::PortAuthenticator;
use crate::configuration::{Configuration, ServerId};
use crate::core::{raft_voters, ConfigCore, CoreSettings, StartMode};
use crate::disk::Opened;
use crate::error::StateProblem;
use crate::error::{ConfigError, RefusalReason};
use crate::limits::{
    CONFIG_CONNECTIONS_MAX, CONFIG_CONNECT_TIMEOUT_MS, CONFIG_EVENT_QUEUE_MAX, CONFIG_FRAME_BODY_BYTES_MAX,
    CONFIG_HANDSHAKES_MAX, CONFIG_HANDSHAKE_TIMEOUT_MS, CONFIG_IO_TIMEOUT_MS, CONFIG_PEER_QUEUE_MESSAGES_MAX,
    CONFIG_RECONNECT_BACKOFF_MS, CONFIG_WRITE_TIMEOUT_MS,
};
use crate::storage::RaftStore;
use crate::timing::{Clock, Timing};
use crate::wire::{encode_frame, read_frame, Message, MAGIC};
use rampkv_core::wire::{AuthFrame, FrameHeader, Response, FRAME_HEADER_BYTES};

/// What a node is started with.
pub struct NodeSettings {
    /// This server's number in the configuration.
    pub me: ServerId,
    /// The cluster's first configuration (`Configuration::initial` of the cluster file).
    pub initial: Configuration,
    /// Bootstrap with the cluster, or rejoin a running one after a restart ([`crate::client::start_mode`]).
    /// With a `state_dir` that holds Raft state the node restarts from it whatever this says
    /// ([`ConfigNode::start_mode`] tells how it started); `Restart` demands such a directory.
    pub mode: StartMode,
    /// This process's incarnation: `BOOTSTRAP_INCARNATION` when bootstrapping, random non-zero
    /// when rejoining.
    pub incarnation: u64,
    pub timing: Timing,
    pub clock: Arc<dyn Clock>,
    /// A listener already bound to this server's config address (tests bind port 0 first);
    /// `None`: bind the address of the configuration.
    pub listener: Option<TcpListener>,
    /// Applied Raft entries kept before compaction (`CONFIG_LOG_ENTRIES_KEPT_MAX`; less in tests
    /// of catching up from a snapshot).
    pub log_entries_kept: u64,
    /// Proves and checks the cluster's shared secret on every connection of the port (`None`:
    /// a cluster without a secret; anyone who reaches the port is served).
    pub authenticator: Option<Arc<dyn PortAuthenticator>>,
    /// Where the node keeps its Raft state (created if need be; `None`: in memory, lost at a
    /// restart). A server gives it `DATA_DIR/config`.
    pub state_dir: Option<PathBuf>,
}

struct View {
    configuration: Arc<Configuration>,
    lease_expires_ns: u64,
    leader: Option<ServerId>,
    commit_index: u64,
    /// The node has known a leader since it started (`ConfigCore::leader_seen`).
    leader_seen: bool,
    /// The node caught up with a leader since it started (`ConfigCore::caught_up`).
    caught_up: bool,
    votes: bool,
    /// Why the node stopped (a write of its Raft state failed).
    failure: Option<String>,
}

struct Shared {
    me: ServerId,
    incarnation: u64,
    cluster_id: u64,
    clock: Arc<dyn Clock>,
    view: Mutex<View>,
    changed: Condvar,
    stop: AtomicBool,
    connections: AtomicUsize,
    inbound: Mutex<HashMap<u64, TcpStream>>,
    /// Inbound connections still in their handshake, oldest first.
    handshakes: Mutex<VecDeque<u64>>,
    next_connection: AtomicU64,
    /// Per server: a hello came from it since its writer last looked (it is reachable again).
    peer_returned: Vec<AtomicBool>,
    authenticator: Option<Arc<dyn PortAuthenticator>>,
    /// Told the end of the lease this server serves under, whenever the view changes
    /// ([`ConfigNode::watch_serving_lease`]).
    lease_watchers: Mutex<Vec<LeaseWatcher>>,
}

/// A watcher of the serving lease's end ([`ConfigNode::watch_serving_lease`]).
pub type LeaseWatcher = Box<dyn Fn(u64) + Send + Sync>;

enum Event {
    Message(ServerId, Message),
    CaughtUp(u32, ServerId, u64),
    /// A Raft frame for the server was dropped (`true`: it held a snapshot).
    Undelivered(ServerId, bool),
    /// A snapshot for the server was written whole to its connection.
    SnapshotSent(ServerId),
    Stop,
}

/// A frame for a peer's writer, with what the driver must hear if it is lost.
struct Outgoing {
    frame: Vec<u8>,
    kind: OutgoingKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OutgoingKind {
    /// A heartbeat, grant or report: the next one supersedes it.
    Other,
    /// A Raft message: its loss is reported (raft-rs re-sends sooner).
    Raft,
    /// A Raft snapshot: its loss, and its being written, are reported (raft-rs waits for one).
    RaftSnapshot,
}

impl Outgoing {
    fn new(message: &Message) -> Outgoing {
        let kind = match message {
            Message::Raft(raft) if raft.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot => {
                OutgoingKind::RaftSnapshot
            }
            Message::Raft(_) => OutgoingKind::Raft,
            _ => OutgoingKind::Other,
        };
        Outgoing { frame: encode_frame(message), kind }
    }
}

/// A running configuration-service node. Stops (and joins its threads) when dropped.
pub struct ConfigNode {
    shared: Arc<Shared>,
    events: SyncSender<Event>,
    address: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    mode: StartMode,
    opened: Option<Opened>,
}

/// The node's Raft storage and how it starts: in memory without a directory; with one, the
/// state it holds (a restart, whatever `mode` says) or a new one.
fn open_store(
    state_dir: Option<&Path>,
    mode: StartMode,
    initial: &Configuration,
) -> Result<(RaftStore, StartMode, Option<Opened>), ConfigError> {
    let voters = raft_voters(initial.servers().len());
    let Some(dir) = state_dir else {
        if mode == StartMode::Restart {
            return Err(ConfigError::State {
                path: PathBuf::from("(no state directory)"),
                problem: StateProblem::NoState,
            });
        }
        return Ok((RaftStore::new(voters, initial.encode()), mode, None));
    };
    match RaftStore::open(dir)? {
        Some((store, opened)) => Ok((store, StartMode::Restart, Some(opened))),
        None if mode == StartMode::Restart => {
            Err(ConfigError::State { path: dir.to_path_buf(), problem: StateProblem::NoState })
        }
        None => {
            let store = RaftStore::create(dir, voters, initial.encode(), mode == StartMode::Bootstrap)?;
            Ok((store, mode, None))
        }
    }
}

impl ConfigNode {
    /// Binds the config port and starts the node's threads.
    pub fn start(settings: NodeSettings) -> Result<ConfigNode, ConfigError> {
        let initial = settings.initial;
        let Some(me_info) = initial.server(settings.me).cloned() else {
            return Err(ConfigError::UnknownServer { server: settings.me, servers: initial.servers().len() });
        };
        let (store, mode, opened) = open_store(settings.state_dir.as_deref(), settings.mode, &initial)?;
        if let (Some(opened), Some(path)) = (opened, store.path()) {
            if opened.rolled_back {
                log::warn!(
                    "configuration service of server {}: {}: its newest commit was torn (a crash while it was \
                     written) and is cut; it had not been acknowledged to anyone",
                    settings.me,
                    path.display()
                );
            } else if opened.repaired {
                log::info!(
                    "configuration service of server {}: {} was not closed cleanly (a crash): checked and repaired",
                    settings.me,
                    path.display()
                );
            }
        }
        let now = settings.clock.now_ns();
        let core_settings = CoreSettings {
            me: settings.me,
            incarnation: settings.incarnation,
            mode,
            timing: settings.timing,
            election_seed: None,
            log_entries_kept: settings.log_entries_kept,
        };
        let core = ConfigCore::with_store(core_settings, initial.clone(), store, now)?;
        let listener = match settings.listener {
            Some(listener) => listener,
            None => TcpListener::bind(&me_info.config_address).map_err(|error| ConfigError::Io {
                action: "binding",
                address: me_info.config_address.clone(),
                error,
            })?,
        };
        let address = listener.local_addr().map_err(|error| ConfigError::Io {
            action: "reading the address of",
            address: me_info.config_address.clone(),
            error,
        })?;
        let shared = Arc::new(Shared {
            me: settings.me,
            incarnation: settings.incarnation,
            cluster_id: initial.cluster_id(),
            clock: settings.clock,
            view: Mutex::new(View {
                configuration: Arc::clone(core.configuration()),
                lease_expires_ns: 0,
                leader: None,
                commit_index: core.commit_index(),
                leader_seen: false,
                caught_up: false,
                votes: core.votes(),
                failure: None,
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            inbound: Mutex::new(HashMap::new()),
            handshakes: Mutex::new(VecDeque::new()),
            next_connection: AtomicU64::new(0),
            peer_returned: initial.servers().iter().map(|_| AtomicBool::new(false)).collect(),
            authenticator: settings.authenticator,
            lease_watchers: Mutex::new(Vec::new()),
        });
        let (events, event_queue) = mpsc::sync_channel(CONFIG_EVENT_QUEUE_MAX);
        let mut threads = Vec::new();
        let mut peers = HashMap::new();
        for server in initial.servers().iter().filter(|server| server.id != settings.me) {
            let (sender, queue) = mpsc::sync_channel(CONFIG_PEER_QUEUE_MESSAGES_MAX);
            peers.insert(server.id, sender);
            let peer = Peer { id: server.id, address: server.config_address.clone() };
            let (shared, reports) = (Arc::clone(&shared), events.clone());
            threads.push(spawn("rampkv-config-peer", move || write_to_peer(&shared, &peer, &queue, &reports)));
        }
        let driver_shared = Arc::clone(&shared);
        threads.push(spawn("rampkv-config-driver", move || drive(&driver_shared, core, &event_queue, &peers)));
        // The writers hold senders of the event queue too: the driver stops on `Event::Stop`,
        // not on the queue's disconnection.
        let (accept_shared, accept_events) = (Arc::clone(&shared), events.clone());
        threads.push(spawn("rampkv-config-accept", move || accept(&accept_shared, &listener, &accept_events)));
        Ok(ConfigNode { shared, events, address, threads, mode, opened })
    }

    /// How the node started: `mode` of its settings, or [`StartMode::Restart`] from the Raft
    /// state its directory held.
    pub fn start_mode(&self) -> StartMode {
        self.mode
    }

    /// How the state file was found when the node restarted from it (repaired after a crash,
    /// a torn tail cut); `None` for a node that did not.
    pub fn state_opened(&self) -> Option<Opened> {
        self.opened
    }

    /// Why the node stopped, if it did: a write of its Raft state failed (a full or failing
    /// disk). It then takes part in nothing and its lease has ended.
    pub fn failure(&self) -> Option<String> {
        self.shared.view.lock().failure.clone()
    }

    /// The address the config port listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// This process's incarnation (a restarted process has a new one: a configuration that names
    /// this server with another incarnation speaks of an earlier process, not of this one).
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// The newest committed configuration this node knows.
    pub fn configuration(&self) -> Arc<Configuration> {
        Arc::clone(&self.shared.view.lock().configuration)
    }

    /// Waits until the configuration's epoch is at least `epoch`; `None` after `timeout`.
    pub fn wait_for_epoch(&self, epoch: u64, timeout: Duration) -> Option<Arc<Configuration>> {
        let deadline = Instant::now() + timeout;
        let mut view = self.shared.view.lock();
        while view.configuration.epoch() < epoch {
            if self.shared.changed.wait_until(&mut view, deadline).timed_out() {
                return (view.configuration.epoch() >= epoch).then(|| Arc::clone(&view.configuration));
            }
        }
        Some(Arc::clone(&view.configuration))
    }

    /// Whether this server may serve `partition` as primary now: it is the primary in the
    /// newest configuration it knows, and its lease has not ended by its own clock. A server
    /// checks this before it answers a read or acknowledges a write of the partition.
    pub fn lease_valid(&self, partition: u32) -> bool {
        let view = self.shared.view.lock();
        self.shared.clock.now_ns() < view.lease_expires_ns
            && view.configuration.primary_of(partition) == Some(self.shared.me)
            && view.configuration.is_admitted(self.shared.me, self.shared.incarnation)
    }

    /// When this server's lease ends, by its clock (0: never granted).
    pub fn lease_expires_ns(&self) -> u64 {
        self.shared.view.lock().lease_expires_ns
    }

    /// This server holds `partition`'s snapshot and log since (it was catching up).
    pub fn report_caught_up(&self, partition: u32) {
        // A full queue means the driver is far behind; the report is repeated by the caller's
        // next attempt, and the driver re-sends pending reports with every heartbeat.
        let _ = self.events.try_send(Event::CaughtUp(partition, self.shared.me, self.shared.incarnation));
    }

    /// As the primary of `partition`: the catching-up `server` (process `incarnation`) holds
    /// the partition and this primary acknowledges no write it lacks
    /// (`ConfigCore::report_backup_caught_up`). Repeat it until the configuration shows it.
    pub fn report_backup_caught_up(&self, partition: u32, server: ServerId, incarnation: u64) {
        let _ = self.events.try_send(Event::CaughtUp(partition, server, incarnation));
    }

    /// When the lease this server serves under ends, by its clock: its lease's end while the
    /// newest configuration it knows names this process (its incarnation) the primary of at
    /// least one partition, 0 otherwise (never granted, deposed, a restarted process not
    /// admitted yet). Until then no other server is the primary of a partition this server is
    /// the primary of (the configuration service waits a lapsed lease out before it promotes a
    /// backup): what a one-sided reader of this server's memory checks (GET\* lease words).
    pub fn serving_lease_end_ns(&self) -> u64 {
        serving_lease_end_ns(&self.shared)
    }

    /// Calls `watcher` with [`ConfigNode::serving_lease_end_ns`] now and after every change of
    /// the node's view (each lease grant, each configuration), from the node's driver thread:
    /// it must be quick (a store). Calls are serialized, and the value of the last call is
    /// always the current one.
    pub fn watch_serving_lease(&self, watcher: LeaseWatcher) {
        let mut watchers = self.shared.lease_watchers.lock();
        watcher(serving_lease_end_ns(&self.shared));
        watchers.push(watcher);
    }

    /// The Raft leader this node knows of.
    pub fn leader(&self) -> Option<ServerId> {
        self.shared.view.lock().leader
    }

    /// The Raft commit index of this node.
    pub fn commit_index(&self) -> u64 {
        self.shared.view.lock().commit_index
    }

    /// Waits until the node has caught up with a leader since it started
    /// (`ConfigCore::caught_up`): its configuration is then at least the newest one committed
    /// before that moment. False after `timeout` (no leader: a majority of the nodes is not up)
    /// or once the node stopped (a failed write of its state).
    pub fn wait_caught_up(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut view = self.shared.view.lock();
        while !view.caught_up && view.failure.is_none() {
            if self.shared.changed.wait_until(&mut view, deadline).timed_out() {
                break;
            }
        }
        view.caught_up
    }

    /// Whether this node votes in Raft elections. A restarted node (`StartMode::Rejoin`) does
    /// not until it has applied a leader's commit index: until then it does not count towards a
    /// Raft majority, so the group tolerates one failure fewer (docs/replication.md).
    pub fn votes(&self) -> bool {
        self.shared.view.lock().votes
    }

    /// Stops the node and joins its threads (as a crash would, for its peers: sockets close).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.events.send(Event::Stop);
        // Wakes the acceptor out of accept().
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_millis(CONFIG_CONNECT_TIMEOUT_MS));
        for stream in self.shared.inbound.lock().values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for ConfigNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new().name(name.into()).spawn(body).expect("spawning a thread")
}

fn drive(
    shared: &Shared,
    mut core: ConfigCore,
    events: &Receiver<Event>,
    peers: &HashMap<ServerId, SyncSender<Outgoing>>,
) {
    loop {
        let now = shared.clock.now_ns();
        let wait = Duration::from_nanos(core.next_deadline_ns().saturating_sub(now));
        match events.recv_timeout(wait) {
            Ok(Event::Message(from, message)) => {
                // A violation was already answered by the reader closing the connection.
                let _ = core.receive(from, message, shared.clock.now_ns());
            }
            Ok(Event::CaughtUp(partition, server, incarnation)) => {
                core.report_backup_caught_up(partition, server, incarnation, shared.clock.now_ns())
            }
            Ok(Event::Undelivered(to, snapshot)) => core.report_undelivered(to, snapshot, shared.clock.now_ns()),
            Ok(Event::SnapshotSent(to)) => core.report_snapshot_sent(to, shared.clock.now_ns()),
            Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = shared.clock.now_ns();
        if now >= core.next_deadline_ns() {
            core.tick(now);
        }
        // Reports of frames dropped here are handled after this round (they may add messages).
        let mut undelivered = Vec::new();
        for (to, message) in core.take_outbox() {
            if let Some(peer) = peers.get(&to) {
                // Full: the peer is slow or down; Raft and heartbeats tolerate the loss once
                // raft-rs is told of it.
                match peer.try_send(Outgoing::new(&message)) {
                    Ok(()) => {}
                    Err(TrySendError::Full(dropped)) if dropped.kind != OutgoingKind::Other => {
                        undelivered.push((to, dropped.kind == OutgoingKind::RaftSnapshot));
                    }
                    Err(TrySendError::Full(_)) => {}
                    Err(TrySendError::Disconnected(_)) => return,
                }
            }
        }
        // What raft-rs sends in answer goes out with the next event or tick, not in a loop here.
        for (to, snapshot) in undelivered {
            core.report_undelivered(to, snapshot, shared.clock.now_ns());
        }
        publish(shared, &core);
        if let Some(failure) = core.failure() {
            // Fail-stop: the peers' writers end with their queues (dropped with `peers` on
            // return); the port still answers configuration requests from the last view.
            log::error!("configuration service of server {}: stopped: {failure}", shared.me);
            return;
        }
    }
}

fn publish(shared: &Shared, core: &ConfigCore) {
    let mut view = shared.view.lock();
    let changed = view.configuration.epoch() != core.configuration().epoch();
    if changed {
        view.configuration = Arc::clone(core.configuration());
    }
    view.lease_expires_ns = core.lease_expires_ns();
    view.leader = core.leader();
    view.commit_index = core.commit_index();
    view.leader_seen = core.leader_seen();
    let caught_up = core.caught_up() && !view.caught_up;
    view.caught_up |= core.caught_up();
    view.votes = core.votes();
    view.failure = core.failure().map(ToString::to_string);
    drop(view);
    if changed || caught_up {
        shared.changed.notify_all();
    }
    let watchers = shared.lease_watchers.lock();
    if !watchers.is_empty() {
        // Read under the watchers' lock: two calls never cross, the last one says what is now.
        let end_ns = serving_lease_end_ns(shared);
        for watcher in watchers.iter() {
            watcher(end_ns);
        }
    }
}

fn serving_lease_end_ns(shared: &Shared) -> u64 {
    let view = shared.view.lock();
    let configuration = &view.configuration;
    let me = shared.me;
    let primary = configuration.is_admitted(me, shared.incarnation)
        && configuration.replica_sets().iter().any(|set| set.primary == Some(me));
    if primary {
        view.lease_expires_ns
    } else {
        0
    }
}

fn accept(shared: &Arc<Shared>, listener: &TcpListener, events: &SyncSender<Event>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= CONFIG_CONNECTIONS_MAX {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            let refusal = Message::Refused { reason: RefusalReason::TooManyConnections, cluster_id: shared.cluster_id };
            let _ = stream.write_all(&encode_frame(&refusal));
            continue;
        }
        let id = shared.next_connection.fetch_add(1, Ordering::SeqCst);
        if let Ok(clone) = stream.try_clone() {
            shared.inbound.lock().insert(id, clone);
        }
        begin_handshake(shared, id);
        let (shared, events) = (Arc::clone(shared), events.clone());
        // Detached: it ends when its connection does (stop shuts every inbound socket down).
        drop(spawn("rampkv-config-conn", move || {
            if let Err(error @ ConfigError::Authentication { .. }) = serve_connection(&shared, id, stream, &events) {
                log::warn!("configuration port of server {}: refused a connection: {error}", shared.me);
            }
            end_handshake(&shared, id);
            shared.inbound.lock().remove(&id);
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        }));
    }
}

/// Counts connection `id` among the handshakes under way; past `CONFIG_HANDSHAKES_MAX`, the
/// oldest is closed (its reader then fails and ends).
fn begin_handshake(shared: &Shared, id: u64) {
    let mut handshakes = shared.handshakes.lock();
    handshakes.push_back(id);
    while handshakes.len() > CONFIG_HANDSHAKES_MAX {
        let Some(oldest) = handshakes.pop_front() else { break };
        if let Some(stream) = shared.inbound.lock().get(&oldest) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn end_handshake(shared: &Shared, id: u64) {
    shared.handshakes.lock().retain(|handshake| *handshake != id);
}

/// Reads from a stream with every read bounded by one deadline, so that a peer trickling bytes
/// cannot stretch a handshake past it.
struct ByDeadline<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake not finished in time"));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buffer)
    }
}

/// Fills `buffer` with the first bytes the peer sends, without consuming them, by `deadline`;
/// fewer only when it closed first (0: it closed before sending anything).
fn peek_by(stream: &TcpStream, buffer: &mut [u8], deadline: Instant) -> std::io::Result<usize> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake not finished in time"));
        }
        stream.set_read_timeout(Some(left))?;
        let peeked = stream.peek(buffer)?;
        if peeked == 0 || peeked == buffer.len() {
            return Ok(peeked);
        }
        // Part of it is there: a peek returns at once while bytes are buffered, so wait a little
        // for the rest rather than spin (the deadline bounds the wait).
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The connection's handshake: the shared-secret step when the node has an authenticator, and
/// the first frame, all by `deadline`. `None`: the peer closed before a frame.
fn handshake(
    shared: &Shared,
    stream: &mut TcpStream,
    peer: &str,
    deadline: Instant,
) -> Result<Option<Message>, ConfigError> {
    let io = |error| ConfigError::Io { action: "reading from", address: peer.to_string(), error };
    // A frame of this port has a longer header than the step's; both are whole before either
    // side waits for an answer.
    let mut start = [0u8; FRAME_HEADER_BYTES];
    if peek_by(stream, &mut start, deadline).map_err(io)? == 0 {
        return Ok(None);
    }
    let frame_of_this_port = start[..4] == MAGIC.to_le_bytes();
    let step_begins = FrameHeader::decode(&start).is_ok_and(|header| AuthFrame::is_auth_kind(header.kind));
    match &shared.authenticator {
        Some(_) if frame_of_this_port => {
            let refusal =
                Message::Refused { reason: RefusalReason::AuthenticationRequired, cluster_id: shared.cluster_id };
            refuse_unread(stream, &encode_frame(&refusal), deadline);
            return Err(ConfigError::Authentication {
                peer: peer.to_string(),
                source: "it sent frames of the port without proving the shared secret (no --secret-file?)".into(),
            });
        }
        Some(authenticator) => {
            authenticator
                .check(stream, deadline)
                .map_err(|source| ConfigError::Authentication { peer: peer.to_string(), source })?;
        }
        // A client proving a secret to a node without one: tell it so in the step's own frames
        // (an ERROR reply of the binary port), as a server of the binary port would.
        None if step_begins => {
            let message = "this configuration service has no shared secret: start its servers with --secret-file, \
                           or the client without";
            let mut reply = Vec::new();
            Response::bad_request(message).encode_frame(0, &mut reply);
            refuse_unread(stream, &reply, deadline);
            return Err(ConfigError::Authentication { peer: peer.to_string(), source: message.into() });
        }
        None => {}
    }
    read_frame(&mut ByDeadline { stream, deadline }, peer)
}

/// Sends `refusal` to a peer that may have sent more than we read (frames of this port without
/// the secret, pipelined), and reads what it sent until it closes (at most until `deadline`
/// and `CONFIG_FRAME_BODY_BYTES_MAX` bytes): closing with bytes unread would reset the
/// connection and could destroy the refusal before the peer reads it.
fn refuse_unread(stream: &mut TcpStream, refusal: &[u8], deadline: Instant) {
    if stream.write_all(refusal).is_err() || stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    let mut unread = ByDeadline { stream, deadline }.take(CONFIG_FRAME_BODY_BYTES_MAX as u64);
    let _ = std::io::copy(&mut unread, &mut std::io::sink());
}

fn refuse(shared: &Shared, stream: &mut TcpStream, reason: RefusalReason) {
    let _ = stream.write_all(&encode_frame(&Message::Refused { reason, cluster_id: shared.cluster_id }));
}

/// Serves one inbound connection until it closes or breaks the protocol.
fn serve_connection(
    shared: &Shared,
    id: u64,
    mut stream: TcpStream,
    events: &SyncSender<Event>,
) -> Result<(), ConfigError> {
    let peer = stream.peer_addr().map_or_else(|_| "unknown peer".to_string(), |address| address.to_string());
    let _ = stream.set_write_timeout(Some(Duration::from_millis(CONFIG_WRITE_TIMEOUT_MS)));
    let deadline = Instant::now() + Duration::from_millis(CONFIG_HANDSHAKE_TIMEOUT_MS);
    let first = handshake(shared, &mut stream, &peer, deadline)?;
    end_handshake(shared, id);
    // Peers heartbeat every few tens of ms: a connection silent this long is dead or hung.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(CONFIG_IO_TIMEOUT_MS)));
    let servers = shared.view.lock().configuration.servers().len();
    let violation = |problem| ConfigError::ProtocolViolation { peer: peer.clone(), problem };
    match first {
        None => Ok(()),
        Some(Message::Hello { cluster_id, from }) => {
            if cluster_id != shared.cluster_id {
                refuse(shared, &mut stream, RefusalReason::WrongCluster);
                return Err(ConfigError::WrongCluster { expected: shared.cluster_id, got: cluster_id });
            }
            if usize::from(from) >= servers || from == shared.me {
                refuse(shared, &mut stream, RefusalReason::UnknownServer);
                return Err(ConfigError::UnknownServer { server: from, servers });
            }
            // The peer is up (it may just have restarted): our writer to it, if it is waiting
            // out a failed attempt, connects at once. Only a wait is cut short, never a working
            // connection replaced, so two nodes cannot make each other reconnect in a loop.
            if let Some(returned) = shared.peer_returned.get(usize::from(from)) {
                returned.store(true, Ordering::SeqCst);
            }
            while let Some(message) = read_frame(&mut stream, &peer)? {
                let allowed = match &message {
                    Message::Raft(raft) => raft.from == u64::from(from) + 1,
                    Message::Heartbeat(heartbeat) => heartbeat.from == from,
                    // The server itself or the partition's primary: the core checks which.
                    Message::CaughtUp { .. } => true,
                    Message::LeaseGrant(grant) => grant.to == shared.me,
                    _ => false,
                };
                if !allowed {
                    return Err(violation("a message a peer may not send, or one naming another server"));
                }
                if events.send(Event::Message(from, message)).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        }
        Some(Message::ConfigRequest { cluster_id, .. }) => {
            let mut request = Some(cluster_id);
            while let Some(cluster_id) = request.take() {
                if cluster_id != 0 && cluster_id != shared.cluster_id {
                    refuse(shared, &mut stream, RefusalReason::WrongCluster);
                    return Err(ConfigError::WrongCluster { expected: shared.cluster_id, got: cluster_id });
                }
                let reply = {
                    let view = shared.view.lock();
                    Message::ConfigReply {
                        leader: view.leader,
                        // What `client::start_mode` asks: has the group committed something in
                        // this run? A node restarted from its directory holds its last run's
                        // commit index until it knows a leader again.
                        commit_index: if view.leader_seen { view.commit_index } else { 0 },
                        configuration: view.configuration.encode(),
                    }
                };
                stream.write_all(&encode_frame(&reply)).map_err(|error| ConfigError::Io {
                    action: "answering",
                    address: peer.clone(),
                    error,
                })?;
                match read_frame(&mut stream, &peer)? {
                    Some(Message::ConfigRequest { cluster_id, .. }) => request = Some(cluster_id),
                    Some(_) => return Err(violation("a client sent something else than a configuration request")),
                    None => {}
                }
            }
            Ok(())
        }
        Some(_) => {
            refuse(shared, &mut stream, RefusalReason::Unexpected);
            Err(violation("a connection must open with a hello or a configuration request"))
        }
    }
}

/// A peer's number and config address, for its writer.
struct Peer {
    id: ServerId,
    address: String,
}

fn write_to_peer(shared: &Shared, peer: &Peer, queue: &Receiver<Outgoing>, reports: &SyncSender<Event>) {
    let mut connection: Option<TcpStream> = None;
    let mut retry_at = Instant::now();
    let mut refused = false;
    loop {
        let outgoing = match queue.recv_timeout(Duration::from_millis(CONFIG_RECONNECT_BACKOFF_MS)) {
            Ok(outgoing) => outgoing,
            Err(RecvTimeoutError::Timeout) if !shared.stop.load(Ordering::SeqCst) => continue,
            Err(_) => return,
        };
        // Cleared even when connected: a hello that came while we were connected says nothing
        // about a later failure.
        let returned = shared.peer_returned[usize::from(peer.id)].swap(false, Ordering::SeqCst);
        if connection.is_none() && (returned || Instant::now() >= retry_at) {
            match connect(shared, &peer.address) {
                Ok(stream) => {
                    connection = Some(stream);
                    refused = false;
                }
                Err(error) => {
                    // A peer that is down is routine; one that refuses our secret is a
                    // misconfiguration, said once per run of refusals.
                    if matches!(error, ConfigError::Authentication { .. }) && !refused {
                        log::warn!("configuration service of server {}: peer {}: {error}", shared.me, peer.id);
                        refused = true;
                    }
                    retry_at = Instant::now() + Duration::from_millis(CONFIG_RECONNECT_BACKOFF_MS);
                }
            }
        }
        // Without a connection the frame is dropped: the peer is down, and what we send is
        // either retried by Raft (once told, below) or superseded by the next heartbeat.
        let written = match &mut connection {
            Some(stream) => stream.write_all(&outgoing.frame).is_ok(),
            None => false,
        };
        if !written {
            connection = None;
        }
        match (outgoing.kind, written) {
            (OutgoingKind::Other, _) | (OutgoingKind::Raft, true) => {}
            // Reported when there is room: raft-rs also recovers without, only later.
            (OutgoingKind::Raft, false) => {
                let _ = reports.try_send(Event::Undelivered(peer.id, false));
            }
            // A snapshot's fate must reach the driver (raft-rs waits for it): block for it. The
            // driver never waits for a writer, so this cannot deadlock; it fails only once the
            // driver has stopped.
            (OutgoingKind::RaftSnapshot, written) => {
                let event = if written { Event::SnapshotSent(peer.id) } else { Event::Undelivered(peer.id, true) };
                if reports.send(event).is_err() {
                    return;
                }
            }
        }
    }
}

/// Connects to a peer's config port, proves the secret and says hello.
fn connect(shared: &Shared, address: &str) -> Result<TcpStream, ConfigError> {
    let mut stream = crate::client::connect(
        address,
        Duration::from_millis(CONFIG_CONNECT_TIMEOUT_MS),
        shared.authenticator.as_deref(),
    )?;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(CONFIG_WRITE_TIMEOUT_MS)));
    let hello = Message::Hello { cluster_id: shared.cluster_id, from: shared.me };
    stream.write_all(&encode_frame(&hello)).map_err(|error| ConfigError::Io {
        action: "writing to",
        address: address.to_string(),
        error,
    })?;
    Ok(stream)
}
