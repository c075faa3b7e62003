//! How many races would the README main job show on separate machines? An idealized,
//! seeded discrete-event model of the job's workload on independent clients and servers that
//! takes no CPU time at all: only network delays order events.
//!
//! A *race* is a read whose round 1 alone is fractured (docs/history.md, "Evidence and
//! verdict"): it reached one server after a write's COMMIT and another before the same write's
//! COMMIT. The checker wants `RACES_MIN` (5) of them for a clean verdict. This model answers
//! whether the embedded cluster shows too few races because it models the network badly or
//! because the workload itself races rarely, by counting races per million transactions under
//! several delay models, with nothing else in the way.
//!
//! # The model
//! - `--clients` closed-loop clients (8), `--servers` servers (4), `--keys` keys (1,000), each
//!   placed on a random server (as hashing does), transactions of `--txn-size` distinct keys
//!   (4) chosen uniformly, `--read-ratio` reads (0.95).
//! - A read sends one GET per server it needs; a server answers with each key's latest
//!   committed timestamp when the GET arrives (RAMP-Fast's round 1). A write sends PREPARE to
//!   its servers, and COMMIT to all of them once every PREPARE is acknowledged; a server
//!   applies a COMMIT when it arrives. Servers are instant; a client starts its next
//!   transaction the moment its last reply arrives.
//! - Each message's one-way delay is drawn per model: a fixed per-link part, drawn once per
//!   (client, server, direction), plus a per-message part.
//!
//! Not the product's code: a model of the protocol's message pattern, to bound what a real
//! network could show. Deterministic for a seed.
//!
//! `cargo run --release -p rampkv-bench --example ideal_races -- [--txns 2000000] [--seed 1]`

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One delay distribution, in microseconds.
#[derive(Debug, Clone, Copy)]
enum Draw {
    Zero,
    Constant(f64),
    Uniform(f64, f64),
    Exponential(f64),
    /// Lomax (Pareto II) with shape 1.5 and this mean, capped at 50 times the mean: the
    /// embedded network model's jitter.
    Lomax(f64),
}

impl Draw {
    fn sample(self, random: &mut SmallRng) -> f64 {
        match self {
            Draw::Zero => 0.0,
            Draw::Constant(value) => value,
            Draw::Uniform(low, high) => random.gen_range(low..high),
            Draw::Exponential(mean) => -mean * (1.0 - random.gen::<f64>()).ln(),
            Draw::Lomax(mean) => {
                const SHAPE: f64 = 1.5;
                let uniform = 1.0 - random.gen::<f64>();
                (mean * (SHAPE - 1.0) * (uniform.powf(-1.0 / SHAPE) - 1.0)).min(50.0 * mean)
            }
        }
    }
}

/// A network: per-link fixed delay plus per-message delay; replies delayed or instant.
#[derive(Debug, Clone, Copy)]
struct Network {
    name: &'static str,
    link: Draw,
    message: Draw,
    replies_delayed: bool,
}

const NETWORKS: &[Network] = &[
    Network {
        name: "netem-like: 50 us + exp(10 us) each way",
        link: Draw::Constant(50.0),
        message: Draw::Exponential(10.0),
        replies_delayed: true,
    },
    Network {
        name: "links of U[20,100] us + exp(10 us) each way",
        link: Draw::Uniform(20.0, 100.0),
        message: Draw::Exponential(10.0),
        replies_delayed: true,
    },
    Network { name: "exp(50 us) each way", link: Draw::Zero, message: Draw::Exponential(50.0), replies_delayed: true },
    Network { name: "Lomax(50 us) each way", link: Draw::Zero, message: Draw::Lomax(50.0), replies_delayed: true },
    Network {
        name: "Lomax(50 us) requests, instant replies",
        link: Draw::Zero,
        message: Draw::Lomax(50.0),
        replies_delayed: false,
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    Get,
    Prepare,
    Commit,
    Reply,
}

#[derive(Debug)]
struct Event {
    at_us: f64,
    sequence: u64,
    message: Message,
    client: usize,
    server: usize,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at_us.total_cmp(&self.at_us).then(other.sequence.cmp(&self.sequence))
    }
}

#[derive(Debug, Clone, Copy)]
struct Workload {
    clients: usize,
    servers: usize,
    keys: usize,
    txn_size: usize,
    read_ratio: f64,
    txns: u64,
    seed: u64,
}

/// One client's transaction in flight.
#[derive(Debug, Default)]
struct InFlight {
    is_read: bool,
    /// Per server, the keys of the transaction it holds.
    keys_by_server: Vec<Vec<u32>>,
    pending: usize,
    /// Reads: (key, timestamp returned).
    returned: Vec<(u32, u64)>,
    /// Writes: the timestamp, and whether COMMITs went out.
    ts: u64,
    committing: bool,
    commit_first_us: f64,
    commit_last_us: f64,
    started_us: f64,
}

#[derive(Debug, Default)]
struct Outcome {
    txns: u64,
    reads: u64,
    races: u64,
    read_duration_us: f64,
    commit_spreads: u64,
    commit_spread_us: f64,
}

struct Simulation<'a> {
    workload: Workload,
    network: &'a Network,
    random: SmallRng,
    home: Vec<usize>,
    /// Fixed delay of each (client, server) link, out and back.
    link_out_us: Vec<Vec<f64>>,
    link_back_us: Vec<Vec<f64>>,
    latest: Vec<u64>,
    /// Keys of each write, indexed by timestamp (0: the initial value).
    written: Vec<Vec<u32>>,
    events: BinaryHeap<Event>,
    sequence: u64,
    clients: Vec<InFlight>,
    outcome: Outcome,
}

impl<'a> Simulation<'a> {
    fn new(workload: Workload, network: &'a Network) -> Self {
        let mut random = SmallRng::seed_from_u64(workload.seed);
        let home = (0..workload.keys).map(|_| random.gen_range(0..workload.servers)).collect();
        let mut links = || -> Vec<Vec<f64>> {
            (0..workload.clients)
                .map(|_| (0..workload.servers).map(|_| network.link.sample(&mut random)).collect())
                .collect()
        };
        let (link_out_us, link_back_us) = (links(), links());
        Self {
            workload,
            network,
            random,
            home,
            link_out_us,
            link_back_us,
            latest: vec![0; workload.keys],
            written: vec![Vec::new()],
            events: BinaryHeap::new(),
            sequence: 0,
            clients: (0..workload.clients).map(|_| InFlight::default()).collect(),
            outcome: Outcome::default(),
        }
    }

    fn send(&mut self, now_us: f64, message: Message, client: usize, server: usize) {
        let (link, delayed) = match message {
            Message::Reply => (self.link_back_us[client][server], self.network.replies_delayed),
            _ => (self.link_out_us[client][server], true),
        };
        let delay_us = if delayed { link + self.network.message.sample(&mut self.random) } else { 0.0 };
        self.sequence += 1;
        self.events.push(Event { at_us: now_us + delay_us, sequence: self.sequence, message, client, server });
    }

    fn start(&mut self, now_us: f64, client: usize) {
        let mut keys: Vec<u32> = Vec::with_capacity(self.workload.txn_size);
        while keys.len() < self.workload.txn_size {
            let key = self.random.gen_range(0..self.workload.keys as u32);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let mut keys_by_server = vec![Vec::new(); self.workload.servers];
        for &key in &keys {
            keys_by_server[self.home[key as usize]].push(key);
        }
        let is_read = self.random.gen::<f64>() < self.workload.read_ratio;
        let ts = if is_read {
            0
        } else {
            self.written.push(keys);
            self.written.len() as u64 - 1
        };
        let servers: Vec<usize> =
            (0..self.workload.servers).filter(|&server| !keys_by_server[server].is_empty()).collect();
        self.clients[client] =
            InFlight { is_read, keys_by_server, pending: servers.len(), ts, started_us: now_us, ..InFlight::default() };
        let message = if is_read { Message::Get } else { Message::Prepare };
        for server in servers {
            self.send(now_us, message, client, server);
        }
    }

    fn arrive(&mut self, event: Event) {
        let now_us = event.at_us;
        let (client, server) = (event.client, event.server);
        match event.message {
            Message::Get => {
                for index in 0..self.clients[client].keys_by_server[server].len() {
                    let key = self.clients[client].keys_by_server[server][index];
                    let ts = self.latest[key as usize];
                    self.clients[client].returned.push((key, ts));
                }
                self.send(now_us, Message::Reply, client, server);
            }
            Message::Prepare => self.send(now_us, Message::Reply, client, server),
            Message::Commit => {
                let in_flight = &mut self.clients[client];
                for &key in &in_flight.keys_by_server[server] {
                    let latest = &mut self.latest[key as usize];
                    *latest = (*latest).max(in_flight.ts);
                }
                if in_flight.commit_first_us == 0.0 {
                    in_flight.commit_first_us = now_us;
                }
                in_flight.commit_last_us = now_us;
                self.send(now_us, Message::Reply, client, server);
            }
            Message::Reply => self.reply(now_us, client),
        }
    }

    fn reply(&mut self, now_us: f64, client: usize) {
        let in_flight = &mut self.clients[client];
        in_flight.pending -= 1;
        if in_flight.pending > 0 {
            return;
        }
        if !in_flight.is_read && !in_flight.committing {
            in_flight.committing = true;
            let servers: Vec<usize> =
                (0..self.workload.servers).filter(|&server| !in_flight.keys_by_server[server].is_empty()).collect();
            in_flight.pending = servers.len();
            for server in servers {
                self.send(now_us, Message::Commit, client, server);
            }
            return;
        }
        if in_flight.is_read {
            self.outcome.reads += 1;
            self.outcome.read_duration_us += now_us - in_flight.started_us;
            if fractured(&in_flight.returned, &self.written) {
                self.outcome.races += 1;
            }
        } else if in_flight.keys_by_server.iter().filter(|keys| !keys.is_empty()).count() >= 2 {
            self.outcome.commit_spreads += 1;
            self.outcome.commit_spread_us += in_flight.commit_last_us - in_flight.commit_first_us;
        }
        self.outcome.txns += 1;
        self.start(now_us, client);
    }

    fn run(mut self) -> Outcome {
        for client in 0..self.workload.clients {
            self.start(0.0, client);
        }
        while self.outcome.txns < self.workload.txns {
            let event = self.events.pop().expect("every client always has a message in flight");
            self.arrive(event);
        }
        self.outcome
    }
}

/// True if the read returned a write on one key and an older version of another key that the
/// same write wrote (the checker's definition 2, on round 1).
fn fractured(returned: &[(u32, u64)], written: &[Vec<u32>]) -> bool {
    returned.iter().any(|&(_, ts)| {
        ts != 0
            && returned.iter().any(|&(other_key, other_ts)| other_ts < ts && written[ts as usize].contains(&other_key))
    })
}

fn main() {
    let mut workload =
        Workload { clients: 8, servers: 4, keys: 1_000, txn_size: 4, read_ratio: 0.95, txns: 2_000_000, seed: 1 };
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    for pair in arguments.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        let number = || {
            value.parse::<u64>().unwrap_or_else(|_| {
                eprintln!("ideal_races: {} wants a whole number, not {value:?}", pair[0]);
                std::process::exit(2)
            })
        };
        match pair[0].as_str() {
            "--txns" => workload.txns = number(),
            "--seed" => workload.seed = number(),
            "--keys" => workload.keys = number() as usize,
            "--clients" => workload.clients = number() as usize,
            other => {
                eprintln!("ideal_races: unknown flag {other}: --txns, --seed, --keys, --clients");
                std::process::exit(2)
            }
        }
    }
    println!(
        "{} clients, {} servers, {} keys, {} keys per transaction, {:.0}% reads, {} transactions per network, seed {}",
        workload.clients,
        workload.servers,
        workload.keys,
        workload.txn_size,
        workload.read_ratio * 100.0,
        workload.txns,
        workload.seed
    );
    println!("| network | races | races per million txns | mean read us | mean commit spread us |");
    println!("|---|---:|---:|---:|---:|");
    for network in NETWORKS {
        let outcome = Simulation::new(workload, network).run();
        println!(
            "| {} | {} | {:.1} | {:.0} | {:.1} |",
            network.name,
            outcome.races,
            outcome.races as f64 * 1e6 / outcome.txns as f64,
            outcome.read_duration_us / outcome.reads.max(1) as f64,
            outcome.commit_spread_us / outcome.commit_spreads.max(1) as f64,
        );
    }
}
