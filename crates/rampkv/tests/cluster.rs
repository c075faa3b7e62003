//! Integration tests: real servers on 127.0.0.1:0, driven through the client library.

use std::net::SocketAddr;

use rampkv::client::{Client, ClientError};
use rampkv::cluster::Cluster;
use rampkv::limits::{KEY_BYTES_MAX, VALUE_BYTES_MAX};
use rampkv::protocol::ProtocolError;
use rampkv::server::{ServerConfig, ServerGroup};

fn start_cluster(servers: usize) -> (ServerGroup, Cluster) {
    let localhost: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let group = ServerGroup::spawn(&vec![ServerConfig::new(localhost); servers]).unwrap();
    let cluster = Cluster::with_servers(group.addresses().iter().map(SocketAddr::to_string).collect()).unwrap();
    (group, cluster)
}

fn pairs(items: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    items.iter().map(|(key, value)| (key.as_bytes().to_vec(), value.as_bytes().to_vec())).collect()
}

fn keys(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|key| key.as_bytes().to_vec()).collect()
}

#[test]
fn put_all_then_get_all_returns_every_value_across_servers() {
    let (_group, cluster) = start_cluster(4);
    let mut client = Client::connect(&cluster).unwrap();
    let written: Vec<(String, String)> = (0..32).map(|i| (format!("key{i}"), format!("value{i}"))).collect();
    let servers_touched: std::collections::HashSet<usize> =
        written.iter().map(|(key, _)| cluster.server_of(key.as_bytes())).collect();
    assert!(servers_touched.len() > 1, "the test must span servers");
    let ts =
        client.put_all(written.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()).unwrap();
    let read = client.get_all(written.iter().map(|(k, _)| k.as_bytes().to_vec()).collect()).unwrap();
    for ((key, value), item) in written.iter().zip(&read.items) {
        assert_eq!(item.key, key.as_bytes());
        assert_eq!(item.value, value.as_bytes());
        assert_eq!(item.ts, ts);
    }
    assert_eq!(read.round2_keys, 0, "a quiet cluster needs no repair");
}

#[test]
fn unwritten_keys_read_as_the_initial_value_and_repeated_keys_are_answered_each_time() {
    let (_group, cluster) = start_cluster(2);
    let mut client = Client::connect(&cluster).unwrap();
    client.put_all(pairs(&[("a", "1"), ("a", "2")])).unwrap();
    let read = client.get_all(keys(&["a", "never", "a"])).unwrap();
    assert_eq!(&read.items[0].value[..], b"2", "the last write of a repeated key wins");
    assert_eq!((read.items[1].ts, read.items[1].value.len()), (0, 0));
    assert_eq!(read.items[2], read.items[0]);
}

#[test]
fn a_later_write_replaces_an_earlier_one_for_every_client() {
    let (_group, cluster) = start_cluster(3);
    let mut writer = Client::connect(&cluster).unwrap();
    let mut reader = Client::connect(&cluster).unwrap();
    let first = writer.put_all(pairs(&[("x", "1"), ("y", "1")])).unwrap();
    let second = writer.put_all(pairs(&[("x", "2"), ("y", "2")])).unwrap();
    assert!(second > first);
    let read = reader.get_all(keys(&["x", "y"])).unwrap();
    assert_eq!((read.items[0].ts, &read.items[1].value[..]), (second, &b"2"[..]));
}

#[test]
fn oversized_keys_and_values_and_empty_transactions_fail_before_any_server_state_changes() {
    let (group, cluster) = start_cluster(2);
    let mut client = Client::connect(&cluster).unwrap();
    let big_key = vec![b'k'; KEY_BYTES_MAX + 1];
    let big_value = vec![0u8; VALUE_BYTES_MAX + 1];
    let cases = vec![
        vec![(b"ok".to_vec(), b"v".to_vec()), (big_key.clone(), b"v".to_vec())],
        vec![(b"ok".to_vec(), b"v".to_vec()), (b"k".to_vec(), big_value)],
        vec![],
    ];
    for writes in cases {
        let error = client.put_all(writes).unwrap_err();
        assert!(matches!(error, ClientError::Protocol(ProtocolError::InvalidTransaction(_))), "{error}");
    }
    assert!(client.get_all(vec![big_key]).is_err());
    for core in group.cores() {
        assert_eq!(core.store().stats().versions, 0, "nothing reached a server");
    }
    assert_eq!(client.get_all(keys(&["ok"])).unwrap().items[0].ts, 0);
}

#[test]
fn many_clients_on_one_connection_each_get_unique_increasing_timestamps() {
    let (_group, cluster) = start_cluster(2);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        let mut client = Client::connect(&cluster).unwrap();
        let mut last = 0;
        for round in 0..50 {
            let ts = client.put_all(pairs(&[("t", &round.to_string())])).unwrap();
            assert!(ts > last);
            assert!(seen.insert(ts), "timestamp {ts} issued twice");
            last = ts;
        }
    }
}
