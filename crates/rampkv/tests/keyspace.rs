//! The key listing and count through the Rust client, against real servers over TCP: every key
//! present for the whole listing is returned while other clients add and delete keys (Redis's
//! SCAN guarantee, issue 31), MATCH filters as Redis's glob does, and the count is exact once
//! writes stop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use rampkv::client::{Client, ScanOptions};
use rampkv::cluster::Cluster;
use rampkv::server::{ServerConfig, ServerGroup};

/// How the RESP gateway stores a deleted key (`rampkv_resp::value::tombstone`): the listing
/// leaves such keys out, as GET reads them absent.
const TOMBSTONE: &[u8] = &[0x00];

fn cluster_of(group: &ServerGroup, partitions: u32) -> Cluster {
    let servers: String =
        group.addresses().iter().map(|address| format!("[[servers]]\naddress = \"{address}\"\n")).collect();
    Cluster::from_toml(&format!("partitions = {partitions}\n{servers}")).unwrap()
}

fn listed(client: &mut Client, pattern: Option<&str>, count: usize) -> Vec<Vec<u8>> {
    let options = ScanOptions { pattern: pattern.map(|pattern| pattern.as_bytes().to_vec()), count };
    client.keys(options).collect::<Result<Vec<_>, _>>().unwrap()
}

#[test]
fn a_listing_under_concurrent_writes_returns_every_key_present_throughout() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 3]).unwrap();
    let cluster = cluster_of(&group, 12);
    let mut client = Client::connect(&cluster).unwrap();
    let stable: Vec<Vec<u8>> = (0..3_000).map(|index| format!("stable:{index}").into_bytes()).collect();
    for chunk in stable.chunks(100) {
        client.put_all(chunk.iter().map(|key| (key.clone(), b"v".to_vec())).collect()).unwrap();
    }

    // Writers add and delete other keys for as long as the listings run.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let (cluster, stop) = (cluster.clone(), Arc::clone(&stop));
            let writer_seed = rng.gen::<u64>();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(writer_seed);
                let mut client = Client::connect(&cluster).unwrap();
                let mut last: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
                let mut writes = 0;
                while !stop.load(Ordering::Relaxed) || writes < 200 {
                    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..rng.gen_range(1..8))
                        .map(|_| {
                            let key = format!("churn{writer}:{}", rng.gen_range(0..3_000)).into_bytes();
                            let live = rng.gen_bool(0.6);
                            last.insert(key.clone(), live);
                            (key, if live { b"v".to_vec() } else { TOMBSTONE.to_vec() })
                        })
                        .collect();
                    let mut distinct = BTreeMap::new();
                    distinct.extend(pairs);
                    client.put_all(distinct.into_iter().collect()).unwrap();
                    writes += 1;
                }
                last.into_iter().filter(|(_, live)| *live).count()
            })
        })
        .collect();

    for round in 0..6 {
        let count = rng.gen_range(1..300);
        let keys = listed(&mut client, None, count);
        let distinct: BTreeSet<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        for key in &stable {
            assert!(
                distinct.contains(key.as_slice()),
                "round {round} (count {count}): {} missing (seed {seed})",
                String::from_utf8_lossy(key)
            );
        }
        assert!(keys.iter().all(|key| key.starts_with(b"stable:") || key.starts_with(b"churn")));
    }
    stop.store(true, Ordering::Relaxed);
    let churn_live: usize = writers.into_iter().map(|writer| writer.join().unwrap()).sum();

    // Writes stopped: the count is exact, and so is a listing.
    let expected = stable.len() + churn_live;
    assert_eq!(client.count_keys().unwrap(), expected as u64, "seed {seed}");
    let keys = listed(&mut client, None, 1_000);
    assert_eq!(keys.len(), expected, "each key once, writes stopped (seed {seed})");
    assert_eq!(keys.iter().collect::<BTreeSet<_>>().len(), expected);
}

#[test]
fn match_filters_as_redis_globs_and_an_empty_cluster_lists_nothing() {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); 2]).unwrap();
    let cluster = cluster_of(&group, 5);
    let mut client = Client::connect(&cluster).unwrap();
    assert_eq!(listed(&mut client, None, 10), Vec::<Vec<u8>>::new());
    assert_eq!(client.count_keys().unwrap(), 0);
    let names = ["user:1", "user:2", "user:10", "users", "admin:1", "u?er"];
    client.put_all(names.iter().map(|name| (name.as_bytes().to_vec(), b"x".to_vec())).collect()).unwrap();
    let sorted = |keys: Vec<Vec<u8>>| {
        let mut keys: Vec<String> = keys.into_iter().map(|key| String::from_utf8(key).unwrap()).collect();
        keys.sort();
        keys
    };
    assert_eq!(sorted(listed(&mut client, Some("user:*"), 1)), ["user:1", "user:10", "user:2"]);
    assert_eq!(sorted(listed(&mut client, Some("user:?"), 3)), ["user:1", "user:2"]);
    assert_eq!(sorted(listed(&mut client, Some("user[s:]*"), 3)), ["user:1", "user:10", "user:2", "users"]);
    assert_eq!(sorted(listed(&mut client, Some("[^u]*"), 3)), ["admin:1"]);
    assert_eq!(sorted(listed(&mut client, Some(r"u\?er"), 3)), ["u?er"]);
    assert_eq!(listed(&mut client, None, 1).len(), names.len());
    assert_eq!(client.count_keys().unwrap(), names.len() as u64);
}
