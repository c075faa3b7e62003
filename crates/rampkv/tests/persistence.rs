//! Durable restart (issue 17) with real faults: a `rampkv local --data-dir` process (two servers,
//! each with its own directory, `--appendfsync always`) killed with SIGKILL in the middle of
//! its work, its files then damaged the way a crash or a disk damages them, and restarted on the
//! same directory. (Killing every server of a cluster of separate processes mid-workload, with
//! the history checked across the restarts, is `tests/chaos.rs`,
//! `kill_all_with_persistence_loses_no_acknowledged_write_and_stays_atomic`.)

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[allow(dead_code)] // this binary uses only the request-by-request and free-address helpers
mod common;

use common::ask;
use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::durable::record::check_frame;
use rampkv::transport::TcpClientTransport;
use rampkv::types::{wall_clock_us, TimestampClock};
use rampkv::wire::{GetItem, Metadata, Request, Response, Selector, Write, WriteSet};
use rand::{Rng, SeedableRng};

/// Bytes of a segment's file header (docs/persistence.md).
const FILE_HEADER_BYTES: usize = 32;

/// A `rampkv local --data-dir` process of two servers, killed (SIGKILL) when dropped.
struct Local {
    child: Child,
    /// What it printed on standard error up to "ready".
    lines: Vec<String>,
    cluster: Option<Cluster>,
}

impl Local {
    /// Starts it on `dir` and waits until it serves; `Err` with what it printed if it exits
    /// first.
    fn start(dir: &Path, extra: &[&str]) -> Result<Local, Vec<String>> {
        let cluster_file = dir.join("cluster.toml");
        let mut child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["local", "--servers", "2", "--front", "none", "--appendfsync", "always", "--data-dir"])
            .arg(dir.join("data"))
            .arg("--cluster-file")
            .arg(&cluster_file)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rampkv local starts");
        let stderr = child.stderr.take().expect("piped");
        let mut local = Local { child, lines: Vec::new(), cluster: None };
        let mut reader = BufReader::new(stderr);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                let _ = local.child.wait();
                return Err(std::mem::take(&mut local.lines));
            }
            let ready = line.contains("cluster file");
            local.lines.push(line.trim_end().to_owned());
            if ready {
                break;
            }
        }
        // The rest of its output is not needed; a thread drains it so that it never blocks.
        std::thread::spawn(move || for _ in reader.lines().map_while(Result::ok) {});
        local.cluster = Some(Cluster::from_file(&cluster_file).expect("cluster file"));
        Ok(local)
    }

    fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().expect("read when it started")
    }

    fn output(&self) -> String {
        self.lines.join("\n")
    }

    /// The recovery line of server `index`.
    fn recovery_of(&self, dir: &Path, index: usize) -> String {
        let server_dir = dir.join("data").join(format!("server-{index}"));
        let at = self.lines.iter().position(|line| line.contains(&format!("recovered {}", server_dir.display())));
        let at = at.unwrap_or_else(|| panic!("no recovery line for {}:\n{}", server_dir.display(), self.output()));
        // Its cuts follow on indented lines.
        let rest = self.lines[at + 1..].iter().take_while(|line| line.starts_with("  "));
        std::iter::once(&self.lines[at]).chain(rest).cloned().collect::<Vec<_>>().join("\n")
    }

    /// SIGKILL, as a crash or a power cut would stop it.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Puts `key<i>` = `value<i>` one transaction at a time, from 0 up, until `stop` or a failure
/// (the servers were killed); returns the `i` acknowledged.
fn write_until_stopped(cluster: Cluster, stop: Arc<AtomicBool>, acknowledged: Arc<Mutex<Vec<u64>>>) {
    let Ok(mut client) = Client::connect(&cluster) else { return };
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let pair = (format!("key{i}").into_bytes(), format!("value{i}").into_bytes());
        if client.put_all(vec![pair]).is_err() {
            return;
        }
        acknowledged.lock().unwrap().push(i);
    }
}

/// Starts a writer, lets it write for `run`, then kills the process under it (the writer is in
/// the middle of a write). Returns the keys it saw acknowledged.
fn write_then_kill(local: Local, run: Duration) -> Vec<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (cluster, stop, acknowledged) = (local.cluster().clone(), Arc::clone(&stop), Arc::clone(&acknowledged));
        std::thread::spawn(move || write_until_stopped(cluster, stop, acknowledged))
    };
    std::thread::sleep(run);
    local.kill();
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer ends");
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(acknowledged.len() > 20, "too few writes acknowledged to test anything: {}", acknowledged.len());
    acknowledged
}

/// Reads `key<i>` for each `i` (in transactions of 16 keys); the value found, or `None` for the
/// initial value.
fn read_back(cluster: &Cluster, indices: &[u64]) -> Vec<(u64, Option<String>)> {
    let mut client = Client::connect(cluster).expect("connect");
    let mut found = Vec::new();
    for chunk in indices.chunks(16) {
        let keys = chunk.iter().map(|i| format!("key{i}").into_bytes()).collect();
        let outcome = client.get_all(keys).expect("read");
        for (i, item) in chunk.iter().zip(outcome.items) {
            found.push((*i, (item.ts != 0).then(|| String::from_utf8_lossy(&item.value).into_owned())));
        }
    }
    found
}

/// The newest log segment of server `index`, the offsets where its records start, and where
/// they end (segments are zero-filled before they take records: zeros follow).
fn newest_segment(dir: &Path, index: usize) -> (PathBuf, Vec<usize>, usize) {
    let server_dir = dir.join("data").join(format!("server-{index}"));
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&server_dir)
        .unwrap()
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .collect();
    segments.sort();
    let segment = segments.pop().expect("a segment");
    let bytes = std::fs::read(&segment).unwrap();
    let mut offsets = Vec::new();
    let mut offset = FILE_HEADER_BYTES;
    while let Ok(frame) = check_frame(&bytes[offset..]) {
        offsets.push(offset);
        offset += frame.len();
    }
    assert!(bytes[offset..].iter().all(|&byte| byte == 0), "a segment is whole records, then zeros");
    (segment, offsets, offset)
}

fn seed() -> u64 {
    let seed = std::env::var("RAMPKV_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    });
    println!("seed {seed} (replay with RAMPKV_TEST_SEED={seed})");
    seed
}

/// kill -9 in the middle of writes, then the log of server 0 cut at a random byte offset (what a
/// crash in the middle of a write leaves): the server starts, reports exactly what it cut, and
/// holds every acknowledged write before the cut; server 1's log is whole, so all its
/// acknowledged writes are found. No value is ever one that was not written.
#[test]
fn a_log_cut_at_a_random_offset_after_kill_9_is_cut_there_and_reported() {
    let seed = seed();
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    let acknowledged = write_then_kill(local, Duration::from_millis(600));
    let (segment, records, length) = newest_segment(dir.path(), 0);
    let cut_at = random.gen_range(FILE_HEADER_BYTES + 1..length);
    std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(cut_at as u64).unwrap();
    // The record the cut falls in is dropped whole (none, when the cut is on a boundary).
    let last_start = records.iter().copied().rfind(|&start| start < cut_at).expect("after the header");
    let torn = (!records.contains(&cut_at)).then_some(last_start);
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    let recovery = local.recovery_of(dir.path(), 0);
    println!("cut the segment at {cut_at} of {length} bytes:\n{}", local.output());
    match torn {
        Some(start) => {
            let expected = format!("{} cut at byte offset {start}: {} bytes", segment.display(), cut_at - start);
            assert!(recovery.contains(&expected) && recovery.contains("torn write"), "{expected}\n{recovery}");
        }
        None => assert!(!recovery.contains("cut at"), "a cut on a record boundary drops nothing: {recovery}"),
    }
    assert!(local.recovery_of(dir.path(), 1).lines().count() == 1, "server 1's log is whole");
    let server_of = |i: u64| local.cluster().server_of(format!("key{i}").as_bytes());
    let found = read_back(local.cluster(), &acknowledged);
    let mut kept_on_server_0 = 0;
    for (i, value) in &found {
        match value {
            Some(value) => assert_eq!(value, &format!("value{i}"), "key{i}"),
            None => assert_eq!(server_of(*i), 0, "key{i} on the whole log of server 1 was lost"),
        }
        kept_on_server_0 += usize::from(value.is_some() && server_of(*i) == 0);
    }
    println!("{kept_on_server_0} acknowledged writes of server 0 kept before the cut");
}

/// A checksum damaged in the middle of a log (a later record vouches that the damaged one had
/// been fsynced whole, so this is not a torn write): the server refuses to start, naming the
/// file and the offset, and changes nothing; `--truncate-corrupt-log` cuts the log there,
/// reports the cut, and serves what came before.
#[test]
fn a_checksum_damaged_in_the_middle_refuses_to_start_until_truncate_corrupt_log() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    let acknowledged = write_then_kill(local, Duration::from_millis(600));
    let (segment, records, _) = newest_segment(dir.path(), 0);
    let damaged = records[records.len() / 2];
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[damaged + 4] ^= 0x5a; // its checksum
    std::fs::write(&segment, &bytes).unwrap();
    let lines = match Local::start(dir.path(), &[]) {
        Ok(local) => panic!("started on a damaged log:\n{}", local.output()),
        Err(lines) => lines.join("\n"),
    };
    let expected = format!("{}: damaged log record at byte offset {damaged}", segment.display());
    assert!(lines.contains(&expected) && lines.contains("checksum mismatch"), "{expected}\n{lines}");
    assert_eq!(std::fs::read(&segment).unwrap(), bytes, "a refused start changes no file");
    let local =
        Local::start(dir.path(), &["--truncate-corrupt-log"]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    let recovery = local.recovery_of(dir.path(), 0);
    let expected = format!("{} cut at byte offset {damaged}", segment.display());
    assert!(recovery.contains(&expected) && recovery.contains("damage in the middle"), "{expected}\n{recovery}");
    let found = read_back(local.cluster(), &acknowledged);
    assert!(found.iter().all(|(i, value)| value.as_ref().is_none_or(|value| *value == format!("value{i}"))));
    assert!(found.iter().filter(|(_, value)| value.is_some()).count() > acknowledged.len() / 2, "{found:?}");
}

/// The record kind byte of a log record (docs/persistence.md, "Record header").
const RECORD_KIND_OFFSET: usize = 8;
/// The kind of a COMMIT record.
const KIND_COMMIT: u8 = 2;

/// A transaction acknowledged to its client whose COMMIT records are then cut off both
/// servers' logs (after kill -9): at restart it is prepared, neither committed nor aborted, on
/// both (what a client that crashed after its PREPAREs leaves), and cooperative termination
/// commits it, since every participant has it prepared. The decision is logged: after a second
/// kill -9 and restart nothing is in doubt and the write is still there. (With `always` a
/// COMMIT's reply waits for its record to be fsynced, so a power cut cannot do this to an
/// acknowledged transaction: cooperative termination could abort it if a participant had
/// collected its versions meanwhile; docs/persistence.md, "Why a COMMIT waits for its fsync".)
#[test]
fn a_transaction_whose_commit_records_are_cut_off_every_log_is_committed_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    let keys = keys_on_both(local.cluster(), "lost-commit");
    let mut client = Client::connect(local.cluster()).expect("connect");
    let rounds = 20;
    for round in 0..rounds {
        let writes = keys.iter().map(|key| (key.clone(), format!("round {round}").into_bytes())).collect();
        client.put_all(writes).expect("acknowledged");
    }
    drop(client);
    local.kill();
    for index in 0..2 {
        // A COMMIT is acknowledged once its record is fsynced: it is the last one.
        let (segment, records, _) = newest_segment(dir.path(), index);
        let bytes = std::fs::read(&segment).unwrap();
        let last = *records.last().expect("records");
        assert_eq!(bytes[last + RECORD_KIND_OFFSET], KIND_COMMIT, "the last record of server {index}");
        // Cut it off.
        std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(last as u64).unwrap();
    }
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    println!("{}", local.output());
    for index in 0..2 {
        assert!(local.recovery_of(dir.path(), index).contains(" 1 transactions in doubt"), "{}", local.output());
    }
    let last = format!("round {}", rounds - 1);
    for key in &keys {
        assert_eq!(read_until(local.cluster(), key, Some(&last)).as_deref(), Some(&last[..]), "{key:?}");
    }
    // Committed by recovery, and the COMMIT it logged is durable: wait for it, then crash again.
    std::thread::sleep(Duration::from_millis(300));
    local.kill();
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    for index in 0..2 {
        assert!(local.recovery_of(dir.path(), index).contains(" 0 transactions in doubt"), "{}", local.output());
    }
    let mut client = Client::connect(local.cluster()).expect("connect");
    for item in client.get_all(keys.to_vec()).expect("read").items {
        assert_eq!(String::from_utf8_lossy(&item.value), last);
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

/// Keys of `cluster` named `prefix<n>` on server 0 and on server 1.
fn keys_on_both(cluster: &Cluster, prefix: &str) -> [Vec<u8>; 2] {
    let key_on = |server| {
        (0..).map(|n| format!("{prefix}{n}").into_bytes()).find(|key| cluster.server_of(key) == server).unwrap()
    };
    [key_on(0), key_on(1)]
}

/// Polls until `key` reads `expected` (None: the initial value), for at most 10 s.
fn read_until(cluster: &Cluster, key: &[u8], expected: Option<&str>) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut client = Client::connect(cluster).expect("connect");
        let item = client.get_all(vec![key.to_vec()]).expect("read").items.remove(0);
        let value = (item.ts != 0).then(|| String::from_utf8_lossy(&item.value).into_owned());
        if value.as_deref() == expected || Instant::now() > deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Transactions in doubt at a crash: one prepared (and acknowledged, hence durable) on both of
/// its servers, never committed; one prepared on server 0 only. After kill -9 and a restart on
/// the same directories, cooperative termination commits the first (every participant has it
/// prepared) and aborts the second (server 1 never saw it, and from then on refuses it). Both
/// decisions are logged: after a second kill -9 and restart, the first is still visible, the
/// second still invisible, and its late PREPARE is still refused by server 1.
#[test]
fn transactions_in_doubt_at_a_crash_are_resolved_on_restart_and_the_outcome_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    let [a0, a1] = keys_on_both(local.cluster(), "both");
    let [b0, b1] = keys_on_both(local.cluster(), "half");
    let mut clock = TimestampClock::new(64_000);
    let (both, half) = (clock.next(wall_clock_us()).unwrap(), clock.next(wall_clock_us()).unwrap());
    let mut transport = TcpClientTransport::connect(local.cluster().servers()).unwrap();
    let both_set = [a0.clone(), a1.clone()];
    assert_eq!(ask(&mut transport, 0, 1, &prepare(both, &both_set, &a0)), Response::Ack);
    assert_eq!(ask(&mut transport, 1, 2, &prepare(both, &both_set, &a1)), Response::Ack);
    let half_set = [b0.clone(), b1.clone()];
    assert_eq!(ask(&mut transport, 0, 3, &prepare(half, &half_set, &b0)), Response::Ack);
    drop(transport);
    local.kill();

    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    assert!(local.recovery_of(dir.path(), 0).contains("2 transactions in doubt"), "{}", local.output());
    assert!(local.recovery_of(dir.path(), 1).contains("1 transactions in doubt"), "{}", local.output());
    let committed = format!("in-doubt {both}");
    assert_eq!(read_until(local.cluster(), &a0, Some(&committed)).as_deref(), Some(&committed[..]));
    assert_eq!(read_until(local.cluster(), &a1, Some(&committed)).as_deref(), Some(&committed[..]));
    // Resolved: nothing pending any more on either server (the abort of `half` included).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut transport = TcpClientTransport::connect(local.cluster().servers()).unwrap();
    loop {
        let state = ask(&mut transport, 0, 4, &Request::Status { ts: half, keys: vec![b0.clone()] });
        if state == (Response::Status { state: rampkv::wire::TxnState::Aborted }) || Instant::now() > deadline {
            assert_eq!(state, Response::Status { state: rampkv::wire::TxnState::Aborted });
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(read_until(local.cluster(), &b0, None), None);
    drop(transport);
    local.kill();

    let local = Local::start(dir.path(), &[]).unwrap_or_else(|lines| panic!("{}", lines.join("\n")));
    for index in 0..2 {
        assert!(local.recovery_of(dir.path(), index).contains(" 0 transactions in doubt"), "{}", local.output());
    }
    assert_eq!(read_until(local.cluster(), &a1, Some(&committed)).as_deref(), Some(&committed[..]));
    assert_eq!(read_until(local.cluster(), &b0, None), None);
    let mut transport = TcpClientTransport::connect(local.cluster().servers()).unwrap();
    let late = ask(&mut transport, 1, 5, &prepare(half, &half_set, &b1));
    assert!(matches!(late, Response::Error { .. }), "a late PREPARE of the aborted transaction: {late:?}");
}

/// A `rampkv server` process with `--cluster` and `--data-dir`, killed (SIGKILL) when dropped.
struct ServerProcess {
    child: Child,
    /// What it printed on standard error up to "listening".
    lines: Vec<String>,
}

impl ServerProcess {
    /// Starts server `index` of the cluster file in `dir` (`always`, superseded versions
    /// collected after `gc_grace_ms`) and waits until it listens.
    fn start(dir: &Path, index: usize, address: &str, gc_grace_ms: u64) -> ServerProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_rampkv"))
            .args(["server", "--listen", address, "--appendfsync", "always", "--gc-grace-ms"])
            .arg(gc_grace_ms.to_string())
            .arg("--cluster")
            .arg(dir.join("cluster.toml"))
            .arg("--data-dir")
            .arg(dir.join("data").join(format!("server-{index}")))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rampkv server starts");
        // Owned by the guard from here on, so a failed assertion below still kills it.
        let mut process = ServerProcess { child, lines: Vec::new() };
        let mut reader = BufReader::new(process.child.stderr.take().expect("piped"));
        loop {
            let mut line = String::new();
            let read = reader.read_line(&mut line).unwrap_or(0);
            assert!(read > 0, "server {index} exited before it listened:\n{}", process.lines.join("\n"));
            process.lines.push(line.trim_end().to_owned());
            if line.starts_with("rampkv server listening on") {
                break;
            }
        }
        std::thread::spawn(move || for _ in reader.lines().map_while(Result::ok) {});
        process
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why a COMMIT's reply waits for its record to be fsynced (docs/persistence.md, "Why a COMMIT
/// waits for its fsync"): a transaction committed on both of its servers, whose COMMIT record
/// server 0 then loses, while server 1, still running, has collected its version (a later
/// write superseded it, the GC grace period passed). Server 0 restarts with the transaction in
/// doubt; server 1 no longer knows it, so cooperative termination aborts it on server 0. Had
/// that COMMIT been acknowledged before its fsync, a power cut of server 0 alone would have
/// lost an acknowledged write this way. (Here the record is cut off after kill -9, as a power
/// cut would lose it; with `always` a COMMIT is acknowledged only once it is on disk.)
#[test]
fn a_commit_record_lost_once_the_other_server_collected_the_transaction_means_an_abort() {
    const GC_GRACE_MS: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let addresses = common::free_addresses(2);
    let text: String = addresses.iter().map(|address| format!("[[servers]]\naddress = \"{address}\"\n")).collect();
    std::fs::write(dir.path().join("cluster.toml"), text).unwrap();
    let cluster = Cluster::from_file(&dir.path().join("cluster.toml")).expect("cluster file");
    let server_0 = ServerProcess::start(dir.path(), 0, &addresses[0], GC_GRACE_MS);
    let _server_1 = ServerProcess::start(dir.path(), 1, &addresses[1], GC_GRACE_MS);
    let [k0, k1] = keys_on_both(&cluster, "collected");
    let mut clock = TimestampClock::new(64_000);
    let mut transport = TcpClientTransport::connect(cluster.servers()).unwrap();
    // The transaction, on both servers: prepared, then committed (both acknowledged).
    let committed = clock.next(wall_clock_us()).unwrap();
    let write_set = [k0.clone(), k1.clone()];
    assert_eq!(ask(&mut transport, 0, 1, &prepare(committed, &write_set, &k0)), Response::Ack);
    assert_eq!(ask(&mut transport, 1, 2, &prepare(committed, &write_set, &k1)), Response::Ack);
    assert_eq!(ask(&mut transport, 0, 3, &Request::Commit { ts: committed }), Response::Ack);
    assert_eq!(ask(&mut transport, 1, 4, &Request::Commit { ts: committed }), Response::Ack);
    // Later writes of its key on server 1 supersede its version there, and once the grace
    // period has passed server 1 collects it (at the next write of the key, or its sweep).
    let exact = Request::Get { items: vec![GetItem { key: k1.clone(), selector: Selector::Exact(committed) }] };
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in (5..).step_by(3) {
        let later = clock.next(wall_clock_us()).unwrap();
        assert_eq!(ask(&mut transport, 1, id, &prepare(later, std::slice::from_ref(&k1), &k1)), Response::Ack);
        assert_eq!(ask(&mut transport, 1, id + 1, &Request::Commit { ts: later }), Response::Ack);
        if matches!(ask(&mut transport, 1, id + 2, &exact), Response::Error { .. }) {
            break; // collected
        }
        assert!(Instant::now() < deadline, "server 1 never collected version {committed} of {k1:?}");
        std::thread::sleep(Duration::from_millis(GC_GRACE_MS));
    }
    drop(transport);
    // Server 0 stops, and its COMMIT record, the last record it wrote, is lost.
    drop(server_0);
    let (segment, records, _) = newest_segment(dir.path(), 0);
    let last = *records.last().expect("records");
    assert_eq!(std::fs::read(&segment).unwrap()[last + RECORD_KIND_OFFSET], KIND_COMMIT, "the last record");
    std::fs::OpenOptions::new().write(true).open(&segment).unwrap().set_len(last as u64).unwrap();
    let server_0 = ServerProcess::start(dir.path(), 0, &addresses[0], GC_GRACE_MS);
    let recovered = server_0.lines.iter().find(|line| line.contains(" recovered ")).expect("a recovery line");
    assert!(recovered.contains(" 1 transactions in doubt"), "{}", server_0.lines.join("\n"));
    // Cooperative termination asks server 1, which no longer knows the transaction: aborted.
    let mut transport = TcpClientTransport::connect(cluster.servers()).unwrap();
    let status = Request::Status { ts: committed, keys: vec![k0.clone()] };
    let aborted = Response::Status { state: rampkv::wire::TxnState::Aborted };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut id = 1_000;
    loop {
        id += 1;
        let state = ask(&mut transport, 0, id, &status);
        if state == aborted || Instant::now() > deadline {
            assert_eq!(state, aborted, "server 0's verdict on the transaction");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(read_until(&cluster, &k0, None), None, "its write on server 0 is gone");
}
