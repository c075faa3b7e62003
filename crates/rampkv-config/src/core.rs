//! One node of the configuration service, without I/O: raft-rs's core plus leases and the
//! failure detector. The caller feeds it messages and the time, and sends what it hands back
//! (the real node in `node.rs`, the simulated network in the tests).
//!
//! # What it does
//! - Holds the committed [`Configuration`] (applied from the Raft log, or learned from a lease
//!   grant that carried a newer one).
//! - Every node heartbeats every other node (and itself) every `heartbeat_interval_ms`.
//! - The Raft leader answers heartbeats with lease grants, but only after a ReadIndex round has
//!   confirmed it was still leader after it received them, and only while it has committed an
//!   entry of its term, applied everything in its log and has no change in flight.
//! - The leader declares a server failed when it has heard no heartbeat from its admitted
//!   incarnation for `lease * (1 + drift)`, and not before `lease * (1 + drift)` after it became
//!   leader, or after a majority confirmed it again following a lease or more without; it
//!   judges nobody while no majority has confirmed it within a lease (cut off, it hears
//!   nobody, and its change would commit the moment the majority came back); then it proposes one change (one new epoch) promoting an in-sync backup for each
//!   partition the server was primary of and removing it from every other replica set. It
//!   admits restarted servers, starts their catch-up and marks it complete when they report it.
//!
//! # Why two primaries never serve at once (docs/replication.md, "Leases", has the argument)
//! A server serves partition p only while [`ConfigCore::lease_valid`]: p's primary in its
//! newest configuration is itself, and a grant's lease has not ended by its own clock. A grant
//! is answered to a heartbeat received before a ReadIndex round that a majority confirmed; a
//! later leader was elected after that confirmation, so every lease an earlier leader granted
//! ends, in real time, before `lease` after the later leader took over, and the later leader
//! waits `lease * (1 + drift)` before it declares anyone failed. Within one leader, it declares
//! failure only `lease * (1 + drift)` after the last heartbeat it heard, and grants nothing while
//! the change is in flight; grants after the change carry the new configuration.
//!
//! # Fault model
//! Crash-stop nodes that may restart (from the Raft state their directory kept:
//! `StartMode::Restart`; or with an empty log: `StartMode::Rejoin`), messages lost,
//! delayed, duplicated or reordered, network partitions, clocks whose rates differ by at most
//! `clock_drift_ppm`. Peers are members of the cluster: frames are checked, and Raft messages
//! that would make raft-rs panic are refused, but a member that lies inside well-formed Raft
//! messages is outside the model (as in any Raft deployment).

use std::sync::Arc;

use raft::eraftpb::{self, Entry, EntryType, MessageType};
use raft::{RawNode, StateRole, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::configuration::{Change, Configuration, Proposal, ReplicaSet, ServerId};
use crate::error::ConfigError;
use crate::limits::{
    CONFIG_PROPOSAL_TIMEOUT_MS, CONFIG_RAFT_ENTRIES_PER_MESSAGE_MAX, CONFIG_READ_INDEX_TIMEOUT_MS,
    CONFIG_STARTUP_GRACE_MS,
};
use crate::storage::{into_disk_failure, RaftStore};
use crate::timing::Timing;
use crate::wire::{Heartbeat, LeaseGrant, Message};

const NANOS_PER_MS: u64 = 1_000_000;

/// How a node starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartMode {
    /// With the cluster, every node at once: it votes from the start.
    Bootstrap,
    /// Into a running cluster after a restart: its log is gone, so it neither votes nor campaigns
    /// until it has caught up with a leader's commit (a vote it cast before the restart is
    /// forgotten; voting again in that term could elect two leaders).
    Rejoin,
    /// From the Raft state its directory kept (`RaftStore::open`): its term, vote, log and
    /// snapshot survived, so it votes at once, as any Raft node restarted from stable storage,
    /// whether the others kept running or the whole group restarts. (A node that was still
    /// catching up after a `Rejoin` when it stopped stays gated: the store keeps that too.)
    Restart,
}

/// What a node is started with.
#[derive(Debug, Clone)]
pub struct CoreSettings {
    pub me: ServerId,
    /// This process's incarnation: `BOOTSTRAP_INCARNATION` when bootstrapping, a random
    /// non-zero number when rejoining.
    pub incarnation: u64,
    pub mode: StartMode,
    pub timing: Timing,
    /// Seed of the node's election-timeout draws (`None`: from the operating system). raft-rs
    /// draws a new timeout in [election_ticks, 2 x election_ticks) whenever the node's term or
    /// role changes, from a thread-local generator no seed reaches; the node redraws it at the
    /// same moments from its own generator ([`ElectionTimeouts`]), so that the simulation
    /// replays exactly and still draws anew at every election, as raft-rs does.
    pub election_seed: Option<u64>,
    /// Applied Raft entries kept before the log is compacted into a snapshot:
    /// `CONFIG_LOG_ENTRIES_KEPT_MAX`, or less in tests that need a follower to catch up from a
    /// snapshot (what a restarted node of a long-running cluster does).
    pub log_entries_kept: u64,
}

#[derive(Debug)]
enum VoteGate {
    Open,
    /// Closed until the node has applied `target` (a leader's commit index, once known).
    Closed {
        target: Option<u64>,
    },
}

#[derive(Debug)]
struct ReadRound {
    context: Vec<u8>,
    heartbeats: Vec<Heartbeat>,
    issued_ns: u64,
}

#[derive(Debug)]
struct LeaderState {
    /// When this leader may start judging failures from: when it became leader, or when a
    /// majority confirmed it again after a lease or more without (see `on_read_state`).
    since_ns: u64,
    /// When a majority last confirmed this node still leader (a ReadIndex round answered).
    confirmed_ns: u64,
    pending: Vec<Heartbeat>,
    read_round: Option<ReadRound>,
    next_context: u64,
    /// (log index, deadline) of the change in flight.
    proposal: Option<(u64, u64)>,
    /// (server, incarnation, partition) caught-up reports not yet committed.
    caught_up: Vec<(ServerId, u64, u32)>,
    /// Per server: the unadmitted incarnation whose Raft progress was last reset.
    reset_incarnation: Vec<Option<u64>>,
}

/// The node's Raft election timeouts, drawn from its own generator.
///
/// Why redraw at every change of term or role, never keep one value: two nodes that time out
/// in the same tick after their leader died split their votes, and with the same timeouts
/// they would time out together again, round after round (a simulation that fixed each node's
/// timeout once saw a failover take 1.1 s this way, every round a split vote, where one
/// redraw breaks the tie nine times in ten).
struct ElectionTimeouts {
    rng: SmallRng,
    /// Raft term and role at the last draw.
    term: u64,
    role: StateRole,
    /// The timeout drawn last, in ticks.
    drawn: usize,
}

/// One configuration-service node, without I/O.
pub struct ConfigCore {
    me: ServerId,
    incarnation: u64,
    timing: Timing,
    log_entries_kept: u64,
    raft: RawNode<RaftStore>,
    configuration: Arc<Configuration>,
    /// Bumped whenever `configuration` changes (for waiters).
    version: u64,
    lease_expires_ns: u64,
    outbox: Vec<(ServerId, Message)>,
    /// Per server: receipt time of the last heartbeat from its admitted incarnation.
    heard_admitted_ns: Vec<u64>,
    /// Per server: (incarnation, receipt time) of its last heartbeat of any incarnation.
    heard_any: Vec<(u64, u64)>,
    /// A node that bootstrapped the cluster: when it first judged failures (its clock). A
    /// server it never heard from is judged only `CONFIG_STARTUP_GRACE_MS` after that (the
    /// cluster's processes come up one by one). `None` for a rejoining node, which gives no
    /// grace: the servers it never heard from had their chance when the cluster started.
    startup: Option<Option<u64>>,
    /// Per server: a heartbeat of it ever arrived (a receipt time of 0 is a time like others).
    heard_ever: Vec<bool>,
    leader: Option<LeaderState>,
    applied: u64,
    next_tick_ns: u64,
    next_heartbeat_ns: u64,
    vote_gate: VoteGate,
    /// (server, incarnation, partition) catch-ups this server reported (its own, or, as the
    /// partition's primary, a backup's) and that are not yet in sync.
    caught_up_pending: Vec<(ServerId, u64, u32)>,
    election: ElectionTimeouts,
    /// This node has known a Raft leader since it started (a node restarted from its directory
    /// holds a commit index of its last run until then: [`ConfigCore::leader_seen`]).
    leader_seen: bool,
    /// This node has applied, since it started, a commit index that covers an entry of the
    /// current leader's term ([`ConfigCore::caught_up`]).
    caught_up: bool,
    /// A write of the Raft state failed: the node stopped (fail-stop, [`ConfigCore::failure`]).
    failure: Option<ConfigError>,
}

impl std::fmt::Debug for ConfigCore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ConfigCore")
            .field("me", &self.me)
            .field("epoch", &self.configuration.epoch())
            .field("leader", &self.leader.is_some())
            .finish()
    }
}

fn raft_id(server: ServerId) -> u64 {
    u64::from(server) + 1
}

/// The Raft voters of a group of `servers` nodes (every server votes).
pub fn raft_voters(servers: usize) -> Vec<u64> {
    (0..servers).map(|server| raft_id(server as ServerId)).collect()
}

impl ConfigCore {
    /// A node of the cluster whose first configuration is `initial`, at time `now_ns`, with its
    /// Raft state in memory (`Bootstrap` or `Rejoin`).
    pub fn new(settings: CoreSettings, initial: Configuration, now_ns: u64) -> Result<ConfigCore, ConfigError> {
        let store = RaftStore::new(raft_voters(initial.servers().len()), initial.encode());
        ConfigCore::with_store(settings, initial, store, now_ns)
    }

    /// A node over `store`: a new one (`RaftStore::new`, or `RaftStore::create` in a directory)
    /// for `Bootstrap` and `Rejoin`, the state a directory kept (`RaftStore::open`) for
    /// `Restart`. A restarting node's configuration is its snapshot's with the committed entries
    /// after it applied again: at least the configuration it had applied when it stopped.
    ///
    /// # Errors
    /// Bad settings or configuration; a `Restart` without kept state, or with the state of
    /// another cluster or group of voters ([`ConfigError::State`]).
    pub fn with_store(
        settings: CoreSettings,
        initial: Configuration,
        store: RaftStore,
        now_ns: u64,
    ) -> Result<ConfigCore, ConfigError> {
        settings.timing.validate()?;
        initial.validate()?;
        let servers = initial.servers().len();
        if usize::from(settings.me) >= servers {
            return Err(ConfigError::UnknownServer { server: settings.me, servers });
        }
        let restart = settings.mode == StartMode::Restart;
        let configuration = ConfigCore::kept_configuration(&store, &initial, restart)?;
        // A fresh store on disk records whether the node votes, for its next restart.
        debug_assert!(restart || !store.is_durable() || store.votes() == (settings.mode == StartMode::Bootstrap));
        let config = raft::Config {
            id: raft_id(settings.me),
            election_tick: settings.timing.election_ticks,
            heartbeat_tick: settings.timing.raft_heartbeat_ticks,
            check_quorum: true,
            pre_vote: true,
            max_size_per_msg: (crate::limits::CONFIG_FRAME_BODY_BYTES_MAX / 4) as u64,
            max_inflight_msgs: CONFIG_RAFT_ENTRIES_PER_MESSAGE_MAX as usize,
            // raft-rs's range, [election_tick, 2 x election_tick): ours draws within it.
            min_election_tick: 0,
            max_election_tick: 0,
            ..Default::default()
        };
        config.validate().map_err(|error| ConfigError::Raft { message: error.to_string() })?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let applied = store.snapshot_parts().0.index;
        let vote_gate = match settings.mode {
            StartMode::Bootstrap => VoteGate::Open,
            StartMode::Restart if store.votes() => VoteGate::Open,
            StartMode::Rejoin | StartMode::Restart => VoteGate::Closed { target: None },
        };
        let raft =
            RawNode::new(&config, store, &logger).map_err(|error| ConfigError::Raft { message: error.to_string() })?;
        let mut core = ConfigCore {
            me: settings.me,
            incarnation: settings.incarnation,
            timing: settings.timing,
            log_entries_kept: settings.log_entries_kept,
            raft,
            configuration: Arc::new(configuration),
            version: 0,
            lease_expires_ns: 0,
            outbox: Vec::new(),
            heard_admitted_ns: vec![0; servers],
            heard_any: vec![(0, 0); servers],
            heard_ever: vec![false; servers],
            // A restarting node may be one of a whole cluster coming back one by one: the
            // same grace as at the first start.
            startup: match settings.mode {
                StartMode::Bootstrap | StartMode::Restart => Some(None),
                StartMode::Rejoin => None,
            },
            leader: None,
            applied,
            next_tick_ns: now_ns + settings.timing.tick_ns(),
            next_heartbeat_ns: now_ns,
            vote_gate,
            caught_up_pending: Vec::new(),
            election: ElectionTimeouts {
                rng: settings.election_seed.map_or_else(SmallRng::from_entropy, SmallRng::seed_from_u64),
                term: 0,
                role: StateRole::Follower,
                drawn: 0,
            },
            leader_seen: false,
            caught_up: false,
            failure: None,
        };
        core.redraw_election_timeout();
        if restart {
            // Applies the committed entries after the snapshot (raft-rs hands them over in the
            // first Ready), so the node starts from the configuration it had.
            core.drive(now_ns);
            if let Some(failure) = core.failure.take() {
                return Err(failure);
            }
        }
        Ok(core)
    }

    /// The configuration a node starts from: `initial` for a new store; for a restart, the
    /// configuration of the kept snapshot, checked to be of this cluster and voters.
    fn kept_configuration(
        store: &RaftStore,
        initial: &Configuration,
        restart: bool,
    ) -> Result<Configuration, ConfigError> {
        let path =
            || store.path().map_or_else(|| std::path::PathBuf::from("(in memory)"), std::path::Path::to_path_buf);
        let refused = |problem| ConfigError::State { path: path(), problem };
        if restart != store.is_restored() {
            return Err(refused(if restart {
                crate::error::StateProblem::NoState
            } else {
                crate::error::StateProblem::HoldsState
            }));
        }
        if !restart {
            return Ok(initial.clone());
        }
        let (metadata, data) = store.snapshot_parts();
        let configuration = Configuration::decode(data).map_err(|_| {
            refused(crate::error::StateProblem::Damaged { key: "snapshot_data".into(), problem: "not a configuration" })
        })?;
        if configuration.cluster_id() != initial.cluster_id() {
            return Err(refused(crate::error::StateProblem::OtherCluster {
                problem: format!(
                    "cluster id {:#018x}, the cluster file's is {:#018x}",
                    configuration.cluster_id(),
                    initial.cluster_id()
                ),
            }));
        }
        let mut voters = metadata.get_conf_state().voters.clone();
        voters.sort_unstable();
        if voters != raft_voters(initial.servers().len()) {
            return Err(refused(crate::error::StateProblem::OtherCluster {
                problem: format!("Raft voters {voters:?}, {} servers in the cluster file", initial.servers().len()),
            }));
        }
        Ok(configuration)
    }

    /// Draws the Raft election timeout anew when raft-rs did (its term or role changed, or its
    /// timeout is not the one drawn last), from the node's own generator (`ElectionTimeouts`).
    fn redraw_election_timeout(&mut self) {
        let raft = &mut self.raft.raft;
        let election = &mut self.election;
        if raft.term == election.term
            && raft.state == election.role
            && raft.randomized_election_timeout() == election.drawn
        {
            return;
        }
        let ticks = raft.election_timeout();
        election.drawn = election.rng.gen_range(ticks..2 * ticks);
        election.term = raft.term;
        election.role = raft.state;
        // Public in raft-rs 0.7 (hidden from its docs, for tests of leases): the range it
        // asserts is the one drawn from.
        raft.set_randomized_election_timeout(election.drawn);
    }

    /// This node's server.
    pub fn me(&self) -> ServerId {
        self.me
    }

    /// The newest configuration this node knows (committed).
    pub fn configuration(&self) -> &Arc<Configuration> {
        &self.configuration
    }

    /// Grows whenever [`ConfigCore::configuration`] changes.
    pub fn configuration_version(&self) -> u64 {
        self.version
    }

    /// Whether this server may serve `partition` as its primary at `now_ns` (its own clock).
    pub fn lease_valid(&self, partition: u32, now_ns: u64) -> bool {
        now_ns < self.lease_expires_ns
            && self.configuration.primary_of(partition) == Some(self.me)
            && self.configuration.is_admitted(self.me, self.incarnation)
    }

    /// When this server's lease ends, by its own clock (0: never granted).
    pub fn lease_expires_ns(&self) -> u64 {
        self.lease_expires_ns
    }

    /// Whether this node is the Raft leader.
    pub fn is_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// The Raft leader this node knows of.
    pub fn leader(&self) -> Option<ServerId> {
        let id = self.raft.raft.leader_id;
        (id != raft::INVALID_ID).then(|| (id - 1) as ServerId)
    }

    /// The Raft commit index.
    pub fn commit_index(&self) -> u64 {
        self.raft.raft.raft_log.committed
    }

    /// Whether this node votes (false while a rejoining node catches up).
    pub fn votes(&self) -> bool {
        matches!(self.vote_gate, VoteGate::Open)
    }

    /// Whether this node has known a Raft leader since it started. Until then the commit index
    /// of a node restarted from its directory is its last run's, which says nothing of whether
    /// the group is running now (`client::start_mode` asks exactly that).
    pub fn leader_seen(&self) -> bool {
        self.leader_seen
    }

    /// Whether this node has caught up with a leader since it started: it applied a commit
    /// index that covers an entry of the current leader's term. Every configuration committed
    /// before that leader took over is then in its log before that entry, so the node's
    /// configuration is at least the newest one committed before this moment (a server
    /// restarting from its directory decides from it whether it resumes: `rampkv-net`'s
    /// `server::resume`). Sticky: configurations committed later come as usual.
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// Why the node stopped: a write of its Raft state failed (`ConfigError::State`). It then
    /// sends nothing, takes nothing, grants and holds no lease: a node that cannot keep its
    /// state must not vote or acknowledge again (fail-stop; the others go on without it).
    pub fn failure(&self) -> Option<&ConfigError> {
        self.failure.as_ref()
    }

    /// A store write failed. A disk failure stops the node; a refusal (a change that does not
    /// fit the log, which left the store as it was) is returned to the caller.
    fn on_store_error(&mut self, error: raft::Error) -> Option<raft::Error> {
        match into_disk_failure(error) {
            Ok(failure) => {
                self.failure = Some(failure);
                self.outbox.clear();
                self.lease_expires_ns = 0;
                self.leader = None;
                None
            }
            Err(refusal) => Some(refusal),
        }
    }

    /// When the caller should call [`ConfigCore::tick`] next, at the latest.
    pub fn next_deadline_ns(&self) -> u64 {
        self.next_tick_ns.min(self.next_heartbeat_ns)
    }

    /// Messages to send: (destination server, message).
    pub fn take_outbox(&mut self) -> Vec<(ServerId, Message)> {
        debug_assert!(self.failure.is_none() || self.outbox.is_empty(), "a stopped node sends nothing");
        std::mem::take(&mut self.outbox)
    }

    /// This server holds `partition`'s snapshot and the log since (it was catching up):
    /// reported to the leader with every heartbeat until the configuration shows it in sync.
    pub fn report_caught_up(&mut self, partition: u32, now_ns: u64) {
        self.report_backup_caught_up(partition, self.me, self.incarnation, now_ns);
    }

    /// As the primary of `partition`: the catching-up `server` (process `incarnation`) holds
    /// the partition's snapshot and the log since, and this primary acknowledges no write it
    /// does not hold (the primary is who knows that: it holds the replies). Reported to the
    /// leader with every heartbeat until the configuration shows it in sync.
    pub fn report_backup_caught_up(&mut self, partition: u32, server: ServerId, incarnation: u64, now_ns: u64) {
        if self.failure.is_some() {
            return;
        }
        let report = (server, incarnation, partition);
        if !self.caught_up_pending.contains(&report) && partition < self.configuration.partition_count() {
            self.caught_up_pending.push(report);
        }
        self.send_caught_up_reports(now_ns);
    }

    /// The transport could not hand a Raft message to server `to` (no connection, a full queue,
    /// a failed write). raft-rs learns of losses only this way: told, it re-sends from what the
    /// peer acknowledged instead of waiting for answers that will not come. `snapshot`: the
    /// message was a snapshot, for which raft-rs would otherwise wait forever.
    pub fn report_undelivered(&mut self, to: ServerId, snapshot: bool, now_ns: u64) {
        let id = raft_id(to);
        if to == self.me || self.raft.raft.prs().get(id).is_none() || self.failure.is_some() {
            return;
        }
        if snapshot {
            self.raft.report_snapshot(id, raft::SnapshotStatus::Failure);
        }
        self.raft.report_unreachable(id);
        self.drive(now_ns);
    }

    /// A snapshot for server `to` was written whole to its connection. Whether it arrives is not
    /// known; raft-rs probes from the snapshot on and sends it again if the peer lacks it.
    pub fn report_snapshot_sent(&mut self, to: ServerId, now_ns: u64) {
        let id = raft_id(to);
        if to == self.me || self.raft.raft.prs().get(id).is_none() || self.failure.is_some() {
            return;
        }
        self.raft.report_snapshot(id, raft::SnapshotStatus::Finish);
        self.drive(now_ns);
    }

    /// Advances time: Raft ticks, heartbeats, the leader's duties.
    pub fn tick(&mut self, now_ns: u64) {
        if self.failure.is_some() {
            return;
        }
        if now_ns >= self.next_tick_ns {
            // One Raft tick per call even if the caller was late: a descheduled node should
            // not fire several election timeouts at once (Raft timing is only for liveness).
            self.raft.tick();
            self.next_tick_ns = (self.next_tick_ns + self.timing.tick_ns()).max(now_ns + 1);
        }
        if now_ns >= self.next_heartbeat_ns {
            self.next_heartbeat_ns = now_ns + self.timing.heartbeat_interval_ns();
            self.send_heartbeats(now_ns);
            self.send_caught_up_reports(now_ns);
        }
        self.drive(now_ns);
        self.leader_duties(now_ns);
        self.drive(now_ns);
    }

    /// Takes a message from server `from` (already checked to come from it by the transport).
    ///
    /// # Errors
    /// [`ConfigError::ProtocolViolation`] for a message a peer may not send; the caller drops
    /// the connection.
    pub fn receive(&mut self, from: ServerId, message: Message, now_ns: u64) -> Result<(), ConfigError> {
        let violation = |problem| ConfigError::ProtocolViolation { peer: format!("server {from}"), problem };
        if self.failure.is_some() {
            return Ok(());
        }
        match message {
            Message::Raft(raft_message) => {
                self.check_raft_message(from, &raft_message).map_err(violation)?;
                self.step_raft(*raft_message);
            }
            Message::Heartbeat(heartbeat) => {
                if heartbeat.from != from {
                    return Err(violation("heartbeat names another server"));
                }
                self.on_heartbeat(heartbeat, now_ns);
            }
            Message::LeaseGrant(grant) => self.on_grant(grant, now_ns),
            Message::CaughtUp { from: reporter, incarnation, partition, .. } => {
                // The catching-up server itself, or the partition's primary, may report.
                if reporter != from && self.configuration.primary_of(partition) != Some(from) {
                    return Err(violation("catch-up report names another server"));
                }
                if let Some(leader) = &mut self.leader {
                    if !leader.caught_up.contains(&(reporter, incarnation, partition)) {
                        leader.caught_up.push((reporter, incarnation, partition));
                    }
                }
            }
            _ => return Err(violation("message kind not sent between nodes after the hello")),
        }
        self.drive(now_ns);
        Ok(())
    }

    /// Refuses what a peer may not send, and what would make raft-rs panic.
    fn check_raft_message(&self, from: ServerId, message: &eraftpb::Message) -> Result<(), &'static str> {
        if message.from != raft_id(from) || message.to != raft_id(self.me) {
            return Err("raft message with the wrong sender or receiver");
        }
        match message.get_msg_type() {
            MessageType::MsgHup
            | MessageType::MsgBeat
            | MessageType::MsgPropose
            | MessageType::MsgUnreachable
            | MessageType::MsgSnapStatus
            | MessageType::MsgCheckQuorum
            | MessageType::MsgReadIndex => Err("raft message type that never travels between our nodes"),
            MessageType::MsgSnapshot => {
                // Compared as sets: raft-rs keeps its voters in a hash set, whose order is not
                // the order of the snapshot's list.
                let mut voters = message.get_snapshot().get_metadata().get_conf_state().voters.clone();
                voters.sort_unstable();
                let mut ours: Vec<u64> = self.raft.raft.prs().conf().voters().ids().iter().collect();
                ours.sort_unstable();
                if voters != ours {
                    return Err("raft snapshot of another voter set");
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn step_raft(&mut self, mut message: eraftpb::Message) {
        let kind = message.get_msg_type();
        let last_index = self.raft.raft.raft_log.last_index();
        if kind == MessageType::MsgHeartbeat && message.commit > last_index {
            // A leader's heartbeat commits min(what it believes we hold, its commit). After we
            // restarted with an empty log it still believes we hold what we lost (raft-rs
            // assumes durable logs and would panic on it), until it sees our new incarnation
            // and resets our progress: commit only what we hold.
            message.commit = last_index;
        }
        if let VoteGate::Closed { target } = &mut self.vote_gate {
            // Not caught up: this node may have voted in the candidate's term before it lost its
            // state, and its empty log takes any candidate's log as up to date, so raft-rs would
            // grant. (Pre-)vote requests are not stepped at all (no answer, and the term stays),
            // nor is a leader's order to campaign at once.
            if matches!(kind, MessageType::MsgRequestVote | MessageType::MsgRequestPreVote | MessageType::MsgTimeoutNow)
            {
                return;
            }
            if kind == MessageType::MsgAppend && target.is_none() && message.commit > 0 {
                *target = Some(message.commit);
            }
        }
        // raft-rs refuses messages of unknown peers and local kinds with an error: nothing to do.
        let _ = self.raft.step(message);
    }

    fn send_heartbeats(&mut self, now_ns: u64) {
        let heartbeat = Heartbeat {
            from: self.me,
            incarnation: self.incarnation,
            known_epoch: self.configuration.epoch(),
            sent_at_ns: now_ns,
        };
        for server in 0..self.configuration.servers().len() as ServerId {
            if server != self.me {
                self.outbox.push((server, Message::Heartbeat(heartbeat)));
            }
        }
        self.on_heartbeat(heartbeat, now_ns);
    }

    fn send_caught_up_reports(&mut self, now_ns: u64) {
        let configuration = Arc::clone(&self.configuration);
        self.caught_up_pending.retain(|(server, incarnation, partition)| {
            configuration.is_admitted(*server, *incarnation)
                && configuration.replica_set(*partition).is_some_and(|set| set.catching_up.contains(server))
        });
        for (server, incarnation, partition) in self.caught_up_pending.clone() {
            let message = Message::CaughtUp { from: server, incarnation, partition, epoch: configuration.epoch() };
            for server in 0..configuration.servers().len() as ServerId {
                if server != self.me {
                    self.outbox.push((server, message.clone()));
                }
            }
            let _ = self.receive(self.me, message, now_ns);
        }
    }

    fn on_heartbeat(&mut self, heartbeat: Heartbeat, now_ns: u64) {
        let server = usize::from(heartbeat.from);
        if server >= self.heard_any.len() {
            return;
        }
        self.heard_any[server] = (heartbeat.incarnation, now_ns);
        self.heard_ever[server] = true;
        if self.configuration.is_admitted(heartbeat.from, heartbeat.incarnation) {
            self.heard_admitted_ns[server] = now_ns;
        }
        let admitted = self.configuration.is_admitted(heartbeat.from, heartbeat.incarnation);
        if let Some(leader) = &mut self.leader {
            leader.pending.retain(|pending| pending.from != heartbeat.from);
            leader.pending.push(heartbeat);
            if !admitted && leader.reset_incarnation[server] != Some(heartbeat.incarnation) && heartbeat.from != self.me
            {
                // A new incarnation: its Raft log is gone. Forget what we believed it held, so
                // it is sent the log from the start (or a snapshot) and never counted for an
                // entry it lost.
                leader.reset_incarnation[server] = Some(heartbeat.incarnation);
                let id = raft_id(heartbeat.from);
                if let Some(progress) = self.raft.raft.mut_prs().get_mut(id) {
                    progress.matched = 0;
                    // A snapshot in flight went to the old process.
                    progress.snapshot_failure();
                    progress.become_probe();
                    // Probe now rather than at the next Raft heartbeat's answer: the sooner it
                    // holds the log, the sooner it votes again (see `VoteGate`).
                    self.raft.raft.send_append(id);
                }
            }
        }
    }

    fn on_grant(&mut self, grant: LeaseGrant, now_ns: u64) {
        if grant.to != self.me || grant.incarnation != self.incarnation || grant.heartbeat_sent_at_ns > now_ns {
            return;
        }
        if !grant.configuration.is_empty() {
            match Configuration::decode(&grant.configuration) {
                Ok(configuration) if configuration.cluster_id() == self.configuration.cluster_id() => {
                    self.install(configuration);
                }
                _ => return,
            }
        }
        // A grant for an epoch whose configuration we do not hold cannot be used: the leader
        // sends the configuration with it whenever our heartbeat named an older epoch.
        if grant.epoch > self.configuration.epoch() {
            return;
        }
        let end = grant.heartbeat_sent_at_ns.saturating_add(self.timing.holder_lease_ns(grant.lease_ns));
        self.lease_expires_ns = self.lease_expires_ns.max(end);
    }

    /// Installs a newer committed configuration (from the log, a snapshot or a grant).
    fn install(&mut self, configuration: Configuration) {
        if configuration.epoch() <= self.configuration.epoch() {
            return;
        }
        debug_assert!(configuration.validate().is_ok());
        for (server, (incarnation, heard_ns)) in self.heard_any.iter().enumerate() {
            if configuration.is_admitted(server as ServerId, *incarnation) && *heard_ns > 0 {
                self.heard_admitted_ns[server] = self.heard_admitted_ns[server].max(*heard_ns);
            }
        }
        self.configuration = Arc::new(configuration);
        self.version += 1;
    }

    /// Processes everything raft-rs has ready: store, send, apply.
    ///
    /// Raft's rule, that term, vote and log are stable before the messages that reveal them
    /// leave, holds because every store write below returns only once it is on disk and every
    /// message goes to the outbox, which the caller sends after this returns. The committed
    /// entries are applied after the write of the same Ready (with its commit index), so a
    /// node's configuration never runs ahead of what it would apply again after a restart.
    fn drive(&mut self, now_ns: u64) {
        if self.failure.is_some() {
            return;
        }
        // Every event that can change the term or the role (a tick, a message) ends here.
        self.redraw_election_timeout();
        // Each pass consumes one Ready; raft-rs produces a bounded number per event.
        for _ in 0..16 {
            if !self.raft.has_ready() {
                return;
            }
            let mut ready = self.raft.ready();
            self.send_raft(ready.take_messages());
            if !ready.snapshot().is_empty() {
                let snapshot = ready.snapshot().clone();
                self.install_snapshot(snapshot);
                if self.failure.is_some() {
                    return;
                }
            }
            let persisted = self.raft.mut_store().persist(ready.entries(), ready.hs());
            if let Err(error) = persisted {
                // raft-rs only hands us appendable entries; a refusal would be our bug.
                if let Some(refusal) = self.on_store_error(error) {
                    panic!("raft-rs appends continue the log: {refusal}");
                }
                return;
            }
            let committed = ready.take_committed_entries();
            self.apply(committed, now_ns);
            if self.failure.is_some() {
                return;
            }
            if let Some(soft_state) = ready.ss() {
                self.on_role(soft_state.raft_state, now_ns);
            }
            let read_states = ready.take_read_states();
            self.send_raft(ready.take_persisted_messages());
            let mut light = self.raft.advance(ready);
            if let Some(commit) = light.commit_index() {
                if let Err(error) = self.raft.mut_store().set_commit(commit) {
                    if let Some(refusal) = self.on_store_error(error) {
                        panic!("setting the commit index is never refused: {refusal}");
                    }
                    return;
                }
            }
            self.send_raft(light.take_messages());
            self.apply(light.take_committed_entries(), now_ns);
            if self.failure.is_some() {
                return;
            }
            self.raft.advance_apply();
            self.leader_seen |= self.raft.raft.leader_id != raft::INVALID_ID;
            self.note_caught_up();
            for state in read_states {
                self.on_read_state(&state.request_ctx, now_ns);
            }
        }
    }

    /// Notes that the node caught up with a leader ([`ConfigCore::caught_up`]): a leader is
    /// known, the commit index is in the current term (raft-rs's `commit_to_current_term`,
    /// true on a follower too once a leader's append told it a commit of its term), and
    /// everything committed is applied.
    fn note_caught_up(&mut self) {
        let raft = &self.raft.raft;
        if !self.caught_up
            && raft.leader_id != raft::INVALID_ID
            && raft.commit_to_current_term()
            && self.applied >= raft.raft_log.committed
        {
            self.caught_up = true;
        }
    }

    fn send_raft(&mut self, messages: Vec<eraftpb::Message>) {
        for message in messages {
            if let VoteGate::Closed { .. } = self.vote_gate {
                let kind = message.get_msg_type();
                // The other side of the gate in `step_raft`: vote requests never reach raft-rs,
                // so it cannot have granted one.
                assert!(
                    !matches!(kind, MessageType::MsgRequestVoteResponse | MessageType::MsgRequestPreVoteResponse),
                    "a node that has not caught up answered a vote request"
                );
                // raft-rs campaigns on its election timeout; a node that has not caught up
                // keeps its campaign to itself (it could only win with votes it must not count on).
                if matches!(kind, MessageType::MsgRequestVote | MessageType::MsgRequestPreVote) {
                    continue;
                }
            }
            let to = (message.to - 1) as ServerId;
            self.outbox.push((to, Message::Raft(Box::new(message))));
        }
    }

    fn install_snapshot(&mut self, snapshot: eraftpb::Snapshot) {
        let index = snapshot.get_metadata().index;
        let configuration = Configuration::decode(&snapshot.data)
            .ok()
            .filter(|configuration| configuration.cluster_id() == self.configuration.cluster_id());
        match self.raft.mut_store().apply_snapshot(snapshot) {
            Ok(()) => self.applied = self.applied.max(index),
            Err(error) => {
                // Out of date: the store is as it was, the configuration may still be newer.
                if self.on_store_error(error).is_none() {
                    return;
                }
            }
        }
        if let Some(configuration) = configuration {
            self.install(configuration);
        }
    }

    fn apply(&mut self, entries: Vec<Entry>, now_ns: u64) {
        for entry in entries {
            self.applied = entry.index;
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                continue;
            }
            // A proposal that does not apply (made against an older epoch) is skipped by every
            // node alike: applying is a pure function of the configuration and the entry.
            if let Ok(proposal) = Proposal::decode(&entry.data) {
                if let Ok(next) = self.configuration.apply(&proposal) {
                    self.install(next);
                }
            }
        }
        if let VoteGate::Closed { target: Some(target) } = self.vote_gate {
            if self.applied >= target {
                // On disk before the gate opens: a restart must not open it earlier.
                if let Err(error) = self.raft.mut_store().set_votes() {
                    if let Some(refusal) = self.on_store_error(error) {
                        panic!("marking a node as voting is never refused: {refusal}");
                    }
                    return;
                }
                self.vote_gate = VoteGate::Open;
            }
        }
        if let Some(leader) = &mut self.leader {
            if leader.proposal.is_some_and(|(index, _)| index <= self.applied) {
                leader.proposal = None;
            }
        }
        self.compact();
        let _ = now_ns;
    }

    fn compact(&mut self) {
        let store = self.raft.store();
        if store.entry_count() <= self.log_entries_kept || self.applied > store.last_index().unwrap_or(0) {
            return;
        }
        let state = self.configuration.encode();
        // Applied entries are committed: compacting them is not refused (were it, the entries
        // would only cost room); a disk failure stops the node.
        if let Err(error) = self.raft.mut_store().compact(self.applied, state) {
            let _ = self.on_store_error(error);
        }
    }

    fn on_role(&mut self, role: StateRole, now_ns: u64) {
        match role {
            StateRole::Leader if self.leader.is_none() => {
                self.leader = Some(LeaderState {
                    since_ns: now_ns,
                    confirmed_ns: now_ns,
                    pending: Vec::new(),
                    read_round: None,
                    next_context: 1,
                    proposal: None,
                    caught_up: Vec::new(),
                    reset_incarnation: vec![None; self.heard_any.len()],
                });
            }
            StateRole::Leader => {}
            _ => self.leader = None,
        }
    }

    /// Whether the leader may grant leases and propose: it committed an entry of its term,
    /// applied all of its log, and has no change in flight.
    fn leader_settled(&self) -> bool {
        let raft = &self.raft.raft;
        self.leader.as_ref().is_some_and(|leader| leader.proposal.is_none())
            && raft.commit_to_current_term()
            && self.applied == raft.raft_log.last_index()
    }

    fn leader_duties(&mut self, now_ns: u64) {
        let settled = self.leader_settled();
        let commit_in_term = self.raft.raft.commit_to_current_term();
        let Some(leader) = &mut self.leader else {
            return;
        };
        if leader.proposal.is_some_and(|(_, deadline)| now_ns >= deadline) {
            leader.proposal = None;
        }
        if leader
            .read_round
            .as_ref()
            .is_some_and(|round| now_ns >= round.issued_ns + CONFIG_READ_INDEX_TIMEOUT_MS * NANOS_PER_MS)
        {
            leader.read_round = None;
        }
        if leader.read_round.is_none() && !leader.pending.is_empty() && commit_in_term {
            let context = leader.next_context.to_le_bytes().to_vec();
            leader.next_context += 1;
            let heartbeats = std::mem::take(&mut leader.pending);
            leader.read_round = Some(ReadRound { context: context.clone(), heartbeats, issued_ns: now_ns });
            self.raft.read_index(context);
        }
        // Judge failures only while a majority keeps confirming this leader: a leader cut off
        // from its majority (its voters paused or partitioned away) hears no heartbeats either,
        // and a change it proposed then would commit the moment the majority came back.
        let judging = self.leader.as_ref().is_some_and(|leader| {
            now_ns >= leader.since_ns + self.timing.leader_lease_ns()
                && now_ns < leader.confirmed_ns + self.timing.lease_ns()
        });
        if settled && judging {
            self.propose_changes(now_ns);
        }
    }

    fn on_read_state(&mut self, context: &[u8], now_ns: u64) {
        let settled = self.leader_settled();
        let Some(leader) = &mut self.leader else {
            return;
        };
        if leader.read_round.as_ref().is_none_or(|round| round.context != context) {
            return;
        }
        let round = leader.read_round.take().expect("checked above");
        // A majority confirmed this leader again after a lease or more without: every server
        // it could not hear meanwhile (its heartbeats had no leader that could answer them)
        // gets a lease from now before it is judged, as after an election.
        if now_ns >= leader.confirmed_ns + self.timing.lease_ns() {
            leader.since_ns = now_ns;
        }
        leader.confirmed_ns = now_ns;
        if !settled {
            // Not now (a change is in flight): these servers heartbeat again soon.
            return;
        }
        for heartbeat in round.heartbeats {
            self.grant(heartbeat, now_ns);
        }
    }

    fn grant(&mut self, heartbeat: Heartbeat, now_ns: u64) {
        let configuration = &self.configuration;
        if !configuration.is_admitted(heartbeat.from, heartbeat.incarnation) && configuration.is_member(heartbeat.from)
        {
            // A new incarnation of a server that still holds replicas (it restarted, its data is
            // gone): no lease until its old incarnation is failed over.
            return;
        }
        let grant = LeaseGrant {
            to: heartbeat.from,
            incarnation: heartbeat.incarnation,
            epoch: configuration.epoch(),
            heartbeat_sent_at_ns: heartbeat.sent_at_ns,
            lease_ns: self.timing.lease_ns(),
            configuration: if heartbeat.known_epoch < configuration.epoch() {
                configuration.encode()
            } else {
                Vec::new()
            },
        };
        if heartbeat.from == self.me {
            self.on_grant(grant, now_ns);
        } else {
            self.outbox.push((heartbeat.from, Message::LeaseGrant(grant)));
        }
    }

    /// The leader's failure detector, admission, rejoin and catch-up completion: one proposal.
    fn propose_changes(&mut self, now_ns: u64) {
        let lease_ns = self.timing.leader_lease_ns();
        let base = Arc::clone(&self.configuration);
        let servers = base.servers().len();
        // A server never heard from may still be starting (a cluster's processes come up one
        // by one, slowly on a loaded machine): it gets a grace before it is judged, or a
        // cluster would fail its last server over before that server could say it is there.
        let grace_over = match &mut self.startup {
            Some(since_ns) => now_ns >= *since_ns.get_or_insert(now_ns) + CONFIG_STARTUP_GRACE_MS * NANOS_PER_MS,
            None => true,
        };
        let failed: Vec<bool> = (0..servers)
            .map(|server| {
                let never_heard = !self.heard_ever[server];
                now_ns.saturating_sub(self.heard_admitted_ns[server]) >= lease_ns && (grace_over || !never_heard)
            })
            .collect();
        let mut draft = (*base).clone();
        let mut changes = Vec::new();
        let mut add = |draft: &mut Configuration, change: Change| {
            if let Ok(next) = draft.apply(&Proposal { base_epoch: draft.epoch(), changes: vec![change] }) {
                *draft = next;
                changes.push(change);
            }
        };
        for partition in 0..base.partition_count() {
            let set = base.replica_set(partition).expect("partition below the count").clone();
            if set.primary.is_some_and(|primary| failed[usize::from(primary)]) {
                match set.backups.iter().find(|backup| !failed[usize::from(**backup)]) {
                    Some(backup) => {
                        add(&mut draft, Change::Promote { partition, server: *backup });
                        // The new primary adopts its copy of the old one into its store: data
                        // no record of its own stream describes. The other in-sync backups
                        // hold that data only in their copy of the old primary, not in their
                        // copy of the new one, which is what a later promotion would take
                        // over: they copy the partition afresh (a snapshot, rejoin) before
                        // they may be promoted again.
                        for other in
                            set.backups.iter().filter(|other| *other != backup && !failed[usize::from(**other)])
                        {
                            add(&mut draft, Change::RemoveReplica { partition, server: *other });
                            add(&mut draft, Change::AddCatchingUp { partition, server: *other });
                        }
                    }
                    None => {
                        for backup in &set.backups {
                            add(&mut draft, Change::RemoveReplica { partition, server: *backup });
                        }
                        add(&mut draft, Change::PrimaryLost { partition });
                    }
                }
            }
            for member in set.backups.iter().chain(&set.catching_up) {
                if failed[usize::from(*member)] {
                    add(&mut draft, Change::RemoveReplica { partition, server: *member });
                }
            }
        }
        // A restarted server (new incarnation, heard lately) holding no replica is admitted.
        for server in 0..servers as ServerId {
            let (incarnation, heard_ns) = self.heard_any[usize::from(server)];
            let alive = heard_ns > 0 && now_ns.saturating_sub(heard_ns) < lease_ns;
            if alive && !draft.is_admitted(server, incarnation) && !draft.is_member(server) {
                add(&mut draft, Change::Admit { server, incarnation });
            }
        }
        if let Some(leader) = &mut self.leader {
            for (server, incarnation, partition) in std::mem::take(&mut leader.caught_up) {
                if draft.is_admitted(server, incarnation) {
                    add(&mut draft, Change::CaughtUp { partition, server });
                }
            }
        }
        // Partitions short of copies get a live admitted server to copy them (fewest copies first).
        let alive_admitted: Vec<ServerId> = (0..servers as ServerId)
            .filter(|server| {
                let (incarnation, heard_ns) = self.heard_any[usize::from(*server)];
                heard_ns > 0 && now_ns.saturating_sub(heard_ns) < lease_ns && draft.is_admitted(*server, incarnation)
            })
            .collect();
        // Partitions whose replica sets are the same (a server's partitions, which start
        // together and fail over together) get the same server, so that they stay together:
        // clients route a server's partitions as one (`rampkv_net::server::failover::routes`).
        let mut chosen: Vec<(ReplicaSet, ServerId)> = Vec::new();
        for partition in 0..base.partition_count() {
            let set = draft.replica_set(partition).expect("partition below the count").clone();
            if set.primary.is_none() || set.members().count() >= draft.replicas() as usize {
                continue;
            }
            let load = |server: &ServerId| draft.replica_sets().iter().filter(|set| set.contains(*server)).count();
            let candidate = match chosen.iter().find(|(same, _)| *same == set) {
                Some((_, server)) => Some(*server),
                None => alive_admitted
                    .iter()
                    .filter(|server| !set.contains(**server))
                    .min_by_key(|server| (load(server), **server))
                    .copied(),
            };
            if let Some(server) = candidate {
                chosen.push((set, server));
                add(&mut draft, Change::AddCatchingUp { partition, server });
            }
        }
        if changes.is_empty() {
            return;
        }
        let proposal = Proposal { base_epoch: base.epoch(), changes };
        debug_assert!(base.apply(&proposal).is_ok());
        if self.raft.propose(Vec::new(), proposal.encode()).is_ok() {
            let index = self.raft.raft.raft_log.last_index();
            if let Some(leader) = &mut self.leader {
                leader.proposal = Some((index, now_ns + CONFIG_PROPOSAL_TIMEOUT_MS * NANOS_PER_MS));
            }
        }
    }
}
