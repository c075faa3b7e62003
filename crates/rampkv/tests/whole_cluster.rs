//! A replicated cluster killed whole (issue 30, item 3): three `rampkv server` processes with
//! `replicas = 2`, `config` and `replicate` addresses and each its data directory
//! (`--appendfsync always`), every one killed with SIGKILL at once, then all restarted on the
//! same directories. The configuration service comes back from its Raft state with the same
//! configuration (epochs, primaries, replica sets), each server resumes what that configuration
//! still gives its process, in-doubt transactions are resolved by cooperative termination, no
//! acknowledged write is lost, and a failover after the restart still works. The same when a
//! primary was failed over before the kill: its directory is not refused, nothing is lost.
//!
//! SIGKILL of every process is what the test can make; with `always` every acknowledged write
//! was fsynced before its acknowledgement (the primary's log and every backup's copy), which
//! is what a power cut needs as well (docs/replication.md, "What survives what").

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code)] // this binary uses only the request-by-request and free-address helpers
mod common;

use rampkv::client::{newest_configuration, Client};
use rampkv::cluster::Cluster;
use rampkv::config::configuration::Configuration;
use rampkv::transport::TcpClientTransport;
use rampkv::types::{wall_clock_us, TimestampClock};
use rampkv::wire::{Metadata, Request, Response, TxnState, Write, WriteSet};

/// The cluster's server processes, started by this test; each is killed (SIGKILL) and reaped
/// when dropped, even when the test fails.
struct Servers {
    directory: PathBuf,
    cluster: Cluster,
    processes: Vec<Option<Child>>,
}

impl Servers {
    /// A cluster of three replicated servers with data directories under `directory`, started
    /// and serving.
    fn start(directory: &Path) -> Servers {
        let cluster = common::replicated_cluster(3, 2);
        std::fs::write(directory.join("cluster.toml"), cluster.to_toml()).unwrap();
        let mut servers = Servers { directory: directory.to_path_buf(), cluster, processes: vec![None, None, None] };
        servers.restart(&[0, 1, 2]);
        servers
    }

    /// Starts servers `indices` (on their directories) and waits until each serves.
    fn restart(&mut self, indices: &[usize]) {
        for &index in indices {
            assert!(self.processes[index].is_none(), "server {index} runs");
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.directory.join(format!("server-{index}.log")))
                .unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
                .args(["server", "--listen", &self.cluster.servers()[index], "--appendfsync", "always"])
                .arg("--cluster")
                .arg(self.directory.join("cluster.toml"))
                .arg("--data-dir")
                .arg(self.directory.join("data").join(format!("server-{index}")))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            self.processes[index] = Some(child);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for &index in indices {
            while TcpStream::connect(&self.cluster.servers()[index]).is_err() {
                if let Some(status) = self.processes[index].as_mut().and_then(|child| child.try_wait().ok().flatten()) {
                    panic!("server {index} exited ({status}):\n{}", self.log(index));
                }
                assert!(Instant::now() < deadline, "server {index} did not start:\n{}", self.log(index));
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Kills servers `indices` with SIGKILL, one right after the other, and reaps them.
    fn kill(&mut self, indices: &[usize]) {
        let mut killed: Vec<Child> = indices.iter().filter_map(|index| self.processes[*index].take()).collect();
        for child in &mut killed {
            let _ = child.kill();
        }
        for mut child in killed {
            let _ = child.wait();
        }
    }

    fn log(&self, index: usize) -> String {
        std::fs::read_to_string(self.directory.join(format!("server-{index}.log"))).unwrap_or_default()
    }

    fn logs(&self) -> String {
        (0..3).map(|index| format!("--- server {index}:\n{}", self.log(index))).collect()
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.kill(&[0, 1, 2]);
    }
}

/// `count` keys of server `server`'s cluster-file partitions.
fn keys_of(cluster: &Cluster, server: usize, count: usize) -> Vec<Vec<u8>> {
    (0..).map(|i| format!("key{i}").into_bytes()).filter(|key| cluster.server_of(key) == server).take(count).collect()
}

/// Writes round `round`: four transactions, each spanning every server's partitions; every one
/// must be acknowledged (the blocking client follows failovers). Records the values in `last`.
fn write_round(client: &mut Client, keys: &[Vec<u8>], round: u32, last: &mut [Vec<u8>]) {
    for chunk in 0..4 {
        let indices: Vec<usize> = (0..3).map(|server| server * 4 + chunk).collect();
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            indices.iter().map(|index| (keys[*index].clone(), format!("r{round}k{index}").into_bytes())).collect();
        client.put_all(pairs.clone()).unwrap_or_else(|error| panic!("round {round}: a write failed: {error}"));
        for (index, (_, value)) in indices.iter().zip(pairs) {
            last[*index] = value;
        }
    }
}

/// Reads every key back and checks it holds its last acknowledged value.
fn assert_every_write_reads_back(servers: &Servers, keys: &[Vec<u8>], last: &[Vec<u8>], what: &str) {
    let logs = || servers.logs();
    let mut client = connect(servers, what);
    let read =
        client.get_all(keys.to_vec()).unwrap_or_else(|error| panic!("{what}: the read failed: {error}\n{}", logs()));
    for ((key, item), value) in keys.iter().zip(&read.items).zip(last) {
        assert_eq!(
            &item.value,
            value,
            "{what}: key {}: an acknowledged write was lost\n{}",
            String::from_utf8_lossy(key),
            logs()
        );
    }
}

/// A client of the cluster. A primary listens once it holds its lease, but one may lapse for a
/// moment on the loaded machine (and `Client::connect` does not retry a refused HELLO): tried
/// for at most 5 s.
fn connect(servers: &Servers, what: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Client::connect(&servers.cluster) {
            Ok(client) => return client,
            Err(error) if Instant::now() > deadline => panic!("{what}: cannot connect: {error}\n{}", servers.logs()),
            Err(error) => println!("{what}: cannot connect yet: {error}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What must come back after a whole-cluster restart: the epoch, every partition's replica set
/// and every server's admitted incarnation.
fn shape(configuration: &Configuration) -> (u64, String, Vec<u64>) {
    let sets = format!("{:?}", configuration.replica_sets());
    let incarnations = configuration.servers().iter().map(|server| server.incarnation).collect();
    (configuration.epoch(), sets, incarnations)
}

/// The newest configuration, once every partition has a primary and its full replica set (the
/// failover thread of each server may still be catching up otherwise), at most 20 s.
fn settled_configuration(cluster: &Cluster) -> Configuration {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let configuration = newest_configuration(cluster).ok().flatten();
        if let Some(configuration) = configuration.filter(|configuration| {
            configuration.replica_sets().iter().all(|set| set.primary.is_some() && set.backups.len() == 1)
        }) {
            return configuration;
        }
        assert!(Instant::now() < deadline, "the replica sets were not whole within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn prepare(ts: u64, write_set: &[Vec<u8>], key: &[u8]) -> Request {
    Request::Prepare {
        ts,
        metadata: Metadata::WriteSet(WriteSet::from_keys(write_set).unwrap()),
        write_set: Vec::new(),
        writes: vec![Write::new(key.to_vec(), format!("in-doubt {ts}").into_bytes())],
    }
}

/// Polls the state of transaction `ts` at `server` (through `key`) until it is `expected`, at
/// most 15 s; returns the last state seen.
fn wait_for_state(cluster: &Cluster, server: usize, ts: u64, key: &[u8], expected: TxnState) -> Response {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut id = 0;
    loop {
        let routes = rampkv::client::current_addresses(cluster).unwrap();
        let mut transport = TcpClientTransport::connect(&routes).unwrap();
        id += 1;
        let state = common::ask(&mut transport, server, id, &Request::Status { ts, keys: vec![key.to_vec()] });
        if state == (Response::Status { state: expected }) || Instant::now() > deadline {
            return state;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every server process killed at once and restarted on its directory: the configuration is the
/// one before the kill, the two transactions left in doubt are resolved (one prepared on every
/// participant is committed, one prepared on one participant only is aborted), every
/// acknowledged write reads back, and killing a primary afterwards fails it over as before.
#[test]
fn a_replicated_cluster_killed_whole_comes_back_with_its_configuration_and_loses_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let mut servers = Servers::start(directory.path());
    let cluster = servers.cluster.clone();
    let keys: Vec<Vec<u8>> = (0..3).flat_map(|server| keys_of(&cluster, server, 4)).collect();
    let mut last = vec![Vec::new(); keys.len()];
    let mut client = Client::connect(&cluster).unwrap();
    for round in 0..3 {
        write_round(&mut client, &keys, round, &mut last);
    }
    drop(client);
    // Two transactions left in doubt by a writer that died: one prepared at every participant
    // (and acknowledged, hence on every copy), one at server 0 only.
    let mut clock = TimestampClock::new(64_000);
    let (everywhere, half) = (clock.next(wall_clock_us()).unwrap(), clock.next(wall_clock_us()).unwrap());
    let doubt: Vec<Vec<u8>> = (0..3).map(|server| keys_of(&cluster, server, 5).remove(4)).collect();
    let mut transport = TcpClientTransport::connect(cluster.servers()).unwrap();
    for (server, key) in doubt.iter().enumerate() {
        let answer = common::ask(&mut transport, server, server as u64 + 1, &prepare(everywhere, &doubt, key));
        assert_eq!(answer, Response::Ack, "PREPARE at server {server}");
    }
    let answer = common::ask(&mut transport, 0, 10, &prepare(half, &doubt[..2], &doubt[0]));
    assert_eq!(answer, Response::Ack);
    drop(transport);
    let before = settled_configuration(&cluster);

    servers.kill(&[0, 1, 2]);
    let killed = Instant::now();
    servers.restart(&[0, 1, 2]);
    println!("the three servers listened again {} ms after the kill", killed.elapsed().as_millis());
    let after = settled_configuration(&cluster);
    assert_eq!(shape(&after), shape(&before), "the configuration after the restart\n{}", servers.logs());
    for index in 0..3 {
        assert!(servers.log(index).contains("resumes from its data directory"), "{}", servers.logs());
    }
    assert_every_write_reads_back(&servers, &keys, &last, "after the whole-cluster restart");
    let committed = format!("in-doubt {everywhere}").into_bytes();
    for (server, key) in doubt.iter().enumerate() {
        let state = wait_for_state(&cluster, server, everywhere, key, TxnState::Committed);
        assert_eq!(state, Response::Status { state: TxnState::Committed }, "server {server}\n{}", servers.logs());
    }
    let read = connect(&servers, "reading the resolved transaction").get_all(doubt.clone()).unwrap();
    assert!(read.items.iter().all(|item| item.value == committed && item.ts == everywhere), "{read:?}");
    let state = wait_for_state(&cluster, 0, half, &doubt[0], TxnState::Aborted);
    assert_eq!(state, Response::Status { state: TxnState::Aborted }, "{}", servers.logs());

    // A failover after the restart: server 0 killed, writes go on, nothing lost.
    let mut client = connect(&servers, "after the restart");
    write_round(&mut client, &keys, 3, &mut last);
    servers.kill(&[0]);
    let killed = Instant::now();
    write_round(&mut client, &keys, 4, &mut last);
    println!("the first round after server 0's kill took {} ms", killed.elapsed().as_millis());
    let failed_over = newest_configuration(&cluster).unwrap().unwrap();
    assert!(failed_over.epoch() > after.epoch(), "a new configuration");
    assert!(failed_over.replica_sets().iter().all(|set| set.primary != Some(0)), "{failed_over:?}");
    assert_every_write_reads_back(&servers, &keys, &last, "after the failover");
}

/// A primary failed over before the whole cluster is killed: its backup took its partitions
/// over (and wrote them into its own files), then every server died. After the restart on the
/// same directories the failed-over server's directory is not refused (the configuration, not
/// a marker, says whose files count): it rejoins and holds nothing, the promoted backup serves
/// what it adopted, no acknowledged write is lost, and the cluster goes on.
#[test]
fn partitions_failed_over_before_a_whole_cluster_kill_lose_nothing_and_no_directory_is_refused() {
    let directory = tempfile::tempdir().unwrap();
    let mut servers = Servers::start(directory.path());
    let cluster = servers.cluster.clone();
    let keys: Vec<Vec<u8>> = (0..3).flat_map(|server| keys_of(&cluster, server, 4)).collect();
    let mut last = vec![Vec::new(); keys.len()];
    let mut client = Client::connect(&cluster).unwrap();
    write_round(&mut client, &keys, 0, &mut last);
    servers.kill(&[0]);
    write_round(&mut client, &keys, 1, &mut last);
    drop(client);
    let failed_over = settled_configuration(&cluster);
    assert!(failed_over.replica_sets().iter().all(|set| !set.contains(0)), "{failed_over:?}");

    servers.kill(&[1, 2]);
    servers.restart(&[0, 1, 2]);
    let after = settled_configuration(&cluster);
    assert!(after.replica_sets().iter().all(|set| set.primary != Some(0)), "{after:?}\n{}", servers.logs());
    assert!(servers.log(0).contains("failed this server over while it was down"), "{}", servers.logs());
    assert_every_write_reads_back(&servers, &keys, &last, "after the whole-cluster restart");
    let mut client = connect(&servers, "after the restart");
    write_round(&mut client, &keys, 2, &mut last);
    assert_every_write_reads_back(&servers, &keys, &last, "after writes following the restart");
}
