//! Cooperative termination (RAMP's CTP): resolving transactions whose writer died between
//! PREPARE and COMMIT.
//!
//! # Protocol
//! A resolver thread per server group scans its stores every `RECOVERY_SCAN_MS` for
//! transactions prepared longer than the recovery timeout ago and still not committed. For
//! each, it asks every other participant (the servers owning keys of its write set, kept with
//! the prepared versions) for the transaction's STATUS, over the ordinary client path:
//! - if any participant committed it, or every participant has it prepared, the writer's
//!   decision was (or may safely be) commit: COMMIT it here and at every participant;
//! - if some participant never prepared it, that participant now refuses the PREPARE for good
//!   (answering "unknown" marks it aborted there), so the writer can never commit it anywhere:
//!   abort it here (drop the prepared versions). The other participants reach the same verdict
//!   when they ask.
//! - an unreachable participant leaves the transaction for the next scan.
//!
//! A server decides only the transactions whose keys here it serves now: with failover, a
//! deposed primary's store may hold a PREPARE its successor never received, and only the
//! partition's current primary may decide it (`ResolverThread::resolve`).
//!
//! Readers never wait for any of this: a prepared version is invisible until committed, and a
//! round-2 read asks only for versions some participant has committed, which recovery commits.
//! The resolution must happen well within the GC grace period (a committed version is kept at
//! least that long), which a timeout of a second and scans every 100 ms leave far behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::server::{ServerGroup, Servers};
use crate::transport::{ClientTransport, ServerEvent, TcpClientTransport};
use rampkv_core::cluster::Cluster;
use rampkv_core::storage::PendingTxn;
use rampkv_core::types::Timestamp;
use rampkv_core::wire::{Request, Response, TxnState, WriteSet};

/// How often the resolver scans for stale prepared transactions.
pub const RECOVERY_SCAN_MS: u64 = 100;
/// Default: a transaction prepared this long ago and not committed is resolved.
pub const RECOVERY_TIMEOUT_MS: u64 = 1_000;
/// How long the resolver waits for a participant's answer.
const RECOVERY_REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// Most transactions resolved per scan (the rest wait for the next scan).
const RECOVERY_BATCH_MAX: usize = 1_024;

/// What a resolution decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Committed,
    Aborted,
    /// A participant could not be asked; try again later.
    Undecided,
}

/// The verdict on a stale prepared transaction from what every other participant answered
/// (this server has it prepared). `None` in `states`: a participant could not be asked.
pub fn verdict(states: &[Option<TxnState>]) -> Verdict {
    if states.contains(&Some(TxnState::Committed)) {
        return Verdict::Committed; // readers may have seen it: it must stand everywhere
    }
    if states.iter().any(Option::is_none) {
        return Verdict::Undecided;
    }
    match states.iter().all(|state| *state == Some(TxnState::Prepared)) {
        true => Verdict::Committed,
        false => Verdict::Aborted,
    }
}

/// The other participants of a transaction with `write_set`, and its keys at each.
pub fn participants(cluster: &Cluster, own: usize, write_set: &WriteSet) -> Vec<(usize, Vec<Vec<u8>>)> {
    let mut participants: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
    for key in write_set {
        let server = cluster.server_of(key);
        if server == own {
            continue;
        }
        match participants.iter_mut().find(|(known, _)| *known == server) {
            Some((_, keys)) => keys.push(key.to_vec()),
            None => participants.push((server, vec![key.to_vec()])),
        }
    }
    participants
}

/// Starts cooperative termination on a running [`ServerGroup`]. A trait of this layer rather
/// than a method of the group: the resolver is a client of the other servers (it asks them over
/// [`TcpClientTransport`]), which the server layer below knows nothing of. Bring it into scope
/// (`use rampkv_net::recovery::StartRecovery`) and call `group.start_recovery(..)`.
pub trait StartRecovery {
    /// Starts cooperative termination for these servers, which are servers
    /// `first_index..first_index + count` of `cluster`: transactions prepared longer than
    /// `timeout_ms` ago and not committed are resolved with the other participants. From now on
    /// each server also refuses requests for keys outside its partitions and HELLOs from
    /// clients whose cluster file differs (`ServerCore::join_cluster`).
    ///
    /// # Errors
    /// Servers not all in `cluster`, a server given its cluster twice, or a resolver thread that
    /// cannot be spawned.
    fn start_recovery(&mut self, cluster: Cluster, first_index: usize, timeout_ms: u64) -> std::io::Result<()>;
}

impl StartRecovery for ServerGroup {
    fn start_recovery(&mut self, cluster: Cluster, first_index: usize, timeout_ms: u64) -> std::io::Result<()> {
        self.join_cluster(&cluster, first_index)?;
        let resolver = spawn_resolver(Arc::clone(self.servers()), first_index, cluster, timeout_ms)?;
        self.keep_resolver(Box::new(resolver));
        Ok(())
    }
}

/// A running resolver; stops when dropped.
#[derive(Debug)]
pub struct Resolver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Starts a resolver for `servers`, which are servers `first_index..` of `cluster` (their
/// group's clock is the one prepares are stamped with).
pub fn spawn_resolver(
    servers: Arc<Servers>,
    first_index: usize,
    cluster: Cluster,
    timeout_ms: u64,
) -> std::io::Result<Resolver> {
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = Arc::clone(&stop);
    let thread = std::thread::Builder::new().name("rampkv-recovery".into()).spawn(move || {
        let mut resolver = ResolverThread { servers, first_index, cluster, timeout_ms, links: Vec::new(), next_id: 0 };
        while !thread_stop.load(Ordering::Acquire) {
            std::thread::park_timeout(Duration::from_millis(RECOVERY_SCAN_MS));
            resolver.scan();
        }
    })?;
    Ok(Resolver { stop, thread: Some(thread) })
}

struct ResolverThread {
    servers: Arc<Servers>,
    first_index: usize,
    cluster: Cluster,
    timeout_ms: u64,
    /// Per server of the cluster file: the connection to the address serving its partitions
    /// (with failover, the primary the configuration names), opened only to ask it something.
    links: Vec<Option<Link>>,
    next_id: u64,
}

impl ResolverThread {
    fn now_ms(&self) -> u64 {
        self.servers.now_ms()
    }

    fn scan(&mut self) {
        for offset in 0..self.servers.served().len() {
            let now_ms = self.now_ms();
            let stale = self.servers.cores()[offset].store().stale_pending(now_ms.saturating_sub(self.timeout_ms));
            for (ts, pending) in stale.into_iter().take(RECOVERY_BATCH_MAX) {
                let _ = self.resolve(offset, ts, &pending);
            }
        }
    }

    /// Decides transaction `ts` prepared on core `offset`, and applies the decision. Only while
    /// the core serves every key the transaction prepared there: a deposed primary (failover)
    /// may hold a PREPARE its successor never received, and committing it at the other
    /// participants (they still have it prepared: "prepared everywhere") would make half of a
    /// transaction visible whose other half no served copy holds. The successor decides
    /// instead (it answers "unknown" for what it never received, which aborts it).
    fn resolve(&mut self, offset: usize, ts: Timestamp, pending: &PendingTxn) -> Verdict {
        let core = &self.servers.cores()[offset];
        if !pending.keys.iter().all(|key| core.serves_key(key)) {
            return Verdict::Undecided;
        }
        let participants = participants(&self.cluster, self.first_index + offset, &pending.write_set);
        let states: Vec<Option<TxnState>> = participants
            .iter()
            .map(|(server, keys)| match self.ask(*server, Request::Status { ts, keys: keys.clone() }) {
                Some(Response::Status { state }) => Some(state),
                _ => None,
            })
            .collect();
        let served = &self.servers.served()[offset];
        match verdict(&states) {
            Verdict::Undecided => return Verdict::Undecided,
            Verdict::Aborted => {
                served.abort(ts, self.now_ms()); // logged, if the server has a log
                return Verdict::Aborted;
            }
            Verdict::Committed => {}
        }
        served.commit(ts); // publishes in the item slots too, if the server has them
        for (server, _) in &participants {
            // Best effort: a participant that misses this commits when it resolves itself.
            let _ = self.ask(*server, Request::Commit { ts });
        }
        Verdict::Committed
    }

    /// Sends one request to `server` and waits for its reply: None at once if `server` is down,
    /// None as soon as it goes down, None after [`RECOVERY_REPLY_TIMEOUT`] (after which its
    /// connection is rebuilt on the next use).
    ///
    /// A connection is opened only here, right before the request that uses it is sent: a
    /// server closes a connection that sent no complete frame within its handshake timeout
    /// (`CONNECTION_HANDSHAKE_TIMEOUT_MS`), so a transport opened to every server and used for
    /// some left the others idle, to be closed and logged (issue 30; the test
    /// `the_resolver_opens_no_connection_it_does_not_use`).
    fn ask(&mut self, server: usize, request: Request) -> Option<Response> {
        // With failover, a server's partitions may be served elsewhere now: reach them there.
        let routes = self.servers.routes().unwrap_or_else(|| self.cluster.servers().to_vec());
        let address = routes.get(server)?;
        if self.links.len() < routes.len() {
            self.links.resize_with(routes.len(), || None);
        }
        let slot = &mut self.links[server];
        if slot.as_ref().is_none_or(|link| link.address != *address) {
            let transport = TcpClientTransport::connect(std::slice::from_ref(address)).ok();
            *slot = transport.map(|transport| Link { address: address.clone(), transport });
        }
        let transport = &mut slot.as_mut()?.transport;
        // A peer that is down answers nothing: no need to wait for it (the transport tries it
        // again after its backoff).
        transport.reconnect_due();
        let mut events = Vec::new();
        transport.take_server_events(&mut events);
        if transport.is_down(0) {
            return None;
        }
        self.next_id += 1;
        let id = self.next_id;
        let deadline = Instant::now() + RECOVERY_REPLY_TIMEOUT;
        let mut reply = None;
        let sent = transport.post(0, id, &request).and_then(|()| transport.flush());
        while sent.is_ok() && reply.is_none() && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let polled = transport.poll(Some(left), |_, reply_id, response| {
                if reply_id == id {
                    reply = Some(response);
                }
            });
            if polled.is_err() {
                break;
            }
            events.clear();
            transport.take_server_events(&mut events);
            if events.iter().any(|event| matches!(event, ServerEvent::Down { .. })) {
                break;
            }
        }
        // A peer that went down is taken back by the transport itself; one that answered nothing
        // in time while its connection stayed up is suspect: connect afresh on the next use.
        if reply.is_none() && !transport.is_down(0) {
            *slot = None;
        }
        reply
    }
}

/// The resolver's connection to the server of one cluster-file entry.
struct Link {
    /// Where it goes (the entry's own address, or with failover its partitions' primary's).
    address: String,
    /// A transport of that one server (server 0 of the transport).
    transport: TcpClientTransport,
}
