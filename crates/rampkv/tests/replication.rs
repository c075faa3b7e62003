//! Synchronous replication in an embedded group (issue 16, phase 2): every write a client saw
//! acknowledged is already applied in the memory of every backup of its partition, with the
//! value the primary holds; backups hold only their primaries' partitions; a group asked for
//! more copies than servers is refused; with data directories a restarted group comes back
//! from its files and refills its backups.
//!
//! Randomized: the keys and values come from a seeded generator whose seed is printed (replay:
//! `RAMPKV_TEST_SEED=<seed>`).

#[allow(dead_code)] // this binary uses only the free-address helper
mod common;

use std::net::SocketAddr;

use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::recovery::StartRecovery;
use rampkv::server::durable::{DurabilityConfig, StartError};
use rampkv::server::{Durability, ReplicationMedium, ReplicationOptions, ServerConfig, ServerGroup, ServerOptions};
use rampkv::transport::{ClientTransport, TcpClientTransport};
use rampkv::wire::{Request, Write};
use rand::{Rng, SeedableRng};

fn seed() -> u64 {
    let seed = std::env::var("RAMPKV_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.as_nanos() as u64)
    });
    println!("seed {seed} (replay with RAMPKV_TEST_SEED={seed})");
    seed
}

fn replicated(servers: usize, replicas: u32, medium: ReplicationMedium) -> (ServerGroup, Cluster) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let replication = ReplicationOptions { medium, ..ReplicationOptions::new(replicas) };
    let options = ServerOptions { replication: Some(replication), ..ServerOptions::default() };
    let (mut group, reports) = ServerGroup::start(&vec![ServerConfig::new(localhost); servers], &options).unwrap();
    assert!(reports.is_empty(), "no persistence, no recovery reports");
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect())
        .unwrap()
        .with_replicas(replicas)
        .unwrap();
    group.start_recovery(cluster.clone(), 0, 1_000).unwrap();
    (group, cluster)
}

/// One to four writes of round `round` to distinct keys among 64, in key order.
fn random_writes(random: &mut rand::rngs::StdRng, round: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..random.gen_range(1..5))
        .map(|_| {
            let key = format!("k{}", random.gen_range(0..64)).into_bytes();
            (key, format!("v{round}-{}", random.gen::<u32>()).into_bytes())
        })
        .collect();
    pairs.sort();
    pairs.dedup_by(|a, b| a.0 == b.0);
    pairs
}

/// Over TCP a backup acknowledges what it applied: an acknowledged write is in every backup's
/// copy at once.
#[test]
fn every_acknowledged_write_is_already_applied_at_every_backup() {
    let mut random = rand::rngs::StdRng::seed_from_u64(seed());
    for (servers, replicas) in [(3, 2), (3, 3)] {
        let (group, cluster) = replicated(servers, replicas, ReplicationMedium::Tcp);
        let mut client = Client::connect(&cluster).unwrap();
        for round in 0..40 {
            let unique = random_writes(&mut random, round);
            let ts = client.put_all(unique.clone()).unwrap();
            // Acknowledged: no waiting from here on.
            for (key, value) in &unique {
                let primary = cluster.server_of(key);
                let primary_version = group.cores()[primary].store().get_latest(key).unwrap();
                assert_eq!(primary_version.ts, ts);
                for step in 1..replicas as usize {
                    let backup = (primary + step) % servers;
                    let copy = group.backups()[backup]
                        .copy_of(primary as u16)
                        .unwrap_or_else(|| panic!("backup {backup} has no copy of primary {primary}"));
                    let version = copy.store().get_latest(key).unwrap_or_else(|| {
                        panic!("backup {backup} lacks {:?} acknowledged at ts {ts}", String::from_utf8_lossy(key))
                    });
                    assert_eq!(version.ts, ts, "backup {backup} holds an older version");
                    assert_eq!(&*version.value, value.as_slice());
                }
            }
        }
        // A backup holds copies of its primaries only, never of a server it does not back up.
        for backup in 0..servers {
            for primary in 0..servers {
                let backs_it = (1..replicas as usize).any(|step| (primary + step) % servers == backup);
                assert_eq!(group.backups()[backup].copy_of(primary as u16).is_some(), backs_it);
            }
        }
        let stats = group.servers().replication_stats().unwrap();
        assert!(stats.records > 0 && stats.acks > 0 && stats.links_failed == 0, "{stats:?}");
        let applied: u64 = group.backups().iter().map(|backup| backup.stats().records_applied).sum();
        assert_eq!(applied, stats.records * u64::from(replicas - 1), "every record applied once per backup");
    }
}

/// One-sided a backup holds a write once it landed in its log region, and applies it later: an
/// acknowledged write is in the copy a backup takes over (the takeover drains the region) with
/// no waiting, even when taken over right after the acknowledgement; and the backups apply
/// every record once (their apply lag is measured).
#[test]
fn every_acknowledged_write_is_in_the_copy_a_backup_takes_over_one_sided() {
    let mut random = rand::rngs::StdRng::seed_from_u64(seed());
    for (servers, replicas) in [(3, 2), (3, 3)] {
        let (group, cluster) = replicated(servers, replicas, ReplicationMedium::OneSided);
        let mut client = Client::connect(&cluster).unwrap();
        let mut last: std::collections::BTreeMap<Vec<u8>, (u64, Vec<u8>)> = std::collections::BTreeMap::new();
        for round in 0..200 {
            let unique = random_writes(&mut random, round);
            let ts = client.put_all(unique.clone()).unwrap();
            for (key, value) in unique {
                last.insert(key, (ts, value));
            }
        }
        // Acknowledged: taken over at once (every primary's copy on every backup). Its links then
        // fail (their regions closed): the counters are read first.
        let stats = group.servers().replication_stats().unwrap();
        let copies: Vec<Vec<_>> = (0..servers)
            .map(|primary| {
                (1..replicas as usize)
                    .map(|step| (primary + step) % servers)
                    .map(|backup| {
                        let copy = group.backups()[backup].take_over(primary as u16, 2);
                        (backup, copy.unwrap_or_else(|| panic!("backup {backup} has no copy of primary {primary}")))
                    })
                    .collect()
            })
            .collect();
        for (key, (ts, value)) in &last {
            let primary = cluster.server_of(key);
            for (backup, copy) in &copies[primary] {
                let version = copy.store().get_latest(key).unwrap_or_else(|| {
                    panic!("backup {backup} lacks {:?} acknowledged at ts {ts}", String::from_utf8_lossy(key))
                });
                assert_eq!(version.ts, *ts, "backup {backup} holds an older version");
                assert_eq!(&*version.value, value.as_slice());
            }
        }
        assert!(stats.records > 0 && stats.acks > 0 && stats.links_failed == 0, "{stats:?}");
        let applied: u64 = group.backups().iter().map(|backup| backup.stats().records_applied).sum();
        assert_eq!(applied, stats.records * u64::from(replicas - 1), "every record applied once per backup");
        println!(
            "{servers} servers, {replicas} copies: apply lag p50 <= {} us, p99 <= {} us, max {} us over {} calls",
            stats.apply_lag.quantile_us(0.5),
            stats.apply_lag.quantile_us(0.99),
            stats.apply_lag_us_max,
            stats.apply_lag.count()
        );
    }
}

#[test]
fn a_group_without_replication_ships_nothing_and_one_replica_is_none() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&[ServerConfig::new(localhost)]).unwrap();
    assert!(group.servers().replication_stats().is_none());
    assert!(group.backups().is_empty());
    let options = ServerOptions { replication: Some(ReplicationOptions::new(1)), ..ServerOptions::default() };
    let (group, _) = ServerGroup::start(&[ServerConfig::new(localhost)], &options).unwrap();
    assert!(group.backups().is_empty(), "replicas = 1 is no replication");
}

#[test]
fn bad_replication_settings_are_refused_before_anything_starts() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let configs = vec![ServerConfig::new(localhost); 2];
    let options =
        |replicas| ServerOptions { replication: Some(ReplicationOptions::new(replicas)), ..ServerOptions::default() };
    let error = ServerGroup::start(&configs, &options(3)).unwrap_err();
    assert!(matches!(error, StartError::TooFewServersForReplicas { replicas: 3, servers: 2 }), "{error}");
    assert!(error.to_string().contains("3 replicas need at least 3 servers"), "{error}");
    let error = ServerGroup::start(&configs, &options(0)).unwrap_err();
    assert!(matches!(error, StartError::ReplicaCount { replicas: 0 }), "{error}");
}

/// Replication with a data directory (issue 17, item 5): each server logs what it applies as a
/// primary and keeps its copies as a backup on disk; stopped and started again on the same
/// directories (the whole cluster: every stream is new), each server recovers its store from
/// its own files and sends each backup a snapshot of it first, whose link holds the primary's
/// replies from the start: every write reads back and the backups hold it again.
#[test]
fn a_replicated_group_with_data_directories_restarts_from_its_files_and_refills_its_backups() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..3).map(|index| dir.path().join(format!("server-{index}"))).collect();
    let config = DurabilityConfig { policy: rampkv::durable::FsyncPolicy::Always, ..DurabilityConfig::default() };
    let start = || {
        let durability = Durability { dirs: dirs.clone(), config };
        let options = ServerOptions {
            durability: Some(durability),
            replication: Some(ReplicationOptions::new(2)),
            ..ServerOptions::default()
        };
        let (mut group, reports) = ServerGroup::start(&vec![ServerConfig::new(localhost); 3], &options).unwrap();
        assert_eq!(reports.len(), 3, "one recovery report per server");
        let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect())
            .unwrap()
            .with_replicas(2)
            .unwrap();
        group.start_recovery(cluster.clone(), 0, 1_000).unwrap();
        (group, cluster, reports)
    };
    let keys: Vec<Vec<u8>> = (0..60).map(|index| format!("key{index}").into_bytes()).collect();
    let (group, cluster, _) = start();
    let mut client = Client::connect(&cluster).unwrap();
    for key in &keys {
        client.put_all(vec![(key.clone(), key.clone())]).unwrap();
    }
    for primary in 0..3 {
        let copies = dirs[(primary + 1) % 3].join("copies");
        let kept = std::fs::read_dir(&copies).unwrap().filter_map(Result::ok).count();
        assert_eq!(kept, 1, "server {} keeps its copy of server {primary} on disk", (primary + 1) % 3);
    }
    drop(client);
    drop(group);
    let (group, cluster, reports) = start();
    assert!(reports.iter().all(|report| report.last_lsn > 0), "every store came back from its files");
    let mut client = Client::connect(&cluster).unwrap();
    let read = client.get_all(keys.clone()).unwrap();
    assert_eq!(read.items.len(), keys.len());
    for (key, item) in keys.iter().zip(&read.items) {
        assert_eq!((&item.key, &item.value[..]), (key, &key[..]), "{:?} read back", String::from_utf8_lossy(key));
    }
    client.put_all(vec![(b"after".to_vec(), b"restart".to_vec())]).unwrap();
    let stats = group.servers().replication_stats().unwrap();
    assert_eq!(stats.catch_up_snapshots, 3, "each backup got its primary's recovered store: {stats:?}");
    // Each backup makes its new copy current once its primary's in-sync marker arrives.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let current = |primary: usize| group.backups()[(primary + 1) % 3].copy_of(primary as u16);
    while (0..3).any(|primary| current(primary).is_none()) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for key in keys.iter().chain([&b"after".to_vec()]) {
        let primary = cluster.server_of(key);
        let copy = current(primary).expect("in sync");
        assert!(copy.store().get_latest(key).is_some(), "{:?} is on its backup again", String::from_utf8_lossy(key));
    }
}

#[test]
fn with_a_shared_secret_the_primaries_prove_it_at_the_replication_ports() {
    let secret = std::sync::Arc::new(rampkv::auth::SharedSecret::from_bytes((0..32).collect()).unwrap());
    rampkv::auth::set_client_secret(Some(std::sync::Arc::clone(&secret)));
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let options = ServerOptions {
        secret: Some(secret),
        replication: Some(ReplicationOptions::new(2)),
        ..ServerOptions::default()
    };
    let (group, _) = ServerGroup::start(&vec![ServerConfig::new(localhost); 2], &options).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    let mut client = Client::connect(&cluster).unwrap();
    let ts = client.put_all(vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"2".to_vec())]).unwrap();
    for key in [b"a", b"b"] {
        let primary = cluster.server_of(key);
        // Held in the backup's log region once acknowledged; applied soon after.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let applied = || {
            let copy = group.backups()[1 - primary].copy_of(primary as u16);
            copy.and_then(|copy| copy.store().get_latest(key)).is_some_and(|version| version.ts == ts)
        };
        while !applied() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(applied(), "the write reached the backup that proved nothing but the secret");
    }
    // A primary without the secret gets nothing applied.
    let mut stranger = std::net::TcpStream::connect(group.backups()[0].address()).unwrap();
    stranger.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    use std::io::{Read, Write};
    stranger.write_all(&[0u8; 32]).unwrap();
    let mut byte = [0u8; 1];
    assert!(matches!(stranger.read(&mut byte), Ok(0) | Err(_)), "closed without an answer");
}

/// Server processes this test started; each is killed (SIGKILL) and reaped when dropped, even
/// when the test fails.
struct Processes(Vec<Option<std::process::Child>>);

impl Processes {
    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.0[index].take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for index in 0..self.0.len() {
            self.kill(index);
        }
    }
}

/// Between `rampkv server` processes (the cluster file's `replicas = 2` and `replicate`
/// addresses): writes are acknowledged while the backup lives; once the backup process is
/// killed with SIGKILL, a write to its primary is not acknowledged (it would exist on one
/// server only).
#[test]
fn a_primary_process_acknowledges_no_write_its_killed_backup_does_not_hold() {
    let directory = tempfile::tempdir().unwrap();
    let mut addresses = common::free_addresses(4);
    let replicate = addresses.split_off(2);
    let data = addresses;
    let cluster = Cluster::with_servers(data.clone())
        .unwrap()
        .with_replicas(2)
        .unwrap()
        .with_replicate_addresses(replicate)
        .unwrap();
    let file = directory.path().join("cluster.toml");
    std::fs::write(&file, cluster.to_toml()).unwrap();
    let mut processes = Processes(
        data.iter()
            .map(|address| {
                let log =
                    std::fs::File::create(directory.path().join(format!("{}.log", address.replace(':', "_")))).unwrap();
                let child = std::process::Command::new(env!("CARGO_BIN_EXE_rampkv"))
                    .args(["server", "--listen", address, "--cluster", file.to_str().unwrap()])
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap();
                Some(child)
            })
            .collect(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while data.iter().any(|address| std::net::TcpStream::connect(address).is_err()) {
        assert!(std::time::Instant::now() < deadline, "the servers did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let key_of = |server: usize, tag: &str| {
        (0..).map(|i| format!("{tag}{i}").into_bytes()).find(|key| cluster.server_of(key) == server).unwrap()
    };
    let (first, second) = (key_of(0, "a"), key_of(0, "b"));
    // One connection to server 0 only: the kill of server 1 does not touch it.
    let mut transport = TcpClientTransport::connect(&data[..1]).unwrap();
    let mut put = |id: u64, key: &[u8]| {
        let ts = (rampkv::types::wall_clock_us() << 16) | 7;
        let request = Request::Put { ts, writes: vec![Write::new(key.to_vec(), b"v".to_vec())] };
        transport.post(0, id, &request).unwrap();
        transport.flush().unwrap();
        let mut replies = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1_500);
        while replies == 0 && std::time::Instant::now() < deadline {
            replies += transport.poll(Some(std::time::Duration::from_millis(50)), |_, _, _| {}).unwrap();
        }
        replies
    };
    assert_eq!(put(1, &first), 1, "acknowledged while the backup lives");
    processes.kill(1); // server 0's only backup
    assert_eq!(put(2, &second), 0, "a write was acknowledged without its backup");
}

/// A server restarted into a running cluster (rejoining) had its partitions failed over: its
/// files may hold writes the cluster never acknowledged, so its store is set aside
/// (`superseded/`) and starts empty, and its directory is marked; a later start of a whole new
/// cluster on that directory (which would serve its partitions from files that lack what their
/// successors acknowledged) is refused with a clear error.
#[test]
fn a_rejoining_server_sets_its_store_aside_and_its_directory_is_refused_for_a_fresh_cluster() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (0..2).map(|index| dir.path().join(format!("server-{index}"))).collect();
    let start = |rejoining: bool| {
        let durability = Durability { dirs: dirs.clone(), config: DurabilityConfig::default() };
        let replication = ReplicationOptions { rejoining, ..ReplicationOptions::new(2) };
        let options =
            ServerOptions { durability: Some(durability), replication: Some(replication), ..ServerOptions::default() };
        ServerGroup::start(&vec![ServerConfig::new(localhost); 2], &options)
    };
    let (mut group, _) = start(false).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect())
        .unwrap()
        .with_replicas(2)
        .unwrap();
    group.start_recovery(cluster.clone(), 0, 1_000).unwrap();
    let mut client = Client::connect(&cluster).unwrap();
    for index in 0..20 {
        client.put_all(vec![(format!("key{index}").into_bytes(), b"value".to_vec())]).unwrap();
    }
    drop(client);
    drop(group);
    let (group, reports) = start(true).unwrap();
    assert!(reports.iter().all(|report| report.last_lsn == 0), "the stores start empty: {reports:?}");
    assert!(group.cores().iter().all(|core| core.store().stats().keys == 0));
    for dir in &dirs {
        let aside = std::fs::read_dir(dir.join("superseded")).unwrap().filter_map(Result::ok);
        assert!(aside.into_iter().any(|entry| entry.file_name().to_string_lossy().ends_with(".log")), "{dir:?}");
    }
    drop(group);
    let error = start(false).unwrap_err();
    assert!(matches!(error, StartError::FailedOverDataDir { .. }), "{error}");
    assert!(error.to_string().contains("were failed over"), "{error}");
}
