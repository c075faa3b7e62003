//! The interleaving network model: a client-side decorator over any [`ClientTransport`] that
//! gives every request its own seeded delivery delay, so that different servers see the
//! requests of different sessions in different relative orders, as separate machines on
//! separate links do.
//!
//! # Why
//! A client thread posts all its sessions' requests into one FIFO connection per server, and
//! each server serves its connection in order, so without a model every server sees every
//! transaction's requests in the same relative order (the order they were posted). No read can
//! then meet a write's commit on one server before it and on another after it: nothing
//! fractures, whatever the protocol (docs/history.md, "Evidence and verdict").
//!
//! # The model
//! Like netem on each link: a request posted at time t to server s is delivered (handed to the
//! wrapped transport) at `t + delay + jitter draw`, where the draw is long-tailed (Lomax, shape
//! 1.5, mean `jitter`, capped at [`INTERLEAVE_JITTER_TAIL_FACTOR_MAX`] times the mean) and
//! drawn from a seeded generator, one draw per request in posting order. Two rules keep it a
//! network and not a scrambler:
//! - **Per link FIFO**: requests of one session to one server are delivered in the order they
//!   were posted (a delivery time is never earlier than the previous one of its link). The
//!   protocols rely on it: an S2PL RELEASE follows its lock request on the same connection and
//!   cancels it if it still waits (`rampkv_core::protocol::locking`). Links are keyed by the
//!   session of the request id ([`session_of_request`]).
//! - **Every request is delivered exactly once**, in order of delivery time (ties in posting
//!   order), to the server it was posted for.
//!
//! Replies are not delayed: the reply path is the wrapped transport's own.
//!
//! # Time, and the 2-core budget
//! No thread of its own: delivery happens inside the caller's `flush` and `poll`. A `poll`
//! that has requests held waits for replies only until the next delivery time; a wait shorter
//! than [`INTERLEAVE_BLOCKING_WAIT_US_MIN`] sleeps in slices (an epoll wait rounds its timeout
//! up to milliseconds). With [`Pacing::SkipIdle`] (the benchmark's default) a `poll` that
//! finds no reply does not wait at all: the model's clock jumps to the next delivery time, so
//! requests are held only while their thread has other work (processing replies, starting
//! transactions) and each server sees the requests posted meanwhile in the model's order,
//! at no cost in throughput. With [`Pacing::WallClock`] the delays are real latency, as
//! netem's are: a wider window for reordering, paid in throughput (docs/performance.md).
//!
//! # Replay
//! The same seed and the same sequence of posts give the same delivery times and the same
//! delivery order ([`Schedule`] is I/O-free and takes the time as an argument; the decorator
//! only adds the clock). A run on real threads still depends on their timing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use ahash::AHashMap as HashMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::client::{ClientTransport, ServerEvent};
use super::error::TransportError;
use super::stats::GetStarStats;
pub use super::stats::InterleaveStats;
use crate::message::BatchStats;
use rampkv_core::limits::{
    INTERLEAVE_BLOCKING_WAIT_US_MIN, INTERLEAVE_DELAY_US_MAX, INTERLEAVE_JITTER_TAIL_FACTOR_MAX,
    INTERLEAVE_SLEEP_SLICE_US,
};
use rampkv_core::protocol::session::session_of_request;
use rampkv_core::wire::{Request, Response};

/// Shape of the Lomax (Pareto type II) jitter draw: heavy-tailed (infinite variance) with a
/// finite mean, like the long tails of real network delays.
const JITTER_SHAPE: f64 = 1.5;

/// What a client thread does while every session waits on held requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pacing {
    /// Whenever the client thread finds no reply to deliver, the model's clock jumps to the
    /// next delivery time: each server sees the requests in the model's order, and the model
    /// adds no waiting (a request is held only while its thread has other work).
    SkipIdle,
    /// Delivery times are wall-clock times: the delays are real latency.
    WallClock,
}

/// Parameters of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InterleaveOptions {
    /// Seeds the jitter draws.
    pub seed: u64,
    /// Fixed delay of every request, in microseconds.
    pub delay_us: u64,
    /// Mean of the long-tailed random extra delay, in microseconds (0: none, and then no
    /// interleaving at all).
    pub jitter_us: u64,
    pub pacing: Pacing,
}

/// Why the model's parameters are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InterleaveError {
    #[error("a network {what} of {us} µs exceeds the maximum of {max_us} µs", max_us = INTERLEAVE_DELAY_US_MAX)]
    TooLong { what: &'static str, us: u64 },
}

impl InterleaveOptions {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), InterleaveError> {
        for (what, us) in [("delay", self.delay_us), ("jitter", self.jitter_us)] {
            if us > INTERLEAVE_DELAY_US_MAX {
                return Err(InterleaveError::TooLong { what, us });
            }
        }
        Ok(())
    }
}

/// A request waiting for its delivery time.
#[derive(Debug)]
pub struct Held {
    pub deliver_at_us: u64,
    /// Posting order (ties of delivery time keep it).
    sequence: u64,
    pub server: usize,
    pub request_id: u64,
    pub request: Request,
}

/// A held request's place in the delivery order: its time, its posting order (ties keep it),
/// and where its request is parked. The heap orders these small keys; the requests (over 100
/// bytes each) stay put in `Schedule::parked` instead of being moved at every sift.
type OrderKey = (u64, u64, u32);

/// A held request, parked until its key comes up.
#[derive(Debug)]
struct Parked {
    server: usize,
    request_id: u64,
    request: Request,
}

/// One (session, server) link: its latest delivery time, and how many of its requests wait.
#[derive(Debug, Default)]
struct Link {
    last_deliver_at_us: u64,
    held: usize,
}

/// The model's schedule, I/O-free: requests in, requests out in delivery order at the times
/// the caller passes.
#[derive(Debug)]
pub struct Schedule {
    random: ChaCha8Rng,
    delay_us: u64,
    jitter_us: u64,
    held: BinaryHeap<Reverse<OrderKey>>,
    /// The held requests, by the slot their key names; `free` lists the empty slots.
    parked: Vec<Option<Parked>>,
    free: Vec<u32>,
    links: HashMap<(usize, usize), Link>,
    next_sequence: u64,
    /// Per server, the highest posting sequence delivered so far (for `overtaken`).
    delivered_sequence: Vec<Option<u64>>,
    stats: InterleaveStats,
}

impl Schedule {
    /// An empty schedule for `servers` servers.
    pub fn new(options: &InterleaveOptions, servers: usize) -> Result<Self, InterleaveError> {
        options.validate()?;
        Ok(Self {
            random: ChaCha8Rng::seed_from_u64(options.seed),
            delay_us: options.delay_us,
            jitter_us: options.jitter_us,
            held: BinaryHeap::new(),
            parked: Vec::new(),
            free: Vec::new(),
            links: HashMap::default(),
            next_sequence: 0,
            delivered_sequence: vec![None; servers],
            stats: InterleaveStats::default(),
        })
    }

    /// The random extra delay of one request: Lomax with mean `jitter_us`, capped.
    fn jitter_draw_us(&mut self) -> u64 {
        if self.jitter_us == 0 {
            return 0;
        }
        let uniform: f64 = 1.0 - self.random.gen::<f64>(); // (0, 1]: the power below is finite
        let scale = self.jitter_us as f64 * (JITTER_SHAPE - 1.0);
        let draw = scale * (uniform.powf(-1.0 / JITTER_SHAPE) - 1.0);
        let cap = self.jitter_us * INTERLEAVE_JITTER_TAIL_FACTOR_MAX;
        (draw as u64).min(cap)
    }

    /// Holds `request` for `server`, posted at `now_us`; returns its delivery time.
    pub fn hold(&mut self, now_us: u64, server: usize, request_id: u64, request: Request) -> u64 {
        debug_assert!(server < self.delivered_sequence.len(), "the decorator checks the server first");
        let drawn = now_us + self.delay_us + self.jitter_draw_us();
        let link = self.links.entry((session_of_request(request_id), server)).or_default();
        // Per-link FIFO: never before the link's previous request.
        let deliver_at_us = drawn.max(link.last_deliver_at_us);
        link.last_deliver_at_us = deliver_at_us;
        link.held += 1;
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let parked = Parked { server, request_id, request };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.parked[slot as usize] = Some(parked);
                slot
            }
            None => {
                self.parked.push(Some(parked));
                (self.parked.len() - 1) as u32
            }
        };
        self.held.push(Reverse((deliver_at_us, sequence, slot)));
        deliver_at_us
    }

    /// The earliest delivery time held, if any request is held.
    pub fn next_deliver_at_us(&self) -> Option<u64> {
        self.held.peek().map(|Reverse((deliver_at_us, _, _))| *deliver_at_us)
    }

    /// Requests held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True if nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The next request due at `now_us` (in delivery order), if any.
    pub fn pop_due(&mut self, now_us: u64) -> Option<Held> {
        if self.next_deliver_at_us()? > now_us {
            return None;
        }
        let Reverse((deliver_at_us, sequence, slot)) = self.held.pop()?;
        let Parked { server, request_id, request } =
            self.parked[slot as usize].take().expect("a held request's slot holds it");
        self.free.push(slot);
        let held = Held { deliver_at_us, sequence, server, request_id, request };
        let key = (session_of_request(held.request_id), held.server);
        let link = self.links.get_mut(&key).expect("a held request's link is known");
        debug_assert!(link.held > 0 && held.deliver_at_us <= link.last_deliver_at_us);
        link.held -= 1;
        if link.held == 0 {
            self.links.remove(&key); // nothing left to keep in order behind
        }
        let latest = &mut self.delivered_sequence[held.server];
        if latest.is_some_and(|latest| latest > held.sequence) {
            self.stats.overtaken += 1;
        }
        *latest = Some(latest.map_or(held.sequence, |latest| latest.max(held.sequence)));
        self.stats.delivered += 1;
        Some(held)
    }

    /// The counters so far.
    pub fn stats(&self) -> InterleaveStats {
        self.stats
    }
}

/// Any client transport with the interleaving model in front of it (see the module docs).
#[derive(Debug)]
pub struct Interleaving<T: ClientTransport> {
    inner: T,
    schedule: Schedule,
    pacing: Pacing,
    origin: Instant,
    /// Time the model's clock jumped ahead ([`Pacing::SkipIdle`]).
    skipped_us: u64,
}

impl<T: ClientTransport> Interleaving<T> {
    /// Puts the model in front of `inner`.
    pub fn new(inner: T, options: InterleaveOptions) -> Result<Self, InterleaveError> {
        let schedule = Schedule::new(&options, inner.server_count())?;
        Ok(Self { inner, schedule, pacing: options.pacing, origin: Instant::now(), skipped_us: 0 })
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The model's counters.
    pub fn stats(&self) -> InterleaveStats {
        self.schedule.stats()
    }

    /// The model's clock: wall time since the start plus the idle time skipped.
    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64 + self.skipped_us
    }

    /// Delivers every held request that is due, and sends them.
    fn deliver_due(&mut self) -> Result<(), TransportError> {
        if self.schedule.is_empty() {
            return Ok(());
        }
        let now_us = self.now_us();
        let mut delivered = false;
        while let Some(held) = self.schedule.pop_due(now_us) {
            self.inner.post_owned(held.server, held.request_id, held.request)?;
            delivered = true;
        }
        if delivered {
            self.inner.flush()?;
        }
        Ok(())
    }

    /// Holds a request (the checks that do not depend on the medium are made now).
    fn hold(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        let servers = self.inner.server_count();
        if server >= servers {
            return Err(TransportError::NoSuchServer { server, servers });
        }
        let now_us = self.now_us();
        self.schedule.hold(now_us, server, request_id, request);
        Ok(())
    }
}

impl<T: ClientTransport> ClientTransport for Interleaving<T> {
    fn server_count(&self) -> usize {
        self.inner.server_count()
    }

    /// Holds a copy of `request` until its delivery time. A request the medium refuses (too
    /// large a frame) fails when it is delivered, in `flush` or `poll`.
    fn post(&mut self, server: usize, request_id: u64, request: &Request) -> Result<(), TransportError> {
        self.hold(server, request_id, request.clone())
    }

    fn post_owned(&mut self, server: usize, request_id: u64, request: Request) -> Result<(), TransportError> {
        self.hold(server, request_id, request)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        self.deliver_due()?;
        self.inner.flush()
    }

    fn poll<F>(&mut self, timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
    where
        F: FnMut(usize, u64, Response),
    {
        let started = Instant::now();
        loop {
            self.deliver_due()?;
            let remaining = timeout.map(|timeout| timeout.saturating_sub(started.elapsed()));
            let Some(deliver_at_us) = self.schedule.next_deliver_at_us() else {
                return self.inner.poll(remaining, &mut deliver); // nothing held: the medium's own wait
            };
            let delivered = self.inner.poll(Some(Duration::ZERO), &mut deliver)?;
            if delivered > 0 || remaining.is_some_and(|remaining| remaining.is_zero()) {
                return Ok(delivered);
            }
            let wait_us = deliver_at_us.saturating_sub(self.now_us());
            if wait_us == 0 {
                continue;
            }
            if self.pacing == Pacing::SkipIdle {
                // Nothing to deliver now: jump to the next delivery time instead of waiting.
                self.skipped_us += wait_us;
                self.schedule.stats.idle_skips += 1;
                continue;
            }
            let wait = Duration::from_micros(wait_us).min(remaining.unwrap_or(Duration::MAX));
            if wait_us >= INTERLEAVE_BLOCKING_WAIT_US_MIN {
                let delivered = self.inner.poll(Some(wait), &mut deliver)?;
                if delivered > 0 {
                    return Ok(delivered);
                }
            } else {
                std::thread::sleep(wait.min(Duration::from_micros(INTERLEAVE_SLEEP_SLICE_US)));
            }
        }
    }

    fn take_server_events(&mut self, events: &mut Vec<ServerEvent>) {
        self.inner.take_server_events(events);
    }

    fn reconnect_due(&mut self) {
        self.inner.reconnect_due();
    }

    /// Held requests for the server stay held: the wrapped transport discards them when they
    /// are delivered while the server is down.
    fn disconnect(&mut self, server: usize) {
        self.inner.disconnect(server);
    }

    fn getstar_stats(&self) -> Option<GetStarStats> {
        self.inner.getstar_stats()
    }

    fn batch_stats(&self) -> Option<BatchStats> {
        self.inner.batch_stats()
    }

    fn interleave_stats(&self) -> Option<InterleaveStats> {
        Some(self.stats())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    /// A request id of `session`, as the session machine numbers them.
    fn request_id(session: usize, tag: u32) -> u64 {
        ((session as u64) << 40) | u64::from(tag)
    }

    fn options(seed: u64, delay_us: u64, jitter_us: u64, pacing: Pacing) -> InterleaveOptions {
        InterleaveOptions { seed, delay_us, jitter_us, pacing }
    }

    /// Posts `posts` (session, server, microseconds since the previous post) into a schedule,
    /// popping what is due as time goes on, then drains it; returns the delivery order.
    fn run_schedule(seed: u64, jitter_us: u64, posts: &[(usize, usize, u64)]) -> Vec<(usize, u64, u64)> {
        let mut schedule = Schedule::new(&options(seed, 0, jitter_us, Pacing::SkipIdle), 4).unwrap();
        let (mut now_us, mut order) = (0, Vec::new());
        for (index, &(session, server, gap_us)) in posts.iter().enumerate() {
            now_us += gap_us;
            while let Some(held) = schedule.pop_due(now_us) {
                order.push((held.server, held.request_id, held.deliver_at_us));
            }
            schedule.hold(now_us, server, request_id(session, index as u32), Request::Commit { ts: index as u64 + 1 });
        }
        while let Some(held) = schedule.pop_due(u64::MAX) {
            order.push((held.server, held.request_id, held.deliver_at_us));
        }
        assert!(schedule.is_empty());
        order
    }

    proptest! {
        /// Every request is delivered once, in delivery-time order; each (session, server) link
        /// keeps its posting order; the same seed gives the same order.
        #[test]
        fn the_schedule_keeps_each_link_in_order_and_delivers_everything_once(
            seed in any::<u64>(),
            jitter_us in 0u64..500,
            posts in proptest::collection::vec((0usize..6, 0usize..4, 0u64..100), 1..300),
        ) {
            let order = run_schedule(seed, jitter_us, &posts);
            prop_assert_eq!(order.len(), posts.len());
            let mut seen = vec![false; posts.len()];
            for &(_, request_id, _) in &order {
                let index = (request_id & 0xFFFF_FFFF) as usize;
                prop_assert!(!seen[index], "request {} delivered twice", index);
                seen[index] = true;
            }
            for pair in order.windows(2) {
                prop_assert!(pair[0].2 <= pair[1].2, "delivery times go back: {:?}", pair);
            }
            for session in 0..6 {
                for server in 0..4 {
                    let link: Vec<u64> = order
                        .iter()
                        .filter(|(to, request_id, _)| *to == server && session_of_request(*request_id) == session)
                        .map(|(_, request_id, _)| request_id & 0xFFFF_FFFF)
                        .collect();
                    prop_assert!(link.windows(2).all(|pair| pair[0] < pair[1]), "link ({}, {}) reordered: {:?}", session, server, link);
                }
            }
            prop_assert_eq!(&order, &run_schedule(seed, jitter_us, &posts));
        }
    }

    #[test]
    fn without_jitter_nothing_is_reordered_and_with_it_servers_see_different_orders() {
        // Eight sessions post one request to each of four servers at the same instant, as a
        // client thread does with a batch of read round 1s.
        let posts: Vec<(usize, usize, u64)> =
            (0..8).flat_map(|session| (0..4).map(move |server| (session, server, 0))).collect();
        let sessions_seen_by = |order: &[(usize, u64, u64)], server: usize| -> Vec<usize> {
            order
                .iter()
                .filter(|(to, ..)| *to == server)
                .map(|(_, request_id, _)| session_of_request(*request_id))
                .collect()
        };
        let fifo = run_schedule(7, 0, &posts);
        for server in 0..4 {
            assert_eq!(sessions_seen_by(&fifo, server), (0..8).collect::<Vec<_>>());
        }
        let seed = 7;
        let jittered = run_schedule(seed, 50, &posts);
        let orders: Vec<Vec<usize>> = (0..4).map(|server| sessions_seen_by(&jittered, server)).collect();
        assert!(orders.windows(2).any(|pair| pair[0] != pair[1]), "seed {seed}: every server saw {:?}", orders[0]);
    }

    /// A transport that answers every request with ACK at the next poll, and records what
    /// reached it.
    #[derive(Debug, Default)]
    struct Echo {
        reached: Vec<(usize, u64)>,
        replies: VecDeque<(usize, u64)>,
    }

    impl ClientTransport for Echo {
        fn server_count(&self) -> usize {
            4
        }

        fn post(&mut self, server: usize, request_id: u64, _request: &Request) -> Result<(), TransportError> {
            self.reached.push((server, request_id));
            self.replies.push_back((server, request_id));
            Ok(())
        }

        fn flush(&mut self) -> Result<(), TransportError> {
            Ok(())
        }

        fn poll<F>(&mut self, _timeout: Option<Duration>, mut deliver: F) -> Result<usize, TransportError>
        where
            F: FnMut(usize, u64, Response),
        {
            let count = self.replies.len();
            for (server, request_id) in self.replies.drain(..) {
                deliver(server, request_id, Response::Ack);
            }
            Ok(count)
        }
    }

    /// Posts `per_session` requests of each of 8 sessions round-robin over 4 servers, polls
    /// until every reply came back; returns what reached the wrapped transport.
    fn echo_run(options: InterleaveOptions, per_session: u32) -> (Vec<(usize, u64)>, InterleaveStats) {
        let mut transport = Interleaving::new(Echo::default(), options).unwrap();
        let mut expected = Vec::new();
        for tag in 0..per_session {
            for session in 0..8 {
                let (server, request_id) = ((session + tag as usize) % 4, request_id(session, tag));
                transport.post(server, request_id, &Request::Commit { ts: 1 }).unwrap();
                expected.push((server, request_id));
            }
        }
        transport.flush().unwrap();
        let mut replies = Vec::new();
        while replies.len() < expected.len() {
            transport
                .poll(Some(Duration::from_secs(5)), |server, request_id, _| replies.push((server, request_id)))
                .unwrap();
        }
        let mut reached = transport.inner().reached.clone();
        assert_eq!(reached.len(), expected.len(), "seed {}", options.seed);
        reached.sort_unstable();
        replies.sort_unstable();
        expected.sort_unstable();
        assert_eq!((&reached, &replies), (&expected, &expected), "seed {}: each request exactly once", options.seed);
        (transport.inner().reached.clone(), transport.stats())
    }

    #[test]
    fn the_decorator_delivers_every_request_once_and_reorders_across_sessions() {
        let seed = 11;
        let (reached, stats) = echo_run(options(seed, 0, 100, Pacing::SkipIdle), 50);
        for session in 0..8 {
            for server in 0..4 {
                let link: Vec<u64> = reached
                    .iter()
                    .filter(|(to, request_id)| *to == server && session_of_request(*request_id) == session)
                    .map(|(_, request_id)| *request_id)
                    .collect();
                assert!(
                    link.windows(2).all(|pair| pair[0] < pair[1]),
                    "seed {seed}: link ({session}, {server}) reordered"
                );
            }
        }
        assert_eq!(stats.delivered, 400);
        assert!(stats.overtaken > 0, "seed {seed}: nothing was reordered: {stats:?}");
    }

    #[test]
    fn skip_idle_leaves_out_idle_time_and_wall_clock_keeps_it() {
        // A delay of one second: with nothing in flight, skip-idle delivers at once.
        let started = Instant::now();
        let (_, stats) = echo_run(options(3, 1_000_000, 0, Pacing::SkipIdle), 2);
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
        assert!(stats.idle_skips > 0);
        let started = Instant::now();
        echo_run(options(3, 20_000, 0, Pacing::WallClock), 1);
        assert!(started.elapsed() >= Duration::from_millis(20), "the delay is real latency");
    }

    #[test]
    fn bad_parameters_are_refused() {
        let too_long = options(1, INTERLEAVE_DELAY_US_MAX + 1, 0, Pacing::WallClock);
        assert!(matches!(too_long.validate(), Err(InterleaveError::TooLong { what: "delay", .. })));
        let too_long = options(1, 0, INTERLEAVE_DELAY_US_MAX + 1, Pacing::WallClock);
        assert!(Interleaving::new(Echo::default(), too_long).is_err());
        let mut transport = Interleaving::new(Echo::default(), options(1, 0, 0, Pacing::SkipIdle)).unwrap();
        let refused = transport.post(4, 0, &Request::Commit { ts: 1 });
        assert!(matches!(refused, Err(TransportError::NoSuchServer { server: 4, servers: 4 })));
    }
}
