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

#[allow(dead_code)] // this binary uses only the request-by-request helper
mod common;

use common::ask;
use rampkv::client::Client;
use rampkv::cluster::Cluster;
use rampkv::durable::record::check_frame;
use rampkv::transport::TcpClientTransport;
use rampkv::types::{wall_clock_us, TimestampClock};
use rampkv::wire::{Metadata, Request, Response, Write, WriteSet};
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

/// The newest log segment of server `index` and the offsets where its records start.
fn newest_segment(dir: &Path, index: usize) -> (PathBuf, Vec<usize>) {
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
    assert_eq!(offset, bytes.len(), "a cleanly written segment is whole records");
    (segment, offsets)
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
    let (segment, records) = newest_segment(dir.path(), 0);
    let length = std::fs::metadata(&segment).unwrap().len() as usize;
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
    let (segment, records) = newest_segment(dir.path(), 0);
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

fn prepare(ts: u64, write_set: &[Vec<u8>], key: &[u8]) -> Request {
    Request::Prepare {
        ts,
        metadata: Metadata::WriteSet(WriteSet::from_keys(write_set).unwrap()),
        write_set: Vec::new(),
        writes: vec![Write { key: key.to_vec(), value: format!("in-doubt {ts}").into_bytes() }],
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
