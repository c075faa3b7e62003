//! Configuration-service nodes over real TCP on loopback, each in its own threads.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rampkv_config::client::{ask, fetch_configuration, start_mode};
use rampkv_config::configuration::{Configuration, ServerId, BOOTSTRAP_INCARNATION};
use rampkv_config::core::StartMode;
use rampkv_config::error::{ConfigError, RefusalReason};
use rampkv_config::limits::CONFIG_LOG_ENTRIES_KEPT_MAX;
use rampkv_config::node::{ConfigNode, NodeSettings};
use rampkv_config::timing::{MonotonicClock, Timing};
use rampkv_config::wire::{encode_frame, Message};

struct Cluster {
    initial: Configuration,
    nodes: Vec<Option<ConfigNode>>,
}

impl Cluster {
    fn start(servers: usize, partitions: usize, replicas: u32) -> Cluster {
        let listeners: Vec<TcpListener> = (0..servers).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addresses = listeners
            .iter()
            .enumerate()
            .map(|(i, listener)| (format!("127.0.0.1:{}", 1 + i), listener.local_addr().unwrap().to_string()))
            .collect();
        let owners = (0..partitions).map(|p| (p % servers) as ServerId).collect();
        let initial = Configuration::placed(addresses, owners, replicas).unwrap();
        let nodes = listeners
            .into_iter()
            .enumerate()
            .map(|(me, listener)| {
                Some(start_node(&initial, me as ServerId, StartMode::Bootstrap, BOOTSTRAP_INCARNATION, Some(listener)))
            })
            .collect();
        Cluster { initial, nodes }
    }

    fn node(&self, server: usize) -> &ConfigNode {
        self.nodes[server].as_ref().unwrap()
    }

    /// Waits until every partition's primary holds a valid lease.
    fn wait_until_served(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let configuration = self.nodes.iter().flatten().next().unwrap().configuration();
            let served = (0..configuration.partition_count()).all(|partition| {
                configuration
                    .primary_of(partition)
                    .and_then(|primary| self.nodes[usize::from(primary)].as_ref())
                    .is_some_and(|node| node.lease_valid(partition))
            });
            if served {
                return;
            }
            assert!(Instant::now() < deadline, "not every partition served: {configuration:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn start_node(
    initial: &Configuration,
    me: ServerId,
    mode: StartMode,
    incarnation: u64,
    listener: Option<TcpListener>,
) -> ConfigNode {
    ConfigNode::start(NodeSettings {
        me,
        initial: initial.clone(),
        mode,
        incarnation,
        timing: Timing::default(),
        clock: Arc::new(MonotonicClock::new()),
        listener,
        log_entries_kept: CONFIG_LOG_ENTRIES_KEPT_MAX,
    })
    .unwrap()
}

#[test]
fn a_stopped_leader_and_primary_fails_over_in_a_new_epoch_and_its_restart_rejoins_as_a_backup() {
    stop_and_rejoin(&[0]);
}

#[test]
fn a_stopped_primary_that_is_not_the_leader_fails_over_and_its_restart_rejoins() {
    stop_and_rejoin(&[1]);
}

/// Known bug (open): after a node restarted and rejoined over TCP, its Raft log does not catch
/// up (its commit index stays 0: the leader's messages do not reach it), so a second failure
/// finds no Raft majority. The same sequence passes in the simulation, so the fault is in the
/// TCP node (peer writer reconnection is the suspect).
#[test]
#[ignore = "known bug: a rejoined node's Raft log does not catch up over TCP"]
fn a_second_failure_after_a_rejoin_fails_over_too() {
    stop_and_rejoin(&[0, 1]);
}

/// Stops, in turn, the servers `steps` (0: the Raft leader, 1: the server after it), each time
/// waiting for the failover and for the restarted server to rejoin.
fn stop_and_rejoin(steps: &[u16]) {
    let mut cluster = Cluster::start(3, 6, 2);
    cluster.wait_until_served(Duration::from_secs(10));
    let leader = cluster.node(0).leader().expect("a leader once leases are granted");
    for victim in steps.iter().map(|step| (leader + step) % 3) {
        let victim = usize::from(victim);
        let survivor = (victim + 1) % 3;
        let before = cluster.node(survivor).configuration();
        let partition = (0..6).find(|p| before.primary_of(*p) == Some(victim as ServerId)).unwrap();
        let stopped = Instant::now();
        cluster.nodes[victim].take().unwrap().stop();
        let Some(after) = cluster.node(survivor).wait_for_epoch(before.epoch() + 1, Duration::from_secs(3)) else {
            let states: Vec<_> = cluster
                .nodes
                .iter()
                .flatten()
                .map(|node| (node.leader(), node.commit_index(), node.configuration().epoch()))
                .collect();
            panic!(
                "no failover in 3 s after server {victim} stopped: (leader, commit, epoch) of the others: {states:?}"
            );
        };
        let promoted = after.primary_of(partition).expect("an in-sync backup was left");
        assert_ne!(usize::from(promoted), victim);
        while !cluster.node(usize::from(promoted)).lease_valid(partition) {
            assert!(stopped.elapsed() < Duration::from_secs(3), "the promoted primary never held a lease");
            std::thread::sleep(Duration::from_millis(1));
        }
        println!(
            "server {victim} (Raft leader: {}) stopped: partition {partition} served by {promoted} in epoch {} after {} ms",
            victim == usize::from(leader),
            after.epoch(),
            stopped.elapsed().as_millis()
        );

        // The restarted server learns that the cluster runs, rejoins with a new incarnation,
        // never serves its old partitions, is admitted and copies partitions short of a copy.
        let mode = start_mode(&cluster.initial, victim as ServerId, Duration::from_secs(1));
        assert_eq!(mode, StartMode::Rejoin);
        let incarnation = 1 + victim as u64 * 1000 + after.epoch();
        let listener = TcpListener::bind(&cluster.initial.servers()[victim].config_address).unwrap();
        cluster.nodes[victim] =
            Some(start_node(&cluster.initial, victim as ServerId, mode, incarnation, Some(listener)));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            for p in 0..6 {
                assert!(
                    !cluster.node(victim).lease_valid(p),
                    "the restarted server serves partition {p} of its old epoch"
                );
            }
            let configuration = cluster.node(survivor).configuration();
            let copying: Vec<(usize, u32)> = (0..3)
                .flat_map(|server| (0..6u32).map(move |p| (server, p)))
                .filter(|(server, p)| {
                    configuration.replica_set(*p).unwrap().catching_up.contains(&(*server as ServerId))
                })
                .collect();
            for (server, partition) in &copying {
                cluster.node(*server).report_caught_up(*partition);
            }
            let full =
                configuration.replica_sets().iter().all(|set| set.primary.iter().count() + set.backups.len() == 2);
            if full && configuration.is_admitted(victim as ServerId, incarnation) {
                break;
            }
            assert!(Instant::now() < deadline, "replica sets not restored: {configuration:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster.wait_until_served(Duration::from_secs(5));
    }
}

#[test]
fn no_false_failover_while_both_cores_are_busy() {
    let cluster = Cluster::start(3, 6, 2);
    cluster.wait_until_served(Duration::from_secs(10));
    let stop = Arc::new(AtomicBool::new(false));
    // Four spinning threads on a 2-core machine: every thread of the nodes competes for a core.
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect();
    let started = Instant::now();
    let mut served_checks = 0u64;
    let mut unserved = 0u64;
    while started.elapsed() < Duration::from_secs(6) {
        let configuration = cluster.node(0).configuration();
        for partition in 0..6 {
            let primary = usize::from(configuration.primary_of(partition).unwrap());
            served_checks += 1;
            if !cluster.node(primary).lease_valid(partition) {
                unserved += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().unwrap();
    }
    for node in cluster.nodes.iter().flatten() {
        assert_eq!(node.configuration().epoch(), 1, "a false failover under load");
    }
    println!("6 s with 4 spinning threads: no failover; a primary's lease was not valid in {unserved} of {served_checks} checks");
}

#[test]
fn garbage_wrong_clusters_and_bad_hellos_are_refused_and_the_node_keeps_serving() {
    let cluster = Cluster::start(1, 2, 1);
    cluster.wait_until_served(Duration::from_secs(5));
    let address = cluster.node(0).address().to_string();
    let cluster_id = cluster.initial.cluster_id();
    let closed_after = |bytes: &[u8]| {
        let mut stream = TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = stream.write_all(bytes);
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        reply
    };
    // Not a frame: closed without an answer.
    assert!(closed_after(b"GET / HTTP/1.1\r\n\r\n").is_empty());
    // A frame with a bad checksum: closed.
    let mut corrupt = encode_frame(&Message::ConfigRequest { cluster_id, known_epoch: 0 });
    let last = corrupt.len() - 1;
    corrupt[last] ^= 1;
    assert!(closed_after(&corrupt).is_empty());
    // A length past the limit: closed before reading a body.
    let mut huge = encode_frame(&Message::ConfigRequest { cluster_id, known_epoch: 0 });
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(closed_after(&huge).is_empty());
    // Hellos of another cluster and of an unknown or our own server id: refused by name.
    for (hello, expected) in [
        (Message::Hello { cluster_id: cluster_id ^ 2, from: 0 }, RefusalReason::WrongCluster),
        (Message::Hello { cluster_id, from: 7 }, RefusalReason::UnknownServer),
        (Message::Hello { cluster_id, from: 0 }, RefusalReason::UnknownServer),
    ] {
        let reply = closed_after(&encode_frame(&hello));
        let answer = rampkv_config::wire::read_frame(&mut reply.as_slice(), "test").unwrap();
        assert!(matches!(answer, Some(Message::Refused { reason, .. }) if reason == expected), "{answer:?}");
    }
    // A client of another cluster is refused with a clear error; ours gets the configuration.
    let error = ask(&address, cluster_id ^ 2, Duration::from_secs(2)).unwrap_err();
    assert!(matches!(error, ConfigError::Refused { reason: RefusalReason::WrongCluster, .. }), "{error}");
    assert!(error.to_string().contains("wrong cluster"), "{error}");
    let configuration =
        fetch_configuration(&["127.0.0.1:1".into(), address.clone()], cluster_id, 1, Duration::from_secs(2)).unwrap();
    assert_eq!(configuration, cluster.initial);
    // A record of an older epoch gets a clear error from the configuration.
    let stale = configuration.check_epoch(0).unwrap_err().to_string();
    assert!(stale.contains("epoch 0 is stale: the configuration is at epoch 1"), "{stale}");
    assert!(cluster.node(0).lease_valid(0));
}
