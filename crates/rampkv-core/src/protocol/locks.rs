//! The server side of strict two-phase locking: a lock table with wait-die.
//!
//! # Contract
//! - A transaction (named by its timestamp; smaller is older) asks for shared locks (reads) or
//!   exclusive locks (writes) on a set of keys of this server, taken in key order.
//! - Wait-die: a request that conflicts waits only if it is older than every conflicting holder;
//!   otherwise it *dies*: everything it holds here is released and the client aborts and retries
//!   with the same timestamp. Waits therefore only point from older to younger transactions,
//!   so no cycle (deadlock) can form, and a retried transaction keeps its age until it is the
//!   oldest and cannot die.
//! - Every wait is bounded ([`LOCK_WAIT_MS_MAX`]): past its deadline the request is aborted.
//! - Locks are held until COMMIT_LOCKED or RELEASE (strict 2PL), or until the connection of the
//!   transaction's last request closes (a vanished client does not hold locks forever).
//!
//! The table decides; the caller (the server core) performs the reads, staging and replies for
//! the requests the table grants or aborts.

use std::collections::BTreeMap;

use ahash::AHashMap;

use super::ConnectionId;
use crate::limits::LOCK_WAIT_MS_MAX;
use crate::storage::{Key, StoreWrite};
use crate::types::Timestamp;

/// Writes staged by a transaction until it commits: key, value and expiry.
pub type StagedWrites = Vec<StoreWrite>;

/// Lock mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    Shared,
    Exclusive,
}

/// A lock request, waiting or just decided.
#[derive(Debug)]
pub struct LockRequest {
    pub ts: Timestamp,
    pub mode: LockMode,
    /// The connection and request id to answer.
    pub connection: ConnectionId,
    pub request_id: u64,
    /// Every key of the request, in request order (for the reply).
    pub keys: Vec<Key>,
    /// The writes to stage once granted (exclusive requests).
    pub writes: StagedWrites,
    /// Shared requests of reads: per key of `keys`, the timestamp of its latest committed
    /// version when the request arrived (returned with the grant: the S2PL evidence of
    /// docs/history.md). Empty otherwise.
    pub on_arrival: Vec<Timestamp>,
    /// Keys not locked yet, sorted.
    remaining: Vec<Key>,
    deadline_ms: u64,
}

/// What became of a request.
#[derive(Debug)]
pub enum LockDecision {
    /// Every lock is held: serve the request now.
    Granted(LockRequest),
    /// The transaction must abort: its locks here were released. Reply Aborted.
    Aborted(LockRequest),
}

#[derive(Debug, Default)]
struct KeyLock {
    shared: Vec<Timestamp>,
    exclusive: Option<Timestamp>,
}

impl KeyLock {
    fn is_free(&self) -> bool {
        self.shared.is_empty() && self.exclusive.is_none()
    }

    /// Holders other than `ts` that conflict with `mode`.
    fn conflicts(&self, ts: Timestamp, mode: LockMode) -> impl Iterator<Item = Timestamp> + '_ {
        let shared = self.shared.iter().copied().filter(move |_| mode == LockMode::Exclusive);
        self.exclusive.into_iter().chain(shared).filter(move |holder| *holder != ts)
    }

    fn grant(&mut self, ts: Timestamp, mode: LockMode) {
        debug_assert!(self.conflicts(ts, mode).next().is_none(), "a lock is granted only without conflicts");
        match mode {
            LockMode::Shared if !self.shared.contains(&ts) => self.shared.push(ts),
            LockMode::Shared => {}
            LockMode::Exclusive => self.exclusive = Some(ts),
        }
    }

    fn release(&mut self, ts: Timestamp) {
        self.shared.retain(|holder| *holder != ts);
        if self.exclusive == Some(ts) {
            self.exclusive = None;
        }
    }
}

#[derive(Debug, Default)]
struct TxnLocks {
    held: Vec<Key>,
    staged: StagedWrites,
    connection: ConnectionId,
}

/// All locks of one server.
#[derive(Debug, Default)]
pub struct LockTable {
    keys: AHashMap<Key, KeyLock>,
    txns: AHashMap<Timestamp, TxnLocks>,
    /// Waiting requests by transaction (at most one per transaction: a client sends one lock
    /// request per server per attempt). Ordered by ts so the oldest is retried first.
    waiting: BTreeMap<Timestamp, LockRequest>,
}

impl LockTable {
    /// Asks for `mode` locks on `keys` for `ts`. Returns the decisions this causes: the
    /// request's own (none while it waits) and, when it died and released locks, those of
    /// requests that could now proceed.
    pub fn request(
        &mut self,
        ts: Timestamp,
        mode: LockMode,
        connection: ConnectionId,
        request_id: u64,
        keys: Vec<Key>,
        writes: StagedWrites,
        now_ms: u64,
    ) -> Vec<LockDecision> {
        let deadline_ms = now_ms.saturating_add(LOCK_WAIT_MS_MAX);
        let on_arrival = Vec::new();
        let remaining = Vec::new(); // filled by `submit`
        self.submit(LockRequest { ts, mode, connection, request_id, keys, writes, on_arrival, remaining, deadline_ms })
    }

    /// A read's shared request, with `on_arrival` (one timestamp per key, see
    /// [`LockRequest::on_arrival`]) kept for its grant. Decisions as [`LockTable::request`].
    pub fn request_read(
        &mut self,
        ts: Timestamp,
        (connection, request_id): (ConnectionId, u64),
        keys: Vec<Key>,
        on_arrival: Vec<Timestamp>,
        now_ms: u64,
    ) -> Vec<LockDecision> {
        assert_eq!(on_arrival.len(), keys.len(), "one arrival timestamp per key");
        let (mode, writes, remaining) = (LockMode::Shared, Vec::new(), Vec::new());
        let deadline_ms = now_ms.saturating_add(LOCK_WAIT_MS_MAX);
        self.submit(LockRequest { ts, mode, connection, request_id, keys, writes, on_arrival, remaining, deadline_ms })
    }

    fn submit(&mut self, mut request: LockRequest) -> Vec<LockDecision> {
        let ts = request.ts;
        request.remaining = request.keys.clone();
        request.remaining.sort_unstable();
        request.remaining.dedup();
        self.txns.entry(ts).or_default().connection = request.connection;
        let mut decisions = Vec::new();
        if let Some(earlier) = self.waiting.remove(&ts) {
            // A new request of a transaction that still waits: the client gave up on the old one.
            decisions.push(LockDecision::Aborted(earlier));
        }
        decisions.extend(self.advance(request));
        // Whatever this request changed (locks released by its death, a shared lock granted
        // beside an exclusive waiter), every waiter is judged again: one that now waits behind
        // an older holder must die, or waits would point from younger to older and two
        // transactions could wait for each other until their deadlines (found by the
        // invariant check below: a shared grant to an older reader left a younger writer
        // waiting behind it).
        decisions.extend(self.retry_waiting());
        self.debug_check();
        decisions
    }

    /// Takes the locks it can, in key order. `None`: the request now waits.
    fn advance(&mut self, mut request: LockRequest) -> Option<LockDecision> {
        while let Some(key) = request.remaining.first() {
            let lock = self.keys.entry(key.clone()).or_default();
            let youngest_conflict = lock.conflicts(request.ts, request.mode).min();
            match youngest_conflict {
                None => {
                    lock.grant(request.ts, request.mode);
                    let key = request.remaining.remove(0);
                    let txn = self.txns.entry(request.ts).or_default();
                    if !txn.held.contains(&key) {
                        txn.held.push(key);
                    }
                }
                // Wait-die: wait only behind younger holders (all of them are younger).
                Some(oldest_holder) if request.ts < oldest_holder => {
                    self.waiting.insert(request.ts, request);
                    return None;
                }
                Some(_) => return Some(self.abort(request)),
            }
        }
        Some(LockDecision::Granted(request))
    }

    /// Releases everything `request`'s transaction holds here and reports it aborted.
    fn abort(&mut self, request: LockRequest) -> LockDecision {
        self.release_locks(request.ts);
        LockDecision::Aborted(request)
    }

    fn release_locks(&mut self, ts: Timestamp) -> StagedWrites {
        let Some(txn) = self.txns.remove(&ts) else {
            return Vec::new();
        };
        for key in txn.held {
            if let Some(lock) = self.keys.get_mut(&key) {
                lock.release(ts);
                if lock.is_free() {
                    self.keys.remove(&key);
                }
            }
        }
        txn.staged
    }

    /// Stages the writes of a granted exclusive request until COMMIT_LOCKED.
    pub fn stage(&mut self, ts: Timestamp, writes: StagedWrites) {
        self.txns.entry(ts).or_default().staged.extend(writes);
    }

    /// Ends transaction `ts` here: returns its staged writes (to apply on commit, or to drop),
    /// and the decisions for requests that can now proceed or must abort (including `ts`'s own
    /// waiting request, aborted).
    pub fn finish(&mut self, ts: Timestamp) -> (StagedWrites, Vec<LockDecision>) {
        let mut decisions = Vec::new();
        if let Some(waiting) = self.waiting.remove(&ts) {
            decisions.push(LockDecision::Aborted(waiting));
        }
        let staged = self.release_locks(ts);
        decisions.extend(self.retry_waiting());
        self.debug_check();
        (staged, decisions)
    }

    /// Releases every transaction whose last request came over `connection` (it closed).
    pub fn release_connection(&mut self, connection: ConnectionId) -> Vec<LockDecision> {
        let owned: Vec<Timestamp> =
            self.txns.iter().filter(|(_, txn)| txn.connection == connection).map(|(ts, _)| *ts).collect();
        let mut decisions = Vec::new();
        for ts in owned {
            self.waiting.remove(&ts);
            self.release_locks(ts);
        }
        decisions.extend(self.retry_waiting());
        self.debug_check();
        decisions
    }

    /// Aborts waits past their deadline.
    pub fn expire(&mut self, now_ms: u64) -> Vec<LockDecision> {
        let expired: Vec<Timestamp> =
            self.waiting.values().filter(|request| request.deadline_ms <= now_ms).map(|request| request.ts).collect();
        if expired.is_empty() {
            return Vec::new();
        }
        let mut decisions = Vec::with_capacity(expired.len());
        for ts in expired {
            if let Some(request) = self.waiting.remove(&ts) {
                decisions.push(self.abort(request));
            }
        }
        decisions.extend(self.retry_waiting());
        self.debug_check();
        decisions
    }

    /// The earliest deadline of a waiting request.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.waiting.values().map(|request| request.deadline_ms).min()
    }

    /// The table's invariants (checked after every change in debug builds and in tests):
    /// - an exclusive holder shares its key with no other transaction;
    /// - a key is listed only while held, and each holder lists the key among what it holds;
    /// - wait-die: a waiting request is older than every holder it conflicts with (waits only
    ///   point from older to younger, so no deadlock can form), and its deadline is bounded.
    pub fn check_invariants(&self) {
        for (key, lock) in &self.keys {
            assert!(!lock.is_free(), "a free lock stays listed");
            if let Some(holder) = lock.exclusive {
                assert!(lock.shared.iter().all(|&shared| shared == holder), "an exclusive lock is shared");
            }
            for holder in lock.exclusive.iter().chain(&lock.shared) {
                let listed = self.txns.get(holder).is_some_and(|txn| txn.held.contains(key));
                assert!(listed, "transaction {holder} holds a lock it does not list");
            }
        }
        for request in self.waiting.values() {
            let Some(key) = request.remaining.first() else { panic!("a waiting request needs no lock") };
            let youngest = self.keys.get(key).and_then(|lock| lock.conflicts(request.ts, request.mode).min());
            assert!(youngest.is_some_and(|holder| request.ts < holder), "wait-die broken for {}", request.ts);
        }
    }

    fn debug_check(&self) {
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
    }

    /// Retries every waiting request, oldest first, until none can move.
    fn retry_waiting(&mut self) -> Vec<LockDecision> {
        let mut decisions = Vec::new();
        loop {
            let mut moved = false;
            let waiting: Vec<Timestamp> = self.waiting.keys().copied().collect();
            for ts in waiting {
                let request = self.waiting.remove(&ts).expect("listed");
                if let Some(decision) = self.advance(request) {
                    decisions.push(decision);
                    moved = true;
                }
            }
            if !moved {
                return decisions;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(slot: u32) -> ConnectionId {
        ConnectionId { slot, ..ConnectionId::default() }
    }

    fn keys(names: &[&str]) -> Vec<Key> {
        names.iter().map(|name| name.as_bytes().into()).collect()
    }

    fn granted(decisions: Vec<LockDecision>) -> bool {
        matches!(decisions.as_slice(), [LockDecision::Granted(_)])
    }

    #[test]
    fn shared_locks_are_shared_and_exclusive_ones_are_not() {
        let mut table = LockTable::default();
        assert!(granted(table.request(10, LockMode::Shared, conn(1), 1, keys(&["a"]), vec![], 0)));
        assert!(granted(table.request(20, LockMode::Shared, conn(2), 1, keys(&["a"]), vec![], 0)));
        // An older writer waits behind younger readers ...
        assert!(table.request(5, LockMode::Exclusive, conn(3), 1, keys(&["a"]), vec![], 0).is_empty());
        // ... a younger writer dies.
        let decisions = table.request(30, LockMode::Exclusive, conn(4), 1, keys(&["a"]), vec![], 0);
        assert!(matches!(decisions.as_slice(), [LockDecision::Aborted(_)]));
        let (_, decisions) = table.finish(10);
        assert!(decisions.is_empty(), "20 still holds a shared lock");
        let (_, decisions) = table.finish(20);
        assert!(matches!(decisions.as_slice(), [LockDecision::Granted(request)] if request.ts == 5));
    }

    #[test]
    fn waits_only_point_from_older_to_younger_so_no_deadlock_forms() {
        let mut table = LockTable::default();
        assert!(granted(table.request(1, LockMode::Exclusive, conn(1), 1, keys(&["a"]), vec![], 0)));
        assert!(granted(table.request(2, LockMode::Exclusive, conn(2), 1, keys(&["b"]), vec![], 0)));
        // 1 wants b (held by younger 2): waits. 2 wants a (held by older 1): dies, releasing b.
        assert!(table.request(1, LockMode::Exclusive, conn(1), 2, keys(&["b"]), vec![], 0).is_empty());
        let decisions = table.request(2, LockMode::Exclusive, conn(2), 2, keys(&["a"]), vec![], 0);
        // 2 died, and the release of b woke 1 at once (not at its wait deadline).
        assert!(matches!(
            decisions.as_slice(),
            [LockDecision::Aborted(dead), LockDecision::Granted(woken)] if dead.ts == 2 && woken.ts == 1
        ));
        assert!(table.next_deadline_ms().is_none(), "nobody waits");
    }

    #[test]
    fn waits_are_bounded() {
        let mut table = LockTable::default();
        assert!(granted(table.request(9, LockMode::Exclusive, conn(1), 1, keys(&["a"]), vec![], 0)));
        assert!(table.request(3, LockMode::Shared, conn(2), 7, keys(&["a"]), vec![], 0).is_empty());
        assert_eq!(table.next_deadline_ms(), Some(LOCK_WAIT_MS_MAX));
        assert!(table.expire(LOCK_WAIT_MS_MAX - 1).is_empty());
        let decisions = table.expire(LOCK_WAIT_MS_MAX);
        assert!(matches!(decisions.as_slice(), [LockDecision::Aborted(request)] if request.request_id == 7));
    }

    /// Random requests, commits, releases, closed connections and expiries, from a printed
    /// seed: the table's invariants hold after every step, every decision answers a request
    /// that was made, and at the end everything is released.
    #[test]
    fn random_traffic_keeps_the_invariants() {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
        println!("seed {seed}");
        let mut state = seed;
        let mut next = |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        let mut table = LockTable::default();
        let names = ["a", "b", "c", "d"];
        for step in 0..5_000u64 {
            let ts = 1 + next(12);
            match next(10) {
                0..=5 => {
                    let mode = if next(2) == 0 { LockMode::Shared } else { LockMode::Exclusive };
                    let chosen: Vec<&str> = names.iter().copied().filter(|_| next(2) == 0).collect();
                    let chosen = if chosen.is_empty() { vec!["a"] } else { chosen };
                    table.request(ts, mode, conn(next(3) as u32), step, keys(&chosen), vec![], step);
                }
                6 | 7 => drop(table.finish(ts)),
                8 => drop(table.release_connection(conn(next(3) as u32))),
                _ => drop(table.expire(step)),
            }
            table.check_invariants();
        }
        for ts in 1..=12 {
            table.finish(ts);
        }
        assert!(table.keys.is_empty() && table.txns.is_empty() && table.waiting.is_empty());
    }

    #[test]
    fn a_closed_connection_releases_its_transactions() {
        let mut table = LockTable::default();
        assert!(granted(table.request(9, LockMode::Exclusive, conn(1), 1, keys(&["a"]), vec![], 0)));
        assert!(table.request(3, LockMode::Exclusive, conn(2), 1, keys(&["a"]), vec![], 0).is_empty());
        let decisions = table.release_connection(conn(1));
        assert!(matches!(decisions.as_slice(), [LockDecision::Granted(request)] if request.ts == 3));
    }
}
