//! Seeded simulation of 3-5 configuration-service nodes (the real `ConfigCore`, raft-rs inside)
//! over a simulated network that drops, delays, reorders and partitions, with crashes,
//! restarts (empty log, new incarnation) and clocks that run at different rates.
//!
//! Checked at every simulated millisecond:
//! - at most one live node holds a valid lease as primary of any partition;
//! - every node's epochs only grow; every configuration is valid; two nodes at the same epoch
//!   hold the same configuration (the Raft state machine agrees).
//!
//! And per scenario: a dead primary's partitions fail over within the bound; with delays below
//! the lease margin and no crash, nothing fails over, even across Raft leader changes.
//!
//! Every run prints its seed; `RAMPKV_CONFIG_SIM_SEED=<seed>` replays one.

use std::collections::HashMap;

use rampkv_config::configuration::{Configuration, ServerId, BOOTSTRAP_INCARNATION};
use rampkv_config::core::{ConfigCore, CoreSettings, StartMode};
use rampkv_config::timing::Timing;
use rampkv_config::wire::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MS: u64 = 1_000_000;

struct Node {
    core: Option<ConfigCore>,
    /// Clock: offset plus rate (ppm off real time), so clocks disagree about elapsed time.
    offset_ns: u64,
    rate_ppm: i64,
    last_epoch: u64,
}

struct World {
    rng: SmallRng,
    nodes: Vec<Node>,
    initial: Configuration,
    timing: Timing,
    now_ns: u64,
    in_flight: Vec<(u64, ServerId, ServerId, Message)>,
    drop_per_mille: u32,
    delay_max_ns: u64,
    /// blocked[a][b]: messages from a to b are lost.
    blocked: Vec<Vec<bool>>,
    /// epoch -> encoded configuration, as first seen.
    seen: HashMap<u64, Vec<u8>>,
    leader_changes: u32,
    last_leader: Option<ServerId>,
}

impl World {
    fn new(seed: u64, servers: usize, partitions: usize, drop_per_mille: u32, delay_max_ms: u64) -> World {
        let mut rng = SmallRng::seed_from_u64(seed);
        let addresses = (0..servers).map(|i| (format!("10.0.0.{i}:1"), format!("10.0.0.{i}:2"))).collect::<Vec<_>>();
        let owners = (0..partitions).map(|p| (p % servers) as ServerId).collect();
        let initial = Configuration::placed(addresses, owners, 2).unwrap();
        let timing = Timing::default();
        let mut nodes = Vec::new();
        for me in 0..servers {
            // Rates within +-0.4%: any two clocks disagree by less than the 1% drift bound.
            let rate_ppm = rng.gen_range(-4_000..=4_000);
            let offset_ns = rng.gen_range(1..1_000) * MS;
            let settings = CoreSettings {
                me: me as ServerId,
                incarnation: BOOTSTRAP_INCARNATION,
                mode: StartMode::Bootstrap,
                timing,
                election_ticks_fixed: Some(rng.gen_range(timing.election_ticks..2 * timing.election_ticks)),
            };
            let core = ConfigCore::new(settings, initial.clone(), offset_ns).unwrap();
            nodes.push(Node { core: Some(core), offset_ns, rate_ppm, last_epoch: 0 });
        }
        World {
            rng,
            nodes,
            initial,
            timing,
            now_ns: 0,
            in_flight: Vec::new(),
            drop_per_mille,
            delay_max_ns: delay_max_ms * MS,
            blocked: vec![vec![false; servers]; servers],
            seen: HashMap::new(),
            leader_changes: 0,
            last_leader: None,
        }
    }

    fn local_now(&self, node: usize) -> u64 {
        let node = &self.nodes[node];
        let skew = (self.now_ns as i128 * node.rate_ppm as i128 / 1_000_000) as i64;
        (node.offset_ns as i64 + self.now_ns as i64 + skew) as u64
    }

    fn crash(&mut self, node: usize) {
        self.nodes[node].core = None;
    }

    fn restart(&mut self, node: usize) {
        let incarnation = self.rng.gen_range(1..u64::MAX);
        let election = self.rng.gen_range(self.timing.election_ticks..2 * self.timing.election_ticks);
        let settings = CoreSettings {
            me: node as ServerId,
            incarnation,
            mode: StartMode::Rejoin,
            timing: self.timing,
            election_ticks_fixed: Some(election),
        };
        let now = self.local_now(node);
        self.nodes[node].core = Some(ConfigCore::new(settings, self.initial.clone(), now).unwrap());
        self.nodes[node].last_epoch = 0;
    }

    /// One simulated millisecond: deliver what is due, tick everyone, send, check.
    fn step(&mut self) {
        self.now_ns += MS;
        let mut due = Vec::new();
        let now = self.now_ns;
        self.in_flight.retain(|message| {
            if message.0 <= now {
                due.push(message.clone());
                false
            } else {
                true
            }
        });
        // Random order among what is due: reordering.
        for index in (1..due.len()).rev() {
            let other = self.rng.gen_range(0..=index);
            due.swap(index, other);
        }
        for (_, from, to, message) in due {
            let local = self.local_now(usize::from(to));
            if let Some(core) = &mut self.nodes[usize::from(to)].core {
                core.receive(from, message, local).expect("nodes only send what they may");
            }
        }
        for node in 0..self.nodes.len() {
            let local = self.local_now(node);
            let Some(core) = &mut self.nodes[node].core else { continue };
            core.tick(local);
            let outbox = core.take_outbox();
            for (to, message) in outbox {
                if self.blocked[node][usize::from(to)] || self.rng.gen_range(0..1000) < self.drop_per_mille {
                    continue;
                }
                let delay = self.rng.gen_range(0..=self.delay_max_ns);
                self.in_flight.push((self.now_ns + delay, node as ServerId, to, message));
            }
        }
        self.check();
    }

    fn check(&mut self) {
        let partitions = self.initial.partition_count();
        for partition in 0..partitions {
            let holders: Vec<usize> = (0..self.nodes.len())
                .filter(|node| {
                    let local = self.local_now(*node);
                    self.nodes[*node].core.as_ref().is_some_and(|core| core.lease_valid(partition, local))
                })
                .collect();
            assert!(
                holders.len() <= 1,
                "two primaries of partition {partition} at {} ms: {holders:?}",
                self.now_ns / MS
            );
        }
        let mut leader = None;
        for node in &mut self.nodes {
            let Some(core) = &node.core else { continue };
            let configuration = core.configuration();
            configuration.validate().unwrap();
            assert!(configuration.epoch() >= node.last_epoch, "epoch went back");
            node.last_epoch = configuration.epoch();
            let bytes = configuration.encode();
            let first = self.seen.entry(configuration.epoch()).or_insert_with(|| bytes.clone());
            assert_eq!(*first, bytes, "two configurations of epoch {}", configuration.epoch());
            if core.is_leader() {
                leader = Some(core.me());
            }
        }
        if leader.is_some() && leader != self.last_leader {
            self.leader_changes += 1;
            self.last_leader = leader;
        }
    }

    fn run_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.step();
        }
    }

    fn isolate(&mut self, node: usize, isolated: bool) {
        for other in 0..self.nodes.len() {
            if other != node {
                self.blocked[node][other] = isolated;
                self.blocked[other][node] = isolated;
            }
        }
    }

    fn max_epoch(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| node.core.as_ref())
            .map(|core| core.configuration().epoch())
            .max()
            .unwrap_or(0)
    }

    fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|node| node.core.as_ref().is_some_and(|core| core.is_leader()))
    }
}

fn seeds(count: u64) -> Vec<u64> {
    match std::env::var("RAMPKV_CONFIG_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("RAMPKV_CONFIG_SIM_SEED is a number")],
        Err(_) => {
            let base: u64 = rand::random();
            (0..count).map(|i| base.wrapping_add(i)).collect()
        }
    }
}

#[test]
fn chaos_never_gives_two_primaries_and_the_replicas_agree() {
    for seed in seeds(12) {
        println!("seed {seed}");
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
        let servers = if seed % 2 == 0 { 3 } else { 5 };
        let mut world = World::new(seed, servers, 6, 50, 30);
        for _ in 0..20 {
            world.run_ms(rng.gen_range(100..800));
            let node = rng.gen_range(0..servers);
            match rng.gen_range(0..4) {
                0 => world.crash(node),
                1 if world.nodes[node].core.is_none() => world.restart(node),
                2 => {
                    let isolated = !world.blocked[node].iter().any(|blocked| *blocked);
                    world.isolate(node, isolated);
                }
                _ => {
                    for blocked in world.blocked.iter_mut().flatten() {
                        *blocked = false;
                    }
                }
            }
        }
        println!("seed {seed}: epoch {} after {} leader changes", world.max_epoch(), world.leader_changes);
    }
}

#[test]
fn a_dead_primary_fails_over_within_the_bound_and_its_restart_rejoins() {
    let mut worst_ms = 0;
    for seed in seeds(8) {
        println!("seed {seed}");
        let mut world = World::new(seed, 3, 6, 0, 5);
        world.run_ms(2_000);
        assert_eq!(world.max_epoch(), 1, "seed {seed}: a change before any failure");
        // Kill the Raft leader on odd seeds (election first), another server on even ones.
        let leader = world.leader().expect("a leader after 2 s");
        let victim = if seed % 2 == 1 { leader } else { (leader + 1) % 3 };
        let partition = (0..6).find(|p| world.initial.primary_of(*p) == Some(victim as ServerId)).unwrap();
        world.crash(victim);
        let mut elapsed_ms = 0;
        loop {
            world.run_ms(1);
            elapsed_ms += 1;
            let served = (0..3).any(|node| {
                let local = world.local_now(node);
                world.nodes[node].core.as_ref().is_some_and(|core| core.lease_valid(partition, local))
            });
            if served {
                break;
            }
            assert!(elapsed_ms < 1_000, "seed {seed}: partition {partition} not served 1 s after server {victim} died");
        }
        worst_ms = worst_ms.max(elapsed_ms);
        println!(
            "seed {seed}: victim {victim} (leader: {}), partition {partition} served again after {elapsed_ms} ms",
            victim == leader
        );
        // The restarted server is admitted; partitions short of a copy get a live server to
        // copy them; once those report, every partition has its two copies again.
        world.restart(victim);
        world.run_ms(1_500);
        let configuration = world.nodes[(victim + 1) % 3].core.as_ref().unwrap().configuration().clone();
        assert!(!configuration.is_admitted(victim as ServerId, BOOTSTRAP_INCARNATION), "seed {seed}");
        for node in 0..3 {
            let copying: Vec<u32> = (0..6)
                .filter(|p| configuration.replica_set(*p).unwrap().catching_up.contains(&(node as ServerId)))
                .collect();
            let local = world.local_now(node);
            for partition in copying {
                world.nodes[node].core.as_mut().unwrap().report_caught_up(partition, local);
            }
        }
        world.run_ms(1_000);
        let core = world.nodes[victim].core.as_ref().unwrap();
        assert!(core.votes(), "seed {seed}: the restarted node still does not vote");
        for set in core.configuration().replica_sets() {
            assert_eq!(set.primary.iter().count() + set.backups.len(), 2, "seed {seed}: {:?}", core.configuration());
        }
        // With the restarted node back in the Raft group, losing another node (the leader, so
        // that the restarted node's vote is needed) still fails over.
        let leader = world.leader().expect("a leader");
        let epoch = world.max_epoch();
        world.crash(leader);
        world.run_ms(1_500);
        let survivor = (0..3).find(|node| *node != leader && world.nodes[*node].core.is_some()).unwrap();
        let configuration = world.nodes[survivor].core.as_ref().unwrap().configuration().clone();
        assert!(
            configuration.epoch() > epoch && !configuration.is_member(leader as ServerId),
            "seed {seed}: {configuration:?}"
        );
    }
    println!("worst time from a primary's death to its partition served again: {worst_ms} ms");
}

#[test]
fn no_failover_under_delays_below_the_margin_even_across_leader_changes() {
    for seed in seeds(40) {
        println!("seed {seed}");
        // Delays up to 150 ms (the lease is 300 ms, heartbeats every 50 ms), nothing lost.
        let mut world = World::new(seed, 3, 6, 0, 150);
        world.run_ms(5_000);
        // Then the Raft leader is cut off for 200 ms at a time, with delays up to 20 ms: the
        // longest silence of a server is 200 + 50 + 20 ms, under the lease. Elections happen;
        // a new leader waits out a lease before it judges anyone, so nobody fails over.
        world.delay_max_ns = 20 * MS;
        for _ in 0..4 {
            if let Some(leader) = world.leader() {
                world.isolate(leader, true);
                world.run_ms(200);
                world.isolate(leader, false);
            }
            world.run_ms(1_500);
        }
        let view = world.nodes.iter().find_map(|node| node.core.as_ref()).unwrap().configuration().clone();
        assert_eq!(world.max_epoch(), 1, "seed {seed}: a false failover: {view:?}");
        println!("seed {seed}: {} leader changes, no failover", world.leader_changes);
    }
}
