//! Every client follows a failover (issue 30): three `rampkv server` processes from one cluster
//! file (`replicas = 2`; `address`, `replicate` and `config` in every entry), one of them killed
//! with SIGKILL every 3 to 6 s and restarted on the same command line, one at a time (each kill
//! waits until every partition has its two copies again, as `rampkv chaos` does).
//! - Through `rampkv gateway --cluster FILE`, redis-py threads run MSETs and MGETs of key
//!   groups (`scripts/resp_failover.py`): no acknowledged write is lost, no read is fractured,
//!   every group reads back at the end, no command fails (every failover completes within the
//!   bound) and the longest window with no successful command is at most 2 s. Before issue 30
//!   the gateway never asked the configuration service: the first kill's partitions answered
//!   `NotPrimary` for good, and after the second nothing succeeded.
//! - Through `rampkv put`, a loop of calls across the kills: none fails (before, about one call
//!   in 200 failed with `Connection refused` at its first connect), and `rampkv get` reads the
//!   last acknowledged value of every key at the end.
//! - No server logs `handshake not finished` (the resolver's idle connections, item 5).
//!
//! The suite runs 20 s of each (`RAMPKV_FAILOVER_SECONDS` sets it: the figures in
//! docs/reliability.md are of 60 s runs). The kills are seeded (`RAMPKV_TEST_SEED`, printed).
//! Needs `python3` with redis-py (`.ci/run` installs it).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[allow(dead_code)] // this binary uses only the free-address helper and the seed
mod common;

use rampkv::cluster::Cluster;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The longest window with no successful command the issue allows.
const LONGEST_GAP_MS_MAX: u64 = 2_000;

fn seconds() -> u64 {
    std::env::var("RAMPKV_FAILOVER_SECONDS").ok().and_then(|text| text.parse().ok()).unwrap_or(20)
}

/// The server processes of one cluster file, killed (SIGKILL) and reaped when dropped.
struct Servers {
    directory: PathBuf,
    cluster: Cluster,
    children: Vec<Option<Child>>,
    starts: usize,
}

impl Servers {
    /// Three servers with the configuration service and `replicas` copies of every
    /// partition, started and listening.
    fn start(directory: &Path, replicas: u32) -> Servers {
        let cluster = common::replicated_cluster(3, replicas);
        std::fs::write(directory.join("cluster.toml"), cluster.to_toml()).unwrap();
        let mut servers = Servers {
            directory: directory.to_path_buf(),
            cluster,
            children: (0..3).map(|_| None).collect(),
            starts: 0,
        };
        for index in 0..3 {
            servers.spawn(index);
        }
        let deadline = Instant::now() + Duration::from_secs(40);
        while servers.cluster.servers().iter().any(|address| TcpStream::connect(address).is_err()) {
            assert!(Instant::now() < deadline, "the servers did not start (logs in {})", directory.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        servers
    }

    fn cluster_file(&self) -> PathBuf {
        self.directory.join("cluster.toml")
    }

    /// Starts server `index` (again: a new incarnation, as after a crash), its log a file of
    /// its own.
    fn spawn(&mut self, index: usize) {
        self.starts += 1;
        let log = std::fs::File::create(self.directory.join(format!("server-{index}-{}.log", self.starts))).unwrap();
        let address = self.cluster.servers()[index].clone();
        let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["server", "--listen", &address, "--cluster"])
            .arg(self.cluster_file())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children[index] = Some(child);
    }

    fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }

    /// Every log of this run (the servers', the gateway's), for a failure's message.
    fn logs(&self) -> String {
        let mut logs = String::new();
        for entry in std::fs::read_dir(&self.directory).unwrap().flatten() {
            if entry.path().extension().is_some_and(|extension| extension == "log") {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                logs += &format!("--- {}\n{text}", entry.file_name().to_string_lossy());
            }
        }
        logs
    }

    /// Every line of every server log that contains `text`.
    fn logged(&self, text: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for entry in std::fs::read_dir(&self.directory).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with("server-") {
                let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
                lines.extend(log.lines().filter(|line| line.contains(text)).map(|line| format!("{name}: {line}")));
            }
        }
        lines
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for index in 0..self.children.len() {
            self.kill(index);
        }
    }
}

/// Kills a server every 3 to 6 s (drawn from `seed`) for [`seconds`] or until `stop`, each once
/// every partition has its two copies (at most 30 s of waiting), and restarts it 0.5 to 1.5 s
/// later. Returns the kills.
fn nemesis(servers: &mut Servers, seed: u64, stop: &AtomicBool) -> Vec<String> {
    let mut random = SmallRng::seed_from_u64(seed);
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(seconds());
    let stopped = || stop.load(Ordering::Acquire) || Instant::now() >= stop_at;
    let mut kills = Vec::new();
    let pause = |duration: Duration| {
        let until = Instant::now() + duration;
        while Instant::now() < until && !stopped() {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    loop {
        pause(Duration::from_millis(random.gen_range(3_000..6_000)));
        let waited = Instant::now();
        while !rampkv::client::full_replica_sets(&servers.cluster).unwrap_or(false) {
            assert!(waited.elapsed() < Duration::from_secs(30), "the replica sets were not whole again within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        if stopped() {
            return kills;
        }
        let victim = random.gen_range(0..servers.children.len());
        servers.kill(victim);
        kills.push(format!("server {victim} at {:.1} s", started.elapsed().as_secs_f64()));
        pause(Duration::from_millis(random.gen_range(500..1_500)));
        servers.spawn(victim);
    }
}

/// Runs `load` while the nemesis kills servers; returns its result and the kills.
fn under_kills<R>(servers: &mut Servers, load: impl FnOnce() -> R) -> (R, Vec<String>) {
    let seed = common::seed();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let killer = scope.spawn(|| nemesis(servers, seed, &stop));
        let result = load();
        stop.store(true, Ordering::Release);
        let kills = killer.join().expect("the nemesis");
        (result, kills)
    })
}

fn require_redis_py() {
    let probe = Command::new("python3").args(["-c", "import redis"]).output();
    match probe {
        Ok(output) if output.status.success() => {}
        other => panic!(
            "this test needs python3 with redis-py (python3 -m pip install redis; .ci/run installs it): {other:?}"
        ),
    }
}

/// A `rampkv gateway` process, killed when dropped.
struct GatewayProcess(Child);

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn redis_clients_through_the_gateway_lose_nothing_and_wait_at_most_2_s_while_servers_are_killed() {
    require_redis_py();
    let directory = tempfile::tempdir().unwrap();
    let mut servers = Servers::start(directory.path(), 2);
    let listen = common::free_addresses(1).remove(0);
    let log = std::fs::File::create(directory.path().join("gateway.log")).unwrap();
    let _gateway = GatewayProcess(
        Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["gateway", "--listen", &listen, "--cluster"])
            .arg(servers.cluster_file())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(&listen).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let port = listen.rsplit_once(':').unwrap().1.to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/resp_failover.py");
    let (output, kills) = under_kills(&mut servers, || {
        let mut command = Command::new("timeout");
        // The run, then the final read (at most 30 s), then a margin.
        command.args([(seconds() + 90).to_string().as_str(), "python3"]).arg(&script);
        command.args(["--port", &port, "--duration", &seconds().to_string()]);
        if let Ok(seed) = std::env::var("RAMPKV_TEST_SEED") {
            command.args(["--seed", &seed]);
        }
        command.output().unwrap()
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{} kills: {kills:?}\n{stderr}{stdout}", kills.len());
    assert!(output.status.success(), "the script failed: {stderr}");
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the script's summary");
    let count = |field: &str| summary[field].as_u64().unwrap_or_else(|| panic!("{field} in {summary}"));
    assert!(kills.len() as u64 >= seconds() / 8, "the nemesis killed too little: {kills:?}");
    assert_eq!(count("lost_count"), 0, "acknowledged writes were lost: {summary}");
    assert_eq!(count("fractured_count"), 0, "fractured reads: {summary}");
    assert_eq!(count("phantom_count"), 0, "values no MSET sent: {summary}");
    assert_eq!(summary["unreadable"].as_array().map(Vec::len), Some(0), "groups not read back: {summary}");
    assert_eq!(summary["errors"].as_object().map(|errors| errors.len()), Some(0), "commands failed: {summary}");
    assert!(count("longest_gap_ms") <= LONGEST_GAP_MS_MAX, "no command succeeded for too long: {summary}");
    assert!(count("mset_ok") > 100 && count("mget_ok") > 100, "the run did real work: {summary}");
    let handshakes = servers.logged("handshake not finished");
    assert!(handshakes.is_empty(), "connections were closed before their handshake: {handshakes:#?}");
}

#[test]
fn rampkv_put_calls_across_kills_all_succeed_and_rampkv_get_reads_the_last_of_each() {
    let directory = tempfile::tempdir().unwrap();
    let mut servers = Servers::start(directory.path(), 2);
    let file = servers.cluster_file();
    let run = |arguments: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_rampkv")).args(arguments).arg("--cluster").arg(&file).output().unwrap()
    };
    let keys: Vec<String> = (0..6).map(|index| format!("put-key-{index}")).collect();
    let ((calls, failures, last, slowest), kills) = under_kills(&mut servers, || {
        let (mut calls, mut failures, mut last) = (0u64, Vec::new(), vec![None; keys.len()]);
        let mut slowest = Duration::ZERO;
        let until = Instant::now() + Duration::from_secs(seconds());
        while Instant::now() < until {
            // Two keys per call, on different servers most of the time.
            let (first, second) = ((calls as usize) % keys.len(), (calls as usize + 1) % keys.len());
            let value = format!("v{calls}");
            let pairs = [format!("{}={value}", keys[first]), format!("{}={value}", keys[second])];
            let started = Instant::now();
            let output = run(&["put".to_string(), pairs[0].clone(), pairs[1].clone()]);
            slowest = slowest.max(started.elapsed());
            if output.status.success() {
                last[first] = Some(value.clone());
                last[second] = Some(value);
            } else {
                failures.push(format!("call {calls}: {}", String::from_utf8_lossy(&output.stderr).trim()));
            }
            calls += 1;
        }
        (calls, failures, last, slowest)
    });
    println!("{calls} calls of rampkv put (the slowest took {slowest:?}), {} kills: {kills:?}", kills.len());
    assert!(kills.len() as u64 >= seconds() / 8, "the nemesis killed too little: {kills:?}");
    assert!(failures.is_empty(), "{} of {calls} calls failed: {failures:#?}", failures.len());
    let mut arguments = vec!["get".to_string()];
    arguments.extend(keys.iter().cloned());
    let output = run(&arguments);
    assert!(output.status.success(), "rampkv get failed: {}", String::from_utf8_lossy(&output.stderr));
    let read = String::from_utf8_lossy(&output.stdout);
    for (key, value) in keys.iter().zip(&last) {
        let value = value.as_ref().expect("every key was written");
        assert!(read.lines().any(|line| line == format!("{key}={value}")), "{key}: expected {value}, read {read}");
    }
    let handshakes = servers.logged("handshake not finished");
    assert!(handshakes.is_empty(), "connections were closed before their handshake: {handshakes:#?}");
}

/// Sends one command in RESP and returns its reply's first line (`+OK`, `-ERR ...`, `$5` ...)
/// and, for a bulk string, its value.
fn resp_command(stream: &mut TcpStream, arguments: &[&str]) -> (String, Option<String>) {
    use std::io::{BufRead, BufReader, Write};
    let mut request = format!("*{}\r\n", arguments.len());
    for argument in arguments {
        request += &format!("${}\r\n{argument}\r\n", argument.len());
    }
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let line = line.trim_end().to_string();
    let value = match line.strip_prefix('$').and_then(|length| length.parse::<usize>().ok()) {
        Some(_) => {
            let mut value = String::new();
            reader.read_line(&mut value).unwrap();
            Some(value.trim_end().to_string())
        }
        None => None,
    };
    (line, value)
}

/// Whether every thread of process `pid` is stopped (state `T` in /proc/PID/task/TID/stat).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(Result::ok).all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

fn signal(child: &Child, signal: &str) {
    let pid = child.id();
    assert!(Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success());
    if signal == "-STOP" {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(pid) {
            assert!(Instant::now() < deadline, "process {pid} did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The bound, and no command stuck after the cluster recovers: two of the three servers are
/// stopped (SIGSTOP), so the configuration service has no majority and nothing can fail over.
/// A SET of a key of a stopped server waits for the failover bound
/// (`FAILOVER_CLIENT_RETRY_MS_MAX`, 10 s; its last attempt may take up to the transaction
/// timeout more) and is answered `-TRYAGAIN` or `-CLUSTERDOWN`, never `-ERR` and never before
/// the bound. Once the two servers resume, SETs and GETs of keys of every server succeed, on
/// the same connection and on a new one, within 30 s.
///
/// Three copies of every partition: on resuming, the configuration service may fail over
/// servers whose leases lapsed during the stop one after another; with two copies that has left
/// a partition with none (its primary `None` while all three servers were up: found while
/// writing this test, docs/reliability.md, left to the configuration service's owners), with
/// three the leader's own server keeps a copy of everything.
#[test]
fn past_the_failover_bound_a_command_gets_tryagain_and_the_gateway_recovers_with_the_cluster() {
    let directory = tempfile::tempdir().unwrap();
    let servers = Servers::start(directory.path(), 3);
    let listen = common::free_addresses(1).remove(0);
    let log = std::fs::File::create(directory.path().join("gateway.log")).unwrap();
    let _gateway = GatewayProcess(
        Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["gateway", "--listen", &listen, "--cluster"])
            .arg(servers.cluster_file())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stream = loop {
        match TcpStream::connect(&listen) {
            Ok(stream) => break stream,
            Err(_) => assert!(Instant::now() < deadline, "the gateway did not start"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let key_of = |server: usize| {
        (0..).map(|i| format!("bound{i}")).find(|key| servers.cluster.server_of(key.as_bytes()) == server).unwrap()
    };
    let keys: Vec<String> = (0..3).map(key_of).collect();
    for key in &keys {
        assert_eq!(resp_command(&mut stream, &["SET", key, "before"]).0, "+OK");
    }
    for index in [1, 2] {
        signal(servers.children[index].as_ref().unwrap(), "-STOP");
    }
    let started = Instant::now();
    let (reply, _) = resp_command(&mut stream, &["SET", &keys[1], "during"]);
    let waited = started.elapsed();
    println!("a SET of a stopped server's key was answered {reply:?} after {waited:?}");
    assert!(reply.starts_with("-TRYAGAIN ") || reply.starts_with("-CLUSTERDOWN "), "{reply}");
    let bound = Duration::from_millis(rampkv::limits::FAILOVER_CLIENT_RETRY_MS_MAX);
    let attempt_max = Duration::from_millis(rampkv::limits::TXN_TIMEOUT_MS);
    assert!(waited >= bound, "answered before the bound: {waited:?}");
    assert!(waited <= bound + attempt_max + Duration::from_secs(3), "answered long after the bound: {waited:?}");
    for index in [1, 2] {
        signal(servers.children[index].as_ref().unwrap(), "-CONT");
    }
    let resumed = Instant::now();
    let mut fresh = TcpStream::connect(&listen).unwrap();
    fresh.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    for (round, key) in keys.iter().enumerate() {
        for connection in [&mut stream, &mut fresh] {
            let value = format!("after{round}");
            let (reply, _) = resp_command(connection, &["SET", key, &value]);
            if reply != "+OK" {
                let configuration = rampkv::client::newest_configuration(&servers.cluster);
                let elapsed = resumed.elapsed();
                panic!("{key}: {reply} {elapsed:?} after the servers resumed\n{configuration:?}\n{}", servers.logs());
            }
            assert_eq!(resp_command(connection, &["GET", key]).1.as_deref(), Some(value.as_str()));
        }
    }
    println!("every key written and read {:?} after the servers resumed", resumed.elapsed());
    assert!(resumed.elapsed() < Duration::from_secs(30), "the gateway took {:?} to recover", resumed.elapsed());
}

/// A cluster file whose servers never answer (replicated, with a configuration service at
/// addresses where nothing listens): `rampkv get` tries again within the failover bound, then
/// fails with an error that says what it could not reach.
#[test]
fn rampkv_get_against_a_cluster_that_never_answers_fails_with_a_clear_error_after_the_bound() {
    let directory = tempfile::tempdir().unwrap();
    let cluster = common::replicated_cluster(2, 2);
    let file = directory.path().join("cluster.toml");
    std::fs::write(&file, cluster.to_toml()).unwrap();
    let started = Instant::now();
    let output =
        Command::new(env!("CARGO_BIN_EXE_rampkv")).args(["get", "key", "--cluster"]).arg(&file).output().unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("rampkv get failed after {took:?}: {stderr}");
    assert!(!output.status.success());
    assert!(stderr.contains("within the failover bound") && stderr.contains("configuration service"), "{stderr}");
    let bound = Duration::from_millis(rampkv::limits::FAILOVER_CLIENT_RETRY_MS_MAX);
    assert!(took >= bound && took < bound + Duration::from_secs(5), "{took:?}");
}
