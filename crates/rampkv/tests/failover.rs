//! Failover between `rampkv server` processes (issue 16, phase 4): a cluster file with
//! `replicas = 2`, `config` and `replicate` addresses; the configuration service runs in the
//! servers. A primary killed with SIGKILL is replaced by its backup and the blocking client
//! goes on without an error; a primary stopped (SIGSTOP) until it was deposed, then resumed
//! with its old state, serves no read and takes no write.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code)] // this binary uses only the request-by-request and free-address helpers
mod common;

use rampkv::client::{connect, current_front_addresses, Client, ClientError, Connector, Driver, TxnResult};
use rampkv::cluster::{Cluster, Front};
use rampkv::transport::onesided::OneSidedOptions;
use rampkv::transport::{
    ClientTransport, OneSidedClientTransport, RfRpcClientTransport, SendRecvClientTransport, TcpClientTransport,
    TransportError, WritePollClientTransport,
};
use rampkv::wire::{ErrorCode, GetItem, Request, Response, Selector, Write};

/// Server processes this test started; each is killed (SIGKILL) and reaped when dropped, even
/// when the test fails.
struct Processes(Vec<Option<Child>>);

impl Processes {
    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.0[index].take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    fn signal(&self, index: usize, signal: &str) {
        let pid = self.0[index].as_ref().expect("a running process").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
        if signal == "-STOP" {
            // kill(2) returns once the signal is sent; a thread running on the other core stops
            // a moment later. Wait until every thread is stopped: a request sent before would
            // still be served (as happened once under load).
            let deadline = Instant::now() + Duration::from_secs(5);
            while !all_threads_stopped(&pid) {
                assert!(Instant::now() < deadline, "process {pid} did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in /proc/PID/task/TID/stat).
fn all_threads_stopped(pid: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(Result::ok).all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

impl Drop for Processes {
    fn drop(&mut self) {
        for index in 0..self.0.len() {
            if self.0[index].is_some() {
                self.signal(index, "-CONT"); // a stopped process dies of SIGKILL too, but be plain
            }
            self.kill(index);
        }
    }
}

/// A replicated cluster of `servers` processes, started and ready (every server took its
/// first lease: it listens only then).
fn start(directory: &Path, servers: usize) -> (Cluster, Processes) {
    start_with_front(directory, servers, None)
}

/// As [`start`], every server also serving `front` (the fabric transports' front end).
fn start_with_front(directory: &Path, servers: usize, front: Option<Front>) -> (Cluster, Processes) {
    start_with(directory, servers, front, None)
}

/// As [`start_with_front`], the servers replicating over `medium` (`--replication-medium`;
/// None: the default, onesided for these loopback addresses).
///
/// The addresses are ports the kernel found free, released before the servers bind them: one
/// taken meanwhile (another test's outgoing connection draws from the same range) makes its
/// server exit at once with "Address already in use". Then the whole cluster starts again on
/// fresh addresses, at most `START_ATTEMPTS` times; any other early exit, or a server still not
/// listening after 40 s, fails the test with the servers' logs.
fn start_with(directory: &Path, servers: usize, front: Option<Front>, medium: Option<&str>) -> (Cluster, Processes) {
    const START_ATTEMPTS: usize = 3;
    for attempt in 1..=START_ATTEMPTS {
        match try_start(directory, servers, front, medium) {
            Ok(started) => return started,
            Err(StartFailure::PortTaken(log)) if attempt < START_ATTEMPTS => {
                eprintln!("start attempt {attempt}: a port was taken before its server bound it; again on fresh ports:\n{log}");
            }
            Err(StartFailure::PortTaken(log) | StartFailure::Other(log)) => {
                panic!("the servers did not start (attempt {attempt}):\n{log}")
            }
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// Why [`try_start`] gave up, with the servers' logs.
enum StartFailure {
    PortTaken(String),
    Other(String),
}

/// One attempt of [`start_with`].
fn try_start(
    directory: &Path,
    servers: usize,
    front: Option<Front>,
    medium: Option<&str>,
) -> Result<(Cluster, Processes), StartFailure> {
    // Data, control, replication and configuration addresses, all distinct.
    let mut addresses = common::free_addresses(4 * servers).into_iter();
    let mut next = || addresses.by_ref().take(servers).collect::<Vec<String>>();
    let (data, controls, replicate, config) = (next(), next(), next(), next());
    let cluster = Cluster::with_servers(data.clone())
        .unwrap()
        .with_replicas(2)
        .unwrap()
        .with_replicate_addresses(replicate)
        .unwrap()
        .with_config_addresses(config)
        .unwrap();
    let cluster = match front {
        Some(front) => cluster.with_fronts(front, controls.clone()).unwrap(),
        None => cluster,
    };
    let file = directory.join("cluster.toml");
    std::fs::write(&file, cluster.to_toml()).unwrap();
    let log_path = |address: &str| directory.join(format!("{}.log", address.replace(':', "_")));
    let mut processes = Processes(
        data.iter()
            .zip(&controls)
            .map(|(address, control)| {
                let log = std::fs::File::create(log_path(address)).unwrap();
                let front_flag = match front {
                    Some(Front::Ring) => vec!["--ring-listen", control.as_str()],
                    Some(Front::RfRpc) => vec!["--rfrpc-listen", control.as_str()],
                    None => vec![],
                };
                let medium_flag = medium.map(|medium| ["--replication-medium", medium]);
                let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
                    .args(["server", "--listen", address, "--cluster", file.to_str().unwrap()])
                    .args(front_flag)
                    .args(medium_flag.iter().flatten())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .unwrap();
                Some(child)
            })
            .collect(),
    );
    let logs = || {
        data.iter()
            .map(|address| {
                let log = std::fs::read_to_string(log_path(address)).unwrap_or_default();
                format!("--- server {address}:\n{log}")
            })
            .collect::<String>()
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    let ports: Vec<&String> = data.iter().chain(controls.iter().filter(|_| front.is_some())).collect();
    while ports.iter().any(|address| TcpStream::connect(address).is_err()) {
        let exited = processes.0.iter_mut().flatten().any(|child| child.try_wait().ok().flatten().is_some());
        if exited {
            let logs = logs();
            return Err(match logs.contains("Address already in use") {
                true => StartFailure::PortTaken(logs),
                false => StartFailure::Other(logs),
            });
        }
        if Instant::now() >= deadline {
            return Err(StartFailure::Other(format!("not all listening after 40 s\n{}", logs())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((cluster, processes))
}

/// `count` keys of server `server`'s partitions.
fn keys_of(cluster: &Cluster, server: usize, count: usize) -> Vec<Vec<u8>> {
    (0..).map(|i| format!("key{i}").into_bytes()).filter(|key| cluster.server_of(key) == server).take(count).collect()
}

/// With the one-sided medium (records held once written into the backup's log region, applied
/// by the backup later): every write acknowledged before the primary's SIGKILL is read back
/// from the promoted backup.
#[test]
fn a_killed_primary_is_failed_over_and_no_acknowledged_write_is_lost() {
    killed_primary_is_failed_over_and_no_acknowledged_write_is_lost(Some("onesided"));
}

/// The same with the records travelling over TCP.
#[test]
fn a_killed_primary_is_failed_over_and_no_acknowledged_write_is_lost_over_tcp_replication() {
    killed_primary_is_failed_over_and_no_acknowledged_write_is_lost(Some("tcp"));
}

fn killed_primary_is_failed_over_and_no_acknowledged_write_is_lost(medium: Option<&str>) {
    let directory = tempfile::tempdir().unwrap();
    let (cluster, mut processes) = start_with(directory.path(), 3, None, medium);
    let mut client = Client::connect(&cluster).unwrap();
    let keys: Vec<Vec<u8>> = (0..3).flat_map(|server| keys_of(&cluster, server, 4)).collect();
    let mut last: Vec<Vec<u8>> = vec![Vec::new(); keys.len()];
    let write_round = |client: &mut Client, round: u32, last: &mut Vec<Vec<u8>>| {
        // Each transaction spans every server: a victim's partitions are always in it.
        for chunk in 0..4 {
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..3)
                .map(|server| server * 4 + chunk)
                .map(|index| (keys[index].clone(), format!("r{round}k{index}").into_bytes()))
                .collect();
            client.put_all(pairs.clone()).expect("a write failed: failover must be transparent");
            for (index, (_, value)) in (0..3).map(|server| server * 4 + chunk).zip(pairs) {
                last[index] = value;
            }
        }
    };
    write_round(&mut client, 0, &mut last);
    processes.kill(0);
    let killed = Instant::now();
    write_round(&mut client, 1, &mut last);
    println!("first round of writes after the kill took {} ms", killed.elapsed().as_millis());
    let read = client.get_all(keys.clone()).expect("a read failed after the failover");
    for ((key, item), value) in keys.iter().zip(&read.items).zip(&last) {
        assert_eq!(&item.value, value, "key {:?}: an acknowledged write was lost", String::from_utf8_lossy(key));
    }
    // A client that connects now finds the new primary by itself.
    let mut fresh = Client::connect(&cluster).unwrap();
    let read = fresh.get_all(keys.clone()).unwrap();
    assert!(read.items.iter().zip(&last).all(|(item, value)| item.value == value));
    // The restarted victim rejoins as a new incarnation and serves nothing.
    let address = cluster.servers()[0].clone();
    restart(directory.path(), &cluster, &mut processes, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&address).is_err() {
        assert!(Instant::now() < deadline, "the victim did not restart");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_refuses_its_old_partitions(&address, &keys_of(&cluster, 0, 1)[0]);
    let read = client.get_all(keys.clone()).unwrap();
    assert!(read.items.iter().zip(&last).all(|(item, value)| item.value == value));
}

/// A GET and a PUT of `key` sent straight to `address` are refused as `NotPrimary`.
fn assert_refuses_its_old_partitions(address: &str, key: &[u8]) {
    let mut transport = TcpClientTransport::connect(&[address.to_string()]).unwrap();
    let get = Request::Get { items: vec![GetItem { key: key.to_vec(), selector: Selector::Latest }] };
    let ts = (rampkv::types::wall_clock_us() << 16) | 9;
    let put = Request::Put { ts, writes: vec![Write::new(key.to_vec(), b"stale".to_vec())] };
    for (id, request) in [(1u64, get), (2, put)] {
        match common::ask(&mut transport, 0, id, &request) {
            Response::Error { code: ErrorCode::NotPrimary, .. } => {}
            other => panic!("request {id} to the deposed server {address} was answered {other:?}"),
        }
    }
}

#[test]
fn a_deposed_primary_that_comes_back_with_its_old_state_serves_no_read_and_takes_no_write() {
    let directory = tempfile::tempdir().unwrap();
    let (cluster, mut processes) = start(directory.path(), 3);
    let mut client = Client::connect(&cluster).unwrap();
    let key = keys_of(&cluster, 0, 1).remove(0);
    client.put_all(vec![(key.clone(), b"old".to_vec())]).unwrap();
    // Server 0 stops (its memory intact) until the configuration service has replaced it.
    processes.signal(0, "-STOP");
    let stopped = Instant::now();
    client.put_all(vec![(key.clone(), b"new".to_vec())]).expect("the write after the failover failed");
    println!("the write after the primary stopped took {} ms", stopped.elapsed().as_millis());
    processes.signal(0, "-CONT");
    // Resumed with the old value in its store: whatever it learned or not, it must refuse.
    let address = cluster.servers()[0].clone();
    assert_refuses_its_old_partitions(&address, &key);
    std::thread::sleep(Duration::from_millis(500)); // it has heard from the configuration service by now
    assert_refuses_its_old_partitions(&address, &key);
    let read = client.get_all(vec![key.clone()]).unwrap();
    assert_eq!(&read.items[0].value[..], b"new", "the deposed primary's state was served");
    processes.kill(0);
}

/// Starts server `index` of the cluster again (a new incarnation, as after a crash).
fn restart(directory: &Path, cluster: &Cluster, processes: &mut Processes, index: usize) {
    let address = cluster.servers()[index].clone();
    let file = directory.join("cluster.toml");
    let path = directory.join(format!("restarted-{index}.log"));
    let log = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    processes.0[index] = Some(
        Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["server", "--listen", &address, "--cluster", file.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
}

/// Waits until the configuration service says every partition has its full replica set and
/// `condition` holds for the newest configuration; returns how long that took.
fn wait_for_configuration(
    cluster: &Cluster,
    what: &str,
    condition: impl Fn(&rampkv::config::configuration::Configuration) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let newest = rampkv::client::newest_configuration(cluster).ok().flatten();
        if rampkv::client::full_replica_sets(cluster).unwrap_or(false) && newest.as_ref().is_some_and(&condition) {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{what}: not within 30 s (last: {newest:?})");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rejoin (issue 16, item 5): a server killed with SIGKILL and restarted catches up from the
/// current primaries (a snapshot, then the records since, while writes go on) and becomes a
/// backup again; once the other two servers died in turn (each time with a majority of the
/// configuration service up), the rejoined one is the primary of every partition and serves
/// every acknowledged write, those acknowledged during its catch-up included.
#[test]
fn a_restarted_server_catches_up_and_serves_every_acknowledged_write_once_the_others_died() {
    let directory = tempfile::tempdir().unwrap();
    let (cluster, mut processes) = start(directory.path(), 3);
    let keys: Vec<Vec<u8>> = (0..3).flat_map(|server| keys_of(&cluster, server, 4)).collect();
    // A writer that never stops while servers die, catch up and take over: every value it was
    // acknowledged must read back at the end.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = {
        let (cluster, stop) = (cluster.clone(), std::sync::Arc::clone(&stop));
        let keys: Vec<Vec<u8>> = (0..3).flat_map(|server| keys_of(&cluster, server, 8).into_iter().skip(4)).collect();
        std::thread::spawn(move || {
            let mut client = Client::connect(&cluster).unwrap();
            let mut acknowledged = vec![None; keys.len()];
            let mut round = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let index = (round as usize) % keys.len();
                let value = format!("background{round}").into_bytes();
                client.put_all(vec![(keys[index].clone(), value.clone())]).expect("a background write failed");
                acknowledged[index] = Some(value);
                round += 1;
            }
            (keys, acknowledged, round)
        })
    };
    let mut client = Client::connect(&cluster).unwrap();
    let mut last: Vec<Vec<u8>> = vec![Vec::new(); keys.len()];
    let mut write_round = |client: &mut Client, round: u32| {
        for (index, key) in keys.iter().enumerate() {
            let value = format!("r{round}k{index}").into_bytes();
            client.put_all(vec![(key.clone(), value.clone())]).expect("a write failed: failover must be transparent");
            last[index] = value;
        }
    };
    write_round(&mut client, 0);
    processes.kill(0);
    write_round(&mut client, 1);
    restart(directory.path(), &cluster, &mut processes, 0);
    let admitted = |server: u16| {
        move |c: &rampkv::config::configuration::Configuration| c.servers()[usize::from(server)].incarnation != 0
    };
    let took = wait_for_configuration(&cluster, "server 0 restarted and admitted", admitted(0));
    println!("server 0 admitted, every replica set whole, {} ms after its restart", took.as_millis());
    write_round(&mut client, 2);
    processes.kill(1);
    write_round(&mut client, 3);
    // Server 0 is now the only candidate to restore the copies server 1 held: it catches up.
    let holds_every_partition = |c: &rampkv::config::configuration::Configuration| {
        c.replica_sets().iter().all(|set| set.primary == Some(0) || set.backups.contains(&0))
    };
    let took = wait_for_configuration(&cluster, "server 0 caught up every partition", holds_every_partition);
    println!("server 0 caught up every partition {} ms after server 1 died", took.as_millis());
    write_round(&mut client, 4);
    // Server 1 back (holding nothing), so that the configuration service keeps a majority
    // when server 2 dies; its Raft node votes once it caught up with the leader.
    restart(directory.path(), &cluster, &mut processes, 1);
    wait_for_configuration(&cluster, "server 1 restarted and admitted", admitted(1));
    std::thread::sleep(Duration::from_millis(500));
    write_round(&mut client, 5);
    processes.kill(2);
    write_round(&mut client, 6);
    stop.store(true, std::sync::atomic::Ordering::Release);
    let (background_keys, acknowledged, background_writes) = background.join().expect("the background writer");
    let configuration = rampkv::client::newest_configuration(&cluster).unwrap().unwrap();
    assert!(
        configuration.replica_sets().iter().all(|set| set.primary == Some(0)),
        "the rejoined server is the primary of every partition: {configuration:?}"
    );
    let read = client.get_all(keys.clone()).expect("a read failed after the failovers");
    for ((key, item), value) in keys.iter().zip(&read.items).zip(&last) {
        assert_eq!(&item.value, value, "key {:?}: an acknowledged write was lost", String::from_utf8_lossy(key));
    }
    let read = client.get_all(background_keys.clone()).unwrap();
    for ((key, item), value) in background_keys.iter().zip(&read.items).zip(&acknowledged) {
        if let Some(value) = value {
            assert_eq!(&item.value, value, "background key {:?} lost a write", String::from_utf8_lossy(key));
        }
    }
    println!("{background_writes} background writes acknowledged while servers died and caught up");
}

/// Runs one transaction begun by `begin` on `driver` to its end (at most 10 s).
fn finish<T: ClientTransport>(
    driver: &mut Driver<T>,
    begin: impl FnOnce(&mut Driver<T>) -> Result<(), ClientError>,
) -> Result<TxnResult, String> {
    begin(driver).map_err(|error| error.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut completions = Vec::new();
    while Instant::now() < deadline {
        driver.step(Some(Duration::from_millis(50)), &mut completions).map_err(|error| error.to_string())?;
        if let Some(completion) = completions.pop() {
            return completion.result.map_err(|error| error.to_string());
        }
    }
    Err("no answer within 10 s".into())
}

/// On a fresh driver over `transport`: reads `pairs`' keys twice (GET\*: the first read learns
/// the slots, the second reads them one-sidedly), each read returning `pairs`' values or the
/// newer `next` ones, then writes `next` (acknowledged) and reads it back.
fn read_then_write<T: ClientTransport>(
    transport: Result<T, TransportError>,
    cluster: &Cluster,
    pairs: &[(Vec<u8>, Vec<u8>)],
    next: &[(Vec<u8>, Vec<u8>)],
) -> Result<(), String> {
    let mut driver = Driver::connect(transport.map_err(|error| error.to_string())?, cluster.clone(), 1)
        .map_err(|error| error.to_string())?;
    let keys: Vec<Vec<u8>> = pairs.iter().map(|(key, _)| key.clone()).collect();
    for _ in 0..2 {
        let TxnResult::Read(read) = finish(&mut driver, |driver| driver.begin_read(0, keys.clone()))? else {
            return Err("a read finished as a write".into());
        };
        for ((pair, newer), item) in pairs.iter().zip(next).zip(&read.items) {
            // The write of an attempt that failed after its commit may be visible: newer, never older.
            assert!(item.value == pair.1 || item.value == newer.1, "an acknowledged write was lost: {item:?}");
        }
    }
    if let (Some(stats), true) = (driver.transport().getstar_stats(), pairs.iter().all(|pair| !pair.1.is_empty())) {
        // GET\*: keys that were written are read from the slots of the server that serves them
        // now, at the second read at the latest (keys never written have no slot).
        // A lease renewed late makes both reads fall back (unleased): an attempt that failed,
        // tried again by the caller, so one successful attempt always read one-sidedly.
        if stats.hits == 0 {
            return Err(format!("no one-sided read: {stats:?}"));
        }
    }
    finish(&mut driver, |driver| driver.begin_write(0, next.to_vec()).map(|_| ()))?;
    let TxnResult::Read(read) = finish(&mut driver, |driver| driver.begin_read(0, keys.clone()))? else {
        return Err("a read finished as a write".into());
    };
    for (pair, item) in next.iter().zip(&read.items) {
        assert_eq!(item.value, pair.1, "the acknowledged write is not read back");
    }
    Ok(())
}

/// The fabric transports follow a failover once rebuilt from the current primaries' control
/// addresses (`current_front_addresses`): for write-poll, send-recv and GET\* (ring front end)
/// and RF-RPC, a primary process is killed with SIGKILL, and a client rebuilt for the current
/// primaries reads every write acknowledged before the kill (GET\* from the new primary's
/// slots, no address of the dead one kept) and writes on.
#[test]
fn fabric_clients_rebuilt_from_the_current_primaries_go_on_after_a_primary_is_killed() {
    for transport in ["writepoll", "sendrecv", "onesided", "rfrpc"] {
        let directory = tempfile::tempdir().unwrap();
        let front = if transport == "rfrpc" { Front::RfRpc } else { Front::Ring };
        let (cluster, mut processes) = start_with_front(directory.path(), 3, Some(front));
        let mut keys = keys_of(&cluster, 0, 3);
        keys.extend(keys_of(&cluster, 1, 1));
        let with = |value: &str| -> Vec<(Vec<u8>, Vec<u8>)> {
            keys.iter().map(|key| (key.clone(), value.as_bytes().to_vec())).collect()
        };
        let attempt = |pairs: &[(Vec<u8>, Vec<u8>)], next: &[(Vec<u8>, Vec<u8>)]| {
            let controls = current_front_addresses(&cluster, front).map_err(|error| error.to_string())?;
            match transport {
                "writepoll" => read_then_write(WritePollClientTransport::connect(&controls), &cluster, pairs, next),
                "sendrecv" => read_then_write(SendRecvClientTransport::connect(&controls), &cluster, pairs, next),
                "onesided" => read_then_write(
                    OneSidedClientTransport::connect(&controls, OneSidedOptions::default()),
                    &cluster,
                    pairs,
                    next,
                ),
                _ => read_then_write(RfRpcClientTransport::connect(&controls), &cluster, pairs, next),
            }
        };
        // Before: "first" acknowledged (read as the empty value first: never written). A lease
        // renewed late on a loaded machine makes a live primary refuse (`NotPrimary`, lease
        // lapsed) until its next grant: a one-shot client tries again, as the blocking client
        // does by itself.
        let empty = with("");
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(error) = attempt(&empty, &with("first")) {
            assert!(Instant::now() < deadline, "{transport} before the kill: {error}");
            std::thread::sleep(Duration::from_millis(100));
        }
        processes.kill(0);
        let killed = Instant::now();
        let deadline = killed + Duration::from_secs(30);
        let mut failures = 0;
        while let Err(error) = attempt(&with("first"), &with("second")) {
            failures += 1;
            assert!(Instant::now() < deadline, "{transport}: no progress 30 s after the kill: {error}");
            std::thread::sleep(Duration::from_millis(100));
        }
        println!(
            "{transport}: going on {} ms after the primary was killed ({failures} attempts failed first)",
            killed.elapsed().as_millis()
        );
    }
}

/// The blocking client over a fabric transport follows a failover by itself, as over TCP
/// (`Client::connect_with` and a `client::connect` function): a write after its primary was
/// killed with SIGKILL succeeds without an error (the client rebuilds its transport for the
/// current primaries and tries again), and a read returns it.
#[test]
fn fabric_clients_follow_a_killed_primary_by_themselves() {
    write_through_a_kill("onesided", connect::onesided, Front::Ring);
    write_through_a_kill("sendrecv", connect::sendrecv, Front::Ring);
    write_through_a_kill("rfrpc", connect::rfrpc, Front::RfRpc);
}

fn write_through_a_kill<T: ClientTransport>(name: &str, connector: Connector<T>, front: Front) {
    let directory = tempfile::tempdir().unwrap();
    let (cluster, mut processes) = start_with_front(directory.path(), 3, Some(front));
    let mut keys = keys_of(&cluster, 0, 2);
    keys.extend(keys_of(&cluster, 1, 1));
    let with = |value: &str| -> Vec<(Vec<u8>, Vec<u8>)> {
        keys.iter().map(|key| (key.clone(), value.as_bytes().to_vec())).collect()
    };
    // On a failure, the servers' logs say what they did.
    let failed = |what: &str, error: ClientError| -> ! {
        let mut logs = String::new();
        for entry in std::fs::read_dir(directory.path()).unwrap().flatten() {
            if entry.path().extension().is_some_and(|extension| extension == "log") {
                logs += &format!("--- {}\n{}", entry.path().display(), std::fs::read_to_string(entry.path()).unwrap());
            }
        }
        panic!("{name}: {what} failed: {error}\n{logs}")
    };
    let mut client = Client::connect_with(&cluster, connector).unwrap_or_else(|error| failed("connecting", error));
    client.put_all(with("first")).unwrap_or_else(|error| failed("the first write", error));
    let read = client.get_all(keys.clone()).unwrap_or_else(|error| failed("the first read", error));
    assert!(read.items.iter().all(|item| item.value == b"first"[..]), "{name}: {read:?}");
    processes.kill(0);
    let killed = Instant::now();
    client.put_all(with("second")).unwrap_or_else(|error| failed("the write after the kill", error));
    println!("{name}: the write after the kill took {} ms", killed.elapsed().as_millis());
    let read = client.get_all(keys.clone()).unwrap_or_else(|error| failed("the read after the kill", error));
    assert!(read.items.iter().all(|item| item.value == b"second"[..]), "{name}: {read:?}");
}

/// GET\* reads trust a lease (FaRM's way): a primary stopped with SIGSTOP keeps its item
/// region mapped in its clients and its control connections open, so a GET\* client that had
/// cached its slots would go on reading them one-sidedly, never sending it a request that
/// its lease gate could refuse. The region's lease word ends with the lease it could not renew
/// (before the configuration service promoted the backup), so after the backup took over and
/// acknowledged a newer write, that client's reads of the key, while the old primary is
/// stopped and after it resumes (before and after it learns it is deposed), return the new
/// value or an error, never the old one; and a client rebuilt for the current primaries reads
/// the new value from the new primary's slots.
#[test]
fn a_getstar_client_never_reads_a_stopped_deposed_primarys_slots() {
    let directory = tempfile::tempdir().unwrap();
    let (cluster, mut processes) = start_with_front(directory.path(), 3, Some(Front::Ring));
    let key = keys_of(&cluster, 0, 1).remove(0);
    let mut client = Client::connect(&cluster).unwrap();
    client.put_all(vec![(key.clone(), b"old".to_vec())]).unwrap();
    let getstar = || {
        let controls = current_front_addresses(&cluster, Front::Ring).unwrap();
        let transport = OneSidedClientTransport::connect(&controls, OneSidedOptions::default()).unwrap();
        Driver::connect(transport, cluster.clone(), 1).unwrap()
    };
    let read = |driver: &mut Driver<OneSidedClientTransport>| {
        finish(driver, |driver| driver.begin_read(0, vec![key.clone()])).map(|result| match result {
            TxnResult::Read(read) => read.items[0].value.to_vec(),
            other => panic!("a read finished as {other:?}"),
        })
    };
    let mut cached = getstar();
    for _ in 0..2 {
        assert_eq!(read(&mut cached).unwrap(), b"old");
    }
    let stats = cached.transport().getstar_stats().unwrap();
    assert!(stats.hits >= 1, "the old primary's slot was not read one-sidedly: {stats:?}");
    processes.signal(0, "-STOP");
    let stopped = Instant::now();
    client.put_all(vec![(key.clone(), b"new".to_vec())]).expect("the write after the failover failed");
    println!("the write after the primary stopped took {} ms", stopped.elapsed().as_millis());
    // While it is stopped: a read from its slots would be one-sided, at once; it must not
    // happen. The fallback request sits unanswered in the stopped server's ring meanwhile.
    cached.begin_read(0, vec![key.clone()]).unwrap();
    let mut completions = Vec::new();
    let until = Instant::now() + Duration::from_millis(800);
    while completions.is_empty() && Instant::now() < until {
        cached.step(Some(Duration::from_millis(20)), &mut completions).unwrap();
    }
    let check = |result: &Result<Vec<u8>, String>, when: &str| {
        if let Ok(value) = result {
            assert_ne!(value, b"old", "{when}: the deposed primary's slot was read");
        }
        println!("{when}: {result:?}");
    };
    let mut results: Vec<Result<Vec<u8>, String>> = completions
        .drain(..)
        .map(|completion| match completion.result {
            Ok(TxnResult::Read(read)) => Ok(read.items[0].value.to_vec()),
            Ok(other) => panic!("a read finished as {other:?}"),
            Err(error) => Err(error.to_string()),
        })
        .collect();
    processes.signal(0, "-CONT");
    if results.is_empty() {
        // It answers the fallback once resumed: its lease has lapsed, so its gate refuses.
        let deadline = Instant::now() + Duration::from_secs(10);
        while completions.is_empty() && Instant::now() < deadline {
            cached.step(Some(Duration::from_millis(20)), &mut completions).unwrap();
        }
        results.extend(completions.drain(..).map(|completion| match completion.result {
            Ok(TxnResult::Read(read)) => Ok(read.items[0].value.to_vec()),
            Ok(other) => panic!("a read finished as {other:?}"),
            Err(error) => Err(error.to_string()),
        }));
    }
    assert_eq!(results.len(), 1, "the read while stopped never finished");
    check(&results[0], "read while the old primary was stopped");
    // Resumed, whether or not it has learned yet that it is deposed.
    check(&read(&mut cached), "read just after it resumed");
    std::thread::sleep(Duration::from_millis(500));
    check(&read(&mut cached), "read 500 ms after it resumed");
    let stats = cached.transport().getstar_stats().unwrap();
    assert!(stats.fallback_unleased >= 1, "no read was refused for want of a lease: {stats:?}");
    // A client of the current primaries reads the new value, one-sidedly the second time.
    let mut rebuilt = getstar();
    for _ in 0..2 {
        assert_eq!(read(&mut rebuilt).unwrap(), b"new");
    }
    let stats = rebuilt.transport().getstar_stats().unwrap();
    assert!(stats.hits >= 1, "the new primary's slots were not read: {stats:?}");
    processes.kill(0);
}
