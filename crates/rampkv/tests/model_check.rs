//! Exhaustive model check of the RAMP read and write machines, using the real protocol code.
//!
//! The world: 2 servers (one partition each), 2 keys (one per server), 2 writers that each
//! write both keys (or one writes both and the other one key), and 1 reader that reads both.
//! Every client runs the production session machine (`Sessions`: the code every client driver
//! runs, with the RAMP read and write machines under it) and every server the production
//! `ServerCore`. A step delivers one in-flight request to its server, which handles it
//! at once; the reply goes straight to its client, whose new requests join the in-flight set.
//!
//! Why this covers every behaviour: a client's next requests depend only on the *contents* of
//! the replies it has (the machines wait for all replies of a round, and the order they arrive
//! in does not change what they do next), so delaying a reply is the same as delaying the
//! requests it causes, and requests may be delayed arbitrarily here. Steps at different servers
//! commute (disjoint server state; order-insensitive clients), so a sleep-set search explores
//! every distinct interleaving of each server's requests exactly once instead of every global
//! order. At every end state the reader's result is checked for read atomicity.
//!
//! The skip-repair mutant must be found, with the schedule that breaks it printed.

use std::collections::BTreeMap;

use rampkv::cluster::Cluster;
use rampkv::protocol::bloom::{may_contain, BloomParameters};
use rampkv::protocol::ramp::{Algorithm, TxnOptions};
use rampkv::protocol::server::{Effects, Now, ServerCore};
use rampkv::protocol::session::{Completion, Post, Sessions, TxnResult};
use rampkv::protocol::{ConnectionId, ReadOutcome};
use rampkv::wire::{FrameHeader, Request, Response};

/// An in-flight request; `id` is (client, sequence number), stable across replays.
#[derive(Debug, Clone)]
struct Message {
    id: (usize, u32),
    server: usize,
    request_id: u64,
    request: Request,
}

struct World {
    servers: Vec<ServerCore>,
    /// One session machine per client; the reader is the last.
    clients: Vec<Sessions>,
    /// The reader's result, once it finished.
    read: Option<ReadOutcome>,
    sent: Vec<u32>,
    in_flight: Vec<Message>,
}

#[derive(Clone)]
struct Scenario {
    name: &'static str,
    options: TxnOptions,
    /// Keys written by each writer (indices into `keys`), with the writer's timestamp.
    writers: Vec<(u64, Vec<usize>)>,
    keys: Vec<Vec<u8>>,
    /// Keys the reader reads (indices into `keys`).
    reader: Vec<usize>,
    cluster: Cluster,
}

impl World {
    fn new(scenario: &Scenario) -> World {
        let mut world = World {
            servers: (0..2).map(|_| ServerCore::new(u64::MAX)).collect(),
            clients: Vec::new(),
            read: None,
            sent: Vec::new(),
            in_flight: Vec::new(),
        };
        let mut posts = Vec::new();
        for (ts, keys) in &scenario.writers {
            // Writer `n` has client id `n` and takes its timestamp `(n << 16) | n` from a wall
            // clock reading of `n` microseconds.
            let client_id = (*ts & 0xFFFF) as u16;
            let mut writer = Sessions::new(scenario.cluster.clone(), client_id, 1).unwrap();
            writer.set_txn_options(scenario.options);
            let writes = keys.iter().map(|&k| (scenario.keys[k].clone(), value_of(*ts, k))).collect();
            let written = writer.begin_write_with(0, |_| writes, 0, ts >> 16, &mut posts).unwrap();
            assert_eq!(written, *ts, "the writer's timestamp is the scenario's");
            world.add_client(writer, &mut posts);
        }
        let mut reader = Sessions::new(scenario.cluster.clone(), 100, 1).unwrap();
        reader.set_txn_options(scenario.options);
        let read_keys = scenario.reader.iter().map(|&k| scenario.keys[k].clone()).collect();
        reader.begin_read(0, read_keys, 0, || 0, &mut posts).unwrap();
        world.add_client(reader, &mut posts);
        world
    }

    fn add_client(&mut self, sessions: Sessions, posts: &mut Vec<Post>) {
        self.clients.push(sessions);
        self.sent.push(0);
        self.send(self.clients.len() - 1, posts);
    }

    fn send(&mut self, client: usize, posts: &mut Vec<Post>) {
        for Post { server, request_id, request } in posts.drain(..) {
            let id = (client, self.sent[client]);
            self.sent[client] += 1;
            self.in_flight.push(Message { id, server, request_id, request });
        }
    }

    /// Delivers the in-flight request `id` and lets its client react to the reply.
    fn step(&mut self, id: (usize, u32)) {
        let position = self.in_flight.iter().position(|message| message.id == id).expect("enabled event");
        let message = self.in_flight.remove(position);
        let (mut frame, mut effects) = (Vec::new(), Effects::default());
        let connection = ConnectionId { slot: id.0 as u32, ..ConnectionId::default() };
        let reply = self.servers[message.server].handle(
            connection,
            message.request,
            message.request_id,
            Now::default(),
            &mut effects,
        );
        reply.expect("RAMP requests never wait").encode_frame(message.request_id, &mut frame, |_| None);
        let (header, body) = FrameHeader::split(&frame).unwrap().unwrap();
        let response = Response::decode(header.kind, body).unwrap();
        let client = message.id.0;
        let (mut posts, mut completions): (Vec<Post>, Vec<Completion>) = (Vec::new(), Vec::new());
        self.clients[client].on_reply(header.request_id, response, 0, || 0, &mut posts, &mut completions);
        for completion in completions {
            match completion.result.expect("no transaction of the model fails") {
                TxnResult::Read(outcome) => self.read = Some(outcome),
                TxnResult::Write(_) => {}
                TxnResult::Update(result) => panic!("the model runs no single-key updates: {result:?}"),
            }
        }
        self.send(client, &mut posts);
    }
}

fn value_of(ts: u64, key: usize) -> Vec<u8> {
    format!("{ts}:{key}").into_bytes()
}

/// The reader's result, or a description of its anomaly.
fn check_read(scenario: &Scenario, world: &World) -> Result<(), String> {
    let Some(outcome) = &world.read else {
        return Err("the reader never finished".into());
    };
    let written: BTreeMap<u64, &Vec<usize>> = scenario.writers.iter().map(|(ts, keys)| (*ts, keys)).collect();
    let read_ts = |key: usize| scenario.reader.iter().position(|&k| k == key).map(|at| outcome.items[at].ts);
    for (&key, item) in scenario.reader.iter().zip(&outcome.items) {
        if item.ts == 0 {
            if !item.value.is_empty() {
                return Err(format!("key {key}: initial value with bytes"));
            }
            continue;
        }
        let Some(keys) = written.get(&item.ts) else {
            return Err(format!("key {key}: read unknown ts {}", item.ts));
        };
        if !keys.contains(&key) || item.value != value_of(item.ts, key) {
            return Err(format!("key {key}: garbage value {:?} at ts {}", item.value, item.ts));
        }
        for &sibling in keys.iter() {
            if let Some(sibling_ts) = read_ts(sibling).filter(|&sibling_ts| sibling_ts < item.ts) {
                return Err(format!(
                    "fractured: key {key} at ts {} but key {sibling} (same writer) at ts {sibling_ts}",
                    item.ts
                ));
            }
        }
    }
    Ok(())
}

struct Search<'s> {
    scenario: &'s Scenario,
    end_states: u64,
    steps: u64,
    false_positive_reads: u64,
    counterexample: Option<(Vec<(usize, u32)>, String)>,
}

impl Search<'_> {
    fn replay(&mut self, path: &[(usize, u32)]) -> World {
        let mut world = World::new(self.scenario);
        for &id in path {
            world.step(id);
            self.steps += 1;
        }
        world
    }

    /// Sleep-set depth-first search; `sleep` holds events already covered by a sibling.
    fn explore(&mut self, path: &mut Vec<(usize, u32)>, mut sleep: Vec<Message>) {
        if self.counterexample.is_some() {
            return;
        }
        let world = self.replay(path);
        if world.in_flight.is_empty() {
            self.end_states += 1;
            if let Some(outcome) = &world.read {
                self.false_positive_reads += u64::from(outcome.round2_found_nothing > 0);
            }
            if let Err(anomaly) = check_read(self.scenario, &world) {
                self.counterexample = Some((path.clone(), anomaly));
            }
            return;
        }
        for event in world.in_flight.clone() {
            if sleep.iter().any(|asleep| asleep.id == event.id) {
                continue;
            }
            let child_sleep = sleep.iter().filter(|asleep| asleep.server != event.server).cloned().collect();
            path.push(event.id);
            self.explore(path, child_sleep);
            path.pop();
            sleep.push(event);
        }
    }
}

/// Three keys: the first on server 0, the second on server 1, the third on server 0 and in the
/// same bit of an 8-bit, one-hash Bloom filter as the first (so a filter holding the third
/// always "may contain" the first: a guaranteed false positive).
fn keys_on_servers(cluster: &Cluster) -> Vec<Vec<u8>> {
    let tiny = BloomParameters { bits: 8, hashes: 1 };
    let mut candidates = (0..).map(|i| format!("k{i}").into_bytes());
    let first = candidates.find(|key| cluster.server_of(key) == 0).unwrap();
    let second = candidates.find(|key| cluster.server_of(key) == 1).unwrap();
    let third = candidates
        .find(|key| cluster.server_of(key) == 0 && may_contain(&tiny.build([key.as_slice()]), 1, &first))
        .unwrap();
    vec![first, second, third]
}

fn scenarios(algorithm: Algorithm, mutant: bool) -> Vec<Scenario> {
    let cluster = Cluster::with_servers(vec!["model:1".into(), "model:2".into()]).unwrap();
    let keys = keys_on_servers(&cluster);
    let options = TxnOptions { algorithm, mutant_skip_repair: mutant, ..TxnOptions::default() };
    let writer = |n: u64| (n << 16) | n;
    let scenario = |name, options, writers, reader: Vec<usize>| Scenario {
        name,
        options,
        writers,
        keys: keys.clone(),
        reader,
        cluster: cluster.clone(),
    };
    let mut all = vec![
        scenario(
            "two writers of both keys",
            options,
            vec![(writer(1), vec![0, 1]), (writer(2), vec![0, 1])],
            vec![0, 1],
        ),
        scenario(
            "a writer of both keys and a newer writer of one",
            options,
            vec![(writer(1), vec![0, 1]), (writer(2), vec![1])],
            vec![0, 1],
        ),
    ];
    if algorithm == Algorithm::RampHybrid {
        // A one-byte filter with one hash claims almost every key: the writer of keys 1 and 2
        // "may contain" key 0 too. Round 2 must then find nothing for key 0 and keep round 1's
        // version (an exact fetch of that version would be wrong).
        let tiny = TxnOptions { bloom: BloomParameters { bits: 8, hashes: 1 }, ..options };
        all.push(scenario(
            "bloom false positives (8-bit filter)",
            tiny,
            vec![(writer(1), vec![0, 1]), (writer(2), vec![1, 2])],
            vec![0, 1],
        ));
    }
    all
}

/// Runs every scenario; returns the first counterexample found.
fn model_check(algorithm: Algorithm, mutant: bool) -> Option<String> {
    for scenario in scenarios(algorithm, mutant) {
        let mut search =
            Search { scenario: &scenario, end_states: 0, steps: 0, false_positive_reads: 0, counterexample: None };
        search.explore(&mut Vec::new(), Vec::new());
        println!(
            "{} (mutant {mutant}), {}: {} end states, {} steps replayed",
            algorithm.name(),
            scenario.name,
            search.end_states,
            search.steps
        );
        if let Some((path, anomaly)) = search.counterexample {
            let schedule: Vec<String> = path.iter().map(|(client, seq)| format!("c{client}#{seq}")).collect();
            return Some(format!("{}: {anomaly}\n  schedule (client#request): {}", scenario.name, schedule.join(" ")));
        }
        assert!(search.end_states > 10, "the search explored real interleavings");
        if scenario.options.bloom.bits == 8 {
            assert!(search.false_positive_reads > 0, "the tiny filter produced false positives");
        }
    }
    None
}

#[test]
fn every_interleaving_of_ramp_fast_is_read_atomic() {
    assert_eq!(model_check(Algorithm::RampFast, false), None);
}

#[test]
fn every_interleaving_of_ramp_small_is_read_atomic() {
    assert_eq!(model_check(Algorithm::RampSmall, false), None);
}

#[test]
fn every_interleaving_of_ramp_hybrid_is_read_atomic() {
    assert_eq!(model_check(Algorithm::RampHybrid, false), None);
}

#[test]
fn the_model_check_finds_the_skip_repair_mutants_with_a_counterexample() {
    for algorithm in [Algorithm::RampFast, Algorithm::RampSmall, Algorithm::RampHybrid] {
        let counterexample = model_check(algorithm, true);
        println!("{}: {counterexample:?}", algorithm.name());
        assert!(counterexample.as_deref().is_some_and(|text| text.contains("fractured")), "{}", algorithm.name());
    }
}

#[test]
fn the_model_check_finds_nocc_fractured() {
    assert!(model_check(Algorithm::NoCc, false).is_some_and(|text| text.contains("fractured")));
}
